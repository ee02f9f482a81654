/* SPDX-License-Identifier: Apache-2.0 */
/*
 * index_inline.h — the index's hot-path helpers, static inline (internal).
 *
 * What every lookup, pin and count runs: the thread's slot and line
 * (threads.c), the caller's key in the segment's layout, the bucket probe
 * and its validation (table.c), the pin (pins.c) and counting on the thread
 * (counters.c). They sit here, not behind calls into the file that owns
 * their concern, because the single-key lookups are bound by a few dozen
 * instructions and one call more shows in `umbp bench index`. Included by the
 * index's own .c files only; its out-of-line slow paths are declared in
 * index_internal.h.
 */
#ifndef UMBP_INDEX_INLINE_H
#define UMBP_INDEX_INLINE_H

#include <stddef.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "index/index_internal.h"
#include "shm/ring_claim.h"

#if defined(__SANITIZE_THREAD__)
#define UMBP_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define UMBP_TSAN 1
#endif
#endif

/* ---- pins (pins.c) ------------------------------------------------------------ */
/* Registry slot q's pin byte of slot s (struct umbp_index_hdr.pin_procs and
 * umbp_pin_stride() in index_shm.h). */
static inline _Atomic uint8_t *pin_at(_Atomic uint8_t *pins, uint64_t stride, unsigned q, uint32_t s) {
  return pins + (uint64_t)q * stride + s;
}

/* ---- thread slots (threads.c) -------------------------------------------------- */
/* This thread's slot for ix: reader line and ledger index. NULL: all 64 taken.
 * The fast paths (threads.c): the handle's first entry (the thread pointer
 * compared with one word), then the thread cache (a multiply and one load of
 * a line only this process writes). */
static inline struct tl_slot *thread_slot(struct umbp_index *ix) {
  uintptr_t self = umbp_ix_self();
  if (UMBP_LIKELY(atomic_load_explicit(&ix->first_self, memory_order_relaxed) == self)) return ix->first_tl;
  unsigned h = umbp_ix_tc_hash(self);
  uint64_t e = atomic_load_explicit(&ix->tcache[h], memory_order_relaxed);
  if (UMBP_LIKELY(e >> 8 == self)) return &ix->tl[e & 63];
  e = atomic_load_explicit(&ix->tcache[h + 1], memory_order_relaxed);
  if (UMBP_LIKELY(e >> 8 == self)) return &ix->tl[e & 63];
  return umbp_ix_thread_slot_slow(ix);
}

/* Fetch a line for writing (x86 PREFETCHW, a NOP on CPUs without it;
 * elsewhere the compiler's write prefetch). */
static inline void prefetch_w(const void *a) {
#if defined(__x86_64__)
  __asm__ volatile("prefetchw %0" : : "m"(*(const char *)a));
#else
  __builtin_prefetch(a, 1);
#endif
}

/* Fetch a line into L2, not L1 (locality 2: x86 PREFETCHT1): the batched
 * probe's prefetches (table.c, bulk_prep()). */
static inline void prefetch_l2(const void *a) { __builtin_prefetch(a, 0, 2); }

/* ---- counting (counters.c) --------------------------------------------------- */
/* Counting is on every lookup's path, so its common case is short: the
 * thread's pending namespace is this one. ctr_ns holds a namespace id only
 * where the process has a counter row (set by umbp_ix_count_ns_switch() alone). */
static inline void count_ns(struct umbp_index *ix, struct tl_slot *t, uint32_t ns, int c, uint64_t n) {
  if (UMBP_LIKELY(t->ctr_ns == ns)) {
    t->pend_ns[c] += n;
    if (UMBP_UNLIKELY(++t->pend_ops >= 64)) umbp_ix_flush_slot(ix, t);
    return;
  }
  umbp_ix_count_ns_switch(ix, t, ns, c, n);
}

static inline void count_part(struct umbp_index *ix, struct tl_slot *t, int part, int c, uint64_t n) {
  if (part < 0 || !ix->ctr) return;
  if (t->ctr_part != part) {
    umbp_ix_flush_slot(ix, t);
    t->ctr_part = part;
  }
  t->pend_part[c] += n;
}

