import pytest

from shoal.spec.elastic import FaultKind
from shoal.elastic.chaos import ChaosError, parse_chaos


def test_parses_the_documented_example():
    events = parse_chaos("kill:1@30s,join@45s,stall:0@step200,leave:2@90s")
    assert [(e.kind, e.worker, e.at_s, e.at_step) for e in events] == [
        (FaultKind.kill, 1, 30.0, None), (FaultKind.join, None, 45.0, None),
        (FaultKind.stall, 0, None, 200), (FaultKind.leave, 2, 90.0, None)]
    assert str(events[2]) == "stall:0@step200"
    assert events[2].due(0.0, 200) and not events[2].due(999.0, 199)


@pytest.mark.parametrize("text, fragment", [
    ("explode:1@3s", "unknown"), ("kill:1", "ACTION[:WORKER]@WHEN"), ("join:2@3s", "no worker index"),
    ("kill@soon", "ACTION[:WORKER]@WHEN"),
])
def test_bad_schedules_say_what_is_wrong(text, fragment):
    with pytest.raises(ChaosError, match=fragment.replace("[", r"\[").replace("]", r"\]")):
        parse_chaos(text)


def test_empty_schedule():
    assert parse_chaos("") == [] and parse_chaos(" , ") == []
