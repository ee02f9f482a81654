/* SPDX-License-Identifier: Apache-2.0 */
/* umbp daemon and umbp inspect through the real CLI (exec'd): start, adopt
 * after kill -9 with every block kept, a second daemon refused, quotas on
 * SIGHUP, inspect text/JSON/--check (clean and with deliberately corrupted
 * state), bad input, another uid's pool and a read-only user. */
#include <dirent.h>
#include <poll.h>
#include <sys/stat.h>

#include "dtu.h"
#include "index/index_internal.h"
#include "shm/ring.h"
#include "../index/index_test_util.h"

#define NOBODY 65534

static char out[65536];

static const char *log_path(const char *name) {
  static char b[256];
  snprintf(b, sizeof b, "/tmp/umbp-test-%s.log", name);
  return b;
}

static umbp_pool *attach_rw(const char *name) {
  umbp_attach_opts o;
  umbp_attach_opts_init(&o);
  umbp_pool *p;
  int rc = umbp_pool_attach(name, &o, &p);
  if (rc) fprintf(stderr, "# attach: %s\n", umbp_last_error());
  assert_int_equal(rc, 0);
  return p;
}

static umbp_pool *mk_pool(const char *name, uint64_t slots) {
  umbp_pool_params pp;
  umbp_pool_params_init(&pp);
  pp.slot_size = 4096;
  pp.capacity = slots * 4096;
  pp.no_prefault = true;
  umbp_pool *p;
  int rc = umbp_pool_create(name, &pp, &p);
  if (rc) fprintf(stderr, "# create: %s\n", umbp_last_error());
  assert_int_equal(rc, 0);
  return p;
}

static void publish_set(umbp_pool *p, uint32_t ns, unsigned n) {
  for (uint64_t i = 0; i < n; i++) {
    umbp_key k = itu_key(ns, i, 0);
    uint32_t s;
    assert_int_equal(umbp_reserve(p, -1, ns, &s), 0);
    itu_fill(umbp_slot_ptr(p, s), umbp_slot_size(p), &k);
    assert_int_equal(umbp_publish(p, s, &k), 0);
  }
}

static void verify_set(umbp_pool *p, uint32_t ns, unsigned n) {
  for (uint64_t i = 0; i < n; i++) {
    umbp_key k = itu_key(ns, i, 0);
    uint32_t s;
    assert_int_equal(umbp_lookup_pin(p, &k, &s), 0);
    assert_true(itu_check(umbp_slot_ptr(p, s), umbp_slot_size(p), &k));
    assert_int_equal(umbp_unpin(p, s), 0);
  }
}

static int check_cli(const char *name) {
  int rc = DTU_RUN(out, "inspect", name, "--check");
  if (rc != 0) fprintf(stderr, "# inspect --check exit %d:\n%s", rc, out);
  return rc;
}

static uint64_t run_generation(const char *name) {
  umbp_attach_opts o;
  umbp_attach_opts_init(&o);
  o.read_only = true;
  umbp_pool *p;
  assert_int_equal(umbp_pool_attach(name, &o, &p), 0);
  umbp_pool_info i;
  umbp_pool_get_info(p, &i);
  umbp_pool_detach(p);
  return i.run_generation;
}

/* create, publish a known set, kill -9 the daemon, restart: every block kept */
static void test_daemon_kill9_keeps_blocks(void **st) {
  (void)st;
  const char *name = tu_name("dkeep");
  const char *log = log_path(name);
  unlink(log);
  const char *args[] = {"--capacity", "1MiB", "--slot-size", "4KiB", "--no-prefault", "--reap-interval", "20", NULL};
  pid_t d = dtu_daemon_start(name, log, args);
  if (d < 0) dtu_dump_log(log);
  assert_true(d > 0);
  assert_int_equal(run_generation(name), 1);
  umbp_pool *p = attach_rw(name);
  uint32_t ns;
  assert_int_equal(umbp_ns_register(p, "keep", &ns), 0);
  publish_set(p, ns, 100);
  kill(d, SIGKILL);
  assert_int_equal(tu_wait(d), 128 + SIGKILL);
  int dp;
  assert_int_equal(dtu_daemon_pid(name, &dp), 0); /* the kernel dropped its lock */
  const char *adopt[] = {"--reap-interval", "20", NULL};
  d = dtu_daemon_start(name, log, adopt);
  assert_true(d > 0);
  assert_int_equal(run_generation(name), 2);
  /* the new daemon reaps the old one's registry slot */
  umbp_pool_info info;
  for (int i = 0; i < 3000; i++) {
    umbp_pool_get_info(p, &info);
    if (!info.procs_dead) break;
    dtu_sleep_ms(10);
  }
  assert_int_equal(info.procs_dead, 0);
  verify_set(p, ns, 100);
  assert_int_equal(check_cli(name), 0);
  fprintf(stderr, "# 100 blocks byte-exact after kill -9 of the daemon and its restart (generation 2)\n");
  /* SIGTERM: clean stop, pool kept */
  kill(d, SIGTERM);
  assert_int_equal(tu_wait(d), 0);
  umbp_pool_detach(p);
  p = attach_rw(name);
  verify_set(p, ns, 100);
  umbp_pool_detach(p);
  /* --unlink-on-exit removes it */
  const char *unl[] = {"--unlink-on-exit", NULL};
  d = dtu_daemon_start(name, log, unl);
  assert_true(d > 0);
  assert_int_equal(run_generation(name), 3);
  kill(d, SIGINT);
  assert_int_equal(tu_wait(d), 0);
  assert_int_equal(dtu_daemon_pid(name, &dp), -ENOENT);
  FILE *f = fopen(log, "r");
  assert_non_null(f);
  size_t n = fread(out, 1, sizeof out - 1, f);
  out[n] = 0;
  fclose(f);
  assert_non_null(strstr(out, "adopted pool"));
  assert_non_null(strstr(out, "destroyed (--unlink-on-exit)"));
  assert_non_null(strstr(out, "Z umbp-daemon["));
  unlink(log);
}

static void test_second_daemon_refused(void **st) {
  (void)st;
  const char *name = tu_name("dtwo");
  const char *log = log_path(name);
  unlink(log);
  const char *args[] = {"--capacity", "1MiB", "--slot-size", "4KiB", "--no-prefault", NULL};
  pid_t d = dtu_daemon_start(name, log, args);
  assert_true(d > 0);
  int rc = DTU_RUN(out, "daemon", "--pool", name, "--capacity", "1MiB", "--foreground");
  assert_int_equal(rc, 1);
  char want[64];
  snprintf(want, sizeof want, "already has a daemon (pid %d)", (int)d);
  if (!strstr(out, want)) fprintf(stderr, "# got: %s", out);
  assert_non_null(strstr(out, want));
  /* the same in background mode: the first parent reports it */
  rc = DTU_RUN(out, "daemon", "--pool", name);
  assert_int_equal(rc, 1);
  assert_non_null(strstr(out, want));
  /* inspect names it */
  assert_int_equal(DTU_RUN(out, "inspect", name), 0);
  snprintf(want, sizeof want, "daemon: running, pid %d", (int)d);
  assert_non_null(strstr(out, want));
  kill(d, SIGTERM);
  assert_int_equal(tu_wait(d), 0);
  assert_int_equal(DTU_RUN(out, "inspect", name), 0);
  assert_non_null(strstr(out, "daemon: none"));
  umbp_pool_destroy(name);
  unlink(log);
}

/* A stopped process (SIGSTOP, a debugger) acts on no signal but SIGCONT and
 * SIGKILL: the refusals that name one must say so. "stop it first (kill -TERM
 * PID)" of a stopped daemon ended nothing, and "retry with a longer timeout"
 * of a stopped creator waited for what never comes. */
static void test_stopped_holder_named(void **st) {
  (void)st;
  const char *name = tu_name("dstop");
  const char *log = log_path(name);
  unlink(log);
  const char *args[] = {"--capacity", "1MiB", "--slot-size", "4KiB", "--no-prefault", NULL};
  pid_t d = dtu_daemon_start(name, log, args);
  assert_true(d > 0);
  assert_int_equal(kill(d, SIGSTOP), 0);
  assert_true(dtu_wait_stopped(d));
  char want[96];
  snprintf(want, sizeof want, "kill -CONT %d", (int)d);
  int rc = DTU_RUN(out, "daemon", name, "--foreground");
  if (!strstr(out, want)) fprintf(stderr, "# got: %s", out);
  assert_int_equal(rc, 1);
  assert_non_null(strstr(out, "is stopped"));
  assert_non_null(strstr(out, want));
  rc = DTU_RUN(out, "daemon", name); /* the first parent reports the daemon's verdict */
  assert_int_equal(rc, 1);
  assert_non_null(strstr(out, want));
  /* inspect says stopped, not running: a stopped daemon reaps and evicts nothing */
  assert_int_equal(DTU_RUN(out, "inspect", name), 0);
  char dline[160];
  snprintf(dline, sizeof dline, "daemon: stopped (SIGSTOP or a debugger), pid %d", (int)d);
  if (!strstr(out, dline)) fprintf(stderr, "# inspect: %s", out);
  assert_non_null(strstr(out, dline));
  assert_non_null(strstr(out, want));
  assert_int_equal(DTU_RUN(out, "inspect", name, "--json"), 0);
  assert_non_null(strstr(out, "\"stopped\":true"));
  /* the advice works: TERM, then CONT, and the daemon stops cleanly */
  kill(d, SIGTERM);
  kill(d, SIGCONT);
  assert_int_equal(tu_wait(d), 0);
  umbp_pool_destroy(name);

  /* a creator stopped while pre-faulting */
  char *argv[] = {(char *)tu_helper("pool_helper"), "create-stall", (char *)name, NULL};
  int fd;
  pid_t c = tu_spawn(argv, &fd);
  char line[256];
  if (tu_readline(fd, line, sizeof line) < 0) line[0] = 0;
  close(fd);
  assert_string_equal(line, "prefault");
  assert_int_equal(kill(c, SIGSTOP), 0);
  assert_true(dtu_wait_stopped(c));
  rc = DTU_RUN(out, "pool", "info", name);
  snprintf(want, sizeof want, "creator (pid %d) is stopped", (int)c);
  if (!strstr(out, want)) fprintf(stderr, "# got: %s", out);
  assert_int_equal(rc, 1);
  assert_non_null(strstr(out, want));
  snprintf(want, sizeof want, "kill -CONT %d", (int)c);
  assert_non_null(strstr(out, want));
  kill(c, SIGKILL);
  tu_wait(c);
  /* and what it names next works */
  assert_int_equal(DTU_RUN(out, "pool", "destroy", name), 0);
  unlink(log);
}

/* The pid of a process other than `not` whose argv is "... daemon NAME ...", or -1. */
static pid_t find_daemon_proc(const char *name, pid_t not) {
  DIR *d = opendir("/proc");
  struct dirent *e;
  pid_t found = -1;
  while (d && found < 0 && (e = readdir(d))) {
    pid_t pid = (pid_t)atoi(e->d_name);
    if (pid <= 0 || pid == not) continue;
    char path[64], buf[4096];
    snprintf(path, sizeof path, "/proc/%d/cmdline", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) continue;
    buf[n] = 0;
    for (char *q = buf; q < buf + n; q += strlen(q) + 1)
      if (!strcmp(q, "daemon") && q + strlen(q) + 1 < buf + n && !strcmp(q + strlen(q) + 1, name)) found = pid;
  }
  if (d) closedir(d);
  return found;
}

