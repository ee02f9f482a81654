/* SPDX-License-Identifier: Apache-2.0 */
/*
 * dp_kernel.cu — gather/scatter of KV block ranges between device memory and
 * the pool's registered host mapping, by the GPU's own threads.
 *
 * Why a kernel: a block object is the concatenation of one range per layer
 * and K/V (16-32 KiB each for common models), and the copy engines pay a
 * fixed cost per range: cudaMemcpyBatchAsync of 13-16 KiB ranges moved 3 GB/s
 * host->device on an H200 (PCIe 5 x16), a pinned cudaMemcpy of the same bytes
 * 53 GB/s. Here one CTA copies one (block, region) range with 16-byte loads
 * and stores, and thousands of CTAs keep enough PCIe reads in flight.
 *
 * Host memory is read with ld.global.cv (no cached copy can be stale: the
 * CPU of another process may have written the slot since an earlier launch)
 * and written with st.global.wt; device memory is streamed (evict-first) so
 * the copy leaves the model's working set in L2. Completion and visibility to
 * the host are the stream event's (dp_cuda.c records it after the launches).
 */
#include "dp_kernel.h"

#define THREADS 256
#define UNROLL 4

__global__ void __launch_bounds__(THREADS) dp_kc_copy(const __grid_constant__ struct dp_kc_params p) {
  const unsigned b = blockIdx.x, r = blockIdx.y;
  const struct dp_kc_reg *R = &p.reg[r];
  char *dev = (char *)(uintptr_t)(R->dev + (uint64_t)p.blk[b] * R->stride);
  char *host = (char *)(uintptr_t)(p.host[b] + R->obj_off);
  const uint64_t n = R->bytes;
  if ((((uintptr_t)dev | (uintptr_t)host | n) & 15) == 0) {
    const uint64_t n16 = n >> 4;
    uint64_t i = threadIdx.x;
    if (p.to_host) {
      const uint4 *s = (const uint4 *)dev;
      uint4 *d = (uint4 *)host;
      for (; i + (UNROLL - 1) * THREADS < n16; i += UNROLL * THREADS) {
        uint4 v[UNROLL];
#pragma unroll
        for (int k = 0; k < UNROLL; k++) v[k] = __ldcs(s + i + k * THREADS);
#pragma unroll
        for (int k = 0; k < UNROLL; k++) __stwt(d + i + k * THREADS, v[k]);
      }
      for (; i < n16; i += THREADS) __stwt(d + i, __ldcs(s + i));
    } else {
      const uint4 *s = (const uint4 *)host;
      uint4 *d = (uint4 *)dev;
      for (; i + (UNROLL - 1) * THREADS < n16; i += UNROLL * THREADS) {
        uint4 v[UNROLL];
#pragma unroll
        for (int k = 0; k < UNROLL; k++) v[k] = __ldcv(s + i + k * THREADS);
#pragma unroll
        for (int k = 0; k < UNROLL; k++) __stcs(d + i + k * THREADS, v[k]);
      }
      for (; i < n16; i += THREADS) __stcs(d + i, __ldcv(s + i));
    }
    return;
  }
  /* Unaligned ranges (odd sizes): byte by byte, still one CTA per range. */
  const char *s = p.to_host ? dev : host;
  char *d = p.to_host ? host : dev;
  for (uint64_t i = threadIdx.x; i < n; i += THREADS) {
    if (p.to_host) __stwt((signed char *)d + i, __ldcs((const signed char *)s + i));
    else __stcs((signed char *)d + i, __ldcv((const signed char *)s + i));
  }
}

extern "C" cudaError_t dp_kc_launch(const struct dp_kc_params *p, cudaStream_t s) {
  if (p->nblk == 0 || p->nreg == 0) return cudaSuccess;
  dp_kc_copy<<<dim3(p->nblk, p->nreg), THREADS, 0, s>>>(*p);
  return cudaGetLastError();
}

extern "C" cudaError_t dp_kc_usable(void) {
  cudaFuncAttributes a;
  return cudaFuncGetAttributes(&a, dp_kc_copy);
}
