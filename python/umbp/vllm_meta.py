# SPDX-License-Identifier: Apache-2.0
"""What travels between umbp.vllm's roles and to vLLM: the step's metadata
(scheduler -> workers), the workers' store results (workers -> scheduler), the
handshake that carries the derived namespace, KV events, and the connector's
stats and Prometheus metrics.
"""
from __future__ import annotations

import ctypes as C
import errno
from dataclasses import dataclass, field
from typing import Any

from vllm.distributed.kv_events import BlockRemoved, KVCacheEvent, KVConnectorKVEvents
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorHandshakeMetadata,
    KVConnectorMetadata,
    KVConnectorWorkerMetadata,
)
from vllm.distributed.kv_transfer.kv_connector.v1.metrics import (
    KVConnectorPromMetrics,
    KVConnectorStats,
)

from . import _lib as L

MEDIUM = "CPU"

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
