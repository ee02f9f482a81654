/* SPDX-License-Identifier: Apache-2.0 */
/* Suite 'gpu': the CUDA backend. Each test skips, saying why, where the
 * build has no cudart or the runtime reports no device. */
#include "test_util.h"

#include "dp_test_util.h"
#include "umbp/datapath.h"
#include "umbp_config.h"

#if UMBP_HAVE_CUDA
#include <cuda_runtime_api.h>
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

static void gfx_open(struct gfx *f, const char *tag) {
  snprintf(f->name, sizeof f->name, "%s", tu_name(tag));
  umbp_pool_params p;
  umbp_pool_params_init(&p);
  p.slot_size = 256 * 1024;
  p.capacity = 64ull << 20;
  p.no_prefault = true;
  p.mempolicy = UMBP_MPOL_NONE;
  assert_int_equal(umbp_pool_create(f->name, &p, &f->pool), 0);
  assert_int_equal(umbp_ns_register(f->pool, "gpu", &f->ns), 0);
  assert_int_equal(umbp_dp_engine_create(f->pool, NULL, &f->e), 0);
}

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

static void test_d2h_h2d(void **st) {
  (void)st;
  if (!need_gpu()) skip();
#if UMBP_HAVE_CUDA
  struct gfx f;
  gfx_open(&f, "gpurt");
  assert_int_equal(wait_registered(f.e), 0);
  /* 4 layers x K,V on cuda:0, 16 KiB per block, 32 blocks; a host mirror to check. */
  uint64_t bytes[8];
  for (int i = 0; i < 8; i++) bytes[i] = 16384;
  static struct kvc h;
  kvc_init(&h, 8, 32, bytes, 0, 1);
  umbp_kv_region reg[8];
  void *dev[8];
  for (int r = 0; r < 8; r++) {
    assert_int_equal(cudaMalloc(&dev[r], 32 * 16384), cudaSuccess);
    for (unsigned b = 0; b < 16; b++) kvc_fill(&h, b, 11, b);
    assert_int_equal(cudaMemcpy(dev[r], h.mem[r], 32 * 16384, cudaMemcpyHostToDevice), cudaSuccess);
    reg[r] = h.reg[r];
    reg[r].base = dev[r];
    reg[r].device = UMBP_DP_CUDA;
    reg[r].device_id = 0;
  }
  umbp_kv_layout *lay;
  assert_int_equal(umbp_kv_layout_create(f.pool, reg, 8, &lay), 0);
  uint32_t ids[16], dst[16];
  umbp_key k[16];
  for (unsigned i = 0; i < 16; i++) ids[i] = i, dst[i] = 16 + i, k[i] = dp_key(f.ns, 11, i);
  umbp_dp_job *j;
  assert_int_equal(umbp_dp_store(f.e, lay, 0, -1, 16, ids, k, 0, &j), 0);
  assert_int_equal(umbp_dp_job_wait(j, 20000), 0);
  assert_int_equal(umbp_dp_job_status(j), 0);
  umbp_dp_job_release(j);
  for (int r = 0; r < 8; r++) assert_int_equal(cudaMemset(dev[r], 0, 32 * 16384), cudaSuccess);
  assert_int_equal(umbp_dp_load(f.e, lay, 0, 16, k, dst, &j), 0);
  assert_int_equal(umbp_dp_job_wait(j, 20000), 0);
  assert_int_equal(umbp_dp_job_status(j), 0);
  umbp_dp_job_release(j);
  kvc_zero(&h);
  for (int r = 0; r < 8; r++)
    assert_int_equal(cudaMemcpy(h.mem[r], dev[r], 32 * 16384, cudaMemcpyDeviceToHost), cudaSuccess);
  for (unsigned i = 0; i < 16; i++) {
    assert_true(kvc_check(&h, dst[i], 11, i));
    assert_true(kvc_is_zero(&h, ids[i]));
  }
  umbp_kv_layout_free(lay);
  for (int r = 0; r < 8; r++) cudaFree(dev[r]);
  kvc_free(&h);
  gfx_close(&f);
#endif
}

/* The helper (another process) exports its cuda:0 KV regions as rank 3;
 * this process pulls blocks device to device and checks them. */
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
  void *dev[2];
  for (int r = 0; r < 2; r++) {
    assert_int_equal(cudaMalloc(&dev[r], 8 * 65536), cudaSuccess);
    assert_int_equal(cudaMemset(dev[r], 0, 8 * 65536), cudaSuccess);
    reg[r] = h.reg[r];
    reg[r].base = dev[r];
    reg[r].device = UMBP_DP_CUDA;
    reg[r].device_id = 0;
  }
  umbp_kv_layout *lay;
  assert_int_equal(umbp_kv_layout_create(f.pool, reg, 2, &lay), 0);
  uint32_t src[4] = {0, 1, 2, 3}, dst[4] = {7, 6, 5, 4};
  umbp_dp_job *j;
  int rc = umbp_dp_ipc_pull(f.e, lay, 0, 3, 4, src, dst, &j);
  if (rc) printf("# %s\n", umbp_last_error());
  assert_int_equal(rc, 0);
  assert_int_equal(umbp_dp_job_wait(j, 20000), 0);
  if (umbp_dp_job_status(j)) printf("# %s\n", umbp_dp_job_message(j, 0));
  assert_int_equal(umbp_dp_job_status(j), 0);
  umbp_dp_job_release(j);
  for (int r = 0; r < 2; r++)
    assert_int_equal(cudaMemcpy(h.mem[r], dev[r], 8 * 65536, cudaMemcpyDeviceToHost), cudaSuccess);
  for (unsigned i = 0; i < 4; i++) assert_true(kvc_check(&h, dst[i], 77, src[i]));
  kill(pid, SIGKILL);
  tu_wait(pid);
  close(fd);
  umbp_kv_layout_free(lay);
  for (int r = 0; r < 2; r++) cudaFree(dev[r]);
  kvc_free(&h);
  gfx_close(&f);
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
      cmocka_unit_test(test_d2h_h2d),
      cmocka_unit_test(test_ipc_pull),
      cmocka_unit_test(test_bench_cuda),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
