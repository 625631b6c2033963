"""The per-step diagnostics, computed from hand-made groups."""

import pytest

from mas_lab.algo import Candidate, build_groups, grpo_advantages
from mas_lab.training.diagnostics import diagnostics


def candidate(index, turn, team, length, truncated=False, entropy=1.0, role="planner"):
    return Candidate(
        problem_id="p",
        role=role,
        turn=turn,
        index=index,
        policy="shared",
        prompt_ids=[1, 2],
        response_ids=list(range(length)),
        response="x",
        reward=team,
        team=team,
        local=0.0,
        entropy=entropy,
        truncated=truncated,
    )


def test_diagnostics_of_a_step():
    mixed = [candidate(0, 0, 1.0, 4, entropy=2.0), candidate(1, 0, 0.0, 8, truncated=True, entropy=1.0)]
    failed = [candidate(0, 1, 0.0, 2), candidate(1, 1, 0.0, 2)]
    groups = build_groups(mixed + failed, 2)
    for group in groups:
        group.set_advantages(grpo_advantages(group.rewards))
    out = diagnostics(groups, [g for g in groups if g.key.turn == 0])
    assert out["response_len/shared"] == pytest.approx(4.0) and out["response_len_max/shared"] == 8.0
    assert out["truncated_frac/shared"] == pytest.approx(0.25)
    assert out["entropy/shared"] == pytest.approx((2.0 * 4 + 1.0 * 8 + 1.0 * 2 + 1.0 * 2) / 16)
    assert (
        out["adv_pos_frac/shared"] == 0.5 and out["adv_neg_frac/shared"] == 0.5 and out["adv_zero_frac/shared"] == 0.0
    )
    assert out["groups_mixed/planner/t0"] == 1.0 and out["groups_all_fail/planner/t1"] == 1.0
    assert out["groups_all_success/planner/t1"] == 0.0


def test_trajectory_groups_count_trajectories_not_actions():
    """K trajectories that all end solved (their first actions left the team at 0.5): the group is
    all-success. Counting actions made it 0.0 for every trajectory group."""
    from mas_lab.algo import build_trajectory_groups

    trajectories = [("p", [candidate(0, 0, 0.5, 2, role="tool"), candidate(0, 0, 1.0, 2)]) for _ in range(4)]
    groups = build_trajectory_groups(trajectories, 4)
    out = diagnostics(groups, groups)
    assert out["groups_all_success/*"] == 1.0 and out["groups_mixed/*"] == 0.0
    failing = [("p", [candidate(0, 0, 0.5, 2, role="tool"), candidate(0, 0, 0.5, 2)]) for _ in range(3)]
    out = diagnostics(build_trajectory_groups(trajectories[:1] + failing, 4), [])
    assert out["groups_mixed/*"] == 1.0
