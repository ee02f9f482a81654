/* SPDX-License-Identifier: Apache-2.0 */
/*
 * ring.h - bounded MPMC ring in shared memory that survives a killed process.
 *
 * Design note
 * ===========
 * The idea.  Dmitry Vyukov's bounded MPMC queue (1024cores.net, "Bounded
 * MPMC queue"): every cell carries a sequence number; seq == pos means "free
 * for the producer at pos", seq == pos + 1 means "full for the consumer at
 * pos", and a consumer hands the cell to the next lap by storing
 * pos + capacity.  Vyukov claims a position by CAS on the head/tail counter,
 * which leaves nothing behind that says *who* holds the position.  Here the
 * claim is a CAS on the cell word itself, and the word names its owner:
 *
 *     cell word = seq (46 bits) | kind (2 bits) | owner (16 bits)
 *
 *     kind   seq       meaning                              moved by
 *     STABLE pos       free for the producer at pos         producer CAS -> WRITING
 *     WRITING pos      producer `owner` is copying in       owner store  -> STABLE pos+1
 *                                                           repair CAS   -> SKIP   pos+1
 *     STABLE pos+1     full for the consumer at pos         consumer CAS -> READING
 *                                                           overwrite CAS -> WRITING pos+cap
 *     SKIP   pos+1     full, but a tombstone                consumer CAS -> STABLE pos+cap
 *                                                           overwrite CAS -> WRITING pos+cap
 *     READING pos+1    consumer `owner` is copying out      owner store  -> STABLE pos+cap
 *                                                           repair CAS   -> STABLE pos+cap
 *
 * STABLE and SKIP words always carry owner 0.  Only the owner (or the repair
 * of a dead owner) ever moves a WRITING/READING word, so a plain
 * store-release is enough for the owner's completion.
 *
 * The positions enq_pos / deq_pos are hints, not locks: ownership of position
 * p is decided solely by the CAS on cell p.  A thread that reads a position
 * and finds that cell already claimed or completed for that position
 * (or for a later lap) helps by CASing the position p -> p + 1 and retries.
 * Advancing is always valid because a position is only stepped past a cell
 * that somebody owns.  A producer claims cells first and then advances
 * enq_pos once for the whole burst (consumers likewise), so a burst costs
 * one CAS per cell plus one on the shared counter.
 *
 * Full / empty.  A producer at p whose cell still holds the previous lap
 * (seq == p - cap + 1: full, tombstone or being read) reports full.  A
 * consumer at p whose cell is not yet full (seq == p, STABLE or WRITING)
 * reports empty.  Both are Vyukov's answers; under concurrency they are
 * snapshots.  umbp_ring_enqueue_overwrite instead claims such a cell in
 * place when it is not being read (the two overwrite rows of the table):
 * the element of p - cap is dropped and deq_pos is left behind it (the
 * overwriter brings it up once a lap, so that it never falls the 2^45
 * positions behind that the seq arithmetic below allows); a consumer that
 * finds its position passed jumps to enq_pos - cap.
 *
 * Sequence arithmetic.  Positions are 64-bit and wrap; seq is the position
 * modulo 2^46 and is compared as a signed 46-bit difference, so the ring
 * works across both wraps (tests start positions just below 2^46 and 2^64).
 * A thread must not sleep for 2^45 operations between reading a position
 * and using it (that is the only ABA window).
 *
 * What a half-finished operation looks like, and who repairs it.
 *   - Producer killed after its claim (cell WRITING by it, perhaps with
 *     enq_pos not yet advanced): other producers help enq_pos past the cell
 *     and go on; consumers reaching it report empty (they are stuck *behind*
 *     it, as in any FIFO) until umbp_ring_repair(dead) turns the cell into a
 *     SKIP tombstone, which consumers consume and discard transparently.  The
 *     element is never delivered.  Once the ring wraps to that cell,
 *     producers report full until the repair.
 *   - Consumer killed after its claim (cell READING by it): other consumers
 *     help deq_pos past it and go on; producers that lap around to it report
 *     full until umbp_ring_repair(dead) copies the payload out, releases the
 *     cell to the next lap by CAS, and hands the copy to the callback (which
 *     may re-enqueue it, even on this very ring, since the cell is released
 *     before the call).
 *   - Killed while helping a position: that is a single CAS, nothing to
 *     repair.  Killed between the claims of a burst and their completion:
 *     every claimed cell is in one of the two states above (a burst claims
 *     all its cells before it copies or publishes any, and a dequeue call
 *     releases cells only in the pass that returns them).
 *   - Elements a consumer has fully dequeued belong to that process; if it
 *     dies with them in private memory they are gone (the ring cannot know).
 *     Callers that must not lose an element act on it while the cell is
 *     still READING (two-phase dequeue, see ring_claim.h).
 * The reaper learns that an owner is dead from the process registry (not
 * here) and must finish the repair before that owner id is reused.
 *
 * Invariants.  (1) Each cell word's seq only moves forward, by exactly the
 * transitions in the table.  (2) A WRITING/READING word is moved only by its
 * owner or by the repair of that owner after it died.  (3) enq_pos/deq_pos
 * never pass a position whose cell has not been claimed.  (4) The header
 * fields on the first cache line are immutable after umbp_ring_init.
 *
 * Memory ordering (each release names its paired acquire):
 *   [R1] producer completion: store-release STABLE pos+1, after writing the
 *        payload; pairs with [A1] the consumer's claim CAS (acquire on
 *        success) before it reads the payload, and with [A1r] repair's
 *        load-acquire of a READING word (the consumer's claim CAS is an RMW,
 *        so it continues R1's release sequence).
 *   [R2] consumer completion: store-release STABLE pos+cap after reading the
 *        payload; also [R2r] repair's CAS READING -> STABLE pos+cap and [R2s]
 *        the skip-consume CAS; all pair with [A2] the producer's claim CAS
 *        (acquire on success) before it overwrites the payload.
 *   [R3] repair's CAS WRITING -> SKIP (release) pairs with [A3], the
 *        skip-consume CAS (acq_rel), which passes it on via [R2s]: the dead
 *        producer's stray payload writes (ordered before repair through the
 *        OS death notification) happen-before the next lap's writes.
 *   Positions and failed CASes are relaxed: they never guard data.
 * The atomics are lock-free 64-bit (asserted), so they work across processes.
 *
 * Shared layout (integers only; no pointers, each process passes its own
 * mapping):  [line 0: immutable header + magic] [line 1: enq_pos, dropped]
 * [line 2: deq_pos] [capacity cells of (8-byte word + elem_size payload)],
 * the whole rounded up to 64 bytes.  The magic is stored last by init.
 *
 * Sources: Vyukov's bounded MPMC queue; DPDK lib/ring (burst API, C11
 * ordering labels); Concurrency Kit ck_ring (integer-only control block);
 * pmdk's run-id locks (an owner recorded in the shared word so that a reaper
 * can undo exactly its work).
 *
 * Trust.  The geometry (capacity, mask, elem_size, cell_size) is fixed at
 * init.  Each process validates the header once against its mapping size and
 * keeps a private copy (umbp_ring_geo_get()); the *_g operations index cells
 * with that copy only, never with line 0.  So a co-tenant that rewrites line 0
 * later (a mask of 0xffffffff made peers' enqueues write outside the ring and
 * SIGSEGV) changes nothing, and whatever the cell words and positions hold,
 * every access stays inside the cells.  The operations without _g read the
 * geometry from line 0 on each call: for tests and single-owner tools only;
 * the pool's index uses the _g ones.
 * Versions: a ring of another layout major or ABI fingerprint is refused by
 * check_header; the ring holds no state that outlives its segment.
 *
 * Concurrency table: enqueue*, dequeue*, enqueue_overwrite, count, dropped
 * and repair may all run at the same time from any thread of any process
 * mapping the ring.  init must finish (and be published) before any other
 * call; check_header is what an attaching process runs first.
 */
