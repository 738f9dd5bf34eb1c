"""Deploy kind ``command``: your own server, launched by your command line (see :mod:`kernelcamp.deploy`)."""

from __future__ import annotations

import os
import subprocess
import sys
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
from kernelcamp.io import pid_start_time, repo_relative, same_process, write_json_atomic, write_text_atomic
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
        _stop_recorded(st, grace_s=15.0)
    with open(log, "ab") as lf:
        log_offset = lf.tell()  # this launch's lines begin here
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
            "start_time": pid_start_time(proc.pid),
            "url": url,
            "variant_hash": vhash,
            "flags": flags,
            "log": str(log),
            "started_at": now_utc(),
        },
    )
    try:
        seconds, facts = wait_ready(
            url,
            vhash,
            float(cfg.get("health_timeout_s", 900)),
            float(cfg.get("poll_interval_s", 2.0)),
            proc,
            None,
            log,
            log_offset,
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
    """Stop the process group the command target launched (state ``.kernelcamp/command.json``), if it is
    still that one (:func:`_stop_recorded`); True if its leader was running and was stopped."""
    path = state_dir(root) / "command.json"
    st = _read_state(path)
    stopped = bool(st) and _stop_recorded(st, grace_s=10.0)
    path.unlink(missing_ok=True)
    return stopped


def _stop_recorded(st: dict[str, Any], grace_s: float) -> bool:
    """Stop the process group a command.json state names, unless its pid now belongs to another process.

    - The leader still the recorded process (:func:`kernelcamp.io.same_process`, by its start time):
      the group is stopped (True).
    - The leader gone: what is left of its group (the state's pgid is the leader's pid) is sent SIGTERM;
      no process has that pid, and a pid stays out of reuse while it is some group's id, so the group is
      still ours (False).
    - The pid alive with another start time: the server died and the pid went to an unrelated process:
      nothing is signalled, a line on stderr says so (False)."""
    pid, pgid = st.get("pid"), st.get("pgid")
    if same_process(pid, st.get("start_time")):
        kill_group(pid, pgid, grace_s=grace_s)
        return True
    if _alive(pid):
        print(
            f"deploy: not stopping pid {pid}: it is not the process this deploy launched (its start time "
            "differs: that server exited and the pid was reused)",
            file=sys.stderr,
            flush=True,
        )
        return False
    if pgid and pgid == pid:  # no process has that pid: a group of that id can only be what is left of ours
        kill_group(pgid, pgid, grace_s=grace_s)
    return False


#: The :class:`~kernelcamp.deploy.DeployKind` functions of this kind.
deploy = deploy_command
stop = stop_command
