/* SPDX-License-Identifier: Apache-2.0 */
#include "cli.h"

#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <fcntl.h>
#include <grp.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "snapshot.h"
#include "umbp/admin.h"
#include "umbp/pool.h"

int cli_parse_size(const char *s, uint64_t *ret) {
  if (!s || !*s) return -EINVAL;
  errno = 0;
  char *end;
  double v = strtod(s, &end);
  if (errno || end == s || v < 0 || !isfinite(v)) return -EINVAL;
  /* strtod also reads hex, exponents, signs, spaces and "inf": a size is decimal */
  int dots = 0;
  for (const char *q = s; q < end; q++)
    if (!isdigit((unsigned char)*q) && (*q != '.' || ++dots > 1)) return -EINVAL;
  while (*end == ' ') end++;
  double mult = 1;
  if (*end) {
    static const struct { const char *suf; double m; } sufs[] = {
        {"B", 1},          {"K", 1024.0},     {"KB", 1024.0},    {"KiB", 1024.0},
        {"M", 1048576.0},  {"MB", 1048576.0}, {"MiB", 1048576.0}, {"G", 1073741824.0},
        {"GB", 1073741824.0}, {"GiB", 1073741824.0}, {"T", 1099511627776.0},
        {"TB", 1099511627776.0}, {"TiB", 1099511627776.0}, {"P", 1125899906842624.0},
        {"PB", 1125899906842624.0}, {"PiB", 1125899906842624.0},
    };
    size_t i;
    for (i = 0; i < sizeof sufs / sizeof sufs[0]; i++)
      if (!strcasecmp(end, sufs[i].suf)) break;
    if (i == sizeof sufs / sizeof sufs[0]) return -EINVAL;
    mult = sufs[i].m;
  }
  double b = v * mult;
  if (b > 18446744073709549568.0) return -EINVAL;
  if (b != floor(b)) return -EINVAL;
  *ret = (uint64_t)b;
  return 0;
}

const char *cli_fmt_size(uint64_t bytes, char *buf, size_t n) {
  static const char *u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = (double)bytes;
  int i = 0;
  while (v >= 1024 && i < 4) { v /= 1024; i++; }
  if (i == 0) snprintf(buf, n, "%llu B", (unsigned long long)bytes);
  else if (v == floor(v)) snprintf(buf, n, "%.0f %s", v, u[i]);
  else snprintf(buf, n, "%.2f %s", v, u[i]);
  return buf;
}

const char *cli_fmt_size_arg(uint64_t b, char *buf, size_t n) {
  if (b && b % (1ull << 30) == 0) snprintf(buf, n, "%lluGiB", (unsigned long long)(b >> 30));
  else if (b && b % (1ull << 20) == 0) snprintf(buf, n, "%lluMiB", (unsigned long long)(b >> 20));
  else if (b && b % 1024 == 0) snprintf(buf, n, "%lluKiB", (unsigned long long)(b >> 10));
  else snprintf(buf, n, "%llu", (unsigned long long)b);
  return buf;
}

int cli_parse_slot_size(const char *sub, const char *arg, uint64_t *out) {
  uint64_t v;
  if (cli_parse_size(arg, &v) || v == 0)
    return cli_usage_error(sub, "--slot-size '%s' is not a size: use e.g. 256KiB", arg);
  if (v < 4096 || v % 64 || v > (1ull << 32))
    return cli_usage_error(sub, "--slot-size '%s' (%llu bytes) is not a slot size: use a multiple of 64 bytes from 4KiB "
                                "to 4GiB (the KV bytes of one block), e.g. 256KiB",
                           arg, (unsigned long long)v);
  *out = v;
  return CLI_OK;
}

