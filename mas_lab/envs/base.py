"""The environment interface, problem pools with disjoint train/eval splits, and the registry.

An environment is one problem's live state in the Markov game of the paper (Sec. 3): agents act
in turn order inside a turn, each action is a micro-transition of the state. `clone()` gives an
independent copy, so each of the K candidates of a (turn, agent) is scored on its own branch
(Algorithm 1, line "each candidate scored on its own copy").
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import random
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Iterable, Mapping

from pydantic import BaseModel, ConfigDict
from typing_extensions import Self


@dataclass
class ActionResult:
    """What one action did. `team` is the team reward of the state after the action; `local` is
    the acting role's own reward, `components` its named parts (stored separately, Sec. 4.2)."""

    team: float
    local: float
    components: dict[str, float] = field(default_factory=dict)
    info: str = ""


class EnvError(Exception):
    """An environment broke its contract with the trainer (a reward that is no finite number, an
    observation that is not text or is too long): the message names the environment, the role,
    the turn and the value, and the run stops before the value reaches the learner or the store."""


MAX_REWARD = 1e6  # a reward larger than this in magnitude is taken as a bug (1e308 overflowed the groups)
MAX_OBSERVATION_CHARS = 200_000  # a 2 MB observation ran 400 s without a word


def _checked(env: "Env", role: str, turn: int, result: Any) -> "ActionResult":
    where = f"env '{type(env).__name__}', role '{role}', turn {turn}"
    if not isinstance(result, ActionResult):
        raise EnvError(f"{where}: act() returned {type(result).__name__}, not an ActionResult")
    values = {
        "team": result.team,
        "local": result.local,
        **{f"components.{k}": v for k, v in result.components.items()},
    }
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise EnvError(f"{where}: reward {name} = {value!r} is not a number")
        if not math.isfinite(value) or abs(value) > MAX_REWARD:
            raise EnvError(f"{where}: reward {name} = {value!r} is not a finite number of magnitude <= {MAX_REWARD:g}")
    return result


