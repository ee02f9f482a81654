/* SPDX-License-Identifier: Apache-2.0 */
/*
 * reserve.c — the free-slot rings and a block's way into the index:
 * umbp_reserve(), umbp_publish(), umbp_abort(), and giving a slot back to its
 * ring.
 *
 * Design note.
 *
 * Free slots travel on one MPMC ring per partition (shm/ring.h). A consumer
 * takes a slot id with a two-phase dequeue and moves the slot FREE ->
 * RESERVED(X) before completing the dequeue; a producer records the slot in
 * its thread's ledger (proc_slot.inflight_slot) before it frees it. The
 * reaper of X therefore finds every slot X held in a half-finished ring
 * operation: in a claimed cell, or in the ledger (see umbp_index_reap_proc()
 * in reap.c).
 *
 * The ring is an accelerator, not the authority: a slot is free iff its
 * state word says FREE, and whoever CASes FREE -> RESERVED owns it. That is
 * what keeps a stopped process from stopping the others here. The ring is a
 * FIFO of cells (shm/ring.h), and a process stopped between claiming a cell
 * and completing it (a producer filling it, a consumer emptying it) holds
 * that cell until it resumes: consumers cannot pass a cell still being
 * filled, and producers that lap round to a cell still being emptied find
 * the ring full. So a free gives up on a ring that stays full for
 * UMBP_FREE_RING_WAIT_NS and leaves the slot FREE off the ring, counted in
 * the partition's off_ring hint; and a reserve that finds the ring empty
 * while it holds entries (stuck behind a cell being filled) for
 * UMBP_RESERVE_STUCK_NS, or finds off_ring set, scans the partition's state
 * words for FREE slots. Entries made stale (their slot was taken off-ring by
 * a scan, or a reaper enqueued a dead process's FREE slot that another
 * process had taken meanwhile, umbp_ix_requeue_slot()) are dropped by the
 * consumer that meets them, whose CAS on the state word fails; a slot may so
 * be on the ring twice, harmlessly.
 *
 * Harmless to correctness, but not free: a ring's entry count is the
 * partition's free-slot figure (watermark eviction, umbp_admin_free_slots(),
 * inspect's partition table), and a
 * ring full of stale entries sends frees off it. A ring held up for a few
 * milliseconds on a busy host (a producer preempted between its claim and its
 * publish) fills with them: every reserve meanwhile scans, and every slot a
 * scan takes that was on the ring, once evicted and freed, is enqueued again
 * behind the hold. So a scan that took slots marks the partition untidy
 * (index header), as do a reaper's re-enqueue and the reaper of a process
 * that died (maybe inside a scan), and umbp_ix_tidy() (each evictor thread's
 * period, umbp_reclaim()) puts that ring right: it takes every entry once,
 * drops the stale and repeated ones, puts each FREE slot back at once, then
 * puts back FREE slots that were left off the ring (tidy_part()). The
 * off-ring hint is cleared only by a scan that looked at every slot, by a
 * CAS that also counts clears, so that a clear cannot erase a free made
 * during the scan (off_ring_add()). A wait for a held-up ring counts as held
 * up only while nobody dequeues, and yields the CPU after a short spin: on an
 * oversubscribed host the holder may be waiting for this very CPU, and a
 * waiter that was itself descheduled past its deadline must not take the
 * ring for held up.
 *
 * The thread's slot cache. A slot that umbp_remove() takes out of the index
 * stays with the removing thread, RESERVED under the process's id, and the
 * thread's next umbp_reserve() takes it back (a stack: the slot removed last
 * first), instead of a trip round the free ring: the ring puts a freed slot
 * behind every other free one, so the next reserve gets the slot freed
 * longest ago, its ring cell, state word and data cold. Reuse at once is
 * safe for the same reason a removed slot is free at once: lookups validate
 * what they read against the state word, which moved on two generations (as
 * by way of FREE), and pins are checked before a removal. What bounds the
 * slots others cannot have:
 *  - a thread keeps UMBP_FC_MAX slots at most, and one per UMBP_FC_SLOTS_PER
 *    slots of the smallest partition, so none in small pools;
 *  - only a thread that also reserves keeps: one that removes more than its
 *    limit without a reserve between (one that took a kept slot, or any
 *    while it keeps none) puts every kept slot back and keeps none until it
 *    reserves again; so a thread that only removes, or reserves only on
 *    another partition, holds nothing after a burst, and at most its limit
 *    after a short one;
 *  - a reserve that would fail for want of a slot takes its own kept ones
 *    whatever its namespace's quota;
 *  - the thread's exit and a detach put them back on their rings
 *    (line_release() in threads.c); the reaper of a process that dies frees
 *    them as it frees any reservation of the dead.
 * Kept slots count as reserved (census, inspect, metrics), not free. A kept
 * slot is handed out or given back only if its state word is still the one
 * it was kept with, so a caller's umbp_abort() of a slot number it was never
 * given cannot make two owners of it. Only umbp_remove() keeps: eviction (on
 * demand or by the evictor thread) and umbp_clear_ns() make room for every
 * process, so their slots go back on the ring.
 */
#include "index/index_inline.h"

#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* The last free ring this process found stuck full (process-local): later
 * frees try it once and give up at once, until one gets through. */
static void *_Atomic stuck_ring;

/* The geometry of partition part's free ring (part >= 0) or of the event
 * ring (part < 0): the private copy taken at attach, or, in a process without
 * index state (a reaper inside attach, before umbp_index_attach_hook()), one
 * taken now from the validated header. 0 or -EBADMSG. */
