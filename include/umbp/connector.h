/* SPDX-License-Identifier: Apache-2.0 */
/*
 * umbp/connector.h — the serving-engine side of umbp: what vLLM's
 * UMBPStoreConnector (python/umbp/vllm.py) needs besides the index and the
 * data path, in C so that it is usable and tested without Python.
 *
 * Design note.
 *
 * Keys. A vLLM block is identified by (namespace, tp/pcp/dcp/pp rank, KV-cache
 * group, block hash). The namespace is derived from everything that changes
 * the bytes of a block — model, revision, block size, cache layout, the dtype
 * of every group, TP/PP/PCP/DCP sizes and the draft model — or given
 * explicitly (`key_namespace`). The data-parallel rank is deliberately not
 * part of it: DP engines serving the same model compute the same bytes for the
 * same prefix and so share blocks. umbp_conn_key_encode() is a fixed,
 * endian-independent byte format (little-endian integers) for carrying a key
 * between processes (scheduler → worker metadata); umbp_key itself is a
 * host struct.
 *
 * Matching. A prompt's block i counts as a pool hit only when every rank's
 * key of block i is present and every block before it counts too (prefix
 * order: a block whose predecessor is missing cannot be used, attention needs
 * the whole prefix). At most (prompt_tokens - 1) / block_size blocks are
 * considered, so the last prompt token is always computed (vLLM needs logits
 * for it). Tokens the GPU prefix cache already holds are not loaded again:
 * the result is hit_tokens - computed_tokens, or 0.
 *
 * Events. umbp_conn_events keeps the KV events of the connector in order.
 * add() merges duplicates: an event equal to one already held is dropped (a
 * TP step reports the same BlockStored from every worker); append() keeps
 * repeats (the same block stored again in a later step is a new event).
 * Events are records {type, group, hash, tag}; `tag` is the caller's handle
 * on a richer object (the Python layer maps tags to vLLM event objects) and
 * takes part in equality.
 *
 * Stats. umbp_conn_stats counts load and store jobs × submitted / completed /
 * failed / bytes with relaxed atomics (they are statistics: no ordering is
 * promised between counters); snapshots merge by addition.
 *
 * Threads. Codec, namespace and matching functions are pure or only read the
 * pool (any thread). An events object is not thread-safe (one owner, as in
 * vLLM's scheduler). A stats object may be updated by any thread.
 */
#ifndef UMBP_CONNECTOR_H
#define UMBP_CONNECTOR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "umbp/index.h"
#include "umbp/pool.h"
#include "umbp/common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- block key codec ------------------------------------------------------ */
/* Encoded size: ns(4) tp(2) pcp(2) dcp(2) pp(2) group(2) hash_len(1) hash. */
#define UMBP_CONN_KEY_HDR 15
#define UMBP_CONN_KEY_MAX (UMBP_CONN_KEY_HDR + UMBP_KEY_HASH_MAX)

/* Bytes umbp_conn_key_encode() writes for key: UMBP_CONN_KEY_HDR + hash_len. */
UMBP_API size_t umbp_conn_key_size(const umbp_key *key);
/* Encode key into buf[0..n). Returns the number of bytes written (> 0), or
 * -EINVAL (hash_len not 1..32) or -ENOBUFS (n too small). Any thread. */
UMBP_API int umbp_conn_key_encode(const umbp_key *key, uint8_t *buf, size_t n);
/* Decode a key from buf[0..n). Returns the bytes consumed (> 0) and
 * *ret_key, or -EBADMSG (truncated, hash_len out of range) or -EINVAL (NULL
 * buf or ret_key). Any thread. */
UMBP_API int umbp_conn_key_decode(const uint8_t *buf, size_t n, umbp_key *ret_key);

/* Build keys[i] = {ns, ranks of tmpl, group of tmpl, hashes[i]} for i < n.
 * hashes is n * hash_len bytes back to back; a hash longer than 32 bytes is
 * folded to 32 (BLAKE-free: FNV-based, stable across processes and builds).
 * 0 or -EINVAL. Any thread. */
