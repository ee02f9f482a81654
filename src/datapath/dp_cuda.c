/* SPDX-License-Identifier: Apache-2.0 */
/*
 * dp_cuda.c — the CUDA backend: pool registration, batched copies on
 * dedicated streams, completion through events, CUDA IPC export and pull.
 *
 * Design note.
 *
 * Registration. cudaHostRegister of a large mapping takes seconds per
 * hundred GiB (the driver pins every page), so it runs once per process and
 * mapping in a background thread, in chunks of at most 64 GiB (the driver's
 * per-call limit on some platforms), reporting progress after each chunk.
 * Registrations are kept in a process-wide list keyed by mapping address and
 * counted by engines; the last engine's destroy unregisters the chunks.
 * Copies issued before registration finished are correct, just slower
 * (pageable memory is staged by the driver).
 *
 * Copies. A job's keys are split into one contiguous chunk per stream of the
 * group's device (streams are created per device on first use, non-blocking,
 * shared by the engine's jobs round-robin). A chunk goes to the copy kernel
 * (dp_kernel.cu) when the engine's mode picks it (auto: loads and IPC pulls
 * whose ranges average under UMBP_DP_KERNEL_AUTO_MAX) and the kernel can run:
 * for a store or load, the pool's
 * registration finished (the kernel reads and writes slots through the
 * mapping, which must be registered for the whole time the kernel may touch
 * it: the engine holds the registration until its streams are idle), the
 * device addresses registered memory at its host address
 * (cudaDevAttrCanUseHostPointerForRegisteredMem), and this build has code for
 * the device. Its (block, slot address) list travels in the launch
 * parameters, DP_KC_MAX_BLK blocks x DP_KC_MAX_REG regions per launch.
 * Otherwise a chunk's (dst, src, size)
 * triples — one per region per block — go to the device in one
 * cudaMemcpyBatchAsync call where the runtime has it (CUDA >= 12.8; the
 * signature lost its failIdx argument in 13.0), else one cudaMemcpyAsync per
 * range; an event recorded after them completes the chunk. Progress queries
 * the events (cudaEventQuery never blocks); an error of the issue or of the
 * event becomes -EIO for the chunk's keys with cudaGetErrorString as the
 * message. A chunk whose issue failed records no event and is done at once;
 * copies already queued before the failure finish before later work in the
 * same stream, and the job is only finalised once every recorded event
 * completed, so slots are never released under a running copy.
 *
 * IPC. Export takes cudaIpcGetMemHandle of every CUDA region and writes them
 * to the export table (dp_ipc.c) with the region's offset inside its
 * allocation (cuMemGetAddressRange, reached through the runtime's
 * cudaGetDriverEntryPointByVersion, so the library does not link libcuda):
 * a KV tensor is usually a slice of a larger allocation (the framework's
 * caching allocator, K and V halves of one tensor). A pull finds the source
 * rank's live entries, opens them through the per-engine cache
 * (cudaIpcOpenMemHandle with lazy peer access) and copies device to device,
 * through the copy kernel or the copy engines (cudaMemcpyDefault) as for a
 * load.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>
#include <cudaTypedefs.h> /* PFN_cuMemGetAddressRange; no link to libcuda */

#include "datapath/dp_internal.h"
#include "datapath/dp_kernel.h"
#include "shm/pool_internal.h"

#define REG_CHUNK (64ull << 30)
#define MAX_DEV 64

/* ---- probe ----------------------------------------------------------------- */
static pthread_once_t probe_once = PTHREAD_ONCE_INIT;
static int probe_rc;
static char probe_why[256];

static void probe_run(void) {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    snprintf(probe_why, sizeof probe_why, "the CUDA backend is unusable: cudaGetDeviceCount: %s",
             cudaGetErrorString(e));
    probe_rc = -ENODEV;
  } else if (n == 0) {
    snprintf(probe_why, sizeof probe_why, "the CUDA backend is unusable: no CUDA device");
    probe_rc = -ENODEV;
  } else {
    snprintf(probe_why, sizeof probe_why, "CUDA backend: %d device%s (runtime %d)", n, n > 1 ? "s" : "",
             CUDART_VERSION);
    probe_rc = n;
  }
}

