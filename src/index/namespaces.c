/* SPDX-License-Identifier: Apache-2.0 */
/*
 * namespaces.c — namespaces: registration and lookup by name, quotas, and
 * each namespace's block count with its journal.
 *
 * Design note.
 *
 * Block counts. A namespace's used_slots (its blocks, for quotas and
 * umbp_ns_info_get) counts the slots whose counted flag is set; the flag and
 * the count change together under the namespace's count lock, after a journal
 * entry that the next holder redoes if the last one died in between (see
 * umbp_ix_ns_count_set()). This holds the count exact across kills: a bare
 * fetch-add left it off by one when a kill fell between flag and add.
 *
 * Namespaces live in a table of UMBP_MAX_NAMESPACES entries in the segment;
 * an id is a table position, stable for the pool's life. Registering takes
 * the header's ns_lock (lock.c) and publishes the entry by storing its state
 * last (release). A namespace over its byte quota gives up its own blocks
 * first (evict.c, reserve.c).
 */
#include "index/index_inline.h"

/* ---- namespace block counts ------------------------------------------------
 * A namespace's used_slots counts its slots whose counted flag is 1 (set at
 * publish, cleared when the slot leaves the index). The flag and the count are
 * two words, so a process killed between the two stores would leave the count
 * off by one for the pool's life (it did, with a bare fetch-add: 1 kill in ~300
 * of the kill test under ASan). So both change under the namespace's count
 * lock and after a journal entry (struct umbp_ns_shm): cnt_old (the count
 * before), cnt_flag (the new flag), then cnt_slot = slot + 1 marks it valid.
 * Only a lock holder writes any of these words, so a holder that finds a valid
 * journal knows the previous holder died inside the change and redoes it with
 * absolute stores: flag = cnt_flag, count = cnt_old +- 1. That is right
 * whether the dead holder got to neither store, one or both, and a redoer
 * killed in turn leaves the same journal for the next. A journal written only
 * in part is not yet valid (cnt_slot is stored last) and nothing else was
 * written. A dead holder's lock is taken over as bucket locks are
 * (lock_wait()), or released by its reaper after the same redo. */
static void ns_count_redo(struct umbp_ns_shm *n, struct umbp_slot_meta *meta, uint32_t slot_count) {
  uint32_t j = atomic_load_explicit(&n->cnt_slot, memory_order_relaxed);
  if (!j) return;
  uint8_t f = atomic_load_explicit(&n->cnt_flag, memory_order_relaxed);
  uint64_t old = atomic_load_explicit(&n->cnt_old, memory_order_relaxed);
  if (j - 1 < slot_count) atomic_store_explicit(&meta[j - 1].counted, f, memory_order_relaxed);
  atomic_store_explicit(&n->used_slots, f ? old + 1 : old - 1, memory_order_relaxed);
  atomic_store_explicit(&n->cnt_slot, 0, memory_order_relaxed);
}

static void ns_count_lock(umbp_pool *p, struct umbp_ns_shm *n, struct umbp_slot_meta *meta, uint32_t slot_count) {
  umbp_ix_spin_lock_owner(p, &n->cnt_lock);
  ns_count_redo(n, meta, slot_count);
}

/* Set slot s's counted flag to f (0 or 1), moving namespace ns's count with
 * it; nothing when the flag already is f. The caller owns the slot's state
 * (RESERVED or EVICTING under its id, or a dead owner's, as its reaper), so no
 * one else changes this flag meanwhile. */
void umbp_ix_ns_count_set(umbp_pool *p, struct umbp_ns_shm *nss, struct umbp_slot_meta *meta, uint32_t slot_count,
                          uint32_t ns, uint32_t s, uint8_t f) {
  if (ns >= UMBP_MAX_NAMESPACES || s >= slot_count) return;
  if (atomic_load_explicit(&meta[s].counted, memory_order_relaxed) == f) return;
  struct umbp_ns_shm *n = &nss[ns];
  ns_count_lock(p, n, meta, slot_count);
  uint64_t old = atomic_load_explicit(&n->used_slots, memory_order_relaxed);
  atomic_store_explicit(&n->cnt_old, old, memory_order_relaxed);
  atomic_store_explicit(&n->cnt_flag, f, memory_order_relaxed);
  /* release: a redoer that sees the journal valid sees its fields (x86 keeps
   * stores in order anyway; this names the order for the compiler and others) */
  atomic_store_explicit(&n->cnt_slot, s + 1, memory_order_release);
  atomic_store_explicit(&meta[s].counted, f, memory_order_release);
  atomic_store_explicit(&n->used_slots, f ? old + 1 : old - 1, memory_order_release);
  atomic_store_explicit(&n->cnt_slot, 0, memory_order_release);
  spin_unlock(&n->cnt_lock);
}

