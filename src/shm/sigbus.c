/* SPDX-License-Identifier: Apache-2.0 */
/*
 * sigbus.c — a SIGBUS in an attached pool's mapping, named on stderr.
 *
 * A process that touches a page of a pool whose file has no page there gets
 * SIGBUS from the kernel: another process truncated the pool's file (or its
 * index file) under it, or the file system could not supply the page (a
 * --no-prefault pool on a full /dev/shm, a hugetlbfs mount out of huge
 * pages). The default action kills the process without a word; in an engine
 * whose copy threads read and write slots that is a core dump nobody can
 * explain. The umbp commands turn it into a message of their own
 * (tools/pool_fault.c); this is the same for every program that links the
 * library.
 *
 * The exception to "the library never prints": a process about to die of a
 * signal has no caller left to hand an error to, so the handler writes one
 * line to stderr (write(2)) and then lets the process die as it would have:
 * it passes the signal on to the disposition that was in place before it.
 *
 * Design:
 *  - Installed once, at the first attach or create of the process (not on
 *    every attach, not removed at the last detach): a handler that removed
 *    itself would restore a disposition that another handler installed later
 *    (the umbp commands', Python's faulthandler) had chained to, and clobber
 *    that one. UMBP_NO_SIGBUS_HANDLER=1 (read at that first attach) leaves
 *    SIGBUS alone.
 *  - The attached mappings are a fixed table of WATCH_MAX entries, written
 *    under table_mu (attach, detach, umbp_admin_pool_sigbus_quiet()) and read
 *    by the handler without locks: each entry is a sequence lock, its
 *    counter odd while a writer fills or empties it. The handler copies an
 *    entry and uses the copy only if the counter was even and unchanged
 *    around the copy. A pool attached while the table is full gets no entry:
 *    a SIGBUS there kills the process without the message, as before.
 *  - An entry is published after the handle is complete and emptied just
 *    before the detach unmaps, so the detach's own writes (releasing the
 *    registry slot, pins, reservations) are covered.
 *  - For a fault in an entry's range (si_code > 0: raised by the kernel) the
 *    handler fstat()s the handle's file (or stat()s the index file) to tell a
 *    truncation (the file is now shorter than this process's mapping) from a
 *    file system that could not supply a page, and writes the message. Then,
 *    and for every other SIGBUS, it passes the signal on: the previous
 *    SA_SIGINFO or plain handler is called as the kernel would have called
 *    it (its sa_mask, SA_NODEFER, SA_RESETHAND; our handler has SA_ONSTACK
 *    where it had), so Python's faulthandler still prints its traceback;
 *    for SIG_DFL it is restored and the fault re-executes (the process dies
 *    of SIGBUS, dumping core as before); SIG_IGN of a fault is treated as
 *    SIG_DFL as the kernel does for a fault it cannot deliver.
 *  - Quiet entries: a program that reports SIGBUS on a pool itself (the umbp
 *    commands) marks the pool quiet; the handler then only passes the signal
 *    on. Whichever of the two handlers was installed last, the program's
 *    message is the only one.
 *  - Only async-signal-safe calls in the handler: write, fstat, stat, getpid,
 *    sigaction, sigprocmask, sigpending, sigismember, sigaddset, sigdelset,
 *    raise, poll (and sigtimedwait: umbp_admin_sigbus_write()). It writes
 *    to fd 2 only when that is not a regular file on a pool's file system
 *    (stderr_ok()), and a broken pipe there does not turn the death into one
 *    by SIGPIPE.
 */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <ucontext.h>
#include <unistd.h>

#include "common/common.h"
#include "shm/pool_internal.h"
#include "shm/sigbus.h"
#include "umbp/admin.h"

#define WATCH_MAX 64 /* pools one process has attached at once and gets the message for */

