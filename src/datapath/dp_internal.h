/* SPDX-License-Identifier: Apache-2.0 */
/* Internal state of the data path (process-local, never in shared memory). */
#ifndef UMBP_DP_INTERNAL_H
#define UMBP_DP_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "common/common.h"
#include "umbp/datapath.h"

/* Limits and defaults of umbp_dp_opts (datapath.h says them to callers). */
#define DP_THREADS_DEFAULT 2        /* host copy threads for threads 0 */
#define DP_THREADS_MAX 256
#define DP_CUDA_STREAMS_DEFAULT 2   /* CUDA streams per device for cuda_streams 0 */
#define DP_KERNEL_CTAS_DEFAULT 16   /* CTAs per copy-kernel launch for cuda_kernel_ctas 0 */
#define DP_KERNEL_CTAS_MAX 1024

struct dp_region {
  char *base;
  uint64_t block_bytes, stride;
  uint32_t block_count;
  int device, device_id;
  uint16_t group;
  uint32_t layer;
  int kind;
  unsigned orig;     /* index in the caller's array */
  uint64_t obj_off;  /* offset inside the block object */
};

struct dp_group {
  uint16_t group;
  unsigned first, count; /* regions[first .. first+count) in object order */
  uint64_t obj_bytes;
  uint32_t blocks;       /* min block_count */
  bool cuda;
  int device_id;
};

struct umbp_kv_layout {
  umbp_pool *pool;
  unsigned n;
  struct dp_region *r;   /* sorted by (group, layer, kind, orig) */
  unsigned ngroups;
  struct dp_group *g;
};

enum { DP_OP_STORE = 0, DP_OP_LOAD = 1, DP_OP_PULL = 2 };
enum { DP_JOB_QUEUED = 0, DP_JOB_RUNNING = 1, DP_JOB_DONE = 2 };

struct dp_task {
  struct dp_task *next;
  struct umbp_dp_job *job;
  unsigned i0, i1;       /* key indexes [i0, i1) */
};

struct umbp_dp_job {
  umbp_dp_engine *eng;
  const umbp_kv_layout *lay;
  const struct dp_group *grp;
  int op;
  unsigned n;
  uint32_t *blocks;      /* block ids (pull: destination blocks) */
  uint32_t *src_blocks;  /* pull only */
  unsigned src_rank;     /* pull only */
  umbp_key *keys;        /* store/load */
  uint32_t *slots;       /* reserved (store) or pinned (load) slot, UMBP_NO_SLOT */
  int *rc;
  char **msg;            /* per-key messages, NULL until the first */
  unsigned duplicates;
  int status;
  bool defer_publish;    /* store: UMBP_DP_STORE_DEFER_PUBLISH */
  bool held;             /* deferred store done: slots[] of copied keys still reserved (job_free aborts) */
  umbp_pool *pool;       /* for job_free's aborts: the engine may be gone by then */
  uint64_t pool_serial;  /* pool->attach_serial: job_free aborts only while that attach lasts */
  /* Done pairs: release store in dp_job_finish, acquire load in poll. */
  _Atomic int state;
  _Atomic unsigned refs; /* caller + engine (until done) */
  _Atomic unsigned tasks_left;
  _Atomic bool finalizing; /* CUDA: one poller finalises */
  unsigned ntasks;
  struct dp_task *tasks;
  void *cuda;            /* CUDA backend's per-job state */
  struct umbp_dp_job *next_live, *prev_live; /* engine's not-done list (eng->mu) */
  pid_t pid;             /* eng->pid, readable once the engine is freed (fork() checks) */
};

struct umbp_dp_engine {
  umbp_pool *pool;
  pthread_mutex_t mu;
  pthread_cond_t work_cv;  /* tasks queued or stopping */
  pthread_cond_t done_cv;  /* some job became done */
  pthread_t *threads;
  unsigned nthreads;
  struct dp_task *head, *tail;
  bool stopping;
  struct umbp_dp_job *live; /* jobs not done */
  _Atomic unsigned test_delay_us; /* test hook: sleep per block in host copies */
  void *cuda;               /* CUDA backend's engine state */
  pid_t pid;                /* creating process: a fork() child's copy has no copy threads */
  /* Threads inside umbp_dp_job_wait/cancel on a job of this engine that was
   * not done when they entered (dp_users_mu in dp_engine.c): destroy frees
   * the engine only at 0, since they lock eng->mu after the job's end. */
  unsigned users;
};

/* Finish a job whose copies have all stopped: publish/abort slots, drop pins,
 * mark it done, drop the engine's reference. Any thread, once per job. */
