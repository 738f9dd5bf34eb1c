"""Deploy kind ``embedded``: kernelcamp's own server on this machine (see :mod:`kernelcamp.deploy`)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from kernelcamp.deploy.common import (
    REPO_ROOT,
    _alive,
    _read_state,
    _record,
    _variant_facts,
    _wait_port_free,
    kernel_file,
    kill_group,
    port_is_free,
    probe_ready,
    state_dir,
    stop_state,
    wait_ready,
    workspace,
)
from kernelcamp.errors import KernelcampError
from kernelcamp.hashes import dvc_stage, server_flags
from kernelcamp.io import pid_start_time, repo_relative, write_json_atomic, write_text_atomic
from kernelcamp.ports import PORT_STRIDE, baseline_port, worker_port
from kernelcamp.provenance import now_utc, sha256_file
from kernelcamp.serve.client import API_KEY_ENV, CUDA_PROFILED_WHY, client_url, exposure_warning
from kernelcamp.serve.options import check_api_key, check_device, check_serve_settings
from kernelcamp.signals import pdeathsig_preexec


def stop_embedded(root: str | Path | None = None, grace_s: float = 15.0, slot: int | None = None) -> bool:
    """Stop the embedded server recorded in the state file (if it is still ours); True if one was stopped.
    The state file is removed either way. ``slot``: that sweep worker's server (see :func:`state_dir`)."""
    return stop_state(state_dir(root, slot) / "server.json", grace_s, wait_port=False)


#: State-file stem of the serving benchmark's temporary baseline server (beside the deployed ``server``).
BASELINE_STEM = "baseline-server"


def stop_servers(root: str | Path | None = None, slot: int | None = None) -> bool:
    """Stop the embedded servers a workspace (or sweep slot ``slot`` of it) left running: the deployed one
    and a serving benchmark's temporary baseline, each only if still ours (:func:`stop_embedded`,
    :func:`kernelcamp.deploy.common.stop_state`). True if one was running. Used by ``kernelcamp sweep``
    after its workers and by the submitit launcher's job before it removes an experiment's clone (the
    state files go with the clone, and nothing could find the servers again)."""
    was = stop_embedded(root, slot=slot)
    return bool(stop_state(state_dir(root, slot) / f"{BASELINE_STEM}.json")) or was


#: At most this many ports above the configured one are tried when a foreign process holds it.
PORT_TRIES = 9


def _baseline_offset(params: dict[str, Any]) -> int | None:
    """The serving benchmark's baseline server port offset when it will start one beside this deploy
    (serving enabled, ``measure_baseline``, a baseline given), else None. Raises ``KernelcampError``
    for an offset out of range (:func:`kernelcamp.bench.serving.baseline_port`)."""
    sv = (params.get("benchmark") or {}).get("serving") or {}
    if not sv.get("enabled") or not sv.get("measure_baseline", True) or not params.get("baseline"):
        return None
    return baseline_port(0, params)


def fallback_ports(port: int, params: dict[str, Any]) -> list[int]:
    """The ports the embedded deploy tries, in order, when a foreign process holds ``port`` (the
    configured ``server.port``, or a sweep worker's :func:`~kernelcamp.ports.worker_port`).

    Upward from ``port + 1``, at most :data:`PORT_TRIES`, all inside the ``PORT_STRIDE`` (10) ports
    this workspace or sweep worker owns, so a fallback never lands on a sweep worker's range. When the
    serving benchmark will start a baseline server (:func:`_baseline_offset` = k), ``port + k`` is
    skipped and a fallback ``p`` is kept only with ``p + k`` inside the range too (the baseline server
    goes to the port actually used + k; the caller also checks that one is free). Ports beyond 65535
    are dropped. Raises ``KernelcampError`` for a baseline port offset out of range."""
    off = _baseline_offset(params)
    last = port + PORT_STRIDE - 1 - (off or 0)
    out = [p for p in range(port + 1, last + 1) if p != port + (off or 0) and p <= 65535]
    return out[:PORT_TRIES]


