"""The robust aggregation rules: hand-computed cases, ties and empty shares, and
attacks: one cheat among four sends a huge or sign-flipped gradient (or NaN),
and the aggregate stays near the honest workers' mean."""

from __future__ import annotations

import json
import subprocess
import threading
import time

import pytest
import torch

from shoal.spec.job import Aggregation
from shoal.train.sync.aggregate import (Workspace, aggregate, centered_clip, distance_filter,
                                   krum_choice, median, multi_krum, trim_count, trimmed_mean)
from shoal.train.sync.exchange import GradientExchange
from shoal.train.group import GRAVEYARD, EpochGroup, GroupCancelled
from tests.conftest import shoal_command, tiny_job_toml

ROBUST = [Aggregation.trimmed_mean, Aggregation.median, Aggregation.centered_clip,
          Aggregation.multi_krum, Aggregation.distance_filter]
WHOLE_WORKER = [Aggregation.multi_krum, Aggregation.distance_filter]


def _t(*values: float) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32)


def test_trim_count_drops_a_quarter_and_at_least_one():
    assert [trim_count(n) for n in (3, 4, 5, 7, 8, 12)] == [1, 1, 1, 1, 2, 3]


def test_trimmed_mean_by_hand():
    # Per coordinate, drop the largest and the smallest of five, average the middle three.
    gradients = torch.stack([_t(1, 50), _t(2, -7), _t(3, 0), _t(4, 1), _t(100, 2)])
    assert trimmed_mean(gradients).tolist() == [3.0, 1.0]  # (2+3+4)/3, (0+1+2)/3


def test_median_by_hand_odd_and_even():
    assert median(torch.stack([_t(5, -1), _t(1, 9), _t(3, 4)])).tolist() == [3.0, 4.0]
    # Even n: the mean of the two middle values, not the lower one.
    assert median(torch.stack([_t(1), _t(2), _t(4), _t(100)])).tolist() == [3.0]


def test_ties_give_the_tied_value():
    gradients = torch.stack([_t(2, 0.0), _t(2, -0.0), _t(2, 0.0), _t(7, 0.0)])
    assert trimmed_mean(gradients).tolist() == [2.0, 0.0]
    assert median(gradients).tolist() == [2.0, 0.0]
    assert centered_clip(gradients).tolist() == [2.0, 0.0]