int dp_cuda_probe(char *why, size_t n) {
  pthread_once(&probe_once, probe_run);
  if (why && n) snprintf(why, n, "%s", probe_why);
  return probe_rc;
}

/* ---- driver entry points ----------------------------------------------------
 * Reached through cudaGetDriverEntryPointByVersion so that libumbp does not
 * link libcuda. */
static PFN_cuMemGetAddressRange_v3020 get_range_fn;
static PFN_cuCtxGetCurrent_v4000 ctx_get_fn;
static PFN_cuCtxSetCurrent_v4000 ctx_set_fn;
static cudaError_t get_range_err;
static pthread_once_t drv_once = PTHREAD_ONCE_INIT;

static void *drv_sym(const char *name, unsigned version, cudaError_t *ret_err) {
  enum cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
  void *fn = NULL;
  cudaError_t e = cudaGetDriverEntryPointByVersion(name, &fn, version, cudaEnableDefault, &q);
  if (e == cudaSuccess && (q != cudaDriverEntryPointSuccess || !fn)) e = cudaErrorSymbolNotFound;
  if (ret_err) *ret_err = e;
  return e == cudaSuccess ? fn : NULL;
}

static void drv_init(void) {
  get_range_fn = (PFN_cuMemGetAddressRange_v3020)drv_sym("cuMemGetAddressRange", 3020, &get_range_err);
  ctx_get_fn = (PFN_cuCtxGetCurrent_v4000)drv_sym("cuCtxGetCurrent", 4000, NULL);
  ctx_set_fn = (PFN_cuCtxSetCurrent_v4000)drv_sym("cuCtxSetCurrent", 4000, NULL);
}

/* The calling thread's current context (NULL: none), saved around calls
 * that select a layout's device, and put back afterwards: a caller (a
 * framework that selected its rank's GPU) keeps its device, and a thread that
 * had no context is not left with one. cudaSetDevice back to the old ordinal
 * would instead create a context on device 0 in threads that never used
 * CUDA (CUDA >= 12 initialises the primary context in cudaSetDevice). */
static void *ctx_save(void) {
  pthread_once(&drv_once, drv_init);
  CUcontext ctx = NULL;
  if (!ctx_get_fn || ctx_get_fn(&ctx) != CUDA_SUCCESS) return NULL;
  return ctx;
}

static void ctx_restore(void *ctx) {
  if (ctx_set_fn) ctx_set_fn((CUcontext)ctx);
}

/* ---- registration ---------------------------------------------------------- */
struct reg {
  struct reg *next;
  void *base;
  uint64_t size;
  unsigned refs;
  pthread_t th;
  bool started;
  _Atomic uint64_t done;  /* bytes registered; release after each chunk */
  _Atomic int state;      /* 1 running, 0 done, < 0 error */
  unsigned chunks_ok;
  int dev; /* the creating thread's device: registering creates no context elsewhere */
  char err[256];
  umbp_progress_fn progress;
  void *progress_arg;
};
static pthread_mutex_t reg_mu = PTHREAD_MUTEX_INITIALIZER;
static struct reg *regs;

static void *reg_thread(void *arg) {
  struct reg *r = arg;
  cudaSetDevice(r->dev);
  for (uint64_t off = 0; off < r->size; off += REG_CHUNK) {
    uint64_t len = r->size - off < REG_CHUNK ? r->size - off : REG_CHUNK;
    cudaError_t e =
        cudaHostRegister((char *)r->base + off, len, cudaHostRegisterPortable | cudaHostRegisterMapped);
    if (e != cudaSuccess) {
      snprintf(r->err, sizeof r->err, "cudaHostRegister of pool bytes [%llu, %llu): %s",
               (unsigned long long)off, (unsigned long long)(off + len), cudaGetErrorString(e));
      cudaGetLastError();
      atomic_store_explicit(&r->state, -EIO, memory_order_release); /* pairs with registration() */
      return NULL;
    }
    r->chunks_ok++;
    atomic_store_explicit(&r->done, off + len, memory_order_release);
    if (r->progress) r->progress(r->progress_arg, "cuda-register", off + len, r->size);
  }
  atomic_store_explicit(&r->state, 0, memory_order_release);
  return NULL;
}