UMBP_API int umbp_conn_keys_build(const umbp_key *tmpl, unsigned n, const uint8_t *hashes,
                                  size_t hash_len, umbp_key *keys);

/* ---- namespace derivation ------------------------------------------------- */
#define UMBP_CONN_MAX_GROUPS 32
#define UMBP_CONN_NS_MAX 128

typedef struct umbp_conn_ns_params {
  const char *key_namespace; /* explicit namespace: used verbatim when non-NULL/non-empty */
  const char *model;         /* model name or path */
  const char *revision;      /* NULL: none */
  uint32_t block_size;       /* tokens per block */
  const char *cache_layout;  /* e.g. "NHD", "HND"; NULL: "" */
  const char *dtypes[UMBP_CONN_MAX_GROUPS]; /* KV dtype per group */
  unsigned n_groups;
  uint32_t tp_size, pp_size, pcp_size, dcp_size; /* 0 counts as 1 */
  const char *draft_model;   /* NULL: none */
  /* The data-parallel size/rank is not a field on purpose (see design note). */
} umbp_conn_ns_params;

/* Write the namespace name for p into buf[0..n) (NUL-terminated): the explicit
 * key_namespace, or "vllm-" followed by 32 hex digits of a 128-bit hash of a
 * canonical serialisation of every field. Returns its length (> 0), -EINVAL
 * (missing model or block size, an explicit namespace longer than 128 bytes
 * or with white space or a control character, n_groups over 32) or
 * -ENOBUFS. Any thread. */
UMBP_API int umbp_conn_ns_derive(const umbp_conn_ns_params *p, char *buf, size_t n);

/* ---- matched tokens ------------------------------------------------------- */
/* Pure part of the matched-token rule. hit_blocks[r] is how many leading
 * blocks rank r holds (already in prefix order), for r < n_ranks. Returns the
 * number of tokens the pool can provide beyond computed_tokens:
 *   usable = min(min_r hit_blocks[r], (prompt_tokens - 1) / block_size)
 *   result = max(0, usable * block_size - computed_tokens)
 * and writes the usable block count to *ret_blocks when non-NULL. Returns
 * -EINVAL for block_size 0 or n_ranks 0. Any thread. */
UMBP_API int64_t umbp_conn_matched_tokens(const uint32_t *hit_blocks, unsigned n_ranks,
                                          uint32_t block_size, uint64_t prompt_tokens,
                                          uint64_t computed_tokens, uint32_t *ret_blocks);

/* Probe the pool: for each rank r < n_ranks, keys are {ranks[r] (ns, ranks
 * and group taken from it), hashes[i]}, i < n_blocks (hashes as for
 * umbp_conn_keys_build); the leading run present for every rank is combined by
 * umbp_conn_matched_tokens(). Only the blocks that can count are probed.
 * Returns the token count (>= 0) and *ret_blocks, or -EINVAL / -ENOMEM. A
 * probe error for one rank counts as a miss (no hit), never as a failure.
 * Any thread; read-only pool handles too. */
UMBP_API int64_t umbp_conn_probe_matched(umbp_pool *pool, const umbp_key *ranks, unsigned n_ranks,
                                         const uint8_t *hashes, size_t hash_len, unsigned n_blocks,
                                         uint32_t block_size, uint64_t prompt_tokens,
                                         uint64_t computed_tokens, uint32_t *ret_blocks);

/* ---- KV events ------------------------------------------------------------ */
enum umbp_conn_event_type { UMBP_CONN_EV_STORED = 1, UMBP_CONN_EV_REMOVED = 2 };

typedef struct umbp_conn_event {
  int type;        /* enum umbp_conn_event_type */
  uint16_t group;
  uint8_t hash_len;
  uint8_t hash[UMBP_KEY_HASH_MAX];
  uint64_t tag;    /* caller's handle; part of equality */
} umbp_conn_event;

typedef struct umbp_conn_events umbp_conn_events;

/* New empty container with one worker: 0 and *ret (the caller owns it; free
 * with umbp_conn_events_free()), -EINVAL (NULL ret) or -ENOMEM. */
