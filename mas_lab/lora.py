"""Per-role LoRA adapters on one shared base model (peft), used by the engine and the learner.

Each policy with a `lora` section is one named adapter; `use(model, name)` activates it, so a
generation or an update touches only that policy's adapter while the base stays frozen.
"""
from __future__ import annotations

import torch

from mas_lab.config import Lora


def attach(model, adapters: dict[str, Lora]):
    """Wrap `model` with one LoRA adapter per policy name (the `lora` sections of the task file)."""
    from peft import LoraConfig, get_peft_model

    def config(spec: Lora) -> LoraConfig:
        return LoraConfig(r=spec.rank, lora_alpha=spec.alpha, lora_dropout=spec.dropout,
                          target_modules=list(spec.target_modules), task_type="CAUSAL_LM",
                          modules_to_save=list(spec.modules_to_save) or None)

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
    from peft import get_peft_model_state_dict

    return {k: v.detach() for k, v in get_peft_model_state_dict(model, adapter_name=name).items()}


def load_adapter_state(model, name: str, state: dict[str, torch.Tensor]) -> None:
    from peft import set_peft_model_state_dict

    set_peft_model_state_dict(model, state, adapter_name=name)