static struct reg *reg_get(umbp_pool *pool, const umbp_dp_opts *opts, int dev) {
  pthread_mutex_lock(&reg_mu);
  struct reg *r = regs;
  while (r && r->base != pool->base) r = r->next;
  if (r) {
    r->refs++;
    pthread_mutex_unlock(&reg_mu);
    return r;
  }
  r = calloc(1, sizeof *r);
  if (!r) {
    pthread_mutex_unlock(&reg_mu);
    return NULL;
  }
  r->base = pool->base;
  r->size = pool->size;
  r->refs = 1;
  r->dev = dev;
  r->progress = opts->progress;
  r->progress_arg = opts->progress_arg;
  atomic_init(&r->state, 1);
  if (pthread_create(&r->th, NULL, reg_thread, r) == 0) r->started = true;
  else {
    snprintf(r->err, sizeof r->err, "cannot start the registration thread");
    atomic_store(&r->state, -EAGAIN);
  }
  r->next = regs;
  regs = r;
  pthread_mutex_unlock(&reg_mu);
  return r;
}

static void reg_put(struct reg *r) {
  if (!r) return;
  pthread_mutex_lock(&reg_mu);
  if (--r->refs) {
    pthread_mutex_unlock(&reg_mu);
    return;
  }
  struct reg **pp = &regs;
  while (*pp != r) pp = &(*pp)->next;
  *pp = r->next;
  pthread_mutex_unlock(&reg_mu);
  if (r->started) pthread_join(r->th, NULL);
  for (unsigned k = 0; k < r->chunks_ok; k++) cudaHostUnregister((char *)r->base + (uint64_t)k * REG_CHUNK);
  free(r);
}

/* ---- engine ---------------------------------------------------------------- */
struct cuda_eng {
  pthread_mutex_t mu;
  unsigned nstreams;
  cudaStream_t *streams[MAX_DEV]; /* created on first use per device */
  _Atomic unsigned rr;
  struct reg *reg;
  struct dp_ipc_cache *cache;
  int ndev;
  int copy_mode;                /* enum umbp_dp_cuda_copy */
  unsigned kctas;               /* CTAs per copy-kernel launch */
  signed char kern_ok[MAX_DEV]; /* set with the device's streams: 1 the kernel can run there */
};

static int ipc_open_cb(void *arg, const struct dp_ipc_desc *d, void **ret_ptr) {
  (void)arg;
  cudaIpcMemHandle_t h;
  memcpy(&h, d->handle, sizeof h);
  void *p = NULL;
  cudaError_t e = cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return umbp_fail(-EIO, "dp ipc: cudaIpcOpenMemHandle of rank %u region %u: %s", d->rank, d->region,
                     cudaGetErrorString(e));
  }
  *ret_ptr = p;
  return 0;
}

static void ipc_close_cb(void *arg, void *ptr) {
  (void)arg;
  cudaIpcCloseMemHandle(ptr);
}

int dp_cuda_engine_init(umbp_dp_engine *eng, const umbp_dp_opts *opts) {
  int n = dp_cuda_probe(NULL, 0);
  if (n < 0) return n;
  struct cuda_eng *c = calloc(1, sizeof *c);
  if (!c) return umbp_fail(-ENOMEM, "dp cuda: out of memory");
  pthread_mutex_init(&c->mu, NULL);
  c->nstreams = opts->cuda_streams ? opts->cuda_streams : DP_CUDA_STREAMS_DEFAULT;
  c->ndev = n < MAX_DEV ? n : MAX_DEV;
  c->copy_mode = opts->cuda_copy;
  c->kctas = opts->cuda_kernel_ctas ? opts->cuda_kernel_ctas : DP_KERNEL_CTAS_DEFAULT;
  int rc = dp_ipc_cache_new(ipc_open_cb, ipc_close_cb, NULL, &c->cache);
  if (rc) {
    free(c);
    return rc;
  }
  /* The pool is registered from the creating thread's current device (a
   * vLLM worker has selected its rank's GPU by then); cudaHostRegisterPortable
   * makes the registration count for every device. */
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) dev = 0;
  if (opts->cuda_register) c->reg = reg_get(eng->pool, opts, dev);
  eng->cuda = c;
  return 0;
}

