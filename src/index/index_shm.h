/* SPDX-License-Identifier: Apache-2.0 */
/* Shared-memory structures of the block index (frozen layout; see index.c for
 * the overview and its source map for each concern's design note). Integers
 * only. */
#ifndef UMBP_INDEX_SHM_H
#define UMBP_INDEX_SHM_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "umbp/index.h" /* UMBP_KEY_HASH_MAX: the key's hash bytes in the segment are the public key's */
#include "umbp/pool.h"

#define UMBP_BUCKET_WAYS 12
#define UMBP_MAX_PROBE 16 /* buckets a key may live from its home */
/* Buckets for a pool of n slots: n/8, 1.5 ways a slot, so a full pool fills
 * 66.7% of the ways, and 1M slots take 8 MiB of buckets, as 1M entries do
 * in rte_hash. Linear probing over 12-way buckets kept every key within
 * 13 buckets of its home at that load through 100M random insert+remove
 * pairs on 1M slots (simulated; the former 10-way buckets at 1.6 ways a slot
 * reached 13 as well); test_full_pool_churn checks it on a real pool. */
#define UMBP_BUCKETS_FOR(n) ((uint32_t)(((uint64_t)(n) * 3 + 2 * UMBP_BUCKET_WAYS - 1) / (2 * UMBP_BUCKET_WAYS)))

/* The full key of a block, kept in its slot's metadata for exact comparison. */
struct umbp_key_shm {
  uint32_t ns;
  uint16_t tp, pcp, dcp, pp;
  uint16_t group;
  uint8_t hash_len;
  uint8_t pad;
  uint8_t hash[UMBP_KEY_HASH_MAX];
};
_Static_assert(sizeof(struct umbp_key_shm) == 48, "key frozen");

/* Slot states (low 8 bits of slot_meta.state); bits 8..23 owner (registry slot+1)
 * for RESERVED; bits 24..63 a generation that bumps on every transition. */
enum umbp_slot_state {
  UMBP_SLOT_FREE = 0,      /* on its partition's free ring (or being dequeued) */
  UMBP_SLOT_RESERVED = 1,  /* owned by one process, bytes being written */
  UMBP_SLOT_PUBLISHED = 2, /* in the index, readable, pinnable */
  UMBP_SLOT_EVICTING = 3,  /* an evictor/remover won it; pins are being checked */
  UMBP_SLOT_RETIRED = 4,   /* layouts before 6 only (a removed slot waiting for a grace period);
                            * no slot enters it since layout 6, where a removed slot is FREE at once */
};

/* One cache line: a hit reads its state and key from a single line. */
struct umbp_slot_meta {
  _Atomic uint64_t state;  /* state | owner << 8 | gen << 24 */
  /* Written by the slot's owner while RESERVED, before the release store of
   * PUBLISHED; a lookup trusts what it read only if the state word is the
   * same PUBLISHED word before and after its reads (way_check()). */
  struct umbp_key_shm key;
  uint32_t reserved; /* the grace-period token of layouts before 6 */
  _Atomic uint8_t ref;     /* CLOCK reference bit */
  /* 1 while the slot is counted in its namespace's block count: set by the
   * slot's owner right after its count change is applied (umbp_ix_ns_count_set()
   * in namespaces.c; a reaper finishes a dead owner's), so a reaper repeating a
   * dead process's step never counts twice */
  _Atomic uint8_t counted;
  uint8_t pad[2];
};
_Static_assert(sizeof(struct umbp_slot_meta) == 64, "slot meta is one cache line");

/* A bucket: twelve ways in one cache line. A way's slot word is
 * sig_hi << 24 | (slot id + 1): way w is linked iff slot[w] != 0 (slot ids
 * are below UMBP_MAX_SLOTS, so the low 24 bits of a linked way are never 0).
 * A key's 16-bit signature is split: its low byte is sig[w], which a lookup
 * matches against all twelve ways in one vector compare, and its high byte
 * rides in the slot word, which the lookup loads anyway before it follows a
 * way, so a way whose low byte matches by chance costs no metadata read
 * unless the high byte matches too (1 in 65536 for a different key, as with
 * a 16-bit signature). sig[w] is a hint: the slot word is what links an
 * entry (its release store publishes the key); the sig byte is written after
 * it by the inserter that won the slot word and cleared before it by the
 * remover, so a reader that follows a stale hint finds an empty way or a key
 * that does not compare equal, never a wrong block. */