/* One single-key lookup, counted on the thread's reader line r, which the
 * lookup has just written: one add, no other line written. pin: a
 * umbp_lookup_pin(), whose hit also counts a pin and a hit of the slot's
 * partition. Single hits are bound by how many lookups' cache misses the core
 * keeps in flight, so the count goes on a line the lookup writes anyway
 * rather than one more (docs/bench-index.md, "Why the hot path looks as it
 * does"). */
static inline void count_single(struct umbp_index *ix, struct tl_slot *t, struct umbp_reader_shm *r, uint32_t ns,
                                bool hit, bool pin, int part) {
  if (UMBP_LIKELY(t->ctr_ns == ns && (!pin || !hit || t->ctr_part == part))) {
    uint64_t v = r->pend_lookups + (hit ? (1ull << 32) + 1 : 1);
    r->pend_lookups = v;
    if (pin) r->pend_pins += hit;
    if (UMBP_UNLIKELY((uint32_t)v >= 64)) umbp_ix_flush_slot(ix, t);
    return;
  }
  count_ns(ix, t, ns, hit ? UMBP_CTR_HITS : UMBP_CTR_MISSES, 1);
  if (pin && hit) {
    count_ns(ix, t, ns, UMBP_CTR_PINS, 1);
    count_part(ix, t, part, UMBP_CTR_HITS, 1);
  }
}

/* ---- keys (table.c) -------------------------------------------------------- */
_Static_assert(offsetof(umbp_key, tp_rank) == 4 && offsetof(umbp_key, pcp_rank) == 6 &&
                   offsetof(umbp_key, dcp_rank) == 8 && offsetof(umbp_key, pp_rank) == 10 &&
                   offsetof(umbp_key, group) == 12 && offsetof(umbp_key, hash_len) == 14 &&
                   offsetof(umbp_key, hash) == 15 && sizeof(umbp_key) >= 47,
               "umbp_key layout");
_Static_assert(offsetof(struct umbp_key_shm, tp) == 4 && offsetof(struct umbp_key_shm, pcp) == 6 &&
                   offsetof(struct umbp_key_shm, dcp) == 8 && offsetof(struct umbp_key_shm, pp) == 10 &&
                   offsetof(struct umbp_key_shm, group) == 12 && offsetof(struct umbp_key_shm, hash_len) == 14 &&
                   offsetof(struct umbp_key_shm, hash) == 16,
               "key words");
_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "key words are little-endian");
/* The caller's key in the segment's layout (six little-endian key words),
 * written straight into the caller's copy, and its hash. umbp_key and struct
 * umbp_key_shm agree on their first 15 bytes (namespace, ranks, group, hash
 * length); the segment's has a zero pad byte where the caller's block hash
 * starts. So the copy is one masked 16-byte store and the 32-byte block
 * hash; what lies past hash_len is cleared. Stored as 16-byte vectors, the
 * width key_eq() loads the copy with, so that store forwarding can serve
 * those loads, and the hash reads it as the same three 16-byte words. The
 * copy is written directly, not through a second array (fewer instructions
 * a key; docs/bench-index.md). */
static inline uint64_t ld64(const void *p, unsigned i) {
  uint64_t v;
  memcpy(&v, (const char *)p + 8 * i, 8);
  return v;
}

/* The copy of key_load() for any valid k: its first 15 bytes and the 32
 * bytes from its block hash on; key_load() clears what lies past a shorter
 * hash_len. */
#if defined(__SSE2__)
/* The copy's first 16 bytes: the caller's first 15 and a zero byte. */
static inline __m128i key_word0(const umbp_key *k) {
  return _mm_and_si128(_mm_loadu_si128((const __m128i *)(const void *)k), _mm_set_epi64x(0x00ffffffffffffffll, -1));
}
#endif

