/* SPDX-License-Identifier: Apache-2.0 */
/*
 * ring_mp.h - the control block shared by test_ring (parent) and ring_helper
 * (exec'd children) in the multi-process ring tests.  Test-only.
 *
 * Segment: [ctl, RING_MP_CTL_BYTES][ring, ring_bytes][bitmap of delivered values].
 * Everything in it is an integer or an offset from the segment base (each
 * process maps it at its own address).
 *
 * Values: producer p's i-th value is ((p + 1) << 32) | i; p == nprod is the
 * parent's filler producer.  A payload is 16 bytes {v, v ^ RING_MP_SALT} so a
 * torn or stale payload is detected.  Bit p * per_prod + i of the bitmap is
 * set (fetch_or) by whoever receives the value: a consumer, or the parent's
 * repair callback; finding it already set is a duplicate.
 */
#ifndef UMBP_TEST_RING_MP_H
#define UMBP_TEST_RING_MP_H

#include <stdatomic.h>
#include <stdint.h>

#define RING_MP_MAGIC UINT64_C(0x31504d474e495254) /* "TRINGMP1" */
#define RING_MP_CTL_BYTES 4096
#define RING_MP_MAX_CHILD 16
#define RING_MP_ELEM 16
#define RING_MP_SALT UINT64_C(0x9e3779b97f4a7c15)
#define RING_MP_PARENT_OWNER 1
#define RING_MP_OWNER(child) ((uint16_t)(2 + (child)))

struct ring_mp_child {
  _Atomic uint64_t committed; /* producer: values fully enqueued so far (release after each call) */
  _Atomic uint64_t consumed;  /* consumer: values received */
  _Atomic uint64_t map_addr;  /* where this child mapped the segment */
  _Atomic uint32_t inflight;  /* claims made in the call the child stopped in */
  _Atomic uint32_t stopped;   /* set right before raise(SIGSTOP) */
};

struct ring_mp_ctl {
  uint64_t magic;
  uint64_t total_bytes;
  uint64_t ring_off, ring_bytes;
  uint64_t bitmap_off, bitmap_words;
  uint32_t nprod, per_prod;
  _Atomic uint32_t stop;      /* parent: producers gone and victim repaired; drain and exit */
  _Atomic uint32_t prod_done; /* producers that finished all their values */
  _Atomic uint32_t attached;
  _Atomic uint32_t go;        /* parent: every child attached, start */
  _Atomic uint32_t hold;      /* parent: consumers other than the victim pause between calls */
  uint32_t pad;
  _Atomic uint64_t dups, bad;
  struct ring_mp_child child[RING_MP_MAX_CHILD];
};
_Static_assert(sizeof(struct ring_mp_ctl) <= RING_MP_CTL_BYTES, "ctl fits its page");

static inline uint64_t ring_mp_value(uint32_t prod, uint32_t i) { return ((uint64_t)(prod + 1) << 32) | i; }

/* Record a received payload.  Returns 0 (first delivery), 1 (duplicate) or -1
 * (corrupt / out of range). */
static inline int ring_mp_mark(struct ring_mp_ctl *ctl, _Atomic uint64_t *bitmap, const uint64_t *payload) {
  uint64_t v = payload[0];
  if ((v ^ RING_MP_SALT) != payload[1]) return -1;
  uint64_t p = (v >> 32) - 1, i = v & 0xffffffffu;
  if ((v >> 32) == 0 || p > ctl->nprod || i >= ctl->per_prod) return -1;
  uint64_t bit = p * ctl->per_prod + i;
  uint64_t m = UINT64_C(1) << (bit % 64);
  uint64_t old = atomic_fetch_or_explicit(&bitmap[bit / 64], m, memory_order_relaxed);
  return (old & m) ? 1 : 0;
}

static inline int ring_mp_bit(const struct ring_mp_ctl *ctl, _Atomic uint64_t *bitmap, uint32_t p, uint32_t i) {
  uint64_t bit = (uint64_t)p * ctl->per_prod + i;
  return (atomic_load_explicit(&bitmap[bit / 64], memory_order_relaxed) >> (bit % 64)) & 1;
}

#endif