int cli_parse_numa_nodes(const char *sub, const char *arg, struct umbp_pool_params *pp, bool *auto_nodes) {
  if (!strcmp(arg, "all")) {
    pp->n_numa_nodes = 0;
    return CLI_OK;
  }
  if (!strcmp(arg, "auto")) {
    *auto_nodes = true;
    return CLI_OK;
  }
  int n = cli_parse_int_list(arg, pp->numa_nodes, UMBP_MAX_PARTITIONS);
  if (n <= 0)
    return cli_usage_error(sub, "--numa-nodes '%s': use auto, all or a list of up to %d node numbers like 0,1", arg,
                           UMBP_MAX_PARTITIONS);
  for (int i = 0; i < n; i++)
    for (int j = 0; j < i; j++)
      if (pp->numa_nodes[i] == pp->numa_nodes[j])
        return cli_usage_error(sub, "--numa-nodes '%s' lists node %d twice: list each node once", arg,
                               pp->numa_nodes[i]);
  pp->n_numa_nodes = (unsigned)n;
  return CLI_OK;
}

static const char *const index_pages_names[] = {[UMBP_INDEX_PAGES_TRY] = "try", [UMBP_INDEX_PAGES_HUGE] = "huge",
                                                [UMBP_INDEX_PAGES_SMALL] = "small"};

int cli_parse_index_pages(const char *s, int *out) {
  for (int m = 0; m < (int)(sizeof index_pages_names / sizeof *index_pages_names); m++)
    if (!strcmp(s, index_pages_names[m])) {
      *out = m;
      return 0;
    }
  return -EINVAL;
}

bool cli_pool_file_exists(const char *name) {
  char path[600], hdir[256];
  snprintf(path, sizeof path, "/dev/shm/umbp.%s", name);
  if (access(path, F_OK) == 0) return true;
  if (umbp_admin_hugetlbfs_mount(hdir, sizeof hdir) != 0) return false;
  snprintf(path, sizeof path, "%s/umbp.%s", hdir, name);
  return access(path, F_OK) == 0;
}

const char *cli_index_pages_name(int mode) {
  return mode >= 0 && mode < (int)(sizeof index_pages_names / sizeof *index_pages_names) ? index_pages_names[mode]
                                                                                          : "?";
}

const char *cli_fmt_index_pages(const void *pool_info, char *buf, size_t n) {
  const umbp_pool_info *i = pool_info;
  char a[32];
  if (i->hugepages) snprintf(buf, n, "2 MiB pages (a hugepage pool)");
  else if (i->index_hugepages)
    snprintf(buf, n, "2 MiB pages (bucket array and slot metadata, %s, in umbp-index.%s on the hugetlbfs mount)",
             cli_fmt_size(i->index_huge_bytes, a, sizeof a), i->name);
  else snprintf(buf, n, "4 KiB pages");
  return buf;
}

const char *cli_fmt_uuid(const uint8_t *u, char *buf, size_t n) {
  snprintf(buf, n, "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", u[0], u[1], u[2], u[3], u[4],
           u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13], u[14], u[15]);
  return buf;
}

int cli_parse_int_list(const char *s, int *out, int max) {
  int n = 0;
  const char *p = s;
  if (!s || !*s) return -EINVAL;
  while (*p) {
    char *end;
    errno = 0;
    long v = strtol(p, &end, 10);
    if (errno || end == p || !isdigit((unsigned char)*p) || v < 0 || v > 65535) return -EINVAL; /* no sign, no spaces */
    if (n >= max) return -EINVAL;
    out[n++] = (int)v;
    p = end;
    if (*p == ',') { p++; if (!*p) return -EINVAL; }
    else if (*p) return -EINVAL;
  }
  return n;
}

void cli_error(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fputs("umbp: ", stderr);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
}

