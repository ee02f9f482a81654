/* SPDX-License-Identifier: Apache-2.0 */
/*
 * threads.c — each thread's place in a pool: its slot (pending counts, in
 * process memory) and its line in the segment (struct umbp_reader_shm:
 * pending lookup counts, its namespace-count record), the process's list of
 * index instances, fork(), and umbp_reclaim(). thread_slot(), on every
 * lookup's path, is static inline in index_inline.h.
 *
 * Design note.
 *
 * A thread gets its line (and its ledger index, the same tid) in its
 * process's row on its first call on a pool, by setting a bit in the
 * process's thread_bits; its thread-exit destructor flushes its counts and
 * gives the line back. Its slot (struct tl_slot: pending counts) is process
 * memory, ix->tl[tid], named by the thread's pointer (umbp_ix_self()). The
 * first thread to take a line of a handle finds its slot through the
 * handle's first entry (one compare: in the usual single scheduler thread
 * or worker thread, a lookup then writes three integer registers for it, not
 * fourteen; docs/bench-index.md, "The twenty-fourth session"); every other
 * thread through the thread cache, a small table from thread pointer to
 * tid. Neither is a thread-local variable: in a shared library a
 * dynamic-TLS read is a call (__tls_get_addr) on every lookup, and
 * initial-exec TLS fails to load into a full static TLS block (Python
 * after torch). A thread pointer is reused only after its thread exited,
 * and exit takes the thread's entries out of every cache and first entry
 * first.
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

/* ---- per-process instances and thread slots ------------------------------- */
static pthread_mutex_t inst_mu = PTHREAD_MUTEX_INITIALIZER;
/* The read-write handles this process has attached, of any pools. */
static struct umbp_index *instances[UMBP_MAX_INSTANCES];
/* Its destructor gives back, at thread exit, the lines the thread holds in
 * every pool; its value is non-NULL once the thread has one. */
static pthread_key_t tl_key;
static int tl_key_err = -1; /* pthread_key_create()'s result, once */
static pthread_once_t tl_once = PTHREAD_ONCE_INIT;

/* Take the cache entry ent off the thread cache of ix, wherever it is, and
 * its thread off the first entry. */
static void tc_drop(struct umbp_index *ix, uint64_t ent) {
  uintptr_t self = (uintptr_t)(ent >> 8), first = self;
  atomic_compare_exchange_strong_explicit(&ix->first_self, &first, 0, memory_order_release, memory_order_relaxed);
  unsigned h = umbp_ix_tc_hash(self);
  for (unsigned w = 0; w < 2; w++) {
    uint64_t e = ent;
    atomic_compare_exchange_strong_explicit(&ix->tcache[h + w], &e, 0, memory_order_relaxed, memory_order_relaxed);
  }
}

/* Give back line tid of ix, which the calling thread holds (its exit, or
 * detach): its kept slots go back on their rings, its counts into the
 * process's row, it leaves the thread cache
 * before its bit is cleared, so that no thread finds it there afterwards. */
static void line_release(struct umbp_index *ix, unsigned tid) {
  struct tl_slot *t = &ix->tl[tid];
  uintptr_t self = atomic_load_explicit(&t->owner, memory_order_relaxed);
  umbp_ix_fc_flush(ix, t); /* its kept slots back on their rings */
  umbp_ix_flush_slot(ix, t);
  tc_drop(ix, umbp_ix_tc_entry(self, tid));
  atomic_store_explicit(&t->owner, 0, memory_order_relaxed);
  if (ix->p->proc_slot >= 0)
    atomic_fetch_and_explicit(&ix->p->procs[ix->p->proc_slot].thread_bits, ~(1ull << tid), memory_order_release);
}

static void tl_destructor(void *arg) {
  (void)arg;
  uintptr_t self = umbp_ix_self();
  pthread_mutex_lock(&inst_mu);
  for (unsigned i = 0; i < UMBP_MAX_INSTANCES; i++) {
    struct umbp_index *ix = instances[i];
    if (!ix || !ix->tl) continue;
    for (unsigned tid = 0; tid < UMBP_MAX_THREADS; tid++)
      if (atomic_load_explicit(&ix->tl[tid].owner, memory_order_relaxed) == self) line_release(ix, tid);
  }
  pthread_mutex_unlock(&inst_mu);
}

static void tl_init_key(void) { tl_key_err = pthread_key_create(&tl_key, tl_destructor); }

struct tl_slot *umbp_ix_thread_slot_find(struct umbp_index *ix) {
  if (!ix->tl) return NULL;
  uintptr_t self = umbp_ix_self();
  for (unsigned tid = 0; tid < UMBP_MAX_THREADS; tid++)
    if (atomic_load_explicit(&ix->tl[tid].owner, memory_order_relaxed) == self) return &ix->tl[tid];
  return NULL;
}

/* Put this thread's line tid in the thread cache: the free one of its
 * entry's two ways, else the second (the thread there finds its line
 * again on its next call, by the slow path). */
static void tc_put(struct umbp_index *ix, uintptr_t self, unsigned tid) {
  if ((uint64_t)self >> 56) return; /* not representable: this thread always takes the slow path */
  /* The first thread to get here takes the first entry (thread_slot()
   * checks it before the cache): only that thread reads first_tl, so it
   * stores first_tl after its claim. Ordered with the previous holder's
   * tc_drop() (release there, acquire here). */
  uintptr_t none = 0;
  if (atomic_load_explicit(&ix->first_self, memory_order_relaxed) == 0 &&
      atomic_compare_exchange_strong_explicit(&ix->first_self, &none, self, memory_order_acq_rel, memory_order_relaxed)) {
    ix->first_tl = &ix->tl[tid];
    return;
  }
  unsigned h = umbp_ix_tc_hash(self);
  unsigned w = atomic_load_explicit(&ix->tcache[h], memory_order_relaxed) == 0 ? 0 : 1;
  atomic_store_explicit(&ix->tcache[h + w], umbp_ix_tc_entry(self, tid), memory_order_relaxed);
}

