/* SPDX-License-Identifier: Apache-2.0 */
/* Unit tests of the replay's trace parser (valid lines, every error, random
 * mutations of valid lines) and of the chat generator (determinism, chained
 * ids, the format round trip). Links tools/replay/trace.c and gen.c. */
#include <errno.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "replay/trace.h"

static int parse(struct trace *t, const char *s, char *err, size_t n) {
  return trace_parse_line(t, s, strlen(s), 512, err, n);
}

static void test_valid(void **state) {
  (void)state;
  struct trace t;
  trace_init(&t);
  char err[256];
  assert_int_equal(parse(&t, "{\"timestamp\": 27, \"input_length\": 1100, \"output_length\": 6, \"hash_ids\": [5, 6, 7]}",
                         err, sizeof err),
                   0);
  assert_int_equal(t.n, 1);
  assert_int_equal(t.req[0].input_len, 1100);
  assert_int_equal(t.req[0].output_len, 6);
  assert_int_equal(t.req[0].n_ids, 3);
  assert_int_equal(t.req[0].n_whole, 2);
  assert_true(t.req[0].timestamp_ms == 27.0);
  assert_int_equal(t.ids[t.req[0].ids_off + 2], 7);
  /* unknown fields of every type, any order, escapes, whitespace */
  assert_int_equal(parse(&t,
                         " { \"o\" : {\"a\": [1, 2.5e-3, -0, true, false, null, {\"\\\"k\": \"\\u00e9\\n\"}]},"
                         "\"hash_ids\":[18446744073709551615],\"output_length\":0 ,\"input_length\" :512,"
                         "\"s\":\"\\/\\\\\", \"timestamp\": 1.5e3 }\t",
                         err, sizeof err),
                   0);
  assert_int_equal(t.n, 2);
  assert_true(t.ids[t.req[1].ids_off] == UINT64_MAX);
  assert_int_equal(t.req[1].n_whole, 1);
  assert_true(t.req[1].timestamp_ms == 1500.0);
  /* no timestamp, empty prompt */
  assert_int_equal(parse(&t, "{\"input_length\": 0, \"output_length\": 3, \"hash_ids\": []}", err, sizeof err), 0);
  assert_int_equal(t.req[2].n_whole, 0);
  /* numbers jansson cannot hold: ids above INT64_MAX, and any number in a field that is skipped */
  assert_int_equal(parse(&t,
                         "{\"x\": [1e400, -99999999999999999999], \"input_length\": 1024, \"output_length\": 1,"
                         " \"hash_ids\": [9223372036854775808, 18446744073709551614]}",
                         err, sizeof err),
                   0);
  assert_true(t.ids[t.req[3].ids_off] == 9223372036854775808ull);
  assert_true(t.ids[t.req[3].ids_off + 1] == UINT64_MAX - 1);
  /* blank lines */
  assert_int_equal(parse(&t, "", err, sizeof err), 1);
  assert_int_equal(parse(&t, "  \t ", err, sizeof err), 1);
  assert_int_equal(t.n, 4);
  assert_int_equal(t.max_whole, 2);
  trace_free(&t);
}

