"""Test and benchmark aids: run an ASGI app on a free loopback port in a background thread.

    with ServerThread(make_fake_app(FakeSpec(ttft_ms=50))) as url:
        ...                                   # url = "http://127.0.0.1:<port>"

The server stops (and its port is released) when the block exits, also on error.
:func:`post_and_leave` sends a request the way a client that gives up does (a raw socket closed before
the answer).
"""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

import uvicorn

from kernelcamp.ports import port_is_free


def free_port(host: str = "127.0.0.1") -> int:
    """A port that was free on ``host`` a moment ago (bind to 0, read, close)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def free_port_block(n: int = 2, host: str = "127.0.0.1", lo: int = 20000, hi: int = 32000) -> int:
    """The first of ``n`` consecutive free ports, chosen below Linux's ephemeral range (32768-60999).

    A port from :func:`free_port` lies inside that range, so an outgoing connection (an HTTP client's
    own socket) can take its neighbour before a second server binds it; a flaky CI run did exactly
    that to the baseline server on candidate port + 1. Below the range only listeners compete.
    Raises ``RuntimeError`` when no block is free.
    """
    import random

    rng = random.Random()
    for _ in range(200):
        p = rng.randrange(lo, hi - n)
        if all(port_is_free(p + i, host) for i in range(n)):
            return p
    raise RuntimeError(f"no {n} consecutive free ports in [{lo}, {hi})")


class ServerThread:
    """Context manager: uvicorn serving ``app`` on 127.0.0.1:<free port> in a daemon thread."""

    def __init__(self, app: Any, port: int | None = None, startup_timeout_s: float = 30.0):
        self.port = port or free_port()
        self.config = uvicorn.Config(
            app, host="127.0.0.1", port=self.port, log_level="warning", access_log=False, timeout_graceful_shutdown=2
        )
        self.server = uvicorn.Server(self.config)
        self.server.install_signal_handlers = lambda: None  # uvicorn < 0.29
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.startup_timeout_s = startup_timeout_s

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> str:
        self.thread.start()
        deadline = time.monotonic() + self.startup_timeout_s
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"server on port {self.port} did not start")
            time.sleep(0.02)
        return self.url

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=15)
        if self.thread.is_alive():
            self.server.force_exit = True
            self.thread.join(timeout=5)

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def post_and_leave(
    url: str, path: str, body: bytes, headers: dict[str, str] | None = None, after_s: float = 0.05
) -> None:
    """POST ``body`` to ``url`` + ``path`` on a raw socket and close it ``after_s`` seconds later, before
    reading any answer (a client that gave up). ``headers`` are added to Host, Content-Type
    (application/json) and Content-Length (``len(body)``)."""
    from urllib.parse import urlsplit

    u = urlsplit(url)
    head = {"Host": u.netloc, "Content-Type": "application/json", "Content-Length": str(len(body)), **(headers or {})}
    lines = "".join(f"{k}: {v}\r\n" for k, v in head.items())
    with socket.create_connection((u.hostname, u.port or 80), timeout=10) as s:
        s.sendall(f"POST {path} HTTP/1.1\r\n{lines}\r\n".encode("latin-1") + body)
        time.sleep(after_s)


class LoopbackSshd:
    """Context manager: a private ``sshd`` on 127.0.0.1:<free port> with a temp host key and one
    authorized client key (needs ``/usr/sbin/sshd``, i.e. ``apt-get install -y openssh-server``).

    Yields self with ``port``, ``user``, ``identity_file`` and ``options`` (for :class:`SshRunner`).
    """

    SSHD = "/usr/sbin/sshd"

    def __init__(self, workdir: str):
        import getpass
        import os

        self.dir = os.path.abspath(workdir)
        self.port = free_port()
        self.user = getpass.getuser()
        self.identity_file = os.path.join(self.dir, "client_key")
        self.options = [
            "-o",
            "StrictHostKeyChecking=no",
            "-o",
            f"UserKnownHostsFile={self.dir}/known_hosts",
            "-o",
            "LogLevel=ERROR",
        ]
        self.proc = None

    @classmethod
    def available(cls) -> bool:
        import os
        import shutil

        return os.path.exists(cls.SSHD) and shutil.which("ssh") is not None and shutil.which("scp") is not None

    def __enter__(self) -> LoopbackSshd:
        import os
        import subprocess

        os.makedirs(self.dir, exist_ok=True)
        for name in ("host_key", "client_key"):
            subprocess.run(
                ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", os.path.join(self.dir, name)], check=True
            )
        auth = os.path.join(self.dir, "authorized_keys")
        with open(self.identity_file + ".pub") as src, open(auth, "w") as dst:
            dst.write(src.read())
        os.chmod(auth, 0o600)
        cfg = os.path.join(self.dir, "sshd_config")
        with open(cfg, "w") as f:
            f.write(
                f"Port {self.port}\nListenAddress 127.0.0.1\nHostKey {self.dir}/host_key\n"
                f"AuthorizedKeysFile {auth}\nPidFile {self.dir}/sshd.pid\nStrictModes no\nUsePAM no\n"
                "PasswordAuthentication no\nKbdInteractiveAuthentication no\nPubkeyAuthentication yes\n"
                "PermitRootLogin prohibit-password\nSubsystem sftp internal-sftp\n"
            )
        os.makedirs("/run/sshd", exist_ok=True)
        self.proc = subprocess.Popen(
            [self.SSHD, "-D", "-e", "-f", cfg],
            stdout=subprocess.DEVNULL,
            stderr=open(os.path.join(self.dir, "sshd.log"), "w"),
        )
        deadline = time.monotonic() + 10
        while port_is_free(self.port):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.__exit__()
                raise RuntimeError(f"sshd did not start (see {self.dir}/sshd.log)")
            time.sleep(0.05)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except Exception:  # noqa: BLE001
                self.proc.kill()
                self.proc.wait(timeout=5)
