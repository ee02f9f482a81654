/* SPDX-License-Identifier: Apache-2.0 */
/*
 * sched.c — the scheduler of `umbp replay`: creates the pool, starts the
 * workers, walks the trace and measures. See replay.h for the per-request
 * phases and the protocol.
 *
 * Cleanup is the first concern: every way out of rp_run() (the end of the
 * trace, SIGINT/SIGTERM, a worker that dies, an error) goes through one exit
 * path that kills and reaps the workers that are still alive and destroys the
 * pool. Signals only set a flag; waits use poll() with a short timeout and
 * handlers are installed without SA_RESTART, so a signal is seen within
 * 250 ms even in the middle of a wait.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/statvfs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "pool_fault.h"
#include "replay/replay.h"
#include "umbp/index.h"
#include "umbp/pool.h"

#define REAP_POLL_NS 10000000L  /* 10 ms between waitpid(WNOHANG) looks at a worker that is exiting */
#define DEAD_WAIT_POLLS 200     /* a worker already gone or going: 2 s, then SIGKILL */
#define QUIT_WAIT_POLLS 1000    /* a worker told to quit: up to 10 s to finish and detach */
#define REPLY_POLL_MS 250       /* how often a wait for replies looks at signals and the clock */
#define PACE_SLEEP_MAX_NS 100000000ull /* 100 ms: the longest sleep between a trace's timestamps */

static volatile sig_atomic_t g_sig;

static void on_signal(int sig) {
  if (!g_sig) g_sig = sig;
}

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* 0 full, 1 EOF (the worker is gone), -1 error */
static int read_full(int fd, void *buf, size_t n) {
  size_t got = 0;
  while (got < n) {
    ssize_t r = read(fd, (char *)buf + got, n - got);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return -1;
    if (r == 0) return 1;
    got += (size_t)r;
  }
  return 0;
}

struct wk {
  pid_t pid;      /* 0: reaped */
  int to, from;   /* our ends of its pipes */
};

struct run {
  const struct rp_config *cfg;
  const struct trace *t;
  char name[UMBP_NAME_MAX + 1];
  umbp_pool *pool;
  uint32_t ns;
  struct wk w[RP_MAX_TP];
  size_t done;          /* requests finished */
  uint64_t *msgbuf;     /* header + ids */
};

static int spawn_worker(struct run *r, unsigned rank) {
  int to[2], from[2];
  if (pipe2(to, O_CLOEXEC)) return -errno;
  if (pipe2(from, O_CLOEXEC)) {
    int e = errno;
    close(to[0]);
    close(to[1]);
    return -e;
  }
  char rs[16], bb[32], mb[32];
  snprintf(rs, sizeof rs, "%u", rank);
  snprintf(bb, sizeof bb, "%llu", (unsigned long long)r->cfg->block_bytes);
  snprintf(mb, sizeof mb, "%u", r->t->max_whole ? r->t->max_whole : 1);
  char *argv[] = {"umbp", "replay", "--worker", "--pool", r->name, "--rank", rs, "--block-bytes", bb, "--max-blocks", mb,
                  NULL};
  pid_t pid = fork();
  if (pid < 0) {
    int e = errno;
    close(to[0]);
    close(to[1]);
    close(from[0]);
    close(from[1]);
    return -e;
  }
  if (pid == 0) {
    /* the child: the worker's fds 3 and 4; SIGINT, SIGHUP and SIGQUIT
     * ignored across exec: a terminal sends them to the whole process group,
     * and the scheduler, which catches them, decides when workers stop. Until
     * these calls the child has the scheduler's handler, so a signal of the
     * group in between does not kill it either. */
    signal(SIGINT, SIG_IGN);
    signal(SIGHUP, SIG_IGN);
    signal(SIGQUIT, SIG_IGN);
    signal(SIGTERM, SIG_DFL);
    int a = fcntl(to[0], F_DUPFD, 16), b = fcntl(from[1], F_DUPFD, 16);
    if (a < 0 || b < 0 || dup2(a, RP_WORKER_IN_FD) < 0 || dup2(b, RP_WORKER_OUT_FD) < 0) _exit(127);
    execv("/proc/self/exe", argv);
    fprintf(stderr, "umbp: replay: cannot exec /proc/self/exe for worker rank %u: %s\n", rank, strerror(errno));
    _exit(127);
  }
  close(to[0]);
  close(from[1]);
  fcntl(to[1], F_SETFL, O_NONBLOCK); /* send_msg bounds its wait on a worker that reads nothing */
  r->w[rank].pid = pid;
  r->w[rank].to = to[1];
  r->w[rank].from = from[0];
  return 0;
}

