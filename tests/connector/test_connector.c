/* SPDX-License-Identifier: Apache-2.0 */
/* Unit tests of the connector core: key codec, namespace derivation, the
 * matched-token rule against a real pool, KV events and stats. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"
#include "umbp/connector.h"
#include "umbp/index.h"
#include "umbp/pool.h"

static umbp_key mk_key(uint32_t ns, uint16_t tp, uint16_t group, uint8_t fill) {
  umbp_key k;
  memset(&k, 0, sizeof(k));
  k.ns = ns;
  k.tp_rank = tp;
  k.pcp_rank = 3;
  k.dcp_rank = 4;
  k.pp_rank = 0;
  k.group = group;
  k.hash_len = 32;
  memset(k.hash, fill, 32);
  return k;
}

static void test_codec_roundtrip(void **state) {
  (void)state;
  umbp_key k = mk_key(0xa1b2c3d4u, 7, 2, 0x5a);
  k.pp_rank = 0x0105; /* mk_key's 0 would round-trip a pp_rank the codec dropped */
  k.hash[0] = 1;
  k.hash[31] = 0xff;
  uint8_t buf[UMBP_CONN_KEY_MAX];
  int n = umbp_conn_key_encode(&k, buf, sizeof(buf));
  assert_int_equal(n, UMBP_CONN_KEY_HDR + 32);
  assert_int_equal(buf[0], 0xd4); /* little endian, independent of host */
  assert_int_equal(buf[3], 0xa1);
  /* the header as connector.h spells it, byte by byte: ns(4) tp(2) pcp(2)
   * dcp(2) pp(2) group(2) hash_len(1), each little endian; a round trip alone
   * passes any layout that encode and decode agree on */
  static const uint8_t hdr[UMBP_CONN_KEY_HDR] = {0xd4, 0xc3, 0xb2, 0xa1, 7, 0, 3, 0, 4, 0, 0x05, 0x01, 2, 0, 32};
  assert_memory_equal(buf, hdr, UMBP_CONN_KEY_HDR);
  assert_memory_equal(buf + UMBP_CONN_KEY_HDR, k.hash, 32);
  umbp_key d;
  assert_int_equal(umbp_conn_key_decode(buf, (size_t)n, &d), n);
  assert_int_equal(d.ns, k.ns);
  assert_int_equal(d.tp_rank, 7);
  assert_int_equal(d.pcp_rank, 3);
  assert_int_equal(d.dcp_rank, 4);
  assert_int_equal(d.pp_rank, 0x0105);
  assert_int_equal(d.group, 2);
  assert_int_equal(d.hash_len, 32);
  assert_memory_equal(d.hash, k.hash, 32);
  /* short hash, short buffer, truncated input, bad length */
  k.hash_len = 8;
  assert_int_equal(umbp_conn_key_encode(&k, buf, UMBP_CONN_KEY_HDR + 7), -ENOBUFS);
  assert_int_equal(umbp_conn_key_encode(&k, buf, sizeof(buf)), UMBP_CONN_KEY_HDR + 8);
  assert_int_equal(umbp_conn_key_decode(buf, UMBP_CONN_KEY_HDR + 7, &d), -EBADMSG);
  buf[14] = 33;
  assert_int_equal(umbp_conn_key_decode(buf, sizeof(buf), &d), -EBADMSG);
  k.hash_len = 0;
  assert_int_equal(umbp_conn_key_encode(&k, buf, sizeof(buf)), -EINVAL);
}

/* A NULL argument is named as such: it was reported as the nearest other
 * error ("hash_len must be 1..32", "0 bytes is shorter than a key header"
 * with -EBADMSG, "count must be positive (got 1)", "op 0 is neither load nor
 * store"), sending the caller after a value that was right. */
