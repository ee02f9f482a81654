/* SPDX-License-Identifier: Apache-2.0 */
/* bench_victim.cu — the "model" kernel of `umbp bench copy --cuda --victim`:
 * a grid of 4 CTAs of 512 threads per SM streams a device buffer from HBM
 * (as a decode step streams the weights), so that the benchmark can report
 * how much a concurrent pool copy slows it. Built by nvcc. */
#include <cuda_runtime_api.h>
#include <stdint.h>

__global__ void bench_victim_kernel(const float4 *in, size_t n, float *out) {
  float acc = 0;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    float4 v = __ldcs(in + i);
    acc += v.x + v.y + v.z + v.w;
  }
  if (acc == 12345.0f) out[0] = acc; /* keeps the loads; the buffer is zeros */
}

extern "C" cudaError_t bench_victim_launch(const void *buf, size_t bytes, float *out, cudaStream_t s) {
  int dev = 0, nsm = 0;
  cudaGetDevice(&dev);
  cudaError_t e = cudaDeviceGetAttribute(&nsm, cudaDevAttrMultiProcessorCount, dev);
  if (e != cudaSuccess) return e;
  bench_victim_kernel<<<nsm * 4, 512, 0, s>>>((const float4 *)buf, bytes / 16, out);
  return cudaGetLastError();
}
