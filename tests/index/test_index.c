/* SPDX-License-Identifier: Apache-2.0 */
/* Block index: every operation and every error, single process. */
#include <sys/prctl.h>
#include <pthread.h>
#include <time.h>

#include "test_util.h"

#include "index/index_inline.h"
#include "shm/module.h"
#include "shm/pool_internal.h"
#include "index_test_util.h"
#include "umbp/admin.h"
#include "umbp/check.h"
#include "umbp/index.h"
#include "umbp/pool.h"

struct fx {
  umbp_pool *p;
  char name[64];
  uint32_t ns;
};

static int setup_n(void **state, uint64_t slots, uint32_t evcap) {
  struct fx *f = calloc(1, sizeof *f);
  snprintf(f->name, sizeof f->name, "%s", tu_name("ix"));
  umbp_pool_params pp;
  umbp_pool_params_init(&pp);
  pp.slot_size = 4096;
  pp.capacity = slots * 4096;
  pp.no_prefault = true;
  pp.n_numa_nodes = 0;
  pp.event_capacity = evcap;
  if (umbp_pool_create(f->name, &pp, &f->p)) {
    fprintf(stderr, "create: %s\n", umbp_last_error());
    return -1;
  }
  if (umbp_ns_register(f->p, "model-a", &f->ns)) return -1;
  *state = f;
  return 0;
}
static int setup(void **state) { return setup_n(state, 256, 0); }
static int setup_ev16(void **state) { return setup_n(state, 64, 16); }

static int teardown(void **state) {
  struct fx *f = *state;
  umbp_pool_detach(f->p);
  umbp_pool_destroy(f->name);
  free(f);
  return 0;
}

/* reserve + fill + publish; returns slot */
static uint32_t put(umbp_pool *p, const umbp_key *k) {
  uint32_t s;
  assert_int_equal(umbp_reserve(p, -1, k->ns, &s), 0);
  itu_fill(umbp_slot_ptr(p, s), umbp_slot_size(p), k);
  assert_int_equal(umbp_publish(p, s, k), 0);
  return s;
}

/* put() without cmocka's asserts, which belong to the main thread: the
 * slot, or UINT32_MAX */
static uint32_t put_nt(umbp_pool *p, const umbp_key *k) {
  uint32_t s;
  if (umbp_reserve(p, -1, k->ns, &s) != 0) return UINT32_MAX;
  itu_fill(umbp_slot_ptr(p, s), umbp_slot_size(p), k);
  return umbp_publish(p, s, k) == 0 ? s : UINT32_MAX;
}

/* Abort each of n reserved slots (each must succeed) and free the array. */
static void abort_all(umbp_pool *p, uint32_t *slots, uint64_t n) {
  for (uint64_t i = 0; i < n; i++) assert_int_equal(umbp_abort(p, slots[i]), 0);
  free(slots);
}

static void census_ok(umbp_pool *p) {
  umbp_slot_census c;
  assert_int_equal(umbp_census(p, &c), 0);
  assert_int_equal(c.free_ + c.reserved + c.published + c.evicting + c.retired, c.total);
  /* free slots are on the rings, or counted off them by a free that found a
   * ring held up (a preempted thread of ours can do that on a loaded
   * machine): umbp_pool_check() enforces which */
  umbp_check_report r;
  assert_int_equal(umbp_pool_check(p, &r), 0);
  for (unsigned i = 0; i < r.n_listed; i++) fprintf(stderr, "# check: %s\n", r.violation[i]);
  assert_int_equal(r.n_violations, 0);
  if (!UMBP_OFF_RING_SET(atomic_load(&p->index->ih->off_ring[0]))) assert_true(c.in_rings >= c.free_);
}

static void test_namespaces(void **state) {
  struct fx *f = *state;
  uint32_t a, b, a2;
  assert_int_equal(umbp_ns_register(f->p, "model-a", &a), 0);
  assert_int_equal(a, f->ns);
  assert_int_equal(umbp_ns_register(f->p, "model-b", &b), 0);
  assert_int_not_equal(a, b);
  assert_int_equal(umbp_ns_lookup(f->p, "model-b", &a2), 0);
  assert_int_equal(a2, b);
  assert_int_equal(umbp_ns_lookup(f->p, "nope", &a2), -ENOENT);
  char buf[160];
  assert_int_equal(umbp_ns_name(f->p, b, buf, sizeof buf), 0);
  assert_string_equal(buf, "model-b");
  assert_int_equal(umbp_ns_register(f->p, "", &a2), -EINVAL);
  char longname[200];
  memset(longname, 'n', 129);
  longname[129] = 0;
  assert_int_equal(umbp_ns_register(f->p, longname, &a2), -EINVAL);
  longname[128] = 0;
  assert_int_equal(umbp_ns_register(f->p, longname, &a2), 0);
  /* a second attachment (another registry slot) gets the same ids */
  umbp_pool *q;
  assert_int_equal(umbp_pool_attach(f->name, NULL, &q), 0);
  assert_int_equal(umbp_ns_register(q, "model-b", &a2), 0);
  assert_int_equal(a2, b);
  umbp_pool_detach(q);
  /* fill the table */
  int rc = 0;
  for (int i = 0; i < UMBP_MAX_NAMESPACES + 1 && rc == 0; i++) {
    char n[32];
    snprintf(n, sizeof n, "fill-%d", i);
    rc = umbp_ns_register(f->p, n, &a2);
  }
  assert_int_equal(rc, -ENOSPC);
  /* the message names the way out, not only the cause */
  assert_non_null(strstr(umbp_last_error(), "ids are never reused"));
  assert_non_null(strstr(umbp_last_error(), "new pool"));
  assert_int_equal(umbp_ns_register(f->p, "model-b", &a2), 0); /* registered names still resolve */
  assert_int_equal(a2, b);
}

static void test_roundtrip(void **state) {
  struct fx *f = *state;
  umbp_key k = itu_key(f->ns, 1, 0);
  uint32_t s = put(f->p, &k), got;
  assert_int_equal(umbp_lookup_pin(f->p, &k, &got), 0);
  assert_int_equal(got, s);
  assert_true(itu_check(umbp_slot_ptr(f->p, got), umbp_slot_size(f->p), &k));
  assert_int_equal(umbp_contains(f->p, &k), 1);
  assert_int_equal(umbp_unpin(f->p, got), 0);
  assert_int_equal(umbp_unpin(f->p, got), -EINVAL); /* no pin of ours left */
  /* same hash, other rank: another key */
  umbp_key k1 = k;
  k1.tp_rank = 1;
  assert_int_equal(umbp_contains(f->p, &k1), 0);
  assert_int_equal(umbp_lookup_pin(f->p, &k1, &got), -ENOENT);
  /* bytes past hash_len are ignored */
  umbp_key k2 = k;
  k2.hash_len = 16;
  memset(k2.hash + 16, 0xee, 16);
  umbp_key k3 = k2;
  memset(k3.hash + 16, 0x11, 16);
  put(f->p, &k2);
  assert_int_equal(umbp_contains(f->p, &k3), 1);
  /* batches of full-length and shorter keys (hashed and copied on different
   * paths, bulk_prep()): the same answers as one key at a time */
  umbp_key b[5] = {k, k3, k1, k2, k};
  uint8_t present[5];
  assert_int_equal(umbp_contains_bulk(f->p, 5, b, present), 4);
  assert_int_equal(present[0] + present[1] + present[3] + present[4], 4);
  assert_int_equal(present[2], 0);
  uint32_t sl[5];
  assert_int_equal(umbp_lookup_pin_bulk(f->p, 5, b, sl), 4);
  assert_int_equal(sl[0], s);
  assert_int_equal(sl[4], s);
  assert_int_equal(sl[2], UMBP_NO_SLOT);
  assert_int_equal(sl[1], sl[3]);
  assert_int_not_equal(sl[1], s);
  assert_int_equal(umbp_unpin_bulk(f->p, 5, sl), 0);
  assert_int_equal(umbp_unpin(f->p, s), -EINVAL); /* both pins of s dropped */
  /* a bad key anywhere in a batch: -EINVAL, and no pin left held */
  umbp_key bad[40];
  for (unsigned i = 0; i < 40; i++) bad[i] = i % 2 ? k : k3;
  uint32_t bsl[40];
  for (unsigned v = 0; v < 2; v++) {
    bad[37].hash_len = v ? UMBP_KEY_HASH_MAX + 1 : 0;
    assert_int_equal(umbp_lookup_pin_bulk(f->p, 40, bad, bsl), -EINVAL);
    assert_int_equal(umbp_contains_bulk(f->p, 40, bad, NULL), -EINVAL);
  }
  assert_int_equal(umbp_unpin(f->p, s), -EINVAL);
  assert_int_equal(umbp_unpin(f->p, sl[1]), -EINVAL);
  census_ok(f->p);
}

/* k1 and k2 (which differ) are two blocks on every path: single and bulk
 * lookups, pins, publish (k2 is no duplicate of k1) and remove; both are gone
 * after. */
static void two_distinct_keys(umbp_pool *p, const umbp_key *k1, const umbp_key *k2) {
  uint32_t s1 = put(p, k1), got, sl[2];
  assert_int_equal(umbp_contains(p, k2), 0);
  assert_int_equal(umbp_lookup_pin(p, k2, &got), -ENOENT);
  umbp_key both[2] = {*k2, *k1};
  uint8_t present[2];
  assert_int_equal(umbp_contains_bulk(p, 2, both, present), 1);
  assert_int_equal(present[0], 0);
  assert_int_equal(present[1], 1);
  uint32_t s2 = put(p, k2);
  assert_int_not_equal(s1, s2);
  assert_int_equal(umbp_lookup_pin_bulk(p, 2, both, sl), 2);
  assert_int_equal(sl[0], s2);
  assert_int_equal(sl[1], s1);
  assert_int_equal(umbp_unpin_bulk(p, 2, sl), 0);
  assert_int_equal(umbp_remove(p, k2), 0);
  assert_int_equal(umbp_contains(p, k1), 1);
  assert_int_equal(umbp_contains(p, k2), 0);
  assert_int_equal(umbp_remove(p, k1), 0);
}

/* Keys that share a home bucket and a signature, differing in one 16-byte
 * part of the key only (ranks; the first half of the block hash; its last
 * half), are told apart by the full key compare in every path: single and
 * batched lookups, pins, publish's duplicate check and remove. */
static void shm_of(const umbp_key *k, struct umbp_key_shm *s) {
  memset(s, 0, sizeof *s);
  s->ns = k->ns;
  s->tp = k->tp_rank;
  s->pcp = k->pcp_rank;
  s->dcp = k->dcp_rank;
  s->pp = k->pp_rank;
  s->group = k->group;
  s->hash_len = k->hash_len;
  memcpy(s->hash, k->hash, k->hash_len);
}
static void test_key_compare_exact(void **state) {
  struct fx *f = *state;
  uint32_t nb = f->p->hdr->n_buckets;
  for (int part = 0; part < 3; part++) {
    umbp_key k1 = itu_key(f->ns, 4000 + (uint64_t)part, 0), k2;
    struct umbp_key_shm s1, s2;
    shm_of(&k1, &s1);
    uint64_t h1 = umbp_key_hash(&s1);
    bool found = false;
    for (uint32_t i = 1; i < 200000000u && !found; i++) {
      k2 = k1;
      if (part == 0) memcpy(&k2.pcp_rank, &i, 4); /* pcp and dcp ranks: key bytes 6..9 */
      else memcpy(k2.hash + (part == 1 ? 8 : 24), &i, 4);
      shm_of(&k2, &s2);
      uint64_t h2 = umbp_key_hash(&s2);
      found = umbp_bucket_home(h2, nb) == umbp_bucket_home(h1, nb) && umbp_key_sig(h2) == umbp_key_sig(h1);
    }
    assert_true(found);
    two_distinct_keys(f->p, &k1, &k2);
  }
  census_ok(f->p);
}

/* Keys that differ in one field alone, each rank, the group or the hash
 * length, are different blocks on every lookup path. The index's tests used
 * keys whose pp rank and group are 0 (itu_key), so a key copy that dropped
 * one of them made such keys one block and no test saw it. */
static void test_key_fields_distinct(void **state) {
  struct fx *f = *state;
  for (int field = 0; field < 6; field++) {
    umbp_key k1 = itu_key(f->ns, 4200 + (uint64_t)field, 1), k2;
    k1.pcp_rank = 2, k1.dcp_rank = 3, k1.pp_rank = 4, k1.group = 5;
    k2 = k1;
    switch (field) {
      case 0: k2.tp_rank = 0x101; break;
      case 1: k2.pcp_rank = 0x102; break;
      case 2: k2.dcp_rank = 0x103; break;
      case 3: k2.pp_rank = 0x104; break;
      case 4: k2.group = 0x105; break;
      case 5: k2.hash_len = 31, k2.hash[31] = 0; k1.hash[31] = 0; break; /* same bytes, shorter */
    }
    two_distinct_keys(f->p, &k1, &k2);
  }
  census_ok(f->p);
}

/* The way that links slot s, as umbp_way_get() gives it (0: none). */
static uint64_t way_of(umbp_pool *p, uint32_t s, uint64_t h) {
  const struct umbp_bucket *bk = umbp_pool_region(p, UMBP_REG_BUCKETS);
  uint32_t nb = p->hdr->n_buckets, home = umbp_bucket_home(h, nb);
  for (unsigned d = 0; d < UMBP_MAX_PROBE; d++)
    for (unsigned w = 0; w < UMBP_BUCKET_WAYS; w++) {
      uint64_t v = umbp_way_get(&bk[umbp_bucket_at(home, d, nb)], w);
      if ((uint32_t)v == s + 1) return v;
    }
  return 0;
}

/* A key's 16-bit signature is split between the bucket's hint byte and the
 * top byte of the way's slot word. Keys whose hint bytes agree and whose high
 * bytes differ: each way carries its own high byte, a lookup of one never
 * returns the other, and both are found by every lookup path (in a batch the
 * first hint that matches may be the other key's). */
static void test_signature_split(void **state) {
  struct fx *f = *state;
  uint32_t nb = f->p->hdr->n_buckets;
  umbp_key k1 = itu_key(f->ns, 4100, 0), k2 = k1;
  struct umbp_key_shm s1, s2;
  shm_of(&k1, &s1);
  uint64_t h1 = umbp_key_hash(&s1), h2 = 0;
  bool found = false;
  for (uint32_t i = 1; i < 100000000u && !found; i++) {
    memcpy(k2.hash + 12, &i, 4);
    shm_of(&k2, &s2);
    h2 = umbp_key_hash(&s2);
    found = umbp_bucket_home(h2, nb) == umbp_bucket_home(h1, nb) &&
            (uint8_t)umbp_key_sig(h2) == (uint8_t)umbp_key_sig(h1) && umbp_key_sig(h2) != umbp_key_sig(h1);
  }
  assert_true(found);
  uint32_t a = put(f->p, &k1), got, sl[2];
  uint64_t v = way_of(f->p, a, h1);
  assert_int_equal(v >> 32, umbp_key_sig(h1)); /* both bytes of the signature, read back from the way */
  umbp_key both[2] = {k2, k1};
  uint8_t present[2];
  assert_int_equal(umbp_contains(f->p, &k2), 0);
  assert_int_equal(umbp_lookup_pin(f->p, &k2, &got), -ENOENT);
  assert_int_equal(umbp_contains_bulk(f->p, 2, both, present), 1);
  assert_int_equal(present[0], 0);
  assert_int_equal(present[1], 1);
  assert_int_equal(umbp_prefix_probe(f->p, 2, both), 0);
  uint32_t b = put(f->p, &k2);
  assert_int_equal(way_of(f->p, b, h2) >> 32, umbp_key_sig(h2));
  assert_int_equal(umbp_contains(f->p, &k1), 1);
  assert_int_equal(umbp_contains(f->p, &k2), 1);
  assert_int_equal(umbp_lookup_pin_bulk(f->p, 2, both, sl), 2);
  assert_int_equal(sl[0], b);
  assert_int_equal(sl[1], a);
  assert_int_equal(umbp_unpin_bulk(f->p, 2, sl), 0);
  assert_int_equal(umbp_lookup_pin(f->p, &k2, &got), 0);
  assert_int_equal(got, b);
  assert_int_equal(umbp_unpin(f->p, got), 0);
  assert_int_equal(umbp_remove(f->p, &k1), 0);
  assert_int_equal(way_of(f->p, a, h1), 0);
  assert_int_equal(umbp_contains(f->p, &k1), 0);
  assert_int_equal(umbp_contains_bulk(f->p, 2, both, present), 1);
  assert_int_equal(present[0], 1);
  assert_int_equal(present[1], 0);
  assert_int_equal(umbp_remove(f->p, &k2), 0);
  census_ok(f->p);
}

/* umbp_admin_index_info_get() says where the bucket array is in the
 * mapping (what `umbp bench index` measures the memory of): it is the array
 * lookups read. A published key's home bucket there carries its hint byte and
 * its slot word; after the remove, neither. */