static void test_null_arguments_named(void **state) {
  (void)state;
  umbp_key k = mk_key(1, 0, 0, 0x11), d;
  uint8_t buf[UMBP_CONN_KEY_MAX];
  assert_int_equal(umbp_conn_key_encode(&k, NULL, sizeof(buf)), -EINVAL);
  assert_non_null(strstr(umbp_last_error(), "key and buf are required"));
  assert_int_equal(umbp_conn_key_encode(NULL, buf, sizeof(buf)), -EINVAL);
  assert_non_null(strstr(umbp_last_error(), "key and buf are required"));
  int n = umbp_conn_key_encode(&k, buf, sizeof(buf));
  assert_true(n > 0);
  assert_int_equal(umbp_conn_key_decode(buf, (size_t)n, NULL), -EINVAL);
  assert_non_null(strstr(umbp_last_error(), "buf and ret_key are required"));
  assert_int_equal(umbp_conn_key_decode(NULL, (size_t)n, &d), -EINVAL);
  assert_int_equal(umbp_conn_key_decode(buf, 3, &d), -EBADMSG); /* truncated input is still -EBADMSG */
  assert_non_null(strstr(umbp_last_error(), "shorter than a key header"));
  assert_int_equal(umbp_conn_events_increment_workers(NULL, 1), -EINVAL);
  assert_non_null(strstr(umbp_last_error(), "ev is NULL"));
  assert_int_equal(umbp_conn_stats_add(NULL, UMBP_CONN_LOAD, 1, 1, 0, 4096), -EINVAL);
  assert_non_null(strstr(umbp_last_error(), "st is NULL"));
}

static void test_keys_build_fold(void **state) {
  (void)state;
  umbp_key t = mk_key(5, 1, 0, 0);
  uint8_t h[3 * 40];
  for (size_t i = 0; i < sizeof(h); i++) h[i] = (uint8_t)(i * 7);
  umbp_key k[3];
  assert_int_equal(umbp_conn_keys_build(&t, 3, h, 16, k), 0);
  assert_int_equal(k[1].hash_len, 16);
  assert_memory_equal(k[1].hash, h + 16, 16);
  assert_int_equal(k[2].tp_rank, 1);
  /* longer hashes fold to 32 bytes, deterministically and distinctly */
  umbp_key a[3], b[3];
  assert_int_equal(umbp_conn_keys_build(&t, 3, h, 40, a), 0);
  assert_int_equal(umbp_conn_keys_build(&t, 3, h, 40, b), 0);
  assert_int_equal(a[0].hash_len, 32);
  assert_memory_equal(a[2].hash, b[2].hash, 32);
  assert_memory_not_equal(a[0].hash, a[1].hash, 32);
  /* Every byte counts, the tail past 32 too: two 40-byte hashes that share
   * their first 32 bytes (a hash whose first 32 bytes were kept and the rest
   * dropped made them one key, and a[0] vs a[1] above differ everywhere). */
  uint8_t tail[2 * 40];
  memcpy(tail, h, 40);
  memcpy(tail + 40, h, 40);
  tail[40 + 39] ^= 1;
  assert_int_equal(umbp_conn_keys_build(&t, 2, tail, 40, a), 0);
  assert_memory_not_equal(a[0].hash, a[1].hash, 32);
  /* Stable across builds (connector.h): keys that a daemon's pool keeps
   * outlive the engine that wrote them, and an engine of a later build must
   * find them. These bytes were recorded from this build; a change of the fold
   * is a change of every stored key and has to be made on purpose. */
  static const uint8_t fold_h0[32] = {0x85, 0x28, 0x16, 0x43, 0xd0, 0x32, 0x63, 0x15, 0x2a, 0xec, 0x6f,
                                      0xc9, 0x21, 0x5b, 0x51, 0xfa, 0xc7, 0x2d, 0x33, 0x6c, 0x04, 0x00,
                                      0x01, 0xbd, 0x8c, 0x07, 0x20, 0x49, 0x3a, 0x58, 0x40, 0x56};
  assert_int_equal(umbp_conn_keys_build(&t, 1, h, 40, a), 0);
  assert_memory_equal(a[0].hash, fold_h0, 32);
}

