"""When a job has ended: from the host's own reading of its members' beats and
reports, never one member's word (issue 40, points 1 and 6).

A member that writes `done` would have every honest lease paid for a fraction of
its work; one that beats "finished" early would stop every admission and never
be fenced. So the membership authority (shoal.elastic.authority) counts a
member as finished only past the job's steps, where its host knows them, and
only once its step decider has decided that many (or every member says so: all
restored the job's last step after a restart and had nothing left to vote on);
and it ends the job only when every member has finished, each past the steps a
final report names.
"""

from __future__ import annotations

import logging

from shoal.spec.elastic import Phase, ProgressBeat
from shoal.train.rendezvous import Rendezvous

log = logging.getLogger(__name__)


class JobEnd:
    def __init__(self, rdzv: Rendezvous, steps: int | None) -> None:
        """`steps`: the job's, where the host knows them (a market job's; None: a `shoal
        run`, whose launcher hosts the authority, takes its members' word)."""
        self.rdzv, self.steps = rdzv, steps

    def finished(self, members: tuple[str, ...], beats: dict[str, ProgressBeat | None],
                 decided: int | None) -> set[str]:
        """The members whose last beat says they finished the job's steps, as far as this
        host can tell (above). `decided`: the steps its decider has decided (None: it
        decides none)."""
        floor = self.steps or 0
        finished = {w for w, b in beats.items()
                    if b is not None and b.phase is Phase.finished and b.step >= floor}
        if floor and decided is not None and decided < floor and finished != set(members):
            return set()
        return finished

    def end_if_finished(self, members: tuple[str, ...], decided: int | None) -> bool:
        """Mark the job done once every member has finished, each past the steps a final
        report names: the reporter is rank 0 of the epoch if it reported, else the first
        member that did."""
        beats = self.rdzv.beats(list(members))
        if self.finished(members, beats, decided) != set(members):
            return False
        # Read now: a member writes its report before its finished beat, so every report
        # is in (rank 0's among them, the one with the figures).
        claims = self.rdzv.final_claims(members)
        for worker in [m for m in members if m in claims]:
            steps = claims[worker].get("steps")
            if not isinstance(steps, int) or isinstance(steps, bool):
                continue
            if all(b is not None and b.step >= steps for b in beats.values()):
                log.info("every member finished step %d: the job is done (%s reports)",
                         steps, worker)
                self.rdzv.mark_done(worker)
                return True
        return False
