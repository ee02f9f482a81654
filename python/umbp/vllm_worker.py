# SPDX-License-Identifier: Apache-2.0
"""The worker role of umbp.vllm's UMBPStoreConnector.

WorkerSide holds the connector's worker-role methods: it registers the KV
tensors as a C layout with a placed copy engine, copies the step's planned
loads and stores between them and the pool through the data path
(umbp_dp_load / umbp_dp_store, one batched call per KV group per step, no
per-block Python loop), and reports store results and load errors back. It is
a mixin: its state (self.pool, self._engine, self._layout, self._stats, ...)
is made by UMBPStoreConnector.__init__ (umbp.vllm).
"""
from __future__ import annotations

import ctypes as C
import itertools
import time
from typing import Any

import torch

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorHandshakeMetadata,
    KVConnectorWorkerMetadata,
)

from . import _lib as L
from .vllm_config import _keys, _u32, derive_namespace, layout_and_engine
from .vllm_meta import (
    StorePlan,
    UMBPConnectorMetadata,
    UMBPConnectorWorkerMetadata,
    UMBPHandshakeMetadata,
    UMBPStoreKVEvents,
    _cause,
)


class WorkerSide:
    """Worker-role methods of UMBPStoreConnector (a mixin; see the module)."""

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
        """Wait for this step's synchronous loads, each until load_timeout_ms
        after it started (the step's loads start together in start_load_kv,
        so the step waits load_timeout_ms in all, not that much a job). A load
        past it is cancelled (its blocks not yet copied fail and are
        recomputed) and waited for: a copy already started is this process's
        own and ends on its own, and none may write the KV cache once the
        forward pass reads it."""
        for job, n, _, g in self._load_jobs:
            t0 = self._job_start.get(job.value, time.monotonic())
            left = max(0, round((t0 - time.monotonic()) * 1000) + self.cfg.load_timeout_ms)
            if self.lib.umbp_dp_job_wait(job, left) < 0:
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

    def _end_jobs(self) -> None:
        """At shutdown: end and release every job this worker holds, within
        load_timeout_ms plus the copies already started.

        Stores in flight get until load_timeout_ms to finish (what they copied
        is published and counted). Then every job left — stores, synchronous
        loads (a step that ended between start_load_kv and wait_for_layer_load:
        its forward pass raised) and asynchronous loads — is cancelled, which
        stops it if no copy started (nothing of it touched the KV cache), and
        released: the engine frees a job whose copies started once they stop,
        and umbp_dp_engine_destroy, called next, waits for those copies, so
        vLLM never frees a KV tensor under one. A started copy runs to its
        end and is not waited for here without a bound (it was 0xFFFFFFFF)."""
        deadline = time.monotonic() + self.cfg.load_timeout_ms / 1000.0
        for job, _, _ in self._store_jobs:
            self.lib.umbp_dp_job_wait(job, max(0, int((deadline - time.monotonic()) * 1000)))
        self._poll_stores(wait=False)   # accounts and releases the stores that are done
        jobs = [j for j, _, _ in self._store_jobs] + [j for j, _, _, _ in self._load_jobs]
        jobs += [j for js in self._async_loads.values() for j, _, _ in js]
        for job in jobs:
            self.lib.umbp_dp_job_cancel(job)
            self.lib.umbp_dp_job_release(job)
        self._store_jobs, self._load_jobs = [], []
        self._async_loads.clear()
        self._async_started.clear()
        self._async_cancelled.clear()
        self._job_start.clear()

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

    def get_kv_connector_kv_cache_events(self) -> UMBPStoreKVEvents | None:
        return None  # BlockStored is emitted by the scheduler once every worker reported

    def build_connector_worker_meta(self) -> KVConnectorWorkerMetadata | None:
        if not self._worker_meta.store_events:
            return None
        out, self._worker_meta = self._worker_meta, UMBPConnectorWorkerMetadata()
        return out

    def get_handshake_metadata(self) -> KVConnectorHandshakeMetadata | None:
        return UMBPHandshakeMetadata(namespace=self.namespace) if self.namespace else None
