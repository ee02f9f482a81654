/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Unit tests of the topology planner (include/umbp/topo.h) that need no
 * outside data: this project's fixture tests/topology/unplaced-gpu.xml (a GPU
 * hwloc cannot place), this machine (live load, thread binding), argument
 * and file errors. The real machine topologies are in test_topo_machines.c.
 */
#include "test_topo_util.h"

#include <sched.h>

static void test_plan_invariants_fixture_and_live(void **state) {
  (void)state;
  umbp_topo *t[2] = {load_fixture(), NULL};
  assert_int_equal(umbp_topo_load(NULL, UMBP_TOPO_LOAD_NO_CUDA, &t[1]), 0);
  static const int ranks[] = {0, 1, 2, 3, 5, 9, 33};
  static const int threads[] = {0, 1, 2, 3, 7};
  for (int k = 0; k < 2; k++) {
    for (size_t a = 0; a < sizeof ranks / sizeof ranks[0]; a++)
      for (size_t b = 0; b < sizeof threads / sizeof threads[0]; b++)
        for (int pol = UMBP_TOPO_MEM_AUTO; pol <= UMBP_TOPO_MEM_DEFAULT; pol++) {
          umbp_topo_plan *p = plan_of(t[k], ranks[a], NULL, threads[b], pol);
          check_invariants(t[k], p);
          umbp_topo_plan_free(p);
        }
    umbp_topo_free(t[k]);
  }
}

static void test_mempolicy(void **state) {
  (void)state;
  for (int pol = UMBP_TOPO_MEM_AUTO; pol <= UMBP_TOPO_MEM_DEFAULT; pol++) {
    int back = -1;
    assert_int_equal(umbp_topo_mempolicy_parse(umbp_topo_mempolicy_name(pol), &back), 0);
    assert_int_equal(back, pol);
  }
  int back = 42;
  assert_int_equal(umbp_topo_mempolicy_parse("strict", &back), -EINVAL);
  assert_int_equal(back, 42); /* untouched on failure */
  assert_int_equal(umbp_topo_mempolicy_parse(NULL, &back), -EINVAL);
  assert_string_equal(umbp_topo_mempolicy_name(99), "?");

  umbp_topo *t = load_fixture();
  unsigned m[4];
  umbp_topo_rank_info ri;
  umbp_topo_plan *p = plan_of(t, 0, NULL, 0, 0); /* auto on 2 nodes: bind */
  assert_int_equal(umbp_topo_plan_rank(p, 0, &ri), 0);
  assert_int_equal(ri.mempolicy, UMBP_TOPO_MEM_BIND);
  assert_int_equal(umbp_topo_plan_rank_mem_nodes(p, 0, m, 4), 1);
  assert_int_equal(m[0], ri.numa_node);
  assert_true(any_note(p, "auto -> bind"));
  umbp_topo_plan_free(p);
  p = plan_of(t, 0, NULL, 0, UMBP_TOPO_MEM_PREFERRED);
  assert_int_equal(umbp_topo_plan_rank(p, 1, &ri), 0);
  assert_int_equal(ri.mempolicy, UMBP_TOPO_MEM_PREFERRED);
  assert_int_equal(umbp_topo_plan_rank_mem_nodes(p, 1, m, 4), 1);
  assert_int_equal(m[0], ri.numa_node);
  umbp_topo_plan_free(p);
  p = plan_of(t, 0, NULL, 0, UMBP_TOPO_MEM_INTERLEAVE);
  assert_int_equal(umbp_topo_plan_rank_mem_nodes(p, 0, m, 4), 1); /* cuda0: node 1 only */
  assert_int_equal(m[0], 1);
  umbp_topo_plan_free(p);
  p = plan_of(t, 0, NULL, 0, UMBP_TOPO_MEM_DEFAULT);
  assert_int_equal(umbp_topo_plan_rank(p, 0, &ri), 0);
  assert_int_equal(ri.nmem_nodes, 0);
  assert_int_equal(umbp_topo_plan_rank_mem_nodes(p, 0, m, 4), 0);
  umbp_topo_plan_free(p);
  umbp_topo_free(t);
}

