# SPDX-License-Identifier: Apache-2.0
"""UMBPStoreConnector inside vLLM's real Scheduler (on CPU).

The Scheduler, its KVCacheManager, ModelConfig (from a local model directory
holding only a small config.json: no weights, no tokenizer, no download) and
KVOutputAggregator are vLLM's own. What cannot run without a GPU is the model
runner's forward pass: each step the two worker connectors (TP=2, separate
exec'd processes, CPU tensors as KV caches) run the connector calls in the CPU
model runner's order, and the test builds each rank's ModelRunnerOutput (one
sampled token per request that finished its prompt) for the aggregator."""
from __future__ import annotations

import ctypes as C
import json
import os
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from conftest import BLOCK, HEAD, HEADS, LAYERS, NUM_BLOCKS, make_kv_cache_config, stop_daemon
from test_connector import Worker

from vllm.config import (CacheConfig, DeviceConfig, KVTransferConfig, ModelConfig, ParallelConfig,
                         SchedulerConfig, VllmConfig)
from vllm.distributed.kv_events import BlockRemoved, BlockStored
from vllm.distributed.kv_transfer.kv_connector.utils import KVOutputAggregator
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import get_request_block_hasher
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput
from vllm.v1.request import Request
from vllm.v1.structured_output import StructuredOutputManager

import umbp.vllm as U
from umbp import _lib as L

TP = 2
EXTRA = {"capacity_bytes": 64 * 4096 * 4, "no_prefault": True, "key_namespace": "sched-ns"}


def model_dir(tmp_path):
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
           "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
           "head_dim": 16, "num_hidden_layers": 2, "vocab_size": 1000,
           "max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "torch_dtype": "float16"}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    return str(tmp_path)


def make_scheduler(tmp_path, pool, extra, num_blocks=NUM_BLOCKS):
    mc = ModelConfig(model=model_dir(tmp_path), skip_tokenizer_init=True, dtype="float16",
                     max_model_len=1024)
    ktc = KVTransferConfig(kv_connector="UMBPStoreConnector", kv_connector_module_path="umbp.vllm",
                           kv_role="kv_both", kv_connector_extra_config={"pool": pool, **extra},
                           kv_load_failure_policy="recompute")
    vc = VllmConfig(model_config=mc, kv_transfer_config=ktc,
                    cache_config=CacheConfig(block_size=BLOCK, enable_prefix_caching=True),
                    scheduler_config=SchedulerConfig(max_model_len=1024, is_encoder_decoder=False,
                                                     max_num_batched_tokens=1024, max_num_seqs=8),
                    parallel_config=ParallelConfig(tensor_parallel_size=TP),
                    device_config=DeviceConfig("cpu"))
    vc.instance_id = "test-engine"   # one engine with the workers of worker_proc.py (conftest)
    # num_blocks < NUM_BLOCKS: the scheduler uses blocks [0, num_blocks) of the
    # workers' KV caches (which keep NUM_BLOCKS blocks)
    vc.cache_config.num_gpu_blocks = num_blocks
    kvc = make_kv_cache_config()
    kvc.num_blocks = num_blocks
    s = Scheduler(vc, kvc, StructuredOutputManager(vc), block_size=BLOCK,
                  log_stats=True)
    published = []
    s.kv_event_publisher.publish = published.append   # what the engine would publish
    return s, published


class Engine:
    """One scheduler + TP worker processes, stepped like vLLM's EngineCore."""

    def __init__(self, tmp_path, pool, num_blocks=NUM_BLOCKS, **extra):
        extra = {**EXTRA, **extra}
        self.s, self.published = make_scheduler(tmp_path, pool, extra, num_blocks)
        self.w = [Worker(pool, TP, r, seed=r + 1, **extra) for r in range(TP)]
        self.agg = KVOutputAggregator.from_connector(self.s.connector, TP)
        self.outputs = []

    def step(self, before_workers=None, after_worker=None):
        """One engine step; after_worker(rank, so) runs when that rank's
        worker step has ended and before the next rank's starts (the workers
        step one after another here)."""
        so = self.s.schedule()
        if before_workers:
            before_workers(so)
        replies = []
        for r, w in enumerate(self.w):
            replies.append(w.call("step", (so.kv_connector_metadata, set(so.finished_req_ids))))
            if after_worker:
                after_worker(r, so)
        sampled = []
        req_ids = list(so.num_scheduled_tokens)
        for rid in req_ids:
            r = self.s.requests[rid]
            done = r.num_computed_tokens + so.num_scheduled_tokens[rid] >= r.num_tokens
            sampled.append([7] if done else [])
        outs = [ModelRunnerOutput(req_ids=req_ids, sampled_token_ids=sampled,
                                  kv_connector_output=KVConnectorOutput(
                                      finished_sending=rep["finished_sending"],
                                      finished_recving=rep["finished_recving"],
                                      kv_connector_stats=rep["stats"],
                                      kv_cache_events=rep["events"],
                                      kv_connector_worker_meta=rep["worker_meta"],
                                      invalid_block_ids=rep["errors"]))
                for rep in replies]
        eco = self.s.update_from_output(so, self.agg.aggregate(outs))
        self.outputs.append(eco)
        return so, eco

    def drain(self, limit=8):
        """Step while EngineCore would (Scheduler.has_requests): delayed frees finish."""
        n = 0
        while self.s.has_requests():
            assert n < limit, "the scheduler never became idle"
            self.step()
            n += 1
        return n

    def assert_kv_equal(self, ids, expected):
        """Every rank's KV of blocks ids is byte-identical to expected[rank]."""
        for r, w in enumerate(self.w):
            got = w.call("dump", ids)
            for name in LAYERS:
                assert torch.equal(got[name].view(torch.int16), expected[r][name].view(torch.int16)), \
                    f"rank {r} {name} blocks {ids}"

    def block_ids(self, so, rid):
        for nr in so.scheduled_new_reqs:
            if nr.req_id == rid:
                return list(nr.block_ids[0])
        raise KeyError(rid)

    def close(self):
        for w in self.w:
            w.close()
        self.s.shutdown()


