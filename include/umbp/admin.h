/* SPDX-License-Identifier: Apache-2.0 */
/*
 * admin.h — for programs that own or watch a pool rather than store blocks in
 * it: a daemon, an inspector, a benchmark, a monitoring agent. `umbp daemon`,
 * `umbp inspect`, `umbp pool` and `umbp bench` use only this header and the
 * other public ones, so another program can do what they do.
 *
 * Design note. Two kinds of call live here.
 *  - Ownership: at most one daemon owns a pool. Ownership is an OFD write lock
 *    on one byte of the pool file (UMBP_LOCK_DAEMON in the internal layout),
 *    taken on the daemon's own handle: the kernel drops it when that open file
 *    description closes, i.e. when the daemon exits or is killed, so a
 *    restarted daemon can always take it and a second one never can. OFD locks
 *    do not report their holder's pid (F_OFD_GETLK gives l_pid -1), so the
 *    holder also stores its registry slot + 1 in the header's mutable
 *    owner_slot word; the pid shown to people comes from that registry slot. It
 *    is a hint for people (a daemon killed by SIGKILL leaves it behind); the
 *    lock alone decides. The header's run generation counts the pool's
 *    ownership runs: 1 when the pool is created, and one more each time a
 *    daemon takes the lock of a pool it did not create (an adoption after a
 *    restart); `umbp inspect`, `umbp pool info` and the daemon's metrics show
 *    it, so a restart is visible.
 *  - Inspection: snapshots of what the pool holds (the index's geometry, pins
 *    per process, the event ring, namespaces, free slots). They
 *    read with loads only, work on read-only handles (PROT_READ, no registry
 *    slot) and never change the segment, whoever calls them and however
 *    often. A snapshot is a scan, not an instant: slots, pins and counters move
 *    while it runs.
 * The pool's mapping and file are exposed (umbp_admin_pool_mapping(),
 * umbp_admin_pool_stat()) so that a long-running program can watch them: a
 * pool file truncated under a process, or a --no-prefault pool whose
 * /dev/shm filled, raises SIGBUS at the next touch of the lost pages. The
 * library's own handler writes one line naming the pool and lets the process
 * die (umbp_admin_pool_sigbus_quiet()); a program that wants more (the umbp
 * CLI's status 3) handles it itself (docs/operations.md, "SIGBUS on a pool").
 *
 * What such a program also needs is in the other headers: reaping dead
 * processes (umbp_pool_reap), the partitions and their free slots
 * (umbp_pool_get_info), the processes (umbp_pool_list_procs) in pool.h; the
 * slot census, counters, probe-length histogram and the evictor in index.h;
 * the invariants in check.h.
 *
 * Implemented in src/shm/daemon.c (the daemon lock), src/shm/admin.c (the
 * registry entry, the file and mapping, the hugetlbfs mount) and
 * src/index/inspect.c (the index's snapshots). Conventions: umbp/common.h.
 */
#ifndef UMBP_ADMIN_H
#define UMBP_ADMIN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>

#include "umbp/common.h"
#include "umbp/index.h"
#include "umbp/pool.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- the daemon lock ------------------------------------------------------- */

/* Take the pool's daemon lock on a read-write handle and record this process
 * as the owner (the header's owner_slot, a release store paired with the
 * acquire load of umbp_admin_daemon_query()). If this handle did not create
 * the pool, the header's run generation goes up by one (an atomic add,
 * acq_rel). Returns 0 and, when ret_run_generation is not NULL, the run
 * generation now; -EBUSY when another daemon holds the lock (the message names
 * its pid); -EROFS on a read-only handle; -EINVAL for NULL; -ECHILD on a handle
 * inherited through fork(); another -errno from fcntl. The lock lasts until
 * umbp_admin_daemon_unlock(), umbp_pool_detach() or the process's death. Any
 * thread; not concurrently with itself on the same handle. */
