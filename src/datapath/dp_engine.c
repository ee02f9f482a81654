/* SPDX-License-Identifier: Apache-2.0 */
/*
 * dp_engine.c — layouts, the job machinery and the host (memcpy) backend.
 *
 * Design note (see umbp/datapath.h for the contract).
 *
 * A job is born in the submitting thread: it copies the caller's arrays,
 * reserves slots (store) or pins keys (load) — both are index calls that are
 * cheap and whose failures become per-key results — and then either queues
 * host tasks or issues CUDA copies. A host job is split into at most
 * `nthreads` tasks, each a contiguous range of its keys; the worker threads
 * take tasks from one FIFO under eng->mu. The job's state goes
 * QUEUED -> RUNNING (first task taken, under eng->mu) -> DONE. Cancel takes
 * eng->mu, and succeeds only in QUEUED, unlinking the job's tasks from the
 * FIFO, so no worker can ever start a cancelled job.
 *
 * The last task to finish (tasks_left reaches 0, acq_rel) finalises the job
 * in that worker thread: publish the stored keys whose copy succeeded, abort
 * every other reserved slot, unpin loaded slots. Only then is the state set
 * to DONE (release; poll's acquire load pairs with it) and the engine's
 * reference dropped. So a waiter that times out, or a caller that releases
 * its handle, never frees memory a copy may still touch: the job, its slots
 * and its pins belong to the engine until the copies stopped. CUDA jobs are
 * finalised by whichever thread first sees all their events complete (a
 * poll, a wait, a later submission sweeping released jobs, or destroy).
 *
 * Reference counts: a job starts with 2 (caller, engine). The engine's is
 * dropped at DONE, the caller's at umbp_dp_job_release; the last frees.
 *
 * Locks: eng->mu guards the task FIFO, job state transitions out of QUEUED,
 * the live-job list and the condition variables. No index call and no copy
 * runs under it.
 */
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "datapath/dp_internal.h"
#include "shm/pool_internal.h"

UMBP_API void umbp_dp_cuda_copy_calls(uint64_t *ret_batches, uint64_t *ret_ranges, uint64_t *ret_kernels) {
  uint64_t b, r, k;
  dp_cuda_copy_calls(&b, &r, &k); /* dp_cuda.c, or zeros from dp_nocuda.c */
  if (ret_batches) *ret_batches = b;
  if (ret_ranges) *ret_ranges = r;
  if (ret_kernels) *ret_kernels = k;
}

/* ---- layout ---------------------------------------------------------------- */

static int region_cmp(const void *a, const void *b) {
  const struct dp_region *x = a, *y = b;
  if (x->group != y->group) return x->group < y->group ? -1 : 1;
  if (x->layer != y->layer) return x->layer < y->layer ? -1 : 1;
  if (x->kind != y->kind) return x->kind < y->kind ? -1 : 1;
  return x->orig < y->orig ? -1 : x->orig > y->orig;
}

int umbp_kv_layout_create(umbp_pool *pool, const umbp_kv_region *regions, unsigned n,
                          umbp_kv_layout **ret_layout) {
  if (!pool || !regions || !ret_layout || n == 0)
    return umbp_fail(-EINVAL, "kv layout: pool, regions and ret_layout are required and n > 0");
  for (unsigned i = 0; i < n; i++) {
    const umbp_kv_region *r = &regions[i];
    if (!r->base || r->block_bytes == 0 || r->block_count == 0)
      return umbp_fail(-EINVAL, "kv layout: region %u needs a base, block_bytes > 0 and block_count > 0", i);
    if (r->stride < r->block_bytes)
      return umbp_fail(-EINVAL, "kv layout: region %u stride %llu < block_bytes %llu", i,
                       (unsigned long long)r->stride, (unsigned long long)r->block_bytes);
    if (r->device != UMBP_DP_CPU && r->device != UMBP_DP_CUDA)
      return umbp_fail(-EINVAL, "kv layout: region %u has unknown device %d", i, r->device);
    if (r->kind < UMBP_KV_K || r->kind > UMBP_KV_KV)
      return umbp_fail(-EINVAL, "kv layout: region %u has unknown kind %d", i, r->kind);
    if (r->device == UMBP_DP_CUDA && r->device_id < 0)
      return umbp_fail(-EINVAL, "kv layout: region %u is on cuda:%d", i, r->device_id);
    /* Block b spans [base + b * stride, + block_bytes): the last block must
     * end inside the address space, or the copies' pointer sums wrap. */
    uint64_t room = UINTPTR_MAX - (uintptr_t)r->base;
    if (r->block_bytes > room || (uint64_t)(r->block_count - 1) > (room - r->block_bytes) / r->stride)
      return umbp_fail(-EINVAL, "kv layout: region %u (%u blocks of %llu bytes at stride %llu from %p) runs past "
                       "the end of the address space; check its block_count, block_bytes and stride", i,
                       r->block_count, (unsigned long long)r->block_bytes, (unsigned long long)r->stride, r->base);
  }
  umbp_kv_layout *l = calloc(1, sizeof *l);
  if (!l) return umbp_fail(-ENOMEM, "kv layout: out of memory");
  l->r = calloc(n, sizeof *l->r);
  l->g = calloc(n, sizeof *l->g);
  if (!l->r || !l->g) {
    umbp_kv_layout_free(l);
    return umbp_fail(-ENOMEM, "kv layout: out of memory");
  }
  l->pool = pool;
  l->n = n;
  for (unsigned i = 0; i < n; i++) {
    const umbp_kv_region *r = &regions[i];
    l->r[i] = (struct dp_region){.base = r->base, .block_bytes = r->block_bytes, .stride = r->stride,
                                 .block_count = r->block_count, .device = r->device,
                                 .device_id = r->device == UMBP_DP_CUDA ? r->device_id : -1,
                                 .group = r->group, .layer = r->layer, .kind = r->kind, .orig = i};
  }
  qsort(l->r, n, sizeof *l->r, region_cmp);
  uint64_t slot = umbp_slot_size(pool);
  for (unsigned i = 0; i < n;) {
    struct dp_group *g = &l->g[l->ngroups++];
    g->group = l->r[i].group;
    g->first = i;
    g->cuda = l->r[i].device == UMBP_DP_CUDA;
    g->device_id = l->r[i].device_id;
    g->blocks = UINT32_MAX;
    for (; i < n && l->r[i].group == g->group; i++) {
      struct dp_region *r = &l->r[i];
      if ((r->device == UMBP_DP_CUDA) != g->cuda || r->device_id != g->device_id) {
        int gid = g->group;
        umbp_kv_layout_free(l);
        return umbp_fail(-EINVAL, "kv layout: group %d mixes devices (region %u); "
                         "one group's regions must all be on the CPU or all on one CUDA device", gid, i);
      }
      r->obj_off = g->obj_bytes;
      /* Saturating: a wrapped sum could pass the slot-size check below. */
      g->obj_bytes = r->block_bytes > UINT64_MAX - g->obj_bytes ? UINT64_MAX : g->obj_bytes + r->block_bytes;
      g->count++;
      if (r->block_count < g->blocks) g->blocks = r->block_count;
    }
    if (g->obj_bytes > slot) {
      int gid = g->group;
      unsigned long long ob = (unsigned long long)g->obj_bytes;
      umbp_kv_layout_free(l);
      return umbp_fail(-EINVAL, "kv layout: the block object of group %d is %llu bytes but the pool's "
                       "slot size is %llu bytes; create the pool with --slot-size >= %llu or split the group",
                       gid, ob, (unsigned long long)slot, ob);
    }
  }
  /* After the size checks (their messages say more). A host region that
   * overlaps the pool's own mapping would have loads write over other
   * blocks' slots: published data of every process. */
  for (unsigned i = 0; i < n; i++) {
    const umbp_kv_region *r = &regions[i];
    uintptr_t lo = (uintptr_t)r->base;
    uintptr_t hi = lo + (uintptr_t)((uint64_t)(r->block_count - 1) * r->stride + r->block_bytes);
    uintptr_t plo = (uintptr_t)pool->base, phi = plo + pool->size;
    if (r->device == UMBP_DP_CPU && pool->base && lo < phi && plo < hi) {
      umbp_kv_layout_free(l);
      return umbp_fail(-EINVAL, "kv layout: region %u [%p, +%llu) overlaps the mapping of pool '%s'; a KV cache "
                       "must be the caller's own memory, not pool slots", i, r->base,
                       (unsigned long long)(hi - lo), pool->name);
    }
  }
  *ret_layout = l;
  return 0;
}

