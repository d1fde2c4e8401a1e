"""Learning-rate schedulers, and whatever else of the user's keeps state across steps,
held by the run (issue 41).

A scheduler a user's loop steps itself is stepped once per batch its worker saw:
twice on a worker given two micro-batches, never on one given an empty share, and
from zero on a joiner. Members then follow different schedules, and once ranks
change the job follows none of them. So the run steps each scheduler it was given
once per committed step, on every member alike, and carries its state with the
model's: a joiner receives it, a checkpoint keeps it. The loop's own
`scheduler.step()` line is left in place and does nothing.

A scheduler built on the run's optimizer and *not* given to it is found at the
first step (torch marks the optimizer's `step` it wraps) and refused, with what
to write instead: running it silently is how a job ran at 0.77x its schedule.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from shoal.train.errors import TrainError

# torch's LRScheduler wraps its optimizer's `step` to notice a scheduler stepped first;
# the wrapper carries this mark (torch.optim.lr_scheduler.patch_track_step_called).
_WRAPPED_BY_SCHEDULER = "_wrapped_by_lr_sched"


def _the_run_steps_it(*_: Any, **__: Any) -> None:
    """A scheduler the run holds: the loop's own call does nothing."""


class HeldState:
    """The user's objects the run steps at each commit and carries with the replica:
    an extra of ReplicaState (state_dict / load_state_dict)."""

    def __init__(self) -> None:
        self._steps: list[Callable[[], Any]] = []
        self._holders: dict[str, Any] = {}

    def schedule(self, scheduler: Any) -> None:
        """Step `scheduler` once per committed step from now on; carry its state."""
        if not callable(getattr(scheduler, "step", None)) or not hasattr(scheduler,
                                                                         "state_dict"):
            raise TrainError(f"{type(scheduler).__name__} is not a scheduler (it needs step() "
                             "and state_dict()); give run.keep(name, obj) an object whose "
                             "state should travel with the model")
        if any(held is scheduler for held in self._holders.values()):
            return
        self._steps.append(scheduler.step)  # the bound method, before the loop's is muted
        scheduler.step = _the_run_steps_it
        self._holders[f"scheduler{len(self._steps) - 1}"] = scheduler

    def keep(self, name: str, holder: Any) -> None:
        """Carry `holder`'s state (state_dict / load_state_dict) with the replica."""
        if not (callable(getattr(holder, "state_dict", None))
                and callable(getattr(holder, "load_state_dict", None))):
            raise TrainError(f"run.keep({name!r}, ...): a {type(holder).__name__} has no "
                             "state_dict() and load_state_dict(); nothing to carry")
        if name in self._holders or name.startswith("scheduler"):
            raise TrainError(f"run.keep({name!r}, ...): that name is taken; give another")
        self._holders[name] = holder

    def committed(self) -> None:
        for step in self._steps:
            step()

    def check_optimizer(self, *optimizers: Any) -> None:
        """Refuse a scheduler built on one of `optimizers` that the run was not given."""
        if self._steps:
            return
        for optimizer in optimizers:
            if getattr(getattr(optimizer, "step", None), _WRAPPED_BY_SCHEDULER, False):
                raise TrainError(
                    "a learning-rate scheduler is built on this run's optimizer but the run "
                    "was not given it: pass it as run.wrap(model, optimizer, scheduler=s), or "
                    "run.schedule(s) once built (keep the loop's scheduler.step(): it then "
                    "does nothing). Stepped by the loop, each worker follows its own "
                    "schedule and a joiner's starts from zero")

    def state_dict(self) -> dict[str, Any]:
        return {name: _without_step(holder.state_dict())
                for name, holder in self._holders.items()}

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        if state is None:
            return
        for name, holder in self._holders.items():
            if name not in state:
                raise TrainError(f"the state received holds no {name!r}: every worker must "
                                 "give the run the same schedulers and run.keep objects")
            holder.load_state_dict(state[name])


def _without_step(state: Any) -> Any:
    """A scheduler's state_dict() is its __dict__: the muted `step` is not state."""
    if isinstance(state, dict) and state.get("step") is _the_run_steps_it:
        return {k: v for k, v in state.items() if k != "step"}
    return state