UMBP_API int umbp_admin_daemon_lock(umbp_pool *pool, uint64_t *ret_run_generation);

/* Clear owner_slot (if it names this process) and drop the lock. Accepts NULL,
 * a read-only handle and a handle that does not hold the lock (then it does
 * nothing). Any thread. */
UMBP_API void umbp_admin_daemon_unlock(umbp_pool *pool);

/* Is a daemon holding the pool? Returns 1 and *ret_pid (the holder's pid, or
 * -1 when it is not recorded yet), 0 when none, -EINVAL (NULL pool or
 * ret_pid), -errno when the lock cannot be queried. *ret_last_pid (may be
 * NULL) gets the pid that owner_slot names even when no daemon runs (-1:
 * none). Read-only handles too (F_OFD_GETLK needs no write access); changes
 * nothing. Any thread. */
UMBP_API int umbp_admin_daemon_query(umbp_pool *pool, int *ret_pid, int *ret_last_pid);

/* ---- this process's registry entry ------------------------------------------- */

/* Record this process's role (enum umbp_role) and rank (-1: none) in its
 * registry slot, as umbp_attach_opts does at attach; for a process that
 * created the pool (created under UMBP_ROLE_OTHER) and then takes another
 * role, e.g. a daemon. Relaxed stores: another process's umbp_pool_list_procs()
 * sees them soon, not at once. 0; -EINVAL (NULL pool, role out of range);
 * -EROFS (read-only handle: it has no slot); -ECHILD. Any thread. */
UMBP_API int umbp_admin_set_role(umbp_pool *pool, int role, int rank);

/* ---- the pool's file and mapping --------------------------------------------- */

/* fstat(2) of the file this handle mapped (not of the name, which a destroy
 * may have removed or given to another pool: compare with stat() of
 * umbp_pool_info.path to tell). 0 and *ret_st; -EINVAL (NULL); -ECHILD; -errno
 * of fstat. Read-only handles too. Any thread. */
UMBP_API int umbp_admin_pool_stat(umbp_pool *pool, struct stat *ret_st);

/* This process's mapping of the pool: its first byte and length (the whole
 * segment, the index file's pages included). Valid until umbp_pool_detach().
 * 0, or -EINVAL (NULL argument). For a SIGBUS handler that names the pool when
 * a fault address lies inside. Any thread. */
UMBP_API int umbp_admin_pool_mapping(const umbp_pool *pool, void **ret_base, size_t *ret_len);

/* The library's SIGBUS message (docs/operations.md, "SIGBUS on a pool"): the
 * first attach or create of a process installs a SIGBUS handler (unless
 * UMBP_NO_SIGBUS_HANDLER=1) that, for a fault inside an attached pool's
 * mapping, writes one line naming the pool, its file and the cause to stderr,
 * then passes the signal on to the disposition in place before it (the
 * process dies of SIGBUS as it would have). A program that reports SIGBUS on
 * a pool's mapping itself (the umbp commands) marks it quiet (true): the
 * handler then writes nothing for it and only passes the signal on, so the
 * program's message is the only one whichever handler was installed last;
 * false undoes that. Lasts until umbp_pool_detach(). 0, or -EINVAL (NULL
 * pool). Any thread. */
UMBP_API int umbp_admin_pool_sigbus_quiet(umbp_pool *pool, bool quiet);
/* For such a program's own SIGBUS handler: write the n bytes at s to fd 2
 * as the library's handler writes its line. Async-signal-safe; retries a
 * write cut short by a signal. A stderr pipe whose reader is gone loses the
 * line, and the SIGPIPE that write raises is blocked and taken back, so the
 * process does not die of SIGPIPE in place of the handler's own ending (a
 * chained disposition, its exit status). Writes to fd 2 whatever it is: a
 * caller whose fd 2 may have been closed and reused (a pool's file opened in
 * its place) decides first whether to write. Nothing when s is NULL. Any
 * thread, any context. */
UMBP_API void umbp_admin_sigbus_write(const char *s, size_t n);