void umbp_kv_layout_free(umbp_kv_layout *layout) {
  if (!layout) return;
  free(layout->r);
  free(layout->g);
  free(layout);
}

static const struct dp_group *layout_group(const umbp_kv_layout *l, uint16_t group) {
  if (!l) return NULL;
  for (unsigned i = 0; i < l->ngroups; i++)
    if (l->g[i].group == group) return &l->g[i];
  return NULL;
}

uint64_t umbp_kv_layout_object_bytes(const umbp_kv_layout *layout, uint16_t group) {
  const struct dp_group *g = layout_group(layout, group);
  return g ? g->obj_bytes : 0;
}

uint32_t umbp_kv_layout_blocks(const umbp_kv_layout *layout, uint16_t group) {
  const struct dp_group *g = layout_group(layout, group);
  return g ? g->blocks : 0;
}

uint64_t umbp_kv_layout_region_offset(const umbp_kv_layout *layout, unsigned i) {
  if (!layout || i >= layout->n) return UINT64_MAX;
  for (unsigned k = 0; k < layout->n; k++)
    if (layout->r[k].orig == i) return layout->r[k].obj_off;
  return UINT64_MAX;
}

/* ---- jobs ------------------------------------------------------------------ */

/* Job handles of this process not freed yet (umbp_dp_job_count): counted up
 * in job_new, down in job_free. Relaxed: a count for leak checks, ordering
 * nothing else. */
static _Atomic uint64_t dp_jobs_unfreed;

uint64_t umbp_dp_job_count(void) { return atomic_load_explicit(&dp_jobs_unfreed, memory_order_relaxed); }

static void job_free(struct umbp_dp_job *job) {
  /* A deferred store never published: its copied slots go back. Once the
   * pool handle is detached, the detach gave them back already and the
   * handle's memory is gone. */
  if (job->held && umbp_pool_attached(job->pool, job->pool_serial))
    for (unsigned i = 0; i < job->n; i++)
      if (job->slots[i] != UMBP_NO_SLOT) umbp_abort(job->pool, job->slots[i]);
  if (job->msg) {
    for (unsigned i = 0; i < job->n; i++) free(job->msg[i]);
    free(job->msg);
  }
  if (job->cuda) dp_cuda_job_free(job);
  free(job->blocks);
  free(job->src_blocks);
  free(job->keys);
  free(job->slots);
  free(job->rc);
  free(job->tasks);
  free(job);
  atomic_fetch_sub_explicit(&dp_jobs_unfreed, 1, memory_order_relaxed);
}

static void job_unref(struct umbp_dp_job *job) {
  /* acq_rel: the last dropper sees every write of the other holder. */
  if (atomic_fetch_sub_explicit(&job->refs, 1, memory_order_acq_rel) == 1) job_free(job);
}

void dp_job_fail_key(struct umbp_dp_job *job, unsigned i, int code, const char *msg) {
  if (job->rc[i] == 0) job->rc[i] = code;
  if (msg && *msg) {
    if (!job->msg) job->msg = calloc(job->n, sizeof *job->msg);
    if (job->msg && !job->msg[i]) job->msg[i] = strdup(msg);
  }
}

static void live_unlink(umbp_dp_engine *eng, struct umbp_dp_job *job) {
  if (job->prev_live) job->prev_live->next_live = job->next_live;
  else eng->live = job->next_live;
  if (job->next_live) job->next_live->prev_live = job->prev_live;
  job->next_live = job->prev_live = NULL;
}

/* After umbp_publish failed with code on `slot`: -EEXIST and -ENOSPC gave
 * the slot back already; any other failure (a namespace not registered, a
 * handle inherited through fork()) left it reserved by this process, and a
 * failed key's slot is aborted, never kept: abort it, or it stays reserved
 * (invisible, unusable) until this process detaches. */
static void publish_failed(umbp_pool *pool, uint32_t slot, int code) {
  if (code != 0 && code != -EEXIST && code != -ENOSPC) umbp_abort(pool, slot);
}

