/* SPDX-License-Identifier: Apache-2.0 */
/*
 * check.c — umbp_pool_check(): verify the pool's invariants with loads only.
 *
 * Design note. The checker must work on a read-only mapping (inspect as a user
 * who may only read) and on a pool that other processes keep changing, and it
 * must never report a state that a running or killed process legitimately
 * leaves for a moment. It therefore takes no lock and writes nothing, and
 * judges each slot on a window:
 *
 *   registry + ledgers (A) -> state words (1) -> buckets (ways + keys) ->
 *   overflow counts -> free rings -> state words (2) -> registry + ledgers (B)
 *
 * Every slot transition bumps the generation in the state word, so a slot
 * whose word is equal in (1) and (2) did not move during the scan: what the
 * scan saw of it (the ways pointing at it, the ring cells holding it) held for
 * the whole window. Slots whose word changed are counted as "in flux" and not
 * judged. A slot named by any thread's free ledger (proc_slot.inflight_slot)
 * in A or B is being put back on a ring and skips the ring checks; one the
 * window found nowhere is looked for on its ring once more, since a free can
 * fall between the two ledger snapshots and enqueue after the ring scan
 * (free_slot_settled_since()). Registry
 * slots count as claimed when claimed in A or in B, so a process that attaches
 * or detaches during the scan does not produce a false report.
 *
 * Why each stable observation is exact (index.c is the reference):
 *  - a way is written only while its slot is RESERVED (publish links, then
 *    stores PUBLISHED) and cleared only while EVICTING (or by a reaper, before
 *    it frees the slot), so a way at a stable FREE slot is corruption;
 *    a stable PUBLISHED slot was linked for the whole window;
 *  - an overflow count is incremented before a displaced way is linked and
 *    decremented after it is cleared, so count >= displaced entries at every
 *    instant, in particular for the stable PUBLISHED ones read before the
 *    overflow load; the reach and the filter are reset only when the count
 *    reaches 0, which it cannot while such an entry is linked, so reach >=
 *    its distance and its filter bit is set;
 *  - a slot leaves a free ring only through a consumer claim (the cell turns
 *    READING, still holding it) followed by FREE -> RESERVED, or is taken off
 *    it by a scan while the ring is held up (reserve.c), which leaves the
 *    off_ring hint set until the scans have found every such slot; a stable
 *    FREE slot outside every ledger is therefore in a full cell unless that
 *    hint is set. Entries of slots that are no longer FREE, or twice on a
 *    ring, are harmless: the state CAS decides who gets a slot;
 *  - a namespace's count moves with a slot's counted flag: the count word's
 *    CAS first, the flag after it (a thread that died between them leaves a
 *    record its reaper finishes, namespaces.c), so the count may lead by one
 *    per thread that is between the two: the
 *    comparison allows one per registered thread of a claimed registry slot,
 *    plus the slots in flux, and is exact on a quiescent pool.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "index/index_internal.h"
#include "shm/ring.h"
#include "shm/ring_claim.h"
#include "umbp/check.h"

struct way_ent {
  uint32_t bucket;
  uint32_t ns;
  uint64_t v;
  uint64_t hash;
};

static void viol(umbp_check_report *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void viol(umbp_check_report *r, const char *fmt, ...) {
  r->n_violations++;
  if (r->n_listed >= UMBP_CHECK_MAX_LISTED) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(r->violation[r->n_listed++], UMBP_CHECK_MSG_MAX, fmt, ap);
  va_end(ap);
}

static const char *st_name(unsigned st) {
  switch (st) {
  case UMBP_SLOT_FREE: return "FREE";
  case UMBP_SLOT_RESERVED: return "RESERVED";
  case UMBP_SLOT_PUBLISHED: return "PUBLISHED";
  case UMBP_SLOT_EVICTING: return "EVICTING";
  case UMBP_SLOT_RETIRED: return "RETIRED";
  default: return "UNKNOWN";
  }
}

struct reg_snap {
  bool claimed[UMBP_MAX_PROCS];
  bool alive[UMBP_MAX_PROCS];
  bool orphans[UMBP_MAX_PROCS];
  unsigned threads; /* registered threads of claimed slots */
};

