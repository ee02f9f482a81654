/* SPDX-License-Identifier: Apache-2.0 */
/*
 * umbp bench copy — store and load GB/s of the data path beside plain memcpy
 * (host backend) or cudaMemcpy of pinned buffers (--cuda), same bytes, same
 * thread count, same run.
 *
 * Per case (OBJxR: block objects of OBJ bytes built from R regions, i.e.
 * R/2 layers x K,V): a pool of ceil(--bytes / OBJ) slots of OBJ bytes, and R
 * host regions of that many blocks (region bytes per block = OBJ/R rounded
 * down to 64, the last region takes the rest). Each repetition times, in
 * this order: one store job of every block (fresh keys; the keys are
 * cleared and their slots reclaimed, untimed, before the next store), the
 * reference copying the same bytes from one contiguous buffer into the same
 * slots (each thread one memcpy per block object over its share of the
 * blocks), one load job of every block, and the reference in the other
 * direction. Figures are medians over the repetitions.
 */
#include <errno.h>
#include <getopt.h>
#include <pthread.h>
#include <sched.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <poll.h>
#include <signal.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli.h"
#include "pool_fault.h"
#include "cli_config.h" /* UMBP_HAVE_CUDA */
#include "umbp/admin.h"
#include "umbp/datapath.h"
#include "umbp/index.h"
#include "umbp/pool.h"

#define JOB_WAIT_MS 600000         /* a store or load job of a case: 10 minutes, then it is a failure */
#define EXPORTER_READY_MS 60000    /* --pull: the exporting process's "ready" line */
#define RECLAIM_TRIES 1000         /* between repetitions: the cleared slots back on the free ring, */
#define RECLAIM_POLL_US 100        /* looked for every 100 us, 0.1 s at most */
#define REGISTRATION_POLL_US 1000  /* --cuda: how often the pool's host registration is looked at */

#if UMBP_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

int bench_copy_main(int argc, char **argv);

static const char *const copy_names[] = {"auto", "dma", "kernel"};
static int cuda_copy = UMBP_DP_CUDA_COPY_AUTO; /* --cuda-copy */
static unsigned cuda_ctas;                     /* --cuda-ctas (0: the library's default) */
static bool victim_on;                         /* --victim */
static bool pull_on;                           /* --pull */

static double median(double *v, unsigned n);
struct bcase;
static int parse_case(const char *s, struct bcase *c);

#if UMBP_HAVE_BENCH_VICTIM
/* The victim: VICTIM_LAUNCHES launches of a kernel that streams a 1 GiB
 * device buffer from HBM (bench_victim.cu), on its own stream, timed with
 * events, alone and while a store or load job's copies run. */
cudaError_t bench_victim_launch(const void *buf, size_t bytes, float *out, cudaStream_t s);
#define VICTIM_BYTES (1ull << 30)
#define VICTIM_LAUNCHES 8
struct victim {
  void *buf;
  float *out;
  cudaStream_t s;
  cudaEvent_t a, b;
  double alone_ms;
};

static int victim_start(struct victim *v) {
  cudaEventRecord(v->a, v->s);
  for (int k = 0; k < VICTIM_LAUNCHES; k++)
    if (bench_victim_launch(v->buf, VICTIM_BYTES, v->out, v->s) != cudaSuccess) return -EIO;
  cudaEventRecord(v->b, v->s);
  return 0;
}

static double victim_ms(struct victim *v) {
  float ms = 0;
  cudaEventSynchronize(v->b);
  cudaEventElapsedTime(&ms, v->a, v->b);
  return ms;
}

static void victim_close(struct victim *v) {
  if (v->buf) cudaFree(v->buf);
  if (v->out) cudaFree(v->out);
  if (v->s) cudaStreamDestroy(v->s);
  if (v->a) cudaEventDestroy(v->a);
  if (v->b) cudaEventDestroy(v->b);
  memset(v, 0, sizeof *v);
}

static int victim_open(struct victim *v) {
  memset(v, 0, sizeof *v);
  if (cudaMalloc(&v->buf, VICTIM_BYTES) != cudaSuccess || cudaMalloc((void **)&v->out, 64) != cudaSuccess ||
      cudaMemset(v->buf, 0, VICTIM_BYTES) != cudaSuccess ||
      cudaStreamCreateWithFlags(&v->s, cudaStreamNonBlocking) != cudaSuccess ||
      cudaEventCreate(&v->a) != cudaSuccess || cudaEventCreate(&v->b) != cudaSuccess) {
    cli_error("bench copy --victim: cannot allocate the victim's 1 GiB buffer, stream or events");
    victim_close(v);
    return -ENOMEM;
  }
  double t[6];
  for (int r = 0; r < 6; r++) { /* r 0: warm-up */
    if (victim_start(v)) {
      cli_error("bench copy --victim: the victim kernel did not launch (no code for this GPU?)");
      victim_close(v);
      return -EIO;
    }
    t[r] = victim_ms(v);
  }
  v->alone_ms = median(t + 1, 5);
  return 0;
}
#endif

