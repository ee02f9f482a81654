/* SPDX-License-Identifier: Apache-2.0 */
/* A SIGBUS in a pool's mapping of a library user (src/shm/sigbus.c): the
 * process still dies of it, after one line on stderr that names the pool, its
 * file and the cause; every other SIGBUS reaches the disposition that was in
 * place before the first attach; UMBP_NO_SIGBUS_HANDLER=1 leaves SIGBUS
 * alone. Each case execs sigbus_helper (its own mapping of a real pool) and
 * truncates the pool's file under it.
 *
 * Sanitizer builds: ASan installs its own SIGBUS handler before main(), which
 * reports and exits with status 1. The cases run the helper with
 * handle_sigbus=0, so that what they see is the library's handler over the
 * default action, as in a production build; test_asan_reports_after_ours
 * checks the ASan order (ours, then ASan's report) and skips elsewhere. */
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <time.h>

#include "test_util.h"
#include "umbp/pool.h"

static bool asan(void) {
  const char *s = getenv("UMBP_SANITIZE");
  return s && strstr(s, "address");
}

struct run {
  int status; /* waitpid's */
  char out[512], err[8192];
};

/* Run sigbus_helper PREV MODE NAME with env (NULL-ended "K=V" list added).
 * For MODE pool: truncate the pool's file to 4096 bytes once it says
 * "ready". Bounded wait: a helper alive after 120 s (looping on a fault) is
 * killed and the case fails. */
static void run_argv(char *const *argv, const char *mode, const char *name, const char *const *env,
                     bool asan_default, struct run *r);

static void run_helper(const char *prev, const char *mode, const char *name, const char *const *env,
                       bool asan_default, struct run *r) {
  char *argv[] = {(char *)tu_helper("sigbus_helper"), (char *)prev, (char *)mode, (char *)name, NULL};
  run_argv(argv, mode, name, env, asan_default, r);
}

static bool close_stderr; /* the next run starts the helper with fd 2 closed */

/* argv (mode: as run_helper's) */
static void run_argv(char *const *argv, const char *mode, const char *name, const char *const *env,
                     bool asan_default, struct run *r) {
  char errpath[] = "/tmp/umbp-sigbus-err-XXXXXX";
  int efd = mkstemp(errpath);
  assert_true(efd >= 0);
  unlink(errpath);
  int po[2];
  assert_int_equal(pipe(po), 0);
  pid_t pid = fork();
  if (pid == 0) {
    dup2(po[1], 1);
    if (close_stderr) close(2);
    else dup2(efd, 2);
    close(po[0]);
    close(po[1]);
    for (const char *const *e = env; e && *e; e++) putenv((char *)*e);
    if (asan() && !asan_default) {
      static char opt[600];
      const char *o = getenv("ASAN_OPTIONS");
      snprintf(opt, sizeof opt, "ASAN_OPTIONS=%s%shandle_sigbus=0", o ? o : "", o && *o ? ":" : "");
      putenv(opt);
    }
    execv(argv[0], argv);
    _exit(127);
  }
  close(po[1]);
  memset(r, 0, sizeof *r);
  size_t n = 0;
  bool truncated = false;
  time_t until = time(NULL) + 120;
  for (;;) {
    struct pollfd pf = {.fd = po[0], .events = POLLIN};
    int pr = poll(&pf, 1, 1000);
    if (pr > 0) {
      ssize_t k = read(po[0], r->out + n, sizeof r->out - 1 - n);
      if (k <= 0) break;
      n += (size_t)k;
      r->out[n] = 0;
      if (!truncated && !strcmp(mode, "pool") && strstr(r->out, "ready\n")) {
        char path[128];
        snprintf(path, sizeof path, "/dev/shm/umbp.%s", name);
        int fd = open(path, O_RDWR);
        assert_true(fd >= 0);
        assert_int_equal(ftruncate(fd, 4096), 0); /* the header stays; every slot is gone */
        close(fd);
        truncated = true;
      }
    }
    if (time(NULL) > until) {
      kill(pid, SIGKILL);
      break;
    }
  }
  close(po[0]);
  int st = 0;
  while (waitpid(pid, &st, WNOHANG) == 0) {
    if (time(NULL) > until) kill(pid, SIGKILL);
    struct timespec ts = {0, 10 * 1000 * 1000};
    nanosleep(&ts, NULL);
  }
  r->status = st;
  ssize_t k = pread(efd, r->err, sizeof r->err - 1, 0);
  r->err[k > 0 ? k : 0] = 0;
  close(efd);
  fprintf(stderr, "# %s %s: status 0x%x, stdout: %s# stderr: %s\n", argv[1], mode, st, r->out, r->err);
}

