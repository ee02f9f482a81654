# SPDX-License-Identifier: Apache-2.0
"""umbp.vllm_runtime against vLLM 0.34's runtime contract alone
(vllm/distributed/kv_transfer/kv_connector/v1/umbp/runtime/base.py).

The runtime is built by vLLM's own UMBPRuntimeFactory (after
umbp.vllm_plugin.register(), which vLLM calls through the wheel's entry point;
the installed-wheel path is tested elsewhere) and driven as the in-tree
connector drives it: BlockStoreBatch / BlockLoadBatch jobs (the worker's
store_blocks / load_blocks), range plans from vLLM's KVLayoutPlanner (store /
load), poll / wait / publish / cancel, take_evicted_keys and the scheduler's
bulk lookup of key strings. A change of that contract in vLLM fails here
first."""
from __future__ import annotations

import ctypes as C
import os
import re

import pytest
import torch

from conftest import BLOCK, LAYERS
from intree_util import make_kv_cache_config, make_kv_caches, register_plugin

from vllm.distributed.kv_transfer.kv_connector.v1.umbp.data import (
    BlockIdentityCodec,
    BlockLoadBatch,
    BlockStoreBatch,
    KVLayoutDescriptor,
    KVLayoutPlanner,
    RankTopology,
    TransferJobStatus,
    UMBPNamespace,
)
from vllm.distributed.kv_transfer.kv_connector.v1.umbp.runtime import base
from vllm.distributed.kv_transfer.kv_connector.v1.umbp.runtime.factory import (
    UMBPRuntimeConfig,
    UMBPRuntimeFactory,
)

from umbp import _lib as L
from umbp import tier as T
from umbp import vllm_runtime as R

NS = "contract-ns"
DONE = (TransferJobStatus.COMPLETED, TransferJobStatus.FAILED, TransferJobStatus.CANCELLED)


class Rig:
    """One rank: runtime, worker handle over CPU KV caches, scheduler handle."""

    def __init__(self, pool, num_blocks=32, head=8, copy_threads=2, capacity=4 << 20, **extra):
        register_plugin()
        opts = {"backend": "umbp", "pool": pool, "capacity_bytes": capacity, "no_prefault": True,
                "copy_threads": copy_threads, "key_namespace": NS, **extra}
        self.runtime = UMBPRuntimeFactory.build(UMBPRuntimeConfig(mode="embedded", options=opts))
        self.topo = RankTopology(tp_rank=0, tp_size=1)
        self.planner = KVLayoutPlanner.from_kv_cache_config(make_kv_cache_config(num_blocks, head))
        self.caches = make_kv_caches(seed=3, num_blocks=num_blocks, head=head)
        self.planner.register_kv_caches(self.caches)
        self.worker = self.runtime.create_worker_handle(NS, self.topo, self.planner.describe(self.topo))
        self.worker.register_buffers(self.caches)
        self.sched = self.runtime.create_scheduler_handle(NS, self.topo, KVLayoutDescriptor((), self.topo))
        self.codec = BlockIdentityCodec(UMBPNamespace(NS))

    def keys(self, tag, n):
        return [self.codec.key(bytes([tag, i]) * 16, 0) for i in range(n)]

    def store_batch(self, keys, ids):
        n = len(keys)
        return BlockStoreBatch(keys=keys, block_ids=ids, group_ids=[0] * n,
                               block_hashes=[bytes.fromhex(k.rsplit(":", 1)[1]) for k in keys],
                               parent_block_hashes=[None] * n, token_ids=[(1,) * BLOCK] * n,
                               block_sizes=[BLOCK] * n, request_id="r")

    def load_batch(self, keys, ids):
        return BlockLoadBatch(keys=keys, block_ids=ids, group_ids=[0] * len(keys), request_id="r")

    def block(self, b):
        return {n: self.caches[n][b].clone() for n in LAYERS}

    def close(self):
        self.worker.close()
        self.sched.close()


@pytest.fixture
def rig(pool_name):
    r = Rig(pool_name)
    yield r
    r.close()


def test_factory_builds_ours_and_handles_satisfy_the_protocol(rig):
    assert type(rig.runtime) is R.UMBPRuntime
    for proto, obj in ((base.UMBPWorkerHandle, rig.worker), (base.UMBPSchedulerHandle, rig.sched),
                       (base.IUMBPRuntime, rig.runtime)):
        missing = [m for m in dir(proto) if not m.startswith("_") and not callable(getattr(obj, m, None))]
        assert not missing, f"{type(obj).__name__} lacks {missing} of vLLM's {proto.__name__}"


