/* SPDX-License-Identifier: Apache-2.0 */
/*
 * dp_ipc.c — the CUDA IPC export table and the per-engine cache of opened
 * handles. Nothing here calls CUDA: handles are 64 opaque bytes, opened and
 * closed through callbacks, so the table and the cache are tested without a
 * GPU.
 *
 * Design note.
 *
 * The pool segment has no region for exports, so the table is a separate
 * POSIX shm object "/umbp.<pool>.ipc" of fixed size: a 128-byte versioned
 * header (magic written last, major/minor, entry size and count, the pool's
 * uuid so a table left by an earlier pool of the same name is refused with
 * -ESTALE) and IPC_ENTRIES entries. It holds integers only. It is created on
 * first export (O_EXCL; losers wait for the magic) and removed by
 * umbp_dp_ipc_unlink(). Each entry:
 *
 *   owner  0 (free) or (registry slot + 1) | incarnation << 8, taken by CAS
 *          from 0 or from a stale owner; an entry is live only while the
 *          registry says that slot is alive with that incarnation, so a dead
 *          exporter's entries (or those of an earlier process that held the
 *          same slot) read as absent and are reused without any cleanup.
 *   seq    a seqlock: odd while the owner writes the fields; readers copy the
 *          fields between two even, equal reads (acquire, paired with the
 *          writer's release increment) and retry otherwise.
 *
 * A writer killed mid-write leaves seq odd and a stale owner: readers skip
 * it and the next exporter's CAS takes it over (and its seq increments make
 * it even again).
 *
 * A handle names a whole device allocation and cudaIpcOpenMemHandle returns
 * that allocation's base, while a region (a KV tensor, or its K or V half)
 * may start anywhere inside it: each entry carries alloc_off, the region's
 * base minus its allocation's base, which the puller adds to the opened
 * pointer. Opening the same handle twice in one context (K and V of one
 * allocation) returns the same pointer with a reference count; each region's
 * cache entry closes once.
 *
 * The cache maps (owner slot, incarnation, rank, group, region) to the
 * pointer returned by the open callback (cudaIpcOpenMemHandle), in a
 * cds_lfht of the memb flavour: lookups run under the RCU read lock from any
 * thread (registered lazily, unregistered at thread exit); prune unlinks the
 * entries of exporters that are no longer live, waits for a grace period
 * (synchronize_rcu) and closes them in the calling thread.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <urcu/urcu-memb.h>
#include <urcu/rculfhash.h>

#include "datapath/dp_internal.h"
#include "shm/pool_internal.h"

#define IPC_MAGIC 0x31435049504d4255ull /* "UMBPIPC1" */
#define IPC_MAJOR 2 /* 2: entries carry alloc_off; a 1.x reader would open the wrong address */
#define IPC_MINOR 0
#define IPC_ENTRIES 4096
/* An attacher that arrives while the creator initialises the table waits
 * for it to be sized and then for its magic, polling every IPC_WAIT_POLL_US,
 * IPC_WAIT_TRIES times at most (1 s in all) each. */
#define IPC_WAIT_POLL_US 1000
#define IPC_WAIT_TRIES 1000
/* A reader retries an entry whose seqlock moved under it this many times
 * before it skips the entry (its owner rewrites it without pause). */
#define IPC_SEQ_TRIES 100

struct ipc_hdr {
  _Atomic uint64_t magic; /* written last by the creator (release) */
  uint16_t major, minor;
  uint32_t entry_size;
  uint32_t n_entries;
  uint32_t hdr_size;
  uint8_t pool_uuid[16];
  uint8_t reserved[88];
};

struct ipc_entry {
  _Atomic uint64_t owner;
  _Atomic uint32_t seq;
  uint32_t rank;
  uint32_t group, region, n_regions, layer;
  int32_t kind, device_id;
  uint64_t block_bytes, stride;
  uint32_t block_count, pad;
  uint8_t handle[DP_IPC_HANDLE_BYTES];
  uint64_t alloc_off; /* region base - allocation base (layout 2.0) */
  uint8_t reserved[24];
};

_Static_assert(sizeof(struct ipc_hdr) == 128, "ipc header layout is frozen");
_Static_assert(sizeof(struct ipc_entry) == 160, "ipc entry layout is frozen");
#define IPC_BYTES (sizeof(struct ipc_hdr) + IPC_ENTRIES * sizeof(struct ipc_entry))

struct ipc_map {
  struct ipc_hdr *h;
  struct ipc_entry *e;
};