static void test_admin_bucket_region(void **state) {
  struct fx *f = *state;
  umbp_admin_index_info ii;
  void *base;
  size_t len;
  assert_int_equal(umbp_admin_index_info_get(f->p, &ii), 0);
  assert_int_equal(umbp_admin_pool_mapping(f->p, &base, &len), 0);
  assert_int_equal(ii.bucket_bytes, (uint64_t)ii.n_buckets * 64);
  assert_true(ii.bucket_offset > 0 && ii.bucket_offset % 64 == 0);
  assert_true(ii.bucket_offset + ii.bucket_bytes <= len);
  umbp_key k = itu_key(f->ns, 77, 0);
  struct umbp_key_shm ks;
  shm_of(&k, &ks);
  uint64_t h = umbp_key_hash(&ks);
  const unsigned char *line = (const unsigned char *)base + ii.bucket_offset + (uint64_t)umbp_bucket_home(h, ii.n_buckets) * 64;
  uint8_t hint = (uint8_t)umbp_key_sig(h);
  uint32_t s = put(f->p, &k);
  unsigned w, seen = 0;
  for (w = 0; w < UMBP_BUCKET_WAYS; w++) {
    uint32_t word;
    memcpy(&word, line + offsetof(struct umbp_bucket, slot) + 4 * w, 4);
    if (line[w] == hint && word == umbp_way_word(umbp_key_sig(h), s)) seen++;
  }
  assert_int_equal(seen, 1);
  assert_int_equal(umbp_remove(f->p, &k), 0);
  for (w = 0, seen = 0; w < UMBP_BUCKET_WAYS; w++) seen += line[w] == hint;
  assert_int_equal(seen, 0);
  assert_int_equal(umbp_admin_index_info_get(NULL, &ii), -EINVAL);
  census_ok(f->p);
}

/* Thirteen keys with one home bucket and one hint byte, each with its own
 * high signature byte: twelve fill the home's ways, the thirteenth lives in a
 * later bucket. Every lookup path finds each in its own way (the single-key
 * probe matches the high bytes of all twelve slot words at once, lane by lane,
 * so a way mapped to the wrong lane would go unfound), and a key with the
 * same home and hint byte but a high byte none of them has is a miss. */
static void test_bucket_all_ways(void **state) {
  struct fx *f = *state;
  uint32_t nb = f->p->hdr->n_buckets;
  enum { N = UMBP_BUCKET_WAYS + 1 };
  umbp_key k[N + 1];
  uint32_t slot[N];
  uint16_t sig[N + 1];
  struct umbp_key_shm s;
  k[0] = itu_key(f->ns, 5000, 0);
  shm_of(&k[0], &s);
  uint64_t h0 = umbp_key_hash(&s);
  uint32_t home = umbp_bucket_home(h0, nb);
  sig[0] = umbp_key_sig(h0);
  unsigned n = 1;
  for (uint64_t i = 5001; i < 50000000u && n <= N; i++) {
    umbp_key c = itu_key(f->ns, i, 0);
    shm_of(&c, &s);
    uint64_t h = umbp_key_hash(&s);
    uint16_t g = umbp_key_sig(h);
    if (umbp_bucket_home(h, nb) != home || (uint8_t)g != (uint8_t)sig[0]) continue;
    bool fresh = true;
    for (unsigned j = 0; j < n; j++) fresh = fresh && (g >> 8) != (sig[j] >> 8);
    if (!fresh) continue;
    k[n] = c;
    sig[n++] = g;
  }
  assert_int_equal(n, N + 1); /* k[N]: the phantom, never published */
  for (unsigned i = 0; i < N; i++) slot[i] = put(f->p, &k[i]);
  const struct umbp_bucket *bk = (const struct umbp_bucket *)umbp_pool_region(f->p, UMBP_REG_BUCKETS) + home;
  for (unsigned w = 0; w < UMBP_BUCKET_WAYS; w++) /* the home is full: way w links key w */
    assert_int_equal(umbp_way_get(bk, w), ((uint64_t)sig[w] << 32) | (slot[w] + 1));
  uint8_t present[N + 1];
  uint32_t got, sl[N + 1];
  for (int round = 0; round < 2; round++) {
    for (unsigned i = 0; i < N; i++) {
      bool gone = round == 1 && i == 5;
      assert_int_equal(umbp_contains(f->p, &k[i]), gone ? 0 : 1);
      assert_int_equal(umbp_lookup_pin(f->p, &k[i], &got), gone ? -ENOENT : 0);
      if (gone) continue;
      assert_int_equal(got, slot[i]);
      assert_int_equal(umbp_unpin(f->p, got), 0);
    }
    assert_int_equal(umbp_contains(f->p, &k[N]), 0);
    assert_int_equal(umbp_lookup_pin(f->p, &k[N], &got), -ENOENT);
    assert_int_equal(umbp_contains_bulk(f->p, N + 1, k, present), round == 0 ? N : N - 1);
    for (unsigned i = 0; i <= N; i++) assert_int_equal(present[i], i < N && !(round == 1 && i == 5));
    assert_int_equal(umbp_lookup_pin_bulk(f->p, N + 1, k, sl), round == 0 ? N : N - 1);
    for (unsigned i = 0; i < N; i++) assert_int_equal(sl[i], round == 1 && i == 5 ? UMBP_NO_SLOT : slot[i]);
    assert_int_equal(sl[N], UMBP_NO_SLOT);
    assert_int_equal(umbp_unpin_bulk(f->p, N + 1, sl), 0);
    if (round == 0) assert_int_equal(umbp_remove(f->p, &k[5]), 0);
  }
  for (unsigned i = 0; i < N; i++)
    if (i != 5) assert_int_equal(umbp_remove(f->p, &k[i]), 0);
  census_ok(f->p);
}

/* umbp_census_part: a partition's figures add up to the pool's; published,
 * pinned and reserved slots land in the partition that holds them. */
static void test_census_part(void **state) {
  struct fx *f = *state;
  umbp_pool_info info;
  assert_int_equal(umbp_pool_get_info(f->p, &info), 0);
  uint32_t held, res;
  for (uint64_t i = 0; i < 10; i++) {
    umbp_key k = itu_key(f->ns, i, 0);
    put(f->p, &k);
  }
  umbp_key k0 = itu_key(f->ns, 0, 0);
  assert_int_equal(umbp_lookup_pin(f->p, &k0, &held), 0);
  assert_int_equal(umbp_reserve(f->p, -1, f->ns, &res), 0);
  umbp_slot_census all, part, sum;
  memset(&sum, 0, sizeof sum);
  assert_int_equal(umbp_census(f->p, &all), 0);
  for (unsigned q = 0; q < info.n_partitions; q++) {
    assert_int_equal(umbp_census_part(f->p, q, &part), 0);
    assert_int_equal(part.total, info.partitions[q].slot_count);
    sum.free_ += part.free_, sum.published += part.published, sum.pinned += part.pinned;
    sum.reserved += part.reserved, sum.total += part.total, sum.in_rings += part.in_rings;
  }
  assert_int_equal(sum.total, all.total);
  assert_int_equal(sum.free_, all.free_);
  assert_int_equal(all.published, 10);
  assert_int_equal(sum.published, 10);
  assert_int_equal(sum.pinned, 1);
  assert_int_equal(sum.reserved, 1);
  assert_int_equal(sum.in_rings, all.in_rings);
  assert_int_equal(umbp_census_part(f->p, info.n_partitions, &part), -EINVAL);
  assert_int_equal(umbp_census_part(NULL, 0, &part), -EINVAL);
  assert_int_equal(umbp_census_part(f->p, 0, NULL), -EINVAL);
  umbp_abort(f->p, res);
  umbp_unpin(f->p, held);
}

/* Each failing call leaves its own cause in umbp_last_error(), not an earlier
 * failure's: between two failures of different causes, the second message
 * must name the second cause. A read-only handle gets -EROFS from every call
 * that writes, umbp_unpin() and umbp_reclaim() included. */
static void test_error_messages_belong_to_the_call(void **state) {
  struct fx *f = *state;
  umbp_key k = itu_key(f->ns, 3, 0);
  uint32_t s = put(f->p, &k), id;
  /* unpin of a slot this process did not pin, after a namespace miss */
  assert_int_equal(umbp_ns_lookup(f->p, "no-such-ns", &id), -ENOENT);
  assert_non_null(strstr(umbp_last_error(), "no-such-ns"));
  assert_int_equal(umbp_unpin(f->p, s), -EINVAL);
  assert_non_null(strstr(umbp_last_error(), "not pinned by this process"));
  /* a bad namespace id */
  umbp_ns_info info;
  assert_int_equal(umbp_ns_info_get(f->p, 4096, &info), -EINVAL);
  assert_non_null(strstr(umbp_last_error(), "namespace id 4096 is out of range"));
  assert_int_equal(umbp_ns_name(f->p, 77, (char[8]){0}, 8), -ENOENT);
  assert_non_null(strstr(umbp_last_error(), "namespace 77 is not registered"));
  /* removing a key that is absent */
  umbp_key absent = itu_key(f->ns, 4, 0);
  assert_int_equal(umbp_remove(f->p, &absent), -ENOENT);
  assert_non_null(strstr(umbp_last_error(), "umbp_remove: no block has this key"));
  /* a duplicate publish */
  uint32_t s2;
  assert_int_equal(umbp_reserve(f->p, -1, f->ns, &s2), 0);
  assert_int_equal(umbp_publish(f->p, s2, &k), -EEXIST);
  assert_non_null(strstr(umbp_last_error(), "already published"));
  /* a read-only handle: reserve, unpin and reclaim all say -EROFS and why */
  umbp_attach_opts o;
  umbp_attach_opts_init(&o);
  o.read_only = true;
  umbp_pool *r;
  assert_int_equal(umbp_pool_attach(f->name, &o, &r), 0);
  assert_int_equal(umbp_counters_part(f->p, 999, &(umbp_counters){0}), -EINVAL);
  assert_non_null(strstr(umbp_last_error(), "partition 999 does not exist"));
  assert_int_equal(umbp_reserve(r, -1, f->ns, &s2), -EROFS);
  assert_non_null(strstr(umbp_last_error(), "read-only"));
  assert_int_equal(umbp_remove(f->p, &absent), -ENOENT); /* another cause in between */
  assert_int_equal(umbp_unpin(r, s), -EROFS);
  assert_non_null(strstr(umbp_last_error(), "read-only"));
  assert_int_equal(umbp_remove(f->p, &absent), -ENOENT);
  assert_int_equal(umbp_reclaim(r), -EROFS);
  assert_non_null(strstr(umbp_last_error(), "read-only"));
  assert_int_equal(umbp_contains(r, &k), 1); /* lookups still work read-only */
  umbp_pool_detach(r);
  census_ok(f->p);
}

static void test_errors(void **state) {
  struct fx *f = *state;
  umbp_key k = itu_key(f->ns, 2, 0);
  uint32_t s;
  k.hash_len = 0;
  assert_int_equal(umbp_contains(f->p, &k), -EINVAL);
  k.hash_len = 33;
  assert_int_equal(umbp_lookup_pin(f->p, &k, &s), -EINVAL);
  k.hash_len = 32;
  assert_int_equal(umbp_publish(f->p, 5, &k), -EINVAL); /* not reserved by us */
  assert_non_null(strstr(umbp_last_error(), "not reserved"));
  assert_int_equal(umbp_publish(f->p, 1u << 30, &k), -EINVAL);
  assert_int_equal(umbp_reserve(f->p, 7, f->ns, &s), -EINVAL); /* no such partition */
  assert_int_equal(umbp_reserve(f->p, -1, 9999, &s), -EINVAL);
  assert_int_equal(umbp_reserve(f->p, -1, f->ns, NULL), -EINVAL); /* nowhere to put the slot */
  assert_non_null(strstr(umbp_last_error(), "ret_slot is NULL"));
  assert_int_equal(umbp_reserve(f->p, -1, f->ns, &s), 0);
  umbp_key bad = itu_key(77, 1, 0); /* unregistered namespace */
  assert_int_equal(umbp_publish(f->p, s, &bad), -EINVAL);
  assert_int_equal(umbp_abort(f->p, s), 0);
  assert_int_equal(umbp_abort(f->p, s), -EINVAL);
  assert_int_equal(umbp_unpin(f->p, 1u << 30), -EINVAL);
  assert_int_equal(umbp_remove(f->p, &k), -ENOENT);
  assert_null(umbp_slot_ptr(f->p, 1u << 30));
  census_ok(f->p);
}

/* A NULL key is a bad argument, not an absent block: umbp_contains() gave 0
 * ("not published") for it and left umbp_last_error() naming an older cause,
 * on read-write and read-only handles alike. */
static void test_contains_null_key(void **state) {
  struct fx *f = *state;
  umbp_key k = itu_key(f->ns, 1, 0);
  put(f->p, &k);
  umbp_key absent = itu_key(f->ns, 2, 0);
  assert_int_equal(umbp_remove(f->p, &absent), -ENOENT); /* another message first */
  assert_int_equal(umbp_contains(f->p, NULL), -EINVAL);
  assert_non_null(strstr(umbp_last_error(), "key is NULL"));
  assert_int_equal(umbp_contains_bulk(f->p, 1, NULL, NULL), -EINVAL);
  assert_int_equal(umbp_contains(NULL, NULL), -EINVAL);
  assert_non_null(strstr(umbp_last_error(), "pool is NULL"));
  umbp_attach_opts o;
  umbp_attach_opts_init(&o);
  o.read_only = true;
  umbp_pool *r;
  assert_int_equal(umbp_pool_attach(f->name, &o, &r), 0);
  assert_int_equal(umbp_remove(f->p, &absent), -ENOENT);
  assert_int_equal(umbp_contains(r, NULL), -EINVAL);
  assert_non_null(strstr(umbp_last_error(), "key is NULL"));
  assert_int_equal(umbp_contains(r, &k), 1);
  umbp_pool_detach(r);
  assert_int_equal(umbp_contains(f->p, &k), 1);
}

/* A partition below -1 does not exist: umbp_evict() took every negative
 * value for -1 ("all") and evicted the whole pool on a caller's bad number. */
static void test_evict_bad_partition(void **state) {
  struct fx *f = *state;
  umbp_key k[4];
  for (int i = 0; i < 4; i++) {
    k[i] = itu_key(f->ns, 10 + (uint64_t)i, 0);
    put(f->p, &k[i]);
  }
  assert_int_equal(umbp_evict(f->p, -2, 1000), -EINVAL);
  assert_non_null(strstr(umbp_last_error(), "partition -2 does not exist"));
  assert_int_equal(umbp_evict(f->p, INT32_MIN, 1000), -EINVAL);
  assert_int_equal(umbp_evict(f->p, 1 << 20, 1000), -EINVAL);
  for (int i = 0; i < 4; i++) assert_int_equal(umbp_contains(f->p, &k[i]), 1);
  assert_int_equal(umbp_evict(f->p, -1, 1), 1); /* -1 still means every partition */
  census_ok(f->p);
}

/* A call that succeeds leaves umbp_last_error() as it was (common.h):
 * umbp_ns_register() of a new name looked the name up first and kept the
 * lookup's "not registered" message although the registration succeeded. */
static void test_ns_register_keeps_last_error(void **state) {
  struct fx *f = *state;
  umbp_key absent = itu_key(f->ns, 99, 0);
  assert_int_equal(umbp_remove(f->p, &absent), -ENOENT);
  char before[512];
  snprintf(before, sizeof before, "%s", umbp_last_error());
  uint32_t id, id2;
  assert_int_equal(umbp_ns_register(f->p, "brand-new", &id), 0);
  assert_string_equal(umbp_last_error(), before);
  assert_int_equal(umbp_ns_register(f->p, "brand-new", &id2), 0); /* found: the same id */
  assert_int_equal(id2, id);
  assert_string_equal(umbp_last_error(), before);
  assert_int_equal(umbp_ns_lookup(f->p, "brand-new", &id2), 0);
  assert_int_equal(id2, id);
  assert_int_equal(umbp_ns_lookup(f->p, "still-absent", &id2), -ENOENT); /* a failure still says why */
  assert_non_null(strstr(umbp_last_error(), "'still-absent' is not registered"));
}

/* umbp_ns_set_quota(NULL, ...) blamed the namespace id ("namespace id 0 is
 * out of range") for a NULL pool. */
static void test_ns_set_quota_null_pool(void **state) {
  struct fx *f = *state;
  assert_int_equal(umbp_ns_set_quota(NULL, f->ns, 1 << 20), -EINVAL);
  assert_non_null(strstr(umbp_last_error(), "pool is NULL"));
  assert_null(strstr(umbp_last_error(), "out of range"));
  assert_int_equal(umbp_ns_set_quota(f->p, UMBP_MAX_NAMESPACES, 1 << 20), -EINVAL);
  assert_non_null(strstr(umbp_last_error(), "out of range"));
  assert_int_equal(umbp_ns_set_quota(f->p, f->ns, 0), 0);
}

/* umbp_index_stats() with a histogram of 0 entries (hist not NULL) wrote
 * each entry's count to hist[nhist - 1], i.e. hist[UINT_MAX]: far outside the
 * caller's array. */
