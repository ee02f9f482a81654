/* SPDX-License-Identifier: Apache-2.0 */
/*
 * trace.c — one trace line through jansson, then the request's checks.
 *
 * jansson parses the line (RFC 8259, UTF-8, nesting bounded by its own
 * JSON_PARSER_MAX_DEPTH) and reports a syntax error with its column; this
 * file then enforces what the replay needs: one object per line, nesting of at
 * most TRACE_MAX_DEPTH, the four fields' types and ranges, and hash_ids
 * covering input_length. jansson's integers are signed 64-bit, and a trace's
 * ids may use all 64 bits, so a number jansson cannot hold is swapped for a
 * string of the same length that names it (see hold_big) and read back here.
 */
#include "replay/trace.h"

#include <errno.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

void trace_init(struct trace *t) { memset(t, 0, sizeof *t); }

void trace_free(struct trace *t) {
  if (!t) return;
  free(t->req);
  free(t->ids);
  memset(t, 0, sizeof *t);
}

/* Describe the byte at p (of a line ending at e) for an error message. */
static const char *byte_what(const char *p, const char *e, char *buf, size_t n) {
  if (p >= e) return "the end of the line";
  unsigned char c = (unsigned char)*p;
  if (c >= 0x20 && c < 0x7f) snprintf(buf, n, "'%c'", c);
  else snprintf(buf, n, "byte 0x%02x", c);
  return buf;
}

static bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; }

__attribute__((format(printf, 3, 4))) static int fail(char *err, size_t errlen, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, errlen, fmt, ap);
  va_end(ap);
  return -EINVAL;
}

/* ---- numbers jansson cannot hold ----------------------------------------------
 * Above INT64_MAX (an id may be up to 2^64 - 1) or a real beyond DBL_MAX,
 * jansson stops with json_error_numeric_overflow just after the token. We
 * replace the token in a copy of the line by a string of the same length,
 * "#K" padded with spaces (K: its index in big[]), so that every later column
 * stays right, and parse again. A line that holds '#' or "u0023" itself could
 * decode to such a string, so there the overflow stays an error. */
#define TRACE_MAX_BIG 64

struct bigs {
  char *copy;        /* the line with the tokens replaced, or NULL */
  unsigned n;
  struct { const char *text; size_t len; } tok[TRACE_MAX_BIG]; /* in the original line */
};

static bool is_num_byte(char c) { return (c >= '0' && c <= '9') || c == '-' || c == '+' || c == '.' || c == 'e' || c == 'E'; }

/* 0 when the token ending at byte end of line could be swapped, else -1. */
static int hold_big(struct bigs *b, const char *line, size_t len, size_t end) {
  if (b->n == TRACE_MAX_BIG || end > len || memchr(line, '#', len) || memmem(line, len, "u0023", 5)) return -1;
  size_t beg = end;
  while (beg > 0 && is_num_byte(line[beg - 1])) beg--;
  char mark[16];
  int ml = snprintf(mark, sizeof mark, "\"#%u\"", b->n);
  if (end - beg < (size_t)ml) return -1;
  if (!b->copy) {
    if (!(b->copy = malloc(len))) return -1;
    memcpy(b->copy, line, len);
  }
  memset(b->copy + beg, ' ', end - beg);
  memcpy(b->copy + beg, mark, (size_t)ml - 1);
  b->copy[end - 1] = '"';
  b->tok[b->n].text = line + beg;
  b->tok[b->n].len = end - beg;
  b->n++;
  return 0;
}

/* The token a placeholder string stands for, or NULL. */
static const char *big_token(const struct bigs *b, json_t *v, size_t *ret_len) {
  const char *s = json_string_value(v);
  if (!s || s[0] != '#') return NULL;
  char *end;
  unsigned long k = strtoul(s + 1, &end, 10);
  while (*end == ' ') end++;
  if (*end || end == s + 1 || k >= b->n) return NULL;
  *ret_len = b->tok[k].len;
  return b->tok[k].text;
}