static void test_bad_plan_args(void **state) {
  (void)state;
  umbp_topo *t = load_fixture();
  umbp_topo_plan *p = (umbp_topo_plan *)(uintptr_t)0x1;
  umbp_topo_plan_opts o = UMBP_TOPO_PLAN_OPTS_INIT;
  static const int bad[] = {0, 2};
  o.nranks = 2;
  o.gpus = bad;
  assert_int_equal(umbp_topo_plan_make(t, &o, &p), -EINVAL);
  assert_non_null(strstr(umbp_last_error(), "GPU 2 does not exist"));
  assert_non_null(strstr(umbp_last_error(), "0-1"));
  static const int neg[] = {-2};
  o.nranks = 1;
  o.gpus = neg;
  assert_int_equal(umbp_topo_plan_make(t, &o, &p), -EINVAL);
  o = (umbp_topo_plan_opts)UMBP_TOPO_PLAN_OPTS_INIT;
  o.gpus = bad; /* nranks 0 with a list */
  assert_int_equal(umbp_topo_plan_make(t, &o, &p), -EINVAL);
  o = (umbp_topo_plan_opts)UMBP_TOPO_PLAN_OPTS_INIT;
  o.nranks = -1;
  assert_int_equal(umbp_topo_plan_make(t, &o, &p), -EINVAL);
  o.nranks = UMBP_TOPO_MAX_RANKS + 1;
  assert_int_equal(umbp_topo_plan_make(t, &o, &p), -EINVAL);
  o.nranks = 1;
  o.threads_per_rank = UMBP_TOPO_MAX_THREADS_PER_RANK + 1;
  assert_int_equal(umbp_topo_plan_make(t, &o, &p), -EINVAL);
  o.threads_per_rank = -1;
  assert_int_equal(umbp_topo_plan_make(t, &o, &p), -EINVAL);
  o.threads_per_rank = 0;
  o.mempolicy = 99;
  assert_int_equal(umbp_topo_plan_make(t, &o, &p), -EINVAL);
  assert_int_equal(umbp_topo_plan_make(NULL, NULL, &p), -EINVAL);
  assert_int_equal(umbp_topo_plan_make(t, NULL, NULL), -EINVAL);
  assert_ptr_equal(p, (umbp_topo_plan *)(uintptr_t)0x1); /* untouched */
  /* Largest allowed values work. */
  o = (umbp_topo_plan_opts)UMBP_TOPO_PLAN_OPTS_INIT;
  o.nranks = UMBP_TOPO_MAX_RANKS;
  o.threads_per_rank = 3;
  assert_int_equal(umbp_topo_plan_make(t, &o, &p), 0);
  assert_int_equal(umbp_topo_plan_nranks(p), UMBP_TOPO_MAX_RANKS);
  umbp_topo_plan_free(p);
  umbp_topo_free(t);
}

/* This project's fixture: cuda0 local to node 1, cuda1 off the machine root. */
static void test_unplaced_gpu(void **state) {
  (void)state;
  umbp_topo *t = NULL;
  int rc = umbp_topo_load(FIXTURE, 0, &t);
  if (rc < 0) print_message("load: %s\n", umbp_last_error());
  assert_int_equal(rc, 0);
  assert_int_equal(umbp_topo_gpu_count(t), 2);
  umbp_topo_gpu_info gi;
  assert_int_equal(umbp_topo_gpu_info_get(t, 1, &gi), 0);
  assert_string_equal(gi.name, "cuda1");
  assert_false(gi.placed);
  assert_int_equal(gi.nnuma, 0);
  assert_int_equal(umbp_topo_gpu_numa_nodes(t, 1, NULL, 0), 0);
  assert_int_equal(umbp_topo_gpu_pus(t, 1, NULL, 0), 0);
  assert_true(any_topo_note(t, "cannot place"));
  assert_int_equal(umbp_topo_gpu_info_get(t, 0, &gi), 0);
  assert_true(gi.placed);
  unsigned n1;
  assert_int_equal(umbp_topo_gpu_numa_nodes(t, 0, &n1, 1), 1);
  assert_int_equal(n1, 1);

  umbp_topo_plan *p = plan_of(t, 0, NULL, 0, 0);
  check_invariants(t, p);
  assert_true(plan_disjoint(p));
  assert_true(any_note(p, "hwloc cannot place GPU 1"));
  umbp_topo_rank_info ri;
  assert_int_equal(umbp_topo_plan_rank(p, 0, &ri), 0);
  assert_int_equal(ri.numa_node, 1);
  assert_true(ri.gpu_local);
  assert_int_equal(umbp_topo_plan_rank(p, 1, &ri), 0);
  assert_int_equal(ri.gpu, 1);
  assert_false(ri.gpu_local);
  assert_int_equal(ri.numa_node, 0); /* the node rank 0 left free */
  assert_true(any_rank_note(p, 1, "cannot place"));
  umbp_topo_plan_free(p);
  /* Interleave for a GPU without locality: over every node. */
  p = plan_of(t, 0, NULL, 0, UMBP_TOPO_MEM_INTERLEAVE);
  assert_int_equal(umbp_topo_plan_rank_mem_nodes(p, 1, NULL, 0), 2);
  umbp_topo_plan_free(p);
  umbp_topo_free(t);
}

