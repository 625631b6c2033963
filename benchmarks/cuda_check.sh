#!/usr/bin/env bash
# The GPU check of the transformers path (learner and sampler on CUDA), for a lent GPU machine with
# no package registry: it runs under the machine's own python3, torch, transformers and peft, with
# the few pure-Python packages mas-lab imports carried as wheels in .whl/, made on a machine with a
# registry:
#   pip download --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux2014_x86_64 \
#       -d .whl pydantic pydantic_core annotated-types typing-inspection typing_extensions psutil pyyaml
# (the device tool carries .whl/ beside the working tree). What it runs: tests/test_cuda.py (each
# case on the CPU and on CUDA: placement, full and LoRA updates in float32 and bfloat16 with the
# sampler following, sampler vs learner log-probs, exact resume) and the CUDA case of
# tests/test_precision.py; then the resume cases again with torch.use_deterministic_algorithms(True).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3}
DEPS=$(mktemp -d)
"$PY" -m pip install -q --disable-pip-version-check --no-index --no-deps --target "$DEPS" .whl/*.whl || exit 1
export PYTHONPATH="$DEPS:$PWD"
"$PY" - <<'PYEOF'
import json, sys
import peft, torch, transformers
print(json.dumps({"python": sys.version.split()[0], "torch": torch.__version__, "transformers": transformers.__version__,
                  "peft": peft.__version__, "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}))
PYEOF
"$PY" -m pytest -q -s -p no:cacheprovider tests/test_cuda.py tests/test_precision.py::test_auto_on_cuda_asks_the_device
tests=$?
CUBLAS_WORKSPACE_CONFIG=:4096:8 "$PY" -c "
import sys, pytest, torch
torch.use_deterministic_algorithms(True)
sys.exit(pytest.main(['-q', '-p', 'no:cacheprovider', '-k', 'resume and not cpu', 'tests/test_cuda.py']))"
deterministic=$?
echo "exit codes: tests $tests, resume under deterministic algorithms $deterministic"
exit $((tests || deterministic))
