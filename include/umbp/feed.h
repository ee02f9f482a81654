/* SPDX-License-Identifier: Apache-2.0 */
/*
 * feed.h — the pool's published-key feed: every block published in the pool
 * (and every block removed or evicted), in order, for any number of consumers,
 * each reading at its own cursor.
 *
 * Why a second event channel. umbp_events_drain() (index.h) hands each event
 * to exactly one drainer: the vLLM connector drains removals from it, so a
 * second reader (the host tier, `umbp tier`) would steal them. The feed is a
 * broadcast log instead: producers append and never wait for anyone; each
 * consumer reads every entry at its own cursor. A consumer that falls more
 * than the feed's capacity behind (stopped, killed, slow) loses the oldest
 * entries and is told how many; no consumer, live, stopped or dead, can hold
 * back a producer or another consumer. Design note and memory ordering:
 * src/index/events.c.
 *
 * Where it lives. In its own file beside the pool, /dev/shm/umbp.NAME.feed
 * (4 KiB header + 64 bytes an entry: 4 MiB for the default 65536 entries),
 * created by the first consumer's umbp_feed_open(), removed by
 * umbp_pool_destroy(). Until then no process pays anything: publishers start
 * appending when they see the pool header's feed generation change (one
 * relaxed load per publish before that). With a feed, each publish and
 * removal also appends one 64-byte entry (one atomic add on the shared head,
 * one CAS and a store on the entry's line).
 *
 * Calling context, for every function below unless its comment says more:
 * any thread of any process holding a read-write handle of the pool. A
 * umbp_feed handle is for one thread at a time (it carries the consumer's
 * private cursor); different handles are independent. Results go out through
 * ret_ pointers written only on success; errors are negative errno codes with
 * umbp_last_error() naming the cause.
 */
#ifndef UMBP_FEED_H
#define UMBP_FEED_H

#include <stdbool.h>
#include <stdint.h>

#include "umbp/index.h"
#include "umbp/pool.h"

