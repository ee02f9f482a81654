/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_ring - tests of src/shm/ring.h (built with -DUMBP_RING_TEST_HOOKS).
 *
 *   test_ring [unit|threads|mp|all] [PATH_TO_ring_helper]
 *
 * unit:    geometry, header validation, FIFO, full/empty, laps, seq and
 *          position wrap, bursts, overwrite, repair of WRITING/READING cells
 *          (a "dead" operation is simulated by longjmp out of the test hook
 *          right after the claim, the same point where ring_helper stops).
 * threads: 4 producers x 4 consumers, exactly-once with a bitmap and
 *          per-producer order per consumer (single and burst API); overwrite
 *          under contention; repair of threads that "died" mid-operation
 *          while live threads keep running.  Clean under -fsanitize=thread.
 * mp:      exec'd ring_helper producers/consumers on a POSIX shm segment; one
 *          child is stopped right after a claim, SIGKILLed and repaired; every
 *          value is then accounted for.  UMBP_RING_KILL_ROUNDS rounds of each
 *          kind (default 20).  Helper: argv[2], else $UMBP_TEST_HELPER_DIR/
 *          {,shm/}ring_helper, else next to this binary.
 * Sizes: UMBP_RING_THREAD_N values per producer thread (default 100000).
 * Debug: UMBP_RING_KILL_FIRST=N starts at round N; UMBP_RING_DEBUG=1 prints
 * a gdb backtrace of a victim that never reaches its claim.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "shm/ring.h"
#include "ring_mp.h"

#ifndef UMBP_RING_TEST_HOOKS
#error "test_ring needs -DUMBP_RING_TEST_HOOKS"
#endif

/* ---- helpers ----------------------------------------------------------------------- */

static uint64_t env_u64(const char *name, uint64_t dflt) {
  const char *s = getenv(name);
  if (!s || !*s) return dflt;
  return strtoull(s, NULL, 0);
}

static uint64_t xorshift(uint64_t *s) {
  uint64_t x = *s;
  x ^= x << 13;
  x ^= x >> 7;
  x ^= x << 17;
  return *s = x;
}

static void *ring_new(uint32_t cap, uint32_t esz) {
  size_t b = umbp_ring_bytes(cap, esz);
  assert_true(b > 0);
  void *m = aligned_alloc(64, b);
  assert_non_null(m);
  assert_int_equal(umbp_ring_init(m, b, cap, esz), 0);
  assert_int_equal(umbp_ring_check_header(m, b), 0);
  return m;
}

static uint64_t hdr_enq(void *r) {
  return atomic_load(&((struct umbp_ring_hdr *)r)->enq_pos);
}

/* "Die" right after a claim: the test hook longjmps out of the ring call on
 * the die_after-th claim made by die_owner in this thread.  The abandoned cell
 * stays WRITING/READING exactly as if the process had been killed there. */
static _Thread_local jmp_buf t_die_jmp;
static _Thread_local int t_die_after;
static _Thread_local uint16_t t_die_owner;

static void die_hook(int point, void *ring, uint64_t pos, uint16_t owner) {
  (void)point;
  (void)ring;
  (void)pos;
  if (owner != t_die_owner || t_die_after <= 0) return;
  if (--t_die_after == 0) longjmp(t_die_jmp, 1);
}

/* Returns 1 if the call died (at claim die_at), 0 if it returned normally. */
static int enq_die(void *r, const void *elems, unsigned n, uint16_t owner, int die_at) {
  t_die_owner = owner;
  t_die_after = die_at;
  if (setjmp(t_die_jmp) == 0) {
    umbp_ring_enqueue_burst(r, elems, n, owner);
    t_die_after = 0;
    return 0;
  }
  t_die_after = 0;
  return 1;
}

static int deq_die(void *r, void *elems, unsigned n, uint16_t owner, int die_at) {
  t_die_owner = owner;
  t_die_after = die_at;
  if (setjmp(t_die_jmp) == 0) {
    umbp_ring_dequeue_burst(r, elems, n, owner);
    t_die_after = 0;
    return 0;
  }
  t_die_after = 0;
  return 1;
}

struct collect {
  unsigned n;
  uint64_t v[64];
};
static void collect_cb(void *arg, const void *elem) {
  struct collect *c = arg;
  if (c->n < 64) memcpy(&c->v[c->n], elem, 8);
  c->n++;
}

/* ---- unit: geometry and headers -------------------------------------------------- */

static void test_bytes(void **state) {
  (void)state;
  assert_int_equal(umbp_ring_bytes(0, 8), 0);
  assert_int_equal(umbp_ring_bytes(1, 8), 0);
  assert_int_equal(umbp_ring_bytes(3, 8), 0);
  assert_int_equal(umbp_ring_bytes(2, 0), 0);
  assert_int_equal(umbp_ring_bytes(2, 12), 0);
  assert_int_equal(umbp_ring_bytes(2, 72), 0);
  assert_int_equal(umbp_ring_bytes(UINT32_MAX, 8), 0);
  assert_int_equal(umbp_ring_bytes(2, 8), 256); /* 192 + 2 * 16 = 224 -> 256 */
  assert_int_equal(umbp_ring_bytes(4, 8), 256);
  assert_int_equal(umbp_ring_bytes(8, 64), 192 + 8 * 72);
  assert_int_equal(umbp_ring_bytes(UMBP_RING_MAX_CAPACITY, 64), 192 + (uint64_t)UMBP_RING_MAX_CAPACITY * 72);
  for (uint32_t c = 2; c <= 1024; c <<= 1)
    for (uint32_t e = 8; e <= 64; e += 8) assert_int_equal(umbp_ring_bytes(c, e) % 64, 0);
}

static void test_init_errors(void **state) {
  (void)state;
  size_t b = umbp_ring_bytes(8, 16);
  unsigned char *m = aligned_alloc(64, b + 64);
  assert_non_null(m);
  assert_int_equal(umbp_ring_init(NULL, b, 8, 16), -EINVAL);
  assert_int_equal(umbp_ring_init(m + 8, b, 8, 16), -EINVAL);
  assert_int_equal(umbp_ring_init(m, b - 1, 8, 16), -EINVAL);
  assert_int_equal(umbp_ring_init(m, b, 6, 16), -EINVAL);
  assert_int_equal(umbp_ring_init(m, b, 1, 16), -EINVAL);
  assert_int_equal(umbp_ring_init(m, b, 0, 16), -EINVAL);
  assert_int_equal(umbp_ring_init(m, b, 8, 0), -EINVAL);
  assert_int_equal(umbp_ring_init(m, b, 8, 20), -EINVAL);
  assert_int_equal(umbp_ring_init(m, b, 8, 72), -EINVAL);
  assert_int_equal(umbp_ring_check_header(m, b + 64), -EBADMSG); /* never initialised */
  assert_int_equal(umbp_ring_init(m, b, 8, 16), 0);
  assert_int_equal(umbp_ring_check_header(m, b), 0);
  assert_int_equal(umbp_ring_check_header(m, b + 64), 0);
  assert_int_equal(umbp_ring_capacity(m), 8);
  assert_int_equal(umbp_ring_elem_size(m), 16);
  assert_int_equal(umbp_ring_count(m), 0);
  assert_int_equal(umbp_ring_dropped(m), 0);
  free(m);
}

/* Same FNV-1a as ring.c, to forge headers that are consistent but hostile. */
static void reseal(void *m) {
  unsigned char *p = (unsigned char *)m + 8;
  uint64_t h = UINT64_C(0xcbf29ce484222325);
  for (int i = 0; i < 40; i++) {
    h ^= p[i];
    h *= UINT64_C(0x100000001b3);
  }
  memcpy((unsigned char *)m + 48, &h, 8);
}

