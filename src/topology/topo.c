/* SPDX-License-Identifier: Apache-2.0 */
/*
 * topo.c — the topology planner (public API in include/umbp/topo.h).
 *
 * Design note
 * -----------
 * Idea. Everything the planner needs is in the hwloc tree: a GPU is a PCI
 * device (with CUDA/NVML OS devices below it), and its first non-I/O
 * ancestor (hwloc_get_non_io_ancestor_obj) is the package, group or NUMA
 * node its PCI tree hangs off. That ancestor's nodeset is the GPU's local
 * memory and its cpuset the GPU's local PUs. This is how hwloc itself,
 * Open MPI's hwloc-based mapping and NCCL's topology code place a device;
 * we do not try to read PCI distances or NVLink matrices.
 *
 * Which GPUs, in which order. GPU index g must be what the rank will pass to
 * cudaSetDevice(). On the live machine, when the CUDA runtime answers, GPU g
 * is CUDA device g, matched to its hwloc PCI device through
 * cudaDeviceGetPCIBusId — this follows CUDA_VISIBLE_DEVICES and
 * CUDA_DEVICE_ORDER, which the PCI order alone would miss. Otherwise (XML
 * file, no driver, no GPU) the topology's CUDA OS devices "cudaN" are used
 * in N order (hwloc names them by CUDA ordinal), then NVML ones whose PCI
 * device has no CUDA one. Display devices (PCI class 03xx) that carry
 * neither are reported in the topology notes and never given to a rank.
 *
 * Planning, in three passes over the ranks:
 *   1. GPU per rank: opts->gpus, or rank i -> GPU i mod ngpus, or none.
 *   2. Partition node per rank: a GPU's local node; the least-loaded one
 *      when the GPU is local to several (sub-NUMA clustering). Ranks without
 *      a GPU or whose GPU has no locality take the least-loaded node with
 *      memory, which, from equal loads, is round-robin in OS-index order.
 *   3. Copy-thread PUs. Each rank's candidate set C is the PUs local to both
 *      its GPU and its node. Ranks with equal C form a group; a group's free
 *      cores are cut into one contiguous slice per rank, and each rank takes
 *      PUs of its slice in "physical-first" order (the first PU of every
 *      core, then second hyperthreads, ...). Ranks still short then take the
 *      group's remaining free PUs round-robin, and only after every group is
 *      served does a rank share PUs: it takes the least-used PUs of C and is
 *      flagged shared_cpus.
 *
 * Invariants. Every planned PU is in the rank's C (so local to its GPU and
 * to its node when both have PUs); a rank never lists a PU twice; ncpus is
 * min(threads_per_rank, |C|) >= 1; two ranks' PU sets intersect only if one
 * of them is flagged shared_cpus; every numa_node is a node with memory.
 *
 * Ownership and threads. umbp_topo and umbp_topo_plan are immutable after
 * they are built, so any number of threads may query them. A plan holds a
 * reference on its topology (refs, an atomic count): the release decrement
 * in umbp_topo_free/umbp_topo_plan_free pairs with the acquire fence taken
 * by the thread that drops the count to zero before freeing, so every
 * thread's last reads happen before the free.
 *
 * Errors. Notes are built with a sticky out-of-memory flag (the builder
 * checks it once at the end) instead of a check per sentence. The library
 * never prints; hwloc's own XML diagnostics stay off unless the user asks
 * for them with HWLOC_XML_VERBOSE.
 */
#include "umbp/topo.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <hwloc.h>
#include <limits.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/common.h"
#include "umbp_config.h"

#if UMBP_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

/* ------------------------------------------------------------------------ */
/* Sentences                                                                 */

struct strlist {
  char **v;
  int n, cap;
};

/* Append a formatted sentence; on allocation failure set *oom and drop it. */
static void sl_vaddf(struct strlist *l, bool *oom, const char *fmt, va_list ap)
    __attribute__((format(printf, 3, 0)));
static void sl_vaddf(struct strlist *l, bool *oom, const char *fmt, va_list ap) {
  char *s = NULL;
  if (vasprintf(&s, fmt, ap) < 0) {
    *oom = true;
    return;
  }
  if (l->n == l->cap) {
    int cap = l->cap ? 2 * l->cap : 4;
    char **v = realloc(l->v, (size_t)cap * sizeof *v);
    if (!v) {
      free(s);
      *oom = true;
      return;
    }
    l->v = v;
    l->cap = cap;
  }
  l->v[l->n++] = s;
}

static void sl_addf(struct strlist *l, bool *oom, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void sl_addf(struct strlist *l, bool *oom, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  sl_vaddf(l, oom, fmt, ap);
  va_end(ap);
}

static void sl_free(struct strlist *l) {
  for (int i = 0; i < l->n; i++) free(l->v[i]);
  free(l->v);
  memset(l, 0, sizeof *l);
}

static const char *sl_get(const struct strlist *l, int i) {
  return (i >= 0 && i < l->n) ? l->v[i] : NULL;
}

/* A bitmap as "0-3,8" (hwloc list syntax); "" on failure. Caller frees. */
static char *bm_list(hwloc_const_bitmap_t b, bool *oom) {
  char *s = NULL;
  if (hwloc_bitmap_list_asprintf(&s, b) < 0 || !s) {
    *oom = true;
    return NULL;
  }
  return s;
}

static const char *or_empty(const char *s) { return s ? s : ""; }

/* ------------------------------------------------------------------------ */
/* The loaded topology                                                       */

struct topo_pu {
  unsigned os;  /* OS index */
  int core;     /* dense core id, ascending in logical order */
  int smt;      /* 0 for the first PU of its core, 1 for the next, ... */
};

struct topo_node {
  unsigned os;
  uint64_t mem;
  hwloc_bitmap_t cpuset; /* PU OS indexes */
  int npus, ncores;
};

struct topo_gpu {
  umbp_topo_gpu_info info;
  hwloc_bitmap_t cpuset;  /* local PUs, empty if not placed */
  hwloc_bitmap_t nodeset; /* local nodes with memory, empty if not placed */
  char anchor[48];        /* "Package L#0": what its PCI tree hangs off */
};

struct umbp_topo {
  atomic_int refs;
  hwloc_topology_t hw;
  bool live;
  char *source;
  int npackages;
  int ncores;
  int npus;
  struct topo_pu *pus;   /* logical order */
  hwloc_bitmap_t all_pus;
  int nnodes;
  struct topo_node *nodes; /* nodes with memory, ascending OS index */
  hwloc_bitmap_t mem_nodes;
  int ngpus;
  struct topo_gpu *gpus;
  int nskipped;          /* display devices not used as GPUs */
  struct strlist notes;
  bool oom;
};

static void topo_destroy(umbp_topo *t) {
  if (!t) return;
  for (int i = 0; i < t->nnodes; i++) hwloc_bitmap_free(t->nodes[i].cpuset);
  for (int i = 0; i < t->ngpus; i++) {
    hwloc_bitmap_free(t->gpus[i].cpuset);
    hwloc_bitmap_free(t->gpus[i].nodeset);
  }
  free(t->nodes);
  free(t->gpus);
  free(t->pus);
  hwloc_bitmap_free(t->all_pus);
  hwloc_bitmap_free(t->mem_nodes);
  sl_free(&t->notes);
  free(t->source);
  if (t->hw) hwloc_topology_destroy(t->hw);
  free(t);
}

static void topo_ref(umbp_topo *t) { atomic_fetch_add_explicit(&t->refs, 1, memory_order_relaxed); }

static void topo_unref(umbp_topo *t) {
  if (!t) return;
  /* Release: this thread's reads of t happen before the free below, which
   * runs after the acquire fence in whichever thread drops the last ref. */
  if (atomic_fetch_sub_explicit(&t->refs, 1, memory_order_release) == 1) {
    atomic_thread_fence(memory_order_acquire);
    topo_destroy(t);
  }
}

/* "Package L#0", "Group0 L#1", "Machine" */
static void obj_describe(hwloc_obj_t o, char *buf, size_t n) {
  char type[32];
  hwloc_obj_type_snprintf(type, sizeof type, o, 0);
  if (o->type == HWLOC_OBJ_MACHINE)
    snprintf(buf, n, "%s", type);
  else
    snprintf(buf, n, "%s L#%u", type, o->logical_index);
}

static int cmp_node(const void *a, const void *b) {
  const struct topo_node *x = a, *y = b;
  return (x->os > y->os) - (x->os < y->os);
}

/* Bounds on the OS indexes of a topology. Linux numbers CPUs below NR_CPUS
 * (8192 at most in its configurations) and NUMA nodes below MAX_NUMNODES
 * (1024); this module indexes hwloc bitmaps by them, so a file claiming
 * os_index 4294967295 made each bitmap 512 MiB (1 GB of RSS for 8 PUs,
 * 21.9 GB and the OOM killer with --ranks 64). Checked before anything is
 * allocated, together with duplicates (two NUMA nodes of one index would be
 * two partitions bound to the same memory). */
#define TOPO_MAX_PU_OS 65535u
#define TOPO_MAX_NODE_OS 1023u

static int check_os_indexes(const umbp_topo *t) {
  hwloc_topology_t hw = t->hw;
  static const struct {
    hwloc_obj_type_t type;
    unsigned max;
    const char *what, *limit;
  } kinds[] = {
      {HWLOC_OBJ_PU, TOPO_MAX_PU_OS, "PU", "Linux numbers CPUs below 8192"},
      {HWLOC_OBJ_NUMANODE, TOPO_MAX_NODE_OS, "NUMA node", "Linux numbers NUMA nodes below 1024"},
  };
  for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
    uint64_t seen[(TOPO_MAX_PU_OS + 1) / 64] = {0};
    int n = hwloc_get_nbobjs_by_type(hw, kinds[k].type);
    for (int i = 0; i < n; i++) {
      hwloc_obj_t o = hwloc_get_obj_by_type(hw, kinds[k].type, (unsigned)i);
      unsigned os = o->os_index;
      if (os > kinds[k].max)
        return umbp_fail(-EBADMSG, "topology of %s gives %s L#%d the OS index %u, beyond %u (%s): the file is "
                                   "corrupted or was not made by hwloc; re-export it with 'lstopo-no-graphics --of "
                                   "xml FILE'",
                         t->source, kinds[k].what, i, os, kinds[k].max, kinds[k].limit);
      if (seen[os / 64] & (1ull << (os % 64)))
        return umbp_fail(-EBADMSG, "topology of %s gives OS index %u to two %ss: the file is corrupted or was not "
                                   "made by hwloc; re-export it with 'lstopo-no-graphics --of xml FILE'",
                         t->source, os, kinds[k].what);
      seen[os / 64] |= 1ull << (os % 64);
    }
  }
  return 0;
}

