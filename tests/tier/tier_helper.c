/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Exec'd by tests/tier/test_feed.c, so each process maps the pool (and the
 * feed and tier files) at its own address.
 *
 *   tier_helper publish NAME FIRST COUNT
 *       attach (before or after the feed exists), publish COUNT blocks with
 *       ids FIRST.., print "owner N" and "done", exit 0.
 *   tier_helper consume NAME CONSUMER
 *       open the feed as CONSUMER, print "open", then read forever (a test
 *       stops it with SIGSTOP or kills it).
 *   tier_helper consume-fork NAME CONSUMER
 *       open the feed as CONSUMER, fork a child that only sleeps (no exec),
 *       print "open CHILDPID" once the child runs, then read forever.
 *   tier_helper serve-take NAME
 *       serve the pool's tier table (state connected), print "serving", take
 *       one request, print "took N", then sleep until killed.
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <signal.h>
#include <string.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

#include "umbp/feed.h"
#include "umbp/index.h"
#include "umbp/pool.h"
#include "umbp/tier.h"

static umbp_pool *attach(const char *name) {
  umbp_pool *p;
  umbp_attach_opts o;
  umbp_attach_opts_init(&o);
  if (umbp_pool_attach(name, &o, &p)) {
    fprintf(stderr, "attach: %s\n", umbp_last_error());
    exit(2);
  }
  return p;
}

static void mkkey(umbp_key *k, uint32_t ns, uint64_t id) {
  memset(k, 0, sizeof *k);
  k->ns = ns;
  k->hash_len = 8;
  memcpy(k->hash, &id, 8);
}

int main(int argc, char **argv) {
  prctl(PR_SET_PDEATHSIG, SIGKILL); /* never outlive a test that failed before killing us */
  setvbuf(stdout, NULL, _IOLBF, 0);
  if (argc >= 5 && !strcmp(argv[1], "publish")) {
    umbp_pool *p = attach(argv[2]);
    uint64_t first = strtoull(argv[3], NULL, 10), n = strtoull(argv[4], NULL, 10);
    uint32_t ns;
    if (umbp_ns_register(p, "feed-model", &ns)) return 2;
    printf("owner %d\n", umbp_pool_proc_slot(p) + 1);
    for (uint64_t i = 0; i < n; i++) {
      uint32_t s;
      umbp_key k;
      mkkey(&k, ns, first + i);
      if (umbp_reserve(p, -1, ns, &s) || umbp_publish(p, s, &k)) {
        fprintf(stderr, "publish %llu: %s\n", (unsigned long long)(first + i), umbp_last_error());
        return 3;
      }
    }
    printf("done\n");
    umbp_pool_detach(p);
    return 0;
  }
  if (argc >= 4 && !strcmp(argv[1], "consume")) {
    umbp_pool *p = attach(argv[2]);
    umbp_feed *f;
    if (umbp_feed_open(p, argv[3], NULL, &f)) {
      fprintf(stderr, "feed: %s\n", umbp_last_error());
      return 2;
    }
    printf("open\n");
    umbp_feed_entry e[64];
    for (;;) {
      if (umbp_feed_read(f, e, 64, NULL) <= 0) usleep(1000);
    }
  }
  if (argc >= 4 && !strcmp(argv[1], "consume-fork")) {
    umbp_pool *p = attach(argv[2]);
    umbp_feed *f;
    if (umbp_feed_open(p, argv[3], NULL, &f)) {
      fprintf(stderr, "feed: %s\n", umbp_last_error());
      return 2;
    }
    /* "open" only once the child is past fork(), its fork handlers run: the
     * test kills this process next and expects the name free at once */
    int pp[2];
    if (pipe(pp)) return 2;
    pid_t c = fork();
    if (c == 0) {
      close(pp[0]);
      if (write(pp[1], "r", 1) != 1) _exit(2);
      /* it outlives this process (the test kills us and then it): with
       * meson's stdout and stderr given up, a test that fails before its
       * kill does not leave meson waiting on them; alarm: it ends anyway */
      int nul = open("/dev/null", O_RDWR);
      if (nul >= 0) {
        dup2(nul, 1);
        dup2(nul, 2);
      }
      alarm(120);
      for (;;) pause();
    }
    close(pp[1]);
    char r;
    if (c < 0 || read(pp[0], &r, 1) != 1) return 2;
    close(pp[0]);
    printf("open %d\n", (int)c);
    umbp_feed_entry e[64];
    for (;;) {
      if (umbp_feed_read(f, e, 64, NULL) <= 0) usleep(1000);
    }
  }
  if (argc >= 3 && !strcmp(argv[1], "serve-take")) {
    umbp_pool *p = attach(argv[2]);
    umbp_tier *t;
    if (umbp_tier_serve(p, NULL, &t) || umbp_tier_set_state(t, UMBP_TIER_CONNECTED, "test")) {
      fprintf(stderr, "serve: %s\n", umbp_last_error());
      return 2;
    }
    printf("serving\n");
    umbp_key keys[1024];
    umbp_tier_job j;
    for (;;) {
      int r = umbp_tier_take(t, &j, keys, 1024);
      if (r == 1) break;
      umbp_tier_wait(t, 10);
    }
    printf("took %u\n", j.n_blocks);
    for (;;) pause();
  }
  fprintf(stderr, "usage: tier_helper publish NAME FIRST COUNT | consume NAME CONSUMER | consume-fork NAME CONSUMER | "
                  "serve-take NAME\n");
  return 2;
}
