/* SPDX-License-Identifier: Apache-2.0 */
/*
 * umbp/datapath.h — move KV-cache block bytes between a worker's tensors and
 * the pool.
 *
 * Design note.
 *
 * Layout. A worker's KV cache is a set of regions (umbp_kv_region): one per
 * layer, or one per layer and per K/V when K and V are separate tensors. A
 * region is `block_count` blocks of `block_bytes` bytes, block b starting at
 * base + b * stride, on the host or on one CUDA device. Regions carry a KV
 * group id (umbp_key.group): a block object in the pool is the concatenation
 * of one block's bytes over every region of its group, ordered by (layer,
 * kind K before V before KV, position in the array given). Its size must not
 * exceed the pool's slot size; umbp_kv_layout_create() refuses a layout
 * whose block object is larger, naming both sizes.
 *
 * Jobs. umbp_dp_store() reserves slots on a partition (umbp_reserve_bulk),
 * then copies asynchronously: each block is gathered from the regions into
 * its slot, then published (umbp_publish_bulk). umbp_dp_load() pins the keys
 * (umbp_lookup_pin_bulk) then scatters each slot into the regions and unpins.
 * Reservation and pinning happen in the submitting thread, so "no slot" and
 * "no such key" are known when the call returns (they are per-key results,
 * not call failures). A job is a handle the caller polls, waits on with a
 * timeout, cancels while still queued, reads per-key results from, and
 * finally releases. Jobs finish in any order.
 *
 * Ownership. A job owns copies of the arrays it was given, its reserved
 * slots and its pins until its copies have stopped; a timeout or the
 * caller's umbp_dp_job_release() never frees them early — the engine keeps
 * a job it still copies for, and releases slots and pins only after its
 * last copy returned. The caller's KV regions must stay valid until a job
 * that uses them is done (umbp_dp_job_poll() returns 0) or the engine has
 * been destroyed (destroy waits for every copy).
 *
 * Results. A store key's result is 0 (published, or already present: another
 * writer stored the same key first, or UMBP_DP_STORE_SKIP_PRESENT found it),
 * -ENOSPC (no slot could be reserved), -ECANCELED, -EIO (a CUDA error; its
 * text is umbp_dp_job_message()). A key that fails is never published: its
 * slot is aborted. A load key's result is 0, -ENOENT (not in the pool),
 * -ECANCELED or -EIO; umbp_dp_job_failed_blocks() names the block ids that
 * were not filled.
 *
 * Backends. The host backend copies with memcpy on a pool of worker threads
 * (optionally bound to a CPU list), splitting each job's blocks into one
 * contiguous range per thread. The CUDA backend (built when cudart was found
 * at build time, used when a device is present at run time) serves layouts
 * whose regions are on a CUDA device: it registers the pool mapping with
 * cudaHostRegister in a background thread, then copies on its own streams,
 * by a gather/scatter kernel that reads and writes slots through the
 * registered mapping or by the copy engines (cudaMemcpyBatchAsync), as
 * umbp_dp_opts.cuda_copy says, and completes jobs through CUDA events, which
 * poll/wait query.
 * umbp_dp_backends() says which backends this process can use and why not.
 *
 * CUDA IPC. umbp_dp_ipc_export() publishes cudaIpcMemHandles of a layout's
 * CUDA regions for one rank into a small POSIX shm object "/umbp.<pool>.ipc"
 * (the pool segment has no room for it); each entry names the exporter's
 * registry slot and incarnation, so entries of a dead or restarted exporter
 * are recognised as stale. umbp_dp_ipc_pull() opens (and caches, per engine,
 * in a liburcu hash table) another rank's handles and copies blocks device to
 * device: with replicated KV (MLA: every TP rank holds the same bytes) one
 * rank stores a block once and the others load it from the pool or pull it.
 *
 * Threads. An engine may be used by any number of threads of its process at
 * once; a job handle by any thread, but umbp_dp_job_release() must be the
 * last call on it. Nothing here is shared between processes except the pool
 * (through umbp/index.h) and the IPC export table.
 *
 * fork(). A child's copy of an engine has none of its threads: submissions,
 * umbp_dp_job_wait() on a job not done and umbp_dp_job_cancel() return
 * -ECHILD there, poll reports what the child saw at the fork, and
 * umbp_dp_engine_destroy() returns at once (the parent's engine runs on).
 * A child attaches the pool and creates an engine of its own.
 */
