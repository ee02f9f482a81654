/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Exec'd by the index's multi-process tests, so each process maps the pool at
 * its own address.
 *
 *   index_helper work NAME NS SEED SECONDS THREADS KEYS
 *       random reserve/publish/lookup_pin/verify/unpin/remove; prints
 *       "ops N torn T" and exits 0 (3 if any torn read).
 *   index_helper chaos NAME NS SEED THREADS KEYS
 *       the same loop until killed; a torn read exits 99 at once.
 *   index_helper die-at POINT NAME NS
 *       leave the pool exactly as a process killed at POINT would, then
 *       SIGKILL itself. POINTs: ring-claimed (a free-slot dequeue claimed, the
 *       slot not yet reserved), reserved (slots reserved, not published),
 *       linked (way inserted, state not yet published), pinned (pins held),
 *       evicting (state EVICTING, way still linked), freeing (ledger set, state
 *       FREE, not yet on the queue), reading (reader in a read section).
 *   index_helper fork-hold NAME NS quiet|use
 *       publish and pin 40 blocks (ids 5000..5039), reserve 4 slots, then a
 *       plain fork(): the child (quiet) prints "child PID" and sleeps without
 *       touching umbp, or (use) first calls umbp_lookup_pin and umbp_reserve on
 *       the inherited handle and prints "child PID lookup RC reserve RC MSG";
 *       the parent prints "parent" and waits to be killed. The child sleeps
 *       60 s at most.
 */
#include <pthread.h>
#include <sys/prctl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "index/index_inline.h"
#include "index_test_util.h"
#include "shm/ring_claim.h"

struct wctx {
  umbp_pool *p;
  uint32_t ns;
  uint64_t seed, keys;
  double seconds; /* < 0: forever */
  bool lookups_only; /* lookups and pins only (no reserve, publish, remove) */
  unsigned long ops, torn;
};

static void unpin_checked(struct wctx *w, uint32_t s, const umbp_key *k, uint64_t slot_size) {
  if (!itu_check(umbp_slot_ptr(w->p, s), slot_size, k)) {
    w->torn++;
    if (w->seconds < 0) _exit(99);
  }
  umbp_unpin(w->p, s);
}

static void *work(void *arg) {
  struct wctx *w = arg;
  umbp_pool *p = w->p;
  uint64_t rng = w->seed;
  uint64_t slot_size = umbp_slot_size(p);
  uint64_t end = w->seconds < 0 ? UINT64_MAX : umbp_now_ns() + (uint64_t)(w->seconds * 1e9);
  /* pins kept a while; their bytes are checked again at unpin: a pinned
   * block must not be evicted or reused under its reader */
  uint32_t held[8];
  umbp_key heldk[8];
  unsigned nheld = 0;
  while (umbp_now_ns() < end) {
    rng = itu_mix(rng);
    umbp_key k = itu_key(w->ns, rng % w->keys, 0);
    unsigned op = (unsigned)(rng >> 40) % 16;
    if (w->lookups_only) op = 5 + op % 9; /* 5..13: single and bulk lookups */
    uint32_t s;
    if (op < 5) {
      if (umbp_reserve(p, -1, w->ns, &s) == 0) {
        itu_fill(umbp_slot_ptr(p, s), slot_size, &k);
        if ((op & 1) && (rng >> 20) % 7 == 0) umbp_abort(p, s);
        else umbp_publish(p, s, &k);
      }
    } else if (op < 13) {
      if (umbp_lookup_pin(p, &k, &s) == 0) {
        if (!itu_check(umbp_slot_ptr(p, s), slot_size, &k)) {
          w->torn++;
          if (w->seconds < 0) _exit(99);
        }
        if (nheld < 8 && (rng >> 50) % 4 == 0) { /* keep some pins a while */
          heldk[nheld] = k;
          held[nheld++] = s;
        } else {
          umbp_unpin(p, s);
        }
      }
    } else if (op < 14) {
      umbp_key ks[8];
      uint32_t ss[8];
      for (int i = 0; i < 8; i++) ks[i] = itu_key(w->ns, (rng + (uint64_t)i) % w->keys, 0);
      int n = umbp_lookup_pin_bulk(p, 8, ks, ss);
      if (n > 0) {
        for (int i = 0; i < 8; i++)
          if (ss[i] != UMBP_NO_SLOT && !itu_check(umbp_slot_ptr(p, ss[i]), slot_size, &ks[i])) {
            w->torn++;
            if (w->seconds < 0) _exit(99);
          }
        umbp_unpin_bulk(p, 8, ss);
      }
    } else {
      umbp_remove(p, &k);
    }
    if (nheld && (rng >> 33) % 3 == 0) {
      nheld--;
      unpin_checked(w, held[nheld], &heldk[nheld], slot_size);
    }
    w->ops++;
  }
  while (nheld) {
    nheld--;
    unpin_checked(w, held[nheld], &heldk[nheld], slot_size);
  }
  umbp_counters_flush(p);
  return NULL;
}

