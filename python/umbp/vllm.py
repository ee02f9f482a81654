# SPDX-License-Identifier: Apache-2.0
"""vLLM KV connector over libumbp: ``UMBPStoreConnector``.

Load it with::

  --kv-transfer-config '{"kv_connector":"UMBPStoreConnector",
    "kv_connector_module_path":"umbp.vllm","kv_role":"kv_both",
    "kv_load_failure_policy":"recompute",
    "kv_connector_extra_config":{"pool":"vllm","capacity_bytes":"64GiB"}}'

Roles. The scheduler-role connector probes the pool for every rank's keys
(umbp_conn_probe_matched: whole blocks, prefix order, every rank, the last
prompt token always computed), plans loads and stores per step into
UMBPConnectorMetadata, and turns the workers' store results into BlockStored
events once every worker has reported them; BlockRemoved events come from the
pool's event ring. The worker-role connector copies blocks between its KV
tensors and the pool through the data path (umbp_dp_store / umbp_dp_load), one
batched call per KV group per step — no per-block Python loop.

Channels between the roles: store results go worker → scheduler through
build_connector_worker_meta / update_connector_output; a request with store
events not yet reported by every worker keeps its GPU blocks
(request_finished returns True) until every worker has reported it in
finished_sending. When key_namespace is not configured, each worker derives the
namespace from its KV layout and reports it through get_handshake_metadata; the
scheduler binds it in set_xfer_handshake_metadata.

Modules: umbp.vllm_config (kv_connector_extra_config, placement, the derived
namespace and its label), umbp.vllm_pool (the pool: attach, or create, share
and remove an embedded one), umbp.vllm_meta (what travels between the roles: metadata,
events, stats, metrics), umbp.vllm_scheduler (the scheduler-role methods),
umbp.vllm_worker (the worker-role methods). This module has the connector
class, which joins them, and re-exports their names.
"""
from __future__ import annotations

import ctypes as C
import itertools
import logging
from dataclasses import replace
from typing import Any

import torch

from vllm.distributed.kv_events import KVCacheEvent
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorRole,
    SupportsHMA,
)
from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorStats

from . import _lib as L
# Every name umbp.vllm had before it was split stays importable from here
# (vllm_runtime, tests, tools and users import them from umbp.vllm).
from .vllm_config import (  # noqa: F401
    _CONFIG_KEYS,
    _CUDA_COPY,
    _INDEX_PAGES,
    SUPPORTED_VLLM,
    Placement,
    UMBPConfig,
    _dtype_name,
    _keys,
    _object_bytes,
    _parse_size,
    _slot_size,
    _u32,
    check_vllm_version,
    derive_namespace,
    layout_and_engine,
    layout_fingerprint,
    logger,
    namespace_label,
    plan_placement,
)
from .vllm_meta import (  # noqa: F401
    _CAUSES,
    _LATENCY_BUCKETS,
    _OPS,
    _SCHED_FIELDS,
    _STAT_FIELDS,
    MEDIUM,
    LoadSpec,
    StorePlan,
    UMBPConnectorMetadata,
    UMBPConnectorWorkerMetadata,
    UMBPHandshakeMetadata,
    UMBPKVConnectorStats,
    UMBPPromMetrics,
    UMBPStoreKVEvents,
    _cause,
)
from .vllm_pool import EngineId, _Pool  # noqa: F401
from .vllm_scheduler import SchedulerSide, _ReqState  # noqa: F401
from .vllm_worker import WorkerSide  # noqa: F401