#ifndef UMBP_DATAPATH_H
#define UMBP_DATAPATH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "umbp/index.h"
#include "umbp/pool.h"
#include "umbp/common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- backends ------------------------------------------------------------- */
enum umbp_dp_backend {
  UMBP_DP_BACKEND_HOST = 1u << 0, /* always */
  UMBP_DP_BACKEND_CUDA = 1u << 1, /* built with cudart and a device is present */
};

/* Bitmask of usable backends for this process. When why is non-NULL, a
 * sentence on the CUDA backend goes there ("CUDA backend: not built (cudart
 * was not found at build time)", "... cudaGetDeviceCount: no CUDA-capable
 * device is detected", "CUDA backend: 2 devices"). Any thread; the first call
 * initialises the CUDA runtime in a CUDA build (which then does not survive
 * fork()). */
UMBP_API unsigned umbp_dp_backends(char *why, size_t why_len);

/* Counts, over this process's life, of the copy issues of the CUDA backend:
 * chunks sent as one cudaMemcpyBatchAsync (*ret_batches), ranges sent one
 * cudaMemcpyAsync each, the fallback (*ret_ranges), and copy-kernel launches
 * (*ret_kernels); all 0 without a CUDA backend. Relaxed loads: a snapshot
 * while copies run. For benchmarks (`umbp bench copy` reports them) and
 * tests. A NULL pointer is skipped. Any thread. */
UMBP_API void umbp_dp_cuda_copy_calls(uint64_t *ret_batches, uint64_t *ret_ranges, uint64_t *ret_kernels);

/* ---- layout --------------------------------------------------------------- */
enum umbp_kv_kind { UMBP_KV_K = 0, UMBP_KV_V = 1, UMBP_KV_KV = 2 /* K and V in one tensor */ };
enum umbp_dp_device { UMBP_DP_CPU = 0, UMBP_DP_CUDA = 1 };

typedef struct umbp_kv_region {
  void *base;            /* block 0 of this region (host or device address) */
  uint64_t block_bytes;  /* bytes of one block in this region (> 0) */
  uint64_t stride;       /* bytes from block b to b+1 (>= block_bytes) */
  uint32_t block_count;  /* blocks in this region (> 0) */
  int device;            /* enum umbp_dp_device */
  int device_id;         /* CUDA device ordinal (cuda:N); ignored for CPU */
  uint16_t group;        /* KV group (umbp_key.group) */
  uint32_t layer;        /* layer number: the block object's primary order */
  int kind;              /* enum umbp_kv_kind: secondary order */
} umbp_kv_region;

typedef struct umbp_kv_layout umbp_kv_layout;

/* Describe a worker's KV cache for pool `pool`. Copies the array. Returns 0
 * and *ret_layout, or -EINVAL: n == 0, a region with NULL base, zero sizes,
 * stride < block_bytes, blocks that run past the end of the address space
 * (base + (block_count - 1) * stride + block_bytes), a CPU region overlapping
 * the pool's own mapping, an unknown device or kind, a group mixing CPU and
 * CUDA regions or several CUDA devices, or a group whose block object is
 * larger than umbp_slot_size(pool) (the message names both sizes); -ENOMEM.
 * Any thread. The layout may be shared by threads and engines of this
 * process; free it after the last job that uses it is done. */
UMBP_API int umbp_kv_layout_create(umbp_pool *pool, const umbp_kv_region *regions, unsigned n,
                                   umbp_kv_layout **ret_layout);
/* Free a layout. Accepts NULL. Only after the last job that uses it has
 * completed; the regions' memory stays the caller's. */
UMBP_API void umbp_kv_layout_free(umbp_kv_layout *layout);
/* Bytes of group's block object (the sum of its regions' block_bytes), 0 if
 * the layout has no such group. */
UMBP_API uint64_t umbp_kv_layout_object_bytes(const umbp_kv_layout *layout, uint16_t group);
/* Blocks addressable in group (the smallest block_count of its regions). */
UMBP_API uint32_t umbp_kv_layout_blocks(const umbp_kv_layout *layout, uint16_t group);
/* Offset of region i (index in the array given to create) inside its block
 * object, or UINT64_MAX for a bad index. */
UMBP_API uint64_t umbp_kv_layout_region_offset(const umbp_kv_layout *layout, unsigned i);

/* ---- engine --------------------------------------------------------------- */
typedef struct umbp_dp_engine umbp_dp_engine;

