/* SPDX-License-Identifier: Apache-2.0 */
/*
 * ring_claim.h — two-phase dequeue and a membership scan over shm/ring.h.
 *
 * The free-slot queues need the consumer to act on an element *while its cell
 * is still claimed*: reserve moves the slot FREE -> RESERVED(owner) between
 * umbp_ring_dequeue_begin() and umbp_ring_dequeue_commit(). A process killed
 * in between leaves a READING cell naming it, which umbp_ring_repair() hands
 * to the reaper; killed after commit, the slot is already RESERVED under its
 * id. Either way the reaper finds the slot (src/index/reap.c, umbp_index_reap_proc()).
 * Every function here takes the caller's private geometry g (ring.h, "Trust").
 */
#ifndef UMBP_SHM_RING_CLAIM_H
#define UMBP_SHM_RING_CLAIM_H

#include <stdbool.h>

#include "shm/ring.h"

struct umbp_ring_claim {
  uint64_t pos;
};

/* Claim the oldest element and copy it to elem; the cell stays READING by
 * owner until umbp_ring_dequeue_commit(). 0 or -EAGAIN (empty). Any thread.
 * Ordering: the claim CAS acquires (pairs with the producer's [R1]). */
static inline int umbp_ring_dequeue_begin(void *ring, const struct umbp_ring_geo *g, void *elem, uint16_t owner,
                                          struct umbp_ring_claim *claim) {
  struct umbp_ring_hdr *h = (struct umbp_ring_hdr *)ring;
  const uint32_t cap = g->capacity;
  for (;;) {
    uint64_t pos = atomic_load_explicit(&h->deq_pos, memory_order_relaxed);
    struct umbp_ring_cell *c = umbp_ring__cellg(h, g, pos);
    uint64_t w = atomic_load_explicit(&c->word, memory_order_relaxed);
    int64_t d = umbp_ring__seqdiff(umbp_ring__wseq(w), pos + 1);
    if (d == 0 && umbp_ring__wkind(w) == UMBP_RING_STABLE) {
      if (atomic_compare_exchange_strong_explicit(&c->word, &w, umbp_ring__word(pos + 1, UMBP_RING_READING, owner),
                                                  memory_order_acquire, memory_order_relaxed)) {
        UMBP_RING__HOOK(UMBP_RING_HOOK_CONSUMER_CLAIMED, ring, pos, owner);
        umbp_ring__advance(&h->deq_pos, pos, pos + 1);
        umbp_ring__copy(elem, c->payload, g->elem_size);
        claim->pos = pos;
        return 0;
      }
      continue;
    }
    if (d == 0 && umbp_ring__wkind(w) == UMBP_RING_SKIP) {
      /* consume a tombstone: acq_rel as in umbp_ring_dequeue_burst ([A3]/[R2s]) */
      if (atomic_compare_exchange_strong_explicit(&c->word, &w, umbp_ring__word(pos + cap, UMBP_RING_STABLE, 0),
                                                  memory_order_acq_rel, memory_order_relaxed))
        umbp_ring__help(&h->deq_pos, pos);
      continue;
    }
    if (d < 0) return -EAGAIN;
    umbp_ring__help(&h->deq_pos, pos);
  }
}

/* Complete a claim from umbp_ring_dequeue_begin(): the cell goes to the next
 * lap. Release: pairs with the next producer's claim [A2]. */
static inline void umbp_ring_dequeue_commit(void *ring, const struct umbp_ring_geo *g, const struct umbp_ring_claim *claim) {
  struct umbp_ring_hdr *h = (struct umbp_ring_hdr *)ring;
  struct umbp_ring_cell *c = umbp_ring__cellg(h, g, claim->pos);
  atomic_store_explicit(&c->word, umbp_ring__word(claim->pos + g->capacity, UMBP_RING_STABLE, 0),
                        memory_order_release);
}

/* 1 if some full cell (waiting, or claimed by a consumer) holds elem, else 0.
 * Walks every cell: for reapers and checkers, not hot paths. A cell that
 * changes during the look is read again. */
static inline int umbp_ring_contains(void *ring, const struct umbp_ring_geo *g, const void *elem) {
  struct umbp_ring_hdr *h = (struct umbp_ring_hdr *)ring;
  unsigned char buf[UMBP_RING_MAX_ELEM];
  for (uint64_t i = 0; i < g->capacity; i++) {
    struct umbp_ring_cell *c = umbp_ring__cellg(h, g, i);
    for (;;) {
      uint64_t w = atomic_load_explicit(&c->word, memory_order_acquire);
      unsigned kind = umbp_ring__wkind(w);
      bool full = ((umbp_ring__wseq(w) - i) & g->mask) == 1 && (kind == UMBP_RING_STABLE || kind == UMBP_RING_READING);
      if (!full) break;
      umbp_ring__copy(buf, c->payload, g->elem_size);
      atomic_thread_fence(memory_order_acquire);
      if (atomic_load_explicit(&c->word, memory_order_relaxed) != w) continue;
      if (!memcmp(buf, elem, g->elem_size)) return 1;
      break;
    }
  }
  return 0;
}

/* Elements on the ring now (full cells, waiting or claimed by a consumer),
 * tombstones not counted, by walking every cell: for censuses and checks,
 * where umbp_ring_count()'s position difference would count tombstones. */
static inline uint64_t umbp_ring_count_live(void *ring, const struct umbp_ring_geo *g) {
  struct umbp_ring_hdr *h = (struct umbp_ring_hdr *)ring;
  uint64_t n = 0;
  for (uint64_t i = 0; i < g->capacity; i++) {
    uint64_t w = atomic_load_explicit(&umbp_ring__cellg(h, g, i)->word, memory_order_relaxed);
    unsigned kind = umbp_ring__wkind(w);
    n += ((umbp_ring__wseq(w) - i) & g->mask) == 1 && (kind == UMBP_RING_STABLE || kind == UMBP_RING_READING);
  }
  return n;
}

#endif
