/* SPDX-License-Identifier: Apache-2.0 */
/*
 * umbp size — how big a model's KV block is in the pool, from its Hugging Face
 * config.json (read locally; nothing is downloaded).
 *
 * The block object the vLLM connector stores per rank is one vLLM KV-cache
 * page of every attention layer (python/umbp/vllm.py, _object_bytes:
 * page_size_bytes x layers), so for a model whose layers are all full
 * attention:
 *
 *   standard (MHA/GQA):  layers x 2 (K, V) x block_size x heads_per_rank x head_dim x dtype bytes
 *                        heads_per_rank = max(1, num_key_value_heads / tp)
 *                        (a KV head is replicated when tp > num_key_value_heads;
 *                        vLLM, and so umbp size, wants one to divide the other)
 *   MLA (DeepSeek V2/V3: kv_lora_rank and qk_rope_head_dim present):
 *                        layers x block_size x (kv_lora_rank + qk_rope_head_dim) x dtype bytes
 *                        (one latent per token per layer, no K/V split, the same on every rank)
 *
 * A slot holds one block object: the object rounded up to 4 KiB (what the
 * connector asks for when it creates an embedded pool). Every rank stores its
 * own object, so N tokens take ceil(N / block_size) x slot x tp bytes of pool.
 * --bytes-per-token for 'umbp replay' is the object bytes of all ranks per
 * token: object x tp / block_size.
 *
 * Not modelled (docs/vllm.md says so): hybrid models whose layers are of
 * several kinds (sliding window, Mamba) in separate KV-cache groups, pipeline
 * parallelism (each stage stores its own layers only), and vLLM's fp8_ds_mla
 * layout.
 */
#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli.h"
#include "replay/replay.h"
#include "umbp/index.h"
#include "umbp/pool.h"

/* What umbp replay accepts (tools/cmd_replay.c, parse_opts and size_blocks;
 * --tp is RP_MAX_TP from replay/replay.h). */
#define REPLAY_MAX_BPT (1u << 24)
#define REPLAY_MAX_SHARD (1ull << 30)

/* --pool names a pool that exists: a creator still initialising it gets this long, ms. */
#define SIZE_ATTACH_TIMEOUT_MS 1000

/* ---- the model's config.json -------------------------------------------- */
/* The fields umbp size needs; mla when kv_lora_rank and qk_rope_head_dim are
 * both present (then kv_heads and head_dim are 0, and heads is 0 when the
 * config does not give num_attention_heads). */
struct model {
  char name[128];
  long long layers, heads, kv_heads, head_dim, hidden, kv_lora_rank, qk_rope;
  bool mla;
  char dtype[32]; /* config's torch_dtype, "" when absent */
};

/* An integer field: 1 present (and > 0), 0 absent, -1 present but not a
 * positive integer. */
static int get_int(json_t *o, const char *key, long long *out) {
  json_t *v = json_object_get(o, key);
  if (!v || json_is_null(v)) return 0;
  if (!json_is_integer(v) || json_integer_value(v) <= 0) return -1;
  *out = json_integer_value(v);
  return 1;
}

/* Largest config.json read: a real one is 1 to 10 KB (a multimodal model's
 * with its vision and text configs, tokenizer ids and quantisation is still
 * under 100 KB); 16 MiB bounds what a wrong file costs. */
#define SIZE_MAX_CONFIG_BYTES (16u << 20)

/* The file at path into *ret (malloc'd, NUL-terminated, *ret_len bytes): a
 * regular file or a pipe (--model-config <(...)) of at most
 * SIZE_MAX_CONFIG_BYTES; a directory or a device is refused by name. 0 or
 * -EIO with err set. */
