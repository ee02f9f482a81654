/* SPDX-License-Identifier: Apache-2.0 */
/*
 * replay.h — `umbp replay`: the scheduler, the worker processes, the pipe
 * protocol between them, and the block contents both sides agree on.
 *
 * Processes. The scheduler creates a fresh pool, registers namespace
 * "replay", and forks+execs N workers (`/proc/self/exe replay --worker ...`),
 * one per TP rank. Each worker attaches as UMBP_ROLE_WORKER with its rank and
 * owns a private buffer that stands in for its GPU's KV cache.
 *
 * Per request (the scheduler waits for every reply of a phase before the next
 * one, so a replay is a deterministic function of the trace and the sizes):
 *   1. probe: umbp_prefix_probe() once per rank over the request's whole
 *      blocks (rank r > 0 only over the prefix found so far): hit = the
 *      longest prefix present on every rank;
 *   2. load (hit > 0): every worker pins the hit blocks of its rank, copies
 *      them into its buffer, unpins, and verifies every byte;
 *   3. store (whole blocks after the hit prefix): every worker fills its
 *      buffer with the blocks' bytes, reserves slots, copies, publishes.
 *      With a bounded pool the ranks store one after another in rank order,
 *      so the CLOCK evictions they trigger happen in the same order on every
 *      run; with an unbounded pool nothing is evicted and they store at once.
 * No worker reserves during a load phase, so nothing is evicted between the
 * probe and the pins: a hit block that is not found when pinned is a bug.
 *
 * Pipes. Scheduler -> worker i on the worker's fd 3, worker -> scheduler on
 * its fd 4. A message is struct rp_msg followed by n little-endian u64 block
 * ids; a reply is one struct rp_reply. Both ends are the same binary, so the
 * structs travel in host layout.
 */
#ifndef UMBP_TOOLS_REPLAY_REPLAY_H
#define UMBP_TOOLS_REPLAY_REPLAY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "replay/trace.h"
#include "umbp/index.h"

#define RP_NS_NAME "replay"
#define RP_MAX_TP 32
#define RP_WORKER_IN_FD 3
#define RP_WORKER_OUT_FD 4
/* Test hook: "RANK:K" makes worker RANK raise SIGKILL when its (K+1)-th
 * request arrives. Read by the workers only. */
#define RP_TEST_KILL_ENV "UMBP_REPLAY_TEST_KILL"

enum rp_msg_type { RP_MSG_READY = 0, RP_MSG_LOAD = 1, RP_MSG_STORE = 2, RP_MSG_QUIT = 3 };

struct rp_msg {
  uint32_t type;
  uint32_t n;     /* block ids that follow */
  uint64_t seq;   /* request index */
};

struct rp_reply {
  uint32_t type;
  int32_t status;     /* 0, or -errno: the worker printed why on stderr */
  uint64_t seq;
  uint32_t ok;        /* blocks loaded (verified) or stored (published) */
  uint32_t dup;       /* store: already present (-EEXIST) */
  uint32_t bad;       /* load: blocks whose bytes did not verify */
  uint32_t unstored;  /* store: no slot could be reserved */
  uint64_t copy_ns;   /* time inside the copies between pool and buffer */
  uint64_t bytes;     /* bytes copied */
};

/* ---- block keys and contents ---------------------------------------------- */
static inline uint64_t rp_mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

/* The key of block `id` on TP rank `rank`: the id as 8 little-endian bytes. */
static inline void rp_key(umbp_key *k, uint32_t ns, unsigned rank, uint64_t id) {
  memset(k, 0, sizeof *k);
  k->ns = ns;
  k->tp_rank = (uint16_t)rank;
  k->hash_len = 8;
  for (int i = 0; i < 8; i++) k->hash[i] = (uint8_t)(id >> (8 * i));
}

static inline uint64_t rp_seed(uint64_t id, unsigned rank) {
  return rp_mix(id ^ rp_mix(0x72616e6b00000000ull | rank));
}

/* Fill n bytes (a multiple of 8) with block id's shard for rank. */
static inline void rp_fill(void *dst, size_t n, uint64_t id, unsigned rank) {
  uint64_t s = rp_seed(id, rank), *w = dst;
  for (size_t i = 0; i < n / 8; i++) w[i] = rp_mix(s + i);
}

/* Byte offset of the first byte that differs from rp_fill's, or -1. */
static inline long rp_verify(const void *src, size_t n, uint64_t id, unsigned rank) {
  uint64_t s = rp_seed(id, rank);
  const uint64_t *w = src;
  for (size_t i = 0; i < n / 8; i++)
    if (w[i] != rp_mix(s + i)) {
      uint64_t x = w[i] ^ rp_mix(s + i);
      return (long)(i * 8 + (size_t)(__builtin_ctzll(x) / 8));
    }
  return -1;
}

/* ---- the scheduler ---------------------------------------------------------- */
/* How long the scheduler waits for a worker's reply before it says which
 * rank it waits for, and (default) before it gives up. */
#define RP_WAIT_NOTE_S 5
#define RP_WORKER_TIMEOUT_DEFAULT_S 60

struct rp_config {
  const char *trace_name;    /* shown in the summary */
  unsigned tp;
  unsigned block_tokens;
  uint64_t bytes_per_token;
  uint64_t block_bytes;      /* bytes of one block on one rank (payload) */
  uint64_t slot_size;        /* pool slot: block_bytes rounded up to 64, >= 4096 */
  double speed;              /* 0: as fast as possible */
  unsigned worker_timeout_s; /* a rank silent this long fails the replay (0: default) */
  bool progress;             /* draw progress on stderr */
};

struct rp_result {
  uint64_t capacity;         /* bytes of slots asked for */
  uint64_t slots;
  uint64_t segment_bytes;    /* the pool's whole segment */
  bool unbounded;
  uint64_t requests, input_tokens, output_tokens;
  uint64_t blocks_total, blocks_hit;
  uint64_t blocks_stored, blocks_dup, blocks_unstored, blocks_loaded;
  uint64_t bytes_stored, bytes_loaded;
  uint64_t verify_failures;
  uint64_t evictions;
  uint64_t keys_probed, probe_ns;
  uint64_t copy_bytes, copy_ns;
  double pool_p50_ms, pool_p99_ms;
  double wall_s;
};

/* Outcome of rp_run() besides 0: */
#define RP_ERR_RUNTIME 1           /* printed; exit 1 */
#define RP_ERR_SIGNAL(sig) (128 + (sig))

/* Replay trace t through a fresh pool of `capacity` bytes of slots (label
 * `step` makes the pool name unique within one invocation). argv0 is how the
 * workers are exec'd. Returns 0 and fills res, or an exit code (1, 130, 143)
 * after printing why; the pool is destroyed and the workers reaped either
 * way. */
int rp_run(const struct rp_config *cfg, const struct trace *t, uint64_t capacity, bool unbounded, unsigned step,
           struct rp_result *res);

/* The hidden `umbp replay --worker ...` mode. Returns the exit code. */
int rp_worker_main(int argc, char **argv);

#endif
