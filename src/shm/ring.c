/* SPDX-License-Identifier: Apache-2.0 */
/*
 * ring.c - the non-hot parts of the shared-memory MPMC ring: sizing, init,
 * header validation, overwrite enqueue, statistics and dead-owner repair.
 * The design note (cell states, who repairs a half-finished operation, the
 * ordering pairs [R1]..[A3]) is at the top of ring.h.
 *
 * ring.h needs only libc (tests and tools include it alone); this file also
 * uses src/common (umbp_cpu_relax, umbp_fnv1a).
 */
#include "shm/ring.h"

#include <stdbool.h>
#include <stddef.h>

#include "common/common.h"

/* Bytes [8, 56) of the header as plain integers: what check_header copies out
 * of the shared mapping once and validates. */
struct ring_fields {
  uint16_t layout_major;
  uint16_t layout_minor;
  uint32_t hdr_bytes;
  uint32_t capacity;
  uint32_t mask;
  uint32_t elem_size;
  uint32_t cell_size;
  uint64_t total_bytes;
  uint64_t abi;
  uint64_t checksum;
};
_Static_assert(sizeof(struct ring_fields) == 48, "geometry mirrors header bytes [8, 56)");
_Static_assert(offsetof(struct ring_fields, capacity) + 8 == offsetof(struct umbp_ring_hdr, capacity),
               "geometry mirror layout");
_Static_assert(offsetof(struct ring_fields, checksum) + 8 == offsetof(struct umbp_ring_hdr, checksum),
               "geometry mirror layout");

/* ABI fingerprint: what two builds must agree on to share a ring. */
#define UMBP_RING_ABI                                                                                  \
  ((uint64_t)sizeof(struct umbp_ring_hdr) | (uint64_t)sizeof(struct umbp_ring_cell) << 16 |            \
   (uint64_t)UMBP_RING_LINE << 24 | (uint64_t)UMBP_RING_SEQ_BITS << 32 |                               \
   (uint64_t)_Alignof(_Atomic uint64_t) << 40 | (uint64_t)UMBP_RING_LAYOUT_MAJOR << 48)

/* FNV-1a 64 over the geometry fields (not the checksum itself). */
static uint64_t ring_checksum(const struct ring_fields *g) {
  return umbp_fnv1a(g, offsetof(struct ring_fields, checksum), 0);
}

static bool ring_params_ok(uint32_t capacity, uint32_t elem_size) {
  if (capacity < 2 || capacity > UMBP_RING_MAX_CAPACITY || (capacity & (capacity - 1)) != 0) return false;
  if (elem_size == 0 || elem_size > UMBP_RING_MAX_ELEM || elem_size % 8 != 0) return false;
  return true;
}

size_t umbp_ring_bytes(uint32_t capacity, uint32_t elem_size) {
  if (!ring_params_ok(capacity, elem_size)) return 0;
  uint64_t cells = (uint64_t)capacity * (sizeof(struct umbp_ring_cell) + elem_size);
  uint64_t total = UMBP_RING_HDR_BYTES + cells;
  total = (total + UMBP_RING_LINE - 1) & ~(uint64_t)(UMBP_RING_LINE - 1);
  return (size_t)total;
}

int umbp_ring_init_at(void *mem, size_t mem_bytes, uint32_t capacity, uint32_t elem_size,
                      uint64_t start_pos) {
  if (!mem || ((uintptr_t)mem % UMBP_RING_LINE) != 0) return -EINVAL;
  size_t need = umbp_ring_bytes(capacity, elem_size);
  if (need == 0 || mem_bytes < need) return -EINVAL;

  struct umbp_ring_hdr *h = (struct umbp_ring_hdr *)mem;
  /* Nobody else may use the ring yet (contract), so plain stores are fine
   * for everything but the atomics, which get relaxed stores; the magic's
   * release below publishes them all. */
  memset(mem, 0, need);
  struct ring_fields g = {
      .layout_major = UMBP_RING_LAYOUT_MAJOR,
      .layout_minor = UMBP_RING_LAYOUT_MINOR,
      .hdr_bytes = UMBP_RING_HDR_BYTES,
      .capacity = capacity,
      .mask = capacity - 1,
      .elem_size = elem_size,
      .cell_size = (uint32_t)sizeof(struct umbp_ring_cell) + elem_size,
      .total_bytes = need,
      .abi = UMBP_RING_ABI,
  };
  g.checksum = ring_checksum(&g);
  memcpy((unsigned char *)mem + 8, &g, sizeof g);
  const struct umbp_ring_geo geo = {g.capacity, g.mask, g.elem_size, g.cell_size};

  atomic_store_explicit(&h->enq_pos, start_pos, memory_order_relaxed);
  atomic_store_explicit(&h->deq_pos, start_pos, memory_order_relaxed);
  atomic_store_explicit(&h->dropped, 0, memory_order_relaxed);
  for (uint32_t i = 0; i < capacity; i++) {
    /* The first position at or after start_pos that maps to cell i. */
    uint64_t p = start_pos + ((i - start_pos) & g.mask);
    struct umbp_ring_cell *c = umbp_ring__cellg(h, &geo, p);
    atomic_store_explicit(&c->word, umbp_ring__word(p, UMBP_RING_STABLE, 0), memory_order_relaxed);
  }
  /* Release: pairs with the load-acquire of the magic in check_header. */
  atomic_store_explicit(&h->magic, UMBP_RING_MAGIC, memory_order_release);
  return 0;
}

