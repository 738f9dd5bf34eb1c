"""Test and benchmark aids: run an ASGI app on a free loopback port in a background thread.

    with ServerThread(make_fake_app(FakeSpec(ttft_ms=50))) as url:
        ...                                   # url = "http://127.0.0.1:<port>"

The server stops (and its port is released) when the block exits, also on error.
"""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

import uvicorn


def free_port(host: str = "127.0.0.1") -> int:
    """A port that was free on ``host`` a moment ago (bind to 0, read, close)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    """True when nothing accepts connections on host:port and the port can be bound."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        if s.connect_ex((host, port)) == 0:
            return False
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


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
