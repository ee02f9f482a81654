#!/usr/bin/env bash
# Create .venv in the repository root (if missing) with what python/tests
# needs: the pinned vLLM, torch (PyPI's wheel; runs on CPU), pytest.
# vLLM is installed with --no-deps plus exactly the packages its connector
# base classes, config, Request and scheduler import: its full dependency set
# (flashinfer, CUDA kernels, OpenAI server, ...) is several GB more and none of
# it is needed on CPU. Idempotent: a second run only checks.
set -euo pipefail
cd "$(dirname "$0")/.."
VLLM_VERSION=0.34.0   # the one pinned version (python/pyproject.toml names the same)
TORCH_VERSION=2.14.0  # what vllm $VLLM_VERSION requires
VENV=${UMBP_VENV:-.venv}
PY=${PYTHON:-python3}
start=$(date +%s)
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
stamp="$VENV/.umbp-setup-$VLLM_VERSION-$TORCH_VERSION-2"
if [ -f "$stamp" ]; then
  echo "setup-python: $VENV is ready (vllm $VLLM_VERSION)"; exit 0
fi
pip() { "$VENV/bin/python" -m pip install -q --disable-pip-version-check "$@"; }
pip "setuptools>=77.0.3" wheel
pip "torch==$TORCH_VERSION"
pip --no-deps "vllm==$VLLM_VERSION"
# Imported by vllm.config, vllm.v1.request, vllm.v1.core.sched and the KV connector base:
pip pytest numpy packaging pydantic regex psutil pyzmq urllib3 "transformers>=5.16.1,<5.23.0" \
    aiohttp requests pillow pybase64 cachetools cbor2 msgspec cloudpickle uvloop py-cpuinfo \
    prometheus_client llguidance "xgrammar==0.2.8" pyyaml sentencepiece tqdm blake3 openai \
    einops filelock
VLLM_TARGET_DEVICE=cpu "$VENV/bin/python" -c "
import vllm.config, vllm.v1.request, vllm.v1.core.sched.scheduler
import vllm.distributed.kv_transfer.kv_connector.v1.base, vllm.distributed.kv_transfer.kv_connector.factory
print('setup-python: vllm', vllm.__version__ if hasattr(vllm, '__version__') else '$VLLM_VERSION', 'imports on CPU')"
touch "$stamp"
echo "setup-python: done in $(( $(date +%s) - start ))s"