int umbp_ix_ring_geo(umbp_pool *p, int part, struct umbp_ring_geo *ret) {
  if (part >= (int)p->hdr->n_partitions || part >= UMBP_MAX_PARTITIONS) return -EBADMSG;
  if (p->index) {
    *ret = part < 0 ? p->index->ev_geo : p->index->ring_geo[part];
    return 0;
  }
  if (part < 0) return umbp_ring_geo_get(umbp_pool_region(p, UMBP_REG_EVENTS), p->hdr->regions[UMBP_REG_EVENTS].size, ret);
  return umbp_ring_geo_get(part_ring(p, (unsigned)part), p->hdr->partitions[part].ring_bytes, ret);
}

/* Partition part's free ring may hold stale entries (design note above). */
void umbp_ix_mark_untidy(struct umbp_index_hdr *ih, unsigned part) {
  uint64_t bit = 1ull << part;
  if (!(atomic_load_explicit(&ih->untidy, memory_order_relaxed) & bit))
    atomic_fetch_or_explicit(&ih->untidy, bit, memory_order_relaxed);
}

/* The off-ring hint (index_shm.h): a free that left a slot off the ring adds
 * one to the low half (once saturated, to the high half); a scan that looked
 * at every slot since it read the word w clears it by one CAS from w that
 * zeroes the low half and adds one to the high half. The CAS fails if a free came in meanwhile
 * (the low half moved) or another scan cleared it (the high half moved,
 * even if frees brought the low half back to the same count). */
static void off_ring_add(struct umbp_index_hdr *ih, unsigned part) {
  uint32_t w = atomic_load_explicit(&ih->off_ring[part], memory_order_relaxed);
  /* a saturated count still changes the word (its high half), so that a
   * clear from an older value fails */
  while (!atomic_compare_exchange_weak_explicit(&ih->off_ring[part], &w,
                                                (w & 0xffffu) == 0xffffu ? w + 0x10000u : w + 1,
                                                memory_order_release, memory_order_relaxed)) {
  }
}

static void off_ring_clear(struct umbp_index_hdr *ih, unsigned part, uint32_t w) {
  if (UMBP_OFF_RING_SET(w))
    atomic_compare_exchange_strong_explicit(&ih->off_ring[part], &w, ((w >> 16) + 1) << 16, memory_order_relaxed,
                                            memory_order_relaxed);
}

/* The enqueue of a FREE slot s (partition part) whose ledger entry names it:
 * umbp_ix_free_slot() and umbp_ix_requeue_slot(). Clears the ledger entry.
 * True if s went on the ring, false if it was left off it. */
static bool enqueue_free(umbp_pool *p, struct umbp_proc_slot *ledger_owner, unsigned tid, uint32_t s,
                         uint16_t as_owner, int part) {
  union ring_elem v = {.v = s};
  void *ring;
  struct umbp_ring_geo g;
  if (p->index) {
    ring = p->index->rings[part];
    g = p->index->ring_geo[part];
  } else {
    ring = part_ring(p, (unsigned)part);
    if (umbp_ix_ring_geo(p, part, &g)) { /* a corrupted header: the slot stays FREE off the queue (--check says so) */
      atomic_store_explicit(&ledger_owner->inflight_slot[tid], UINT32_MAX, memory_order_release);
      return false;
    }
  }
  /* The ring has a cell per slot, so it is never full of slots; but a process
   * killed or stopped while it held a cell claimed blocks producers once they
   * lap round to that cell, and entries a scan made stale take cells too. A
   * dead holder is reaped here; otherwise the slot is left off the ring
   * (design note above) after UMBP_FREE_RING_WAIT_NS. */
  uint64_t give_up = 0;
  for (unsigned spins = 0; umbp_ring_enqueue_burst_g(ring, &g, &v, 1, as_owner) != 1; spins++) {
    bool stuck = atomic_load_explicit(&stuck_ring, memory_order_relaxed) == ring;
    if (!stuck && spins < 128) {
      umbp_cpu_relax();
      continue;
    }
    uint64_t now = umbp_now_ns();
    if (!give_up) give_up = now + (stuck ? 0 : UMBP_FREE_RING_WAIT_NS);
    if (now >= give_up) {
      atomic_store_explicit(&stuck_ring, ring, memory_order_relaxed);
      struct umbp_index_hdr *ih = umbp_pool_region(p, UMBP_REG_INDEXHDR);
      off_ring_add(ih, (unsigned)part);
      atomic_store_explicit(&ledger_owner->inflight_slot[tid], UINT32_MAX, memory_order_release);
      return false;
    }
    struct umbp_ring_hdr *rh = ring;
    uint64_t pos = atomic_load_explicit(&rh->enq_pos, memory_order_relaxed);
    uint64_t cw = atomic_load_explicit(&umbp_ring__cellg(rh, &g, pos)->word, memory_order_relaxed);
    uint16_t o = umbp_ring__wowner(cw);
    if (o && o != as_owner && o <= UMBP_MAX_PROCS && !umbp_registry_alive(p, (unsigned)(o - 1)))
      umbp_registry_reap_slot(p, (unsigned)(o - 1));
    sched_yield(); /* the holder of the cell may be waiting for this CPU */
  }
  if (atomic_load_explicit(&stuck_ring, memory_order_relaxed) == ring)
    atomic_store_explicit(&stuck_ring, NULL, memory_order_relaxed);
  UMBP_STOP_POINT(UMBP_STOP_FREE_QUEUED);
  atomic_store_explicit(&ledger_owner->inflight_slot[tid], UINT32_MAX, memory_order_release);
  return true;
}

