# SPDX-License-Identifier: Apache-2.0
"""The connector's read-through (kv_connector_extra_config "tier": true) in
vLLM's real classes, against the real request table (include/umbp/tier.h).
The test plays the tier's part itself through the table's serving calls, so
each step is deterministic; tests/cluster runs the real `umbp tier` against
a real Mooncake master."""
from __future__ import annotations

import ctypes as C
import time

from conftest import BLOCK, make_kv_cache_config, make_request, make_vllm_config

from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole

from umbp import _lib as L
from umbp import tier as T


def sched(pool, tp=1, **extra):
    return KVConnectorFactory.create_connector(make_vllm_config(pool, tp=tp, **extra),
                                               KVConnectorRole.SCHEDULER, make_kv_cache_config())


def test_no_tier_answers_at_once(pool_name):
    """tier: true without a tier running: the lookup answers from the pool
    alone, in the same call, and never asks again for that request."""
    # "in the same call" is "without waiting for a tier": with a wait of a
    # minute, a lookup that waited shows as a minute, so the bound (half of
    # it) is no speed check and holds on a loaded machine
    s = sched(pool_name, tier=True, tier_wait_ms=60000)
    try:
        r = make_request("A", list(range(100, 100 + 4 * BLOCK + 3)))
        t0 = time.monotonic()
        assert s.get_num_new_matched_tokens(r, 0) == (0, False)
        took = time.monotonic() - t0
        assert took < 30, f"the lookup took {took:.1f} s: expected at once, not a wait for a tier (tier_wait_ms 60000)"
        assert s._tier.stats["unavailable"] == 1
        assert s.get_num_new_matched_tokens(r, 0) == (0, False)
        assert s._tier.stats["asked"] == 0
    finally:
        s.shutdown()


def _publish(pool_h, keys, n) -> None:
    lib = T.lib()
    slots = (C.c_uint32 * n)()
    assert lib.umbp_reserve_bulk(pool_h, -1, keys[0].ns, n, slots) == n
    rc = (C.c_int * n)()
    assert lib.umbp_publish_bulk(pool_h, n, slots, keys, rc) == n


def test_read_through_waits_then_hits(pool_name):
    """TP 2: the lookup sends one request for every rank's shard of the
    missing blocks (block-major), answers "not yet" (None) while it is
    pending, and counts the blocks once the tier answered."""
    s = sched(pool_name, tp=2, tier=True, tier_wait_ms=0)
    lib = T.lib()
    tier = C.c_void_p()
    L.check(lib.umbp_tier_serve(s.pool.h, None, C.byref(tier)), "serve")
    try:
        L.check(lib.umbp_tier_set_state(tier, T.CONNECTED, b"test"), "state")
        tokens = list(range(500, 500 + 5 * BLOCK + 3))  # 5 whole blocks
        r = make_request("B", tokens)
        assert s.get_num_new_matched_tokens(r, 0) == (None, False)
        assert s.get_num_new_matched_tokens(r, 0) == (None, False)  # still pending: no second request
        job = T.TierJob()
        keys = (L.Key * 1024)()
        assert lib.umbp_tier_take(tier, C.byref(job), keys, 1024) == 1
        assert (job.n_blocks, job.n_ranks) == (5, 2)
        assert lib.umbp_tier_take(tier, C.byref(job), keys, 1024) == 0  # one request, not two
        want = [bytes(h) for h in r.block_hashes[:5]]
        for b in range(5):
            for rank in range(2):
                k = keys[b * 2 + rank]
                assert k.tp_rank == rank and bytes(k.hash[:k.hash_len]) == want[b]
        # the "tier" brings 3 blocks (both ranks) into the pool and answers 3
        _publish(s.pool.h, keys, 6)
        L.check(lib.umbp_tier_complete(tier, job.ticket, 3, None), "complete")
        assert s.get_num_new_matched_tokens(r, 0) == (3 * BLOCK, False)
        assert s._tier.stats == {"asked": 1, "fetched_blocks": 3, "unavailable": 0}
        # the request finished: its state goes
        s.request_finished(r, [])
        assert "B" not in s._tier.done
    finally:
        s.shutdown()
        lib.umbp_tier_close(tier)


def test_read_through_deadline(pool_name):
    """A tier that takes the request and never answers holds the request for
    tier_timeout_ms at most; then the lookup answers from the pool alone."""
    s = sched(pool_name, tier=True, tier_wait_ms=0, tier_timeout_ms=100)
    lib = T.lib()
    tier = C.c_void_p()
    L.check(lib.umbp_tier_serve(s.pool.h, None, C.byref(tier)), "serve")
    try:
        L.check(lib.umbp_tier_set_state(tier, T.CONNECTED, b"test"), "state")
        r = make_request("C", list(range(900, 900 + 3 * BLOCK + 1)))
        t0 = time.monotonic()
        assert s.get_num_new_matched_tokens(r, 0) == (None, False)
        job, keys = T.TierJob(), (L.Key * 1024)()
        assert lib.umbp_tier_take(tier, C.byref(job), keys, 1024) == 1  # taken, never answered
        # the tier never answers: only the deadline (100 ms) ends the wait.
        # The loop's 30 s guards against a request held for ever; the bound
        # after it is the deadline with a margin a loaded 2-core machine keeps
        # (it was 1 s), still far below a deadline taken in the wrong unit
        while s.get_num_new_matched_tokens(r, 0) == (None, False):
            assert time.monotonic() - t0 < 30, "the request was still held after 30 s (tier_timeout_ms 100)"
            time.sleep(0.01)
        held = time.monotonic() - t0
        assert 0.09 < held < 0.1 + 5, f"the request was held {held:.2f} s: expected its 100 ms deadline"
        assert s.get_num_new_matched_tokens(r, 0) == (0, False)
    finally:
        s.shutdown()
        lib.umbp_tier_close(tier)


