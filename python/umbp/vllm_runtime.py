# SPDX-License-Identifier: Apache-2.0
"""umbp as the runtime of vLLM's in-tree UMBP connector.

vLLM 0.34 ships ``UMBPStoreConnector`` in tree
(``vllm.distributed.kv_transfer.kv_connector.v1.umbp``); it keeps no bytes
itself and delegates storage to an ``IUMBPRuntime`` (``…/umbp/runtime/base.py``)
built by ``UMBPRuntimeFactory`` for the mode ``embedded`` or ``standalone``.
``UMBPRuntime`` here is that runtime over libumbp: the same pool handling
(``umbp.vllm_pool._Pool``), options (``UMBPConfig``), placement
(``plan_placement``) and C copy engine (umbp_dp_*) as ``umbp.vllm``.
``umbp.vllm_plugin.register`` puts it behind ``backend: "umbp"``.

How the contract maps onto libumbp
  * keys: the connector's strings
    ``umbp:vllm:v1:{namespace}:tp{r}:pcp{r}:dcp{r}:pp{r}:g{group}:{hex hash}``
    become ``umbp_key`` records, parsed once per batch into one array (the
    part before the hash is parsed once per distinct prefix and cached);
    every pool call then takes the whole array (one C call per batch).
  * lookup: umbp_contains_bulk — no socket, no server round trip.
  * store / store_blocks: umbp_dp_store with UMBP_DP_STORE_DEFER_PUBLISH. The
    copy runs asynchronously in the C engine; when it is done the slots stay
    reserved and invisible; ``publish`` makes them visible with one
    umbp_dp_job_publish (bulk). A job that is never published (it failed
    in part: the connector publishes only completed jobs) gives its slots
    back as soon as its failure is read.
  * load / load_blocks: umbp_dp_load; a key not in the pool (or a copy error)
    is a per-key failure, reported with TransferJobState.fail(keys, error).
  * wait: blocks until every C job of the state is done (the copies have
    stopped, so the KV buffers may be reused), up to load_timeout_ms. Past it,
    the C jobs still queued (no copy started) are cancelled and their keys
    fail naming the timeout, and the state is returned: nothing writes the
    buffers any more. Only a C job whose copies started and still run makes
    it raise TimeoutError (the buffers are in use), as the contract asks.
    cancel: umbp_dp_job_cancel; a job whose copies started is waited for.
  * take_evicted_keys: the pool's broadcast feed, read by each worker as a
    consumer of its own (umbp.vllm_pool.PoolRemovals, as umbp.vllm's
    scheduler does), so that every engine on a pool sees every removal,
    whoever removed it. Each worker returns the removed keys of its own
    namespace and ranks: the union over an engine's workers is every removal
    of its blocks (a block gone on any rank is no longer a full hit, which is
    what the connector's BlockRemoved means), and a removal is reported by
    the one worker whose key it was, not once per worker. Without a place in
    the feed (16 live consumers) a worker drains the pool's event ring, with
    a warning: that ring hands each removal to one drainer of the whole pool,
    so the worker then returns its namespace's removals of every rank.
  * ranges: ``store``/``load`` with materialised plans (``KVRange``s) are
    served by the same block-level C jobs: each plan's block id and group are
    taken from the plan, and its ranges must be the ones the registered
    layout gives that block (checked; a plan whose ranges are elsewhere fails
    its key with a message). The pool object of a group is the concatenation
    of the group's regions in layout order — the in-tree planner's
    ``object_offset`` order for a group — so both paths store the same bytes.

Processes: the scheduler handle attaches to the pool lazily (in embedded mode
the workers create it once they know the block size; until then every lookup
is a miss). Worker handles create (embedded) or attach (standalone) the pool
in their constructor, and build the C layout and copy engine in
register_buffers. Nothing here is shared between processes except the pool.
"""
from __future__ import annotations

import ctypes as C
import errno
import logging
import os
import struct
import threading
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import torch

from vllm.distributed.kv_transfer.kv_connector.v1.umbp.data import (
    BlockLoadBatch,
    BlockStoreBatch,
    BlockTransferPlan,
    KVLayoutDescriptor,
    RankTopology,
    TransferJobState,
    TransferJobStatus,
)
from vllm.distributed.kv_transfer.kv_connector.v1.umbp.runtime.factory import UMBPRuntimeConfig

