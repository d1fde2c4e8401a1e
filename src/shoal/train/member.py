"""This worker's membership: which epoch it is in, its group and rank, and
getting into the next epoch (asking to join, waiting as a warm spare,
forming the group and receiving state), or leaving.

Membership changes only at step boundaries; during a step the run asks
`lost_member` whether a newer epoch dropped a member that gave no notice (or
gave notice and never finished its step), which makes the step in flight moot.
"""

from __future__ import annotations

import logging
import threading
import time

from shoal.spec.elastic import MembershipEpoch, Phase
from shoal.train.errors import TrainError
from shoal.train.group import EpochGroup, GroupCancelled, GroupFailed
from shoal.train.inject import InjectedFaults
from shoal.train.live_state import state_limit
from shoal.train.liveness import ProgressReporter
from shoal.train.membership import form_epoch
from shoal.train.rendezvous import EPOCH_LOOK_S, Rendezvous, connect
from shoal.train.replica import ReplicaState
from shoal.train.run_config import RunConfig

log = logging.getLogger(__name__)

SPARE_WAIT_S = 1.0  # a waiting spare looks at the job (failed, done) this often


class Membership:
    def __init__(self, config: RunConfig, rdzv: Rendezvous, progress: ProgressReporter,
                 faults: InjectedFaults = InjectedFaults()) -> None:
        self.config, self.rdzv, self.progress = config, rdzv, progress
        self.faults = faults
        self.worker = config.worker
        self.record: MembershipEpoch | None = None
        self.group: EpochGroup | None = None
        self.rank, self.world = 0, 0
        self.leave_wanted = threading.Event()  # set by SIGTERM (a spot notice)
        self.leave_posted = False  # the authority was told; the leave lands at a step boundary
        self._awaiting_admission = False
        self._next_look = 0.0  # changed(): when the store is next asked
        self._last_call = 0.0  # changed(): when it was last called
        # (our epoch, a member that gave notice) -> when a newer epoch was first seen
        # without it while it had not exited
        self._leavers_seen: dict[tuple[int, str], float] = {}

    def post_leave(self) -> None:
        """Tell the authority before this step's exchange: the step still counts."""
        if self.leave_wanted.is_set() and not self.leave_posted:
            self.rdzv.request_leave(self.worker)
            self.leave_posted = True

    def lost_member(self, newest: MembershipEpoch) -> bool:
        """Did `newest` drop a member of ours that gave no notice (died, stalled), or one
        that gave notice and then never finished its last step?

        A member that gave notice still votes on the step in flight and exits after it,
        so its peers wait for it. One that cannot (its process died during the notice, or
        its lease ended and the job's gate cut its connections before it voted) would hold
        the step forever: once it is `collective_timeout_s` past the epoch that dropped
        it, it counts as lost and the survivors redo the step without it."""
        dropped = [m for m in self.record.members if m not in newest.members]
        if not dropped:
            return False
        gave_notice = set(self.rdzv.leaving(dropped)) - set(self.rdzv.exited(dropped))
        if any(m not in gave_notice for m in dropped):
            return True
        now = time.monotonic()
        first = min(self._leavers_seen.setdefault((self.record.epoch, m), now) for m in dropped)
        return now - first > self.config.settings.collective_timeout_s

    def changed(self) -> bool:
        """A newer epoch that loses one of our members makes the current exchange moot.

        Asked over and over while waiting on peers, so it also refreshes our progress
        point: the authority sees we can still reach the store. The store is asked at most
        every EPOCH_LOOK_S, and not before a wait has lasted that long, though a collective
        polls this every few ms."""
        self.progress.waiting()
        now = time.monotonic()
        if now - self._last_call > 4 * self.config.settings.poll_s:
            # A new wait (calls within one come every poll_s): most exchanges end within
            # EPOCH_LOOK_S, and a read of the store in their way delays noticing the end by
            # its round trip (through a gate, ~1 ms of a ~10 ms step), so a wait first asks
            # the store once it has lasted that long.
            self._next_look = max(self._next_look, now + EPOCH_LOOK_S)
        self._last_call = now
        if now < self._next_look:
            return False
        self._next_look = now + EPOCH_LOOK_S
        latest = self.rdzv.latest_epoch()
        if latest <= self.record.epoch:
            return False
        return self.lost_member(self.rdzv.epoch(latest))

    def enter(self, replica: ReplicaState) -> bool:
        """Block until this worker is in a formed epoch; False once it has left."""
        settings = self.config.settings
        while self.group is None:
            record = self._next_record(replica)
            if record is None:
                return False
            self.progress.reached(record.epoch, replica.step, Phase.arrived)
            try:
                formed = form_epoch(
                    self.rdzv, record, self.worker, step=replica.step, has_state=replica.held,
                    disk_step=replica.disk_step(),
                    backend=settings.backend, timeout_s=settings.collective_timeout_s,
                    poll_s=settings.poll_s,
                    newer=lambda epoch=record.epoch: self._newer_than(epoch),
                    live_state=replica.state_dict, load_state=replica.load_state_dict,
                    load_from_disk=replica.load_checkpoint,
                    group_store=lambda: connect(self.config.host, self.config.port),
                    max_state_bytes=state_limit(replica.model),
                    faults=self.faults)
            except (GroupFailed, GroupCancelled) as error:
                log.info("[worker %s] epoch %d did not form (%s); trying the next", self.worker,
                         record.epoch, error)
                self.record = record
                continue
            self.record, self.group = record, formed.group
            self.rank, self.world = formed.rank, len(record.members)
            replica.held = True
            log.info("[epoch %d rank %d/%d] formed at step %d (%s)%s", record.epoch, self.rank,
                     self.world, replica.step, record.reason,
                     " after receiving state" if formed.received_state else "")
        return True

    def _newer_than(self, epoch: int) -> bool:
        self.progress.waiting()  # waiting on peers at the barrier or in a state transfer
        return self.rdzv.latest_epoch() > epoch

    def _next_record(self, replica: ReplicaState) -> MembershipEpoch | None:
        """The next epoch that includes this worker (asking to join when none does);
        None if this worker wants to leave and is no longer a member."""
        seen = self.record.epoch if self.record is not None else -1
        while True:
            self.rdzv.check_failed()
            latest = self.rdzv.latest_epoch()
            record = self.rdzv.epoch(latest) if latest >= 0 else None
            if record is not None and self.worker in record.members:
                if latest > seen:
                    self._awaiting_admission = False
                    return record
            elif self.leave_wanted.is_set() or self.rdzv.done():
                return None  # leaving, or the job finished before this worker got in
            elif not self._awaiting_admission:
                if self.record is not None:
                    replica.held = False  # dropped while stalled: our state is stale
                elif self.config.spare and not self.rdzv.wait_activated(self.worker,
                                                                         SPARE_WAIT_S):
                    continue  # a warm spare: started, model built, waiting to be called in
                self.rdzv.request_join(self.worker)
                self._awaiting_admission = True
            time.sleep(self.config.settings.poll_s)

    def placed(self) -> Membership:
        """This membership, once its first epoch formed (its rank and world are then this
        worker's place; they change from epoch to epoch)."""
        if self.record is None:
            # 0 would be read as a world size (a batch divided by it, a rank compared to
            # it): the first epoch forms when run.batches starts.
            raise TrainError("run.rank and run.world are known once run.batches(...) has "
                             "started (the first epoch forms there), and change from epoch to "
                             "epoch: read them inside the loop")
        return self

    def drop_group(self) -> None:
        """Leave the current epoch's group (it goes to the graveyard, never reused)."""
        if self.group is not None:
            self.group.abandon()
        self.group = None
