/* SPDX-License-Identifier: Apache-2.0 */
/*
 * segment.c — create, attach, validate, detach and destroy pool segments.
 *
 * Design note (see also layout.h):
 *  - Creation is shm_open(O_CREAT|O_EXCL) + ftruncate + mmap, so a second
 *    creator gets -EEXIST from the kernel, not from a race-prone check.
 *    One name is one pool across /dev/shm and the hugetlbfs mount: a creator
 *    checks the other place before and after its O_EXCL creation
 *    (name_taken_elsewhere()), and --hugetlbfs DIR must be a hugetlbfs mount.
 *    Every size check (the shm file system's free space, MemAvailable, the
 *    chosen NUMA nodes' memory) runs before ftruncate, so a pool that cannot
 *    fit is refused before any large allocation.
 *  - The arena's partitions are placed with mbind() before they are touched,
 *    then pre-faulted by parallel threads (MADV_POPULATE_WRITE, or a touch
 *    loop on kernels without it). A refused mbind (EPERM in a container
 *    without CAP_SYS_NICE) is reported through the log callback and creation
 *    continues with the kernel's default placement.
 *  - The creator fills the header and the regions, claims its registry slot,
 *    and only then stores the magic (release). From just after the file's
 *    O_EXCL creation until that store it holds lock byte UMBP_LOCK_CREATE
 *    (an OFD lock, which the kernel drops when the creator dies), so a file
 *    without the magic and without that lock is a half-made pool whose
 *    creator died (half_made()): attachers fail at once (-EOWNERDEAD) instead
 *    of waiting out their timeout, and the next creator of the name takes
 *    the file over under that lock (take_over_half_made()). An attacher maps the file,
 *    waits (bounded) for the magic (acquire), then validates everything it
 *    will ever follow: version, feature bits, ABI fingerprint, checksum, total
 *    size against the file's real size, every region and partition inside the
 *    file. A segment that fails any check is refused with a message naming
 *    what differs; nothing past the header is read before that.
 *  - The index on huge pages (UMBP_FEAT_INCOMPAT_INDEX_HUGE, layout.h): the
 *    pool is mapped at a 2 MiB-aligned address (map_aligned()) and the
 *    hugetlbfs file umbp-index.NAME is mapped over the bucket array and slot
 *    metadata with MAP_FIXED, so every offset means the same as in a pool
 *    without it and the index code does not know the difference. The creator
 *    makes that file after the main file's O_EXCL creation (which makes the
 *    name its own, so an index file already there is a leftover and is
 *    replaced); MAP_SHARED reserves its huge pages at mmap, so too few fails
 *    creation, not a later lookup. "try" (the default) that cannot place the
 *    index there keeps it on the pool's own pages (pool_create_once()). An
 *    attacher opens the index file named by the pool name, checks its size
 *    against the header, and refuses a missing one naming it.
 */
#include <dirent.h>
#include <linux/magic.h>
#include <fcntl.h>
#include <grp.h>
#include <numa.h>
#include <numaif.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/vfs.h>
#include <time.h>
#include <unistd.h>

#include "common/common.h"
#include "shm/module.h"
#include "shm/pool_internal.h"
#include "shm/ring.h"
#include "shm/sigbus.h"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

#define SHM_DIR "/dev/shm"

#define ATTACH_POLL_MS 2              /* an attacher's sleep between looks for a creator's magic */
#define CREATE_ATTEMPTS 4             /* O_EXCL creations tried while half-made files are taken over */
#define PREFAULT_CHUNK_BYTES (32u << 20) /* one pre-fault thread's unit of work */
#define PREFAULT_THREADS_DEFAULT 8    /* at most this many with prefault_threads 0 (and online CPUs) */
#define PREFAULT_THREADS_MAX 64
#define MBIND_MAX_NODES 1024          /* NUMA nodes an mbind() mask covers */

static uint64_t align_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }
static uint32_t pow2_at_least(uint64_t v) {
  uint32_t p = 2;
  while (p < v && p < (1u << 31)) p <<= 1;
  return p;
}

UMBP_API void umbp_pool_params_init(umbp_pool_params *p) {
  if (!p) return;
  memset(p, 0, sizeof *p);
  p->slot_size = 256 * 1024;
  p->mempolicy = UMBP_MPOL_BIND;
  p->group = (gid_t)-1;
}

UMBP_API void umbp_attach_opts_init(umbp_attach_opts *o) {
  if (!o) return;
  memset(o, 0, sizeof *o);
  o->rank = -1;
  o->timeout_ms = UMBP_ATTACH_TIMEOUT_MS;
}

