"""Deploy kind ``command``: your own server, launched by your command line (see :mod:`kernelcamp.deploy`)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

from kernelcamp.deploy.common import (
    _alive,
    _read_state,
    _record,
    _variant_facts,
    flag_env,
    kernel_file,
    kill_group,
    probe_ready,
    state_dir,
    wait_ready,
    workspace,
)
from kernelcamp.errors import KernelcampError
from kernelcamp.io import repo_relative, write_json_atomic, write_text_atomic
from kernelcamp.provenance import dvc_root, now_utc, sha256_file


def deploy_command(params: dict[str, Any], root: str | Path | None = None) -> dict[str, Any]:
    """Copy the kernel file to ``kernel_dest``, (re)launch the user's command with the flag env, poll."""
    cfg = params.get("deploy") or {}
    for key in ("url", "kernel_dest", "launch"):
        if not cfg.get(key) or cfg.get(key) == "???":
            raise KernelcampError(f"deploy.{key} is not set: conf/deploy/command.yaml needs url, kernel_dest, launch")
    variant, khash, flags, vhash, kpath = _variant_facts(params)
    url = cfg["url"].rstrip("/")
    sdir = state_dir(root)
    sdir.mkdir(parents=True, exist_ok=True)
    spath, log = sdir / "command.json", sdir / "command.log"
    dest = Path(cfg["kernel_dest"])
    local = sha256_file(kpath)
    st = _read_state(spath)
    if (
        st
        and st.get("variant_hash") == vhash
        and st.get("flags") == flags
        and dest.exists()
        and sha256_file(dest) == local
    ):
        ok, _, facts = probe_ready(url, vhash)
        if ok:
            files = [kernel_file(kpath, local, local, dest=str(dest))]
            return _record("command", url, variant, vhash, khash, flags, files, 0.0, st.get("pid"), True, facts)
    dest.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(dest, kpath.read_text())
    remote = sha256_file(dest)
    if remote != local:
        raise KernelcampError(f"checksum mismatch after copying {kpath} to {dest}: {local} vs {remote}")
    env = {**os.environ, **flag_env(flags, vhash), "KERNELCAMP_KERNEL_PATH": str(dest)}
    if cfg.get("stop"):
        subprocess.run(cfg["stop"], shell=True, env=env, timeout=120, check=False)
    if st:
        kill_group(st.get("pid"), st.get("pgid"), grace_s=15.0)
    with open(log, "ab") as lf:
        proc = subprocess.Popen(
            cfg["launch"],
            shell=True,
            env=env,
            stdout=lf,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            cwd=str(dvc_root()),
        )
    write_json_atomic(
        spath,
        {
            "pid": proc.pid,
            "pgid": proc.pid,
            "url": url,
            "variant_hash": vhash,
            "flags": flags,
            "log": str(log),
            "started_at": now_utc(),
        },
    )
    try:
        seconds, facts = wait_ready(
            url, vhash, float(cfg.get("health_timeout_s", 900)), float(cfg.get("poll_interval_s", 2.0)), proc, None, log
        )
    except BaseException:
        kill_group(proc.pid, proc.pid, grace_s=5.0)
        spath.unlink(missing_ok=True)
        raise
    files = [kernel_file(kpath, local, remote, dest=str(dest))]
    return _record(
        "command",
        url,
        variant,
        vhash,
        khash,
        flags,
        files,
        round(seconds, 3),
        proc.pid,
        False,
        facts,
        log=repo_relative(log, workspace(root)),
    )


def stop_command(root: str | Path | None = None) -> bool:
    """Stop the process group the command target launched (state ``.kernelcamp/command.json``)."""
    path = state_dir(root) / "command.json"
    st = _read_state(path)
    stopped = bool(st and _alive(st.get("pid")))
    if st:
        kill_group(st.get("pid"), st.get("pgid"), grace_s=10.0)
    path.unlink(missing_ok=True)
    return stopped


#: The :class:`~kernelcamp.deploy.DeployKind` functions of this kind.
deploy = deploy_command
stop = stop_command