struct watch {
  _Atomic uint32_t seq;   /* odd while a writer changes the entry (pairs with the handler's loads) */
  _Atomic uintptr_t base; /* 0: free */
  _Atomic bool quiet;     /* the program reports this pool's SIGBUS itself */
  size_t len;
  const struct umbp_pool *pool;
  int fd; /* the handle's own descriptor; dev/ino tell whether it still is that file */
  dev_t dev;
  ino_t ino;
  uint64_t ioff, ilen; /* the index file's range of the mapping; ilen 0: none */
  dev_t idev;
  ino_t iino;
  char name[UMBP_NAME_MAX + 1];
  char path[256];
  char ipath[256];
};

static struct watch watches[WATCH_MAX];
static pthread_mutex_t table_mu = PTHREAD_MUTEX_INITIALIZER;
static bool decided, enabled; /* under table_mu: the first attach decided */
static struct sigaction old_bus; /* written before the handler is installed, read-only after */

/* ---- async-signal-safe formatting ---------------------------------------- */
struct buf {
  char s[2048];
  size_t n;
};

static void put(struct buf *b, const char *s) {
  while (*s && b->n + 1 < sizeof b->s) b->s[b->n++] = *s++;
}

static void put_u64(struct buf *b, uint64_t v, unsigned base) {
  char d[24];
  unsigned n = 0;
  do {
    d[n++] = "0123456789abcdef"[v % base];
    v /= base;
  } while (v && n < sizeof d);
  while (n && b->n + 1 < sizeof b->s) b->s[b->n++] = d[--n];
}

static void put_fix(struct buf *b, const struct watch *w) {
  put(b, "stop every process using the pool, then destroy it ('umbp pool destroy ");
  put(b, w->name);
  put(b, "') and create it again");
}

/* Is fd 2 somewhere to write the message? A process started with stderr
 * closed can have any file there, the pool's own among them (its file offset
 * is 0: the line would land on the header). A regular file on the file
 * system of a watched pool (the pool, its index, feed or tier file) is
 * refused; another file (a log) is written to. */
static bool stderr_ok(void) {
  struct stat st;
  if (fstat(2, &st) != 0) return false;
  if (!S_ISREG(st.st_mode)) return true;
  for (unsigned i = 0; i < WATCH_MAX; i++) {
    if (!atomic_load_explicit(&watches[i].base, memory_order_relaxed)) continue;
    if (st.st_dev == watches[i].dev || (watches[i].ilen && st.st_dev == watches[i].idev)) return false;
  }
  return true;
}

/* fd 2 may be a pipe whose reader is gone (a log collector that died): the
 * write then raises SIGPIPE, whose default action would end the process in
 * place of the SIGBUS (no core dump, no chained handler, another exit
 * status). SIGPIPE is blocked around the write, and the one the write raised
 * is taken back (sigtimedwait: a bare system call on Linux, though not on
 * POSIX's async-signal-safe list) unless one was pending already. Exported
 * for the programs that write their own line (tools/pool_fault.c). */
UMBP_API void umbp_admin_sigbus_write(const char *s, size_t n) {
  if (!s) return;
  sigset_t pipe_set, old, pending;
  sigemptyset(&pipe_set);
  sigaddset(&pipe_set, SIGPIPE);
  sigprocmask(SIG_BLOCK, &pipe_set, &old);
  bool was_pending = sigpending(&pending) == 0 && sigismember(&pending, SIGPIPE) == 1;
  bool broken = false;
  for (size_t o = 0; o < n;) {
    ssize_t r = write(2, s + o, n - o);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      broken = r < 0 && errno == EPIPE;
      break;
    }
    o += (size_t)r;
  }
  if (broken && !was_pending) {
    struct timespec zero = {0, 0};
    sigtimedwait(&pipe_set, NULL, &zero);
  }
  sigprocmask(SIG_SETMASK, &old, NULL);
}

/* ") was truncated to SIZE bytes ... (this process maps MAPPED bytes of it)" */
static void put_truncated(struct buf *b, uint64_t size, uint64_t mapped) {
  put(b, ") was truncated to ");
  put_u64(b, size, 10);
  put(b, " bytes under this process by another process (this process maps ");
  put_u64(b, mapped, 10);
  put(b, " bytes of it)");
}