void dp_cuda_engine_fini(umbp_dp_engine *eng) {
  struct cuda_eng *c = eng->cuda;
  if (!c) return;
  void *ctx = ctx_save();
  for (int d = 0; d < MAX_DEV; d++) {
    if (!c->streams[d]) continue;
    cudaSetDevice(d);
    for (unsigned s = 0; s < c->nstreams; s++) {
      cudaStreamSynchronize(c->streams[d][s]);
      cudaStreamDestroy(c->streams[d][s]);
    }
    free(c->streams[d]);
  }
  ctx_restore(ctx);
  dp_ipc_cache_free(c->cache);
  reg_put(c->reg);
  pthread_mutex_destroy(&c->mu);
  free(c);
  eng->cuda = NULL;
}

int dp_cuda_registration(umbp_dp_engine *eng, uint64_t *ret_done, uint64_t *ret_total) {
  struct cuda_eng *c = eng->cuda;
  if (!c) {
    char why[256];
    int r = dp_cuda_probe(why, sizeof why);
    return umbp_fail(r < 0 ? r : -ENODEV, "dp: %s", r < 0 ? why : "this engine has no CUDA backend");
  }
  if (!c->reg) return umbp_fail(-ENODEV, "dp: the engine was created with cuda_register = false");
  int st = atomic_load_explicit(&c->reg->state, memory_order_acquire); /* pairs with reg_thread */
  if (st < 0) return umbp_fail(st, "dp: %s", c->reg->err);
  if (st == 1) {
    if (ret_done) *ret_done = atomic_load_explicit(&c->reg->done, memory_order_acquire);
    if (ret_total) *ret_total = c->reg->size;
    return -EINPROGRESS;
  }
  return 0;
}

static cudaStream_t *dev_streams(struct cuda_eng *c, int dev, const char **err) {
  if (dev < 0 || dev >= c->ndev) {
    *err = "device ordinal out of range";
    return NULL;
  }
  pthread_mutex_lock(&c->mu);
  if (!c->streams[dev]) {
    cudaStream_t *s = calloc(c->nstreams, sizeof *s);
    cudaError_t e = s ? cudaSetDevice(dev) : cudaErrorMemoryAllocation;
    for (unsigned i = 0; s && e == cudaSuccess && i < c->nstreams; i++)
      e = cudaStreamCreateWithFlags(&s[i], cudaStreamNonBlocking);
    if (e != cudaSuccess) {
      *err = cudaGetErrorString(e);
      free(s);
      pthread_mutex_unlock(&c->mu);
      return NULL;
    }
    int same = 0;
    if (cudaDeviceGetAttribute(&same, cudaDevAttrCanUseHostPointerForRegisteredMem, dev) != cudaSuccess) same = 0;
    c->kern_ok[dev] = (signed char)(same && dp_kc_usable() == cudaSuccess);
    cudaGetLastError(); /* dp_kc_usable's error, if any, is an answer, not a failure */
    c->streams[dev] = s;
  }
  pthread_mutex_unlock(&c->mu);
  return c->streams[dev];
}

/* ---- jobs ------------------------------------------------------------------ */
struct chunk {
  unsigned i0, i1;
  cudaEvent_t ev;
  bool has_ev, done;
};
struct cuda_job {
  pthread_mutex_t mu;
  unsigned nchunks;
  struct chunk *ch;
  int dev;
};

static _Atomic uint64_t n_batches, n_ranges, n_kernels; /* relaxed: statistics only */

void dp_cuda_copy_calls(uint64_t *ret_batches, uint64_t *ret_ranges, uint64_t *ret_kernels) {
  *ret_batches = atomic_load_explicit(&n_batches, memory_order_relaxed);
  *ret_ranges = atomic_load_explicit(&n_ranges, memory_order_relaxed);
  *ret_kernels = atomic_load_explicit(&n_kernels, memory_order_relaxed);
}

/* Launch the copy kernel over keys [i0, i1) of a job. Pulls read the
 * exporter's regions at src[r] + source block * sstride[r]. */
