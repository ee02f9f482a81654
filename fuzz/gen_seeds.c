/* SPDX-License-Identifier: Apache-2.0 */
/*
 * gen_seeds DIR — write a seed corpus for fuzz_attach from real pools: small
 * pools of several shapes (4 and 8 slots, fresh, with published blocks
 * and namespaces, with a registry slot of a process that died) are created,
 * and each file is written in fuzz_attach's input format: the header page, a
 * flags byte, and patches covering every non-zero byte past the header.
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "shm/pool_internal.h"
#include "umbp/index.h"
#include "umbp/pool.h"

static int emit(const char *dir, const char *tag, const char *pool) {
  char path[256], out[512];
  snprintf(path, sizeof path, "/dev/shm/umbp.%s", pool);
  int fd = open(path, O_RDONLY);
  if (fd < 0) return -1;
  struct stat st;
  fstat(fd, &st);
  unsigned char *buf = malloc((size_t)st.st_size);
  if (!buf || pread(fd, buf, (size_t)st.st_size, 0) != st.st_size) return -1;
  close(fd);
  snprintf(out, sizeof out, "%s/seed-%s", dir, tag);
  FILE *f = fopen(out, "wb");
  if (!f) return -1;
  fwrite(buf, 1, UMBP_HEADER_BYTES, f);
  fputc(0, f); /* flags */
  size_t npatch = 0;
  for (size_t i = UMBP_HEADER_BYTES; i < (size_t)st.st_size;) {
    if (!buf[i]) {
      i++;
      continue;
    }
    size_t j = i;
    while (j < (size_t)st.st_size && j - i < 255 && (buf[j] || (j + 1 < (size_t)st.st_size && buf[j + 1]))) j++;
    uint32_t off = (uint32_t)i;
    fwrite(&off, 4, 1, f);
    fputc((int)(j - i), f);
    fwrite(buf + i, 1, j - i, f);
    npatch++;
    i = j;
  }
  fclose(f);
  printf("%s: %lld-byte pool, %zu patches\n", out, (long long)st.st_size, npatch);
  free(buf);
  return 0;
}

static umbp_pool *mk(const char *pool, unsigned slots) {
  umbp_pool_params pp;
  umbp_pool_params_init(&pp);
  pp.slot_size = 4096;
  pp.capacity = (uint64_t)slots * 4096;
  pp.no_prefault = true;
  pp.event_capacity = 16;
  pp.mempolicy = UMBP_MPOL_NONE;
  /* one partition on node 0: every machine has it (the header validator
   * treats each partition alike, and the fuzzer varies n_partitions) */
  pp.n_numa_nodes = 1;
  pp.numa_nodes[0] = 0;
  umbp_pool *p;
  umbp_pool_destroy(pool);
  if (umbp_pool_create(pool, &pp, &p)) {
    fprintf(stderr, "create %s: %s\n", pool, umbp_last_error());
    exit(1);
  }
  return p;
}

static void fill(umbp_pool *p, unsigned n) {
  uint32_t ns;
  umbp_ns_register(p, "seed", &ns);
  umbp_events_enable_stored(p, true);
  for (unsigned i = 0; i < n; i++) {
    umbp_key k;
    memset(&k, 0, sizeof k);
    k.ns = ns;
    k.hash_len = 8;
    memcpy(k.hash, &i, sizeof i);
    uint32_t s;
    if (umbp_reserve(p, -1, ns, &s) == 0) umbp_publish(p, s, &k);
  }
  umbp_counters_flush(p);
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: gen_seeds DIR\n");
    return 2;
  }
  char pool[64];
  snprintf(pool, sizeof pool, "fzseed-%d", (int)getpid());
  umbp_pool *p = mk(pool, 4);
  umbp_pool_detach(p);
  emit(argv[1], "fresh-4slots", pool);
  p = mk(pool, 8);
  umbp_pool_detach(p);
  emit(argv[1], "fresh-8slots", pool);
  p = mk(pool, 8);
  fill(p, 5);
  umbp_key k;
  memset(&k, 0, sizeof k);
  k.hash_len = 8;
  uint32_t s;
  umbp_lookup_pin(p, &k, &s);
  umbp_pool_detach(p);
  emit(argv[1], "published", pool);
  /* a process that attached, pinned, reserved, and died: its registry slot is claimed but dead */
  p = mk(pool, 8);
  fill(p, 4);
  umbp_pool_detach(p);
  pid_t c = fork();
  if (c == 0) {
    umbp_pool *q;
    if (umbp_pool_attach(pool, NULL, &q)) _exit(1);
    uint32_t r;
    umbp_reserve(q, -1, 0, &r);
    umbp_lookup_pin(q, &k, &r);
    _exit(0); /* no detach: leaves a dead registry slot */
  }
  waitpid(c, NULL, 0);
  emit(argv[1], "dead-proc", pool);
  umbp_pool_destroy(pool);
  return 0;
}