static void test_index_stats_empty_histogram(void **state) {
  struct fx *f = *state;
  for (int i = 0; i < 8; i++) {
    umbp_key k = itu_key(f->ns, 300 + (uint64_t)i, 0);
    put(f->p, &k);
  }
  uint64_t guard[3] = {11, 22, 33}, entries = 0;
  assert_int_equal(umbp_index_stats(f->p, &entries, &guard[1], 0), 0);
  assert_int_equal(entries, 8);
  assert_int_equal(guard[0], 11);
  assert_int_equal(guard[1], 22);
  assert_int_equal(guard[2], 33);
  uint64_t hist[2];
  assert_int_equal(umbp_index_stats(f->p, &entries, hist, 2), 0);
  assert_int_equal(hist[0] + hist[1], 8);
}

static void test_first_writer_wins(void **state) {
  struct fx *f = *state;
  umbp_key k = itu_key(f->ns, 3, 0);
  uint32_t s1, s2;
  assert_int_equal(umbp_reserve(f->p, -1, f->ns, &s1), 0);
  assert_int_equal(umbp_reserve(f->p, -1, f->ns, &s2), 0);
  itu_fill(umbp_slot_ptr(f->p, s1), 4096, &k);
  assert_int_equal(umbp_publish(f->p, s1, &k), 0);
  umbp_slot_census before, after;
  umbp_census(f->p, &before);
  assert_int_equal(umbp_publish(f->p, s2, &k), -EEXIST);
  umbp_census(f->p, &after);
  assert_int_equal(after.free_, before.free_ + 1); /* the loser's slot went back */
  assert_int_equal(after.reserved, before.reserved - 1);
  umbp_counters c;
  umbp_counters_ns(f->p, f->ns, &c);
  assert_int_equal(c.duplicates, 1);
  assert_int_equal(c.inserts, 1);
  uint32_t got;
  assert_int_equal(umbp_lookup_pin(f->p, &k, &got), 0);
  assert_int_equal(got, s1);
  umbp_unpin(f->p, got);
}

static void test_prefix_and_bulk(void **state) {
  struct fx *f = *state;
  umbp_key keys[40];
  for (int i = 0; i < 40; i++) keys[i] = itu_key(f->ns, 100 + (uint64_t)i, 0);
  uint32_t slots[40];
  assert_int_equal(umbp_reserve_bulk(f->p, -1, f->ns, 40, slots), 40);
  for (int i = 0; i < 40; i++) itu_fill(umbp_slot_ptr(f->p, slots[i]), 4096, &keys[i]);
  int rc[40];
  /* publish all but key 35 */
  assert_int_equal(umbp_publish_bulk(f->p, 35, slots, keys, rc), 35);
  assert_int_equal(umbp_publish_bulk(f->p, 4, slots + 36, keys + 36, rc), 4);
  assert_int_equal(umbp_abort(f->p, slots[35]), 0);
  assert_int_equal(umbp_prefix_probe(f->p, 40, keys), 35);
  assert_int_equal(umbp_prefix_probe(f->p, 10, keys), 10);
  assert_int_equal(umbp_prefix_probe(f->p, 5, keys + 35), 0);
  assert_int_equal(umbp_prefix_probe(f->p, 0, keys), 0);
  uint8_t present[40];
  assert_int_equal(umbp_contains_bulk(f->p, 40, keys, present), 39);
  assert_int_equal(present[35], 0);
  assert_int_equal(present[36], 1);
  uint32_t got[40];
  assert_int_equal(umbp_lookup_pin_bulk(f->p, 40, keys, got), 39);
  assert_int_equal(got[35], UMBP_NO_SLOT);
  for (int i = 0; i < 40; i++)
    if (i != 35) {
      assert_int_equal(got[i], slots[i]);
      assert_true(itu_check(umbp_slot_ptr(f->p, got[i]), 4096, &keys[i]));
    }
  assert_int_equal(umbp_unpin_bulk(f->p, 40, got), 0);
  census_ok(f->p);
}

/* A removal that goes by slot (eviction, umbp_clear_ns(), the reaper) finds
 * the slot's way by its whole slot word; a way whose signature byte was
 * rewritten meanwhile (a co-tenant's scribble, a repair tool) no longer
 * compares equal, and the scan by slot id must still clear it, with the
 * overflow count of a displaced key. */
static void test_unlink_scribbled_way(void **state) {
  struct fx *f = *state;
  struct umbp_key_shm ks;
  umbp_key k[3];
  uint32_t slot[3];
  uint64_t h[3];
  for (int i = 0; i < 3; i++) {
    k[i] = itu_key(f->ns, 9000 + (uint64_t)i, 0);
    slot[i] = put(f->p, &k[i]);
    shm_of(&k[i], &ks);
    h[i] = umbp_key_hash(&ks);
    uint64_t v = way_of(f->p, slot[i], h[i]);
    assert_int_equal((uint32_t)v, slot[i] + 1);
  }
  /* rewrite the high signature byte in key 1's slot word */
  struct umbp_bucket *bk = umbp_pool_region(f->p, UMBP_REG_BUCKETS);
  bool done = false;
  for (uint32_t b = 0; b < f->p->hdr->n_buckets && !done; b++)
    for (unsigned w = 0; w < UMBP_BUCKET_WAYS && !done; w++) {
      uint32_t v = atomic_load(&bk[b].slot[w]);
      if (UMBP_WAY_SLOT(v) != slot[1] + 1) continue;
      atomic_store(&bk[b].slot[w], v ^ 0x5a000000u);
      done = true;
    }
  assert_true(done);
  assert_int_equal(umbp_clear_ns(f->p, f->ns), 3);
  for (int i = 0; i < 3; i++) {
    assert_int_equal(way_of(f->p, slot[i], h[i]), 0); /* unlinked, the scribbled one too */
    assert_int_equal(umbp_contains(f->p, &k[i]), 0);
  }
  census_ok(f->p);
}

/* An event's key is the key published, field by field. */
static void event_key_is(const umbp_key *got, const umbp_key *want) {
  assert_int_equal(got->ns, want->ns);
  assert_int_equal(got->tp_rank, want->tp_rank);
  assert_int_equal(got->pcp_rank, want->pcp_rank);
  assert_int_equal(got->dcp_rank, want->dcp_rank);
  assert_int_equal(got->pp_rank, want->pp_rank);
  assert_int_equal(got->group, want->group);
  assert_int_equal(got->hash_len, want->hash_len);
  assert_memory_equal(got->hash, want->hash, want->hash_len);
}

static void test_remove_and_events(void **state) {
  struct fx *f = *state;
  assert_int_equal(umbp_events_drain(f->p, NULL, 0), 0); /* record removed events from here on */
  /* every key field non-zero and distinct: an event key that lost one (read
   * back as 0) matched itu_key's zero ranks and group */
  umbp_key k = itu_key(f->ns, 5, 1);
  k.pcp_rank = 2, k.dcp_rank = 3, k.pp_rank = 4, k.group = 5;
  put(f->p, &k);
  uint32_t got;
  assert_int_equal(umbp_lookup_pin(f->p, &k, &got), 0);
  assert_int_equal(umbp_remove(f->p, &k), -EBUSY);
  assert_non_null(strstr(umbp_last_error(), "pinned"));
  assert_true(itu_check(umbp_slot_ptr(f->p, got), 4096, &k)); /* bytes intact */
  assert_int_equal(umbp_unpin(f->p, got), 0);
  assert_int_equal(umbp_remove(f->p, &k), 0);
  assert_int_equal(umbp_contains(f->p, &k), 0);
  assert_int_equal(umbp_remove(f->p, &k), -ENOENT);
  umbp_event ev[8];
  int n = umbp_events_drain(f->p, ev, 8);
  assert_int_equal(n, 1);
  assert_int_equal(ev[0].type, UMBP_EV_REMOVED);
  assert_int_equal(ev[0].key.ns, f->ns);
  assert_memory_equal(ev[0].key.hash, k.hash, 32);
  event_key_is(&ev[0].key, &k);
  /* stored events on request */
  umbp_events_enable_stored(f->p, true);
  umbp_key k2 = itu_key(f->ns, 6, 7);
  k2.pcp_rank = 8, k2.dcp_rank = 9, k2.pp_rank = 10, k2.group = 11, k2.hash_len = 20;
  memset(k2.hash + 20, 0, 12);
  put(f->p, &k2);
  n = umbp_events_drain(f->p, ev, 8);
  assert_int_equal(n, 1);
  assert_int_equal(ev[0].type, UMBP_EV_STORED);
  event_key_is(&ev[0].key, &k2);
  umbp_events_enable_stored(f->p, false);
  /* the removed slot is reusable (after its grace period, no reader is in a section) */
  umbp_reclaim(f->p);
  census_ok(f->p);
  umbp_slot_census c;
  umbp_census(f->p, &c);
  assert_int_equal(c.retired, 0);
}

static void test_clear_ns(void **state) {
  struct fx *f = *state;
  uint32_t other;
  assert_int_equal(umbp_ns_register(f->p, "model-b", &other), 0);
  for (int i = 0; i < 10; i++) {
    umbp_key a = itu_key(f->ns, 200 + (uint64_t)i, 0), b = itu_key(other, 200 + (uint64_t)i, 0);
    put(f->p, &a);
    put(f->p, &b);
  }
  umbp_key pinned = itu_key(f->ns, 200, 0);
  uint32_t s;
  assert_int_equal(umbp_lookup_pin(f->p, &pinned, &s), 0);
  assert_int_equal(umbp_clear_ns(f->p, f->ns), 9);
  assert_int_equal(umbp_contains(f->p, &pinned), 1);
  for (int i = 0; i < 10; i++) {
    umbp_key b = itu_key(other, 200 + (uint64_t)i, 0);
    assert_int_equal(umbp_contains(f->p, &b), 1);
  }
  umbp_unpin(f->p, s);
  assert_int_equal(umbp_clear_ns(f->p, f->ns), 1);
  census_ok(f->p);
}

static void test_eviction_clock_and_pins(void **state) {
  struct fx *f = *state;
  umbp_pool_info info;
  umbp_pool_get_info(f->p, &info);
  unsigned total = info.slot_count;
  /* fill the pool */
  for (unsigned i = 0; i < total; i++) {
    umbp_key k = itu_key(f->ns, 1000 + i, 0);
    put(f->p, &k);
  }
  umbp_slot_census c;
  umbp_census(f->p, &c);
  assert_int_equal(c.free_, 0);
  /* touch the first half (sets CLOCK reference bits) */
  for (unsigned i = 0; i < total / 2; i++) {
    umbp_key k = itu_key(f->ns, 1000 + i, 0);
    uint32_t s;
    assert_int_equal(umbp_lookup_pin(f->p, &k, &s), 0);
    umbp_unpin(f->p, s);
  }
  /* a reserve on a full pool evicts on demand */
  umbp_key nk = itu_key(f->ns, 5000, 0);
  put(f->p, &nk);
  /* evicting fewer than the cold half only takes cold blocks */
  int ev = umbp_evict(f->p, -1, total / 4);
  assert_int_equal(ev, (int)(total / 4));
  for (unsigned i = 0; i < total / 2; i++) {
    umbp_key k = itu_key(f->ns, 1000 + i, 0);
    assert_int_equal(umbp_contains(f->p, &k), 1);
  }
  /* pin everything that is left; then nothing can be evicted */
  uint32_t *pins = calloc(total * 2, sizeof *pins);
  unsigned np = 0;
  umbp_reclaim(f->p);
  uint32_t s;
  while (umbp_reserve(f->p, -1, f->ns, &s) == 0) {
    umbp_key k = itu_key(f->ns, 9000 + np, 0);
    itu_fill(umbp_slot_ptr(f->p, s), 4096, &k);
    assert_int_equal(umbp_publish(f->p, s, &k), 0);
    assert_int_equal(umbp_lookup_pin(f->p, &k, &pins[np++]), 0);
    if (np > total * 2) break;
  }
  /* the loop ended because every slot is pinned or evicted-then-reused */
  for (unsigned i = 0; i < total; i++) {
    umbp_key k = itu_key(f->ns, 1000 + i, 0);
    uint32_t g;
    if (umbp_lookup_pin(f->p, &k, &g) == 0) pins[np++] = g;
  }
  umbp_key k5 = itu_key(f->ns, 5000, 0);
  uint32_t g;
  if (umbp_lookup_pin(f->p, &k5, &g) == 0) pins[np++] = g;
  umbp_census(f->p, &c);
  assert_int_equal(c.pinned, c.published);
  assert_int_equal(umbp_reserve(f->p, -1, f->ns, &s), -ENOSPC);
  assert_non_null(strstr(umbp_last_error(), "pinned"));
  assert_int_equal(umbp_evict(f->p, -1, 10), 0);
  /* every pinned block still holds its bytes */
  for (unsigned i = 0; i < np; i++) assert_int_equal(ST_STATE(atomic_load(&f->p->index->meta[pins[i]].state)), UMBP_SLOT_PUBLISHED);
  umbp_unpin_bulk(f->p, np, pins);
  assert_int_equal(umbp_reserve(f->p, -1, f->ns, &s), 0);
  umbp_abort(f->p, s);
  umbp_counters cn;
  umbp_counters_ns(f->p, f->ns, &cn);
  assert_true(cn.evictions >= total / 4);
  free(pins);
  census_ok(f->p);
}

/* A detaching process's pins are released (its reads cannot go on without
 * the mapping): before, its pin bytes stayed, the blocks were never evictable
 * again and the next process in its registry slot inherited them. Pins of
 * another process on the same block still hold. */
static void test_detach_releases_pins(void **state) {
  struct fx *f = *state;
  umbp_key a = itu_key(f->ns, 1, 0), b = itu_key(f->ns, 2, 0), c = itu_key(f->ns, 3, 0);
  put(f->p, &a);
  put(f->p, &b);
  put(f->p, &c);
  umbp_pool *q;
  assert_int_equal(umbp_pool_attach(f->name, NULL, &q), 0);
  uint32_t s;
  assert_int_equal(umbp_lookup_pin(q, &a, &s), 0);
  assert_int_equal(umbp_lookup_pin(q, &a, &s), 0); /* twice: a count, not a flag */
  assert_int_equal(umbp_lookup_pin(q, &b, &s), 0);
  uint32_t sb_mine;
  assert_int_equal(umbp_lookup_pin(f->p, &b, &sb_mine), 0); /* b is pinned by both processes */
  assert_int_equal(umbp_remove(f->p, &a), -EBUSY);
  umbp_pool_detach(q);
  umbp_slot_census cs;
  assert_int_equal(umbp_census(f->p, &cs), 0);
  assert_int_equal(cs.pinned, 1); /* b, by this process */
  assert_int_equal(umbp_remove(f->p, &a), 0);
  assert_int_equal(umbp_remove(f->p, &b), -EBUSY);
  assert_int_equal(umbp_unpin(f->p, sb_mine), 0);
  assert_int_equal(umbp_remove(f->p, &b), 0);
  /* the next process in that registry slot starts with no pins */
  assert_int_equal(umbp_pool_attach(f->name, NULL, &q), 0);
  assert_int_equal(umbp_unpin(q, s), -EINVAL);
  umbp_pool_detach(q);
  assert_int_equal(umbp_remove(f->p, &c), 0);
  census_ok(f->p);
}

/* A clean detach gives back the slots the process reserved, as reaping it
 * would have (issue 32 #4): attach, reserve x4, detach, then --check is clean
 * and the 4 slots are free again. */
static void test_detach_releases_reservations(void **state) {
  struct fx *f = *state;
  umbp_slot_census before, after;
  assert_int_equal(umbp_census(f->p, &before), 0);
  umbp_pool *q;
  assert_int_equal(umbp_pool_attach(f->name, NULL, &q), 0);
  uint32_t s[4];
  for (int i = 0; i < 4; i++) assert_int_equal(umbp_reserve(q, -1, f->ns, &s[i]), 0);
  umbp_pool_detach(q);
  umbp_check_report *rep = calloc(1, sizeof *rep);
  assert_non_null(rep);
  assert_int_equal(umbp_pool_check(f->p, rep), 0);
  for (unsigned i = 0; i < rep->n_listed; i++) fprintf(stderr, "# check: %s\n", rep->violation[i]);
  assert_int_equal(rep->n_violations, 0);
  free(rep);
  assert_int_equal(umbp_census(f->p, &after), 0);
  assert_int_equal(after.reserved, 0);
  assert_int_equal(after.free_, before.free_);
  census_ok(f->p);
  /* and they can be reserved again without evicting anything */
  uint32_t *all = calloc(after.free_, sizeof *all);
  assert_int_equal(umbp_reserve_bulk(f->p, -1, f->ns, (unsigned)after.free_, all), (int)after.free_);
  abort_all(f->p, all, after.free_);
}

/* Free slots left off the ring (a free that gave up on a held-up ring) and
 * entries of slots that are no longer free: umbp_reclaim() puts both right,
 * and its clear of the off-ring hint moves the hint's clear count, so a
 * clear based on an older reading of the word cannot succeed. */
