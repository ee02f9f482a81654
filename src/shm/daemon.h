/* SPDX-License-Identifier: Apache-2.0 */
/*
 * daemon.h — the pool's daemon lock (internal; used by `umbp daemon` and
 * `umbp inspect`).
 *
 * Design note. At most one daemon owns a pool. Ownership is an OFD write lock
 * on byte UMBP_LOCK_DAEMON of the pool file, taken on the daemon's own pool
 * handle: the kernel drops it when that open file description closes, i.e.
 * when the daemon exits or is killed, so a restarted daemon can always take
 * it and a second one never can. OFD locks do not report their holder's pid
 * (F_OFD_GETLK gives l_pid -1), so the holder also stores its registry slot + 1
 * in the header's mutable owner_slot word; the pid shown to people comes from
 * that registry slot. owner_slot is a hint for people (a daemon killed with
 * SIGKILL leaves it behind); the lock alone decides.
 */
#ifndef UMBP_SHM_DAEMON_H
#define UMBP_SHM_DAEMON_H

#include "shm/pool_internal.h"

/* Take the daemon lock on a read-write handle and record this process as the
 * owner (owner_slot, release). 0; -EBUSY with a message naming the holder's
 * pid when another daemon holds it; -EROFS on a read-only handle; -errno. */
int umbp_daemon_lock_acquire(umbp_pool *p);
/* Clear owner_slot (if it is ours) and drop the lock. Accepts a handle that
 * does not hold it. */
void umbp_daemon_lock_release(umbp_pool *p);
/* Is a daemon holding the pool? 1 and *ret_pid (the holder's pid, or -1 when
 * unknown), 0 when none, -errno when the lock cannot be queried. Works on
 * read-only handles (F_OFD_GETLK needs no write access). *ret_last_pid (may be
 * NULL) gets the pid named by owner_slot even when no daemon runs (-1: none). */
int umbp_daemon_query(umbp_pool *p, int *ret_pid, int *ret_last_pid);

#endif