static const char *copy_usage =
    "Usage: umbp bench copy [--threads N] [--cpus LIST] [--cases LIST] [--reps N]\n"
    "                       [--bytes SIZE] [--cuda [--cuda-copy MODE] [--cuda-ctas N] [--victim]\n"
    "                       [--pull]]\n"
    "                       [--json]\n"
    "\n"
    "Measure the data path's store (KV regions -> pool slots, then publish) and load\n"
    "(pin, pool slots -> KV regions, unpin) throughput beside a reference that copies\n"
    "the same bytes in the same run: plain memcpy with the same number of threads\n"
    "(host backend), or cudaMemcpy between a pinned host buffer and device memory\n"
    "(--cuda). A block object of OBJ bytes is gathered from R regions (R/2 layers of\n"
    "K and V tensors): the case OBJxR. A private pool, bench-copy-PID (no pre-fault,\n"
    "destroyed at the end and on SIGINT, SIGTERM, SIGHUP or SIGQUIT), holds one slot per\n"
    "block; the KV regions are host memory (or cuda:0).\n"
    "\n"
    "Options:\n"
    "  --threads N     host copy threads, for ours and for the memcpy reference\n"
    "                  (default 2).\n"
    "  --cpus LIST     bind copy threads to these CPUs (e.g. 0,1; thread i gets\n"
    "                  LIST[i mod len]); default: unbound.\n"
    "  --cases LIST    comma-separated OBJxR cases, OBJ a size (KiB, MiB) and R the\n"
    "                  region count (default 64KiBx2,256KiBx16,1MiBx80,4MiBx160:\n"
    "                  1 layer, 8 layers, 40 layers and 80 layers of K,V).\n"
    "  --reps N        repetitions per case; medians are printed (default 5).\n"
    "  --bytes SIZE    bytes moved per job (default 256MiB, at most 2GiB). The pool\n"
    "                  has a slot of OBJ rounded up to 4 KiB per object, so objects\n"
    "                  under 4 KiB make it larger; a case whose pool or buffers\n"
    "                  /dev/shm or the memory cannot hold fails at once, with a\n"
    "                  --bytes that fits.\n"
    "  --cuda          regions on cuda:0 through the CUDA backend, reference\n"
    "                  cudaMemcpy of pinned buffers (needs a GPU and a CUDA build).\n"
    "  --cuda-copy MODE  how the CUDA backend copies (umbp_dp_opts.cuda_copy):\n"
    "                  auto (default: loads and pulls by the copy kernel when\n"
    "                  ranges average under 256 KiB, stores and larger ranges by\n"
    "                  the copy engines), dma (copy engines only:\n"
    "                  cudaMemcpyBatchAsync), kernel (the copy kernel always).\n"
    "  --cuda-ctas N   CTAs per copy-kernel launch (umbp_dp_opts.cuda_kernel_ctas,\n"
    "                  1..1024; default 16).\n"
    "  --victim        also time a kernel that streams 1 GiB of HBM 8 times (as a\n"
    "                  decode step streams weights) on its own stream, alone and\n"
    "                  while each store and load job copies; print its slowdown\n"
    "                  (time beside the copies / time alone, median).\n"
    "  --pull          also measure CUDA IPC pulls: a second process (this program)\n"
    "                  exports the same KV layout on cuda:0 as rank 1, and every\n"
    "                  block is pulled device to device (umbp_dp_ipc_pull) beside\n"
    "                  one cudaMemcpy device-to-device of the same bytes; the\n"
    "                  pulled bytes are checked.\n"
    "  --json          one JSON object instead of the table.\n"
    "  -h, --help      this text.\n"
    "\n"
    "Output: per case the object size, regions, blocks per job, and for store and\n"
    "load our GB/s (1e9 bytes/s), the reference's GB/s and ours/reference. JSON:\n"
    "{\"backend\", \"threads\", \"reps\", \"bytes_per_job\", \"reference\", \"cases\": [{\"case\",\n"
    "\"object_bytes\", \"regions\", \"blocks\", \"store_gbps\", \"store_ref_gbps\",\n"
    "\"store_ratio\", \"load_gbps\", \"load_ref_gbps\", \"load_ratio\"}]}; with --cuda also\n"
    "\"cuda_copy\", \"cuda_kernel_ctas\" and the process's copy issues: \"cuda_kernel_launches\",\n"
    "\"cuda_batch_calls\" (cudaMemcpyBatchAsync) and \"cuda_range_calls\" (cudaMemcpyAsync);\n"
    "with --victim per case \"victim_alone_ms\", \"store_victim_slowdown\", \"load_victim_slowdown\";\n"
    "with --pull \"pull_gbps\", \"pull_ref_gbps\", \"pull_ratio\" (and \"pull_victim_slowdown\").\n"
    "\n"
    "Exit status: 0 measured; 1 a runtime failure (pool, CUDA, a failed job); 2 usage;\n"
    "3 a SIGBUS on the pool (its file truncated, or /dev/shm full).\n"
    "\n"
    "Example:\n"
    "  umbp bench copy --threads 2 --cases 256KiBx16,1MiBx80 --reps 7 --json\n";

