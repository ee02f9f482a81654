# SPDX-License-Identifier: Apache-2.0
"""umbp: Python bindings of libumbp (ctypes) and the vLLM KV connector.

`umbp.vllm.UMBPStoreConnector` is loaded by vLLM through
``kv_connector_module_path="umbp.vllm"``. libumbp is loaded from, in order:
``UMBP_LIB`` (an explicit path), ``libumbp.so`` next to this package (what the
wheel bundles), ``libumbp.so.0`` through the dynamic loader (a system install),
a build directory of the source tree (build*/libumbp.so). See umbp._lib.
"""



def __getattr__(name: str):
    # __version__ is the loaded libumbp's (umbp_version(): meson.build's project
    # version, which the wheel's metadata also takes): one source of truth, and
    # importing umbp still does not load the library.
    if name == "__version__":
        from . import _lib
        try:
            return _lib.lib().umbp_version().decode()
        except (OSError, ImportError) as e:
            # an AttributeError, as the protocol wants: hasattr(umbp, "__version__"),
            # getattr(..., default) and help(umbp) answer instead of raising
            raise AttributeError(f"umbp.__version__ is libumbp's, and libumbp cannot be loaded: {e}") from e
    raise AttributeError(f"module 'umbp' has no attribute {name!r}")
