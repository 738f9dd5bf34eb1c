"""benchmarks/kernel_speed_step.sh collects the experiments that finished even when a timeout ends it mid-sweep.

Step "splitd" (reports/campaigns/kernel_speed/splitd_sweep/README.md) lost a finished experiment: the device
call's outer timeout ended the script after the sweep, before its collection loop. Here dvc, python and git are
stubs on PATH in a copy of the script's tree: the sweep never ends, `campaign collect` writes a report.
"""

from __future__ import annotations

import shutil
import subprocess
import tarfile
from pathlib import Path

from stubbin import stub_env

ROOT = Path(__file__).resolve().parents[1]

STUBS = {
    "dvc": '#!/usr/bin/env bash\necho "dvc $*"\n',
    "git": "#!/usr/bin/env bash\necho 0000000000000000000000000000000000000000\n",
    # `python -m kernelcamp.cli sweep ...` runs until killed; `... campaign collect NAME DEST` writes DEST/report.md
    "python": (
        "#!/usr/bin/env bash\n"
        'if [ "$3" = "sweep" ]; then echo $$ > "$SWEEP_PID_FILE"; echo sweeping; exec sleep "${SWEEP_SLEEP:-60}"; fi\n'
        'if [ "$3" = "campaign" ]; then mkdir -p "$6" && echo "**faster**: stub" > "$6/report.md"; fi\n'
    ),
}


def _tree(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A copy of the script in a tree with two stub experiment configs, and an environment with the stubs first."""
    tree = tmp_path / "tree"
    (tree / "benchmarks").mkdir(parents=True)
    shutil.copy(ROOT / "benchmarks" / "kernel_speed_step.sh", tree / "benchmarks")
    (tree / "benchmarks" / "device_env.sh").write_text(":\n")
    (tree / "conf" / "experiment").mkdir(parents=True)
    for shape in ("a", "b"):
        (tree / "conf" / "experiment" / f"kernel_speed_st_{shape}.yaml").write_text("# stub\n")
    env = stub_env(tmp_path, STUBS, SWEEP_TIMEOUT_S="60", SWEEP_PID_FILE=str(tmp_path / "sweep.pid"))
    return tree, env


def _packed(tmp_path: Path) -> list[str]:
    with tarfile.open(tmp_path / "out" / "st.tgz") as t:
        return t.getnames()


def test_a_timeout_mid_sweep_still_collects_and_packs_the_queued_experiments(tmp_path):
    tree, env = _tree(tmp_path)
    cmd = ["timeout", "3", "bash", str(tree / "benchmarks" / "kernel_speed_step.sh"), str(tmp_path / "out")]
    log = tmp_path / "log.txt"
    pid_file = Path(env["SWEEP_PID_FILE"])
    try:
        with log.open("w") as f:  # a file, not a pipe: a stub sweep that outlived the script would hold a pipe open
            rc = subprocess.run(
                [*cmd, "st", "a", "b"], cwd=tree, env=env, stdout=f, stderr=subprocess.STDOUT, timeout=30
            )
    finally:
        if pid_file.exists():
            subprocess.run(["kill", pid_file.read_text().strip()], capture_output=True)
    text = log.read_text()
    assert rc.returncode == 124, (rc.returncode, text)  # ended by the timeout, mid-sweep
    assert "stopped by a signal; stopping the sweep, collecting what finished" in text, text
    names = _packed(tmp_path)
    for shape in ("a", "b"):
        assert f"reports/campaigns/kernel_speed/st_{shape}/report.md" in names, names
    assert "reports/campaigns/kernel_speed/st_sweep/sweep.log" in names


def test_a_sweep_that_ends_collects_each_experiment_once(tmp_path):
    tree, env = _tree(tmp_path)
    cmd = ["bash", str(tree / "benchmarks" / "kernel_speed_step.sh"), str(tmp_path / "out"), "st", "a"]
    r = subprocess.run(cmd, cwd=tree, env={**env, "SWEEP_SLEEP": "0"}, capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "sweep ended after" in r.stdout and "stopped by a signal" not in r.stderr
    assert r.stdout.count("faster") == 1  # the collected report's decision line, printed once
    assert "reports/campaigns/kernel_speed/st_a/report.md" in _packed(tmp_path)
