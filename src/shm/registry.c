/* SPDX-License-Identifier: Apache-2.0 */
/*
 * registry.c — the process registry: one slot per read-write attachment.
 *
 * Design note. Liveness is never read from a pid (pids are reused, and
 * processes in other pid namespaces see other numbers). Each registry slot i
 * has a byte-range lock on byte UMBP_LOCK_PROC_BASE + i of the pool file,
 * taken as an open-file-description (OFD) lock on the handle's own fd. The
 * kernel drops it when the last fd of that description closes, i.e. when the
 * process dies, however it dies. So:
 *
 *   alive(i)  <=>  someone holds lock byte i        (F_OFD_GETLK)
 *
 * The lock byte is also the slot's mutex for claiming and reaping:
 *  - claim: try-lock byte i (F_OFD_SETLK, never blocking); on success the slot
 *    is ours. If its state is not FREE, a dead process left it: reap its state
 *    first. Then fill the fields and store state = LIVE (release; pairs with
 *    the acquire loads of readers of the table).
 *  - reap: try-lock byte i of a non-FREE slot; success means its owner is dead
 *    (a live owner holds the lock). Holding the lock, release the state the
 *    dead process left (each module's reap hook, module.h: the index's
 *    umbp_index_reap_proc), store state = FREE, unlock.
 *    Two reapers in different processes cannot reap the same slot: the lock
 *    admits one. Two threads of one process share the handle's open file
 *    description, and an OFD lock does not exclude its own description: there
 *    the handle's reaping[slot] flag is the claim, taken by compare-and-swap
 *    before the lock (claim_reap()), so one thread reaps and the other sees
 *    the slot as being reaped. The same flag makes a reaper that meets the
 *    slot it is reaping again (a free-queue wait inside the reap) leave it.
 * A process killed between taking the lock and storing LIVE leaves a FREE
 * slot whose lock the kernel drops: nothing to repair. The pid and start time
 * are recorded for people (inspect), not for decisions.
 *
 * fork(): a child shares the parent's open file descriptions, and an OFD
 * lock lives as long as its description (every fd and every mapping made
 * from it). So the index's atfork child handler gives each inherited handle
 * a description of its own and marks it unusable (segment.c,
 * umbp_pool_fork_child()): a SIGKILLed parent is seen dead and reaped while
 * its child lives, and the child's calls fail with -ECHILD. A child attaches
 * on its own.
 */
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

#include "common/common.h"
#include "shm/module.h"
#include "shm/pool_internal.h"

int umbp_registry_claim(struct umbp_pool *p, int role, int rank);
void umbp_registry_release(struct umbp_pool *p);

static int lock_byte(int fd, unsigned slot, int type) {
  struct flock fl = {.l_type = (short)type, .l_whence = SEEK_SET,
                     .l_start = UMBP_LOCK_PROC_BASE + (off_t)slot, .l_len = 1};
  return fcntl(fd, F_OFD_SETLK, &fl) == 0 ? 0 : -errno;
}

bool umbp_registry_alive(const umbp_pool *p, unsigned slot) {
  if (slot >= UMBP_MAX_PROCS) return false;
  if ((int)slot == p->proc_slot) return true; /* our own OFD lock does not conflict with itself */
  struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET,
                     .l_start = UMBP_LOCK_PROC_BASE + (off_t)slot, .l_len = 1};
  if (fcntl(p->fd, F_OFD_GETLK, &fl) != 0) return true; /* cannot tell: assume alive (never reap wrongly) */
  return fl.l_type != F_UNLCK;
}

/* Claim registry slot `slot` for reaping by this handle: true when this
 * thread now owns the claim (release it with unclaim_reap()), false when
 * another thread of this process (or this thread, further up its stack)
 * holds it. acq_rel: a thread that claims after another's unclaim sees
 * everything that reap wrote (the release in unclaim_reap()). */