static int ipc_name(const char *pool_name, char *buf, size_t n) {
  if (umbp_pool_name_valid(pool_name)) return -EINVAL;
  snprintf(buf, n, "/umbp.%s.ipc", pool_name);
  return 0;
}

int umbp_dp_ipc_unlink(const char *pool_name) {
  char nm[128];
  if (!pool_name || ipc_name(pool_name, nm, sizeof nm)) return umbp_fail(-EINVAL, "dp ipc: bad pool name");
  if (shm_unlink(nm) != 0) return umbp_fail(-errno, "dp ipc: shm_unlink %s: %s", nm, strerror(errno));
  return 0;
}

/* Map the table; create it when `create` and absent. */
static int ipc_open(umbp_pool *pool, bool create, struct ipc_map *m) {
  char nm[128];
  if (ipc_name(pool->name, nm, sizeof nm)) return umbp_fail(-EINVAL, "dp ipc: bad pool name");
  umbp_pool_info info;
  int rc = umbp_pool_get_info(pool, &info);
  if (rc) return rc;
  bool creator = false;
  int fd = -1;
  if (create) {
    fd = shm_open(nm, O_RDWR | O_CREAT | O_EXCL, 0600);
    if (fd >= 0) creator = true;
    else if (errno != EEXIST) return umbp_fail(-errno, "dp ipc: create %s: %s", nm, strerror(errno));
  }
  if (fd < 0) fd = shm_open(nm, O_RDWR, 0);
  if (fd < 0) {
    int e = errno;
    return e == ENOENT ? -ENOENT : umbp_fail(-e, "dp ipc: open %s: %s", nm, strerror(e));
  }
  if (creator && ftruncate(fd, (off_t)IPC_BYTES) != 0) {
    int e = errno;
    close(fd);
    shm_unlink(nm);
    return umbp_fail(-e, "dp ipc: size %s: %s", nm, strerror(e));
  }
  /* An attacher may arrive before the creator sized the object: wait for it. */
  struct stat st;
  for (int i = 0;; i++) {
    if (fstat(fd, &st) != 0) {
      int e = errno;
      close(fd);
      return umbp_fail(-e, "dp ipc: fstat %s: %s", nm, strerror(e));
    }
    if ((uint64_t)st.st_size >= IPC_BYTES) break;
    if (i >= IPC_WAIT_TRIES) {
      close(fd);
      return umbp_fail(-EBADMSG, "dp ipc: %s is %lld bytes, want %zu", nm, (long long)st.st_size, IPC_BYTES);
    }
    usleep(IPC_WAIT_POLL_US);
  }
  void *p = mmap(NULL, IPC_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) return umbp_fail(-errno, "dp ipc: mmap %s: %s", nm, strerror(errno));
  m->h = p;
  m->e = (struct ipc_entry *)((char *)p + sizeof(struct ipc_hdr));
  if (creator) {
    m->h->major = IPC_MAJOR;
    m->h->minor = IPC_MINOR;
    m->h->entry_size = sizeof(struct ipc_entry);
    m->h->n_entries = IPC_ENTRIES;
    m->h->hdr_size = sizeof(struct ipc_hdr);
    memcpy(m->h->pool_uuid, info.uuid, 16);
    /* Pairs with the acquire load of attachers below. */
    atomic_store_explicit(&m->h->magic, IPC_MAGIC, memory_order_release);
    return 0;
  }
  for (int i = 0; atomic_load_explicit(&m->h->magic, memory_order_acquire) != IPC_MAGIC; i++) {
    if (i >= IPC_WAIT_TRIES) {
      munmap(p, IPC_BYTES);
      return umbp_fail(-EBADMSG, "dp ipc: %s has no valid magic (creator died while initialising?); "
                       "remove it with umbp_dp_ipc_unlink", nm);
    }
    usleep(IPC_WAIT_POLL_US);
  }
  if (m->h->major != IPC_MAJOR || m->h->entry_size != sizeof(struct ipc_entry) ||
      m->h->n_entries != IPC_ENTRIES || m->h->hdr_size != sizeof(struct ipc_hdr)) {
    int maj = m->h->major, min = m->h->minor;
    munmap(p, IPC_BYTES);
    return umbp_fail(-EPROTO, "dp ipc: %s has layout %d.%d, this build reads %d.%d", nm, maj, min, IPC_MAJOR,
                     IPC_MINOR);
  }
  if (memcmp(m->h->pool_uuid, info.uuid, 16) != 0) {
    munmap(p, IPC_BYTES);
    return umbp_fail(-ESTALE, "dp ipc: %s belongs to an earlier pool named %s; remove it with "
                     "umbp_dp_ipc_unlink(\"%s\")", nm, pool->name, pool->name);
  }
  return 0;
}

