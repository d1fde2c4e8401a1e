"""A client of the coordinator's API that signs what it sends: used by the
CLI, the provider agent and the benchmarks alike."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import httpx
from eth_account.signers.local import LocalAccount
from pydantic import BaseModel, TypeAdapter

from shoal.errors import ControlError
from shoal.client.identity import sign_request
from shoal.client.tls import CERT_SHA256_ENV, CertificateMismatch, CertificatePin, \
    client_context, untrusted_certificate
from shoal.spec.coordinator import (
    MAX_PAGE, AgentRegistration, AgentView, Event, Heartbeat, HeartbeatReply, Info, JobSubmission,
    JobView, OfferTerms, OfferView, Participant, ProviderView, Registration, TopUp,
)
from shoal.spec.audit import (
    ChallengeRequest, Challenges, ChallengeView, DisputeFiling, DisputeView, JobFile,
    ProofEpochView, RecordUpload, UploadReceipt, VerdictFiling, VerdictView,
)
from shoal.spec.bundle import BundleManifest
from shoal.spec.checkpoint import CheckpointView
from shoal.spec.ledger import LeaseAcceptance
from shoal.spec.progress import JobPlanView, MembershipChange, ProgressUpload, StepProgress
from shoal.spec.proof import WorkRecord

T = TypeVar("T")
RATE_LIMIT_TRIES = 6  # sends of one call at most, while the coordinator answers 429


class CoordinatorRefused(ControlError):
    """The coordinator answered with a 4xx: the request changed nothing."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(f"coordinator refused ({status}): {detail}")
        self.status, self.detail = status, detail


