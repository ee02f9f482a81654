/* SPDX-License-Identifier: Apache-2.0 */
/*
 * connector.c — block key codec, namespace derivation, matched-token rule, KV
 * events and transfer statistics of the vLLM connector. See the design note
 * in include/umbp/connector.h; the Python layer (python/umbp/vllm.py) calls
 * these through ctypes in batches, never per block.
 */
#include "umbp/connector.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"

/* ---- codec ---------------------------------------------------------------- */

static void put16(uint8_t *p, uint16_t v) {
  p[0] = (uint8_t)v;
  p[1] = (uint8_t)(v >> 8);
}
static uint16_t get16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }

size_t umbp_conn_key_size(const umbp_key *key) { return UMBP_CONN_KEY_HDR + (key ? key->hash_len : 0); }

int umbp_conn_key_encode(const umbp_key *key, uint8_t *buf, size_t n) {
  if (!key || !buf) return umbp_fail(-EINVAL, "umbp_conn_key_encode: key and buf are required");
  if (key->hash_len == 0 || key->hash_len > UMBP_KEY_HASH_MAX)
    return umbp_fail(-EINVAL, "umbp_conn_key_encode: hash_len must be 1..%d", UMBP_KEY_HASH_MAX);
  size_t need = umbp_conn_key_size(key);
  if (n < need) return umbp_fail(-ENOBUFS, "umbp_conn_key_encode: %zu bytes needed, %zu given", need, n);
  for (int i = 0; i < 4; i++) buf[i] = (uint8_t)(key->ns >> (8 * i));
  put16(buf + 4, key->tp_rank);
  put16(buf + 6, key->pcp_rank);
  put16(buf + 8, key->dcp_rank);
  put16(buf + 10, key->pp_rank);
  put16(buf + 12, key->group);
  buf[14] = key->hash_len;
  memcpy(buf + UMBP_CONN_KEY_HDR, key->hash, key->hash_len);
  return (int)need;
}

int umbp_conn_key_decode(const uint8_t *buf, size_t n, umbp_key *ret_key) {
  if (!buf || !ret_key) return umbp_fail(-EINVAL, "umbp_conn_key_decode: buf and ret_key are required");
  if (n < UMBP_CONN_KEY_HDR)
    return umbp_fail(-EBADMSG, "umbp_conn_key_decode: %zu bytes is shorter than a key header", n);
  uint8_t len = buf[14];
  if (len == 0 || len > UMBP_KEY_HASH_MAX || n < (size_t)UMBP_CONN_KEY_HDR + len)
    return umbp_fail(-EBADMSG, "umbp_conn_key_decode: bad hash length %u in %zu bytes", len, n);
  umbp_key k;
  memset(&k, 0, sizeof(k));
  k.ns = (uint32_t)buf[0] | (uint32_t)buf[1] << 8 | (uint32_t)buf[2] << 16 | (uint32_t)buf[3] << 24;
  k.tp_rank = get16(buf + 4);
  k.pcp_rank = get16(buf + 6);
  k.dcp_rank = get16(buf + 8);
  k.pp_rank = get16(buf + 10);
  k.group = get16(buf + 12);
  k.hash_len = len;
  memcpy(k.hash, buf + UMBP_CONN_KEY_HDR, len);
  *ret_key = k;
  return UMBP_CONN_KEY_HDR + len;
}

/* Fold an arbitrary-length hash into 32 bytes: four FNV-1a lanes with
 * different seeds. Only used for hashes longer than the key holds. */
static void fold32(const uint8_t *h, size_t n, uint8_t out[32]) {
  for (int lane = 0; lane < 4; lane++) {
    uint64_t v = umbp_fnv1a(h, n, 0xcbf29ce484222325ull ^ (0x9e3779b97f4a7c15ull * (uint64_t)(lane + 1)));
    for (int i = 0; i < 8; i++) out[lane * 8 + i] = (uint8_t)(v >> (8 * i));
  }
}

