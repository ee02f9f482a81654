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
#include "shm/ring.h"
#include "umbp/index.h"


/* Slot state word: state | owner << 8 | gen << 24 */
#define ST_STATE(w) ((unsigned)((w) & 0xff))
#define ST_OWNER(w) ((uint16_t)(((w) >> 8) & 0xffff))
#define ST_GEN(w) ((w) >> 24)
#define ST_MAKE(state, owner, gen) ((uint64_t)(state) | ((uint64_t)(owner) << 8) | ((uint64_t)(gen) << 24))
#define ST_NEXT(w, state, owner) ST_MAKE(state, owner, ST_GEN(w) + 1)

/* Entries of the thread cache (struct umbp_index.tcache, threads.c). */
#define UMBP_TC_SIZE 256u
/* The most removed slots one thread keeps for its next reserves (struct
 * tl_slot.fc; reserve.c, "The thread's slot cache"). */
#define UMBP_FC_MAX 8u
/* A thread keeps at most one removed slot per this many slots of the
 * smallest partition: none in pools under 8192 slots a partition. */
#define UMBP_FC_SLOTS_PER 8192u
/* Read-write handles one process may hold at once, of any pools (threads.c's
 * list, which thread exit and fork() walk). */
#define UMBP_MAX_INSTANCES 64

/* Process-local. The fields every lookup reads come first and are written
 * only at attach; what the evictor writes starts on a cache line of its own
 * (allocated 64-byte aligned), so that it never takes away a line lookups
 * read. */
struct umbp_index {
  umbp_pool *p;
  struct umbp_index_hdr *ih;
  struct umbp_bucket *buckets;
  uint32_t nb; /* buckets (hdr->n_buckets) */
  struct umbp_slot_meta *meta;
  _Atomic uint8_t *pins; /* process-major pin bytes (umbp_pin_stride()) */
  uint64_t pin_stride;
  /* threads.c: the thread cache (UMBP_TC_SIZE entries) and this process's
   * thread slots (UMBP_MAX_THREADS), one allocation made at attach */
  _Atomic uint64_t *tcache;
  struct tl_slot *tl;
  /* the first thread to take a line of this handle, checked before the
   * cache (thread_slot()): 0 when none */
  _Atomic uintptr_t first_self;
  struct tl_slot *first_tl;
  _Atomic bool pin_bit; /* our bit in ih->pin_procs is set */
  struct umbp_reader_shm *readers; /* this process's row of UMBP_MAX_THREADS */
  struct umbp_reader_shm *lines;   /* every process's rows (the READERS region) */
  struct umbp_ns_shm *ns;
  struct umbp_counter_row *ctr;    /* this process's row */
  void *events;
  void *rings[UMBP_MAX_PARTITIONS];
  uint32_t slot_count;
  uint64_t slot_size;
  _Atomic bool ev_stored;
  /* evictor thread */
  _Alignas(64) pthread_t ev_thread;
  bool ev_running;
  _Atomic bool ev_stop;
  unsigned ev_low, ev_high, ev_period_ms;
  /* the rings' geometry, copied from their headers once at attach (validated):
   * ring operations index cells with these, never with the shared headers,
   * which a co-tenant may rewrite (shm/ring.h, "Trust"). Last, after the
   * writers' lines, so that what every lookup reads stays on the struct's
   * first lines. */
  struct umbp_ring_geo ring_geo[UMBP_MAX_PARTITIONS];
  struct umbp_ring_geo ev_geo;
  /* The partition table, copied from the header once at attach (validated
   * there): slot addresses and partitions are computed from this copy, never
   * from the shared header, which a co-tenant may rewrite. */
  unsigned n_parts;
  struct umbp_partition_desc parts[UMBP_MAX_PARTITIONS];
  /* how many removed slots a thread keeps (struct tl_slot.fc): set at attach */
  unsigned fc_cap;
  /* events.c. ev_stored (above) makes publishes call umbp_ix_emit() (set at
   * attach, so that the published-key feed sees every publish); ev_ring_stored
   * is umbp_events_enable_stored(): stored events go into the event ring too.
   * feed: this process's mapping of the feed file, replaced when the pool
   * header's feed_gen moves (older mappings stay on feed_old until detach,
   * since another thread may still be appending through them). */
  _Atomic bool ev_ring_stored;
  /* the event ring's cell word this process's last emit gave up on (a
   * drainer stopped or killed in its claim): umbp_ring_enqueue_overwrite_hint_g() */
  _Atomic uint64_t ev_stuck;
  _Atomic(struct umbp_feed_map *) feed;
  _Atomic uint32_t feed_tried; /* the feed_gen last tried (mapped or refused) */
  pthread_mutex_t feed_mu;
  struct umbp_feed_map *feed_old;
  /* umbp_feed_open() between this handle's threads: the pool's feed lock
   * byte is an OFD lock on the handle's one open file, which does not
   * exclude another thread using that same file */
  pthread_mutex_t feed_open_mu;
};