/* The same machine with no memory sizes: every node still counts. */
static void test_no_memory_sizes(void **state) {
  (void)state;
  FILE *in = fopen(FIXTURE, "r");
  assert_non_null(in);
  static char buf[1 << 16];
  size_t n = fread(buf, 1, sizeof buf - 1, in);
  fclose(in);
  buf[n] = 0;
  char path[] = "/tmp/umbp-topo-nomem-XXXXXX";
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  FILE *out = fdopen(fd, "w");
  assert_non_null(out);
  for (char *s = buf, *q; *s; s = q) {
    q = strstr(s, " local_memory=\"");
    if (!q) {
      fputs(s, out);
      break;
    }
    fwrite(s, 1, (size_t)(q - s), out);
    q = strchr(q + strlen(" local_memory=\""), '"') + 1;
  }
  fclose(out);
  umbp_topo *t = NULL;
  assert_int_equal(umbp_topo_load(path, 0, &t), 0);
  unlink(path);
  assert_int_equal(umbp_topo_numa_count(t), 2);
  assert_true(any_topo_note(t, "no memory size"));
  umbp_topo_plan *p = plan_of(t, 0, NULL, 0, 0);
  check_invariants(t, p);
  umbp_topo_plan_free(p);
  umbp_topo_free(t);
}

static void test_single_numa_node_live(void **state) {
  (void)state;
  umbp_topo *t = NULL;
  assert_int_equal(umbp_topo_load(NULL, 0, &t), 0);
  assert_true(umbp_topo_is_live(t));
  assert_string_equal(umbp_topo_source(t), "this machine");
  assert_true(umbp_topo_pu_count(t) >= 1);
  umbp_topo_plan *p = plan_of(t, 0, NULL, 0, 0);
  check_invariants(t, p);
  if (umbp_topo_numa_count(t) == 1) {
    assert_true(any_note(p, "one NUMA node"));
    umbp_topo_rank_info ri;
    assert_int_equal(umbp_topo_plan_rank(p, 0, &ri), 0);
    assert_int_equal(ri.mempolicy, UMBP_TOPO_MEM_DEFAULT);
    assert_int_equal(ri.nmem_nodes, 0);
  } else {
    print_message("# this machine has %d NUMA nodes: single-node note not checked\n",
                  umbp_topo_numa_count(t));
  }
  if (umbp_topo_gpu_count(t) == 0) assert_true(any_note(p, "no CUDA GPU found on this machine"));
  umbp_topo_plan_free(p);
  umbp_topo_free(t);
  /* Without the CUDA runtime: no note from it. */
  assert_int_equal(umbp_topo_load(NULL, UMBP_TOPO_LOAD_NO_CUDA, &t), 0);
  assert_false(any_topo_note(t, "CUDA runtime"));
  umbp_topo_free(t);
}