int umbp_conn_keys_build(const umbp_key *tmpl, unsigned n, const uint8_t *hashes, size_t hash_len,
                         umbp_key *keys) {
  if (!tmpl || (n && (!hashes || !keys)) || hash_len == 0)
    return umbp_fail(-EINVAL, "umbp_conn_keys_build: NULL argument or zero hash length");
  for (unsigned i = 0; i < n; i++) {
    umbp_key k = *tmpl;
    const uint8_t *h = hashes + (size_t)i * hash_len;
    memset(k.hash, 0, sizeof(k.hash));
    if (hash_len <= UMBP_KEY_HASH_MAX) {
      memcpy(k.hash, h, hash_len);
      k.hash_len = (uint8_t)hash_len;
    } else {
      fold32(h, hash_len, k.hash);
      k.hash_len = UMBP_KEY_HASH_MAX;
    }
    keys[i] = k;
  }
  return 0;
}

/* ---- namespace ------------------------------------------------------------ */

struct sbuf {
  char b[4096];
  size_t len;
  bool over;
};

/* Length-prefixed field so that no choice of strings can collide with another. */
static void sb_field(struct sbuf *s, const char *tag, const char *v) {
  if (!v) v = "";
  int w = snprintf(s->b + s->len, sizeof(s->b) - s->len, "%s:%zu:%s;", tag, strlen(v), v);
  if (w < 0 || (size_t)w >= sizeof(s->b) - s->len) {
    s->over = true;
    return;
  }
  s->len += (size_t)w;
}

static void sb_uint(struct sbuf *s, const char *tag, uint64_t v) {
  char t[24];
  snprintf(t, sizeof(t), "%llu", (unsigned long long)v);
  sb_field(s, tag, t);
}

int umbp_conn_ns_derive(const umbp_conn_ns_params *p, char *buf, size_t n) {
  if (!p || !buf) return umbp_fail(-EINVAL, "umbp_conn_ns_derive: NULL argument");
  if (p->key_namespace && p->key_namespace[0]) {
    size_t len = strlen(p->key_namespace);
    if (len > UMBP_CONN_NS_MAX)
      return umbp_fail(-EINVAL, "key_namespace is %zu bytes; at most %d are allowed", len, UMBP_CONN_NS_MAX);
    for (size_t i = 0; i < len; i++)
      /* every byte up to space and DEL: \r, \v, \f and other control
       * characters passed before, and end up in names, logs and metrics */
      if ((unsigned char)p->key_namespace[i] <= ' ' || p->key_namespace[i] == 0x7f)
        return umbp_fail(-EINVAL, "key_namespace contains white space or a control character (byte %zu); "
                         "use [A-Za-z0-9._:/-]", i);
    if (n < len + 1) return umbp_fail(-ENOBUFS, "umbp_conn_ns_derive: buffer of %zu bytes too small", n);
    memcpy(buf, p->key_namespace, len + 1);
    return (int)len;
  }
  if (!p->model || !p->model[0] || p->block_size == 0)
    return umbp_fail(-EINVAL, "umbp_conn_ns_derive: model and block_size are required without key_namespace");
  if (p->n_groups > UMBP_CONN_MAX_GROUPS)
    return umbp_fail(-EINVAL, "umbp_conn_ns_derive: %u KV groups; at most %d", p->n_groups, UMBP_CONN_MAX_GROUPS);
  struct sbuf s = {.len = 0, .over = false};
  sb_field(&s, "v", "1");
  sb_field(&s, "model", p->model);
  sb_field(&s, "rev", p->revision);
  sb_uint(&s, "bs", p->block_size);
  sb_field(&s, "layout", p->cache_layout);
  sb_uint(&s, "ngroups", p->n_groups);
  for (unsigned g = 0; g < p->n_groups; g++) sb_field(&s, "dtype", p->dtypes[g]);
  sb_uint(&s, "tp", p->tp_size ? p->tp_size : 1);
  sb_uint(&s, "pp", p->pp_size ? p->pp_size : 1);
  sb_uint(&s, "pcp", p->pcp_size ? p->pcp_size : 1);
  sb_uint(&s, "dcp", p->dcp_size ? p->dcp_size : 1);
  sb_field(&s, "draft", p->draft_model);
  if (s.over) return umbp_fail(-EINVAL, "umbp_conn_ns_derive: model/revision/dtype strings longer than 4 KiB in all");
  uint64_t a = umbp_fnv1a(s.b, s.len, 0xcbf29ce484222325ull);
  uint64_t b = umbp_fnv1a(s.b, s.len, 0x84222325cbf29ce4ull ^ a);
  if (n < 5 + 32 + 1) return umbp_fail(-ENOBUFS, "umbp_conn_ns_derive: buffer of %zu bytes too small", n);
  int w = snprintf(buf, n, "vllm-%016llx%016llx", (unsigned long long)a, (unsigned long long)b);
  return w;
}