static void test_reclaim_tidies(void **state) {
  struct fx *f = *state;
  struct umbp_index *ix = f->p->index;
  umbp_slot_census c0, c;
  assert_int_equal(umbp_census(f->p, &c0), 0);
  assert_int_equal(c0.in_rings, c0.free_);
  assert_int_equal(umbp_reclaim(f->p), 0); /* nothing marked */
  /* slot a: FREE off the ring, as a free that gave up leaves it */
  uint32_t a, b;
  assert_int_equal(umbp_reserve(f->p, -1, f->ns, &a), 0);
  uint64_t w = atomic_load(&ix->meta[a].state);
  atomic_store(&ix->meta[a].state, ST_NEXT(w, UMBP_SLOT_FREE, 0));
  uint32_t off0 = atomic_load(&ix->ih->off_ring[0]);
  atomic_store(&ix->ih->off_ring[0], off0 + 1);
  /* slot b: published, with a stale entry on the ring, as a scan leaves it */
  umbp_key k = itu_key(f->ns, 77, 0);
  b = put(f->p, &k);
  union ring_elem e = {.v = b};
  assert_int_equal(umbp_ring_enqueue_burst_g(ix->rings[0], &ix->ring_geo[0], &e, 1, f->p->owner_id), 1);
  umbp_ix_mark_untidy(ix->ih, 0);
  assert_int_equal(umbp_census(f->p, &c), 0);
  assert_int_equal(c.free_, c0.free_ - 1); /* a is free again, b published */
  assert_int_equal(c.in_rings, c0.free_ - 1); /* a is missing, b's entry is stale */
  umbp_check_report r;
  assert_int_equal(umbp_pool_check(f->p, &r), 0);
  assert_int_equal(r.n_violations, 0); /* the hint covers a */
  assert_int_equal(umbp_reclaim(f->p), 2);  /* b's entry dropped, a put back */
  assert_int_equal(umbp_reclaim(f->p), 0);
  uint32_t off1 = atomic_load(&ix->ih->off_ring[0]);
  assert_false(UMBP_OFF_RING_SET(off1));
  assert_int_equal(off1 >> 16, (off0 >> 16) + 1);
  census_ok(f->p);
  assert_int_equal(umbp_census(f->p, &c), 0);
  assert_int_equal(c.in_rings, c.free_);
  /* every free slot can be reserved without an eviction, a among them */
  uint32_t *all = calloc(c.free_, sizeof *all);
  umbp_counters before, after;
  umbp_counters_ns(f->p, UINT32_MAX, &before);
  assert_int_equal(umbp_reserve_bulk(f->p, -1, f->ns, (unsigned)c.free_, all), (int)c.free_);
  umbp_counters_ns(f->p, UINT32_MAX, &after);
  assert_int_equal(after.evictions, before.evictions);
  bool got_a = false;
  for (uint64_t i = 0; i < c.free_; i++) {
    got_a |= all[i] == a;
    assert_int_not_equal(all[i], b);
    assert_int_equal(umbp_abort(f->p, all[i]), 0);
  }
  assert_true(got_a);
  free(all);
  assert_int_equal(umbp_contains(f->p, &k), 1);
}

/* Ring headers are trusted only once, at attach (issue 32 #10): a co-tenant
 * that rewrites the geometry in the shared line 0 of the free ring and the
 * event ring (mask 0xffffffff, a huge capacity and cell size) after peers
 * attached must not make them index outside the rings. Every operation that
 * enqueues or dequeues goes on working from a handle attached before. */
static void test_ring_header_scribbled(void **state) {
  struct fx *f = *state;
  umbp_pool *q;
  assert_int_equal(umbp_pool_attach(f->name, NULL, &q), 0);
  umbp_events_enable_stored(q, true);
  struct umbp_ring_hdr *rings[2] = {umbp_pool_at(f->p, f->p->hdr->partitions[0].ring_offset, 64),
                                    umbp_pool_region(f->p, UMBP_REG_EVENTS)};
  unsigned char saved[2][64];
  for (int i = 0; i < 2; i++) {
    memcpy(saved[i], rings[i], 64);
    rings[i]->capacity = 0xffffffffu;
    rings[i]->mask = 0xffffffffu;
    rings[i]->cell_size = 0x10000000u;
    rings[i]->elem_size = 0x10000000u;
  }
  for (int round = 0; round < 3; round++) {
    for (uint64_t id = 0; id < 300; id++) { /* more than the pool's 256 slots: free, evict, free again */
      umbp_key k = itu_key(f->ns, 100000 + round * 1000 + id, 0);
      uint32_t s;
      int rc = umbp_reserve(q, -1, f->ns, &s);
      assert_int_equal(rc, 0);
      assert_int_equal(umbp_publish(q, s, &k), 0);
      assert_int_equal(umbp_lookup_pin(f->p, &k, &s), 0);
      assert_int_equal(umbp_unpin(f->p, s), 0);
      if (id % 3 == 0) assert_int_equal(umbp_remove(q, &k), 0);
    }
    umbp_event ev[64];
    int n;
    while ((n = umbp_events_drain(f->p, ev, 64)) > 0) {
    }
    assert_true(n >= 0);
  }
  assert_int_equal(umbp_clear_ns(q, f->ns) >= 0, 1);
  umbp_reclaim(q);
  umbp_reclaim(f->p);
  /* a new attach validates the header and refuses the scribbled rings */
  umbp_pool *r = NULL;
  assert_int_equal(umbp_pool_attach(f->name, NULL, &r), -EBADMSG);
  for (int i = 0; i < 2; i++) memcpy(rings[i], saved[i], 64);
  umbp_pool_detach(q);
  census_ok(f->p);
}

/* ---- umbp_pool_check(): each kind of violation, provoked ----
 * Each test below makes one corruption in the segment of a real pool, as a
 * stray write of another process would, asserts that the check names it,
 * repairs it and asserts that the check is clean again. */

/* The check's report holds a sentence containing `needle`; returns how
 * many violations it found. */
static uint64_t check_reports(umbp_pool *p, const char *needle) {
  umbp_check_report *r = calloc(1, sizeof *r);
  assert_non_null(r);
  assert_int_equal(umbp_pool_check(p, r), 0);
  bool found = false;
  for (unsigned i = 0; i < r->n_listed; i++) found |= strstr(r->violation[i], needle) != NULL;
  if (!found) {
    fprintf(stderr, "# wanted '%s' among %llu violation(s):\n", needle, (unsigned long long)r->n_violations);
    for (unsigned i = 0; i < r->n_listed; i++) fprintf(stderr, "# check: %s\n", r->violation[i]);
  }
  assert_true(r->n_violations > 0);
  assert_true(found);
  uint64_t nv = r->n_violations;
  free(r);
  return nv;
}

/* The bucket and way that link slot s. */
static void linking_way(struct umbp_index *ix, uint32_t s, uint32_t *ret_b, unsigned *ret_w) {
  for (uint32_t b = 0; b < ix->nb; b++)
    for (unsigned w = 0; w < UMBP_BUCKET_WAYS; w++)
      if ((uint32_t)umbp_way_get(&ix->buckets[b], w) == s + 1) {
        *ret_b = b;
        *ret_w = w;
        return;
      }
  fail_msg("slot %u is linked by no way", s);
}

/* An empty way of bucket b. */
static unsigned empty_way(struct umbp_index *ix, uint32_t b) {
  for (unsigned w = 0; w < UMBP_BUCKET_WAYS; w++)
    if (!umbp_way_get(&ix->buckets[b], w)) return w;
  fail_msg("bucket %u is full", b);
  return 0;
}

/* A FREE slot (on its ring). */
static uint32_t a_free_slot(struct umbp_index *ix) {
  for (uint32_t s = 0; s < ix->slot_count; s++)
    if (ST_STATE(atomic_load(&ix->meta[s].state)) == UMBP_SLOT_FREE) return s;
  fail_msg("no free slot");
  return 0;
}

/* A registry slot whose state word is neither FREE nor LIVE. */
static void test_check_registry_state(void **state) {
  struct fx *f = *state;
  unsigned i = UMBP_MAX_PROCS - 1;
  assert_int_not_equal((int)i, f->p->proc_slot);
  _Atomic uint32_t *st = &f->p->procs[i].state;
  assert_int_equal(atomic_load(st), UMBP_PROC_FREE);
  atomic_store(st, 7);
  check_reports(f->p, "registry slot 63 has state 7, which is neither free nor live");
  atomic_store(st, UMBP_PROC_FREE);
  census_ok(f->p);
}

/* A free ring's header and the event ring's header, each rewritten (the
 * mask no longer capacity - 1, so the checksum fails too). */
static void test_check_ring_headers(void **state) {
  struct fx *f = *state;
  struct umbp_ring_hdr *fr = umbp_pool_at(f->p, f->p->hdr->partitions[0].ring_offset, 64);
  struct umbp_ring_hdr *ev = umbp_pool_region(f->p, UMBP_REG_EVENTS);
  uint32_t m = fr->mask;
  fr->mask = m ^ 1;
  /* only that: the ring's free slots are on it, and a process attached
   * before goes on using them (its geometry was copied at attach) */
  assert_int_equal(check_reports(f->p, "the free-slot ring header of partition 0 is corrupted"), 1);
  fr->mask = m;
  census_ok(f->p);
  m = ev->mask;
  ev->mask = m ^ 1;
  assert_int_equal(check_reports(f->p, "the event ring header is corrupted"), 1);
  ev->mask = m;
  census_ok(f->p);
}

/* A free ring holding a slot id that is none of its partition's slots. */
static void test_check_ring_foreign_id(void **state) {
  struct fx *f = *state;
  struct umbp_index *ix = f->p->index;
  assert_int_equal(ix->ring_geo[0].elem_size, sizeof(uint64_t));
  uint32_t rs; /* a reservation makes room on the (full) ring */
  assert_int_equal(umbp_reserve(f->p, -1, f->ns, &rs), 0);
  uint64_t e = ix->slot_count + 5, got[512];
  assert_int_equal(umbp_ring_enqueue_burst_g(ix->rings[0], &ix->ring_geo[0], &e, 1, f->p->owner_id), 1);
  char want[160];
  snprintf(want, sizeof want, "the free ring of partition 0 holds slot id %u (cell ", ix->slot_count + 5);
  check_reports(f->p, want);
  /* take it off again: drain the ring, put back all but it */
  unsigned n = 0, back = 0;
  while (n < 512 && umbp_ring_dequeue_burst_g(ix->rings[0], &ix->ring_geo[0], &got[n], 1, f->p->owner_id) == 1) n++;
  for (unsigned i = 0; i < n; i++)
    if (got[i] != e) back += umbp_ring_enqueue_burst_g(ix->rings[0], &ix->ring_geo[0], &got[i], 1, f->p->owner_id);
  assert_int_equal(back, n - 1);
  assert_int_equal(umbp_abort(f->p, rs), 0);
  census_ok(f->p);
}

/* A way whose slot id is past the pool's last slot. */
static void test_check_way_outside(void **state) {
  struct fx *f = *state;
  struct umbp_index *ix = f->p->index;
  unsigned w = empty_way(ix, 3);
  umbp_way_set(&ix->buckets[3], w, (0x1234ull << 32) | (ix->slot_count + 10 + 1));
  char want[160];
  snprintf(want, sizeof want, "bucket 3 way %u holds slot id %u, outside the pool's %u slots", w, ix->slot_count + 10,
           ix->slot_count);
  check_reports(f->p, want);
  umbp_way_set(&ix->buckets[3], w, 0);
  census_ok(f->p);
}

/* A published slot's way whose signature differs from its key's: in the
 * bucket's hint byte, then in the slot word's byte. */
static void test_check_way_signature(void **state) {
  struct fx *f = *state;
  struct umbp_index *ix = f->p->index;
  umbp_key k = itu_key(f->ns, 5, 0);
  uint32_t s = put(f->p, &k), b;
  unsigned w;
  linking_way(ix, s, &b, &w);
  uint64_t v = umbp_way_get(&ix->buckets[b], w);
  uint16_t sig = (uint16_t)(v >> 32);
  assert_int_equal(sig, umbp_key_sig(umbp_key_hash(&ix->meta[s].key)));
  uint16_t bad[2] = {(uint16_t)((sig & 0xff00) | ((sig & 0xff) == 0x55 ? 0x56 : 0x55)), (uint16_t)(sig ^ 0x8000)};
  for (int i = 0; i < 2; i++) {
    umbp_way_set(&ix->buckets[b], w, (uint64_t)bad[i] << 32 | (uint32_t)v);
    char want[160];
    snprintf(want, sizeof want, "bucket %u's way for slot %u has signature 0x%04x, but the slot's key hashes to 0x%04x",
             b, s, bad[i], sig);
    check_reports(f->p, want);
    umbp_way_set(&ix->buckets[b], w, v);
    census_ok(f->p);
  }
}

/* Move slot s's way from its home to d buckets on, with the home's
 * overflow word updated as an insert would have; returns the old word. */
static uint32_t displace(struct umbp_index *ix, uint32_t s, unsigned d, uint32_t *ret_home) {
  uint64_t h = umbp_key_hash(&ix->meta[s].key);
  uint32_t home = umbp_bucket_home(h, ix->nb), b;
  unsigned w;
  linking_way(ix, s, &b, &w);
  assert_int_equal(b, home);
  uint32_t to = umbp_bucket_at(home, d, ix->nb);
  unsigned w2 = empty_way(ix, to);
  uint64_t v = umbp_way_get(&ix->buckets[b], w);
  uint32_t old = atomic_load(&ix->buckets[home].ovf);
  umbp_ovf_add(&ix->buckets[home].ovf, d, umbp_ovf_bit(h));
  umbp_way_set(&ix->buckets[to], w2, v);
  umbp_way_set(&ix->buckets[b], w, 0);
  *ret_home = home;
  return old;
}

/* A displaced way farther than the home's overflow reach, and one farther
 * than any lookup looks (UMBP_MAX_PROBE - 1 buckets). */
static void test_check_way_distance(void **state) {
  struct fx *f = *state;
  struct umbp_index *ix = f->p->index;
  umbp_key k = itu_key(f->ns, 6, 0);
  uint32_t s = put(f->p, &k), home;
  uint32_t ov0 = displace(ix, s, 2, &home);
  census_ok(f->p); /* a consistent displacement */
  uint32_t ov = atomic_load(&ix->buckets[home].ovf);
  assert_int_equal(UMBP_OVF_REACH(ov), 2);
  atomic_store(&ix->buckets[home].ovf, (ov & 0xffffffu) | 1u << 24); /* reach 1, count and filter kept */
  char want[200];
  snprintf(want, sizeof want, "bucket %u's overflow reach is 1 but slot %u's key homed there lives 2 buckets on", home, s);
  check_reports(f->p, want);
  atomic_store(&ix->buckets[home].ovf, ov);
  census_ok(f->p);
  assert_int_equal(umbp_remove(f->p, &k), 0);
  atomic_store(&ix->buckets[home].ovf, ov0);
  census_ok(f->p);

  s = put(f->p, &k);
  displace(ix, s, UMBP_MAX_PROBE, &home);
  snprintf(want, sizeof want, "slot %u's key belongs to bucket %u but its way is in bucket %u, %u buckets on", s, home,
           umbp_bucket_at(home, UMBP_MAX_PROBE, ix->nb), UMBP_MAX_PROBE);
  check_reports(f->p, want);
}

/* FREE and PUBLISHED slots that name an owner. */
static void test_check_owner_of_unowned(void **state) {
  struct fx *f = *state;
  struct umbp_index *ix = f->p->index;
  uint32_t fs = a_free_slot(ix);
  uint64_t w = atomic_load(&ix->meta[fs].state);
  atomic_store(&ix->meta[fs].state, ST_NEXT(w, UMBP_SLOT_FREE, 3));
  char want[160];
  snprintf(want, sizeof want, "slot %u is FREE but names owner 3", fs);
  check_reports(f->p, want);
  atomic_store(&ix->meta[fs].state, w);
  census_ok(f->p);
  umbp_key k = itu_key(f->ns, 7, 0);
  uint32_t s = put(f->p, &k);
  w = atomic_load(&ix->meta[s].state);
  atomic_store(&ix->meta[s].state, ST_NEXT(w, UMBP_SLOT_PUBLISHED, 3));
  snprintf(want, sizeof want, "slot %u is PUBLISHED but names owner 3", s);
  check_reports(f->p, want);
  atomic_store(&ix->meta[s].state, w);
  census_ok(f->p);
}

/* RESERVED and EVICTING slots whose owner id is no registry slot (0, and
 * one past UMBP_MAX_PROCS). */
static void test_check_owner_out_of_range(void **state) {
  struct fx *f = *state;
  struct umbp_index *ix = f->p->index;
  uint32_t fs = a_free_slot(ix);
  uint64_t w = atomic_load(&ix->meta[fs].state);
  const struct {
    unsigned st, own;
    const char *name;
  } c[] = {{UMBP_SLOT_RESERVED, 0, "RESERVED"}, {UMBP_SLOT_EVICTING, UMBP_MAX_PROCS + 1, "EVICTING"}};
  for (int i = 0; i < 2; i++) {
    atomic_store(&ix->meta[fs].state, ST_NEXT(w, c[i].st, c[i].own));
    char want[160];
    snprintf(want, sizeof want, "slot %u is %s by owner id %u, which is no registry slot", fs, c[i].name, c[i].own);
    check_reports(f->p, want);
  }
  atomic_store(&ix->meta[fs].state, w);
  census_ok(f->p);
}

