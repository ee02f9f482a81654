/* SPDX-License-Identifier: Apache-2.0 */
/*
 * pool.h — the shared-memory pool segment and its process registry.
 *
 * A pool is one POSIX shared-memory object (/dev/shm/umbp.NAME, or a file
 * umbp.NAME on a hugetlbfs mount) that holds a versioned header, the process
 * registry, the block index and the slot arena, split into one partition per
 * chosen NUMA node. Every process maps it at its own address; the segment
 * holds only integers and offsets. The bucket array and slot metadata may
 * live in a second file on 2 MiB pages (umbp-index.NAME on the hugetlbfs
 * mount, see enum umbp_index_pages), mapped over their place in the same
 * address range, so offsets are the same either way.
 *
 * Lifetime rules:
 *  - umbp_pool_create() is exclusive (a second creator gets -EEXIST) and
 *    writes the header's magic last; attachers that arrive earlier wait up to
 *    their timeout for it. The creator holds a lock on the file until then,
 *    so a pool whose creator died half-way (killed while pre-faulting) is
 *    known at once: attachers get -EOWNERDEAD without waiting, and the next
 *    umbp_pool_create() of that name replaces it (with a warning through the
 *    log callback).
 *  - A pool outlives the processes that use it until umbp_pool_destroy() (or
 *    `umbp pool destroy NAME`) unlinks it; mappings that already exist stay
 *    valid until their owners detach. A reboot removes it (tmpfs).
 *  - Each read-write attachment claims a slot in the process registry; the
 *    claim is tied to an open-file-description lock that the kernel drops when
 *    the process dies, so any process can tell a dead slot from a live one
 *    without trusting a pid. umbp_pool_reap() frees dead slots together with
 *    the per-process state hung on them (pins, reservations).
 *
 * Threading: a umbp_pool handle may be used by many threads of its process at
 * once unless a function says otherwise; create/attach/detach/destroy are not
 * to be raced against other calls on the same handle.
 */
#ifndef UMBP_POOL_H
#define UMBP_POOL_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "umbp/common.h"

