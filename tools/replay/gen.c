/* SPDX-License-Identifier: Apache-2.0 */
/*
 * gen.c — a multi-turn chat workload in Mooncake's trace format.
 *
 * Model. Conversations arrive as a Poisson process (--rate per second). Each
 * picks one of K shared system prompts (uniformly) and has 1..T turns. Turn t
 * sends the system prompt, every earlier user message and answer, and the new
 * user message; its output is the answer, which joins the history of turn
 * t+1 after an exponential think time. So the prompt's token stream is a list
 * of segments: [system prompt k] [user 1] [answer 1] [user 2] ...
 *
 * Block ids. A block's content is the list of (segment, offset, length)
 * pieces it covers; its chained hash is mix(previous block's hash, content),
 * as vLLM's prefix-cache hashes, so two prompts get equal ids exactly as long
 * as their token prefixes are equal: the whole blocks of a system prompt are
 * shared by every conversation that uses it, and a conversation's history
 * blocks are shared by its later turns. A trailing partial block's content
 * includes its length, so it differs from the whole block it later becomes.
 * The 64-bit hashes are renumbered 0, 1, 2 ... in order of first appearance
 * in the time-ordered trace, as in Mooncake's published traces.
 *
 * Determinism: one splitmix64 stream seeded by --seed drives every choice;
 * the sort has a total order (timestamp, conversation, turn).
 */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "replay/trace.h"

void gen_params_init(struct gen_params *g) {
  memset(g, 0, sizeof *g);
  g->seed = 1;
  g->conversations = 400;
  g->turns = 8;
  g->system_prompts = 8;
  g->system_tokens = 2048;
  g->user_tokens = 256;
  g->output_tokens = 192;
  g->rate = 2.0;
  g->think_s = 30.0;
}

static uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