static int run_workers_x(umbp_pool *p, uint32_t ns, uint64_t seed, double seconds, unsigned threads, uint64_t keys,
                         bool lookups_only) {
  pthread_t th[16];
  struct wctx w[16];
  if (threads > 16) threads = 16;
  for (unsigned i = 0; i < threads; i++) {
    w[i] = (struct wctx){
        .p = p, .ns = ns, .seed = seed * 131 + i, .keys = keys, .seconds = seconds, .lookups_only = lookups_only};
    pthread_create(&th[i], NULL, work, &w[i]);
  }
  unsigned long ops = 0, torn = 0;
  for (unsigned i = 0; i < threads; i++) {
    pthread_join(th[i], NULL);
    ops += w[i].ops;
    torn += w[i].torn;
  }
  printf("ops %lu torn %lu\n", ops, torn);
  fflush(stdout);
  return torn ? 3 : 0;
}

static int run_workers(umbp_pool *p, uint32_t ns, uint64_t seed, double seconds, unsigned threads, uint64_t keys) {
  return run_workers_x(p, ns, seed, seconds, threads, keys, false);
}

static void die(void) {
  fflush(stdout);
  raise(SIGKILL);
}

/* The first steps of a namespace count change (namespaces.c), as the
 * calling thread: the record (namespace, slot, new flag) and, if `applied`,
 * the count word's CAS; the caller then dies before the flag is set. */
static void count_change(umbp_pool *p, uint32_t ns, uint32_t s, uint8_t f, bool applied) {
  struct umbp_index *ix = p->index;
  struct tl_slot *t = thread_slot(ix);
  struct umbp_reader_shm *rec = &ix->readers[t->tid];
  uint64_t old = NSW_COUNT(atomic_load(&ix->ns[ns].count_word));
  umbp_ix_ns_count_begin(rec, ns, s, f);
  if (applied) umbp_ix_ns_count_apply(ix->lines, &ix->ns[ns], rec, (unsigned)p->proc_slot * UMBP_MAX_THREADS + t->tid + 1);
  printf("count %llu -> %s\n", (unsigned long long)old, applied ? "applied" : "not applied");
}

/* Stop (SIGSTOP, by the library's test hook) at an exact point of a real
 * publish, removal, free or reap: count-applied (publish of key 424242, its
 * count word changed, the slot's flag not yet), publish-linked (the same key
 * linked and PUBLISHED, before the duplicate check), remove-unlinked (block 0
 * EVICTING and unlinked, before it is counted out and freed), free-queued
 * (a reserved slot, printed as "slot N", aborted: on its free ring, its
 * ledger entry not yet cleared), reap-ledger (umbp_pool_reap() of a dead
 * process whose ledger names a FREE slot, before it looks for the slot on
 * the ring), ring-filling (a slot of partition 0 reserved, printed as "slot
 * N", and its id enqueued on the free ring by the ring's own enqueue, stopped
 * by the ring's test hook after the cell's claim; resumed, it publishes the
 * entry, now stale, and aborts the slot). Resumed, it finishes the call and
 * prints its result. */