/* 64-bit key hash (not cryptographic: the block hash is already one). Part
 * of the segment ABI: every process must hash alike. Its results on fixed
 * keys are in the ABI fingerprint (index.c), so builds that hash
 * differently refuse each other's pools.
 * AES-NI builds (x86-64, meson option `aes`): four AES encryption rounds
 * (AESENC: SubBytes, ShiftRows, MixColumns, then XOR of a round key) over
 * the key's three 16-byte words a, b, c: round 1 on a (XORed with a
 * constant), which takes b as its round key, round 2 takes c, rounds 3 and
 * 4 constants. Each word goes through at least two rounds after it enters,
 * and two rounds make every output byte depend on every input byte, so
 * sequential block ids, a 4096 stride, namespaces or ranks in the first
 * word spread as random keys do (test_structured_keys). Words are absorbed
 * one after another, not each mixed on its own and XORed: after one round
 * two words could cancel (a difference in one column of a against the same
 * column of b). The low 64 bits of the result are the hash: low bits pick
 * the bucket, high bits are the signature.
 * Why AES rounds: they run in vector registers, seven instructions against
 * the 37 integer instructions of the multiply-and-rotate mix below; each
 * integer result holds an integer rename register until its lookup retires,
 * and those registers, not the instruction count, bound how many single
 * lookups wait on memory at once (docs/bench-index.md, "The twenty-fourth
 * session"). Other builds keep the mix: AES rounds in software cost about
 * 100 ns a key. */
#define UMBP_KH_K0_LO 0x13198a2e03707344ull
#define UMBP_KH_K0_HI 0x243f6a8885a308d3ull
#define UMBP_KH_K1_LO 0x082efa98ec4e6c89ull
#define UMBP_KH_K1_HI 0xa4093822299f31d0ull
#define UMBP_KH_K2_LO 0xbe5466cf34e90c6cull
#define UMBP_KH_K2_HI 0x452821e638d01377ull
static inline uint64_t umbp_rotl64(uint64_t x, unsigned r) { return (x << r) | (x >> (64 - r)); }
/* keyhash.c: the AES rounds computed without AES instructions (what the ABI
 * fingerprint uses on a CPU without AES-NI, so that such a CPU gets the
 * message of umbp_ix_cpu_check() rather than a fault or a fingerprint
 * mismatch), and one round alone. */
uint64_t umbp_key_hash_soft(const uint64_t w[6]);
void umbp_aesenc_soft(uint8_t x[16], const uint8_t k[16]);
/* Whether this CPU runs the build's hash (false only in an AES-NI build on
 * a CPU without AES-NI), and the error (a message) when not: the index
 * module's layout and validate hooks refuse such a CPU. */