static const struct {
  const char *line, *expect;
} bad[] = {
    {"hello", "column 1: expected '{'"},
    {"[1]", "expected '{'"},
    {"{", "column 1: string or '}' expected"},
    {"{\"input_length\" 5}", "column 17: ':' expected"},
    {"{\"input_length\": 5 \"x\": 1}", "column 22: '}' expected"},
    {"{\"input_length\": 5, \"output_length\": 1}", "no \"hash_ids\" field"},
    {"{\"hash_ids\": [], \"output_length\": 1}", "no \"input_length\" field"},
    {"{\"hash_ids\": [], \"input_length\": 1}", "no \"output_length\" field"},
    {"{\"input_length\": -5, \"output_length\": 1, \"hash_ids\": [1]}", "input_length must be a non-negative integer"},
    {"{\"input_length\": 5.0, \"output_length\": 1, \"hash_ids\": [1]}", "input_length must be"},
    {"{\"input_length\": \"5\", \"output_length\": 1, \"hash_ids\": [1]}", "input_length must be"},
    {"{\"input_length\": 5, \"output_length\": 1, \"hash_ids\": 3}", "hash_ids must be an array"},
    {"{\"input_length\": 5, \"output_length\": 1, \"hash_ids\": [1 2]}", "column 56: ']' expected"},
    {"{\"input_length\": 5, \"output_length\": 1, \"hash_ids\": [1, \"a\"]}", "a hash id must be"},
    {"{\"input_length\": 5, \"output_length\": 1, \"hash_ids\": [18446744073709551616]}", "does not fit in 64 bits"},
    {"{\"input_length\": 5, \"output_length\": 1, \"hash_ids\": [01]}", "column 54: invalid token near '0'"},
    {"{\"input_length\": 1024, \"output_length\": 1, \"hash_ids\": [1]}", "needs 2"},
    {"{\"input_length\": 1000, \"output_length\": 1, \"hash_ids\": [1, 2, 3]}", "needs 1 or 2"},
    {"{\"input_length\": 5, \"output_length\": 1, \"hash_ids\": [1]} {}", "column 58: unexpected '{' after the object"},
    {"{\"input_length\": 5, \"input_length\": 5, \"output_length\": 1, \"hash_ids\": [1]}", "column 34: a field appears twice"},
    {"{\"x\": tru, \"input_length\": 5}", "column 9: invalid token near 'tru'"},
    {"{\"x\": \"abc, \"input_length\": 5}", "column 18: '}' expected"},
    {"{\"x\": \"abc", "column 10: premature end of input"},
    {"{\"x\": \"\\q\"}", "column 9: invalid escape"},
    {"{\"x\": \"\\u12G4\"}", "column 12: invalid escape"},
    {"{\"x\": \"a\x01\"}", "column 8: control character 0x1"},
    {"{\"x\": 1., \"input_length\": 5}", "column 8: invalid token near '1.'"},
    {"{\"x\": 1e, \"input_length\": 5}", "column 8: invalid token near '1e'"},
    {"{\"x\": [1, 2,], \"input_length\": 5}", "column 13: unexpected token near ']'"},
    {"{\"timestamp\": -1, \"input_length\": 5, \"output_length\": 1, \"hash_ids\": [1]}", "timestamp must be"},
    /* a sum of output lengths must not wrap: 2^32 tokens at most */
    {"{\"input_length\": 5, \"output_length\": 9223372036854775807, \"hash_ids\": [1]}",
     "output_length must be at most 4294967296 tokens, found 9223372036854775807"},
    {"{\"input_length\": 5, \"output_length\": 4294967297, \"hash_ids\": [1]}", "output_length must be at most"},
    {"{\"timestamp\": \"now\"}", "timestamp must be a number"},
    /* numbers beyond jansson's int64/double, swapped for placeholders (trace.c) */
    {"{\"timestamp\": 1e400, \"input_length\": 5, \"output_length\": 1, \"hash_ids\": [1]}",
     "timestamp must be a non-negative number of milliseconds, found 1e400"},
    {"{\"input_length\": 5, \"output_length\": 1, \"hash_ids\": [-99999999999999999999]}",
     "a hash id must be a non-negative integer, found -99999999999999999999"},
    {"{\"input_length\": 5, \"output_length\": 1, \"hash_ids\": [\"#0\", 18446744073709551615]}",
     "column 79: too big integer"}, /* a '#' in the line: no placeholder */
    {"{\"input_length\": 5, \"output_length\": 1, \"hash_ids\": [18446744073709551615, \"\\u00230\"]}",
     "column 73: too big integer"},
    {"{\"input_length\": 5, \"output_length\": 1, \"hash_ids\": [1]", "column 55: '}' expected near end of file"},
};