static int build_cpus(umbp_topo *t) {
  hwloc_topology_t hw = t->hw;
  t->npackages = hwloc_get_nbobjs_by_type(hw, HWLOC_OBJ_PACKAGE);
  int npus = hwloc_get_nbobjs_by_type(hw, HWLOC_OBJ_PU);
  if (npus <= 0) return umbp_fail(-EBADMSG, "topology of %s has no PU (processor) at all", t->source);
  t->pus = calloc((size_t)npus, sizeof *t->pus);
  t->all_pus = hwloc_bitmap_alloc();
  if (!t->pus || !t->all_pus) return -ENOMEM;
  hwloc_obj_t prev_core = NULL;
  int core_id = -1, smt = 0;
  for (int i = 0; i < npus; i++) {
    hwloc_obj_t pu = hwloc_get_obj_by_type(hw, HWLOC_OBJ_PU, (unsigned)i);
    hwloc_obj_t core = hwloc_get_ancestor_obj_by_type(hw, HWLOC_OBJ_CORE, pu);
    /* A PU without a Core object above it counts as a core of its own. */
    if (core && core == prev_core) {
      smt++;
    } else {
      core_id++;
      smt = 0;
    }
    prev_core = core;
    t->pus[i].os = pu->os_index;
    t->pus[i].core = core_id;
    t->pus[i].smt = smt;
    hwloc_bitmap_set(t->all_pus, pu->os_index);
  }
  t->npus = npus;
  t->ncores = core_id + 1;
  return 0;
}

/* Distinct cores among the PUs of set. */
static int count_cores(const umbp_topo *t, hwloc_const_bitmap_t set) {
  int n = 0, last = -1;
  /* PUs of a core are consecutive in logical order but not necessarily in
   * OS order, so walk the logical array. */
  for (int i = 0; i < t->npus; i++) {
    if (!hwloc_bitmap_isset(set, t->pus[i].os)) continue;
    if (t->pus[i].core != last) {
      n++;
      last = t->pus[i].core;
    }
  }
  return n;
}

static int build_nodes(umbp_topo *t) {
  hwloc_topology_t hw = t->hw;
  int total = hwloc_get_nbobjs_by_type(hw, HWLOC_OBJ_NUMANODE);
  if (total <= 0) return umbp_fail(-EBADMSG, "topology of %s has no NUMA node", t->source);
  t->nodes = calloc((size_t)total, sizeof *t->nodes);
  t->mem_nodes = hwloc_bitmap_alloc();
  if (!t->nodes || !t->mem_nodes) return -ENOMEM;
  int with_mem = 0;
  for (int i = 0; i < total; i++) {
    hwloc_obj_t o = hwloc_get_obj_by_type(hw, HWLOC_OBJ_NUMANODE, (unsigned)i);
    if (o->attr && o->attr->numanode.local_memory > 0) with_mem++;
  }
  if (with_mem == 0)
    sl_addf(&t->notes, &t->oom,
            "the topology gives no memory size for any NUMA node: all %d nodes are treated as "
            "having memory", total);
  for (int i = 0; i < total; i++) {
    hwloc_obj_t o = hwloc_get_obj_by_type(hw, HWLOC_OBJ_NUMANODE, (unsigned)i);
    uint64_t mem = o->attr ? o->attr->numanode.local_memory : 0;
    if (with_mem && mem == 0) continue;
    struct topo_node *nd = &t->nodes[t->nnodes];
    nd->os = o->os_index;
    nd->mem = mem;
    nd->cpuset = hwloc_bitmap_alloc();
    if (!nd->cpuset) return -ENOMEM;
    t->nnodes++;
    if (o->cpuset) hwloc_bitmap_and(nd->cpuset, o->cpuset, t->all_pus);
    nd->npus = hwloc_bitmap_weight(nd->cpuset);
    nd->ncores = count_cores(t, nd->cpuset);
    hwloc_bitmap_set(t->mem_nodes, nd->os);
  }
  qsort(t->nodes, (size_t)t->nnodes, sizeof *t->nodes, cmp_node);
  return 0;
}

/* --- GPU discovery ------------------------------------------------------- */

enum osdev_kind { K_NONE, K_CUDA, K_NVML, K_OTHER_GPU };

/* "cuda12" with prefix "cuda" -> 12; -1 if name is not prefix+digits. */
static int name_number(const char *name, const char *prefix) {
  size_t n = strlen(prefix);
  if (!name || strncmp(name, prefix, n) || !name[n]) return -1;
  long v = 0;
  for (const char *p = name + n; *p; p++) {
    if (!isdigit((unsigned char)*p) || v > 1000000) return -1;
    v = v * 10 + (*p - '0');
  }
  return (int)v;
}

static enum osdev_kind osdev_kind(hwloc_obj_t o) {
  hwloc_obj_osdev_type_t ty = o->attr->osdev.type;
  const char *sub = o->subtype;
  if (ty == HWLOC_OBJ_OSDEV_COPROC &&
      ((sub && !strcmp(sub, "CUDA")) || (!sub && name_number(o->name, "cuda") >= 0)))
    return K_CUDA;
  if (ty == HWLOC_OBJ_OSDEV_GPU &&
      ((sub && !strcmp(sub, "NVML")) || (!sub && name_number(o->name, "nvml") >= 0)))
    return K_NVML;
  if (ty == HWLOC_OBJ_OSDEV_GPU || ty == HWLOC_OBJ_OSDEV_COPROC) return K_OTHER_GPU;
  return K_NONE;
}

static hwloc_obj_t pci_of(hwloc_obj_t o) {
  for (; o; o = o->parent)
    if (o->type == HWLOC_OBJ_PCI_DEVICE) return o;
  return NULL;
}

/* The first OS device of kind k directly below PCI device pci. */
static hwloc_obj_t osdev_below(hwloc_obj_t pci, enum osdev_kind k) {
  for (hwloc_obj_t c = pci ? pci->io_first_child : NULL; c; c = c->next_sibling)
    if (c->type == HWLOC_OBJ_OS_DEVICE && osdev_kind(c) == k) return c;
  return NULL;
}

static const char *vendor_by_id(unsigned id) {
  switch (id) {
  case 0x10de: return "NVIDIA Corporation";
  case 0x1002: return "Advanced Micro Devices, Inc. [AMD/ATI]";
  case 0x8086: return "Intel Corporation";
  default: return "";
  }
}

static void copy_str(char *dst, size_t n, const char *src) {
  snprintf(dst, n, "%s", src ? src : "");
}

static void pci_busid(hwloc_obj_t pci, char *buf, size_t n) {
  if (!pci) {
    buf[0] = 0;
    return;
  }
  snprintf(buf, n, "%04x:%02x:%02x.%01x", (unsigned)pci->attr->pcidev.domain, pci->attr->pcidev.bus,
           pci->attr->pcidev.dev, pci->attr->pcidev.func);
}

/* Fill a GPU's identity and locality from its PCI device and OS device
 * (either may be NULL). model_hint overrides the model when non-empty. */
static int gpu_fill(umbp_topo *t, struct topo_gpu *g, hwloc_obj_t pci, hwloc_obj_t osdev,
                    const char *model_hint) {
  g->cpuset = hwloc_bitmap_alloc();
  g->nodeset = hwloc_bitmap_alloc();
  if (!g->cpuset || !g->nodeset) return -ENOMEM;
  umbp_topo_gpu_info *in = &g->info;
  pci_busid(pci, in->pci_bus_id, sizeof in->pci_bus_id);
  hwloc_obj_t nv = osdev_below(pci, K_NVML);
  const char *vendor = NULL, *model = NULL;
  if (osdev) vendor = hwloc_obj_get_info_by_name(osdev, "GPUVendor");
  if (!vendor && nv) vendor = hwloc_obj_get_info_by_name(nv, "GPUVendor");
  if (!vendor && pci) vendor = hwloc_obj_get_info_by_name(pci, "PCIVendor");
  if (!vendor && pci) vendor = vendor_by_id(pci->attr->pcidev.vendor_id);
  if (model_hint && *model_hint) model = model_hint;
  if (!model && osdev) model = hwloc_obj_get_info_by_name(osdev, "GPUModel");
  if (!model && nv) model = hwloc_obj_get_info_by_name(nv, "GPUModel");
  if (!model && pci) model = hwloc_obj_get_info_by_name(pci, "PCIDevice");
  copy_str(in->vendor, sizeof in->vendor, vendor);
  copy_str(in->model, sizeof in->model, model);

  hwloc_obj_t anc = NULL;
  if (pci || osdev) anc = hwloc_get_non_io_ancestor_obj(t->hw, pci ? pci : osdev);
  hwloc_obj_t root = hwloc_get_root_obj(t->hw);
  if (anc) obj_describe(anc, g->anchor, sizeof g->anchor);
  in->placed = false;
  if (anc && (anc != root || t->nnodes == 1) && anc->nodeset) {
    hwloc_bitmap_and(g->nodeset, anc->nodeset, t->mem_nodes);
    if (!hwloc_bitmap_iszero(g->nodeset)) {
      in->placed = true;
      if (anc->cpuset) hwloc_bitmap_and(g->cpuset, anc->cpuset, t->all_pus);
    }
  }
  if (!in->placed) hwloc_bitmap_zero(g->nodeset);
  in->nnuma = hwloc_bitmap_weight(g->nodeset);
  in->npus = hwloc_bitmap_weight(g->cpuset);
  if (!in->placed) {
    if (!pci && !osdev)
      sl_addf(&t->notes, &t->oom,
              "%s (bus id %s) is not in the hwloc topology: hwloc cannot place it (no NUMA "
              "locality)", in->name, in->pci_bus_id[0] ? in->pci_bus_id : "unknown");
    else
      sl_addf(&t->notes, &t->oom,
              "%s (%s) hangs off %s: hwloc cannot place it on a NUMA node (no locality in the "
              "topology; on a live machine the BIOS/ACPI tables may not say)",
              in->name, in->pci_bus_id[0] ? in->pci_bus_id : "not on PCI", anc ? g->anchor : "nothing");
  }
  return 0;
}

