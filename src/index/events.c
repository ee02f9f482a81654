/* SPDX-License-Identifier: Apache-2.0 */
/*
 * events.c — the event ring: a removed event for each eviction or removal,
 * and a stored event for each publish once umbp_events_enable_stored() asks
 * for them; and the published-key feed (feed.h): the same events as a
 * broadcast log that any number of consumers read at their own cursors.
 *
 * Design note, event ring. Removals and evictions (evict.c) and publishes
 * (reserve.c) put their events into one ring in the segment, the key in the
 * segment's layout; a full ring drops its oldest event and counts the drop
 * (umbp_events_dropped()). Removed events are recorded once any process has
 * drained the ring (the index header's events_on, set by the first
 * umbp_events_drain()): in a pool that no one drains, the ring would only be
 * overwritten, and recording costs every removal three locked instructions
 * on the ring's shared lines and about 150 instructions (docs/bench-index.md,
 * "fifth session"). A remover emits while its slot is still EVICTING, so
 * that the reaper of a remover killed before its RETIRED store emits it
 * instead (evict.c, reap.c) and no recorded removal goes unannounced.
 * Draining converts each key back to the caller's layout. Each event goes to
 * one drainer: the vLLM connector drains removals.
 *
 * Design note, feed. The tier (`umbp tier`) must see every publish without
 * taking events from the connector, and must not be able to slow anyone
 * down. So the feed is a second, broadcast channel: a log of 64-byte
 * entries in its own file beside the pool (/dev/shm/umbp.NAME.feed), in the
 * manner of a seqlock-per-entry ring (the LMAX disruptor's sequence per
 * cell, Linux's seqcount for torn-read detection).
 *
 *   - Producers (every publish and removal, in any process) take a position
 *     with one fetch-add on `head`, claim the entry's cell by CAS of its
 *     sequence word to 2*pos + 1 (odd: being written), write the payload and
 *     complete with a CAS to 2*pos + 2. They never wait: a cell that already
 *     holds a later lap makes the producer give its entry up (`overtaken`),
 *     and a cell left odd by a producer that stopped or died is simply
 *     claimed by the next lap's producer.
 *   - Consumers keep their cursor privately and read without writing the
 *     cells: an entry is delivered when its sequence word reads 2*pos + 2
 *     before and after copying the payload and the payload's check (a hash
 *     of pos and payload) matches. A word of a later lap means the consumer
 *     fell more than the capacity behind: it skips to head - capacity and
 *     counts the loss. An older or odd word means "not written yet": the
 *     read ends there, and after 100 ms of that (a producer stopped or
 *     killed between claim and completion) the entry is skipped and counted.
 *     So a consumer never blocks a producer or another consumer, and a
 *     producer blocks a consumer's progress for at most 100 ms.
 *   - The check catches the one race the sequence word cannot: a producer
 *     that stalled after its claim for a whole lap and then wrote its
 *     payload over a later lap's completed entry (its own completion CAS then
 *     fails). The mixed entry fails the check and counts as lost.
 *   - Each named consumer has a line in the feed header (committed cursor,
 *     counts, pid), written only by the process holding the name. A name is
 *     held by an OFD lock on a byte of the feed file, which the kernel drops
 *     when the holder dies; nobody ever waits on a consumer's line.
 *   - Discovery. The pool header's feed_gen (layout.h) is 0 until the first
 *     consumer has created the feed file under lock byte UMBP_LOCK_FEED of
 *     the pool file and then stored the file's generation (release).
 *     Producers load it on each emit (acquire) and map the file the first
 *     time they see a generation; a file whose uuid or generation does not
 *     match is refused (a stale file of an earlier pool of the same name is
 *     replaced by the next consumer open, which bumps the generation).
 *
 * Memory ordering of the feed:
 *   [R-gen] the creator's release store of feed_gen, after the file's magic
 *           [R-mag] (release) and every initialising store; pairs with
 *           [A-gen], a producer's acquire load before it maps the file.
 *   [F1]    producer: release fence after the claim CAS (2*pos + 1), before
 *           the payload stores; pairs with [F2], the consumer's acquire fence
 *           after copying the payload and before re-reading the sequence
 *           word: a consumer that copied any byte of a later writer sees at
 *           least that writer's claim on the re-read, and discards the copy.
 *   [R1]    producer: release CAS 2*pos + 1 -> 2*pos + 2 after the payload;
 *           pairs with [A1], the consumer's acquire load of the sequence
 *           word before it copies. Since the publish's own release (reserve.c)
 *           precedes the emit in program order, a consumer that reads the
 *           entry also sees the block as published.
 *   head, overtaken and the consumer lines are relaxed: statistics and hints;
 *   the sequence words decide what is delivered.
 */
#include "index/index_inline.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "umbp/feed.h"

/* Put an event of type `type` for key k into the event ring (overwriting the
 * oldest when full). */
static void feed_emit(struct umbp_index *ix, int type, const struct umbp_key_shm *k);

void umbp_ix_emit(struct umbp_index *ix, int type, const struct umbp_key_shm *k) {
  if (type == UMBP_EV_STORED ? atomic_load_explicit(&ix->ev_ring_stored, memory_order_relaxed)
                             : atomic_load_explicit(&ix->ih->events_on, memory_order_relaxed)) {
    struct umbp_event_shm ev;
    memset(&ev, 0, sizeof ev);
    ev.type = (uint8_t)type;
    ev.key = *k;
    /* never waits for a drainer: one stopped in its claim costs the first
     * emit a bounded spin and later ones nothing (ev_stuck) */
    umbp_ring_enqueue_overwrite_hint_g(ix->events, &ix->ev_geo, &ev, ix->p->owner_id, &ix->ev_stuck);
  }
  feed_emit(ix, type, k);
}

/* A key in the segment's layout, back in the caller's (umbp_key); also for
 * inspect.c's event peek. */