from . import _lib as L
from .vllm_config import _CONFIG_KEYS, UMBPConfig, layout_and_engine, plan_placement
from .vllm_pool import EngineId, PoolRemovals, _Pool

logger = logging.getLogger("vllm.umbp.runtime")

KEY_PREFIX = "umbp:vllm:v1:"
KEY_FORMAT = "umbp:vllm:v1:{namespace}:tp{r}:pcp{r}:dcp{r}:pp{r}:g{group}:{hex hash}"
# Options of the in-tree connector itself (scheduler.py / connector.py), not of
# the runtime: accepted and left to the connector.
_CONNECTOR_KEYS = {"backend", "key_namespace", "load_async", "enable_lookup", "lookup_async",
                   "save_decode_cache", "enable_partial_hash_hits", "lookup_workers",
                   "kv_event_max_objects"}
_HEAD = struct.Struct("<IHHHHH")   # umbp_key up to group: ns, tp, pcp, dcp, pp, group (14 bytes)
_ZERO = bytes(L.UMBP_KEY_HASH_MAX + 1)
assert C.sizeof(L.Key) == _HEAD.size + 1 + L.UMBP_KEY_HASH_MAX + 1, "umbp_key layout changed"
_FOREVER = 0xFFFFFFFF


def runtime_config(options: dict[str, Any]) -> UMBPConfig:
    """umbp.vllm's UMBPConfig from the in-tree connector's extra config: the
    pool keys of umbp.vllm, minus the connector's own keys; any other key (a
    MORI option left over from another backend) is ignored with a warning."""
    ours = {k: v for k, v in options.items() if k in _CONFIG_KEYS and k not in ("key_namespace",
                                                                                  "save_decode_cache",
                                                                                  "load_async")}
    ignored = sorted(set(options) - set(_CONFIG_KEYS) - _CONNECTOR_KEYS)
    if ignored:
        logger.warning("UMBP runtime (backend 'umbp') ignores kv_connector_extra_config key(s) %s; "
                       "its keys are %s", ignored, sorted(set(_CONFIG_KEYS) - {"key_namespace"}))
    return UMBPConfig.from_extra(ours)


class MalformedKeyError(ValueError):
    """Key strings that are not the in-tree connector's format."""


class KeyCodec:
    """The in-tree connector's key strings <-> umbp_key records of one pool.

    encode() parses a batch into one ctypes array (one C call uses it);
    prefixes (everything but the hash) are parsed once and cached, so the
    per-key work is a dict lookup and bytes.fromhex."""

    def __init__(self, ns_id):
        self._ns_id = ns_id              # namespace name -> pool id (umbp_ns_register)
        self._heads: dict[str, bytes] = {}
        self._names: dict[tuple, str] = {}

    @staticmethod
    def parse_head(head: str) -> tuple[str, tuple[int, int, int, int, int]]:
        """'umbp:vllm:v1:{ns}:tp..:g..' -> (ns, (tp, pcp, dcp, pp, group)); ValueError."""
        parts = head.rsplit(":", 5)
        if len(parts) != 6 or not parts[0].startswith(KEY_PREFIX) or len(parts[0]) == len(KEY_PREFIX):
            raise ValueError("not 'umbp:vllm:v1:{namespace}:' followed by five rank and group fields")
        vals = []
        for part, tag in zip(parts[1:], ("tp", "pcp", "dcp", "pp", "g")):
            num = part[len(tag):]
            if not part.startswith(tag) or not num.isdigit() or int(num) > 0xFFFF:
                raise ValueError(f"field {part!r} is not {tag}<0..65535>")
            vals.append(int(num))
        return parts[0][len(KEY_PREFIX):], tuple(vals)

    def _head(self, head: str) -> bytes:
        ns, (tp, pcp, dcp, pp, g) = self.parse_head(head)
        packed = _HEAD.pack(self._ns_id(ns), tp, pcp, dcp, pp, g)
        self._heads[head] = packed
        return packed

    def encode(self, keys: Sequence[str]) -> Any:
        """One umbp_key array for keys; MalformedKeyError names the bad ones."""
        heads = self._heads
        parts: list[bytes] = []
        bad: list[tuple[str, str]] = []
        for k in keys:
            head, _, hx = k.rpartition(":") if isinstance(k, str) else ("", "", "")
            try:
                h = heads.get(head) or self._head(head)
                hb = bytes.fromhex(hx)
                if not 0 < len(hb) <= L.UMBP_KEY_HASH_MAX:
                    raise ValueError(f"hash of {len(hb)} bytes (1..{L.UMBP_KEY_HASH_MAX})")
            except ValueError as e:
                bad.append((k, str(e)))
                continue
            parts.append(h + bytes((len(hb),)) + hb + _ZERO[len(hb):])
        if bad:
            shown = "; ".join(f"{k!r}: {why}" for k, why in bad[:3])
            raise MalformedKeyError(f"{len(bad)} of {len(keys)} UMBP key(s) are malformed ({shown}); "
                                    f"expected {KEY_FORMAT}")
        n = len(parts)
        return (L.Key * max(1, n)).from_buffer_copy(b"".join(parts) or bytes(C.sizeof(L.Key)))

    def name(self, namespace: str, k: L.Key) -> str:
        """The key string of a umbp_key of `namespace` (for removed events)."""
        return (f"{KEY_PREFIX}{namespace}:tp{k.tp_rank}:pcp{k.pcp_rank}:dcp{k.dcp_rank}:"
                f"pp{k.pp_rank}:g{k.group}:{bytes(k.hash[:k.hash_len]).hex()}")