typedef struct umbp_dp_opts {
  unsigned threads;        /* host copy threads; 0: 2 */
  const unsigned *cpus;    /* CPU (OS index) list: thread i is bound to
                              cpus[i % n_cpus]; NULL: not bound. A rank's list
                              comes from umbp_topo_plan_rank_cpus(). */
  unsigned n_cpus;
  unsigned cuda_streams;   /* CUDA streams per device; 0: 2 */
  bool cuda_register;      /* cudaHostRegister the pool mapping (default true) */
  umbp_progress_fn progress; /* registration progress ("cuda-register"); may be NULL */
  void *progress_arg;
  int cuda_copy;           /* enum umbp_dp_cuda_copy; default UMBP_DP_CUDA_COPY_AUTO */
  unsigned cuda_kernel_ctas; /* CTAs (of 256 threads) per copy-kernel launch, 1..1024; 0: 16.
                              Fewer leave more of the GPU to the model's kernels. */
} umbp_dp_opts;

/* How the CUDA backend moves bytes between device memory and pool slots, and
 * between ranks (IPC pulls). */
enum umbp_dp_cuda_copy {
  /* Loads and pulls (a request waits for them) through the copy kernel when
   * their ranges (one per block and region) average under
   * UMBP_DP_KERNEL_AUTO_MAX bytes; stores (nobody waits) and larger ranges
   * through the copy engines, which leave the SMs to the model: the kernel's
   * device->host writes slow a concurrent HBM-streaming kernel far more than
   * the copy engines do (docs/datapath.md, "Measured on a GPU"). */
  UMBP_DP_CUDA_COPY_AUTO = 0,
  /* Copy engines only: cudaMemcpyBatchAsync (one call per stream chunk), or
   * one cudaMemcpyAsync per range. Uses no SM time. */
  UMBP_DP_CUDA_COPY_DMA = 1,
  /* The copy kernel for every store, load and pull: cuda_kernel_ctas CTAs per
   * launch stride over the (block, region) ranges, moving 16-byte words
   * between device memory and the pool's registered mapping (or the other
   * rank's memory). Uses that many CTAs' share of the SMs while it runs (the
   * model's kernels share them). */
  UMBP_DP_CUDA_COPY_KERNEL = 2,
};
/* In every mode the kernel is used only on a device that can address
 * registered host memory at its host address, in a build that has the kernel
 * (nvcc at build time) for that device, and for stores and loads only once
 * the pool's registration is done (umbp_dp_cuda_registration() == 0);
 * otherwise the copy engines run. */
#define UMBP_DP_KERNEL_AUTO_MAX (256u << 10)

/* Fill defaults: 2 host threads not bound, 2 CUDA streams, cuda_register
 * true, UMBP_DP_CUDA_COPY_AUTO, 16 kernel CTAs (0 means 16). Never fails;
 * a NULL o is ignored. */
UMBP_API void umbp_dp_opts_init(umbp_dp_opts *o);

/* Start an engine on an attached read-write pool: its host threads and, when
 * the CUDA backend is usable and opts->cuda_register, the background
 * registration of the pool mapping (once per process and mapping, shared by
 * engines). Returns 0 and *ret_engine, or -EINVAL (bad opts, read-only pool,
 * a CPU outside the allowed set: pthread_setaffinity_np refused it), -ENOMEM,
 * -EAGAIN (no thread), -ECHILD (a pool handle inherited through fork()).
 * Any thread. */
UMBP_API int umbp_dp_engine_create(umbp_pool *pool, const umbp_dp_opts *opts,
                                   umbp_dp_engine **ret_engine);
/* Wait for every job's copies to stop (queued jobs are cancelled), and for
 * other threads inside umbp_dp_job_wait/cancel on its jobs to return (within
 * a 20 ms wait step once the jobs are done), stop the
 * threads, free jobs the caller already released, unregister the pool
 * mapping when this was its last engine. Jobs not yet released stay valid
 * for poll/results/release. Accepts NULL. Destroy engines before detaching
 * their pool. In a fork() child it returns at once (see fork() above). */
UMBP_API void umbp_dp_engine_destroy(umbp_dp_engine *eng);

/* State of the pool's CUDA registration: 0 done, -EINPROGRESS (done/total
 * bytes so far in *ret_done, *ret_total when non-NULL), -ENODEV (CUDA backend
 * not usable), -ENOSYS (not built with CUDA), or the registration's error
 * (message in umbp_last_error()). Any thread. */