/* ---- matched tokens ------------------------------------------------------- */

int64_t umbp_conn_matched_tokens(const uint32_t *hit_blocks, unsigned n_ranks, uint32_t block_size,
                                 uint64_t prompt_tokens, uint64_t computed_tokens, uint32_t *ret_blocks) {
  if (!hit_blocks || n_ranks == 0 || block_size == 0)
    return umbp_fail(-EINVAL, "umbp_conn_matched_tokens: no ranks or block_size 0");
  uint64_t usable = prompt_tokens ? (prompt_tokens - 1) / block_size : 0;
  for (unsigned r = 0; r < n_ranks; r++)
    if (hit_blocks[r] < usable) usable = hit_blocks[r];
  uint64_t hit_tokens = usable * block_size;
  if (ret_blocks) *ret_blocks = (uint32_t)usable;
  uint64_t more = hit_tokens > computed_tokens ? hit_tokens - computed_tokens : 0;
  return more > INT64_MAX ? INT64_MAX : (int64_t)more; /* never negative: that reads as an error code */
}

int64_t umbp_conn_probe_matched(umbp_pool *pool, const umbp_key *ranks, unsigned n_ranks,
                                const uint8_t *hashes, size_t hash_len, unsigned n_blocks,
                                uint32_t block_size, uint64_t prompt_tokens, uint64_t computed_tokens,
                                uint32_t *ret_blocks) {
  if (!pool || !ranks || n_ranks == 0 || block_size == 0 || (n_blocks && !hashes) || hash_len == 0)
    return umbp_fail(-EINVAL, "umbp_conn_probe_matched: bad arguments");
  uint64_t limit = prompt_tokens ? (prompt_tokens - 1) / block_size : 0;
  unsigned n = n_blocks < limit ? n_blocks : (unsigned)limit;
  /* Blocks the GPU already holds are probed too: prefix order means a later
   * block counts only when its predecessors are in the pool as well. */
  uint32_t *hits = calloc(n_ranks, sizeof(*hits));
  umbp_key *keys = n ? malloc((size_t)n * sizeof(*keys)) : NULL;
  if (!hits || (n && !keys)) {
    free(hits);
    free(keys);
    return umbp_fail(-ENOMEM, "umbp_conn_probe_matched: out of memory for %u keys", n);
  }
  unsigned need = n;
  for (unsigned r = 0; r < n_ranks && need > 0; r++) {
    int rc = umbp_conn_keys_build(&ranks[r], need, hashes, hash_len, keys);
    int got = rc < 0 ? 0 : umbp_prefix_probe(pool, need, keys);
    if (got < 0) got = 0; /* a failed lookup counts as a miss */
    hits[r] = (uint32_t)got;
    if ((unsigned)got < need) need = (unsigned)got; /* later ranks cannot extend the run */
  }
  for (unsigned r = 0; r < n_ranks; r++)
    if (hits[r] > need) hits[r] = need;
  int64_t res = umbp_conn_matched_tokens(hits, n_ranks, block_size, (uint64_t)n * block_size + 1,
                                         computed_tokens, ret_blocks);
  free(hits);
  free(keys);
  return res;
}

/* ---- events --------------------------------------------------------------- */

struct umbp_conn_events {
  umbp_conn_event *v;
  unsigned n, cap;
  unsigned workers;
};

int umbp_conn_events_create(umbp_conn_events **ret) {
  if (!ret) return umbp_fail(-EINVAL, "umbp_conn_events_create: NULL ret");
  umbp_conn_events *ev = calloc(1, sizeof(*ev));
  if (!ev) return umbp_fail(-ENOMEM, "umbp_conn_events_create: out of memory");
  ev->workers = 1;
  *ret = ev;
  return 0;
}

void umbp_conn_events_free(umbp_conn_events *ev) {
  if (!ev) return;
  free(ev->v);
  free(ev);
}

static bool ev_equal(const umbp_conn_event *a, const umbp_conn_event *b) {
  return a->type == b->type && a->group == b->group && a->tag == b->tag && a->hash_len == b->hash_len &&
         memcmp(a->hash, b->hash, a->hash_len) == 0;
}