static void ipc_close(struct ipc_map *m) { munmap(m->h, IPC_BYTES); }

/* Registry incarnations of live slots (0: not live). */
static void live_table(umbp_pool *pool, uint64_t inc[UMBP_MAX_PROCS]) {
  umbp_proc_info procs[UMBP_MAX_PROCS];
  memset(inc, 0, UMBP_MAX_PROCS * sizeof *inc);
  int n = umbp_pool_list_procs(pool, procs, UMBP_MAX_PROCS);
  for (int i = 0; i < n; i++)
    if (procs[i].alive && procs[i].slot < UMBP_MAX_PROCS)
      inc[procs[i].slot] = (procs[i].incarnation & ((1ull << 56) - 1)) | (1ull << 63);
}

static uint64_t owner_word(unsigned slot, uint64_t inc) { return (uint64_t)(slot + 1) | (inc & ((1ull << 56) - 1)) << 8; }

static bool owner_live(uint64_t owner, const uint64_t inc[UMBP_MAX_PROCS]) {
  if (!owner) return false;
  unsigned slot = (unsigned)(owner & 0xff) - 1;
  if (slot >= UMBP_MAX_PROCS || !inc[slot]) return false;
  return (owner >> 8) == (inc[slot] & ((1ull << 56) - 1));
}

static int self_owner(umbp_pool *pool, const uint64_t inc[UMBP_MAX_PROCS], uint64_t *ret) {
  int slot = umbp_pool_proc_slot(pool);
  if (slot < 0 || slot >= UMBP_MAX_PROCS || !inc[slot])
    return umbp_fail(-EINVAL, "dp ipc: exporting needs a read-write pool handle with a registry slot");
  *ret = owner_word((unsigned)slot, inc[slot]);
  return 0;
}

static void entry_clear(struct ipc_entry *e) {
  atomic_fetch_add_explicit(&e->seq, 1, memory_order_acq_rel); /* odd */
  atomic_store_explicit(&e->owner, 0, memory_order_release);
  atomic_fetch_add_explicit(&e->seq, 1, memory_order_release); /* even */
}

static void withdraw_locked(struct ipc_map *m, uint64_t me, unsigned rank) {
  for (unsigned i = 0; i < IPC_ENTRIES; i++) {
    struct ipc_entry *e = &m->e[i];
    if (atomic_load_explicit(&e->owner, memory_order_acquire) != me) continue;
    if (rank != UINT32_MAX && e->rank != rank) continue;
    entry_clear(e);
  }
}

int dp_ipc_withdraw(umbp_pool *pool, unsigned rank) {
  struct ipc_map m;
  int rc = ipc_open(pool, false, &m);
  if (rc == -ENOENT) return 0;
  if (rc) return rc;
  uint64_t inc[UMBP_MAX_PROCS], me = 0;
  live_table(pool, inc);
  rc = self_owner(pool, inc, &me);
  if (!rc) withdraw_locked(&m, me, rank);
  ipc_close(&m);
  return rc;
}

int dp_ipc_publish(umbp_pool *pool, unsigned rank, const struct dp_ipc_desc *descs, unsigned n) {
  struct ipc_map m;
  int rc = ipc_open(pool, true, &m);
  if (rc) return rc;
  uint64_t inc[UMBP_MAX_PROCS], me = 0;
  live_table(pool, inc);
  rc = self_owner(pool, inc, &me);
  if (rc) {
    ipc_close(&m);
    return rc;
  }
  withdraw_locked(&m, me, rank);
  unsigned done = 0;
  for (unsigned i = 0; i < IPC_ENTRIES && done < n; i++) {
    struct ipc_entry *e = &m.e[i];
    uint64_t o = atomic_load_explicit(&e->owner, memory_order_acquire);
    if (o && owner_live(o, inc)) continue;
    if (!atomic_compare_exchange_strong_explicit(&e->owner, &o, me, memory_order_acq_rel, memory_order_relaxed))
      continue;
    uint32_t s = atomic_load_explicit(&e->seq, memory_order_relaxed);
    /* Make seq odd (a killed writer may have left it odd already). */
    if (!(s & 1)) atomic_store_explicit(&e->seq, s + 1, memory_order_relaxed);
    atomic_thread_fence(memory_order_release); /* odd seq before the field writes */
    const struct dp_ipc_desc *d = &descs[done++];
    e->rank = rank;
    e->group = d->group;
    e->region = d->region;
    e->n_regions = d->n_regions;
    e->layer = d->layer;
    e->kind = d->kind;
    e->device_id = d->device_id;
    e->block_bytes = d->block_bytes;
    e->stride = d->stride;
    e->block_count = d->block_count;
    e->alloc_off = d->alloc_off;
    memcpy(e->handle, d->handle, DP_IPC_HANDLE_BYTES);
    s = atomic_load_explicit(&e->seq, memory_order_relaxed);
    /* Even again; pairs with the reader's acquire load of seq. */
    atomic_store_explicit(&e->seq, s + 1, memory_order_release);
  }
  if (done < n) {
    withdraw_locked(&m, me, rank);
    ipc_close(&m);
    return umbp_fail(-ENOSPC, "dp ipc: the export table is full (%u entries)", IPC_ENTRIES);
  }
  ipc_close(&m);
  return 0;
}

