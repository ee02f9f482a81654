/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tierq.c — the request table between a pool's schedulers and its host tier
 * (tier.h).
 *
 * Design note. The table is a file beside the pool, /dev/shm/umbp.NAME.tier:
 * a 4 KiB header (geometry, the tier's state, message and counters, a
 * doorbell) and `records` fixed records, each a 64-byte control line and
 * room for keys_per_record keys. It is not in the pool segment: the pool's
 * layout stays frozen and a pool without a tier pays nothing. The tier
 * creates it (or adopts the one its predecessor left) and holds an OFD lock
 * on byte 0 for as long as it serves; the kernel drops the lock when the
 * tier dies, which is how a client tells a live tier from a dead one without
 * trusting a pid.
 *
 * A record's control word is state (8 bits) | result (24 bits) | gen (32):
 *
 *   FREE g    --client CAS-->   FILLING g   (the client writes keys, counts, deadline)
 *   FILLING g --client store--> READY g     (release: keys before readiness)
 *   READY g   --tier CAS----->  WORKING g   (acquire; the tier copies the keys,
 *                                            then re-reads the word: a changed
 *                                            word means cancelled, copy dropped)
 *   WORKING g --tier CAS----->  DONE g,r    (release: published blocks before
 *                                            the answer)
 *   DONE g    --client CAS--->  FREE g+1    (the poll that reads r)
 *   READY/WORKING/DONE g --client cancel CAS--> FREE g+1 (deadline passed, or
 *                                            no live tier, or umbp_tier_cancel)
 *   any but FREE, abandoned a minute --tier CAS--> FREE g+1
 *
 * A ticket is gen << 16 | record, so an operation on a record that has
 * moved on to a later generation fails its CAS and says -ESTALE. The tier's
 * completion of a request the client cancelled fails the same way: the
 * blocks it fetched stay in the pool as ordinary blocks, nothing else
 * happens. A tier that dies holding WORKING records leaves them to the
 * clients' polls (which see the lock byte free and cancel with -ENOTCONN)
 * or to the next tier, which makes them READY again on adoption.
 *
 * What a stopped process does to the others: a client stopped in FILLING
 * holds one record until the tier reclaims it (a minute); a stopped tier
 * holds every request until its own deadline, when each client cancels. A
 * client stopped in the middle of copying its keys for that minute may, once
 * resumed, write keys over the record's next request before its own CAS to
 * READY fails: that request then asks for other blocks than its client's.
 * Nothing wrong is published (every key names its own block in the store),
 * and the client re-probes the pool for its own keys, so it only loses the
 * prefetch.
 * Nothing here spins on another process, and the only blocking call is the
 * tier's own futex wait on the doorbell.
 *
 * Memory ordering: [R1] the client's release store of READY after the keys
 * pairs with [A1], the tier's acquire CAS to WORKING; [F1] the tier's
 * acquire fence after copying the keys orders the copy before its re-read
 * of the word (a client that cancelled and refilled the record changed the
 * word first). [R2] the tier's release CAS to DONE pairs with [A2], the
 * client's acquire load in poll. Counters, state, message and heartbeat are
 * relaxed: for people and for the request's admission check, never for
 * data.
 */
#include <fcntl.h>
#include <linux/futex.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "common/common.h"
#include "shm/pool_internal.h"
#include "umbp/tier.h"

#define TQ_MAGIC UINT64_C(0x5145495450424d55) /* "UMBPTIEQ" little-endian */
#define TQ_MAJOR 1
#define TQ_HDR_BYTES 4096u
#define TQ_CTRL_BYTES 64u
#define TQ_ABANDON_NS (60ull * 1000 * 1000 * 1000)

enum { ST_FREE = 0, ST_FILLING = 1, ST_READY = 2, ST_WORKING = 3, ST_DONE = 4 };

#define W_STATE(w) ((unsigned)((w) & 0xff))
#define W_RESULT(w) ((int32_t)(uint32_t)((w) & 0xffffff00u) >> 8) /* bits 8..31: 24-bit signed */
#define W_GEN(w) ((uint32_t)((w) >> 32))
#define W_MAKE(st, res, gen) ((uint64_t)(st) | ((uint64_t)((uint32_t)(res) & 0xffffffu) << 8) | ((uint64_t)(gen) << 32))

struct tq_hdr {
  /* line 0: immutable after creation */
  _Atomic uint64_t magic;
  uint16_t major, minor;
  uint32_t hdr_bytes;
  uint32_t records, keys_per_record;
  uint32_t key_size, record_bytes;
  uint8_t uuid[16];
  uint64_t total_bytes;
  uint64_t checksum; /* FNV-1a of bytes [8, 56) */
  /* line 1: the tier */
  _Alignas(64) _Atomic int32_t pid;
  _Atomic uint32_t state;
  _Atomic uint32_t default_timeout_ms;
  _Atomic uint32_t msg_seq; /* odd while the message is rewritten */
  _Atomic uint64_t state_ns;     /* CLOCK_MONOTONIC of the last state change */
  _Atomic uint64_t heartbeat_ns; /* CLOCK_MONOTONIC */
  /* line 2: the doorbell (futex word) */
  _Alignas(64) _Atomic uint32_t doorbell;
  /* line 3..: counters, then the message */
  _Alignas(64) _Atomic uint64_t stats[UMBP_TIER_ST_COUNT];
  _Alignas(64) _Atomic char msg[200];
};
_Static_assert(offsetof(struct tq_hdr, checksum) == 56, "tier table line 0 frozen");
_Static_assert(sizeof(struct tq_hdr) <= TQ_HDR_BYTES, "tier table header fits its page");