struct bcase {
  char name[32];
  uint64_t obj;
  unsigned nreg;
};

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int dcmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static double median(double *v, unsigned n) {
  qsort(v, n, sizeof *v, dcmp);
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* ---- the memcpy reference: persistent threads released by a barrier ------ */
struct ref {
  unsigned nthreads;
  pthread_t *th;
  pthread_barrier_t start, end;
  bool stop;
  int dir; /* 0: buffer -> slots (store), 1: slots -> buffer (load) */
  char **slots;
  char *buf;
  uint64_t obj;
  unsigned nblocks;
  const unsigned *cpus;
  unsigned ncpus;
};
struct ref_arg {
  struct ref *r;
  unsigned id;
};

static void *ref_thread(void *p) {
  struct ref_arg *a = p;
  struct ref *r = a->r;
  for (;;) {
    pthread_barrier_wait(&r->start);
    if (r->stop) break;
    unsigned b0 = (unsigned)((uint64_t)r->nblocks * a->id / r->nthreads);
    unsigned b1 = (unsigned)((uint64_t)r->nblocks * (a->id + 1) / r->nthreads);
    for (unsigned b = b0; b < b1; b++) {
      if (r->dir == 0) memcpy(r->slots[b], r->buf + (uint64_t)b * r->obj, r->obj);
      else memcpy(r->buf + (uint64_t)b * r->obj, r->slots[b], r->obj);
    }
    pthread_barrier_wait(&r->end);
  }
  return NULL;
}

static double ref_run(struct ref *r, int dir) {
  r->dir = dir;
  double t0 = now_s();
  pthread_barrier_wait(&r->start);
  pthread_barrier_wait(&r->end);
  return now_s() - t0;
}

static int ref_start(struct ref *r, struct ref_arg *args) {
  pthread_barrier_init(&r->start, NULL, r->nthreads + 1);
  pthread_barrier_init(&r->end, NULL, r->nthreads + 1);
  r->th = calloc(r->nthreads, sizeof *r->th);
  for (unsigned i = 0; i < r->nthreads; i++) {
    args[i] = (struct ref_arg){.r = r, .id = i};
    pthread_attr_t at;
    pthread_attr_init(&at);
    if (r->cpus) {
      cpu_set_t set;
      CPU_ZERO(&set);
      CPU_SET(r->cpus[i % r->ncpus], &set);
      pthread_attr_setaffinity_np(&at, sizeof set, &set);
    }
    int e = pthread_create(&r->th[i], &at, ref_thread, &args[i]);
    pthread_attr_destroy(&at);
    if (e) return -e;
  }
  return 0;
}

static void ref_stop(struct ref *r) {
  r->stop = true;
  pthread_barrier_wait(&r->start);
  for (unsigned i = 0; i < r->nthreads; i++) pthread_join(r->th[i], NULL);
  pthread_barrier_destroy(&r->start);
  pthread_barrier_destroy(&r->end);
  free(r->th);
}

/* ---- one case --------------------------------------------------------------- */
struct result {
  double store, store_ref, load, load_ref; /* GB/s */
  double store_vx, load_vx, victim_ms;     /* --victim: victim time with the copies / alone */
  double pull, pull_ref, pull_vx;          /* --pull: GB/s, D2D cudaMemcpy GB/s, victim slowdown */
  unsigned blocks;
};

static int run_job(umbp_dp_job *j, const char *what) {
  int rc = umbp_dp_job_wait(j, JOB_WAIT_MS);
  if (!rc) rc = umbp_dp_job_status(j);
  if (rc) cli_error("bench copy: %s job failed: %s (%s)", what, umbp_strerror(rc), umbp_dp_job_message(j, 0));
  umbp_dp_job_release(j);
  return rc;
}

/* Bytes per block of region r of case c: OBJ split evenly (64-byte
 * multiples), the remainder in the last region. */
static uint64_t region_bytes(const struct bcase *c, unsigned r) {
  uint64_t per = (c->obj / c->nreg) & ~63ull;
  if (per == 0) per = c->obj / c->nreg;
  return r + 1 < c->nreg ? per : c->obj - per * (c->nreg - 1);
}

#if UMBP_HAVE_CUDA
/* The other rank of --pull, run as `umbp bench copy --pull-exporter POOL
 * OBJxR BLOCKS`: attach as rank 1, fill KV regions of the case on cuda:0
 * (region r's bytes all r & 0xff), export them, print "exported", and keep
 * them alive until stdin closes. */
static int pull_exporter(int argc, char **argv) {
  struct bcase c;
  if (argc != 5 || parse_case(argv[3], &c)) return CLI_USAGE;
  unsigned nb = (unsigned)atoi(argv[4]);
  umbp_attach_opts ao;
  umbp_attach_opts_init(&ao);
  ao.role = UMBP_ROLE_WORKER;
  ao.rank = 1;
  umbp_pool *pool = NULL;
  umbp_kv_layout *lay = NULL;
  umbp_dp_engine *e = NULL;
  umbp_kv_region *reg = calloc(c.nreg, sizeof *reg);
  int rc = reg ? umbp_pool_attach(argv[2], &ao, &pool) : -ENOMEM;
  if (!rc) cli_fault_watch(pool, "umbp bench copy: exporter", false);
  for (unsigned r = 0; !rc && r < c.nreg; r++) {
    uint64_t bb = region_bytes(&c, r);
    reg[r] = (umbp_kv_region){.block_bytes = bb, .stride = bb, .block_count = nb, .group = 0, .layer = r / 2,
                              .kind = (int)(r % 2), .device = UMBP_DP_CUDA, .device_id = 0};
    if (cudaMalloc(&reg[r].base, bb * nb) != cudaSuccess || cudaMemset(reg[r].base, (int)(r & 0xff), bb * nb))
      rc = -ENOMEM;
  }
  umbp_dp_opts o;
  umbp_dp_opts_init(&o);
  o.cuda_register = false;
  if (!rc) rc = umbp_kv_layout_create(pool, reg, c.nreg, &lay);
  if (!rc) rc = umbp_dp_engine_create(pool, &o, &e);
  if (!rc) rc = umbp_dp_ipc_export(e, lay, 1);
  if (rc) {
    fprintf(stderr, "umbp bench copy --pull-exporter: %s\n", umbp_last_error());
  } else {
    printf("exported\n");
    fflush(stdout);
    char b;
    while (read(0, &b, 1) > 0) {
    }
  }
  umbp_dp_engine_destroy(e);
  umbp_kv_layout_free(lay);
  for (unsigned r = 0; reg && r < c.nreg; r++)
    if (reg[r].base) cudaFree(reg[r].base);
  free(reg);
  if (pool) cli_pool_detach(pool);
  return rc ? CLI_RUNTIME : CLI_OK;
}

/* --pull: another process (this binary as --pull-exporter) exports the same
 * KV layout as rank 1; time umbp_dp_ipc_pull of every block into this
 * process's layout beside one cudaMemcpy device-to-device of the same bytes,
 * and check the bytes of the last pull. */
static int run_pull(const struct bcase *c, const char *pool_name, umbp_dp_engine *e, const umbp_kv_layout *lay,
                    const umbp_kv_region *reg, unsigned nb, unsigned reps, struct result *res, void *vic) {
  int in[2], out[2];
  if (pipe(in) || pipe(out)) {
    cli_error("bench copy --pull: pipe: %s", strerror(errno));
    return -errno;
  }
  char nbs[16];
  snprintf(nbs, sizeof nbs, "%u", nb);
  pid_t pid = fork();
  if (pid == 0) {
    dup2(in[0], 0);
    dup2(out[1], 1);
    close(in[0]), close(in[1]), close(out[0]), close(out[1]);
    execl("/proc/self/exe", "umbp", "bench", "copy", "--pull-exporter", pool_name, c->name, nbs, (char *)NULL);
    _exit(127);
  }
  close(in[0]);
  close(out[1]);
  int rc = pid < 0 ? -errno : 0;
  char line[64] = "";
  size_t n = 0;
  struct pollfd pf = {.fd = out[0], .events = POLLIN};
  while (!rc && n + 1 < sizeof line && poll(&pf, 1, EXPORTER_READY_MS) > 0) {
    if (read(out[0], line + n, 1) != 1) break;
    if (line[n] == '\n') break;
    n++;
  }
  line[n] = 0;
  if (!rc && strcmp(line, "exported")) {
    cli_error("bench copy --pull: the exporter process did not export (see its message above)");
    rc = -EIO;
  }
  uint32_t *src = malloc(nb * sizeof *src), *dst = malloc(nb * sizeof *dst);
  double *t = calloc(reps, sizeof *t), *tr = calloc(reps, sizeof *tr), *tv = calloc(reps, sizeof *tv);
  char *d1 = NULL, *d2 = NULL;
  if (!rc && (!src || !dst || !t || !tr || !tv || cudaMalloc((void **)&d1, c->obj * nb) != cudaSuccess ||
              cudaMalloc((void **)&d2, c->obj * nb) != cudaSuccess)) {
    cli_error("bench copy --pull: out of memory");
    rc = -ENOMEM;
  }
  for (unsigned i = 0; !rc && i < nb; i++) src[i] = nb - 1 - i, dst[i] = i;
  double gb = (double)c->obj * nb / 1e9;
  for (unsigned rep = 0; rep <= reps && !rc; rep++) { /* rep 0: warm-up (opens the handles) */
    umbp_dp_job *j;
    double t0 = now_s();
    if ((rc = umbp_dp_ipc_pull(e, lay, 0, 1, nb, src, dst, &j))) {
      cli_error("bench copy --pull: %s", umbp_last_error());
      break;
    }
#if UMBP_HAVE_BENCH_VICTIM
    if (victim_on) victim_start(vic);
#else
    (void)vic;
#endif
    if ((rc = run_job(j, "pull"))) break;
    double tp = now_s() - t0;
#if UMBP_HAVE_BENCH_VICTIM
    if (victim_on && rep) tv[rep - 1] = victim_ms(vic) / ((struct victim *)vic)->alone_ms;
#endif
    t0 = now_s();
    cudaMemcpy(d2, d1, c->obj * nb, cudaMemcpyDeviceToDevice);
    cudaDeviceSynchronize();
    double trr = now_s() - t0;
    if (rep) t[rep - 1] = gb / tp, tr[rep - 1] = gb / trr;
  }
  /* Block 0 of every region now holds the exporter's bytes (r & 0xff). */
  for (unsigned r = 0; !rc && r < c->nreg; r++) {
    unsigned char buf[256];
    uint64_t len = reg[r].block_bytes < sizeof buf ? reg[r].block_bytes : sizeof buf;
    if (cudaMemcpy(buf, reg[r].base, len, cudaMemcpyDeviceToHost) != cudaSuccess) rc = -EIO;
    for (uint64_t i = 0; !rc && i < len; i++)
      if (buf[i] != (r & 0xff)) {
        cli_error("bench copy --pull: region %u of block 0 does not hold the exporter's bytes", r);
        rc = -EIO;
      }
  }
  if (!rc) {
    res->pull = median(t, reps);
    res->pull_ref = median(tr, reps);
    res->pull_vx = victim_on ? median(tv, reps) : 0;
  }
  close(in[1]); /* the exporter exits at EOF */
  close(out[0]);
  if (pid > 0) waitpid(pid, NULL, 0);
  if (d1) cudaFree(d1);
  if (d2) cudaFree(d2);
  free(src), free(dst), free(t), free(tr), free(tv);
  return rc;
}
#endif

/* The case's KV regions (R/2 layers of K and V, nb blocks each) on the host or
 * cuda:0, filled with a pattern. 0 or -ENOMEM; free_regions frees what was
 * allocated either way. */
static int alloc_regions(const struct bcase *c, unsigned nb, bool cuda, umbp_kv_region *reg) {
  for (unsigned r = 0; r < c->nreg; r++) {
    uint64_t bb = region_bytes(c, r);
    reg[r] = (umbp_kv_region){.block_bytes = bb, .stride = bb, .block_count = nb, .group = 0, .layer = r / 2,
                              .kind = (int)(r % 2), .device = cuda ? UMBP_DP_CUDA : UMBP_DP_CPU};
#if UMBP_HAVE_CUDA
    if (cuda) {
      if (cudaMalloc(&reg[r].base, bb * nb) != cudaSuccess) {
        cli_error("bench copy: cudaMalloc of %llu bytes failed", (unsigned long long)(bb * nb));
        return -ENOMEM;
      }
      cudaMemset(reg[r].base, r & 0xff, bb * nb);
      continue;
    }
#endif
    reg[r].base = malloc(bb * nb);
    if (!reg[r].base) {
      return -ENOMEM;
    }
    memset(reg[r].base, (int)(r * 7 + 1), bb * nb);
  }
  return 0;
}

static void free_regions(const struct bcase *c, bool cuda, umbp_kv_region *reg) {
  (void)cuda; /* used only where CUDA is built in */
  for (unsigned r = 0; r < c->nreg; r++) {
#if UMBP_HAVE_CUDA
    if (cuda) {
      if (reg[r].base) cudaFree(reg[r].base);
      continue;
    }
#endif
    free(reg[r].base);
  }
}

/* What one case's repetitions share. */
struct copy_run {
  const struct bcase *c;
  umbp_pool *pool;
  uint32_t ns;
  unsigned nb;
  bool cuda;
  umbp_dp_engine *e;
  umbp_kv_layout *lay;
  uint32_t *ids, *pins;
  umbp_key *keys;
  char **slotp;
  char *refbuf, *devref; /* the reference's host buffer, and its device one with --cuda */
  struct ref *ref;
  double gb;             /* GB moved per job */
  double **v;            /* GB/s per rep: store, store ref, load, load ref; victim slowdowns */
#if UMBP_HAVE_BENCH_VICTIM
  struct victim *vic;
#endif
};

/* Repetition rep (0: the warm-up, not recorded): store every block, load it
 * back, time the references beside them, then empty the pool for the next.
 * 0 or a negative errno. */
static int copy_rep(struct copy_run *x, unsigned rep) {
  int rc;
  for (unsigned i = 0; i < x->nb; i++) {
    x->keys[i].ns = x->ns;
    x->keys[i].hash_len = 16;
    memcpy(x->keys[i].hash, &rep, sizeof rep);
    memcpy(x->keys[i].hash + 4, &i, sizeof i);
  }
  umbp_dp_job *j;
  double t0 = now_s();
  if ((rc = umbp_dp_store(x->e, x->lay, 0, 0, x->nb, x->ids, x->keys, 0, &j))) return rc;
#if UMBP_HAVE_BENCH_VICTIM
  if (victim_on) victim_start(x->vic); /* the job's copies are queued: the victim runs beside them */
#endif
  if ((rc = run_job(j, "store"))) return rc;
  double ts = now_s() - t0;
#if UMBP_HAVE_BENCH_VICTIM
  if (victim_on && rep) x->v[4][rep - 1] = victim_ms(x->vic) / x->vic->alone_ms;
#endif
  if (umbp_lookup_pin_bulk(x->pool, x->nb, x->keys, x->pins) != (int)x->nb) {
    cli_error("bench copy: stored keys not found");
    return -EIO;
  }
  for (unsigned i = 0; i < x->nb; i++) x->slotp[i] = umbp_slot_ptr(x->pool, x->pins[i]);
  double tsr = 0, tlr = 0;
#if UMBP_HAVE_CUDA
  if (x->cuda) {
    t0 = now_s();
    cudaMemcpy(x->devref, x->refbuf, x->c->obj * x->nb, cudaMemcpyHostToDevice);
    tlr = now_s() - t0;
    t0 = now_s();
    cudaMemcpy(x->refbuf, x->devref, x->c->obj * x->nb, cudaMemcpyDeviceToHost);
    tsr = now_s() - t0;
  } else
#endif
    tsr = ref_run(x->ref, 0);
  t0 = now_s();
  if ((rc = umbp_dp_load(x->e, x->lay, 0, x->nb, x->keys, x->ids, &j))) return rc;
#if UMBP_HAVE_BENCH_VICTIM
  if (victim_on) victim_start(x->vic);
#endif
  if ((rc = run_job(j, "load"))) return rc;
  double tl = now_s() - t0;
#if UMBP_HAVE_BENCH_VICTIM
  if (victim_on && rep) x->v[5][rep - 1] = victim_ms(x->vic) / x->vic->alone_ms;
#endif
  if (!x->cuda) tlr = ref_run(x->ref, 1);
  umbp_unpin_bulk(x->pool, x->nb, x->pins);
  umbp_clear_ns(x->pool, x->ns);
  for (int k = 0; k < RECLAIM_TRIES && umbp_reclaim(x->pool) >= 0; k++) {
    uint64_t free_slots = 0;
    if (umbp_admin_free_slots(x->pool, 0, &free_slots) == 0 && free_slots >= x->nb) break;
    usleep(RECLAIM_POLL_US);
  }
  if (rep == 0) return 0;
  x->v[0][rep - 1] = x->gb / ts;
  x->v[1][rep - 1] = x->gb / tsr;
  x->v[2][rep - 1] = x->gb / tl;
  x->v[3][rep - 1] = x->gb / tlr;
  return 0;
}

/* The private pool of the case being run ("" between cases): removed on
 * SIGINT, SIGTERM, SIGHUP or SIGQUIT, which otherwise left bench-copy-PID (its slot bytes in
 * /dev/shm, its index on huge pages) behind for good. */
static char g_copy_pool[64];

static void copy_on_signal(int sig) {
  (void)sig;
  if (g_copy_pool[0]) umbp_pool_destroy(g_copy_pool);
}

/* Whether case c's pool and buffers fit this machine, checked for every case
 * before any runs: CLI_OK, or CLI_RUNTIME naming --bytes and one that fits.
 * The pool holds one slot (OBJ rounded up to 4 KiB) per block of --bytes, and
 * the stores write every slot, so it takes its whole capacity of /dev/shm and
 * of memory, which small objects multiply (--cases 64x1 turns 256 MiB into a
 * 16 GiB pool); the KV regions and the memcpy reference take --bytes each
 * (host memory; with --cuda the pinned reference). Before, a pool too large
 * for /dev/shm failed with pool create's advice ('--capacity'), and one that
 * fit /dev/shm but not the memory ran into the OOM killer. 16 MiB: the pool's
 * own overhead. */
static int case_fits(const struct bcase *c, unsigned threads, uint64_t bytes, bool cuda) {
  uint64_t nb = (bytes + c->obj - 1) / c->obj, slot = (c->obj + 4095) & ~4095ull, fixed = 16ull << 20;
  if (nb < threads) nb = threads;
  uint64_t per_mem = slot + (cuda ? 1 : 2) * c->obj; /* slot, regions (host only), reference buffer */
  uint64_t shm = UINT64_MAX, mem = UINT64_MAX;
  struct statvfs sv;
  if (statvfs("/dev/shm", &sv) == 0) shm = (uint64_t)sv.f_bavail * sv.f_frsize;
  FILE *f = fopen("/proc/meminfo", "re");
  if (f) {
    char line[256];
    unsigned long long kb;
    while (fgets(line, sizeof line, f))
      if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) {
        mem = (uint64_t)kb * 1024;
        break;
      }
    fclose(f);
  }
  if (nb * slot + fixed <= shm && nb * per_mem + fixed <= mem) return CLI_OK;
  uint64_t nb_shm = shm > fixed ? (shm - fixed) / slot : 0, nb_mem = mem > fixed ? (mem - fixed) / per_mem : 0;
  uint64_t nb_max = nb_shm < nb_mem ? nb_shm : nb_mem;
  bool by_shm = nb_shm <= nb_mem;
  char need[32], have[32], fit[32], b[32];
  cli_fmt_size(by_shm ? nb * slot + fixed : nb * per_mem + fixed, need, sizeof need);
  cli_fmt_size(by_shm ? shm : mem, have, sizeof have);
  cli_fmt_size(bytes, b, sizeof b);
  uint64_t max_bytes = (nb_max * c->obj) & ~1023ull; /* whole KiB */
  if (nb_max >= threads && max_bytes > 0) {
    cli_fmt_size_arg(max_bytes, fit, sizeof fit); /* a form --bytes takes */
    cli_error("bench copy: case %s with --bytes %s needs %s of %s (%llu blocks, a %llu-byte slot each%s) but there "
              "is %s: give --bytes %s or less%s", c->name, b, need, by_shm ? "/dev/shm" : "memory",
              (unsigned long long)nb, (unsigned long long)slot, by_shm ? "" : ", the KV regions and the reference",
              have, fit, c->obj < 4096 ? ", or larger objects (each takes a 4 KiB slot)" : "");
  } else {
    cli_error("bench copy: case %s needs %s of %s but there is %s: free or enlarge %s", c->name, need,
              by_shm ? "/dev/shm" : "memory", have, by_shm ? "/dev/shm (docker run --shm-size=<N>g)" : "memory");
  }
  return CLI_RUNTIME;
}

