/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Topology planner on real machines: the hwloc XML exports in
 * $UMBP_SHARED_DATA/topologies (see ../shared/data/README.md; never copied into
 * this project). What each file implies is checked twice: against the
 * README's statement (cuda0,cuda1 on node 0 ...) and, for "local" and
 * "physical core", against hwloc's own answer for the same file.
 *
 * Without that directory the whole test reports SKIP with the reason (a TAP
 * "1..0 # SKIP" plan: cmocka 1.1.5 prints a skip() as "not ok # SKIP", which
 * meson counts as a failure). A single missing file inside it is a broken
 * checkout and fails through skip().
 */
#include "test_topo_util.h"

static const char *const all_files[] = {POWER8, E32, E96, E24};

/* ------------------------------------------------------------------------ */
/* GPU -> NUMA mapping of each file                                         */

static void test_power8_gpu_numa(void **state) {
  (void)state;
  umbp_topo *t = load_file(POWER8);
  assert_int_equal(umbp_topo_package_count(t), 2);
  assert_int_equal(umbp_topo_numa_count(t), 2);
  assert_int_equal(umbp_topo_pu_count(t), 16);
  assert_int_equal(umbp_topo_core_count(t), 8);
  assert_false(umbp_topo_is_live(t));
  assert_int_equal(umbp_topo_gpu_count(t), 4);
  static const char *bus[] = {"0002:01:00.0", "0003:01:00.0", "000a:01:00.0", "000b:01:00.0"};
  static const unsigned node[] = {0, 0, 1, 1};
  for (int g = 0; g < 4; g++) {
    umbp_topo_gpu_info gi;
    assert_int_equal(umbp_topo_gpu_info_get(t, g, &gi), 0);
    char name[16];
    snprintf(name, sizeof name, "cuda%d", g);
    assert_string_equal(gi.name, name);
    assert_string_equal(gi.pci_bus_id, bus[g]);
    assert_int_equal(gi.cuda_ordinal, g);
    assert_int_equal(gi.source, UMBP_TOPO_GPU_FROM_HWLOC_CUDA);
    assert_true(gi.placed);
    assert_non_null(strstr(gi.vendor, "NVIDIA"));
    assert_non_null(strstr(gi.model, "P100"));
    unsigned nodes[8];
    assert_int_equal(umbp_topo_gpu_numa_nodes(t, g, nodes, 8), 1);
    assert_int_equal(nodes[0], node[g]);
    /* Local PUs = the node's PUs here (the GPU hangs off the package). */
    unsigned pus[64], np[64];
    int n = umbp_topo_gpu_pus(t, g, pus, 64);
    assert_int_equal(n, 8);
    assert_int_equal(node_pus(t, node[g], np), 8);
    assert_memory_equal(pus, np, 8 * sizeof *pus);
  }
  /* Count queries: (NULL, 0) gives the count alone. */
  assert_int_equal(umbp_topo_gpu_pus(t, 0, NULL, 0), 8);
  umbp_topo_gpu_info gi;
  assert_int_equal(umbp_topo_gpu_info_get(t, 4, &gi), -EINVAL);
  assert_non_null(strstr(umbp_last_error(), "GPU 4 does not exist"));
  umbp_topo_free(t);
}

