/* SPDX-License-Identifier: Apache-2.0 */
/*
 * index.c — the block index: a hash table, slot states, pins, grace periods
 * and eviction, all in the pool segment and shared by every process.
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
 * hints sit beside a 16-bit lock word used only by inserters and an
 * overflow word: how many keys whose home is this bucket live in one of the
 * next UMBP_MAX_PROBE-1 buckets, and how far on the furthest of them is (a
 * miss looks no further). A key's full bytes live in
 * its slot's metadata (struct umbp_slot_meta), so there is one entry per
 * slot and the slot id is the entry id (DPDK's rte_hash keeps signatures in
 * buckets and keys in a flat store the same way). For 1M slots the bucket
 * array is 8 MiB, as rte_hash's is for 1M entries. Lines touched: a miss
 * reads its home bucket (one line; more only when the home overflowed); a
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
 * is present throughout the lookup is never dropped). The only store of a
 * lookup is its own thread's reader-state line.
 *
 * Slot states (slot_meta.state = state | owner << 8 | gen << 24; every
 * transition is a CAS that bumps gen, so there is no ABA):
 *
 *   FREE --reserve(X)--> RESERVED(X) --publish--> PUBLISHED --evict/remove(Y)-->
 *   EVICTING(Y) --pins seen--> PUBLISHED          (abort)
 *   EVICTING(Y) --no pins, way cleared--> RETIRED(Y, epoch) --grace--> FREE
 *   RESERVED(X) --abort / duplicate key--> FREE
 * Only X moves RESERVED(X); only Y moves EVICTING(Y) and RETIRED(Y); the
 * reaper of a dead X or Y moves them while holding the dead process's
 * registry lock, acting under the dead process's owner id: RESERVED and
 * EVICTING -> RETIRED (unlinked; an EVICTING one also gets its removed
 * event), except EVICTING with pins held and its way still linked ->
 * PUBLISHED, which is what Y would have done at its pin check.
 *
 * Pins. A pin is a count byte per (registry slot, slot), laid out
 * process-major: each registry slot's bytes are one dense array (1 MiB for 1M
 * slots; pin_at()), so a pin writes a line of its own process's array, in a
 * region that stays in cache and TLB, rather than a per-slot line of a region
 * the size of the metadata. A process only writes its own bytes, so reaping a
 * dead process (or detaching) zeroes exactly its pins. Pinning races with
 * eviction in Dekker style: the pinner increments its byte then re-reads the
 * state word; the evictor CASes the state to EVICTING then reads the pin bytes
 * of every process in the header's pin_procs mask; all are seq_cst, so at
 * least one sees the other: either the pinner sees EVICTING and backs off (a
 * miss), or the evictor sees the pin and restores PUBLISHED. A process sets
 * its mask bit (seq_cst) before its first pin, so an evictor whose mask load
 * misses the bit comes before that pin's state load and is seen by it.
 *
 * Grace periods (who may reuse a removed slot, and when). Reader state lives in
 * the segment: one cache line per (process, thread), holding 0 (outside a read
 * section) or the global epoch the reader entered at. A remover clears the way,
 * then records retire_epoch = epoch and keeps the slot RETIRED on its own
 * process-local limbo list. Reclaiming bumps the epoch, issues
 * membarrier(MEMBARRIER_CMD_GLOBAL_EXPEDITED) (every process registers for it
 * at attach; where the kernel lacks it, readers issue a seq_cst fence after
 * their store instead), then reads every live reader line: a retired slot is
 * reusable once every reader is either outside a section or entered at an
 * epoch > retire_epoch. Argument: the membarrier puts a full barrier in every
 * running reader between its reader-state store and its table loads, so after
 * it either the reader's store is visible to the scan (and it is waited for),
 * or the reader's table loads happen after the barrier and so after the way
 * was cleared (it cannot reach the slot). This is liburcu's memb flavour with
 * the reader registry moved into shared memory, as DPDK's rte_rcu_qsbr does.
 * Reclaim never waits: a reader that does not leave its section (stopped in a
 * debugger) only delays the reuse of slots retired before it entered; live
 * processes go on, and a dead reader's line is zeroed by the reaper.
 *
 * Free slots travel on one MPMC ring per partition (shm/ring.h). A consumer
 * takes a slot id with a two-phase dequeue and moves the slot FREE ->
 * RESERVED(X) before completing the dequeue; a producer records the slot in
 * its thread's ledger (proc_slot.inflight_slot) before it frees it. The
 * reaper of X therefore finds every slot X held in a half-finished ring
 * operation: in a claimed cell, or in the ledger (see reap_proc()).
 *
 * Eviction is CLOCK (second chance): a hit sets the slot's reference bit (only
 * if not set, so a hot block does not bounce its line); the hand clears set
 * bits and evicts the first unpinned PUBLISHED slot with a clear bit. A
 * namespace over its quota evicts its own blocks first. Each eviction emits a
 * removed event into the event ring; a full ring drops its oldest event and
 * counts the drop.
 *
 * Block counts. A namespace's used_slots (its blocks, for quotas and
 * umbp_ns_info_get) counts the slots whose counted flag is set; the flag and
 * the count change together under the namespace's count lock, after a journal
 * entry that the next holder redoes if the last one died in between (see
 * ns_count_set()). This holds the count exact across kills: a bare fetch-add
 * left it off by one when a kill fell between flag and add.
 *
 * Counters are kept per thread in process memory and added every 64
 * operations into the process's own row in the segment (lookups must not
 * write shared lines); the reaper folds a dead process's row into the
 * "reaped" row.
 */
#include "index/index_internal.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "shm/ring_claim.h"

#define THREAD_NONE UINT32_MAX

/* Registry slot q's pin byte of slot s (struct umbp_index_hdr.pin_procs and
 * umbp_pin_stride() in index_shm.h). */
static inline _Atomic uint8_t *pin_at(_Atomic uint8_t *pins, uint64_t stride, unsigned q, uint32_t s) {
  return pins + (uint64_t)q * stride + s;
}

/* Whether no process pins slot s (seq_cst loads: the remover's side of the
 * Dekker pair with pin_slot()). */
static bool pins_clear(_Atomic uint8_t *pins, uint64_t stride, struct umbp_index_hdr *ih, uint32_t s) {
  uint64_t m = atomic_load_explicit(&ih->pin_procs, memory_order_seq_cst);
  for (; m; m &= m - 1)
    if (atomic_load_explicit(pin_at(pins, stride, (unsigned)__builtin_ctzll(m), s), memory_order_seq_cst)) return false;
  return true;
}

/* Zero registry slot q's pins (its process detached or died), then its bit. */
static void pins_drop_proc(_Atomic uint8_t *pins, uint64_t stride, struct umbp_index_hdr *ih, uint32_t slots,
                           unsigned q) {
  _Atomic uint64_t *w = (_Atomic uint64_t *)(void *)pin_at(pins, stride, q, 0);
  for (uint64_t i = 0; i < (slots + 7) / 8; i++)
    if (atomic_load_explicit(&w[i], memory_order_relaxed)) atomic_store_explicit(&w[i], 0, memory_order_release);
  atomic_fetch_and_explicit(&ih->pin_procs, ~(1ull << q), memory_order_seq_cst);
}

/* A ring payload buffer as large as any ring element (free rings carry 8 bytes). */
union ring_elem {
  uint64_t v;
  unsigned char b[UMBP_RING_MAX_ELEM];
};

/* ---- per-process instances and thread slots ------------------------------- */
static pthread_mutex_t inst_mu = PTHREAD_MUTEX_INITIALIZER;
static struct umbp_index *instances[64];
static uint64_t next_instance = 1;
static pthread_key_t tl_key;
static pthread_once_t tl_once = PTHREAD_ONCE_INIT;

struct tl_slot {
  uint64_t instance;
  unsigned tid;
  /* pending counters */
  uint32_t ctr_ns;
  int ctr_part;
  uint32_t pend_ops;
  uint64_t pend_ns[UMBP_CTR_COUNT];
  uint64_t pend_part[UMBP_CTR_COUNT];
};
#define TL_MAX 8
struct tl_state {
  struct tl_slot s[TL_MAX];
};
static _Thread_local struct tl_state tl;
static _Thread_local bool tl_registered;

static struct umbp_index *instance_find(uint64_t id) {
  for (unsigned i = 0; i < 64; i++)
    if (instances[i] && instances[i]->instance == id) return instances[i];
  return NULL;
}

static void flush_slot(struct umbp_index *ix, struct tl_slot *t);
static int reclaim_wait(umbp_pool *p, uint64_t budget_ns);
static size_t limbo_count(struct umbp_index *ix);

static void tl_destructor(void *arg) {
  (void)arg;
  pthread_mutex_lock(&inst_mu);
  for (unsigned i = 0; i < TL_MAX; i++) {
    struct tl_slot *t = &tl.s[i];
    if (!t->instance) continue;
    struct umbp_index *ix = instance_find(t->instance);
    if (ix) {
      flush_slot(ix, t);
      struct umbp_proc_slot *ps = &ix->p->procs[ix->p->proc_slot];
      atomic_store_explicit(&ix->readers[t->tid].ctr, 0, memory_order_release);
      atomic_fetch_and_explicit(&ps->thread_bits, ~(1ull << t->tid), memory_order_release);
    }
    t->instance = 0;
  }
  pthread_mutex_unlock(&inst_mu);
}

static void tl_init_key(void) { pthread_key_create(&tl_key, tl_destructor); }

/* This thread's slot for ix: reader line and ledger index. NULL: all 64 taken. */
static _Thread_local struct tl_slot *tl_last; /* the slot of the last pool this thread used */

static struct tl_slot *thread_slot_slow(struct umbp_index *ix);

static inline struct tl_slot *thread_slot(struct umbp_index *ix) {
  struct tl_slot *t = tl_last;
  if (UMBP_LIKELY(t && t->instance == ix->instance)) return t;
  return thread_slot_slow(ix);
}

