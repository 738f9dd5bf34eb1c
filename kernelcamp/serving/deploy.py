"""Deploy targets: make a server run the variant with the server flag set, and prove it.

``deploy(params)`` dispatches on ``deploy.kind``:

- ``embedded``: kernelcamp's own server on this machine. The previous one (state file
  ``$DVC_ROOT/.kernelcamp/server.json``: pid, process group, port, hash) is stopped (SIGTERM to its
  process group, SIGKILL after 15 s), then ``kernelcamp serve`` starts detached (new session, log
  ``.kernelcamp/server.log``) with the exact params it was deployed with
  (``.kernelcamp/server-params.yaml``) on ``server.port``, or, when a process this deploy did not
  start holds that port, on the next free port of :func:`fallback_ports` (one line on stderr says
  which and why; the record's ``url`` and ``port`` carry it, ``configured_port`` and ``port_note``
  say why). Everything after the deploy reads the port from the record's ``url``, never from params.
- ``command``: your own server. The variant's kernel file is copied to ``kernel_dest``, ``stop``
  (if given) runs, then ``launch`` runs detached through the shell with the flag set as
  environment (:func:`flag_env`).
- ``ssh``: the kernel file and ``variant.json`` are copied to ``host:remote_dir`` (scp), sha256 is
  compared on both sides (remote: ``sha256sum``), ``restart`` runs there (``cd remote_dir``, the
  flag set exported), then ``url`` is polled.

Ready (DESIGN.md, reliability contract) means: ``/health`` 200 AND one real completion succeeds AND
the variant hash on ``/v1/kernelcamp/info`` matches (and, for the embedded server, the pid it
reports is the process we started, so a stale process still answering on the port never passes).
A server without the info endpoint (command/ssh targets running a foreign server) is recorded with
``hash_verified: false``. A server that is not ready within ``health_timeout_s`` is killed (its
process group), its port freed, and a one-line ``KernelcampError`` raised.

A deploy whose state file shows the same variant hash and flags, against a live server that passes
the ready check, is a no-op (``reused: true``).

``server.host``: the embedded server binds exactly that address; the recorded ``url`` is one a client
on this machine can use (a wildcard such as ``0.0.0.0`` is recorded as ``http://127.0.0.1:port``), and
a host that is not loopback gets a warning on stderr. API key: with ``KERNELCAMP_API_KEY`` set, the
embedded server inherits it from the environment (never on its command line) and requires it, and
the readiness probe sends it; a command/ssh server must be started with the same key by its own
launch/restart line. ssh: host, user and remote_dir may not start with ``-`` (ssh would take them as
options), and ``--`` ends ssh's and scp's options before the destination.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

from kernelcamp.errors import KernelcampError
from kernelcamp.io import pid_alive, write_json_atomic, write_text_atomic
from kernelcamp.provenance import dvc_root, now_utc, sha256_file
from kernelcamp.serving import INFO_PATH, kernel_module_path, kernel_source_hash, server_flags, variant_hash
from kernelcamp.serving.client import auth_headers, client_url, exposure_warning
from kernelcamp.sweep import in_sweep, worker_port, worker_slot
from kernelcamp.variant import parse_variant

REPO_ROOT = Path(__file__).resolve().parents[2]


# ---- common ------------------------------------------------------------------------------------------
def state_dir(root: str | Path | None = None, slot: int | None = None) -> Path:
    """``$DVC_ROOT/.kernelcamp`` (the real workspace, also for queued experiments); a ``kernelcamp
    sweep`` worker in slot N keeps its own state in ``.kernelcamp/slotN`` so that workers never stop
    each other's servers, nor the workspace's own. ``slot`` names a worker's folder from outside it
    (the sweep, cleaning up after its workers)."""
    d = (Path(root) if root is not None else dvc_root()) / ".kernelcamp"
    if slot is not None:
        return d / f"slot{int(slot)}"
    return d / f"slot{worker_slot()}" if in_sweep() else d


def flag_env(flags: dict[str, Any], vhash: str) -> dict[str, str]:
    """The flag set as environment for a launch/restart command: KERNELCAMP_* plus ``server.env``."""
    env = {
        "KERNELCAMP_VARIANT_HASH": vhash,
        "KERNELCAMP_SERVER_FLAGS": flags["name"],
        "KERNELCAMP_CUDA_GRAPHS": "1" if flags["cuda_graphs"] else "0",
        "KERNELCAMP_GRAPH_BATCH_BUCKETS": ",".join(str(b) for b in flags["graph_batch_buckets"]),
        "KERNELCAMP_MAX_RUNNING_REQUESTS": str(flags["max_running_requests"]),
        "KERNELCAMP_OVERLAP_SCHEDULING": "1" if flags["overlap_scheduling"] else "0",
        "KERNELCAMP_SERVER_ARGS": shlex.join(flags["args"]),
    }
    env.update(flags["env"])
    return env


_alive = pid_alive  # kept for the callers and tests that import it from here


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def kill_group(pid: int | None, pgid: int | None = None, grace_s: float = 15.0) -> None:
    """SIGTERM the process group (or the process), wait up to ``grace_s``, then SIGKILL."""
    if not pid:
        return
    target = pgid or pid

    def send(sig: int) -> None:
        try:
            if pgid:
                os.killpg(target, sig)
            else:
                os.kill(target, sig)
        except (ProcessLookupError, PermissionError):
            pass

    send(signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while _alive(pid) and time.monotonic() < deadline:
        _reap(pid)
        time.sleep(0.05)
    if _alive(pid):
        send(signal.SIGKILL)
        deadline = time.monotonic() + 5
        while _alive(pid) and time.monotonic() < deadline:
            _reap(pid)
            time.sleep(0.05)
    _reap(pid)


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    from kernelcamp.serving.testing import port_is_free as _free

    return _free(port, host)


def _wait_port_free(port: int, host: str, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if port_is_free(port, host):
            return True
        time.sleep(0.1)
    return port_is_free(port, host)


#: Answers to the readiness completion that no amount of waiting changes (a bad request, a missing
#: key, an unknown model): :func:`wait_ready` stops at once instead of polling until its timeout.
REFUSALS = (400, 401, 403, 404, 422)


def probe_ready(
    url: str, expect_hash: str | None, expect_pid: int | None = None, timeout_s: float = 30.0
) -> tuple[bool, str, dict[str, Any]]:
    """One readiness check: health 200, a real completion, the info hash (and pid). Never raises.

    Returns (ready, reason, facts) with facts: health, completion_ok, info (or None), hash_verified.
    """
    facts: dict[str, Any] = {"health": None, "completion_ok": False, "info": None, "hash_verified": None}
    try:
        with httpx.Client(base_url=url, timeout=timeout_s, headers=auth_headers()) as c:
            h = c.get("/health")
            facts["health"] = h.status_code
            if h.status_code != 200:
                return False, f"health {h.status_code}", facts
            model = "default"
            try:
                model = c.get("/v1/models").json()["data"][0]["id"]
            except Exception:  # noqa: BLE001 - a server without /v1/models still gets a completion
                pass
            r = c.post(
                "/v1/completions",
                json={"model": model, "prompt": "kernelcamp readiness check", "max_tokens": 2, "temperature": 0},
            )
            if r.status_code != 200:
                if r.status_code in REFUSALS:  # the server will refuse it every time: no use waiting
                    try:
                        msg = ((r.json().get("error") or {}).get("message")) or r.text
                    except ValueError:
                        msg = r.text
                    facts["refused"] = f"completion {r.status_code}: {' '.join(str(msg).split())[:300]}"
                return False, f"completion {r.status_code}", facts
            body = r.json()
            n = (body.get("usage") or {}).get("completion_tokens")
            text = ((body.get("choices") or [{}])[0]).get("text")
            if not (n or text):
                return False, "completion returned no tokens", facts
            facts["completion_ok"] = True
            i = c.get(INFO_PATH)
            if i.status_code != 200:
                if expect_pid is not None:  # our own server always has the info endpoint
                    return False, f"info {i.status_code}", facts
                facts["hash_verified"] = False
                return True, "ready (server does not report a variant hash)", facts
            info = i.json()
            facts["info"] = {
                k: info.get(k)
                for k in (
                    "variant_hash",
                    "variant_name",
                    "pid",
                    "kernel_source_hash",
                    "attention_impl",
                    "device",
                    "config_running",
                    "server_flags",
                    "started_at",
                )
            }
            if expect_hash is not None and info.get("variant_hash") != expect_hash:
                facts["hash_verified"] = False
                return False, f"server runs variant hash {info.get('variant_hash')}, expected {expect_hash}", facts
            if expect_pid is not None and info.get("pid") != expect_pid:
                return False, f"answering process is pid {info.get('pid')}, not the started pid {expect_pid}", facts
            facts["hash_verified"] = expect_hash is not None
            return True, "ready", facts
    except (httpx.HTTPError, ValueError, KeyError) as e:
        return False, f"{type(e).__name__}: {e}".splitlines()[0][:200], facts


def wait_ready(
    url: str,
    expect_hash: str | None,
    timeout_s: float,
    poll_s: float,
    proc: subprocess.Popen | None = None,
    expect_pid: int | None = None,
    log: Path | None = None,
) -> tuple[float, dict[str, Any]]:
    """Poll :func:`probe_ready` until ready; returns (seconds to ready, facts). Raises ``KernelcampError``
    when ``proc`` exits first, when the server refuses the readiness completion outright
    (:data:`REFUSALS`, e.g. a context too small for it), or when ``timeout_s`` passes (the caller
    cleans up)."""
    t0 = time.monotonic()
    reason = "not polled"
    while True:
        if proc is not None and proc.poll() is not None:
            raise KernelcampError(f"server exited with status {proc.returncode} before it was ready{_log_tail(log)}")
        ok, reason, facts = probe_ready(url, expect_hash, expect_pid, timeout_s=max(5.0, min(60.0, timeout_s)))
        if ok:
            return time.monotonic() - t0, facts
        if facts.get("refused"):
            raise KernelcampError(
                f"server at {url} refuses the readiness completion ({facts['refused']}): "
                f"check the server flags (e.g. server.max_context_tokens){_log_tail(log)}"
            )
        if time.monotonic() - t0 > timeout_s:
            raise KernelcampError(
                f"server at {url} not ready after {timeout_s:g} s (last check: {reason}){_log_tail(log)}"
            )
        time.sleep(poll_s)


def _log_tail(log: Path | None) -> str:
    if log is None or not log.exists():
        return ""
    lines = [ln for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    return f"; log {log}: {lines[-1][:200]}" if lines else f"; log {log} is empty"


def _read_state(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def _variant_facts(params: dict[str, Any]) -> tuple[Any, str, dict[str, Any], str, Path]:
    variant = parse_variant(params.get("variant") or {})
    khash = kernel_source_hash(params.get("kernel"))
    flags = server_flags(params.get("server"))
    kpath = kernel_module_path(params.get("kernel"))
    return variant, khash, flags, variant_hash(variant, khash, flags), kpath


def _record(
    kind: str,
    url: str,
    variant: Any,
    vhash: str,
    khash: str,
    flags: dict[str, Any],
    files: list[dict],
    seconds: float | None,
    pid: int | None,
    reused: bool,
    facts: dict[str, Any],
    **extra: Any,
) -> dict[str, Any]:
    """The deploy record. ``deploy_id`` names the server instance (hash, url, pid, its start time), so a
    reused deploy keeps the id of the server it found."""
    info = facts.get("info") or {}
    ident = json.dumps([vhash, url, pid or info.get("pid"), info.get("started_at"), extra.get("host")])
    return {
        "deploy_id": hashlib.sha256(ident.encode()).hexdigest()[:16],
        "kind": kind,
        "url": url,
        "variant_name": variant.name,
        "variant_hash": vhash,
        "kernel_source_hash": khash,
        "files": files,
        "checksums_match": all(f.get("sha256_local") == f.get("sha256_remote") for f in files),
        "flags": flags,
        "seconds_to_healthy": seconds,
        "pid": pid,
        "reused": reused,
        "hash_verified": facts.get("hash_verified"),
        "server_info": facts.get("info"),
        "timestamp": now_utc(),
        "deployed_from": os.uname().nodename,
        **extra,
    }


# ---- embedded ----------------------------------------------------------------------------------------
def stop_embedded(root: str | Path | None = None, grace_s: float = 15.0, slot: int | None = None) -> bool:
    """Stop the embedded server recorded in the state file (if it is still ours); True if one was stopped.
    The state file is removed either way. ``slot``: that sweep worker's server (see :func:`state_dir`)."""
    path = state_dir(root, slot) / "server.json"
    st = _read_state(path)
    stopped = False
    if st and _alive(st.get("pid")) and "kernelcamp" in _cmdline(st["pid"]):
        kill_group(st["pid"], st.get("pgid"), grace_s)
        stopped = True
    if path.exists():
        path.unlink()
    return stopped


