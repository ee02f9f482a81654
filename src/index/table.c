/* SPDX-License-Identifier: Apache-2.0 */
/*
 * table.c — the bucket table: where a key's entry lives and how lookups find
 * it (umbp_lookup_pin, umbp_contains, umbp_prefix_probe and their bulk forms),
 * and how a way is unlinked or its hint restored. The probe itself and the
 * key helpers, on every lookup's path, are static inline in index_inline.h.
 *
 * Design note.
 *
 * Table. An array of 64-byte buckets, sized at creation so that a full pool
 * fills 66.7% of the ways (n/8 buckets for n slots, any count, not a power of
 * two: a key's home is a multiply-shift of its hash, umbp_bucket_home()). A
 * bucket holds 12 ways. A key's signature is the top 16 bits of its hash,
 * split in two: the low byte (never 0) is the way's hint in an array of
 * twelve bytes that one SSE2 compare tests at once, and the high byte rides
 * in the way's 32-bit slot word (sig_hi << 24 | slot + 1; 0 = empty), which
 * a lookup loads before it follows the way, so a way whose hint matches by
 * chance is passed over without a metadata read unless its high byte
 * matches too; the single-key probe compares the high bytes of all twelve
 * slot words at once as well (bucket_match16()), so that it does not branch
 * on a chance hint match while its bucket line is still in flight. The
 * hints sit beside the overflow word (index_internal.h): how many keys whose
 * home is this bucket live in one of the next UMBP_MAX_PROBE-1 buckets, how
 * far on the furthest of them is (a miss looks no further), and a 16-bit
 * filter of their hashes, by which a miss skips those buckets unless its
 * key's bit is set. A key's full bytes live in
 * its slot's metadata (struct umbp_slot_meta), so there is one entry per
 * slot and the slot id is the entry id (DPDK's rte_hash keeps signatures in
 * buckets and keys in a flat store the same way). For 1M slots the bucket
 * array is 8 MiB, as rte_hash's is for 1M entries. Lines touched: a miss
 * reads its home bucket (one line; more only when its bit is set there); a
 * hit reads the bucket, the slot's metadata line and, to pin, a line of this
 * process's pin array.
 *
 * Readers never wait and write nothing shared. The slot word is the
 * authority, the signature only a hint: a lookup compares hints, then loads
 * the slot word of each matching way with acquire order (pairing with the
 * inserter's acq_rel CAS of that word, so the key bytes it compares and the
 * block bytes it will read are those the publisher wrote) and compares the
 * full key. An inserter CASes the slot word 0 -> sig_hi << 24 | slot+1 and
 * then stores the hint; a remover clears the hint and then CASes the slot word to 0. A
 * reader that sees a stale hint either finds an empty slot word, a slot word
 * whose key differs (a full compare rejects it), or misses a key whose hint
 * is not yet stored, which is a lookup ordered before the publish. The hint
 * and the slot word are never read as one value, so no torn pair can be
 * acted on. The single-key probe's compare of the slot words' high bytes is
 * a filter only: a way it keeps is loaded again with acquire order and
 * checked as above, and a way it drops because the word it read is not the
 * one the hint it saw belongs to is a lookup ordered before that word's
 * publish or after its remove (keys never move between ways, so a key that
 * is present throughout the lookup is never dropped).
 *
 * No grace period. A slot whose block was removed is FREE at once and may be
 * reserved and published again while a lookup that found its way earlier is
 * still reading its metadata. Slot metadata is type-stable (a fixed array),
 * so such a read is never out of bounds, and a lookup accepts a slot only if
 * its state word was the same PUBLISHED word before and after it compared the
 * key (way_check(), index_inline.h): every transition stores a new
 * generation, so an unchanged word means the key read was the key published
 * with it. A pin re-checks the same word after its pin is visible (pin_slot()).
 * A lookup's only stores are its own thread's line (counts) and, to pin, its
 * process's pin byte and the slot's reference bit: a lookup that is stopped
 * anywhere holds back nothing but the pins it holds.
 */
#include "index/index_inline.h"

/* The error of a NULL or invalid key (key_load(), index_inline.h): out of
 * line and cold, so that the inlined key copy stays short. */
__attribute__((noinline, cold)) int umbp_ix_pin_overflow_fail(uint32_t s) {
  return umbp_fail(-EOVERFLOW, "umbp_lookup_pin: this process holds 255 pins on slot %u already: unpin some", s);
}

