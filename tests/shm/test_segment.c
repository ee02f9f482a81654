/* SPDX-License-Identifier: Apache-2.0 */
/* Segment lifecycle, header validation, registry liveness and reaping. */
#include <fcntl.h>
#include <pthread.h>
#include <pwd.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statvfs.h>

#include "test_util.h"

#include "common/common.h"
#include "index/index_shm.h" /* UMBP_MAX_SLOTS */
#include "shm/module.h"
#include "shm/pool_internal.h"
#include "umbp/index.h"
#include "umbp/pool.h"

static umbp_pool_params small_params(void) {
  umbp_pool_params pp;
  umbp_pool_params_init(&pp);
  pp.capacity = 16 << 20;
  pp.slot_size = 64 << 10;
  return pp;
}

static umbp_pool *create_small(const char *name) {
  umbp_pool_params pp = small_params();
  umbp_pool *p = NULL;
  int rc = umbp_pool_create(name, &pp, &p);
  if (rc) fprintf(stderr, "create %s: %s\n", name, umbp_last_error());
  assert_int_equal(rc, 0);
  return p;
}

static void shm_path(const char *name, char *buf, size_t n) { snprintf(buf, n, "/dev/shm/umbp.%s", name); }

static bool file_exists(const char *dir, const char *prefix, const char *name) {
  char path[512];
  snprintf(path, sizeof path, "%s/%s%s", dir, prefix, name);
  return access(path, F_OK) == 0;
}

/* Publish n keys (hash byte i) with their slot's first byte set to i + 1. */
static void publish_n(umbp_pool *p, unsigned n) {
  uint32_t ns;
  assert_int_equal(umbp_ns_register(p, "seg", &ns), 0);
  for (unsigned i = 0; i < n; i++) {
    uint32_t s;
    assert_int_equal(umbp_reserve(p, -1, ns, &s), 0);
    ((unsigned char *)umbp_slot_ptr(p, s))[0] = (unsigned char)(i + 1);
    umbp_key k = {.ns = ns, .hash_len = 1, .hash = {(uint8_t)i}};
    assert_int_equal(umbp_publish(p, s, &k), 0);
  }
}

/* Every key publish_n() wrote is found through handle a, with its bytes. */
static void check_n(umbp_pool *a, unsigned n) {
  uint32_t ns;
  assert_int_equal(umbp_ns_lookup(a, "seg", &ns), 0);
  for (unsigned i = 0; i < n; i++) {
    umbp_key k = {.ns = ns, .hash_len = 1, .hash = {(uint8_t)i}};
    assert_int_equal(umbp_contains(a, &k), 1);
    uint32_t s;
    if (umbp_pool_proc_slot(a) < 0) continue; /* read-only: no pins */
    assert_int_equal(umbp_lookup_pin(a, &k, &s), 0);
    assert_int_equal(((unsigned char *)umbp_slot_ptr(a, s))[0], i + 1);
    assert_int_equal(umbp_unpin(a, s), 0);
  }
}

static void test_lifecycle(void **state) {
  (void)state;
  const char *name = tu_name("life");
  umbp_pool *p = create_small(name);
  umbp_pool_info info;
  assert_int_equal(umbp_pool_get_info(p, &info), 0);
  assert_int_equal(info.slot_count, 256);
  assert_int_equal(info.slot_size, 64 << 10);
  assert_int_equal(info.layout_major, UMBP_LAYOUT_MAJOR);
  assert_true(info.n_partitions >= 1);
  assert_int_equal(info.procs_live, 1);
  assert_true(umbp_pool_proc_slot(p) >= 0);

  /* second creator: -EEXIST, and the first pool is untouched */
  umbp_pool_params pp = small_params();
  umbp_pool *q = NULL;
  assert_int_equal(umbp_pool_create(name, &pp, &q), -EEXIST);
  assert_non_null(strstr(umbp_last_error(), "already exists"));
  assert_null(q);

  /* attach read-write and read-only */
  umbp_pool *a;
  assert_int_equal(umbp_pool_attach(name, NULL, &a), 0);
  assert_int_not_equal(umbp_pool_proc_slot(a), umbp_pool_proc_slot(p));
  umbp_attach_opts o;
  umbp_attach_opts_init(&o);
  o.read_only = true;
  umbp_pool *r;
  assert_int_equal(umbp_pool_attach(name, &o, &r), 0);
  assert_int_equal(umbp_pool_proc_slot(r), -1);
  assert_int_equal(umbp_pool_reap(r), -EROFS);
  uint32_t s;
  assert_int_equal(umbp_reserve(r, 0, 0, &s), -EROFS);
  assert_int_equal(umbp_pool_get_info(r, &info), 0);
  assert_int_equal(info.procs_live, 2);
  umbp_pool_detach(r);
  umbp_pool_detach(a);
  umbp_pool_detach(p);
  umbp_pool_detach(NULL); /* accepts NULL */

  /* mode 0600 by default */
  char path[128];
  struct stat st;
  shm_path(name, path, sizeof path);
  assert_int_equal(stat(path, &st), 0);
  assert_int_equal(st.st_mode & 0777, 0600);

  assert_int_equal(umbp_pool_destroy(name), 0);
  assert_int_equal(umbp_pool_destroy(name), -ENOENT);
  assert_int_equal(umbp_pool_attach(name, NULL, &a), -ENOENT);
  assert_non_null(strstr(umbp_last_error(), "umbp pool create"));
}

static void test_names(void **state) {
  (void)state;
  assert_int_equal(umbp_pool_name_valid("kv-cache_1.2"), 0);
  assert_int_equal(umbp_pool_name_valid(""), -EINVAL);
  assert_int_equal(umbp_pool_name_valid(NULL), -EINVAL);
  assert_int_equal(umbp_pool_name_valid("a/b"), -EINVAL);
  assert_non_null(strstr(umbp_last_error(), "'/'"));
  assert_int_equal(umbp_pool_name_valid(".."), -EINVAL);
  assert_int_equal(umbp_pool_name_valid("sp ace"), -EINVAL);
  char longname[80];
  memset(longname, 'x', 65);
  longname[65] = 0;
  assert_int_equal(umbp_pool_name_valid(longname), -EINVAL);
  longname[64] = 0;
  assert_int_equal(umbp_pool_name_valid(longname), 0);
  umbp_pool_params pp = small_params();
  umbp_pool *p;
  assert_int_equal(umbp_pool_create("bad/name", &pp, &p), -EINVAL);
  assert_int_equal(umbp_pool_attach("bad name", NULL, &p), -EINVAL);
  assert_int_equal(umbp_pool_destroy("../etc"), -EINVAL);
  /* the names of a pool's side files (umbp.NAME.feed, .tier, .ipc) are no pool's */
  const char *side[] = {"kv.feed", "kv.tier", "kv.ipc"};
  for (unsigned i = 0; i < 3; i++) {
    assert_int_equal(umbp_pool_create(side[i], &pp, &p), -EINVAL);
    assert_non_null(strstr(umbp_last_error(), "side file of pool 'kv'"));
  }
}

/* Every failing call sets umbp_last_error() (common.h): these returned
 * -EINVAL for a NULL argument and left the message of an earlier, unrelated
 * failure in place. */
static void test_null_arguments_say_why(void **state) {
  (void)state;
  umbp_pool_info info;
  assert_int_equal(umbp_pool_name_valid("a/b"), -EINVAL); /* an unrelated message first */
  assert_int_equal(umbp_pool_get_info(NULL, &info), -EINVAL);
  assert_non_null(strstr(umbp_last_error(), "umbp_pool_get_info"));
  assert_int_equal(umbp_pool_name_valid("a/b"), -EINVAL);
  assert_int_equal(umbp_pool_reap(NULL), -EINVAL);
  assert_non_null(strstr(umbp_last_error(), "pool is NULL"));
  assert_int_equal(umbp_pool_name_valid("a/b"), -EINVAL);
  assert_int_equal(umbp_pool_list_procs(NULL, NULL, 0), -EINVAL);
  assert_non_null(strstr(umbp_last_error(), "umbp_pool_list_procs"));
  const char *name = tu_name("nullargs");
  umbp_pool *p = create_small(name);
  assert_int_equal(umbp_pool_name_valid("a/b"), -EINVAL);
  assert_int_equal(umbp_pool_get_info(p, NULL), -EINVAL);
  assert_non_null(strstr(umbp_last_error(), "ret_info"));
  assert_int_equal(umbp_pool_list_procs(p, NULL, 3), -EINVAL);
  assert_non_null(strstr(umbp_last_error(), "max = 3"));
  assert_int_equal(umbp_pool_list_procs(p, NULL, 0), 0);
  umbp_pool_detach(p);
  assert_int_equal(umbp_pool_destroy(name), 0);
}

static int detach_warnings;
static void count_detach_warning(void *arg, int level, const char *msg) {
  (void)arg;
  if (level == UMBP_LOG_WARN && strstr(msg, "umbp_pool_detach")) detach_warnings++;
}

/* A second umbp_pool_detach() of one handle (a cleanup path run twice) freed
 * the handle again and aborted the process; it does nothing now, for
 * read-write and read-only handles, and leaves the pool and its other
 * handles as they were. */
