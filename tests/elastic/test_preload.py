"""Workers forked from the preloaded fork server (shoal.elastic.preload) start
as the program `python SCRIPT ARGS` would: its own argv, environment, thread
count, working directory, process group and exit status, its errors in its log;
and they die with a SIGKILLed launcher like executed ones."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from shoal.elastic import preload
from shoal.elastic.worker_process import WorkerProcess
from tests.conftest import REPO
from tests.elastic.test_launcher import gone

SCRIPTS = Path(__file__).parent / "scripts"


def started(tmp_path: Path, command: list[str], **kwargs) -> tuple[int, dict, str]:
    log = tmp_path / "w.log"
    worker = WorkerProcess("w0", command, {"PROBE": "mine", "OMP_NUM_THREADS": "3"}, log,
                           on_exit=lambda w: None, preloaded=True, **kwargs)
    assert isinstance(worker.process, preload.ForkedWorker)
    assert worker.wait(60)
    worker.join_watcher(5)
    text = log.read_text()
    return worker.process.returncode, json.loads(text.splitlines()[0]), text


def test_a_forked_script_runs_as_its_own_main_with_its_own_environment(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, seen, _ = started(tmp_path, [sys.executable, str(SCRIPTS / "as_main.py"), "3"],
                            niceness=5)
    assert code == 3
    assert seen["name"] == "__main__" and seen["argv"] == [str(SCRIPTS / "as_main.py"), "3"]
    assert seen["path0"] == str(SCRIPTS) and seen["cwd"] == str(tmp_path)
    assert seen["env"] == "mine" and seen["threads"] == 3  # torch read its threads before
    assert seen["pgid_is_pid"] and seen["nice"] == 5


def test_a_forked_module_runs_as_main_and_a_users_error_is_its_exit_status(tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)
    code, seen, log = started(tmp_path, [sys.executable, "-m", "tests.elastic.scripts.as_main",
                                         "raise"])
    assert code == 1 and seen["name"] == "__main__" and seen["path0"] == str(REPO)
    assert seen["argv"][0].endswith("as_main.py")
    # The traceback as the interpreter prints it, and nothing of multiprocessing's.
    assert "ValueError: the user's bug" in log and "Process " not in log


def test_only_this_interpreters_programs_are_forked(monkeypatch):
    assert preload.forkable([sys.executable, "train.py"])
    assert preload.forkable([sys.executable, "-m", "pkg.mod"])
    assert not preload.forkable([sys.executable, "-m"])
    assert not preload.forkable([sys.executable, "-c", "print(1)"])  # not a script or module
    assert not preload.forkable(["/usr/bin/python2", "train.py"])
    assert not preload.forkable(["sleep", "60"])
    monkeypatch.setenv("SHOAL_WORKER_START", "exec")
    assert not preload.forkable([sys.executable, "train.py"])


@pytest.mark.parametrize("how", ["exec", "fork"])
def test_workers_die_with_a_sigkilled_launcher(tmp_path, how):
    parent = subprocess.Popen([sys.executable, str(SCRIPTS / "orphan_parent.py"),
                               str(tmp_path / "w.log"), how],
                              stdout=subprocess.PIPE, text=True, cwd=REPO)
    child = int(parent.stdout.readline())
    assert not gone(child, within_s=0.2)
    parent.kill()  # no handler, no cleanup: the kernel must take the worker down
    parent.wait()
    assert gone(child), "the worker outlived its SIGKILLed launcher"