/* The command that starts a daemon in the background waits for its verdict;
 * a daemon stopped before it gives one (SIGSTOP, a debugger) held that
 * command without bound. It now says so within a few seconds, exit 1, and
 * the stopped daemon holds none of the caller's descriptors: a caller that
 * reads the command's output to its end (`out=$(umbp daemon P)`) gets it.
 * One round stops the daemon as soon as it exists (before its first step:
 * it held the caller's stdout and had not yet sent its pid, so the command
 * could not know whom to look at), the others a little later. */
static char stopstart_name[64]; /* the round's pool, for the teardown */

static void stopped_before_ready_round(bool at_once) {
  const char *name = tu_name("dstopstart");
  snprintf(stopstart_name, sizeof stopstart_name, "%s", name);
  /* a creator that stays alive mid-creation: the daemon's adopt waits for it
   * (up to its attach timeout, 10 s), long enough to stop the daemon there */
  char *hargv[] = {(char *)tu_helper("pool_helper"), "create-stall", (char *)name, NULL};
  int hfd;
  pid_t creator = tu_spawn(hargv, &hfd);
  dtu_track(creator); /* it stalls for good: a failed assertion must not leave it */
  char line[256];
  if (tu_readline(hfd, line, sizeof line) < 0) line[0] = 0;
  close(hfd);
  assert_string_equal(line, "prefault");
  int fds[2];
  assert_int_equal(pipe(fds), 0);
  pid_t starter = fork();
  if (starter == 0) {
    alarm(60); /* the old behaviour: it never returned */
    dup2(fds[1], 1);
    dup2(fds[1], 2);
    close(fds[0]);
    close(fds[1]);
    execl(dtu_tool(), dtu_tool(), "daemon", name, (char *)NULL);
    _exit(127);
  }
  dtu_track(starter);
  close(fds[1]);
  pid_t d = -1;
  uint64_t t_find = umbp_now_ns();
  while (d < 0 && umbp_now_ns() - t_find < 5000000000ull) {
    d = find_daemon_proc(name, starter);
    if (d > 0) { /* the intermediate child, about to exit, may come first */
      char path[64];
      snprintf(path, sizeof path, "/proc/%d/stat", (int)d);
      FILE *f = fopen(path, "r");
      int ppid = -1;
      if (f) {
        if (fscanf(f, "%*d (%*[^)]) %*c %d", &ppid) != 1) ppid = -1;
        fclose(f);
      }
      if (ppid < 0 || ppid == starter) d = -1; /* gone (it was the intermediate) or the intermediate */
    }
    if (d < 0 && !at_once) dtu_sleep_ms(10);
  }
  assert_true(d > 0);
  dtu_track(d);
  assert_int_equal(kill(d, SIGSTOP), 0);
  uint64_t t0 = umbp_now_ns();
  /* read the command's output to its end, for at most 30 s: a stopped daemon
   * that kept the pipe open would hold this read for good */
  size_t l = 0;
  bool eof = false;
  while (!eof && umbp_now_ns() - t0 < 30000000000ull) {
    struct pollfd pf = {.fd = fds[0], .events = POLLIN};
    if (poll(&pf, 1, 200) <= 0) continue;
    ssize_t r = read(fds[0], out + l, sizeof out - 1 - l);
    if (r <= 0) eof = true;
    else l += (size_t)r;
  }
  out[l] = 0;
  close(fds[0]);
  if (!eof) kill(starter, SIGKILL);
  int rc = tu_wait(starter);
  if (rc != 1 || !eof) fprintf(stderr, "# at_once %d, rc %d, eof %d: %s", at_once, rc, eof, out);
  kill(d, SIGKILL);
  kill(creator, SIGKILL);
  tu_wait(creator);
  umbp_pool_destroy(name);
  assert_true(eof);
  assert_int_equal(rc, 1);
  assert_true(umbp_now_ns() - t0 < 10000000000ull);
  char want[128];
  snprintf(want, sizeof want, "its process (pid %d) is stopped", (int)d);
  if (!strstr(out, want)) fprintf(stderr, "# got: %s", out);
  assert_non_null(strstr(out, want));
  snprintf(want, sizeof want, "kill -CONT %d", (int)d);
  assert_non_null(strstr(out, want));
}

static void test_daemonise_stopped_before_ready(void **st) {
  (void)st;
  for (int i = 0; i < 3; i++) stopped_before_ready_round(true);
  stopped_before_ready_round(false);
}

/* After a failed round: its daemon, whichever pid it has, and its pool. */
static int teardown_stopstart(void **st) {
  if (stopstart_name[0]) {
    pid_t p;
    for (int i = 0; i < 8 && (p = find_daemon_proc(stopstart_name, -1)) > 0; i++) {
      kill(p, SIGKILL);
      dtu_sleep_ms(20);
    }
  }
  dtu_kill_daemons(st);
  if (stopstart_name[0]) umbp_pool_destroy(stopstart_name);
  stopstart_name[0] = 0;
  return 0;
}

/* A --foreground daemon logs to stderr; when that is a pipe whose reader
 * stopped reading, a full pipe held the daemon in write() without bound:
 * SIGTERM was not acted on (nor any reaping done) until the reader went on. */
static void test_foreground_log_reader_stopped(void **st) {
  (void)st;
  const char *name = tu_name("dstuck");
  char fifo[128];
  snprintf(fifo, sizeof fifo, "/tmp/umbp-test-%s.fifo", name);
  unlink(fifo);
  assert_int_equal(mkfifo(fifo, 0600), 0);
  int rd = open(fifo, O_RDONLY | O_NONBLOCK | O_CLOEXEC); /* opened, never read: a stopped reader */
  assert_true(rd >= 0);
  pid_t d = fork();
  if (d == 0) {
    int w = open(fifo, O_WRONLY);
    int nul = open("/dev/null", O_RDWR);
    if (w < 0 || nul < 0) _exit(126);
    fcntl(w, F_SETPIPE_SZ, 4096); /* one page: full after a few dozen lines */
    dup2(w, 2);
    dup2(nul, 0);
    dup2(nul, 1);
    execl(dtu_tool(), dtu_tool(), "daemon", name, "--foreground", "--capacity", "1MiB", "--slot-size", "4KiB",
          "--no-prefault", "--index-pages", "small", "--reap-interval", "20", (char *)NULL);
    _exit(127);
  }
  dtu_track(d);
  int dp = -1;
  for (int i = 0; i < 1000 && !(dtu_daemon_pid(name, &dp) == 1 && dp == d); i++) dtu_sleep_ms(10);
  assert_int_equal(dp, d);
  /* each SIGHUP logs a line: far more than the pipe holds */
  for (int i = 0; i < 300; i++) {
    kill(d, SIGHUP);
    dtu_sleep_ms(2);
  }
  kill(d, SIGTERM);
  int status = -1;
  for (int i = 0; i < 3000; i++) {
    if (waitpid(d, &status, WNOHANG) == d) break;
    status = -1;
    dtu_sleep_ms(10);
  }
  if (status == -1) {
    fprintf(stderr, "# the daemon did not stop on SIGTERM within 30 s with its log pipe full\n");
    kill(d, SIGKILL);
    tu_wait(d);
  }
  assert_true(status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0);
  close(rd);
  unlink(fifo);
  umbp_pool_destroy(name);
}

/* background mode: double fork, the first parent returns the daemon's pid */
static void test_daemonise(void **st) {
  (void)st;
  const char *name = tu_name("dbg");
  const char *log = log_path(name);
  unlink(log);
  int rc = DTU_RUN(out, "daemon", "--pool", name, "--capacity", "1MiB", "--slot-size", "4KiB", "--no-prefault",
                   "--log", log);
  assert_int_equal(rc, 0);
  int pid = 0;
  dtu_track(strstr(out, "served by pid ") ? atoi(strstr(out, "served by pid ") + 14) : -1);
  assert_int_equal(sscanf(strstr(out, "served by pid ") ? strstr(out, "served by pid ") : "", "served by pid %d", &pid), 1);
  int dp;
  assert_int_equal(dtu_daemon_pid(name, &dp), 1);
  assert_int_equal(dp, pid);
  /* it is not our child (double fork) and has its own session */
  assert_int_equal(waitpid(pid, NULL, WNOHANG), -1);
  assert_true(getsid(pid) != getsid(0));
  kill(pid, SIGTERM);
  for (int i = 0; i < 3000 && kill(pid, 0) == 0; i++) dtu_sleep_ms(10);
  assert_int_equal(kill(pid, 0), -1);
  FILE *f = fopen(log, "r");
  assert_non_null(f);
  size_t n = fread(out, 1, sizeof out - 1, f);
  out[n] = 0;
  fclose(f);
  assert_non_null(strstr(out, "ready: pool"));
  assert_non_null(strstr(out, "stopped"));
  /* --log FIFO: refused at once when nothing reads it (open() used to wait
   * for a reader for good); with a reader the log goes there */
  assert_int_equal(unlink(log), 0);
  assert_int_equal(mkfifo(log, 0600), 0);
  dtu_run_alarm_s = 10;
  rc = DTU_RUN(out, "daemon", name, "--log", log);
  dtu_run_alarm_s = 0;
  if (rc != 1) fprintf(stderr, "# exit %d: %s", rc, out);
  assert_int_equal(rc, 1);
  assert_non_null(strstr(out, "it is a FIFO that no process has open for reading: start its reader first"));
  int rfd = open(log, O_RDONLY | O_NONBLOCK);
  assert_true(rfd >= 0);
  dtu_run_alarm_s = 10;
  rc = DTU_RUN(out, "daemon", name, "--log", log);
  dtu_run_alarm_s = 0;
  if (rc != 0) fprintf(stderr, "# exit %d: %s", rc, out);
  assert_int_equal(rc, 0);
  assert_non_null(strstr(out, "served by pid "));
  pid = atoi(strstr(out, "served by pid ") + 14);
  dtu_track(pid);
  kill(pid, SIGTERM);
  for (int i = 0; i < 3000 && kill(pid, 0) == 0; i++) dtu_sleep_ms(10);
  assert_int_equal(kill(pid, 0), -1);
  n = 0;
  for (ssize_t r; (r = read(rfd, out + n, sizeof out - 1 - n)) > 0;) n += (size_t)r;
  out[n] = 0;
  close(rfd);
  assert_non_null(strstr(out, "ready: pool"));
  assert_non_null(strstr(out, "stopped"));
  /* cannot create: a capacity no machine can make a pool of is a usage error
   * (exit 2), found before the daemon forks */
  const char *name2 = tu_name("dbg2");
  rc = DTU_RUN(out, "daemon", "--pool", name2, "--capacity", "4KiB", "--slot-size", "4KiB");
  assert_int_equal(rc, 2);
  assert_non_null(strstr(out, "raise --capacity"));
  assert_non_null(strstr(out, "Try 'umbp daemon --help'"));
  umbp_pool_destroy(name);
  unlink(log);
}

/* Wait up to ms for child pid to exit: its status (tu_wait's), or -1. */
static int wait_exit(pid_t pid, unsigned ms) {
  for (unsigned i = 0; i < ms / 10; i++) {
    int st;
    if (waitpid(pid, &st, WNOHANG) == pid) return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    dtu_sleep_ms(10);
  }
  return -1;
}

static const char *read_log(const char *log) {
  FILE *f = fopen(log, "r");
  assert_non_null(f);
  size_t n = fread(out, 1, sizeof out - 1, f);
  out[n] = 0;
  fclose(f);
  return out;
}