void dp_job_finish(struct umbp_dp_job *job) {
  umbp_dp_engine *eng = job->eng;
  umbp_pool *pool = eng->pool;
  if (job->op == DP_OP_STORE) {
    /* Publish the keys whose copy succeeded, in one bulk call. */
    unsigned np = 0;
    uint32_t *ps = malloc(job->n * sizeof *ps);
    umbp_key *pk = malloc(job->n * sizeof *pk);
    unsigned *pi = malloc(job->n * sizeof *pi);
    int *prc = malloc(job->n * sizeof *prc);
    for (unsigned i = 0; i < job->n; i++) {
      if (job->slots[i] == UMBP_NO_SLOT) continue;
      if (job->rc[i] != 0 || !ps || !pk || !pi || !prc) {
        if (job->rc[i] == 0) dp_job_fail_key(job, i, -ENOMEM, "out of memory while publishing");
        umbp_abort(pool, job->slots[i]); /* a failed key is never published */
        job->slots[i] = UMBP_NO_SLOT;
        continue;
      }
      ps[np] = job->slots[i];
      pk[np] = job->keys[i];
      pi[np] = i;
      np++;
    }
    if (np && job->defer_publish) {
      /* UMBP_DP_STORE_DEFER_PUBLISH: the copied slots stay reserved by this
       * process until umbp_dp_job_publish() or the job is freed (aborted). */
      job->held = true;
    } else if (np) {
      umbp_publish_bulk(pool, np, ps, pk, prc);
      for (unsigned k = 0; k < np; k++) {
        unsigned i = pi[k];
        if (prc[k] == -EEXIST) job->duplicates++; /* first writer won; the slot is free again */
        else if (prc[k] != 0) dp_job_fail_key(job, i, prc[k], "umbp_publish failed");
        publish_failed(pool, ps[k], prc[k]);
        job->slots[i] = UMBP_NO_SLOT;
      }
    }
    free(ps);
    free(pk);
    free(pi);
    free(prc);
  } else if (job->op == DP_OP_LOAD) {
    for (unsigned i = 0; i < job->n; i++)
      if (job->slots[i] != UMBP_NO_SLOT) {
        umbp_unpin(pool, job->slots[i]);
        job->slots[i] = UMBP_NO_SLOT;
      }
  }
  job->status = 0;
  for (unsigned i = 0; i < job->n; i++)
    if (job->rc[i]) {
      job->status = job->rc[i];
      break;
    }
  pthread_mutex_lock(&eng->mu);
  live_unlink(eng, job);
  /* Pairs with the acquire load in umbp_dp_job_poll/wait: results, region
   * bytes and slot states written above are visible to whoever sees DONE. */
  atomic_store_explicit(&job->state, DP_JOB_DONE, memory_order_release);
  pthread_cond_broadcast(&eng->done_cv);
  pthread_mutex_unlock(&eng->mu);
  job_unref(job); /* the engine's reference */
}

/* ---- host backend ---------------------------------------------------------- */

/* Copy n bytes with non-temporal stores where that pays: block bytes are
 * written once and read later by another process (store) or by the model
 * (load), so pulling the destination lines into this core's cache first
 * (read-for-ownership) only costs bandwidth. Small copies use memcpy. The
 * caller issues nt_fence() before anything that publishes the bytes: NT
 * stores are not ordered by a release store. */
#if defined(__x86_64__) && defined(__SSE2__)
#include <emmintrin.h>
#define NT_MIN 4096
static inline void copy_nt(char *dst, const char *src, size_t n) {
  if (n < NT_MIN) {
    memcpy(dst, src, n);
    return;
  }
  size_t head = (16 - ((uintptr_t)dst & 15)) & 15;
  memcpy(dst, src, head);
  dst += head;
  src += head;
  n -= head;
  size_t i = 0;
  for (; i + 64 <= n; i += 64) {
    __m128i a = _mm_loadu_si128((const __m128i *)(src + i));
    __m128i b = _mm_loadu_si128((const __m128i *)(src + i + 16));
    __m128i c = _mm_loadu_si128((const __m128i *)(src + i + 32));
    __m128i d = _mm_loadu_si128((const __m128i *)(src + i + 48));
    _mm_stream_si128((__m128i *)(dst + i), a);
    _mm_stream_si128((__m128i *)(dst + i + 16), b);
    _mm_stream_si128((__m128i *)(dst + i + 32), c);
    _mm_stream_si128((__m128i *)(dst + i + 48), d);
  }
  memcpy(dst + i, src + i, n - i);
}
static inline void nt_fence(void) { _mm_sfence(); }
#else
static inline void copy_nt(char *dst, const char *src, size_t n) { memcpy(dst, src, n); }
static inline void nt_fence(void) {}
#endif

static void host_copy(struct umbp_dp_job *job, unsigned i0, unsigned i1) {
  const umbp_kv_layout *l = job->lay;
  const struct dp_group *g = job->grp;
  umbp_pool *pool = job->eng->pool;
  unsigned delay = atomic_load_explicit(&job->eng->test_delay_us, memory_order_relaxed);
  for (unsigned i = i0; i < i1; i++) {
    if (job->rc[i] != 0 || job->slots[i] == UMBP_NO_SLOT) continue;
    if (delay) usleep(delay);
    char *slot = umbp_slot_ptr(pool, job->slots[i]);
    uint64_t b = job->blocks[i];
    const struct dp_region *r = &l->r[g->first], *end = r + g->count;
    if (job->op == DP_OP_STORE)
      for (; r < end; r++) copy_nt(slot + r->obj_off, r->base + b * r->stride, r->block_bytes);
    else
      for (; r < end; r++) copy_nt(r->base + b * r->stride, slot + r->obj_off, r->block_bytes);
  }
  nt_fence(); /* before the task is counted done and the slots are published */
}

/* A waiter with at least this much time left copies its own job's queued
 * tasks (umbp_dp_job_wait). */
#define DP_HELP_MIN_NS (1000ull * 1000 * 1000)
/* How long umbp_dp_job_wait sleeps at most between looks: a CUDA job is
 * polled (its events complete without a signal); a host job's last task
 * signals done_cv, and the bound only caps a wait that missed it. */
#define DP_CUDA_POLL_NS 50000ull      /* 50 us */
#define DP_HOST_WAIT_NS 20000000ull   /* 20 ms */
/* How often umbp_dp_engine_destroy looks again for copies still running. */
#define DP_DESTROY_POLL_NS 1000000ull /* 1 ms */

/* Run task t, taken off the FIFO by the caller under eng->mu, which it still
 * holds; returns with eng->mu released. The job's last task finishes it. */
static void host_run_task(umbp_dp_engine *eng, struct dp_task *t) {
  struct umbp_dp_job *job = t->job;
  if (atomic_load_explicit(&job->state, memory_order_relaxed) == DP_JOB_QUEUED)
    atomic_store_explicit(&job->state, DP_JOB_RUNNING, memory_order_relaxed); /* under mu: cancel sees it */
  pthread_mutex_unlock(&eng->mu);
  host_copy(job, t->i0, t->i1);
  /* acq_rel: the finaliser sees every other task's copies. */
  if (atomic_fetch_sub_explicit(&job->tasks_left, 1, memory_order_acq_rel) == 1) dp_job_finish(job);
}

/* Under eng->mu: unlink and return the first queued task of `job`, or NULL. */
static struct dp_task *take_task_of(umbp_dp_engine *eng, struct umbp_dp_job *job) {
  struct dp_task *prev = NULL;
  for (struct dp_task *t = eng->head; t; prev = t, t = t->next) {
    if (t->job != job) continue;
    if (prev) prev->next = t->next;
    else eng->head = t->next;
    if (eng->tail == t) eng->tail = prev;
    return t;
  }
  return NULL;
}

static void *host_worker(void *arg) {
  umbp_dp_engine *eng = arg;
  pthread_mutex_lock(&eng->mu);
  for (;;) {
    while (!eng->head && !eng->stopping) pthread_cond_wait(&eng->work_cv, &eng->mu);
    struct dp_task *t = eng->head;
    if (!t) break; /* stopping and nothing queued */
    eng->head = t->next;
    if (!eng->head) eng->tail = NULL;
    host_run_task(eng, t);
    pthread_mutex_lock(&eng->mu);
  }
  pthread_mutex_unlock(&eng->mu);
  return NULL;
}

