/* SPDX-License-Identifier: Apache-2.0 */
/* admin.c — the segment layer's part of include/umbp/admin.h (the contracts
 * are there): this process's registry entry, the pool's file and mapping,
 * the hugetlbfs mount. The daemon lock is in daemon.c, the index's
 * snapshots in src/index/inspect.c. */
#include <string.h>
#include <sys/stat.h>

#include "common/common.h"
#include "shm/pool_internal.h"
#include "umbp/admin.h"

UMBP_API int umbp_admin_set_role(umbp_pool *p, int role, int rank) {
  if (!p) return umbp_fail(-EINVAL, "umbp_admin_set_role: pool is NULL");
  if (p->forked) return umbp_pool_forked_fail(p);
  if (role < UMBP_ROLE_OTHER || role > UMBP_ROLE_TOOL)
    return umbp_fail(-EINVAL, "umbp_admin_set_role: unknown role %d", role);
  if (p->read_only || p->proc_slot < 0)
    return umbp_fail(-EROFS, "pool '%s' is attached read-only: it has no registry slot to give a role", p->name);
  struct umbp_proc_slot *s = &p->procs[p->proc_slot];
  /* relaxed: for people (umbp_pool_list_procs) and the daemon's pid hint
   * (daemon.c), which load them relaxed too; nothing is ordered by them */
  __atomic_store_n(&s->role, (uint32_t)role, __ATOMIC_RELAXED);
  __atomic_store_n(&s->rank, (int32_t)rank, __ATOMIC_RELAXED);
  return 0;
}

UMBP_API int umbp_admin_pool_stat(umbp_pool *p, struct stat *ret_st) {
  if (!p || !ret_st) return umbp_fail(-EINVAL, "umbp_admin_pool_stat: pool and ret_st are required");
  if (p->forked) return umbp_pool_forked_fail(p);
  struct stat st;
  if (fstat(p->fd, &st) != 0)
    return umbp_fail(-errno, "cannot stat the file of pool '%s' (%s): %s", p->name, p->path, strerror(errno));
  *ret_st = st;
  return 0;
}

UMBP_API int umbp_admin_pool_mapping(const umbp_pool *p, void **ret_base, size_t *ret_len) {
  if (!p || !ret_base || !ret_len)
    return umbp_fail(-EINVAL, "umbp_admin_pool_mapping: pool, ret_base and ret_len are required");
  *ret_base = p->base;
  *ret_len = p->size;
  return 0;
}

UMBP_API int umbp_admin_hugetlbfs_mount(char *buf, size_t n) {
  if (!buf) return umbp_fail(-EINVAL, "umbp_admin_hugetlbfs_mount: buf is NULL");
  int rc = umbp_hugetlbfs_mount(buf, n);
  if (rc)
    return umbp_fail(rc, "no hugetlbfs mount in /proc/mounts (or its path is longer than %zu bytes): mount one "
                         "(mount -t hugetlbfs none /dev/hugepages)",
                     n ? n - 1 : 0);
  return 0;
}