struct tq_ctrl {
  _Atomic uint64_t word;
  _Atomic uint64_t since_ns; /* CLOCK_MONOTONIC of the last transition (reclaim) */
  uint64_t deadline_ns;
  uint64_t submit_ns;
  uint32_t n_blocks;
  uint16_t n_ranks;
  uint16_t client;
  int32_t pad[6];
};
_Static_assert(sizeof(struct tq_ctrl) == TQ_CTRL_BYTES, "record control line");

struct umbp_tier {
  umbp_pool *p;       /* may be detached (freed) before the close: see tq_pool_check() */
  uint64_t p_serial;  /* p's attach_serial */
  uint32_t owner_id;  /* p's, for the records this client fills */
  char pool_name[UMBP_NAME_MAX + 8]; /* p's, for messages */
  int fd;
  bool server;
  struct tq_hdr *h;
  size_t len;
  uint32_t records, kpr, record_bytes; /* private copies of the geometry */
  _Atomic uint32_t next;               /* where the next request's search starts */
  uint64_t last_sweep_ns;
};

static uint64_t tq_sum(const struct tq_hdr *h) {
  return umbp_fnv1a((const char *)h + 8, offsetof(struct tq_hdr, checksum) - 8, 0);
}
static size_t tq_record_bytes(uint32_t kpr) {
  return (TQ_CTRL_BYTES + (size_t)kpr * sizeof(umbp_key) + 63) & ~(size_t)63;
}
static size_t tq_bytes(uint32_t records, uint32_t kpr) { return TQ_HDR_BYTES + (size_t)records * tq_record_bytes(kpr); }
static struct tq_ctrl *tq_rec(const umbp_tier *t, uint32_t i) {
  return (struct tq_ctrl *)((char *)t->h + TQ_HDR_BYTES + (size_t)i * t->record_bytes);
}
static umbp_key *tq_keys(const umbp_tier *t, uint32_t i) { return (umbp_key *)((char *)tq_rec(t, i) + TQ_CTRL_BYTES); }
static void tq_name(const char *pool, char *buf, size_t n) { snprintf(buf, n, "/umbp.%s.tier", pool); }

static int tq_lock(int fd, short type) {
  struct flock fl = {.l_type = type, .l_whence = SEEK_SET, .l_start = 0, .l_len = 1};
  return fcntl(fd, F_OFD_SETLK, &fl) == 0 ? 0 : -errno;
}
/* A live tier holds byte 0 (cannot tell: assume alive). */
static bool tq_alive(const umbp_tier *t) {
  if (t->server) return true;
  struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = 0, .l_len = 1};
  if (fcntl(t->fd, F_OFD_GETLK, &fl) != 0) return true;
  return fl.l_type != F_UNLCK;
}

static int tq_map(umbp_pool *p, int fd, int prot, umbp_tier *t) {
  struct stat st;
  if (fstat(fd, &st)) return umbp_fail(-errno, "pool '%s': cannot stat its tier table: %s", p->name, strerror(errno));
  /* the next umbp tier replaces such a file (umbp_tier_serve): said, as the
   * fix. -ENODEV (what mmap says of it), not -EBADMSG: a table a starting
   * tier is still making is -EBADMSG for a moment, and callers wait that out */
  if (!S_ISREG(st.st_mode))
    return umbp_fail(-ENODEV, "pool '%s': /dev/shm/umbp.%s.tier is not a tier table (not a regular file): remove "
                              "it, or start 'umbp tier %s', which replaces it", p->name, p->name, p->name);
  if ((uint64_t)st.st_size < TQ_HDR_BYTES)
    return umbp_fail(-EBADMSG, "pool '%s': its tier table is %lld bytes, shorter than a header", p->name,
                     (long long)st.st_size);
  void *base = mmap(NULL, (size_t)st.st_size, prot, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) return umbp_fail(-errno, "pool '%s': cannot map its tier table: %s", p->name, strerror(errno));
  struct tq_hdr *h = base;
  const char *why = NULL;
  if (atomic_load_explicit(&h->magic, memory_order_acquire) != TQ_MAGIC) why = "it is not initialised";
  else if (h->major != TQ_MAJOR) why = "it has another layout version";
  else if (tq_sum(h) != h->checksum) why = "its header checksum does not match";
  else if (memcmp(h->uuid, p->hdr->uuid, 16)) why = "it belongs to an earlier pool of the same name";
  else if (h->key_size != sizeof(umbp_key) || h->hdr_bytes != TQ_HDR_BYTES || !h->records || h->records > 65535 ||
           !h->keys_per_record || h->keys_per_record > 65535 || h->record_bytes != tq_record_bytes(h->keys_per_record) ||
           h->total_bytes != tq_bytes(h->records, h->keys_per_record) || (uint64_t)st.st_size != h->total_bytes)
    why = "its geometry is inconsistent";
  if (why) {
    munmap(base, (size_t)st.st_size);
    return umbp_fail(-EBADMSG, "pool '%s': tier table /dev/shm/umbp.%s.tier refused: %s", p->name, p->name, why);
  }
  t->h = h;
  t->len = (size_t)st.st_size;
  t->records = h->records;
  t->kpr = h->keys_per_record;
  t->record_bytes = h->record_bytes;
  return 0;
}