#: At most this many ports above the configured one are tried when a foreign process holds it.
PORT_TRIES = 9


def _baseline_offset(params: dict[str, Any]) -> int | None:
    """The serving benchmark's baseline server port offset when it will start one beside this deploy
    (serving enabled, ``measure_baseline``, a baseline given), else None. Raises ``KernelcampError``
    for an offset out of range (:func:`kernelcamp.serving.bench.baseline_port`)."""
    sv = (params.get("benchmark") or {}).get("serving") or {}
    if not sv.get("enabled") or not sv.get("measure_baseline", True) or not params.get("baseline"):
        return None
    from kernelcamp.serving.bench import baseline_port

    return baseline_port(0, params)


def fallback_ports(port: int, params: dict[str, Any]) -> list[int]:
    """The ports the embedded deploy tries, in order, when a foreign process holds ``port`` (the
    configured ``server.port``, or a sweep worker's :func:`~kernelcamp.sweep.worker_port`).

    Upward from ``port + 1``, at most :data:`PORT_TRIES`, all inside the ``PORT_STRIDE`` (10) ports
    this workspace or sweep worker owns, so a fallback never lands on a sweep worker's range. When the
    serving benchmark will start a baseline server (:func:`_baseline_offset` = k), ``port + k`` is
    skipped and a fallback ``p`` is kept only with ``p + k`` inside the range too (the baseline server
    goes to the port actually used + k; the caller also checks that one is free). Ports beyond 65535
    are dropped. Raises ``KernelcampError`` for a baseline port offset out of range."""
    from kernelcamp.sweep import PORT_STRIDE

    off = _baseline_offset(params)
    last = port + PORT_STRIDE - 1 - (off or 0)
    out = [p for p in range(port + 1, last + 1) if p != port + (off or 0) and p <= 65535]
    return out[:PORT_TRIES]