#ifndef UMBP_SHM_RING_H
#define UMBP_SHM_RING_H

#include <errno.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>

/* ---- shared layout --------------------------------------------------------------- */

#define UMBP_RING_MAGIC UINT64_C(0x474e495250424d55) /* "UMBPRING" little-endian */
#define UMBP_RING_LAYOUT_MAJOR 1
#define UMBP_RING_LAYOUT_MINOR 0
#define UMBP_RING_LINE 64
#define UMBP_RING_HDR_BYTES 192 /* three cache lines; cell 0 starts here */
#define UMBP_RING_MAX_ELEM 64
#define UMBP_RING_MAX_CAPACITY (UINT32_C(1) << 31)
/* Positions (tombstones included) one pass of umbp_ring_dequeue_burst_g()
 * claims at most before it copies and releases them. */
#define UMBP_RING_DEQUEUE_RUN 64u

#define UMBP_RING_SEQ_BITS 46
#define UMBP_RING_SEQ_MASK ((UINT64_C(1) << UMBP_RING_SEQ_BITS) - 1)
#define UMBP_RING_SEQ_SHIFT 18
#define UMBP_RING_KIND_SHIFT 16

enum umbp_ring_kind {
  UMBP_RING_STABLE = 0,  /* free (seq == pos) or full (seq == pos + 1) */
  UMBP_RING_WRITING = 1, /* claimed by producer `owner`, seq == pos */
  UMBP_RING_READING = 2, /* claimed by consumer `owner`, seq == pos + 1 */
  UMBP_RING_SKIP = 3,    /* full tombstone, seq == pos + 1, consumed and discarded */
};

