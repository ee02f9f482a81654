/* SPDX-License-Identifier: Apache-2.0 */
/* Suite 'gpu': the CUDA backend. Each test skips, saying why, where the
 * build has no cudart or the runtime reports no device. */
#include "test_util.h"

#include "datapath/dp_internal.h"
#include "dp_test_util.h"
#include "umbp/datapath.h"
#include "umbp_config.h"

#if UMBP_HAVE_CUDA
#include <cuda_runtime_api.h>
#include <cudaTypedefs.h>
#endif

static int need_gpu(void) {
  char why[256];
  if (umbp_dp_backends(why, sizeof why) & UMBP_DP_BACKEND_CUDA) return 1;
  printf("# SKIP: no usable GPU: %s\n", why);
  return 0;
}

#if UMBP_HAVE_CUDA
struct gfx {
  char name[64];
  umbp_pool *pool;
  uint32_t ns;
  umbp_dp_engine *e;
};

static void gfx_open_cap(struct gfx *f, const char *tag, int mode, uint64_t capacity) {
  snprintf(f->name, sizeof f->name, "%s", tu_name(tag));
  umbp_pool_params p;
  umbp_pool_params_init(&p);
  p.slot_size = 256 * 1024;
  p.capacity = capacity;
  p.no_prefault = true;
  p.mempolicy = UMBP_MPOL_NONE;
  assert_int_equal(umbp_pool_create(f->name, &p, &f->pool), 0);
  assert_int_equal(umbp_ns_register(f->pool, "gpu", &f->ns), 0);
  umbp_dp_opts o;
  umbp_dp_opts_init(&o);
  o.cuda_copy = mode;
  assert_int_equal(umbp_dp_engine_create(f->pool, &o, &f->e), 0);
}

static void gfx_open_mode(struct gfx *f, const char *tag, int mode) { gfx_open_cap(f, tag, mode, 64ull << 20); }
static void gfx_open(struct gfx *f, const char *tag) { gfx_open_mode(f, tag, UMBP_DP_CUDA_COPY_AUTO); }

static void gfx_close(struct gfx *f) {
  umbp_dp_engine_destroy(f->e);
  umbp_pool_detach(f->pool);
  umbp_pool_destroy(f->name);
  umbp_dp_ipc_unlink(f->name);
}

static int wait_registered(umbp_dp_engine *e) {
  for (int i = 0; i < 120000; i++) {
    int rc = umbp_dp_cuda_registration(e, NULL, NULL);
    if (rc != -EINPROGRESS) return rc;
    usleep(1000);
  }
  return -ETIMEDOUT;
}
#endif

static void test_registration(void **st) {
  (void)st;
  if (!need_gpu()) skip();
#if UMBP_HAVE_CUDA
  struct gfx f;
  gfx_open(&f, "gpureg");
  int rc = wait_registered(f.e);
  if (rc) printf("# %s\n", umbp_last_error());
  assert_int_equal(rc, 0);
  unsigned flags = 0;
  assert_int_equal(cudaHostGetFlags(&flags, umbp_slot_ptr(f.pool, 0)), cudaSuccess);
  gfx_close(&f);
#endif
}

#if UMBP_HAVE_CUDA
/* Store blocks 0..n-1 of a layout on cuda:0 with engine copy mode `mode`,
 * zero the device regions, load them into blocks n..2n-1, and compare every
 * byte (padding between blocks must stay zero) through a host mirror.
 * ret_kern[0..1] / ret_dma[0..1]: copy-kernel launches and copy-engine
 * issues of the store [0] and of the load [1]. */
