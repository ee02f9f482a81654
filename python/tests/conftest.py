# SPDX-License-Identifier: Apache-2.0
"""Helpers for the connector tests: real vLLM config, KV-cache config, Request
and SchedulerOutput objects (the wheel ships no tests/, so these build them)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys

# vLLM 0.34 selects CpuPlatform with VLLM_TARGET_DEVICE=cpu, which then requires
# triton-cpu on x86; the UnspecifiedPlatform with DeviceConfig("cpu") builds configs.
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import pytest  # noqa: E402
import torch  # noqa: E402

from vllm.config import CacheConfig, DeviceConfig, KVTransferConfig, ParallelConfig, VllmConfig  # noqa: E402
from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.utils.hashing import sha256  # noqa: E402
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash  # noqa: E402
from vllm.v1.core.sched.output import CachedRequestData, NewRequestData, SchedulerOutput  # noqa: E402
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec  # noqa: E402
from vllm.v1.request import Request  # noqa: E402

BLOCK = 16
LAYERS = ["model.layers.0.self_attn.attn", "model.layers.1.self_attn.attn"]
NUM_BLOCKS = 32
HEADS, HEAD = 2, 8

init_none_hash(sha256)


def make_vllm_config(pool: str, tp: int = 1, rank: int = 0, role: str = "kv_both", engine: str = "test-engine",
                     **extra):
    """The VllmConfig of one process of engine `engine`: its instance id, which
    vLLM gives every process of one engine alike (the config is pickled to
    them), so that the scheduler here and the workers of worker_proc.py are one
    engine to an embedded pool unless a test says otherwise."""
    extra = {"pool": pool, "capacity_bytes": 64 * 4096 * 4, "no_prefault": True,
             "key_namespace": "test-ns", **extra}
    ktc = KVTransferConfig(kv_connector="UMBPStoreConnector", kv_connector_module_path="umbp.vllm",
                           kv_role=role, kv_load_failure_policy="recompute", kv_connector_extra_config=extra)
    cfg = VllmConfig(kv_transfer_config=ktc, cache_config=CacheConfig(block_size=BLOCK),
                     parallel_config=ParallelConfig(tensor_parallel_size=tp, rank=rank),
                     device_config=DeviceConfig("cpu"))
    cfg.instance_id = engine   # VllmConfig.__post_init__ sets a fresh one (time_ns) per construction
    return cfg


# Layouts: "one-group" (both layers in KV group 0) or "two-groups" (layer 0 in
# group 0 with head size HEAD, layer 1 in group 1 with head size 2*HEAD: two KV
# cache groups whose block objects differ in size, as with HMA).
def _head_sizes(layout: str) -> dict[str, int]:
    if layout == "two-groups":
        return {LAYERS[0]: HEAD, LAYERS[1]: 2 * HEAD}
    assert layout == "one-group", layout
    return {n: HEAD for n in LAYERS}


def make_kv_cache_config(layout: str = "one-group") -> KVCacheConfig:
    if layout == "two-groups":
        groups = [KVCacheGroupSpec([n], FullAttentionSpec(block_size=BLOCK, num_kv_heads=HEADS, head_size=h,
                                                          dtype=torch.float16))
                  for n, h in _head_sizes(layout).items()]
    else:
        groups = [KVCacheGroupSpec(LAYERS, FullAttentionSpec(block_size=BLOCK, num_kv_heads=HEADS,
                                                             head_size=HEAD, dtype=torch.float16))]
    return KVCacheConfig(num_blocks=NUM_BLOCKS, kv_cache_tensors=[], kv_cache_groups=groups)


def make_kv_caches(seed: int | None = None, layout: str = "one-group") -> dict[str, torch.Tensor]:
    """(2, num_blocks, block, heads, head) per layer: K and V split (vLLM's CPU/flash layout)."""
    g = torch.Generator().manual_seed(seed or 0)
    out = {}
    for name, head in _head_sizes(layout).items():
        t = torch.zeros(2, NUM_BLOCKS, BLOCK, HEADS, head, dtype=torch.float16)
        if seed is not None:
            t.copy_(torch.randn(t.shape, generator=g).to(torch.float16))
        out[name] = t
    return out


def make_request(rid: str, tokens: list[int]) -> Request:
    return Request(rid, tokens, SamplingParams(max_tokens=4), None,
                   block_hasher=get_request_block_hasher(BLOCK, sha256))


def sched_output(new=(), cached=None, num_scheduled=None, finished=(), groups=1):
    """A SchedulerOutput for new requests [(req, block_ids, computed)] and cached ones
    (with groups > 1, every KV group gets the same block ids)."""
    new_reqs = [NewRequestData(req_id=r.request_id, prompt_token_ids=r.prompt_token_ids, mm_features=[],
                               sampling_params=r.sampling_params, pooling_params=None,
                               block_ids=tuple(list(ids) for _ in range(groups)), num_computed_tokens=c,
                               lora_request=None,
                               prefill_token_ids=list(r.prompt_token_ids))
                for r, ids, c in new]
    return SchedulerOutput(scheduled_new_reqs=new_reqs,
                           scheduled_cached_reqs=cached or CachedRequestData.make_empty(),
                           num_scheduled_tokens=dict(num_scheduled or {}),
                           total_num_scheduled_tokens=sum((num_scheduled or {}).values()),
                           scheduled_spec_decode_tokens={}, scheduled_encoder_inputs={},
                           finished_req_ids=set(finished),
                           free_encoder_mm_hashes=[])


@pytest.fixture
def pool_name(request):
    name = f"t-py-{os.getpid()}-{request.node.name[:24]}".replace("[", "-").replace("]", "")
    yield name
    from umbp import _lib as L
    from umbp import pool_notes
    L.lib().umbp_pool_destroy(name.encode())
    try:
        os.unlink(pool_notes.path(name))
    except FileNotFoundError:
        pass


def stop_daemon(d: subprocess.Popen, timeout: float = 30) -> int | None:
    """SIGTERM a `umbp daemon` process and reap it: its exit status, or None
    when it had to be killed after `timeout` seconds."""
    if d.poll() is None:
        d.send_signal(signal.SIGTERM)
    try:
        return d.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        d.kill()
        d.wait()
        return None
