/* SPDX-License-Identifier: Apache-2.0 */
/*
 * readers.c — reader state and grace periods: each thread's slot and reader
 * line, the epoch, and who may reuse a removed slot, and when (limbo list,
 * umbp_reclaim()). rd_lock(), rd_unlock() and thread_slot(), on every
 * lookup's path, are static inline in index_inline.h.
 *
 * Design note.
 *
 * Grace periods (who may reuse a removed slot, and when). Reader state lives in
 * the segment: one cache line per (process, thread), holding 0 (outside a read
 * section) or the global epoch the reader entered at. A remover clears the way,
 * then records retire_epoch = epoch and keeps the slot RETIRED on its own
 * process-local limbo list. Reclaiming bumps the epoch, issues
 * membarrier(MEMBARRIER_CMD_GLOBAL_EXPEDITED) (every process registers for it
 * at attach; where the kernel lacks it, readers issue a seq_cst fence after
 * their store instead), then reads every live reader line: a retired slot is
 * reusable once every reader is either outside a section or entered at an
 * epoch > retire_epoch. Argument: the membarrier puts a full barrier in every
 * running reader between its reader-state store and its table loads, so after
 * it either the reader's store is visible to the scan (and it is waited for),
 * or the reader's table loads happen after the barrier and so after the way
 * was cleared (it cannot reach the slot). This is liburcu's memb flavour with
 * the reader registry moved into shared memory, as DPDK's rte_rcu_qsbr does.
 * Reclaim never waits, but a reader that does not leave its section (stopped
 * by SIGSTOP, a debugger or a cgroup freezer) holds back the reuse of every
 * slot retired at or after the epoch it entered at, until it resumes; a dead
 * reader's line is zeroed by the reaper. Nothing bounds a stopped reader yet.
 *
 * A thread gets its reader line (and its ledger index, the same tid) in its
 * process's row on its first call on a pool, by setting a bit in the
 * process's thread_bits; its thread-exit destructor flushes its counts and
 * gives the line back. The per-thread slots are cached in thread-local
 * memory, one per pool the thread uses (TL_MAX).
 */
#include "index/index_inline.h"

#include <stdlib.h>

#define THREAD_NONE UINT32_MAX

/* ---- per-process instances and thread slots ------------------------------- */
static pthread_mutex_t inst_mu = PTHREAD_MUTEX_INITIALIZER;
static struct umbp_index *instances[64];
static uint64_t next_instance = 1;
static pthread_key_t tl_key;
static pthread_once_t tl_once = PTHREAD_ONCE_INIT;

UMBP_IX_TLS _Thread_local struct tl_state umbp_ix_tl;
static _Thread_local bool tl_registered;

UMBP_IX_TLS _Thread_local struct tl_slot *umbp_ix_tl_last; /* the slot of the last pool this thread used */

static struct umbp_index *instance_find(uint64_t id) {
  for (unsigned i = 0; i < 64; i++)
    if (instances[i] && instances[i]->instance == id) return instances[i];
  return NULL;
}

static void tl_destructor(void *arg) {
  (void)arg;
  pthread_mutex_lock(&inst_mu);
  for (unsigned i = 0; i < TL_MAX; i++) {
    struct tl_slot *t = &umbp_ix_tl.s[i];
    if (!t->instance) continue;
    struct umbp_index *ix = instance_find(t->instance);
    if (ix) {
      umbp_ix_flush_slot(ix, t);
      struct umbp_proc_slot *ps = &ix->p->procs[ix->p->proc_slot];
      atomic_store_explicit(&ix->readers[t->tid].ctr, 0, memory_order_release);
      atomic_fetch_and_explicit(&ps->thread_bits, ~(1ull << t->tid), memory_order_release);
    }
    t->instance = 0;
  }
  pthread_mutex_unlock(&inst_mu);
}

static void tl_init_key(void) { pthread_key_create(&tl_key, tl_destructor); }

/* thread_slot()'s slow path (index_inline.h): find or claim this thread's
 * slot for ix, and a reader line in the process's row. NULL (-EUSERS, with a
 * message): the thread uses TL_MAX pools, or the process's row is full. */