/* A dead process's count locks (called by its reaper): taken over (unless a
 * live process took one over first and so redoes it), redone, released. */
void umbp_ix_ns_count_locks_reap(umbp_pool *p, struct umbp_ns_shm *nss, struct umbp_slot_meta *meta,
                                 uint32_t slot_count, uint32_t dead) {
  for (unsigned i = 0; i < UMBP_MAX_NAMESPACES; i++) {
    uint32_t cur = dead;
    if (!atomic_compare_exchange_strong_explicit(&nss[i].cnt_lock, &cur, p->owner_id, memory_order_acquire,
                                                 memory_order_relaxed))
      continue;
    ns_count_redo(&nss[i], meta, slot_count);
    spin_unlock(&nss[i].cnt_lock);
  }
}

static int ns_find(struct umbp_index *ix, const char *name, size_t len) {
  for (unsigned i = 0; i < UMBP_MAX_NAMESPACES; i++) {
    struct umbp_ns_shm *n = &ix->ns[i];
    if (atomic_load_explicit(&n->state, memory_order_acquire) != 1) continue;
    if (n->name_len == len && !memcmp(n->name, name, len)) return (int)i;
  }
  return -1;
}

static int ns_check_name(const char *name, size_t *len) {
  *len = 0;
  if (!name) return umbp_fail(-EINVAL, "namespace name is NULL");
  *len = strlen(name);
  if (*len == 0 || *len > 128)
    return umbp_fail(-EINVAL, "namespace name is %zu bytes: use 1 to 128", *len);
  return 0;
}

UMBP_API int umbp_ns_lookup(umbp_pool *p, const char *name, uint32_t *ret_id) {
  size_t len;
  if (!p || !ret_id) return umbp_fail(-EINVAL, "umbp_ns_lookup: pool and ret_id are required");
  int rc = ns_check_name(name, &len);
  if (rc) return rc;
  struct umbp_ns_shm *ns = umbp_pool_region(p, UMBP_REG_NAMESPACES);
  for (unsigned i = 0; i < UMBP_MAX_NAMESPACES; i++) {
    if (atomic_load_explicit(&ns[i].state, memory_order_acquire) != 1) continue;
    if (ns[i].name_len == len && !memcmp(ns[i].name, name, len)) {
      *ret_id = ns[i].id;
      return 0;
    }
  }
  return umbp_fail(-ENOENT, "namespace '%s' is not registered: register it with umbp_ns_register()", name);
}

UMBP_API int umbp_ns_register(umbp_pool *p, const char *name, uint32_t *ret_id) {
  size_t len;
  if (!p || !ret_id) return umbp_fail(-EINVAL, "umbp_ns_register: pool and ret_id are required");
  int rc = ns_check_name(name, &len);
  if (rc) return rc;
  if (umbp_ns_lookup(p, name, ret_id) == 0) return 0;
  if (p->forked) return umbp_pool_forked_fail(p);
  if (p->read_only || !p->index) return umbp_fail(-EROFS, "pool is attached read-only: cannot register namespaces");
  struct umbp_index *ix = p->index;
  umbp_ix_spin_lock_owner(p, &ix->ih->ns_lock);
  int i = ns_find(ix, name, len);
  if (i < 0) {
    for (unsigned k = 0; k < UMBP_MAX_NAMESPACES; k++)
      if (atomic_load_explicit(&ix->ns[k].state, memory_order_relaxed) == 0) {
        struct umbp_ns_shm *n = &ix->ns[k];
        n->id = k; /* ids are table positions: stable for the pool's life */
        n->name_len = (uint32_t)len;
        memset(n->name, 0, sizeof n->name);
        memcpy(n->name, name, len);
        atomic_store_explicit(&n->quota_bytes, 0, memory_order_relaxed);
        /* pairs with the acquire loads in ns_find / umbp_ns_lookup */
        atomic_store_explicit(&n->state, 1, memory_order_release);
        atomic_fetch_add(&ix->ih->n_namespaces, 1);
        i = (int)k;
        break;
      }
  }
  spin_unlock(&ix->ih->ns_lock);
  if (i < 0) return umbp_fail(-ENOSPC, "all %d namespaces of the pool are in use", UMBP_MAX_NAMESPACES);
  *ret_id = (uint32_t)i;
  return 0;
}

