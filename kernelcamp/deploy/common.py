"""What the three deploy kinds share: the state folder, process groups, ports, the readiness check
and the deploy record (see :mod:`kernelcamp.deploy`)."""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx

from kernelcamp.errors import KernelcampError
from kernelcamp.hashes import kernel_module_path, kernel_source_hash, project_root, server_flags, variant_hash
from kernelcamp.io import pid_alive, repo_relative, same_process
from kernelcamp.ports import in_sweep, port_is_free, worker_slot
from kernelcamp.provenance import dvc_root, now_utc
from kernelcamp.serve.client import INFO_PATH, auth_headers
from kernelcamp.variant import parse_variant

REPO_ROOT = Path(__file__).resolve().parents[2]


def workspace(root: str | Path | None = None) -> Path:
    """The workspace a stage works in: ``root`` when given, else ``$DVC_ROOT`` (the real workspace, also
    for queued experiments). Its ``.kernelcamp/`` holds the server state (:func:`state_dir`), and the
    records keep paths relative to it (:func:`kernelcamp.io.repo_relative`)."""
    return Path(root) if root is not None else dvc_root()


def state_dir(root: str | Path | None = None, slot: int | None = None) -> Path:
    """``$DVC_ROOT/.kernelcamp`` (the real workspace, also for queued experiments); a ``kernelcamp
    sweep`` worker in slot N keeps its own state in ``.kernelcamp/slotN`` so that workers never stop
    each other's servers, nor the workspace's own. ``slot`` names a worker's folder from outside it
    (the sweep, cleaning up after its workers)."""
    d = workspace(root) / ".kernelcamp"
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
                    "cuda_profiled",
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
    log_offset: int = 0,
) -> tuple[float, dict[str, Any]]:
    """Poll :func:`probe_ready` until ready; returns (seconds to ready, facts). Raises ``KernelcampError``
    when ``proc`` exits first, when the server refuses the readiness completion outright
    (:data:`REFUSALS`, e.g. a context too small for it), or when ``timeout_s`` passes (the caller
    cleans up); the line quotes the cause the server's ``log`` gives from byte ``log_offset`` on (where this
    start's lines begin) and names the log (:func:`_log_tail`)."""
    t0 = time.monotonic()
    reason = "not polled"
    while True:
        if proc is not None and proc.poll() is not None:
            why = _log_tail(log, log_offset)
            raise KernelcampError(f"server exited with status {proc.returncode} before it was ready{why}")
        ok, reason, facts = probe_ready(url, expect_hash, expect_pid, timeout_s=max(5.0, min(60.0, timeout_s)))
        if ok:
            return time.monotonic() - t0, facts
        if facts.get("refused"):
            raise KernelcampError(
                f"server at {url} refuses the readiness completion ({facts['refused']}): "
                f"check the server flags (e.g. server.max_context_tokens){_log_tail(log, log_offset)}"
            )
        if time.monotonic() - t0 > timeout_s:
            raise KernelcampError(
                f"server at {url} not ready after {timeout_s:g} s (last check: {reason}){_log_tail(log, log_offset)}"
            )
        time.sleep(poll_s)


#: At most this much of a log is read for :func:`_log_tail` (the start of one server: its error is near the top).
LOG_READ_BYTES = 4 << 20


def log_cause(text: str) -> str | None:
    """The line of a server's log ``text`` that says why it stopped: the first ``error: ...`` line (kernelcamp
    serve's one line on a refusal; an engine process's own line comes before its front's "exited with status N
    (its own lines above say why)") or the first traceback's exception line, whichever comes first; else the
    last non-empty line; None for an empty log."""
    lines = [ln.rstrip() for ln in text.splitlines() if ln.strip()]
    in_traceback = False
    for ln in lines:
        if ln.startswith("Traceback (most recent call last):"):
            in_traceback = True
        elif in_traceback and not ln[0].isspace():
            return ln.strip()  # the exception that ended the traceback
        elif ln.startswith("error:"):
            return ln.strip()
    return lines[-1].strip() if lines else None


def _log_tail(log: Path | None, offset: int = 0) -> str:
    """``; <log> says: <cause>`` for an error line: :func:`log_cause` of what the server wrote to ``log`` from
    byte ``offset`` on (where this start began: the log is appended to by every start), so that the line carries
    the real cause (e.g. ``error: out of memory (tried to allocate ...)``) and names the file with the rest."""
    if log is None or not log.exists():
        return ""
    try:
        with open(log, "rb") as f:
            f.seek(offset)
            text = f.read(LOG_READ_BYTES).decode(errors="replace")
    except OSError as e:
        return f"; its log {log} cannot be read ({e.strerror or e})"
    cause = log_cause(text)
    return f"; {log} says: {cause[:400]}" if cause else f"; its log {log} is empty"


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


def kernel_file(kpath: Path, sha256_local: str, sha256_remote: str | None, **extra: Any) -> dict[str, Any]:
    """The deploy record's ``files`` entry of the kernel module: its path relative to the tree it was
    read from (``kernels/<name>.py``; a queued experiment's temporary copy or the workspace, never a
    path of this machine), its local hash and the one the server reports, plus ``extra`` (``dest``)."""
    path = repo_relative(kpath, project_root())
    return {"path": path, **extra, "sha256_local": sha256_local, "sha256_remote": sha256_remote}


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


def stop_state(path: Path, grace_s: float = 15.0, wait_port: bool = True) -> bool:
    """Stop the kernelcamp server recorded in state file ``path`` (if it is still ours: the same process,
    by pid and start time (:func:`kernelcamp.io.same_process`), and a kernelcamp command line), wait for
    its port to be free (unless ``wait_port`` is false), remove the file; True if one was stopped."""
    st = _read_state(path)
    stopped = False
    if st and same_process(st.get("pid"), st.get("start_time")) and "kernelcamp" in _cmdline(st["pid"]):
        kill_group(st["pid"], st.get("pgid"), grace_s)
        stopped = True
    if wait_port and st and st.get("port"):
        try:
            _wait_port_free(int(st["port"]), st.get("host") or "127.0.0.1", 10.0)
        except KernelcampError:
            pass  # its host is no longer this machine's (port_is_free): no port of it to wait for
    path.unlink(missing_ok=True)
    return stopped
