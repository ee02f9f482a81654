/* SPDX-License-Identifier: Apache-2.0 */
/*
 * threads.c — each thread's place in a pool: its slot (thread-local) and its
 * line in the segment (struct umbp_reader_shm: pending lookup counts, its
 * namespace-count record), the process's list of index instances, fork(),
 * and umbp_reclaim(). thread_slot(), on every lookup's path, is static inline
 * in index_inline.h.
 *
 * Design note.
 *
 * A thread gets its line (and its ledger index, the same tid) in its
 * process's row on its first call on a pool, by setting a bit in the
 * process's thread_bits; its thread-exit destructor flushes its counts and
 * gives the line back. The per-thread slots are cached in thread-local
 * memory, one per pool the thread uses (TL_MAX).
 *
 * Lookups keep no reader state: slots are type-stable (a slot's metadata is
 * always a slot's metadata, in a fixed array) and a lookup validates what it
 * read against the slot's state word, which changes, with a new generation,
 * on every transition (way_check() in index_inline.h). So a removed slot is
 * FREE at once, there is no grace period, and a reader that is stopped,
 * frozen or in a debugger holds back nothing but the blocks it has pinned.
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

/* Since layout 6 a removed slot is free at once (design note above): there
 * is nothing left to reclaim. Kept for callers of earlier versions. */
UMBP_API int umbp_reclaim(umbp_pool *p) {
  if (p && p->forked) return umbp_pool_forked_fail(p); /* a fork() child's copy of the handle */
  if (!p || !p->index) return umbp_ix_fail(p);      /* -EINVAL (NULL) or -EROFS (read-only) */
  return 0;
}