/* The message for a fault at offset off of w's mapping (w: a copy). */
static void report(const struct watch *w, uint64_t off) {
  if (!stderr_ok()) return;
  struct buf b = {.n = 0};
  put(&b, "umbp: SIGBUS in process ");
  put_u64(&b, (uint64_t)getpid(), 10);
  put(&b, " at offset 0x");
  put_u64(&b, off, 16);
  put(&b, " of pool '");
  put(&b, w->name);
  put(&b, "': ");
  struct stat st;
  bool index = w->ilen && off >= w->ioff && off - w->ioff < w->ilen;
  if (index) {
    /* the index file is mapped from its offset 0 over [ioff, ioff + ilen) */
    bool same = stat(w->ipath, &st) == 0 && st.st_dev == w->idev && st.st_ino == w->iino;
    put(&b, "its index file (");
    put(&b, w->ipath);
    if (same && (uint64_t)st.st_size < w->ilen) {
      put_truncated(&b, (uint64_t)st.st_size, w->ilen);
      put(&b, "; ");
    } else {
      put(&b, ") was truncated under this process by another process, or its hugetlbfs mount could not supply "
              "the page; ");
    }
    put_fix(&b, w);
  } else {
    bool same = w->fd >= 0 && fstat(w->fd, &st) == 0 && st.st_dev == w->dev && st.st_ino == w->ino;
    put(&b, "its file (");
    put(&b, w->path);
    if (same && (uint64_t)st.st_size < w->len) {
      put_truncated(&b, (uint64_t)st.st_size, w->len);
      put(&b, ", so the pool's memory past that is gone; ");
      put_fix(&b, w);
    } else if (same) {
      put(&b, ") is whole, so its file system could not supply the page: /dev/shm filled up under a pool whose "
              "slot bytes were neither pre-faulted nor reserved (--no-prefault), or the hugetlbfs mount ran out of "
              "huge pages; free space there, or destroy the pool ('umbp pool destroy ");
      put(&b, w->name);
      put(&b, "') and create it without --no-prefault");
    } else {
      put(&b, ") was truncated under this process by another process, or its file system could not supply the "
              "page; ");
      put_fix(&b, w);
    }
  }
  put(&b, " (docs/operations.md, \"SIGBUS on a pool\")\n");
  umbp_admin_sigbus_write(b.s, b.n);
}

/* Copy entry i into *c if it is published, stable and covers address a. */
static bool match(unsigned i, uintptr_t a, struct watch *c) {
  struct watch *w = &watches[i];
  /* acquire: pairs with the release store that ends a writer's change (publish()) */
  uint32_t s1 = atomic_load_explicit(&w->seq, memory_order_acquire);
  if (s1 & 1) return false;
  uintptr_t base = atomic_load_explicit(&w->base, memory_order_relaxed);
  if (!base || a < base || a - base >= w->len) return false;
  memcpy(c, w, sizeof *c); /* a torn copy is thrown away below */
  c->base = base;
  c->quiet = atomic_load_explicit(&w->quiet, memory_order_relaxed);
  /* the copy's loads before the second load of seq (seqlock read side) */
  atomic_thread_fence(memory_order_acquire);
  return atomic_load_explicit(&w->seq, memory_order_relaxed) == s1;
}

/* Run the previous handler as the kernel would have delivered SIGBUS to
 * it: with its own sa_mask added to the interrupted context's mask, SIGBUS
 * itself blocked unless it asked for SA_NODEFER, and the disposition reset
 * to SIG_DFL first if it asked for SA_RESETHAND (a one-shot crash reporter
 * that returns counts on the re-executed fault to kill the process; called
 * again and again, it would loop). */
static void call_previous(int sig, siginfo_t *si, void *uc) {
  sigset_t m;
  if (uc) m = ((ucontext_t *)uc)->uc_sigmask;
  else sigprocmask(SIG_BLOCK, NULL, &m);
  for (int s = 1; s < NSIG; s++)
    if (sigismember(&old_bus.sa_mask, s) == 1) sigaddset(&m, s);
  if (old_bus.sa_flags & SA_NODEFER) sigdelset(&m, sig);
  else sigaddset(&m, sig);
  if (old_bus.sa_flags & SA_RESETHAND) {
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    sigaction(sig, &dfl, NULL);
  }
  sigprocmask(SIG_SETMASK, &m, NULL);
  if (old_bus.sa_flags & SA_SIGINFO) old_bus.sa_sigaction(sig, si, uc);
  else old_bus.sa_handler(sig);
  /* returning restores the interrupted context's mask (sigreturn) */
}