int dp_ipc_find(umbp_pool *pool, unsigned rank, uint16_t group, struct dp_ipc_desc *out, unsigned max) {
  struct ipc_map m;
  int rc = ipc_open(pool, false, &m);
  if (rc) return rc;
  uint64_t inc[UMBP_MAX_PROCS];
  live_table(pool, inc);
  unsigned found = 0;
  for (unsigned i = 0; i < IPC_ENTRIES; i++) {
    struct ipc_entry *e = &m.e[i];
    for (int tries = 0; tries < IPC_SEQ_TRIES; tries++) {
      uint32_t s1 = atomic_load_explicit(&e->seq, memory_order_acquire);
      uint64_t o = atomic_load_explicit(&e->owner, memory_order_acquire);
      if (!o || !owner_live(o, inc)) break;
      if (s1 & 1) continue;
      struct dp_ipc_desc d = {.rank = e->rank, .region = e->region, .group = (uint16_t)e->group,
                              .device_id = e->device_id, .layer = e->layer, .kind = e->kind,
                              .block_bytes = e->block_bytes, .stride = e->stride,
                              .block_count = e->block_count, .n_regions = e->n_regions,
                              .alloc_off = e->alloc_off,
                              .proc_slot = (uint32_t)(o & 0xff) - 1, .incarnation = o >> 8};
      memcpy(d.handle, e->handle, DP_IPC_HANDLE_BYTES);
      atomic_thread_fence(memory_order_acquire); /* field reads before the re-check */
      if (atomic_load_explicit(&e->seq, memory_order_relaxed) != s1 ||
          atomic_load_explicit(&e->owner, memory_order_relaxed) != o)
        continue;
      if (d.rank == rank && d.group == group && d.region < max) {
        out[d.region] = d;
        found++;
      }
      break;
    }
  }
  ipc_close(&m);
  return (int)found;
}

/* ---- cache ----------------------------------------------------------------- */

struct cache_key {
  uint32_t slot, rank, group, region;
  uint64_t incarnation;
};

struct cache_node {
  struct cds_lfht_node node;
  struct cache_key k;
  void *ptr;
  struct dp_ipc_cache *c;
};

struct dp_ipc_cache {
  struct cds_lfht *ht;
  dp_ipc_open_fn open;
  dp_ipc_close_fn close;
  void *arg;
  pthread_mutex_t mu; /* serialises opens, so one handle is opened once */
};

static pthread_key_t rcu_key;
static pthread_once_t rcu_once = PTHREAD_ONCE_INIT;
static _Thread_local bool rcu_registered;

static void rcu_thread_exit(void *arg) {
  (void)arg;
  if (rcu_registered) {
    urcu_memb_unregister_thread();
    rcu_registered = false;
  }
}
static void rcu_key_init(void) { pthread_key_create(&rcu_key, rcu_thread_exit); }

static void rcu_thread_enter(void) {
  if (rcu_registered) return;
  pthread_once(&rcu_once, rcu_key_init);
  urcu_memb_register_thread();
  rcu_registered = true;
  pthread_setspecific(rcu_key, (void *)1);
}

static unsigned long key_hash(const struct cache_key *k) { return (unsigned long)umbp_fnv1a(k, sizeof *k, 0x9e37); }

static int key_match(struct cds_lfht_node *n, const void *key) {
  const struct cache_node *cn = caa_container_of(n, struct cache_node, node);
  return memcmp(&cn->k, key, sizeof cn->k) == 0;
}