static void test_errors(void **state) {
  (void)state;
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    struct trace t;
    trace_init(&t);
    char err[512];
    int rc = parse(&t, bad[i].line, err, sizeof err);
    if (rc != -EINVAL || !strstr(err, bad[i].expect))
      fail_msg("line %zu '%s': rc %d, message '%s' lacks '%s'", i, bad[i].line, rc, err, bad[i].expect);
    assert_int_equal(t.n, 0);
    assert_int_equal(t.n_ids, 0); /* a failed line leaves nothing behind */
    trace_free(&t);
  }
  /* nesting: the limit is enforced, below it is fine */
  char deep[4096];
  struct trace t;
  trace_init(&t);
  char err[256];
  for (int d = 10; d <= 200; d += 190) {
    size_t l = (size_t)snprintf(deep, sizeof deep, "{\"a\": ");
    for (int i = 0; i < d; i++) deep[l++] = '[';
    for (int i = 0; i < d; i++) deep[l++] = ']';
    snprintf(deep + l, sizeof deep - l, ", \"input_length\": 1, \"output_length\": 1, \"hash_ids\": [1]}");
    int rc = parse(&t, deep, err, sizeof err);
    if (d == 10) assert_int_equal(rc, 0);
    else {
      assert_int_equal(rc, -EINVAL);
      assert_non_null(strstr(err, "nested deeper"));
    }
  }
  /* a NUL byte inside the line is a byte like any other */
  const char nul[] = "{\"x\": \"a\0b\", \"input_length\": 1, \"output_length\": 1, \"hash_ids\": [1]}";
  assert_int_equal(trace_parse_line(&t, nul, sizeof nul - 1, 512, err, sizeof err), -EINVAL);
  assert_non_null(strstr(err, "column 8: control character 0x0"));
  trace_free(&t);
}

/* Random mutations of valid lines: never a crash (ASan watches), never an
 * error without a message, and a successful parse always consistent. */
static void test_fuzz(void **state) {
  (void)state;
  const char *seeds[] = {
      "{\"timestamp\": 27, \"input_length\": 1100, \"output_length\": 6, \"hash_ids\": [5, 6, 7]}",
      "{\"o\": {\"a\": [1, 2.5e-3, true, null, {\"k\": \"\\u00e9\"}]}, \"hash_ids\": [1], \"output_length\": 0, "
      "\"input_length\": 512}",
  };
  uint64_t s = 12345;
  struct trace t;
  trace_init(&t);
  char buf[512], err[512];
  const char alphabet[] = "{}[]\":,.-+eE0123456789 \\u\"tfn\x01\xff";
  unsigned ok = 0;
  for (unsigned iter = 0; iter < 200000; iter++) {
    const char *src = seeds[iter & 1];
    size_t len = strlen(src);
    memcpy(buf, src, len);
    unsigned muts = 1 + (unsigned)((s >> 7) % 4);
    for (unsigned m = 0; m < muts; m++) {
      s = s * 6364136223846793005ull + 1442695040888963407ull;
      size_t pos = (size_t)(s >> 33) % (len ? len : 1);
      unsigned op = (unsigned)(s >> 20) % 3;
      char ch = alphabet[(s >> 40) % (sizeof alphabet - 1)];
      if (op == 0 && len) buf[pos] = ch;                                                  /* replace */
      else if (op == 1 && len < sizeof buf - 1) {                                         /* insert */
        memmove(buf + pos + 1, buf + pos, len - pos);
        buf[pos] = ch;
        len++;
      } else if (len) {                                                                   /* delete / cut */
        if ((s >> 50) & 1) len = pos;
        else {
          memmove(buf + pos, buf + pos + 1, len - pos - 1);
          len--;
        }
      }
    }
    size_t before = t.n_ids, nreq = t.n;
    int rc = trace_parse_line(&t, buf, len, 512, err, sizeof err);
    if (rc == 0) {
      ok++;
      assert_int_equal(t.n, nreq + 1);
      const struct trace_req *r = &t.req[t.n - 1];
      assert_true(r->n_whole <= r->n_ids && r->n_ids == t.n_ids - before);
      assert_true(r->n_whole == r->input_len / 512);
    } else if (rc == 1) {
      assert_int_equal(t.n, nreq);
    } else {
      assert_int_equal(rc, -EINVAL);
      assert_true(err[0] != 0);
      assert_int_equal(t.n_ids, before);
    }
    if (t.n > 10000) {
      trace_free(&t);
      trace_init(&t);
    }
  }
  assert_true(ok > 0);
  trace_free(&t);
}

