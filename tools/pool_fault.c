/* SPDX-License-Identifier: Apache-2.0 */
/* SIGBUS on a pool's mapping, turned into a message; see pool_fault.h. */
#include "pool_fault.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "umbp/admin.h"

#define WATCH_MAX 8 /* pools one process watches at once (bench index makes one per table) */

/* One watched mapping. Filled while base is 0, then published by the release
 * store of base, which the handler loads with acquire: the handler never sees
 * a half-filled entry. Emptied by storing 0 first. */
struct watch {
  _Atomic uintptr_t base; /* 0: free */
  size_t len;
  const umbp_pool *pool;
  int fd; /* the pool's file, opened when watching starts (-1: none): the handler fstat()s it */
  bool stamp;
  char prefix[96];
  char name[UMBP_NAME_MAX + 1];
  char path[256];
};

static struct watch watches[WATCH_MAX];
static struct sigaction old_bus; /* the disposition before ours, for faults outside every pool */
static bool installed;

/* ---- async-signal-safe formatting ---------------------------------------- */
struct buf {
  char s[1536];
  size_t n;
};

static void put(struct buf *b, const char *s) {
  while (*s && b->n + 1 < sizeof b->s) b->s[b->n++] = *s++;
}

static void put_u64(struct buf *b, uint64_t v, unsigned base, unsigned min_digits) {
  char d[24];
  unsigned n = 0;
  do {
    d[n++] = "0123456789abcdef"[v % base];
    v /= base;
  } while ((v || n < min_digits) && n < sizeof d);
  while (n && b->n + 1 < sizeof b->s) b->s[b->n++] = d[--n];
}

/* "2026-12-02T16:00:00Z " from CLOCK_REALTIME, as the daemon's log lines
 * begin (gmtime_r and strftime are not async-signal-safe): days since the
 * epoch to a civil date by Howard Hinnant's civil_from_days ("chrono-
 * Compatible Low-Level Date Algorithms"). */
static void put_utc(struct buf *b) {
  struct timespec ts;
  if (clock_gettime(CLOCK_REALTIME, &ts) != 0) return;
  int64_t secs = ts.tv_sec, days = secs / 86400, rem = secs % 86400;
  if (rem < 0) rem += 86400, days--;
  int64_t z = days + 719468, era = (z >= 0 ? z : z - 146096) / 146097;
  uint64_t doe = (uint64_t)(z - era * 146097);
  uint64_t yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
  uint64_t doy = doe - (365 * yoe + yoe / 4 - yoe / 100), mp = (5 * doy + 2) / 153;
  uint64_t d = doy - (153 * mp + 2) / 5 + 1, m = mp < 10 ? mp + 3 : mp - 9;
  int64_t y = (int64_t)yoe + era * 400 + (m <= 2);
  const struct {
    uint64_t v;
    unsigned digits;
    const char *after;
  } f[] = {{(uint64_t)y, 4, "-"},           {m, 2, "-"},
           {d, 2, "T"},                     {(uint64_t)rem / 3600, 2, ":"},
           {(uint64_t)rem / 60 % 60, 2, ":"}, {(uint64_t)rem % 60, 2, "Z "}};
  for (unsigned i = 0; i < sizeof f / sizeof f[0]; i++) {
    put_u64(b, f[i].v, 10, f[i].digits);
    put(b, f[i].after);
  }
}

/* The message for a fault at offset off of w's mapping; never returns. */
static void report(const struct watch *w, uint64_t off) {
  struct buf b = {.n = 0};
  if (w->stamp) put_utc(&b);
  put(&b, w->prefix);
  put(&b, "SIGBUS at offset 0x");
  put_u64(&b, off, 16, 1);
  put(&b, " of pool '");
  put(&b, w->name);
  put(&b, "' (");
  put(&b, w->path);
  put(&b, ", mapped ");
  put_u64(&b, w->len, 10, 1);
  put(&b, " bytes): ");
  struct stat st;
  if (w->fd >= 0 && fstat(w->fd, &st) == 0 && (uint64_t)st.st_size < w->len) {
    put(&b, "its file was truncated to ");
    put_u64(&b, (uint64_t)st.st_size, 10, 1);
    put(&b, " bytes under the running processes; stop every process using the pool, then destroy it ('umbp pool "
            "destroy ");
    put(&b, w->name);
    put(&b, "') and create it again");
  } else if (w->fd >= 0) {
    put(&b, "its file is whole, so its file system could not supply the page: /dev/shm filled up under a pool "
            "whose slot bytes were neither pre-faulted nor reserved (--no-prefault where fallocate is not "
            "supported), or the hugetlbfs mount ran out of huge pages; free space there, or destroy the pool and "
            "create it without --no-prefault");
  } else {
    put(&b, "its file was truncated under the running processes, or /dev/shm filled up under a pool created "
            "with --no-prefault; destroy the pool and create it again");
  }
  put(&b, " (docs/operations.md, \"SIGBUS on a pool\")\n");
  /* fd 2 is stderr as the command was given it, or the daemon's --log:
   * main() holds fds 0-2 open from its first step (hold_std_fds()), so a
   * pool's or an output file never takes its number. A stderr pipe whose
   * reader is gone loses the line, without SIGPIPE ending the process in
   * place of the exit status below. */
  umbp_admin_sigbus_write(b.s, b.n);
  _exit(CLI_POOL_FAULT);
}