/* Whether the log holds want within 30 s (polled every 10 ms); prints the log
 * when it does not. A signal's effect is checked after its log line, not
 * after a sleep: two signals sent before the daemon's loop ran merge into one. */
static bool log_has_within(const char *log, const char *want) {
  for (int i = 0; i < 3000; i++) {
    if (strstr(read_log(log), want)) return true;
    dtu_sleep_ms(10);
  }
  fprintf(stderr, "# no '%s' in the log: %s", want, out);
  return false;
}

/* A pool whose creator was killed while making it (issue 32, item 7): a
 * daemon without --capacity fails at once naming the cause; with
 * --capacity it replaces the pool and logs it (under systemd Restart=always
 * this used to be a crash loop: 10 s waits, then "already exists"). */
static void test_half_made_pool(void **st) {
  (void)st;
  const char *name = tu_name("dhalf");
  const char *log = log_path(name);
  unlink(log);
  char line[256];
  pid_t creator = tu_half_made_pool(name, line, sizeof line);
  assert_string_equal(line, "prefault");
  uint64_t t0 = umbp_now_ns();
  assert_int_equal(DTU_RUN(out, "daemon", "--pool", name, "--foreground"), 1);
  if (!strstr(out, "died before finishing")) fprintf(stderr, "# got: %s", out);
  assert_non_null(strstr(out, "died before finishing"));
  assert_non_null(strstr(out, "--capacity"));
  assert_true(umbp_now_ns() - t0 < 5000000000ull); /* not after the attach timeout (10 s) */
  const char *args[] = {"--capacity", "1MiB", "--slot-size", "4KiB", "--no-prefault", NULL};
  pid_t d = dtu_daemon_start(name, log, args);
  if (d < 0) dtu_dump_log(log);
  assert_true(d > 0);
  umbp_pool *p = attach_rw(name);
  assert_int_equal(umbp_slot_count(p), 256);
  umbp_pool_detach(p);
  kill(d, SIGTERM);
  assert_int_equal(tu_wait(d), 0);
  read_log(log);
  char want[96];
  snprintf(want, sizeof want, "left half-made by its creator (pid %d), which died", (int)creator);
  if (!strstr(out, want)) fprintf(stderr, "# log: %s", out);
  assert_non_null(strstr(out, want));
  assert_non_null(strstr(out, "created pool"));
  umbp_pool_destroy(name);
  unlink(log);
}

/* A daemon notices within its reap period that its pool was destroyed
 * (issue 32, item 8), also when a pool of that name was created again at
 * once, or that its file was truncated under it (item 12): it logs why and
 * exits 1, instead of serving a pool nobody can attach to and later saying
 * "kept for the next daemon". */
static void test_daemon_notices_pool_gone(void **st) {
  (void)st;
  const char *args[] = {"--capacity", "1MiB", "--slot-size", "4KiB", "--no-prefault", "--reap-interval", "20", NULL};
  for (int round = 0; round < 3; round++) {
    const char *name = tu_name("dgone");
    const char *log = log_path(name);
    unlink(log);
    pid_t d = dtu_daemon_start(name, log, args);
    assert_true(d > 0);
    const char *want = "was removed";
    const char *other = tu_name("dgone-new");
    if (round == 0) {
      assert_int_equal(DTU_RUN(out, "pool", "destroy", "--force", name), 0);
    } else if (round == 1) { /* replaced in one step: another pool renamed over its file */
      umbp_pool_detach(mk_pool(other, 64));
      char from[128], to[128];
      snprintf(from, sizeof from, "/dev/shm/umbp.%s", other);
      snprintf(to, sizeof to, "/dev/shm/umbp.%s", name);
      assert_int_equal(rename(from, to), 0);
      want = "now names another pool";
    } else {
      char path[128];
      snprintf(path, sizeof path, "/dev/shm/umbp.%s", name);
      int fd = open(path, O_RDWR);
      assert_true(fd >= 0);
      struct stat sb;
      assert_int_equal(fstat(fd, &sb), 0);
      assert_int_equal(ftruncate(fd, sb.st_size - 4096), 0); /* the arena's last page: the daemon never reads it */
      close(fd);
      want = "shrank from";
    }
    int rc = wait_exit(d, 5000);
    if (rc != 1) dtu_dump_log(log);
    assert_int_equal(rc, 1);
    read_log(log);
    if (!strstr(out, want)) fprintf(stderr, "# round %d log: %s", round, out);
    assert_non_null(strstr(out, want));
    assert_null(strstr(out, "kept for the next daemon"));
    umbp_pool_destroy(name);
    umbp_pool_destroy(other); /* round 1: its index file, where it has one */
    unlink(log);
  }
}

/* A pool file truncated under a running daemon deep enough that its own
 * detach would touch the lost part (the event ring, which a clean detach
 * repairs for its registry slot) while its evictor does not (the registry
 * and the free rings stay): the daemon sees it at its next reap period, logs
 * "shrank from", lets go of the pool without writing to it and exits 1 with
 * its "stopped" line, where it used to die of SIGBUS (status 135) in
 * cli_pool_detach() after the watch had ended. */
static void test_daemon_pool_truncated_deep(void **st) {
  (void)st;
  const char *name = tu_name("dtrunc");
  const char *log = log_path(name);
  char path[128];
  snprintf(path, sizeof path, "/dev/shm/umbp.%s", name);
  unlink(log);
  /* small index pages: every region in the one file, at the offsets the header says */
  const char *args[] = {"--capacity", "1MiB", "--slot-size", "4KiB", "--no-prefault", "--index-pages", "small",
                        "--reap-interval", "20", NULL};
  pid_t d = dtu_daemon_start(name, log, args);
  assert_true(d > 0);
  umbp_attach_opts o;
  umbp_attach_opts_init(&o);
  o.read_only = true;
  umbp_pool *p;
  assert_int_equal(umbp_pool_attach(name, &o, &p), 0);
  uint64_t keep = p->hdr->regions[UMBP_REG_EVENTS].offset & ~(uint64_t)4095;
  assert_true(keep > p->hdr->regions[UMBP_REG_FREERINGS].offset);
  umbp_pool_detach(p);
  int fd = open(path, O_RDWR);
  assert_true(fd >= 0);
  assert_int_equal(ftruncate(fd, (off_t)keep), 0);
  close(fd);
  int rc = wait_exit(d, 5000);
  if (rc != 1) dtu_dump_log(log);
  assert_int_equal(rc, 1);
  read_log(log);
  if (!strstr(out, "shrank from") || !strstr(out, "stopped")) fprintf(stderr, "# log: %s", out);
  assert_non_null(strstr(out, "shrank from"));
  assert_non_null(strstr(out, "let go of it without writing to it"));
  assert_non_null(strstr(out, "umbp-daemon[")); /* "stopped" ends the log */
  assert_non_null(strstr(out, "]: stopped\n"));
  assert_null(strstr(out, "SIGBUS at"));
  assert_null(strstr(out, "kept for the next daemon"));
  umbp_pool_destroy(name);
  unlink(log);
}

/* For the truncation tests: names for pool NAME-tag, its daemon log, a
 * second log beside it and the pool file; a daemon serving the pool with a
 * long reap period, so that its own look at the file cannot come first. */
static pid_t start_truncation_daemon(const char *tag, char log[256], char log2[300], char path[128]) {
  const char *name = tu_name(tag);
  snprintf(log, 256, "%s", log_path(name));
  snprintf(log2, 300, "%s.inspect", log);
  snprintf(path, 128, "/dev/shm/umbp.%s", name);
  unlink(log);
  unlink(log2);
  const char *args[] = {"--capacity", "1MiB", "--slot-size", "4KiB", "--no-prefault", "--reap-interval", "600000", NULL};
  return dtu_daemon_start(name, log, args);
}

/* A pool file truncated under a running daemon and a running `inspect
 * --watch`: each says SIGBUS, the pool, its file and the cause, and exits 3,
 * instead of dying of the signal without a word (issue 32 item 12). The
 * daemon's reap period is long, so its own look at the file
 * (test_daemon_notices_pool_gone) cannot come first: its evictor thread
 * touches the lost pages within a period. */
static void test_sigbus_names_pool(void **st) {
  (void)st;
  char log[256], ilog[300], path[128];
  pid_t d = start_truncation_daemon("dbus", log, ilog, path);
  const char *name = path + strlen("/dev/shm/umbp.");
  assert_true(d > 0);
  pid_t ins = fork();
  if (ins == 0) {
    int fd = open(ilog, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
      dup2(fd, 1);
      dup2(fd, 2);
    }
    execl(dtu_tool(), dtu_tool(), "inspect", name, "--watch", "0.1", (char *)NULL);
    _exit(127);
  }
  dtu_track(ins);
  struct stat sb;
  for (int i = 0; i < 3000 && (stat(ilog, &sb) != 0 || sb.st_size == 0); i++) dtu_sleep_ms(10); /* it drew once */
  int fd = open(path, O_RDWR);
  assert_true(fd >= 0);
  assert_int_equal(ftruncate(fd, 4096), 0); /* the header stays; everything after it is gone */
  close(fd);
  int drc = wait_exit(d, 5000), irc = wait_exit(ins, 5000);
  if (drc != 3) dtu_dump_log(log);
  if (irc != 3) dtu_dump_log(ilog);
  assert_int_equal(drc, 3);
  assert_int_equal(irc, 3);
  const char *const files[] = {log, ilog};
  for (int k = 0; k < 2; k++) {
    read_log(files[k]);
    char want[400];
    snprintf(want, sizeof want, "of pool '%s' (%s, mapped ", name, path);
    if (!strstr(out, want) || !strstr(out, "its file was truncated to 4096 bytes")) fprintf(stderr, "# %s: %s", files[k], out);
    assert_non_null(strstr(out, k ? "umbp inspect: SIGBUS at offset 0x" : "umbp-daemon["));
    assert_non_null(strstr(out, "SIGBUS at offset 0x"));
    assert_non_null(strstr(out, want));
    assert_non_null(strstr(out, "its file was truncated to 4096 bytes under the running processes"));
    assert_non_null(strstr(out, "docs/operations.md"));
    /* once: the library's own handler (src/shm/sigbus.c), installed at the
     * first attach, stays quiet for a pool the command watches */
    const char *first = strstr(out, "SIGBUS at offset 0x");
    assert_null(strstr(first + 1, "SIGBUS at offset"));
    assert_null(strstr(out, "umbp: SIGBUS"));
  }
  umbp_pool_destroy(name);
  unlink(log);
  unlink(ilog);
}

/* umbp inspect --watch whose stderr is a pipe nobody reads any more (a log
 * collector that died): a truncation of the pool still ends it with status 3.
 * Its handler's write of the message to that pipe raises SIGPIPE, which ended
 * the process (status 128 + 13) before the handler blocked it. */