#define UMBP_MAX_SLOTS ((1u << 24) - 1)
#define UMBP_WAY_SLOT(v) ((v) & 0xffffffu) /* slot id + 1, 0 empty */
#define UMBP_WAY_SIG_HI(v) ((v) >> 24)
/* ovf describes the keys homed here that live in later buckets (displaced
 * keys): their filter bits (umbp_ovf_bit() of each key's hash) | their count
 * << 16 | reach << 24, the furthest distance any of them has had since the
 * count was last 0 (index_internal.h). One word, so that one CAS changes all
 * three. */
struct umbp_bucket {
  _Atomic uint8_t sig[UMBP_BUCKET_WAYS];  /* low byte of each way's signature; 0 no key */
  _Atomic uint32_t ovf;                   /* displaced keys: filter | count << 16 | reach << 24 */
  _Atomic uint32_t slot[UMBP_BUCKET_WAYS]; /* 0 empty; else sig_hi << 24 | (slot + 1) */
};
_Static_assert(sizeof(struct umbp_bucket) == 64, "bucket is one cache line");
_Static_assert(offsetof(struct umbp_bucket, ovf) == 12, "ovf is bytes 12..15 of the bucket");
_Static_assert(offsetof(struct umbp_bucket, slot) == 16, "bucket frozen");

/* Pins: one byte per (process, slot), a slot is pinned iff any is non-zero.
 * Process-major: registry slot q's bytes are one dense array of
 * umbp_pin_stride(slots) bytes at q * stride, 1 MiB for 1M slots, so a pin
 * touches a line of its own process's array (64 slots a line, written by that
 * process only) in a region that caches and TLBs hold, instead of a line per
 * slot in a 64 MiB region shared by all processes. Removers read the bytes of
 * the processes in the index header's pin_procs mask. */
static inline uint64_t umbp_pin_stride(uint64_t slots) { return (slots + 63) & ~(uint64_t)63; }
static inline uint64_t umbp_pin_region_bytes(uint64_t slots) { return (uint64_t)UMBP_MAX_PROCS * umbp_pin_stride(slots); }

/* A thread's line: one per (process, thread), 128 bytes. The first line is
 * written by the owning thread only; the second, `applied`, by other threads
 * (namespaces.c), kept apart so that their writes do not take away the line
 * every lookup writes. */
struct umbp_reader_shm {
  /* The owning thread's single-key lookups not yet added to its process's
   * counter row: lookups in the low 32 bits, hits in the high 32. Written and
   * read by that thread only, on the line each lookup writes anyway (see
   * count_single() in index_inline.h); other processes never read it. */
  uint64_t pend_lookups;
  uint64_t pend_pins; /* of those hits, the pins (single umbp_lookup_pin) */
  /* The namespace-count change this thread is making (namespaces.c): valid
   * while rec_slot != 0 (stored last, release); the reaper of a dead process
   * finishes it. rec_seq numbers the thread's changes (low 19 bits used). */
  _Atomic uint32_t rec_slot; /* 1 + the slot whose counted flag changes; 0 none */
  _Atomic uint32_t rec_ns;
  _Atomic uint32_t rec_seq;
  _Atomic uint8_t rec_flag; /* the flag it is set to: 1 counted in, 0 out */
  uint8_t pad0[3];
  uint64_t pad1[4];
  /* The newest of this thread's changes that another thread saw applied
   * (it replaced the namespace's count word that named it). */
  _Atomic uint32_t applied __attribute__((aligned(64)));
  uint32_t pad2[15];
};
_Static_assert(sizeof(struct umbp_reader_shm) == 128, "thread line frozen");