static void tq_set_pool(umbp_tier *t, umbp_pool *p) {
  t->p = p;
  t->p_serial = p->attach_serial;
  t->owner_id = p->owner_id;
  snprintf(t->pool_name, sizeof t->pool_name, "%s", p->name);
}

/* A request is made for the pool handle the client was attached with, and
 * in its name (its registry slot): umbp_pool_detach() frees that handle, and
 * a fork() child must not act under its parent's slot. The table's own
 * mapping stays valid until umbp_tier_close(), so polls and cancels of
 * requests already made keep working. One uncontended mutex a call
 * (umbp_pool_attached()). */
static int tq_pool_check(const umbp_tier *t) {
  if (!umbp_pool_attached(t->p, t->p_serial))
    return umbp_fail(-EBADF, "umbp_tier_request: pool '%s': its pool handle was detached (umbp_pool_detach()) "
                             "before umbp_tier_close(): close the tier handle first, or attach again and call "
                             "umbp_tier_attach() on the new handle", t->pool_name);
  if (t->p->forked) return umbp_pool_forked_fail(t->p);
  return 0;
}

static void tq_free(umbp_tier *t) {
  if (t->h) munmap(t->h, t->len);
  if (t->fd >= 0) close(t->fd);
  free(t);
}

static void set_msg(struct tq_hdr *h, const char *msg) {
  uint32_t s = atomic_load_explicit(&h->msg_seq, memory_order_relaxed);
  atomic_store_explicit(&h->msg_seq, s + 1, memory_order_relaxed);
  atomic_thread_fence(memory_order_release);
  size_t n = msg ? strlen(msg) : 0;
  if (n > sizeof h->msg - 1) n = sizeof h->msg - 1;
  for (size_t i = 0; i < sizeof h->msg; i++) atomic_store_explicit(&h->msg[i], i < n ? msg[i] : 0, memory_order_relaxed);
  atomic_store_explicit(&h->msg_seq, s + 2, memory_order_release);
}

static void get_msg(const struct tq_hdr *h, char *out, size_t n) {
  for (int tries = 0; tries < 100; tries++) {
    uint32_t s0 = atomic_load_explicit(&h->msg_seq, memory_order_acquire);
    size_t i = 0;
    for (; i + 1 < n && i < sizeof h->msg; i++) out[i] = atomic_load_explicit(&h->msg[i], memory_order_relaxed);
    out[i] = 0;
    atomic_thread_fence(memory_order_acquire);
    if (!(s0 & 1) && atomic_load_explicit(&h->msg_seq, memory_order_relaxed) == s0) return;
  }
}

/* ---- clients ---- */

UMBP_API int umbp_tier_attach(umbp_pool *p, umbp_tier **ret) {
  if (!p || !ret) return umbp_fail(-EINVAL, "umbp_tier_attach: pool and ret_tier are required");
  if (p->forked) return umbp_pool_forked_fail(p);
  if (p->read_only) return umbp_fail(-EROFS, "requests to the tier need a read-write attachment");
  char name[UMBP_NAME_MAX + 16];
  tq_name(p->name, name, sizeof name);
  int fd = shm_open(name, O_RDWR | O_CLOEXEC, 0);
  if (fd < 0) {
    int e = errno;
    if (e == ENOENT)
      return umbp_fail(-ENOENT, "no umbp tier has served pool '%s' (no /dev/shm%s): start 'umbp tier %s'", p->name,
                       name, p->name);
    return umbp_fail(-e, "pool '%s': cannot open its tier table /dev/shm%s: %s", p->name, name, strerror(e));
  }
  umbp_tier *t = calloc(1, sizeof *t);
  if (!t) {
    close(fd);
    return umbp_fail(-ENOMEM, "umbp_tier_attach: out of memory");
  }
  tq_set_pool(t, p);
  t->fd = fd;
  int rc = tq_map(p, fd, PROT_READ | PROT_WRITE, t);
  if (rc) {
    tq_free(t);
    return rc;
  }
  atomic_store_explicit(&t->next, (uint32_t)getpid() % t->records, memory_order_relaxed);
  *ret = t;
  return 0;
}

UMBP_API unsigned umbp_tier_max_blocks(const umbp_tier *t, unsigned n_ranks) {
  if (!t || !n_ranks || n_ranks > t->kpr) return 0;
  return t->kpr / n_ranks;
}

static void ring_doorbell(struct tq_hdr *h) {
  atomic_fetch_add_explicit(&h->doorbell, 1, memory_order_release);
  syscall(SYS_futex, &h->doorbell, FUTEX_WAKE, 1, NULL, NULL, 0);
}