/* Set by the first thread that reports: threads that fault on the lost pages
 * at once (the daemon's main loop and its metrics thread) each get the
 * signal, but one line says why. The others wait for the reporter's
 * _exit(), bounded (its write to a stderr pipe nobody drains could block),
 * then exit with the same status themselves. */
static _Atomic bool reporting;
#define REPORT_WAIT_MS 10000

static void on_sigbus(int sig, siginfo_t *si, void *uc) {
  if (si && si->si_code > 0) { /* raised by the kernel for a fault (kill(2) gives SI_USER, <= 0) */
    uintptr_t a = (uintptr_t)si->si_addr;
    for (unsigned i = 0; i < WATCH_MAX; i++) {
      /* acquire: pairs with cli_fault_watch()'s release store of base */
      uintptr_t b = atomic_load_explicit(&watches[i].base, memory_order_acquire);
      if (b && a >= b && a - b < watches[i].len) {
        if (!atomic_exchange_explicit(&reporting, true, memory_order_relaxed)) report(&watches[i], a - b);
        for (unsigned ms = 0; ms < REPORT_WAIT_MS; ms += 10) poll(NULL, 0, 10);
        _exit(CLI_POOL_FAULT);
      }
    }
  }
  /* not a pool's: what SIGBUS did before */
  if ((old_bus.sa_flags & SA_SIGINFO) && old_bus.sa_sigaction) {
    old_bus.sa_sigaction(sig, si, uc);
    return;
  }
  if (old_bus.sa_handler == SIG_IGN) return;
  if (old_bus.sa_handler != SIG_DFL) {
    old_bus.sa_handler(sig);
    return;
  }
  sigaction(SIGBUS, &old_bus, NULL);
  /* a fault re-executes the instruction and dies of the default action; a
   * SIGBUS sent by kill(2) would not come again by itself */
  if (!si || si->si_code <= 0) raise(sig);
}

int cli_fault_watch(umbp_pool *p, const char *who, bool stamp) {
  void *base = NULL;
  size_t len = 0;
  umbp_pool_info info;
  if (!p || umbp_admin_pool_mapping(p, &base, &len) || umbp_pool_get_info(p, &info)) return -1;
  struct watch *w = NULL;
  for (unsigned i = 0; i < WATCH_MAX && !w; i++)
    if (!atomic_load_explicit(&watches[i].base, memory_order_relaxed)) w = &watches[i];
  if (!w) return -1;
  w->len = len;
  w->pool = p;
  w->stamp = stamp;
  snprintf(w->prefix, sizeof w->prefix, "%s: ", who);
  snprintf(w->name, sizeof w->name, "%s", info.name);
  snprintf(w->path, sizeof w->path, "%s", info.path);
  w->fd = open(info.path, O_RDONLY | O_CLOEXEC); /* a description of our own: it holds no lock */
  if (!installed) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_sigbus;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGBUS, &sa, &old_bus) != 0) {
      if (w->fd >= 0) close(w->fd);
      return -1;
    }
    installed = true;
  }
  /* release: the fields above before the handler can match base */
  atomic_store_explicit(&w->base, (uintptr_t)base, memory_order_release);
  /* this message, not the library's as well: the library installed its
   * handler at the first attach, so ours runs first and exits, but a quiet
   * pool keeps that true in either order */
  umbp_admin_pool_sigbus_quiet(p, true);
  return 0;
}

static void unwatch_entry(struct watch *w) {
  atomic_store_explicit(&w->base, 0, memory_order_release);
  if (w->fd >= 0) close(w->fd);
  w->fd = -1;
  w->pool = NULL;
}

static bool watches_pool(const struct watch *w, const umbp_pool *p) {
  return atomic_load_explicit(&w->base, memory_order_relaxed) && w->pool == p;
}

void cli_fault_unwatch(umbp_pool *p) {
  bool had = false;
  for (unsigned i = 0; i < WATCH_MAX; i++)
    if (watches_pool(&watches[i], p)) unwatch_entry(&watches[i]), had = true;
  if (had) umbp_admin_pool_sigbus_quiet(p, false);
}

bool cli_pool_file_short(umbp_pool *p) {
  void *base;
  size_t len;
  struct stat st;
  if (!p || umbp_admin_pool_mapping(p, &base, &len) || umbp_admin_pool_stat(p, &st)) return false;
  return (uint64_t)st.st_size < (uint64_t)len;
}

/* Abandoned handles, for the process's life: a pointer held in static storage
 * is not reported as a leak by LSan (the watch table holds watched ones too). */
#define ABANDONED_MAX 8
static umbp_pool *abandoned[ABANDONED_MAX];

int cli_pool_detach(umbp_pool *p) {
  if (!p) return 0;
  if (cli_pool_file_short(p)) {
    for (unsigned i = 0; i < ABANDONED_MAX; i++)
      if (!abandoned[i]) {
        abandoned[i] = p;
        break;
      }
    return 1;
  }
  bool mine[WATCH_MAX]; /* found before the detach frees p */
  for (unsigned i = 0; i < WATCH_MAX; i++) mine[i] = watches_pool(&watches[i], p);
  umbp_pool_detach(p);
  for (unsigned i = 0; i < WATCH_MAX; i++)
    if (mine[i]) unwatch_entry(&watches[i]);
  return 0;
}
