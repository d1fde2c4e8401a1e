"""The coordinator's live dashboard in a real headless Chromium (Debian's, by
Selenium): a job with leases, progress uploaded by its agent, an agent lost
and replaced, a slash, an anchored root and a settlement; the page draws them
and keeps up as more arrive, and a screenshot shows the curve."""

from __future__ import annotations

import json
import subprocess
import time

import httpx
import pytest
from eth_account import Account
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait
from sqlalchemy import select

from shoal.coordinator import Coordinator
from shoal.coordinator.db.schema import ProofEpochRow
from shoal.coordinator.db.store import record_event
from shoal.spec.audit import RecordUpload
from shoal.spec.coordinator import COORDINATOR, JobSubmission, OfferTerms, Registration
from shoal.spec.events import AuditEvent, JobSettled, WorkerSlashed
from shoal.spec.progress import ProgressUpload, StepProgress
from tests.conftest import free_port, shoal_command
from tests.coordinator.conftest import Served, make_settings, provider_with_agent
from tests.coordinator.test_proofs import PROOF_JOB, record
from tests.harness.chromium import headless_chromium, png_pixels

PRICE = 1_000_000
BIG_WEI = "18446744073709551617"  # 2^64 + 1, sent as a string (the settlement's event does)
BUDGET_WEI = 2**62 + 1  # a JSON number: JSON.parse alone would show ...904
ANCHOR_TX = "0x" + "ab" * 32
SLASH_TX = "0x" + "cd" * 32
LOSS_BLUE = (0x25, 0x63, 0xEB)  # --loss in style.css


@pytest.fixture
def served(tmp_path):
    # A long agent timeout: the one agent lost here is lost on purpose, not to a slow machine.
    coordinator = Coordinator(make_settings(f"sqlite:///{tmp_path}/store.db",
                                            dashboard=True, agent_timeout_s=60.0))
    serving = Served(coordinator)
    yield serving
    serving.stop()
    coordinator.hosts.stop_all()
    coordinator.engine.dispose()


@pytest.fixture
def chromium():
    with headless_chromium() as driver:
        yield driver


class Job:
    """A two-worker job on agent-a and agent-b, agent-c waiting as the replacement."""

    def __init__(self, served: Served) -> None:
        self.served, self.co = served, served.app.state.coordinator
        self.providers = {}
        for agent, price in (("agent-a", PRICE), ("agent-b", PRICE), ("agent-c", 2 * PRICE)):
            client = served.client(Account.create())
            provider_with_agent(client, agent)
            client.post_offer(OfferTerms(offer_id=f"dev-{agent[-1]}", agent_id=agent,
                                         price_wei_per_s=price))
            self.providers[agent] = client
        submitter = served.client(Account.create())
        submitter.register(Registration(role="submitter", name="alice"))
        view = submitter.submit(JobSubmission(name="tiny", job_file=PROOF_JOB, workers=2,
                                              max_price_wei_per_s=2 * PRICE, budget_wei=BUDGET_WEI))
        self.job_id, self.t0 = view.job_id, view.created_at_s
        served.app.state.rounds.once()
        self.submitter, self.lease = submitter, {}
        self.leased()
        self.worker_a = self.worker("agent-a")

    def leased(self) -> None:
        for lease in self.submitter.job(self.job_id).leases:  # offer dev-X is agent-X's
            self.lease[f"agent-{lease.offer_id[-1]}"] = lease.lease

    def worker(self, agent: str) -> str:
        return f"{agent}-l{self.lease[agent]}-a0-w0"

    def progress(self, steps: range) -> None:
        """agent-a's worker, rank 0, commits `steps`: a quarter second each, loss falling."""
        upload = tuple(StepProgress(step=s, t=self.t0 + 1 + s / 4, loss=4.0 * 0.97 ** s, world=2,
                                    samples=16) for s in steps)
        self.providers["agent-a"].upload_progress(self.job_id, ProgressUpload(
            lease=self.lease["agent-a"], worker=self.worker_a, steps=upload))

    def membership(self, *epochs: tuple[float, list[str], str]) -> None:
        """The job host's epochs.jsonl, as it writes it (t, epoch, members, reason)."""
        run_dir = self.co.hosts.run_dir(self.job_id)
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "epochs.jsonl").write_text("".join(
            json.dumps({"t": self.t0 + at, "epoch": n, "members": members, "reason": why}) + "\n"
            for n, (at, members, why) in enumerate(epochs, start=1)))

    def root_and_anchor_epoch_0(self) -> str:
        """Both workers' records for steps 0-4, committed in the host's first epoch (numbered
        1 by `membership`), rooted by the coordinator; the anchor's transaction written as a
        chain settlement would (no chain here)."""
        for rank, agent in enumerate(("agent-a", "agent-b")):
            self.providers[agent].upload_records(self.job_id, RecordUpload(
                lease=self.lease[agent], records=tuple(
                    record(self.worker(agent), s, epoch=1, rank=rank, shares=(4, 4))
                    for s in range(5))))
        self.served.app.state.rounds.once()
        with self.co.desk.change() as session:
            row = session.scalar(select(ProofEpochRow).where(ProofEpochRow.job_id == self.job_id))
            row.chain_epoch, row.anchored_at_s, row.anchor_tx = 0, time.time(), ANCHOR_TX
            return row.root

    def event(self, event: AuditEvent) -> None:
        with self.co.desk.change() as session:
            record_event(session, self.co.desk.now_s(), COORDINATOR, event, self.job_id)