static void test_generator(void **state) {
  (void)state;
  struct gen_params g;
  gen_params_init(&g);
  g.conversations = 50;
  struct trace a, b, c;
  trace_init(&a);
  trace_init(&b);
  trace_init(&c);
  char err[256];
  assert_int_equal(gen_chat(&g, 512, &a, err, sizeof err), 0);
  assert_int_equal(gen_chat(&g, 512, &b, err, sizeof err), 0);
  g.seed = 2;
  assert_int_equal(gen_chat(&g, 512, &c, err, sizeof err), 0);
  assert_int_equal(a.n, b.n);
  assert_int_equal(a.n_ids, b.n_ids);
  assert_memory_equal(a.ids, b.ids, a.n_ids * sizeof *a.ids);
  for (size_t i = 0; i < a.n; i++) {
    assert_true(a.req[i].input_len == b.req[i].input_len && a.req[i].timestamp_ms == b.req[i].timestamp_ms);
    if (i) assert_true(a.req[i - 1].timestamp_ms <= a.req[i].timestamp_ms);
    assert_int_equal(a.req[i].n_ids, (a.req[i].input_len + 511) / 512);
  }
  assert_true(a.n_ids != c.n_ids || memcmp(a.ids, c.ids, a.n_ids * sizeof *a.ids) != 0);

  /* ids renumbered by first appearance: each new id is exactly one above the largest so far */
  uint64_t next = 0;
  for (size_t i = 0; i < a.n_ids; i++) {
    assert_true(a.ids[i] <= next);
    if (a.ids[i] == next) next++;
  }
  /* chained: if two prompts share block k's id they share blocks 0..k */
  for (size_t i = 0; i < a.n && i < 200; i++)
    for (size_t j = i + 1; j < a.n && j < 200; j++) {
      const struct trace_req *x = &a.req[i], *y = &a.req[j];
      uint32_t m = x->n_ids < y->n_ids ? x->n_ids : y->n_ids;
      for (uint32_t k = 0; k < m; k++)
        if (a.ids[x->ids_off + k] == a.ids[y->ids_off + k])
          for (uint32_t q = 0; q < k; q++) assert_true(a.ids[x->ids_off + q] == a.ids[y->ids_off + q]);
    }
  /* system prompts are shared: some first block id appears in many prompts */
  size_t same_first = 0;
  for (size_t i = 1; i < a.n; i++)
    if (a.req[i].n_ids && a.req[0].n_ids && a.ids[a.req[i].ids_off] == a.ids[a.req[0].ids_off]) same_first++;
  assert_true(same_first > 0);

  /* round trip through the JSONL writer and the parser */
  char *mem = NULL;
  size_t memlen = 0;
  FILE *f = open_memstream(&mem, &memlen);
  assert_non_null(f);
  assert_int_equal(trace_write(f, &a), 0);
  fclose(f);
  struct trace r;
  trace_init(&r);
  for (char *p = mem, *nl; p < mem + memlen; p = nl + 1) {
    nl = memchr(p, '\n', (size_t)(mem + memlen - p));
    assert_non_null(nl);
    assert_int_equal(trace_parse_line(&r, p, (size_t)(nl - p), 512, err, sizeof err), 0);
  }
  assert_int_equal(r.n, a.n);
  assert_memory_equal(r.ids, a.ids, a.n_ids * sizeof *a.ids);
  assert_int_equal(trace_distinct_whole(&r), trace_distinct_whole(&a));
  free(mem);
  trace_free(&r);
  trace_free(&a);
  trace_free(&b);
  trace_free(&c);

  g.conversations = 0;
  assert_int_equal(gen_chat(&g, 512, &a, err, sizeof err), -EINVAL);

  /* a prompt of more blocks than the parser takes in one request is refused,
   * so that a workload written with --output always reads back: 1-token
   * blocks, one turn of 1.5M..2.25M user tokens */
  gen_params_init(&g);
  g.conversations = 1;
  g.turns = 1;
  g.system_prompts = 0;
  g.user_tokens = 1500000;
  trace_init(&a);
  assert_int_equal(gen_chat(&g, 1, &a, err, sizeof err), -EINVAL);
  assert_non_null(strstr(err, "over the 1048576 a request may have"));
  assert_non_null(strstr(err, "--block-tokens"));
  trace_free(&a);
  g.user_tokens = 1000;
  assert_int_equal(gen_chat(&g, 1, &a, err, sizeof err), 0);
  trace_free(&a);
}