static void test_bad_files(void **state) {
  (void)state;
  umbp_topo *t = (umbp_topo *)(uintptr_t)0x1;
  assert_int_equal(umbp_topo_load("/nonexistent/dir/topo.xml", 0, &t), -ENOENT);
  assert_non_null(strstr(umbp_last_error(), "does not exist"));
  assert_non_null(strstr(umbp_last_error(), "lstopo"));
  assert_int_equal(umbp_topo_load("", 0, &t), -EINVAL);
  assert_int_equal(umbp_topo_load("/tmp", 0, &t), -EINVAL);
  assert_non_null(strstr(umbp_last_error(), "directory"));
  /* Not a regular file: refused before any read (/dev/zero never ends, a FIFO
   * without a writer would block the open). */
  assert_int_equal(umbp_topo_load("/dev/zero", 0, &t), -EINVAL);
  assert_non_null(strstr(umbp_last_error(), "'/dev/zero' is a character device"));
  assert_int_equal(umbp_topo_load("/dev/full", 0, &t), -EINVAL);
  char fifo[] = "/tmp/umbp-topo-fifo-XXXXXX";
  int ffd = mkstemp(fifo);
  assert_true(ffd >= 0);
  close(ffd);
  unlink(fifo);
  assert_int_equal(mkfifo(fifo, 0600), 0);
  assert_int_equal(umbp_topo_load(fifo, 0, &t), -EINVAL);
  assert_non_null(strstr(umbp_last_error(), "is a pipe"));
  unlink(fifo);
  /* Over the size bound (a sparse file: no disk used): refused by its size. */
  char big[] = "/tmp/umbp-topo-big-XXXXXX";
  int bfd = mkstemp(big);
  assert_true(bfd >= 0);
  assert_int_equal(ftruncate(bfd, (16 << 20) + 1), 0);
  close(bfd);
  assert_int_equal(umbp_topo_load(big, 0, &t), -EINVAL);
  assert_non_null(strstr(umbp_last_error(), "over the 16 MiB"));
  assert_non_null(strstr(umbp_last_error(), big));
  unlink(big);
  assert_int_equal(umbp_topo_load(NULL, 0x80, &t), -EINVAL);
  assert_int_equal(umbp_topo_load(NULL, 0, NULL), -EINVAL);
  assert_ptr_equal(t, (umbp_topo *)(uintptr_t)0x1);

  static const char *const bodies[] = {
      "this is not XML\n",
      "<?xml version=\"1.0\"?>\n<topology version=\"2.0\"><object type=\"Machine\"",
      "<?xml version=\"1.0\"?>\n<html><body>hello</body></html>\n",
      "",
  };
  for (size_t i = 0; i < sizeof bodies / sizeof bodies[0]; i++) {
    char path[] = "/tmp/umbp-topo-bad-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    size_t len = strlen(bodies[i]);
    assert_int_equal(write(fd, bodies[i], len), (ssize_t)len);
    close(fd);
    int rc = umbp_topo_load(path, 0, &t);
    if (rc != -EBADMSG) print_message("body %zu: rc %d (%s)\n", i, rc, umbp_last_error());
    assert_int_equal(rc, -EBADMSG);
    assert_non_null(strstr(umbp_last_error(), path));
    assert_ptr_equal(t, (umbp_topo *)(uintptr_t)0x1);
    unlink(path);
  }
  /* Unreadable file (skipped as root, who can read anything). */
  if (geteuid() != 0) {
    char path[] = "/tmp/umbp-topo-noread-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    chmod(path, 0);
    assert_int_equal(umbp_topo_load(path, 0, &t), -EACCES);
    unlink(path);
  }
}

/* The fixture with every `from` replaced by `to` (from may end in a prefix
 * of digits: "os_index=\"" replaces the number after it), into a temp file. */
static void write_variant(char *path, const char *from, const char *to, bool number) {
  char src[512];
  snprintf(src, sizeof src, "%s/unplaced-gpu.xml", TOPO_FIXTURE_DIR);
  FILE *in = fopen(src, "r");
  assert_non_null(in);
  static char buf[1 << 16], outb[1 << 17];
  size_t n = fread(buf, 1, sizeof buf - 1, in);
  fclose(in);
  buf[n] = 0;
  size_t o = 0, fl = strlen(from), tl = strlen(to);
  for (const char *p = buf; *p;) {
    if (!strncmp(p, from, fl)) {
      memcpy(outb + o, to, tl);
      o += tl;
      p += fl;
      if (number)
        while (*p >= '0' && *p <= '9') p++;
    } else {
      outb[o++] = *p++;
    }
    assert_true(o + 64 < sizeof outb);
  }
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  assert_int_equal(write(fd, outb, o), (ssize_t)o);
  close(fd);
}

/* A crafted file (issue 32, item 13): every os_index 4294967295 took 1 GB
 * of RSS for 8 PUs (the OOM killer with --ranks 64); duplicate NUMA indexes
 * made two partitions of one node. Refused, naming the file and the index. */
