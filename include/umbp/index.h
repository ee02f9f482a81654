/* SPDX-License-Identifier: Apache-2.0 */
/*
 * index.h — the block index: find, add, pin and evict blocks in a pool with no
 * server and no lock on the read path.
 *
 * Slot lifecycle (design notes: src/index/table.c, threads.c, pins.c, reserve.c,
 * evict.c):
 *
 *   umbp_reserve()  → write bytes at umbp_slot_ptr() → umbp_publish(key)
 *   umbp_lookup_pin(key) → read bytes → umbp_unpin()
 *   umbp_remove(key), umbp_clear_ns(ns), eviction (CLOCK) → removed event
 *
 * Names. The slot and lookup verbs keep short names (umbp_reserve,
 * umbp_publish, umbp_lookup_pin, umbp_unpin, umbp_remove, ...) rather than
 * umbp_index_<verb>: they are the hot-path calls an engine makes per block,
 * and the index is the pool's main purpose. Every other module prefixes its
 * name (umbp_pool_, umbp_dp_, umbp_conn_, umbp_topo_, umbp_ns_, umbp_events_).
 *
 * Calling context, for every function below unless its comment says more:
 *  - Any thread of any process holding a read-write handle, concurrently with
 *    every other call, except during umbp_pool_detach() of that handle.
 *  - Read-only handles (umbp_attach_opts.read_only): the calls that write
 *    return -EROFS; umbp_contains*, umbp_prefix_probe, umbp_ns_lookup/name/
 *    info_get/count, the counters, census and stats calls work (loads only).
 *  - A handle inherited through fork(): every call that writes, and
 *    umbp_lookup_pin*, umbp_contains* and umbp_prefix_probe, return -ECHILD
 *    (attach again in the child); the loads-only calls above still read.
 *  - -EUSERS: the calling thread is the 65th thread of its process to use
 *    this pool at once (UMBP_MAX_THREADS thread lines per process; a thread
 *    gives its line back when it exits). A thread may use any number of
 *    pools. Any call that counts can return it (every call taking a
 *    read-write handle, umbp_contains* and umbp_prefix_probe included).
 *  - Not async-signal-safe: a thread's first call on a pool registers a
 *    thread-exit handler (pthread_setspecific), and errors format a message.
 *  - No call waits for another process, except umbp_ns_register() (off
 *    the data path), which waits at most 2 s for a live holder of the
 *    namespace table's lock and then returns -EBUSY naming it; a dead
 *    holder's lock is taken over. A process stopped anywhere (SIGSTOP, a
 *    debugger, a frozen cgroup) holds back only its own pins and reserved
 *    slots.
 *
 * Lookups take no lock and write no key or bucket line; they write only the
 * calling thread's line (counters), and a pin also writes the process's pin
 * byte for the slot and sets the slot's reference bit (meta.ref) when it is
 * clear. A lookup accepts a slot only if the slot's state word, which
 * changes on every transition, was the same before and after it compared the
 * key, so a removed block's slot is free for reuse at once (layout 6; no
 * grace period).
 *
 * Results go out through ret_ pointers written only on success; errors are
 * negative errno codes and set umbp_last_error() (thread-local) to a message
 * naming the cause, except a lookup miss (-ENOENT from umbp_lookup_pin),
 * which is an answer, not a failure, and leaves it alone.
 */
#ifndef UMBP_INDEX_H
#define UMBP_INDEX_H

#include <stdbool.h>
#include <stdint.h>

#include "umbp/pool.h"

