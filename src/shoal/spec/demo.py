"""What `shoal demo` reports (`--report PATH`, and `RUN_DIR/report.json`),
and what `shoal report RUN_DIR` renders: the run's figures, each fault with
its recovery, the money on chain, and the curves and timelines behind them.

Wei are integers in JSON (Python reads them exactly; a browser may round
those above 2^53, so the HTML report prints them from the JSON text)."""

from __future__ import annotations

import enum

from pydantic import Field, model_validator

from shoal.spec.base import Frozen
from shoal.spec.market import Tenancy
from shoal.spec.progress import MembershipChange, StepProgress


class FaultReport(Frozen):
    kind: str  # preemption (spot notice), kill (no notice), join, cheat
    provider: str  # its name in the demo (agent id)
    at_s: float  # seconds from the job's start
    recovery_s: float | None  # until the job's throughput was back to 90% of before (None: not)
    steps_lost: int  # committed steps redone (0: none lost)
    detail: str = ""
    # It came as the job ended (too few steps after it to measure a recovery): there was
    # nothing to recover, and recovery_s is None for that reason.
    after_end: bool = False


class SlashReport(Frozen):
    provider: str  # agent id
    address: str
    amount_wei: int  # collateral taken on chain
    tx: str | None = None
    why: str = ""


class ProviderReport(Frozen):
    name: str  # agent id
    address: str
    tenancy: str
    price_wei_per_s: int
    speed_samples_per_s: float  # as measured by its pre-flight (and slowed for the demo)
    leased_s: float  # seconds its leases on the job were open
    steps: int  # steps it took part in (rank-0 progress counts each once)
    paid_wei: int  # credited on chain for the job (0 when slashed)
    slashed_wei: int
    cheated: bool  # the scenario made it cheat


class EfficiencyReport(Frozen):
    """EF: the static on-demand run of the same job over this one (>1: shoal better)."""

    time: float  # static wall time / this run's wall time
    cost: float  # static cost / this run's cost
    static_wall_s: float
    static_cost_wei: int
    measured: bool  # the static run ran in this demo (False: estimated, see `how`)
    how: str


class AnchorReport(Frozen):
    epoch: int
    root: str  # over the workers' records
    anchored: str | None = None  # on chain: `root`, sealed while forced errors are served
    tx: str | None


class DemoReport(Frozen):
    scenario: str
    job_id: str
    chain_job: int
    started_at: float  # wall time
    wall_s: float
    steps: int
    val_loss: float | None
    samples_skipped: int
    samples_duplicated: int
    faults: tuple[FaultReport, ...]
    slashes: tuple[SlashReport, ...]
    providers: tuple[ProviderReport, ...]
    eta_het: float | None  # achieved samples/s over the sum of the members' measured speeds
    ef: EfficiencyReport | None
    budget_wei: int
    spent_wei: int  # booked on chain (pay and fee)
    refunded_wei: int  # escrow back to the submitter at settlement
    conserved: bool  # the parties' and the contract's wei moved by exactly the gas paid
    store_chain_agree: bool  # the store's settled seconds per provider are the chain's booking
    gas: dict[str, int] = Field(default_factory=dict)  # gas used per contract function
    anchors: tuple[AnchorReport, ...] = ()
    progress: tuple[StepProgress, ...] = ()  # loss and pace per committed step
    membership: tuple[MembershipChange, ...] = ()
    verdicts: dict[str, int] = Field(default_factory=dict)  # kind -> count (every verifier's)
    rechecked: int = 0  # verdicts the whistleblower re-audited
    # Verifiers that lost stake: a wrong `valid`, a false accusation, a plant signed valid.
    verifier_slashes: tuple[SlashReport, ...] = ()


# -- scenarios: who provides, who cheats, and what happens when ------------------


class EventKind(str, enum.Enum):
    preempt = "preempt"  # the provider's spot capacity is reclaimed: a notice, a graceful leave
    kill = "kill"  # the provider's machine is gone at once: no notice
    join = "join"  # a provider declared with `start = false` comes online


class ScenarioProvider(Frozen):
    name: str = Field(min_length=1, max_length=32, pattern=r"^[a-z0-9][a-z0-9-]*$")
    price_wei_per_s: int = Field(ge=1)
    tenancy: Tenancy = Tenancy.spot
    slowdown: float = Field(1.0, ge=1.0, le=100.0)  # poses as a device this many times slower
    adversary: str | None = None  # e.g. "sign_flip@0.3": cheats on 30% of its steps
    start: bool = True  # False: comes online at a `join` event


class ScenarioEvent(Frozen):
    """When: `at_step` (once the job has committed that many steps: the same point of
    the run on a fast or a slow machine), or `at_s` seconds after its first step."""

    at_step: int | None = Field(None, ge=1)
    at_s: float | None = Field(None, ge=0.0)
    kind: EventKind
    provider: str

    @model_validator(mode="after")
    def _one_time(self) -> ScenarioEvent:
        if (self.at_step is None) == (self.at_s is None):
            raise ValueError(f"event {self.kind.value} of {self.provider}: give at_step or "
                             "at_s (one of them)")
        return self


class Scenario(Frozen):
    """A demo's cast and schedule (`examples/scenarios/*.toml`)."""

    name: str = Field(min_length=1, max_length=64)
    job: str  # the job file, relative to the scenario file
    steps: int | None = Field(None, ge=1)  # overrides the job's steps
    workers: int = Field(3, ge=1, le=64)
    min_workers: int = Field(2, ge=1, le=64)
    budget_wei: int = Field(10**16, ge=1)
    max_price_wei_per_s: int = Field(10**9, ge=1)
    verify_rate: float = Field(0.2, gt=0.0, le=1.0)  # share of each epoch's records replayed
    providers: tuple[ScenarioProvider, ...] = Field(min_length=1, max_length=16)
    events: tuple[ScenarioEvent, ...] = ()

    @model_validator(mode="after")
    def _consistent(self) -> Scenario:
        names = [p.name for p in self.providers]
        if len(set(names)) != len(names):
            raise ValueError(f"provider names repeat: {names}")
        late = {p.name for p in self.providers if not p.start}
        joins = [e.provider for e in self.events if e.kind is EventKind.join]
        for event in self.events:
            if event.provider not in names:
                raise ValueError(f"event {event.kind.value} names provider "
                                 f"'{event.provider}', which is not in [[providers]]")
            if event.kind is EventKind.join and event.provider not in late:
                raise ValueError(f"provider '{event.provider}': a join event needs start = false "
                                 "(it is online from the start)")
        for name in sorted(late):
            if joins.count(name) != 1:
                raise ValueError(f"provider '{name}' has start = false: it needs exactly one "
                                 f"join event (it has {joins.count(name)})")
        if self.min_workers > self.workers:
            raise ValueError("min_workers cannot exceed workers")
        return self
