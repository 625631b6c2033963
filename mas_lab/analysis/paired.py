"""Paired comparisons: two things (a team and a rule, two training methods, before and after)
evaluated on the *same* held-out problems, problem by problem.

Overlapping or separate Wilson intervals of two success rates ignore that both were measured on
the same problems; the paired test uses exactly the problems on which they differ (the discordant
pairs). Per seed: the discordant counts (A solves and B does not / B solves and A does not) and the
exact McNemar test (statsmodels; a binomial test of the discordant split). Across seeds: the exact
Mantel-Haenszel test with one stratum per (seed, problem) pair, which for matched pairs is the
binomial test of the pooled discordant split (scipy), so a seed counts by its discordant problems,
never by its pooled episodes. The effect is the paired difference in success with the Agresti-Min
interval (Wald after adding 1/2 to each cell of the paired table; Agresti and Min, Biometrics 2005).

The words follow the test (the rule of the claims issue): "above" / "below" only where the pooled
exact test is significant at `ALPHA` and no seed goes the other way; otherwise "not
distinguishable", with n and the discordant counts. Never "level with".
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Sequence

ALPHA = 0.05


@dataclass(frozen=True)
class Paired:
    """A against B on the same n problems of one seed."""

    n: int
    a_solved: int
    b_solved: int
    a_only: int  # problems A solves and B does not
    b_only: int  # problems B solves and A does not
    p_value: float  # exact McNemar

    @property
    def diff(self) -> float:
        """A's success minus B's, on these problems."""
        return (self.a_only - self.b_only) / self.n if self.n else 0.0


def _mcnemar_exact(a_only: int, b_only: int) -> float:
    if a_only + b_only == 0:
        return 1.0
    # lazy: statsmodels (~1.5 s), only when a paired test is computed
    from statsmodels.stats.contingency_tables import mcnemar

    return float(mcnemar([[0, a_only], [b_only, 0]], exact=True).pvalue)


def paired(a: Sequence[bool], b: Sequence[bool]) -> Paired:
    """Compare two outcome lists of the same problems, in the same order."""
    if len(a) != len(b):
        raise ValueError(f"paired outcomes need the same problems: {len(a)} against {len(b)}")
    a_only = sum(1 for x, y in zip(a, b) if x and not y)
    b_only = sum(1 for x, y in zip(a, b) if y and not x)
    return Paired(len(a), sum(map(bool, a)), sum(map(bool, b)), a_only, b_only, _mcnemar_exact(a_only, b_only))


def on_common_problems(a: Mapping[str, bool], b: Mapping[str, bool]) -> tuple[list[bool], list[bool]]:
    """Two runs' outcomes by problem id, aligned on the problems both evaluated (in `a`'s order):
    the pairs `paired` takes."""
    common = [pid for pid in a if pid in b]
    return [a[pid] for pid in common], [b[pid] for pid in common]


def diff_interval(n: int, a_only: int, b_only: int, z: float = 1.96) -> tuple[float, float]:
    """95% interval of the paired difference in success (A minus B): Agresti-Min, Wald on the
    paired table with 1/2 added to each of its four cells."""
    if n == 0:
        return (0.0, 0.0)
    m, b, c = n + 2, a_only + 0.5, b_only + 0.5
    centre = (b - c) / m
    half = z * math.sqrt(max((b + c) - (b - c) ** 2 / m, 0.0)) / m
    return (max(-1.0, centre - half), min(1.0, centre + half))


@dataclass(frozen=True)
class Verdict:
    """A against B over one or more seeds (each a `Paired` on its own problems)."""

    seeds: tuple[Paired, ...]
    p_value: float  # exact Mantel-Haenszel over (seed, problem) strata: the pooled discordant split
    alpha: float = ALPHA

    @property
    def n(self) -> int:
        return sum(s.n for s in self.seeds)

    @property
    def a_only(self) -> int:
        return sum(s.a_only for s in self.seeds)

    @property
    def b_only(self) -> int:
        return sum(s.b_only for s in self.seeds)

    @property
    def diff(self) -> float:
        return (self.a_only - self.b_only) / self.n if self.n else 0.0

    @property
    def diff_ci(self) -> tuple[float, float]:
        return diff_interval(self.n, self.a_only, self.b_only)

    @property
    def seeds_against(self) -> int:
        """Seeds whose difference has the sign opposite to the pooled one."""
        sign = (self.a_only > self.b_only) - (self.a_only < self.b_only)
        return sum(1 for s in self.seeds if sign and ((s.a_only > s.b_only) - (s.a_only < s.b_only)) == -sign)

    @property
    def word(self) -> str:
        """'above', 'below' or 'not distinguishable'."""
        if self.p_value < self.alpha and not self.seeds_against and self.a_only != self.b_only:
            return "above" if self.a_only > self.b_only else "below"
        return "not distinguishable"

    def evidence(self) -> str:
        """n, the discordant counts (per seed where there are several), the p-value and the effect."""
        low, high = self.diff_ci
        per_seed = (
            " (per seed " + ", ".join(f"{s.a_only}/{s.b_only}" for s in self.seeds) + ")" if len(self.seeds) > 1 else ""
        )
        test = "exact McNemar" if len(self.seeds) == 1 else "exact stratified test over seeds"
        against = f"; {self.seeds_against} seed(s) go the other way" if self.seeds_against else ""
        return (
            f"n={self.n}, discordant {self.a_only}/{self.b_only}{per_seed}, {test} p={self.p_value:.3g}, "
            f"difference {self.diff:+.3f} [{low:+.2f}, {high:+.2f}]{against}"
        )

    def ordering(self, a_label: str, b_label: str) -> str:
        """The verdict of A against B as an ordering: "A above B", "B above A" or "not distinguishable"."""
        return {"above": f"{a_label} above {b_label}", "below": f"{b_label} above {a_label}"}.get(
            self.word, "not distinguishable"
        )

    def text(self, b_label: str) -> str:
        """'above the rows-first rule (n=64, discordant 11/0, ...)' and the like."""
        word = self.word
        return f"{word} {b_label}" if word != "not distinguishable" else f"not distinguishable from {b_label}"

    def as_dict(self) -> dict:
        low, high = self.diff_ci
        return {
            "word": self.word,
            "n": self.n,
            "a_only": self.a_only,
            "b_only": self.b_only,
            "p_value": self.p_value,
            "diff": self.diff,
            "diff_ci": [low, high],
            "per_seed": [{"n": s.n, "a_only": s.a_only, "b_only": s.b_only, "p_value": s.p_value} for s in self.seeds],
        }


def compare_paired(pairs: Sequence[tuple[Sequence[bool], Sequence[bool]]], alpha: float = ALPHA) -> Verdict:
    """A against B over seeds: `pairs` holds, per seed, A's and B's outcomes on that seed's problems."""
    seeds = tuple(paired(a, b) for a, b in pairs)
    a_only, b_only = sum(s.a_only for s in seeds), sum(s.b_only for s in seeds)
    if len(seeds) == 1:
        p = seeds[0].p_value
    elif a_only + b_only == 0:
        p = 1.0
    else:
        # lazy: scipy (~0.7 s), only when a test or an interval is computed
        from scipy.stats import binomtest

        p = float(binomtest(a_only, a_only + b_only, 0.5).pvalue)
    return Verdict(seeds, p, alpha)


def sentence(verdicts: dict[str, Verdict]) -> str:
    """Several B's against one A in words, the evidence of each beside it: "above the best constant
    answer (n=64, discordant 40/0, ...); below the rows-first reading rule (...)"."""
    return "; ".join(f"{v.text(label)} ({v.evidence()})" for label, v in verdicts.items())
