"""``python -m kernelcamp``: the ``kernelcamp`` command line (:mod:`kernelcamp.cli`), also for a tree that is not
installed; ``python -m kernelcamp sweep --gpus 0,1`` is ``kernelcamp sweep --gpus 0,1``."""

from kernelcamp.cli import run

if __name__ == "__main__":
    run()