/* Reap worker rank (which is gone or going) and say how it ended. */
static void report_dead(struct run *r, unsigned rank, const char *when) {
  pid_t pid = r->w[rank].pid;
  int st = 0;
  pid_t got = 0;
  for (int i = 0; i < DEAD_WAIT_POLLS && (got = waitpid(pid, &st, WNOHANG)) == 0; i++) {
    struct timespec ts = {0, REAP_POLL_NS};
    nanosleep(&ts, NULL);
  }
  if (got == 0) {
    kill(pid, SIGKILL);
    got = waitpid(pid, &st, 0);
  }
  r->w[rank].pid = 0;
  char how[96];
  if (got != pid) snprintf(how, sizeof how, "closed its pipe");
  else if (WIFSIGNALED(st)) snprintf(how, sizeof how, "was killed by signal %d (%s)", WTERMSIG(st), strsignal(WTERMSIG(st)));
  else snprintf(how, sizeof how, "exited with status %d", WEXITSTATUS(st));
  cli_error("replay: worker rank %u (pid %d) %s %s; stopping the replay and removing pool '%s'", rank, (int)pid, how,
            when, r->name);
}

static uint64_t mono_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* The state letter and its meaning from /proc/PID/stat ("T (stopped)"). */
static void proc_state(pid_t pid, char *out, size_t n) {
  char c = cli_proc_state((int)pid);
  if (!c) c = '?';
  const char *what = c == 'T' ? "stopped (SIGSTOP or a job-control stop)" : c == 't' ? "stopped by a tracer"
                     : c == 'D' ? "in uninterruptible sleep" : c == 'R' ? "running" : c == 'S' ? "sleeping"
                     : c == 'Z' ? "a zombie" : "in an unknown state";
  snprintf(out, n, "%c, %s", c, what);
}

/* Worker rank has not answered (taken a message or sent a reply) for
 * waited_ns: name it with its pid and /proc state on stderr, as the error
 * that ends the replay when over, else as a note. */
static void note_slow(const struct run *r, unsigned rank, uint64_t waited_ns, unsigned limit_s, bool over) {
  char st[96];
  proc_state(r->w[rank].pid, st, sizeof st);
  if (over)
    cli_error("replay: worker rank %u (pid %d, state %s) sent no reply for %u s during request %zu of %zu; "
              "stopping the replay and removing pool '%s' (resume a stopped worker with 'kill -CONT %d', or "
              "allow more time with --reply-timeout)", rank, (int)r->w[rank].pid, st, limit_s, r->done + 1,
              r->t->n, r->name, (int)r->w[rank].pid);
  else
    fprintf(stderr, "umbp replay: waiting %.0f s for worker rank %u (pid %d, state %s); giving up after %u s\n",
            (double)waited_ns / 1e9, rank, (int)r->w[rank].pid, st, limit_s);
}

/* Send one message to worker rank. 0, 1 after reporting a dead or silent
 * worker, or 128+signal. The pipe is non-blocking: a message longer than the
 * pipe's buffer (a request of over 8192 ids) waits for the worker to read
 * it, and a worker that is stopped or hung must not hold the scheduler
 * beyond --reply-timeout or past a SIGINT/SIGTERM, as a wait for its reply
 * does not (wait_replies). */