struct umbp_ring_hdr {
  /* line 0: written once by umbp_ring_init, read-only afterwards */
  _Atomic uint64_t magic;  /* UMBP_RING_MAGIC, store-release last by init */
  uint16_t layout_major;
  uint16_t layout_minor;
  uint32_t hdr_bytes;      /* == UMBP_RING_HDR_BYTES */
  uint32_t capacity;       /* power of two, >= 2 */
  uint32_t mask;           /* capacity - 1 */
  uint32_t elem_size;      /* payload bytes, multiple of 8, 8..64 */
  uint32_t cell_size;      /* 8 + elem_size */
  uint64_t total_bytes;    /* umbp_ring_bytes(capacity, elem_size) */
  uint64_t abi;            /* sizes/alignments fingerprint, see ring.c */
  uint64_t checksum;       /* over bytes [8, 48): the fields above, magic excluded */
  uint8_t pad0[UMBP_RING_LINE - 56];
  /* line 1: producers */
  _Atomic uint64_t enq_pos;
  _Atomic uint64_t dropped; /* elements dropped by enqueue_overwrite */
  uint8_t pad1[UMBP_RING_LINE - 16];
  /* line 2: consumers */
  _Atomic uint64_t deq_pos;
  uint8_t pad2[UMBP_RING_LINE - 8];
};

struct umbp_ring_cell {
  _Atomic uint64_t word;
  unsigned char payload[]; /* elem_size bytes */
};

_Static_assert(sizeof(_Atomic uint64_t) == 8 && _Alignof(_Atomic uint64_t) == 8,
               "ring words must be plain 8-byte aligned 64-bit atomics");
_Static_assert(ATOMIC_LLONG_LOCK_FREE == 2,
               "64-bit atomics must be lock-free to work across processes");
_Static_assert(sizeof(struct umbp_ring_hdr) == UMBP_RING_HDR_BYTES, "ring header is 3 lines");
/* __builtin_offsetof (gcc, clang) keeps this header down to the four libc headers above. */
_Static_assert(__builtin_offsetof(struct umbp_ring_hdr, checksum) == 48, "ring header line 0 layout");
_Static_assert(__builtin_offsetof(struct umbp_ring_hdr, enq_pos) == 64, "enq_pos on its own line");
_Static_assert(__builtin_offsetof(struct umbp_ring_hdr, deq_pos) == 128, "deq_pos on its own line");
_Static_assert(sizeof(struct umbp_ring_cell) == 8, "cell header is the word alone");

/* A ring's geometry, fixed at init: the private copy each process indexes
 * cells with (design note, "Trust"). */
struct umbp_ring_geo {
  uint32_t capacity, mask, elem_size, cell_size;
};

/* ---- test hook -------------------------------------------------------------------- */

#ifdef UMBP_RING_TEST_HOOKS
enum umbp_ring_hook_point {
  UMBP_RING_HOOK_PRODUCER_CLAIMED = 1, /* cell at pos is WRITING by owner, nothing else done */
  UMBP_RING_HOOK_CONSUMER_CLAIMED = 2, /* cell at pos is READING by owner, nothing else done */
};
typedef void (*umbp_ring_hook_fn)(int point, void *ring, uint64_t pos, uint16_t owner);
/* Process-local; one definition per program (weak).  Set it before the threads
 * that use the ring start.  Called right after each successful claim CAS, so a
 * helper can raise(SIGSTOP)/_exit() there: "killed after claiming a position and
 * before completing it".  A test may also longjmp out of it (single thread). */