void umbp_ix_key_from_shm(const struct umbp_key_shm *s, umbp_key *k) {
  memset(k, 0, sizeof *k);
  k->ns = s->ns;
  k->tp_rank = s->tp;
  k->pcp_rank = s->pcp;
  k->dcp_rank = s->dcp;
  k->pp_rank = s->pp;
  k->group = s->group;
  k->hash_len = s->hash_len > UMBP_KEY_HASH_MAX ? UMBP_KEY_HASH_MAX : s->hash_len;
  memcpy(k->hash, s->hash, k->hash_len);
}

UMBP_API int umbp_events_drain(umbp_pool *p, umbp_event *out, unsigned max) {
  if (!p || (!out && max)) return umbp_fail(-EINVAL, "umbp_events_drain: pool, and out for max = %u, are required", max);
  if (p->forked) return umbp_pool_forked_fail(p);
  if (p->read_only || !p->index) return umbp_fail(-EROFS, "draining events needs a read-write attachment");
  /* from now on removals record their events (index_shm.h, events_on) */
  if (!atomic_load_explicit(&p->index->ih->events_on, memory_order_relaxed))
    atomic_store_explicit(&p->index->ih->events_on, 1, memory_order_seq_cst);
  unsigned n = 0;
  while (n < max) {
    struct umbp_event_shm ev[16];
    unsigned want = max - n < 16 ? max - n : 16;
    unsigned got = umbp_ring_dequeue_burst_g(p->index->events, &p->index->ev_geo, ev, want, p->owner_id);
    for (unsigned i = 0; i < got; i++) {
      out[n + i].type = ev[i].type;
      umbp_ix_key_from_shm(&ev[i].key, &out[n + i].key);
    }
    n += got;
    if (got < want) break;
  }
  return (int)n;
}

UMBP_API uint64_t umbp_events_dropped(umbp_pool *p) {
  if (!p) return 0;
  return umbp_ring_dropped(umbp_pool_region(p, UMBP_REG_EVENTS));
}

UMBP_API void umbp_events_enable_stored(umbp_pool *p, bool on) {
  /* ev_stored itself stays set (umbp_ix_feed_init): it is what makes a
   * publish call umbp_ix_emit() at all, for the feed */
  if (p && p->index && !p->forked && !p->read_only) atomic_store(&p->index->ev_ring_stored, on);
}

/* ---- the published-key feed (feed.h) ------------------------------------------ */

#define FEED_MAGIC UINT64_C(0x44454546504d4255) /* "UMBPFEED" little-endian */
#define FEED_MAJOR 1
#define FEED_MINOR 0
#define FEED_HDR_BYTES 4096u
#define FEED_DEFAULT_CAPACITY 65536u
#define FEED_MIN_CAPACITY 64u
#define FEED_MAX_CAPACITY (1u << 24)
#define FEED_STALL_NS (100ull * 1000 * 1000)  /* an unfinished entry is skipped after this */
#define FEED_LOCK_WAIT_NS (5ull * 1000 * 1000 * 1000)

/* One named consumer's line, written only by the process holding the name
 * (lock byte = its index in the feed file). */
struct feed_consumer_shm {
  _Atomic uint32_t state; /* 0 never used, 1 named */
  _Atomic int32_t pid;
  char name[UMBP_FEED_NAME_MAX + 1];
  _Atomic uint64_t committed;
  _Atomic uint64_t read;
  _Atomic uint64_t lost;
  _Atomic uint64_t delivered;
  _Atomic uint64_t active_ns;
  uint8_t pad[128 - 80];
};
_Static_assert(sizeof(struct feed_consumer_shm) == 128, "feed consumer line frozen");

struct feed_hdr {
  /* line 0: written once by the creator before the magic, read-only after */
  _Atomic uint64_t magic;
  uint16_t major, minor;
  uint32_t hdr_bytes;
  uint32_t capacity; /* power of two */
  uint32_t gen;      /* the pool header's feed_gen this file was made for */
  uint8_t uuid[16];  /* the pool's */
  uint64_t total_bytes;
  uint64_t checksum; /* FNV-1a of bytes [8, 48) */
  uint8_t pad0[8];
  _Alignas(64) _Atomic uint64_t head;      /* line 1: producers' positions */
  _Alignas(64) _Atomic uint64_t overtaken; /* line 2 */
  _Alignas(64) struct feed_consumer_shm consumers[UMBP_FEED_MAX_CONSUMERS];
};
_Static_assert(offsetof(struct feed_hdr, checksum) == 48, "feed header line 0 frozen");
_Static_assert(offsetof(struct feed_hdr, head) == 64, "feed head on its own line");
_Static_assert(sizeof(struct feed_hdr) <= FEED_HDR_BYTES, "feed header fits its page");

/* seq: 2*pos + 1 while the producer of pos writes, 2*pos + 2 once complete.
 * w[0] = type | owner << 8 | check << 32; w[1..6] = the key (umbp_key_shm). */
struct feed_cell {
  _Atomic uint64_t seq;
  _Atomic uint64_t w[7];
};
_Static_assert(sizeof(struct feed_cell) == 64, "feed entry is one line");
_Static_assert(sizeof(struct umbp_key_shm) == 48, "a key is six words of an entry");

/* A process's mapping of one feed file. */
struct umbp_feed_map {
  struct feed_hdr *h;
  struct feed_cell *cells;
  size_t len;
  uint32_t mask, gen;
  struct umbp_feed_map *next; /* feed_old list */
};

struct umbp_feed {
  umbp_pool *p;
  uint64_t p_serial;      /* p's attach_serial: p may be detached (freed) before the close */
  int fd;                 /* holds the name's lock byte */
  struct umbp_feed_map m;
  unsigned row;
  char name[UMBP_FEED_NAME_MAX + 1]; /* the consumer's, for messages */
  uint64_t cursor, lost;
  uint64_t stall_pos, stall_since; /* the unfinished entry the last read ended at */
  bool stalled;
  struct umbp_feed *live_next; /* this process's open feeds (feed_live_*) */
};

