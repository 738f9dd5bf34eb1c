"""Compile inspection: what every config of a variant costs on a target GPU, from any machine.

compile   kernelcamp.inspect.compile   cross-compile one kernel for an arch; shared memory,
                                       registers, spills from the compiled kernel and its cubin
fit       kernelcamp.inspect.fit       configs x kernels x targets: fits, occupancy, what would run
cli       kernelcamp.inspect.cli       `kernelcamp inspect`
"""