UMBP_API int umbp_tier_request(umbp_tier *t, const umbp_key *keys, unsigned n_blocks, unsigned n_ranks,
                               uint32_t timeout_ms, uint64_t *ret_ticket, unsigned *ret_n_blocks) {
  if (!t || !keys || !ret_ticket || !n_blocks || !n_ranks)
    return umbp_fail(-EINVAL, "umbp_tier_request: tier, keys, ret_ticket and non-zero counts are required");
  if (n_ranks > t->kpr || n_ranks > 65535)
    return umbp_fail(-EINVAL, "umbp_tier_request: %u ranks, the table holds %u keys a request", n_ranks, t->kpr);
  if (t->server) return umbp_fail(-EINVAL, "umbp_tier_request: a serving handle cannot request");
  int rc = tq_pool_check(t);
  if (rc) return rc;
  struct tq_hdr *h = t->h;
  if (!tq_alive(t))
    return umbp_fail(-ENOTCONN, "pool '%s': no umbp tier is running (last: pid %d): start 'umbp tier %s'", t->pool_name,
                     (int)atomic_load_explicit(&h->pid, memory_order_relaxed), t->pool_name);
  uint32_t state = atomic_load_explicit(&h->state, memory_order_relaxed);
  if (state != UMBP_TIER_CONNECTED) {
    char m[200];
    get_msg(h, m, sizeof m);
    return umbp_fail(-ENOTCONN, "pool '%s': its umbp tier is %s%s%s", t->pool_name, umbp_tier_state_name((int)state),
                     m[0] ? ": " : "", m);
  }
  unsigned nb = n_blocks;
  if (nb > t->kpr / n_ranks) nb = t->kpr / n_ranks;
  uint64_t now = umbp_now_ns();
  if (!timeout_ms) timeout_ms = atomic_load_explicit(&h->default_timeout_ms, memory_order_relaxed);
  uint32_t start = atomic_fetch_add_explicit(&t->next, 1, memory_order_relaxed);
  for (uint32_t k = 0; k < t->records; k++) {
    uint32_t i = (start + k) % t->records;
    struct tq_ctrl *c = tq_rec(t, i);
    uint64_t w = atomic_load_explicit(&c->word, memory_order_relaxed);
    if (W_STATE(w) != ST_FREE) continue;
    uint32_t gen = W_GEN(w);
    if (!atomic_compare_exchange_strong_explicit(&c->word, &w, W_MAKE(ST_FILLING, 0, gen), memory_order_acquire,
                                                 memory_order_relaxed))
      continue;
    atomic_store_explicit(&c->since_ns, now, memory_order_relaxed);
    memcpy(tq_keys(t, i), keys, (size_t)nb * n_ranks * sizeof(umbp_key));
    c->n_blocks = nb;
    c->n_ranks = (uint16_t)n_ranks;
    c->client = t->owner_id;
    c->submit_ns = now;
    c->deadline_ns = now + (uint64_t)timeout_ms * 1000000u;
    /* [R1] keys and counts before readiness; pairs with the tier's [A1]. A
     * CAS, not a store: a client stopped in FILLING for a minute has had its
     * record reclaimed (tq_sweep), and must not mark another's ready */
    uint64_t filling = W_MAKE(ST_FILLING, 0, gen);
    if (!atomic_compare_exchange_strong_explicit(&c->word, &filling, W_MAKE(ST_READY, 0, gen),
                                                 memory_order_release, memory_order_relaxed))
      return umbp_fail(-ETIMEDOUT, "pool '%s': this request's record was reclaimed while it was being "
                                   "filled (the process stopped for a minute?)", t->pool_name);
    ring_doorbell(h);
    *ret_ticket = (uint64_t)gen << 16 | i;
    if (ret_n_blocks) *ret_n_blocks = nb;
    return 0;
  }
  return umbp_fail(-EAGAIN, "pool '%s': all %u tier request records are in use", t->pool_name, t->records);
}

/* Cancel record i of generation gen if it is still in one of the states of
 * `mask` (bit per state): true if this call freed it. */
static bool tq_cancel(umbp_tier *t, uint32_t i, uint32_t gen, unsigned mask) {
  struct tq_ctrl *c = tq_rec(t, i);
  uint64_t w = atomic_load_explicit(&c->word, memory_order_relaxed);
  while (W_GEN(w) == gen && (mask & (1u << W_STATE(w)))) {
    if (atomic_compare_exchange_weak_explicit(&c->word, &w, W_MAKE(ST_FREE, 0, gen + 1), memory_order_relaxed,
                                              memory_order_relaxed)) {
      atomic_store_explicit(&c->since_ns, umbp_now_ns(), memory_order_relaxed);
      return true;
    }
  }
  return false;
}

