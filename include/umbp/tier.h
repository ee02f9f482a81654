/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tier.h — the request table between a pool's users and its host tier
 * (`umbp tier`, which keeps the pool in front of a Mooncake Store shared by
 * several hosts: docs/cluster.md).
 *
 * A scheduler whose probe missed part of a prompt asks the tier to bring the
 * missing blocks from the store into the pool, without a round trip on its
 * own hot path: it writes the keys into a free record of a table in shared
 * memory beside the pool (/dev/shm/umbp.NAME.tier), rings a doorbell and
 * returns; on a later step it polls the record, which the tier has marked
 * done with the number of leading blocks that are now in the pool on every
 * rank. The tier fetches every rank's shard of a block before it publishes
 * any, publishes them as ordinary blocks, and only then completes the
 * record. Design note, states and memory ordering: src/tier/tierq.c.
 *
 * Bounds. A request carries a deadline; once it has passed, the client's
 * poll cancels the record and returns -ETIMEDOUT, whatever the tier is
 * doing. A client that finds no live tier (its lock byte free) gets
 * -ENOTCONN at once. Records a client abandoned (killed, or never polled)
 * are reclaimed by the tier after a minute. So neither a stopped tier nor a
 * stopped client holds anyone longer than its own deadline.
 *
 * Calling context: any thread of any process holding a read-write handle of
 * the pool; a umbp_tier handle may be used by several threads of its process
 * at once (client calls only; the serving calls are for the one tier process,
 * from one thread at a time, except umbp_tier_stat_add and
 * umbp_tier_set_state, which any of its threads may call). Returns follow
 * umbp.h: 0 or a count, or a negative errno with umbp_last_error() set.
 */
#ifndef UMBP_TIER_H
#define UMBP_TIER_H

#include <stdbool.h>
#include <stdint.h>

#include "umbp/index.h"
#include "umbp/pool.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct umbp_tier umbp_tier;

/* What the tier says it is doing (umbp_tier_info.state). */
enum umbp_tier_state {
  UMBP_TIER_STOPPED = 0,      /* no tier process (or it exited) */
  UMBP_TIER_CONNECTING = 1,   /* starting, or reconnecting to the store */
  UMBP_TIER_CONNECTED = 2,    /* serving requests and writing back */
  UMBP_TIER_DISCONNECTED = 3, /* the store is unreachable: requests are answered -ENOTCONN */
};

/* Counters the tier keeps in the table (umbp_tier_info.stats), in order. */
enum umbp_tier_stat {
  UMBP_TIER_ST_REQUESTS = 0,     /* read-through requests taken */
  UMBP_TIER_ST_BLOCKS_FETCHED,   /* blocks (every rank's shard) fetched and published */
  UMBP_TIER_ST_KEYS_FETCHED,     /* shards fetched and published */
  UMBP_TIER_ST_BYTES_FETCHED,
  UMBP_TIER_ST_REMOTE_MISSES,    /* requested blocks the store did not hold on every rank */
  UMBP_TIER_ST_FETCH_ERRORS,     /* shards whose transfer failed (nothing of them published) */
  UMBP_TIER_ST_EXPIRED,          /* requests past their deadline when taken or finished */
  UMBP_TIER_ST_WB_QUEUED,        /* published keys queued for write-back */
  UMBP_TIER_ST_WB_WRITTEN,       /* keys written to the store */
  UMBP_TIER_ST_WB_BYTES,
  UMBP_TIER_ST_WB_SKIPPED,       /* already in the store, or gone from the pool before written */
  UMBP_TIER_ST_WB_DROPPED,       /* dropped: queue full, or the feed overran the tier */
  UMBP_TIER_ST_WB_ERRORS,        /* keys dropped after the store refused them three times */
  UMBP_TIER_ST_RECONNECTS,
  UMBP_TIER_ST_WB_REFUSED,       /* puts the store refused (no room), tried again or not */
  UMBP_TIER_ST_HELD,             /* slots the serving tier keeps until it exits: Mooncake gave up waiting
                                  * for a transfer into or out of them (TRANSFER_FAIL) that may still run;
                                  * a gauge, zeroed when a tier starts serving (umbp_tier_serve()), and
                                  * read as 0 by umbp_tier_info_get() when no tier is alive */
  UMBP_TIER_ST_COUNT = 16
};