static void test_sigbus_broken_stderr_pipe(void **st) {
  (void)st;
  char log[256], olog[300], path[128];
  pid_t d = start_truncation_daemon("dbpipe", log, olog, path);
  const char *name = path + strlen("/dev/shm/umbp.");
  assert_true(d > 0);
  int pfd[2];
  assert_int_equal(pipe(pfd), 0);
  pid_t ins = fork();
  if (ins == 0) {
    /* SIGPIPE at its default action, whatever the test runner left */
    signal(SIGPIPE, SIG_DFL);
    int fd = open(olog, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) dup2(fd, 1); /* its drawing: a file, so only stderr is the pipe */
    dup2(pfd[1], 2);
    close(pfd[0]);
    close(pfd[1]);
    execl(dtu_tool(), dtu_tool(), "inspect", name, "--watch", "0.1", (char *)NULL);
    _exit(127);
  }
  dtu_track(ins);
  close(pfd[1]);
  close(pfd[0]); /* the reader is gone: a write to its stderr raises SIGPIPE */
  struct stat sb;
  for (int i = 0; i < 3000 && (stat(olog, &sb) != 0 || sb.st_size == 0); i++) dtu_sleep_ms(10); /* it drew once */
  assert_true(stat(olog, &sb) == 0 && sb.st_size > 0);
  int fd = open(path, O_RDWR);
  assert_true(fd >= 0);
  assert_int_equal(ftruncate(fd, 4096), 0);
  close(fd);
  int irc = wait_exit(ins, 30000), drc = wait_exit(d, 30000);
  if (drc != 3) dtu_dump_log(log);
  assert_int_equal(irc, 3); /* not 128 + SIGPIPE */
  assert_int_equal(drc, 3);
  umbp_pool_destroy(name);
  unlink(log);
  unlink(olog);
}

static uint64_t quota_of(const char *name, const char *ns) {
  umbp_attach_opts o;
  umbp_attach_opts_init(&o);
  o.read_only = true;
  umbp_pool *p;
  assert_int_equal(umbp_pool_attach(name, &o, &p), 0);
  uint32_t id;
  uint64_t q = UINT64_MAX;
  if (umbp_ns_lookup(p, ns, &id) == 0) {
    const struct umbp_ns_shm *t = umbp_pool_region(p, UMBP_REG_NAMESPACES);
    q = atomic_load(&t[id].quota_bytes);
  }
  umbp_pool_detach(p);
  return q;
}

/* Write text as the quota file qf and send the daemon d SIGHUP. */
static void quota_file_hup(pid_t d, const char *qf, const char *text) {
  FILE *f = fopen(qf, "w");
  assert_non_null(f);
  fputs(text, f);
  fclose(f);
  kill(d, SIGHUP);
}

/* Namespace ns's quota once it is want, or after 30 s what it is then. The
 * daemon applies a file's quotas one namespace after another: a check of
 * several waits for each. */
static uint64_t quota_soon(const char *name, const char *ns, uint64_t want) {
  for (int i = 0; i < 3000 && quota_of(name, ns) != want; i++) dtu_sleep_ms(10);
  return quota_of(name, ns);
}

static void test_sighup_quotas(void **st) {
  (void)st;
  const char *name = tu_name("dquota");
  const char *log = log_path(name);
  char qf[256];
  snprintf(qf, sizeof qf, "/tmp/umbp-test-%s.quotas", name);
  unlink(log);
  FILE *f = fopen(qf, "w");
  fprintf(f, "# quotas\nchat 1MiB\n\n");
  fclose(f);
  const char *args[] = {"--capacity", "1MiB", "--slot-size", "4KiB", "--no-prefault", "--quota-file", qf,
                        "--quota", "batch=64KiB", "--quota", "raw\x1b\xff=64KiB", NULL};
  pid_t d = dtu_daemon_start(name, log, args);
  assert_true(d > 0);
  assert_int_equal(quota_of(name, "chat"), 1 << 20);
  assert_int_equal(quota_of(name, "batch"), 64 << 10);
  /* a name's bytes that do not print reach the log escaped, not as they are */
  assert_true(log_has_within(log, "quota of namespace 'raw"));
  const char *lt = read_log(log);
  if (strchr(lt, '\x1b') || strchr(lt, '\xff')) fprintf(stderr, "# log: %s", lt);
  assert_null(strchr(lt, '\x1b'));
  assert_null(strchr(lt, '\xff'));
  f = fopen(qf, "w");
  fprintf(f, "chat lots\n"); /* for the start below */
  fclose(f);
  f = fopen(qf, "w");
  fprintf(f, "chat 2MiB   # raised\nsearch 128KiB\n");
  fclose(f);
  kill(d, SIGHUP);
  uint64_t q = 0;
  for (int i = 0; i < 3000; i++) {
    q = quota_of(name, "search");
    if (q == 128 << 10) break;
    dtu_sleep_ms(10);
  }
  assert_int_equal(q, 128 << 10);
  assert_int_equal(quota_of(name, "chat"), 2 << 20);
  /* a bad file on SIGHUP keeps the old quotas and the daemon running */
  f = fopen(qf, "w");
  fprintf(f, "chat lots\n");
  fclose(f);
  kill(d, SIGHUP);
  char want[600];
  snprintf(want, sizeof want, "error: SIGHUP: %s:1: expected 'NAMESPACE SIZE'", qf);
  assert_true(log_has_within(log, want));
  assert_int_equal(kill(d, 0), 0);
  assert_int_equal(quota_of(name, "chat"), 2 << 20);
  assert_int_equal(DTU_RUN(out, "inspect", name), 0);
  assert_non_null(strstr(out, "search"));
  /* a file that cannot be read (here a directory in its place) is an error
   * on SIGHUP too, not an empty file: the quotas in force stay */
  assert_int_equal(unlink(qf), 0);
  assert_int_equal(mkdir(qf, 0755), 0);
  kill(d, SIGHUP);
  snprintf(want, sizeof want, "error: SIGHUP: cannot read quota file %s: Is a directory: name the file of quotas (one "
           "'NAMESPACE SIZE' a line) in it, not the directory; quotas unchanged", qf);
  assert_true(log_has_within(log, want));
  assert_null(strstr(out, "(0 entries)"));
  assert_int_equal(quota_of(name, "chat"), 2 << 20);
  assert_int_equal(quota_of(name, "search"), 128 << 10);
  /* ... and at start: refused, naming the file and the cause */
  assert_int_equal(DTU_RUN(out, "daemon", tu_name("dqdir"), "--capacity", "1MiB", "--foreground", "--quota-file", qf), 1);
  snprintf(want, sizeof want, "cannot read quota file %s: Is a directory: name the file of quotas", qf);
  assert_non_null(strstr(out, want));
  assert_int_equal(rmdir(qf), 0);
  /* a FIFO in its place: refused without waiting for a writer (open() of a
   * FIFO used to block the daemon's main loop on SIGHUP, and its start) */
  assert_int_equal(mkfifo(qf, 0600), 0);
  kill(d, SIGHUP);
  snprintf(want, sizeof want, "error: SIGHUP: cannot read quota file %s: it is a FIFO, not a regular file", qf);
  assert_true(log_has_within(log, want));
  assert_int_equal(quota_of(name, "chat"), 2 << 20);
  dtu_run_alarm_s = 10;
  int rc = DTU_RUN(out, "daemon", tu_name("dqfifo"), "--capacity", "1MiB", "--foreground", "--quota-file", qf);
  dtu_run_alarm_s = 0;
  if (rc != 1) fprintf(stderr, "# exit %d: %s", rc, out);
  assert_int_equal(rc, 1);
  snprintf(want, sizeof want, "cannot read quota file %s: it is a FIFO, not a regular file", qf);
  assert_non_null(strstr(out, want));
  assert_int_equal(unlink(qf), 0);
  /* a read error after a successful open (/proc/self/mem at offset 0 gives EIO) */
  assert_int_equal(DTU_RUN(out, "daemon", tu_name("dqeio"), "--capacity", "1MiB", "--foreground", "--quota-file",
                           "/proc/self/mem"), 1);
  assert_non_null(strstr(out, "cannot read quota file /proc/self/mem: Input/output error"));
  /* an emptied file clears the quotas it had set; a --quota of the command
   * line stays, also for a namespace the file named too (issue 32) */
  quota_file_hup(d, qf, "chat 2MiB\nbatch 1MiB\n");
  assert_int_equal(quota_soon(name, "batch", 1 << 20), 1 << 20);
  quota_file_hup(d, qf, "");
  assert_int_equal(quota_soon(name, "chat", 0), 0);
  assert_int_equal(quota_soon(name, "search", 0), 0);
  assert_int_equal(quota_soon(name, "batch", 64 << 10), 64 << 10);
  /* a glob line overrides a --quota (it comes after); once the line is gone
   * the --quota holds again (it kept the glob's bytes) */
  quota_file_hup(d, qf, "b* 1MiB\n");
  assert_int_equal(quota_soon(name, "batch", 1 << 20), 1 << 20);
  quota_file_hup(d, qf, "");
  assert_int_equal(quota_soon(name, "batch", 64 << 10), 64 << 10);
  f = fopen(qf, "w");
  fprintf(f, "chat lots\n"); /* for the start below */
  fclose(f);
  kill(d, SIGTERM);
  assert_int_equal(tu_wait(d), 0);
  f = fopen(log, "r");
  size_t n = fread(out, 1, sizeof out - 1, f);
  out[n] = 0;
  fclose(f);
  assert_non_null(strstr(out, ":1: expected 'NAMESPACE SIZE'"));
  /* a bad file at start: exit 1 naming file and line */
  assert_int_equal(DTU_RUN(out, "daemon", "--pool", name, "--foreground", "--quota-file", qf), 1);
  assert_non_null(strstr(out, ":1: expected"));
  umbp_pool_destroy(name);
  unlink(qf);
  unlink(log);
}

/* Quota-file text as editors write it. A line longer than the read buffer
 * (511 bytes) was cut into pieces, each read as a line: the tail of a long
 * comment became a quota ("evil 64KiB" below), and line numbers after it
 * were off. */
static void write_file(const char *path, const char *text) {
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fputs(text, f);
  fclose(f);
}

