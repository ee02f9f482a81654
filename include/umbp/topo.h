/* SPDX-License-Identifier: Apache-2.0 */
/*
 * umbp/topo.h — where each GPU rank's host memory and copy threads belong.
 *
 * On a multi-socket GPU server a pool partition or a copy thread on the
 * wrong socket cuts host<->GPU bandwidth several-fold. This module reads the
 * machine's topology with hwloc (or an hwloc XML export of some machine),
 * finds the GPUs and the NUMA node(s) and cores each one is local to, and
 * plans, for every tensor-parallel rank:
 *
 *   - the GPU it drives (or none),
 *   - the NUMA node its pool partition lives on,
 *   - the PUs (hardware threads) its copy threads run on: local to its GPU,
 *     one PU per physical core before any hyperthread sibling, disjoint from
 *     the other ranks' PUs whenever the node has enough of them — shared, and
 *     flagged as shared, when it does not,
 *   - the memory policy for the partition,
 *   - and a sentence per choice saying why ("notes"), so a human can check it.
 *
 * Then it applies the CPU part to a thread (umbp_topo_apply_thread).
 *
 * Lifetimes: a umbp_topo is immutable once loaded; a umbp_topo_plan is
 * immutable once made and holds a reference on the topology it was made
 * from, so the two may be freed in either order, even by different threads
 * at the same time (the reference count is atomic; the last release frees).
 * Both may be read by any number of threads at once. Nothing here touches
 * shared memory: handles are plain per-process heap objects (a fork()ed
 * child gets a copy; another process loads its own).
 *
 * Cost: loading the live machine takes milliseconds (hwloc reads sysfs and,
 * in a CUDA build, the CUDA runtime is initialised); do it once per process,
 * not per request.
 *
 * Conventions (see umbp/common.h): 0 or a negative errno is returned, results
 * go out through trailing ret_ pointers written only on success, and
 * umbp_last_error() holds a sentence naming the cause and the fix.
 * "Count" functions that fill a caller's array return the full count and
 * write min(count, max) entries, so (NULL, 0) asks for the count alone.
 *
 * PU, core and NUMA node numbers are always OS indexes (the numbers Linux,
 * numactl and taskset use), never hwloc logical indexes.
 */
#ifndef UMBP_TOPO_H
#define UMBP_TOPO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "umbp/common.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct umbp_topo umbp_topo;
typedef struct umbp_topo_plan umbp_topo_plan;

/* Limits checked by umbp_topo_plan(). */
#define UMBP_TOPO_MAX_RANKS 4096
#define UMBP_TOPO_MAX_THREADS_PER_RANK 1024
/* Copy threads per rank when umbp_topo_plan_opts.threads_per_rank is 0. */
#define UMBP_TOPO_DEFAULT_THREADS_PER_RANK 2

/* ---------------------------------------------------------------------------
 * Loading
 * ------------------------------------------------------------------------- */

enum umbp_topo_load_flags {
  /* Do not ask the CUDA runtime for its devices, even on the live machine.
   * Use it in a process that will fork() later: the CUDA runtime, once
   * initialised, does not survive fork(). GPUs then come from the topology's
   * OS devices only, so CUDA_VISIBLE_DEVICES reordering is not seen. */
  UMBP_TOPO_LOAD_NO_CUDA = 1u << 0,
};