static int run_case(const struct bcase *c, unsigned threads, const unsigned *cpus, unsigned ncpus, unsigned reps,
                    uint64_t bytes, bool cuda, struct result *res) {
  unsigned nb = (unsigned)((bytes + c->obj - 1) / c->obj);
  if (nb < threads) nb = threads;
  res->blocks = nb;
  char name[64];
  snprintf(name, sizeof name, "bench-copy-%d", (int)getpid());
  umbp_pool_params pp;
  umbp_pool_params_init(&pp);
  pp.slot_size = (c->obj + 4095) & ~4095ull;
  pp.capacity = pp.slot_size * nb;
  pp.no_prefault = true; /* the first store faults the pages in: rep 0 is a warm-up */
  pp.mempolicy = UMBP_MPOL_NONE;
  pp.n_numa_nodes = 1;
  pp.numa_nodes[0] = 0;
  umbp_pool *pool = NULL;
  cli_fatal_lock(); /* a signal meanwhile removes the pool once it exists */
  int rc = umbp_pool_create(name, &pp, &pool);
  if (rc == 0) snprintf(g_copy_pool, sizeof g_copy_pool, "%s", name);
  cli_fatal_unlock();
  if (rc) {
    cli_error("bench copy: pool: %s", umbp_last_error());
    return rc;
  }
  cli_fault_watch(pool, "umbp bench copy", false);
  uint32_t ns = 0;
  umbp_ns_register(pool, "bench-copy", &ns);
  umbp_kv_region *reg = calloc(c->nreg, sizeof *reg);
  uint32_t *ids = malloc(nb * sizeof *ids), *pins = malloc(nb * sizeof *pins);
  umbp_key *keys = calloc(nb, sizeof *keys);
  char **slotp = calloc(nb, sizeof *slotp);
  char *refbuf = NULL;
  umbp_dp_engine *e = NULL;
  umbp_kv_layout *lay = NULL;
  double *v[6];
  for (int k = 0; k < 6; k++) v[k] = calloc(reps, sizeof(double));
#if UMBP_HAVE_BENCH_VICTIM
  struct victim vic = {0};
#endif
  if ((rc = alloc_regions(c, nb, cuda, reg))) goto out;
  if ((rc = umbp_kv_layout_create(pool, reg, c->nreg, &lay))) {
    cli_error("bench copy: %s", umbp_last_error());
    goto out;
  }
  umbp_dp_opts o;
  umbp_dp_opts_init(&o);
  o.threads = threads;
  o.cpus = cpus;
  o.n_cpus = ncpus;
  o.cuda_copy = cuda_copy;
  o.cuda_kernel_ctas = cuda_ctas;
  if ((rc = umbp_dp_engine_create(pool, &o, &e))) {
    cli_error("bench copy: engine: %s", umbp_last_error());
    goto out;
  }
  if (cuda) {
    while ((rc = umbp_dp_cuda_registration(e, NULL, NULL)) == -EINPROGRESS) usleep(REGISTRATION_POLL_US);
    if (rc) {
      cli_error("bench copy: %s", umbp_last_error());
      goto out;
    }
  }
  for (unsigned i = 0; i < nb; i++) ids[i] = i;
#if UMBP_HAVE_CUDA
  if (cuda) {
    if (cudaMallocHost((void **)&refbuf, c->obj * nb) != cudaSuccess) {
      cli_error("bench copy: cudaMallocHost failed");
      rc = -ENOMEM;
      goto out;
    }
  } else
#endif
    refbuf = malloc(c->obj * nb);
  if (!refbuf) {
    rc = -ENOMEM;
    goto out;
  }
  memset(refbuf, 0x5a, c->obj * nb);
  char *devref = NULL;
  (void)devref;
#if UMBP_HAVE_CUDA
  if (cuda && cudaMalloc((void **)&devref, c->obj * nb) != cudaSuccess) {
    cli_error("bench copy: cudaMalloc failed");
    rc = -ENOMEM;
    goto out;
  }
#endif
  struct ref ref = {.nthreads = threads, .buf = refbuf, .obj = c->obj, .nblocks = nb, .slots = slotp,
                    .cpus = cpus, .ncpus = ncpus};
  struct ref_arg *rargs = calloc(threads, sizeof *rargs);
  if (!cuda && (rc = ref_start(&ref, rargs))) {
    cli_error("bench copy: cannot start reference threads");
    free(rargs);
    goto out;
  }
#if UMBP_HAVE_BENCH_VICTIM
  if (victim_on) rc = victim_open(&vic); /* on failure the loop below does not run */
  res->victim_ms = vic.alone_ms;
#endif
  struct copy_run x = {.c = c, .pool = pool, .ns = ns, .nb = nb, .cuda = cuda, .e = e, .lay = lay, .ids = ids,
                       .pins = pins, .keys = keys, .slotp = slotp, .refbuf = refbuf, .devref = devref, .ref = &ref,
                       .gb = (double)c->obj * nb / 1e9, .v = v,
#if UMBP_HAVE_BENCH_VICTIM
                       .vic = &vic
#endif
  };
  for (unsigned rep = 0; rep <= reps && !rc; rep++) rc = copy_rep(&x, rep); /* rep 0: warm-up, not counted */
  if (!cuda) ref_stop(&ref);
  free(rargs);
  if (!rc) {
    res->store = median(v[0], reps);
    res->store_ref = median(v[1], reps);
    res->load = median(v[2], reps);
    res->load_ref = median(v[3], reps);
    res->store_vx = victim_on ? median(v[4], reps) : 0;
    res->load_vx = victim_on ? median(v[5], reps) : 0;
  }
#if UMBP_HAVE_CUDA
#if UMBP_HAVE_BENCH_VICTIM
  void *vp = &vic;
#else
  void *vp = NULL;
#endif
  if (!rc && pull_on) rc = run_pull(c, name, e, lay, reg, nb, reps, res, vp);
#endif
#if UMBP_HAVE_BENCH_VICTIM
  victim_close(&vic);
#endif
#if UMBP_HAVE_CUDA
  if (devref) cudaFree(devref);
#endif
out:
  umbp_dp_engine_destroy(e);
#if UMBP_HAVE_CUDA
  if (pull_on) umbp_dp_ipc_unlink(name); /* the exporter's table; absent when it never exported */
#endif
  umbp_kv_layout_free(lay);
  free_regions(c, cuda, reg);
#if UMBP_HAVE_CUDA
  if (cuda && refbuf) cudaFreeHost(refbuf);
  else
#endif
    free(refbuf);
  for (int k = 0; k < 6; k++) free(v[k]);
  free(reg), free(ids), free(pins), free(keys), free(slotp);
  cli_pool_detach(pool);
  umbp_pool_destroy(name);
  g_copy_pool[0] = 0;
  return rc;
}

