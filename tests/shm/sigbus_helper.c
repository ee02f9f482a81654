/* SPDX-License-Identifier: Apache-2.0 */
/* Exec'd by test_sigbus (its own process, its own mapping of the pool).
 *   sigbus_helper PREV pool NAME   install PREV, attach NAME, print "ready",
 *                                  then read and write every slot until a
 *                                  signal ends it (the test truncates the
 *                                  pool's file)
 *   sigbus_helper PREV other NAME  install PREV, attach NAME, then touch a
 *                                  file of its own mapped and truncated under
 *                                  the mapping (a SIGBUS outside every pool)
 *   sigbus_helper PREV kill NAME   install PREV, attach NAME, raise(SIGBUS)
 * PREV, the SIGBUS disposition before the attach:
 *   keep     what the process started with (a sanitizer's handler)
 *   dfl      SIG_DFL
 *   ign      SIG_IGN
 *   info     an SA_SIGINFO handler: writes "prev: siginfo code C" and _exit(42)
 *   plain    a plain handler: writes "prev: plain" and _exit(43)
 *   reset    an SA_SIGINFO|SA_RESETHAND handler that writes "prev: reset" and
 *            returns (a one-shot crash reporter); a second call writes
 *            "prev: called again" and _exit(44)
 *   nodefer  an SA_SIGINFO|SA_NODEFER handler with SIGUSR1 in its sa_mask:
 *            writes "prev: mask bus=B usr1=U" (1: blocked while it runs) and
 *            _exit(45)
 *   onstack  an SA_SIGINFO|SA_ONSTACK handler, with an alternate stack set
 *            up: writes "prev: onstack 1" if it runs on that stack (0 if
 *            not) and _exit(46)
 *   ignsi    SIG_IGN set with SA_SIGINFO in sa_flags
 *   cli      as the umbp commands do, but installed before the attach: an
 *            SA_SIGINFO handler that writes "cli: pool fault" for a fault in
 *            the pool's mapping and _exit(3), after marking the pool quiet
 * Before the loop it prints "handler ours|dfl|other": whose SIGBUS handler is
 * installed after the attach. Mode pool, from the environment:
 *   SIGBUS_HELPER_THREADS=N   N threads (not the main one) touch the slots
 *   SIGBUS_HELPER_CHURN=NAME2 another thread attaches and detaches NAME2 in a
 *                             loop meanwhile (the table changes under the
 *                             handler)
 *   SIGBUS_HELPER_EPIPE=1     fd 2 is a pipe whose read end is closed (a log
 *                             collector gone) when the fault comes */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "umbp/admin.h"
#include "umbp/index.h"
#include "umbp/pool.h"

static void say(const char *s) {
  ssize_t r = write(2, s, strlen(s));
  (void)r;
}

static void on_info(int sig, siginfo_t *si, void *uc) {
  (void)sig;
  (void)uc;
  char m[] = "prev: siginfo code  \n";
  int c = si ? si->si_code : 0;
  m[19] = c > 0 && c < 10 ? (char)('0' + c) : c <= 0 ? '-' : '+';
  say(m);
  _exit(42);
}

static void on_plain(int sig) {
  (void)sig;
  say("prev: plain\n");
  _exit(43);
}

static volatile sig_atomic_t reset_calls;

static void on_reset(int sig, siginfo_t *si, void *uc) {
  (void)sig;
  (void)si;
  (void)uc;
  if (reset_calls++) {
    say("prev: called again\n");
    _exit(44);
  }
  say("prev: reset\n");
}

static void on_nodefer(int sig, siginfo_t *si, void *uc) {
  (void)sig;
  (void)si;
  (void)uc;
  sigset_t cur;
  sigprocmask(SIG_BLOCK, NULL, &cur);
  char m[] = "prev: mask bus=B usr1=U\n";
  m[15] = sigismember(&cur, SIGBUS) ? '1' : '0';
  m[22] = sigismember(&cur, SIGUSR1) ? '1' : '0';
  say(m);
  _exit(45);
}

static char *alt_lo;
static size_t alt_len;

static void on_onstack(int sig, siginfo_t *si, void *uc) {
  (void)sig;
  (void)si;
  (void)uc;
  char here;
  say(&here >= alt_lo && &here < alt_lo + alt_len ? "prev: onstack 1\n" : "prev: onstack 0\n");
  _exit(46);
}

static uintptr_t cli_base;
static size_t cli_len;

static void on_cli(int sig, siginfo_t *si, void *uc) {
  (void)sig;
  (void)uc;
  uintptr_t a = (uintptr_t)si->si_addr;
  if (si->si_code > 0 && a >= cli_base && a - cli_base < cli_len) {
    say("cli: pool fault\n");
    _exit(3);
  }
  say("cli: other\n");
  _exit(4);
}

static umbp_pool *pool;
static umbp_pool_info info;

