/* SPDX-License-Identifier: Apache-2.0 */
/* Exec'd helper of the data-path tests (each process maps the pool at its own
 * address):
 *   dp_helper store POOL RANK      store blocks 0..15 of a K/V-split layout
 *   dp_helper load POOL RANK       load them into blocks 16..31, check bytes
 *   dp_helper export POOL RANK N   export N fake IPC regions, print
 *                                  "exported", then wait to be killed
 *   dp_helper gpu-export POOL RANK export K/V regions of one cuda:0
 *                                  allocation, print "exported", wait
 *   dp_helper gpu-store POOL RANK  store 16 blocks from cuda:0 through the
 *                                  copy kernel, print "stored ...", exit
 *   dp_helper gpu-bad-copy POOL RANK MODE  store from freed device memory
 *                                  with copy mode MODE (umbp_dp_cuda_copy),
 *                                  print "status S present P: MESSAGE"
 * Exit 0 on success, 1 on failure (a line on stdout says why). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include "datapath/dp_internal.h"
#include "dp_test_util.h"
#include "umbp/datapath.h"
#include "umbp_config.h"
#if UMBP_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

#define NB 16

static int fail(const char *what, int rc) {
  printf("%s: %d %s\n", what, rc, umbp_last_error());
  fflush(stdout);
  return 1;
}

#if UMBP_HAVE_CUDA
/* Layout of reg[0..n) and an engine in copy mode `mode` whose registration
 * of the pool finished; on failure a line says why and the result is != 0. */
static int gpu_engine(umbp_pool *pool, const umbp_kv_region *reg, unsigned n, int mode, umbp_kv_layout **ret_lay,
                      umbp_dp_engine **ret_e) {
  int rc = umbp_kv_layout_create(pool, reg, n, ret_lay);
  if (rc) return fail("layout", rc);
  umbp_dp_opts o;
  umbp_dp_opts_init(&o);
  o.cuda_copy = mode;
  if ((rc = umbp_dp_engine_create(pool, &o, ret_e))) return fail("engine", rc);
  while ((rc = umbp_dp_cuda_registration(*ret_e, NULL, NULL)) == -EINPROGRESS) usleep(1000);
  return rc ? fail("registration", rc) : 0;
}
#endif

