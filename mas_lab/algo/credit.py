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
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from mas_lab.algo.advantage import grpo_advantages, rloo_advantages
from mas_lab.algo.groups import ALL_TURNS, Candidate, Group, GroupKey, build_groups, build_trajectory_groups

OUTCOME = "counterfactual"  # the reward component holding a candidate's counterfactual credit

Trajectories = list[tuple[str, list[Candidate]]]  # (problem id, its candidates in the order they acted)


@dataclass(frozen=True)
class Credit:
    """The settings every credit method reads (the task file's algorithm.*), resolved once per run:
    K, the std epsilon, tree or trajectory sampling, each role's own K, the tie tolerance, and
    gigpo's step weight, discount and episode return."""

    k: int
    eps: float = 1e-6
    tree: bool = True
    role_k: Mapping[str, int] = field(default_factory=dict)
    tie_tol: float = 0.0
    step_weight: float = 1.0
    step_gamma: float = 0.95
    gigpo_episode: str = "mean"

    @classmethod
    def of(cls, algorithm, roles) -> "Credit":
        """From a task's `algorithm` and `roles` (config.py): a role's own K (roles[].k) read here,
        the one place it is resolved for grouping."""
        return cls(
            k=algorithm.k,
            eps=algorithm.std_eps,
            tree=algorithm.mode == "tree",
            role_k={r.name: r.k for r in roles if r.k is not None},
            tie_tol=algorithm.tie_tolerance,
            step_weight=algorithm.step_weight,
            step_gamma=algorithm.step_gamma,
            gigpo_episode=algorithm.gigpo_episode,
        )


@dataclass(frozen=True)
class Method:
    """A credit method: its function, and what it needs of the rollout (the task file's checks
    read these, so a method's requirements are stated once, here)."""

    name: str
    assign: Callable[[Trajectories, Credit, "list[float] | None"], list[Group]]
    tree: bool = True  # works on the tree (algorithm.mode tree)
    trajectories: bool = True  # works on K independent trajectories (algorithm.mode trajectories or single_agent)
    continuations: bool = False  # each candidate's branch continued to the episode's end (episodes.py)
    sequential: bool = False  # a sequential workflow (one branch holds a turn)


METHODS: dict[str, Method] = {}


def register(name: str, **needs: bool) -> Callable:
    """Register a credit method under `name` (algorithm.advantage), with what it needs."""

    def add(function: Callable) -> Callable:
        METHODS[name] = Method(name, function, **needs)
        return function

    return add


def method_of(name: str) -> Method:
    if name not in METHODS:
        raise ValueError(f"unknown advantage method '{name}'; allowed: {list(METHODS)}")
    return METHODS[name]


def assign_advantages(
    trajectories: Trajectories, method: str, credit: Credit, *, outcomes: list[float] | None = None
) -> list[Group]:
    """Build the groups `method` needs from a step's trajectories, check them, and set every
    candidate's advantage. Returns the groups that carry the baselines: the ones the filter and the
    store see. Rewards within credit.tie_tol of each other count as tied (zero advantages).
    `outcomes`: each trajectory's episode outcome (its final team reward), in order."""
    chosen = method_of(method)
    if credit.tree and not chosen.tree:
        raise ValueError(f"{method} needs independent trajectories (algorithm.mode trajectories or single_agent)")
    if not credit.tree and not chosen.trajectories:
        raise ValueError(
            f"{method} continues each candidate's own branch: it needs tree sampling (algorithm.mode tree)"
        )
    return chosen.assign(trajectories, credit, outcomes)


def _candidates(trajectories: Trajectories) -> list[Candidate]:
    return [c for _, unit in trajectories for c in unit]


def _standard_groups(trajectories: Trajectories, credit: Credit) -> list[Group]:
    if credit.tree:
        return build_groups(_candidates(trajectories), credit.k, dict(credit.role_k))
    return build_trajectory_groups(trajectories, credit.k)


def _standardised(groups: list[Group], credit: Credit) -> list[Group]:
    """Eq. 3 inside each group: A = (r - mean) / (std + eps), tied rewards 0."""
    for group in groups:
        group.set_advantages(grpo_advantages(group.rewards, credit.eps, credit.tie_tol))
    return groups


@register("at_grpo")
def at_grpo(trajectories: Trajectories, credit: Credit, outcomes: list[float] | None = None) -> list[Group]:
    """Eq. 3 in AT-GRPO's groups (problem, agent, turn) on the tree, (problem) on trajectories."""
    return _standardised(_standard_groups(trajectories, credit), credit)