def setup_digest(params: dict[str, Any]) -> str:
    """sha256 (16 hex) of everything that shapes what an embedded server computes besides the variant
    hash: the workload (attention shape, cache layout, stand-in model) and the whole server section
    but where it listens (host, port). A live server is reused only when this matches too: the variant
    hash leaves out e.g. ``-S workload=deepseek_v32`` or ``server.max_context_tokens``, and a reused
    server would have been measured as the new setup."""
    server = {k: v for k, v in (params.get("server") or {}).items() if k not in ("host", "port")}
    payload = json.dumps({"workload": params.get("workload"), "server": server}, sort_keys=True, default=str)
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def deploy_embedded(params: dict[str, Any], root: str | Path | None = None) -> dict[str, Any]:
    """Start (or reuse) kernelcamp's server for the variant; see the module docstring.

    Port: ``server.port`` (a sweep worker's own port in a sweep). When a process this deploy did not
    start still holds it (after our previous server was stopped and ``deploy.port_free_timeout_s``
    waited for it), the server starts on the first port of :func:`fallback_ports` that is free (with
    its baseline port, when a baseline server is planned), and one ``deploy: ...`` line on stderr says
    which port it took and why. A live server of ours with the same variant hash and flags, on the
    configured port or on one of its fallbacks, is reused.

    Raises ``KernelcampError`` (before any side effect) for ``server.overlap_scheduling: true``: the
    embedded server does not implement it, so a run with it set would measure something else; and
    when the configured port and every fallback are held by other processes.
    """
    cfg = params.get("deploy") or {}
    server = params.get("server") or {}
    if server.get("overlap_scheduling"):
        raise KernelcampError(
            "server.overlap_scheduling=true: the embedded server does not implement overlap scheduling "
            "(the flag reaches your own server as KERNELCAMP_OVERLAP_SCHEDULING=1 with deploy=command or ssh); "
            "set server.overlap_scheduling=false for the embedded server"
        )
    variant, khash, flags, vhash, kpath = _variant_facts(params)
    host = str(server.get("host") or "127.0.0.1")
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
        and st.get("flags") == flags
        and st.get("setup_digest") == setup_digest(params)
        and _alive(st.get("pid"))
    ):
        used = int(st["port"])
        ok, _, facts = probe_ready(client_url(host, used), vhash, st["pid"])
        if ok:
            files = [
                {
                    "path": str(kpath),
                    "sha256_local": local,
                    "sha256_remote": (facts.get("info") or {}).get("kernel_source_hash"),
                }
            ]
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
                log=str(log),
                port=used,
                configured_port=port,
                port_note=note,
            )
    stopped_port = (st or {}).get("port") if stop_embedded(root) else None
    wait_s = float(cfg.get("port_free_timeout_s", 10.0)) if stopped_port == port else 0.0
    used, note = port, None
    if not _wait_port_free(port, host, wait_s):
        used, note = _pick_fallback(params, host, port, fallbacks, stopped_port, cfg)
        print(f"deploy: {note}", file=sys.stderr, flush=True)
    url = client_url(host, used)  # what a client uses: never http://0.0.0.0:port
    proc, seconds, facts = start_embedded(params, host, used, vhash, sdir, "server", cfg)
    files = [
        {
            "path": str(kpath),
            "sha256_local": local,
            "sha256_remote": (facts.get("info") or {}).get("kernel_source_hash"),
        }
    ]
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
        log=str(log),
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
                "host": host,
                "port": port,
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
        )
    except BaseException:
        kill_group(proc.pid, proc.pid, grace_s=5.0)
        proc.wait(timeout=10) if proc.poll() is None else None
        spath.unlink(missing_ok=True)
        _wait_port_free(port, host, 10.0)
        raise
    return proc, seconds, facts