static void test_distinct(void **state) {
  (void)state;
  struct trace t;
  trace_init(&t);
  char err[128];
  assert_int_equal(parse(&t, "{\"input_length\": 1600, \"output_length\": 1, \"hash_ids\": [1, 2, 3, 4]}", err, sizeof err), 0);
  assert_int_equal(parse(&t, "{\"input_length\": 1024, \"output_length\": 1, \"hash_ids\": [1, 4]}", err, sizeof err), 0);
  assert_int_equal(parse(&t, "{\"input_length\": 600, \"output_length\": 1, \"hash_ids\": [0, 9]}", err, sizeof err), 0);
  /* whole blocks only: 1 2 3 | 1 4 | 0 -> {0,1,2,3,4} */
  assert_int_equal(trace_distinct_whole(&t), 5);
  trace_free(&t);
}

/* A file of one line: obj, then pad spaces up to len bytes, then tail. */
static void write_line_file(const char *path, const char *obj, size_t len, const char *tail) {
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  size_t ol = strlen(obj);
  assert_true(fwrite(obj, 1, ol, f) == ol);
  for (size_t i = ol; i < len; i++) assert_true(putc(' ', f) != EOF);
  fputs(tail, f);
  assert_int_equal(fclose(f), 0);
}

/* trace_load: lines of up to TRACE_MAX_LINE bytes and no more (a file
 * without newlines must not grow one line until memory runs out), a last
 * line without '\n', and only files that end (no device, no directory). */
static void test_load(void **state) {
  (void)state;
  char path[] = "/tmp/umbp-trace-test-XXXXXX";
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  close(fd);
  const char *obj = "{\"input_length\": 512, \"output_length\": 1, \"hash_ids\": [7]}";
  char err[256];
  struct trace t;

  trace_init(&t); /* exactly the longest line, padded with blanks: read */
  write_line_file(path, obj, TRACE_MAX_LINE, "\n");
  assert_int_equal(trace_load(path, 512, &t, err, sizeof err), 0);
  assert_int_equal(t.n, 1);
  trace_free(&t);

  trace_init(&t); /* one byte more: refused, naming the line and the bound */
  write_line_file(path, obj, TRACE_MAX_LINE + 1, "\n");
  assert_int_equal(trace_load(path, 512, &t, err, sizeof err), -EINVAL);
  assert_non_null(strstr(err, "line 1 is longer than 32 MiB: not a JSONL trace"));
  trace_free(&t);

  trace_init(&t); /* a second line too long, and no newline at all */
  write_line_file(path, obj, 10, "\n{");
  FILE *f = fopen(path, "a");
  for (size_t i = 0; i < TRACE_MAX_LINE; i++) putc('x', f);
  fclose(f);
  assert_int_equal(trace_load(path, 512, &t, err, sizeof err), -EINVAL);
  assert_non_null(strstr(err, "line 2 is longer than"));
  trace_free(&t);

  trace_init(&t); /* the last line without '\n' counts */
  write_line_file(path, obj, 0, "\n\n");
  f = fopen(path, "a");
  fputs(obj, f);
  fclose(f);
  assert_int_equal(trace_load(path, 512, &t, err, sizeof err), 0);
  assert_int_equal(t.n, 2);
  trace_free(&t);

  trace_init(&t); /* a UTF-8 byte order mark before the first line is skipped, nowhere else */
  f = fopen(path, "w");
  fprintf(f, "\xef\xbb\xbf%s\r\n%s\n", obj, obj);
  fclose(f);
  assert_int_equal(trace_load(path, 512, &t, err, sizeof err), 0);
  assert_int_equal(t.n, 2);
  trace_free(&t);
  trace_init(&t);
  f = fopen(path, "w");
  fprintf(f, "%s\n\xef\xbb\xbf%s\n", obj, obj);
  fclose(f);
  assert_int_equal(trace_load(path, 512, &t, err, sizeof err), -EINVAL);
  assert_non_null(strstr(err, ":2: column 1: expected '{'"));
  trace_free(&t);
  unlink(path);

  trace_init(&t);
  assert_int_equal(trace_load("/dev/zero", 512, &t, err, sizeof err), -EINVAL);
  assert_non_null(strstr(err, "'/dev/zero' is a character device"));
  assert_int_equal(trace_load("/tmp", 512, &t, err, sizeof err), -EISDIR);
  assert_non_null(strstr(err, "'/tmp' is a directory"));
  assert_int_equal(t.n, 0);
  trace_free(&t);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_valid),     cmocka_unit_test(test_errors),   cmocka_unit_test(test_fuzz),
      cmocka_unit_test(test_generator), cmocka_unit_test(test_distinct),
      cmocka_unit_test(test_load),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