UMBP_API int umbp_tier_poll(umbp_tier *t, uint64_t ticket, unsigned *ret_blocks) {
  if (!t || !ret_blocks) return umbp_fail(-EINVAL, "umbp_tier_poll: tier and ret_blocks are required");
  uint32_t i = (uint32_t)(ticket & 0xffff), gen = (uint32_t)(ticket >> 16);
  if (i >= t->records) return umbp_fail(-ESTALE, "tier ticket %llu names no record", (unsigned long long)ticket);
  struct tq_ctrl *c = tq_rec(t, i);
  uint64_t w = atomic_load_explicit(&c->word, memory_order_acquire); /* [A2] pairs with the tier's [R2] */
  if (W_GEN(w) != gen || W_STATE(w) == ST_FREE || W_STATE(w) == ST_FILLING)
    return umbp_fail(-ESTALE, "tier ticket %llu is spent (answered, cancelled or reclaimed)",
                     (unsigned long long)ticket);
  if (W_STATE(w) == ST_DONE) {
    int r = W_RESULT(w);
    if (!atomic_compare_exchange_strong_explicit(&c->word, &w, W_MAKE(ST_FREE, 0, gen + 1), memory_order_relaxed,
                                                 memory_order_relaxed))
      return umbp_fail(-ESTALE, "tier ticket %llu was answered to another poll", (unsigned long long)ticket);
    atomic_store_explicit(&c->since_ns, umbp_now_ns(), memory_order_relaxed);
    if (r < 0) {
      char m[200];
      get_msg(t->h, m, sizeof m);
      return umbp_fail(r, "pool '%s': the umbp tier could not fetch: %s%s%s", t->pool_name, strerror(-r),
                       m[0] ? " (tier: " : "", m[0] ? m : "");
    }
    *ret_blocks = (unsigned)r;
    return 0;
  }
  /* READY or WORKING */
  if (umbp_now_ns() > c->deadline_ns) {
    if (tq_cancel(t, i, gen, 1u << ST_READY | 1u << ST_WORKING))
      return umbp_fail(-ETIMEDOUT, "pool '%s': the umbp tier did not answer before the request's deadline",
                       t->pool_name);
    return umbp_tier_poll(t, ticket, ret_blocks); /* answered meanwhile */
  }
  if (!tq_alive(t) || atomic_load_explicit(&t->h->state, memory_order_relaxed) != UMBP_TIER_CONNECTED) {
    if (tq_cancel(t, i, gen, 1u << ST_READY | 1u << ST_WORKING))
      return umbp_fail(-ENOTCONN, "pool '%s': the umbp tier %s while the request waited", t->pool_name,
                       tq_alive(t) ? "lost its store" : "exited");
    return umbp_tier_poll(t, ticket, ret_blocks);
  }
  return -EINPROGRESS; /* an answer, not a failure: no message */
}

UMBP_API void umbp_tier_cancel(umbp_tier *t, uint64_t ticket) {
  if (!t) return;
  uint32_t i = (uint32_t)(ticket & 0xffff), gen = (uint32_t)(ticket >> 16);
  if (i < t->records) tq_cancel(t, i, gen, 1u << ST_READY | 1u << ST_WORKING | 1u << ST_DONE);
}

UMBP_API void umbp_tier_close(umbp_tier *t) {
  if (!t) return;
  if (t->server) {
    atomic_store_explicit(&t->h->state, UMBP_TIER_STOPPED, memory_order_relaxed);
    set_msg(t->h, "the tier exited");
    atomic_store_explicit(&t->h->state_ns, umbp_now_ns(), memory_order_relaxed);
  }
  tq_free(t); /* closing the fd drops the lock byte */
}

/* ---- the tier ---- */

UMBP_API void umbp_tier_params_init(umbp_tier_params *p) {
  if (p) memset(p, 0, sizeof *p);
}

UMBP_API uint64_t umbp_tier_table_bytes(const umbp_tier_params *params) {
  uint32_t records = params && params->records ? params->records : 64;
  uint32_t kpr = params && params->keys_per_record ? params->keys_per_record : 1024;
  if (records > 65535 || kpr > 65535) return 0; /* umbp_tier_serve()'s -EINVAL */
  return tq_bytes(records, kpr);
}