static int gpus_grow(umbp_topo *t, int n) {
  struct topo_gpu *g = realloc(t->gpus, (size_t)n * sizeof *g);
  if (!g) return -ENOMEM;
  t->gpus = g;
  return 0;
}

#if UMBP_HAVE_CUDA
/* GPUs from the CUDA runtime, matched to hwloc PCI devices by bus id.
 * Returns the number found (0: fall back to OS devices) or -ENOMEM. */
static int gpus_from_cudart(umbp_topo *t) {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n <= 0) {
    if (e != cudaSuccess)
      sl_addf(&t->notes, &t->oom,
              "CUDA runtime: cudaGetDeviceCount failed (%s: %s); GPUs are taken from the "
              "topology's OS devices instead, so CUDA_VISIBLE_DEVICES reordering is not seen",
              cudaGetErrorName(e), cudaGetErrorString(e));
    else
      sl_addf(&t->notes, &t->oom,
              "CUDA runtime: no CUDA device visible (CUDA_VISIBLE_DEVICES?); GPUs are taken "
              "from the topology's OS devices instead");
    (void)cudaGetLastError();
    return 0;
  }
  if (gpus_grow(t, n) < 0) return -ENOMEM;
  for (int i = 0; i < n; i++) {
    struct topo_gpu *g = &t->gpus[i];
    memset(g, 0, sizeof *g);
    g->info.index = i;
    g->info.cuda_ordinal = i;
    g->info.source = UMBP_TOPO_GPU_FROM_CUDART;
    snprintf(g->info.name, sizeof g->info.name, "cuda%d", i);
    t->ngpus = i + 1;
    char bus[64] = "";
    hwloc_obj_t pci = NULL;
    unsigned dom = 0, b = 0, d = 0, f = 0;
    if (cudaDeviceGetPCIBusId(bus, (int)sizeof bus, i) == cudaSuccess &&
        sscanf(bus, "%x:%x:%x.%x", &dom, &b, &d, &f) == 4)
      pci = hwloc_get_pcidev_by_busid(t->hw, dom, b, d, f);
    (void)cudaGetLastError();
    struct cudaDeviceProp prop;
    const char *model = NULL;
    if (cudaGetDeviceProperties(&prop, i) == cudaSuccess) model = prop.name;
    (void)cudaGetLastError();
    int rc = gpu_fill(t, g, pci, osdev_below(pci, K_CUDA), model);
    if (rc < 0) return rc;
    if (!pci && bus[0]) snprintf(g->info.pci_bus_id, sizeof g->info.pci_bus_id, "%04x:%02x:%02x.%01x",
                                 dom, b, d, f);
    if (!g->info.vendor[0]) copy_str(g->info.vendor, sizeof g->info.vendor, "NVIDIA Corporation");
  }
  sl_addf(&t->notes, &t->oom,
          "CUDA runtime: %d device(s); GPU i is CUDA device i (CUDA_VISIBLE_DEVICES applied), "
          "matched to its PCI device by bus id", n);
  return n;
}
#endif

struct osdev_ref {
  hwloc_obj_t o;
  int num;
};

static int cmp_osdev_ref(const void *a, const void *b) {
  const struct osdev_ref *x = a, *y = b;
  return (x->num > y->num) - (x->num < y->num);
}

/* GPUs from the topology's CUDA OS devices, then NVML-only ones. */
static int gpus_from_osdevs(umbp_topo *t) {
  int cap = 0;
  for (hwloc_obj_t o = NULL; (o = hwloc_get_next_osdev(t->hw, o));) cap++;
  if (cap == 0) return 0;
  struct osdev_ref *cu = calloc((size_t)cap, sizeof *cu), *nv = calloc((size_t)cap, sizeof *nv);
  int ncu = 0, nnv = 0, rc = 0;
  if (!cu || !nv) {
    rc = -ENOMEM;
    goto out;
  }
  for (hwloc_obj_t o = NULL; (o = hwloc_get_next_osdev(t->hw, o));) {
    enum osdev_kind k = osdev_kind(o);
    if (k == K_CUDA) {
      cu[ncu].o = o;
      cu[ncu++].num = name_number(o->name, "cuda");
    } else if (k == K_NVML) {
      hwloc_obj_t pci = pci_of(o);
      if (pci && osdev_below(pci, K_CUDA)) continue;
      nv[nnv].o = o;
      nv[nnv++].num = name_number(o->name, "nvml");
    }
  }
  qsort(cu, (size_t)ncu, sizeof *cu, cmp_osdev_ref);
  qsort(nv, (size_t)nnv, sizeof *nv, cmp_osdev_ref);
  if (ncu + nnv == 0) goto out;
  /* The default plan is one rank per GPU, and a plan has at most
   * UMBP_TOPO_MAX_RANKS ranks; the planner's cost grows with the square of
   * the rank count. No machine has that many GPUs. */
  if (ncu + nnv > UMBP_TOPO_MAX_RANKS) {
    rc = umbp_fail(-EBADMSG, "topology of %s has %d GPUs (CUDA/NVML OS devices), more than the %d ranks a plan "
                             "can have: the file is corrupted or was not made by hwloc; re-export it with "
                             "'lstopo-no-graphics --of xml FILE'",
                   t->source, ncu + nnv, UMBP_TOPO_MAX_RANKS);
    goto out;
  }
  rc = gpus_grow(t, ncu + nnv);
  if (rc < 0) goto out;
  for (int i = 0; i < ncu + nnv; i++) {
    struct topo_gpu *g = &t->gpus[i];
    bool is_cuda = i < ncu;
    hwloc_obj_t o = is_cuda ? cu[i].o : nv[i - ncu].o;
    memset(g, 0, sizeof *g);
    g->info.index = i;
    g->info.cuda_ordinal = is_cuda ? cu[i].num : -1;
    g->info.source = is_cuda ? UMBP_TOPO_GPU_FROM_HWLOC_CUDA : UMBP_TOPO_GPU_FROM_HWLOC_NVML;
    copy_str(g->info.name, sizeof g->info.name, o->name);
    t->ngpus = i + 1;
    rc = gpu_fill(t, g, pci_of(o), o, NULL);
    if (rc < 0) goto out;
  }
  if (ncu && nnv)
    sl_addf(&t->notes, &t->oom,
            "%d GPU(s) have an NVML but no CUDA OS device: listed after the CUDA ones, with no "
            "CUDA ordinal", nnv);
  else if (nnv)
    sl_addf(&t->notes, &t->oom,
            "GPUs come from NVML OS devices (the topology has no CUDA ones): GPU i is nvmlI, "
            "which follows PCI order and may differ from CUDA's device order");
  rc = ncu + nnv;
out:
  free(cu);
  free(nv);
  return rc;
}

/* Display-class PCI devices (and GPU-like OS devices off PCI) that did not
 * become GPUs: say so, so the user can see why a card is not used. */
static void note_skipped(umbp_topo *t) {
  for (hwloc_obj_t p = NULL; (p = hwloc_get_next_pcidev(t->hw, p));) {
    if ((p->attr->pcidev.class_id >> 8) != 0x03) continue;
    bool used = false;
    char bus[UMBP_TOPO_PCI_BUS_ID_MAX];
    pci_busid(p, bus, sizeof bus);
    for (int i = 0; i < t->ngpus; i++)
      if (!strcmp(t->gpus[i].info.pci_bus_id, bus)) used = true;
    if (used) continue;
    char osnames[128] = "";
    size_t len = 0;
    for (hwloc_obj_t c = p->io_first_child; c; c = c->next_sibling) {
      if (c->type != HWLOC_OBJ_OS_DEVICE || !c->name) continue;
      int w = snprintf(osnames + len, sizeof osnames - len, "%s%s", len ? ", " : "", c->name);
      if (w < 0 || (size_t)w >= sizeof osnames - len) break;
      len += (size_t)w;
    }
    const char *vendor = hwloc_obj_get_info_by_name(p, "PCIVendor");
    const char *model = hwloc_obj_get_info_by_name(p, "PCIDevice");
    if (!vendor) vendor = vendor_by_id(p->attr->pcidev.vendor_id);
    bool nvidia = p->attr->pcidev.vendor_id == 0x10de;
    t->nskipped++;
    sl_addf(&t->notes, &t->oom,
            "%s %s (%s%s%s%s%s) has no CUDA device: not given to any rank%s", bus,
            (p->attr->pcidev.class_id == 0x0302) ? "3D controller" : "display device",
            *vendor ? vendor : "unknown vendor", model ? " " : "", or_empty(model),
            len ? "; OS devices " : "; no OS device", len ? osnames : "",
            nvidia ? " (an NVIDIA device without a CUDA OS device: hidden by CUDA_VISIBLE_DEVICES, "
                     "or no driver, when the topology was taken?)"
                   : "");
  }
}

static int build_gpus(umbp_topo *t, unsigned flags) {
  int n = 0;
#if UMBP_HAVE_CUDA
  if (t->live && !(flags & UMBP_TOPO_LOAD_NO_CUDA)) {
    n = gpus_from_cudart(t);
    if (n < 0) return n;
  }
#else
  (void)flags;
#endif
  if (n == 0) {
    n = gpus_from_osdevs(t);
    if (n < 0) return n;
  }
  note_skipped(t);
  return 0;
}

/* Largest topology XML read. hwloc's export of a 96-PU, 4-node machine with
 * its PCI tree is 95 KB (../shared/data/topologies: 19 to 95 KB), about 1 KB
 * per PU; 16 MiB is room for machines a hundred times larger, and bounds what
 * a wrong file costs (hwloc reads the whole file into memory, then parses it). */
#define TOPO_MAX_XML_BYTES (16u << 20)

/* The whole of the file at path into *ret_xml (malloc'd, NUL-terminated, the
 * length without the NUL in *ret_len). Only a regular file of at most
 * TOPO_MAX_XML_BYTES is read: a device such as /dev/zero never ends, and a
 * FIFO is not opened for good (O_NONBLOCK: the open does not wait for a
 * writer). 0, or -ENOENT, -EACCES (or another open errno), -EINVAL (a
 * directory, not a regular file, too large), -ENOMEM, -EIO, with the error
 * set. */