static void roundtrip(int mode, unsigned nreg, unsigned n, const uint64_t *bytes, uint64_t pad,
                      uint64_t ret_kern[2], uint64_t ret_dma[2]) {
  struct gfx f;
  gfx_open_mode(&f, "gpurt", mode);
  assert_int_equal(wait_registered(f.e), 0);
  static struct kvc h;
  kvc_init(&h, nreg, 2 * n, bytes, pad, 1);
  umbp_kv_region *reg = calloc(nreg, sizeof *reg);
  assert_non_null(reg);
  for (unsigned b = 0; b < n; b++) kvc_fill(&h, b, 11, b);
  assert_int_equal(kvc_to_cuda(&h, reg), cudaSuccess);
  umbp_kv_layout *lay;
  assert_int_equal(umbp_kv_layout_create(f.pool, reg, nreg, &lay), 0);
  uint32_t *ids = calloc(n, sizeof *ids), *dst = calloc(n, sizeof *dst);
  umbp_key *k = calloc(n, sizeof *k);
  for (unsigned i = 0; i < n; i++) ids[i] = i, dst[i] = n + i, k[i] = dp_key(f.ns, 11, i);
  uint64_t b0, r0, k0, b1, r1, k1, b2, r2, k2;
  dp_cuda_copy_calls(&b0, &r0, &k0);
  umbp_dp_job *j;
  assert_int_equal(umbp_dp_store(f.e, lay, 0, -1, n, ids, k, 0, &j), 0);
  assert_int_equal(umbp_dp_job_wait(j, 20000), 0);
  if (umbp_dp_job_status(j)) printf("# store: %s\n", umbp_dp_job_message(j, 0));
  assert_int_equal(umbp_dp_job_status(j), 0);
  umbp_dp_job_release(j);
  for (unsigned i = 0; i < n; i++) assert_true(umbp_contains(f.pool, &k[i]));
  dp_cuda_copy_calls(&b1, &r1, &k1);
  for (unsigned r = 0; r < nreg; r++)
    assert_int_equal(cudaMemset(reg[r].base, 0, (uint64_t)2 * n * h.reg[r].stride), cudaSuccess);
  assert_int_equal(umbp_dp_load(f.e, lay, 0, n, k, dst, &j), 0);
  assert_int_equal(umbp_dp_job_wait(j, 20000), 0);
  if (umbp_dp_job_status(j)) printf("# load: %s\n", umbp_dp_job_message(j, 0));
  assert_int_equal(umbp_dp_job_status(j), 0);
  umbp_dp_job_release(j);
  dp_cuda_copy_calls(&b2, &r2, &k2);
  ret_kern[0] = k1 - k0, ret_dma[0] = (b1 - b0) + (r1 - r0);
  ret_kern[1] = k2 - k1, ret_dma[1] = (b2 - b1) + (r2 - r1);
  kvc_zero(&h);
  for (unsigned r = 0; r < nreg; r++)
    assert_int_equal(cudaMemcpy(h.mem[r], reg[r].base, (uint64_t)2 * n * h.reg[r].stride, cudaMemcpyDeviceToHost),
                     cudaSuccess);
  for (unsigned i = 0; i < n; i++) {
    assert_true(kvc_check(&h, dst[i], 11, i));
    assert_true(kvc_is_zero(&h, ids[i]));
  }
  umbp_kv_layout_free(lay);
  kvc_cuda_free(reg, nreg);
  for (unsigned r = 0; r < nreg; r++) free(h.mem[r]);
  free(reg), free(ids), free(dst), free(k);
  gfx_close(&f);
}

#endif

/* 4 layers x K,V of 16 KiB per block, 16 blocks, through the copy engines. */
static void test_d2h_h2d_dma(void **st) {
  (void)st;
  if (!need_gpu()) skip();
#if UMBP_HAVE_CUDA
  uint64_t bytes[8], kern[2], dma[2];
  for (int i = 0; i < 8; i++) bytes[i] = 16384;
  roundtrip(UMBP_DP_CUDA_COPY_DMA, 8, 16, bytes, 0, kern, dma);
  printf("# dma: store %llu / load %llu copy-engine issues, %llu kernel launches\n", (unsigned long long)dma[0],
         (unsigned long long)dma[1], (unsigned long long)(kern[0] + kern[1]));
  assert_int_equal(kern[0] + kern[1], 0);
  assert_true(dma[0] > 0 && dma[1] > 0);
#endif
}