/* The first hugetlbfs mount in /proc/mounts (where --hugepages pools and
 * index files live) into buf: 0; -ENOENT (none, or its path does not fit n
 * bytes); -EINVAL (NULL buf). Any thread. */
UMBP_API int umbp_admin_hugetlbfs_mount(char *buf, size_t n);

/* ---- inspection (loads only; read-only handles too) ------------------------ */
/* (Which attached processes are stopped is /proc's to say: the pids are in
 * umbp_pool_list_procs(); `umbp inspect` reads /proc/PID/stat.) */

typedef struct umbp_admin_index_info {
  uint32_t n_buckets;      /* buckets of the hash table */
  uint32_t bucket_ways;    /* ways (entries) a bucket holds */
  uint32_t max_probe;      /* buckets a key may live from its home: the length of umbp_index_stats()'s histogram */
  uint32_t event_capacity; /* cells of the event ring */
  uint32_t pad0;
  uint64_t bucket_offset; /* where the bucket array starts in this process's mapping (umbp_admin_pool_mapping()) */
  uint64_t bucket_bytes;  /* its length: n_buckets lines of 64 bytes */
} umbp_admin_index_info;

/* The index's geometry (umbp_admin_index_info). 0 and *ret; -EINVAL (NULL
 * argument). Any thread. */
UMBP_API int umbp_admin_index_info_get(umbp_pool *pool, umbp_admin_index_info *ret);

/* Free slots of partition part (0 .. n_partitions - 1), or of every
 * partition for part -1: the count on the free rings now (a snapshot:
 * reserves and frees move it). 0 and *ret_free; -EINVAL (NULL argument, part
 * out of range). Cheap (a few loads per partition; on a read-only handle the
 * ring's header is validated too): a writer may poll it for back-pressure.
 * Any thread. */
UMBP_API int umbp_admin_free_slots(umbp_pool *pool, int part, uint64_t *ret_free);

/* Pins held by each registry slot: ret[q] for q < n (n at most
 * UMBP_MAX_PROCS; 0 for a slot that holds none). Returns the number of
 * entries written, or -EINVAL (NULL argument). Reads the pin bytes of n
 * registry slots, eight at a time where none is set: about n x slot count / 8
 * relaxed loads. Any thread. */
UMBP_API int umbp_admin_pins_by_proc(umbp_pool *pool, uint64_t *ret, unsigned n);

typedef struct umbp_admin_event_ring {
  uint64_t capacity; /* cells */
  uint64_t pending;  /* events not yet drained */
  uint64_t dropped;  /* events dropped because the ring was full, since creation */
  uint64_t drained;  /* events ever drained (0: no consumer ever attached) */
  uint64_t recording; /* 1: removals record events (a process has drained the ring); 0: not yet */
} umbp_admin_event_ring;

/* The newest events still on the ring, oldest first, without taking them
 * (draining would take them from their subscribers): up to max into out,
 * with their ring positions into ret_pos (may be NULL), and the ring's state
 * into *ret_ring (may be NULL). An event being written or taken meanwhile is
 * left out. Returns how many (>= 0), or -EINVAL (NULL pool, NULL out with
 * max > 0), -EBADMSG (the ring's header is corrupted). Any thread. */
UMBP_API int umbp_admin_events_peek(umbp_pool *pool, unsigned max, umbp_event *out, uint64_t *ret_pos,
                                    umbp_admin_event_ring *ret_ring);

/* The registered namespaces, in id order: up to max into out. Returns how
 * many (>= 0), or -EINVAL (NULL pool, NULL out with max > 0). Unlike a loop
 * over umbp_ns_info_get(), it leaves umbp_last_error() alone for the ids that
 * are not registered. Any thread. */
UMBP_API int umbp_admin_ns_list(umbp_pool *pool, umbp_ns_info *out, unsigned max);

#ifdef __cplusplus
}
#endif
#endif
