"""The names of the metrics a training step records, defined once for the trainer, the summary,
the charts, the dashboard and the benchmarks."""

# the step's wall time split, recorded as time/<part> (and time/step, the whole)
TIME_SPLIT = ("rollout", "reward", "learner", "weight_sync", "other")
TIME_KEYS = tuple(f"time/{part}" for part in TIME_SPLIT)
STEP_TIME = "time/step"

# per policy, recorded as <name>/<policy>: the counted FLOPs of a phase over the step (modeling/flops.py),
# their rate over the phase's seconds, and that rate against this machine's measured matmul peak
# (benchmarks/matmul_peak.py; absent where not measured). The rollout's where the engine counts FLOPs
# (transformers, not vLLM).
ROLLOUT_FLOPS = ("rollout_gflop", "rollout_gflops_per_s", "rollout_util")
LEARNER_FLOPS = ("learner_gflop", "learner_gflops_per_s", "learner_util")

# what each learner reports of a policy's update, recorded as <name>/<policy>
LEARNER_METRICS = (
    "loss",
    "nll",
    "clip_frac",
    "grad_norm",
    "grad_norm_clipped",
    "grad_clip_frac",
    "samples",
    "tokens",
    "mismatch_abs",
    "mismatch_kl",
    "ratio_mean",
    "ratio_min",
    "ratio_max",
    "kl_initial",
    "kl_penalty",
    "tis_weight_mean",
    "tis_capped_frac",
    *LEARNER_FLOPS,
)

# metrics that measure the clock, not the run: they differ between two runs that are otherwise
# identical (an exact resume compares everything else); key prefixes
TIMED = ("time/", "tokens_per_s", "eval/time", *ROLLOUT_FLOPS[1:], *LEARNER_FLOPS[1:])

# what an evaluation records (training/evaluation.py), read by the summary, compare, the charts,
# the study report, the notebook and the dashboard
EVAL_PREFIX = "eval/"  # every evaluation metric
HARD_PREFIX = "eval/hard/"  # the hard split's
EVAL_SUCCESS = "eval/success_rate"
EVAL_CI_LOW, EVAL_CI_HIGH = "eval/success_ci_low", "eval/success_ci_high"
HARD_SUCCESS = "eval/hard/success_rate"
HARD_CI_LOW, HARD_CI_HIGH = "eval/hard/success_ci_low", "eval/hard/success_ci_high"
HARD_PROBLEMS = "eval/hard/problems"
CONSTANT_SUCCESS = "eval/constant_success"
CONSTANT_CI_LOW, CONSTANT_CI_HIGH = "eval/constant_ci_low", "eval/constant_ci_high"
DISTINCT_ANSWERS = "eval/distinct_answers"
EVAL_TURNS = "eval/turns"
EVAL_TEAM_REWARD = "eval/team_reward"
EVAL_TIME = "eval/time"
OPTIMUM_MOVES = "eval/optimum_moves"


def rule_key(name: str, hard: bool = False) -> str:
    """A reading rule's success on the evaluation set (or on the hard split)."""
    return f"{HARD_PREFIX if hard else EVAL_PREFIX}rule/{name}"