def test_store_visible_only_at_publish_then_loads_back(rig):
    keys = rig.keys(1, 4)
    job = rig.worker.store_blocks(rig.store_batch(keys, [0, 1, 2, 3]))
    assert job is not None
    final = rig.worker.wait(job)
    assert final.status == TransferJobStatus.COMPLETED and final.completed_keys == set(keys)
    assert final.completed_bytes == 4 * 2 * 1024
    assert list(rig.sched.lookup(keys)) == [False] * 4, "a store is visible before publish"
    rig.worker.publish(final)
    assert list(rig.sched.lookup(keys)) == [True] * 4
    want = [rig.block(b) for b in range(4)]
    ld = rig.worker.wait(rig.worker.load_blocks(rig.load_batch(keys, [10, 11, 12, 13])))
    assert ld.status == TransferJobStatus.COMPLETED
    for i in range(4):
        for n in LAYERS:
            assert torch.equal(rig.caches[n][10 + i], want[i][n])


def test_unpublished_failed_and_released_store_leaves_no_reservation(rig):
    keys = rig.keys(2, 2)
    job = rig.worker.store_blocks(rig.store_batch(keys, [0, 1]))
    rig.worker.wait(job)
    c = L.SlotCensus()
    rig.worker.close()   # never published: the slots go back, the keys never appear
    rig.worker = rig.runtime.create_worker_handle(NS, rig.topo, rig.planner.describe(rig.topo))
    rig.worker.register_buffers(rig.caches)
    L.check(L.lib().umbp_census(rig.worker.pool.h, C.byref(c)), "census")
    assert c.reserved == 0 and list(rig.sched.lookup(keys)) == [False, False]
    with pytest.raises(RuntimeError, match="cannot publish"):
        rig.worker.publish(rig.worker.wait(rig.worker.load_blocks(rig.load_batch(keys, [5, 6]))))


def test_range_plans_from_the_planner(rig):
    """store / load with materialised KVRange plans (the path the connector
    takes when store_blocks returns None) move the same bytes."""
    keys = rig.keys(3, 2)
    plans = [rig.planner.plan_registered_block(k, b, group_id=0) for k, b in zip(keys, (4, 5))]
    st = rig.worker.wait(rig.worker.store(plans))
    assert st.status == TransferJobStatus.COMPLETED and st.completed_bytes == 2 * 2048
    rig.worker.publish(st)
    back = [rig.planner.plan_registered_block(k, b, group_id=0) for k, b in zip(keys, (20, 21))]
    assert rig.worker.wait(rig.worker.load(back)).status == TransferJobStatus.COMPLETED
    for n in LAYERS:
        assert torch.equal(rig.caches[n][20], rig.caches[n][4]) and torch.equal(rig.caches[n][21], rig.caches[n][5])
    # a plan whose ranges are not its block's in the registered caches fails its key
    bad = rig.planner.plan_for_block(keys[0], 7, {n: 4096 for n in LAYERS}, group_id=0)
    res = rig.worker.wait(rig.worker.load([bad]))
    assert res.status == TransferJobStatus.FAILED and "not block 7" in res.error


def test_per_key_load_failure_and_out_of_order_completion(pool_name):
    """A long store still copying (one copy thread, 24 MiB) while a later load
    whose key misses finishes first (out of order); then a load of a present
    and a missing key: the missing one fails alone, naming its block; the
    earlier store completes afterwards."""
    rig = Rig(pool_name, num_blocks=384, head=256, copy_threads=1, capacity=96 << 20)
    try:
        present = rig.keys(5, 1)
        rig.worker.publish(rig.worker.wait(rig.worker.store_blocks(rig.store_batch(present, [200]))))
        missing = rig.keys(6, 1)
        # On a loaded machine the test's thread can lose its CPU for longer
        # than the store's copy takes, so the store may be done by the time
        # the miss is polled: try again with other keys until the miss was
        # seen done while the store still copied (a few tries at most).
        for attempt in range(40):
            big = rig.keys(100 + attempt, 192)
            slow = rig.worker.store_blocks(rig.store_batch(big, list(range(192))))
            miss = rig.worker.load_blocks(rig.load_batch(missing, [301]))
            first = rig.worker.poll(miss)
            assert first is not None and first.status == TransferJobStatus.FAILED
            if rig.worker.poll(slow) is None:
                break
            rig.worker.publish(slow)
        else:
            raise AssertionError("in 40 tries the 24 MiB store never outlasted a later load's miss")
        mixed = rig.worker.load_blocks(rig.load_batch(present + missing, [300, 301]))
        res = rig.worker.wait(mixed)
        assert res.status == TransferJobStatus.FAILED
        assert res.completed_keys == set(present) and res.failed_keys == set(missing)
        assert res.failed_block_ids == {301} and "not in the pool" in res.error
        assert rig.worker.wait(slow).status == TransferJobStatus.COMPLETED
        rig.worker.publish(slow)
        assert list(rig.sched.lookup(big)) == [True] * len(big)
    finally:
        rig.close()