static char made[8][64]; /* this case's pools, destroyed by its teardown whatever its result */
static unsigned n_made;

static int destroy_made(void **st) {
  (void)st;
  for (unsigned i = 0; i < n_made; i++) umbp_pool_destroy(made[i]);
  n_made = 0;
  return 0;
}

static const char *new_pool(void) {
  const char *name = tu_name("sigbus");
  if (n_made < 8) snprintf(made[n_made++], sizeof made[0], "%s", name);
  umbp_pool_params pp;
  umbp_pool_params_init(&pp);
  pp.capacity = 4 << 20;
  pp.slot_size = 64 << 10;
  umbp_pool *p;
  assert_int_equal(umbp_pool_create(name, &pp, &p), 0);
  umbp_pool_detach(p);
  return name;
}

static unsigned count(const char *s, const char *what) {
  unsigned n = 0;
  for (const char *q = s; (q = strstr(q, what)); q++) n++;
  return n;
}

static void assert_died_of_sigbus(const struct run *r) {
  assert_true(WIFSIGNALED(r->status));
  assert_int_equal(WTERMSIG(r->status), SIGBUS);
}

static void assert_exited(const struct run *r, int code) {
  assert_true(WIFEXITED(r->status));
  assert_int_equal(WEXITSTATUS(r->status), code);
}

/* The message: the pool, its file, the cause, the fix; once. */
static void assert_named(const struct run *r, const char *name) {
  char want[256];
  assert_int_equal(count(r->err, "umbp: SIGBUS in process "), 1);
  snprintf(want, sizeof want, " of pool '%s': its file (/dev/shm/umbp.%s) was truncated to 4096 bytes under this "
                              "process by another process", name, name);
  assert_non_null(strstr(r->err, want));
  snprintf(want, sizeof want, "destroy it ('umbp pool destroy %s') and create it again", name);
  assert_non_null(strstr(r->err, want));
  assert_non_null(strstr(r->err, "docs/operations.md"));
}

/* A library user touching slots of a pool whose file another process
 * truncates: the message, then death by SIGBUS as before. */
static void test_pool_fault_named(void **st) {
  (void)st;
  const char *name = new_pool();
  struct run r;
  run_helper("dfl", "pool", name, NULL, false, &r);
  assert_non_null(strstr(r.out, "handler ours\n"));
  assert_died_of_sigbus(&r);
  assert_named(&r, name);
}

/* Four threads touching the lost pages while another attaches and detaches
 * a second pool in a loop (the table changes while the handler reads it):
 * the line names the truncated pool, once, and the process dies of SIGBUS. */
static void test_threads_one_line(void **st) {
  (void)st;
  const char *name = new_pool(), *other = new_pool();
  char churn[128];
  snprintf(churn, sizeof churn, "SIGBUS_HELPER_CHURN=%s", other);
  const char *env[] = {"SIGBUS_HELPER_THREADS=4", churn, NULL};
  struct run r;
  run_helper("dfl", "pool", name, env, false, &r);
  assert_died_of_sigbus(&r);
  assert_named(&r, name);
}