/* Put FREE slot s on its free queue, the ledger naming it while it travels
 * (see umbp_index_reap_proc()). Writes no state: the enqueue half of
 * umbp_ix_free_slot(), and what a reaper does for a FREE slot that a dead
 * process had freed but maybe not enqueued. Such a slot may have been taken
 * meanwhile (a reserve dequeued it, or a scan took it): the entry is then
 * stale, which a reserve drops (reserve_one()). */
void umbp_ix_requeue_slot(umbp_pool *p, struct umbp_proc_slot *ledger_owner, unsigned tid, uint32_t s,
                          uint16_t as_owner) {
  int part = slot_part(p, s);
  if (part < 0) return;
  atomic_store_explicit(&ledger_owner->inflight_slot[tid], s, memory_order_relaxed);
  (void)enqueue_free(p, ledger_owner, tid, s, as_owner, part);
  /* after the enqueue: a tidy pass that began before it would not reach the
   * entry */
  umbp_ix_mark_untidy(umbp_pool_region(p, UMBP_REG_INDEXHDR), (unsigned)part);
}

/* Free slot s, which as_owner owns (RESERVED, or EVICTING and unlinked: its
 * process, or the reaper of that process acting under its id), and put it on
 * its free queue. The ledger names s before s is FREE: the release store of
 * FREE orders the two for whoever acquires that state word. A reaper reads
 * the ledger after the process died (every store of it visible);
 * umbp_pool_check() (check.c) reads it while the process runs, but only for a
 * slot whose FREE state it loaded (seq_cst) first. No full fence. The state
 * is stored, not CASed: no one else writes a slot's state while its owner
 * holds it. A slot the caller does not own is left alone (a plain store
 * there would free another owner's block with its way still linked). True
 * if s is now FREE on its ring; false if it was left off the ring (the
 * off-ring hint counts it) or left alone. */
bool umbp_ix_free_slot(umbp_pool *p, struct umbp_proc_slot *ledger_owner, unsigned tid, uint32_t s,
                       uint16_t as_owner) {
  struct umbp_slot_meta *m = (struct umbp_slot_meta *)umbp_pool_region(p, UMBP_REG_SLOTMETA) + s;
  int part = slot_part(p, s);
  if (part < 0) return false;
  uint64_t w = atomic_load_explicit(&m->state, memory_order_acquire);
  if (UMBP_UNLIKELY((ST_STATE(w) != UMBP_SLOT_RESERVED && ST_STATE(w) != UMBP_SLOT_EVICTING) ||
                    ST_OWNER(w) != as_owner))
    return false;
  atomic_store_explicit(&ledger_owner->inflight_slot[tid], s, memory_order_relaxed);
  atomic_store_explicit(&m->state, ST_NEXT(w, UMBP_SLOT_FREE, 0), memory_order_release);
  return enqueue_free(p, ledger_owner, tid, s, as_owner, part);
}

/* ---- the thread's slot cache (design note above) --------------------------------- */
void umbp_ix_fc_keep_or_free(umbp_pool *p, struct tl_slot *t, uint32_t s, uint64_t ev) {
  struct umbp_index *ix = p->index;
  if (t->fc_rm < ix->fc_cap) {
    t->fc_rm++;
    if (t->fc_n < ix->fc_cap) {
      /* EVICTING -> RESERVED(us), two generations on as by way of FREE. A
       * store: no one else writes the state of a slot its owner holds. The
       * ledger is not needed: the slot travels nowhere, and a reaper of ours
       * frees it as RESERVED. */
      uint64_t w = ST_NEXT(ST_NEXT(ev, UMBP_SLOT_FREE, 0), UMBP_SLOT_RESERVED, p->owner_id);
      atomic_store_explicit(&ix->meta[s].state, w, memory_order_release);
      t->fc[t->fc_n] = s;
      t->fc_w[t->fc_n++] = w;
      return;
    }
  }
  /* s first: the removal is finished before the flush's frees */
  umbp_ix_free_slot(p, &p->procs[p->proc_slot], t->tid, s, p->owner_id);
  if (t->fc_rm >= ix->fc_cap && t->fc_n)
    umbp_ix_fc_flush(ix, t); /* removes without reserves: give back what it kept */
}

/* Free kept slot s if its state word is still kept, the one it was kept
 * with (a CAS, so that a slot a stray umbp_abort() freed and another thread
 * of ours reserved since, RESERVED by us again, is left to that thread). The
 * ledger names s before the CAS, as in umbp_ix_free_slot(). */
static void fc_free_kept(umbp_pool *p, struct tl_slot *t, uint32_t s, uint64_t kept) {
  int part = slot_part(p, s);
  if (part < 0 || p->proc_slot < 0) return;
  struct umbp_proc_slot *ps = &p->procs[p->proc_slot];
  atomic_store_explicit(&ps->inflight_slot[t->tid], s, memory_order_relaxed);
  if (!atomic_compare_exchange_strong_explicit(&p->index->meta[s].state, &kept, ST_NEXT(kept, UMBP_SLOT_FREE, 0),
                                               memory_order_release, memory_order_relaxed)) {
    atomic_store_explicit(&ps->inflight_slot[t->tid], UINT32_MAX, memory_order_release);
    return;
  }
  enqueue_free(p, ps, t->tid, s, p->owner_id, part);
}

void umbp_ix_fc_flush(struct umbp_index *ix, struct tl_slot *t) {
  while (t->fc_n) {
    --t->fc_n;
    fc_free_kept(ix->p, t, t->fc[t->fc_n], t->fc_w[t->fc_n]);
  }
}