__attribute__((noinline, cold)) int umbp_ix_key_fail(const umbp_key *k) {
  if (!k) return umbp_fail(-EINVAL, "key is NULL");
  return umbp_fail(-EINVAL, "block hash length %u is invalid: use 1 to %d bytes", k->hash_len, UMBP_KEY_HASH_MAX);
}

/* The buckets after home that keys homed there may live in, for a key with
 * hash h that the home bucket did not hold and whose bit the probe saw set
 * in the home's filter of displaced keys (bucket_match_far()). The reach
 * comes from the home's word read again, with the bit: that word is at least
 * as current as the probe's, and its count, reach and bit cover every key
 * displaced from home for as long as it is (index_internal.h), so a key whose
 * bit has been cleared since (the count fell to 0) ends here. Out of line:
 * the bit sends 0.4% of misses here at load factor 0.9 on a fresh table, 3%
 * after long churn (docs/bench-index.md, "The twelfth session"). */
__attribute__((noinline)) uint32_t umbp_ix_probe_far(struct umbp_index *ix, const struct umbp_key_shm *k,
                                                     uint32_t home, uint16_t sig, uint64_t h, uint64_t *ret_st,
                                                     bool pin) {
  uint32_t v = atomic_load_explicit(&ix->buckets[home].ovf, memory_order_acquire);
  if (!(UMBP_OVF_FILTER(v) >> umbp_ovf_bit_index(h) & 1)) return UMBP_NO_SLOT;
  unsigned reach = UMBP_OVF_REACH(v);
  if (reach >= UMBP_MAX_PROBE) reach = UMBP_MAX_PROBE - 1;
  for (unsigned d = 1; d <= reach; d++) {
    struct umbp_bucket *b = &ix->buckets[umbp_bucket_at(home, d, ix->nb)];
    unsigned o;
    uint32_t s = match_ways(ix, b, bucket_match16(b, sig, h, &o), sig, k, ret_st, pin);
    if (s != UMBP_NO_SLOT) return s;
  }
  return UMBP_NO_SLOT;
}


UMBP_API int umbp_lookup_pin(umbp_pool *p, const umbp_key *key, uint32_t *ret_slot) {
  struct umbp_index *ix;
  struct tl_slot *t;
  struct umbp_key_shm k;
  int rc = ix_get(p, &ix, &t);
  if (rc) return rc;
  uint64_t h, st = 0;
  if ((rc = key_load(key, &k, &h))) return rc;
  if (!ret_slot) return umbp_fail(-EINVAL, "umbp_lookup_pin: ret_slot is NULL");
  struct umbp_reader_shm *r = reader_of(ix, t);
  uint32_t s = probe_x(ix, &k, h, &st, true);
  if (s != UMBP_NO_SLOT) rc = pin_slot(ix, s, st);
  else rc = -ENOENT;
  count_single(ix, t, r, k.ns, rc == 0, true, rc == 0 ? slot_part(p, s) : -1);
  if (rc == 0) *ret_slot = s;
  /* A miss (-ENOENT) sets no message: it is an answer, not a failure, and the
   * formatting would cost more than the probe. */
  if (UMBP_UNLIKELY(rc == -EOVERFLOW)) return umbp_ix_pin_overflow_fail(s);
  return rc;
}

/* Count the hits and misses of n probed keys: one update per namespace run
 * (a batch's keys normally share one namespace). pins: also count each hit
 * as a pin held. */
static inline void count_lookups(struct umbp_index *ix, struct tl_slot *t, const umbp_key *k, const uint32_t *s,
                                 unsigned n, bool pins) {
  unsigned i = 0;
  while (i < n) {
    uint32_t ns = k[i].ns;
    unsigned hits = 0, j = i;
    for (; j < n && k[j].ns == ns; j++) hits += s[j] != UMBP_NO_SLOT;
    if (hits) count_ns(ix, t, ns, UMBP_CTR_HITS, hits);
    if (hits && pins) count_ns(ix, t, ns, UMBP_CTR_PINS, hits);
    if (j - i - hits) count_ns(ix, t, ns, UMBP_CTR_MISSES, j - i - hits);
    i = j;
  }
}

#define BULK_CHUNK 32
/* a bulk candidate that needs the full probe (slot counts are below 2^24) */
#define UMBP_SLOW (UINT32_MAX - 1)

