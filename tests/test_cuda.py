"""The learner and the sampler on a GPU: both ends placed on the device, full and LoRA updates in
float32 and bfloat16 with the sampler following the learner's weights, the sampler's log-probs
against the learner's, and a resume from a checkpoint that continues exactly (real tiny model,
in-process). Every case runs on the CPU (the fast tier) and again on CUDA where torch sees a GPU:
`benchmarks/cuda_check.sh` runs this file on a lent GPU machine. On a GPU the first weight sync of a
LoRA policy and the first resume are where the CPU tests cannot look (an adapter arrives from the
learner on the CPU; a checkpoint loads with `map_location` on the device)."""

import shutil

import pytest
import torch
from conftest import ROOT
from test_curriculum import _record, _run
from test_learning import engine_of, learner_of, same, two_policy_task

from mas_lab.actors.backend import Backend
from mas_lab.config import Algorithm, Sampling, TaskConfig, load_task
from mas_lab.learner.learner import Learner
from mas_lab.learner.samples import Sample
from mas_lab.modeling.models import resolve
from mas_lab.rollout.engine import HFEngine

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU"))]
DTYPES = ["float32", "bfloat16"]


def on(task: TaskConfig, device: str, dtype: str) -> TaskConfig:
    """The task with every policy in `dtype` and both ends on `device` (in-process: a GPU count > 0 means cuda)."""
    data = task.model_dump()
    gpus = 1.0 if device == "cuda" else 0.0
    data["resources"].update(rollout_gpus=gpus, learner_gpus=gpus)
    for policy in data["policies"].values():
        policy["dtype"] = dtype
    return TaskConfig.model_validate(data)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
@pytest.mark.parametrize("device", DEVICES)
def test_both_ends_sit_on_the_device_and_the_sampler_follows_an_update(device, lora, dtype):
    backend = Backend(on(two_policy_task(lora), device, dtype), use_ray=False)
    learner = {p: learner_of(backend.learners[h]) for p, h in backend.base_of.items()}
    engine = {p: engine_of(backend.workers[h][0]) for p, h in backend.base_of.items()}
    for policy in learner:
        assert {p.device.type for p in learner[policy].model.parameters()} == {device}
        assert {p.device.type for p in engine[policy].model.parameters()} == {device}
    before = {p: {k: v.clone() for k, v in learner[p].weights(p).items()} for p in learner}
    samples = [Sample([2, 10, 11], [71, 71, 3], a) for a in (1.0, -1.0)]
    backend.update({"p_first": samples, "p_second": []})
    assert not same(learner["p_first"].weights("p_first"), before["p_first"]), "the updated policy did not move"
    assert same(learner["p_second"].weights("p_second"), before["p_second"])
    backend.sync_weights(1)  # a LoRA adapter crosses from the learner as CPU tensors, into a base on the device
    for policy in learner:
        state = learner[policy].weights(policy)
        if lora:
            merged = engine[policy].merged
            for name, weight in merged.merged[policy].items():
                assert weight.device.type == device
                a, b = (state[f"base_model.model.{name}.lora_{x}.weight"].to(weight.device).float() for x in "AB")
                assert torch.equal(weight, (merged.base[name].float() + 2.0 * b @ a).to(weight.dtype)), name
        else:
            assert same({k: v.cpu() for k, v in engine[policy].model.state_dict().items()}, state)


@pytest.mark.parametrize("device", DEVICES)
def test_the_learners_logprobs_equal_the_samplers_on_the_device(device):
    folder = resolve("tiny-test")
    engine = HFEngine(folder, threads=1, device=device)
    prompts = [[{"role": "user", "content": "write a"}], [{"role": "user", "content": "a longer prompt, please"}]]
    rows = engine.generate("shared", prompts, 3, Sampling(temperature=0.7, top_p=0.9, max_new_tokens=16), seed=3)
    learner = Learner(folder, Algorithm(), threads=1, device=device)
    samples = [Sample(g.prompt_ids, g.response_ids, 0.0, 0.7, tuple(g.logprobs)) for row in rows for g in row]
    batch = learner._batch(samples).to(learner.device)
    with torch.no_grad():
        logp = learner._logp(batch)
    known = batch.mask.bool()
    gap = (logp[known] - batch.sampler[known]).abs()
    print(f"{device}: sampler vs learner log-prob, mean {gap.mean():.2e}, max {gap.max():.2e} per token")
    assert gap.max() < 1e-3


def _final_weights(run_dir):
    """Every tensor of the last checkpoint's policies (weights or adapters), by file and name."""
    from safetensors.torch import load_file

    last = max((run_dir / "checkpoints").glob("step-*"))
    return {
        f"{f.relative_to(last)}:{k}": v for f in sorted(last.rglob("*.safetensors")) for k, v in load_file(f).items()
    }


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("stem", ["toy", "toy_lora"], ids=["full", "lora"])
@pytest.mark.parametrize("device", DEVICES)
def test_a_resume_on_the_device_continues_exactly(device, stem, dtype, tmp_path):
    """3 steps straight = 2 steps, a checkpoint, a fresh trainer's load of it (map_location on the device), 1 step."""
    task = on(
        load_task(
            ROOT / "tasks" / f"{stem}.yaml",
            [
                "train.steps=3",
                "train.eval_every=0",
                "checkpoint.every=1",
                "checkpoint.keep_last=10",
                "checkpoint.background=false",
            ],
        ),
        device,
        dtype,
    )
    _run(task, tmp_path / "straight")
    shutil.copytree(tmp_path / "straight", tmp_path / "resumed")
    _run(task, tmp_path / "resumed", restore_step=2)
    assert _record(tmp_path / "resumed") == _record(tmp_path / "straight")  # metrics and every candidate row
    weights = _final_weights(tmp_path / "straight")
    assert weights and same(_final_weights(tmp_path / "resumed"), weights)