/* ---- clients (the connector's scheduler) ---- */

/* Open the pool's tier table as a client. 0 and *ret_tier; -ENOENT (no tier
 * has ever served this pool: start `umbp tier POOL`); -EINVAL (NULL
 * argument); -EROFS (read-only handle); -ECHILD; -EBADMSG (the table is not
 * this pool's or is corrupted); -EACCES. Close the handle with
 * umbp_tier_close() before the pool handle is detached: after the detach its
 * requests fail with -EBADF (polls and cancels of requests already made still
 * work). */
UMBP_API int umbp_tier_attach(umbp_pool *pool, umbp_tier **ret_tier);

/* Ask the tier to bring blocks [0, n_blocks) into the pool: keys holds
 * n_blocks * n_ranks keys, block-major (keys[b * n_ranks + r] is rank r's
 * shard of block b); a block counts only when all its shards are in the pool.
 * Asks for at most umbp_tier_max_blocks(tier, n_ranks) blocks: *ret_n_blocks
 * (if not NULL) says how many. The request is dropped by the tier, and the
 * poll says -ETIMEDOUT, timeout_ms after this call (0: the tier's default).
 * Returns 0 and *ret_ticket; -ENOTCONN (no live tier, or it is not connected
 * to its store: the message says which); -EAGAIN (every record is in use);
 * -EINVAL (NULL argument, n_blocks or n_ranks 0, n_ranks above the table's
 * keys per record); -EBADF (the pool handle the client was attached with has
 * been detached: close the tier handle first); -ECHILD (called in a fork()
 * child on its parent's handle). Ordering: the keys are written before the record is
 * marked ready (release, paired with the tier's acquire). Wakes the tier. */
UMBP_API int umbp_tier_request(umbp_tier *tier, const umbp_key *keys, unsigned n_blocks, unsigned n_ranks,
                               uint32_t timeout_ms, uint64_t *ret_ticket, unsigned *ret_n_blocks);

/* The answer to a request, without waiting. Returns 0 and *ret_blocks (the
 * number of leading requested blocks now in the pool on every rank; the
 * record is then freed and the ticket is spent); -EINPROGRESS (not done
 * yet); -ETIMEDOUT (past its deadline: cancelled); -ENOTCONN (the tier died
 * or lost its store while the request waited: cancelled); -ESTALE (no such
 * ticket: already answered, cancelled or reclaimed); or the error the tier
 * completed it with (the message says which). Ordering: on 0 the fetched
 * blocks are published (acquire, paired with the tier's release); look them
 * up as usual. */
UMBP_API int umbp_tier_poll(umbp_tier *tier, uint64_t ticket, unsigned *ret_blocks);

/* Give a request up (the tier may still bring its blocks into the pool).
 * No effect for a spent ticket. Accepts NULL. */
UMBP_API void umbp_tier_cancel(umbp_tier *tier, uint64_t ticket);

/* Most blocks of n_ranks shards one request can carry (0 for NULL or
 * n_ranks 0 or above the keys per record). */
UMBP_API unsigned umbp_tier_max_blocks(const umbp_tier *tier, unsigned n_ranks);

/* Close a client or serving handle. A serving handle marks the tier
 * STOPPED and releases the table's lock byte (its pending requests are
 * answered -ENOTCONN by the clients' polls). Accepts NULL. */
UMBP_API void umbp_tier_close(umbp_tier *tier);

/* ---- the tier process ---- */

typedef struct umbp_tier_params {
  uint32_t records;           /* request records; 0: 64 */
  uint32_t keys_per_record;   /* 0: 1024 (48 KiB a record) */
  uint32_t default_timeout_ms;/* for requests that give none; 0: 2000 */
} umbp_tier_params;

/* Fill defaults (all 0). Accepts NULL. */
UMBP_API void umbp_tier_params_init(umbp_tier_params *p);

/* Bytes of /dev/shm that a new request table of params' geometry takes
 * (NULL or 0 fields: the defaults), or 0 when umbp_tier_serve() would refuse
 * the geometry (-EINVAL). Any thread, any process; no side effect. A tool
 * checks it against the room in /dev/shm before it creates anything: the
 * largest geometry is about 200 GB. */