def test_cancel_queued_and_running_jobs(pool_name):
    """With one copy thread, job B queued behind a running A: cancel(B) cancels
    (its keys never appear), cancel(A) waits until A's buffers are free.
    B's batch is built before A is submitted and A is ten times B's size, so
    that B is still queued when it is cancelled; a round in which the copy
    thread reached B first anyway (a cancel that waited and completed, as
    cancel() does for a job already copying) is repeated with new keys, up to
    three rounds."""
    rig = Rig(pool_name, num_blocks=384, head=256, copy_threads=1, capacity=96 << 20)
    try:
        for rnd in range(3):
            a_keys, b_keys = rig.keys(20 + rnd, 240), rig.keys(30 + rnd, 24)
            a_batch = rig.store_batch(a_keys, list(range(240)))
            b_batch = rig.store_batch(b_keys, list(range(240, 264)))
            a = rig.worker.store_blocks(a_batch)
            b = rig.worker.store_blocks(b_batch)
            cb = rig.worker.cancel(b)
            ca = rig.worker.cancel(a)
            assert ca.status in DONE, "cancel returned while A still copies"
            assert rig.worker.poll(ca) is ca
            if ca.status == TransferJobStatus.COMPLETED:
                rig.worker.publish(ca)
                assert list(rig.sched.lookup(a_keys)) == [True] * len(a_keys)
            if cb.status == TransferJobStatus.COMPLETED:
                rig.worker.publish(cb)  # B was already copying: cancel() waited for it
                continue
            assert cb.status == TransferJobStatus.CANCELLED
            assert list(rig.sched.lookup(b_keys)) == [False] * len(b_keys)
            break
        else:
            pytest.fail("in three rounds B was never still queued when cancelled")
        c = L.SlotCensus()
        L.check(L.lib().umbp_census(rig.worker.pool.h, C.byref(c)), "census")
        assert c.reserved == 0
    finally:
        rig.close()