UMBP_API int umbp_pool_name_valid(const char *name) {
  if (!name || !*name)
    return umbp_fail(-EINVAL, "pool name is empty: use 1 to 64 characters from [A-Za-z0-9._-]");
  size_t n = strlen(name);
  if (n > UMBP_NAME_MAX)
    return umbp_fail(-EINVAL, "pool name is %zu characters long: use at most %d from [A-Za-z0-9._-]", n,
                     UMBP_NAME_MAX);
  for (size_t i = 0; i < n; i++) {
    char c = name[i];
    if (!((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' ||
          c == '_' || c == '-'))
    {
      /* the name is echoed only when all of it prints: raw bytes of a
       * mistyped name would reach the terminal or a log as they are */
      bool printable = true;
      for (size_t k = 0; k < n; k++) printable = printable && name[k] >= 0x20 && name[k] < 0x7f;
      if (printable)
        return umbp_fail(-EINVAL, "pool name '%.*s' has '%c' at position %zu: use only [A-Za-z0-9._-]", (int)n,
                         name, c, i + 1);
      return umbp_fail(-EINVAL, "pool name has byte 0x%02x at position %zu: use only [A-Za-z0-9._-]",
                       (unsigned)(unsigned char)c, i + 1);
    }
  }
  if (!strcmp(name, ".") || !strcmp(name, ".."))
    return umbp_fail(-EINVAL, "pool name '%s' is reserved: choose another", name);
  return 0;
}

/* ---- modules and the ABI fingerprint --------------------------------------- */
const struct umbp_shm_module *umbp_shm_region_owner(int region) {
  for (unsigned m = 0; m < umbp_shm_n_modules; m++)
    if (umbp_shm_modules[m]->regions & (1u << region)) return umbp_shm_modules[m];
  return NULL;
}

/* The segment layer's own part: its structs and the limits they are sized by. */
static uint64_t shm_abi_part(void) {
  const uint64_t shape[] = {
      UMBP_LAYOUT_MAJOR,
      UMBP_CACHELINE,
      sizeof(struct umbp_shm_header), _Alignof(struct umbp_shm_header),
      sizeof(struct umbp_region_desc), sizeof(struct umbp_partition_desc),
      sizeof(struct umbp_proc_slot), _Alignof(struct umbp_proc_slot),
      UMBP_MAX_PROCS, UMBP_MAX_THREADS, UMBP_MAX_PARTITIONS,
      sizeof(_Atomic uint64_t), _Alignof(_Atomic uint64_t),
  };
  return umbp_fnv1a(shape, sizeof shape, 0x756d6270);
}

uint64_t umbp_abi_fingerprint_with(const struct umbp_shm_module *given, uint64_t part) {
  uint64_t acc = shm_abi_part();
  for (unsigned m = 0; m < umbp_shm_n_modules; m++) {
    uint64_t v = umbp_shm_modules[m] == given ? part : umbp_shm_modules[m]->abi_part();
    acc = umbp_fnv1a(&v, sizeof v, acc);
  }
  return acc;
}

uint64_t umbp_abi_fingerprint(void) { return umbp_abi_fingerprint_with(NULL, 0); }

uint64_t umbp_header_checksum(const struct umbp_shm_header *h) {
  const char *p = (const char *)h;
  return umbp_fnv1a(p + 8, offsetof(struct umbp_shm_header, header_checksum) - 8, 0);
}

/* ---- layout --------------------------------------------------------------- */
int umbp_layout_compute(const umbp_pool_params *pp, const int *nodes, unsigned n_nodes,
                        struct umbp_shm_header *h) {
  if (!pp || !h || n_nodes == 0 || n_nodes > UMBP_MAX_PARTITIONS) return -EINVAL;
  if (pp->slot_size < 4096 || pp->slot_size % 64)
    return umbp_fail(-EINVAL,
                     "slot size %llu is invalid: use a multiple of 64 bytes of at least 4 KiB "
                     "(the KV bytes of one block, e.g. --slot-size 256KiB)",
                     (unsigned long long)pp->slot_size);
  if (pp->slot_size > (1ull << 32))
    return umbp_fail(-EINVAL, "slot size %llu is larger than 4 GiB: use a smaller --slot-size",
                     (unsigned long long)pp->slot_size);
  uint64_t slots = pp->capacity / pp->slot_size;
  if (slots < 2ull * n_nodes)
    return umbp_fail(-EINVAL,
                     "capacity %llu bytes holds %llu slots of %llu bytes: need at least 2 per "
                     "partition (%u partitions); raise --capacity",
                     (unsigned long long)pp->capacity, (unsigned long long)slots,
                     (unsigned long long)pp->slot_size, n_nodes);
  memset(h, 0, sizeof *h);
  h->layout_major = UMBP_LAYOUT_MAJOR;
  h->layout_minor = UMBP_LAYOUT_MINOR;
  h->header_bytes = UMBP_HEADER_BYTES;
  h->abi_fingerprint = umbp_abi_fingerprint();
  h->slot_size = pp->slot_size;
  h->slot_count = slots > UINT32_MAX ? UINT32_MAX : (uint32_t)slots; /* the index refuses more than it addresses */
  h->max_procs = UMBP_MAX_PROCS;
  h->max_threads = UMBP_MAX_THREADS;
  h->max_namespaces = UMBP_MAX_NAMESPACES;
  if (pp->hugepages) h->incompat_features |= UMBP_FEAT_INCOMPAT_HUGEPAGES;
  h->incompat_features |= UMBP_FEAT_INCOMPAT_EVENTS_ON_DRAIN;
  /* umbp_pool_create() resolves UMBP_INDEX_PAGES_TRY to one of the others
   * before it lays the pool out */
  bool index_huge = pp->index_pages == UMBP_INDEX_PAGES_HUGE && !pp->hugepages;
  if (index_huge) h->incompat_features |= UMBP_FEAT_INCOMPAT_INDEX_HUGE;

  /* partitions: slots split evenly, the remainder to the first ones */
  h->n_partitions = n_nodes;
  uint64_t ring_total = 0;
  uint32_t first = 0;
  for (unsigned i = 0; i < n_nodes; i++) {
    struct umbp_partition_desc *d = &h->partitions[i];
    d->numa_node = nodes[i];
    d->mempolicy = (uint32_t)pp->mempolicy;
    d->slot_count = (uint32_t)(slots / n_nodes + (i < slots % n_nodes ? 1 : 0));
    d->first_slot = first;
    first += d->slot_count;
    d->bytes = d->slot_count * pp->slot_size;
    d->ring_bytes = umbp_ring_bytes(pow2_at_least(d->slot_count), sizeof(uint64_t));
    ring_total += d->ring_bytes;
  }

  /* the modules' header fields, then their regions' sizes (module.h) */
  for (unsigned m = 0; m < umbp_shm_n_modules; m++) {
    int rc = umbp_shm_modules[m]->layout ? umbp_shm_modules[m]->layout(pp, h) : 0;
    if (rc) return rc;
  }
  uint64_t off = UMBP_HEADER_BYTES;
  uint64_t sizes[UMBP_REG_COUNT] = {0};
  sizes[UMBP_REG_REGISTRY] = sizeof(struct umbp_proc_slot) * UMBP_MAX_PROCS;
  for (int r = 0; r < UMBP_REG_ARENA; r++) {
    const struct umbp_shm_module *o = umbp_shm_region_owner(r);
    if (o) sizes[r] = o->region_bytes(h, r);
  }
  sizes[UMBP_REG_FREERINGS] = ring_total;

  for (int r = 0; r < UMBP_REG_ARENA; r++) {
    /* a huge index: buckets and slot metadata fill whole 2 MiB pages of
     * their own (umbp_index_huge_range()) */
    if (index_huge && r == UMBP_REG_BUCKETS) off = align_up(off, UMBP_PART_ALIGN);
    h->regions[r].offset = off;
    h->regions[r].size = sizes[r];
    off = align_up(off + sizes[r], index_huge && r == UMBP_REG_SLOTMETA ? UMBP_PART_ALIGN : 4096);
  }
  uint64_t roff = h->regions[UMBP_REG_FREERINGS].offset;
  for (unsigned i = 0; i < n_nodes; i++) {
    h->partitions[i].ring_offset = roff;
    roff += h->partitions[i].ring_bytes;
  }
  uint64_t part_align = UMBP_PART_ALIGN;
  off = align_up(off, part_align);
  h->regions[UMBP_REG_ARENA].offset = off;
  for (unsigned i = 0; i < n_nodes; i++) {
    h->partitions[i].offset = off;
    off = align_up(off + h->partitions[i].bytes, part_align);
  }
  h->regions[UMBP_REG_ARENA].size = off - h->regions[UMBP_REG_ARENA].offset;
  h->n_regions = UMBP_REG_COUNT;
  h->total_size = off;
  return 0;
}

int umbp_header_validate(const struct umbp_shm_header *h, uint64_t file_size) {
  uint64_t magic = atomic_load_explicit(&h->magic, memory_order_acquire);
  if (magic != UMBP_MAGIC)
    return umbp_fail(-EBADMSG, "not a umbp pool: magic is 0x%016llx, expected 0x%016llx",
                     (unsigned long long)magic, (unsigned long long)UMBP_MAGIC);
  if (h->layout_major != UMBP_LAYOUT_MAJOR)
    return umbp_fail(-EPROTO,
                     "pool layout version %u.%u, this build reads %u.x: use a umbp of the pool's "
                     "version, or destroy and re-create the pool",
                     h->layout_major, h->layout_minor, UMBP_LAYOUT_MAJOR);
  if (h->incompat_features & ~UMBP_FEAT_INCOMPAT_KNOWN)
    return umbp_fail(-EPROTO,
                     "pool uses feature bits 0x%llx that this build (layout %u.%u) does not know: "
                     "use a newer umbp",
                     (unsigned long long)(h->incompat_features & ~UMBP_FEAT_INCOMPAT_KNOWN),
                     UMBP_LAYOUT_MAJOR, UMBP_LAYOUT_MINOR);
  if (h->abi_fingerprint != umbp_abi_fingerprint())
    return umbp_fail(-EPROTO,
                     "pool ABI fingerprint 0x%016llx differs from this build's 0x%016llx (same layout "
                     "version %u.%u, different struct sizes, cache-line size or key hash, meson option aes): rebuild umbp alike "
                     "on both sides, or re-create the pool",
                     (unsigned long long)h->abi_fingerprint, (unsigned long long)umbp_abi_fingerprint(),
                     h->layout_major, h->layout_minor);
  uint64_t sum = umbp_header_checksum(h);
  if (sum != h->header_checksum)
    return umbp_fail(-EBADMSG,
                     "pool header checksum 0x%016llx does not match its contents (0x%016llx): the "
                     "header is corrupted; destroy the pool and create it again",
                     (unsigned long long)h->header_checksum, (unsigned long long)sum);
  if (h->header_bytes != UMBP_HEADER_BYTES)
    return umbp_fail(-EBADMSG, "pool header size %u, expected %u", h->header_bytes, UMBP_HEADER_BYTES);
  if (h->total_size != file_size)
    return umbp_fail(-EBADMSG,
                     "pool segment is %llu bytes but its header says %llu: the segment is %s; destroy "
                     "it and create it again",
                     (unsigned long long)file_size, (unsigned long long)h->total_size,
                     file_size < h->total_size ? "truncated" : "resized");
  if (h->n_regions != UMBP_REG_COUNT)
    return umbp_fail(-EBADMSG, "pool header lists %u regions, expected %u", h->n_regions, UMBP_REG_COUNT);
  /* Regions lie in the file, in the order of enum umbp_region, disjoint: a
   * checksum proves only that the header was written whole, not that a
   * writer laid it out sanely (one region moved onto another passes it). */
  uint64_t prev_end = UMBP_HEADER_BYTES;
  for (unsigned r = 0; r < UMBP_REG_COUNT; r++) {
    const struct umbp_region_desc *d = &h->regions[r];
    if (d->offset < UMBP_HEADER_BYTES || d->offset % 64 || d->offset > file_size ||
        d->size > file_size - d->offset)
      return umbp_fail(-EBADMSG, "pool region %u [%llu, +%llu) lies outside the %llu-byte segment", r,
                       (unsigned long long)d->offset, (unsigned long long)d->size,
                       (unsigned long long)file_size);
    if (d->offset < prev_end)
      return umbp_fail(-EBADMSG, "pool region %u [%llu, +%llu) overlaps %s%.0u, which ends at %llu (regions are "
                                 "disjoint and in order): header corrupted; destroy the pool and create it again",
                       r, (unsigned long long)d->offset, (unsigned long long)d->size, r ? "region " : "the header",
                       r ? r - 1 : 0, (unsigned long long)prev_end);
    prev_end = d->offset + d->size;
  }
  if (h->incompat_features & UMBP_FEAT_INCOMPAT_INDEX_HUGE) {
    uint64_t ioff, ilen;
    umbp_index_huge_range(h, &ioff, &ilen);
    if ((h->incompat_features & UMBP_FEAT_INCOMPAT_HUGEPAGES) || ioff % UMBP_PART_ALIGN || ilen == 0 ||
        h->regions[UMBP_REG_SLOTMETA].offset < ioff || ioff + ilen > h->regions[UMBP_REG_PINS].offset)
      return umbp_fail(-EBADMSG, "pool header places its index on huge pages at [%llu, +%llu), which is not "
                                 "2 MiB-aligned between the segment's other regions: header corrupted",
                       (unsigned long long)ioff, (unsigned long long)ilen);
  }
  if (h->slot_size < 4096 || h->slot_size % 64 || h->slot_count == 0 || h->n_partitions == 0 ||
      h->n_partitions > UMBP_MAX_PARTITIONS || h->max_procs != UMBP_MAX_PROCS || h->max_threads != UMBP_MAX_THREADS ||
      h->max_namespaces != UMBP_MAX_NAMESPACES)
    return umbp_fail(-EBADMSG, "pool creation parameters are inconsistent (slot size %llu, %u slots, "
                               "%u partitions): the header is corrupted",
                     (unsigned long long)h->slot_size, h->slot_count, h->n_partitions);
  for (unsigned m = 0; m < umbp_shm_n_modules; m++) { /* the modules' own fields (module.h) */
    int rc = umbp_shm_modules[m]->validate ? umbp_shm_modules[m]->validate(h) : 0;
    if (rc) return rc;
  }
  /* every table sized from the parameters must fit its region */
  for (int r = 0; r < UMBP_REG_ARENA; r++) {
    const struct umbp_shm_module *o = umbp_shm_region_owner(r);
    uint64_t need = r == UMBP_REG_REGISTRY ? sizeof(struct umbp_proc_slot) * (uint64_t)UMBP_MAX_PROCS
                    : o                    ? o->region_bytes(h, r)
                                           : 0;
    if (h->regions[r].size < need)
      return umbp_fail(-EBADMSG, "pool region %d is %llu bytes, its table needs %llu: header corrupted", r,
                       (unsigned long long)h->regions[r].size, (unsigned long long)need);
  }
  uint64_t slots = 0;
  const struct umbp_region_desc *arena = &h->regions[UMBP_REG_ARENA];
  const struct umbp_region_desc *rings = &h->regions[UMBP_REG_FREERINGS];
  uint64_t part_end = arena->offset, ring_end = rings->offset; /* partitions and their rings: in order, disjoint */
  for (unsigned i = 0; i < h->n_partitions; i++) {
    const struct umbp_partition_desc *d = &h->partitions[i];
    if (d->first_slot != slots || d->slot_count == 0 || d->bytes != d->slot_count * h->slot_size ||
        d->offset < part_end || d->ring_offset < ring_end ||
        d->offset < arena->offset || d->offset > arena->offset + arena->size ||
        d->bytes > arena->offset + arena->size - d->offset || d->ring_offset < rings->offset ||
        d->ring_offset > rings->offset + rings->size || d->ring_bytes > rings->offset + rings->size - d->ring_offset ||
        d->ring_bytes < umbp_ring_bytes(pow2_at_least(d->slot_count), sizeof(uint64_t)))
      return umbp_fail(-EBADMSG, "pool partition %u (slots %u+%u at offset %llu) is inconsistent with "
                                 "the arena: header corrupted",
                       i, d->first_slot, d->slot_count, (unsigned long long)d->offset);
    slots += d->slot_count;
    part_end = d->offset + d->bytes;
    ring_end = d->ring_offset + d->ring_bytes;
  }
  if (slots != h->slot_count)
    return umbp_fail(-EBADMSG, "pool partitions hold %llu slots, header says %u: header corrupted",
                     (unsigned long long)slots, h->slot_count);
  return 0;
}

/* ---- paths ---------------------------------------------------------------- */
int umbp_hugetlbfs_mount(char *out, size_t n) {
  FILE *f = fopen("/proc/mounts", "re");
  if (!f) return -ENOENT;
  char dev[256], dir[256], type[64];
  int rc = -ENOENT;
  while (fscanf(f, "%255s %255s %63s %*[^\n]", dev, dir, type) == 3) {
    if (!strcmp(type, "hugetlbfs") && strlen(dir) < n) {
      memcpy(out, dir, strlen(dir) + 1);
      rc = 0;
      break;
    }
  }
  fclose(f);
  return rc;
}

/* Open the pool's file. flags as open(2). Sets path. */
static int open_pool_file(const char *name, int flags, mode_t mode, bool hugepages, const char *hdir,
                          char *path, size_t pathn) {
  char dir[160];
  if (hugepages) {
    if (hdir) snprintf(dir, sizeof dir, "%s", hdir);
    else if (umbp_hugetlbfs_mount(dir, sizeof dir) < 0)
      return umbp_fail(-ENOENT, "--hugepages needs a hugetlbfs mount and none is in /proc/mounts: "
                                "mount one (mount -t hugetlbfs none /dev/hugepages) and reserve pages "
                                "(sysctl vm.nr_hugepages=N), or drop --hugepages");
    snprintf(path, pathn, "%s/umbp.%s", dir, name);
    int fd = open(path, flags | O_CLOEXEC | O_NOFOLLOW, mode);
    return fd < 0 ? -errno : fd;
  }
  snprintf(path, pathn, SHM_DIR "/umbp.%s", name);
  char shm_name[UMBP_NAME_MAX + 8];
  snprintf(shm_name, sizeof shm_name, "/umbp.%s", name);
  int fd = shm_open(shm_name, flags | O_NOFOLLOW, mode);
  if (fd >= 0 || errno != ENOENT || (flags & O_CREAT)) return fd < 0 ? -errno : fd;
  /* not in /dev/shm: maybe a hugepage pool */
  if (umbp_hugetlbfs_mount(dir, sizeof dir) == 0) {
    char hp[256];
    snprintf(hp, sizeof hp, "%s/umbp.%s", dir, name);
    fd = open(hp, flags | O_CLOEXEC | O_NOFOLLOW, mode);
    if (fd >= 0) {
      snprintf(path, pathn, "%s", hp);
      return fd;
    }
  }
  return -ENOENT;
}

/* ---- half-made pools -------------------------------------------------------- */
/* A file of size 0 has no header yet: its creator is between the O_EXCL
 * open and its lock (microseconds), or died there. Judged dead only when it
 * is older than this. */
#define HALF_MADE_GRACE_NS 1000000000ull

static int create_lock(int fd, int type) {
  struct flock fl = {.l_type = (short)type, .l_whence = SEEK_SET, .l_start = UMBP_LOCK_CREATE, .l_len = 1};
  return fcntl(fd, F_OFD_SETLK, &fl) == 0 ? 0 : -errno;
}

/* Is the pool file fd (st: its fstat) half-made, its creator dead? 1 yes,
 * with *ret_creator the pid its header recorded (0: none yet); 0 no (done,
 * being created, or not a file umbp leaves half-made). The lock is tested
 * before the magic is read: a creator stores the magic, then unlocks. */
static int half_made(int fd, const struct stat *st, int *ret_creator) {
  struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = UMBP_LOCK_CREATE, .l_len = 1};
  if (fcntl(fd, F_OFD_GETLK, &fl) != 0 || fl.l_type != F_UNLCK) return 0; /* being created (or cannot tell) */
  *ret_creator = 0;
  if (st->st_size == 0) {
    uint64_t mtime = (uint64_t)st->st_mtim.tv_sec * 1000000000ull + (uint64_t)st->st_mtim.tv_nsec;
    return umbp_realtime_ns() > mtime + HALF_MADE_GRACE_NS;
  }
  if ((uint64_t)st->st_size < UMBP_HEADER_BYTES) return 0; /* a creator sizes the file in one step */
  uint64_t magic = 1;
  int32_t pid = 0;
  if (pread(fd, &magic, sizeof magic, offsetof(struct umbp_shm_header, magic)) != (ssize_t)sizeof magic ||
      pread(fd, &pid, sizeof pid, offsetof(struct umbp_shm_header, creator_pid)) != (ssize_t)sizeof pid)
    return 0;
  *ret_creator = pid;
  return magic == 0;
}