static cudaError_t copy_kernel(struct umbp_dp_job *job, unsigned i0, unsigned i1, struct dp_kc_params *p,
                               unsigned ctas, char *const *src, const uint64_t *sstride, cudaStream_t s) {
  const struct dp_group *g = job->grp;
  const struct dp_region *R = &job->lay->r[g->first];
  const bool pull = job->op == DP_OP_PULL;
  p->dir = pull ? DP_KC_PULL : job->op == DP_OP_STORE ? DP_KC_STORE : DP_KC_LOAD;
  for (unsigned r0 = 0; r0 < g->count; r0 += DP_KC_MAX_REG) {
    p->nreg = g->count - r0 < DP_KC_MAX_REG ? g->count - r0 : DP_KC_MAX_REG;
    for (unsigned k = 0; k < p->nreg; k++)
      p->reg[k] = (struct dp_kc_reg){
          .dev = (uint64_t)(uintptr_t)R[r0 + k].base, .stride = R[r0 + k].stride,
          .obj_off = pull ? (uint64_t)(uintptr_t)src[r0 + k] : R[r0 + k].obj_off,
          .bytes = R[r0 + k].block_bytes, .ostride = pull ? sstride[r0 + k] : 0};
    p->nblk = 0;
    for (unsigned i = i0; i < i1; i++) {
      if (job->rc[i] != 0 || (!pull && job->slots[i] == UMBP_NO_SLOT)) continue;
      p->blk[p->nblk] = job->blocks[i];
      p->oblk[p->nblk] = pull ? job->src_blocks[i] : 0;
      p->host[p->nblk] = pull ? 0 : (uint64_t)(uintptr_t)umbp_slot_ptr(job->eng->pool, job->slots[i]);
      if (++p->nblk == DP_KC_MAX_BLK) {
        cudaError_t e = dp_kc_launch(p, ctas, s);
        if (e != cudaSuccess) return e;
        atomic_fetch_add_explicit(&n_kernels, 1, memory_order_relaxed);
        p->nblk = 0;
      }
    }
    if (p->nblk) {
      cudaError_t e = dp_kc_launch(p, ctas, s);
      if (e != cudaSuccess) return e;
      atomic_fetch_add_explicit(&n_kernels, 1, memory_order_relaxed);
      p->nblk = 0;
    }
  }
  return cudaSuccess;
}

static cudaError_t copy_batch(void **dsts, void **srcs, size_t *sizes, size_t count, cudaStream_t s) {
  if (count == 0) return cudaSuccess;
#if CUDART_VERSION >= 12080
  struct cudaMemcpyAttributes attr;
  memset(&attr, 0, sizeof attr);
  attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
  size_t idx = 0;
#if CUDART_VERSION >= 13000
  cudaError_t e = cudaMemcpyBatchAsync((void *const *)dsts, (const void *const *)srcs, sizes, count, &attr,
                                       &idx, 1, s);
#else
  size_t fail_idx = 0;
  cudaError_t e = cudaMemcpyBatchAsync(dsts, srcs, sizes, count, &attr, &idx, 1, &fail_idx, s);
#endif
  if (e != cudaErrorNotSupported && e != cudaErrorInvalidValue) {
    if (e == cudaSuccess) atomic_fetch_add_explicit(&n_batches, 1, memory_order_relaxed);
    return e;
  }
  cudaGetLastError(); /* the driver refused the batch form: fall back per range */
#endif
  for (size_t i = 0; i < count; i++) {
    cudaError_t e2 = cudaMemcpyAsync(dsts[i], srcs[i], sizes[i], cudaMemcpyDefault, s);
    if (e2 != cudaSuccess) return e2;
  }
  atomic_fetch_add_explicit(&n_ranges, count, memory_order_relaxed);
  return cudaSuccess;
}

static void fail_range(struct umbp_dp_job *job, unsigned i0, unsigned i1, int code, const char *what,
                       const char *msg) {
  char m[256];
  snprintf(m, sizeof m, "%s: %s", what, msg);
  for (unsigned i = i0; i < i1; i++)
    if (job->rc[i] == 0) dp_job_fail_key(job, i, code, m);
}

