"""A user's loop as they write it (issue 41), with code nobody here wrote: a
transformers GPT-2 with `get_linear_schedule_with_warmup`, and torch's
`CosineAnnealingLR` built before `run.wrap`. Through a kill and a join the job
follows the schedule it was written with: the same final learning rate and
held-out loss as on one worker. A scheduler the run was not given, and a script
that fails, stop the run at once with the error."""

from __future__ import annotations

import json
import math
import subprocess
import textwrap
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import shoal_command

REPO = Path(__file__).resolve().parents[2]
COSINE = """
import sys
import torch
import shoal

run = shoal.join()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.9)
scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=STEPS)
if GIVEN:
    model, optimizer = run.wrap(model, optimizer, scheduler=scheduler)
else:
    model, optimizer = run.wrap(model, optimizer)
g = torch.Generator().manual_seed(1)
x = torch.randn(512, 8, generator=g)
data = torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True).sin())
for xb, yb in run.batches(data, global_batch=32, steps=STEPS):
    torch.nn.functional.mse_loss(model(xb), yb).backward()
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad()
if run.is_reporter:
    run.publish_final(lr=scheduler.get_last_lr()[0], mse=float(
        torch.nn.functional.mse_loss(model(x), x.sum(1, keepdim=True).sin())))
"""


def _run(tmp_path: Path, script: Path, workers: int, chaos: str | None, *args: str,
         env: dict[str, str]) -> tuple[subprocess.CompletedProcess, dict | None]:
    report = tmp_path / f"report-{script.stem}-{workers}.json"
    command = ["run", str(script), "--workers", str(workers), "--run-dir",
               str(tmp_path / f"run-{script.stem}-{workers}"), "--report", str(report)]
    if chaos:
        command += ["--chaos", chaos]
    done = subprocess.run(shoal_command(*command, "--", *args), env=env, capture_output=True,
                          text=True, cwd=REPO, timeout=600)
    return done, json.loads(report.read_text()) if report.exists() else None


def _script(tmp_path: Path, given: bool, steps: int) -> Path:
    path = tmp_path / f"cosine_{'given' if given else 'not_given'}.py"
    path.write_text(COSINE.replace("STEPS", str(steps)).replace("GIVEN", str(given)))
    return path


@pytest.mark.slow
def test_a_cosine_schedule_built_before_wrap_is_followed_through_a_kill_and_a_join(
        tmp_path, cli_env):
    steps = 60
    script = _script(tmp_path, True, steps)
    reports = {}
    for workers, chaos in ((3, "kill:1@step15,join@step25"), (1, None)):
        done, reports[workers] = _run(tmp_path, script, workers, chaos, env=cli_env)
        assert done.returncode == 0, done.stderr[-3000:]
    churned, alone = reports[3], reports[1]
    assert [f["kind"] for f in churned["faults"]] == ["kill", "join"]
    assert churned["samples_skipped"] == churned["samples_duplicated"] == 0
    # One schedule step per job step, on every member and on the joiner alike: where the
    # loop stepped it, the job ran at 0.77x its schedule after a kill and a join.
    assert churned["published"]["lr"] == pytest.approx(alone["published"]["lr"], abs=1e-12)
    assert alone["published"]["lr"] == pytest.approx(0.1 * (1 + math.cos(math.pi)), abs=1e-9)
    assert churned["published"]["mse"] == pytest.approx(alone["published"]["mse"], rel=1e-5)


def test_a_scheduler_the_run_was_not_given_stops_the_run_with_what_to_write(tmp_path, cli_env):
    done, _ = _run(tmp_path, _script(tmp_path, False, 20), 2, None, env=cli_env)
    assert done.returncode != 0
    # The worker's own traceback, in the launcher's error: not only in a log.
    assert "Traceback" in done.stderr and "run.schedule(s)" in done.stderr, done.stderr


def test_a_script_that_raises_at_start_stops_within_seconds_with_its_traceback(
        tmp_path, cli_env):
    script = tmp_path / "broken.py"
    script.write_text(textwrap.dedent("""
        import shoal
        run = shoal.join()
        raise ValueError("the user's bug, line 4")
        """))
    done, _ = _run(tmp_path, script, 2, None, env=cli_env)
    assert done.returncode != 0
    assert "ValueError: the user's bug, line 4" in done.stderr, done.stderr


def _phrase_shards(folder: Path) -> str:
    """Three shards of token ids made of 40 repeated phrases (a corpus one can learn)."""
    rng = np.random.default_rng(0)
    phrases = [rng.integers(0, 50257, size=12, dtype=np.uint16) for _ in range(40)]
    for i in range(3):
        np.concatenate([phrases[j] for j in rng.integers(0, 40, size=400)]).tofile(
            folder / f"train-{i:03d}.bin")
    return str(folder / "train-*.bin")


TRANSFORMERS = REPO / "examples" / "market-transformers" / "train.py"


