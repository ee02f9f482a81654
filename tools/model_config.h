/* SPDX-License-Identifier: Apache-2.0 */
/* A model's KV-cache shape from its Hugging Face config.json (umbp size). */
#ifndef UMBP_TOOLS_MODEL_CONFIG_H
#define UMBP_TOOLS_MODEL_CONFIG_H

#include <stdbool.h>
#include <stddef.h>

/* The fields umbp size needs; mla when kv_lora_rank and qk_rope_head_dim are
 * both present (then heads, kv_heads and head_dim are 0). */
struct model {
  char name[128];
  long long layers, heads, kv_heads, head_dim, hidden, kv_lora_rank, qk_rope;
  bool mla;
  char dtype[32]; /* config's torch_dtype, "" when absent */
};

/* Read path into m. 0; -EIO when the file cannot be read, is not JSON or not
 * an object; -EINVAL when a field the formula needs is missing or not a
 * positive integer. On error err holds a sentence naming the cause and the fix.
 * Kept apart from cli.h: jansson's json_null() has the name of cli.h's. */
int model_config_read(const char *path, struct model *m, char *err, size_t errn);

#endif