extern umbp_ring_hook_fn umbp_ring_test_hook;
__attribute__((weak)) umbp_ring_hook_fn umbp_ring_test_hook = 0;
#define UMBP_RING__HOOK(pt, r, pos, ow)               \
  do {                                                \
    umbp_ring_hook_fn umbp_hook_ = umbp_ring_test_hook; \
    if (umbp_hook_) umbp_hook_((pt), (r), (pos), (ow)); \
  } while (0)
#else
#define UMBP_RING__HOOK(pt, r, pos, ow) ((void)0)
#endif

/* ---- exported (non-hot) functions, ring.c ----------------------------------------- */

/* Bytes a ring of `capacity` cells of `elem_size`-byte payloads occupies: a
 * multiple of 64.  Returns 0 when the parameters are invalid (capacity not a
 * power of two in [2, 2^31], elem_size not a multiple of 8 in [8, 64]).
 * Pure; any thread. */
size_t umbp_ring_bytes(uint32_t capacity, uint32_t elem_size);

/* Format `mem` as an empty ring.  Returns 0, or -EINVAL when mem is NULL or not
 * 64-byte aligned, the parameters are invalid (see umbp_ring_bytes) or
 * mem_bytes < umbp_ring_bytes(capacity, elem_size).  Calling context: the
 * creator, before any other process or thread uses the ring; never on a ring in
 * use.  Ordering: the magic is stored last with release, pairing with the
 * load-acquire in umbp_ring_check_header, so an attacher that sees the magic
 * sees every initialising store.  mem stays owned by the caller. */
int umbp_ring_init(void *mem, size_t mem_bytes, uint32_t capacity, uint32_t elem_size);

/* As umbp_ring_init, but the ring starts at position `start_pos` (enq_pos ==
 * deq_pos == start_pos, every cell's seq set for its first position at or after
 * start_pos).  For tests that cross the 2^46 seq wrap and the 2^64 position
 * wrap; an ordinary ring starts at 0.  Same returns and context. */
int umbp_ring_init_at(void *mem, size_t mem_bytes, uint32_t capacity, uint32_t elem_size,
                      uint64_t start_pos);

/* Validate a ring header written by another, possibly buggy or hostile,
 * process before using it.  Returns 0 when the magic, layout major version,
 * ABI fingerprint, checksum and every geometry field agree with each other
 * and the ring fits in mem_bytes; -EBADMSG otherwise (including mem_bytes too
 * small for a header: nothing past mem_bytes is read); -EINVAL when mem is
 * NULL or not 64-byte aligned.  Reads the header once into a private copy
 * (the magic with acquire, see umbp_ring_init).  Any thread; no side effects.
 * It checks geometry, not contents: cell words and positions are dynamic and
 * the ring operations stay memory-safe whatever they hold. */
int umbp_ring_check_header(const void *mem, size_t mem_bytes);

/* umbp_ring_check_header(), then the validated geometry into *ret (written
 * only on success): the private copy to pass to the *_g operations.  Same
 * returns; any thread. */
int umbp_ring_geo_get(const void *mem, size_t mem_bytes, struct umbp_ring_geo *ret);

/* Enqueue one element; when the ring is full, the oldest element gives its
 * cell to the new one (claimed in place: one CAS, as an enqueue) and bumps
 * the header's dropped counter (atomic, relaxed: a statistic).  Returns how
 * many elements were dropped: 0 when it fitted at once, else 1.  Never
 * blocks: if the cell it needs is being read by a consumer that is slow,
 * stopped or dead and not yet repaired (or still written by the previous
 * lap's producer), it spins up to 1024 times, then drops the new element
 * itself, counts it and returns 1.  A tombstone in the cell gives way without
 * counting.  deq_pos is left behind (brought up once a lap, so that it stays
 * within two laps of enq_pos); the next dequeue jumps it to the oldest
 * element left (umbp_ring__dequeue_pass).  Context and ordering as
 * umbp_ring_enqueue_burst; the claim is under `owner`, so a process killed
 * mid-call is repaired like any producer (the cell becomes a tombstone). */
