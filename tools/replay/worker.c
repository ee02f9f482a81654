/* SPDX-License-Identifier: Apache-2.0 */
/*
 * worker.c — one TP rank of `umbp replay`: a process exec'd by the scheduler
 * that moves its shard of each block between the pool and a private buffer
 * standing in for its GPU's KV cache. See replay.h for the protocol.
 *
 * The worker ignores SIGINT, SIGHUP and SIGQUIT (a terminal sends them to
 * the whole process group; the scheduler catches them and decides when workers
 * stop). If the scheduler
 * vanishes without a QUIT (its pipe reaches EOF), the worker removes the pool
 * itself, so a scheduler killed by SIGKILL leaves no segment behind.
 */
#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "pool_fault.h"
#include "replay/replay.h"
#include "umbp/index.h"
#include "umbp/pool.h"

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* 0 full, 1 EOF before the first byte, -1 error or EOF in the middle */
static int read_full(int fd, void *buf, size_t n) {
  size_t got = 0;
  while (got < n) {
    ssize_t r = read(fd, (char *)buf + got, n - got);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return got == 0 && r == 0 ? 1 : -1;
    got += (size_t)r;
  }
  return 0;
}

static int write_full(int fd, const void *buf, size_t n) {
  size_t put = 0;
  while (put < n) {
    ssize_t r = write(fd, (const char *)buf + put, n - put);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return -1;
    put += (size_t)r;
  }
  return 0;
}

struct worker {
  umbp_pool *pool;
  const char *pool_name;
  unsigned rank;
  uint32_t ns;
  uint64_t block_bytes;
  uint32_t max_blocks;
  unsigned char *buf;     /* max_blocks * block_bytes: the stand-in GPU cache */
  umbp_key *keys;
  uint32_t *slots;
  int *rcs;
  uint8_t *present;
  uint64_t *ids;
  uint64_t *todo;
};