/* Bulk lookups in stages so that the cache misses of up to 32 keys overlap.
 * Stage 1 (bulk_prep, which reads only the caller's keys): hash each key,
 * prefetch its home bucket. A full-length key is hashed from the caller's
 * bytes and copied into k[] (the segment's layout) only if stage 3 needs it
 * (bulk_key()); a shorter one is copied (and validated) here. *one_ns:
 * whether all n keys share one namespace (counted with one update per
 * counter, count_bulk()).
 *
 * The batch's prefetches (here and stage 2's) bring lines into L2
 * (prefetch_l2()), not L1, and stage 3 reads them from there. An L1
 * prefetch holds one of the core's few L1 miss buffers until its line
 * arrives; into L2, batched misses and hits both measured faster
 * (docs/bench-index.md, "The eleventh session"). */
static int bulk_prep(struct umbp_index *ix, unsigned n, const umbp_key *keys, struct umbp_key_shm *k, uint64_t *h,
                     bool *one_ns) {
  uint32_t nsd = 0;
  for (unsigned i = 0; i < n; i++) {
    if (UMBP_LIKELY(keys[i].hash_len == UMBP_KEY_HASH_MAX)) {
      h[i] = key_hash_full(&keys[i]);
    } else {
      int rc = key_load(&keys[i], &k[i], &h[i]);
      if (UMBP_UNLIKELY(rc)) return rc;
    }
    prefetch_l2(&ix->buckets[umbp_bucket_home(h[i], ix->nb)]);
    nsd |= keys[i].ns ^ keys[0].ns;
  }
  *one_ns = nsd == 0;
  return 0;
}

/* Key i of a batch in the segment's layout (k[i]), copied now. A shorter
 * key, which bulk_prep() copied already, is copied again: the caller's key
 * is read again here, and if the caller changed it meanwhile (a caller's
 * bug) k[i] is still written whole, with zeros past hash_len, never left
 * unwritten. */
static inline const struct umbp_key_shm *bulk_key(const umbp_key *keys, struct umbp_key_shm *k, unsigned i) {
  unsigned len = keys[i].hash_len;
  key_copy(&keys[i], &k[i]);
  if (UMBP_UNLIKELY(len < UMBP_KEY_HASH_MAX)) key_clear_past(&k[i], len);
  return &k[i];
}

/* Stages 2 and 3: match each home bucket's hints
 * (prefetching the first candidate's metadata, and its pin line to pin), then
 * compare keys; anything else (a second candidate, a home whose overflow
 * filter has the key's bit) takes the single-key probe. pin: pin each hit as
 * soon as it is validated (a hit whose pin fails is a miss). Results: slots[],
 * and present[] (0/1) where given; returns the hits. Inlined into each caller
 * with pin constant: a miss then costs its stage 3 a load, a compare and its
 * stores. Pinning here, into the caller's array, saves the caller a second
 * loop over the results and a copy of them (docs/bench-index.md). */
static inline __attribute__((always_inline)) unsigned probe_bulk(struct umbp_index *ix, unsigned n,
                                                                 const umbp_key *keys, struct umbp_key_shm *k,
                                                                 const uint64_t *h, uint32_t *slots,
                                                                 uint8_t *present, bool pin) {
  uint32_t cand[BULK_CHUNK];
  unsigned hits = 0;
  for (unsigned i = 0; i < n; i++) {
    struct umbp_bucket *b = &ix->buckets[umbp_bucket_home(h[i], ix->nb)];
    unsigned far;
    uint16_t sig = umbp_key_sig(h[i]);
    unsigned mask = bucket_match_far(b, (uint8_t)sig, h[i], &far);
    uint32_t s = UMBP_NO_SLOT;
    if (mask) {
      s = way_x(bucket_slot(b, (unsigned)__builtin_ctz(mask)), sig) - 1;
      if (s < ix->slot_count) {
        prefetch_l2(&ix->meta[s]);
        if (pin) prefetch_w((const void *)pin_at(ix->pins, ix->pin_stride, ix->p->proc_slot, s));
      } else {
        /* the hint matched by chance (or the way emptied since): a miss
         * unless other ways or later buckets may hold the key */
        s = (mask & (mask - 1)) || far ? UMBP_SLOW : UMBP_NO_SLOT;
      }
    } else if (far) {
      s = UMBP_SLOW; /* a key homed here with this filter bit lives further on */
    }
    cand[i] = s;
  }
  for (unsigned i = 0; i < n; i++) {
    uint32_t s = cand[i];
    uint64_t st = 0;
    if (s == UMBP_NO_SLOT) {
      /* no hint in the home bucket, and the key's bit is clear in its filter of displaced keys: a miss */
    } else {
      const struct umbp_key_shm *ki = bulk_key(keys, k, i);
      if (s != UMBP_SLOW && way_check_x(ix, s + 1, ki, &st, pin) == s) {
        /* validated: published, key equal, state unchanged across the compare */
      } else {
        s = probe(ix, ki, h[i], &st); /* other ways, overflow buckets */
      }
    }
    if (pin && s != UMBP_NO_SLOT && pin_slot(ix, s, st) != 0) s = UMBP_NO_SLOT;
    slots[i] = s;
    if (present) present[i] = s != UMBP_NO_SLOT;
    hits += s != UMBP_NO_SLOT;
  }
  return hits;
}