class EnvParams(BaseModel):
    """An environment's `env.params`. Each environment declares its own subclass: every parameter
    with a type, a default and a description; unknown or ill-typed parameters fail before any work."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    @classmethod
    def coerce(cls, params: "EnvParams | Mapping[str, Any] | None") -> "EnvParams":
        return params if isinstance(params, cls) else cls.model_validate(dict(params or {}))


@dataclass(frozen=True)
class Problem:
    """One generated problem. `data` is JSON-serialisable; the id is a hash of its content."""

    data: dict[str, Any]

    @property
    def content_hash(self) -> str:
        return hashlib.sha256(json.dumps(self.data, sort_keys=True).encode()).hexdigest()

    @property
    def id(self) -> str:
        return self.content_hash[:12]


class Env(ABC):
    """One problem's live state. Subclasses set `roles` (turn order) and implement the game."""

    roles: ClassVar[tuple[str, ...]]
    Params: ClassVar[type[EnvParams]] = EnvParams
    single_role: ClassVar[str] = "solver"  # the one agent of the single-agent baseline
    parallel: ClassVar[bool] = False  # True: the agents of a turn all observe the turn's start state
    shared: ClassVar[tuple[str, ...]] = ("problem", "params")  # read-only attributes clones share
    system_prompts: ClassVar[dict[str, str]] = {}
    answer_role: ClassVar[str] = "solver"  # the role whose reply is the answer (baselines.py)

    def __init__(self, problem: Problem, params: EnvParams | Mapping[str, Any] | None = None):
        self.problem = problem
        self.params = self.Params.coerce(params)
        self.history: list[tuple[int, str, str]] = []  # (turn, role, chosen action)

    @classmethod
    def roles_for(cls, params: "EnvParams | Mapping[str, Any] | None") -> tuple[str, ...]:
        """The team's roles in turn order under `params` (an environment with a configurable
        workflow overrides it; by default its `roles`)."""
        return cls.roles

    @classmethod
    def answers_at(cls, params: "EnvParams", role: str, turn: int) -> bool:
        """Whether `role`'s reply at `turn` is an answer (what the team's first answer is read
        from): by default the replies of `answer_role` and of the single agent."""
        return role in (cls.answer_role, cls.single_role)

    @classmethod
    def first_answers(cls, params: "EnvParams", replies: Iterable[tuple[int, int, str, str]]) -> set[str]:
        """The different first answers among (episode, turn, role, reply) in the order played
        (`eval/distinct_answers`): each episode's earliest reply that is an answer (answers_at: not a
        program). 1 means one reply to every problem, a collapsed policy. Where no reply is an answer
        (the answering role is not among the task's: toy), every turn-0 reply counts."""
        replies = list(replies)
        first: dict[int, str] = {}
        for episode, turn, role, reply in replies:
            if episode not in first and cls.answers_at(params, role, turn):
                first[episode] = reply
        if first:
            return set(first.values())
        return {reply for _, turn, _, reply in replies if turn == 0}

    @classmethod
    def draw_problem(
        cls, rng: random.Random, params: EnvParams | Mapping[str, Any] | None = None, split: str = "train"
    ) -> Problem:
        """Draw one problem from the seeded generator (or the `split` data set: train or eval)."""
        return cls._draw(rng, cls.Params.coerce(params), split)

    @classmethod
    def held_out(cls, problem: Problem, params: EnvParams) -> bool:
        """Whether `problem` is reserved for evaluation (never trained on). Generated problems: a
        fixed 1/EVAL_SHARE of the content-hash space, whatever the size of an evaluation."""
        return int(problem.content_hash[:8], 16) % EVAL_SHARE == 0

    @classmethod
    @abstractmethod
    def _draw(cls, rng: random.Random, params: Any, split: str) -> Problem:
        """draw_problem with this environment's own Params."""

    @classmethod
    def constant_answers(cls, params: EnvParams) -> list[str]:
        """Fixed replies of `answer_role` that might solve problems without reading them: the
        constant-answer baseline (baselines.py) a trained team must beat. None by default."""
        return []

    has_format_demos: ClassVar[bool] = False  # format_demo is implemented (train.warmup_steps)

    def format_demo(self, role: str, rng: random.Random, turn: int = 0) -> str:
        """A reply of `role` in its answer format whose content is drawn from `rng` alone, never from
        the problem: what the format warm-up (train.warmup_steps) trains on. It teaches the form of
        an answer, not a solution. `turn` is one of demo_turns(role) (an override that takes no
        `turn` is called without it)."""
        raise NotImplementedError(f"{type(self).__name__} has no format demonstrations")

    @classmethod
    def answer_turns(cls, params: Any, max_turns: int) -> int:
        """How many of an episode's turns state an answer: the turns a no-model rule or a constant
        answer plays on the same problems (and which decide the hard split). All of them, unless
        the answering agent spends turns on something else (a program first)."""
        return max_turns

    def demo_turns(self, role: str) -> tuple[int, ...]:
        """The turns at whose observation the format warm-up shows `role` a demonstration: the
        first only, unless what the role does changes with the turn (a program then an answer)."""
        return (0,)

    @abstractmethod
    def observe(self, role: str, turn: int) -> str:
        """The user message role sees at this turn: the task plus the shared history so far."""

    @abstractmethod
    def act(self, role: str, turn: int, action: str) -> ActionResult:
        """Apply one action to this state (mutates it) and score it."""

    @property
    @abstractmethod
    def success(self) -> bool:
        """Whether the team solved the problem."""

    @property
    def done(self) -> bool:
        return self.success

    def team_value(self) -> float:
        """The team reward of the live state (what the episode ends with): each environment's own,
        since in a parallel workflow no single action's branch holds the whole turn."""
        return float(self.success)

    def render(self) -> str:
        """A text picture of the state, for replay."""
        return ""

    def adopt(self, role: str, branch: Self) -> None:
        """Parallel workflows: take over what `role`'s chosen action did in `branch`, the clone of
        this turn's start state where it was scored (the action is not run again, so the live
        state is exactly the scored one, and a program runs once). Parallel envs implement it."""
        raise NotImplementedError(f"{type(self).__name__} is parallel but does not implement adopt()")

    def step(self, role: str, turn: int, action: str) -> ActionResult:
        result = _checked(self, role, turn, self.act(role, turn, action))
        self.history.append((turn, role, action))
        return result

    def messages(self, role: str, turn: int) -> list[dict[str, str]]:
        """Chat messages for the role's policy: its system prompt and the observation."""
        out = []
        if role in self.system_prompts:
            out.append({"role": "system", "content": self.system_prompts[role]})
        observation = self.observe(role, turn)
        if not isinstance(observation, str):
            raise EnvError(
                f"env '{type(self).__name__}', role '{role}', turn {turn}: observe() returned "
                f"{type(observation).__name__}, not text"
            )
        if len(observation) > MAX_OBSERVATION_CHARS:
            raise EnvError(
                f"env '{type(self).__name__}', role '{role}', turn {turn}: an observation of {len(observation)} "
                f"characters (at most {MAX_OBSERVATION_CHARS})"
            )
        out.append({"role": "user", "content": observation})
        return out

    def clone(self) -> Self:
        """An independent copy of the live state; the problem and other read-only attributes
        (`shared`) are shared, not copied."""
        new = copy.copy(self)
        for key, value in self.__dict__.items():
            if key not in self.shared:
                setattr(new, key, copy.deepcopy(value))
        return new