UMBP_API int umbp_tier_serve(umbp_pool *p, const umbp_tier_params *params, umbp_tier **ret) {
  if (!p || !ret) return umbp_fail(-EINVAL, "umbp_tier_serve: pool and ret_tier are required");
  if (p->forked) return umbp_pool_forked_fail(p);
  if (p->read_only) return umbp_fail(-EROFS, "serving the tier needs a read-write attachment");
  umbp_tier_params pp;
  umbp_tier_params_init(&pp);
  if (params) pp = *params;
  uint32_t records = pp.records ? pp.records : 64, kpr = pp.keys_per_record ? pp.keys_per_record : 1024;
  uint32_t tmo = pp.default_timeout_ms ? pp.default_timeout_ms : 2000;
  if (records > 65535 || kpr > 65535)
    return umbp_fail(-EINVAL, "umbp_tier_serve: at most 65535 records of 65535 keys (asked %u of %u)", records, kpr);
  char name[UMBP_NAME_MAX + 16];
  tq_name(p->name, name, sizeof name);
  umbp_tier *t = calloc(1, sizeof *t);
  if (!t) return umbp_fail(-ENOMEM, "umbp_tier_serve: out of memory");
  tq_set_pool(t, p);
  t->server = true;
  t->fd = shm_open(name, O_RDWR | O_CLOEXEC, 0);
  if (t->fd >= 0) {
    if (tq_lock(t->fd, F_WRLCK)) {
      umbp_tier c = {.fd = t->fd};
      int pid = 0;
      if (!tq_map(p, t->fd, PROT_READ, &c)) {
        pid = atomic_load_explicit(&c.h->pid, memory_order_relaxed);
        munmap(c.h, c.len);
      }
      tq_free(t);
      return umbp_fail(-EBUSY, "pool '%s' is already served by a umbp tier (pid %d)", p->name, pid);
    }
    /* adopt it when it is this pool's and of the asked geometry */
    if (tq_map(p, t->fd, PROT_READ | PROT_WRITE, t) || t->records != records || t->kpr != kpr) {
      if (t->h) munmap(t->h, t->len);
      t->h = NULL;
      close(t->fd); /* drops our lock; clients of the old file see no tier and re-attach */
      t->fd = -1;
    }
  }
  if (t->fd < 0) {
    struct stat pst;
    mode_t mode = 0600;
    if (!fstat(p->fd, &pst)) mode = pst.st_mode & 0666;
    shm_unlink(name);
    t->fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, mode);
    int rc = t->fd < 0 ? -errno : 0;
    if (!rc && tq_lock(t->fd, F_WRLCK)) rc = -EBUSY; /* another tier made it just now */
    if (!rc) {
      (void)!fchmod(t->fd, mode);
      if (pst.st_gid) (void)!fchown(t->fd, (uid_t)-1, pst.st_gid);
    }
    size_t len = tq_bytes(records, kpr);
    if (!rc && ftruncate(t->fd, (off_t)len)) rc = -errno;
    if (!rc) {
      int e = posix_fallocate(t->fd, 0, (off_t)len);
      if (e) rc = -e;
    }
    void *base = rc ? MAP_FAILED : mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, t->fd, 0);
    if (!rc && base == MAP_FAILED) rc = -errno;
    if (rc) {
      /* A file this call made and could not size (/dev/shm full) is removed:
       * left there it kept its name with the apparent size asked (200 GB at
       * the largest geometry), and no tier ever used it. One that another
       * tier locked first (-EBUSY) is that tier's. */
      if (t->fd >= 0 && rc != -EBUSY) shm_unlink(name);
      tq_free(t);
      if (rc == -EBUSY) return umbp_fail(rc, "pool '%s' is already served by a umbp tier", p->name);
      return umbp_fail(rc, "pool '%s': cannot create its tier table /dev/shm%s (%zu bytes): %s", p->name, name, len,
                       strerror(-rc));
    }
    struct tq_hdr *h = base;
    h->major = TQ_MAJOR;
    h->hdr_bytes = TQ_HDR_BYTES;
    h->records = records;
    h->keys_per_record = kpr;
    h->key_size = sizeof(umbp_key);
    h->record_bytes = (uint32_t)tq_record_bytes(kpr);
    memcpy(h->uuid, p->hdr->uuid, 16);
    h->total_bytes = len;
    h->checksum = tq_sum(h);
    atomic_store_explicit(&h->magic, TQ_MAGIC, memory_order_release);
    munmap(base, len);
    rc = tq_map(p, t->fd, PROT_READ | PROT_WRITE, t);
    if (rc) {
      tq_free(t);
      return rc;
    }
  } else {
    /* requests the previous tier had taken: ready again if still wanted */
    uint64_t now = umbp_now_ns();
    for (uint32_t i = 0; i < t->records; i++) {
      struct tq_ctrl *c = tq_rec(t, i);
      uint64_t w = atomic_load_explicit(&c->word, memory_order_relaxed);
      if (W_STATE(w) == ST_WORKING && now < c->deadline_ns)
        atomic_compare_exchange_strong_explicit(&c->word, &w, W_MAKE(ST_READY, 0, W_GEN(w)), memory_order_relaxed,
                                                memory_order_relaxed);
      else if (W_STATE(w) == ST_WORKING)
        tq_cancel(t, i, W_GEN(w), 1u << ST_WORKING);
    }
  }
  struct tq_hdr *h = t->h;
  /* 'held' counts slots the serving process holds now, not events: those of
   * the tier before went with its process (the reaper frees them), so an
   * adopted table's count would name slots nobody holds */
  atomic_store_explicit(&h->stats[UMBP_TIER_ST_HELD], 0, memory_order_relaxed);
  atomic_store_explicit(&h->pid, (int32_t)getpid(), memory_order_relaxed);
  atomic_store_explicit(&h->default_timeout_ms, tmo, memory_order_relaxed);
  atomic_store_explicit(&h->state, UMBP_TIER_CONNECTING, memory_order_relaxed);
  atomic_store_explicit(&h->state_ns, umbp_now_ns(), memory_order_relaxed);
  atomic_store_explicit(&h->heartbeat_ns, umbp_now_ns(), memory_order_relaxed);
  set_msg(h, "starting");
  *ret = t;
  return 0;
}

/* Free records abandoned for a minute (a client killed or stopped in
 * FILLING, or one that never polled its answer), and answer READY requests
 * past their deadline. */
static void tq_sweep(umbp_tier *t, uint64_t now) {
  for (uint32_t i = 0; i < t->records; i++) {
    struct tq_ctrl *c = tq_rec(t, i);
    uint64_t w = atomic_load_explicit(&c->word, memory_order_relaxed);
    unsigned s = W_STATE(w);
    if (s == ST_FREE) continue;
    uint64_t since = atomic_load_explicit(&c->since_ns, memory_order_relaxed);
    if (now - since > TQ_ABANDON_NS && (s == ST_FILLING || s == ST_DONE || now > c->deadline_ns + TQ_ABANDON_NS))
      tq_cancel(t, i, W_GEN(w), 1u << s);
  }
}

