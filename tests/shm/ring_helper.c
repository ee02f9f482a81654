/* SPDX-License-Identifier: Apache-2.0 */
/*
 * ring_helper - child process of the multi-process ring tests (test_ring mp).
 * It is exec'd, not just forked, so that it maps the segment at its own address.
 *
 *   ring_helper SHM_NAME prod|cons CHILD PROD_INDEX BURST STOP_AT
 *
 * prod: enqueue values 0..per_prod-1 of producer PROD_INDEX (ring_mp.h), BURST
 *       at a time (1: the single-element API), spinning while the ring is full.
 * cons: dequeue BURST at a time and mark every value in the shared bitmap,
 *       until the parent sets ctl->stop and the ring is drained.
 * STOP_AT > 0: on this process's STOP_AT-th successful claim (the ring's test
 *       hook, i.e. right after the claim CAS and before anything else), record
 *       the claims made in the current call and raise(SIGSTOP); the parent then
 *       SIGKILLs it.  Exit 99 if it is ever resumed instead.
 * Exit: 0 done, 2 usage, 3 cannot attach / bad segment.
 */
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "shm/ring.h"
#include "ring_mp.h"

#ifndef UMBP_RING_TEST_HOOKS
#error "ring_helper needs -DUMBP_RING_TEST_HOOKS"
#endif

static uint64_t g_claims, g_stop_at;
static unsigned g_inflight;
static struct ring_mp_child *g_me;

static void stop_hook(int point, void *ring, uint64_t pos, uint16_t owner) {
  (void)point;
  (void)ring;
  (void)pos;
  (void)owner;
  g_claims++;
  g_inflight++;
  if (g_claims == g_stop_at) {
    atomic_store_explicit(&g_me->inflight, g_inflight, memory_order_relaxed);
    /* Release: the parent's acquire load of `stopped` sees inflight. */
    atomic_store_explicit(&g_me->stopped, 1, memory_order_release);
    raise(SIGSTOP);
    _exit(99);
  }
}

int main(int argc, char **argv) {
  if (argc != 7) return 2;
  const char *name = argv[1];
  int prod = strcmp(argv[2], "prod") == 0;
  if (!prod && strcmp(argv[2], "cons") != 0) return 2;
  unsigned child = (unsigned)strtoul(argv[3], NULL, 0);
  unsigned pidx = (unsigned)strtoul(argv[4], NULL, 0);
  unsigned burst = (unsigned)strtoul(argv[5], NULL, 0);
  g_stop_at = strtoull(argv[6], NULL, 0);
  if (child >= RING_MP_MAX_CHILD || burst == 0 || burst > 64) return 2;

  /* Shift this process's mappings so that the segment lands somewhere else
   * than in the parent or a sibling, on top of ASLR. */
  size_t pad = ((size_t)child + 1) * 65536 + (size_t)(getpid() % 31) * 4096;
  if (mmap(NULL, pad, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0) == MAP_FAILED) return 3;

  int fd = shm_open(name, O_RDWR, 0);
  if (fd < 0) return 3;
  struct stat st;
  if (fstat(fd, &st) != 0 || st.st_size < RING_MP_CTL_BYTES) return 3;
  size_t size = (size_t)st.st_size;
  unsigned char *base = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (base == MAP_FAILED) return 3;

  struct ring_mp_ctl *ctl = (struct ring_mp_ctl *)base;
  if (ctl->magic != RING_MP_MAGIC || ctl->total_bytes != size || ctl->ring_off > size ||
      ctl->ring_bytes > size - ctl->ring_off || ctl->bitmap_off > size ||
      ctl->bitmap_words > (size - ctl->bitmap_off) / 8 ||
      (uint64_t)(ctl->nprod + 1) * ctl->per_prod > ctl->bitmap_words * 64 || pidx > ctl->nprod)
    return 3;
  void *ring = base + ctl->ring_off;
  if (umbp_ring_check_header(ring, ctl->ring_bytes) != 0) return 3;
  if (umbp_ring_elem_size(ring) != RING_MP_ELEM) return 3;
  _Atomic uint64_t *bitmap = (_Atomic uint64_t *)(base + ctl->bitmap_off);

  g_me = &ctl->child[child];
  atomic_store_explicit(&g_me->map_addr, (uint64_t)(uintptr_t)base, memory_order_relaxed);
  atomic_fetch_add_explicit(&ctl->attached, 1, memory_order_relaxed);
  if (g_stop_at) umbp_ring_test_hook = stop_hook;
  /* Start together, so that a late exec does not leave a consumer victim
   * without elements to claim. */
  while (!atomic_load_explicit(&ctl->go, memory_order_relaxed)) sched_yield();

  const uint16_t owner = RING_MP_OWNER(child);
  uint64_t buf[64 * 2];

  if (prod) {
    uint32_t i = 0;
    while (i < ctl->per_prod) {
      unsigned b = ctl->per_prod - i < burst ? ctl->per_prod - i : burst;
      for (unsigned j = 0; j < b; j++) {
        buf[2 * j] = ring_mp_value(pidx, i + j);
        buf[2 * j + 1] = buf[2 * j] ^ RING_MP_SALT;
      }
      g_inflight = 0;
      unsigned k = burst == 1 ? (umbp_ring_enqueue(ring, buf, owner) == 0) : umbp_ring_enqueue_burst(ring, buf, b, owner);
      i += k;
      atomic_store_explicit(&g_me->committed, i, memory_order_relaxed);
      if (k == 0) sched_yield();
    }
    atomic_fetch_add_explicit(&ctl->prod_done, 1, memory_order_relaxed);
    return 0;
  }

  int stop_seen = 0;
  for (;;) {
    /* A non-victim pauses here, holding no claim, while the parent feeds a
     * starved victim (the scheduler can keep it from ever winning a race). */
    while (!g_stop_at && atomic_load_explicit(&ctl->hold, memory_order_relaxed)) sched_yield();
    g_inflight = 0;
    unsigned k = burst == 1 ? (umbp_ring_dequeue(ring, buf, owner) == 0) : umbp_ring_dequeue_burst(ring, buf, burst, owner);
    for (unsigned j = 0; j < k; j++) {
      int r = ring_mp_mark(ctl, bitmap, &buf[2 * j]);
      if (r > 0) atomic_fetch_add_explicit(&ctl->dups, 1, memory_order_relaxed);
      if (r < 0) atomic_fetch_add_explicit(&ctl->bad, 1, memory_order_relaxed);
    }
    atomic_fetch_add_explicit(&g_me->consumed, k, memory_order_relaxed);
    if (k == 0) {
      if (stop_seen) break;
      /* Acquire: pairs with the parent's release of stop (after it reaped the
       * producers and repaired the victim). */
      if (atomic_load_explicit(&ctl->stop, memory_order_acquire))
        stop_seen = 1; /* one more pass: anything left is drained first */
      else
        sched_yield();
    }
  }
  return 0;
}
