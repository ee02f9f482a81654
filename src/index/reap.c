/* SPDX-License-Identifier: Apache-2.0 */
/*
 * reap.c — releasing the index state of a process that died: its
 * namespace-count records, half-finished ring operations, pins, slots, locks
 * and counters (umbp_index_reap_proc()).
 *
 * Design note. The reaper of a dead X or Y (the slot states in index.c) moves
 * their slots while holding the dead process's registry lock, acting under
 * the dead process's owner id (and its thread 0's line for count changes):
 * RESERVED and EVICTING -> FREE (unlinked, counted out; an EVICTING one also
 * gets its removed event), except EVICTING with pins held and its way still
 * linked -> PUBLISHED, which is what Y would have done at its pin check.
 * A FREE slot that the dead process had freed but maybe not enqueued (its
 * ledger), or was moving through a ring cell it held (an enqueue or a
 * dequeue it did not finish), is only enqueued again: by then another
 * process may own it, and a duplicate ring entry is harmless where a second
 * free is not (umbp_ix_requeue_slot(), reserve.c).
 *
 * A clean detach runs the same umbp_index_reap_proc() on the detaching
 * process's own registry slot (index.c, umbp_index_detach_hook()), so a clean
 * exit is never worse than a crash (otherwise a detached process's RESERVED
 * slots would stay under an owner id that no reaper looks at again).
 */
#include "index/index_inline.h"

struct reap_ctx {
  umbp_pool *p;
  uint16_t dead;
  unsigned ledger_tid;
};

static void reap_ring_item(void *arg, const void *elem) {
  struct reap_ctx *c = arg;
  uint64_t v;
  memcpy(&v, elem, sizeof v);
  umbp_pool *p = c->p;
  if (v >= p->hdr->slot_count) return;
  struct umbp_slot_meta *m = (struct umbp_slot_meta *)umbp_pool_region(p, UMBP_REG_SLOTMETA) + v;
  uint64_t w = atomic_load_explicit(&m->state, memory_order_acquire);
  if (ST_STATE(w) == UMBP_SLOT_RESERVED && ST_OWNER(w) == c->dead) return; /* handled as a reservation */
  if (ST_STATE(w) != UMBP_SLOT_FREE) return;
  /* enqueued only: the slot may be taken by now (umbp_ix_requeue_slot()) */
  umbp_ix_requeue_slot(p, &p->procs[c->dead - 1], c->ledger_tid, (uint32_t)v, c->dead);
}

/* Called with the dead process's registry lock held (registry.c). Acts under
 * the dead process's owner id, so that if this reaper dies too, the next one
 * repairs its half-done steps the same way. */