void dp_job_finish(struct umbp_dp_job *job);
/* Record key i's failure (code < 0) with an optional message. */
void dp_job_fail_key(struct umbp_dp_job *job, unsigned i, int code, const char *msg);

/* Test hook: every host copy of a block sleeps us microseconds first. */
void umbp_dp__test_set_delay(umbp_dp_engine *eng, unsigned us);
/* Test hook: umbp_dp_job_wait sleeps us microseconds before each lock of
 * eng->mu (a waiter preempted there while the job ends and the engine is
 * destroyed). Process-wide. */
void umbp_dp__test_set_wait_pause(unsigned us);
/* Number of jobs the engine still owns (not done). */
unsigned umbp_dp__test_live_jobs(umbp_dp_engine *eng);

/* ---- CUDA backend (dp_cuda.c when built with cudart, else dp_nocuda.c) --- */
/* > 0 devices, -ENODEV (runtime has none), -ENOSYS (not built). */
int dp_cuda_probe(char *why, size_t n);
int dp_cuda_engine_init(umbp_dp_engine *eng, const umbp_dp_opts *opts);
void dp_cuda_engine_fini(umbp_dp_engine *eng);
/* Issue the copies of job (keys with rc != 0 are skipped). 0, or -errno when
 * nothing was issued (every key then has a result). */
int dp_cuda_submit(struct umbp_dp_job *job);
/* 1 when every copy of job stopped (per-key errors recorded), 0 otherwise. */
int dp_cuda_progress(struct umbp_dp_job *job);
void dp_cuda_job_free(struct umbp_dp_job *job);
int dp_cuda_registration(umbp_dp_engine *eng, uint64_t *ret_done, uint64_t *ret_total);
int dp_cuda_ipc_export(umbp_dp_engine *eng, const umbp_kv_layout *lay, unsigned rank);
/* Process-wide counts of copy issues: chunks sent as one cudaMemcpyBatchAsync,
 * ranges sent one cudaMemcpyAsync each (the fallback), copy-kernel launches.
 * For benchmarks and tests. */
void dp_cuda_copy_calls(uint64_t *ret_batches, uint64_t *ret_ranges, uint64_t *ret_kernels);
/* ---- IPC export table (dp_ipc.c; integers only, no CUDA needed) --------- */
#define DP_IPC_HANDLE_BYTES 64
struct dp_ipc_desc {          /* one exported region */
  uint32_t rank, region;      /* region: position in the group's object order */
  uint16_t group;
  int32_t device_id;
  uint32_t layer;
  int32_t kind;
  uint64_t block_bytes, stride;
  uint32_t block_count, n_regions; /* n_regions of that group */
  /* The region's base minus the base of the allocation the handle names
   * (cudaIpcOpenMemHandle maps the whole allocation and returns its base). */
  uint64_t alloc_off;
  uint8_t handle[DP_IPC_HANDLE_BYTES];
  /* filled by lookups: */
  uint32_t proc_slot;
  uint64_t incarnation;
};
/* Replace this process's entries for rank with descs[0..n). */
int dp_ipc_publish(umbp_pool *pool, unsigned rank, const struct dp_ipc_desc *descs, unsigned n);
int dp_ipc_withdraw(umbp_pool *pool, unsigned rank);
/* Live entries of (rank, group) in region order into out[0..max); returns the
 * count found (>= 0); entries of dead or restarted exporters are skipped. */
int dp_ipc_find(umbp_pool *pool, unsigned rank, uint16_t group, struct dp_ipc_desc *out, unsigned max);

/* Per-engine cache of opened handles: a cds_lfht (memb flavour) keyed by
 * (exporter slot, incarnation, rank, group, region). */
struct dp_ipc_cache;
typedef int (*dp_ipc_open_fn)(void *arg, const struct dp_ipc_desc *d, void **ret_ptr);
typedef void (*dp_ipc_close_fn)(void *arg, void *ptr);
int dp_ipc_cache_new(dp_ipc_open_fn open, dp_ipc_close_fn close, void *arg, struct dp_ipc_cache **ret);
void dp_ipc_cache_free(struct dp_ipc_cache *c);
/* Opened pointer of d (opening it on first use). */
int dp_ipc_cache_get(struct dp_ipc_cache *c, const struct dp_ipc_desc *d, void **ret_ptr);
/* Close and forget entries of exporters that are no longer live. */
unsigned dp_ipc_cache_prune(struct dp_ipc_cache *c, umbp_pool *pool);
unsigned dp_ipc_cache_size(struct dp_ipc_cache *c);

#endif