bool umbp_ix_aes_ok(void);
int umbp_ix_cpu_check(void);
#if defined(__x86_64__) && defined(__AES__)
#define UMBP_KEY_HASH_AESNI 1
#include <wmmintrin.h>
/* The hash of the key whose three 16-byte words are a, b, c. */
static inline uint64_t umbp_key_hash_v(__m128i a, __m128i b, __m128i c) {
  __m128i x = _mm_aesenc_si128(_mm_xor_si128(a, _mm_set_epi64x((long long)UMBP_KH_K0_HI, (long long)UMBP_KH_K0_LO)), b);
  x = _mm_aesenc_si128(x, c);
  x = _mm_aesenc_si128(x, _mm_set_epi64x((long long)UMBP_KH_K1_HI, (long long)UMBP_KH_K1_LO));
  x = _mm_aesenc_si128(x, _mm_set_epi64x((long long)UMBP_KH_K2_HI, (long long)UMBP_KH_K2_LO));
  return (uint64_t)_mm_cvtsi128_si64(x);
}
/* The hash of the 48 bytes at p (the layout of struct umbp_key_shm). */
static inline uint64_t umbp_key_hash_mem(const void *p) {
  const __m128i *v = (const __m128i *)p;
  return umbp_key_hash_v(_mm_loadu_si128(v), _mm_loadu_si128(v + 1), _mm_loadu_si128(v + 2));
}
static inline uint64_t umbp_key_hash6(uint64_t w0, uint64_t w1, uint64_t w2, uint64_t w3, uint64_t w4,
                                      uint64_t w5) {
  return umbp_key_hash_v(_mm_set_epi64x((long long)w1, (long long)w0), _mm_set_epi64x((long long)w3, (long long)w2),
                         _mm_set_epi64x((long long)w5, (long long)w4));
}
#else
#define UMBP_KEY_HASH_AESNI 0
/* The mix: three independent multiplies fold the six key words (so they
 * run in parallel), then one more mixes the halves. Sequential block ids
 * still spread, because each word's product is rotated into the other half
 * before the last multiply. Two multiplies deep is the least that spreads
 * structured keys: an XOR fold of the words into one multiply collides
 * whole keys (a namespace id in word 0 cancels a block id in word 2) and a
 * sum of per-word products keeps lattice patterns (block ids with a 4096
 * stride overfill neighbourhoods). */
static inline uint64_t umbp_key_hash6(uint64_t w0, uint64_t w1, uint64_t w2, uint64_t w3, uint64_t w4,
                                      uint64_t w5) {
  uint64_t a = (w0 ^ 0x9e3779b97f4a7c15ull) * (w3 | 1) + w3;
  uint64_t b = (w1 ^ 0xbf58476d1ce4e5b9ull) * (w4 | 1) + w4;
  uint64_t c = (w2 ^ 0x94d049bb133111ebull) * 0xd6e8feb86659fd93ull + w5 * 0x9fb21c651e98df25ull;
  uint64_t h = (a ^ umbp_rotl64(b, 21) ^ umbp_rotl64(c, 43)) * 0xff51afd7ed558ccdull;
  return h ^ (h >> 29) ^ (h >> 47);
}
static inline uint64_t umbp_key_hash_mem(const void *p) {
  uint64_t w[6];
  memcpy(w, p, sizeof w);
  return umbp_key_hash6(w[0], w[1], w[2], w[3], w[4], w[5]);
}
#endif
static inline uint64_t umbp_key_hash_w(const uint64_t w[6]) {
  return umbp_key_hash6(w[0], w[1], w[2], w[3], w[4], w[5]);
}
static inline uint64_t umbp_key_hash(const struct umbp_key_shm *k) {
  uint64_t w[6];
  memcpy(w, k, sizeof w);
  return umbp_key_hash_w(w);
}

/* The 16-bit signature of key hash h (its top 16 bits; the low 32 bits
 * pick the bucket): the low byte goes in the bucket's sig array, the high
 * byte in the way's slot word (see struct umbp_bucket). The low byte is
 * never 0, which marks a way with no key. */