UMBP_API uint64_t umbp_tier_table_bytes(const umbp_tier_params *params);

/* Serve the pool's table: create it (or adopt the one a previous tier left,
 * when its geometry matches params; requests that tier had taken are made
 * ready again) and hold its lock byte. 0 and *ret_tier; -EBUSY (a live tier
 * serves the pool: the message names its pid); -EINVAL; -EROFS; -ECHILD;
 * -ENOSPC, -EACCES, -EIO (creating the file, which is then removed
 * again: umbp_tier_table_bytes() is the room it needs). fork(): the file is
 * close-on-exec; a child that does not exec shares the lock byte, so the
 * tier counts as alive while that child lives. */
UMBP_API int umbp_tier_serve(umbp_pool *pool, const umbp_tier_params *params, umbp_tier **ret_tier);

typedef struct umbp_tier_job {
  uint64_t ticket;
  unsigned n_blocks, n_ranks;
  uint16_t client;      /* registry slot + 1 of the requesting process */
  uint64_t deadline_ns; /* CLOCK_MONOTONIC */
  uint64_t age_ns;      /* since the request was made */
} umbp_tier_job;

/* Take the oldest ready request: 1 and *ret_job with its keys in keys[0,
 * n_blocks * n_ranks) (keys has room for max_keys); 0 when none is ready.
 * Requests already past their deadline are completed -ETIMEDOUT on the way.
 * Also reclaims abandoned records. -EINVAL (NULL, or max_keys below the
 * table's keys per record); -EPERM (not a serving handle). */
UMBP_API int umbp_tier_take(umbp_tier *tier, umbp_tier_job *ret_job, umbp_key *keys, unsigned max_keys);

/* Answer a taken request with result (>= 0: leading blocks now in the pool
 * on every rank; < 0: a negative errno, with msg for the client's message,
 * may be NULL). Ordering: release — what the tier published before is
 * visible to the client that sees the answer. 0; -ESTALE (the client
 * cancelled it meanwhile); -EINVAL; -EPERM. */
UMBP_API int umbp_tier_complete(umbp_tier *tier, uint64_t ticket, int result, const char *msg);

/* Sleep until a client rings the doorbell or timeout_ms pass (returns at
 * once when a request is ready). 0 or -EINVAL/-EPERM. Releases nothing. */
UMBP_API int umbp_tier_wait(umbp_tier *tier, uint32_t timeout_ms);

/* Publish the tier's state and a message for `umbp tier status` (msg NULL:
 * keep the last one), and record a heartbeat. Clients' requests are refused
 * with -ENOTCONN unless the state is UMBP_TIER_CONNECTED. 0, -EINVAL (NULL,
 * unknown state), -EPERM (not a serving handle). */
UMBP_API int umbp_tier_set_state(umbp_tier *tier, int state, const char *msg);
/* Add delta to counter stat (enum umbp_tier_stat). Relaxed. */
UMBP_API void umbp_tier_stat_add(umbp_tier *tier, unsigned stat, uint64_t delta);

typedef struct umbp_tier_info {
  bool alive;             /* a process holds the table's lock byte */
  int pid;                /* of the tier that served it last */
  int state;              /* enum umbp_tier_state (STOPPED when not alive) */
  char message[200];      /* what it last said about its state */
  uint64_t state_age_ns;  /* since the state last changed */
  uint64_t heartbeat_age_ns;
  uint32_t records, keys_per_record, default_timeout_ms;
  uint32_t free_, ready, working, done; /* records by state */
  uint64_t stats[UMBP_TIER_ST_COUNT]; /* the last tier's counters; HELD 0 when not alive */
} umbp_tier_info;

/* Describe the pool's tier table: 0 and *ret; -ENOENT (no tier ever served
 * the pool); -EINVAL; -EBADMSG. Loads only: read-only handles too. */
UMBP_API int umbp_tier_info_get(umbp_pool *pool, umbp_tier_info *ret);

/* Name of a state ("stopped", "connecting", ...); never NULL. */
UMBP_API const char *umbp_tier_state_name(int state);

#ifdef __cplusplus
}
#endif
#endif
