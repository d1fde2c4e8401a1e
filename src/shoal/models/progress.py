"""Live progress of a training run: a bar on a terminal, log lines otherwise."""

from __future__ import annotations

import logging

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

log = logging.getLogger(__name__)


class TrainProgress:
    """Shows step, loss, tokens/s and ETA. Use as a context manager."""

    def __init__(self, total_steps: int, start_step: int, enabled: bool = True) -> None:
        self.total = total_steps
        self.console = Console(stderr=True)
        self.live = enabled and self.console.is_terminal
        # Without a terminal, a line every 5% of the run keeps CI logs short.
        self.log_every = max(1, total_steps // 20)
        self._bar = Progress(
            TextColumn("[bold]step"),
            MofNCompleteColumn(),
            BarColumn(),
            TextColumn("loss {task.fields[loss]}"),
            TextColumn("{task.fields[rate]} tok/s"),
            TextColumn("val {task.fields[val]}"),
            TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            console=self.console,
            disable=not self.live,
        )
        self._task = self._bar.add_task(
            "train", total=total_steps, completed=start_step, loss="-", rate="-", val="-"
        )
        self._val = "-"

    def __enter__(self) -> TrainProgress:
        self._bar.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._bar.__exit__(*exc)

    def step(self, step: int, loss: float, tokens_per_s: float) -> None:
        self._bar.update(self._task, completed=step, loss=f"{loss:.3f}",
                         rate=f"{tokens_per_s:,.0f}", val=self._val)
        if not self.live and (step % self.log_every == 0 or step == self.total):
            log.info("step %d/%d loss %.4f %.0f tok/s", step, self.total, loss, tokens_per_s)

    def evaluated(self, step: int, val_loss: float) -> None:
        self._val = f"{val_loss:.3f}"
        self._bar.update(self._task, val=self._val)
        message = f"step {step}: validation loss {val_loss:.4f} nats/byte"
        if self.live:
            self._bar.console.print(message)
        else:
            log.info(message)