static void test_quota_file_text(void **st) {
  (void)st;
  const char *name = tu_name("dqtext");
  const char *log = log_path(name);
  char qf[256], text[2048], want[400];
  snprintf(qf, sizeof qf, "/tmp/umbp-test-%s.quotas", name);
  unlink(log);
  char pad[510]; /* "# " + 509 bytes: the old fgets() stopped just before " evil 64KiB" */
  memset(pad, 'x', 509);
  pad[509] = 0;
  snprintf(text, sizeof text, "# %s evil 64KiB\nchat 1MiB\n", pad);
  write_file(qf, text);
  const char *args[] = {"--capacity", "1MiB", "--slot-size", "4KiB", "--no-prefault", "--quota-file", qf, NULL};
  pid_t d = dtu_daemon_start(name, log, args);
  assert_true(d > 0);
  assert_int_equal(quota_of(name, "chat"), 1 << 20);
  assert_int_equal(quota_of(name, "evil"), UINT64_MAX); /* not registered: it was in a comment */
  kill(d, SIGTERM);
  assert_int_equal(tu_wait(d), 0);
  /* a UTF-8 byte-order mark and CRLF line ends (a Windows editor): the
   * mark is not part of the first name ("\xEF\xBB\xBFchat" was registered,
   * and 'chat' kept its old quota) */
  write_file(qf, "\xEF\xBB\xBF" "chat 2MiB\r\n# note\r\n");
  d = dtu_daemon_start(name, log, args + 5); /* adopts: --quota-file FILE only */
  assert_true(d > 0);
  assert_int_equal(quota_of(name, "chat"), 2 << 20);
  assert_int_equal(quota_of(name, "\xEF\xBB\xBF" "chat"), UINT64_MAX);
  kill(d, SIGTERM);
  assert_int_equal(tu_wait(d), 0);
  /* UTF-16 (NUL bytes): refused as not plain text */
  FILE *f = fopen(qf, "w");
  assert_non_null(f);
  fwrite("\xFF\xFE" "c\0h\0a\0t\0 \0" "1\0M\0\n\0", 1, 18, f);
  fclose(f);
  assert_int_equal(DTU_RUN(out, "daemon", name, "--foreground", "--quota-file", qf), 1);
  snprintf(want, sizeof want, "%s:1: a NUL byte: the file is not plain text (UTF-16, or binary)", qf);
  if (!strstr(out, want)) fprintf(stderr, "# %s", out);
  assert_non_null(strstr(out, want));
  /* what is wrong with a bad line is said, not only the expected form */
  static const struct {
    const char *line, *why;
  } bad[] = {
      {"chat 10 GiB\n", "got 'chat 10 GiB': a SIZE is one word: write '10GiB', not '10 GiB'"},
      {"chat -1\n", "got 'chat -1': '-1' is not a size: a whole number of bytes with an optional unit"},
      {"chat\n", "got 'chat': no SIZE after the namespace"},
      {"8GiB\n", "got '8GiB': no NAMESPACE before the size"},
      {"chat bot 1GiB\n", "a namespace name has no spaces (only a 'label:PATTERN' may)"},
      /* 'label:' without a pattern was a namespace named "label:" (and the daemon started) */
      {"label: 1GiB\n", "got 'label: 1GiB': a label pattern is 1 to"},
      {"label:\t 1GiB\n", "a label pattern is 1 to"},
  };
  dtu_run_alarm_s = 20; /* a line taken as valid starts the daemon, which would not return */
  for (unsigned i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    write_file(qf, bad[i].line);
    assert_int_equal(DTU_RUN(out, "daemon", name, "--foreground", "--quota-file", qf), 1);
    if (!strstr(out, bad[i].why)) fprintf(stderr, "# %s", out);
    assert_non_null(strstr(out, bad[i].why));
  }
  assert_int_equal(DTU_RUN(out, "daemon", name, "--quota", "chat=lots"), 2);
  assert_non_null(strstr(out, "'lots' is not a size"));
  assert_int_equal(DTU_RUN(out, "daemon", name, "--foreground", "--quota", "label:=1GiB"), 2);
  if (!strstr(out, "a label pattern is 1 to")) fprintf(stderr, "# %s", out);
  assert_non_null(strstr(out, "a label pattern is 1 to"));
  dtu_run_alarm_s = 0;
  assert_int_equal(DTU_RUN(out, "inspect", name), 0);
  assert_null(strstr(out, "label:")); /* no namespace of that name was registered */
  /* a bad line after a long one is named by its own number */
  snprintf(text, sizeof text, "# %s\nchat lots\n", pad);
  write_file(qf, text);
  assert_int_equal(DTU_RUN(out, "daemon", name, "--foreground", "--quota-file", qf), 1);
  snprintf(want, sizeof want, "%s:2: expected 'NAMESPACE SIZE'", qf);
  if (!strstr(out, want)) fprintf(stderr, "# %s", out);
  assert_non_null(strstr(out, want));
  umbp_pool_destroy(name);
  unlink(qf);
  unlink(log);
}

/* The log's wording: "1 partition" / "N partitions" when creating, and on
 * adopt a note that names only the creation options given that differ
 * (it said "--capacity 1 MiB / --slot-size 256 KiB differ" for a --capacity
 * equal to the pool's and no --slot-size at all). */
static void test_adopt_note_wording(void **st) {
  (void)st;
  const char *name = tu_name("dnote");
  const char *log = log_path(name);
  unlink(log);
  const char *create[] = {"--capacity", "1MiB", "--slot-size", "4KiB", "--no-prefault", NULL};
  const char *same_cap[] = {"--capacity", "1MiB", NULL};
  const char *other_cap[] = {"--capacity", "2MiB", NULL};
  const char *other_slot[] = {"--capacity", "1MiB", "--slot-size", "8KiB", NULL};
  /* --group is creation-only too: on a 0600 pool the group's engines cannot
   * attach, which no line said; with the pool 0660 for that group, no note */
  const char *group0[] = {"--group", "0", NULL};
  const char *const *runs[] = {create, same_cap, other_cap, other_slot, group0, group0};
  const char *note[] = {NULL, NULL, "note: --capacity 2 MiB differs from the existing pool's; it applies only",
                        "note: --slot-size 8 KiB differs from the existing pool's; it applies only",
                        "(gid 0) differs from the existing pool's (mode 0600, group 0 (", NULL};
  for (unsigned r = 0; r < 6; r++) {
    if (r == 5) {
      char shm[300];
      snprintf(shm, sizeof shm, "/dev/shm/umbp.%s", name);
      assert_int_equal(chown(shm, (uid_t)-1, 0), 0);
      assert_int_equal(chmod(shm, 0660), 0);
    }
    unlink(log);
    pid_t d = dtu_daemon_start(name, log, runs[r]);
    assert_true(d > 0);
    kill(d, SIGTERM);
    assert_int_equal(tu_wait(d), 0);
    read_log(log);
    if (r == 0) {
      umbp_pool_info info;
      umbp_attach_opts o;
      umbp_attach_opts_init(&o);
      o.read_only = true;
      umbp_pool *p;
      assert_int_equal(umbp_pool_attach(name, &o, &p), 0);
      umbp_pool_get_info(p, &info);
      umbp_pool_detach(p);
      char want[64];
      snprintf(want, sizeof want, "in %u partition%s, ", info.n_partitions, info.n_partitions == 1 ? "" : "s");
      if (!strstr(out, want)) fprintf(stderr, "# log: %s", out);
      assert_non_null(strstr(out, want));
      assert_null(strstr(out, "partition(s)"));
    }
    if (note[r] && !strstr(out, note[r])) fprintf(stderr, "# run %u log: %s", r, out);
    if (note[r]) assert_non_null(strstr(out, note[r]));
    else assert_null(strstr(out, "note: --"));
    if (r == 2) assert_null(strstr(out, "--slot-size"));
    if (r == 3) assert_null(strstr(out, "--capacity"));
    if (r == 4) assert_non_null(strstr(out, "cannot attach; destroy the pool ('umbp pool destroy "));
  }
  /* an explicit --numa-nodes list and --index-pages huge/small are
   * creation-only too, and were ignored without a word */
  umbp_pool_info info;
  umbp_attach_opts ao;
  umbp_attach_opts_init(&ao);
  ao.read_only = true;
  umbp_pool *rp;
  assert_int_equal(umbp_pool_attach(name, &ao, &rp), 0);
  umbp_pool_get_info(rp, &info);
  umbp_pool_detach(rp);
  char node[16];
  snprintf(node, sizeof node, "%d", info.n_partitions == 1 && info.partitions[0].numa_node == 1 ? 0 : 1);
  const char *other_nodes[] = {"--numa-nodes", node, "--index-pages", info.index_hugepages ? "small" : "huge", NULL};
  unlink(log);
  pid_t d = dtu_daemon_start(name, log, other_nodes);
  assert_true(d > 0);
  kill(d, SIGTERM);
  assert_int_equal(tu_wait(d), 0);
  read_log(log);
  char want[200];
  snprintf(want, sizeof want, "note: --index-pages %s differs from the existing pool's (index on %s pages)",
           info.index_hugepages ? "small" : "huge", info.index_hugepages ? "2 MiB" : "4 KiB");
  if (!strstr(out, want) || !strstr(out, "note: --numa-nodes differs from the existing pool's partitions (on node"))
    fprintf(stderr, "# log: %s", out);
  assert_non_null(strstr(out, want));
  assert_non_null(strstr(out, "note: --numa-nodes differs from the existing pool's partitions (on node"));
  umbp_pool_destroy(name);
  unlink(log);
}

/* Relative --quota-file and --log in the background mode: daemonise()
 * changes to "/", and SIGHUP re-read "rq" there ("cannot read quota file
 * rq"). The quota file is made absolute against the directory the daemon was
 * started in (a symlink stays a symlink); the log is opened before. */
static void test_daemonise_relative_paths(void **st) {
  (void)st;
  const char *name = tu_name("drel");
  char dir[256], cwd[4096], logp[300];
  snprintf(dir, sizeof dir, "/tmp/umbp-test-%s.d", name);
  snprintf(logp, sizeof logp, "%s/rlog", dir);
  assert_int_equal(mkdir(dir, 0755), 0);
  assert_non_null(getcwd(cwd, sizeof cwd));
  assert_int_equal(chdir(dir), 0);
  FILE *f = fopen("rq", "w");
  assert_non_null(f);
  fprintf(f, "chat 1MiB\n");
  fclose(f);
  int rc = DTU_RUN(out, "daemon", name, "--capacity", "1MiB", "--slot-size", "4KiB", "--no-prefault", "--quota-file",
                   "rq", "--log", "rlog");
  assert_int_equal(chdir(cwd), 0);
  if (rc != 0) fprintf(stderr, "# %s", out);
  assert_int_equal(rc, 0);
  int pid = 0;
  assert_non_null(strstr(out, "served by pid "));
  pid = atoi(strstr(out, "served by pid ") + 14);
  dtu_track(pid);
  assert_int_equal(quota_of(name, "chat"), 1 << 20);
  char rq[300];
  snprintf(rq, sizeof rq, "%s/rq", dir);
  f = fopen(rq, "w");
  assert_non_null(f);
  fprintf(f, "chat 2MiB\n");
  fclose(f);
  /* rotate the log as logrotate does (rename, then SIGHUP): the daemon opens
   * "rlog" again, in the start directory; it wrote on into the renamed file */
  char rotated[310];
  snprintf(rotated, sizeof rotated, "%s.1", logp);
  assert_int_equal(rename(logp, rotated), 0);
  kill(pid, SIGHUP);
  for (int i = 0; i < 3000 && quota_of(name, "chat") != 2 << 20; i++) dtu_sleep_ms(10);
  if (quota_of(name, "chat") != 2 << 20) dtu_dump_log(rotated);
  assert_int_equal(quota_of(name, "chat"), 2 << 20);
  /* a log that cannot be opened again (a directory in its place): the log
   * goes on into the file open before, which says so */
  char held[310], want[600];
  snprintf(held, sizeof held, "%s.held", logp);
  for (int i = 0; i < 3000 && access(logp, F_OK) != 0; i++) dtu_sleep_ms(10);
  assert_int_equal(rename(logp, held), 0);
  assert_int_equal(mkdir(logp, 0755), 0);
  kill(pid, SIGHUP);
  snprintf(want, sizeof want, "error: SIGHUP: cannot reopen log file %s: Is a directory: name a file (in that directory, "
           "e.g. umbp-daemon.log) to append the log to; logging on to the file opened before", logp);
  assert_true(log_has_within(held, want));
  assert_int_equal(rmdir(logp), 0);
  assert_int_equal(rename(held, logp), 0);
  kill(pid, SIGTERM);
  for (int i = 0; i < 3000 && kill(pid, 0) == 0; i++) dtu_sleep_ms(10);
  assert_int_equal(kill(pid, 0), -1);
  read_log(logp); /* the log went where --log named, relative to the start directory */
  snprintf(want, sizeof want, "SIGHUP: re-reading quotas from %s (1 entry)", rq);
  if (!strstr(out, want)) fprintf(stderr, "# log: %s", out);
  assert_non_null(strstr(out, want));
  assert_null(strstr(out, "cannot read quota file"));
  assert_non_null(strstr(out, "stopped"));
  snprintf(want, sizeof want, "SIGHUP: log file %s reopened", logp);
  assert_non_null(strstr(out, want));
  assert_null(strstr(out, "ready: pool")); /* that went into the renamed file */
  read_log(rotated);
  assert_non_null(strstr(out, "ready: pool"));
  assert_null(strstr(out, "stopped"));
  umbp_pool_destroy(name);
  unlink(rq);
  unlink(logp);
  unlink(rotated);
  rmdir(dir);
}