/* The same in auto mode: the store through the copy engines, the load (16
 * KiB ranges) through the copy kernel. */
static void test_d2h_h2d_auto(void **st) {
  (void)st;
  if (!need_gpu()) skip();
#if UMBP_HAVE_CUDA
  uint64_t bytes[8], kern[2], dma[2];
  for (int i = 0; i < 8; i++) bytes[i] = 16384;
  roundtrip(UMBP_DP_CUDA_COPY_AUTO, 8, 16, bytes, 0, kern, dma);
  printf("# auto: store %llu copy-engine issues + %llu launches, load %llu launches + %llu issues\n",
         (unsigned long long)dma[0], (unsigned long long)kern[0], (unsigned long long)kern[1],
         (unsigned long long)dma[1]);
  assert_true(dma[0] > 0);
  assert_int_equal(kern[0], 0);
  assert_true(kern[1] > 0);
  assert_int_equal(dma[1], 0);
#endif
}

/* The kernel's split and byte paths: 100 regions (3 launches of at most 40
 * regions), 200 blocks (2 launches of at most 128 blocks), odd sizes and
 * padding (unaligned ranges, object offsets not multiples of 16). */
static void test_d2h_h2d_kernel_odd(void **st) {
  (void)st;
  if (!need_gpu()) skip();
#if UMBP_HAVE_CUDA
  uint64_t bytes[100], kern[2], dma[2];
  for (int i = 0; i < 100; i++) bytes[i] = i % 3 ? 1024 : 1000 + (uint64_t)i;
  roundtrip(UMBP_DP_CUDA_COPY_KERNEL, 100, 200, bytes, 24, kern, dma);
  printf("# kernel: store %llu, load %llu launches\n", (unsigned long long)kern[0], (unsigned long long)kern[1]);
  /* each: >= 2 block batches x 3 region batches */
  assert_true(kern[0] >= 6 && kern[1] >= 6);
  assert_int_equal(dma[0] + dma[1], 0);
#endif
}

/* Slots reused under the kernel: a pool of 16 slots, and each round the host
 * backend (CPU stores) writes new bytes for 16 new keys into the same slots
 * that the kernel loaded from in the round before; the kernel must load the
 * new bytes (it reads slots with ld.global.cv, so no line that an earlier
 * launch cached is returned). */
