/* SPDX-License-Identifier: Apache-2.0 */
/*
 * index.c — the block index: a hash table, slot states, pins and eviction,
 * all in the pool segment and shared by every process.
 *
 * Index source map (src/index/; each .c file opens with its concern's design note):
 *   index.c           this overview and the slot states; slot addresses; the index's part of the
 *                     segment (regions, fingerprint, hooks: umbp_index_module); region init; attach/detach
 *   index_shm.h       the index's structs in the segment (buckets, slot metadata, readers, namespaces)
 *   index_internal.h  struct umbp_index, the key hash, bucket words, declarations the files share
 *   index_inline.h    hot-path static inline helpers: thread slot, read sections, keys, probe, pin, counting
 *   table.c           bucket table and signatures; lookup, contains, prefix probe (single, bulk); way unlink
 *   threads.c         thread slots and lines, the process's instances, fork(), umbp_reclaim()
 *   pins.c            per-process pin bytes and their race with eviction; unpin
 *   lock.c            the namespace table's owner-id lock; naming a process that holds things up
 *   namespaces.c      namespace registration, quotas, lock-free block counts and their records
 *   events.c          the event ring (stored and removed events)
 *   evict.c           remove, CLOCK eviction, the background evictor thread
 *   reserve.c         free-slot rings; reserve, publish, abort
 *   reap.c            the reaper of a dead process (umbp_index_reap_proc), orphan sweep
 *   counters.c        per-thread counters and their flush; counter sums, slot census, index stats
 *   check.c           umbp_pool_check(): the invariants, verified with loads only
 *   inspect.c         the index's snapshots of umbp/admin.h (geometry, readers, pins, events), loads only
 *
 * Design note (overview).
 *
 * A block's index entry is its slot: the key lives in the slot's metadata
 * and a bucket way points at the slot (table.c). Nothing on the data path
 * takes a lock: lookups write only their own thread's line (and, to pin,
 * their pin byte), and validate what they read against the slot's state word
 * instead of relying on a grace period (table.c), so a removed slot is free
 * at once; publishers and removers change shared words by CAS only
 * (reserve.c, evict.c, namespaces.c). So a process stopped anywhere (SIGSTOP,
 * a debugger, a frozen cgroup) holds back only what it owns: its reserved
 * slots and its pins. A process may be killed between any two stores; what
 * it leaves half done is repaired by its reaper (reap.c).
 *
 * Slot states (slot_meta.state = state | owner << 8 | gen << 24; every
 * transition is a CAS that bumps gen, so there is no ABA):
 *
 *   FREE --reserve(X)--> RESERVED(X) --publish--> PUBLISHED --evict/remove(Y)-->
 *   EVICTING(Y) --pins seen--> PUBLISHED          (abort)
 *   EVICTING(Y) --no pins, way cleared, counted out--> FREE
 *   RESERVED(X) --abort / duplicate key--> FREE
 * Only X moves RESERVED(X); only Y moves EVICTING(Y); the reaper of a dead X
 * or Y moves them (reap.c). (RETIRED, a removed slot waiting for a grace
 * period, belongs to layouts before 6.)
 */
#include "index/index_inline.h"

#include <signal.h>
#include <stdlib.h>

#include "shm/module.h"

/* The error of a call on a NULL pool or a read-only handle (ix_get()): out
 * of line and cold, so that the inlined fast path of every call stays short. */
__attribute__((noinline, cold)) int umbp_ix_fail(umbp_pool *p) {
  if (!p) return umbp_fail(-EINVAL, "pool is NULL");
  if (p->forked) return umbp_pool_forked_fail(p);
  return umbp_fail(-EROFS, "pool '%s' is attached read-only", p->name);
}

int umbp_ix_stop_at;
__attribute__((cold, noinline)) void umbp_ix_stop_here(void) {
  umbp_ix_stop_at = 0;
  raise(SIGSTOP);
}

/* ---- ABI ------------------------------------------------------------------------
 * The key hash (umbp_key_hash6()), the bucket home (umbp_bucket_home()) and
 * the overflow filter bit (umbp_ovf_bit()) are part of the segment's ABI: a
 * process that hashed differently would look for keys in other buckets, or
 * skip the buckets a displaced key lives in, and miss or duplicate them. Their results on
 * fixed inputs are folded into the ABI fingerprint (segment.c), so two builds
 * that place keys differently refuse each other's pools at attach. The
 * inputs exercise every key word, the high bits (the signature) and a table
 * size that is not a power of two. */