int dp_ipc_cache_new(dp_ipc_open_fn open, dp_ipc_close_fn close, void *arg, struct dp_ipc_cache **ret) {
  struct dp_ipc_cache *c = calloc(1, sizeof *c);
  if (!c) return umbp_fail(-ENOMEM, "dp ipc: out of memory");
  /* No auto-resize: the cache holds a few entries per peer rank, and a
   * fixed table spares the resize worker thread. */
  c->ht = cds_lfht_new_flavor(256, 256, 256, CDS_LFHT_ACCOUNTING, &urcu_memb_flavor, NULL);
  if (!c->ht) {
    free(c);
    return umbp_fail(-ENOMEM, "dp ipc: cds_lfht_new failed");
  }
  c->open = open;
  c->close = close;
  c->arg = arg;
  pthread_mutex_init(&c->mu, NULL);
  *ret = c;
  return 0;
}

int dp_ipc_cache_get(struct dp_ipc_cache *c, const struct dp_ipc_desc *d, void **ret_ptr) {
  struct cache_key k = {.slot = d->proc_slot, .rank = d->rank, .group = d->group, .region = d->region,
                        .incarnation = d->incarnation};
  unsigned long h = key_hash(&k);
  rcu_thread_enter();
  struct cds_lfht_iter it;
  urcu_memb_read_lock();
  cds_lfht_lookup(c->ht, h, key_match, &k, &it);
  struct cds_lfht_node *n = cds_lfht_iter_get_node(&it);
  if (n) {
    *ret_ptr = caa_container_of(n, struct cache_node, node)->ptr;
    urcu_memb_read_unlock();
    return 0;
  }
  urcu_memb_read_unlock();
  pthread_mutex_lock(&c->mu);
  urcu_memb_read_lock();
  cds_lfht_lookup(c->ht, h, key_match, &k, &it);
  n = cds_lfht_iter_get_node(&it);
  if (n) {
    *ret_ptr = caa_container_of(n, struct cache_node, node)->ptr;
    urcu_memb_read_unlock();
    pthread_mutex_unlock(&c->mu);
    return 0;
  }
  urcu_memb_read_unlock();
  struct cache_node *cn = calloc(1, sizeof *cn);
  int rc = cn ? c->open(c->arg, d, &cn->ptr) : umbp_fail(-ENOMEM, "dp ipc: out of memory");
  if (rc) {
    free(cn);
    pthread_mutex_unlock(&c->mu);
    return rc;
  }
  cn->k = k;
  cn->c = c;
  cds_lfht_node_init(&cn->node);
  urcu_memb_read_lock();
  cds_lfht_add(c->ht, h, &cn->node); /* unique: opens are serialised by c->mu */
  urcu_memb_read_unlock();
  pthread_mutex_unlock(&c->mu);
  *ret_ptr = cn->ptr;
  return 0;
}

/* Unlink nodes matching `dead` (all when NULL), wait for a grace period,
 * then close and free them in this thread (no call_rcu worker involved). */
static unsigned cache_remove(struct dp_ipc_cache *c, const uint64_t *inc) {
  unsigned removed = 0;
  struct cache_node *gone = NULL;
  rcu_thread_enter();
  struct cds_lfht_iter it;
  struct cache_node *cn;
  pthread_mutex_lock(&c->mu);
  urcu_memb_read_lock();
  cds_lfht_for_each_entry(c->ht, &it, cn, node) {
    if (inc && owner_live(owner_word(cn->k.slot, cn->k.incarnation), inc)) continue;
    if (cds_lfht_del(c->ht, &cn->node) == 0) {
      cn->c = (struct dp_ipc_cache *)gone; /* reuse as the free list link */
      gone = cn;
      removed++;
    }
  }
  urcu_memb_read_unlock();
  pthread_mutex_unlock(&c->mu);
  if (!gone) return 0;
  urcu_memb_synchronize_rcu(); /* no reader still holds a removed node */
  while (gone) {
    struct cache_node *next = (struct cache_node *)gone->c;
    c->close(c->arg, gone->ptr);
    free(gone);
    gone = next;
  }
  return removed;
}

unsigned dp_ipc_cache_prune(struct dp_ipc_cache *c, umbp_pool *pool) {
  uint64_t inc[UMBP_MAX_PROCS];
  live_table(pool, inc);
  return cache_remove(c, inc);
}

unsigned dp_ipc_cache_size(struct dp_ipc_cache *c) {
  long before, after;
  unsigned long count;
  rcu_thread_enter();
  urcu_memb_read_lock();
  cds_lfht_count_nodes(c->ht, &before, &count, &after);
  urcu_memb_read_unlock();
  return (unsigned)count;
}

void dp_ipc_cache_free(struct dp_ipc_cache *c) {
  if (!c) return;
  cache_remove(c, NULL);
  cds_lfht_destroy(c->ht, NULL);
  pthread_mutex_destroy(&c->mu);
  free(c);
}