@pytest.mark.parametrize("n", [3, 4, 5, 6, 8, 9])
def test_coordinate_rules_match_a_full_sort_to_the_bit(n):
    # The rules read only the middle values (four workers take a shortcut: the middle
    # two without a full sort); they must give what sorting every coordinate gives,
    # NaN counted as +inf, infinities and ties included.
    generator = torch.Generator().manual_seed(n)
    gradients = torch.randn(n, 5000, generator=generator).round(decimals=1)  # many ties
    gradients[0, :50] = float("nan")
    gradients[1, 50:100] = float("inf")
    gradients[n - 1, 100:150] = -float("inf")
    ordered = torch.sort(torch.nan_to_num(gradients, nan=float("inf")), dim=0).values
    b = trim_count(n)
    expected_trimmed = ordered[b]
    for row in ordered[b + 1:n - b]:
        expected_trimmed = expected_trimmed + row
    expected_median = ordered[n // 2] if n % 2 else (ordered[n // 2 - 1] + ordered[n // 2]) / 2
    same = lambda a, e: torch.equal(a.nan_to_num(7.0), e.nan_to_num(7.0))  # noqa: E731
    assert same(trimmed_mean(gradients), expected_trimmed / (n - 2 * b))
    assert same(median(gradients), expected_median)


def test_centered_clip_by_hand_with_a_fixed_radius():
    # Start 0, τ = 1: the far worker is clipped to length 1, the near ones pass whole.
    gradients = torch.stack([_t(0.5, 0), _t(-0.5, 0), _t(0, 10)])
    out = centered_clip(gradients, start=_t(0, 0), iterations=1, tau=1.0)
    torch.testing.assert_close(out, _t(0, 1 / 3))


def test_contributions_are_normalised_by_share_and_empty_shares_take_no_part():
    # Worker gradients 1, 2, 3 and 4, folded with weights 0.1, 0.2, 0.3, 0.4; a fifth
    # worker with an empty share sends garbage, which must not count.
    weights = [0.1, 0.2, 0.3, 0.4, 0.0]
    per_worker = [1.0, 2.0, 3.0, 4.0]
    contributions = [_t(g * w) for g, w in zip(per_worker, weights)] + [_t(1e9)]
    assert aggregate(Aggregation.trimmed_mean, contributions, weights).item() == pytest.approx(2.5)
    assert aggregate(Aggregation.median, contributions, weights).item() == pytest.approx(2.5)
    assert aggregate(Aggregation.centered_clip, contributions, weights).item() == pytest.approx(2.5)


def test_krum_choice_by_hand():
    # Four workers on a line at 0, 1, 3 and 10; f = 1, so each is scored by its squared
    # distance to its nearest neighbour: 1, 1, 4, 49. The worker at 10 goes.
    gradients = torch.stack([_t(0), _t(1), _t(3), _t(10)])
    assert krum_choice(gradients) == [0, 1, 2]
    # Eight workers: f = 2, each scored over its 4 nearest, the 6 lowest kept in rank order.
    line = torch.stack([_t(v) for v in (50, 0, 1, 2, 3, 4, 5, -40)])
    assert krum_choice(line) == [1, 2, 3, 4, 5, 6]
    # Ties go to the lower rank.
    assert krum_choice(torch.stack([_t(0), _t(1), _t(2), _t(3)])) == [0, 1, 2]


def test_multi_krum_is_the_share_weighted_mean_of_the_kept_workers():
    # Per-worker gradients 1, 2, 3 and a far-off 40 with unequal shares (and a fifth,
    # empty share sending garbage): the kept three count by their shares.
    weights = [0.1, 0.2, 0.3, 0.4, 0.0]
    per_worker = [1.0, 2.0, 3.0, 40.0]
    contributions = [_t(g * w) for g, w in zip(per_worker, weights)] + [_t(1e9)]
    out = aggregate(Aggregation.multi_krum, contributions, weights)
    assert out.item() == pytest.approx((0.1 * 1 + 0.2 * 2 + 0.3 * 3) / 0.6)
    assert multi_krum(torch.stack([_t(1), _t(2), _t(3)]), [0.5, 0.25, 0.25], f=0).item() == \
        pytest.approx(1.75)


def test_distance_filter_by_hand():
    # Workers at 0, 1, 3 and 10: median 2, distances 2, 1, 1, 8, their median 1.5, so the
    # radius is 3 and the worker at 10 goes; weights 0.1, 0.2, 0.3 count for the rest.
    gradients = torch.stack([_t(0), _t(1), _t(3), _t(10)])
    assert distance_filter(gradients, [0.1, 0.2, 0.3, 0.4]).item() == \
        pytest.approx((0.2 * 1 + 0.3 * 3) / 0.6)
    # Nothing finite to keep: the (non-finite) median, which the guard then refuses.
    nan = torch.stack([_t(float("nan"))] * 2 + [_t(1), _t(2)])
    assert not torch.isfinite(distance_filter(nan, [0.25] * 4)).all()


@pytest.mark.parametrize("rule", WHOLE_WORKER)
@pytest.mark.parametrize("attack", ["sign_flip_scaled", "huge", "nan", "inf"])
def test_whole_worker_rules_leave_the_attacker_out_whole(rule, attack):
    # The cheat's move: any far-off vector at rank 1. Its outcome: the step is exactly
    # the other three workers' mean, as if it had sent nothing.
    truth, honest = _honest(3)
    cheat = {"sign_flip_scaled": -10 * honest[0], "huge": torch.full_like(truth, 1e6),
             "nan": torch.full_like(truth, float("nan")),
             "inf": torch.full_like(truth, float("inf"))}[attack]
    per_worker = [honest[0], cheat, honest[1], honest[2]]
    if rule is Aggregation.multi_krum:
        assert krum_choice(torch.stack(per_worker)) == [0, 2, 3]
    out = aggregate(rule, [g * 0.25 for g in per_worker], [0.25] * 4)
    torch.testing.assert_close(out, honest.mean(0))


@pytest.mark.parametrize("rule", WHOLE_WORKER)
def test_whole_worker_rules_weigh_the_kept_workers_by_share(rule):
    _, honest = _honest(3)
    weights = [0.4, 0.2, 0.1, 0.3]
    per_worker = [honest[0], 1e3 * torch.ones_like(honest[0]), honest[1], honest[2]]
    out = aggregate(rule, [g * w for g, w in zip(per_worker, weights)], weights)
    expected = (0.4 * honest[0] + 0.1 * honest[1] + 0.3 * honest[2]) / 0.8
    torch.testing.assert_close(out, expected)


def test_distance_filter_without_attacker_keeps_every_worker():
    # Unlike Multi-Krum it costs no honest samples: four honest workers, even with
    # shares of 1 : 2 : 2 : 3 (noise shrinking with the share), all stay.
    truth = torch.randn(4000, generator=torch.Generator().manual_seed(1))
    noise = torch.randn(4, 4000, generator=torch.Generator().manual_seed(2))
    weights = [0.125, 0.25, 0.25, 0.375]
    per_worker = [truth + noise[i] / (8 * w) ** 0.5 for i, w in enumerate(weights)]
    contributions = [g * w for g, w in zip(per_worker, weights)]
    out = aggregate(Aggregation.distance_filter, contributions, weights)
    torch.testing.assert_close(out, aggregate(Aggregation.mean, contributions, weights))


def test_multi_krum_without_attacker_drops_f_honest_workers():
    # The cost of the rule when nobody cheats: f workers' samples are left out each step.
    _, honest = _honest(8)
    assert len(krum_choice(honest[:4])) == 3 and len(krum_choice(honest)) == 6
    assert len(krum_choice(honest[:3])) == 2


@pytest.mark.parametrize("rule", ROBUST)
def test_two_workers_or_fewer_fall_back_to_the_weighted_mean(rule):
    weights = [0.25, 0.75, 0.0]
    contributions = [_t(0.25 * 4.0), _t(0.75 * 8.0), _t(123.0)]
    assert aggregate(rule, contributions, weights).item() == 0.25 * 4.0 + 0.75 * 8.0
    assert aggregate(rule, [_t(3.0)], [1.0]).item() == 3.0


def _honest(n: int, size: int = 4000, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """n noisy honest gradients around a common mean gradient (per-worker mean gradients)."""
    generator = torch.Generator().manual_seed(seed)
    truth = torch.randn(size, generator=generator)
    return truth, truth + 0.5 * torch.randn(n, size, generator=generator)


@pytest.mark.parametrize("rule", ROBUST)
@pytest.mark.parametrize("attack", ["sign_flip_scaled", "huge", "nan"])
def test_one_attacker_among_four_cannot_move_the_step_far(rule, attack):
    truth, honest = _honest(3)
    honest_mean = honest.mean(0)
    cheat = {"sign_flip_scaled": -10 * honest[0], "huge": torch.full_like(truth, 1e6),
             "nan": torch.full_like(truth, float("nan"))}[attack]
    per_worker = [honest[0], cheat, honest[1], honest[2]]  # the cheat at rank 1
    out = aggregate(rule, [g * 0.25 for g in per_worker], [0.25] * 4)
    plain = aggregate(Aggregation.mean, [g * 0.25 for g in per_worker], [0.25] * 4)

    assert torch.isfinite(out).all()
    # Far closer to the honest mean than the honest gradients' own spread...
    spread = (honest - honest_mean).norm(dim=1).mean()
    assert (out - honest_mean).norm() < spread
    # ...still pointing where the honest workers point, while the plain mean is lost.
    cosine = torch.nn.functional.cosine_similarity(out, truth, dim=0)
    assert cosine > 0.8
    if attack != "nan":
        assert torch.nn.functional.cosine_similarity(plain, truth, dim=0) < 0.1 or \
            (plain - honest_mean).norm() > 10 * spread


@pytest.mark.parametrize("rule", ROBUST)
def test_no_attacker_stays_close_to_the_mean(rule):
    truth, honest = _honest(4)
    out = aggregate(rule, [g * 0.25 for g in honest], [0.25] * 4)
    assert torch.nn.functional.cosine_similarity(out, honest.mean(0), dim=0) > 0.95


@pytest.mark.parametrize("rule", ROBUST)
def test_the_same_bits_whatever_the_thread_count(rule):
    _, honest = _honest(4, size=100_000)
    contributions = [g * 0.25 for g in honest]
    threads = torch.get_num_threads()
    try:
        results = []
        for count in (1, 3, 8):
            torch.set_num_threads(count)
            results.append(aggregate(rule, contributions, [0.25] * 4))
    finally:
        torch.set_num_threads(threads)
    assert all(torch.equal(results[0], r) for r in results[1:])


def test_a_reused_workspace_gives_the_bits_of_a_fresh_one():
    """The exchange keeps one workspace for every step: nothing a rule leaves in it may
    leak into the next call, whatever the number of workers, size or inputs."""
    generator = torch.Generator().manual_seed(3)
    workspace = Workspace()
    for n, size in [(4, 300_001), (6, 9_000), (4, 20_000), (3, 8_192), (9, 300), (5, 140_000)]:
        gradients = [torch.randn(size, generator=generator) * (1 + i) for i in range(n)]
        gradients[1] = gradients[1] * -10  # a cheat far off
        gradients[0][:3] = torch.tensor([float("nan"), float("inf"), -float("inf")])
        weights = [1 / n] * n
        contributions = [g * w for g, w in zip(gradients, weights)]
        for rule in ROBUST:
            fresh = aggregate(rule, contributions, weights)
            out = torch.full((size,), 7.0)
            reused = aggregate(rule, contributions, weights, workspace, out=out)
            assert reused is out
            assert torch.equal(fresh.view(torch.int32), reused.view(torch.int32)), (rule, n, size)


@pytest.mark.parametrize("rule", ROBUST)
def test_the_same_bits_whatever_the_slicing(rule, monkeypatch):
    """The rules walk the coordinates a slice at a time; where the slices fall must not
    change a bit (slices of one norm block, and a size that ends in a partial block)."""
    import shoal.train.sync.aggregate as module

    _, honest = _honest(5, size=3 * module._ROW + 123)
    contributions = [g * 0.2 for g in honest]
    contributions[2] = contributions[2] * -10
    whole = aggregate(rule, contributions, [0.2] * 5)
    monkeypatch.setattr(module, "_SLICE", module._ROW)
    sliced = aggregate(rule, contributions, [0.2] * 5, Workspace())
    assert torch.equal(whole.view(torch.int32), sliced.view(torch.int32))


def test_aggregate_writes_into_a_bf16_out_as_a_cast_would():
    generator = torch.Generator().manual_seed(4)
    contributions = [(torch.randn(1000, generator=generator) / 4).bfloat16() for _ in range(4)]
    out = torch.empty(1000, dtype=torch.bfloat16)
    for rule in ROBUST:
        expected = aggregate(rule, contributions, [0.25] * 4)
        assert expected.dtype == torch.bfloat16
        assert torch.equal(aggregate(rule, contributions, [0.25] * 4, Workspace(), out=out), expected)


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))