static bool claim_reap(struct umbp_pool *p, unsigned slot) {
  bool expected = false;
  return atomic_compare_exchange_strong_explicit(&p->reaping[slot], &expected, true, memory_order_acq_rel,
                                                 memory_order_relaxed);
}

static void unclaim_reap(struct umbp_pool *p, unsigned slot) {
  /* pairs with the acquire of the next claim_reap() */
  atomic_store_explicit(&p->reaping[slot], false, memory_order_release);
}

/* Reap `slot`: its lock byte and its reaping claim are held by the caller. */
static void reap_locked(struct umbp_pool *p, unsigned slot) {
  struct umbp_proc_slot *s = &p->procs[slot];
  umbp_log(UMBP_LOG_INFO, "pool %s: reaping registry slot %u of dead pid %d (%s)", p->name, slot, s->pid,
           umbp_role_name((int)s->role));
  for (unsigned m = 0; m < umbp_shm_n_modules; m++) /* what it held in each module (module.h) */
    if (umbp_shm_modules[m]->reap) umbp_shm_modules[m]->reap(p, slot);
  /* pairs with the acquire load in umbp_pool_list_procs / claim */
  atomic_store_explicit(&s->state, UMBP_PROC_FREE, memory_order_release);
}

int umbp_registry_claim(struct umbp_pool *p, int role, int rank) {
  /* pass 0 takes a FREE slot; pass 1 reaps a dead process's slot and takes it */
  for (unsigned i = 0, pass = 0; pass < 2; i = (i + 1 == UMBP_MAX_PROCS) ? (pass++, 0) : i + 1) {
    struct umbp_proc_slot *s = &p->procs[i];
    bool is_free = atomic_load_explicit(&s->state, memory_order_acquire) == UMBP_PROC_FREE;
    if (pass == 0 && !is_free) continue;
    if (lock_byte(p->fd, i, F_WRLCK) != 0) continue; /* held by a live process (or a reaper) */
    if (atomic_load_explicit(&s->state, memory_order_acquire) != UMBP_PROC_FREE) {
      if (pass == 0) { /* taken meanwhile by a process that then died: leave it to pass 1 */
        lock_byte(p->fd, i, F_UNLCK);
        continue;
      }
      /* attach: no other thread has this handle yet, so the claim is ours */
      claim_reap(p, i);
      reap_locked(p, i);
      unclaim_reap(p, i);
    }
    s->role = (uint32_t)role;
    s->rank = rank;
    s->pid = getpid();
    s->start_time = umbp_proc_start_time(s->pid);
    s->attach_ns = umbp_realtime_ns();
    atomic_store_explicit(&s->heartbeat_ns, s->attach_ns, memory_order_relaxed);
    memset(s->comm, 0, sizeof s->comm);
    prctl(PR_GET_NAME, s->comm, 0, 0, 0);
    s->comm[15] = 0;
    for (unsigned t = 0; t < UMBP_MAX_THREADS; t++)
      atomic_store_explicit(&s->inflight_slot[t], UINT32_MAX, memory_order_relaxed);
    atomic_fetch_add_explicit(&s->incarnation, 1, memory_order_relaxed);
    /* release: the fields above are visible to whoever sees LIVE (acquire) */
    atomic_store_explicit(&s->state, UMBP_PROC_LIVE, memory_order_release);
    p->proc_slot = (int)i;
    p->owner_id = (uint16_t)(i + 1);
    return 0;
  }
  return umbp_fail(-EUSERS, "all %d process slots of pool '%s' are held by live processes: detach some, or "
                            "check for stuck processes with 'umbp pool info %s'",
                   UMBP_MAX_PROCS, p->name, p->name);
}

void umbp_registry_release(struct umbp_pool *p) {
  if (p->proc_slot < 0) return;
  struct umbp_proc_slot *s = &p->procs[p->proc_slot];
  atomic_store_explicit(&s->state, UMBP_PROC_FREE, memory_order_release);
  lock_byte(p->fd, (unsigned)p->proc_slot, F_UNLCK);
  p->proc_slot = -1;
  p->owner_id = 0;
}