static void ns_base(umbp_conn_ns_params *p) {
  memset(p, 0, sizeof(*p));
  p->model = "/models/tiny-llama";
  p->revision = "main";
  p->block_size = 16;
  p->cache_layout = "NHD";
  p->dtypes[0] = "bfloat16";
  p->n_groups = 1;
  p->tp_size = 2;
}

static void test_ns_derive(void **state) {
  (void)state;
  umbp_conn_ns_params p;
  char a[160], b[160];
  ns_base(&p);
  int n = umbp_conn_ns_derive(&p, a, sizeof(a));
  assert_int_equal(n, 37);
  assert_memory_equal(a, "vllm-", 5);
  assert_int_equal(umbp_conn_ns_derive(&p, b, sizeof(b)), n);
  assert_string_equal(a, b); /* deterministic */
  /* and stable across builds: engines of two umbp versions sharing a daemon's
   * pool (or one engine restarted on an upgrade) must derive the same name for
   * the same model, or the stored blocks are never found again. Recorded from
   * this build; a new serialisation bumps its "v" field and this name. */
  assert_string_equal(a, "vllm-a6263eabfec4513eff085670bb1b5329");
  /* every field changes it */
  const char *alts[] = {"block", "layout", "dtype", "tp", "pp", "pcp", "dcp", "draft", "model", "rev", "groups"};
  for (unsigned i = 0; i < sizeof(alts) / sizeof(alts[0]); i++) {
    ns_base(&p);
    switch (i) {
      case 0: p.block_size = 32; break;
      case 1: p.cache_layout = "HND"; break;
      case 2: p.dtypes[0] = "float16"; break;
      case 3: p.tp_size = 4; break;
      case 4: p.pp_size = 2; break;
      case 5: p.pcp_size = 2; break;
      case 6: p.dcp_size = 2; break;
      case 7: p.draft_model = "eagle"; break;
      case 8: p.model = "/models/other"; break;
      case 9: p.revision = "v2"; break;
      case 10: p.dtypes[1] = "bfloat16"; p.n_groups = 2; break;
    }
    assert_true(umbp_conn_ns_derive(&p, b, sizeof(b)) > 0);
    assert_string_not_equal(a, b);
  }
  /* tp_size 0 means 1 and equals 1 */
  ns_base(&p);
  p.tp_size = 1;
  umbp_conn_ns_derive(&p, a, sizeof(a));
  p.tp_size = 0;
  umbp_conn_ns_derive(&p, b, sizeof(b));
  assert_string_equal(a, b);
  /* explicit namespace wins; bad ones are refused */
  p.key_namespace = "shared-llama";
  assert_int_equal(umbp_conn_ns_derive(&p, a, sizeof(a)), 12);
  assert_string_equal(a, "shared-llama");
  p.key_namespace = "has space";
  assert_int_equal(umbp_conn_ns_derive(&p, a, sizeof(a)), -EINVAL);
  /* other white space and control characters too (\r, \v, \f, ESC, DEL passed) */
  const char *ctl[] = {"cr\rx", "vt\vx", "ff\fx", "esc\033x", "del\177x"};
  for (unsigned i = 0; i < sizeof ctl / sizeof *ctl; i++) {
    p.key_namespace = ctl[i];
    assert_int_equal(umbp_conn_ns_derive(&p, a, sizeof(a)), -EINVAL);
    assert_non_null(strstr(umbp_last_error(), "control character"));
  }
  p.key_namespace = NULL;
  assert_int_equal(umbp_conn_ns_derive(&p, a, 10), -ENOBUFS);
  p.model = NULL;
  assert_int_equal(umbp_conn_ns_derive(&p, a, sizeof(a)), -EINVAL);
}

