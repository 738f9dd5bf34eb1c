"""What made a number: git commit, host, GPU, driver, clocks, torch and Triton versions, time.

Every result row and every MLflow run carries these (STYLE.md: record what made a number).
Clocks are read, never set.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import platform
import socket
import subprocess
import threading
from pathlib import Path
from typing import Any


def sha256_file(path: str | os.PathLike) -> str:
    """Hex sha256 of a file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


#: Files of a run that differ from the commit without the run's source differing: the lock file DVC
#: writes, and params.yaml (composed by ``dvc exp run -S``; every param is recorded in full).
RUN_FILES = ("dvc.lock", "params.yaml")


def _stage_entries(root: str | os.PathLike, kinds: tuple[str, ...]) -> set[str]:
    """Paths (relative to ``root``) of every entry of ``kinds`` (``outs``, ``deps``, ...) of ``root/dvc.yaml``'s
    stages. Empty when there is no readable dvc.yaml."""
    import yaml

    try:
        doc = yaml.safe_load((Path(root) / "dvc.yaml").read_text()) or {}
    except (OSError, yaml.YAMLError):
        return set()
    out: set[str] = set()
    for stage in (doc.get("stages") or {}).values():
        for kind in kinds:
            for entry in (stage or {}).get(kind) or []:
                out.update([entry] if isinstance(entry, str) else list(entry) if isinstance(entry, dict) else [])
    return out


def pipeline_outputs(root: str | os.PathLike = ".") -> set[str]:
    """Paths (relative to ``root``) of every ``outs``, ``metrics`` and ``plots`` entry of ``root/dvc.yaml``'s
    stages: what a run writes. Empty when there is no readable dvc.yaml."""
    return _stage_entries(root, ("outs", "metrics", "plots"))


def pipeline_deps(root: str | os.PathLike = ".") -> set[str]:
    """Paths (relative to ``root``) of every ``deps`` entry of ``root/dvc.yaml``'s stages: the code and data a run
    reads. Empty when there is no readable dvc.yaml."""
    return _stage_entries(root, ("deps",))