static inline uint16_t umbp_key_sig(uint64_t h) {
  uint16_t s = (uint16_t)(h >> 48);
  return (s & 0xff) ? s : (uint16_t)(s | 1);
}
/* The slot word of a way that links slot s under signature sig. */
static inline uint32_t umbp_way_word(uint16_t sig, uint32_t s) {
  return (uint32_t)(sig >> 8) << 24 | (s + 1);
}

/* The home bucket of key hash h in a table of nb buckets: Lemire's
 * multiply-shift range reduction of the hash's low 32 bits, so nb need not be
 * a power of two (the table is sized to the pool, not rounded up to double). */
static inline uint32_t umbp_bucket_home(uint64_t h, uint32_t nb) {
  return (uint32_t)(((uint64_t)(uint32_t)h * nb) >> 32);
}
/* The bucket d after bucket b, wrapping (d < nb). */
static inline uint32_t umbp_bucket_at(uint32_t b, unsigned d, uint32_t nb) {
  uint32_t i = b + d;
  return i >= nb ? i - nb : i;
}
/* How many buckets bucket b is after bucket home, wrapping. */
static inline uint32_t umbp_bucket_dist(uint32_t home, uint32_t b, uint32_t nb) {
  return b >= home ? b - home : b + nb - home;
}

/* A bucket's overflow word (struct umbp_bucket.ovf): for the keys homed
 * there that live in later buckets, a 16-bit filter with each key's bit set
 * (bits 0..15), their count (bits 16..23; at most 15 buckets x 12 ways) and
 * their reach, the largest distance any of them has had since the count was
 * last 0 (bits 24..31). A lookup that misses in the home bucket looks at the
 * next `reach` buckets, and only when its key's filter bit is set: 0.4% of
 * misses at load factor 0.9 instead of the 3.5% whose home has displaced
 * keys (docs/bench-index.md). All parts change in one CAS: an
 * inserter adds (count, reach, its bit) before it links a displaced way, a
 * remover subtracts after it unlinks one, and the count reaching 0 clears the
 * whole word. So at every instant count >= displaced ways, reach >= their
 * distances, and every displaced key's bit is set; a bit whose key left
 * stays set until the count is 0 (it costs a look, never a wrong answer).
 * Both probes look past the home only when the key's bit is set
 * (bucket_match_far() in index_inline.h); umbp_ix_probe_far() then reads the
 * reach from the word again. */
#define UMBP_OVF_FILTER(v) ((unsigned)(v) & 0xffffu)
#define UMBP_OVF_COUNT(v) ((unsigned)(v) >> 16 & 0xffu)
#define UMBP_OVF_REACH(v) ((unsigned)(v) >> 24)
/* The filter bit of a key with hash h: bit number umbp_ovf_bit_index(h), the
 * hash's top four bits, independent of the home (the low 32 bits,
 * umbp_bucket_home()). */
static inline unsigned umbp_ovf_bit_index(uint64_t h) { return (unsigned)(h >> 60); }
static inline unsigned umbp_ovf_bit(uint64_t h) { return 1u << umbp_ovf_bit_index(h); }
static inline void umbp_ovf_add(_Atomic uint32_t *o, unsigned d, unsigned bit) {
  uint32_t v = atomic_load_explicit(o, memory_order_relaxed), nv;
  do {
    unsigned r = UMBP_OVF_REACH(v) > d ? UMBP_OVF_REACH(v) : d;
    nv = (uint32_t)r << 24 | ((UMBP_OVF_COUNT(v) + 1) & 0xffu) << 16 | UMBP_OVF_FILTER(v) | (bit & 0xffffu);
  } while (!atomic_compare_exchange_weak_explicit(o, &v, nv, memory_order_release, memory_order_relaxed));
}
static inline void umbp_ovf_sub(_Atomic uint32_t *o) {
  uint32_t v = atomic_load_explicit(o, memory_order_relaxed), nv;
  do {
    unsigned c = UMBP_OVF_COUNT(v);
    if (!c) return; /* never below zero (a repair tool may have zeroed it) */
    nv = c == 1 ? 0 : v - (1u << 16);
  } while (!atomic_compare_exchange_weak_explicit(o, &v, nv, memory_order_release, memory_order_relaxed));
}