void umbp_index_reap_proc(umbp_pool *p, unsigned slot) {
  struct umbp_shm_header *h = p->hdr;
  struct umbp_proc_slot *ps = &p->procs[slot];
  uint16_t dead = (uint16_t)(slot + 1);
  struct umbp_slot_meta *meta = umbp_pool_region(p, UMBP_REG_SLOTMETA);
  _Atomic uint8_t *pins = umbp_pool_region(p, UMBP_REG_PINS);
  uint64_t pstride = umbp_pin_stride(h->slot_count);
  struct umbp_bucket *buckets = umbp_pool_region(p, UMBP_REG_BUCKETS);
  struct umbp_index_hdr *ih = umbp_pool_region(p, UMBP_REG_INDEXHDR);
  struct umbp_reader_shm *lines = umbp_pool_region(p, UMBP_REG_READERS);
  struct umbp_ns_shm *nss = umbp_pool_region(p, UMBP_REG_NAMESPACES);
  /* 1. namespace-count changes its threads were making: finished or dropped
   * (namespaces.c), before this reaper changes counts as the dead's thread 0 */
  umbp_ix_ns_count_records_reap(lines, nss, meta, h->slot_count, slot);
  atomic_store_explicit(&ps->thread_bits, 0, memory_order_release);
  /* 2. half-finished ring operations. Ledger slot 0 is the reaper's. */
  struct reap_ctx c = {.p = p, .dead = dead, .ledger_tid = 0};
  uint32_t ledger[UMBP_MAX_THREADS];
  for (unsigned t = 0; t < UMBP_MAX_THREADS; t++)
    ledger[t] = atomic_load_explicit(&ps->inflight_slot[t], memory_order_acquire);
  struct umbp_ring_geo g;
  for (unsigned i = 0; i < h->n_partitions; i++)
    if (!umbp_ix_ring_geo(p, (int)i, &g)) umbp_ring_repair_g(part_ring(p, i), &g, dead, reap_ring_item, &c);
  if (!umbp_ix_ring_geo(p, -1, &g)) umbp_ring_repair_g(umbp_pool_region(p, UMBP_REG_EVENTS), &g, dead, NULL, NULL);
  /* A process that died (not our own detach: only a detach reaps its own
   * slot) may have died in a scan or a tidy pass, whose stale entries nobody
   * else would mark: every ring gets a tidy pass (reserve.c). */
  if ((int)slot != p->proc_slot)
    for (unsigned i = 0; i < h->n_partitions && i < UMBP_MAX_PARTITIONS; i++) umbp_ix_mark_untidy(ih, i);
  /* 3. slots a thread was freeing: back on the queue unless they made it
   * there. Only enqueued, never freed again: a slot FREE when read here may
   * be reserved and published by another process before the ring search
   * ends (a dequeue during the search hides it), and a free of it would turn
   * that process's block FREE with its way still linked. A stale entry is
   * what a reserve drops. */
  for (unsigned t = 0; t < UMBP_MAX_THREADS; t++) {
    uint32_t s = ledger[t];
    if (s >= h->slot_count) continue;
    uint64_t w = atomic_load_explicit(&meta[s].state, memory_order_acquire);
    int part = slot_part(p, s);
    union ring_elem v = {.v = s};
    if (part >= 0 && ST_STATE(w) == UMBP_SLOT_FREE) {
      UMBP_STOP_POINT(UMBP_STOP_REAP_LEDGER);
      if (!umbp_ix_ring_geo(p, part, &g) && !umbp_ring_contains(part_ring(p, (unsigned)part), &g, &v))
        umbp_ix_requeue_slot(p, ps, 0, s, dead);
    }
    atomic_store_explicit(&ps->inflight_slot[t], UINT32_MAX, memory_order_relaxed);
  }
  /* 5. pins held by the dead process (before step 6 weighs other pins) */
  umbp_ix_pins_drop_proc(pins, pstride, ih, h->slot_count, slot);
  /* 6. reservations and half-done removals of the dead process */
  for (uint32_t s = 0; s < h->slot_count; s++) {
    uint64_t w = atomic_load_explicit(&meta[s].state, memory_order_acquire);
    if (ST_OWNER(w) != dead) continue;
    unsigned st = ST_STATE(w);
    if (st == UMBP_SLOT_EVICTING && !umbp_ix_pins_clear(pins, pstride, ih, s)) {
      /* A removal that died before its pin check, or after it with a pinner
       * now backing off (pin_slot() sees EVICTING and undoes its pin). While
       * the way is linked the remover had not decided: it would have put a
       * pinned block back, so do that (its hint too, in case the remover had
       * cleared it). A pinned block is never evicted, even by a reaper. */
      struct umbp_key_shm k = meta[s].key;
      uint64_t kh = umbp_key_hash(&k);
      if (umbp_ix_relink_hint(buckets, h->n_buckets, s, kh)) {
        atomic_store_explicit(&meta[s].state, ST_NEXT(w, UMBP_SLOT_PUBLISHED, 0), memory_order_seq_cst);
        continue;
      }
    }
    if (st == UMBP_SLOT_RESERVED || st == UMBP_SLOT_EVICTING) {
      /* it may be in the index (died inside publish or remove): unlink, count
       * out, free */
      struct umbp_key_shm k = meta[s].key;
      umbp_ix_unlink_way(buckets, h->n_buckets, s, umbp_key_hash(&k));
      umbp_ix_ns_count_set(lines, &lines[(size_t)slot * UMBP_MAX_THREADS], slot * UMBP_MAX_THREADS + 1, nss, meta,
                           h->slot_count, k.ns, s, 0);
      /* an EVICTING slot was published: its removal is announced, as the dead
       * remover would have (see umbp_ix_try_remove()); the event ring was
       * repaired in step 2 */
      if (st == UMBP_SLOT_EVICTING && p->index) umbp_ix_emit(p->index, UMBP_EV_REMOVED, &k);
      umbp_ix_free_slot(p, ps, 0, s, dead);
    }
  }
  /* 7. locks it held */
  uint32_t cur = dead;
  atomic_compare_exchange_strong(&ih->ns_lock, &cur, 0);
  cur = dead;
  atomic_compare_exchange_strong(&ih->evict_lock, &cur, 0);
  /* 8. counters: left in its row. Moving them into the reaped row took two
   * steps per counter (take from this row, add to that one), and a reader
   * summing the rows between the two counted them twice or not at all: the
   * sum went down at its next read (a counter reset to Prometheus). Rows
   * only ever grow, so a sum read twice never goes down; the next process
   * in this registry slot adds to the same row. */
}