static void reg_snapshot(umbp_pool *p, struct reg_snap *s, uint8_t *inflight, uint32_t nslots,
                         umbp_check_report *r, bool report) {
  memset(s, 0, sizeof *s);
  for (unsigned i = 0; i < UMBP_MAX_PROCS; i++) {
    struct umbp_proc_slot *ps = &p->procs[i];
    /* orphans before state: an adopter claims (LIVE) before it clears orphans */
    s->orphans[i] = atomic_load_explicit(&ps->orphans, memory_order_seq_cst) != 0;
    uint32_t st = atomic_load_explicit(&ps->state, memory_order_seq_cst);
    if (st != UMBP_PROC_FREE && st != UMBP_PROC_LIVE && report)
      viol(r, "registry slot %u has state %u, which is neither free nor live", i, st);
    uint64_t bits = atomic_load_explicit(&ps->thread_bits, memory_order_relaxed);
    s->claimed[i] = st != UMBP_PROC_FREE;
    if (s->claimed[i]) {
      s->alive[i] = umbp_registry_alive(p, i);
      s->threads += (unsigned)__builtin_popcountll(bits);
    }
    for (unsigned t = 0; t < UMBP_MAX_THREADS; t++) {
      uint32_t v = atomic_load_explicit(&ps->inflight_slot[t], memory_order_seq_cst);
      if (v < nslots) inflight[v] = 1;
    }
  }
}

static void snap_states(const struct umbp_slot_meta *meta, uint32_t n, uint64_t *out) {
  for (uint32_t s = 0; s < n; s++) out[s] = atomic_load_explicit(&meta[s].state, memory_order_seq_cst);
}

static uint8_t sat_inc(uint8_t v) { return v == 255 ? 255 : (uint8_t)(v + 1); }

/* Scan one free ring: count each slot id found in a full cell. A ring whose
 * header is corrupted cannot be scanned: that is its one violation, and its
 * partition's slots are marked in unread[] so that none of them is judged
 * "on no free ring" (they may well be on it: processes attached before the
 * header changed go on using the ring with the geometry they copied). */
static void scan_ring(umbp_pool *p, uint32_t n, unsigned part, uint8_t *on_ring, uint8_t *claimed_cell,
                      uint8_t *unread, umbp_check_report *r) {
  const struct umbp_partition_desc *d = &p->hdr->partitions[part];
  void *ring = umbp_pool_at(p, d->ring_offset, d->ring_bytes);
  struct umbp_ring_geo g;
  if (!ring || umbp_ring_geo_get(ring, d->ring_bytes, &g)) {
    viol(r, "the free-slot ring header of partition %u is corrupted: its free slots cannot be used", part);
    for (uint64_t s = d->first_slot; s < (uint64_t)d->first_slot + d->slot_count && s < n; s++)
      unread[s] = 1;
    return;
  }
  struct umbp_ring_hdr *h = ring;
  for (uint64_t i = 0; i < g.capacity; i++) {
    struct umbp_ring_cell *c = umbp_ring__cellg(h, &g, i);
    for (unsigned tries = 0; tries < 64; tries++) {
      uint64_t w = atomic_load_explicit(&c->word, memory_order_acquire);
      unsigned kind = umbp_ring__wkind(w);
      bool full = ((umbp_ring__wseq(w) - i) & g.mask) == 1 && (kind == UMBP_RING_STABLE || kind == UMBP_RING_READING);
      if (!full) break;
      uint64_t v;
      memcpy(&v, c->payload, sizeof v);
      atomic_thread_fence(memory_order_acquire);
      if (atomic_load_explicit(&c->word, memory_order_relaxed) != w) continue;
      r->ring_entries++;
      if (v >= n || (uint32_t)v - d->first_slot >= d->slot_count) {
        viol(r, "the free ring of partition %u holds slot id %llu (cell %llu), which is not one of its slots "
                "%u..%u",
             part, (unsigned long long)v, (unsigned long long)i, d->first_slot, d->first_slot + d->slot_count - 1);
        break;
      }
      if (kind == UMBP_RING_READING) claimed_cell[v] = 1;
      else on_ring[v] = sat_inc(on_ring[v]);
      break;
    }
  }
}

/* A stable FREE slot (word w) that the window found on no ring and in no
 * ledger: whether it is on its ring now, or moved meanwhile. A free whose
 * ledger entry was written after snapshot A, whose FREE store came before
 * the states (1), and whose enqueue came after the ring scan passed its
 * cell and cleared its ledger entry before snapshot B is seen that way;
 * its slot is on the ring by now. A slot that is really lost is not. */