static void test_inspect_text_json(void **st) {
  (void)st;
  const char *name = tu_name("dinsp");
  umbp_pool *p = mk_pool(name, 256);
  uint32_t ns;
  assert_int_equal(umbp_ns_register(p, "chat", &ns), 0);
  assert_int_equal(umbp_events_drain(p, NULL, 0), 0); /* record removed events */
  publish_set(p, ns, 40);
  umbp_key k = itu_key(ns, 3, 0);
  uint32_t s;
  assert_int_equal(umbp_lookup_pin(p, &k, &s), 0); /* one pin held by us */
  assert_int_equal(umbp_remove(p, &(umbp_key){.ns = ns, .hash_len = 32}), -ENOENT);
  umbp_key k7 = itu_key(ns, 7, 0);
  assert_int_equal(umbp_remove(p, &k7), 0); /* one removed event */
  umbp_counters_flush(p);
  assert_int_equal(DTU_RUN(out, "inspect", name), 0);
  char lay[32], jlay[32];
  snprintf(lay, sizeof lay, "layout %d.%d", UMBP_LAYOUT_MAJOR, UMBP_LAYOUT_MINOR);
  snprintf(jlay, sizeof jlay, "\"layout\":\"%d.%d\"", UMBP_LAYOUT_MAJOR, UMBP_LAYOUT_MINOR);
  const char *want[] = {lay, "partitions:", "index: 39 entries", "probe length:", "39 published (1 pinned)",
                        "processes: 1 live, 0 dead", "chat", "removed", "counters: lookups", "daemon: none"};
  for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
    if (!strstr(out, want[i])) fprintf(stderr, "# missing '%s' in:\n%s", want[i], out);
    assert_non_null(strstr(out, want[i]));
  }
  /* our process row shows the pin */
  char row[64];
  snprintf(row, sizeof row, "%-8d %-9s %-5d %-7s %6d", (int)getpid(), "other", -1, "alive", 1);
  assert_non_null(strstr(out, row));
  assert_int_equal(DTU_RUN(out, "inspect", name, "--json", "--check"), 0);
  const char *jw[] = {"\"header\":{", jlay, "\"slots\":{\"total\":256", "\"published\":39",
                      "\"pinned\":1", "\"namespaces\":[{\"id\":0,\"name\":\"chat\",\"blocks\":39",
                      "\"type\":\"removed\"", "\"check\":{\"clean\":true", "\"probe_histogram\":[",
                      "\"daemon\":{\"running\":false"};
  for (size_t i = 0; i < sizeof jw / sizeof jw[0]; i++) {
    if (!strstr(out, jw[i])) fprintf(stderr, "# missing '%s' in:\n%s", jw[i], out);
    assert_non_null(strstr(out, jw[i]));
  }
  /* inspect consumed nothing: the removed event is still there for a drainer */
  umbp_event ev[4];
  assert_int_equal(umbp_events_drain(p, ev, 4), 1);
  assert_int_equal(ev[0].type, UMBP_EV_REMOVED);
  /* --watch redraws until SIGINT, then exits 0 */
  int fd;
  char *argv[] = {(char *)dtu_tool(), "inspect", (char *)name, "--watch", "0.1", NULL};
  pid_t w = tu_spawn(argv, &fd);
  /* SIGINT once it has drawn twice (its handler is in place before the
   * first draw; a fixed sleep was too short on a loaded machine, where the
   * signal's default action ended it), then its output to the end: all
   * within a bound */
  size_t l = 0;
  int draws = 0;
  bool eof = false, sent = false;
  uint64_t t0 = umbp_now_ns();
  while (!eof && umbp_now_ns() - t0 < 2ull * TU_WAIT_S * 1000000000ull) {
    struct pollfd pf = {.fd = fd, .events = POLLIN};
    if (poll(&pf, 1, 200) <= 0) continue;
    ssize_t r = read(fd, out + l, sizeof out - 1 - l);
    if (r <= 0) {
      eof = true;
      break;
    }
    l += (size_t)r;
    out[l] = 0;
    draws = 0;
    for (char *q = out; (q = strstr(q, "partitions:")); q++) draws++;
    if (draws >= 2 && !sent) {
      kill(w, SIGINT);
      sent = true;
    }
    if (l + 1 >= sizeof out) l = 0; /* only the draws count: start again */
  }
  close(fd);
  if (!sent) kill(w, SIGKILL);
  if (draws < 2 || !eof) fprintf(stderr, "# inspect --watch: %d draws, output ended %d:\n%s", draws, eof, out);
  assert_true(draws >= 2 && eof);
  int wrc = tu_wait(w);
  if (wrc != 0) fprintf(stderr, "# inspect --watch exit %d after SIGINT\n", wrc);
  assert_int_equal(wrc, 0);
  umbp_unpin(p, s);
  umbp_pool_detach(p);
  umbp_pool_destroy(name);
}

static void expect_violation(const char *name, const char *needle) {
  int rc = DTU_RUN(out, "inspect", name, "--check");
  if (rc != 1 || !strstr(out, needle)) fprintf(stderr, "# exit %d, wanted '%s' in:\n%s", rc, needle, out);
  assert_int_equal(rc, 1);
  assert_non_null(strstr(out, needle));
}