UMBP_API int umbp_dp_cuda_registration(umbp_dp_engine *eng, uint64_t *ret_done, uint64_t *ret_total);

/* ---- jobs ----------------------------------------------------------------- */
typedef struct umbp_dp_job umbp_dp_job;

enum umbp_dp_store_flags {
  /* Do not copy keys that the pool holds already (umbp_contains); they get
   * result 0 and count as duplicates. */
  UMBP_DP_STORE_SKIP_PRESENT = 1u << 0,
  /* Copy but do not publish: when the job is done, the slots of the keys
   * whose copy succeeded (result 0) stay reserved by this process, invisible
   * to lookups, until umbp_dp_job_publish() publishes them; a job released
   * without that gives them back (aborted) when it is freed. For callers
   * whose contract makes a store visible only at a later commit (vLLM's
   * in-tree UMBP connector: publish after the step's store succeeded). */
  UMBP_DP_STORE_DEFER_PUBLISH = 1u << 1,
};

/* Store blocks block_ids[i] of `group` under keys[i] (i < n), reserving on
 * partition `part` (-1: the one with most free slots). Returns 0 and *ret_job
 * (the job may already have failed keys: see results), or -EINVAL (bad
 * arguments: n == 0, group not in layout, block id out of range, layout of
 * another pool, flags unknown, a key whose hash_len is not 1..32), -ENODEV / -ENOSYS (the layout's group is on
 * CUDA and that backend is not usable / not built), -ENOMEM, -ESHUTDOWN
 * (engine being destroyed), -ECHILD (engine inherited through fork()). Any
 * thread. */
UMBP_API int umbp_dp_store(umbp_dp_engine *eng, const umbp_kv_layout *layout, uint16_t group,
                           int part, unsigned n, const uint32_t *block_ids, const umbp_key *keys,
                           unsigned flags, umbp_dp_job **ret_job);
/* Load keys[i] into block block_ids[i] of `group`. Errors as for store. */
UMBP_API int umbp_dp_load(umbp_dp_engine *eng, const umbp_kv_layout *layout, uint16_t group,
                          unsigned n, const umbp_key *keys, const uint32_t *block_ids,
                          umbp_dp_job **ret_job);

/* 0 when the job is done (every copy stopped, slots published or aborted,
 * pins dropped), -EINPROGRESS otherwise. Never blocks. Any thread. A 0 pairs
 * (acquire) with the completion of every copy: the region or slot bytes are
 * visible to the caller. */
UMBP_API int umbp_dp_job_poll(umbp_dp_job *job);
/* Wait up to timeout_ms (UINT32_MAX: forever): 0 done, -ETIMEDOUT, -ECHILD
 * (not done, and its engine was inherited through fork()). A
 * timeout leaves the job running and owned by the engine. A host job's
 * waiter with at least 1 s left copies the job's blocks that no copy thread
 * has started yet itself, in its own thread, rather than sleep (a copy thread
 * on a busy machine can get a core milliseconds after it is woken); such a
 * copy is not interrupted, so the wait can then end later than timeout_ms by
 * the time of that copy. */
UMBP_API int umbp_dp_job_wait(umbp_dp_job *job, uint32_t timeout_ms);
/* Cancel a job none of whose copies has started: 0 (every key gets
 * -ECANCELED, slots aborted, pins dropped, the job is done), -EBUSY (copies
 * started; the job runs to its end), -EALREADY (done), -ECHILD (its engine
 * was inherited through fork()). */
UMBP_API int umbp_dp_job_cancel(umbp_dp_job *job);
/* After done: 0 when every key succeeded, else the first failing key's code.
 * -EINPROGRESS before. */
UMBP_API int umbp_dp_job_status(const umbp_dp_job *job);
/* After done: per-key results into rc[0..min(n, keys)); returns the number of
 * keys that failed (>= 0), or -EINPROGRESS. */
UMBP_API int umbp_dp_job_results(const umbp_dp_job *job, int *rc, unsigned n);
/* After done: the message of key i's failure ("" when it succeeded or the
 * code says it all; a CUDA error carries cudaGetErrorString). Owned by the
 * job. */
UMBP_API const char *umbp_dp_job_message(const umbp_dp_job *job, unsigned i);
/* After done: block ids of a load whose keys failed (or of a store), in key
 * order, into out[0..max); returns the full count, or -EINPROGRESS. */
