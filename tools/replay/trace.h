/* SPDX-License-Identifier: Apache-2.0 */
/*
 * trace.h — serving traces in Mooncake's JSONL format, parsed with jansson,
 * and the chat workload generator that writes the same format.
 *
 * One request per line: {"timestamp": MS, "input_length": TOKENS,
 * "output_length": TOKENS, "hash_ids": [ID, ...]} with one id per block of
 * the prompt (the last one may cover a partial block). Unknown fields of any
 * JSON type are skipped. The parser is written for hostile input: nesting and
 * ids per request are limited, and a syntax error names the line, the column
 * and what was expected (jansson's words); a field of the wrong type or range
 * names the field.
 */
#ifndef UMBP_TOOLS_REPLAY_TRACE_H
#define UMBP_TOOLS_REPLAY_TRACE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

struct trace_req {
  double timestamp_ms;   /* 0 when the line has none */
  uint64_t input_len;    /* tokens */
  uint64_t output_len;   /* tokens */
  size_t ids_off;        /* first id in trace.ids */
  uint32_t n_ids;        /* ids listed (whole blocks + at most one partial) */
  uint32_t n_whole;      /* whole blocks: min(n_ids, input_len / block_tokens) */
};

struct trace {
  struct trace_req *req;
  size_t n, cap;
  uint64_t *ids;
  size_t n_ids, ids_cap;
  uint32_t max_whole;    /* largest n_whole of any request */
};

/* Limits that keep a hostile trace from exhausting memory. */
#define TRACE_MAX_IDS_PER_REQ (1u << 20)
#define TRACE_MAX_DEPTH 64
/* Largest output_length (tokens). The replay sums output lengths into 64 bits;
 * a request's input_length is bounded by its ids, but nothing bounds
 * output_length, and two lines of 2^63 tokens would wrap the sum to 0. 2^32
 * tokens per request keeps the sum exact for any trace that fits in memory
 * (2^32 requests of 40 bytes each). */
#define TRACE_MAX_OUTPUT_TOKENS (1ull << 32)
/* Longest line trace_load reads, its newline excluded. A real trace's lines
 * are a few KB (the longest of Mooncake's synthetic trace is 2,698 bytes); the
 * longest a request can legally be is TRACE_MAX_IDS_PER_REQ ids of 20 digits
 * and ", " each, about 22 MiB. 32 MiB holds that, and a file with no newline
 * (/dev/zero, a binary) fails after 32 MiB read instead of growing one line
 * until memory runs out. */
#define TRACE_MAX_LINE (32u << 20)

void trace_init(struct trace *t);
void trace_free(struct trace *t);

/* Parse one line (len bytes, need not be NUL-terminated) and append the
 * request to t. Returns 0, 1 for a blank line (nothing appended), or -EINVAL
 * with a message in err ("column 17: ':' expected near '5'", "input_length
 * must be a non-negative integer, found -5"), or -ENOMEM. block_tokens is used for the whole-block count and the check that
 * hash_ids covers input_length. */
int trace_parse_line(struct trace *t, const char *line, size_t len, unsigned block_tokens, char *err, size_t errlen);

/* Read a whole file: a regular file, a pipe or a socket (a directory or a
 * device is refused before any read), lines of at most TRACE_MAX_LINE bytes.
 * 0, or -errno with "FILE:LINE: ..." (or the open error) in err: -EINVAL for a
 * malformed line, a line over TRACE_MAX_LINE, a device or an empty trace,
 * -EISDIR for a directory, -ENOMEM, -EIO for a read error. */
int trace_load(const char *path, unsigned block_tokens, struct trace *t, char *err, size_t errlen);

/* Write t as JSONL (integer timestamps in ms). 0 or -EIO. */
int trace_write(FILE *f, const struct trace *t);

/* Distinct ids among the whole blocks of every request. */
uint64_t trace_distinct_whole(const struct trace *t);

/* ---- the chat generator ---------------------------------------------------- */
struct gen_params {
  uint64_t seed;
  unsigned conversations;  /* conversations in the workload */
  unsigned turns;          /* each conversation has 1..turns turns (uniform) */
  unsigned system_prompts; /* shared system prompts (0: none) */
  unsigned system_tokens;  /* mean length of a system prompt */
  unsigned user_tokens;    /* mean length of a user message */
  unsigned output_tokens;  /* mean length of an answer */
  double rate;             /* new conversations per second (Poisson) */
  double think_s;          /* mean seconds between an answer and the next turn */
};

void gen_params_init(struct gen_params *g);

/* Generate the workload into t (which must be empty). Lengths are uniform in
 * [mean/2, 3*mean/2]. Block ids are chained (a block's id depends on every
 * token up to its end, as vLLM's prefix-cache hashes) and renumbered 0, 1, ...
 * in order of first appearance, as in Mooncake's traces. Deterministic for a
 * given seed and parameters. 0, -EINVAL (message in err) or -ENOMEM. */
int gen_chat(const struct gen_params *g, unsigned block_tokens, struct trace *t, char *err, size_t errlen);

#endif
