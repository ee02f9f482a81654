# SPDX-License-Identifier: Apache-2.0
"""vLLM's in-tree UMBPStoreConnector on the umbp backend, inside vLLM's real
Scheduler (on CPU), as test_scheduler.py does for our own connector.

The connector is selected as a user would: kv_connector "UMBPStoreConnector"
with no module path and kv_connector_extra_config {"backend": "umbp", ...};
vLLM's KVConnectorFactory builds vLLM's own class, whose runtime is
umbp.vllm_runtime.UMBPRuntime. umbp.vllm_plugin.register() is called
explicitly in every process (vLLM calls it through the wheel's
`vllm.general_plugins` entry point; that installed-wheel path is tested
elsewhere). TP=2 workers run in separate exec'd processes with CPU tensors as
KV caches (worker_proc.py, command init_intree)."""
from __future__ import annotations

import ctypes as C
import time

import pytest

from conftest import BLOCK, stop_daemon
from intree_util import EXTRA, NS, make_kv_cache_config, register_plugin
from test_connector import Worker
from test_scheduler import TP, Engine, model_dir, req, start_daemon

from vllm.config import (CacheConfig, DeviceConfig, KVTransferConfig, ModelConfig, ParallelConfig,
                         SchedulerConfig, VllmConfig)
from vllm.config.kv_events import KVEventsConfig
from vllm.distributed.kv_events import BlockRemoved
from vllm.distributed.kv_transfer.kv_connector.utils import KVOutputAggregator
from vllm.distributed.kv_transfer.kv_connector.v1.umbp.data import BlockIdentityCodec, UMBPNamespace
from vllm.v1.core.kv_cache_utils import maybe_convert_block_hash
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.request import RequestStatus
from vllm.v1.structured_output import StructuredOutputManager

from umbp import _lib as L
from umbp import vllm_runtime as R

INTREE = "vllm.distributed.kv_transfer.kv_connector.v1.umbp"


class IntreeWorker(Worker):
    INIT = "init_intree"


class IntreeEngine(Engine):
    """test_scheduler.Engine with vLLM's in-tree connector on backend umbp."""

    def __init__(self, tmp_path, pool, num_blocks=32, **extra):
        register_plugin()
        extra = {**EXTRA, **extra}
        mc = ModelConfig(model=model_dir(tmp_path), skip_tokenizer_init=True, dtype="float16",
                         max_model_len=1024)
        ktc = KVTransferConfig(kv_connector="UMBPStoreConnector", kv_role="kv_both",
                               kv_connector_extra_config={"pool": pool, **extra},
                               kv_load_failure_policy="recompute")
        vc = VllmConfig(model_config=mc, kv_transfer_config=ktc,
                        cache_config=CacheConfig(block_size=BLOCK, enable_prefix_caching=True),
                        scheduler_config=SchedulerConfig(max_model_len=1024, is_encoder_decoder=False,
                                                         max_num_batched_tokens=1024, max_num_seqs=8),
                        parallel_config=ParallelConfig(tensor_parallel_size=TP),
                        device_config=DeviceConfig("cpu"),
                        kv_events_config=KVEventsConfig(enable_kv_cache_events=True, publisher="null"))
        vc.cache_config.num_gpu_blocks = num_blocks
        self.s = Scheduler(vc, make_kv_cache_config(num_blocks), StructuredOutputManager(vc),
                           block_size=BLOCK, log_stats=True)
        self.published = []
        self.s.kv_event_publisher.publish = self.published.append
        self.w = [IntreeWorker(pool, TP, r, seed=r + 1, **extra) for r in range(TP)]
        self.agg = KVOutputAggregator.from_connector(self.s.connector, TP)
        self.outputs = []

    # The in-tree worker's loads and stores are asynchronous and it only polls
    # them: how many steps they take depends on the copy threads getting a
    # CPU, so these wait for a time (60 s), not a number of steps.
    WAIT_S = 60

    def run_until_scheduled(self, rid):
        """Step until rid gets tokens (asynchronous loads park it first);
        self.loaded[rid]: the block ids its load filled."""
        self.loaded = getattr(self, "loaded", {})
        seen = []
        end = time.monotonic() + self.WAIT_S
        while time.monotonic() < end:
            so, eco = self.step()
            batch = so.kv_connector_metadata.load_requests.get(rid)
            if batch:
                self.loaded[rid] = list(batch.block_ids)
            if rid in so.num_scheduled_tokens:
                return so, eco
            r = self.s.requests.get(rid)
            seen.append((dict(so.num_scheduled_tokens), r.status if r else "gone"))
            time.sleep(0.005)
        raise AssertionError(f"{rid} was not scheduled in {self.WAIT_S} s: {seen[:8]} ... {seen[-3:]}")

    def drain(self):
        """Step while EngineCore would (Scheduler.has_requests) until delayed
        frees (stores still copying) finish."""
        n = 0
        end = time.monotonic() + self.WAIT_S
        while self.s.has_requests():
            assert time.monotonic() < end, f"the scheduler was not idle after {n} steps in {self.WAIT_S} s"
            so, _ = self.step()
            n += 1
            if not so.num_scheduled_tokens:
                time.sleep(0.005)
        return n

    def removed(self):
        return [h for b in self.published for ev in b.events if isinstance(ev, BlockRemoved)
                for h in ev.block_hashes]