/* A kept slot of partition part (-1: any) into *ret: the one kept last. A
 * kept slot whose state word moved since it was kept (a caller's
 * umbp_abort() of a slot number it was never given, and maybe a reserve
 * since) is no longer ours to hand out: dropped. */
static bool fc_take(struct umbp_index *ix, struct tl_slot *t, int part, uint32_t *ret) {
  for (unsigned i = t->fc_n; i-- > 0;) {
    uint32_t s = t->fc[i];
    if (part >= 0 && s - ix->parts[part].first_slot >= ix->parts[part].slot_count) continue;
    uint64_t kept = t->fc_w[i];
    /* out of the stack: the top moves into its place (the entries above i
     * were passed over already) */
    --t->fc_n;
    t->fc[i] = t->fc[t->fc_n];
    t->fc_w[i] = t->fc_w[t->fc_n];
    if (atomic_load_explicit(&ix->meta[s].state, memory_order_acquire) == kept) {
      *ret = s;
      t->fc_rm = 0;
      return true;
    }
  }
  return false;
}

/* ---- reserve / publish / abort ------------------------------------------------ */
/* FREE -> RESERVED(owner) on slot m: whether it was FREE and is now ours. */
static inline bool take_free(struct umbp_slot_meta *m, uint16_t owner) {
  uint64_t w = atomic_load_explicit(&m->state, memory_order_acquire);
  return ST_STATE(w) == UMBP_SLOT_FREE &&
         atomic_compare_exchange_strong_explicit(&m->state, &w, ST_NEXT(w, UMBP_SLOT_RESERVED, owner),
                                                 memory_order_acq_rel, memory_order_relaxed);
}

static int reserve_one(umbp_pool *p, struct umbp_index *ix, unsigned part, uint32_t *ret) {
  void *ring = ix->rings[part];
  const struct umbp_partition_desc *d = &ix->parts[part];
  for (;;) {
    union ring_elem e;
    struct umbp_ring_claim c;
    if (umbp_ring_dequeue_begin(ring, &ix->ring_geo[part], &e, p->owner_id, &c) != 0) return -ENOSPC;
    uint64_t v = e.v;
    uint32_t s = (uint32_t)v;
    /* FREE -> RESERVED(us) before the dequeue completes: a reaper of ours finds
     * the slot either in our claimed cell or RESERVED under our id */
    bool ok = v < ix->slot_count && s - d->first_slot < d->slot_count && take_free(&ix->meta[s], p->owner_id);
    umbp_ring_dequeue_commit(ring, &ix->ring_geo[part], &c);
    if (ok) {
      *ret = s;
      return 0;
    }
    /* a stale entry (its slot was taken by a scan, design note above) or
     * garbage from a bad writer: dropped */
  }
}

/* Reserve up to `want` FREE slots of partition `part` by their state words
 * (design note above): one pass at most, from the partition's scan hand. A
 * pass that ends wanting more has taken every slot that was FREE off the
 * ring when it started, so it clears the off_ring hint (off_ring_clear():
 * unless a free added to it meanwhile). */
static unsigned scan_reserve(umbp_pool *p, struct umbp_index *ix, unsigned part, unsigned want, uint32_t *out) {
  const struct umbp_partition_desc *d = &ix->parts[part];
  unsigned got = 0;
  uint32_t hint = atomic_load_explicit(&ix->ih->off_ring[part], memory_order_acquire);
  uint32_t start = atomic_load_explicit(&ix->ih->scan_hand[part], memory_order_relaxed);
  uint32_t i = 0;
  for (; i < d->slot_count && got < want; i++) {
    uint32_t s = d->first_slot + (start + i) % d->slot_count;
    if (take_free(&ix->meta[s], p->owner_id)) out[got++] = s;
  }
  atomic_store_explicit(&ix->ih->scan_hand[part], (start + i) % d->slot_count, memory_order_relaxed);
  /* a slot taken here may have an entry on the ring (or one on its way
   * there), now stale */
  if (got) umbp_ix_mark_untidy(ix->ih, part);
  if (got < want) off_ring_clear(ix->ih, part, hint);
  return got;
}

/* Whether partition part's free ring is held up (design note above): slots
 * were left off it, or it has entries that no dequeue could take for
 * UMBP_RESERVE_STUCK_NS while no other consumer got past its head either
 * (one retry loop; the common empty ring, with no entries, answers at once). */
static void *_Atomic held_ring;         /* process-local: the ring last found held up */
static _Atomic uint64_t held_ring_until; /* and until when to scan it at once */

static bool ring_held_up(umbp_pool *p, struct umbp_index *ix, unsigned part, uint32_t *ret) {
  if (UMBP_OFF_RING_SET(atomic_load_explicit(&ix->ih->off_ring[part], memory_order_relaxed))) return true;
  if (!umbp_ring_count_g(ix->rings[part], &ix->ring_geo[part])) return false;
  uint64_t now = umbp_now_ns();
  if (atomic_load_explicit(&held_ring, memory_order_relaxed) == ix->rings[part] &&
      now < atomic_load_explicit(&held_ring_until, memory_order_relaxed))
    return true;
  uint64_t end = now + UMBP_RESERVE_STUCK_NS;
  struct umbp_ring_hdr *rh = ix->rings[part];
  uint64_t head = 0;
  for (unsigned spins = 0;; spins++) {
    if (reserve_one(p, ix, part, ret) == 0) return false; /* got through: *ret is ours */
    /* where the first try stopped (past the stale entries it dropped) */
    if (!spins) head = atomic_load_explicit(&rh->deq_pos, memory_order_relaxed);
    /* the deadline is checked after a try, so a thread descheduled while it
     * waited tries once more before it gives up */
    if ((now = umbp_now_ns()) >= end) break;
    if (spins < 128) umbp_cpu_relax();
    else sched_yield(); /* the holder may be waiting for this CPU */
  }
  *ret = UMBP_NO_SLOT;
  /* others dequeued meanwhile: the ring moves, it is only empty for us */
  if (atomic_load_explicit(&rh->deq_pos, memory_order_relaxed) != head) return false;
  if (!umbp_ring_count_g(ix->rings[part], &ix->ring_geo[part])) return false;
  atomic_store_explicit(&held_ring, ix->rings[part], memory_order_relaxed);
  atomic_store_explicit(&held_ring_until, now + UMBP_RESERVE_STUCK_MEMO_NS, memory_order_relaxed);
  return true;
}

