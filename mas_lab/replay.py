"""Text rendering of a stored episode, turn by turn and candidate by candidate."""
from __future__ import annotations

import json


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
            mark = "*" if c["chosen"] else " "
            parts = " ".join(f"{k}={v:.2f}" for k, v in c["components"].items())
            lines.append(
                f" {mark} [{c['idx']}] reward {c['reward']:.3f} (team {c['team']:.3f}, local {c['local']:.3f}; {parts})"
                f"  advantage {c['advantage']:+.3f}  tokens {c['response_tokens']}"
            )
            lines += ["      " + line for line in (c["response"] or "(empty)").splitlines()]
            if c["info"]:
                lines.append(f"      -> {c['info']}")
        lines.append("state after the chosen action:")
        lines += ["  " + line for line in (turn["state_after"] or "").splitlines()]
        lines.append("")
    lines.append(f"final state:\n{episode['final_state']}\n")
    return "\n".join(lines)