static void test_detach_twice(void **state) {
  (void)state;
  const char *name = tu_name("detach2");
  umbp_pool *p = create_small(name);
  uint32_t ns, s;
  assert_int_equal(umbp_ns_register(p, "seg", &ns), 0);
  umbp_key k = {.ns = ns, .hash_len = 1, .hash = {7}};
  assert_int_equal(umbp_reserve(p, -1, ns, &s), 0);
  assert_int_equal(umbp_publish(p, s, &k), 0);
  umbp_pool *a, *r;
  umbp_attach_opts o;
  umbp_attach_opts_init(&o);
  o.read_only = true;
  assert_int_equal(umbp_pool_attach(name, NULL, &a), 0);
  assert_int_equal(umbp_pool_attach(name, &o, &r), 0);
  umbp_log_set(count_detach_warning, NULL, UMBP_LOG_DEBUG);
  detach_warnings = 0;
  umbp_pool_detach(a);
  umbp_pool_detach(a);
  umbp_pool_detach(r);
  umbp_pool_detach(r);
  umbp_log_set(NULL, NULL, UMBP_LOG_INFO);
  assert_int_equal(detach_warnings, 2);
  umbp_pool_info info;
  assert_int_equal(umbp_pool_get_info(p, &info), 0);
  assert_int_equal(info.procs_live, 1);
  assert_int_equal(umbp_contains(p, &k), 1);
  umbp_pool_detach(p);
  umbp_pool_detach(p);
  assert_int_equal(umbp_pool_destroy(name), 0);
}

static void test_bad_params(void **state) {
  (void)state;
  const char *name = tu_name("params");
  umbp_pool *p;
  umbp_pool_params pp = small_params();
  pp.capacity = 0;
  assert_int_equal(umbp_pool_create(name, &pp, &p), -EINVAL);
  pp = small_params();
  pp.slot_size = 1000;
  assert_int_equal(umbp_pool_create(name, &pp, &p), -EINVAL);
  assert_non_null(strstr(umbp_last_error(), "multiple of 64"));
  pp = small_params();
  pp.capacity = pp.slot_size; /* one slot */
  assert_int_equal(umbp_pool_create(name, &pp, &p), -EINVAL);
  pp = small_params();
  pp.n_numa_nodes = 1;
  pp.numa_nodes[0] = 99;
  assert_int_equal(umbp_pool_create(name, &pp, &p), -EINVAL);
  assert_non_null(strstr(umbp_last_error(), "99"));
  pp = small_params();
  pp.n_numa_nodes = 2;
  pp.numa_nodes[0] = 0;
  pp.numa_nodes[1] = 0;
  assert_int_equal(umbp_pool_create(name, &pp, &p), -EINVAL);
  pp = small_params();
  pp.mempolicy = 42;
  assert_int_equal(umbp_pool_create(name, &pp, &p), -EINVAL);
  assert_int_equal(umbp_pool_create(name, NULL, &p), -EINVAL);
  /* nothing was left behind */
  char path[128];
  shm_path(name, path, sizeof path);
  assert_int_not_equal(access(path, F_OK), 0);
}

/* Pages this process has faulted in so far (minor and major faults). */
static long page_faults(void) {
  struct rusage ru;
  assert_int_equal(getrusage(RUSAGE_SELF, &ru), 0);
  return ru.ru_minflt + ru.ru_majflt;
}

/* A "NAME:  N kB" line of /proc/self/status, in kB; -1 without one. */
static long status_kb(const char *key) {
  FILE *f = fopen("/proc/self/status", "r");
  char line[256];
  long v = -1;
  size_t kl = strlen(key);
  while (f && fgets(line, sizeof line, f))
    if (!strncmp(line, key, kl) && line[kl] == ':') v = atol(line + kl + 1);
  if (f) fclose(f);
  return v;
}

static void test_too_big_refused_before_allocation(void **state) {
  (void)state;
  const char *name = tu_name("big");
  umbp_pool_params pp = small_params();
  pp.capacity = 1ull << 50; /* 1 PiB */
  pp.slot_size = 1 << 30;   /* keeps the slot count small: the check is on bytes */
  umbp_pool *p;
  /* "nothing large was touched" counted in pages this process faulted in,
   * not in seconds (a wall-clock bound is flaky on a loaded machine and
   * holds on a fast one that touches gigabytes) */
  long faults0 = page_faults();
  /* and in peak RSS, which counts a transparent huge page as 2 MiB where
   * it is one fault: "5" to clear_refs resets the peak to the current RSS
   * (Linux 4.0); where that is refused only the faults are counted */
  int cr = open("/proc/self/clear_refs", O_WRONLY);
  bool hwm_reset = cr >= 0 && write(cr, "5", 1) == 1;
  if (cr >= 0) close(cr);
  long rss0 = status_kb("VmRSS");
  int rc = umbp_pool_create(name, &pp, &p);
  long faults = page_faults() - faults0, peak_growth_kb = status_kb("VmHWM") - rss0;
  assert_true(rc == -ENOSPC || rc == -ENOMEM);
  const char *msg = umbp_last_error();
  assert_true(strstr(msg, "--capacity") != NULL);
  if (rc == -ENOSPC) assert_non_null(strstr(msg, "shm-size"));
  char path[128];
  shm_path(name, path, sizeof path);
  assert_int_not_equal(access(path, F_OK), 0); /* no file was created */
  /* 1M slots of metadata alone are 64 MiB (16384 pages); refusing takes a
   * few dozen pages of stack, heap and error text */
  if (faults >= 1024)
    fail_msg("refusing a 1 PiB pool faulted in %ld pages (expected < 1024: nothing large touched)", faults);
  if (hwm_reset && rss0 >= 0 && peak_growth_kb >= 4096)
    fail_msg("refusing a 1 PiB pool raised peak RSS by %ld kB (expected < 4096 kB: nothing large touched)",
             peak_growth_kb);
}

/* Patch the header of a detached pool in place, then try to attach. */
static int attach_after_patch(const char *name, void (*patch)(struct umbp_shm_header *h, int fd), char *msg, size_t n) {
  char path[128];
  shm_path(name, path, sizeof path);
  int fd = open(path, O_RDWR);
  assert_true(fd >= 0);
  struct umbp_shm_header *h = mmap(NULL, UMBP_HEADER_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  assert_true(h != MAP_FAILED);
  patch(h, fd);
  munmap(h, UMBP_HEADER_BYTES);
  close(fd);
  umbp_attach_opts o;
  umbp_attach_opts_init(&o);
  o.timeout_ms = 100;
  umbp_pool *p = NULL;
  int rc = umbp_pool_attach(name, &o, &p);
  snprintf(msg, n, "%s", umbp_last_error());
  if (rc == 0) umbp_pool_detach(p);
  return rc;
}

static void patch_major(struct umbp_shm_header *h, int fd) { (void)fd; h->layout_major = UMBP_LAYOUT_MAJOR + 1; }
static void patch_magic(struct umbp_shm_header *h, int fd) { (void)fd; atomic_store(&h->magic, 0x1234567812345678ull); }
static void patch_fp(struct umbp_shm_header *h, int fd) {
  (void)fd;
  h->abi_fingerprint ^= 1;
  h->header_checksum = umbp_header_checksum(h);
}
static void patch_slotsize(struct umbp_shm_header *h, int fd) { (void)fd; h->slot_size = 12345; }
static void patch_region(struct umbp_shm_header *h, int fd) {
  (void)fd;
  h->regions[UMBP_REG_BUCKETS].offset = h->total_size + 4096;
  h->header_checksum = umbp_header_checksum(h);
}
/* the bucket region moved onto the registry, the checksum made valid */
static void patch_overlap(struct umbp_shm_header *h, int fd) {
  (void)fd;
  h->regions[UMBP_REG_BUCKETS].offset = h->regions[UMBP_REG_REGISTRY].offset;
  h->header_checksum = umbp_header_checksum(h);
}
/* two regions swapped: each inside the file, the order broken */
static void patch_order(struct umbp_shm_header *h, int fd) {
  (void)fd;
  struct umbp_region_desc t = h->regions[UMBP_REG_EVENTS];
  h->regions[UMBP_REG_EVENTS] = h->regions[UMBP_REG_COUNTERS];
  h->regions[UMBP_REG_COUNTERS] = t;
  h->header_checksum = umbp_header_checksum(h);
}
static void patch_truncate(struct umbp_shm_header *h, int fd) {
  (void)h;
  struct stat st;
  fstat(fd, &st);
  assert_int_equal(ftruncate(fd, st.st_size / 2), 0);
}
static void patch_incompat(struct umbp_shm_header *h, int fd) {
  (void)fd;
  h->incompat_features |= 1ull << 40;
  h->header_checksum = umbp_header_checksum(h);
}
static unsigned patch_seed;
static void patch_random(struct umbp_shm_header *h, int fd) {
  (void)fd;
  srand(patch_seed);
  unsigned char *b = (unsigned char *)h;
  int n = 1 + rand() % 8;
  for (int i = 0; i < n; i++) b[8 + rand() % (int)(sizeof *h - 8)] ^= (unsigned char)(1 + rand() % 255);
}

static void test_header_validation(void **state) {
  (void)state;
  char major_msg[64];
  snprintf(major_msg, sizeof major_msg, "layout version %d.%d, this build reads %d.x", UMBP_LAYOUT_MAJOR + 1,
           UMBP_LAYOUT_MINOR, UMBP_LAYOUT_MAJOR);
  struct {
    void (*patch)(struct umbp_shm_header *, int);
    int expect;
    const char *word;
  } cases[] = {
      {patch_major, -EPROTO, major_msg},
      {patch_magic, -EBADMSG, "magic"},
      {patch_fp, -EPROTO, "fingerprint"},
      {patch_slotsize, -EBADMSG, "checksum"},
      {patch_region, -EBADMSG, "outside"},
      {patch_overlap, -EBADMSG, "overlaps"},
      {patch_order, -EBADMSG, "overlaps"},
      {patch_truncate, -EBADMSG, "truncated"},
      {patch_incompat, -EPROTO, "feature bits"},
  };
  char msg[512];
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    const char *name = tu_name("hdr");
    umbp_pool_detach(create_small(name));
    int rc = attach_after_patch(name, cases[i].patch, msg, sizeof msg);
    if (rc != cases[i].expect || !strstr(msg, cases[i].word))
      fprintf(stderr, "case %zu: rc %d msg '%s'\n", i, rc, msg);
    assert_int_equal(rc, cases[i].expect);
    assert_non_null(strstr(msg, cases[i].word));
    assert_int_equal(umbp_pool_destroy(name), 0);
  }
  /* random header bytes: always refused, never a crash */
  const char *name = tu_name("hdr-rand");
  for (patch_seed = 1; patch_seed <= 40; patch_seed++) {
    umbp_pool_detach(create_small(name));
    int rc = attach_after_patch(name, patch_random, msg, sizeof msg);
    assert_true(rc == -EBADMSG || rc == -EPROTO || rc == -ETIMEDOUT);
    assert_int_equal(umbp_pool_destroy(name), 0);
  }
}