static void test_e32_one_gpu(void **state) {
  (void)state;
  umbp_topo *t = load_file(E32);
  assert_int_equal(umbp_topo_numa_count(t), 2);
  assert_int_equal(umbp_topo_pu_count(t), 32);
  assert_int_equal(umbp_topo_gpu_count(t), 1);
  umbp_topo_gpu_info gi;
  assert_int_equal(umbp_topo_gpu_info_get(t, 0, &gi), 0);
  assert_string_equal(gi.name, "cuda0");
  assert_string_equal(gi.pci_bus_id, "0000:84:00.0");
  assert_true(gi.placed);
  unsigned nodes[4];
  assert_int_equal(umbp_topo_gpu_numa_nodes(t, 0, nodes, 4), 1);
  /* Cross-check with hwloc: the node of the PCI device's non-I/O ancestor. */
  hwloc_topology_t hw = hw_load(E32);
  hwloc_obj_t pci = hwloc_get_pcidev_by_busid(hw, 0, 0x84, 0, 0);
  assert_non_null(pci);
  hwloc_obj_t anc = hwloc_get_non_io_ancestor_obj(hw, pci);
  assert_int_equal(hwloc_bitmap_weight(anc->nodeset), 1);
  assert_int_equal(nodes[0], (unsigned)hwloc_bitmap_first(anc->nodeset));
  assert_int_equal(nodes[0], 1);
  hwloc_topology_destroy(hw);
  /* The NVIDIA card without a CUDA device is reported, not used. */
  assert_true(any_topo_note(t, "0000:83:00.0"));
  umbp_topo_plan *p = plan_of(t, 0, NULL, 0, 0);
  assert_int_equal(umbp_topo_plan_nranks(p), 1);
  umbp_topo_rank_info ri;
  assert_int_equal(umbp_topo_plan_rank(p, 0, &ri), 0);
  assert_int_equal(ri.gpu, 0);
  assert_int_equal(ri.numa_node, 1);
  assert_true(ri.gpu_local);
  assert_int_equal(ri.ncpus, 2);
  check_invariants(t, p);
  umbp_topo_plan_free(p);
  umbp_topo_free(t);
}

/* ------------------------------------------------------------------------ */
/* Plans: locality, disjointness, physical cores first                      */

static void test_plan_cores_local_all_files(void **state) {
  (void)state;
  for (size_t f = 0; f < sizeof all_files / sizeof all_files[0]; f++) {
    umbp_topo *t = load_file(all_files[f]);
    static const int ranks[] = {0, 1, 2, 3, 4, 7, 8, 16, 40};
    static const int threads[] = {0, 1, 2, 3, 8};
    for (size_t a = 0; a < sizeof ranks / sizeof ranks[0]; a++)
      for (size_t b = 0; b < sizeof threads / sizeof threads[0]; b++) {
        umbp_topo_plan *p = plan_of(t, ranks[a], NULL, threads[b], 0);
        check_invariants(t, p);
        umbp_topo_plan_free(p);
      }
    umbp_topo_free(t);
  }
}

static void test_power8_plan_disjoint(void **state) {
  (void)state;
  umbp_topo *t = load_file(POWER8);
  hwloc_topology_t hw = hw_load(POWER8);
  umbp_topo_plan *p = plan_of(t, 0, NULL, 0, 0);
  assert_int_equal(umbp_topo_plan_nranks(p), 4);
  assert_int_equal(umbp_topo_plan_threads_per_rank(p), UMBP_TOPO_DEFAULT_THREADS_PER_RANK);
  check_invariants(t, p);
  assert_true(plan_disjoint(p));
  static const unsigned node[] = {0, 0, 1, 1};
  for (int r = 0; r < 4; r++) {
    umbp_topo_rank_info ri;
    assert_int_equal(umbp_topo_plan_rank(p, r, &ri), 0);
    assert_int_equal(ri.gpu, r);
    assert_int_equal(ri.numa_node, node[r]);
    assert_true(ri.gpu_local);
    assert_false(ri.shared_cpus);
    assert_int_equal(ri.ncpus, 2);
    assert_int_equal(ri.mempolicy, UMBP_TOPO_MEM_BIND);
    /* Two ranks per 4-core node: each gets two whole cores. */
    assert_true(distinct_cores(hw, p, r));
  }
  unsigned nodes[4];
  assert_int_equal(umbp_topo_plan_numa_nodes(p, nodes, 4), 2);
  assert_int_equal(nodes[0], 0);
  assert_int_equal(nodes[1], 1);
  umbp_topo_plan_free(p);

  /* 4 threads per rank: 2 ranks x 4 = the node's 8 PUs, still disjoint; each
   * rank's slice is 2 cores, so it takes both PUs of each. */
  p = plan_of(t, 0, NULL, 4, 0);
  check_invariants(t, p);
  assert_true(plan_disjoint(p));
  assert_true(any_rank_note(p, 0, "hyperthread sibling(s) among them"));
  umbp_topo_plan_free(p);
  hwloc_topology_destroy(hw);
  umbp_topo_free(t);
}