def _pool_keys(pool, tp_rank, hashes):
    """(pool handle, umbp_key array) of the in-tree key strings of hashes on tp_rank."""
    h = C.c_void_p()
    opts = L.AttachOpts()
    L.lib().umbp_attach_opts_init(C.byref(opts))
    L.check(L.lib().umbp_pool_attach(pool.encode(), C.byref(opts), C.byref(h)), "attach")
    codec = BlockIdentityCodec(UMBPNamespace(NS), tp_rank=tp_rank)

    def ns_id(name):
        out = C.c_uint32()
        L.check(L.lib().umbp_ns_register(h, name.encode(), C.byref(out)), "ns")
        return out.value
    return h, R.KeyCodec(ns_id).encode([codec.key(x, 0) for x in hashes])


def remove(pool, tp_rank, block_hash):
    h, keys = _pool_keys(pool, tp_rank, [block_hash])
    try:
        return L.lib().umbp_remove(h, keys)
    finally:
        L.lib().umbp_pool_detach(h)


def present(pool, tp_rank, hashes):
    h, keys = _pool_keys(pool, tp_rank, hashes)
    out = (C.c_uint8 * len(hashes))()
    try:
        L.lib().umbp_contains_bulk(h, len(hashes), keys, out)
        return [bool(x) for x in out]
    finally:
        L.lib().umbp_pool_detach(h)


def test_intree_connector_in_real_scheduler_tp2(tmp_path, pool_name):
    """vLLM's class, our runtime: A stores on both ranks; B with A's prefix
    (asynchronous load, the in-tree default) gets byte-identical blocks on both
    ranks; a block removed on rank 1 becomes a BlockRemoved and shortens C's
    hit; a block removed between lookup and load fails the load and the real
    scheduler recomputes; E aborted while its load is in flight ends cleanly."""
    e = IntreeEngine(tmp_path, pool_name)
    try:
        conn = e.s.connector
        assert type(conn).__module__.startswith(INTREE) and type(conn).__name__ == "UMBPStoreConnector"
        assert type(conn._runtime) is R.UMBPRuntime
        for w in e.w:
            info = w.call("info")
            assert info["cls"] == f"{INTREE}.connector.UMBPStoreConnector"
            assert info["runtime"] == "umbp.vllm_runtime.UMBPWorkerHandle"

        tokens = list(range(100, 100 + 4 * BLOCK + 5))
        a = req("A", tokens)
        e.s.add_request(a)
        so, _ = e.step()
        ids_a = e.block_ids(so, "A")[:4]
        a_bytes = [w.call("dump", ids_a) for w in e.w]
        e.drain()
        for r in range(TP):
            assert present(pool_name, r, a.block_hashes[:4]) == [True] * 4, f"rank {r} published A"

        assert e.s.reset_prefix_cache()
        for w in e.w:
            w.call("zero")
        e.s.add_request(req("B", tokens[:4 * BLOCK] + [1, 2, 3]))
        so, _ = e.run_until_scheduled("B")
        assert so.num_scheduled_tokens == {"B": 3}, "4 blocks came from the pool"
        ids_b = e.loaded["B"]
        e.assert_kv_equal(ids_b, a_bytes)
        e.drain()

        # block 2 removed on rank 1: a BlockRemoved event, and C's hit stops before it
        assert remove(pool_name, 1, a.block_hashes[2]) == 0
        assert e.s.reset_prefix_cache()
        e.step()   # the workers drain the pool's removed event
        assert maybe_convert_block_hash(a.block_hashes[2]) in e.removed(), e.removed()
        e.s.add_request(req("C", tokens))
        so, _ = e.run_until_scheduled("C")
        assert so.num_scheduled_tokens == {"C": len(tokens) - 2 * BLOCK}
        e.drain()

        # block 1 removed on rank 0 after the lookup, before the load: recomputed
        assert e.s.reset_prefix_cache()
        e.s.add_request(req("D", tokens[:2 * BLOCK] + [9]))

        def drop(so):
            if "D" in {r.req_id for r in so.scheduled_new_reqs} or not so.num_scheduled_tokens:
                remove(pool_name, 0, a.block_hashes[1])
        e.step(before_workers=drop)
        so, _ = e.run_until_scheduled("D")
        assert so.num_scheduled_tokens["D"] > 1, "D recomputes the block that failed to load"
        e.drain()
        assert "D" not in e.s.requests

        # E aborted while its asynchronous load is in flight
        assert e.s.reset_prefix_cache()
        e.s.add_request(req("E", tokens[:1 * BLOCK] + [5]))
        so, _ = e.step()
        assert "E" not in so.num_scheduled_tokens, "E waits for its load"
        e.s.finish_requests("E", RequestStatus.FINISHED_ABORTED)
        e.drain()
        assert "E" not in e.s.requests
    finally:
        e.close()


