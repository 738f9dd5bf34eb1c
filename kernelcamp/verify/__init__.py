"""Verify: the kernel against the fp32 torch reference (:mod:`kernelcamp.verify.kernel`), CUDA-graph
capture safety (:mod:`kernelcamp.verify.capture`), and serving outputs at concurrency 1 vs N
(:mod:`kernelcamp.verify.serving`); ``stages/verify.py`` runs all three."""
