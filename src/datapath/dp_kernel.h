/* SPDX-License-Identifier: Apache-2.0 */
/* dp_kernel.h — the gather/scatter copy kernel of the CUDA backend
 * (dp_kernel.cu, built by nvcc), called from C (dp_cuda.c). Internal. */
#ifndef UMBP_DP_KERNEL_H
#define UMBP_DP_KERNEL_H

#include <stdint.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

/* One launch copies nblk blocks x nreg regions: for block b and region r,
 * bytes reg[r].bytes between device address reg[r].dev + blk[b] * stride and
 * host address host[b] + reg[r].obj_off (mapped pinned memory: the pool's
 * registered mapping, whose device address equals its host address). The
 * parameters travel by value in the launch (under the 4 KiB parameter limit
 * of every architecture), so nothing has to outlive the call. */
#define DP_KC_MAX_REG 48
#define DP_KC_MAX_BLK 160

struct dp_kc_reg {
  uint64_t dev, stride, obj_off, bytes;
};

struct dp_kc_params {
  uint32_t nreg, nblk;
  uint32_t to_host; /* 1: device -> host (store); 0: host -> device (load) */
  uint32_t pad;
  uint32_t blk[DP_KC_MAX_BLK];
  uint64_t host[DP_KC_MAX_BLK];
  struct dp_kc_reg reg[DP_KC_MAX_REG];
};

/* Queue one launch of at most `ctas` CTAs on stream s (the current device
 * must be the regions'). Returns the launch's error (cudaSuccess when queued). */
cudaError_t dp_kc_launch(const struct dp_kc_params *p, unsigned ctas, cudaStream_t s);
/* cudaSuccess when this build holds code the current device can run. */
cudaError_t dp_kc_usable(void);

#ifdef __cplusplus
}
#endif
#endif