def test_intree_standalone_daemon_pool_across_engines(tmp_path, pool_name):
    """mode standalone: `umbp daemon` owns the pool; engine 1 stores A and shuts
    down; engine 2 (new scheduler and workers, empty KV) loads A's prefix
    byte-identical on both ranks."""
    d, lines, log = start_daemon(pool_name)
    try:
        tokens = list(range(500, 500 + 4 * BLOCK + 5))
        e1 = IntreeEngine(tmp_path, pool_name, mode="standalone")
        try:
            e1.s.add_request(req("A", tokens))
            so, _ = e1.step()
            ids_a = e1.block_ids(so, "A")[:4]
            a_bytes = [w.call("dump", ids_a) for w in e1.w]
            e1.drain()
        finally:
            e1.close()
        assert d.poll() is None, "the daemon outlives the engine"
        e2 = IntreeEngine(tmp_path, pool_name, mode="standalone")
        try:
            for w in e2.w:
                w.call("zero")
            e2.s.add_request(req("B", tokens[:4 * BLOCK] + [1, 2, 3]))
            so, _ = e2.run_until_scheduled("B")
            assert so.num_scheduled_tokens == {"B": 3}, "engine 2 got A's 4 blocks from the daemon's pool"
            ids_b = e2.loaded["B"]
            e2.assert_kv_equal(ids_b, a_bytes)
            e2.drain()
        finally:
            e2.close()
    finally:
        stop_daemon(d)


def test_intree_engines_sharing_a_daemon_pool_each_get_every_removal(tmp_path, pool_name):
    """Two in-tree engines (TP 2, four worker processes) on one daemon's pool:
    a block removed on rank 1 and another on rank 0 are BlockRemoved events of
    both engines, each once. The workers drained the pool's event ring, which
    gave each removal to one of the four (the engine that stepped first got
    both, the other none); each worker now reads the pool's feed."""
    d, _, _ = start_daemon(pool_name)
    try:
        tokens = list(range(700, 700 + 4 * BLOCK + 5))
        e1 = IntreeEngine(tmp_path, pool_name, mode="standalone")
        e2 = IntreeEngine(tmp_path, pool_name, mode="standalone")
        try:
            a = req("A", tokens)
            e1.s.add_request(a)
            e1.step()
            e1.drain()
            assert present(pool_name, 0, a.block_hashes[:4]) == [True] * 4
            assert remove(pool_name, 1, a.block_hashes[2]) == 0
            assert remove(pool_name, 0, a.block_hashes[3]) == 0
            want = sorted(maybe_convert_block_hash(h) for h in a.block_hashes[2:4])
            for e in (e1, e2):
                e.step()   # the workers read the removals
                assert sorted(e.removed()) == want, (e is e1, e.removed())
        finally:
            e2.close()
            e1.close()
    finally:
        stop_daemon(d)


def test_backend_umbp_without_libumbp_names_the_fix(pool_name, monkeypatch):
    """backend 'umbp' with UMBP_LIB pointing at a missing file: the connector's
    construction fails with an error that says how to fix it."""
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
    import intree_util as I
    register_plugin()
    monkeypatch.setattr(L, "_lib", None)
    monkeypatch.setenv("UMBP_LIB", "/nonexistent/libumbp.so")
    with pytest.raises(RuntimeError, match=r"libumbp cannot be loaded.*UMBP_LIB=/nonexistent.*Fix: .*'pip install \.' "
                                             r"from the umbp repository"):
        KVConnectorFactory.create_connector(I.make_vllm_config(pool_name), KVConnectorRole.SCHEDULER,
                                            make_kv_cache_config())