class CoordinatorClient:
    def __init__(self, url: str, account: LocalAccount | None = None,
                 timeout_s: float = 10.0, transport: httpx.BaseTransport | None = None,
                 rate_limit_wait_s: float = 30.0,
                 sleep: Callable[[float], None] = time.sleep,
                 pin: CertificatePin | None = None) -> None:
        """`rate_limit_wait_s`: how long one call may wait in all, as the coordinator's
        429s ask (`Retry-After`), before it gives up with the refusal. `pin`: an https
        coordinator's certificate, trusted for its SHA-256 alone (a self-signed one);
        without it an https coordinator must show one this machine's CAs vouch for."""
        self.url = url.rstrip("/")
        if pin is not None and not self.url.startswith("https://"):
            raise ControlError(f"a pinned certificate ({CERT_SHA256_ENV}) is checked over TLS "
                               f"only: give the coordinator's https:// URL, not {self.url}")
        self.account, self.pin = account, pin
        self.rate_limit_wait_s, self._sleep = rate_limit_wait_s, sleep
        self._timeout_s, self._transport = timeout_s, transport
        self._http = httpx.Client(base_url=self.url, timeout=timeout_s, transport=transport,
                                  verify=client_context(pin))
        self._info: Info | None = None

    def another_connection(self) -> CoordinatorClient:
        """The same coordinator, key and trust, on a connection of its own."""
        return CoordinatorClient(self.url, self.account, self._timeout_s, self._transport,
                                 self.rate_limit_wait_s, self._sleep, self.pin)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> CoordinatorClient:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    # ------------------------------------------------------------ plumbing
    def info(self) -> Info:
        if self._info is None:
            self._info = self._get("/v1/info", Info)
        return self._info

    def request(self, method: str, path: str, body: BaseModel | bytes | None = None,
                params: dict[str, Any] | None = None, sign: bool = True, raw: bool = False) -> Any:
        """One call; `body` bytes go as a file (octet-stream), a model as JSON; `raw`
        answers the response's bytes instead of its JSON."""
        if isinstance(body, bytes):
            content, content_type = body, "application/octet-stream"
        else:
            content = b"" if body is None else body.model_dump_json().encode()
            content_type = "application/json"
        waited_s = 0.0
        # A call refused for its quota is sent again, signed afresh, when told; within
        # `rate_limit_wait_s` and a few tries, whatever a coordinator answers.
        for _ in range(RATE_LIMIT_TRIES):
            response = self._send(method, path, content, content_type, params, sign)
            wait_s = _retry_after_s(response)
            if wait_s is None or waited_s + wait_s > self.rate_limit_wait_s:
                break
            self._sleep(wait_s)
            waited_s += wait_s
        if response.status_code >= 400:
            raise CoordinatorRefused(response.status_code, _detail(response))
        if raw:
            return response.content
        return response.json() if response.content else None

    def _send(self, method: str, path: str, content: bytes, content_type: str,
              params: dict[str, Any] | None, sign: bool) -> httpx.Response:
        request = self._http.build_request(method, path, content=content, params=params,
                                           headers={"content-type": content_type})
        if sign:
            if self.account is None:
                raise ControlError("this call changes state and must be signed: give a key "
                                   "(--key PATH; create one with `shoal key new PATH`)")
            target = request.url.raw_path.decode("latin-1")
            request.headers.update(sign_request(self.account, self.info().audience, method,
                                                target, content))
        try:
            return self._http.send(request)
        except httpx.HTTPError as error:
            raise self._unreachable(error) from None

    def _unreachable(self, error: httpx.HTTPError) -> ControlError:
        """What to tell the user when a call got no answer: a certificate we refused is
        not the same mistake as a coordinator that is down."""
        refused = untrusted_certificate(error)
        if isinstance(refused, CertificateMismatch):
            return ControlError(f"refused the coordinator at {self.url}: {refused}. Someone on "
                                "the path may be posing as it; nothing was sent. Check the "
                                "fingerprint the coordinator printed when it started")
        if refused is not None:
            return ControlError(f"refused the coordinator at {self.url}: its certificate is not "
                                f"one this machine's CAs vouch for ({refused.verify_message}). "
                                "A coordinator with a self-signed certificate prints its "
                                "SHA-256 when it starts: pin it with --coordinator-cert-sha256 "
                                f"(or {CERT_SHA256_ENV})")
        return ControlError(f"cannot reach the coordinator at {self.url}: {error}; "
                            "is it running (`shoal coordinator`), and is the URL's scheme "
                            "(http:// or https://) the one it serves?")

    def _get(self, path: str, kind: type[T], **params: Any) -> T:
        data = self.request("GET", path, params={k: v for k, v in params.items() if v is not None},
                            sign=False)
        return TypeAdapter(kind).validate_python(data)

    def _all_pages(self, path: str, kind: type[T], key: Callable[[T], str],
                   **params: Any) -> list[T]:
        """Every row of a paged listing: page after page, each after the last row's `key`,
        until a page comes back short."""
        rows: list[T] = []
        after = None
        while True:
            page = self._get(path, list[kind], after=after, limit=MAX_PAGE, **params)
            rows.extend(page)
            if len(page) < MAX_PAGE:
                return rows
            after = key(page[-1])

    def _post(self, path: str, body: BaseModel | None, kind: type[T]) -> T:
        return TypeAdapter(kind).validate_python(self.request("POST", path, body))

    # ------------------------------------------------------------ the API
    def register(self, registration: Registration) -> Participant:
        return self._post("/v1/participants", registration, Participant)

    def register_agent(self, registration: AgentRegistration) -> AgentView:
        return self._post("/v1/agents", registration, AgentView)

    def heartbeat(self, agent_id: str, beat: Heartbeat) -> HeartbeatReply:
        return self._post(f"/v1/agents/{agent_id}/heartbeat", beat, HeartbeatReply)

    def accept_lease(self, lease: int, acceptance: LeaseAcceptance) -> None:
        self.request("POST", f"/v1/leases/{lease}/acceptance", acceptance)

    def post_offer(self, terms: OfferTerms) -> OfferView:
        return self._post("/v1/offers", terms, OfferView)

    def withdraw_offer(self, offer_id: str) -> OfferView:
        return TypeAdapter(OfferView).validate_python(
            self.request("DELETE", f"/v1/offers/{offer_id}"))

    def submit(self, submission: JobSubmission) -> JobView:
        return self._post("/v1/jobs", submission, JobView)

    def top_up(self, job_id: str, amount_wei: int) -> JobView:
        return self._post(f"/v1/jobs/{job_id}/top-up", TopUp(amount_wei=amount_wei), JobView)

    def job_action(self, job_id: str, action: str) -> JobView:
        """pause, resume or cancel."""
        return self._post(f"/v1/jobs/{job_id}/{action}", None, JobView)

    def job(self, job_id: str) -> JobView:
        return self._get(f"/v1/jobs/{job_id}", JobView)

    def jobs(self, submitter: str | None = None) -> list[JobView]:
        return self._all_pages("/v1/jobs", JobView, lambda j: j.job_id, submitter=submitter)

    def providers(self) -> list[ProviderView]:
        return self._all_pages("/v1/providers", ProviderView, lambda p: p.address)

    def participants(self) -> list[Participant]:
        return self._all_pages("/v1/participants", Participant, lambda p: p.address)

    def events(self, job: str | None = None, after: int = 0, limit: int = 200) -> list[Event]:
        """One page of the audit log, oldest first: at most `limit` events after `after`."""
        return self._get("/v1/events", list[Event], job=job, after=after, limit=limit)

    def every_event(self, job: str | None = None, after: int = 0) -> Iterator[Event]:
        """The audit log after `after`, page by page to its end: a job with challenges
        records thousands of events, and its settlement and reveal come last."""
        while True:
            page = self.events(job=job, after=after, limit=MAX_PAGE)
            yield from page
            if len(page) < MAX_PAGE:
                return
            after = page[-1].seq


    # ------------------------------------------------------------ a job's progress
    def upload_progress(self, job_id: str, upload: ProgressUpload) -> int:
        return self.request("POST", f"/v1/jobs/{job_id}/progress", upload)["stored"]

    def progress(self, job_id: str, after: int = -1) -> list[StepProgress]:
        return self._get(f"/v1/jobs/{job_id}/progress", list[StepProgress], after=after)

    def membership(self, job_id: str) -> list[MembershipChange]:
        return self._get(f"/v1/jobs/{job_id}/membership", list[MembershipChange])

    # ------------------------------------------------------------ proof of learning
    def upload_records(self, job_id: str, upload: RecordUpload) -> UploadReceipt:
        return self._post(f"/v1/jobs/{job_id}/proof/records", upload, UploadReceipt)

    def work_records(self, job_id: str, epoch: int) -> list[WorkRecord]:
        return self._get(f"/v1/jobs/{job_id}/proof/records", list[WorkRecord], epoch=epoch)

    def job_file(self, job_id: str) -> str:
        return self._get(f"/v1/jobs/{job_id}/job-file", JobFile).job_file

    def proof_epochs(self, job_id: str) -> list[ProofEpochView]:
        return self._get(f"/v1/jobs/{job_id}/proof/epochs", list[ProofEpochView])

    def raise_challenges(self, job_id: str, items: list[ChallengeRequest]) -> list[ChallengeView]:
        return self._post(f"/v1/jobs/{job_id}/proof/challenges", Challenges(items=tuple(items)),
                          list[ChallengeView])

    def challenges(self, job_id: str) -> list[ChallengeView]:
        return self._get(f"/v1/jobs/{job_id}/proof/challenges", list[ChallengeView])

    def answer_challenge(self, challenge: int, data: bytes) -> ChallengeView:
        return TypeAdapter(ChallengeView).validate_python(
            self.request("PUT", f"/v1/challenges/{challenge}/answer", data))

    def challenge_file(self, challenge: int) -> bytes:
        return self.request("GET", f"/v1/challenges/{challenge}/file", raw=True)

    def job_plan(self, job_id: str) -> JobPlanView | None:
        return self._get(f"/v1/jobs/{job_id}/plan", JobPlanView | None)  # type: ignore[arg-type]

    def carried_checkpoint(self, job_id: str) -> CheckpointView | None:
        return self._get(f"/v1/jobs/{job_id}/checkpoint", CheckpointView | None)  # type: ignore[arg-type]

    def upload_checkpoint(self, job_id: str, step: int, lease: int, data: bytes) -> CheckpointView:
        return TypeAdapter(CheckpointView).validate_python(self.request(
            "PUT", f"/v1/jobs/{job_id}/checkpoints/{step}", data, params={"lease": lease}))

    def checkpoint_file(self, job_id: str, step: int) -> bytes:
        return self.request("GET", f"/v1/jobs/{job_id}/checkpoints/{step}/file", raw=True)

    def upload_bundle(self, sha256: str, archive: bytes) -> BundleManifest:
        return TypeAdapter(BundleManifest).validate_python(self.request(
            "PUT", f"/v1/bundles/{sha256}", archive))

    def bundle(self, sha256: str) -> bytes:
        """A job bundle's archive as sent (check it with shoal.bundle before any use)."""
        return self.request("GET", f"/v1/bundles/{sha256}", raw=True)

    def file_verdicts(self, job_id: str, filing: VerdictFiling) -> list[VerdictView]:
        return self._post(f"/v1/jobs/{job_id}/proof/verdicts", filing, list[VerdictView])

    def verdicts(self, job_id: str) -> list[VerdictView]:
        return self._get(f"/v1/jobs/{job_id}/proof/verdicts", list[VerdictView])

    def file_dispute(self, job_id: str, filing: DisputeFiling) -> DisputeView:
        return self._post(f"/v1/jobs/{job_id}/proof/disputes", filing, DisputeView)

    def disputes(self, job_id: str) -> list[DisputeView]:
        return self._get(f"/v1/jobs/{job_id}/proof/disputes", list[DisputeView])


def _retry_after_s(response: httpx.Response) -> float | None:
    """How long a 429 asks us to wait (seconds); None for any other answer, or a 429
    that does not say."""
    if response.status_code != 429:
        return None
    try:
        return max(0.0, float(response.headers.get("retry-after", "")))
    except ValueError:
        return None


def _detail(response: httpx.Response) -> str:
    try:
        detail = response.json().get("detail", response.text)
    except (json.JSONDecodeError, AttributeError):
        return response.text[:500]
    if isinstance(detail, list):  # FastAPI's 422: name each field that is wrong
        return "; ".join(f"{'.'.join(str(p) for p in d.get('loc', ())[1:])}: {d.get('msg')}"
                         for d in detail)
    return str(detail)
