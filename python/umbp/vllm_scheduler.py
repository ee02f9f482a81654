# SPDX-License-Identifier: Apache-2.0
"""The scheduler role of umbp.vllm's UMBPStoreConnector.

SchedulerSide holds the connector's scheduler-role methods: it probes the pool
for every rank's keys (umbp_conn_probe_matched), plans loads and stores per
step into UMBPConnectorMetadata, turns the workers' store results into
BlockStored events once every worker has reported them, and turns the pool's
removals of its namespace into BlockRemoved (read from the pool's broadcast
feed, so that every engine on a shared pool sees every removal). It is a mixin: its state (self.pool,
self.cfg, self._reqs, self._event_plans, ...) is made by
UMBPStoreConnector.__init__ (umbp.vllm).
"""
from __future__ import annotations

import ctypes as C
import itertools
import logging
from dataclasses import dataclass, field
from typing import Any

from vllm.distributed.kv_events import BlockRemoved, BlockStored, KVCacheEvent
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorHandshakeMetadata,
    KVConnectorMetadata,
)

from . import _lib as L
from .vllm_config import _keys
from .vllm_meta import (
    MEDIUM,
    LoadSpec,
    StorePlan,
    UMBPConnectorMetadata,
    UMBPConnectorWorkerMetadata,
    UMBPStoreKVEvents,
)
from .vllm_pool import PoolRemovals


logger = logging.getLogger("vllm.umbp")


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


class SchedulerSide:
    """Scheduler-role methods of UMBPStoreConnector (a mixin; see the module)."""

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
        self.pool.check_lost()   # said once: a pool destroyed under the engine
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

    def _open_removals(self) -> None:
        """Read the pool's removals from now on (PoolRemovals: the pool's
        broadcast feed as consumer "vllm.PID", so that every engine sharing
        the pool sees every removal; the event ring, with a warning, when the
        feed has no place for it)."""
        self._removals = PoolRemovals(self.pool, "this engine")

    def _close_removals(self) -> None:
        if getattr(self, "_removals", None) is not None:
            self._removals.close()
            self._removals = None

    def _removed(self, h: bytes, group: int, seen: set, out: list) -> None:
        # a block missing on any rank is no longer a hit for the engine:
        # one BlockRemoved per (hash, group), whichever rank lost it first
        if (h, group) not in seen:
            seen.add((h, group))
            out.append(BlockRemoved(block_hashes=[h], medium=MEDIUM, group_idx=group))

    def _drain_removed(self) -> list[KVCacheEvent]:
        out: list[KVCacheEvent] = []
        seen: set[tuple[bytes, int]] = set()
        for k in self._removals.removed(self.ns_id):
            self._removed(bytes(k.hash[:k.hash_len]), k.group, seen, out)
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