static void test_matched_rule(void **state) {
  (void)state;
  uint32_t hits[3] = {4, 4, 4}, blocks = 99;
  /* 4 blocks of 16 held everywhere, prompt of 80 tokens: 4 blocks usable */
  assert_int_equal(umbp_conn_matched_tokens(hits, 3, 16, 80, 0, &blocks), 64);
  assert_int_equal(blocks, 4);
  /* prompt of exactly 64 tokens: the last token is computed, so only 3 blocks */
  assert_int_equal(umbp_conn_matched_tokens(hits, 3, 16, 64, 0, &blocks), 48);
  assert_int_equal(blocks, 3);
  /* a block missing on one rank shortens the hit */
  hits[1] = 2;
  assert_int_equal(umbp_conn_matched_tokens(hits, 3, 16, 80, 0, &blocks), 32);
  /* GPU prefix cache holds 16 tokens: they are not loaded again */
  assert_int_equal(umbp_conn_matched_tokens(hits, 3, 16, 80, 16, NULL), 16);
  /* GPU holds more than the pool: nothing to load */
  assert_int_equal(umbp_conn_matched_tokens(hits, 3, 16, 80, 48, NULL), 0);
  assert_int_equal(umbp_conn_matched_tokens(hits, 0, 16, 80, 0, NULL), -EINVAL);
  assert_int_equal(umbp_conn_matched_tokens(hits, 3, 0, 80, 0, NULL), -EINVAL);
  assert_int_equal(umbp_conn_matched_tokens(hits, 3, 16, 0, 0, NULL), 0);
}

/* A count of 2^63 tokens or more came back as a negative int64, which a
 * caller reads as an error code; it saturates at INT64_MAX now. */
static void test_matched_rule_saturates(void **state) {
  (void)state;
  uint32_t hits[1] = {UINT32_MAX}, blocks = 0;
  int64_t r = umbp_conn_matched_tokens(hits, 1, UINT32_MAX, UINT64_MAX, 0, &blocks);
  assert_true(r >= 0);
  assert_true(r == INT64_MAX);
  assert_int_equal(blocks, UINT32_MAX);
  assert_int_equal(umbp_conn_matched_tokens(hits, 1, 16, 1000, 0, &blocks), 62 * 16);
}

static void test_probe_matched_pool(void **state) {
  (void)state;
  const char *name = tu_name("conn");
  umbp_pool_params pp;
  umbp_pool_params_init(&pp);
  pp.slot_size = 4096;
  pp.capacity = 64 * 4096;
  pp.no_prefault = true;
  pp.n_numa_nodes = 0;
  pp.mempolicy = UMBP_MPOL_NONE;
  umbp_pool *pool;
  assert_int_equal(umbp_pool_create(name, &pp, &pool), 0);
  uint32_t ns;
  assert_int_equal(umbp_ns_register(pool, "test-ns", &ns), 0);
  enum { NB = 6, RANKS = 2 };
  uint8_t hashes[NB * 32];
  for (unsigned i = 0; i < sizeof(hashes); i++) hashes[i] = (uint8_t)(i / 32 + 1);
  umbp_key ranks[RANKS];
  for (unsigned r = 0; r < RANKS; r++) ranks[r] = mk_key(ns, (uint16_t)r, 0, 0);
  /* rank 0 holds blocks 0..4, rank 1 holds 0..1 and 3..5 (block 2 missing) */
  for (unsigned r = 0; r < RANKS; r++) {
    umbp_key keys[NB];
    assert_int_equal(umbp_conn_keys_build(&ranks[r], NB, hashes, 32, keys), 0);
    for (unsigned b = 0; b < NB; b++) {
      if ((r == 0 && b == 5) || (r == 1 && b == 2)) continue;
      uint32_t slot;
      assert_int_equal(umbp_reserve(pool, -1, ns, &slot), 0);
      memset(umbp_slot_ptr(pool, slot), (int)b, 64);
      assert_int_equal(umbp_publish(pool, slot, &keys[b]), 0);
    }
  }
  uint32_t blocks = 0;
  /* both ranks: run of 2 (rank 1 misses block 2) */
  assert_int_equal(umbp_conn_probe_matched(pool, ranks, RANKS, hashes, 32, NB, 16, 200, 0, &blocks), 32);
  assert_int_equal(blocks, 2);
  /* rank 0 alone: 5 blocks, a prefix hole stops it even though block 5 may exist elsewhere */
  assert_int_equal(umbp_conn_probe_matched(pool, ranks, 1, hashes, 32, NB, 16, 200, 0, &blocks), 80);
  /* last token always computed: prompt of 48 tokens allows 2 blocks */
  assert_int_equal(umbp_conn_probe_matched(pool, ranks, 1, hashes, 32, NB, 16, 48, 0, &blocks), 32);
  /* GPU prefix cache already has 32 tokens */
  assert_int_equal(umbp_conn_probe_matched(pool, ranks, 1, hashes, 32, NB, 16, 200, 32, &blocks), 48);
  /* an unknown namespace is a miss, not an error */
  umbp_key other = mk_key(ns + 77, 0, 0, 0);
  assert_int_equal(umbp_conn_probe_matched(pool, &other, 1, hashes, 32, NB, 16, 200, 0, &blocks), 0);
  assert_int_equal(blocks, 0);
  umbp_pool_detach(pool);
  assert_int_equal(umbp_pool_destroy(name), 0);
}