#ifdef __cplusplus
extern "C" {
#endif

#define UMBP_KEY_HASH_MAX 32
#define UMBP_NO_SLOT UINT32_MAX

/* A block's full key. Bytes of hash beyond hash_len are ignored. */
typedef struct umbp_key {
  uint32_t ns;        /* namespace id from umbp_ns_register() */
  uint16_t tp_rank, pcp_rank, dcp_rank, pp_rank;
  uint16_t group;     /* KV-cache group id */
  uint8_t hash_len;   /* 1..32 */
  uint8_t hash[UMBP_KEY_HASH_MAX];
} umbp_key;

/* ---- namespaces ----------------------------------------------------------- */
/* Map a name (1..128 bytes) to its 32-bit id, registering it on first use. The
 * same name gets the same id from every process, for the pool's life (ids are
 * never reused). Returns 0 and *ret_id; -EINVAL (NULL argument, name length);
 * -ENOSPC (all UMBP_MAX_NAMESPACES ids taken); -EROFS (read-only handle, name
 * not yet registered); -ECHILD. Registration is a release store: a process
 * that then finds the name (acquire) sees it whole. */
UMBP_API int umbp_ns_register(umbp_pool *pool, const char *name, uint32_t *ret_id);
/* Look a name up without registering it: 0 and *ret_id, -EINVAL (NULL
 * argument, name length), -ENOENT (not registered). Loads only; read-only
 * handles too. */
UMBP_API int umbp_ns_lookup(umbp_pool *pool, const char *name, uint32_t *ret_id);
/* Name of namespace id into buf (NUL-terminated, truncated to n - 1 bytes):
 * 0, -EINVAL (NULL pool or buf, n == 0, id >= UMBP_MAX_NAMESPACES), -ENOENT
 * (id not registered). Loads only; read-only handles too. */
UMBP_API int umbp_ns_name(umbp_pool *pool, uint32_t id, char *buf, size_t n);
typedef struct umbp_ns_info {
  uint32_t id;
  char name[129];
  uint64_t blocks;      /* published blocks of the namespace */
  uint64_t bytes;       /* blocks * slot size */
  uint64_t quota_bytes; /* 0: none */
} umbp_ns_info;
/* Describe namespace id: 0 and *ret, -EINVAL (NULL argument, id out of
 * range), -ENOENT (not registered). Loads only (relaxed: blocks is a
 * snapshot); read-only handles too. */
UMBP_API int umbp_ns_info_get(umbp_pool *pool, uint32_t id, umbp_ns_info *ret);
/* Number of registered namespaces (>= 0; ids are 0..UMBP_MAX_NAMESPACES-1,
 * not dense), or -EINVAL for a NULL pool. Loads only; read-only handles too. */
UMBP_API int umbp_ns_count(umbp_pool *pool);

/* Set namespace id's quota in bytes (0: none). A namespace over its quota
 * evicts its own blocks first when it reserves. 0, -EINVAL (id out of range),
 * -ENOENT (not registered), -EROFS, -ECHILD. Relaxed store: other processes'
 * reserves apply it soon, not at once. */
UMBP_API int umbp_ns_set_quota(umbp_pool *pool, uint32_t id, uint64_t bytes);

/* ---- slots ---------------------------------------------------------------- */
/* Reserve a free slot on partition `part` (-1: the partition with the most
 * free slots) for a block of namespace `ns`: first a slot this thread kept
 * from its umbp_remove() (the one removed last), of that partition (-1: any),
 * while the namespace is within its quota (over it, only as a last resort,
 * before -ENOSPC). When the partition has none, the
 * call evicts unpinned blocks and reaps dead processes (bounded effort: a
 * few rounds) and then fails. Returns 0 and *ret_slot; -EINVAL (NULL
 * argument, no such partition, ns out of range); -ENOSPC (nothing could be
 * freed: the message says what holds the slots); -EROFS; -ECHILD; -EUSERS. Ownership: the slot and
 * its bytes belong to the calling process (any of its threads) until it
 * publishes or aborts it; if the process dies first, a reaper frees it. */
UMBP_API int umbp_reserve(umbp_pool *pool, int part, uint32_t ns, uint32_t *ret_slot);
/* Reserve up to n slots into ret_slots[0..k); returns k (>= 1, or 0 for
 * n == 0), or the errors of umbp_reserve() when none could be reserved
 * (-ENOSPC). Slots this thread kept come first (last, over quota), as in
 * umbp_reserve(); with part -1 they may be of several partitions. Ownership as umbp_reserve(). */
UMBP_API int umbp_reserve_bulk(umbp_pool *pool, int part, uint32_t ns, unsigned n, uint32_t *ret_slots);
/* Give a reserved, unpublished slot back to the free queue: 0, -EINVAL (slot
 * out of range or not reserved by this process), -EROFS, -ECHILD, -EUSERS.
 * The caller must not touch the slot's bytes afterwards. */
UMBP_API int umbp_abort(umbp_pool *pool, uint32_t slot);
/* This process's address of slot's bytes (umbp_slot_size() of them), or NULL
 * if pool is NULL or slot out of range. Valid until umbp_pool_detach(). It
 * grants nothing: write only a slot this process reserved; read only one it
 * has pinned. Read-only handles too (the mapping is then PROT_READ). */
UMBP_API void *umbp_slot_ptr(umbp_pool *pool, uint32_t slot);
/* Bytes per slot (fixed at creation), 0 for a NULL pool. Any handle. */
UMBP_API uint64_t umbp_slot_size(const umbp_pool *pool);
/* Slots in the pool (fixed at creation), 0 for a NULL pool. Any handle. */
UMBP_API uint32_t umbp_slot_count(const umbp_pool *pool);
/* Partition holding slot, or -1 (NULL pool, slot out of range). Any handle. */
UMBP_API int umbp_slot_partition(const umbp_pool *pool, uint32_t slot);

/* Publish a reserved slot under key. First writer wins: if key is present
 * already, returns -EEXIST and gives the slot back (it is free again; do not
 * touch its bytes). Returns 0; -EEXIST; -EINVAL (NULL or bad key, slot not
 * reserved by this process, namespace not registered); -ENOSPC (the key's
 * bucket neighbourhood is full; the slot is freed); -EROFS; -ECHILD; -EUSERS.
 * Ordering: the bytes written before this call are visible to every thread of
 * every process that then finds the key (release CAS of the bucket way, paired
 * with the lookup's acquire load). Ownership: on 0 the block belongs to the
 * pool; its bytes must not be written again. */
UMBP_API int umbp_publish(umbp_pool *pool, uint32_t slot, const umbp_key *key);
/* Publish n slots, rc[i] (if rc is not NULL) getting each umbp_publish()
 * result. Returns how many were published (>= 0), or -EINVAL for a NULL pool
 * or NULL slots/keys with n > 0. Each slot as umbp_publish(). */
UMBP_API int umbp_publish_bulk(umbp_pool *pool, unsigned n, const uint32_t *slots, const umbp_key *keys, int *rc);

/* ---- lookups -------------------------------------------------------------- */
/* Find key and pin its slot: while pinned it is neither evicted nor reused.
 * Returns 0 and *ret_slot; -ENOENT (absent; sets no message); -EOVERFLOW
 * (this process holds 255 pins on that slot); -EINVAL (NULL or bad key,
 * NULL ret_slot); -EROFS (read-only handles cannot pin: use umbp_contains);
 * -ECHILD; -EUSERS. Ordering: on 0, the block's bytes as published are
 * visible (acquire). Ownership: the pin belongs to the calling process (any
 * of its threads may unpin it); a process that dies or detaches drops its
 * pins. Lock-free; writes the thread's reader line, the process's pin byte
 * and, when clear, the slot's reference bit. */
UMBP_API int umbp_lookup_pin(umbp_pool *pool, const umbp_key *key, uint32_t *ret_slot);
/* Pin up to n keys; ret_slots[i] = slot or UMBP_NO_SLOT. Returns the number
 * of hits (>= 0), or the errors of umbp_lookup_pin() other than -ENOENT and
 * -EOVERFLOW (a key that hits either gets UMBP_NO_SLOT); on an error no pin
 * is left held. Ordering and ownership as umbp_lookup_pin(). */
UMBP_API int umbp_lookup_pin_bulk(umbp_pool *pool, unsigned n, const umbp_key *keys, uint32_t *ret_slots);
/* Drop one pin this process holds on slot: 0; -EINVAL (slot out of range, or
 * this process holds no pin on it); -EROFS; -ECHILD. Ordering: release — the
 * caller's reads of the block happen before an evictor can see the pin gone.
 * The caller must not read the block afterwards. */
UMBP_API int umbp_unpin(umbp_pool *pool, uint32_t slot);
/* Unpin each slots[i] that is not UMBP_NO_SLOT (all are tried): 0, or the
 * first error umbp_unpin() gave; -EINVAL (NULL slots with n > 0), -EROFS,
 * -ECHILD. */
UMBP_API int umbp_unpin_bulk(umbp_pool *pool, unsigned n, const uint32_t *slots);
/* 1 if key is published, 0 if not; -EINVAL (NULL or bad key), -ECHILD,
 * -EUSERS. Pins nothing: the block may be evicted right after, so this
 * orders nothing about its bytes. Read-only handles too (bounds-checked
 * loads, validated as every lookup's). */
UMBP_API int umbp_contains(umbp_pool *pool, const umbp_key *key);
/* Presence of n keys into present[i] (0/1, if present is not NULL); returns
 * the number present (>= 0) or the errors of umbp_contains(). */
UMBP_API int umbp_contains_bulk(umbp_pool *pool, unsigned n, const umbp_key *keys, uint8_t *present);
/* How many of keys[0..n), in order, are present: the index of the first miss
 * (>= 0), or the errors of umbp_contains(). Pins nothing (as umbp_contains()). */
UMBP_API int umbp_prefix_probe(umbp_pool *pool, unsigned n, const umbp_key *keys);

/* ---- removal and eviction ------------------------------------------------- */
/* Remove key: 0; -ENOENT (absent); -EBUSY (pinned by some process); -EINVAL
 * (NULL or bad key); -EROFS; -ECHILD; -EUSERS. On 0 later lookups miss and a
 * removed event is emitted (into the event ring once a process has drained
 * it, umbp_events_drain(); to the feed once one is open, feed.h); the slot
 * is free for reuse at once. The calling thread may keep the slot
 * (RESERVED) for its next umbp_reserve(): up to one per 8192 slots of the
 * pool's smallest partition and 8 at most (none under 8192), and none once
 * it removed more than that without a reserve between; its exit, a detach
 * or the process's death give kept slots back (docs/operations.md). */
UMBP_API int umbp_remove(umbp_pool *pool, const umbp_key *key);
/* Remove every unpinned published block of ns; returns how many (>= 0;
 * pinned ones stay), or -EINVAL (NULL pool), -EROFS, -ECHILD, -EUSERS. A
 * block published concurrently may stay. */
UMBP_API int umbp_clear_ns(umbp_pool *pool, uint32_t ns);
/* Evict up to `want` unpinned blocks from partition part (-1: all) by CLOCK
 * (namespaces over quota first); returns how many were evicted (>= 0), or
 * -EINVAL (NULL pool, no such partition), -EROFS, -ECHILD, -EUSERS. Each
 * eviction emits a removed event, as umbp_remove() does. */
UMBP_API int umbp_evict(umbp_pool *pool, int part, unsigned want);
/* Put the free queues right after a process held one up (stopped or
 * descheduled inside a queue operation): drops the queue entries of slots
 * that are no longer free and repeated entries, and puts free slots that
 * were left off a queue back on it, so the free-slot figures
 * (umbp_admin_free_slots(), watermark eviction) count free slots again. Only
 * partitions marked as possibly untidy, or with slots left off their queue,
 * are visited (a check of two words otherwise); every evictor thread does the
 * same each period. Returns the entries dropped plus the slots put back from
 * off a queue (>= 0), or -EINVAL (NULL pool), -EROFS, -ECHILD. (Before layout
 * 6 it freed removed slots after a grace period; since layout 6 they are free
 * at once.) */
UMBP_API int umbp_reclaim(umbp_pool *pool);

/* Start this process's background eviction thread: keeps every partition's
 * free slots between low_pct and high_pct of its slots (0: defaults 5 and 10)
 * every period_ms (0: 10). Returns 0; -EBUSY (one
 * already runs in this process for this handle); -EINVAL (NULL pool, low_pct
 * >= high_pct or high_pct > 100); -EROFS; -ECHILD; or pthread_create's error
 * (-EAGAIN). Owned by the handle: umbp_pool_detach() stops it. */
UMBP_API int umbp_evictor_start(umbp_pool *pool, unsigned low_pct, unsigned high_pct, unsigned period_ms);
/* Stop the evictor thread and wait for it to exit (at most about one
 * period, plus a free-queue tidy pass if one is under way: umbp_reclaim()).
 * No effect if none runs or pool is NULL. Not from the evictor
 * thread itself; not concurrently with umbp_evictor_start() on the handle. */
UMBP_API void umbp_evictor_stop(umbp_pool *pool);

/* ---- events --------------------------------------------------------------- */
enum umbp_event_type { UMBP_EV_STORED = 1, UMBP_EV_REMOVED = 2 };
typedef struct umbp_event {
  int type;
  umbp_key key;
} umbp_event;
/* Take up to max events (oldest first) into out; each event goes to exactly
 * one drainer, in any process (feed.h broadcasts the same events to every
 * consumer at its own cursor). Returns how many (>= 0), or -EINVAL (NULL
 * pool, NULL out with max > 0), -EROFS, -ECHILD. The pool records removed
 * events from the first call of this function on the pool, by any process,
 * for the pool's life; before it, removals skip the ring, since nothing reads
 * it. A consumer calls umbp_events_drain(pool, NULL, 0) when it starts, so
 * that it is told of every removal after that point. When the ring is full
 * the oldest events are dropped and counted (umbp_events_dropped); eviction
 * never waits for drainers: while a drainer is stopped (or dead, not yet
 * reaped) inside this call, holding the oldest event, removals drop their
 * own events instead, counted, each process spinning on it once. A removed event is emitted before its slot can
 * be reused, and a remover killed midway has its event emitted by the
 * reaper. */
UMBP_API int umbp_events_drain(umbp_pool *pool, umbp_event *out, unsigned max);
/* Events dropped because the ring was full, since creation (all processes;
 * 0 for a NULL pool). Loads only; read-only handles too. */
UMBP_API uint64_t umbp_events_dropped(umbp_pool *pool);
/* Emit stored events too, for this process's publishes (removed events are
 * recorded once the ring has been drained, see umbp_events_drain()). No
 * effect on a NULL, read-only or fork()ed handle. */
UMBP_API void umbp_events_enable_stored(umbp_pool *pool, bool on);

/* ---- counters and accounting --------------------------------------------- */
typedef struct umbp_counters {
  uint64_t lookups, hits, misses, inserts, duplicates, evictions, removes, pins;
} umbp_counters;
/* Sums over every process (live and reaped) for namespace ns (UINT32_MAX: all
 * namespaces): 0 and *ret, or -EINVAL (NULL argument, ns out of range). Flushes
 * the calling thread's pending counts first; other live threads' counts are
 * flushed every 64 operations, so a figure may lag by up to 64 operations per
 * thread. Relaxed loads; read-only handles too. */
UMBP_API int umbp_counters_ns(umbp_pool *pool, uint32_t ns, umbp_counters *ret);
/* The same per partition (inserts, evictions, removes and hits by slot
 * partition): 0 and *ret, or -EINVAL (NULL argument, no such partition). */
UMBP_API int umbp_counters_part(umbp_pool *pool, unsigned part, umbp_counters *ret);
/* Flush the calling thread's pending counter increments into the segment
 * (relaxed adds). No effect on a NULL, read-only or fork()ed handle. */
UMBP_API void umbp_counters_flush(umbp_pool *pool);

typedef struct umbp_slot_census {
  uint64_t free_, reserved, published, evicting;
  uint64_t retired;  /* layouts before 6 only (removed, waiting for a grace period): always 0 */
  uint64_t total;
  uint64_t pinned;   /* published slots with at least one pin */
  uint64_t in_rings; /* slot ids currently on the free queues */
} umbp_slot_census;
/* Count slots by state, walking every slot (for tools and tests): 0 and *ret,
 * or -EINVAL (NULL argument). Loads only; read-only handles too; a scan, not
 * an instant. */
UMBP_API int umbp_census(umbp_pool *pool, umbp_slot_census *ret);
/* The same for partition `part`'s slots and free ring only. Loads only: any
 * thread of any process, a read-only handle included, may call it; the figures
 * are a scan, not an instant (slots move while it runs). 0 and *ret; -EINVAL
 * for a NULL argument or part >= the pool's partitions; -EBADMSG when the
 * header's partition table points outside the slots. */
UMBP_API int umbp_census_part(umbp_pool *pool, unsigned part, umbp_slot_census *ret);
/* Entries in the index and a probe-length histogram: hist[d] (d < nhist; hist
 * may be NULL) = entries found d buckets from home. 0 and *ret_entries, or
 * -EINVAL (NULL pool or ret_entries). Loads only; a scan; read-only handles
 * too. */
UMBP_API int umbp_index_stats(umbp_pool *pool, uint64_t *ret_entries, uint64_t *hist, unsigned nhist);

#ifdef __cplusplus
}
#endif
#endif
