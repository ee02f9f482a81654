/* SPDX-License-Identifier: Apache-2.0 */
/* umbp replay — replay a serving trace through a real pool with N worker
 * processes (tools/replay/ holds the parser, generator, scheduler, worker). */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"
#include "replay/curve.h"
#include "replay/replay.h"
#include "replay/trace.h"

static const char *replay_usage =
    "Usage: umbp replay TRACE.jsonl [OPTIONS]\n"
    "       umbp replay --generate chat [GENERATOR OPTIONS] [OPTIONS]\n"
    "       umbp replay --generate chat [GENERATOR OPTIONS] --output FILE\n"
    "\n"
    "Replay a serving trace through a real umbp pool: one scheduler process (this\n"
    "one) and one worker process per tensor-parallel rank. For each request the\n"
    "scheduler probes the pool for the longest prefix of the prompt's blocks that is\n"
    "present on every rank; each worker loads those blocks from the pool into a\n"
    "private buffer that stands in for its GPU's KV cache, verifies every byte, and\n"
    "stores the prompt's remaining whole blocks. The pool is created fresh for the\n"
    "run (named replay-PID-STEP) and removed at the end, also on Ctrl-C, SIGTERM or\n"
    "when a worker dies.\n"
    "\n"
    "TRACE is Mooncake's JSONL format, one request per line:\n"
    "  {\"timestamp\": MS, \"input_length\": N, \"output_length\": N, \"hash_ids\": [...]}\n"
    "with one id per --block-tokens block of the prompt (equal ids = equal content,\n"
    "chained as in vLLM). A prompt's trailing partial block is never stored or\n"
    "counted. Other fields are ignored; timestamp is optional (0).\n"
    "\n"
    "Options:\n"
    "  --tp N               tensor-parallel ranks = worker processes (default 1,\n"
    "                       at most 32). Each rank stores its 1/N shard of a block.\n"
    "  --capacity SIZE      bytes of block slots in the pool, all ranks together,\n"
    "                       e.g. 1GiB (B, KiB, MiB, GiB, TiB; MB = MiB). Blocks are\n"
    "                       evicted (CLOCK) when it is full.\n"
    "  --unbounded          a pool with a slot for every distinct whole block of the\n"
    "                       trace on every rank, so nothing is evicted (the default\n"
    "                       when no capacity option is given).\n"
    "  --capacity-sweep LIST\n"
    "                       replay once per capacity in the comma-separated LIST\n"
    "                       (sizes, or 'unbounded'), each with a fresh pool, and\n"
    "                       print the hit-ratio curve: capacity, cache ratio, token\n"
    "                       ratio, evictions. Use it to size a pool. With\n"
    "                       'unbounded' in LIST (added when --plot or --csv is\n"
    "                       given without it) a line names the smallest capacity\n"
    "                       whose cache ratio reaches 95% of the unbounded one.\n"
    "  --plot FILE.svg      with --capacity-sweep: draw the curve (cache and token\n"
    "                       ratio against capacity, a log axis when the capacities\n"
    "                       span over 10x; the unbounded ratios and the 95% capacity\n"
    "                       marked) as an SVG picture. Needs two capacities or more\n"
    "                       besides 'unbounded'.\n"
    "                       Example: umbp replay trace.jsonl --capacity-sweep\n"
    "                         256MiB,512MiB,1GiB,2GiB --plot curve.svg\n"
    "  --csv FILE           with --capacity-sweep: the curve as CSV, one line per\n"
    "                       capacity in LIST order: capacity_bytes, slots, unbounded\n"
    "                       (0/1), cache_ratio, token_ratio, blocks_hit,\n"
    "                       blocks_total, evictions.\n"
    "                       Example: umbp replay trace.jsonl --capacity-sweep\n"
    "                         1GiB,2GiB,unbounded --csv curve.csv\n"
    "  --block-tokens N     tokens per block (default 512, as in Mooncake's traces).\n"
    "  --bytes-per-token B  KV-cache bytes of one token over all ranks (default 128,\n"
    "                       so a 512-token block is 64 KiB). Real models need far\n"
    "                       more (Llama-3-8B: 128 KiB); the default keeps the\n"
    "                       replay's pool small. A rank's shard is\n"
    "                       block-tokens * B / tp bytes (rounded up to 8); a pool\n"
    "                       slot is that rounded up to 64, at least 4 KiB.\n"
    "                       For a real model, 'umbp size --model-config\n"
    "                       config.json --tp N' prints the line to use:\n"
    "                       --block-tokens 16 --bytes-per-token B --tp N.\n"
    "  --speed X            replay the trace's timestamps at X times real time\n"
    "                       (default 0: as fast as possible). Only the pacing\n"
    "                       changes, never the figures.\n"
    "  --reply-timeout S    a worker that sends no reply for S seconds (stopped,\n"
    "                       hung) fails the replay (default 60); after 5 s the\n"
    "                       rank, pid and /proc state are printed every 5 s.\n"
    "  --json               print one JSON object instead of the text summary.\n"
    "  -h, --help           this text.\n"
    "\n";

/* split: C compilers need only support string literals of 4095 bytes */
static const char *replay_usage_gen =
    "Generator (instead of TRACE):\n"
    "  --generate chat      multi-turn conversations that share system prompts and\n"
    "                       grow their history turn by turn. Lengths are uniform in\n"
    "                       [mean/2, 3*mean/2].\n"
    "  --seed S             random seed (default 1); the same seed and parameters\n"
    "                       give the same workload, byte for byte.\n"
    "  --conversations N    conversations (default 400).\n"
    "  --turns T            each conversation has 1..T turns, uniformly (default 8).\n"
    "  --system-prompts K   shared system prompts, picked uniformly per\n"
    "                       conversation (default 8; 0: none).\n"
    "  --system-tokens N    mean system-prompt length in tokens (default 2048).\n"
    "  --user-tokens N      mean user-message length (default 256).\n"
    "  --output-tokens N    mean answer length (default 192).\n"
    "  --rate R             new conversations per second, Poisson (default 2).\n"
    "  --think S            mean seconds between an answer and the next turn,\n"
    "                       exponential (default 30); an answer of A tokens also\n"
    "                       takes A * 20 ms.\n"
    "  --output FILE        write the workload to FILE as JSONL ('-': stdout) and\n"
    "                       exit without replaying it (so --json, --capacity,\n"
    "                       --unbounded, --capacity-sweep, --plot and --csv are\n"
    "                       refused with it). A write that fails or a signal\n"
    "                       leaves FILE as it was, never half-written.\n"
    "\n";

