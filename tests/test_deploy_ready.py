"""Readiness: a server that will never be ready is reported at once, not after health_timeout_s."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
from fastapi import FastAPI
from fastapi.responses import JSONResponse

from kernelcamp.deploy.common import wait_ready
from kernelcamp.errors import KernelcampError
from kernelcamp.serve.testing import ServerThread


def _refusing_app(status: int) -> FastAPI:
    app = FastAPI()

    @app.get("/health")
    def health():
        return {"status": "ok"}

    @app.post("/v1/completions")
    def completions():
        msg = "the prompt's 5 tokens + max_tokens=2 exceed this server's context of 1 tokens"
        return JSONResponse({"error": {"message": msg, "type": "invalid_request_error"}}, status_code=status)

    return app


@pytest.mark.parametrize("status", [400, 401, 404])
def test_a_refused_readiness_completion_fails_at_once(status: int) -> None:
    """`-S server.max_context_tokens=1`: the server was up but refused every completion, and deploy
    waited the whole health_timeout_s (600 s) before saying so."""
    with ServerThread(_refusing_app(status)) as url:
        t0 = time.monotonic()
        with pytest.raises(KernelcampError, match=f"refuses the readiness completion \\(completion {status}: "):
            wait_ready(url, None, timeout_s=600, poll_s=0.1)
        assert time.monotonic() - t0 < 30


def test_a_server_still_starting_is_waited_for() -> None:
    """503 (not ready yet) is not a refusal: polling goes on until the timeout."""
    with ServerThread(_refusing_app(503)) as url, pytest.raises(KernelcampError, match="not ready after 1 s"):
        wait_ready(url, None, timeout_s=1, poll_s=0.1)


def _exited(code: int) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", f"raise SystemExit({code})"])
    proc.wait()
    return proc


ENGINE_OOM = """kernelcamp serve: http://127.0.0.1:8765 (bound to 127.0.0.1) pid 100
error: out of memory (tried to allocate 1254130413056 bytes): the run's shapes do not fit this machine; lower it
kernelcamp serve: the engine process (pid 101) exited with status 2; the front stops too (the engine's own lines ...)
error: the engine process (pid 101) exited with status 2 (its own lines above say why)
"""
ENGINE_TRACEBACK = """kernelcamp serve: http://127.0.0.1:8765 (bound to 127.0.0.1) pid 100
Traceback (most recent call last):
  File "kernelcamp/serve/model.py", line 1, in build
    raise ValueError("page size 48 is not a power of two")
ValueError: page size 48 is not a power of two
error: the engine process (pid 101) exited with status 1 (its own lines above say why)
"""


@pytest.mark.parametrize(
    "text,cause",
    [
        (ENGINE_OOM, "error: out of memory (tried to allocate 1254130413056 bytes)"),
        (ENGINE_TRACEBACK, "ValueError: page size 48 is not a power of two"),
        ("starting\nsomething odd\n", "something odd"),  # no error line: the last one, as before
    ],
)
def test_a_server_that_dies_at_start_is_reported_with_its_own_cause_and_its_log(tmp_path, text, cause) -> None:
    """`-S server.cpu_cache_tokens=2147483647`: deploy's line quoted the log's last line, the front's "the engine
    process ... exited with status 2 (its own lines above say why)", and the cause (out of memory) was only in
    .kernelcamp/server.log. The line quotes the engine's own error (or its traceback's exception) and names the
    log; an earlier start's lines, above this start's in the appended log, are not quoted."""
    log = tmp_path / "server.log"
    earlier = "error: an earlier start's error, long fixed\n"
    log.write_text(earlier + text)
    with pytest.raises(KernelcampError) as e:
        wait_ready(
            "http://127.0.0.1:9", None, timeout_s=60, poll_s=0.1, proc=_exited(2), log=log, log_offset=len(earlier)
        )
    msg = str(e.value)
    assert msg.startswith("server exited with status 2 before it was ready; ") and "\n" not in msg, msg
    assert f"{log} says: {cause}" in msg, msg


def test_setup_digest_covers_what_the_server_computes_and_its_host_not_its_port() -> None:
    """A live server was reused after `-S workload=deepseek_v32` (the variant hash leaves the workload
    out), so the new setup's records described a server of the old one."""
    import copy
    from pathlib import Path

    import yaml

    from kernelcamp.deploy.embedded import setup_digest

    params = yaml.safe_load((Path(__file__).resolve().parents[1] / "params.yaml").read_text())
    base = setup_digest(params)
    for section, key, value in (
        ("workload", "num_heads", 128),
        ("server", "max_context_tokens", 4096),
        ("server", "num_cache_tokens", 1 << 20),
        ("server", "device", "cuda:1"),
        ("kernel", "dot_dtype", "fp16"),  # the server's launcher takes it: a reused bf16 server was measured
        ("server", "host", "0.0.0.0"),  # a loopback server was reused and recorded as listening on 0.0.0.0
    ):
        p = copy.deepcopy(params)
        p[section][key] = value
        assert setup_digest(p) != base, (section, key)
    p = copy.deepcopy(params)
    p["server"].update(port=9999)  # a server on a fallback port is the same setup
    assert setup_digest(p) == base


def test_setup_digest_covers_every_section_the_server_reads() -> None:
    """The whole kind: each params section the embedded server reads is the variant's (its hash) or in
    ``setup_digest``; `-S kernel.dot_dtype=fp16` reused a server running bf16 dots."""
    from pathlib import Path

    import yaml
    from param_reads import ParamReads, sections

    from kernelcamp.deploy.embedded import SERVER_SECTIONS
    from kernelcamp.serve.server import build_state

    params = yaml.safe_load((Path(__file__).resolve().parents[1] / "params.yaml").read_text())
    seen: set[str] = set()
    build_state(ParamReads(params, seen), "cpu")
    read = sections(seen)
    assert "kernel" in read and read <= {"variant", *SERVER_SECTIONS}, sorted(read)


def test_a_server_started_by_other_server_code_is_not_reused(tmp_path, monkeypatch) -> None:
    """A line added to kernelcamp/serve/server.py, then `dvc exp run`: deploy reran (kernelcamp/serve is its
    dependency) and reused the live server, which still ran the old code, while the serving benchmark's baseline
    server started with the new: an old-code candidate against a new-code baseline, recorded as the new code."""
    import shutil
    from pathlib import Path

    import yaml

    from kernelcamp.deploy import embedded
    from kernelcamp.deploy.embedded import server_code_hash, setup_digest

    root = Path(__file__).resolve().parents[1]
    shutil.copytree(root / "kernelcamp", tmp_path / "kernelcamp", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(root / "dvc.yaml", tmp_path / "dvc.yaml")
    base = server_code_hash(tmp_path)
    assert base == server_code_hash(root)
    report = tmp_path / "kernelcamp" / "report.py"  # not code the deploy runs: no restart for it
    report.write_text(report.read_text() + "\n# edited\n")
    assert server_code_hash(tmp_path) == base
    server = tmp_path / "kernelcamp" / "serve" / "server.py"
    server.write_text(server.read_text() + "\n# edited\n")
    assert server_code_hash(tmp_path) != base
    params = yaml.safe_load((root / "params.yaml").read_text())
    before = setup_digest(params)
    monkeypatch.setattr(embedded, "server_code_hash", lambda root=None: "0" * 16)
    assert setup_digest(params) != before