/* Count n probed keys, `hits` of them hits: one update per counter when
 * they share one namespace (one_ns), else count_lookups(). */
static inline void count_bulk(struct umbp_index *ix, struct tl_slot *t, const umbp_key *k, const uint32_t *s,
                              unsigned n, unsigned hits, bool one_ns, bool pins) {
  if (!UMBP_LIKELY(one_ns)) {
    count_lookups(ix, t, k, s, n, pins);
    return;
  }
  if (hits) count_ns(ix, t, k[0].ns, UMBP_CTR_HITS, hits);
  if (hits && pins) count_ns(ix, t, k[0].ns, UMBP_CTR_PINS, hits);
  if (n - hits) count_ns(ix, t, k[0].ns, UMBP_CTR_MISSES, n - hits);
}

UMBP_API int umbp_lookup_pin_bulk(umbp_pool *p, unsigned n, const umbp_key *keys, uint32_t *ret_slots) {
  struct umbp_index *ix;
  struct tl_slot *t;
  int rc = ix_get(p, &ix, &t);
  if (rc) return rc;
  if (n && (!keys || !ret_slots))
    return umbp_fail(-EINVAL, "umbp_lookup_pin_bulk: keys or ret_slots is NULL for n = %u", n);
  int hits = 0;
  for (unsigned off = 0; off < n; off += BULK_CHUNK) {
    unsigned c = n - off < BULK_CHUNK ? n - off : BULK_CHUNK;
    struct umbp_key_shm k[BULK_CHUNK];
    uint64_t h[BULK_CHUNK];
    bool one_ns;
    if ((rc = bulk_prep(ix, c, keys + off, k, h, &one_ns))) {
      umbp_unpin_bulk(p, off, ret_slots); /* undo: outputs only on success */
      return rc;
    }
    uint32_t *s = ret_slots + off; /* nothing fails from here on */
    unsigned ch = probe_bulk(ix, c, keys + off, k, h, s, NULL, true);
    count_bulk(ix, t, keys + off, s, c, ch, one_ns, true);
    hits += (int)ch;
  }
  return hits;
}

static int contains_impl(umbp_pool *p, unsigned n, const umbp_key *keys, uint8_t *present, bool prefix) {
  if (!p) return umbp_fail(-EINVAL, "pool is NULL");
  if (p->forked) return umbp_pool_forked_fail(p);
  if (n && !keys) return n == 1 ? umbp_ix_key_fail(NULL) : umbp_fail(-EINVAL, "keys is NULL for n = %u", n);
  struct umbp_index *ix = p->index;
  struct tl_slot *t = NULL;
  struct umbp_index tmp;
  if (ix) {
    t = thread_slot(ix);
    if (!t) return -EUSERS; /* thread_slot() set the message */
  } else {
    /* read-only handle (no thread line, nothing counted): a transient view
     * of the regions; lookups validate as any other (way_check()) */
    memset(&tmp, 0, sizeof tmp);
    tmp.p = p;
    tmp.ih = umbp_pool_region(p, UMBP_REG_INDEXHDR);
    tmp.buckets = umbp_pool_region(p, UMBP_REG_BUCKETS);
    tmp.nb = p->hdr->n_buckets;
    tmp.meta = umbp_pool_region(p, UMBP_REG_SLOTMETA);
    tmp.slot_count = p->hdr->slot_count;
    ix = &tmp;
  }
  int count = 0;
  for (unsigned off = 0; off < n; off += BULK_CHUNK) {
    unsigned c = n - off < BULK_CHUNK ? n - off : BULK_CHUNK;
    struct umbp_key_shm k[BULK_CHUNK];
    uint32_t s[BULK_CHUNK];
    uint64_t st[BULK_CHUNK], h[BULK_CHUNK];
    bool one_ns;
    int rc = bulk_prep(ix, c, keys + off, k, h, &one_ns);
    if (rc) return rc;
    uint8_t *pr = present && !prefix ? present + off : NULL;
    unsigned hits;
    if (c == 1) {
      s[0] = probe(ix, bulk_key(keys + off, k, 0), h[0], &st[0]);
      hits = s[0] != UMBP_NO_SLOT;
      if (pr) pr[0] = (uint8_t)hits;
    } else {
      hits = probe_bulk(ix, c, keys + off, k, h, s, pr, false);
    }
    if (prefix) {
      for (hits = 0; hits < c && s[hits] != UMBP_NO_SLOT;) hits++;
      if (t) count_bulk(ix, t, keys + off, s, hits < c ? hits + 1 : c, hits, one_ns, false); /* up to the first miss */
      count += (int)hits;
      if (hits < c) return count;
      continue;
    }
    if (t) count_bulk(ix, t, keys + off, s, c, hits, one_ns, false);
    count += (int)hits;
  }
  return count;
}