def pdeathsig_preexec() -> Any:
    """A ``preexec_fn`` that has Linux send the child SIGTERM when its parent dies, even by SIGKILL
    (``prctl(PR_SET_PDEATHSIG)``; see :func:`kernelcamp.io.die_with_parent`). libc's ``prctl`` is
    resolved here, in the parent: between fork and exec the child only makes the call (no import, no
    dlopen, which are not safe in a forked child of a threaded process). None where there is no prctl."""
    import ctypes
    import signal

    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    sig = int(signal.SIGTERM)
    return lambda: prctl(1, sig)  # 1 = PR_SET_PDEATHSIG


def stop_state(path: Path, grace_s: float = 15.0) -> bool:
    """Stop the kernelcamp server recorded in state file ``path`` (if it is still ours: alive and a
    kernelcamp command line), wait for its port to be free, remove the file; True if one was stopped."""
    st = _read_state(path)
    stopped = False
    if st and _alive(st.get("pid")) and "kernelcamp" in _cmdline(st["pid"]):
        kill_group(st["pid"], st.get("pgid"), grace_s)
        stopped = True
    if st and st.get("port"):
        _wait_port_free(int(st["port"]), st.get("host") or "127.0.0.1", 10.0)
    path.unlink(missing_ok=True)
    return stopped


