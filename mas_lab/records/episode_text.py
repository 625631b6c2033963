"""Text of a stored episode, turn by turn and candidate by candidate (`mas-lab replay --text`),
and the one line that heads a candidate everywhere (the dashboard's replay screen uses it too)."""

from __future__ import annotations

import json
import re

# ANSI/VT escape sequences (CSI, OSC, single-character) and the other control characters but tab
# and newline: model-written programs' output reached `replay --text` raw and could rewrite the
# terminal (clear it, move the cursor, set its title).
_ESCAPES = re.compile(r"\x1b(\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(\x07|\x1b\\)?|[@-Z\\-_])|[\x00-\x08\x0b-\x1f\x7f\x9b]")


def visible(text: str) -> str:
    """`text` with terminal escape sequences and control characters shown as escapes (\\x1b...),
    so a stored program's output is read, never run by the terminal."""
    return _ESCAPES.sub(lambda m: m.group(0).encode("unicode_escape").decode("ascii"), text)


def candidate_headline(c: dict, kind: str = "train") -> str:
    """Reward (team, local and its components), advantage and tokens of a stored candidate. An
    evaluation's candidate was never trained on: it has no advantage (not +0.000)."""
    parts = ", ".join(f"{k} {v:.2f}" for k, v in c["components"].items())
    advantage = f"advantage {c['advantage']:+.3f}" if kind == "train" else "no advantage (evaluation)"
    return (
        f"reward {c['reward']:.3f} (team {c['team']:.3f}, local {c['local']:.3f}; {parts})"
        f"  {advantage}  tokens {c['response_tokens']}"
    )


def count(n: int, noun: str) -> str:
    """'1 candidate', '4 candidates'."""
    return f"{n} {noun}{'' if n == 1 else 's'}"


def format_episode(episode: dict) -> str:
    problem = json.loads(episode["problem"])
    lines = [
        f"episode {episode['idx']} of step {episode['step']} ({episode['kind']})  problem {episode['problem_id']}  "
        f"success {bool(episode['success'])}",
        f"problem: {json.dumps(problem)}",
        "",
    ]
    for turn in episode["turns"]:
        lines.append(f"=== turn {turn['turn']}  agent {turn['role']}  (policy {turn['policy']}) ===")
        lines.append("observation:")
        lines += ["  " + line for line in turn["observation"].splitlines()]
        for c in turn["candidates"]:
            lines.append(f" {'*' if c['chosen'] else ' '} [{c['idx']}] {candidate_headline(c, episode['kind'])}")
            lines += ["      " + line for line in (c["response"] or "(empty)").splitlines()]
            if c["info"]:
                lines.append(f"      -> {c['info']}")
        lines.append("state after the chosen action:")
        lines += ["  " + line for line in (turn["state_after"] or "").splitlines()]
        lines.append("")
    lines.append(f"final state:\n{episode['final_state']}\n")
    return visible("\n".join(lines))