int cli_check_slots(const char *sub, uint64_t capacity, uint64_t slot_size) {
  uint64_t slots = slot_size ? capacity / slot_size : 0;
  char c[32], s[32];
  cli_fmt_size(capacity, c, sizeof c);
  cli_fmt_size(slot_size, s, sizeof s);
  if (slots < 2)
    return cli_usage_error(sub, "--capacity %s holds %llu slot%s of %s: a pool needs at least 2; raise --capacity or "
                                "lower --slot-size", c, (unsigned long long)slots, slots == 1 ? "" : "s", s);
  if (slots > CLI_MAX_SLOTS)
    return cli_usage_error(sub, "--capacity %s holds %llu slots of %s: at most %u are supported; lower --capacity "
                                "or raise --slot-size", c, (unsigned long long)slots, s, CLI_MAX_SLOTS);
  return CLI_OK;
}

int cli_bad_option(const char *sub, const struct option *opts, const char *word) {
  /* getopt_long() takes any unique prefix of a long option and refuses one
   * that several share: name them */
  if (word && word[0] == '-' && word[1] == '-' && word[2]) {
    const char *w = word + 2;
    size_t len = strcspn(w, "=");
    char names[256] = "";
    unsigned n = 0;
    const struct option *hit = NULL, *exact = NULL;
    for (const struct option *o = opts; o && o->name; o++)
      if (!strncmp(o->name, w, len)) {
        size_t u = strlen(names);
        snprintf(names + u, sizeof names - u, "%s--%s", n ? ", " : "", o->name);
        n++;
        hit = o;
        if (o->name[len] == 0) exact = o;
      }
    /* "--json=1": getopt_long() refuses a value for an option that takes none */
    if (exact) hit = exact;
    if (w[len] == '=' && (exact || n == 1) && hit->has_arg == no_argument)
      return cli_usage_error(sub, "option '--%s' takes no value (got '%s'): drop the '=%s'", hit->name, word,
                             w + len + 1);
    if (n > 1 && !exact)
      return cli_usage_error(sub, "option '%.*s' is ambiguous: it begins %s; give more of it", (int)(len + 2), word,
                             names);
  }
  return cli_usage_error(sub, "unknown option '%s'", word ? word : "");
}

bool cli_decimal(const char *s) {
  unsigned dots = 0, digits = 0;
  for (; *s; s++) {
    if (*s == '.') dots++;
    else if (*s >= '0' && *s <= '9') digits++;
    else return false;
  }
  return digits > 0 && dots <= 1;
}

/* errno of a write to stdout that failed before cli_stdout_check() (jb_finish()'s) */
static int g_stdout_errno;

int cli_stdout_check(const char *what) {
  errno = 0;
  if (fflush(stdout) == 0 && !ferror(stdout)) return CLI_OK;
  /* fflush() sets errno; a write that failed earlier left only the error flag */
  if (!errno) errno = g_stdout_errno;
  if (errno) cli_error("%s: writing the output failed: %s", what, strerror(errno));
  else cli_error("%s: writing the output failed (standard output is full or closed)", what);
  return CLI_RUNTIME;
}

int cli_usage_error(const char *sub, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fputs("umbp: ", stderr);
  vfprintf(stderr, fmt, ap);
  if (sub) fprintf(stderr, "\nTry 'umbp %s --help'.\n", sub);
  else fputs("\nTry 'umbp --help'.\n", stderr);
  va_end(ap);
  return CLI_USAGE;
}

bool cli_stderr_tty(void) { return isatty(2); }

int cli_parse_group(const char *sub, const char *arg, gid_t *ret) {
  /* digits alone: strtoull() also takes a sign and leading spaces ("-5" as
   * 2^64 - 5, "+5" and " 5" as 5), which no other number here accepts */
  bool numeric = arg[0] && strspn(arg, "0123456789") == strlen(arg);
  errno = 0;
  unsigned long long g = numeric ? strtoull(arg, NULL, 10) : 0;
  if (numeric && !errno && g < (unsigned long long)(gid_t)-1) {
    *ret = (gid_t)g;
    return CLI_OK;
  }
  struct group *gr = getgrnam(arg);
  if (gr) {
    *ret = gr->gr_gid;
    return CLI_OK;
  }
  const char *d = arg + strspn(arg, " \t");
  d += *d == '+' || *d == '-';
  if (*d && strspn(d, "0123456789") == strlen(d)) /* a number, signed or out of range */
    return cli_usage_error(sub, "--group '%s' is not a group id: use 0 to %u, or a group name", arg,
                           (unsigned)((gid_t)-1 - 1));
  return cli_usage_error(sub, "--group '%s': no such group: give a group name (see getent group) or a gid", arg);
}

