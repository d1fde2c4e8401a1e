"""The scenario files users rehearse with: every example is valid and names a job
file that parses; a scenario that could not run is refused before anything starts."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from pydantic import ValidationError

from shoal.spec.demo import Scenario
from shoal.spec.jobfile import parse_job

SCENARIOS = sorted((Path(__file__).resolve().parents[2] / "examples" / "scenarios").glob("*.toml"))


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: p.stem)
def test_every_example_scenario_is_valid_and_its_job_parses(path):
    scenario = Scenario.model_validate(tomllib.loads(path.read_text()))
    job = parse_job(tomllib.loads((path.parent / scenario.job).read_text()), source=scenario.job)
    assert job.proof.enabled  # the demo's verifiers need work records
    assert 5 + len(scenario.providers) <= 10  # the embedded chain funds ten accounts
    assert SCENARIOS, "no example scenarios"


BASE = {"name": "s", "job": "j.toml",
        "providers": [{"name": "a", "price_wei_per_s": 1}, {"name": "b", "price_wei_per_s": 1,
                                                              "start": False}]}


@pytest.mark.parametrize("events, why", [
    ([{"at_step": 5, "kind": "kill", "provider": "zed"}], "not in"),
    ([{"at_step": 5, "kind": "join", "provider": "a"}], "start = false"),
    ([], "exactly one join event"),
    ([{"at_step": 5, "at_s": 1.0, "kind": "join", "provider": "b"}], "one of them"),
])
def test_a_scenario_that_could_not_run_is_refused(events, why):
    with pytest.raises(ValidationError, match=why):
        Scenario.model_validate({**BASE, "events": events})
