"""A deployed server that stopped is found before any measuring, with the command that recovers.

Found by a new user: after `make clean-server`, DVC still thinks `deploy` is up to date, and the
benchmark ran all its kernel rounds before failing on the missing server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from kernelcamp.serve.testing import free_port

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    "stage, queued",
    [("benchmark", False), ("verify", False), ("benchmark", True), ("verify", True)],
)
def test_stopped_server_fails_fast_with_the_redeploy_command(tmp_path: Path, stage: str, queued: bool) -> None:
    # queued: the stage runs in a copy of the workspace ($DVC_ROOT elsewhere), as a queued experiment's does;
    # forcing the workspace's deploy stage would not reach it (it advised `dvc repro -f -s deploy` there too)
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    pfile = tmp_path / "params.yaml"
    pfile.write_text(yaml.safe_dump(params))
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there: the server has stopped
    deploy = tmp_path / "deploy.json"
    from kernelcamp.spec import parse_spec

    hashes = parse_spec(params).hashes()  # records of these params (the stages check that first)
    deploy.write_text(json.dumps({"kind": "embedded", "url": url, "pid": 123, **hashes}))
    (tmp_path / "build.json").write_text(json.dumps(hashes))
    r_out = tmp_path / "reports"
    if stage == "benchmark":
        args = ["--build", str(tmp_path / "build.json"), "--out", str(r_out / "benchmark.json")]
        args += ["--metrics", str(r_out / "m.json"), "--latency-csv", str(r_out / "l.csv")]
        args += ["--summary-csv", str(r_out / "s.csv"), "--serving-csv", str(r_out / "sv.csv")]
        args += ["--serving-summary-csv", str(r_out / "ss.csv"), "--trace", str(r_out / "t.json.gz")]
        args += ["--kernel-table", str(r_out / "k.csv")]
    else:
        args = ["--out", str(r_out / "verify.json"), "--details", str(r_out / "d.json")]
    env = {**os.environ, "DVC_ROOT": str(tmp_path), "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}"}
    if not queued:
        env.pop("DVC_ROOT")  # the workspace: $DVC_ROOT is this tree (unset: the current directory, ROOT)
    r = subprocess.run(
        [sys.executable, "-m", f"stages.{stage}", "--params", str(pfile), "--deploy", str(deploy), *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=300,
    )
    assert r.returncode == 2, r.stdout[-1000:] + r.stderr[-1000:]
    errors = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "does not answer" in errors[0]
    if queued:
        assert "queue it again" in errors[0] and "dvc repro" not in errors[0]
    else:
        assert "dvc repro -f -s deploy" in errors[0]
    assert "batch" not in r.stdout, "it measured before finding the server gone"
    assert not r_out.exists() or not any(r_out.iterdir()), "nothing is written"


@pytest.mark.parametrize("fails_in", ["deploy", "before_outputs", "interrupt"])
def test_a_deploy_that_fails_removes_the_record_of_the_server_it_replaced(tmp_path, monkeypatch, fails_in):
    """A deploy stage stopped by a conf/ edit (its check after the new server started) left the last run's
    deploy.json beside the new server: the next run skipped deploy and refused to measure, "redeploy with dvc repro
    -f -s deploy" (helper-68). A deploy that fails, however, removes the record, so that DVC deploys again."""
    import stages.deploy as sd
    from kernelcamp.errors import KernelcampError
    from kernelcamp.spec import load_spec

    out = tmp_path / "deploy.json"
    out.write_text('{"deploy_id": "the last finished deploy"}\n')
    spec = load_spec(ROOT / "params.yaml")
    monkeypatch.setattr(sys, "argv", ["deploy", "--params", str(ROOT / "params.yaml"), "--out", str(out)])
    monkeypatch.setattr(sd, "stage_spec", lambda stage, path: spec)
    error = KeyboardInterrupt if fails_in == "interrupt" else KernelcampError

    def replaced(raw):  # the new server is up (or half up) when the stage fails
        if fails_in != "before_outputs":
            raise error("stopped")
        return dict(spec.hashes())

    def check(stage, path):
        raise KernelcampError("conf/variant/bt16_w4.yaml changed while the deploy stage ran")

    monkeypatch.setattr(sd, "deploy", replaced)
    monkeypatch.setattr(sd, "before_outputs", check)
    with pytest.raises(error):
        sd.main()
    assert not out.exists()