def _attach_existing(cfg: UMBPConfig, role: int, rank: int) -> _Pool | None:
    """Attach to the pool if it exists: the scheduler's view. None when an
    embedded pool is not created yet (its workers create it)."""
    if cfg.mode == "standalone":
        return _Pool(cfg, 0, role, rank)   # ValueError naming `umbp daemon` when missing
    lib = L.lib()
    h = C.c_void_p()
    opts = L.AttachOpts()
    lib.umbp_attach_opts_init(C.byref(opts))
    opts.role, opts.rank = role, rank
    rc = lib.umbp_pool_attach(cfg.pool.encode(), C.byref(opts), C.byref(h))
    if rc == -errno.ENOENT:
        return None
    L.check(rc, f"attach pool {cfg.pool}")
    lib.umbp_pool_detach(h)
    pool = _Pool(replace(cfg, mode="standalone"), 0, role, rank)   # attach only; never the owner
    pool.engine_made = True   # made by this engine's workers: no daemon to start again when it is lost
    return pool


class UMBPSchedulerHandle:
    """Scheduler side: existence of key strings by one bulk probe of the pool.

    With ``"tier": true`` a lookup that misses also asks the host's
    `umbp tier` for the missing blocks (docs/cluster.md) and waits for the
    answer, up to tier_timeout_ms, before it probes again: meant for the
    in-tree connector's ``lookup_async`` (its lookups run on a thread pool and
    the request waits as "not yet"); without it the scheduler itself waits."""

    def __init__(self, cfg: UMBPConfig, namespace: str, rank_count: int = 1):
        self.cfg = cfg
        self.namespace = namespace
        self.rank_count = max(1, rank_count)
        self.pool: _Pool | None = None
        self._lock = threading.Lock()   # lookup_async runs lookups on a thread pool
        self._codec: KeyCodec | None = None
        self._tier = None
        self._attach()

    def _attach(self) -> bool:
        if self.pool is None:
            self.pool = _attach_existing(self.cfg, 1, -1)
            if self.pool is not None:
                self._codec = KeyCodec(self.pool.ns)
        return self.pool is not None

    def lookup(self, keys: Sequence[str]) -> Sequence[bool]:
        """Presence of each key (umbp_contains_bulk); MalformedKeyError for keys
        not in the connector's format. All misses while the embedded pool does
        not exist yet."""
        with self._lock:
            if not self._attach():
                KeyCodec(lambda ns: 0).encode(keys)   # still refuse malformed keys
                return [False] * len(keys)
            # said once, as umbp.vllm's scheduler does: a pool destroyed under
            # the engine (`umbp pool destroy --force`) went unsaid here
            self.pool.check_lost()
            arr = self._codec.encode(keys)
            n = len(keys)
            present = (C.c_uint8 * max(1, n))()
            if n:
                L.check(self.pool.lib.umbp_contains_bulk(self.pool.h, n, arr, present), "lookup")
            if n and self.cfg.tier and not all(present[:n]) and n % self.rank_count == 0:
                if self._read_through(arr, present, n):
                    L.check(self.pool.lib.umbp_contains_bulk(self.pool.h, n, arr, present), "lookup")
            return [bool(v) for v in present[:n]]

    def _read_through(self, arr, present, n: int) -> bool:
        """Ask the tier for the blocks from the first one missing on some rank
        (the keys are group-, then block-major with rank_count shards a block,
        as the in-tree connector builds them) and wait for its answer."""
        from .tier import TierClient
        if self._tier is None:
            self._tier = TierClient(self.pool.h, self.cfg.tier_timeout_ms)
        r = self.rank_count
        first = next(i for i in range(n) if not present[i]) // r * r
        cap = self._tier.max_blocks(r)
        count = min((n - first) // r, cap)
        if count <= 0:
            return False
        sub = (L.Key * (count * r)).from_buffer(arr, first * C.sizeof(L.Key))
        asked = self._tier.request(sub, count, r)
        if asked is None:
            return False
        # tier_timeout_ms 0 is the running tier's own --timeout-ms (the request
        # table's default), not "give up at once": the backstop waits for that
        from .tier import tier_info
        ms = self.cfg.tier_timeout_ms
        if not ms:
            try:
                ms = (tier_info(self.pool.h) or {}).get("default_timeout_ms") or 2000
            except OSError:   # a table this process may not read: the request above went through it, so rare
                ms = 2000
        end = time.monotonic() + ms / 1000.0 + 0.05
        while True:
            v = self._tier.poll(asked[0])
            if v is not None:
                return v > 0
            if time.monotonic() > end:  # the poll cancels at the deadline; this is a backstop
                self._tier.cancel(asked[0])
                return False
            time.sleep(0.0002)

    def clear(self) -> bool:
        with self._lock:
            if not self._attach():
                return True
            L.check(self.pool.lib.umbp_clear_ns(self.pool.h, self.pool.ns(self.namespace)), "clear")
            return True

    def close(self) -> None:
        with self._lock:
            if self._tier is not None:
                self._tier.close()
                self._tier = None
            if self.pool is not None:
                self.pool.close()
                self.pool = None


class _Job:
    """The C jobs behind one TransferJobState: [(c job, key indices, group)]."""

    __slots__ = ("store", "parts", "held", "timed_out")

    def __init__(self, store: bool):
        self.store = store
        self.parts: list[tuple[C.c_void_p, list[int], int]] = []
        self.held = False   # store done and unpublished: its C jobs keep the slots
        self.timed_out: set[int] = set()   # C jobs wait() cancelled, never started, at load_timeout_ms


class UMBPWorkerHandle:
    """Worker side: one rank's KV tensors <-> the pool through the C copy engine."""

    def __init__(self, cfg: UMBPConfig, namespace: str, topology: RankTopology,
                 layout: KVLayoutDescriptor):
        self.cfg = cfg
        self.namespace = namespace
        self.topology = topology
        self.layout = layout
        self.lib = L.lib()
        self.obj_bytes: dict[int, int] = {}
        for r in layout.regions:
            self.obj_bytes[r.group_id] = self.obj_bytes.get(r.group_id, 0) + r.block_bytes
        need = max(self.obj_bytes.values(), default=4096)
        # slot_size makes an embedded pool; a daemon's pool is checked against the block object
        block = max(4096, (need + 4095) // 4096 * 4096)
        slot = max(block, (cfg.slot_size or 0) if cfg.mode == "embedded" else 0)
        nodes = None
        if cfg.mode == "embedded" and cfg.numa_nodes is None:
            nodes = plan_placement(cfg, topology.tp_size, topology.tp_rank, log_level=logging.DEBUG).numa_nodes
        # the in-tree connector gives no vLLM instance id: see umbp.vllm_pool's limits
        self.pool = _Pool(cfg, slot, 2, topology.tp_rank, nodes, EngineId(None, namespace), block)
        self.ns_id = self.pool.ns(namespace)
        t = topology
        self._ranks = (t.tp_rank, t.pcp_rank, t.dcp_rank, t.pp_rank)
        # take_evicted_keys() reads the pool's removals from here on
        # named after its ranks, not its pid: a restarted engine's worker
        # takes the feed place its earlier process had (PoolRemovals)
        self._removals = PoolRemovals(self.pool, f"this worker (tp{t.tp_rank} pcp{t.pcp_rank} "
                                                  f"dcp{t.dcp_rank} pp{t.pp_rank})",
                                      f"vllm-w.t{t.tp_rank}c{t.pcp_rank}d{t.dcp_rank}p{t.pp_rank}")
        self.codec = KeyCodec(self.pool.ns)
        self._engine = None
        self._layout = None
        self._region_of: dict[tuple[str, int], tuple[int, int]] = {}  # (layer, segment) -> (base, stride)
        self._jobs: dict[int, _Job] = {}
        self._lock = threading.Lock()
        self.placement = None

    # ---- buffers -------------------------------------------------------------
    def register_buffers(self, kv_caches: dict[str, torch.Tensor]) -> None:
        """A C layout over the layout descriptor's regions (each segment a
        region of its own, in object order) and the copy engine."""
        regs = []
        cuda_dev = None
        for layer, region in enumerate(self.layout.regions):
            t = kv_caches.get(region.layer_name)
            if t is None:
                raise ValueError(f"UMBP runtime: KV cache {region.layer_name!r} was not registered")
            if t.device.type not in ("cpu", "cuda"):
                raise ValueError(f"KV cache {region.layer_name} is on {t.device}; UMBP supports cpu and cuda")
            stride = t.stride(0) * t.element_size()
            if region.segments:
                stride = region.block_stride
            if region.block_bytes > stride and not region.segments:
                raise ValueError(f"UMBP runtime: a block of {region.layer_name!r} ({region.block_bytes} bytes) "
                                 f"spans several physical blocks of {stride} bytes; this layout is not "
                                 "supported by the umbp backend")
            if t.device.type == "cuda":
                cuda_dev = t.device.index or 0
            runs = region.segments or ((0, region.block_bytes),)
            for seg, (off, length) in enumerate(runs):
                r = L.KVRegion()
                r.base = t.data_ptr() + off
                r.block_bytes = length
                r.stride = stride
                r.block_count = t.shape[0]
                r.device = 1 if t.device.type == "cuda" else 0
                r.device_id = t.device.index or 0
                r.group = region.group_id
                r.layer = len(regs)          # object order = the planner's order
                r.kind = 2                   # UMBP_KV_KV
                regs.append(r)
                self._region_of[(region.layer_name, seg)] = (t.data_ptr() + off, stride)
        if not regs:
            raise ValueError("UMBP runtime: the KV layout has no regions to transfer")
        self._layout, self.placement, self._engine = layout_and_engine(
            self.pool, regs, self.cfg, self.topology.tp_size, self.topology.tp_rank, cuda_dev)

    # ---- submission ----------------------------------------------------------
    @staticmethod
    def _columns(plans) -> tuple[list[str], list[int], list[int | None]]:
        if isinstance(plans, (BlockLoadBatch, BlockStoreBatch)):
            return list(plans.keys), list(plans.block_ids), list(plans.group_ids)
        return ([p.key for p in plans], [p.block_id for p in plans],
                [p.group_id if p.group_id is not None else (p.ranges[0].group_id if p.ranges else None)
                 for p in plans])

    def _range_mismatch(self, plan: BlockTransferPlan) -> str | None:
        """Why plan's ranges are not those of its block in the registered layout."""
        segs: dict[str, int] = {}
        for rg in plan.ranges:
            seg = segs.get(rg.layer_name, 0)
            segs[rg.layer_name] = seg + 1
            base = self._region_of.get((rg.layer_name, seg))
            if base is None or rg.base_address != base[0] + plan.block_id * base[1]:
                return (f"range of {rg.layer_name!r} at {rg.base_address:#x} is not block {plan.block_id} "
                        "of the registered KV cache")
        return None

    def _submit(self, plans, store: bool) -> TransferJobState:
        is_batch = isinstance(plans, (BlockLoadBatch, BlockStoreBatch))
        state_plans = plans if is_batch else tuple(plans)
        keys, block_ids, groups = self._columns(state_plans)
        default_group = next(iter(self.obj_bytes), 0)
        groups = [default_group if g is None else g for g in groups]
        job = TransferJobState(state_plans, plan_bytes=tuple(self.obj_bytes.get(g, 0) for g in groups))
        job.start()
        if not keys:
            job.complete()
            return job
        if self._engine is None:
            job.fail(keys, "transfer not attempted: UMBP KV caches are not registered")
            return job
        rec = _Job(store)
        failed: dict[str, list[int]] = {}
        by_group: dict[int, list[int]] = {}
        for i, g in enumerate(groups):
            if g not in self.obj_bytes:
                failed.setdefault(f"KV group {g} is not in the registered layout", []).append(i)
            elif not is_batch and state_plans[i].ranges and (why := self._range_mismatch(state_plans[i])):
                failed.setdefault(why, []).append(i)
            else:
                by_group.setdefault(g, []).append(i)
        for g, idx in by_group.items():   # one C job per KV group
            try:
                sub = self.codec.encode([keys[i] for i in idx])
            except MalformedKeyError as e:
                failed.setdefault(str(e), []).extend(idx)
                continue
            ids = (C.c_uint32 * len(idx))(*[block_ids[i] for i in idx])
            cj = C.c_void_p()
            if store:
                rc = self.lib.umbp_dp_store(self._engine, self._layout, g, -1, len(idx), ids, sub,
                                            L.UMBP_DP_STORE_DEFER_PUBLISH, C.byref(cj))
            else:
                rc = self.lib.umbp_dp_load(self._engine, self._layout, g, len(idx), sub, ids, C.byref(cj))
            if rc < 0:
                why = self.lib.umbp_last_error().decode(errors="replace") or os.strerror(-rc)
                failed.setdefault(f"UMBP {'store' if store else 'load'} refused: {why}", []).extend(idx)
                continue
            rec.parts.append((cj, idx, g))
        for why, idx in failed.items():
            job.fail([keys[i] for i in idx], why)
        if rec.parts:
            with self._lock:
                self._jobs[id(job)] = rec
        return job

    def load(self, plans: Sequence[BlockTransferPlan]) -> TransferJobState:
        return self._submit(plans, store=False)

    def load_blocks(self, plans: Sequence[BlockTransferPlan]) -> TransferJobState | None:
        return self._submit(plans, store=False) if self._engine is not None else None

    def store(self, plans: Sequence[BlockTransferPlan]) -> TransferJobState:
        return self._submit(plans, store=True)

    def store_blocks(self, plans: Sequence[BlockTransferPlan]) -> TransferJobState | None:
        return self._submit(plans, store=True) if self._engine is not None else None

    # ---- completion ----------------------------------------------------------
    def _finalize(self, job: TransferJobState, rec: _Job) -> TransferJobState:
        """Every C job of rec is done: per-key results into job."""
        keys = job.keys
        ok: list[str] = []
        errors: dict[str, list[str]] = {}
        op = "store" if rec.store else "load"
        for cj, idx, g in rec.parts:
            rc = (C.c_int * len(idx))()
            self.lib.umbp_dp_job_results(cj, rc, len(idx))
            for j, i in enumerate(idx):
                if rc[j] == 0:
                    ok.append(keys[i])
                elif rc[j] == -errno.ECANCELED and cj.value in rec.timed_out:
                    why = (f"not started within load_timeout_ms={self.cfg.load_timeout_ms} (this rank's copy "
                           f"threads were busy with earlier transfers), so it was cancelled and none of its KV "
                           f"buffers was touched; raise load_timeout_ms or copy_threads if this recurs")
                    errors.setdefault(f"UMBP {op} failed: {why}", []).append(keys[i])
                else:
                    msg = (self.lib.umbp_dp_job_message(cj, j) or b"").decode(errors="replace")
                    why = "not in the pool" if rc[j] == -errno.ENOENT else msg or os.strerror(-rc[j])
                    errors.setdefault(f"UMBP {'store' if rec.store else 'load'} failed: {why}", []).append(keys[i])
        if ok:
            job.complete(ok)
        for why, ks in errors.items():
            job.fail(ks, why)
        if rec.store and job.status == TransferJobStatus.COMPLETED:
            rec.held = True                       # slots stay reserved until publish()
        else:
            self._release(job, rec)
        return job

    def _release(self, job: TransferJobState, rec: _Job) -> None:
        """Drop the C jobs (an unpublished store's slots go back to the pool)."""
        for cj, _, _ in rec.parts:
            self.lib.umbp_dp_job_release(cj)
        rec.parts = []
        with self._lock:
            self._jobs.pop(id(job), None)

    def _rec(self, job: TransferJobState) -> _Job | None:
        with self._lock:
            return self._jobs.get(id(job))

    def poll(self, job: TransferJobState) -> TransferJobState | None:
        rec = self._rec(job)
        if rec is None or rec.held:
            return job if job.status != TransferJobStatus.RUNNING else None
        if any(self.lib.umbp_dp_job_poll(cj) != 0 for cj, _, _ in rec.parts):
            return None
        return self._finalize(job, rec)

    def wait(self, job: TransferJobState) -> TransferJobState:
        """The job's final state once none of its copies can touch its KV
        buffers any more, within load_timeout_ms.

        A C job is queued (no copy started: umbp_dp_job_cancel can still stop
        it), running (some copy started; it runs to its end) or done. At the
        deadline, the C jobs still queued are cancelled: their keys fail
        (vLLM recomputes a failed load; a failed store is not published) and
        the job is returned, since nothing of it writes the buffers any more.
        Only a copy that started and still runs makes wait raise TimeoutError
        (the contract's "otherwise raise"): the buffers are then truly in use,
        and a later wait, cancel or close waits for it."""
        rec = self._rec(job)
        if rec is None or rec.held:
            if job.status == TransferJobStatus.RUNNING:
                raise RuntimeError("UMBP runtime: wait on a job this handle does not own")
            return job
        timeout = self.cfg.load_timeout_ms
        deadline = time.monotonic() + timeout / 1000.0   # one bound for the whole job, not per C job
        late = []
        for cj, _, _ in rec.parts:
            left = max(0, int((deadline - time.monotonic()) * 1000))
            if self.lib.umbp_dp_job_wait(cj, left) != 0:
                late.append(cj)
        running = cancelled = 0
        for cj in late:
            rc = self.lib.umbp_dp_job_cancel(cj)
            if rc == 0:
                rec.timed_out.add(cj.value)
                cancelled += 1
            elif rc != -errno.EALREADY:    # -EBUSY: copies started (-ECHILD: an engine inherited by fork())
                running += 1
        if running:
            also = f" ({cancelled} not started were cancelled)" if cancelled else ""
            raise TimeoutError(
                f"UMBP {'store' if rec.store else 'load'} not done after load_timeout_ms={timeout}: {running} of "
                f"its {len(rec.parts)} copy job(s) started copying and still run, so its KV buffers are still in "
                f"use{also}; wait again or cancel() to wait for them, and raise load_timeout_ms or copy_threads "
                f"if copies take this long")
        return self._finalize(job, rec)

    def publish(self, job: TransferJobState) -> None:
        """Make a completed store visible: one umbp_dp_job_publish per C job."""
        if job.status != TransferJobStatus.COMPLETED:
            raise RuntimeError(f"cannot publish a UMBP store in state {job.status.value}")
        rec = self._rec(job)
        if rec is None:
            return          # nothing held: every key was already present, or published before
        if not rec.store or not rec.held:
            raise RuntimeError("UMBP runtime: publish of a job that is not a finished store")
        keys = job.keys
        for cj, idx, _ in rec.parts:
            rc = (C.c_int * len(idx))()
            nfail = self.lib.umbp_dp_job_publish(cj, rc, len(idx))
            if nfail != 0:
                bad = [keys[i] for j, i in enumerate(idx) if nfail < 0 or rc[j] != 0]
                logger.warning("UMBP publish left %d of %d key(s) unpublished (%s)", len(bad), len(idx),
                               self.lib.umbp_last_error().decode(errors="replace") if nfail < 0 else rc[:len(idx)])
        self._release(job, rec)

    def cancel(self, job: TransferJobState) -> TransferJobState:
        """Cancel the C jobs not yet copying; wait for the others."""
        rec = self._rec(job)
        if rec is None or rec.held:
            return job
        cancelled = [self.lib.umbp_dp_job_cancel(cj) == 0 for cj, _, _ in rec.parts]
        if all(cancelled):
            job.cancel("preempted")
            self._release(job, rec)
            return job
        return self.wait(job)

    # ---- events --------------------------------------------------------------
    def take_evicted_keys(self) -> Sequence[str]:
        """Keys of this worker (its namespace and ranks) removed from the pool
        (evicted, removed, cleared) since the last call, by any process (see
        the module note)."""
        # from the event ring, a removal this worker drains reaches no other
        # worker: then every rank's removals are this worker's to report
        ranks = self._ranks if self._removals.broadcast else None
        return [self.codec.name(self.namespace, k) for k in self._removals.removed(self.ns_id)
                if ranks is None or (k.tp_rank, k.pcp_rank, k.dcp_rank, k.pp_rank) == ranks]

    def close(self) -> None:
        with self._lock:
            recs = list(self._jobs.items())
            self._jobs.clear()
        for _, rec in recs:
            for cj, _, _ in rec.parts:
                self.lib.umbp_dp_job_cancel(cj)
                self.lib.umbp_dp_job_wait(cj, _FOREVER)
                self.lib.umbp_dp_job_release(cj)
        if self._engine is not None:
            self.lib.umbp_dp_engine_destroy(self._engine)
            self._engine = None
        if self._layout is not None:
            self.lib.umbp_kv_layout_free(self._layout)
            self._layout = None
        self._removals.close()   # before the pool handle goes
        self.pool.close()


class UMBPRuntime:
    """IUMBPRuntime over libumbp, for the in-tree connector's modes embedded
    (this engine's workers create the pool) and standalone (`umbp daemon`
    owns it)."""

    def __init__(self, config: UMBPRuntimeConfig):
        self.mode = config.mode
        try:
            L.lib()   # fail here, at connector construction, when libumbp cannot be loaded
        except OSError as e:
            raise RuntimeError(
                f"vLLM's UMBPStoreConnector has backend 'umbp' but libumbp cannot be loaded ({e}). "
                "Fix: install the umbp package with its library into vLLM's environment ('pip install .' "
                "from the umbp repository), or set UMBP_LIB=/path/to/libumbp.so, or drop \"backend\": "
                "\"umbp\" from kv_connector_extra_config to use the runtime registered before (MORI)") from e
        self.cfg = runtime_config({**config.options, "mode": config.mode})   # checks the pool name with libumbp
        # keys that make an embedded pool; a daemon's pool is used as it is
        self._unapplied = [k for k in ("capacity_bytes", "total_capacity_bytes", "slot_size", "numa_nodes",
                                       "index_pages", "no_prefault") if k in config.options]

    @classmethod
    def from_config(cls, config: UMBPRuntimeConfig) -> UMBPRuntime:
        return cls(config)

    def create_scheduler_handle(self, namespace: str, topology: RankTopology,
                                layout: KVLayoutDescriptor) -> UMBPSchedulerHandle:
        del layout
        if self.cfg.mode == "standalone" and self._unapplied:
            # said by umbp.vllm's scheduler (umbp.vllm.UMBPStoreConnector), not by this
            # runtime: the keys went unapplied without a word. Once an engine, here.
            logger.warning("UMBP runtime: mode 'standalone' uses the daemon's pool %r as it is: %s, which make "
                           "an embedded pool, are not applied (a daemon's --capacity and --slot-size set its "
                           "pool); drop them from kv_connector_extra_config", self.cfg.pool,
                           ", ".join(self._unapplied))
        return UMBPSchedulerHandle(self.cfg, namespace, topology.rank_count)

    def create_worker_handle(self, namespace: str, topology: RankTopology,
                             layout: KVLayoutDescriptor) -> UMBPWorkerHandle:
        return UMBPWorkerHandle(self.cfg, namespace, topology, layout)
