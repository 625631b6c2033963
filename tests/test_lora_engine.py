"""Per-role LoRA in the transformers engine: each policy's adapter merged into its own weights
(lora.MergedAdapters) samples what the learner's peft adapter scores, policy by policy."""

import torch

from mas_lab.config import Algorithm, Lora, Sampling
from mas_lab.learner.learner import Learner
from mas_lab.learner.samples import Sample
from mas_lab.modeling import lora
from mas_lab.modeling.models import resolve
from mas_lab.rollout.engine import HFEngine

PROMPTS = [
    [{"role": "user", "content": "write a"}],
    [{"role": "system", "content": "be brief"}, {"role": "user", "content": "a longer prompt, please answer"}],
]
ADAPTERS = {
    "tool": Lora(rank=4, alpha=8, target_modules=["q_proj", "v_proj", "up_proj", "down_proj"]),
    "planner": Lora(rank=8),
}
SAMPLING = Sampling(temperature=0.7, top_p=1.0, max_new_tokens=12)


def learner_logp(learner: Learner, policy: str, generations) -> list[torch.Tensor]:
    lora.use(learner.model, policy)
    samples = [Sample(g.prompt_ids, g.response_ids, 0.0, SAMPLING.temperature, tuple(g.logprobs)) for g in generations]
    batch = learner._batch(samples)
    with torch.no_grad():
        logp = learner._logp(batch)
    return [row[batch.mask[i].bool()] for i, row in enumerate(logp)]


def test_merged_adapters_sample_what_the_learner_scores_for_each_policy():
    folder = resolve("tiny-test")
    learner = Learner(folder, Algorithm(), threads=1, policies=dict(ADAPTERS))
    torch.manual_seed(5)
    with torch.no_grad():  # trained-looking adapters, a different one per policy
        for name, p in learner.model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.2)
    engine = HFEngine(folder, threads=1, adapters=dict(ADAPTERS))
    assert engine.merged is not None
    base = engine.generate("tool", PROMPTS, 3, SAMPLING, seed=3)  # nothing loaded yet: the base model
    for policy in ADAPTERS:
        engine.load_weights(lora.adapter_state(learner.model, policy), policy)
    texts = {}
    for policy in ADAPTERS:
        generations = [g for row in engine.generate(policy, PROMPTS, 3, SAMPLING, seed=3) for g in row]
        texts[policy] = [g.response_ids for g in generations]
        for got, g in zip(learner_logp(learner, policy, generations), generations):
            assert (got - torch.tensor(g.logprobs)).abs().max() < 1e-4, policy
    assert texts["tool"] != texts["planner"] != [g.response_ids for row in base for g in row]
    # switching back and forth gives the same samples (the base weights are never modified)
    again = [g.response_ids for row in engine.generate("tool", PROMPTS, 3, SAMPLING, seed=3) for g in row]
    assert again == texts["tool"]
    for name, module in engine.merged.modules.items():
        assert module.weight is engine.merged.merged["tool"][name]
    engine.merged.use("never-loaded")
    assert [g.response_ids for row in engine.generate("never-loaded", PROMPTS, 3, SAMPLING, seed=3) for g in row] == [
        g.response_ids for row in base for g in row
    ]


def test_a_new_adapter_version_replaces_the_merged_weights_of_its_policy_only():
    folder = resolve("tiny-test")
    learner = Learner(folder, Algorithm(), threads=1, policies=dict(ADAPTERS))
    engine = HFEngine(folder, threads=1, adapters=dict(ADAPTERS))
    for policy in ADAPTERS:
        engine.load_weights(lora.adapter_state(learner.model, policy), policy)
    engine.merged.use("tool")
    planner_before = {k: v.clone() for k, v in engine.merged.merged["planner"].items()}
    with torch.no_grad():
        for name, p in learner.model.named_parameters():
            if "lora_B" in name and ".tool." in name:
                p.fill_(0.01)
    engine.load_weights(lora.adapter_state(learner.model, "tool"), "tool")
    engine.merged.use("tool")
    changed = [n for n, w in engine.merged.merged["tool"].items() if not torch.equal(w, engine.merged.base[n])]
    assert changed and all(n.rsplit(".", 1)[-1] in ADAPTERS["tool"].target_modules for n in changed)
    assert all(torch.equal(planner_before[k], v) for k, v in engine.merged.merged["planner"].items())
    assert all(engine.merged.modules[n].weight is engine.merged.merged["tool"][n] for n in changed)


def test_a_foreign_adapter_state_is_refused():
    import pytest

    engine = HFEngine(resolve("tiny-test"), threads=1, adapters=dict(ADAPTERS))
    with pytest.raises(ValueError, match="no target module"):
        engine.load_weights({"base_model.model.nowhere.lora_A.weight": torch.zeros(1)}, "tool")