def text_of(driver, element_id: str) -> str:
    return driver.find_element(By.ID, element_id).text


def points(driver) -> int:
    return int(driver.find_element(By.ID, "loss-path").get_attribute("data-points"))


@pytest.mark.slow
def test_the_dashboard_draws_a_job_and_keeps_up(served, chromium, tmp_path):
    started = time.monotonic()
    job = Job(served)
    job.progress(range(10))
    worker_b = job.worker("agent-b")
    job.membership((0.5, [job.worker_a, worker_b], "formed"))
    root = job.root_and_anchor_epoch_0()
    page = httpx.get(f"{served.url}/dashboard")
    assert page.status_code == 200 and "connect-src 'self'" in page.headers["content-security-policy"]
    assert "/dashboard" not in served.app.openapi()["paths"]

    chromium.get(f"{served.url}/dashboard")
    wait = WebDriverWait(chromium, 15)
    wait.until(lambda d: points(d) == 10)
    assert job.job_id in text_of(chromium, "jobs") and job.job_id in text_of(chromium, "job-title")
    assert str(BUDGET_WEI) in text_of(chromium, "jobs")  # exact past 2^53
    path = chromium.find_element(By.ID, "loss-path").get_attribute("d")
    assert path.startswith("M") and path.count("L") == 9
    assert len(chromium.find_elements(By.CSS_SELECTOR, "#membership rect.bar")) == 2
    wait.until(lambda d: ANCHOR_TX in text_of(d, "anchors") and root in text_of(d, "anchors"))

    # Live: agent-b is lost and replaced, more steps commit, a worker is slashed, the job settles.
    job.co.offers.withdraw(COORDINATOR, "dev-b", reason="agent lost")
    served.app.state.rounds.once()  # leases agent-c in its place
    job.leased()
    worker_c = job.worker("agent-c")
    job.progress(range(10, 20))
    job.membership((0.5, [job.worker_a, worker_b], "formed"),
                   (3.2, [job.worker_a], f"{worker_b} lost"), (4.0, [job.worker_a, worker_c], "joined"))
    job.event(WorkerSlashed(verdict=1, worker=worker_b, step=3,
                            verifier=Account.create().address, provider=Account.create().address,
                            why="wrong contribution", tx=SLASH_TX))
    job.event(JobSettled(chain_job=1, root="0x" + "00" * 32,
                         seconds={job.providers["agent-a"].account.address: 12},
                         wei={job.providers["agent-a"].account.address: int(BIG_WEI)},
                         metered_wei={}, unpaid_leases=[], records_withheld={}))
    wait.until(lambda d: points(d) == 20)
    wait.until(lambda d: "agent lost" in text_of(d, "faults") and SLASH_TX in text_of(d, "slashes")
               and BIG_WEI in text_of(d, "payments"))
    faults = text_of(chromium, "faults")
    assert "lost" in faults and "agent-b" in faults and "join" in faults and "agent-c" in faults
    assert "slash" in faults and "wrong contribution" in faults
    members = [e.text for e in chromium.find_elements(By.CSS_SELECTOR, "#membership text.member")]
    assert members == [job.worker_a, worker_b, worker_c]
    marks = chromium.find_elements(By.CSS_SELECTOR, "#loss-chart line.mark")
    assert {m.get_attribute("class") for m in marks} >= {"mark lost", "mark join", "mark slash"}

    shot = tmp_path / "dashboard.png"
    assert chromium.save_screenshot(str(shot))
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 30_000
    chart = chromium.find_element(By.ID, "loss-chart").screenshot_as_png
    width, height, rows = png_pixels(chart)
    blue = sum(1 for row in rows for i in range(0, len(row) - 2, len(row) // width)
               if _near(row[i:i + 3], LOSS_BLUE))
    assert width > 300 and height > 100 and blue > 100  # the curve is on screen, in its colour
    severe = [e for e in chromium.get_log("browser") if e["level"] == "SEVERE"]
    assert not severe, severe
    print(f"dashboard test: {time.monotonic() - started:.1f} s")


def _near(pixel: bytes, colour: tuple[int, int, int]) -> bool:
    return all(abs(a - b) < 40 for a, b in zip(pixel, colour))


def test_the_page_is_served_only_when_asked_for(tmp_path):
    from shoal.coordinator import create_app

    coordinator = Coordinator(make_settings(f"sqlite:///{tmp_path}/store.db"))
    try:
        assert "/dashboard" not in {route.path for route in create_app(coordinator).routes}
    finally:
        coordinator.engine.dispose()


@pytest.mark.slow
def test_shoal_coordinator_dashboard_prints_where_it_is(tmp_path, cli_env):
    port = free_port()
    process = subprocess.Popen(
        shoal_command("coordinator", "--dashboard", "--port", str(port),
                      "--store", f"sqlite:///{tmp_path}/store.db"),
        cwd=tmp_path, env=cli_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        url = f"http://127.0.0.1:{port}/dashboard"
        for line in process.stdout:  # the line comes before the server serves
            if f"dashboard: {url}" in line:
                break
        else:
            raise AssertionError(f"no 'dashboard: {url}' line; exit {process.wait()}")
        deadline = time.monotonic() + 30
        while True:
            try:
                page = httpx.get(url, timeout=1)
                break
            except httpx.HTTPError:
                assert time.monotonic() < deadline, "the coordinator did not serve in 30 s"
                time.sleep(0.2)
        assert page.status_code == 200 and 'id="loss-chart"' in page.text
    finally:
        process.terminate()
        process.wait(timeout=30)


@pytest.mark.slow
def test_the_browser_and_the_report_compute_the_same_curves(served, chromium):
    """dashboard.js and curves.py/svg.py are two copies of one definition: same numbers."""
    from shoal.coordinator.dashboard.curves import throughput_points
    from shoal.coordinator.dashboard.svg import nice_ticks

    steps = [StepProgress(step=s, t=100.0 + s * 0.3 + (2.0 if s > 12 else 0.0), loss=None,
                          world=2, samples=8 + s % 3) for s in range(30)]
    chromium.get(f"{served.url}/dashboard")
    in_browser = chromium.execute_script("return throughput(arguments[0], 100)",
                                         [s.model_dump() for s in steps])
    in_python = throughput_points(steps, 100.0)
    assert [x for x, _ in in_browser] == pytest.approx([x for x, _ in in_python])
    assert [y for _, y in in_browser] == pytest.approx([y for _, y in in_python])
    for lo, hi in ((0.0, 1.0), (2.31, 4.07), (0.0, 73.2), (-0.5, 0.5), (1e-3, 2e-3)):
        ticks = chromium.execute_script("return niceTicks(arguments[0], arguments[1], 5)", lo, hi)
        assert ticks == pytest.approx(nice_ticks(lo, hi, 5))