/* ---- tidying a free ring (design note above) ------------------------------------ */
/* One entry of partition part's ring: 1 and *ret (a FREE slot, now RESERVED
 * by us), 0 (dropped: a stale entry, or one that repeats a slot this pass
 * met before), -1 (nothing to take: empty, or its head is held up). Entries
 * at positions from end on may be this pass's own put-backs: *past is set
 * and a FREE slot there is taken even if met before (it is put back again),
 * never dropped. */
static int tidy_take(umbp_pool *p, struct umbp_index *ix, unsigned part, const uint64_t *seen, uint64_t end,
                     bool *past, uint32_t *ret) {
  void *ring = ix->rings[part];
  const struct umbp_partition_desc *d = &ix->parts[part];
  union ring_elem e;
  struct umbp_ring_claim c;
  if (umbp_ring_dequeue_begin(ring, &ix->ring_geo[part], &e, p->owner_id, &c) != 0) return -1;
  *past = (int64_t)(c.pos - end) >= 0;
  uint64_t v = e.v;
  uint32_t s = (uint32_t)v, i = s - d->first_slot;
  bool ok = v < ix->slot_count && i < d->slot_count && (*past || !(seen[i / 64] >> (i % 64) & 1)) &&
            take_free(&ix->meta[s], p->owner_id);
  umbp_ring_dequeue_commit(ring, &ix->ring_geo[part], &c);
  *ret = s;
  return ok;
}

/* Put slot s (RESERVED by us) back on its ring, and remember it if it went
 * there: a slot left off the ring (a full ring, counted in the off-ring
 * hint) stays one that the pass has not put back. */
static bool tidy_put_back(umbp_pool *p, struct tl_slot *t, uint64_t *seen, uint32_t s, uint32_t first) {
  uint32_t i = s - first;
  if (!umbp_ix_free_slot(p, &p->procs[p->proc_slot], t->tid, s, p->owner_id)) return false;
  seen[i / 64] |= 1ull << (i % 64);
  return true;
}

/* How long a tidy pass retries a ring whose head is a cell still being
 * filled (an enqueue in progress) before it leaves the rest for later. */
#define TIDY_HEAD_WAIT_NS (100ull * 1000ull)

/* One pass over partition part's ring: each entry on it when the pass
 * began is taken once; a FREE slot goes back on the ring at once (so a
 * tidier stopped or killed holds one slot at most, which its reaper frees);
 * anything else, and a repeat of a slot this pass already put back, is
 * dropped. A repeat is safe to drop: the slot's put-back entry is behind
 * every entry of the pass, so no consumer can have taken it yet. Returns the
 * entries dropped; *held is set (and the partition marked again) when the
 * ring's head stayed a cell still being filled, or a put-back found the ring
 * full. */
static int tidy_pass(umbp_pool *p, struct umbp_index *ix, struct tl_slot *t, unsigned part, uint64_t *seen,
                     bool *held, uint64_t *put) {
  const struct umbp_partition_desc *d = &ix->parts[part];
  struct umbp_ring_hdr *rh = ix->rings[part];
  memset(seen, 0, ((size_t)d->slot_count + 63) / 64 * sizeof *seen);
  int dropped = 0;
  *held = false;
  /* the entries enqueued before this pass: positions up to end */
  uint64_t end = atomic_load_explicit(&rh->enq_pos, memory_order_acquire), wait_end = 0;
  for (bool past = false; !past && (int64_t)(atomic_load_explicit(&rh->deq_pos, memory_order_relaxed) - end) < 0;) {
    uint32_t s;
    int r = tidy_take(p, ix, part, seen, end, &past, &s);
    if (r > 0) {
      if (!tidy_put_back(p, t, seen, s, d->first_slot)) {
        /* the ring is full behind a cell a stopped consumer holds: the slot
         * is off the ring (the hint counts it); stop before the pass moves
         * every free slot there */
        *held = true;
        umbp_ix_mark_untidy(ix->ih, part);
        break;
      }
      ++*put;
    } else if (r == 0) {
      dropped++;
    } else if (umbp_ring_count_g(ix->rings[part], &ix->ring_geo[part])) {
      /* a cell still being filled: an enqueue in progress, or a held-up one */
      uint64_t now = umbp_now_ns();
      if (!wait_end) wait_end = now + TIDY_HEAD_WAIT_NS;
      if (now < wait_end) {
        sched_yield();
        continue;
      }
      *held = true;
      umbp_ix_mark_untidy(ix->ih, part);
      break;
    } else {
      break; /* empty: others took the rest */
    }
    wait_end = 0;
  }
  return dropped;
}