int umbp_ring_init(void *mem, size_t mem_bytes, uint32_t capacity, uint32_t elem_size) {
  return umbp_ring_init_at(mem, mem_bytes, capacity, elem_size, 0);
}

int umbp_ring_check_header(const void *mem, size_t mem_bytes) {
  if (!mem || ((uintptr_t)mem % UMBP_RING_LINE) != 0) return -EINVAL;
  if (mem_bytes < UMBP_RING_HDR_BYTES) return -EBADMSG;
  const struct umbp_ring_hdr *h = (const struct umbp_ring_hdr *)mem;
  /* Acquire: pairs with init's release of the magic. */
  uint64_t magic = atomic_load_explicit((_Atomic uint64_t *)&h->magic, memory_order_acquire);
  if (magic != UMBP_RING_MAGIC) return -EBADMSG;

  struct ring_fields g;
  memcpy(&g, (const unsigned char *)mem + 8, sizeof g); /* one private copy, validated below */
  if (g.layout_major != UMBP_RING_LAYOUT_MAJOR) return -EBADMSG;
  if (g.abi != UMBP_RING_ABI) return -EBADMSG;
  if (g.checksum != ring_checksum(&g)) return -EBADMSG;
  if (g.hdr_bytes != UMBP_RING_HDR_BYTES) return -EBADMSG;
  if (!ring_params_ok(g.capacity, g.elem_size)) return -EBADMSG;
  if (g.mask != g.capacity - 1) return -EBADMSG;
  if (g.cell_size != sizeof(struct umbp_ring_cell) + g.elem_size) return -EBADMSG;
  size_t need = umbp_ring_bytes(g.capacity, g.elem_size);
  if (g.total_bytes != need || need > mem_bytes) return -EBADMSG;
  return 0;
}

int umbp_ring_geo_get(const void *mem, size_t mem_bytes, struct umbp_ring_geo *ret) {
  int rc = umbp_ring_check_header(mem, mem_bytes);
  if (rc) return rc;
  /* the copy validated above may have changed since; take one more private
   * copy and check the fields we keep once more, against each other */
  struct ring_fields f;
  memcpy(&f, (const unsigned char *)mem + 8, sizeof f);
  if (!ring_params_ok(f.capacity, f.elem_size) || f.mask != f.capacity - 1 ||
      f.cell_size != sizeof(struct umbp_ring_cell) + f.elem_size || umbp_ring_bytes(f.capacity, f.elem_size) > mem_bytes)
    return -EBADMSG;
  ret->capacity = f.capacity;
  ret->mask = f.mask;
  ret->elem_size = f.elem_size;
  ret->cell_size = f.cell_size;
  return 0;
}

/* Attempts before enqueue_overwrite gives up and drops the new element: spins
 * for a consumer that is in the middle of reading the one cell the element
 * needs, or for the producer of the previous lap still writing it. */
#define RING_OVERWRITE_SPINS 1024u

unsigned umbp_ring_enqueue_overwrite(void *ring, const void *elem, uint16_t owner) {
  struct umbp_ring_geo g = umbp_ring__geo_shared(ring);
  return umbp_ring_enqueue_overwrite_g(ring, &g, elem, owner);
}

/* A full ring's next cell holds its oldest element (position pos - cap, seq
 * pos - cap + 1). The producer claims that cell for pos in place, by one CAS
 * from STABLE (or SKIP) pos - cap + 1 to WRITING pos, instead of dequeuing
 * the oldest element and then enqueuing: two CASes a call instead of four
 * plus a copy out (the removal path of the index emits one event per block
 * removed, and with nobody draining the ring every emit is an overwrite).
 * deq_pos is left behind (by at most two laps: it is brought up once a lap);
 * the next consumer jumps it forward (umbp_ring__dequeue_pass). */
