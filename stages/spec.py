"""DVC stage `spec`: check params.yaml once, claim the run, write the parsed run spec.

    python -m stages.spec --params params.yaml --out reports/spec.json

The first stage, and the only one DVC always runs (``always_changed``): every key of params.yaml
is type- and range-checked (kernelcamp.spec), so a bad value stops the run here with one line
naming the key, before any side effect, even when DVC would skip every other stage (it compares
``4.0 == 4`` as unchanged). It claims the working tree for this ``dvc`` run (kernelcamp.runlock):
a second run in the same workspace is refused, and a later stage that finds params.yaml changed
under it stops. Writes the parsed spec (variant and baseline configs, their hashes, the kernel
module and its source hash) atomically; the file is the same for the same params and kernel, so
no later stage reruns because this one ran.
"""

from __future__ import annotations

import argparse
import sys

from kernelcamp.io import stage_main, write_json_atomic
from kernelcamp.spec import before_outputs, spec_summary, stage_spec
from kernelcamp.tracking import tracked_stage


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--params", default="params.yaml")
    ap.add_argument("--out", default="reports/spec.json")
    args = ap.parse_args()
    spec = stage_spec("spec", args.params)  # the run's claim, with the params a failed later stage records
    summary = spec_summary(spec)
    before_outputs("spec", args.params)
    write_json_atomic(args.out, summary)
    rev = spec.hashes()["baseline_kernel_rev"]
    print(
        f"spec: variant {spec.variant.name} ({spec.variant_hash}) vs baseline "
        f"{spec.baseline.name if spec.baseline else None} ({spec.baseline_hash}"
        f"{f', its kernel at {rev}' if rev else ''}), kernel {spec.kernel.module}",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    stage_main(tracked_stage("spec")(main))
