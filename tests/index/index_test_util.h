/* SPDX-License-Identifier: Apache-2.0 */
/* Keys and checksummed block contents shared by the index tests and helpers. */
#ifndef UMBP_INDEX_TEST_UTIL_H
#define UMBP_INDEX_TEST_UTIL_H

#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "umbp/index.h"

static inline uint64_t itu_mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

static inline umbp_key itu_key(uint32_t ns, uint64_t id, uint16_t rank) {
  umbp_key k;
  memset(&k, 0, sizeof k);
  k.ns = ns;
  k.tp_rank = rank;
  k.hash_len = 32;
  for (int i = 0; i < 4; i++) {
    uint64_t w = itu_mix(id * 4 + (uint64_t)i);
    memcpy(k.hash + 8 * i, &w, 8);
  }
  return k;
}

/* Fill n bytes with a pattern derived from the key: any torn or foreign
 * content fails itu_check(). */
static inline void itu_fill(void *dst, size_t n, const umbp_key *k) {
  uint64_t s;
  memcpy(&s, k->hash, 8);
  s ^= k->tp_rank;
  uint64_t *w = dst;
  for (size_t i = 0; i < n / 8; i++) w[i] = itu_mix(s + i);
}

static inline bool itu_check(const void *src, size_t n, const umbp_key *k) {
  uint64_t s;
  memcpy(&s, k->hash, 8);
  s ^= k->tp_rank;
  const uint64_t *w = src;
  for (size_t i = 0; i < n / 8; i++)
    if (w[i] != itu_mix(s + i)) return false;
  return true;
}

#endif