/*
 * Load a topology.
 *
 * xml_path NULL: this machine, I/O devices included (PCI devices, GPUs). In
 * a build with CUDA and without UMBP_TOPO_LOAD_NO_CUDA, the CUDA runtime is
 * then asked for its devices and each is matched to its PCI device by bus id
 * (cudaDeviceGetPCIBusId), so GPU i is CUDA device i as this process sees
 * it, CUDA_VISIBLE_DEVICES included. When the runtime reports no device (no
 * driver, no GPU), GPUs come from the topology's CUDA/NVML OS devices and a
 * note says so. When hwloc's HWLOC_XMLFILE variable is set (and neither
 * HWLOC_FSROOT nor HWLOC_SYNTHETIC, which hwloc prefers), hwloc loads that
 * file instead of discovering: it is read and checked as an xml_path is,
 * its errors are returned as an xml_path's are, and a note names it.
 * xml_path non-NULL: an hwloc XML export (`lstopo-no-graphics --of xml`), for
 * tests and offline planning; the CUDA runtime is never asked, GPUs are the
 * file's CUDA OS devices (cudaN, in N order), else its NVML ones.
 *
 * Returns 0 and *ret_topo (free with umbp_topo_free), or:
 *   -EINVAL  ret_topo is NULL, xml_path is empty, a directory, not a
 *            regular file (a device, a pipe) or over 16 MiB, or flags has
 *            unknown bits;
 *   -ENOENT  the XML file does not exist;
 *   -EACCES  the XML file cannot be read;
 *   -EBADMSG hwloc could not parse the XML file, the file nests elements
 *            over 128 deep, or the topology has no PU, no NUMA node or more
 *            than UMBP_TOPO_MAX_RANKS GPUs;
 *   -ENOMEM  out of memory;
 *   other negative errno from hwloc.
 * Any thread. Does not print (hwloc's XML diagnostics are off unless the
 * user sets HWLOC_XML_VERBOSE).
 */
UMBP_API int umbp_topo_load(const char *xml_path, unsigned flags, umbp_topo **ret_topo);

/* Drop the caller's reference; the topology is freed once no plan made from
 * it remains. NULL is accepted. No other thread may use this handle
 * (through this reference) during or after the call. */
UMBP_API void umbp_topo_free(umbp_topo *topo);

/* ---------------------------------------------------------------------------
 * Queries. Any thread, concurrently; the topology is immutable.
 * Bad handles or out-of-range indexes give -EINVAL (or NULL / 0 where noted).
 * ------------------------------------------------------------------------- */

/* True when the topology is this machine's (loaded with xml_path NULL). */
UMBP_API bool umbp_topo_is_live(const umbp_topo *topo);

/* "this machine" or the XML path given to umbp_topo_load. Owned by topo. */
UMBP_API const char *umbp_topo_source(const umbp_topo *topo);

/* Counts of packages (sockets), physical cores and PUs (hardware threads,
 * only those this process is allowed to use on the live machine). */
/* Packages (>= 0), or -EINVAL for a NULL topo. */
UMBP_API int umbp_topo_package_count(const umbp_topo *topo);
/* Physical cores with at least one usable PU (>= 0), or -EINVAL for NULL. */
UMBP_API int umbp_topo_core_count(const umbp_topo *topo);
/* Usable PUs (>= 0), or -EINVAL for a NULL topo. */
UMBP_API int umbp_topo_pu_count(const umbp_topo *topo);

/* NUMA nodes with memory, in OS-index order; index i in [0, count). When the
 * topology reports no memory size for any node, every node counts. */
typedef struct umbp_topo_numa_info {
  unsigned os_index;     /* the node number numactl shows */
  uint64_t memory_bytes; /* local memory of the node */
  int npus;              /* PUs local to the node (0 for a memory-only node) */
  int ncores;            /* cores with at least one PU local to the node */
} umbp_topo_numa_info;

/* NUMA nodes with memory (>= 1 on a loaded topology), or -EINVAL for NULL. */
UMBP_API int umbp_topo_numa_count(const umbp_topo *topo);
/* Describe node index i (not the OS index): 0 and *ret_info, or -EINVAL (NULL
 * argument, i out of range). */
UMBP_API int umbp_topo_numa_info_get(const umbp_topo *topo, int i, umbp_topo_numa_info *ret_info);
/* PUs local to NUMA node i, ascending OS indexes. Returns the count. */
UMBP_API int umbp_topo_numa_pus(const umbp_topo *topo, int i, unsigned *out, int max);