/* A published slot under a namespace that is not registered. */
static void test_check_ns_unregistered(void **state) {
  struct fx *f = *state;
  struct umbp_index *ix = f->p->index;
  umbp_key k = itu_key(f->ns, 8, 0);
  uint32_t s = put(f->p, &k);
  atomic_store(&ix->ns[f->ns].state, 0);
  char want[160];
  snprintf(want, sizeof want, "slot %u is PUBLISHED under namespace %u, which is not registered", s, f->ns);
  check_reports(f->p, want);
  atomic_store(&ix->ns[f->ns].state, 1);
  census_ok(f->p);
}

/* The pool header's partition count rewritten past the partition table
 * (processes use the table they copied at attach): the check names it and
 * reads no partition past the table's UMBP_MAX_PARTITIONS entries. */
static void test_check_partition_count(void **state) {
  struct fx *f = *state;
  uint32_t np = f->p->hdr->n_partitions;
  f->p->hdr->n_partitions = 0xffffffu;
  char want[160];
  snprintf(want, sizeof want, "the pool header counts %u partitions, not 1..%d", 0xffffffu, UMBP_MAX_PARTITIONS);
  check_reports(f->p, want);
  f->p->hdr->n_partitions = np;
  census_ok(f->p);
}

/* The pool header's slot count, then its bucket count, rewritten so that
 * the slot metadata and bucket array they imply run past their regions and
 * the mapping: the check says the header is corrupted and reads nothing
 * outside the segment. */
static void test_check_header_counts(void **state) {
  struct fx *f = *state;
  uint32_t *fld[2] = {&f->p->hdr->slot_count, &f->p->hdr->n_buckets};
  for (int i = 0; i < 2; i++) {
    uint32_t v = *fld[i];
    *fld[i] = 0xffffffu;
    check_reports(f->p, "the pool header is corrupted: its ");
    *fld[i] = v;
    census_ok(f->p);
  }
}

/* The key hash is part of the segment ABI: fixed answers for fixed keys, in
 * this build's form (AES rounds in an AES-NI build, the multiply-and-rotate
 * mix in others); the AES rounds in software (what the ABI fingerprint uses
 * on a CPU without AES-NI) agree with the instructions on every key; and
 * the software round is AES's (FIPS-197 appendix B: the state entering
 * round 2 of its example is round 1 applied to the state after the first
 * AddRoundKey, with round key 1). */
static void test_key_hash_fixed(void **state) {
  (void)state;
  static const uint64_t keys[][6] = {
      {0, 0, 0, 0, 0, 0},
      {1, 2, 3, 4, 5, 6},
      {0x0123456789abcdefull, 0xfedcba9876543210ull, 0xdeadbeefcafebabeull, 0x8badf00d0ddba11ull,
       0xffffffffffffffffull, 0x5555aaaa5555aaaaull},
      {7, 0x0020000000000000ull, 41, 0, 0, 0},
  };
  static const uint64_t aes[] = {0xbecb3de1bcf10c02ull, 0x41bb6fd751ab9728ull, 0xc05e983503113007ull,
                                 0xe1a71ecd4db39dfaull};
  static const uint64_t mix[] = {0xf2c20111a3f13930ull, 0x871bd47f9c0ad796ull, 0x85b27514da966294ull,
                                 0xdf93188d858a6382ull};
  const uint64_t *want = UMBP_KEY_HASH_AESNI ? aes : mix;
  for (unsigned i = 0; i < 4; i++) {
    assert_int_equal(umbp_key_hash_w(keys[i]), want[i]);
    assert_int_equal(umbp_key_hash_mem(keys[i]), want[i]);
    assert_int_equal(umbp_key_hash_soft(keys[i]), aes[i]);
  }
  uint8_t x[16] = {0x19, 0x3d, 0xe3, 0xbe, 0xa0, 0xf4, 0xe2, 0x2b, 0x9a, 0xc6, 0x8d, 0x2a, 0xe9, 0xf8, 0x48, 0x08};
  static const uint8_t k1[16] = {0xa0, 0xfa, 0xfe, 0x17, 0x88, 0x54, 0x2c, 0xb1,
                                 0x23, 0xa3, 0x39, 0x39, 0x2a, 0x6c, 0x76, 0x05};
  static const uint8_t r2[16] = {0xa4, 0x9c, 0x7f, 0xf2, 0x68, 0x9f, 0x35, 0x2b,
                                 0x6b, 0x5b, 0xea, 0x43, 0x02, 0x6a, 0x50, 0x49};
  umbp_aesenc_soft(x, k1);
  assert_memory_equal(x, r2, 16);
  uint64_t r = 0x2545f4914f6cdd1dull, w[6];
  for (unsigned n = 0; n < 100000; n++) {
    for (unsigned i = 0; i < 6; i++) r ^= r << 13, r ^= r >> 7, r ^= r << 17, w[i] = r >> (n % 61);
    uint64_t h = umbp_key_hash_w(w);
    if (h != umbp_key_hash_mem(w) || (UMBP_KEY_HASH_AESNI && h != umbp_key_hash_soft(w)))
      fail_msg("key %u: hash 0x%016llx, from memory 0x%016llx, AES in software 0x%016llx", n, (unsigned long long)h,
               (unsigned long long)umbp_key_hash_mem(w), (unsigned long long)umbp_key_hash_soft(w));
  }
}

/* The key hash and bucket placement are in the ABI fingerprint (issue 32,
 * smaller defects): a build that hashed a fixed key differently gets another
 * fingerprint, and the pool's recorded fingerprint includes this build's. */
static uint64_t this_build_hash(const uint64_t w[6]) { return umbp_key_hash_w(w); }
static uint64_t hash_low_bit_flipped(const uint64_t w[6]) { return umbp_key_hash_w(w) ^ 1; }
static uint64_t hash_high_bit_flipped(const uint64_t w[6]) { return umbp_key_hash_w(w) ^ (1ull << 63); }

static void test_fingerprint_covers_hash(void **state) {
  struct fx *f = *state;
  uint64_t part = umbp_index_module.abi_part();
  assert_int_equal(umbp_abi_fingerprint(), umbp_abi_fingerprint_with(&umbp_index_module, part));
  assert_int_equal(f->p->hdr->abi_fingerprint, umbp_abi_fingerprint());
  /* another hash of one fixed key (as another build would compute it) */
  assert_true(umbp_abi_fingerprint_with(&umbp_index_module, part ^ 1) != umbp_abi_fingerprint());
  /* the part depends on the hash and on the placement of fixed keys: it is
   * the mix of umbp_key_hash_w's results, and a build whose key hash differs
   * (here: two other hashes, one that differs in the low bits that place a
   * key, one in the high bits of its signature) gets another part. A part
   * that did not feed the hash in (checked before: h != 0 and part != its
   * seed) let two builds that place keys differently share a pool. */
  uint64_t w[6] = {1, 2, 3, 4, 5, 6};
  uint64_t h = umbp_key_hash_w(w);
  assert_true(h != 0);
  assert_true(umbp_index_abi_part() != 0x756d62706b657973ull);
  uint64_t kpart = umbp_index_abi_part();
  assert_int_equal(umbp_index_abi_part_with(this_build_hash), kpart);
  assert_true(umbp_index_abi_part_with(hash_low_bit_flipped) != kpart);
  assert_true(umbp_index_abi_part_with(hash_high_bit_flipped) != kpart);
  /* ... and the module's part (the one the fingerprint folds in, above) is
   * made of it: another key part is another module part */
  assert_int_equal(umbp_index_module_abi_with(kpart), part);
  assert_true(umbp_index_module_abi_with(umbp_index_abi_part_with(hash_low_bit_flipped)) != part);
}

/* A full pool under long churn never runs out of index ways. At 32767 slots a
 * power-of-two bucket count with 1.25 ways a slot (the sizing before layout
 * 2.0) gives 80% of the ways used at full load: there, linear probing pushes
 * keys past UMBP_MAX_PROBE buckets and publish fails with "index
 * neighbourhood ... full". */
static int setup_awkward(void **state) { return setup_n(state, 32767, 0); }
static void test_full_pool_churn(void **state) {
  struct fx *f = *state;
  umbp_pool_info info;
  umbp_pool_get_info(f->p, &info);
  unsigned total = info.slot_count;
  assert_true(total > 20000);
  assert_true((uint64_t)f->p->hdr->n_buckets * UMBP_BUCKET_WAYS * 2 >= (uint64_t)total * 3); /* 1.5 ways a slot */
  uint32_t s;
  /* fill, then 10x the pool of fresh keys, each reserve evicting on demand */
  for (unsigned i = 0; i < 11 * total; i++) {
    umbp_key k = itu_key(f->ns, 100000 + i, 0);
    int rc = umbp_reserve(f->p, -1, f->ns, &s);
    if (rc) fprintf(stderr, "reserve %u: %s\n", i, umbp_last_error());
    assert_int_equal(rc, 0);
    rc = umbp_publish(f->p, s, &k);
    if (rc) fprintf(stderr, "publish %u: %s\n", i, umbp_last_error());
    assert_int_equal(rc, 0);
  }
  uint64_t entries, hist[UMBP_MAX_PROBE + 1];
  assert_int_equal(umbp_index_stats(f->p, &entries, hist, UMBP_MAX_PROBE + 1), 0);
  assert_true(entries > total - total / 8);
  unsigned far = 0;
  for (unsigned d = 0; d <= UMBP_MAX_PROBE; d++)
    if (hist[d]) far = d;
  assert_true(far < UMBP_MAX_PROBE / 2);
  census_ok(f->p);
}

/* Structured key sets fill every slot with no key left without a way: block
 * ids are often sequential integers (a trace's ids, 8-byte hashes), ranks and
 * namespaces sit in other key words, and a weak key hash (an XOR fold, a sum
 * of per-word products) was measured to overfill neighbourhoods on these. */
static umbp_key structured_key(unsigned set, unsigned i, const uint32_t ns[16]) {
  umbp_key k = {.ns = ns[0], .hash_len = 8};
  uint64_t id = i;
  if (set == 1) k.tp_rank = (uint16_t)(i & 7), id = i >> 3;
  if (set == 2) k.ns = ns[i & 15], id = i >> 4;
  if (set == 3) id = (uint64_t)i << 12;
  if (set == 4) k.group = (uint16_t)(i & 3), id = i >> 2;
  memcpy(k.hash, &id, 8);
  return k;
}

static void test_structured_keys(void **state) {
  struct fx *f = *state;
  umbp_pool_info info;
  umbp_pool_get_info(f->p, &info);
  const unsigned total = info.slot_count;
  assert_true(total > 30000);
  uint32_t ns[16];
  for (unsigned i = 0; i < 16; i++) {
    char nm[16];
    snprintf(nm, sizeof nm, "set-%u", i);
    assert_int_equal(umbp_ns_register(f->p, nm, &ns[i]), 0);
  }
  static const char *what[] = {"sequential ids", "8 tp ranks x sequential ids", "16 namespaces x sequential ids",
                               "ids with a 4096 stride", "4 KV groups x sequential ids"};
  for (unsigned set = 0; set < sizeof what / sizeof what[0]; set++) {
    for (unsigned i = 0; i < total; i++) {
      umbp_key k = structured_key(set, i, ns);
      uint32_t s;
      assert_int_equal(umbp_reserve(f->p, -1, k.ns, &s), 0);
      int rc = umbp_publish(f->p, s, &k);
      if (rc) fprintf(stderr, "# %s: publish %u of %u: %s\n", what[set], i, total, umbp_last_error());
      assert_int_equal(rc, 0);
    }
    uint64_t entries, hist[UMBP_MAX_PROBE + 1];
    assert_int_equal(umbp_index_stats(f->p, &entries, hist, UMBP_MAX_PROBE + 1), 0);
    assert_int_equal(entries, total);
    unsigned far = 0;
    for (unsigned d = 0; d <= UMBP_MAX_PROBE; d++)
      if (hist[d]) far = d;
    fprintf(stderr, "# %s: %u keys, furthest %u buckets from home\n", what[set], total, far);
    assert_true(far < UMBP_MAX_PROBE / 2);
    census_ok(f->p); /* with the check of each home's overflow count and reach */
    /* every key is found, displaced ones through their home's overflow
     * count and reach, by the single and the batched lookup; displaced keys
     * exist */
    unsigned displaced = 0;
    for (unsigned i = 0; i < total; i++) {
      umbp_key k = structured_key(set, i, ns);
      assert_int_equal(umbp_contains(f->p, &k), 1);
      uint8_t present = 0;
      assert_int_equal(umbp_contains_bulk(f->p, 1, &k, &present), 1);
      assert_int_equal(present, 1);
    }
    /* and by the batched probe of 32 keys, which looks past a home only
     * when the key's bit is in the home's overflow filter */
    for (unsigned i = 0; i < total; i += 32) {
      umbp_key kb[32];
      uint8_t pb[32];
      unsigned c = total - i < 32 ? total - i : 32;
      for (unsigned j = 0; j < c; j++) kb[j] = structured_key(set, i + j, ns);
      assert_int_equal(umbp_contains_bulk(f->p, c, kb, pb), (int)c);
    }
    for (uint32_t b = 0; b < f->p->hdr->n_buckets; b++)
      displaced += UMBP_OVF_COUNT(atomic_load(&f->p->index->buckets[b].ovf));
    assert_true(displaced > 0);
    for (unsigned i = 0; i < 16; i++) assert_true(umbp_clear_ns(f->p, ns[i]) >= 0);
    umbp_reclaim(f->p);
    census_ok(f->p);
    /* with no key left, every overflow word (filter, count, reach) is 0 again */
    for (uint32_t b = 0; b < f->p->hdr->n_buckets; b++)
      assert_int_equal(atomic_load(&f->p->index->buckets[b].ovf), 0);
  }
}

/* A pool records removed events only once a process has drained its event
 * ring: before, removals skip it (no events pending, none dropped); after the
 * first drain, by this or another handle, every removal is recorded. */
static void test_events_recorded_after_first_drain(void **state) {
  struct fx *f = *state;
  umbp_admin_event_ring ring;
  for (int i = 0; i < 40; i++) { /* more than the ring holds */
    umbp_key k = itu_key(f->ns, 700 + (uint64_t)i, 0);
    put(f->p, &k);
    assert_int_equal(umbp_remove(f->p, &k), 0);
  }
  assert_int_equal(umbp_admin_events_peek(f->p, 0, NULL, NULL, &ring), 0);
  assert_int_equal(ring.recording, 0);
  assert_int_equal(ring.pending, 0);
  assert_int_equal(ring.dropped, 0);
  umbp_counters c;
  umbp_counters_flush(f->p);
  assert_int_equal(umbp_counters_ns(f->p, f->ns, &c), 0);
  assert_int_equal(c.removes, 40); /* the removals themselves happened */
  /* the first drain, from a second handle of this process, turns recording on for every handle */
  umbp_pool *q = NULL;
  assert_int_equal(umbp_pool_attach(f->name, NULL, &q), 0);
  assert_int_equal(umbp_events_drain(q, NULL, 0), 0);
  assert_int_equal(umbp_admin_events_peek(f->p, 0, NULL, NULL, &ring), 0);
  assert_int_equal(ring.recording, 1);
  umbp_key k = itu_key(f->ns, 800, 0);
  put(f->p, &k);
  assert_int_equal(umbp_remove(f->p, &k), 0);
  umbp_event ev[8];
  assert_int_equal(umbp_events_drain(q, ev, 8), 1);
  assert_int_equal(ev[0].type, UMBP_EV_REMOVED);
  assert_memory_equal(ev[0].key.hash, k.hash, 32);
  umbp_pool_detach(q);
}

/* A pool made by a build that always recorded removed events lacks
 * UMBP_FEAT_INCOMPAT_EVENTS_ON_DRAIN, and its drainers never turn recording
 * on: a read-write attacher of this build turns it on at once. A new pool
 * carries the bit and starts with recording off. */
static void test_events_pool_of_older_build(void **state) {
  struct fx *f = *state;
  struct umbp_shm_header *h = f->p->hdr;
  struct umbp_index_hdr *ih = umbp_pool_region(f->p, UMBP_REG_INDEXHDR);
  assert_true(h->incompat_features & UMBP_FEAT_INCOMPAT_EVENTS_ON_DRAIN);
  assert_int_equal(atomic_load(&ih->events_on), 0);
  h->incompat_features &= ~UMBP_FEAT_INCOMPAT_EVENTS_ON_DRAIN;
  h->header_checksum = umbp_header_checksum(h);
  umbp_pool *q = NULL;
  assert_int_equal(umbp_pool_attach(f->name, NULL, &q), 0);
  assert_int_equal(atomic_load(&ih->events_on), 1);
  umbp_key k = itu_key(f->ns, 900, 0);
  put(f->p, &k);
  assert_int_equal(umbp_remove(f->p, &k), 0);
  umbp_event ev[4];
  assert_int_equal(umbp_events_drain(q, ev, 4), 1); /* recorded before any drain */
  assert_int_equal(ev[0].type, UMBP_EV_REMOVED);
  umbp_pool_detach(q);
}

static uint64_t thread_cpu_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* CPU time of n removals of keys id0.. (published first, 32 at a time in
 * the 64-slot pool, untimed). */
