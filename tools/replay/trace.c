/* SPDX-License-Identifier: Apache-2.0 */
/*
 * trace.c — a small recursive-descent JSON reader for one trace line.
 *
 * Only the four fields of a request are decoded; every other value is parsed
 * for validity and skipped, whatever its type. The grammar is RFC 8259's
 * (numbers, strings with escapes, literals, nested arrays and objects up to
 * TRACE_MAX_DEPTH levels). The reader never reads past the line's end, never
 * recurses deeper than the limit, and reports the first error with its column.
 */
#include "replay/trace.h"

#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

void trace_init(struct trace *t) { memset(t, 0, sizeof *t); }

void trace_free(struct trace *t) {
  if (!t) return;
  free(t->req);
  free(t->ids);
  memset(t, 0, sizeof *t);
}

struct jp {
  const char *s, *p, *e;
  char *err;
  size_t errlen;
  int rc;
};

__attribute__((format(printf, 2, 3))) static int jp_fail(struct jp *j, const char *fmt, ...) {
  if (j->rc) return j->rc;
  int n = snprintf(j->err, j->errlen, "column %zu: ", (size_t)(j->p - j->s) + 1);
  if (n < 0) n = 0;
  if ((size_t)n < j->errlen) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(j->err + n, j->errlen - (size_t)n, fmt, ap);
    va_end(ap);
  }
  j->rc = -EINVAL;
  return j->rc;
}

/* Describe the byte at p for an error message. */
static const char *jp_what(struct jp *j, char *buf, size_t n) {
  if (j->p >= j->e) return "the end of the line";
  unsigned char c = (unsigned char)*j->p;
  if (c >= 0x20 && c < 0x7f) snprintf(buf, n, "'%c'", c);
  else snprintf(buf, n, "byte 0x%02x", c);
  return buf;
}

static void jp_ws(struct jp *j) {
  while (j->p < j->e && (*j->p == ' ' || *j->p == '\t' || *j->p == '\r' || *j->p == '\n')) j->p++;
}

static int jp_expect(struct jp *j, char c, const char *ctx) {
  jp_ws(j);
  if (j->p < j->e && *j->p == c) {
    j->p++;
    return 0;
  }
  char b[16];
  return jp_fail(j, "expected '%c' %s, found %s", c, ctx, jp_what(j, b, sizeof b));
}