static uint64_t feed_hdr_sum(const struct feed_hdr *h) {
  return umbp_fnv1a((const char *)h + 8, offsetof(struct feed_hdr, checksum) - 8, 0);
}

/* A 32-bit check of an entry: position, type and owner (not the check
 * itself) and the key words, multiply-xorshift word by word. Not a defence
 * against a co-tenant (who could write any entry anyway), only against a torn
 * or misplaced one; byte-wise FNV-1a over the 64 bytes cost ~60 ns an entry. */
static uint32_t feed_check(uint64_t pos, const uint64_t w[7]) {
  uint64_t h = (pos + 0x9e3779b97f4a7c15ull) * 0xbf58476d1ce4e5b9ull;
  h = (h ^ (w[0] & 0xffffffffu)) * 0x94d049bb133111ebull;
  for (int i = 1; i < 7; i++) {
    h ^= h >> 31;
    h = (h ^ w[i]) * 0x94d049bb133111ebull;
  }
  h ^= h >> 29;
  return (uint32_t)(h ^ (h >> 32));
}

static void feed_shm_name(const char *pool, char *buf, size_t n) { snprintf(buf, n, "/umbp.%s.feed", pool); }

static size_t feed_bytes(uint32_t cap) { return FEED_HDR_BYTES + (size_t)cap * sizeof(struct feed_cell); }

/* Map fd's feed and check it belongs to pool p at generation gen (0: any).
 * 0 and *m, or -EBADMSG with a message. */
static int feed_map_fd(umbp_pool *p, int fd, int prot, uint32_t gen, struct umbp_feed_map *m) {
  struct stat st;
  if (fstat(fd, &st)) return umbp_fail(-errno, "pool '%s': cannot stat its feed: %s", p->name, strerror(errno));
  if ((uint64_t)st.st_size < FEED_HDR_BYTES)
    return umbp_fail(-EBADMSG, "pool '%s': its feed file is %lld bytes, shorter than a header", p->name,
                     (long long)st.st_size);
  void *base = mmap(NULL, (size_t)st.st_size, prot, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) return umbp_fail(-errno, "pool '%s': cannot map its feed: %s", p->name, strerror(errno));
  struct feed_hdr *h = base;
  /* [A-mag] pairs with the creator's [R-mag] */
  uint64_t magic = atomic_load_explicit(&h->magic, memory_order_acquire);
  const char *why = NULL;
  if (magic != FEED_MAGIC) why = "it is not initialised (its creator died?)";
  else if (h->major != FEED_MAJOR) why = "it has another layout version";
  else if (feed_hdr_sum(h) != h->checksum) why = "its header checksum does not match";
  else if (memcmp(h->uuid, p->hdr->uuid, 16)) why = "it belongs to an earlier pool of the same name";
  else if (gen && h->gen != gen) why = "it is of another generation";
  else if (h->hdr_bytes != FEED_HDR_BYTES || h->capacity < FEED_MIN_CAPACITY || h->capacity > FEED_MAX_CAPACITY ||
           (h->capacity & (h->capacity - 1)) || h->total_bytes != feed_bytes(h->capacity) ||
           (uint64_t)st.st_size != h->total_bytes)
    why = "its geometry is inconsistent";
  if (why) {
    munmap(base, (size_t)st.st_size);
    return umbp_fail(-EBADMSG, "pool '%s': feed file refused: %s", p->name, why);
  }
  m->h = h;
  m->cells = (struct feed_cell *)((char *)base + FEED_HDR_BYTES);
  m->len = (size_t)st.st_size;
  m->mask = h->capacity - 1; /* private copy: a co-tenant rewriting the header later changes nothing */
  m->gen = h->gen;
  m->next = NULL;
  return 0;
}

/* ---- producers ---- */

void umbp_ix_feed_init(struct umbp_index *ix) {
  pthread_mutex_init(&ix->feed_mu, NULL);
  pthread_mutex_init(&ix->feed_open_mu, NULL);
  atomic_store_explicit(&ix->feed, NULL, memory_order_relaxed);
  atomic_store_explicit(&ix->feed_tried, 0, memory_order_relaxed);
  ix->feed_old = NULL;
  atomic_store_explicit(&ix->ev_stuck, 0, memory_order_relaxed);
  /* publishes call umbp_ix_emit() (reserve.c checks ev_stored), which sends
   * stored events to the ring only when asked (ev_ring_stored) */
  atomic_store_explicit(&ix->ev_stored, ix->p->proc_slot >= 0, memory_order_relaxed);
}

void umbp_ix_feed_fini(struct umbp_index *ix) {
  struct umbp_feed_map *m = atomic_exchange_explicit(&ix->feed, NULL, memory_order_relaxed);
  if (m) {
    m->next = ix->feed_old;
    ix->feed_old = m;
  }
  while (ix->feed_old) {
    struct umbp_feed_map *n = ix->feed_old->next;
    munmap(ix->feed_old->h, ix->feed_old->len);
    free(ix->feed_old);
    ix->feed_old = n;
  }
  pthread_mutex_destroy(&ix->feed_mu);
  pthread_mutex_destroy(&ix->feed_open_mu);
}

/* The slow path of an emit that saw generation gen for the first time: map
 * the file, once per generation per process. NULL when it cannot be used
 * (the emit then goes to the event ring only; an emit has no caller to
 * tell, so the thread's umbp_last_error() is left as it was and the log
 * callback gets a warning). */