/* Put partition part's free ring right if it is marked untidy or slots were
 * left off it. Whoever clears the mark makes the pass (one tidier per mark).
 * Then, with slots left off the ring and the ring not held up (a scan then
 * would take slots whose entries wait behind the hold), FREE slots that the
 * pass did not put back are put back. The off-ring hint is cleared from its
 * value before the pass (off_ring_clear()): a slot the pass put back may have
 * been taken, freed and left off the ring since, skipped here as put back,
 * but that free changed the hint, so the clear fails and the hint stays for
 * the next call. Returns the entries dropped plus the slots put back from
 * off the ring. */
static int tidy_part(umbp_pool *p, struct umbp_index *ix, struct tl_slot *t, unsigned part) {
  struct umbp_index_hdr *ih = ix->ih;
  const struct umbp_partition_desc *d = &ix->parts[part];
  uint64_t bit = 1ull << part;
  bool marked = atomic_load_explicit(&ih->untidy, memory_order_relaxed) & bit;
  uint32_t off = atomic_load_explicit(&ih->off_ring[part], memory_order_acquire);
  if (!marked && !UMBP_OFF_RING_SET(off)) return 0;
  if (marked) marked = atomic_fetch_and_explicit(&ih->untidy, ~bit, memory_order_acq_rel) & bit;
  uint64_t *seen = malloc(((size_t)d->slot_count + 63) / 64 * sizeof *seen);
  if (!seen) {
    if (marked) umbp_ix_mark_untidy(ih, part); /* the next call tries again */
    return 0;
  }
  bool held = false;
  struct umbp_ring_hdr *rh = ix->rings[part];
  uint64_t enq0 = atomic_load_explicit(&rh->enq_pos, memory_order_acquire), put = 0;
  int fixed = tidy_pass(p, ix, t, part, seen, &held, &put);
  if (!held && UMBP_OFF_RING_SET(off)) {
    for (uint32_t i = 0; i < d->slot_count; i++) {
      if (seen[i / 64] >> (i % 64) & 1) continue;
      uint32_t s = d->first_slot + i;
      if (!take_free(&ix->meta[s], p->owner_id)) continue;
      put += umbp_ix_free_slot(p, &p->procs[p->proc_slot], t->tid, s, p->owner_id);
      fixed++;
    }
    off_ring_clear(ih, part, off);
    /* others enqueued since the pass began: a slot this scan took may have
     * been one of theirs, its entry now stale (the next pass drops it) */
    if (atomic_load_explicit(&rh->enq_pos, memory_order_relaxed) - enq0 > put) umbp_ix_mark_untidy(ih, part);
  }
  free(seen);
  return fixed;
}

int umbp_ix_tidy(umbp_pool *p) {
  struct umbp_index *ix;
  struct tl_slot *t;
  int rc = ix_get(p, &ix, &t);
  if (rc) return rc;
  int fixed = 0;
  for (unsigned q = 0; q < ix->n_parts; q++) fixed += tidy_part(p, ix, t, q);
  return fixed;
}

static int pick_part(umbp_pool *p, int part) {
  if (part >= 0) return part;
  if (p->index->n_parts == 1) return 0; /* nothing to choose between */
  unsigned best = 0;
  uint64_t bestn = 0;
  for (unsigned i = 0; i < p->index->n_parts; i++) {
    uint64_t n = umbp_ring_count_g(p->index->rings[i], &p->index->ring_geo[i]);
    if (n > bestn) {
      bestn = n;
      best = i;
    }
  }
  return (int)best;
}

/* The -ENOSPC of a reserve that found no slot: says what holds the
 * partition's slots, from a census taken now. */
static __attribute__((cold, noinline)) int no_space_fail(umbp_pool *p, int q) {
  umbp_slot_census c;
  if (umbp_census_part(p, (unsigned)q, &c) != 0) memset(&c, 0, sizeof c);
  if (c.free_)
    return umbp_fail(-ENOSPC,
                     "no free slot could be taken on partition %d of pool '%s' although %llu are free: their "
                     "queue is damaged (run 'umbp inspect %s --check')",
                     q, p->name, (unsigned long long)c.free_, p->name);
  return umbp_fail(-ENOSPC,
                   "no free slot on partition %d of pool '%s' and nothing could be evicted (%llu pinned, %llu "
                   "reserved, %llu being evicted, %llu published): unpin blocks or enlarge the pool",
                   q, p->name, (unsigned long long)c.pinned, (unsigned long long)c.reserved,
                   (unsigned long long)c.evicting, (unsigned long long)c.published);
}