unsigned umbp_ring_enqueue_overwrite_g(void *ring, const struct umbp_ring_geo *g, const void *elem, uint16_t owner) {
  return umbp_ring_enqueue_overwrite_hint_g(ring, g, elem, owner, NULL);
}

unsigned umbp_ring_enqueue_overwrite_hint_g(void *ring, const struct umbp_ring_geo *g, const void *elem,
                                            uint16_t owner, _Atomic uint64_t *stuck) {
  struct umbp_ring_hdr *h = (struct umbp_ring_hdr *)ring;
  const uint64_t cap = g->capacity;
  for (unsigned tries = 0;; tries++) {
    uint64_t pos = atomic_load_explicit(&h->enq_pos, memory_order_relaxed);
    struct umbp_ring_cell *c = umbp_ring__cellg(h, g, pos);
    uint64_t w = atomic_load_explicit(&c->word, memory_order_relaxed);
    int64_t d = umbp_ring__seqdiff(umbp_ring__wseq(w), pos);
    unsigned kind = umbp_ring__wkind(w);
    bool free_cell = d == 0 && kind == UMBP_RING_STABLE;
    /* the previous lap's element (STABLE) or tombstone (SKIP), not being read */
    bool oldest = d == 1 - (int64_t)cap && (kind == UMBP_RING_STABLE || kind == UMBP_RING_SKIP);
    if (free_cell || oldest) {
      /* [A2] acquire, as enqueue's claim: the previous lap's consumer or
       * producer (or the repair that made the tombstone, [R3]) is done with
       * the payload before we overwrite it. */
      if (!atomic_compare_exchange_strong_explicit(&c->word, &w, umbp_ring__word(pos, UMBP_RING_WRITING, owner),
                                                   memory_order_acquire, memory_order_relaxed))
        continue; /* someone else took the cell: look again */
      /* the claim before the payload stores, for readers that copy a cell
       * without claiming it (umbp_admin_events_peek: load, copy, fence, load) */
      atomic_thread_fence(memory_order_release);
      UMBP_RING__HOOK(UMBP_RING_HOOK_PRODUCER_CLAIMED, ring, pos, owner);
      umbp_ring__advance(&h->enq_pos, pos, pos + 1);
      /* Once a lap, bring deq_pos up to the oldest position left (every
       * position up to pos - cap is done). Consumers compare a cell's seq
       * with their position as a 46-bit difference, so deq_pos must never
       * fall 2^45 positions behind, which a ring that nobody drains would
       * otherwise reach: it stays within two laps of enq_pos. One CAS a
       * lap. */
      if (oldest && (pos & g->mask) == 0)
        umbp_ring__advance(&h->deq_pos, atomic_load_explicit(&h->deq_pos, memory_order_relaxed), pos - cap + 1);
      unsigned dropped = 0;
      if (oldest && kind == UMBP_RING_STABLE) {
        /* Relaxed: a statistic; no data is published through it. */
        atomic_fetch_add_explicit(&h->dropped, 1, memory_order_relaxed);
        dropped = 1;
      }
      umbp_ring__copy(c->payload, elem, g->elem_size);
      /* [R1] publish the payload; pairs with the consumer's claim [A1]. */
      atomic_store_explicit(&c->word, umbp_ring__word(pos + 1, UMBP_RING_STABLE, 0), memory_order_release);
      return dropped;
    }
    if (d >= 0) {
      /* position taken (WRITING) or already completed: help, look again */
      umbp_ring__help(&h->enq_pos, pos);
      continue;
    }
    /* The cell is being read by a consumer (slow, stopped, or dead and not
     * yet repaired) or still written by the previous lap's producer: drop
     * the new element rather than wait without bound. A word this caller
     * has already given up on (*stuck: the same seq, kind and owner, so the
     * same claim, unmoved since) is not spun on again: with a consumer
     * stopped in its claim, every later call spun the full count, about
     * 30 us a removal, 250 times its cost, for as long as it stayed stopped. */
    if (tries >= RING_OVERWRITE_SPINS || (stuck && w == atomic_load_explicit(stuck, memory_order_relaxed))) {
      if (stuck) atomic_store_explicit(stuck, w, memory_order_relaxed);
      atomic_fetch_add_explicit(&h->dropped, 1, memory_order_relaxed);
      return 1;
    }
    umbp_cpu_relax();
  }
}

