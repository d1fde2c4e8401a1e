"""`shoal demo --quick` end to end, as `make demo` runs it but shorter: the
report's invariants, not its timings."""

from __future__ import annotations

import json
import subprocess

import pytest

from shoal.spec.demo import DemoReport
from tests.conftest import shoal_command


@pytest.mark.slow
def test_the_quick_demo_recovers_every_fault_slashes_the_cheat_and_conserves_eth(tmp_path, cli_env):
    run_dir, report_path = tmp_path / "run", tmp_path / "report.json"
    done = subprocess.run(shoal_command("demo", "--quick", "--no-live", "--run-dir", str(run_dir),
                                        "--report", str(report_path)),
                          env=cli_env, capture_output=True, text=True, timeout=900)
    logs = "\n".join(f"--- {p.name}\n{p.read_text()[-2000:]}"
                     for p in sorted((run_dir / "logs").glob("*.log")))
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:] + logs
    report = DemoReport.model_validate_json(report_path.read_text())
    assert json.loads((run_dir / "report.json").read_text()) == json.loads(report_path.read_text())

    assert report.steps == 300 and report.val_loss is not None
    assert (report.samples_skipped, report.samples_duplicated) == (0, 0)
    kinds = {f.kind for f in report.faults}
    assert {"preemption", "kill", "join", "cheat"} <= kinds, report.faults
    for fault in report.faults:
        if fault.kind != "join":
            assert (fault.recovery_s is not None or fault.after_end) and fault.steps_lost == 0, fault
    (cheat,) = [p for p in report.providers if p.cheated]
    assert [s.provider for s in report.slashes] == [cheat.name]
    assert cheat.paid_wei == 0 and cheat.slashed_wei > 0
    honest = [p for p in report.providers if not p.cheated and p.steps]
    assert honest and all(p.paid_wei > 0 and p.slashed_wei == 0 for p in honest)
    assert report.conserved and report.store_chain_agree
    assert sum(p.paid_wei for p in report.providers) <= report.spent_wei < report.budget_wei
    assert report.anchors and all(a.tx for a in report.anchors)
    assert report.ef is not None and not report.ef.measured  # EF > 1 is the full demo's figure
    assert sum(report.gas.values()) > 0 and report.verdicts.get("wrong_contribution", 0) >= 1
    assert report.rechecked > 0 and report.verifier_slashes == ()  # an honest verifier