UMBP_API int umbp_reserve_bulk(umbp_pool *p, int part, uint32_t ns, unsigned n, uint32_t *ret_slots) {
  struct umbp_index *ix;
  struct tl_slot *t;
  int rc = ix_get(p, &ix, &t);
  if (rc) return rc;
  if (n && !ret_slots) return umbp_fail(-EINVAL, "umbp_reserve_bulk: ret_slots is NULL for n = %u", n);
  if (part >= (int)ix->n_parts || part < -1)
    return umbp_fail(-EINVAL, "partition %d does not exist (the pool has %u)", part, ix->n_parts);
  if (ns >= UMBP_MAX_NAMESPACES) return umbp_fail(-EINVAL, "namespace id %u is out of range", ns);
  unsigned got = 0;
  /* a reserve counts as one between removes if it took a kept slot
   * (fc_take()) or the thread keeps none: one that reserves only on another
   * partition than its kept slots' does not hold them for good */
  if (!t->fc_n) t->fc_rm = 0;
  if (t->fc_n && !umbp_ix_ns_over_quota(ix, ns))
    while (got < n && fc_take(ix, t, part, &ret_slots[got])) got++;
  if (got == n) return (int)got;
  int q = pick_part(p, part);
  for (unsigned attempt = 0; got < n && attempt < 8; attempt++) {
    if (umbp_ix_ns_over_quota(ix, ns)) umbp_ix_evict_part(p, t, (unsigned)q, n - got, ns);
    while (got < n && reserve_one(p, ix, (unsigned)q, &ret_slots[got]) == 0) got++;
    if (got == n) break;
    uint32_t one = UMBP_NO_SLOT;
    if (ring_held_up(p, ix, (unsigned)q, &one)) got += scan_reserve(p, ix, (unsigned)q, n - got, &ret_slots[got]);
    else if (one != UMBP_NO_SLOT) ret_slots[got++] = one;
    if (got == n) break;
    /* on-demand eviction, bounded: a batch at a time (an evicted slot is free at once) */
    unsigned want = n - got < 32 ? 32 : n - got;
    int ev = umbp_ix_evict_part(p, t, (unsigned)q, want, UINT32_MAX);
    if (ev <= 0 && attempt >= 2) {
      if (umbp_pool_reap(p) <= 0 && part < 0 && ix->n_parts > 1) q = (q + 1) % (int)ix->n_parts;
      else if (attempt >= 4) break;
    }
  }
  /* the thread's kept slots, whatever the namespace's quota, rather than
   * fail while it holds some */
  while (got < n && t->fc_n && fc_take(ix, t, part, &ret_slots[got])) got++;
  if (got == 0 && n) return no_space_fail(p, q);
  return (int)got;
}

UMBP_API int umbp_reserve(umbp_pool *p, int part, uint32_t ns, uint32_t *ret_slot) {
  if (!ret_slot) return umbp_fail(-EINVAL, "umbp_reserve: ret_slot is NULL");
  /* the common case without umbp_reserve_bulk()'s loop: valid arguments, the
   * namespace within its quota and a slot kept by this thread or on the
   * partition's free ring */
  struct umbp_index *ix;
  struct tl_slot *t;
  if (UMBP_LIKELY(ix_get(p, &ix, &t) == 0 && part >= -1 && part < (int)ix->n_parts && ns < UMBP_MAX_NAMESPACES) &&
      !umbp_ix_ns_over_quota(ix, ns) &&
      ((t->fc_n && fc_take(ix, t, part, ret_slot)) || reserve_one(p, ix, (unsigned)pick_part(p, part), ret_slot) == 0)) {
    if (!t->fc_n) t->fc_rm = 0; /* fc_take() resets it when it takes a kept slot */
    return 0;
  }
  uint32_t s;
  int rc = umbp_reserve_bulk(p, part, ns, 1, &s);
  if (rc < 0) return rc;
  *ret_slot = s;
  return 0;
}

static int check_reserved(umbp_pool *p, uint32_t slot, uint64_t *ret_w) {
  if (slot >= p->index->slot_count) return umbp_fail(-EINVAL, "slot %u is out of range", slot);
  uint64_t w = atomic_load_explicit(&p->index->meta[slot].state, memory_order_acquire);
  if (ST_STATE(w) != UMBP_SLOT_RESERVED || ST_OWNER(w) != p->owner_id)
    return umbp_fail(-EINVAL, "slot %u is not reserved by this process", slot);
  *ret_w = w;
  return 0;
}

UMBP_API int umbp_abort(umbp_pool *p, uint32_t slot) {
  struct umbp_index *ix;
  struct tl_slot *t;
  int rc = ix_get(p, &ix, &t);
  if (rc) return rc;
  uint64_t w;
  if ((rc = check_reserved(p, slot, &w))) return rc;
  umbp_ix_free_slot(p, &p->procs[p->proc_slot], t->tid, slot, p->owner_id);
  return 0;
}

/* Publishing takes no lock (the design note above): a stopped publisher holds
 * back no other. Two processes may publish the same key at once; each
 * checks for a published copy before it links its own (the common case: the
 * later one gets -EEXIST) and again after (seq_cst: of two that overlap, at
 * least one sees the other). When copies meet, the one in the lowest slot
 * stays: a publisher that sees a lower copy removes its own and gets
 * -EEXIST; one that sees a higher copy removes that one. A copy that is
 * pinned by then is left in place: two published copies of one key are
 * harmless (either serves a lookup; each is evicted in its turn). */
