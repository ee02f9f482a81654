/* SPDX-License-Identifier: Apache-2.0 */
/*
 * counters.c — hit, miss, insert, eviction and pin counters per namespace and
 * per partition, and the pool's statistics: counter sums, the slot census and
 * the table's occupancy. Counting on the lookup path (count_ns(),
 * count_part(), count_single()) is static inline in index_inline.h.
 *
 * Design note.
 *
 * Counters are kept per thread in process memory and added every 64
 * operations into the process's own row in the segment (lookups must not
 * write shared lines). A row outlives its process: a detach or a reap leaves
 * it as it is and the registry slot's next process adds to it, so every row
 * only grows and a sum of the rows never goes down between two reads (the
 * Prometheus counters). The "reaped" row holds what earlier builds folded
 * into it at reap; it is still summed.
 */
#include "index/index_inline.h"

/* Add thread slot t's pending counts (and those on its reader line,
 * count_single()) into the process's row, and zero them. */
void umbp_ix_flush_slot(struct umbp_index *ix, struct tl_slot *t) {
  struct umbp_reader_shm *r = ix->readers ? &ix->readers[t->tid] : NULL;
  if (r && (r->pend_lookups || r->pend_pins)) {
    /* only ever added to while t->ctr_ns is a namespace, and pins while
     * t->ctr_part is a partition (count_single) */
    uint64_t lookups = (uint32_t)r->pend_lookups, hits = r->pend_lookups >> 32;
    t->pend_ns[UMBP_CTR_HITS] += hits;
    t->pend_ns[UMBP_CTR_MISSES] += lookups - hits;
    t->pend_ns[UMBP_CTR_PINS] += r->pend_pins;
    t->pend_part[UMBP_CTR_HITS] += r->pend_pins;
    r->pend_lookups = r->pend_pins = 0;
  }
  if (t->ctr_ns < UMBP_MAX_NAMESPACES)
    for (int c = 0; c < UMBP_CTR_COUNT; c++)
      if (t->pend_ns[c]) {
        atomic_fetch_add_explicit(&ix->ctr->ns[t->ctr_ns][c], t->pend_ns[c], memory_order_relaxed);
        t->pend_ns[c] = 0;
      }
  if (t->ctr_part >= 0)
    for (int c = 0; c < UMBP_CTR_COUNT; c++)
      if (t->pend_part[c]) {
        atomic_fetch_add_explicit(&ix->ctr->part[t->ctr_part][c], t->pend_part[c], memory_order_relaxed);
        t->pend_part[c] = 0;
      }
  t->pend_ops = 0;
}

/* count_ns()'s slow path: the thread counts for another namespace now. */
__attribute__((noinline)) void umbp_ix_count_ns_switch(struct umbp_index *ix, struct tl_slot *t, uint32_t ns, int c,
                                                       uint64_t n) {
  if (ns >= UMBP_MAX_NAMESPACES || !ix->ctr) return;
  umbp_ix_flush_slot(ix, t);
  t->ctr_ns = ns;
  t->pend_ns[c] += n;
  if (++t->pend_ops >= 64) umbp_ix_flush_slot(ix, t);
}

UMBP_API void umbp_counters_flush(umbp_pool *p) {
  if (!p || !p->index) return;
  struct tl_slot *t = umbp_ix_thread_slot_find(p->index);
  if (t) umbp_ix_flush_slot(p->index, t);
}

/* ---- statistics --------------------------------------------------------------- */
static void sum_row(const struct umbp_counter_row *rows, bool part, unsigned id, umbp_counters *out) {
  uint64_t v[UMBP_CTR_COUNT] = {0};
  for (unsigned r = 0; r <= UMBP_MAX_PROCS; r++)
    for (unsigned k = 0; k < UMBP_CTR_COUNT; k++)
      v[k] += atomic_load_explicit(part ? &rows[r].part[id][k] : &rows[r].ns[id][k], memory_order_relaxed);
  out->lookups += v[UMBP_CTR_HITS] + v[UMBP_CTR_MISSES]; /* every lookup is one of the two */
  out->hits += v[UMBP_CTR_HITS];
  out->misses += v[UMBP_CTR_MISSES];
  out->inserts += v[UMBP_CTR_INSERTS];
  out->duplicates += v[UMBP_CTR_DUPLICATES];
  out->evictions += v[UMBP_CTR_EVICTIONS];
  out->removes += v[UMBP_CTR_REMOVES];
  out->pins += v[UMBP_CTR_PINS];
}

UMBP_API int umbp_counters_ns(umbp_pool *p, uint32_t ns, umbp_counters *ret) {
  if (!p || !ret) return umbp_fail(-EINVAL, "umbp_counters_ns: pool and ret are required");
  if (ns != UINT32_MAX && ns >= UMBP_MAX_NAMESPACES)
    return umbp_fail(-EINVAL, "namespace id %u is out of range (UINT32_MAX: all)", ns);
  umbp_counters_flush(p);
  umbp_counters c;
  memset(&c, 0, sizeof c);
  const struct umbp_counter_row *rows = umbp_pool_region(p, UMBP_REG_COUNTERS);
  if (ns == UINT32_MAX)
    for (unsigned n = 0; n < UMBP_MAX_NAMESPACES; n++) sum_row(rows, false, n, &c);
  else
    sum_row(rows, false, ns, &c);
  *ret = c;
  return 0;
}