#ifdef __cplusplus
extern "C" {
#endif

#define UMBP_NAME_MAX 64          /* pool names: [A-Za-z0-9._-]{1,64}; new ones not starting with '-' */
#define UMBP_MAX_PARTITIONS 16
#define UMBP_MAX_PROCS 64         /* registry slots */
#define UMBP_MAX_THREADS 64       /* reader-state slots per process */
#define UMBP_MAX_NAMESPACES 256
#define UMBP_ATTACH_TIMEOUT_MS 10000u  /* default wait of an attach for a creator still initialising, ms */

typedef struct umbp_pool umbp_pool;

enum umbp_mempolicy {
  UMBP_MPOL_BIND = 0,      /* default: each partition bound to its node */
  UMBP_MPOL_PREFERRED = 1, /* prefer the node, fall back to others */
  UMBP_MPOL_INTERLEAVE = 2,/* interleave the whole arena over the chosen nodes */
  UMBP_MPOL_NONE = 3,      /* leave placement to the kernel */
};

/* Where the lookup-hot part of the index (bucket array and slot metadata:
 * 72 MiB for 1M slots) lives. Lookups touch it at random, so on 4 KiB pages
 * nearly every lookup also misses the TLB; on 2 MiB pages it takes 36 TLB
 * entries for 1M slots. Huge placement puts those regions in a second file,
 * umbp-index.NAME on the hugetlbfs mount, mapped over their place in the
 * pool's address range (the rest of the pool stays in /dev/shm). */
enum umbp_index_pages {
  UMBP_INDEX_PAGES_TRY = 0,   /* default: 2 MiB pages if a hugetlbfs mount of
                                 2 MiB pages has enough free, else 4 KiB */
  UMBP_INDEX_PAGES_HUGE = 1,  /* 2 MiB pages or fail (-ENOENT no mount, -ENOSPC too few free) */
  UMBP_INDEX_PAGES_SMALL = 2, /* the pool's own pages (4 KiB in /dev/shm) */
};

enum umbp_role {
  UMBP_ROLE_OTHER = 0,
  UMBP_ROLE_SCHEDULER = 1,
  UMBP_ROLE_WORKER = 2,
  UMBP_ROLE_DAEMON = 3,
  UMBP_ROLE_TOOL = 4,
};

typedef struct umbp_pool_params {
  uint64_t capacity;        /* bytes of slot arena (rounded down to whole slots) */
  uint64_t slot_size;       /* bytes per block slot; multiple of 64, >= 4096 */
  int numa_nodes[UMBP_MAX_PARTITIONS]; /* chosen nodes; n_numa_nodes == 0: every node with memory */
  unsigned n_numa_nodes;
  int mempolicy;            /* enum umbp_mempolicy */
  bool group_access;        /* mode 0660 and group `group` instead of 0600 */
  gid_t group;
  bool hugepages;           /* back the pool by a file on a hugetlbfs mount */
  const char *hugetlbfs_dir;/* NULL: the first hugetlbfs mount in /proc/mounts */
  unsigned prefault_threads;/* 0: min(online CPUs, 8) */
  bool no_prefault;         /* skip pre-faulting the slot bytes (the metadata is always populated); they
                             * are still reserved (fallocate), so a later full /dev/shm cannot SIGBUS a
                             * writer */
  uint32_t event_capacity;  /* events kept in the event ring; 0: 65536 */
  umbp_progress_fn progress;/* pre-fault ("prefault") progress, from 0 (before the first page) to the total, or
                             * with no_prefault the reservation's ("reserve": 0, then the total); may be NULL */
  void *progress_arg;
  int index_pages;          /* enum umbp_index_pages; ignored with hugepages (all huge) */
  bool no_reserve;          /* with no_prefault: do not reserve the slot bytes either (sparse: a later
                             * full /dev/shm kills a writer with SIGBUS; a warning says so). Tests. */
} umbp_pool_params;

/* Fill defaults: capacity 0 (must be set), slot_size 256 KiB, all nodes, BIND, 0600. */
UMBP_API void umbp_pool_params_init(umbp_pool_params *p);

typedef struct umbp_attach_opts {
  bool read_only;       /* map PROT_READ, claim no registry slot (inspection) */
  int role;             /* enum umbp_role, recorded in the registry */
  int rank;             /* TP rank or -1 */
  unsigned timeout_ms;  /* wait for a creator still initialising; 0: UMBP_ATTACH_TIMEOUT_MS */
} umbp_attach_opts;

/* Fill defaults: read-write, UMBP_ROLE_OTHER, rank -1, UMBP_ATTACH_TIMEOUT_MS. Accepts
 * NULL (does nothing). */
UMBP_API void umbp_attach_opts_init(umbp_attach_opts *o);

/* Create pool `name` and attach to it read-write as its first process.
 * A half-made pool of that name whose creator died is replaced (its own
 * user's only). Returns 0 and *ret_pool, or: -EINVAL bad name/params; -EEXIST
 * a pool of that name exists or is being created; -ENOSPC /dev/shm (or hugetlbfs) too small; -ENOMEM more
 * than available memory (both refused before any large allocation); -EMFILE
 * this process already has 64 read-write handles attached; -EACCES, -EIO.
 * The detailed reason is in umbp_last_error(). Any thread. */
UMBP_API int umbp_pool_create(const char *name, const umbp_pool_params *params, umbp_pool **ret_pool);

/* Attach to an existing pool. Returns 0 and *ret_pool, or: -ENOENT no such
 * pool; -EACCES no permission; -ETIMEDOUT creator still initialising after
 * timeout_ms; -EOWNERDEAD the creator died before finishing the pool (at
 * once, not after the timeout); -EPROTO other layout version or ABI; -EBADMSG truncated or
 * corrupted segment; -EUSERS registry full; -EMFILE this process already has
 * 64 read-write handles attached (of any pools). Never crashes on a bad
 * segment. */
UMBP_API int umbp_pool_attach(const char *name, const umbp_attach_opts *opts, umbp_pool **ret_pool);

/* Release this process's registry slot and unmap. Accepts NULL, and a handle
 * detached already (nothing happens; a warning goes to the log callback).
 * Not to be called while other threads still use the handle. */
UMBP_API void umbp_pool_detach(umbp_pool *pool);

/* Unlink pool `name` (existing mappings stay valid). 0, -ENOENT, -EACCES. */
UMBP_API int umbp_pool_destroy(const char *name);

/* Free registry slots of dead processes and the state hung on them (pins,
 * reservations, reader lines, locks, half-done ring operations). Returns the
 * number of slots reaped (>= 0), or -EINVAL (NULL pool), -EROFS (read-only
 * handle), -ECHILD (handle inherited through fork()). Any thread, any
 * process, concurrently with everything else. */
UMBP_API int umbp_pool_reap(umbp_pool *pool);

/* Record that this process is alive and working (heartbeat_ns, a relaxed
 * store to its registry slot). Cheap; any thread. No effect on a NULL or
 * read-only handle. */
UMBP_API void umbp_pool_heartbeat(umbp_pool *pool);

/* Check that `name` is a valid pool name (1 to UMBP_NAME_MAX characters from
 * [A-Za-z0-9._-], not "." or ".."): 0 or -EINVAL (with message).
 * umbp_pool_create() also refuses a name that starts with '-', which every
 * command would read as an option. */
UMBP_API int umbp_pool_name_valid(const char *name);

typedef struct umbp_partition_info {
  int numa_node;         /* -1: no NUMA placement */
  int mempolicy;
  uint32_t first_slot, slot_count;
  uint64_t bytes;
  uint64_t free_slots;   /* slots on the free queue right now (0 before the index exists) */
} umbp_partition_info;

typedef struct umbp_pool_info {
  char name[UMBP_NAME_MAX + 1];
  char path[256];              /* file backing the pool */
  uint16_t layout_major, layout_minor;
  uint64_t compat_features, incompat_features;
  uint64_t abi_fingerprint;
  uint64_t total_size;         /* bytes of the whole segment */
  uint64_t slot_size;
  uint32_t slot_count;
  uint32_t n_partitions;
  umbp_partition_info partitions[UMBP_MAX_PARTITIONS];
  uint8_t uuid[16];
  uint64_t run_generation;
  uint64_t created_ns;         /* CLOCK_REALTIME */
  int creator_pid;
  uint32_t creator_uid;
  bool hugepages;
  bool index_hugepages;        /* buckets and slot metadata on 2 MiB pages (umbp-index.NAME) */
  uint64_t index_huge_bytes;   /* bytes of that file (0 when not) */
  uint32_t max_procs;
  uint32_t procs_live;         /* registry slots whose owner is alive */
  uint32_t procs_dead;         /* claimed slots whose owner died (reapable) */
} umbp_pool_info;

/* Describe the pool. 0 or -EINVAL. Any thread; read-only handles too. */
UMBP_API int umbp_pool_get_info(umbp_pool *pool, umbp_pool_info *ret_info);

typedef struct umbp_proc_info {
  unsigned slot;
  int pid;
  uint64_t start_time;   /* clock ticks since boot, from /proc/PID/stat */
  int role, rank;
  uint64_t attach_ns, heartbeat_ns; /* CLOCK_REALTIME */
  uint64_t incarnation;  /* bumps each time the slot is claimed */
  bool alive;
  bool self;             /* this handle's own slot */
  char comm[16];
} umbp_proc_info;

/* Fill up to max entries with the claimed registry slots; returns the number
 * written (>= 0), or -EINVAL (NULL pool, NULL out with max > 0). Any thread;
 * read-only handles too. A snapshot: processes attach and die meanwhile. */
UMBP_API int umbp_pool_list_procs(umbp_pool *pool, umbp_proc_info *out, unsigned max);

/* This handle's registry slot, or -1 for a read-only handle or NULL. */
UMBP_API int umbp_pool_proc_slot(const umbp_pool *pool);

/* Static name of an enum umbp_role value ("other" for unknown values); never NULL,
 * never freed. Any thread. */
UMBP_API const char *umbp_role_name(int role);

#ifdef __cplusplus
}
#endif
#endif