static void test_crafted_os_indexes(void **state) {
  (void)state;
  struct {
    const char *from, *to;
    bool number;
    const char *word;
  } cases[] = {
      {"os_index=\"", "os_index=\"4294967295", true, "the OS index 4294967295, beyond"},
      {"NUMANode\" os_index=\"1\"", "NUMANode\" os_index=\"0\"", false, "gives OS index 0 to two NUMA nodes"},
      {"PU\" os_index=\"7\"", "PU\" os_index=\"70000\"", false, "PU L#7 the OS index 70000, beyond 65535"},
      {"NUMANode\" os_index=\"1\"", "NUMANode\" os_index=\"1024\"", false, "NUMA node L#1 the OS index 1024"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char path[] = "/tmp/umbp-topo-crafted-XXXXXX";
    write_variant(path, cases[i].from, cases[i].to, cases[i].number);
    umbp_topo *t = NULL;
    int rc = umbp_topo_load(path, 0, &t);
    if (rc != -EBADMSG || !strstr(umbp_last_error(), cases[i].word))
      print_message("case %zu: rc %d (%s)\n", i, rc, umbp_last_error());
    if (rc == 0) umbp_topo_free(t);
    assert_int_equal(rc, -EBADMSG);
    assert_non_null(strstr(umbp_last_error(), cases[i].word));
    assert_non_null(strstr(umbp_last_error(), path));
    unlink(path);
  }
}

/* A file of one PU and one node inside `levels` nested Groups. */
static void write_nested(char *path, int levels) {
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  FILE *f = fdopen(fd, "w");
  assert_non_null(f);
  static const char *const set = "cpuset=\"0x1\" complete_cpuset=\"0x1\" nodeset=\"0x1\" complete_nodeset=\"0x1\"";
  fprintf(f, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<!DOCTYPE topology SYSTEM \"hwloc2.dtd\">\n"
             "<topology version=\"2.0\">\n<object type=\"Machine\" os_index=\"0\" %s allowed_cpuset=\"0x1\" "
             "allowed_nodeset=\"0x1\">\n<object type=\"NUMANode\" os_index=\"0\" %s local_memory=\"1073741824\"/>\n",
          set, set);
  for (int i = 0; i < levels; i++) fprintf(f, "<object type=\"Group\" %s>\n", set);
  fprintf(f, "<object type=\"PU\" os_index=\"0\" %s/>\n", set);
  for (int i = 0; i < levels; i++) fputs("</object>\n", f);
  fputs("</object>\n</topology>\n", f);
  assert_int_equal(fclose(f), 0);
}

/* hwloc's XML importer recurses once per nested element with no bound: 20000
 * nested Groups overflowed the stack (SIGSEGV). Refused before hwloc sees
 * them; a hundred levels, already far more than a real machine, still load. */
static void test_deep_nesting(void **state) {
  (void)state;
  char path[] = "/tmp/umbp-topo-deep-XXXXXX";
  write_nested(path, 20000);
  umbp_topo *t = NULL;
  int rc = umbp_topo_load(path, 0, &t);
  if (rc != -EBADMSG) print_message("rc %d (%s)\n", rc, umbp_last_error());
  if (rc == 0) umbp_topo_free(t);
  assert_int_equal(rc, -EBADMSG);
  assert_non_null(strstr(umbp_last_error(), "nests its elements more than"));
  assert_non_null(strstr(umbp_last_error(), path));
  unlink(path);
  char ok[] = "/tmp/umbp-topo-nested-XXXXXX";
  write_nested(ok, 100);
  rc = umbp_topo_load(ok, 0, &t);
  if (rc != 0) print_message("rc %d (%s)\n", rc, umbp_last_error());
  assert_int_equal(rc, 0);
  assert_int_equal(umbp_topo_pu_count(t), 1);
  umbp_topo_free(t);
  unlink(ok);
}

static void test_null_and_ranges(void **state) {
  (void)state;
  umbp_topo_free(NULL);
  umbp_topo_plan_free(NULL);
  assert_int_equal(umbp_topo_gpu_count(NULL), -EINVAL);
  assert_int_equal(umbp_topo_numa_count(NULL), -EINVAL);
  assert_int_equal(umbp_topo_plan_nranks(NULL), -EINVAL);
  assert_null(umbp_topo_plan_note(NULL, 0));
  assert_null(umbp_topo_note(NULL, 0));
  assert_false(umbp_topo_is_live(NULL));
  umbp_topo *t = load_fixture();
  umbp_topo_numa_info ni;
  assert_int_equal(umbp_topo_numa_info_get(t, 2, &ni), -EINVAL);
  assert_int_equal(umbp_topo_numa_info_get(t, -1, &ni), -EINVAL);
  assert_int_equal(umbp_topo_numa_info_get(t, 1, &ni), 0);
  assert_int_equal(ni.os_index, 1);
  assert_int_equal(ni.memory_bytes, 1073741824);
  assert_int_equal(ni.npus, 4);
  assert_int_equal(ni.ncores, 2);
  unsigned v[4];
  assert_int_equal(umbp_topo_numa_pus(t, 0, NULL, 4), -EINVAL);
  assert_int_equal(umbp_topo_numa_pus(t, 1, v, 2), 4); /* full count, 2 written */
  assert_int_equal(v[0], 4);
  assert_int_equal(v[1], 5);
  assert_null(umbp_topo_note(t, 1000));
  umbp_topo_plan *p = plan_of(t, 2, NULL, 0, 0);
  umbp_topo_rank_info ri;
  assert_int_equal(umbp_topo_plan_rank(p, 2, &ri), -EINVAL);
  assert_int_equal(umbp_topo_plan_rank_cpus(p, -1, v, 4), -EINVAL);
  assert_null(umbp_topo_plan_rank_note(p, 0, 1000));
  assert_null(umbp_topo_plan_rank_note(p, 5, 0));
  assert_ptr_equal(umbp_topo_plan_topo(p), t);
  /* The plan keeps the topology alive: free the topology first. */
  umbp_topo_free(t);
  assert_int_equal(umbp_topo_gpu_count(umbp_topo_plan_topo(p)), 2);
  assert_int_equal(umbp_topo_plan_rank(p, 1, &ri), 0);
  assert_int_equal(ri.gpu, 1);
  umbp_topo_plan_free(p);
}

/* ------------------------------------------------------------------------ */
/* Applying                                                                 */

static void test_apply_refuses_xml(void **state) {
  (void)state;
  umbp_topo *t = load_fixture();
  umbp_topo_plan *p = plan_of(t, 0, NULL, 0, 0);
  char desc[64] = "untouched";
  assert_int_equal(umbp_topo_apply_thread(p, 0, 0, 0, desc, sizeof desc), -EINVAL);
  assert_non_null(strstr(umbp_last_error(), "topology file"));
  assert_non_null(strstr(umbp_last_error(), "umbp_topo_load(NULL"));
  assert_string_equal(desc, "untouched");
  umbp_topo_plan_free(p);
  umbp_topo_free(t);
}

static int affinity_list(unsigned *out, int max) {
  cpu_set_t s;
  CPU_ZERO(&s);
  assert_int_equal(sched_getaffinity(0, sizeof s, &s), 0);
  int n = 0;
  for (int c = 0; c < CPU_SETSIZE; c++)
    if (CPU_ISSET(c, &s) && n < max) out[n++] = (unsigned)c;
  return n;
}

static void test_apply_live(void **state) {
  (void)state;
  cpu_set_t saved;
  assert_int_equal(sched_getaffinity(0, sizeof saved, &saved), 0);
  umbp_topo *t = NULL;
  assert_int_equal(umbp_topo_load(NULL, UMBP_TOPO_LOAD_NO_CUDA, &t), 0);
  umbp_topo_plan *p = plan_of(t, 1, NULL, 0, 0);
  unsigned cpus[64], got[CPU_SETSIZE];
  int n = umbp_topo_plan_rank_cpus(p, 0, cpus, 64);
  assert_true(n >= 1);
  char desc[512];

  /* Thread 0 -> the rank's first PU only. */
  int rc = umbp_topo_apply_thread(p, 0, 0, 0, desc, sizeof desc);
  if (rc < 0) print_message("apply: %d %s\n", rc, umbp_last_error());
  assert_int_equal(rc, 0);
  print_message("# %s\n", desc);
  assert_int_equal(affinity_list(got, CPU_SETSIZE), 1);
  assert_int_equal(got[0], cpus[0]);
  assert_non_null(strstr(desc, "rank 0 thread 0"));

  /* Thread n -> wraps to PU 0 again; thread 1 -> the second PU. */
  if (n > 1) {
    assert_int_equal(umbp_topo_apply_thread(p, 0, 1, 0, NULL, 0), 0);
    assert_int_equal(affinity_list(got, CPU_SETSIZE), 1);
    assert_int_equal(got[0], cpus[1]);
    assert_int_equal(umbp_topo_apply_thread(p, 0, n, 0, NULL, 0), 0);
    assert_int_equal(affinity_list(got, CPU_SETSIZE), 1);
    assert_int_equal(got[0], cpus[0]);
  }

  /* All threads -> the whole set. */
  assert_int_equal(umbp_topo_apply_thread(p, 0, -1, 0, desc, sizeof desc), 0);
  int m = affinity_list(got, CPU_SETSIZE);
  assert_int_equal(m, n);
  for (int i = 0; i < n; i++) assert_true(in(got, m, cpus[i]));

  /* Small buffer: truncated, NUL-terminated. */
  char small[8];
  assert_int_equal(umbp_topo_apply_thread(p, 0, 0, 0, small, sizeof small), 0);
  assert_int_equal(strlen(small), sizeof small - 1);

  /* Bad arguments. */
  assert_int_equal(umbp_topo_apply_thread(p, 1, 0, 0, NULL, 0), -EINVAL);
  assert_int_equal(umbp_topo_apply_thread(p, 0, 0, 0x80, NULL, 0), -EINVAL);
  assert_int_equal(umbp_topo_apply_thread(NULL, 0, 0, 0, NULL, 0), -EINVAL);
  assert_int_equal(umbp_topo_apply_thread(p, 0, 0, 0, desc, 0), -EINVAL);
  umbp_topo_plan_free(p);

  /* Memory binding too, with an explicit bind policy. Containers without
   * CAP_SYS_NICE may refuse set_mempolicy: then it must fail cleanly and
   * leave the CPU binding as it was. */
  p = plan_of(t, 1, NULL, 0, UMBP_TOPO_MEM_BIND);
  assert_int_equal(sched_setaffinity(0, sizeof saved, &saved), 0);
  int before = affinity_list(got, CPU_SETSIZE);
  rc = umbp_topo_apply_thread(p, 0, 0, UMBP_TOPO_APPLY_MEMBIND, desc, sizeof desc);
  if (rc == 0) {
    print_message("# %s\n", desc);
    assert_non_null(strstr(desc, "memory binding bind"));
    hwloc_topology_t hw;
    assert_int_equal(hwloc_topology_init(&hw), 0);
    assert_int_equal(hwloc_topology_load(hw), 0);
    hwloc_bitmap_t ns = hwloc_bitmap_alloc();
    hwloc_membind_policy_t pol;
    assert_int_equal(hwloc_get_membind(hw, ns, &pol, HWLOC_MEMBIND_THREAD | HWLOC_MEMBIND_BYNODESET), 0);
    assert_int_equal(pol, HWLOC_MEMBIND_BIND);
    umbp_topo_rank_info ri;
    assert_int_equal(umbp_topo_plan_rank(p, 0, &ri), 0);
    assert_true(hwloc_bitmap_isset(ns, ri.numa_node));
    /* Put the thread's memory policy back to the default. */
    hwloc_set_membind(hw, ns, HWLOC_MEMBIND_DEFAULT, HWLOC_MEMBIND_THREAD | HWLOC_MEMBIND_BYNODESET);
    hwloc_bitmap_free(ns);
    hwloc_topology_destroy(hw);
  } else {
    print_message("# membind refused here (%d: %s): checking the CPU binding was undone\n", rc,
                  umbp_last_error());
    assert_true(rc == -EPERM || rc == -ENOSYS || rc == -EINVAL || rc == -EXDEV);
    assert_int_equal(affinity_list(got, CPU_SETSIZE), before);
  }
  umbp_topo_plan_free(p);
  umbp_topo_free(t);
  assert_int_equal(sched_setaffinity(0, sizeof saved, &saved), 0);
}
int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_plan_invariants_fixture_and_live),
      cmocka_unit_test(test_mempolicy),
      cmocka_unit_test(test_bad_plan_args),
      cmocka_unit_test(test_unplaced_gpu),
      cmocka_unit_test(test_no_memory_sizes),
      cmocka_unit_test(test_single_numa_node_live),
      cmocka_unit_test(test_bad_files),
      cmocka_unit_test(test_null_and_ranges),
      cmocka_unit_test(test_apply_refuses_xml),
      cmocka_unit_test(test_crafted_os_indexes),
      cmocka_unit_test(test_deep_nesting),
      cmocka_unit_test(test_apply_live),
  };
  return cmocka_run_group_tests_name("topo", tests, NULL, NULL);
}