static void test_kernel_slot_reuse(void **st) {
  (void)st;
  if (!need_gpu()) skip();
#if UMBP_HAVE_CUDA
  enum { NREG = 8, NB = 16, BB = 16384 };
  struct gfx f;
  gfx_open_cap(&f, "gpureuse", UMBP_DP_CUDA_COPY_KERNEL, (uint64_t)NB * 256 * 1024);
  assert_int_equal(wait_registered(f.e), 0);
  uint64_t bytes[NREG];
  for (int i = 0; i < NREG; i++) bytes[i] = BB;
  static struct kvc hc, hm; /* CPU cache (source), mirror of the device cache */
  kvc_init(&hc, NREG, NB, bytes, 0, 1);
  kvc_init(&hm, NREG, NB, bytes, 0, 1);
  umbp_kv_region reg[NREG];
  assert_int_equal(kvc_to_cuda(&hc, reg), cudaSuccess);
  umbp_kv_layout *lc, *lg;
  assert_int_equal(umbp_kv_layout_create(f.pool, hc.reg, NREG, &lc), 0);
  assert_int_equal(umbp_kv_layout_create(f.pool, reg, NREG, &lg), 0);
  uint32_t ids[NB];
  umbp_key k[NB];
  uint64_t k0, k1, b, rg;
  dp_cuda_copy_calls(&b, &rg, &k0);
  for (unsigned round = 0; round < 6; round++) {
    for (unsigned i = 0; i < NB; i++) ids[i] = i, k[i] = dp_key(f.ns, 100 + round, i), kvc_fill(&hc, i, 100 + round, i);
    umbp_dp_job *j;
    assert_int_equal(umbp_dp_store(f.e, lc, 0, -1, NB, ids, k, 0, &j), 0);
    assert_int_equal(umbp_dp_job_wait(j, 20000), 0);
    assert_int_equal(umbp_dp_job_status(j), 0);
    umbp_dp_job_release(j);
    assert_int_equal(umbp_dp_load(f.e, lg, 0, NB, k, ids, &j), 0);
    assert_int_equal(umbp_dp_job_wait(j, 20000), 0);
    assert_int_equal(umbp_dp_job_status(j), 0);
    umbp_dp_job_release(j);
    for (int r = 0; r < NREG; r++)
      assert_int_equal(cudaMemcpy(hm.mem[r], reg[r].base, NB * BB, cudaMemcpyDeviceToHost), cudaSuccess);
    for (unsigned i = 0; i < NB; i++) assert_true(kvc_check(&hm, i, 100 + round, i));
    /* Free every slot for the next round's keys. */
    assert_true(umbp_clear_ns(f.pool, f.ns) >= 0);
    umbp_pool_info info;
    for (int t = 0; t < 2000; t++) {
      umbp_reclaim(f.pool);
      assert_int_equal(umbp_pool_get_info(f.pool, &info), 0);
      if (info.partitions[0].free_slots >= NB) break;
      usleep(500);
    }
    assert_true(info.partitions[0].free_slots >= NB);
  }
  dp_cuda_copy_calls(&b, &rg, &k1);
  assert_true(k1 - k0 >= 6);
  umbp_kv_layout_free(lc);
  umbp_kv_layout_free(lg);
  kvc_cuda_free(reg, NREG);
  kvc_free(&hc);
  kvc_free(&hm);
  gfx_close(&f);
#endif
}

/* Rank 1 (an exec'd helper) stores blocks from its GPU memory through the
 * copy kernel and exits; this process (another rank, its own mapping of the
 * pool) loads them through the kernel into its own GPU memory: the bytes
 * must match (replicated KV: stored once, loaded by every other rank). */
static void test_mp_gpu_store_load(void **st) {
  (void)st;
  if (!need_gpu()) skip();
#if UMBP_HAVE_CUDA
  struct gfx f;
  gfx_open_mode(&f, "gpump", UMBP_DP_CUDA_COPY_KERNEL);
  char *argv[] = {(char *)getenv("UMBP_DP_HELPER"), "gpu-store", f.name, "1", NULL};
  assert_non_null(argv[0]);
  int fd;
  pid_t pid = tu_spawn(argv, &fd);
  char line[256];
  int n = tu_readline(fd, line, sizeof line);
  printf("# helper: %s\n", n > 0 ? line : "(no output)");
  assert_int_equal(tu_wait(pid), 0);
  close(fd);
  assert_non_null(strstr(line, "stored 16 blocks with"));
  assert_null(strstr(line, "with 0 kernel"));
  uint32_t ns;
  assert_int_equal(umbp_ns_register(f.pool, "dp-gpu-mp", &ns), 0);
  assert_int_equal(wait_registered(f.e), 0);
  uint64_t bytes[8];
  for (int i = 0; i < 8; i++) bytes[i] = 16384;
  static struct kvc h;
  kvc_init(&h, 8, 32, bytes, 0, 1);
  umbp_kv_region reg[8];
  assert_int_equal(kvc_to_cuda(&h, reg), cudaSuccess); /* zeros */
  umbp_kv_layout *lay;
  assert_int_equal(umbp_kv_layout_create(f.pool, reg, 8, &lay), 0);
  uint32_t dst[16];
  umbp_key k[16];
  for (unsigned i = 0; i < 16; i++) dst[i] = 31 - i, k[i] = dp_key(ns, 55, i);
  uint64_t b0, r0, k0, b1, r1, k1;
  dp_cuda_copy_calls(&b0, &r0, &k0);
  umbp_dp_job *j;
  assert_int_equal(umbp_dp_load(f.e, lay, 0, 16, k, dst, &j), 0);
  assert_int_equal(umbp_dp_job_wait(j, 20000), 0);
  if (umbp_dp_job_status(j)) printf("# load: %s\n", umbp_dp_job_message(j, 0));
  assert_int_equal(umbp_dp_job_status(j), 0);
  umbp_dp_job_release(j);
  dp_cuda_copy_calls(&b1, &r1, &k1);
  assert_true(k1 > k0);
  for (int r = 0; r < 8; r++)
    assert_int_equal(cudaMemcpy(h.mem[r], reg[r].base, 32 * 16384, cudaMemcpyDeviceToHost), cudaSuccess);
  for (unsigned i = 0; i < 16; i++) assert_true(kvc_check(&h, dst[i], 55, i));
  umbp_kv_layout_free(lay);
  kvc_cuda_free(reg, 8);
  kvc_free(&h);
  gfx_close(&f);
#endif
}