static int resolve_pull(struct umbp_dp_job *job, struct cuda_eng *c, char **src, uint64_t *stride,
                        uint32_t *count) {
  const struct dp_group *g = job->grp;
  struct dp_ipc_desc *d = calloc(g->count, sizeof *d);
  if (!d) return umbp_fail(-ENOMEM, "dp pull: out of memory");
  dp_ipc_cache_prune(c->cache, job->eng->pool);
  int found = dp_ipc_find(job->eng->pool, job->src_rank, g->group, d, g->count);
  int rc = 0;
  if (found < 0) rc = found == -ENOENT ? umbp_fail(-ENOENT, "dp pull: nothing exported yet") : found;
  else if ((unsigned)found != g->count || d[0].n_regions != g->count)
    rc = umbp_fail(-ENOENT, "dp pull: rank %u has %d live exported regions of group %u, this layout has %u",
                   job->src_rank, found, g->group, g->count);
  for (unsigned k = 0; !rc && k < g->count; k++) {
    const struct dp_region *r = &job->lay->r[g->first + k];
    if (d[k].block_bytes != r->block_bytes)
      rc = umbp_fail(-EINVAL, "dp pull: region %u is %llu bytes per block at rank %u, %llu here", k,
                     (unsigned long long)d[k].block_bytes, job->src_rank, (unsigned long long)r->block_bytes);
    void *p = NULL;
    if (!rc) rc = dp_ipc_cache_get(c->cache, &d[k], &p);
    src[k] = p ? (char *)p + d[k].alloc_off : NULL;
    stride[k] = d[k].stride;
    count[k] = d[k].block_count;
  }
  free(d);
  return rc;
}