static struct tl_slot *thread_slot_slow(struct umbp_index *ix) {
  for (unsigned i = 0; i < TL_MAX; i++)
    if (tl.s[i].instance == ix->instance) return tl_last = &tl.s[i];
  struct tl_slot *t = NULL;
  for (unsigned i = 0; i < TL_MAX && !t; i++)
    if (!tl.s[i].instance) t = &tl.s[i];
  if (!t) {
    /* evict the cache entry of an instance that no longer exists */
    pthread_mutex_lock(&inst_mu);
    for (unsigned i = 0; i < TL_MAX && !t; i++)
      if (!instance_find(tl.s[i].instance)) t = &tl.s[i];
    pthread_mutex_unlock(&inst_mu);
    if (!t) {
      umbp_fail(-EUSERS, "this thread uses more than %d pools at once", TL_MAX);
      return NULL;
    }
  }
  struct umbp_proc_slot *ps = &ix->p->procs[ix->p->proc_slot];
  for (;;) {
    uint64_t bits = atomic_load_explicit(&ps->thread_bits, memory_order_relaxed);
    if (bits == UINT64_MAX) {
      umbp_fail(-EUSERS, "more than %d threads of this process use pool '%s': use fewer threads for pool "
                         "calls",
                UMBP_MAX_THREADS, ix->p->name);
      return NULL;
    }
    unsigned tid = (unsigned)__builtin_ctzll(~bits);
    if (atomic_compare_exchange_weak_explicit(&ps->thread_bits, &bits, bits | (1ull << tid),
                                              memory_order_acq_rel, memory_order_relaxed)) {
      memset(t, 0, sizeof *t);
      t->instance = ix->instance;
      t->tid = tid;
      /* what a thread that held this line before us left uncounted is lost,
       * as its thread-local counts would be */
      if (ix->readers) ix->readers[tid].pend_lookups = ix->readers[tid].pend_pins = 0;
      t->ctr_part = -1;
      t->ctr_ns = UINT32_MAX;
      break;
    }
  }
  if (!tl_registered) {
    pthread_once(&tl_once, tl_init_key);
    pthread_setspecific(tl_key, &tl);
    tl_registered = true;
  }
  return tl_last = t;
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

/* ---- read sections --------------------------------------------------------- */
static inline void rd_lock(struct umbp_index *ix, struct umbp_reader_shm *r) {
  uint64_t e = atomic_load_explicit(&ix->ih->epoch, memory_order_acquire);
  /* release: a reclaimer that reads this value (acquire) is ordered after this
   * thread's previous read section (pairs with reclaim()'s acquire loads) */
  atomic_store_explicit(&r->ctr, e, memory_order_release);
  if (ix->memb) atomic_signal_fence(memory_order_seq_cst); /* writers' membarrier is our fence */
  else atomic_thread_fence(memory_order_seq_cst);
}

static inline void rd_unlock(struct umbp_reader_shm *r) {
  /* pairs with the acquire load in reclaim() */
  atomic_store_explicit(&r->ctr, 0, memory_order_release);
}

/* ---- counters ---------------------------------------------------------------- */
static void flush_slot(struct umbp_index *ix, struct tl_slot *t) {
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

static __attribute__((noinline)) void count_ns_switch(struct umbp_index *ix, struct tl_slot *t, uint32_t ns, int c,
                                                      uint64_t n) {
  if (ns >= UMBP_MAX_NAMESPACES || !ix->ctr) return;
  flush_slot(ix, t);
  t->ctr_ns = ns;
  t->pend_ns[c] += n;
  if (++t->pend_ops >= 64) flush_slot(ix, t);
}

/* Counting is on every lookup's path, so its common case is short: the
 * thread's pending namespace is this one. ctr_ns holds a namespace id only
 * where the process has a counter row (set by count_ns_switch() alone). */
static inline void count_ns(struct umbp_index *ix, struct tl_slot *t, uint32_t ns, int c, uint64_t n) {
  if (UMBP_LIKELY(t->ctr_ns == ns)) {
    t->pend_ns[c] += n;
    if (UMBP_UNLIKELY(++t->pend_ops >= 64)) flush_slot(ix, t);
    return;
  }
  count_ns_switch(ix, t, ns, c, n);
}

static inline void count_part(struct umbp_index *ix, struct tl_slot *t, int part, int c, uint64_t n) {
  if (part < 0 || !ix->ctr) return;
  if (t->ctr_part != part) {
    flush_slot(ix, t);
    t->ctr_part = part;
  }
  t->pend_part[c] += n;
}

/* One single-key lookup, counted on the thread's reader line r, which the
 * lookup has just written: one add, no other line written. pin: a
 * umbp_lookup_pin(), whose hit also counts a pin and a hit of the slot's
 * partition. Single hits are bound by how many lookups' cache misses the core
 * keeps in flight: with the count in thread-local memory (one more line
 * written a lookup) they ran at 0.71-0.95x rte_hash, this way at 0.81-1.02x
 * (alternating A/B runs of both builds, 1M keys, ratios paired by repetition). */
static inline void count_single(struct umbp_index *ix, struct tl_slot *t, struct umbp_reader_shm *r, uint32_t ns,
                                bool hit, bool pin, int part) {
  if (UMBP_LIKELY(t->ctr_ns == ns && (!pin || !hit || t->ctr_part == part))) {
    uint64_t v = r->pend_lookups + (hit ? (1ull << 32) + 1 : 1);
    r->pend_lookups = v;
    if (pin) r->pend_pins += hit;
    if (UMBP_UNLIKELY((uint32_t)v >= 64)) flush_slot(ix, t);
    return;
  }
  count_ns(ix, t, ns, hit ? UMBP_CTR_HITS : UMBP_CTR_MISSES, 1);
  if (pin && hit) {
    count_ns(ix, t, ns, UMBP_CTR_PINS, 1);
    count_part(ix, t, part, UMBP_CTR_HITS, 1);
  }
}

UMBP_API void umbp_counters_flush(umbp_pool *p) {
  if (!p || !p->index) return;
  for (unsigned i = 0; i < TL_MAX; i++)
    if (tl.s[i].instance == p->index->instance) flush_slot(p->index, &tl.s[i]);
}

/* ---- keys ------------------------------------------------------------------- */
static __attribute__((noinline, cold)) int key_fail(const umbp_key *k) {
  if (!k) return umbp_fail(-EINVAL, "key is NULL");
  return umbp_fail(-EINVAL, "block hash length %u is invalid: use 1 to %d bytes", k->hash_len, UMBP_HASH_MAX);
}

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
 * those loads (a copy stored as 8-byte words measured lower single hits,
 * 0.73-1.05x rte_hash against 0.88-1.16x, in runs whose code placement was
 * not controlled). The hash reloads the words as 8-byte loads, which
 * forwarding serves from the wider stores. Writing the copy directly, not
 * through a second array: 12 instructions fewer a key (callgrind, batched
 * misses: stage 1 76 -> 64 a key; umbp_contains hits 177.7 -> 167.7), and
 * single hits at 0.99x median against 0.90x (eight alternating rounds). */
static inline uint64_t ld64(const void *p, unsigned i) {
  uint64_t v;
  memcpy(&v, (const char *)p + 8 * i, 8);
  return v;
}

static inline int key_load(const umbp_key *k, struct umbp_key_shm *out, uint64_t *h) {
  if (UMBP_UNLIKELY(!k || k->hash_len - 1u >= UMBP_HASH_MAX)) {
    memset(out, 0, sizeof *out);
    *h = 0;
    return key_fail(k);
  }
  unsigned len = k->hash_len;
  const unsigned char *b = (const unsigned char *)k;
  unsigned char *o = (unsigned char *)out;
#if defined(__SSE2__)
  _mm_storeu_si128((__m128i *)(void *)o, _mm_and_si128(_mm_loadu_si128((const __m128i *)(const void *)b),
                                                       _mm_set_epi64x(0x00ffffffffffffffll, -1)));
#else
  uint64_t w[2];
  memcpy(w, b, 16);
  w[1] &= 0x00ffffffffffffffull;
  memcpy(o, w, 16);
#endif
  memcpy(o + 16, b + offsetof(umbp_key, hash), UMBP_HASH_MAX);
  if (UMBP_UNLIKELY(len < UMBP_HASH_MAX)) memset(o + 16 + len, 0, UMBP_HASH_MAX - len);
  *h = umbp_key_hash6(ld64(o, 0), ld64(o, 1), ld64(o, 2), ld64(o, 3), ld64(o, 4), ld64(o, 5));
  return 0;
}

static void key_from_shm(const struct umbp_key_shm *s, umbp_key *k) {
  memset(k, 0, sizeof *k);
  k->ns = s->ns;
  k->tp_rank = s->tp;
  k->pcp_rank = s->pcp;
  k->dcp_rank = s->dcp;
  k->pp_rank = s->pp;
  k->group = s->group;
  k->hash_len = s->hash_len > UMBP_HASH_MAX ? UMBP_HASH_MAX : s->hash_len;
  memcpy(k->hash, s->hash, k->hash_len);
}

/* Word-wise, with one branch on the result instead of one per 16 bytes. With
 * the table in L3 (--keys 262144) single hits went from 0.63-0.77x to
 * 0.94-1.13x rte_hash against the memcmp() form (A/B of both builds). */
static inline bool key_eq(const struct umbp_key_shm *a, const struct umbp_key_shm *b) {
#if defined(__SSE2__)
  /* Three 16-byte loads of each key, as GCC's vectorised loop of the scalar
   * form below did, without the loop's counter and branch: umbp_contains
   * hits 167.7 -> 151.7 instructions (callgrind); single hits 1.00x rte_hash
   * median against 0.97x (eight alternating rounds, code placement equal). */
  const __m128i *x = (const __m128i *)(const void *)a, *y = (const __m128i *)(const void *)b;
  __m128i d = _mm_or_si128(_mm_or_si128(_mm_xor_si128(_mm_loadu_si128(x), _mm_loadu_si128(y)),
                                        _mm_xor_si128(_mm_loadu_si128(x + 1), _mm_loadu_si128(y + 1))),
                           _mm_xor_si128(_mm_loadu_si128(x + 2), _mm_loadu_si128(y + 2)));
  return _mm_movemask_epi8(_mm_cmpeq_epi8(d, _mm_setzero_si128())) == 0xffff;
#else
  uint64_t d = 0;
  for (unsigned i = 0; i < 6; i++) d |= ld64(a, i) ^ ld64(b, i);
  return d == 0;
#endif
}


/* ---- regions ------------------------------------------------------------------- */
static inline int slot_part(const umbp_pool *p, uint32_t slot) {
  const struct umbp_shm_header *h = p->hdr;
  for (unsigned i = 0; i < h->n_partitions; i++)
    if (slot - h->partitions[i].first_slot < h->partitions[i].slot_count) return (int)i;
  return -1;
}

UMBP_API int umbp_slot_partition(const umbp_pool *p, uint32_t slot) {
  if (!p || slot >= p->hdr->slot_count) return -1;
  return slot_part(p, slot);
}

UMBP_API void *umbp_slot_ptr(umbp_pool *p, uint32_t slot) {
  if (!p || slot >= p->hdr->slot_count) return NULL;
  int part = slot_part(p, slot);
  if (part < 0) return NULL;
  const struct umbp_partition_desc *d = &p->hdr->partitions[part];
  return umbp_pool_at(p, d->offset + (uint64_t)(slot - d->first_slot) * p->hdr->slot_size, p->hdr->slot_size);
}

UMBP_API uint64_t umbp_slot_size(const umbp_pool *p) { return p ? p->hdr->slot_size : 0; }
UMBP_API uint32_t umbp_slot_count(const umbp_pool *p) { return p ? p->hdr->slot_count : 0; }

static void *part_ring(umbp_pool *p, unsigned part) {
  return (char *)p->base + p->hdr->partitions[part].ring_offset;
}

int umbp_index_init_regions(umbp_pool *p) {
  struct umbp_shm_header *h = p->hdr;
  struct umbp_index_hdr *ih = umbp_pool_region(p, UMBP_REG_INDEXHDR);
  atomic_store_explicit(&ih->epoch, 1, memory_order_relaxed);
  atomic_store_explicit(&ih->low_watermark_pct, 5, memory_order_relaxed);
  atomic_store_explicit(&ih->high_watermark_pct, 10, memory_order_relaxed);
  struct umbp_slot_meta *meta = umbp_pool_region(p, UMBP_REG_SLOTMETA);
  for (uint32_t s = 0; s < h->slot_count; s++) atomic_store_explicit(&meta[s].state, ST_MAKE(UMBP_SLOT_FREE, 0, 1), memory_order_relaxed);
  for (unsigned i = 0; i < h->n_partitions; i++) {
    const struct umbp_partition_desc *d = &h->partitions[i];
    uint32_t cap = 2;
    while (cap < d->slot_count) cap <<= 1;
    void *ring = part_ring(p, i);
    int rc = umbp_ring_init(ring, d->ring_bytes, cap, sizeof(uint64_t));
    if (rc) return umbp_fail(rc, "cannot initialise the free-slot queue of partition %u", i);
    for (uint32_t s = 0; s < d->slot_count;) {
      uint64_t batch[256];
      unsigned n = 0;
      while (n < 256 && s < d->slot_count) batch[n++] = d->first_slot + s++;
      unsigned put = umbp_ring_enqueue_burst(ring, batch, n, 0xffff);
      if (put != n) return umbp_fail(-EBADMSG, "free-slot queue of partition %u overflowed at init", i);
    }
  }
  int rc = umbp_ring_init(umbp_pool_region(p, UMBP_REG_EVENTS), h->regions[UMBP_REG_EVENTS].size,
                          h->event_capacity, sizeof(struct umbp_event_shm));
  if (rc) return umbp_fail(rc, "cannot initialise the event ring");
  return 0;
}

uint64_t umbp_index_free_slots(umbp_pool *p, unsigned part) {
  if (part >= p->hdr->n_partitions) return 0;
  if (p->index) return umbp_ring_count(p->index->rings[part]); /* checked at attach */
  void *ring = part_ring(p, part);
  if (umbp_ring_check_header(ring, p->hdr->partitions[part].ring_bytes)) return 0;
  return umbp_ring_count(ring);
}

_Static_assert(offsetof(struct umbp_index, limbo_mu) % 64 == 0 &&
                   offsetof(struct umbp_index, memb) / 64 < offsetof(struct umbp_index, limbo_mu) / 64,
               "the limbo mutex is on a line no lookup reads");

int umbp_index_attach_hook(umbp_pool *p) {
  /* 64-byte aligned: the writers' fields have lines of their own (index_internal.h) */
  size_t ixsz = (sizeof(struct umbp_index) + 63) & ~(size_t)63;
  struct umbp_index *ix = aligned_alloc(64, ixsz);
  if (!ix) return -ENOMEM;
  memset(ix, 0, ixsz);
  struct umbp_shm_header *h = p->hdr;
  ix->p = p;
  ix->ih = umbp_pool_region(p, UMBP_REG_INDEXHDR);
  ix->buckets = umbp_pool_region(p, UMBP_REG_BUCKETS);
  ix->nb = h->n_buckets;
  ix->meta = umbp_pool_region(p, UMBP_REG_SLOTMETA);
  ix->pins = umbp_pool_region(p, UMBP_REG_PINS);
  ix->pin_stride = umbp_pin_stride(h->slot_count);
  ix->ns = umbp_pool_region(p, UMBP_REG_NAMESPACES);
  ix->slot_count = h->slot_count;
  ix->slot_size = h->slot_size;
  ix->events = umbp_pool_region(p, UMBP_REG_EVENTS);
  if (umbp_ring_check_header(ix->events, h->regions[UMBP_REG_EVENTS].size)) {
    free(ix);
    return umbp_fail(-EBADMSG, "pool '%s': the event ring header is corrupted", p->name);
  }
  for (unsigned i = 0; i < h->n_partitions; i++) {
    ix->rings[i] = part_ring(p, i);
    if (umbp_ring_check_header(ix->rings[i], h->partitions[i].ring_bytes)) {
      free(ix);
      return umbp_fail(-EBADMSG, "pool '%s': the free-slot queue of partition %u is corrupted", p->name, i);
    }
  }
  if (p->proc_slot >= 0) {
    ix->readers = (struct umbp_reader_shm *)umbp_pool_region(p, UMBP_REG_READERS) +
                  (size_t)p->proc_slot * UMBP_MAX_THREADS;
    ix->ctr = (struct umbp_counter_row *)umbp_pool_region(p, UMBP_REG_COUNTERS) + p->proc_slot;
    /* membarrier mode is the segment's choice; a process that cannot register fences itself */
    ix->memb = (h->compat_features & UMBP_FEAT_COMPAT_MEMBARRIER) && umbp_membarrier_supported();
    if ((h->compat_features & UMBP_FEAT_COMPAT_MEMBARRIER) && !ix->memb) {
      free(ix);
      return umbp_fail(-ENOSYS, "pool '%s' relies on membarrier(GLOBAL_EXPEDITED), which this process "
                                "cannot use (seccomp?): allow the membarrier syscall",
                       p->name);
    }
  }
  pthread_mutex_init(&ix->limbo_mu, NULL);
  pthread_mutex_lock(&inst_mu);
  ix->instance = next_instance++;
  for (unsigned i = 0; i < 64; i++)
    if (!instances[i]) {
      instances[i] = ix;
      break;
    }
  pthread_mutex_unlock(&inst_mu);
  p->index = ix;
  /* adopt retired slots a reaper left under our id */
  if (p->proc_slot >= 0 && atomic_exchange(&p->procs[p->proc_slot].orphans, 0)) {
    for (uint32_t s = 0; s < ix->slot_count; s++) {
      uint64_t w = atomic_load_explicit(&ix->meta[s].state, memory_order_acquire);
      if (ST_STATE(w) == UMBP_SLOT_RETIRED && ST_OWNER(w) == p->owner_id) {
        if (ix->nlimbo == ix->limbo_cap) {
          size_t nc = ix->limbo_cap ? ix->limbo_cap * 2 : 1024;
          uint32_t *nl = realloc(ix->limbo, nc * sizeof *nl);
          if (!nl) break;
          ix->limbo = nl;
          ix->limbo_cap = nc;
        }
        ix->limbo[ix->nlimbo++] = s;
      }
    }
    atomic_store_explicit(&ix->limbo_n, ix->nlimbo, memory_order_relaxed);
  }
  return 0;
}

void umbp_index_detach_hook(umbp_pool *p) {
  struct umbp_index *ix = p->index;
  if (!ix) return;
  umbp_evictor_stop(p);
  umbp_counters_flush(p);
  /* give back what we can (readers leave their sections within microseconds:
   * wait up to 50 ms); what is left stays RETIRED under our id, for the next
   * process that claims our registry slot or for a reaper's orphan sweep */
  reclaim_wait(p, 50000000);
  if (ix->nlimbo && p->proc_slot >= 0) atomic_store(&p->procs[p->proc_slot].orphans, 1);
  /* pins still held protect reads that cannot go on once the mapping is gone:
   * release them, or their blocks would stay unevictable, and be inherited
   * by the next process in our registry slot */
  if (p->proc_slot >= 0)
    pins_drop_proc(ix->pins, ix->pin_stride, ix->ih, ix->slot_count, (unsigned)p->proc_slot);
  pthread_mutex_lock(&inst_mu);
  for (unsigned i = 0; i < 64; i++)
    if (instances[i] == ix) instances[i] = NULL;
  for (unsigned i = 0; i < TL_MAX; i++)
    if (tl.s[i].instance == ix->instance) tl.s[i].instance = 0;
  pthread_mutex_unlock(&inst_mu);
  if (p->proc_slot >= 0) atomic_store(&p->procs[p->proc_slot].thread_bits, 0);
  pthread_mutex_destroy(&ix->limbo_mu);
  free(ix->limbo);
  free(ix);
  p->index = NULL;
}

/* ---- namespaces ----------------------------------------------------------- */
/* One failed round of taking an owner-id lock that `cur` holds (0: free):
 * true when the holder died and the caller may steal it (its critical
 * sections leave the table consistent at every store, see publish());
 * otherwise spin, then back off to sleeping after 100000 rounds. */
static bool lock_wait(umbp_pool *p, unsigned spins, uint32_t cur) {
  if (cur && (spins & 1023) == 1023 && !umbp_registry_alive(p, cur - 1)) return true;
  umbp_cpu_relax();
  if (spins > 100000) {
    struct timespec ts = {0, 50000};
    nanosleep(&ts, NULL);
  }
  return false;
}

static void spin_lock_owner(umbp_pool *p, _Atomic uint32_t *lock) {
  uint32_t me = p->owner_id;
  for (unsigned spins = 0;; spins++) {
    uint32_t cur = 0;
    if (atomic_compare_exchange_weak_explicit(lock, &cur, me, memory_order_acquire, memory_order_relaxed)) return;
    if (lock_wait(p, spins, cur) &&
        atomic_compare_exchange_strong_explicit(lock, &cur, me, memory_order_acquire, memory_order_relaxed))
      return;
  }
}

static void spin_unlock(_Atomic uint32_t *lock) { atomic_store_explicit(lock, 0, memory_order_release); }

/* The same for a bucket's 16-bit inserter lock. */
static void bucket_lock(umbp_pool *p, _Atomic uint16_t *lock) {
  uint16_t me = (uint16_t)p->owner_id;
  for (unsigned spins = 0;; spins++) {
    uint16_t cur = 0;
    if (atomic_compare_exchange_weak_explicit(lock, &cur, me, memory_order_acquire, memory_order_relaxed)) return;
    if (lock_wait(p, spins, cur) &&
        atomic_compare_exchange_strong_explicit(lock, &cur, me, memory_order_acquire, memory_order_relaxed))
      return;
  }
}

static void bucket_unlock(_Atomic uint16_t *lock) { atomic_store_explicit(lock, 0, memory_order_release); }

/* ---- namespace block counts ------------------------------------------------
 * A namespace's used_slots counts its slots whose counted flag is 1 (set at
 * publish, cleared when the slot leaves the index). The flag and the count are
 * two words, so a process killed between the two stores would leave the count
 * off by one for the pool's life (it did, with a bare fetch-add: 1 kill in ~300
 * of the kill test under ASan). So both change under the namespace's count
 * lock and after a journal entry (struct umbp_ns_shm): cnt_old (the count
 * before), cnt_flag (the new flag), then cnt_slot = slot + 1 marks it valid.
 * Only a lock holder writes any of these words, so a holder that finds a valid
 * journal knows the previous holder died inside the change and redoes it with
 * absolute stores: flag = cnt_flag, count = cnt_old +- 1. That is right
 * whether the dead holder got to neither store, one or both, and a redoer
 * killed in turn leaves the same journal for the next. A journal written only
 * in part is not yet valid (cnt_slot is stored last) and nothing else was
 * written. A dead holder's lock is taken over as bucket locks are
 * (lock_wait()), or released by its reaper after the same redo. */
static void ns_count_redo(struct umbp_ns_shm *n, struct umbp_slot_meta *meta, uint32_t slot_count) {
  uint32_t j = atomic_load_explicit(&n->cnt_slot, memory_order_relaxed);
  if (!j) return;
  uint8_t f = atomic_load_explicit(&n->cnt_flag, memory_order_relaxed);
  uint64_t old = atomic_load_explicit(&n->cnt_old, memory_order_relaxed);
  if (j - 1 < slot_count) atomic_store_explicit(&meta[j - 1].counted, f, memory_order_relaxed);
  atomic_store_explicit(&n->used_slots, f ? old + 1 : old - 1, memory_order_relaxed);
  atomic_store_explicit(&n->cnt_slot, 0, memory_order_relaxed);
}

static void ns_count_lock(umbp_pool *p, struct umbp_ns_shm *n, struct umbp_slot_meta *meta, uint32_t slot_count) {
  spin_lock_owner(p, &n->cnt_lock);
  ns_count_redo(n, meta, slot_count);
}

/* Set slot s's counted flag to f (0 or 1), moving namespace ns's count with
 * it; nothing when the flag already is f. The caller owns the slot's state
 * (RESERVED or EVICTING under its id, or a dead owner's, as its reaper), so no
 * one else changes this flag meanwhile. */
static void ns_count_set(umbp_pool *p, struct umbp_ns_shm *nss, struct umbp_slot_meta *meta, uint32_t slot_count,
                         uint32_t ns, uint32_t s, uint8_t f) {
  if (ns >= UMBP_MAX_NAMESPACES || s >= slot_count) return;
  if (atomic_load_explicit(&meta[s].counted, memory_order_relaxed) == f) return;
  struct umbp_ns_shm *n = &nss[ns];
  ns_count_lock(p, n, meta, slot_count);
  uint64_t old = atomic_load_explicit(&n->used_slots, memory_order_relaxed);
  atomic_store_explicit(&n->cnt_old, old, memory_order_relaxed);
  atomic_store_explicit(&n->cnt_flag, f, memory_order_relaxed);
  /* release: a redoer that sees the journal valid sees its fields (x86 keeps
   * stores in order anyway; this names the order for the compiler and others) */
  atomic_store_explicit(&n->cnt_slot, s + 1, memory_order_release);
  atomic_store_explicit(&meta[s].counted, f, memory_order_release);
  atomic_store_explicit(&n->used_slots, f ? old + 1 : old - 1, memory_order_release);
  atomic_store_explicit(&n->cnt_slot, 0, memory_order_release);
  spin_unlock(&n->cnt_lock);
}

/* A dead process's count locks (called by its reaper): taken over (unless a
 * live process took one over first and so redoes it), redone, released. */
static void ns_count_locks_reap(umbp_pool *p, struct umbp_ns_shm *nss, struct umbp_slot_meta *meta,
                                uint32_t slot_count, uint32_t dead) {
  for (unsigned i = 0; i < UMBP_MAX_NAMESPACES; i++) {
    uint32_t cur = dead;
    if (!atomic_compare_exchange_strong_explicit(&nss[i].cnt_lock, &cur, p->owner_id, memory_order_acquire,
                                                 memory_order_relaxed))
      continue;
    ns_count_redo(&nss[i], meta, slot_count);
    spin_unlock(&nss[i].cnt_lock);
  }
}

static int ns_find(struct umbp_index *ix, const char *name, size_t len) {
  for (unsigned i = 0; i < UMBP_MAX_NAMESPACES; i++) {
    struct umbp_ns_shm *n = &ix->ns[i];
    if (atomic_load_explicit(&n->state, memory_order_acquire) != 1) continue;
    if (n->name_len == len && !memcmp(n->name, name, len)) return (int)i;
  }
  return -1;
}

static int ns_check_name(const char *name, size_t *len) {
  *len = 0;
  if (!name) return umbp_fail(-EINVAL, "namespace name is NULL");
  *len = strlen(name);
  if (*len == 0 || *len > 128)
    return umbp_fail(-EINVAL, "namespace name is %zu bytes: use 1 to 128", *len);
  return 0;
}

UMBP_API int umbp_ns_lookup(umbp_pool *p, const char *name, uint32_t *ret_id) {
  size_t len;
  if (!p || !ret_id) return -EINVAL;
  int rc = ns_check_name(name, &len);
  if (rc) return rc;
  struct umbp_ns_shm *ns = umbp_pool_region(p, UMBP_REG_NAMESPACES);
  for (unsigned i = 0; i < UMBP_MAX_NAMESPACES; i++) {
    if (atomic_load_explicit(&ns[i].state, memory_order_acquire) != 1) continue;
    if (ns[i].name_len == len && !memcmp(ns[i].name, name, len)) {
      *ret_id = ns[i].id;
      return 0;
    }
  }
  return -ENOENT;
}

UMBP_API int umbp_ns_register(umbp_pool *p, const char *name, uint32_t *ret_id) {
  size_t len;
  if (!p || !ret_id) return umbp_fail(-EINVAL, "umbp_ns_register: pool and ret_id are required");
  int rc = ns_check_name(name, &len);
  if (rc) return rc;
  if (umbp_ns_lookup(p, name, ret_id) == 0) return 0;
  if (p->read_only || !p->index) return umbp_fail(-EROFS, "pool is attached read-only: cannot register namespaces");
  struct umbp_index *ix = p->index;
  spin_lock_owner(p, &ix->ih->ns_lock);
  int i = ns_find(ix, name, len);
  if (i < 0) {
    for (unsigned k = 0; k < UMBP_MAX_NAMESPACES; k++)
      if (atomic_load_explicit(&ix->ns[k].state, memory_order_relaxed) == 0) {
        struct umbp_ns_shm *n = &ix->ns[k];
        n->id = k; /* ids are table positions: stable for the pool's life */
        n->name_len = (uint32_t)len;
        memset(n->name, 0, sizeof n->name);
        memcpy(n->name, name, len);
        atomic_store_explicit(&n->quota_bytes, 0, memory_order_relaxed);
        /* pairs with the acquire loads in ns_find / umbp_ns_lookup */
        atomic_store_explicit(&n->state, 1, memory_order_release);
        atomic_fetch_add(&ix->ih->n_namespaces, 1);
        i = (int)k;
        break;
      }
  }
  spin_unlock(&ix->ih->ns_lock);
  if (i < 0) return umbp_fail(-ENOSPC, "all %d namespaces of the pool are in use", UMBP_MAX_NAMESPACES);
  *ret_id = (uint32_t)i;
  return 0;
}

UMBP_API int umbp_ns_name(umbp_pool *p, uint32_t id, char *buf, size_t n) {
  if (!p || !buf || !n || id >= UMBP_MAX_NAMESPACES) return -EINVAL;
  struct umbp_ns_shm *ns = (struct umbp_ns_shm *)umbp_pool_region(p, UMBP_REG_NAMESPACES) + id;
  if (atomic_load_explicit(&ns->state, memory_order_acquire) != 1) return -ENOENT;
  size_t l = ns->name_len < 128 ? ns->name_len : 128;
  if (l >= n) l = n - 1;
  memcpy(buf, ns->name, l);
  buf[l] = 0;
  return 0;
}

UMBP_API int umbp_ns_info_get(umbp_pool *p, uint32_t id, umbp_ns_info *ret) {
  if (!p || !ret || id >= UMBP_MAX_NAMESPACES) return -EINVAL;
  struct umbp_ns_shm *ns = (struct umbp_ns_shm *)umbp_pool_region(p, UMBP_REG_NAMESPACES) + id;
  if (atomic_load_explicit(&ns->state, memory_order_acquire) != 1) return -ENOENT;
  umbp_ns_info i;
  memset(&i, 0, sizeof i);
  i.id = id;
  size_t l = ns->name_len < 128 ? ns->name_len : 128;
  memcpy(i.name, ns->name, l);
  i.blocks = atomic_load_explicit(&ns->used_slots, memory_order_relaxed);
  i.bytes = i.blocks * p->hdr->slot_size;
  i.quota_bytes = atomic_load_explicit(&ns->quota_bytes, memory_order_relaxed);
  *ret = i;
  return 0;
}

UMBP_API int umbp_ns_count(umbp_pool *p) {
  if (!p) return -EINVAL;
  const struct umbp_ns_shm *ns = umbp_pool_region(p, UMBP_REG_NAMESPACES);
  int n = 0;
  for (unsigned i = 0; i < UMBP_MAX_NAMESPACES; i++) n += atomic_load_explicit(&ns[i].state, memory_order_acquire) == 1;
  return n;
}

UMBP_API int umbp_ns_set_quota(umbp_pool *p, uint32_t id, uint64_t bytes) {
  if (!p || id >= UMBP_MAX_NAMESPACES) return umbp_fail(-EINVAL, "namespace id %u is out of range", id);
  if (p->read_only) return -EROFS;
  struct umbp_ns_shm *ns = (struct umbp_ns_shm *)umbp_pool_region(p, UMBP_REG_NAMESPACES) + id;
  if (atomic_load_explicit(&ns->state, memory_order_acquire) != 1)
    return umbp_fail(-ENOENT, "namespace %u is not registered", id);
  atomic_store_explicit(&ns->quota_bytes, bytes, memory_order_relaxed);
  return 0;
}

static bool ns_over_quota(struct umbp_index *ix, uint32_t ns) {
  if (ns >= UMBP_MAX_NAMESPACES) return false;
  uint64_t q = atomic_load_explicit(&ix->ns[ns].quota_bytes, memory_order_relaxed);
  if (!q) return false;
  return atomic_load_explicit(&ix->ns[ns].used_slots, memory_order_relaxed) * ix->slot_size >= q;
}

/* ---- events -------------------------------------------------------------- */
static void emit(struct umbp_index *ix, int type, const struct umbp_key_shm *k) {
  struct umbp_event_shm ev;
  memset(&ev, 0, sizeof ev);
  ev.type = (uint8_t)type;
  ev.key = *k;
  umbp_ring_enqueue_overwrite(ix->events, &ev, ix->p->owner_id);
}

UMBP_API int umbp_events_drain(umbp_pool *p, umbp_event *out, unsigned max) {
  if (!p || (!out && max)) return -EINVAL;
  if (p->read_only || !p->index) return umbp_fail(-EROFS, "draining events needs a read-write attachment");
  unsigned n = 0;
  while (n < max) {
    struct umbp_event_shm ev[16];
    unsigned want = max - n < 16 ? max - n : 16;
    unsigned got = umbp_ring_dequeue_burst(p->index->events, ev, want, p->owner_id);
    for (unsigned i = 0; i < got; i++) {
      out[n + i].type = ev[i].type;
      key_from_shm(&ev[i].key, &out[n + i].key);
    }
    n += got;
    if (got < want) break;
  }
  return (int)n;
}

UMBP_API uint64_t umbp_events_dropped(umbp_pool *p) {
  if (!p) return 0;
  return umbp_ring_dropped(umbp_pool_region(p, UMBP_REG_EVENTS));
}

UMBP_API void umbp_events_enable_stored(umbp_pool *p, bool on) {
  if (p && p->index) atomic_store(&p->index->ev_stored, on);
}

/* ---- probing ------------------------------------------------------------------- */
/* Find the slot holding key k (hash h). Caller is inside a read section.
 * Returns the slot or UMBP_NO_SLOT; *ret_st gets the state word seen. */
#if defined(__SANITIZE_THREAD__)
#define UMBP_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define UMBP_TSAN 1
#endif
#endif

#if defined(__x86_64__) && defined(__SSE2__) && !defined(UMBP_TSAN)
#include <emmintrin.h>
/* The ways of bucket b whose signature is sig, as a bit mask. SSE2: the
 * twelve 8-bit signatures (bytes 0..11 of the line) in one vector compare.
 * The signatures are a hint only — each candidate's slot word is loaded with
 * acquire order before it is followed (bucket_slot()) and its key compared —
 * so a way changing underneath costs a wasted look, never a wrong answer.
 * (Under TSan the scalar loop below is used: it does not model this.) */
/* *ovf: the bucket's overflow word, taken from the same 16-byte load (bytes
 * 14..15) rather than loaded again: a lookup that misses loads its bucket
 * line once, and how many loads wait on a missing line sets how many
 * lookups' misses the core keeps in flight. The compiler barrier gives the
 * word acquire order for what the probe reads next (x86 keeps loads in
 * order). */
_Static_assert(offsetof(struct umbp_bucket, overflow) == 14, "overflow is word 7 of the bucket's first 16 bytes");
static inline unsigned bucket_match(struct umbp_bucket *b, uint8_t sig, unsigned *ovf) {
  __m128i l0 = _mm_load_si128((const __m128i *)(const void *)b);
  unsigned m = (unsigned)_mm_movemask_epi8(_mm_cmpeq_epi8(l0, _mm_set1_epi8((char)sig)));
  *ovf = (unsigned)_mm_extract_epi16(l0, 7);
  atomic_signal_fence(memory_order_acquire);
  return m & ((1u << UMBP_BUCKET_WAYS) - 1);
}

/* The ways of bucket b whose whole 16-bit signature is sig: bucket_match()'s
 * hint mask ANDed with a compare of the twelve slot words' top bytes (three
 * 16-byte loads of the same line, after the hint load: x86 keeps loads in
 * order, and an inserter stores the slot word before the hint, so a hint seen
 * set brings its slot word). A different key's low byte matches one of ~7
 * ways (load factor 0.9) 1 time in 36; its whole signature, 1 in 9000. The
 * single-key probe branches on this mask with its bucket line still in
 * flight, so a chance hint match there is a mispredicted branch that waits
 * for memory. 16 instructions a call more (umbp_contains misses 126.5 ->
 * 142.7, callgrind), and over 7-11 alternating rounds of both builds single
 * hits went 0.85-0.93x -> 0.89-0.98x rte_hash and single misses at load
 * factor 0.9 (one process) 1.00x -> 1.07x (docs/bench-index.md). The batched
 * probe, whose lines were prefetched, keeps the hint mask alone: there the
 * same filter measured batched misses lower (1.14x -> 1.03x, three rounds). */
static inline unsigned bucket_match16(struct umbp_bucket *b, uint16_t sig, unsigned *ovf) {
  unsigned m = bucket_match(b, (uint8_t)sig, ovf);
  const __m128i *sw = (const __m128i *)(const void *)b->slot;
  __m128i hv = _mm_set1_epi8((char)(sig >> 8));
  __m128i e0 = _mm_cmpeq_epi8(_mm_load_si128(sw), hv);
  __m128i e1 = _mm_cmpeq_epi8(_mm_load_si128(sw + 1), hv);
  __m128i e2 = _mm_cmpeq_epi8(_mm_load_si128(sw + 2), hv);
  /* A slot word's byte compares read as a signed 32-bit lane are negative
   * iff its top byte matched; the signed saturating packs keep each lane's
   * sign, so the twelve ways' results land, in way order, in the sign bits
   * of bytes 0..11. */
  return m & (unsigned)_mm_movemask_epi8(_mm_packs_epi16(_mm_packs_epi32(e0, e1), _mm_packs_epi32(e2, e2)));
}
#else
static inline unsigned bucket_match(struct umbp_bucket *b, uint8_t sig, unsigned *ovf) {
  unsigned mask = 0;
  for (unsigned w = 0; w < UMBP_BUCKET_WAYS; w++)
    mask |= (unsigned)(atomic_load_explicit(&b->sig[w], memory_order_relaxed) == sig) << w;
  *ovf = atomic_load_explicit(&b->overflow, memory_order_acquire);
  return mask;
}
/* the high signature bytes are checked by match_ways() (way_x()) */
static inline unsigned bucket_match16(struct umbp_bucket *b, uint16_t sig, unsigned *ovf) {
  return bucket_match(b, (uint8_t)sig, ovf);
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

/* The slot of way word x (way_x()) if it holds key k published, else
 * UMBP_NO_SLOT. */
static inline uint32_t way_check(struct umbp_index *ix, uint32_t x, const struct umbp_key_shm *k, uint64_t *ret_st) {
  uint32_t s = x - 1;
  if (UMBP_UNLIKELY(s >= ix->slot_count)) return UMBP_NO_SLOT; /* empty, or garbage from a buggy writer */
  struct umbp_slot_meta *m = &ix->meta[s];
  if (!key_eq(&m->key, k)) return UMBP_NO_SLOT;
  uint64_t st = atomic_load_explicit(&m->state, memory_order_acquire);
  if (ST_STATE(st) != UMBP_SLOT_PUBLISHED) return UMBP_NO_SLOT;
  *ret_st = st;
  return s;
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
    uint32_t s = way_check(ix, x, k, ret_st);
    if (s != UMBP_NO_SLOT) return s;
  }
  return UMBP_NO_SLOT;
}

/* The buckets after home that keys homed there may live in: up to the reach
 * its overflow word ovf gives. Out of line: 3.1% of homes overflow at load
 * factor 0.9 (1M keys), 0.02% at 0.5. */
static __attribute__((noinline)) uint32_t probe_far(struct umbp_index *ix, const struct umbp_key_shm *k,
                                                   uint32_t home, uint16_t sig, unsigned ovf, uint64_t *ret_st,
                                                   bool pin) {
  unsigned reach = UMBP_OVF_REACH(ovf);
  if (reach >= UMBP_MAX_PROBE) reach = UMBP_MAX_PROBE - 1;
  for (unsigned d = 1; d <= reach; d++) {
    struct umbp_bucket *b = &ix->buckets[umbp_bucket_at(home, d, ix->nb)];
    unsigned o;
    uint32_t s = match_ways(ix, b, bucket_match16(b, sig, &o), sig, k, ret_st, pin);
    if (s != UMBP_NO_SLOT) return s;
  }
  return UMBP_NO_SLOT;
}

/* Find k: the home bucket's ways, then, only if keys homed there overflowed,
 * the buckets after it. A miss in a home that never overflowed (the common
 * case) ends after one bucket line and one branch on its overflow word.
 * Always inlined (as probe() is): the single-key calls are the hot path. */
static inline __attribute__((always_inline)) uint32_t probe_x(struct umbp_index *ix, const struct umbp_key_shm *k,
                                                              uint64_t h, uint64_t *ret_st, bool pin) {
  uint32_t home = umbp_bucket_home(h, ix->nb);
  uint16_t sig = umbp_key_sig(h);
  struct umbp_bucket *b = &ix->buckets[home];
  unsigned ovf;
  uint32_t s = match_ways(ix, b, bucket_match16(b, sig, &ovf), sig, k, ret_st, pin);
  if (s != UMBP_NO_SLOT || UMBP_LIKELY(ovf == 0)) return s;
  return probe_far(ix, k, home, sig, ovf, ret_st, pin);
}

static inline __attribute__((always_inline)) uint32_t probe(struct umbp_index *ix, const struct umbp_key_shm *k, uint64_t h, uint64_t *ret_st) {
  return probe_x(ix, k, h, ret_st, false);
}

static inline struct umbp_reader_shm *reader_of(struct umbp_index *ix, struct tl_slot *t) {
  return &ix->readers[t->tid];
}

/* Read-only handles have no reader line: their lookups are for inspection
 * only, bounds-checked, and may see a slot in mid-reuse (never crash). */
static struct umbp_reader_shm ro_reader;

static __attribute__((noinline, cold)) int ix_fail(umbp_pool *p) {
  if (!p) return umbp_fail(-EINVAL, "pool is NULL");
  return umbp_fail(-EROFS, "pool '%s' is attached read-only", p->name);
}

/* Inlined, its messages out of line: a umbp_lookup_pin() that misses went from
 * 185 to 160 instructions (callgrind; umbp_contains() 149, rte_hash_lookup() 212). */
static inline __attribute__((always_inline)) int ix_get(umbp_pool *p, struct umbp_index **ix, struct tl_slot **t) {
  *ix = NULL;
  *t = NULL;
  if (UMBP_UNLIKELY(!p || !p->index)) return ix_fail(p);
  *ix = p->index;
  *t = thread_slot(p->index);
  return UMBP_LIKELY(*t != NULL) ? 0 : -EUSERS;
}

/* Our bit in pin_procs, before our first pin: a remover that reads the mask
 * after its state CAS (seq_cst) and misses the bit cannot miss a pin that
 * pin_slot() then completes (the OR precedes the pin's seq_cst RMW). */
static __attribute__((noinline, cold)) void pin_bit_set(struct umbp_index *ix) {
  atomic_fetch_or_explicit(&ix->ih->pin_procs, 1ull << ix->p->proc_slot, memory_order_seq_cst);
  atomic_store_explicit(&ix->pin_bit, true, memory_order_relaxed);
}

static inline int pin_slot(struct umbp_index *ix, uint32_t s, uint64_t st) {
  if (UMBP_UNLIKELY(!atomic_load_explicit(&ix->pin_bit, memory_order_relaxed))) pin_bit_set(ix);
  _Atomic uint8_t *pb = pin_at(ix->pins, ix->pin_stride, ix->p->proc_slot, s);
  uint8_t old = atomic_fetch_add_explicit(pb, 1, memory_order_seq_cst);
  if (UMBP_UNLIKELY(old == 255)) {
    atomic_fetch_sub_explicit(pb, 1, memory_order_seq_cst);
    return -EOVERFLOW;
  }
  /* Dekker with try_evict(): pin store, then state load (both seq_cst) */
  if (atomic_load_explicit(&ix->meta[s].state, memory_order_seq_cst) != st) {
    atomic_fetch_sub_explicit(pb, 1, memory_order_release);
    return -ENOENT;
  }
  if (!atomic_load_explicit(&ix->meta[s].ref, memory_order_relaxed))
    atomic_store_explicit(&ix->meta[s].ref, 1, memory_order_relaxed);
  return 0;
}

UMBP_API int umbp_lookup_pin(umbp_pool *p, const umbp_key *key, uint32_t *ret_slot) {
  struct umbp_index *ix;
  struct tl_slot *t;
  struct umbp_key_shm k;
  int rc = ix_get(p, &ix, &t);
  if (rc) return rc;
  uint64_t h, st = 0;
  if ((rc = key_load(key, &k, &h))) return rc;
  if (!ret_slot) return -EINVAL;
  struct umbp_reader_shm *r = reader_of(ix, t);
  rd_lock(ix, r);
  uint32_t s = probe_x(ix, &k, h, &st, true);
  if (s != UMBP_NO_SLOT) rc = pin_slot(ix, s, st);
  else rc = -ENOENT;
  rd_unlock(r);
  count_single(ix, t, r, k.ns, rc == 0, true, rc == 0 ? slot_part(p, s) : -1);
  if (rc == 0) *ret_slot = s;
  return rc;
}

/* Count the hits and misses of n probed keys: one update per namespace run
 * (a batch's keys normally share one namespace). pins: also count each hit
 * as a pin held. */
static inline void count_lookups(struct umbp_index *ix, struct tl_slot *t, const struct umbp_key_shm *k,
                                 const uint32_t *s, unsigned n, bool pins) {
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
 * Stage 1 (bulk_prep, before the read section: it reads only the caller's
 * keys): convert each key, hash it, prefetch its home bucket. *one_ns:
 * whether all n keys share one namespace (counted with one update per
 * counter, count_bulk()). */
static int bulk_prep(struct umbp_index *ix, unsigned n, const umbp_key *keys, struct umbp_key_shm *k, uint64_t *h,
                     bool *one_ns) {
  uint32_t nsd = 0;
  for (unsigned i = 0; i < n; i++) {
    int rc = key_load(&keys[i], &k[i], &h[i]);
    if (UMBP_UNLIKELY(rc)) return rc;
    __builtin_prefetch(&ix->buckets[umbp_bucket_home(h[i], ix->nb)]);
    nsd |= k[i].ns ^ k[0].ns;
  }
  *one_ns = nsd == 0;
  return 0;
}

/* Stages 2 and 3, inside the read section: match each home bucket's hints
 * (prefetching the first candidate's metadata, and its pin line to pin), then
 * compare keys; anything else (a second candidate, an overflowed home) takes
 * the single-key probe. Results: slots[], and sts[] (state words, to pin)
 * or present[] (0/1) where given; returns the hits. Inlined into each caller
 * with pin constant: a miss then costs its stage 3 a load, a compare and its
 * stores. */
static inline __attribute__((always_inline)) unsigned probe_bulk(struct umbp_index *ix, unsigned n,
                                                                 const struct umbp_key_shm *k, const uint64_t *h,
                                                                 uint32_t *slots, uint64_t *sts, uint8_t *present,
                                                                 bool pin) {
  uint32_t cand[BULK_CHUNK];
  unsigned hits = 0;
  for (unsigned i = 0; i < n; i++) {
    struct umbp_bucket *b = &ix->buckets[umbp_bucket_home(h[i], ix->nb)];
    unsigned ovf;
    uint16_t sig = umbp_key_sig(h[i]);
    unsigned mask = bucket_match(b, (uint8_t)sig, &ovf);
    uint32_t s = UMBP_NO_SLOT;
    if (mask) {
      s = way_x(bucket_slot(b, (unsigned)__builtin_ctz(mask)), sig) - 1;
      if (s < ix->slot_count) {
        __builtin_prefetch(&ix->meta[s]);
        if (pin) prefetch_w((const void *)pin_at(ix->pins, ix->pin_stride, ix->p->proc_slot, s));
      } else {
        /* the hint matched by chance (or the way emptied since): a miss
         * unless other ways or later buckets may hold the key */
        s = (mask & (mask - 1)) || ovf ? UMBP_SLOW : UMBP_NO_SLOT;
      }
    } else if (ovf != 0) {
      s = UMBP_SLOW; /* keys homed here live further on */
    }
    cand[i] = s;
  }
  for (unsigned i = 0; i < n; i++) {
    uint32_t s = cand[i];
    uint64_t st = 0;
    if (s == UMBP_NO_SLOT) {
      /* no hint in the home bucket and nothing homed there overflowed: a miss */
    } else if (s != UMBP_SLOW && key_eq(&ix->meta[s].key, &k[i])) {
      st = atomic_load_explicit(&ix->meta[s].state, memory_order_acquire);
      if (ST_STATE(st) != UMBP_SLOT_PUBLISHED) s = UMBP_NO_SLOT;
    } else {
      s = probe(ix, &k[i], h[i], &st); /* other ways, overflow buckets */
    }
    slots[i] = s;
    if (pin) sts[i] = st;
    if (present) present[i] = s != UMBP_NO_SLOT;
    hits += s != UMBP_NO_SLOT;
  }
  return hits;
}

/* Count n probed keys, `hits` of them hits: one update per counter when
 * they share one namespace (one_ns), else count_lookups(). */
static inline void count_bulk(struct umbp_index *ix, struct tl_slot *t, const struct umbp_key_shm *k,
                              const uint32_t *s, unsigned n, unsigned hits, bool one_ns, bool pins) {
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
  if (n && (!keys || !ret_slots)) return -EINVAL;
  struct umbp_reader_shm *r = reader_of(ix, t);
  int hits = 0;
  for (unsigned off = 0; off < n; off += BULK_CHUNK) {
    unsigned c = n - off < BULK_CHUNK ? n - off : BULK_CHUNK;
    struct umbp_key_shm k[BULK_CHUNK];
    uint32_t s[BULK_CHUNK];
    uint64_t st[BULK_CHUNK], h[BULK_CHUNK];
    bool one_ns;
    if ((rc = bulk_prep(ix, c, keys + off, k, h, &one_ns))) {
      umbp_unpin_bulk(p, off, ret_slots); /* undo: outputs only on success */
      return rc;
    }
    rd_lock(ix, r);
    probe_bulk(ix, c, k, h, s, st, NULL, true);
    unsigned ch = 0;
    for (unsigned i = 0; i < c; i++)
      if (s[i] != UMBP_NO_SLOT) {
        if (pin_slot(ix, s[i], st[i]) != 0) s[i] = UMBP_NO_SLOT;
        else ch++;
      }
    rd_unlock(r);
    memcpy(ret_slots + off, s, c * sizeof *s);
    count_bulk(ix, t, k, s, c, ch, one_ns, true);
    hits += (int)ch;
  }
  return hits;
}

UMBP_API int umbp_unpin(umbp_pool *p, uint32_t slot) {
  if (!p || !p->index) return -EINVAL;
  if (slot >= p->hdr->slot_count) return umbp_fail(-EINVAL, "slot %u is out of range", slot);
  _Atomic uint8_t *pb = pin_at(p->index->pins, p->index->pin_stride, p->proc_slot, slot);
  /* only this process writes its pin byte, but its threads race: a byte that
   * is 0 now cannot be ours to drop; one that is not stays >= 1 until we drop it
   * unless another of our threads unpins the same pin twice (a caller bug) */
  if (atomic_load_explicit(pb, memory_order_relaxed) == 0)
    return umbp_fail(-EINVAL, "slot %u is not pinned by this process", slot);
  /* release: our reads of the block happen before an evictor sees the pin gone */
  atomic_fetch_sub_explicit(pb, 1, memory_order_release);
  return 0;
}

UMBP_API int umbp_unpin_bulk(umbp_pool *p, unsigned n, const uint32_t *slots) {
  if (!p || (n && !slots)) return -EINVAL;
  int rc = 0;
  for (unsigned i = 0; i < n; i++)
    if (slots[i] != UMBP_NO_SLOT) {
      int r = umbp_unpin(p, slots[i]);
      if (r && !rc) rc = r;
    }
  return rc;
}

static int contains_impl(umbp_pool *p, unsigned n, const umbp_key *keys, uint8_t *present, bool prefix) {
  if (!p) return -EINVAL;
  if (n && !keys) return -EINVAL;
  struct umbp_index *ix = p->index;
  struct tl_slot *t = NULL;
  struct umbp_reader_shm *r = &ro_reader;
  struct umbp_index tmp;
  if (ix) {
    t = thread_slot(ix);
    if (!t) return -EUSERS;
    r = reader_of(ix, t);
  } else {
    /* read-only handle: a transient view of the regions */
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
    if (t) rd_lock(ix, r);
    if (c == 1) {
      s[0] = probe(ix, &k[0], h[0], &st[0]);
      hits = s[0] != UMBP_NO_SLOT;
      if (pr) pr[0] = (uint8_t)hits;
    } else {
      hits = probe_bulk(ix, c, k, h, s, NULL, pr, false);
    }
    if (t) rd_unlock(r);
    if (prefix) {
      for (hits = 0; hits < c && s[hits] != UMBP_NO_SLOT;) hits++;
      if (t) count_bulk(ix, t, k, s, hits < c ? hits + 1 : c, hits, one_ns, false); /* up to the first miss */
      count += (int)hits;
      if (hits < c) return count;
      continue;
    }
    if (t) count_bulk(ix, t, k, s, c, hits, one_ns, false);
    count += (int)hits;
  }
  return count;
}

UMBP_API int umbp_contains(umbp_pool *p, const umbp_key *key) {
  if (UMBP_UNLIKELY(!p || !key || !p->index)) return contains_impl(p, key ? 1 : 0, key, NULL, false);
  /* the single-key path, kept short: it is the scheduler's most frequent call */
  struct umbp_index *ix = p->index;
  struct tl_slot *t = thread_slot(ix);
  if (UMBP_UNLIKELY(!t)) return -EUSERS;
  struct umbp_key_shm k;
  uint64_t h, st;
  int rc = key_load(key, &k, &h);
  if (UMBP_UNLIKELY(rc)) return rc;
  struct umbp_reader_shm *r = reader_of(ix, t);
  rd_lock(ix, r);
  uint32_t s = probe(ix, &k, h, &st);
  rd_unlock(r);
  count_single(ix, t, r, k.ns, s != UMBP_NO_SLOT, false, -1);
  return s != UMBP_NO_SLOT;
}

UMBP_API int umbp_contains_bulk(umbp_pool *p, unsigned n, const umbp_key *keys, uint8_t *present) {
  return contains_impl(p, n, keys, present, false);
}

UMBP_API int umbp_prefix_probe(umbp_pool *p, unsigned n, const umbp_key *keys) {
  return contains_impl(p, n, keys, NULL, true);
}

/* ---- freeing and reclaiming ------------------------------------------------- */
/* Put slot s (state `w`, owned by us in RESERVED or RETIRED) back on its free
 * queue. The thread's ledger names s while it travels (see reap_proc()). */
/* The last free ring this process found stuck full (process-local). */
static void *_Atomic damaged_ring;

static void free_slot(umbp_pool *p, struct umbp_proc_slot *ledger_owner, unsigned tid, uint32_t s, uint16_t as_owner) {
  struct umbp_slot_meta *m = (struct umbp_slot_meta *)umbp_pool_region(p, UMBP_REG_SLOTMETA) + s;
  int part = slot_part(p, s);
  if (part < 0) return;
  atomic_store_explicit(&ledger_owner->inflight_slot[tid], s, memory_order_seq_cst);
  uint64_t w = atomic_load_explicit(&m->state, memory_order_acquire);
  atomic_store_explicit(&m->state, ST_NEXT(w, UMBP_SLOT_FREE, 0), memory_order_release);
  union ring_elem v = {.v = s};
  void *ring = part_ring(p, (unsigned)part);
  /* The ring has a cell per slot, so it is never full of slots; but a process
   * killed while it held a cell claimed blocks producers once they lap round
   * to that cell, until it is reaped. Reap it ourselves rather than wait. */
  uint64_t give_up = 0;
  for (unsigned spins = 0; umbp_ring_enqueue(ring, &v, as_owner) != 0; spins++) {
    umbp_cpu_relax();
    if ((spins & 1023) != 1023) continue;
    /* bounded: a ring that stays full for a second is not blocked by a dead
     * process but damaged (cells overwritten by a buggy or hostile writer);
     * give the slot up rather than hang: `umbp inspect --check` reports it */
    uint64_t now = umbp_now_ns();
    if (!give_up) give_up = now + (atomic_load_explicit(&damaged_ring, memory_order_relaxed) == ring ? 0 : 1000000000ull);
    else if (now > give_up) {
      atomic_store_explicit(&damaged_ring, ring, memory_order_relaxed); /* later frees give up at once */
      umbp_log(UMBP_LOG_ERROR, "pool %s: the free queue of partition %d stays full; slot %u is left out of it "
                               "(run 'umbp inspect %s --check')",
               p->name, part, s, p->name);
      break;
    }
    struct umbp_ring_hdr *rh = ring;
    uint64_t pos = atomic_load_explicit(&rh->enq_pos, memory_order_relaxed);
    uint64_t cw = atomic_load_explicit(&umbp_ring__cell(rh, pos)->word, memory_order_relaxed);
    uint16_t o = umbp_ring__wowner(cw);
    if (o && o != as_owner && o <= UMBP_MAX_PROCS && !umbp_registry_alive(p, (unsigned)(o - 1)))
      umbp_registry_reap_slot(p, (unsigned)(o - 1));
    if (spins > 100000) {
      struct timespec ts = {0, 100000};
      nanosleep(&ts, NULL);
    }
  }
  atomic_store_explicit(&ledger_owner->inflight_slot[tid], UINT32_MAX, memory_order_release);
}

static int limbo_push(struct umbp_index *ix, uint32_t s) {
  pthread_mutex_lock(&ix->limbo_mu);
  if (ix->nlimbo == ix->limbo_cap) {
    size_t nc = ix->limbo_cap ? ix->limbo_cap * 2 : 1024;
    uint32_t *nl = realloc(ix->limbo, nc * sizeof *nl);
    if (!nl) {
      pthread_mutex_unlock(&ix->limbo_mu);
      return -ENOMEM; /* stays RETIRED under our id; adopted after we detach */
    }
    ix->limbo = nl;
    ix->limbo_cap = nc;
  }
  ix->limbo[ix->nlimbo++] = s;
  atomic_store_explicit(&ix->limbo_n, ix->nlimbo, memory_order_relaxed);
  pthread_mutex_unlock(&ix->limbo_mu);
  return 0;
}

/* Retired at epoch r (low 32 bits) before the oldest reader epoch min? The
 * window between the two is far below 2^31 reclaims, so the wrapping
 * difference decides. */
static inline bool epoch_before(uint32_t r, uint64_t min) {
  if (min == UINT64_MAX) return true;
  return (int32_t)(r - (uint32_t)min) < 0;
}

/* Oldest epoch any live reader is in (UINT64_MAX: none). After bumping the
 * epoch and the membarrier, see the design note. */
static uint64_t readers_min_epoch(umbp_pool *p, bool memb) {
  struct umbp_index_hdr *ih = umbp_pool_region(p, UMBP_REG_INDEXHDR);
  atomic_fetch_add_explicit(&ih->epoch, 1, memory_order_seq_cst);
  if (memb) {
    if (umbp_membarrier_global() != 0) atomic_thread_fence(memory_order_seq_cst);
  } else {
    atomic_thread_fence(memory_order_seq_cst);
  }
  struct umbp_reader_shm *rd = umbp_pool_region(p, UMBP_REG_READERS);
  uint64_t min = UINT64_MAX;
  for (unsigned ps = 0; ps < UMBP_MAX_PROCS; ps++) {
    uint64_t bits = atomic_load_explicit(&p->procs[ps].thread_bits, memory_order_acquire);
    if (!bits) continue;
    /* a dead process reads nothing any more, reaped or not (a reaper holding
     * its lock makes it look alive: conservative) */
    if ((int)ps != p->proc_slot && !umbp_registry_alive(p, ps)) continue;
    /* scan the whole row when bits are unknown (a dead process's bits stay set until reaped) */
    for (unsigned t = 0; t < UMBP_MAX_THREADS; t++) {
      if (!(bits & (1ull << t))) continue;
      /* acquire: pairs with rd_lock/rd_unlock's release stores */
      uint64_t c = atomic_load_explicit(&rd[ps * UMBP_MAX_THREADS + t].ctr, memory_order_acquire);
      if (c && c < min) min = c;
    }
  }
  return min;
}

UMBP_API int umbp_reclaim(umbp_pool *p) {
  if (!p || !p->index) return -EINVAL;
  struct umbp_index *ix = p->index;
  struct tl_slot *t = thread_slot(ix);
  if (!t) return -EUSERS;
  if (!limbo_count(ix)) return 0; /* a slot retired meanwhile waits for the next call, as it would anyway */
  pthread_mutex_lock(&ix->limbo_mu);
  if (!ix->nlimbo) {
    pthread_mutex_unlock(&ix->limbo_mu);
    return 0;
  }
  uint64_t min = readers_min_epoch(p, ix->memb);
  int freed = 0;
  size_t keep = 0;
  for (size_t i = 0; i < ix->nlimbo; i++) {
    uint32_t s = ix->limbo[i];
    struct umbp_slot_meta *m = &ix->meta[s];
    uint64_t w = atomic_load_explicit(&m->state, memory_order_acquire);
    if (ST_STATE(w) != UMBP_SLOT_RETIRED || ST_OWNER(w) != p->owner_id) continue; /* not ours any more */
    if (epoch_before(atomic_load_explicit(&m->retire_epoch, memory_order_relaxed), min)) {
      free_slot(p, &p->procs[p->proc_slot], t->tid, s, p->owner_id);
      freed++;
    } else {
      ix->limbo[keep++] = s;
    }
  }
  ix->nlimbo = keep;
  atomic_store_explicit(&ix->limbo_n, keep, memory_order_relaxed);
  pthread_mutex_unlock(&ix->limbo_mu);
  return freed;
}

/* Retired slots that make a remover start a grace period (one membarrier,
 * an IPI to every CPU running a pool process, which costs tens to hundreds of
 * microseconds in a virtual machine): 1/64 of the pool, 8..4096. At most
 * 1/64 of the slots wait for a grace period, and a reserve that finds no free
 * slot reclaims at once. */
static inline size_t reclaim_batch(const struct umbp_index *ix) {
  size_t b = ix->slot_count / 64;
  return b < 8 ? 8 : b > 4096 ? 4096 : b;
}

/* Retired slots on this process's limbo list, without taking its mutex (a
 * remove asks after every call; with limbo_push's, the two mutex pairs were
 * 4.4-8.8% of a churn writer's time in perf). */
static size_t limbo_count(struct umbp_index *ix) {
  return atomic_load_explicit(&ix->limbo_n, memory_order_relaxed);
}

/* Reclaim, waiting up to budget_ns for readers to move on. */
static int reclaim_wait(umbp_pool *p, uint64_t budget_ns) {
  uint64_t end = umbp_now_ns() + budget_ns;
  int total = 0;
  for (;;) {
    int n = umbp_reclaim(p);
    if (n > 0) total += n;
    if (n < 0 || !limbo_count(p->index) || umbp_now_ns() > end) return total;
    umbp_cpu_relax();
  }
}

/* ---- remove one published slot ----------------------------------------------- */

/* If slot s (key hash h) is linked in its neighbourhood, store its way's hint
 * (which a remover clears before it unlinks) and return true. */
static bool relink_hint(struct umbp_bucket *buckets, uint32_t nb, uint32_t s, uint64_t h) {
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

/* Clear the way that points at slot s (key hash h); returns true if found.
 * Only the process that moved s to EVICTING (or RESERVED), or its reaper,
 * unlinks s, and inserters only take empty ways, so the way found stays s's
 * until this clears it. The signature goes first, then the slot word (seq_cst,
 * ordering the signature store before it): an inserter that then takes the
 * way (its acquire CAS reads our 0) writes its signature after ours. */
static bool unlink_way(struct umbp_bucket *buckets, uint32_t nb, uint32_t s, uint64_t h) {
  uint32_t home = umbp_bucket_home(h, nb);
  for (unsigned d = 0; d < UMBP_MAX_PROBE; d++) {
    struct umbp_bucket *b = &buckets[umbp_bucket_at(home, d, nb)];
    for (unsigned w = 0; w < UMBP_BUCKET_WAYS; w++) {
      uint32_t v = atomic_load_explicit(&b->slot[w], memory_order_relaxed);
      if (UMBP_WAY_SLOT(v) != s + 1) continue;
      atomic_store_explicit(&b->sig[w], 0, memory_order_relaxed);
      if (atomic_compare_exchange_strong_explicit(&b->slot[w], &v, 0, memory_order_seq_cst, memory_order_relaxed)) {
        if (d) umbp_ovf_sub(&buckets[home].overflow);
        return true;
      }
    }
  }
  return false;
}

/* Try to take published slot s (state st) out of the index. 0, -EBUSY (pinned
 * or changed meanwhile). why: UMBP_CTR_EVICTIONS or UMBP_CTR_REMOVES. */
static int try_remove(umbp_pool *p, struct tl_slot *t, uint32_t s, uint64_t st, int why) {
  struct umbp_index *ix = p->index;
  struct umbp_slot_meta *m = &ix->meta[s];
  uint64_t ev = ST_NEXT(st, UMBP_SLOT_EVICTING, p->owner_id);
  if (!atomic_compare_exchange_strong_explicit(&m->state, &st, ev, memory_order_seq_cst, memory_order_relaxed))
    return -EBUSY;
  /* Dekker with pin_slot(): state store above, pin loads below (seq_cst) */
  if (!pins_clear(ix->pins, ix->pin_stride, ix->ih, s)) {
    atomic_store_explicit(&m->state, ST_NEXT(ev, UMBP_SLOT_PUBLISHED, 0), memory_order_seq_cst);
    return -EBUSY;
  }
  struct umbp_key_shm k = m->key;
  unlink_way(ix->buckets, ix->nb, s, umbp_key_hash(&k));
  /* retire_epoch before the state: a reclaimer that sees RETIRED (acquire) sees the epoch */
  atomic_store_explicit(&m->retire_epoch, (uint32_t)atomic_load_explicit(&ix->ih->epoch, memory_order_seq_cst),
                        memory_order_relaxed);
  /* out of the namespace count (only this process moves an EVICTING slot of its own) */
  ns_count_set(p, ix->ns, ix->meta, ix->slot_count, k.ns, s, 0);
  /* the removed event while still EVICTING: a reaper of ours emits it for an
   * EVICTING slot, so a kill anywhere in here loses no event (one before the
   * RETIRED store below gets it twice) */
  emit(ix, UMBP_EV_REMOVED, &k);
  atomic_store_explicit(&m->state, ST_NEXT(ev, UMBP_SLOT_RETIRED, p->owner_id), memory_order_release);
  count_ns(ix, t, k.ns, why, 1);
  count_part(ix, t, slot_part(p, s), why, 1);
  limbo_push(ix, s);
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
  struct umbp_reader_shm *r = reader_of(ix, t);
  rd_lock(ix, r);
  uint32_t s = probe(ix, &k, h, &st);
  rd_unlock(r);
  if (s == UMBP_NO_SLOT) return -ENOENT;
  rc = try_remove(p, t, s, st, UMBP_CTR_REMOVES);
  if (rc == -EBUSY) return umbp_fail(-EBUSY, "the block is pinned by a reader: retry after it is unpinned");
  /* reclaim in batches: each grace period costs one membarrier */
  if (limbo_count(ix) >= reclaim_batch(ix)) umbp_reclaim(p);
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
    if (try_remove(p, t, s, st, UMBP_CTR_REMOVES) == 0) n++;
  }
  umbp_reclaim(p);
  return n;
}

/* CLOCK over one partition; ns_filter UINT32_MAX: any namespace. */
static int evict_part(umbp_pool *p, struct tl_slot *t, unsigned part, unsigned want, uint32_t ns_filter) {
  struct umbp_index *ix = p->index;
  const struct umbp_partition_desc *d = &p->hdr->partitions[part];
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
    if (try_remove(p, t, s, st, UMBP_CTR_EVICTIONS) == 0) done++;
  }
  return (int)done;
}

UMBP_API int umbp_evict(umbp_pool *p, int part, unsigned want) {
  struct umbp_index *ix;
  struct tl_slot *t;
  int rc = ix_get(p, &ix, &t);
  if (rc) return rc;
  if (part >= (int)p->hdr->n_partitions) return umbp_fail(-EINVAL, "partition %d does not exist", part);
  int n = 0;
  /* namespaces over quota give up their own blocks first */
  for (uint32_t ns = 0; ns < UMBP_MAX_NAMESPACES && (unsigned)n < want; ns++) {
    if (!ns_over_quota(ix, ns)) continue;
    for (unsigned q = 0; q < p->hdr->n_partitions && (unsigned)n < want; q++)
      if (part < 0 || (int)q == part) n += evict_part(p, t, q, want - (unsigned)n, ns);
  }
  for (unsigned q = 0; q < p->hdr->n_partitions && (unsigned)n < want; q++)
    if (part < 0 || (int)q == part) n += evict_part(p, t, q, want - (unsigned)n, UINT32_MAX);
  umbp_reclaim(p);
  return n;
}

/* ---- reserve / publish / abort ------------------------------------------------ */
static int reserve_one(umbp_pool *p, struct umbp_index *ix, unsigned part, uint32_t *ret) {
  void *ring = ix->rings[part];
  const struct umbp_partition_desc *d = &p->hdr->partitions[part];
  for (;;) {
    union ring_elem e;
    struct umbp_ring_claim c;
    if (umbp_ring_dequeue_begin(ring, &e, p->owner_id, &c) != 0) return -ENOSPC;
    uint64_t v = e.v;
    uint32_t s = (uint32_t)v;
    bool ok = false;
    if (v < ix->slot_count && s - d->first_slot < d->slot_count) {
      struct umbp_slot_meta *m = &ix->meta[s];
      uint64_t w = atomic_load_explicit(&m->state, memory_order_acquire);
      /* FREE -> RESERVED(us) before the dequeue completes: a reaper of ours finds
       * the slot either in our claimed cell or RESERVED under our id */
      if (ST_STATE(w) == UMBP_SLOT_FREE &&
          atomic_compare_exchange_strong_explicit(&m->state, &w, ST_NEXT(w, UMBP_SLOT_RESERVED, p->owner_id),
                                                  memory_order_acq_rel, memory_order_relaxed))
        ok = true;
    }
    umbp_ring_dequeue_commit(ring, &c);
    if (ok) {
      *ret = s;
      return 0;
    }
    umbp_log(UMBP_LOG_WARN, "pool %s: dropped bad free-queue entry %llu on partition %u", p->name,
             (unsigned long long)v, part);
  }
}

static int pick_part(umbp_pool *p, int part) {
  if (part >= 0) return part;
  unsigned best = 0;
  uint64_t bestn = 0;
  for (unsigned i = 0; i < p->hdr->n_partitions; i++) {
    uint64_t n = umbp_ring_count(p->index->rings[i]);
    if (n > bestn) {
      bestn = n;
      best = i;
    }
  }
  return (int)best;
}

UMBP_API int umbp_reserve_bulk(umbp_pool *p, int part, uint32_t ns, unsigned n, uint32_t *ret_slots) {
  struct umbp_index *ix;
  struct tl_slot *t;
  int rc = ix_get(p, &ix, &t);
  if (rc) return rc;
  if (n && !ret_slots) return -EINVAL;
  if (part >= (int)p->hdr->n_partitions || part < -1)
    return umbp_fail(-EINVAL, "partition %d does not exist (the pool has %u)", part, p->hdr->n_partitions);
  if (ns >= UMBP_MAX_NAMESPACES) return umbp_fail(-EINVAL, "namespace id %u is out of range", ns);
  unsigned got = 0;
  int q = pick_part(p, part);
  for (unsigned attempt = 0; got < n && attempt < 8; attempt++) {
    if (ns_over_quota(ix, ns)) {
      evict_part(p, t, (unsigned)q, n - got, ns);
      reclaim_wait(p, 2000000);
    }
    while (got < n && reserve_one(p, ix, (unsigned)q, &ret_slots[got]) == 0) got++;
    if (got == n) break;
    /* retired slots first (they only wait for readers to move on), then
     * on-demand eviction, bounded: a batch, then a short wait for readers */
    if (reclaim_wait(p, 2000000) > 0) continue;
    unsigned want = n - got < 32 ? 32 : n - got;
    int ev = evict_part(p, t, (unsigned)q, want, UINT32_MAX);
    reclaim_wait(p, 2000000);
    if (ev <= 0 && attempt >= 2) {
      if (umbp_pool_reap(p) <= 0 && part < 0 && p->hdr->n_partitions > 1) q = (q + 1) % (int)p->hdr->n_partitions;
      else if (attempt >= 4) break;
    }
  }
  if (got == 0 && n)
    return umbp_fail(-ENOSPC, "no free slot on partition %d of pool '%s' and nothing could be evicted "
                              "(every block is pinned or reserved): unpin blocks or enlarge the pool",
                     q, p->name);
  return (int)got;
}

UMBP_API int umbp_reserve(umbp_pool *p, int part, uint32_t ns, uint32_t *ret_slot) {
  uint32_t s;
  int rc = umbp_reserve_bulk(p, part, ns, 1, &s);
  if (rc < 0) return rc;
  *ret_slot = s;
  return 0;
}

static int check_reserved(umbp_pool *p, uint32_t slot, uint64_t *ret_w) {
  if (slot >= p->hdr->slot_count) return umbp_fail(-EINVAL, "slot %u is out of range", slot);
  uint64_t w = atomic_load_explicit(&p->index->meta[slot].state, memory_order_acquire);
  if (ST_STATE(w) != UMBP_SLOT_RESERVED || ST_OWNER(w) != p->owner_id)
    return umbp_fail(-EINVAL, "slot %u is not reserved by this process", slot);
  *ret_w = w;
  return 0;
}

UMBP_API int umbp_abort(umbp_pool *p, uint32_t slot) {
  struct umbp_index *ix;
  struct tl_slot *t;
  int rc = ix_get(p, &ix, &t);
  if (rc) return rc;
  uint64_t w;
  if ((rc = check_reserved(p, slot, &w))) return rc;
  free_slot(p, &p->procs[p->proc_slot], t->tid, slot, p->owner_id);
  return 0;
}

UMBP_API int umbp_publish(umbp_pool *p, uint32_t slot, const umbp_key *key) {
  struct umbp_index *ix;
  struct tl_slot *t;
  struct umbp_key_shm k;
  int rc = ix_get(p, &ix, &t);
  if (rc) return rc;
  uint64_t h;
  if ((rc = key_load(key, &k, &h))) return rc;
  /* the home bucket is locked and written below: start its miss now */
  prefetch_w(&ix->buckets[umbp_bucket_home(h, ix->nb)]);
  uint64_t w;
  if ((rc = check_reserved(p, slot, &w))) return rc;
  if (k.ns >= UMBP_MAX_NAMESPACES || atomic_load_explicit(&ix->ns[k.ns].state, memory_order_acquire) != 1)
    return umbp_fail(-EINVAL, "namespace %u is not registered: register it with umbp_ns_register()", k.ns);
  struct umbp_slot_meta *m = &ix->meta[slot];
  m->key = k; /* made visible by the release CAS of the way below */
  atomic_store_explicit(&m->ref, 0, memory_order_relaxed);
  uint32_t home = umbp_bucket_home(h, ix->nb);
  struct umbp_bucket *hb = &ix->buckets[home];
  bucket_lock(p, &hb->lock);
  /* first writer wins: look for the key under the home lock */
  uint64_t st;
  struct umbp_reader_shm *r = reader_of(ix, t);
  rd_lock(ix, r);
  uint32_t other = probe(ix, &k, h, &st);
  rd_unlock(r);
  if (other != UMBP_NO_SLOT) {
    bucket_unlock(&hb->lock);
    free_slot(p, &p->procs[p->proc_slot], t->tid, slot, p->owner_id);
    count_ns(ix, t, k.ns, UMBP_CTR_DUPLICATES, 1);
    return -EEXIST;
  }
  uint16_t sig = umbp_key_sig(h);
  bool placed = false;
  for (unsigned d = 0; d < UMBP_MAX_PROBE && !placed; d++) {
    struct umbp_bucket *b = &ix->buckets[umbp_bucket_at(home, d, ix->nb)];
    for (unsigned i = 0; i < UMBP_BUCKET_WAYS; i++) {
      if (atomic_load_explicit(&b->slot[i], memory_order_relaxed)) continue;
      /* overflow first (release), so a reader that finds the home bucket without
       * the key still looks further (pairs with probe()'s acquire load) */
      if (d) umbp_ovf_add(&hb->overflow, d);
      uint32_t z = 0;
      /* The slot word decides who owns an empty way: inserters of other homes
       * (holding other locks) may race for it here. release: the key and block
       * bytes written before are visible to a reader that loads this word
       * (pairs with bucket_slot()'s acquire load); acquire: our signature store
       * comes after the last remover's clearing one (see unlink_way()). */
      if (atomic_compare_exchange_strong_explicit(&b->slot[i], &z, umbp_way_word(sig, slot), memory_order_acq_rel,
                                                  memory_order_relaxed)) {
        /* the hint that makes lookups look at this way; release pairs with
         * nothing in particular: readers take it as a hint only */
        atomic_store_explicit(&b->sig[i], (uint8_t)sig, memory_order_release);
        /* counted while still RESERVED (a reaper of ours takes it back out) */
        ns_count_set(p, ix->ns, ix->meta, ix->slot_count, k.ns, slot, 1);
        /* PUBLISHED only once linked and signed: an evictor never sees a
         * published slot without its way; a reader that finds the way before
         * this store sees RESERVED and misses; one that sees PUBLISHED (acquire)
         * also sees the signature (pairs with probe()'s acquire load of state) */
        atomic_store_explicit(&m->state, ST_NEXT(w, UMBP_SLOT_PUBLISHED, 0), memory_order_release);
        placed = true;
        break;
      }
      if (d) umbp_ovf_sub(&hb->overflow);
    }
  }
  bucket_unlock(&hb->lock);
  if (!placed) {
    free_slot(p, &p->procs[p->proc_slot], t->tid, slot, p->owner_id);
    return umbp_fail(-ENOSPC, "index neighbourhood of this key is full (%d buckets): the pool's index is "
                              "overloaded",
                     UMBP_MAX_PROBE);
  }
  count_ns(ix, t, k.ns, UMBP_CTR_INSERTS, 1);
  count_part(ix, t, slot_part(p, slot), UMBP_CTR_INSERTS, 1);
  if (atomic_load_explicit(&ix->ev_stored, memory_order_relaxed)) emit(ix, UMBP_EV_STORED, &k);
  return 0;
}

UMBP_API int umbp_publish_bulk(umbp_pool *p, unsigned n, const uint32_t *slots, const umbp_key *keys, int *rc) {
  if (!p || (n && (!slots || !keys))) return -EINVAL;
  int ok = 0;
  for (unsigned i = 0; i < n; i++) {
    int r = umbp_publish(p, slots[i], &keys[i]);
    if (rc) rc[i] = r;
    ok += r == 0;
  }
  return ok;
}

/* ---- reaping a dead process's index state --------------------------------- */
static void reclaim_owner(umbp_pool *p, unsigned slot, uint64_t budget_ns);
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
  free_slot(p, &p->procs[c->dead - 1], c->ledger_tid, (uint32_t)v, c->dead);
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
  struct umbp_reader_shm *rd = (struct umbp_reader_shm *)umbp_pool_region(p, UMBP_REG_READERS) +
                               (size_t)slot * UMBP_MAX_THREADS;
  /* 1. reader state: a dead reader must not hold back reclamation */
  for (unsigned t = 0; t < UMBP_MAX_THREADS; t++) atomic_store_explicit(&rd[t].ctr, 0, memory_order_release);
  atomic_store_explicit(&ps->thread_bits, 0, memory_order_release);
  /* 2. half-finished ring operations. Ledger slot 0 is the reaper's. */
  struct reap_ctx c = {.p = p, .dead = dead, .ledger_tid = 0};
  uint32_t ledger[UMBP_MAX_THREADS];
  for (unsigned t = 0; t < UMBP_MAX_THREADS; t++)
    ledger[t] = atomic_load_explicit(&ps->inflight_slot[t], memory_order_acquire);
  for (unsigned i = 0; i < h->n_partitions; i++) umbp_ring_repair(part_ring(p, i), dead, reap_ring_item, &c);
  umbp_ring_repair(umbp_pool_region(p, UMBP_REG_EVENTS), dead, NULL, NULL);
  /* 3. slots a thread was freeing: back on the queue unless they made it there */
  for (unsigned t = 0; t < UMBP_MAX_THREADS; t++) {
    uint32_t s = ledger[t];
    if (s >= h->slot_count) continue;
    uint64_t w = atomic_load_explicit(&meta[s].state, memory_order_acquire);
    int part = slot_part(p, s);
    union ring_elem v = {.v = s};
    if (part >= 0 && (ST_STATE(w) == UMBP_SLOT_FREE || (ST_STATE(w) == UMBP_SLOT_RETIRED && ST_OWNER(w) == dead)) &&
        !umbp_ring_contains(part_ring(p, (unsigned)part), &v)) {
      /* a RETIRED one is left for step 6 */
      if (ST_STATE(w) == UMBP_SLOT_FREE) free_slot(p, ps, 0, s, dead);
    }
    atomic_store_explicit(&ps->inflight_slot[t], UINT32_MAX, memory_order_relaxed);
  }
  /* 4. namespace counts it was changing: redone, their locks released (step 5
   * takes them) */
  struct umbp_ns_shm *nss = umbp_pool_region(p, UMBP_REG_NAMESPACES);
  ns_count_locks_reap(p, nss, meta, h->slot_count, dead);
  /* 5. pins held by the dead process (before step 6 weighs other pins) */
  pins_drop_proc(pins, pstride, ih, h->slot_count, slot);
  /* 6. reservations, half-done removals and retired slots of the dead process */
  unsigned orphans = 0;
  for (uint32_t s = 0; s < h->slot_count; s++) {
    uint64_t w = atomic_load_explicit(&meta[s].state, memory_order_acquire);
    if (ST_OWNER(w) != dead) continue;
    unsigned st = ST_STATE(w);
    if (st == UMBP_SLOT_EVICTING && !pins_clear(pins, pstride, ih, s)) {
      /* A removal that died before its pin check, or after it with a pinner
       * now backing off (pin_slot() sees EVICTING and undoes its pin). While
       * the way is linked the remover had not decided: it would have put a
       * pinned block back, so do that (its hint too, in case the remover had
       * cleared it). A pinned block is never evicted, even by a reaper. */
      struct umbp_key_shm k = meta[s].key;
      uint64_t kh = umbp_key_hash(&k);
      if (relink_hint(buckets, h->n_buckets, s, kh)) {
        atomic_store_explicit(&meta[s].state, ST_NEXT(w, UMBP_SLOT_PUBLISHED, 0), memory_order_seq_cst);
        continue;
      }
    }
    if (st == UMBP_SLOT_RESERVED || st == UMBP_SLOT_EVICTING) {
      /* it may be in the index (died inside publish or remove): unlink, then retire */
      struct umbp_key_shm k = meta[s].key;
      unlink_way(buckets, h->n_buckets, s, umbp_key_hash(&k));
      ns_count_set(p, nss, meta, h->slot_count, k.ns, s, 0);
      /* an EVICTING slot was published: its removal is announced, as the dead
       * remover would have (see try_remove()); the event ring was repaired in
       * step 2 */
      if (st == UMBP_SLOT_EVICTING && p->index) emit(p->index, UMBP_EV_REMOVED, &k);
      atomic_store_explicit(&meta[s].retire_epoch, (uint32_t)atomic_load(&ih->epoch), memory_order_relaxed);
      atomic_store_explicit(&meta[s].state, ST_NEXT(w, UMBP_SLOT_RETIRED, dead), memory_order_release);
      orphans++;
    } else if (st == UMBP_SLOT_RETIRED) {
      orphans++;
    }
  }
  /* 7. locks it held */
  for (uint32_t b = 0; b < h->n_buckets; b++) {
    uint16_t cur = dead;
    atomic_compare_exchange_strong(&buckets[b].lock, &cur, 0);
  }
  uint32_t cur = dead;
  atomic_compare_exchange_strong(&ih->ns_lock, &cur, 0);
  cur = dead;
  atomic_compare_exchange_strong(&ih->evict_lock, &cur, 0);
  /* 8. counters: fold into the reaped row */
  struct umbp_counter_row *rows = umbp_pool_region(p, UMBP_REG_COUNTERS);
  struct umbp_counter_row *from = &rows[slot], *to = &rows[UMBP_MAX_PROCS];
  for (unsigned n = 0; n < UMBP_MAX_NAMESPACES; n++)
    for (unsigned k = 0; k < UMBP_CTR_COUNT; k++) {
      uint64_t v = atomic_exchange_explicit(&from->ns[n][k], 0, memory_order_relaxed);
      if (v) atomic_fetch_add_explicit(&to->ns[n][k], v, memory_order_relaxed);
    }
  for (unsigned n = 0; n < UMBP_MAX_PARTITIONS; n++)
    for (unsigned k = 0; k < UMBP_CTR_COUNT; k++) {
      uint64_t v = atomic_exchange_explicit(&from->part[n][k], 0, memory_order_relaxed);
      if (v) atomic_fetch_add_explicit(&to->part[n][k], v, memory_order_relaxed);
    }
  /* 9. retired slots: reclaim those whose grace period is over, leave the
   * rest to whoever claims this registry slot next (orphans flag) */
  if (orphans) reclaim_owner(p, slot, 5000000);
}

/* Reclaim the RETIRED slots left under registry slot `slot`'s owner id by a
 * process that is gone (dead and being reaped, or detached with readers still
 * in their sections), waiting up to budget_ns for readers; sets the slot's
 * orphans flag to whether any are left. The caller holds the slot's lock. */
static void reclaim_owner(umbp_pool *p, unsigned slot, uint64_t budget_ns) {
  struct umbp_shm_header *h = p->hdr;
  struct umbp_proc_slot *ps = &p->procs[slot];
  uint16_t owner = (uint16_t)(slot + 1);
  struct umbp_slot_meta *meta = umbp_pool_region(p, UMBP_REG_SLOTMETA);
  bool memb = (h->compat_features & UMBP_FEAT_COMPAT_MEMBARRIER) && umbp_membarrier_supported();
  uint64_t end = umbp_now_ns() + budget_ns;
  unsigned left;
  do {
    left = 0;
    uint64_t min = readers_min_epoch(p, memb);
    for (uint32_t s = 0; s < h->slot_count; s++) {
      uint64_t w = atomic_load_explicit(&meta[s].state, memory_order_acquire);
      if (ST_STATE(w) != UMBP_SLOT_RETIRED || ST_OWNER(w) != owner) continue;
      if (epoch_before(atomic_load_explicit(&meta[s].retire_epoch, memory_order_relaxed), min)) {
        free_slot(p, ps, 0, s, owner);
      } else {
        left++;
      }
    }
  } while (left && umbp_now_ns() < end);
  atomic_store(&ps->orphans, left ? 1u : 0u);
}

/* Registry slots that are free but still have retired slots under their id
 * (orphans flag): reclaim what the readers allow. Called by the reaper. */
void umbp_index_sweep_orphans(umbp_pool *p, unsigned slot) { reclaim_owner(p, slot, 0); }

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
  if (!p || !ret) return -EINVAL;
  if (ns != UINT32_MAX && ns >= UMBP_MAX_NAMESPACES) return -EINVAL;
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
  if (!p || !ret || part >= p->hdr->n_partitions) return -EINVAL;
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
      if (!pins_clear(pins, pstride, ih, s)) c->pinned++;
      break;
    case UMBP_SLOT_EVICTING: c->evicting++; break;
    case UMBP_SLOT_RETIRED: c->retired++; break;
    default: break;
    }
  }
  for (unsigned i = p0; i < p1; i++) {
    void *ring = part_ring(p, i);
    if (umbp_ring_check_header(ring, p->hdr->partitions[i].ring_bytes) == 0) c->in_rings += umbp_ring_count_live(ring);
  }
}