unsigned umbp_ring_enqueue_overwrite(void *ring, const void *elem, uint16_t owner);
unsigned umbp_ring_enqueue_overwrite_g(void *ring, const struct umbp_ring_geo *g, const void *elem, uint16_t owner);
/* The same, with a caller's hint (process-local, any threads; starts 0):
 * the cell word that made its last call give up. A call that finds the
 * very same word in the cell it needs (that claim has not moved since)
 * drops its element at once, counted, instead of spinning again. */
unsigned umbp_ring_enqueue_overwrite_hint_g(void *ring, const struct umbp_ring_geo *g, const void *elem,
                                            uint16_t owner, _Atomic uint64_t *stuck);

/* Approximate number of elements: enq_pos - deq_pos clamped to [0, capacity]
 * (it includes claimed-but-unfinished cells and tombstones).  Relaxed loads; a
 * snapshot only.  Any thread. */
uint64_t umbp_ring_count(const void *ring);
uint64_t umbp_ring_count_g(const void *ring, const struct umbp_ring_geo *g);

/* Total elements dropped by umbp_ring_enqueue_overwrite since init.  Relaxed
 * load; any thread. */
uint64_t umbp_ring_dropped(const void *ring);

/* Repair the cells of `dead_owner`, a process id that is dead and will never run
 * again (the caller knows this from the process registry).  Scans all
 * capacity cells (O(capacity)):
 *   - WRITING by dead_owner: CAS to a SKIP tombstone [R3]; consumers then
 *     discard it.  The element is never delivered.
 *   - READING by dead_owner: load-acquire [A1r], copy the payload to a private
 *     buffer, CAS the cell to free-for-the-next-lap [R2r], then (only if that
 *     CAS won) call cb(arg, copy) once; the copy is valid during the call
 *     only.  cb may be NULL (the element is dropped) and may enqueue into this
 *     ring.
 * Also helps enq_pos/deq_pos past a repaired cell if they still point at it.
 * Returns the number of cells repaired (0 for dead_owner 0 or ring NULL).
 * Calling context: any thread, while live producers and consumers keep running
 * (it only CASes cells that name dead_owner).  Two reapers repairing the same
 * owner at once are safe: each cell goes to exactly one of them.  Calling it
 * for a live owner is a caller bug (that owner's completion store would then
 * clobber the repaired cell). */
unsigned umbp_ring_repair(void *ring, uint16_t dead_owner, void (*cb)(void *arg, const void *elem),
                          void *arg);
unsigned umbp_ring_repair_g(void *ring, const struct umbp_ring_geo *g, uint16_t dead_owner,
                            void (*cb)(void *arg, const void *elem), void *arg);

/* ---- inline helpers ---------------------------------------------------------------- */

static inline uint64_t umbp_ring__word(uint64_t seq, unsigned kind, uint16_t owner) {
  return ((seq & UMBP_RING_SEQ_MASK) << UMBP_RING_SEQ_SHIFT) | ((uint64_t)kind << UMBP_RING_KIND_SHIFT) |
         owner;
}
static inline uint64_t umbp_ring__wseq(uint64_t w) { return w >> UMBP_RING_SEQ_SHIFT; }
static inline unsigned umbp_ring__wkind(uint64_t w) { return (unsigned)(w >> UMBP_RING_KIND_SHIFT) & 3u; }
static inline uint16_t umbp_ring__wowner(uint64_t w) { return (uint16_t)w; }

/* a - b as a signed 46-bit difference (wrapping seq arithmetic). */
static inline int64_t umbp_ring__seqdiff(uint64_t a, uint64_t b) {
  uint64_t d = (a - b) & UMBP_RING_SEQ_MASK;
  if (d & (UINT64_C(1) << (UMBP_RING_SEQ_BITS - 1))) return (int64_t)d - ((int64_t)1 << UMBP_RING_SEQ_BITS);
  return (int64_t)d;
}

/* Cell of position pos, by the private geometry g: inside the ring whatever
 * pos is. */