void umbp_dp__test_set_delay(umbp_dp_engine *eng, unsigned us) {
  atomic_store_explicit(&eng->test_delay_us, us, memory_order_relaxed);
}

unsigned umbp_dp__test_live_jobs(umbp_dp_engine *eng) {
  unsigned n = 0;
  pthread_mutex_lock(&eng->mu);
  for (struct umbp_dp_job *j = eng->live; j; j = j->next_live) n++;
  pthread_mutex_unlock(&eng->mu);
  return n;
}

/* ---- engine ---------------------------------------------------------------- */

/* A fork() child's copy of an engine has none of its threads: its queued and
 * running copies happen in the parent (or never), and eng->mu may have been
 * held by a parent thread at the fork. -ECHILD before anything waits or
 * locks there. */
static int pid_forked_fail(pid_t pid) {
  if (pid == getpid()) return 0;
  return umbp_fail(-ECHILD, "dp: this engine was created by process %d and inherited through fork(): its copy "
                   "threads run only there; in the child, attach the pool and create an engine of its own",
                   (int)pid);
}
static int eng_forked_fail(const umbp_dp_engine *eng) { return pid_forked_fail(eng->pid); }

/* A thread in umbp_dp_job_wait/cancel locks eng->mu after it saw its job not
 * done; the job may end meanwhile and umbp_dp_engine_destroy (which waits
 * only for jobs) free the engine under it. So such a thread registers in
 * eng->users, under dp_users_mu, only while its job is not done, and destroy
 * frees the engine only once users is 0: every job is done by then, so no
 * thread registers anew, and each registered one leaves within one wait step
 * (DP_HOST_WAIT_NS). A process-wide lock, since the engine itself may be
 * gone when a thread comes to look; reset in a fork() child (atfork). */
static pthread_mutex_t dp_users_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t dp_users_cv = PTHREAD_COND_INITIALIZER;
static pthread_once_t dp_users_once = PTHREAD_ONCE_INIT;
static void dp_users_lock(void) { pthread_mutex_lock(&dp_users_mu); }
static void dp_users_unlock(void) { pthread_mutex_unlock(&dp_users_mu); }
static void dp_users_atfork(void) { pthread_atfork(dp_users_lock, dp_users_unlock, dp_users_unlock); }

/* Register the caller as a user of job's engine: true, or false when the job
 * is done (its engine may be freed already: touch nothing of it). */
static bool eng_enter(struct umbp_dp_job *job) {
  pthread_once(&dp_users_once, dp_users_atfork);
  dp_users_lock();
  /* acquire pairs with dp_job_finish's release store of DONE */
  bool live = atomic_load_explicit(&job->state, memory_order_acquire) != DP_JOB_DONE;
  if (live) job->eng->users++;
  dp_users_unlock();
  return live;
}

static void eng_leave(umbp_dp_engine *eng) {
  dp_users_lock();
  if (--eng->users == 0) pthread_cond_broadcast(&dp_users_cv);
  dp_users_unlock();
}

static _Atomic unsigned dp_test_wait_pause_us;
void umbp_dp__test_set_wait_pause(unsigned us) {
  atomic_store_explicit(&dp_test_wait_pause_us, us, memory_order_relaxed);
}

void umbp_dp_opts_init(umbp_dp_opts *o) {
  if (!o) return; /* nothing to fill; a void call cannot report it, so it must not crash */
  memset(o, 0, sizeof *o);
  o->threads = 2;
  o->cuda_streams = 2;
  o->cuda_register = true;
}

unsigned umbp_dp_backends(char *why, size_t why_len) {
  char buf[256];
  int r = dp_cuda_probe(buf, sizeof buf);
  if (why && why_len) snprintf(why, why_len, "%s", buf);
  return UMBP_DP_BACKEND_HOST | (r > 0 ? UMBP_DP_BACKEND_CUDA : 0);
}

int umbp_dp_engine_create(umbp_pool *pool, const umbp_dp_opts *opts, umbp_dp_engine **ret_engine) {
  umbp_dp_opts def;
  if (!opts) {
    umbp_dp_opts_init(&def);
    opts = &def;
  }
  if (!pool || !ret_engine) return umbp_fail(-EINVAL, "dp engine: pool and ret_engine are required");
  /* A fork() child's copy of a handle has no registry slot either; say so
   * rather than call it read-only. */
  if (pool->forked) return umbp_pool_forked_fail(pool);
  if (umbp_pool_proc_slot(pool) < 0)
    return umbp_fail(-EINVAL, "dp engine: the pool handle is read-only; attach read-write to copy blocks");
  if (opts->threads > DP_THREADS_MAX)
    return umbp_fail(-EINVAL, "dp engine: %u threads (at most %u)", opts->threads, DP_THREADS_MAX);
  if (opts->cpus && opts->n_cpus == 0) return umbp_fail(-EINVAL, "dp engine: cpus given with n_cpus 0");
  if (opts->cuda_copy < UMBP_DP_CUDA_COPY_AUTO || opts->cuda_copy > UMBP_DP_CUDA_COPY_KERNEL)
    return umbp_fail(-EINVAL, "dp engine: cuda_copy %d is not a mode (0 auto, 1 dma, 2 kernel)", opts->cuda_copy);
  if (opts->cuda_kernel_ctas > DP_KERNEL_CTAS_MAX)
    return umbp_fail(-EINVAL, "dp engine: cuda_kernel_ctas %u (at most %u; 0 for the default %u)",
                     opts->cuda_kernel_ctas, DP_KERNEL_CTAS_MAX, DP_KERNEL_CTAS_DEFAULT);
  for (unsigned i = 0; opts->cpus && i < opts->n_cpus; i++)
    if (opts->cpus[i] >= CPU_SETSIZE) return umbp_fail(-EINVAL, "dp engine: cpu %u out of range", opts->cpus[i]);
  umbp_dp_engine *eng = calloc(1, sizeof *eng);
  if (!eng) return umbp_fail(-ENOMEM, "dp engine: out of memory");
  eng->pool = pool;
  eng->pid = getpid();
  eng->nthreads = opts->threads ? opts->threads : DP_THREADS_DEFAULT;
  pthread_mutex_init(&eng->mu, NULL);
  pthread_cond_init(&eng->work_cv, NULL);
  pthread_cond_init(&eng->done_cv, NULL);
  eng->threads = calloc(eng->nthreads, sizeof *eng->threads);
  if (!eng->threads) {
    free(eng);
    return umbp_fail(-ENOMEM, "dp engine: out of memory");
  }
  int rc = 0;
  unsigned started = 0;
  for (; started < eng->nthreads; started++) {
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    if (opts->cpus) {
      cpu_set_t set;
      CPU_ZERO(&set);
      CPU_SET(opts->cpus[started % opts->n_cpus], &set);
      pthread_attr_setaffinity_np(&attr, sizeof set, &set);
    }
    int e = pthread_create(&eng->threads[started], &attr, host_worker, eng);
    pthread_attr_destroy(&attr);
    if (e) {
      rc = e == EINVAL && opts->cpus
               ? umbp_fail(-EINVAL, "dp engine: cannot bind copy thread %u to cpu %u (not in this "
                           "process's allowed CPUs?)", started, opts->cpus[started % opts->n_cpus])
               : umbp_fail(-EAGAIN, "dp engine: pthread_create: %s", strerror(e));
      break;
    }
  }
  if (!rc) {
    rc = dp_cuda_engine_init(eng, opts);
    if (rc == -ENODEV || rc == -ENOSYS) rc = 0; /* host-only engine; CUDA jobs say why */
  }
  if (rc) {
    pthread_mutex_lock(&eng->mu);
    eng->stopping = true;
    pthread_cond_broadcast(&eng->work_cv);
    pthread_mutex_unlock(&eng->mu);
    for (unsigned i = 0; i < started; i++) pthread_join(eng->threads[i], NULL);
    pthread_mutex_destroy(&eng->mu);
    pthread_cond_destroy(&eng->work_cv);
    pthread_cond_destroy(&eng->done_cv);
    free(eng->threads);
    free(eng);
    return rc;
  }
  *ret_engine = eng;
  return 0;
}

