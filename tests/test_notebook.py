"""The notebook API on committed runs: the documented columns of every table, values that agree
with the store, and a folder of kept (xz-compressed) runs loaded as one study."""

import pytest
from conftest import ROOT

import mas_lab
from mas_lab.notebook import COLUMNS


@pytest.fixture(scope="module")
def run():
    return mas_lab.load_run(ROOT / "sample_runs" / "plan_path_learns_smollm2")


def test_every_table_has_its_documented_columns(run):
    for name, columns in COLUMNS.items():
        frame = getattr(run, name)
        assert list(frame.columns) == columns and len(frame) > 0, name
    assert run.metrics.index.name == "step" and "eval/success_rate" in run.metrics


def test_the_tables_agree_with_the_store(run):
    evals = run.metrics["eval/success_rate"].dropna()
    assert evals.iloc[0] == pytest.approx(3 / 64) and evals.iloc[-1] == pytest.approx(44 / 64)
    final = run.episodes.query("kind == 'eval' and step == 30")
    assert final["success"].sum() == 44 and len(final) == 64
    chosen = run.candidates.query("kind == 'train' and chosen")
    assert len(chosen) == len(run.turns.query("kind == 'train'"))
    assert all(m[-1]["role"] == "assistant" for m in run.candidates["messages"].head(20))
    assert set(run.groups["kept"]) <= {True, False} and (run.groups["n"] == 4).all()


def test_a_folder_of_kept_runs_is_one_study():
    study = mas_lab.load_study(ROOT / "results" / "reproduce" / "plan_path")
    assert len(study.runs) == 15
    summary = study.summary
    shared = summary.query("regime == 'MAS + AT-GRPO shared'").sort_values("seed")
    assert list(shared["seed"]) == [0, 1, 2]
    assert list(shared["success_after"].round(3)) == [0.688, 0.734, 0.641]


def test_compare_overlays_runs_and_names_what_differs(tmp_path):
    """`mas-lab compare` on the kept Plan-Path runs: a pooled table per regime, the settings that
    differ between the regimes, one PNG per panel."""
    from typer.testing import CliRunner

    from mas_lab.cli import app

    result = CliRunner().invoke(
        app, ["compare", str(ROOT / "results" / "reproduce" / "plan_path"), "-o", str(tmp_path)]
    )
    assert result.exit_code == 0, result.output
    text = (tmp_path / "compare.md").read_text()
    assert "| MAS + AT-GRPO shared | 3 | 0.688 [0.619, 0.749] (n=192) | 0.688 / 0.734 / 0.641 |" in text
    # kept runs written as at_grpo / mas_grpo read in the one vocabulary
    assert "| `algorithm.mode` | tree | tree | tree | trajectories | single_agent |" in text
    assert {p.name for p in tmp_path.glob("*.png")} >= {"compare_success.png", "compare_reward.png"}
    missing = CliRunner().invoke(app, ["compare", str(tmp_path / "nothing-here")])
    assert missing.exit_code == 2