/* A thread that never used CUDA stores, waits for and releases a job on a
 * cuda:0 layout: afterwards it still has no current context (the library
 * selects the layout's device only for its own calls and puts the caller's
 * context back; leaving one would also create a context on GPU 0 in every
 * rank's process on a multi-GPU host). */
#if UMBP_HAVE_CUDA
struct ctx_arg {
  struct gfx *f;
  umbp_kv_layout *lay;
  PFN_cuCtxGetCurrent_v4000 get;
  CUcontext before, after;
  int rc;
};

static void *ctx_thread(void *p) {
  struct ctx_arg *a = p;
  a->get(&a->before);
  uint32_t ids[4] = {0, 1, 2, 3};
  umbp_key k[4];
  for (unsigned i = 0; i < 4; i++) k[i] = dp_key(a->f->ns, 9, i);
  umbp_dp_job *j = NULL;
  a->rc = umbp_dp_store(a->f->e, a->lay, 0, -1, 4, ids, k, 0, &j);
  if (!a->rc) a->rc = umbp_dp_job_wait(j, 20000);
  if (!a->rc) a->rc = umbp_dp_job_status(j);
  umbp_dp_job_release(j);
  a->get(&a->after);
  return NULL;
}
#endif

static void test_caller_context(void **st) {
  (void)st;
  if (!need_gpu()) skip();
#if UMBP_HAVE_CUDA
  struct gfx f;
  gfx_open(&f, "gpuctx");
  assert_int_equal(wait_registered(f.e), 0);
  void *fn = NULL;
  enum cudaDriverEntryPointQueryResult q;
  assert_int_equal(cudaGetDriverEntryPointByVersion("cuCtxGetCurrent", &fn, 4000, cudaEnableDefault, &q), cudaSuccess);
  assert_non_null(fn);
  uint64_t bytes[2] = {16384, 16384};
  static struct kvc h;
  kvc_init(&h, 2, 4, bytes, 0, 1);
  umbp_kv_region reg[2];
  assert_int_equal(kvc_to_cuda(&h, reg), cudaSuccess);
  struct ctx_arg a = {.f = &f, .get = (PFN_cuCtxGetCurrent_v4000)fn, .before = (CUcontext)1, .after = (CUcontext)1};
  assert_int_equal(umbp_kv_layout_create(f.pool, reg, 2, &a.lay), 0);
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, ctx_thread, &a), 0);
  pthread_join(th, NULL);
  printf("# fresh thread: context before %p, after %p, rc %d\n", (void *)a.before, (void *)a.after, a.rc);
  assert_int_equal(a.rc, 0);
  assert_null(a.before);
  assert_null(a.after);
  umbp_kv_layout_free(a.lay);
  kvc_cuda_free(reg, 2);
  kvc_free(&h);
  gfx_close(&f);