static __attribute__((cold, noinline)) struct umbp_feed_map *feed_producer_map(struct umbp_index *ix, uint32_t gen) {
  pthread_mutex_lock(&ix->feed_mu);
  struct umbp_feed_map *cur = atomic_load_explicit(&ix->feed, memory_order_relaxed);
  if (atomic_load_explicit(&ix->feed_tried, memory_order_relaxed) == gen) {
    pthread_mutex_unlock(&ix->feed_mu);
    return cur && cur->gen == gen ? cur : NULL;
  }
  atomic_store_explicit(&ix->feed_tried, gen, memory_order_relaxed);
  char name[UMBP_NAME_MAX + 16];
  feed_shm_name(ix->p->name, name, sizeof name);
  struct umbp_feed_map *m = NULL;
  int fd = shm_open(name, O_RDWR | O_CLOEXEC, 0);
  if (fd >= 0) {
    struct umbp_feed_map tmp;
    char keep[256]; /* an emit sets no error: keep the caller's message */
    snprintf(keep, sizeof keep, "%s", umbp_last_error());
    if (!feed_map_fd(ix->p, fd, PROT_READ | PROT_WRITE, gen, &tmp)) {
      if ((m = malloc(sizeof *m))) *m = tmp;
      else munmap(tmp.h, tmp.len);
    }
    umbp_fail(0, "%s", keep);
    close(fd);
  }
  if (m) {
    if (cur) {
      cur->next = ix->feed_old;
      ix->feed_old = cur;
    }
    atomic_store_explicit(&ix->feed, m, memory_order_release);
  }
  pthread_mutex_unlock(&ix->feed_mu);
  if (!m) umbp_log(UMBP_LOG_WARN, "pool '%s': published-key feed generation %u could not be mapped; "
                                  "this process's publishes will not reach it", ix->p->name, gen);
  return m;
}

static void feed_append(struct umbp_feed_map *m, uint16_t owner, int type, const struct umbp_key_shm *k) {
  struct feed_hdr *h = m->h;
  uint64_t pos = atomic_fetch_add_explicit(&h->head, 1, memory_order_relaxed);
  struct feed_cell *c = &m->cells[pos & m->mask];
  const uint64_t want = 2 * pos + 1;
  uint64_t cur = atomic_load_explicit(&c->seq, memory_order_relaxed);
  do {
    if ((int64_t)(cur - want) >= 0) { /* a later lap owns the cell already */
      atomic_fetch_add_explicit(&h->overtaken, 1, memory_order_relaxed);
      return;
    }
  } while (!atomic_compare_exchange_weak_explicit(&c->seq, &cur, want, memory_order_relaxed, memory_order_relaxed));
  atomic_thread_fence(memory_order_release); /* [F1] the claim before the payload */
  uint64_t w[7];
  memcpy(&w[1], k, sizeof *k);
  w[0] = (uint64_t)(uint8_t)type | (uint64_t)owner << 8;
  w[0] |= (uint64_t)feed_check(pos, w) << 32;
  for (int i = 0; i < 7; i++) atomic_store_explicit(&c->w[i], w[i], memory_order_relaxed);
  uint64_t exp = want;
  /* [R1] the payload before the completion; pairs with the consumer's [A1] */
  if (!atomic_compare_exchange_strong_explicit(&c->seq, &exp, want + 1, memory_order_release, memory_order_relaxed))
    atomic_fetch_add_explicit(&h->overtaken, 1, memory_order_relaxed); /* overtaken while writing */
}

static void feed_emit(struct umbp_index *ix, int type, const struct umbp_key_shm *k) {
  /* [A-gen] pairs with the creator's [R-gen] */
  uint32_t gen = atomic_load_explicit(&ix->p->hdr->feed_gen, memory_order_acquire);
  if (UMBP_LIKELY(gen == 0)) return;
  struct umbp_feed_map *m = atomic_load_explicit(&ix->feed, memory_order_acquire);
  if (UMBP_UNLIKELY(!m || m->gen != gen)) {
    if (atomic_load_explicit(&ix->feed_tried, memory_order_relaxed) == gen) {
      if (!m || m->gen != gen) return; /* this generation was refused */
    } else if (!(m = feed_producer_map(ix, gen))) {
      return;
    }
  }
  feed_append(m, ix->p->owner_id, type, k);
}

/* ---- consumers ---- */

static int feed_lock_byte(int fd, off_t byte, short type) {
  struct flock fl = {.l_type = type, .l_whence = SEEK_SET, .l_start = byte, .l_len = 1};
  return fcntl(fd, F_OFD_SETLK, &fl) == 0 ? 0 : -errno;
}

/* Take lock byte UMBP_LOCK_FEED of the pool file, retrying for up to 5 s. */
static int feed_pool_lock(umbp_pool *p) {
  uint64_t end = umbp_now_ns() + FEED_LOCK_WAIT_NS;
  for (;;) {
    int rc = feed_lock_byte(p->fd, UMBP_LOCK_FEED, F_WRLCK);
    if (!rc) return 0;
    if (rc != -EAGAIN && rc != -EACCES)
      return umbp_fail(rc, "pool '%s': cannot lock its feed: %s", p->name, strerror(-rc));
    if (umbp_now_ns() > end) /* OFD locks do not name their holder */
      return umbp_fail(-ETIMEDOUT, "pool '%s': another process has been opening its feed for 5 s "
                                   "(stopped while holding lock byte %d of %s?)", p->name, UMBP_LOCK_FEED, p->path);
    struct timespec ts = {0, 1000000};
    nanosleep(&ts, NULL);
  }
}

static int feed_name_valid(const char *name) {
  size_t n = name ? strlen(name) : 0;
  if (n == 0 || n > UMBP_FEED_NAME_MAX)
    return umbp_fail(-EINVAL, "feed consumer name must be 1..%d characters", UMBP_FEED_NAME_MAX);
  for (size_t i = 0; i < n; i++) {
    char c = name[i];
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
          c == '-'))
      return umbp_fail(-EINVAL, "feed consumer name '%s': only letters, digits, '.', '_' and '-'", name);
  }
  return 0;
}