static int submit(struct umbp_dp_job *job) {
  struct cuda_eng *c = job->eng->cuda;
  const struct dp_group *g = job->grp;
  const struct dp_region *R = &job->lay->r[g->first];
  struct cuda_job *cj = calloc(1, sizeof *cj);
  const char *err = NULL;
  if (!cj) {
    fail_range(job, 0, job->n, -ENOMEM, "dp cuda", "out of memory");
    return -ENOMEM;
  }
  pthread_mutex_init(&cj->mu, NULL);
  cj->dev = g->device_id;
  job->cuda = cj;
  cudaStream_t *streams = dev_streams(c, g->device_id, &err);
  if (!streams) {
    fail_range(job, 0, job->n, -EIO, "dp cuda: cannot create streams", err);
    return -EIO;
  }
  char **src = NULL;
  uint64_t *sstride = NULL;
  uint32_t *scount = NULL;
  if (job->op == DP_OP_PULL) {
    src = calloc(g->count, sizeof *src);
    sstride = calloc(g->count, sizeof *sstride);
    scount = calloc(g->count, sizeof *scount);
    int rc = src && sstride && scount ? resolve_pull(job, c, src, sstride, scount) : -ENOMEM;
    if (rc) {
      fail_range(job, 0, job->n, rc, "dp pull", umbp_last_error());
      free(src);
      free(sstride);
      free(scount);
      return rc;
    }
  }
  unsigned ns = c->nstreams < job->n ? c->nstreams : job->n;
  /* The kernel or the copy engines, for the whole job. */
  /* Slots are reached through the registered mapping: store and load need
   * the registration finished; a pull touches device memory only. */
  bool host_ok = job->op == DP_OP_PULL ||
                 (c->reg && atomic_load_explicit(&c->reg->state, memory_order_acquire) == 0);
  bool kern = c->copy_mode != UMBP_DP_CUDA_COPY_DMA && c->kern_ok[g->device_id] && host_ok &&
              (c->copy_mode == UMBP_DP_CUDA_COPY_KERNEL ||
               (job->op != DP_OP_STORE && g->obj_bytes < (uint64_t)UMBP_DP_KERNEL_AUTO_MAX * g->count));
  struct dp_kc_params *kp = kern ? malloc(sizeof *kp) : NULL;
  if (kern && !kp) kern = false;
  cj->ch = calloc(ns, sizeof *cj->ch);
  /* The copy engines take (dst, src, size) triples; the kernel computes its
   * addresses from the layout and needs none. */
  size_t cap = kern ? 0 : (size_t)job->n * g->count;
  void **dsts = kern ? NULL : malloc(cap * sizeof *dsts), **srcs = kern ? NULL : malloc(cap * sizeof *srcs);
  size_t *sizes = kern ? NULL : malloc(cap * sizeof *sizes);
  if (!cj->ch || (!kern && (!dsts || !srcs || !sizes))) {
    fail_range(job, 0, job->n, -ENOMEM, "dp cuda", "out of memory");
    free(dsts), free(srcs), free(sizes), free(src), free(sstride), free(scount), free(kp);
    return -ENOMEM;
  }
  cudaSetDevice(g->device_id);
  unsigned per = (job->n + ns - 1) / ns;
  for (unsigned k = 0; k < ns; k++) {
    struct chunk *ch = &cj->ch[cj->nchunks++];
    ch->i0 = k * per;
    ch->i1 = ch->i0 + per < job->n ? ch->i0 + per : job->n;
    size_t cnt = 0;
    for (unsigned i = ch->i0; i < ch->i1; i++) {
      if (job->rc[i] != 0) continue;
      uint64_t b = job->blocks[i];
      if (job->op == DP_OP_PULL) {
        bool ok = true;
        for (unsigned r = 0; r < g->count; r++) ok = ok && job->src_blocks[i] < scount[r];
        if (!ok) {
          dp_job_fail_key(job, i, -EINVAL, "dp pull: source block id out of the exporter's range");
          continue;
        }
        if (kern) {
          cnt += g->count;
          continue;
        }
        for (unsigned r = 0; r < g->count; r++) {
          dsts[cnt] = R[r].base + b * R[r].stride;
          srcs[cnt] = src[r] + (uint64_t)job->src_blocks[i] * sstride[r];
          sizes[cnt++] = R[r].block_bytes;
        }
        continue;
      }
      if (job->slots[i] == UMBP_NO_SLOT) continue;
      if (kern) {
        cnt += g->count;
        continue;
      }
      char *slot = umbp_slot_ptr(job->eng->pool, job->slots[i]);
      for (unsigned r = 0; r < g->count; r++) {
        char *dev = R[r].base + b * R[r].stride, *host = slot + R[r].obj_off;
        dsts[cnt] = job->op == DP_OP_STORE ? host : dev;
        srcs[cnt] = job->op == DP_OP_STORE ? dev : host;
        sizes[cnt++] = R[r].block_bytes;
      }
    }
    if (cnt == 0) {
      ch->done = true;
      continue;
    }
    cudaStream_t s = streams[atomic_fetch_add_explicit(&c->rr, 1, memory_order_relaxed) % c->nstreams];
    cudaError_t e = kern ? copy_kernel(job, ch->i0, ch->i1, kp, c->kctas, src, sstride, s) : copy_batch(dsts, srcs, sizes, cnt, s);
    if (e == cudaSuccess) e = cudaEventCreateWithFlags(&ch->ev, cudaEventDisableTiming);
    if (e == cudaSuccess) {
      ch->has_ev = true;
      e = cudaEventRecord(ch->ev, s);
    }
    if (e != cudaSuccess) {
      cudaGetLastError();
      fail_range(job, ch->i0, ch->i1, -EIO, "CUDA copy", cudaGetErrorString(e));
      /* Copies queued before the failure may still run: wait for the stream
       * (bounded by its queued work) before the slots can be released. */
      cudaStreamSynchronize(s);
      ch->done = true;
    }
  }
  free(dsts), free(srcs), free(sizes), free(src), free(sstride), free(scount), free(kp);
  return 0;
}

int dp_cuda_submit(struct umbp_dp_job *job) {
  void *ctx = ctx_save();
  int rc = submit(job);
  ctx_restore(ctx);
  return rc;
}

int dp_cuda_progress(struct umbp_dp_job *job) {
  struct cuda_job *cj = job->cuda;
  if (!cj) return 1;
  void *ctx = ctx_save(); /* an event query in a thread without a context would create one */
  pthread_mutex_lock(&cj->mu);
  bool all = true;
  for (unsigned k = 0; k < cj->nchunks; k++) {
    struct chunk *ch = &cj->ch[k];
    if (ch->done) continue;
    cudaError_t e = cudaEventQuery(ch->ev);
    if (e == cudaErrorNotReady) {
      all = false;
      continue;
    }
    if (e != cudaSuccess) {
      cudaGetLastError();
      fail_range(job, ch->i0, ch->i1, -EIO, "CUDA copy", cudaGetErrorString(e));
    }
    ch->done = true;
  }
  pthread_mutex_unlock(&cj->mu);
  ctx_restore(ctx);
  return all;
}

