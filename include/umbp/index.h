/* SPDX-License-Identifier: Apache-2.0 */
/*
 * index.h — the block index: find, add, pin and evict blocks in a pool with no
 * server and no lock on the read path.
 *
 * Slot lifecycle (see src/index/index.c for the design note):
 *
 *   umbp_reserve()  → write bytes at umbp_slot_ptr() → umbp_publish(key)
 *   umbp_lookup_pin(key) → read bytes → umbp_unpin()
 *   umbp_remove(key), umbp_clear_ns(ns), eviction (CLOCK) → removed event
 *
 * Every function here may be called by any thread of any process attached
 * read-write, concurrently with every other; lookups and probes also work on
 * read-only handles. Lookups are lock-free and write no line that another
 * thread writes. A removed block's slot is reused only after every reader in
 * every process that could have seen it has left its read section.
 *
 * Results go out through ret_ pointers written only on success; errors are
 * negative errno codes with details in umbp_last_error().
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
 * same name gets the same id from every process. 0, -EINVAL, -ENOSPC (table
 * full: UMBP_MAX_NAMESPACES), -EROFS. */
UMBP_API int umbp_ns_register(umbp_pool *pool, const char *name, uint32_t *ret_id);
/* Look a name up without registering it: 0 or -ENOENT. */
UMBP_API int umbp_ns_lookup(umbp_pool *pool, const char *name, uint32_t *ret_id);
/* Name of namespace id into buf (NUL-terminated): 0 or -ENOENT. */
UMBP_API int umbp_ns_name(umbp_pool *pool, uint32_t id, char *buf, size_t n);
typedef struct umbp_ns_info {
  uint32_t id;
  char name[129];
  uint64_t blocks;      /* published blocks of the namespace */
  uint64_t bytes;       /* blocks * slot size */
  uint64_t quota_bytes; /* 0: none */
} umbp_ns_info;
/* Describe namespace id: 0 or -ENOENT. Read-only handles too. */
UMBP_API int umbp_ns_info_get(umbp_pool *pool, uint32_t id, umbp_ns_info *ret);
/* Number of registered namespaces (ids are 0..UMBP_MAX_NAMESPACES-1, not dense). */
UMBP_API int umbp_ns_count(umbp_pool *pool);

/* Quota in bytes (0: none). A namespace over its quota evicts its own blocks
 * first when it needs a slot. */
UMBP_API int umbp_ns_set_quota(umbp_pool *pool, uint32_t id, uint64_t bytes);

/* ---- slots ---------------------------------------------------------------- */
/* Reserve a free slot on partition `part` (-1: the partition with the most
 * free slots) for a block of namespace `ns`. When the partition has none, the
 * call evicts unpinned blocks (bounded effort) and fails with -ENOSPC if that
 * frees nothing. The slot belongs to the caller's process until published or
 * aborted; if the process dies, the reaper frees it. */
UMBP_API int umbp_reserve(umbp_pool *pool, int part, uint32_t ns, uint32_t *ret_slot);
/* Reserve up to n slots; returns how many were reserved (>= 0) or -errno. */
UMBP_API int umbp_reserve_bulk(umbp_pool *pool, int part, uint32_t ns, unsigned n, uint32_t *ret_slots);
/* Give a reserved, unpublished slot back. 0 or -EINVAL (not reserved by us). */
UMBP_API int umbp_abort(umbp_pool *pool, uint32_t slot);
/* This process's address of slot's bytes (slot_size of them), NULL if out of range. */
UMBP_API void *umbp_slot_ptr(umbp_pool *pool, uint32_t slot);
UMBP_API uint64_t umbp_slot_size(const umbp_pool *pool);
UMBP_API uint32_t umbp_slot_count(const umbp_pool *pool);
/* Partition holding slot, or -1. */
UMBP_API int umbp_slot_partition(const umbp_pool *pool, uint32_t slot);

/* Publish a reserved slot under key. First writer wins: if key is present
 * already, returns -EEXIST and gives the slot back (it is free again). The
 * bytes written before this call are visible to every process that finds the
 * key (release/acquire). 0, -EEXIST, -EINVAL. */
UMBP_API int umbp_publish(umbp_pool *pool, uint32_t slot, const umbp_key *key);
/* Publish n slots; rc[i] gets each result. Returns how many were published. */
UMBP_API int umbp_publish_bulk(umbp_pool *pool, unsigned n, const uint32_t *slots, const umbp_key *keys, int *rc);

/* ---- lookups -------------------------------------------------------------- */
/* Find key and pin its slot: while pinned it is neither evicted nor reused.
 * 0 and *ret_slot, -ENOENT, -EOVERFLOW (this process holds 255 pins on it). */