UMBP_API int umbp_tier_take(umbp_tier *t, umbp_tier_job *job, umbp_key *keys, unsigned max_keys) {
  if (!t || !job || !keys) return umbp_fail(-EINVAL, "umbp_tier_take: tier, job and keys are required");
  if (!t->server) return umbp_fail(-EPERM, "umbp_tier_take: not a serving handle");
  if (max_keys < t->kpr) return umbp_fail(-EINVAL, "umbp_tier_take: room for %u keys, records hold %u", max_keys, t->kpr);
  uint64_t now = umbp_now_ns();
  if (now - t->last_sweep_ns > 1000000000ull) {
    t->last_sweep_ns = now;
    tq_sweep(t, now);
  }
  atomic_store_explicit(&t->h->heartbeat_ns, now, memory_order_relaxed);
  for (;;) {
    int best = -1;
    uint64_t best_submit = UINT64_MAX;
    for (uint32_t i = 0; i < t->records; i++) {
      struct tq_ctrl *c = tq_rec(t, i);
      uint64_t w = atomic_load_explicit(&c->word, memory_order_acquire);
      if (W_STATE(w) != ST_READY) continue;
      if (c->submit_ns < best_submit) {
        best_submit = c->submit_ns;
        best = (int)i;
      }
    }
    if (best < 0) return 0;
    struct tq_ctrl *c = tq_rec(t, (uint32_t)best);
    uint64_t w = atomic_load_explicit(&c->word, memory_order_relaxed);
    if (W_STATE(w) != ST_READY) continue;
    uint32_t gen = W_GEN(w);
    /* [A1] pairs with the client's [R1] */
    if (!atomic_compare_exchange_strong_explicit(&c->word, &w, W_MAKE(ST_WORKING, 0, gen), memory_order_acquire,
                                                 memory_order_relaxed))
      continue;
    atomic_store_explicit(&c->since_ns, now, memory_order_relaxed);
    unsigned nb = c->n_blocks, nr = c->n_ranks;
    uint64_t deadline = c->deadline_ns, submit = c->submit_ns;
    uint16_t client = c->client;
    if (!nr || !nb || (uint64_t)nb * nr > t->kpr) { /* a client wrote nonsense */
      umbp_tier_complete(t, (uint64_t)gen << 16 | (uint32_t)best, -EINVAL, NULL);
      continue;
    }
    memcpy(keys, tq_keys(t, (uint32_t)best), (size_t)nb * nr * sizeof(umbp_key));
    atomic_thread_fence(memory_order_acquire); /* [F1] the copy before the re-check */
    if (atomic_load_explicit(&c->word, memory_order_relaxed) != W_MAKE(ST_WORKING, 0, gen)) continue; /* cancelled */
    uint64_t ticket = (uint64_t)gen << 16 | (uint32_t)best;
    if (now > deadline) {
      umbp_tier_stat_add(t, UMBP_TIER_ST_EXPIRED, 1);
      umbp_tier_complete(t, ticket, -ETIMEDOUT, NULL);
      continue;
    }
    job->ticket = ticket;
    job->n_blocks = nb;
    job->n_ranks = nr;
    job->client = client;
    job->deadline_ns = deadline;
    job->age_ns = now > submit ? now - submit : 0;
    return 1;
  }
}

UMBP_API int umbp_tier_complete(umbp_tier *t, uint64_t ticket, int result, const char *msg) {
  if (!t) return umbp_fail(-EINVAL, "umbp_tier_complete: tier is required");
  if (!t->server) return umbp_fail(-EPERM, "umbp_tier_complete: not a serving handle");
  uint32_t i = (uint32_t)(ticket & 0xffff), gen = (uint32_t)(ticket >> 16);
  if (i >= t->records) return umbp_fail(-EINVAL, "umbp_tier_complete: ticket %llu names no record", (unsigned long long)ticket);
  if (result > 0x7fffff) result = 0x7fffff;
  if (result < -0x800000) result = -EIO;
  if (result < 0 && msg) set_msg(t->h, msg);
  struct tq_ctrl *c = tq_rec(t, i);
  uint64_t w = W_MAKE(ST_WORKING, 0, gen);
  /* [R2] what we published before this; pairs with the client's [A2] */
  if (!atomic_compare_exchange_strong_explicit(&c->word, &w, W_MAKE(ST_DONE, result, gen), memory_order_release,
                                               memory_order_relaxed))
    return umbp_fail(-ESTALE, "tier ticket %llu was cancelled by its client", (unsigned long long)ticket);
  atomic_store_explicit(&c->since_ns, umbp_now_ns(), memory_order_relaxed);
  return 0;
}