/* --check on deliberately corrupted states, each repaired afterwards */
static void test_check_corrupted(void **st) {
  (void)st;
  const char *name = tu_name("dcheck");
  umbp_pool *p = mk_pool(name, 128);
  uint32_t ns;
  assert_int_equal(umbp_ns_register(p, "chat", &ns), 0);
  publish_set(p, ns, 30);
  assert_int_equal(check_cli(name), 0);
  umbp_check_report *r = malloc(sizeof *r);
  assert_int_equal(umbp_pool_check(p, r), 0);
  assert_int_equal(r->n_violations, 0);
  assert_int_equal(r->slots, 128);
  assert_int_equal(r->ways, 30);
  assert_int_equal(r->ring_entries, 98);

  struct umbp_index *ix = p->index;
  /* 1. a way that points at a FREE slot */
  uint32_t free_slot = UMBP_NO_SLOT;
  for (uint32_t s = 0; s < ix->slot_count && free_slot == UMBP_NO_SLOT; s++)
    if (ST_STATE(atomic_load(&ix->meta[s].state)) == UMBP_SLOT_FREE) free_slot = s;
  uint32_t b = 0, w = 0;
  for (b = 0; b < ix->nb; b++) {
    for (w = 0; w < UMBP_BUCKET_WAYS; w++)
      if (!umbp_way_get(&ix->buckets[b], w)) break;
    if (w < UMBP_BUCKET_WAYS) break;
  }
  umbp_way_set(&ix->buckets[b], w, (0x1234ull << 32) | (free_slot + 1));
  char want[160];
  snprintf(want, sizeof want, "bucket %u points at slot %u, which is FREE", b, free_slot);
  expect_violation(name, want);
  umbp_way_set(&ix->buckets[b], w, 0);
  assert_int_equal(check_cli(name), 0);

  /* 2. a published slot with its way removed: unreachable */
  umbp_key k0 = itu_key(ns, 0, 0);
  uint32_t s0;
  assert_int_equal(umbp_lookup_pin(p, &k0, &s0), 0);
  umbp_unpin(p, s0);
  uint64_t saved = 0;
  uint32_t sb = 0, sw = 0;
  for (uint32_t bb = 0; bb < ix->nb && !saved; bb++)
    for (uint32_t ww = 0; ww < UMBP_BUCKET_WAYS; ww++) {
      uint64_t v = umbp_way_get(&ix->buckets[bb], ww);
      if (v && (uint32_t)v == s0 + 1) {
        saved = v;
        sb = bb;
        sw = ww;
        break;
      }
    }
  assert_true(saved != 0);
  umbp_way_set(&ix->buckets[sb], sw, 0);
  snprintf(want, sizeof want, "slot %u is PUBLISHED but no bucket points at it", s0);
  expect_violation(name, want);
  /* ... and reachable twice */
  umbp_way_set(&ix->buckets[sb], sw, saved);
  uint32_t w2 = 0;
  for (w2 = 0; w2 < UMBP_BUCKET_WAYS; w2++)
    if (!umbp_way_get(&ix->buckets[sb], w2)) break;
  assert_true(w2 < UMBP_BUCKET_WAYS);
  umbp_way_set(&ix->buckets[sb], w2, saved);
  snprintf(want, sizeof want, "slot %u is reachable from 2 ways", s0);
  expect_violation(name, want);
  umbp_way_set(&ix->buckets[sb], w2, 0);
  assert_int_equal(check_cli(name), 0);

  /* 3. a free slot taken off its ring and dropped: lost capacity */
  union {
    uint64_t v;
    unsigned char b[UMBP_RING_MAX_ELEM];
  } e;
  assert_int_equal(umbp_ring_dequeue(ix->rings[0], &e, p->owner_id), 0);
  snprintf(want, sizeof want, "slot %llu is FREE but on no free ring", (unsigned long long)e.v);
  expect_violation(name, want);
  /* ... unless the partition's off_ring hint says slots were left off a
   * held-up ring (reserves then find them by a scan) */
  atomic_store(&ix->ih->off_ring[0], 1);
  assert_int_equal(check_cli(name), 0);
  atomic_store(&ix->ih->off_ring[0], 0);
  /* ... and put back twice: harmless (the state CAS decides who gets it) */
  assert_int_equal(umbp_ring_enqueue(ix->rings[0], &e, p->owner_id), 0);
  assert_int_equal(check_cli(name), 0);
  assert_int_equal(umbp_ring_enqueue(ix->rings[0], &e, p->owner_id), 0);
  assert_int_equal(check_cli(name), 0);
  union { uint64_t v; unsigned char b[UMBP_RING_MAX_ELEM]; } tmp[128];
  unsigned got = 0;
  while (got < 128 && umbp_ring_dequeue(ix->rings[0], &tmp[got], p->owner_id) == 0) got++;
  unsigned put = 0;
  bool dropped = false;
  for (unsigned i = 0; i < got; i++) {
    if (tmp[i].v == e.v && !dropped) {
      dropped = true;
      continue;
    }
    put += umbp_ring_enqueue(ix->rings[0], &tmp[i], p->owner_id) == 0;
  }
  assert_int_equal(put, got - 1);
  assert_int_equal(check_cli(name), 0);

  /* 4. a pin byte of a registry slot that no process holds */
  atomic_store(&ix->pins[(uint64_t)63 * ix->pin_stride + s0], 1);
  snprintf(want, sizeof want, "slot %u holds 1 pin(s) of registry slot 63", s0);
  expect_violation(name, want);
  atomic_store(&ix->pins[(uint64_t)63 * ix->pin_stride + s0], 0);

  /* 4b. a pin of a live process whose bit is missing from the pin mask */
  uint64_t me = 1ull << p->proc_slot;
  uint64_t had = atomic_fetch_and(&ix->ih->pin_procs, ~me) & me;
  atomic_store(&ix->pins[(uint64_t)p->proc_slot * ix->pin_stride + s0], 1);
  snprintf(want, sizeof want, "registry slot %d holds pins but is not in the index's pin mask", p->proc_slot);
  expect_violation(name, want);
  atomic_store(&ix->pins[(uint64_t)p->proc_slot * ix->pin_stride + s0], 0);
  atomic_fetch_or(&ix->ih->pin_procs, had);

  /* 5. a namespace count that disagrees */
  atomic_fetch_add(&ix->ns[ns].count_word, 5); /* the count is the word's low 32 bits */
  expect_violation(name, "namespace 0 ('chat') counts 35 used slots but 30 slots hold its blocks");
  atomic_fetch_sub(&ix->ns[ns].count_word, 5);

  /* 6. an unknown state byte and a reservation of nobody */
  uint64_t sv = atomic_load(&ix->meta[free_slot].state);
  atomic_store(&ix->meta[free_slot].state, ST_MAKE(7, 0, ST_GEN(sv)));
  snprintf(want, sizeof want, "slot %u has state byte 7", free_slot);
  expect_violation(name, want);
  atomic_store(&ix->meta[free_slot].state, ST_MAKE(UMBP_SLOT_RESERVED, 40, ST_GEN(sv)));
  snprintf(want, sizeof want, "slot %u is RESERVED by registry slot 39, which no process holds", free_slot);
  expect_violation(name, want);
  atomic_store(&ix->meta[free_slot].state, sv);

  /* 7. an overflow counter below the displaced entries */
  uint32_t home = 0, disp = 0;
  for (uint32_t bb = 0; bb < ix->nb; bb++) {
    for (unsigned ww = 0; ww < UMBP_BUCKET_WAYS; ww++) {
      uint64_t v = umbp_way_get(&ix->buckets[bb], ww);
      if (!v) continue;
      uint32_t hh = umbp_bucket_home(umbp_key_hash(&ix->meta[(uint32_t)v - 1].key), ix->nb);
      if (hh != bb) {
        home = hh;
        disp = 1;
      }
    }
  }
  if (!disp) {
    /* no displaced entry yet: make one by moving a way one bucket on */
    umbp_key k1 = itu_key(ns, 1, 0);
    uint32_t s1;
    assert_int_equal(umbp_lookup_pin(p, &k1, &s1), 0);
    umbp_unpin(p, s1);
    uint64_t h = umbp_key_hash(&ix->meta[s1].key);
    home = umbp_bucket_home(h, ix->nb);
    struct umbp_bucket *hb = &ix->buckets[home], *nb = &ix->buckets[umbp_bucket_at(home, 1, ix->nb)];
    for (unsigned ww = 0; ww < UMBP_BUCKET_WAYS; ww++)
      if ((uint32_t)umbp_way_get(hb, ww) == s1 + 1) {
        uint64_t v = umbp_way_get(hb, ww);
        umbp_way_set(hb, ww, 0);
        for (unsigned w3 = 0; w3 < UMBP_BUCKET_WAYS; w3++)
          if (!umbp_way_get(nb, w3)) {
            umbp_way_set(nb, w3, v);
            break;
          }
      }
    umbp_ovf_add(&hb->ovf, 1, umbp_ovf_bit(h));
    assert_int_equal(check_cli(name), 0); /* consistent again */
  }
  uint32_t ov = atomic_exchange(&ix->buckets[home].ovf, 0);
  snprintf(want, sizeof want, "bucket %u's overflow count is 0", home);
  expect_violation(name, want);
  atomic_store(&ix->buckets[home].ovf, ov);
  assert_int_equal(check_cli(name), 0);

  /* 8. an overflow filter without a displaced key's bit (count and reach kept) */
  atomic_store(&ix->buckets[home].ovf, ov & ~0xffffu);
  snprintf(want, sizeof want, "bucket %u's overflow filter 0x0000 lacks the bit", home);
  expect_violation(name, want);
  atomic_store(&ix->buckets[home].ovf, ov);
  assert_int_equal(check_cli(name), 0);
  verify_set(p, ns, 30);

  /* 9. a registry slot in no known state */
  atomic_store(&p->procs[61].state, 7);
  expect_violation(name, "registry slot 61 has state 7, which is neither free nor live");
  atomic_store(&p->procs[61].state, UMBP_PROC_FREE);
  assert_int_equal(check_cli(name), 0);

  /* 10. a published slot's way with another signature than its key's */
  for (sb = 0; sb < ix->nb; sb++) {
    for (sw = 0; sw < UMBP_BUCKET_WAYS; sw++)
      if ((uint32_t)umbp_way_get(&ix->buckets[sb], sw) == s0 + 1) break;
    if (sw < UMBP_BUCKET_WAYS) break;
  }
  assert_true(sb < ix->nb);
  saved = umbp_way_get(&ix->buckets[sb], sw);
  umbp_way_set(&ix->buckets[sb], sw, saved ^ (0x8000ull << 32));
  snprintf(want, sizeof want, "bucket %u's way for slot %u has signature 0x%04x", sb, s0,
           (unsigned)(uint16_t)((saved >> 32) ^ 0x8000));
  expect_violation(name, want);
  umbp_way_set(&ix->buckets[sb], sw, saved);

  /* 11. a way past the pool's last slot; a reservation by owner id 0 */
  umbp_way_set(&ix->buckets[b], w, (0x1234ull << 32) | (ix->slot_count + 10 + 1));
  snprintf(want, sizeof want, "bucket %u way %u holds slot id %u, outside the pool's %u slots", b, w,
           ix->slot_count + 10, ix->slot_count);
  expect_violation(name, want);
  umbp_way_set(&ix->buckets[b], w, 0);
  atomic_store(&ix->meta[free_slot].state, ST_MAKE(UMBP_SLOT_RESERVED, 0, ST_GEN(sv)));
  snprintf(want, sizeof want, "slot %u is RESERVED by owner id 0, which is no registry slot", free_slot);
  expect_violation(name, want);
  atomic_store(&ix->meta[free_slot].state, sv);
  assert_int_equal(check_cli(name), 0);

  /* 12. a free ring's or the event ring's header rewritten: inspect still
   * attaches (read-only, without the rings) and --check names the ring,
   * once: the free slots are not also reported lost */
  {
    struct umbp_ring_hdr *rh[2] = {umbp_pool_at(p, p->hdr->partitions[0].ring_offset, 64),
                                   umbp_pool_region(p, UMBP_REG_EVENTS)};
    const char *says[2] = {"the free-slot ring header of partition 0 is corrupted", "the event ring header is corrupted"};
    for (int i = 0; i < 2; i++) {
      uint32_t m = rh[i]->mask;
      rh[i]->mask = m ^ 1;
      expect_violation(name, says[i]);
      assert_non_null(strstr(out, "check: 1 violation\n"));
      assert_null(strstr(out, "on no free ring"));
      rh[i]->mask = m;
    }
  }
  assert_int_equal(check_cli(name), 0);

  /* the JSON form lists the violation too */
  atomic_store(&ix->pins[(uint64_t)62 * ix->pin_stride + s0], 2);
  assert_int_equal(DTU_RUN(out, "inspect", name, "--check", "--json"), 1);
  assert_non_null(strstr(out, "\"clean\":false"));
  assert_non_null(strstr(out, "pin(s) of registry slot 62"));
  atomic_store(&ix->pins[(uint64_t)62 * ix->pin_stride + s0], 0);
  assert_int_equal(umbp_pool_check(p, r), 0);
  assert_int_equal(r->n_violations, 0);
  free(r);
  umbp_pool_detach(p);
  umbp_pool_destroy(name);
}

