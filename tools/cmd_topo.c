/* SPDX-License-Identifier: Apache-2.0 */
/*
 * cmd_topo.c — `umbp topo`: the machine's GPU/NUMA topology and the per-rank
 * placement plan (library: include/umbp/topo.h, docs: docs/topo.md).
 *
 * JSON output (--json), schema "umbp-topo/1". One object on one line:
 *
 *   {
 *     "schema": "umbp-topo/1",
 *     "machine": {
 *       "source": "this machine" | "<xml path>",
 *       "live": bool,                  true for this machine, false for --xml
 *       "packages": int, "cores": int, "pus": int,
 *       "numa_nodes": [                NUMA nodes with memory, ascending os_index
 *         {"os_index": int, "memory_bytes": int, "cores": int, "pus": [int...]}
 *       ],
 *       "gpus": [                      GPUs a rank can use; index = CUDA ordinal
 *         {"index": int, "name": "cuda0", "pci_bus_id": "0000:01:00.0" | "",
 *          "vendor": str, "model": str, "cuda_ordinal": int | null,
 *          "source": "cudart" | "hwloc-cuda" | "hwloc-nvml",
 *          "placed": bool,             false: hwloc has no NUMA locality for it
 *          "numa_nodes": [int...],     local nodes with memory ([] if not placed)
 *          "local_pus": [int...]}      local PUs ([] if not placed)
 *       ],
 *       "notes": [str...]              discovery: CUDA runtime, skipped devices
 *     },
 *     "plan": {
 *       "threads_per_rank": int,
 *       "numa_nodes": [int...],        nodes the partitions use (pool create --numa-nodes auto)
 *       "ranks": [
 *         {"rank": int, "gpu": int (-1: none), "gpu_name": str | null,
 *          "numa_node": int,           node of the rank's pool partition
 *          "gpu_local": bool,          numa_node is local to the GPU
 *          "cpus": [int...],           copy-thread PUs, in thread order
 *          "shared_cpus": bool,        some cpus also belong to another rank
 *          "mempolicy": "bind" | "preferred" | "interleave" | "default",
 *          "mem_nodes": [int...],      nodes the policy names
 *          "notes": [str...]}          why each choice was made
 *       ],
 *       "notes": [str...]              defaults taken and fallbacks
 *     }
 *   }
 *
 * All PU and node numbers are OS indexes (as numactl/taskset use them).
 * Fields are only ever added within a schema version.
 */
#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "umbp/topo.h"
#include "umbp/common.h"

