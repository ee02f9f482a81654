/* SPDX-License-Identifier: Apache-2.0 */
/*
 * namespaces.c — namespaces: registration and lookup by name, quotas, and
 * each namespace's block count with its journal.
 *
 * Design note.
 *
 * Block counts. A namespace's block count (umbp_ns_info_get, quotas) counts
 * the slots whose counted flag is set. Flag and count are two words that a
 * process may be killed or stopped between, so neither a lock (a stopped
 * holder would block every publish and removal in the namespace) nor a bare
 * fetch-add (a kill between flag and add leaves the count off by one for
 * good) will do. Instead the count lives in one 64-bit word with the identity
 * of the last change: (count, writer thread, that writer's sequence number),
 * changed by CAS only. A thread first writes a record of its change in its
 * own thread line (rec_*: namespace, slot, new flag, sequence number), then
 * CASes the count word, then sets the flag. Whoever replaces a count word
 * that names another thread first acknowledges that thread's change in that
 * thread's line (`applied`). So a change was applied iff the count word still
 * names it or its thread's `applied` says so, and the reaper of a dead thread
 * finishes a recorded change exactly: set the flag if it was applied, nothing
 * if not (the flag is set only after the CAS). No thread ever waits for
 * another: a stopped writer holds nothing but its own record.
 *
 * Namespaces live in a table of UMBP_MAX_NAMESPACES entries in the segment;
 * an id is a table position, stable for the pool's life. Registering takes
 * the header's ns_lock (lock.c) and publishes the entry by storing its state
 * last (release). A namespace over its byte quota gives up its own blocks
 * first (evict.c, reserve.c).
 */
#include "index/index_inline.h"

/* ---- namespace block counts (design note above) ----------------------------- */
/* Whether sequence number a is newer than b (19-bit, wrapping). */
static bool seq_newer(uint32_t a, uint32_t b) {
  return (int32_t)((a - b) << (32 - NSW_SEQ_BITS)) > 0;
}

/* Tell thread line `line` (0-based index in the readers region) that its change
 * seq was applied: it is, since the count word we are about to replace names it. */
static void ack(struct umbp_reader_shm *lines, unsigned line, uint32_t seq) {
  _Atomic uint32_t *a = &lines[line].applied;
  uint32_t cur = atomic_load_explicit(a, memory_order_seq_cst);
  while (seq_newer(seq, cur))
    if (atomic_compare_exchange_weak_explicit(a, &cur, seq, memory_order_seq_cst, memory_order_seq_cst)) break;
}

/* The three steps are inlined into umbp_ix_ns_count_set(), which runs twice
 * a block (publish, removal); the test helper that stops a change between
 * steps calls them one by one. */
__attribute__((always_inline)) inline void umbp_ix_ns_count_begin(struct umbp_reader_shm *rec, uint32_t ns,
                                                                  uint32_t s, uint8_t f) {
  uint32_t seq = (atomic_load_explicit(&rec->rec_seq, memory_order_relaxed) + 1) & NSW_SEQ_MASK;
  atomic_store_explicit(&rec->rec_ns, ns, memory_order_relaxed);
  atomic_store_explicit(&rec->rec_flag, f, memory_order_relaxed);
  atomic_store_explicit(&rec->rec_seq, seq, memory_order_relaxed);
  /* Release, and the count word's CAS after it is seq_cst (a release): a
   * thread that reads the word naming us (acquire) finds the record. The
   * reaper reads records only of a dead process, whose stores are all
   * visible. A seq_cst store here was one more locked instruction. */
  atomic_store_explicit(&rec->rec_slot, s + 1, memory_order_release);
}

__attribute__((always_inline)) inline void umbp_ix_ns_count_apply(struct umbp_reader_shm *lines,
                                                                  struct umbp_ns_shm *n,
                                                                  const struct umbp_reader_shm *rec, unsigned me) {
  uint32_t seq = atomic_load_explicit(&rec->rec_seq, memory_order_relaxed);
  uint8_t f = atomic_load_explicit(&rec->rec_flag, memory_order_relaxed);
  uint64_t w = atomic_load_explicit(&n->count_word, memory_order_seq_cst);
  for (;;) {
    unsigned wr = NSW_WRITER(w);
    if (wr && wr != me && wr <= UMBP_MAX_PROCS * UMBP_MAX_THREADS) ack(lines, wr - 1, NSW_SEQ(w));
    uint64_t nw = NSW_MAKE(NSW_COUNT(w) + (f ? 1u : (uint32_t)-1), me, seq);
    /* seq_cst: after the ack above (a reaper reads the word, then `applied`) */
    if (atomic_compare_exchange_weak_explicit(&n->count_word, &w, nw, memory_order_seq_cst, memory_order_seq_cst))
      return;
  }
}

__attribute__((always_inline)) inline void umbp_ix_ns_count_end(struct umbp_reader_shm *rec,
                                                                struct umbp_slot_meta *meta) {
  uint32_t s = atomic_load_explicit(&rec->rec_slot, memory_order_relaxed) - 1;
  atomic_store_explicit(&meta[s].counted, atomic_load_explicit(&rec->rec_flag, memory_order_relaxed),
                        memory_order_release);
  atomic_store_explicit(&rec->rec_slot, 0, memory_order_release);
}