/* A JSON value for an error message: "-5", "5.0", "a string", "an array" ... */
static const char *value_what(const struct bigs *b, json_t *v, char *buf, size_t n) {
  size_t tl;
  const char *t = big_token(b, v, &tl);
  if (t) snprintf(buf, n, "%.*s", (int)(tl > 40 ? 40 : tl), t);
  else if (json_is_integer(v)) snprintf(buf, n, "%lld", (long long)json_integer_value(v));
  else if (json_is_real(v)) {
    int l = snprintf(buf, n, "%.17g", json_real_value(v));
    if (l > 0 && (size_t)l + 2 < n && !strpbrk(buf, ".en")) strcpy(buf + l, ".0"); /* 5.0, not 5 */
  }
  else if (json_is_string(v)) return "a string";
  else if (json_is_array(v)) return "an array";
  else if (json_is_object(v)) return "an object";
  else if (json_is_boolean(v)) return json_is_true(v) ? "true" : "false";
  else return "null";
  return buf;
}

/* A non-negative integer that fits 64 bits. */
static int get_u64(const struct bigs *b, json_t *v, const char *what, uint64_t *ret, char *err, size_t errlen) {
  size_t tl;
  const char *t = big_token(b, v, &tl);
  size_t digits = 0;
  while (t && digits < tl && t[digits] >= '0' && t[digits] <= '9') digits++;
  if (t && digits == tl) { /* above INT64_MAX: read here */
    uint64_t x = 0;
    for (size_t i = 0; i < tl; i++) {
      unsigned d = (unsigned)(t[i] - '0');
      if (x > (UINT64_MAX - d) / 10) return fail(err, errlen, "%s does not fit in 64 bits", what);
      x = x * 10 + d;
    }
    *ret = x;
    return 0;
  }
  if (!json_is_integer(v) || json_integer_value(v) < 0) {
    char buf[48];
    return fail(err, errlen, "%s must be a non-negative integer, found %s", what, value_what(b, v, buf, sizeof buf));
  }
  *ret = (uint64_t)json_integer_value(v);
  return 0;
}

/* Column (1-based byte) of the first '[' or '{' nested deeper than
 * TRACE_MAX_DEPTH below the line's object, 0 if none. The line is valid JSON
 * here, so a '"' outside a string opens one and "\\" escapes one byte. */
static size_t too_deep(const char *line, size_t len) {
  int depth = -1; /* the line's own object is depth 0 */
  bool in_str = false;
  for (size_t i = 0; i < len; i++) {
    char c = line[i];
    if (in_str) {
      if (c == '\\') i++;
      else if (c == '"') in_str = false;
    } else if (c == '"') {
      in_str = true;
    } else if (c == '[' || c == '{') {
      if (++depth >= TRACE_MAX_DEPTH) return i + 1;
    } else if (c == ']' || c == '}') {
      depth--;
    }
  }
  return 0;
}

/* Parse the line with jansson into *ret, swapping numbers it cannot hold (b).
 * 0, or -EINVAL / -ENOMEM with "column C: ..." in err. */