UMBP_API int umbp_census(umbp_pool *p, umbp_slot_census *ret) {
  if (!p || !ret) return -EINVAL;
  umbp_slot_census c;
  census_range(p, 0, p->hdr->slot_count, 0, p->hdr->n_partitions, &c);
  *ret = c;
  return 0;
}

UMBP_API int umbp_census_part(umbp_pool *p, unsigned part, umbp_slot_census *ret) {
  if (!p || !ret || part >= p->hdr->n_partitions) return -EINVAL;
  const struct umbp_partition_desc *d = &p->hdr->partitions[part];
  if (d->first_slot > p->hdr->slot_count || d->slot_count > p->hdr->slot_count - d->first_slot) return -EBADMSG;
  umbp_slot_census c;
  census_range(p, d->first_slot, d->slot_count, part, part + 1, &c);
  *ret = c;
  return 0;
}

UMBP_API int umbp_index_stats(umbp_pool *p, uint64_t *ret_entries, uint64_t *hist, unsigned nhist) {
  if (!p || !ret_entries) return -EINVAL;
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
      if (!hist || s >= p->hdr->slot_count) continue;
      struct umbp_key_shm k = meta[s].key;
      uint32_t home = umbp_bucket_home(umbp_key_hash(&k), nb);
      unsigned d = umbp_bucket_dist(home, i, nb);
      if (d >= nhist) d = nhist - 1;
      hist[d]++;
    }
  *ret_entries = n;
  return 0;
}

/* ---- background evictor -------------------------------------------------------- */
static void *evictor_main(void *arg) {
  umbp_pool *p = arg;
  struct umbp_index *ix = p->index;
  while (!atomic_load_explicit(&ix->ev_stop, memory_order_acquire)) {
    umbp_pool_heartbeat(p);
    for (unsigned i = 0; i < p->hdr->n_partitions; i++) {
      uint64_t total = p->hdr->partitions[i].slot_count;
      uint64_t low = total * ix->ev_low / 100, high = total * ix->ev_high / 100;
      uint64_t free_n = umbp_ring_count(ix->rings[i]);
      if (free_n < low) umbp_evict(p, (int)i, (unsigned)(high - free_n));
    }
    umbp_reclaim(p);
    struct timespec ts = {ix->ev_period_ms / 1000, (long)(ix->ev_period_ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
  }
  umbp_counters_flush(p);
  return NULL;
}

UMBP_API int umbp_evictor_start(umbp_pool *p, unsigned low_pct, unsigned high_pct, unsigned period_ms) {
  if (!p || !p->index) return -EINVAL;
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