static uint64_t timed_removals(struct fx *f, uint64_t id0, int n) {
  uint64_t t = 0;
  for (int b = 0; b < n; b += 32) {
    for (int i = b; i < b + 32 && i < n; i++) {
      umbp_key k = itu_key(f->ns, id0 + (uint64_t)i, 0);
      put(f->p, &k);
    }
    uint64_t t0 = thread_cpu_ns();
    for (int i = b; i < b + 32 && i < n; i++) {
      umbp_key k = itu_key(f->ns, id0 + (uint64_t)i, 0);
      assert_int_equal(umbp_remove(f->p, &k), 0);
    }
    t += thread_cpu_ns() - t0;
  }
  return t;
}

/* A drainer stopped (or killed, not yet reaped) between its claim of the
 * oldest event and its release: the cell every removal's event needs stays
 * READING. Removals go on, dropping and counting their events, and after
 * the first gives up, no removal spins on that cell again. Before the fix
 * each spun 1024 times first: about 30 us a removal, 250 times its cost,
 * in every process, for as long as the drainer stayed stopped. The stopped
 * drainer is its claim, as the ring's dequeue leaves it: the cell word
 * READING under an owner id that never moves. */
static void test_event_ring_stopped_drainer(void **state) {
  struct fx *f = *state;
  assert_int_equal(umbp_events_drain(f->p, NULL, 0), 0); /* record removed events */
  enum { N = 2000 };
  uint64_t base = timed_removals(f, 1000, N); /* the ring full, each event drops the oldest */
  struct umbp_ring_hdr *h = umbp_pool_region(f->p, UMBP_REG_EVENTS);
  uint64_t pos = atomic_load(&h->enq_pos);
  struct umbp_ring_cell *c = umbp_ring__cell(h, pos);
  uint64_t w0 = atomic_load(&c->word);
  assert_int_equal(umbp_ring__wkind(w0), UMBP_RING_STABLE);
  assert_int_equal(umbp_ring__seqdiff(umbp_ring__wseq(w0), pos), 1 - 16); /* the oldest of 16 */
  atomic_store(&c->word, umbp_ring__word(umbp_ring__wseq(w0), UMBP_RING_READING, 0x7777));
  uint64_t d0 = umbp_events_dropped(f->p);
  uint64_t stuck = timed_removals(f, 10000, N);
  assert_int_equal(umbp_events_dropped(f->p) - d0, N); /* each removal's own event, counted */
  if (stuck >= 4 * base + 1000000)
    fprintf(stderr, "%d removals: %.1f ms CPU with a drainer stopped in its claim, %.1f ms without\n", N,
                    stuck / 1e6, base / 1e6);
  assert_true(stuck < 4 * base + 1000000);
  /* the drainer resumes (here: the cell as it was): events are recorded again */
  atomic_store(&c->word, w0);
  umbp_key k = itu_key(f->ns, 20000, 0);
  put(f->p, &k);
  assert_int_equal(umbp_remove(f->p, &k), 0);
  umbp_event ev[64];
  int n = umbp_events_drain(f->p, ev, 64);
  assert_int_equal(n, 16);
  assert_memory_equal(ev[15].key.hash, k.hash, 32);
}

static void test_event_ring_drops_oldest(void **state) {
  struct fx *f = *state;
  assert_int_equal(umbp_events_drain(f->p, NULL, 0), 0); /* record removed events */
  /* 40 removals into a 16-event ring */
  for (int i = 0; i < 40; i++) {
    umbp_key k = itu_key(f->ns, 300 + (uint64_t)i, 0);
    put(f->p, &k);
    assert_int_equal(umbp_remove(f->p, &k), 0);
  }
  /* recording, nothing taken yet: inspect's "no consumer attached" (drained 0)
   * holds although 24 events were dropped */
  umbp_admin_event_ring ring;
  assert_int_equal(umbp_admin_events_peek(f->p, 0, NULL, NULL, &ring), 0);
  assert_int_equal(ring.drained, 0);
  assert_int_equal(ring.pending, 16);
  assert_int_equal(ring.dropped, 24);
  umbp_event ev[64];
  int n = umbp_events_drain(f->p, ev, 64);
  assert_int_equal(n, 16);
  assert_int_equal(umbp_events_dropped(f->p), 24);
  assert_int_equal(umbp_admin_events_peek(f->p, 0, NULL, NULL, &ring), 0);
  assert_int_equal(ring.drained, 16); /* the events taken, not the positions passed */
  assert_int_equal(ring.pending, 0);
  for (int i = 0; i < 16; i++) {
    umbp_key k = itu_key(f->ns, 300 + 24 + (uint64_t)i, 0);
    assert_memory_equal(ev[i].key.hash, k.hash, 32); /* the newest 16, oldest first */
  }
}

static void test_quota(void **state) {
  struct fx *f = *state;
  uint32_t a = f->ns, b;
  assert_int_equal(umbp_ns_register(f->p, "model-b", &b), 0);
  assert_int_equal(umbp_ns_set_quota(f->p, a, 20 * 4096), 0);
  assert_int_equal(umbp_ns_set_quota(f->p, 200, 1), -ENOENT);
  umbp_pool_info info;
  umbp_pool_get_info(f->p, &info);
  /* b fills most of the pool */
  unsigned nb = info.slot_count - 30;
  for (unsigned i = 0; i < nb; i++) {
    umbp_key k = itu_key(b, i, 0);
    put(f->p, &k);
  }
  /* a stores 100 blocks: over its quota it evicts its own */
  for (unsigned i = 0; i < 100; i++) {
    umbp_key k = itu_key(a, i, 0);
    put(f->p, &k);
  }
  for (unsigned i = 0; i < nb; i++) {
    umbp_key k = itu_key(b, i, 0);
    assert_int_equal(umbp_contains(f->p, &k), 1);
  }
  int present = 0;
  for (unsigned i = 0; i < 100; i++) {
    umbp_key k = itu_key(a, i, 0);
    present += umbp_contains(f->p, &k);
  }
  assert_true(present <= 21 && present >= 10);
  census_ok(f->p);
}

/* Bulk lookups count each key for its own namespace: one update per counter
 * when a batch shares a namespace, per namespace run when it does not; a
 * prefix probe counts up to its first miss; present[] is optional. */
struct ctr_delta {
  umbp_counters a, b;
};
static void ctr_snap(struct fx *f, uint32_t b, struct ctr_delta *d) {
  assert_int_equal(umbp_counters_ns(f->p, f->ns, &d->a), 0);
  assert_int_equal(umbp_counters_ns(f->p, b, &d->b), 0);
}
static void ctr_expect(struct fx *f, uint32_t b, struct ctr_delta *d, uint64_t ah, uint64_t am, uint64_t ap,
                       uint64_t bh, uint64_t bm, uint64_t bp) {
  struct ctr_delta n;
  ctr_snap(f, b, &n);
  assert_int_equal(n.a.hits - d->a.hits, ah);
  assert_int_equal(n.a.misses - d->a.misses, am);
  assert_int_equal(n.a.lookups - d->a.lookups, ah + am);
  assert_int_equal(n.a.pins - d->a.pins, ap);
  assert_int_equal(n.b.hits - d->b.hits, bh);
  assert_int_equal(n.b.misses - d->b.misses, bm);
  assert_int_equal(n.b.lookups - d->b.lookups, bh + bm);
  assert_int_equal(n.b.pins - d->b.pins, bp);
  *d = n;
}
static void test_bulk_counters(void **state) {
  struct fx *f = *state;
  uint32_t b;
  assert_int_equal(umbp_ns_register(f->p, "model-b", &b), 0);
  /* ka: one namespace; mix: key i in namespace b when i % 3 == 0; even keys stored */
  umbp_key ka[40], mix[40];
  unsigned ah = 0, am = 0, bh = 0, bm = 0;
  for (int i = 0; i < 40; i++) {
    ka[i] = itu_key(f->ns, 700 + (uint64_t)i, 0);
    mix[i] = itu_key(i % 3 ? f->ns : b, 800 + (uint64_t)i, 0);
    if (i % 2 == 0) {
      put(f->p, &ka[i]);
      put(f->p, &mix[i]);
    }
    unsigned *c = i % 3 ? (i % 2 ? &am : &ah) : (i % 2 ? &bm : &bh);
    (*c)++;
  }
  struct ctr_delta d;
  ctr_snap(f, b, &d);
  assert_int_equal(umbp_contains_bulk(f->p, 40, ka, NULL), 20); /* two chunks, no present[] */
  ctr_expect(f, b, &d, 20, 20, 0, 0, 0, 0);
  uint8_t present[40];
  assert_int_equal(umbp_contains_bulk(f->p, 40, mix, present), 20);
  for (int i = 0; i < 40; i++) assert_int_equal(present[i], i % 2 == 0);
  ctr_expect(f, b, &d, ah, am, 0, bh, bm, 0);
  uint32_t got[40];
  assert_int_equal(umbp_lookup_pin_bulk(f->p, 40, mix, got), 20);
  ctr_expect(f, b, &d, ah, am, ah, bh, bm, bh);
  assert_int_equal(umbp_unpin_bulk(f->p, 40, got), 0);
  assert_int_equal(umbp_lookup_pin_bulk(f->p, 40, ka, got), 20);
  ctr_expect(f, b, &d, 20, 20, 20, 0, 0, 0);
  assert_int_equal(umbp_unpin_bulk(f->p, 40, got), 0);
  /* prefix: ka[0] hits, ka[1] misses: two lookups counted, not forty */
  assert_int_equal(umbp_prefix_probe(f->p, 40, ka), 1);
  ctr_expect(f, b, &d, 1, 1, 0, 0, 0, 0);
  /* b hit, a hit, b miss (first miss), a hit (not looked up) */
  umbp_key pre[4] = {mix[0], mix[2], mix[3], mix[4]};
  assert_int_equal(umbp_prefix_probe(f->p, 4, pre), 2);
  ctr_expect(f, b, &d, 1, 0, 0, 1, 1, 0);
  census_ok(f->p);
}

struct count_arg {
  umbp_pool *p;
  umbp_key hit, miss;
  int ok;
};

/* 100 single hits, 2 pin hits, 3 pin misses, then exit without flushing */
static void *count_thread(void *arg) {
  struct count_arg *a = arg;
  int ok = 1;
  uint32_t s;
  for (int i = 0; i < 100; i++) ok &= umbp_contains(a->p, &a->hit) == 1;
  for (int i = 0; i < 2; i++) {
    ok &= umbp_lookup_pin(a->p, &a->hit, &s) == 0;
    ok &= umbp_unpin(a->p, s) == 0;
  }
  for (int i = 0; i < 3; i++) ok &= umbp_lookup_pin(a->p, &a->miss, &s) == -ENOENT;
  a->ok = ok;
  return NULL;
}

static void test_counters(void **state) {
  struct fx *f = *state;
  umbp_key k = itu_key(f->ns, 7, 0), miss = itu_key(f->ns, 8, 0);
  put(f->p, &k);
  uint32_t s;
  for (int i = 0; i < 10; i++) {
    assert_int_equal(umbp_lookup_pin(f->p, &k, &s), 0);
    umbp_unpin(f->p, s);
  }
  for (int i = 0; i < 5; i++) assert_int_equal(umbp_lookup_pin(f->p, &miss, &s), -ENOENT);
  umbp_counters c;
  assert_int_equal(umbp_counters_ns(f->p, f->ns, &c), 0);
  assert_int_equal(c.lookups, 15);
  assert_int_equal(c.hits, 10);
  assert_int_equal(c.misses, 5);
  assert_int_equal(c.inserts, 1);
  assert_int_equal(c.pins, 10);
  umbp_counters all;
  assert_int_equal(umbp_counters_ns(f->p, UINT32_MAX, &all), 0);
  assert_int_equal(all.lookups, 15);
  umbp_counters pc;
  umbp_counters_flush(f->p);
  assert_int_equal(umbp_counters_part(f->p, 0, &pc), 0);
  assert_int_equal(pc.hits, 10); /* each pin hit counts for the slot's partition */
  assert_true(pc.inserts <= 1);
  /* single-key contains: 7 hits, 3 misses (counted on the thread's reader line) */
  for (int i = 0; i < 7; i++) assert_int_equal(umbp_contains(f->p, &k), 1);
  for (int i = 0; i < 3; i++) assert_int_equal(umbp_contains(f->p, &miss), 0);
  assert_int_equal(umbp_counters_ns(f->p, f->ns, &c), 0);
  assert_int_equal(c.lookups, 25);
  assert_int_equal(c.hits, 17);
  assert_int_equal(c.misses, 8);
  assert_int_equal(c.pins, 10);
  /* another thread's counts, past the 64-lookup batch, arrive when it exits */
  struct count_arg ca = {.p = f->p, .hit = k, .miss = miss};
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, count_thread, &ca), 0);
  assert_int_equal(pthread_join(th, NULL), 0);
  assert_int_equal(ca.ok, 1);
  assert_int_equal(umbp_counters_ns(f->p, f->ns, &c), 0);
  assert_int_equal(c.lookups, 25 + 100 + 5);
  assert_int_equal(c.hits, 17 + 100 + 2);
  assert_int_equal(c.misses, 8 + 3);
  assert_int_equal(c.pins, 10 + 2);
  assert_int_equal(umbp_counters_part(f->p, 99, &pc), -EINVAL);
  uint64_t entries, hist[4];
  assert_int_equal(umbp_index_stats(f->p, &entries, hist, 4), 0);
  assert_int_equal(entries, 1);
  assert_int_equal(hist[0], 1);
}

static void test_background_evictor(void **state) {
  struct fx *f = *state;
  umbp_pool_info info;
  umbp_pool_get_info(f->p, &info);
  for (unsigned i = 0; i < info.slot_count; i++) {
    umbp_key k = itu_key(f->ns, 20000 + i, 0);
    put(f->p, &k);
  }
  umbp_ns_info ni;
  assert_int_equal(umbp_ns_info_get(f->p, f->ns, &ni), 0);
  assert_int_equal(ni.blocks, info.slot_count);
  assert_int_equal(ni.bytes, (uint64_t)info.slot_count * 4096);
  assert_string_equal(ni.name, "model-a");
  assert_int_equal(umbp_ns_info_get(f->p, 200, &ni), -ENOENT);
  assert_int_equal(umbp_ns_count(f->p), 1);
  assert_int_equal(umbp_evictor_start(f->p, 50, 40, 5), -EINVAL); /* low >= high */
  assert_int_equal(umbp_evictor_start(f->p, 20, 40, 5), 0);
  assert_int_equal(umbp_evictor_start(f->p, 20, 40, 5), -EBUSY);
  umbp_slot_census c = {0};
  for (int i = 0; i < 400; i++) {
    struct timespec ts = {0, 5000000};
    nanosleep(&ts, NULL);
    umbp_census(f->p, &c);
    if (c.free_ * 100 >= c.total * 20) break;
  }
  umbp_evictor_stop(f->p);
  assert_true(c.free_ * 100 >= c.total * 20);      /* restored past the low watermark */
  assert_true(c.free_ * 100 <= c.total * 40 + 100); /* and not much past the high one */
  assert_int_equal(umbp_ns_info_get(f->p, f->ns, &ni), 0);
  assert_int_equal(ni.blocks, c.published);
  census_ok(f->p);
}

/* No grace period (layout 6): a removed block's slot is free at once, while
 * another thread of any process may be anywhere in a lookup; a lookup that
 * found the slot before its reuse rejects it, by key or by state word. The
 * "stopped reader" here is a lookup's first half done by hand: way found,
 * state word read; then the slot is removed, reserved and published again
 * under another key; then the second half runs. */
static void test_reuse_while_reader_stopped(void **state) {
  struct fx *f = *state;
  umbp_slot_census c;
  umbp_census(f->p, &c);
  uint64_t total = c.total;
  for (uint64_t id = 0; id < total; id++) {
    umbp_key k = itu_key(f->ns, 7000 + id, 0);
    put(f->p, &k);
  }
  struct umbp_index *ix = f->p->index;
  umbp_key k0 = itu_key(f->ns, 7000, 0);
  uint32_t s0;
  assert_int_equal(umbp_lookup_pin(f->p, &k0, &s0), 0);
  assert_int_equal(umbp_unpin(f->p, s0), 0);
  uint64_t st_seen = atomic_load(&ix->meta[s0].state); /* the stopped reader's view */
  struct umbp_key_shm ks;
  uint64_t h;
  assert_int_equal(key_load(&k0, &ks, &h), 0);
  assert_int_equal(way_check(ix, s0 + 1, &ks, &st_seen), s0);
  /* the pool is full; remove k0, and its slot is the one free slot: at once */
  assert_int_equal(umbp_remove(f->p, &k0), 0);
  umbp_census(f->p, &c);
  assert_int_equal(c.free_, 1);
  uint32_t s;
  assert_int_equal(umbp_reserve(f->p, -1, f->ns, &s), 0);
  assert_int_equal(s, s0);
  umbp_key k1 = itu_key(f->ns, 999999, 0);
  itu_fill(umbp_slot_ptr(f->p, s), umbp_slot_size(f->p), &k1);
  assert_int_equal(umbp_publish(f->p, s, &k1), 0);
  /* the reader resumes: its key no longer matches, and its state word is stale */
  uint64_t st2;
  assert_int_equal(way_check(ix, s0 + 1, &ks, &st2), UMBP_NO_SLOT);
  assert_int_equal(pin_slot(ix, s0, st_seen), -ENOENT);
  /* the same key published again into the same slot: a lookup that read the
   * old state word still cannot pin through it (new generation) */
  assert_int_equal(umbp_remove(f->p, &k1), 0);
  assert_int_equal(umbp_reserve(f->p, -1, f->ns, &s), 0);
  assert_int_equal(s, s0);
  itu_fill(umbp_slot_ptr(f->p, s), umbp_slot_size(f->p), &k0);
  assert_int_equal(umbp_publish(f->p, s, &k0), 0);
  assert_int_equal(pin_slot(ix, s0, st_seen), -ENOENT);
  assert_int_equal(way_check(ix, s0 + 1, &ks, &st2), s0);
  assert_true(st2 != st_seen);
  umbp_census(f->p, &c);
  assert_int_equal(c.retired, 0);
  census_ok(f->p);
}