uint64_t umbp_ring_count(const void *ring) {
  struct umbp_ring_geo g = umbp_ring__geo_shared(ring);
  return umbp_ring_count_g(ring, &g);
}

uint64_t umbp_ring_count_g(const void *ring, const struct umbp_ring_geo *g) {
  struct umbp_ring_hdr *h = (struct umbp_ring_hdr *)ring;
  /* deq first: both only grow, so reading enq later can only overestimate. */
  uint64_t d = atomic_load_explicit(&h->deq_pos, memory_order_relaxed);
  uint64_t e = atomic_load_explicit(&h->enq_pos, memory_order_relaxed);
  int64_t n = (int64_t)(e - d);
  if (n < 0) return 0; /* a repaired producer claim can leave enq_pos behind for a moment */
  if ((uint64_t)n > g->capacity) return g->capacity;
  return (uint64_t)n;
}

uint64_t umbp_ring_dropped(const void *ring) {
  struct umbp_ring_hdr *h = (struct umbp_ring_hdr *)ring;
  return atomic_load_explicit(&h->dropped, memory_order_relaxed);
}

/* Help position *p past the cell whose seq is `seq`, if it still points there. */
static void ring_help_seq(_Atomic uint64_t *p, uint64_t seq) {
  uint64_t cur = atomic_load_explicit(p, memory_order_relaxed);
  if ((cur & UMBP_RING_SEQ_MASK) == (seq & UMBP_RING_SEQ_MASK)) umbp_ring__help(p, cur);
}

unsigned umbp_ring_repair(void *ring, uint16_t dead_owner, void (*cb)(void *arg, const void *elem),
                          void *arg) {
  if (!ring) return 0;
  struct umbp_ring_geo g = umbp_ring__geo_shared(ring);
  return umbp_ring_repair_g(ring, &g, dead_owner, cb, arg);
}

unsigned umbp_ring_repair_g(void *ring, const struct umbp_ring_geo *g, uint16_t dead_owner,
                            void (*cb)(void *arg, const void *elem), void *arg) {
  if (!ring || dead_owner == 0) return 0;
  struct umbp_ring_hdr *h = (struct umbp_ring_hdr *)ring;
  const uint32_t cap = g->capacity, esz = g->elem_size;
  uint64_t copy[UMBP_RING_MAX_ELEM / 8];
  unsigned repaired = 0;

  for (uint32_t i = 0; i < cap; i++) {
    struct umbp_ring_cell *c = umbp_ring__cellg(h, g, i);
    /* [A1r] acquire: for a READING cell this synchronises with the producer's
     * [R1] through the release sequence continued by the consumer's claim. */
    uint64_t w = atomic_load_explicit(&c->word, memory_order_acquire);
    if (umbp_ring__wowner(w) != dead_owner) continue;
    uint64_t seq = umbp_ring__wseq(w);
    switch (umbp_ring__wkind(w)) {
    case UMBP_RING_WRITING:
      /* Claimed at position seq, never published: tombstone at seq + 1.
       * [R3] release, paired with the skip-consume CAS [A3]. */
      if (atomic_compare_exchange_strong_explicit(&c->word, &w, umbp_ring__word(seq + 1, UMBP_RING_SKIP, 0),
                                                  memory_order_release, memory_order_relaxed)) {
        repaired++;
        ring_help_seq(&h->enq_pos, seq);
      }
      break;
    case UMBP_RING_READING:
      /* Claimed for the consumer at seq - 1; copy out, then free it for the
       * next lap (seq - 1 + cap) before the callback, so that the callback
       * can re-enqueue into a ring that this very cell kept full.  If the CAS
       * loses (another reaper won) the copy is discarded unread. */
      umbp_ring__copy(copy, c->payload, esz);
      if (atomic_compare_exchange_strong_explicit(&c->word, &w,
                                                  umbp_ring__word(seq - 1 + cap, UMBP_RING_STABLE, 0),
                                                  memory_order_release, memory_order_relaxed)) {
        /* [R2r] release above pairs with the next producer's [A2]. */
        repaired++;
        ring_help_seq(&h->deq_pos, seq - 1);
        if (cb) cb(arg, copy);
      }
      break;
    default:
      /* STABLE/SKIP never carry an owner; a nonzero one is garbage from a
       * buggy writer and is left alone rather than guessed at. */
      break;
    }
  }
  return repaired;
}