UMBP_API int umbp_conn_events_create(umbp_conn_events **ret);
/* Free ev and the events it holds. Accepts NULL. Its owner thread only, after
 * its last use. */
UMBP_API void umbp_conn_events_free(umbp_conn_events *ev);
/* Merge ev[0..n): each event not equal to one held already (or earlier in
 * the same batch) is appended in order. Returns how many were appended, or
 * -EINVAL / -ENOMEM. */
UMBP_API int umbp_conn_events_add(umbp_conn_events *ev, const umbp_conn_event *evs, unsigned n);
/* Append ev[0..n) keeping repeats. Returns n or -EINVAL / -ENOMEM. */
UMBP_API int umbp_conn_events_append(umbp_conn_events *ev, const umbp_conn_event *evs, unsigned n);
/* Number of events held. */
UMBP_API unsigned umbp_conn_events_count(const umbp_conn_events *ev);
/* Copy up to max held events (in order) into out; returns the full count. */
UMBP_API unsigned umbp_conn_events_get(const umbp_conn_events *ev, umbp_conn_event *out, unsigned max);
/* Move up to max events into out and drop the ones copied (the rest stay, in
 * order); returns how many were copied. */
UMBP_API unsigned umbp_conn_events_pop_common(umbp_conn_events *ev, umbp_conn_event *out, unsigned max);
/* Add count (> 0) workers: 0, or -EINVAL when count <= 0 (nothing changes). */
UMBP_API int umbp_conn_events_increment_workers(umbp_conn_events *ev, int count);
/* Workers whose events were added since the last reset (>= 1), 0 for NULL. */
UMBP_API unsigned umbp_conn_events_workers(const umbp_conn_events *ev);
/* The events are already merged when added: reset the worker count to 1. */
UMBP_API void umbp_conn_events_aggregate(umbp_conn_events *ev);
/* Drop every event and reset the worker count to 1. */
UMBP_API void umbp_conn_events_clear(umbp_conn_events *ev);

/* ---- stats ---------------------------------------------------------------- */
enum umbp_conn_op { UMBP_CONN_LOAD = 0, UMBP_CONN_STORE = 1, UMBP_CONN_N_OPS = 2 };

typedef struct umbp_conn_stats_snapshot {
  uint64_t submitted[UMBP_CONN_N_OPS]; /* blocks submitted */
  uint64_t completed[UMBP_CONN_N_OPS]; /* blocks that succeeded */
  uint64_t failed[UMBP_CONN_N_OPS];    /* blocks that failed */
  uint64_t bytes[UMBP_CONN_N_OPS];     /* bytes of completed blocks */
} umbp_conn_stats_snapshot;

typedef struct umbp_conn_stats umbp_conn_stats;

/* New zeroed counters: 0 and *ret (the caller owns it; free with
 * umbp_conn_stats_free()), -EINVAL (NULL ret) or -ENOMEM. */
UMBP_API int umbp_conn_stats_create(umbp_conn_stats **ret);
/* Free st. Accepts NULL. No thread may still update it. */
UMBP_API void umbp_conn_stats_free(umbp_conn_stats *st);
/* Count a finished or submitted batch: -EINVAL for an op out of range. */
UMBP_API int umbp_conn_stats_add(umbp_conn_stats *st, int op, uint64_t submitted,
                                 uint64_t completed, uint64_t failed, uint64_t bytes);
/* Read the counters; with reset, subtract what was read (increments racing
 * the call are kept for the next read). */
UMBP_API void umbp_conn_stats_read(umbp_conn_stats *st, bool reset, umbp_conn_stats_snapshot *ret);
/* dst += src, field by field. */
UMBP_API void umbp_conn_stats_merge(umbp_conn_stats_snapshot *dst, const umbp_conn_stats_snapshot *src);
/* True when every counter is 0. */
UMBP_API bool umbp_conn_stats_empty(const umbp_conn_stats_snapshot *s);

#ifdef __cplusplus
}
#endif
#endif