/* Finalise released (or not yet polled) CUDA jobs whose copies completed. */
static void sweep_cuda(umbp_dp_engine *eng) {
  for (;;) {
    struct umbp_dp_job *found = NULL;
    pthread_mutex_lock(&eng->mu);
    for (struct umbp_dp_job *j = eng->live; j; j = j->next_live)
      if (j->grp->cuda && !atomic_load_explicit(&j->finalizing, memory_order_relaxed) && dp_cuda_progress(j)) {
        bool f = false;
        if (atomic_compare_exchange_strong(&j->finalizing, &f, true)) {
          found = j;
          break;
        }
      }
    pthread_mutex_unlock(&eng->mu);
    if (!found) return;
    dp_job_finish(found);
  }
}

void umbp_dp_engine_destroy(umbp_dp_engine *eng) {
  if (!eng) return;
  /* A fork() child's copy: no thread to wait for or join, and its jobs may
   * still be polled, so it is left allocated (the parent's engine runs on). */
  if (eng->pid != getpid()) return;
  /* Cancel whatever is still queued; running jobs end normally. */
  for (;;) {
    struct umbp_dp_job *q = NULL;
    pthread_mutex_lock(&eng->mu);
    eng->stopping = true;
    for (struct umbp_dp_job *j = eng->live; j; j = j->next_live)
      if (!j->grp->cuda && atomic_load_explicit(&j->state, memory_order_relaxed) == DP_JOB_QUEUED) {
        q = j;
        atomic_fetch_add_explicit(&q->refs, 1, memory_order_relaxed);
        break;
      }
    pthread_mutex_unlock(&eng->mu);
    if (!q) break;
    umbp_dp_job_cancel(q);
    job_unref(q);
  }
  /* Wait for every copy to stop. */
  for (;;) {
    sweep_cuda(eng);
    pthread_mutex_lock(&eng->mu);
    bool empty = eng->live == NULL;
    if (!empty) {
      struct timespec ts;
      clock_gettime(CLOCK_REALTIME, &ts);
      ts.tv_nsec += (long)DP_DESTROY_POLL_NS;
      if (ts.tv_nsec >= 1000000000) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000;
      }
      pthread_cond_timedwait(&eng->done_cv, &eng->mu, &ts);
    }
    pthread_mutex_unlock(&eng->mu);
    if (empty) break;
  }
  pthread_mutex_lock(&eng->mu);
  pthread_cond_broadcast(&eng->work_cv);
  pthread_mutex_unlock(&eng->mu);
  for (unsigned i = 0; i < eng->nthreads; i++) pthread_join(eng->threads[i], NULL);
  /* Threads still in wait/cancel of a (now done) job leave within a wait step. */
  pthread_once(&dp_users_once, dp_users_atfork);
  dp_users_lock();
  while (eng->users) pthread_cond_wait(&dp_users_cv, &dp_users_mu);
  dp_users_unlock();
  dp_cuda_engine_fini(eng);
  pthread_mutex_destroy(&eng->mu);
  pthread_cond_destroy(&eng->work_cv);
  pthread_cond_destroy(&eng->done_cv);
  free(eng->threads);
  free(eng);
}

int umbp_dp_cuda_registration(umbp_dp_engine *eng, uint64_t *ret_done, uint64_t *ret_total) {
  if (!eng) return umbp_fail(-EINVAL, "dp: engine is NULL");
  return dp_cuda_registration(eng, ret_done, ret_total);
}

/* ---- submission ------------------------------------------------------------ */

static int job_new(umbp_dp_engine *eng, const umbp_kv_layout *lay, uint16_t group, int op, unsigned n,
                   const uint32_t *blocks, struct umbp_dp_job **ret) {
  if (!eng || !lay || n == 0 || !blocks || !ret)
    return umbp_fail(-EINVAL, "dp: engine, layout, n > 0, block ids and ret_job are required");
  if (lay->pool != eng->pool) return umbp_fail(-EINVAL, "dp: the layout was made for another pool handle");
  int frc = eng_forked_fail(eng);
  if (frc) return frc;
  const struct dp_group *g = layout_group(lay, group);
  if (!g) return umbp_fail(-EINVAL, "dp: the layout has no group %u", group);
  for (unsigned i = 0; i < n; i++)
    if (blocks[i] >= g->blocks)
      return umbp_fail(-EINVAL, "dp: block id %u (key %u) out of range: group %u has %u blocks", blocks[i], i,
                       group, g->blocks);
  if (g->cuda) {
    char why[256];
    int r = dp_cuda_probe(why, sizeof why);
    if (r < 0) return umbp_fail(r, "dp: group %u is on cuda:%d but %s", group, g->device_id, why);
    if (!eng->cuda) return umbp_fail(-ENODEV, "dp: group %u is on cuda:%d but this engine has no CUDA backend",
                                     group, g->device_id);
  }
  struct umbp_dp_job *job = calloc(1, sizeof *job);
  if (!job) return umbp_fail(-ENOMEM, "dp: out of memory");
  atomic_fetch_add_explicit(&dp_jobs_unfreed, 1, memory_order_relaxed); /* job_free counts it down */
  job->eng = eng;
  job->pid = eng->pid;
  job->lay = lay;
  job->grp = g;
  job->op = op;
  job->n = n;
  job->blocks = malloc(n * sizeof *job->blocks);
  job->slots = malloc(n * sizeof *job->slots);
  job->rc = calloc(n, sizeof *job->rc);
  if (!job->blocks || !job->slots || !job->rc) {
    job_free(job);
    return umbp_fail(-ENOMEM, "dp: out of memory");
  }
  memcpy(job->blocks, blocks, n * sizeof *blocks);
  for (unsigned i = 0; i < n; i++) job->slots[i] = UMBP_NO_SLOT;
  atomic_init(&job->state, DP_JOB_QUEUED);
  atomic_init(&job->refs, 2);
  *ret = job;
  return 0;
}