static void *toucher(void *arg) {
  (void)arg;
  for (;;)
    for (uint32_t s = 0; s < info.slot_count; s++) {
      unsigned char *b = umbp_slot_ptr(pool, s);
      /* atomic: several threads touch the same bytes */
      for (uint64_t o = 0; o < info.slot_size; o += 4096) __atomic_fetch_add(&b[o], 1, __ATOMIC_RELAXED);
    }
  return NULL;
}

static void *churner(void *arg) {
  umbp_attach_opts o;
  umbp_attach_opts_init(&o);
  o.read_only = true; /* no registry slot: as many attaches as the loop makes */
  for (;;) {
    umbp_pool *q;
    if (umbp_pool_attach(arg, &o, &q) == 0) umbp_pool_detach(q);
  }
  return NULL;
}

static void install(const char *prev) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sigemptyset(&sa.sa_mask);
  if (!strcmp(prev, "keep")) return;
  if (!strcmp(prev, "dfl")) sa.sa_handler = SIG_DFL;
  else if (!strcmp(prev, "ign")) sa.sa_handler = SIG_IGN;
  else if (!strcmp(prev, "plain")) sa.sa_handler = on_plain;
  else if (!strcmp(prev, "info")) sa.sa_sigaction = on_info, sa.sa_flags = SA_SIGINFO;
  else if (!strcmp(prev, "cli")) sa.sa_sigaction = on_cli, sa.sa_flags = SA_SIGINFO;
  else if (!strcmp(prev, "reset")) sa.sa_sigaction = on_reset, sa.sa_flags = SA_SIGINFO | SA_RESETHAND;
  else if (!strcmp(prev, "nodefer")) {
    sa.sa_sigaction = on_nodefer, sa.sa_flags = SA_SIGINFO | SA_NODEFER;
    sigaddset(&sa.sa_mask, SIGUSR1);
  } else if (!strcmp(prev, "onstack")) {
    alt_len = 1 << 20;
    alt_lo = malloc(alt_len);
    stack_t ss = {.ss_sp = alt_lo, .ss_size = alt_len, .ss_flags = 0};
    if (!alt_lo || sigaltstack(&ss, NULL) != 0) exit(2);
    sa.sa_sigaction = on_onstack, sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
  } else if (!strcmp(prev, "ignsi")) sa.sa_handler = SIG_IGN, sa.sa_flags = SA_SIGINFO;
  else {
    fprintf(stderr, "sigbus_helper: unknown PREV %s\n", prev);
    exit(2);
  }
  sigaction(SIGBUS, &sa, NULL);
}

int main(int argc, char **argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: sigbus_helper PREV pool|other|kill NAME\n");
    return 2;
  }
  install(argv[1]);
  umbp_pool *p;
  int rc = umbp_pool_attach(argv[3], NULL, &p);
  if (rc) {
    printf("attach %d %s\n", rc, umbp_last_error());
    return 1;
  }
  if (!strcmp(argv[1], "cli")) {
    void *b;
    umbp_admin_pool_mapping(p, &b, &cli_len);
    cli_base = (uintptr_t)b;
    umbp_admin_pool_sigbus_quiet(p, true);
  }
  struct sigaction now;
  sigaction(SIGBUS, NULL, &now);
  const char *who = (now.sa_flags & SA_SIGINFO) ? (now.sa_sigaction == on_info || now.sa_sigaction == on_cli ? "other" : "ours")
                    : now.sa_handler == SIG_DFL ? "dfl" : "other";
  printf("handler %s\n", who);
  fflush(stdout);
  if (!strcmp(argv[2], "kill")) {
    raise(SIGBUS);
    return 0; /* SIG_IGN */
  }
  if (!strcmp(argv[2], "other")) {
    char path[] = "/tmp/umbp-sigbus-XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0 || ftruncate(fd, 8192) != 0) return 1;
    unlink(path);
    volatile char *m = mmap(NULL, 8192, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED || ftruncate(fd, 0) != 0) return 1;
    m[4096] = 1; /* past the end of the file: SIGBUS */
    return 0;
  }
  if (umbp_pool_get_info(p, &info)) return 1;
  pool = p;
  const char *churn = getenv("SIGBUS_HELPER_CHURN");
  pthread_t t;
  if (churn && *churn && pthread_create(&t, NULL, churner, (void *)churn) != 0) return 1;
  const char *threads = getenv("SIGBUS_HELPER_THREADS");
  for (int i = 0; threads && i < atoi(threads); i++)
    if (pthread_create(&t, NULL, toucher, NULL) != 0) return 1;
  const char *epipe = getenv("SIGBUS_HELPER_EPIPE");
  if (epipe && !strcmp(epipe, "1")) {
    int pp[2];
    if (pipe(pp) != 0 || dup2(pp[1], 2) != 2) return 1;
    close(pp[0]);
    close(pp[1]);
  }
  printf("ready\n");
  fflush(stdout);
  if (threads && atoi(threads) > 0)
    for (;;) pause();
  toucher(NULL);
}