static void test_attach_waits_for_creator(void **state) {
  (void)state;
  /* a file that never gets its magic: the attacher waits, then times out */
  const char *name = tu_name("half");
  char path[128], shm[128];
  shm_path(name, path, sizeof path);
  snprintf(shm, sizeof shm, "/umbp.%s", name);
  int fd = shm_open(shm, O_RDWR | O_CREAT | O_EXCL, 0600);
  assert_true(fd >= 0);
  umbp_attach_opts o;
  umbp_attach_opts_init(&o);
  o.timeout_ms = 150;
  umbp_pool *p;
  uint64_t t0 = umbp_now_ns();
  assert_int_equal(umbp_pool_attach(name, &o, &p), -ETIMEDOUT); /* size 0 */
  assert_true(umbp_now_ns() - t0 >= 150000000ull);
  assert_int_equal(ftruncate(fd, 1 << 20), 0);
  struct umbp_shm_header *h = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  h->creator_pid = 999999;
  munmap(h, 4096);
  /* a creator at work holds the creation lock (here: this test, through
   * another open file description): the attacher waits, then times out */
  int cfd = shm_open(shm, O_RDWR, 0);
  struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = UMBP_LOCK_CREATE, .l_len = 1};
  assert_int_equal(fcntl(cfd, F_OFD_SETLK, &fl), 0);
  t0 = umbp_now_ns();
  assert_int_equal(umbp_pool_attach(name, &o, &p), -ETIMEDOUT);
  assert_true(umbp_now_ns() - t0 >= 150000000ull);
  assert_non_null(strstr(umbp_last_error(), "pid 999999) is alive"));
  /* its creator gone (the lock dropped), no magic: half-made, known at once,
   * that is from the lock, without waiting out the 10 s timeout for a magic
   * that will not come. The bound is half the timeout, not a speed: a
   * loaded 2-core machine has used up 1 s before. */
  close(cfd);
  o.timeout_ms = 10000;
  t0 = umbp_now_ns();
  assert_int_equal(umbp_pool_attach(name, &o, &p), -EOWNERDEAD);
  uint64_t took = umbp_now_ns() - t0;
  if (took >= 5000000000ull)
    fail_msg("attach to a half-made pool took %.1f s: expected at once (< 5 s), not a wait for its 10 s timeout",
             took / 1e9);
  assert_non_null(strstr(umbp_last_error(), "half-made"));
  assert_non_null(strstr(umbp_last_error(), "(pid 999999) died"));
  assert_non_null(strstr(umbp_last_error(), "umbp pool destroy"));
  close(fd);
  assert_int_equal(umbp_pool_destroy(name), 0);
}

static char captured_log[1024];
static void capture_log(void *arg, int level, const char *msg) {
  (void)arg;
  if (level == UMBP_LOG_WARN) snprintf(captured_log, sizeof captured_log, "%s", msg);
}

/* A creator killed while pre-faulting leaves a pool without its magic:
 * attachers are told at once that its creator died, and the next creator
 * replaces it, saying so through the log callback (issue 32, item 7). */
static void test_half_made_pool_replaced(void **state) {
  (void)state;
  const char *name = tu_name("halfmade");
  char line[256];
  pid_t pid = tu_half_made_pool(name, line, sizeof line);
  assert_string_equal(line, "prefault");
  umbp_pool *p = NULL;
  uint64_t t0 = umbp_now_ns();
  assert_int_equal(umbp_pool_attach(name, NULL, &p), -EOWNERDEAD); /* default timeout: 10 s */
  /* known from the dropped creation lock, not by waiting out the timeout:
   * the bound is half of it, a margin a loaded machine keeps */
  uint64_t took = umbp_now_ns() - t0;
  if (took >= 5000000000ull)
    fail_msg("attach to a pool whose creator died took %.1f s: expected at once (< 5 s), not its 10 s timeout",
             took / 1e9);
  char pidtext[32];
  snprintf(pidtext, sizeof pidtext, "(pid %d) died", (int)pid);
  assert_non_null(strstr(umbp_last_error(), pidtext));
  umbp_log_set(capture_log, NULL, UMBP_LOG_INFO);
  captured_log[0] = 0;
  umbp_pool_params pp = small_params();
  int rc = umbp_pool_create(name, &pp, &p);
  umbp_log_set(NULL, NULL, UMBP_LOG_WARN);
  if (rc) fprintf(stderr, "create over a half-made pool: %s\n", umbp_last_error());
  assert_int_equal(rc, 0);
  assert_non_null(strstr(captured_log, "half-made"));
  snprintf(pidtext, sizeof pidtext, "(pid %d), which died", (int)pid);
  assert_non_null(strstr(captured_log, pidtext));
  umbp_pool *a;
  assert_int_equal(umbp_pool_attach(name, NULL, &a), 0);
  publish_n(p, 3);
  check_n(a, 3);
  umbp_pool_detach(a);
  umbp_pool_detach(p);
  assert_int_equal(umbp_pool_destroy(name), 0);
}

static void test_two_processes_share(void **state) {
  (void)state;
  const char *name = tu_name("share");
  umbp_pool *p = create_small(name);
  unsigned char *s0 = umbp_slot_ptr(p, 0), *s1 = umbp_slot_ptr(p, 1);
  for (int i = 0; i < 4096; i++) s0[i] = (unsigned char)(i * 7 + 1);
  char *argv[] = {(char *)tu_helper("pool_helper"), "rw", (char *)name, NULL};
  int fd;
  pid_t pid = tu_spawn(argv, &fd);
  char line[256];
  assert_true(tu_readline(fd, line, sizeof line) > 0);
  close(fd);
  assert_int_equal(tu_wait(pid), 0);
  int ok;
  void *their_base;
  int their_slot;
  assert_int_equal(sscanf(line, "ok %d base %p slot %d", &ok, &their_base, &their_slot), 3);
  assert_int_equal(ok, 1);
  assert_int_not_equal(their_slot, umbp_pool_proc_slot(p));
  /* ASLR: the helper mapped the pool elsewhere (exec'd, not forked) */
  if (their_base == (void *)s0) fprintf(stderr, "note: helper mapped at the same address\n");
  for (int i = 0; i < 4096; i++) assert_int_equal(s1[i], (unsigned char)(i * 13 + 5));
  umbp_pool_detach(p);
  assert_int_equal(umbp_pool_destroy(name), 0);
}

/* Runs only as root with a 'nobody' user (main() checks). */
static void test_other_uid_kept_out(void **state) {
  (void)state;
  struct passwd *pw = getpwnam("nobody");
  assert_non_null(pw);
  const char *name = tu_name("uid");
  umbp_pool *p = create_small(name);
  char uid[16];
  snprintf(uid, sizeof uid, "%u", (unsigned)pw->pw_uid);
  char *argv[] = {(char *)tu_helper("pool_helper"), "attach-as", uid, (char *)name, NULL};
  int fd;
  pid_t pid = tu_spawn(argv, &fd);
  char line[64];
  assert_true(tu_readline(fd, line, sizeof line) > 0);
  close(fd);
  tu_wait(pid);
  assert_int_equal(atoi(line), -EACCES);
  umbp_pool_detach(p);
  assert_int_equal(umbp_pool_destroy(name), 0);
}

static pid_t spawn_holder(const char *name, int *slot) {
  char *argv[] = {(char *)tu_helper("pool_helper"), "hold", (char *)name, NULL};
  int fd;
  pid_t pid = tu_spawn(argv, &fd);
  char line[128];
  assert_true(tu_readline(fd, line, sizeof line) > 0);
  close(fd);
  assert_int_equal(sscanf(line, "ready %d", slot), 1);
  return pid;
}