UMBP_API int umbp_tier_wait(umbp_tier *t, uint32_t timeout_ms) {
  if (!t) return umbp_fail(-EINVAL, "umbp_tier_wait: tier is required");
  if (!t->server) return umbp_fail(-EPERM, "umbp_tier_wait: not a serving handle");
  uint32_t bell = atomic_load_explicit(&t->h->doorbell, memory_order_acquire);
  for (uint32_t i = 0; i < t->records; i++)
    if (W_STATE(atomic_load_explicit(&tq_rec(t, i)->word, memory_order_relaxed)) == ST_READY) return 0;
  struct timespec ts = {timeout_ms / 1000, (long)(timeout_ms % 1000) * 1000000L};
  syscall(SYS_futex, &t->h->doorbell, FUTEX_WAIT, bell, &ts, NULL, 0);
  atomic_store_explicit(&t->h->heartbeat_ns, umbp_now_ns(), memory_order_relaxed);
  return 0;
}

UMBP_API int umbp_tier_set_state(umbp_tier *t, int state, const char *msg) {
  if (!t) return umbp_fail(-EINVAL, "umbp_tier_set_state: tier is required");
  if (!t->server) return umbp_fail(-EPERM, "umbp_tier_set_state: not a serving handle");
  if (state < UMBP_TIER_STOPPED || state > UMBP_TIER_DISCONNECTED)
    return umbp_fail(-EINVAL, "umbp_tier_set_state: %d is not a umbp_tier_state", state);
  uint64_t now = umbp_now_ns();
  if (atomic_exchange_explicit(&t->h->state, (uint32_t)state, memory_order_relaxed) != (uint32_t)state)
    atomic_store_explicit(&t->h->state_ns, now, memory_order_relaxed);
  if (msg) set_msg(t->h, msg);
  atomic_store_explicit(&t->h->heartbeat_ns, now, memory_order_relaxed);
  return 0;
}

UMBP_API void umbp_tier_stat_add(umbp_tier *t, unsigned stat, uint64_t delta) {
  if (t && stat < UMBP_TIER_ST_COUNT) atomic_fetch_add_explicit(&t->h->stats[stat], delta, memory_order_relaxed);
}

UMBP_API const char *umbp_tier_state_name(int state) {
  switch (state) {
  case UMBP_TIER_STOPPED: return "stopped";
  case UMBP_TIER_CONNECTING: return "connecting";
  case UMBP_TIER_CONNECTED: return "connected";
  case UMBP_TIER_DISCONNECTED: return "disconnected";
  default: return "unknown";
  }
}

UMBP_API int umbp_tier_info_get(umbp_pool *p, umbp_tier_info *ret) {
  if (!p || !ret) return umbp_fail(-EINVAL, "umbp_tier_info_get: pool and ret are required");
  char name[UMBP_NAME_MAX + 16];
  tq_name(p->name, name, sizeof name);
  /* O_NONBLOCK: a FIFO of that name (anyone may make one in /dev/shm) held a
   * read-only open, and umbp tier --status, until a writer came, without
   * bound; tq_map() then refuses what is not a table */
  int fd = shm_open(name, O_RDONLY | O_NONBLOCK | O_CLOEXEC, 0);
  if (fd < 0) {
    int e = errno;
    return umbp_fail(-e, e == ENOENT ? "no umbp tier has served pool '%s'%s" : "pool '%s': cannot open its tier table: %s",
                     p->name, e == ENOENT ? "" : strerror(e));
  }
  umbp_tier t = {.p = p, .fd = fd};
  int rc = tq_map(p, fd, PROT_READ, &t);
  if (rc) {
    close(fd);
    return rc;
  }
  umbp_tier_info i;
  memset(&i, 0, sizeof i);
  struct tq_hdr *h = t.h;
  uint64_t now = umbp_now_ns();
  i.alive = tq_alive(&t);
  i.pid = atomic_load_explicit(&h->pid, memory_order_relaxed);
  i.state = i.alive ? (int)atomic_load_explicit(&h->state, memory_order_relaxed) : UMBP_TIER_STOPPED;
  get_msg(h, i.message, sizeof i.message);
  uint64_t sn = atomic_load_explicit(&h->state_ns, memory_order_relaxed);
  uint64_t hb = atomic_load_explicit(&h->heartbeat_ns, memory_order_relaxed);
  i.state_age_ns = now > sn ? now - sn : 0;
  i.heartbeat_age_ns = now > hb ? now - hb : 0;
  i.records = t.records;
  i.keys_per_record = t.kpr;
  i.default_timeout_ms = atomic_load_explicit(&h->default_timeout_ms, memory_order_relaxed);
  for (uint32_t r = 0; r < t.records; r++) {
    unsigned s = W_STATE(atomic_load_explicit(&tq_rec(&t, r)->word, memory_order_relaxed));
    if (s == ST_FREE) i.free_++;
    else if (s == ST_READY || s == ST_FILLING) i.ready++;
    else if (s == ST_WORKING) i.working++;
    else i.done++;
  }
  for (unsigned s = 0; s < UMBP_TIER_ST_COUNT; s++) i.stats[s] = atomic_load_explicit(&h->stats[s], memory_order_relaxed);
  /* 'held' is a gauge of what the serving process holds: the last count of a
   * tier that exited names slots that went with it (the pool's reaper frees
   * them), not slots held now */
  if (!i.alive) i.stats[UMBP_TIER_ST_HELD] = 0;
  munmap(t.h, t.len);
  close(fd);
  *ret = i;
  return 0;
}
