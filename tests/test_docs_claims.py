"""The docs' words follow the paired rule (issue 50, section 1): "above" or "below" only where the
paired test supports it, "not distinguishable (discordant a/b)" otherwise, never "level with" and
never an ordering read off two overlapping intervals. The generated sections are written by code
whose verdicts are tested in test_paired.py and test_reproduce.py; this checks the hand-written
text around them."""

import re

import pytest
from conftest import ROOT

DOCS = ["README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").rglob("*.md"))]

# A comparison in words that the paired rule forbids: "level with", "as well as" between results,
# "not better than ... (the intervals overlap)".
FORBIDDEN = [
    (re.compile(r"\blevel\s+with\b", re.I), "'level with': say 'not distinguishable (discordant a/b)'"),
    (re.compile(r"\bend\s+level\b", re.I), "'end level': give the paired counts"),
    (re.compile(r"\bnot\s+better\s+than\b[^.]{0,80}intervals\s+overlap", re.I), "an ordering read off intervals"),
    (re.compile(r"\blearns?\s+as\s+well\s+as\b", re.I), "'learns as well as': give the paired counts"),
    # an ordering against a rule's count with no paired counts beside it ("below the constant answer's 10/64")
    (
        re.compile(
            r"\b(above|below)\s+(the\s+|its\s+)?(best\s+)?(constant\s+answer|[\w-]+\s+rule|BFS\s+optimum)'s\s+"
            r"[\d.]+(/\d+)?(?![\d/]|\.\d)(?!\s*\((n=|\d+/\d+|discordant|paired))",
            re.I,
        ),
        "an ordering read off two counts: give the paired test (discordant a/b)",
    ),
]


def forbidden_phrases(text: str) -> list[str]:
    """Each forbidden phrase found in `text`, with why."""
    flat = re.sub(r"\s+", " ", text)
    return [f"{m.group(0)!r}: {why}" for pattern, why in FORBIDDEN for m in pattern.finditer(flat)]


@pytest.mark.parametrize(
    "text, found",
    [
        ("per-role full is level with\nthe shared policy", 1),
        ("the two regimes end level: pooled 0.68 and 0.65", 1),
        ("the team is not better than one agent (the intervals overlap)", 1),
        ("one full model per role learns as well as one shared model", 1),
        ("both end at 5/64, below the constant answer's 10/64.", 1),
        ('1/64, below the best constant answer\'s 7/64 ("Answer: 19")', 1),
        ("45/64, above the rows-first rule's 40/64.", 1),
        ("5/64, below the constant answer's 10/64 (discordant 0/5, p = 0.06)", 0),
        ("5/64; against the constant answer's 10/64 not distinguishable (5/10)", 0),
        ("0.172, below the constant answer's 0.266. Its team", 1),
        ("not distinguishable (n=64, discordant 5/1, exact McNemar p=0.22)", 0),
        ("trajectory-level GRPO, the top-level module, turn-level groups", 0),
    ],
)
def test_the_check_finds_the_words_the_paired_rule_forbids(text, found):
    assert len(forbidden_phrases(text)) == found


@pytest.mark.parametrize("path", DOCS)
def test_no_doc_compares_results_in_words_the_paired_rule_forbids(path):
    assert forbidden_phrases((ROOT / path).read_text()) == []
