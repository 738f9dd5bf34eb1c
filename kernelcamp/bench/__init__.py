"""Benchmark: the kernel A/B (:mod:`kernelcamp.bench.kernel`, timed by :mod:`kernelcamp.bench.timing`),
the serving A/B (:mod:`kernelcamp.bench.serving`), profiles (:mod:`kernelcamp.bench.profile`) and the
stage's record (:mod:`kernelcamp.bench.record`); ``stages/benchmark.py`` runs them."""