def test_wait_cancels_what_never_started_at_load_timeout_ms(pool_name):
    """One copy thread busy with a large store A; a load B and a store C
    queued behind it. wait(B) and wait(C) past load_timeout_ms raised
    TimeoutError saying the KV buffers were still in use, although no copy
    of B or C had started. Now the queued C jobs are cancelled at the
    deadline and the states come back failed, naming the timeout: B's
    blocks are untouched (vLLM recomputes them), C is never published, no
    slot stays pinned or reserved by them. wait(A), whose copy did start,
    still raises, saying so. A round in which A finished before B's deadline
    (B then simply completed) is repeated, up to three rounds."""
    rig = Rig(pool_name, num_blocks=64, head=512, copy_threads=1, capacity=192 << 20, load_timeout_ms=2)
    try:
        present = rig.keys(40, 4)
        for rnd in range(3):
            st = rig.worker.store_blocks(rig.store_batch(present, [0, 1, 2, 3]))
            while rig.worker.poll(st) is None:   # poll: wait() would time out at 2 ms
                pass
            rig.worker.publish(st)
            # 1280 blocks of 128 KiB (160 MiB), read from the 32 low blocks over and over
            a_keys = rig.keys(41 + rnd, 256) + rig.keys(44 + rnd, 256) + rig.keys(47 + rnd, 256) + \
                rig.keys(50 + rnd, 256) + rig.keys(53 + rnd, 256)
            a_batch = rig.store_batch(a_keys, [i % 32 for i in range(len(a_keys))])
            b_batch = rig.load_batch(present, [40, 41, 42, 43])
            c_keys = rig.keys(56 + rnd, 2)
            c_batch = rig.store_batch(c_keys, [4, 5])
            before = [rig.block(b) for b in (40, 41, 42, 43)]
            a = rig.worker.store_blocks(a_batch)
            b = rig.worker.load_blocks(b_batch)
            c = rig.worker.store_blocks(c_batch)
            rb = rig.worker.wait(b)   # raised TimeoutError before
            rc = rig.worker.wait(c)
            a_running = rig.worker.poll(a) is None
            if a_running:
                try:
                    ra = rig.worker.wait(a)
                except TimeoutError as e:   # A's copy started (the usual case): that is said
                    assert re.search(r"load_timeout_ms=2: 1 of its 1 copy job\(s\) started copying and still "
                                     r"run, so its KV buffers are still in use", str(e)), e
                else:   # the copy thread had not even taken A yet: A is cancelled like B and C
                    assert ra.status == TransferJobStatus.FAILED and "not started within" in ra.error, ra.error
            while (fa := rig.worker.poll(a)) is None:
                pass
            if not a_running:   # A ended before B's deadline: give its slots back for the next round
                if fa.status == TransferJobStatus.COMPLETED:
                    rig.worker.publish(fa)
                assert rig.sched.clear()
                continue
            # A copied all along on the only thread: B and C never started
            for r, ks in ((rb, present), (rc, c_keys)):
                assert r.status == TransferJobStatus.FAILED and r.failed_keys == set(ks), (r.status, r.error)
                assert "not started within load_timeout_ms=2" in r.error and "was cancelled" in r.error, r.error
                assert "raise load_timeout_ms or copy_threads" in r.error, r.error
                assert rig.worker.poll(r) is r
            assert rb.failed_block_ids == {40, 41, 42, 43}
            for i, b in enumerate((40, 41, 42, 43)):
                for n in LAYERS:
                    assert torch.equal(rig.caches[n][b], before[i][n]), "a cancelled load wrote its blocks"
            assert list(rig.sched.lookup(c_keys)) == [False, False]
            c = L.SlotCensus()
            L.check(L.lib().umbp_census(rig.worker.pool.h, C.byref(c)), "census")
            held = len(a_keys) if fa.status == TransferJobStatus.COMPLETED else 0
            assert c.pinned == 0 and c.reserved == held, "only A's copied, unpublished slots are held"
            break
        else:
            pytest.fail("in three rounds the 160 MiB store A never outlasted a 2 ms wait")
    finally:
        rig.close()


def test_take_evicted_keys(rig):
    keys = rig.keys(9, 3)
    rig.worker.publish(rig.worker.wait(rig.worker.store_blocks(rig.store_batch(keys, [0, 1, 2]))))
    arr = R.KeyCodec(rig.worker.pool.ns).encode([keys[1]])
    # removed before the worker ever drained: its start turned the pool's
    # recording of removals on (a pool no process drained records none)
    assert L.lib().umbp_remove(rig.worker.pool.h, arr) == 0
    assert list(rig.worker.take_evicted_keys()) == [keys[1]], "the removed key, as the connector spells it"
    assert list(rig.worker.take_evicted_keys()) == [], "only since the last call"
    assert rig.sched.clear()
    assert sorted(rig.worker.take_evicted_keys()) == sorted([keys[0], keys[2]])
    assert list(rig.sched.lookup(keys)) == [False] * len(keys)


def _publish_and_remove(pool_h, keys):
    """Publish key strings (any rank) straight into the pool, then remove them."""
    lib = L.lib()
    lib.umbp_reserve.argtypes = [C.c_void_p, C.c_int, C.c_uint32, C.POINTER(C.c_uint32)]
    lib.umbp_publish.argtypes = [C.c_void_p, C.c_uint32, C.POINTER(L.Key)]
    ns = C.c_uint32()
    assert lib.umbp_ns_register(pool_h, NS.encode(), C.byref(ns)) == 0
    for k in keys:
        arr = R.KeyCodec(lambda _: ns.value).encode([k])
        slot = C.c_uint32()
        assert lib.umbp_reserve(pool_h, -1, ns.value, C.byref(slot)) == 0
        assert lib.umbp_publish(pool_h, slot, arr) == 0
    for k in keys:
        assert lib.umbp_remove(pool_h, R.KeyCodec(lambda _: ns.value).encode([k])) == 0


def _consumers(pool_h):
    return {c["name"]: c["alive"] for c in T.feed_info(pool_h)["consumers"]}