static int ev_reserve(umbp_conn_events *ev, unsigned extra) {
  if (ev->n + extra <= ev->cap) return 0;
  unsigned cap = ev->cap ? ev->cap : 16;
  while (cap < ev->n + extra) cap *= 2;
  umbp_conn_event *v = realloc(ev->v, (size_t)cap * sizeof(*v));
  if (!v) return umbp_fail(-ENOMEM, "umbp_conn_events: out of memory for %u events", cap);
  ev->v = v;
  ev->cap = cap;
  return 0;
}

static int ev_check(const umbp_conn_event *evs, unsigned n) {
  for (unsigned i = 0; i < n; i++)
    if (evs[i].hash_len > UMBP_KEY_HASH_MAX)
      return umbp_fail(-EINVAL, "umbp_conn_events: event %u has hash_len %u > %d", i, evs[i].hash_len,
                       UMBP_KEY_HASH_MAX);
  return 0;
}

/* Duplicates are found with a hash set rebuilt per call: a step adds a few
 * hundred events, and the container is popped every step. */
static uint64_t ev_hash(const umbp_conn_event *e) {
  uint64_t h = umbp_fnv1a(e->hash, e->hash_len, 0xcbf29ce484222325ull);
  h ^= (uint64_t)e->type * 0x9e3779b97f4a7c15ull ^ (uint64_t)e->group << 32 ^ e->tag * 0xff51afd7ed558ccdull;
  return h ? h : 1;
}

int umbp_conn_events_add(umbp_conn_events *ev, const umbp_conn_event *evs, unsigned n) {
  if (!ev || (n && !evs)) return umbp_fail(-EINVAL, "umbp_conn_events_add: NULL argument");
  int rc = ev_check(evs, n);
  if (rc < 0) return rc;
  if ((rc = ev_reserve(ev, n)) < 0) return rc;
  unsigned total = ev->n + n, cap = 16;
  while (cap < 2 * total) cap *= 2;
  uint32_t *set = calloc(cap, sizeof(*set)); /* index + 1 into ev->v; 0 = empty */
  if (!set) return umbp_fail(-ENOMEM, "umbp_conn_events_add: out of memory");
  unsigned added = 0;
  for (unsigned i = 0; i < total; i++) {
    const umbp_conn_event *e = i < ev->n ? &ev->v[i] : &evs[i - ev->n];
    size_t pos = (size_t)(ev_hash(e) & (cap - 1));
    bool dup = false;
    while (set[pos]) {
      if (ev_equal(&ev->v[set[pos] - 1], e)) {
        dup = true;
        break;
      }
      pos = (pos + 1) & (cap - 1);
    }
    if (dup) continue;
    if (i >= ev->n) {
      ev->v[ev->n + added] = *e;
      set[pos] = ev->n + added + 1;
      added++;
    } else {
      set[pos] = i + 1;
    }
  }
  ev->n += added;
  free(set);
  return (int)added;
}

int umbp_conn_events_append(umbp_conn_events *ev, const umbp_conn_event *evs, unsigned n) {
  if (!ev || (n && !evs)) return umbp_fail(-EINVAL, "umbp_conn_events_append: NULL argument");
  int rc = ev_check(evs, n);
  if (rc < 0) return rc;
  if ((rc = ev_reserve(ev, n)) < 0) return rc;
  if (n) memcpy(ev->v + ev->n, evs, (size_t)n * sizeof(*evs));
  ev->n += n;
  return (int)n;
}

unsigned umbp_conn_events_count(const umbp_conn_events *ev) { return ev ? ev->n : 0; }

unsigned umbp_conn_events_get(const umbp_conn_events *ev, umbp_conn_event *out, unsigned max) {
  if (!ev) return 0;
  unsigned k = ev->n < max ? ev->n : max;
  if (k && out) memcpy(out, ev->v, (size_t)k * sizeof(*out));
  return ev->n;
}

unsigned umbp_conn_events_pop_common(umbp_conn_events *ev, umbp_conn_event *out, unsigned max) {
  if (!ev || (!out && max)) return 0;
  unsigned k = ev->n < max ? ev->n : max;
  if (k) memcpy(out, ev->v, (size_t)k * sizeof(*out));
  /* ev->v is NULL until the first event: no memmove (of NULL) with nothing left */
  if (ev->n > k) memmove(ev->v, ev->v + k, (size_t)(ev->n - k) * sizeof(*out));
  ev->n -= k;
  return k;
}

