"""Faults are parsed once into the value a worker's run carries: each worker gets
its own entries and the job-wide ones, and a once-only fault fires in one process."""

from shoal.train.inject import InjectedFaults, StepFault

SPEC = "nan-loss@w1:step3-5, hang@w1:step9:2.5, diverge@w2:step4, exchange-delay:0.25," \
       "die-sending-state@once"


def test_each_worker_gets_its_own_faults_and_the_jobs():
    w1, w2 = InjectedFaults.parse(SPEC, "w1"), InjectedFaults.parse(SPEC, "w2")
    assert [w1.loss_is_nan(s) for s in (2, 3, 5, 6)] == [False, True, True, False]
    assert w1.hang == (StepFault(9, 9, "2.5"),) and not w1.diverge
    assert not any(w2.loss_is_nan(s) for s in range(10)) and w2.diverge == (StepFault(4, 4, ""),)
    assert w1.exchange_delay_s == w2.exchange_delay_s == 0.25
    assert InjectedFaults.parse("", "w1") == InjectedFaults(worker="w1")  # injects nothing


def test_a_once_only_fault_fires_in_the_first_process_to_claim_it(tmp_path):
    first = InjectedFaults.parse(SPEC, "w1", tmp_path)
    second = InjectedFaults.parse(SPEC, "w2", tmp_path)
    assert not first.dies_sending_state(0)  # a fresh start's broadcast is no hand-over
    assert first.dies_sending_state(7) and not second.dies_sending_state(7)
