from shoal.spec.elastic import FaultKind, StepRecord
from shoal.elastic.report import FaultEvent, _fault_report, coverage, lineage, replica_agreement


def record(step, epoch=0, rank=0, cursor=None, shares=(4, 4), t=None, sha=None):
    t = float(step) if t is None else t
    return StepRecord(step=step, epoch=epoch, worker=f"w{rank}", rank=rank, world=len(shares),
                      cursor=step * sum(shares) if cursor is None else cursor, shares=shares,
                      t_start=t - 0.5, t_commit=t, loss=1.0, param_sha256=sha)


def test_coverage_counts_gaps_and_overlaps():
    steps = [record(0), record(1), record(2, cursor=20), record(3, cursor=24)]
    seen, skipped, duplicated = coverage(steps)
    assert (seen, skipped, duplicated) == (28, 4, 4)


def test_lineage_keeps_the_newest_epoch_of_each_step():
    old = record(5, epoch=1, cursor=40)
    new = record(5, epoch=3, cursor=40, t=9.0)
    assert lineage([old, new, record(4, epoch=1)]) == [record(4, epoch=1), new]


def test_replica_mismatch_is_per_step():
    records = [record(1, rank=0, sha="a"), record(1, rank=1, sha="a"),
               record(2, rank=0, sha="b"), record(2, rank=1, sha="c")]
    assert replica_agreement(records) == (2, 1)


def test_steps_lost_counts_redone_steps_not_replicas_committing_late():
    # Replicas commit step 9 around the fault; nothing is redone.
    records = [record(9, rank=0, t=10.0), record(9, rank=1, t=10.002), record(10, epoch=1, t=11.0)]
    fault = FaultEvent(FaultKind.kill, "w2", 10.001)
    assert _fault_report(fault, [], lineage(records), records, 0.0).steps_lost == 0
    # Everyone died after step 12; the restore went back to step 10: steps 10-12 are redone.
    records = [record(s, epoch=1, t=float(s)) for s in range(13)]
    records += [record(s, epoch=3, t=20.0 + s) for s in range(10, 14)]
    fault = FaultEvent(FaultKind.kill, "w0", 12.5)
    assert _fault_report(fault, [], lineage(records), records, 0.0).steps_lost == 3