static void stop_on_claim(int point, void *ring, uint64_t pos, uint16_t owner) {
  (void)ring, (void)pos, (void)owner;
  if (point == UMBP_RING_HOOK_PRODUCER_CLAIMED) raise(SIGSTOP);
}

static int stop_at(const char *point, umbp_pool *p, uint32_t ns) {
  int rc;
  umbp_key k = itu_key(ns, 424242, 0);
  if (!strcmp(point, "count-applied") || !strcmp(point, "publish-linked")) {
    uint32_t s;
    if (umbp_reserve(p, -1, ns, &s)) return 4;
    itu_fill(umbp_slot_ptr(p, s), umbp_slot_size(p), &k);
    umbp_ix_stop_at = !strcmp(point, "count-applied") ? UMBP_STOP_COUNT_APPLIED : UMBP_STOP_PUBLISH_LINKED;
    rc = umbp_publish(p, s, &k);
  } else if (!strcmp(point, "remove-unlinked")) {
    umbp_key k0 = itu_key(ns, 0, 0);
    umbp_ix_stop_at = UMBP_STOP_REMOVE_UNLINKED;
    rc = umbp_remove(p, &k0);
  } else if (!strcmp(point, "free-queued")) {
    uint32_t s;
    if (umbp_reserve(p, -1, ns, &s)) return 4;
    printf("slot %u\n", s);
    fflush(stdout);
    umbp_ix_stop_at = UMBP_STOP_FREE_QUEUED;
    rc = umbp_abort(p, s);
  } else if (!strcmp(point, "ring-filling")) {
    /* a free of a reserved slot stopped between its claim of a free-ring
     * cell and its publish of the entry: consumers cannot pass the cell */
    uint32_t s;
    if (umbp_reserve(p, 0, ns, &s)) return 4;
    printf("slot %u\n", s);
    fflush(stdout);
    union {
      uint64_t v;
      unsigned char b[UMBP_RING_MAX_ELEM];
    } e = {.v = s};
    umbp_ring_test_hook = stop_on_claim;
    unsigned n = umbp_ring_enqueue_burst_g(p->index->rings[0], &p->index->ring_geo[0], &e, 1, p->owner_id);
    umbp_ring_test_hook = 0;
    /* the entry is stale (the slot is still reserved); the abort frees it */
    rc = n == 1 ? umbp_abort(p, s) : -ENOSPC;
  } else if (!strcmp(point, "reap-ledger")) {
    umbp_ix_stop_at = UMBP_STOP_REAP_LEDGER;
    rc = umbp_pool_reap(p);
  } else {
    fprintf(stderr, "unknown point %s\n", point);
    return 2;
  }
  printf("done %d\n", rc);
  fflush(stdout);
  umbp_pool_detach(p);
  return 0;
}