static void test_registry_reaps_killed(void **state) {
  (void)state;
  const char *name = tu_name("reap");
  umbp_pool *p = create_small(name);
  int slot_a, slot_b;
  pid_t a = spawn_holder(name, &slot_a);
  pid_t b = spawn_holder(name, &slot_b);
  umbp_proc_info pi[UMBP_MAX_PROCS];
  int n = umbp_pool_list_procs(p, pi, UMBP_MAX_PROCS);
  assert_int_equal(n, 3);
  for (int i = 0; i < n; i++) {
    assert_true(pi[i].alive);
    if ((int)pi[i].slot == slot_a) {
      assert_int_equal(pi[i].pid, a);
      assert_int_equal(pi[i].role, UMBP_ROLE_WORKER);
      assert_int_equal(pi[i].rank, 3);
      assert_true(pi[i].start_time > 0);
    }
  }
  assert_int_equal(umbp_pool_reap(p), 0); /* nobody is dead */
  kill(a, SIGKILL);
  tu_wait(a);
  umbp_pool_info info;
  umbp_pool_get_info(p, &info);
  assert_int_equal(info.procs_live, 2);
  assert_int_equal(info.procs_dead, 1);
  assert_int_equal(umbp_pool_reap(p), 1);
  assert_int_equal(umbp_pool_reap(p), 0);
  umbp_pool_get_info(p, &info);
  assert_int_equal(info.procs_dead, 0);
  assert_int_equal(info.procs_live, 2);
  /* the freed slot is claimable again */
  umbp_pool *c;
  assert_int_equal(umbp_pool_attach(name, NULL, &c), 0);
  umbp_pool_detach(c);
  kill(b, SIGKILL);
  tu_wait(b);
  umbp_pool_detach(p);
  assert_int_equal(umbp_pool_destroy(name), 0);
}

/* Liveness never trusts a pid: a slot that names a live pid but whose lock is
 * not held is dead; a live holder is never reaped whatever its pid says. */
static void test_pid_reuse(void **state) {
  (void)state;
  const char *name = tu_name("pidreuse");
  umbp_pool *p = create_small(name);
  int slot_live;
  pid_t live = spawn_holder(name, &slot_live);
  /* a child that dies; then forge its slot to claim a pid that is alive (as if reused) */
  int slot_dead;
  pid_t dead = spawn_holder(name, &slot_dead);
  kill(dead, SIGKILL);
  tu_wait(dead);
  pid_t sleeper;
  {
    char *argv[] = {(char *)tu_helper("pool_helper"), "sleep", NULL};
    int fd;
    sleeper = tu_spawn(argv, &fd);
    char line[32];
    tu_readline(fd, line, sizeof line);
    close(fd);
  }
  p->procs[slot_dead].pid = sleeper; /* pid now belongs to a live, unrelated process */
  p->procs[slot_dead].start_time = umbp_proc_start_time(sleeper);
  /* and make the live holder's slot claim a dead pid */
  p->procs[slot_live].pid = 999999;
  assert_false(umbp_registry_alive(p, (unsigned)slot_dead));
  assert_true(umbp_registry_alive(p, (unsigned)slot_live));
  assert_int_equal(umbp_pool_reap(p), 1);
  umbp_pool_info info;
  umbp_pool_get_info(p, &info);
  assert_int_equal(info.procs_live, 2);
  kill(sleeper, SIGKILL);
  tu_wait(sleeper);
  kill(live, SIGKILL);
  tu_wait(live);
  assert_int_equal(umbp_pool_reap(p), 1);
  umbp_pool_detach(p);
  assert_int_equal(umbp_pool_destroy(name), 0);
}

/* Two threads of one process reap the same dead process at once: OFD locks
 * do not exclude threads sharing the handle's file description, so the
 * handle's claim must admit one (issue 32, item 6). Each round forges a dead
 * slot (LIVE, nobody holds its lock) and lets two threads, released
 * together, reap it: exactly one may report it. */
struct reaper_race {
  umbp_pool *p;
  unsigned slot;
  _Atomic int go, ready, reaped;
};

static void *reaper_thread(void *arg) {
  struct reaper_race *r = arg;
  atomic_fetch_add(&r->ready, 1);
  while (!atomic_load(&r->go)) {
  }
  atomic_fetch_add(&r->reaped, umbp_registry_reap_slot(r->p, r->slot));
  return NULL;
}

static void test_two_reaper_threads(void **state) {
  (void)state;
  const char *name = tu_name("reapers");
  umbp_pool *p = create_small(name);
  struct reaper_race r = {.p = p, .slot = (unsigned)umbp_pool_proc_slot(p) + 1};
  unsigned doubled = 0;
  const unsigned rounds = 400;
  for (unsigned round = 0; round < rounds; round++) {
    struct umbp_proc_slot *s = &p->procs[r.slot];
    s->pid = 999999; /* a process that died: its slot is LIVE, its lock is free */
    atomic_store(&s->state, UMBP_PROC_LIVE);
    atomic_store(&r.go, 0);
    atomic_store(&r.ready, 0);
    atomic_store(&r.reaped, 0);
    pthread_t t[2];
    for (int i = 0; i < 2; i++) assert_int_equal(pthread_create(&t[i], NULL, reaper_thread, &r), 0);
    while (atomic_load(&r.ready) < 2) {
    }
    atomic_store(&r.go, 1);
    for (int i = 0; i < 2; i++) pthread_join(t[i], NULL);
    if (atomic_load(&r.reaped) != 1) doubled++;
    assert_int_equal(atomic_load(&s->state), UMBP_PROC_FREE);
  }
  if (doubled) fprintf(stderr, "%u of %u rounds: the dead slot was reaped %s\n", doubled, rounds, "twice (or never)");
  assert_int_equal(doubled, 0);
  umbp_pool_detach(p);
  assert_int_equal(umbp_pool_destroy(name), 0);
}

static void test_registry_full(void **state) {
  (void)state;
  const char *name = tu_name("full");
  umbp_pool *p = create_small(name);
  umbp_pool *h[UMBP_MAX_PROCS];
  int n = 0;
  while (n < UMBP_MAX_PROCS && umbp_pool_attach(name, NULL, &h[n]) == 0) n++;
  assert_int_equal(n, UMBP_MAX_PROCS - 1); /* the creator holds one */
  umbp_pool *x;
  assert_int_equal(umbp_pool_attach(name, NULL, &x), -EUSERS);
  assert_non_null(strstr(umbp_last_error(), "process slots"));
  for (int i = 0; i < n; i++) umbp_pool_detach(h[i]);
  assert_int_equal(umbp_pool_attach(name, NULL, &x), 0);
  umbp_pool_detach(x);
  umbp_pool_detach(p);
  assert_int_equal(umbp_pool_destroy(name), 0);
}

static int progress_calls;
static uint64_t progress_last;
static void progress(void *arg, const char *what, uint64_t done, uint64_t total) {
  (void)arg;
  (void)what;
  progress_calls++;
  progress_last = done;
  assert_true(done <= total);
}

static void test_prefault_progress(void **state) {
  (void)state;
  const char *name = tu_name("pf");
  umbp_pool_params pp = small_params();
  pp.capacity = 128 << 20;
  pp.progress = progress;
  pp.prefault_threads = 2;
  umbp_pool *p;
  assert_int_equal(umbp_pool_create(name, &pp, &p), 0);
  assert_true(progress_calls >= 4);
  umbp_pool_info info;
  umbp_pool_get_info(p, &info);
  uint64_t arena = 0;
  for (unsigned i = 0; i < info.n_partitions; i++) arena += info.partitions[i].bytes;
  assert_true(progress_last >= arena);
  umbp_pool_detach(p);
  assert_int_equal(umbp_pool_destroy(name), 0);
}

/* Resident set of this process's mapping that starts at base (/proc/self/smaps). */
static uint64_t mapping_rss(const void *base) {
  FILE *f = fopen("/proc/self/smaps", "r");
  assert_non_null(f);
  char line[512];
  bool in = false;
  uint64_t kb = UINT64_MAX;
  while (fgets(line, sizeof line, f)) {
    unsigned long lo, hi;
    if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2 && strchr(line, '-') < strchr(line, ' ')) {
      in = lo == (unsigned long)base;
      continue;
    }
    if (in && sscanf(line, "Rss: %lu kB", &lo) == 1) {
      kb = lo;
      break;
    }
  }
  fclose(f);
  assert_int_not_equal(kb, UINT64_MAX);
  return kb << 10;
}

/* The metadata is populated at creation even with no_prefault (the slot bytes
 * are not), and an attacher maps it at attach: no lookup or remove faults. */
static void test_metadata_populated(void **state) {
  (void)state;
  const char *name = tu_name("meta");
  umbp_pool_params pp = small_params();
  pp.capacity = 64 << 20;
  pp.slot_size = 4096; /* 16384 slots: 8 MiB of metadata, 64 MiB of slots */
  pp.no_prefault = true;
  pp.no_reserve = true; /* mincore() below counts reserved pages too (test_no_prefault_reserves) */
  pp.index_pages = UMBP_INDEX_PAGES_SMALL; /* all of it in the one /dev/shm mapping (huge: test_index_huge) */
  umbp_pool *p;
  assert_int_equal(umbp_pool_create(name, &pp, &p), 0);
  uint64_t meta = p->hdr->regions[UMBP_REG_ARENA].offset;
  assert_true(meta > (2u << 20));
  long page = sysconf(_SC_PAGESIZE);
  size_t np = (size_t)(p->size + (uint64_t)page - 1) / (size_t)page;
  unsigned char *vec = malloc(np);
  assert_non_null(vec);
  assert_int_equal(mincore(p->base, p->size, vec), 0);
  size_t meta_pages = (size_t)(meta / (uint64_t)page), in_meta = 0, in_arena = 0;
  for (size_t i = 0; i < np; i++) {
    if (i < meta_pages) in_meta += vec[i] & 1;
    else in_arena += vec[i] & 1;
  }
  assert_int_equal(in_meta, meta_pages);  /* every metadata page allocated */
  assert_true(in_arena < (np - meta_pages) / 8); /* slot bytes left to fault in */
  free(vec);
  /* a second mapping (as another process would have) has the metadata mapped */
  umbp_pool *a;
  assert_int_equal(umbp_pool_attach(name, NULL, &a), 0);
  assert_true(mapping_rss(a->base) >= meta - (uint64_t)page);
  /* read-only handles map nothing up front */
  umbp_attach_opts o;
  umbp_attach_opts_init(&o);
  o.read_only = true;
  umbp_pool *r;
  assert_int_equal(umbp_pool_attach(name, &o, &r), 0);
  assert_true(mapping_rss(r->base) < meta / 2);
  umbp_pool_detach(r);
  umbp_pool_detach(a);
  umbp_pool_detach(p);
  assert_int_equal(umbp_pool_destroy(name), 0);
}