static inline struct umbp_ring_cell *umbp_ring__cellg(struct umbp_ring_hdr *h, const struct umbp_ring_geo *g,
                                                      uint64_t pos) {
  return (struct umbp_ring_cell *)((unsigned char *)h + UMBP_RING_HDR_BYTES + (size_t)(pos & g->mask) * g->cell_size);
}
/* Cell of position pos by the shared line 0: tests and tools only (see Trust). */
static inline struct umbp_ring_cell *umbp_ring__cell(struct umbp_ring_hdr *h, uint64_t pos) {
  return (struct umbp_ring_cell *)((unsigned char *)h + UMBP_RING_HDR_BYTES +
                                   (size_t)(pos & h->mask) * h->cell_size);
}
/* The geometry as line 0 says now (the non-_g operations; see Trust). */
static inline struct umbp_ring_geo umbp_ring__geo_shared(const void *ring) {
  const struct umbp_ring_hdr *h = (const struct umbp_ring_hdr *)ring;
  struct umbp_ring_geo g = {h->capacity, h->mask, h->elem_size, h->cell_size};
  return g;
}

/* Copy with a compile-time size for each legal elem_size, so memcpy inlines. */
static inline void umbp_ring__copy(void *dst, const void *src, uint32_t n) {
  switch (n) {
  case 8: memcpy(dst, src, 8); break;
  case 16: memcpy(dst, src, 16); break;
  case 24: memcpy(dst, src, 24); break;
  case 32: memcpy(dst, src, 32); break;
  case 40: memcpy(dst, src, 40); break;
  case 48: memcpy(dst, src, 48); break;
  case 56: memcpy(dst, src, 56); break;
  default: memcpy(dst, src, n); break;
  }
}

/* Help a position past a cell found claimed/completed for `from`.  Relaxed:
 * positions are hints (design note).  Failure means someone else helped. */
static inline void umbp_ring__help(_Atomic uint64_t *p, uint64_t from) {
  uint64_t e = from;
  atomic_compare_exchange_strong_explicit(p, &e, from + 1, memory_order_relaxed, memory_order_relaxed);
}

/* Advance a position to `to` once positions [from, to) are all claimed by us;
 * never moves it backwards (others may have helped it further). Relaxed. */
static inline void umbp_ring__advance(_Atomic uint64_t *p, uint64_t from, uint64_t to) {
  uint64_t cur = from;
  while ((int64_t)(to - cur) > 0 &&
         !atomic_compare_exchange_weak_explicit(p, &cur, to, memory_order_relaxed, memory_order_relaxed)) {
  }
}

/* ---- hot paths --------------------------------------------------------------------- */

/* Capacity (cells) and payload size of a ring that passed check_header/init. */
static inline uint32_t umbp_ring_capacity(const void *ring) {
  return ((const struct umbp_ring_hdr *)ring)->capacity;
}
static inline uint32_t umbp_ring_elem_size(const void *ring) {
  return ((const struct umbp_ring_hdr *)ring)->elem_size;
}

/* Enqueue up to n elements (n * elem_size contiguous bytes at elems) as one
 * run of consecutive positions.  Returns how many went in, in order from the
 * start of elems; 0 when the ring is full (or n == 0).  Fewer than n when the
 * ring fills up or another producer takes the next position first.
 * Calling context: any thread of any process that maps the ring (init'd or
 * check_header'd); `owner` is the caller's nonzero 16-bit process id (0 works
 * but cannot be repaired).  Lock-free, never blocks.
 * Ordering: each claim CAS acquires [A2] (pairs with the consumer's release
 * [R2] of the previous lap) before the payload is overwritten; each element is
 * published by store-release [R1], paired with the consumer's claim [A1].
 * One CAS per cell plus one position advance per call. */