def req(rid, tokens, max_tokens=1):
    return Request(rid, tokens, SamplingParams(max_tokens=max_tokens), None,
                   block_hasher=get_request_block_hasher(BLOCK, sha256))


def connector_stats(eco):
    for o in eco.values():
        if o.scheduler_stats and o.scheduler_stats.kv_connector_stats:
            return o.scheduler_stats.kv_connector_stats
    return {}


def test_real_scheduler_tp2(tmp_path, pool_name):
    """A stores; after the GPU prefix cache is reset, B with A's prefix gets its
    matched tokens from the pool and its KV is byte-identical to A's; a block
    missing on one rank shortens C's hit; a load that fails makes the real
    scheduler recompute; events and stats are what the scheduler publishes."""
    e = Engine(tmp_path, pool_name)
    try:
        assert type(e.s.connector) is U.UMBPStoreConnector
        tokens = list(range(100, 100 + 4 * BLOCK + 5))
        e.s.add_request(req("A", tokens))
        so, eco = e.step()
        assert so.num_scheduled_tokens == {"A": len(tokens)}
        ids_a = e.block_ids(so, "A")[:4]
        a_bytes = [w.call("dump", ids_a) for w in e.w]
        assert e.s.requests["A"].is_finished(), "A finished after its prompt (max_tokens=1)"
        stored = [ev for b in e.published for ev in b.events if isinstance(ev, BlockStored)]
        assert [ev.medium for ev in stored] == ["CPU"] and len(stored[0].block_hashes) == 4
        st = connector_stats(eco)
        assert st["store_completed"] == 4 * TP and st["store_failed"] == 0 and st["store_bytes"] == 16384

        assert e.drain() >= 1, "A's blocks are freed one step later, once both ranks reported"
        assert e.s.reset_prefix_cache()
        for w in e.w:
            w.call("zero")
        e.s.add_request(req("B", tokens[:4 * BLOCK] + [1, 2, 3]))
        so, eco = e.step()
        assert so.num_scheduled_tokens == {"B": 3}, "4 blocks came from the pool"
        ids_b = e.block_ids(so, "B")[:4]
        e.assert_kv_equal(ids_b, a_bytes)
        assert connector_stats(eco)["load_completed"] == 4 * TP

        # block 2 gone on rank 1 only: C's hit stops before it
        e.drain()
        assert e.s.reset_prefix_cache()
        conn = e.s.connector
        A_hashes = req("A", tokens).block_hashes
        assert L.lib().umbp_remove(conn.pool.h, U._keys(conn._tmpl(1, 0), [A_hashes[2]])) == 0
        e.s.add_request(req("C", tokens))
        so, _ = e.step()
        assert so.num_scheduled_tokens == {"C": len(tokens) - 2 * BLOCK}

        # block 1 removed after the scheduler counted it and before the workers load:
        # the load fails, the real scheduler marks the blocks invalid and recomputes
        e.drain()
        assert e.s.reset_prefix_cache()
        e.s.add_request(req("D", tokens[:4 * BLOCK] + [9]))

        def drop(so):
            assert so.num_scheduled_tokens == {"D": 1}
            L.lib().umbp_remove(conn.pool.h, U._keys(conn._tmpl(0, 0), [A_hashes[1]]))
        so, eco = e.step(before_workers=drop)
        assert "D" in e.s.requests, "D is rescheduled, not finished with bad KV"
        assert e.s.requests["D"].num_computed_tokens <= BLOCK
        so, _ = e.step()
        assert so.num_scheduled_tokens["D"] >= len(tokens[:4 * BLOCK]) - BLOCK
    finally:
        e.close()


def _scrape(families=None):
    """vLLM's Prometheus registry as a scrape would see it, parsed strictly."""
    from prometheus_client import REGISTRY, generate_latest
    from prometheus_client.parser import text_string_to_metric_families
    out = {}
    for fam in text_string_to_metric_families(generate_latest(REGISTRY).decode()):
        for smp in fam.samples:
            if smp.name.startswith("vllm:umbp_"):
                labels = ",".join(f"{k}={v}" for k, v in sorted(smp.labels.items())
                                  if k not in ("model_name", "engine"))
                out[f"{smp.name}{{{labels}}}"] = smp.value
    return out


def test_prometheus_metrics_after_real_steps(tmp_path, pool_name):
    """The connector's metrics in vLLM's own Prometheus registry (vLLM's
    PrometheusStatLogger fed each step's SchedulerStats, as the engine's
    output processor does), scraped and parsed: values, not only names."""
    from vllm.v1.metrics.loggers import PrometheusStatLogger
    e = Engine(tmp_path, pool_name)
    prom = PrometheusStatLogger(e.s.vllm_config)
    steps = []

    def step(**kw):
        so, eco = e.step(**kw)
        for o in eco.values():
            prom.record(scheduler_stats=o.scheduler_stats, iteration_stats=None)
        steps.append(so)
        return so, eco

    def drain():
        while e.s.has_requests():
            step()
    try:
        a = list(range(100, 100 + 4 * BLOCK + 5))           # 4 whole blocks + 5 tokens
        e.s.add_request(req("A", a))
        step()
        drain()
        m = _scrape()
        assert m["vllm:umbp_lookups_total{}"] == 1
        assert m["vllm:umbp_lookup_tokens_total{}"] == len(a)
        assert m["vllm:umbp_matched_tokens_total{}"] == 0
        assert m["vllm:umbp_transfer_completed_total{operation=store}"] == 4 * TP   # blocks, every rank
        assert m["vllm:umbp_transfer_bytes_total{operation=store}"] == 4 * TP * 2 * HEADS * HEAD * BLOCK * 2 * 2
        assert m["vllm:umbp_store_backlog_blocks{}"] == 0
        assert m.get("vllm:umbp_load_latency_seconds_count{}", 0) == 0

        assert e.s.reset_prefix_cache()
        b = a[:4 * BLOCK] + [1, 2, 3]
        e.s.add_request(req("B", b))
        step()
        drain()
        m = _scrape()
        assert m["vllm:umbp_lookups_total{}"] == 2
        assert m["vllm:umbp_lookup_tokens_total{}"] == len(a) + len(b)
        assert m["vllm:umbp_matched_tokens_total{}"] == 4 * BLOCK, "B's 4 blocks came from the pool"
        assert m["vllm:umbp_transfer_completed_total{operation=load}"] == 4 * TP
        assert m["vllm:umbp_load_latency_seconds_count{}"] == TP, "one load job per rank"
        assert 0 < m["vllm:umbp_load_latency_seconds_sum{}"] < 60
        assert not any("failures_total" in k for k in m if m[k]), m

        # a block removed on rank 0 after the scheduler counted it: one block
        # fails to load there, cause "missing"
        assert e.s.reset_prefix_cache()
        conn = e.s.connector
        hashes = req("A", a).block_hashes
        e.s.add_request(req("D", a[:4 * BLOCK] + [9]))

        def drop(so):
            assert so.num_scheduled_tokens == {"D": 1}
            assert L.lib().umbp_remove(conn.pool.h, U._keys(conn._tmpl(0, 0), [hashes[1]])) == 0
        step(before_workers=drop)
        drain()
        m = _scrape()
        assert m["vllm:umbp_transfer_failures_total{cause=missing,operation=load}"] == 1
        assert m["vllm:umbp_transfer_failed_total{operation=load}"] == 1
        assert m["vllm:umbp_matched_tokens_total{}"] >= 4 * BLOCK + 4 * BLOCK
    finally:
        e.close()