static int config_slurp(const char *path, char **ret, size_t *ret_len, char *err, size_t errn) {
  FILE *f = fopen(path, "re");
  if (!f) {
    snprintf(err, errn, "cannot read --model-config %s: %s: give the path of the model's config.json", path,
             strerror(errno));
    return -EIO;
  }
  struct stat st;
  if (fstat(fileno(f), &st) == 0 && !S_ISREG(st.st_mode) && !S_ISFIFO(st.st_mode) && !S_ISSOCK(st.st_mode)) {
    if (S_ISDIR(st.st_mode))
      snprintf(err, errn, "--model-config %s is a directory: give the model's config.json (%s%sconfig.json, if "
               "that is the model's directory)", path, path, path[strlen(path) - 1] == '/' ? "" : "/");
    else
      snprintf(err, errn, "--model-config %s is a %s, not a file: give the model's config.json", path,
               S_ISCHR(st.st_mode) ? "character device" : S_ISBLK(st.st_mode) ? "block device" : "special file");
    fclose(f);
    return -EIO;
  }
  size_t cap = 64 << 10, len = 0;
  char *buf = malloc(cap + 1);
  int rc = buf ? 0 : -ENOMEM;
  while (!rc) {
    if (len == cap) {
      if (cap > SIZE_MAX_CONFIG_BYTES) { /* read the bound + 1 bytes */
        snprintf(err, errn, "--model-config %s is over %u MiB: not a config.json (one is a few KB): give the "
                 "model's config.json", path, SIZE_MAX_CONFIG_BYTES >> 20);
        rc = -EIO;
        break;
      }
      size_t nc = cap * 2 > SIZE_MAX_CONFIG_BYTES + 1 ? SIZE_MAX_CONFIG_BYTES + 1 : cap * 2;
      char *nb = realloc(buf, nc + 1);
      if (!nb) {
        rc = -ENOMEM;
        break;
      }
      buf = nb;
      cap = nc;
    }
    size_t n = fread(buf + len, 1, cap - len, f);
    len += n;
    if (n == 0) {
      if (ferror(f)) {
        snprintf(err, errn, "cannot read --model-config %s: %s", path, strerror(errno));
        rc = -EIO;
      }
      break;
    }
  }
  fclose(f);
  if (rc == -ENOMEM) snprintf(err, errn, "out of memory reading --model-config %s", path);
  if (rc) {
    free(buf);
    return -EIO;
  }
  buf[len] = 0;
  *ret = buf;
  *ret_len = len;
  return 0;
}

/* Read path into m. 0; -EIO when the file cannot be read, is a directory or a
 * device, over SIZE_MAX_CONFIG_BYTES, not JSON or not an object; -EINVAL when
 * a field the formula needs is missing or not a positive integer. On error err
 * holds a sentence naming the cause and the fix. */