static void topo_help(FILE *f) {
  /* The layout of every umbp --help: Usage, what it does, Options, Exit
   * status, Examples. */
  fputs(
      "Usage: umbp topo [--xml FILE] [--ranks N | --gpus LIST] [--threads-per-rank K]\n"
      "                 [--mempolicy POLICY] [--no-cuda] [--json] [--explain]\n"
      "\n"
      "Show the GPU/NUMA topology and the per-rank placement plan.\n"
      "\n"
      "Reads this machine's topology with hwloc (or an hwloc XML export of some\n"
      "machine), finds the GPUs and the NUMA node(s) and cores local to each, and\n"
      "plans every tensor-parallel rank: its GPU, the NUMA node its pool partition\n"
      "lives on, the PUs (hardware threads) its copy threads run on, and the memory\n"
      "policy. Host memory or copy threads on the wrong socket can cut host<->GPU\n"
      "bandwidth several-fold; this shows what umbp will do about it.\n"
      "\n"
      "Rank i uses GPU i (or the GPU --gpus names). Its partition is the GPU's local\n"
      "NUMA node. Its copy-thread PUs are local to the GPU and that node, one PU per\n"
      "physical core before any hyperthread sibling, and disjoint from the other\n"
      "ranks' PUs when the node has enough; otherwise ranks share PUs and the plan\n"
      "says so (shared = yes). Machines with no GPU spread the ranks round-robin over\n"
      "the NUMA nodes with memory; GPUs hwloc cannot place (no NUMA locality) are\n"
      "treated the same way, with a note.\n"
      "\n"
      "On this machine, in a build with CUDA, GPU i is CUDA device i as the CUDA\n"
      "runtime sees it (CUDA_VISIBLE_DEVICES applies), matched to its PCI device by\n"
      "bus id. Without a working CUDA runtime, and for --xml, GPUs are the topology's\n"
      "CUDA OS devices (cuda0, cuda1, ...), else its NVML ones.\n"
      "\n"
      "The output is a machine summary (packages, NUMA nodes with memory, GPUs with\n"
      "their PCI bus id and node), then one row per rank, then the plan's notes. All\n"
      "PU and node numbers are OS indexes, as numactl and taskset use them.\n"
      "\n"
      "Options:\n"
      "  --xml FILE            plan for the machine described by FILE, an hwloc XML\n"
      "                        export (lstopo-no-graphics --of xml FILE), instead of\n"
      "                        this machine.\n"
      "  --ranks N             plan N ranks (1-4096); rank i uses GPU i mod the GPU\n"
      "                        count. Default: one rank per GPU, or one per NUMA node\n"
      "                        with memory when there is no GPU.\n"
      "  --gpus LIST           comma-separated GPU indexes, one per rank: rank i uses\n"
      "                        GPU LIST[i] (--gpus 2,3: two ranks on GPUs 2 and 3). A\n"
      "                        GPU may repeat. Exclusive with --ranks.\n"
      "  --threads-per-rank K  copy threads, hence PUs, per rank (1-1024; default 2).\n"
      "  --mempolicy POLICY    memory policy of the partitions: auto (default: bind,\n"
      "                        or default on a single-node machine), bind (pages only\n"
      "                        from the rank's node), preferred (that node first,\n"
      "                        others when full), interleave (over the GPU's local\n"
      "                        nodes), default (kernel first-touch, no binding;\n"
      "                        also spelled none, as in umbp pool create).\n"
      "  --no-cuda             do not ask the CUDA runtime for devices; use the\n"
      "                        topology's OS devices.\n"
      "  --json                print one JSON object (schema below) instead of tables.\n"
      "  --explain             in the tables, also print why each choice was made\n"
      "                        (per-rank notes) and the discovery notes. JSON always\n"
      "                        carries every note.\n"
      "  -h, --help            print this help and exit.\n"
      "\n"
      "JSON schema (umbp-topo/1; full description in docs/topo.md):\n"
      "  {\"schema\":\"umbp-topo/1\",\n"
      "   \"machine\":{\"source\",\"live\",\"packages\",\"cores\",\"pus\",\n"
      "     \"numa_nodes\":[{\"os_index\",\"memory_bytes\",\"cores\",\"pus\":[..]}],\n"
      "     \"gpus\":[{\"index\",\"name\",\"pci_bus_id\",\"vendor\",\"model\",\"cuda_ordinal\",\n"
      "              \"source\",\"placed\",\"numa_nodes\":[..],\"local_pus\":[..]}],\n"
      "     \"notes\":[..]},\n"
      "   \"plan\":{\"threads_per_rank\",\"numa_nodes\":[..],\n"
      "     \"ranks\":[{\"rank\",\"gpu\"(-1 = none),\"gpu_name\",\"numa_node\",\"gpu_local\",\n"
      "               \"cpus\":[..],\"shared_cpus\",\"mempolicy\",\"mem_nodes\":[..],\n"
      "               \"notes\":[..]}],\n"
      "     \"notes\":[..]}}\n"
      "\n"
      "Exit status: 0 success; 1 runtime error (the XML file is missing, unreadable or\n"
      "not hwloc XML; hwloc cannot read this machine; out of memory); 2 usage error\n"
      "(unknown option, bad or missing value, --ranks with --gpus, --gpus naming a\n"
      "GPU the topology does not have).\n"
      "\n"
      "Examples:\n"
      "  umbp topo                                        this machine, one rank per GPU\n"
      "  umbp topo --ranks 8 --threads-per-rank 4 --explain\n"
      "                                                   eight ranks, four copy threads\n"
      "                                                   each, and why\n"
      "  umbp topo --xml node.xml --gpus 0,1 --json       offline plan of two ranks on\n"
      "                                                   GPUs 0 and 1 of node.xml\n"
      "  lstopo-no-graphics --of xml node.xml             (hwloc) export a machine for --xml\n",
      f);
}