static inline void key_copy(const umbp_key *k, struct umbp_key_shm *out) {
  const unsigned char *b = (const unsigned char *)k;
  unsigned char *o = (unsigned char *)out;
#if defined(__SSE2__)
  _mm_storeu_si128((__m128i *)(void *)o, key_word0(k));
#else
  uint64_t w[2];
  memcpy(w, b, 16);
  w[1] &= 0x00ffffffffffffffull;
  memcpy(o, w, 16);
#endif
  memcpy(o + 16, b + offsetof(umbp_key, hash), UMBP_KEY_HASH_MAX);
}

/* Clear a copy's block-hash bytes past len (below UMBP_KEY_HASH_MAX). */
static inline void key_clear_past(struct umbp_key_shm *out, unsigned len) {
  memset((unsigned char *)out + offsetof(struct umbp_key_shm, hash) + len, 0, UMBP_KEY_HASH_MAX - len);
}

static inline int key_load(const umbp_key *k, struct umbp_key_shm *out, uint64_t *h) {
  if (UMBP_UNLIKELY(!k || k->hash_len - 1u >= UMBP_KEY_HASH_MAX)) {
    memset(out, 0, sizeof *out);
    *h = 0;
    return umbp_ix_key_fail(k);
  }
  unsigned len = k->hash_len;
  unsigned char *o = (unsigned char *)out;
  key_copy(k, out);
  if (UMBP_UNLIKELY(len < UMBP_KEY_HASH_MAX)) key_clear_past(out, len);
  *h = umbp_key_hash_mem(o);
  return 0;
}

/* The hash key_load() gives a full-length key (hash_len UMBP_KEY_HASH_MAX),
 * read from the caller's bytes: the copy's six words are the caller's bytes
 * 0..14 and a zero byte, then bytes 15..46. The batched probe hashes so and
 * copies only the keys whose home bucket has a candidate (key_copy()): a
 * miss then costs no copy (docs/bench-index.md). */
static inline uint64_t key_hash_full(const umbp_key *k) {
  const unsigned char *b = (const unsigned char *)k;
  const unsigned char *x = b + offsetof(umbp_key, hash);
#if UMBP_KEY_HASH_AESNI
  return umbp_key_hash_v(key_word0(k), _mm_loadu_si128((const __m128i *)(const void *)x),
                         _mm_loadu_si128((const __m128i *)(const void *)(x + 16)));
#else
  return umbp_key_hash6(ld64(b, 0), ld64(b, 1) & 0x00ffffffffffffffull, ld64(x, 0), ld64(x, 1), ld64(x, 2),
                        ld64(x, 3));
#endif
}

/* Word-wise, with one branch on the result instead of one per 16 bytes (a
 * memcmp() has a branch per chunk; docs/bench-index.md). */
static inline bool key_eq(const struct umbp_key_shm *a, const struct umbp_key_shm *b) {
#if defined(__SSE2__) && !defined(UMBP_TSAN)
  /* Three 16-byte loads of each key, as GCC's vectorised loop of the scalar
   * form below does, without the loop's counter and branch. */
  const __m128i *x = (const __m128i *)(const void *)a, *y = (const __m128i *)(const void *)b;
  __m128i d = _mm_or_si128(_mm_or_si128(_mm_xor_si128(_mm_loadu_si128(x), _mm_loadu_si128(y)),
                                        _mm_xor_si128(_mm_loadu_si128(x + 1), _mm_loadu_si128(y + 1))),
                           _mm_xor_si128(_mm_loadu_si128(x + 2), _mm_loadu_si128(y + 2)));
  return _mm_movemask_epi8(_mm_cmpeq_epi8(d, _mm_setzero_si128())) == 0xffff;
#elif defined(UMBP_TSAN)
  /* The slot's key (a) may be rewritten by its next owner while we read it
   * (way_check() then rejects what was read): relaxed atomic loads, so that
   * TSan sees the race the state check makes harmless. */
  uint64_t d = 0;
  for (unsigned i = 0; i < 6; i++) d |= __atomic_load_n((const uint64_t *)(const void *)a + i, __ATOMIC_RELAXED) ^ ld64(b, i);
  return d == 0;
#else
  uint64_t d = 0;
  for (unsigned i = 0; i < 6; i++) d |= ld64(a, i) ^ ld64(b, i);
  return d == 0;
#endif
}

