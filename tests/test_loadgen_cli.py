"""``kernelcamp loadgen`` against the fixed-rate fake server: vLLM bench serve's metrics per level
(JSON Lines and the human block), failures kept out of throughput with exit status 1, the API key,
and bad input (ours, or arguments the server refuses) as one ``error:`` line with exit status 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kernelcamp.cli import main
from kernelcamp.loadgen import RequestResult, error_message, refusal, refusal_advice
from kernelcamp.serve.fake import FakeSpec, make_fake_app
from kernelcamp.serve.openai import MODEL_NAME
from kernelcamp.serve.testing import ServerThread, free_port

ROOT = Path(__file__).resolve().parents[1]
LATENCIES = ("ttft", "tpot", "itl", "e2e")


def test_json_lines_one_object_per_level_with_known_values(capsys):
    ttft, itl, n = 40.0, 5.0, 6
    with ServerThread(make_fake_app(FakeSpec(ttft_ms=ttft, itl_ms=itl))) as url:
        rc = main(["loadgen", "--url", url, "--concurrency", "2", "1", "--num-requests", "4", "--max-tokens", str(n)])
        human = capsys.readouterr()
        rc_json = main(
            ["loadgen", "--url", url + "/v1/", "--concurrency", "2", "1", "--num-requests", "4"]
            + ["--max-tokens", str(n), "--json"]
        )
        out = capsys.readouterr()
    assert rc == 0 and rc_json == 0, out.err
    rows = [json.loads(line) for line in out.out.splitlines()]
    assert [r["concurrency"] for r in rows] == [2, 1]  # the order given
    for r in rows:
        assert r["url"] == url and r["endpoint"] == "/v1/completions" and r["model"] == MODEL_NAME
        assert r["valid"] and (r["requests_ok"], r["requests_failed"], r["num_requests"]) == (4, 0, 4)
        assert r["output_tokens"] == 4 * n
        assert r["request_throughput"] == pytest.approx(4 / r["wall_s"])
        assert r["output_tok_s"] == pytest.approx(4 * n / r["wall_s"])
        for m in LATENCIES:
            assert r[f"{m}_ms_p50"] <= r[f"{m}_ms_p90"] <= r[f"{m}_ms_p99"], m
        assert ttft - 1 <= r["ttft_ms_p50"] <= ttft + 30
        assert itl * 0.9 <= r["tpot_ms_p50"] <= itl * 1.5
    assert rows[1]["wall_s"] >= 4 * (ttft + (n - 1) * itl) / 1e3  # concurrency 1: one after another
    assert "concurrency 2" in out.err and "concurrency 1" in out.err  # the progress bars, on stderr
    # the human output: vLLM's labels, one block per level
    for label in ("Successful requests:", "Failed requests:", "Request throughput (req/s):", "P99 TTFT (ms):"):
        assert human.out.count(label) == 2, label
    for label in ("Median TPOT (ms):", "P90 ITL (ms):", "Mean E2EL (ms):", "Output token throughput (tok/s):"):
        assert label in human.out


def test_failed_requests_counted_kept_out_of_throughput_and_exit_1(capsys):
    with ServerThread(make_fake_app(FakeSpec(ttft_ms=2, itl_ms=1, fail_every=2))) as url:
        rc = main(["loadgen", "--url", url, "--num-requests", "4", "--max-tokens", "3", "--json"])
    row = json.loads(capsys.readouterr().out)
    assert rc == 1
    assert (row["requests_ok"], row["requests_failed"], row["valid"]) == (2, 2, False)
    assert row["failure_reasons"] == {"http_500": 2}
    assert row["output_tokens"] == 6 and row["request_throughput"] == pytest.approx(2 / row["wall_s"])


def test_chat_endpoint_model_and_api_key(capsys, monkeypatch):
    monkeypatch.delenv("KERNELCAMP_API_KEY", raising=False)
    with ServerThread(make_fake_app(FakeSpec(ttft_ms=1, itl_ms=1), api_key="sekrit")) as url:
        args = ["loadgen", "--url", url, "--concurrency", "2", "--num-requests", "2", "--max-tokens", "4", "--json"]
        assert main(args) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and "--api-key" in err and err.count("\n") == 1
        assert main(args + ["--chat", "--model", MODEL_NAME, "--api-key", "sekrit"]) == 0
        row = json.loads(capsys.readouterr().out)
    assert row["endpoint"] == "/v1/chat/completions" and row["model"] == MODEL_NAME
    assert row["valid"] and row["requests_ok"] == 2


@pytest.mark.parametrize(
    "args, says",
    [
        (["--url", "127.0.0.1:8765"], "expected http://host:port"),
        (["--url", "ftp://127.0.0.1:8765"], "expected http://host:port"),
        (["--url", "http://127.0.0.1:99999"], "--url"),
        (["--url", "http://127.0.0.1:{free}"], "cannot reach http://127.0.0.1:"),
        (["--url", "http://127.0.0.1:{free}", "--concurrency", "4", "0"], "--concurrency: 0 is not positive"),
        (["--url", "http://127.0.0.1:{free}", "--num-requests", "-3"], "--num-requests: -3 is not positive"),
        (["--url", "http://127.0.0.1:{free}", "--max-tokens", "0"], "--max-tokens: 0 is not positive"),
        (["--url", "http://127.0.0.1:{free}", "--max-tokens", "two"], "'two' is not an integer"),
        (["--url", "http://127.0.0.1:{free}", "--timeout-s", "0"], "--timeout-s"),
        (["--concurrency", "1"], "--url"),
    ],
)
def test_bad_input_is_one_error_line_and_exit_2(args, says, capsys):
    args = [a.replace("{free}", str(free_port())) for a in args]
    with pytest.raises(SystemExit) as e:  # argparse's errors exit; the checks after parsing return 2
        raise SystemExit(main(["loadgen", *args]))
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and says in err, err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    "args, says",
    [
        (["--max-tokens", "100000"], "(HTTP 400): max_tokens: Input should be less than or equal to 65536"),
        (["--model", "nope"], "(HTTP 404): The model `nope` does not exist: this server serves"),
        (["--chat", "--model", "nope"], "/v1/chat/completions refused all 4 requests at concurrency 2 (HTTP 404)"),
    ],
)
def test_arguments_the_server_refuses_are_one_error_line_and_exit_2(args, says, capsys):
    """Before: every request was refused (400 or 404) and the run printed the level as measured, INVALID,
    exit status 1. Now: the server's own reason in one ``error:`` line, exit status 2, nothing on stdout."""
    with ServerThread(make_fake_app(FakeSpec(ttft_ms=1, itl_ms=1))) as url:
        rc = main(["loadgen", "--url", url, "--concurrency", "2", "1", "--num-requests", "4", "--json", *args])
    out = capsys.readouterr()
    assert rc == 2 and out.out == "", out.out
    assert out.err.startswith("error: ") and out.err.count("\n") == 1 and says in out.err, out.err