/* stderr a pipe nobody reads any more (the engine's log collector died):
 * writing the line raises SIGPIPE, which must not end the process in place
 * of the SIGBUS (no core dump, no faulthandler, another exit status). */
static void test_stderr_broken_pipe_still_sigbus(void **st) {
  (void)st;
  const char *name = new_pool();
  const char *env[] = {"SIGBUS_HELPER_EPIPE=1", NULL};
  struct run r;
  run_helper("dfl", "pool", name, env, false, &r);
  assert_non_null(strstr(r.out, "handler ours\n"));
  assert_died_of_sigbus(&r);
}

/* Several threads fault on the lost pages while the first of them is still
 * writing the line (here: stderr is a full pipe that the test drains only a
 * second later): the others wait for it before they pass the signal on, so
 * the process does not die of their fault with the line unwritten. */
static void test_line_written_before_another_thread_dies(void **st) {
  (void)st;
  const char *name = new_pool();
  int po[2], pe[2];
  assert_int_equal(pipe(po), 0);
  assert_int_equal(pipe(pe), 0);
  int fl = fcntl(pe[1], F_GETFL);
  assert_int_equal(fcntl(pe[1], F_SETFL, fl | O_NONBLOCK), 0);
  char fill[4096];
  memset(fill, 'x', sizeof fill);
  size_t filled = 0;
  for (ssize_t k; (k = write(pe[1], fill, sizeof fill)) > 0;) filled += (size_t)k;
  assert_int_equal(fcntl(pe[1], F_SETFL, fl), 0); /* full: the line's write blocks until the test reads */
  pid_t pid = fork();
  if (pid == 0) {
    dup2(po[1], 1);
    dup2(pe[1], 2);
    close(po[0]);
    close(po[1]);
    close(pe[0]);
    close(pe[1]);
    putenv("SIGBUS_HELPER_THREADS=4");
    if (asan()) putenv("ASAN_OPTIONS=handle_sigbus=0");
    char *argv[] = {(char *)tu_helper("sigbus_helper"), "dfl", "pool", (char *)name, NULL};
    execv(argv[0], argv);
    _exit(127);
  }
  close(po[1]);
  close(pe[1]);
  time_t until = time(NULL) + 120; /* a helper alive after that (hung) is killed and the case fails */
  char out[512] = "";
  size_t n = 0;
  while (!strstr(out, "ready\n") && n + 1 < sizeof out && time(NULL) < until) {
    struct pollfd pf = {.fd = po[0], .events = POLLIN};
    if (poll(&pf, 1, 1000) <= 0) continue;
    ssize_t k = read(po[0], out + n, sizeof out - 1 - n);
    if (k <= 0) break;
    n += (size_t)k;
    out[n] = 0;
  }
  if (!strstr(out, "ready\n")) kill(pid, SIGKILL);
  assert_non_null(strstr(out, "ready\n"));
  char path[128];
  snprintf(path, sizeof path, "/dev/shm/umbp.%s", name);
  int fd = open(path, O_RDWR);
  assert_true(fd >= 0);
  assert_int_equal(ftruncate(fd, 4096), 0);
  close(fd);
  struct timespec second = {1, 0};
  nanosleep(&second, NULL); /* the other threads fault meanwhile */
  static char err[1 << 20];
  size_t e = 0;
  while (e + 1 < sizeof err) {
    struct pollfd pf = {.fd = pe[0], .events = POLLIN};
    if (time(NULL) > until) kill(pid, SIGKILL);
    if (poll(&pf, 1, 1000) <= 0) continue;
    ssize_t k = read(pe[0], err + e, sizeof err - 1 - e);
    if (k <= 0) break;
    e += (size_t)k;
  }
  err[e] = 0;
  close(pe[0]);
  close(po[0]);
  int status = 0;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  fprintf(stderr, "# status 0x%x, stderr after the filler: %s\n", status, e > filled ? err + filled : "");
  assert_true(e >= filled);
  struct run r = {.status = status};
  snprintf(r.err, sizeof r.err, "%s", err + filled);
  assert_died_of_sigbus(&r);
  assert_named(&r, name);
}