static bool key_needs_copy(const struct umbp_dp_job *job, unsigned i) {
  return job->rc[i] == 0 && (job->op == DP_OP_PULL || job->slots[i] != UMBP_NO_SLOT);
}

/* Queue a prepared job: host tasks, or CUDA copies. On failure (engine
 * stopping) the job is untouched and still the caller's to free. */
static int job_start(struct umbp_dp_job *job) {
  umbp_dp_engine *eng = job->eng;
  unsigned todo = 0;
  for (unsigned i = 0; i < job->n; i++) todo += key_needs_copy(job, i);
  unsigned nt = 0;
  if (todo && !job->grp->cuda) {
    nt = eng->nthreads < todo ? eng->nthreads : todo;
    job->tasks = calloc(nt, sizeof *job->tasks);
    if (!job->tasks) return umbp_fail(-ENOMEM, "dp: out of memory");
    /* Split the keys that need a copy evenly over nt contiguous ranges. */
    unsigned t = 0, seen = 0;
    job->tasks[0].i0 = 0;
    for (unsigned i = 0; i < job->n; i++) {
      if (!key_needs_copy(job, i)) continue;
      seen++;
      /* task t ends after ceil-share of the remaining keys */
      unsigned share = (todo * (t + 1) + nt - 1) / nt;
      if (seen >= share || seen == todo) {
        job->tasks[t].i1 = seen == todo ? job->n : i + 1;
        job->tasks[t].job = job;
        t++;
        if (t < nt) job->tasks[t].i0 = i + 1;
      }
    }
    job->ntasks = t;
    atomic_store_explicit(&job->tasks_left, t, memory_order_relaxed);
  }
  if (job->grp->cuda) sweep_cuda(eng);
  pthread_mutex_lock(&eng->mu);
  if (eng->stopping) {
    pthread_mutex_unlock(&eng->mu);
    return umbp_fail(-ESHUTDOWN, "dp: the engine is being destroyed");
  }
  job->next_live = eng->live;
  if (eng->live) eng->live->prev_live = job;
  eng->live = job;
  if (nt) {
    for (unsigned i = 0; i < job->ntasks; i++) {
      struct dp_task *tk = &job->tasks[i];
      tk->next = NULL;
      if (eng->tail) eng->tail->next = tk;
      else eng->head = tk;
      eng->tail = tk;
    }
    pthread_cond_broadcast(&eng->work_cv);
  }
  pthread_mutex_unlock(&eng->mu);
  if (todo == 0) { /* nothing to copy: finish now (aborts nothing, unpins what it pinned) */
    dp_job_finish(job);
  } else if (job->grp->cuda) {
    atomic_store_explicit(&job->state, DP_JOB_RUNNING, memory_order_relaxed);
    dp_cuda_submit(job); /* failures become per-key results; progress then reports done */
  }
  return 0;
}

/* job_new() plus a private copy of the keys (stores and loads both need one). */
static int job_new_keyed(umbp_dp_engine *eng, const umbp_kv_layout *lay, uint16_t group, int op, unsigned n,
                         const uint32_t *block_ids, const umbp_key *keys, struct umbp_dp_job **ret) {
  struct umbp_dp_job *job;
  int rc = job_new(eng, lay, group, op, n, block_ids, &job);
  if (rc) return rc;
  job->keys = malloc(n * sizeof *keys);
  if (!job->keys) {
    job_free(job);
    return umbp_fail(-ENOMEM, "dp: out of memory");
  }
  memcpy(job->keys, keys, n * sizeof *keys);
  *ret = job;
  return 0;
}

int umbp_dp_store(umbp_dp_engine *eng, const umbp_kv_layout *layout, uint16_t group, int part, unsigned n,
                  const uint32_t *block_ids, const umbp_key *keys, unsigned flags, umbp_dp_job **ret_job) {
  /* ret_job first: job_new() checks only its own out pointer, and a job
   * submitted with nowhere to return it could never be released. */
  if (!keys || !ret_job) return umbp_fail(-EINVAL, "dp store: keys and ret_job are required");
  if (flags & ~(unsigned)(UMBP_DP_STORE_SKIP_PRESENT | UMBP_DP_STORE_DEFER_PUBLISH))
    return umbp_fail(-EINVAL, "dp store: unknown flags 0x%x", flags);
  /* Refuse bad keys here, as umbp_dp_load does: otherwise they would be
   * copied and then fail at publish in a copy thread, whose message the
   * caller never sees. */
  for (unsigned i = 0; eng && layout && block_ids && i < n; i++)
    if (keys[i].hash_len < 1 || keys[i].hash_len > UMBP_KEY_HASH_MAX)
      return umbp_fail(-EINVAL, "dp store: key %u has hash_len %u; a key's hash is 1 to %d bytes "
                       "(set umbp_key.hash_len to the bytes of hash used)", i, keys[i].hash_len, UMBP_KEY_HASH_MAX);
  struct umbp_dp_job *job = NULL; /* set by job_new_keyed() when it returns 0 */
  int rc = job_new_keyed(eng, layout, group, DP_OP_STORE, n, block_ids, keys, &job);
  if (rc) return rc;
  umbp_pool *pool = eng->pool;
  job->defer_publish = (flags & UMBP_DP_STORE_DEFER_PUBLISH) != 0;
  job->pool = pool;
  job->pool_serial = pool->attach_serial;
  if (flags & UMBP_DP_STORE_SKIP_PRESENT) {
    uint8_t *present = calloc(n, 1);
    if (present && umbp_contains_bulk(pool, n, keys, present) > 0)
      for (unsigned i = 0; i < n; i++)
        if (present[i]) {
          job->rc[i] = 1; /* marker: skip; reset to 0 below */
          job->duplicates++;
        }
    free(present);
  }
  /* Reserve per run of equal namespaces (quotas are per namespace). */
  uint32_t *tmp = malloc(n * sizeof *tmp);
  if (!tmp) {
    job_free(job);
    return umbp_fail(-ENOMEM, "dp: out of memory");
  }
  for (unsigned i = 0; i < n;) {
    if (job->rc[i]) {
      i++;
      continue;
    }
    unsigned j = i, want = 0;
    while (j < n && keys[j].ns == keys[i].ns) want += job->rc[j++] == 0;
    int got = umbp_reserve_bulk(pool, part, keys[i].ns, want, tmp);
    if (got < 0 && got != -ENOSPC) {
      for (unsigned k = 0; k < n; k++)
        if (job->slots[k] != UMBP_NO_SLOT) umbp_abort(pool, job->slots[k]);
      free(tmp);
      job_free(job);
      return got;
    }
    unsigned used = 0;
    for (unsigned k = i; k < j; k++) {
      if (job->rc[k]) continue;
      if (got > 0 && used < (unsigned)got) job->slots[k] = tmp[used++];
      else {
        char m[128];
        snprintf(m, sizeof m, "no free slot on partition %d for block %u (pool full of pinned blocks?)",
                 part, job->blocks[k]);
        dp_job_fail_key(job, k, -ENOSPC, m);
      }
    }
    i = j;
  }
  free(tmp);
  /* Skipped (present) keys: result 0 and no slot, so nothing copies or publishes them. */
  for (unsigned i = 0; i < n; i++)
    if (job->rc[i] == 1) job->rc[i] = 0, job->slots[i] = UMBP_NO_SLOT;
  rc = job_start(job);
  if (rc) {
    for (unsigned k = 0; k < n; k++)
      if (job->slots[k] != UMBP_NO_SLOT) umbp_abort(pool, job->slots[k]);
    job_free(job);
    return rc;
  }
  *ret_job = job;
  return 0;
}