/* Create a fresh feed file of generation gen (the pool's feed lock held). */
static int feed_create(umbp_pool *p, const char *shm, uint32_t cap, uint32_t gen, int *ret_fd,
                       struct umbp_feed_map *m) {
  struct stat pst;
  mode_t mode = 0600;
  if (!fstat(p->fd, &pst)) mode = pst.st_mode & 0666;
  shm_unlink(shm); /* a stale or broken one: producers still mapping it keep their mapping */
  int fd = shm_open(shm, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, mode);
  if (fd < 0) {
    int e = errno;
    return umbp_fail(-e, "pool '%s': cannot create its feed /dev/shm%s: %s", p->name, shm, strerror(e));
  }
  (void)!fchmod(fd, mode); /* the umask may have narrowed it: match the pool's */
  if (pst.st_gid) (void)!fchown(fd, (uid_t)-1, pst.st_gid);
  size_t len = feed_bytes(cap);
  int rc = 0;
  if (ftruncate(fd, (off_t)len)) rc = -errno;
  if (!rc) {
    int e = posix_fallocate(fd, 0, (off_t)len); /* a full /dev/shm fails here, not as a SIGBUS later */
    if (e) rc = -e;
  }
  void *base = rc ? MAP_FAILED : mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (!rc && base == MAP_FAILED) rc = -errno;
  if (rc) {
    close(fd);
    shm_unlink(shm);
    return umbp_fail(rc, "pool '%s': cannot size its feed (%zu bytes in /dev/shm): %s", p->name, len,
                     strerror(-rc));
  }
  struct feed_hdr *h = base;
  h->major = FEED_MAJOR;
  h->minor = FEED_MINOR;
  h->hdr_bytes = FEED_HDR_BYTES;
  h->capacity = cap;
  h->gen = gen;
  memcpy(h->uuid, p->hdr->uuid, 16);
  h->total_bytes = len;
  h->checksum = feed_hdr_sum(h);
  /* cells start zeroed: seq 0 is older than every position's 2*pos + 1 */
  atomic_store_explicit(&h->magic, FEED_MAGIC, memory_order_release); /* [R-mag] */
  munmap(base, len);
  int mrc = feed_map_fd(p, fd, PROT_READ | PROT_WRITE, gen, m);
  if (mrc) {
    close(fd);
    return mrc;
  }
  *ret_fd = fd;
  return 0;
}

/* This process's open consumer handles. umbp_feed_close() frees the handle,
 * unmaps its mapping and closes its fd, so a second close of one pointer (a
 * cleanup path run twice: the caller's bug, but an easy one) freed it again
 * (glibc aborts) and closed whatever fd and unmapped whatever mapping had
 * since taken those numbers: another feed's, whose name lock went with it.
 * As umbp_pool_detach() does for pool handles (segment.c), close acts only
 * on a handle this list holds and takes it off first. (A pointer malloc has
 * since handed out again for a new feed is that feed: no list can tell.)
 * The lock is never held across another lock or a system call. */
static pthread_mutex_t feed_live_mu = PTHREAD_MUTEX_INITIALIZER;
static struct umbp_feed *feed_live_head;

/* fork(): the child's copy of each open feed lets go of the feed file. The
 * consumer's name is an OFD lock on the handle's open file description,
 * which the kernel drops only when the last reference goes: every fd and
 * every mapping made from it. A child that inherited both (and did not
 * exec) kept the name held after its parent died, so the consumer restarted
 * under that name got -EBUSY for as long as the child lived. The child
 * closes the fd and puts anonymous memory over the mapping (the handle's
 * pointers stay valid, for umbp_feed_position() and umbp_feed_close(); read
 * and commit fail with -ECHILD before they look). System calls only: the
 * child of a threaded parent may make async-signal-safe calls only. */
