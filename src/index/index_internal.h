/* SPDX-License-Identifier: Apache-2.0 */
/* Per-process state of the block index and its hot-path helpers (internal). */
#ifndef UMBP_INDEX_INTERNAL_H
#define UMBP_INDEX_INTERNAL_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "common/common.h"
#include "index/index_shm.h"
#include "shm/pool_internal.h"
#include "umbp/index.h"

#define UMBP_MAX_PROBE 16 /* buckets a key may live from its home */

/* Slot state word: state | owner << 8 | gen << 24 */
#define ST_STATE(w) ((unsigned)((w) & 0xff))
#define ST_OWNER(w) ((uint16_t)(((w) >> 8) & 0xffff))
#define ST_GEN(w) ((w) >> 24)
#define ST_MAKE(state, owner, gen) ((uint64_t)(state) | ((uint64_t)(owner) << 8) | ((uint64_t)(gen) << 24))
#define ST_NEXT(w, state, owner) ST_MAKE(state, owner, ST_GEN(w) + 1)

struct umbp_index {
  umbp_pool *p;
  uint64_t instance; /* unique per process, for thread-local caches */
  struct umbp_index_hdr *ih;
  struct umbp_bucket *buckets;
  uint32_t bmask;
  struct umbp_slot_meta *meta;
  struct umbp_pin_row *pins;
  struct umbp_reader_shm *readers; /* this process's row of UMBP_MAX_THREADS */
  struct umbp_ns_shm *ns;
  struct umbp_counter_row *ctr;    /* this process's row */
  void *events;
  void *rings[UMBP_MAX_PARTITIONS];
  uint32_t slot_count;
  uint64_t slot_size;
  char *arena_base; /* unused: slots are addressed through partitions */
  bool memb;        /* readers rely on the writers' membarrier */
  _Atomic bool ev_stored;
  pthread_mutex_t limbo_mu;
  uint32_t *limbo;
  size_t nlimbo, limbo_cap;
  /* evictor thread */
  pthread_t ev_thread;
  bool ev_running;
  _Atomic bool ev_stop;
  unsigned ev_low, ev_high, ev_period_ms;
};

/* 64-bit key hash (not cryptographic: the block hash is already one). */
/* Three independent multiplies fold the six key words (so they run in
 * parallel), then one more mixes the halves: low bits pick the bucket, high
 * bits are the signature. Sequential block ids (a trace's 8-byte hashes) still
 * spread, because each word's product is rotated into the other half before
 * the last multiply. Part of the segment ABI: every process must hash alike. */
static inline uint64_t umbp_rotl64(uint64_t x, unsigned r) { return (x << r) | (x >> (64 - r)); }
static inline uint64_t umbp_key_hash(const struct umbp_key_shm *k) {
  uint64_t w[6];
  memcpy(w, k, sizeof w);
  uint64_t a = (w[0] ^ 0x9e3779b97f4a7c15ull) * (w[3] | 1) + w[3];
  uint64_t b = (w[1] ^ 0xbf58476d1ce4e5b9ull) * (w[4] | 1) + w[4];
  uint64_t c = (w[2] ^ 0x94d049bb133111ebull) * 0xd6e8feb86659fd93ull + w[5] * 0x9fb21c651e98df25ull;
  uint64_t h = (a ^ umbp_rotl64(b, 21) ^ umbp_rotl64(c, 43)) * 0xff51afd7ed558ccdull;
  return h ^ (h >> 29) ^ (h >> 47);
}

#endif
