"""A scripted engine for fast unit tests: deterministic candidates, no model."""

from __future__ import annotations

from mas_lab.rollout.engine import Generation


class FakeEngine:
    """Candidate c of every prompt answers `script(c, n)`; default: c letters 'a', rest 'b'.
    A script taking a third argument also gets the prompt's row in the batch."""

    def __init__(self, script=None):
        self.script = script or (lambda c, n: "a" * c + "b" * (n - 1 - c) or "b")
        self.calls: list[dict] = []

    def __call__(self, policy, prompts, n, sampling, seed):
        self.calls.append({"policy": policy, "prompts": prompts, "n": n, "seed": seed})
        out = []
        import inspect

        by_row = len(inspect.signature(self.script).parameters) == 3
        for position, messages in enumerate(prompts):
            prompt_ids = [ord(ch) for m in messages for ch in m["content"]]
            row = []
            for c in range(n):
                text = self.script(c, n, position) if by_row else self.script(c, n)
                row.append(Generation(prompt_ids=list(prompt_ids), response_ids=[ord(ch) for ch in text], text=text))
            out.append(row)
        return out


class FakeBackend:
    """Records what each policy's learner receives; implements mas_lab.actors.backend.PolicyBackend."""

    def __init__(self, engine):
        self.generate = engine
        self.updates: list[dict[str, list[dict]]] = []

    def update(self, samples):
        self.updates.append(samples)
        return {
            name: {"loss": 0.0, "nll": 0.0, "clip_frac": 0.0, "grad_norm": 0.0, "samples": len(s), "tokens": 0}
            for name, s in samples.items()
        }

    def sync_weights(self, version):
        return 0.0

    def alive(self):
        return True

    def placement(self):
        return {"rollout fake#0": "local", "learner fake": "local"}

    def precision(self):
        return {"rollout fake#0": {"requested": "float32", "dtype": "float32", "device": "cpu", "emulated_bf16": False}}

    def save_policies(self, folder, background=False):
        folder.mkdir(parents=True, exist_ok=True)

    def wait_saves(self):
        pass

    def load_policies(self, folder, version, optimizer=True):
        pass

    def shutdown(self):
        pass