def git_info(root: str | os.PathLike = ".") -> dict[str, Any]:
    """``{"git_commit": sha or None, "git_dirty": bool or None}`` for the DVC project at ``root`` (its dvc.yaml
    there; the git repo may be ``root`` or a folder above it).

    Dirty: a file git tracks (at HEAD or in the index) differs from HEAD, in the index or the working
    tree, other than the run's own files (:data:`RUN_FILES`) and the pipeline's outputs
    (:func:`pipeline_outputs`). ``dvc exp run`` stages the outputs it writes (``git add``) while the
    pipeline runs, so counting them made every run in a clean checkout read dirty. An untracked file counts
    only under a stage's ``deps`` (:func:`pipeline_deps`: a new kernel file in kernels/ ran, and is in no
    commit), not elsewhere. None for both when git cannot answer (no repo, no git)."""
    try:
        r = subprocess.run(
            ["git", "rev-parse", "--verify", "-q", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10
        )
        sha = r.stdout.strip() if r.returncode == 0 else None
        st = subprocess.run(
            ["git", "status", "--porcelain=v1", "-z", "--untracked-files=no", "--no-renames"],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=10,
        )
        top = subprocess.run(
            ["git", "rev-parse", "--show-prefix"], cwd=root, capture_output=True, text=True, timeout=10
        ).stdout.strip()
        deps = sorted(pipeline_deps(root))
        untracked = (
            subprocess.run(
                ["git", "ls-files", "--others", "--exclude-standard", "-z", "--", *deps],
                cwd=root,
                capture_output=True,
                text=True,
                timeout=10,
            ).stdout
            if deps
            else ""
        )
    except (OSError, subprocess.SubprocessError):
        return {"git_commit": None, "git_dirty": None}
    ignore = {top + p for p in (*RUN_FILES, *pipeline_outputs(root))}

    def counts(p: str) -> bool:
        return p not in ignore and not any(p.startswith(i.rstrip("/") + "/") for i in ignore)

    changed = [e[3:] for e in st.stdout.split("\0") if len(e) > 3]
    # ls-files names paths relative to root; the status, relative to the repo's top
    new = [top + p for p in untracked.split("\0") if p]
    dirty = any(counts(p) for p in changed) or any(counts(p) for p in new)
    return {"git_commit": sha, "git_dirty": dirty if sha else None}


def _nvidia_smi(query: str, index: int) -> str | None:
    try:
        out = subprocess.run(
            ["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader,nounits", "-i", str(index)],
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def smi_index(device_index: int) -> int:
    """nvidia-smi's index of torch's CUDA device ``device_index`` (CUDA_VISIBLE_DEVICES maps them)."""
    vis = os.environ.get("CUDA_VISIBLE_DEVICES")
    if vis:
        ids = [v.strip() for v in vis.split(",") if v.strip()]
        if device_index < len(ids) and ids[device_index].isdigit():
            return int(ids[device_index])
    return device_index


class ClockSampler:
    """The SM clock (nvidia-smi ``clocks.sm``, MHz) sampled every ``interval_s`` in a thread while
    the ``with`` block runs: the clock the GPU held during a measurement, which a single reading
    before or after it (an idle GPU drops to a few hundred MHz at once) does not show.

    ``summary()`` -> ``{"sm_clock_mhz_min", "sm_clock_mhz_p50", "sm_clock_mhz_max", "samples"}``,
    or ``{}`` when nvidia-smi gave no reading (no GPU, no nvidia-smi). Never raises for a failed read.
    """

    def __init__(self, index: int, interval_s: float = 0.5):
        self.index, self.interval_s = index, interval_s
        self.samples: list[int] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _read(self) -> None:
        got = _nvidia_smi("clocks.sm", self.index)
        if got and got.strip().isdigit():
            self.samples.append(int(got.strip()))

    def _run(self) -> None:
        while not self._stop.is_set():
            self._read()
            self._stop.wait(self.interval_s)

    def __enter__(self) -> ClockSampler:
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="kernelcamp-clock", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=15)

    def summary(self) -> dict[str, Any]:
        if not self.samples:
            return {}
        xs = sorted(self.samples)
        return {
            "sm_clock_mhz_min": xs[0],
            "sm_clock_mhz_p50": xs[len(xs) // 2],
            "sm_clock_mhz_max": xs[-1],
            "samples": len(xs),
        }


def device_info(device_index: int | None = None) -> dict[str, Any]:
    """The GPU this process uses, or ``{"device": "cpu", ...}`` when there is none.

    Keys: device ("cuda"/"cpu"), gpu_name, gpu_arch (e.g. 90), num_sms, driver, sm_clock_mhz (one
    reading now: an idle GPU reads low; :class:`ClockSampler` gives the clock during a measurement),
    max_sm_clock_mhz, mem_clock_mhz (nvidia-smi; None where it cannot be read), torch, triton,
    cuda (torch's CUDA version), cuda_visible_devices.
    """
    import torch
    import triton

    info: dict[str, Any] = {
        "torch": torch.__version__,
        "triton": triton.__version__,
        "python": platform.python_version(),
        "host": socket.gethostname(),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
    }
    if not torch.cuda.is_available():
        info.update(
            device="cpu",
            gpu_name=None,
            gpu_arch=None,
            num_sms=None,
            driver=None,
            cpu=platform.processor() or platform.machine(),
            cpu_count=os.cpu_count(),
        )
        return info
    idx = torch.cuda.current_device() if device_index is None else device_index
    p = torch.cuda.get_device_properties(idx)
    clocks = _nvidia_smi("driver_version,clocks.sm,clocks.max.sm,clocks.mem", smi_index(idx))
    driver = sm = sm_max = mem = None
    if clocks:
        parts = [c.strip() for c in clocks.split(",")]
        if len(parts) == 4:
            driver = parts[0]
            sm, sm_max, mem = (int(x) if x.isdigit() else None for x in parts[1:])
    info.update(
        device="cuda",
        gpu_name=p.name,
        gpu_arch=p.major * 10 + p.minor,
        num_sms=p.multi_processor_count,
        driver=driver,
        sm_clock_mhz=sm,
        max_sm_clock_mhz=sm_max,
        mem_clock_mhz=mem,
        cuda=torch.version.cuda,
        gpu_index=idx,
    )
    return info


def now_utc() -> str:
    """ISO-8601 UTC timestamp with seconds, e.g. ``2026-11-29T17:40:03Z``."""
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def dvc_root() -> Path:
    """The real workspace: ``$DVC_ROOT`` when DVC runs the stage (also for queued experiments,
    which run in a temporary copy), else the current directory."""
    return Path(os.environ.get("DVC_ROOT") or os.getcwd()).resolve()


def deploy_id(deploy: dict) -> str:
    """The deploy record's own id, else a hash of the record (names exactly what was measured)."""
    return str(deploy.get("deploy_id") or hashlib.sha256(json.dumps(deploy, sort_keys=True).encode()).hexdigest()[:16])