static void test_check_header_garbage(void **state) {
  (void)state;
  const size_t b = umbp_ring_bytes(16, 8);
  unsigned char *m = aligned_alloc(64, b);
  unsigned char *good = malloc(b);
  assert_non_null(m);
  assert_non_null(good);

  assert_int_equal(umbp_ring_check_header(NULL, b), -EINVAL);
  assert_int_equal(umbp_ring_check_header(m + 8, b), -EINVAL);
  memset(m, 0, b);
  assert_int_equal(umbp_ring_check_header(m, b), -EBADMSG);
  memset(m, 0xff, b);
  assert_int_equal(umbp_ring_check_header(m, b), -EBADMSG);

  uint64_t s = 88172645463325252ull;
  for (int it = 0; it < 2000; it++) { /* random bytes, and random bytes behind a valid magic */
    for (size_t i = 0; i < b; i++) m[i] = (unsigned char)xorshift(&s);
    assert_int_equal(umbp_ring_check_header(m, b), -EBADMSG);
    uint64_t magic = UMBP_RING_MAGIC;
    memcpy(m, &magic, 8);
    assert_int_equal(umbp_ring_check_header(m, b), -EBADMSG);
  }

  assert_int_equal(umbp_ring_init(m, b, 16, 8), 0);
  memcpy(good, m, b);
  assert_int_equal(umbp_ring_check_header(m, b), 0);
  /* every truncation */
  for (size_t n = 0; n < b; n++) assert_int_equal(umbp_ring_check_header(m, n), -EBADMSG);
  /* every single-bit flip in line 0's meaningful bytes */
  for (int byte = 0; byte < 56; byte++)
    for (int bit = 0; bit < 8; bit++) {
      memcpy(m, good, b);
      m[byte] ^= (unsigned char)(1u << bit);
      assert_int_equal(umbp_ring_check_header(m, b), -EBADMSG);
    }
  /* consistent checksum but lying geometry */
  struct umbp_ring_hdr *h = (struct umbp_ring_hdr *)m;
  memcpy(m, good, b);
  h->capacity = 1u << 30;
  h->mask = (1u << 30) - 1;
  h->total_bytes = umbp_ring_bytes(1u << 30, 8);
  reseal(m);
  assert_int_equal(umbp_ring_check_header(m, b), -EBADMSG); /* larger than the mapping */
  memcpy(m, good, b);
  h->mask = 7;
  reseal(m);
  assert_int_equal(umbp_ring_check_header(m, b), -EBADMSG);
  memcpy(m, good, b);
  h->elem_size = 12;
  h->cell_size = 20;
  reseal(m);
  assert_int_equal(umbp_ring_check_header(m, b), -EBADMSG);
  memcpy(m, good, b);
  h->cell_size = 8;
  reseal(m);
  assert_int_equal(umbp_ring_check_header(m, b), -EBADMSG);
  memcpy(m, good, b);
  h->layout_major = 2;
  reseal(m);
  assert_int_equal(umbp_ring_check_header(m, b), -EBADMSG);
  memcpy(m, good, b);
  h->abi ^= 1;
  reseal(m);
  assert_int_equal(umbp_ring_check_header(m, b), -EBADMSG);
  memcpy(m, good, b);
  h->layout_minor = 7; /* a newer minor is compatible */
  reseal(m);
  assert_int_equal(umbp_ring_check_header(m, b), 0);
  free(m);
  free(good);
}

/* A header cut short at the end of a mapping, followed by an inaccessible
 * page: check_header must not read past mem_bytes. */