static void pass_on(int sig, siginfo_t *si, void *uc) {
  bool fault = si && si->si_code > 0;
  /* SIG_DFL and SIG_IGN first, whatever the flags: SA_SIGINFO set with
   * SIG_IGN is a valid disposition, and its sa_sigaction is no function */
  if (old_bus.sa_handler == SIG_IGN) {
    if (!fault) return;
    /* an ignored fault would re-execute forever: the kernel kills such a
     * process (it resets an ignored or blocked fault signal to SIG_DFL) */
  } else if (old_bus.sa_handler != SIG_DFL) {
    call_previous(sig, si, uc);
    return;
  }
  struct sigaction dfl;
  memset(&dfl, 0, sizeof dfl);
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  sigaction(sig, &dfl, NULL);
  /* a fault re-executes its instruction and dies of the default action; a
   * SIGBUS sent by kill(2) would not come again: raise it (blocked until
   * this handler returns) */
  if (!fault) raise(sig);
}

/* The line, once per process: threads that fault on the lost pages at once
 * (an engine's copy threads) each get the signal, but one line says why.
 * The first to claim it writes it; the others wait for that write before
 * they pass the signal on, since passing it on ends the process (the default
 * action, a chained handler that exits) and would cut the line off. The
 * wait is bounded (a write to a stderr pipe nobody drains could block for
 * ever) and uses poll(), which is async-signal-safe. */
enum { LINE_NONE, LINE_WRITING, LINE_DONE };
static _Atomic int line_state;
#define LINE_WAIT_MS 10000

static void on_sigbus(int sig, siginfo_t *si, void *uc) {
  int saved = errno;
  bool writer = false;
  if (si && si->si_code > 0) {
    struct watch c;
    for (unsigned i = 0; i < WATCH_MAX; i++)
      if (match(i, (uintptr_t)si->si_addr, &c)) {
        int none = LINE_NONE;
        /* relaxed: the line's bytes go through write(2), not memory others read */
        if (!c.quiet && atomic_compare_exchange_strong_explicit(&line_state, &none, LINE_WRITING,
                                                                memory_order_relaxed, memory_order_relaxed)) {
          writer = true;
          report(&c, (uintptr_t)si->si_addr - c.base);
          atomic_store_explicit(&line_state, LINE_DONE, memory_order_relaxed);
        }
        break;
      }
  }
  for (unsigned ms = 0; !writer && ms < LINE_WAIT_MS &&
                        atomic_load_explicit(&line_state, memory_order_relaxed) == LINE_WRITING;
       ms += 10)
    poll(NULL, 0, 10);
  errno = saved;
  pass_on(sig, si, uc);
}

/* ---- the table's writers (under table_mu) ---------------------------------- */
static void table_lock(void) { pthread_mutex_lock(&table_mu); }
static void table_unlock(void) { pthread_mutex_unlock(&table_mu); }
static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;
static void table_atfork(void) { pthread_atfork(table_lock, table_unlock, table_unlock); }

static void begin_change(struct watch *w) {
  atomic_store_explicit(&w->seq, atomic_load_explicit(&w->seq, memory_order_relaxed) + 1, memory_order_relaxed);
  /* the odd count before the fields change (seqlock write side) */
  atomic_thread_fence(memory_order_release);
}

static void end_change(struct watch *w) {
  /* release: pairs with match()'s acquire load of seq */
  atomic_store_explicit(&w->seq, atomic_load_explicit(&w->seq, memory_order_relaxed) + 1, memory_order_release);
}

static bool off_by_env(void) {
  const char *e = getenv("UMBP_NO_SIGBUS_HANDLER");
  return e && *e && strcmp(e, "0") != 0;
}