static int read_xml_file(const char *path, char **ret_xml, size_t *ret_len) {
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) {
    int e = errno;
    if (e == ENOENT)
      return umbp_fail(-ENOENT,
                       "topology file '%s' does not exist: check the path, or export this "
                       "machine's with 'lstopo-no-graphics --of xml FILE'", path);
    if (e == EACCES)
      return umbp_fail(-EACCES, "cannot read topology file '%s': %s (check its permissions)", path, strerror(e));
    return umbp_fail(-e, "cannot open topology file '%s': %s", path, strerror(e));
  }
  struct stat st;
  if (fstat(fd, &st) < 0) {
    int e = errno;
    close(fd);
    return umbp_fail(-e, "cannot stat topology file '%s': %s", path, strerror(e));
  }
  int rc = 0;
  if (S_ISDIR(st.st_mode))
    rc = umbp_fail(-EINVAL, "topology file '%s' is a directory: give an hwloc XML file", path);
  else if (!S_ISREG(st.st_mode))
    rc = umbp_fail(-EINVAL, "topology file '%s' is %s, not a regular file: give an hwloc XML file "
                            "('lstopo-no-graphics --of xml FILE' writes one)", path,
                   S_ISCHR(st.st_mode) ? "a character device" : S_ISBLK(st.st_mode) ? "a block device"
                   : S_ISFIFO(st.st_mode) ? "a pipe" : S_ISSOCK(st.st_mode) ? "a socket" : "special");
  else if ((uint64_t)st.st_size > TOPO_MAX_XML_BYTES)
    rc = umbp_fail(-EINVAL, "topology file '%s' is %llu bytes, over the %u MiB a topology XML can be (a real "
                            "machine's is well under 1 MiB): give an hwloc XML export",
                   path, (unsigned long long)st.st_size, TOPO_MAX_XML_BYTES >> 20);
  if (rc < 0) {
    close(fd);
    return rc;
  }
  /* read up to the bound + 1 whatever the size said: the file may grow */
  size_t cap = (size_t)st.st_size + 1, len = 0;
  char *buf = malloc(cap + 1);
  if (!buf) {
    close(fd);
    return umbp_fail(-ENOMEM, "out of memory reading topology file '%s'", path);
  }
  for (;;) {
    if (len == cap) {
      if (cap > TOPO_MAX_XML_BYTES) {
        rc = umbp_fail(-EINVAL, "topology file '%s' grew past the %u MiB a topology XML can be while it was "
                                "read: give an hwloc XML export that is not being written",
                       path, TOPO_MAX_XML_BYTES >> 20);
        break;
      }
      size_t nc = cap * 2 > TOPO_MAX_XML_BYTES + 1 ? TOPO_MAX_XML_BYTES + 1 : cap * 2;
      char *nb = realloc(buf, nc + 1);
      if (!nb) {
        rc = umbp_fail(-ENOMEM, "out of memory reading topology file '%s'", path);
        break;
      }
      buf = nb;
      cap = nc;
    }
    ssize_t n = read(fd, buf + len, cap - len);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      int e = errno;
      rc = umbp_fail(e == EISDIR ? -EINVAL : -EIO, "cannot read topology file '%s': %s", path, strerror(e));
      break;
    }
    if (n == 0) break;
    len += (size_t)n;
  }
  close(fd);
  if (rc < 0) {
    free(buf);
    return rc;
  }
  buf[len] = 0;
  *ret_xml = buf;
  *ret_len = len;
  return 0;
}

/* Deepest element nesting a topology XML may have. hwloc's importer recurses
 * once per nested element, with no bound of its own: 20000 nested Groups
 * overflow an 8 MiB stack (SIGSEGV, lstopo included). A real export nests 5
 * to 9 deep (../shared/data/topologies); Groups, dies, caches and PCI bridges
 * of the largest machines stay well under 128, which costs hwloc well under
 * 100 KiB of stack, fine for any thread. */
#define TOPO_MAX_XML_DEPTH 128u

/* The deepest element nesting of the XML text s[0..len), counted without
 * parsing: "<name" opens an element unless its tag ends in "/>", "</" closes
 * one; comments, CDATA, declarations and processing instructions are skipped,
 * and a '>' inside a quoted attribute value does not end a tag. Stops at the
 * first level beyond max and returns it. A file this misreads is one hwloc
 * refuses anyway; the count only has to bound what hwloc recurses into. */
static unsigned xml_depth(const char *s, size_t len, unsigned max) {
  const char *p = s, *end = s + len;
  unsigned depth = 0, deepest = 0;
  while (p < end && (p = memchr(p, '<', (size_t)(end - p)))) {
    p++;
    if (p < end && *p == '/') {
      if (depth) depth--;
      continue;
    }
    if (p < end && (*p == '!' || *p == '?')) {
      const char *close = (size_t)(end - p) >= 3 && !memcmp(p, "!--", 3)        ? "-->"
                          : (size_t)(end - p) >= 8 && !memcmp(p, "![CDATA[", 8) ? "]]>"
                                                                                 : ">";
      p = memmem(p, (size_t)(end - p), close, strlen(close));
      if (!p) break;
      p += strlen(close);
      continue;
    }
    char quote = 0;
    const char *t = p;
    for (; t < end; t++) {
      if (quote) {
        if (*t == quote) quote = 0;
      } else if (*t == '"' || *t == '\'') {
        quote = *t;
      } else if (*t == '>') {
        break;
      }
    }
    if (t == end) break;
    if (t[-1] != '/' && ++depth > deepest) {
      deepest = depth;
      if (deepest > max) break;
    }
    p = t + 1;
  }
  return deepest;
}