static void test_check_header_guard_page(void **state) {
  (void)state;
  long pg = sysconf(_SC_PAGESIZE);
  unsigned char *map = mmap(NULL, 2 * (size_t)pg, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  assert_true(map != MAP_FAILED);
  assert_int_equal(mprotect(map + pg, (size_t)pg, PROT_NONE), 0);
  memset(map, 0xab, (size_t)pg);
  for (size_t n = 0; n < UMBP_RING_HDR_BYTES; n += 64) {
    unsigned char *m = map + pg - n;
    if (n >= 8) {
      uint64_t magic = UMBP_RING_MAGIC;
      memcpy(m, &magic, 8);
    }
    assert_int_equal(umbp_ring_check_header(m, n), -EBADMSG);
  }
  munmap(map, 2 * (size_t)pg);
}

/* ---- unit: single-threaded behaviour ---------------------------------------------- */

static void test_fifo_full_empty(void **state) {
  (void)state;
  void *r = ring_new(8, 8);
  uint64_t v;
  assert_int_equal(umbp_ring_dequeue(r, &v, 2), -EAGAIN);
  for (uint64_t i = 1; i <= 8; i++) {
    assert_int_equal(umbp_ring_enqueue(r, &i, 2), 0);
    assert_int_equal(umbp_ring_count(r), i);
  }
  uint64_t x = 99;
  assert_int_equal(umbp_ring_enqueue(r, &x, 2), -ENOSPC);
  assert_int_equal(umbp_ring_enqueue_burst(r, &x, 1, 2), 0);
  for (uint64_t i = 1; i <= 8; i++) {
    v = 0;
    assert_int_equal(umbp_ring_dequeue(r, &v, 3), 0);
    assert_int_equal(v, i);
  }
  v = 12345;
  assert_int_equal(umbp_ring_dequeue(r, &v, 3), -EAGAIN);
  assert_int_equal(v, 12345); /* output untouched on failure */
  assert_int_equal(umbp_ring_dequeue_burst(r, &v, 4, 3), 0);
  assert_int_equal(umbp_ring_count(r), 0);
  assert_int_equal(umbp_ring_enqueue_burst(r, &x, 0, 2), 0);
  assert_int_equal(umbp_ring_dequeue_burst(r, &v, 0, 2), 0);
  free(r);
}

static void test_wrap_many_laps(void **state) {
  (void)state;
  void *r = ring_new(4, 24);
  uint64_t next_in = 0, next_out = 0, s = 42;
  for (int it = 0; it < 200000; it++) {
    uint64_t e[3];
    if (xorshift(&s) % 2) {
      e[0] = next_in;
      e[1] = ~next_in;
      e[2] = next_in * 3;
      int rc = umbp_ring_enqueue(r, e, 5);
      if (next_in - next_out == 4) {
        assert_int_equal(rc, -ENOSPC);
      } else {
        assert_int_equal(rc, 0);
        next_in++;
      }
    } else {
      int rc = umbp_ring_dequeue(r, e, 6);
      if (next_in == next_out) {
        assert_int_equal(rc, -EAGAIN);
      } else {
        assert_int_equal(rc, 0);
        assert_int_equal(e[0], next_out);
        assert_int_equal(e[1], ~next_out);
        assert_int_equal(e[2], next_out * 3);
        next_out++;
      }
    }
    assert_int_equal(umbp_ring_count(r), next_in - next_out);
  }
  assert_true(next_out > 40000); /* > 10000 laps of a 4-cell ring */
  free(r);
}

/* Start just below the 2^46 seq wrap and the 2^64 position wrap. */
static void run_from(uint64_t start) {
  size_t b = umbp_ring_bytes(4, 8);
  void *r = aligned_alloc(64, b);
  assert_non_null(r);
  assert_int_equal(umbp_ring_init_at(r, b, 4, 8, start), 0);
  assert_int_equal(umbp_ring_check_header(r, b), 0);
  uint64_t in = 0, out = 0, v;
  for (int lap = 0; lap < 64; lap++) {
    unsigned fill = 1 + (unsigned)lap % 4;
    for (unsigned i = 0; i < fill; i++, in++) assert_int_equal(umbp_ring_enqueue(r, &in, 1), 0);
    if (fill == 4) assert_int_equal(umbp_ring_enqueue(r, &in, 1), -ENOSPC);
    assert_int_equal(umbp_ring_count(r), fill);
    for (unsigned i = 0; i < fill; i++, out++) {
      assert_int_equal(umbp_ring_dequeue(r, &v, 1), 0);
      assert_int_equal(v, out);
    }
    assert_int_equal(umbp_ring_dequeue(r, &v, 1), -EAGAIN);
  }
  uint64_t end = hdr_enq(r);
  assert_int_equal(end - start, in);
  free(r);
}

static void test_seq_wrap(void **state) {
  (void)state;
  run_from((UINT64_C(1) << 46) - 7); /* seq wraps, position does not */
  run_from(UINT64_MAX - 9);           /* position wraps through 0 */
  run_from((UINT64_C(1) << 47) - 3);
  /* A "dead" producer's tombstone straddling the seq wrap. */
  size_t b = umbp_ring_bytes(4, 8);
  void *r = aligned_alloc(64, b);
  assert_int_equal(umbp_ring_init_at(r, b, 4, 8, (UINT64_C(1) << 46) - 1), 0);
  uint64_t a = 1, z = 2, c = 3, v;
  assert_int_equal(umbp_ring_enqueue(r, &a, 1), 0);
  assert_int_equal(enq_die(r, &z, 1, 9, 1), 1);
  assert_int_equal(umbp_ring_enqueue(r, &c, 1), 0);
  assert_int_equal(umbp_ring_repair(r, 9, NULL, NULL), 1);
  assert_int_equal(umbp_ring_dequeue(r, &v, 1), 0);
  assert_int_equal(v, 1);
  assert_int_equal(umbp_ring_dequeue(r, &v, 1), 0);
  assert_int_equal(v, 3);
  assert_int_equal(umbp_ring_dequeue(r, &v, 1), -EAGAIN);
  free(r);
}

static void test_bursts(void **state) {
  (void)state;
  void *r = ring_new(16, 8);
  uint64_t in[32], out[32];
  for (int i = 0; i < 32; i++) in[i] = 100 + (uint64_t)i;
  assert_int_equal(umbp_ring_enqueue_burst(r, in, 10, 1), 10);
  assert_int_equal(umbp_ring_enqueue_burst(r, in + 10, 10, 1), 6); /* fills */
  assert_int_equal(umbp_ring_enqueue_burst(r, in, 10, 1), 0);
  assert_int_equal(umbp_ring_count(r), 16);
  assert_int_equal(umbp_ring_dequeue_burst(r, out, 4, 2), 4);
  for (int i = 0; i < 4; i++) assert_int_equal(out[i], 100 + i);
  assert_int_equal(umbp_ring_dequeue_burst(r, out, 32, 2), 12);
  for (int i = 0; i < 12; i++) assert_int_equal(out[i], 104 + i);
  assert_int_equal(umbp_ring_dequeue_burst(r, out, 32, 2), 0);
  /* n larger than the capacity: at most capacity, across the wrap */
  assert_int_equal(umbp_ring_enqueue_burst(r, in, 32, 1), 16);
  assert_int_equal(umbp_ring_dequeue_burst(r, out, 32, 2), 16);
  for (int i = 0; i < 16; i++) assert_int_equal(out[i], in[i]);
  /* mixed-size bursts over many laps */
  uint64_t s = 7, nin = 0, nout = 0, buf[16];
  for (int it = 0; it < 20000; it++) {
    unsigned n = 1 + (unsigned)(xorshift(&s) % 16);
    if (xorshift(&s) % 2) {
      for (unsigned i = 0; i < n; i++) buf[i] = nin + i;
      unsigned k = umbp_ring_enqueue_burst(r, buf, n, 1);
      uint64_t room = 16 - (nin - nout);
      assert_int_equal(k, n < room ? n : room);
      nin += k;
    } else {
      unsigned k = umbp_ring_dequeue_burst(r, buf, n, 2);
      uint64_t have = nin - nout;
      assert_int_equal(k, n < have ? n : have);
      for (unsigned i = 0; i < k; i++) assert_int_equal(buf[i], nout + i);
      nout += k;
    }
  }
  free(r);
}

static void test_elem_sizes(void **state) {
  (void)state;
  for (uint32_t e = 8; e <= 64; e += 8) {
    void *r = ring_new(4, e);
    unsigned char in[4][64], out[4][64];
    for (int lap = 0; lap < 5; lap++) {
      for (int i = 0; i < 4; i++) {
        memset(in[i], lap * 16 + i + 1, sizeof in[i]);
        in[i][e - 1] = 0x5a; /* last payload byte */
      }
      /* elems are packed elem_size apart */
      unsigned char packed[4 * 64], back[4 * 64];
      for (int i = 0; i < 4; i++) memcpy(packed + i * e, in[i], e);
      assert_int_equal(umbp_ring_enqueue_burst(r, packed, 4, 1), 4);
      memset(back, 0, sizeof back);
      assert_int_equal(umbp_ring_dequeue_burst(r, back, 4, 1), 4);
      for (int i = 0; i < 4; i++) {
        memcpy(out[i], back + i * e, e);
        assert_memory_equal(out[i], in[i], e);
      }
    }
    free(r);
  }
}

/* Dequeue the values first..last, in that order, then find the ring empty. */
static void expect_in_order(void *r, uint64_t first, uint64_t last) {
  uint64_t v;
  for (uint64_t want = first; want <= last; want++) {
    assert_int_equal(umbp_ring_dequeue(r, &v, 2), 0);
    assert_int_equal(v, want);
  }
  assert_int_equal(umbp_ring_dequeue(r, &v, 2), -EAGAIN);
}

static void test_overwrite(void **state) {
  (void)state;
  void *r = ring_new(4, 8);
  uint64_t v;
  for (uint64_t i = 1; i <= 4; i++) assert_int_equal(umbp_ring_enqueue_overwrite(r, &i, 1), 0);
  v = 5;
  assert_int_equal(umbp_ring_enqueue_overwrite(r, &v, 1), 1);
  assert_int_equal(umbp_ring_dropped(r), 1);
  v = 6;
  assert_int_equal(umbp_ring_enqueue_overwrite(r, &v, 1), 1);
  v = 7;
  assert_int_equal(umbp_ring_enqueue_overwrite(r, &v, 1), 1);
  assert_int_equal(umbp_ring_dropped(r), 3);
  assert_int_equal(umbp_ring_count(r), 4);
  expect_in_order(r, 4, 7); /* the oldest went first */
  v = 8;
  assert_int_equal(umbp_ring_enqueue_overwrite(r, &v, 1), 0);
  assert_int_equal(umbp_ring_dropped(r), 3);
  free(r);
}

/* A tombstone at the head makes room by itself: nothing real is dropped. */
static void test_overwrite_tombstone(void **state) {
  (void)state;
  void *r = ring_new(4, 8);
  uint64_t x = 100, v;
  assert_int_equal(enq_die(r, &x, 1, 40, 1), 1);
  for (x = 1; x <= 3; x++) assert_int_equal(umbp_ring_enqueue(r, &x, 1), 0);
  assert_int_equal(umbp_ring_repair(r, 40, NULL, NULL), 1); /* [skip, 1, 2, 3]: full */
  assert_int_equal(umbp_ring_enqueue(r, &x, 1), -ENOSPC);
  x = 4;
  assert_int_equal(umbp_ring_enqueue_overwrite(r, &x, 1), 0);
  assert_int_equal(umbp_ring_dropped(r), 0);
  for (x = 1; x <= 4; x++) {
    assert_int_equal(umbp_ring_dequeue(r, &v, 2), 0);
    assert_int_equal(v, x);
  }
  free(r);
}

/* The cell the overwriter needs is held by a dead reader: it spins a
 * bounded while, then drops the new element instead of blocking; the
 * elements behind the held cell stay. */
static void test_overwrite_gives_up(void **state) {
  (void)state;
  void *r = ring_new(2, 8);
  uint64_t a = 1, b = 2, c = 3, d = 4, v;
  assert_int_equal(umbp_ring_enqueue(r, &a, 1), 0);
  assert_int_equal(umbp_ring_enqueue(r, &b, 1), 0);
  assert_int_equal(deq_die(r, &v, 1, 7, 1), 1); /* a is READING by dead 7 */
  assert_int_equal(umbp_ring_enqueue_overwrite(r, &c, 1), 1); /* c itself */
  assert_int_equal(umbp_ring_dropped(r), 1);
  struct collect got = {0};
  assert_int_equal(umbp_ring_repair(r, 7, collect_cb, &got), 1);
  assert_int_equal(got.n, 1);
  assert_int_equal(got.v[0], 1);
  assert_int_equal(umbp_ring_enqueue_overwrite(r, &d, 1), 0); /* a's cell is free again */
  assert_int_equal(umbp_ring_dequeue(r, &v, 2), 0);
  assert_int_equal(v, 2);
  assert_int_equal(umbp_ring_dequeue(r, &v, 2), 0);
  assert_int_equal(v, 4);
  assert_int_equal(umbp_ring_dequeue(r, &v, 2), -EAGAIN);
  free(r);
}

/* Many laps of overwrites with nobody dequeuing: each call drops exactly the
 * oldest, deq_pos stays behind (within two laps), and the first dequeue jumps
 * it in one step to the oldest element left, which then come out in order. */
static void test_overwrite_laps(void **state) {
  (void)state;
  void *r = ring_new(8, 8);
  struct umbp_ring_hdr *h = r;
  const uint64_t n = 8 * 1000 + 3;
  for (uint64_t i = 1; i <= n; i++) assert_int_equal(umbp_ring_enqueue_overwrite(r, &i, 1), i > 8 ? 1 : 0);
  assert_int_equal(umbp_ring_dropped(r), n - 8);
  assert_int_equal(umbp_ring_count(r), 8);
  /* no consumer ran: deq_pos is behind, by less than two laps (the
   * overwriter brings it up once a lap) */
  uint64_t d0 = atomic_load(&h->deq_pos);
  assert_true(n - d0 > 8 && n - d0 <= 16);
  uint64_t v;
  assert_int_equal(umbp_ring_dequeue(r, &v, 2), 0);
  assert_int_equal(v, n - 7);
  assert_int_equal(atomic_load(&h->deq_pos), n - 7); /* jumped, not stepped */
  expect_in_order(r, n - 6, n);
  /* and the ring works as a plain ring again */
  v = 77;
  assert_int_equal(umbp_ring_enqueue(r, &v, 1), 0);
  assert_int_equal(umbp_ring_dequeue(r, &v, 2), 0);
  assert_int_equal(v, 77);
  free(r);
}

/* A deq_pos 2^45 positions or more behind: a consumer's 46-bit seq compare
 * then reads full cells as empty. Before deq_pos was brought up once a lap,
 * a ring that nobody drained got there after 2^45 overwrites; here the lag
 * is made by hand, and one lap of overwrites must repair it. */
static void test_overwrite_deq_lag(void **state) {
  (void)state;
  size_t b = umbp_ring_bytes(8, 8);
  void *r = aligned_alloc(64, b);
  assert_non_null(r);
  const uint64_t start = (UINT64_C(1) << 45) + 64;
  assert_int_equal(umbp_ring_init_at(r, b, 8, 8, start), 0);
  struct umbp_ring_hdr *h = r;
  uint64_t v;
  for (v = 1; v <= 8; v++) assert_int_equal(umbp_ring_enqueue(r, &v, 1), 0);
  atomic_store(&h->deq_pos, 0);
  assert_int_equal(umbp_ring_dequeue(r, &v, 2), -EAGAIN); /* the broken compare */
  for (v = 101; v <= 108; v++) assert_int_equal(umbp_ring_enqueue_overwrite(r, &v, 1), 1);
  assert_true(atomic_load(&h->deq_pos) > start); /* brought up at the lap's start */
  expect_in_order(r, 101, 108);
  free(r);
}

/* The state an overwriter killed right after its in-place claim leaves (the
 * claim is made here by hand: the library's ring.c is built without the test
 * hooks): the cell is WRITING under its owner with the seq of its position,
 * as a killed producer's; consumers pass it, the repair makes it a
 * tombstone, nothing else is lost. */
static void test_overwrite_killed(void **state) {
  (void)state;
  void *r = ring_new(4, 8);
  struct umbp_ring_hdr *h = r;
  for (uint64_t i = 1; i <= 4; i++) assert_int_equal(umbp_ring_enqueue(r, &i, 1), 0);
  /* the claim umbp_ring_enqueue_overwrite makes for position 4 (cell 0,
   * holding element 1), and nothing after it */
  struct umbp_ring_cell *c = umbp_ring__cell(h, 4);
  uint64_t w = atomic_load(&c->word);
  assert_true(atomic_compare_exchange_strong(&c->word, &w, umbp_ring__word(4, UMBP_RING_WRITING, 40)));
  uint64_t v;
  for (uint64_t i = 2; i <= 4; i++) {
    assert_int_equal(umbp_ring_dequeue(r, &v, 2), 0);
    assert_int_equal(v, i);
  }
  assert_int_equal(umbp_ring_dequeue(r, &v, 2), -EAGAIN); /* stuck behind the dead claim */
  assert_int_equal(umbp_ring_repair(r, 40, NULL, NULL), 1);
  v = 5;
  assert_int_equal(umbp_ring_enqueue_overwrite(r, &v, 1), 0);
  assert_int_equal(umbp_ring_dequeue(r, &v, 2), 0);
  assert_int_equal(v, 5);
  assert_int_equal(umbp_ring_dequeue(r, &v, 2), -EAGAIN);
  free(r);
}

/* ---- unit: repair ------------------------------------------------------------------ */

static void test_repair_writing(void **state) {
  (void)state;
  void *r = ring_new(8, 8);
  uint64_t v, x;
  for (x = 1; x <= 2; x++) assert_int_equal(umbp_ring_enqueue(r, &x, 1), 0);
  x = 3;
  uint64_t enq_before = hdr_enq(r);
  assert_int_equal(enq_die(r, &x, 1, 9, 1), 1); /* dies before even advancing enq_pos */
  assert_int_equal(hdr_enq(r), enq_before);
  for (x = 4; x <= 5; x++) assert_int_equal(umbp_ring_enqueue(r, &x, 1), 0); /* producers help past it */
  assert_int_equal(umbp_ring_dequeue(r, &v, 2), 0);
  assert_int_equal(v, 1);
  assert_int_equal(umbp_ring_dequeue(r, &v, 2), 0);
  assert_int_equal(v, 2);
  assert_int_equal(umbp_ring_dequeue(r, &v, 2), -EAGAIN); /* stuck behind the WRITING cell */
  assert_int_equal(umbp_ring_repair(r, 8, NULL, NULL), 0);   /* someone else: nothing */
  struct collect got = {0};
  assert_int_equal(umbp_ring_repair(r, 9, collect_cb, &got), 1);
  assert_int_equal(got.n, 0); /* a producer's element is never handed out */
  assert_int_equal(umbp_ring_repair(r, 9, collect_cb, &got), 0);
  assert_int_equal(umbp_ring_dequeue(r, &v, 2), 0);
  assert_int_equal(v, 4); /* 3 was skipped */
  assert_int_equal(umbp_ring_dequeue(r, &v, 2), 0);
  assert_int_equal(v, 5);
  assert_int_equal(umbp_ring_dequeue(r, &v, 2), -EAGAIN);
  /* not wedged: whole laps still work */
  for (int lap = 0; lap < 3; lap++) {
    for (x = 0; x < 8; x++) assert_int_equal(umbp_ring_enqueue(r, &x, 1), 0);
    assert_int_equal(umbp_ring_enqueue(r, &x, 1), -ENOSPC);
    for (x = 0; x < 8; x++) {
      assert_int_equal(umbp_ring_dequeue(r, &v, 2), 0);
      assert_int_equal(v, x);
    }
  }
  free(r);
}

static void test_repair_reading(void **state) {
  (void)state;
  void *r = ring_new(8, 8);
  uint64_t v, x;
  for (x = 1; x <= 3; x++) assert_int_equal(umbp_ring_enqueue(r, &x, 1), 0);
  assert_int_equal(deq_die(r, &v, 1, 11, 1), 1); /* 1 is READING by dead 11 */
  assert_int_equal(umbp_ring_dequeue(r, &v, 2), 0); /* consumers help past it */
  assert_int_equal(v, 2);
  assert_int_equal(umbp_ring_dequeue(r, &v, 2), 0);
  assert_int_equal(v, 3);
  assert_int_equal(umbp_ring_dequeue(r, &v, 2), -EAGAIN);
  struct collect got = {0};
  assert_int_equal(umbp_ring_repair(r, 11, collect_cb, &got), 1);
  assert_int_equal(got.n, 1);
  assert_int_equal(got.v[0], 1);
  assert_int_equal(umbp_ring_repair(r, 11, collect_cb, &got), 0);
  assert_int_equal(got.n, 1); /* exactly once */
  assert_int_equal(umbp_ring_dequeue(r, &v, 2), -EAGAIN);
  free(r);
}

static void requeue_cb(void *arg, const void *elem) {
  assert_int_equal(umbp_ring_enqueue(arg, elem, 1), 0);
}

/* A dead reader keeps producers out once they lap around to its cell; repair
 * frees it, and the callback can put the element back into the same ring. */
static void test_repair_reading_unwedges(void **state) {
  (void)state;
  void *r = ring_new(4, 8);
  uint64_t v, x;
  for (x = 1; x <= 4; x++) assert_int_equal(umbp_ring_enqueue(r, &x, 1), 0);
  assert_int_equal(deq_die(r, &v, 1, 12, 1), 1);
  for (x = 2; x <= 4; x++) {
    assert_int_equal(umbp_ring_dequeue(r, &v, 2), 0);
    assert_int_equal(v, x);
  }
  x = 5;
  assert_int_equal(umbp_ring_enqueue(r, &x, 1), -ENOSPC); /* cell 0 still READING */
  assert_int_equal(umbp_ring_repair(r, 12, requeue_cb, r), 1);
  assert_int_equal(umbp_ring_enqueue(r, &x, 1), 0);
  assert_int_equal(umbp_ring_dequeue(r, &v, 2), 0);
  assert_int_equal(v, 1); /* the re-enqueued element */
  assert_int_equal(umbp_ring_dequeue(r, &v, 2), 0);
  assert_int_equal(v, 5);
  assert_int_equal(umbp_ring_dequeue(r, &v, 2), -EAGAIN);
  free(r);
}

static void test_repair_bursts(void **state) {
  (void)state;
  void *r = ring_new(16, 8);
  uint64_t in[8] = {10, 11, 12, 13, 14, 15, 16, 17}, out[16];
  assert_int_equal(umbp_ring_enqueue_burst(r, in, 2, 1), 2);      /* 10 11 */
  assert_int_equal(enq_die(r, in + 2, 5, 20, 3), 1);              /* 12 13 14 claimed, dead */
  assert_int_equal(umbp_ring_enqueue_burst(r, in + 5, 3, 1), 3); /* 15 16 17 after them */
  assert_int_equal(umbp_ring_dequeue_burst(r, out, 16, 2), 2);
  assert_int_equal(umbp_ring_repair(r, 20, NULL, NULL), 3);
  assert_int_equal(umbp_ring_dequeue_burst(r, out, 16, 2), 3);
  assert_int_equal(out[0], 15);
  assert_int_equal(out[1], 16);
  assert_int_equal(out[2], 17);

  assert_int_equal(umbp_ring_enqueue_burst(r, in, 6, 1), 6);
  assert_int_equal(deq_die(r, out, 5, 21, 2), 1); /* 10 11 READING, dead */
  assert_int_equal(umbp_ring_dequeue_burst(r, out, 16, 2), 4);
  assert_int_equal(out[0], 12);
  struct collect got = {0};
  assert_int_equal(umbp_ring_repair(r, 21, collect_cb, &got), 2);
  assert_int_equal(got.n, 2);
  assert_true((got.v[0] == 10 && got.v[1] == 11) || (got.v[0] == 11 && got.v[1] == 10));
  assert_int_equal(umbp_ring_count(r), 0);
  free(r);
}

static void test_repair_owners(void **state) {
  (void)state;
  void *r = ring_new(8, 8);
  uint64_t x = 1, v;
  assert_int_equal(enq_die(r, &x, 1, 7, 1), 1);
  x = 2;
  assert_int_equal(umbp_ring_enqueue(r, &x, 1), 0);
  assert_int_equal(umbp_ring_enqueue(r, &x, 1), 0);
  assert_int_equal(umbp_ring_repair(r, 7, NULL, NULL), 1); /* let consumers reach the others */
  assert_int_equal(deq_die(r, &v, 1, 8, 1), 1);
  assert_int_equal(enq_die(r, &x, 1, 7, 1), 1);
  assert_int_equal(umbp_ring_repair(r, 0, NULL, NULL), 0);
  assert_int_equal(umbp_ring_repair(NULL, 7, NULL, NULL), 0);
  assert_int_equal(umbp_ring_repair(r, 9, NULL, NULL), 0);
  struct collect got = {0};
  assert_int_equal(umbp_ring_repair(r, 8, collect_cb, &got), 1);
  assert_int_equal(got.n, 1);
  assert_int_equal(got.v[0], 2);
  assert_int_equal(umbp_ring_repair(r, 7, collect_cb, &got), 1);
  assert_int_equal(got.n, 1);
  assert_int_equal(umbp_ring_dequeue(r, &v, 2), 0);
  assert_int_equal(v, 2);
  assert_int_equal(umbp_ring_dequeue(r, &v, 2), -EAGAIN);
  free(r);
}

/* Tombstones are consumed transparently inside a burst. */
static void test_skips_in_burst(void **state) {
  (void)state;
  void *r = ring_new(16, 8);
  uint64_t x, out[16];
  for (x = 1; x <= 5; x++) {
    if (x % 2 == 0) {
      assert_int_equal(enq_die(r, &x, 1, 30, 1), 1);
    } else {
      assert_int_equal(umbp_ring_enqueue(r, &x, 1), 0);
    }
  }
  assert_int_equal(umbp_ring_dequeue_burst(r, out, 16, 2), 1); /* stops at the first WRITING cell */
  assert_int_equal(out[0], 1);
  assert_int_equal(umbp_ring_repair(r, 30, NULL, NULL), 2);
  assert_int_equal(umbp_ring_dequeue_burst(r, out, 16, 2), 2);
  assert_int_equal(out[0], 3);
  assert_int_equal(out[1], 5);
  /* a burst that finds only tombstones returns 0, and the ring is empty after */
  x = 9;
  assert_int_equal(enq_die(r, &x, 1, 31, 1), 1);
  assert_int_equal(enq_die(r, &x, 1, 31, 1), 1);
  assert_int_equal(umbp_ring_repair(r, 31, NULL, NULL), 2);
  assert_int_equal(umbp_ring_dequeue_burst(r, out, 1, 2), 0);
  assert_int_equal(umbp_ring_count(r), 0);
  free(r);
  /* 100 tombstones in a row: more than one internal round of 64 positions */
  r = ring_new(128, 8);
  for (int i = 0; i < 100; i++) assert_int_equal(enq_die(r, &x, 1, 32, 1), 1);
  assert_int_equal(umbp_ring_enqueue(r, &x, 1), 0);
  assert_int_equal(umbp_ring_repair(r, 32, NULL, NULL), 100);
  assert_int_equal(umbp_ring_dequeue_burst(r, out, 4, 2), 1);
  assert_int_equal(out[0], 9);
  assert_int_equal(umbp_ring_count(r), 0);
  free(r);
}

/* ---- threads ---------------------------------------------------------------------- */

struct mt {
  void *ring;
  unsigned nprod, ncons;
  uint64_t per;
  int burst;
  _Atomic uint64_t *bitmap;
  _Atomic uint64_t consumed, dups, bad, order;
  _Atomic unsigned prod_left;
  _Atomic int stop;
  /* overwrite test */
  _Atomic uint64_t drop_ret;
  /* repair-while-live test */
  uint64_t zombie_committed;
  _Atomic int zombie_dead[2];
  _Atomic int hold; /* live consumers pause (holding no claim) while main feeds the zombie */
  _Atomic uint64_t cb_n;
};
struct mt_arg {
  struct mt *m;
  unsigned id;
};

#define MT_MAXP 8

static int mt_mark(struct mt *m, const uint64_t *e) {
  uint64_t v = e[0];
  if (e[1] != ~v) return -1;
  uint64_t p = v >> 40, i = v & ((UINT64_C(1) << 40) - 1);
  if (p >= MT_MAXP || i >= m->per) return -1;
  uint64_t bit = p * m->per + i, mask = UINT64_C(1) << (bit % 64);
  return (atomic_fetch_or_explicit(&m->bitmap[bit / 64], mask, memory_order_relaxed) & mask) ? 1 : 0;
}

static void *mt_producer(void *arg) {
  struct mt_arg *a = arg;
  struct mt *m = a->m;
  uint64_t s = 0x1234567ull + a->id, buf[32];
  const uint16_t owner = (uint16_t)(100 + a->id);
  for (uint64_t i = 0; i < m->per;) {
    unsigned n = m->burst ? 1 + (unsigned)(xorshift(&s) % 16) : 1;
    if (n > m->per - i) n = (unsigned)(m->per - i);
    for (unsigned j = 0; j < n; j++) {
      buf[2 * j] = ((uint64_t)a->id << 40) | (i + j);
      buf[2 * j + 1] = ~buf[2 * j];
    }
    unsigned k = m->burst ? umbp_ring_enqueue_burst(m->ring, buf, n, owner)
                          : (umbp_ring_enqueue(m->ring, buf, owner) == 0);
    i += k;
    if (!k) sched_yield();
  }
  atomic_fetch_sub(&m->prod_left, 1);
  return NULL;
}

static void *mt_consumer(void *arg) {
  struct mt_arg *a = arg;
  struct mt *m = a->m;
  uint64_t s = 0x7654321ull + a->id, buf[32], last[MT_MAXP];
  const uint16_t owner = (uint16_t)(200 + a->id);
  const uint64_t total = m->per * m->nprod;
  for (int p = 0; p < MT_MAXP; p++) last[p] = UINT64_MAX;
  while (atomic_load_explicit(&m->consumed, memory_order_relaxed) < total) {
    unsigned n = m->burst ? 1 + (unsigned)(xorshift(&s) % 16) : 1;
    unsigned k = m->burst ? umbp_ring_dequeue_burst(m->ring, buf, n, owner)
                          : (umbp_ring_dequeue(m->ring, buf, owner) == 0);
    for (unsigned j = 0; j < k; j++) {
      int r = mt_mark(m, &buf[2 * j]);
      if (r > 0) atomic_fetch_add(&m->dups, 1);
      if (r < 0) {
        atomic_fetch_add(&m->bad, 1);
        continue;
      }
      /* one consumer sees each producer's values in increasing order */
      uint64_t p = buf[2 * j] >> 40, i = buf[2 * j] & ((UINT64_C(1) << 40) - 1);
      if (last[p] != UINT64_MAX && i <= last[p]) atomic_fetch_add(&m->order, 1);
      last[p] = i;
    }
    if (k)
      atomic_fetch_add_explicit(&m->consumed, k, memory_order_relaxed);
    else
      sched_yield();
  }
  return NULL;
}

static void run_mpmc(int burst) {
  struct mt m = {0};
  m.nprod = 4;
  m.ncons = 4;
  m.per = env_u64("UMBP_RING_THREAD_N", 100000);
  m.burst = burst;
  m.ring = ring_new(64, 16);
  size_t words = (m.per * MT_MAXP + 63) / 64;
  m.bitmap = calloc(words, sizeof *m.bitmap);
  assert_non_null(m.bitmap);
  m.prod_left = m.nprod;
  pthread_t th[8];
  struct mt_arg args[8];
  for (unsigned i = 0; i < m.ncons; i++) {
    args[4 + i] = (struct mt_arg){&m, i};
    assert_int_equal(pthread_create(&th[4 + i], NULL, mt_consumer, &args[4 + i]), 0);
  }
  for (unsigned i = 0; i < m.nprod; i++) {
    args[i] = (struct mt_arg){&m, i};
    assert_int_equal(pthread_create(&th[i], NULL, mt_producer, &args[i]), 0);
  }
  for (int i = 0; i < 8; i++) pthread_join(th[i], NULL);
  assert_int_equal(m.dups, 0);
  assert_int_equal(m.bad, 0);
  assert_int_equal(m.order, 0);
  assert_int_equal(m.consumed, m.per * m.nprod);
  for (unsigned p = 0; p < m.nprod; p++)
    for (uint64_t i = 0; i < m.per; i++) {
      uint64_t bit = p * m.per + i;
      if (!((m.bitmap[bit / 64] >> (bit % 64)) & 1)) fail_msg("value %u/%llu never delivered", p, (unsigned long long)i);
    }
  assert_int_equal(umbp_ring_count(m.ring), 0);
  free(m.bitmap);
  free(m.ring);
}

static void test_threads_single(void **state) {
  (void)state;
  run_mpmc(0);
}
static void test_threads_burst(void **state) {
  (void)state;
  run_mpmc(1);
}

static void *ow_producer(void *arg) {
  struct mt_arg *a = arg;
  struct mt *m = a->m;
  const uint16_t owner = (uint16_t)(100 + a->id);
  for (uint64_t i = 0; i < m->per; i++) {
    uint64_t e[2] = {((uint64_t)a->id << 40) | i, 0};
    e[1] = ~e[0];
    atomic_fetch_add_explicit(&m->drop_ret, umbp_ring_enqueue_overwrite(m->ring, e, owner), memory_order_relaxed);
  }
  atomic_fetch_sub(&m->prod_left, 1);
  return NULL;
}

static void *ow_consumer(void *arg) {
  struct mt_arg *a = arg;
  struct mt *m = a->m;
  const uint16_t owner = (uint16_t)(200 + a->id);
  uint64_t buf[16];
  for (;;) {
    unsigned k = umbp_ring_dequeue_burst(m->ring, buf, 8, owner);
    for (unsigned j = 0; j < k; j++) {
      int r = mt_mark(m, &buf[2 * j]);
      if (r > 0) atomic_fetch_add(&m->dups, 1);
      if (r < 0) atomic_fetch_add(&m->bad, 1);
    }
    atomic_fetch_add(&m->consumed, k);
    if (!k) {
      if (atomic_load(&m->prod_left) == 0) break; /* loaded after an empty dequeue */
      sched_yield();
    }
  }
  return NULL;
}

static void test_threads_overwrite(void **state) {
  (void)state;
  struct mt m = {0};
  m.nprod = 3;
  m.ncons = 2;
  m.per = env_u64("UMBP_RING_THREAD_N", 100000) / 2;
  m.ring = ring_new(16, 16);
  m.bitmap = calloc((m.per * MT_MAXP + 63) / 64, sizeof *m.bitmap);
  m.prod_left = m.nprod;
  pthread_t th[5];
  struct mt_arg args[5];
  for (unsigned i = 0; i < 5; i++) {
    args[i] = (struct mt_arg){&m, i < m.nprod ? i : i - m.nprod};
    assert_int_equal(pthread_create(&th[i], NULL, i < m.nprod ? ow_producer : ow_consumer, &args[i]), 0);
  }
  for (int i = 0; i < 5; i++) pthread_join(th[i], NULL);
  uint64_t buf[2];
  while (umbp_ring_dequeue(m.ring, buf, 3) == 0) {
    assert_int_equal(mt_mark(&m, buf), 0);
    m.consumed++;
  }
  assert_int_equal(m.dups, 0);
  assert_int_equal(m.bad, 0);
  uint64_t dropped = umbp_ring_dropped(m.ring);
  assert_int_equal(dropped, m.drop_ret);
  assert_int_equal(m.consumed + dropped, m.per * m.nprod); /* each value delivered or counted as dropped */
  uint64_t seen = 0;
  for (size_t w = 0; w < (m.per * MT_MAXP + 63) / 64; w++) seen += (uint64_t)__builtin_popcountll(m.bitmap[w]);
  assert_int_equal(seen, m.consumed);
  print_message("# overwrite: %llu delivered, %llu dropped\n", (unsigned long long)m.consumed,
                (unsigned long long)dropped);
  free(m.bitmap);
  free(m.ring);
}

/* Repair while live threads keep running.  Zombie threads (owners 50, 51)
 * "die" by longjmp right after a claim; the main thread repairs them while two
 * producers and two consumers go on. */
static void zombie_produce(struct mt *m) {
  uint64_t e[2];
  for (uint64_t i = 0; i < m->per;) {
    e[0] = ((uint64_t)2 << 40) | i;
    e[1] = ~e[0];
    if (umbp_ring_enqueue(m->ring, e, 50) == 0)
      i++, m->zombie_committed = i;
    else
      sched_yield();
  }
}

static void *zombie_producer(void *arg) {
  struct mt *m = arg;
  t_die_owner = 50;
  t_die_after = (int)(m->per / 3) + 1;
  if (setjmp(t_die_jmp) == 0) {
    zombie_produce(m);
    fail_msg("zombie producer did not die");
  }
  atomic_store_explicit(&m->zombie_dead[0], 1, memory_order_release);
  return NULL;
}

static void *zombie_consumer(void *arg) {
  struct mt *m = arg;
  uint64_t buf[16];
  t_die_owner = 51;
  t_die_after = 500;
  if (setjmp(t_die_jmp) == 0) {
    for (;;) {
      unsigned k = umbp_ring_dequeue_burst(m->ring, buf, 8, 51);
      for (unsigned j = 0; j < k; j++) {
        int r = mt_mark(m, &buf[2 * j]);
        if (r > 0) atomic_fetch_add(&m->dups, 1);
        if (r < 0) atomic_fetch_add(&m->bad, 1);
      }
      atomic_fetch_add(&m->consumed, k);
      if (!k) sched_yield();
    }
  }
  atomic_store_explicit(&m->zombie_dead[1], 1, memory_order_release);
  return NULL;
}

static void *live_consumer(void *arg) {
  struct mt_arg *a = arg;
  struct mt *m = a->m;
  uint64_t buf[16];
  int stop_seen = 0;
  for (;;) {
    while (atomic_load_explicit(&m->hold, memory_order_relaxed)) sched_yield();
    unsigned k = umbp_ring_dequeue_burst(m->ring, buf, 1 + a->id * 7, (uint16_t)(200 + a->id));
    for (unsigned j = 0; j < k; j++) {
      int r = mt_mark(m, &buf[2 * j]);
      if (r > 0) atomic_fetch_add(&m->dups, 1);
      if (r < 0) atomic_fetch_add(&m->bad, 1);
    }
    atomic_fetch_add(&m->consumed, k);
    if (!k) {
      if (stop_seen) break;
      if (atomic_load_explicit(&m->stop, memory_order_acquire))
        stop_seen = 1;
      else
        sched_yield();
    }
  }
  return NULL;
}

static void mt_cb(void *arg, const void *elem) {
  struct mt *m = arg;
  assert_int_equal(mt_mark(m, elem), 0);
  atomic_fetch_add(&m->cb_n, 1);
}

static void test_threads_repair_live(void **state) {
  (void)state;
  struct mt m = {0};
  m.nprod = 2;
  m.per = env_u64("UMBP_RING_THREAD_N", 100000) / 4 + 2000;
  m.burst = 1;
  m.ring = ring_new(32, 16);
  m.bitmap = calloc((m.per * MT_MAXP + 63) / 64, sizeof *m.bitmap);
  m.prod_left = 2;
  pthread_t p[2], c[2], zp, zc;
  struct mt_arg pa[2], ca[2];
  for (unsigned i = 0; i < 2; i++) {
    pa[i] = (struct mt_arg){&m, i};
    ca[i] = (struct mt_arg){&m, i};
    assert_int_equal(pthread_create(&c[i], NULL, live_consumer, &ca[i]), 0);
    assert_int_equal(pthread_create(&p[i], NULL, mt_producer, &pa[i]), 0);
  }
  assert_int_equal(pthread_create(&zc, NULL, zombie_consumer, &m), 0);
  assert_int_equal(pthread_create(&zp, NULL, zombie_producer, &m), 0);
  /* Repair each zombie as soon as it is "dead", while the live threads run
   * (either zombie can wedge the ring until it is repaired, so poll both).
   * If everything was produced before the zombie consumer reached its fatal
   * claim (the scheduler can starve it), pause the live consumers and feed it
   * filler values (producer id 3). */
  unsigned rp = 0, rc = 0;
  int zp_done = 0, zc_done = 0;
  uint64_t filler = 0;
  while (!zp_done || !zc_done) {
    if (zp_done && !zc_done && atomic_load(&m.prod_left) == 0 && filler < m.per) {
      atomic_store(&m.hold, 1);
      uint64_t e[2] = {((uint64_t)3 << 40) | filler, 0};
      e[1] = ~e[0];
      if (umbp_ring_enqueue(m.ring, e, 1) == 0) filler++;
    }
    if (!zp_done && atomic_load_explicit(&m.zombie_dead[0], memory_order_acquire)) {
      pthread_join(zp, NULL);
      rp = umbp_ring_repair(m.ring, 50, mt_cb, &m);
      zp_done = 1;
    }
    if (!zc_done && atomic_load_explicit(&m.zombie_dead[1], memory_order_acquire)) {
      pthread_join(zc, NULL);
      rc = umbp_ring_repair(m.ring, 51, mt_cb, &m);
      zc_done = 1;
    }
    sched_yield();
  }
  atomic_store(&m.hold, 0);
  assert_int_equal(rp, 1);
  assert_true(rc >= 1 && rc <= 8);
  assert_int_equal(m.cb_n, rc);
  pthread_join(p[0], NULL);
  pthread_join(p[1], NULL);
  atomic_store_explicit(&m.stop, 1, memory_order_release);
  pthread_join(c[0], NULL);
  pthread_join(c[1], NULL);
  assert_int_equal(m.dups, 0);
  assert_int_equal(m.bad, 0);
  for (uint64_t pr = 0; pr < 4; pr++)
    for (uint64_t i = 0; i < m.per; i++) {
      uint64_t bit = pr * m.per + i;
      int want = pr < 2 || (pr == 2 && i < m.zombie_committed) || (pr == 3 && i < filler);
      int have = (int)((m.bitmap[bit / 64] >> (bit % 64)) & 1);
      if (want != have) fail_msg("producer %llu value %llu: want %d have %d", (unsigned long long)pr,
                                 (unsigned long long)i, want, have);
    }
  assert_int_equal(m.consumed + m.cb_n, 2 * m.per + m.zombie_committed + filler);
  if (filler) print_message("# repair_live: fed the zombie consumer %llu filler values\n", (unsigned long long)filler);
  assert_int_equal(umbp_ring_count(m.ring), 0);
  free(m.bitmap);
  free(m.ring);
}

/* ---- multi-process ---------------------------------------------------------------- */

static const char *g_helper_arg;
static char g_helper[PATH_MAX];
static unsigned g_addr_differs, g_addr_children, g_holds;

static const char *helper_path(void) {
  if (g_helper[0]) return g_helper;
  if (g_helper_arg) {
    snprintf(g_helper, sizeof g_helper, "%s", g_helper_arg);
    return g_helper;
  }
  const char *dir = getenv("UMBP_TEST_HELPER_DIR");
  const char *sub[] = {"/ring_helper", "/shm/ring_helper"};
  if (dir)
    for (int i = 0; i < 2; i++) {
      snprintf(g_helper, sizeof g_helper, "%s%s", dir, sub[i]);
      if (access(g_helper, X_OK) == 0) return g_helper;
    }
  ssize_t n = readlink("/proc/self/exe", g_helper, sizeof g_helper - 16);
  if (n > 0) {
    g_helper[n] = 0;
    char *slash = strrchr(g_helper, '/');
    if (slash) strcpy(slash, "/ring_helper");
    if (access(g_helper, X_OK) == 0) return g_helper;
  }
  g_helper[0] = 0;
  return NULL;
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

struct mp_cb_state {
  struct ring_mp_ctl *ctl;
  _Atomic uint64_t *bitmap;
  unsigned calls, dups, bad;
};
static void mp_cb(void *arg, const void *elem) {
  struct mp_cb_state *s = arg;
  int r = ring_mp_mark(s->ctl, s->bitmap, elem);
  s->calls++;
  if (r > 0) s->dups++;
  if (r < 0) s->bad++;
}

#define MP_CHECK(cond, ...)                           \
  do {                                                \
    if (!(cond)) {                                    \
      snprintf(err, sizeof err, __VA_ARGS__);         \
      goto out;                                       \
    }                                                 \
  } while (0)

static pid_t spawn_helper(const char *name, const char *role, unsigned child, unsigned pidx, unsigned burst,
                          uint64_t stop_at) {
  char a_child[16], a_pidx[16], a_burst[16], a_stop[24];
  snprintf(a_child, sizeof a_child, "%u", child);
  snprintf(a_pidx, sizeof a_pidx, "%u", pidx);
  snprintf(a_burst, sizeof a_burst, "%u", burst);
  snprintf(a_stop, sizeof a_stop, "%llu", (unsigned long long)stop_at);
  pid_t pid = fork();
  if (pid == 0) {
    char *const argv[] = {(char *)helper_path(), (char *)name, (char *)role, a_child, a_pidx, a_burst, a_stop, NULL};
    execv(argv[0], argv);
    _exit(127);
  }
  return pid;
}

/* Reap pid within the deadline; returns its wait status or -1. */
static int reap(pid_t pid, double deadline) {
  int st;
  for (;;) {
    pid_t r = waitpid(pid, &st, WNOHANG);
    if (r == pid) return st;
    if (r < 0 || now_s() > deadline) return -1;
    usleep(1000);
  }
}

/* One round: returns NULL or a description of what went wrong. */
static const char *mp_round(int kill_consumer, unsigned round, char *errbuf, size_t errlen) {
  static char err[512];
  err[0] = 0;
  uint64_t s = 0x9e3779b97f4a7c15ull * (round + 1) + (uint64_t)kill_consumer;
  xorshift(&s);
  const unsigned caps[] = {4, 16, 64, 256}, pbursts[] = {1, 4, 16}, cbursts[] = {1, 8, 32};
  const unsigned cap = caps[xorshift(&s) % 4], nprod = 3, ncons = 3, per = 3000;
  const unsigned pburst = pbursts[xorshift(&s) % 3], cburst = cbursts[xorshift(&s) % 3];
  const unsigned victim = kill_consumer ? nprod + (unsigned)(xorshift(&s) % ncons) : (unsigned)(xorshift(&s) % nprod);
  const uint64_t stop_at = kill_consumer ? 1 + xorshift(&s) % 200 : 1 + xorshift(&s) % per;
  const uint16_t vowner = RING_MP_OWNER(victim);
  pid_t pids[RING_MP_MAX_CHILD] = {0};
  unsigned nchild = nprod + ncons;
  char name[64];
  snprintf(name, sizeof name, "/umbp_ring_test_%d_%u_%d", (int)getpid(), round, kill_consumer);

  const uint64_t ring_off = RING_MP_CTL_BYTES, ring_bytes = umbp_ring_bytes(cap, RING_MP_ELEM);
  const uint64_t bitmap_off = ring_off + ((ring_bytes + 4095) & ~4095ull);
  const uint64_t bitmap_words = ((uint64_t)(nprod + 1) * per + 63) / 64;
  const uint64_t total = bitmap_off + ((bitmap_words * 8 + 4095) & ~4095ull);
  unsigned char *base = MAP_FAILED;
  int fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600);
  MP_CHECK(fd >= 0, "shm_open %s: %s", name, strerror(errno));
  MP_CHECK(ftruncate(fd, (off_t)total) == 0, "ftruncate: %s", strerror(errno));
  base = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  MP_CHECK(base != MAP_FAILED, "mmap: %s", strerror(errno));

  struct ring_mp_ctl *ctl = (struct ring_mp_ctl *)base;
  void *ring = base + ring_off;
  _Atomic uint64_t *bitmap = (_Atomic uint64_t *)(base + bitmap_off);
  MP_CHECK(umbp_ring_init(ring, ring_bytes, cap, RING_MP_ELEM) == 0, "ring init");
  ctl->total_bytes = total;
  ctl->ring_off = ring_off;
  ctl->ring_bytes = ring_bytes;
  ctl->bitmap_off = bitmap_off;
  ctl->bitmap_words = bitmap_words;
  ctl->nprod = nprod;
  ctl->per_prod = per;
  ctl->magic = RING_MP_MAGIC; /* the children are exec'd after this: fork orders it */

  for (unsigned c = 0; c < nchild; c++) {
    int prod = c < nprod;
    pids[c] = spawn_helper(name, prod ? "prod" : "cons", c, prod ? c : 0, prod ? pburst : cburst,
                           c == victim ? stop_at : 0);
    MP_CHECK(pids[c] > 0, "fork: %s", strerror(errno));
  }

  double deadline = now_s() + 30;
  while (atomic_load(&ctl->attached) < nchild) {
    MP_CHECK(now_s() < deadline, "only %u of %u children attached", ctl->attached, nchild);
    usleep(200);
  }
  atomic_store(&ctl->go, 1);

  /* Wait until the victim stops right after its claim.  If it is a consumer
   * and the producers are done before it got stop_at claims, feed it filler. */
  uint32_t filler = 0;
  int st;
  for (;;) {
    pid_t r = waitpid(pids[victim], &st, WUNTRACED | WNOHANG);
    if (r == pids[victim]) {
      MP_CHECK(WIFSTOPPED(st), "victim (child %u) ended without stopping: status 0x%x", victim, st);
      break;
    }
    MP_CHECK(r == 0, "waitpid victim: %s", strerror(errno));
    if (now_s() >= deadline && getenv("UMBP_RING_DEBUG")) {
      char cmd[256];
      snprintf(cmd, sizeof cmd, "gdb -p %d -batch -ex bt 2>&1 | tail -15; cat /proc/%d/status | head -3", (int)pids[victim], (int)pids[victim]);
      if (system(cmd)) {}
    }
    MP_CHECK(now_s() < deadline,
             "victim never reached claim %llu (it consumed %llu, attached %u, producers done %u, filler %u, "
             "ring count %llu)",
             (unsigned long long)stop_at, (unsigned long long)ctl->child[victim].consumed, ctl->attached,
             ctl->prod_done, filler, (unsigned long long)umbp_ring_count(ring));
    if (kill_consumer && atomic_load(&ctl->prod_done) == nprod && filler < per) {
      if (!atomic_exchange(&ctl->hold, 1)) g_holds++;
      uint64_t e[2] = {ring_mp_value(nprod, filler), 0};
      e[1] = e[0] ^ RING_MP_SALT;
      if (umbp_ring_enqueue(ring, e, RING_MP_PARENT_OWNER) == 0) filler++;
    } else {
      usleep(100);
    }
  }
  MP_CHECK(atomic_load_explicit(&ctl->child[victim].stopped, memory_order_acquire) == 1, "victim stopped elsewhere");
  unsigned inflight = atomic_load(&ctl->child[victim].inflight);
  atomic_store(&ctl->hold, 0);
  MP_CHECK(kill(pids[victim], SIGKILL) == 0, "kill: %s", strerror(errno));
  MP_CHECK(waitpid(pids[victim], &st, 0) == pids[victim] && WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL,
           "victim not killed: 0x%x", st);
  pids[victim] = 0;

  /* The reaper's part. */
  struct mp_cb_state cbs = {ctl, bitmap, 0, 0, 0};
  unsigned repaired = umbp_ring_repair(ring, vowner, mp_cb, &cbs);
  if (kill_consumer) {
    MP_CHECK(repaired >= 1 && repaired <= inflight && cbs.calls == repaired,
             "consumer repair: repaired %u, inflight %u, cb %u", repaired, inflight, cbs.calls);
  } else {
    MP_CHECK(repaired == inflight && cbs.calls == 0, "producer repair: repaired %u, inflight %u, cb %u", repaired,
             inflight, cbs.calls);
  }
  MP_CHECK(umbp_ring_repair(ring, vowner, mp_cb, &cbs) == 0, "second repair found work");

  for (unsigned c = 0; c < nprod; c++) {
    if (!pids[c]) continue;
    st = reap(pids[c], now_s() + 30);
    MP_CHECK(st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0, "producer %u: status 0x%x", c, st);
    pids[c] = 0;
  }
  /* Release: pairs with the consumers' acquire of stop. */
  atomic_store_explicit(&ctl->stop, 1, memory_order_release);
  for (unsigned c = nprod; c < nchild; c++) {
    if (!pids[c]) continue;
    st = reap(pids[c], now_s() + 30);
    MP_CHECK(st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0, "consumer %u: status 0x%x", c, st);
    pids[c] = 0;
  }

  /* Accounting. */
  MP_CHECK(ctl->dups == 0 && cbs.dups == 0, "duplicates: %llu + %u", (unsigned long long)ctl->dups, cbs.dups);
  MP_CHECK(ctl->bad == 0 && cbs.bad == 0, "corrupt payloads: %llu + %u", (unsigned long long)ctl->bad, cbs.bad);
  uint64_t expect = 0;
  for (unsigned p = 0; p <= nprod; p++) {
    uint64_t upto = p == nprod ? filler : (p == victim ? ctl->child[p].committed : per);
    expect += upto;
    for (uint32_t i = 0; i < per; i++) {
      int have = ring_mp_bit(ctl, bitmap, p, i);
      MP_CHECK(have == (i < upto), "producer %u value %u: %s (victim %u, committed %llu)", p, i,
               have ? "delivered but never committed" : "lost", victim, (unsigned long long)upto);
    }
  }
  uint64_t got = cbs.calls;
  for (unsigned c = nprod; c < nchild; c++) got += ctl->child[c].consumed;
  MP_CHECK(got == expect, "received %llu, expected %llu", (unsigned long long)got, (unsigned long long)expect);
  /* Not wedged: the ring is empty and a full lap goes through. */
  MP_CHECK(umbp_ring_count(ring) == 0, "count %llu after drain", (unsigned long long)umbp_ring_count(ring));
  for (unsigned lap = 0; lap < 2; lap++) {
    uint64_t e[2] = {0, 0};
    for (unsigned i = 0; i < cap; i++) MP_CHECK(umbp_ring_enqueue(ring, e, 1) == 0, "refill %u", i);
    MP_CHECK(umbp_ring_enqueue(ring, e, 1) == -ENOSPC, "over-full");
    for (unsigned i = 0; i < cap; i++) MP_CHECK(umbp_ring_dequeue(ring, e, 1) == 0, "redrain %u", i);
    MP_CHECK(umbp_ring_dequeue(ring, e, 1) == -EAGAIN, "over-drained");
  }
  for (unsigned c = 0; c < nchild; c++) {
    g_addr_children++;
    if (ctl->child[c].map_addr != (uint64_t)(uintptr_t)base) g_addr_differs++;
  }

out:
  for (unsigned c = 0; c < nchild; c++)
    if (pids[c] > 0) {
      kill(pids[c], SIGKILL);
      waitpid(pids[c], NULL, 0);
    }
  if (base != MAP_FAILED) munmap(base, total);
  shm_unlink(name);
  if (!err[0]) return NULL;
  snprintf(errbuf, errlen, "round %u (cap %u, bursts %u/%u, victim %u at claim %llu): %s", round, cap, pburst,
           cburst, victim, (unsigned long long)stop_at, err);
  return errbuf;
}

static void run_kill_rounds(int kill_consumer) {
  if (!helper_path()) fail_msg("ring_helper not found (argv[2] or UMBP_TEST_HELPER_DIR)");
  unsigned rounds = (unsigned)env_u64("UMBP_RING_KILL_ROUNDS", 20);
  g_addr_differs = g_addr_children = g_holds = 0;
  char buf[768];
  unsigned first = (unsigned)env_u64("UMBP_RING_KILL_FIRST", 0); /* to rerun one failing round */
  for (unsigned r = first; r < first + rounds; r++) {
    const char *e = mp_round(kill_consumer, r, buf, sizeof buf);
    if (e) fail_msg("%s", e);
  }
  print_message("# %u %s-kill rounds ok; %u/%u children mapped the segment elsewhere than the parent; "
                "%u rounds had to hold the other consumers to feed a starved victim\n",
                rounds, kill_consumer ? "consumer" : "producer", g_addr_differs, g_addr_children, g_holds);
  assert_true(g_addr_differs > 0);
}

static void test_mp_kill_producer(void **state) {
  (void)state;
  run_kill_rounds(0);
}
static void test_mp_kill_consumer(void **state) {
  (void)state;
  run_kill_rounds(1);
}

/* ---- main -------------------------------------------------------------------------- */

int main(int argc, char **argv) {
  const char *group = argc > 1 ? argv[1] : "all";
  if (argc > 2) g_helper_arg = argv[2];
  umbp_ring_test_hook = die_hook;

#define UNIT_TESTS                                                                            \
  cmocka_unit_test(test_bytes), cmocka_unit_test(test_init_errors), cmocka_unit_test(test_check_header_garbage), \
      cmocka_unit_test(test_check_header_guard_page), cmocka_unit_test(test_fifo_full_empty),            \
      cmocka_unit_test(test_wrap_many_laps), cmocka_unit_test(test_seq_wrap), cmocka_unit_test(test_bursts), \
      cmocka_unit_test(test_elem_sizes), cmocka_unit_test(test_overwrite), cmocka_unit_test(test_overwrite_tombstone),                             \
      cmocka_unit_test(test_overwrite_gives_up), cmocka_unit_test(test_overwrite_laps), cmocka_unit_test(test_overwrite_deq_lag), cmocka_unit_test(test_overwrite_killed), cmocka_unit_test(test_repair_writing),                 \
      cmocka_unit_test(test_repair_reading), cmocka_unit_test(test_repair_reading_unwedges),            \
      cmocka_unit_test(test_repair_bursts), cmocka_unit_test(test_repair_owners),                       \
      cmocka_unit_test(test_skips_in_burst)
#define THREAD_TESTS                                                                           \
  cmocka_unit_test(test_threads_single), cmocka_unit_test(test_threads_burst),                 \
      cmocka_unit_test(test_threads_overwrite), cmocka_unit_test(test_threads_repair_live)
  /* One group per run: meson's TAP parser wants a single plan. */
  const struct CMUnitTest unit[] = {UNIT_TESTS};
  const struct CMUnitTest threads[] = {THREAD_TESTS};
  const struct CMUnitTest both[] = {UNIT_TESTS, THREAD_TESTS};
  const struct CMUnitTest mp[] = {
      cmocka_unit_test(test_mp_kill_producer),
      cmocka_unit_test(test_mp_kill_consumer),
  };
  int rc;
  if (strcmp(group, "all") == 0)
    rc = cmocka_run_group_tests_name("ring", both, NULL, NULL);
  else if (strcmp(group, "unit") == 0)
    rc = cmocka_run_group_tests_name("ring_unit", unit, NULL, NULL);
  else if (strcmp(group, "threads") == 0)
    rc = cmocka_run_group_tests_name("ring_threads", threads, NULL, NULL);
  else if (strcmp(group, "mp") == 0)
    rc = cmocka_run_group_tests_name("ring_mp", mp, NULL, NULL);
  else {
    fprintf(stderr, "usage: %s [unit|threads|mp|all] [ring_helper]\n", argv[0]);
    return 2;
  }
  return rc ? 1 : 0;
}
