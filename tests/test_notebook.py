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


def test_two_arms_are_paired_split_by_split(tmp_path):
    """The kept seed-0 team and single agent with the tool under the paper's rules (counted with
    sqlite over the unpacked stores): main 59 vs 63 with 1/5 discordant, hard 51 vs 63 with 1/13.
    Pooling the splits (18 of the 20 discordant problems going one way) would hide that the main
    split does not separate them; `compare` shows each split."""
    from typer.testing import CliRunner

    from mas_lab.cli import app

    study = mas_lab.load_study(ROOT / "results" / "reproduce" / "plan_path_paper")
    team, single = study.runs["mas--at-grpo-shared/seed-0"], study.runs["single-agent--grpo-with-the-tool/seed-0"]
    main = mas_lab.paired_runs(single, team)
    assert (main.seeds[0].a_only, main.seeds[0].b_only, main.seeds[0].n, main.word) == (1, 5, 64, "not distinguishable")
    hard = mas_lab.paired_runs(single, team, split="hard")
    assert (hard.seeds[0].a_only, hard.seeds[0].b_only, hard.seeds[0].n, hard.word) == (1, 13, 64, "below")
    with pytest.raises(ValueError, match="split: 'main', 'hard' or 'all'"):
        mas_lab.paired_runs(single, team, split="both")
    result = CliRunner().invoke(
        app, ["compare", str(ROOT / "results" / "reproduce" / "plan_path_paper"), "-o", str(tmp_path)]
    )
    assert result.exit_code == 0, result.output
    text = (tmp_path / "compare.md").read_text()
    assert "| single agent + GRPO with the tool | 1 | 0.922 [0.830, 0.966] (n=64) | 0.922 | 0.797 " in text
    main_table, hard_table = text.split("On the hard split")
    assert "| 0 | 5/1 | 0.219 |" in main_table and "| 0 | 13/1 | 0.00183 |" in hard_table