/* thread_slot()'s slow path (index_inline.h): find or claim this thread's
 * line in ix, and cache it. NULL (the callers return -EUSERS; the message
 * says why): all of the process's lines are taken, or the thread-exit
 * handler that would give the line back could not be registered. */
struct tl_slot *umbp_ix_thread_slot_slow(struct umbp_index *ix) {
  if (UMBP_UNLIKELY(!ix->tl || ix->p->proc_slot < 0)) {
    umbp_fail(-EUSERS, "pool '%s': this handle has no thread lines (no registry slot)", ix->p->name);
    return NULL;
  }
  uintptr_t self = umbp_ix_self();
  struct tl_slot *t = umbp_ix_thread_slot_find(ix);
  if (t) {
    tc_put(ix, self, t->tid);
    return t;
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
      t = &ix->tl[tid];
      memset((char *)t + sizeof t->owner, 0, sizeof *t - sizeof t->owner);
      t->tid = tid;
      /* what a thread that held this line before us left uncounted is lost,
       * as its pending counts would be */
      if (ix->readers) ix->readers[tid].pend_lookups = ix->readers[tid].pend_pins = 0;
      t->ctr_part = -1;
      t->ctr_ns = UINT32_MAX;
      atomic_store_explicit(&t->owner, self, memory_order_relaxed);
      break;
    }
  }
  /* The thread-exit destructor gives the line back; without it the line
   * would leak when the thread exits, so no destructor, no line. */
  pthread_once(&tl_once, tl_init_key);
  int err = tl_key_err;
  if (!err && !pthread_getspecific(tl_key)) err = pthread_setspecific(tl_key, ix);
  if (err) {
    atomic_store_explicit(&t->owner, 0, memory_order_relaxed);
    atomic_fetch_and_explicit(&ps->thread_bits, ~(1ull << t->tid), memory_order_release);
    umbp_fail(-EUSERS, "pool '%s': cannot register this thread's exit handler (%s), so it gets no thread line: "
                       "retry",
              ix->p->name, strerror(err));
    return NULL;
  }
  tc_put(ix, self, t->tid);
  return t;
}

/* Allocate the thread cache and slots of ix (attach). */
int umbp_ix_threads_init(struct umbp_index *ix) {
  size_t tcsz = UMBP_TC_SIZE * sizeof(uint64_t), tlsz = UMBP_MAX_THREADS * sizeof(struct tl_slot);
  void *m = aligned_alloc(64, tcsz + tlsz);
  if (!m) return -ENOMEM;
  memset(m, 0, tcsz + tlsz);
  ix->tcache = m;
  ix->tl = (struct tl_slot *)((char *)m + tcsz);
  return 0;
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
  for (unsigned i = 0; i < UMBP_MAX_INSTANCES; i++) {
    struct umbp_index *ix = instances[i];
    if (!ix) continue;
    instances[i] = NULL;
    ix->p->index = NULL;
    ix->p->forked_index = ix;
    umbp_pool_fork_child(ix->p);
  }
  pthread_mutex_unlock(&inst_mu);
}
static void atfork_init(void) { pthread_atfork(atfork_prepare, atfork_parent, atfork_child); }

/* Give ix a place among this process's instances
 * (umbp_index_attach_hook()). -EMFILE when the process already has
 * UMBP_MAX_INSTANCES read-write handles: a handle missing from the list would
 * escape the thread-exit destructor and fork(). */
int umbp_ix_instance_add(struct umbp_index *ix) {
  pthread_once(&atfork_once, atfork_init);
  int rc = -EMFILE;
  pthread_mutex_lock(&inst_mu);
  for (unsigned i = 0; i < UMBP_MAX_INSTANCES; i++)
    if (!instances[i]) {
      instances[i] = ix;
      rc = 0;
      break;
    }
  pthread_mutex_unlock(&inst_mu);
  return rc;
}

/* Take ix out of this process's instances and give back every thread line
 * it holds, with their counts (umbp_index_detach_hook(): no other thread of
 * ours is inside a call on this handle). */
void umbp_ix_instance_remove(struct umbp_index *ix) {
  pthread_mutex_lock(&inst_mu);
  for (unsigned i = 0; i < UMBP_MAX_INSTANCES; i++)
    if (instances[i] == ix) instances[i] = NULL;
  if (ix->tl)
    for (unsigned tid = 0; tid < UMBP_MAX_THREADS; tid++)
      if (atomic_load_explicit(&ix->tl[tid].owner, memory_order_relaxed)) line_release(ix, tid);
  pthread_mutex_unlock(&inst_mu);
}

/* Since layout 6 a removed slot is free at once (design note above); what
 * is left to reclaim is a free ring's stale entries and the free slots left
 * off it after a process held it up (reserve.c, umbp_ix_tidy()). */
UMBP_API int umbp_reclaim(umbp_pool *p) {
  if (p && p->forked) return umbp_pool_forked_fail(p); /* a fork() child's copy of the handle */
  if (!p || !p->index) return umbp_ix_fail(p);      /* -EINVAL (NULL) or -EROFS (read-only) */
  return umbp_ix_tidy(p);
}
