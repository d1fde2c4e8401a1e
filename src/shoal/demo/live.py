"""The demo's live terminal view (rich): step, loss, throughput, membership,
faults and their recovery, spend and escrow left."""

from __future__ import annotations

import time

from rich.console import Group
from rich.panel import Panel
from rich.table import Table

from shoal.demo.runner import Demo
from shoal.spec.coordinator import MAX_PAGE
from shoal.spec.events import EventKind

MARKS = (EventKind.worker_slashed, EventKind.offer_withdrawn, EventKind.verdict_rejected)


def render(demo: Demo) -> Panel:
    s = demo.state
    head = Table.grid(padding=(0, 2))
    head.add_column(style="bold")
    head.add_column()
    head.add_row("phase", s.phase)
    if demo.served is not None:
        head.add_row("coordinator", demo.served.url + (
            "  (dashboard: " + demo.served.url + "/dashboard)" if demo.options.dashboard else ""))
    parts = [head]
    if s.job_id and demo.coordinator is not None:
        co = demo.coordinator
        progress = co.progress.steps(s.job_id, after=-1)[-40:] if s.phase != "done" else []
        job = co.reads.job(s.job_id)
        members = co.progress.membership(s.job_id)
        if progress:
            last = progress[-1]
            span = progress[-1].t - progress[0].t
            rate = sum(p.samples for p in progress[1:]) / span if span > 0 else 0.0
            head.add_row("step", f"{last.step + 1}  loss {last.loss:.3f}" if last.loss is not None
                         else str(last.step + 1))
            head.add_row("throughput", f"{rate:.1f} samples/s, world {last.world}")
        if members:
            head.add_row("members", ", ".join(members[-1].members) + f"  (epoch {members[-1].epoch})")
        head.add_row("spend", f"{job.spent_wei / 1e18:.6f} ETH of {job.budget_wei / 1e18:.4f} "
                              f"(escrow left {job.remaining_wei / 1e18:.6f})")
        faults = Table("t", "fault", "provider", "recovery", title="scenario",
                       title_justify="left")
        commits = [p.t for p in co.progress.steps(s.job_id, after=max(-1, s.committed - 400))]
        for fired in s.fired:
            at = fired.t - (s.started_t or fired.t)
            # Live, the time until the job committed again; the report's RTO (back to 90%
            # of the steady pace) is measured from the step logs at the end.
            after = [t for t in commits if t > fired.t]
            resumed = f"steps again after {after[0] - fired.t:.2f} s" if after else "…"
            faults.add_row(f"{at:.0f} s", fired.event.kind.value, fired.event.provider, resumed)
        while page := co.reads.events(s.job_id, after=s.marks_after, limit=MAX_PAGE):
            s.marks_after = page[-1].seq
            s.marks += [e for e in page if e.kind in MARKS]
        for e in s.marks:
            at = e.at_s - (s.started_t or e.at_s)
            faults.add_row(f"{at:.0f} s", e.kind.replace("_", " "),
                           str(e.detail.get("offer_id") or e.detail.get("provider") or ""), "")
        parts.append(faults)
    return Panel(Group(*parts), title="shoal demo", subtitle=time.strftime("%H:%M:%S"))