static umbp_conn_event ev(int type, uint8_t fill, uint64_t tag) {
  umbp_conn_event e;
  memset(&e, 0, sizeof(e));
  e.type = type;
  e.hash_len = 8;
  memset(e.hash, fill, 8);
  e.tag = tag;
  return e;
}

static void test_events(void **state) {
  (void)state;
  umbp_conn_events *E;
  assert_int_equal(umbp_conn_events_create(&E), 0);
  assert_int_equal(umbp_conn_events_workers(E), 1);
  /* Popping a container that never held an event (its array is still NULL):
   * 0, and no memmove of NULL (UBSan halted here). */
  umbp_conn_event none[2];
  assert_int_equal(umbp_conn_events_pop_common(E, none, 2), 0);
  /* two workers report the same store in one step: merged */
  umbp_conn_event w0[2] = {ev(UMBP_CONN_EV_STORED, 1, 0), ev(UMBP_CONN_EV_STORED, 2, 0)};
  umbp_conn_event w1[3] = {ev(UMBP_CONN_EV_STORED, 2, 0), ev(UMBP_CONN_EV_STORED, 1, 0),
                           ev(UMBP_CONN_EV_REMOVED, 1, 0)};
  assert_int_equal(umbp_conn_events_add(E, w0, 2), 2);
  assert_int_equal(umbp_conn_events_add(E, w1, 3), 1);
  /* duplicates inside one batch merge too */
  umbp_conn_event dup[2] = {ev(UMBP_CONN_EV_STORED, 9, 0), ev(UMBP_CONN_EV_STORED, 9, 0)};
  assert_int_equal(umbp_conn_events_add(E, dup, 2), 1);
  /* tag and group take part in equality */
  umbp_conn_event t = ev(UMBP_CONN_EV_STORED, 1, 5);
  assert_int_equal(umbp_conn_events_add(E, &t, 1), 1);
  t.tag = 0;
  t.group = 1;
  assert_int_equal(umbp_conn_events_add(E, &t, 1), 1);
  assert_int_equal(umbp_conn_events_count(E), 6);
  umbp_conn_event out[16];
  assert_int_equal(umbp_conn_events_get(E, out, 16), 6);
  assert_int_equal(out[0].hash[0], 1);
  assert_int_equal(out[1].hash[0], 2);
  assert_int_equal(out[2].type, UMBP_CONN_EV_REMOVED);
  /* a later step's repeat is kept by append */
  assert_int_equal(umbp_conn_events_append(E, w0, 2), 2);
  assert_int_equal(umbp_conn_events_count(E), 8);
  /* workers */
  assert_int_equal(umbp_conn_events_increment_workers(E, 0), -EINVAL);
  assert_int_equal(umbp_conn_events_increment_workers(E, -3), -EINVAL);
  assert_int_equal(umbp_conn_events_workers(E), 1);
  assert_int_equal(umbp_conn_events_increment_workers(E, 2), 0);
  assert_int_equal(umbp_conn_events_workers(E), 3);
  umbp_conn_events_aggregate(E);
  assert_int_equal(umbp_conn_events_workers(E), 1);
  assert_int_equal(umbp_conn_events_count(E), 8);
  /* pop: partial then the rest, order kept */
  assert_int_equal(umbp_conn_events_pop_common(E, out, 3), 3);
  assert_int_equal(out[2].type, UMBP_CONN_EV_REMOVED);
  assert_int_equal(umbp_conn_events_pop_common(E, out, 16), 5);
  assert_int_equal(out[3].hash[0], 1);
  assert_int_equal(out[4].hash[0], 2);
  assert_int_equal(umbp_conn_events_count(E), 0);
  /* after pop the same events are new again */
  assert_int_equal(umbp_conn_events_add(E, w0, 2), 2);
  umbp_conn_events_increment_workers(E, 1);
  umbp_conn_events_clear(E);
  assert_int_equal(umbp_conn_events_count(E), 0);
  assert_int_equal(umbp_conn_events_workers(E), 1);
  umbp_conn_event bad = ev(UMBP_CONN_EV_STORED, 1, 0);
  bad.hash_len = 40;
  assert_int_equal(umbp_conn_events_add(E, &bad, 1), -EINVAL);
  assert_int_equal(umbp_conn_events_append(E, &bad, 1), -EINVAL);
  /* many events: the hash set grows */
  umbp_conn_event many[300];
  for (unsigned i = 0; i < 300; i++) {
    many[i] = ev(UMBP_CONN_EV_STORED, 0, i % 150);
  }
  assert_int_equal(umbp_conn_events_add(E, many, 300), 150);
  assert_int_equal(umbp_conn_events_add(E, many, 300), 0);
  umbp_conn_events_free(E);
  umbp_conn_events_free(NULL);
}

