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

/* One launch copies nblk blocks x nreg regions. For block b and region r the
 * device side is reg[r].dev + blk[b] * reg[r].stride and the other side is
 * host[b] + reg[r].obj_off + oblk[b] * reg[r].ostride, reg[r].bytes long:
 *   store (DP_KC_STORE, device -> slot) and load (DP_KC_LOAD, slot ->
 *   device): host[b] is the slot's address in the pool's registered mapping
 *   (its device address equals its host address), obj_off the region's
 *   offset in the block object, oblk and ostride 0;
 *   pull (DP_KC_PULL, another rank's device memory -> device): host[b] 0,
 *   obj_off the exporter's region base as opened here, oblk[b] the source
 *   block, ostride the exporter's stride.
 * The parameters travel by value in the launch (under the 4 KiB parameter
 * limit of every architecture), so nothing has to outlive the call. */
#define DP_KC_MAX_REG 40
#define DP_KC_MAX_BLK 128

enum { DP_KC_STORE = 0, DP_KC_LOAD = 1, DP_KC_PULL = 2 };

struct dp_kc_reg {
  uint64_t dev, stride, obj_off, bytes, ostride;
};

struct dp_kc_params {
  uint32_t nreg, nblk;
  uint32_t dir; /* DP_KC_STORE, DP_KC_LOAD or DP_KC_PULL */
  uint32_t pad;
  uint32_t blk[DP_KC_MAX_BLK];
  uint32_t oblk[DP_KC_MAX_BLK];
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