/* A co-tenant with write access rewrites the header's partition table after
 * we attached (issue 32 #10): our reserves, publishes, lookups and slot
 * addresses go on from the copy taken at attach. */
static void test_partition_table_rewritten(void **state) {
  struct fx *f = *state;
  struct umbp_shm_header *h = f->p->hdr;
  struct umbp_partition_desc saved = h->partitions[0];
  h->partitions[0].first_slot = 0xffffff00u;
  h->partitions[0].slot_count = 3;
  h->partitions[0].offset = 1ull << 60;
  h->partitions[0].ring_offset = 1ull << 60;
  umbp_key k = itu_key(f->ns, 4242, 0);
  uint32_t s = put(f->p, &k);
  assert_non_null(umbp_slot_ptr(f->p, s));
  uint32_t s2;
  assert_int_equal(umbp_lookup_pin(f->p, &k, &s2), 0);
  assert_int_equal(s2, s);
  assert_true(itu_check(umbp_slot_ptr(f->p, s2), umbp_slot_size(f->p), &k));
  assert_int_equal(umbp_unpin(f->p, s2), 0);
  assert_int_equal(umbp_remove(f->p, &k), 0);
  h->partitions[0] = saved;
  census_ok(f->p);
}

/* ---- threads (also the TSan target) ---------------------------------------- */
struct thr {
  struct fx *f;
  unsigned id;
  _Atomic unsigned *stop;
  unsigned long ops, torn;
};

static void *worker(void *arg) {
  struct thr *t = arg;
  umbp_pool *p = t->f->p;
  uint64_t rng = 0x1234 + t->id;
  while (!atomic_load(t->stop)) {
    rng = itu_mix(rng);
    uint64_t id = rng % 200;
    umbp_key k = itu_key(t->f->ns, id, 0);
    unsigned op = (unsigned)(rng >> 32) % 10;
    uint32_t s;
    if (op < 4) {
      if (umbp_reserve(p, -1, k.ns, &s) == 0) {
        itu_fill(umbp_slot_ptr(p, s), 4096, &k);
        int rc = umbp_publish(p, s, &k);
        assert_true(rc == 0 || rc == -EEXIST);
      }
    } else if (op < 9) {
      if (umbp_lookup_pin(p, &k, &s) == 0) {
        if (!itu_check(umbp_slot_ptr(p, s), 4096, &k)) t->torn++;
        umbp_unpin(p, s);
      }
    } else {
      umbp_remove(p, &k);
    }
    t->ops++;
  }
  umbp_counters_flush(p);
  return NULL;
}

/* Tidies the free ring over and over while the workers churn: the ring is
 * marked untidy before each pass, as a scan would mark it. */
static void *tidier(void *arg) {
  struct thr *t = arg;
  umbp_pool *p = t->f->p;
  while (!atomic_load(t->stop)) {
    atomic_fetch_or(&p->index->ih->untidy, 1);
    assert_true(umbp_reclaim(p) >= 0);
    t->ops++;
  }
  return NULL;
}

static void test_threads(void **state) {
  struct fx *f = *state;
  enum { N = 4 };
  pthread_t th[N + 1];
  struct thr t[N + 1];
  _Atomic unsigned stop = 0;
  for (unsigned i = 0; i <= N; i++) {
    t[i] = (struct thr){.f = f, .id = i, .stop = &stop};
    pthread_create(&th[i], NULL, i < N ? worker : tidier, &t[i]);
  }
  struct timespec ts = {1, 0};
  nanosleep(&ts, NULL);
  atomic_store(&stop, 1);
  unsigned long ops = 0, torn = 0;
  for (unsigned i = 0; i <= N; i++) {
    pthread_join(th[i], NULL);
    if (i == N) break;
    ops += t[i].ops;
    torn += t[i].torn;
  }
  fprintf(stderr, "# threads: %lu ops, %lu torn reads, %lu passes of the free-ring tidy alongside; off-ring word 0x%x\n",
          ops, torn, t[N].ops, (unsigned)atomic_load(&f->p->index->ih->off_ring[0]));
  assert_int_equal(torn, 0);
  assert_true(ops > 1000);
  assert_true(t[N].ops > 0);
  census_ok(f->p);
  /* A tidy alongside other threads may leave a few stale entries unmarked
   * (a slot whose free was still enqueueing when a scan took it); a tidy of
   * the quiet pool leaves each free slot on the ring exactly once. */
  atomic_fetch_or(&f->p->index->ih->untidy, 1);
  assert_true(umbp_reclaim(f->p) >= 0);
  census_ok(f->p);
  umbp_slot_census c;
  assert_int_equal(umbp_census(f->p, &c), 0);
  assert_int_equal(c.in_rings, c.free_);
}

/* Create a 64-slot pool of 4 KiB slots under a fresh test name (written to
 * name), attached read-write at *ret. */
static void small_pool(char *name, size_t n, const char *tag, umbp_pool **ret) {
  snprintf(name, n, "%s", tu_name(tag));
  umbp_pool_params pp;
  umbp_pool_params_init(&pp);
  pp.slot_size = 4096;
  pp.capacity = 64 * 4096;
  pp.no_prefault = true;
  assert_int_equal(umbp_pool_create(name, &pp, ret), 0);
}

/* Thread lines: a thread's line and counts live in process memory named by
 * its thread pointer (threads.c), found through the thread cache. Lines come
 * back when threads exit (so 300 short-lived threads fit in 64 lines, with
 * every lookup counted), the 64th concurrent thread gets -EUSERS while 63
 * others and this one hold lines, and one thread may use any number of
 * pools (the thread-local cache this replaced held 8). */
struct line_arg {
  umbp_pool *p;
  umbp_key hit, miss;
  pthread_barrier_t *hold; /* wait here (holding the line) before exit, if set */
  int rc; /* 0, or the first failure (-EUSERS with its message) */
};

static void *line_thread(void *arg) {
  struct line_arg *a = arg;
  a->rc = 0;
  for (int i = 0; i < 100 && a->rc >= 0; i++)
    if ((a->rc = umbp_contains(a->p, &a->hit)) == 1) a->rc = 0;
  for (int i = 0; i < 37 && a->rc >= 0; i++) a->rc = umbp_contains(a->p, &a->miss);
  if (a->rc == -EUSERS && !strstr(umbp_last_error(), "use fewer threads")) a->rc = -EINVAL; /* the message */
  if (a->hold) pthread_barrier_wait(a->hold);
  return NULL;
}

static void test_thread_lines(void **state) {
  struct fx *f = *state;
  umbp_key k = itu_key(f->ns, 70, 0), miss = itu_key(f->ns, 71, 0);
  put(f->p, &k); /* this thread holds a line from here on */
  /* this thread is in the first entry or the thread cache: calls take the fast path */
  unsigned h = umbp_ix_tc_hash(umbp_ix_self());
  struct umbp_index *ix = f->p->index;
  struct tl_slot *mine = umbp_ix_thread_slot_find(ix);
  assert_true((atomic_load(&ix->first_self) == umbp_ix_self() && ix->first_tl == mine) ||
              atomic_load(&ix->tcache[h]) == umbp_ix_tc_entry(umbp_ix_self(), mine->tid) ||
              atomic_load(&ix->tcache[h + 1]) == umbp_ix_tc_entry(umbp_ix_self(), mine->tid));
  umbp_counters c0, c;
  umbp_counters_flush(f->p);
  assert_int_equal(umbp_counters_ns(f->p, f->ns, &c0), 0);
  /* 300 threads, 16 at a time, each exits: its counts arrive, its line returns */
  enum { WAVES = 20, PER = 15 };
  for (int w = 0; w < WAVES; w++) {
    pthread_t th[PER];
    struct line_arg a[PER];
    for (int i = 0; i < PER; i++) {
      a[i] = (struct line_arg){.p = f->p, .hit = k, .miss = miss};
      assert_int_equal(pthread_create(&th[i], NULL, line_thread, &a[i]), 0);
    }
    for (int i = 0; i < PER; i++) {
      assert_int_equal(pthread_join(th[i], NULL), 0);
      assert_int_equal(a[i].rc, 0);
    }
  }
  assert_int_equal(umbp_counters_ns(f->p, f->ns, &c), 0);
  assert_int_equal(c.hits - c0.hits, (uint64_t)WAVES * PER * 100);
  assert_int_equal(c.misses - c0.misses, (uint64_t)WAVES * PER * 37);
  /* 63 threads hold lines at once beside this one; a 64th is refused */
  for (int round = 0; round < 2; round++) {
    enum { N = UMBP_MAX_THREADS - 1 };
    pthread_t th[N + 1];
    struct line_arg a[N + 1];
    pthread_barrier_t hold;
    pthread_barrier_init(&hold, NULL, N + 2);
    for (int i = 0; i < N + 1; i++) {
      a[i] = (struct line_arg){.p = f->p, .hit = k, .miss = miss, .hold = &hold, .rc = 1};
      assert_int_equal(pthread_create(&th[i], NULL, line_thread, &a[i]), 0);
    }
    /* every thread has made its calls once all N + 1 and we are at the barrier */
    pthread_barrier_wait(&hold);
    int ok = 0, refused = 0;
    for (int i = 0; i < N + 1; i++) {
      ok += a[i].rc == 0;
      refused += a[i].rc == -EUSERS;
    }
    assert_int_equal(ok, N);
    assert_int_equal(refused, 1);
    for (int i = 0; i < N + 1; i++) assert_int_equal(pthread_join(th[i], NULL), 0);
    pthread_barrier_destroy(&hold);
  }
  /* one thread, ten pools */
  enum { NP = 10 };
  umbp_pool *ps[NP];
  char names[NP][64];
  for (int i = 0; i < NP; i++) {
    small_pool(names[i], sizeof names[i], "ixp", &ps[i]);
    uint32_t ns;
    assert_int_equal(umbp_ns_register(ps[i], "m", &ns), 0);
    umbp_key pk = itu_key(ns, 5, 0);
    put(ps[i], &pk);
    assert_int_equal(umbp_contains(ps[i], &pk), 1);
  }
  for (int i = 0; i < NP; i++) {
    uint32_t ns;
    assert_int_equal(umbp_ns_register(ps[i], "m", &ns), 0);
    umbp_key pk = itu_key(ns, 5, 0);
    assert_int_equal(umbp_contains(ps[i], &pk), 1);
    umbp_counters_flush(ps[i]);
    assert_int_equal(umbp_counters_ns(ps[i], ns, &c), 0);
    assert_int_equal(c.hits, 2);
    umbp_pool_detach(ps[i]);
    umbp_pool_destroy(names[i]);
  }
}

/* The first entry of the thread lookup (thread_slot()) belongs to the first
 * thread that took a line of the handle. When that thread exits the entry is
 * cleared, so a later thread with the same thread pointer (glibc reuses a
 * joined thread's stack and TCB) claims a line of its own instead of
 * finding the exited thread's, which it does not hold. */
struct first_arg {
  umbp_pool *p;
  umbp_key miss;
  uintptr_t self;
  int ok; /* the call answered, and the first entry named this thread and its own line */
};

static void *first_entry_thread(void *arg) {
  struct first_arg *a = arg;
  struct umbp_index *ix = a->p->index;
  a->self = umbp_ix_self();
  int rc = umbp_contains(a->p, &a->miss);
  struct tl_slot *t = umbp_ix_thread_slot_find(ix);
  a->ok = rc == 0 && t && atomic_load(&t->owner) == a->self && atomic_load(&ix->first_self) == a->self &&
          ix->first_tl == t;
  return NULL;
}

static void test_first_entry_cleared(void **state) {
  (void)state;
  char name[64];
  umbp_pool *p;
  small_pool(name, sizeof name, "ixf", &p);
  uint32_t ns;
  assert_int_equal(umbp_ns_register(p, "m", &ns), 0);
  struct umbp_index *ix = p->index;
  assert_true(atomic_load(&ix->first_self) == 0); /* no thread has taken a line yet */
  uintptr_t seen[8];
  int reused = 0;
  for (int i = 0; i < 8; i++) {
    struct first_arg a = {.p = p, .miss = itu_key(ns, 900 + (unsigned)i, 0)};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, first_entry_thread, &a), 0);
    assert_int_equal(pthread_join(th, NULL), 0);
    assert_true(a.ok);
    /* its exit gave its line back and emptied the first entry */
    assert_true(atomic_load(&ix->first_self) == 0);
    seen[i] = a.self;
    for (int j = 0; j < i; j++)
      if (seen[j] == a.self) {
        reused++;
        break;
      }
  }
  fprintf(stderr, "# %d of 7 later threads had an earlier thread's pointer\n", reused);
  umbp_pool_detach(p);
  umbp_pool_destroy(name);
}

/* A process's read-write handles are listed for the thread-exit destructor
 * and fork() (threads.c); the 65th is refused with a message, not left off
 * the list (its threads' lines would leak). The fixture's handle is one. */
static void test_handle_limit(void **state) {
  struct fx *f = *state;
  enum { NP = 8, PER = 8 };
  char names[NP][64];
  umbp_pool *h[NP * PER];
  unsigned nh = 0;
  for (int i = 0; i < NP; i++) {
    small_pool(names[i], sizeof names[i], "ixh", &h[nh++]);
    for (int j = 1; j < PER; j++) {
      int rc = umbp_pool_attach(names[i], NULL, &h[nh]);
      if (nh == NP * PER - 1) {
        /* the fixture's + 63 here = 64: this one is the 65th */
        assert_int_equal(rc, -EMFILE);
        assert_non_null(strstr(umbp_last_error(), "64 read-write pool handles"));
      } else {
        assert_int_equal(rc, 0);
        nh++;
      }
    }
  }
  assert_int_equal(nh, NP * PER - 1);
  umbp_key k = itu_key(f->ns, 9, 0);
  put(f->p, &k);
  assert_int_equal(umbp_contains(f->p, &k), 1);
  /* one handle given back: an attach fits again */
  umbp_pool_detach(h[nh - 1]);
  assert_int_equal(umbp_pool_attach(names[NP - 1], NULL, &h[nh - 1]), 0);
  for (unsigned i = 0; i < nh; i++) umbp_pool_detach(h[i]);
  for (int i = 0; i < NP; i++) umbp_pool_destroy(names[i]);
}

/* The thread's slot cache (reserve.c): a slot umbp_remove() took out stays
 * with the thread, RESERVED, and its next reserve gets it back, the slot
 * removed last first; a thread keeps one slot per 8192 of the partition (2
 * here), and none after more removes than that without a reserve; --check
 * is clean meanwhile; lookups of the old key miss after the slot is reused. */
static int setup_fc(void **state) { return setup_n(state, 16384, 0); }
static void test_slot_cache(void **state) {
  struct fx *f = *state;
  const unsigned cap = f->p->index->fc_cap;
  assert_int_equal(cap, 2);
  umbp_slot_census c0, c;
  assert_int_equal(umbp_census(f->p, &c0), 0);
  uint32_t s[3];
  umbp_key k[3];
  for (unsigned i = 0; i < 3; i++) {
    k[i] = itu_key(f->ns, 500 + i, 0);
    s[i] = put(f->p, &k[i]);
  }
  /* two removes: both kept */
  for (unsigned i = 0; i < 2; i++) assert_int_equal(umbp_remove(f->p, &k[i]), 0);
  assert_int_equal(umbp_census(f->p, &c), 0);
  assert_int_equal(c.reserved, 2);
  assert_int_equal(c.published, 1);
  assert_int_equal(c.free_, c0.free_ - 3);
  census_ok(f->p);
  /* a third remove without a reserve between: everything back on the ring */
  assert_int_equal(umbp_remove(f->p, &k[2]), 0);
  assert_int_equal(umbp_census(f->p, &c), 0);
  assert_int_equal(c.reserved, 0);
  assert_int_equal(c.free_, c0.free_);
  for (unsigned i = 0; i < 3; i++) assert_int_equal(umbp_contains(f->p, &k[i]), 0);
  /* put, remove, reserve: the same slot every time */
  uint32_t a = put(f->p, &k[0]);
  for (unsigned i = 0; i < 4; i++) {
    assert_int_equal(umbp_remove(f->p, &k[i % 2]), 0);
    assert_int_equal(umbp_contains(f->p, &k[i % 2]), 0);
    assert_int_equal(put(f->p, &k[(i + 1) % 2]), a);
    uint32_t hit;
    assert_int_equal(umbp_lookup_pin(f->p, &k[(i + 1) % 2], &hit), 0);
    assert_int_equal(hit, a);
    assert_true(itu_check(umbp_slot_ptr(f->p, hit), umbp_slot_size(f->p), &k[(i + 1) % 2]));
    assert_int_equal(umbp_unpin(f->p, hit), 0);
  }
  /* k[0] is published in slot a; two more, then remove two: the next
   * reserves take them back, last removed first, a bulk reserve too */
  uint32_t b1 = put(f->p, &k[1]), b2 = put(f->p, &k[2]);
  assert_int_equal(umbp_remove(f->p, &k[1]), 0);
  assert_int_equal(umbp_remove(f->p, &k[2]), 0);
  uint32_t got[2];
  assert_int_equal(umbp_reserve_bulk(f->p, -1, f->ns, 2, got), 2);
  assert_int_equal(got[0], b2);
  assert_int_equal(got[1], b1);
  assert_int_equal(umbp_abort(f->p, got[0]), 0);
  assert_int_equal(umbp_abort(f->p, got[1]), 0);
  assert_int_equal(umbp_remove(f->p, &k[0]), 0);
  census_ok(f->p);
  assert_int_equal(umbp_census(f->p, &c), 0);
  assert_int_equal(c.reserved, 1); /* a, kept */
  assert_int_equal(umbp_reserve(f->p, -1, f->ns, &got[0]), 0);
  assert_int_equal(got[0], a);
  assert_int_equal(umbp_abort(f->p, got[0]), 0);
  (void)s;
}

