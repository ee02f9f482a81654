/* SPDX-License-Identifier: Apache-2.0 */
/*
 * umbp bench index — lookup and churn throughput of the block index, beside
 * DPDK's rte_hash and liburcu's cds_lfht measured in the same run on the same
 * keys with the same number of threads.
 *
 * Method.
 *  - Table size N (--keys): our pool has N slots of 4 KiB (no_prefault, so
 *    the slot bytes are never touched), rte_hash is created with entries = N,
 *    cds_lfht with N buckets. At load factor lf each gets the same lf*N keys.
 *  - Keys: 32 pseudo-random bytes per key, derived from (seed, set, index) so
 *    that an exec'd child process regenerates them without being sent any.
 *    Ours: umbp_key{ns from umbp_ns_register, ranks 0, hash_len 32}; the
 *    references get the same 32 bytes as their key. cds_lfht hashes them with
 *    a multiply-and-xorshift mix of their 4 words and
 *    compares with memcmp; rte_hash uses its default hash (CRC32 on x86).
 *  - Access order: uniform random over the key set, precomputed as a stream
 *    of STREAM_LEN keys in access order (so no RNG and no gather is timed);
 *    single lookups walk the stream one key at a time, bulk lookups take 32
 *    consecutive stream entries per call. Misses use keys never inserted.
 *    Every table's loop prefetches its stream STREAM_AHEAD keys ahead, so the
 *    keys come from cache (see stream_ahead()).
 *  - Parallelism: ours with 1 and 2 processes (the second is fork+exec of
 *    /proc/self/exe, attached to the pool by name; commands and results go
 *    over pipes, and both start together); the references with 1 and 2
 *    threads in-process. The figure of a 2-way case is the sum of each
 *    worker's ops / its own elapsed time.
 *  - Each case runs --reps repetitions of --seconds each, interleaving the
 *    three tables inside every repetition so that machine noise hits all of
 *    them alike; each table's median is reported, and each ratio is the
 *    median of the repetitions' ratios (see case_medians()). The defaults
 *    are many short repetitions (75 x 0.02 s): the shorter the time between
 *    the paired figures, the less a shared machine's drift separates them.
 *    Every table of a repetition starts at the same stream position, a
 *    different one in each repetition (rep_pos()).
 *  - Every repetition checks its results: a hit run must find every key and a
 *    miss run none; a wrong answer is a runtime error (exit 1), so the
 *    benchmark doubles as a smoke test of the index.
 *  - Churn: one writer inserts and removes fresh keys (ours: umbp_reserve +
 *    umbp_publish + umbp_remove; rte_hash: add_key + del_key on a table with
 *    RTE_HASH_EXTRA_FLAGS_RW_CONCURRENCY_LF whose freed entries go through an
 *    rte_rcu_qsbr defer queue; cds_lfht: add_unique + lookup + del + call_rcu)
 *    while one reader runs single hit lookups (ours: the writer's thread
 *    keeps the slot it removed and reserves it again, reserve.c's slot
 *    cache). Reported: writer pairs/s and
 *    the reader's lookups/s. Ours runs writer and reader as two threads of
 *    one process (p1) and as two processes (p2).
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <urcu/urcu-memb.h>
#include <urcu/rculfhash.h>

#ifdef UMBP_HAVE_DPDK
#include <rte_eal.h>
#include <rte_errno.h>
#include <rte_hash.h>
#include <rte_log.h>
#include <rte_memory.h>
#include <rte_rcu_qsbr.h>
#include <rte_version.h>
#endif

#include "bench.h"
#include "cli.h"
#include "pool_fault.h"
#include "umbp/admin.h" /* umbp_admin_free_slots: the churn writer's back-pressure */
#include "umbp/index.h"
#include "umbp/pool.h"

#define BULK 32                 /* keys per bulk call */
#define STREAM_LEN (1u << 20)   /* keys per access stream (power of two, multiple of BULK) */
#define STREAM_MASK (STREAM_LEN - 1)
#define CHECK_EVERY 256         /* lookups between clock reads */
#define MAX_LF 4
#define KEYLEN 32

enum { IMPL_OURS, IMPL_RTE, IMPL_LFHT, IMPL_N };
static const char *impl_names[IMPL_N] = {"ours", "rte_hash", "cds_lfht"};

enum key_set { SET_HIT = 1, SET_MISS = 2, SET_CHURN = 3 };

/* Lookup operations. The pin ops exist only for ours; the references run
 * their plain lookup (base_op) in those rows. */
enum op { OP_HIT1, OP_HITB, OP_MISS1, OP_MISSB, OP_PHIT1, OP_PHITB, OP_PMISS1, OP_PMISSB, OP_N };
static const char *op_names[OP_N] = {"hit-single",     "hit-bulk",     "miss-single",     "miss-bulk",
                                     "pin-hit-single", "pin-hit-bulk", "pin-miss-single", "pin-miss-bulk"};
static int base_op(int op) { return op >= OP_PHIT1 ? op - OP_PHIT1 : op; }
static bool op_is_hit(int op) { return base_op(op) == OP_HIT1 || base_op(op) == OP_HITB; }
static bool op_is_bulk(int op) { return op == OP_HITB || op == OP_MISSB || op == OP_PHITB || op == OP_PMISSB; }

/* ---- options and results ---------------------------------------------------- */
struct opts {
  uint64_t keys;
  double seconds;
  double warmup; /* untimed run of the same case before each timed one (0: none) */
  unsigned reps;
  bool json;
  uint64_t seed;
  double lf[MAX_LF];
  unsigned n_lf;
  const char *filter; /* comma-separated substrings of case names; NULL: all */
  bool impl_on[IMPL_N];
  bool no_dpdk;
  bool rte_huge;   /* EAL on 2 MiB pages (--in-memory) instead of --no-huge */
  int index_pages; /* enum umbp_index_pages of our pools */
};

struct case_res {
  char name[64];
  const char *unit;
  double v[IMPL_N]; /* median, NAN: not measured */
  double r[IMPL_N]; /* median over the repetitions of ours / that table in the same repetition */
  double q1[IMPL_N], q3[IMPL_N]; /* the same ratios' first and third quartiles: their spread */
  double *rv[IMPL_N]; /* each repetition's figure, in order (NULL: not measured) */
  unsigned nrep;
};

/* every case of every load factor: OP_N lookup ops and the churn pair, each
 * with 1 and 2 processes (64 dropped the last 16 rows of --lf with 4 values) */
#define MAX_CASES (MAX_LF * (OP_N + 2) * 2)
static struct case_res cases[MAX_CASES];
static unsigned n_cases;

/* ---- small helpers ------------------------------------------------------------- */
static inline uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Spin until CLOCK_MONOTONIC reaches t: the start instant that the two
 * processes of a p2 repetition share (a pipe wake-up alone lets one of them
 * run alone for its first tens of microseconds). */
static void wait_until(uint64_t t) {
  while (now_ns() < t) sched_yield();
}

/* How far ahead a p2 repetition's start instant is set: room for the
 * second process to read its command and reach the same instant. */
#define START_AHEAD_NS 1000000ull

/* Where repetition rep starts reading the key streams, the same for every
 * table: a spread of BULK-aligned offsets, so that short repetitions do not
 * all read the same first keys of the stream. */
static uint64_t rep_pos(unsigned rep) {
  return ((uint64_t)rep * 0x9e3779b1u) & STREAM_MASK & ~(uint64_t)(BULK - 1);
}