static const char *replay_usage_out =
    "Output: requests; average input and output length (tokens); cache ratio =\n"
    "blocks of each prompt's longest prefix present on all ranks / all whole blocks;\n"
    "token ratio = hit blocks * block-tokens / input tokens; bytes stored and loaded\n"
    "(all ranks); evictions (umbp_counters_ns); lookup throughput = keys probed /\n"
    "probe time (a probe stops at its first miss); copy throughput = bytes copied\n"
    "between pool and worker buffers / the workers' summed copy time (GB = 1e9\n"
    "bytes); p50 and p99 (nearest rank) of the pool time per request: the\n"
    "scheduler's wall time for the probes and the workers' load and store round\n"
    "trips (including verification and the fill that stands in for compute).\n"
    "Progress goes to stderr when stderr is a terminal.\n"
    "\n"
    "JSON fields: trace, tp, block_tokens, bytes_per_token, block_bytes_per_rank,\n"
    "slot_size, distinct_blocks, then for one run: capacity_bytes, slots,\n"
    "pool_segment_bytes, unbounded, requests, avg_input_tokens, avg_output_tokens,\n"
    "input_tokens, output_tokens, blocks_total, blocks_hit, cache_ratio,\n"
    "token_ratio, blocks_stored, blocks_loaded, bytes_stored, bytes_loaded,\n"
    "evictions, verify_failures, lookup_keys, lookup_seconds, lookup_keys_per_s,\n"
    "copy_bytes, copy_seconds, copy_gb_per_s, pool_time_p50_ms, pool_time_p99_ms,\n"
    "wall_seconds; with --capacity-sweep these per-run fields are in sweep[].\n"
    "\n"
    "Exit status: 0 done; 1 runtime error (unreadable or malformed trace, pool\n"
    "creation, a worker died, a block failed verification, an output that could\n"
    "not be written); 2 usage error;\n"
    "3 a SIGBUS on the pool in the scheduler (its file truncated, or /dev/shm\n"
    "full; a worker's says so and its rank dies); 130 / 143 interrupted by\n"
    "SIGINT / SIGTERM, 129 / 131 by SIGHUP / SIGQUIT (the pool is removed).\n"
    "\n"
    "Examples:\n"
    "  umbp replay --generate chat --tp 2\n"
    "  umbp replay ../shared/data/traces/synthetic_trace.jsonl --unbounded\n"
    "  umbp replay trace.jsonl --tp 4 --capacity-sweep 256MiB,1GiB,2GiB,unbounded\n"
    "  umbp replay --generate chat --seed 7 --conversations 1000 --output chat.jsonl\n";

#define SWEEP_MAX 64

enum {
  OPT_TP = 256, OPT_CAPACITY, OPT_UNBOUNDED, OPT_SWEEP, OPT_BLOCK_TOKENS, OPT_BPT, OPT_SPEED, OPT_WORKER_TIMEOUT, OPT_JSON, OPT_GENERATE,
  OPT_SEED, OPT_CONV, OPT_TURNS, OPT_SYSP, OPT_SYST, OPT_USERT, OPT_OUTT, OPT_RATE, OPT_THINK, OPT_OUTPUT,
  OPT_PLOT, OPT_CSV,
};

static const struct option long_opts[] = {
    {"tp", required_argument, NULL, OPT_TP},
    {"capacity", required_argument, NULL, OPT_CAPACITY},
    {"unbounded", no_argument, NULL, OPT_UNBOUNDED},
    {"capacity-sweep", required_argument, NULL, OPT_SWEEP},
    {"block-tokens", required_argument, NULL, OPT_BLOCK_TOKENS},
    {"bytes-per-token", required_argument, NULL, OPT_BPT},
    {"speed", required_argument, NULL, OPT_SPEED},
    {"reply-timeout", required_argument, NULL, OPT_WORKER_TIMEOUT},
    {"json", no_argument, NULL, OPT_JSON},
    {"plot", required_argument, NULL, OPT_PLOT},
    {"csv", required_argument, NULL, OPT_CSV},
    {"generate", required_argument, NULL, OPT_GENERATE},
    {"seed", required_argument, NULL, OPT_SEED},
    {"conversations", required_argument, NULL, OPT_CONV},
    {"turns", required_argument, NULL, OPT_TURNS},
    {"system-prompts", required_argument, NULL, OPT_SYSP},
    {"system-tokens", required_argument, NULL, OPT_SYST},
    {"user-tokens", required_argument, NULL, OPT_USERT},
    {"output-tokens", required_argument, NULL, OPT_OUTT},
    {"rate", required_argument, NULL, OPT_RATE},
    {"think", required_argument, NULL, OPT_THINK},
    {"output", required_argument, NULL, OPT_OUTPUT},
    {"help", no_argument, NULL, 'h'},
    {NULL, 0, NULL, 0},
};

static int parse_uint(const char *s, uint64_t lo, uint64_t hi, uint64_t *ret) {
  if (!s || !isdigit((unsigned char)*s)) return -EINVAL; /* no sign, no spaces (strtoull takes both) */
  char *e;
  errno = 0;
  unsigned long long v = strtoull(s, &e, 10);
  if (errno || e == s || *e || v < lo || v > hi) return -EINVAL;
  *ret = v;
  return 0;
}

static int parse_dbl(const char *s, double lo, double hi, double *ret) {
  if (!s || !*s) return -EINVAL;
  if (strpbrk(s, "xX")) return -EINVAL; /* strtod would read hex floats; the size options refuse hex too */
  char *e;
  errno = 0;
  double v = strtod(s, &e);
  if (errno || e == s || *e || !isfinite(v) || v < lo || v > hi) return -EINVAL;
  *ret = v;
  return 0;
}

static double ratio(uint64_t a, uint64_t b) { return b ? (double)a / (double)b : 0.0; }

/* Whether paths a and b name one regular file, or one path that does not exist yet
 * (a device such as /dev/null may well take two outputs). */
static bool same_regular_file(const char *a, const char *b) {
  if (!a || !b) return false;
  struct stat sa, sb;
  bool ea = stat(a, &sa) == 0, eb = stat(b, &sb) == 0;
  if (ea && eb) return S_ISREG(sa.st_mode) && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
  return !ea && !eb && errno == ENOENT && !strcmp(a, b);
}

/* A --plot, --csv or --output file (--plot and --csv opened before the runs).
 * A regular file (or a path that does not exist yet) is written under a
 * temporary name beside it and renamed over it once complete, so that a run
 * that fails, a write that fails or a signal leaves the file as it was (a
 * curve of an earlier run, a trace) and never half-written; a device or a
 * pipe (/dev/null, /dev/stdout, >(cmd)) is written in place. */
