/* SPDX-License-Identifier: Apache-2.0 */
/*
 * dp_kernel.cu — gather/scatter of KV block ranges between device memory and
 * the pool's registered host mapping, by the GPU's own threads.
 *
 * Why a kernel: a block object is the concatenation of one range per layer
 * and K/V (16-32 KiB each for common models), and the copy engines pay a
 * fixed cost per range, so ranges that small move at a small fraction of a
 * pinned cudaMemcpy of the same bytes. Here one CTA copies one (block,
 * region) range with 16-byte loads and stores (four 16-byte loads in flight
 * per thread).
 *
 * Why few CTAs: a launch's grid is a handful of CTAs (umbp_dp_opts.
 * cuda_kernel_ctas, default 16) striding over its ranges, not one CTA per
 * range: one CTA per range fills every SM and slows the model's kernels,
 * which must keep the GPU while the pool copies. Even a few CTAs' device->host
 * writes slow a concurrent HBM-streaming kernel several times more than the
 * copy engines do, which is why auto mode stores through the copy engines.
 * The figures behind each choice: docs/datapath.md, "Measured on a GPU".
 *
 * Host memory is read with ld.global.cv (no cached copy can be stale: the
 * CPU of another process may have written the slot since an earlier launch)
 * and written with st.global.wt; device memory is streamed (evict-first) so
 * the copy leaves the model's working set in L2; pulls (another rank's
 * device memory, opened through CUDA IPC) stream both sides. Completion and
 * visibility to the host are the stream event's (dp_cuda.c records it after
 * the launches).
 */
#include "dp_kernel.h"

#define THREADS 256
#define UNROLL 4

/* Slot (host) words: read with .cv, written through (.wt); device words
 * streamed (.cs), the exporter's too. D: DP_KC_STORE, _LOAD or _PULL. */
template <int D> static __device__ __forceinline__ uint4 ld16(const uint4 *p) {
  return D == DP_KC_LOAD ? __ldcv(p) : __ldcs(p);
}
template <int D> static __device__ __forceinline__ void st16(uint4 *p, uint4 v) {
  if (D == DP_KC_STORE) __stwt(p, v);
  else __stcs(p, v);
}
template <int D> static __device__ __forceinline__ signed char ld1(const signed char *p) {
  return D == DP_KC_LOAD ? __ldcv(p) : __ldcs(p);
}
template <int D> static __device__ __forceinline__ void st1(signed char *p, signed char v) {
  if (D == DP_KC_STORE) __stwt(p, v);
  else __stcs(p, v);
}

/* Copy n bytes from s to d: 16-byte words, four in flight per thread, when
 * both addresses and n are multiples of 16; bytes otherwise (odd sizes). */
template <int D> static __device__ __forceinline__ void copy_range(const char *s, char *d, uint64_t n) {
  if ((((uintptr_t)s | (uintptr_t)d | n) & 15) == 0) {
    const uint4 *s16 = (const uint4 *)s;
    uint4 *d16 = (uint4 *)d;
    const uint64_t n16 = n >> 4;
    uint64_t i = threadIdx.x;
    for (; i + (UNROLL - 1) * THREADS < n16; i += UNROLL * THREADS) {
      uint4 v[UNROLL];
#pragma unroll
      for (int k = 0; k < UNROLL; k++) v[k] = ld16<D>(s16 + i + k * THREADS);
#pragma unroll
      for (int k = 0; k < UNROLL; k++) st16<D>(d16 + i + k * THREADS, v[k]);
    }
    for (; i < n16; i += THREADS) st16<D>(d16 + i, ld16<D>(s16 + i));
    return;
  }
  for (uint64_t i = threadIdx.x; i < n; i += THREADS)
    st1<D>((signed char *)d + i, ld1<D>((const signed char *)s + i));
}

/* A small grid strides over the launch's (block, region) ranges, block-major
 * (consecutive ranges are adjacent in the slot). */
template <int D> __global__ void __launch_bounds__(THREADS) dp_kc_copy(const __grid_constant__ struct dp_kc_params p) {
  const unsigned total = p.nblk * p.nreg;
  for (unsigned t = blockIdx.x; t < total; t += gridDim.x) {
    const unsigned b = t / p.nreg, r = t - b * p.nreg;
    const struct dp_kc_reg *R = &p.reg[r];
    char *dev = (char *)(uintptr_t)(R->dev + (uint64_t)p.blk[b] * R->stride);
    char *other = (char *)(uintptr_t)(p.host[b] + R->obj_off + (uint64_t)p.oblk[b] * R->ostride);
    if (D == DP_KC_STORE) copy_range<D>(dev, other, R->bytes);
    else copy_range<D>(other, dev, R->bytes);
  }
}

extern "C" cudaError_t dp_kc_launch(const struct dp_kc_params *p, unsigned ctas, cudaStream_t s) {
  const unsigned total = p->nblk * p->nreg;
  if (total == 0) return cudaSuccess;
  const unsigned grid = total < ctas ? total : ctas;
  switch (p->dir) {
  case DP_KC_STORE: dp_kc_copy<DP_KC_STORE><<<grid, THREADS, 0, s>>>(*p); break;
  case DP_KC_LOAD: dp_kc_copy<DP_KC_LOAD><<<grid, THREADS, 0, s>>>(*p); break;
  case DP_KC_PULL: dp_kc_copy<DP_KC_PULL><<<grid, THREADS, 0, s>>>(*p); break;
  default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

extern "C" cudaError_t dp_kc_usable(void) {
  cudaFuncAttributes a;
  return cudaFuncGetAttributes(&a, dp_kc_copy<DP_KC_LOAD>);
}
