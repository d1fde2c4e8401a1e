"""The coordinator's settings: from flags, or SHOAL_COORDINATOR_* variables.

Defaults are for one machine (SQLite beside the run, loopback only). A
coordinator bound beyond loopback must name its operators: otherwise no
one could grant verifiers, and a store of strangers' money would run with
no one able to administer it. It must also say how it is served (TLS, or
plain HTTP by name): see `_served_safely`.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from shoal.spec.market import PriceTable, ReferencePrice

DEFAULT_PRICES = Path(__file__).with_name("prices.toml")
LOOPBACK = ("127.0.0.1", "localhost", "::1")


class CoordinatorSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="SHOAL_COORDINATOR_", frozen=True)

    store_url: str = "sqlite:///runs/coordinator/store.db"
    host: str = "127.0.0.1"
    port: int = Field(8470, ge=0, le=65535)
    # Named in every signed message, so a request cannot be replayed at another coordinator.
    audience: str = Field("shoal-local", min_length=1, max_length=64)
    operators: tuple[str, ...] = ()  # addresses with the operator role
    max_skew_s: float = Field(30.0, gt=0)  # signed times further from our clock are refused
    max_body_bytes: int = Field(256 * 1024, ge=1024)
    # Request quotas (`limits` notation, ";" between limits; "" for none): per signing key,
    # counted once the signature is checked, and per client address, counted for every
    # request before anything is read. A provider key's agents beat once a heartbeat_s
    # each and send records and progress (60/s holds twenty agents beating twice a second,
    # with room for their uploads); an address may hold many keys (a NAT, a demo).
    key_quota: str = "120/second;3600/minute"
    address_quota: str = "600/second;18000/minute"
    # A challenged file (a worker's revealed contribution or a step's parameters): about
    # the model's size in float32, so a 100M-parameter model needs 400 MB.
    max_file_bytes: int = Field(256 * 1024 * 1024, ge=1024)
    # An answered challenge's file is deleted this long after its proof epoch's challenge
    # window closed, unless a guilty verdict on it awaits a ruling or a dispute on it is
    # open (proofs/retention.py): verifiers fetch and file on it within this time.
    answer_retention_s: float = Field(24 * 3600.0, ge=0)
    heartbeat_s: float = Field(1.0, gt=0)  # what agents are told to beat at
    agent_timeout_s: float = Field(5.0, gt=0)  # silent this long: its leases are replaced
    clear_interval_s: float = Field(1.0, gt=0)  # a market round every this often
    notice_period_s: float = Field(30.0, ge=0)  # spot preemption notice
    prices_file: Path = DEFAULT_PRICES
    data_dir: Path = Path("runs/coordinator")  # job hosts' run dirs (epochs, final figures)
    # Where job hosts serve rendezvous; workers on other hosts must reach it
    # (default: --host, or 127.0.0.1 when that is a wildcard).
    rendezvous_bind: str | None = None
    stall_deadline_s: float = Field(1.0, ge=0.1)  # job hosts' liveness floor
    # A running lease whose worker stays out of the job's membership this long is ended
    # (attendance.py): long enough for a worker to start, join and receive the state.
    member_grace_s: float = Field(120.0, gt=0)
    # A proof epoch the job has left behind (ROOT_AFTER_EPOCHS on) with a member's records
    # still missing waits this long for them before it is rooted without them: an agent on
    # a loaded machine sends records late, and one refused after the root costs its
    # provider the pay for those steps. (A lost worker's never come; it waits no longer.)
    records_grace_s: float = Field(30.0, ge=0)
    # An agent's network probe (probe.py) gives up this long after it opened.
    probe_deadline_s: float = Field(15.0, gt=0, le=300)
    # Agents must pass a probe to register (None: once bound beyond loopback).
    probe_required: bool | None = None
    dashboard: bool = False  # serve the live dashboard page at /dashboard
    # How the API is served (tls.py): with the operator's certificate (both files), with
    # a self-signed one made once under data_dir/tls (clients pin its SHA-256), or as
    # plain HTTP, which beyond loopback must be asked for by name.
    tls_cert_file: Path | None = None
    tls_key_file: Path | None = None
    tls_self_signed: bool = False
    insecure_http: bool = False
    # Settlement on a chain (all three, or none: escrow is then the store's bookkeeping).
    chain_rpc: str | None = None  # an Ethereum JSON-RPC URL
    ledger_contract: str | None = None  # the market contract there
    operator_key_file: Path | None = None  # the contract's operator key (0x hex)
    # Forced errors (Truebit): the share of records served to verifiers as planted wrong
    # ones, so signing `valid` without replaying costs a verifier its stake (0: none).
    forced_error_rate: float = Field(0.05, ge=0.0, le=0.5)
    # How long every rooted epoch waits for its plants' files before verifiers see it
    # (planted or not: the wait tells nothing); a plant whose file is later is dropped.
    forced_error_wait_s: float = Field(5.0, gt=0)
    # After a job ends, how long verifiers have to file on its last epoch before the plan's
    # secret (which records were planted) is revealed and missed plants are penalised.
    forced_error_window_s: float = Field(600.0, ge=0)
    # An on-chain dispute on one of our jobs that nobody brings here this long after its
    # opening is rejected unheard (bond to the treasury): it would freeze the accused
    # provider's pay until the contract's dispute timeout (unfiled_disputes.py).
    unfiled_dispute_grace_s: float = Field(3600.0, gt=0)
    # A chain job whose providers accepted leases (their collateral locked until it is
    # settled) and that holds no device this long is ended and settled (None: the
    # contract's silence timeout, after which its submitter could reclaim it anyway).
    idle_chain_job_s: float | None = Field(None, gt=0)

    @property
    def rendezvous_address(self) -> str:
        if self.rendezvous_bind:
            return self.rendezvous_bind
        return "127.0.0.1" if self.host in ("0.0.0.0", "::", "localhost") else self.host

    @property
    def requires_probe(self) -> bool:
        if self.probe_required is not None:
            return self.probe_required
        return not self.on_loopback

    @property
    def on_loopback(self) -> bool:
        return self.host in LOOPBACK

    @property
    def serves_tls(self) -> bool:
        return self.tls_cert_file is not None or self.tls_self_signed

    @field_validator("key_quota", "address_quota")
    @classmethod
    def _quota(cls, value: str) -> str:
        from limits import parse_many

        if value.strip():
            try:
                parse_many(value)
            except ValueError as error:
                raise ValueError(f"a quota is limits' notation, such as '60/second;1800/minute'"
                                 f" ('' for none); not {value!r}: {error}") from None
        return value

    @field_validator("operators")
    @classmethod
    def _addresses(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        from eth_utils import is_address, to_checksum_address

        bad = [a for a in value if not is_address(a)]
        if bad:
            raise ValueError(f"operators must be 0x addresses; not: {bad}")
        return tuple(to_checksum_address(a) for a in value)

    @model_validator(mode="after")
    def _safe_beyond_loopback(self) -> CoordinatorSettings:
        if not self.on_loopback and not self.operators:
            raise ValueError(f"binding {self.host} exposes the coordinator beyond this "
                             "machine: name at least one operator address")
        chain = (self.chain_rpc, self.ledger_contract, self.operator_key_file)
        if any(chain) and not all(chain):
            raise ValueError("settling on a chain needs chain_rpc, ledger_contract and "
                             "operator_key_file together")
        if self.agent_timeout_s <= 2 * self.heartbeat_s:
            raise ValueError("agent_timeout_s must exceed two heartbeats, or one late "
                             "beat would get an agent's leases replaced")
        return self._served_safely()

    def _served_safely(self) -> CoordinatorSettings:
        """Plain HTTP beyond this machine lets anyone on the path read the gate tokens in
        heartbeat replies and rewrite the lease terms agents sign: it is never a default."""
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            raise ValueError("--tls-cert and --tls-key go together: the certificate (PEM) and "
                             "its private key (PEM)")
        if sum((self.tls_cert_file is not None, self.tls_self_signed, self.insecure_http)) > 1:
            raise ValueError("choose one of --tls-cert/--tls-key, --tls-self-signed and "
                             "--insecure-http")
        if not self.on_loopback and not self.serves_tls and not self.insecure_http:
            raise ValueError(
                f"binding {self.host} serves the API beyond this machine, where plain HTTP "
                "lets anyone on the path read agents' gate tokens and rewrite the lease terms "
                "they sign. Pass --tls-cert PATH --tls-key PATH (a certificate your clients' "
                "CAs vouch for), or --tls-self-signed (made once in the data directory; give "
                "its SHA-256, printed at start, to agents and clients as "
                "--coordinator-cert-sha256), or --insecure-http (plain HTTP: only behind a "
                "TLS-terminating proxy or on a network you trust)")
        return self

    def price_table(self) -> PriceTable:
        """The on-demand reference prices offers are checked against (wei per second)."""
        values = tomllib.loads(self.prices_file.read_text())
        return PriceTable(prices=tuple(
            ReferencePrice(device_kind=kind, on_demand_wei_per_s=price)
            for kind, price in values.get("on_demand_wei_per_s", {}).items()))
