/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Helpers shared by the topology tests: loading the real machine topologies
 * from $UMBP_SHARED_DATA/topologies and this project's fixture, and the
 * invariants every plan must keep (see the design note in src/topology/topo.c).
 */
#ifndef UMBP_TEST_TOPO_UTIL_H
#define UMBP_TEST_TOPO_UTIL_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <hwloc.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "umbp/topo.h"
#include "umbp/common.h"

/* ASan builds: see lsan.supp (the same suppression, for the CLI test). Hooks
 * the sanitizer runtimes look up by name, hence default visibility (the
 * project builds with -fvisibility=hidden); unused in other builds. */
#define TOPO_TEST_EXPORT __attribute__((visibility("default"), used))
TOPO_TEST_EXPORT const char *__lsan_default_suppressions(void);
TOPO_TEST_EXPORT const char *__asan_default_options(void);
TOPO_TEST_EXPORT const char *__lsan_default_suppressions(void) { return "leak:hwloc_topology_load\n"; }
TOPO_TEST_EXPORT const char *__asan_default_options(void) { return "fast_unwind_on_malloc=0"; }

#define POWER8 "power8gpudistances.xml"
#define E32 "32em64t-2n8c2t-pci-normalio.xml"
#define E96 "96em64t-4n4d3ca2co-pci.xml"
#define E24 "24em64t-2n6c2t-pci.xml"
/* This project's own fixture (tests/topology/unplaced-gpu.xml). */
#define FIXTURE TOPO_FIXTURE_DIR "/unplaced-gpu.xml"

#define MAXL 4096

/* ------------------------------------------------------------------------ */

static inline bool topo_dir(char *buf, size_t n) {
  const char *d = getenv("UMBP_SHARED_DATA");
  if (!d || !*d) return false;
  snprintf(buf, n, "%s/topologies", d);
  struct stat st;
  return stat(buf, &st) == 0 && S_ISDIR(st.st_mode);
}

static inline void path_of(const char *file, char *buf, size_t n) {
  char dir[PATH_MAX - 64];
  if (!topo_dir(dir, sizeof dir)) {
    print_message("# SKIP: topology data not found: set UMBP_SHARED_DATA to the shared/data "
                  "directory beside the clone (now '%s')\n",
                  getenv("UMBP_SHARED_DATA") ? getenv("UMBP_SHARED_DATA") : "(unset)");
    skip();
  }
  int w = snprintf(buf, n, "%s/%s", dir, file);
  assert_true(w > 0 && (size_t)w < n);
}

static inline umbp_topo *load_file(const char *file) {
  char p[PATH_MAX];
  path_of(file, p, sizeof p);
  umbp_topo *t = NULL;
  int rc = umbp_topo_load(p, 0, &t);
  if (rc < 0) print_message("load %s: %d %s\n", p, rc, umbp_last_error());
  assert_int_equal(rc, 0);
  assert_non_null(t);
  return t;
}

/* hwloc loaded independently, for cross-checks. */
static inline hwloc_topology_t hw_load(const char *file) {
  char p[PATH_MAX];
  path_of(file, p, sizeof p);
  hwloc_topology_t hw;
  assert_int_equal(hwloc_topology_init(&hw), 0);
  assert_int_equal(hwloc_topology_set_xml(hw, p), 0);
  assert_int_equal(hwloc_topology_set_io_types_filter(hw, HWLOC_TYPE_FILTER_KEEP_ALL), 0);
  assert_int_equal(hwloc_topology_load(hw), 0);
  return hw;
}

static inline umbp_topo_plan *plan_of(umbp_topo *t, int nranks, const int *gpus, int threads, int pol) {
  umbp_topo_plan_opts o = UMBP_TOPO_PLAN_OPTS_INIT;
  o.nranks = nranks;
  o.gpus = gpus;
  o.threads_per_rank = threads;
  o.mempolicy = pol;
  umbp_topo_plan *p = NULL;
  int rc = umbp_topo_plan_make(t, &o, &p);
  if (rc < 0) print_message("plan: %d %s\n", rc, umbp_last_error());
  assert_int_equal(rc, 0);
  assert_non_null(p);
  return p;
}

static inline bool in(const unsigned *v, int n, unsigned x) {
  for (int i = 0; i < n; i++)
    if (v[i] == x) return true;
  return false;
}

static inline bool any_note(const umbp_topo_plan *p, const char *needle) {
  for (int i = 0; i < umbp_topo_plan_note_count(p); i++)
    if (strstr(umbp_topo_plan_note(p, i), needle)) return true;
  return false;
}

static inline bool any_topo_note(const umbp_topo *t, const char *needle) {
  for (int i = 0; i < umbp_topo_note_count(t); i++)
    if (strstr(umbp_topo_note(t, i), needle)) return true;
  return false;
}

static inline bool any_rank_note(const umbp_topo_plan *p, int r, const char *needle) {
  const char *s;
  for (int i = 0; (s = umbp_topo_plan_rank_note(p, r, i)); i++)
    if (strstr(s, needle)) return true;
  return false;
}

