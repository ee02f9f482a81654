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


def test_vllm_loads_the_plugin_from_the_entry_point():
    """The installed distribution's vllm.general_plugins entry point is what
    vLLM itself loads: after vLLM's load_general_plugins(), the in-tree
    connector's runtime factory has umbp behind backend 'umbp'."""
    from importlib.metadata import entry_points
    eps = {e.name: e.value for e in entry_points(group="vllm.general_plugins")}
    assert eps.get("umbp") == "umbp.vllm_plugin:register", eps
    from vllm.plugins import load_general_plugins
    load_general_plugins()
    from vllm.distributed.kv_transfer.kv_connector.v1.umbp.runtime import UMBPRuntimeFactory
    for mode in ("embedded", "standalone"):
        assert getattr(UMBPRuntimeFactory._builders[mode], "umbp_backend", False), mode