def test_exchange_combine_aggregates_gradients_and_sums_the_scalar_tail():
    world = 4
    buffers = []
    for rank in range(world):
        exchange = GradientExchange(list(_model().parameters()), groups=1,
                                    aggregation=Aggregation.median)
        exchange.fresh(world)
        for p in exchange.params:
            p.grad = torch.full_like(p, float(rank if rank != 1 else -1000))
        exchange.fold(1 / world)
        exchange.write_scalars(rank, [0.1], True, 2.0, 3, (rank + 1, 7))
        buffers.append([t.clone() for t in exchange.tensors()])  # what the gather returns
    gathered = [[b[i] for b in buffers] for i in range(len(buffers[0]))]
    exchange.combine(gathered, [1 / world] * world)
    exchange.install()
    # Honest per-worker gradients 0, 2, 3 and a cheat's -1000: the median is 1.
    assert all(torch.equal(p.grad, torch.ones_like(p)) for p in exchange.params)
    scalars = exchange.read_scalars()
    assert scalars.fingerprints == tuple((r + 1) << 24 | 7 for r in range(world))
    assert scalars.mean_loss == 8.0 / 12 and scalars.lrs[0] == pytest.approx(0.1)


def test_mean_exchange_does_not_gather():
    exchange = GradientExchange(list(_model().parameters()), groups=1)
    assert not exchange.gathers
    assert GradientExchange(list(_model().parameters()), groups=1,
                            aggregation=Aggregation.centered_clip).gathers


