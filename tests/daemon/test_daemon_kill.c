/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Crash recovery, tested by killing: 4 exec'd index_helper processes in chaos
 * mode (random reserve/publish/pin/verify/unpin/remove, checksummed blocks)
 * and a `umbp daemon` (reaping every 20 ms, evicting with watermarks) work on
 * one pool while a random one of them is SIGKILLed at a random moment and
 * restarted; every sixth round, and whenever the dice say so, the victim is
 * the daemon. After every round the daemon must have reaped the dead process
 * and `umbp inspect NAME --check` (the CLI, while the others keep working)
 * must exit 0. At the end every slot is accounted for and every free slot can
 * be reserved: no capacity is lost.
 *
 * UMBP_KILL_ROUNDS (default 24) sets the number of rounds.
 */
#include "dtu.h"
#include "index/index_internal.h"
#include "umbp/check.h"
#include "../index/index_test_util.h"

enum { NP = 4 };

static unsigned env_uint(const char *name, unsigned def) {
  const char *v = getenv(name);
  return v && *v ? (unsigned)strtoul(v, NULL, 10) : def;
}

static pid_t start_worker(const char *name, const char *nsb, unsigned seed) {
  char sd[16];
  snprintf(sd, sizeof sd, "%u", seed);
  char *argv[] = {(char *)tu_helper("index_helper"), "chaos", (char *)name, (char *)nsb, sd, "2", "1500", NULL};
  int fd;
  pid_t pid = tu_spawn(argv, &fd);
  assert_true(pid > 0);
  char line[128];
  assert_true(tu_readline(fd, line, sizeof line) > 0);
  if (strcmp(line, "ready")) fprintf(stderr, "# worker said: %s\n", line);
  assert_string_equal(line, "ready");
  close(fd);
  return pid;
}

static char out[65536];

static void check_cli(const char *name, unsigned round) {
  int rc = DTU_RUN(out, "inspect", name, "--check");
  if (rc != 0) fprintf(stderr, "# round %u: inspect --check exit %d:\n%s", round, rc, out);
  assert_int_equal(rc, 0);
}

static void wait_reaped(umbp_pool *p, unsigned live, unsigned round) {
  umbp_pool_info info;
  for (int i = 0; i < 1000; i++) {
    umbp_pool_get_info(p, &info);
    if (info.procs_dead == 0 && info.procs_live == live) return;
    dtu_sleep_ms(5);
  }
  fprintf(stderr, "# round %u: %u dead, %u live (want 0 and %u)\n", round, info.procs_dead, info.procs_live, live);
  fail();
}