#endif
}

/* The helper (another process) exports its cuda:0 KV regions as rank 3 (K
 * and V inside one allocation, at +4 KiB and after K); this process pulls
 * blocks device to device, through the copy kernel and through the copy
 * engines, and checks them: a pull that ignored the regions' offsets inside
 * the allocation would read the 0xee bytes before K. */
static void test_ipc_pull(void **st) {
  (void)st;
  if (!need_gpu()) skip();
#if UMBP_HAVE_CUDA
  struct gfx f;
  gfx_open(&f, "gpuipc");
  char *argv[] = {(char *)getenv("UMBP_DP_HELPER"), "gpu-export", f.name, "3", NULL};
  assert_non_null(argv[0]);
  int fd;
  pid_t pid = tu_spawn(argv, &fd);
  char line[256];
  assert_true(tu_readline(fd, line, sizeof line) > 0);
  assert_string_equal(line, "exported");
  uint64_t bytes[2] = {65536, 65536};
  static struct kvc h;
  kvc_init(&h, 2, 8, bytes, 0, 1);
  umbp_kv_region reg[2];
  assert_int_equal(kvc_to_cuda(&h, reg), cudaSuccess); /* zeros */
  umbp_kv_layout *lay;
  assert_int_equal(umbp_kv_layout_create(f.pool, reg, 2, &lay), 0);
  /* Pull with this engine (auto: 64 KiB ranges go to the copy kernel), then
   * with a second engine in copy-engine mode, each into other blocks. */
  umbp_dp_engine *e2;
  umbp_dp_opts o;
  umbp_dp_opts_init(&o);
  o.cuda_copy = UMBP_DP_CUDA_COPY_DMA;
  assert_int_equal(umbp_dp_engine_create(f.pool, &o, &e2), 0);
  umbp_dp_engine *engs[2] = {f.e, e2};
  for (int pass = 0; pass < 2; pass++) {
    uint32_t src[4] = {0, 1, 2, 3}, dst[4] = {7, 6, 5, 4};
    if (pass) src[0] = 5, src[1] = 7, dst[0] = 0, dst[1] = 1, dst[2] = 2, dst[3] = 3;
    for (int r = 0; r < 2; r++) assert_int_equal(cudaMemset(reg[r].base, 0, 8 * 65536), cudaSuccess);
    uint64_t b0, r0, k0, b1, r1, k1;
    dp_cuda_copy_calls(&b0, &r0, &k0);
    umbp_dp_job *j;
    int rc = umbp_dp_ipc_pull(engs[pass], lay, 0, 3, 4, src, dst, &j);
    if (rc) printf("# %s\n", umbp_last_error());
    assert_int_equal(rc, 0);
    assert_int_equal(umbp_dp_job_wait(j, 20000), 0);
    if (umbp_dp_job_status(j)) printf("# %s\n", umbp_dp_job_message(j, 0));
    assert_int_equal(umbp_dp_job_status(j), 0);
    umbp_dp_job_release(j);
    dp_cuda_copy_calls(&b1, &r1, &k1);
    printf("# pull %s: %llu kernel launches, %llu copy-engine issues\n", pass ? "dma" : "auto",
           (unsigned long long)(k1 - k0), (unsigned long long)(b1 - b0 + r1 - r0));
    assert_true(pass ? k1 == k0 && b1 + r1 > b0 + r0 : k1 > k0 && b1 + r1 == b0 + r0);
    for (int r = 0; r < 2; r++)
      assert_int_equal(cudaMemcpy(h.mem[r], reg[r].base, 8 * 65536, cudaMemcpyDeviceToHost), cudaSuccess);
    for (unsigned i = 0; i < 4; i++) assert_true(kvc_check(&h, dst[i], 77, src[i]));
  }
  umbp_dp_engine_destroy(e2);
  kill(pid, SIGKILL);
  tu_wait(pid);
  close(fd);
  umbp_kv_layout_free(lay);
  kvc_cuda_free(reg, 2);
  kvc_free(&h);
  gfx_close(&f);
#endif
}