# ---- command -----------------------------------------------------------------------------------------
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
            files = [{"path": str(kpath), "dest": str(dest), "sha256_local": local, "sha256_remote": local}]
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
    files = [{"path": str(kpath), "dest": str(dest), "sha256_local": local, "sha256_remote": remote}]
    return _record(
        "command", url, variant, vhash, khash, flags, files, round(seconds, 3), proc.pid, False, facts, log=str(log)
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


# ---- ssh ---------------------------------------------------------------------------------------------
class SshRunner:
    """ssh/scp to one host; ``run(cmd)`` and ``put(local, remote_path)``. Tests may substitute another
    object with the same two methods."""

    def __init__(
        self,
        host: str,
        port: int = 22,
        user: str | None = None,
        identity_file: str | None = None,
        options: list[str] | None = None,
        timeout_s: float = 120.0,
    ):
        check_ssh_args(host, user)
        self.target = f"{user}@{host}" if user else host
        self.port, self.timeout_s = int(port), timeout_s
        self.opts = ["-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=accept-new", "-o", "ConnectTimeout=15"]
        if identity_file:
            self.opts += ["-i", str(identity_file)]
        self.opts += list(options or [])

    def run(self, cmd: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            ["ssh", "-p", str(self.port), *self.opts, "--", self.target, cmd],
            capture_output=True,
            text=True,
            timeout=self.timeout_s,
            stdin=subprocess.DEVNULL,
        )

    def put(self, local: str | Path, remote_path: str) -> subprocess.CompletedProcess:
        """scp ``local`` to ``remote_path`` on the host (neither may start with ``-``)."""
        check_ssh_args(remote_path=remote_path)
        return subprocess.run(
            ["scp", "-q", "-P", str(self.port), *self.opts, "--", str(local), f"{self.target}:{remote_path}"],
            capture_output=True,
            text=True,
            timeout=self.timeout_s,
            stdin=subprocess.DEVNULL,
        )


def check_ssh_args(
    host: str | None = None, user: str | None = None, remote_path: str | None = None, prefix: str = ""
) -> None:
    """Refuse a host, user or remote path that ssh/scp would read as an option (``-oProxyCommand=...``
    runs a command on this machine) or that is empty; one ``KernelcampError`` line naming the key
    (``prefix``: e.g. ``"deploy."``)."""
    for key, val in (("host", host), ("user", user), ("remote_dir", remote_path)):
        if val is None:
            continue
        v = str(val)
        if not v.strip() or v.startswith("-") or any(c in v for c in "\n\r\0"):
            raise KernelcampError(
                f"{prefix}{key}={v!r}: must not be empty, start with '-' (ssh would read it as an option) "
                "or hold a newline; put ssh options in deploy.ssh_options"
            )
        if key != "remote_dir" and any(c.isspace() for c in v):
            raise KernelcampError(f"{prefix}{key}={v!r}: must not contain whitespace")


def remote_sha256(runner: Any, remote_dir: str, names: list[str]) -> dict[str, str]:
    """``sha256sum`` of ``names`` in ``remote_dir`` on the remote side -> {name: hex}."""
    r = runner.run(f"cd {shlex.quote(remote_dir)} && sha256sum -- " + " ".join(shlex.quote(n) for n in names))
    if r.returncode != 0:
        raise KernelcampError(f"remote sha256sum failed ({r.returncode}): {(r.stderr or r.stdout).strip()[:200]}")
    out: dict[str, str] = {}
    for line in r.stdout.splitlines():
        parts = line.split(None, 1)
        if len(parts) == 2:
            out[parts[1].lstrip("*").strip()] = parts[0]
    return out


def compare_checksums(local: dict[str, str], remote: dict[str, str]) -> list[dict[str, Any]]:
    """Per-file records; raises ``KernelcampError`` naming the first file whose sums differ or is missing."""
    files = []
    for name, h in local.items():
        rh = remote.get(name)
        files.append({"path": name, "sha256_local": h, "sha256_remote": rh})
        if rh != h:
            raise KernelcampError(
                f"checksum mismatch for {name}: local {h[:16]}..., remote "
                f"{(rh or 'missing')[:16]}...: the copy on the server is not what was shipped"
            )
    return files


def deploy_ssh(params: dict[str, Any], root: str | Path | None = None, runner: Any = None) -> dict[str, Any]:
    """Copy the variant's files to host:remote_dir, compare sha256 both sides, restart, poll ``url``."""
    cfg = params.get("deploy") or {}
    for key in ("host", "remote_dir", "restart", "url"):
        if not cfg.get(key) or cfg.get(key) == "???":
            raise KernelcampError(f"deploy.{key} is not set: conf/deploy/ssh.yaml needs host, remote_dir, restart, url")
    check_ssh_args(str(cfg["host"]), cfg.get("user"), str(cfg["remote_dir"]), prefix="deploy.")
    variant, khash, flags, vhash, kpath = _variant_facts(params)
    runner = runner or SshRunner(
        cfg["host"], cfg.get("port", 22), cfg.get("user"), cfg.get("identity_file"), cfg.get("ssh_options")
    )
    url, rdir = cfg["url"].rstrip("/"), str(cfg["remote_dir"])
    sdir = state_dir(root)
    sdir.mkdir(parents=True, exist_ok=True)
    spath = sdir / "ssh.json"
    vjson = sdir / "variant.json"
    write_json_atomic(
        vjson, {"variant": variant.as_dict(), "variant_hash": vhash, "kernel_source_hash": khash, "flags": flags}
    )
    ship = {kpath.name: kpath, "variant.json": vjson}
    local = {n: sha256_file(p) for n, p in ship.items()}
    st = _read_state(spath)
    if st and st.get("variant_hash") == vhash and st.get("flags") == flags:
        try:
            remote = remote_sha256(runner, rdir, list(ship))
        except KernelcampError:
            remote = {}
        if remote == local:
            ok, _, facts = probe_ready(url, vhash)
            if ok:
                files = [{"path": n, "sha256_local": h, "sha256_remote": remote[n]} for n, h in local.items()]
                return _record(
                    "ssh",
                    url,
                    variant,
                    vhash,
                    khash,
                    flags,
                    files,
                    0.0,
                    None,
                    True,
                    facts,
                    host=cfg["host"],
                    remote_dir=rdir,
                )
    r = runner.run(f"mkdir -p {shlex.quote(rdir)}")
    if r.returncode != 0:
        raise KernelcampError(f"ssh {cfg['host']}: mkdir {rdir} failed: {(r.stderr or r.stdout).strip()[:200]}")
    for name, path in ship.items():
        r = runner.put(path, f"{rdir.rstrip('/')}/{name}")
        if r.returncode != 0:
            raise KernelcampError(f"scp {path} to {cfg['host']}:{rdir} failed: {(r.stderr or r.stdout).strip()[:200]}")
    files = compare_checksums(local, remote_sha256(runner, rdir, list(ship)))
    exports = " ".join(f"export {k}={shlex.quote(v)};" for k, v in flag_env(flags, vhash).items())
    r = runner.run(f"cd {shlex.quote(rdir)} && {exports} {cfg['restart']}")
    if r.returncode != 0:
        raise KernelcampError(
            f"restart on {cfg['host']} failed ({r.returncode}): {(r.stderr or r.stdout).strip()[:200]}"
        )
    seconds, facts = wait_ready(
        url, vhash, float(cfg.get("health_timeout_s", 900)), float(cfg.get("poll_interval_s", 2.0))
    )
    write_json_atomic(
        spath,
        {
            "variant_hash": vhash,
            "flags": flags,
            "url": url,
            "host": cfg["host"],
            "remote_dir": rdir,
            "deployed_at": now_utc(),
        },
    )
    return _record(
        "ssh",
        url,
        variant,
        vhash,
        khash,
        flags,
        files,
        round(seconds, 3),
        None,
        False,
        facts,
        host=cfg["host"],
        remote_dir=rdir,
    )


# ---- dispatch ----------------------------------------------------------------------------------------
TARGETS = {"embedded": deploy_embedded, "command": deploy_command, "ssh": deploy_ssh}


def deploy(params: dict[str, Any], root: str | Path | None = None) -> dict[str, Any]:
    """Deploy per ``params['deploy']['kind']``; returns the record written to reports/deploy.json."""
    kind = (params.get("deploy") or {}).get("kind")
    if kind not in TARGETS:
        raise KernelcampError(f"deploy.kind={kind!r}: choose one of {sorted(TARGETS)} (conf/deploy/)")
    return TARGETS[kind](params, root)
