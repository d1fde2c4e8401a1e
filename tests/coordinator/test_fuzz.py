"""The HTTP API fuzzed from its own OpenAPI description (schemathesis): every
operation, with bodies valid and invalid, signed by a registered key of the
role the route needs, must never answer 5xx."""

from __future__ import annotations

from collections import Counter

import pytest
import requests
import schemathesis
from eth_account import Account
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis.checks import not_a_server_error

from shoal.bundle import pack_bundle
from shoal.client.identity import sign_request
from shoal.spec.coordinator import Grant, JobSubmission, OfferTerms, Registration, Role
from tests.coordinator.conftest import TINY_JOB, Served, provider_with_agent

PROOF_JOB = TINY_JOB + "[proof]\nenabled = true\nepoch_steps = 5\n"  # the proof routes take it


class SigningSession(requests.Session):
    """Signs each request exactly as sent, with the key of the role its route needs."""

    def __init__(self, keys: dict[str, object], audience: str) -> None:
        super().__init__()
        self.keys, self.audience = keys, audience

    def send(self, request, **kwargs):  # noqa: ANN001, ANN201
        path = request.path_url
        role = ("provider" if path.startswith(("/v1/agents", "/v1/offers", "/v1/challenges"))
                or "/proof/records" in path or path.endswith("/progress") else
                "verifier" if "/proof/" in path else
                "operator" if path.startswith("/v1/grants") else "submitter")
        body = request.body or b""
        body = body.encode() if isinstance(body, str) else body
        request.headers.update(sign_request(self.keys[role], self.audience, request.method,
                                            path, body))
        return super().send(request, **kwargs)


@pytest.fixture
def fuzz_schema(served: Served, operator, tmp_path):
    keys = {"provider": Account.create(), "submitter": Account.create(), "operator": operator,
            "verifier": Account.create()}
    provider, submitter = served.client(keys["provider"]), served.client(keys["submitter"])
    provider_with_agent(provider, "agent-a")  # something real for the fuzzer to hit
    provider.post_offer(OfferTerms(offer_id="dev-a", agent_id="agent-a", price_wei_per_s=10**6))
    submitter.register(Registration(role="submitter", name="alice"))
    job = submitter.submit(JobSubmission(name="tiny", job_file=PROOF_JOB, workers=1,
                                   max_price_wei_per_s=10**6, budget_wei=10**12))
    served.client(operator).request("POST", "/v1/grants", Grant(
        address=keys["verifier"].address, role=Role.verifier, name="vera"))
    script = tmp_path / "train.py"
    script.write_text("import shoal\n")
    bundle = pack_bundle(script)
    submitter.upload_bundle(bundle.sha256, bundle.archive)
    served.known = {"job_id": job.job_id, "agent_id": "agent-a", "offer_id": "dev-a", "lease": 1,
                    "challenge": 1, "step": 0, "sha256": bundle.sha256}
    served.fuzz_session = SigningSession(keys, served.app.state.coordinator.settings.audience)
    return schemathesis.openapi.from_dict(served.app.openapi())


@pytest.mark.slow
@pytest.mark.parallel_ok  # answers are checked, never timed
@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)  # PostgreSQL: the store tests
@pytest.mark.parametrize("mode", list(schemathesis.GenerationMode), ids=lambda m: m.value)
def test_no_operation_answers_5xx(served, fuzz_schema, mode):
    # Operations one by one (the schemathesis pytest plugin does not run on this pytest).
    seen: Counter = Counter()
    operations = [result.ok() for result in fuzz_schema.get_all_operations()]
    # Each operation once with any path, once on the real job, agent and offer.
    runs = [(op, {}) for op in operations] + [
        (op, {p.name: served.known[p.name] for p in op.path_parameters})
        for op in operations if op.path_parameters]
    for operation, path in runs:

        @settings(max_examples=12, deadline=None, derandomize=True, database=None,
                  suppress_health_check=list(HealthCheck))
        @given(case=operation.as_strategy(generation_mode=mode, path_parameters=path or None))
        def call(case):
            response = case.call_and_validate(base_url=served.url, session=served.fuzz_session,
                                              checks=[not_a_server_error])
            seen[(operation.label, response.status_code)] += 1

        try:
            call()
        except Unsatisfiable:
            # Nothing to make invalid (no parameters, no body): the positive run covers it.
            assert mode is schemathesis.GenerationMode.NEGATIVE, operation.label
    # The fuzzer got through the door: signed calls were taken, not only refused.
    taken = {label for (label, status), _ in seen.items() if status < 300 and label.startswith("POST")}
    if mode is schemathesis.GenerationMode.POSITIVE:
        assert {"POST /v1/grants",
                "POST /v1/jobs/{job_id}/top-up", "POST /v1/agents/{agent_id}/heartbeat"} <= taken, seen