/* "0-3,8,10-11" from a list, compressing ascending runs in the given order. */
static void fmt_list(const unsigned *v, int n, char *buf, size_t len) {
  size_t o = 0;
  buf[0] = 0;
  if (n == 0) {
    snprintf(buf, len, "-");
    return;
  }
  for (int i = 0; i < n && o < len;) {
    int j = i;
    while (j + 1 < n && v[j + 1] == v[j] + 1) j++;
    int w;
    if (j > i)
      w = snprintf(buf + o, len - o, "%s%u-%u", o ? "," : "", v[i], v[j]);
    else
      w = snprintf(buf + o, len - o, "%s%u", o ? "," : "", v[i]);
    if (w < 0 || (size_t)w >= len - o) {
      if (len > 4) snprintf(buf + len - 4, 4, "...");
      return;
    }
    o += (size_t)w;
    i = j + 1;
  }
}

static void json_uarr(struct jb *j, const char *key, const unsigned *v, int n) {
  jb_arr(j, key);
  for (int i = 0; i < n; i++) jb_u64(j, NULL, v[i]);
  jb_end_arr(j);
}

static const char *gpu_source_name(int s) {
  switch (s) {
  case UMBP_TOPO_GPU_FROM_CUDART: return "cudart";
  case UMBP_TOPO_GPU_FROM_HWLOC_CUDA: return "hwloc-cuda";
  case UMBP_TOPO_GPU_FROM_HWLOC_NVML: return "hwloc-nvml";
  default: return "unknown";
  }
}

/* Buffers big enough for any list the topology can give. */
struct bufs {
  unsigned *a;
  int cap;
};

/* The plan as one JSON object on stdout: 0; -1 when a query failed (the
 * library's last error says why); 1 when building the JSON ran out of memory
 * (jb_finish has said so). A failed write is left to stdout's error flag. */
