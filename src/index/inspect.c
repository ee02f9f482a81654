/* SPDX-License-Identifier: Apache-2.0 */
/*
 * inspect.c — the index's part of include/umbp/admin.h (the contracts are
 * there): snapshots of its geometry, pins, event ring, namespaces and free
 * slots, for `umbp inspect`, the daemon's metrics and anyone else
 * who watches a pool.
 *
 * Design note. Every function here reads with loads only and works on a
 * read-only handle (PROT_READ, no registry slot, no index state in this
 * process): nothing is written, not even this thread's line, so a snapshot
 * cannot disturb a writer. What it reads may change under it; each figure is a
 * snapshot of its own. Sizes and positions that index an array are taken from
 * the validated header and the ring's validated geometry, never trusted from
 * a word another process may have written.
 */
#include "index/index_inline.h"

#include "umbp/admin.h"

UMBP_API int umbp_admin_index_info_get(umbp_pool *p, umbp_admin_index_info *ret) {
  if (!p || !ret) return umbp_fail(-EINVAL, "umbp_admin_index_info_get: pool and ret are required");
  umbp_admin_index_info i;
  memset(&i, 0, sizeof i);
  i.n_buckets = p->hdr->n_buckets;
  i.bucket_ways = UMBP_BUCKET_WAYS;
  i.max_probe = UMBP_MAX_PROBE;
  i.event_capacity = p->hdr->event_capacity;
  i.bucket_offset = (uint64_t)((const char *)umbp_pool_region(p, UMBP_REG_BUCKETS) - (const char *)p->base);
  i.bucket_bytes = (uint64_t)i.n_buckets * sizeof(struct umbp_bucket);
  *ret = i;
  return 0;
}

UMBP_API int umbp_admin_free_slots(umbp_pool *p, int part, uint64_t *ret_free) {
  if (!p || !ret_free) return umbp_fail(-EINVAL, "umbp_admin_free_slots: pool and ret_free are required");
  unsigned np = p->hdr->n_partitions;
  if (part < -1 || part >= (int)np)
    return umbp_fail(-EINVAL, "partition %d is out of range: pool '%s' has %u (or -1 for all)", part, p->name, np);
  uint64_t n = 0;
  for (unsigned k = part < 0 ? 0 : (unsigned)part; k < (part < 0 ? np : (unsigned)part + 1); k++)
    n += umbp_index_free_slots(p, k);
  *ret_free = n;
  return 0;
}

UMBP_API int umbp_admin_pins_by_proc(umbp_pool *p, uint64_t *ret, unsigned n) {
  if (!p || (!ret && n)) return umbp_fail(-EINVAL, "umbp_admin_pins_by_proc: pool and ret are required");
  if (n > UMBP_MAX_PROCS) n = UMBP_MAX_PROCS;
  const _Atomic uint8_t *pins = umbp_pool_region(p, UMBP_REG_PINS);
  uint64_t stride = umbp_pin_stride(p->hdr->slot_count);
  for (unsigned q = 0; q < n; q++) {
    const _Atomic uint8_t *row = pins + (uint64_t)q * stride;
    const _Atomic uint64_t *w = (const _Atomic uint64_t *)(const void *)row;
    uint64_t c = 0;
    for (uint64_t k = 0; k < stride / 8; k++) {
      if (!atomic_load_explicit(&w[k], memory_order_relaxed)) continue; /* eight slots unpinned */
      for (unsigned j = 0; j < 8; j++) c += atomic_load_explicit(&row[k * 8 + j], memory_order_relaxed);
    }
    ret[q] = c;
  }
  return (int)n;
}

UMBP_API int umbp_admin_events_peek(umbp_pool *p, unsigned max, umbp_event *out, uint64_t *ret_pos,
                                    umbp_admin_event_ring *ret_ring) {
  if (!p || (!out && max)) return umbp_fail(-EINVAL, "umbp_admin_events_peek: pool, and out for max = %u, are required", max);
  void *ring = umbp_pool_region(p, UMBP_REG_EVENTS);
  struct umbp_ring_geo g;
  if (umbp_ix_ring_geo(p, -1, &g))
    return umbp_fail(-EBADMSG, "pool '%s': the event ring's header is corrupted", p->name);
  struct umbp_ring_hdr *h = ring;
  uint64_t enq = atomic_load_explicit(&h->enq_pos, memory_order_acquire);
  uint64_t deq = atomic_load_explicit(&h->deq_pos, memory_order_acquire);
  if (ret_ring) {
    ret_ring->capacity = g.capacity;
    ret_ring->pending = umbp_ring_count_g(ring, &g);
    ret_ring->dropped = umbp_ring_dropped(ring);
    /* deq counts every position consumers passed: the events they took, and
     * those dropped by overwrite (or repaired to tombstones) that a consumer
     * jumped over. Drops still ahead of deq (positions below enq - cap) were
     * not passed yet. So the events taken are deq less the passed drops.
     * Approximate, a statistic: a tombstone passed counts as taken, a new
     * event dropped when its cell was held counts as passed, and the three
     * words are read at different moments. */
    uint64_t ahead = (int64_t)(enq - deq) > (int64_t)g.capacity ? enq - deq - g.capacity : 0;
    uint64_t passed = ret_ring->dropped > ahead ? ret_ring->dropped - ahead : 0;
    ret_ring->drained = deq > passed ? deq - passed : 0;
    struct umbp_index_hdr *ih = umbp_pool_region(p, UMBP_REG_INDEXHDR);
    ret_ring->recording = atomic_load_explicit(&ih->events_on, memory_order_relaxed) != 0;
  }
  uint64_t first = enq - deq > g.capacity ? enq - g.capacity : deq;
  if (enq - first > max) first = enq - max;
  unsigned n = 0;
  for (uint64_t pos = first; pos != enq && n < max; pos++) {
    struct umbp_ring_cell *c = umbp_ring__cellg(h, &g, pos);
    uint64_t w = atomic_load_explicit(&c->word, memory_order_acquire);
    unsigned kind = umbp_ring__wkind(w);
    if (umbp_ring__seqdiff(umbp_ring__wseq(w), pos + 1) != 0 || (kind != UMBP_RING_STABLE && kind != UMBP_RING_READING))
      continue; /* not (or no longer) this position's event */
    struct umbp_event_shm ev;
    memcpy(&ev, c->payload, sizeof ev);
    /* the payload was read between two equal loads of the word: a seqlock read */
    atomic_thread_fence(memory_order_acquire);
    if (atomic_load_explicit(&c->word, memory_order_relaxed) != w) continue;
    out[n].type = ev.type;
    umbp_ix_key_from_shm(&ev.key, &out[n].key);
    if (ret_pos) ret_pos[n] = pos;
    n++;
  }
  return (int)n;
}

UMBP_API int umbp_admin_ns_list(umbp_pool *p, umbp_ns_info *out, unsigned max) {
  if (!p || (!out && max)) return umbp_fail(-EINVAL, "umbp_admin_ns_list: pool, and out for max = %u, are required", max);
  const struct umbp_ns_shm *nss = umbp_pool_region(p, UMBP_REG_NAMESPACES);
  unsigned n = 0;
  for (uint32_t k = 0; k < UMBP_MAX_NAMESPACES && n < max; k++) {
    /* acquire: pairs with the release store that publishes a registration (namespaces.c) */
    if (atomic_load_explicit(&nss[k].state, memory_order_acquire) != 1) continue;
    if (umbp_ns_info_get(p, k, &out[n]) == 0) n++;
  }
  return (int)n;
}