struct rng {
  uint64_t s;
};
static uint64_t rng_next(struct rng *r) {
  r->s += 0x9e3779b97f4a7c15ull;
  uint64_t z = r->s;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
static double rng_unit(struct rng *r) { return (double)(rng_next(r) >> 11) * 0x1.0p-53; }
static uint64_t rng_below(struct rng *r, uint64_t n) { return n ? rng_next(r) % n : 0; }
/* uniform in [mean/2, 3*mean/2], at least 1 when mean > 0 */
static uint64_t rng_len(struct rng *r, unsigned mean) {
  if (!mean) return 0;
  uint64_t lo = mean / 2, hi = (uint64_t)mean * 3 / 2;
  uint64_t v = lo + rng_below(r, hi - lo + 1);
  return v ? v : 1;
}
static double rng_exp(struct rng *r, double mean) { return -mean * log(1.0 - rng_unit(r)); }

struct seg {
  uint64_t id;  /* identity of the segment's tokens */
  uint64_t len;
};

struct gen_req {
  double ts;
  uint32_t conv, turn;
  uint64_t input, output;
  size_t off;  /* first hash in the scratch array */
  uint32_t n;
};

static int cmp_req(const void *a, const void *b) {
  const struct gen_req *x = a, *y = b;
  if (x->ts != y->ts) return x->ts < y->ts ? -1 : 1;
  if (x->conv != y->conv) return x->conv < y->conv ? -1 : 1;
  return x->turn < y->turn ? -1 : x->turn > y->turn;
}

#define GEN_MAX_BLOCKS (1ull << 27)

int gen_chat(const struct gen_params *g, unsigned bt, struct trace *t, char *err, size_t errlen) {
  if (!g->conversations || !g->turns || !bt || !(g->rate > 0) || !(g->think_s >= 0) || !g->user_tokens) {
    snprintf(err, errlen, "generator parameters out of range: conversations, turns, user tokens and rate must be > 0");
    return -EINVAL;
  }
  struct rng r = {mix(g->seed ^ 0x636861742d67656eull)};
  unsigned K = g->system_tokens ? g->system_prompts : 0;
  uint64_t *sys_len = calloc(K ? K : 1, sizeof *sys_len);
  if (!sys_len) return -ENOMEM;
  for (unsigned k = 0; k < K; k++) sys_len[k] = rng_len(&r, g->system_tokens);

  /* plan: conversation starts, system prompt, turns, lengths */
  size_t nreq = 0, reqcap = 1024, hcap = 1 << 16, nh = 0;
  struct gen_req *req = malloc(reqcap * sizeof *req);
  uint64_t *hs = malloc(hcap * sizeof *hs);
  struct seg *segs = malloc(((size_t)g->turns * 2 + 1) * sizeof *segs);
  int rc = 0;
  if (!req || !hs || !segs) {
    rc = -ENOMEM;
    goto out;
  }
  double start = 0;
  for (uint32_t c = 0; c < g->conversations; c++) {
    start += rng_exp(&r, 1000.0 / g->rate);
    unsigned nseg = 0;
    if (K) {
      unsigned k = (unsigned)rng_below(&r, K);
      segs[nseg++] = (struct seg){mix(0x73797374656dull ^ mix(k)), sys_len[k]};
    }
    unsigned turns = 1 + (unsigned)rng_below(&r, g->turns);
    double ts = start;
    uint64_t hist = K ? segs[0].len : 0;
    for (uint32_t tn = 0; tn < turns; tn++) {
      uint64_t u = rng_len(&r, g->user_tokens), a = rng_len(&r, g->output_tokens);
      segs[nseg++] = (struct seg){mix(((uint64_t)c << 24 | (uint64_t)tn << 1) ^ mix(g->seed)), u};
      uint64_t input = hist + u;
      uint64_t nb = (input + bt - 1) / bt;
      if (nb > TRACE_MAX_IDS_PER_REQ) { /* a request the trace parser would refuse: keep --output's file readable */
        snprintf(err, errlen, "turn %u of conversation %u would have %llu blocks, over the %u a request may have: "
                 "lower --turns, --user-tokens, --output-tokens or --system-tokens, or raise --block-tokens",
                 tn + 1, c + 1, (unsigned long long)nb, TRACE_MAX_IDS_PER_REQ);
        rc = -EINVAL;
        goto out;
      }
      if (nh + nb > GEN_MAX_BLOCKS) {
        snprintf(err, errlen, "the workload would have more than %llu blocks: lower --conversations, --turns or "
                 "the token means (--user-tokens, --output-tokens, --system-tokens), or raise --block-tokens",
                 (unsigned long long)GEN_MAX_BLOCKS);
        rc = -EINVAL;
        goto out;
      }
      while (nh + nb > hcap) {
        uint64_t *n2 = realloc(hs, hcap * 2 * sizeof *hs);
        if (!n2) {
          rc = -ENOMEM;
          goto out;
        }
        hs = n2;
        hcap *= 2;
      }
      if (nreq == reqcap) {
        struct gen_req *n2 = realloc(req, reqcap * 2 * sizeof *req);
        if (!n2) {
          rc = -ENOMEM;
          goto out;
        }
        req = n2;
        reqcap *= 2;
      }
      /* chained hashes of the blocks of this prompt */
      uint64_t prev = 0x6b762d626c6f636bull;
      unsigned si = 0;
      uint64_t seg_off = 0;
      for (uint64_t b = 0; b < nb; b++) {
        uint64_t lo = b * bt, hi = lo + bt < input ? lo + bt : input;
        uint64_t content = mix(hi - lo);
        uint64_t pos = lo;
        while (pos < hi) {
          uint64_t seg_start = pos - seg_off; /* offset inside segs[si] */
          uint64_t take = segs[si].len - seg_start;
          if (take > hi - pos) take = hi - pos;
          content = mix(content ^ segs[si].id) ^ mix(seg_start * 0x100000001b3ull + take);
          pos += take;
          if (seg_start + take == segs[si].len) {
            seg_off += segs[si].len;
            si++;
          }
        }
        prev = mix(prev * 0xff51afd7ed558ccdull ^ content);
        hs[nh + b] = prev;
      }
      req[nreq++] = (struct gen_req){ts, c, tn, input, a, nh, (uint32_t)nb};
      nh += nb;
      segs[nseg++] = (struct seg){mix(((uint64_t)c << 24 | (uint64_t)tn << 1 | 1) ^ mix(g->seed)), a};
      hist = input + a;
      /* the answer takes time to generate; then the user thinks */
      ts += (double)a * 20.0 + rng_exp(&r, g->think_s * 1000.0);
    }
  }
  qsort(req, nreq, sizeof *req, cmp_req);

  /* renumber hashes by first appearance */
  {
    size_t cap = 16;
    while (cap < nh * 2) cap <<= 1;
    uint64_t *keys = calloc(cap, sizeof *keys), *vals = calloc(cap, sizeof *vals);
    t->req = calloc(nreq, sizeof *t->req);
    t->ids = malloc((nh ? nh : 1) * sizeof *t->ids);
    if (!keys || !vals || !t->req || !t->ids) {
      free(keys);
      free(vals);
      trace_free(t);
      rc = -ENOMEM;
      goto out;
    }
    t->cap = nreq;
    t->ids_cap = nh ? nh : 1;
    uint64_t next = 0;
    for (size_t i = 0; i < nreq; i++) {
      const struct gen_req *q = &req[i];
      struct trace_req *o = &t->req[t->n++];
      o->timestamp_ms = floor(q->ts + 0.5);
      o->input_len = q->input;
      o->output_len = q->output;
      o->ids_off = t->n_ids;
      o->n_ids = q->n;
      o->n_whole = (uint32_t)(q->input / bt);
      if (o->n_whole > t->max_whole) t->max_whole = o->n_whole;
      for (uint32_t k = 0; k < q->n; k++) {
        uint64_t h = hs[q->off + k];
        size_t p = (size_t)mix(h) & (cap - 1);
        while (vals[p] && keys[p] != h) p = (p + 1) & (cap - 1); /* vals[p] == 0: empty cell */
        if (!vals[p]) {
          keys[p] = h;
          vals[p] = ++next;
        }
        t->ids[t->n_ids++] = vals[p] - 1;
      }
    }
    free(keys);
    free(vals);
  }
out:
  free(sys_len);
  free(req);
  free(hs);
  free(segs);
  return rc;
}
