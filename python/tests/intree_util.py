# SPDX-License-Identifier: Apache-2.0
"""Configs and KV caches for vLLM's in-tree UMBPStoreConnector on umbp.

Unlike conftest's (our connector's) KV caches, the in-tree connector plans
byte ranges from KVCacheConfig.kv_cache_tensors, so each layer here is one
KVCacheTensor with the block dimension outermost: (num_blocks, 2, block,
heads, head) — K and V of a block in one page, block_stride = page bytes."""
from __future__ import annotations

import torch

from conftest import BLOCK, HEAD, HEADS, LAYERS, NUM_BLOCKS

from vllm.config import CacheConfig, DeviceConfig, KVTransferConfig, ParallelConfig, VllmConfig
from vllm.config.kv_events import KVEventsConfig
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec, KVCacheTensor

import umbp.vllm_plugin

NS = "intree-ns"
EXTRA = {"backend": "umbp", "capacity_bytes": 64 * 4096 * 4, "no_prefault": True, "key_namespace": NS}


def register_plugin():
    """What vLLM does through the umbp wheel's `vllm.general_plugins` entry
    point in every process; here called explicitly (the installed-wheel path
    is tested by tests/wheel and tests/e2e, not here)."""
    umbp.vllm_plugin.register()


def spec(head=HEAD):
    return FullAttentionSpec(block_size=BLOCK, num_kv_heads=HEADS, head_size=head, dtype=torch.float16)


def make_kv_cache_config(num_blocks=NUM_BLOCKS, head=HEAD) -> KVCacheConfig:
    page = spec(head).page_size_bytes
    tensors = [KVCacheTensor(size=page * num_blocks, layers=[n], layer_stride=page * num_blocks,
                             block_stride=page) for n in LAYERS]
    return KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=tensors,
                         kv_cache_groups=[KVCacheGroupSpec(list(LAYERS), spec(head))])


def make_kv_caches(seed=None, num_blocks=NUM_BLOCKS, head=HEAD) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed or 0)
    out = {}
    for n in LAYERS:
        t = torch.zeros(num_blocks, 2, BLOCK, HEADS, head, dtype=torch.float16)
        if seed is not None:
            t.copy_(torch.randn(t.shape, generator=g).to(torch.float16))
        out[n] = t
    return out


def make_vllm_config(pool, tp=1, rank=0, **extra) -> VllmConfig:
    ktc = KVTransferConfig(kv_connector="UMBPStoreConnector", kv_role="kv_both",
                           kv_connector_extra_config={"pool": pool, **EXTRA, **extra},
                           kv_load_failure_policy="recompute")
    return VllmConfig(kv_transfer_config=ktc, cache_config=CacheConfig(block_size=BLOCK),
                      parallel_config=ParallelConfig(tensor_parallel_size=tp, rank=rank),
                      device_config=DeviceConfig("cpu"),
                      kv_events_config=KVEventsConfig(enable_kv_cache_events=True, publisher="null"))