/* PUs of the NUMA node with OS index os. */
static inline int node_pus(const umbp_topo *t, unsigned os, unsigned *out) {
  for (int i = 0; i < umbp_topo_numa_count(t); i++) {
    umbp_topo_numa_info ni;
    assert_int_equal(umbp_topo_numa_info_get(t, i, &ni), 0);
    if (ni.os_index == os) return umbp_topo_numa_pus(t, i, out, MAXL);
  }
  fail_msg("node %u is not a NUMA node with memory", os);
  return -1;
}

/* The invariants every plan keeps (design note of topo.c). */
static inline void check_invariants(const umbp_topo *t, const umbp_topo_plan *p) {
  static unsigned cpus[64][MAXL], v[MAXL], w[MAXL];
  int nr = umbp_topo_plan_nranks(p);
  int K = umbp_topo_plan_threads_per_rank(p);
  int ncp[64];
  assert_true(nr > 0);
  for (int r = 0; r < nr && r < 64; r++) {
    umbp_topo_rank_info ri;
    assert_int_equal(umbp_topo_plan_rank(p, r, &ri), 0);
    assert_int_equal(ri.rank, r);
    assert_true(ri.ncpus >= 1 && ri.ncpus <= K);
    assert_true(ri.nnotes >= 3);
    assert_int_not_equal(ri.mempolicy, UMBP_TOPO_MEM_AUTO);
    ncp[r] = umbp_topo_plan_rank_cpus(p, r, cpus[r], MAXL);
    assert_int_equal(ncp[r], ri.ncpus);
    for (int i = 0; i < ncp[r]; i++)
      for (int j = 0; j < i; j++) assert_int_not_equal(cpus[r][i], cpus[r][j]);
    /* The partition node is a node with memory. */
    int nn = node_pus(t, ri.numa_node, v);
    if (ri.gpu >= 0 && ri.gpu_local) {
      /* Every planned PU is local to the GPU and to the GPU's node. */
      int ng = umbp_topo_gpu_pus(t, ri.gpu, w, MAXL);
      assert_true(ng > 0);
      unsigned gn[64];
      int ngn = umbp_topo_gpu_numa_nodes(t, ri.gpu, gn, 64);
      assert_true(in(gn, ngn, ri.numa_node));
      for (int i = 0; i < ncp[r]; i++) {
        assert_true(in(w, ng, cpus[r][i]));
        if (nn > 0) assert_true(in(v, nn, cpus[r][i]));
      }
    } else if (nn > 0) {
      for (int i = 0; i < ncp[r]; i++) assert_true(in(v, nn, cpus[r][i]));
    }
  }
  /* Two ranks' PU sets meet only if both are flagged shared. */
  for (int a = 0; a < nr && a < 64; a++)
    for (int b = 0; b < a; b++) {
      bool meet = false;
      for (int i = 0; i < ncp[a]; i++) meet |= in(cpus[b], ncp[b], cpus[a][i]);
      if (!meet) continue;
      umbp_topo_rank_info ra, rb;
      assert_int_equal(umbp_topo_plan_rank(p, a, &ra), 0);
      assert_int_equal(umbp_topo_plan_rank(p, b, &rb), 0);
      if (!ra.shared_cpus || !rb.shared_cpus)
        fail_msg("ranks %d and %d share a PU but are not both flagged shared", a, b);
    }
}

static inline bool plan_disjoint(const umbp_topo_plan *p) {
  for (int r = 0; r < umbp_topo_plan_nranks(p); r++) {
    umbp_topo_rank_info ri;
    assert_int_equal(umbp_topo_plan_rank(p, r, &ri), 0);
    if (ri.shared_cpus) return false;
  }
  return true;
}

/* The rank's PUs sit on distinct physical cores (hwloc's view of the file). */
static inline bool distinct_cores(hwloc_topology_t hw, const umbp_topo_plan *p, int r) {
  unsigned c[MAXL];
  int n = umbp_topo_plan_rank_cpus(p, r, c, MAXL);
  for (int i = 0; i < n; i++)
    for (int j = 0; j < i; j++) {
      hwloc_obj_t a = hwloc_get_pu_obj_by_os_index(hw, c[i]);
      hwloc_obj_t b = hwloc_get_pu_obj_by_os_index(hw, c[j]);
      assert_non_null(a);
      assert_non_null(b);
      hwloc_obj_t ca = hwloc_get_ancestor_obj_by_type(hw, HWLOC_OBJ_CORE, a);
      hwloc_obj_t cb = hwloc_get_ancestor_obj_by_type(hw, HWLOC_OBJ_CORE, b);
      if (ca && ca == cb) return false;
    }
  return true;
}

static inline umbp_topo *load_fixture(void) {
  umbp_topo *t = NULL;
  int rc = umbp_topo_load(FIXTURE, 0, &t);
  if (rc < 0) print_message("load %s: %d %s\n", FIXTURE, rc, umbp_last_error());
  assert_int_equal(rc, 0);
  return t;
}

#endif