struct out_file {
  FILE *f;
  const char *path;
  bool regular; /* written as tmp, renamed over final */
  char *tmp, *final;
};

static void out_free(struct out_file *o) {
  free(o->tmp);
  free(o->final);
  o->tmp = o->final = NULL;
}

/* Open o->path for writing: 0, or CLI_RUNTIME with the message printed. */
static int out_open(struct out_file *o, const char *opt) {
  if (!o->path) return 0;
  struct stat st;
  bool exists = stat(o->path, &st) == 0;
  if (exists && !S_ISREG(st.st_mode)) { /* a device or a pipe; a directory is refused by fopen */
    if (!(o->f = fopen(o->path, "we"))) {
      cli_error("replay: %s %s: cannot write it: %s", opt, o->path, strerror(errno));
      return CLI_RUNTIME;
    }
    o->regular = false;
    return 0;
  }
  if (exists && access(o->path, W_OK)) { /* as fopen would refuse it */
    cli_error("replay: %s %s: cannot write it: %s", opt, o->path, strerror(errno));
    return CLI_RUNTIME;
  }
  /* through a symbolic link: the file it names is replaced, not the link */
  o->final = exists ? realpath(o->path, NULL) : strdup(o->path);
  size_t n = o->final ? strlen(o->final) + 32 : 0;
  if (!o->final || !(o->tmp = malloc(n))) {
    out_free(o);
    cli_error("replay: %s %s: out of memory", opt, o->path);
    return CLI_RUNTIME;
  }
  snprintf(o->tmp, n, "%s.umbp-tmp-%d", o->final, (int)getpid());
  int fd = open(o->tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
  if (fd < 0 || !(o->f = fdopen(fd, "w"))) {
    int e = errno;
    if (fd >= 0) {
      close(fd);
      unlink(o->tmp);
    }
    out_free(o);
    cli_error("replay: %s %s: cannot write it: %s", opt, o->path, strerror(e));
    return CLI_RUNTIME;
  }
  o->regular = true;
  return 0;
}

/* Close o without its content: a run that failed, or a write that failed,
 * leaves the file as it was. Only the temporary file is removed: the path
 * may name a device (--plot /dev/null), and unlinking that as root would
 * delete the device node. */
static void out_drop(struct out_file *o) {
  if (!o->f) return;
  fclose(o->f);
  o->f = NULL;
  if (o->regular) unlink(o->tmp);
  out_free(o);
}

/* Close o after its content was written and put it in place: 0, or the
 * errno of what failed (the temporary file removed). */
static int out_commit(struct out_file *o) {
  FILE *f = o->f;
  o->f = NULL;
  errno = 0;
  int e = fclose(f) ? (errno ? errno : EIO) : 0;
  if (o->regular) {
    if (!e && rename(o->tmp, o->final)) e = errno;
    if (e) unlink(o->tmp);
    out_free(o);
  }
  return e;
}

/* The temporary files of --plot, --csv and --output to remove when SIGINT, SIGTERM, SIGHUP or
 * SIGQUIT ends the command outside a run (while the trace is read, between the steps of a
 * sweep, while the files are written): rp_run() catches all four during a run, and a run that
 * fails drops the files, so a signal leaves no temporary file either. */
static const char *volatile g_drop[3];

static void on_fatal_signal(int sig) {
  for (int i = 0; i < 3; i++)
    if (g_drop[i]) unlink(g_drop[i]);
  signal(sig, SIG_DFL);
  raise(sig);
}

/* Catch SIGINT, SIGTERM, SIGHUP and SIGQUIT to remove the files; a signal the caller ignores
 * stays ignored. */
static void drop_on_signal(const struct out_file *plot, const struct out_file *csv, const struct out_file *gen) {
  g_drop[0] = plot->f && plot->regular ? plot->tmp : NULL;
  g_drop[1] = csv->f && csv->regular ? csv->tmp : NULL;
  g_drop[2] = gen->f && gen->regular ? gen->tmp : NULL;
  if (!g_drop[0] && !g_drop[1] && !g_drop[2]) return;
  const int sigs[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT};
  for (int i = 0; i < 4; i++) {
    struct sigaction sa, old;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_fatal_signal;
    sigemptyset(&sa.sa_mask);
    if (sigaction(sigs[i], NULL, &old) == 0 && old.sa_handler != SIG_IGN) sigaction(sigs[i], &sa, NULL);
  }
}

static void drop_outputs(struct out_file *plot, struct out_file *csv) {
  out_drop(plot);
  out_drop(csv);
}

/* Close o after its content was written (wrc: the writer's 0 or -EIO):
 * 0, or -EIO with the message printed and the file dropped. */
static int out_close(struct out_file *o, int wrc, const char *opt) {
  int e = wrc ? (errno ? errno : EIO) : 0; /* stdio leaves the failed write's errno (ENOSPC, EIO, ...) */
  if (!e) {
    if (!(e = out_commit(o))) return 0;
  } else {
    out_drop(o);
  }
  cli_error("replay: %s %s: write failed: %s", opt, o->path, strerror(e));
  return -EIO;
}

/* Standard output written and flushed? 0, or CLI_RUNTIME with the message;
 * e0: the errno of an earlier failed write, named when the flush itself
 * succeeds (stdio keeps only the error flag). */
static int stdout_check(int e0) {
  errno = 0;
  int fl = fflush(stdout), e = errno;
  if (fl == 0 && !ferror(stdout)) return 0;
  cli_error("replay: writing the output failed: %s (is standard output a full disk, or closed?)",
            strerror(fl && e ? e : e0 ? e0 : EIO));
  return CLI_RUNTIME;
}

static void json_run(struct jb *j, const struct rp_config *cfg, const struct rp_result *r) {
  jb_u64(j, "capacity_bytes", r->capacity);
  jb_u64(j, "slots", r->slots);
  jb_u64(j, "pool_segment_bytes", r->segment_bytes);
  jb_bool(j, "unbounded", r->unbounded);
  jb_u64(j, "requests", r->requests);
  jb_dbl(j, "avg_input_tokens", ratio(r->input_tokens, r->requests));
  jb_dbl(j, "avg_output_tokens", ratio(r->output_tokens, r->requests));
  jb_u64(j, "input_tokens", r->input_tokens);
  jb_u64(j, "output_tokens", r->output_tokens);
  jb_u64(j, "blocks_total", r->blocks_total);
  jb_u64(j, "blocks_hit", r->blocks_hit);
  jb_dbl(j, "cache_ratio", ratio(r->blocks_hit, r->blocks_total));
  jb_dbl(j, "token_ratio", ratio(r->blocks_hit * cfg->block_tokens, r->input_tokens));
  jb_u64(j, "blocks_stored", r->blocks_stored);
  jb_u64(j, "blocks_loaded", r->blocks_loaded);
  jb_u64(j, "bytes_stored", r->bytes_stored);
  jb_u64(j, "bytes_loaded", r->bytes_loaded);
  jb_u64(j, "evictions", r->evictions);
  jb_u64(j, "verify_failures", r->verify_failures);
  jb_u64(j, "lookup_keys", r->keys_probed);
  jb_dbl(j, "lookup_seconds", (double)r->probe_ns / 1e9);
  jb_dbl(j, "lookup_keys_per_s", r->probe_ns ? (double)r->keys_probed * 1e9 / (double)r->probe_ns : 0.0);
  jb_u64(j, "copy_bytes", r->copy_bytes);
  jb_dbl(j, "copy_seconds", (double)r->copy_ns / 1e9);
  jb_dbl(j, "copy_gb_per_s", r->copy_ns ? (double)r->copy_bytes / (double)r->copy_ns : 0.0);
  jb_dbl(j, "pool_time_p50_ms", r->pool_p50_ms);
  jb_dbl(j, "pool_time_p99_ms", r->pool_p99_ms);
  jb_dbl(j, "wall_seconds", r->wall_s);
}

static void print_run(const struct rp_config *cfg, const struct rp_result *r) {
  char a[32], b[32], c[32];
  printf("pool         %s of slots (%llu slots of %s), segment %s%s\n", cli_fmt_size(r->capacity, a, sizeof a),
         (unsigned long long)r->slots, cli_fmt_size(cfg->slot_size, b, sizeof b),
         cli_fmt_size(r->segment_bytes, c, sizeof c), r->unbounded ? ", unbounded" : "");
  printf("\n");
  printf("requests                 %llu\n", (unsigned long long)r->requests);
  printf("average input            %.2f tokens\n", ratio(r->input_tokens, r->requests));
  printf("average output           %.2f tokens\n", ratio(r->output_tokens, r->requests));
  printf("cache ratio              %.2f%%  (%llu of %llu whole blocks hit on all ranks)\n",
         100 * ratio(r->blocks_hit, r->blocks_total), (unsigned long long)r->blocks_hit,
         (unsigned long long)r->blocks_total);
  printf("token ratio              %.2f%%  (%llu of %llu input tokens)\n",
         100 * ratio(r->blocks_hit * cfg->block_tokens, r->input_tokens),
         (unsigned long long)(r->blocks_hit * cfg->block_tokens), (unsigned long long)r->input_tokens);
  printf("bytes stored             %s  (%llu block shards)\n", cli_fmt_size(r->bytes_stored, a, sizeof a),
         (unsigned long long)r->blocks_stored);
  printf("bytes loaded             %s  (%llu block shards, every byte verified)\n",
         cli_fmt_size(r->bytes_loaded, a, sizeof a), (unsigned long long)r->blocks_loaded);
  printf("evictions                %llu\n", (unsigned long long)r->evictions);
  printf("lookup throughput        %.2f M keys/s  (%llu keys in %.3f s of probes)\n",
         r->probe_ns ? (double)r->keys_probed * 1e3 / (double)r->probe_ns : 0.0, (unsigned long long)r->keys_probed,
         (double)r->probe_ns / 1e9);
  printf("copy throughput          %.2f GB/s  (%.2f GB in %.3f s of worker copies)\n",
         r->copy_ns ? (double)r->copy_bytes / (double)r->copy_ns : 0.0, (double)r->copy_bytes / 1e9,
         (double)r->copy_ns / 1e9);
  printf("pool time per request    p50 %.3f ms, p99 %.3f ms\n", r->pool_p50_ms, r->pool_p99_ms);
  printf("wall time                %.2f s  (%.0f requests/s)\n", r->wall_s,
         r->wall_s > 0 ? (double)r->requests / r->wall_s : 0.0);
}

/* Write the generated workload to o (its file, opened by out_open(); standard
 * output when o->f is NULL): CLI_OK, or CLI_RUNTIME with the message printed
 * and a regular file left as it was, so that a write that fails (a full disk)
 * leaves no half-written trace that a later replay would read as the whole one. */
static int do_write(struct out_file *o, const struct trace *t) {
  FILE *f = o->f ? o->f : stdout;
  const char *path = o->f ? o->path : "-";
  errno = 0;
  int rc = trace_write(f, t), e = rc ? errno : 0; /* stdio leaves the failed write's errno (ENOSPC, EIO, ...) */
  if (f != stdout) {
    if (rc || e) {
      out_drop(o);
      if (!e) e = EIO;
    } else {
      e = out_commit(o);
    }
  } else if (fflush(f) && !e) {
    e = errno ? errno : EIO;
  }
  if (rc || e) {
    cli_error("replay: cannot write the workload to %s%s%s: %s", f == stdout ? "standard output ('" : "'", path,
              f == stdout ? "')" : "'", strerror(e ? e : EIO));
    return CLI_RUNTIME;
  }
  if (f != stdout) fprintf(stderr, "umbp: wrote %zu requests to %s\n", t->n, path);
  return CLI_OK;
}

/* Everything the command line says. */
struct replay_opts {
  struct rp_config cfg;
  struct gen_params gp;
  bool json, unbounded, have_cap, generate;
  uint64_t capacity;
  const char *path, *sweep_arg, *output, *plot_path, *csv_path;
};

/* Parse and cross-check the options into o: -1 to go on, or the exit code
 * (CLI_OK after --help, CLI_USAGE with the message printed). */
static int parse_opts(int argc, char **argv, struct replay_opts *o) {
  *o = (struct replay_opts){.cfg = {.tp = 1, .block_tokens = 512, .bytes_per_token = 128}};
  gen_params_init(&o->gp);
  bool gen_opt = false;
  const char *gen_opt_name = NULL;
  uint64_t v;
  double d;

  optind = 1;
  opterr = 0;
  int c, li = -1;
  char opt_name[48];
  while ((c = getopt_long(argc, argv, "h", long_opts, &li)) != -1) {
    /* the option itself ("--conversations"), not argv[optind - 1], which is
     * its value when given as a separate word; for an unknown one: the word */
    const char *name = optind > 1 && optind <= argc ? argv[optind - 1] : "";
    if (li >= 0 && c != '?') {
      snprintf(opt_name, sizeof opt_name, "--%s", long_opts[li].name);
      name = opt_name;
    }
    li = -1;
    switch (c) {
      case 'h':
        fputs(replay_usage, stdout);
        fputs(replay_usage_gen, stdout);
        fputs(replay_usage_out, stdout);
        return CLI_OK;
      case OPT_TP:
        if (parse_uint(optarg, 1, RP_MAX_TP, &v))
          return cli_usage_error("replay", "--tp '%s' is not a rank count: use 1 to %d", optarg, RP_MAX_TP);
        o->cfg.tp = (unsigned)v;
        break;
      case OPT_CAPACITY:
        if (cli_parse_size(optarg, &o->capacity) || !o->capacity)
          return cli_usage_error("replay", "--capacity '%s' is not a size: use e.g. 512MiB or 2GiB", optarg);
        o->have_cap = true;
        break;
      case OPT_UNBOUNDED: o->unbounded = true; break;
      case OPT_SWEEP: o->sweep_arg = optarg; break;
      case OPT_BLOCK_TOKENS:
        if (parse_uint(optarg, 1, 1u << 20, &v))
          return cli_usage_error("replay", "--block-tokens '%s' is not a block size: use 1 to %u tokens (512 for "
                                           "Mooncake's traces)", optarg, 1u << 20);
        o->cfg.block_tokens = (unsigned)v;
        break;
      case OPT_BPT:
        if (cli_parse_size(optarg, &v) || v == 0 || v > (1u << 24))
          return cli_usage_error("replay", "--bytes-per-token '%s' is not a size: use 1 to 16MiB, e.g. 128", optarg);
        o->cfg.bytes_per_token = v;
        break;
      case OPT_SPEED:
        if (parse_dbl(optarg, 0, 1e12, &d))
          return cli_usage_error("replay", "--speed '%s' is not a factor: use 0 (as fast as possible) or a positive "
                                           "number such as 10", optarg);
        o->cfg.speed = d;
        break;
      case OPT_WORKER_TIMEOUT:
        if (parse_uint(optarg, 1, 86400, &v))
          return cli_usage_error("replay", "--reply-timeout '%s' is not a time: use 1 to 86400 seconds", optarg);
        o->cfg.worker_timeout_s = (unsigned)v;
        break;
      case OPT_JSON: o->json = true; break;
      case OPT_PLOT: o->plot_path = optarg; break;
      case OPT_CSV: o->csv_path = optarg; break;
      case OPT_GENERATE:
        if (strcmp(optarg, "chat"))
          return cli_usage_error("replay", "--generate '%s' is not a generator: the one there is is 'chat'", optarg);
        o->generate = true;
        break;
      case OPT_OUTPUT: o->output = optarg; gen_opt = true; gen_opt_name = "--output"; break;
      case OPT_SEED:
        if (parse_uint(optarg, 0, UINT64_MAX, &v))
          return cli_usage_error("replay", "--seed '%s' is not a non-negative integer", optarg);
        o->gp.seed = v;
        gen_opt = true;
        gen_opt_name = "--seed";
        break;
      case OPT_CONV: case OPT_TURNS: case OPT_SYSP: case OPT_SYST: case OPT_USERT: case OPT_OUTT: {
        uint64_t lo = (c == OPT_SYSP || c == OPT_SYST || c == OPT_OUTT) ? 0 : 1;
        uint64_t hi = c == OPT_CONV ? 1000000 : c == OPT_TURNS ? 1000 : c == OPT_SYSP ? 100000 : 1000000;
        if (parse_uint(optarg, lo, hi, &v))
          return cli_usage_error("replay", "%s '%s' is out of range: use an integer from %llu to %llu", name, optarg,
                                 (unsigned long long)lo, (unsigned long long)hi);
        unsigned *dst = c == OPT_CONV ? &o->gp.conversations : c == OPT_TURNS ? &o->gp.turns : c == OPT_SYSP ? &o->gp.system_prompts
                        : c == OPT_SYST ? &o->gp.system_tokens : c == OPT_USERT ? &o->gp.user_tokens : &o->gp.output_tokens;
        *dst = (unsigned)v;
        gen_opt = true;
        gen_opt_name = name;
        break;
      }
      case OPT_RATE:
        if (parse_dbl(optarg, 1e-6, 1e6, &d) || d <= 0)
          return cli_usage_error("replay", "--rate '%s' is not a rate: use conversations per second > 0, e.g. 2", optarg);
        o->gp.rate = d;
        gen_opt = true;
        gen_opt_name = "--rate";
        break;
      case OPT_THINK:
        if (parse_dbl(optarg, 0, 1e6, &d))
          return cli_usage_error("replay", "--think '%s' is not a time: use seconds >= 0, e.g. 30", optarg);
        o->gp.think_s = d;
        gen_opt = true;
        gen_opt_name = "--think";
        break;
      default: {
        /* getopt_long() sets optopt both for a missing value and for a value
         * given to an option that takes none (--json=1) */
        bool wants_value = false;
        for (const struct option *lo = long_opts; lo->name; lo++)
          if (lo->val == optopt && optopt >= OPT_TP) wants_value = lo->has_arg == required_argument;
        if (wants_value) return cli_usage_error("replay", "option '%s' needs a value", name);
        return cli_bad_option("replay", long_opts, name);
      }
    }
  }
  o->path = optind < argc ? argv[optind] : NULL;
  if (gen_opt && !o->generate) return cli_usage_error("replay", "%s belongs to the generator: add --generate chat", gen_opt_name);
  if (optind + 1 < argc) return cli_usage_error("replay", "one trace file at most (got '%s' too)", argv[optind + 1]);
  if (o->path && o->generate)
    return cli_usage_error("replay", "give a TRACE file or --generate chat, not both");
  if (!o->path && !o->generate)
    return cli_usage_error("replay", "no workload: give a TRACE.jsonl file or --generate chat");
  if (o->path && !*o->path)
    return cli_usage_error("replay", "the TRACE file name is empty: give a JSONL trace file or --generate chat");
  if (o->output && !*o->output)
    return cli_usage_error("replay", "--output needs a file name ('-' for standard output)");
  if (o->output) { /* it writes the workload and exits: an option of the replay would be ignored */
    const char *ignored = o->json ? "--json" : o->have_cap ? "--capacity" : o->unbounded ? "--unbounded"
                          : o->sweep_arg ? "--capacity-sweep" : o->plot_path ? "--plot" : o->csv_path ? "--csv" : NULL;
    if (ignored)
      return cli_usage_error("replay", "--output writes the generated workload as JSONL and exits without a "
                                       "replay, so %s would be ignored: drop %s (or --output, to replay it)",
                             ignored, ignored);
  }
  if ((o->have_cap + o->unbounded + (o->sweep_arg != NULL)) > 1)
    return cli_usage_error("replay", "--capacity, --unbounded and --capacity-sweep exclude each other: pick one");
  if (!o->have_cap && !o->sweep_arg) o->unbounded = true;
  if ((o->plot_path && !*o->plot_path) || (o->csv_path && !*o->csv_path))
    return cli_usage_error("replay", "%s needs a file name", o->plot_path && !*o->plot_path ? "--plot" : "--csv");
  if ((o->plot_path || o->csv_path) && !o->sweep_arg)
    return cli_usage_error("replay", "%s draws the curve of a sweep: add --capacity-sweep LIST (e.g. "
                                     "256MiB,1GiB,4GiB,unbounded)", o->plot_path ? "--plot" : "--csv");
  /* the outputs are opened (truncated) before the trace is read: --csv naming the trace
   * destroyed it, and --plot and --csv naming one file wrote both into it */
  if (o->csv_path && same_regular_file(o->csv_path, o->path))
    return cli_usage_error("replay", "--csv %s is the trace file: writing the curve there would destroy the trace; "
                                     "give another file name", o->csv_path);
  if (o->plot_path && same_regular_file(o->plot_path, o->path))
    return cli_usage_error("replay", "--plot %s is the trace file: writing the curve there would destroy the trace; "
                                     "give another file name", o->plot_path);
  if (o->plot_path && o->csv_path && same_regular_file(o->plot_path, o->csv_path))
    return cli_usage_error("replay", "--plot and --csv name the same file (%s): give each its own", o->csv_path);

  return -1;
}

/* A rank's shard of a block and the pool's slot, into cfg: -1, or CLI_USAGE
 * with the message printed. */
static int size_blocks(struct rp_config *cfg) {
  uint64_t block_all = (uint64_t)cfg->block_tokens * cfg->bytes_per_token;
  cfg->block_bytes = (block_all + cfg->tp - 1) / cfg->tp;
  cfg->block_bytes = (cfg->block_bytes + 7) / 8 * 8;
  if (cfg->block_bytes > (1ull << 30))
    return cli_usage_error("replay", "a block shard of %llu bytes (block-tokens %u * bytes-per-token %llu / tp %u) is "
                                     "over 1 GiB: lower --bytes-per-token or --block-tokens",
                           (unsigned long long)cfg->block_bytes, cfg->block_tokens,
                           (unsigned long long)cfg->bytes_per_token, cfg->tp);
  cfg->slot_size = (cfg->block_bytes + 63) / 64 * 64;
  if (cfg->slot_size < 4096) cfg->slot_size = 4096;
  return -1;
}

/* The largest capacity in whole GiB whose slots (slot_size >= 4 KiB, so it
 * is at least 63 GiB) fit a pool's CLI_MAX_SLOTS: a value that parses back. */
static uint64_t max_slots_capacity(uint64_t slot_size) {
  return ((uint64_t)CLI_MAX_SLOTS * slot_size) >> 30 << 30;
}

/* The capacities to replay into caps and unb (SWEEP_MAX + 1 entries: a sweep
 * for --plot or --csv gains an unbounded reference run), their count into
 * *ret_n; an unbounded entry's capacity is 0 until the trace is read. -1, or
 * CLI_USAGE with the message printed. */
static int capacities(const struct replay_opts *o, uint64_t *caps, bool *unb, unsigned *ret_n) {
  unsigned ncap = 0;
  if (o->sweep_arg && !*o->sweep_arg)
    return cli_usage_error("replay", "--capacity-sweep '' is empty: give a list of sizes, e.g. 256MiB,1GiB,unbounded");
  if (o->sweep_arg) {
    const char *p = o->sweep_arg;
    while (*p) {
      const char *e = strchr(p, ',');
      size_t l = e ? (size_t)(e - p) : strlen(p);
      char tok[64];
      if (l == 0 || l >= sizeof tok || ncap == SWEEP_MAX)
        return cli_usage_error("replay", "--capacity-sweep '%s' is not a list of up to %d sizes: use e.g. "
                                         "256MiB,1GiB,unbounded", o->sweep_arg, SWEEP_MAX);
      memcpy(tok, p, l);
      tok[l] = 0;
      if (!strcmp(tok, "unbounded")) {
        unb[ncap] = true;
        caps[ncap++] = 0;
      } else if (cli_parse_size(tok, &caps[ncap]) || !caps[ncap]) {
        return cli_usage_error("replay", "--capacity-sweep: '%s' is not a size: use e.g. 256MiB,1GiB,unbounded", tok);
      } else {
        unb[ncap++] = false;
      }
      p += l;
      if (*p == ',') {
        p++;
        if (!*p) return cli_usage_error("replay", "--capacity-sweep '%s' ends with a comma", o->sweep_arg);
      }
    }
  } else {
    unb[0] = o->unbounded;
    caps[0] = o->capacity;
    ncap = 1;
  }
  unsigned nbounded = 0, nunb = 0;
  for (unsigned i = 0; i < ncap; i++) unb[i] ? nunb++ : nbounded++;
  if (o->plot_path && nbounded < 2)
    return cli_usage_error("replay", "--plot needs two capacities or more besides 'unbounded' in --capacity-sweep, "
                                     "e.g. 256MiB,1GiB,4GiB");
  if ((o->plot_path || o->csv_path) && !nunb) { /* the reference the curve is judged against */
    unb[ncap] = true;
    caps[ncap++] = 0;
  }

  for (unsigned i = 0; i < ncap; i++)
    if (!unb[i] && caps[i] / o->cfg.slot_size > CLI_MAX_SLOTS) {
      /* the slot size follows from --block-tokens, --bytes-per-token and --tp: replay has no --slot-size */
      char a[32], b[32], c[32];
      return cli_usage_error("replay", "capacity %s holds %llu slots of %s: a pool has at most %u; use a capacity "
                                       "of at most %s, or larger slots (--bytes-per-token)",
                             cli_fmt_size(caps[i], a, sizeof a), (unsigned long long)(caps[i] / o->cfg.slot_size),
                             cli_fmt_size(o->cfg.slot_size, b, sizeof b), CLI_MAX_SLOTS,
                             cli_fmt_size_arg(max_slots_capacity(o->cfg.slot_size), c, sizeof c));
    } else if (!unb[i] && caps[i] / o->cfg.slot_size < (o->cfg.tp < 2 ? 2 : o->cfg.tp)) {
      /* a pool needs two slots per partition (umbp_layout_compute): refused
       * here, naming the option, rather than by the pool after the trace is
       * read and earlier steps of a sweep have run */
      char a[32], b[32];
      return cli_usage_error("replay", "%s: capacity %s holds %llu slots of %s, and a pool needs %u (one per rank, "
                             "and at least 2): use a larger capacity", o->sweep_arg ? "--capacity-sweep" : "--capacity",
                             cli_fmt_size(caps[i], a, sizeof a), (unsigned long long)(caps[i] / o->cfg.slot_size),
                             cli_fmt_size(o->cfg.slot_size, b, sizeof b), o->cfg.tp < 2 ? 2 : o->cfg.tp);
    }
  *ret_n = ncap;
  return -1;
}

/* The sweep's curve: its points, the unbounded run's cache ratio and the
 * first point reaching 95% of it (-1: none); have is false without a sweep or
 * an unbounded run. */
struct curve_sum {
  const struct curve_point *pts;
  double unb_ratio;
  int knee;
  bool have;
};

/* --json: the setup, the curve's summary and the run (or each of a sweep). */
static int report_json(const struct rp_config *cfg, uint64_t distinct, const struct rp_result *res, unsigned ran,
                       bool sweep, const struct curve_sum *k) {
  struct jb j;
  jb_begin(&j, stdout);
  jb_obj(&j, NULL);
  jb_str(&j, "trace", cfg->trace_name);
  jb_u64(&j, "tp", cfg->tp);
  jb_u64(&j, "block_tokens", cfg->block_tokens);
  jb_u64(&j, "bytes_per_token", cfg->bytes_per_token);
  jb_u64(&j, "block_bytes_per_rank", cfg->block_bytes);
  jb_u64(&j, "slot_size", cfg->slot_size);
  jb_u64(&j, "distinct_blocks", distinct);
  if (k->have) {
    jb_dbl(&j, "unbounded_cache_ratio", k->unb_ratio);
    if (k->knee >= 0) jb_u64(&j, "capacity_for_95pct_bytes", k->pts[k->knee].capacity);
    else jb_null(&j, "capacity_for_95pct_bytes");
  }
  if (sweep) {
    jb_arr(&j, "sweep");
    for (unsigned i = 0; i < ran; i++) {
      jb_obj(&j, NULL);
      json_run(&j, cfg, &res[i]);
      jb_end_obj(&j);
    }
    jb_end_arr(&j);
  } else {
    json_run(&j, cfg, &res[0]);
  }
  jb_end_obj(&j);
  return jb_finish(&j); /* -ENOMEM (reported) or -EIO: checked by the caller through stdout's error flag */
}

/* The table of a sweep and the capacity reaching 95% of the unbounded ratio;
 * plot_path and csv_path are the files written (NULL: none, or the write
 * failed), named only once they are closed. */
static void report_sweep(const struct rp_config *cfg, const struct rp_result *res, unsigned ran,
                         const struct curve_sum *k, const char *plot_path, const char *csv_path) {
  char a[32];
  const struct rp_result *r0 = &res[0];
  printf("requests     %llu, average input %.2f tokens, average output %.2f tokens\n",
         (unsigned long long)r0->requests, ratio(r0->input_tokens, r0->requests),
         ratio(r0->output_tokens, r0->requests));
  printf("\n%-22s %10s %12s %12s %12s %10s\n", "capacity", "slots", "cache ratio", "token ratio", "evictions",
         "wall");
  for (unsigned i = 0; i < ran; i++) {
    const struct rp_result *r = &res[i];
    char cap[40];
    if (r->unbounded) snprintf(cap, sizeof cap, "%s (unbounded)", cli_fmt_size(r->capacity, a, sizeof a));
    else cli_fmt_size(r->capacity, cap, sizeof cap);
    printf("%-22s %10llu %11.2f%% %11.2f%% %12llu %9.2fs\n", cap, (unsigned long long)r->slots,
           100 * ratio(r->blocks_hit, r->blocks_total),
           100 * ratio(r->blocks_hit * cfg->block_tokens, r->input_tokens), (unsigned long long)r->evictions,
           r->wall_s);
  }
  if (k->have && k->knee >= 0)
    printf("\n95%% of the unbounded cache ratio (%.2f%%) is reached at %s (%.2f%%)\n", 100 * k->unb_ratio,
           cli_fmt_size(k->pts[k->knee].capacity, a, sizeof a), 100 * k->pts[k->knee].cache_ratio);
  else if (k->have && k->unb_ratio <= 0)
    printf("\nno block of the trace is used twice, so no capacity gets a hit (unbounded cache ratio 0.00%%): "
           "a trace of requests that share prefixes (--synthetic, or a serving trace) shows what a pool buys\n");
  else if (k->have)
    printf("\nno capacity of the sweep reaches 95%% of the unbounded cache ratio (%.2f%%): add larger ones\n",
           100 * k->unb_ratio);
  if (plot_path) printf("curve drawn in %s\n", plot_path);
  if (csv_path) printf("curve written to %s\n", csv_path);
}

int cmd_replay(int argc, char **argv) {
  if (argc >= 2 && !strcmp(argv[1], "--worker")) return rp_worker_main(argc, argv);

  struct replay_opts o;
  int prc = parse_opts(argc, argv, &o);
  if (prc < 0) prc = size_blocks(&o.cfg);
  uint64_t caps[SWEEP_MAX + 1]; /* + the unbounded run that --plot and --csv add */
  bool unb[SWEEP_MAX + 1];
  unsigned ncap = 0;
  if (prc < 0) prc = capacities(&o, caps, unb, &ncap);
  if (prc >= 0) return prc;
  struct rp_config cfg = o.cfg;
  struct gen_params gp = o.gp;
  bool json = o.json, generate = o.generate;
  const char *path = o.path, *sweep_arg = o.sweep_arg, *output = o.output, *plot_path = o.plot_path,
             *csv_path = o.csv_path;
  uint64_t block_all = (uint64_t)cfg.block_tokens * cfg.bytes_per_token;

  /* the output files are opened before the replays, so a bad path costs no run; --output only once
   * the workload is made, so that a generation that fails leaves an existing FILE as it was
   * ('-' is standard output) */
  struct out_file plot = {.path = plot_path}, csvo = {.path = csv_path};
  struct out_file gen_out = {.path = output && strcmp(output, "-") ? output : NULL};
  if (out_open(&plot, "--plot")) return CLI_RUNTIME;
  if (out_open(&csvo, "--csv")) {
    drop_outputs(&plot, &csvo);
    return CLI_RUNTIME;
  }
  drop_on_signal(&plot, &csvo, &gen_out);

  /* the workload */
  struct trace t;
  trace_init(&t);
  char err[768];
  if (generate) {
    int rc = gen_chat(&gp, cfg.block_tokens, &t, err, sizeof err);
    if (rc) {
      cli_error("replay: %s", rc == -ENOMEM ? "out of memory generating the workload" : err);
      trace_free(&t);
      drop_outputs(&plot, &csvo);
      return rc == -EINVAL ? CLI_USAGE : CLI_RUNTIME;
    }
    if (output) {
      if (out_open(&gen_out, "--output")) {
        trace_free(&t);
        return CLI_RUNTIME;
      }
      drop_on_signal(&plot, &csvo, &gen_out);
      int r = do_write(&gen_out, &t);
      trace_free(&t);
      return r;
    }
    cfg.trace_name = "generated chat workload";
  } else {
    int rc = trace_load(path, cfg.block_tokens, &t, err, sizeof err);
    if (rc) {
      cli_error("replay: %s", rc == -ENOMEM ? "out of memory reading the trace" : err);
      trace_free(&t);
      drop_outputs(&plot, &csvo);
      return CLI_RUNTIME;
    }
    cfg.trace_name = path;
  }
  uint64_t distinct = trace_distinct_whole(&t);
  for (unsigned i = 0; i < ncap; i++)
    if (unb[i]) caps[i] = (distinct * cfg.tp + 64) * cfg.slot_size; /* + headroom for partition rounding */
  if (distinct * cfg.tp + 64 > CLI_MAX_SLOTS)
    for (unsigned i = 0; i < ncap; i++)
      if (unb[i]) { /* no capacity was given: the fix is one that evicts, or fewer ranks */
        char a[32];
        cli_error("replay: the unbounded pool needs %llu slots (%llu distinct blocks on each of %u ranks, + 64): a "
                  "pool has at most %u; replay with --capacity or --capacity-sweep of at most %s%s",
                  (unsigned long long)(distinct * cfg.tp + 64), (unsigned long long)distinct, cfg.tp, CLI_MAX_SLOTS,
                  cli_fmt_size_arg(max_slots_capacity(cfg.slot_size), a, sizeof a),
                  cfg.tp > 1 ? ", or with fewer ranks (--tp)" : "");
        trace_free(&t);
        drop_outputs(&plot, &csvo);
        return CLI_RUNTIME;
      }
  cfg.progress = cli_stderr_tty();

  char a[32], b[32];
  if (!json) {
    printf("umbp replay: %s\n", cfg.trace_name);
    if (generate)
      printf("workload     chat, seed %llu: %u conversations of 1-%u turns, %u system prompts of ~%u tokens, "
             "user ~%u, answers ~%u tokens\n",
             (unsigned long long)gp.seed, gp.conversations, gp.turns, gp.system_prompts, gp.system_tokens,
             gp.user_tokens, gp.output_tokens);
    printf("setup        %zu requests, tp %u, %u-token blocks, %llu bytes/token: %s per block, %s per rank; "
           "%llu distinct blocks\n",
           t.n, cfg.tp, cfg.block_tokens, (unsigned long long)cfg.bytes_per_token,
           cli_fmt_size(block_all, a, sizeof a), cli_fmt_size(cfg.block_bytes, b, sizeof b),
           (unsigned long long)distinct);
    if (stdout_check(0)) { /* a full or closed stdout: fail now, not after the runs */
      trace_free(&t);
      drop_outputs(&plot, &csvo);
      return CLI_RUNTIME;
    }
  }

  struct rp_result *res = calloc(ncap, sizeof *res);
  if (!res) {
    trace_free(&t);
    cli_error("replay: out of memory");
    drop_outputs(&plot, &csvo);
    return CLI_RUNTIME;
  }
  int rc = 0;
  unsigned ran = 0;
  for (unsigned i = 0; i < ncap && !rc; i++, ran++) {
    if (sweep_arg && !json && cfg.progress)
      fprintf(stderr, "umbp: sweep step %u of %u: %s\n", i + 1, ncap,
              unb[i] ? "unbounded" : cli_fmt_size(caps[i], a, sizeof a));
    rc = rp_run(&cfg, &t, caps[i], unb[i], i, &res[i]);
  }
  if (rc) {
    free(res);
    trace_free(&t);
    drop_outputs(&plot, &csvo);
    return rc;
  }

  /* the curve: the capacity reaching 95% of the unbounded ratio, the files */
  struct curve_point pts[SWEEP_MAX + 1];
  for (unsigned i = 0; i < ran; i++)
    pts[i] = (struct curve_point){.capacity = res[i].capacity,
                                  .slots = res[i].slots,
                                  .unbounded = res[i].unbounded,
                                  .cache_ratio = ratio(res[i].blocks_hit, res[i].blocks_total),
                                  .token_ratio = ratio(res[i].blocks_hit * cfg.block_tokens, res[i].input_tokens),
                                  .blocks_hit = res[i].blocks_hit,
                                  .blocks_total = res[i].blocks_total,
                                  .evictions = res[i].evictions};
  double unb_ratio = 0;
  int knee = -1;
  bool have_knee = sweep_arg && curve_knee(pts, ran, 0.95, &unb_ratio, &knee) == 0;
  /* a file is named as written only once fclose (which flushes) succeeded */
  int out_rc = CLI_OK;
  if (plot.f) {
    char title[300];
    snprintf(title, sizeof title, "%s (tp %u, %u-token blocks)", cfg.trace_name, cfg.tp, cfg.block_tokens);
    if (out_close(&plot, curve_svg(plot.f, pts, ran, knee, title), "--plot")) {
      out_rc = CLI_RUNTIME;
      plot_path = NULL;
    }
  }
  if (csvo.f && out_close(&csvo, curve_csv(csvo.f, pts, ran), "--csv")) {
    out_rc = CLI_RUNTIME;
    csv_path = NULL;
  }

  struct curve_sum k = {.pts = pts, .unb_ratio = unb_ratio, .knee = knee, .have = have_knee};
  int out_errno = 0;
  if (json) {
    errno = 0;
    int jr = report_json(&cfg, distinct, res, ran, sweep_arg != NULL, &k);
    if (jr == -ENOMEM) out_rc = CLI_RUNTIME;
    else if (jr) out_errno = errno;
  } else if (sweep_arg) {
    report_sweep(&cfg, res, ran, &k, plot_path, csv_path);
  } else {
    print_run(&cfg, &res[0]);
  }
  if (stdout_check(out_errno)) out_rc = CLI_RUNTIME;
  for (unsigned i = 0; i < ran; i++)
    if (res[i].unbounded && res[i].evictions)
      cli_error("replay: warning: %llu evictions in an unbounded run (capacity %s): this is a bug, please report it",
                (unsigned long long)res[i].evictions, cli_fmt_size(res[i].capacity, a, sizeof a));
  free(res);
  trace_free(&t);
  return out_rc;
}