static int die_at(const char *point, umbp_pool *p, uint32_t ns) {
  struct umbp_index *ix = p->index;
  uint32_t s;
  umbp_key k = itu_key(ns, 424242, 0);
  printf("dying-at %s\n", point);
  if (!strcmp(point, "ring-claimed")) {
    union {
      uint64_t v;
      unsigned char b[UMBP_RING_MAX_ELEM];
    } e;
    struct umbp_ring_claim c;
    if (umbp_ring_dequeue_begin(ix->rings[0], &ix->ring_geo[0], &e, p->owner_id, &c) != 0) return 4;
    die();
  }
  if (!strcmp(point, "reserved")) {
    uint32_t ss[5];
    if (umbp_reserve_bulk(p, -1, ns, 5, ss) != 5) return 4;
    die();
  }
  /* counting-in / counted-in: killed inside publish's count change (the
   * slot linked, the namespace's count lock held, the journal written, the
   * counted flag set), before the count store / after it.
   * counting-out: killed inside an eviction's count change (block 0's slot
   * EVICTING and unlinked, lock held, journal written, flag cleared, count
   * not yet). */
  bool counting = !strcmp(point, "counting-in") || !strcmp(point, "counted-in");
  if (!strcmp(point, "linked") || counting) {
    if (umbp_reserve(p, -1, ns, &s)) return 4;
    struct umbp_key_shm ks;
    memset(&ks, 0, sizeof ks);
    ks.ns = k.ns;
    ks.hash_len = k.hash_len;
    memcpy(ks.hash, k.hash, k.hash_len);
    ix->meta[s].key = ks;
    uint64_t h = umbp_key_hash(&ks);
    struct umbp_bucket *b = &ix->buckets[umbp_bucket_home(h, ix->nb)];
    for (int w = 0; w < UMBP_BUCKET_WAYS; w++) {
      uint32_t z = 0;
      if (atomic_compare_exchange_strong(&b->slot[w], &z, umbp_way_word(umbp_key_sig(h), s))) {
        atomic_store(&b->sig[w], (uint8_t)umbp_key_sig(h));
        break;
      }
    }
    if (counting) count_change(p, ns, s, 1, !strcmp(point, "counted-in"));
    die();
  }
  if (!strcmp(point, "pinned")) {
    /* pin every block published by the test (ids 0..63) */
    int n = 0;
    for (uint64_t i = 0; i < 64; i++) {
      umbp_key kk = itu_key(ns, i, 0);
      if (umbp_lookup_pin(p, &kk, &s) == 0) n++;
      if (umbp_lookup_pin(p, &kk, &s) == 0) n++; /* twice: counts, not flags */
    }
    printf("pinned %d\n", n);
    die();
  }
  if (!strcmp(point, "evicting") || !strcmp(point, "counting-out")) {
    umbp_key kk = itu_key(ns, 0, 0);
    uint64_t st = 0;
    struct umbp_key_shm ks;
    memset(&ks, 0, sizeof ks);
    ks.ns = kk.ns;
    ks.hash_len = kk.hash_len;
    memcpy(ks.hash, kk.hash, kk.hash_len);
    for (s = 0; s < ix->slot_count; s++)
      if (!memcmp(&ix->meta[s].key, &ks, sizeof ks)) break;
    if (s == ix->slot_count) return 4;
    st = atomic_load(&ix->meta[s].state);
    if (!atomic_compare_exchange_strong(&ix->meta[s].state, &st, ST_NEXT(st, UMBP_SLOT_EVICTING, p->owner_id)))
      return 4;
    if (!strcmp(point, "counting-out")) {
      /* as try_remove() does once the pins were seen clear: unlink, then count out */
      uint64_t h = umbp_key_hash(&ks);
      uint32_t home = umbp_bucket_home(h, ix->nb);
      for (unsigned d = 0; d < UMBP_MAX_PROBE; d++) {
        struct umbp_bucket *b = &ix->buckets[umbp_bucket_at(home, d, ix->nb)];
        for (int w = 0; w < UMBP_BUCKET_WAYS; w++) {
          uint32_t v = atomic_load(&b->slot[w]);
          if (UMBP_WAY_SLOT(v) != s + 1) continue;
          atomic_store(&b->sig[w], 0);
          atomic_store(&b->slot[w], 0);
          if (d) umbp_ovf_sub(&ix->buckets[home].ovf);
        }
      }
      count_change(p, ns, s, 0, false);
    }
    die();
  }
  if (!strcmp(point, "freeing")) {
    if (umbp_reserve(p, -1, ns, &s)) return 4;
    struct umbp_proc_slot *ps = &p->procs[p->proc_slot];
    atomic_store(&ps->inflight_slot[1], s);
    uint64_t w = atomic_load(&ix->meta[s].state);
    atomic_store(&ix->meta[s].state, ST_NEXT(w, UMBP_SLOT_FREE, 0));
    die();
  }
  fprintf(stderr, "unknown point %s\n", point);
  return 2;
}

