"""The names of the metrics a training step records, defined once for the trainer, the summary,
the charts, the dashboard and the benchmarks."""

# the step's wall time split, recorded as time/<part> (and time/step, the whole)
TIME_SPLIT = ("rollout", "reward", "learner", "weight_sync", "other")
TIME_KEYS = tuple(f"time/{part}" for part in TIME_SPLIT)

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
)