def test_other_backends_fall_through_to_the_previous_builder(monkeypatch):
    """backend absent (or not 'umbp'): the builder registered before ours is
    called, unchanged. MORI is not installable here, so a stub takes the place
    of MORI's builder; register() is idempotent."""
    import umbp.vllm_plugin as P
    from vllm.distributed.kv_transfer.kv_connector.v1.umbp.runtime.factory import (
        UMBPRuntimeConfig, UMBPRuntimeFactory)
    calls = []

    def mori_stub(config):
        calls.append(config)
        return "mori-runtime"
    monkeypatch.setattr(UMBPRuntimeFactory, "_builders", {"embedded": mori_stub, "standalone": mori_stub})
    P.register()
    P.register()   # idempotent: wraps once
    for mode in ("embedded", "standalone"):
        b = UMBPRuntimeFactory._builders[mode]
        assert b.umbp_previous is mori_stub
    cfg = UMBPRuntimeConfig(mode="standalone", options={"endpoint": "x"})
    assert UMBPRuntimeFactory.build(cfg) == "mori-runtime" and calls == [cfg]
    cfg2 = UMBPRuntimeConfig(mode="embedded", options={"backend": "mori"})
    assert UMBPRuntimeFactory.build(cfg2) == "mori-runtime" and calls[-1] is cfg2


def test_a_factory_of_another_shape_does_not_stop_vllm(monkeypatch, caplog):
    """vLLM calls every general plugin at every start and does not catch what
    one raises: a vLLM whose UMBPRuntimeFactory keeps its builders elsewhere
    (or not in a dict) must still start, told why backend 'umbp' is missing."""
    import logging

    import umbp.vllm_plugin as P
    from vllm.distributed.kv_transfer.kv_connector.v1.umbp.runtime.factory import UMBPRuntimeFactory
    monkeypatch.delattr(UMBPRuntimeFactory, "_builders")
    with caplog.at_level(logging.WARNING, logger="vllm.umbp.plugin"):
        P.register()
    assert "backend 'umbp' is not available" in caplog.text and "AttributeError" in caplog.text, caplog.text
    monkeypatch.setattr(UMBPRuntimeFactory, "_builders", ("embedded", "standalone"), raising=False)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="vllm.umbp.plugin"):
        P.register()
    assert "backend 'umbp' is not available" in caplog.text, caplog.text


def test_a_misspelt_umbp_backend_is_named(monkeypatch):
    """backend "UMBP" or "umbp " went to MORI's builder, whose error asks for
    MORI built with BUILD_UMBP=ON; it is refused naming the spelling."""
    import umbp.vllm_plugin as P
    from vllm.distributed.kv_transfer.kv_connector.v1.umbp.runtime.factory import (
        UMBPRuntimeConfig, UMBPRuntimeFactory)
    calls = []
    monkeypatch.setattr(UMBPRuntimeFactory, "_builders", {"embedded": calls.append, "standalone": calls.append})
    P.register()
    for backend in ("UMBP", " umbp", "Umbp "):
        with pytest.raises(ValueError, match=rf"backend={backend!r}: write 'umbp' \(lower case"):
            UMBPRuntimeFactory.build(UMBPRuntimeConfig(mode="embedded", options={"backend": backend}))
    assert calls == []


def test_no_backend_without_mori_names_both_umbp_setups():
    """--kv-transfer-config without kv_connector_module_path (which docs/vllm.md
    says is required) and without "backend": vLLM's in-tree connector goes to
    MORI's runtime, which failed asking for "MORI built with BUILD_UMBP=ON".
    With MORI not installed, the error names both ways to use umbp."""
    import importlib.util
    from vllm.distributed.kv_transfer.kv_connector.v1.umbp.runtime.factory import (
        UMBPRuntimeConfig, UMBPRuntimeFactory)
    assert importlib.util.find_spec("mori") is None
    register_plugin()
    for mode in ("embedded", "standalone"):
        with pytest.raises(ValueError, match=r"backend=None, so it would use MORI's runtime, and MORI is not "
                                             r"installed.*\"backend\": \"umbp\".*\"kv_connector_module_path\": "
                                             r"\"umbp.vllm\""):
            UMBPRuntimeFactory.build(UMBPRuntimeConfig(mode=mode, options={"pool": "x"}))