EVAL_SHARE = 8  # generated problems: one content-hash bucket in EVAL_SHARE is held out for evaluation


class ProblemPool:
    """Seeded train and evaluation problems, disjoint by content (not by seed arithmetic), for
    evaluation sets of any size.

    Which problems are held out does not depend on how many are evaluated: `Env.held_out` decides
    per problem (generated envs: a fixed share of the content-hash space; data sets: every record
    of the evaluation sets). Training never draws a held-out problem, and evaluation draws only
    held-out ones, so `mas-lab eval --problems N` cannot meet a training problem for any N.
    `train(i)` is deterministic in (seed, i), so a cursor resumes.
    """

    def __init__(
        self,
        env_cls: type[Env],
        params: EnvParams | Mapping[str, Any] | None,
        seed: int,
        eval_size: int,
        hard: Callable[[Problem], bool] | None = None,
        hard_size: int = 0,
    ):
        self.env_cls = env_cls
        self.params = env_cls.Params.coerce(params)
        self.seed = seed
        rng = random.Random(f"eval-{seed}")
        self.eval_set: list[Problem] = []
        seen: set[str] = set()
        attempts = 0
        while len(self.eval_set) < eval_size:
            problem = env_cls.draw_problem(rng, self.params, "eval")
            attempts += 1
            if problem.content_hash not in seen and env_cls.held_out(problem, self.params):
                seen.add(problem.content_hash)
                self.eval_set.append(problem)
            elif attempts > 200 * EVAL_SHARE * (eval_size + 1):
                raise ValueError(
                    f"env '{env_cls.__name__}' cannot make {eval_size} distinct evaluation problems; "
                    "widen its parameters or evaluate fewer"
                )
        # more held-out problems that `hard` accepts (a hard split evaluated beside the set above)
        self.hard_set: list[Problem] = []
        rng, attempts = random.Random(f"hard-{seed}"), 0
        while hard is not None and len(self.hard_set) < hard_size:
            problem = env_cls.draw_problem(rng, self.params, "eval")
            attempts += 1
            if problem.content_hash not in seen and env_cls.held_out(problem, self.params) and hard(problem):
                seen.add(problem.content_hash)
                self.hard_set.append(problem)
            elif attempts > 2000 * EVAL_SHARE * (hard_size + 1):
                raise ValueError(
                    f"env '{env_cls.__name__}' yields too few hard held-out problems for {hard_size} "
                    f"(found {len(self.hard_set)} in {attempts} draws); widen its parameters (walls, "
                    "distances) or ask for fewer"
                )
        self._train_rng = random.Random(f"train-{seed}")
        self._train: list[Problem] = []

    def train(self, index: int) -> Problem:
        while len(self._train) <= index:
            for _ in range(10_000):
                problem = self.env_cls.draw_problem(self._train_rng, self.params, "train")
                if not self.env_cls.held_out(problem, self.params):
                    break
            else:
                raise ValueError("the generator yields only evaluation problems; widen its parameters")
            self._train.append(problem)
        return self._train[index]

    def distinct_train(self, cursor: int, count: int) -> tuple[list[Problem], int]:
        """`count` distinct training problems from index `cursor` on (a repeated problem would merge
        two groups), and the cursor after them. Raises ValueError when the generator keeps
        repeating itself: its parameters allow fewer distinct problems than a step needs."""
        chosen: list[Problem] = []
        seen: set[str] = set()
        drawn = 0
        while len(chosen) < count:
            problem = self.train(cursor)
            cursor += 1
            drawn += 1
            if problem.id not in seen:
                seen.add(problem.id)
                chosen.append(problem)
            elif drawn > 200 * count:
                raise ValueError(
                    f"train.problems_per_step: the environment yields only {len(chosen)} distinct training problems "
                    f"in {drawn} draws, fewer than {count}; widen env.params or ask for fewer"
                )
        return chosen, cursor

    def make(self, problem: Problem) -> Env:
        return self.env_cls(problem, self.params)
