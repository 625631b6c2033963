"""The chart definitions shared by `mas-lab plot` and the live screen (mas_lab/analysis/plots.py)."""

import pytest

from mas_lab.analysis.plots import axis_groups, panel_series
from mas_lab.records.store import RunStore
from mas_lab.training.metric_names import TIME_SPLIT


def test_one_long_step_does_not_flatten_the_time_split(tmp_path):
    """In seconds, one 248-s learner step put every other step's split at the floor of one axis.
    The split is drawn as each part's share of its step (0-1 whatever the step took) and the step's
    seconds on an axis of its own."""
    store = RunStore(tmp_path / "run.db")
    for step, learner in ((1, 6.0), (2, 240.0), (3, 6.0)):
        parts = {"rollout": 3.0, "reward": 0.5, "learner": learner, "weight_sync": 0.0, "other": 0.5}
        metrics = {f"time/{k}": v for k, v in parts.items()} | {"time/step": sum(parts.values())}
        store.write_step(step, 0.0, [], "train", metrics=metrics)
    title, series = panel_series(store)["time"]
    store.close()
    assert "share" in title
    assert set(axis_groups(series)) == {"share", "seconds"}
    assert series["seconds/step"] == [(1, 10.0), (2, 244.0), (3, 10.0)]
    for step in (1, 2, 3):
        assert sum(dict(series[f"share/{p}"])[step] for p in TIME_SPLIT) == pytest.approx(1.0)
    assert dict(series["share/rollout"])[1] == pytest.approx(0.3)  # visible, not 3/244 of an axis
    assert dict(series["share/learner"])[2] == pytest.approx(240 / 244)


def test_utilisation_is_a_panel_with_rates_and_shares_on_axes_of_their_own(tmp_path):
    """The counted GFLOP/s (tens to hundreds) and the share of the peak (0-1) never share an axis,
    and the rollout's and the learner's are apart too."""
    store = RunStore(tmp_path / "run.db")
    for step in (1, 2):
        metrics = {
            "rollout_gflops_per_s/shared": 50.0,
            "rollout_util/shared": 0.12,
            "learner_gflops_per_s/shared": 150.0,
            "learner_util/shared": 0.4,
            "rollout_gflop/shared": 900.0,  # a count, not a rate: not drawn here
        }
        store.write_step(step, 0.0, [], "train", metrics=metrics)
    title, series = panel_series(store)["utilisation"]
    store.close()
    assert "peak" in title and "rollout_gflop/shared" not in series
    assert set(axis_groups(series)) == {"rollout_gflops_per_s", "rollout_util", "learner_gflops_per_s", "learner_util"}