UMBP_API int umbp_publish(umbp_pool *p, uint32_t slot, const umbp_key *key) {
  struct umbp_index *ix;
  struct tl_slot *t;
  struct umbp_key_shm k;
  int rc = ix_get(p, &ix, &t);
  if (rc) return rc;
  uint64_t h;
  if ((rc = key_load(key, &k, &h))) return rc;
  /* the home bucket is written below: start its miss now */
  prefetch_w(&ix->buckets[umbp_bucket_home(h, ix->nb)]);
  uint64_t w = 0; /* set by check_reserved() when it returns 0 */
  if ((rc = check_reserved(p, slot, &w))) return rc;
  if (k.ns >= UMBP_MAX_NAMESPACES || atomic_load_explicit(&ix->ns[k.ns].state, memory_order_acquire) != 1)
    return umbp_fail(-EINVAL, "namespace %u is not registered: register it with umbp_ns_register()", k.ns);
  struct umbp_slot_meta *m = &ix->meta[slot];
  /* the reserve CAS (FREE -> RESERVED) came before; the fence keeps the key
   * stores after it for a lookup that validates an older state word of this
   * slot (way_check()); the key is made visible by the release store of
   * PUBLISHED below */
  atomic_thread_fence(memory_order_release);
  key_store(m, &k);
  atomic_store_explicit(&m->ref, 0, memory_order_relaxed);
  uint32_t home = umbp_bucket_home(h, ix->nb);
  struct umbp_bucket *hb = &ix->buckets[home];
  /* first writer wins: a copy already published */
  uint64_t st;
  uint32_t other = probe(ix, &k, h, &st);
  if (other != UMBP_NO_SLOT) {
    umbp_ix_free_slot(p, &p->procs[p->proc_slot], t->tid, slot, p->owner_id);
    count_ns(ix, t, k.ns, UMBP_CTR_DUPLICATES, 1);
    return umbp_fail(-EEXIST, "umbp_publish: the key is already published (slot %u holds it); slot %u is free "
                              "again: use the published copy",
                     other, slot);
  }
  /* counted while still RESERVED (a reaper of ours takes it back out) */
  ns_count_set(ix, t, k.ns, slot, 1);
  uint16_t sig = umbp_key_sig(h);
  bool placed = false;
  uint64_t pub = ST_NEXT(w, UMBP_SLOT_PUBLISHED, 0);
  for (unsigned d = 0; d < UMBP_MAX_PROBE && !placed; d++) {
    struct umbp_bucket *b = &ix->buckets[umbp_bucket_at(home, d, ix->nb)];
    for (unsigned i = 0; i < UMBP_BUCKET_WAYS; i++) {
      if (atomic_load_explicit(&b->slot[i], memory_order_relaxed)) continue;
      /* overflow first (release), so a reader that finds the home bucket without
       * the key still looks further (pairs with probe()'s acquire load) */
      if (d) umbp_ovf_add(&hb->ovf, d, umbp_ovf_bit(h));
      uint32_t z = 0;
      /* The slot word decides who owns an empty way: other inserters may race
       * for it here. release: the key written before is visible to a reader
       * that loads this word (pairs with bucket_slot()'s acquire load);
       * acquire: our signature store comes after the last remover's clearing
       * one (see umbp_ix_unlink_way()). */
      if (atomic_compare_exchange_strong_explicit(&b->slot[i], &z, umbp_way_word(sig, slot), memory_order_acq_rel,
                                                  memory_order_relaxed)) {
        /* the hint that makes lookups look at this way; release pairs with
         * nothing in particular: readers take it as a hint only */
        atomic_store_explicit(&b->sig[i], (uint8_t)sig, memory_order_release);
        /* PUBLISHED only once linked and signed: an evictor never sees a
         * published slot without its way; a reader that finds the way before
         * this store sees RESERVED and misses; one that sees PUBLISHED (acquire)
         * also sees the key. The fence orders it before the duplicate check's
         * loads below (Dekker with another publisher of the key, which does
         * the same: of two, at least one sees the other). */
        atomic_store_explicit(&m->state, pub, memory_order_release);
        atomic_thread_fence(memory_order_seq_cst);
        placed = true;
        break;
      }
      if (d) umbp_ovf_sub(&hb->ovf);
    }
  }
  if (!placed) {
    ns_count_set(ix, t, k.ns, slot, 0);
    umbp_ix_free_slot(p, &p->procs[p->proc_slot], t->tid, slot, p->owner_id);
    return umbp_fail(-ENOSPC, "index neighbourhood of this key is full (%d buckets): the pool's index is "
                              "overloaded",
                     UMBP_MAX_PROBE);
  }
  UMBP_STOP_POINT(UMBP_STOP_PUBLISH_LINKED);
  /* a copy published meanwhile by another process (design note above) */
  other = umbp_ix_probe_other(ix, &k, h, slot, &st);
  if (UMBP_UNLIKELY(other != UMBP_NO_SLOT)) {
    if (other < slot) {
      /* ours stays only if a pin made a remover put it back: PUBLISHED two
       * generations on (EVICTING, PUBLISHED); a slot taken from us is reused
       * only four or more on (EVICTING, FREE, RESERVED, ...) */
      if (umbp_ix_try_remove(p, t, slot, pub, UMBP_CTR_DUPLICATES, false, &h, false) == 0 ||
          atomic_load_explicit(&m->state, memory_order_acquire) != ST_MAKE(UMBP_SLOT_PUBLISHED, 0, ST_GEN(pub) + 2))
        return umbp_fail(-EEXIST, "umbp_publish: the key was published meanwhile (slot %u holds it); slot %u is "
                                  "free again: use the published copy",
                         other, slot);
      /* ours is pinned already: both copies stay */
    } else {
      umbp_ix_try_remove(p, t, other, st, UMBP_CTR_DUPLICATES, false, &h, false);
    }
  }
  count_ns(ix, t, k.ns, UMBP_CTR_INSERTS, 1);
  count_part(ix, t, slot_part(p, slot), UMBP_CTR_INSERTS, 1);
  if (atomic_load_explicit(&ix->ev_stored, memory_order_relaxed)) umbp_ix_emit(ix, UMBP_EV_STORED, &k);
  return 0;
}

UMBP_API int umbp_publish_bulk(umbp_pool *p, unsigned n, const uint32_t *slots, const umbp_key *keys, int *rc) {
  if (!p) return umbp_fail(-EINVAL, "pool is NULL");
  if (n && (!slots || !keys)) return umbp_fail(-EINVAL, "umbp_publish_bulk: slots or keys is NULL for n = %u", n);
  int ok = 0;
  for (unsigned i = 0; i < n; i++) {
    int r = umbp_publish(p, slots[i], &keys[i]);
    if (rc) rc[i] = r;
    ok += r == 0;
  }
  return ok;
}