static int model_config_read(const char *path, struct model *m, char *err, size_t errn) {
  char *text;
  size_t tlen;
  if (config_slurp(path, &text, &tlen, err, errn)) return -EIO;
  json_error_t e;
  json_t *root = json_loadb(text, tlen, 0, &e);
  free(text);
  if (!root) {
    snprintf(err, errn, "--model-config %s is not JSON (line %d, column %d: %s): give the model's config.json", path,
             e.line, e.column, e.text);
    return -EIO;
  }
  int rc = -EINVAL;
  json_t *o = root;
  if (!json_is_object(o)) {
    snprintf(err, errn, "--model-config %s is JSON but not an object: give the model's config.json", path);
    rc = -EIO;
    goto out;
  }
  memset(m, 0, sizeof *m);
  json_t *arch = json_object_get(o, "architectures");
  const char *an = json_is_array(arch) ? json_string_value(json_array_get(arch, 0)) : NULL;
  if (!an) an = json_string_value(json_object_get(o, "model_type"));
  snprintf(m->name, sizeof m->name, "%s", an ? an : "?");
  json_t *dt = json_object_get(o, "torch_dtype");
  if (!json_is_string(dt)) dt = json_object_get(o, "dtype");
  /* multimodal configs keep the language model's shape in text_config */
  json_t *tc = json_object_get(o, "text_config");
  if (json_is_object(tc) && !json_object_get(o, "num_hidden_layers")) {
    o = tc;
    if (!json_is_string(dt)) dt = json_object_get(o, "torch_dtype");
  }
  snprintf(m->dtype, sizeof m->dtype, "%s", json_is_string(dt) ? json_string_value(dt) : "");

  static const char *bad = "%s: '%s' is not a positive integer: fix the file or give another config.json";
  static const char *missing = "%s has no '%s'%s: give the config.json of a decoder model (it is in the "
                               "model's Hugging Face repository)";
  int g;
  if ((g = get_int(o, "num_hidden_layers", &m->layers)) <= 0) {
    snprintf(err, errn, g ? bad : missing, path, "num_hidden_layers", g ? "" : " (the number of layers)");
    goto out;
  }
  int lr = get_int(o, "kv_lora_rank", &m->kv_lora_rank), qr = get_int(o, "qk_rope_head_dim", &m->qk_rope);
  if (lr < 0 || qr < 0) {
    snprintf(err, errn, bad, path, lr < 0 ? "kv_lora_rank" : "qk_rope_head_dim");
    goto out;
  }
  m->mla = lr > 0 && qr > 0;
  if (m->mla && get_int(o, "num_attention_heads", &m->heads) < 0) {
    snprintf(err, errn, bad, path, "num_attention_heads");
    goto out;
  }
  if (!m->mla) {
    if ((g = get_int(o, "num_attention_heads", &m->heads)) <= 0) {
      snprintf(err, errn, g ? bad : missing, path, "num_attention_heads", g ? "" : " (the number of attention heads)");
      goto out;
    }
    if ((g = get_int(o, "num_key_value_heads", &m->kv_heads)) < 0) {
      snprintf(err, errn, bad, path, "num_key_value_heads");
      goto out;
    }
    if (g == 0) m->kv_heads = m->heads; /* multi-head attention: one KV head per head */
    if ((g = get_int(o, "head_dim", &m->head_dim)) < 0) {
      snprintf(err, errn, bad, path, "head_dim");
      goto out;
    }
    if (g == 0) {
      if ((g = get_int(o, "hidden_size", &m->hidden)) <= 0) {
        snprintf(err, errn, g ? bad : missing, path, "hidden_size", g ? "" : " nor 'head_dim'");
        goto out;
      }
      if (m->hidden % m->heads) {
        snprintf(err, errn, "%s: hidden_size %lld is not a multiple of num_attention_heads %lld and there is no "
                  "head_dim: add the model's head_dim to the file",
                 path, m->hidden, m->heads);
        goto out;
      }
      m->head_dim = m->hidden / m->heads;
    }
  }
  rc = 0;
out:
  json_decref(root);
  return rc;
}

