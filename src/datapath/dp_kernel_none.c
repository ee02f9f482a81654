/* SPDX-License-Identifier: Apache-2.0 */
/* dp_kernel_none.c — a CUDA build without nvcc (-Dcopy_kernel=disabled, or
 * nvcc not found): no copy kernel, every CUDA copy goes to the copy engines. */
#include "datapath/dp_kernel.h"

cudaError_t dp_kc_launch(const struct dp_kc_params *p, unsigned ctas, cudaStream_t s) {
  (void)p;
  (void)ctas;
  (void)s;
  return cudaErrorNotSupported;
}

cudaError_t dp_kc_usable(void) { return cudaErrorNotSupported; }