UMBP_API int umbp_dp_job_failed_blocks(const umbp_dp_job *job, uint32_t *out, unsigned max);
/* Store keys that another writer had stored first (counted as success). */
UMBP_API unsigned umbp_dp_job_duplicates(const umbp_dp_job *job);
/* Publish a done store submitted with UMBP_DP_STORE_DEFER_PUBLISH: every
 * key whose copy succeeded, in one umbp_publish_bulk (a key another writer
 * published first counts as success and its slot goes back). Then per-key
 * results into rc[0..min(n, keys)) as umbp_dp_job_results. Returns the
 * number of failed keys (>= 0), -EINPROGRESS (not done), -EINVAL (NULL, not a
 * deferred store, or its pool handle was detached: the detach gave its slots
 * back and nothing is published), -ENOMEM. A second call publishes nothing more. The calling
 * thread's process must still have the pool attached; any thread, but not
 * concurrently with release. Release pairs: the slot bytes copied by the
 * job are visible to every process that finds a key (umbp_publish). */
UMBP_API int umbp_dp_job_publish(umbp_dp_job *job, int *rc, unsigned n);
/* Drop the caller's handle. Allowed at any time: a job still copying stays
 * owned by the engine and is freed when its copies stopped. Also after the
 * engine was destroyed and the pool detached: a deferred store's unpublished
 * slots go back here while the pool handle is attached, and were given back
 * by umbp_pool_detach() otherwise. Accepts NULL. */
UMBP_API void umbp_dp_job_release(umbp_dp_job *job);
/* Job handles of this process not freed yet, over all its engines: a job is
 * freed once the caller released it and its copies stopped (at its end, or
 * in umbp_dp_engine_destroy). A caller that released every job it got and
 * destroyed its engines is back at the count it saw before it started: a
 * leak check for callers and tests (the Python connectors' shutdown is tested
 * with it). Relaxed load: a snapshot, ordering nothing. Any thread. */
UMBP_API uint64_t umbp_dp_job_count(void);

/* ---- CUDA IPC ------------------------------------------------------------- */
/* Export the CUDA regions of `layout` as rank `rank` (0..65535) of this
 * process's registry slot into "/umbp.<pool>.ipc" (created on first use),
 * replacing this process's previous export of that rank. Each region's base
 * may lie anywhere inside a device allocation made by cudaMalloc (a slice of
 * a framework's caching-allocator block, K or V half of one tensor): the
 * entry records its offset from the allocation's base, since a handle names
 * the whole allocation. Memory from cuMemCreate (virtual memory management,
 * e.g. PyTorch's expandable segments) has no legacy IPC handle: -EIO. 0, -EINVAL (no CUDA region), -ENOSPC
 * (table full), -ESTALE (table left by an earlier pool of the same name:
 * remove it with umbp_dp_ipc_unlink), -ENOSYS/-ENODEV (no CUDA backend), -EIO
 * (CUDA error, message says which). Any thread. */
UMBP_API int umbp_dp_ipc_export(umbp_dp_engine *eng, const umbp_kv_layout *layout, unsigned rank);
/* Withdraw this process's entries for rank (UINT32_MAX: all). Entries of a
 * dead process are ignored by readers and reused by exporters anyway. */
UMBP_API int umbp_dp_ipc_withdraw(umbp_dp_engine *eng, unsigned rank);
/* Copy blocks src_blocks[i] of group from the regions rank `src_rank`
 * exported into blocks dst_blocks[i] of the local layout, device to device.
 * The exported group's regions must match the local ones (same count and
 * block_bytes in block-object order). Returns 0 and a job (per-key results
 * indexed by i: -EIO with the CUDA error, -ENOENT when the exporter died),
 * -ENOENT (no live export of src_rank), -EINVAL, -ENOSYS/-ENODEV. */
UMBP_API int umbp_dp_ipc_pull(umbp_dp_engine *eng, const umbp_kv_layout *layout, uint16_t group,
                              unsigned src_rank, unsigned n, const uint32_t *src_blocks,
                              const uint32_t *dst_blocks, umbp_dp_job **ret_job);
/* Remove pool_name's IPC export table. 0 or -ENOENT. */
UMBP_API int umbp_dp_ipc_unlink(const char *pool_name);

#ifdef __cplusplus
}
#endif
#endif
