#!/usr/bin/env bash
# meson test 'python-connector': the pytest suite of python/umbp against the
# real vLLM in .venv (made by scripts/setup-python.sh); skips (77) without it.
src=${1:?source root}; lib=${2:?libumbp.so}
py="$src/.venv/bin/python"
if [ ! -x "$py" ] || [ ! -f "$src/.venv/.umbp-setup-"* ] 2>/dev/null; then
  echo "SKIP: $src/.venv missing: run 'bash scripts/setup-python.sh' to test the vLLM connector"
  exit 77
fi
export UMBP_LIB="$lib" PYTHONPATH="$src/python${PYTHONPATH:+:$PYTHONPATH}"
exec "$py" -m pytest "$src/python/tests" -q -p no:cacheprovider