int main(int argc, char **argv) {
  prctl(PR_SET_PDEATHSIG, SIGKILL); /* never outlive a test that failed before killing us */
  if (argc < 4) return 2;
  umbp_attach_opts ao;
  umbp_attach_opts_init(&ao);
  ao.role = UMBP_ROLE_WORKER;
  ao.rank = atoi(argv[3]);
  umbp_pool *pool;
  int rc = umbp_pool_attach(argv[2], &ao, &pool);
  if (rc) return fail("attach", rc);
  if (!strcmp(argv[1], "export")) {
    unsigned n = argc > 4 ? (unsigned)atoi(argv[4]) : 1;
    struct dp_ipc_desc d[16];
    for (unsigned r = 0; r < n && r < 16; r++) {
      memset(&d[r], 0, sizeof d[r]);
      d[r].rank = (unsigned)ao.rank;
      d[r].region = r;
      d[r].n_regions = n;
      d[r].block_bytes = 4096;
      d[r].stride = 4096;
      d[r].block_count = 8;
      memset(d[r].handle, 0x40 + (int)r, sizeof d[r].handle);
    }
    rc = dp_ipc_publish(pool, (unsigned)ao.rank, d, n);
    if (rc) return fail("publish", rc);
    printf("exported\n");
    fflush(stdout);
    for (;;) pause();
  }
#if UMBP_HAVE_CUDA
  if (!strcmp(argv[1], "gpu-export")) {
    /* K and V of 8 blocks of 64 KiB on cuda:0, both inside ONE allocation
     * and neither at its start (as a framework's caching allocator and a
     * [2, blocks, ...] KV tensor place them): K at +4 KiB, V right after. */
    uint64_t bytes[2] = {65536, 65536};
    static struct kvc h;
    kvc_init(&h, 2, 8, bytes, 0, 1);
    umbp_kv_region reg[2];
    char *d;
    if (cudaMalloc((void **)&d, 4096 + 2 * 8 * 65536) != cudaSuccess) return fail("cudaMalloc", -ENOMEM);
    if (cudaMemset(d, 0xee, 4096) != cudaSuccess) return fail("cudaMemset", -EIO);
    for (unsigned b = 0; b < 8; b++) kvc_fill(&h, b, 77, b);
    for (int r = 0; r < 2; r++) {
      char *base = d + 4096 + (uint64_t)r * 8 * 65536;
      if (cudaMemcpy(base, h.mem[r], 8 * 65536, cudaMemcpyHostToDevice) != cudaSuccess) return fail("H2D", -EIO);
      reg[r] = h.reg[r];
      reg[r].base = base;
      reg[r].device = UMBP_DP_CUDA;
      reg[r].device_id = 0;
    }
    umbp_kv_layout *lay;
    umbp_dp_engine *e;
    if ((rc = umbp_kv_layout_create(pool, reg, 2, &lay))) return fail("layout", rc);
    if ((rc = umbp_dp_engine_create(pool, NULL, &e))) return fail("engine", rc);
    if ((rc = umbp_dp_ipc_export(e, lay, (unsigned)ao.rank))) return fail("export", rc);
    printf("exported\n");
    fflush(stdout);
    for (;;) pause();
  }
  if (!strcmp(argv[1], "gpu-store")) {
    /* Store blocks 0..15 of 4 layers x K,V (16 KiB each) from cuda:0 through
     * the copy kernel under keys (ns "dp-gpu-mp", seed 55), then exit. */
    uint64_t bytes[8];
    for (int i = 0; i < 8; i++) bytes[i] = 16384;
    static struct kvc h;
    kvc_init(&h, 8, NB, bytes, 0, 1);
    umbp_kv_region reg[8];
    for (unsigned b = 0; b < NB; b++) kvc_fill(&h, b, 55, b);
    if (kvc_to_cuda(&h, reg) != cudaSuccess) return fail("cudaMalloc/H2D", -ENOMEM);
    uint32_t ns;
    if ((rc = umbp_ns_register(pool, "dp-gpu-mp", &ns))) return fail("ns", rc);
    umbp_kv_layout *lay;
    umbp_dp_engine *e;
    if ((rc = gpu_engine(pool, reg, 8, UMBP_DP_CUDA_COPY_KERNEL, &lay, &e))) return 1;
    uint32_t ids[NB];
    umbp_key k[NB];
    for (unsigned i = 0; i < NB; i++) ids[i] = i, k[i] = dp_key(ns, 55, i);
    umbp_dp_job *j;
    if ((rc = umbp_dp_store(e, lay, 0, -1, NB, ids, k, 0, &j))) return fail("store", rc);
    if ((rc = umbp_dp_job_wait(j, 20000)) || (rc = umbp_dp_job_status(j))) return fail("store job", rc);
    umbp_dp_job_release(j);
    uint64_t nb, nr, nk;
    dp_cuda_copy_calls(&nb, &nr, &nk);
    printf("stored %d blocks with %llu kernel launches\n", NB, (unsigned long long)nk);
    fflush(stdout);
    umbp_dp_engine_destroy(e);
    umbp_kv_layout_free(lay);
    umbp_pool_detach(pool);
    return 0;
  }
  if (!strcmp(argv[1], "gpu-bad-copy")) {
    /* Store from device memory that was freed after the layout was made:
     * the copy must fail per key with CUDA's error string and publish
     * nothing. Runs in its own process in case the driver does worse. */
    uint64_t bytes[2] = {16384, 16384};
    int mode = argc > 4 ? atoi(argv[4]) : UMBP_DP_CUDA_COPY_DMA;
    static struct kvc h;
    kvc_init(&h, 2, 4, bytes, 0, 1);
    umbp_kv_region reg[2];
    for (int r = 0; r < 2; r++) {
      void *dv;
      /* Copy engines: a small allocation, whose freed range the runtime
       * still knows as device memory and refuses ("invalid argument"); an
       * address it does not know is taken for host memory. Kernel: 32 MiB,
       * an allocation of its own that cudaFree unmaps, so the kernel faults
       * (a small one may stay mapped in the driver's sub-allocator). */
      size_t sz = mode == UMBP_DP_CUDA_COPY_DMA ? 4 * 16384 : 32u << 20;
      if (cudaMalloc(&dv, sz) != cudaSuccess) return fail("cudaMalloc", -ENOMEM);
      reg[r] = h.reg[r];
      reg[r].base = dv;
      reg[r].device = UMBP_DP_CUDA;
      reg[r].device_id = 0;
    }
    uint32_t ns;
    if ((rc = umbp_ns_register(pool, "dp-bad", &ns))) return fail("ns", rc);
    umbp_kv_layout *lay;
    umbp_dp_engine *e;
    if ((rc = gpu_engine(pool, reg, 2, mode, &lay, &e))) return 1;
    for (int r = 0; r < 2; r++) cudaFree(reg[r].base);
    uint32_t ids[4] = {0, 1, 2, 3};
    umbp_key k[4];
    for (unsigned i = 0; i < 4; i++) k[i] = dp_key(ns, 5, i);
    umbp_dp_job *j;
    if ((rc = umbp_dp_store(e, lay, 0, -1, 4, ids, k, 0, &j))) return fail("store", rc);
    if ((rc = umbp_dp_job_wait(j, 20000))) return fail("wait", rc);
    int present = 0;
    for (unsigned i = 0; i < 4; i++) present += umbp_contains(pool, &k[i]);
    printf("status %d present %d: %s\n", umbp_dp_job_status(j), present, umbp_dp_job_message(j, 0));
    fflush(stdout);
    umbp_dp_job_release(j);
    umbp_dp_engine_destroy(e);
    umbp_kv_layout_free(lay);
    umbp_pool_detach(pool);
    return 0;
  }
#endif
  uint32_t ns;
  if ((rc = umbp_ns_register(pool, "dp-mp", &ns))) return fail("ns", rc);
  uint64_t bytes[8];
  for (int i = 0; i < 8; i++) bytes[i] = 8192 + (uint64_t)i * 1000; /* 4 layers x K,V */
  static struct kvc c;
  kvc_init(&c, 8, 2 * NB, bytes, 128, 1);
  umbp_kv_layout *lay;
  if ((rc = umbp_kv_layout_create(pool, c.reg, 8, &lay))) return fail("layout", rc);
  umbp_dp_engine *e;
  if ((rc = umbp_dp_engine_create(pool, NULL, &e))) return fail("engine", rc);
  uint32_t ids[NB];
  umbp_key keys[NB];
  for (unsigned i = 0; i < NB; i++) keys[i] = dp_key(ns, 42, i);
  umbp_dp_job *j;
  int ok = 1;
  if (!strcmp(argv[1], "store")) {
    for (unsigned i = 0; i < NB; i++) ids[i] = i, kvc_fill(&c, i, 42, i);
    if ((rc = umbp_dp_store(e, lay, 0, -1, NB, ids, keys, 0, &j))) return fail("store", rc);
    if ((rc = umbp_dp_job_wait(j, 20000)) || (rc = umbp_dp_job_status(j))) return fail("store job", rc);
    printf("stored %d blocks at %p\n", NB, (void *)umbp_slot_ptr(pool, 0));
    umbp_dp_job_release(j);
  } else {
    for (unsigned i = 0; i < NB; i++) ids[i] = 2 * NB - 1 - i;
    if ((rc = umbp_dp_load(e, lay, 0, NB, keys, ids, &j))) return fail("load", rc);
    if ((rc = umbp_dp_job_wait(j, 20000)) || (rc = umbp_dp_job_status(j))) return fail("load job", rc);
    umbp_dp_job_release(j);
    for (unsigned i = 0; i < NB; i++) ok &= kvc_check(&c, ids[i], 42, i);
    printf("loaded %d blocks at %p: %s\n", NB, (void *)umbp_slot_ptr(pool, 0), ok ? "byte-exact" : "MISMATCH");
  }
  umbp_dp_engine_destroy(e);
  umbp_kv_layout_free(lay);
  kvc_free(&c);
  umbp_pool_detach(pool);
  return ok ? 0 : 1;
}