/* A handler installed before the first attach (Python's faulthandler, an
 * engine's crash reporter) still runs after the message, with the fault's
 * siginfo (si_code BUS_ADRERR, 2). */
static void test_pool_fault_then_previous(void **st) {
  (void)st;
  const char *name = new_pool();
  struct run r;
  run_helper("info", "pool", name, NULL, false, &r);
  assert_exited(&r, 42);
  assert_named(&r, name);
  assert_non_null(strstr(r.err, "prev: siginfo code 2"));
  assert_true(strstr(r.err, "umbp: SIGBUS") < strstr(r.err, "prev: "));
  name = new_pool(); /* that one is truncated */
  run_helper("plain", "pool", name, NULL, false, &r);
  assert_exited(&r, 43);
  assert_named(&r, name);
  assert_non_null(strstr(r.err, "prev: plain"));
}

/* The handler before ours is called as the kernel would have called it:
 * SA_RESETHAND resets SIGBUS to the default first (a one-shot reporter that
 * returns is not called again and again by the re-executed fault: the
 * process dies of it); its sa_mask is blocked and SA_NODEFER leaves SIGBUS
 * unblocked while it runs; SA_ONSTACK runs it on the thread's alternate
 * stack. */
static void test_previous_flags_kept(void **st) {
  (void)st;
  const char *name = new_pool();
  struct run r;
  run_helper("reset", "pool", name, NULL, false, &r);
  assert_non_null(strstr(r.out, "handler ours\n"));
  assert_died_of_sigbus(&r);
  assert_named(&r, name);
  assert_int_equal(count(r.err, "prev: reset\n"), 1);
  assert_null(strstr(r.err, "prev: called again"));
  name = new_pool();
  run_helper("nodefer", "pool", name, NULL, false, &r);
  assert_exited(&r, 45);
  assert_named(&r, name);
  assert_non_null(strstr(r.err, "prev: mask bus=0 usr1=1\n"));
  name = new_pool();
  run_helper("onstack", "pool", name, NULL, false, &r);
  assert_exited(&r, 46);
  assert_named(&r, name);
  assert_non_null(strstr(r.err, "prev: onstack 1\n"));
}

/* A SIGBUS outside every pool (a file the helper maps and truncates itself),
 * or one sent by raise(): no message, and whatever was there before gets it:
 * an SA_SIGINFO handler with the fault's code, a plain one, the default
 * action; an ignored fault dies as the kernel makes it (no endless loop), an
 * ignored raise() is ignored. */
static void test_other_sigbus_passed_on(void **st) {
  (void)st;
  const char *name = new_pool();
  struct run r;
  run_helper("info", "other", name, NULL, false, &r);
  assert_non_null(strstr(r.out, "handler ours\n"));
  assert_exited(&r, 42);
  assert_non_null(strstr(r.err, "prev: siginfo code 2"));
  assert_null(strstr(r.err, "umbp:"));
  run_helper("plain", "other", name, NULL, false, &r);
  assert_exited(&r, 43);
  assert_null(strstr(r.err, "umbp:"));
  run_helper("dfl", "other", name, NULL, false, &r);
  assert_died_of_sigbus(&r);
  assert_null(strstr(r.err, "umbp:"));
  run_helper("ign", "other", name, NULL, false, &r);
  assert_died_of_sigbus(&r);
  assert_null(strstr(r.err, "umbp:"));
  run_helper("ignsi", "other", name, NULL, false, &r); /* SIG_IGN with SA_SIGINFO: no call to address 1 */
  assert_died_of_sigbus(&r);
  assert_null(strstr(r.err, "umbp:"));
  run_helper("info", "kill", name, NULL, false, &r);
  assert_exited(&r, 42);
  assert_non_null(strstr(r.err, "prev: siginfo code -")); /* SI_TKILL */
  run_helper("dfl", "kill", name, NULL, false, &r);
  assert_died_of_sigbus(&r);
  run_helper("ign", "kill", name, NULL, false, &r);
  assert_exited(&r, 0);
  assert_null(strstr(r.err, "umbp:"));
}

