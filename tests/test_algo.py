"""The pure AT-GRPO functions: advantages, groups, filters, the clipped loss."""

import math

import pytest
import torch

from mas_lab.algo import Candidate, GroupError, build_groups, clipped_policy_loss, filter_groups, grpo_advantages


def cand(index, reward, problem="p", role="r", turn=0, prompt=(1, 2, 3)):
    return Candidate(problem, role, turn, index, "shared", list(prompt), [9], "x", reward, 0.0, reward)


def test_advantages_sum_to_zero_and_are_standardised():
    adv = grpo_advantages([0.0, 1.0, 0.5, 0.25])
    assert abs(sum(adv)) < 1e-9
    std = math.sqrt(sum(a * a for a in adv) / 3)
    assert std == pytest.approx(1.0, abs=1e-5)
    assert adv[1] == max(adv) and adv[0] == min(adv)


def test_zero_std_group_gets_zero_advantages():
    assert grpo_advantages([0.3] * 4) == [0.0] * 4


def test_build_groups_accepts_a_valid_group():
    groups = build_groups([cand(i, i) for i in range(4)], k=4)
    assert len(groups) == 1 and [m.index for m in groups[0].members] == [0, 1, 2, 3]


@pytest.mark.parametrize(
    "members,match",
    [
        ([cand(i, 0) for i in range(3)], "has 3 members"),
        ([cand(0, 0), cand(1, 0), cand(1, 0), cand(2, 0)], "duplicated"),
        ([cand(0, 0), cand(1, 0), cand(2, 0), cand(3, 0, prompt=(7,))], "mixes prompts"),
    ],
)
def test_build_groups_rejects_broken_groups(members, match):
    with pytest.raises(GroupError, match=match):
        build_groups(members, k=4)


def test_zero_std_filter_reports_what_it_dropped():
    flat = [cand(i, 1.0, problem="a") for i in range(2)]
    varied = [cand(i, float(i), problem="b") for i in range(2)]
    groups = build_groups(flat + varied, k=2)
    kept, report = filter_groups(groups, "zero_std")
    assert [g.key[0] for g in kept] == ["b"]
    assert (report.kept_groups, report.dropped_groups, report.dropped_samples) == (1, 1, 2)
    kept, report = filter_groups(groups, "none")
    assert len(kept) == 2 and report.dropped_groups == 0


def test_loss_equals_minus_token_mean_advantage_when_ratio_is_one():
    logp = torch.tensor([[-1.0, -2.0, 0.0], [-0.5, 0.0, 0.0]], requires_grad=True)
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    adv = torch.tensor([2.0, -1.0])
    loss, stats = clipped_policy_loss(logp, logp.detach(), adv, mask)
    assert float(loss.detach()) == pytest.approx(-(2 + 2 - 1) / 3)
    assert stats == {"clipped_tokens": 0.0, "tokens": 3.0, "ratio_sum": 3.0, "ratio_min": 1.0, "ratio_max": 1.0}
    loss.backward()
    # d loss / d logp = -A / tokens on response tokens, 0 on masked tokens
    assert torch.allclose(logp.grad, torch.tensor([[-2 / 3, -2 / 3, 0.0], [1 / 3, 0.0, 0.0]]))


def test_clipping_stops_the_gradient_outside_the_trust_region():
    logp_old = torch.zeros(1, 2)
    logp = torch.log(torch.tensor([[1.5, 0.5]])).requires_grad_(True)
    mask = torch.ones(1, 2)
    loss, stats = clipped_policy_loss(logp, logp_old, torch.tensor([1.0]), mask, eps_low=0.2, eps_high=0.2)
    loss.backward()
    # ratio 1.5 with A > 0 is clipped (no gradient); ratio 0.5 with A > 0 is not (min picks it)
    assert logp.grad[0, 0] == 0.0 and logp.grad[0, 1] != 0.0
    assert stats["clipped_tokens"] == 2.0


def test_dual_clip_caps_negative_advantage_loss():
    logp = torch.log(torch.tensor([[10.0]]))
    loss, _ = clipped_policy_loss(logp, torch.zeros(1, 1), torch.tensor([-1.0]), torch.ones(1, 1), dual_clip=3.0)
    assert float(loss) == pytest.approx(3.0)
    loss, _ = clipped_policy_loss(logp, torch.zeros(1, 1), torch.tensor([-1.0]), torch.ones(1, 1))
    assert float(loss) == pytest.approx(10.0)


def test_seq_mean_token_mean_weights_sequences_equally():
    logp = torch.zeros(2, 3)
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    adv = torch.tensor([1.0, 4.0])
    token, _ = clipped_policy_loss(logp, logp, adv, mask, agg="token_mean")
    seq, _ = clipped_policy_loss(logp, logp, adv, mask, agg="seq_mean_token_mean")
    assert float(token) == pytest.approx(-(3 * 1 + 4) / 4)
    assert float(seq) == pytest.approx(-(1 + 4) / 2)


def test_micro_batches_accumulate_to_the_full_batch_loss():
    torch.manual_seed(0)
    logp = torch.randn(4, 5)
    old = logp + 0.1 * torch.randn(4, 5)
    mask = (torch.rand(4, 5) > 0.3).float()
    adv = torch.randn(4)
    full, _ = clipped_policy_loss(logp, old, adv, mask)
    tokens = float(mask.sum())
    parts = [
        clipped_policy_loss(logp[i : i + 2], old[i : i + 2], adv[i : i + 2], mask[i : i + 2], normalizer=tokens)[0]
        for i in (0, 2)
    ]
    assert float(sum(parts)) == pytest.approx(float(full), rel=1e-6)