static bool install(void) {
  struct sigaction sa, old;
  memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = on_sigbus;
  sigemptyset(&sa.sa_mask);
  if (sigaction(SIGBUS, NULL, &old) != 0) return false;
  /* SA_ONSTACK only where the handler before ours asked for it: that one
   * runs in our frame and may need the alternate stack (Go's runtime aborts
   * "handler not on signal stack"; ASan's and faulthandler's expect it),
   * while for the rest a pool's fault is no stack overflow and a program's
   * small alternate stack (MINSIGSTKSZ) need not hold this frame */
  sa.sa_flags = SA_SIGINFO | (old.sa_flags & SA_ONSTACK);
  old_bus = old; /* before the handler can run */
  if (sigaction(SIGBUS, &sa, NULL) != 0) return false;
  return true;
}

/* dlclose() of the library (Python's _ctypes.dlclose, a plugin host) would
 * leave SIGBUS pointing at unmapped code: give back the disposition from
 * before, if ours is still the installed one (a handler installed after ours
 * and chaining to it cannot be helped). */
__attribute__((destructor)) static void uninstall(void) {
  if (!enabled) return;
  struct sigaction now;
  if (sigaction(SIGBUS, NULL, &now) == 0 && (now.sa_flags & SA_SIGINFO) && now.sa_sigaction == on_sigbus)
    sigaction(SIGBUS, &old_bus, NULL);
}

void umbp_sigbus_watch(const struct umbp_pool *p) {
  pthread_once(&atfork_once, table_atfork);
  table_lock();
  if (!decided) {
    decided = true;
    enabled = !off_by_env() && install();
  }
  struct watch *w = NULL;
  for (unsigned i = 0; enabled && i < WATCH_MAX && !w; i++)
    if (!atomic_load_explicit(&watches[i].base, memory_order_relaxed)) w = &watches[i];
  if (w) {
    struct stat st;
    begin_change(w);
    w->len = p->size;
    w->pool = p;
    w->fd = p->fd;
    w->dev = 0;
    w->ino = 0;
    if (p->fd >= 0 && fstat(p->fd, &st) == 0) w->dev = st.st_dev, w->ino = st.st_ino;
    w->ilen = p->index_huge_bytes;
    w->ioff = 0;
    w->idev = p->index_dev;
    w->iino = p->index_ino;
    if (w->ilen) umbp_index_huge_range(p->hdr, &w->ioff, &w->ilen);
    memcpy(w->name, p->name, sizeof w->name);
    memcpy(w->path, p->path, sizeof w->path);
    memcpy(w->ipath, p->index_path, sizeof w->ipath);
    atomic_store_explicit(&w->quiet, false, memory_order_relaxed);
    atomic_store_explicit(&w->base, (uintptr_t)p->base, memory_order_relaxed);
    end_change(w);
  }
  table_unlock();
}

static struct watch *find(const struct umbp_pool *p) {
  for (unsigned i = 0; i < WATCH_MAX; i++)
    if (atomic_load_explicit(&watches[i].base, memory_order_relaxed) && watches[i].pool == p) return &watches[i];
  return NULL;
}

void umbp_sigbus_forget(const struct umbp_pool *p) {
  pthread_once(&atfork_once, table_atfork);
  table_lock();
  struct watch *w = find(p);
  if (w) {
    begin_change(w);
    atomic_store_explicit(&w->base, 0, memory_order_relaxed);
    w->pool = NULL;
    end_change(w);
  }
  table_unlock();
}

UMBP_API int umbp_admin_pool_sigbus_quiet(umbp_pool *p, bool quiet) {
  if (!p) return umbp_fail(-EINVAL, "umbp_admin_pool_sigbus_quiet: pool is NULL");
  pthread_once(&atfork_once, table_atfork);
  table_lock();
  struct watch *w = find(p);
  if (w) {
    begin_change(w);
    atomic_store_explicit(&w->quiet, quiet, memory_order_relaxed);
    end_change(w);
  }
  table_unlock();
  return 0;
}