int umbp_dp_load(umbp_dp_engine *eng, const umbp_kv_layout *layout, uint16_t group, unsigned n,
                 const umbp_key *keys, const uint32_t *block_ids, umbp_dp_job **ret_job) {
  if (!keys || !ret_job) return umbp_fail(-EINVAL, "dp load: keys and ret_job are required");
  struct umbp_dp_job *job = NULL; /* set by job_new_keyed() when it returns 0 */
  int rc = job_new_keyed(eng, layout, group, DP_OP_LOAD, n, block_ids, keys, &job);
  if (rc) return rc;
  int hits = umbp_lookup_pin_bulk(eng->pool, n, keys, job->slots);
  if (hits < 0) {
    job_free(job);
    return hits;
  }
  for (unsigned i = 0; i < n; i++)
    if (job->slots[i] == UMBP_NO_SLOT) {
      char m[96];
      snprintf(m, sizeof m, "key %u not in the pool; block %u not loaded", i, job->blocks[i]);
      dp_job_fail_key(job, i, -ENOENT, m);
    }
  rc = job_start(job);
  if (rc) {
    for (unsigned i = 0; i < n; i++)
      if (job->slots[i] != UMBP_NO_SLOT) umbp_unpin(eng->pool, job->slots[i]);
    job_free(job);
    return rc;
  }
  *ret_job = job;
  return 0;
}

int umbp_dp_ipc_pull(umbp_dp_engine *eng, const umbp_kv_layout *layout, uint16_t group, unsigned src_rank,
                     unsigned n, const uint32_t *src_blocks, const uint32_t *dst_blocks, umbp_dp_job **ret_job) {
  if (!src_blocks || !ret_job) return umbp_fail(-EINVAL, "dp pull: src_blocks and ret_job are required");
  const struct dp_group *g = layout_group(layout, group);
  if (g && !g->cuda) return umbp_fail(-EINVAL, "dp pull: group %u of the local layout is not on a CUDA device", group);
  struct umbp_dp_job *job;
  int rc = job_new(eng, layout, group, DP_OP_PULL, n, dst_blocks, &job);
  if (rc) return rc;
  job->src_blocks = malloc(n * sizeof *src_blocks);
  if (!job->src_blocks) {
    job_free(job);
    return umbp_fail(-ENOMEM, "dp: out of memory");
  }
  memcpy(job->src_blocks, src_blocks, n * sizeof *src_blocks);
  job->src_rank = src_rank; /* resolved by dp_cuda_submit */
  rc = job_start(job);
  if (rc) {
    job_free(job);
    return rc;
  }
  *ret_job = job;
  return 0;
}

/* ---- job API --------------------------------------------------------------- */

int umbp_dp_job_poll(umbp_dp_job *job) {
  if (!job) return umbp_fail(-EINVAL, "dp: job is NULL");
  if (atomic_load_explicit(&job->state, memory_order_acquire) == DP_JOB_DONE) return 0;
  if (job->grp->cuda && dp_cuda_progress(job)) {
    bool f = false;
    if (atomic_compare_exchange_strong(&job->finalizing, &f, true)) dp_job_finish(job);
  }
  return atomic_load_explicit(&job->state, memory_order_acquire) == DP_JOB_DONE ? 0 : -EINPROGRESS;
}

int umbp_dp_job_wait(umbp_dp_job *job, uint32_t timeout_ms) {
  if (!job) return umbp_fail(-EINVAL, "dp: job is NULL");
  if (umbp_dp_job_poll(job) == 0) return 0;
  /* job->pid, not the engine's: the job may end and its engine be freed now */
  int frc = pid_forked_fail(job->pid); /* nothing in this process would finish it */
  if (frc) return frc;
  uint64_t deadline = timeout_ms == UINT32_MAX ? UINT64_MAX : umbp_now_ns() + (uint64_t)timeout_ms * 1000000u;
  umbp_dp_engine *eng = job->eng;
  if (!eng_enter(job)) return 0; /* done meanwhile */
  /* From here eng stays allocated until eng_leave (destroy waits for it). */
  for (;;) {
    int rc = umbp_dp_job_poll(job) == 0 ? 0 : -EINPROGRESS;
    uint64_t now = umbp_now_ns();
    if (rc == -EINPROGRESS && now >= deadline) rc = -ETIMEDOUT;
    if (rc != -EINPROGRESS) {
      eng_leave(eng);
      return rc;
    }
    uint64_t step = job->grp->cuda ? DP_CUDA_POLL_NS : DP_HOST_WAIT_NS;
    if (deadline - now < step) step = deadline - now;
    unsigned pause = atomic_load_explicit(&dp_test_wait_pause_us, memory_order_relaxed);
    if (pause) usleep(pause);
    pthread_mutex_lock(&eng->mu);
    if (!job->grp->cuda && deadline - now >= DP_HELP_MIN_NS) {
      /* The waiter copies its job's tasks that no copy thread has taken yet:
       * it would only sleep otherwise, and on a machine whose cores are busy
       * (an engine's compute threads spin between steps) a copy thread may
       * get a core only several milliseconds after it is woken. Only with
       * DP_HELP_MIN_NS left: a task's copy is not interruptible. */
      struct dp_task *t = take_task_of(eng, job);
      if (t) {
        host_run_task(eng, t); /* releases mu */
        continue;
      }
    }
    if (atomic_load_explicit(&job->state, memory_order_relaxed) != DP_JOB_DONE) {
      struct timespec ts;
      clock_gettime(CLOCK_REALTIME, &ts);
      uint64_t ns = (uint64_t)ts.tv_nsec + step;
      ts.tv_sec += (time_t)(ns / 1000000000u);
      ts.tv_nsec = (long)(ns % 1000000000u);
      pthread_cond_timedwait(&eng->done_cv, &eng->mu, &ts);
    }
    pthread_mutex_unlock(&eng->mu);
  }
}