/* Write key k into slot metadata m (its owner, while RESERVED; see
 * way_check() for why readers may read it meanwhile). */
static inline void key_store(struct umbp_slot_meta *m, const struct umbp_key_shm *k) {
#if defined(UMBP_TSAN)
  for (unsigned i = 0; i < 6; i++) __atomic_store_n((uint64_t *)(void *)&m->key + i, ld64(k, i), __ATOMIC_RELAXED);
#else
  m->key = *k;
#endif
}

/* ---- slots and their partitions (index.c) --------------------------------------- */
/* The partition of slot `slot`, or -1: from the process's private copy of the
 * partition table where it has one (struct umbp_index), else (a read-only
 * handle, a reaper inside attach) from the header, bounded. */
static inline int slot_part(const umbp_pool *p, uint32_t slot) {
  const struct umbp_index *ix = p->index;
  if (UMBP_LIKELY(ix != NULL)) {
    for (unsigned i = 0; i < ix->n_parts; i++)
      if (slot - ix->parts[i].first_slot < ix->parts[i].slot_count) return (int)i;
    return -1;
  }
  const struct umbp_shm_header *h = p->hdr;
  unsigned n = h->n_partitions < UMBP_MAX_PARTITIONS ? h->n_partitions : UMBP_MAX_PARTITIONS;
  for (unsigned i = 0; i < n; i++)
    if (slot - h->partitions[i].first_slot < h->partitions[i].slot_count) return (int)i;
  return -1;
}

/* The free-slot ring of partition part (one address computation, inlined
 * wherever it is used). */
static inline void *part_ring(umbp_pool *p, unsigned part) {
  return (char *)p->base + p->hdr->partitions[part].ring_offset;
}

/* ---- probing (table.c) ---------------------------------------------------------- */
/* Find the slot holding key k (hash h).
 * Returns the slot or UMBP_NO_SLOT; *ret_st gets the state word seen. */

#if defined(__x86_64__) && defined(__SSE2__) && !defined(UMBP_TSAN)
#include <emmintrin.h>
/* The ways of bucket b whose 8-bit signature hint is sig, as a bit mask, and
 * in *far whether a key with hash h may live past bucket b: its bit in b's
 * overflow filter (bytes 12..13, umbp_ovf_bit(); index_internal.h). SSE2: the
 * twelve hints (bytes 0..11 of the line) in one vector compare. The hints
 * are a hint only: each candidate's slot word is loaded with acquire order
 * before it is followed (bucket_slot()) and its key compared, so a way
 * changing underneath costs a wasted look, never a wrong answer. (Under TSan
 * the scalar loop below is used: it does not model this.)
 * The filter bit comes from the same 16-byte load rather than a second one:
 * a lookup that misses loads its bucket line once, and how many loads wait
 * on a missing line sets how many lookups' misses the core keeps in flight.
 * A filter is 0 whenever the count is, so the bit alone decides whether a
 * probe looks past the home: it is set for 0.4% of misses at load factor 0.9
 * where the count is non-zero for 3.5%, and for 3% where churn has left the
 * count non-zero for 18% (docs/bench-index.md, "The twelfth session"). The
 * compiler barrier gives the word acquire order for what the probe reads
 * next (x86 keeps loads in order). */
_Static_assert(offsetof(struct umbp_bucket, ovf) == 12, "ovf is words 6 (filter) and 7 of the bucket's first 16 bytes");
static inline unsigned bucket_match_far(struct umbp_bucket *b, uint8_t sig, uint64_t h, unsigned *far) {
  __m128i l0 = _mm_load_si128((const __m128i *)(const void *)b);
  unsigned m = (unsigned)_mm_movemask_epi8(_mm_cmpeq_epi8(l0, _mm_set1_epi8((char)sig)));
  *far = (unsigned)_mm_extract_epi16(l0, 6) >> umbp_ovf_bit_index(h) & 1;
  atomic_signal_fence(memory_order_acquire);
  return m & ((1u << UMBP_BUCKET_WAYS) - 1);
}