/* A kept slot whose state moved is not handed out: a caller that aborts a
 * slot number it was never given frees the kept slot; another thread of the
 * process reserves it from the ring; the keeping thread must not return it
 * too. */
struct fc_grab {
  struct fx *f;
  unsigned n;
  uint32_t *slots;
  int rc;
};
static void *fc_grab_thread(void *arg) {
  struct fc_grab *g = arg;
  g->rc = umbp_reserve_bulk(g->f->p, -1, g->f->ns, g->n, g->slots);
  return NULL;
}
static void test_slot_cache_stale(void **state) {
  struct fx *f = *state;
  umbp_key k = itu_key(f->ns, 600, 0);
  uint32_t s = put(f->p, &k);
  assert_int_equal(umbp_remove(f->p, &k), 0); /* kept */
  assert_int_equal(umbp_abort(f->p, s), 0);   /* the misuse: now FREE, on the ring */
  umbp_slot_census c;
  assert_int_equal(umbp_census(f->p, &c), 0);
  struct fc_grab g = {f, (unsigned)c.free_, calloc(c.free_, sizeof(uint32_t)), 0};
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, fc_grab_thread, &g), 0);
  assert_int_equal(pthread_join(th, NULL), 0);
  assert_int_equal(g.rc, (int)c.free_); /* every free slot, s among them */
  bool has_s = false;
  for (unsigned i = 0; i < g.n; i++) has_s |= g.slots[i] == s;
  assert_true(has_s);
  uint32_t other = UINT32_MAX;
  int rc = umbp_reserve(f->p, -1, f->ns, &other);
  assert_int_equal(rc, -ENOSPC);
  abort_all(f->p, g.slots, g.n);
  census_ok(f->p);
}

/* The same misuse, then the keeping thread exits: its give-back must leave
 * the slot to the thread of ours that reserved it since. */
struct fc_keeper {
  struct fx *f;
  uint32_t slot;
  pthread_barrier_t kept, go;
};
static void *fc_keeper_thread(void *arg) {
  struct fc_keeper *kp = arg;
  umbp_key k = itu_key(kp->f->ns, 620, 0);
  kp->slot = put_nt(kp->f->p, &k);
  if (kp->slot != UINT32_MAX && umbp_remove(kp->f->p, &k) != 0) kp->slot = UINT32_MAX;
  pthread_barrier_wait(&kp->kept);
  pthread_barrier_wait(&kp->go); /* then exit: line_release() gives back */
  return NULL;
}
static void test_slot_cache_stale_give_back(void **state) {
  struct fx *f = *state;
  struct fc_keeper kp = {.f = f, .slot = UINT32_MAX};
  assert_int_equal(pthread_barrier_init(&kp.kept, NULL, 2), 0);
  assert_int_equal(pthread_barrier_init(&kp.go, NULL, 2), 0);
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, fc_keeper_thread, &kp), 0);
  pthread_barrier_wait(&kp.kept);
  assert_int_not_equal(kp.slot, UINT32_MAX);
  assert_int_equal(umbp_abort(f->p, kp.slot), 0); /* the misuse: FREE, on the ring */
  umbp_slot_census c;
  assert_int_equal(umbp_census(f->p, &c), 0);
  uint32_t *all = calloc(c.free_, sizeof *all);
  assert_int_equal(umbp_reserve_bulk(f->p, -1, f->ns, (unsigned)c.free_, all), (int)c.free_);
  pthread_barrier_wait(&kp.go);
  assert_int_equal(pthread_join(th, NULL), 0);
  /* every slot this thread reserved is still RESERVED, the keeper's old slot among them */
  umbp_slot_census after;
  assert_int_equal(umbp_census(f->p, &after), 0);
  assert_int_equal(after.reserved, c.free_);
  assert_int_equal(after.free_, 0);
  struct umbp_index *ix = f->p->index;
  uint64_t w = atomic_load(&ix->meta[kp.slot].state);
  assert_int_equal(ST_STATE(w), UMBP_SLOT_RESERVED);
  abort_all(f->p, all, c.free_);
  pthread_barrier_destroy(&kp.kept);
  pthread_barrier_destroy(&kp.go);
  census_ok(f->p);
}

/* A reserve that finds no free slot and nothing to evict takes the
 * thread's kept slot even though its namespace is over quota (where a
 * reserve otherwise evicts the namespace's own blocks first). */
static void test_slot_cache_last_resort(void **state) {
  struct fx *f = *state;
  umbp_key ka = itu_key(f->ns, 610, 0), kb = itu_key(f->ns, 611, 0), kc = itu_key(f->ns, 612, 0);
  put(f->p, &ka);
  put(f->p, &kb);
  uint32_t pa, pb;
  assert_int_equal(umbp_lookup_pin(f->p, &ka, &pa), 0);
  assert_int_equal(umbp_lookup_pin(f->p, &kb, &pb), 0);
  uint32_t sc = put(f->p, &kc);
  assert_int_equal(umbp_remove(f->p, &kc), 0); /* kept */
  assert_int_equal(umbp_ns_set_quota(f->p, f->ns, umbp_slot_size(f->p)), 0); /* 2 blocks: over */
  umbp_slot_census c;
  assert_int_equal(umbp_census(f->p, &c), 0);
  struct fc_grab g = {f, (unsigned)c.free_, calloc(c.free_, sizeof(uint32_t)), 0};
  pthread_t th;
  assert_int_equal(pthread_create(&th, NULL, fc_grab_thread, &g), 0);
  assert_int_equal(pthread_join(th, NULL), 0);
  assert_int_equal(g.rc, (int)c.free_);
  uint32_t got = UINT32_MAX;
  assert_int_equal(umbp_reserve(f->p, -1, f->ns, &got), 0);
  assert_int_equal(got, sc);
  assert_int_equal(umbp_abort(f->p, got), 0);
  abort_all(f->p, g.slots, g.n);
  assert_int_equal(umbp_unpin(f->p, pa), 0);
  assert_int_equal(umbp_unpin(f->p, pb), 0);
  assert_int_equal(umbp_ns_set_quota(f->p, f->ns, 0), 0);
  census_ok(f->p);
}

/* Kept slots go back on the ring when their thread exits, when the handle
 * is detached, and when their process dies (its reaper frees them). */
static void *fc_thread(void *arg) {
  struct fx *f = arg;
  for (unsigned i = 0; i < 5; i++) {
    umbp_key k = itu_key(f->ns, 700 + i, 0);
    if (put_nt(f->p, &k) == UINT32_MAX || umbp_remove(f->p, &k) != 0) return (void *)-1;
  }
  /* one slot kept, reused by each put (checked by the caller) */
  umbp_slot_census c;
  if (umbp_census(f->p, &c) != 0) return (void *)-1;
  return (void *)(uintptr_t)c.reserved;
}

static void test_slot_cache_given_back(void **state) {
  struct fx *f = *state;
  umbp_slot_census c0, c;
  assert_int_equal(umbp_census(f->p, &c0), 0);
  /* thread exit */
  pthread_t th;
  void *kept;
  assert_int_equal(pthread_create(&th, NULL, fc_thread, f), 0);
  assert_int_equal(pthread_join(th, &kept), 0);
  assert_int_equal((uintptr_t)kept, 1);
  assert_int_equal(umbp_census(f->p, &c), 0);
  assert_int_equal(c.reserved, 0);
  assert_int_equal(c.free_, c0.free_);
  census_ok(f->p);
  /* detach */
  umbp_pool *q;
  assert_int_equal(umbp_pool_attach(f->name, NULL, &q), 0);
  for (unsigned i = 0; i < 2; i++) {
    umbp_key k = itu_key(f->ns, 800 + i, 0);
    put(q, &k);
  }
  for (unsigned i = 0; i < 2; i++) {
    umbp_key k = itu_key(f->ns, 800 + i, 0);
    assert_int_equal(umbp_remove(q, &k), 0);
  }
  assert_int_equal(umbp_census(f->p, &c), 0);
  assert_int_equal(c.reserved, 2);
  umbp_pool_detach(q);
  assert_int_equal(umbp_census(f->p, &c), 0);
  assert_int_equal(c.reserved, 0);
  assert_int_equal(c.free_, c0.free_);
  census_ok(f->p);
  /* a process killed while it keeps slots */
  int pfd[2];
  assert_int_equal(pipe(pfd), 0);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    /* never outlive a parent that failed before its kill: exits with it, and
     * at most 60 s while a failed parent runs its other tests */
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() == 1) _exit(3);
    alarm(60);
    umbp_pool *cq;
    char ok = 0;
    if (umbp_pool_attach(f->name, NULL, &cq) == 0) {
      ok = 1;
      for (unsigned i = 0; i < 2 && ok; i++) {
        umbp_key k = itu_key(f->ns, 850 + i, 0);
        uint32_t cs;
        ok = umbp_reserve(cq, -1, f->ns, &cs) == 0 && umbp_publish(cq, cs, &k) == 0;
      }
      for (unsigned i = 0; i < 2 && ok; i++) {
        umbp_key k = itu_key(f->ns, 850 + i, 0);
        ok = umbp_remove(cq, &k) == 0;
      }
    }
    if (write(pfd[1], &ok, 1) != 1) _exit(3);
    pause();
    _exit(0);
  }
  close(pfd[1]);
  char ok = 0;
  assert_int_equal(read(pfd[0], &ok, 1), 1);
  close(pfd[0]);
  assert_int_equal(ok, 1);
  assert_int_equal(umbp_census(f->p, &c), 0);
  assert_int_equal(c.reserved, 2);
  kill(pid, SIGKILL);
  int st;
  assert_int_equal(waitpid(pid, &st, 0), pid);
  assert_true(umbp_pool_reap(f->p) >= 1);
  assert_int_equal(umbp_census(f->p, &c), 0);
  assert_int_equal(c.reserved, 0);
  assert_int_equal(c.free_, c0.free_);
  census_ok(f->p);
}

/* A pool under 8192 slots a partition keeps nothing: a removed slot is
 * free at once for every process. */
static void test_slot_cache_off_in_small_pools(void **state) {
  struct fx *f = *state;
  umbp_slot_census c0, c;
  umbp_key k = itu_key(f->ns, 42, 0);
  put(f->p, &k);
  assert_int_equal(umbp_census(f->p, &c0), 0);
  assert_int_equal(umbp_remove(f->p, &k), 0);
  assert_int_equal(umbp_census(f->p, &c), 0);
  assert_int_equal(c.reserved, 0);
  assert_int_equal(c.free_, c0.free_ + 1);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_namespaces, setup, teardown),
      cmocka_unit_test_setup_teardown(test_roundtrip, setup, teardown),
      cmocka_unit_test_setup_teardown(test_detach_releases_pins, setup, teardown),
      cmocka_unit_test_setup_teardown(test_detach_releases_reservations, setup, teardown),
      cmocka_unit_test_setup_teardown(test_slot_cache, setup_fc, teardown),
      cmocka_unit_test_setup_teardown(test_slot_cache_given_back, setup_fc, teardown),
      cmocka_unit_test_setup_teardown(test_slot_cache_stale, setup_fc, teardown),
      cmocka_unit_test_setup_teardown(test_slot_cache_stale_give_back, setup_fc, teardown),
      cmocka_unit_test_setup_teardown(test_slot_cache_last_resort, setup_fc, teardown),
      cmocka_unit_test_setup_teardown(test_slot_cache_off_in_small_pools, setup, teardown),
      cmocka_unit_test_setup_teardown(test_reclaim_tidies, setup, teardown),
      cmocka_unit_test_setup_teardown(test_ring_header_scribbled, setup, teardown),
      cmocka_unit_test_setup_teardown(test_check_registry_state, setup, teardown),
      cmocka_unit_test_setup_teardown(test_check_ring_headers, setup, teardown),
      cmocka_unit_test_setup_teardown(test_check_ring_foreign_id, setup, teardown),
      cmocka_unit_test_setup_teardown(test_check_way_outside, setup, teardown),
      cmocka_unit_test_setup_teardown(test_check_way_signature, setup, teardown),
      cmocka_unit_test_setup_teardown(test_check_way_distance, setup, teardown),
      cmocka_unit_test_setup_teardown(test_check_owner_of_unowned, setup, teardown),
      cmocka_unit_test_setup_teardown(test_check_owner_out_of_range, setup, teardown),
      cmocka_unit_test_setup_teardown(test_check_ns_unregistered, setup, teardown),
      cmocka_unit_test_setup_teardown(test_check_partition_count, setup, teardown),
      cmocka_unit_test_setup_teardown(test_check_header_counts, setup, teardown),
      cmocka_unit_test_setup_teardown(test_fingerprint_covers_hash, setup, teardown),
      cmocka_unit_test_setup_teardown(test_key_compare_exact, setup, teardown),
      cmocka_unit_test_setup_teardown(test_key_fields_distinct, setup, teardown),
      cmocka_unit_test_setup_teardown(test_signature_split, setup, teardown),
      cmocka_unit_test_setup_teardown(test_bucket_all_ways, setup, teardown),
      cmocka_unit_test_setup_teardown(test_errors, setup, teardown),
      cmocka_unit_test_setup_teardown(test_contains_null_key, setup, teardown),
      cmocka_unit_test_setup_teardown(test_evict_bad_partition, setup, teardown),
      cmocka_unit_test_setup_teardown(test_ns_register_keeps_last_error, setup, teardown),
      cmocka_unit_test_setup_teardown(test_ns_set_quota_null_pool, setup, teardown),
      cmocka_unit_test_setup_teardown(test_index_stats_empty_histogram, setup, teardown),
      cmocka_unit_test_setup_teardown(test_census_part, setup, teardown),
      cmocka_unit_test_setup_teardown(test_first_writer_wins, setup, teardown),
      cmocka_unit_test_setup_teardown(test_prefix_and_bulk, setup, teardown),
      cmocka_unit_test_setup_teardown(test_bulk_counters, setup, teardown),
      cmocka_unit_test_setup_teardown(test_remove_and_events, setup, teardown),
      cmocka_unit_test_setup_teardown(test_clear_ns, setup, teardown),
      cmocka_unit_test_setup_teardown(test_eviction_clock_and_pins, setup, teardown),
      cmocka_unit_test_setup_teardown(test_full_pool_churn, setup_awkward, teardown),
      cmocka_unit_test_setup_teardown(test_structured_keys, setup_awkward, teardown),
      cmocka_unit_test(test_key_hash_fixed),
      cmocka_unit_test_setup_teardown(test_event_ring_drops_oldest, setup_ev16, teardown),
      cmocka_unit_test_setup_teardown(test_event_ring_stopped_drainer, setup_ev16, teardown),
      cmocka_unit_test_setup_teardown(test_events_recorded_after_first_drain, setup_ev16, teardown),
      cmocka_unit_test_setup_teardown(test_events_pool_of_older_build, setup_ev16, teardown),
      cmocka_unit_test_setup_teardown(test_unlink_scribbled_way, setup, teardown),
      cmocka_unit_test_setup_teardown(test_quota, setup, teardown),
      cmocka_unit_test_setup_teardown(test_counters, setup, teardown),
      cmocka_unit_test_setup_teardown(test_reuse_while_reader_stopped, setup, teardown),
      cmocka_unit_test_setup_teardown(test_partition_table_rewritten, setup, teardown),
      cmocka_unit_test_setup_teardown(test_background_evictor, setup, teardown),
      cmocka_unit_test_setup_teardown(test_threads, setup, teardown),
      cmocka_unit_test_setup_teardown(test_thread_lines, setup, teardown),
      cmocka_unit_test(test_first_entry_cleared),
      cmocka_unit_test_setup_teardown(test_handle_limit, setup, teardown),
      cmocka_unit_test_setup_teardown(test_admin_bucket_region, setup, teardown),
      cmocka_unit_test_setup_teardown(test_error_messages_belong_to_the_call, setup, teardown),
  };
  return cmocka_run_group_tests_name("index", tests, NULL, NULL);
}
