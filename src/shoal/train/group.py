"""One process group per membership epoch, built in the running process.

gloo cannot cancel a collective in flight, and destroying a group with an
abandoned operation blocks until that operation times out. So every
blocking call (building the group, all-reduce, all-gather, all-to-all,
broadcast) runs on gloo's threads while the caller waits with a deadline
and a cancel check (the authority published a newer epoch); an abandoned
group, with its pending work and buffers, goes to a graveyard thread that
lets it die in the background. Nothing keeps a reference to an old group.
"""

from __future__ import annotations

import datetime
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist

from shoal.train.errors import TrainError

log = logging.getLogger(__name__)


class GroupCancelled(TrainError):
    """A newer membership epoch made this group obsolete while we waited on it."""


class GroupFailed(TrainError):
    """A collective or the group's construction failed (a peer is gone)."""


ShouldCancel = Callable[[], bool]


def _wait(done: threading.Event, should_cancel: ShouldCancel, poll_s: float,
          deadline_s: float, what: str) -> None:
    """Wait for `done`; raise GroupCancelled if `should_cancel()` turns true first."""
    give_up = time.monotonic() + deadline_s
    while not done.wait(poll_s):
        if should_cancel():
            raise GroupCancelled(f"{what} cancelled: membership changed")
        if time.monotonic() > give_up:
            raise GroupFailed(f"{what} took longer than {deadline_s:.0f} s")


class _Graveyard:
    """Holds abandoned groups until their pending work finishes or times out."""

    def __init__(self) -> None:
        self._graves: list[tuple[float, list[object]]] = []
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def bury(self, things: list[object], linger_s: float) -> None:
        with self._lock:
            self._graves.append((time.monotonic() + linger_s, things))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="group-graveyard", daemon=True)
                self._thread.start()

    def _run(self) -> None:
        while True:
            time.sleep(0.5)
            now = time.monotonic()
            with self._lock:
                expired = [g for g in self._graves if g[0] <= now or _settled(g[1])]
                self._graves = [g for g in self._graves if g not in expired]
            for _, things in expired:
                things.clear()  # last references dropped here, off the training thread

    def size(self) -> int:
        with self._lock:
            return len(self._graves)


def _settled(things: list[object]) -> bool:
    works = [t for t in things if isinstance(t, dist.Work)]
    return all(w.is_completed() for w in works)


GRAVEYARD = _Graveyard()


@dataclass(frozen=True, eq=False)
class Started:
    """A background collective in flight: its works and every buffer gloo may touch."""

    works: list[dist.Work]
    buffers: list[torch.Tensor]