/* A program that reports its pools' SIGBUS itself (the umbp commands) marks
 * them quiet: with its handler installed before the library's (the order the
 * commands never have: their own is the last), its message is still the only
 * one and its exit status stands. */
static void test_quiet_pool_left_to_program(void **st) {
  (void)st;
  const char *name = new_pool();
  struct run r;
  run_helper("cli", "pool", name, NULL, false, &r);
  assert_non_null(strstr(r.out, "handler ours\n"));
  assert_exited(&r, 3);
  assert_int_equal(count(r.err, "cli: pool fault"), 1);
  assert_null(strstr(r.err, "umbp:"));
}

/* UMBP_NO_SIGBUS_HANDLER=1: SIGBUS is left as it was (SIG_DFL here), and the
 * process dies of the truncation without the message; =0 keeps it. */
static void test_env_turns_it_off(void **st) {
  (void)st;
  const char *name = new_pool();
  struct run r;
  const char *off[] = {"UMBP_NO_SIGBUS_HANDLER=1", NULL};
  run_helper("dfl", "pool", name, off, false, &r);
  assert_non_null(strstr(r.out, "handler dfl\n"));
  assert_died_of_sigbus(&r);
  assert_null(strstr(r.err, "umbp:"));
  name = new_pool();
  const char *on[] = {"UMBP_NO_SIGBUS_HANDLER=0", NULL};
  run_helper("dfl", "pool", name, on, false, &r);
  assert_non_null(strstr(r.out, "handler ours\n"));
  assert_died_of_sigbus(&r);
  assert_named(&r, name);
}

/* A process started with stderr closed (2>&-): the pool's file becomes its
 * fd 2 at the attach, and the line written there would land on the pool's
 * header (fd offset 0). Nothing is written; the process still dies. */
static void test_stderr_closed_pool_untouched(void **st) {
  (void)st;
  const char *name = new_pool();
  struct run r;
  close_stderr = true;
  run_helper("dfl", "pool", name, NULL, false, &r);
  close_stderr = false;
  assert_died_of_sigbus(&r);
  char path[128], head[4096];
  snprintf(path, sizeof path, "/dev/shm/umbp.%s", name);
  int fd = open(path, O_RDONLY);
  assert_true(fd >= 0);
  ssize_t n = pread(fd, head, sizeof head, 0);
  close(fd);
  assert_int_equal(n, (ssize_t)sizeof head);
  assert_null(memmem(head, sizeof head, "umbp: SIGBUS", 12));
}

/* Python with faulthandler enabled before the first attach (vLLM engines run
 * so): the message, then faulthandler's "Fatal Python error: Bus error" and
 * traceback, then death by SIGBUS. A sanitizer build's libumbp cannot be
 * loaded into Python: main() leaves this case out there. */
static void test_python_faulthandler_still_runs(void **st) {
  (void)st;
  const char *name = new_pool();
  char *argv[] = {"/usr/bin/python3", (char *)getenv("UMBP_SIGBUS_PY"), (char *)name, "8", NULL};
  assert_non_null(argv[1]);
  struct run r;
  run_argv(argv, "pool", name, NULL, false, &r);
  assert_non_null(strstr(r.out, "ready\n"));
  assert_died_of_sigbus(&r);
  assert_named(&r, name);
  const char *fatal = strstr(r.err, "Fatal Python error: Bus error");
  assert_non_null(fatal);
  assert_true(strstr(r.err, "umbp: SIGBUS") < fatal);
  assert_non_null(strstr(fatal, "copy_thread_body"));
}