def test_only_a_first_level_refused_whole_for_its_arguments_is_bad_input():
    def refused(statuses: list[str]) -> RequestResult | None:
        return refusal([RequestResult(i, status=s, error=f"reason {i}") for i, s in enumerate(statuses)])

    assert refused(["http_404", "http_400"]).error == "reason 0"
    assert refused(["http_400", "ok"]) is None  # some requests ran: a measured (invalid) level
    assert refused(["http_400", "http_500"]) is None
    assert refused(["http_429", "http_429"]) is None and refused(["http_408"]) is None  # about load, not arguments
    assert refused([]) is None
    body = b'{"error": {"message": "max_tokens:\\n too many", "type": "invalid_request_error"}}'
    assert error_message(body) == "max_tokens: too many"
    assert error_message(b'{"detail": "Not Found"}') == "Not Found" and error_message(b"") == "(empty answer)"
    assert error_message(b"x" * 1000) == "x" * 297 + "..."
    # what to fix: a new user's `--url http://host:port/foo` (404, no route) was told to fix --model or --max-tokens
    assert "check --url" in refusal_advice("http_404", "Not Found")
    assert "check --url" in refusal_advice("http_405", "Method Not Allowed")
    assert "--model" in refusal_advice("http_404", "The model `nope` does not exist: this server serves x")
    assert "check --api-key" in refusal_advice("http_401", "invalid key")
    assert "--max-tokens" in refusal_advice("http_400", "max_tokens: too many")