/* Way w of bucket b as one value, sig << 32 | (slot + 1) with the 16-bit
 * signature, for tools and tests that inspect or edit ways (not atomic as a
 * pair: see struct umbp_bucket). */
static inline uint64_t umbp_way_get(const struct umbp_bucket *b, unsigned w) {
  uint32_t v = atomic_load_explicit(&((struct umbp_bucket *)b)->slot[w], memory_order_acquire);
  uint8_t lo = atomic_load_explicit(&((struct umbp_bucket *)b)->sig[w], memory_order_relaxed);
  return v ? (uint64_t)(UMBP_WAY_SIG_HI(v) << 8 | lo) << 32 | UMBP_WAY_SLOT(v) : 0;
}
static inline void umbp_way_set(struct umbp_bucket *b, unsigned w, uint64_t v) {
  uint32_t sl = UMBP_WAY_SLOT((uint32_t)v);
  uint16_t sig = (uint16_t)(v >> 32);
  if (!sl) atomic_store_explicit(&b->sig[w], 0, memory_order_relaxed);
  atomic_store_explicit(&b->slot[w], sl ? umbp_way_word(sig, sl - 1) : 0, memory_order_release);
  if (sl) atomic_store_explicit(&b->sig[w], (uint8_t)sig, memory_order_release);
}
/* The way value of slot s for key hash h. */
static inline uint64_t umbp_way_make(uint64_t h, uint32_t s) {
  return (uint64_t)umbp_key_sig(h) << 32 | (uint64_t)(s + 1);
}

/* ---- shared by the index's source files ---------------------------------------
 * Each file of src/index owns one concern (the source map is in index.c); what
 * one of them calls in another is declared here, named umbp_ix_*. Hidden, as
 * the library's -fvisibility=hidden makes every definition: said on the
 * declarations too, so that the compiler emits direct calls and reaches the
 * thread-locals below as it did while they were static to one file (no GOT
 * load, no general-dynamic TLS lookup). The hot-path helpers are static
 * inline in index_inline.h. */
#define UMBP_IX_HIDDEN __attribute__((visibility("hidden")))

/* A ring payload buffer as large as any ring element (free rings carry 8 bytes). */
union ring_elem {
  uint64_t v;
  unsigned char b[UMBP_RING_MAX_ELEM];
};

/* A thread's state for one pool (threads.c): its reader line and ledger index
 * (tid), and the counts not yet added to the process's row (counters.c).
 * Process memory, one per thread line (ix->tl[tid]), a cache line or more
 * each, so that no two threads write one line. */
struct tl_slot {
  /* the thread that holds line tid (its thread pointer, umbp_ix_self()), 0: none */
  _Atomic uintptr_t owner;
  unsigned tid;
  /* pending counters */
  uint32_t ctr_ns;
  int ctr_part;
  uint32_t pend_ops;
  uint64_t pend_ns[UMBP_CTR_COUNT];
  uint64_t pend_part[UMBP_CTR_COUNT];
  /* Slots this thread removed (umbp_remove()), kept RESERVED under the
   * process's id for its next reserves instead of going round the free ring
   * (reserve.c, "The thread's slot cache"): a stack, fc[fc_n - 1] on top. */
  uint32_t fc_n;
  uint32_t fc_rm; /* its removes since its last reserve */
  uint32_t fc[UMBP_FC_MAX];
  uint64_t fc_w[UMBP_FC_MAX]; /* each kept slot's state word as it was kept */
} __attribute__((aligned(64)));

/* The calling thread's identity: its thread pointer (the TCB address, one
 * register read on x86-64 and AArch64), unique among live threads. Not a
 * thread-local variable: in libumbp.so a dynamic-TLS read is a call to
 * __tls_get_addr on every lookup, and initial-exec TLS makes the library
 * fail to load into a process whose static TLS block is full (Python after
 * torch). docs/bench-index.md, "Why the hot path looks as it does". */