static int send_msg(struct run *r, unsigned rank, uint32_t type, uint64_t seq, uint32_t n, const uint64_t *ids) {
  struct rp_msg m = {.type = type, .n = n, .seq = seq};
  size_t hdr = sizeof m, len = hdr + (size_t)n * sizeof *ids, put = 0;
  memcpy(r->msgbuf, &m, hdr);
  if (n) memcpy((char *)r->msgbuf + hdr, ids, (size_t)n * sizeof *ids);
  unsigned limit_s = r->cfg->worker_timeout_s ? r->cfg->worker_timeout_s : RP_WORKER_TIMEOUT_DEFAULT_S;
  uint64_t t0 = mono_ns(), next_note = t0 + RP_WAIT_NOTE_S * 1000000000ull;
  while (put < len) {
    ssize_t w = write(r->w[rank].to, (const char *)r->msgbuf + put, len - put);
    if (w > 0) {
      put += (size_t)w;
      continue;
    }
    if (w < 0 && errno != EINTR && errno != EAGAIN) break; /* EPIPE: the worker is gone */
    if (g_sig) return 128 + g_sig;
    uint64_t now = mono_ns();
    if (now - t0 >= (uint64_t)limit_s * 1000000000ull) {
      note_slow(r, rank, now - t0, limit_s, true);
      return 1;
    }
    if (now >= next_note) {
      note_slow(r, rank, now - t0, limit_s, false);
      next_note = now + RP_WAIT_NOTE_S * 1000000000ull;
    }
    struct pollfd pf = {.fd = r->w[rank].to, .events = POLLOUT};
    poll(&pf, 1, REPLY_POLL_MS);
  }
  if (put == len) return 0;
  char when[96];
  snprintf(when, sizeof when, "after %zu of %zu requests", r->done, r->t->n);
  report_dead(r, rank, when);
  return 1;
}

/* Wait for one reply from every rank in [lo, hi). 0, 1 (error reported), or
 * 128+signal. Replies are summed into sum. A rank that has not replied after
 * RP_WAIT_NOTE_S seconds is named on stderr (pid and /proc state) every
 * RP_WAIT_NOTE_S seconds; after cfg.worker_timeout_s the replay fails. */