static inline unsigned umbp_ring_enqueue_burst_g(void *ring, const struct umbp_ring_geo *g, const void *elems, unsigned n,
                                                 uint16_t owner) {
  struct umbp_ring_hdr *h = (struct umbp_ring_hdr *)ring;
  const uint32_t cap = g->capacity, esz = g->elem_size;
  const unsigned char *src = (const unsigned char *)elems;
  if (n > cap) n = cap;
  if (n == 0) return 0;

  uint64_t pos = atomic_load_explicit(&h->enq_pos, memory_order_relaxed);
  unsigned k = 0;
  while (k < n) {
    struct umbp_ring_cell *c = umbp_ring__cellg(h, g, pos + k);
    uint64_t w = atomic_load_explicit(&c->word, memory_order_relaxed);
    int64_t d = umbp_ring__seqdiff(umbp_ring__wseq(w), pos + k);
    if (d == 0 && umbp_ring__wkind(w) == UMBP_RING_STABLE) {
      /* [A2] acquire: the previous lap's consumer finished reading. */
      if (atomic_compare_exchange_strong_explicit(&c->word, &w,
                                                  umbp_ring__word(pos + k, UMBP_RING_WRITING, owner),
                                                  memory_order_acquire, memory_order_relaxed)) {
        UMBP_RING__HOOK(UMBP_RING_HOOK_PRODUCER_CLAIMED, ring, pos + k, owner);
        k++;
      }
      continue; /* claimed, or lost the race: look at the cell again */
    }
    if (k > 0) break; /* keep the run we have */
    if (d < 0) return 0; /* previous lap not consumed yet: full */
    /* Position taken (WRITING) or already completed: help and retry. */
    umbp_ring__help(&h->enq_pos, pos);
    pos = atomic_load_explicit(&h->enq_pos, memory_order_relaxed);
  }
  umbp_ring__advance(&h->enq_pos, pos, pos + k);
  for (unsigned i = 0; i < k; i++) {
    struct umbp_ring_cell *c = umbp_ring__cellg(h, g, pos + i);
    umbp_ring__copy(c->payload, src + (size_t)i * esz, esz);
    /* [R1] publish the payload; pairs with the consumer's claim [A1]. */
    atomic_store_explicit(&c->word, umbp_ring__word(pos + i + 1, UMBP_RING_STABLE, 0), memory_order_release);
  }
  return k;
}

/* One pass of the consumer: claim up to n elements among at most max_pos (<=
 * 64) consecutive positions starting at deq_pos (tombstones are claimed and
 * released on the way), advance deq_pos once, then copy out and release.
 * Returns the elements written to dst; *ret_npos = positions consumed,
 * tombstones included (0: empty).  Ordering as umbp_ring_dequeue_burst. */
static inline unsigned umbp_ring__dequeue_pass(void *ring, const struct umbp_ring_geo *g, unsigned char *dst, unsigned n,
                                               unsigned max_pos, uint16_t owner, unsigned *ret_npos) {
  struct umbp_ring_hdr *h = (struct umbp_ring_hdr *)ring;
  const uint32_t cap = g->capacity, esz = g->elem_size;
  uint64_t pos = atomic_load_explicit(&h->deq_pos, memory_order_relaxed);
  unsigned k = 0, real = 0;
  uint64_t skips = 0; /* bit i: position pos + i was a tombstone, already released */
  *ret_npos = 0;
  while (real < n && k < max_pos) {
    struct umbp_ring_cell *c = umbp_ring__cellg(h, g, pos + k);
    uint64_t w = atomic_load_explicit(&c->word, memory_order_relaxed);
    int64_t d = umbp_ring__seqdiff(umbp_ring__wseq(w), pos + k + 1);
    if (d == 0 && umbp_ring__wkind(w) == UMBP_RING_STABLE) {
      /* [A1] acquire: the producer's payload is visible. */
      if (atomic_compare_exchange_strong_explicit(&c->word, &w,
                                                  umbp_ring__word(pos + k + 1, UMBP_RING_READING, owner),
                                                  memory_order_acquire, memory_order_relaxed)) {
        UMBP_RING__HOOK(UMBP_RING_HOOK_CONSUMER_CLAIMED, ring, pos + k, owner);
        real++;
        k++;
      }
      continue; /* claimed, or lost the race: look at the cell again */
    }
    if (d == 0 && umbp_ring__wkind(w) == UMBP_RING_SKIP) {
      /* Claim and release a tombstone in one CAS: [A3] acquire from the
       * repair's [R3], [R2s] release to the next lap's producer [A2]. */
      if (atomic_compare_exchange_strong_explicit(&c->word, &w,
                                                  umbp_ring__word(pos + k + cap, UMBP_RING_STABLE, 0),
                                                  memory_order_acq_rel, memory_order_relaxed)) {
        skips |= UINT64_C(1) << k;
        k++;
      }
      continue;
    }
    if (k > 0) break; /* keep the run we have */
    if (d < 0) return 0; /* not yet full (free or WRITING): empty */
    /* READING by another consumer, already consumed, or overwritten in
     * place (umbp_ring_enqueue_overwrite, which leaves deq_pos behind): go
     * on from the oldest position that can still hold an element. Every
     * position below enq_pos - cap is done: its cell was claimed for the
     * next lap (invariant 3), which needs it released or overwritten. */
    uint64_t lo = atomic_load_explicit(&h->enq_pos, memory_order_relaxed) - cap;
    if ((int64_t)(lo - pos) > 1)
      umbp_ring__advance(&h->deq_pos, pos, lo);
    else
      umbp_ring__help(&h->deq_pos, pos);
    pos = atomic_load_explicit(&h->deq_pos, memory_order_relaxed);
  }
  umbp_ring__advance(&h->deq_pos, pos, pos + k);
  unsigned got = 0;
  for (unsigned i = 0; i < k; i++) {
    if (skips & (UINT64_C(1) << i)) continue;
    struct umbp_ring_cell *c = umbp_ring__cellg(h, g, pos + i);
    umbp_ring__copy(dst + (size_t)got * esz, c->payload, esz);
    got++;
    /* [R2] the payload has been read; pairs with the next producer's [A2]. */
    atomic_store_explicit(&c->word, umbp_ring__word(pos + i + cap, UMBP_RING_STABLE, 0), memory_order_release);
  }
  *ret_npos = k;
  return got;
}