/* A CUDA copy error is a per-key failure carrying CUDA's error string, and a
 * failed store publishes nothing nor keeps a slot (the helper stores from
 * freed device memory): the copy engines refuse the range at issue; the
 * kernel faults, and the stream's event reports it. */
#if UMBP_HAVE_CUDA
static void copy_error(int mode, const char *want) {
  struct gfx f;
  gfx_open(&f, "gpuerr");
  char ms[8];
  snprintf(ms, sizeof ms, "%d", mode);
  char *argv[] = {(char *)getenv("UMBP_DP_HELPER"), "gpu-bad-copy", f.name, "0", ms, NULL};
  assert_non_null(argv[0]);
  int fd;
  pid_t pid = tu_spawn(argv, &fd);
  char line[512];
  int n = tu_readline(fd, line, sizeof line);
  printf("# helper (mode %d): %s\n", mode, n > 0 ? line : "(no output)");
  int code = tu_wait(pid);
  close(fd);
  assert_true(n > 0);
  assert_int_equal(code, 0);
  int status = 0, present = -1;
  assert_int_equal(sscanf(line, "status %d present %d", &status, &present), 2);
  assert_int_equal(status, -EIO);
  assert_int_equal(present, 0);
  assert_non_null(strstr(line, want));
  umbp_pool_info info;
  assert_int_equal(umbp_pool_reap(f.pool) >= 0, 1);
  assert_int_equal(umbp_pool_get_info(f.pool, &info), 0);
  for (uint32_t q = 0; q < info.n_partitions; q++)
    assert_int_equal(info.partitions[q].free_slots, info.partitions[q].slot_count);
  gfx_close(&f);
}
#endif

static void test_copy_error(void **st) {
  (void)st;
  if (!need_gpu()) skip();
#if UMBP_HAVE_CUDA
  copy_error(UMBP_DP_CUDA_COPY_DMA, "CUDA copy: ");
  copy_error(UMBP_DP_CUDA_COPY_KERNEL, "CUDA copy: ");
#endif
}

static void test_bench_cuda(void **st) {
  (void)st;
  if (!need_gpu()) skip();
  const char *tool = getenv("UMBP_TOOL");
  assert_non_null(tool);
  char cmd[1024];
  snprintf(cmd, sizeof cmd, "%s bench copy --cuda --reps 3 --cases 256KiBx16,1MiBx80", tool);
  int st2 = system(cmd);
  assert_true(WIFEXITED(st2));
  assert_int_equal(WEXITSTATUS(st2), 0);
}

int main(void) {
  /* cmocka 1.1.5 prints skip() as "not ok # SKIP", which meson counts as a
   * failure: without a GPU the whole program reports a TAP skip plan with
   * the reason instead (the per-test skip() stays for a GPU that vanishes). */
  char why[256];
  if (!(umbp_dp_backends(why, sizeof why) & UMBP_DP_BACKEND_CUDA)) {
    printf("1..0 # SKIP no usable GPU, GPU checks not run: %s\n", why);
    return 0;
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_registration),
      cmocka_unit_test(test_d2h_h2d_dma),
      cmocka_unit_test(test_d2h_h2d_auto),
      cmocka_unit_test(test_d2h_h2d_kernel_odd),
      cmocka_unit_test(test_kernel_slot_reuse),
      cmocka_unit_test(test_mp_gpu_store_load),
      cmocka_unit_test(test_ipc_pull),
      cmocka_unit_test(test_caller_context),
      cmocka_unit_test(test_copy_error),
      cmocka_unit_test(test_bench_cuda),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