/* dlclose() of the library takes its handler along: a later SIGBUS (a file
 * the Python program maps itself) dies of the default action, not of a jump
 * into the unmapped handler (SIGSEGV). */
static void test_dlclose_gives_back(void **st) {
  (void)st;
  const char *name = new_pool();
  char *argv[] = {"/usr/bin/python3", (char *)getenv("UMBP_SIGBUS_DLCLOSE_PY"), (char *)name, NULL};
  assert_non_null(argv[1]);
  struct run r;
  run_argv(argv, "other", name, NULL, false, &r);
  if (strstr(r.out, "still loaded")) fprintf(stderr, "# dlclose did not unload libumbp: the case proves nothing\n");
  assert_true(strstr(r.out, "unloaded") || strstr(r.out, "still loaded"));
  assert_died_of_sigbus(&r);
}

/* ASan builds with ASan's own SIGBUS handling (its default): it was there
 * before the first attach, so the message comes first, then ASan's report
 * and its exit status. */
static void test_asan_reports_after_ours(void **st) {
  (void)st;
  const char *name = new_pool();
  struct run r;
  run_helper("keep", "pool", name, NULL, true, &r);
  assert_named(&r, name);
  assert_non_null(strstr(r.err, "AddressSanitizer"));
  assert_true(WIFEXITED(r.status) && WEXITSTATUS(r.status) != 0);
  assert_true(strstr(r.err, "umbp: SIGBUS") < strstr(r.err, "AddressSanitizer"));
}

int main(void) {
  const struct CMUnitTest all[] = {
      cmocka_unit_test_teardown(test_pool_fault_named, destroy_made),
      cmocka_unit_test_teardown(test_threads_one_line, destroy_made),
      cmocka_unit_test_teardown(test_stderr_broken_pipe_still_sigbus, destroy_made),
      cmocka_unit_test_teardown(test_line_written_before_another_thread_dies, destroy_made),
      cmocka_unit_test_teardown(test_pool_fault_then_previous, destroy_made),
      cmocka_unit_test_teardown(test_previous_flags_kept, destroy_made),
      cmocka_unit_test_teardown(test_other_sigbus_passed_on, destroy_made),
      cmocka_unit_test_teardown(test_quiet_pool_left_to_program, destroy_made),
      cmocka_unit_test_teardown(test_env_turns_it_off, destroy_made),
      cmocka_unit_test_teardown(test_stderr_closed_pool_untouched, destroy_made),
  };
  const struct CMUnitTest python[] = {
      cmocka_unit_test_teardown(test_python_faulthandler_still_runs, destroy_made),
      cmocka_unit_test_teardown(test_dlclose_gives_back, destroy_made),
  };
  const struct CMUnitTest asan_case = cmocka_unit_test_teardown(test_asan_reports_after_ours, destroy_made);
  /* cmocka 1.1.5 prints skip() as "not ok # SKIP", which meson counts as a
   * failure: a case that cannot run in this build is left out, saying why */
  struct CMUnitTest tests[sizeof all / sizeof all[0] + 3];
  size_t n = 0;
  for (; n < sizeof all / sizeof all[0]; n++) tests[n] = all[n];
  const char *san = getenv("UMBP_SANITIZE");
  if (san && *san && strcmp(san, "none") != 0)
    printf("# test_python_faulthandler_still_runs, test_dlclose_gives_back not run: a sanitizer build's libumbp "
           "cannot be loaded into Python\n");
  else
    for (size_t i = 0; i < sizeof python / sizeof python[0]; i++) tests[n++] = python[i];
  if (asan()) tests[n++] = asan_case;
  else printf("# test_asan_reports_after_ours not run: only a build with ASan has ASan's SIGBUS handler\n");
  return _cmocka_run_group_tests("segment-sigbus", tests, n, NULL, NULL);
}