UMBP_API int umbp_counters_part(umbp_pool *p, unsigned part, umbp_counters *ret) {
  if (!p || !ret) return umbp_fail(-EINVAL, "umbp_counters_part: pool and ret are required");
  if (part >= p->hdr->n_partitions)
    return umbp_fail(-EINVAL, "partition %u does not exist (the pool has %u)", part, p->hdr->n_partitions);
  umbp_counters_flush(p);
  umbp_counters c;
  memset(&c, 0, sizeof c);
  sum_row(umbp_pool_region(p, UMBP_REG_COUNTERS), true, part, &c);
  *ret = c;
  return 0;
}

/* States of slots [first, first + n) and the free-ring entries of partitions
 * [p0, p1): loads only, so a read-only handle may call it. */
static void census_range(umbp_pool *p, uint32_t first, uint32_t n, unsigned p0, unsigned p1, umbp_slot_census *c) {
  memset(c, 0, sizeof *c);
  const struct umbp_slot_meta *meta = umbp_pool_region(p, UMBP_REG_SLOTMETA);
  _Atomic uint8_t *pins = umbp_pool_region(p, UMBP_REG_PINS);
  struct umbp_index_hdr *ih = umbp_pool_region(p, UMBP_REG_INDEXHDR);
  uint64_t pstride = umbp_pin_stride(p->hdr->slot_count);
  c->total = n;
  for (uint32_t s = first; s < first + n; s++) {
    uint64_t w = atomic_load_explicit(&meta[s].state, memory_order_acquire);
    switch (ST_STATE(w)) {
    case UMBP_SLOT_FREE: c->free_++; break;
    case UMBP_SLOT_RESERVED: c->reserved++; break;
    case UMBP_SLOT_PUBLISHED:
      c->published++;
      if (!umbp_ix_pins_clear(pins, pstride, ih, s)) c->pinned++;
      break;
    case UMBP_SLOT_EVICTING: c->evicting++; break;
    case UMBP_SLOT_RETIRED: c->retired++; break;
    default: break;
    }
  }
  for (unsigned i = p0; i < p1; i++) {
    struct umbp_ring_geo g;
    if (umbp_ix_ring_geo(p, (int)i, &g) == 0) c->in_rings += umbp_ring_count_live(part_ring(p, i), &g);
  }
}

UMBP_API int umbp_census(umbp_pool *p, umbp_slot_census *ret) {
  if (!p || !ret) return umbp_fail(-EINVAL, "umbp_census: pool and ret are required");
  umbp_slot_census c;
  census_range(p, 0, p->hdr->slot_count, 0, p->hdr->n_partitions, &c);
  *ret = c;
  return 0;
}

UMBP_API int umbp_census_part(umbp_pool *p, unsigned part, umbp_slot_census *ret) {
  if (!p || !ret) return umbp_fail(-EINVAL, "umbp_census_part: pool and ret are required");
  if (part >= p->hdr->n_partitions)
    return umbp_fail(-EINVAL, "partition %u does not exist (the pool has %u)", part, p->hdr->n_partitions);
  const struct umbp_partition_desc *d = &p->hdr->partitions[part];
  if (d->first_slot > p->hdr->slot_count || d->slot_count > p->hdr->slot_count - d->first_slot)
    return umbp_fail(-EBADMSG, "pool '%s': partition %u's slot range lies outside the slots (header corrupted): "
                               "recreate the pool",
                     p->name, part);
  umbp_slot_census c;
  census_range(p, d->first_slot, d->slot_count, part, part + 1, &c);
  *ret = c;
  return 0;
}

UMBP_API int umbp_index_stats(umbp_pool *p, uint64_t *ret_entries, uint64_t *hist, unsigned nhist) {
  if (!p || !ret_entries) return umbp_fail(-EINVAL, "umbp_index_stats: pool and ret_entries are required");
  const struct umbp_bucket *b = umbp_pool_region(p, UMBP_REG_BUCKETS);
  const struct umbp_slot_meta *meta = umbp_pool_region(p, UMBP_REG_SLOTMETA);
  uint32_t nb = p->hdr->n_buckets;
  uint64_t n = 0;
  if (hist) memset(hist, 0, nhist * sizeof *hist);
  for (uint32_t i = 0; i < nb; i++)
    for (unsigned w = 0; w < UMBP_BUCKET_WAYS; w++) {
      uint32_t v = atomic_load_explicit(&b[i].slot[w], memory_order_acquire);
      if (!v) continue;
      n++;
      uint32_t s = UMBP_WAY_SLOT(v) - 1;
      if (!hist || !nhist || s >= p->hdr->slot_count) continue; /* nhist 0: nowhere to count (d = nhist - 1) */
      struct umbp_key_shm k = meta[s].key;
      uint32_t home = umbp_bucket_home(umbp_key_hash(&k), nb);
      unsigned d = umbp_bucket_dist(home, i, nb);
      if (d >= nhist) d = nhist - 1;
      hist[d]++;
    }
  *ret_entries = n;
  return 0;
}