/* Set slot s's counted flag to f (0 or 1), moving namespace ns's count with
 * it; nothing when the flag already is f. rec: the calling thread's line (or,
 * for a reaper, a line of the dead process), `me` its writer number. The
 * caller owns the slot's state (RESERVED or EVICTING under its id, or a dead
 * owner's, as its reaper), so no one else changes this flag meanwhile. */
void umbp_ix_ns_count_set(struct umbp_reader_shm *lines, struct umbp_reader_shm *rec, unsigned me,
                          struct umbp_ns_shm *nss, struct umbp_slot_meta *meta, uint32_t slot_count, uint32_t ns,
                          uint32_t s, uint8_t f) {
  if (ns >= UMBP_MAX_NAMESPACES || s >= slot_count) return;
  if (atomic_load_explicit(&meta[s].counted, memory_order_relaxed) == f) return;
  umbp_ix_ns_count_begin(rec, ns, s, f);
  umbp_ix_ns_count_apply(lines, &nss[ns], rec, me);
  UMBP_STOP_POINT(UMBP_STOP_COUNT_APPLIED);
  umbp_ix_ns_count_end(rec, meta);
}

/* Finish the count changes the threads of dead registry slot q recorded
 * (called by its reaper, before it changes any count itself): a change the
 * count word took gets its flag, one it did not take is dropped. */
void umbp_ix_ns_count_records_reap(struct umbp_reader_shm *lines, struct umbp_ns_shm *nss,
                                   struct umbp_slot_meta *meta, uint32_t slot_count, unsigned q) {
  for (unsigned t = 0; t < UMBP_MAX_THREADS; t++) {
    struct umbp_reader_shm *rec = &lines[q * UMBP_MAX_THREADS + t];
    uint32_t s1 = atomic_load_explicit(&rec->rec_slot, memory_order_seq_cst);
    if (!s1) continue;
    uint32_t ns = atomic_load_explicit(&rec->rec_ns, memory_order_relaxed);
    uint32_t seq = atomic_load_explicit(&rec->rec_seq, memory_order_relaxed);
    if (ns < UMBP_MAX_NAMESPACES && s1 - 1 < slot_count) {
      /* the word first, then `applied`: a thread that replaced a word naming
       * this change acknowledged it before its CAS */
      uint64_t w = atomic_load_explicit(&nss[ns].count_word, memory_order_seq_cst);
      bool applied = (NSW_WRITER(w) == q * UMBP_MAX_THREADS + t + 1 && NSW_SEQ(w) == seq) ||
                     atomic_load_explicit(&rec->applied, memory_order_seq_cst) == seq;
      if (applied)
        atomic_store_explicit(&meta[s1 - 1].counted, atomic_load_explicit(&rec->rec_flag, memory_order_relaxed),
                              memory_order_release);
    }
    atomic_store_explicit(&rec->rec_slot, 0, memory_order_release);
  }
}

uint64_t umbp_ix_ns_used(const struct umbp_ns_shm *n) {
  return NSW_COUNT(atomic_load_explicit(&((struct umbp_ns_shm *)n)->count_word, memory_order_relaxed));
}

/* The table position of registered name (len bytes) in namespace table ns, or
 * -1; sets no message (umbp_ns_register() looks before it registers, and a
 * call that succeeds leaves umbp_last_error() alone). */
static int ns_find(struct umbp_ns_shm *ns, const char *name, size_t len) {
  for (unsigned i = 0; i < UMBP_MAX_NAMESPACES; i++) {
    struct umbp_ns_shm *n = &ns[i];
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
  int i = ns_find(ns, name, len);
  if (i >= 0) {
    *ret_id = ns[i].id;
    return 0;
  }
  return umbp_fail(-ENOENT, "namespace '%s' is not registered: register it with umbp_ns_register()", name);
}

UMBP_API int umbp_ns_register(umbp_pool *p, const char *name, uint32_t *ret_id) {
  size_t len;
  if (!p || !ret_id) return umbp_fail(-EINVAL, "umbp_ns_register: pool and ret_id are required");
  int rc = ns_check_name(name, &len);
  if (rc) return rc;
  struct umbp_ns_shm *table = umbp_pool_region(p, UMBP_REG_NAMESPACES);
  int found = ns_find(table, name, len);
  if (found >= 0) {
    *ret_id = table[found].id;
    return 0;
  }
  if (p->forked) return umbp_pool_forked_fail(p);
  if (p->read_only || !p->index) return umbp_fail(-EROFS, "pool is attached read-only: cannot register namespaces");
  struct umbp_index *ix = p->index;
  int lrc = umbp_ix_spin_lock_owner(p, &ix->ih->ns_lock, "the namespace table's lock");
  if (lrc) return lrc;
  int i = ns_find(ix->ns, name, len);
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
  if (i < 0)
    return umbp_fail(-ENOSPC, "all %d namespaces of pool '%s' are in use, and ids are never reused: use a "
                              "registered name (list them with 'umbp inspect %s') or a new pool",
                     UMBP_MAX_NAMESPACES, p->name, p->name);
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
  i.blocks = umbp_ix_ns_used(ns);
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
  if (!p) return umbp_fail(-EINVAL, "pool is NULL");
  if (id >= UMBP_MAX_NAMESPACES) return umbp_fail(-EINVAL, "namespace id %u is out of range", id);
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
  return umbp_ix_ns_used(&ix->ns[ns]) * ix->slot_size >= q;
}