static const char *size_usage =
    "Usage: umbp size --model-config FILE [--tp N] [--block-size T]\n"
    "                 [--kv-dtype auto|float16|bfloat16|float32|fp8] [--tokens N]\n"
    "                 [--pool NAME] [--json]\n"
    "\n"
    "Size the pool for a model: read its Hugging Face config.json (a local file;\n"
    "nothing is downloaded) and print the bytes of the block object each rank\n"
    "stores, the slot size to create the pool with, blocks per GiB, the pool\n"
    "capacity that holds N tokens, the kv_connector_extra_config keys, and the\n"
    "--bytes-per-token that makes 'umbp replay --block-tokens T' size its blocks\n"
    "as this model does.\n"
    "\n"
    "  block = layers x 2 (K,V) x T x max(1, kv_heads / tp) x head_dim x dtype\n"
    "  MLA models (kv_lora_rank and qk_rope_head_dim in the config, e.g. DeepSeek):\n"
    "  block = layers x T x (kv_lora_rank + qk_rope_head_dim) x dtype, on every rank\n"
    "  slot  = block rounded up to 4 KiB; N tokens = ceil(N / T) x slot x tp\n"
    "\n"
    "Options:\n"
    "  --model-config FILE  the model's config.json (required). Fields read:\n"
    "                       num_hidden_layers, num_attention_heads,\n"
    "                       num_key_value_heads (default: num_attention_heads),\n"
    "                       head_dim (default: hidden_size / num_attention_heads),\n"
    "                       kv_lora_rank, qk_rope_head_dim, torch_dtype; in\n"
    "                       text_config when the file has one (multimodal models).\n"
    "  --tp N               tensor-parallel ranks (default 1). As in vLLM, N must\n"
    "                       divide num_attention_heads, and divide\n"
    "                       num_key_value_heads or be a multiple of it (then\n"
    "                       each KV head is replicated on N / heads ranks).\n"
    "                       The replay line is printed only where 'umbp replay'\n"
    "                       takes it (--tp 1 to 32, a shard of at most 1 GiB).\n"
    "  --block-size T       tokens per block: vLLM's --block-size (default 16).\n"
    "  --kv-dtype DTYPE     KV-cache element type, vLLM's --kv-cache-dtype: auto\n"
    "                       (default: the model's dtype, which vLLM runs in 16\n"
    "                       bits), float16, bfloat16, float32 or fp8 (1 byte).\n"
    "  --tokens N           tokens the pool should hold, over all ranks (default\n"
    "                       1000000).\n"
    "  --pool NAME          also say whether the block fits existing pool NAME's\n"
    "                       slots (attaches read-only, as 'umbp pool info').\n"
    "  --json               one JSON object: model, layers, kv_heads,\n"
    "                       heads_per_rank, head_dim, mla, kv_lora_rank,\n"
    "                       qk_rope_head_dim, dtype, dtype_bytes, tp, block_size,\n"
    "                       block_bytes_per_rank, slot_size, blocks_per_gib,\n"
    "                       bytes_per_token_all_ranks, tokens, capacity_bytes,\n"
    "                       capacity_rounded_bytes (up to a whole GiB, or MiB),\n"
    "                       kv_connector_extra_config {slot_size, capacity_bytes};\n"
    "                       with --pool: pool {name, slot_size, slot_count, fits}.\n"
    "\n"
    "Exit status: 0 done (with --pool: the block fits the pool's slots); 1 the\n"
    "file is unreadable, a directory or a device, over 16 MiB or not JSON, the\n"
    "pool cannot be read, the block does not fit the pool's slots, or the output\n"
    "could not be written; 2 usage error (a bad option, a --tp vLLM would refuse\n"
    "for the model, --tokens that take more than the 16777215 slots one pool\n"
    "holds, or a config.json that lacks a field the formula needs).\n"
    "Examples:\n"
    "  umbp size --model-config ~/models/Llama-3.1-8B/config.json --tp 8\n"
    "  umbp size --model-config config.json --tp 8 --kv-dtype fp8 --tokens 4000000\n"
    "  umbp size --model-config config.json --tp 8 --pool kv\n";

/* a x b, or ULLONG_MAX when the product does not fit: a config.json's fields
 * are any positive JSON integers, and a wrapped product would pass the 4 GiB
 * check as a small block, or be 0 (a division by zero below). */
static unsigned long long mul_sat(unsigned long long a, unsigned long long b) {
  unsigned long long r;
  return __builtin_mul_overflow(a, b, &r) ? ULLONG_MAX : r;
}

static int parse_pos(const char *opt, const char *s, long long lo, long long hi, long long *out) {
  char *end;
  errno = 0;
  long long v = strtoll(s, &end, 10);
  if (errno || end == s || *end || !isdigit((unsigned char)*s) || v < lo || v > hi) /* no sign, no spaces */
    return cli_usage_error("size", "%s '%s': use a whole number from %lld to %lld", opt, s, lo, hi);
  *out = v;
  return CLI_OK;
}