/* no_prefault still reserves the slot bytes' blocks in /dev/shm (issue 32,
 * item 12): a /dev/shm that fills up later cannot make a first write to a
 * block die of SIGBUS. The blocks are allocated, this mapping has not
 * faulted them in. no_reserve leaves the file sparse and says so. */
static void test_no_prefault_reserves(void **state) {
  (void)state;
  for (int sparse = 0; sparse < 2; sparse++) {
    const char *name = tu_name("reserve");
    umbp_pool_params pp = small_params();
    pp.capacity = 64 << 20;
    pp.no_prefault = true;
    pp.no_reserve = sparse;
    pp.index_pages = UMBP_INDEX_PAGES_SMALL;
    umbp_pool *p;
    umbp_log_set(capture_log, NULL, UMBP_LOG_WARN);
    captured_log[0] = 0;
    assert_int_equal(umbp_pool_create(name, &pp, &p), 0);
    umbp_log_set(NULL, NULL, UMBP_LOG_WARN);
    struct stat st;
    assert_int_equal(fstat(p->fd, &st), 0);
    uint64_t arena = p->hdr->regions[UMBP_REG_ARENA].size, meta = p->hdr->regions[UMBP_REG_ARENA].offset;
    uint64_t allocated = (uint64_t)st.st_blocks * 512;
    if (!sparse) {
      assert_true(allocated >= arena + meta - 4096);
      assert_true(mapping_rss(p->base) < meta + arena / 8); /* reserved, not faulted in */
      assert_int_equal(captured_log[0], 0);
    } else {
      assert_true(allocated < meta + arena / 8);
      assert_non_null(strstr(captured_log, "SIGBUS"));
    }
    umbp_pool_detach(p);
    assert_int_equal(umbp_pool_destroy(name), 0);
  }
}

/* A pool that does not fit /dev/shm: both sizes in the message in a unit
 * that tells them apart (MiB under 1 GiB; "0.01 GiB but ... 0.01 GiB free"
 * said nothing). A tmpfs of 8 MiB over /dev/shm in a child's own mount
 * namespace (root only). */
static void test_shm_full_message(void **state) {
  (void)state;
  if (geteuid() != 0) return;
  const char *name = tu_name("full");
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    if (unshare(CLONE_NEWNS) != 0 || mount("none", "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0 ||
        mount("tmpfs", "/dev/shm", "tmpfs", 0, "size=8m") != 0)
      _exit(77);
    umbp_pool_params pp = small_params();
    pp.index_pages = UMBP_INDEX_PAGES_SMALL;
    umbp_pool *p;
    int rc = umbp_pool_create(name, &pp, &p);
    const char *m = umbp_last_error();
    bool ok = rc == -ENOSPC && strstr(m, "MiB but /dev/shm has only 8.00 MiB free") && !strstr(m, "0.0");
    if (!ok) fprintf(stderr, "rc %d: %s\n", rc, m);
    _exit(ok ? 0 : 1);
  }
  int st;
  assert_int_equal(waitpid(pid, &st, 0), pid);
  assert_true(WIFEXITED(st));
  if (WEXITSTATUS(st) == 77) fprintf(stderr, "# no private tmpfs over /dev/shm here: not run\n");
  else assert_int_equal(WEXITSTATUS(st), 0);
}

static void test_hugepages_bad_dir(void **state) {
  (void)state;
  const char *name = tu_name("huge");
  umbp_pool_params pp = small_params();
  pp.hugepages = true;
  pp.hugetlbfs_dir = "/nonexistent-hugetlbfs";
  umbp_pool *p;
  assert_true(umbp_pool_create(name, &pp, &p) < 0);
  /* a directory that is there but not hugetlbfs: refused, nothing made in it
   * (the file would be on ordinary pages where no command looks for it) */
  char dir[] = "/tmp/umbp-not-hugetlbfs-XXXXXX";
  assert_non_null(mkdtemp(dir));
  pp.hugetlbfs_dir = dir;
  int rc = umbp_pool_create(name, &pp, &p);
  if (rc == 0) umbp_pool_detach(p);
  bool left = file_exists(dir, "umbp.", name);
  char path[128];
  snprintf(path, sizeof path, "%s/umbp.%s", dir, name);
  unlink(path);
  rmdir(dir);
  assert_int_equal(rc, -EINVAL);
  assert_non_null(strstr(umbp_last_error(), "is not a hugetlbfs mount"));
  assert_non_null(strstr(umbp_last_error(), dir));
  assert_false(left);
}

/* One name is one pool across /dev/shm and the hugetlbfs mount (issue 32,
 * item 9): a name taken in one place cannot be created in the other. Needs
 * a hugetlbfs mount, not huge pages (main() mounts a private one as root). */
static void test_one_name_one_pool(void **state) {
  (void)state;
  char hdir[256];
  assert_int_equal(umbp_hugetlbfs_mount(hdir, sizeof hdir), 0);
  const char *name = tu_name("onename");
  char hpath[512];
  snprintf(hpath, sizeof hpath, "%s/umbp.%s", hdir, name);
  int fd = open(hpath, O_RDWR | O_CREAT | O_EXCL, 0600); /* a --hugepages pool's file */
  assert_true(fd >= 0);
  close(fd);
  umbp_pool_params pp = small_params();
  umbp_pool *p;
  assert_int_equal(umbp_pool_create(name, &pp, &p), -EEXIST);
  assert_non_null(strstr(umbp_last_error(), "one name is one pool"));
  assert_non_null(strstr(umbp_last_error(), hpath));
  assert_false(file_exists("/dev/shm", "umbp.", name));
  unlink(hpath);
  /* and the other way: a /dev/shm pool keeps the name from the hugetlbfs mount */
  umbp_pool_detach(create_small(name));
  pp.hugepages = true;
  assert_int_equal(umbp_pool_create(name, &pp, &p), -EEXIST);
  assert_non_null(strstr(umbp_last_error(), "/dev/shm/umbp."));
  assert_false(file_exists(hdir, "umbp.", name));
  assert_int_equal(umbp_pool_destroy(name), 0);
}

/* Runs only where a hugetlbfs mount with free pages exists (main() checks). */
static char huge_dir[256];

static long huge_free_pages(void) {
  FILE *f = fopen("/proc/meminfo", "r");
  char line[128];
  long fr = 0, rs = 0;
  while (f && fgets(line, sizeof line, f)) {
    if (!strncmp(line, "HugePages_Free:", 15)) fr = atol(line + 15);
    if (!strncmp(line, "HugePages_Rsvd:", 15)) rs = atol(line + 15);
  }
  if (f) fclose(f);
  return fr - rs;
}

/* Bytes of huge pages this process maps (faulted in). Unlike the system's
 * free count, no other process (a parallel test run, the CI) changes it. */
static long long huge_mapped_bytes(void) {
  FILE *f = fopen("/proc/self/smaps_rollup", "r");
  char line[128];
  long long kb = 0;
  while (f && fgets(line, sizeof line, f))
    if (!strncmp(line, "Shared_Hugetlb:", 15) || !strncmp(line, "Private_Hugetlb:", 16))
      kb += atoll(strchr(line, ':') + 1);
  if (f) fclose(f);
  return kb * 1024;
}

/* The index on 2 MiB pages: in umbp-index.NAME, shared by every mapping,
 * removed with the pool; what goes wrong names the cause and the fix. */