UMBP_API int umbp_topo_load(const char *xml_path, unsigned flags, umbp_topo **ret_topo) {
  if (!ret_topo) return umbp_fail(-EINVAL, "umbp_topo_load: ret_topo is NULL");
  if (xml_path && !*xml_path)
    return umbp_fail(-EINVAL, "umbp_topo_load: empty XML path (pass NULL for this machine)");
  if (flags & ~(unsigned)UMBP_TOPO_LOAD_NO_CUDA)
    return umbp_fail(-EINVAL, "umbp_topo_load: unknown flags 0x%x", flags);
  /* For this machine hwloc loads the file HWLOC_XMLFILE names instead of
   * discovering (administrators set it to skip a slow discovery; HWLOC_FSROOT
   * and HWLOC_SYNTHETIC win over it). That file is read here as an --xml one
   * is, bounded and checked, so that a wrong one gets the same errors, not a
   * hang (/dev/zero) or a crash (deep nesting) inside hwloc. */
  const char *env_xml = NULL;
  if (!xml_path) {
    const char *e = getenv("HWLOC_XMLFILE");
    if (e && *e && !getenv("HWLOC_FSROOT") && !getenv("HWLOC_SYNTHETIC")) env_xml = e;
  }
  const char *file = xml_path ? xml_path : env_xml;
  char *xml = NULL;
  size_t xml_len = 0;
  if (file) {
    int rc = read_xml_file(file, &xml, &xml_len);
    if (rc == 0 && xml_depth(xml, xml_len, TOPO_MAX_XML_DEPTH) > TOPO_MAX_XML_DEPTH) {
      free(xml);
      rc = umbp_fail(-EBADMSG,
                     "topology file '%s' nests its elements more than %u deep (a real machine's export "
                     "nests under 20): the file is corrupted or was not made by hwloc; re-export it with "
                     "'lstopo-no-graphics --of xml FILE'", file, TOPO_MAX_XML_DEPTH);
    }
    if (rc < 0 && env_xml) {
      char why[512];
      snprintf(why, sizeof why, "%s", umbp_last_error());
      return umbp_fail(rc, "HWLOC_XMLFILE (hwloc's variable, set in this environment) names a topology file "
                           "hwloc cannot use: %s; or unset HWLOC_XMLFILE to discover this machine", why);
    }
    if (rc < 0) return rc;
  }
  umbp_topo *t = calloc(1, sizeof *t);
  if (!t) {
    free(xml);
    return umbp_fail(-ENOMEM, "out of memory loading the topology");
  }
  atomic_init(&t->refs, 1);
  t->live = xml_path == NULL;
  t->source = strdup(xml_path ? xml_path : "this machine");
  int rc;
  if (!t->source) {
    rc = -ENOMEM;
    goto fail;
  }
  if (hwloc_topology_init(&t->hw) < 0) {
    t->hw = NULL;
    rc = umbp_fail(-(errno ? errno : ENOMEM), "hwloc_topology_init failed: %s", strerror(errno));
    goto fail;
  }
  /* the bytes read above, not the path: hwloc would read the path again,
   * unbounded, and whatever it is now (size includes the NUL, as hwloc's own
   * export gives it) */
  if (file && hwloc_topology_set_xmlbuffer(t->hw, xml, (int)xml_len + 1) < 0) {
    int e = errno ? errno : EINVAL;
    rc = umbp_fail(e == ENOSYS ? -ENOSYS : -EBADMSG,
                   "hwloc cannot use '%s'%s as a topology XML (%s): check that it is an hwloc XML "
                   "export ('lstopo-no-graphics --of xml FILE'); HWLOC_XML_VERBOSE=1 shows "
                   "hwloc's reason", file, env_xml ? " (HWLOC_XMLFILE)" : "", strerror(e));
    goto fail;
  }
  if (env_xml)
    sl_addf(&t->notes, &t->oom,
            "this machine's topology is the file HWLOC_XMLFILE names (%s), not discovered: it is "
            "right only if it was exported on this machine; unset HWLOC_XMLFILE to discover", env_xml);
  /* XML: keep every I/O object the file holds. Live: the important ones
   * (GPUs, NICs, storage and the bridges above them). */
  hwloc_topology_set_io_types_filter(t->hw, xml_path ? HWLOC_TYPE_FILTER_KEEP_ALL
                                                     : HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
  /* hwloc fails some loads (a topology without a NUMA node) without setting
   * errno: clear it, so that a value left by an earlier call (ENOENT) is not
   * reported as the cause */
  errno = 0;
  if (hwloc_topology_load(t->hw) < 0) {
    int e = errno;
    if (file)
      rc = umbp_fail(-EBADMSG,
                     "hwloc could not parse '%s'%s as a topology XML (%s): re-export it with "
                     "'lstopo-no-graphics --of xml FILE', or set HWLOC_XML_VERBOSE=1 to see "
                     "hwloc's reason", file, env_xml ? " (HWLOC_XMLFILE)" : "", e ? strerror(e) : "invalid content");
    else
      rc = umbp_fail(e ? -e : -EIO, "hwloc could not read this machine's topology: %s",
                     strerror(e ? e : EIO));
    goto fail;
  }
  if ((rc = check_os_indexes(t)) < 0 || (rc = build_cpus(t)) < 0 || (rc = build_nodes(t)) < 0 || (rc = build_gpus(t, flags)) < 0)
    goto fail;
  if (t->oom) {
    rc = -ENOMEM;
    goto fail;
  }
  free(xml);
  *ret_topo = t;
  return 0;
fail:
  if (rc == -ENOMEM) umbp_fail(-ENOMEM, "out of memory loading the topology");
  free(xml);
  topo_destroy(t);
  return rc;
}

UMBP_API void umbp_topo_free(umbp_topo *topo) { topo_unref(topo); }

UMBP_API bool umbp_topo_is_live(const umbp_topo *topo) { return topo && topo->live; }

UMBP_API const char *umbp_topo_source(const umbp_topo *topo) { return topo ? topo->source : ""; }

UMBP_API int umbp_topo_package_count(const umbp_topo *topo) {
  return topo ? topo->npackages : umbp_fail(-EINVAL, "umbp_topo_package_count: topo is NULL");
}

UMBP_API int umbp_topo_core_count(const umbp_topo *topo) {
  return topo ? topo->ncores : umbp_fail(-EINVAL, "umbp_topo_core_count: topo is NULL");
}

UMBP_API int umbp_topo_pu_count(const umbp_topo *topo) {
  return topo ? topo->npus : umbp_fail(-EINVAL, "umbp_topo_pu_count: topo is NULL");
}

UMBP_API int umbp_topo_numa_count(const umbp_topo *topo) {
  return topo ? topo->nnodes : umbp_fail(-EINVAL, "umbp_topo_numa_count: topo is NULL");
}

UMBP_API int umbp_topo_numa_info_get(const umbp_topo *topo, int i, umbp_topo_numa_info *ret_info) {
  if (!topo || !ret_info) return umbp_fail(-EINVAL, "umbp_topo_numa_info_get: NULL argument");
  if (i < 0 || i >= topo->nnodes)
    return umbp_fail(-EINVAL, "NUMA node index %d out of range: the topology has %d node(s) with memory",
                     i, topo->nnodes);
  const struct topo_node *nd = &topo->nodes[i];
  ret_info->os_index = nd->os;
  ret_info->memory_bytes = nd->mem;
  ret_info->npus = nd->npus;
  ret_info->ncores = nd->ncores;
  return 0;
}

/* Write a bitmap's members (ascending) into out[0..max); return the count. */
static int bm_to_array(hwloc_const_bitmap_t b, unsigned *out, int max) {
  int n = 0;
  int id;
  hwloc_bitmap_foreach_begin(id, b) {
    if (out && n < max) out[n] = (unsigned)id;
    n++;
  }
  hwloc_bitmap_foreach_end();
  return n;
}

UMBP_API int umbp_topo_numa_pus(const umbp_topo *topo, int i, unsigned *out, int max) {
  if (!topo || max < 0 || (max > 0 && !out)) return umbp_fail(-EINVAL, "umbp_topo_numa_pus: bad argument");
  if (i < 0 || i >= topo->nnodes)
    return umbp_fail(-EINVAL, "NUMA node index %d out of range: the topology has %d node(s) with memory",
                     i, topo->nnodes);
  return bm_to_array(topo->nodes[i].cpuset, out, max);
}

UMBP_API int umbp_topo_gpu_count(const umbp_topo *topo) {
  return topo ? topo->ngpus : umbp_fail(-EINVAL, "umbp_topo_gpu_count: topo is NULL");
}

static int check_gpu(const umbp_topo *topo, int gpu) {
  if (gpu < 0 || gpu >= topo->ngpus) {
    if (topo->ngpus == 0)
      return umbp_fail(-EINVAL, "GPU %d does not exist: %s has no CUDA GPU", gpu, topo->source);
    return umbp_fail(-EINVAL, "GPU %d does not exist: %s has %d GPU(s), numbered 0-%d", gpu,
                     topo->source, topo->ngpus, topo->ngpus - 1);
  }
  return 0;
}

UMBP_API int umbp_topo_gpu_info_get(const umbp_topo *topo, int gpu, umbp_topo_gpu_info *ret_info) {
  if (!topo || !ret_info) return umbp_fail(-EINVAL, "umbp_topo_gpu_info_get: NULL argument");
  int rc = check_gpu(topo, gpu);
  if (rc < 0) return rc;
  *ret_info = topo->gpus[gpu].info;
  return 0;
}

UMBP_API int umbp_topo_gpu_numa_nodes(const umbp_topo *topo, int gpu, unsigned *out, int max) {
  if (!topo || max < 0 || (max > 0 && !out))
    return umbp_fail(-EINVAL, "umbp_topo_gpu_numa_nodes: bad argument");
  int rc = check_gpu(topo, gpu);
  return rc < 0 ? rc : bm_to_array(topo->gpus[gpu].nodeset, out, max);
}

UMBP_API int umbp_topo_gpu_pus(const umbp_topo *topo, int gpu, unsigned *out, int max) {
  if (!topo || max < 0 || (max > 0 && !out)) return umbp_fail(-EINVAL, "umbp_topo_gpu_pus: bad argument");
  int rc = check_gpu(topo, gpu);
  return rc < 0 ? rc : bm_to_array(topo->gpus[gpu].cpuset, out, max);
}

UMBP_API int umbp_topo_note_count(const umbp_topo *topo) {
  return topo ? topo->notes.n : umbp_fail(-EINVAL, "umbp_topo_note_count: topo is NULL");
}

UMBP_API const char *umbp_topo_note(const umbp_topo *topo, int i) {
  return topo ? sl_get(&topo->notes, i) : NULL;
}

/* ------------------------------------------------------------------------ */
/* Planning                                                                  */

struct prank {
  int gpu;              /* -1: none */
  int node;             /* index into topo->nodes */
  bool local;           /* node is local to the GPU */
  int policy;
  hwloc_bitmap_t cand;  /* candidate PUs (OS indexes) */
  int group;            /* first rank with an equal cand */
  int *cpus;            /* indexes into topo->pus, in the order taken */
  int ncpus;
  bool shared;
  int nmem;
  unsigned *mem;
  struct strlist notes;
};

struct umbp_topo_plan {
  umbp_topo *topo;
  int nranks;
  int threads;
  struct prank *r;
  struct strlist notes;
  unsigned *nodes;
  int nnodes;
  bool oom;
};

UMBP_API const char *umbp_topo_mempolicy_name(int policy) {
  switch (policy) {
  case UMBP_TOPO_MEM_AUTO: return "auto";
  case UMBP_TOPO_MEM_BIND: return "bind";
  case UMBP_TOPO_MEM_PREFERRED: return "preferred";
  case UMBP_TOPO_MEM_INTERLEAVE: return "interleave";
  case UMBP_TOPO_MEM_DEFAULT: return "default";
  default: return "?";
  }
}

UMBP_API int umbp_topo_mempolicy_parse(const char *name, int *ret_policy) {
  if (!name || !ret_policy) return umbp_fail(-EINVAL, "umbp_topo_mempolicy_parse: NULL argument");
  for (int p = UMBP_TOPO_MEM_AUTO; p <= UMBP_TOPO_MEM_DEFAULT; p++)
    if (!strcmp(name, umbp_topo_mempolicy_name(p))) {
      *ret_policy = p;
      return 0;
    }
  if (!strcmp(name, "none")) { /* the word of umbp pool create --mempolicy for the kernel's own policy */
    *ret_policy = UMBP_TOPO_MEM_DEFAULT;
    return 0;
  }
  return umbp_fail(-EINVAL,
                   "unknown memory policy '%s': use auto, bind, preferred, interleave or default (also called none)",
                   name);
}

UMBP_API void umbp_topo_plan_free(umbp_topo_plan *plan) {
  if (!plan) return;
  for (int i = 0; i < plan->nranks && plan->r; i++) {
    hwloc_bitmap_free(plan->r[i].cand);
    free(plan->r[i].cpus);
    free(plan->r[i].mem);
    sl_free(&plan->r[i].notes);
  }
  free(plan->r);
  free(plan->nodes);
  sl_free(&plan->notes);
  topo_unref(plan->topo);
  free(plan);
}

/* The PUs of set (positions in t->pus), physical-first: sorted by (smt,
 * core). Returns the count; out must hold t->npus entries. */
static int order_physical_first(const umbp_topo *t, hwloc_const_bitmap_t set, int *out) {
  int n = 0;
  int maxsmt = 0;
  for (int i = 0; i < t->npus; i++)
    if (t->pus[i].smt > maxsmt) maxsmt = t->pus[i].smt;
  for (int s = 0; s <= maxsmt; s++)
    for (int i = 0; i < t->npus; i++)
      if (t->pus[i].smt == s && hwloc_bitmap_isset(set, t->pus[i].os)) out[n++] = i;
  return n;
}

static const char *gpu_name(const umbp_topo *t, int g) { return g >= 0 ? t->gpus[g].info.name : "no GPU"; }

/* Choose each rank's partition node (pass 2 of the design note). */
static void plan_nodes(umbp_topo_plan *p, int *load) {
  const umbp_topo *t = p->topo;
  /* Ranks whose GPU has locality first, so that the round-robin ranks fill
   * in around them. */
  for (int pass = 0; pass < 2; pass++) {
    for (int i = 0; i < p->nranks; i++) {
      struct prank *r = &p->r[i];
      bool placed = r->gpu >= 0 && t->gpus[r->gpu].info.placed;
      if (placed != (pass == 0)) continue;
      int best = -1;
      for (int k = 0; k < t->nnodes; k++) {
        if (placed && !hwloc_bitmap_isset(t->gpus[r->gpu].nodeset, t->nodes[k].os)) continue;
        if (best < 0 || load[k] < load[best]) best = k;
      }
      r->node = best;
      r->local = placed;
      load[best]++;
      if (placed) {
        const struct topo_gpu *g = &t->gpus[r->gpu];
        if (g->info.nnuma == 1)
          sl_addf(&r->notes, &p->oom,
                  "pool partition on NUMA node %u: %s's PCI tree hangs off %s, whose memory is "
                  "node %u", t->nodes[best].os, g->info.name, g->anchor, t->nodes[best].os);
        else {
          char *ns = bm_list(g->nodeset, &p->oom);
          sl_addf(&r->notes, &p->oom,
                  "pool partition on NUMA node %u: %s's PCI tree hangs off %s, local to nodes %s; "
                  "node %u had the fewest ranks so far", t->nodes[best].os, g->info.name,
                  g->anchor, or_empty(ns), t->nodes[best].os);
          free(ns);
        }
      } else if (r->gpu >= 0) {
        sl_addf(&r->notes, &p->oom,
                "pool partition on NUMA node %u: hwloc cannot place %s (no NUMA locality), so "
                "the node is the one with the fewest ranks so far (round-robin)",
                t->nodes[best].os, gpu_name(t, r->gpu));
      } else if (t->nnodes > 1) {
        sl_addf(&r->notes, &p->oom,
                "pool partition on NUMA node %u: no GPU, so the node is the one with the fewest "
                "ranks so far (round-robin over the %d nodes with memory)", t->nodes[best].os,
                t->nnodes);
      } else {
        sl_addf(&r->notes, &p->oom, "pool partition on NUMA node %u, the only node with memory",
                t->nodes[best].os);
      }
    }
  }
}

/* Candidate PUs of each rank, and groups of ranks with equal candidates. */
static int plan_candidates(umbp_topo_plan *p) {
  const umbp_topo *t = p->topo;
  for (int i = 0; i < p->nranks; i++) {
    struct prank *r = &p->r[i];
    const struct topo_node *nd = &t->nodes[r->node];
    r->cand = hwloc_bitmap_alloc();
    if (!r->cand) return -ENOMEM;
    if (r->local) {
      const struct topo_gpu *g = &t->gpus[r->gpu];
      hwloc_bitmap_and(r->cand, g->cpuset, nd->cpuset);
      if (hwloc_bitmap_iszero(r->cand)) {
        hwloc_bitmap_copy(r->cand, g->cpuset);
        if (!hwloc_bitmap_iszero(r->cand))
          sl_addf(&r->notes, &p->oom,
                  "node %u has no PU of its own: copy threads use the PUs local to %s instead",
                  nd->os, g->info.name);
      }
    } else {
      hwloc_bitmap_copy(r->cand, nd->cpuset);
    }
    if (hwloc_bitmap_iszero(r->cand)) {
      hwloc_bitmap_copy(r->cand, t->all_pus);
      sl_addf(&r->notes, &p->oom,
              "node %u has no PU of its own (memory-only node): copy threads may use any PU",
              nd->os);
    }
    r->group = i;
    for (int j = 0; j < i; j++)
      if (hwloc_bitmap_isequal(p->r[j].cand, r->cand)) {
        r->group = p->r[j].group;
        break;
      }
  }
  return 0;
}

/* A candidate PU of a rank that shares: how many ranks hold it, its position
 * in physical-first order, and the PU (a position in topo->pus). */
struct share_key {
  int use, pos, pu;
};

static int cmp_share_key(const void *a, const void *b) {
  const struct share_key *x = a, *y = b;
  if (x->use != y->use) return (x->use > y->use) - (x->use < y->use);
  return (x->pos > y->pos) - (x->pos < y->pos);
}

/* Pass 3: PUs per rank. use[k] counts ranks holding t->pus[k]. */
static int plan_cpus(umbp_topo_plan *p, int *use, int *order, int *cores) {
  const umbp_topo *t = p->topo;
  int K = p->threads;
  int *members = malloc((size_t)p->nranks * sizeof *members);
  if (!members) return -ENOMEM;
  for (int i = 0; i < p->nranks; i++) {
    p->r[i].cpus = malloc((size_t)K * sizeof *p->r[i].cpus);
    if (!p->r[i].cpus) {
      free(members);
      return -ENOMEM;
    }
  }
  for (int gid = 0; gid < p->nranks; gid++) {
    int n = 0;
    for (int i = 0; i < p->nranks; i++)
      if (p->r[i].group == gid) members[n++] = i;
    if (n == 0) continue;
    hwloc_const_bitmap_t cand = p->r[gid].cand;
    /* A: free cores (a core with at least one free PU), in logical order. */
    int F = 0;
    for (int k = 0; k < t->npus; k++) {
      if (!hwloc_bitmap_isset(cand, t->pus[k].os) || use[k]) continue;
      if (F == 0 || cores[F - 1] != t->pus[k].core) cores[F++] = t->pus[k].core;
    }
    int norder = order_physical_first(t, cand, order);
    if (F >= n) {
      int off = 0;
      for (int m = 0; m < n; m++) {
        struct prank *r = &p->r[members[m]];
        int s = F / n + (m < F % n);
        int lo = cores[off], hi = cores[off + s - 1];
        off += s;
        for (int q = 0; q < norder && r->ncpus < K; q++) {
          int k = order[q];
          if (use[k] || t->pus[k].core < lo || t->pus[k].core > hi) continue;
          r->cpus[r->ncpus++] = k;
          use[k]++;
        }
      }
    }
    /* B: remaining free PUs of the group, round-robin. */
    bool progress = true;
    while (progress) {
      progress = false;
      for (int m = 0; m < n; m++) {
        struct prank *r = &p->r[members[m]];
        if (r->ncpus >= K) continue;
        for (int q = 0; q < norder; q++) {
          int k = order[q];
          if (use[k]) continue;
          r->cpus[r->ncpus++] = k;
          use[k]++;
          progress = true;
          break;
        }
      }
    }
  }
  /* C: share, least-used PUs first, once every group has had its free PUs.
   * Picked one at a time, a rank's next PU is the least-used one of C it does
   * not hold yet, the first in physical-first order among equals; a pick
   * changes only the count of the PU picked, which the rank then holds. So
   * the picks are the rank's missing PUs taken from C sorted once by (use,
   * position in that order): |C| log |C| per rank, not K x |C|. held[k] ==
   * i + 1 marks t->pus[k] as rank i's already. */
  int *held = calloc((size_t)t->npus, sizeof *held);
  struct share_key *keys = malloc((size_t)t->npus * sizeof *keys);
  if (!held || !keys) {
    free(held);
    free(keys);
    free(members);
    return -ENOMEM;
  }
  for (int i = 0; i < p->nranks; i++) {
    struct prank *r = &p->r[i];
    if (r->ncpus >= K) continue;
    for (int c = 0; c < r->ncpus; c++) held[r->cpus[c]] = i + 1;
    int norder = order_physical_first(t, r->cand, order), nkeys = 0;
    for (int q = 0; q < norder; q++)
      if (held[order[q]] != i + 1) keys[nkeys++] = (struct share_key){use[order[q]], q, order[q]};
    qsort(keys, (size_t)nkeys, sizeof *keys, cmp_share_key);
    for (int j = 0; j < nkeys && r->ncpus < K; j++) {
      r->cpus[r->ncpus++] = keys[j].pu;
      held[keys[j].pu] = i + 1;
      use[keys[j].pu]++;
    }
  }
  free(keys);
  free(held);
  free(members);
  return 0;
}

static void plan_cpu_notes(umbp_topo_plan *p, const int *use) {
  const umbp_topo *t = p->topo;
  int K = p->threads;
  hwloc_bitmap_t set = hwloc_bitmap_alloc(), sh = hwloc_bitmap_alloc();
  if (!set || !sh) {
    p->oom = true;
    goto out;
  }
  for (int i = 0; i < p->nranks; i++) {
    struct prank *r = &p->r[i];
    const struct topo_node *nd = &t->nodes[r->node];
    hwloc_bitmap_zero(set);
    hwloc_bitmap_zero(sh);
    int nsib = 0;
    for (int c = 0; c < r->ncpus; c++) {
      hwloc_bitmap_set(set, t->pus[r->cpus[c]].os);
      if (use[r->cpus[c]] > 1) hwloc_bitmap_set(sh, t->pus[r->cpus[c]].os);
      if (t->pus[r->cpus[c]].smt > 0) nsib++;
    }
    r->shared = !hwloc_bitmap_iszero(sh);
    int ncores = count_cores(t, set);
    int cand_pus = hwloc_bitmap_weight(r->cand);
    int group_n = 0;
    for (int j = 0; j < p->nranks; j++) group_n += p->r[j].group == r->group;
    char where[96];
    if (r->local)
      snprintf(where, sizeof where, "local to %s and node %u", t->gpus[r->gpu].info.name, nd->os);
    else
      snprintf(where, sizeof where, "of node %u", nd->os);
    char *cl = bm_list(set, &p->oom);
    sl_addf(&r->notes, &p->oom,
            "copy threads on PU%s %s: %d PU(s) on %d physical core(s), chosen among the %d PUs %s%s%s",
            r->ncpus > 1 ? "s" : "", or_empty(cl), r->ncpus, ncores, cand_pus, where,
            group_n > 1 ? "; those cores are split into one slice per rank using them" : "",
            nsib == 0 ? "; one PU per core, no hyperthread sibling" : "");
    free(cl);
    if (nsib > 0 && !r->shared)
      sl_addf(&r->notes, &p->oom,
              "%d hyperthread sibling(s) among them: %d copy threads need more PUs than this "
              "rank's %d core(s)", nsib, K, ncores);
    if (r->ncpus < K)
      sl_addf(&r->notes, &p->oom,
              "only %d PU(s) available for %d copy threads: threads will share PUs (thread j runs "
              "on PU j mod %d)", r->ncpus, K, r->ncpus);
    if (r->shared) {
      char *sl = bm_list(sh, &p->oom);
      char others[256] = "";
      size_t len = 0;
      for (int j = 0; j < p->nranks; j++) {
        if (j == i) continue;
        bool inter = false;
        for (int c = 0; c < p->r[j].ncpus && !inter; c++)
          inter = hwloc_bitmap_isset(sh, t->pus[p->r[j].cpus[c]].os);
        if (!inter) continue;
        int w = snprintf(others + len, sizeof others - len, "%s%d", len ? "," : "", j);
        if (w < 0 || (size_t)w >= sizeof others - len) break;
        len += (size_t)w;
      }
      sl_addf(&r->notes, &p->oom,
              "cores are scarce: PU(s) %s also used by rank(s) %s (%d rank(s) want %d PUs each "
              "from the %d PUs %s)", or_empty(sl), others, group_n, K, cand_pus, where);
      free(sl);
    }
  }
out:
  hwloc_bitmap_free(set);
  hwloc_bitmap_free(sh);
}

static void plan_mempolicy(umbp_topo_plan *p, int requested) {
  const umbp_topo *t = p->topo;
  int pol = requested;
  if (pol == UMBP_TOPO_MEM_AUTO) {
    pol = t->nnodes > 1 ? UMBP_TOPO_MEM_BIND : UMBP_TOPO_MEM_DEFAULT;
    sl_addf(&p->notes, &p->oom,
            t->nnodes > 1 ? "memory policy auto -> bind: each partition takes pages only from its "
                            "rank's node, so a full node fails loudly instead of going remote"
                          : "memory policy auto -> default: with one NUMA node, binding would "
                            "change nothing");
  }
  for (int i = 0; i < p->nranks; i++) {
    struct prank *r = &p->r[i];
    unsigned node = t->nodes[r->node].os;
    r->policy = pol;
    hwloc_const_bitmap_t ns = NULL;
    if (pol == UMBP_TOPO_MEM_INTERLEAVE)
      ns = r->local ? t->gpus[r->gpu].nodeset : t->mem_nodes;
    int n = pol == UMBP_TOPO_MEM_DEFAULT ? 0 : pol == UMBP_TOPO_MEM_INTERLEAVE ? hwloc_bitmap_weight(ns) : 1;
    r->mem = calloc((size_t)(n ? n : 1), sizeof *r->mem);
    if (!r->mem) {
      p->oom = true;
      return;
    }
    r->nmem = n;
    if (pol == UMBP_TOPO_MEM_INTERLEAVE)
      bm_to_array(ns, r->mem, n);
    else if (n)
      r->mem[0] = node;
    switch (pol) {
    case UMBP_TOPO_MEM_BIND:
      sl_addf(&r->notes, &p->oom, "memory policy bind: the partition's pages come only from node %u",
              node);
      break;
    case UMBP_TOPO_MEM_PREFERRED:
      sl_addf(&r->notes, &p->oom,
              "memory policy preferred: pages from node %u first, other nodes when it is full", node);
      break;
    case UMBP_TOPO_MEM_INTERLEAVE: {
      char *s = bm_list(ns, &p->oom);
      sl_addf(&r->notes, &p->oom, "memory policy interleave: pages spread over node(s) %s%s",
              or_empty(s), r->local ? ", the nodes local to the GPU" : ", every node with memory");
      free(s);
      break;
    }
    default:
      sl_addf(&r->notes, &p->oom,
              "memory policy default: pages land where they are first touched (no binding)");
      break;
    }
  }
}

static void plan_level_notes(umbp_topo_plan *p) {
  const umbp_topo *t = p->topo;
  if (t->ngpus == 0) {
    char *ns = bm_list(t->mem_nodes, &p->oom);
    sl_addf(&p->notes, &p->oom,
            "no CUDA GPU found %s%s%s: ranks spread round-robin over the %d NUMA node(s) with "
            "memory (%s), copy threads on each node's own cores", t->live ? "on " : "in ", t->source,
            t->nskipped ? " (GPUs without a CUDA device are skipped; see the machine notes)" : "",
            t->nnodes, or_empty(ns));
    free(ns);
  }
  if (t->nnodes == 1)
    sl_addf(&p->notes, &p->oom,
            "one NUMA node with memory (node %u): every partition is on it; the plan only chooses "
            "cores", t->nodes[0].os);
  for (int g = 0; g < t->ngpus; g++) {
    if (t->gpus[g].info.placed) continue;
    char ranks[256] = "";
    size_t len = 0;
    for (int i = 0; i < p->nranks; i++) {
      if (p->r[i].gpu != g) continue;
      int w = snprintf(ranks + len, sizeof ranks - len, "%s%d", len ? "," : "", i);
      if (w < 0 || (size_t)w >= sizeof ranks - len) break;
      len += (size_t)w;
    }
    if (len)
      sl_addf(&p->notes, &p->oom,
              "hwloc cannot place GPU %d (%s, %s): no NUMA locality in the topology, so rank(s) %s "
              "go round-robin over the nodes with memory; check the BIOS NUMA/ACPI SLIT/SRAT "
              "settings or place them by hand", g, t->gpus[g].info.name,
              t->gpus[g].info.pci_bus_id[0] ? t->gpus[g].info.pci_bus_id : "no bus id", ranks);
  }
  /* GPUs given to several ranks. */
  for (int g = 0; g < t->ngpus; g++) {
    int cnt = 0;
    for (int i = 0; i < p->nranks; i++) cnt += p->r[i].gpu == g;
    if (cnt < 2) continue;
    char ranks[256] = "";
    size_t len = 0;
    for (int i = 0; i < p->nranks; i++) {
      if (p->r[i].gpu != g) continue;
      int w = snprintf(ranks + len, sizeof ranks - len, "%s%d", len ? "," : "", i);
      if (w < 0 || (size_t)w >= sizeof ranks - len) break;
      len += (size_t)w;
    }
    sl_addf(&p->notes, &p->oom, "GPU %d (%s) is shared by ranks %s", g, t->gpus[g].info.name, ranks);
  }
  int nshared = 0;
  for (int i = 0; i < p->nranks; i++) nshared += p->r[i].shared;
  if (nshared)
    sl_addf(&p->notes, &p->oom,
            "cores are scarce: %d rank(s) share copy-thread PUs with another rank (shared_cpus); "
            "lower the threads per rank or the rank count to make them disjoint", nshared);
}

UMBP_API int umbp_topo_plan_make(umbp_topo *topo, const umbp_topo_plan_opts *opts,
                                 umbp_topo_plan **ret_plan) {
  if (!topo || !ret_plan) return umbp_fail(-EINVAL, "umbp_topo_plan_make: topo or ret_plan is NULL");
  umbp_topo_plan_opts o = UMBP_TOPO_PLAN_OPTS_INIT;
  if (opts) o = *opts;
  if (o.nranks < 0 || o.nranks > UMBP_TOPO_MAX_RANKS)
    return umbp_fail(-EINVAL, "rank count %d out of range: give 1 to %d ranks (0 = one per GPU)",
                     o.nranks, UMBP_TOPO_MAX_RANKS);
  if (o.gpus && o.nranks == 0)
    return umbp_fail(-EINVAL, "a GPU list needs its length: set nranks to the number of entries");
  if (o.threads_per_rank < 0 || o.threads_per_rank > UMBP_TOPO_MAX_THREADS_PER_RANK)
    return umbp_fail(-EINVAL, "threads per rank %d out of range: give 1 to %d (0 = default %d)",
                     o.threads_per_rank, UMBP_TOPO_MAX_THREADS_PER_RANK,
                     UMBP_TOPO_DEFAULT_THREADS_PER_RANK);
  if (o.mempolicy < UMBP_TOPO_MEM_AUTO || o.mempolicy > UMBP_TOPO_MEM_DEFAULT)
    return umbp_fail(-EINVAL, "unknown memory policy %d: use enum umbp_topo_mempolicy", o.mempolicy);
  if (o.gpus)
    for (int i = 0; i < o.nranks; i++) {
      if (o.gpus[i] == -1) continue;
      if (o.gpus[i] < -1) return umbp_fail(-EINVAL, "rank %d: GPU %d is not a GPU index (-1 = none)", i, o.gpus[i]);
      int rc = check_gpu(topo, o.gpus[i]);
      if (rc < 0) return rc;
    }

  umbp_topo_plan *p = calloc(1, sizeof *p);
  if (!p) return umbp_fail(-ENOMEM, "out of memory making the plan");
  topo_ref(topo);
  p->topo = topo;
  p->threads = o.threads_per_rank ? o.threads_per_rank : UMBP_TOPO_DEFAULT_THREADS_PER_RANK;
  int n = o.nranks;
  if (n == 0) {
    n = topo->ngpus ? topo->ngpus : topo->nnodes;
    sl_addf(&p->notes, &p->oom,
            topo->ngpus ? "no rank count given: one rank per GPU (%d)"
                        : "no rank count given and no GPU: one rank per NUMA node with memory (%d)",
            n);
  }
  p->nranks = n;
  int *load = NULL, *use = NULL, *order = NULL, *cores = NULL;
  int rc = -ENOMEM;
  p->r = calloc((size_t)n, sizeof *p->r);
  load = calloc((size_t)topo->nnodes, sizeof *load);
  use = calloc((size_t)topo->npus, sizeof *use);
  order = calloc((size_t)topo->npus, sizeof *order);
  cores = calloc((size_t)topo->npus, sizeof *cores);
  if (!p->r || !load || !use || !order || !cores) goto fail;

  /* Pass 1: GPUs. */
  for (int i = 0; i < n; i++) {
    struct prank *r = &p->r[i];
    if (o.gpus)
      r->gpu = o.gpus[i];
    else
      r->gpu = topo->ngpus ? i % topo->ngpus : -1;
    if (r->gpu >= 0) {
      const umbp_topo_gpu_info *g = &topo->gpus[r->gpu].info;
      char why[64];
      if (o.gpus)
        snprintf(why, sizeof why, "as the GPU list says");
      else if (n <= topo->ngpus)
        snprintf(why, sizeof why, "rank i uses GPU i");
      else
        snprintf(why, sizeof why, "rank i uses GPU i mod %d", topo->ngpus);
      sl_addf(&r->notes, &p->oom, "GPU %d (%s%s%s%s%s): %s", r->gpu, g->name,
              g->pci_bus_id[0] ? " at " : "", g->pci_bus_id, g->model[0] ? ", " : "", g->model, why);
    } else {
      sl_addf(&r->notes, &p->oom, "no GPU: %s",
              o.gpus ? "the GPU list says -1" : "the machine has no CUDA GPU");
    }
  }
  if (!o.gpus && topo->ngpus && n > topo->ngpus)
    sl_addf(&p->notes, &p->oom,
            "%d ranks but %d GPU(s): rank i uses GPU i mod %d, so GPUs are shared", n,
            topo->ngpus, topo->ngpus);

  plan_nodes(p, load);
  if ((rc = plan_candidates(p)) < 0) goto fail;
  if ((rc = plan_cpus(p, use, order, cores)) < 0) goto fail;
  plan_cpu_notes(p, use);
  plan_level_notes(p);
  plan_mempolicy(p, o.mempolicy);

  /* Nodes used, ascending. */
  p->nodes = calloc((size_t)topo->nnodes, sizeof *p->nodes);
  if (!p->nodes) {
    rc = -ENOMEM;
    goto fail;
  }
  for (int k = 0; k < topo->nnodes; k++)
    if (load[k]) p->nodes[p->nnodes++] = topo->nodes[k].os;
  if (p->oom) {
    rc = -ENOMEM;
    goto fail;
  }
  free(load);
  free(use);
  free(order);
  free(cores);
  *ret_plan = p;
  return 0;
fail:
  free(load);
  free(use);
  free(order);
  free(cores);
  umbp_topo_plan_free(p);
  return rc == -ENOMEM ? umbp_fail(-ENOMEM, "out of memory making the plan") : rc;
}

UMBP_API const umbp_topo *umbp_topo_plan_topo(const umbp_topo_plan *plan) {
  return plan ? plan->topo : NULL;
}

UMBP_API int umbp_topo_plan_nranks(const umbp_topo_plan *plan) {
  return plan ? plan->nranks : umbp_fail(-EINVAL, "umbp_topo_plan_nranks: plan is NULL");
}

UMBP_API int umbp_topo_plan_threads_per_rank(const umbp_topo_plan *plan) {
  return plan ? plan->threads : umbp_fail(-EINVAL, "umbp_topo_plan_threads_per_rank: plan is NULL");
}

static int check_rank(const umbp_topo_plan *plan, int rank) {
  if (!plan) return umbp_fail(-EINVAL, "plan is NULL");
  if (rank < 0 || rank >= plan->nranks)
    return umbp_fail(-EINVAL, "rank %d out of range: the plan has %d rank(s)", rank, plan->nranks);
  return 0;
}

UMBP_API int umbp_topo_plan_rank(const umbp_topo_plan *plan, int rank, umbp_topo_rank_info *ret_info) {
  int rc = check_rank(plan, rank);
  if (rc < 0) return rc;
  if (!ret_info) return umbp_fail(-EINVAL, "umbp_topo_plan_rank: ret_info is NULL");
  const struct prank *r = &plan->r[rank];
  ret_info->rank = rank;
  ret_info->gpu = r->gpu;
  ret_info->numa_node = plan->topo->nodes[r->node].os;
  ret_info->gpu_local = r->local;
  ret_info->mempolicy = r->policy;
  ret_info->ncpus = r->ncpus;
  ret_info->shared_cpus = r->shared;
  ret_info->nmem_nodes = r->nmem;
  ret_info->nnotes = r->notes.n;
  return 0;
}

UMBP_API int umbp_topo_plan_rank_cpus(const umbp_topo_plan *plan, int rank, unsigned *out, int max) {
  int rc = check_rank(plan, rank);
  if (rc < 0) return rc;
  if (max < 0 || (max > 0 && !out)) return umbp_fail(-EINVAL, "umbp_topo_plan_rank_cpus: bad buffer");
  const struct prank *r = &plan->r[rank];
  for (int i = 0; i < r->ncpus && i < max; i++) out[i] = plan->topo->pus[r->cpus[i]].os;
  return r->ncpus;
}

UMBP_API int umbp_topo_plan_rank_mem_nodes(const umbp_topo_plan *plan, int rank, unsigned *out,
                                           int max) {
  int rc = check_rank(plan, rank);
  if (rc < 0) return rc;
  if (max < 0 || (max > 0 && !out))
    return umbp_fail(-EINVAL, "umbp_topo_plan_rank_mem_nodes: bad buffer");
  const struct prank *r = &plan->r[rank];
  for (int i = 0; i < r->nmem && i < max; i++) out[i] = r->mem[i];
  return r->nmem;
}

UMBP_API const char *umbp_topo_plan_rank_note(const umbp_topo_plan *plan, int rank, int i) {
  if (!plan || rank < 0 || rank >= plan->nranks) return NULL;
  return sl_get(&plan->r[rank].notes, i);
}

UMBP_API int umbp_topo_plan_note_count(const umbp_topo_plan *plan) {
  return plan ? plan->notes.n : umbp_fail(-EINVAL, "umbp_topo_plan_note_count: plan is NULL");
}

UMBP_API const char *umbp_topo_plan_note(const umbp_topo_plan *plan, int i) {
  return plan ? sl_get(&plan->notes, i) : NULL;
}

UMBP_API int umbp_topo_plan_numa_nodes(const umbp_topo_plan *plan, unsigned *out, int max) {
  if (!plan || max < 0 || (max > 0 && !out))
    return umbp_fail(-EINVAL, "umbp_topo_plan_numa_nodes: bad argument");
  for (int i = 0; i < plan->nnodes && i < max; i++) out[i] = plan->nodes[i];
  return plan->nnodes;
}

/* ------------------------------------------------------------------------ */
/* Applying                                                                  */

UMBP_API int umbp_topo_apply_thread(const umbp_topo_plan *plan, int rank, int thread, unsigned flags,
                                    char *ret_desc, size_t desc_len) {
  int rc = check_rank(plan, rank);
  if (rc < 0) return rc;
  if (flags & ~(unsigned)UMBP_TOPO_APPLY_MEMBIND)
    return umbp_fail(-EINVAL, "umbp_topo_apply_thread: unknown flags 0x%x", flags);
  if (ret_desc && desc_len == 0) return umbp_fail(-EINVAL, "umbp_topo_apply_thread: desc_len is 0");
  const umbp_topo *t = plan->topo;
  if (!t->live || !hwloc_topology_is_thissystem(t->hw))
    return umbp_fail(-EINVAL,
                     "the plan was made from the topology file '%s', which may describe another "
                     "machine: bind threads only with a plan made from umbp_topo_load(NULL, ...)",
                     t->source);
  const struct hwloc_topology_support *sup = hwloc_topology_get_support(t->hw);
  if (!sup->cpubind->set_thisthread_cpubind)
    return umbp_fail(-ENOSYS, "this system cannot bind threads to PUs (hwloc reports no support)");
  bool membind = (flags & UMBP_TOPO_APPLY_MEMBIND) && plan->r[rank].policy != UMBP_TOPO_MEM_DEFAULT;
  if (membind && !sup->membind->set_thisthread_membind)
    return umbp_fail(-ENOSYS, "this system cannot set a thread's memory binding (hwloc reports no "
                              "support); apply without UMBP_TOPO_APPLY_MEMBIND");

  const struct prank *r = &plan->r[rank];
  hwloc_bitmap_t set = hwloc_bitmap_alloc(), old = hwloc_bitmap_alloc(), got = hwloc_bitmap_alloc(),
                 all = hwloc_bitmap_alloc(), ns = hwloc_bitmap_alloc();
  char *s_set = NULL, *s_all = NULL, *s_got = NULL, *s_ns = NULL;
  if (!set || !old || !got || !all || !ns) {
    rc = umbp_fail(-ENOMEM, "out of memory binding a thread");
    goto out;
  }
  for (int c = 0; c < r->ncpus; c++) hwloc_bitmap_set(all, t->pus[r->cpus[c]].os);
  if (thread < 0)
    hwloc_bitmap_copy(set, all);
  else
    hwloc_bitmap_only(set, t->pus[r->cpus[thread % r->ncpus]].os);
  bool have_old = hwloc_get_cpubind(t->hw, old, HWLOC_CPUBIND_THREAD) == 0;
  if (hwloc_set_cpubind(t->hw, set, HWLOC_CPUBIND_THREAD) < 0) {
    int e = errno ? errno : EINVAL;
    char *s = NULL;
    hwloc_bitmap_list_asprintf(&s, set);
    rc = umbp_fail(-e,
                   "binding this thread to PU(s) %s failed: %s (are they in this process's cpuset? "
                   "check with 'taskset -cp PID')", or_empty(s), strerror(e));
    free(s);
    goto out;
  }
  if (membind) {
    hwloc_membind_policy_t pol = HWLOC_MEMBIND_BIND;
    int mflags = HWLOC_MEMBIND_THREAD | HWLOC_MEMBIND_BYNODESET;
    if (r->policy == UMBP_TOPO_MEM_BIND) mflags |= HWLOC_MEMBIND_STRICT;
    if (r->policy == UMBP_TOPO_MEM_INTERLEAVE) pol = HWLOC_MEMBIND_INTERLEAVE;
    for (int k = 0; k < r->nmem; k++) hwloc_bitmap_set(ns, r->mem[k]);
    if (hwloc_set_membind(t->hw, ns, pol, mflags) < 0) {
      int e = errno ? errno : EINVAL;
      if (have_old) hwloc_set_cpubind(t->hw, old, HWLOC_CPUBIND_THREAD); /* undo: outputs only on success */
      rc = umbp_fail(-e,
                     "setting this thread's memory policy %s failed: %s (containers often need "
                     "CAP_SYS_NICE for set_mempolicy; apply without UMBP_TOPO_APPLY_MEMBIND)",
                     umbp_topo_mempolicy_name(r->policy), strerror(e));
      goto out;
    }
  }
  if (ret_desc) {
    bool ok = hwloc_get_cpubind(t->hw, got, HWLOC_CPUBIND_THREAD) == 0;
    if (hwloc_bitmap_list_asprintf(&s_set, set) < 0 || hwloc_bitmap_list_asprintf(&s_all, all) < 0 ||
        (ok && hwloc_bitmap_list_asprintf(&s_got, got) < 0) ||
        hwloc_bitmap_list_asprintf(&s_ns, ns) < 0) {
      rc = umbp_fail(-ENOMEM, "out of memory describing a thread binding");
      goto out;
    }
    char thr[32];
    if (thread < 0)
      snprintf(thr, sizeof thr, "all threads");
    else
      snprintf(thr, sizeof thr, "thread %d", thread);
    snprintf(ret_desc, desc_len,
             "rank %d %s: bound to PU%s %s (of the rank's PUs %s; %s, node %u); kernel now reports "
             "PUs %s; memory binding %s%s%s",
             rank, thr, hwloc_bitmap_weight(set) > 1 ? "s" : "", s_set, s_all, gpu_name(t, r->gpu),
             t->nodes[r->node].os, ok ? s_got : "(unknown)",
             membind ? umbp_topo_mempolicy_name(r->policy) : "unchanged", membind ? " on node(s) " : "",
             membind ? s_ns : "");
  }
  rc = 0;
out:
  free(s_set);
  free(s_all);
  free(s_got);
  free(s_ns);
  hwloc_bitmap_free(set);
  hwloc_bitmap_free(old);
  hwloc_bitmap_free(got);
  hwloc_bitmap_free(all);
  hwloc_bitmap_free(ns);
  return rc;
}
