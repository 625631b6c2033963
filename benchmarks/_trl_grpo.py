"""TRL's GRPOTrainer for benchmarks/vs_trl.py; runs in .venv-peer (`make bench-peer`).

    .venv-peer/bin/python benchmarks/_trl_grpo.py SPEC.json

SPEC: model folder, chat prompts, K, lr, max new tokens, steps, dtype, and optionally the micro-batch
(samples per forward/backward; the step's n_prompts x K samples are reached by gradient accumulation,
one generation per optimizer step; default: the whole step as one micro-batch). Prints one JSON line:
{"steps": [{"s": seconds, "tokens": completion tokens}, ...]}, one entry per optimizer step, timed
by a callback from step begin to step end (generation, reward, loss, backward, optimizer).
"""

import json
import re
import sys
import time

import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
from trl import GRPOConfig, GRPOTrainer

MOVES = re.compile(r"Moves:\s*[UDLR](?:[\s,]*[UDLR])*", re.IGNORECASE)
spec = json.load(open(sys.argv[1]))
tokens_in_step = []


def reward(completions, completion_ids=None, **_):
    """The same reward as benchmarks/vs_trl.py; counts the step's completion tokens."""
    if completion_ids is not None:
        tokens_in_step.append(sum(len(ids) for ids in completion_ids))
    texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
    return [(1.0 if MOVES.search(t) else 0.0) + min(len(t), 200) / 1000.0 for t in texts]


class Timer(TrainerCallback):
    def __init__(self):
        self.steps, self.started = [], None

    def on_step_begin(self, args, state, control, **kwargs):
        self.started = time.perf_counter()
        tokens_in_step.clear()

    def on_step_end(self, args, state, control, **kwargs):
        self.steps.append({"s": time.perf_counter() - self.started, "tokens": sum(tokens_in_step)})


torch.set_num_threads(torch.get_num_threads())
n_prompts, k = len(spec["messages"]), spec["k"]
micro = spec.get("micro_batch") or n_prompts * k
if (n_prompts * k) % micro:
    sys.exit(f"the micro-batch {micro} does not divide the step's {n_prompts * k} samples")
data = Dataset.from_list([{"prompt": m} for m in spec["messages"]])
config = GRPOConfig(
    output_dir=spec["output"],
    use_cpu=True,
    bf16=spec["dtype"] == "bfloat16",
    learning_rate=spec["lr"],
    num_generations=k,
    per_device_train_batch_size=micro,
    gradient_accumulation_steps=n_prompts * k // micro,  # one generation of n_prompts x K per optimizer step
    num_iterations=1,
    max_completion_length=spec["max_new_tokens"],
    temperature=1.0,
    top_p=1.0,
    beta=0.0,
    gradient_checkpointing=False,
    max_steps=spec["steps"],
    logging_steps=1,
    report_to="none",
    save_strategy="no",
    dataloader_num_workers=0,
    seed=0,
    shuffle_dataset=False,
)
tokenizer = AutoTokenizer.from_pretrained(spec["model"])
tokenizer.padding_side = "left"
model = AutoModelForCausalLM.from_pretrained(spec["model"], dtype=torch.float32)
timer = Timer()
trainer = GRPOTrainer(
    model=model, reward_funcs=reward, args=config, train_dataset=data, processing_class=tokenizer, callbacks=[timer]
)
trainer.train()
print(json.dumps({"steps": timer.steps}))