static void test_physical_cores_first(void **state) {
  (void)state;
  umbp_topo *t = load_file(E32);
  hwloc_topology_t hw = hw_load(E32);
  /* Node 1 has 8 cores x 2 PUs: 8 threads fit one per core. */
  umbp_topo_plan *p = plan_of(t, 1, NULL, 8, 0);
  umbp_topo_rank_info ri;
  assert_int_equal(umbp_topo_plan_rank(p, 0, &ri), 0);
  assert_int_equal(ri.ncpus, 8);
  assert_true(distinct_cores(hw, p, 0));
  check_invariants(t, p);
  umbp_topo_plan_free(p);
  /* 10 threads: 8 cores + 2 siblings, not shared with anyone. */
  p = plan_of(t, 1, NULL, 10, 0);
  assert_int_equal(umbp_topo_plan_rank(p, 0, &ri), 0);
  assert_int_equal(ri.ncpus, 10);
  assert_false(ri.shared_cpus);
  assert_false(distinct_cores(hw, p, 0));
  /* ... and the first 8 (the first threads) are still one per core. */
  unsigned c[16];
  assert_int_equal(umbp_topo_plan_rank_cpus(p, 0, c, 16), 10);
  for (int i = 0; i < 8; i++)
    for (int j = 0; j < i; j++)
      assert_ptr_not_equal(
          hwloc_get_ancestor_obj_by_type(hw, HWLOC_OBJ_CORE, hwloc_get_pu_obj_by_os_index(hw, c[i])),
          hwloc_get_ancestor_obj_by_type(hw, HWLOC_OBJ_CORE, hwloc_get_pu_obj_by_os_index(hw, c[j])));
  umbp_topo_plan_free(p);
  hwloc_topology_destroy(hw);
  umbp_topo_free(t);
}

static void test_plan_shared_when_scarce(void **state) {
  (void)state;
  umbp_topo *t = load_file(POWER8);
  /* 12 ranks x 3 threads on 2 x 8 PUs. */
  umbp_topo_plan *p = plan_of(t, 12, NULL, 3, 0);
  check_invariants(t, p);
  assert_false(plan_disjoint(p));
  assert_true(any_note(p, "scarce"));
  assert_true(any_note(p, "12 ranks but 4 GPU(s)"));
  int nshared = 0;
  for (int r = 0; r < 12; r++) {
    umbp_topo_rank_info ri;
    assert_int_equal(umbp_topo_plan_rank(p, r, &ri), 0);
    assert_int_equal(ri.gpu, r % 4);
    assert_int_equal(ri.ncpus, 3);
    if (ri.shared_cpus) {
      nshared++;
      assert_true(any_rank_note(p, r, "also used by rank"));
    }
  }
  assert_true(nshared > 0);
  umbp_topo_plan_free(p);
  /* One rank wanting more PUs than its GPU has: it gets all 8, says so. */
  p = plan_of(t, 1, NULL, 32, 0);
  umbp_topo_rank_info ri;
  assert_int_equal(umbp_topo_plan_rank(p, 0, &ri), 0);
  assert_int_equal(ri.ncpus, 8);
  assert_false(ri.shared_cpus);
  assert_true(any_rank_note(p, 0, "only 8 PU(s)"));
  check_invariants(t, p);
  umbp_topo_plan_free(p);
  umbp_topo_free(t);
}

