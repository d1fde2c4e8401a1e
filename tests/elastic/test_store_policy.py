"""Issue 40, points 1, 2 and 6, tried as a provider who won one lease would try them:
through the gate, with its own valid token, it writes what only the job host or
another lease may write. Each attack is refused before a byte of it reaches the store,
the attacker's connection is closed, and the honest lease's job goes on and ends where
its host says, with the honest members' report.

The first half holds the policy itself to every key the runtime writes; the second
runs the attacks against a real job host (store, gate, membership authority) with
c10d's own client through the tunnel an agent uses."""

from __future__ import annotations

import threading
import time

import pytest

from shoal.elastic.authority import AuthorityConfig
from shoal.elastic.gate import StoreTunnel
from shoal.elastic.gate_keys import GateKeys, lease_identity
from shoal.elastic.job_host import CutLeases, JobHostConfig, _serve
from shoal.elastic.liveness import LivenessConfig
from shoal.elastic.store_policy import LEASE_BYTES, LeasePolicy, StoreView, lease_of
from shoal.elastic.store_wire import Query, Request, RequestReader, WireError, encode
from shoal.spec.elastic import Phase, ProgressBeat, StepBallot, StepDecision, WorkerArrival
from shoal.train.commit import agree
from shoal.train.rendezvous import Rendezvous, connect

MINE, MINE_TOO, THEIRS = "prov-l7-a0-w0", "prov-l7-a0-w1", "other-l8-a0-w0"
EPOCHS = {0: (THEIRS, MINE), 1: (MINE, THEIRS), 2: (THEIRS,)}


def policy() -> LeasePolicy:
    return LeasePolicy(7, StoreView(members=EPOCHS.get, latest=lambda: max(EPOCHS)))


def put(key: str, value: bytes | str = b"1") -> Request:
    return Request(Query.SET, ("/" + key,), (value.encode() if isinstance(value, str) else value,))


def add(key: str, amount: int) -> Request:
    return Request(Query.ADD, ("/" + key,), (), amount)


def beat(step: int = 0, phase: Phase = Phase.exchange, epoch: int = 1) -> str:
    return ProgressBeat(epoch=epoch, count=1, step=step, phase=phase).model_dump_json()


DECISION = StepDecision(commit=True).model_dump_json().encode()
SKIPPED = StepDecision(commit=False).model_dump_json().encode()
BALLOT = StepBallot(step=5, ok=True, fingerprint=3).model_dump_json().encode()


def cast(key: str, value: bytes = BALLOT) -> Request:
    return put(key, value)


# -- the policy, key by key ------------------------------------------------------------

@pytest.mark.parametrize("request_", [
    put("done"), put("failed", "given up"), put("final", "{}"), put("final_by", MINE),
    put("epoch/3", "{}"), put("epoch/latest", "3"),  # the authority's: the end, a membership
    put(f"exit/{THEIRS}"), put(f"leave/{THEIRS}"), put(f"activate/{THEIRS}"),  # framing
    put(f"hb/{THEIRS}", beat()), put(f"speed/{THEIRS}", "0.01"), put(f"final/{THEIRS}", "{}"),
    put(f"arrive/1/{THEIRS}", WorkerArrival(worker=THEIRS, step=0, has_state=True).model_dump_json()),
    put(f"arrive/1/{MINE}", WorkerArrival(worker=THEIRS, step=0, has_state=True).model_dump_json()),
    put("join/4", THEIRS), put("join/4", "prov-l77-a0-w0"),  # a name of another lease
    put("group/1/0/1", b"addr"),  # rank 1 of epoch 1 is lease 8's
    put("state/2"),  # epoch 2 has no member of lease 7
    put("reform/1", MINE), put("reform/1", ""),  # the authority re-forms on its own decisions
    put("progress", "99"),  # rank 0 of the newest epoch (2) is lease 8's
    put("anything/else"),  # a key no worker writes
    add("votes/1/5", 1),  # the old shared ballot counter: any member could stuff it
    cast(f"vote/1/0/{THEIRS}"), cast(f"vote/1/0/{THEIRS}", value=SKIPPED),  # another's ballot
    cast(f"vote/2/0/{MINE}"),  # no member of lease 7 in epoch 2
    cast(f"vote/1/0/{MINE_TOO}"),  # its worker, but no member of epoch 1
    Request(Query.COMPARE_SET, (f"/vote/1/0/{MINE}",), (b"", BALLOT)),  # a ballot is a set
    cast(f"vote/1/0/{MINE}", value=b"{}"), cast(f"vote/1/x/{MINE}"),  # no ballot; no step
    cast(f"vote/1/0/{MINE}/x"),
    add("requests", 50), add("exits", 2), add("launcher/node/other-l8-a0", 1),
    Request(Query.COMPARE_SET, ("/decision/1/5",), (DECISION, SKIPPED)),  # an overwrite
    Request(Query.COMPARE_SET, ("/done",), (b"1", b"")),  # expected differs from new
    Request(Query.COMPARE_SET, ("/decision/2/5",), (b"", DECISION)),  # not its epoch
    Request(Query.COMPARE_SET, ("/decision/1/5",), (b"", DECISION)),  # the authority's alone
    put("decision/1/5", DECISION),
    Request(Query.COMPARE_SET, ("/done",), (b"", b"1")),
    Request(Query.DELETE_KEY, ("/epoch/1",)), Request(Query.APPEND, ("/hb/" + MINE,), (b"x",)),
    Request(Query.QUEUE_PUSH, ("/q",), (b"x",)),
    Request(Query.MULTI_SET, ("/hb/" + MINE, "/done"), (beat().encode(), b"1")),
    put(f"hb/{MINE}", "garbage"), put(f"speed/{MINE}", "nan"), put(f"final/{MINE}", "[1]"),
], ids=lambda r: f"{r.query.name}:{','.join(r.keys)}")
def test_a_lease_is_refused_every_key_not_its_own(request_):
    assert policy().refusal(request_) is not None