static inline uint64_t splitmix(uint64_t *s) {
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/* Key i of a set: 32 bytes that depend only on (seed, set, i). */
static inline void key_bytes(uint64_t seed, unsigned set, uint64_t i, uint8_t out[KEYLEN]) {
  uint64_t s = seed ^ ((uint64_t)set << 56) ^ (i * 0xd6e8feb86659fd93ull);
  for (unsigned j = 0; j < KEYLEN / 8; j++) {
    uint64_t w = splitmix(&s);
    memcpy(out + 8 * j, &w, 8);
  }
}

static inline void make_ukey(uint32_t ns, const uint8_t b[KEYLEN], umbp_key *k) {
  memset(k, 0, sizeof *k);
  k->ns = ns;
  k->hash_len = KEYLEN;
  memcpy(k->hash, b, KEYLEN);
}

/* cds_lfht's hash: a multiply-and-xorshift mix of the key's 4 words. */
static inline uint64_t hash32(const void *key) {
  uint64_t w[4];
  memcpy(w, key, sizeof w);
  uint64_t h = 0x9e3779b97f4a7c15ull;
  for (int i = 0; i < 4; i++) {
    uint64_t x = w[i] * 0xbf58476d1ce4e5b9ull;
    x ^= x >> 31;
    h = (h ^ x) * 0x94d049bb133111ebull;
  }
  h ^= h >> 29;
  h *= 0xbf58476d1ce4e5b9ull;
  h ^= h >> 32;
  return h;
}

static int cmp_dbl(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static double median(double *v, unsigned n) {
  if (!n) return NAN;
  qsort(v, n, sizeof *v, cmp_dbl);
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* Quantile q of sorted v[0..n), interpolated between the two nearest values
 * (position (n - 1) * q; numpy's default). */
static double quantile_sorted(const double *v, unsigned n, double q) {
  if (!n) return NAN;
  double h = (n - 1) * q;
  unsigned i = (unsigned)h;
  return i + 1 < n ? v[i] + (h - i) * (v[i + 1] - v[i]) : v[n - 1];
}

/* Medians of one case: each table's figure, and each table's ratio, ours over
 * it, taken repetition by repetition (the two measured within a second of each
 * other) before the median: a machine's speed can drift several-fold within
 * a minute (docs/bench-index.md), and a ratio of two medians can pair a fast
 * repetition with a slow one. */
static void case_medians(struct case_res *c, double *const vals[IMPL_N], unsigned reps, const bool *measured) {
  double rr[reps > 0 ? reps : 1];
  c->nrep = reps;
  for (int impl = 0; impl < IMPL_N; impl++) {
    if (!measured[impl]) continue;
    if ((c->rv[impl] = malloc(reps * sizeof(double)))) memcpy(c->rv[impl], vals[impl], reps * sizeof(double));
    if (impl != IMPL_OURS && measured[IMPL_OURS]) {
      unsigned n = 0;
      for (unsigned k = 0; k < reps; k++)
        if (vals[impl][k] > 0) rr[n++] = vals[IMPL_OURS][k] / vals[impl][k];
      c->r[impl] = median(rr, n); /* sorts rr */
      c->q1[impl] = quantile_sorted(rr, n, 0.25);
      c->q3[impl] = quantile_sorted(rr, n, 0.75);
    }
  }
  for (int impl = 0; impl < IMPL_N; impl++)
    if (measured[impl]) c->v[impl] = median(vals[impl], reps); /* sorts: after the ratios */
}

static bool case_selected(const struct opts *o, const char *name) {
  if (!o->filter) return true;
  const char *f = o->filter;
  while (*f) {
    const char *e = strchr(f, ',');
    size_t l = e ? (size_t)(e - f) : strlen(f);
    if (l) {
      char pat[64];
      if (l >= sizeof pat) l = sizeof pat - 1;
      memcpy(pat, f, l);
      pat[l] = 0;
      if (strstr(name, pat)) return true;
    }
    if (!e) break;
    f = e + 1;
  }
  return false;
}

static void lf_label(double lf, char *buf, size_t n) { snprintf(buf, n, "lf%g", lf); }

static struct case_res *case_add(const char *name, const char *unit) {
  if (n_cases == MAX_CASES) return NULL;
  struct case_res *c = &cases[n_cases++];
  memset(c, 0, sizeof *c);
  snprintf(c->name, sizeof c->name, "%s", name);
  c->unit = unit;
  for (int i = 0; i < IMPL_N; i++) c->v[i] = c->r[i] = c->q1[i] = c->q3[i] = NAN;
  return c;
}


static bool g_progress;
static unsigned g_done, g_total;
static void progress(const char *what) {
  if (!g_progress) return;
  fprintf(stderr, "\r\033[K[%u/%u] %s", g_done, g_total, what);
  fflush(stderr);
}

/* ---- streams -------------------------------------------------------------------- */
/* Every table's lookup loop prefetches the stream STREAM_AHEAD keys ahead of
 * the key it looks up (the same distance, the same lines per key), so the keys
 * come from cache, as they do in a scheduler that has just computed them, and
 * what is timed is the table, not the reading of the harness's stream from
 * memory (which costs ours more: an umbp_key is 48 bytes, a reference key 32). */
#define STREAM_AHEAD (2 * BULK)
static inline void stream_ahead(const void *base, size_t esz, uint64_t pos, unsigned n) {
  const char *a = (const char *)base + ((pos + STREAM_AHEAD) & STREAM_MASK) * esz;
  const char *e = (const char *)base + (((pos + STREAM_AHEAD + n - 1) & STREAM_MASK) + 1) * esz;
  if (e < a) e = (const char *)base + (size_t)STREAM_LEN * esz; /* wrapped: the head comes around again */
  for (uintptr_t l = (uintptr_t)a & ~(uintptr_t)63; l < (uintptr_t)e; l += 64) __builtin_prefetch((const void *)l);
}

/* One access stream: STREAM_LEN keys drawn uniformly from [0, n) of a set. */
static umbp_key *ustream_make(uint64_t seed, unsigned set, uint64_t n, uint32_t ns) {
  umbp_key *s = malloc(sizeof *s * STREAM_LEN);
  if (!s) return NULL;
  uint64_t r = seed ^ 0x5851f42d4c957f2dull ^ set;
  for (uint32_t i = 0; i < STREAM_LEN; i++) {
    uint8_t b[KEYLEN];
    key_bytes(seed, set, splitmix(&r) % n, b);
    make_ukey(ns, b, &s[i]);
  }
  return s;
}

/* The same stream as 32-byte keys for the references. */
static uint8_t *rstream_make(uint64_t seed, unsigned set, uint64_t n) {
  uint8_t *s = malloc((size_t)KEYLEN * STREAM_LEN);
  if (!s) return NULL;
  uint64_t r = seed ^ 0x5851f42d4c957f2dull ^ set;
  for (uint32_t i = 0; i < STREAM_LEN; i++) key_bytes(seed, set, splitmix(&r) % n, s + (size_t)i * KEYLEN);
  return s;
}

struct run_res {
  uint64_t ops, found, ns;
  int err; /* 0 or -errno from the table */
  char msg[256]; /* ours: umbp_last_error() of the thread that failed */
};

/* ---- ours ----------------------------------------------------------------------- */
static _Atomic uint64_t g_churn_waits; /* churn writer stalls for free slots (stderr note) */
static int ours_lookup_run(umbp_pool *p, const umbp_key *st, int op, uint64_t pos, uint64_t dur_ns,
                           struct run_res *r) {
  uint64_t ops = 0, found = 0;
  uint8_t present[BULK];
  uint32_t slots[BULK];
  int err = 0;
  pos &= STREAM_MASK & ~(uint64_t)(BULK - 1);
  uint64_t t0 = now_ns(), end = t0 + dur_ns, t;
  do {
    switch (op) {
    case OP_HIT1:
    case OP_MISS1:
      for (unsigned i = 0; i < CHECK_EVERY; i++) {
        stream_ahead(st, sizeof *st, pos, 1);
        int rc = umbp_contains(p, &st[pos]);
        if (rc < 0) err = rc;
        else found += (uint64_t)rc;
        pos = (pos + 1) & STREAM_MASK;
      }
      break;
    case OP_HITB:
    case OP_MISSB:
      for (unsigned i = 0; i < CHECK_EVERY / BULK; i++) {
        stream_ahead(st, sizeof *st, pos, BULK);
        int rc = umbp_contains_bulk(p, BULK, &st[pos], present);
        if (rc < 0) err = rc;
        else found += (uint64_t)rc;
        pos = (pos + BULK) & STREAM_MASK;
      }
      break;
    case OP_PHIT1:
    case OP_PMISS1:
      for (unsigned i = 0; i < CHECK_EVERY; i++) {
        uint32_t s;
        stream_ahead(st, sizeof *st, pos, 1);
        int rc = umbp_lookup_pin(p, &st[pos], &s);
        if (rc == 0) {
          found++;
          if ((rc = umbp_unpin(p, s)) != 0) err = rc;
        } else if (rc != -ENOENT) {
          err = rc;
        }
        pos = (pos + 1) & STREAM_MASK;
      }
      break;
    default: /* OP_PHITB, OP_PMISSB */
      for (unsigned i = 0; i < CHECK_EVERY / BULK; i++) {
        stream_ahead(st, sizeof *st, pos, BULK);
        int rc = umbp_lookup_pin_bulk(p, BULK, &st[pos], slots);
        if (rc < 0) {
          err = rc;
        } else {
          found += (uint64_t)rc;
          if ((rc = umbp_unpin_bulk(p, BULK, slots)) != 0) err = rc;
        }
        pos = (pos + BULK) & STREAM_MASK;
      }
      break;
    }
    ops += CHECK_EVERY;
    t = now_ns();
  } while (t < end && !err);
  r->ops = ops;
  r->found = found;
  r->ns = t - t0;
  r->err = err;
  if (err) snprintf(r->msg, sizeof r->msg, "%s", umbp_last_error());
  return err;
}

static uint64_t ours_free_slots(umbp_pool *p) {
  uint64_t n = 0;
  umbp_admin_free_slots(p, -1, &n); /* every partition */
  return n;
}

/* Churn writer: reserve + publish + remove of fresh keys; ops = pairs.
 *
 * Back-pressure: a reserve that finds the free queue empty evicts published
 * blocks (the reader's hit keys). So, like the rte_hash writer that waits on
 * -ENOSPC for its defer queue, this writer waits (umbp_reclaim + yield) while
 * fewer than CHURN_LOW slots are free; g_churn_waits counts how often it had
 * to. Since layout 6 removed slots are free at once, so it does not wait
 * unless a free queue was held up (umbp_reclaim() then tidies it). */
#define CHURN_LOW 64
static int ours_churn_run(umbp_pool *p, uint32_t ns, uint64_t seed, uint64_t *ctr, uint64_t dur_ns,
                          struct run_res *r) {
  uint64_t ops = 0;
  int err = 0;
  uint64_t t0 = now_ns(), end = t0 + dur_ns, t = t0;
  do {
    /* one check per 16 pairs, for 16 + CHURN_LOW free slots */
    if (__builtin_expect(ours_free_slots(p) < CHURN_LOW + 16, 0)) {
      while (ours_free_slots(p) < CHURN_LOW + 16 && now_ns() < end) {
        umbp_reclaim(p);
        sched_yield();
      }
      g_churn_waits++;
      if (ours_free_slots(p) < CHURN_LOW + 16) break;
    }
    for (unsigned i = 0; i < 16 && !err; i++) {
      uint8_t b[KEYLEN];
      umbp_key k;
      uint32_t s;
      key_bytes(seed, SET_CHURN, (*ctr)++, b);
      make_ukey(ns, b, &k);
      if ((err = umbp_reserve(p, -1, ns, &s)) != 0) break;
      if ((err = umbp_publish(p, s, &k)) != 0) break;
      if ((err = umbp_remove(p, &k)) != 0) break;
      ops++;
    }
    t = now_ns();
  } while (t < end && !err);
  r->ops = ops;
  r->found = ops;
  r->ns = t - t0;
  r->err = err;
  if (err) snprintf(r->msg, sizeof r->msg, "%s", umbp_last_error());
  return err;
}

/* ---- cds_lfht ----------------------------------------------------------------------- */
struct lnode {
  struct cds_lfht_node node;
  struct rcu_head rcu;
  uint8_t key[KEYLEN];
};

static int lf_match(struct cds_lfht_node *n, const void *key) {
  const struct lnode *l = caa_container_of(n, struct lnode, node);
  return !memcmp(l->key, key, KEYLEN);
}

static inline bool lf_lookup(struct cds_lfht *ht, const uint8_t *key) {
  struct cds_lfht_iter it;
  cds_lfht_lookup(ht, hash32(key), lf_match, key, &it);
  return cds_lfht_iter_get_node(&it) != NULL;
}

static void lf_free_cb(struct rcu_head *h) { free(caa_container_of(h, struct lnode, rcu)); }

/* ---- rte_hash ----------------------------------------------------------------------- */
#ifdef UMBP_HAVE_DPDK
struct rte_churn {
  struct rte_rcu_qsbr *qsbr; /* NULL: entries freed at once (see rte_setup_churn) */
};
#endif

/* ---- generic workers (threads) ------------------------------------------------------ */
struct bench;

struct worker {
  struct bench *b;
  int impl;
  int op;       /* lookup op, or -1: churn writer */
  bool churn;   /* reader during churn (rte_hash: reports quiescent states) */
  unsigned tid; /* 0..1: stream offset, qsbr thread id */
  uint64_t pos, dur_ns;
  pthread_barrier_t *bar;
  struct run_res res;
  pthread_t th;
};

struct bench {
  const struct opts *o;
  uint64_t n, nins; /* table size, keys inserted */
  double lf;
  /* ours */
  umbp_pool *pool;
  char pool_name[UMBP_NAME_MAX + 1];
  uint32_t ns;
  umbp_key *ust[2]; /* hit, miss streams */
  uint64_t ours_churn_ctr;
  /* child process (second of ours) */
  pid_t child;
  FILE *to_child, *from_child;
  /* references */
  uint8_t *rst[2];
  struct cds_lfht *lfht;
  struct lnode *lnodes;
  uint64_t lf_churn_ctr;
  bool have_rte;
#ifdef UMBP_HAVE_DPDK
  struct rte_hash *rte;       /* lookups: default flags */
  struct rte_hash *rte_lf;    /* churn: RW_CONCURRENCY_LF + qsbr */
  struct rte_churn rc;
  uint64_t rte_churn_ctr;
#endif
};

static bool g_dpdk;                 /* EAL is up */
static char g_dpdk_note[512];       /* why rte_hash is not measured, or its version */
static char g_ours_note[256];       /* where our pool's index lives */
static bool g_ours_index_huge;
static char g_pool_names[MAX_LF][UMBP_NAME_MAX + 1];
static volatile sig_atomic_t g_child_pid;

static const uint8_t *rkey(const struct bench *b, int set_idx, uint64_t pos) {
  return b->rst[set_idx] + (size_t)(pos & STREAM_MASK) * KEYLEN;
}

static int ref_lookup_run(struct worker *w) {
  struct bench *b = w->b;
  int op = base_op(w->op);
  int set = op_is_hit(op) ? 0 : 1;
  uint64_t pos = w->pos & STREAM_MASK & ~(uint64_t)(BULK - 1), ops = 0, found = 0;
  uint64_t t0 = now_ns(), end = t0 + w->dur_ns, t;
  if (w->impl == IMPL_LFHT) {
    do {
      if (!op_is_bulk(op)) {
        for (unsigned i = 0; i < CHECK_EVERY; i++) {
          stream_ahead(b->rst[set], KEYLEN, pos, 1);
          urcu_memb_read_lock();
          found += lf_lookup(b->lfht, rkey(b, set, pos));
          urcu_memb_read_unlock();
          pos = (pos + 1) & STREAM_MASK;
        }
      } else {
        /* no bulk API: 32 lookups under one read-side critical section */
        for (unsigned i = 0; i < CHECK_EVERY / BULK; i++) {
          stream_ahead(b->rst[set], KEYLEN, pos, BULK);
          urcu_memb_read_lock();
          for (unsigned j = 0; j < BULK; j++) found += lf_lookup(b->lfht, rkey(b, set, pos + j));
          urcu_memb_read_unlock();
          pos = (pos + BULK) & STREAM_MASK;
        }
      }
      ops += CHECK_EVERY;
      t = now_ns();
    } while (t < end);
  }
#ifdef UMBP_HAVE_DPDK
  else {
    struct rte_hash *h = w->churn ? b->rte_lf : b->rte;
    struct rte_rcu_qsbr *q = w->churn ? b->rc.qsbr : NULL;
    do {
      if (!op_is_bulk(op)) {
        for (unsigned i = 0; i < CHECK_EVERY; i++) {
          stream_ahead(b->rst[set], KEYLEN, pos, 1);
          found += rte_hash_lookup(h, rkey(b, set, pos)) >= 0;
          pos = (pos + 1) & STREAM_MASK;
        }
      } else {
        for (unsigned i = 0; i < CHECK_EVERY / BULK; i++) {
          const void *kp[BULK];
          int32_t posv[BULK];
          stream_ahead(b->rst[set], KEYLEN, pos, BULK);
          for (unsigned j = 0; j < BULK; j++) kp[j] = rkey(b, set, pos + j);
          if (rte_hash_lookup_bulk(h, kp, BULK, posv) == 0)
            for (unsigned j = 0; j < BULK; j++) found += posv[j] >= 0;
          pos = (pos + BULK) & STREAM_MASK;
        }
      }
      if (q) rte_rcu_qsbr_quiescent(q, w->tid);
      ops += CHECK_EVERY;
      t = now_ns();
    } while (t < end);
  }
#else
  else {
    t = t0;
  }
#endif
  w->res.ops = ops;
  w->res.found = found;
  w->res.ns = t - t0;
  w->res.err = 0;
  return 0;
}

static int ref_churn_run(struct worker *w) {
  struct bench *b = w->b;
  uint64_t ops = 0;
  int err = 0;
  uint64_t t0 = now_ns(), end = t0 + w->dur_ns, t;
  if (w->impl == IMPL_LFHT) {
    do {
      for (unsigned i = 0; i < 16; i++) {
        struct lnode *n = malloc(sizeof *n);
        if (!n) {
          err = -ENOMEM;
          break;
        }
        key_bytes(b->o->seed, SET_CHURN, b->lf_churn_ctr++, n->key);
        uint64_t h = hash32(n->key);
        cds_lfht_node_init(&n->node);
        urcu_memb_read_lock();
        struct cds_lfht_node *got = cds_lfht_add_unique(b->lfht, h, lf_match, n->key, &n->node);
        urcu_memb_read_unlock();
        if (got != &n->node) {
          free(n);
          err = -EEXIST;
          break;
        }
        /* remove by key, as umbp_remove and rte_hash_del_key do */
        struct cds_lfht_iter it;
        urcu_memb_read_lock();
        cds_lfht_lookup(b->lfht, h, lf_match, n->key, &it);
        struct cds_lfht_node *f = cds_lfht_iter_get_node(&it);
        int rc = f ? cds_lfht_del(b->lfht, f) : -ENOENT;
        urcu_memb_read_unlock();
        if (rc) {
          err = -ENOENT;
          break;
        }
        urcu_memb_call_rcu(&caa_container_of(f, struct lnode, node)->rcu, lf_free_cb);
        ops++;
      }
      t = now_ns();
    } while (t < end && !err);
  }
#ifdef UMBP_HAVE_DPDK
  else {
    do {
      for (unsigned i = 0; i < 16; i++) {
        uint8_t k[KEYLEN];
        key_bytes(b->o->seed, SET_CHURN, b->rte_churn_ctr++, k);
        int32_t p = rte_hash_add_key(b->rte_lf, k);
        /* -ENOSPC: every free entry waits in the defer queue for the reader's
         * next quiescent report (it may be preempted): wait for it, as an
         * application would, instead of failing */
        while (p == -ENOSPC && now_ns() < end) {
          sched_yield();
          p = rte_hash_add_key(b->rte_lf, k);
        }
        if (p == -ENOSPC) break; /* the run ended while waiting */
        if (p < 0) {
          err = p;
          break;
        }
        int32_t d = rte_hash_del_key(b->rte_lf, k);
        if (d < 0) {
          err = d;
          break;
        }
        /* with a qsbr variable attached, del_key defers the free itself */
        if (!b->rc.qsbr) rte_hash_free_key_with_position(b->rte_lf, d);
        ops++;
      }
      t = now_ns();
    } while (t < end && !err);
  }
#else
  else {
    t = t0;
  }
#endif
  w->res.ops = ops;
  w->res.found = ops;
  w->res.ns = t - t0;
  w->res.err = err;
  return err;
}

static void *worker_main(void *arg) {
  struct worker *w = arg;
  if (w->impl == IMPL_LFHT) urcu_memb_register_thread();
#ifdef UMBP_HAVE_DPDK
  if (w->impl == IMPL_RTE && w->churn && w->op >= 0 && w->b->rc.qsbr) {
    rte_rcu_qsbr_thread_register(w->b->rc.qsbr, w->tid);
    rte_rcu_qsbr_thread_online(w->b->rc.qsbr, w->tid);
  }
#endif
  pthread_barrier_wait(w->bar);
  if (w->impl == IMPL_OURS) {
    if (w->op < 0)
      ours_churn_run(w->b->pool, w->b->ns, w->b->o->seed, &w->b->ours_churn_ctr, w->dur_ns, &w->res);
    else
      ours_lookup_run(w->b->pool, w->b->ust[op_is_hit(w->op) ? 0 : 1], w->op, w->pos, w->dur_ns, &w->res);
  } else if (w->op < 0) {
    ref_churn_run(w);
  } else {
    ref_lookup_run(w);
  }
#ifdef UMBP_HAVE_DPDK
  if (w->impl == IMPL_RTE && w->churn && w->op >= 0 && w->b->rc.qsbr) {
    rte_rcu_qsbr_thread_offline(w->b->rc.qsbr, w->tid);
    rte_rcu_qsbr_thread_unregister(w->b->rc.qsbr, w->tid);
  }
#endif
  if (w->impl == IMPL_LFHT) urcu_memb_unregister_thread();
  return NULL;
}

/* Run n workers at once (threads); returns 0 or -errno. */
static int run_workers(struct worker *w, unsigned n) {
  pthread_barrier_t bar;
  pthread_barrier_init(&bar, NULL, n);
  unsigned started = 0;
  int rc = 0;
  for (unsigned i = 0; i < n; i++) {
    w[i].bar = &bar;
    if ((rc = -pthread_create(&w[i].th, NULL, worker_main, &w[i])) != 0) break;
    started++;
  }
  if (started < n) {
    /* cannot happen with 2 threads short of a broken system; the barrier would hang */
    cli_error("bench index: cannot start a thread: %s", strerror(-rc));
    exit(CLI_RUNTIME);
  }
  for (unsigned i = 0; i < n; i++) pthread_join(w[i].th, NULL);
  pthread_barrier_destroy(&bar);
  return rc;
}

static double mops(const struct run_res *r) { return r->ns ? (double)r->ops * 1e3 / (double)r->ns : 0; }

/* ---- the second process of ours ------------------------------------------------------ */
static int child_spawn(struct bench *b) {
  int to[2], from[2];
  if (pipe2(to, O_CLOEXEC) || pipe2(from, O_CLOEXEC)) return -errno;
  char keys[32], fill[32], seed[32];
  snprintf(keys, sizeof keys, "%llu", (unsigned long long)b->n);
  snprintf(fill, sizeof fill, "%llu", (unsigned long long)b->nins);
  snprintf(seed, sizeof seed, "%llu", (unsigned long long)b->o->seed);
  fflush(stdout);
  fflush(stderr);
  pid_t pid = fork();
  if (pid < 0) return -errno;
  if (pid == 0) {
    if (dup2(to[0], 0) < 0 || dup2(from[1], 1) < 0) _exit(127);
    execl("/proc/self/exe", "umbp", "bench", "index", "--child", b->pool_name, "--keys", keys, "--fill", fill,
          "--seed", seed, (char *)NULL);
    _exit(127);
  }
  close(to[0]);
  close(from[1]);
  b->child = pid;
  g_child_pid = pid;
  b->to_child = fdopen(to[1], "w");
  b->from_child = fdopen(from[0], "r");
  char line[128];
  if (!b->to_child || !b->from_child || !fgets(line, sizeof line, b->from_child) || strncmp(line, "ready", 5)) {
    cli_error("bench index: the second process did not start (see its message above)");
    return -ECHILD;
  }
  return 0;
}

static void child_stop(struct bench *b) {
  if (!b->child) return;
  if (b->to_child) {
    fprintf(b->to_child, "quit\n");
    fclose(b->to_child);
  }
  if (b->from_child) fclose(b->from_child);
  int st;
  waitpid(b->child, &st, 0);
  b->child = 0;
  g_child_pid = 0;
  b->to_child = b->from_child = NULL;
}

/* Ask the child to run op (or -1: hit lookups as a churn reader) for dur_ns
 * from stream position pos, starting at CLOCK_MONOTONIC instant start. */
static int child_start(struct bench *b, int op, uint64_t dur_ns, uint64_t pos, uint64_t start) {
  if (fprintf(b->to_child, "run %d %llu %llu %llu\n", op, (unsigned long long)dur_ns, (unsigned long long)pos,
              (unsigned long long)start) < 0 ||
      fflush(b->to_child))
    return -EPIPE;
  return 0;
}

static int child_wait(struct bench *b, struct run_res *r) {
  char line[256];
  unsigned long long ops, found, ns;
  int err;
  if (!fgets(line, sizeof line, b->from_child) || sscanf(line, "done %llu %llu %llu %d", &ops, &found, &ns, &err) != 4) {
    cli_error("bench index: the second process stopped answering");
    return -ECHILD;
  }
  r->ops = ops;
  r->found = found;
  r->ns = ns;
  r->err = err;
  if (err) snprintf(r->msg, sizeof r->msg, "in the second process (its stderr says why)");
  return 0;
}

static int child_main(int argc, char **argv) {
  const char *name = NULL;
  uint64_t keys = 0, fill = 0, seed = 0;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--child") && i + 1 < argc) name = argv[++i];
    else if (!strcmp(argv[i], "--keys") && i + 1 < argc) keys = strtoull(argv[++i], NULL, 10);
    else if (!strcmp(argv[i], "--fill") && i + 1 < argc) fill = strtoull(argv[++i], NULL, 10);
    else if (!strcmp(argv[i], "--seed") && i + 1 < argc) seed = strtoull(argv[++i], NULL, 10);
  }
  if (!name || !keys || !fill) {
    cli_error("bench index --child: internal option, started by 'umbp bench index' itself");
    return CLI_USAGE;
  }
  umbp_attach_opts ao;
  umbp_attach_opts_init(&ao);
  ao.role = UMBP_ROLE_TOOL;
  umbp_pool *p;
  int rc = umbp_pool_attach(name, &ao, &p);
  if (rc) {
    cli_error("bench index child: cannot attach to pool '%s': %s", name, umbp_last_error());
    return CLI_RUNTIME;
  }
  cli_fault_watch(p, "umbp bench index: child", false);
  uint32_t ns;
  if ((rc = umbp_ns_register(p, "bench", &ns))) {
    cli_error("bench index child: %s", umbp_last_error());
    cli_pool_detach(p);
    return CLI_RUNTIME;
  }
  umbp_key *st[2] = {ustream_make(seed, SET_HIT, fill, ns), ustream_make(seed, SET_MISS, fill, ns)};
  if (!st[0] || !st[1]) {
    cli_error("bench index child: out of memory");
    return CLI_RUNTIME;
  }
  printf("ready\n");
  fflush(stdout);
  char line[128];
  while (fgets(line, sizeof line, stdin)) {
    int op;
    unsigned long long dur, pos, start;
    if (sscanf(line, "run %d %llu %llu %llu", &op, &dur, &pos, &start) != 4) break;
    struct run_res r = {0};
    if (op < 0) op = OP_HIT1; /* churn reader */
    wait_until(start);
    ours_lookup_run(p, st[op_is_hit(op) ? 0 : 1], op, pos, dur, &r);
    printf("done %llu %llu %llu %d\n", (unsigned long long)r.ops, (unsigned long long)r.found,
           (unsigned long long)r.ns, r.err);
    fflush(stdout);
  }
  free(st[0]);
  free(st[1]);
  cli_pool_detach(p);
  return CLI_OK;
}

/* ---- checking ------------------------------------------------------------------------- */
static int check_res(int impl, int op, const struct run_res *r, const char *cname) {
  if (r->err) {
    cli_error("bench index: %s: %s failed: %s%s%s", cname, impl_names[impl], strerror(-r->err),
              impl == IMPL_OURS && r->msg[0] ? " — " : "", impl == IMPL_OURS ? r->msg : "");
    return -1;
  }
  if (op < 0) return 0;
  uint64_t want = op_is_hit(op) ? r->ops : 0;
  if (r->found != want) {
    cli_error("bench index: %s: %s found %llu of %llu keys (%s): the table gives wrong answers", cname,
              impl_names[impl], (unsigned long long)r->found, (unsigned long long)r->ops,
              op_is_hit(op) ? "all were inserted" : "none was inserted");
    return -1;
  }
  return 0;
}

/* ---- the memory under the tables ----------------------------------------------------- */
/* What a cold line costs in a region: a chain of dependent loads, each from a
 * line evicted beforehand (CLFLUSH), over MEM_SAMPLES random lines of each
 * 2 MiB piece; a piece's figure is the least of three tries, in ns a line. On a
 * VM a 2 MiB page's DRAM latency is set by where the host placed it: the huge
 * pages of one guest measured about 120 ns and about 210 ns, and our single-key
 * lookups followed the pages their bucket array got, 0.57-0.70x rte_hash on the
 * slow ones and 1.03-1.22x on the fast ones (docs/bench-index.md, "The
 * fifteenth session"). So every run says what its memory cost: our bucket
 * array, and fresh 4 KiB pages of this process, the kind of memory rte_hash's
 * (EAL --no-huge) and cds_lfht's heaps are made of. Only reads and CLFLUSH
 * touch the pool; x86 only (elsewhere nothing is measured). */
#define MEM_PIECE (2u << 20)
#define MEM_SAMPLES 512
#define MEM_MAX_PIECES 64
struct mem_lat {
  bool ok;            /* measured */
  double med, lo, hi; /* ns a cold line: median, least and most over the pieces */
};
static struct mem_lat g_mem_ours[MAX_LF], g_mem_4k[MAX_LF];

#if defined(__x86_64__)
static double piece_line_ns(const char *p, size_t len) {
  uint64_t nl = len / 64;
  uint32_t off[MEM_SAMPLES];
  unsigned n = nl < MEM_SAMPLES ? (unsigned)nl : MEM_SAMPLES;
  uint64_t r = 0x9e3779b97f4a7c15ull ^ (uint64_t)(uintptr_t)p;
  for (unsigned i = 0; i < n; i++) off[i] = (uint32_t)(splitmix(&r) % nl * 64);
  double best = INFINITY;
  for (int t = 0; t < 3; t++) {
    for (unsigned i = 0; i < n; i++) __asm__ volatile("clflush %0" : : "m"(*(const char *)(p + off[i])));
    __asm__ volatile("mfence" ::: "memory");
    uint64_t x = 0, t0 = now_ns();
    for (unsigned i = 0; i < n; i++) {
      /* x is 0, but the CPU cannot know it before the previous load is in:
       * each load's address waits for the one before */
      __asm__ volatile("and $0, %0" : "+r"(x));
      x = *(const volatile uint64_t *)(const void *)(p + off[i] + x);
    }
    double ns = (double)(now_ns() - t0) / n;
    if (ns < best) best = ns;
  }
  return best;
}

static struct mem_lat mem_region(const char *base, size_t len) {
  struct mem_lat m = {false, NAN, NAN, NAN};
  size_t np = len / MEM_PIECE ? len / MEM_PIECE : 1;
  unsigned k = np < MEM_MAX_PIECES ? (unsigned)np : MEM_MAX_PIECES;
  double v[MEM_MAX_PIECES];
  for (unsigned i = 0; i < k; i++) {
    size_t at = (size_t)((uint64_t)i * np / k) * MEM_PIECE; /* k pieces spread over the region */
    v[i] = piece_line_ns(base + at, len - at < MEM_PIECE ? len - at : MEM_PIECE);
  }
  m.ok = true;
  m.med = median(v, k); /* sorts v */
  m.lo = v[0];
  m.hi = v[k - 1];
  return m;
}

/* len bytes of fresh anonymous memory on 4 KiB pages, written once, measured, unmapped */
static struct mem_lat mem_fresh_4k(size_t len) {
  struct mem_lat m = {false, NAN, NAN, NAN};
  char *a = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (a == MAP_FAILED) return m;
  madvise(a, len, MADV_NOHUGEPAGE);
  memset(a, 1, len);
  m = mem_region(a, len);
  munmap(a, len);
  return m;
}
#endif

/* Our bucket array's figure and fresh 4 KiB pages' for load factor lf_idx
 * (left NAN where the pool's geometry cannot be read or off x86). */
static void mem_measure(umbp_pool *pool, unsigned lf_idx) {
  g_mem_ours[lf_idx] = g_mem_4k[lf_idx] = (struct mem_lat){false, NAN, NAN, NAN};
#if defined(__x86_64__)
  umbp_admin_index_info ii;
  void *base;
  size_t len;
  if (umbp_admin_index_info_get(pool, &ii) || umbp_admin_pool_mapping(pool, &base, &len) || ii.bucket_bytes < 64 ||
      ii.bucket_offset > len || ii.bucket_bytes > len - ii.bucket_offset)
    return;
  g_mem_ours[lf_idx] = mem_region((const char *)base + ii.bucket_offset, ii.bucket_bytes);
  g_mem_4k[lf_idx] = mem_fresh_4k(ii.bucket_bytes);
#else
  (void)pool;
#endif
}

/* Our pools' names: this process's PID and the load factor's index; the
 * sweep of killed runs' pools (sweep_stale_pools()) reads them back. */
#define BENCH_POOL_FMT "umbp-bench-index-%d-%u"

/* ---- setup / teardown ------------------------------------------------------------------ */
static int ours_setup(struct bench *b, unsigned lf_idx) {
  umbp_pool_params pp;
  umbp_pool_params_init(&pp);
  pp.capacity = b->n * 4096;
  pp.slot_size = 4096;
  pp.no_prefault = true;
  pp.index_pages = b->o->index_pages;
  snprintf(b->pool_name, sizeof b->pool_name, BENCH_POOL_FMT, (int)getpid(), lf_idx);
  cli_fatal_lock(); /* a signal meanwhile removes the pool once it exists */
  int rc = umbp_pool_create(b->pool_name, &pp, &b->pool);
  if (rc == 0) snprintf(g_pool_names[lf_idx], sizeof g_pool_names[lf_idx], "%s", b->pool_name);
  cli_fatal_unlock();
  if (rc) {
    cli_error("bench index: cannot create pool '%s' (%llu slots of 4 KiB): %s", b->pool_name,
              (unsigned long long)b->n, umbp_last_error());
    return rc;
  }
  cli_fault_watch(b->pool, "umbp bench index", false);
  umbp_pool_info info;
  if (umbp_pool_get_info(b->pool, &info) == 0) {
    g_ours_index_huge = info.index_hugepages;
    if (info.index_hugepages)
      snprintf(g_ours_note, sizeof g_ours_note, "index (bucket array, slot metadata: %llu MiB) on 2 MiB pages "
               "(--index-pages %s)", (unsigned long long)(info.index_huge_bytes >> 20),
               cli_index_pages_name(b->o->index_pages));
    else
      snprintf(g_ours_note, sizeof g_ours_note, "index on 4 KiB pages (--index-pages %s%s)",
               cli_index_pages_name(b->o->index_pages),
               b->o->index_pages == UMBP_INDEX_PAGES_TRY ? ": too few free 2 MiB huge pages, see README" : "");
  }
  if ((rc = umbp_ns_register(b->pool, "bench", &b->ns))) {
    cli_error("bench index: %s", umbp_last_error());
    return rc;
  }
  if (umbp_slot_count(b->pool) < b->nins) {
    cli_error("bench index: the pool has %u slots, fewer than the %llu keys to insert", umbp_slot_count(b->pool),
              (unsigned long long)b->nins);
    return -ENOSPC;
  }
  enum { CH = 256 };
  uint32_t slots[CH];
  umbp_key keys[CH];
  int prc[CH];
  for (uint64_t i = 0; i < b->nins;) {
    unsigned want = b->nins - i < CH ? (unsigned)(b->nins - i) : CH;
    int got = umbp_reserve_bulk(b->pool, -1, b->ns, want, slots);
    if (got <= 0) {
      cli_error("bench index: filling the pool: %s", got < 0 ? umbp_last_error() : "no slot reserved");
      return got < 0 ? got : -ENOSPC;
    }
    for (int j = 0; j < got; j++) {
      uint8_t kb[KEYLEN];
      key_bytes(b->o->seed, SET_HIT, i + (uint64_t)j, kb);
      make_ukey(b->ns, kb, &keys[j]);
    }
    int pub = umbp_publish_bulk(b->pool, (unsigned)got, slots, keys, prc);
    if (pub != got) {
      for (int j = 0; j < got; j++)
        if (prc[j]) {
          cli_error("bench index: publishing key %llu: %s", (unsigned long long)(i + (uint64_t)j),
                    umbp_strerror(prc[j]));
          break;
        }
      return -EIO;
    }
    i += (uint64_t)got;
  }
  mem_measure(b->pool, lf_idx);
  b->ust[0] = ustream_make(b->o->seed, SET_HIT, b->nins, b->ns);
  b->ust[1] = ustream_make(b->o->seed, SET_MISS, b->nins, b->ns);
  if (!b->ust[0] || !b->ust[1]) return -ENOMEM;
  return 0;
}

static void ours_teardown(struct bench *b, unsigned lf_idx) {
  child_stop(b);
  free(b->ust[0]);
  free(b->ust[1]);
  b->ust[0] = b->ust[1] = NULL;
  if (b->pool) {
    cli_pool_detach(b->pool);
    umbp_pool_destroy(b->pool_name);
    b->pool = NULL;
    g_pool_names[lf_idx][0] = 0;
  }
}

static unsigned long pow2ceil(uint64_t v) {
  unsigned long p = 1;
  while (p < v) p <<= 1;
  return p;
}

static int lfht_setup(struct bench *b) {
  unsigned long sz = pow2ceil(b->n);
  b->lfht = cds_lfht_new_flavor(sz, sz, 0, CDS_LFHT_AUTO_RESIZE | CDS_LFHT_ACCOUNTING, &urcu_memb_flavor, NULL);
  b->lnodes = calloc(b->nins, sizeof *b->lnodes);
  if (!b->lfht || !b->lnodes) {
    cli_error("bench index: cannot create the cds_lfht table");
    return -ENOMEM;
  }
  urcu_memb_read_lock();
  for (uint64_t i = 0; i < b->nins; i++) {
    struct lnode *n = &b->lnodes[i];
    key_bytes(b->o->seed, SET_HIT, i, n->key);
    cds_lfht_node_init(&n->node);
    if (cds_lfht_add_unique(b->lfht, hash32(n->key), lf_match, n->key, &n->node) != &n->node) {
      urcu_memb_read_unlock();
      cli_error("bench index: cds_lfht: duplicate key %llu", (unsigned long long)i);
      return -EEXIST;
    }
  }
  urcu_memb_read_unlock();
  return 0;
}

static void lfht_teardown(struct bench *b) {
  if (b->lfht) {
    struct cds_lfht_iter it;
    struct cds_lfht_node *n;
    urcu_memb_read_lock();
    cds_lfht_for_each(b->lfht, &it, n) cds_lfht_del(b->lfht, n);
    urcu_memb_read_unlock();
    urcu_memb_synchronize_rcu();
    urcu_memb_barrier(); /* churn nodes queued with call_rcu */
    cds_lfht_destroy(b->lfht, NULL);
    b->lfht = NULL;
  }
  free(b->lnodes);
  b->lnodes = NULL;
}

#ifdef UMBP_HAVE_DPDK
static struct rte_hash *rte_make(struct bench *b, const char *tag, uint8_t flags) {
  char name[RTE_HASH_NAMESIZE];
  snprintf(name, sizeof name, "bench_%s_%g", tag, b->lf);
  struct rte_hash_parameters hp;
  memset(&hp, 0, sizeof hp);
  hp.name = name;
  hp.entries = (uint32_t)b->n;
  hp.key_len = KEYLEN;
  hp.hash_func = NULL; /* DPDK's default: CRC32 where the CPU has it */
  hp.socket_id = SOCKET_ID_ANY;
  hp.extra_flag = flags;
  struct rte_hash *h = rte_hash_create(&hp);
  if (!h) {
    cli_error("bench index: rte_hash_create(%llu entries): %s", (unsigned long long)b->n, rte_strerror(rte_errno));
    return NULL;
  }
  for (uint64_t i = 0; i < b->nins; i++) {
    uint8_t k[KEYLEN];
    key_bytes(b->o->seed, SET_HIT, i, k);
    int32_t rc = rte_hash_add_key(h, k);
    if (rc < 0) {
      cli_error("bench index: rte_hash_add_key failed at key %llu of %llu: %s", (unsigned long long)i,
                (unsigned long long)b->nins, strerror(-rc));
      rte_hash_free(h);
      return NULL;
    }
  }
  return h;
}

static int rte_setup_churn(struct bench *b) {
  b->rte_lf = rte_make(b, "lf", RTE_HASH_EXTRA_FLAGS_RW_CONCURRENCY_LF);
  if (!b->rte_lf) return -ENOMEM;
  size_t sz = rte_rcu_qsbr_get_memsize(4);
  b->rc.qsbr = aligned_alloc(RTE_CACHE_LINE_SIZE, (sz + RTE_CACHE_LINE_SIZE - 1) & ~(size_t)(RTE_CACHE_LINE_SIZE - 1));
  if (b->rc.qsbr && rte_rcu_qsbr_init(b->rc.qsbr, 4) == 0) {
    struct rte_hash_rcu_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.v = b->rc.qsbr;
    cfg.mode = RTE_HASH_QSBR_MODE_DQ;
    if (rte_hash_rcu_qsbr_add(b->rte_lf, &cfg) == 0) return 0;
  }
  /* without a defer queue the writer frees at once; the churn keys are never
   * looked up by the reader, so its answers stay right */
  fprintf(stderr, "umbp: bench index: rte_hash_rcu_qsbr_add failed (%s): rte_hash churn frees entries at once\n",
          rte_strerror(rte_errno));
  free(b->rc.qsbr);
  b->rc.qsbr = NULL;
  return 0;
}

static void rte_teardown_churn(struct bench *b) {
  if (b->rte_lf) rte_hash_free(b->rte_lf); /* frees its defer queue too */
  b->rte_lf = NULL;
  free(b->rc.qsbr);
  b->rc.qsbr = NULL;
}
#endif

/* ---- the cases ------------------------------------------------------------------------- */
/* One repetition of a lookup op with par workers for impl; returns Mops/s or NAN on error. */
static double rep_lookup(struct bench *b, int impl, int op, unsigned par, unsigned rep, double secs,
                         uint64_t shift, const char *cname, int *ret_err) {
  uint64_t dur = (uint64_t)(secs * 1e9), pos = (rep_pos(rep) + shift) & STREAM_MASK;
  if (par > 2) par = 2; /* 1 or 2 (r[], w[]); says so to the compiler's bounds warnings */
  struct run_res r[2];
  memset(r, 0, sizeof r);
  if (impl == IMPL_OURS) {
    if (par == 2) {
      uint64_t start = now_ns() + START_AHEAD_NS;
      if (child_start(b, op, dur, (pos + STREAM_LEN / 2) & STREAM_MASK, start)) {
        *ret_err = -EPIPE;
        return NAN;
      }
      wait_until(start);
    }
    ours_lookup_run(b->pool, b->ust[op_is_hit(op) ? 0 : 1], op, pos, dur, &r[0]);
    if (par == 2 && child_wait(b, &r[1])) {
      *ret_err = -ECHILD;
      return NAN;
    }
  } else {
    struct worker w[2];
    memset(w, 0, sizeof w);
    for (unsigned i = 0; i < par; i++) {
      w[i].b = b;
      w[i].impl = impl;
      w[i].op = op;
      w[i].tid = i;
      w[i].pos = (pos + (uint64_t)i * (STREAM_LEN / 2)) & STREAM_MASK;
      w[i].dur_ns = dur;
    }
    run_workers(w, par);
    for (unsigned i = 0; i < par; i++) r[i] = w[i].res;
  }
  double sum = 0;
  for (unsigned i = 0; i < par; i++) {
    if (check_res(impl, op, &r[i], cname)) {
      *ret_err = -EIO;
      return NAN;
    }
    sum += mops(&r[i]);
  }
  return sum;
}

/* One churn repetition: writer + one reader. par 2 (ours only): reader in the
 * child process. Returns writer M pairs/s, *ret_reader the reader's Mops/s. */
static double rep_churn(struct bench *b, int impl, unsigned par, unsigned rep, double secs, uint64_t shift,
                        const char *cname, double *ret_reader, int *ret_err) {
  uint64_t dur = (uint64_t)(secs * 1e9), pos = (rep_pos(rep) + shift) & STREAM_MASK;
  struct worker w[2];
  memset(w, 0, sizeof w);
  struct run_res rd = {0};
  if (impl == IMPL_OURS && par == 2) {
    uint64_t start = now_ns() + START_AHEAD_NS;
    if (child_start(b, -1, dur, pos, start)) {
      *ret_err = -EPIPE;
      return NAN;
    }
    wait_until(start);
    ours_churn_run(b->pool, b->ns, b->o->seed, &b->ours_churn_ctr, dur, &w[0].res);
    if (child_wait(b, &rd)) {
      *ret_err = -ECHILD;
      return NAN;
    }
  } else {
    for (unsigned i = 0; i < 2; i++) {
      w[i].b = b;
      w[i].impl = impl;
      w[i].op = i == 0 ? -1 : OP_HIT1;
      w[i].churn = true;
      w[i].tid = i;
      w[i].pos = pos;
      w[i].dur_ns = dur;
    }
    run_workers(w, 2);
    rd = w[1].res;
  }
  if (check_res(impl, -1, &w[0].res, cname) || check_res(impl, OP_HIT1, &rd, cname)) {
    *ret_err = -EIO;
    return NAN;
  }
  *ret_reader = mops(&rd);
  return mops(&w[0].res);
}

/* --warmup: each table's timed run of a repetition follows an untimed run of
 * the same case (same table, operation and processes or threads) for W
 * seconds. It starts a quarter of the key stream further on, so that it does
 * not replay, in order, the keys the timed run starts with; a warm-up of
 * 0.04 s or more reads most of the 2^20-key stream either way, as warming
 * the whole table means to. */
#define WARMUP_SHIFT (STREAM_LEN / 4)

/* The k-th table to run in repetition rep, among the measured ones (-1: no
 * k-th). The order rotates from one repetition to the next, so that no table
 * always runs first, or always right after the same other table (whose run
 * leaves the caches full of its own lines). Which table ran before matters:
 * on this project's Intel VM, single misses measured ours 41-43 M/s alone and
 * 29-30 beside another table, rte_hash 32-36 alone and 31-33 beside ours
 * (docs/bench-index.md, "The eighth session"). */
static int rep_impl(const bool measured[IMPL_N], unsigned rep, int k) {
  int order[IMPL_N], m = 0;
  for (int i = 0; i < IMPL_N; i++)
    if (measured[i]) order[m++] = i;
  return k < m ? order[(rep + (unsigned)k) % (unsigned)m] : -1;
}

static bool impl_ready(const struct bench *b, int impl) {
  if (!b->o->impl_on[impl]) return false;
  if (impl == IMPL_RTE) return b->have_rte;
  return true;
}

static int run_lf(struct bench *b, unsigned lf_idx) {
  const struct opts *o = b->o;
  char lfs[16], name[64];
  lf_label(b->lf, lfs, sizeof lfs);
  double *vals[IMPL_N];
  for (int i = 0; i < IMPL_N; i++) vals[i] = calloc(o->reps, sizeof(double));
  double *rdv[IMPL_N];
  for (int i = 0; i < IMPL_N; i++) rdv[i] = calloc(o->reps, sizeof(double));
  int err = 0;

  /* which cases run at this load factor */
  bool want_p2 = false, want_churn = false;
  for (int op = 0; op < OP_N; op++)
    for (unsigned par = 1; par <= 2; par++) {
      snprintf(name, sizeof name, "%s-%s-p%u", op_names[op], lfs, par);
      if (case_selected(o, name) && par == 2) want_p2 = true;
    }
  for (unsigned par = 1; par <= 2; par++) {
    snprintf(name, sizeof name, "churn-%s-p%u", lfs, par);
    char n2[64];
    snprintf(n2, sizeof n2, "churn-reader-%s-p%u", lfs, par);
    if (case_selected(o, name) || case_selected(o, n2)) {
      want_churn = true;
      if (par == 2) want_p2 = true;
    }
  }

  progress("filling the tables");
  if (o->impl_on[IMPL_OURS] && (err = ours_setup(b, lf_idx))) goto out;
  if (o->impl_on[IMPL_LFHT] && (err = lfht_setup(b))) goto out;
  if (o->impl_on[IMPL_LFHT] || o->impl_on[IMPL_RTE]) {
    b->rst[0] = rstream_make(o->seed, SET_HIT, b->nins);
    b->rst[1] = rstream_make(o->seed, SET_MISS, b->nins);
    if (!b->rst[0] || !b->rst[1]) {
      err = -ENOMEM;
      goto out;
    }
  }
#ifdef UMBP_HAVE_DPDK
  b->have_rte = g_dpdk && o->impl_on[IMPL_RTE];
  if (b->have_rte && !(b->rte = rte_make(b, "ro", 0))) {
    err = -EIO;
    goto out;
  }
#endif
  if (o->impl_on[IMPL_OURS] && want_p2 && (err = child_spawn(b))) goto out;

  for (int op = 0; op < OP_N; op++) {
    for (unsigned par = 1; par <= 2; par++) {
      snprintf(name, sizeof name, "%s-%s-p%u", op_names[op], lfs, par);
      if (!case_selected(o, name)) continue;
      struct case_res *c = case_add(name, "Mlookups/s");
      if (!c) continue;
      /* pin rows: the references run their plain lookup, again in every
       * repetition, so that each ratio pairs figures measured together */
      progress(name);
      bool measured[IMPL_N];
      for (int impl = 0; impl < IMPL_N; impl++) measured[impl] = impl_ready(b, impl);
      for (unsigned rep = 0; rep < o->reps; rep++)
        for (int k = 0; k < IMPL_N; k++) {
          int impl = rep_impl(measured, rep, k);
          if (impl < 0) continue;
          int iop = impl == IMPL_OURS ? op : base_op(op);
          if (o->warmup > 0) {
            rep_lookup(b, impl, iop, par, rep, o->warmup, WARMUP_SHIFT, name, &err);
            if (err) goto out;
          }
          vals[impl][rep] = rep_lookup(b, impl, iop, par, rep, o->seconds, 0, name, &err);
          if (err) goto out;
        }
      case_medians(c, vals, o->reps, measured);
      g_done++;
    }
  }

  if (want_churn) {
#ifdef UMBP_HAVE_DPDK
    if (b->rte) rte_hash_free(b->rte);
    b->rte = NULL;
    if (b->have_rte && o->impl_on[IMPL_RTE] && (err = rte_setup_churn(b))) goto out;
#endif
    for (unsigned par = 1; par <= 2; par++) {
      snprintf(name, sizeof name, "churn-%s-p%u", lfs, par);
      char rname[64];
      snprintf(rname, sizeof rname, "churn-reader-%s-p%u", lfs, par);
      if (!case_selected(o, name) && !case_selected(o, rname)) continue;
      struct case_res *c = case_add(name, "Mpairs/s");
      struct case_res *cr = case_add(rname, "Mlookups/s");
      if (!c || !cr) continue;
      /* p2: the references have no second process; they run their p1
       * (two-thread) churn again in every repetition, paired with ours */
      progress(name);
      bool measured[IMPL_N];
      for (int impl = 0; impl < IMPL_N; impl++) measured[impl] = impl_ready(b, impl);
      for (unsigned rep = 0; rep < o->reps; rep++)
        for (int k = 0; k < IMPL_N; k++) {
          int impl = rep_impl(measured, rep, k);
          if (impl < 0) continue;
          unsigned ipar = impl == IMPL_OURS ? par : 1;
          if (o->warmup > 0) {
            double rd;
            rep_churn(b, impl, ipar, rep, o->warmup, WARMUP_SHIFT, name, &rd, &err);
            if (err) goto out;
          }
          vals[impl][rep] = rep_churn(b, impl, ipar, rep, o->seconds, 0, name, &rdv[impl][rep], &err);
          if (err) goto out;
        }
      case_medians(c, vals, o->reps, measured);
      case_medians(cr, rdv, o->reps, measured);
      g_done += 2;
    }
  }
out:
  ours_teardown(b, lf_idx);
  lfht_teardown(b);
#ifdef UMBP_HAVE_DPDK
  if (b->rte) rte_hash_free(b->rte);
  b->rte = NULL;
  rte_teardown_churn(b);
#endif
  free(b->rst[0]);
  free(b->rst[1]);
  for (int i = 0; i < IMPL_N; i++) {
    free(vals[i]);
    free(rdv[i]);
  }
  return err;
}

/* ---- DPDK EAL ---------------------------------------------------------------------------- */
static void dpdk_start(const struct opts *o) {
#ifdef UMBP_HAVE_DPDK
  if (o->no_dpdk || !o->impl_on[IMPL_RTE]) {
    snprintf(g_dpdk_note, sizeof g_dpdk_note, "rte_hash not measured: --no-dpdk or --impls without rte_hash");
    return;
  }
  /* rte_eal_init pins the calling thread to its main lcore; put the affinity
   * back so that our threads and the child process are not all on one CPU */
  cpu_set_t saved;
  CPU_ZERO(&saved);
  bool have_aff = sched_getaffinity(0, sizeof saved, &saved) == 0;
  char lcores[32] = "0";
  if (have_aff) {
    int first = -1, second = -1;
    for (int c = 0; c < CPU_SETSIZE && second < 0; c++)
      if (CPU_ISSET(c, &saved)) {
        if (first < 0) first = c;
        else second = c;
      }
    if (second >= 0) snprintf(lcores, sizeof lcores, "%d,%d", first, second);
    else if (first >= 0) snprintf(lcores, sizeof lcores, "%d", first);
  }
  /* EAL heap (anonymous memory with --no-huge): about 160 bytes per entry for
   * one table with its key store, ring and defer queue, plus slack */
  char mem[32];
  snprintf(mem, sizeof mem, "%llu", (unsigned long long)(128 + (o->keys * 320 >> 20)));
  /* --rte-hugepages: the EAL heap (rte_hash's buckets and key store) on
   * 2 MiB pages, taken with MAP_HUGETLB and no files (--in-memory) */
  char *args[] = {"umbp-bench", o->rte_huge ? "--in-memory" : "--no-huge", "--no-pci", "--no-shconf",
                  "--no-telemetry", "-l", lcores, "-m", mem, "--log-level=lib.eal:error", NULL};
  int argc = (int)(sizeof args / sizeof args[0]) - 1;
  rte_openlog_stream(stderr); /* stdout carries the table or the JSON */
  int rc = rte_eal_init(argc, args);
  if (have_aff) sched_setaffinity(0, sizeof saved, &saved);
  optind = 1; /* rte_eal_init runs getopt */
  if (rc < 0) {
    /* with --rte-hugepages the usual cause is too few free 2 MiB pages for
     * -m: say so, and what to do */
    snprintf(g_dpdk_note, sizeof g_dpdk_note, "rte_hash not measured: rte_eal_init failed: %s%s%s%s",
             rte_strerror(rte_errno), o->rte_huge ? " (--rte-hugepages: its heap, -m " : "", o->rte_huge ? mem : "",
             o->rte_huge ? " MiB, on free 2 MiB pages: reserve more with sysctl vm.nr_hugepages=N, lower --keys, "
                           "or drop --rte-hugepages)" : "");
    return;
  }
  g_dpdk = true;
  snprintf(g_dpdk_note, sizeof g_dpdk_note, "%s, EAL %s --no-pci --no-shconf -l %s -m %s", rte_version(),
           o->rte_huge ? "--in-memory (2 MiB pages)" : "--no-huge", lcores, mem);
#else
  (void)o;
  snprintf(g_dpdk_note, sizeof g_dpdk_note,
           "rte_hash not measured: this umbp was built without DPDK (install libdpdk-dev, reconfigure with "
           "-Ddpdk_bench=enabled)");
#endif
}

static void dpdk_stop(void) {
#ifdef UMBP_HAVE_DPDK
  if (g_dpdk) rte_eal_cleanup();
#endif
}

/* SIGINT, SIGTERM, SIGHUP: the run's pools and its second process go with it
 * (on cli_fatal_signals()'s thread, after which the process dies of sig). */
static void on_signal(int sig) {
  (void)sig;
  for (unsigned i = 0; i < MAX_LF; i++)
    if (g_pool_names[i][0]) umbp_pool_destroy(g_pool_names[i]);
  if (g_child_pid > 0) kill(g_child_pid, SIGKILL);
}

/* Whether a process holds pool `name`: its registry's locks, which also
 * see processes of other PID namespaces (containers sharing /dev/shm, where
 * a PID of this namespace says nothing). Held by no one: a pool whose creator
 * died half-way (-EOWNERDEAD), and an index file whose pool file is gone
 * (-ENOENT with no pool file, cli_pool_file_exists()). Counted as held: a pool
 * still being made, one this process cannot read or attach (another user's;
 * an index file this namespace cannot find, -ENOENT with the pool file
 * there). */
static bool pool_held(const char *name) {
  umbp_attach_opts ao;
  umbp_attach_opts_init(&ao);
  ao.read_only = true;
  ao.timeout_ms = 100;
  umbp_pool *p = NULL;
  int rc = umbp_pool_attach(name, &ao, &p);
  if (rc == -EOWNERDEAD) return false;
  if (rc == -ENOENT) return cli_pool_file_exists(name);
  if (rc) return true;
  umbp_proc_info pi[UMBP_MAX_PROCS];
  int n = umbp_pool_list_procs(p, pi, UMBP_MAX_PROCS);
  bool held = n < 0;
  for (int i = 0; i < n; i++) held = held || pi[i].alive;
  umbp_pool_detach(p);
  return held;
}

/* The PID in a pool name of this benchmark, umbp-bench-index-PID-N exactly
 * as ours_setup() writes it (no sign, no leading zero, nothing after), or 0. */
static int bench_pool_pid(const char *name) {
  int pid = 0, n = 0;
  unsigned lf = 0;
  if (sscanf(name, "umbp-bench-index-%9d-%2u%n", &pid, &lf, &n) != 2 || name[n] || pid <= 0) return 0;
  char again[UMBP_NAME_MAX + 1];
  snprintf(again, sizeof again, BENCH_POOL_FMT, pid, lf);
  return strcmp(again, name) == 0 ? pid : 0;
}

/* Remove the pools that an earlier run left behind when it was killed by a
 * signal it cannot catch (SIGKILL, the OOM killer, a debugger's kill):
 * umbp-bench-index-PID-N whose process PID no longer exists and that no
 * process holds. Each holds its slot bytes in /dev/shm (4 GiB at the default
 * --keys) and, with the index on 2 MiB pages, huge pages that a later run then
 * cannot get, so that it measures an index on 4 KiB pages. It runs before this
 * run makes its pools, so a pool with this process's own PID is a leftover of
 * an earlier process that had the same PID. */
static void sweep_stale_pools(void) {
  char hdir[256];
  const char *dirs[2] = {"/dev/shm", umbp_admin_hugetlbfs_mount(hdir, sizeof hdir) == 0 ? hdir : NULL};
  static const char *const prefixes[2] = {"umbp.", "umbp-index."};
  for (unsigned di = 0; di < 2; di++) {
    DIR *d = dirs[di] ? opendir(dirs[di]) : NULL;
    if (!d) continue;
    struct dirent *e;
    while ((e = readdir(d))) {
      for (unsigned k = 0; k < 2; k++) {
        size_t pl = strlen(prefixes[k]);
        if (strncmp(e->d_name, prefixes[k], pl)) continue;
        const char *name = e->d_name + pl;
        int pid = bench_pool_pid(name);
        if (!pid || (pid != (int)getpid() && (kill(pid, 0) == 0 || errno != ESRCH)) || pool_held(name))
          continue;
        if (umbp_pool_destroy(name) == 0)
          fprintf(stderr, "umbp: bench index: removed pool '%s', left by an earlier run (process %d, no longer "
                          "running)\n", name, pid);
      }
    }
    closedir(d);
  }
}

/* ---- output -------------------------------------------------------------------------------- */
static void fmt_v(char *buf, size_t n, double v) {
  if (isnan(v)) snprintf(buf, n, "-");
  else snprintf(buf, n, "%.2f", v);
}

static double ratio(const struct case_res *c, int ref) { return c->r[ref]; }

/* The machine a run measured, so that every result says where it came
 * from (the target is per machine kind, and figures differ between kinds):
 * the CPU model, family and model number from /proc/cpuinfo (under a
 * hypervisor the model name can be generic), the online CPUs, and the sizes of CPU 0's
 * unified level 2 and level 3 caches from sysfs, as the kernel reports them
 * ("2048K"; a VM reports what its hypervisor tells it). Empty where the
 * system does not say. */
struct machine {
  char model[128];
  int family, model_number; /* -1: not reported (not x86) */
  long cpus;
  char l2[32], l3[32];
};

static void read_line(const char *path, char *buf, size_t n) {
  buf[0] = 0;
  FILE *f = fopen(path, "r");
  if (!f) return;
  if (fgets(buf, (int)n, f)) buf[strcspn(buf, "\n")] = 0;
  fclose(f);
}

static void machine_read(struct machine *m) {
  memset(m, 0, sizeof *m);
  m->family = m->model_number = -1;
  FILE *f = fopen("/proc/cpuinfo", "r");
  if (f) {
    char line[512];
    /* the first CPU's block, up to its blank line */
    while (fgets(line, sizeof line, f) && line[0] != '\n') {
      const char *v = strchr(line, ':');
      if (!v) continue;
      v++;
      while (*v == ' ' || *v == '\t') v++;
      if (!strncmp(line, "model name", 10)) snprintf(m->model, sizeof m->model, "%.*s", (int)strcspn(v, "\n"), v);
      else if (!strncmp(line, "cpu family", 10)) m->family = atoi(v);
      else if (!strncmp(line, "model\t", 6) || !strncmp(line, "model ", 6)) m->model_number = atoi(v);
    }
    fclose(f);
  }
  m->cpus = sysconf(_SC_NPROCESSORS_ONLN);
  for (unsigned i = 0; i < 8; i++) {
    char path[96], level[16], type[32], size[32];
    snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%u/level", i);
    read_line(path, level, sizeof level);
    snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%u/type", i);
    read_line(path, type, sizeof type);
    snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%u/size", i);
    read_line(path, size, sizeof size);
    if (strcmp(type, "Unified")) continue;
    if (!strcmp(level, "2")) snprintf(m->l2, sizeof m->l2, "%s", size);
    if (!strcmp(level, "3")) snprintf(m->l3, sizeof m->l3, "%s", size);
  }
}

static void print_table(const struct opts *o) {
  char warm[48] = "";
  if (o->warmup > 0) snprintf(warm, sizeof warm, " after %.2f s of warm-up each", o->warmup);
  printf("umbp bench index: table size %llu, reps %u x %.2f s%s, medians in M ops/s (lookups, or insert+remove "
         "pairs for churn-*); ratios: medians of each repetition's ratio\n",
         (unsigned long long)o->keys, o->reps, o->seconds, warm);
  struct machine m;
  machine_read(&m);
  printf("machine: %s", m.model[0] ? m.model : "(CPU model unknown)");
  if (m.family >= 0 && m.model_number >= 0) printf(" (family %d model %d)", m.family, m.model_number);
  printf(", %ld CPUs, L2 %s, L3 %s\n", m.cpus, m.l2[0] ? m.l2 : "unknown", m.l3[0] ? m.l3 : "unknown");
  printf("rte_hash: %s\n", g_dpdk_note);
  if (g_ours_note[0]) printf("ours: %s\n", g_ours_note);
  bool mem_head = false;
  for (unsigned i = 0; i < o->n_lf; i++) {
    const struct mem_lat *a = &g_mem_ours[i], *f = &g_mem_4k[i];
    if (!a->ok) continue;
    char lfs[16];
    lf_label(o->lf[i], lfs, sizeof lfs);
    if (!mem_head) printf("memory: ns a cold line, median of the 2 MiB pieces (least-most):");
    printf("%s %s our bucket array %.0f (%.0f-%.0f), fresh 4 KiB pages %.0f (%.0f-%.0f)", mem_head ? ";" : "", lfs,
           a->med, a->lo, a->hi, f->med, f->lo, f->hi);
    mem_head = true;
  }
  if (mem_head) printf("\n");
  printf("%-28s %9s %9s %9s %9s %9s %16s\n", "case", "ours", "rte_hash", "cds_lfht", "ours/rte", "ours/lfht",
         "ours/rte p25-p75");
  /* [0]: the lookup cases the target names (hits and misses, single and
   * bulk); [1]: pin-* and churn-* rows, compared with the references' plain
   * lookups and churn */
  unsigned below[2] = {0, 0}, compared[2] = {0, 0};
  char belowlist[2][1024] = {"", ""};
  for (unsigned i = 0; i < n_cases; i++) {
    const struct case_res *c = &cases[i];
    char a[16], b[16], d[16], r1[16], r2[16], sp[32];
    fmt_v(a, sizeof a, c->v[IMPL_OURS]);
    fmt_v(b, sizeof b, c->v[IMPL_RTE]);
    fmt_v(d, sizeof d, c->v[IMPL_LFHT]);
    double x = ratio(c, IMPL_RTE), y = ratio(c, IMPL_LFHT);
    if (isnan(x)) snprintf(r1, sizeof r1, "-");
    else snprintf(r1, sizeof r1, "%.2fx", x);
    if (isnan(y)) snprintf(r2, sizeof r2, "-");
    else snprintf(r2, sizeof r2, "%.2fx", y);
    if (isnan(c->q1[IMPL_RTE])) snprintf(sp, sizeof sp, "-");
    else snprintf(sp, sizeof sp, "%.2f-%.2f", c->q1[IMPL_RTE], c->q3[IMPL_RTE]);
    printf("%-28s %9s %9s %9s %9s %9s %16s\n", c->name, a, b, d, r1, r2, sp);
    if (!isnan(x)) {
      unsigned g = !strncmp(c->name, "pin-", 4) || !strncmp(c->name, "churn", 5);
      compared[g]++;
      if (x < 1.0) {
        below[g]++;
        char *bl = belowlist[g];
        size_t l = strlen(bl), nl = strlen(c->name);
        if (l + nl + 3 < sizeof belowlist[g]) {
          if (l) memcpy(bl + l, ", ", 2), l += 2;
          memcpy(bl + l, c->name, nl + 1);
        }
      }
    }
  }
  if (compared[0])
    printf("target ours >= 1.0x rte_hash (lookups: hits and misses, single and bulk): met in %u of %u cases%s%s\n",
           compared[0] - below[0], compared[0], below[0] ? "; below: " : "", belowlist[0]);
  if (compared[1])
    printf("pin and churn rows >= 1.0x rte_hash: %u of %u%s%s\n", compared[1] - below[1], compared[1],
           below[1] ? "; below: " : "", belowlist[1]);
}

static void print_json(const struct opts *o) {
  struct jb j;
  jb_begin(&j, stdout);
  jb_obj(&j, NULL);
  jb_u64(&j, "keys", o->keys);
  jb_u64(&j, "reps", o->reps);
  jb_dbl(&j, "seconds", o->seconds);
  jb_dbl(&j, "warmup", o->warmup);
  struct machine m;
  machine_read(&m);
  jb_obj(&j, "machine");
  jb_str(&j, "cpu_model", m.model[0] ? m.model : NULL);
  if (m.family >= 0) jb_i64(&j, "cpu_family", m.family);
  else jb_null(&j, "cpu_family");
  if (m.model_number >= 0) jb_i64(&j, "cpu_model_number", m.model_number);
  else jb_null(&j, "cpu_model_number");
  jb_i64(&j, "cpus", m.cpus);
  jb_str(&j, "l2", m.l2[0] ? m.l2 : NULL);
  jb_str(&j, "l3", m.l3[0] ? m.l3 : NULL);
  jb_end_obj(&j);
  jb_bool(&j, "dpdk", g_dpdk);
  jb_str(&j, "dpdk_note", g_dpdk_note);
  if (g_ours_note[0]) {
    jb_str(&j, "ours_index_pages", g_ours_index_huge ? "2MiB" : "4KiB");
    jb_str(&j, "ours_note", g_ours_note);
  } else {
    jb_null(&j, "ours_index_pages");
    jb_null(&j, "ours_note");
  }
  jb_arr(&j, "memory_line_ns");
  for (unsigned i = 0; i < o->n_lf; i++) {
    if (!g_mem_ours[i].ok) continue;
    char lfs[16];
    lf_label(o->lf[i], lfs, sizeof lfs);
    jb_obj(&j, NULL);
    jb_str(&j, "lf", lfs);
    const struct mem_lat *m2[2] = {&g_mem_ours[i], &g_mem_4k[i]};
    static const char *const mk[2] = {"ours_buckets", "fresh_4k"};
    for (int w = 0; w < 2; w++) {
      jb_obj(&j, mk[w]);
      jb_dbl(&j, "median", m2[w]->med);
      jb_dbl(&j, "min", m2[w]->lo);
      jb_dbl(&j, "max", m2[w]->hi);
      jb_end_obj(&j);
    }
    jb_end_obj(&j);
  }
  jb_end_arr(&j);
  jb_arr(&j, "cases");
  for (unsigned i = 0; i < n_cases; i++) {
    const struct case_res *c = &cases[i];
    jb_obj(&j, NULL);
    jb_str(&j, "name", c->name);
    jb_str(&j, "unit", c->unit);
    jb_dbl(&j, "ours_mops", c->v[IMPL_OURS]);
    jb_dbl(&j, "rte_hash_mops", c->v[IMPL_RTE]);
    jb_dbl(&j, "cds_lfht_mops", c->v[IMPL_LFHT]);
    jb_dbl(&j, "ratio_rte_hash", ratio(c, IMPL_RTE));
    jb_dbl(&j, "ratio_cds_lfht", ratio(c, IMPL_LFHT));
    jb_dbl(&j, "ratio_rte_hash_p25", c->q1[IMPL_RTE]);
    jb_dbl(&j, "ratio_rte_hash_p75", c->q3[IMPL_RTE]);
    jb_dbl(&j, "ratio_cds_lfht_p25", c->q1[IMPL_LFHT]);
    jb_dbl(&j, "ratio_cds_lfht_p75", c->q3[IMPL_LFHT]);
    static const char *const rep_keys[IMPL_N] = {[IMPL_OURS] = "ours_reps", [IMPL_RTE] = "rte_hash_reps",
                                                 [IMPL_LFHT] = "cds_lfht_reps"};
    for (int impl = 0; impl < IMPL_N; impl++) {
      if (!c->rv[impl]) {
        jb_null(&j, rep_keys[impl]);
        continue;
      }
      jb_arr(&j, rep_keys[impl]);
      for (unsigned k = 0; k < c->nrep; k++) jb_dbl(&j, NULL, c->rv[impl][k]);
      jb_end_arr(&j);
    }
    jb_end_obj(&j);
  }
  jb_end_arr(&j);
  jb_end_obj(&j);
  jb_finish(&j);
}

/* ---- main ------------------------------------------------------------------------------------ */
static const char *usage_text =
    "Usage: umbp bench index [--keys N] [--seconds S] [--warmup W] [--reps R] [--lf LIST]\n"
    "                        [--filter LIST] [--impls LIST] [--seed N] [--no-dpdk] [--json]\n"
    "                        [--index-pages try|huge|small] [--rte-hugepages]\n"
    "\n"
    "Measure lookup throughput of the block index for hits and misses, one key per\n"
    "call and 32 keys per call, at each load factor, with 1 and 2 processes; and the\n"
    "same workload, in the same run, on the same keys and with the same number of\n"
    "threads, on DPDK's rte_hash and liburcu's cds_lfht, with the ratios ours/theirs.\n"
    "Also insert+remove churn while a reader runs hit lookups.\n"
    "\n"
    "Tables. Table size N: our pool gets N slots of 4 KiB (not pre-faulted; the\n"
    "slot bytes are never touched), rte_hash is created with N entries and 32-byte\n"
    "keys, cds_lfht with N buckets. At load factor LF each gets the same LF*N keys:\n"
    "32 pseudo-random bytes each; ours as umbp_key{namespace \"bench\", hash_len 32}.\n"
    "Misses look up keys that were never inserted. Keys are visited in a uniformly\n"
    "random order, precomputed, so no random-number cost is timed; every table's\n"
    "loop prefetches that stream 64 keys ahead alike, so keys come from cache, as in\n"
    "a scheduler that has just hashed them (an umbp_key is 48 bytes, a reference key\n"
    "32: read from memory, the stream alone would cost ours more).\n"
    "\n"
    "Pages. Our pools are created with the pool default --index-pages try: the\n"
    "bucket array and slot metadata (72 MiB for N = 1M) go on 2 MiB pages when a\n"
    "hugetlbfs mount has enough free (sysctl vm.nr_hugepages), else on 4 KiB\n"
    "pages; the line 'ours:' says which. rte_hash and cds_lfht use 4 KiB pages\n"
    "(EAL --no-huge; malloc). --index-pages small measures ours on 4 KiB pages,\n"
    "--rte-hugepages rte_hash on 2 MiB pages.\n"
    "\n"
    "Memory. Before the timed runs of each load factor the line 'memory:' gives\n"
    "the time a cold line takes in our bucket array and in fresh 4 KiB pages of\n"
    "this process (what rte_hash's and cds_lfht's heaps are made of): a chain of\n"
    "dependent loads over 512 lines evicted with CLFLUSH in each 2 MiB piece,\n"
    "the median of the pieces and their range, in ns (x86 only). Under a\n"
    "hypervisor one guest's 2 MiB pages can differ by 1.7x (120 and 210 ns were\n"
    "measured), and single-key lookups follow the memory their table got: read\n"
    "a run's ratios with this line (docs/bench-index.md).\n"
    "\n"
    "Calls timed. ours: umbp_contains / umbp_contains_bulk (32 keys); pin-* rows:\n"
    "umbp_lookup_pin + umbp_unpin and umbp_lookup_pin_bulk + umbp_unpin_bulk.\n"
    "rte_hash: rte_hash_lookup / rte_hash_lookup_bulk (32 keys). cds_lfht:\n"
    "cds_lfht_lookup inside urcu_memb_read_lock (bulk: 32 lookups in one read\n"
    "section; it has no bulk call). In pin-* rows the references run their plain\n"
    "lookup (again, in every repetition), which is what the pin row's figure is\n"
    "compared with.\n"
    "\n"
    "Parallelism. pN rows: ours with N processes (the second is this binary,\n"
    "fork+exec'd and attached to the pool by name), the references with N threads\n"
    "in this process. The figure is the sum over the workers.\n"
    "\n"
    "Churn. churn-LF-pN: one writer inserts and removes fresh keys (ours:\n"
    "umbp_reserve + umbp_publish + umbp_remove; rte_hash: rte_hash_add_key +\n"
    "rte_hash_del_key on a table with RTE_HASH_EXTRA_FLAGS_RW_CONCURRENCY_LF whose\n"
    "freed entries pass an rte_rcu_qsbr defer queue; cds_lfht: add_unique, lookup,\n"
    "del and call_rcu) while one reader runs single hit lookups; figure: writer\n"
    "M pairs/s. Ours reuses one slot where each partition has 8192 slots or\n"
    "more: a thread keeps a slot it removed for its next reserve\n"
    "(docs/operations.md). churn-reader-LF-pN: that reader's M lookups/s. p1:\n"
    "writer and reader are two threads; p2 (ours only): two processes; in p2\n"
    "rows the references run their two-thread churn again, in every\n"
    "repetition. Nothing drains our pool's event ring, so our removals record\n"
    "no removed events, as in any pool without an event consumer\n"
    "(docs/bench-index.md).\n"
    "\n"
    "Repetitions. A case runs R repetitions; in each, every table runs S seconds,\n"
    "one after the other (the order rotates from one repetition to the next), from\n"
    "the same place in the key stream (a different place each repetition); pN rows\n"
    "of ours start both processes at one instant. A short repetition starts with\n"
    "the caches full of the previous table's lines, as a lookup amid other work\n"
    "does; longer ones (--seconds 0.3) measure warmer tables. --warmup W measures\n"
    "warm tables with short runs: each table's timed run follows an untimed run\n"
    "of the same case for W seconds (so the two figures of a pair are S + W\n"
    "apart rather than S).\n"
    "Each table's figure is its median over the repetitions, each ratio the median\n"
    "of the repetitions' ratios. Short repetitions pair the tables closely in\n"
    "time, so that a shared machine's noise (other tenants, clock changes) hits\n"
    "them alike: with the defaults, 75 x 0.02 s, most rows' ratios stayed within\n"
    "0.06 from run to run on a shared 2-vCPU VM, where with 5 x 0.3 s a row's\n"
    "ratio moved by up to 0.77 (docs/bench-index.md).\n"
    "\n"
    "Every repetition checks the answers (a hit run must find every key, a miss\n"
    "run none); a wrong answer ends the run with exit status 1.\n"
    "\n"
    "Pools. Each load factor's pool is umbp-bench-index-PID-I, removed at the end\n"
    "of the run and on SIGINT, SIGTERM, SIGHUP or SIGQUIT. A run killed otherwise (SIGKILL,\n"
    "the OOM killer) leaves it, with its /dev/shm memory and huge pages; the next run\n"
    "removes such pools of processes that no longer exist when no process holds\n"
    "them (a run in another container sharing /dev/shm does), and says so.\n"
    "\n"
    "Options:\n"
    "  --keys N        table size N (slots, entries, buckets), 64 to 268435456\n"
    "                  (16777215 with ours); default 1048576. Our pool reserves\n"
    "                  N*4 KiB of /dev/shm memory while it runs; a table that\n"
    "                  /dev/shm or the memory cannot hold fails at once, with a\n"
    "                  --keys that fits.\n"
    "  --seconds S     length of one table's run in a repetition; default 0.02.\n"
    "  --warmup W      run each table W seconds, untimed, right before each of its\n"
    "                  timed runs (lookup and churn rows alike); default 0. A run\n"
    "                  takes (S + W) / S times as long.\n"
    "  --reps R        repetitions per case (1 to 1000), medians reported;\n"
    "                  default 75.\n"
    "  --lf LIST       load factors (keys/N), comma-separated, each in (0, 1];\n"
    "                  default 0.5,0.9. Churn rows need 80 of our N slots free\n"
    "                  beside the LF*N keys (a usage error otherwise).\n"
    "  --filter LIST   run only the cases whose name contains one of these\n"
    "                  comma-separated substrings, e.g. hit-single,churn; one that\n"
    "                  matches no case is a usage error that lists the cases.\n"
    "  --impls LIST    tables to measure, from ours,rte_hash,cds_lfht (default all;\n"
    "                  at least one); e.g. --impls ours under a profiler.\n"
    "  --seed N        seed of the keys and of the access order; default 1.\n"
    "  --no-dpdk       do not start DPDK's EAL; rte_hash columns stay empty.\n"
    "  --index-pages M our pools' index pages: try (default), huge (2 MiB pages or\n"
    "                  fail), small (4 KiB pages); see Pages.\n"
    "  --rte-hugepages start DPDK's EAL on 2 MiB pages (--in-memory, -m as below)\n"
    "                  instead of --no-huge: rte_hash's table on huge pages too.\n"
    "  --json          print one JSON object instead of the table.\n"
    "  -h, --help      this text.\n"
    "\n"
    "Output. A line per case: case name, ours, rte_hash, cds_lfht (medians, M ops/s),\n"
    "ours/rte_hash, ours/cds_lfht, and the spread of ours/rte_hash (its first and\n"
    "third quartiles over the repetitions, p25-p75); '-' where a figure was not\n"
    "measured. A ratio is the median over the repetitions of ours/theirs, each pair\n"
    "measured in the same repetition (within a second), so it need not equal the\n"
    "ratio of the medians: machine speed that drifts between repetitions cancels\n"
    "out of it. Case names:\n"
    "{hit,miss}-{single,bulk}-lfLF-pN, pin-{hit,miss}-{single,bulk}-lfLF-pN,\n"
    "churn-lfLF-pN, churn-reader-lfLF-pN. Two last lines count the rows where ours\n"
    "is at least rte_hash's figure and name the others: first the lookup cases\n"
    "(hit-*, miss-*: the target), then the pin-* and churn-* rows, which time more\n"
    "work than the reference's (a pin and an unpin against a plain lookup).\n"
    "The first lines say what ran: table size and repetitions; 'machine:' the CPU\n"
    "model (family and model number), online CPUs and CPU 0's L2 and L3 sizes as\n"
    "the kernel reports them (a VM's, as its hypervisor says); 'rte_hash:' and\n"
    "'ours:' where each table's memory was. Progress goes to stderr when it is a\n"
    "terminal.\n"
    "\n"
    "JSON (--json): {\"keys\":N, \"reps\":R, \"seconds\":S, \"warmup\":W,\n"
    "\"machine\":{\"cpu_model\":\n"
    "\"model name\", \"cpu_family\":F, \"cpu_model_number\":M, \"cpus\":C, \"l2\":\"2048K\",\n"
    "\"l3\":\"32768K\"} (the 'machine:' line), \"dpdk\":true|false,\n"
    "\"dpdk_note\":\"DPDK version and EAL arguments, or why rte_hash was not\n"
    "measured\", \"ours_index_pages\":\"2MiB\"|\"4KiB\", \"ours_note\":\"the 'ours:'\n"
    "line\" (both null when ours was not measured), \"memory_line_ns\":[{\"lf\":\"lf0.5\",\n"
    "\"ours_buckets\":{\"median\":x, \"min\":x, \"max\":x}, \"fresh_4k\":{...}}, ...] (the\n"
    "'memory:' line; empty when ours was not measured or off x86),\n"
    "\"cases\":[{\"name\":\"hit-single-lf0.5-p1\", \"unit\":\"Mlookups/s\"|\n"
    "\"Mpairs/s\", \"ours_mops\":x, \"rte_hash_mops\":x, \"cds_lfht_mops\":x,\n"
    "\"ratio_rte_hash\":x, \"ratio_cds_lfht\":x, \"ratio_rte_hash_p25\":x,\n"
    "\"ratio_rte_hash_p75\":x, \"ratio_cds_lfht_p25\":x, \"ratio_cds_lfht_p75\":x,\n"
    "\"ours_reps\":[x, ...], \"rte_hash_reps\":[...], \"cds_lfht_reps\":[...]}, ...]}\n"
    "(the *_reps: each repetition's figure, in order; *_p25, *_p75: the ratios'\n"
    "quartiles); a figure not measured is null.\n"
    "\n"
    "rte_hash needs DPDK (Debian's libdpdk-dev) at build time; its EAL is started\n"
    "with --no-huge (--in-memory with --rte-hugepages) --no-pci --no-shconf\n"
    "--no-telemetry on two of this process's\n"
    "CPUs. Without DPDK, or when EAL fails, the benchmark says why (dpdk_note) and\n"
    "still runs ours against cds_lfht (with --impls rte_hash alone: exit status 1).\n"
    "\n"
    "Exit status: 0 success; 1 runtime error (pool, table or process could not be\n"
    "created, or a table gave a wrong answer); 2 usage error; 3 a SIGBUS on a pool\n"
    "(its file truncated, or /dev/shm full).\n"
    "\n"
    "Example:\n"
    "  umbp bench index --impls ours,rte_hash --filter miss-single --reps 151\n"
    "  umbp bench index --keys 20000 --seconds 0.2 --reps 1 --json\n";

static int parse_double(const char *s, double *ret) {
  char *end;
  errno = 0;
  double v = strtod(s, &end);
  if (errno || end == s || *end || !isfinite(v)) return -EINVAL;
  *ret = v;
  return 0;
}

/* The options into o (defaults first): -1 to go on, or the exit code (CLI_OK
 * after --help, CLI_USAGE with the message printed). */
static int parse_opts(int argc, char **argv, struct opts *o) {
  memset(o, 0, sizeof *o);
  o->keys = 1u << 20;
  o->seconds = 0.02;
  o->reps = 75;
  o->seed = 1;
  o->lf[0] = 0.5;
  o->lf[1] = 0.9;
  o->n_lf = 2;
  for (int i = 0; i < IMPL_N; i++) o->impl_on[i] = true;

  enum { O_KEYS = 256, O_SECONDS, O_WARMUP, O_REPS, O_LF, O_FILTER, O_IMPLS, O_SEED, O_NODPDK, O_JSON, O_IPAGES, O_RTEHUGE };
  static const struct option lo[] = {
      {"keys", required_argument, NULL, O_KEYS},     {"seconds", required_argument, NULL, O_SECONDS},
      {"warmup", required_argument, NULL, O_WARMUP},
      {"reps", required_argument, NULL, O_REPS},     {"lf", required_argument, NULL, O_LF},
      {"filter", required_argument, NULL, O_FILTER}, {"impls", required_argument, NULL, O_IMPLS},
      {"seed", required_argument, NULL, O_SEED},     {"no-dpdk", no_argument, NULL, O_NODPDK},
      {"json", no_argument, NULL, O_JSON},           {"help", no_argument, NULL, 'h'},
      {"index-pages", required_argument, NULL, O_IPAGES}, {"rte-hugepages", no_argument, NULL, O_RTEHUGE},
      {NULL, 0, NULL, 0}};
  optind = 1;
  opterr = 0; /* our own messages name the option (cli_bad_option) */
  int c;
  while ((c = getopt_long(argc, argv, ":h", lo, NULL)) != -1) {
    char *end;
    switch (c) {
    case O_KEYS: {
      uint64_t v;
      if (cli_parse_size(optarg, &v) || v < 64 || v > (1ull << 28))
        return cli_usage_error("bench index", "--keys '%s': give a table size from 64 to 268435456", optarg);
      o->keys = v;
      break;
    }
    case O_SECONDS:
      if (parse_double(optarg, &o->seconds) || o->seconds <= 0 || o->seconds > 60)
        return cli_usage_error("bench index", "--seconds '%s': give a duration in (0, 60]", optarg);
      break;
    case O_WARMUP:
      if (parse_double(optarg, &o->warmup) || o->warmup < 0 || o->warmup > 60)
        return cli_usage_error("bench index", "--warmup '%s': give a duration in [0, 60] seconds", optarg);
      break;
    case O_REPS: {
      /* range-checked before the cast: (unsigned)4294967297 would be 1 */
      errno = 0;
      unsigned long v = cli_decimal(optarg) && !strchr(optarg, '.') ? strtoul(optarg, NULL, 10) : 0;
      if (errno || v < 1 || v > 1000) return cli_usage_error("bench index", "--reps '%s': give 1 to 1000", optarg);
      o->reps = (unsigned)v;
      break;
    }
    case O_LF: {
      o->n_lf = 0;
      char buf[256];
      snprintf(buf, sizeof buf, "%s", optarg);
      for (char *sp, *t = strtok_r(buf, ",", &sp); t; t = strtok_r(NULL, ",", &sp)) {
        double v;
        if (o->n_lf == MAX_LF || parse_double(t, &v) || v <= 0 || v > 1)
          return cli_usage_error("bench index", "--lf '%s': give up to %d load factors in (0, 1]", optarg, MAX_LF);
        /* two with one case label (0.5,0.5; or 0.1234561,0.1234562, both
         * lf0.123456) would give two rows, and two JSON cases, of one name */
        char lab[16], prev[16];
        lf_label(v, lab, sizeof lab);
        for (unsigned k = 0; k < o->n_lf; k++) {
          lf_label(o->lf[k], prev, sizeof prev);
          if (!strcmp(lab, prev))
            return cli_usage_error("bench index", "--lf '%s': two of these name the cases %s (6 significant "
                                   "digits): give each load factor once", optarg, lab);
        }
        o->lf[o->n_lf++] = v;
      }
      if (!o->n_lf) return cli_usage_error("bench index", "--lf: give at least one load factor");
      break;
    }
    case O_FILTER:
      o->filter = optarg;
      break;
    case O_IMPLS: {
      for (int i = 0; i < IMPL_N; i++) o->impl_on[i] = false;
      char buf[128];
      snprintf(buf, sizeof buf, "%s", optarg);
      for (char *sp, *t = strtok_r(buf, ",", &sp); t; t = strtok_r(NULL, ",", &sp)) {
        int k = -1;
        for (int i = 0; i < IMPL_N; i++)
          if (!strcmp(t, impl_names[i])) k = i;
        if (k < 0) return cli_usage_error("bench index", "--impls: unknown table '%s' (ours, rte_hash, cds_lfht)", t);
        o->impl_on[k] = true;
      }
      break;
    }
    case O_SEED:
      errno = 0;
      o->seed = strtoull(optarg, &end, 0);
      if (errno || *end || end == optarg) return cli_usage_error("bench index", "--seed '%s': give an integer", optarg);
      break;
    case O_NODPDK:
      o->no_dpdk = true;
      break;
    case O_RTEHUGE:
      o->rte_huge = true;
      break;
    case O_JSON:
      o->json = true;
      break;
    case O_IPAGES:
      if (cli_parse_index_pages(optarg, &o->index_pages))
        return cli_usage_error("bench index", "--index-pages '%s': use try, huge or small", optarg);
      break;
    case 'h':
      fputs(usage_text, stdout);
      return CLI_OK;
    case ':':
      return cli_usage_error("bench index", "option '%s' needs a value", argv[optind - 1]);
    default:
      return cli_bad_option("bench index", lo, argv[optind - 1]);
    }
  }
  if (optind < argc) return cli_usage_error("bench index", "unexpected argument '%s'", argv[optind]);
  /* our pool has a slot a key: more than a pool can have failed only at pool
   * creation, with a message about pool create's --capacity and --slot-size */
  if (o->impl_on[IMPL_OURS] && o->keys > CLI_MAX_SLOTS)
    return cli_usage_error("bench index", "--keys %llu: our pool has a slot a key, and a pool holds at most %u slots: "
                           "give --keys %u or less, or leave ours out (--impls rte_hash,cds_lfht)",
                           (unsigned long long)o->keys, CLI_MAX_SLOTS, CLI_MAX_SLOTS);
  /* a run that measures no table would fill the tables and print rows of '-' */
  if (!o->impl_on[IMPL_OURS] && !o->impl_on[IMPL_LFHT]) {
    if (!o->impl_on[IMPL_RTE])
      return cli_usage_error("bench index", "--impls names no table: give one or more of ours, rte_hash, cds_lfht");
    if (o->no_dpdk)
      return cli_usage_error("bench index", "--impls rte_hash with --no-dpdk measures no table: drop --no-dpdk, or "
                                            "add ours or cds_lfht to --impls");
  }
  return -1;
}

/* The rows o selects (a rough count, for the progress line). */
static unsigned count_rows(const struct opts *o) {
  unsigned total = 0;
  for (unsigned l = 0; l < o->n_lf; l++) {
    char lfs[16], name[64];
    lf_label(o->lf[l], lfs, sizeof lfs);
    for (int op = 0; op < OP_N; op++)
      for (unsigned par = 1; par <= 2; par++) {
        snprintf(name, sizeof name, "%s-%s-p%u", op_names[op], lfs, par);
        total += case_selected(o, name);
      }
    for (unsigned par = 1; par <= 2; par++) {
      /* as run_lf(): the churn pair runs when either of its names is selected */
      char rname[64];
      snprintf(name, sizeof name, "churn-%s-p%u", lfs, par);
      snprintf(rname, sizeof rname, "churn-reader-%s-p%u", lfs, par);
      total += 2 * (case_selected(o, name) || case_selected(o, rname));
    }
  }
  return total;
}

/* A --filter that selects no case: a usage error that names the cases of the
 * first load factor, rather than a run that fills the tables and prints an
 * empty table (or "cases":[]) with exit status 0. */
static int filter_matches_nothing(const struct opts *o) {
  char lfs[16], names[1024] = "";
  size_t u = 0;
  lf_label(o->lf[0], lfs, sizeof lfs);
  for (int op = 0; op < OP_N; op++)
    u += (size_t)snprintf(names + u, sizeof names - u, "%s%s-%s-pN", op ? ", " : "", op_names[op], lfs);
  snprintf(names + u, sizeof names - u, ", churn-%s-pN, churn-reader-%s-pN (N 1 or 2)", lfs, lfs);
  return cli_usage_error("bench index",
                         "--filter '%s' matches no case (a case runs when its name contains one of the "
                         "comma-separated words); the cases are %s%s",
                         o->filter, names, o->n_lf > 1 ? ", and the same for each other --lf" : "");
}

/* Our churn writer needs CHURN_LOW + 16 free slots beside the lf*N keys (a
 * reserve from an empty free queue would evict the reader's keys); with fewer
 * it only waits, and its row read 0.00 M pairs/s, ratio 0.00x, exit 0 (e.g.
 * --lf 1, or --lf 0.99 with --keys 4096). A usage error when a churn row of
 * ours is selected at such a load factor. */
static int churn_room(const struct opts *o) {
  if (!o->impl_on[IMPL_OURS]) return CLI_OK;
  for (unsigned l = 0; l < o->n_lf; l++) {
    char lfs[16], name[64], rname[64];
    bool churn = false;
    lf_label(o->lf[l], lfs, sizeof lfs);
    for (unsigned par = 1; par <= 2; par++) {
      snprintf(name, sizeof name, "churn-%s-p%u", lfs, par);
      snprintf(rname, sizeof rname, "churn-reader-%s-p%u", lfs, par);
      churn = churn || case_selected(o, name) || case_selected(o, rname);
    }
    uint64_t nins = (uint64_t)llround(o->lf[l] * (double)o->keys), need = CHURN_LOW + 16;
    if (nins < 1) nins = 1;
    if (!churn || o->keys >= nins + need) continue;
    char most[32] = "";
    if (o->keys > need) /* the largest load factor, in thousandths, that leaves `need` slots free */
      snprintf(most, sizeof most, "--lf %g or lower, ",
               floor((double)(o->keys - need) / (double)o->keys * 1000) / 1000);
    return cli_usage_error("bench index", "--lf %g at --keys %llu leaves %llu free slot%s in our pool, and its churn "
                           "writer needs %llu: give %sa larger --keys, or a --filter without churn",
                           o->lf[l], (unsigned long long)o->keys, (unsigned long long)(o->keys - nins),
                           o->keys - nins == 1 ? "" : "s", (unsigned long long)need, most);
  }
  return CLI_OK;
}

/* What --keys N costs, checked before anything is made (keys_fit()), so that
 * a table too large for this machine fails at once with a --keys that fits,
 * rather than after DPDK's EAL is up, inside pool creation with a message
 * about pool create's --capacity, or by the OOM killer.
 * /dev/shm: our pool, counted whole as the library counts it before creating
 * it (src/shm/segment.c, check_fits()), although no_prefault never writes the
 * slot bytes: 4 KiB a slot, plus its index and metadata (160 bytes a slot at
 * 1M slots; 256 counted), plus headers, rings and 2 MiB alignment (16 MiB).
 * Memory (MemAvailable): what the tables write: our index (256 bytes a key, as
 * above), rte_hash's EAL heap (320 bytes an entry: dpdk_start()'s -m), a
 * cds_lfht node and bucket (96 bytes); and the key streams (2 x 48 MiB in
 * each of our processes, 2 x 32 MiB for the references) with slack. */
#define SHM_PER_KEY (4096ull + 256)
#define SHM_FIXED (16ull << 20) /* 8 MiB measured for 64 slots: 64 refused 8192 keys on Docker's 64 MiB */
#define MEM_FIXED (512ull << 20)

static uint64_t meminfo_avail(void) {
  FILE *f = fopen("/proc/meminfo", "re");
  if (!f) return 0;
  char line[256];
  unsigned long long kb = 0;
  while (fgets(line, sizeof line, f))
    if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) break;
  fclose(f);
  return (uint64_t)kb * 1024;
}

/* CLI_OK, or CLI_RUNTIME with a message naming --keys, what it needs and a
 * --keys that fits (rounded down to a multiple of 1024). */
static int keys_fit(const struct opts *o) {
  char need[32], have[32];
  uint64_t n = o->keys, fit;
  uint64_t mem = meminfo_avail();
  struct statvfs sv;
  if (o->impl_on[IMPL_OURS] && statvfs("/dev/shm", &sv) == 0) {
    /* the library wants the whole pool both free in /dev/shm and available
     * as memory (MemAvailable) */
    uint64_t shm = (uint64_t)sv.f_bavail * sv.f_frsize;
    bool by_mem = mem && mem < shm;
    uint64_t avail = by_mem ? mem : shm;
    if (n * SHM_PER_KEY + SHM_FIXED > avail) {
      fit = (avail > SHM_FIXED ? (avail - SHM_FIXED) / SHM_PER_KEY : 0) & ~1023ull;
      cli_fmt_size(n * SHM_PER_KEY + SHM_FIXED, need, sizeof need);
      cli_fmt_size(avail, have, sizeof have);
      char give[64] = "";
      if (fit >= 64) snprintf(give, sizeof give, "give --keys %llu or less, or ", (unsigned long long)fit);
      cli_error("bench index: --keys %llu: our pool needs %s of /dev/shm (4 KiB a slot, reserved though never "
                "written, and its index), and as much memory available, but %s %s%s: %s%s",
                (unsigned long long)n, need, by_mem ? "the machine has" : "/dev/shm has", have,
                by_mem ? " available (MemAvailable)" : " free", give,
                by_mem ? "free some memory"
                       : "enlarge /dev/shm (mount -o remount,size=<N>G /dev/shm, or docker run --shm-size=<N>g)");
      return CLI_RUNTIME;
    }
  }
  uint64_t per = (o->impl_on[IMPL_OURS] ? 256 : 0) + (o->impl_on[IMPL_RTE] && !o->no_dpdk ? 320 : 0) +
                 (o->impl_on[IMPL_LFHT] ? 96 : 0);
  if (mem && per && n * per + MEM_FIXED > mem) {
    fit = (mem > MEM_FIXED ? (mem - MEM_FIXED) / per : 0) & ~1023ull;
    cli_fmt_size(n * per + MEM_FIXED, need, sizeof need);
    cli_fmt_size(mem, have, sizeof have);
    char give[64] = "";
    if (fit >= 64) snprintf(give, sizeof give, "give --keys %llu or less, ", (unsigned long long)fit);
    cli_error("bench index: --keys %llu: the tables need about %s of memory but the machine has %s available "
              "(MemAvailable): %smeasure fewer tables (--impls), or free some memory",
              (unsigned long long)n, need, have, give);
    return CLI_RUNTIME;
  }
  return CLI_OK;
}

int bench_index_main(int argc, char **argv) {
  for (int i = 1; i < argc; i++)
    if (!strcmp(argv[i], "--child")) return child_main(argc, argv);

  struct opts o;
  int prc = parse_opts(argc, argv, &o);
  if (prc >= 0) return prc;

  g_progress = cli_stderr_tty();
  g_total = count_rows(&o);
  if (!g_total) return filter_matches_nothing(&o);
  if (churn_room(&o)) return CLI_USAGE;

  int se = cli_fatal_signals(on_signal);
  if (se) {
    cli_error("bench index: cannot start its signal thread: %s", strerror(-se));
    return CLI_RUNTIME;
  }
  signal(SIGPIPE, SIG_IGN);

  sweep_stale_pools(); /* first: the pools it removes free /dev/shm for keys_fit() */
  if (keys_fit(&o)) return CLI_RUNTIME;
  urcu_memb_register_thread();
  dpdk_start(&o);
  if (!g_dpdk && !o.impl_on[IMPL_OURS] && !o.impl_on[IMPL_LFHT]) {
    /* --impls rte_hash alone and no EAL: every row would be '-', exit 0 */
    cli_error("bench index: --impls rte_hash: %s; nothing else to measure", g_dpdk_note);
    urcu_memb_unregister_thread();
    return CLI_RUNTIME;
  }
  if (!o.json || g_progress)
    if (!g_dpdk) fprintf(stderr, "umbp: bench index: %s\n", g_dpdk_note);

  int err = 0;
  for (unsigned l = 0; l < o.n_lf && !err; l++) {
    struct bench b;
    memset(&b, 0, sizeof b);
    b.o = &o;
    b.n = o.keys;
    b.lf = o.lf[l];
    b.nins = (uint64_t)llround(o.lf[l] * (double)o.keys);
    if (b.nins < 1) b.nins = 1;
    err = run_lf(&b, l);
  }
  if (g_progress) fprintf(stderr, "\r\033[K");
  if (g_churn_waits)
    fprintf(stderr,
            "umbp: bench index: note: our churn writer waited %llu times for its free queue to hold %d slots "
            "again\n",
            (unsigned long long)g_churn_waits, CHURN_LOW + 16);
  if (!err) {
    if (o.json) print_json(&o);
    else print_table(&o);
  }
  dpdk_stop();
  urcu_memb_unregister_thread();
  return err ? CLI_RUNTIME : CLI_OK;
}