static void test_index_huge(void **state) {
  (void)state;
  const char *name = tu_name("ihuge");
  umbp_pool_params pp = small_params();
  pp.index_pages = UMBP_INDEX_PAGES_HUGE;
  umbp_pool *p;
  long long mapped0 = huge_mapped_bytes();
  int rc = umbp_pool_create(name, &pp, &p);
  if (rc) fprintf(stderr, "create: %s\n", umbp_last_error());
  assert_int_equal(rc, 0);
  umbp_pool_info info;
  umbp_pool_get_info(p, &info);
  assert_true(info.index_hugepages);
  assert_false(info.hugepages);
  uint64_t off, len;
  umbp_index_huge_range(p->hdr, &off, &len);
  assert_int_equal(info.index_huge_bytes, len);
  /* the index took them, nothing else: counted in what this process maps, as
   * other processes take and give back pages of the system's free count */
  assert_int_equal(huge_mapped_bytes() - mapped0, (long long)len);
  char ipath[512];
  snprintf(ipath, sizeof ipath, "%s/umbp-index.%s", huge_dir, name);
  struct stat st;
  assert_int_equal(stat(ipath, &st), 0);
  assert_int_equal((uint64_t)st.st_size, len);
  assert_int_equal(st.st_mode & 0777, 0600);
  /* allocated at creation: every page of the range resident */
  unsigned char vec[4096];
  assert_true(len / 4096 <= sizeof vec);
  assert_int_equal(mincore((char *)p->base + off, len, vec), 0);
  for (uint64_t i = 0; i < len / 4096; i++) assert_int_equal(vec[i] & 1, 1);
  /* the buckets are in the hugetlbfs file: its first bytes are the bucket array's */
  int fd = open(ipath, O_RDONLY);
  assert_true(fd >= 0);
  void *m = mmap(NULL, len, PROT_READ, MAP_SHARED, fd, 0);
  assert_true(m != MAP_FAILED);
  publish_n(p, 50);
  assert_memory_equal(m, (char *)p->base + off, len);
  munmap(m, len);
  close(fd);
  /* another mapping, read-write and read-only, sees the same index */
  umbp_pool *a;
  assert_int_equal(umbp_pool_attach(name, NULL, &a), 0);
  umbp_pool_get_info(a, &info);
  assert_true(info.index_hugepages);
  check_n(a, 50);
  umbp_pool_detach(a);
  umbp_attach_opts ro;
  umbp_attach_opts_init(&ro);
  ro.read_only = true;
  assert_int_equal(umbp_pool_attach(name, &ro, &a), 0);
  check_n(a, 50);
  umbp_pool_detach(a);
  umbp_pool_detach(p);
  /* the index file gone: attach refuses, naming it; destroy still removes the pool */
  char moved[512];
  snprintf(moved, sizeof moved, "%s/umbp-test-moved.%s", huge_dir, name);
  assert_int_equal(rename(ipath, moved), 0);
  assert_int_equal(umbp_pool_attach(name, NULL, &a), -ENOENT);
  assert_non_null(strstr(umbp_last_error(), "missing"));
  assert_non_null(strstr(umbp_last_error(), "umbp pool destroy"));
  /* a truncated one: refused as well */
  fd = open(moved, O_RDWR);
  assert_true(fd >= 0);
  assert_int_equal(ftruncate(fd, 0), 0);
  close(fd);
  assert_int_equal(rename(moved, ipath), 0);
  assert_int_equal(umbp_pool_attach(name, NULL, &a), -EBADMSG);
  assert_non_null(strstr(umbp_last_error(), "index file"));
  assert_int_equal(umbp_pool_destroy(name), 0);
  assert_false(file_exists(huge_dir, "umbp-index.", name));
  assert_false(file_exists("/dev/shm", "umbp.", name));
  assert_int_equal(huge_mapped_bytes(), mapped0); /* with its file gone: its pages are free again */

  /* an index file left behind by removing only the main file: destroy
   * removes it, and a new pool of that name replaces it */
  assert_int_equal(umbp_pool_create(name, &pp, &p), 0);
  umbp_pool_detach(p);
  char shm[512];
  snprintf(shm, sizeof shm, "/dev/shm/umbp.%s", name);
  assert_int_equal(unlink(shm), 0);
  assert_true(file_exists(huge_dir, "umbp-index.", name));
  assert_int_equal(umbp_pool_destroy(name), 0);
  assert_false(file_exists(huge_dir, "umbp-index.", name));
  assert_int_equal(umbp_pool_destroy(name), -ENOENT);
  assert_int_equal(umbp_pool_create(name, &pp, &p), 0);
  umbp_pool_detach(p);
  assert_int_equal(unlink(shm), 0);
  assert_int_equal(umbp_pool_create(name, &pp, &p), 0); /* the leftover is replaced */
  publish_n(p, 5);
  check_n(p, 5);
  umbp_pool_detach(p);
  assert_int_equal(umbp_pool_destroy(name), 0);
  assert_false(file_exists(huge_dir, "umbp-index.", name));
  assert_int_equal(huge_mapped_bytes(), mapped0); /* with its file gone: its pages are free again */

  /* more index than free huge pages: "huge" fails before anything is made,
   * naming nr_hugepages; "try" creates the pool with its index on 4 KiB pages */
  /* 64 B of metadata a slot: more than all the huge pages hold, not only
   * the free ones, which other processes give back meanwhile */
  long all_pages = 0;
  {
    FILE *mi = fopen("/proc/meminfo", "r");
    char ml[128];
    while (mi && fgets(ml, sizeof ml, mi))
      if (!strncmp(ml, "HugePages_Total:", 16)) all_pages = atol(ml + 16);
    if (mi) fclose(mi);
  }
  uint64_t slots = (uint64_t)all_pages * 32768 + 65536;
  struct statvfs shm_fs;
  bool shm_fits = statvfs("/dev/shm", &shm_fs) == 0 && slots * 4096 <= (uint64_t)shm_fs.f_bavail * shm_fs.f_frsize;
  if (slots <= UMBP_MAX_SLOTS && shm_fits) {
    pp.slot_size = 4096;
    pp.capacity = slots * 4096;
    pp.no_prefault = true;
    pp.no_reserve = true; /* gigabytes: a sparse file */
    assert_int_equal(umbp_pool_create(name, &pp, &p), -ENOSPC);
    assert_non_null(strstr(umbp_last_error(), "nr_hugepages"));
    assert_non_null(strstr(umbp_last_error(), "--index-pages small"));
    assert_false(file_exists(huge_dir, "umbp-index.", name));
    assert_false(file_exists("/dev/shm", "umbp.", name));
    pp.index_pages = UMBP_INDEX_PAGES_TRY;
    assert_int_equal(umbp_pool_create(name, &pp, &p), 0);
    umbp_pool_get_info(p, &info);
    assert_false(info.index_hugepages);
    assert_false(file_exists(huge_dir, "umbp-index.", name));
    umbp_pool_detach(p);
    assert_int_equal(umbp_pool_destroy(name), 0);
  } else {
    /* the pool's free-space check of /dev/shm would refuse it first, with its own message */
    fprintf(stderr, "# %ld huge pages: an index larger than they hold needs a pool larger than %s: the "
                    "fallback is not checked\n",
            all_pages, slots <= UMBP_MAX_SLOTS ? "/dev/shm" : "the largest");
  }
  /* placing the index fails after the free-page check (here: a directory
   * where the index file goes): "huge" fails and leaves nothing; "try" makes
   * the pool with its index on the pool's own pages, usable by every handle */
  pp = small_params();
  char dpath[512];
  snprintf(dpath, sizeof dpath, "%s/umbp-index.%s", huge_dir, name);
  assert_int_equal(mkdir(dpath, 0700), 0);
  pp.index_pages = UMBP_INDEX_PAGES_HUGE;
  assert_true(umbp_pool_create(name, &pp, &p) < 0);
  assert_non_null(strstr(umbp_last_error(), "index file"));
  assert_false(file_exists("/dev/shm", "umbp.", name));
  pp.index_pages = UMBP_INDEX_PAGES_TRY;
  assert_int_equal(umbp_pool_create(name, &pp, &p), 0);
  umbp_pool_get_info(p, &info);
  assert_false(info.index_hugepages);
  assert_int_equal(p->hdr->incompat_features & UMBP_FEAT_INCOMPAT_INDEX_HUGE, 0);
  publish_n(p, 30);
  assert_int_equal(umbp_pool_attach(name, NULL, &a), 0);
  check_n(a, 30);
  umbp_pool_detach(a);
  umbp_pool_detach(p);
  assert_int_equal(umbp_pool_destroy(name), 0);
  assert_int_equal(rmdir(dpath), 0);
  assert_int_equal(huge_mapped_bytes(), mapped0); /* with its file gone: its pages are free again */
  /* "try" with pages free: on huge pages */
  pp = small_params();
  assert_int_equal(umbp_pool_create(name, &pp, &p), 0);
  umbp_pool_get_info(p, &info);
  assert_true(info.index_hugepages);
  umbp_pool_detach(p);
  assert_int_equal(umbp_pool_destroy(name), 0);
}
/* Free 2 MiB pages test_hugepages_reserved needs: pool A's 11 and room for a
 * pool B larger than what is then free. main() skips its group, saying so,
 * where fewer are free. */
#define HUGE_RESERVED_NEED 14

/* Huge pages another pool has reserved but not faulted in (a hugepage pool
 * made with no_prefault) are not free: a pool that needs them is refused by
 * the size check, naming the pages free, not by a bare "cannot map pool:
 * Cannot allocate memory" from mmap. */
static void test_hugepages_reserved(void **state) {
  (void)state;
  const char *a = tu_name("hrsv"), *b = tu_name("hrsv");
  umbp_pool_params pp = small_params(); /* 16 MiB of 64 KiB slots: 11 pages */
  pp.hugepages = true;
  pp.no_prefault = true;
  /* main() checked this before the group; pages another process took since
   * are a failure that says so, not a silent pass */
  long free_now = huge_free_pages();
  if (free_now < HUGE_RESERVED_NEED)
    fail_msg("%ld free 2 MiB huge pages, %d needed (main() saw enough: another process took them)", free_now,
             HUGE_RESERVED_NEED);
  umbp_pool *pa, *pb;
  assert_int_equal(umbp_pool_create(a, &pp, &pa), 0);
  long avail = huge_free_pages(); /* Free less Rsvd */
  FILE *f = fopen("/proc/meminfo", "r");
  char line[128];
  long rsvd = 0;
  while (f && fgets(line, sizeof line, f))
    if (!strncmp(line, "HugePages_Rsvd:", 15)) rsvd = atol(line + 15);
  if (f) fclose(f);
  /* A, made without pre-faulting, leaves most of its 11 pages reserved but
   * not faulted in (its metadata is written: about 3 are). With fewer, B
   * below cannot fall between Free and Free less Rsvd and this test would
   * check nothing: that is a failure of A's no_prefault, said as such. */
  if (rsvd < 6) {
    umbp_pool_detach(pa);
    umbp_pool_destroy(a);
    fail_msg("a no_prefault hugepage pool of 11 pages left %ld pages reserved but not faulted in "
             "(HugePages_Rsvd), 6 needed",
             rsvd);
  }
  /* B: more pages than are free, fewer than Free counts (B's segment is its
   * capacity plus about 6 MiB of metadata for 64 KiB slots) */
  umbp_pool_params q = small_params();
  q.hugepages = true;
  q.capacity = (uint64_t)(avail + rsvd / 2) * (2 << 20) - (6 << 20);
  int rc = umbp_pool_create(b, &q, &pb);
  if (rc == 0) umbp_pool_detach(pb);
  const char *m = umbp_last_error();
  if (rc != -ENOSPC) fprintf(stderr, "rc %d: %s\n", rc, m);
  umbp_pool_detach(pa);
  assert_int_equal(umbp_pool_destroy(a), 0);
  if (rc == 0) umbp_pool_destroy(b);
  assert_int_equal(rc, -ENOSPC);
  assert_non_null(strstr(m, "of huge pages but"));
}

