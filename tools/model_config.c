/* SPDX-License-Identifier: Apache-2.0 */
/* Reading a Hugging Face config.json with jansson: see model_config.h. */
#include "model_config.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <string.h>


/* An integer field: 1 present (and > 0), 0 absent, -1 present but not a
 * positive integer. */
static int get_int(json_t *o, const char *key, long long *out) {
  json_t *v = json_object_get(o, key);
  if (!v || json_is_null(v)) return 0;
  if (!json_is_integer(v) || json_integer_value(v) <= 0) return -1;
  *out = json_integer_value(v);
  return 1;
}

int model_config_read(const char *path, struct model *m, char *err, size_t errn) {
  json_error_t e;
  json_t *root = json_load_file(path, 0, &e);
  if (!root) {
    FILE *f = fopen(path, "r");
    if (!f) {
      snprintf(err, errn, "cannot read --model-config %s: %s: give the path of the model's config.json", path,
               strerror(errno));
      return -EIO;
    }
    fclose(f);
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

