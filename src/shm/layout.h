/* SPDX-License-Identifier: Apache-2.0 */
/*
 * layout.h — the frozen byte layout of a pool segment (internal).
 *
 * Design note. The segment begins with a 4 KiB header, then regions whose
 * offsets (from the segment base) and sizes are recorded in the header's
 * region table, so a reader never derives a position from its own build's
 * constants. Everything in the segment is an integer, an index or an offset:
 * processes map it at different addresses (STYLE 6).
 *
 *   [header 4 KiB][registry][readers][namespaces][index header][buckets]
 *   [slot meta][pins][free rings][event ring][counters] ... [arena: partitions,
 *   each 2 MiB-aligned, slot_count_p * slot_size bytes]
 *
 * With UMBP_FEAT_INCOMPAT_INDEX_HUGE, [buckets][slot meta] start on a 2 MiB
 * boundary and end padded to one (umbp_index_huge_range()); that range of
 * the /dev/shm file is a hole never touched, and every process maps the
 * hugetlbfs file umbp-index.NAME over it (segment.c).
 *
 * The header is immutable after creation except for its trailing "mutable"
 * cache line (run generation, owner). The immutable part carries a checksum,
 * so a corrupted header is refused instead of followed. The magic is stored
 * last with release order; attachers load it with acquire order, which makes
 * every initialising store of the creator visible to them (pairing: the
 * release store at the end of pool_create_once() and the acquire loads in
 * umbp_pool_attach()'s wait for the magic and in umbp_header_validate(),
 * all in segment.c).
 *
 * Versioning: layout_major changes when an older build could misread the
 * segment (refused on attach, naming both versions); layout_minor adds
 * compatible fields. compat/incompat feature bits work as in pmdk's pool_hdr:
 * an unknown incompat bit is refused. The ABI fingerprint hashes the sizes and
 * alignments of the segment layer's shared structs, the limits they are sized
 * by and the cache-line size, folded with each module's own part (module.h:
 * the index adds its structs and its key hash's results on fixed inputs).
 *
 * Which module owns which region: the region ids below are the table's
 * frozen positions; the segment layer owns REGISTRY, FREERINGS (their
 * placement) and ARENA, and every other id is registered by the module that
 * owns it (module.h, src/modules.c).
 */
#ifndef UMBP_SHM_LAYOUT_H
#define UMBP_SHM_LAYOUT_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "umbp/pool.h"

#define UMBP_MAGIC 0x4c4f4f5050424d55ull /* "UMBPPOOL" little-endian */
#define UMBP_LAYOUT_MAJOR 9
#define UMBP_LAYOUT_MINOR 0
#define UMBP_HEADER_BYTES 4096u
#define UMBP_PART_ALIGN (2u << 20) /* 2 MiB: hugepage size, partition start alignment */

/* incompat feature bits (an attacher refuses unknown ones) */
#define UMBP_FEAT_INCOMPAT_HUGEPAGES (1ull << 0)
/* The bucket array and slot metadata live in a second file on a hugetlbfs
 * mount (umbp-index.NAME), mapped at [regions[BUCKETS].offset, + its size):
 * umbp_index_huge_range(). An attacher that does not map it would read the
 * /dev/shm file's hole there, so a build without this bit must refuse. */
#define UMBP_FEAT_INCOMPAT_INDEX_HUGE (1ull << 1)
/* Removed events go into the event ring only once a process has drained it
 * (the index header's events_on, src/index/events.c). A build without this
 * bit would drain without turning recording on, and its consumer would get
 * no removals from this build's removers, so it must refuse the pool. A pool
 * of an earlier build lacks the bit: a read-write attacher of this build
 * turns recording on there at once, as those builds always recorded. */
#define UMBP_FEAT_INCOMPAT_EVENTS_ON_DRAIN (1ull << 2)
#define UMBP_FEAT_INCOMPAT_KNOWN \
  (UMBP_FEAT_INCOMPAT_HUGEPAGES | UMBP_FEAT_INCOMPAT_INDEX_HUGE | UMBP_FEAT_INCOMPAT_EVENTS_ON_DRAIN)
/* compat feature bits (informational) */
#define UMBP_FEAT_COMPAT_MEMBARRIER (1ull << 0) /* layouts before 6: readers relied on membarrier(GLOBAL_EXPEDITED) */

enum umbp_region_id {
  UMBP_REG_REGISTRY = 0,
  UMBP_REG_READERS,
  UMBP_REG_NAMESPACES,
  UMBP_REG_INDEXHDR,
  UMBP_REG_BUCKETS,
  UMBP_REG_SLOTMETA,
  UMBP_REG_PINS,
  UMBP_REG_FREERINGS,
  UMBP_REG_EVENTS,
  UMBP_REG_COUNTERS,
  UMBP_REG_ARENA,
  UMBP_REG_COUNT
};
#define UMBP_REG_TABLE 16

struct umbp_region_desc {
  uint64_t offset; /* from the segment base, 64-byte aligned */
  uint64_t size;
};