static inline uintptr_t umbp_ix_self(void) {
#if defined(__x86_64__) || defined(__aarch64__)
  return (uintptr_t)__builtin_thread_pointer();
#else
  return (uintptr_t)pthread_self();
#endif
}

/* The thread cache: which thread holds which line of this pool, as
 * self << 8 | tid in one word (user-space addresses are below 2^56, so
 * nothing of self is lost; a thread whose pointer is not is never cached and
 * takes the slow path). Two entries per hash, written by thread_slot()'s slow
 * path and cleared by a thread's exit. */
_Static_assert(UMBP_MAX_THREADS <= 64, "a tid fits thread_bits (64 bits) and a cache entry's low byte");
static inline uint64_t umbp_ix_tc_entry(uintptr_t self, unsigned tid) { return (uint64_t)self << 8 | tid; }
static inline unsigned umbp_ix_tc_hash(uintptr_t self) {
  return (unsigned)(((uint64_t)(self >> 6) * 0x9e3779b97f4a7c15ull) >> 56) & (UMBP_TC_SIZE - 2);
}

/* index.c */
UMBP_IX_HIDDEN __attribute__((cold)) int umbp_ix_fail(umbp_pool *p);
/* Test hook: a test's helper process sets umbp_ix_stop_at to a point's
 * number and stops itself there (raise(SIGSTOP), once), as the kill tests
 * kill at exact points; 0 in every other process. Only on the paths of
 * publish, removal and reaping (one load of a line no one writes), never a
 * lookup's. */
enum {
  UMBP_STOP_NONE,
  UMBP_STOP_COUNT_APPLIED,
  UMBP_STOP_PUBLISH_LINKED,
  UMBP_STOP_REMOVE_UNLINKED,
  UMBP_STOP_FREE_QUEUED,  /* a freed slot enqueued, its ledger entry not yet cleared */
  UMBP_STOP_REAP_LEDGER,  /* a reaper saw a dead process's ledger slot FREE, before it looks for it on the ring */
};
extern UMBP_IX_HIDDEN int umbp_ix_stop_at;
UMBP_IX_HIDDEN __attribute__((cold, noinline)) void umbp_ix_stop_here(void);
#define UMBP_STOP_POINT(n)                                              \
  do {                                                                   \
    if (UMBP_UNLIKELY(umbp_ix_stop_at == (n))) umbp_ix_stop_here();      \
  } while (0)

/* ---- the index as a module of the segment (shm/module.h) --------------------
 * The segment layer calls these through umbp_index_module (index.c), listed
 * in src/modules.c; it never names them. */
struct umbp_shm_module;
extern const struct umbp_shm_module umbp_index_module;
/* init: initialise the index regions of a fresh segment (creator only). */
int umbp_index_init_regions(umbp_pool *p);
/* attach/detach: this process's index state (read-write handles). */
int umbp_index_attach_hook(umbp_pool *p);
void umbp_index_detach_hook(umbp_pool *p);
/* reap: release what a dead process left (pins, reservations, thread lines,
 * ring claims); the caller holds the dead registry slot's lock (reap.c). */
void umbp_index_reap_proc(umbp_pool *p, unsigned slot);
/* forget: free the index state a fork() child's handle still points at (its
 * parent's copy; nothing in the segment is written). */
void umbp_index_forget(umbp_pool *p);
/* Free slots on partition part's ring (the private geometry of the ring when
 * this process has index state). */
uint64_t umbp_index_free_slots(umbp_pool *p, unsigned part);
/* The key hash and bucket-home functions' results on fixed inputs: the part
 * of the index's ABI fingerprint that says every process places keys alike
 * (sizes alone do not). */
uint64_t umbp_index_abi_part(void);
/* The same with another key hash in place of umbp_key_hash_w (tests: a build
 * that hashed keys otherwise gets another part). */