static void test_explicit_gpus(void **state) {
  (void)state;
  umbp_topo *t = load_file(POWER8);
  static const int g23[] = {2, 3};
  umbp_topo_plan *p = plan_of(t, 2, g23, 0, 0);
  check_invariants(t, p);
  assert_true(plan_disjoint(p));
  unsigned nodes[4];
  assert_int_equal(umbp_topo_plan_numa_nodes(p, nodes, 4), 1);
  assert_int_equal(nodes[0], 1);
  umbp_topo_rank_info ri;
  assert_int_equal(umbp_topo_plan_rank(p, 1, &ri), 0);
  assert_int_equal(ri.gpu, 3);
  assert_int_equal(ri.numa_node, 1);
  umbp_topo_plan_free(p);
  /* The same GPU twice, and a rank without GPU. */
  static const int g00[] = {0, 0, -1};
  p = plan_of(t, 3, g00, 0, 0);
  check_invariants(t, p);
  assert_true(plan_disjoint(p));
  assert_true(any_note(p, "shared by ranks 0,1"));
  assert_int_equal(umbp_topo_plan_rank(p, 2, &ri), 0);
  assert_int_equal(ri.gpu, -1);
  assert_false(ri.gpu_local);
  /* Node 0 already holds two ranks: the GPU-less rank goes to node 1. */
  assert_int_equal(ri.numa_node, 1);
  umbp_topo_plan_free(p);
  umbp_topo_free(t);
}

/* ------------------------------------------------------------------------ */
/* Fallbacks                                                                */

static void test_fallback_no_gpu(void **state) {
  (void)state;
  umbp_topo *t = load_file(E24);
  assert_int_equal(umbp_topo_gpu_count(t), 0);
  assert_int_equal(umbp_topo_numa_count(t), 2);
  umbp_topo_plan *p = plan_of(t, 0, NULL, 0, 0);
  assert_int_equal(umbp_topo_plan_nranks(p), 2); /* one per node with memory */
  assert_true(any_note(p, "no CUDA GPU found"));
  assert_true(any_note(p, "round-robin"));
  check_invariants(t, p);
  umbp_topo_plan_free(p);
  p = plan_of(t, 5, NULL, 3, 0);
  check_invariants(t, p);
  assert_true(plan_disjoint(p)); /* 3 ranks x 3 on node 0's 12 PUs */
  for (int r = 0; r < 5; r++) {
    umbp_topo_rank_info ri;
    assert_int_equal(umbp_topo_plan_rank(p, r, &ri), 0);
    assert_int_equal(ri.gpu, -1);
    assert_false(ri.gpu_local);
    assert_int_equal(ri.numa_node, (unsigned)(r % 2));
    assert_true(any_rank_note(p, r, "no GPU"));
  }
  umbp_topo_plan_free(p);
  umbp_topo_free(t);
}

static void test_fallback_gpu_without_cuda(void **state) {
  (void)state;
  umbp_topo *t = load_file(E96);
  assert_int_equal(umbp_topo_numa_count(t), 4);
  assert_int_equal(umbp_topo_pu_count(t), 96);
  /* card0 is a display GPU with no CUDA device: reported, not a rank GPU. */
  assert_int_equal(umbp_topo_gpu_count(t), 0);
  assert_true(any_topo_note(t, "card0"));
  assert_true(any_topo_note(t, "no CUDA device"));
  umbp_topo_plan *p = plan_of(t, 0, NULL, 0, 0);
  assert_int_equal(umbp_topo_plan_nranks(p), 4);
  assert_true(any_note(p, "no CUDA GPU found"));
  assert_true(any_note(p, "without a CUDA device"));
  check_invariants(t, p);
  assert_true(plan_disjoint(p));
  unsigned nodes[8];
  assert_int_equal(umbp_topo_plan_numa_nodes(p, nodes, 8), 4);
  for (int r = 0; r < 4; r++) {
    umbp_topo_rank_info ri;
    assert_int_equal(umbp_topo_plan_rank(p, r, &ri), 0);
    assert_int_equal(ri.numa_node, (unsigned)r);
    assert_int_equal(nodes[r], (unsigned)r);
  }
  umbp_topo_plan_free(p);
  umbp_topo_free(t);
}

/* ------------------------------------------------------------------------ */
/* Memory policy                                                            */