def test_another_model_at_the_same_path_gets_another_namespace(tmp_path):
    """Models served one after another from one path (a container's /model
    mount, a `current` symlink moved to a fine-tune) with the same TP, dtype
    and block size: the derived namespace follows what is at the path (its
    config and samples of its weights), so a daemon's pool never gives the
    second model the first one's KV; the same files give the same namespace
    (engines of one model, hosts sharing blocks through `umbp tier`)."""
    path = Path(model_dir(tmp_path))
    weights = path / "model.safetensors"
    weights.write_bytes(bytes(range(256)) * 4096)

    def ns():
        mc = ModelConfig(model=str(path), skip_tokenizer_init=True, dtype="float16", max_model_len=1024)
        vc = VllmConfig(model_config=mc, cache_config=CacheConfig(block_size=BLOCK),
                        parallel_config=ParallelConfig(tensor_parallel_size=TP), device_config=DeviceConfig("cpu"))
        return U.derive_namespace(vc, make_kv_cache_config(), U.UMBPConfig.from_extra({}))

    first = ns()
    assert ns() == first, "the same model at the same path: the same namespace"
    cfg = json.loads((path / "config.json").read_text())
    cfg["intermediate_size"] *= 2          # another model, the same KV layout
    (path / "config.json").write_text(json.dumps(cfg))
    wider = ns()
    assert wider != first
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 1              # a fine-tune: same config, other weights
    weights.write_bytes(bytes(data))
    assert ns() not in (first, wider)
    data[len(data) // 2] ^= 1
    weights.write_bytes(bytes(data))
    assert ns() == wider, "the files, not their inode or mtime, name the model"


HUB_NS = """
import sys
from conftest import BLOCK, make_kv_cache_config
from vllm.config import CacheConfig, DeviceConfig, ModelConfig, ParallelConfig, VllmConfig
import umbp.vllm as U
mc = ModelConfig(model="umbp-test/tiny", skip_tokenizer_init=True, dtype="float16", max_model_len=1024)
vc = VllmConfig(model_config=mc, cache_config=CacheConfig(block_size=BLOCK),
                parallel_config=ParallelConfig(tensor_parallel_size=2), device_config=DeviceConfig("cpu"))
print(U.derive_namespace(vc, make_kv_cache_config(), U.UMBPConfig.from_extra({})))
"""


def test_a_hub_model_updated_on_the_hub_gets_another_namespace(tmp_path):
    """A model given by hub id, its default revision "main" moved to new
    weights (an upload, then an engine restart on a daemon's pool): the
    derived namespace follows the snapshot vLLM fetched into the Hugging Face
    cache, so the new weights never load the old ones' KV; the same snapshot
    gives the same namespace. A real ModelConfig resolves the id offline from
    a cache laid out as huggingface_hub lays it out (refs/main naming the
    commit whose snapshot directory holds the files)."""
    repo = tmp_path / "hub" / "models--umbp-test--tiny"
    (tmp_path / "src").mkdir()
    src = Path(model_dir(tmp_path / "src"))

    def commit(name, weights):
        snap = repo / "snapshots" / name
        snap.mkdir(parents=True)
        (snap / "config.json").write_bytes((src / "config.json").read_bytes())
        (snap / "model.safetensors").write_bytes(weights)
        (repo / "refs").mkdir(exist_ok=True)
        (repo / "refs" / "main").write_text(name)

    def ns():
        env = {**os.environ, "HF_HUB_CACHE": str(tmp_path / "hub"), "HF_HUB_OFFLINE": "1",
               "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")])}
        r = subprocess.run([sys.executable, "-c", HUB_NS], env=env, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr[-3000:]
        return r.stdout.split()[-1]

    commit("a" * 40, bytes(range(256)) * 4096)
    first = ns()
    assert first.startswith("vllm-") and ns() == first, "one snapshot: one namespace"
    commit("b" * 40, bytes(range(255, -1, -1)) * 4096)   # "main" moved to other weights
    assert ns() != first
    (repo / "refs" / "main").write_text("a" * 40)        # back to the first snapshot
    assert ns() == first


def test_hf_overrides_give_another_namespace(tmp_path):
    """One model, one path, one KV layout, but `--hf-overrides` that change
    what the model computes (rms_norm_eps before every K projection): the
    engines must not share blocks; the same overrides do share them."""
    path = model_dir(tmp_path)

    def ns(**kw):
        mc = ModelConfig(model=path, skip_tokenizer_init=True, dtype="float16", max_model_len=1024, **kw)
        vc = VllmConfig(model_config=mc, cache_config=CacheConfig(block_size=BLOCK),
                        parallel_config=ParallelConfig(tensor_parallel_size=TP), device_config=DeviceConfig("cpu"))
        return U.derive_namespace(vc, make_kv_cache_config(), U.UMBPConfig.from_extra({}))

    plain, eps = ns(), ns(hf_overrides={"rms_norm_eps": 0.1})
    assert eps != plain
    assert ns(hf_overrides={"rms_norm_eps": 0.1}) == eps


def test_kv_cache_layout_gives_another_namespace(tmp_path):
    """One model, one path, but attention backends that lay a block out
    differently (vLLM resolves the KV cache layout once per engine and puts it
    on the KVCacheConfig of the scheduler and of every worker): their blocks'
    bytes differ, so their derived namespaces must; the scheduler's copy of the
    config (vLLM's own generate_scheduler_kv_cache_config) derives the
    workers' namespace, or no lookup would ever hit. An explicit namespace's
    fingerprint leaves the layout out of its hash (records written before it
    was hashed still compare) and carries it as a fact."""
    from vllm.v1.core.kv_cache_utils import generate_scheduler_kv_cache_config
    path = model_dir(tmp_path)
    mc = ModelConfig(model=path, skip_tokenizer_init=True, dtype="float16", max_model_len=1024)
    vc = VllmConfig(model_config=mc, cache_config=CacheConfig(block_size=BLOCK),
                    parallel_config=ParallelConfig(tensor_parallel_size=TP), device_config=DeviceConfig("cpu"))
    plain = U.UMBPConfig.from_extra({})

    def worker_cfg(layout):
        kc = make_kv_cache_config()
        kc.kv_cache_layout = layout
        return kc

    nhd, hnd = worker_cfg("LBHNC"), worker_cfg("LBNHC")
    a, b = U.derive_namespace(vc, nhd, plain), U.derive_namespace(vc, hnd, plain)
    assert a != b, "two KV cache layouts of one model must not share blocks"
    assert U.derive_namespace(vc, worker_cfg("LBHNC"), plain) == a
    sched = generate_scheduler_kv_cache_config([nhd, worker_cfg("LBHNC")])
    assert U.derive_namespace(vc, sched, plain) == a, "the scheduler derives its workers' namespace"
    explicit = U.UMBPConfig.from_extra({"key_namespace": "shared"})
    (fa, facts_a), (fb, facts_b) = U.layout_fingerprint(vc, nhd, explicit), U.layout_fingerprint(vc, hnd, explicit)
    assert fa == fb and (facts_a["cache layout"], facts_b["cache layout"]) == ("LBHNC", "LBNHC")
    import umbp.vllm_config as VC
    assert "cache layout" in VC.LAYOUT_UNHASHED, "a layout difference alone must still refuse"
    assert facts_a["derived"] == a and facts_b["derived"] == b


def test_own_cache_hit_stores_nothing_again(tmp_path, pool_name):
    """A request whose prefix is in vLLM's own cache and in the pool stores
    and announces none of those blocks again (the probe found them on every
    rank); only its new whole blocks are stored."""
    e = Engine(tmp_path, pool_name)
    try:
        a = list(range(100, 100 + 4 * BLOCK + 5))
        e.s.add_request(req("A", a))
        _, eco = e.step()
        assert connector_stats(eco)["store_submitted"] == 4 * TP
        e.drain()
        n_stored = len([ev for b in e.published for ev in b.events if isinstance(ev, BlockStored)])
        # same prefix plus one more whole block, no reset: vLLM's own cache has 4 blocks
        e.s.add_request(req("A2", a[:4 * BLOCK] + list(range(7, 7 + BLOCK + 3))))
        so, eco = e.step()
        assert so.num_scheduled_tokens == {"A2": BLOCK + 3}, "4 blocks were a hit in vLLM's own cache"
        st = connector_stats(eco)
        assert st["store_submitted"] == 1 * TP, f"only the new block is stored: {st}"
        e.drain()
        new = [ev for b in e.published for ev in b.events if isinstance(ev, BlockStored)][n_stored:]
        assert [len(ev.block_hashes) for ev in new] == [1], new
    finally:
        e.close()


def test_real_scheduler_async_loads(tmp_path, pool_name):
    """load_async: the real scheduler parks B in WAITING_FOR_REMOTE_KVS while
    both ranks load, schedules it once both reported finished_recving, and B's
    KV is byte-identical to A's; E, aborted while its load is in flight, has its
    load cancelled and its blocks freed only after the workers reported it."""
    from vllm.v1.request import RequestStatus
    e = Engine(tmp_path, pool_name, load_async=True)
    try:
        tokens = list(range(300, 300 + 4 * BLOCK + 5))
        e.s.add_request(req("A", tokens))
        so, _ = e.step()
        ids_a = e.block_ids(so, "A")[:4]
        a_bytes = [w.call("dump", ids_a) for w in e.w]
        e.drain()
        assert e.s.reset_prefix_cache()
        for w in e.w:
            w.call("zero")
        e.s.add_request(req("B", tokens[:4 * BLOCK] + [1, 2]))
        so, _ = e.step()
        assert so.num_scheduled_tokens == {}, "B waits for its asynchronous load"
        assert [len(x.block_ids) for x in so.kv_connector_metadata.loads] == [4]
        ids_b = list(so.kv_connector_metadata.loads[0].block_ids)
        assert e.s.requests["B"].status in (RequestStatus.WAITING_FOR_REMOTE_KVS,
                                            RequestStatus.WAITING)
        # the load ends when the workers' copy threads get a core: steps until
        # then schedule nothing (a loaded machine takes more than a few)
        end = time.monotonic() + 60
        while True:
            so, eco = e.step()
            if so.num_scheduled_tokens or time.monotonic() > end:
                break
            time.sleep(0.01)
        assert so.num_scheduled_tokens == {"B": 2}, "B resumes after the load with 64 tokens cached"
        e.assert_kv_equal(ids_b, a_bytes)
        e.drain()

        # E aborted between the step that sent its load and the workers' next step
        assert e.s.reset_prefix_cache()
        e.s.add_request(req("E", tokens[:4 * BLOCK] + [5]))
        so, _ = e.step()
        assert [x.req_id for x in so.kv_connector_metadata.loads] == ["E"]
        # the workers poll right after submitting, so the load is normally still
        # running when their step ends; if it did finish, there is nothing to cancel
        in_flight = e.s.connector._reqs["E"].async_loading
        e.s.finish_requests("E", RequestStatus.FINISHED_ABORTED)
        so, _ = e.step()
        assert so.kv_connector_metadata.cancelled == (["E"] if in_flight else [])
        e.drain()
        assert "E" not in e.s.requests
        assert e.s.kv_cache_manager.block_pool.get_num_free_blocks() == NUM_BLOCKS - 1
        assert e.s.reset_prefix_cache()
    finally:
        e.close()


# ---- a pool seen from the test process ------------------------------------------

class PoolView:
    """The test's own attachment to a pool: presence of keys, pins and held
    (reserved, never published) slots, through libumbp's public API."""

    def __init__(self, pool, namespace=EXTRA["key_namespace"]):
        self.lib = L.lib()
        o = L.AttachOpts()
        self.lib.umbp_attach_opts_init(C.byref(o))
        self.h = C.c_void_p()
        L.check(self.lib.umbp_pool_attach(pool.encode(), C.byref(o), C.byref(self.h)), "attach")
        ns = C.c_uint32()
        L.check(self.lib.umbp_ns_register(self.h, namespace.encode(), C.byref(ns)), "ns")
        self.ns = ns.value
        self.pins: list[int] = []
        self.held: list[int] = []

    def keys(self, rank, hashes, group=0):
        k = L.Key()
        k.ns, k.tp_rank, k.group = self.ns, rank, group
        return U._keys(k, list(hashes))

    def present(self, rank, hashes, group=0) -> list[bool]:
        out = (C.c_uint8 * max(1, len(hashes)))()
        self.lib.umbp_contains_bulk(self.h, len(hashes), self.keys(rank, hashes, group), out)
        return [bool(x) for x in out[:len(hashes)]]

    def pin(self, rank, hashes):
        slots = (C.c_uint32 * len(hashes))()
        assert self.lib.umbp_lookup_pin_bulk(self.h, len(hashes), self.keys(rank, hashes), slots) == len(hashes)
        self.pins += list(slots)

    def hold_free_slots(self):
        """Reserve every free slot (nothing is published yet, so nothing is evicted)."""
        c = L.SlotCensus()
        L.check(self.lib.umbp_census(self.h, C.byref(c)), "census")
        buf = (C.c_uint32 * c.in_rings)()
        got = L.check(self.lib.umbp_reserve_bulk(self.h, -1, self.ns, c.in_rings, buf), "reserve")
        self.held += list(buf[:got])
        return got

    def release(self, n=None):
        n = len(self.held) if n is None else n
        for s in self.held[:n]:
            assert self.lib.umbp_abort(self.h, s) == 0
        del self.held[:n]

    def close(self):
        self.release()
        if self.pins:
            self.lib.umbp_unpin_bulk(self.h, len(self.pins), (C.c_uint32 * len(self.pins))(*self.pins))
            self.pins = []
        self.lib.umbp_pool_detach(self.h)


def stored(e, since=0):
    return [ev for b in e.published[since:] for ev in b.events if isinstance(ev, BlockStored)]


def _umbp_cli():
    return str(Path(L._find_library()).resolve().parent / "tools" / "umbp")


def start_daemon(pool):
    """`umbp daemon` in the foreground; returns once it logged 'ready'."""
    p = subprocess.Popen([_umbp_cli(), "daemon", pool, "--capacity", "1MiB", "--slot-size", "4KiB",
                          "--no-prefault", "--foreground"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    lines: queue.Queue = queue.Queue()
    log: list[str] = []
    threading.Thread(target=lambda: [lines.put(x) for x in p.stderr] + [lines.put(None)], daemon=True).start()
    deadline = time.monotonic() + 30
    while True:
        try:
            line = lines.get(timeout=max(0.1, deadline - time.monotonic()))
        except queue.Empty:
            p.kill()
            raise AssertionError(f"umbp daemon not ready after 30 s: {log}")
        if line is None:
            raise AssertionError(f"umbp daemon exited with {p.wait()}: {log}")
        log.append(line)
        if "ready:" in line:
            return p, lines, log


def test_standalone_daemon_pool_across_engines(tmp_path, pool_name):
    """standalone: `umbp daemon` owns the pool; engine 1 (real scheduler + TP=2
    workers) stores A and shuts down; the pool and A's blocks remain; engine 2
    (new scheduler and workers, empty KV caches) gets A's prefix as matched
    tokens and loads byte-identical KV; SIGTERM stops the daemon cleanly and
    keeps the pool."""
    d, lines, log = start_daemon(pool_name)
    rc = None
    try:
        tokens = list(range(500, 500 + 4 * BLOCK + 5))
        a = req("A", tokens)
        e1 = Engine(tmp_path, pool_name, mode="standalone")
        try:
            assert e1.s.connector.pool.owner is False
            e1.s.add_request(a)
            so, _ = e1.step()
            ids_a = e1.block_ids(so, "A")[:4]
            a_bytes = [w.call("dump", ids_a) for w in e1.w]
            assert [len(ev.block_hashes) for ev in stored(e1)] == [4]
            e1.drain()
        finally:
            e1.close()
        assert d.poll() is None, "the daemon outlives the engine"
        assert subprocess.run([_umbp_cli(), "pool", "info", pool_name], capture_output=True).returncode == 0
        v = PoolView(pool_name)
        try:
            assert v.present(0, a.block_hashes[:4]) == [True] * 4
            assert v.present(1, a.block_hashes[:4]) == [True] * 4
        finally:
            v.close()

        e2 = Engine(tmp_path, pool_name, mode="standalone")
        try:
            for w in e2.w:
                w.call("zero")
            e2.s.add_request(req("B", tokens[:4 * BLOCK] + [1, 2, 3]))
            so, eco = e2.step()
            assert so.num_scheduled_tokens == {"B": 3}, "engine 2 got A's 4 blocks from the daemon's pool"
            ids_b = e2.block_ids(so, "B")[:4]
            e2.assert_kv_equal(ids_b, a_bytes)
            assert connector_stats(eco)["load_completed"] == 4 * TP
            e2.drain()
        finally:
            e2.close()
    finally:
        rc = stop_daemon(d)
    while (x := lines.get(timeout=5)) is not None:
        log.append(x)
    assert rc == 0, f"daemon exit status {rc}: {log}"
    assert any("stopping on SIGTERM" in x for x in log) and "stopped" in log[-1], log
    assert subprocess.run([_umbp_cli(), "pool", "info", pool_name], capture_output=True).returncode == 0, \
        "the daemon keeps its pool when stopped"


@pytest.mark.parametrize("save_decode", [False, True])
def test_save_decode_cache(tmp_path, pool_name, save_decode):
    """A's prompt fills 2 blocks (+10 tokens); 8 decode steps fill block 2.
    save_decode_cache=false stores blocks 0-1 only; true also stores block 2
    (a full decode block), never the partial block 3: in the pool on both
    ranks, in BlockStored, and as matched tokens for a later request."""
    e = Engine(tmp_path, pool_name, save_decode_cache=save_decode)
    v = PoolView(pool_name)
    try:
        prompt = list(range(700, 700 + 2 * BLOCK + 10))
        a = req("A", prompt, max_tokens=8)
        e.s.add_request(a)
        e.drain(limit=12)
        assert a.num_tokens == len(prompt) + 8 and len(a.block_hashes) == 3
        want = 3 if save_decode else 2
        for r in range(TP):
            assert v.present(r, a.block_hashes[:3]) == [True] * want + [False] * (3 - want)
        assert sum(len(ev.block_hashes) for ev in stored(e)) == want
        assert e.s.reset_prefix_cache()
        e.s.add_request(req("B", list(a.all_token_ids[:3 * BLOCK]) + [1]))
        so, _ = e.step()
        assert so.num_scheduled_tokens == {"B": 3 * BLOCK + 1 - want * BLOCK}
    finally:
        v.close()
        e.close()


def test_store_retry_after_pool_full(tmp_path, pool_name):
    """A real shortage: every slot is reserved by the test or pinned. Rank 0
    and rank 1 each find 2 free slots for A's 4 blocks: blocks 0-1 are stored
    and announced, blocks 2-3 are published on no rank. A's next step (a
    decode step) stores again from block 2 and fails again while the pool is
    still full; once the slots are freed the next step stores blocks 2-3 and
    announces them (parent: block 1). A later request loads all 4 blocks."""
    e = Engine(tmp_path, pool_name)
    v = PoolView(pool_name)
    try:
        tokens = list(range(900, 900 + 4 * BLOCK + 5))
        a = req("A", tokens, max_tokens=4)
        h = a.block_hashes
        assert v.hold_free_slots() > 8
        v.release(2)   # 2 free slots for rank 0

        def between(rank, so):
            if rank == 0:   # rank 0's blocks stay (pinned); 2 free slots for rank 1
                v.pin(0, h[:2])
                v.release(2)
        e.s.add_request(a)
        so, eco = e.step(after_worker=between)
        ids_a = e.block_ids(so, "A")[:4]
        assert [(p.first_block, p.block_ids) for p in so.kv_connector_metadata.stores] == [(0, ids_a)]
        st = connector_stats(eco)
        assert st["store_completed"] == 2 * TP and st["store_failed"] == 2 * TP
        for r in range(TP):
            assert v.present(r, h[:4]) == [True, True, False, False], f"rank {r}"
        ev = stored(e)
        assert [x.block_hashes for x in ev] == [list(h[:2])] and ev[0].parent_block_hash is None
        v.pin(1, h[:2])   # nothing left to evict: the next store fails too
        a_bytes = [w.call("dump", ids_a) for w in e.w]

        n = len(e.published)
        so, eco = e.step()
        assert [(p.first_block, p.block_ids) for p in so.kv_connector_metadata.stores] == [(2, ids_a[2:])]
        assert connector_stats(eco)["store_failed"] == 2 * TP
        assert stored(e, n) == []
        for r in range(TP):
            assert v.present(r, h[:4]) == [True, True, False, False]

        v.release()
        n = len(e.published)
        so, eco = e.step()
        assert [(p.first_block, p.block_ids) for p in so.kv_connector_metadata.stores] == [(2, ids_a[2:])]
        assert connector_stats(eco)["store_completed"] == 2 * TP
        ev = stored(e, n)
        assert [x.block_hashes for x in ev] == [list(h[2:4])] and ev[0].parent_block_hash == h[1]
        for r in range(TP):
            assert v.present(r, h[:4]) == [True] * 4
        e.drain()

        assert e.s.reset_prefix_cache()
        for w in e.w:
            w.call("zero")
        e.s.add_request(req("B", tokens[:4 * BLOCK] + [3]))
        so, _ = e.step()
        assert so.num_scheduled_tokens == {"B": 1}
        ids_b = e.block_ids(so, "B")[:4]
        e.assert_kv_equal(ids_b, a_bytes)
    finally:
        v.close()
        e.close()


def test_preempted_request_loads_cancelled(tmp_path, pool_name):
    """Preemption by vLLM's real scheduler, with load_async: a cache of 8 usable
    blocks; W (2 blocks) and V (5 blocks, 4 of them loaded from the pool) decode
    until V needs a 6th block and the scheduler preempts it (running[-1]). The
    step's preempted_req_ids is {V} and the connector metadata the workers get
    has cancelled == [V]. V resumes once W finished: its prefix blocks still in
    the prefix cache are hits, the ones W's growth evicted are loaded from the
    pool again, byte-identical to the original, and it recomputes from block 4.
    Then reset_prefix_cache(reset_running_requests=True) preempts V again and the
    next step both cancels V and re-plans V's load from the pool (now the whole
    prefix, the workers' caches zeroed): the workers cancel only loads in flight
    before the preemption, so the new load completes on both ranks,
    byte-identically, and V finishes all 40 of its tokens.

    What vLLM 0.34 does not allow: a preempted request with a UMBP load in
    flight. Sync loads end inside their step (wait_for_layer_load), and a
    request whose async load runs is WAITING_FOR_REMOTE_KVS, which
    Scheduler._preempt_request refuses (only RUNNING requests are preempted;
    the scheduler admits an async load only if it fits, "isn't preemptible
    here"). A step that preempts schedules no waiting request, so its
    metadata holds no load of the preempted one either. So here the workers'
    handle_preemptions finds no job of V to cancel; the job cancellation
    itself (the same cancelled list) is shown for an aborted request in
    test_real_scheduler_async_loads."""
    from vllm.v1.request import RequestStatus
    e = Engine(tmp_path, pool_name, num_blocks=9, load_async=True)
    try:
        tokens = list(range(1100, 1100 + 4 * BLOCK + 2))
        e.s.add_request(req("A", tokens))
        so, _ = e.step()
        ids_a = e.block_ids(so, "A")[:4]
        a_bytes = [w.call("dump", ids_a) for w in e.w]
        e.drain()
        assert e.s.reset_prefix_cache()
        for w in e.w:
            w.call("zero")

        def same_as_a(ids):
            e.assert_kv_equal(ids, a_bytes)

        def step_until(cond, limit=48):
            for _ in range(limit):
                so, _ = e.step()
                if cond(so):
                    return so
            raise AssertionError("condition never met")

        # 9 blocks, block 0 is vLLM's null block: W takes 2, V 5 (66 tokens), 1 free
        v = req("V", tokens[:4 * BLOCK] + [1, 2], max_tokens=40)
        e.s.add_request(req("W", list(range(2000, 2000 + 2 * BLOCK - 4)), max_tokens=40))
        e.s.add_request(v)
        so, _ = e.step()
        m = so.kv_connector_metadata
        assert [(x.req_id, len(x.block_ids)) for x in m.loads] == [("V", 4)]
        assert v.status == RequestStatus.WAITING_FOR_REMOTE_KVS
        so = step_until(lambda so: "V" in so.num_scheduled_tokens)
        assert so.num_scheduled_tokens["V"] == 2, "V runs on the 4 blocks it loaded"
        same_as_a(e.block_ids(so, "V")[:4])

        # W takes the free block at 33 tokens; V at 81 tokens needs a 6th: preempted
        so = step_until(lambda so: so.preempted_req_ids)
        assert so.preempted_req_ids == {"V"} and v.status == RequestStatus.PREEMPTED
        assert v.num_preemptions == 1 and "W" in so.num_scheduled_tokens
        m = so.kv_connector_metadata
        assert m.cancelled == ["V"], "the preempted id reaches the workers' handle_preemptions"
        assert m.loads == []
        assert not e.s.connector._reqs["V"].async_loading, "its load had ended before"
        n_tokens = v.num_tokens   # 66 prompt + 15 sampled

        # V resumes after W finished: its prefix blocks still cached are hits,
        # the ones W's growth evicted come from the pool again
        so = step_until(lambda so: so.kv_connector_metadata.loads)
        (ld,) = so.kv_connector_metadata.loads
        assert ld.req_id == "V" and so.kv_connector_metadata.cancelled == []
        first = 4 - len(ld.hashes)
        assert 0 <= first < 4 and ld.hashes == list(v.block_hashes[first:4])
        assert "W" not in e.s.requests
        so = step_until(lambda so: "V" in so.num_scheduled_tokens)
        assert so.num_scheduled_tokens["V"] == n_tokens - 4 * BLOCK, "recomputed from block 4"
        assert e.block_ids(so, "V")[first:4] == list(ld.block_ids)
        same_as_a(e.block_ids(so, "V")[:4])
        e.step()

        # preempted outside schedule(): the same metadata cancels V and loads V
        assert e.s.reset_prefix_cache(reset_running_requests=True)
        assert v.status == RequestStatus.PREEMPTED and v.num_preemptions == 2
        for w in e.w:
            w.call("zero")
        n = len(e.outputs)
        so, _ = e.step()
        m = so.kv_connector_metadata
        assert so.preempted_req_ids == {"V"} and m.cancelled == ["V"]
        assert [(x.req_id, x.hashes) for x in m.loads] == [("V", list(v.block_hashes[:4]))]
        ids_v = list(m.loads[0].block_ids)
        so = step_until(lambda so: "V" in so.num_scheduled_tokens)
        st = [connector_stats(x) for x in e.outputs[n:]]
        assert sum(x.get("load_completed", 0) for x in st) == 4 * TP, "not cancelled on any rank"
        assert sum(x.get("load_failed", 0) for x in st) == 0
        same_as_a(ids_v)
        e.drain(limit=48)
        assert v.is_finished() and len(v.output_token_ids) == 40
        assert v.num_preemptions == 2
    finally:
        e.close()


# ---- an explicit key_namespace records what its blocks are ------------------------

def _explicit_worker(tmp_path, pool, engine, kv_dtype=torch.float16, block=BLOCK, **extra):
    """A worker-role connector of engine `engine` (vLLM's instance id) with
    key_namespace "shared-ns": a real ModelConfig of the model in tmp_path,
    the KV cache of `kv_dtype` in blocks of `block` tokens."""
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    mc = ModelConfig(model=model_dir(tmp_path), skip_tokenizer_init=True, dtype="float16", max_model_len=1024)
    ktc = KVTransferConfig(kv_connector="UMBPStoreConnector", kv_connector_module_path="umbp.vllm",
                           kv_role="kv_both", kv_load_failure_policy="recompute",
                           kv_connector_extra_config={"pool": pool, "capacity_bytes": 64 * 65536,
                                                      "slot_size": 65536, "no_prefault": True,
                                                      "key_namespace": "shared-ns", **extra})
    vc = VllmConfig(model_config=mc, kv_transfer_config=ktc, cache_config=CacheConfig(block_size=block),
                    parallel_config=ParallelConfig(tensor_parallel_size=1), device_config=DeviceConfig("cpu"))
    vc.instance_id = engine
    kvc = KVCacheConfig(num_blocks=NUM_BLOCKS, kv_cache_tensors=[], kv_cache_groups=[
        KVCacheGroupSpec(["model.layers.0.self_attn.attn", "model.layers.1.self_attn.attn"],
                         FullAttentionSpec(block_size=block, num_kv_heads=HEADS, head_size=HEAD, dtype=kv_dtype))])
    return KVConnectorFactory.create_connector(vc, KVConnectorRole.WORKER, kvc)


def _recorded(pool):
    from umbp import pool_notes
    return pool_notes.read(pool).layouts


def test_explicit_namespace_same_layout_is_shared(tmp_path, pool_name, monkeypatch):
    """Two engines of one model and KV layout given one explicit key_namespace
    (why people set it) share it: the first worker records the fingerprint
    (the namespace it would have derived, its local model named by its files
    rather than its path), the second matches it, and so does a third whose
    model has the same files at another path. The check
    costs once per worker start: nothing after the constructor reads the
    notes or fingerprints the model again."""
    import umbp.vllm_config as VC
    from umbp import pool_notes
    t0 = time.perf_counter()
    a = _explicit_worker(tmp_path, pool_name, "engine-a")
    t_a = time.perf_counter() - t0
    t0 = time.perf_counter()
    b = _explicit_worker(tmp_path, pool_name, "engine-b")
    t_b = time.perf_counter() - t0
    try:
        rec = _recorded(pool_name)
        assert set(rec) == {"shared-ns"}
        fp, facts = rec["shared-ns"]
        assert fp.startswith("vllm-") and fp == a.pool.engine.layout[0] == b.pool.engine.layout[0]
        assert facts["KV dtype"] == ["float16"] and facts["block size"] == BLOCK and facts["TP size"] == 1
        assert a.namespace == b.namespace == "shared-ns" and a.ns_id == b.ns_id
        assert facts["derived"] != fp, "a local model is named by its files, not its path"
        elsewhere = tmp_path / "elsewhere"       # the same files mounted at another path
        elsewhere.mkdir()
        _explicit_worker(elsewhere, pool_name, "engine-c").shutdown()
        with open(pool_notes.path(pool_name)) as f:
            assert sum(ln.startswith("layout\t") for ln in f) == 1, "recorded once, by the first worker"

        def boom(*_a, **_k):
            raise AssertionError("the layout check ran after start")
        monkeypatch.setattr(pool_notes, "parse", boom)
        monkeypatch.setattr(VC, "derive_namespace", boom)
        b.register_kv_caches({n: torch.zeros(2, NUM_BLOCKS, BLOCK, HEADS, HEAD, dtype=torch.float16)
                              for n in ("model.layers.0.self_attn.attn", "model.layers.1.self_attn.attn")})
        print(f"worker start with the layout check: first {t_a * 1e3:.0f} ms, second {t_b * 1e3:.0f} ms")
    finally:
        monkeypatch.undo()
        b.shutdown()
        a.shutdown()


@pytest.mark.parametrize("what", ["dtype", "block"])
def test_explicit_namespace_other_layout_is_refused(tmp_path, pool_name, what):
    """An engine given the same explicit key_namespace as a running one but
    another KV dtype or block size would load the other's bytes as its own:
    it is refused at start, naming the namespace, what differs, both
    fingerprints and the fixes; the first engine and its record stay."""
    a = _explicit_worker(tmp_path, pool_name, "engine-a")
    try:
        kw = {"kv_dtype": torch.bfloat16} if what == "dtype" else {"block": 2 * BLOCK}
        with pytest.raises(ValueError) as e:
            _explicit_worker(tmp_path, pool_name, "engine-b", **kw)
        msg = str(e.value)
        assert "key namespace 'shared-ns'" in msg and pool_name in msg
        assert (("KV dtype ['float16'] there, ['bfloat16'] here" in msg) if what == "dtype"
                else (f"block size {BLOCK} there, {2 * BLOCK} here" in msg))
        fp = a.pool.engine.layout[0]
        assert f"recorded {fp}, this engine's vllm-" in msg
        assert "another kv_connector_extra_config.key_namespace" in msg and "drop key_namespace" in msg
        assert f"umbp pool destroy {pool_name}" in msg
        assert _recorded(pool_name)["shared-ns"][0] == fp
        # the same layout still joins after the refusal
        _explicit_worker(tmp_path, pool_name, "engine-c").shutdown()
    finally:
        a.shutdown()


def test_explicit_namespace_checked_on_a_standalone_pool(tmp_path, pool_name):
    """A pool of `umbp pool create` (no notes yet): the first worker of the
    namespace starts the notes and records it; another block size is refused,
    another namespace on the same pool is not."""
    p = L.PoolParams()
    L.lib().umbp_pool_params_init(C.byref(p))
    p.capacity, p.slot_size, p.no_prefault = 64 * 65536, 65536, True
    h = C.c_void_p()
    assert L.lib().umbp_pool_create(pool_name.encode(), C.byref(p), C.byref(h)) == 0
    try:
        a = _explicit_worker(tmp_path, pool_name, "engine-a", mode="standalone")
        with pytest.raises(ValueError, match="block size 16 there, 32 here"):
            _explicit_worker(tmp_path, pool_name, "engine-b", mode="standalone", block=2 * BLOCK)
        c = _explicit_worker(tmp_path, pool_name, "engine-b", mode="standalone", block=2 * BLOCK,
                             key_namespace="other-ns")
        assert set(_recorded(pool_name)) == {"shared-ns", "other-ns"}
        c.shutdown()
        a.shutdown()
    finally:
        L.lib().umbp_pool_detach(h)