struct tl_slot *umbp_ix_thread_slot_slow(struct umbp_index *ix) {
  for (unsigned i = 0; i < TL_MAX; i++)
    if (umbp_ix_tl.s[i].instance == ix->instance) return umbp_ix_tl_last = &umbp_ix_tl.s[i];
  struct tl_slot *t = NULL;
  for (unsigned i = 0; i < TL_MAX && !t; i++)
    if (!umbp_ix_tl.s[i].instance) t = &umbp_ix_tl.s[i];
  if (!t) {
    /* evict the cache entry of an instance that no longer exists */
    pthread_mutex_lock(&inst_mu);
    for (unsigned i = 0; i < TL_MAX && !t; i++)
      if (!instance_find(umbp_ix_tl.s[i].instance)) t = &umbp_ix_tl.s[i];
    pthread_mutex_unlock(&inst_mu);
    if (!t) {
      umbp_fail(-EUSERS, "this thread uses more than %d pools at once", TL_MAX);
      return NULL;
    }
  }
  struct umbp_proc_slot *ps = &ix->p->procs[ix->p->proc_slot];
  for (;;) {
    uint64_t bits = atomic_load_explicit(&ps->thread_bits, memory_order_relaxed);
    if (bits == UINT64_MAX) {
      umbp_fail(-EUSERS, "more than %d threads of this process use pool '%s': use fewer threads for pool "
                         "calls",
                UMBP_MAX_THREADS, ix->p->name);
      return NULL;
    }
    unsigned tid = (unsigned)__builtin_ctzll(~bits);
    if (atomic_compare_exchange_weak_explicit(&ps->thread_bits, &bits, bits | (1ull << tid),
                                              memory_order_acq_rel, memory_order_relaxed)) {
      memset(t, 0, sizeof *t);
      t->instance = ix->instance;
      t->tid = tid;
      /* what a thread that held this line before us left uncounted is lost,
       * as its thread-local counts would be */
      if (ix->readers) ix->readers[tid].pend_lookups = ix->readers[tid].pend_pins = 0;
      t->ctr_part = -1;
      t->ctr_ns = UINT32_MAX;
      break;
    }
  }
  if (!tl_registered) {
    pthread_once(&tl_once, tl_init_key);
    pthread_setspecific(tl_key, &umbp_ix_tl);
    tl_registered = true;
  }
  return umbp_ix_tl_last = t;
}

/* fork(): the instances list is also the list of this process's read-write
 * handles. prepare/parent hold inst_mu across fork() so that the child
 * finds the list consistent; the child then hands every handle to
 * umbp_pool_fork_child() (segment.c: a description of its own, the handle
 * marked forked), takes the index state off it (every index call then fails
 * in ix_get()'s cold path with -ECHILD, at no cost to the lookup path: no
 * getpid() there) and forgets the instance, so that no thread-exit
 * destructor of the child touches the parent's reader lines. */
static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;
static void atfork_prepare(void) { pthread_mutex_lock(&inst_mu); }
static void atfork_parent(void) { pthread_mutex_unlock(&inst_mu); }
static void atfork_child(void) {
  for (unsigned i = 0; i < 64; i++) {
    struct umbp_index *ix = instances[i];
    if (!ix) continue;
    instances[i] = NULL;
    for (unsigned j = 0; j < TL_MAX; j++)
      if (umbp_ix_tl.s[j].instance == ix->instance) umbp_ix_tl.s[j].instance = 0;
    umbp_ix_tl_last = NULL;
    ix->p->index = NULL;
    ix->p->forked_index = ix;
    umbp_pool_fork_child(ix->p);
  }
  pthread_mutex_unlock(&inst_mu);
}
static void atfork_init(void) { pthread_atfork(atfork_prepare, atfork_parent, atfork_child); }

/* Give ix its instance id and a place among this process's instances
 * (umbp_index_attach_hook()). */
void umbp_ix_instance_add(struct umbp_index *ix) {
  pthread_once(&atfork_once, atfork_init);
  pthread_mutex_lock(&inst_mu);
  ix->instance = next_instance++;
  for (unsigned i = 0; i < 64; i++)
    if (!instances[i]) {
      instances[i] = ix;
      break;
    }
  pthread_mutex_unlock(&inst_mu);
}

/* Take ix out of this process's instances and out of the calling thread's
 * slots (umbp_index_detach_hook()). */
void umbp_ix_instance_remove(struct umbp_index *ix) {
  pthread_mutex_lock(&inst_mu);
  for (unsigned i = 0; i < 64; i++)
    if (instances[i] == ix) instances[i] = NULL;
  for (unsigned i = 0; i < TL_MAX; i++)
    if (umbp_ix_tl.s[i].instance == ix->instance) umbp_ix_tl.s[i].instance = 0;
  pthread_mutex_unlock(&inst_mu);
}

int umbp_ix_limbo_push(struct umbp_index *ix, uint32_t s) {
  pthread_mutex_lock(&ix->limbo_mu);
  if (ix->nlimbo == ix->limbo_cap) {
    size_t nc = ix->limbo_cap ? ix->limbo_cap * 2 : 1024;
    uint32_t *nl = realloc(ix->limbo, nc * sizeof *nl);
    if (!nl) {
      pthread_mutex_unlock(&ix->limbo_mu);
      return -ENOMEM; /* stays RETIRED under our id; adopted after we detach */
    }
    ix->limbo = nl;
    ix->limbo_cap = nc;
  }
  ix->limbo[ix->nlimbo++] = s;
  atomic_store_explicit(&ix->limbo_n, ix->nlimbo, memory_order_relaxed);
  pthread_mutex_unlock(&ix->limbo_mu);
  return 0;
}

/* Oldest epoch any live reader is in (UINT64_MAX: none). After bumping the
 * epoch and the membarrier, see the design note. */