int umbp_dp_job_cancel(umbp_dp_job *job) {
  if (!job) return umbp_fail(-EINVAL, "dp: job is NULL");
  umbp_dp_engine *eng = job->eng;
  if (atomic_load_explicit(&job->state, memory_order_acquire) == DP_JOB_DONE) return -EALREADY;
  int frc = pid_forked_fail(job->pid); /* job->pid: the engine may be freed by now */
  if (frc) return frc;
  if (!eng_enter(job)) return -EALREADY; /* done meanwhile; else eng stays until eng_leave */
  pthread_mutex_lock(&eng->mu);
  int st = atomic_load_explicit(&job->state, memory_order_relaxed);
  if (st != DP_JOB_QUEUED || job->grp->cuda) {
    pthread_mutex_unlock(&eng->mu);
    eng_leave(eng);
    return st == DP_JOB_DONE ? -EALREADY : -EBUSY;
  }
  /* Unlink the job's tasks from the FIFO: no worker can start it now. */
  struct dp_task **pp = &eng->head, *last = NULL;
  while (*pp) {
    if ((*pp)->job == job) *pp = (*pp)->next;
    else {
      last = *pp;
      pp = &(*pp)->next;
    }
  }
  eng->tail = last;
  atomic_store_explicit(&job->state, DP_JOB_RUNNING, memory_order_relaxed); /* a second cancel gets -EBUSY */
  pthread_mutex_unlock(&eng->mu);
  for (unsigned i = 0; i < job->n; i++)
    if (job->rc[i] == 0) dp_job_fail_key(job, i, -ECANCELED, "job cancelled before its copies started");
  dp_job_finish(job); /* aborts reserved slots, drops pins */
  eng_leave(eng);
  return 0;
}

static bool job_done(const umbp_dp_job *job) {
  return job && atomic_load_explicit(&((umbp_dp_job *)job)->state, memory_order_acquire) == DP_JOB_DONE;
}

int umbp_dp_job_status(const umbp_dp_job *job) {
  if (!job) return -EINVAL;
  return job_done(job) ? job->status : -EINPROGRESS;
}

int umbp_dp_job_results(const umbp_dp_job *job, int *rc, unsigned n) {
  if (!job) return -EINVAL;
  if (!job_done(job)) return -EINPROGRESS;
  int failed = 0;
  for (unsigned i = 0; i < job->n; i++) {
    if (rc && i < n) rc[i] = job->rc[i];
    failed += job->rc[i] != 0;
  }
  return failed;
}

const char *umbp_dp_job_message(const umbp_dp_job *job, unsigned i) {
  if (!job_done(job) || i >= job->n || !job->msg || !job->msg[i]) return "";
  return job->msg[i];
}

int umbp_dp_job_failed_blocks(const umbp_dp_job *job, uint32_t *out, unsigned max) {
  if (!job) return -EINVAL;
  if (!job_done(job)) return -EINPROGRESS;
  unsigned c = 0;
  for (unsigned i = 0; i < job->n; i++)
    if (job->rc[i]) {
      if (out && c < max) out[c] = job->blocks[i];
      c++;
    }
  return (int)c;
}

unsigned umbp_dp_job_duplicates(const umbp_dp_job *job) {
  return job_done(job) ? job->duplicates : 0;
}

int umbp_dp_job_publish(umbp_dp_job *job, int *rc, unsigned n) {
  if (!job) return umbp_fail(-EINVAL, "dp publish: job is NULL");
  if (job->op != DP_OP_STORE || !job->defer_publish)
    return umbp_fail(-EINVAL, "dp publish: not a store submitted with UMBP_DP_STORE_DEFER_PUBLISH");
  if (!job_done(job)) return -EINPROGRESS;
  /* The handle the job reserved through was detached: its memory is gone (a
   * later attach may even sit at its address and own these slots again,
   * reserved for other bytes), and the detach gave the held slots back. */
  if (job->held && !umbp_pool_attached(job->pool, job->pool_serial)) {
    job->held = false;
    return umbp_fail(-EINVAL, "dp publish: the pool handle of this store was detached; its copied slots were "
                     "given back by umbp_pool_detach() and nothing is published");
  }
  /* Only the caller touches slots[] after DONE (acquire above pairs with
   * dp_job_finish's release store): no lock needed. */
  unsigned np = 0, failed = 0;
  uint32_t *ps = malloc(job->n * sizeof *ps);
  umbp_key *pk = malloc(job->n * sizeof *pk);
  unsigned *pi = malloc(job->n * sizeof *pi);
  int *prc = malloc(job->n * sizeof *prc);
  if (!ps || !pk || !pi || !prc) {
    free(ps), free(pk), free(pi), free(prc);
    return umbp_fail(-ENOMEM, "dp publish: out of memory");
  }
  for (unsigned i = 0; i < job->n; i++)
    if (job->held && job->slots[i] != UMBP_NO_SLOT) {
      ps[np] = job->slots[i];
      pk[np] = job->keys[i];
      pi[np++] = i;
    }
  if (np) umbp_publish_bulk(job->pool, np, ps, pk, prc);
  for (unsigned k = 0; k < np; k++) {
    unsigned i = pi[k];
    job->slots[i] = UMBP_NO_SLOT; /* published, or given back by publish on -EEXIST */
    if (prc[k] == -EEXIST) job->duplicates++; /* first writer won: success */
    else if (prc[k] != 0) dp_job_fail_key(job, i, prc[k], "umbp_publish failed");
    publish_failed(job->pool, ps[k], prc[k]);
  }
  job->held = false;
  for (unsigned i = 0; i < job->n; i++) {
    if (rc && i < n) rc[i] = job->rc[i];
    failed += job->rc[i] != 0;
  }
  free(ps), free(pk), free(pi), free(prc);
  return (int)failed;
}

void umbp_dp_job_release(umbp_dp_job *job) {
  if (job) job_unref(job);
}

/* ---- IPC ------------------------------------------------------------------- */

int umbp_dp_ipc_export(umbp_dp_engine *eng, const umbp_kv_layout *layout, unsigned rank) {
  if (!eng || !layout || rank > 65535) return umbp_fail(-EINVAL, "dp ipc export: engine, layout and rank <= 65535");
  if (layout->pool != eng->pool) return umbp_fail(-EINVAL, "dp ipc export: the layout was made for another pool");
  return dp_cuda_ipc_export(eng, layout, rank);
}

int umbp_dp_ipc_withdraw(umbp_dp_engine *eng, unsigned rank) {
  if (!eng) return umbp_fail(-EINVAL, "dp ipc withdraw: engine is NULL");
  return dp_ipc_withdraw(eng->pool, rank);
}
