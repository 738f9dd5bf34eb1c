"""Deploy kind ``ssh``: a remote server, files copied and checked over ssh (see :mod:`kernelcamp.deploy`)."""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path
from typing import Any

from kernelcamp.deploy.common import (
    _read_state,
    _record,
    _variant_facts,
    flag_env,
    probe_ready,
    state_dir,
    wait_ready,
)
from kernelcamp.errors import KernelcampError
from kernelcamp.io import write_json_atomic
from kernelcamp.provenance import now_utc, sha256_file


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


#: A remote directory this deploy quotes into a remote shell and hands to scp: no characters either could
#: read another way (scp's legacy protocol passes the path through the remote shell; a quoted ``~`` is a
#: folder named ``~`` for the shell while scp expands it).
REMOTE_DIR_RE = re.compile(r"^[A-Za-z0-9_./+@=-]+$")


def check_ssh_args(
    host: str | None = None, user: str | None = None, remote_path: str | None = None, prefix: str = ""
) -> None:
    """Refuse a host, user or remote path that ssh/scp would read as an option (``-oProxyCommand=...``
    runs a command on this machine) or that is empty, and a remote path outside :data:`REMOTE_DIR_RE`;
    one ``KernelcampError`` line naming the key (``prefix``: e.g. ``"deploy."``)."""
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
        if key == "remote_dir" and not REMOTE_DIR_RE.fullmatch(v):
            raise KernelcampError(
                f"{prefix}remote_dir = {v!r}: use a path of letters, digits and _ . / + @ = - only (the remote "
                "shell and scp must read it the same way; ~ is not expanded: write the home folder out)"
            )


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
        cfg["host"], cfg.get("port") or 22, cfg.get("user"), cfg.get("identity_file"), cfg.get("ssh_options")
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


#: The :class:`~kernelcamp.deploy.DeployKind` functions of this kind.
deploy = deploy_ssh


def stop(root: str | Path | None = None) -> bool:  # noqa: ARG001 - the DeployKind signature
    """Nothing to stop here: the remote server belongs to its host (its ``restart`` line replaces it)."""
    return False
