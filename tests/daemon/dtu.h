/* SPDX-License-Identifier: Apache-2.0 */
/* Helpers of the daemon tests: run the umbp CLI, start and stop daemons. */
#ifndef UMBP_TESTS_DTU_H
#define UMBP_TESTS_DTU_H

#include <fcntl.h>
#include <sys/stat.h>
#include <grp.h>
#include <poll.h>
#include <time.h>

#include "test_util.h"

#include "umbp/admin.h"
#include "common/common.h"
#include "shm/pool_internal.h"
#include "umbp/check.h"
#include "umbp/index.h"
#include "umbp/pool.h"

static inline const char *dtu_tool(void) {
  const char *t = getenv("UMBP_TOOL");
  return t && *t ? t : "./tools/umbp";
}

static inline void dtu_sleep_ms(unsigned ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

/* Run `umbp ARGS...` (NULL-terminated), stdout+stderr into out (NUL-terminated,
 * truncated to n-1). uid >= 0: run as that uid/gid (needs root). Returns the
 * exit status (128+sig when killed). */
/* Non-zero: dtu_run_as()'s command is killed by SIGALRM (status 128+14)
 * after that many seconds, for a test of a command that used to hang. */
static unsigned dtu_run_alarm_s;

static inline int dtu_run_as(int uid, char *out, size_t n, const char *const *args) {
  int fds[2];
  if (pipe(fds) != 0) return -1;
  pid_t pid = fork();
  if (pid == 0) {
    if (dtu_run_alarm_s) alarm(dtu_run_alarm_s); /* kept across execv() */
    dup2(fds[1], 1);
    dup2(fds[1], 2);
    close(fds[0]);
    close(fds[1]);
    if (uid >= 0) {
      if (setgroups(0, NULL) != 0 || setgid((gid_t)uid) != 0 || setuid((uid_t)uid) != 0) {
        fprintf(stderr, "cannot drop to uid %d: %s\n", uid, strerror(errno));
        _exit(126);
      }
    }
    const char *argv[32];
    int k = 0;
    argv[k++] = dtu_tool();
    for (int i = 0; args[i] && k < 31; i++) argv[k++] = args[i];
    argv[k] = NULL;
    execv(argv[0], (char *const *)argv);
    fprintf(stderr, "exec %s: %s\n", argv[0], strerror(errno));
    _exit(127);
  }
  close(fds[1]);
  /* read to the end, within a bound: a process that keeps the pipe open
   * (a daemon that did not give up its caller's stdout, a command that hangs)
   * fails the test with the command named instead of blocking it */
  size_t l = 0;
  long end = tu_now_ms() + 2 * TU_WAIT_S * 1000L;
  bool timed_out = false;
  for (;;) {
    long left = end - tu_now_ms();
    struct pollfd pfd = {.fd = fds[0], .events = POLLIN};
    int pr = left > 0 ? poll(&pfd, 1, (int)left) : 0;
    if (pr < 0 && errno == EINTR) continue;
    if (pr == 0) timed_out = true;
    if (pr <= 0) break;
    char buf[4096];
    ssize_t r = read(fds[0], buf, sizeof buf);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    for (ssize_t i = 0; i < r; i++)
      if (l + 1 < n) out[l++] = buf[i];
  }
  if (n) out[l] = 0;
  close(fds[0]);
  if (timed_out) {
    fprintf(stderr, "# %s", dtu_tool());
    for (int i = 0; args[i]; i++) fprintf(stderr, " %s", args[i]);
    fprintf(stderr, ": its output did not end within %d s (it hung, or a process it started holds its stdout); "
                    "output so far: %s\n",
            2 * TU_WAIT_S, n ? out : "");
    kill(pid, SIGKILL);
    tu_wait(pid);
    return -1;
  }
  return tu_wait(pid);
}

#define DTU_RUN(out, ...) dtu_run_as(-1, out, sizeof(out), (const char *const[]){__VA_ARGS__, NULL})
#define DTU_RUN_AS(uid, out, ...) dtu_run_as(uid, out, sizeof(out), (const char *const[]){__VA_ARGS__, NULL})

/* Is a daemon holding pool name, and which pid? 1/0, or -errno if no pool. */
static inline int dtu_daemon_pid(const char *name, int *pid) {
  umbp_attach_opts o;
  umbp_attach_opts_init(&o);
  o.read_only = true;
  o.timeout_ms = 2000;
  umbp_pool *p;
  int rc = umbp_pool_attach(name, &o, &p);
  if (rc) return rc;
  *pid = -1;
  rc = umbp_admin_daemon_query(p, pid, NULL);
  umbp_pool_detach(p);
  return rc;
}

/* Daemons started by this test process, killed by dtu_kill_daemons() (a
 * cmocka teardown) so that a failed assertion does not leave one running. */
static pid_t dtu_daemons[64];
static unsigned dtu_ndaemons;
static inline void dtu_track(pid_t pid) {
  if (pid > 0 && dtu_ndaemons < 64) dtu_daemons[dtu_ndaemons++] = pid;
}
static inline int dtu_kill_daemons(void **state) {
  (void)state;
  for (unsigned i = 0; i < dtu_ndaemons; i++)
    if (kill(dtu_daemons[i], 0) == 0) kill(dtu_daemons[i], SIGKILL);
  while (waitpid(-1, NULL, WNOHANG) > 0) {
  }
  dtu_ndaemons = 0;
  return 0;
}

/* Start `umbp daemon NAME --foreground ARGS...` with its stderr
 * appended to log; waits until it holds the pool. Returns its pid. */
static inline pid_t dtu_daemon_start(const char *name, const char *log, const char *const *args) {
  /* the log may hold an earlier daemon's lines: its "ready:" says nothing of this one */
  struct stat before;
  off_t start = stat(log, &before) == 0 ? before.st_size : 0;
  pid_t pid = fork();
  if (pid == 0) {
    int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0644);
    int nul = open("/dev/null", O_RDWR);
    if (fd >= 0) dup2(fd, 2);
    if (nul >= 0) {
      dup2(nul, 0);
      dup2(nul, 1);
    }
    const char *argv[48];
    int k = 0;
    argv[k++] = dtu_tool();
    argv[k++] = "daemon";
    argv[k++] = name;
    argv[k++] = "--foreground";
    for (int i = 0; args && args[i] && k < 47; i++) argv[k++] = args[i];
    argv[k] = NULL;
    execv(argv[0], (char *const *)argv);
    _exit(127);
  }
  dtu_track(pid);
  for (int i = 0; i < 2000; i++) {
    int dp = -1;
    if (dtu_daemon_pid(name, &dp) == 1 && dp == pid) {
      /* holding the pool is not the same as done starting (quotas are applied
       * after): wait for its "ready:" log line */
      for (int j = 0; j < 2000; j++) {
        FILE *f = fopen(log, "r");
        char line[512];
        bool ready = false;
        if (f && fseeko(f, start, SEEK_SET) != 0) {
          fclose(f);
          f = NULL;
        }
        while (f && fgets(line, sizeof line, f))
          if (strstr(line, "ready: pool")) ready = true;
        if (f) fclose(f);
        if (ready) return pid;
        dtu_sleep_ms(5);
      }
      fprintf(stderr, "# daemon pid %d took pool %s but logged no 'ready' within 10 s\n", (int)pid, name);
      return pid;
    }
    int st;
    if (waitpid(pid, &st, WNOHANG) == pid) {
      fprintf(stderr, "# daemon exited early (status 0x%x); log %s\n", st, log);
      return -1;
    }
    dtu_sleep_ms(5);
  }
  fprintf(stderr, "# daemon pid %d did not take pool %s within 10 s\n", (int)pid, name);
  kill(pid, SIGKILL);
  tu_wait(pid);
  return -1;
}

/* Wait until pid is stopped: kill(SIGSTOP) returns before the target has
 * stopped (on a loaded machine it may not run for a while), and a command
 * run at once can still see it running. At most TU_WAIT_S seconds; false,
 * with a line, when it did not stop. */
static inline bool dtu_wait_stopped(pid_t pid) {
  long end = tu_now_ms() + TU_WAIT_S * 1000L;
  while (!umbp_proc_stopped(pid)) {
    if (tu_now_ms() >= end) {
      fprintf(stderr, "# pid %d not stopped %d s after SIGSTOP\n", (int)pid, TU_WAIT_S);
      return false;
    }
    dtu_sleep_ms(2);
  }
  return true;
}

static inline void dtu_dump_log(const char *log) {
  FILE *f = fopen(log, "r");
  if (!f) return;
  char line[512];
  while (fgets(line, sizeof line, f)) fprintf(stderr, "# log: %s", line);
  fclose(f);
}

#endif