int cmd_size(int argc, char **argv) {
  for (int i = 1; i < argc; i++)
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
      fputs(size_usage, stdout);
      return CLI_OK;
    }
  enum { O_CFG = 256, O_TP, O_BS, O_DT, O_TOK, O_POOL, O_JSON };
  static const struct option opts[] = {{"model-config", required_argument, 0, O_CFG},
                                       {"tp", required_argument, 0, O_TP},
                                       {"block-size", required_argument, 0, O_BS},
                                       {"kv-dtype", required_argument, 0, O_DT},
                                       {"tokens", required_argument, 0, O_TOK},
                                       {"pool", required_argument, 0, O_POOL},
                                       {"json", no_argument, 0, O_JSON},
                                       {0, 0, 0, 0}};
  const char *cfg = NULL, *pool = NULL, *kvdt = "auto";
  long long tp = 1, bs = 16, tokens = 1000000;
  bool json = false;
  optind = 1;
  opterr = 0;
  int c;
  while ((c = getopt_long(argc, argv, ":", opts, NULL)) != -1) {
    switch (c) {
    case O_CFG: cfg = optarg; break;
    case O_TP:
      if (parse_pos("--tp", optarg, 1, 4096, &tp)) return CLI_USAGE;
      break;
    case O_BS:
      if (parse_pos("--block-size", optarg, 1, 1 << 20, &bs)) return CLI_USAGE;
      break;
    case O_TOK:
      if (parse_pos("--tokens", optarg, 1, 1ll << 40, &tokens)) return CLI_USAGE;
      break;
    case O_DT: kvdt = optarg; break;
    case O_POOL: pool = optarg; break;
    case O_JSON: json = true; break;
    case ':': return cli_usage_error("size", "option '%s' needs a value", argv[optind - 1]);
    default: return cli_bad_option("size", opts, argv[optind - 1]);
    }
  }
  if (optind < argc) return cli_usage_error("size", "unexpected argument '%s'", argv[optind]);
  if (!cfg) return cli_usage_error("size", "--model-config FILE is required: the model's config.json");
  if (!*cfg) return cli_usage_error("size", "--model-config needs a file name: the path of the model's config.json");
  if (pool && umbp_pool_name_valid(pool)) return cli_usage_error("size", "--pool: %s", umbp_last_error());

  struct model m;
  char why[600];
  int rc = model_config_read(cfg, &m, why, sizeof why);
  if (rc) {
    cli_error("size: %s", why);
    return rc == -EINVAL ? CLI_USAGE : CLI_RUNTIME;
  }

  /* element bytes: 'auto' is the model's dtype; vLLM runs float32
   * checkpoints in float16, so every 'auto' is 2 bytes */
  unsigned eb;
  const char *dtname = kvdt;
  if (!strcmp(kvdt, "auto")) {
    eb = 2;
    dtname = !strcmp(m.dtype, "float16") || !strcmp(m.dtype, "bfloat16") ? m.dtype : "16-bit";
  } else if (!strcmp(kvdt, "float16") || !strcmp(kvdt, "bfloat16") || !strcmp(kvdt, "half")) {
    eb = 2;
  } else if (!strcmp(kvdt, "float32") || !strcmp(kvdt, "float")) {
    eb = 4;
  } else if (!strcmp(kvdt, "fp8") || !strcmp(kvdt, "fp8_e4m3") || !strcmp(kvdt, "fp8_e5m2")) {
    eb = 1;
  } else {
    return cli_usage_error("size", "--kv-dtype '%s': use auto, float16, bfloat16, float32 or fp8", kvdt);
  }

  long long hpr = 0;
  unsigned long long obj;
  if (m.mla) {
    /* each field is at most LLONG_MAX, so their sum fits 64 unsigned bits */
    obj = mul_sat(mul_sat(mul_sat((unsigned long long)m.layers, (unsigned long long)bs),
                          (unsigned long long)m.kv_lora_rank + (unsigned long long)m.qk_rope),
                  eb);
  } else {
    /* vLLM shards the KV heads evenly, or replicates each head over
     * tp / kv_heads ranks; any other tp fails in vLLM (a truncated
     * kv_heads / tp here would size a block vLLM never makes) */
    if (m.kv_heads % tp && tp % m.kv_heads)
      return cli_usage_error("size", "--tp %lld does not divide the model's %lld KV heads, nor do they divide it: "
                                     "vLLM needs num_key_value_heads %% tp == 0 or tp %% num_key_value_heads == 0; "
                                     "use a --tp that divides %lld or is a multiple of it",
                             tp, m.kv_heads, m.kv_heads);
    hpr = m.kv_heads / tp > 0 ? m.kv_heads / tp : 1;
    obj = mul_sat(mul_sat(mul_sat(mul_sat(mul_sat((unsigned long long)m.layers, 2), (unsigned long long)bs),
                                  (unsigned long long)hpr),
                          (unsigned long long)m.head_dim),
                  eb);
  }
  /* vLLM splits the attention (query) heads evenly over the ranks, MLA
   * models included, and refuses a tp that does not divide them */
  if (m.heads && m.heads % tp)
    return cli_usage_error("size", "--tp %lld does not divide the model's %lld attention heads: vLLM needs "
                                   "num_attention_heads %% tp == 0; use a --tp that divides %lld",
                           tp, m.heads, m.heads);
  if (obj > (1ull << 32)) {
    char a[32];
    if (obj == ULLONG_MAX)
      snprintf(a, sizeof a, "over 16 EiB");
    else
      cli_fmt_size(obj, a, sizeof a);
    return cli_usage_error("size", "a block of %lld tokens is %s per rank, over the 4 GiB a slot can hold: use a "
                                   "smaller --block-size, or check %s's num_hidden_layers (%lld) and %s",
                           bs, a, cfg, m.layers, m.mla ? "kv_lora_rank + qk_rope_head_dim" : "head_dim");
  }
  uint64_t slot = (obj + 4095) / 4096 * 4096;
  uint64_t per_gib = (1ull << 30) / slot;
  uint64_t blocks = ((uint64_t)tokens + (uint64_t)bs - 1) / (uint64_t)bs;
  /* one slot per block and rank, in one pool: at most CLI_MAX_SLOTS (blocks
   * <= 2^40 and tp <= 4096, so neither product below overflows) */
  uint64_t need_slots = blocks * (uint64_t)tp;
  if (need_slots > CLI_MAX_SLOTS) {
    char a[32];
    return cli_usage_error("size", "--tokens %lld takes %llu slots of %s (%llu blocks x %lld rank%s), over the %u one "
                                   "pool holds: lower --tokens (at most %llu here) or raise --block-size",
                           tokens, (unsigned long long)need_slots, cli_fmt_size(slot, a, sizeof a),
                           (unsigned long long)blocks, tp, tp == 1 ? "" : "s", CLI_MAX_SLOTS,
                           (unsigned long long)(CLI_MAX_SLOTS / (uint64_t)tp * (uint64_t)bs));
  }
  uint64_t capacity = need_slots * slot;
  /* what to write in a config: the capacity rounded up to a whole GiB (MiB
   * under 1 GiB), so that it is a readable size that still holds N tokens;
   * at least the 2 slots a pool needs, and exact where rounding would pass
   * CLI_MAX_SLOTS, so that the 'umbp pool create' line printed works */
  uint64_t unit = capacity >= (1ull << 30) ? 1ull << 30 : 1ull << 20;
  uint64_t cap_round = ((capacity > 2 * slot ? capacity : 2 * slot) + unit - 1) / unit * unit;
  if (cap_round / slot > CLI_MAX_SLOTS) cap_round = capacity;
  /* replay's --bytes-per-token: the KV bytes of one token over all ranks
   * (its shards are block-tokens x B / tp bytes each) */
  uint64_t bpt = (obj * (uint64_t)tp + (uint64_t)bs - 1) / (uint64_t)bs;
  /* a replay line only where replay takes it (cmd_replay.c's checks: tp,
   * bytes per token, a shard of at most 1 GiB); else why not */
  char no_replay[160] = "";
  uint64_t shard = (((uint64_t)bs * bpt + (uint64_t)tp - 1) / (uint64_t)tp + 7) / 8 * 8;
  if (tp > RP_MAX_TP)
    snprintf(no_replay, sizeof no_replay, "none: umbp replay runs 1 to %d ranks (one process each), not %lld",
             RP_MAX_TP, tp);
  else if (bpt > REPLAY_MAX_BPT)
    snprintf(no_replay, sizeof no_replay, "none: %llu bytes per token is over the %u MiB umbp replay takes",
             (unsigned long long)bpt, REPLAY_MAX_BPT >> 20);
  else if (shard > REPLAY_MAX_SHARD)
    snprintf(no_replay, sizeof no_replay, "none: a rank's shard of %llu bytes is over the 1 GiB umbp replay takes: "
             "use a smaller --block-size", (unsigned long long)shard);

  /* --pool: the slots of an existing pool */
  int pool_rc = 0;
  uint64_t pslot = 0;
  uint32_t pcount = 0;
  if (pool) {
    umbp_attach_opts ao;
    umbp_attach_opts_init(&ao);
    ao.read_only = true;
    ao.timeout_ms = SIZE_ATTACH_TIMEOUT_MS;
    umbp_pool *p;
    pool_rc = umbp_pool_attach(pool, &ao, &p);
    if (pool_rc) {
      cli_error("size: cannot read pool '%s': %s", pool, umbp_last_error());
      return CLI_RUNTIME;
    }
    umbp_pool_info info;
    umbp_pool_get_info(p, &info);
    pslot = info.slot_size;
    pcount = info.slot_count;
    umbp_pool_detach(p);
  }
  bool fits = !pool || pslot >= obj;
  int out_errno = 0; /* of a failed write of stdout */

  char slot_s[32], cap_s[32], a[32], b[32];
  cli_fmt_size_arg(slot, slot_s, sizeof slot_s);
  cli_fmt_size_arg(cap_round, cap_s, sizeof cap_s);
  if (json) {
    struct jb j;
    jb_begin(&j, stdout);
    jb_obj(&j, NULL);
    jb_str(&j, "model", m.name);
    jb_str(&j, "model_config", cfg);
    jb_i64(&j, "layers", m.layers);
    jb_bool(&j, "mla", m.mla);
    if (m.mla) {
      jb_i64(&j, "kv_lora_rank", m.kv_lora_rank);
      jb_i64(&j, "qk_rope_head_dim", m.qk_rope);
    } else {
      jb_i64(&j, "kv_heads", m.kv_heads);
      jb_i64(&j, "heads_per_rank", hpr);
      jb_i64(&j, "head_dim", m.head_dim);
    }
    jb_str(&j, "dtype", dtname);
    jb_u64(&j, "dtype_bytes", eb);
    jb_i64(&j, "tp", tp);
    jb_i64(&j, "block_size", bs);
    jb_u64(&j, "block_bytes_per_rank", obj);
    jb_u64(&j, "slot_size", slot);
    jb_u64(&j, "blocks_per_gib", per_gib);
    jb_u64(&j, "bytes_per_token_all_ranks", bpt);
    jb_i64(&j, "tokens", tokens);
    jb_u64(&j, "capacity_bytes", capacity);
    jb_u64(&j, "capacity_rounded_bytes", cap_round);
    jb_obj(&j, "kv_connector_extra_config");
    jb_str(&j, "slot_size", slot_s);
    jb_str(&j, "capacity_bytes", cap_s);
    jb_end_obj(&j);
    if (pool) {
      jb_obj(&j, "pool");
      jb_str(&j, "name", pool);
      jb_u64(&j, "slot_size", pslot);
      jb_u64(&j, "slot_count", pcount);
      jb_bool(&j, "fits", fits);
      jb_end_obj(&j);
    }
    jb_end_obj(&j);
    errno = 0;
    int jr = jb_finish(&j);
    if (jr == -ENOMEM) return CLI_RUNTIME; /* reported by jb_finish */
    out_errno = jr ? errno : 0;
  } else {
    printf("model        %s (%s): %lld layers, ", cli_safe(m.name), cli_safe(cfg), m.layers);
    if (m.mla)
      printf("MLA latent %lld + rope %lld per token per layer, the same on every rank\n", m.kv_lora_rank, m.qk_rope);
    else
      printf("%lld KV heads of %lld, %lld per rank at tp %lld%s\n", m.kv_heads, m.head_dim, hpr, tp,
             m.kv_heads < tp ? " (replicated: tp > KV heads)" : "");
    if (m.mla)
      printf("block        %lld layers x %lld tokens x (%lld + %lld) x %u bytes (%s) = %llu bytes per rank\n",
             m.layers, bs, m.kv_lora_rank, m.qk_rope, eb, dtname, obj);
    else
      printf("block        %lld layers x 2 (K,V) x %lld tokens x %lld heads x %lld x %u bytes (%s) = %llu bytes "
             "per rank\n",
             m.layers, bs, hpr, m.head_dim, eb, dtname, obj);
    printf("slot size    %s (%llu bytes: the block rounded up to 4 KiB)\n", cli_fmt_size(slot, a, sizeof a),
           (unsigned long long)slot);
    printf("blocks/GiB   %llu per GiB of pool\n", (unsigned long long)per_gib);
    printf("capacity     %s for %lld tokens: %llu blocks x %s x %lld rank%s = %llu bytes\n", cap_s, tokens,
           (unsigned long long)blocks, cli_fmt_size(slot, b, sizeof b), tp, tp == 1 ? "" : "s",
           (unsigned long long)capacity);
    if (*no_replay)
      printf("replay       %s\n", no_replay);
    else
      printf("replay       umbp replay TRACE.jsonl --block-tokens %lld --bytes-per-token %llu --tp %lld (bytes per "
             "token, all ranks)\n",
             bs, (unsigned long long)bpt, tp);
    printf("pool         umbp pool create NAME --capacity %s --slot-size %s   (or umbp daemon NAME ...)\n", cap_s,
           slot_s);
    printf("vllm         \"kv_connector_extra_config\":{\"slot_size\":\"%s\",\"capacity_bytes\":\"%s\"}\n", slot_s,
           cap_s);
    printf("             (and vllm serve --block-size %lld --tensor-parallel-size %lld%s)\n", bs, tp,
           eb == 1 ? " --kv-cache-dtype fp8" : "");
    if (pool)
      printf("pool %-7s %s: %u slots of %s; the block needs %llu bytes%s\n", pool, fits ? "fits" : "DOES NOT FIT",
             pcount, cli_fmt_size(pslot, a, sizeof a), obj,
             fits ? "" : ": create a pool with --slot-size of the 'slot size' above");
  }
  /* stdout full or closed: an error, never a silent success */
  errno = 0;
  int fl = fflush(stdout), fe = errno;
  if (fl || ferror(stdout)) {
    cli_error("size: writing the output failed: %s (is standard output a full disk, or closed?)",
              strerror(fl && fe ? fe : out_errno ? out_errno : EIO));
    return CLI_RUNTIME;
  }
  if (!fits) {
    cli_error("size: the block of %llu bytes does not fit pool '%s''s %llu-byte slots: create a pool with "
              "--slot-size %s (umbp pool destroy %s, then umbp pool create %s --capacity SIZE --slot-size %s)",
              obj, pool, (unsigned long long)pslot, slot_s, pool, pool, slot_s);
    return CLI_RUNTIME;
  }
  return CLI_OK;
}