static void test_mempolicy_machines(void **state) {
  (void)state;
  umbp_topo *t = load_file(POWER8);
  unsigned m[8];
  umbp_topo_rank_info ri;
  umbp_topo_plan *p = plan_of(t, 0, NULL, 0, UMBP_TOPO_MEM_INTERLEAVE);
  assert_int_equal(umbp_topo_plan_rank(p, 2, &ri), 0);
  assert_int_equal(ri.mempolicy, UMBP_TOPO_MEM_INTERLEAVE);
  assert_int_equal(umbp_topo_plan_rank_mem_nodes(p, 2, m, 8), 1); /* cuda2 is local to node 1 only */
  assert_int_equal(m[0], 1);
  umbp_topo_plan_free(p);
  p = plan_of(t, 0, NULL, 0, UMBP_TOPO_MEM_PREFERRED);
  assert_int_equal(umbp_topo_plan_rank(p, 1, &ri), 0);
  assert_int_equal(ri.mempolicy, UMBP_TOPO_MEM_PREFERRED);
  assert_int_equal(umbp_topo_plan_rank_mem_nodes(p, 1, m, 8), 1);
  assert_int_equal(m[0], 0);
  umbp_topo_plan_free(p);
  p = plan_of(t, 0, NULL, 0, UMBP_TOPO_MEM_DEFAULT);
  assert_int_equal(umbp_topo_plan_rank_mem_nodes(p, 0, m, 8), 0);
  umbp_topo_plan_free(p);
  umbp_topo_free(t);

  /* No GPU, interleave: every node with memory. */
  t = load_file(E96);
  p = plan_of(t, 2, NULL, 0, UMBP_TOPO_MEM_INTERLEAVE);
  assert_int_equal(umbp_topo_plan_rank_mem_nodes(p, 0, m, 8), 4);
  umbp_topo_plan_free(p);
  umbp_topo_free(t);
}

/* ------------------------------------------------------------------------ */
/* Errors                                                                   */

static void test_bad_gpus_machines(void **state) {
  (void)state;
  umbp_topo *t = load_file(POWER8);
  umbp_topo_plan *p = (umbp_topo_plan *)(uintptr_t)0x1;
  umbp_topo_plan_opts o = UMBP_TOPO_PLAN_OPTS_INIT;
  static const int bad[] = {0, 7};
  o.nranks = 2;
  o.gpus = bad;
  assert_int_equal(umbp_topo_plan_make(t, &o, &p), -EINVAL);
  assert_non_null(strstr(umbp_last_error(), "GPU 7 does not exist"));
  assert_non_null(strstr(umbp_last_error(), "0-3"));
  assert_ptr_equal(p, (umbp_topo_plan *)(uintptr_t)0x1); /* untouched */
  umbp_topo_free(t);

  /* A GPU index on a machine without GPU. */
  t = load_file(E24);
  static const int g0[] = {0};
  o.nranks = 1;
  o.gpus = g0;
  assert_int_equal(umbp_topo_plan_make(t, &o, &p), -EINVAL);
  assert_non_null(strstr(umbp_last_error(), "no CUDA GPU"));
  assert_ptr_equal(p, (umbp_topo_plan *)(uintptr_t)0x1);
  umbp_topo_free(t);
}

int main(void) {
  char dir[PATH_MAX];
  if (!topo_dir(dir, sizeof dir)) {
    printf("1..0 # SKIP topology data not found: UMBP_SHARED_DATA is '%s'; it should name the "
           "shared/data directory beside the clone (with topologies/*.xml)\n",
           getenv("UMBP_SHARED_DATA") ? getenv("UMBP_SHARED_DATA") : "(unset)");
    return 0;
  }
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_power8_gpu_numa),
      cmocka_unit_test(test_e32_one_gpu),
      cmocka_unit_test(test_plan_cores_local_all_files),
      cmocka_unit_test(test_power8_plan_disjoint),
      cmocka_unit_test(test_physical_cores_first),
      cmocka_unit_test(test_plan_shared_when_scarce),
      cmocka_unit_test(test_explicit_gpus),
      cmocka_unit_test(test_fallback_no_gpu),
      cmocka_unit_test(test_fallback_gpu_without_cuda),
      cmocka_unit_test(test_mempolicy_machines),
      cmocka_unit_test(test_bad_gpus_machines),
  };
  return cmocka_run_group_tests_name("topo-machines", tests, NULL, NULL);
}