class UMBPStoreConnector(SchedulerSide, WorkerSide, KVConnectorBase_V1, SupportsHMA):
    """vLLM KV connector that keeps KV blocks in a umbp shared-memory pool.

    One class for both roles, as vLLM asks: __init__ makes the state of both,
    the scheduler-role methods come from SchedulerSide (umbp.vllm_scheduler),
    the worker-role ones from WorkerSide (umbp.vllm_worker); what both use is
    here."""

    def __init__(self, vllm_config, role: KVConnectorRole, kv_cache_config=None):
        check_vllm_version()
        super().__init__(vllm_config, role, kv_cache_config)
        ktc = vllm_config.kv_transfer_config
        self.cfg = UMBPConfig.from_extra(ktc.kv_connector_extra_config)
        pc = vllm_config.parallel_config
        if pc.pipeline_parallel_size > 1:
            raise NotImplementedError("UMBPStoreConnector does not support pipeline parallelism "
                                      f"(pipeline_parallel_size={pc.pipeline_parallel_size}): use "
                                      "tensor parallelism only")
        if kv_cache_config is None:
            raise ValueError("UMBPStoreConnector needs kv_cache_config (vLLM >= 0.11 passes it)")
        # Keys carry the TP rank alone and pair request.block_hashes[i] with
        # block i of every KV group: context parallelism (PCP ranks of one TP
        # rank would store different token shards under one key) and a hash
        # block other than the KV block (DCP's virtual blocks of block_size x
        # DCP tokens) would load other tokens' KV as a hit, without an error.
        cp = {k: getattr(pc, f"{k}_context_parallel_size", 1) or 1 for k in ("prefill", "decode")}
        if any(v > 1 for v in cp.values()):
            raise NotImplementedError("UMBPStoreConnector does not support context parallelism "
                                      f"(prefill_context_parallel_size={cp['prefill']}, "
                                      f"decode_context_parallel_size={cp['decode']}): use tensor parallelism only")
        hb = getattr(kv_cache_config, "hash_block_size", None)
        if hb and hb != vllm_config.cache_config.block_size:
            raise NotImplementedError(f"vLLM hashes this engine's prompts in blocks of {hb} tokens but its KV cache "
                                      f"blocks hold {vllm_config.cache_config.block_size}: UMBPStoreConnector keys a "
                                      "KV block by its prompt block's hash, so it needs the two equal (KV cache "
                                      "groups of one block size, no prefix_match_unit, no context parallelism)")
        ids = getattr(kv_cache_config, "prefix_cacheable_group_ids", None)
        cacheable = set(range(len(kv_cache_config.kv_cache_groups)) if ids is None else ids)
        drafts = [i for i, g in enumerate(kv_cache_config.kv_cache_groups)
                  if getattr(g, "is_eagle_group", False) and i not in cacheable]
        if drafts:
            raise NotImplementedError(f"draft-model KV groups {drafts} are not prefix-cacheable, so a "
                                      "restored prefix would lack the draft's KV: disable speculative "
                                      "decoding or use a draft whose KV groups are prefix-cacheable")
        self.kv_role = ktc.kv_role
        self.block_size = vllm_config.cache_config.block_size
        self.tp_size = pc.tensor_parallel_size
        self.tp_rank = pc.rank % self.tp_size if hasattr(pc, "rank") else 0
        self.groups = list(range(len(kv_cache_config.kv_cache_groups)))
        self.kv_cache_config = kv_cache_config
        slot = _slot_size(self.cfg, kv_cache_config)
        sched = role == KVConnectorRole.SCHEDULER
        nodes = None
        if self.cfg.mode == "embedded" and self.cfg.numa_nodes is None:
            # the pool's partitions, should this process be the one that creates it
            nodes = plan_placement(self.cfg, self.tp_size, self.tp_rank, log_level=logging.DEBUG).numa_nodes
        # Who this process is to an embedded pool that another process made:
        # vLLM's instance id is the same in this engine's scheduler and workers
        # (the VllmConfig is pickled to them), the namespace is what the
        # workers derive in register_kv_caches (the same inputs are known here).
        derived = derive_namespace(vllm_config, kv_cache_config, self.cfg)
        # An explicit namespace names no model or layout: each worker (the
        # process that loads bytes into its KV cache) records what its blocks
        # are in the pool's notes, or is refused when another model or layout
        # recorded it first. Not the scheduler: it only looks keys up, and its
        # KVCacheConfig is a copy whose specs vLLM may simplify (a
        # UniformTypeKVCacheSpecs becomes one of its specs).
        layout = layout_fingerprint(vllm_config, kv_cache_config, self.cfg) \
            if self.cfg.key_namespace and not sched else None
        engine = EngineId(getattr(vllm_config, "instance_id", None) or None, derived,
                          None if self.cfg.key_namespace else namespace_label(vllm_config, kv_cache_config), layout)
        need = _slot_size(replace(self.cfg, mode="standalone"), kv_cache_config)   # the block object, to 4 KiB
        self.pool = _Pool(self.cfg, slot, 1 if sched else 2, -1 if sched else self.tp_rank, nodes, engine, need)
        owner = self.pool.engine_pool() if self.cfg.mode == "standalone" else None
        if owner:
            self.pool.close()
            raise ValueError(f"mode 'standalone' attaches to a daemon's pool, but UMBP pool {self.cfg.pool!r} is the "
                             f"embedded pool of {owner}: what this engine stores would go with it. Start "
                             f"`umbp daemon NAME --capacity SIZE` and give its NAME as kv_connector_extra_config.pool, "
                             f"or use mode 'embedded' (an engine of the same model and KV layout joins the pool)")
        if sched and self.kv_role != "kv_producer" and getattr(ktc, "kv_load_failure_policy", None) == "fail":
            # vLLM's default: a block evicted between the lookup and its load
            # (or a load past load_timeout_ms) would end the request in an error
            logger.warning("UMBP: kv_load_failure_policy is 'fail' (vLLM's default), so a request whose blocks "
                           "leave the pool between its lookup and its load, or whose load takes longer than "
                           "load_timeout_ms=%d, fails with an error instead of being computed; add "
                           "\"kv_load_failure_policy\":\"recompute\" to --kv-transfer-config",
                           self.cfg.load_timeout_ms)
        making = [k for k in ("capacity_bytes", "total_capacity_bytes", "slot_size", "numa_nodes", "index_pages",
                              "no_prefault") if k in (ktc.kv_connector_extra_config or {})]
        if sched and self.cfg.mode == "standalone" and making:
            info = L.PoolInfo()
            L.lib().umbp_pool_get_info(self.pool.h, C.byref(info))
            logger.warning("UMBP: mode 'standalone' uses the daemon's pool %r as it is: %s, which make an "
                           "embedded pool, are not applied (the pool has %d slots of %d bytes, set by `umbp "
                           "daemon --capacity --slot-size`); drop them from kv_connector_extra_config",
                           self.cfg.pool, ", ".join(making), info.slot_count, info.slot_size)
        have = L.lib().umbp_slot_size(self.pool.h)
        if sched and have >= 2 * need and not (self.cfg.mode == "embedded" and self.cfg.slot_size):
            # A slot holds one block object whatever its size: a daemon's pool
            # made for a larger model (or with --slot-size left at 256 KiB for a
            # small one) served this engine with most of each slot unused, unsaid.
            logger.warning("UMBP: pool %r has %d-byte slots, %.1fx this model's block object (%d bytes per "
                           "rank, rounded up to 4 KiB): %d%% of the pool's bytes go unused for this engine's "
                           "blocks. For this model alone, a pool made with --slot-size %dKiB holds %.1fx as many "
                           "blocks; a pool that engines of several models share needs the largest one's",
                           self.cfg.pool, have, have / need, need, 100 - 100 * need // have, need // 1024,
                           have / need)
        self.placement: Placement | None = None
        self.lib = L.lib()
        self.namespace: str | None = None
        self.ns_id: int | None = None
        self._is_scheduler = sched
        self._removals = None         # the scheduler's reader of the pool's removals (_open_removals)
        if self.cfg.key_namespace:
            self._bind_namespace(self.cfg.key_namespace)
        # scheduler state
        self._reqs: dict[str, _ReqState] = {}
        self._events_out = UMBPStoreKVEvents()
        self._event_plans: dict[int, tuple[StorePlan, list[int]]] = {}
        self._event_counts: dict[int, list] = {}
        self._next_event = itertools.count(1)
        self._delayed: list[str] = []
        self._cancelled: list[str] = []
        self._tier = None
        if sched and self.cfg.tier:
            from .tier import ReadThrough
            self._tier = ReadThrough(self.pool.h, self.cfg.tier_timeout_ms, self.cfg.tier_wait_ms)
        self._sched_stats = dict.fromkeys(_SCHED_FIELDS, 0)
        self._backlog_reported: int | None = None
        # worker state
        self._stats = None
        self._engine = None
        self._layout = None
        self._store_jobs: list[tuple[Any, list[StorePlan], list[int]]] = []
        self._load_jobs: list[tuple[Any, int, str, int]] = []     # (job, blocks, req id, group)
        self._async_loads: dict[str, list[tuple[Any, int, int]]] = {}  # req id -> [(job, blocks, group)]
        self._async_started: dict[str, float] = {}
        self._async_cancelled: set[str] = set()
        self._load_errors: set[int] = set()
        self._failed_by_cause: dict[str, int] = {}
        self._job_start: dict[int, float] = {}   # load job handle -> submit time
        self._load_latency: list[float] = []
        self._worker_meta = UMBPConnectorWorkerMetadata()
        self._worker_events: list[KVCacheEvent] = []
        self._awaiting_free: dict[str, bool] = {}
        self._kv_caches: dict[str, torch.Tensor] = {}
        if not sched:
            h = C.c_void_p()
            L.check(self.lib.umbp_conn_stats_create(C.byref(h)), "stats")
            self._stats = h

    # ---- shared ----------------------------------------------------------------
    def _bind_namespace(self, name: str) -> None:
        self.namespace = name
        self.ns_id = self.pool.ns(name)
        # the scheduler turns the pool's removals into BlockRemoved events
        # (take_events), read from here on
        if self._is_scheduler and self._removals is None:
            self._open_removals()

    def _tmpl(self, tp_rank: int, group: int) -> L.Key:
        k = L.Key()
        k.ns = self.ns_id
        k.tp_rank = tp_rank
        k.group = group
        return k

    def get_kv_connector_stats(self) -> KVConnectorStats | None:
        st = UMBPKVConnectorStats()
        if self._is_scheduler:  # lookups and the store backlog
            st.data.update(self._sched_stats)
            self._sched_stats = dict.fromkeys(_SCHED_FIELDS, 0)
            backlog = sum(len(plan.hashes) for plan, _ in self._event_plans.values())
            if backlog != self._backlog_reported:
                st.data["store_backlog_blocks"] = backlog
                self._backlog_reported = backlog
            return None if st.is_empty() else st
        if self._stats is None:  # a worker after shutdown
            return None
        s = L.StatsSnapshot()
        self.lib.umbp_conn_stats_read(self._stats, True, C.byref(s))
        for i, op in enumerate(_OPS):
            for f in _STAT_FIELDS:
                st.data[f"{op}_{f}"] = getattr(s, f)[i]
        st.data["failed_by_cause"], self._failed_by_cause = self._failed_by_cause, {}
        st.data["load_latency_s"], self._load_latency = self._load_latency, []
        return None if st.is_empty() else st

    @classmethod
    def build_kv_connector_stats(cls, data: dict[str, Any] | None = None) -> KVConnectorStats | None:
        return UMBPKVConnectorStats(data=dict(data)) if data is not None else UMBPKVConnectorStats()

    @classmethod
    def build_prom_metrics(cls, vllm_config, metric_types, labelnames, per_engine_labelvalues):
        return UMBPPromMetrics(vllm_config, metric_types, labelnames, per_engine_labelvalues)

    def shutdown(self):
        if self._engine is not None:
            self._end_jobs()
            self.lib.umbp_dp_engine_destroy(self._engine)   # waits for copies that started
            self._engine = None
        if self._layout is not None:
            self.lib.umbp_kv_layout_free(self._layout)
            self._layout = None
        if self._stats is not None:
            self.lib.umbp_conn_stats_free(self._stats)
            self._stats = None
        if self._tier is not None:
            self._tier.close()
            self._tier = None
        self._close_removals()   # before the pool handle goes
        self.pool.close()
