# SPDX-License-Identifier: Apache-2.0
"""Run by run_wheel.sh with the fresh venv's python, beside copies of
python/tests: the umbp package, its libumbp and the CLI are the wheel's."""
from __future__ import annotations

import os
import shutil
import sys
import sysconfig

import umbp
import umbp._lib as L
import umbp.vllm


def test_package_and_library_come_from_the_wheel():
    pkg = os.path.join(sysconfig.get_paths()["platlib"], "umbp")
    for mod in (umbp, L, umbp.vllm):
        assert os.path.dirname(os.path.realpath(mod.__file__)) == os.path.realpath(pkg), mod.__file__
    assert os.path.realpath(L.lib_path()) == os.path.realpath(os.path.join(pkg, "libumbp.so"))
    assert "UMBP_LIB" not in os.environ and "PYTHONPATH" not in os.environ
    src_python = os.path.join(os.environ["UMBP_WHEEL_SOURCE_ROOT"], "python")
    assert not any(os.path.realpath(p) == os.path.realpath(src_python) for p in sys.path if p)


def test_cli_is_the_venvs():
    assert shutil.which("umbp") == os.path.join(sys.prefix, "bin", "umbp")


def test_one_version():
    from importlib.metadata import version
    assert umbp.__version__ == version("umbp")  # libumbp's, from meson.build; the wheel's metadata