/* How a GPU was found. */
enum umbp_topo_gpu_source {
  UMBP_TOPO_GPU_FROM_CUDART = 0,    /* CUDA runtime device, matched to PCI by bus id */
  UMBP_TOPO_GPU_FROM_HWLOC_CUDA = 1, /* hwloc CUDA OS device ("cudaN") */
  UMBP_TOPO_GPU_FROM_HWLOC_NVML = 2, /* hwloc NVML OS device ("nvmlN"), no CUDA one */
};

#define UMBP_TOPO_GPU_NAME_MAX 32
#define UMBP_TOPO_PCI_BUS_ID_MAX 16

/* One GPU the planner can give to a rank. GPU index g in [0, count) is the
 * CUDA device ordinal when the CUDA runtime or the topology says it. */
typedef struct umbp_topo_gpu_info {
  int index;
  char name[UMBP_TOPO_GPU_NAME_MAX];           /* "cuda0"; "nvml2" when no CUDA device */
  char pci_bus_id[UMBP_TOPO_PCI_BUS_ID_MAX];   /* "0000:01:00.0", "" if not on PCI */
  char vendor[64];                             /* "NVIDIA Corporation", or "" */
  char model[96];                              /* "Tesla P100-SXM2-16GB", or "" */
  int cuda_ordinal;                            /* CUDA device number, -1 if unknown */
  int source;                                  /* enum umbp_topo_gpu_source */
  /* false when hwloc cannot place the GPU: its device hangs off the machine
   * root of a multi-node machine, or its bus id is not in the topology. It
   * then has no local NUMA node and no local PU. */
  bool placed;
  int nnuma;                                   /* local NUMA nodes with memory */
  int npus;                                    /* local PUs */
} umbp_topo_gpu_info;

/* GPUs the planner can use (>= 0), or -EINVAL for a NULL topo. */
UMBP_API int umbp_topo_gpu_count(const umbp_topo *topo);
/* Describe GPU index gpu: 0 and *ret_info (a copy the caller owns), or
 * -EINVAL (NULL argument, gpu out of range; the message says how many exist). */
UMBP_API int umbp_topo_gpu_info_get(const umbp_topo *topo, int gpu, umbp_topo_gpu_info *ret_info);
/* The GPU's local NUMA nodes with memory: the nodeset of the GPU's first
 * non-I/O ancestor (the package, group or node its PCI tree hangs off).
 * Ascending OS indexes. Returns the count (0 when not placed). */
UMBP_API int umbp_topo_gpu_numa_nodes(const umbp_topo *topo, int gpu, unsigned *out, int max);
/* The GPU's local PUs (the cpuset of that ancestor). Returns the count. */
UMBP_API int umbp_topo_gpu_pus(const umbp_topo *topo, int gpu, unsigned *out, int max);

/* Sentences about discovery: how GPUs were found, GPUs that were skipped
 * (display GPUs without a CUDA device), CUDA runtime errors. i in
 * [0, count); NULL when out of range. Owned by topo. */
/* Number of notes (>= 0), or -EINVAL for a NULL topo. */
UMBP_API int umbp_topo_note_count(const umbp_topo *topo);
/* Note i, valid until umbp_topo_free() of the last reference; NULL when topo
 * is NULL or i is out of range (sets no error). */
UMBP_API const char *umbp_topo_note(const umbp_topo *topo, int i);

/* ---------------------------------------------------------------------------
 * Planning
 * ------------------------------------------------------------------------- */

enum umbp_topo_mempolicy {
  UMBP_TOPO_MEM_AUTO = 0,       /* bind; default when the machine has one NUMA node */
  UMBP_TOPO_MEM_BIND = 1,       /* pages only from the rank's node (MPOL_BIND) */
  UMBP_TOPO_MEM_PREFERRED = 2,  /* the rank's node first, others when it is full */
  UMBP_TOPO_MEM_INTERLEAVE = 3, /* interleave over the GPU's local nodes */
  UMBP_TOPO_MEM_DEFAULT = 4,    /* leave the kernel's first-touch default */
};