/* Three compares of a bucket's twelve slot words, four ways each, as a 12-bit
 * way mask: a way's 32-bit lane is negative iff the compare matched in its
 * sign byte, and the signed saturating packs keep each lane's sign, so the
 * ways land, in order, in the sign bits of bytes 0..11. */
static inline unsigned way_lanes_mask(__m128i e0, __m128i e1, __m128i e2) {
  return (unsigned)_mm_movemask_epi8(_mm_packs_epi16(_mm_packs_epi32(e0, e1), _mm_packs_epi32(e2, e2))) &
         ((1u << UMBP_BUCKET_WAYS) - 1);
}

/* The ways of bucket b whose whole 16-bit signature is sig (and *far, as
 * bucket_match_far() gives it): bucket_match_far()'s hint mask ANDed with a
 * compare of the twelve slot words' top bytes (three
 * 16-byte loads of the same line, after the hint load: x86 keeps loads in
 * order, and an inserter stores the slot word before the hint, so a hint seen
 * set brings its slot word). A different key's low byte matches one of ~7
 * ways (load factor 0.9) 1 time in 36; its whole signature, 1 in 9000. The
 * single-key probe branches on this mask with its bucket line still in
 * flight, so a chance hint match there is a mispredicted branch that waits
 * for memory; the filter costs 16 instructions a call and pays for them
 * there. The batched probe, whose lines were prefetched, keeps the hint mask
 * alone: there the filter cost more than it saved (docs/bench-index.md). */
static inline unsigned bucket_match16(struct umbp_bucket *b, uint16_t sig, uint64_t h, unsigned *far) {
  unsigned m = bucket_match_far(b, (uint8_t)sig, h, far);
  const __m128i *sw = (const __m128i *)(const void *)b->slot;
  __m128i hv = _mm_set1_epi8((char)(sig >> 8));
  __m128i e0 = _mm_cmpeq_epi8(_mm_load_si128(sw), hv);
  __m128i e1 = _mm_cmpeq_epi8(_mm_load_si128(sw + 1), hv);
  __m128i e2 = _mm_cmpeq_epi8(_mm_load_si128(sw + 2), hv);
  /* a slot word's byte compares read as a 32-bit lane: its sign byte is the top byte's */
  return m & way_lanes_mask(e0, e1, e2);
}
#else
static inline unsigned bucket_match_far(struct umbp_bucket *b, uint8_t sig, uint64_t h, unsigned *far) {
  unsigned mask = 0;
  for (unsigned w = 0; w < UMBP_BUCKET_WAYS; w++)
    mask |= (unsigned)(atomic_load_explicit(&b->sig[w], memory_order_relaxed) == sig) << w;
  *far = UMBP_OVF_FILTER(atomic_load_explicit(&b->ovf, memory_order_acquire)) >> umbp_ovf_bit_index(h) & 1;
  return mask;
}
/* the high signature bytes are checked by match_ways() (way_x()) */
static inline unsigned bucket_match16(struct umbp_bucket *b, uint16_t sig, uint64_t h, unsigned *far) {
  return bucket_match_far(b, (uint8_t)sig, h, far);
}
#endif

/* Slot word of way w (sig_hi << 24 | slot + 1, 0 empty), loaded with acquire order: pairs
 * with the release CAS in publish(), so the key and block bytes it leads to
 * are visible. */
static inline uint32_t bucket_slot(struct umbp_bucket *b, unsigned w) {
  return atomic_load_explicit(&b->slot[w], memory_order_acquire);
}

/* A way's slot word with the high signature byte of the key looked up
 * XORed out of its top byte: slot + 1 when the high bytes agree, else at
 * least 2^24, so that one range check of x - 1 against the slot count
 * (below UMBP_MAX_SLOTS + 1) refuses an empty way (x - 1 = UINT32_MAX), a way
 * of another signature and a garbage word alike, and a hint that matched by
 * chance costs no metadata read. */