/* Dequeue up to n elements into elems (room for n * elem_size bytes), oldest
 * first, from one run of consecutive positions.  Tombstones (SKIP cells) are
 * consumed and discarded on the way and are not counted.  Returns how many
 * elements were written to elems; 0 when the ring is empty (or n == 0).
 * Fewer than n when the ring runs dry, the next position is claimed by another
 * consumer first, or the run reached UMBP_RING_DEQUEUE_RUN positions
 * (tombstones included).
 * Claims are made first, copies and releases after, and elements only leave
 * the ring in the pass that returns them: a process killed inside the call
 * leaves every element it had not returned in a READING cell for repair.
 * Calling context as umbp_ring_enqueue_burst.  Lock-free, never blocks.
 * Ordering: each claim CAS acquires [A1] (pairs with the producer's [R1])
 * before the payload is read; each cell is handed to the next lap by
 * store-release [R2], paired with that producer's claim [A2]. */
static inline unsigned umbp_ring_dequeue_burst_g(void *ring, const struct umbp_ring_geo *g, void *elems, unsigned n, uint16_t owner) {
  if (n == 0) return 0;
  for (;;) {
    unsigned npos;
    unsigned got = umbp_ring__dequeue_pass(ring, g, (unsigned char *)elems, n, UMBP_RING_DEQUEUE_RUN, owner, &npos);
    /* Return as soon as a pass has handed out anything: an element leaves the
     * ring only in the pass whose call returns it, so a consumer killed in
     * the middle of a call loses nothing the call had not yet returned (its
     * claims are READING and repair hands them over).  Another pass only
     * follows a pass that met nothing but tombstones. */
    if (got || npos == 0) return got;
  }
}

/* As the _g operations, with the geometry read from the shared line 0 on
 * each call: tests and single-owner tools only (design note, "Trust"). */
static inline unsigned umbp_ring_enqueue_burst(void *ring, const void *elems, unsigned n, uint16_t owner) {
  struct umbp_ring_geo g = umbp_ring__geo_shared(ring);
  return umbp_ring_enqueue_burst_g(ring, &g, elems, n, owner);
}
static inline unsigned umbp_ring_dequeue_burst(void *ring, void *elems, unsigned n, uint16_t owner) {
  struct umbp_ring_geo g = umbp_ring__geo_shared(ring);
  return umbp_ring_dequeue_burst_g(ring, &g, elems, n, owner);
}

/* Enqueue one element.  Returns 0, or -ENOSPC when the ring is full.  Context
 * and ordering as umbp_ring_enqueue_burst. */
static inline int umbp_ring_enqueue(void *ring, const void *elem, uint16_t owner) {
  return umbp_ring_enqueue_burst(ring, elem, 1, owner) == 1 ? 0 : -ENOSPC;
}

/* Dequeue one element into elem (elem_size bytes, written only on success).
 * Returns 0, or -EAGAIN when the ring is empty.  Context and ordering as
 * umbp_ring_dequeue_burst. */
static inline int umbp_ring_dequeue(void *ring, void *elem, uint16_t owner) {
  return umbp_ring_dequeue_burst(ring, elem, 1, owner) == 1 ? 0 : -EAGAIN;
}

#endif