static uint64_t abi_key_hash(const uint64_t w[6]) {
  /* on a CPU without AES-NI, the same results computed in software
   * (test_index): the fingerprint is checked before the hooks below refuse
   * such a CPU with their message */
  return umbp_ix_aes_ok() ? umbp_key_hash_w(w) : umbp_key_hash_soft(w);
}

uint64_t umbp_index_abi_part(void) { return umbp_index_abi_part_with(abi_key_hash); }

uint64_t umbp_index_abi_part_with(uint64_t (*hash)(const uint64_t w[6])) {
  static const uint64_t keys[][6] = {
      {0, 0, 0, 0, 0, 0},
      {1, 2, 3, 4, 5, 6},
      {0x0123456789abcdefull, 0xfedcba9876543210ull, 0xdeadbeefcafebabeull, 0x8badf00d0ddba11ull,
       0xffffffffffffffffull, 0x5555aaaa5555aaaaull},
  };
  static const uint32_t tables[] = {UMBP_MAX_PROBE, 1000003u, 0xfffffffbu};
  uint64_t acc = 0x756d62706b657973ull; /* "umbpkeys" */
  for (unsigned i = 0; i < sizeof keys / sizeof keys[0]; i++) {
    uint64_t h = hash(keys[i]);
    acc = umbp_rotl64(acc ^ h, 17) * 0x9e3779b97f4a7c15ull;
    acc ^= umbp_key_sig(h) | (uint64_t)umbp_ovf_bit(h) << 16;
    for (unsigned t = 0; t < sizeof tables / sizeof tables[0]; t++)
      acc = umbp_rotl64(acc ^ umbp_bucket_home(h, tables[t]), 23) * 0xff51afd7ed558ccdull;
  }
  return acc;
}

/* ---- the index's part of the segment (shm/module.h) --------------------------- */
#define IX_REGIONS                                                                                          \
  (1u << UMBP_REG_READERS | 1u << UMBP_REG_NAMESPACES | 1u << UMBP_REG_INDEXHDR | 1u << UMBP_REG_BUCKETS | \
   1u << UMBP_REG_SLOTMETA | 1u << UMBP_REG_PINS | 1u << UMBP_REG_EVENTS | 1u << UMBP_REG_COUNTERS)
#define IX_EVENTS_DEFAULT 65536u /* events the ring keeps when umbp_pool_params.event_capacity is 0 */

static uint64_t ix_align64(uint64_t v) { return (v + 63) & ~(uint64_t)63; }

static uint64_t ix_region_bytes(const struct umbp_shm_header *h, int r) {
  switch (r) {
  case UMBP_REG_READERS: return sizeof(struct umbp_reader_shm) * (uint64_t)UMBP_MAX_PROCS * UMBP_MAX_THREADS;
  case UMBP_REG_NAMESPACES: return sizeof(struct umbp_ns_shm) * (uint64_t)UMBP_MAX_NAMESPACES;
  case UMBP_REG_INDEXHDR: return ix_align64(sizeof(struct umbp_index_hdr));
  case UMBP_REG_BUCKETS: return sizeof(struct umbp_bucket) * (uint64_t)h->n_buckets;
  case UMBP_REG_SLOTMETA: return ix_align64(sizeof(struct umbp_slot_meta) * (uint64_t)h->slot_count);
  case UMBP_REG_PINS: return umbp_pin_region_bytes(h->slot_count);
  case UMBP_REG_EVENTS: return umbp_ring_bytes(h->event_capacity, sizeof(struct umbp_event_shm));
  case UMBP_REG_COUNTERS: return ix_align64(sizeof(struct umbp_counter_row) * (uint64_t)(UMBP_MAX_PROCS + 1));
  default: return 0;
  }
}