static int print_json(const umbp_topo *t, const umbp_topo_plan *p, struct bufs *b) {
  struct jb j;
  jb_begin(&j, stdout);
  jb_obj(&j, NULL);
  jb_str(&j, "schema", "umbp-topo/1");
  jb_obj(&j, "machine");
  jb_str(&j, "source", umbp_topo_source(t));
  jb_bool(&j, "live", umbp_topo_is_live(t));
  jb_i64(&j, "packages", umbp_topo_package_count(t));
  jb_i64(&j, "cores", umbp_topo_core_count(t));
  jb_i64(&j, "pus", umbp_topo_pu_count(t));
  jb_arr(&j, "numa_nodes");
  for (int i = 0; i < umbp_topo_numa_count(t); i++) {
    umbp_topo_numa_info ni;
    if (umbp_topo_numa_info_get(t, i, &ni) < 0) return -1;
    int n = umbp_topo_numa_pus(t, i, b->a, b->cap);
    if (n < 0) return -1;
    jb_obj(&j, NULL);
    jb_u64(&j, "os_index", ni.os_index);
    jb_u64(&j, "memory_bytes", ni.memory_bytes);
    jb_i64(&j, "cores", ni.ncores);
    json_uarr(&j, "pus", b->a, n);
    jb_end_obj(&j);
  }
  jb_end_arr(&j);
  jb_arr(&j, "gpus");
  for (int g = 0; g < umbp_topo_gpu_count(t); g++) {
    umbp_topo_gpu_info gi;
    if (umbp_topo_gpu_info_get(t, g, &gi) < 0) return -1;
    jb_obj(&j, NULL);
    jb_i64(&j, "index", gi.index);
    jb_str(&j, "name", gi.name);
    jb_str(&j, "pci_bus_id", gi.pci_bus_id);
    jb_str(&j, "vendor", gi.vendor);
    jb_str(&j, "model", gi.model);
    if (gi.cuda_ordinal >= 0)
      jb_i64(&j, "cuda_ordinal", gi.cuda_ordinal);
    else
      jb_null(&j, "cuda_ordinal");
    jb_str(&j, "source", gpu_source_name(gi.source));
    jb_bool(&j, "placed", gi.placed);
    int n = umbp_topo_gpu_numa_nodes(t, g, b->a, b->cap);
    if (n < 0) return -1;
    json_uarr(&j, "numa_nodes", b->a, n);
    n = umbp_topo_gpu_pus(t, g, b->a, b->cap);
    if (n < 0) return -1;
    json_uarr(&j, "local_pus", b->a, n);
    jb_end_obj(&j);
  }
  jb_end_arr(&j);
  jb_arr(&j, "notes");
  for (int i = 0; i < umbp_topo_note_count(t); i++) jb_str(&j, NULL, umbp_topo_note(t, i));
  jb_end_arr(&j);
  jb_end_obj(&j);

  jb_obj(&j, "plan");
  jb_i64(&j, "threads_per_rank", umbp_topo_plan_threads_per_rank(p));
  int n = umbp_topo_plan_numa_nodes(p, b->a, b->cap);
  if (n < 0) return -1;
  json_uarr(&j, "numa_nodes", b->a, n);
  jb_arr(&j, "ranks");
  for (int r = 0; r < umbp_topo_plan_nranks(p); r++) {
    umbp_topo_rank_info ri;
    if (umbp_topo_plan_rank(p, r, &ri) < 0) return -1;
    jb_obj(&j, NULL);
    jb_i64(&j, "rank", ri.rank);
    jb_i64(&j, "gpu", ri.gpu);
    if (ri.gpu >= 0) {
      umbp_topo_gpu_info gi;
      if (umbp_topo_gpu_info_get(t, ri.gpu, &gi) < 0) return -1;
      jb_str(&j, "gpu_name", gi.name);
    } else {
      jb_null(&j, "gpu_name");
    }
    jb_u64(&j, "numa_node", ri.numa_node);
    jb_bool(&j, "gpu_local", ri.gpu_local);
    n = umbp_topo_plan_rank_cpus(p, r, b->a, b->cap);
    if (n < 0) return -1;
    json_uarr(&j, "cpus", b->a, n);
    jb_bool(&j, "shared_cpus", ri.shared_cpus);
    jb_str(&j, "mempolicy", umbp_topo_mempolicy_name(ri.mempolicy));
    n = umbp_topo_plan_rank_mem_nodes(p, r, b->a, b->cap);
    if (n < 0) return -1;
    json_uarr(&j, "mem_nodes", b->a, n);
    jb_arr(&j, "notes");
    for (int k = 0; k < ri.nnotes; k++) jb_str(&j, NULL, umbp_topo_plan_rank_note(p, r, k));
    jb_end_arr(&j);
    jb_end_obj(&j);
  }
  jb_end_arr(&j);
  jb_arr(&j, "notes");
  for (int i = 0; i < umbp_topo_plan_note_count(p); i++) jb_str(&j, NULL, umbp_topo_plan_note(p, i));
  jb_end_arr(&j);
  jb_end_obj(&j);
  jb_end_obj(&j);
  /* -EIO leaves stdout's error flag for the caller's check; -ENOMEM is
   * reported by jb_finish and is an error too */
  return jb_finish(&j) == -ENOMEM ? 1 : 0;
}

