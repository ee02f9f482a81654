/* SPDX-License-Identifier: Apache-2.0 */
/*
 * lock.c — the index's owner-id spin locks: the namespace table's lock,
 * each namespace's count lock and each bucket's inserter lock.
 *
 * Design note. A lock word holds its holder's owner id (registry slot + 1;
 * 0: free), so that a waiter can tell whether the holder is alive: every
 * 1024 rounds it asks the registry, and it takes over the lock of a holder
 * that died. That is safe because every critical section under these locks
 * leaves the table consistent at every store (umbp_publish(); the count
 * journal in namespaces.c is redone by the next holder). A reaper releases
 * the locks of the process it reaps (reap.c). Releasing is one store:
 * spin_unlock() and bucket_unlock() are static inline in index_inline.h.
 */
#include "index/index_inline.h"

#include <time.h>

/* One failed round of taking an owner-id lock that `cur` holds (0: free):
 * true when the holder died and the caller may steal it (its critical
 * sections leave the table consistent at every store, see publish());
 * otherwise spin, then back off to sleeping after 100000 rounds. */
static bool lock_wait(umbp_pool *p, unsigned spins, uint32_t cur) {
  if (cur && (spins & 1023) == 1023 && !umbp_registry_alive(p, cur - 1)) return true;
  umbp_cpu_relax();
  if (spins > 100000) {
    struct timespec ts = {0, 50000};
    nanosleep(&ts, NULL);
  }
  return false;
}

/* Take an owner-id lock: spin, then sleep; a dead holder's lock is taken
 * over (lock_wait()). */
void umbp_ix_spin_lock_owner(umbp_pool *p, _Atomic uint32_t *lock) {
  uint32_t me = p->owner_id;
  for (unsigned spins = 0;; spins++) {
    uint32_t cur = 0;
    if (atomic_compare_exchange_weak_explicit(lock, &cur, me, memory_order_acquire, memory_order_relaxed)) return;
    if (lock_wait(p, spins, cur) &&
        atomic_compare_exchange_strong_explicit(lock, &cur, me, memory_order_acquire, memory_order_relaxed))
      return;
  }
}

/* The same for a bucket's 16-bit inserter lock. */
void umbp_ix_bucket_lock(umbp_pool *p, _Atomic uint16_t *lock) {
  uint16_t me = (uint16_t)p->owner_id;
  for (unsigned spins = 0;; spins++) {
    uint16_t cur = 0;
    if (atomic_compare_exchange_weak_explicit(lock, &cur, me, memory_order_acquire, memory_order_relaxed)) return;
    if (lock_wait(p, spins, cur) &&
        atomic_compare_exchange_strong_explicit(lock, &cur, me, memory_order_acquire, memory_order_relaxed))
      return;
  }
}