struct umbp_ns_shm {
  _Atomic uint32_t state; /* 0 free, 1 in use */
  uint32_t id;
  uint32_t name_len;
  uint32_t reserved;
  _Atomic uint64_t quota_bytes; /* 0: none */
  uint64_t reserved2;
  char name[136];
  uint8_t pad[192 - 168];
  /* The block count, lock-free (namespaces.c): the count (low 32 bits), the
   * thread whose change made this value (NSW_WRITER: process row * 64 +
   * thread + 1; 0 none) and that change's sequence number (NSW_SEQ). */
  _Atomic uint64_t count_word;
  uint8_t pad2[256 - 200];
};
_Static_assert(sizeof(struct umbp_ns_shm) == 256, "namespace frozen");
_Static_assert(offsetof(struct umbp_ns_shm, count_word) % 64 == 0, "the count word has a line of its own");
#define NSW_SEQ_BITS 19
#define NSW_SEQ_MASK ((1u << NSW_SEQ_BITS) - 1)
#define NSW_COUNT(w) ((uint32_t)(w))
#define NSW_WRITER(w) ((unsigned)((w) >> 32) & 0x1fffu)
#define NSW_SEQ(w) ((uint32_t)((w) >> 45) & NSW_SEQ_MASK)
#define NSW_MAKE(c, wr, seq) \
  ((uint64_t)(uint32_t)(c) | (uint64_t)((wr) & 0x1fffu) << 32 | (uint64_t)((seq) & NSW_SEQ_MASK) << 45)

enum umbp_counter_id {
  UMBP_CTR_LOOKUPS = 0,
  UMBP_CTR_HITS,
  UMBP_CTR_MISSES,
  UMBP_CTR_INSERTS,
  UMBP_CTR_DUPLICATES,
  UMBP_CTR_EVICTIONS,
  UMBP_CTR_REMOVES,
  UMBP_CTR_PINS,
  UMBP_CTR_COUNT
};

/* Counters are written only by their own process (one row per registry slot,
 * kept when the process goes and added to by the slot's next one; plus the
 * "reaped" row, into which builds before this one folded a reaped
 * process's row: still summed, no longer written) so that a lookup
 * never writes a line another process writes. */
struct umbp_counter_row {
  _Atomic uint64_t ns[UMBP_MAX_NAMESPACES][UMBP_CTR_COUNT];
  _Atomic uint64_t part[UMBP_MAX_PARTITIONS][UMBP_CTR_COUNT];
};

struct umbp_event_shm {
  uint8_t type; /* 1 stored, 2 removed, 3 cleared */
  uint8_t pad[7];
  struct umbp_key_shm key;
};
_Static_assert(sizeof(struct umbp_event_shm) == 56, "event frozen");

/* Whether an off_ring word says slots may be off the ring. */
#define UMBP_OFF_RING_SET(w) (((w) & 0xffffu) != 0)

struct umbp_index_hdr {
  _Atomic uint64_t reserved_epoch __attribute__((aligned(64))); /* the grace-period token of layouts before 6 */
  _Atomic uint32_t ns_lock __attribute__((aligned(64)));
  _Atomic uint32_t n_namespaces;
  _Atomic uint32_t evict_lock __attribute__((aligned(64)));
  _Atomic uint32_t clock_hand[UMBP_MAX_PARTITIONS] __attribute__((aligned(64)));
  /* Per partition: free slots left off the free ring because a stalled
   * process held the ring up (a hint: reserves then scan for FREE slots,
   * reserve.c), and where that scan goes on from. Since layout 8 the low
   * 16 bits count such frees (saturating) and the high 16 bits count the
   * clears (and frees past saturation), so a clear after a scan cannot erase
   * a free made during it (UMBP_OFF_RING_SET). */
  _Atomic uint32_t off_ring[UMBP_MAX_PARTITIONS] __attribute__((aligned(64)));
  _Atomic uint32_t scan_hand[UMBP_MAX_PARTITIONS];
  /* Bit q: partition q's free ring may hold stale entries (a scan took
   * slots, a reaper enqueued a slot again, or a process died):
   * umbp_reclaim() and the evictor tidy that ring (reserve.c). Zero in a new
   * pool; unused before layout 8. */
  _Atomic uint64_t untidy __attribute__((aligned(64)));
  _Atomic uint64_t low_watermark_pct;  /* eviction starts below this % free */
  _Atomic uint64_t high_watermark_pct; /* and stops at this % free */
  /* bit q: registry slot q may hold pins (set before its first pin, cleared
   * once its bytes are zeroed at detach or reap) */
  _Atomic uint64_t pin_procs __attribute__((aligned(64)));
  /* 1 once any process has drained the event ring (umbp_events_drain()):
   * removed events are recorded from then on. Before, nobody reads them, so
   * removals skip the ring (events.c). Zero in a new pool. In the line every
   * remover already reads for pin_procs. */
  _Atomic uint32_t events_on;
};

#endif