static int print_table(const umbp_topo *t, const umbp_topo_plan *p, struct bufs *b, bool explain) {
  char list[256], size[32];
  int nn = umbp_topo_numa_count(t), ng = umbp_topo_gpu_count(t);
  printf("Machine: %s\n", cli_safe(umbp_topo_source(t)));
  printf("  %d package(s), %d core(s), %d PU(s), %d NUMA node(s) with memory, %d GPU(s)\n",
         umbp_topo_package_count(t), umbp_topo_core_count(t), umbp_topo_pu_count(t), nn, ng);
  printf("\nNUMA nodes with memory:\n  %-5s %-11s %-6s %s\n", "node", "memory", "cores", "PUs");
  for (int i = 0; i < nn; i++) {
    umbp_topo_numa_info ni;
    if (umbp_topo_numa_info_get(t, i, &ni) < 0) return -1;
    int n = umbp_topo_numa_pus(t, i, b->a, b->cap);
    if (n < 0) return -1;
    fmt_list(b->a, n, list, sizeof list);
    printf("  %-5u %-11s %-6d %s\n", ni.os_index, cli_fmt_size(ni.memory_bytes, size, sizeof size),
           ni.ncores, list);
  }
  if (ng == 0) {
    printf("\nGPUs: none\n");
  } else {
    printf("\nGPUs:\n  %-4s %-8s %-13s %-6s %-24s %s\n", "gpu", "name", "PCI bus id", "node", "model",
           "local PUs");
    for (int g = 0; g < ng; g++) {
      umbp_topo_gpu_info gi;
      if (umbp_topo_gpu_info_get(t, g, &gi) < 0) return -1;
      char nodes[64];
      int n = umbp_topo_gpu_numa_nodes(t, g, b->a, b->cap);
      if (n < 0) return -1;
      if (n == 0)
        snprintf(nodes, sizeof nodes, "?");
      else
        fmt_list(b->a, n, nodes, sizeof nodes);
      n = umbp_topo_gpu_pus(t, g, b->a, b->cap);
      if (n < 0) return -1;
      fmt_list(b->a, n, list, sizeof list);
      printf("  %-4d %-8s %-13s %-6s %-24s %s\n", g, cli_safe(gi.name), gi.pci_bus_id[0] ? cli_safe(gi.pci_bus_id) : "-",
             nodes, gi.model[0] ? cli_safe(gi.model) : "-", list);
    }
  }
  if (explain && umbp_topo_note_count(t) > 0) {
    printf("\nDiscovery notes:\n");
    for (int i = 0; i < umbp_topo_note_count(t); i++) printf("  - %s\n", cli_safe(umbp_topo_note(t, i)));
  }

  int nr = umbp_topo_plan_nranks(p);
  int pn = umbp_topo_plan_numa_nodes(p, b->a, b->cap);
  if (pn < 0) return -1;
  fmt_list(b->a, pn, list, sizeof list);
  printf("\nPlan: %d rank(s), %d copy thread(s) per rank, partitions on NUMA node(s) %s\n", nr,
         umbp_topo_plan_threads_per_rank(p), list);
  printf("  %-5s %-12s %-5s %-6s %-11s %s\n", "rank", "gpu", "node", "shared", "mempolicy", "cpus");
  for (int r = 0; r < nr; r++) {
    umbp_topo_rank_info ri;
    if (umbp_topo_plan_rank(p, r, &ri) < 0) return -1;
    char gpu[40] = "-";
    if (ri.gpu >= 0) {
      umbp_topo_gpu_info gi;
      if (umbp_topo_gpu_info_get(t, ri.gpu, &gi) < 0) return -1;
      snprintf(gpu, sizeof gpu, "%d (%s)", ri.gpu, cli_safe(gi.name));
    }
    int n = umbp_topo_plan_rank_cpus(p, r, b->a, b->cap);
    if (n < 0) return -1;
    fmt_list(b->a, n, list, sizeof list);
    printf("  %-5d %-12s %-5u %-6s %-11s %s\n", r, gpu, ri.numa_node, ri.shared_cpus ? "yes" : "no",
           umbp_topo_mempolicy_name(ri.mempolicy), list);
    if (explain)
      for (int k = 0; k < ri.nnotes; k++) printf("        why: %s\n", cli_safe(umbp_topo_plan_rank_note(p, r, k)));
  }
  if (umbp_topo_plan_note_count(p) > 0) {
    printf("\nNotes:\n");
    for (int i = 0; i < umbp_topo_plan_note_count(p); i++) printf("  - %s\n", cli_safe(umbp_topo_plan_note(p, i)));
  }
  if (!explain) printf("\n(--explain says why each rank got its node and cores)\n");
  return 0;
}

