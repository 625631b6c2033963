"""Credit assignment: which samples share a baseline, and how each sample's advantage is formed
from the rewards of its group. One pure function per method (`algorithm.advantage`); all work on
the same rollouts (the tree's K candidates per (problem, agent, turn), or K independent trajectories
per problem), so the methods can be compared on identical data. Formulas: docs/algorithm.md.

- `at_grpo` (default): the paper's Eq. 3 in its groups (problem, agent, turn) under tree sampling,
  (problem) under trajectory-level GRPO: A = (r - mean) / (std + eps).
- `rloo`: the same groups, each sample against the mean of its K - 1 siblings (leave-one-out).
- `dr_mas`: Dr. MAS (Feng et al. 2026, arXiv 2602.08847; langfengQ/DrMAS `group_by_agent_id`):
  rewards normalised per agent: the group is (problem, agent), every sample of that agent on the
  problem with its own reward, so an agent whose rewards live on another scale than its teammates'
  is not rescaled by theirs. On the tree, AT-GRPO's groups are already per agent; Dr. MAS then
  differs only by pooling an agent's turns of a problem into one group.
- `pooled`: every sample of a problem in one group, each with its own reward, whatever agent or
  turn it came from: GRPO over a multi-agent rollout without per-agent groups (verl's grpo with
  `group_by_agent_id` off), the normalisation Dr. MAS replaces. dr_mas against pooled, in a
  trajectory mode, is the comparison Dr. MAS makes; on the tree AT-GRPO's groups are already per
  agent, so dr_mas there tests only the pooling of an agent's turns.
- `gigpo`: GiGPO (Feng et al. 2025, arXiv 2505.10978), trajectory modes only: the episode
  advantage of trajectory GRPO (Eq. 3 there; `gigpo_episode`: the trajectory's mean per-action
  reward, mas-lab's variant, or the episode's outcome, GiGPO's) plus `step_weight` times a step advantage within
  step groups, the samples of one problem's K trajectories that met the identical observation
  (anchor states: same role and prompt), normalising each sample's discounted return from its
  action on, G_t = r_t + gamma * G_{t+1} along its trajectory's actions (`step_gamma`;
  verl-agent's `compute_step_discounted_returns`).
- `counterfactual`: C3 (Chen et al. 2026, arXiv 2603.06859) on the tree: each candidate's branch
  is continued to the end of its episode by the current policy, greedily (episodes.py,
  counterfactual_outcomes), and its credit is alpha * the continued branch's final team value plus
  its own local reward (Eq. 4 with the team term read at the episode's end; `counterfactual_credit:
  outcome` drops the local reward, C3's terminal-only signal), against the mean of
  its K - 1 siblings' (leave-one-out), in AT-GRPO's groups. Where it departs from C3: one greedy
  continuation per candidate rather than sampled replays under a frozen behaviour policy, and
  the alternatives are the tree's own K candidates, which also pick the live branch.
"""

from __future__ import annotations

from collections import defaultdict

from mas_lab.algo.advantage import grpo_advantages, rloo_advantages
from mas_lab.algo.groups import ALL_TURNS, Candidate, Group, GroupKey, build_groups, build_trajectory_groups

METHODS = ("at_grpo", "rloo", "dr_mas", "pooled", "gigpo", "counterfactual")
OUTCOME = "counterfactual"  # the reward component holding a candidate's counterfactual credit