#ifdef __cplusplus
extern "C" {
#endif

#define UMBP_FEED_NAME_MAX 31     /* consumer names: [A-Za-z0-9._-]{1,31} */
#define UMBP_FEED_MAX_CONSUMERS 16 /* named cursors kept in the feed */

typedef struct umbp_feed umbp_feed;

enum umbp_feed_start {
  UMBP_FEED_RESUME = 0,      /* the consumer's committed cursor when its name is known, else as FROM_NOW */
  UMBP_FEED_FROM_NOW = 1,    /* entries appended after the open */
  UMBP_FEED_FROM_OLDEST = 2, /* the oldest entry still in the feed */
};

typedef struct umbp_feed_opts {
  uint32_t capacity; /* entries, when this open creates the feed: rounded up to a power of two,
                        64..2^24; 0: 65536. Ignored when the feed exists. */
  int start;         /* enum umbp_feed_start */
} umbp_feed_opts;

typedef struct umbp_feed_entry {
  uint64_t pos;   /* position in the feed (consecutive; gaps are lost entries) */
  int type;       /* UMBP_EV_STORED or UMBP_EV_REMOVED (index.h) */
  uint16_t owner; /* registry slot + 1 of the process that published or removed it
                     (umbp_pool_proc_slot() + 1; a reaper's for a dead remover) */
  umbp_key key;   /* key.ns is this pool's namespace id: umbp_ns_name() gives its name */
} umbp_feed_entry;

/* Fill defaults: capacity 0 (65536), start UMBP_FEED_RESUME. Accepts NULL. */
UMBP_API void umbp_feed_opts_init(umbp_feed_opts *opts);

/* Bytes of /dev/shm that a feed created with this capacity takes (0: the
 * default; rounded up to a power of two, as umbp_feed_open() does), or 0
 * when umbp_feed_open() would refuse it (above 2^24 entries: 1 GiB). Any
 * thread, any process; no side effect. */
UMBP_API uint64_t umbp_feed_file_bytes(uint32_t capacity);

/* Open the pool's feed as consumer `name` (opts NULL: defaults), creating
 * the feed if the pool has none (or only a stale one, from an earlier pool
 * of the same name). A name is one cursor: the consumer's committed position
 * (umbp_feed_commit()) stays in the feed, so a consumer restarted under the
 * same name resumes there and re-reads what it had read but not committed.
 * Returns 0 and *ret_feed; -EINVAL (NULL argument, bad name or opts);
 * -EROFS (read-only handle); -ECHILD; -EBUSY (a live process holds that
 * consumer name); -EUSERS (UMBP_FEED_MAX_CONSUMERS names held by live
 * consumers); -ETIMEDOUT (another process held the pool's feed lock for
 * 5 s: stopped while opening); -EIDRM (the pool was destroyed while this
 * handle stayed attached: a feed made now would outlive it, or replace the
 * feed of a new pool of the same name); -ENOSPC, -EACCES, -EIO from
 * creating the file. Ownership: the handle is the caller's until umbp_feed_close(); it
 * must be closed before the pool handle is detached (after the detach,
 * umbp_feed_read() and umbp_feed_commit() fail with -EBADF; the close still
 * frees the handle and the name). The name is held by
 * the handle's open file (an OFD lock the kernel drops when the process
 * dies), so a killed consumer's name is free again at once. fork(): the
 * child's copy of the handle lets go of the file at the fork (an atfork
 * handler closes its fd and replaces its mapping), so the name stays the
 * parent's alone and is free once the parent dies, children alive or not;
 * the child's umbp_feed_read() and umbp_feed_commit() on the inherited
 * handle fail with -ECHILD (they would move the parent's cursor), and its
 * umbp_feed_close() frees only its own copy. */
UMBP_API int umbp_feed_open(umbp_pool *pool, const char *name, const umbp_feed_opts *opts,
                            umbp_feed **ret_feed);

/* Read up to max entries (oldest first) from the consumer's cursor and
 * advance it past them. Returns how many were written to out (>= 0; 0: none
 * new yet), and in *ret_lost (if not NULL) how many entries were skipped in
 * this call: overwritten before they were read (the consumer fell more than
 * the capacity behind), torn by a producer overtaken a whole lap, or left
 * unfinished for 100 ms by a producer that stopped or died between its claim
 * and its completion. Errors: -EINVAL (NULL feed, NULL out with max > 0),
 * -ESTALE (the feed was re-created since the open: open it again), -ECHILD
 * (a handle inherited through fork(), see umbp_feed_open()), -EBADF (the
 * pool handle was detached before the feed was closed). Never
 * waits: an entry still being written ends the read (it is returned by a
 * later call). Ordering: each returned entry was completely written by its
 * producer, and what that producer wrote before publishing the block (its
 * bytes, the index entry) is visible to the caller (acquire, paired with
 * the producer's release; design note in events.c). A returned STORED key
 * may already be gone again: look it up (umbp_lookup_pin) before using it. */
UMBP_API int umbp_feed_read(umbp_feed *feed, umbp_feed_entry *out, unsigned max, uint64_t *ret_lost);

/* Record that every entry before position `pos` is processed: a consumer
 * reopened under the same name with UMBP_FEED_RESUME starts there. pos
 * beyond the read cursor is clamped to it. Returns 0, or -EINVAL (NULL),
 * -ECHILD (a handle inherited through fork()), -EBADF (the pool handle was
 * detached).
 * Relaxed store to the consumer's own line of the feed; no one waits on it. */
UMBP_API int umbp_feed_commit(umbp_feed *feed, uint64_t pos);

/* The consumer's read cursor (the position of the next entry it would
 * read), entries lost since the open, and entries not yet read (head -
 * cursor, which may exceed what is still in the feed). Any of the ret_
 * pointers may be NULL. Returns 0, or -EINVAL (NULL feed). */
UMBP_API int umbp_feed_position(umbp_feed *feed, uint64_t *ret_cursor, uint64_t *ret_lost,
                                uint64_t *ret_behind);

/* Close the handle; its name stays in the feed with its committed cursor,
 * free for the next open under that name. Accepts NULL; a handle closed
 * already (not an open feed of this process) is ignored with a warning to
 * the log callback. */
UMBP_API void umbp_feed_close(umbp_feed *feed);

typedef struct umbp_feed_consumer_info {
  char name[UMBP_FEED_NAME_MAX + 1];
  int pid;            /* the process that opened it last */
  bool alive;         /* a process holds the name now */
  uint64_t committed; /* umbp_feed_commit() position */
  uint64_t read;      /* read cursor at its last read */
  uint64_t lost;      /* entries it lost, over every open under the name */
  uint64_t delivered; /* entries it read, over every open under the name */
  uint64_t active_ns; /* CLOCK_REALTIME of its last read */
} umbp_feed_consumer_info;

typedef struct umbp_feed_info {
  uint32_t capacity;
  uint32_t generation;  /* bumps each time the feed file is (re-)created */
  uint64_t head;        /* entries appended since creation */
  uint64_t overtaken;   /* entries abandoned by a producer overtaken a whole lap */
  unsigned n_consumers;
  umbp_feed_consumer_info consumers[UMBP_FEED_MAX_CONSUMERS];
} umbp_feed_info;

/* Describe the pool's feed: 0 and *ret; -ENOENT (the pool has no feed: no
 * consumer ever opened one); -EINVAL (NULL argument); -EBADMSG (the feed
 * file is not this pool's or is corrupted); -EIDRM (the pool was destroyed
 * while this handle stayed attached). Loads only: read-only handles
 * too; a snapshot. */
UMBP_API int umbp_feed_info_get(umbp_pool *pool, umbp_feed_info *ret);

#ifdef __cplusplus
}
#endif
#endif