static int load_line(const char *line, size_t len, struct bigs *b, json_t **ret, char *err, size_t errlen) {
  for (;;) {
    json_error_t e;
    const char *text = b->copy ? b->copy : line;
    json_t *root = json_loadb(text, len, JSON_DISABLE_EOF_CHECK | JSON_REJECT_DUPLICATES, &e);
    if (root) {
      size_t p = (size_t)e.position; /* just after the object */
      while (p < len && is_ws(line[p])) p++;
      char w[16];
      size_t col = too_deep(text, len);
      int rc = 0;
      if (p < len)
        rc = fail(err, errlen, "column %zu: unexpected %s after the object (one object per line)", p + 1,
                  byte_what(line + p, line + len, w, sizeof w));
      else if (col)
        rc = fail(err, errlen, "column %zu: values nested deeper than %d levels", col, TRACE_MAX_DEPTH);
      if (rc) json_decref(root);
      else *ret = root;
      return rc;
    }
    enum json_error_code code = json_error_code(&e);
    if (code == json_error_numeric_overflow && hold_big(b, line, len, (size_t)e.position) == 0) continue;
    if (code == json_error_out_of_memory) {
      snprintf(err, errlen, "out of memory parsing the line");
      return -ENOMEM;
    }
    return fail(err, errlen, "column %d: %s%s", e.column > 0 ? e.column : e.position + 1,
                code == json_error_duplicate_key ? "a field appears twice: " : "", e.text);
  }
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

/* The request's fields from the line's object o into r and t->ids: each field
 * present is checked, then that none is missing, then that the ids cover
 * input_length. */
static int read_request(struct trace *t, const struct bigs *b, json_t *o, unsigned block_tokens, struct trace_req *r,
                        char *err, size_t errlen) {
  char buf[48];
  json_t *ts = json_object_get(o, "timestamp"), *in = json_object_get(o, "input_length"),
         *out = json_object_get(o, "output_length"), *ids = json_object_get(o, "hash_ids");
  if (ts) {
    size_t tl;
    if (!json_is_number(ts) && !big_token(b, ts, &tl))
      return fail(err, errlen, "timestamp must be a number of milliseconds, found %s", value_what(b, ts, buf, sizeof buf));
    r->timestamp_ms = json_is_number(ts) ? json_number_value(ts) : -1; /* a swapped number is out of range */
    if (!(r->timestamp_ms >= 0 && r->timestamp_ms < 1e300))
      return fail(err, errlen, "timestamp must be a non-negative number of milliseconds, found %s",
                  value_what(b, ts, buf, sizeof buf));
  }
  if ((in && get_u64(b, in, "input_length", &r->input_len, err, errlen)) ||
      (out && get_u64(b, out, "output_length", &r->output_len, err, errlen)))
    return -EINVAL;
  if (out && r->output_len > TRACE_MAX_OUTPUT_TOKENS)
    return fail(err, errlen, "output_length must be at most %llu tokens, found %llu",
                (unsigned long long)TRACE_MAX_OUTPUT_TOKENS, (unsigned long long)r->output_len);
  if (ids && !json_is_array(ids))
    return fail(err, errlen, "hash_ids must be an array of block ids, found %s", value_what(b, ids, buf, sizeof buf));
  if (json_array_size(ids) > TRACE_MAX_IDS_PER_REQ)
    return fail(err, errlen, "more than %u hash ids in one request", TRACE_MAX_IDS_PER_REQ);
  size_t i;
  json_t *v;
  json_array_foreach(ids, i, v) {
    uint64_t id;
    if (get_u64(b, v, "a hash id", &id, err, errlen)) return -EINVAL;
    if (ids_push(t, id)) {
      snprintf(err, errlen, "out of memory reading hash ids");
      return -ENOMEM;
    }
  }
  const char *missing = !in ? "input_length" : !out ? "output_length" : !ids ? "hash_ids" : NULL;
  if (missing)
    return fail(err, errlen,
                "the request has no \"%s\" field (each line needs input_length, output_length and hash_ids)", missing);
  uint64_t n = json_array_size(ids), whole = r->input_len / block_tokens;
  uint64_t all = whole + (r->input_len % block_tokens != 0);
  if (n < whole || n > all) {
    char want[64];
    if (whole == all) snprintf(want, sizeof want, "%llu", (unsigned long long)whole);
    else snprintf(want, sizeof want, "%llu or %llu", (unsigned long long)whole, (unsigned long long)all);
    return fail(err, errlen,
                "hash_ids has %llu ids but input_length %llu in blocks of %u tokens needs %s: the trace's block "
                "size is not %u tokens (see --block-tokens) or the line is damaged",
                (unsigned long long)n, (unsigned long long)r->input_len, block_tokens, want, block_tokens);
  }
  r->n_ids = (uint32_t)n;
  r->n_whole = (uint32_t)whole;
  return 0;
}

int trace_parse_line(struct trace *t, const char *line, size_t len, unsigned block_tokens, char *err, size_t errlen) {
  if (errlen) err[0] = 0;
  if (block_tokens == 0) return fail(err, errlen, "block size is 0 tokens");
  size_t lead = 0;
  while (lead < len && is_ws(line[lead])) lead++;
  if (lead == len) return 1;
  char w[16];
  if (line[lead] != '{') /* before jansson, which would name the end of the first token */
    return fail(err, errlen, "column %zu: expected '{' (one JSON object per line), found %s", lead + 1,
                byte_what(line + lead, line + len, w, sizeof w));
  struct bigs b = {.copy = NULL, .n = 0};
  json_t *o = NULL;
  size_t ids_start = t->n_ids;
  struct trace_req r = {.ids_off = ids_start};
  int rc = load_line(line, len, &b, &o, err, errlen);
  if (!rc) rc = read_request(t, &b, o, block_tokens, &r, err, errlen);
  if (!rc && t->n == t->cap) {
    size_t nc = t->cap ? t->cap * 2 : 1024;
    struct trace_req *nr = realloc(t->req, nc * sizeof *nr);
    if (nr) {
      t->req = nr;
      t->cap = nc;
    } else {
      snprintf(err, errlen, "out of memory reading requests");
      rc = -ENOMEM;
    }
  }
  if (!rc) {
    t->req[t->n++] = r;
    if (r.n_whole > t->max_whole) t->max_whole = r.n_whole;
  } else {
    t->n_ids = ids_start;
  }
  json_decref(o);
  free(b.copy);
  return rc;
}

/* One line of f into *buf (grown as needed, to at most max + 1 bytes),
 * without its '\n'; NUL bytes are kept (the parser names them). Returns the
 * line's length, -1 at the end of the file or on a read error (ferror tells),
 * -ENOMEM, or -E2BIG when the line is longer than max bytes (the rest of it is
 * not read). getline() cannot be bounded: on a file without newlines it grows
 * its buffer until memory runs out. */
static ssize_t read_line(FILE *f, char **buf, size_t *cap, size_t max) {
  size_t len = 0;
  int c;
  while ((c = getc_unlocked(f)) != EOF && c != '\n') {
    if (len == max) return -E2BIG;
    if (len + 1 >= *cap) {
      size_t nc = *cap ? *cap * 2 : 4096;
      if (nc > max + 1) nc = max + 1;
      char *nb = realloc(*buf, nc);
      if (!nb) return -ENOMEM;
      *buf = nb;
      *cap = nc;
    }
    (*buf)[len++] = (char)c;
  }
  if (c == EOF && len == 0) return -1;
  return (ssize_t)len; /* a last line without '\n' is a line */
}

int trace_load(const char *path, unsigned block_tokens, struct trace *t, char *err, size_t errlen) {
  FILE *f = fopen(path, "re");
  if (!f) {
    int e = errno;
    snprintf(err, errlen, "cannot open trace '%s': %s%s", path, strerror(e),
             e == ENOENT ? " (check the path, or use --generate chat for a built-in workload)" : "");
    return -e;
  }
  /* A regular file, or a stream that ends (a pipe: <(zcat trace.gz), a
   * socket). A device never ends or is not a trace (/dev/zero, a disk). */
  struct stat st;
  if (fstat(fileno(f), &st) == 0 && !S_ISREG(st.st_mode) && !S_ISFIFO(st.st_mode) && !S_ISSOCK(st.st_mode)) {
    bool dir = S_ISDIR(st.st_mode);
    snprintf(err, errlen, "trace '%s' is %s, not a file: give a JSONL trace file (or a pipe)", path,
             dir ? "a directory" : S_ISCHR(st.st_mode) ? "a character device" : S_ISBLK(st.st_mode) ? "a block device"
                                                                                                : "not a regular file");
    fclose(f);
    return dir ? -EISDIR : -EINVAL;
  }
  char *line = NULL;
  size_t cap = 0;
  ssize_t l;
  unsigned long lineno = 0;
  int rc = 0;
  char msg[512];
  while ((l = read_line(f, &line, &cap, TRACE_MAX_LINE)) >= 0) {
    lineno++;
    size_t len = (size_t)l, skip = 0;
    while (len && (line[len - 1] == '\n' || line[len - 1] == '\r')) len--;
    /* a UTF-8 byte order mark that an editor put before the first line:
     * RFC 8259 lets a parser ignore it, and it is no part of the request */
    if (lineno == 1 && len >= 3 && !memcmp(line, "\xef\xbb\xbf", 3)) skip = 3;
    int r = trace_parse_line(t, line + skip, len - skip, block_tokens, msg, sizeof msg);
    if (r < 0) {
      snprintf(err, errlen, "%s:%lu: %s", path, lineno, msg);
      rc = r;
      break;
    }
  }
  if (l == -E2BIG) {
    snprintf(err, errlen, "%s: line %lu is longer than %u MiB: not a JSONL trace (one request per line)", path,
             lineno + 1, TRACE_MAX_LINE >> 20);
    rc = -EINVAL;
  } else if (l == -ENOMEM) {
    snprintf(err, errlen, "%s: out of memory reading line %lu", path, lineno + 1);
    rc = -ENOMEM;
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