uint64_t umbp_index_abi_part_with(uint64_t (*hash)(const uint64_t w[6]));
/* The index module's abi_part() (module.h) with key_part in place of
 * umbp_index_abi_part(): the sizes of its shared structs and key_part. */
uint64_t umbp_index_module_abi_with(uint64_t key_part);

/* table.c */
UMBP_IX_HIDDEN __attribute__((cold)) int umbp_ix_key_fail(const umbp_key *k);
UMBP_IX_HIDDEN __attribute__((cold)) int umbp_ix_pin_overflow_fail(uint32_t s);
UMBP_IX_HIDDEN uint32_t umbp_ix_probe_other(struct umbp_index *ix, const struct umbp_key_shm *k, uint64_t h,
                                            uint32_t self, uint64_t *ret_st);
UMBP_IX_HIDDEN uint32_t umbp_ix_probe_far(struct umbp_index *ix, const struct umbp_key_shm *k, uint32_t home,
                                          uint16_t sig, uint64_t h, uint64_t *ret_st, bool pin);
UMBP_IX_HIDDEN bool umbp_ix_relink_hint(struct umbp_bucket *buckets, uint32_t nb, uint32_t s, uint64_t h);
UMBP_IX_HIDDEN bool umbp_ix_unlink_way(struct umbp_bucket *buckets, uint32_t nb, uint32_t s, uint64_t h);

/* threads.c */
UMBP_IX_HIDDEN struct tl_slot *umbp_ix_thread_slot_slow(struct umbp_index *ix);
/* The calling thread's slot in ix if it holds one, else NULL (no claim). */
UMBP_IX_HIDDEN struct tl_slot *umbp_ix_thread_slot_find(struct umbp_index *ix);
/* Allocate ix's thread cache and slots (attach); -ENOMEM. */
UMBP_IX_HIDDEN int umbp_ix_threads_init(struct umbp_index *ix);
UMBP_IX_HIDDEN int umbp_ix_instance_add(struct umbp_index *ix);
UMBP_IX_HIDDEN void umbp_ix_instance_remove(struct umbp_index *ix);

/* pins.c */
UMBP_IX_HIDDEN bool umbp_ix_pins_clear(_Atomic uint8_t *pins, uint64_t stride, struct umbp_index_hdr *ih, uint32_t s);
UMBP_IX_HIDDEN void umbp_ix_pins_drop_proc(_Atomic uint8_t *pins, uint64_t stride, struct umbp_index_hdr *ih,
                                           uint32_t slots, unsigned q);
UMBP_IX_HIDDEN __attribute__((cold)) void umbp_ix_pin_bit_set(struct umbp_index *ix);

/* lock.c */
/* How long a namespace registration waits for a live holder of the table's
 * lock before it gives up with -EBUSY (the critical section takes
 * microseconds: only a stopped or frozen holder keeps it this long). */
#define UMBP_NS_LOCK_WAIT_NS (2000ull * 1000000ull)
/* Spin rounds before a lock waiter sleeps between tries, and how long. */
#define UMBP_LOCK_SPINS_BEFORE_SLEEP 100000u
#define UMBP_LOCK_SLEEP_NS 50000L
UMBP_IX_HIDDEN int umbp_ix_spin_lock_owner(umbp_pool *p, _Atomic uint32_t *lock, const char *what);
UMBP_IX_HIDDEN void umbp_ix_proc_describe(umbp_pool *p, unsigned q, char *buf, size_t n);

/* namespaces.c */
UMBP_IX_HIDDEN void umbp_ix_ns_count_begin(struct umbp_reader_shm *rec, uint32_t ns, uint32_t s, uint8_t f);
UMBP_IX_HIDDEN void umbp_ix_ns_count_apply(struct umbp_reader_shm *lines, struct umbp_ns_shm *n,
                                           const struct umbp_reader_shm *rec, unsigned me);
