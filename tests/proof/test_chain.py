"""The chain of steps (`shoal.proof.chain`): a state injected between two steps is
a break at the step that starts from it, blamed on the state source of an epoch
formed across it; the runtime's honest moves (an update, a skip, a rollback to a
kept snapshot, an epoch change, a DiLoCo round) break nothing."""

from __future__ import annotations

from shoal.proof.chain import chain_breaks
from shoal.spec.proof import LocalStep, WorkRecord
from tests.proof.factory import digest, honest_step


def chained(steps: range, workers: int = 3, epoch_of=lambda step: 0) -> list[WorkRecord]:
    """Honest every-step records: step s starts at state s and ends at state s + 1."""
    out = []
    for step in steps:
        for r in honest_step(step, [8 // workers + (i < 8 % workers) for i in range(workers)]):
            out.append(r.model_copy(update={"params_sha256": digest(f"state{step}"),
                                            "end_sha256": digest(f"state{step + 1}"),
                                            "membership_epoch": epoch_of(step)}))
    return out


def moved(records: list[WorkRecord], step: int, **update: object) -> list[WorkRecord]:
    return [r.model_copy(update=update) if r.step == step else r for r in records]


def no_source(epoch: int) -> str | None:
    return None


def test_an_honest_chain_has_no_break():
    assert chain_breaks(chained(range(6)), no_source) == []


def test_a_state_injected_at_a_resync_breaks_the_chain_and_falls_on_its_source():
    # Steps 0-2 committed in epoch 0; epoch 1 was a resync naming w2 as state source, and
    # from step 3 on every member starts from what w2 sent (all agree, all replay).
    records = chained(range(6), epoch_of=lambda step: 0 if step < 3 else 1)
    records = [r.model_copy(update={"params_sha256": digest(f"forged{r.step}"),
                                    "end_sha256": digest(f"forged{r.step + 1}")})
               if r.step >= 3 else r for r in records]
    found = chain_breaks(records, {1: "w2"}.get)
    assert [(b.step, b.source, b.membership_epoch) for b in found] == [(3, "w2", 1)]
    assert found[0].expected == digest("state3") and found[0].found == digest("forged3")
    assert found[0].blames("w2", 3) and not found[0].blames("w0", 3)


def test_a_break_within_one_epoch_names_no_source():
    records = moved(chained(range(4)), 2, params_sha256=digest("elsewhere"))
    [found] = chain_breaks(records, {0: "w1"}.get)  # epoch 0's own source sent nothing after 1
    assert (found.step, found.source) == (2, None)


def test_one_member_starting_elsewhere_is_no_break():
    """A lone record's claim decides nothing (the record audit's majority rule)."""
    records = [r.model_copy(update={"params_sha256": digest("mine")})
               if (r.step, r.worker) == (3, "w1") else r for r in chained(range(5))]
    assert chain_breaks(records, no_source) == []


def test_a_skipped_step_ends_where_it_started():
    records = moved(chained(range(5)), 2, end_sha256=digest("state2"))
    records = [r.model_copy(update={"params_sha256": digest(f"state{r.step - 1}"),
                                    "end_sha256": digest(f"state{r.step}")})
               if r.step > 2 else r for r in records]
    assert chain_breaks(records, no_source) == []


def test_a_rollback_to_the_kept_snapshot_is_no_break_and_a_forged_one_is():
    # Step 4 rolled back to the state step 2 started from; step 5 starts there.
    honest = moved(chained(range(6)), 4, end_sha256=digest("state2"), rolled_back_to=2)
    honest = moved(honest, 5, params_sha256=digest("state2"))
    assert chain_breaks(honest, no_source) == []
    # A snapshot a state source sent (with the live state of epoch 1) was not the job's:
    # the rollback lands on it, and the next step agrees with the rollback.
    forged = [r.model_copy(update={"membership_epoch": 1}) if r.step >= 3 else r for r in honest]
    forged = moved(forged, 4, end_sha256=digest("planted"), rolled_back_to=2, membership_epoch=1)
    forged = moved(forged, 5, params_sha256=digest("planted"), membership_epoch=1)
    found = chain_breaks(forged, {1: "w0"}.get)
    assert [(b.step, b.source) for b in found] == [(4, "w0")]


def test_records_from_before_ends_were_committed_are_not_judged():
    records = [r.model_copy(update={"end_sha256": None}) for r in chained(range(4))]
    records = moved(records, 2, params_sha256=digest("elsewhere"))
    assert chain_breaks(records, no_source) == []


def test_only_the_steps_asked_for_are_judged():
    records = moved(chained(range(6)), 4, params_sha256=digest("elsewhere"))
    assert chain_breaks(records, no_source, range(0, 3)) == []
    assert [b.step for b in chain_breaks(records, no_source, range(3, 6))] == [4]


def diloco(step: int, worker: int, round_start: int, start: str, end: str) -> WorkRecord:
    [r] = [r for r in honest_step(step, [4, 4]) if r.worker == f"w{worker}"]
    local = LocalStep(round_start=round_start, state_sha256=digest("opt"), applied=True,
                      end_params_sha256=digest(end), end_state_sha256=digest("opt"))
    return r.model_copy(update={"params_sha256": digest(start), "end_sha256": digest(end),
                                "local": local})


def test_under_diloco_a_round_starts_where_the_last_round_ended():
    """Inside a round each replica steps alone (no agreed start or end); a round's first
    step starts at the outer step's result, which every replica of the last round's end
    committed as its end."""
    rounds = []
    for w in (0, 1):
        rounds += [diloco(0, w, 0, "outer0", f"inner0-{w}"),
                   diloco(1, w, 0, f"inner0-{w}", "outer2"),
                   diloco(2, w, 2, "outer2", f"inner2-{w}"),
                   diloco(3, w, 2, f"inner2-{w}", "outer4")]
    assert chain_breaks(rounds, no_source) == []
    forged = [r.model_copy(update={"params_sha256": digest("forged")}) if r.step == 2 else r
              for r in rounds]
    assert [b.step for b in chain_breaks(forged, no_source)] == [2]
