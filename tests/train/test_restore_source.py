"""Who restores a job's state from disk when no member holds it live: the
member whose disk has the newest checkpoint (its agent may have fetched the
job's carried one), so a replacement that joined with the job's state on
disk is not overruled by a rank 0 with an older one, or with none."""

from __future__ import annotations

from shoal.spec.elastic import MembershipEpoch, WorkerArrival
from shoal.train.membership import _plan_transfer


def plan(arrivals: list[WorkerArrival], rank: int, epoch: int = 3):
    record = MembershipEpoch(epoch=epoch, members=tuple(a.worker for a in arrivals),
                             weights=tuple(1.0 for _ in arrivals), reason="join")
    loads: list[int] = []

    def load() -> bool:
        loads.append(rank)
        return True

    return _plan_transfer(record, arrivals, rank, load), loads


def arrival(worker: str, disk_step: int | None, has_state: bool = False, step: int = 0):
    return WorkerArrival(worker=worker, step=step, has_state=has_state, disk_step=disk_step)


def test_the_member_with_the_newest_checkpoint_restores_for_all():
    arrivals = [arrival("old", 20), arrival("joiner", 60), arrival("bare", None)]
    for rank in range(3):
        (source, needers), loads = plan(arrivals, rank)
        assert (source, needers) == (1, [0, 2])
        assert loads == ([1] if rank == 1 else [])  # only the source reads its disk


def test_with_no_checkpoint_anywhere_rank_0_keeps_its_initialization_for_all():
    (source, needers), loads = plan([arrival("a", None), arrival("b", None)], 0, epoch=0)
    assert (source, needers, loads) == (0, [1], [0])


def test_live_state_beats_any_checkpoint():
    arrivals = [arrival("holder", 10, has_state=True, step=70), arrival("joiner", 60)]
    (source, needers), loads = plan(arrivals, 1)
    assert (source, needers, loads) == (0, [1], [])


def test_the_authoritys_state_holder_sends_whatever_another_member_claims():
    """Issue 40, point 6: a member that claims to be further than its peers became the
    state source of every epoch it joined. Now the authority names the holder (a member
    that held the job's state through every epoch since the last decided step), and a
    claim only decides whether its claimant receives."""
    arrivals = [arrival("joiner", None), arrival("veteran", None, has_state=True, step=40),
                arrival("liar", None, has_state=True, step=99),
                arrival("peer", None, has_state=True, step=40)]
    record = MembershipEpoch(epoch=5, members=tuple(a.worker for a in arrivals),
                             weights=(1.0,) * 4, reason="join", state_holder="veteran")
    assert _plan_transfer(record, arrivals, 0, lambda: True) == (1, [0, 2])
    # Without a holder (the start, a restore) the claims still decide.
    (source, needers), _ = plan(arrivals, 0)
    assert (source, needers) == (2, [0, 1, 3])
