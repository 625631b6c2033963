"""Paired comparisons on outcome lists whose answer is known by hand (mas_lab/analysis/paired.py)."""

import pytest

from mas_lab.analysis.paired import compare_paired, diff_interval, paired, sentence


def outcomes(both: int, a_only: int, b_only: int, neither: int) -> tuple[list[bool], list[bool]]:
    a = [True] * both + [True] * a_only + [False] * b_only + [False] * neither
    b = [True] * both + [False] * a_only + [True] * b_only + [False] * neither
    return a, b


def test_the_make_run_recount_is_below_rows_first_not_level_with_it():
    """The recount of sample_runs/plan_path_learns_smollm2: the team's 44 solved problems are a strict
    subset of the rows-first rule's 55 on the same 64; exact McNemar p = 2 * 0.5**11."""
    team, rule = outcomes(44, 0, 11, 9)
    v = compare_paired([(team, rule)])
    assert (v.n, v.a_only, v.b_only) == (64, 0, 11)
    assert v.p_value == pytest.approx(2 * 0.5**11)
    assert v.word == "below"
    assert v.text("the rows-first rule") == "below the rows-first rule"
    low, high = v.diff_ci
    assert low < -11 / 64 < high < 0


def test_overlapping_intervals_with_no_discordance_either_way_are_not_distinguishable():
    a, b = outcomes(30, 3, 2, 29)
    v = compare_paired([(a, b)])
    assert v.word == "not distinguishable" and "discordant 3/2" in v.evidence()
    assert v.text("B") == "not distinguishable from B"


def test_identical_outcomes_have_p_one_and_a_zero_effect():
    a, b = outcomes(10, 0, 0, 6)
    v = compare_paired([(a, b)])
    assert v.p_value == 1.0 and v.diff == 0.0 and v.word == "not distinguishable"


def test_seeds_pool_their_discordant_problems_and_a_seed_going_the_other_way_blocks_the_word():
    s0, s1, s2 = outcomes(20, 9, 0, 35), outcomes(20, 8, 1, 35), outcomes(20, 7, 0, 37)
    v = compare_paired([s0, s1, s2])
    assert (v.a_only, v.b_only, v.n) == (24, 1, 64 * 3)
    from scipy.stats import binomtest

    assert v.p_value == pytest.approx(binomtest(24, 25, 0.5).pvalue)
    assert v.word == "above" and "per seed 9/0, 8/1, 7/0" in v.evidence()
    against = compare_paired([s0, s1, outcomes(20, 0, 4, 40)])
    assert against.p_value < 0.05 and against.seeds_against == 1
    assert against.word == "not distinguishable" and "1 seed(s) go the other way" in against.evidence()


def test_a_lopsided_split_of_few_discordant_problems_is_not_significant():
    """4/0 discordant: exact p = 0.125, above 0.05, although A never loses."""
    a, b = outcomes(10, 4, 0, 50)
    assert compare_paired([(a, b)]).word == "not distinguishable"
    a, b = outcomes(10, 6, 0, 48)  # p = 0.03125
    assert compare_paired([(a, b)]).word == "above"


def test_the_difference_interval_covers_the_difference_and_stays_in_range():
    for n, x, y in [(64, 0, 11), (64, 11, 0), (10, 10, 0), (5, 0, 0), (200, 50, 47)]:
        low, high = diff_interval(n, x, y)
        assert -1 <= low <= (x - y) / n <= high <= 1


def test_outcomes_of_different_problem_counts_are_refused():
    with pytest.raises(ValueError, match="same problems"):
        paired([True, False], [True])


def test_a_sentence_names_every_comparison_with_its_evidence():
    team, rule = outcomes(44, 0, 11, 9)
    team2, const = outcomes(10, 34, 0, 20)
    s = sentence(
        {"the rows-first rule": compare_paired([(team, rule)]), "the constant answer": compare_paired([(team2, const)])}
    )
    assert s.startswith("below the rows-first rule (n=64, discordant 0/11")
    assert "; above the constant answer (n=64, discordant 34/0" in s


def test_the_notebook_pairs_runs_seed_by_seed():
    """mas_lab.paired_runs: the same verdict the study report gives, from run folders."""
    from conftest import ROOT

    import mas_lab

    kept = ROOT / "results" / "credit" / "sokoban"
    at_grpo = [kept / "at-grpo-at-grpo" / f"seed-{s}" for s in (0, 1, 2)]
    dr_mas = [kept / "per-agent-normalisation-dr-mas" / f"seed-{s}" for s in (0, 1, 2)]
    v = mas_lab.paired_runs(at_grpo, dr_mas)
    assert [(s.a_only, s.b_only) for s in v.seeds] == [(10, 0), (0, 0), (13, 0)]  # the report's table
    assert v.word == "above"
    with pytest.raises(ValueError, match="one run of each arm per seed"):
        mas_lab.paired_runs(at_grpo, dr_mas[:2])