@pytest.mark.parametrize("request_", [
    put(f"hb/{MINE}", beat()), put(f"speed/{MINE}", "123.5"), put(f"leave/{MINE}"),
    put(f"exit/{MINE_TOO}"), put(f"activate/{MINE_TOO}"), put(f"final/{MINE}", '{"steps": 3}'),
    put(f"arrive/1/{MINE}", WorkerArrival(worker=MINE, step=0, has_state=True).model_dump_json()),
    put("join/4", MINE_TOO), put("request/4"), put("group/1/0/0", b"addr"),
    put("group/1/background/0/0", b"addr"), put("state/1"),
    add("requests", 1), add("joins", 1), add("exits", 1), add("joins", 0),
    add("launcher/node/prov-l7-a0", 1), cast(f"vote/1/0/{MINE}"), cast(f"vote/0/12/{MINE}"),
    # A read in one round trip (Rendezvous.read): the same expected and new value changes
    # nothing, whoever's key it is.
    Request(Query.COMPARE_SET, ("/epoch/latest",), (b"\x00?", b"\x00?")),
    Request(Query.COMPARE_SET, ("/done",), (DECISION, DECISION)),
    Request(Query.GET, ("/done",)), Request(Query.WAIT, ("/epoch/9", "/final")),
    Request(Query.MULTI_GET, ("/a", "/b")), Request(Query.CHECK, ("/x",)),
    Request(Query.MULTI_SET, ("/hb/" + MINE, "/speed/" + MINE), (beat().encode(), b"2.0")),
], ids=lambda r: f"{r.query.name}:{','.join(r.keys)}")
def test_what_the_runtime_has_a_lease_write_passes(request_):
    assert policy().refusal(request_) is None


def test_a_member_casts_each_ballot_once_and_in_order():
    """A ballot is a plain set (one round trip with the wait after it), so the policy
    holds it to once: a second ballot on a step, or one on a step before its last, could
    change what a decision was made from after the authority read it."""
    rights = policy()
    assert rights.refusal(cast(f"vote/0/3/{MINE}")) is None
    again = cast(f"vote/0/3/{MINE}", StepBallot(step=5, ok=False).model_dump_json().encode())
    assert "once" in rights.refusal(again)
    assert "once" in rights.refusal(cast(f"vote/0/2/{MINE}"))  # an older step
    assert rights.refusal(cast(f"vote/0/4/{MINE}")) is None
    assert rights.refusal(cast(f"vote/1/0/{MINE}")) is None  # a newer epoch starts at 0
    assert "once" in rights.refusal(cast(f"vote/0/9/{MINE}"))  # back to an older epoch


def test_a_lease_writes_a_join_once():
    rights = policy()
    assert rights.refusal(put("join/12", MINE)) is None
    assert "once" in rights.refusal(put("join/12", MINE))
    # Another lease's policy on the same gate shares what was written once.
    other = LeasePolicy(8, rights.epochs)
    assert "once" in other.refusal(put("join/12", THEIRS))


def test_what_one_lease_keeps_in_the_store_is_capped():
    rights, value = policy(), b"x" * (1 << 20)
    for _ in range(3):
        assert rights.refusal(put("group/1/0/0", value)) is None  # replaced: counted once
    said = [rights.refusal(put(f"group/1/{device}/0", value))
            for device in range(LEASE_BYTES >> 20)]
    assert said[:-1] == [None] * (len(said) - 1) and "at most" in said[-1]