static int half_made_fail(const char *name, int creator) {
  char who[48] = "";
  if (creator > 0) snprintf(who, sizeof who, " (pid %d)", creator);
  return umbp_fail(-EOWNERDEAD, "pool '%s' was left half-made: the process that was creating it%s died before "
                                "finishing it; 'umbp pool create %s' (or a daemon given --capacity) replaces it, or "
                                "remove it with 'umbp pool destroy %s'",
                   name, who, name, name);
}

/* The pool file at path exists (O_EXCL said so). If it is half-made and its
 * creator dead, take it over: its fd, with the creation lock held and its
 * size reset to 0, as if just created. -EEXIST: a real pool, or one being
 * created; -EAGAIN: the file went away meanwhile (try creating again);
 * another negative errno with a message. */
static int take_over_half_made(const char *name, const char *path) {
  int fd = open(path, O_RDWR | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return errno == ENOENT ? -EAGAIN : -EEXIST;
  struct stat st, now;
  int creator = 0;
  if (fstat(fd, &st) != 0 || half_made(fd, &st, &creator) != 1) {
    close(fd);
    return -EEXIST;
  }
  if (st.st_uid != geteuid()) {
    close(fd);
    return umbp_fail(-EACCES, "pool '%s' was left half-made by a creator that died, and its file %s belongs to uid "
                              "%u: remove it as that user ('umbp pool destroy %s')",
                     name, path, (unsigned)st.st_uid, name);
  }
  /* Holding the lock, nobody else finishes or takes over this file; a
   * creator still between its O_EXCL open and its lock finds the lock taken
   * and gives up (create_pool_file()). */
  if (create_lock(fd, F_WRLCK) != 0) {
    close(fd);
    return -EEXIST;
  }
  uint64_t magic = 0;
  if (fstat(fd, &st) != 0 || stat(path, &now) != 0 || st.st_ino != now.st_ino || st.st_dev != now.st_dev) {
    close(fd);
    return -EAGAIN; /* removed or replaced meanwhile */
  }
  if ((uint64_t)st.st_size >= UMBP_HEADER_BYTES &&
      (pread(fd, &magic, sizeof magic, 0) != (ssize_t)sizeof magic || magic != 0)) {
    close(fd);
    return -EEXIST; /* finished by a takeover that came first */
  }
  if (ftruncate(fd, 0) != 0) {
    int e = errno;
    close(fd);
    return umbp_fail(-e, "cannot reset the half-made pool file %s: %s", path, strerror(e));
  }
  char who[48] = "its creator";
  if (creator > 0) snprintf(who, sizeof who, "its creator (pid %d)", creator);
  umbp_log(UMBP_LOG_WARN, "pool '%s': %s was left half-made by %s, which died before finishing it; creating the "
                          "pool anew in its place",
           name, path, who);
  return fd;
}

static int not_a_pool_file(const char *name, const char *path, int fd); /* below, beside attach */

/* Create the pool file exclusively, with the creation lock held: its fd
 * (path set), or a negative errno with a message. */
static int create_pool_file(const char *name, mode_t mode, bool hugepages, const char *hdir, char *path,
                            size_t pathn) {
  int fd = -EAGAIN;
  bool told = false; /* take_over_half_made() failed with its own message */
  for (int attempt = 0; attempt < CREATE_ATTEMPTS && fd == -EAGAIN; attempt++) {
    fd = open_pool_file(name, O_RDWR | O_CREAT | O_EXCL, mode, hugepages, hdir, path, pathn);
    if (fd >= 0 && create_lock(fd, F_WRLCK) != 0) {
      close(fd); /* taken over in the instant before the lock: the file is the other creator's now */
      fd = -EEXIST;
    } else if (fd == -EEXIST) {
      /* A directory, FIFO or link there is no pool: "already exists ...
       * 'umbp pool destroy'" (which does not remove a directory), or for a
       * FIFO "cannot reset the half-made pool file" (its size is 0). Say what
       * it is and how to remove it, as attach does. */
      if (not_a_pool_file(name, path, -1)) return -EEXIST;
      fd = take_over_half_made(name, path);
      told = fd < 0 && fd != -EEXIST && fd != -EAGAIN;
    }
  }
  if (fd >= 0 || told) return fd;
  if (fd == -EEXIST || fd == -EAGAIN)
    return umbp_fail(-EEXIST, "a pool named '%s' already exists (%s): attach to it, pick another name, "
                              "or remove it with 'umbp pool destroy %s'",
                     name, path, name);
  if (fd == -EACCES) return umbp_fail(-EACCES, "cannot create %s: permission denied", path);
  return umbp_fail(fd, "cannot create pool file for '%s': %s", name, strerror(-fd));
}

/* One name is one pool: a pool file umbp.NAME in /dev/shm or on the first
 * hugetlbfs mount (where attach looks for it), other than in `dir` (where
 * the caller creates: its O_EXCL covers that place), makes the name taken:
 * -EEXIST naming it, else 0. Called before creating (the message comes
 * before any size check) and again after the O_EXCL creation: of two
 * creators racing in the two places, the one that checks last sees the
 * other's file, so at most one of them keeps its pool. */
static int name_taken_elsewhere(const char *name, const char *dir) {
  char places[2][160] = {SHM_DIR, ""};
  if (umbp_hugetlbfs_mount(places[1], sizeof places[1]) < 0) places[1][0] = '\0';
  for (int i = 0; i < 2; i++) {
    char path[sizeof places + UMBP_NAME_MAX + 8]; /* gcc bounds places[i] by the whole array */
    struct stat st;
    if (!places[i][0] || !strcmp(places[i], dir)) continue;
    snprintf(path, sizeof path, "%s/umbp.%.64s", places[i], name); /* a valid name has at most 64 */
    if (lstat(path, &st) == 0)
      return umbp_fail(-EEXIST, "a pool named '%s' already exists in %s (%s): one name is one pool across /dev/shm "
                                "and the hugetlbfs mount; attach to it, pick another name, or remove it with 'umbp "
                                "pool destroy %s'",
                       name, places[i], path, name);
  }
  return 0;
}

/* --hugetlbfs DIR: 0 when DIR is a hugetlbfs mount, else -EINVAL or
 * -errno naming it. A pool file elsewhere would sit on ordinary pages where
 * no other command looks for it. */
static int check_hugetlbfs_dir(const char *dir) {
  struct statfs sf;
  if (statfs(dir, &sf) != 0)
    return umbp_fail(-errno, "--hugetlbfs %s: %s: give the mount point of a hugetlbfs (grep hugetlbfs /proc/mounts)",
                     dir, strerror(errno));
  if ((unsigned long)sf.f_type != (unsigned long)HUGETLBFS_MAGIC)
    return umbp_fail(-EINVAL, "--hugetlbfs %s is not a hugetlbfs mount (file system magic 0x%lx): a pool there "
                              "would not be on huge pages and no other umbp command would find it; give a hugetlbfs "
                              "mount point (grep hugetlbfs /proc/mounts), or leave --hugetlbfs out to use the first",
                     dir, (unsigned long)sf.f_type);
  return 0;
}

/* --hugetlbfs DIR (a hugetlbfs mount, checked above) must be the first
 * hugetlbfs mount, the one every other command looks in for pools and index
 * files (open_pool_file(), name_taken_elsewhere()): a pool on another mount
 * could not be attached, listed or destroyed by name. The same directory
 * spelled otherwise ("/dev/hugepages/", a bind mount) is accepted, and dir is
 * rewritten to the mount's own path so that paths and the one-name check
 * compare it as text. 0 or -EINVAL naming both. */
static int check_first_hugetlbfs(char *dir, size_t n) {
  char first[160] = "";
  struct stat a, b;
  if (umbp_hugetlbfs_mount(first, sizeof first) == 0 && stat(first, &a) == 0 && stat(dir, &b) == 0 &&
      a.st_dev == b.st_dev && a.st_ino == b.st_ino) {
    snprintf(dir, n, "%s", first);
    return 0;
  }
  return umbp_fail(-EINVAL, "--hugetlbfs %s is not the first hugetlbfs mount in /proc/mounts (%s), the only one "
                            "umbp commands look in: a pool there could not be attached, listed or destroyed by "
                            "name; leave --hugetlbfs out to use %s",
                   dir, first[0] ? first : "none", first[0] ? first : "it");
}

/* ---- capacity checks ------------------------------------------------------ */
/* bytes for a message: GiB from 1 GiB up, else MiB (2 decimals), so that a
 * size and the room it does not fit in never print as the same figure */
static const char *fmt_gib(uint64_t bytes, char *buf, size_t n) {
  if (bytes >= (1ull << 30)) snprintf(buf, n, "%.2f GiB", bytes / 1073741824.0);
  else snprintf(buf, n, "%.2f MiB", bytes / 1048576.0);
  return buf;
}


static uint64_t meminfo_kb(const char *key) {
  FILE *f = fopen("/proc/meminfo", "re");
  if (!f) return 0;
  char line[256];
  uint64_t v = 0;
  size_t kl = strlen(key);
  while (fgets(line, sizeof line, f))
    if (!strncmp(line, key, kl) && line[kl] == ':') {
      v = strtoull(line + kl + 1, NULL, 10);
      break;
    }
  fclose(f);
  return v;
}

static int check_fits(const umbp_pool_params *pp, const struct umbp_shm_header *h, const char *dir,
                      bool hugepages) {
  char a[32], b[32];
  struct statvfs sv;
  if (statvfs(dir, &sv) == 0) {
    uint64_t avail = (uint64_t)sv.f_bavail * sv.f_frsize;
    if (hugepages && sv.f_blocks == 0) {
      /* hugetlbfs without a size limit reports 0 blocks: use the free pool,
       * less the pages other mappings have reserved but not yet faulted in
       * (a --no-prefault hugepage pool): they are not free to this mmap */
      uint64_t f = meminfo_kb("HugePages_Free"), r = meminfo_kb("HugePages_Rsvd");
      avail = (f > r ? f - r : 0) * meminfo_kb("Hugepagesize") * 1024;
    }
    if (h->total_size > avail) {
      fmt_gib(h->total_size, a, sizeof a);
      fmt_gib(avail, b, sizeof b);
      if (hugepages)
        return umbp_fail(-ENOSPC,
                         "the pool needs %s of huge pages but %s has %s free: reserve more "
                         "(sysctl vm.nr_hugepages=N) or choose a smaller --capacity",
                         a, dir, b);
      return umbp_fail(-ENOSPC,
                       "the pool needs %s but %s has only %s free: enlarge it (mount -o "
                       "remount,size=<N>G %s, or docker run --shm-size=<N>g), or choose a smaller "
                       "--capacity",
                       a, dir, b, dir);
    }
  }
  uint64_t avail_kb = meminfo_kb("MemAvailable");
  if (!hugepages && avail_kb && h->total_size > avail_kb * 1024) {
    fmt_gib(h->total_size, a, sizeof a);
    fmt_gib(avail_kb * 1024, b, sizeof b);
    return umbp_fail(-ENOMEM, "the pool needs %s but the machine has %s available (MemAvailable): choose "
                              "a smaller --capacity",
                     a, b);
  }
  if (pp->mempolicy == UMBP_MPOL_BIND && numa_available() >= 0) {
    for (unsigned i = 0; i < h->n_partitions; i++) {
      int node = h->partitions[i].numa_node;
      if (node < 0) continue;
      long long total = numa_node_size64(node, NULL);
      if (total > 0 && h->partitions[i].bytes > (uint64_t)total) {
        fmt_gib(h->partitions[i].bytes, a, sizeof a);
        fmt_gib((uint64_t)total, b, sizeof b);
        return umbp_fail(-ENOMEM, "partition %u needs %s on NUMA node %d, which has %s in all: spread "
                                  "the pool over more nodes (--numa-nodes) or shrink --capacity",
                         i, a, node, b);
      }
    }
  }
  return 0;
}

/* ---- the index on huge pages (UMBP_FEAT_INCOMPAT_INDEX_HUGE) ------------------ */
/* umbp-index.NAME: not "umbp." + a name, so `umbp pool ls` never lists it as a pool */
static void index_file_path(const char *dir, const char *name, char *out, size_t n) {
  snprintf(out, n, "%s/umbp-index.%s", dir, name);
}

/* Map `size` bytes of fd at a 2 MiB-aligned address, so that a hugetlbfs
 * file can later be mapped over a 2 MiB-aligned offset of it (MAP_FIXED). */
static void *map_aligned(int fd, uint64_t size, int prot) {
  uint64_t a = UMBP_PART_ALIGN;
  char *r = mmap(NULL, size + a, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (r == MAP_FAILED) return MAP_FAILED;
  char *b = (char *)align_up((uint64_t)(uintptr_t)r, a);
  if (b > r) munmap(r, (size_t)(b - r));
  if (r + size + a > b + size) munmap(b + size, (size_t)(r + size + a - (b + size)));
  void *m = mmap(b, size, prot, MAP_SHARED | MAP_FIXED, fd, 0);
  if (m == MAP_FAILED) {
    int e = errno;
    munmap(b, size);
    errno = e;
  }
  return m;
}

/* Free 2 MiB pages of hugetlbfs mount dir (0 when it has other pages). */
static uint64_t huge_free_bytes(const char *dir) {
  struct statvfs sv;
  if (statvfs(dir, &sv) != 0 || sv.f_bsize != UMBP_PART_ALIGN) return 0;
  if (sv.f_blocks) return (uint64_t)sv.f_bavail * sv.f_bsize; /* a mount with size= */
  if (meminfo_kb("Hugepagesize") * 1024 != UMBP_PART_ALIGN) return 0; /* the free count is of other pages */
  uint64_t f = meminfo_kb("HugePages_Free"), r = meminfo_kb("HugePages_Rsvd");
  return f > r ? (f - r) * UMBP_PART_ALIGN : 0;
}

/* How a message about placing the index ends: "huge" names the other
 * choice; "try" has made the pool on 4 KiB pages (index_fallback_note()). */
static const char *index_fix_end(bool fallback) {
  return fallback ? ", then re-create the pool" : ", or use --index-pages small";
}

/* The index file cannot be created in hugetlbfs mount dir by this user
 * (err: EACCES or EPERM): the message names the mount's owner and mode and
 * the fix. A daemon run as a system user (contrib/systemd) meets this on a
 * mount that only root may write, the default of /dev/hugepages. group: the
 * pool's --group, or (gid_t)-1 for the caller's own. */
static int index_dir_denied(int err, const char *dir, gid_t group, bool fallback) {
  struct stat st;
  char who[96] = "";
  if (stat(dir, &st) == 0)
    snprintf(who, sizeof who, " (owner uid %u, group gid %u, mode %04o)", (unsigned)st.st_uid, (unsigned)st.st_gid,
             (unsigned)(st.st_mode & 07777));
  gid_t gid = group != (gid_t)-1 ? group : getegid();
  char gname[64], buf[1024];
  struct group gr, *g = NULL;
  if (getgrgid_r(gid, &gr, buf, sizeof buf, &g) == 0 && g && strlen(g->gr_name) < sizeof gname)
    snprintf(gname, sizeof gname, "%s", g->gr_name);
  else
    snprintf(gname, sizeof gname, "%u", (unsigned)gid);
  return umbp_fail(-err,
                   "the hugetlbfs mount %s%s does not let uid %u create the index file there: as root, give the "
                   "pool's users write access (chgrp %s %s && chmod 1775 %s; docs/operations.md, \"Huge pages "
                   "for a daemon that is not root\"), or run as root%s",
                   dir, who, (unsigned)geteuid(), gname, dir, dir, index_fix_end(fallback));
}

/* Can an index of `len` bytes go on huge pages? 0 with *dir set, or a
 * negative errno with a message naming the cause and the fix. group: as
 * index_dir_denied()'s. */
static int index_huge_where(uint64_t len, char *dir, size_t n, gid_t group, bool fallback) {
  if (umbp_hugetlbfs_mount(dir, n) < 0)
    return umbp_fail(-ENOENT, "the index on huge pages needs a hugetlbfs mount and none is in /proc/mounts: mount "
                              "one (mount -t hugetlbfs none /dev/hugepages) and reserve pages (sysctl "
                              "vm.nr_hugepages=N)%s", index_fix_end(fallback));
  struct statvfs sv;
  if (statvfs(dir, &sv) != 0 || sv.f_bsize != UMBP_PART_ALIGN)
    return umbp_fail(-EOPNOTSUPP, "hugetlbfs mount %s does not have 2 MiB pages: the index needs them; mount one "
                              "with -o pagesize=2M%s", dir, index_fix_end(fallback));
  /* checked before anything is made, so that "try" falls back at once */
  if (faccessat(AT_FDCWD, dir, W_OK | X_OK, AT_EACCESS) != 0 && (errno == EACCES || errno == EPERM))
    return index_dir_denied(errno, dir, group, fallback);
  uint64_t avail = huge_free_bytes(dir);
  if (len > avail)
    return umbp_fail(-ENOSPC, "the index needs %llu huge pages of 2 MiB (%llu MiB: bucket array and slot "
                              "metadata) but %s has %llu free: reserve more (sysctl vm.nr_hugepages=N, %llu "
                              "more than now)%s",
                     (unsigned long long)(len / UMBP_PART_ALIGN), (unsigned long long)(len >> 20), dir,
                     (unsigned long long)(avail / UMBP_PART_ALIGN),
                     (unsigned long long)((len - avail) / UMBP_PART_ALIGN), index_fix_end(fallback));
  return 0;
}

/* Map the index file ifd (at ipath) over [base + ioff, + ilen) of a pool
 * mapping; its path and identity are kept for the SIGBUS message (sigbus.c). */
static int map_index(struct umbp_pool *p, int ifd, const char *ipath, uint64_t ioff, uint64_t ilen, int prot) {
  void *m = mmap((char *)p->base + ioff, ilen, prot, MAP_SHARED | MAP_FIXED, ifd, 0);
  if (m == MAP_FAILED) return -errno;
  p->index_huge_bytes = ilen;
  struct stat st;
  if (fstat(ifd, &st) == 0) p->index_dev = st.st_dev, p->index_ino = st.st_ino;
  snprintf(p->index_path, sizeof p->index_path, "%s", ipath);
  return 0;
}

static int choose_nodes(const umbp_pool_params *pp, int *nodes, unsigned *n) {
  bool numa = numa_available() >= 0;
  if (pp->n_numa_nodes > UMBP_MAX_PARTITIONS)
    return umbp_fail(-EINVAL, "%u NUMA nodes requested: at most %d partitions are supported",
                     pp->n_numa_nodes, UMBP_MAX_PARTITIONS);
  if (pp->n_numa_nodes == 0) {
    *n = 0;
    if (numa) {
      for (int nd = 0; nd <= numa_max_node() && *n < UMBP_MAX_PARTITIONS; nd++)
        if (numa_bitmask_isbitset(numa_all_nodes_ptr, (unsigned)nd) && numa_node_size64(nd, NULL) > 0)
          nodes[(*n)++] = nd;
    }
    if (*n == 0) nodes[(*n)++] = -1;
    return 0;
  }
  for (unsigned i = 0; i < pp->n_numa_nodes; i++) {
    int nd = pp->numa_nodes[i];
    for (unsigned j = 0; j < i; j++)
      if (pp->numa_nodes[j] == nd)
        return umbp_fail(-EINVAL, "NUMA node %d is listed twice: list each node once", nd);
    if (nd < 0) return umbp_fail(-EINVAL, "NUMA node %d is negative", nd);
    if (!numa) {
      if (nd != 0)
        return umbp_fail(-EINVAL, "NUMA node %d requested but this kernel reports no NUMA support; use "
                                  "node 0 or leave --numa-nodes out", nd);
      nodes[i] = -1;
      continue;
    }
    if (nd > numa_max_node() || !numa_bitmask_isbitset(numa_all_nodes_ptr, (unsigned)nd) ||
        numa_node_size64(nd, NULL) <= 0) {
      char list[128] = "";
      size_t l = 0;
      for (int k = 0; k <= numa_max_node(); k++)
        if (numa_bitmask_isbitset(numa_all_nodes_ptr, (unsigned)k) && numa_node_size64(k, NULL) > 0)
          l += (size_t)snprintf(list + l, sizeof list - l, "%s%d", l ? "," : "", k);
      return umbp_fail(-EINVAL, "NUMA node %d does not exist or has no memory on this machine (nodes "
                                "with memory: %s)",
                       nd, list);
    }
    nodes[i] = nd;
  }
  *n = pp->n_numa_nodes;
  return 0;
}

/* ---- placement and pre-faulting ------------------------------------------- */
static void place_partitions(struct umbp_pool *p, int mempolicy) {
  struct umbp_shm_header *h = p->hdr;
  if (mempolicy == UMBP_MPOL_NONE || numa_available() < 0) return;
  if (mempolicy == UMBP_MPOL_INTERLEAVE) {
    unsigned long mask[MBIND_MAX_NODES / (8 * sizeof(unsigned long))] = {0};
    for (unsigned i = 0; i < h->n_partitions; i++)
      if (h->partitions[i].numa_node >= 0 && h->partitions[i].numa_node < MBIND_MAX_NODES)
        mask[h->partitions[i].numa_node / 64] |= 1ul << (h->partitions[i].numa_node % 64);
    const struct umbp_region_desc *a = &h->regions[UMBP_REG_ARENA];
    if (mbind((char *)p->base + a->offset, a->size, MPOL_INTERLEAVE, mask, MBIND_MAX_NODES, 0) != 0)
      umbp_log(UMBP_LOG_WARN, "mbind(MPOL_INTERLEAVE) of the arena was refused (%s): the kernel places "
                              "the pages; run with CAP_SYS_NICE to place them",
               strerror(errno));
    return;
  }
  for (unsigned i = 0; i < h->n_partitions; i++) {
    const struct umbp_partition_desc *d = &h->partitions[i];
    if (d->numa_node < 0 || d->numa_node >= MBIND_MAX_NODES) continue;
    unsigned long mask[MBIND_MAX_NODES / (8 * sizeof(unsigned long))] = {0};
    mask[d->numa_node / 64] |= 1ul << (d->numa_node % 64);
    int mode = mempolicy == UMBP_MPOL_PREFERRED ? MPOL_PREFERRED : MPOL_BIND;
    if (mbind((char *)p->base + d->offset, align_up(d->bytes, UMBP_PART_ALIGN), mode, mask, MBIND_MAX_NODES, 0) != 0)
      umbp_log(UMBP_LOG_WARN, "mbind of partition %u to NUMA node %d was refused (%s): its pages go "
                              "where the kernel puts them; give the process CAP_SYS_NICE to place them",
               i, d->numa_node, strerror(errno));
  }
}

struct prefault_ctx {
  char *base;
  uint64_t len, chunk;
  _Atomic uint64_t next;
  _Atomic uint64_t done;
  _Atomic int err;
  pthread_mutex_t mu;
  umbp_progress_fn progress;
  void *arg;
  uint64_t total_chunks;
};

static void *prefault_thread(void *arg) {
  struct prefault_ctx *c = arg;
  long page = sysconf(_SC_PAGESIZE);
  for (;;) {
    uint64_t i = atomic_fetch_add_explicit(&c->next, 1, memory_order_relaxed);
    if (i >= c->total_chunks) break;
    char *s = c->base + i * c->chunk;
    uint64_t n = c->len - i * c->chunk < c->chunk ? c->len - i * c->chunk : c->chunk;
    if (madvise(s, n, MADV_POPULATE_WRITE) != 0) {
      if (errno == EINVAL || errno == ENOSYS) {
        for (uint64_t o = 0; o < n; o += (uint64_t)page) {
          /* a write that keeps the (zero) contents: faults the page in */
          atomic_fetch_add_explicit((_Atomic char *)(s + o), 0, memory_order_relaxed);
        }
      } else {
        atomic_store(&c->err, errno);
        break;
      }
    }
    uint64_t d = atomic_fetch_add_explicit(&c->done, 1, memory_order_relaxed) + 1;
    if (c->progress) {
      pthread_mutex_lock(&c->mu);
      c->progress(c->arg, "prefault", d * c->chunk > c->len ? c->len : d * c->chunk, c->len);
      pthread_mutex_unlock(&c->mu);
    }
  }
  return NULL;
}

static int prefault(struct umbp_pool *p, const umbp_pool_params *pp) {
  const struct umbp_region_desc *a = &p->hdr->regions[UMBP_REG_ARENA];
  struct prefault_ctx c = {.base = (char *)p->base + a->offset, .len = a->size, .chunk = PREFAULT_CHUNK_BYTES,
                           .progress = pp->progress, .arg = pp->progress_arg};
  pthread_mutex_init(&c.mu, NULL);
  c.total_chunks = (c.len + c.chunk - 1) / c.chunk;
  long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
  unsigned nt = pp->prefault_threads ? pp->prefault_threads
                                     : (unsigned)(ncpu < 1                         ? 1
                                                  : ncpu > PREFAULT_THREADS_DEFAULT ? PREFAULT_THREADS_DEFAULT
                                                                                    : ncpu);
  if (nt > c.total_chunks) nt = (unsigned)c.total_chunks;
  if (nt == 0) nt = 1;
  pthread_t th[PREFAULT_THREADS_MAX];
  if (nt > PREFAULT_THREADS_MAX) nt = PREFAULT_THREADS_MAX;
  /* a first report of 0 as the work starts: the first chunk's took a while
   * to come, and 'umbp pool create' learns from it that the file is its own
   * (to remove on Ctrl-C) */
  if (c.progress) c.progress(c.arg, "prefault", 0, c.len);
  unsigned started = 0;
  for (unsigned i = 0; i < nt; i++)
    if (pthread_create(&th[i], NULL, prefault_thread, &c) == 0) started++;
  if (started == 0) prefault_thread(&c);
  for (unsigned i = 0; i < started; i++) pthread_join(th[i], NULL);
  pthread_mutex_destroy(&c.mu);
  int e = atomic_load(&c.err);
  if (e == EFAULT || e == ENOMEM || e == EIO)
    return umbp_fail(-ENOMEM, "pre-faulting the pool failed (%s): memory ran out while the pool was "
                              "being populated; choose a smaller --capacity",
                     strerror(e));
  if (e) umbp_log(UMBP_LOG_WARN, "pre-faulting stopped early (%s); pages fault in on first use", strerror(e));
  return 0;
}

/* no_prefault: reserve the slot bytes' blocks in /dev/shm without mapping
 * them (posix_fallocate after place_partitions(), so they follow the NUMA
 * policy). A page first touched later then never finds /dev/shm full: a
 * shmem fault that cannot allocate raises SIGBUS in whoever writes the
 * block, and no one can handle that. Costs the memory at creation, as
 * pre-faulting does, but not the page-table work of every mapping. */
static int reserve_arena(struct umbp_pool *p, const umbp_pool_params *pp) {
  const struct umbp_region_desc *a = &p->hdr->regions[UMBP_REG_ARENA];
  /* one call, no finer progress: 0 as it starts (so that 'umbp pool create'
   * knows the file is its own, to remove on Ctrl-C), the total when done */
  if (pp->progress) pp->progress(pp->progress_arg, "reserve", 0, a->size);
  int e = posix_fallocate(p->fd, (off_t)a->offset, (off_t)a->size);
  if (e == 0 && pp->progress) pp->progress(pp->progress_arg, "reserve", a->size, a->size);
  if (e == 0) return 0;
  char b[32];
  if (e == EOPNOTSUPP || e == EINVAL) {
    umbp_log(UMBP_LOG_WARN, "pool '%s': the file system of %s cannot reserve the %s of slot bytes (%s): they are "
                            "taken on first use, and a full file system then kills a writer with SIGBUS",
             p->name, p->path, fmt_gib(a->size, b, sizeof b), strerror(e));
    return 0;
  }
  return umbp_fail(e == ENOSPC || e == ENOMEM ? -ENOSPC : -e,
                   "cannot reserve the pool's %s of slot bytes in %s (%s): free space there or choose a smaller "
                   "--capacity",
                   fmt_gib(a->size, b, sizeof b), SHM_DIR, strerror(e));
}

/* Ask for transparent huge pages on the metadata (buckets, slot metadata):
 * lookups touch them at random, and 4 KiB pages make each miss a TLB miss too.
 * Takes effect where the kernel allows huge pages for shared memory
 * (/sys/kernel/mm/transparent_hugepage/shmem_enabled = advise or within_size);
 * elsewhere it is a no-op. */
static void advise_metadata(void *base, uint64_t len) {
#ifdef MADV_HUGEPAGE
  if (len) (void)madvise(base, len, MADV_HUGEPAGE);
#else
  (void)base;
  (void)len;
#endif
}

/* Populate the metadata (everything before the arena: header, registry,
 * index, pins, free queues, events) so that no lookup, pin or remove takes a
 * page fault. creating: allocate it now, whatever no_prefault says (a shmem
 * page first touched inside a remove costs a fault and a page clear, and a
 * full /dev/shm would raise SIGBUS there instead of an error here); attaching
 * read-write: map the creator's pages into this process. 160 MiB for 1M
 * slots (64 B each of slot metadata and pins, 10.2 B of buckets, the free
 * queue's cells); what that costs a creation and an attach: README, "Pools". */
static int populate_metadata(struct umbp_pool *p, bool creating) {
  uint64_t len = p->hdr->regions[UMBP_REG_ARENA].offset;
  if (len > p->size) len = p->size;
  if (!len || madvise(p->base, len, MADV_POPULATE_WRITE) == 0) return 0;
  int e = errno;
  if (e == EINVAL || e == ENOSYS) {
    /* a kernel before 5.14: fault the creator's pages in by touching them;
     * an attacher maps them on first use */
    if (creating) {
      long page = sysconf(_SC_PAGESIZE);
      for (uint64_t o = 0; o < len; o += (uint64_t)page)
        atomic_fetch_add_explicit((_Atomic char *)((char *)p->base + o), 0, memory_order_relaxed);
    }
    return 0;
  }
  if (!creating) return 0; /* pages map in on first use, as without this call */
  return umbp_fail(-ENOMEM, "the pool's index metadata (%llu MiB) could not be allocated (%s): the shared "
                            "memory file system is out of space; free memory or choose a smaller --capacity",
                   (unsigned long long)(len >> 20), strerror(e));
}

/* ---- create / attach ------------------------------------------------------ */
int umbp_registry_claim(struct umbp_pool *p, int role, int rank);
void umbp_registry_release(struct umbp_pool *p);

/* The modules' hooks (module.h), in the list's order; detach in reverse. */
static int modules_init(struct umbp_pool *p) {
  for (unsigned m = 0; m < umbp_shm_n_modules; m++) {
    int rc = umbp_shm_modules[m]->init ? umbp_shm_modules[m]->init(p) : 0;
    if (rc) return rc;
  }
  return 0;
}

static void modules_detach_from(struct umbp_pool *p, unsigned n) {
  while (n--)
    if (umbp_shm_modules[n]->detach) umbp_shm_modules[n]->detach(p);
}

/* On failure the modules attached before the failing one are detached again. */
static int modules_attach(struct umbp_pool *p) {
  for (unsigned m = 0; m < umbp_shm_n_modules; m++) {
    int rc = umbp_shm_modules[m]->attach ? umbp_shm_modules[m]->attach(p) : 0;
    if (rc) {
      modules_detach_from(p, m);
      return rc;
    }
  }
  return 0;
}

/* ---- this process's attached handles ---------------------------------------
 * umbp_pool_detach() frees the handle, so a second detach of one pointer (two
 * owners of a handle, a cleanup path run twice: the caller's bug, but an easy
 * one) freed it again and the process aborted. Detach acts only on a handle
 * this list holds, and takes it off first, so a repeated detach, or two
 * threads detaching one handle at once, finds nothing and does nothing. (A
 * pointer that malloc has since handed out again for a new handle is that
 * handle: no list can tell the two apart.) The lock is never held across
 * another lock or a module hook; fork() children get it unlocked. */
static pthread_mutex_t live_mu = PTHREAD_MUTEX_INITIALIZER;
static struct umbp_pool *live_head;
static pthread_once_t live_once = PTHREAD_ONCE_INIT;
static void live_lock(void) { pthread_mutex_lock(&live_mu); }
static void live_unlock(void) { pthread_mutex_unlock(&live_mu); }
static void live_atfork(void) { pthread_atfork(live_lock, live_unlock, live_unlock); }

static uint64_t live_serial; /* under live_mu */

static void live_add(struct umbp_pool *p) {
  pthread_once(&live_once, live_atfork);
  live_lock();
  p->attach_serial = ++live_serial;
  p->live_next = live_head;
  live_head = p;
  live_unlock();
}

/* Take p off the list: whether it was on it. */
static bool live_take(struct umbp_pool *p) {
  live_lock();
  struct umbp_pool **pp = &live_head;
  while (*pp && *pp != p) pp = &(*pp)->live_next;
  bool found = *pp != NULL;
  if (found) *pp = p->live_next;
  live_unlock();
  return found;
}

bool umbp_pool_attached(const umbp_pool *p, uint64_t serial) {
  pthread_once(&live_once, live_atfork);
  live_lock();
  const struct umbp_pool *q = live_head;
  while (q && q != p) q = q->live_next;
  bool found = q && q->attach_serial == serial;
  live_unlock();
  return found;
}

static struct umbp_pool *pool_new(void) {
  struct umbp_pool *p = calloc(1, sizeof *p);
  if (!p) return NULL;
  p->fd = -1;
  p->proc_slot = -1;
  p->attach_pid = getpid();
  return p;
}

static void pool_free(struct umbp_pool *p) {
  if (!p) return;
  if (p->base && p->base != MAP_FAILED) munmap(p->base, p->size);
  if (p->fd >= 0) close(p->fd);
  free(p);
}

/* "try" fell back: the reason is the last error (index_huge_where()'s or
 * the index file's, ended by index_fix_end(true)). */
static void index_fallback_note(const char *name) {
  umbp_log(UMBP_LOG_INFO, "pool '%s': index on 4 KiB pages, lookups slower than on 2 MiB pages (README, \"Index "
                          "pages\"): %s; --index-pages small has no note",
           name, umbp_last_error());
}

/* Create with pp->index_pages resolved to HUGE or SMALL. try: HUGE that
 * cannot be had falls back to the pool's own pages, with a note: before
 * anything is made (no mount, too few free pages: the usual case) by laying
 * the pool out as SMALL; if making or mapping the index file fails after
 * that check (pages taken meanwhile), by keeping the huge layout without its
 * feature bit, the range mapped from the main file as every other region
 * (the same file: an attacher already waiting for it is not left behind). */
static int pool_create_once(const char *name, const umbp_pool_params *pp, umbp_pool **ret_pool, bool fallback) {
  int rc;
  if (pp->capacity == 0)
    return umbp_fail(-EINVAL, "pool capacity is 0: give a size such as --capacity 8GiB");
  if (pp->mempolicy < UMBP_MPOL_BIND || pp->mempolicy > UMBP_MPOL_NONE)
    return umbp_fail(-EINVAL, "unknown memory policy %d: use bind, preferred, interleave or none", pp->mempolicy);
  int nodes[UMBP_MAX_PARTITIONS];
  unsigned n_nodes = 0;
  rc = choose_nodes(pp, nodes, &n_nodes);
  if (rc) return rc;
  struct umbp_shm_header lay;
  rc = umbp_layout_compute(pp, nodes, n_nodes, &lay);
  if (rc) return rc;

  char dir[160] = SHM_DIR;
  if (pp->hugepages) {
    if (pp->hugetlbfs_dir && strlen(pp->hugetlbfs_dir) >= sizeof dir)
      return umbp_fail(-EINVAL, "hugetlbfs directory path is longer than %zu bytes", sizeof dir - 1);
    if (pp->hugetlbfs_dir) {
      snprintf(dir, sizeof dir, "%s", pp->hugetlbfs_dir);
      if ((rc = check_hugetlbfs_dir(dir)) || (rc = check_first_hugetlbfs(dir, sizeof dir))) return rc;
    } else if (umbp_hugetlbfs_mount(dir, sizeof dir) < 0)
      return umbp_fail(-ENOENT, "--hugepages needs a hugetlbfs mount and none is in /proc/mounts: mount "
                                "one (mount -t hugetlbfs none /dev/hugepages) and reserve pages (sysctl "
                                "vm.nr_hugepages=N), or drop --hugepages");
    struct statvfs sv;
    if (statvfs(dir, &sv) == 0 && sv.f_bsize > 0) lay.total_size = align_up(lay.total_size, sv.f_bsize);
  }
  if ((rc = name_taken_elsewhere(name, dir))) return rc;
  rc = check_fits(pp, &lay, dir, pp->hugepages);
  if (rc) return rc;
  bool ihuge = (lay.incompat_features & UMBP_FEAT_INCOMPAT_INDEX_HUGE) != 0;
  uint64_t ioff = 0, ilen = 0;
  char idir[160], ipath[256] = "";
  if (ihuge) {
    umbp_index_huge_range(&lay, &ioff, &ilen);
    if ((rc = index_huge_where(ilen, idir, sizeof idir, pp->group_access ? pp->group : (gid_t)-1, fallback))) {
      if (!fallback) return rc;
      index_fallback_note(name);
      umbp_pool_params q = *pp;
      q.index_pages = UMBP_INDEX_PAGES_SMALL;
      if ((rc = umbp_layout_compute(&q, nodes, n_nodes, &lay))) return rc;
      ihuge = false;
      ioff = ilen = 0;
    }
  }

  struct umbp_pool *p = pool_new();
  if (!p) return umbp_fail(-ENOMEM, "pool '%s': no memory for this process's handle", name);
  mode_t mode = pp->group_access ? 0660 : 0600;
  int fd = create_pool_file(name, mode, pp->hugepages, pp->hugepages ? dir : NULL, p->path, sizeof p->path);
  if (fd < 0) {
    pool_free(p);
    return fd;
  }
  p->fd = fd;
  p->created = true;
  snprintf(p->name, sizeof p->name, "%s", name);
  p->hugepages = pp->hugepages;
  if ((rc = name_taken_elsewhere(name, dir))) goto fail_unlink; /* created there meanwhile */
  /* shm_open applies the umask: set the mode we promise explicitly */
  if (fchmod(fd, mode) != 0) umbp_log(UMBP_LOG_WARN, "fchmod(%o) of %s failed: %s", mode, p->path, strerror(errno));
  if (pp->group_access && pp->group != (gid_t)-1 && fchown(fd, (uid_t)-1, pp->group) != 0) {
    rc = umbp_fail(-errno, "cannot give pool '%s' to group %u: %s (you must be a member of the group)", name,
                   (unsigned)pp->group, strerror(errno));
    goto fail_unlink;
  }
  if (ftruncate(fd, (off_t)lay.total_size) != 0) {
    rc = umbp_fail(-errno == -EINVAL ? -ENOSPC : -errno, "cannot size pool '%s' to %llu bytes: %s", name,
                   (unsigned long long)lay.total_size, strerror(errno));
    goto fail_unlink;
  }
  p->size = lay.total_size;
  p->base = ihuge ? map_aligned(fd, p->size, PROT_READ | PROT_WRITE)
                  : mmap(NULL, p->size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p->base == MAP_FAILED) {
    p->base = NULL;
    rc = umbp_fail(errno == ENOMEM ? -ENOMEM : -errno, "cannot map pool '%s' (%llu bytes): %s", name,
                   (unsigned long long)p->size, strerror(errno));
    goto fail_unlink;
  }
  if (ihuge) {
    /* The main file's O_EXCL creation made the name ours: an index file of
     * that name is a leftover of a pool whose main file was removed alone. */
    index_file_path(idir, name, ipath, sizeof ipath);
    (void)unlink(ipath);
    int ifd = open(ipath, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, mode);
    if (ifd < 0) {
      rc = errno == EACCES || errno == EPERM
               ? index_dir_denied(errno, idir, pp->group_access ? pp->group : (gid_t)-1, fallback)
               : umbp_fail(-errno, "cannot create the index file %s: %s", ipath, strerror(errno));
      ipath[0] = '\0';
    } else {
      if (fchmod(ifd, mode) != 0) umbp_log(UMBP_LOG_WARN, "fchmod(%o) of %s failed: %s", mode, ipath, strerror(errno));
      if (pp->group_access && pp->group != (gid_t)-1 && fchown(ifd, (uid_t)-1, pp->group) != 0)
        rc = umbp_fail(-errno, "cannot give %s to group %u: %s", ipath, (unsigned)pp->group, strerror(errno));
      else if (ftruncate(ifd, (off_t)ilen) != 0)
        rc = umbp_fail(-errno, "cannot size the index file %s to %llu bytes: %s", ipath,
                       (unsigned long long)ilen, strerror(errno));
      /* MAP_SHARED of hugetlbfs reserves every page now: too few fails
       * here (ENOMEM), never later as a SIGBUS inside a lookup */
      else if ((rc = map_index(p, ifd, ipath, ioff, ilen, PROT_READ | PROT_WRITE)) != 0)
        rc = umbp_fail(rc, "cannot map the index file %s (%llu huge pages of 2 MiB): %s; reserve more "
                           "(sysctl vm.nr_hugepages=N)%s",
                       ipath, (unsigned long long)(ilen / UMBP_PART_ALIGN), strerror(-rc), index_fix_end(fallback));
      close(ifd);
    }
    if (rc && fallback) {
      index_fallback_note(name);
      if (ipath[0]) unlink(ipath);
      ipath[0] = '\0';
      p->index_huge_bytes = 0;
      lay.incompat_features &= ~UMBP_FEAT_INCOMPAT_INDEX_HUGE;
      /* a failed MAP_FIXED leaves the range unmapped: the main file's pages there */
      rc = mmap((char *)p->base + ioff, ilen, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, (off_t)ioff) ==
                   MAP_FAILED
               ? umbp_fail(-errno, "cannot map pool '%s': %s", name, strerror(errno))
               : 0;
    }
    if (rc) goto fail_unlink;
  }
  p->hdr = p->base;
  advise_metadata(p->base, lay.regions[UMBP_REG_ARENA].offset);
  /* header without magic */
  memcpy((char *)p->hdr + 8, (char *)&lay + 8, sizeof lay - 8);
  struct umbp_shm_header *h = p->hdr;
  if (getrandom(h->uuid, sizeof h->uuid, 0) != (ssize_t)sizeof h->uuid) {
    uint64_t t = umbp_now_ns() ^ (uint64_t)getpid();
    memcpy(h->uuid, &t, 8);
    t = umbp_fnv1a(&t, 8, umbp_realtime_ns());
    memcpy(h->uuid + 8, &t, 8);
  }
  h->created_ns = umbp_realtime_ns();
  h->creator_pid = getpid();
  h->creator_uid = getuid();
  snprintf(h->name, sizeof h->name, "%s", name);
  h->header_checksum = umbp_header_checksum(h);
  atomic_store_explicit(&h->run_generation, 1, memory_order_relaxed);
  p->procs = umbp_pool_region(p, UMBP_REG_REGISTRY);

  place_partitions(p, pp->mempolicy);
  rc = populate_metadata(p, true);
  if (rc) goto fail_unlink;
  if (!pp->no_prefault) {
    rc = prefault(p, pp);
    if (rc) goto fail_unlink;
  } else if (!pp->no_reserve && !p->hugepages) { /* hugetlbfs: MAP_SHARED reserved the pages at mmap */
    rc = reserve_arena(p, pp);
    if (rc) goto fail_unlink;
  } else if (!p->hugepages) {
    char a[32];
    umbp_log(UMBP_LOG_WARN, "pool '%s': its %s of slot bytes are neither pre-faulted nor reserved (no_reserve): if "
                            "%s fills up later, a process writing a block dies of SIGBUS",
             name, fmt_gib(p->hdr->regions[UMBP_REG_ARENA].size, a, sizeof a), SHM_DIR);
  }
  rc = modules_init(p);
  if (rc) goto fail_unlink;
  rc = umbp_registry_claim(p, UMBP_ROLE_OTHER, -1);
  if (rc) goto fail_unlink;
  rc = modules_attach(p);
  if (rc) goto fail_unlink;
  /* Publish: pairs with the acquire load in wait_magic()/umbp_header_validate(). */
  atomic_store_explicit(&h->magic, UMBP_MAGIC, memory_order_release);
  create_lock(fd, F_UNLCK); /* after the magic: half_made() reads the lock, then the magic */
  live_add(p);
  umbp_sigbus_watch(p);
  *ret_pool = p;
  return 0;

fail_unlink:
  if (ipath[0]) unlink(ipath);
  if (p->hugepages) unlink(p->path);
  else {
    char shm_name[UMBP_NAME_MAX + 8];
    snprintf(shm_name, sizeof shm_name, "/umbp.%s", name);
    shm_unlink(shm_name);
  }
  pool_free(p);
  return rc;
}

UMBP_API int umbp_pool_create(const char *name, const umbp_pool_params *pp, umbp_pool **ret_pool) {
  int rc = umbp_pool_name_valid(name);
  if (rc) return rc;
  /* Refused for new pools only: every command would read such a name as an
   * option. A pool made by an older build keeps its name valid for attach,
   * destroy and the listings. */
  if (name[0] == '-')
    return umbp_fail(-EINVAL, "pool name '%s' starts with '-', which commands read as an option: start it with a "
                              "letter, a digit, '.' or '_'", name);
  /* Also for new pools only: umbp.NAME.feed, .tier and .ipc are the side
   * files of pool NAME (index/events.c, tier/tierq.c, datapath/dp_ipc.c): a
   * pool of such a name would collide with them, and 'umbp pool destroy
   * NAME' (which removes .feed and .tier) would remove it too. */
  const char *dot = strrchr(name, '.');
  if (dot && dot != name && (!strcmp(dot, ".feed") || !strcmp(dot, ".tier") || !strcmp(dot, ".ipc")))
    return umbp_fail(-EINVAL, "pool name '%s' ends in '%s', the name of a side file of pool '%.*s': choose a "
                              "name that does not end in .feed, .tier or .ipc",
                     name, dot, (int)(dot - name), name);
  if (!pp || !ret_pool) return umbp_fail(-EINVAL, "umbp_pool_create: params and ret_pool are required");
  if (pp->index_pages < UMBP_INDEX_PAGES_TRY || pp->index_pages > UMBP_INDEX_PAGES_SMALL)
    return umbp_fail(-EINVAL, "unknown index page placement %d: use try, huge or small", pp->index_pages);
  umbp_pool_params q = *pp;
  bool fallback = pp->index_pages == UMBP_INDEX_PAGES_TRY && !pp->hugepages;
  /* a hugepage pool's index is on huge pages already */
  q.index_pages = pp->hugepages ? UMBP_INDEX_PAGES_SMALL : fallback ? UMBP_INDEX_PAGES_HUGE : pp->index_pages;
  return pool_create_once(name, &q, ret_pool, fallback);
}

static void sleep_ms(unsigned ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

/* The file umbp.NAME at path that attach opened (fd) or failed to open
 * (a negative errno: a directory gives EISDIR, or EINVAL from shm_open; a
 * symbolic link ELOOP): 0 when it is a regular file or cannot be looked at,
 * else -EINVAL naming what it is and how to remove it (never a pool: umbp
 * makes only regular files, and opens them O_NOFOLLOW). */
static int not_a_pool_file(const char *name, const char *path, int fd) {
  struct stat st;
  const char *what;
  if ((fd >= 0 ? fstat(fd, &st) : lstat(path, &st)) != 0 || S_ISREG(st.st_mode)) return 0;
  else if (S_ISLNK(st.st_mode)) what = "a symbolic link";
  else if (S_ISDIR(st.st_mode)) what = "a directory";
  else if (S_ISFIFO(st.st_mode)) what = "a FIFO";
  else if (S_ISSOCK(st.st_mode)) what = "a socket";
  else if (S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode)) what = "a device node";
  else what = "not a regular file";
  bool dir = !strcmp(what, "a directory");
  return umbp_fail(-EINVAL, "pool '%s': %s is %s, not a umbp pool (pools are regular files): if no other program "
                            "uses it, remove it with '%s %s'",
                   name, path, what, dir ? "rm -r" : "rm", path);
}

UMBP_API int umbp_pool_attach(const char *name, const umbp_attach_opts *opts, umbp_pool **ret_pool) {
  int rc = umbp_pool_name_valid(name);
  if (rc) return rc;
  if (!ret_pool) return umbp_fail(-EINVAL, "umbp_pool_attach: ret_pool is required");
  umbp_attach_opts def;
  if (!opts) {
    umbp_attach_opts_init(&def);
    opts = &def;
  }
  struct umbp_pool *p = pool_new();
  if (!p) return umbp_fail(-ENOMEM, "pool '%s': no memory for this process's handle", name);
  p->read_only = opts->read_only;
  snprintf(p->name, sizeof p->name, "%s", name);
  /* O_NONBLOCK: a FIFO of the pool's name would block the open forever;
   * not_a_pool_file() refuses it, and anything else not a regular file */
  int fd = open_pool_file(name, (opts->read_only ? O_RDONLY : O_RDWR) | O_NONBLOCK, 0, false, NULL, p->path,
                          sizeof p->path);
  if (fd >= 0 || fd == -EISDIR || fd == -EINVAL || fd == -ELOOP) {
    rc = not_a_pool_file(name, p->path, fd);
    if (rc) {
      if (fd >= 0) close(fd);
      pool_free(p);
      return rc;
    }
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  }
  if (fd < 0) {
    pool_free(p);
    if (fd == -ENOENT)
      return umbp_fail(-ENOENT, "no pool named '%s' (looked for %s/umbp.%s): create it with 'umbp pool "
                                "create %s --capacity SIZE', or list pools with 'umbp pool ls'",
                       name, SHM_DIR, name, name);
    if (fd == -EACCES)
      return umbp_fail(-EACCES, "pool '%s' exists but you may not open it %s: it belongs to another user "
                                "(mode 0600); ask its owner to create it with group access",
                       name, opts->read_only ? "for reading" : "for writing");
    return umbp_fail(fd, "cannot open pool '%s': %s", name, strerror(-fd));
  }
  p->fd = fd;
  uint64_t ioff = 0, ilen = 0; /* the index on huge pages, from the validated header */
  unsigned timeout = opts->timeout_ms ? opts->timeout_ms : UMBP_ATTACH_TIMEOUT_MS;
  uint64_t deadline = umbp_now_ns() + (uint64_t)timeout * 1000000ull;
  struct stat st;
  int small_creator = 0;
  for (;;) {
    if (fstat(fd, &st) != 0) {
      rc = umbp_fail(-errno, "cannot stat pool '%s': %s", name, strerror(errno));
      goto fail;
    }
    if ((uint64_t)st.st_size >= UMBP_HEADER_BYTES) {
      /* wait_magic: the acquire load pairs with the creator's release store.
       * The mapping is a whole page of the file's page size (st_blksize: 2 MiB
       * on hugetlbfs, where munmap() of a shorter length fails with EINVAL and
       * would leave the mapping, and the huge page, until the process ends) */
      size_t hlen = UMBP_HEADER_BYTES;
      if (st.st_blksize > 0 && (size_t)st.st_blksize > hlen) hlen = (size_t)st.st_blksize;
      const struct umbp_shm_header *h0 = mmap(NULL, hlen, PROT_READ, MAP_SHARED, fd, 0);
      if (h0 == MAP_FAILED) {
        rc = umbp_fail(-errno, "cannot map pool '%s': %s", name, strerror(errno));
        goto fail;
      }
      uint64_t magic = atomic_load_explicit(&h0->magic, memory_order_acquire);
      int creator = h0->creator_pid;
      if (magic == UMBP_MAGIC) {
        rc = umbp_header_validate(h0, (uint64_t)st.st_size);
        if (rc == 0 && (h0->incompat_features & UMBP_FEAT_INCOMPAT_INDEX_HUGE))
          umbp_index_huge_range(h0, &ioff, &ilen);
        munmap((void *)h0, hlen);
        if (rc) goto fail;
        break;
      }
      munmap((void *)h0, hlen);
      if (magic == 0 && half_made(fd, &st, &creator)) {
        rc = half_made_fail(name, creator);
        goto fail;
      }
      if (magic != 0) {
        rc = umbp_fail(-EBADMSG, "'%s' is not a umbp pool (magic 0x%016llx, expected 0x%016llx): remove it "
                                 "with 'umbp pool destroy %s' if it is stale",
                       name, (unsigned long long)magic, (unsigned long long)UMBP_MAGIC, name);
        goto fail;
      }
      if (umbp_now_ns() > deadline) {
        /* its creator holds the creation lock: alive (half_made() said no).
         * A stopped one never finishes, however long one waits: say so. */
        if (umbp_proc_stopped(creator)) {
          rc = umbp_fail(-ETIMEDOUT,
                         "pool '%s' is still not initialised after %u ms: its creator (pid %d) is stopped (SIGSTOP "
                         "or a debugger) and will not finish it until resumed: resume it (kill -CONT %d), or end it "
                         "(kill -KILL %d) and remove what it left with 'umbp pool destroy %s'",
                         name, timeout, creator, creator, creator, name);
          goto fail;
        }
        rc = umbp_fail(-ETIMEDOUT,
                       "pool '%s' is still not initialised after %u ms: its creator (pid %d) is alive and may still "
                       "be pre-faulting a large pool: retry once it has finished ('umbp pool info %s' describes it then; "
                       "a program waits longer with umbp_attach_opts.timeout_ms)",
                       name, timeout, creator, name);
        goto fail;
      }
    } else if (half_made(fd, &st, &small_creator)) {
      rc = half_made_fail(name, small_creator);
      goto fail;
    } else if (umbp_now_ns() > deadline) {
      rc = umbp_fail(-ETIMEDOUT, "pool '%s' is %lld bytes, smaller than a pool header, after %u ms: it is "
                                 "truncated or was never finished; remove it with 'umbp pool destroy %s'",
                     name, (long long)st.st_size, timeout, name);
      goto fail;
    }
    sleep_ms(ATTACH_POLL_MS);
  }
  int prot = opts->read_only ? PROT_READ : PROT_READ | PROT_WRITE;
  int ifd = -1;
  char ipath[256] = "";
  if (ilen) {
    char idir[160];
    if (umbp_hugetlbfs_mount(idir, sizeof idir) < 0) {
      rc = umbp_fail(-ENOENT, "pool '%s' keeps its index on huge pages (umbp-index.%s on a hugetlbfs mount) "
                              "but no hugetlbfs mount is in /proc/mounts: mount the one it was created on",
                     name, name);
      goto fail;
    }
    index_file_path(idir, name, ipath, sizeof ipath);
    ifd = open(ipath, (opts->read_only ? O_RDONLY : O_RDWR) | O_CLOEXEC | O_NOFOLLOW);
    struct stat ist = {0};
    if (ifd < 0) {
      rc = errno == ENOENT
               ? umbp_fail(-ENOENT, "pool '%s' keeps its index on huge pages in %s, which is missing (removed, or "
                                    "another hugetlbfs mount comes first in /proc/mounts): the pool cannot be "
                                    "used; destroy it ('umbp pool destroy %s') and create it again",
                           name, ipath, name)
           : errno == EACCES
               ? umbp_fail(-EACCES, "pool '%s' exists but you may not open its index file %s %s: give it the pool "
                                    "file's mode and group (chmod/chgrp both files)",
                           name, ipath, opts->read_only ? "for reading" : "for writing")
               : umbp_fail(-errno, "cannot open the index file %s of pool '%s': %s", ipath, name, strerror(errno));
      goto fail;
    }
    if (fstat(ifd, &ist) != 0 || (uint64_t)ist.st_size != ilen) {
      rc = umbp_fail(-EBADMSG, "the index file %s of pool '%s' is %lld bytes, its header says %llu: destroy the "
                               "pool and create it again",
                     ipath, name, (long long)ist.st_size, (unsigned long long)ilen);
      close(ifd);
      goto fail;
    }
  }
  p->size = (size_t)st.st_size;
  p->base = ilen ? map_aligned(fd, p->size, prot) : mmap(NULL, p->size, prot, MAP_SHARED, fd, 0);
  if (p->base == MAP_FAILED) {
    p->base = NULL;
    rc = umbp_fail(-errno, "cannot map pool '%s' (%zu bytes): %s", name, p->size, strerror(errno));
    if (ifd >= 0) close(ifd);
    goto fail;
  }
  if (ifd >= 0) {
    rc = map_index(p, ifd, ipath, ioff, ilen, prot);
    close(ifd);
    if (rc) {
      rc = umbp_fail(rc, "cannot map the index of pool '%s' (%llu bytes of huge pages): %s", name,
                     (unsigned long long)ilen, strerror(-rc));
      goto fail;
    }
  }
  p->hdr = p->base;
  advise_metadata(p->base, p->hdr->regions[UMBP_REG_ARENA].offset < p->size ? p->hdr->regions[UMBP_REG_ARENA].offset : 0);
  /* The file could have been replaced between the check and this mapping: check again. */
  rc = umbp_header_validate(p->hdr, p->size);
  if (rc) goto fail;
  {
    uint64_t o2 = 0, l2 = 0;
    if (p->hdr->incompat_features & UMBP_FEAT_INCOMPAT_INDEX_HUGE) umbp_index_huge_range(p->hdr, &o2, &l2);
    if (o2 != ioff || l2 != ilen) {
      rc = umbp_fail(-EBADMSG, "pool '%s' was replaced while this process attached to it: attach again", name);
      goto fail;
    }
  }
  p->hugepages = (p->hdr->incompat_features & UMBP_FEAT_INCOMPAT_HUGEPAGES) != 0;
  p->procs = umbp_pool_region(p, UMBP_REG_REGISTRY);
  if (!opts->read_only) {
    populate_metadata(p, false);
    rc = umbp_registry_claim(p, opts->role, opts->rank);
    if (rc) goto fail;
    rc = modules_attach(p);
    if (rc) {
      umbp_registry_release(p);
      goto fail;
    }
  }
  live_add(p);
  umbp_sigbus_watch(p);
  *ret_pool = p;
  return 0;
fail:
  pool_free(p);
  return rc;
}

/* ---- fork() ---------------------------------------------------------------
 * A fork() child shares its parent's open file descriptions. The registry's
 * liveness is an OFD lock on the handle's description (registry.c), which
 * the kernel drops only when the description's last reference goes: every
 * fd, and every mapping made from it (a vma holds its file). So a child that
 * merely inherits the handle kept a SIGKILLed parent "alive", its pins and
 * reservations unreaped, until the child exited; closing the child's fd is
 * not enough (its copy of the mapping still refers to the description).
 * The child therefore maps the same file again from a description of its
 * own (opened through /proc/self/fd, so a pool unlinked meanwhile still
 * works; the pool's path otherwise) over the same addresses, and closes the
 * inherited fd. Pointers the child holds into the pool stay valid, but the
 * handle is marked forked: the child is another process and has no registry
 * slot, so every call fails with -ECHILD (umbp_pool_forked_fail()). The
 * hot path pays nothing: the child's handle has no index state, which every
 * index call checks already (ix_get()). If no new description can be
 * opened (no /proc, file gone and /proc absent) the old mapping stays, and
 * the parent looks alive until the child exits or execs, as before. */
static void remap_from(umbp_pool *p, int nfd, uint64_t off, uint64_t len) {
  if (!len) return;
  /* MAP_FIXED replaces the inherited vma, dropping its file reference */
  mmap((char *)p->base + off, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, nfd, (off_t)off);
}

void umbp_pool_fork_child(umbp_pool *p) {
  p->forked = true;
  if (p->fd >= 0 && !p->read_only && p->base) {
    /* "/proc/self/fd/N" without snprintf (the child of a threaded process
     * may only make async-signal-safe calls) */
    char path[32] = "/proc/self/fd/", digits[12];
    unsigned n = 0, v = (unsigned)p->fd;
    do digits[n++] = (char)('0' + v % 10), v /= 10;
    while (v && n < sizeof digits);
    size_t l = strlen(path);
    while (n) path[l++] = digits[--n];
    path[l] = 0;
    int nfd = open(path, O_RDWR | O_CLOEXEC);
    if (nfd < 0) nfd = open(p->path, O_RDWR | O_CLOEXEC | O_NOFOLLOW);
    if (nfd >= 0) {
      if (p->index_huge_bytes) { /* the index range is mapped from its own file, which holds no lock */
        uint64_t ioff = 0, ilen = 0;
        umbp_index_huge_range(p->hdr, &ioff, &ilen);
        remap_from(p, nfd, 0, ioff);
        remap_from(p, nfd, ioff + ilen, p->size - (ioff + ilen));
      } else {
        remap_from(p, nfd, 0, p->size);
      }
      close(nfd);
    }
  }
  if (p->fd >= 0) close(p->fd);
  p->fd = -1;
  /* no registry slot of its own: detach touches nothing shared */
  p->read_only = true;
  p->proc_slot = -1;
  p->owner_id = 0;
}

int umbp_pool_forked_fail(const umbp_pool *p) {
  return umbp_fail(-ECHILD, "this handle of pool '%s' was inherited through fork() from process %d: a child may "
                            "not use its parent's handle (it would act under the parent's registry slot); call "
                            "umbp_pool_attach() in the child (or exec first), and umbp_pool_detach() the inherited "
                            "handle to free it",
                   p->name, p->attach_pid);
}

UMBP_API void umbp_pool_detach(umbp_pool *p) {
  if (!p) return;
  if (!live_take(p)) {
    umbp_log(UMBP_LOG_WARN, "umbp_pool_detach: %p is not an attached pool handle of this process (detached "
                            "already?): ignored", (void *)p);
    return;
  }
  if (p->forked)
    for (unsigned m = 0; m < umbp_shm_n_modules; m++)
      if (umbp_shm_modules[m]->forget) umbp_shm_modules[m]->forget(p);
  if (!p->read_only) {
    modules_detach_from(p, umbp_shm_n_modules);
    umbp_registry_release(p);
  }
  umbp_sigbus_forget(p); /* after the detach's writes to the mapping, before the unmap */
  pool_free(p);
}

UMBP_API int umbp_pool_destroy(const char *name) {
  int rc = umbp_pool_name_valid(name);
  if (rc) return rc;
  char shm_name[UMBP_NAME_MAX + 16];
  snprintf(shm_name, sizeof shm_name, "/umbp.%s", name);
  char dir[160], path[256];
  bool hdir = umbp_hugetlbfs_mount(dir, sizeof dir) == 0;
  int e = shm_unlink(shm_name) == 0 ? 0 : errno;
  if (e == ENOENT && hdir) {
    snprintf(path, sizeof path, "%s/umbp.%s", dir, name);
    e = unlink(path) == 0 ? 0 : errno;
  }
  /* its index file (where it has one), also one left alone by a removal of
   * the main file only */
  if ((e == 0 || e == ENOENT) && hdir) {
    index_file_path(dir, name, path, sizeof path);
    if (unlink(path) == 0) e = 0;
  }
  if (e == 0) {
    /* files that live beside the pool: the published-key feed (index/events.c)
     * and the tier's request table (tier/tierq.c); mappings stay valid */
    snprintf(shm_name, sizeof shm_name, "/umbp.%s.feed", name);
    shm_unlink(shm_name);
    snprintf(shm_name, sizeof shm_name, "/umbp.%s.tier", name);
    shm_unlink(shm_name);
    return 0;
  }
  if (e == ENOENT) return umbp_fail(-ENOENT, "no pool named '%s' (see 'umbp pool ls')", name);
  if (e == EACCES || e == EPERM) {
    /* name the owner and what to do: /dev/shm (sticky) lets only a file's
     * owner, or root, remove it */
    struct stat st;
    snprintf(path, sizeof path, "%s/umbp.%s", SHM_DIR, name);
    int sr = stat(path, &st);
    if (sr != 0 && hdir) {
      snprintf(path, sizeof path, "%s/umbp.%s", dir, name);
      sr = stat(path, &st);
    }
    if (sr == 0 && st.st_uid != geteuid())
      return umbp_fail(-EACCES, "cannot remove pool '%s': its file %s belongs to uid %u, and only its owner (or "
                                "root) may remove it: run 'umbp pool destroy %s' as that user",
                       name, path, (unsigned)st.st_uid, name);
    return umbp_fail(-EACCES, "cannot remove pool '%s': it belongs to another user", name);
  }
  if (e == EISDIR)
    return umbp_fail(-EISDIR, "cannot remove pool '%s': %s/umbp.%s is a directory, not a umbp pool: if no other "
                              "program uses it, remove it with 'rm -r %s/umbp.%s'",
                     name, SHM_DIR, name, SHM_DIR, name);
  return umbp_fail(-e, "cannot remove pool '%s': %s", name, strerror(e));
}

UMBP_API int umbp_pool_get_info(umbp_pool *p, umbp_pool_info *out) {
  if (!p || !out) return umbp_fail(-EINVAL, "umbp_pool_get_info: pool and ret_info are required");
  const struct umbp_shm_header *h = p->hdr;
  umbp_pool_info i;
  memset(&i, 0, sizeof i);
  snprintf(i.name, sizeof i.name, "%s", p->name);
  snprintf(i.path, sizeof i.path, "%s", p->path);
  i.layout_major = h->layout_major;
  i.layout_minor = h->layout_minor;
  i.compat_features = h->compat_features;
  i.incompat_features = h->incompat_features;
  i.abi_fingerprint = h->abi_fingerprint;
  i.total_size = h->total_size;
  i.slot_size = h->slot_size;
  i.slot_count = h->slot_count;
  i.n_partitions = h->n_partitions;
  for (unsigned k = 0; k < h->n_partitions; k++) {
    i.partitions[k].numa_node = h->partitions[k].numa_node;
    i.partitions[k].mempolicy = (int)h->partitions[k].mempolicy;
    i.partitions[k].first_slot = h->partitions[k].first_slot;
    i.partitions[k].slot_count = h->partitions[k].slot_count;
    i.partitions[k].bytes = h->partitions[k].bytes;
  }
  memcpy(i.uuid, h->uuid, 16);
  i.run_generation = atomic_load_explicit(&h->run_generation, memory_order_relaxed);
  i.created_ns = h->created_ns;
  i.creator_pid = h->creator_pid;
  i.creator_uid = h->creator_uid;
  i.hugepages = p->hugepages;
  i.index_hugepages = p->index_huge_bytes != 0;
  i.index_huge_bytes = p->index_huge_bytes;
  i.max_procs = h->max_procs;
  for (unsigned s = 0; s < UMBP_MAX_PROCS; s++) {
    if (atomic_load_explicit(&p->procs[s].state, memory_order_acquire) == UMBP_PROC_FREE) continue;
    if (umbp_registry_alive(p, s)) i.procs_live++;
    else i.procs_dead++;
  }
  for (unsigned m = 0; m < umbp_shm_n_modules; m++) /* free slots per partition (the index) */
    if (umbp_shm_modules[m]->info) umbp_shm_modules[m]->info(p, &i);
  *out = i;
  return 0;
}
