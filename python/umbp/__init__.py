# SPDX-License-Identifier: Apache-2.0
"""umbp: Python bindings of libumbp (ctypes) and the vLLM KV connector.

`umbp.vllm.UMBPStoreConnector` is loaded by vLLM through
``kv_connector_module_path="umbp.vllm"``. The library is found through
``UMBP_LIB`` (a path to libumbp.so), next to this package, or in a build
directory of the source tree (build*/libumbp.so).
"""

__version__ = "0.1.0"