int umbp_conn_events_increment_workers(umbp_conn_events *ev, int count) {
  if (!ev) return umbp_fail(-EINVAL, "umbp_conn_events_increment_workers: ev is NULL");
  if (count <= 0)
    return umbp_fail(-EINVAL, "increment_workers: count must be positive (got %d)", count);
  ev->workers += (unsigned)count;
  return 0;
}

unsigned umbp_conn_events_workers(const umbp_conn_events *ev) { return ev ? ev->workers : 0; }

void umbp_conn_events_aggregate(umbp_conn_events *ev) {
  if (ev) ev->workers = 1;
}

void umbp_conn_events_clear(umbp_conn_events *ev) {
  if (!ev) return;
  ev->n = 0;
  ev->workers = 1;
}

/* ---- stats ---------------------------------------------------------------- */

struct umbp_conn_stats {
  _Atomic uint64_t submitted[UMBP_CONN_N_OPS], completed[UMBP_CONN_N_OPS], failed[UMBP_CONN_N_OPS],
      bytes[UMBP_CONN_N_OPS];
};

int umbp_conn_stats_create(umbp_conn_stats **ret) {
  if (!ret) return umbp_fail(-EINVAL, "umbp_conn_stats_create: NULL ret");
  umbp_conn_stats *st = calloc(1, sizeof(*st));
  if (!st) return umbp_fail(-ENOMEM, "umbp_conn_stats_create: out of memory");
  *ret = st;
  return 0;
}

void umbp_conn_stats_free(umbp_conn_stats *st) { free(st); }

int umbp_conn_stats_add(umbp_conn_stats *st, int op, uint64_t submitted, uint64_t completed, uint64_t failed,
                        uint64_t bytes) {
  if (!st) return umbp_fail(-EINVAL, "umbp_conn_stats_add: st is NULL");
  if (op < 0 || op >= UMBP_CONN_N_OPS)
    return umbp_fail(-EINVAL, "umbp_conn_stats_add: op %d is neither load (0) nor store (1)", op);
  /* Relaxed: statistics, no ordering with anything else (see header). */
  atomic_fetch_add_explicit(&st->submitted[op], submitted, memory_order_relaxed);
  atomic_fetch_add_explicit(&st->completed[op], completed, memory_order_relaxed);
  atomic_fetch_add_explicit(&st->failed[op], failed, memory_order_relaxed);
  atomic_fetch_add_explicit(&st->bytes[op], bytes, memory_order_relaxed);
  return 0;
}

static uint64_t rd(_Atomic uint64_t *c, bool reset) {
  uint64_t v = atomic_load_explicit(c, memory_order_relaxed);
  if (reset) atomic_fetch_sub_explicit(c, v, memory_order_relaxed);
  return v;
}

void umbp_conn_stats_read(umbp_conn_stats *st, bool reset, umbp_conn_stats_snapshot *ret) {
  if (!st || !ret) return;
  for (int op = 0; op < UMBP_CONN_N_OPS; op++) {
    ret->submitted[op] = rd(&st->submitted[op], reset);
    ret->completed[op] = rd(&st->completed[op], reset);
    ret->failed[op] = rd(&st->failed[op], reset);
    ret->bytes[op] = rd(&st->bytes[op], reset);
  }
}

void umbp_conn_stats_merge(umbp_conn_stats_snapshot *dst, const umbp_conn_stats_snapshot *src) {
  if (!dst || !src) return;
  for (int op = 0; op < UMBP_CONN_N_OPS; op++) {
    dst->submitted[op] += src->submitted[op];
    dst->completed[op] += src->completed[op];
    dst->failed[op] += src->failed[op];
    dst->bytes[op] += src->bytes[op];
  }
}

bool umbp_conn_stats_empty(const umbp_conn_stats_snapshot *s) {
  if (!s) return true;
  for (int op = 0; op < UMBP_CONN_N_OPS; op++)
    if (s->submitted[op] || s->completed[op] || s->failed[op] || s->bytes[op]) return false;
  return true;
}
