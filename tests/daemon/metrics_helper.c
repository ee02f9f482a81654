/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Exec'd by check_metrics.py (the daemon's /metrics and inspect --stat), so
 * each process maps the pool at its own address.
 *
 *   metrics_helper store NAME NSNAME FIRST COUNT
 *       register namespace NSNAME, publish keys FIRST..FIRST+COUNT-1, detach;
 *       prints "stored N".
 *   metrics_helper lookup NAME NSNAME FIRST COUNT
 *       look up (pin, check the bytes, unpin) keys FIRST..FIRST+COUNT-1,
 *       detach (which flushes the counters); prints "hits H misses M".
 *   metrics_helper hold NAME
 *       attach, print "attached", and wait to be killed.
 *   metrics_helper hold-pins NAME NSNAME COUNT
 *       publish keys 0..COUNT-1 of NSNAME and pin each, print "pinned N",
 *       and wait to be killed (or stopped).
 *   metrics_helper churn NAME NSNAME MS
 *       turn event recording on (a first drain), then for MS milliseconds
 *       publish and remove blocks on a second thread (a removed event each,
 *       faster than they are drained: the ring overflows) while this one
 *       drains up to 4096 events every 20 ms (bursts that move the dequeue
 *       position far: what made a scrape's drained estimate step back most
 *       often); prints "drained D dropped X".
 *   metrics_helper events-offset NAME
 *       print the offset of the event-ring region in the pool's file (read
 *       from its header through a read-only attach): the regions before it
 *       (registry, index header, free rings) are what the daemon's own
 *       threads touch; the scrape also reads this one and those after it.
 * Exit 0, 1 on a failure (with the library's message), 2 usage.
 */
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

#include "index_test_util.h"
#include "shm/layout.h"
#include "umbp/admin.h"
#include "umbp/index.h"
#include "umbp/pool.h"

static atomic_bool churn_stop;
static umbp_pool *churn_pool;
static uint32_t churn_ns;

static void *churn_producer(void *arg) {
  (void)arg;
  for (uint64_t id = 0; !atomic_load(&churn_stop); id++) {
    umbp_key k = itu_key(churn_ns, id, 0);
    uint32_t s;
    if (umbp_reserve(churn_pool, -1, churn_ns, &s) == 0 && umbp_publish(churn_pool, s, &k) == 0)
      umbp_remove(churn_pool, &k);
  }
  return NULL;
}

int main(int argc, char **argv) {
  bool four = argc > 1 && (!strcmp(argv[1], "hold-pins") || !strcmp(argv[1], "churn")); /* NAME NSNAME N */
  if (argc < 3 || (strcmp(argv[1], "hold") && strcmp(argv[1], "events-offset") && !four && argc < 6) ||
      (four && argc < 5)) {
    fprintf(stderr, "usage: see the comment at the top of metrics_helper.c\n");
    return 2;
  }
  prctl(PR_SET_PDEATHSIG, SIGKILL); /* never outlive a failed test */
  umbp_attach_opts o;
  umbp_attach_opts_init(&o);
  if (!strcmp(argv[1], "events-offset")) {
    umbp_pool *p;
    void *base;
    size_t len;
    o.read_only = true;
    o.role = UMBP_ROLE_TOOL;
    if (umbp_pool_attach(argv[2], &o, &p) || umbp_admin_pool_mapping(p, &base, &len)) {
      printf("attach %s\n", umbp_last_error());
      return 1;
    }
    printf("%llu\n", (unsigned long long)((const struct umbp_shm_header *)base)->regions[UMBP_REG_EVENTS].offset);
    umbp_pool_detach(p);
    return 0;
  }
  o.role = UMBP_ROLE_WORKER;
  umbp_pool *p;
  int rc = umbp_pool_attach(argv[2], &o, &p);
  if (rc) {
    printf("attach %d %s\n", rc, umbp_last_error());
    return 1;
  }
  if (!strcmp(argv[1], "hold")) {
    printf("attached\n");
    fflush(stdout);
    for (;;) pause();
  }
  uint32_t ns;
  if ((rc = umbp_ns_register(p, argv[3], &ns)) != 0) {
    printf("ns_register %d %s\n", rc, umbp_last_error());
    return 1;
  }
  if (!strcmp(argv[1], "churn")) {
    static umbp_event ev[4096];
    uint64_t drained = 0;
    churn_pool = p;
    churn_ns = ns;
    umbp_events_drain(p, NULL, 0); /* removals record events from now on */
    pthread_t t;
    if (pthread_create(&t, NULL, churn_producer, NULL)) return 1;
    struct timespec now, gap = {0, 20000000};
    clock_gettime(CLOCK_MONOTONIC, &now);
    uint64_t end = (uint64_t)now.tv_sec * 1000000000ull + (uint64_t)now.tv_nsec;
    end += strtoull(argv[4], NULL, 10) * 1000000ull;
    do {
      int n = umbp_events_drain(p, ev, 4096);
      if (n > 0) drained += (uint64_t)n;
      nanosleep(&gap, NULL);
      clock_gettime(CLOCK_MONOTONIC, &now);
    } while ((uint64_t)now.tv_sec * 1000000000ull + (uint64_t)now.tv_nsec < end);
    atomic_store(&churn_stop, true);
    pthread_join(t, NULL);
    printf("drained %llu dropped %llu\n", (unsigned long long)drained, (unsigned long long)umbp_events_dropped(p));
    umbp_pool_detach(p);
    return 0;
  }
  if (!strcmp(argv[1], "hold-pins")) {
    unsigned n = (unsigned)atoi(argv[4]), pinned = 0;
    for (unsigned id = 0; id < n; id++) {
      umbp_key k = itu_key(ns, id, 0);
      uint32_t s;
      if (umbp_reserve(p, -1, ns, &s) || umbp_publish(p, s, &k) || umbp_lookup_pin(p, &k, &s)) {
        printf("hold-pins: %s\n", umbp_last_error());
        return 1;
      }
      pinned++;
    }
    printf("pinned %u\n", pinned);
    fflush(stdout);
    for (;;) pause();
  }
  uint64_t first = strtoull(argv[4], NULL, 10), count = strtoull(argv[5], NULL, 10);
  uint64_t slot_size = umbp_slot_size(p), a = 0, b = 0;
  for (uint64_t id = first; id < first + count; id++) {
    umbp_key k = itu_key(ns, id, 0);
    uint32_t s;
    if (!strcmp(argv[1], "store")) {
      if ((rc = umbp_reserve(p, -1, ns, &s)) != 0 || (itu_fill(umbp_slot_ptr(p, s), slot_size, &k), 0) ||
          (rc = umbp_publish(p, s, &k)) != 0) {
        printf("store %d %s\n", rc, umbp_last_error());
        return 1;
      }
      a++;
    } else if (umbp_lookup_pin(p, &k, &s) == 0) {
      if (!itu_check(umbp_slot_ptr(p, s), slot_size, &k)) {
        printf("torn block %llu\n", (unsigned long long)id);
        return 1;
      }
      umbp_unpin(p, s);
      a++;
    } else {
      b++;
    }
  }
  umbp_pool_detach(p);
  if (!strcmp(argv[1], "store")) printf("stored %llu\n", (unsigned long long)a);
  else printf("hits %llu misses %llu\n", (unsigned long long)a, (unsigned long long)b);
  return 0;
}