def _groups(world: int, timeout_s: float = 5.0) -> list[EpochGroup]:
    """`world` gloo ranks in threads of this process, on one in-memory store."""
    import torch.distributed as dist

    store, made = dist.HashStore(), [None] * world

    def build(rank: int) -> None:
        made[rank] = EpochGroup.build(store, 0, rank, world, backend="gloo", timeout_s=timeout_s,
                                      poll_s=0.01, should_cancel=lambda: False)

    threads = [threading.Thread(target=build, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return made


def _let_die(groups: list[EpochGroup]) -> None:
    """Abandon the groups and wait until the graveyard has let them go (a gloo group
    still alive when the interpreter exits aborts it)."""
    for group in groups:
        group.abandon()
    deadline = time.monotonic() + 10
    while GRAVEYARD.size() and time.monotonic() < deadline:
        time.sleep(0.05)


def test_all_gather_returns_every_rank_in_rank_order_in_tensors_of_its_own():
    world, results = 3, {}
    groups = _groups(world)

    def gather(rank: int) -> None:
        mine = [torch.full((5,), float(rank)), torch.full((2,), 10.0 + rank, dtype=torch.bfloat16)]
        results[rank] = (mine, groups[rank].all_gather(mine, lambda: False))

    threads = [threading.Thread(target=gather, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for rank, (mine, gathered) in results.items():
        assert [c[0].item() for c in gathered[0]] == [0.0, 1.0, 2.0]
        assert [c[0].item() for c in gathered[1]] == [10.0, 11.0, 12.0]
        assert all(c.dtype == torch.bfloat16 for c in gathered[1])
        assert not any(c.data_ptr() == m.data_ptr() for m in mine for out in gathered for c in out)
    _let_die(groups)


def test_all_gather_reuses_its_outputs_within_a_group_only():
    world, results = 2, {}
    groups = _groups(world)

    def gather(rank: int) -> None:
        first = groups[rank].all_gather([torch.full((4,), float(rank))], lambda: False)
        values = [c.clone() for c in first[0]]
        second = groups[rank].all_gather([torch.full((4,), 10.0 + rank)], lambda: False)
        results[rank] = (values, first, second)

    threads = [threading.Thread(target=gather, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for values, first, second in results.values():
        assert [v[0].item() for v in values] == [0.0, 1.0]
        assert [c[0].item() for c in second[0]] == [10.0, 11.0]
        assert [c.data_ptr() for c in first[0]] == [c.data_ptr() for c in second[0]]
    pointers = {c.data_ptr() for _, _, second in results.values() for c in second[0]}
    assert len(pointers) == 2 * world  # each rank's group holds its own outputs
    _let_die(groups)


def test_all_gather_gives_up_when_membership_changes():
    groups = _groups(2)
    with pytest.raises(GroupCancelled):  # rank 1 has not joined the gather; a new epoch is out
        groups[0].all_gather([torch.ones(3)], should_cancel=lambda: True)
    groups[0].abandon()  # the pending gather and its buffers go to the graveyard
    # Rank 1 arrives late: the abandoned gather completes on gloo's threads.
    late = groups[1].all_gather([torch.zeros(3)], should_cancel=lambda: False)
    assert [c.tolist() for c in late[0]] == [[1.0] * 3, [0.0] * 3]
    _let_die(groups[1:])


def _train(tmp_path, cli_env, name: str, rule: str, *extra: str) -> dict:
    job = tmp_path / f"{name}.toml"
    job.write_text(tiny_job_toml(tmp_path / f"ckpt-{name}", interval_steps=50, steps=80,
                                 aggregation=rule))
    report = tmp_path / f"{name}.json"
    subprocess.run(shoal_command("train", str(job), "-q", "--workers", "4", "--replica-check-every",
                                 "1", "--run-dir", str(tmp_path / f"run-{name}"),
                                 "--report", str(report), *extra),
                   check=True, env=cli_env, capture_output=True, timeout=300)
    return json.loads(report.read_text())


@pytest.mark.slow
def test_trimmed_mean_trains_through_a_sign_flipping_worker_that_wrecks_the_mean(tmp_path, cli_env):
    attack = ("--adversary", "1=sign_flip_scaled")  # worker 1 sends -10x its gradient, every step
    honest = _train(tmp_path, cli_env, "honest", "mean")
    robust = _train(tmp_path, cli_env, "robust", "trimmed_mean", *attack)
    plain = _train(tmp_path, cli_env, "plain", "mean", *attack)

    assert robust["steps"] == 80 and robust["replica_checks"] >= 80
    assert robust["replica_mismatches"] == 0
    assert robust["val_loss"] < honest["val_loss"] + 0.25
    assert plain["val_loss"] > honest["val_loss"] + 2.0
