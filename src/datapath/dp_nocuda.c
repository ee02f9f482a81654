/* SPDX-License-Identifier: Apache-2.0 */
/* dp_nocuda.c — the CUDA backend's entry points in a build without cudart:
 * every CUDA request fails with -ENOSYS and a sentence saying why. */
#include <stdio.h>

#include "datapath/dp_internal.h"

#define NOT_BUILT "the CUDA backend is not built (cudart was not found at build time; install the CUDA " \
                  "toolkit and reconfigure with -Dcuda=enabled)"

int dp_cuda_probe(char *why, size_t n) {
  if (why && n) snprintf(why, n, "%s", NOT_BUILT);
  return -ENOSYS;
}
int dp_cuda_engine_init(umbp_dp_engine *eng, const umbp_dp_opts *opts) {
  (void)eng;
  (void)opts;
  return -ENOSYS;
}
void dp_cuda_engine_fini(umbp_dp_engine *eng) { (void)eng; }
int dp_cuda_submit(struct umbp_dp_job *job) {
  for (unsigned i = 0; i < job->n; i++) dp_job_fail_key(job, i, -ENOSYS, NOT_BUILT);
  return -ENOSYS;
}
int dp_cuda_progress(struct umbp_dp_job *job) {
  (void)job;
  return 1;
}
void dp_cuda_job_free(struct umbp_dp_job *job) { (void)job; }
int dp_cuda_registration(umbp_dp_engine *eng, uint64_t *ret_done, uint64_t *ret_total) {
  (void)eng;
  (void)ret_done;
  (void)ret_total;
  return umbp_fail(-ENOSYS, "dp: %s", NOT_BUILT);
}
int dp_cuda_ipc_export(umbp_dp_engine *eng, const umbp_kv_layout *lay, unsigned rank) {
  (void)eng;
  (void)lay;
  (void)rank;
  return umbp_fail(-ENOSYS, "dp ipc export: %s", NOT_BUILT);
}
void dp_cuda_copy_calls(uint64_t *ret_batches, uint64_t *ret_ranges, uint64_t *ret_kernels) {
  *ret_batches = 0;
  *ret_ranges = 0;
  *ret_kernels = 0;
}