uint64_t umbp_ix_readers_min_epoch(umbp_pool *p, bool memb) {
  struct umbp_index_hdr *ih = umbp_pool_region(p, UMBP_REG_INDEXHDR);
  atomic_fetch_add_explicit(&ih->epoch, 1, memory_order_seq_cst);
  if (memb) {
    if (umbp_membarrier_global() != 0) atomic_thread_fence(memory_order_seq_cst);
  } else {
    atomic_thread_fence(memory_order_seq_cst);
  }
  struct umbp_reader_shm *rd = umbp_pool_region(p, UMBP_REG_READERS);
  uint64_t min = UINT64_MAX;
  for (unsigned ps = 0; ps < UMBP_MAX_PROCS; ps++) {
    uint64_t bits = atomic_load_explicit(&p->procs[ps].thread_bits, memory_order_acquire);
    if (!bits) continue;
    /* a dead process reads nothing any more, reaped or not (a reaper holding
     * its lock makes it look alive: conservative) */
    if ((int)ps != p->proc_slot && !umbp_registry_alive(p, ps)) continue;
    /* scan the whole row when bits are unknown (a dead process's bits stay set until reaped) */
    for (unsigned t = 0; t < UMBP_MAX_THREADS; t++) {
      if (!(bits & (1ull << t))) continue;
      /* acquire: pairs with rd_lock/rd_unlock's release stores */
      uint64_t c = atomic_load_explicit(&rd[ps * UMBP_MAX_THREADS + t].ctr, memory_order_acquire);
      if (c && c < min) min = c;
    }
  }
  return min;
}

UMBP_API int umbp_reclaim(umbp_pool *p) {
  if (p && p->forked) return umbp_pool_forked_fail(p); /* a fork() child's copy of the handle */
  if (!p || !p->index) return umbp_ix_fail(p);      /* -EINVAL (NULL) or -EROFS (read-only) */
  struct umbp_index *ix = p->index;
  struct tl_slot *t = thread_slot(ix);
  if (!t) return -EUSERS; /* thread_slot() set the message */
  if (!limbo_count(ix)) return 0; /* a slot retired meanwhile waits for the next call, as it would anyway */
  pthread_mutex_lock(&ix->limbo_mu);
  if (!ix->nlimbo) {
    pthread_mutex_unlock(&ix->limbo_mu);
    return 0;
  }
  uint64_t min = umbp_ix_readers_min_epoch(p, ix->memb);
  int freed = 0;
  size_t keep = 0;
  for (size_t i = 0; i < ix->nlimbo; i++) {
    uint32_t s = ix->limbo[i];
    struct umbp_slot_meta *m = &ix->meta[s];
    uint64_t w = atomic_load_explicit(&m->state, memory_order_acquire);
    if (ST_STATE(w) != UMBP_SLOT_RETIRED || ST_OWNER(w) != p->owner_id) continue; /* not ours any more */
    if (epoch_before(atomic_load_explicit(&m->retire_epoch, memory_order_relaxed), min)) {
      umbp_ix_free_slot(p, &p->procs[p->proc_slot], t->tid, s, p->owner_id);
      freed++;
    } else {
      ix->limbo[keep++] = s;
    }
  }
  ix->nlimbo = keep;
  atomic_store_explicit(&ix->limbo_n, keep, memory_order_relaxed);
  pthread_mutex_unlock(&ix->limbo_mu);
  return freed;
}

/* The reader in a read section that entered at the oldest epoch, among live
 * processes (loads only; the epoch is not bumped): 0 and its registry slot,
 * thread and entry epoch, or -ENOENT when no reader is in a section. For
 * messages that name who holds a grace period back. */
int umbp_ix_oldest_reader(umbp_pool *p, unsigned *ret_slot, unsigned *ret_tid, uint64_t *ret_epoch) {
  struct umbp_reader_shm *rd = umbp_pool_region(p, UMBP_REG_READERS);
  uint64_t min = UINT64_MAX;
  unsigned ms = 0, mt = 0;
  for (unsigned ps = 0; ps < UMBP_MAX_PROCS; ps++) {
    uint64_t bits = atomic_load_explicit(&p->procs[ps].thread_bits, memory_order_acquire);
    if (!bits || ((int)ps != p->proc_slot && !umbp_registry_alive(p, ps))) continue;
    for (unsigned t = 0; t < UMBP_MAX_THREADS; t++) {
      if (!(bits & (1ull << t))) continue;
      /* acquire: pairs with rd_lock/rd_unlock's release stores */
      uint64_t c = atomic_load_explicit(&rd[ps * UMBP_MAX_THREADS + t].ctr, memory_order_acquire);
      if (c && c < min) {
        min = c;
        ms = ps;
        mt = t;
      }
    }
  }
  if (min == UINT64_MAX) return -ENOENT;
  *ret_slot = ms;
  *ret_tid = mt;
  *ret_epoch = min;
  return 0;
}

/* Reclaim, waiting up to budget_ns for readers to move on. */
int umbp_ix_reclaim_wait(umbp_pool *p, uint64_t budget_ns) {
  uint64_t end = umbp_now_ns() + budget_ns;
  int total = 0;
  for (;;) {
    int n = umbp_reclaim(p);
    if (n > 0) total += n;
    if (n < 0 || !limbo_count(p->index) || umbp_now_ns() > end) return total;
    umbp_cpu_relax();
  }
}