static int ix_layout(const umbp_pool_params *pp, struct umbp_shm_header *h) {
  int rc = umbp_ix_cpu_check();
  if (rc) return rc;
  uint64_t slots = pp->capacity / pp->slot_size; /* h->slot_count saturates at UINT32_MAX */
  if (slots > UMBP_MAX_SLOTS) /* a way holds slot + 1 in 24 bits */
    return umbp_fail(-EINVAL,
                     "capacity %llu bytes holds %llu slots of %llu bytes: at most %u slots are supported; "
                     "lower the capacity (--capacity) or raise the slot size (--slot-size)",
                     (unsigned long long)pp->capacity, (unsigned long long)slots,
                     (unsigned long long)pp->slot_size, UMBP_MAX_SLOTS);
  /* Bucket array: UMBP_BUCKET_WAYS (12) ways a bucket, 1.5 ways a slot (any
   * count, not a power of two), so a full pool fills 66.7% of the ways: probe
   * chains stay short, and the array (the one line a miss reads) stays small
   * enough for the TLB and caches (8 MiB for 1M slots). */
  h->n_buckets = UMBP_BUCKETS_FOR(h->slot_count);
  if (h->n_buckets < UMBP_MAX_PROBE) h->n_buckets = UMBP_MAX_PROBE;
  uint32_t want = pp->event_capacity ? pp->event_capacity : IX_EVENTS_DEFAULT, cap = 2;
  while (cap < want && cap < (1u << 31)) cap <<= 1; /* a power of two */
  h->event_capacity = cap;
  return 0;
}

static int ix_validate(const struct umbp_shm_header *h) {
  int rc = umbp_ix_cpu_check();
  if (rc) return rc;
  if (h->slot_count > UMBP_MAX_SLOTS || h->n_buckets < UMBP_MAX_PROBE || h->n_buckets < UMBP_BUCKETS_FOR(h->slot_count) ||
      h->event_capacity < 2 ||
      (h->event_capacity & (h->event_capacity - 1)))
    return umbp_fail(-EBADMSG, "pool creation parameters are inconsistent (slot size %llu, %u slots, "
                               "%u partitions): the header is corrupted",
                     (unsigned long long)h->slot_size, h->slot_count, h->n_partitions);
  return 0;
}


uint64_t umbp_index_module_abi_with(uint64_t key_part) {
  const uint64_t shape[] = {
      key_part, /* key hash and bucket placement: umbp_index_abi_part() */
      sizeof(struct umbp_slot_meta), _Alignof(struct umbp_slot_meta),
      sizeof(struct umbp_bucket), (size_t)umbp_pin_stride(1),
      sizeof(struct umbp_reader_shm), sizeof(struct umbp_ns_shm),
      sizeof(struct umbp_counter_row), sizeof(struct umbp_event_shm),
      sizeof(struct umbp_index_hdr), _Alignof(struct umbp_index_hdr),
      sizeof(struct umbp_key_shm),
      UMBP_MAX_NAMESPACES, UMBP_BUCKET_WAYS, UMBP_KEY_HASH_MAX,
  };
  return umbp_fnv1a(shape, sizeof shape, 0x756d627069647821ull); /* "umbpidx!" */
}

static uint64_t ix_abi(void) { return umbp_index_module_abi_with(umbp_index_abi_part()); }

static void ix_info(umbp_pool *p, umbp_pool_info *i) {
  for (unsigned k = 0; k < i->n_partitions && k < UMBP_MAX_PARTITIONS; k++)
    i->partitions[k].free_slots = umbp_index_free_slots(p, k);
}

const struct umbp_shm_module umbp_index_module = {
    .name = "index",
    .regions = IX_REGIONS,
    .region_bytes = ix_region_bytes,
    .layout = ix_layout,
    .validate = ix_validate,
    .abi_part = ix_abi,
    .init = umbp_index_init_regions,
    .attach = umbp_index_attach_hook,
    .detach = umbp_index_detach_hook,
    .reap = umbp_index_reap_proc,
    .forget = umbp_index_forget,
    .info = ix_info,
};

/* ---- regions ------------------------------------------------------------------- */
UMBP_API int umbp_slot_partition(const umbp_pool *p, uint32_t slot) {
  if (!p || slot >= p->hdr->slot_count) return -1;
  return slot_part(p, slot);
}

UMBP_API void *umbp_slot_ptr(umbp_pool *p, uint32_t slot) {
  if (!p) return NULL;
  int part = slot_part(p, slot);
  if (part < 0) return NULL;
  /* the private copies (struct umbp_index) where this handle has them; the
   * result is bounds-checked against the mapping either way */
  const struct umbp_partition_desc *d = p->index ? &p->index->parts[part] : &p->hdr->partitions[part];
  uint64_t ss = p->index ? p->index->slot_size : p->hdr->slot_size;
  return umbp_pool_at(p, d->offset + (uint64_t)(slot - d->first_slot) * ss, ss);
}