static int parse_case(const char *s, struct bcase *c) {
  const char *x = strchr(s, 'x');
  if (!x || x == s || (size_t)(x - s) >= sizeof c->name) return -EINVAL;
  char sz[32];
  memcpy(sz, s, (size_t)(x - s));
  sz[x - s] = 0;
  char *end;
  long r = strtol(x + 1, &end, 10);
  if (*end || r < 1 || r > 256 || cli_parse_size(sz, &c->obj) || c->obj < (uint64_t)r || c->obj > (64ull << 20))
    return -EINVAL;
  c->nreg = (unsigned)r;
  snprintf(c->name, sizeof c->name, "%s", s);
  return 0;
}

/* The figures of every case, for --json and the table. */
struct copy_report {
  bool cuda;
  unsigned threads, reps, nc;
  uint64_t bytes;
  const char *refname;
  uint64_t nbatch, nrange, nkern; /* the CUDA backend's copy calls */
  const struct bcase *cases;
  const struct result *res;
};

static void print_copy_json(const struct copy_report *r) {
  struct jb j;
  jb_begin(&j, stdout);
  jb_obj(&j, NULL);
  jb_str(&j, "backend", r->cuda ? "cuda" : "host");
  jb_u64(&j, "threads", r->threads);
  jb_u64(&j, "reps", r->reps);
  jb_u64(&j, "bytes_per_job", r->bytes);
  jb_str(&j, "reference", r->refname);
  if (r->cuda) {
    jb_u64(&j, "cuda_batch_calls", r->nbatch);
    jb_u64(&j, "cuda_range_calls", r->nrange);
    jb_u64(&j, "cuda_kernel_launches", r->nkern);
    jb_str(&j, "cuda_copy", copy_names[cuda_copy]);
    jb_u64(&j, "cuda_kernel_ctas", cuda_ctas ? cuda_ctas : 16);
  }
  jb_arr(&j, "cases");
  for (unsigned i = 0; i < r->nc; i++) {
    jb_obj(&j, NULL);
    jb_str(&j, "case", r->cases[i].name);
    jb_u64(&j, "object_bytes", r->cases[i].obj);
    jb_u64(&j, "regions", r->cases[i].nreg);
    jb_u64(&j, "blocks", r->res[i].blocks);
    jb_dbl(&j, "store_gbps", r->res[i].store);
    jb_dbl(&j, "store_ref_gbps", r->res[i].store_ref);
    jb_dbl(&j, "store_ratio", r->res[i].store / r->res[i].store_ref);
    jb_dbl(&j, "load_gbps", r->res[i].load);
    jb_dbl(&j, "load_ref_gbps", r->res[i].load_ref);
    jb_dbl(&j, "load_ratio", r->res[i].load / r->res[i].load_ref);
    if (pull_on) {
      jb_dbl(&j, "pull_gbps", r->res[i].pull);
      jb_dbl(&j, "pull_ref_gbps", r->res[i].pull_ref);
      jb_dbl(&j, "pull_ratio", r->res[i].pull / r->res[i].pull_ref);
      if (victim_on) jb_dbl(&j, "pull_victim_slowdown", r->res[i].pull_vx);
    }
    if (victim_on) {
      jb_dbl(&j, "victim_alone_ms", r->res[i].victim_ms);
      jb_dbl(&j, "store_victim_slowdown", r->res[i].store_vx);
      jb_dbl(&j, "load_victim_slowdown", r->res[i].load_vx);
    }
    jb_end_obj(&j);
  }
  jb_end_arr(&j);
  jb_end_obj(&j);
  jb_finish(&j);
}