static void test_stats(void **state) {
  (void)state;
  umbp_conn_stats *st;
  assert_int_equal(umbp_conn_stats_create(&st), 0);
  umbp_conn_stats_snapshot s, t;
  umbp_conn_stats_read(st, false, &s);
  assert_true(umbp_conn_stats_empty(&s));
  assert_int_equal(umbp_conn_stats_add(st, UMBP_CONN_LOAD, 4, 3, 1, 3 * 4096), 0);
  assert_int_equal(umbp_conn_stats_add(st, UMBP_CONN_STORE, 2, 2, 0, 8192), 0);
  assert_int_equal(umbp_conn_stats_add(st, 2, 1, 1, 1, 1), -EINVAL);
  assert_int_equal(umbp_conn_stats_add(st, -1, 1, 1, 1, 1), -EINVAL);
  umbp_conn_stats_read(st, true, &s);
  assert_int_equal(s.submitted[UMBP_CONN_LOAD], 4);
  assert_int_equal(s.completed[UMBP_CONN_LOAD], 3);
  assert_int_equal(s.failed[UMBP_CONN_LOAD], 1);
  assert_int_equal(s.bytes[UMBP_CONN_LOAD], 3 * 4096);
  assert_int_equal(s.bytes[UMBP_CONN_STORE], 8192);
  umbp_conn_stats_read(st, false, &t);
  assert_true(umbp_conn_stats_empty(&t)); /* reset */
  umbp_conn_stats_merge(&t, &s);
  umbp_conn_stats_merge(&t, &s);
  assert_int_equal(t.submitted[UMBP_CONN_STORE], 4);
  assert_int_equal(t.failed[UMBP_CONN_LOAD], 2);
  umbp_conn_stats_free(st);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_codec_roundtrip), cmocka_unit_test(test_null_arguments_named),
      cmocka_unit_test(test_keys_build_fold),
      cmocka_unit_test(test_ns_derive),       cmocka_unit_test(test_matched_rule),
      cmocka_unit_test(test_matched_rule_saturates),
      cmocka_unit_test(test_probe_matched_pool), cmocka_unit_test(test_events),
      cmocka_unit_test(test_stats),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