/* --hugetlbfs DIR names the first hugetlbfs mount, where every command looks:
 * spelled with a trailing '/', it makes the pool (it used to be refused as
 * "already exists" by the pool's own file); a second hugetlbfs mount is
 * refused with nothing made there (a pool on it could not be attached,
 * listed or destroyed by name). */
static void test_hugetlbfs_dir(void **state) {
  (void)state;
  const char *name = tu_name("hdir");
  char slash[300];
  snprintf(slash, sizeof slash, "%s/", huge_dir);
  umbp_pool_params pp = small_params();
  pp.hugepages = true;
  pp.hugetlbfs_dir = slash;
  umbp_pool *p, *a;
  int rc = umbp_pool_create(name, &pp, &p);
  if (rc) fprintf(stderr, "create: %s\n", umbp_last_error());
  assert_int_equal(rc, 0);
  umbp_pool_info info;
  umbp_pool_get_info(p, &info);
  assert_null(strstr(info.path, "//"));
  assert_int_equal(umbp_pool_attach(name, NULL, &a), 0); /* found by name */
  umbp_pool_detach(a);
  umbp_pool_detach(p);
  assert_int_equal(umbp_pool_destroy(name), 0);
  assert_false(file_exists(huge_dir, "umbp.", name));
  /* a second mount, in a mount namespace of a child's own (root only) */
  if (geteuid() != 0) return;
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    char dir[] = "/tmp/umbp-hugetlbfs2-XXXXXX";
    if (unshare(CLONE_NEWNS) != 0 || mount("none", "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0 || !mkdtemp(dir))
      _exit(77);
    if (mount("none", dir, "hugetlbfs", 0, NULL) != 0) {
      rmdir(dir);
      _exit(77);
    }
    pp.hugetlbfs_dir = dir;
    int crc = umbp_pool_create(name, &pp, &p);
    if (crc == 0) umbp_pool_detach(p);
    bool ok = crc == -EINVAL && strstr(umbp_last_error(), "not the first hugetlbfs mount") &&
              strstr(umbp_last_error(), dir) && !file_exists(dir, "umbp.", name);
    if (!ok) fprintf(stderr, "second mount: rc %d: %s\n", crc, umbp_last_error());
    char path[128];
    snprintf(path, sizeof path, "%s/umbp.%s", dir, name);
    unlink(path);
    umount(dir);
    rmdir(dir);
    _exit(ok ? 0 : 1);
  }
  int st;
  assert_int_equal(waitpid(pid, &st, 0), pid);
  assert_true(WIFEXITED(st));
  if (WEXITSTATUS(st) == 77) fprintf(stderr, "# second hugetlbfs mount not possible here: that half not run\n");
  else assert_int_equal(WEXITSTATUS(st), 0);
}

static void test_hugepages(void **state) {
  (void)state;
  const char *name = tu_name("huge");
  umbp_pool_params pp = small_params();
  pp.hugepages = true;
  pp.hugetlbfs_dir = huge_dir;
  umbp_pool *p;
  long long mapped0 = huge_mapped_bytes();
  int rc = umbp_pool_create(name, &pp, &p);
  if (rc) fprintf(stderr, "create: %s\n", umbp_last_error());
  assert_int_equal(rc, 0);
  umbp_pool_info info;
  umbp_pool_get_info(p, &info);
  assert_true(info.hugepages);
  assert_non_null(strstr(info.path, huge_dir));
  assert_int_equal(info.total_size % (2 << 20), 0);
  unsigned char *s0 = umbp_slot_ptr(p, 0);
  s0[0] = 42;
  umbp_pool *a;
  assert_int_equal(umbp_pool_attach(name, NULL, &a), 0); /* found on the hugetlbfs mount by name */
  assert_int_equal(((unsigned char *)umbp_slot_ptr(a, 0))[0], 42);
  umbp_pool_detach(a);
  umbp_pool_detach(p);
  /* detach unmaps every huge page it mapped: attach's look at the header
   * (a 4 KiB munmap() of a 2 MiB mapping) used to leave one mapped */
  assert_int_equal(huge_mapped_bytes(), mapped0);
  assert_int_equal(umbp_pool_destroy(name), 0);
  /* more than the free huge pages: refused before allocation, with the fix */
  pp.capacity = 1ull << 40;
  pp.slot_size = 1 << 20;
  assert_int_equal(umbp_pool_create(name, &pp, &p), -ENOSPC);
  assert_non_null(strstr(umbp_last_error(), "nr_hugepages"));
}

static void test_index_pages_small(void **state) {
  (void)state;
  const char *name = tu_name("ismall");
  umbp_pool_params pp = small_params();
  pp.index_pages = UMBP_INDEX_PAGES_SMALL;
  umbp_pool *p;
  assert_int_equal(umbp_pool_create(name, &pp, &p), 0);
  umbp_pool_info info;
  umbp_pool_get_info(p, &info);
  assert_false(info.index_hugepages);
  assert_int_equal(info.index_huge_bytes, 0);
  assert_int_equal(p->hdr->incompat_features & UMBP_FEAT_INCOMPAT_INDEX_HUGE, 0);
  publish_n(p, 20);
  umbp_pool *a;
  assert_int_equal(umbp_pool_attach(name, NULL, &a), 0);
  check_n(a, 20);
  umbp_pool_detach(a);
  umbp_pool_detach(p);
  assert_int_equal(umbp_pool_destroy(name), 0);
  /* an unknown placement is refused, naming the choices */
  pp.index_pages = 7;
  assert_int_equal(umbp_pool_create(name, &pp, &p), -EINVAL);
  assert_non_null(strstr(umbp_last_error(), "try, huge or small"));
  assert_false(file_exists("/dev/shm", "umbp.", name));
}

/* The huge-index layout: buckets and slot metadata on whole 2 MiB pages of
 * their own, between the other regions; a header that says otherwise is refused. */
static void test_layout_index_huge(void **state) {
  (void)state;
  umbp_pool_params pp = small_params();
  pp.index_pages = UMBP_INDEX_PAGES_HUGE;
  int nodes[2] = {0, 1};
  struct umbp_shm_header h;
  assert_int_equal(umbp_layout_compute(&pp, nodes, 2, &h), 0);
  assert_true(h.incompat_features & UMBP_FEAT_INCOMPAT_INDEX_HUGE);
  uint64_t off, len;
  umbp_index_huge_range(&h, &off, &len);
  assert_int_equal(off, h.regions[UMBP_REG_BUCKETS].offset);
  assert_int_equal(off % UMBP_PART_ALIGN, 0);
  assert_int_equal(len % UMBP_PART_ALIGN, 0);
  assert_true(off + len >= h.regions[UMBP_REG_SLOTMETA].offset + h.regions[UMBP_REG_SLOTMETA].size);
  assert_true(off + len <= h.regions[UMBP_REG_PINS].offset);
  assert_true(off >= h.regions[UMBP_REG_INDEXHDR].offset + h.regions[UMBP_REG_INDEXHDR].size);
  for (int r = 0; r + 1 < UMBP_REG_COUNT; r++)
    assert_true(h.regions[r].offset + h.regions[r].size <= h.regions[r + 1].offset);
  h.header_checksum = umbp_header_checksum(&h);
  atomic_store(&h.magic, UMBP_MAGIC);
  assert_int_equal(umbp_header_validate(&h, h.total_size), 0);
  /* with a whole-hugepage pool's bit too: refused */
  struct umbp_shm_header g = h;
  g.incompat_features |= UMBP_FEAT_INCOMPAT_HUGEPAGES;
  g.header_checksum = umbp_header_checksum(&g);
  assert_int_equal(umbp_header_validate(&g, g.total_size), -EBADMSG);
  assert_non_null(strstr(umbp_last_error(), "huge pages"));
  /* buckets off their 2 MiB boundary: refused */
  g = h;
  g.regions[UMBP_REG_BUCKETS].offset += 4096;
  g.header_checksum = umbp_header_checksum(&g);
  assert_int_equal(umbp_header_validate(&g, g.total_size), -EBADMSG);
  /* the range running into the pins: refused */
  g = h;
  g.regions[UMBP_REG_PINS].offset = off + len - 4096;
  g.header_checksum = umbp_header_checksum(&g);
  assert_int_equal(umbp_header_validate(&g, g.total_size), -EBADMSG);
  /* a whole-hugepage pool ignores the choice: its index is on huge pages already */
  pp.hugepages = true;
  assert_int_equal(umbp_layout_compute(&pp, nodes, 2, &h), 0);
  assert_int_equal(h.incompat_features & UMBP_FEAT_INCOMPAT_INDEX_HUGE, 0);
}

static void test_layout_compute(void **state) {
  (void)state;
  umbp_pool_params pp = small_params();
  int nodes[2] = {0, 1};
  struct umbp_shm_header h;
  pp.capacity = 10 * pp.slot_size + 100;
  assert_int_equal(umbp_layout_compute(&pp, nodes, 2, &h), 0);
  assert_int_equal(h.slot_count, 10);
  assert_int_equal(h.partitions[0].slot_count, 5);
  assert_int_equal(h.partitions[1].first_slot, 5);
  assert_int_equal(h.partitions[0].offset % UMBP_PART_ALIGN, 0);
  assert_int_equal(h.partitions[1].offset % UMBP_PART_ALIGN, 0);
  for (int r = 0; r + 1 < UMBP_REG_COUNT; r++)
    assert_true(h.regions[r].offset + h.regions[r].size <= h.regions[r + 1].offset);
  assert_true(h.total_size >= h.partitions[1].offset + h.partitions[1].bytes);
  h.header_checksum = umbp_header_checksum(&h);
  atomic_store(&h.magic, UMBP_MAGIC);
  assert_int_equal(umbp_header_validate(&h, h.total_size), 0);
  assert_int_equal(umbp_header_validate(&h, h.total_size - 1), -EBADMSG);
  /* partitions (and their free rings) overlapping each other, with a valid checksum */
  struct umbp_shm_header bad = h;
  bad.partitions[1].offset = bad.partitions[0].offset;
  bad.header_checksum = umbp_header_checksum(&bad);
  assert_int_equal(umbp_header_validate(&bad, bad.total_size), -EBADMSG);
  bad = h;
  bad.partitions[1].ring_offset = bad.partitions[0].ring_offset;
  bad.header_checksum = umbp_header_checksum(&bad);
  assert_int_equal(umbp_header_validate(&bad, bad.total_size), -EBADMSG);
  /* slot ids fill 24 bits of a bucket's slot word: at most UMBP_MAX_SLOTS */
  pp.slot_size = 4096;
  pp.capacity = (uint64_t)UMBP_MAX_SLOTS * 4096 + 4095;
  assert_int_equal(umbp_layout_compute(&pp, nodes, 2, &h), 0);
  assert_int_equal(h.slot_count, UMBP_MAX_SLOTS);
  assert_int_equal(h.n_buckets, (UMBP_MAX_SLOTS + 7) / 8);
  h.header_checksum = umbp_header_checksum(&h);
  atomic_store(&h.magic, UMBP_MAGIC);
  assert_int_equal(umbp_header_validate(&h, h.total_size), 0);
  h.slot_count = UMBP_MAX_SLOTS + 1; /* a header claiming more is refused */
  h.header_checksum = umbp_header_checksum(&h);
  assert_int_equal(umbp_header_validate(&h, h.total_size), -EBADMSG);
  pp.capacity = (uint64_t)(UMBP_MAX_SLOTS + 1) * 4096;
  assert_int_equal(umbp_layout_compute(&pp, nodes, 2, &h), -EINVAL);
  assert_non_null(strstr(umbp_last_error(), "at most 16777215 slots"));
  assert_non_null(strstr(umbp_last_error(), "raise the slot size (--slot-size)"));
}

/* Every region of the table below the arena is the segment layer's own
 * (registry, free rings) or exactly one module's (shm/module.h), and every
 * module hooks what the segment layer calls unconditionally. */
static void test_region_owners(void **state) {
  (void)state;
  for (int r = 0; r < UMBP_REG_ARENA; r++) {
    unsigned owners = 0;
    for (unsigned m = 0; m < umbp_shm_n_modules; m++) owners += (umbp_shm_modules[m]->regions >> r) & 1;
    bool own = r == UMBP_REG_REGISTRY || r == UMBP_REG_FREERINGS;
    if (owners != (own ? 0u : 1u)) fprintf(stderr, "region %d has %u owners\n", r, owners);
    assert_int_equal(owners, own ? 0 : 1);
    assert_true(own ? umbp_shm_region_owner(r) == NULL : umbp_shm_region_owner(r) != NULL);
  }
  for (unsigned m = 0; m < umbp_shm_n_modules; m++) {
    const struct umbp_shm_module *mod = umbp_shm_modules[m];
    assert_non_null(mod->name);
    assert_true(mod->abi_part != NULL);
    assert_true(!mod->regions || mod->region_bytes != NULL);
    assert_int_equal(mod->regions >> UMBP_REG_ARENA, 0); /* the arena is the partitions' */
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_region_owners),
      cmocka_unit_test(test_shm_full_message),
      cmocka_unit_test(test_lifecycle),
      cmocka_unit_test(test_names),
      cmocka_unit_test(test_bad_params),
      cmocka_unit_test(test_null_arguments_say_why),
      cmocka_unit_test(test_detach_twice),
      cmocka_unit_test(test_too_big_refused_before_allocation),
      cmocka_unit_test(test_layout_compute),
      cmocka_unit_test(test_header_validation),
      cmocka_unit_test(test_attach_waits_for_creator),
      cmocka_unit_test(test_registry_full),
      cmocka_unit_test(test_prefault_progress),
      cmocka_unit_test(test_metadata_populated),
      cmocka_unit_test(test_no_prefault_reserves),
      cmocka_unit_test(test_hugepages_bad_dir),
      cmocka_unit_test(test_index_pages_small),
      cmocka_unit_test(test_layout_index_huge),
  };
  const struct CMUnitTest mp_tests[] = {
      cmocka_unit_test(test_two_processes_share),
      cmocka_unit_test(test_registry_reaps_killed),
      cmocka_unit_test(test_pid_reuse),
      cmocka_unit_test(test_half_made_pool_replaced),
  };
  const struct CMUnitTest uid_tests[] = {cmocka_unit_test(test_other_uid_kept_out)};
  /* test_hugepages_reserved runs in a process of its own (group
   * "hugepages-reserved"): it needs more pages free than the others, and the
   * pages of the pools the others make are not all back before their
   * process exits */
  const struct CMUnitTest huge_tests[] = {cmocka_unit_test(test_hugepages), cmocka_unit_test(test_index_huge),
                                         cmocka_unit_test(test_hugetlbfs_dir)};
  const struct CMUnitTest huge_reserved_tests[] = {cmocka_unit_test(test_hugepages_reserved)};
  const struct CMUnitTest hugetlbfs_tests[] = {cmocka_unit_test(test_one_name_one_pool)};
  const struct CMUnitTest thread_tests[] = {cmocka_unit_test(test_two_reaper_threads)};
  const char *which = getenv("UMBP_TEST_GROUP");
  /* threads of one process (also run under TSan) */
  if (which && !strcmp(which, "threads")) return cmocka_run_group_tests_name("segment-threads", thread_tests, NULL, NULL);
  if (which && !strcmp(which, "mp")) return cmocka_run_group_tests_name("segment-mp", mp_tests, NULL, NULL);
  /* Tests that need something of the machine say so as a TAP skip of the
   * whole program (meson 1.0 counts cmocka's per-test "not ok # SKIP" as a failure). */
  if (which && !strcmp(which, "uid")) {
    if (geteuid() != 0 || !getpwnam("nobody")) {
      printf("1..0 # SKIP needs root and a 'nobody' user to attach as another uid\n");
      return 0;
    }
    return cmocka_run_group_tests_name("segment-uid", uid_tests, NULL, NULL);
  }
  if (which && !strcmp(which, "hugetlbfs")) {
    /* root without a mount: a private one in a mount namespace of our own */
    char dir[] = "/tmp/umbp-hugetlbfs-XXXXXX";
    bool own = false;
    if (umbp_hugetlbfs_mount(huge_dir, sizeof huge_dir) != 0 && geteuid() == 0 && unshare(CLONE_NEWNS) == 0 &&
        mount("none", "/", NULL, MS_REC | MS_PRIVATE, NULL) == 0 && mkdtemp(dir))
      own = mount("none", dir, "hugetlbfs", 0, NULL) == 0;
    if (umbp_hugetlbfs_mount(huge_dir, sizeof huge_dir) != 0) {
      if (dir[strlen(dir) - 1] != 'X') rmdir(dir);
      printf("1..0 # SKIP needs a hugetlbfs mount (or root, to mount a private one)\n");
      return 0;
    }
    int rc = cmocka_run_group_tests_name("segment-hugetlbfs", hugetlbfs_tests, NULL, NULL);
    if (own) {
      umount(dir);
      rmdir(dir);
    }
    return rc;
  }
  if (which && !strcmp(which, "hugepages")) {
    if (umbp_hugetlbfs_mount(huge_dir, sizeof huge_dir) != 0 || huge_free_pages() < 12) {
      printf("1..0 # SKIP needs a hugetlbfs mount and >= 12 free 2 MiB huge pages (CI sets them up as root)\n");
      return 0;
    }
    return cmocka_run_group_tests_name("segment-hugepages", huge_tests, NULL, NULL);
  }
  if (which && !strcmp(which, "hugepages-reserved")) {
    if (umbp_hugetlbfs_mount(huge_dir, sizeof huge_dir) != 0) {
      printf("1..0 # SKIP needs a hugetlbfs mount (mount -t hugetlbfs none /dev/hugepages, as root)\n");
      return 0;
    }
    long fr = huge_free_pages();
    if (fr < HUGE_RESERVED_NEED) {
      printf("1..0 # SKIP %ld free 2 MiB huge pages (HugePages_Free less HugePages_Rsvd), %d needed: give more "
             "with sysctl vm.nr_hugepages=N (as root; .ci/run sets 32)\n",
             fr, HUGE_RESERVED_NEED);
      return 0;
    }
    return cmocka_run_group_tests_name("segment-hugepages-reserved", huge_reserved_tests, NULL, NULL);
  }
  return cmocka_run_group_tests_name("segment", tests, NULL, NULL);
}