static bool free_slot_settled_since(umbp_pool *p, const struct umbp_slot_meta *meta, uint32_t s, uint64_t w) {
  for (unsigned i = 0; i < p->hdr->n_partitions && i < UMBP_MAX_PARTITIONS; i++) {
    const struct umbp_partition_desc *d = &p->hdr->partitions[i];
    if (s - d->first_slot >= d->slot_count) continue;
    void *ring = umbp_pool_at(p, d->ring_offset, d->ring_bytes);
    struct umbp_ring_geo g;
    if (!ring || umbp_ring_geo_get(ring, d->ring_bytes, &g)) return false;
    union ring_elem v = {.v = s};
    if (umbp_ring_contains(ring, &g, &v)) return true;
    return atomic_load_explicit(&meta[s].state, memory_order_seq_cst) != w;
  }
  return false;
}

/* Region `reg` of the shared header, read once: NULL unless it lies inside
 * the mapping and holds at least `need` bytes. The header was validated at
 * attach, but a stray write may have changed it since (processes keep what
 * they copied then); the check reads the live one and must not follow it
 * outside the mapping. */
static void *region_checked(umbp_pool *p, int reg, uint64_t need) {
  uint64_t off = p->hdr->regions[reg].offset, size = p->hdr->regions[reg].size;
  if (size < need) return NULL;
  return umbp_pool_at(p, off, size);
}

