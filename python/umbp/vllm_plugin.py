# SPDX-License-Identifier: Apache-2.0
"""vLLM general plugin: umbp as a backend of vLLM's in-tree UMBPStoreConnector.

vLLM calls ``register()`` in every process through the ``vllm.general_plugins``
entry point of the umbp distribution::

  [project.entry-points."vllm.general_plugins"]
  umbp = "umbp.vllm_plugin:register"

It wraps the builders of ``UMBPRuntimeFactory`` (vLLM's registry of runtimes
for the modes ``embedded`` and ``standalone``): a connector whose
``kv_connector_extra_config`` has ``"backend": "umbp"`` gets
``umbp.vllm_runtime.UMBPRuntime``; any other backend, or none, goes to the
builder that was registered before (MORI's, in vLLM's tree), unchanged.
"""
from __future__ import annotations

import importlib.util
import logging

logger = logging.getLogger("vllm.umbp.plugin")
BACKEND = "umbp"


def _wrap(mode: str, previous):
    def build(config):
        backend = config.options.get("backend")
        if backend == BACKEND:
            from .vllm_runtime import UMBPRuntime  # libumbp is loaded only when selected
            return UMBPRuntime.from_config(config)
        if isinstance(backend, str) and backend.strip().lower() == BACKEND:
            # passed on, "UMBP" would reach MORI's runtime, which fails asking for MORI
            raise ValueError(f"kv_connector_extra_config.backend={backend!r}: write {BACKEND!r} (lower case, "
                             "no spaces) to use umbp's runtime")
        if previous is None:
            raise RuntimeError(f"no UMBP runtime is registered for mode {mode!r} besides umbp's: set "
                               f"kv_connector_extra_config.backend to {BACKEND!r}, or install MORI")
        if (getattr(previous, "__module__", "").startswith("vllm.")
                and importlib.util.find_spec("mori") is None):
            # vLLM's MORI runtime would fail later, asking for MORI built with BUILD_UMBP=ON
            raise ValueError(f"vLLM's in-tree UMBPStoreConnector has kv_connector_extra_config.backend={backend!r}, "
                             "so it would use MORI's runtime, and MORI is not installed. For umbp, add "
                             f"\"backend\": \"{BACKEND}\" to kv_connector_extra_config (vLLM's connector on umbp), "
                             "or \"kv_connector_module_path\": \"umbp.vllm\" to --kv-transfer-config (umbp's connector)")
        return previous(config)

    build.umbp_backend = True
    build.umbp_previous = previous
    return build


def register() -> None:
    """Put umbp behind backend 'umbp' for both modes. Idempotent; a vLLM
    without the in-tree UMBP connector is left alone. Never raises: vLLM
    calls every general plugin at every start without catching, so a vLLM
    whose factory changed shape must still start (with a warning, and without
    backend 'umbp'; umbp's own connector, umbp.vllm, does not need this)."""
    try:
        _register()
    except Exception as e:
        logger.warning("umbp plugin: cannot put umbp behind vLLM's in-tree UMBPStoreConnector (%s: %s), so its "
                       "kv_connector_extra_config backend 'umbp' is not available in this vLLM; umbp's own "
                       "connector (\"kv_connector_module_path\": \"umbp.vllm\") is not affected. Report it "
                       "with your vLLM version.", type(e).__name__, e)


def _register() -> None:
    try:
        from vllm.distributed.kv_transfer.kv_connector.v1.umbp.runtime import UMBPRuntimeFactory
    except ImportError as e:   # vLLM older than the in-tree connector
        logger.debug("umbp plugin: vLLM has no in-tree UMBP connector (%s); nothing to register", e)
        return
    builders = UMBPRuntimeFactory._builders
    for mode in ("embedded", "standalone"):
        previous = builders.get(mode)
        if getattr(previous, "umbp_backend", False):
            continue
        # register() refuses a second builder for a mode, so the wrapper
        # replaces the entry and keeps the previous builder inside it.
        builders[mode] = _wrap(mode, previous)