UMBP_API int umbp_contains(umbp_pool *p, const umbp_key *key) {
  /* a NULL key is one key, not none: -EINVAL (after the handle's own errors), never "absent" */
  if (UMBP_UNLIKELY(!p || !key || !p->index)) return contains_impl(p, 1, key, NULL, false);
  /* the single-key path, kept short: it is the scheduler's most frequent call */
  struct umbp_index *ix = p->index;
  struct tl_slot *t = thread_slot(ix);
  if (UMBP_UNLIKELY(!t)) return -EUSERS; /* thread_slot() set the message */
  struct umbp_key_shm k;
  uint64_t h, st;
  int rc = key_load(key, &k, &h);
  if (UMBP_UNLIKELY(rc)) return rc;
  struct umbp_reader_shm *r = reader_of(ix, t);
  uint32_t s = probe(ix, &k, h, &st);
  count_single(ix, t, r, k.ns, s != UMBP_NO_SLOT, false, -1);
  return s != UMBP_NO_SLOT;
}

UMBP_API int umbp_contains_bulk(umbp_pool *p, unsigned n, const umbp_key *keys, uint8_t *present) {
  return contains_impl(p, n, keys, present, false);
}

UMBP_API int umbp_prefix_probe(umbp_pool *p, unsigned n, const umbp_key *keys) {
  return contains_impl(p, n, keys, NULL, true);
}

/* Another published slot than `self` that holds key k (hash h), or
 * UMBP_NO_SLOT: publish()'s check for a concurrent duplicate (reserve.c),
 * called after a seq_cst fence that follows our PUBLISHED store. Looks at
 * the matching ways of the home bucket and as far as the home's reach. */
uint32_t umbp_ix_probe_other(struct umbp_index *ix, const struct umbp_key_shm *k, uint64_t h, uint32_t self,
                             uint64_t *ret_st) {
  uint32_t home = umbp_bucket_home(h, ix->nb);
  uint16_t sig = umbp_key_sig(h);
  unsigned ovf = atomic_load_explicit(&ix->buckets[home].ovf, memory_order_acquire);
  unsigned reach = UMBP_OVF_REACH(ovf);
  if (reach >= UMBP_MAX_PROBE) reach = UMBP_MAX_PROBE - 1;
  for (unsigned d = 0; d <= reach; d++) {
    struct umbp_bucket *b = &ix->buckets[umbp_bucket_at(home, d, ix->nb)];
    unsigned o;
    /* the ways whose hint matches (a copy linked before our PUBLISHED store
     * had its hint stored before its own: publish() stores the hint, then
     * PUBLISHED, seq_cst) */
    for (unsigned mask = bucket_match16(b, sig, h, &o); mask; mask &= mask - 1) {
      unsigned w = (unsigned)__builtin_ctz(mask);
      uint32_t x = way_x(atomic_load_explicit(&b->slot[w], memory_order_acquire), sig);
      if (x - 1 == self) continue;
      uint32_t s = way_check(ix, x, k, ret_st);
      if (s != UMBP_NO_SLOT) return s;
    }
  }
  return UMBP_NO_SLOT;
}

/* ---- unlinking a way (evict.c, reap.c) --------------------------------------- */
/* If slot s (key hash h) is linked in its neighbourhood, store its way's hint
 * (which a remover clears before it unlinks) and return true. */
