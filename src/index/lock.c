/* SPDX-License-Identifier: Apache-2.0 */
/*
 * lock.c — the index's one lock: the namespace table's registration lock
 * (an owner-id spin lock), and how a waiter names a process that holds
 * things up.
 *
 * Design note. Since layout 6 nothing on the paths of lookup, reserve,
 * publish, remove or eviction takes a lock: the bucket inserters' lock and
 * each namespace's count lock are gone (reserve.c, namespaces.c), so a
 * process that is stopped (SIGSTOP, a debugger, a frozen cgroup) in any of
 * them holds back no one. Registering a namespace, rare and off the data
 * path, keeps a lock. Its word holds its holder's owner id (registry slot +
 * 1; 0: free), so that a waiter can tell whether the holder is alive: it
 * takes over the lock of a holder that died (the critical section leaves the
 * table consistent at every store: the entry's state is stored last), and it
 * gives up on a live holder after UMBP_NS_LOCK_WAIT_NS with -EBUSY and a
 * message naming the holder's process and its state from /proc. A reaper
 * releases the lock of the process it reaps (reap.c). Releasing is one store:
 * spin_unlock() is static inline in index_inline.h.
 */
#include "index/index_inline.h"

#include <stdio.h>
#include <time.h>

/* Describe registry slot q's process for a message: "process PID (COMM,
 * state S: stopped)". State from /proc/PID/stat where this process can read
 * it (same PID namespace). */
void umbp_ix_proc_describe(umbp_pool *p, unsigned q, char *buf, size_t n) {
  const struct umbp_proc_slot *ps = &p->procs[q];
  int pid = ps->pid;
  char st = umbp_proc_state(pid);
  if (!st) st = '?';
  const char *what = st == 'T' || st == 't' ? "stopped: SIGSTOP or a debugger; send SIGCONT"
                     : st == 'D'            ? "in uninterruptible sleep"
                     : st == 'R' || st == 'S' ? "running or sleeping (a frozen cgroup looks so too)"
                     : st == 'Z'            ? "a zombie"
                                            : "state unknown: another PID namespace?";
  snprintf(buf, n, "process %d (%.16s, registry slot %u, state %c: %s)", pid, ps->comm, q, st, what);
}

/* Take an owner-id lock: spin, then sleep; a dead holder's lock is taken
 * over; a live holder is waited for at most UMBP_NS_LOCK_WAIT_NS.
 * 0, or -EBUSY with a message naming the holder. */
int umbp_ix_spin_lock_owner(umbp_pool *p, _Atomic uint32_t *lock, const char *what) {
  uint32_t me = p->owner_id;
  uint64_t deadline = 0;
  for (unsigned spins = 0;; spins++) {
    uint32_t cur = 0;
    if (atomic_compare_exchange_weak_explicit(lock, &cur, me, memory_order_acquire, memory_order_relaxed)) return 0;
    if (cur && (spins & 1023) == 1023) {
      if (cur - 1 < UMBP_MAX_PROCS && !umbp_registry_alive(p, cur - 1)) {
        if (atomic_compare_exchange_strong_explicit(lock, &cur, me, memory_order_acquire, memory_order_relaxed))
          return 0;
        continue;
      }
      uint64_t now = umbp_now_ns();
      if (!deadline) deadline = now + UMBP_NS_LOCK_WAIT_NS;
      else if (now > deadline) {
        char who[160];
        if (cur - 1 < UMBP_MAX_PROCS) umbp_ix_proc_describe(p, cur - 1, who, sizeof who);
        else snprintf(who, sizeof who, "an unknown owner id %u", cur);
        return umbp_fail(-EBUSY, "pool '%s': %s is held by %s for over %u ms: resume or end that process, then "
                                 "retry",
                         p->name, what, who, (unsigned)(UMBP_NS_LOCK_WAIT_NS / 1000000));
      }
    }
    umbp_cpu_relax();
    if (spins > UMBP_LOCK_SPINS_BEFORE_SLEEP) {
      struct timespec ts = {0, UMBP_LOCK_SLEEP_NS};
      nanosleep(&ts, NULL);
    }
  }
}