char cli_proc_state(int pid) {
  char path[64], line[512];
  char st = 0;
  snprintf(path, sizeof path, "/proc/%d/stat", pid);
  FILE *f = pid > 0 ? fopen(path, "re") : NULL;
  if (f) {
    if (fgets(line, sizeof line, f)) {
      const char *rp = strrchr(line, ')'); /* comm may hold ')' */
      if (rp && rp[1] == ' ') st = rp[2];
    }
    fclose(f);
  }
  return st;
}

bool cli_pid_stopped(int pid) {
  char st = cli_proc_state(pid);
  return st == 'T' || st == 't';
}

const char *cli_stop_advice(int pid, char *buf, size_t n) {
  if (cli_pid_stopped(pid))
    snprintf(buf, n, "it is stopped (SIGSTOP or a debugger) and acts on SIGTERM only once resumed: stop it first "
                     "(kill -TERM %d; kill -CONT %d), or resume it (kill -CONT %d) and leave it running",
             pid, pid, pid);
  else
    snprintf(buf, n, "stop it first (kill -TERM %d), or leave it running", pid);
  return buf;
}

/* --- JSON (see cli.h) ----------------------------------------------------- */
void jb_begin(struct jb *j, FILE *f) { memset(j, 0, sizeof *j); j->f = f; }

/* Put v (a new reference, NULL when its allocation failed) under key in the
 * innermost open container, or make it the root. */
static void jb_put(struct jb *j, const char *key, json_t *v) {
  if (!v) { j->failed = true; return; }
  if (!j->depth) {
    if (!j->root) { j->root = v; return; }
    json_decref(v); /* a second top-level value: a caller bug */
    j->failed = true;
    return;
  }
  json_t *c = j->open[j->depth - 1];
  if (key ? json_object_set_new(c, key, v) : json_array_append_new(c, v)) j->failed = true;
}

static void jb_open(struct jb *j, const char *key, json_t *c) {
  jb_put(j, key, c ? json_incref(c) : NULL);
  if (j->depth >= (int)(sizeof j->open / sizeof j->open[0])) j->failed = true;
  else j->open[j->depth++] = c; /* borrowed: the parent (or root) holds it */
  json_decref(c);
}
void jb_obj(struct jb *j, const char *key) { jb_open(j, key, json_object()); }
void jb_arr(struct jb *j, const char *key) { jb_open(j, key, json_array()); }
void jb_end_obj(struct jb *j) { if (j->depth) j->depth--; }
void jb_end_arr(struct jb *j) { if (j->depth) j->depth--; }

void jb_str(struct jb *j, const char *key, const char *v) {
  if (!v) { jb_put(j, key, json_null()); return; }
  json_t *s = json_string(v);
  if (!s) { /* not UTF-8 (a name read from a damaged segment): keep the ASCII */
    char *c = strdup(v);
    if (c)
      for (char *p = c; *p; p++)
        if ((unsigned char)*p >= 0x80) *p = '?';
    s = c ? json_string(c) : NULL;
    free(c);
  }
  jb_put(j, key, s);
}
void jb_u64(struct jb *j, const char *key, uint64_t v) {
  if (v <= INT64_MAX) { jb_put(j, key, json_integer((json_int_t)v)); return; }
  char buf[24];
  snprintf(buf, sizeof buf, "%llu", (unsigned long long)v);
  jb_put(j, key, json_string(buf));
}
void jb_i64(struct jb *j, const char *key, int64_t v) { jb_put(j, key, json_integer(v)); }
void jb_dbl(struct jb *j, const char *key, double v) { jb_put(j, key, isfinite(v) ? json_real(v) : json_null()); }
void jb_bool(struct jb *j, const char *key, bool v) { jb_put(j, key, json_boolean(v)); }
void jb_null(struct jb *j, const char *key) { jb_put(j, key, json_null()); }

