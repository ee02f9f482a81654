/* SPDX-License-Identifier: Apache-2.0 */
/*
 * evict.c — taking published blocks out of the index: umbp_remove(),
 * umbp_clear_ns(), CLOCK eviction (umbp_evict()) and the background evictor
 * thread.
 *
 * Design note.
 *
 * Eviction is CLOCK (second chance): a hit sets the slot's reference bit (only
 * if not set, so a hot block does not bounce its line); the hand clears set
 * bits and evicts the first unpinned PUBLISHED slot with a clear bit. A
 * namespace over its quota evicts its own blocks first. Each eviction emits a
 * removed event into the event ring, once a process has drained it
 * (events.c); a full ring drops its oldest event and counts the drop.
 *
 * A removal moves the slot PUBLISHED -> EVICTING under its own id, checks the
 * pins (pins.c), unlinks the way (table.c), takes the slot out of its
 * namespace's count (namespaces.c), emits the removed event (events.c) and
 * puts the slot back on its free ring at once: no grace period, since
 * lookups validate what they read (way_check(), index_inline.h). A slot that
 * umbp_remove() took out may instead stay with the removing thread for its
 * next reserve (reserve.c, "The thread's slot cache"). The evictor
 * thread keeps each partition's free slots between the low and high
 * watermarks.
 */
#include "index/index_inline.h"

#include <time.h>

/* Try to take published slot s (state st) out of the index and free it. 0,
 * -EBUSY (pinned or changed meanwhile). why: the counter to count it under
 * (UMBP_CTR_EVICTIONS, _REMOVES, _DUPLICATES). emit: announce the removal
 * (not for a duplicate copy, whose key stays published). hash: the key's hash
 * when the caller has it (it found s under state st, whose key it hashed),
 * NULL to hash the key here. keep: the slot may stay with thread t for its
 * next reserve (umbp_remove(); reserve.c, "The thread's slot cache") rather
 * than go back on its free ring. */
int umbp_ix_try_remove(umbp_pool *p, struct tl_slot *t, uint32_t s, uint64_t st, int why, bool emit,
                       const uint64_t *hash, bool keep) {
  struct umbp_index *ix = p->index;
  struct umbp_slot_meta *m = &ix->meta[s];
  uint64_t ev = ST_NEXT(st, UMBP_SLOT_EVICTING, p->owner_id);
  if (!atomic_compare_exchange_strong_explicit(&m->state, &st, ev, memory_order_seq_cst, memory_order_relaxed))
    return -EBUSY;
  /* Dekker with pin_slot(): state store above, pin loads below (seq_cst) */
  if (!umbp_ix_pins_clear(ix->pins, ix->pin_stride, ix->ih, s)) {
    atomic_store_explicit(&m->state, ST_NEXT(ev, UMBP_SLOT_PUBLISHED, 0), memory_order_seq_cst);
    return -EBUSY;
  }
  struct umbp_key_shm k = m->key; /* ours while EVICTING: no one rewrites it */
  umbp_ix_unlink_way(ix->buckets, ix->nb, s, hash ? *hash : umbp_key_hash(&k));
  UMBP_STOP_POINT(UMBP_STOP_REMOVE_UNLINKED);
  /* out of the namespace count (only this process moves an EVICTING slot of its own) */
  ns_count_set(ix, t, k.ns, s, 0);
  /* the removed event while still EVICTING: a reaper of ours emits it for an
   * EVICTING slot, so a kill anywhere in here loses no event (one before the
   * free below gets it twice) */
  if (emit && umbp_ix_removed_wanted(ix)) umbp_ix_emit(ix, UMBP_EV_REMOVED, &k);
  count_ns(ix, t, k.ns, why, 1);
  count_part(ix, t, slot_part(p, s), why, 1);
  if (keep) umbp_ix_fc_keep_or_free(p, t, s, ev);
  else umbp_ix_free_slot(p, &p->procs[p->proc_slot], t->tid, s, p->owner_id);
  return 0;
}

UMBP_API int umbp_remove(umbp_pool *p, const umbp_key *key) {
  struct umbp_index *ix;
  struct tl_slot *t;
  struct umbp_key_shm k;
  int rc = ix_get(p, &ix, &t);
  if (rc) return rc;
  uint64_t h, st = 0;
  if ((rc = key_load(key, &k, &h))) return rc;
  uint32_t s = probe(ix, &k, h, &st);
  if (s == UMBP_NO_SLOT) return umbp_fail(-ENOENT, "umbp_remove: no block has this key in namespace %u", k.ns);
  rc = umbp_ix_try_remove(p, t, s, st, UMBP_CTR_REMOVES, true, &h, true);
  if (rc == -EBUSY) return umbp_fail(-EBUSY, "the block is pinned by a reader: retry after it is unpinned");
  return rc;
}

UMBP_API int umbp_clear_ns(umbp_pool *p, uint32_t ns) {
  struct umbp_index *ix;
  struct tl_slot *t;
  int rc = ix_get(p, &ix, &t);
  if (rc) return rc;
  int n = 0;
  for (uint32_t s = 0; s < ix->slot_count; s++) {
    uint64_t st = atomic_load_explicit(&ix->meta[s].state, memory_order_acquire);
    if (ST_STATE(st) != UMBP_SLOT_PUBLISHED || ix->meta[s].key.ns != ns) continue;
    if (umbp_ix_try_remove(p, t, s, st, UMBP_CTR_REMOVES, true, NULL, false) == 0) n++;
  }
  return n;
}