/* "auto", "bind", "preferred", "interleave", "default"; "?" if unknown. */
UMBP_API const char *umbp_topo_mempolicy_name(int policy);
/* Parse one of those names. Returns 0 and *ret_policy, or -EINVAL. */
UMBP_API int umbp_topo_mempolicy_parse(const char *name, int *ret_policy);

typedef struct umbp_topo_plan_opts {
  /* Number of ranks. 0: one per GPU; with no GPU, one per NUMA node with
   * memory. With gpus non-NULL it is the length of gpus and must be > 0.
   * More ranks than GPUs: rank i uses GPU i mod ngpus (said in a note). */
  int nranks;
  /* NULL, or nranks GPU indexes: rank i uses GPU gpus[i]; -1 means "no GPU"
   * (the rank is placed round-robin over the NUMA nodes). A GPU may appear
   * more than once. Copied; the caller keeps ownership. */
  const int *gpus;
  /* Copy threads per rank, i.e. PUs wanted per rank. 0: the default (2). */
  int threads_per_rank;
  /* enum umbp_topo_mempolicy; 0 = auto. */
  int mempolicy;
} umbp_topo_plan_opts;

#define UMBP_TOPO_PLAN_OPTS_INIT {0, NULL, 0, UMBP_TOPO_MEM_AUTO}

/*
 * Make a plan for opts (NULL: all defaults) on topo.
 *
 * Per rank: the partition node is the GPU's local node (the least-loaded one
 * when the GPU is local to several); ranks without a GPU, or whose GPU hwloc
 * cannot place, go round-robin over the NUMA nodes with memory. Copy-thread
 * PUs are chosen among the PUs local to both the GPU and that node: the free
 * cores are split into one contiguous slice per rank that shares them, and
 * each rank takes one PU per core of its slice before hyperthread siblings;
 * only when PUs run out does a rank share PUs with another, and then its
 * shared_cpus flag is set and a note names the ranks it shares with.
 *
 * Returns 0 and *ret_plan (free with umbp_topo_plan_free), or:
 *   -EINVAL  topo or ret_plan NULL; nranks < 0 or > UMBP_TOPO_MAX_RANKS;
 *            gpus given with nranks 0; a gpus entry < -1 or naming a GPU the
 *            topology does not have; threads_per_rank < 0 or too large; an
 *            unknown mempolicy;
 *   -ENOMEM  out of memory.
 * Any thread. The plan takes a reference on topo.
 */
UMBP_API int umbp_topo_plan_make(umbp_topo *topo, const umbp_topo_plan_opts *opts,
                                 umbp_topo_plan **ret_plan);

/* Free a plan (and its reference on the topology). NULL is accepted. */
UMBP_API void umbp_topo_plan_free(umbp_topo_plan *plan);

/* The topology the plan was made from (borrowed; valid while the plan is). */
UMBP_API const umbp_topo *umbp_topo_plan_topo(const umbp_topo_plan *plan);

/* One rank of a plan. */
typedef struct umbp_topo_rank_info {
  int rank;
  int gpu;              /* GPU index, or -1 */
  unsigned numa_node;   /* OS index of the node the rank's pool partition lives on */
  bool gpu_local;       /* numa_node is local to the GPU (false without GPU/locality) */
  int mempolicy;        /* resolved: never UMBP_TOPO_MEM_AUTO */
  int ncpus;            /* PUs for copy threads (can be < threads_per_rank when
                           fewer PUs exist; never 0) */
  bool shared_cpus;     /* some of those PUs are also another rank's */
  int nmem_nodes;       /* nodes the memory policy names (0 for "default") */
  int nnotes;
} umbp_topo_rank_info;