@pytest.mark.slow
def test_a_transformers_gpt2_loop_with_its_scheduler_through_a_kill_and_a_join(
        tmp_path, cli_env):
    pytest.importorskip("transformers")
    args = ("--data", _phrase_shards(tmp_path), "--steps", "60", "--warmup", "10")
    reports = {}
    for workers, chaos in ((2, "kill:1@step20,join@step30"), (1, None)):
        done, reports[workers] = _run(tmp_path, TRANSFORMERS, workers, chaos, *args,
                                      env=cli_env)
        assert done.returncode == 0, done.stderr[-3000:]
    churned, alone = reports[2], reports[1]
    assert [f["kind"] for f in churned["faults"]] == ["kill", "join"]
    assert churned["published"]["lr"] == alone["published"]["lr"] == 0.0  # linear to zero
    assert churned["val_loss"] == pytest.approx(alone["val_loss"], abs=1e-4)
    assert churned["val_loss"] < 9.0  # it learned the phrases (ln 50257 = 10.8 at start)


@pytest.mark.slow
def test_gradient_accumulation_and_bf16_autocast_in_a_transformers_loop(tmp_path, cli_env):
    """Accumulation is the run's micro-batches (an unmodified loop gets the global mean,
    whatever the world), and a bfloat16 autocast forward trains as on one worker."""
    pytest.importorskip("transformers")
    data = _phrase_shards(tmp_path)
    base = ("--data", data, "--steps", "40", "--warmup", "5")
    losses = {}
    for name, workers, extra in (("whole", 1, ()), ("micro", 3, ("--micro-batch", "3")),
                                 ("bf16-one", 1, ("--bf16",)), ("bf16", 2, ("--bf16",))):
        run_dir = tmp_path / name
        run_dir.mkdir()
        done, report = _run(run_dir, TRANSFORMERS, workers, None, *base, *extra, env=cli_env)
        assert done.returncode == 0, done.stderr[-3000:]
        losses[name] = report["val_loss"]
    # float32 sums in another order: equal to float rounding.
    assert losses["micro"] == pytest.approx(losses["whole"], abs=1e-4)
    # bfloat16's own rounding differs with the split; the loss it reaches does not.
    assert losses["bf16"] == pytest.approx(losses["bf16-one"], abs=0.02)
    assert losses["bf16"] == pytest.approx(losses["whole"], abs=0.1)


CRASHES = """
import os
import torch
import shoal

run = shoal.join()
torch.manual_seed(0)
model = torch.nn.Linear(8, 1)
model, optimizer = run.wrap(model, torch.optim.SGD(model.parameters(), lr=0.05))
g = torch.Generator().manual_seed(1)
x = torch.randn(256, 8, generator=g)
data = torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True))
for xb, yb in run.batches(data, global_batch=16, steps=40):
    if run.step_index == 12 and run.worker in CRASH:
        os._exit(3)  # the process dies at once, as a segfault or an OOM kill would
    torch.nn.functional.mse_loss(model(xb), yb).backward()
    optimizer.step()
if run.is_reporter:
    run.publish_final(mse=float(torch.nn.functional.mse_loss(model(x), x.sum(1, keepdim=True))))
"""


@pytest.mark.slow
def test_a_worker_that_dies_unasked_is_in_the_report_and_replaced(tmp_path, cli_env):
    script = tmp_path / "crashes.py"
    script.write_text(CRASHES.replace("CRASH", "('w1',)"))
    done, churned = _run(tmp_path, script, 2, None, env=cli_env)
    assert done.returncode == 0, done.stderr[-3000:]
    # The exit is a fault of the run's like an injected one, and a new worker (w2) joined
    # in its place (torchrun's --max-restarts, without restarting anyone else).
    assert [(f["kind"], f["worker"]) for f in churned["faults"]] == [("exit", "w1"),
                                                                     ("join", "w2")]
    assert churned["faults"][0]["steps_lost"] == 0
    assert churned["samples_skipped"] == churned["samples_duplicated"] == 0
    alone_script = tmp_path / "alone.py"
    alone_script.write_text(CRASHES.replace("CRASH", "()"))
    done, alone = _run(tmp_path, alone_script, 1, None, env=cli_env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert churned["published"]["mse"] == pytest.approx(alone["published"]["mse"], rel=1e-5)


def test_when_every_worker_dies_the_run_stops_with_the_error(tmp_path, cli_env):
    script = tmp_path / "all_crash.py"
    # Whoever joins in a crashed one's place hits it too: restarts run out, or nobody is
    # left to join, and the run stops.
    script.write_text(CRASHES.replace("run.step_index == 12", "run.step_index >= 12").replace(
        "CRASH", "run.worker").replace(
        "os._exit(3)", "raise RuntimeError('a bug every worker hits at step 12')"))
    done, _ = _run(tmp_path, script, 2, None, env=cli_env)
    assert done.returncode != 0
    assert "RuntimeError: a bug every worker hits at step 12" in done.stderr, done.stderr


def test_rank_and_world_before_the_loop_say_when_they_are_known(tmp_path, cli_env):
    script = tmp_path / "early_world.py"
    script.write_text(textwrap.dedent("""
        import shoal
        run = shoal.join()
        per_worker = 64 // run.world  # 0 would be a ZeroDivisionError far from its cause
        """))
    done, _ = _run(tmp_path, script, 1, None, env=cli_env)
    assert done.returncode != 0
    assert "run.rank and run.world are known once run.batches" in done.stderr, done.stderr