static void wlog(const struct worker *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void wlog(const struct worker *w, const char *fmt, ...) {
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  fprintf(stderr, "umbp: replay rank %u (pid %d): %s\n", w->rank, (int)getpid(), msg);
}

static void log_cb(void *arg, int level, const char *msg) {
  const struct worker *w = arg;
  if (level <= UMBP_LOG_ERROR) wlog(w, "%s", msg);
}

static void do_load(struct worker *w, uint32_t n, struct rp_reply *rep) {
  for (uint32_t i = 0; i < n; i++) rp_key(&w->keys[i], w->ns, w->rank, w->ids[i]);
  int hits = umbp_lookup_pin_bulk(w->pool, n, w->keys, w->slots);
  if (hits < 0) {
    wlog(w, "umbp_lookup_pin_bulk: %s", umbp_last_error());
    rep->status = hits;
    return;
  }
  uint64_t t0 = now_ns();
  for (uint32_t i = 0; i < n; i++) {
    if (w->slots[i] == UMBP_NO_SLOT) continue;
    memcpy(w->buf + (size_t)i * w->block_bytes, umbp_slot_ptr(w->pool, w->slots[i]), w->block_bytes);
  }
  rep->copy_ns = now_ns() - t0;
  uint32_t pinned = 0;
  for (uint32_t i = 0; i < n; i++)
    if (w->slots[i] != UMBP_NO_SLOT) w->slots[pinned++] = w->slots[i];
  if (pinned) umbp_unpin_bulk(w->pool, pinned, w->slots);
  if ((uint32_t)hits != n) {
    /* no one reserves during a load phase, so a probed block cannot vanish */
    for (uint32_t i = 0; i < n; i++)
      if (umbp_contains(w->pool, &w->keys[i]) != 1) {
        wlog(w, "block %llu (position %u of the request's prefix) was found by the probe but is gone when pinned",
             (unsigned long long)w->ids[i], i);
        break;
      }
    rep->status = -ENOENT;
    return;
  }
  for (uint32_t i = 0; i < n; i++) {
    long off = rp_verify(w->buf + (size_t)i * w->block_bytes, w->block_bytes, w->ids[i], w->rank);
    if (off >= 0) {
      if (!rep->bad)
        wlog(w, "block %llu (hash id) loaded from pool '%s' differs from what was stored at byte %ld of %llu",
             (unsigned long long)w->ids[i], w->pool_name, off, (unsigned long long)w->block_bytes);
      rep->bad++;
    } else {
      rep->ok++;
    }
  }
  rep->bytes = (uint64_t)n * w->block_bytes;
  if (rep->bad) rep->status = -EBADMSG;
}

static void do_store(struct worker *w, uint32_t n, struct rp_reply *rep) {
  /* only the blocks this rank lacks (a bounded pool may have evicted a block
   * on one rank and kept it on another) */
  for (uint32_t i = 0; i < n; i++) rp_key(&w->keys[i], w->ns, w->rank, w->ids[i]);
  int pr = umbp_contains_bulk(w->pool, n, w->keys, w->present);
  if (pr < 0) {
    wlog(w, "umbp_contains_bulk: %s", umbp_last_error());
    rep->status = pr;
    return;
  }
  uint32_t m = 0;
  for (uint32_t i = 0; i < n; i++)
    if (!w->present[i]) w->todo[m++] = w->ids[i];
    else rep->dup++;
  /* the "GPU" computes the blocks */
  for (uint32_t i = 0; i < m; i++) {
    rp_fill(w->buf + (size_t)i * w->block_bytes, w->block_bytes, w->todo[i], w->rank);
    rp_key(&w->keys[i], w->ns, w->rank, w->todo[i]);
  }
  uint32_t done = 0;
  while (done < m) {
    int got = umbp_reserve_bulk(w->pool, -1, w->ns, m - done, w->slots);
    if (got == -ENOSPC || got == 0) {
      rep->unstored += m - done;
      break;
    }
    if (got < 0) {
      wlog(w, "umbp_reserve_bulk: %s", umbp_last_error());
      rep->status = got;
      return;
    }
    uint64_t t0 = now_ns();
    for (int i = 0; i < got; i++)
      memcpy(umbp_slot_ptr(w->pool, w->slots[i]), w->buf + (size_t)(done + (uint32_t)i) * w->block_bytes,
             w->block_bytes);
    rep->copy_ns += now_ns() - t0;
    rep->bytes += (uint64_t)got * w->block_bytes;
    umbp_publish_bulk(w->pool, (unsigned)got, w->slots, w->keys + done, w->rcs);
    for (int i = 0; i < got; i++) {
      if (w->rcs[i] == 0) rep->ok++;
      else if (w->rcs[i] == -EEXIST) rep->dup++; /* a duplicate id within the request */
      else {
        wlog(w, "umbp_publish of block %llu: %s", (unsigned long long)w->todo[done + (uint32_t)i],
             umbp_strerror(w->rcs[i]));
        rep->status = w->rcs[i];
        return;
      }
    }
    done += (uint32_t)got;
  }
}

static int parse_u64(const char *s, uint64_t *v) {
  char *e;
  errno = 0;
  unsigned long long x = strtoull(s, &e, 10);
  if (errno || e == s || *e) return -1;
  *v = x;
  return 0;
}

int rp_worker_main(int argc, char **argv) {
  struct worker w;
  memset(&w, 0, sizeof w);
  uint64_t rank = UINT64_MAX, bb = 0, mb = 0;
  for (int i = 2; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "--pool")) w.pool_name = argv[i + 1];
    else if (!strcmp(argv[i], "--rank")) parse_u64(argv[i + 1], &rank);
    else if (!strcmp(argv[i], "--block-bytes")) parse_u64(argv[i + 1], &bb);
    else if (!strcmp(argv[i], "--max-blocks")) parse_u64(argv[i + 1], &mb);
  }
  if (!w.pool_name || rank >= RP_MAX_TP || !bb || bb % 8 || mb > TRACE_MAX_IDS_PER_REQ) {
    fprintf(stderr, "umbp: replay --worker is started by 'umbp replay' itself, not by hand\n");
    return 2;
  }
  w.rank = (unsigned)rank;
  w.block_bytes = bb;
  w.max_blocks = (uint32_t)(mb ? mb : 1);
  signal(SIGINT, SIG_IGN);
  signal(SIGHUP, SIG_IGN);
  signal(SIGQUIT, SIG_IGN);
  signal(SIGPIPE, SIG_IGN);
  umbp_log_set(log_cb, &w, UMBP_LOG_ERROR);

  long kill_after = -1;
  const char *kv = getenv(RP_TEST_KILL_ENV);
  if (kv) {
    unsigned kr;
    long k;
    if (sscanf(kv, "%u:%ld", &kr, &k) == 2 && kr == w.rank) kill_after = k;
  }

  struct rp_reply rep = {.type = RP_MSG_READY};
  w.buf = aligned_alloc(64, ((size_t)w.max_blocks * w.block_bytes + 63) / 64 * 64);
  w.keys = calloc(w.max_blocks, sizeof *w.keys);
  w.slots = calloc(w.max_blocks, sizeof *w.slots);
  w.rcs = calloc(w.max_blocks, sizeof *w.rcs);
  w.present = calloc(w.max_blocks, 1);
  w.ids = calloc(w.max_blocks, sizeof *w.ids);
  w.todo = calloc(w.max_blocks, sizeof *w.todo);
  int rc = 0;
  if (!w.buf || !w.keys || !w.slots || !w.rcs || !w.present || !w.ids || !w.todo) {
    wlog(&w, "cannot allocate a %llu-byte buffer for %u blocks", (unsigned long long)w.max_blocks * w.block_bytes,
         w.max_blocks);
    rep.status = -ENOMEM;
  } else {
    umbp_attach_opts o;
    umbp_attach_opts_init(&o);
    o.role = UMBP_ROLE_WORKER;
    o.rank = (int)w.rank;
    if ((rc = umbp_pool_attach(w.pool_name, &o, &w.pool)) == 0) {
      char who[48]; /* a SIGBUS on the pool names this rank */
      snprintf(who, sizeof who, "umbp replay: worker rank %u", w.rank);
      cli_fault_watch(w.pool, who, false);
    }
    if (rc) {
      wlog(&w, "cannot attach to pool '%s': %s", w.pool_name, umbp_last_error());
      rep.status = rc;
    } else if ((rc = umbp_ns_lookup(w.pool, RP_NS_NAME, &w.ns)) != 0) {
      wlog(&w, "pool '%s' has no namespace '%s'", w.pool_name, RP_NS_NAME);
      rep.status = rc;
    } else if (umbp_slot_size(w.pool) < w.block_bytes) {
      wlog(&w, "pool slots of %llu bytes are smaller than a block's %llu", (unsigned long long)umbp_slot_size(w.pool),
           (unsigned long long)w.block_bytes);
      rep.status = -EINVAL;
    }
  }
  int exit_code = 0;
  if (write_full(RP_WORKER_OUT_FD, &rep, sizeof rep) || rep.status) {
    exit_code = 1;
    goto out;
  }
  for (;;) {
    struct rp_msg m;
    int r = read_full(RP_WORKER_IN_FD, &m, sizeof m);
    if (r != 0) {
      /* the scheduler is gone without saying QUIT: clean up after it */
      wlog(&w, "the scheduler went away; removing pool '%s'", w.pool_name);
      umbp_pool_destroy(w.pool_name);
      exit_code = 1;
      break;
    }
    if (m.type == RP_MSG_QUIT) break;
    if (m.n > w.max_blocks || (m.type != RP_MSG_LOAD && m.type != RP_MSG_STORE)) {
      wlog(&w, "bad message from the scheduler (type %u, %u blocks)", m.type, m.n);
      exit_code = 1;
      break;
    }
    if (m.n && read_full(RP_WORKER_IN_FD, w.ids, (size_t)m.n * sizeof *w.ids) != 0) {
      wlog(&w, "the scheduler's message was cut short; removing pool '%s'", w.pool_name);
      umbp_pool_destroy(w.pool_name);
      exit_code = 1;
      break;
    }
    if (kill_after >= 0 && (long)m.seq >= kill_after) raise(SIGKILL);
    memset(&rep, 0, sizeof rep);
    rep.type = m.type;
    rep.seq = m.seq;
    if (m.type == RP_MSG_LOAD) do_load(&w, m.n, &rep);
    else do_store(&w, m.n, &rep);
    umbp_counters_flush(w.pool);
    umbp_pool_heartbeat(w.pool);
    if (write_full(RP_WORKER_OUT_FD, &rep, sizeof rep)) {
      exit_code = 1;
      break;
    }
  }
out:
  cli_pool_detach(w.pool);
  free(w.buf);
  free(w.keys);
  free(w.slots);
  free(w.rcs);
  free(w.present);
  free(w.ids);
  free(w.todo);
  return exit_code;
}