@register("rloo")
def rloo(trajectories: Trajectories, credit: Credit, outcomes: list[float] | None = None) -> list[Group]:
    """The same groups, each sample against the mean of its K - 1 siblings."""
    groups = _standard_groups(trajectories, credit)
    for group in groups:
        group.set_advantages(rloo_advantages(group.rewards, credit.tie_tol))
    return groups


@register("dr_mas")
def dr_mas(trajectories: Trajectories, credit: Credit, outcomes: list[float] | None = None) -> list[Group]:
    """Dr. MAS: groups (problem, agent) over every turn, each sample with its own reward."""
    return _standardised(build_agent_groups(_candidates(trajectories)), credit)


@register("pooled")
def pooled(trajectories: Trajectories, credit: Credit, outcomes: list[float] | None = None) -> list[Group]:
    """Every sample of a problem in one group with its own reward, whatever its agent."""
    return _standardised(build_pooled_groups(_candidates(trajectories)), credit)


@register("gigpo", tree=False)
def gigpo(trajectories: Trajectories, credit: Credit, outcomes: list[float] | None = None) -> list[Group]:
    """GiGPO: the episode advantage (over the mean per-action reward, or the episode outcome with
    gigpo_episode outcome) plus step_weight times the step advantage within anchor-state groups."""
    if credit.gigpo_episode == "outcome":
        if outcomes is None:
            raise ValueError("gigpo_episode outcome needs each trajectory's outcome")
        groups = build_trajectory_groups(trajectories, credit.k, outcomes)
    else:
        groups = build_trajectory_groups(trajectories, credit.k)
    _standardised(groups, credit)
    returns = step_returns(trajectories, credit.step_gamma)
    for step_group in build_step_groups(_candidates(trajectories)):
        step_returns_of = [returns[id(c)] for c in step_group]
        for candidate, advantage in zip(step_group, grpo_advantages(step_returns_of, credit.eps, credit.tie_tol)):
            candidate.advantage += credit.step_weight * advantage
    return groups


@register("counterfactual", trajectories=False, continuations=True, sequential=True)
def counterfactual(trajectories: Trajectories, credit: Credit, outcomes: list[float] | None = None) -> list[Group]:
    """C3 on the tree: each candidate's counterfactual credit (the OUTCOME component the rollout
    stored) against its K - 1 siblings'."""
    groups = build_groups(_candidates(trajectories), credit.k, dict(credit.role_k))
    for group in groups:
        missing = [c.index for c in group.members if OUTCOME not in c.components]
        if missing:
            raise ValueError(f"group {group.key}: candidates {missing} have no counterfactual outcome")
        group.rewards = [c.components[OUTCOME] for c in group.members]
        group.set_advantages(rloo_advantages(group.rewards, credit.tie_tol))
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
    reward (key turn ALL_TURNS)."""
    return _unit_groups(candidates, lambda c: GroupKey(c.problem_id, c.role, ALL_TURNS))


def build_pooled_groups(candidates: list[Candidate]) -> list[Group]:
    """The pooled groups: (problem) over every agent and turn, each candidate a unit with its own
    reward (key: the trajectory key, every agent and every turn)."""
    return _unit_groups(candidates, lambda c: GroupKey.trajectory(c.problem_id))


def _unit_groups(candidates: list[Candidate], key_of: Callable[[Candidate], GroupKey]) -> list[Group]:
    """Candidates grouped by `key_of`, each a unit with its own reward. A sample alone in its group
    has no baseline: advantage 0, and no group (it is not trained on)."""
    by_key: dict[GroupKey, list[Candidate]] = defaultdict(list)
    for candidate in candidates:
        by_key[key_of(candidate)].append(candidate)
    groups = []
    for key, members in by_key.items():
        if len(members) < 2:
            members[0].advantage = 0.0
            continue
        groups.append(Group(key, [[c] for c in members], [c.reward for c in members]))
    return groups


def build_step_groups(candidates: list[Candidate]) -> list[list[Candidate]]:
    """GiGPO's step groups: the samples of one problem (across its K trajectories) that saw the
    same observation as the same role; only groups of two or more carry a step advantage."""
    by_anchor: dict[tuple[str, str, str], list[Candidate]] = defaultdict(list)
    for candidate in candidates:
        by_anchor[(candidate.problem_id, candidate.role, candidate.prompt_hash)].append(candidate)
    return [members for members in by_anchor.values() if len(members) >= 2]