static inline uint32_t way_x(uint32_t v, uint16_t sig) { return v ^ (uint32_t)(sig >> 8) << 24; }

/* Whether published state word st of slot meta m still holds, after the
 * caller read m's key: the seqlock-style check that replaces grace periods.
 * Every transition of a slot stores a new state word (its generation bumps),
 * and the key is written only while the slot is RESERVED, after the CAS that
 * reserved it (and a release fence, publish()). So a key read between two
 * loads that both see st was st's key, whole. The acquire fence keeps the key
 * loads before the second state load (on x86 it is a compiler barrier). */
static inline bool meta_still(struct umbp_slot_meta *m, uint64_t st) {
  atomic_thread_fence(memory_order_acquire);
  return atomic_load_explicit(&m->state, memory_order_relaxed) == st;
}

/* The slot of way word x (way_x()) if it holds key k published, else
 * UMBP_NO_SLOT; *ret_st: the state word that was validated. The slot may be
 * removed and reused at any moment (no grace period holds it): the state is
 * loaded before the key (acquire: the key written before PUBLISHED was
 * stored is visible) and checked unchanged after it (meta_still()). */
static inline __attribute__((always_inline)) uint32_t way_check_x(struct umbp_index *ix, uint32_t x,
                                                                   const struct umbp_key_shm *k, uint64_t *ret_st,
                                                                   bool pin) {
  uint32_t s = x - 1;
  if (UMBP_UNLIKELY(s >= ix->slot_count)) return UMBP_NO_SLOT; /* empty, or garbage from a buggy writer */
  struct umbp_slot_meta *m = &ix->meta[s];
  uint64_t st = atomic_load_explicit(&m->state, memory_order_acquire);
  if (!key_eq(&m->key, k)) return UMBP_NO_SLOT;
  if (ST_STATE(st) != UMBP_SLOT_PUBLISHED) return UMBP_NO_SLOT;
  /* A pin validates the same word after its pin is visible (pin_slot()),
   * which covers the key read too: an unchanged word then means no
   * transition since the first load. */
  if (!pin && !meta_still(m, st)) return UMBP_NO_SLOT;
  *ret_st = st;
  return s;
}

static inline uint32_t way_check(struct umbp_index *ix, uint32_t x, const struct umbp_key_shm *k, uint64_t *ret_st) {
  return way_check_x(ix, x, k, ret_st, false);
}

/* The way of bucket b, among those whose hints matched (mask), that holds k
 * (signature sig): a way whose slot word carries another high signature byte
 * is passed over without reading its metadata. pin: the caller will pin a
 * hit, so start fetching the candidate's pin line (for writing) while its
 * key line is still on its way. */
static inline __attribute__((always_inline)) uint32_t match_ways(struct umbp_index *ix, struct umbp_bucket *b,
                                                                 unsigned mask, uint16_t sig,
                                                                 const struct umbp_key_shm *k, uint64_t *ret_st,
                                                                 bool pin) {
  while (mask) {
    unsigned w = (unsigned)__builtin_ctz(mask);
    mask &= mask - 1;
    uint32_t x = way_x(bucket_slot(b, w), sig);
    if (pin && x - 1 < ix->slot_count) prefetch_w((const void *)pin_at(ix->pins, ix->pin_stride, ix->p->proc_slot, x - 1));
    uint32_t s = way_check_x(ix, x, k, ret_st, pin);
    if (s != UMBP_NO_SLOT) return s;
  }
  return UMBP_NO_SLOT;
}

/* Find k: the home bucket's ways, then, only if k's bit is set in the home's
 * filter of displaced keys, the buckets after it. A miss whose bit is clear
 * (99.6% at load factor 0.9, 97% after long churn) ends after one bucket line
 * and one branch on that bit.
 * Always inlined (as probe() is): the single-key calls are the hot path. */
