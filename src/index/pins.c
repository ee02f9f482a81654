/* SPDX-License-Identifier: Apache-2.0 */
/*
 * pins.c — pins: which process holds which block, and their race with
 * eviction. pin_at() and pin_slot(), on the lookup path, are static inline in
 * index_inline.h.
 *
 * Design note.
 *
 * Pins. A pin is a count byte per (registry slot, slot), laid out
 * process-major: each registry slot's bytes are one dense array (1 MiB for 1M
 * slots; pin_at()), so a pin writes a line of its own process's array, in a
 * region that stays in cache and TLB, rather than a per-slot line of a region
 * the size of the metadata. A process only writes its own bytes, so reaping a
 * dead process (or detaching) zeroes exactly its pins. Pinning races with
 * eviction in Dekker style: the pinner increments its byte then re-reads the
 * state word; the evictor CASes the state to EVICTING then reads the pin bytes
 * of every process in the header's pin_procs mask; all are seq_cst, so at
 * least one sees the other: either the pinner sees EVICTING and backs off (a
 * miss), or the evictor sees the pin and restores PUBLISHED. A process sets
 * its mask bit (seq_cst) before its first pin, so an evictor whose mask load
 * misses the bit comes before that pin's state load and is seen by it.
 */
#include "index/index_inline.h"

/* Whether no process pins slot s (seq_cst loads: the remover's side of the
 * Dekker pair with pin_slot()). */
bool umbp_ix_pins_clear(_Atomic uint8_t *pins, uint64_t stride, struct umbp_index_hdr *ih, uint32_t s) {
  uint64_t m = atomic_load_explicit(&ih->pin_procs, memory_order_seq_cst);
  for (; m; m &= m - 1)
    if (atomic_load_explicit(pin_at(pins, stride, (unsigned)__builtin_ctzll(m), s), memory_order_seq_cst)) return false;
  return true;
}

/* Zero registry slot q's pins (its process detached or died), then its bit. */
void umbp_ix_pins_drop_proc(_Atomic uint8_t *pins, uint64_t stride, struct umbp_index_hdr *ih, uint32_t slots,
                            unsigned q) {
  _Atomic uint64_t *w = (_Atomic uint64_t *)(void *)pin_at(pins, stride, q, 0);
  for (uint64_t i = 0; i < (slots + 7) / 8; i++)
    if (atomic_load_explicit(&w[i], memory_order_relaxed)) atomic_store_explicit(&w[i], 0, memory_order_release);
  atomic_fetch_and_explicit(&ih->pin_procs, ~(1ull << q), memory_order_seq_cst);
}

/* Our bit in pin_procs, before our first pin: a remover that reads the mask
 * after its state CAS (seq_cst) and misses the bit cannot miss a pin that
 * pin_slot() then completes (the OR precedes the pin's seq_cst RMW). */
__attribute__((noinline, cold)) void umbp_ix_pin_bit_set(struct umbp_index *ix) {
  atomic_fetch_or_explicit(&ix->ih->pin_procs, 1ull << ix->p->proc_slot, memory_order_seq_cst);
  atomic_store_explicit(&ix->pin_bit, true, memory_order_relaxed);
}

/* Drop one of this process's (registry slot q's) pins on slot: umbp_unpin()
 * after its handle checks, and each slot of umbp_unpin_bulk(), which calls
 * this rather than the exported umbp_unpin() (a call through the PLT a slot). */
static inline int unpin_one(struct umbp_index *ix, unsigned q, uint32_t slot) {
  if (slot >= ix->slot_count) return umbp_fail(-EINVAL, "slot %u is out of range", slot);
  _Atomic uint8_t *pb = pin_at(ix->pins, ix->pin_stride, q, slot);
  /* only this process writes its pin byte, but its threads race: a byte that
   * is 0 now cannot be ours to drop; one that is not stays >= 1 until we drop it
   * unless another of our threads unpins the same pin twice (a caller bug) */
  if (atomic_load_explicit(pb, memory_order_relaxed) == 0)
    return umbp_fail(-EINVAL, "slot %u is not pinned by this process", slot);
  /* release: our reads of the block happen before an evictor sees the pin gone */
  atomic_fetch_sub_explicit(pb, 1, memory_order_release);
  return 0;
}

UMBP_API int umbp_unpin(umbp_pool *p, uint32_t slot) {
  if (p && p->forked) return umbp_pool_forked_fail(p); /* a fork() child's copy of the handle */
  if (!p || !p->index) return umbp_ix_fail(p);      /* -EINVAL (NULL) or -EROFS (read-only) */
  return unpin_one(p->index, p->proc_slot, slot);
}

UMBP_API int umbp_unpin_bulk(umbp_pool *p, unsigned n, const uint32_t *slots) {
  if (p && p->forked) return umbp_pool_forked_fail(p);
  if (!p || !p->index) return umbp_ix_fail(p);
  if (n && !slots) return umbp_fail(-EINVAL, "umbp_unpin_bulk: slots is NULL for n = %u", n);
  int rc = 0;
  for (unsigned i = 0; i < n; i++)
    if (slots[i] != UMBP_NO_SLOT) {
      int r = unpin_one(p->index, p->proc_slot, slots[i]);
      if (r && !rc) rc = r;
    }
  return rc;
}