/* Strict positive integer in [1, max]: ASCII digits only (strtol alone takes
 * leading spaces and a sign). */
static int parse_pos(const char *s, int max, int *ret) {
  if (!isdigit((unsigned char)*s)) return -EINVAL;
  char *end;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (errno || end == s || *end || v < 1 || v > max) return -EINVAL;
  *ret = (int)v;
  return 0;
}

int cmd_topo(int argc, char **argv) {
  enum { O_XML = 256, O_RANKS, O_GPUS, O_THREADS, O_MEMPOL, O_JSON, O_EXPLAIN, O_NOCUDA };
  static const struct option longopts[] = {
      {"xml", required_argument, NULL, O_XML},
      {"ranks", required_argument, NULL, O_RANKS},
      {"gpus", required_argument, NULL, O_GPUS},
      {"threads-per-rank", required_argument, NULL, O_THREADS},
      {"mempolicy", required_argument, NULL, O_MEMPOL},
      {"json", no_argument, NULL, O_JSON},
      {"explain", no_argument, NULL, O_EXPLAIN},
      {"no-cuda", no_argument, NULL, O_NOCUDA},
      {"help", no_argument, NULL, 'h'},
      {NULL, 0, NULL, 0},
  };
  const char *xml = NULL, *gpus_arg = NULL;
  int nranks = 0, threads = 0, mempolicy = UMBP_TOPO_MEM_AUTO;
  bool json = false, explain = false, ranks_given = false;
  unsigned load_flags = 0;
  optind = 0; /* glibc: restart scanning from argv[1] */
  opterr = 0;
  int c;
  while ((c = getopt_long(argc, argv, ":h", longopts, NULL)) != -1) {
    switch (c) {
    case O_XML: xml = optarg; break;
    case O_RANKS:
      if (parse_pos(optarg, UMBP_TOPO_MAX_RANKS, &nranks) < 0)
        return cli_usage_error("topo",
                               "--ranks wants the number of ranks, 1 to %d (got '%s'), e.g. --ranks 4",
                               UMBP_TOPO_MAX_RANKS, optarg);
      ranks_given = true;
      break;
    case O_GPUS: gpus_arg = optarg; break;
    case O_THREADS:
      if (parse_pos(optarg, UMBP_TOPO_MAX_THREADS_PER_RANK, &threads) < 0)
        return cli_usage_error("topo",
                               "--threads-per-rank wants 1 to %d copy threads (got '%s'), e.g. "
                               "--threads-per-rank 2",
                               UMBP_TOPO_MAX_THREADS_PER_RANK, optarg);
      break;
    case O_MEMPOL:
      if (umbp_topo_mempolicy_parse(optarg, &mempolicy) < 0)
        return cli_usage_error("topo", "--mempolicy: %s", umbp_last_error());
      break;
    case O_JSON: json = true; break;
    case O_EXPLAIN: explain = true; break;
    case O_NOCUDA: load_flags |= UMBP_TOPO_LOAD_NO_CUDA; break;
    case 'h': topo_help(stdout); return CLI_OK;
    case ':': return cli_usage_error("topo", "option '%s' needs a value", argv[optind - 1]);
    default: return cli_bad_option("topo", longopts, argv[optind - 1]);
    }
  }
  if (optind < argc)
    return cli_usage_error("topo", "unexpected argument '%s' (umbp topo takes only options)",
                           argv[optind]);
  if (xml && !*xml)
    return cli_usage_error("topo", "--xml needs a file name (an hwloc XML export); leave --xml out to plan "
                                   "for this machine");
  if (ranks_given && gpus_arg)
    return cli_usage_error("topo",
                           "--ranks and --gpus are exclusive: --gpus LIST already plans one rank "
                           "per entry; drop one of them");
  int *gpu_list = NULL, ngpu_list = 0;
  if (gpus_arg) {
    gpu_list = malloc(UMBP_TOPO_MAX_RANKS * sizeof *gpu_list);
    if (!gpu_list) {
      cli_error("topo: out of memory");
      return CLI_RUNTIME;
    }
    ngpu_list = cli_parse_int_list(gpus_arg, gpu_list, UMBP_TOPO_MAX_RANKS);
    if (ngpu_list <= 0) {
      free(gpu_list);
      return cli_usage_error("topo",
                             "--gpus wants a comma-separated list of GPU indexes (0 to 65535), one per "
                             "rank and at most %d, such as 0,1,2,3 (got '%.64s%s')",
                             UMBP_TOPO_MAX_RANKS, gpus_arg, strlen(gpus_arg) > 64 ? "..." : "");
    }
  }

  umbp_topo *t = NULL;
  umbp_topo_plan *p = NULL;
  struct bufs b = {NULL, 0};
  int rc = umbp_topo_load(xml, load_flags, &t);
  if (rc < 0) {
    cli_error("topo: %s", umbp_last_error());
    free(gpu_list);
    return CLI_RUNTIME;
  }
  int status = CLI_OK;
  for (int i = 0; i < ngpu_list; i++)
    if (gpu_list[i] >= umbp_topo_gpu_count(t)) {
      int ng = umbp_topo_gpu_count(t);
      if (ng == 0)
        status = cli_usage_error("topo",
                                 "--gpus names GPU %d but %s has no CUDA GPU: drop --gpus (ranks "
                                 "then go round-robin over the NUMA nodes) or use --ranks N",
                                 gpu_list[i], umbp_topo_source(t));
      else
        status = cli_usage_error("topo",
                                 "--gpus names GPU %d but %s has %d GPU(s), numbered 0-%d: run "
                                 "'umbp topo%s%s' to list them",
                                 gpu_list[i], umbp_topo_source(t), ng, ng - 1, xml ? " --xml " : "",
                                 xml ? xml : "");
      goto out;
    }
  umbp_topo_plan_opts opts = UMBP_TOPO_PLAN_OPTS_INIT;
  opts.nranks = gpu_list ? ngpu_list : nranks;
  opts.gpus = gpu_list;
  opts.threads_per_rank = threads;
  opts.mempolicy = mempolicy;
  rc = umbp_topo_plan_make(t, &opts, &p);
  if (rc < 0) {
    cli_error("topo: %s", umbp_last_error());
    status = rc == -EINVAL ? CLI_USAGE : CLI_RUNTIME;
    goto out;
  }
  b.cap = umbp_topo_pu_count(t) + umbp_topo_numa_count(t) + 1;
  b.a = malloc((size_t)b.cap * sizeof *b.a);
  if (!b.a) {
    cli_error("topo: out of memory");
    status = CLI_RUNTIME;
    goto out;
  }
  int prc = json ? print_json(t, p, &b) : print_table(t, p, &b, explain);
  if (prc != 0) { /* > 0: already reported */
    if (prc < 0) cli_error("topo: %s", umbp_last_error());
    status = CLI_RUNTIME;
    goto out;
  }
  if (fflush(stdout) != 0 || ferror(stdout)) {
    cli_error("topo: writing the output failed: %s", strerror(errno));
    status = CLI_RUNTIME;
  }
out:
  free(b.a);
  free(gpu_list);
  umbp_topo_plan_free(p);
  umbp_topo_free(t);
  return status;
}