bool umbp_ix_relink_hint(struct umbp_bucket *buckets, uint32_t nb, uint32_t s, uint64_t h) {
  uint32_t home = umbp_bucket_home(h, nb);
  for (unsigned d = 0; d < UMBP_MAX_PROBE; d++) {
    struct umbp_bucket *b = &buckets[umbp_bucket_at(home, d, nb)];
    for (unsigned w = 0; w < UMBP_BUCKET_WAYS; w++) {
      if (UMBP_WAY_SLOT(atomic_load_explicit(&b->slot[w], memory_order_acquire)) != s + 1) continue;
      atomic_store_explicit(&b->sig[w], (uint8_t)umbp_key_sig(h), memory_order_release);
      return true;
    }
  }
  return false;
}

/* The ways of bucket b whose slot word is exactly v: three 16-byte compares
 * of the twelve words on x86 (a remover knows its way's whole word, so the
 * signature hints need not be consulted). */
static inline unsigned bucket_find_word(struct umbp_bucket *b, uint32_t v) {
#if defined(__SSE2__) && !defined(UMBP_TSAN)
  const __m128i *sw = (const __m128i *)(const void *)b->slot;
  __m128i x = _mm_set1_epi32((int)v);
  __m128i e0 = _mm_cmpeq_epi32(_mm_load_si128(sw), x);
  __m128i e1 = _mm_cmpeq_epi32(_mm_load_si128(sw + 1), x);
  __m128i e2 = _mm_cmpeq_epi32(_mm_load_si128(sw + 2), x);
  atomic_signal_fence(memory_order_acquire);
  return way_lanes_mask(e0, e1, e2);
#else
  unsigned m = 0;
  for (unsigned w = 0; w < UMBP_BUCKET_WAYS; w++)
    m |= (unsigned)(atomic_load_explicit(&b->slot[w], memory_order_relaxed) == v) << w;
  return m;
#endif
}

/* Clear way w of bucket b if it still holds v (signature first, then the
 * slot word: umbp_ix_unlink_way()); the home's overflow count drops when b
 * is not the home (d > 0). */
static bool unlink_at(struct umbp_bucket *buckets, uint32_t home, unsigned d, struct umbp_bucket *b, unsigned w,
                      uint32_t v) {
  atomic_store_explicit(&b->sig[w], 0, memory_order_relaxed);
  if (!atomic_compare_exchange_strong_explicit(&b->slot[w], &v, 0, memory_order_seq_cst, memory_order_relaxed))
    return false;
  if (d) umbp_ovf_sub(&buckets[home].ovf);
  return true;
}

/* Clear the way that points at slot s (key hash h); returns true if found.
 * Only the process that moved s to EVICTING (or RESERVED), or its reaper,
 * unlinks s, and inserters only take empty ways, so the way found stays s's
 * until this clears it. The signature goes first, then the slot word (seq_cst,
 * ordering the signature store before it): an inserter that then takes the
 * way (its acquire CAS reads our 0) writes its signature after ours. */
bool umbp_ix_unlink_way(struct umbp_bucket *buckets, uint32_t nb, uint32_t s, uint64_t h) {
  uint32_t home = umbp_bucket_home(h, nb);
  /* the word publish() wrote for s: found with one compare a bucket */
  uint32_t want = umbp_way_word(umbp_key_sig(h), s);
  for (unsigned d = 0; d < UMBP_MAX_PROBE; d++) {
    struct umbp_bucket *b = &buckets[umbp_bucket_at(home, d, nb)];
    for (unsigned m = bucket_find_word(b, want); m; m &= m - 1)
      if (unlink_at(buckets, home, d, b, (unsigned)__builtin_ctz(m), want)) return true;
  }
  /* a way of s whose signature byte was rewritten (a co-tenant's scribble, a
   * repair tool): the slot id alone decides */
  for (unsigned d = 0; d < UMBP_MAX_PROBE; d++) {
    struct umbp_bucket *b = &buckets[umbp_bucket_at(home, d, nb)];
    for (unsigned w = 0; w < UMBP_BUCKET_WAYS; w++) {
      uint32_t v = atomic_load_explicit(&b->slot[w], memory_order_relaxed);
      if (UMBP_WAY_SLOT(v) == s + 1 && unlink_at(buckets, home, d, b, w, v)) return true;
    }
  }
  return false;
}