static void feed_fork_prepare(void) { pthread_mutex_lock(&feed_live_mu); }
static void feed_fork_parent(void) { pthread_mutex_unlock(&feed_live_mu); }
static void feed_fork_child(void) {
  for (struct umbp_feed *f = feed_live_head; f; f = f->live_next) {
    mmap(f->m.h, f->m.len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
    if (f->fd >= 0) close(f->fd);
    f->fd = -1;
  }
  pthread_mutex_unlock(&feed_live_mu);
}
static pthread_once_t feed_fork_once = PTHREAD_ONCE_INIT;
static void feed_fork_register(void) { pthread_atfork(feed_fork_prepare, feed_fork_parent, feed_fork_child); }

static void feed_live_add(struct umbp_feed *f) {
  pthread_once(&feed_fork_once, feed_fork_register);
  pthread_mutex_lock(&feed_live_mu);
  f->live_next = feed_live_head;
  feed_live_head = f;
  pthread_mutex_unlock(&feed_live_mu);
}

/* Take f off the list: whether it was on it. */
static bool feed_live_take(struct umbp_feed *f) {
  pthread_mutex_lock(&feed_live_mu);
  struct umbp_feed **pp = &feed_live_head;
  while (*pp && *pp != f) pp = &(*pp)->live_next;
  bool found = *pp != NULL;
  if (found) *pp = f->live_next;
  pthread_mutex_unlock(&feed_live_mu);
  return found;
}

UMBP_API void umbp_feed_opts_init(umbp_feed_opts *o) {
  if (!o) return;
  memset(o, 0, sizeof *o);
  o->start = UMBP_FEED_RESUME;
}

/* -EIDRM with a message if p's pool was destroyed while p stayed attached
 * (its file has no name left): such a pool has no feed, and the feed file
 * of that name may be a new pool's. 0 otherwise. */
static int feed_pool_destroyed(umbp_pool *p) {
  struct stat pst;
  if (fstat(p->fd, &pst) || pst.st_nlink != 0) return 0;
  return umbp_fail(-EIDRM, "pool '%s' was destroyed (umbp_pool_destroy) while this handle stayed attached: it "
                           "has no feed; detach it, and attach the pool again if it was recreated", p->name);
}

/* The entries of a feed created for a wanted capacity (0: the default), at
 * most FEED_MAX_CAPACITY: a power of two, at least FEED_MIN_CAPACITY. */
static uint32_t feed_capacity(uint32_t want) {
  uint32_t cap = FEED_MIN_CAPACITY;
  if (!want) want = FEED_DEFAULT_CAPACITY;
  while (cap < want) cap <<= 1;
  return cap;
}

UMBP_API uint64_t umbp_feed_file_bytes(uint32_t capacity) {
  if (capacity > FEED_MAX_CAPACITY) return 0; /* umbp_feed_open()'s -EINVAL */
  return feed_bytes(feed_capacity(capacity));
}

UMBP_API int umbp_feed_open(umbp_pool *p, const char *name, const umbp_feed_opts *opts, umbp_feed **ret) {
  if (!p || !ret) return umbp_fail(-EINVAL, "umbp_feed_open: pool and ret_feed are required");
  int rc = feed_name_valid(name);
  if (rc) return rc;
  umbp_feed_opts o;
  umbp_feed_opts_init(&o);
  if (opts) o = *opts;
  if (o.start < UMBP_FEED_RESUME || o.start > UMBP_FEED_FROM_OLDEST)
    return umbp_fail(-EINVAL, "umbp_feed_open: start %d is not an umbp_feed_start", o.start);
  if (o.capacity > FEED_MAX_CAPACITY)
    return umbp_fail(-EINVAL, "umbp_feed_open: capacity %u is above %u entries", o.capacity, FEED_MAX_CAPACITY);
  uint32_t cap = feed_capacity(o.capacity);
  if (p->forked) return umbp_pool_forked_fail(p);
  if (p->read_only || !p->index) return umbp_fail(-EROFS, "opening the feed needs a read-write attachment");

  umbp_feed *f = calloc(1, sizeof *f);
  if (!f) return umbp_fail(-ENOMEM, "umbp_feed_open: out of memory");
  f->p = p;
  f->p_serial = p->attach_serial;
  f->fd = -1;
  /* this handle's other threads first (index_internal.h, feed_open_mu):
   * two opens at once each created a file and one consumer was left reading
   * a file that producers no longer append to; then other processes */
  pthread_mutex_lock(&p->index->feed_open_mu);
  if ((rc = feed_pool_lock(p))) {
    pthread_mutex_unlock(&p->index->feed_open_mu);
    free(f);
    return rc;
  }
  /* A pool destroyed while this handle stayed attached: its feed file is
   * gone with it, and the name /dev/shm/umbp.NAME.feed may already be a new
   * pool's of the same name. Creating a feed here would replace that pool's
   * (its producers attaching later then refuse the file, uuid mismatch, and
   * its consumers never see their publishes) or, with no new pool, leave a
   * file nobody removes. (A destroy that starts after this check unlinks
   * the pool, then the feed: it removes the one made here.) */
  if ((rc = feed_pool_destroyed(p))) goto fail;
  char shm[UMBP_NAME_MAX + 16];
  feed_shm_name(p->name, shm, sizeof shm);
  uint32_t gen = atomic_load_explicit(&p->hdr->feed_gen, memory_order_acquire);
  if (gen) { /* the feed the pool's producers append to, if it is sound */
    int fd = shm_open(shm, O_RDWR | O_CLOEXEC, 0);
    if (fd >= 0) {
      if (!feed_map_fd(p, fd, PROT_READ | PROT_WRITE, gen, &f->m)) f->fd = fd;
      else close(fd);
    }
  }
  if (f->fd < 0) {
    uint32_t ng = gen + 1 ? gen + 1 : 1;
    rc = feed_create(p, shm, cap, ng, &f->fd, &f->m);
    if (rc) goto fail;
    /* [R-gen] producers map the file once they see its generation */
    atomic_store_explicit(&p->hdr->feed_gen, ng, memory_order_release);
  }
  /* the consumer's line: its own name, else a never-used one, else the
   * least recently active line whose holder is gone */
  struct feed_hdr *h = f->m.h;
  int row = -1, fresh = -1, spare = -1;
  uint64_t spare_ns = UINT64_MAX;
  for (unsigned i = 0; i < UMBP_FEED_MAX_CONSUMERS; i++) {
    struct feed_consumer_shm *c = &h->consumers[i];
    if (atomic_load_explicit(&c->state, memory_order_acquire) == 0) {
      if (fresh < 0) fresh = (int)i;
      continue;
    }
    char nm[UMBP_FEED_NAME_MAX + 1];
    memcpy(nm, c->name, sizeof nm);
    nm[UMBP_FEED_NAME_MAX] = 0;
    if (!strcmp(nm, name)) {
      row = (int)i;
      break;
    }
    uint64_t a = atomic_load_explicit(&c->active_ns, memory_order_relaxed);
    if (a < spare_ns) {
      struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = (off_t)i, .l_len = 1};
      if (fcntl(f->fd, F_OFD_GETLK, &fl) == 0 && fl.l_type == F_UNLCK) {
        spare = (int)i;
        spare_ns = a;
      }
    }
  }
  bool known = row >= 0;
  if (!known) row = fresh >= 0 ? fresh : spare;
  if (row < 0) {
    rc = umbp_fail(-EUSERS, "pool '%s': its feed has %d consumers, all alive: close one first", p->name,
                   UMBP_FEED_MAX_CONSUMERS);
    goto fail;
  }
  rc = feed_lock_byte(f->fd, row, F_WRLCK);
  if (rc) {
    rc = umbp_fail(-EBUSY, "pool '%s': feed consumer '%s' is held by pid %d", p->name, name,
                   (int)atomic_load_explicit(&h->consumers[row].pid, memory_order_relaxed));
    goto fail;
  }
  struct feed_consumer_shm *c = &h->consumers[row];
  uint64_t headv = atomic_load_explicit(&h->head, memory_order_relaxed);
  uint64_t capv = (uint64_t)h->capacity;
  if (!known) {
    memset(c->name, 0, sizeof c->name);
    memcpy(c->name, name, strlen(name));
    atomic_store_explicit(&c->lost, 0, memory_order_relaxed);
    atomic_store_explicit(&c->delivered, 0, memory_order_relaxed);
    atomic_store_explicit(&c->committed, headv, memory_order_relaxed);
    atomic_store_explicit(&c->state, 1, memory_order_release);
  }
  if (o.start == UMBP_FEED_FROM_OLDEST) f->cursor = headv > capv ? headv - capv : 0;
  else if (o.start == UMBP_FEED_RESUME && known) f->cursor = atomic_load_explicit(&c->committed, memory_order_relaxed);
  else f->cursor = headv;
  if (f->cursor > headv) f->cursor = headv; /* a line written by a confused process */
  atomic_store_explicit(&c->pid, (int32_t)getpid(), memory_order_relaxed);
  atomic_store_explicit(&c->read, f->cursor, memory_order_relaxed);
  atomic_store_explicit(&c->active_ns, umbp_realtime_ns(), memory_order_relaxed);
  f->row = (unsigned)row;
  snprintf(f->name, sizeof f->name, "%s", name);
  feed_lock_byte(p->fd, UMBP_LOCK_FEED, F_UNLCK);
  pthread_mutex_unlock(&p->index->feed_open_mu);
  feed_live_add(f);
  *ret = f;
  return 0;
fail:
  feed_lock_byte(p->fd, UMBP_LOCK_FEED, F_UNLCK);
  pthread_mutex_unlock(&p->index->feed_open_mu);
  if (f->fd >= 0) {
    munmap(f->m.h, f->m.len);
    close(f->fd);
  }
  free(f);
  return rc;
}