def test_two_runtimes_on_one_pool_each_get_every_removal(pool_name):
    """Two in-tree engines of one model on one pool: each worker's
    take_evicted_keys returns every removal of its blocks, where the pool's
    event ring gave each removal to whichever worker drained it first (one
    got 3 of 3, the other none). Each worker reads the pool's feed as a
    consumer named after its ranks, and frees its place when it closes; a
    worker of the same ranks started later (a restarted engine) takes that
    place again instead of another."""
    a = Rig(pool_name)
    b = Rig(pool_name)
    try:
        keys = a.keys(12, 4)
        a.worker.publish(a.worker.wait(a.worker.store_blocks(a.store_batch(keys, [0, 1, 2, 3]))))
        for k in keys[:3]:
            assert L.lib().umbp_remove(a.worker.pool.h, R.KeyCodec(a.worker.pool.ns).encode([k])) == 0
        assert sorted(a.worker.take_evicted_keys()) == sorted(keys[:3])
        assert sorted(b.worker.take_evicted_keys()) == sorted(keys[:3])
        assert list(a.worker.take_evicted_keys()) == [] and list(b.worker.take_evicted_keys()) == []
        w = "vllm-w.t0c0d0p0"
        assert _consumers(a.worker.pool.h) == {w: True, f"{w}.2": True}
        b.close()
        assert _consumers(a.worker.pool.h) == {w: True, f"{w}.2": False}, "place kept"
        b = Rig(pool_name)
        assert _consumers(a.worker.pool.h) == {w: True, f"{w}.2": True}, "the restarted worker's own place"
    finally:
        b.close()
        a.close()


def test_each_worker_returns_the_removals_of_its_own_ranks(rig):
    """Every worker of an engine reads every removal from the feed; each
    returns the keys of its own ranks, so that a removal is reported once by
    the worker whose key it was, not once by every worker."""
    t1 = RankTopology(tp_rank=1, tp_size=2)
    w1 = rig.runtime.create_worker_handle(NS, t1, rig.planner.describe(t1))
    try:
        k0 = rig.keys(13, 2)
        k1 = [BlockIdentityCodec(UMBPNamespace(NS), tp_rank=1).key(bytes([13, i]) * 16, 0) for i in range(2)]
        _publish_and_remove(rig.worker.pool.h, [k0[0], k1[0], k1[1], k0[1]])
        assert list(rig.worker.take_evicted_keys()) == k0
        assert list(w1.take_evicted_keys()) == k1
    finally:
        w1.close()


def test_without_a_place_in_the_feed_a_worker_drains_the_event_ring(rig):
    """A worker that finds the feed's 16 places held by live consumers says
    that its BlockRemoved events are incomplete beside other engines, and
    still returns what it drains from the event ring: its namespace's
    removals of every rank, since no other worker sees those."""
    import logging
    said: list[str] = []
    h = logging.Handler()
    h.emit = lambda r: said.append(f"{r.levelname}: {r.getMessage()}")
    lg = logging.getLogger("vllm.umbp")
    lg.addHandler(h)
    held = []
    t1 = RankTopology(tp_rank=1, tp_size=2)
    w1 = None
    try:
        for i in range(15):   # the 16th place is rig.worker's
            f = C.c_void_p()
            assert T.lib().umbp_feed_open(rig.worker.pool.h, f"hold.{i}".encode(), None, C.byref(f)) == 0
            held.append(f)
        w1 = rig.runtime.create_worker_handle(NS, t1, rig.planner.describe(t1))
        assert any(x.startswith("WARNING") and "this worker (tp1 pcp0 dcp0 pp0)" in x and "event ring" in x
                   and "16 consumers" in x and "not complete" in x for x in said), said
        k0 = rig.keys(14, 1)
        k1 = [BlockIdentityCodec(UMBPNamespace(NS), tp_rank=1).key(bytes([14, 1]) * 16, 0)]
        _publish_and_remove(rig.worker.pool.h, k0 + k1)
        assert list(w1.take_evicted_keys()) == k0 + k1
        assert list(rig.worker.take_evicted_keys()) == k0, "the feed still has every removal"
    finally:
        lg.removeHandler(h)
        if w1 is not None:
            w1.close()
        for f in held:
            T.lib().umbp_feed_close(f)