UMBP_IX_HIDDEN void umbp_ix_ns_count_end(struct umbp_reader_shm *rec, struct umbp_slot_meta *meta);
UMBP_IX_HIDDEN void umbp_ix_ns_count_set(struct umbp_reader_shm *lines, struct umbp_reader_shm *rec, unsigned me,
                                         struct umbp_ns_shm *nss, struct umbp_slot_meta *meta, uint32_t slot_count,
                                         uint32_t ns, uint32_t s, uint8_t f);
UMBP_IX_HIDDEN void umbp_ix_ns_count_records_reap(struct umbp_reader_shm *lines, struct umbp_ns_shm *nss,
                                                  struct umbp_slot_meta *meta, uint32_t slot_count, unsigned q);
UMBP_IX_HIDDEN uint64_t umbp_ix_ns_used(const struct umbp_ns_shm *n);
UMBP_IX_HIDDEN bool umbp_ix_ns_over_quota(struct umbp_index *ix, uint32_t ns);

/* events.c */
UMBP_IX_HIDDEN void umbp_ix_key_from_shm(const struct umbp_key_shm *s, umbp_key *k);
UMBP_IX_HIDDEN void umbp_ix_emit(struct umbp_index *ix, int type, const struct umbp_key_shm *k);
/* Set up / tear down this process's feed state (attach and detach hooks). */
UMBP_IX_HIDDEN void umbp_ix_feed_init(struct umbp_index *ix);
UMBP_IX_HIDDEN void umbp_ix_feed_fini(struct umbp_index *ix);

/* evict.c */
UMBP_IX_HIDDEN int umbp_ix_try_remove(umbp_pool *p, struct tl_slot *t, uint32_t s, uint64_t st, int why, bool emit,
                                      const uint64_t *hash, bool keep);
UMBP_IX_HIDDEN int umbp_ix_evict_part(umbp_pool *p, struct tl_slot *t, unsigned part, unsigned want,
                                      uint32_t ns_filter);

/* reserve.c */
/* How long a free waits for a held-up free ring before it leaves the slot
 * off the ring, and how long a reserve retries a ring that holds entries it
 * cannot take before it scans the state words (reserve.c's design note). */
#define UMBP_FREE_RING_WAIT_NS (20ull * 1000000ull)
#define UMBP_RESERVE_STUCK_NS (2ull * 1000000ull)
/* After a reserve found a ring held up, this process's later reserves on it
 * scan at once for this long instead of retrying first. */
#define UMBP_RESERVE_STUCK_MEMO_NS (50ull * 1000000ull)
UMBP_IX_HIDDEN int umbp_ix_ring_geo(umbp_pool *p, int part, struct umbp_ring_geo *ret);
UMBP_IX_HIDDEN bool umbp_ix_free_slot(umbp_pool *p, struct umbp_proc_slot *ledger_owner, unsigned tid, uint32_t s,
                                      uint16_t as_owner);
UMBP_IX_HIDDEN void umbp_ix_requeue_slot(umbp_pool *p, struct umbp_proc_slot *ledger_owner, unsigned tid, uint32_t s,
                                         uint16_t as_owner);
UMBP_IX_HIDDEN int umbp_ix_tidy(umbp_pool *p);
/* The thread's slot cache (reserve.c): keep removed slot s (EVICTING under
 * state word ev, its way unlinked) for thread t's next reserve, or free it;
 * give every kept slot back to its ring (thread exit, detach). */
UMBP_IX_HIDDEN void umbp_ix_fc_keep_or_free(umbp_pool *p, struct tl_slot *t, uint32_t s, uint64_t ev);
UMBP_IX_HIDDEN void umbp_ix_fc_flush(struct umbp_index *ix, struct tl_slot *t);
UMBP_IX_HIDDEN void umbp_ix_mark_untidy(struct umbp_index_hdr *ih, unsigned part);

/* counters.c */
UMBP_IX_HIDDEN void umbp_ix_flush_slot(struct umbp_index *ix, struct tl_slot *t);
UMBP_IX_HIDDEN void umbp_ix_count_ns_switch(struct umbp_index *ix, struct tl_slot *t, uint32_t ns, int c, uint64_t n);

#endif
