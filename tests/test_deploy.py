"""Deploy targets: embedded (stage script, restart, reuse, a foreign or stale process on the port: the
next free port, never ready), command (launch with flag env, reuse, stop), ssh (against a private sshd on loopback when
/usr/sbin/sshd exists; checksum comparison with a fake remote runner always). No test leaves a
process or a port behind."""

from __future__ import annotations

import copy
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml

from kernelcamp.bench.serving import check_baseline_port
from kernelcamp.deploy import deploy
from kernelcamp.deploy.command import stop_command
from kernelcamp.deploy.common import _alive, kill_group
from kernelcamp.deploy.embedded import fallback_ports, stop_embedded
from kernelcamp.deploy.ssh import compare_checksums, deploy_ssh, remote_sha256
from kernelcamp.errors import KernelcampError
from kernelcamp.hashes import params_variant_hash
from kernelcamp.io import load_params
from kernelcamp.serve.fake import FakeSpec, make_fake_app
from kernelcamp.serve.testing import LoopbackSshd, ServerThread, free_port, free_port_block, port_is_free

ROOT = Path(__file__).resolve().parents[1]


def _procs_mentioning(text: str) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit() and int(d.name) != os.getpid():
            try:
                if text in (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"):
                    out.append(int(d.name))
            except OSError:
                pass
    return out


@pytest.fixture
def params(tmp_path, monkeypatch):
    monkeypatch.setenv("DVC_ROOT", str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    p = load_params(ROOT / "params.yaml")
    p["server"] = {**p["server"], "port": free_port(), "max_running_requests": 4}
    p["deploy"] = {"kind": "embedded", "health_timeout_s": 90, "poll_interval_s": 0.2, "port_free_timeout_s": 1}
    yield p
    stop_embedded(tmp_path)
    stop_command(tmp_path)
    assert not _procs_mentioning(str(tmp_path)), "a server started by the test is still running"
    assert port_is_free(p["server"]["port"])


def test_embedded_stage_restart_and_reuse(params, tmp_path):
    pfile, out = tmp_path / "params.yaml", tmp_path / "reports" / "deploy.json"
    pfile.write_text(yaml.safe_dump(params))
    r = subprocess.run(
        [sys.executable, "-m", "stages.deploy", "--params", str(pfile), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr
    rec = json.loads(out.read_text())
    assert rec["variant_hash"] == params_variant_hash(params) and rec["hash_verified"] and not rec["reused"]
    assert rec["checksums_match"] and rec["files"][0]["sha256_local"] == rec["files"][0]["sha256_remote"]
    assert rec["seconds_to_healthy"] > 0 and rec["url"].startswith("http://127.0.0.1:")
    for key in ("flags", "pid", "timestamp", "deploy_id", "kernel_source_hash"):
        assert rec[key]
    assert rec["log"] == ".kernelcamp/server.log", "records keep workspace paths relative, never this machine's"
    again = deploy(params, tmp_path)  # same hash and flags: a no-op
    assert again["reused"] and again["pid"] == rec["pid"] and again["deploy_id"] == rec["deploy_id"]
    assert again["log"] == ".kernelcamp/server.log"
    changed = copy.deepcopy(params)
    changed["server"]["max_running_requests"] = 2  # other flags: the old server holds the port and is replaced
    new = deploy(changed, tmp_path)
    assert not new["reused"] and new["pid"] != rec["pid"] and new["variant_hash"] != rec["variant_hash"]
    assert not _alive(rec["pid"])
    info = httpx.get(new["url"] + "/v1/kernelcamp/info").json()
    assert info["pid"] == new["pid"] and info["variant_hash"] == new["variant_hash"]


def test_a_server_an_earlier_profile_left_slower_is_restarted_not_reused(params, tmp_path, monkeypatch, capsys):
    """Same hash, flags and setup, but its info says cuda_profiled: CUPTI stays attached after a torch
    profile and every later step is slower (kernelcamp.serve.client.CUDA_PROFILED_WHY), so a deploy starts
    a fresh server instead of handing the next benchmark a slower one."""
    from kernelcamp.serve.client import INFO_PATH

    rec = deploy(params, tmp_path)
    # A CPU server cannot run a CUDA profile: its info answers say it did (the deploy's own readiness
    # check reads them; patching that check instead hid that it dropped the key, found on the H200).
    real = httpx.Response.json

    def profiled(self, **kw):
        body = real(self, **kw)
        if self.request.url.path == INFO_PATH:
            body["cuda_profiled"] = True
        return body

    monkeypatch.setattr(httpx.Response, "json", profiled)
    capsys.readouterr()
    new = deploy(params, tmp_path)
    err = capsys.readouterr().err
    assert not new["reused"] and new["pid"] != rec["pid"] and not _alive(rec["pid"])
    assert f"deploy: not reusing the server (pid {rec['pid']})" in err and "CUPTI" in err, err


def _listen(port):
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", port))
    s.listen()
    return s


def test_foreign_listener_on_port_deploys_on_next_free_port(params, tmp_path, capsys):
    # `make run` stopped at deploy when another program held server.port. Now: the configured port is
    # held by a plain listener, port + 1 is the configured port's baseline port (skipped), port + 2 by a
    # stale process that even claims the right hash (never used): the server takes port + 3, its
    # baseline server will take port + 4, and the record's url says so.
    port = params["server"]["port"] = free_port_block(10)
    stale = make_fake_app(FakeSpec(variant_hash=params_variant_hash(params)))
    with _listen(port), ServerThread(stale, port=port + 2):
        rec = deploy(params, tmp_path)
        err = capsys.readouterr().err
        assert rec["url"] == f"http://127.0.0.1:{port + 3}" and rec["port"] == port + 3
        assert rec["configured_port"] == port and not rec["reused"] and rec["hash_verified"]
        assert f"port {port} on 127.0.0.1 (server.port) is held by a process this deploy did not start" in err
        lines = [ln for ln in err.splitlines() if ln.startswith("deploy: ")]
        assert len(lines) == 1 and f"serving on port {port + 3} instead" in lines[0], err
        assert f"baseline server on {port + 4}" in lines[0] and rec["port_note"] == lines[0][len("deploy: ") :]
        info = httpx.get(rec["url"] + "/v1/kernelcamp/info").json()
        assert info["pid"] == rec["pid"] and info["variant_hash"] == rec["variant_hash"]
        again = deploy(params, tmp_path)  # our live server on the fallback port, same hash and flags: reused
        assert again["reused"] and again["pid"] == rec["pid"] and again["url"] == rec["url"]
        assert again["deploy_id"] == rec["deploy_id"] and again["configured_port"] == port
        # the benchmark derives the baseline port from the url actually used, never from server.port
        check_baseline_port(params, rec, tmp_path)
        with _listen(port + 4):
            with pytest.raises(KernelcampError, match=f"baseline server port {port + 4} on 127.0.0.1"):
                check_baseline_port(params, rec, tmp_path)


def test_a_server_started_for_another_server_port_is_not_reused(params, tmp_path):
    # `dvc exp run` (server on 8765), then `-S server.port=8760`: 8765 is in 8760's fallback range, so the
    # server was reused and deploy.json said "port 8760 was held by another process when it started"; nothing
    # ever held 8760
    base = free_port_block(20)
    params["server"]["port"] = base + 10
    first = deploy(params, tmp_path)
    assert first["port"] == base + 10 and not first["reused"]
    moved = copy.deepcopy(params)
    moved["server"]["port"] = base + 5  # its fallbacks (base + 7 ...) include base + 10
    new = deploy(moved, tmp_path)
    assert not new["reused"] and new["port"] == base + 5 and new["configured_port"] == base + 5
    assert not new.get("port_note") and not _alive(first["pid"])
    assert deploy(moved, tmp_path)["reused"]  # the same server.port again: reused


def test_no_free_fallback_port_is_a_clear_error(params, tmp_path):
    port = params["server"]["port"] = free_port_block(10)
    tried = fallback_ports(port, params)
    assert tried and port + 1 not in tried and max(tried) + 1 < port + 10  # baseline offset 1: skipped, in range
    socks = [_listen(p) for p in [port, *tried]]
    try:
        with pytest.raises(KernelcampError, match="held by a process this deploy did not start, and no fallback"):
            deploy(params, tmp_path)
    finally:
        for s in socks:
            s.close()
    assert not (tmp_path / ".kernelcamp" / "server.json").exists()


def _ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


@pytest.mark.skipif(not _ipv6_loopback(), reason="no IPv6 loopback here")
def test_port_is_free_on_an_ipv6_host():
    """port_is_free used AF_INET only: `-S server.host=::1` (which `kernelcamp serve --host ::1` serves) crashed
    the deploy with socket.gaierror "Address family for hostname not supported". It uses getaddrinfo's family."""
    with socket.socket(socket.AF_INET6) as s:
        s.bind(("::1", 0))
        s.listen()
        port = s.getsockname()[1]
        assert not port_is_free(port, "::1")
    assert port_is_free(port, "::1")


@pytest.mark.parametrize(
    "host,why",
    [
        # socket.gaierror "Name or service not known" (a traceback, rc 1)
        ("127.0.0.1; touch /tmp/x", r"server\.host = '127\.0\.0\.1; touch /tmp/x': does not resolve to an address"),
        # EADDRNOTAVAIL read as a port held: "port 8765 on 192.0.2.1 is held by a process this deploy did not start"
        ("192.0.2.1", r"server\.host = '192\.0\.2\.1': not an address of this machine \(.*\); set it to an address"),
    ],
)
def test_a_host_this_machine_cannot_listen_on_is_one_line_not_a_port_held(params, tmp_path, host, why):
    params["server"]["host"] = host
    with pytest.raises(KernelcampError, match=why) as e:
        deploy(params, tmp_path)
    assert "\n" not in str(e.value) and "held" not in str(e.value)
    assert not (tmp_path / ".kernelcamp" / "server.json").exists()


@pytest.mark.skipif(not _ipv6_loopback(), reason="no IPv6 loopback here")
def test_embedded_deploy_on_ipv6_loopback(params, tmp_path):
    """`-S server.host=::1`: the server binds ::1 and the record's url brackets it."""
    params["server"]["host"] = "::1"
    rec = deploy(params, tmp_path)
    assert rec["url"] == f"http://[::1]:{params['server']['port']}" and rec["hash_verified"], rec
    assert not port_is_free(params["server"]["port"], "::1")
    assert stop_embedded(tmp_path)


def test_a_deploy_the_server_would_refuse_leaves_the_running_server_alone(params, tmp_path, monkeypatch):
    """`-S server.device=bogus` and `-S "server.args=['--workers=4']"` failed only when the new server refused
    them, after the deploy had stopped the good one. What `kernelcamp serve` would refuse is checked first
    (kernelcamp.serve.options, the spec stage's check too), and what only this machine can say (a GPU it lacks,
    an empty $KERNELCAMP_API_KEY) before the running server is stopped."""
    from kernelcamp.serve.client import API_KEY_ENV

    rec = deploy(params, tmp_path)
    rows = [
        ({"device": "bogus"}, r"server\.device = 'bogus': expected cpu, cuda or cuda:N"),
        ({"args": ["--workers=4"]}, r"server\.args = \['--workers=4'\]: kernelcamp serve would refuse them"),
        ({"host": "192.0.2.1"}, r"server\.host = '192\.0\.2\.1': not an address of this machine"),
        ({"device": "cuda:97"}, r"server\.device = 'cuda:97': (no CUDA GPU here|this machine has \d+ CUDA GPU)"),
    ]
    for change, msg in rows:
        bad = copy.deepcopy(params)
        bad["server"].update(change)
        with pytest.raises(KernelcampError, match=msg) as e:
            deploy(bad, tmp_path)
        assert "\n" not in str(e.value)
        assert _alive(rec["pid"]), f"{change}: the running server was stopped"
    changed = copy.deepcopy(params)
    changed["server"]["max_running_requests"] = 2  # a restart, not a reuse
    monkeypatch.setenv(API_KEY_ENV, " ")
    with pytest.raises(KernelcampError, match=f"{API_KEY_ENV}: empty or with surrounding spaces"):
        deploy(changed, tmp_path)
    assert _alive(rec["pid"])
    monkeypatch.delenv(API_KEY_ENV)
    assert deploy(params, tmp_path)["reused"]


def test_never_ready_server_times_out_and_leaves_nothing(params, tmp_path):
    params["server"]["args"] = ["--never-ready"]
    params["deploy"]["health_timeout_s"] = 2
    t0 = time.monotonic()
    with pytest.raises(KernelcampError, match="not ready after 2 s") as e:
        deploy(params, tmp_path)
    assert "\n" not in str(e.value)
    assert time.monotonic() - t0 < 40
    assert not (tmp_path / ".kernelcamp" / "server.json").exists()
    assert not _procs_mentioning(str(tmp_path))
    assert port_is_free(params["server"]["port"])


def test_command_target_launch_reuse_stop(params, tmp_path):
    port = free_port()
    params["deploy"] = {
        "kind": "command",
        "url": f"http://127.0.0.1:{port}",
        "kernel_dest": str(tmp_path / "srv" / "kernel.py"),
        "launch": f"exec {sys.executable} -m kernelcamp.cli serve --fake variant_hash=$KERNELCAMP_VARIANT_HASH "
        f"--port {port} --log-level error  # {tmp_path}",
        "stop": None,
        "health_timeout_s": 60,
        "poll_interval_s": 0.2,
    }
    rec = deploy(params, tmp_path)
    assert rec["hash_verified"] and rec["checksums_match"] and not rec["reused"]
    assert rec["log"] == ".kernelcamp/command.log"
    assert (
        Path(params["deploy"]["kernel_dest"]).read_bytes() == (ROOT / "kernels" / "sparse_mla_decode.py").read_bytes()
    )
    assert deploy(params, tmp_path)["reused"]
    assert stop_command(tmp_path)
    assert port_is_free(port)


@pytest.mark.parametrize("recorded_start", ["other", "none"])
def test_a_stale_command_state_never_stops_a_stranger(tmp_path: Path, recorded_start: str) -> None:
    """command.json named a pid that now belongs to an unrelated process (the server died, the pid was
    reused): stop_command killed that process's group. With the start time recorded it is left alone.
    A state without one (written before start times were kept) names a live group; it is stopped, as
    before."""
    victim = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True, stdout=subprocess.DEVNULL
    )
    try:
        from kernelcamp.io import pid_start_time

        st = {"pid": victim.pid, "pgid": victim.pid}
        if recorded_start == "other":
            st["start_time"] = pid_start_time(victim.pid) - 1
        (tmp_path / ".kernelcamp").mkdir()
        (tmp_path / ".kernelcamp" / "command.json").write_text(json.dumps(st))
        stopped = stop_command(tmp_path)
        time.sleep(0.2)
        assert (victim.poll() is None) == (recorded_start == "other")
        assert stopped == (recorded_start == "none")
        assert not (tmp_path / ".kernelcamp" / "command.json").exists()
    finally:
        victim.kill()
        victim.wait()


def test_a_stale_embedded_state_never_stops_another_kernelcamp_process(tmp_path: Path) -> None:
    """The embedded state's check (alive, 'kernelcamp' in its command line) took any kernelcamp process
    given the dead server's pid for the server; its start time now tells them apart."""
    from kernelcamp.deploy.common import stop_state
    from kernelcamp.io import pid_start_time

    other = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)", "kernelcamp"], start_new_session=True
    )
    try:
        path = tmp_path / "server.json"
        path.write_text(json.dumps({"pid": other.pid, "pgid": other.pid, "start_time": pid_start_time(other.pid) + 1}))
        assert not stop_state(path, wait_port=False)
        assert other.poll() is None and not path.exists()
    finally:
        other.kill()
        other.wait()


class LocalRunner:
    """A fake remote: runs commands with bash locally; ``corrupt`` flips the copy of one file."""

    def __init__(self, corrupt: str | None = None):
        self.corrupt = corrupt

    def run(self, cmd):
        return subprocess.run(["bash", "-c", cmd], capture_output=True, text=True)

    def put(self, local, remote):
        shutil.copyfile(local, remote)
        if self.corrupt and remote.endswith(self.corrupt):
            with open(remote, "ab") as f:
                f.write(b"# tampered\n")
        return subprocess.CompletedProcess([], 0, "", "")


def test_checksum_mismatch_with_fake_remote(params, tmp_path):
    params["deploy"] = {
        "kind": "ssh",
        "host": "fake",
        "remote_dir": str(tmp_path / "remote"),
        "restart": "true",
        "url": "http://127.0.0.1:9",
        "health_timeout_s": 1,
    }
    with pytest.raises(KernelcampError, match="checksum mismatch for sparse_mla_decode.py"):
        deploy_ssh(params, tmp_path, runner=LocalRunner(corrupt="sparse_mla_decode.py"))
    sums = remote_sha256(LocalRunner(), str(tmp_path / "remote"), ["variant.json"])
    assert len(sums["variant.json"]) == 64
    with pytest.raises(KernelcampError, match="missing"):
        compare_checksums({"a": "1" * 64}, {})


needs_sshd = pytest.mark.skipif(
    not LoopbackSshd.available(), reason="no /usr/sbin/sshd (apt-get install openssh-server)"
)


def _ssh_params(params, tmp_path, sshd, port):
    params["deploy"] = {
        "kind": "ssh",
        "host": "127.0.0.1",
        "port": sshd.port,
        "user": sshd.user,
        "identity_file": sshd.identity_file,
        "ssh_options": sshd.options,
        "remote_dir": str(tmp_path / "remote"),
        "url": f"http://127.0.0.1:{port}",
        "restart": f"PYTHONPATH={ROOT} setsid nohup {sys.executable} -m kernelcamp.cli serve --fake "
        f"variant_hash=$KERNELCAMP_VARIANT_HASH --port {port} --log-level error > server.log 2>&1 "
        "< /dev/null &",
        "health_timeout_s": 60,
        "poll_interval_s": 0.2,
    }
    return params


def _stop_port(port):
    try:
        pid = httpx.get(f"http://127.0.0.1:{port}/v1/kernelcamp/info", timeout=5).json()["pid"]
    except httpx.HTTPError:
        return
    kill_group(pid, None, grace_s=5)


@needs_sshd
def test_ssh_deploy_over_loopback_sshd(params, tmp_path):
    port = free_port()
    with LoopbackSshd(str(tmp_path / "sshd")) as sshd:
        p = _ssh_params(params, tmp_path, sshd, port)
        try:
            rec = deploy(p, tmp_path)
            assert rec["checksums_match"] and rec["hash_verified"] and not rec["reused"]
            assert {f["path"] for f in rec["files"]} == {"sparse_mla_decode.py", "variant.json"}
            assert all(len(f["sha256_remote"]) == 64 for f in rec["files"])
            assert deploy(p, tmp_path)["reused"]
        finally:
            _stop_port(port)
    assert port_is_free(port)


@needs_sshd
def test_ssh_checksum_mismatch_over_loopback_sshd(params, tmp_path, monkeypatch):
    from kernelcamp.deploy import ssh as dep

    real_put = dep.SshRunner.put

    def tampering_put(self, local, remote):
        r = real_put(self, local, remote)
        if remote.endswith("sparse_mla_decode.py"):  # the remote copy changes after the transfer
            with open(remote, "ab") as f:
                f.write(b"# tampered\n")
        return r

    monkeypatch.setattr(dep.SshRunner, "put", tampering_put)
    port = free_port()
    with LoopbackSshd(str(tmp_path / "sshd")) as sshd:
        with pytest.raises(KernelcampError, match="checksum mismatch for sparse_mla_decode.py"):
            deploy(_ssh_params(params, tmp_path, sshd, port), tmp_path)
    assert port_is_free(port)  # restart never ran


def test_the_records_kernel_path_is_relative_to_the_tree_not_a_path_of_this_machine(tmp_path):
    from kernelcamp.deploy.common import kernel_file
    from kernelcamp.hashes import kernel_module_path, project_root

    kpath = kernel_module_path({"module": "kernels.sparse_mla_decode"})
    entry = kernel_file(kpath, "a" * 64, None, dest="/srv/k.py")
    assert entry == {
        "path": "kernels/sparse_mla_decode.py",
        "dest": "/srv/k.py",
        "sha256_local": "a" * 64,
        "sha256_remote": None,
    }
    assert str(project_root()) not in json.dumps(entry)
    outside = tmp_path / "k.py"  # a file outside the tree keeps its path (nothing to be relative to)
    assert kernel_file(outside, "b", "b")["path"] == outside.as_posix()