static void print_copy_table(const struct copy_report *r) {
  char per_job[32]; /* --bytes as given: under 1 MiB it read "0 MiB per job" */
  printf("umbp bench copy: %s backend, %u thread%s, median of %u reps, %s per job, reference %s\n",
         r->cuda ? "CUDA" : "host", r->threads, r->threads > 1 ? "s" : "", r->reps,
         cli_fmt_size(r->bytes, per_job, sizeof per_job), r->refname);
  printf("%-12s %7s %6s | %10s %10s %6s | %10s %10s %6s%s\n", "case", "regions", "blocks", "store GB/s", "ref GB/s",
         "ratio", "load GB/s", "ref GB/s", "ratio", victim_on ? " | victim ms  store x   load x" : "");
  if (pull_on)
    printf("%-12s pull: IPC pull GB/s, reference cudaMemcpy device-to-device GB/s%s\n", "",
           victim_on ? ", victim slowdown" : "");
  for (unsigned i = 0; i < r->nc; i++) {
    const struct result *x = &r->res[i];
    printf("%-12s %7u %6u | %10.2f %10.2f %6.2f | %10.2f %10.2f %6.2f", r->cases[i].name, r->cases[i].nreg,
           x->blocks, x->store, x->store_ref, x->store / x->store_ref, x->load, x->load_ref, x->load / x->load_ref);
    if (victim_on) printf(" | %9.3f %8.2f %8.2f", x->victim_ms, x->store_vx, x->load_vx);
    printf("\n");
    if (pull_on) {
      printf("%-12s pull %10.2f %10.2f %6.2f", "", x->pull, x->pull_ref, x->pull / x->pull_ref);
      if (victim_on) printf(" | victim x %.2f", x->pull_vx);
      printf("\n");
    }
  }
  if (r->cuda)
    printf("CUDA copy mode %s: %llu copy-kernel launches, %llu chunks as one cudaMemcpyBatchAsync each, %llu ranges "
           "as one cudaMemcpyAsync each\n",
           copy_names[cuda_copy], (unsigned long long)r->nkern, (unsigned long long)r->nbatch,
           (unsigned long long)r->nrange);
}