class EpochGroup:
    """The process group of one epoch, with cancellable collectives."""

    def __init__(self, pg: dist.ProcessGroup, epoch: int, rank: int, world: int,
                 timeout_s: float, poll_s: float, *, store: dist.Store | None = None,
                 backend: str = "gloo") -> None:
        self.pg, self.epoch, self.rank, self.world = pg, epoch, rank, world
        self.timeout_s, self.poll_s = timeout_s, poll_s
        self.device = torch.device("cpu")  # gloo exchanges CPU tensors
        self._in_flight: list[object] = []
        # Background all-reduces run on a second group of the epoch (its own connections
        # and threads), built at the first one: on the step's group, the blocking
        # collectives of the steps in between would queue behind them on the same sockets.
        self._store, self._backend = store, backend
        self._background: dist.ProcessGroup | None = None
        self._started: list[Started] = []  # background collectives not yet waited for
        self._gather_out: dict[tuple[object, ...], list[list[torch.Tensor]]] = {}

    @classmethod
    def build(cls, store: dist.Store, epoch: int, rank: int, world: int, *, backend: str,
              timeout_s: float, poll_s: float, should_cancel: ShouldCancel) -> EpochGroup:
        prefixed = dist.PrefixStore(f"group/{epoch}", store)
        pg = _construct(backend, prefixed, rank, world, timeout_s, poll_s, should_cancel,
                        f"the group of epoch {epoch}")
        return cls(pg, epoch, rank, world, timeout_s, poll_s, store=prefixed, backend=backend)

    def _run(self, works: list[dist.Work], buffers: list[torch.Tensor],
             should_cancel: ShouldCancel, what: str) -> None:
        self._in_flight = [*works, *buffers]  # buried with the group if we give up on them
        for work in works:
            done = threading.Event()
            work.get_future().add_done_callback(lambda _: done.set())
            _wait(done, should_cancel, self.poll_s, self.timeout_s, what)
            try:
                work.wait()
            except RuntimeError as error:
                raise GroupFailed(f"{what} failed in epoch {self.epoch}: {str(error)[:160]}") from None
        self._in_flight = []

    def all_reduce(self, tensors: list[torch.Tensor], should_cancel: ShouldCancel) -> None:
        """Sum each tensor across the group in place (one collective per tensor)."""
        works = [self.pg.allreduce([t], dist.AllreduceOptions()) for t in tensors]
        self._run(works, tensors, should_cancel, "all-reduce")

    def start_all_reduce(self, tensor: torch.Tensor, should_cancel: ShouldCancel) -> Started:
        """Begin summing `tensor` across the group and return at once; `wait_for` it
        later. Every member must start it at the same point of its collectives."""
        pg = self._background_group(should_cancel)
        work = pg.allreduce([tensor], dist.AllreduceOptions())
        return self._start([work], [tensor])

    def start_all_gather(self, tensors: list[torch.Tensor],
                         should_cancel: ShouldCancel) -> tuple[Started, list[list[torch.Tensor]]]:
        """Begin gathering every member's copy of each tensor (rank order, in new
        tensors) and return at once; read them after `wait_for`."""
        gathered = [[torch.empty_like(t) for _ in range(self.world)] for t in tensors]
        pg = self._background_group(should_cancel)
        works = [pg.allgather([out], [t]) for out, t in zip(gathered, tensors)]
        return self._start(works, [*tensors, *(o for out in gathered for o in out)]), gathered

    def wait_for(self, started: Started, should_cancel: ShouldCancel) -> None:
        """Finish a background collective, with the same deadline and cancel check as the rest."""
        self._run(started.works, started.buffers, should_cancel, "background exchange")
        self._started = [t for t in self._started if t is not started]

    def _background_group(self, should_cancel: ShouldCancel) -> dist.ProcessGroup:
        if self._background is None:
            self._background = self.pg if self._store is None else _construct(
                self._backend, dist.PrefixStore("background", self._store), self.rank,
                self.world, self.timeout_s, self.poll_s, should_cancel,
                f"the background group of epoch {self.epoch}")
        return self._background

    def _start(self, works: list[dist.Work], buffers: list[torch.Tensor]) -> Started:
        started = Started(works, buffers)
        self._started.append(started)  # buried with the group if never waited for
        return started

    def all_gather(self, tensors: list[torch.Tensor],
                   should_cancel: ShouldCancel) -> list[list[torch.Tensor]]:
        """Every member's copy of each tensor, in rank order (one collective per tensor).

        The outputs belong to this group and its next all-gather of the same shapes
        writes over them: read them before. After a failed gather they go to the
        graveyard with the group (gloo's threads may still write into them), and a
        group never gathers again once given up."""
        gathered = self._gather_outputs(tensors)
        works = [self.pg.allgather([out], [t]) for out, t in zip(gathered, tensors)]
        self._run(works, [*tensors, *(o for out in gathered for o in out)], should_cancel,
                  "all-gather")
        return gathered

    def _gather_outputs(self, tensors: list[torch.Tensor]) -> list[list[torch.Tensor]]:
        """This group's outputs for gathering tensors of these shapes: the rows of one
        (world, ...) tensor each, made at the first gather and reused after: fresh
        outputs are page faults on first touch every step (13.5 MB, ~3,300 faults for
        the tiny GPT at 4 workers; a fault costs ~3 µs on the VMs we measured on)."""
        key = tuple((tuple(t.shape), t.dtype) for t in tensors)
        if key not in self._gather_out:
            self._gather_out[key] = [list(torch.empty((self.world, *t.shape), dtype=t.dtype))
                                     for t in tensors]
        return self._gather_out[key]

    def exchange_rows(self, row: torch.Tensor, should_cancel: ShouldCancel) -> torch.Tensor:
        """Send `row` to every member and receive each member's, in rank order (a
        (world, len) tensor; this member's own at its rank). gloo's all-to-all sends
        each pair directly: no member relays another's row, so none can alter it."""
        sent = row.reshape(1, -1).expand(self.world, -1).contiguous()
        received = torch.empty_like(sent)
        work = self.pg.alltoall_base(received, sent, [], [], dist.AllToAllOptions())
        self._run([work], [sent, received], should_cancel, "all-to-all")
        return received

    def broadcast(self, tensor: torch.Tensor, root: int, should_cancel: ShouldCancel) -> None:
        options = dist.BroadcastOptions()
        options.rootRank = root
        self._run([self.pg.broadcast([tensor], options)], [tensor], should_cancel, "broadcast")

    def abandon(self) -> None:
        """Hand this group and anything in flight to the graveyard; never touch it again."""
        started = [t for run in self._started for t in (*run.works, *run.buffers)]
        GRAVEYARD.bury([self.pg, self._background, *self._in_flight, *started],
                       linger_s=self.timeout_s + 5.0)
        self.pg = self._background = None  # type: ignore[assignment]
        self._in_flight, self._started, self._gather_out = [], [], {}


def _construct(backend: str, store: dist.Store, rank: int, world: int, timeout_s: float,
               poll_s: float, should_cancel: ShouldCancel, what: str) -> dist.ProcessGroup:
    """A process group, built on a thread while the caller waits with a deadline and a
    cancel check."""
    made: dict[str, object] = {}
    done = threading.Event()

    def construct() -> None:
        try:
            made["pg"] = _new_backend(backend, store, rank, world, timeout_s)
        except Exception as error:  # reported to the waiting thread below
            made["error"] = error
        finally:
            done.set()

    threading.Thread(target=construct, name=f"build {what}", daemon=True).start()
    _wait(done, should_cancel, poll_s, timeout_s, f"building {what}")
    if "error" in made:
        raise GroupFailed(f"{what} could not form: {made['error']}")
    return made["pg"]


def _new_backend(backend: str, store: dist.Store, rank: int, world: int,
                 timeout_s: float) -> dist.ProcessGroup:
    timeout = datetime.timedelta(seconds=timeout_s)
    if backend == "gloo":
        return dist.ProcessGroupGloo(store, rank, world, timeout)
    if backend == "nccl":
        # Not offered until it is verified on a GPU: a NCCL work future completes at
        # enqueue, so the deadlines above would never engage, and a hung communicator
        # must be aborted, not abandoned.
        raise TrainError("backend 'nccl' is not supported yet (unverified on GPUs); use gloo")
    raise TrainError(f"unknown backend '{backend}'; use gloo")
