/* SPDX-License-Identifier: Apache-2.0 */
/* Helpers shared by the cmocka tests: unique pool names, exec'd helpers. */
#ifndef UMBP_TEST_UTIL_H
#define UMBP_TEST_UTIL_H

#include <errno.h>
#include <poll.h>
#include <time.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

static inline const char *tu_name(const char *tag) {
  static char buf[8][64];
  static int i;
  char *b = buf[i++ & 7];
  snprintf(b, 64, "t-%s-%d-%d", tag, (int)getpid(), i);
  return b;
}

/* Path of a helper binary built beside the tests. */
static inline const char *tu_helper(const char *name) {
  static char buf[4][512];
  static int i;
  char *b = buf[i++ & 3];
  const char *dir = getenv("UMBP_TEST_HELPER_DIR");
  static const char *subs[] = {"shm", "index", "replay", "topology", "datapath", "daemon", "connector", "."};
  for (size_t k = 0; k < sizeof subs / sizeof subs[0]; k++) {
    snprintf(b, 512, "%s/%s/%s", dir ? dir : ".", subs[k], name);
    if (access(b, X_OK) == 0) return b;
  }
  snprintf(b, 512, "%s/%s", dir ? dir : ".", name);
  return b;
}

/* Start argv[0] with stdout on a pipe; returns pid, *out_fd the read end. */
static inline pid_t tu_spawn(char *const argv[], int *out_fd) {
  int fds[2];
  *out_fd = -1;
  if (pipe(fds) != 0) return -1;
  pid_t pid = fork();
  if (pid == 0) {
    dup2(fds[1], 1);
    close(fds[0]);
    close(fds[1]);
    execv(argv[0], argv);
    fprintf(stderr, "exec %s: %s\n", argv[0], strerror(errno));
    _exit(127);
  }
  close(fds[1]);
  *out_fd = fds[0];
  return pid;
}

/* Bound of each wait in tu_readline() and tu_wait(), in seconds: generous for
 * a loaded 2-core machine, and below the meson timeouts of the tests that use
 * them, so that a helper that hangs (or was stopped, or holds a pipe open)
 * fails the test with a message rather than a TIMEOUT that gives no reason. */
#define TU_WAIT_S 60

static inline long tu_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Read one line (without newline) from fd, waiting at most secs seconds in
 * all; returns its length, or -1 at end of file, on an error or when the
 * time is up (then a line on stderr says so). */
static inline int tu_readline_within(int fd, char *buf, size_t n, unsigned secs) {
  size_t l = 0;
  long end = tu_now_ms() + (long)secs * 1000;
  bool timed_out = false;
  while (l + 1 < n) {
    long left = end - tu_now_ms();
    struct pollfd pfd = {.fd = fd, .events = POLLIN};
    int pr = left > 0 ? poll(&pfd, 1, (int)left) : 0;
    if (pr < 0 && errno == EINTR) continue;
    if (pr == 0) timed_out = true;
    if (pr <= 0) break;
    char c;
    ssize_t r = read(fd, &c, 1);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    if (c == '\n') break;
    buf[l++] = c;
  }
  if (n) buf[l] = 0;
  if (timed_out)
    fprintf(stderr, "# tu_readline: no whole line on fd %d within %u s (got \"%s\"): the process writing it hung, "
                    "was stopped, or a process that will never write holds the pipe open\n",
            fd, secs, n ? buf : "");
  return !timed_out && (l || n == 0) ? (int)l : -1;
}

static inline int tu_readline(int fd, char *buf, size_t n) { return tu_readline_within(fd, buf, n, TU_WAIT_S); }

/* Wait for child pid to end, at most TU_WAIT_S seconds: its exit status, or
 * 128 + the signal that ended it; -1 when it is not our child, or when it
 * did not end in time (then it is SIGKILLed and reaped, and a line on stderr
 * says so, so that it cannot outlive the test). */
static inline int tu_wait(pid_t pid) {
  int st;
  long end = tu_now_ms() + TU_WAIT_S * 1000L;
  unsigned nap_us = 1000;
  for (;;) {
    pid_t r = waitpid(pid, &st, WNOHANG);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return -1;
    if (r == pid) break;
    if (tu_now_ms() >= end) {
      fprintf(stderr, "# tu_wait: pid %d did not end within %d s: killed\n", (int)pid, TU_WAIT_S);
      kill(pid, SIGKILL);
      while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
      }
      return -1;
    }
    usleep(nap_us);
    if (nap_us < 20000) nap_us *= 2;
  }
  if (WIFEXITED(st)) return WEXITSTATUS(st);
  return 128 + WTERMSIG(st);
}

/* A pool `name` left half-made: pool_helper create-stall creates it and is
 * SIGKILLed while pre-faulting (before the magic). Returns the dead
 * creator's pid; line: what it printed ("prefault"). */
static inline pid_t tu_half_made_pool(const char *name, char *line, size_t n) {
  char *argv[] = {(char *)tu_helper("pool_helper"), "create-stall", (char *)name, NULL};
  int fd;
  pid_t pid = tu_spawn(argv, &fd);
  if (tu_readline(fd, line, n) < 0) line[0] = 0;
  close(fd);
  kill(pid, SIGKILL);
  tu_wait(pid);
  return pid;
}

#endif