static int wait_replies(struct run *r, unsigned lo, unsigned hi, uint32_t type, struct rp_reply *sum) {
  bool pending[RP_MAX_TP] = {false};
  unsigned left = 0;
  for (unsigned i = lo; i < hi; i++) {
    pending[i] = true;
    left++;
  }
  int rc = 0;
  uint64_t t0 = mono_ns(), next_note = t0 + RP_WAIT_NOTE_S * 1000000000ull;
  unsigned limit_s = r->cfg->worker_timeout_s ? r->cfg->worker_timeout_s : RP_WORKER_TIMEOUT_DEFAULT_S;
  while (left) {
    if (g_sig) return 128 + g_sig;
    uint64_t now = mono_ns();
    if (now >= next_note) {
      bool over = now - t0 >= (uint64_t)limit_s * 1000000000ull;
      for (unsigned i = lo; i < hi; i++) {
        if (!pending[i]) continue;
        note_slow(r, i, now - t0, limit_s, over);
        if (over) return 1;
      }
      next_note = now + RP_WAIT_NOTE_S * 1000000000ull;
      if (next_note > t0 + (uint64_t)limit_s * 1000000000ull) next_note = t0 + (uint64_t)limit_s * 1000000000ull;
    }
    struct pollfd pf[RP_MAX_TP];
    unsigned idx[RP_MAX_TP], np = 0;
    for (unsigned i = lo; i < hi; i++)
      if (pending[i]) {
        pf[np] = (struct pollfd){.fd = r->w[i].from, .events = POLLIN};
        idx[np++] = i;
      }
    int pr = poll(pf, np, REPLY_POLL_MS);
    if (pr < 0 && errno != EINTR) {
      cli_error("replay: poll: %s", strerror(errno));
      return 1;
    }
    if (pr <= 0) continue;
    for (unsigned k = 0; k < np; k++) {
      if (!(pf[k].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      unsigned i = idx[k];
      struct rp_reply rep;
      int rr = read_full(r->w[i].from, &rep, sizeof rep);
      if (rr != 0 || rep.type != type) {
        char when[96];
        if (type == RP_MSG_READY) snprintf(when, sizeof when, "while starting");
        else snprintf(when, sizeof when, "during request %zu of %zu", r->done + 1, r->t->n);
        report_dead(r, i, when);
        return 1;
      }
      pending[i] = false;
      left--;
      if (rep.status) rc = 1; /* the worker printed why; collect the others first */
      sum->ok += rep.ok;
      sum->dup += rep.dup;
      sum->bad += rep.bad;
      sum->unstored += rep.unstored;
      sum->copy_ns += rep.copy_ns;
      sum->bytes += rep.bytes;
    }
  }
  return rc;
}

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

/* nearest-rank percentile of sorted v[0..n) */
static double pct_ms(const uint64_t *v, size_t n, double p) {
  if (!n) return 0;
  size_t k = (size_t)(p * (double)n + 0.999999999);
  if (k < 1) k = 1;
  if (k > n) k = n;
  return (double)v[k - 1] / 1e6;
}

static void sleep_until(uint64_t target) {
  for (;;) {
    uint64_t now = now_ns();
    if (now >= target || g_sig) return;
    uint64_t d = target - now;
    if (d > PACE_SLEEP_MAX_NS) d = PACE_SLEEP_MAX_NS; /* signals end the wait within this */
    struct timespec ts = {(time_t)(d / 1000000000ull), (long)(d % 1000000000ull)};
    nanosleep(&ts, NULL);
  }
}

static void progress(const struct run *r, const struct rp_result *res, uint64_t t0, bool final) {
  static uint64_t last;
  uint64_t now = now_ns();
  if (!final && now - last < 100000000ull) return;
  last = now;
  if (final) {
    fputs("\r\033[K", stderr);
    return;
  }
  double s = (double)(now - t0) / 1e9;
  fprintf(stderr, "\r\033[Kreplay: %zu/%zu requests, %.0f req/s, cache ratio %.1f%%", r->done, r->t->n,
          s > 0 ? (double)r->done / s : 0.0,
          res->blocks_total ? 100.0 * (double)res->blocks_hit / (double)res->blocks_total : 0.0);
  fflush(stderr);
}

static void log_cb(void *arg, int level, const char *msg) {
  (void)arg;
  cli_error("%s: %s", level == UMBP_LOG_ERROR ? "error" : "warning", msg);
}

/* The run's private pool (of capacity bytes, r->cfg's slots) and its
 * namespace, into r; the slot count and segment size into res. 0, or 1 with
 * the message printed (r->pool NULL when the pool was not created). */
static int open_pool(struct run *r, uint64_t capacity, bool unbounded, struct rp_result *res) {
  const struct rp_config *cfg = r->cfg;
  umbp_pool_params pp;
  umbp_pool_params_init(&pp);
  pp.capacity = capacity;
  pp.slot_size = cfg->slot_size;
  pp.no_prefault = true; /* pages fault in as blocks are stored: faster than pre-faulting all */
  pp.event_capacity = 1024;
  int rc = umbp_pool_create(r->name, &pp, &r->pool);
  /* a pool of this name left by an earlier replay whose processes were all killed (SIGKILL, the
   * OOM killer) under a PID now reused: it is not ours to remove, and replay has no option for
   * another name, so take the next free one */
  size_t base = strlen(r->name);
  for (unsigned k = 1; rc == -EEXIST && k <= 64; k++) {
    snprintf(r->name + base, sizeof r->name - base, "-%u", k);
    rc = umbp_pool_create(r->name, &pp, &r->pool);
  }
  if (rc != 0) {
    if (unbounded && (rc == -ENOSPC || rc == -ENOMEM || rc == -E2BIG || rc == -EFBIG)) {
      /* no --capacity was given, so the library's "choose a smaller
       * --capacity" is not the fix: a sweep of what fits is */
      char a[32], e[32];
      struct statvfs sv;
      uint64_t shm_free = statvfs("/dev/shm", &sv) == 0 ? (uint64_t)sv.f_bavail * sv.f_frsize : capacity / 2;
      /* the largest power-of-two MiB in half of what is free, and its half and quarter; only
       * those the sweep accepts: a pool holds at least one slot per rank (and two slots) and at
       * most CLI_MAX_SLOTS, so large shards (--bytes-per-token, --tp) rule out the small ones */
      uint64_t min_cap = (uint64_t)(cfg->tp < 2 ? 2 : cfg->tp) * cfg->slot_size;
      uint64_t max_cap = (uint64_t)CLI_MAX_SLOTS * cfg->slot_size;
      uint64_t top = 4ull << 20;
      while (top * 2 <= shm_free / 2 && top * 2 <= max_cap) top *= 2;
      char list[128] = "", one[32];
      size_t len = 0;
      for (uint64_t c = top / 4; c <= top; c *= 2)
        if (c >= min_cap && c <= max_cap && len + 40 < sizeof list)
          len += (size_t)snprintf(list + len, sizeof list - len, "%s%s", len ? "," : "", cli_fmt_size_arg(c, one, sizeof one));
      cli_fmt_size(capacity, a, sizeof a);
      cli_fmt_size(shm_free, e, sizeof e);
      if (len) {
        cli_error("replay: the unbounded pool (a slot for every distinct block of the trace on every rank: %s) "
                  "cannot be created: %s\n"
                  "No --capacity was given, so measure the hit-ratio curve in what fits instead: "
                  "--capacity-sweep %s (/dev/shm has %s free), or replay a smaller workload "
                  "(--bytes-per-token, --conversations)",
                  a, umbp_last_error(), list, e);
      } else {
        char m[32], sl[32];
        cli_error("replay: the unbounded pool (a slot for every distinct block of the trace on every rank: %s) "
                  "cannot be created: %s\n"
                  "No --capacity was given, and even the smallest pool, one %s slot per rank (%s), is more than "
                  "half of the %s free in /dev/shm: lower --bytes-per-token or --tp, or enlarge /dev/shm",
                  a, umbp_last_error(), cli_fmt_size(cfg->slot_size, sl, sizeof sl), cli_fmt_size(min_cap, m, sizeof m),
                  e);
      }
    } else {
      cli_error("replay: cannot create pool '%s' of %llu bytes: %s", r->name, (unsigned long long)capacity,
                umbp_last_error());
    }
    r->pool = NULL;
    return 1;
  }
  cli_fault_watch(r->pool, "umbp replay", false);
  {
    umbp_pool_info info;
    if (umbp_pool_get_info(r->pool, &info) == 0) {
      res->slots = info.slot_count;
      res->segment_bytes = info.total_size;
    }
  }
  if (res->slots < cfg->tp) {
    cli_error("replay: pool '%s' has %llu slots, fewer than the %u ranks: use a larger --capacity", r->name,
              (unsigned long long)res->slots, cfg->tp);
    return 1;
  }
  if (umbp_ns_register(r->pool, RP_NS_NAME, &r->ns) != 0) {
    cli_error("replay: cannot register namespace '%s': %s", RP_NS_NAME, umbp_last_error());
    return 1;
  }
  return 0;
}

/* Request i of the trace, started at a (ns): probe the prefix on every rank,
 * load the hit blocks on every rank, store the rest (one rank after another
 * when the pool is bounded, so that ranks evict in turn). The hit prefix into
 * *ret_hit and the counts into res. 0, or the nonzero exit code with the
 * message printed. */
static int replay_request(struct run *r, size_t i, uint64_t a, umbp_key *keys, bool serial_store,
                          struct rp_result *res, uint32_t *ret_hit) {
  const struct rp_config *cfg = r->cfg;
  const struct trace_req *q = &r->t->req[i];
  const uint64_t *ids = r->t->ids + q->ids_off;
  int rc;
  /* 1. probe: one call per rank; rank r > 0 only over the prefix so far */
  uint32_t hit = q->n_whole;
  for (unsigned rk = 0; rk < cfg->tp && hit; rk++) {
    for (uint32_t k = 0; k < hit; k++) rp_key(&keys[k], r->ns, rk, ids[k]);
    int p = umbp_prefix_probe(r->pool, hit, keys);
    if (p < 0) {
      cli_error("replay: umbp_prefix_probe: %s", umbp_last_error());
      return 1;
    }
    res->keys_probed += (uint64_t)p < hit ? (uint64_t)p + 1 : hit;
    hit = (uint32_t)p;
  }
  uint64_t b = now_ns();
  res->probe_ns += b - a;
  /* 2. load the hit prefix on every rank */
  struct rp_reply sum = {0};
  if (hit) {
    for (unsigned rk = 0; rk < cfg->tp; rk++)
      if ((rc = send_msg(r, rk, RP_MSG_LOAD, i, hit, ids)) != 0) return rc;
    if ((rc = wait_replies(r, 0, cfg->tp, RP_MSG_LOAD, &sum)) != 0) {
      if (sum.bad) cli_error("replay: %u loaded blocks failed verification in request %zu", sum.bad, i + 1);
      res->verify_failures += sum.bad;
      return rc;
    }
    res->blocks_loaded += sum.ok;
    res->bytes_loaded += sum.bytes;
    res->copy_bytes += sum.bytes;
    res->copy_ns += sum.copy_ns;
  }
  /* 3. store the rest of the whole blocks */
  if (q->n_whole > hit) {
    struct rp_reply st = {0};
    uint32_t n = q->n_whole - hit;
    if (serial_store) {
      for (unsigned rk = 0; rk < cfg->tp; rk++) {
        if ((rc = send_msg(r, rk, RP_MSG_STORE, i, n, ids + hit)) != 0) return rc;
        if ((rc = wait_replies(r, rk, rk + 1, RP_MSG_STORE, &st)) != 0) return rc;
      }
    } else {
      for (unsigned rk = 0; rk < cfg->tp; rk++)
        if ((rc = send_msg(r, rk, RP_MSG_STORE, i, n, ids + hit)) != 0) return rc;
      if ((rc = wait_replies(r, 0, cfg->tp, RP_MSG_STORE, &st)) != 0) return rc;
    }
    res->blocks_stored += st.ok;
    res->blocks_dup += st.dup;
    res->blocks_unstored += st.unstored;
    res->bytes_stored += (uint64_t)st.ok * cfg->block_bytes;
    res->copy_bytes += st.bytes;
    res->copy_ns += st.copy_ns;
  }
  *ret_hit = hit;
  return 0;
}

/* An orderly goodbye: QUIT to every worker, then reap each (10 s at most;
 * one still running is killed by rp_run's cleanup). 0, or 1 when one could not
 * be told or did not exit 0. */
static int stop_workers(struct run *r) {
  const struct rp_config *cfg = r->cfg;
  int rc = 0;
  for (unsigned i = 0; i < cfg->tp; i++)
    if (r->w[i].pid && send_msg(r, i, RP_MSG_QUIT, 0, 0, NULL) != 0) rc = 1;
  for (unsigned i = 0; i < cfg->tp; i++) {
    if (!r->w[i].pid) continue;
    int st = 0;
    pid_t got = 0;
    for (int k = 0; k < QUIT_WAIT_POLLS && (got = waitpid(r->w[i].pid, &st, WNOHANG)) == 0; k++) {
      struct timespec ts = {0, REAP_POLL_NS};
      nanosleep(&ts, NULL);
    }
    if (got == r->w[i].pid && WIFEXITED(st) && WEXITSTATUS(st) == 0) {
      r->w[i].pid = 0;
    } else if (got == r->w[i].pid) {
      r->w[i].pid = 0;
      cli_error("replay: worker rank %u did not finish cleanly (status 0x%x)", i, (unsigned)st);
      rc = 1;
    } else if (got == 0) { /* stopped or hung: rp_run's cleanup kills it */
      char state[96];
      proc_state(r->w[i].pid, state, sizeof state);
      cli_error("replay: worker rank %u (pid %d, state %s) did not exit within %d s of the end of the replay; "
                "killing it", i, (int)r->w[i].pid, state, (int)(QUIT_WAIT_POLLS * (REAP_POLL_NS / 1000000) / 1000));
      rc = 1;
    }
  }
  return rc;
}

int rp_run(const struct rp_config *cfg, const struct trace *t, uint64_t capacity, bool unbounded, unsigned step,
           struct rp_result *res) {
  struct run r;
  memset(&r, 0, sizeof r);
  memset(res, 0, sizeof *res);
  r.cfg = cfg;
  r.t = t;
  res->capacity = capacity;
  res->unbounded = unbounded;
  for (unsigned i = 0; i < RP_MAX_TP; i++) r.w[i].to = r.w[i].from = -1;
  snprintf(r.name, sizeof r.name, "replay-%d-%u", (int)getpid(), step);

  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal; /* no SA_RESTART: poll/nanosleep return EINTR */
  sigemptyset(&sa.sa_mask);
  struct sigaction old_int, old_term, old_hup, old_quit, old_pipe;
  sigaction(SIGINT, &sa, &old_int);
  sigaction(SIGTERM, &sa, &old_term);
  /* a terminal hung up, or Ctrl-\: the pool is removed as on Ctrl-C (no core
   * dump: a core of a scheduler waiting on its workers says little). Where
   * they are ignored (nohup, a script's background job) they stay so. */
  sigaction(SIGHUP, NULL, &old_hup);
  if (old_hup.sa_handler != SIG_IGN) sigaction(SIGHUP, &sa, NULL);
  sigaction(SIGQUIT, NULL, &old_quit);
  if (old_quit.sa_handler != SIG_IGN) sigaction(SIGQUIT, &sa, NULL);
  struct sigaction ign = {.sa_handler = SIG_IGN};
  sigaction(SIGPIPE, &ign, &old_pipe);
  umbp_log_set(log_cb, NULL, UMBP_LOG_ERROR);

  int rc = 0;
  uint64_t *pool_ns = calloc(t->n ? t->n : 1, sizeof *pool_ns);
  umbp_key *keys = calloc(t->max_whole ? t->max_whole : 1, sizeof *keys);
  r.msgbuf = malloc(sizeof(struct rp_msg) + (size_t)(t->max_whole + 1) * sizeof(uint64_t));
  if (!pool_ns || !keys || !r.msgbuf) {
    cli_error("replay: out of memory for %zu requests", t->n);
    rc = 1;
    goto out;
  }

  if ((rc = open_pool(&r, capacity, unbounded, res)) != 0) goto out;
  for (unsigned i = 0; i < cfg->tp; i++) {
    int e = spawn_worker(&r, i);
    if (e) {
      cli_error("replay: cannot start worker rank %u: %s", i, strerror(-e));
      rc = 1;
      goto out;
    }
  }
  {
    struct rp_reply sum = {0};
    if ((rc = wait_replies(&r, 0, cfg->tp, RP_MSG_READY, &sum)) != 0) goto out;
  }

  uint64_t t0 = now_ns();
  double ts0 = t->n ? t->req[0].timestamp_ms : 0;
  bool serial_store = !unbounded;
  for (size_t i = 0; i < t->n; i++) {
    if (g_sig) {
      rc = 128 + g_sig;
      goto out;
    }
    const struct trace_req *q = &t->req[i];
    if (cfg->speed > 0) {
      /* a delay past the range of uint64_t (a timestamp of 1e20 ms, --speed
       * 1e-300) is clamped to 2^63 ns: converting it would be undefined, and
       * wrapped to 0 on x86, replaying the rest of the trace unpaced */
      double dt_ns = (q->timestamp_ms - ts0) / cfg->speed * 1e6;
      if (dt_ns > 0) sleep_until(t0 + (dt_ns < 0x1p63 ? (uint64_t)dt_ns : 1ull << 63));
    }
    uint64_t a = now_ns();
    uint32_t hit;
    if ((rc = replay_request(&r, i, a, keys, serial_store, res, &hit)) != 0) goto out;
    pool_ns[i] = now_ns() - a;
    res->requests++;
    res->input_tokens += q->input_len;
    res->output_tokens += q->output_len;
    res->blocks_total += q->n_whole;
    res->blocks_hit += hit;
    r.done = i + 1;
    if (cfg->progress) progress(&r, res, t0, false);
  }
  res->wall_s = (double)(now_ns() - t0) / 1e9;
  if (cfg->progress) progress(&r, res, t0, true);
  {
    umbp_counters c;
    if (umbp_counters_ns(r.pool, r.ns, &c) == 0) res->evictions = c.evictions;
  }
  qsort(pool_ns, t->n, sizeof *pool_ns, cmp_u64);
  res->pool_p50_ms = pct_ms(pool_ns, t->n, 0.50);
  res->pool_p99_ms = pct_ms(pool_ns, t->n, 0.99);
  if (stop_workers(&r)) rc = 1;

out:
  if (cfg->progress && rc) fputs("\r\033[K", stderr);
  if (rc > 128) {
    int sig = rc - 128;
    const char *abbrev = sigabbrev_np(sig);
    cli_error("replay: interrupted by SIG%s after %zu of %zu requests; removing pool '%s'", abbrev ? abbrev : "?",
              r.done, t->n, r.name);
  }
  for (unsigned i = 0; i < RP_MAX_TP; i++)
    if (r.w[i].pid) kill(r.w[i].pid, SIGKILL);
  for (unsigned i = 0; i < RP_MAX_TP; i++) {
    if (r.w[i].pid) {
      while (waitpid(r.w[i].pid, NULL, 0) < 0 && errno == EINTR) {
      }
      r.w[i].pid = 0;
    }
    if (r.w[i].to >= 0) close(r.w[i].to);
    if (r.w[i].from >= 0) close(r.w[i].from);
  }
  if (r.pool) {
    cli_pool_detach(r.pool);
    umbp_pool_destroy(r.name);
  }
  free(pool_ns);
  free(keys);
  free(r.msgbuf);
  umbp_log_set(NULL, NULL, 0);
  sigaction(SIGINT, &old_int, NULL);
  sigaction(SIGTERM, &old_term, NULL);
  sigaction(SIGHUP, &old_hup, NULL);
  sigaction(SIGQUIT, &old_quit, NULL);
  sigaction(SIGPIPE, &old_pipe, NULL);
  return rc;
}