void dp_cuda_job_free(struct umbp_dp_job *job) {
  struct cuda_job *cj = job->cuda;
  if (!cj) return;
  void *ctx = ctx_save();
  for (unsigned k = 0; k < cj->nchunks; k++)
    if (cj->ch[k].has_ev) cudaEventDestroy(cj->ch[k].ev);
  ctx_restore(ctx);
  pthread_mutex_destroy(&cj->mu);
  free(cj->ch);
  free(cj);
  job->cuda = NULL;
}

/* ---- IPC export ------------------------------------------------------------ */
/* Offset of device pointer p from the base of the allocation holding it. */
static cudaError_t alloc_offset(const void *p, uint64_t *ret) {
  pthread_once(&drv_once, drv_init);
  if (!get_range_fn) return get_range_err;
  CUdeviceptr base = 0;
  size_t size = 0;
  if (get_range_fn(&base, &size, (CUdeviceptr)(uintptr_t)p) != CUDA_SUCCESS) return cudaErrorInvalidDevicePointer;
  *ret = (uint64_t)((uintptr_t)p - (uintptr_t)base);
  return cudaSuccess;
}

static int ipc_export(umbp_dp_engine *eng, const umbp_kv_layout *lay, unsigned rank) {
  if (!eng->cuda) {
    char why[256];
    int r = dp_cuda_probe(why, sizeof why);
    return umbp_fail(r < 0 ? r : -ENODEV, "dp ipc export: %s", r < 0 ? why : "no CUDA backend in this engine");
  }
  unsigned n = 0;
  struct dp_ipc_desc *d = calloc(lay->n, sizeof *d);
  if (!d) return umbp_fail(-ENOMEM, "dp ipc export: out of memory");
  for (unsigned gi = 0; gi < lay->ngroups; gi++) {
    const struct dp_group *g = &lay->g[gi];
    if (!g->cuda) continue;
    cudaSetDevice(g->device_id);
    for (unsigned k = 0; k < g->count; k++) {
      const struct dp_region *r = &lay->r[g->first + k];
      cudaIpcMemHandle_t h;
      cudaError_t e = cudaIpcGetMemHandle(&h, r->base);
      if (e != cudaSuccess) {
        cudaGetLastError();
        free(d);
        return umbp_fail(-EIO, "dp ipc export: cudaIpcGetMemHandle of region %u (group %u, layer %u): %s",
                         r->orig, g->group, r->layer, cudaGetErrorString(e));
      }
      uint64_t off = 0;
      if ((e = alloc_offset(r->base, &off)) != cudaSuccess) {
        cudaGetLastError();
        free(d);
        return umbp_fail(-EIO, "dp ipc export: cannot find the allocation of region %u (group %u, layer %u): %s",
                         r->orig, g->group, r->layer, cudaGetErrorString(e));
      }
      _Static_assert(sizeof h <= DP_IPC_HANDLE_BYTES, "IPC handle fits the table");
      struct dp_ipc_desc *x = &d[n++];
      x->rank = rank;
      x->region = k;
      x->group = g->group;
      x->device_id = g->device_id;
      x->layer = r->layer;
      x->kind = r->kind;
      x->block_bytes = r->block_bytes;
      x->stride = r->stride;
      x->block_count = r->block_count;
      x->n_regions = g->count;
      x->alloc_off = off;
      memcpy(x->handle, &h, sizeof h);
    }
  }
  int rc = n ? dp_ipc_publish(eng->pool, rank, d, n)
             : umbp_fail(-EINVAL, "dp ipc export: the layout has no CUDA region");
  free(d);
  return rc;
}

int dp_cuda_ipc_export(umbp_dp_engine *eng, const umbp_kv_layout *lay, unsigned rank) {
  void *ctx = ctx_save();
  int rc = ipc_export(eng, lay, rank);
  ctx_restore(ctx);
  return rc;
}
