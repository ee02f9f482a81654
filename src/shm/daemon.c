/* SPDX-License-Identifier: Apache-2.0 */
/* daemon.c — the pool's daemon lock and run generation; the design note and
 * the contracts are in include/umbp/admin.h. */
#include <fcntl.h>
#include <string.h>
#include <unistd.h>

#include "common/common.h"
#include "shm/pool_internal.h"
#include "umbp/admin.h"

static int owner_pid(umbp_pool *p) {
  uint32_t o = atomic_load_explicit(&p->hdr->owner_slot, memory_order_acquire);
  if (o == 0 || o > UMBP_MAX_PROCS) return -1;
  const struct umbp_proc_slot *s = &p->procs[o - 1];
  if (atomic_load_explicit(&s->state, memory_order_acquire) != UMBP_PROC_LIVE ||
      __atomic_load_n(&s->role, __ATOMIC_RELAXED) != UMBP_ROLE_DAEMON) /* umbp_admin_set_role() stores it */
    return -1;
  return s->pid;
}

UMBP_API int umbp_admin_daemon_query(umbp_pool *p, int *ret_pid, int *ret_last_pid) {
  if (!p || !ret_pid) return umbp_fail(-EINVAL, "umbp_admin_daemon_query: pool and ret_pid are required");
  struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = UMBP_LOCK_DAEMON, .l_len = 1};
  if (fcntl(p->fd, F_OFD_GETLK, &fl) != 0)
    return umbp_fail(-errno, "cannot query the daemon lock of pool '%s': %s", p->name, strerror(errno));
  int last = owner_pid(p);
  if (ret_last_pid) *ret_last_pid = last;
  if (fl.l_type == F_UNLCK) return 0;
  *ret_pid = last;
  return 1;
}

UMBP_API int umbp_admin_daemon_lock(umbp_pool *p, uint64_t *ret_run_generation) {
  if (!p) return umbp_fail(-EINVAL, "umbp_admin_daemon_lock: pool is NULL");
  if (p->forked) return umbp_pool_forked_fail(p);
  if (p->read_only || p->proc_slot < 0)
    return umbp_fail(-EROFS, "pool '%s' is attached read-only: the daemon lock needs a read-write handle", p->name);
  struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = UMBP_LOCK_DAEMON, .l_len = 1};
  if (fcntl(p->fd, F_OFD_SETLK, &fl) != 0) {
    int e = errno;
    if (e == EAGAIN || e == EACCES) {
      int pid = owner_pid(p);
      /* a stopped daemon acts on SIGTERM only once resumed: 'kill -TERM'
       * alone left it holding the pool, and the operator waiting */
      if (pid > 0 && umbp_proc_stopped(pid))
        return umbp_fail(-EBUSY, "pool '%s' already has a daemon (pid %d), which is stopped (SIGSTOP or a "
                                 "debugger): stop it first (kill -TERM %d; kill -CONT %d), or resume it "
                                 "(kill -CONT %d) and leave it running",
                         p->name, pid, pid, pid, pid);
      if (pid > 0)
        return umbp_fail(-EBUSY, "pool '%s' already has a daemon (pid %d): stop it first (kill -TERM %d), or "
                                 "leave it running",
                         p->name, pid, pid);
      return umbp_fail(-EBUSY, "pool '%s' already has a daemon (its pid is not recorded yet): stop it first",
                       p->name);
    }
    return umbp_fail(-e, "cannot take the daemon lock of pool '%s': %s", p->name, strerror(e));
  }
  /* release: pairs with owner_pid()'s acquire load */
  atomic_store_explicit(&p->hdr->owner_slot, (uint32_t)p->proc_slot + 1, memory_order_release);
  /* a new run of a pool someone made before: its creation was run 1 (segment.c) */
  uint64_t gen = p->created ? atomic_load_explicit(&p->hdr->run_generation, memory_order_acquire)
                            : atomic_fetch_add_explicit(&p->hdr->run_generation, 1, memory_order_acq_rel) + 1;
  if (ret_run_generation) *ret_run_generation = gen;
  return 0;
}

UMBP_API void umbp_admin_daemon_unlock(umbp_pool *p) {
  if (!p || p->read_only || p->proc_slot < 0) return;
  struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = UMBP_LOCK_DAEMON, .l_len = 1};
  if (fcntl(p->fd, F_OFD_GETLK, &fl) != 0 || fl.l_type != F_UNLCK) return; /* someone else's (or unknown) */
  /* GETLK does not report our own lock as a conflict: F_UNLCK means it is ours or nobody's */
  uint32_t mine = (uint32_t)p->proc_slot + 1;
  atomic_compare_exchange_strong(&p->hdr->owner_slot, &mine, 0);
  fl.l_type = F_UNLCK;
  fcntl(p->fd, F_OFD_SETLK, &fl);
}