int main(int argc, char **argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: see the comment at the top of index_helper.c\n");
    return 2;
  }
  const char *mode = argv[1];
  prctl(PR_SET_PDEATHSIG, SIGKILL); /* never outlive a failed test */
  const char *name = !strcmp(mode, "die-at") || !strcmp(mode, "stop-at") ? argv[3] : argv[2];
  umbp_pool *p;
  umbp_attach_opts o;
  umbp_attach_opts_init(&o);
  o.role = UMBP_ROLE_WORKER;
  int rc = umbp_pool_attach(name, &o, &p);
  if (rc) {
    printf("attach %d %s\n", rc, umbp_last_error());
    return 1;
  }
  if (!strcmp(mode, "work") && argc >= 8) {
    rc = run_workers(p, (uint32_t)atoi(argv[3]), strtoull(argv[4], 0, 10), atof(argv[5]), (unsigned)atoi(argv[6]),
                     strtoull(argv[7], 0, 10));
    umbp_pool_detach(p);
    return rc;
  }
  if (!strcmp(mode, "chaos") && argc >= 7) {
    printf("ready\n");
    fflush(stdout);
    return run_workers(p, (uint32_t)atoi(argv[3]), strtoull(argv[4], 0, 10), -1, (unsigned)atoi(argv[5]),
                       strtoull(argv[6], 0, 10));
  }
  if (!strcmp(mode, "chaos-read") && argc >= 7) {
    printf("ready\n");
    fflush(stdout);
    return run_workers_x(p, (uint32_t)atoi(argv[3]), strtoull(argv[4], 0, 10), -1, (unsigned)atoi(argv[5]),
                         strtoull(argv[6], 0, 10), true);
  }
  if (!strcmp(mode, "fork-hold") && argc >= 5) {
    uint32_t ns = (uint32_t)atoi(argv[3]), s;
    for (uint64_t i = 0; i < 40; i++) {
      umbp_key k = itu_key(ns, 5000 + i, 0);
      if (umbp_reserve(p, -1, ns, &s) || umbp_publish(p, s, &k) || umbp_lookup_pin(p, &k, &s)) {
        printf("setup failed: %s\n", umbp_last_error());
        return 1;
      }
    }
    for (int i = 0; i < 4; i++)
      if (umbp_reserve(p, -1, ns, &s)) {
        printf("reserve failed: %s\n", umbp_last_error());
        return 1;
      }
    fflush(stdout);
    pid_t c = fork();
    if (c < 0) return 1;
    if (c == 0) {
      if (!strcmp(argv[4], "use")) {
        umbp_key k = itu_key(ns, 5000, 0);
        int r1 = umbp_lookup_pin(p, &k, &s);
        int r2 = umbp_reserve(p, -1, ns, &s);
        printf("child %d lookup %d reserve %d %s\n", (int)getpid(), r1, r2, umbp_last_error());
        umbp_pool_detach(p); /* frees the inherited handle, touches nothing shared */
      } else {
        printf("child %d\n", (int)getpid());
      }
      fflush(stdout);
      sleep(60);
      _exit(0);
    }
    printf("parent\n");
    fflush(stdout);
    for (;;) pause();
  }
  if (!strcmp(mode, "die-at") && argc >= 5) return die_at(argv[2], p, (uint32_t)atoi(argv[4]));
  if (!strcmp(mode, "stop-at") && argc >= 5) return stop_at(argv[2], p, (uint32_t)atoi(argv[4]));
  fprintf(stderr, "bad arguments\n");
  return 2;
}
