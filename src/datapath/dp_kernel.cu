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
 * and stores (four 16-byte loads in flight per thread).
 *
 * Why few CTAs: a launch's grid is a handful of CTAs (umbp_dp_opts.
 * cuda_kernel_ctas, default 16) striding over its ranges, not one CTA per
 * range. On the H200, 16 CTAs per launch moved 0.74-0.88x of a pinned
 * cudaMemcpy, while one CTA per range (16384 CTAs for 256 MiB of 16 KiB
 * ranges) filled every SM and slowed a concurrent kernel 5-10x; the model's
 * kernels must keep the GPU while the pool copies. Even so the kernel's
 * device->host writes slowed a concurrent HBM-streaming kernel about 3x
 * (host->device reads about 1.5x), which is why auto mode stores through the
 * copy engines (docs/datapath.md).
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

/* Slot (host) words: read with .cv, written through (.wt); device words
 * streamed (.cs). TO_HOST: device -> host. */
template <bool TO_HOST> static __device__ __forceinline__ uint4 ld16(const uint4 *p) {
  return TO_HOST ? __ldcs(p) : __ldcv(p);
}
template <bool TO_HOST> static __device__ __forceinline__ void st16(uint4 *p, uint4 v) {
  if (TO_HOST) __stwt(p, v);
  else __stcs(p, v);
}

template <bool TO_HOST> static __device__ __forceinline__ void copy16(const uint4 *s, uint4 *d, uint64_t n16) {
  uint64_t i = threadIdx.x;
  for (; i + (UNROLL - 1) * THREADS < n16; i += UNROLL * THREADS) {
    uint4 v[UNROLL];
#pragma unroll
    for (int k = 0; k < UNROLL; k++) v[k] = ld16<TO_HOST>(s + i + k * THREADS);
#pragma unroll
    for (int k = 0; k < UNROLL; k++) st16<TO_HOST>(d + i + k * THREADS, v[k]);
  }
  for (; i < n16; i += THREADS) st16<TO_HOST>(d + i, ld16<TO_HOST>(s + i));
}

/* Copy one range: n bytes between device address dev and host address host. */
static __device__ __forceinline__ void copy_range(char *dev, char *host, uint64_t n, bool to_host) {
  if ((((uintptr_t)dev | (uintptr_t)host | n) & 15) == 0) {
    if (to_host) copy16<true>((const uint4 *)dev, (uint4 *)host, n >> 4);
    else copy16<false>((const uint4 *)host, (uint4 *)dev, n >> 4);
    return;
  }
  /* Unaligned ranges (odd sizes): byte by byte. */
  for (uint64_t i = threadIdx.x; i < n; i += THREADS) {
    if (to_host) __stwt((signed char *)host + i, __ldcs((const signed char *)dev + i));
    else __stcs((signed char *)dev + i, __ldcv((const signed char *)host + i));
  }
}

/* A small grid strides over the launch's (block, region) ranges, block-major
 * (consecutive ranges are adjacent in the slot). */
__global__ void __launch_bounds__(THREADS) dp_kc_copy(const __grid_constant__ struct dp_kc_params p) {
  const unsigned total = p.nblk * p.nreg;
  for (unsigned t = blockIdx.x; t < total; t += gridDim.x) {
    const unsigned b = t / p.nreg, r = t - b * p.nreg;
    const struct dp_kc_reg *R = &p.reg[r];
    copy_range((char *)(uintptr_t)(R->dev + (uint64_t)p.blk[b] * R->stride),
               (char *)(uintptr_t)(p.host[b] + R->obj_off), R->bytes, p.to_host != 0);
  }
}

extern "C" cudaError_t dp_kc_launch(const struct dp_kc_params *p, unsigned ctas, cudaStream_t s) {
  const unsigned total = p->nblk * p->nreg;
  if (total == 0) return cudaSuccess;
  dp_kc_copy<<<total < ctas ? total : ctas, THREADS, 0, s>>>(*p);
  return cudaGetLastError();
}

extern "C" cudaError_t dp_kc_usable(void) {
  cudaFuncAttributes a;
  return cudaFuncGetAttributes(&a, dp_kc_copy);
}