#: The params sections an embedded server reads besides ``variant`` (kernelcamp.serve.server.build_state):
#: the kernel (module and ``dot_dtype``), the server and the workload. ``setup_digest`` covers them all.
SERVER_SECTIONS = ("kernel", "server", "workload")


def server_code_hash(root: Path = REPO_ROOT) -> str:
    """sha256 (16 hex) of the kernelcamp code a deploy runs: every ``*.py`` of the ``kernelcamp/`` paths
    that dvc.yaml's deploy stage depends on (the server, the deploy, their helpers), relative path and
    bytes, in ``root`` (the tree whose code a new server would run). A server started by other code
    (the serve code edited, or a queued experiment of another commit) is not reused: it answered with
    the old code while the benchmark's baseline server ran the new. Without a dvc.yaml beside the code,
    every ``kernelcamp/**/*.py``."""
    try:
        deps = dvc_stage("deploy", root)["deps"]
        paths = [root / d for d in deps if isinstance(d, str) and d.startswith("kernelcamp/")]
    except (KernelcampError, KeyError, TypeError):
        paths = [root / "kernelcamp"]
    files = sorted({f for p in paths for f in ([p] if p.is_file() else p.rglob("*.py"))})
    h = hashlib.sha256()
    for f in files:
        h.update(f.relative_to(root).as_posix().encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def setup_digest(params: dict[str, Any]) -> str:
    """sha256 (16 hex) of everything that shapes what an embedded server computes besides the variant
    hash: every section of :data:`SERVER_SECTIONS` (the kernel section's ``dot_dtype``, the workload's
    attention shape, cache layout and stand-in model, the server section but its port: a server found on
    a fallback port is the same setup; its host is not, a server on 0.0.0.0 is reachable from other
    machines). A live server is reused only when this matches too: the variant hash leaves out e.g.
    ``-S workload=deepseek_v32``, ``server.max_context_tokens``, ``kernel.dot_dtype`` or
    ``server.host``, and a reused server would have been measured (and recorded) as the new setup. The
    code the server runs (:func:`server_code_hash`) is part of it too."""
    server = {k: v for k, v in (params.get("server") or {}).items() if k != "port"}
    sections = {name: params.get(name) for name in SERVER_SECTIONS} | {"server": server}
    payload = json.dumps(sections | {"server_code": server_code_hash()}, sort_keys=True, default=str)
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def deploy_embedded(params: dict[str, Any], root: str | Path | None = None) -> dict[str, Any]:
    """Start (or reuse) kernelcamp's server for the variant; see the module docstring.

    Port: ``server.port`` (a sweep worker's own port in a sweep). When a process this deploy did not
    start still holds it (after our previous server was stopped and ``deploy.port_free_timeout_s``
    waited for it), the server starts on the first port of :func:`fallback_ports` that is free (with
    its baseline port, when a baseline server is planned), and one ``deploy: ...`` line on stderr says
    which port it took and why. A live server of ours with the same variant hash and flags, on the
    configured port or on one of its fallbacks, is reused, unless its info says ``cuda_profiled`` (an
    earlier benchmark's profile left CUPTI attached and its steps slower,
    :data:`kernelcamp.serve.client.CUDA_PROFILED_WHY`): that one is restarted, with one ``deploy:`` line.

    Raises ``KernelcampError`` before any side effect, a running server left alone, for what ``kernelcamp
    serve`` would refuse at its start: a ``server.host`` this machine cannot listen on, a ``server.device`` it
    does not take or a GPU this machine lacks, ``server.args`` it does not take
    (:func:`kernelcamp.serve.options.check_serve_settings`, :func:`~kernelcamp.serve.options.check_device`),
    an empty ``$KERNELCAMP_API_KEY``; after stopping ours, when the configured port and every fallback are
    held by other processes. ``server.overlap_scheduling: true`` turns on the embedded server's
    hand-off overlap (kernelcamp.serve.server, "Scheduling").
    """
    cfg = params.get("deploy") or {}
    server = params.get("server") or {}
    variant, khash, flags, vhash, kpath = _variant_facts(params)
    host = str(server.get("host") or "127.0.0.1")
    # what `kernelcamp serve` would refuse, before anything is stopped (the spec stage checks the same)
    check_serve_settings(host, server.get("device"), server.get("args") or [])
    port = worker_port(int(server.get("port", 8765)))
    warn = exposure_warning(host, port)
    if warn:
        print(f"deploy: {warn}", file=sys.stderr, flush=True)
    sdir = state_dir(root)
    sdir.mkdir(parents=True, exist_ok=True)
    spath, log = sdir / "server.json", sdir / "server.log"
    local = sha256_file(kpath) if kpath.exists() else None
    st = _read_state(spath)
    fallbacks = fallback_ports(port, params)
    if (
        st
        and st.get("variant_hash") == vhash
        and st.get("port") in [port, *fallbacks]
        # started for this server.port: a server on 8765 is in 8760's fallback range, and was reused for
        # `-S server.port=8760` with a note that 8760 had been held when it started
        and st.get("configured_port") == port
        and st.get("flags") == flags
        and st.get("setup_digest") == setup_digest(params)
        and _alive(st.get("pid"))
    ):
        used = int(st["port"])
        ok, _, facts = probe_ready(client_url(host, used), vhash, st["pid"])
        if ok and (facts.get("info") or {}).get("cuda_profiled"):
            ok = False
            print(
                f"deploy: not reusing the server (pid {st['pid']}): {CUDA_PROFILED_WHY}; restarting it", file=sys.stderr
            )
        if ok:
            files = [kernel_file(kpath, local, (facts.get("info") or {}).get("kernel_source_hash"))]
            note = (
                None
                if used == port
                else f"reused this workspace's server on port {used} (port {port} was held by another process "
                "when it started)"
            )
            return _record(
                "embedded",
                client_url(host, used),
                variant,
                vhash,
                khash,
                flags,
                files,
                0.0,
                st["pid"],
                True,
                facts,
                log=repo_relative(log, workspace(root)),
                port=used,
                configured_port=port,
                port_note=note,
            )
    # what else the new server would refuse at its start, checked while the running one still serves
    check_api_key(os.environ.get(API_KEY_ENV))
    if server.get("device"):
        check_device(str(server["device"]), "server.device")  # a GPU this machine lacks (imports torch)
    stopped_port = (st or {}).get("port") if stop_embedded(root) else None
    wait_s = float(cfg.get("port_free_timeout_s", 10.0)) if stopped_port == port else 0.0
    used, note = port, None
    if not _wait_port_free(port, host, wait_s):
        used, note = _pick_fallback(params, host, port, fallbacks, stopped_port, cfg)
        print(f"deploy: {note}", file=sys.stderr, flush=True)
    url = client_url(host, used)  # what a client uses: never http://0.0.0.0:port
    proc, seconds, facts = start_embedded(params, host, used, vhash, sdir, "server", cfg)
    files = [kernel_file(kpath, local, (facts.get("info") or {}).get("kernel_source_hash"))]
    return _record(
        "embedded",
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
        port=used,
        configured_port=port,
        port_note=note,
    )


def _pick_fallback(
    params: dict[str, Any], host: str, port: int, fallbacks: list[int], stopped_port: Any, cfg: dict[str, Any]
) -> tuple[int, str]:
    """The first free port of ``fallbacks`` (with its baseline port free too, when a baseline server is
    planned) and the line that says why it was taken; ``KernelcampError`` when there is none."""
    off = _baseline_offset(params)
    for p in fallbacks:
        # the port our stopped server held may need a moment to be released
        wait_s = float(cfg.get("port_free_timeout_s", 10.0)) if p == stopped_port else 0.0
        if _wait_port_free(p, host, wait_s) and (off is None or port_is_free(p + off, host)):
            base = f", its baseline server on {p + off}" if off is not None else ""
            return p, (
                f"port {port} on {host} (server.port) is held by a process this deploy did not start: "
                f"serving on port {p} instead{base} (set server.port, e.g. in conf/local/default.yaml, to choose)"
            )
    tried = f"{fallbacks[0]}..{fallbacks[-1]}" if fallbacks else "none"
    raise KernelcampError(
        f"port {port} on {host} is held by a process this deploy did not start, and no fallback port is free "
        f"(tried {tried}{', each with its baseline port' if off is not None else ''}): stop it or "
        f"set server.port (e.g. -S server.port={port + 100})"
    )


def start_embedded(
    params: dict[str, Any],
    host: str,
    port: int,
    vhash: str,
    sdir: Path,
    stem: str,
    cfg: dict[str, Any] | None = None,
    die_with_caller: bool = False,
) -> tuple[subprocess.Popen, float, dict[str, Any]]:
    """Start ``kernelcamp serve`` detached (own session) with ``params`` on host:port and wait until it
    is ready for ``vhash`` (:func:`wait_ready`, pid checked). State ``sdir/<stem>.json``, params
    ``sdir/<stem>-params.yaml``, log ``sdir/<stem>.log``. The port must already be free. On any
    failure or interrupt the process group is killed, the state file removed and the port waited
    free before the error propagates. Returns (process, seconds to ready, ready facts).

    Used by :func:`deploy_embedded` (stem ``server``, which outlives the stage on purpose) and by the
    serving benchmark for its temporary baseline server (stem ``baseline-server``; stopped with
    :func:`stop_state`). ``die_with_caller``: Linux sends the server SIGTERM when the calling process
    dies, also by SIGKILL, which no ``finally`` block sees (``prctl(PR_SET_PDEATHSIG)``)."""
    cfg = cfg or {}
    server = params.get("server") or {}
    flags = server_flags(server)
    spath, log = sdir / f"{stem}.json", sdir / f"{stem}.log"
    url = client_url(host, port)
    params_file = sdir / f"{stem}-params.yaml"
    write_text_atomic(params_file, yaml.safe_dump(params, sort_keys=False))
    cmd = [
        sys.executable,
        "-m",
        "kernelcamp.cli",
        "serve",
        "--params",
        str(params_file),
        "--host",
        host,
        "--port",
        str(port),
    ]
    if server.get("device"):
        cmd += ["--device", str(server["device"])]
    cmd += flags["args"]
    env = {
        **os.environ,
        **flags["env"],
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])),
    }
    with open(log, "ab") as lf:
        log_offset = lf.tell()  # this start's lines begin here: the error line quotes them, not an earlier start's
        proc = subprocess.Popen(
            cmd,
            cwd=str(REPO_ROOT),
            env=env,
            stdout=lf,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=pdeathsig_preexec() if die_with_caller else None,
        )
    try:
        write_json_atomic(
            spath,
            {
                "pid": proc.pid,
                "pgid": proc.pid,
                "start_time": pid_start_time(proc.pid),
                "host": host,
                "port": port,
                "configured_port": worker_port(int(server.get("port", 8765))),  # server.port it was started for
                "url": url,
                "variant_hash": vhash,
                "flags": flags,
                "setup_digest": setup_digest(params),
                "log": str(log),
                "started_at": now_utc(),
                "cmd": cmd,
            },
        )
        seconds, facts = wait_ready(
            url,
            vhash,
            float(cfg.get("health_timeout_s", 600)),
            float(cfg.get("poll_interval_s", 0.5)),
            proc,
            proc.pid,
            log,
            log_offset,
        )
    except BaseException:
        kill_group(proc.pid, proc.pid, grace_s=5.0)
        proc.wait(timeout=10) if proc.poll() is None else None
        spath.unlink(missing_ok=True)
        _wait_port_free(port, host, 10.0)
        raise
    return proc, seconds, facts


#: The :class:`~kernelcamp.deploy.DeployKind` functions of this kind.
deploy = deploy_embedded
stop = stop_embedded