/* missing, corrupted and foreign pools; bad options */
static void test_bad_input(void **st) {
  (void)st;
  assert_int_equal(DTU_RUN(out, "inspect", "no-such-pool-xyz"), 1);
  assert_non_null(strstr(out, "no pool named 'no-such-pool-xyz'"));
  assert_non_null(strstr(out, "umbp pool create"));
  assert_int_equal(DTU_RUN(out, "daemon", "--pool", "no-such-pool-xyz", "--foreground"), 1);
  assert_non_null(strstr(out, "give --capacity SIZE"));
  /* usage errors: exit 2 */
  assert_int_equal(DTU_RUN(out, "inspect"), 2);
  assert_non_null(strstr(out, "missing pool NAME"));
  assert_int_equal(DTU_RUN(out, "inspect", "x", "--watch", "soon"), 2);
  assert_int_equal(DTU_RUN(out, "inspect", "bad/name"), 2);
  assert_int_equal(DTU_RUN(out, "inspect", "x", "--check", "--watch", "1"), 2);
  assert_int_equal(DTU_RUN(out, "daemon", "--capacity", "1MiB"), 2);
  assert_non_null(strstr(out, "missing pool NAME"));
  /* the pool is positional like 'pool create NAME'; --pool NAME is an alias,
   * and the two must agree */
  assert_int_equal(DTU_RUN(out, "daemon", "no-such-pool-xyz", "--foreground"), 1);
  assert_non_null(strstr(out, "give --capacity SIZE"));
  assert_int_equal(DTU_RUN(out, "daemon", "--foreground", "no-such-pool-xyz", "--pool", "no-such-pool-xyz"), 1);
  assert_int_equal(DTU_RUN(out, "daemon", "a", "--pool", "b"), 2);
  assert_non_null(strstr(out, "named twice"));
  assert_int_equal(DTU_RUN(out, "daemon", "--pool", "a", "--pool", "b"), 2);
  assert_int_equal(DTU_RUN(out, "daemon", "a", "b"), 2);
  assert_non_null(strstr(out, "unexpected argument 'b'"));
  assert_int_equal(DTU_RUN(out, "daemon", "--pool", "x", "--quota", "chat"), 2);
  assert_non_null(strstr(out, "NAMESPACE=SIZE"));
  /* a second --quota-file or --log replaced the first without a word */
  assert_int_equal(DTU_RUN(out, "daemon", "x", "--quota-file", "/nonexistent/a", "--quota-file", "/nonexistent/b"), 2);
  assert_non_null(strstr(out, "--quota-file '/nonexistent/b' after --quota-file '/nonexistent/a': the daemon reads "
                              "one quota file"));
  assert_int_equal(DTU_RUN(out, "daemon", "x", "--log", "/nonexistent/a", "--log", "/nonexistent/b"), 2);
  assert_non_null(strstr(out, "--log '/nonexistent/b' after --log '/nonexistent/a'"));
  assert_int_equal(DTU_RUN(out, "daemon", "x", "--capacity", "lots"), 2);
  assert_int_equal(DTU_RUN(out, "daemon", "--pool", "x", "--evict-low", "50", "--evict-high", "40"), 2);
  /* one given: the other is named as the default, not as if it had been written */
  assert_int_equal(DTU_RUN(out, "daemon", "x", "--evict-high", "5"), 2);
  if (!strstr(out, "--evict-low 5 (the default) must be below --evict-high 5: give a lower --evict-low"))
    fprintf(stderr, "# got: %s", out);
  assert_non_null(strstr(out, "--evict-low 5 (the default) must be below --evict-high 5: give a lower --evict-low"));
  assert_int_equal(DTU_RUN(out, "daemon", "x", "--evict-low", "10"), 2);
  assert_non_null(strstr(out, "--evict-high 10 (the default): give a higher --evict-high"));
  assert_int_equal(DTU_RUN(out, "daemon", "x", "--bogus"), 2);
  assert_int_equal(DTU_RUN(out, "daemon", "--pool", "x", "--capacity", "1MiB", "--slot-size", "4097"), 2);
  assert_non_null(strstr(out, "--slot-size '4097'"));
  assert_int_equal(DTU_RUN(out, "daemon", "--pool", "x", "--capacity", "1MiB", "--numa-nodes", "1,1"), 2);
  assert_non_null(strstr(out, "lists node 1 twice"));
  assert_int_equal(DTU_RUN(out, "daemon", "--pool", "x", "--capacity", "0x100000"), 2);
  assert_int_equal(DTU_RUN(out, "daemon", "x", "--capacity"), 2);
  assert_non_null(strstr(out, "option '--capacity' needs a value"));
  /* a capacity no machine can make a pool of is a usage error */
  const char *nocap = tu_name("dnocap");
  assert_int_equal(DTU_RUN(out, "daemon", nocap, "--capacity", "1B", "--foreground"), 2);
  assert_non_null(strstr(out, "raise --capacity"));
  assert_non_null(strstr(out, "Try 'umbp daemon --help'"));
  assert_int_equal(DTU_RUN(out, "daemon", nocap, "--capacity", "100TiB", "--foreground"), 2);
  assert_non_null(strstr(out, "at most 16777215 are supported"));
  char nopath[128];
  snprintf(nopath, sizeof nopath, "/dev/shm/umbp.%s", nocap);
  assert_int_equal(access(nopath, F_OK), -1);
  /* a numeric --group out of gid_t's range is refused, not truncated (99999999999
   * used to become gid 1215752191, 4294967295 (gid_t)-1); the bad watermarks
   * after it make sure that nothing is created if it is not */
  const char *const bad_gids[] = {"99999999999", "4294967295", "18446744073709551617", "-5", "+5", " 5"};
  for (unsigned i = 0; i < sizeof bad_gids / sizeof bad_gids[0]; i++) {
    assert_int_equal(DTU_RUN(out, "daemon", "x", "--capacity", "1MiB", "--group", bad_gids[i], "--evict-low", "50",
                             "--evict-high", "40"), 2);
    char want[100];
    snprintf(want, sizeof want, "--group '%s' is not a group id: use 0 to 4294967294, or a group name", bad_gids[i]);
    if (!strstr(out, want)) fprintf(stderr, "# %s", out);
    assert_non_null(strstr(out, want));
  }
  assert_int_equal(DTU_RUN(out, "daemon", "x", "--capacity", "1MiB", "--group", "4294967294", "--evict-low", "50",
                           "--evict-high", "40"), 2);
  assert_non_null(strstr(out, "--evict-low 50 must be below")); /* the largest gid passes */
  assert_int_equal(DTU_RUN(out, "daemon", "--help"), 0);
  assert_non_null(strstr(out, "Exit status"));
  assert_int_equal(DTU_RUN(out, "inspect", "--help"), 0);
  assert_non_null(strstr(out, "Exit status"));

  /* not a pool at all */
  const char *junk = tu_name("djunk");
  char path[256];
  snprintf(path, sizeof path, "/dev/shm/umbp.%s", junk);
  int fd = open(path, O_RDWR | O_CREAT | O_EXCL, 0600);
  assert_true(fd >= 0);
  char garbage[8192];
  memset(garbage, 0x5a, sizeof garbage);
  assert_int_equal(write(fd, garbage, sizeof garbage), (ssize_t)sizeof garbage);
  close(fd);
  assert_int_equal(DTU_RUN(out, "inspect", junk), 1);
  assert_non_null(strstr(out, "is not a umbp pool"));
  assert_int_equal(DTU_RUN(out, "daemon", "--pool", junk, "--foreground"), 1);
  assert_non_null(strstr(out, "is not a umbp pool"));
  unlink(path);

  /* a real pool whose header was damaged: checksum names the fix */
  const char *bad = tu_name("dcorrupt");
  umbp_pool *p = mk_pool(bad, 64);
  umbp_pool_detach(p);
  snprintf(path, sizeof path, "/dev/shm/umbp.%s", bad);
  fd = open(path, O_RDWR);
  uint32_t sc = 12345;
  assert_int_equal(pwrite(fd, &sc, 4, offsetof(struct umbp_shm_header, slot_count)), 4);
  close(fd);
  assert_int_equal(DTU_RUN(out, "inspect", bad), 1);
  assert_non_null(strstr(out, "checksum"));
  assert_non_null(strstr(out, "destroy the pool"));
  assert_int_equal(DTU_RUN(out, "daemon", "--pool", bad, "--foreground", "--capacity", "1MiB"), 1);
  assert_non_null(strstr(out, "umbp pool destroy"));
  /* truncated */
  umbp_pool_destroy(bad);
  p = mk_pool(bad, 64);
  umbp_pool_detach(p);
  assert_int_equal(truncate(path, 1 << 20), 0);
  assert_int_equal(DTU_RUN(out, "inspect", bad), 1);
  assert_non_null(strstr(out, "truncated"));
  umbp_pool_destroy(bad);
}

/* the daemon never adopts another uid's segment */
static void test_other_uid_refused(void **st) {
  (void)st;
  if (geteuid() != 0) {
    fprintf(stderr, "# skipped: needs root to chown a pool file to nobody (running as uid %u)\n", (unsigned)geteuid());
    skip();
  }
  const char *name = tu_name("duid");
  umbp_pool *p = mk_pool(name, 64);
  assert_int_equal(fchown(p->fd, NOBODY, NOBODY), 0);
  umbp_pool_detach(p);
  assert_int_equal(DTU_RUN(out, "daemon", "--pool", name, "--foreground"), 1);
  if (!strstr(out, "belongs to uid 65534")) fprintf(stderr, "# got: %s", out);
  assert_non_null(strstr(out, "refusing to adopt"));
  assert_non_null(strstr(out, "belongs to uid 65534"));
  assert_int_equal(dtu_daemon_pid(name, &(int){0}), 0);
  /* and nobody cannot adopt root's pool either: the file is 0600 of root */
  umbp_pool_destroy(name);
  p = mk_pool(name, 64);
  umbp_pool_detach(p);
  assert_int_equal(DTU_RUN_AS(NOBODY, out, "daemon", "--pool", name, "--foreground"), 1);
  if (!strstr(out, "belongs to uid 0")) fprintf(stderr, "# got: %s", out);
  /* the daemon's own refusal, not the attach's "ask its owner to create it
   * with group access", after which the daemon still refuses the pool */
  assert_non_null(strstr(out, "refusing to adopt"));
  assert_non_null(strstr(out, "belongs to uid 0"));
  assert_non_null(strstr(out, "run the daemon as that user"));
  assert_null(strstr(out, "group access"));
  /* nor remove it: the refusal names the owner and the fix, and the pool stays */
  assert_int_equal(DTU_RUN_AS(NOBODY, out, "pool", "destroy", "--force", name), 1);
  if (!strstr(out, "belongs to uid 0")) fprintf(stderr, "# got: %s", out);
  assert_non_null(strstr(out, "belongs to uid 0"));
  assert_non_null(strstr(out, "as that user"));
  assert_int_equal(dtu_daemon_pid(name, &(int){0}), 0); /* still there */
  umbp_pool_destroy(name);
}

/* inspect works with read permission only */
static void test_inspect_read_only_user(void **st) {
  (void)st;
  if (geteuid() != 0) {
    fprintf(stderr, "# skipped: needs root to drop to nobody (running as uid %u)\n", (unsigned)geteuid());
    skip();
  }
  if (access(dtu_tool(), X_OK) != 0) skip();
  const char *name = tu_name("dro");
  umbp_pool *p = mk_pool(name, 64);
  uint32_t ns;
  assert_int_equal(umbp_ns_register(p, "chat", &ns), 0);
  publish_set(p, ns, 10);
  /* 0600 root: nobody may not read it */
  int rc = DTU_RUN_AS(NOBODY, out, "inspect", name);
  if (rc == 126) {
    fprintf(stderr, "# skipped: %s", out);
    umbp_pool_detach(p);
    umbp_pool_destroy(name);
    skip();
  }
  assert_int_equal(rc, 1);
  assert_non_null(strstr(out, "for reading"));
  /* 0644: nobody reads it, check included, and the segment is unchanged */
  assert_int_equal(fchmod(p->fd, 0644), 0);
  if (p->index_huge_bytes) {
    /* the index file (index pages "try") keeps 0600: refused, naming it and the fix */
    char ipath[512], dir[256] = "";
    assert_int_equal(umbp_hugetlbfs_mount(dir, sizeof dir), 0);
    snprintf(ipath, sizeof ipath, "%s/umbp-index.%s", dir, name);
    assert_int_equal(DTU_RUN_AS(NOBODY, out, "inspect", name), 1);
    assert_non_null(strstr(out, "index file"));
    assert_non_null(strstr(out, "chmod/chgrp both"));
    assert_int_equal(chmod(ipath, 0644), 0);
  }
  uint64_t gen = atomic_load(&p->hdr->run_generation);
  umbp_pool_info before;
  umbp_pool_get_info(p, &before);
  rc = DTU_RUN_AS(NOBODY, out, "inspect", name, "--check");
  if (rc) fprintf(stderr, "# %s", out);
  assert_int_equal(rc, 0);
  assert_non_null(strstr(out, "10 published"));
  assert_non_null(strstr(out, "check: clean"));
  assert_int_equal(DTU_RUN_AS(NOBODY, out, "inspect", name, "--json"), 0);
  assert_non_null(strstr(out, "\"file_mode\":420"));
  umbp_pool_info after;
  umbp_pool_get_info(p, &after);
  assert_int_equal(atomic_load(&p->hdr->run_generation), gen);
  assert_int_equal(after.procs_live, before.procs_live); /* no registry slot taken */
  verify_set(p, ns, 10);
  umbp_pool_detach(p);
  umbp_pool_destroy(name);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_teardown(test_daemon_kill9_keeps_blocks, dtu_kill_daemons), cmocka_unit_test_teardown(test_second_daemon_refused, dtu_kill_daemons),
      cmocka_unit_test_teardown(test_stopped_holder_named, dtu_kill_daemons),
      cmocka_unit_test_teardown(test_daemonise_stopped_before_ready, teardown_stopstart),
      cmocka_unit_test_teardown(test_foreground_log_reader_stopped, dtu_kill_daemons),
      cmocka_unit_test_teardown(test_daemonise, dtu_kill_daemons),                 cmocka_unit_test_teardown(test_sighup_quotas, dtu_kill_daemons),
      cmocka_unit_test_teardown(test_inspect_text_json, dtu_kill_daemons),         cmocka_unit_test_teardown(test_check_corrupted, dtu_kill_daemons),
      cmocka_unit_test_teardown(test_bad_input, dtu_kill_daemons),                 cmocka_unit_test_teardown(test_other_uid_refused, dtu_kill_daemons),
      cmocka_unit_test_teardown(test_inspect_read_only_user, dtu_kill_daemons),
      cmocka_unit_test_teardown(test_half_made_pool, dtu_kill_daemons),
      cmocka_unit_test_teardown(test_daemonise_relative_paths, dtu_kill_daemons),
      cmocka_unit_test_teardown(test_adopt_note_wording, dtu_kill_daemons),
      cmocka_unit_test_teardown(test_quota_file_text, dtu_kill_daemons),
      cmocka_unit_test_teardown(test_daemon_notices_pool_gone, dtu_kill_daemons),
      cmocka_unit_test_teardown(test_daemon_pool_truncated_deep, dtu_kill_daemons),
      cmocka_unit_test_teardown(test_sigbus_names_pool, dtu_kill_daemons),
      cmocka_unit_test_teardown(test_sigbus_broken_stderr_pipe, dtu_kill_daemons),
  };
  return cmocka_run_group_tests_name("daemon", tests, NULL, NULL);
}
