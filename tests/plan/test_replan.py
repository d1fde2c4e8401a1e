"""Re-planning when membership changes keeps survivors on their stages where the cost allows."""

from __future__ import annotations

from shoal.plan import SearchConfig, plan, replan
from shoal.spec.plan import Cluster, Device, Plan, gpt3_xl
from tests.plan.factory import regions_cluster

MODEL = gpt3_xl()
# Four stages, whatever the number of replicas: 4 x 8 and 8 x 4 are within 0.1% of each
# other on these clusters, and which one wins decides how many survivors a departure
# leaves out, not whether re-planning keeps them in place.
FOUR_STAGES = SearchConfig(only_shapes=((8, 4), (7, 4)))


def _moved(before: Plan, after: Plan) -> list[str]:
    stage_of = {n: j for j, stage in enumerate(before.stages) for n in stage}
    return [n for j, stage in enumerate(after.stages) for n in stage if stage_of.get(n, j) != j]


def test_a_departure_moves_no_survivor():
    cluster = regions_cluster(8, 4)
    before = plan(cluster, MODEL, FOUR_STAGES)
    gone = before.stages[-1][0]
    after = replan(before, Cluster(devices=tuple(d for d in cluster.devices if d.name != gone)),
                   MODEL, FOUR_STAGES)
    assert gone not in after.devices + after.unused
    assert _moved(before, after) == []
    fresh = plan(Cluster(devices=tuple(d for d in cluster.devices if d.name != gone)), MODEL,
                 FOUR_STAGES)
    assert after.step_time_s <= fresh.step_time_s * 1.05


def test_a_newcomer_fills_the_hole_in_place():
    cluster = regions_cluster(8, 4)
    before = plan(cluster, MODEL, FOUR_STAGES)
    gone = before.stages[0][1]
    smaller = Cluster(devices=tuple(d for d in cluster.devices if d.name != gone))
    during = replan(before, smaller, MODEL, FOUR_STAGES)
    joined = Cluster(devices=smaller.devices + (
        Device(name="newcomer", tflops=125.0, memory_gb=16.0, region="r0"),))
    after = replan(during, joined, MODEL, FOUR_STAGES)
    assert "newcomer" in after.devices and not after.unused
    assert _moved(during, after) == []


def test_too_few_devices_for_the_old_pipeline_plans_afresh():
    cluster = regions_cluster(4, 1, memory_gb=80.0)
    before = plan(cluster, MODEL)
    tiny = Cluster(devices=cluster.devices[:1])
    after = replan(before, tiny, MODEL)
    assert after.devices == (cluster.devices[0].name,)
    assert after == plan(tiny, MODEL)
