"""`shoal report RUN_DIR`: a demo's report.json becomes one HTML page whose
plots and tables show every fault, provider and anchor; a directory without
a report is one line and a non-zero exit."""

from __future__ import annotations

import re
import subprocess

from shoal.spec.demo import (
    AnchorReport, DemoReport, EfficiencyReport, FaultReport, ProviderReport, SlashReport,
)
from shoal.spec.progress import MembershipChange, StepProgress
from tests.conftest import shoal_command

T0 = 1_790_000_000.0
BIG_WEI = 2**64 + 1  # a browser's JSON.parse would round it; the page must not


def demo_report() -> DemoReport:
    names = ("box-a", "box-b", "box-c", "box-d")
    addresses = [f"0x{i:040x}" for i in range(1, 5)]
    # A step a second, two seconds a step while box-b's loss is noticed (steps 20-24).
    t = [T0 + 5 + s + min(max(s - 20, 0), 5) for s in range(60)]
    progress = tuple(StepProgress(step=s, t=t[s], loss=5.0 - s / 20, world=3, samples=24)
                     for s in range(60))
    membership = (
        MembershipChange(t=T0 + 4, epoch=1, members=("box-a-l1-w0", "box-b-l2-w0", "box-c-l3-w0")),
        MembershipChange(t=T0 + 25, epoch=2, members=("box-a-l1-w0", "box-c-l3-w0"),
                         reason="box-b lost"),
        MembershipChange(t=T0 + 31, epoch=3, members=("box-a-l1-w0", "box-c-l3-w0", "box-d-l4-w0"),
                         reason="joined"),
    )
    faults = (
        FaultReport(kind="kill", provider="box-b", at_s=24.0, recovery_s=3.5, steps_lost=1,
                    detail="SIGKILL, no notice"),
        FaultReport(kind="preemption", provider="box-c", at_s=40.0, recovery_s=None, steps_lost=0),
        FaultReport(kind="join", provider="box-d", at_s=30.0, recovery_s=1.0, steps_lost=0),
        FaultReport(kind="cheat", provider="box-d", at_s=50.0, recovery_s=2.0, steps_lost=0,
                    detail="sign_flip caught at epoch 4"),
    )
    providers = tuple(ProviderReport(
        name=name, address=address, tenancy="spot", price_wei_per_s=10**9,
        speed_samples_per_s=30.0, leased_s=60.0, steps=50, paid_wei=0 if name == "box-d" else BIG_WEI,
        slashed_wei=10**18 if name == "box-d" else 0, cheated=name == "box-d")
        for name, address in zip(names, addresses))
    return DemoReport(
        scenario="four providers, a kill, a notice, a cheat", job_id="job-7", chain_job=3,
        started_at=T0, wall_s=70.0, steps=60, val_loss=2.31, samples_skipped=0,
        samples_duplicated=24, faults=faults,
        slashes=(SlashReport(provider="box-d", address=addresses[3], amount_wei=10**18,
                             tx="0x" + "ab" * 32, why="wrong contribution at step 41"),),
        providers=providers, eta_het=0.93,
        ef=EfficiencyReport(time=1.4, cost=2.1, static_wall_s=98.0, static_cost_wei=3 * 10**15,
                            measured=True, how="the same job on 3 on-demand devices"),
        budget_wei=10**20, spent_wei=3 * BIG_WEI, refunded_wei=10**20 - 3 * BIG_WEI,
        conserved=True, store_chain_agree=True, gas={"settle": 210_000, "anchor": 48_000},
        anchors=(AnchorReport(epoch=0, root="0x" + "11" * 32, tx="0x" + "cd" * 32),
                 AnchorReport(epoch=1, root="0x" + "22" * 32, tx="0x" + "ef" * 32)),
        progress=progress, membership=membership, verdicts={"honest": 7, "wrong_contribution": 1})


def test_report_renders_the_plots_and_every_fault_provider_and_anchor(tmp_path, cli_env):
    report = demo_report()
    (tmp_path / "report.json").write_text(report.model_dump_json())
    done = subprocess.run(shoal_command("report", str(tmp_path)), capture_output=True, text=True,
                          env=cli_env, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(tmp_path / "report.html")
    page = (tmp_path / "report.html").read_text()

    assert "<script" not in page and "http://" not in page.replace('xmlns="http://www.w3.org', "")
    loss = re.search(r'<path id="loss-path"[^>]* data-points="(\d+)" d="([^"]*)"', page)
    assert loss and int(loss.group(1)) == 60 and loss.group(2).count("L") == 59
    assert re.search(r'<path id="throughput-path"[^>]* d="M[^"]+L', page)
    assert page.count('<rect class="bar"') == 4  # box-a, box-b, box-c, box-d: one span each
    for fault in report.faults:
        assert f'<line class="mark {fault.kind}"' in page  # marked on the curves
        assert f'<span class="kind {fault.kind}">{fault.kind}</span>' in page  # and listed
    assert "not recovered" in page and "sign_flip caught at epoch 4" in page
    for provider in report.providers:
        assert provider.name in page and provider.address in page
    assert str(BIG_WEI) in page  # exact, past 2^53
    for anchor in report.anchors:
        assert anchor.root in page and anchor.tx in page
    assert report.slashes[0].tx in page and "wrong contribution at step 41" in page
    assert "settle" in page and "210000" in page and "yes, to the wei" in page
    assert "the chain booked what the store metered" in page


def test_report_out_path_and_an_unrendered_run(tmp_path, cli_env):
    out = tmp_path / "elsewhere.html"
    (tmp_path / "report.json").write_text(demo_report().model_copy(
        update={"progress": (), "membership": (), "faults": (), "anchors": (), "ef": None,
                "eta_het": None, "conserved": False, "store_chain_agree": False}).model_dump_json())
    done = subprocess.run(shoal_command("report", str(tmp_path), "--out", str(out)),
                          capture_output=True, text=True, env=cli_env, timeout=60)
    assert done.returncode == 0, done.stderr
    page = out.read_text()
    assert "no membership epochs recorded" in page and page.count('class="bad">NO') == 2
    assert not (tmp_path / "report.html").exists()


def test_a_missing_or_invalid_report_is_one_line(tmp_path, cli_env):
    done = subprocess.run(shoal_command("report", str(tmp_path)), capture_output=True, text=True,
                          env=cli_env, timeout=60)
    assert done.returncode != 0
    assert done.stderr.strip().count("\n") == 0 and "report.json not found" in done.stderr

    (tmp_path / "report.json").write_text('{"scenario": "half a report"}')
    done = subprocess.run(shoal_command("report", str(tmp_path)), capture_output=True, text=True,
                          env=cli_env, timeout=60)
    assert done.returncode != 0
    assert done.stderr.strip().count("\n") == 0 and "is not a demo report" in done.stderr
    assert not (tmp_path / "report.html").exists()