def test_bulk_lookup_parses_key_strings_and_refuses_malformed_ones(rig):
    keys = rig.keys(10, 2)
    rig.worker.publish(rig.worker.wait(rig.worker.store_blocks(rig.store_batch(keys[:1], [0]))))
    other_rank = BlockIdentityCodec(UMBPNamespace(NS), tp_rank=1).key(bytes([10, 0]) * 16, 0)
    other_group = rig.codec.key(bytes([10, 0]) * 16, 1)
    assert list(rig.sched.lookup(keys + [other_rank, other_group])) == [True, False, False, False]
    assert list(rig.sched.lookup([])) == []
    bad = [keys[0].replace(":tp0:", ":tpX:"), "umbp:vllm:v1:" + NS + ":tp0:pcp0:dcp0:pp0:g0:zz",
           "not-a-key", keys[0] + "00" * 32]
    for k in bad:
        with pytest.raises(R.MalformedKeyError, match=r"malformed .*expected umbp:vllm:v1:\{namespace\}"):
            rig.sched.lookup([keys[0], k])
    # a namespace containing ':' still parses (the rank fields are taken from the right)
    odd = BlockIdentityCodec(UMBPNamespace("a:b")).key(b"\x01" * 32, 0)
    assert list(rig.sched.lookup([odd])) == [False]


def test_a_pool_destroyed_under_the_engine_is_said(rig, pool_name):
    """`umbp pool destroy --force` under an in-tree engine on umbp: umbp.vllm's
    scheduler says so once (docs/vllm.md), the in-tree runtime's said nothing.
    Its scheduler handle now logs it once at ERROR from a lookup, without the
    daemon hint (the engine's workers made this pool), and keeps answering
    from the mapping it has (blocks stored before stay hits)."""
    import logging
    import subprocess
    from test_connector import _umbp_cli
    keys = rig.keys(11, 2)
    rig.worker.publish(rig.worker.wait(rig.worker.store_blocks(rig.store_batch(keys, [0, 1]))))
    said: list[str] = []
    h = logging.Handler()
    h.emit = lambda r: said.append(f"{r.levelname}: {r.getMessage()}")
    lg = logging.getLogger("vllm.umbp")
    lg.addHandler(h)
    try:
        assert list(rig.sched.lookup(keys)) == [True, True] and not said
        subprocess.run([_umbp_cli(), "pool", "destroy", pool_name, "--force"], check=True, capture_output=True)
        for _ in range(2):
            rig.sched.pool._lost_checked = 0.0   # checked at most every 5 s
            assert list(rig.sched.lookup(keys)) == [True, True]
    finally:
        lg.removeHandler(h)
    lost = [x for x in said if "destroyed while this engine ran" in x]
    assert len(lost) == 1 and lost[0].startswith("ERROR") and "was removed" in lost[0], said
    assert "umbp daemon" not in lost[0], lost


def test_standalone_says_which_keys_it_does_not_apply(pool_name):
    """umbp.vllm warns that mode standalone does not apply capacity_bytes,
    slot_size, numa_nodes, index_pages or no_prefault (the daemon's pool is
    used as it is); the in-tree runtime on umbp dropped them without a word.
    Its scheduler handle now says so once an engine; embedded mode does not."""
    import logging
    import subprocess
    from test_connector import _umbp_cli
    register_plugin()
    subprocess.run([_umbp_cli(), "pool", "create", pool_name, "--capacity", "1MiB", "--slot-size", "4KiB",
                    "--no-prefault"], check=True, capture_output=True)
    said: list[str] = []
    h = logging.Handler()
    h.emit = lambda r: said.append(r.getMessage())
    lg = logging.getLogger("vllm.umbp")
    lg.addHandler(h)
    topo = RankTopology(tp_rank=0, tp_size=1)
    try:
        for mode in ("standalone", "embedded"):
            opts = {"backend": "umbp", "pool": pool_name, "capacity_bytes": "64GiB", "slot_size": "1MiB",
                    "key_namespace": NS}
            rt = UMBPRuntimeFactory.build(UMBPRuntimeConfig(mode=mode, options=opts))
            rt.create_scheduler_handle(NS, topo, KVLayoutDescriptor((), topo)).close()
            got = [x for x in said if "are not applied" in x]
            assert len(got) == (mode == "standalone"), (mode, said)
            if got:
                assert f"pool {pool_name!r}" in got[0] and "capacity_bytes, slot_size" in got[0], got
            said.clear()
    finally:
        lg.removeHandler(h)