static int hexval(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

/* Parse a string at p (which is '"'). The decoded bytes go to out (up to
 * outcap - 1, NUL-terminated; *ret_len gets the full decoded length) when out
 * is not NULL. */
static int jp_string(struct jp *j, char *out, size_t outcap, size_t *ret_len) {
  size_t len = 0;
  j->p++; /* opening quote */
  for (;;) {
    if (j->p >= j->e) return jp_fail(j, "string not closed before the end of the line");
    unsigned char c = (unsigned char)*j->p;
    if (c == '"') {
      j->p++;
      break;
    }
    if (c < 0x20) return jp_fail(j, "control byte 0x%02x inside a string (escape it)", c);
    uint32_t cp = c;
    int nbytes = 1;
    if (c == '\\') {
      if (j->e - j->p < 2) return jp_fail(j, "escape not finished before the end of the line");
      char x = j->p[1];
      j->p += 2;
      switch (x) {
        case '"': cp = '"'; break;
        case '\\': cp = '\\'; break;
        case '/': cp = '/'; break;
        case 'b': cp = '\b'; break;
        case 'f': cp = '\f'; break;
        case 'n': cp = '\n'; break;
        case 'r': cp = '\r'; break;
        case 't': cp = '\t'; break;
        case 'u': {
          if (j->e - j->p < 4) return jp_fail(j, "\\u escape needs 4 hex digits");
          cp = 0;
          for (int i = 0; i < 4; i++) {
            int h = hexval(j->p[i]);
            if (h < 0) return jp_fail(j, "\\u escape needs 4 hex digits");
            cp = cp << 4 | (uint32_t)h;
          }
          j->p += 4;
          break;
        }
        default:
          j->p -= 1;
          return jp_fail(j, "unknown escape '\\%c' in a string", x >= 0x20 && x < 0x7f ? x : '?');
      }
      nbytes = cp < 0x80 ? 1 : cp < 0x800 ? 2 : 3;
    } else {
      j->p++;
    }
    if (out && len + (size_t)nbytes < outcap) {
      if (nbytes == 1) out[len] = (char)cp;
      else if (nbytes == 2) {
        out[len] = (char)(0xc0 | cp >> 6);
        out[len + 1] = (char)(0x80 | (cp & 0x3f));
      } else {
        out[len] = (char)(0xe0 | cp >> 12);
        out[len + 1] = (char)(0x80 | ((cp >> 6) & 0x3f));
        out[len + 2] = (char)(0x80 | (cp & 0x3f));
      }
    }
    len += (size_t)nbytes;
  }
  if (out) out[len < outcap ? len : outcap - 1] = 0;
  if (ret_len) *ret_len = len;
  return 0;
}

struct jnum {
  const char *b, *e;
  bool neg, frac, exp;
};

static bool isdig(char c) { return c >= '0' && c <= '9'; }

static int jp_number(struct jp *j, struct jnum *n) {
  memset(n, 0, sizeof *n);
  n->b = j->p;
  if (j->p < j->e && *j->p == '-') {
    n->neg = true;
    j->p++;
  }
  if (j->p >= j->e || !isdig(*j->p)) return jp_fail(j, "a number needs a digit here");
  if (*j->p == '0') {
    j->p++;
    if (j->p < j->e && isdig(*j->p)) return jp_fail(j, "numbers must not have leading zeros");
  } else {
    while (j->p < j->e && isdig(*j->p)) j->p++;
  }
  if (j->p < j->e && *j->p == '.') {
    n->frac = true;
    j->p++;
    if (j->p >= j->e || !isdig(*j->p)) return jp_fail(j, "a digit must follow the decimal point");
    while (j->p < j->e && isdig(*j->p)) j->p++;
  }
  if (j->p < j->e && (*j->p == 'e' || *j->p == 'E')) {
    n->exp = true;
    j->p++;
    if (j->p < j->e && (*j->p == '+' || *j->p == '-')) j->p++;
    if (j->p >= j->e || !isdig(*j->p)) return jp_fail(j, "a digit must follow the exponent");
    while (j->p < j->e && isdig(*j->p)) j->p++;
  }
  n->e = j->p;
  return 0;
}

/* A non-negative JSON integer that fits 64 bits. */
static int jnum_u64(struct jp *j, const struct jnum *n, const char *what, uint64_t *ret) {
  if (n->neg || n->frac || n->exp) {
    const char *save = j->p;
    j->p = n->b;
    int rc = jp_fail(j, "%s must be a non-negative integer, found %.*s", what, (int)(n->e - n->b > 40 ? 40 : n->e - n->b),
                     n->b);
    j->p = save;
    return rc;
  }
  uint64_t v = 0;
  for (const char *c = n->b; c < n->e; c++) {
    unsigned d = (unsigned)(*c - '0');
    if (v > (UINT64_MAX - d) / 10) {
      j->p = n->b;
      return jp_fail(j, "%s does not fit in 64 bits", what);
    }
    v = v * 10 + d;
  }
  *ret = v;
  return 0;
}

static int jnum_dbl(struct jp *j, const struct jnum *n, const char *what, double *ret) {
  char buf[64];
  size_t l = (size_t)(n->e - n->b);
  if (l >= sizeof buf) {
    j->p = n->b;
    return jp_fail(j, "%s has too many digits", what);
  }
  memcpy(buf, n->b, l);
  buf[l] = 0;
  double v = strtod(buf, NULL);
  if (n->neg || !(v >= 0 && v < 1e300)) {
    j->p = n->b;
    return jp_fail(j, "%s must be a non-negative number of milliseconds", what);
  }
  *ret = v;
  return 0;
}

static int jp_skip_value(struct jp *j, int depth);

static int jp_skip_container(struct jp *j, int depth, char close) {
  if (depth >= TRACE_MAX_DEPTH) return jp_fail(j, "values nested deeper than %d levels", TRACE_MAX_DEPTH);
  j->p++; /* [ or { */
  jp_ws(j);
  if (j->p < j->e && *j->p == close) {
    j->p++;
    return 0;
  }
  for (;;) {
    jp_ws(j);
    if (close == '}') {
      char b[16];
      if (j->p >= j->e || *j->p != '"') return jp_fail(j, "expected a field name in quotes, found %s", jp_what(j, b, sizeof b));
      if (jp_string(j, NULL, 0, NULL)) return j->rc;
      if (jp_expect(j, ':', "after a field name")) return j->rc;
    }
    if (jp_skip_value(j, depth + 1)) return j->rc;
    jp_ws(j);
    if (j->p < j->e && *j->p == ',') {
      j->p++;
      continue;
    }
    if (j->p < j->e && *j->p == close) {
      j->p++;
      return 0;
    }
    char b[16];
    return jp_fail(j, "expected ',' or '%c', found %s", close, jp_what(j, b, sizeof b));
  }
}

static int jp_literal(struct jp *j, const char *lit) {
  size_t l = strlen(lit);
  if ((size_t)(j->e - j->p) < l || memcmp(j->p, lit, l)) return jp_fail(j, "unknown word (expected a JSON value)");
  j->p += l;
  return 0;
}

static int jp_skip_value(struct jp *j, int depth) {
  jp_ws(j);
  char b[16];
  if (j->p >= j->e) return jp_fail(j, "expected a value, found the end of the line");
  switch (*j->p) {
    case '{': return jp_skip_container(j, depth, '}');
    case '[': return jp_skip_container(j, depth, ']');
    case '"': return jp_string(j, NULL, 0, NULL);
    case 't': return jp_literal(j, "true");
    case 'f': return jp_literal(j, "false");
    case 'n': return jp_literal(j, "null");
    default:
      if (*j->p == '-' || isdig(*j->p)) {
        struct jnum n;
        return jp_number(j, &n);
      }
      return jp_fail(j, "expected a value, found %s", jp_what(j, b, sizeof b));
  }
}

static int jp_u64_field(struct jp *j, const char *what, uint64_t *ret) {
  jp_ws(j);
  char b[16];
  if (j->p >= j->e || !(*j->p == '-' || isdig(*j->p)))
    return jp_fail(j, "%s must be a non-negative integer, found %s", what, jp_what(j, b, sizeof b));
  struct jnum n;
  if (jp_number(j, &n)) return j->rc;
  return jnum_u64(j, &n, what, ret);
}

static int ids_push(struct trace *t, uint64_t v) {
  if (t->n_ids == t->ids_cap) {
    size_t nc = t->ids_cap ? t->ids_cap * 2 : 4096;
    uint64_t *ni = realloc(t->ids, nc * sizeof *ni);
    if (!ni) return -ENOMEM;
    t->ids = ni;
    t->ids_cap = nc;
  }
  t->ids[t->n_ids++] = v;
  return 0;
}

int trace_parse_line(struct trace *t, const char *line, size_t len, unsigned block_tokens, char *err, size_t errlen) {
  struct jp j = {.s = line, .p = line, .e = line + len, .err = err, .errlen = errlen, .rc = 0};
  if (errlen) err[0] = 0;
  if (block_tokens == 0) return jp_fail(&j, "block size is 0 tokens");
  jp_ws(&j);
  if (j.p == j.e) return 1;
  char b[16];
  if (*j.p != '{') return jp_fail(&j, "expected '{' (one JSON object per line), found %s", jp_what(&j, b, sizeof b));
  j.p++;
  size_t ids_start = t->n_ids;
  struct trace_req r = {.ids_off = ids_start};
  bool have_ts = false, have_in = false, have_out = false, have_ids = false;
  jp_ws(&j);
  if (j.p < j.e && *j.p == '}') {
    j.p++;
  } else {
    for (;;) {
      jp_ws(&j);
      if (j.p >= j.e || *j.p != '"') {
        jp_fail(&j, "expected a field name in quotes, found %s", jp_what(&j, b, sizeof b));
        goto fail;
      }
      const char *kp = j.p;
      char key[32];
      size_t klen;
      if (jp_string(&j, key, sizeof key, &klen)) goto fail;
      if (jp_expect(&j, ':', "after a field name")) goto fail;
      bool *seen = NULL;
      if (klen == 9 && !strcmp(key, "timestamp")) seen = &have_ts;
      else if (klen == 12 && !strcmp(key, "input_length")) seen = &have_in;
      else if (klen == 13 && !strcmp(key, "output_length")) seen = &have_out;
      else if (klen == 8 && !strcmp(key, "hash_ids")) seen = &have_ids;
      if (seen && *seen) {
        j.p = kp;
        jp_fail(&j, "field \"%s\" appears twice", key);
        goto fail;
      }
      if (seen) *seen = true;
      if (seen == &have_ts) {
        jp_ws(&j);
        if (j.p >= j.e || !(*j.p == '-' || isdig(*j.p))) {
          jp_fail(&j, "timestamp must be a number of milliseconds, found %s", jp_what(&j, b, sizeof b));
          goto fail;
        }
        struct jnum n;
        if (jp_number(&j, &n) || jnum_dbl(&j, &n, "timestamp", &r.timestamp_ms)) goto fail;
      } else if (seen == &have_in) {
        if (jp_u64_field(&j, "input_length", &r.input_len)) goto fail;
      } else if (seen == &have_out) {
        if (jp_u64_field(&j, "output_length", &r.output_len)) goto fail;
      } else if (seen == &have_ids) {
        jp_ws(&j);
        if (j.p >= j.e || *j.p != '[') {
          jp_fail(&j, "hash_ids must be an array of block ids, found %s", jp_what(&j, b, sizeof b));
          goto fail;
        }
        j.p++;
        jp_ws(&j);
        if (j.p < j.e && *j.p == ']') {
          j.p++;
        } else {
          for (;;) {
            uint64_t v;
            if (jp_u64_field(&j, "a hash id", &v)) goto fail;
            if (t->n_ids - ids_start >= TRACE_MAX_IDS_PER_REQ) {
              jp_fail(&j, "more than %u hash ids in one request", TRACE_MAX_IDS_PER_REQ);
              goto fail;
            }
            if (ids_push(t, v)) {
              j.rc = -ENOMEM;
              snprintf(err, errlen, "out of memory reading hash ids");
              goto fail;
            }
            jp_ws(&j);
            if (j.p < j.e && *j.p == ',') {
              j.p++;
              continue;
            }
            if (j.p < j.e && *j.p == ']') {
              j.p++;
              break;
            }
            jp_fail(&j, "expected ',' or ']' in hash_ids, found %s", jp_what(&j, b, sizeof b));
            goto fail;
          }
        }
      } else {
        if (jp_skip_value(&j, 1)) goto fail;
      }
      jp_ws(&j);
      if (j.p < j.e && *j.p == ',') {
        j.p++;
        continue;
      }
      if (j.p < j.e && *j.p == '}') {
        j.p++;
        break;
      }
      jp_fail(&j, "expected ',' or '}' after a field, found %s", jp_what(&j, b, sizeof b));
      goto fail;
    }
  }
  jp_ws(&j);
  if (j.p != j.e) {
    jp_fail(&j, "unexpected %s after the object (one object per line)", jp_what(&j, b, sizeof b));
    goto fail;
  }
  {
    const char *missing = !have_in ? "input_length" : !have_out ? "output_length" : !have_ids ? "hash_ids" : NULL;
    if (missing) {
      j.p = j.s;
      snprintf(err, errlen, "the request has no \"%s\" field (each line needs input_length, output_length and hash_ids)",
               missing);
      j.rc = -EINVAL;
      goto fail;
    }
  }
  {
    uint64_t n = t->n_ids - ids_start;
    uint64_t whole = r.input_len / block_tokens;
    uint64_t all = whole + (r.input_len % block_tokens != 0);
    if (n < whole || n > all) {
      char need[64];
      if (whole == all) snprintf(need, sizeof need, "%llu", (unsigned long long)whole);
      else snprintf(need, sizeof need, "%llu or %llu", (unsigned long long)whole, (unsigned long long)all);
      snprintf(err, errlen,
               "hash_ids has %llu ids but input_length %llu in blocks of %u tokens needs %s: the trace's block "
               "size is not %u tokens (see --block-tokens) or the line is damaged",
               (unsigned long long)n, (unsigned long long)r.input_len, block_tokens, need, block_tokens);
      j.rc = -EINVAL;
      goto fail;
    }
    r.n_ids = (uint32_t)n;
    r.n_whole = (uint32_t)whole;
  }
  if (t->n == t->cap) {
    size_t nc = t->cap ? t->cap * 2 : 1024;
    struct trace_req *nr = realloc(t->req, nc * sizeof *nr);
    if (!nr) {
      j.rc = -ENOMEM;
      snprintf(err, errlen, "out of memory reading requests");
      goto fail;
    }
    t->req = nr;
    t->cap = nc;
  }
  t->req[t->n++] = r;
  if (r.n_whole > t->max_whole) t->max_whole = r.n_whole;
  return 0;
fail:
  t->n_ids = ids_start;
  return j.rc ? j.rc : -EINVAL;
}

int trace_load(const char *path, unsigned block_tokens, struct trace *t, char *err, size_t errlen) {
  FILE *f = fopen(path, "re");
  if (!f) {
    int e = errno;
    snprintf(err, errlen, "cannot open trace '%s': %s%s", path, strerror(e),
             e == ENOENT ? " (check the path, or use --generate chat for a built-in workload)" : "");
    return -e;
  }
  char *line = NULL;
  size_t cap = 0;
  ssize_t l;
  unsigned long lineno = 0;
  int rc = 0;
  char msg[512];
  while ((l = getline(&line, &cap, f)) >= 0) {
    lineno++;
    size_t len = (size_t)l;
    while (len && (line[len - 1] == '\n' || line[len - 1] == '\r')) len--;
    int r = trace_parse_line(t, line, len, block_tokens, msg, sizeof msg);
    if (r < 0) {
      snprintf(err, errlen, "%s:%lu: %s", path, lineno, msg);
      rc = r;
      break;
    }
  }
  if (!rc && ferror(f)) {
    snprintf(err, errlen, "%s: read error after line %lu: %s", path, lineno, strerror(errno));
    rc = -EIO;
  }
  free(line);
  fclose(f);
  if (!rc && t->n == 0) {
    snprintf(err, errlen, "%s: no requests in the trace (%lu lines, all blank)", path, lineno);
    rc = -EINVAL;
  }
  return rc;
}

int trace_write(FILE *f, const struct trace *t) {
  for (size_t i = 0; i < t->n; i++) {
    const struct trace_req *r = &t->req[i];
    fprintf(f, "{\"timestamp\": %llu, \"input_length\": %llu, \"output_length\": %llu, \"hash_ids\": [",
            (unsigned long long)(r->timestamp_ms + 0.5), (unsigned long long)r->input_len,
            (unsigned long long)r->output_len);
    for (uint32_t k = 0; k < r->n_ids; k++)
      fprintf(f, k ? ", %llu" : "%llu", (unsigned long long)t->ids[r->ids_off + k]);
    fputs("]}\n", f);
  }
  return ferror(f) ? -EIO : 0;
}

/* ---- a set of u64 (open addressing) ----------------------------------------- */
static uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

uint64_t trace_distinct_whole(const struct trace *t) {
  size_t total = 0;
  for (size_t i = 0; i < t->n; i++) total += t->req[i].n_whole;
  size_t cap = 16;
  while (cap < total * 2) cap <<= 1;
  /* slot value v+1 (0 = empty); an id of UINT64_MAX is counted on the side */
  uint64_t *tab = calloc(cap, sizeof *tab);
  if (!tab) return total; /* an upper bound is still safe for sizing */
  uint64_t distinct = 0;
  bool max_seen = false;
  for (size_t i = 0; i < t->n; i++) {
    const struct trace_req *r = &t->req[i];
    for (uint32_t k = 0; k < r->n_whole; k++) {
      uint64_t id = t->ids[r->ids_off + k];
      if (id == UINT64_MAX) {
        if (!max_seen) distinct++;
        max_seen = true;
        continue;
      }
      size_t h = (size_t)mix64(id) & (cap - 1);
      while (tab[h] && tab[h] != id + 1) h = (h + 1) & (cap - 1);
      if (!tab[h]) {
        tab[h] = id + 1;
        distinct++;
      }
    }
  }
  free(tab);
  return distinct;
}