UMBP_API uint64_t umbp_slot_size(const umbp_pool *p) { return p ? p->hdr->slot_size : 0; }
UMBP_API uint32_t umbp_slot_count(const umbp_pool *p) { return p ? p->hdr->slot_count : 0; }

int umbp_index_init_regions(umbp_pool *p) {
  struct umbp_shm_header *h = p->hdr;
  struct umbp_index_hdr *ih = umbp_pool_region(p, UMBP_REG_INDEXHDR);
  atomic_store_explicit(&ih->low_watermark_pct, 5, memory_order_relaxed);
  atomic_store_explicit(&ih->high_watermark_pct, 10, memory_order_relaxed);
  struct umbp_slot_meta *meta = umbp_pool_region(p, UMBP_REG_SLOTMETA);
  for (uint32_t s = 0; s < h->slot_count; s++) atomic_store_explicit(&meta[s].state, ST_MAKE(UMBP_SLOT_FREE, 0, 1), memory_order_relaxed);
  for (unsigned i = 0; i < h->n_partitions; i++) {
    const struct umbp_partition_desc *d = &h->partitions[i];
    uint32_t cap = 2;
    while (cap < d->slot_count) cap <<= 1;
    void *ring = part_ring(p, i);
    int rc = umbp_ring_init(ring, d->ring_bytes, cap, sizeof(uint64_t));
    struct umbp_ring_geo g;
    if (!rc) rc = umbp_ring_geo_get(ring, d->ring_bytes, &g);
    if (rc) return umbp_fail(rc, "cannot initialise the free-slot queue of partition %u", i);
    for (uint32_t s = 0; s < d->slot_count;) {
      uint64_t batch[256];
      unsigned n = 0;
      while (n < 256 && s < d->slot_count) batch[n++] = d->first_slot + s++;
      unsigned put = umbp_ring_enqueue_burst_g(ring, &g, batch, n, 0xffff);
      if (put != n) return umbp_fail(-EBADMSG, "free-slot queue of partition %u overflowed at init", i);
    }
  }
  int rc = umbp_ring_init(umbp_pool_region(p, UMBP_REG_EVENTS), h->regions[UMBP_REG_EVENTS].size,
                          h->event_capacity, sizeof(struct umbp_event_shm));
  if (rc) return umbp_fail(rc, "cannot initialise the event ring");
  return 0;
}

uint64_t umbp_index_free_slots(umbp_pool *p, unsigned part) {
  if (part >= p->hdr->n_partitions) return 0;
  struct umbp_ring_geo g;
  if (umbp_ix_ring_geo(p, (int)part, &g)) return 0;
  return umbp_ring_count_g(part_ring(p, part), &g);
}

_Static_assert(offsetof(struct umbp_index, ev_thread) % 64 == 0 &&
                   offsetof(struct umbp_index, ev_stored) / 64 < offsetof(struct umbp_index, ev_thread) / 64,
               "the evictor's fields are on a line no lookup reads");