int umbp_registry_reap_slot(umbp_pool *p, unsigned slot) {
  if (slot >= UMBP_MAX_PROCS || (int)slot == p->proc_slot || p->read_only) return 0;
  struct umbp_proc_slot *s = &p->procs[slot];
  if (atomic_load_explicit(&s->state, memory_order_acquire) == UMBP_PROC_FREE) return 0;
  /* Another thread of this process, or this thread further up its stack,
   * may be reaping this very slot (the lock re-locks for the same open file
   * description): the claim admits one. */
  if (!claim_reap(p, slot)) return 0;
  int n = 0;
  if (lock_byte(p->fd, slot, F_WRLCK) == 0) { /* else alive, or being reaped by another process */
    if (atomic_load_explicit(&s->state, memory_order_acquire) != UMBP_PROC_FREE) {
      reap_locked(p, slot);
      n = 1;
    }
    lock_byte(p->fd, slot, F_UNLCK);
  }
  unclaim_reap(p, slot);
  return n;
}

UMBP_API int umbp_pool_reap(umbp_pool *p) {
  if (!p) return umbp_fail(-EINVAL, "pool is NULL");
  if (p->forked) return umbp_pool_forked_fail(p);
  if (p->read_only) return umbp_fail(-EROFS, "pool '%s' is attached read-only: reaping needs a read-write attachment", p->name);
  int n = 0;
  for (unsigned i = 0; i < UMBP_MAX_PROCS; i++) {
    n += umbp_registry_reap_slot(p, i);
  }
  return n;
}

UMBP_API void umbp_pool_heartbeat(umbp_pool *p) {
  if (!p || p->proc_slot < 0) return;
  atomic_store_explicit(&p->procs[p->proc_slot].heartbeat_ns, umbp_realtime_ns(), memory_order_relaxed);
}

UMBP_API int umbp_pool_proc_slot(const umbp_pool *p) { return p ? p->proc_slot : -1; }

UMBP_API const char *umbp_role_name(int role) {
  switch (role) {
  case UMBP_ROLE_SCHEDULER: return "scheduler";
  case UMBP_ROLE_WORKER: return "worker";
  case UMBP_ROLE_DAEMON: return "daemon";
  case UMBP_ROLE_TOOL: return "tool";
  default: return "other";
  }
}

UMBP_API int umbp_pool_list_procs(umbp_pool *p, umbp_proc_info *out, unsigned max) {
  if (!p || (!out && max))
    return umbp_fail(-EINVAL, "umbp_pool_list_procs: pool, and out for max = %u, are required", max);
  unsigned n = 0;
  for (unsigned i = 0; i < UMBP_MAX_PROCS && n < max; i++) {
    struct umbp_proc_slot *s = &p->procs[i];
    if (atomic_load_explicit(&s->state, memory_order_acquire) == UMBP_PROC_FREE) continue;
    umbp_proc_info *o = &out[n++];
    memset(o, 0, sizeof *o);
    o->slot = i;
    o->pid = s->pid;
    o->start_time = s->start_time;
    o->role = (int)__atomic_load_n(&s->role, __ATOMIC_RELAXED); /* umbp_admin_set_role() may store them */
    o->rank = __atomic_load_n(&s->rank, __ATOMIC_RELAXED);
    o->attach_ns = s->attach_ns;
    o->heartbeat_ns = atomic_load_explicit(&s->heartbeat_ns, memory_order_relaxed);
    o->incarnation = atomic_load_explicit(&s->incarnation, memory_order_relaxed);
    o->alive = umbp_registry_alive(p, i);
    o->self = (int)i == p->proc_slot;
    memcpy(o->comm, s->comm, sizeof o->comm);
    o->comm[15] = 0;
  }
  return (int)n;
}