UMBP_API int umbp_ns_name(umbp_pool *p, uint32_t id, char *buf, size_t n) {
  if (!p || !buf || !n) return umbp_fail(-EINVAL, "umbp_ns_name: pool and a buffer of n >= 1 bytes are required");
  if (id >= UMBP_MAX_NAMESPACES) return umbp_fail(-EINVAL, "namespace id %u is out of range", id);
  struct umbp_ns_shm *ns = (struct umbp_ns_shm *)umbp_pool_region(p, UMBP_REG_NAMESPACES) + id;
  if (atomic_load_explicit(&ns->state, memory_order_acquire) != 1)
    return umbp_fail(-ENOENT, "namespace %u is not registered", id);
  size_t l = ns->name_len < 128 ? ns->name_len : 128;
  if (l >= n) l = n - 1;
  memcpy(buf, ns->name, l);
  buf[l] = 0;
  return 0;
}

UMBP_API int umbp_ns_info_get(umbp_pool *p, uint32_t id, umbp_ns_info *ret) {
  if (!p || !ret) return umbp_fail(-EINVAL, "umbp_ns_info_get: pool and ret are required");
  if (id >= UMBP_MAX_NAMESPACES) return umbp_fail(-EINVAL, "namespace id %u is out of range", id);
  struct umbp_ns_shm *ns = (struct umbp_ns_shm *)umbp_pool_region(p, UMBP_REG_NAMESPACES) + id;
  if (atomic_load_explicit(&ns->state, memory_order_acquire) != 1)
    return umbp_fail(-ENOENT, "namespace %u is not registered", id);
  umbp_ns_info i;
  memset(&i, 0, sizeof i);
  i.id = id;
  size_t l = ns->name_len < 128 ? ns->name_len : 128;
  memcpy(i.name, ns->name, l);
  i.blocks = atomic_load_explicit(&ns->used_slots, memory_order_relaxed);
  i.bytes = i.blocks * p->hdr->slot_size;
  i.quota_bytes = atomic_load_explicit(&ns->quota_bytes, memory_order_relaxed);
  *ret = i;
  return 0;
}

UMBP_API int umbp_ns_count(umbp_pool *p) {
  if (!p) return umbp_fail(-EINVAL, "pool is NULL");
  const struct umbp_ns_shm *ns = umbp_pool_region(p, UMBP_REG_NAMESPACES);
  int n = 0;
  for (unsigned i = 0; i < UMBP_MAX_NAMESPACES; i++) n += atomic_load_explicit(&ns[i].state, memory_order_acquire) == 1;
  return n;
}

UMBP_API int umbp_ns_set_quota(umbp_pool *p, uint32_t id, uint64_t bytes) {
  if (!p || id >= UMBP_MAX_NAMESPACES) return umbp_fail(-EINVAL, "namespace id %u is out of range", id);
  if (p->forked) return umbp_pool_forked_fail(p);
  if (p->read_only || !p->index) return umbp_ix_fail(p); /* -EROFS */
  struct umbp_ns_shm *ns = (struct umbp_ns_shm *)umbp_pool_region(p, UMBP_REG_NAMESPACES) + id;
  if (atomic_load_explicit(&ns->state, memory_order_acquire) != 1)
    return umbp_fail(-ENOENT, "namespace %u is not registered", id);
  atomic_store_explicit(&ns->quota_bytes, bytes, memory_order_relaxed);
  return 0;
}

bool umbp_ix_ns_over_quota(struct umbp_index *ix, uint32_t ns) {
  if (ns >= UMBP_MAX_NAMESPACES) return false;
  uint64_t q = atomic_load_explicit(&ix->ns[ns].quota_bytes, memory_order_relaxed);
  if (!q) return false;
  return atomic_load_explicit(&ix->ns[ns].used_slots, memory_order_relaxed) * ix->slot_size >= q;
}