def test_identities_and_the_wire():
    assert lease_of("lease:7") == 7 and lease_of("lease:07") is None
    assert lease_of("coordinator") is None and lease_of("lease:7/x") is None
    reader = RequestReader()
    wire = encode(put("hb/x", "1")) + encode(add("votes/1/2", 1))
    parsed = [r for i in range(len(wire)) for r in reader.feed(wire[i:i + 1])]  # byte by byte
    assert [(r.query, r.keys, r.values, r.number) for r in parsed] == [
        (Query.SET, ("/hb/x",), (b"1",), None), (Query.ADD, ("/votes/1/2",), (), 1)]
    with pytest.raises(WireError, match="at most"):  # refused on its length, nothing allocated
        RequestReader().feed(bytes([Query.SET]) + (8).to_bytes(8, "little") + b"/hb/xxxx"
                             + (1 << 62).to_bytes(8, "little"))
    with pytest.raises(WireError, match="not relayed"):
        RequestReader().feed(bytes([Query.LIST_KEYS]))
    with pytest.raises(WireError, match="unknown"):
        RequestReader().feed(b"\xff")


# -- the attacks, against a real job host --------------------------------------------

@pytest.fixture
def job(tmp_path):
    """A market job's host (store, gate, authority that knows the job's 10 steps) with one
    worker of lease 7 and one of lease 8 admitted, each through its lease's tunnel."""
    config = JobHostConfig(bind="127.0.0.1", port=0, run_dir=tmp_path / "run",
                           gate_dir=tmp_path / "gate", steps=10)
    server, gate, host = _serve(config)
    server.start_authority(AuthorityConfig(min_workers=2, steps=10,
                                           liveness=LivenessConfig(floor_s=60.0)),
                           process_alive=lambda worker: None,
                           event_log=tmp_path / "run" / "epochs.jsonl")
    keys = GateKeys.load(tmp_path / "gate")
    address, _, port = host["endpoint"].rpartition(":")
    tunnels = {lease: StoreTunnel(address, int(port), keys.gate_pass(lease_identity(lease)))
               for lease in (7, 8)}

    def client(lease: int) -> Rendezvous:
        return Rendezvous(connect("127.0.0.1", tunnels[lease].port, timeout_s=5.0))

    honest, attacker = client(8), client(7)
    honest.request_join(THEIRS)
    attacker.request_join(MINE)
    deadline = time.monotonic() + 10
    while server.rdzv.latest_epoch() < 0 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert set(server.rdzv.epoch(0).members) == {MINE, THEIRS}
    yield server, gate, client, honest, attacker
    for tunnel in tunnels.values():
        tunnel.close()
    gate.close()
    server.close()


def attempt(write) -> None:
    """Make an attacker's write; a helper of several calls may meet its closed
    connection on the way (c10d raises), which is the gate doing its job."""
    try:
        write()
    except RuntimeError:
        pass


def cut_off(rdzv: Rendezvous) -> bool:
    """True once the gate has closed this client's connection (c10d raises on it)."""
    try:
        for _ in range(20):
            rdzv.store.check(["epoch/latest"])
            time.sleep(0.05)
    except (RuntimeError, ValueError):
        return True
    return False


def finish(rdzv: Rendezvous, worker: str, step: int) -> None:
    rdzv.beat(worker, ProgressBeat(epoch=0, count=9, step=step, phase=Phase.finished))
    rdzv.report_final(worker, {"steps": step, "param_sha256": "a" * 64})


def test_a_lease_cannot_end_the_job_and_cut_everyones_pay(job):
    """Point 1. Before: lease 7 writes `final` and `done` at step 3 of 10; the host wrote
    final.json, the coordinator ended the job as finished and paid every lease for 3
    steps. Now: refused, lease 7 is cut off, and its report of having finished at step 3
    ends nothing; the job ends when both members finished all 10."""
    server, gate, client, honest, attacker = job
    attempt(lambda: attacker.store.set("final", '{"steps": 3}'))
    assert cut_off(attacker)
    assert not server.rdzv.done() and server.rdzv.final() == {}
    attacker = client(7)
    attempt(lambda: attacker.mark_failed("owned"))  # the other way to end it: every worker stops
    assert cut_off(attacker) and server.rdzv.failure() is None
    attacker = client(7)
    finish(attacker, MINE, 3)  # its own keys: allowed, but not the job's end
    finish(honest, THEIRS, 3)
    time.sleep(0.5)  # many authority ticks
    assert not server.rdzv.done()
    # A member's beat says it finished only once the host has decided the job's steps:
    # both vote on the last one (step 9), then finish.
    record = server.rdzv.epoch(0)
    voters = [threading.Thread(target=agree, args=(rdzv, record, worker, 0, StepBallot(
        step=9, ok=True, fingerprint=5))) for rdzv, worker in ((attacker, MINE), (honest, THEIRS))]
    for voter in voters:
        voter.start()
    for voter in voters:
        voter.join(10)
    finish(attacker, MINE, 10)
    finish(honest, THEIRS, 10)
    deadline = time.monotonic() + 5
    while not server.rdzv.done() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert server.rdzv.done() and server.rdzv.final()["steps"] == 10
    assert [e["identity"] for e in gate.refused] == ["lease:7", "lease:7"]