/* CLOCK over one partition; ns_filter UINT32_MAX: any namespace. */
int umbp_ix_evict_part(umbp_pool *p, struct tl_slot *t, unsigned part, unsigned want, uint32_t ns_filter) {
  struct umbp_index *ix = p->index;
  const struct umbp_partition_desc *d = &ix->parts[part];
  unsigned done = 0;
  uint64_t budget = 2ull * d->slot_count + 8;
  for (uint64_t i = 0; i < budget && done < want; i++) {
    uint32_t hand = atomic_fetch_add_explicit(&ix->ih->clock_hand[part], 1, memory_order_relaxed);
    uint32_t s = d->first_slot + hand % d->slot_count;
    struct umbp_slot_meta *m = &ix->meta[s];
    uint64_t st = atomic_load_explicit(&m->state, memory_order_acquire);
    if (ST_STATE(st) != UMBP_SLOT_PUBLISHED) continue;
    if (ns_filter != UINT32_MAX && m->key.ns != ns_filter) continue;
    if (atomic_load_explicit(&m->ref, memory_order_relaxed)) {
      atomic_store_explicit(&m->ref, 0, memory_order_relaxed);
      continue;
    }
    if (umbp_ix_try_remove(p, t, s, st, UMBP_CTR_EVICTIONS, true, NULL, false) == 0) done++;
  }
  return (int)done;
}

UMBP_API int umbp_evict(umbp_pool *p, int part, unsigned want) {
  struct umbp_index *ix;
  struct tl_slot *t;
  int rc = ix_get(p, &ix, &t);
  if (rc) return rc;
  if (part >= (int)ix->n_parts || part < -1)
    return umbp_fail(-EINVAL, "partition %d does not exist (the pool has %u; -1: all)", part, ix->n_parts);
  int n = 0;
  /* namespaces over quota give up their own blocks first */
  for (uint32_t ns = 0; ns < UMBP_MAX_NAMESPACES && (unsigned)n < want; ns++) {
    if (!umbp_ix_ns_over_quota(ix, ns)) continue;
    for (unsigned q = 0; q < ix->n_parts && (unsigned)n < want; q++)
      if (part < 0 || (int)q == part) n += umbp_ix_evict_part(p, t, q, want - (unsigned)n, ns);
  }
  for (unsigned q = 0; q < ix->n_parts && (unsigned)n < want; q++)
    if (part < 0 || (int)q == part) n += umbp_ix_evict_part(p, t, q, want - (unsigned)n, UINT32_MAX);
  return n;
}

/* ---- background evictor -------------------------------------------------------- */
static void *evictor_main(void *arg) {
  umbp_pool *p = arg;
  struct umbp_index *ix = p->index;
  while (!atomic_load_explicit(&ix->ev_stop, memory_order_acquire)) {
    umbp_pool_heartbeat(p);
    umbp_ix_tidy(p); /* the free figures below are the rings' entry counts */
    for (unsigned i = 0; i < ix->n_parts; i++) {
      uint64_t total = ix->parts[i].slot_count;
      uint64_t low = total * ix->ev_low / 100, high = total * ix->ev_high / 100;
      uint64_t free_n = umbp_ring_count_g(ix->rings[i], &ix->ring_geo[i]);
      if (free_n < low) umbp_evict(p, (int)i, (unsigned)(high - free_n));
    }
    struct timespec ts = {ix->ev_period_ms / 1000, (long)(ix->ev_period_ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
  }
  umbp_counters_flush(p);
  return NULL;
}

UMBP_API int umbp_evictor_start(umbp_pool *p, unsigned low_pct, unsigned high_pct, unsigned period_ms) {
  if (p && p->forked) return umbp_pool_forked_fail(p); /* a fork() child's copy of the handle */
  if (!p || !p->index) return umbp_ix_fail(p);      /* -EINVAL (NULL) or -EROFS (read-only) */
  struct umbp_index *ix = p->index;
  if (ix->ev_running) return umbp_fail(-EBUSY, "this process already runs an evictor on pool '%s'", p->name);
  if (!low_pct) low_pct = 5;
  if (!high_pct) high_pct = 10;
  if (low_pct >= high_pct || high_pct > 100)
    return umbp_fail(-EINVAL, "watermarks %u%% / %u%% are invalid: need low < high <= 100", low_pct, high_pct);
  ix->ev_low = low_pct;
  ix->ev_high = high_pct;
  ix->ev_period_ms = period_ms ? period_ms : 10;
  atomic_store(&ix->ev_stop, false);
  int rc = pthread_create(&ix->ev_thread, NULL, evictor_main, p);
  if (rc) return umbp_fail(-rc, "cannot start the evictor thread: %s", strerror(rc));
  ix->ev_running = true;
  return 0;
}

UMBP_API void umbp_evictor_stop(umbp_pool *p) {
  if (!p || !p->index || !p->index->ev_running) return;
  atomic_store_explicit(&p->index->ev_stop, true, memory_order_release);
  pthread_join(p->index->ev_thread, NULL);
  p->index->ev_running = false;
}