UMBP_API int umbp_lookup_pin(umbp_pool *pool, const umbp_key *key, uint32_t *ret_slot);
/* Pin up to n keys; ret_slots[i] = slot or UMBP_NO_SLOT. Returns the number of hits. */
UMBP_API int umbp_lookup_pin_bulk(umbp_pool *pool, unsigned n, const umbp_key *keys, uint32_t *ret_slots);
/* Drop one pin taken by this process. 0 or -EINVAL (no pin of ours). */
UMBP_API int umbp_unpin(umbp_pool *pool, uint32_t slot);
UMBP_API int umbp_unpin_bulk(umbp_pool *pool, unsigned n, const uint32_t *slots);
/* 1 if present, 0 if not (or -errno). Pins nothing. */
UMBP_API int umbp_contains(umbp_pool *pool, const umbp_key *key);
/* Presence of n keys into present[i] (0/1); returns the number present. */
UMBP_API int umbp_contains_bulk(umbp_pool *pool, unsigned n, const umbp_key *keys, uint8_t *present);
/* How many of keys[0..n), in order, are present: the index of the first miss. */
UMBP_API int umbp_prefix_probe(umbp_pool *pool, unsigned n, const umbp_key *keys);

/* ---- removal and eviction ------------------------------------------------- */
/* Remove key: 0, -ENOENT, -EBUSY (pinned). Emits a removed event. */
UMBP_API int umbp_remove(umbp_pool *pool, const umbp_key *key);
/* Remove every unpinned block of ns; returns how many (pinned ones stay). */
UMBP_API int umbp_clear_ns(umbp_pool *pool, uint32_t ns);
/* Evict up to `want` unpinned blocks from partition part (-1: all) by CLOCK;
 * returns how many were evicted. */
UMBP_API int umbp_evict(umbp_pool *pool, int part, unsigned want);
/* Reclaim retired slots whose grace period has passed; returns how many went
 * back to the free queues. Never waits for a reader. */
UMBP_API int umbp_reclaim(umbp_pool *pool);

/* Background eviction thread of this process: keeps every partition's free
 * slots between low_pct and high_pct of its slots (defaults 5 and 10), and
 * reclaims retired slots. One per process; stop with umbp_evictor_stop(). */
UMBP_API int umbp_evictor_start(umbp_pool *pool, unsigned low_pct, unsigned high_pct, unsigned period_ms);
UMBP_API void umbp_evictor_stop(umbp_pool *pool);

/* ---- events --------------------------------------------------------------- */
enum umbp_event_type { UMBP_EV_STORED = 1, UMBP_EV_REMOVED = 2 };
typedef struct umbp_event {
  int type;
  umbp_key key;
} umbp_event;
/* Take up to max events (oldest first); each event goes to one drainer.
 * Returns how many. When the ring is full the oldest events are dropped and
 * counted (umbp_events_dropped); eviction never waits for drainers. */
UMBP_API int umbp_events_drain(umbp_pool *pool, umbp_event *out, unsigned max);
UMBP_API uint64_t umbp_events_dropped(umbp_pool *pool);
/* Enable stored events too (removed events are always emitted). */
UMBP_API void umbp_events_enable_stored(umbp_pool *pool, bool on);

/* ---- counters and accounting --------------------------------------------- */
typedef struct umbp_counters {
  uint64_t lookups, hits, misses, inserts, duplicates, evictions, removes, pins;
} umbp_counters;
/* Sums over every process (live and reaped). ns = UINT32_MAX: all namespaces.
 * Counters of live processes are flushed every 64 operations, so a figure may
 * lag by up to 64 operations per thread. */
UMBP_API int umbp_counters_ns(umbp_pool *pool, uint32_t ns, umbp_counters *ret);
UMBP_API int umbp_counters_part(umbp_pool *pool, unsigned part, umbp_counters *ret);
/* Flush this thread's pending counter increments into the segment. */
UMBP_API void umbp_counters_flush(umbp_pool *pool);

typedef struct umbp_slot_census {
  uint64_t free_, reserved, published, evicting, retired, total;
  uint64_t pinned;   /* published slots with at least one pin */
  uint64_t in_rings; /* slot ids currently on the free queues */
} umbp_slot_census;
/* Count slots by state (walks every slot; for tools and tests). */
UMBP_API int umbp_census(umbp_pool *pool, umbp_slot_census *ret);
/* The same for partition `part`'s slots and free ring only. Loads only: any
 * thread of any process, a read-only handle included, may call it; the figures
 * are a scan, not an instant (slots move while it runs). 0 and *ret; -EINVAL
 * for a NULL argument or part >= the pool's partitions; -EBADMSG when the
 * header's partition table points outside the slots. */
UMBP_API int umbp_census_part(umbp_pool *pool, unsigned part, umbp_slot_census *ret);
/* Entries in the index and a probe-length histogram: hist[d] = entries found d buckets from home. */
UMBP_API int umbp_index_stats(umbp_pool *pool, uint64_t *ret_entries, uint64_t *hist, unsigned nhist);

#ifdef __cplusplus
}
#endif
#endif