def test_a_lease_cannot_frame_or_evict_another(job):
    """Point 2. Before: lease 7 wrote `exit/<lease 8's worker>`, the authority dropped an
    honest member as dead (and kept it out), and joining under `…-l8-…` made lease 7's
    process act as lease 8 (its poisoned parts blamed on lease 8's provider). Now both are
    refused and lease 8's worker stays a member."""
    server, gate, client, honest, attacker = job
    attempt(lambda: attacker.report_exit(THEIRS))
    assert cut_off(attacker)
    attacker = client(7)
    attempt(lambda: attacker.request_join("other-l8-a1-w0"))
    assert cut_off(attacker)
    attacker = client(7)
    attempt(lambda: attacker.report_speed(THEIRS, 0.001))  # point 6: marking the victim's offer down
    assert cut_off(attacker)
    time.sleep(0.3)
    assert server.rdzv.latest_epoch() == 0 and THEIRS in server.rdzv.epoch(0).members
    assert server.rdzv.exited([THEIRS]) == [] and server.rdzv.speeds((THEIRS,)) == [None]
    honest.report_speed(THEIRS, 42.0)  # the honest lease is untouched
    assert honest.speeds((THEIRS,)) == [42.0]


def test_a_lease_cannot_publish_a_membership_decide_a_step_or_vote_for_another(job):
    """Point 6. Before: a member wrote a step's decision first (compare-and-set) and every
    member followed it (a failed exchange committed, a rollback applied), asked for a
    resync naming any member as the state source, and added to one shared ballot
    counter. Now `epoch/N` and `decision/E/K` are the authority's, each member's ballot is
    its own key, cast once, and the authority decides from the ballots."""
    server, gate, client, honest, attacker = job
    attempt(lambda: attacker.store.set("epoch/1", '{"epoch": 1, "members": ["prov-l7-a0-w0"]}'))
    assert cut_off(attacker)
    attacker = client(7)
    attempt(lambda: attacker.decide(0, 0, StepDecision(commit=True)))
    assert cut_off(attacker)
    attacker = client(7)
    attempt(lambda: attacker.store.set("reform/0", MINE))  # a resync from a source it names
    assert cut_off(attacker)
    attacker = client(7)
    attempt(lambda: attacker.vote(0, 0, THEIRS, StepBallot(step=0, ok=False)))  # in its name
    assert cut_off(attacker)
    assert server.rdzv.latest_epoch() == 0 and server.rdzv.decision(0, 0) is None
    attacker = client(7)
    attacker.vote(0, 0, MINE, StepBallot(step=0, ok=True, fingerprint=3))
    attempt(lambda: attacker.vote(0, 0, MINE, StepBallot(step=0, ok=False)))  # a second one
    assert cut_off(attacker)
    assert server.rdzv.decision(0, 0) is None  # one ballot of two: nothing decided
    honest.vote(0, 0, THEIRS, StepBallot(step=0, ok=True, fingerprint=3))
    decided = honest.wait_decision(0, 0, 5.0)
    assert decided == StepDecision(commit=True)  # both ballots, as each member cast its own
    assert server.rdzv.ballots(0, 0, server.rdzv.epoch(0).members)[MINE].ok
    assert [e["identity"] for e in gate.refused] == ["lease:7"] * 5


def test_a_revoked_leases_worker_counts_as_exited_so_no_step_waits_for_it(job, tmp_path):
    """A slashed provider's lease is revoked as its worker leaves (it gave notice): cut off
    before its last ballot, it was waited for the leaver's grace (30 s) while its honest
    peer stalled, was fenced, and the job went back to a checkpoint. The host now reports
    a revoked lease's workers exited, and the step in flight is discarded at once."""
    server, gate, client, honest, attacker = job
    keys, cut = GateKeys.load(tmp_path / "gate"), CutLeases(GateKeys.load(tmp_path / "gate"),
                                                             server.rdzv)
    cut.report()
    attacker.request_leave(MINE)
    deadline = time.monotonic() + 10
    while server.rdzv.latest_epoch() < 1 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert server.rdzv.epoch(1).members == (THEIRS,)
    honest.vote(0, 0, THEIRS, StepBallot(step=0, ok=True, fingerprint=3))  # MINE never votes
    assert honest.wait_decision(0, 0, 0.5) is None  # MINE gave notice: it is waited for
    keys.revoke({lease_identity(7)})
    cut.report()
    assert server.rdzv.exited([MINE, THEIRS]) == [MINE]
    assert honest.wait_decision(0, 0, 5.0) == StepDecision(commit=False, next_epoch=1)