int jb_finish(struct jb *j) {
  int rc = 0;
  if (j->failed || !j->root) {
    cli_error("out of memory while building the JSON output");
    rc = -ENOMEM;
  } else if (json_dumpf(j->root, j->f, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(10)) ||
             fputc('\n', j->f) == EOF || fflush(j->f)) {
    rc = -EIO; /* f full or closed: the caller, or main()'s check of stdout, says so */
    if (j->f == stdout) g_stdout_errno = errno;
  }
  json_decref(j->root);
  memset(j, 0, sizeof *j);
  return rc;
}

/* ---- fatal signals with cleanup on a thread (cli_fatal_signals) ---------------- */
static int g_fatal_pipe[2] = {-1, -1};
static void (*g_fatal_cleanup)(int sig);
static pthread_mutex_t g_fatal_mu = PTHREAD_MUTEX_INITIALIZER;

static void fatal_handler(int sig) {
  int e = errno;
  unsigned char c = (unsigned char)sig;
  ssize_t r = write(g_fatal_pipe[1], &c, 1); /* a full pipe: a signal is already on its way */
  (void)r;
  errno = e;
}

static void *fatal_thread(void *arg) {
  (void)arg;
  unsigned char c;
  while (read(g_fatal_pipe[0], &c, 1) != 1) {
  }
  pthread_mutex_lock(&g_fatal_mu); /* kept: nothing may create what cleanup() no longer sees */
  g_fatal_cleanup(c);
  signal(c, SIG_DFL);
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, c);
  pthread_sigmask(SIG_UNBLOCK, &set, NULL);
  raise(c); /* this thread's signal, default action: the whole process ends by it */
  _exit(128 + c);
}

int cli_fatal_signals(void (*cleanup)(int sig)) {
  if (pipe2(g_fatal_pipe, O_CLOEXEC | O_NONBLOCK)) return -errno;
  /* the reading end blocks; the handler's write end must not */
  fcntl(g_fatal_pipe[0], F_SETFL, 0);
  g_fatal_cleanup = cleanup;
  pthread_attr_t a;
  pthread_attr_init(&a);
  pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
  pthread_attr_setstacksize(&a, 256 << 10);
  pthread_t t;
  int e = pthread_create(&t, &a, fatal_thread, NULL);
  pthread_attr_destroy(&a);
  if (e) {
    close(g_fatal_pipe[0]);
    close(g_fatal_pipe[1]);
    g_fatal_pipe[0] = g_fatal_pipe[1] = -1;
    return -e;
  }
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = fatal_handler;
  sa.sa_flags = SA_RESTART;
  sigemptyset(&sa.sa_mask);
  /* SIGHUP: the terminal or the ssh session closed; SIGQUIT: Ctrl-\ in a terminal, whose default
   * action (a core dump) would otherwise skip the cleanup */
  const int sigs[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT};
  for (unsigned i = 0; i < sizeof sigs / sizeof *sigs; i++) {
    struct sigaction old;
    if (sigaction(sigs[i], NULL, &old) == 0 && old.sa_handler == SIG_IGN) continue; /* nohup: stays ignored */
    sigaction(sigs[i], &sa, NULL);
  }
  return 0;
}

void cli_fatal_lock(void) { pthread_mutex_lock(&g_fatal_mu); }
void cli_fatal_unlock(void) { pthread_mutex_unlock(&g_fatal_mu); }

const char *cli_safe(const char *s) {
  static _Thread_local char buf[4][1024];
  static _Thread_local unsigned next;
  return snap_term_safe(s, buf[next++ & 3], sizeof buf[0]);
}