/* Whether the feed's pool handle is still attached: read and commit load
 * through it (feed_gen, the fork mark), and umbp_pool_detach() frees it. A
 * caller that detached first gets -EBADF instead of a use after free; the
 * feed's own mapping and file stay valid until umbp_feed_close(). One
 * uncontended mutex a call (umbp_pool_attached()). */
static int feed_pool_check(const umbp_feed *f, const char *fn) {
  if (UMBP_LIKELY(umbp_pool_attached(f->p, f->p_serial))) return 0;
  return umbp_fail(-EBADF, "%s: feed consumer '%s': its pool handle was detached (umbp_pool_detach()) before "
                           "umbp_feed_close(): close the feed first, or attach again and reopen it", fn, f->name);
}

/* A consumer handle inherited through fork(): -ECHILD. The name and its
 * line belong to the parent (the child's copy let go of the file at the
 * fork: feed_fork_child()). */
static int feed_forked_fail(const umbp_feed *f) {
  return umbp_fail(-ECHILD, "feed consumer '%s' of pool '%s' was opened by process %d and inherited through "
                            "fork(): a child may not read or commit on it (it would move the parent's cursor); "
                            "umbp_feed_close() it, attach the pool in the child and open the feed under a name "
                            "of its own", f->name, f->p->name, f->p->attach_pid);
}

UMBP_API int umbp_feed_read(umbp_feed *f, umbp_feed_entry *out, unsigned max, uint64_t *ret_lost) {
  if (!f || (!out && max)) return umbp_fail(-EINVAL, "umbp_feed_read: feed, and out for max = %u, are required", max);
  int rc = feed_pool_check(f, "umbp_feed_read");
  if (rc) return rc;
  /* a fork() child's copy of the handle would advance and count on the
   * parent's consumer line (its cursor copy is private, the line is not) */
  if (f->p->forked) return feed_forked_fail(f);
  if (atomic_load_explicit(&f->p->hdr->feed_gen, memory_order_relaxed) != f->m.gen)
    return umbp_fail(-ESTALE, "pool '%s': its feed was re-created since this consumer opened it: open it again",
                     f->p->name);
  struct feed_hdr *h = f->m.h;
  const uint64_t cap = (uint64_t)f->m.mask + 1;
  uint64_t head = atomic_load_explicit(&h->head, memory_order_relaxed);
  uint64_t cur = f->cursor, lost = 0;
  unsigned n = 0;
  if (head - cur > cap && (int64_t)(head - cur) > 0) { /* fell a lap behind: what is left starts at head - cap */
    lost += head - cap - cur;
    cur = head - cap;
  }
  while (n < max && cur != head) {
    struct feed_cell *c = &f->m.cells[cur & f->m.mask];
    uint64_t done = 2 * cur + 2;
    uint64_t s0 = atomic_load_explicit(&c->seq, memory_order_acquire); /* [A1] */
    if (s0 == done) {
      uint64_t w[7];
      for (int i = 0; i < 7; i++) w[i] = atomic_load_explicit(&c->w[i], memory_order_relaxed);
      atomic_thread_fence(memory_order_acquire); /* [F2] pairs with [F1] */
      uint64_t s1 = atomic_load_explicit(&c->seq, memory_order_relaxed);
      if (s1 == s0 && (uint32_t)(w[0] >> 32) == feed_check(cur, w)) {
        umbp_feed_entry *e = &out[n++];
        struct umbp_key_shm k;
        memcpy(&k, &w[1], sizeof k);
        e->pos = cur;
        e->type = (int)(w[0] & 0xff);
        e->owner = (uint16_t)(w[0] >> 8);
        umbp_ix_key_from_shm(&k, &e->key);
      } else {
        lost++; /* overwritten while copied, or torn by an overtaken producer */
      }
      cur++;
      f->stalled = false;
      continue;
    }
    if ((int64_t)(s0 - done) > 0) { /* a later lap is there: this one is gone */
      lost++;
      cur++;
      f->stalled = false;
      continue;
    }
    /* not written yet, or being written: a producer between its claim and
     * its completion. Come back later; skip it once it has stayed so for
     * FEED_STALL_NS (that producer stopped or died) */
    uint64_t now = umbp_now_ns();
    if (!f->stalled || f->stall_pos != cur) {
      f->stalled = true;
      f->stall_pos = cur;
      f->stall_since = now;
      break;
    }
    if (now - f->stall_since < FEED_STALL_NS) break;
    lost++;
    cur++;
    f->stalled = false;
  }
  f->cursor = cur;
  f->lost += lost;
  struct feed_consumer_shm *cl = &h->consumers[f->row];
  atomic_store_explicit(&cl->read, cur, memory_order_relaxed);
  if (lost) atomic_fetch_add_explicit(&cl->lost, lost, memory_order_relaxed);
  if (n) atomic_fetch_add_explicit(&cl->delivered, n, memory_order_relaxed);
  atomic_store_explicit(&cl->active_ns, umbp_realtime_ns(), memory_order_relaxed);
  if (ret_lost) *ret_lost = lost;
  return (int)n;
}