static void test_kill_rounds(void **state) {
  (void)state;
  unsigned rounds = env_uint("UMBP_KILL_ROUNDS", 24);
  const char *name = tu_name("dkill");
  char log[256];
  snprintf(log, sizeof log, "/tmp/umbp-test-%s.log", name);
  unlink(log);
  const char *dargs[] = {"--capacity", "1536KiB", "--slot-size", "4KiB", "--no-prefault", "--reap-interval", "20",
                         "--evict-low", "5", "--evict-high", "10", NULL};
  pid_t daemon = dtu_daemon_start(name, log, dargs);
  if (daemon < 0) dtu_dump_log(log);
  assert_true(daemon > 0);
  umbp_attach_opts o;
  umbp_attach_opts_init(&o);
  umbp_pool *p;
  assert_int_equal(umbp_pool_attach(name, &o, &p), 0);
  uint32_t ns;
  assert_int_equal(umbp_ns_register(p, "mp-model", &ns), 0);
  char nsb[16];
  snprintf(nsb, sizeof nsb, "%u", ns);
  pid_t pids[NP];
  for (int i = 0; i < NP; i++) pids[i] = start_worker(name, nsb, (unsigned)i);
  uint64_t rng = 0xd43a0 ^ (uint64_t)getpid();
  unsigned kills = 0, daemon_kills = 0;
  const char *adopt[] = {"--reap-interval", "20", "--evict-low", "5", "--evict-high", "10", NULL};
  for (unsigned r = 0; r < rounds; r++) {
    rng = itu_mix(rng);
    dtu_sleep_ms(2 + (unsigned)(rng % 40));
    unsigned victim = (unsigned)((rng >> 32) % (NP + 1));
    if (r % 6 == 3) victim = NP;
    pid_t vp = victim == NP ? daemon : pids[victim];
    kill(vp, SIGKILL);
    int st = tu_wait(vp);
    if (st != 128 + SIGKILL) {
      fprintf(stderr, "# round %u: %s exited %d (99 = torn read)\n", r, victim == NP ? "daemon" : "worker", st);
      dtu_dump_log(log);
    }
    assert_int_equal(st, 128 + SIGKILL);
    kills++;
    if (victim == NP) {
      daemon_kills++;
      daemon = dtu_daemon_start(name, log, adopt);
      if (daemon < 0) dtu_dump_log(log);
      assert_true(daemon > 0);
    } else {
      pids[victim] = start_worker(name, nsb, 100 + r);
    }
    /* the daemon reaps the dead one: NP workers + daemon + us */
    wait_reaped(p, NP + 2, r);
    check_cli(name, r);
  }
  for (int i = 0; i < NP; i++) {
    kill(pids[i], SIGKILL);
    assert_int_equal(tu_wait(pids[i]), 128 + SIGKILL);
    kills++;
  }
  wait_reaped(p, 2, rounds);
  kill(daemon, SIGTERM);
  assert_int_equal(tu_wait(daemon), 0);
  check_cli(name, rounds);
  fprintf(stderr, "# %u kills (%u of the daemon), inspect --check clean after each of %u rounds\n", kills,
          daemon_kills, rounds);

  /* no capacity lost */
  umbp_reclaim(p);
  umbp_slot_census c;
  assert_int_equal(umbp_census(p, &c), 0);
  fprintf(stderr, "# census: free %llu published %llu (pinned %llu) reserved %llu evicting %llu retired %llu "
                  "in_rings %llu total %llu\n",
          (unsigned long long)c.free_, (unsigned long long)c.published, (unsigned long long)c.pinned,
          (unsigned long long)c.reserved, (unsigned long long)c.evicting, (unsigned long long)c.retired,
          (unsigned long long)c.in_rings, (unsigned long long)c.total);
  assert_int_equal(c.reserved, 0);
  assert_int_equal(c.evicting, 0);
  assert_int_equal(c.pinned, 0);
  assert_int_equal(c.free_ + c.published + c.retired, c.total);
  /* free slots are on the rings, or counted off them by a free that found a
   * ring held up (umbp_pool_check() enforces it; src/index/reserve.c) */
  umbp_check_report cr;
  assert_int_equal(umbp_pool_check(p, &cr), 0);
  assert_int_equal(cr.n_violations, 0);
  uint64_t entries;
  assert_int_equal(umbp_index_stats(p, &entries, NULL, 0), 0);
  assert_int_equal(entries, c.published);
  /* every published block is intact: its bytes are its key's pattern (the
   * workers fill a slot with itu_fill() before they publish it) */
  uint64_t checked = 0;
  for (uint32_t slot = 0; slot < p->index->slot_count; slot++) {
    if (ST_STATE(atomic_load(&p->index->meta[slot].state)) != UMBP_SLOT_PUBLISHED) continue;
    umbp_key k;
    umbp_ix_key_from_shm(&p->index->meta[slot].key, &k);
    if (!itu_check(umbp_slot_ptr(p, slot), umbp_slot_size(p), &k)) {
      fprintf(stderr, "# slot %u: published, but its bytes are not its key's\n", slot);
      fail();
    }
    checked++;
  }
  assert_int_equal(checked, c.published);
  fprintf(stderr, "# %llu published blocks byte-exact\n", (unsigned long long)checked);
  /* every free slot can be reserved */
  uint32_t *s = calloc(c.total, sizeof *s);
  int n = c.free_ ? umbp_reserve_bulk(p, -1, ns, (unsigned)c.free_, s) : 0;
  assert_int_equal(n, (int)c.free_);
  for (int i = 0; i < n; i++) assert_int_equal(umbp_abort(p, s[i]), 0);
  /* and the published ones can all be evicted back into free slots */
  int ev = umbp_evict(p, -1, (unsigned)c.published);
  for (int i = 0; i < 200 && umbp_census(p, &c) == 0 && c.retired; i++) {
    umbp_reclaim(p);
    dtu_sleep_ms(1);
  }
  umbp_census(p, &c);
  fprintf(stderr, "# evicted %d; free %llu of %llu\n", ev, (unsigned long long)c.free_, (unsigned long long)c.total);
  assert_int_equal(c.free_ + c.retired, c.total);
  free(s);
  umbp_pool_detach(p);
  umbp_pool_destroy(name);
  unlink(log);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test_teardown(test_kill_rounds, dtu_kill_daemons)};
  return cmocka_run_group_tests_name("daemon-kill", tests, NULL, NULL);
}