int bench_copy_main(int argc, char **argv) {
  static const struct option lo[] = {{"threads", required_argument, 0, 't'}, {"cpus", required_argument, 0, 'c'},
                                     {"cases", required_argument, 0, 'C'},   {"reps", required_argument, 0, 'r'},
                                     {"bytes", required_argument, 0, 'b'},   {"cuda", no_argument, 0, 'g'},
                                     {"json", no_argument, 0, 'j'},          {"help", no_argument, 0, 'h'},
                                     {"cuda-copy", required_argument, 0, 'm'},
                                     {"cuda-ctas", required_argument, 0, 'k'},
                                     {"victim", no_argument, 0, 'v'},
                                     {"pull", no_argument, 0, 'p'},
                                     {0, 0, 0, 0}};
  unsigned threads = 2, reps = 5;
  uint64_t bytes = 256ull << 20;
  bool json = false, cuda = false, copy_given = false;
  cuda_copy = UMBP_DP_CUDA_COPY_AUTO;
  cuda_ctas = 0;
  victim_on = false;
  pull_on = false;
#if UMBP_HAVE_CUDA
  if (argc >= 2 && !strcmp(argv[1], "--pull-exporter")) return pull_exporter(argc, argv);
#endif
  int cpus_i[256];
  unsigned cpus[256], ncpus = 0;
  const char *cases_s = "64KiBx2,256KiBx16,1MiBx80,4MiBx160";
  optind = 1;
  opterr = 0; /* our own messages name the option (cli_bad_option) */
  int ch;
  while ((ch = getopt_long(argc, argv, ":h", lo, NULL)) != -1) {
    switch (ch) {
    case 't':
    case 'r': {
      /* whole decimal numbers, range-checked before the cast: atoi() took
       * "2abc" as 2 and wrapped 4294967298 to 2 */
      unsigned long lim = ch == 't' ? 64 : 1000;
      errno = 0;
      unsigned long v = cli_decimal(optarg) && !strchr(optarg, '.') ? strtoul(optarg, NULL, 10) : 0;
      if (errno || v < 1 || v > lim)
        return cli_usage_error("bench copy", "--%s '%s': give 1 to %lu", ch == 't' ? "threads" : "reps", optarg, lim);
      if (ch == 't') threads = (unsigned)v;
      else reps = (unsigned)v;
      break;
    }
    case 'C': cases_s = optarg; break;
    case 'g': cuda = true; break;
    case 'm': {
      int m = -1;
      for (int k = 0; k < 3; k++)
        if (!strcmp(optarg, copy_names[k])) m = k;
      if (m < 0) return cli_usage_error("bench copy", "--cuda-copy '%s': one of auto, dma, kernel", optarg);
      cuda_copy = m;
      copy_given = true;
      break;
    }
    case 'k': {
      char *end;
      long v = strtol(optarg, &end, 10);
      if (*end || v < 1 || v > 1024) return cli_usage_error("bench copy", "--cuda-ctas '%s': 1..1024", optarg);
      cuda_ctas = (unsigned)v;
      copy_given = true;
      break;
    }
    case 'v':
#if UMBP_HAVE_BENCH_VICTIM
      victim_on = true;
      copy_given = true;
      break;
#else
      return cli_usage_error("bench copy", "--victim: this build has no victim kernel (it needs nvcc at build time)");
#endif
    case 'p':
      pull_on = true;
      copy_given = true;
      break;
    case 'j': json = true; break;
    case 'b':
      if (cli_parse_size(optarg, &bytes) || bytes == 0 || bytes > (2ull << 30))
        return cli_usage_error("bench copy", "--bytes '%s': a size up to 2GiB", optarg);
      break;
    case 'c': {
      int n = cli_parse_int_list(optarg, cpus_i, 256);
      if (n <= 0) return cli_usage_error("bench copy", "--cpus '%s': CPU numbers 0 to 65535 separated by commas, "
                                                "at most 256 (like 0,1,2; no ranges)", optarg);
      /* a CPU this process may not run on failed later, in the engine, as
       * "cannot bind copy thread 0 to cpu 999" (exit 1), naming no option */
      cpu_set_t allowed;
      CPU_ZERO(&allowed);
      bool known = sched_getaffinity(0, sizeof allowed, &allowed) == 0;
      for (int i = 0; i < n; i++) {
        if (known && (cpus_i[i] >= CPU_SETSIZE || !CPU_ISSET(cpus_i[i], &allowed))) {
          char list[256] = "";
          size_t l = 0;
          for (int c = 0; c < CPU_SETSIZE && l + 8 < sizeof list; c++)
            if (CPU_ISSET(c, &allowed)) l += (size_t)snprintf(list + l, sizeof list - l, "%s%d", l ? "," : "", c);
          return cli_usage_error("bench copy", "--cpus '%s': CPU %d is not one this process may run on: use CPUs "
                                               "from %s",
                                 optarg, cpus_i[i], list);
        }
        cpus[i] = (unsigned)cpus_i[i];
      }
      ncpus = (unsigned)n;
      break;
    }
    case 'h': fputs(copy_usage, stdout); return CLI_OK;
    case ':': return cli_usage_error("bench copy", "option '%s' needs a value", argv[optind - 1]);
    default: return cli_bad_option("bench copy", lo, argv[optind - 1]);
    }
  }
  if (optind < argc) return cli_usage_error("bench copy", "unexpected argument '%s'", argv[optind]);
  if (copy_given && !cuda)
    return cli_usage_error("bench copy", "--cuda-copy, --cuda-ctas, --victim and --pull need --cuda");
  struct bcase cases[32];
  unsigned nc = 0;
  char buf[512];
  /* a longer list was cut silently, its last case perhaps in the middle (1MiBx80 -> 1MiBx8) */
  if (strlen(cases_s) >= sizeof buf)
    return cli_usage_error("bench copy", "--cases: a list of at most %zu characters", sizeof buf - 1);
  snprintf(buf, sizeof buf, "%s", cases_s);
  for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
    if (nc == 32) return cli_usage_error("bench copy", "--cases: at most 32");
    if (parse_case(t, &cases[nc])) return cli_usage_error("bench copy", "--cases: '%s' is not OBJxR (e.g. 1MiBx80)", t);
    nc++;
  }
  /* '--cases ""' or ',' would run nothing and print an empty table, exit 0 */
  if (!nc) return cli_usage_error("bench copy", "--cases '%s' names no case: give OBJxR, e.g. 1MiBx80", cases_s);
  /* an empty entry (64KiBx2,,1MiBx80 or a trailing comma) is most likely a case left out */
  size_t cl = strlen(cases_s);
  if (cases_s[0] == ',' || cases_s[cl - 1] == ',' || strstr(cases_s, ",,"))
    return cli_usage_error("bench copy", "--cases '%s' has an empty entry: give OBJxR between every two commas",
                           cases_s);
  if (cuda) {
    char why[256];
    if (!(umbp_dp_backends(why, sizeof why) & UMBP_DP_BACKEND_CUDA)) {
      /* the cause (no GPU, no driver, no CUDA build), then what runs here */
      cli_error("bench copy --cuda: %s; without --cuda, bench copy measures the host backend (memcpy reference)",
                why);
      return CLI_RUNTIME;
    }
  }
  for (unsigned i = 0; i < nc; i++)
    if (case_fits(&cases[i], threads, bytes, cuda)) return CLI_RUNTIME;
  int se = cli_fatal_signals(copy_on_signal);
  if (se) {
    cli_error("bench copy: cannot start its signal thread: %s", strerror(-se));
    return CLI_RUNTIME;
  }
  struct result res[32];
  for (unsigned i = 0; i < nc; i++)
    if (run_case(&cases[i], threads, ncpus ? cpus : NULL, ncpus, reps, bytes, cuda, &res[i])) return CLI_RUNTIME;
  struct copy_report rep = {.cuda = cuda, .threads = threads, .reps = reps, .nc = nc, .bytes = bytes,
                            .refname = cuda ? "cudaMemcpy of pinned buffers" : "memcpy", .cases = cases, .res = res};
  umbp_dp_cuda_copy_calls(&rep.nbatch, &rep.nrange, &rep.nkern);
  if (json) print_copy_json(&rep);
  else print_copy_table(&rep);
  return CLI_OK;
}