int umbp_index_attach_hook(umbp_pool *p) {
  /* 64-byte aligned: the writers' fields have lines of their own (index_internal.h) */
  size_t ixsz = (sizeof(struct umbp_index) + 63) & ~(size_t)63;
  struct umbp_index *ix = aligned_alloc(64, ixsz);
  if (!ix) return umbp_fail(-ENOMEM, "pool '%s': no memory for this process's index state", p->name);
  memset(ix, 0, ixsz);
  struct umbp_shm_header *h = p->hdr;
  ix->p = p;
  ix->ih = umbp_pool_region(p, UMBP_REG_INDEXHDR);
  ix->buckets = umbp_pool_region(p, UMBP_REG_BUCKETS);
  ix->nb = h->n_buckets;
  ix->meta = umbp_pool_region(p, UMBP_REG_SLOTMETA);
  ix->pins = umbp_pool_region(p, UMBP_REG_PINS);
  ix->pin_stride = umbp_pin_stride(h->slot_count);
  ix->ns = umbp_pool_region(p, UMBP_REG_NAMESPACES);
  ix->slot_count = h->slot_count;
  ix->slot_size = h->slot_size;
  ix->events = umbp_pool_region(p, UMBP_REG_EVENTS);
  if (umbp_ring_geo_get(ix->events, h->regions[UMBP_REG_EVENTS].size, &ix->ev_geo)) {
    free(ix);
    return umbp_fail(-EBADMSG, "pool '%s': the event ring header is corrupted", p->name);
  }
  ix->n_parts = h->n_partitions < UMBP_MAX_PARTITIONS ? h->n_partitions : UMBP_MAX_PARTITIONS;
  memcpy(ix->parts, h->partitions, ix->n_parts * sizeof ix->parts[0]);
  ix->fc_cap = UMBP_FC_MAX;
  for (unsigned i = 0; i < ix->n_parts; i++)
    if (ix->parts[i].slot_count / UMBP_FC_SLOTS_PER < ix->fc_cap) ix->fc_cap = ix->parts[i].slot_count / UMBP_FC_SLOTS_PER;
  for (unsigned i = 0; i < h->n_partitions; i++) {
    ix->rings[i] = part_ring(p, i);
    if (umbp_ring_geo_get(ix->rings[i], h->partitions[i].ring_bytes, &ix->ring_geo[i])) {
      free(ix);
      return umbp_fail(-EBADMSG, "pool '%s': the free-slot queue of partition %u is corrupted", p->name, i);
    }
  }
  if (p->proc_slot >= 0) {
    ix->lines = umbp_pool_region(p, UMBP_REG_READERS);
    ix->readers = ix->lines + (size_t)p->proc_slot * UMBP_MAX_THREADS;
    ix->ctr = (struct umbp_counter_row *)umbp_pool_region(p, UMBP_REG_COUNTERS) + p->proc_slot;
  }
  if (umbp_ix_threads_init(ix)) {
    free(ix);
    return umbp_fail(-ENOMEM, "pool '%s': no memory for this process's index state", p->name);
  }
  if (umbp_ix_instance_add(ix)) {
    free(ix->tcache);
    free(ix);
    return umbp_fail(-EMFILE, "pool '%s': this process already has %d read-write pool handles attached: detach "
                              "one first",
                     p->name, UMBP_MAX_INSTANCES);
  }
  umbp_ix_feed_init(ix);
  /* a pool of a build that always recorded removed events, whose drainers
   * never turn recording on (layout.h) */
  if (p->proc_slot >= 0 && !(h->incompat_features & UMBP_FEAT_INCOMPAT_EVENTS_ON_DRAIN) &&
      !atomic_load_explicit(&ix->ih->events_on, memory_order_relaxed))
    atomic_store_explicit(&ix->ih->events_on, 1, memory_order_seq_cst);
  p->index = ix;
  return 0;
}

/* A fork() child's handle (umbp_pool_fork_child()): free the parent's index
 * state it still points at. Nothing shared is written: the reader lines, pins
 * and slots are the parent's. */
void umbp_index_forget(umbp_pool *p) {
  struct umbp_index *ix = p->forked_index;
  if (!ix) return;
  p->forked_index = NULL;
  umbp_ix_feed_fini(ix);
  free(ix->tcache);
  free(ix);
}

void umbp_index_detach_hook(umbp_pool *p) {
  struct umbp_index *ix = p->index;
  if (!ix) return;
  umbp_evictor_stop(p);
  /* Every thread line's counts into the process's row (the reaper below
   * leaves that row as it is: counters.c), and the lines given back. */
  umbp_ix_instance_remove(ix);
  /* A clean detach releases everything the process holds exactly as the
   * reaper of a dead process would (reap.c): count records, ring ledger,
   * pins (their reads cannot go on once the mapping is gone), reservations
   * (never published: freed), locks, counters. Without it a detached
   * process's RESERVED slots stayed under an owner id nobody would ever reap
   * (the registry slot is FREE, so no reaper looks at it, and a later
   * claimant starts clean): lost for good. We hold our own registry lock,
   * which is what the reaper holds; the caller promises no other thread of
   * ours is inside a call on this handle. */
  if (p->proc_slot >= 0) umbp_index_reap_proc(p, (unsigned)p->proc_slot);
  if (p->proc_slot >= 0) atomic_store_explicit(&p->procs[p->proc_slot].thread_bits, 0, memory_order_release);
  umbp_ix_feed_fini(ix);
  free(ix->tcache);
  free(ix);
  p->index = NULL;
}