/* Returns the number of ranks, or -EINVAL. Any thread. */
UMBP_API int umbp_topo_plan_nranks(const umbp_topo_plan *plan);
/* Copy threads per rank the plan was made for (the default resolved). */
UMBP_API int umbp_topo_plan_threads_per_rank(const umbp_topo_plan *plan);
/* Describe rank: 0 and *ret_info (a copy the caller owns), or -EINVAL (NULL
 * plan or ret_info, rank out of range). Any thread; the plan is immutable. */
UMBP_API int umbp_topo_plan_rank(const umbp_topo_plan *plan, int rank, umbp_topo_rank_info *ret_info);
/* The rank's copy-thread PUs (OS indexes), in the order threads should take
 * them: physical cores first. Returns the count. */
UMBP_API int umbp_topo_plan_rank_cpus(const umbp_topo_plan *plan, int rank, unsigned *out, int max);
/* The nodes the rank's memory policy names, ascending. Returns the count. */
UMBP_API int umbp_topo_plan_rank_mem_nodes(const umbp_topo_plan *plan, int rank, unsigned *out,
                                           int max);
/* The rank's notes (why this GPU, node, PUs, policy). NULL when out of range.
 * Owned by the plan. */
UMBP_API const char *umbp_topo_plan_rank_note(const umbp_topo_plan *plan, int rank, int i);

/* Plan-level notes: defaults taken and fallbacks (no GPU, one NUMA node, a
 * GPU hwloc cannot place, GPUs shared by ranks, scarce cores). */
/* Number of plan-level notes (>= 0), or -EINVAL for a NULL plan. */
UMBP_API int umbp_topo_plan_note_count(const umbp_topo_plan *plan);
/* Plan note i, owned by the plan (valid until it is freed); NULL when plan is
 * NULL or i is out of range (sets no error). */
UMBP_API const char *umbp_topo_plan_note(const umbp_topo_plan *plan, int i);

/* The NUMA nodes the plan's pool partitions live on, ascending and without
 * repeats: what `umbp pool create --numa-nodes auto` uses. Returns the count
 * (>= 1 for any plan). */
UMBP_API int umbp_topo_plan_numa_nodes(const umbp_topo_plan *plan, unsigned *out, int max);

/* ---------------------------------------------------------------------------
 * Applying
 * ------------------------------------------------------------------------- */

enum umbp_topo_apply_flags {
  /* Also set the calling thread's memory binding to the rank's policy and
   * nodes (hwloc_set_membind, HWLOC_MEMBIND_THREAD). Policy "default" leaves
   * it alone. */
  UMBP_TOPO_APPLY_MEMBIND = 1u << 0,
};

/*
 * Bind the calling thread to rank's PUs (hwloc_set_cpubind with
 * HWLOC_CPUBIND_THREAD). thread < 0: to all of the rank's PUs; thread >= 0:
 * to the single PU cpus[thread % ncpus], the usual choice for copy thread
 * number `thread`.
 *
 * ret_desc (may be NULL) receives, on success only, a sentence saying what
 * was applied, as the kernel reports it afterwards ("rank 0 thread 1: bound
 * to PU 8 ..."); desc_len bytes at most, always NUL-terminated.
 *
 * Returns 0, or:
 *   -EINVAL  bad plan, rank, or the plan was made from an XML topology (it
 *            describes some other machine: make the plan from
 *            umbp_topo_load(NULL, ...));
 *   -ENOSYS  this system cannot bind threads (hwloc reports no support);
 *   -EPERM, -EXDEV, ... from the kernel (e.g. the PUs are outside this
 *            process's cgroup).
 * Must be called by the thread to bind. Changes only that thread.
 */
UMBP_API int umbp_topo_apply_thread(const umbp_topo_plan *plan, int rank, int thread, unsigned flags,
                                    char *ret_desc, size_t desc_len);

#ifdef __cplusplus
}
#endif
#endif