def test_unreachable_url_from_the_command_line():
    r = subprocess.run(
        [sys.executable, "-m", "kernelcamp.cli", "loadgen", "--url", f"http://127.0.0.1:{free_port()}"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.startswith("error: cannot reach") and r.stderr.count("\n") == 1, r.stderr


@pytest.mark.parametrize("key", ["secret ", " secret", "sec ret", "secr\u00e9t", "secret\n"])
def test_a_key_a_header_cannot_carry_is_one_error_line_that_does_not_show_it(key, capsys, monkeypatch):
    """`--api-key "secret "` printed `error: cannot reach ...: Illegal header value b'Bearer secret '`: a server
    that was reachable, and the key on stderr."""
    with ServerThread(make_fake_app(FakeSpec(ttft_ms=1, itl_ms=1))) as url:
        rc = main(["loadgen", "--url", url, "--concurrency", "1", "--api-key", key])
        out = capsys.readouterr()
        assert rc == 2 and out.out == "" and out.err.count("\n") == 1, out.err
        assert out.err.startswith("error: --api-key: has whitespace") and "secr" not in out.err, out.err
        monkeypatch.setenv("KERNELCAMP_API_KEY", key)
        rc = main(["loadgen", "--url", url, "--concurrency", "1"])
        out = capsys.readouterr()
        assert rc == 2 and out.err.startswith("error: $KERNELCAMP_API_KEY: has whitespace"), out.err


@pytest.mark.parametrize("models", ["empty", "absent", "null id", "blank id"])
def test_the_record_names_the_model_the_requests_sent_when_the_server_lists_none(models, capsys, monkeypatch):
    """A server whose ``/v1/models`` lists nothing (or has no such route) got every request as model
    ``default``, while ``--json`` recorded ``"model": null``: a record that differs from what ran."""
    from kernelcamp.serve import fake

    sent: list[str] = []
    monkeypatch.setattr(fake, "_check_model", lambda req: sent.append(req.model))  # serves any name
    app = make_fake_app(FakeSpec(ttft_ms=1, itl_ms=1))
    app.router.routes[:] = [r for r in app.router.routes if getattr(r, "path", "") != "/v1/models"]
    listed = {"empty": [], "null id": [{"id": None}], "blank id": [{"id": "  "}]}
    if models in listed:  # `"id": null` was sent, and recorded, as the model "None"
        app.get("/v1/models")(lambda: {"object": "list", "data": listed[models]})
    with ServerThread(app) as url:
        rc = main(["loadgen", "--url", url, "--concurrency", "1", "--num-requests", "2", "--json"])
    row = json.loads(capsys.readouterr().out)
    assert rc == 0 and sent == ["default", "default"]
    assert row["model"] == "default"


def test_a_password_in_the_url_is_never_printed_or_recorded(capsys):
    """``--url http://me:s3cret@host:port`` printed the password in every error line and recorded it in each
    ``--json`` object and the human block's Endpoint."""
    with ServerThread(make_fake_app(FakeSpec(ttft_ms=1, itl_ms=1))) as url:
        with_password = url.replace("http://", "http://me:s3cret@")
        rc = main(["loadgen", "--url", with_password, "--concurrency", "1", "--num-requests", "1", "--json"])
        rc_human = main(["loadgen", "--url", with_password, "--concurrency", "1", "--num-requests", "1"])
        rc_refused = main(["loadgen", "--url", with_password, "--concurrency", "1", "--model", "nope"])
        out = capsys.readouterr()
    shown = url.replace("http://", "http://me:***@")
    assert (rc, rc_human, rc_refused) == (0, 0, 2), out.err
    endpoint_line = next(line for line in out.out.splitlines() if line.startswith("Endpoint:"))
    assert json.loads(out.out.splitlines()[0])["url"] == shown and endpoint_line.endswith(f" {shown}/v1/completions")
    assert f"error: {shown}/v1/completions refused" in out.err
    gone = f"http://me:s3cret@127.0.0.1:{free_port()}"
    for url in (
        gone,
        gone + "/x?q=1",
        gone.replace("127.0.0.1", "[::1"),
        gone.replace("s3cret", "s3cret/x"),  # urlsplit's reason quoted the password's first part ('s3cret')
        gone.replace("s3cret", "s3\x01cret"),  # a traceback: httpx.InvalidURL
        gone.replace("127.0.0.1", "a..b"),  # a traceback: UnicodeError (IDNA)
    ):
        args = ["--url", url]
        assert main(["loadgen", *args, "--concurrency", "1"]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and err.count("\n") == 1 and "me:***@" in err, err
        assert "s3" not in err and "cret" not in err, err
    assert "s3cret" not in out.out + out.err


@pytest.mark.parametrize(
    "url, shown",
    [
        ("http://me:s3cret@host:8000/v1", "http://me:***@host:8000/v1"),
        ("https://me:p@ss@host", "https://me:***@host"),  # an unquoted @ in the password: the last @ ends it
        ("http://me:s3cret@[::1", "http://me:***@[::1"),  # too malformed for urlsplit
        ("http://:s3cret@host", "http://:***@host"),
        ("http://me@host:8000", "http://me@host:8000"),  # a user name alone is kept
        # a password holding /, ?, # or @ unencoded (urlsplit ends the user information at the first /): hidden whole
        ("http://me:pa/ss@host:8000", "http://me:***@host:8000"),
        ("http://me:pa#ss@host", "http://me:***@host"),
        ("http:///me:s3cret@host", "http:///me:***@host"),  # typos of the scheme's slashes
        ("http:me:s3cret@host", "http:me:***@host"),
        ("http://host:8000/a@b:c", "http://host:***@b:c"),  # the price: an @ later in a URL hides what precedes it
        ("sqlite:////abs/mlflow.db", "sqlite:////abs/mlflow.db"),
    ],
)
def test_url_shown_hides_only_the_password(url, shown):
    from kernelcamp.errors import url_shown

    assert url_shown(url) == shown
