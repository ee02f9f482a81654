/* SPDX-License-Identifier: Apache-2.0 */
/* Helpers shared by the cmocka tests: unique pool names, exec'd helpers. */
#ifndef UMBP_TEST_UTIL_H
#define UMBP_TEST_UTIL_H

#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
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

/* Read one line (without newline) from fd; returns length or -1. */
static inline int tu_readline(int fd, char *buf, size_t n) {
  size_t l = 0;
  while (l + 1 < n) {
    char c;
    ssize_t r = read(fd, &c, 1);
    if (r <= 0) break;
    if (c == '\n') break;
    buf[l++] = c;
  }
  buf[l] = 0;
  return l || n == 0 ? (int)l : -1;
}

static inline int tu_wait(pid_t pid) {
  int st;
  if (waitpid(pid, &st, 0) != pid) return -1;
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
