"""The launcher's own duties: the store it hosts listens where it is told and
is gone after the run, no thread outlives `run()`, and SIGTERM becomes a
graceful leave with a bounded grace (workers never outliving a killed
launcher: test_preload.py, for executed and forked workers alike)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from shoal.errors import ControlError
from shoal.elastic.launcher import LaunchConfig, Launcher
from shoal.elastic.netaddr import interface_of, parse_endpoint
from shoal.elastic.serve import RendezvousServer
from shoal.train.run_config import RunSettings, WorkerOverrides
from tests.conftest import REPO, shoal_command

SCRIPTS = Path(__file__).parent / "scripts"


def refused(host: str, port: int) -> bool:
    try:
        socket.create_connection((host, port), timeout=1).close()
        return False
    except ConnectionRefusedError:
        return True


def gone(pid: int, within_s: float = 5.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        try:  # a zombie (dead, not yet reaped by init) is gone too
            if Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z":
                return True
        except FileNotFoundError:
            return True
        time.sleep(0.05)
    return False


def test_the_store_listens_only_where_it_is_bound_and_closes_with_the_server():
    server = RendezvousServer("127.0.0.1")  # port 0: the socket picks a free one
    port = server.port
    assert port > 0 and not refused("127.0.0.1", port)
    assert refused("127.0.0.2", port)  # same machine, another address: not listening there
    server.close()
    assert refused("127.0.0.1", port)


def test_a_taken_port_is_a_clear_error():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        with pytest.raises(ControlError, match="cannot serve the rendezvous on 127.0.0.1"):
            RendezvousServer("127.0.0.1", taken.getsockname()[1])


def test_a_run_leaves_no_thread_and_no_store_behind(tmp_path):
    baseline = threading.active_count()
    config = LaunchConfig(command=[sys.executable, str(SCRIPTS / "done_worker.py")], workers=2,
                          run_dir=tmp_path / "run", timeout_s=60)
    launcher = Launcher(config)
    port = launcher.server.port
    launcher.run()
    assert threading.active_count() == baseline, [t.name for t in threading.enumerate()]
    assert refused("127.0.0.1", port)


@pytest.mark.parametrize("fields, message", [
    ({"serve": True}, "need --rendezvous"),
    ({"node": "a"}, "need --rendezvous"),
    ({"rendezvous": "nohost"}, "is not HOST:PORT"),
    ({"rendezvous": "h:70000"}, "is not HOST:PORT"),
    ({"rendezvous": "h:1", "min_workers": 3}, "for the serving host"),
    ({"workers": 0}, "at least 1"),
    ({"env": {"SHOAL_SLOWDOWN": "3"}}, "SHOAL_SLOWDOWN: a run's settings go in"),
    ({"worker_env": {1: {"SHOAL_ADVERSARY": "zero"}}}, "SHOAL_ADVERSARY: a run's settings go in"),
])
def test_config_refuses_what_cannot_work(tmp_path, fields, message):
    with pytest.raises(ControlError, match=message):
        LaunchConfig(**{"command": ["true"], "workers": 1, "run_dir": tmp_path, **fields})


def test_each_worker_runs_with_the_runs_settings_and_its_own_overrides(tmp_path, monkeypatch):
    monkeypatch.setenv("SHOAL_ADVERSARY", "zero")  # the launcher's environment: not a worker's setting
    config = LaunchConfig(command=[sys.executable, str(SCRIPTS / "settings_worker.py")], workers=2,
                          run_dir=tmp_path / "run", timeout_s=60,
                          settings=RunSettings(checkpoint_interval=7, inject="exchange-delay:0.1"),
                          overrides={1: WorkerOverrides(slowdown=3.0, adversary="sign_flip")})
    Launcher(config).run()
    w0, w1 = (json.loads((tmp_path / "run" / f"w{i}.json").read_text()) for i in range(2))
    assert (w0["slowdown"], w0["adversary"]) == (1.0, None)
    assert (w1["slowdown"], w1["adversary"]) == (3.0, "sign_flip")
    assert w0["checkpoint_interval"] == w1["checkpoint_interval"] == 7
    assert w0["inject"] == w1["inject"] == "exchange-delay:0.1"


def test_addresses():
    assert parse_endpoint("10.0.0.1:29400") == ("10.0.0.1", 29400)
    assert parse_endpoint("[::1]:5") == ("::1", 5)
    assert interface_of("127.0.0.1") == "lo"
    assert interface_of("203.0.113.77") is None  # TEST-NET-3: on no interface here


def test_sigterm_asks_workers_to_leave_then_kills_the_stubborn(tmp_path, cli_env):
    marks = tmp_path / "marks"
    marks.mkdir()
    launcher = subprocess.Popen(
        shoal_command("run", str(SCRIPTS / "term_worker.py"), "--workers", "2", "--grace-s", "2",
                      "--run-dir", str(tmp_path / "run")),
        env={**cli_env, "MARKS": str(marks)}, stderr=subprocess.PIPE, text=True, cwd=REPO)
    deadline = time.monotonic() + 30
    while not all((marks / f"up-{r}").exists() for r in "01") and time.monotonic() < deadline:
        time.sleep(0.05)
    pids = [int((marks / f"up-{r}").read_text()) for r in "01"]
    launcher.send_signal(signal.SIGTERM)
    _, stderr = launcher.communicate(timeout=20)
    assert launcher.returncode == 2
    assert "stopped by SIGTERM: 1 worker(s) handed over and left, 1 killed after the 2 s grace" in stderr
    # The first worker is asked last, so that it is the one left to write the last checkpoint.
    assert float((marks / "term-1").read_text()) < float((marks / "term-0").read_text())
    assert all(gone(pid) for pid in pids)


@pytest.mark.slow
def test_sigterm_on_a_real_run_leaves_the_last_checkpoint(tmp_path, cli_env):
    launcher = subprocess.Popen(
        shoal_command("run", "examples/elastic_mlp.py", "--workers", "2", "--run-dir", str(tmp_path / "run"),
                      "--checkpoint-dir", str(tmp_path / "ckpt"), "--", "--steps", "100000"),
        env=cli_env, stderr=subprocess.PIPE, text=True, cwd=REPO)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # until both train
        logs = list((tmp_path / "run").glob("steps-w*.jsonl"))
        if len(logs) == 2 and all(p.stat().st_size for p in logs):
            break
        time.sleep(0.1)
    launcher.send_signal(signal.SIGTERM)
    _, stderr = launcher.communicate(timeout=60)
    assert launcher.returncode == 2, stderr
    assert "stopped by SIGTERM: 2 worker(s) handed over and left, 0 killed" in stderr
    assert "last worker leaving: checkpoint of step" in (tmp_path / "run" / "w0.log").read_text()
    assert list((tmp_path / "ckpt").glob("step-*.safetensors"))


@pytest.mark.parametrize("flags, message", [
    (["--serve"], "--serve and --node need --rendezvous HOST:PORT"),
    (["--rendezvous", "10.0.0.1"], "is not HOST:PORT"),
    (["--rendezvous", "127.0.0.1:1", "--report", "r.json"], "--report is written by the serving host"),
])
def test_cli_multi_host_mistakes_are_one_line(tmp_path, cli_env, flags, message):
    done = subprocess.run(shoal_command("run", "examples/elastic_mlp.py", "--workers", "1",
                                        "--run-dir", str(tmp_path / "run"), *flags),
                          env=cli_env, capture_output=True, text=True, cwd=REPO, timeout=60)
    assert done.returncode == 2 and message in done.stderr and "Traceback" not in done.stderr


def test_a_spare_starts_at_low_priority_and_a_called_in_one_gets_full_priority(tmp_path):
    """A spare's start-up must not slow the job on a shared machine; once it is a member
    it must not be the slow one."""
    from shoal.elastic.worker_process import WorkerProcess

    command = [sys.executable, "-c", "import threading, time; "
               "threading.Thread(target=time.sleep, args=(30,)).start(); time.sleep(30)"]
    spare = WorkerProcess("s", command, dict(os.environ), tmp_path / "s.log", lambda w: None,
                          niceness=10)
    try:
        time.sleep(0.5)
        tasks = os.listdir(f"/proc/{spare.pid}/task")
        assert len(tasks) == 2
        assert {os.getpriority(os.PRIO_PROCESS, int(t)) for t in tasks} == {10}
        spare.renice(0)
        assert {os.getpriority(os.PRIO_PROCESS, int(t)) for t in tasks} == {0}
    finally:
        spare.kill()


@pytest.mark.parametrize("exits_after_s, status, done", [
    (1.0, 0, True), (0.0, 3, False), (60.0, 0, False)], ids=["finished", "failed", "cut-off"])
def test_a_store_closed_as_this_hosts_workers_finish_is_the_jobs_end(tmp_path, exits_after_s,
                                                                     status, done):
    # The serving host may close the store the moment the job is done (`--linger-s 0`), while
    # a joined launcher's workers, done too, are still exiting (a gate bench run failed so):
    # they exit 0 within a moment, and the job is done. A failed worker, or one still running
    # (cut off mid-step by a host that crashed), leaves the lost store an error.
    host = RendezvousServer("127.0.0.1")
    script = f"import time; time.sleep({exits_after_s}); raise SystemExit({status})"
    config = LaunchConfig(command=[sys.executable, "-c", script], workers=1,
                          run_dir=tmp_path / "run", timeout_s=60,
                          rendezvous=f"127.0.0.1:{host.port}", node="joined")
    launcher = Launcher(config)
    try:
        launcher.pool.start()
        host.close()
        if done:
            assert launcher._job_done() is True
        else:
            with pytest.raises(ControlError, match="lost the rendezvous store"):
                launcher._job_done()
    finally:
        launcher.pool.kill_all()
        launcher._close_rendezvous()