static inline __attribute__((always_inline)) uint32_t probe_x(struct umbp_index *ix, const struct umbp_key_shm *k,
                                                              uint64_t h, uint64_t *ret_st, bool pin) {
  uint32_t home = umbp_bucket_home(h, ix->nb);
  uint16_t sig = umbp_key_sig(h);
  struct umbp_bucket *b = &ix->buckets[home];
  unsigned far;
  uint32_t s = match_ways(ix, b, bucket_match16(b, sig, h, &far), sig, k, ret_st, pin);
  if (s != UMBP_NO_SLOT || UMBP_LIKELY(!far)) return s;
  return umbp_ix_probe_far(ix, k, home, sig, h, ret_st, pin);
}

static inline __attribute__((always_inline)) uint32_t probe(struct umbp_index *ix, const struct umbp_key_shm *k, uint64_t h, uint64_t *ret_st) {
  return probe_x(ix, k, h, ret_st, false);
}

static inline struct umbp_reader_shm *reader_of(struct umbp_index *ix, struct tl_slot *t) {
  return &ix->readers[t->tid];
}

/* The caller's index and thread slot. Inlined, its messages out of line
 * (umbp_ix_fail(), index.c), so that the fast path stays short. */
static inline __attribute__((always_inline)) int ix_get(umbp_pool *p, struct umbp_index **ix, struct tl_slot **t) {
  *ix = NULL;
  *t = NULL;
  if (UMBP_UNLIKELY(!p || !p->index)) return umbp_ix_fail(p);
  *ix = p->index;
  *t = thread_slot(p->index);
  return UMBP_LIKELY(*t != NULL) ? 0 : -EUSERS;
}

/* ---- pinning (pins.c) ----------------------------------------------------------- */
static inline int pin_slot(struct umbp_index *ix, uint32_t s, uint64_t st) {
  if (UMBP_UNLIKELY(!atomic_load_explicit(&ix->pin_bit, memory_order_relaxed))) umbp_ix_pin_bit_set(ix);
  _Atomic uint8_t *pb = pin_at(ix->pins, ix->pin_stride, ix->p->proc_slot, s);
  uint8_t old = atomic_fetch_add_explicit(pb, 1, memory_order_seq_cst);
  if (UMBP_UNLIKELY(old == 255)) {
    atomic_fetch_sub_explicit(pb, 1, memory_order_seq_cst);
    return -EOVERFLOW;
  }
  /* Dekker with try_remove() (evict.c): pin store, then state load (both seq_cst) */
  if (atomic_load_explicit(&ix->meta[s].state, memory_order_seq_cst) != st) {
    atomic_fetch_sub_explicit(pb, 1, memory_order_release);
    return -ENOENT;
  }
  if (!atomic_load_explicit(&ix->meta[s].ref, memory_order_relaxed))
    atomic_store_explicit(&ix->meta[s].ref, 1, memory_order_relaxed);
  return 0;
}

/* ---- namespace counts (namespaces.c) ---------------------------------------------- */
/* Move slot s's counted flag to f and namespace ns's count with it, as the
 * calling thread (its line holds the change's record). */
static inline void ns_count_set(struct umbp_index *ix, struct tl_slot *t, uint32_t ns, uint32_t s, uint8_t f) {
  umbp_ix_ns_count_set(ix->lines, &ix->readers[t->tid], (unsigned)ix->p->proc_slot * UMBP_MAX_THREADS + t->tid + 1,
                       ix->ns, ix->meta, ix->slot_count, ns, s, f);
}

/* ---- events (events.c) -------------------------------------------------------------- */
/* Whether a removal has anyone to tell: the event ring, once a process has
 * drained it (events_on), or the published-key feed, once a consumer has
 * opened it (feed_gen; umbp_ix_emit() loads it again with acquire order). */
static inline bool umbp_ix_removed_wanted(struct umbp_index *ix) {
  return atomic_load_explicit(&ix->ih->events_on, memory_order_relaxed) ||
         atomic_load_explicit(&ix->p->hdr->feed_gen, memory_order_relaxed);
}

/* ---- the owner-id lock (lock.c): release is one store ------------------------------ */
static inline void spin_unlock(_Atomic uint32_t *lock) { atomic_store_explicit(lock, 0, memory_order_release); }

#endif