def _intree_runtime(pool_name, tp_size, tier_timeout_ms):
    """umbp's runtime behind vLLM's in-tree connector ("backend": "umbp", "tier":
    true) on an embedded pool: a rank-0 worker handle (it makes the pool), a
    scheduler handle attached to it, and the in-tree key codec of namespace
    rt-ns."""
    from intree_util import register_plugin
    from vllm.distributed.kv_transfer.kv_connector.v1.umbp.data import (
        BlockIdentityCodec, KVLayoutDescriptor, RankTopology, UMBPNamespace)
    from vllm.distributed.kv_transfer.kv_connector.v1.umbp.runtime.factory import (
        UMBPRuntimeConfig, UMBPRuntimeFactory)
    register_plugin()
    opts = {"backend": "umbp", "pool": pool_name, "capacity_bytes": 4 << 20, "no_prefault": True,
            "key_namespace": "rt-ns", "tier": True, "tier_timeout_ms": tier_timeout_ms}
    rt = UMBPRuntimeFactory.build(UMBPRuntimeConfig(mode="embedded", options=opts))
    topo = RankTopology(tp_rank=0, tp_size=tp_size)
    worker = rt.create_worker_handle("rt-ns", topo, KVLayoutDescriptor((), topo))
    sch = rt.create_scheduler_handle("rt-ns", topo, KVLayoutDescriptor((), topo))
    return worker, sch, BlockIdentityCodec(UMBPNamespace("rt-ns"))


def test_intree_runtime_read_through(pool_name):
    """vLLM's in-tree connector on umbp's runtime ("backend": "umbp", "tier":
    true): a lookup that misses asks the tier for the blocks from the first
    miss, waits for the answer (the in-tree connector's lookup_async runs it
    on a thread) and answers with what the tier brought."""
    import threading

    worker, sch, codec = _intree_runtime(pool_name, tp_size=2, tier_timeout_ms=2000)
    lib = T.lib()
    tier = C.c_void_p()
    L.check(lib.umbp_tier_serve(sch.pool.h, None, C.byref(tier)), "serve")
    served = {}

    def serve():
        job, keys = T.TierJob(), (L.Key * 1024)()
        end = time.monotonic() + 5
        while time.monotonic() < end:
            if lib.umbp_tier_take(tier, C.byref(job), keys, 1024) == 1:
                served["shape"] = (job.n_blocks, job.n_ranks)
                _publish(sch.pool.h, keys, 4)  # the first two blocks, both ranks
                lib.umbp_tier_complete(tier, job.ticket, 2, None)
                return
            lib.umbp_tier_wait(tier, 10)
    try:
        L.check(lib.umbp_tier_set_state(tier, T.CONNECTED, b"test"), "state")
        th = threading.Thread(target=serve)
        th.start()
        keys = []
        for i in range(3):  # block-major, rank-minor, as the in-tree scheduler builds them
            for r in range(2):
                keys.append(codec.key(bytes([7, i]) * 16, 0).replace(":tp0:", f":tp{r}:"))
        hits = list(sch.lookup(keys))
        th.join()
        assert served["shape"] == (3, 2)
        assert hits == [True] * 4 + [False] * 2
    finally:
        lib.umbp_tier_close(tier)
        sch.close()
        worker.close()


def test_intree_runtime_tier_timeout_0_is_the_tiers_own(pool_name):
    """tier_timeout_ms 0 means the running tier's own --timeout-ms (the
    table's default), as documented: the in-tree runtime's lookup gave up
    after 50 ms instead and answered misses for blocks the tier was still
    bringing (here it answers after 300 ms, within its 5 s default)."""
    import threading

    worker, sch, codec = _intree_runtime(pool_name, tp_size=1, tier_timeout_ms=0)
    lib = T.lib()
    tier = C.c_void_p()
    params = T.TierParams(0, 0, 5000)
    L.check(lib.umbp_tier_serve(sch.pool.h, C.byref(params), C.byref(tier)), "serve")

    def serve():
        job, keys = T.TierJob(), (L.Key * 1024)()
        end = time.monotonic() + 10
        while time.monotonic() < end:
            if lib.umbp_tier_take(tier, C.byref(job), keys, 1024) == 1:
                time.sleep(0.3)
                _publish(sch.pool.h, keys, 2)
                lib.umbp_tier_complete(tier, job.ticket, 2, None)
                return
            lib.umbp_tier_wait(tier, 10)
    try:
        L.check(lib.umbp_tier_set_state(tier, T.CONNECTED, b"test"), "state")
        th = threading.Thread(target=serve)
        th.start()
        hits = list(sch.lookup([codec.key(bytes([9, i]) * 16, 0) for i in range(2)]))
        th.join()
        assert hits == [True, True]
    finally:
        lib.umbp_tier_close(tier)
        sch.close()
        worker.close()
