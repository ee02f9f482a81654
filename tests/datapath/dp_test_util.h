/* SPDX-License-Identifier: Apache-2.0 */
/* Helpers of the data-path tests: host KV caches with a checkable pattern. */
#ifndef UMBP_DP_TEST_UTIL_H
#define UMBP_DP_TEST_UTIL_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "umbp/datapath.h"
#include "umbp_config.h"
#if UMBP_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

/* A host KV cache: nreg regions of nblocks blocks, region r's blocks of
 * bytes[r] bytes at stride bytes[r] + pad. */
struct kvc {
  unsigned nreg, nblocks;
  umbp_kv_region reg[256];
  unsigned char *mem[256];
};

static inline void kvc_init(struct kvc *c, unsigned nreg, unsigned nblocks, const uint64_t *bytes, uint64_t pad,
                            int kv_split) {
  memset(c, 0, sizeof *c);
  c->nreg = nreg;
  c->nblocks = nblocks;
  for (unsigned r = 0; r < nreg; r++) {
    uint64_t stride = bytes[r] + pad;
    c->mem[r] = calloc(nblocks, stride);
    c->reg[r] = (umbp_kv_region){.base = c->mem[r], .block_bytes = bytes[r], .stride = stride,
                                 .block_count = nblocks, .device = UMBP_DP_CPU, .group = 0,
                                 .layer = kv_split ? r / 2 : r, .kind = kv_split ? (int)(r % 2) : UMBP_KV_KV};
  }
}

static inline void kvc_free(struct kvc *c) {
  for (unsigned r = 0; r < c->nreg; r++) free(c->mem[r]);
}

static inline unsigned char kvc_byte(uint32_t seed, unsigned r, unsigned b, uint64_t i) {
  uint64_t x = (uint64_t)seed * 0x9E3779B97F4A7C15ull ^ (uint64_t)r << 40 ^ (uint64_t)b << 20 ^ i;
  x ^= x >> 29;
  x *= 0xBF58476D1CE4E5B9ull;
  return (unsigned char)(x >> 32);
}

/* Fill block b of every region with the pattern of (seed, logical block lb). */
static inline void kvc_fill(struct kvc *c, unsigned b, uint32_t seed, unsigned lb) {
  for (unsigned r = 0; r < c->nreg; r++) {
    unsigned char *p = c->mem[r] + (uint64_t)b * c->reg[r].stride;
    for (uint64_t i = 0; i < c->reg[r].block_bytes; i++) p[i] = kvc_byte(seed, r, lb, i);
  }
}

/* 1 when block b holds the pattern of (seed, lb) and padding is untouched (0). */
static inline int kvc_check(const struct kvc *c, unsigned b, uint32_t seed, unsigned lb) {
  for (unsigned r = 0; r < c->nreg; r++) {
    const unsigned char *p = c->mem[r] + (uint64_t)b * c->reg[r].stride;
    for (uint64_t i = 0; i < c->reg[r].block_bytes; i++)
      if (p[i] != kvc_byte(seed, r, lb, i)) return 0;
    for (uint64_t i = c->reg[r].block_bytes; i < c->reg[r].stride; i++)
      if (p[i] != 0) return 0;
  }
  return 1;
}

static inline int kvc_is_zero(const struct kvc *c, unsigned b) {
  for (unsigned r = 0; r < c->nreg; r++)
    for (uint64_t i = 0; i < c->reg[r].stride; i++)
      if (c->mem[r][(uint64_t)b * c->reg[r].stride + i]) return 0;
  return 1;
}

static inline void kvc_zero(struct kvc *c) {
  for (unsigned r = 0; r < c->nreg; r++) memset(c->mem[r], 0, (size_t)c->nblocks * c->reg[r].stride);
}

#if UMBP_HAVE_CUDA
/* Device twins of c's regions on cuda:0: reg[r] is c->reg[r] with its base in
 * a new device buffer holding a copy of c's host bytes (zeros unless filled).
 * Returns cudaSuccess or the first CUDA error. Free with kvc_cuda_free. */
static inline cudaError_t kvc_to_cuda(const struct kvc *c, umbp_kv_region *reg) {
  for (unsigned r = 0; r < c->nreg; r++) {
    uint64_t len = (uint64_t)c->nblocks * c->reg[r].stride;
    reg[r] = c->reg[r];
    reg[r].device = UMBP_DP_CUDA;
    reg[r].device_id = 0;
    cudaError_t e = cudaMalloc(&reg[r].base, len);
    if (e == cudaSuccess) e = cudaMemcpy(reg[r].base, c->mem[r], len, cudaMemcpyHostToDevice);
    if (e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

static inline void kvc_cuda_free(umbp_kv_region *reg, unsigned nreg) {
  for (unsigned r = 0; r < nreg; r++) cudaFree(reg[r].base);
}
#endif

static inline umbp_key dp_key(uint32_t ns, uint32_t seed, unsigned i) {
  umbp_key k;
  memset(&k, 0, sizeof k);
  k.ns = ns;
  k.hash_len = 16;
  memcpy(k.hash, &seed, 4);
  memcpy(k.hash + 4, &i, 4);
  k.hash[8] = 0xd9;
  return k;
}

#endif