UMBP_API int umbp_pool_check(umbp_pool *p, umbp_check_report *ret) {
  if (!p || !ret) return umbp_fail(-EINVAL, "umbp_pool_check: pool and ret are required");
  const struct umbp_shm_header *h = p->hdr;
  const uint32_t n = h->slot_count, nb = h->n_buckets;
  const struct umbp_slot_meta *meta = region_checked(p, UMBP_REG_SLOTMETA, (uint64_t)n * sizeof *meta);
  const struct umbp_bucket *bk = region_checked(p, UMBP_REG_BUCKETS, (uint64_t)nb * sizeof *bk);
  const _Atomic uint8_t *pins = region_checked(p, UMBP_REG_PINS, umbp_pin_region_bytes(n));
  const struct umbp_ns_shm *nss = region_checked(p, UMBP_REG_NAMESPACES, UMBP_MAX_NAMESPACES * sizeof *nss);
  const struct umbp_index_hdr *ixh = region_checked(p, UMBP_REG_INDEXHDR, sizeof *ixh);
  void *evr = region_checked(p, UMBP_REG_EVENTS, 0);
  if (!n || !nb || !meta || !bk || !pins || !nss || !ixh || !evr) {
    umbp_check_report *hr = calloc(1, sizeof *hr);
    if (!hr) return umbp_fail(-ENOMEM, "umbp_pool_check: out of memory");
    viol(hr, "the pool header is corrupted: its %u slots and %u buckets do not fit its regions (or a region lies "
             "outside the segment); nothing else was checked",
         n, nb);
    *ret = *hr;
    free(hr);
    return 0;
  }

  umbp_check_report *r = calloc(1, sizeof *r);
  uint64_t *st1 = malloc((size_t)n * sizeof *st1), *st2 = malloc((size_t)n * sizeof *st2);
  uint8_t *inflight = calloc(n, 1), *on_ring = calloc(n, 1), *claimed_cell = calloc(n, 1), *ways_to = calloc(n, 1);
  uint8_t *cflag = calloc(n, 1); /* counted flags, read inside the scan window */
  uint8_t *ring_unread = calloc(n, 1); /* slots of partitions whose ring could not be scanned */
  uint32_t *need = calloc(nb, sizeof *need), *ovf = malloc((size_t)nb * sizeof *ovf);
  struct reg_snap *ra = malloc(sizeof *ra), *rb = malloc(sizeof *rb);
  size_t went = 0, wcap = 1024;
  struct way_ent *we = malloc(wcap * sizeof *we);
  uint64_t used_a[UMBP_MAX_NAMESPACES], used_b[UMBP_MAX_NAMESPACES], nsc[UMBP_MAX_NAMESPACES];
  int rc = 0;
  if (!r || !st1 || !st2 || !cflag || !ring_unread || !inflight || !on_ring || !claimed_cell || !ways_to || !need ||
      !ovf || !ra || !rb || !we) {
    rc = umbp_fail(-ENOMEM, "umbp_pool_check: not enough memory to check a pool of %u slots", n);
    goto out;
  }

  /* ---- the scan window ---- */
  reg_snapshot(p, ra, inflight, n, r, true);
  for (unsigned i = 0; i < UMBP_MAX_NAMESPACES; i++)
    used_a[i] = NSW_COUNT(atomic_load_explicit(&nss[i].count_word, memory_order_seq_cst));
  snap_states(meta, n, st1);
  for (uint32_t s = 0; s < n; s++) cflag[s] = atomic_load_explicit(&meta[s].counted, memory_order_acquire);
  for (uint32_t b = 0; b < nb; b++)
    for (unsigned w = 0; w < UMBP_BUCKET_WAYS; w++) {
      uint64_t v = umbp_way_get(&bk[b], w);
      if (!v) continue;
      r->ways++;
      uint32_t s = (uint32_t)v - 1;
      if ((uint32_t)v == 0 || s >= n) {
        viol(r, "bucket %u way %u holds slot id %lld, outside the pool's %u slots", b, w, (long long)(uint32_t)v - 1, n);
        continue;
      }
      if (went == wcap) {
        struct way_ent *nw = realloc(we, wcap * 2 * sizeof *we);
        if (!nw) {
          rc = umbp_fail(-ENOMEM, "umbp_pool_check: out of memory");
          goto out;
        }
        we = nw;
        wcap *= 2;
      }
      /* the key was written before the way was linked (publish); read it now,
       * judged later only if the slot did not move during the window */
      struct umbp_key_shm k;
      memcpy(&k, (const void *)&meta[s].key, sizeof k);
      we[went++] = (struct way_ent){.bucket = b, .ns = k.ns, .v = v, .hash = umbp_key_hash(&k)};
    }
  for (uint32_t b = 0; b < nb; b++) ovf[b] = atomic_load_explicit(&bk[b].ovf, memory_order_seq_cst);
  /* the count is read from the shared header, which a stray write may have
   * changed since attach (processes use the table they copied then): never
   * past the table's UMBP_MAX_PARTITIONS entries */
  uint32_t nparts = h->n_partitions;
  if (nparts == 0 || nparts > UMBP_MAX_PARTITIONS)
    viol(r, "the pool header counts %u partitions, not 1..%d: the header is corrupted", nparts, UMBP_MAX_PARTITIONS);
  if (nparts > UMBP_MAX_PARTITIONS) nparts = UMBP_MAX_PARTITIONS;
  for (unsigned i = 0; i < nparts; i++) scan_ring(p, n, i, on_ring, claimed_cell, ring_unread, r);
  {
    if (umbp_ring_check_header(evr, h->regions[UMBP_REG_EVENTS].size))
      viol(r, "the event ring header is corrupted: events cannot be delivered");
  }
  snap_states(meta, n, st2);
  for (unsigned i = 0; i < UMBP_MAX_NAMESPACES; i++)
    used_b[i] = NSW_COUNT(atomic_load_explicit(&nss[i].count_word, memory_order_seq_cst));
  reg_snapshot(p, rb, inflight, n, r, false);

  bool claimed[UMBP_MAX_PROCS], dead[UMBP_MAX_PROCS];
  for (unsigned i = 0; i < UMBP_MAX_PROCS; i++) {
    claimed[i] = ra->claimed[i] || rb->claimed[i];
    dead[i] = (ra->claimed[i] && !ra->alive[i]) || (rb->claimed[i] && !rb->alive[i]);
    if (rb->claimed[i]) {
      if (rb->alive[i]) r->procs_live++;
      else r->procs_dead++;
    }
  }
  unsigned threads = ra->threads > rb->threads ? ra->threads : rb->threads;

  /* ---- ways ---- */
  for (size_t i = 0; i < went; i++) {
    uint32_t s = (uint32_t)we[i].v - 1, b = we[i].bucket;
    if (st1[s] != st2[s]) continue;
    unsigned st = ST_STATE(st2[s]);
    ways_to[s] = sat_inc(ways_to[s]);
    if (st == UMBP_SLOT_FREE || st == UMBP_SLOT_RETIRED || st > UMBP_SLOT_RETIRED) {
      viol(r, "bucket %u points at slot %u, which is %s: a lookup could return a block that is not there", b, s,
           st_name(st));
      continue;
    }
    /* the signature is written after the slot word, before PUBLISHED: judged
     * only for a slot that stayed PUBLISHED through the window */
    if (st == UMBP_SLOT_PUBLISHED && (uint16_t)(we[i].v >> 32) != umbp_key_sig(we[i].hash))
      viol(r, "bucket %u's way for slot %u has signature 0x%04x, but the slot's key hashes to 0x%04x: lookups "
              "of it miss",
           b, s, (unsigned)(uint16_t)(we[i].v >> 32), (unsigned)umbp_key_sig(we[i].hash));
    uint32_t home = umbp_bucket_home(we[i].hash, nb), d = umbp_bucket_dist(home, b, nb);
    if (d >= UMBP_MAX_PROBE) {
      viol(r, "slot %u's key belongs to bucket %u but its way is in bucket %u, %u buckets on (lookups look at "
              "most %d)",
           s, home, b, d, UMBP_MAX_PROBE - 1);
      continue;
    }
    if (d && st == UMBP_SLOT_PUBLISHED) {
      need[home]++;
      if (d > UMBP_OVF_REACH(ovf[home]))
        viol(r, "bucket %u's overflow reach is %u but slot %u's key homed there lives %u buckets on: lookups of it "
                "miss",
             home, UMBP_OVF_REACH(ovf[home]), s, d);
      if (!(UMBP_OVF_FILTER(ovf[home]) & umbp_ovf_bit(we[i].hash)))
        viol(r, "bucket %u's overflow filter 0x%04x lacks the bit 0x%04x of slot %u's key, which is homed there and "
                "lives %u buckets on: batched lookups of it miss",
             home, UMBP_OVF_FILTER(ovf[home]), umbp_ovf_bit(we[i].hash), s, d);
    }
  }
  for (uint32_t b = 0; b < nb; b++)
    if (need[b] > UMBP_OVF_COUNT(ovf[b]))
      viol(r, "bucket %u's overflow count is %u but %u of the keys homed there live in later buckets: lookups "
              "of them can miss",
           b, UMBP_OVF_COUNT(ovf[b]), need[b]);

  /* ---- slots ---- */
  bool off_ring_any = false;
  {
    const struct umbp_index_hdr *ih = ixh;
    for (unsigned i = 0; i < h->n_partitions && i < UMBP_MAX_PARTITIONS; i++)
      off_ring_any |= UMBP_OFF_RING_SET(atomic_load_explicit(&ih->off_ring[i], memory_order_relaxed));
  }
  memset(nsc, 0, sizeof nsc);
  for (uint32_t s = 0; s < n; s++) {
    uint64_t w = st2[s];
    unsigned st = ST_STATE(w), own = ST_OWNER(w);
    if (st >= UMBP_SLOT_RETIRED) { /* RETIRED belongs to layouts before 6 */
      viol(r, "slot %u has state byte %u (word 0x%016llx), which is no known state", s, st, (unsigned long long)w);
      continue;
    }
    if (st1[s] != w) {
      r->slots_in_flux++;
      continue;
    }
    r->slots++;
    switch (st) {
    case UMBP_SLOT_FREE:
      if (own) viol(r, "slot %u is FREE but names owner %u", s, own);
      if (inflight[s] || ring_unread[s]) break;
      /* off the ring is allowed while the partition's off_ring hint says
       * slots were left off a held-up ring (reserves find them by a scan);
       * on it twice is harmless (the state CAS decides who gets it) */
      if (on_ring[s] == 0 && !claimed_cell[s] && !off_ring_any && !free_slot_settled_since(p, meta, s, w))
        viol(r, "slot %u is FREE but on no free ring: its capacity is lost", s);
      break;
    case UMBP_SLOT_PUBLISHED:
      if (own) viol(r, "slot %u is PUBLISHED but names owner %u", s, own);
      if (ways_to[s] == 0) viol(r, "slot %u is PUBLISHED but no bucket points at it: it is unreachable", s);
      /* fall through */
    case UMBP_SLOT_EVICTING: {
      uint32_t ns = meta[s].key.ns;
      if (ns >= UMBP_MAX_NAMESPACES || atomic_load_explicit(&nss[ns].state, memory_order_acquire) != 1)
        viol(r, "slot %u is %s under namespace %u, which is not registered", s, st_name(st), ns);
      break;
    }
    default: break;
    }
    /* the namespace count holds exactly the slots flagged counted (publish
     * sets the flag after its increment, removal clears it after its
     * decrement) */
    if (cflag[s] && meta[s].key.ns < UMBP_MAX_NAMESPACES) nsc[meta[s].key.ns]++;
    if (ways_to[s] > 1) viol(r, "slot %u is reachable from %u ways: one block is indexed twice", s, ways_to[s]);
    if (st == UMBP_SLOT_RESERVED || st == UMBP_SLOT_EVICTING || st == UMBP_SLOT_RETIRED) {
      if (own == 0 || own > UMBP_MAX_PROCS) {
        viol(r, "slot %u is %s by owner id %u, which is no registry slot", s, st_name(st), own);
      } else if (claimed[own - 1]) {
        if (dead[own - 1]) r->dead_leftovers++;
      } else if (!(st == UMBP_SLOT_RETIRED && (ra->orphans[own - 1] || rb->orphans[own - 1]))) {
        viol(r, "slot %u is %s by registry slot %u, which no process holds and nobody will repair: the slot is "
                "lost",
             s, st_name(st), own - 1);
      }
    }
  }

  /* ---- pins ---- */
  {
    /* A remover reads only the pin bytes of the processes in pin_procs. A
     * process sets its bit before its first pin and clears it only after
     * zeroing its bytes, so a byte seen set while the bit is clear both before
     * and after the scan is a pin that removers would not see. */
    const struct umbp_index_hdr *ih = ixh;
    uint64_t pm_a = atomic_load_explicit(&ih->pin_procs, memory_order_seq_cst);
    bool has_pins[UMBP_MAX_PROCS] = {false};
    uint64_t stride = umbp_pin_stride(n);
    for (unsigned i = 0; i < UMBP_MAX_PROCS; i++) {
      const _Atomic uint8_t *row = pins + (uint64_t)i * stride;
      const _Atomic uint64_t *w = (const _Atomic uint64_t *)(const void *)row;
      for (uint64_t q = 0; q < (n + 7) / 8; q++) {
        if (!atomic_load_explicit(&w[q], memory_order_relaxed)) continue;
        for (uint32_t s = (uint32_t)(q * 8); s < n && s < q * 8 + 8; s++) {
          uint8_t c = atomic_load_explicit(&row[s], memory_order_relaxed);
          if (!c) continue;
          has_pins[i] = true;
          if (!claimed[i])
            viol(r, "slot %u holds %u pin(s) of registry slot %u, which no process holds: the block can never be "
                    "evicted",
                 s, c, i);
          else if (dead[i])
            r->dead_leftovers++;
        }
      }
    }
    uint64_t pm_b = atomic_load_explicit(&ih->pin_procs, memory_order_seq_cst);
    for (unsigned i = 0; i < UMBP_MAX_PROCS; i++)
      if (has_pins[i] && claimed[i] && !((pm_a | pm_b) >> i & 1))
        viol(r, "registry slot %u holds pins but is not in the index's pin mask: removers would not see its pins "
                "and could evict the blocks under its readers",
             i);
  }

  /* ---- namespaces ---- */
  uint64_t slack = threads + r->slots_in_flux;
  for (unsigned i = 0; i < UMBP_MAX_NAMESPACES; i++) {
    if (atomic_load_explicit(&nss[i].state, memory_order_acquire) != 1) continue;
    int64_t da = (int64_t)(used_a[i] - nsc[i]), db = (int64_t)(used_b[i] - nsc[i]);
    if (da < 0) da = -da;
    if (db < 0) db = -db;
    if ((uint64_t)da > slack && (uint64_t)db > slack) {
      char name[136] = "";
      umbp_ns_name(p, i, name, sizeof name);
      viol(r, "namespace %u ('%.60s') counts %lld used slots but %llu slots hold its blocks", i, name,
           (long long)used_b[i], (unsigned long long)nsc[i]);
    }
  }
  *ret = *r;
out:
  free(r);
  free(st1);
  free(st2);
  free(cflag);
  free(ring_unread);
  free(inflight);
  free(on_ring);
  free(claimed_cell);
  free(ways_to);
  free(need);
  free(ovf);
  free(ra);
  free(rb);
  free(we);
  return rc;
}
