import torch

from shoal.train.guard import GuardConfig, StepGuard, Verdict

GOOD = torch.ones(4)


def test_nan_loss_or_gradient_is_skipped():
    guard = StepGuard(GuardConfig())
    assert guard.judge(2.0, GOOD)[0] is Verdict.apply
    assert guard.judge(float("nan"), GOOD)[0] is Verdict.skip
    assert guard.judge(2.0, torch.tensor([1.0, float("inf")]))[0] is Verdict.skip
    assert guard.skipped == 2


def test_spike_after_warmup_is_skipped_and_repeats_roll_back():
    guard = StepGuard(GuardConfig(warmup_steps=5, rollback_after=3))
    for _ in range(5):
        assert guard.judge(2.0, GOOD)[0] is Verdict.apply
    verdict, reason = guard.judge(7.0, GOOD)
    assert verdict is Verdict.skip and "spike" in reason
    assert guard.judge(7.0, GOOD)[0] is Verdict.skip
    assert guard.judge(7.0, GOOD)[0] is Verdict.rollback
    assert guard.rollbacks == 1
    assert guard.judge(2.1, GOOD)[0] is Verdict.apply


def test_state_round_trips():
    guard = StepGuard(GuardConfig())
    for loss in (1.0, 2.0, float("nan")):
        guard.judge(loss, GOOD)
    other = StepGuard(GuardConfig())
    other.load_state_dict(guard.state_dict())
    assert other.state_dict() == guard.state_dict()