UMBP_API int umbp_feed_commit(umbp_feed *f, uint64_t pos) {
  if (!f) return umbp_fail(-EINVAL, "umbp_feed_commit: feed is required");
  int rc = feed_pool_check(f, "umbp_feed_commit");
  if (rc) return rc;
  if (f->p->forked) return feed_forked_fail(f); /* would move the parent's committed cursor */
  if ((int64_t)(pos - f->cursor) > 0) pos = f->cursor;
  atomic_store_explicit(&f->m.h->consumers[f->row].committed, pos, memory_order_relaxed);
  return 0;
}

UMBP_API int umbp_feed_position(umbp_feed *f, uint64_t *ret_cursor, uint64_t *ret_lost, uint64_t *ret_behind) {
  if (!f) return umbp_fail(-EINVAL, "umbp_feed_position: feed is required");
  uint64_t head = atomic_load_explicit(&f->m.h->head, memory_order_relaxed);
  if (ret_cursor) *ret_cursor = f->cursor;
  if (ret_lost) *ret_lost = f->lost;
  if (ret_behind) *ret_behind = (int64_t)(head - f->cursor) > 0 ? head - f->cursor : 0;
  return 0;
}

UMBP_API void umbp_feed_close(umbp_feed *f) {
  if (!f) return;
  if (!feed_live_take(f)) {
    umbp_log(UMBP_LOG_WARN, "umbp_feed_close: %p is not an open feed handle of this process (closed "
                            "already?): ignored", (void *)f);
    return;
  }
  munmap(f->m.h, f->m.len);
  if (f->fd >= 0) close(f->fd); /* drops the name's lock (-1: a fork() child's copy) */
  free(f);
}

UMBP_API int umbp_feed_info_get(umbp_pool *p, umbp_feed_info *ret) {
  if (!p || !ret) return umbp_fail(-EINVAL, "umbp_feed_info_get: pool and ret are required");
  /* A pool destroyed while this handle stayed attached has no feed; the file
   * of that name may be a new pool's, which the uuid check below would refuse
   * as "an earlier pool's" when the earlier pool is this one. */
  int rc = feed_pool_destroyed(p);
  if (rc) return rc;
  uint32_t gen = atomic_load_explicit(&p->hdr->feed_gen, memory_order_acquire);
  if (!gen) return umbp_fail(-ENOENT, "pool '%s' has no published-key feed (no consumer opened one)", p->name);
  char shm[UMBP_NAME_MAX + 16];
  feed_shm_name(p->name, shm, sizeof shm);
  /* O_NONBLOCK: a FIFO of that name must not hold a read-only open without
   * bound (as the tier table's, umbp_tier_info_get); the map refuses it */
  int fd = shm_open(shm, O_RDONLY | O_NONBLOCK | O_CLOEXEC, 0);
  if (fd < 0) {
    int e = errno;
    return umbp_fail(e == ENOENT ? -ENOENT : -e, "pool '%s': its feed /dev/shm%s: %s", p->name, shm, strerror(e));
  }
  struct umbp_feed_map m;
  rc = feed_map_fd(p, fd, PROT_READ, gen, &m);
  if (rc) {
    close(fd);
    return rc;
  }
  umbp_feed_info i;
  memset(&i, 0, sizeof i);
  i.capacity = m.mask + 1;
  i.generation = m.gen;
  i.head = atomic_load_explicit(&m.h->head, memory_order_relaxed);
  i.overtaken = atomic_load_explicit(&m.h->overtaken, memory_order_relaxed);
  for (unsigned r = 0; r < UMBP_FEED_MAX_CONSUMERS; r++) {
    struct feed_consumer_shm *c = &m.h->consumers[r];
    if (atomic_load_explicit(&c->state, memory_order_acquire) != 1) continue;
    umbp_feed_consumer_info *ci = &i.consumers[i.n_consumers++];
    memcpy(ci->name, c->name, UMBP_FEED_NAME_MAX);
    ci->name[UMBP_FEED_NAME_MAX] = 0;
    ci->pid = atomic_load_explicit(&c->pid, memory_order_relaxed);
    struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = (off_t)r, .l_len = 1};
    ci->alive = fcntl(fd, F_OFD_GETLK, &fl) == 0 && fl.l_type != F_UNLCK;
    ci->committed = atomic_load_explicit(&c->committed, memory_order_relaxed);
    ci->read = atomic_load_explicit(&c->read, memory_order_relaxed);
    ci->lost = atomic_load_explicit(&c->lost, memory_order_relaxed);
    ci->delivered = atomic_load_explicit(&c->delivered, memory_order_relaxed);
    ci->active_ns = atomic_load_explicit(&c->active_ns, memory_order_relaxed);
  }
  munmap(m.h, m.len);
  close(fd);
  *ret = i;
  return 0;
}