def assign_advantages(
    trajectories: list[tuple[str, list[Candidate]]],
    k: int,
    eps: float,
    tree: bool,
    method: str = "at_grpo",
    step_weight: float = 1.0,
    role_k: dict[str, int] | None = None,
    step_gamma: float = 0.95,
    tie_tol: float = 0.0,
    *,
    gigpo_episode: str = "mean",
    outcomes: list[float] | None = None,
) -> list[Group]:
    """Build the groups `method` needs from a step's trajectories (problem id, its candidates in
    order), check them, and set every candidate's advantage. Returns the groups that carry the
    baselines: the ones the filter and the store see. Rewards within `tie_tol` of each other
    count as tied (zero advantages). `outcomes`: each trajectory's episode outcome (its final team
    reward), what gigpo's episode term normalises with `gigpo_episode` "outcome"."""
    candidates = [c for _, unit in trajectories for c in unit]
    if method not in METHODS:
        raise ValueError(f"unknown advantage method '{method}'; allowed: {list(METHODS)}")
    if method == "gigpo" and tree:
        raise ValueError("gigpo needs independent trajectories (algorithm.mode mas_grpo or single_agent)")
    if method in ("dr_mas", "pooled"):
        groups = build_agent_groups(candidates) if method == "dr_mas" else build_pooled_groups(candidates)
        for group in groups:
            group.set_advantages(grpo_advantages(group.rewards, eps, tie_tol))
        return groups
    if method == "counterfactual":
        if not tree:
            raise ValueError(
                "counterfactual continues each candidate's own branch: it needs tree sampling (mode at_grpo)"
            )
        groups = build_groups(candidates, k, role_k)
        for group in groups:
            missing = [c.index for c in group.members if OUTCOME not in c.components]
            if missing:
                raise ValueError(f"group {group.key}: candidates {missing} have no counterfactual outcome")
            group.rewards = [c.components[OUTCOME] for c in group.members]
            group.set_advantages(rloo_advantages(group.rewards, tie_tol))
        return groups
    if method == "gigpo" and gigpo_episode == "outcome":
        if outcomes is None:
            raise ValueError("gigpo_episode outcome needs each trajectory's outcome")
        groups = build_trajectory_groups(trajectories, k, outcomes)
    else:
        groups = build_groups(candidates, k, role_k) if tree else build_trajectory_groups(trajectories, k)
    for group in groups:
        group.set_advantages(
            rloo_advantages(group.rewards, tie_tol)
            if method == "rloo"
            else grpo_advantages(group.rewards, eps, tie_tol)
        )
    if method == "gigpo":
        returns = step_returns(trajectories, step_gamma)
        for step_group in build_step_groups(candidates):
            step_returns_of = [returns[id(c)] for c in step_group]
            for candidate, advantage in zip(step_group, grpo_advantages(step_returns_of, eps, tie_tol)):
                candidate.advantage += step_weight * advantage
    return groups


def step_returns(trajectories: list[tuple[str, list[Candidate]]], gamma: float) -> dict[int, float]:
    """GiGPO's step return, what its step groups compare (verl-agent's
    `compute_step_discounted_returns`): along each trajectory's actions in order,
    G_t = r_t + gamma * G_{t+1}, G after the last action 0. Keyed by id(candidate)."""
    returns: dict[int, float] = {}
    for _, unit in trajectories:
        running = 0.0
        for candidate in reversed(unit):
            running = candidate.reward + gamma * running
            returns[id(candidate)] = running
    return returns


def build_agent_groups(candidates: list[Candidate]) -> list[Group]:
    """Dr. MAS's groups: (problem, agent) over every turn, each candidate a unit with its own
    reward (key turn ALL_TURNS). A sample alone in its group has no baseline: advantage 0, and
    no group (it is not trained on)."""
    by_key: dict[GroupKey, list[Candidate]] = defaultdict(list)
    for candidate in candidates:
        by_key[GroupKey(candidate.problem_id, candidate.role, ALL_TURNS)].append(candidate)
    groups = []
    for key, members in by_key.items():
        if len(members) < 2:
            members[0].advantage = 0.0
            continue
        groups.append(Group(key, [[c] for c in members], [c.reward for c in members]))
    return groups


def build_pooled_groups(candidates: list[Candidate]) -> list[Group]:
    """The pooled groups: (problem) over every agent and turn, each candidate a unit with its own
    reward (key: the trajectory key, every agent and every turn)."""
    by_problem: dict[str, list[Candidate]] = defaultdict(list)
    for candidate in candidates:
        by_problem[candidate.problem_id].append(candidate)
    groups = []
    for problem_id, members in by_problem.items():
        if len(members) < 2:
            members[0].advantage = 0.0
            continue
        groups.append(Group(GroupKey.trajectory(problem_id), [[c] for c in members], [c.reward for c in members]))
    return groups


def build_step_groups(candidates: list[Candidate]) -> list[list[Candidate]]:
    """GiGPO's step groups: the samples of one problem (across its K trajectories) that saw the
    same observation as the same role; only groups of two or more carry a step advantage."""
    by_anchor: dict[tuple[str, str, str], list[Candidate]] = defaultdict(list)
    for candidate in candidates:
        by_anchor[(candidate.problem_id, candidate.role, candidate.prompt_hash)].append(candidate)
    return [members for members in by_anchor.values() if len(members) >= 2]