struct umbp_partition_desc {
  int32_t numa_node; /* -1: none */
  uint32_t mempolicy;
  uint32_t first_slot;
  uint32_t slot_count;
  uint64_t offset;     /* of the partition's first slot, from the segment base */
  uint64_t bytes;      /* slot_count * slot_size */
  uint64_t ring_offset;/* this partition's free-slot ring, from the segment base */
  uint64_t ring_bytes;
};

struct umbp_shm_header {
  _Atomic uint64_t magic; /* UMBP_MAGIC once initialised (stored last, release) */
  uint16_t layout_major;
  uint16_t layout_minor;
  uint32_t header_bytes;
  uint64_t compat_features;
  uint64_t incompat_features;
  uint64_t abi_fingerprint;
  uint64_t total_size;
  uint32_t n_regions;
  uint32_t n_partitions;
  struct umbp_region_desc regions[UMBP_REG_TABLE];
  struct umbp_partition_desc partitions[UMBP_MAX_PARTITIONS];
  uint64_t slot_size;
  uint32_t slot_count;
  uint32_t max_procs;
  uint32_t max_threads;
  uint32_t max_namespaces;
  uint32_t n_buckets;      /* the index's (its layout hook): any count, not a power of two */
  uint32_t event_capacity; /* the index's: a power of two */
  uint8_t uuid[16];
  uint64_t created_ns;
  int32_t creator_pid;
  uint32_t creator_uid;
  uint32_t flags;
  uint32_t reserved0;
  char name[UMBP_NAME_MAX + 8];
  uint64_t header_checksum; /* FNV-1a of bytes [8, offsetof(header_checksum)) */
  /* ---- mutable part, not checksummed ---- */
  _Atomic uint64_t run_generation __attribute__((aligned(64)));
  _Atomic uint32_t owner_slot; /* registry slot + 1 of the owning daemon, 0: none */
  /* Generation of the published-key feed (/dev/shm/umbp.NAME.feed), 0: none.
   * Written by src/index/events.c under lock byte UMBP_LOCK_FEED after the
   * feed file is complete (release), read by every publish (acquire). It
   * was reserved1, always 0: a build without feeds ignores it and never
   * appends, and this build reads 0 from an older pool as "no feed yet". */
  _Atomic uint32_t feed_gen;
};

_Static_assert(sizeof(struct umbp_shm_header) <= UMBP_HEADER_BYTES, "header fits its page");
_Static_assert(offsetof(struct umbp_shm_header, magic) == 0, "magic first");
_Static_assert(sizeof(struct umbp_partition_desc) == 48, "partition desc frozen");
_Static_assert(sizeof(struct umbp_region_desc) == 16, "region desc frozen");

/* The range of the pool's address space that UMBP_FEAT_INCOMPAT_INDEX_HUGE
 * places in umbp-index.NAME: from the bucket array's start (2 MiB-aligned
 * in such a layout) to the end of the slot metadata, rounded up to 2 MiB. */
static inline void umbp_index_huge_range(const struct umbp_shm_header *h, uint64_t *off, uint64_t *len) {
  uint64_t a = UMBP_PART_ALIGN, end = h->regions[UMBP_REG_SLOTMETA].offset + h->regions[UMBP_REG_SLOTMETA].size;
  *off = h->regions[UMBP_REG_BUCKETS].offset;
  end = (end + a - 1) / a * a;
  *len = end > *off ? end - *off : 0;
}

/* ---- process registry --------------------------------------------------- */
enum umbp_proc_state { UMBP_PROC_FREE = 0, UMBP_PROC_LIVE = 1 };

/* One slot per attached read-write process. The slot's liveness is the OFD
 * lock on byte UMBP_LOCK_PROC_BASE + slot of the segment file, never the pid. */
struct umbp_proc_slot {
  _Atomic uint32_t state;
  uint32_t role;
  int32_t rank;
  int32_t pid;
  uint64_t start_time;
  uint64_t attach_ns;
  _Atomic uint64_t heartbeat_ns;
  _Atomic uint64_t incarnation;
  char comm[16];
  /* Per-process ledger used by the index: the slot a thread of this process
   * is freeing, from its FREE store until it is on its free ring
   * (umbp_ix_free_slot(), src/index/reserve.c). */
  _Atomic uint32_t inflight_slot[UMBP_MAX_THREADS];
  _Atomic uint64_t thread_bits; /* reader-state slots in use by this process's threads */
  _Atomic uint32_t orphans;     /* unused since layout 6 (retired slots left under this id) */
  uint32_t reserved0;
  uint8_t reserved[256 - 64 - 16];
};
_Static_assert(sizeof(struct umbp_proc_slot) == 512, "proc slot frozen");

#define UMBP_LOCK_PROC_BASE 0    /* byte i: registry slot i */
#define UMBP_LOCK_DAEMON 4096    /* byte held by the pool's daemon */
#define UMBP_LOCK_CREATE 4097    /* byte held by the creator until it has stored the magic */
#define UMBP_LOCK_FEED 4098      /* byte held while the published-key feed is opened or re-created (events.c) */

#endif
