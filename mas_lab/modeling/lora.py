"""Per-role LoRA adapters on one shared base model (peft), used by the engine and the learner.

Each policy with a `lora` section is one named adapter; `use(model, name)` activates it, so a
generation or an update touches only that policy's adapter while the base stays frozen. For
generation the transformers engine merges each policy's adapter into its own copy of the target
weights instead (`MergedAdapters`): the same function, without peft's per-module adapter work at
every decoded token.
"""

from __future__ import annotations

import torch

from mas_lab.config import Lora


def attach(model, adapters: dict[str, Lora]):
    """Wrap `model` with one LoRA adapter per policy name (the `lora` sections of the task file)."""
    # lazy: peft (~4.4 s with torch), only for LoRA policies
    from peft import LoraConfig, get_peft_model

    def config(spec: Lora) -> LoraConfig:
        return LoraConfig(
            r=spec.rank,
            lora_alpha=spec.alpha,  # type: ignore[arg-type]  # peft annotates int; a float scales the same
            lora_dropout=spec.dropout,
            target_modules=list(spec.target_modules),
            task_type="CAUSAL_LM",
            modules_to_save=list(spec.modules_to_save) or None,
        )

    names = list(adapters)
    model = get_peft_model(model, config(adapters[names[0]]), adapter_name=names[0])
    for name in names[1:]:
        model.add_adapter(name, config(adapters[name]))
    return model


def use(model, name: str) -> None:
    model.set_adapter(name)


def adapter_parameters(model, name: str) -> list[torch.nn.Parameter]:
    """The trainable tensors of one adapter (and nothing of the base or other adapters)."""
    params = [p for n, p in model.named_parameters() if f".{name}." in n and ("lora_" in n or "modules_to_save" in n)]
    for p in params:
        p.requires_grad_(True)
    return params


def adapter_state(model, name: str) -> dict[str, torch.Tensor]:
    # lazy: peft (~4.4 s with torch), only for LoRA policies
    from peft import get_peft_model_state_dict

    return {k: v.detach() for k, v in get_peft_model_state_dict(model, adapter_name=name).items()}


def load_adapter_state(model, name: str, state: dict[str, torch.Tensor]) -> None:
    # lazy: peft (~4.4 s with torch), only for LoRA policies
    from peft import set_peft_model_state_dict

    set_peft_model_state_dict(model, state, adapter_name=name)


PEFT_PREFIX = "base_model.model."


class MergedAdapters:
    """Per-role LoRA for generation on a plain (not peft-wrapped) model: each policy's adapter
    merged into its own copy of the target weights, W' = W + (alpha / r) B A (Hu et al. 2021,
    Eq. 3), computed in float32 from the untouched base and cast to the model's dtype; `use`
    points the target modules at the policy's weights (no copy). A policy whose adapter was never
    loaded generates with the base, as a fresh peft adapter (B = 0) does. Memory: one copy of the
    target weights per loaded policy beside the base. On SmolLM2-135M with every projection
    adapted, merged decoding ran 1.43-1.55x as many tokens a second as peft's unmerged adapters,
    0.90-1.07x the plain model's (docs/measurements.md, benchmarks/lora_rollout.py)."""

    def __init__(self, model, adapters: dict[str, Lora]):
        if any(spec.modules_to_save for spec in adapters.values()):
            raise ValueError("merged adapters do not carry modules_to_save; use the peft model")
        self.model, self.specs = model, adapters
        targets = {t for spec in adapters.values() for t in spec.target_modules}
        self.modules = {
            name: m
            for name, m in model.named_modules()
            if isinstance(m, torch.nn.Linear) and name.rsplit(".", 1)[-1] in targets
        }
        self.base = {name: m.weight for name, m in self.modules.items()}
        self.merged: dict[str, dict[str, torch.Tensor]] = {}
        self.active: str | None = None

    @torch.no_grad()
    def load(self, policy: str, state: dict[str, torch.Tensor]) -> None:
        """Merge a peft adapter state (`adapter_state`: keys `base_model.model.<module>.lora_A.weight`
        and `.lora_B.weight`) into the policy's weights."""
        spec = self.specs[policy]
        scale = spec.alpha / spec.rank
        merged: dict[str, torch.Tensor] = {}
        for name, base in self.base.items():
            a, b = state.get(f"{PEFT_PREFIX}{name}.lora_A.weight"), state.get(f"{PEFT_PREFIX}{name}.lora_B.weight")
            if a is None or b is None or name.rsplit(".", 1)[-1] not in spec.target_modules:
                merged[name] = base
                continue
            # the adapter arrives from the learner on the CPU; the base may sit on a GPU
            weight = base.float() + scale * (b.to(base.device).float() @ a.to(base.device).float())
            merged[name] = torch.nn.Parameter(weight.to(base.dtype), requires_grad=False)
        known = {f"{PEFT_PREFIX}{name}.lora_{x}.weight" for name in self.base for x in "AB"}
        if unknown := sorted(set(state) - known):
            raise ValueError(f"adapter state of {policy!r} has tensors no target module takes: {unknown[:3]}")
        self.merged[policy] = merged
        if self.active == policy:
            self.active = None  # re-point the modules at the new weights on the next use

    def use(self, policy: str) -> None:
        if self.active == policy:
            return
        weights = self.merged.get(policy, self.base)
        for name, module in self.modules.items():
            module.weight = weights[name]
        self.active = policy
