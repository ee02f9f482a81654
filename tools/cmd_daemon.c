/* SPDX-License-Identifier: Apache-2.0 */
/*
 * umbp daemon — create a pool (or adopt it after a restart of the daemon) and
 * own it: reap dead processes, keep free slots between the watermarks, apply
 * namespace quotas, stop cleanly on SIGTERM/SIGINT, re-read quotas and reopen
 * the log file on SIGHUP.
 *
 * Order of events (STYLE: a child created by fork() shares its parent's open
 * file descriptions and with them the registry's and the daemon's OFD locks):
 * options are parsed and the log file opened first, then the process
 * daemonises (double fork, setsid), and only then is the pool created or
 * attached, so the locks belong to the process that stays. The first parent
 * waits on a pipe for the daemon's "ready" (or its error message), so
 * `umbp daemon` without --foreground still exits non-zero when the pool cannot
 * be created.
 */
#include <errno.h>
#include <fcntl.h>
#include <fnmatch.h>
#include <getopt.h>
#include <grp.h>
#include <poll.h>
#include <pthread.h>
#include <pwd.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "pool_fault.h"
#include "metrics_http.h"
#include "pool_notes.h" /* namespace labels, for label quotas */
#include "umbp/admin.h"
#include "umbp/index.h"
#include "umbp/pool.h"
#include "umbp/topo.h"

/* Defaults and bounds of the options (the usage text states them too). */
#define REAP_MS_DEFAULT 1000       /* --reap-interval */
#define REAP_MS_MAX 3600000        /* one hour */
#define EVICT_LOW_PCT_DEFAULT 5    /* --evict-low */
#define EVICT_HIGH_PCT_DEFAULT 10  /* --evict-high */
#define EVICTOR_PERIOD_MS 20       /* how often the evictor thread looks at the free slots */

static const char *daemon_usage =
    "Usage: umbp daemon NAME [--capacity SIZE] [OPTIONS]\n"
    "\n"
    "Run the daemon that owns pool NAME. It creates the pool (with --capacity) or,\n"
    "when the pool exists, adopts it: after a restart of the daemon every\n"
    "published block is still there and the header's run generation goes up by\n"
    "one. While it runs it reaps processes that died (their pins, reservations\n"
    "and half-done queue operations), evicts unpinned blocks by CLOCK\n"
    "when a partition's free slots fall below --evict-low percent (up to\n"
    "--evict-high), and applies namespace quotas.\n"
    "Only one daemon may own a pool: a second one is refused, naming the first\n"
    "one's pid. A pool whose file belongs to another user is never adopted.\n"
    "\n"
    "Options:\n"
    "  NAME                  pool to own (required): 1-64 characters [A-Za-z0-9._-],\n"
    "                        not starting with '-', as in 'umbp pool create NAME'.\n"
    "                        '--pool NAME' is the same (the older spelling).\n"
    "  --capacity SIZE       create the pool with SIZE bytes of slots when it does\n"
    "                        not exist, e.g. 8GiB. Without it the pool must exist.\n"
    "                        Ignored (with a note) when adopting an existing pool.\n"
    "  --slot-size SIZE      bytes per slot when creating (default 256KiB).\n"
    "  --numa-nodes auto|all|LIST\n"
    "                        partitions when creating: 'all' (default) every node\n"
    "                        with memory; 'auto' the GPUs' local nodes from the\n"
    "                        topology plan; or a list such as 0,1.\n"
    "  --group GROUP         create the pool with mode 0660 for GROUP (name or gid);\n"
    "                        default 0600, owner only. Not changed on adopting (a\n"
    "                        note says so when it differs).\n"
    "  --no-prefault         do not pre-fault the slot bytes when creating; their\n"
    "                        blocks in /dev/shm are still reserved (fallocate), and\n"
    "                        the index metadata is always allocated at creation.\n"
    "  --index-pages MODE    when creating: try (default), huge or small; where the\n"
    "                        bucket array and slot metadata live (see 'umbp pool\n"
    "                        create --help').\n"
    "  --foreground          stay in the foreground, log to stderr (tests, systemd);\n"
    "                        on a pipe or socket, lines it has no room for are\n"
    "                        dropped, not waited for.\n"
    "  --log FILE            without --foreground: append the log to FILE (default\n"
    "                        /dev/null). A FIFO needs its reader running first;\n"
    "                        lines it has no room for are dropped, not waited for.\n"
    "                        SIGHUP opens FILE again (after logrotate renamed it).\n"
    "  --unlink-on-exit      destroy the pool when the daemon stops on SIGTERM or\n"
    "                        SIGINT (default: keep it for the next daemon).\n"
    "  --quota NS=SIZE       byte quota of namespace NS (registered if new); 0 means\n"
    "                        none. Repeatable. NS may be a glob ('vllm-*') or\n"
    "                        'label:PATTERN', see --quota-file.\n"
    "  --quota-file FILE     quotas from FILE, one 'NAMESPACE SIZE' per line, '#'\n"
    "                        starts a comment; read at start and again on SIGHUP\n"
    "                        (a regular file: a FIFO or device is refused).\n"
    "                        NAMESPACE is a name (registered if new), a glob of\n"
    "                        names ('vllm-*'), or 'label:PATTERN', a glob of the\n"
    "                        labels the vLLM connector gives derived namespaces\n"
    "                        (model, TP, dtype, block size: 'umbp inspect NAME'\n"
    "                        shows them), e.g. 'label:Qwen/Qwen2.5-7B* tp8* 16GiB'.\n"
    "                        Globs and labels apply to namespaces as engines\n"
    "                        register them; where several lines match one, the\n"
    "                        last wins (--quota options come before the file). A\n"
    "                        quota larger than the pool never limits: it is logged\n"
    "                        as a warning.\n"
    "  --reap-interval MS    how often dead processes are reaped (default 1000).\n"
    "  --evict-low PCT       start evicting below PCT%% free slots (default 5).\n"
    "  --evict-high PCT      evict until PCT%% are free (default 10); low < high <= 100.\n"
    "  --metrics ADDRESS:PORT\n"
    "                        serve Prometheus metrics at http://ADDRESS:PORT/metrics\n"
    "                        (off by default): slots by state per partition,\n"
    "                        bytes, per-namespace blocks, quota, lookups, hits,\n"
    "                        misses, inserts, evictions, processes alive, dead and\n"
    "                        stopped, the event ring's drops; the list is in\n"
    "                        docs/operations.md. ADDRESS is numeric: 127.0.0.1\n"
    "                        (this host only), 0.0.0.0 (every interface) or [::1].\n"
    "                        Scrapes read the pool through a read-only attach and\n"
    "                        never change it. Needs an umbp built with\n"
    "                        libmicrohttpd%s.\n"
    "                        Example: --metrics 127.0.0.1:9478, then\n"
    "                        curl -s http://127.0.0.1:9478/metrics | grep umbp_slots\n"
    "\n"
    "Signals: SIGTERM, SIGINT stop the daemon cleanly; SIGHUP re-reads --quota-file\n"
    "and reopens --log FILE.\n"
    "Log lines: '2026-12-02T16:00:00Z umbp-daemon[PID]: message' (UTC).\n"
    "\n"
    "The daemon stops with status 1 when, checked every --reap-interval, its pool\n"
    "file was removed or replaced (umbp pool destroy --force) or has shrunk.\n"
    "\n"
    "Exit status: 0 stopped cleanly; 1 the pool cannot be created or adopted (it\n"
    "exists with another layout, belongs to another user, has a daemon already,\n"
    "...), a quota file is invalid or cannot be read at start, or the pool was\n"
    "destroyed or truncated under it, or --metrics cannot listen on its address\n"
    "(the port is taken, no interface has the address); 2 usage error (also a\n"
    "--capacity of fewer than 2 or more than 16777215 slots); 3 a SIGBUS\n"
    "on the pool (its file truncated, or its file system full), logged with the\n"
    "cause.\n"
    "Examples:\n"
    "  umbp daemon kv --capacity 64GiB --numa-nodes auto --log /var/log/umbp-kv.log\n"
    "  umbp daemon kv --capacity 64GiB --group vllm --foreground   (systemd, containers)\n";

/* ---- logging ---------------------------------------------------------------- */
static void dlog(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void dlog(const char *fmt, ...) {
  char line[1200];
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  struct tm tm;
  gmtime_r(&ts.tv_sec, &tm);
  int n = (int)strftime(line, sizeof line, "%Y-%m-%dT%H:%M:%SZ", &tm);
  n += snprintf(line + n, sizeof line - (size_t)n, " umbp-daemon[%d]: ", (int)getpid());
  va_list ap;
  va_start(ap, fmt);
  int m = vsnprintf(line + n, sizeof line - (size_t)n - 1, fmt, ap);
  va_end(ap);
  n = m < 0 ? n : n + m;
  if (n > (int)sizeof line - 2) n = (int)sizeof line - 2;
  line[n++] = '\n';
  /* one write per line: lines from the evictor thread do not interleave */
  ssize_t w = write(2, line, (size_t)n);
  (void)w;
}

static void lib_log(void *arg, int level, const char *msg) {
  (void)arg;
  dlog("%s%s", level == UMBP_LOG_ERROR ? "error: " : level == UMBP_LOG_WARN ? "warning: " : "", msg);
}

/* systemd's readiness protocol (sd_notify(3); Type=notify in
 * contrib/systemd/umbp-daemon@.service): one datagram "READY=1" to the
 * AF_UNIX socket that $NOTIFY_SOCKET names ('@' first: the abstract
 * namespace), sent once the pool is created or adopted and served, so that
 * `systemctl start` and the units ordered after the daemon wait for the pool.
 * Without the variable (not started by systemd) it does nothing; a send that
 * fails is logged, and systemd's start timeout then reports the unit. */
static void notify_ready(void) {
  const char *path = getenv("NOTIFY_SOCKET");
  if (!path || !*path) return;
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  size_t len = strlen(path);
  if ((path[0] != '/' && path[0] != '@') || len >= sizeof sa.sun_path) {
    dlog("warning: NOTIFY_SOCKET=%s is not a socket path: systemd is not told that the daemon is ready", path);
    return;
  }
  memcpy(sa.sun_path, path, len);
  if (path[0] == '@') sa.sun_path[0] = 0;
  static const char msg[] = "READY=1";
  int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0 || sendto(fd, msg, sizeof msg - 1, 0, (const struct sockaddr *)&sa,
                       (socklen_t)(offsetof(struct sockaddr_un, sun_path) + len)) < 0)
    dlog("warning: cannot tell systemd that the daemon is ready (NOTIFY_SOCKET=%s): %s", path, strerror(errno));
  if (fd >= 0) close(fd);
}

/* The pipe to the waiting first parent (daemonised mode), -1 otherwise. */
static int report_fd = -1;

static int fatal(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int fatal(const char *fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  dlog("error: %s", msg);
  if (report_fd >= 0) {
    ssize_t w = write(report_fd, msg, strlen(msg));
    (void)w;
    close(report_fd);
    report_fd = -1;
  }
  return CLI_RUNTIME;
}

/* ---- quotas ----------------------------------------------------------------- */
/* A quota names a namespace exactly (registered at start if new), a glob of
 * names, or a glob of labels (the connector's, in the pool's notes); globs
 * are applied each reap interval to the namespaces registered by then. */
enum quota_kind { Q_NAME = 0, Q_GLOB = 1, Q_LABEL = 2 };
struct quota {
  char ns[488]; /* the name, the glob, or the label pattern (without "label:") */
  int kind;
  uint64_t bytes;
};
#define MAX_QUOTAS UMBP_MAX_NAMESPACES
#define LABEL_PREFIX "label:"

/* Parse KEY (a line's or a --quota's text before its SIZE) into q: 0, or -1
 * when it is not a namespace name, a glob or a label pattern. */
static int parse_quota_key(const char *key, size_t len, struct quota *q) {
  while (len && (*key == ' ' || *key == '\t')) key++, len--;
  while (len && (key[len - 1] == ' ' || key[len - 1] == '\t')) len--;
  size_t pl = strlen(LABEL_PREFIX);
  /* ">=": a bare "label:" (no pattern) was taken for a namespace of that
   * name, registered in the pool, instead of being refused */
  if (len >= pl && !strncmp(key, LABEL_PREFIX, pl)) {
    key += pl, len -= pl;
    while (len && (*key == ' ' || *key == '\t')) key++, len--;
    if (!len || len >= sizeof q->ns) return -1;
    q->kind = Q_LABEL;
  } else {
    if (!len || len > 128 || memchr(key, ' ', len) || memchr(key, '\t', len)) return -1;
    bool glob = false;
    for (size_t i = 0; i < len; i++) glob |= key[i] == '*' || key[i] == '?' || key[i] == '[';
    q->kind = glob ? Q_GLOB : Q_NAME;
  }
  snprintf(q->ns, sizeof q->ns, "%.*s", (int)len, key);
  return 0;
}

/* Why KEY (klen bytes) and SIZE (NULL: none) are not a quota, for the error
 * message after the expected form: what is wrong and how to write it. */
static const char *quota_why(const char *key, size_t klen, const char *size, char *buf, size_t n) {
  while (klen && (*key == ' ' || *key == '\t')) key++, klen--;
  while (klen && (key[klen - 1] == ' ' || key[klen - 1] == '\t')) klen--;
  uint64_t v;
  const char *lw = key + klen; /* the key's last word: "10" of "chat 10 GiB" */
  while (lw > key && lw[-1] != ' ' && lw[-1] != '\t') lw--;
  char word[48], num[96];
  size_t lwl = (size_t)(key + klen - lw);
  snprintf(word, sizeof word, "%.*s", (int)(lwl < 40 ? lwl : 40), lw);
  snprintf(num, sizeof num, "%s%.40s", word, size ? size : "");
  if (!size || !*size)
    snprintf(buf, n, "%s", cli_parse_size(key, &v) == 0 ? "no NAMESPACE before the size" : "no SIZE after the namespace");
  else if (!klen)
    snprintf(buf, n, "no NAMESPACE before the size");
  else if (lw > key && lwl < 40 && cli_parse_size(word, &v) == 0 && cli_parse_size(size, &v) &&
           cli_parse_size(num, &v) == 0) /* "chat 10 GiB" */
    snprintf(buf, n, "a SIZE is one word: write '%s', not '%s %.40s'", num, word, size);
  else if (cli_parse_size(size, &v))
    snprintf(buf, n, "'%.40s' is not a size: a whole number of bytes with an optional unit B, KiB, MiB, GiB, TiB or "
                     "PiB (K, M, G ... are the same, 1024-based), below 16 EiB",
             size);
  else if (klen >= strlen(LABEL_PREFIX) && !strncmp(key, LABEL_PREFIX, strlen(LABEL_PREFIX)))
    snprintf(buf, n, "a label pattern is 1 to %zu bytes", sizeof((struct quota *)0)->ns - 1);
  else if (memchr(key, ' ', klen) || memchr(key, '\t', klen))
    snprintf(buf, n, "a namespace name has no spaces (only a 'label:PATTERN' may)");
  else
    snprintf(buf, n, "a namespace name is 1 to 128 bytes, this one %zu", klen);
  return buf;
}

/* "namespace 'chat'", "namespaces 'vllm-*'" or "namespaces labelled 'Qwen*'": a quota, for the log. */
static const char *quota_what(const struct quota *q, char *buf, size_t n) {
  snprintf(buf, n, "%s '%s'", q->kind == Q_LABEL ? "namespaces labelled" : q->kind == Q_GLOB ? "namespaces" : "namespace",
           cli_safe(q->ns));
  return buf;
}

/* A quota above the pool's slot bytes never limits: say so (once per apply). */
static void warn_big_quota(umbp_pool *p, const struct quota *q) {
  umbp_pool_info info;
  if (!q->bytes || umbp_pool_get_info(p, &info)) return;
  uint64_t cap = (uint64_t)info.slot_count * info.slot_size;
  if (q->bytes <= cap) return;
  char a[32], b[32], w[600];
  dlog("warning: the quota of %s (%s) is larger than the pool (%s of slots): it never evicts anything",
       quota_what(q, w, sizeof w), cli_fmt_size(q->bytes, a, sizeof a), cli_fmt_size(cap, b, sizeof b));
}

/* Parse FILE; 0 and *n entries, or -1 with err filled ("FILE:LINE: ...", or
 * "cannot read quota file FILE: CAUSE"). A file that cannot be read to its
 * end (a directory, an I/O error) is an error, never an empty file: on
 * SIGHUP that would drop every quota in force. */
static int read_quota_file(const char *path, struct quota *q, unsigned *n, char *err, size_t errn) {
  /* O_NONBLOCK: open(2) of a FIFO for reading waits for a writer, which hung
   * the daemon at start and, on SIGHUP, its main loop (no reaping, no
   * SIGTERM). Only a regular file is read (a FIFO, socket or device is
   * refused by name); O_NONBLOCK changes nothing for one. */
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    snprintf(err, errn, "cannot read quota file %s: %s", path, strerror(errno));
    return -1;
  }
  struct stat st;
  int e = fstat(fd, &st) != 0 ? errno : S_ISDIR(st.st_mode) ? EISDIR : 0; /* open() of a directory succeeds */
  if (!e && !S_ISREG(st.st_mode)) {
    snprintf(err, errn, "cannot read quota file %s: it is a %s, not a regular file: write the quotas to a file and "
                        "name that",
             path, S_ISFIFO(st.st_mode) ? "FIFO" : S_ISSOCK(st.st_mode) ? "socket" : "device");
    close(fd);
    return -1;
  }
  FILE *f = e ? NULL : fdopen(fd, "r");
  if (!f) {
    snprintf(err, errn, "cannot read quota file %s: %s%s", path, strerror(e ? e : errno),
             e == EISDIR ? ": name the file of quotas (one 'NAMESPACE SIZE' a line) in it, not the directory" : "");
    close(fd);
    return -1;
  }
  /* getline(): a line of any length is one line. fgets() into 512 bytes
   * cut a longer one into pieces read as lines of their own, so the tail of
   * a long '#' comment ("... chat 1MiB") became a quota. */
  char *line = NULL;
  size_t cap = 0;
  unsigned lineno = 0, k = 0;
  int rc = -1;
  ssize_t got;
  while ((got = getline(&line, &cap, f)) >= 0) {
    lineno++;
    /* Editors on Windows start a UTF-8 file with a byte-order mark: it is
     * not part of the first name (which was registered, for good, as
     * "\xEF\xBB\xBFchat" while 'chat' got no quota). A NUL byte means
     * UTF-16 or a binary file, whose text the string functions below would
     * cut short at the NUL. */
    char *text = line;
    if (lineno == 1 && got >= 3 && !memcmp(line, "\xEF\xBB\xBF", 3)) text += 3;
    if (memchr(line, 0, (size_t)got)) {
      snprintf(err, errn, "%s:%u: a NUL byte: the file is not plain text (UTF-16, or binary); save it as UTF-8 "
                          "or ASCII text", path, lineno);
      goto out;
    }
    char *hash = strchr(text, '#');
    if (hash) *hash = 0;
    /* KEY SIZE: SIZE is the last word, KEY all before it (a label pattern may have spaces) */
    size_t len = strcspn(text, "\n");
    while (len && (text[len - 1] == ' ' || text[len - 1] == '\t' || text[len - 1] == '\r')) len--;
    text[len] = 0;
    size_t start = strspn(text, " \t");
    if (start == len) continue;
    char *sp = text + len;
    while (sp > text + start && sp[-1] != ' ' && sp[-1] != '\t') sp--;
    uint64_t b;
    struct quota pq;
    if (sp == text + start || cli_parse_size(sp, &b) || parse_quota_key(text + start, (size_t)(sp - text - start), &pq)) {
      char why[300];
      snprintf(err, errn, "%s:%u: expected 'NAMESPACE SIZE' (e.g. 'chat 8GiB', 'vllm-* 8GiB' or 'label:Qwen* 8GiB'), got '%.*s%s': %s", path, lineno,
               len > 200 ? 200 : (int)len, text, len > 200 ? "..." : "",
               quota_why(text + start, (size_t)(sp - text - start), sp == text + start ? NULL : sp, why, sizeof why));
      goto out;
    }
    if (k == MAX_QUOTAS) {
      snprintf(err, errn, "%s:%u: more than %d quotas", path, lineno, MAX_QUOTAS);
      goto out;
    }
    pq.bytes = b;
    q[k++] = pq;
  }
  if (ferror(f) || !feof(f)) { /* getline() stopped on an error (a read error, ENOMEM), not at the end */
    e = errno;
    char at[40] = "";
    if (lineno) snprintf(at, sizeof at, " after line %u", lineno);
    snprintf(err, errn, "cannot read quota file %s%s: %s", path, at, strerror(e ? e : EIO));
    goto out;
  }
  *n = k;
  rc = 0;
out:
  free(line);
  fclose(f);
  return rc;
}

static int apply_quotas(umbp_pool *p, const struct quota *q, unsigned n) {
  int bad = 0;
  for (unsigned i = 0; i < n; i++) {
    warn_big_quota(p, &q[i]);
    if (q[i].kind != Q_NAME) continue; /* globs and labels: apply_pattern_quotas() */
    uint32_t id;
    int rc = umbp_ns_register(p, q[i].ns, &id);
    if (!rc) rc = umbp_ns_set_quota(p, id, q[i].bytes);
    char b[32];
    if (rc) {
      dlog("error: quota of namespace '%s' not applied: %s", cli_safe(q[i].ns), umbp_last_error());
      bad++;
    } else {
      dlog("quota of namespace '%s' (id %u): %s", cli_safe(q[i].ns), id, q[i].bytes ? cli_fmt_size(q[i].bytes, b, sizeof b) : "none");
    }
  }
  return bad;
}

/* SIGHUP: a namespace whose quota came from the old file and is not in the
 * new one goes back to its --quota from the command line, or to none; an
 * emptied file clears every quota it had set. */
static void drop_removed_quotas(umbp_pool *p, const struct quota *cmdline, unsigned ncmd, const struct quota *old,
                                unsigned nold, const struct quota *now, unsigned nnow) {
  for (unsigned i = 0; i < nold; i++) {
    bool kept = false;
    for (unsigned j = 0; j < nnow && !kept; j++) kept = !strcmp(old[i].ns, now[j].ns);
    if (kept) continue;
    struct quota q = old[i];
    if (q.kind != Q_NAME) continue; /* apply_pattern_quotas() lets go of what no line matches */
    q.bytes = 0;
    for (unsigned j = 0; j < ncmd; j++)
      if (!strcmp(cmdline[j].ns, q.ns)) q.bytes = cmdline[j].bytes;
    apply_quotas(p, &q, 1);
  }
}

/* Glob and label quotas, applied to every namespace registered now: for each,
 * the last quota that matches it (command line, then file) wins; when that is
 * a glob or label one, the namespace gets its bytes. A namespace that a glob
 * or label quota had set and that no quota matches any more (after SIGHUP)
 * goes back to none. set_by_pattern[id] remembers which ones this set. */
static void apply_pattern_quotas(umbp_pool *p, const char *pool, const struct quota *cmd, unsigned ncmd,
                                 const struct quota *file, unsigned nfile, bool *set_by_pattern) {
  bool globs = false, labels = false;
  for (unsigned i = 0; i < ncmd + nfile; i++) {
    int k = (i < ncmd ? cmd[i] : file[i - ncmd]).kind;
    globs |= k != Q_NAME;
    labels |= k == Q_LABEL;
  }
  static struct pool_notes notes; /* ~200 KiB: off the stack */
  notes.valid = false;
  if (labels) {
    umbp_pool_info info;
    if (umbp_pool_get_info(p, &info) == 0) notes_read(pool, info.uuid, &notes);
  }
  for (uint32_t id = 0; id < UMBP_MAX_NAMESPACES; id++) {
    if (!globs && !set_by_pattern[id]) continue;
    umbp_ns_info ni;
    if (umbp_ns_info_get(p, id, &ni)) continue;
    const char *label = notes_label(&notes, ni.name);
    const struct quota *win = NULL;
    for (unsigned i = 0; i < ncmd + nfile; i++) {
      const struct quota *q = i < ncmd ? &cmd[i] : &file[i - ncmd];
      bool m = q->kind == Q_NAME   ? !strcmp(q->ns, ni.name)
               : q->kind == Q_GLOB ? fnmatch(q->ns, ni.name, 0) == 0
                                   : label && fnmatch(q->ns, label, 0) == 0;
      if (m) win = q;
    }
    char b[32], w[600];
    if (win && win->kind != Q_NAME) {
      set_by_pattern[id] = true;
      if (ni.quota_bytes == win->bytes) continue;
      if (umbp_ns_set_quota(p, id, win->bytes))
        dlog("error: quota of namespace '%s' not applied: %s", cli_safe(ni.name), umbp_last_error());
      else
        dlog("quota of namespace '%s' (id %u%s%s%s): %s, from the quota of %s", cli_safe(ni.name), id,
             label ? ", label '" : "", label ? cli_safe(label) : "", label ? "'" : "", win->bytes ? cli_fmt_size(win->bytes, b, sizeof b) : "none",
             quota_what(win, w, sizeof w));
    } else if (!win && set_by_pattern[id]) {
      set_by_pattern[id] = false;
      if (ni.quota_bytes && umbp_ns_set_quota(p, id, 0) == 0)
        dlog("quota of namespace '%s' (id %u): none (no quota matches it any more)", cli_safe(ni.name), id);
    } else if (win) {
      /* A name quota holds it. apply_quotas() set it, but for one of the
       * command line only at start: when a glob or label line that had
       * overridden it is gone (SIGHUP), it goes back to its own bytes here
       * (it kept the pattern's bytes for good). */
      if (set_by_pattern[id] && ni.quota_bytes != win->bytes) {
        if (umbp_ns_set_quota(p, id, win->bytes))
          dlog("error: quota of namespace '%s' not applied: %s", cli_safe(ni.name), umbp_last_error());
        else
          dlog("quota of namespace '%s' (id %u): %s, its own again (no glob or label quota after it matches it any "
               "more)", cli_safe(ni.name), id, win->bytes ? cli_fmt_size(win->bytes, b, sizeof b) : "none");
      }
      set_by_pattern[id] = false;
    }
  }
}

/* ---- options ---------------------------------------------------------------- */
struct dopts {
  const char *pool, *log, *quota_file;
  umbp_pool_params pp;
  bool have_cap, have_slot, foreground, unlink_on_exit, auto_nodes;
  unsigned reap_ms, low, high;
  struct quota quotas[MAX_QUOTAS];
  unsigned nquotas;
  const char *metrics; /* --metrics ADDRESS:PORT, NULL: off */
  struct sockaddr_storage maddr;
  socklen_t mlen;
};

static bool want_help(int argc, char **argv) {
  for (int i = 1; i < argc; i++)
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) return true;
  return false;
}

static int parse_uint(const char *s, unsigned lo, unsigned hi, unsigned *out) {
  char *end;
  errno = 0;
  unsigned long v = strtoul(s, &end, 10);
  if (errno || end == s || *end || v < lo || v > hi || *s == '-') return -1;
  *out = (unsigned)v;
  return 0;
}

static int parse_opts(int argc, char **argv, struct dopts *o) {
  enum { O_POOL = 256, O_CAP, O_SLOT, O_NODES, O_GROUP, O_NOPF, O_FG, O_LOG, O_UNLINK, O_QUOTA, O_QFILE, O_REAP, O_LOW, O_HIGH, O_IPAGES, O_METRICS };
  static const struct option opts[] = {
      {"pool", required_argument, 0, O_POOL},         {"capacity", required_argument, 0, O_CAP},
      {"slot-size", required_argument, 0, O_SLOT},    {"numa-nodes", required_argument, 0, O_NODES},
      {"group", required_argument, 0, O_GROUP},       {"no-prefault", no_argument, 0, O_NOPF},
      {"foreground", no_argument, 0, O_FG},           {"log", required_argument, 0, O_LOG},
      {"unlink-on-exit", no_argument, 0, O_UNLINK},   {"quota", required_argument, 0, O_QUOTA},
      {"quota-file", required_argument, 0, O_QFILE},  {"reap-interval", required_argument, 0, O_REAP},
      {"evict-low", required_argument, 0, O_LOW},     {"evict-high", required_argument, 0, O_HIGH},
      {"index-pages", required_argument, 0, O_IPAGES}, {"metrics", required_argument, 0, O_METRICS},
      {0, 0, 0, 0}};
  umbp_pool_params_init(&o->pp);
  o->reap_ms = REAP_MS_DEFAULT;
  o->low = EVICT_LOW_PCT_DEFAULT;
  o->high = EVICT_HIGH_PCT_DEFAULT;
  bool low_given = false, high_given = false; /* for the message when low >= high */
  optind = 1;
  opterr = 0;
  int c;
  while ((c = getopt_long(argc, argv, ":", opts, NULL)) != -1) {
    uint64_t v;
    switch (c) {
    case O_POOL:
      if (o->pool && strcmp(o->pool, optarg))
        return cli_usage_error("daemon", "--pool '%s' names a second pool after '%s': give the pool once", optarg,
                               o->pool);
      o->pool = optarg;
      break;
    case O_IPAGES:
      if (cli_parse_index_pages(optarg, &o->pp.index_pages))
        return cli_usage_error("daemon", "--index-pages '%s': use try, huge or small", optarg);
      break;
    case O_CAP:
      if (cli_parse_size(optarg, &v) || v == 0)
        return cli_usage_error("daemon", "--capacity '%s' is not a size: use e.g. 8GiB or 512MiB", optarg);
      o->pp.capacity = v;
      o->have_cap = true;
      break;
    case O_SLOT:
      if (cli_parse_slot_size("daemon", optarg, &o->pp.slot_size) != CLI_OK) return CLI_USAGE;
      o->have_slot = true;
      break;
    case O_NODES:
      if (cli_parse_numa_nodes("daemon", optarg, &o->pp, &o->auto_nodes) != CLI_OK) return CLI_USAGE;
      break;
    case O_GROUP:
      o->pp.group_access = true;
      if (cli_parse_group("daemon", optarg, &o->pp.group) != CLI_OK) return CLI_USAGE;
      break;
    case O_NOPF: o->pp.no_prefault = true; break;
    case O_FG: o->foreground = true; break;
    /* --log and --quota-file name one file each: a second one used to
     * replace the first without a word, whose quotas then never applied */
    case O_LOG:
      if (o->log && strcmp(o->log, optarg))
        return cli_usage_error("daemon", "--log '%s' after --log '%s': the daemon logs to one file: give one", optarg,
                               o->log);
      o->log = optarg;
      break;
    case O_UNLINK: o->unlink_on_exit = true; break;
    case O_QUOTA: {
      const char *eq = strrchr(optarg, '=');
      struct quota q;
      if (!eq || cli_parse_size(eq + 1, &v) || parse_quota_key(optarg, (size_t)(eq - optarg), &q)) {
        char why[300];
        return cli_usage_error("daemon",
                               "--quota '%s': use NAMESPACE=SIZE, e.g. --quota chat=8GiB, 'vllm-*=8GiB' or "
                               "'label:Qwen*=8GiB'%s%s", optarg, eq ? ": " : "",
                               eq ? quota_why(optarg, (size_t)(eq - optarg), eq + 1, why, sizeof why) : "");
      }
      if (o->nquotas == MAX_QUOTAS) return cli_usage_error("daemon", "more than %d --quota options", MAX_QUOTAS);
      q.bytes = v;
      o->quotas[o->nquotas++] = q;
      break;
    }
    case O_QFILE:
      if (o->quota_file && strcmp(o->quota_file, optarg))
        return cli_usage_error("daemon", "--quota-file '%s' after --quota-file '%s': the daemon reads one quota file: "
                               "put every line in one (or use --quota NS=SIZE for more)", optarg, o->quota_file);
      o->quota_file = optarg;
      break;
    case O_METRICS: {
      char why[300];
      if (metrics_parse_addr(optarg, &o->maddr, &o->mlen, why, sizeof why))
        return cli_usage_error("daemon", "--metrics '%s': %s", optarg, why);
      o->metrics = optarg;
      break;
    }
    case O_REAP:
      if (parse_uint(optarg, 1, REAP_MS_MAX, &o->reap_ms))
        return cli_usage_error("daemon", "--reap-interval '%s': use 1 to %u milliseconds", optarg, REAP_MS_MAX);
      break;
    case O_LOW:
      if (parse_uint(optarg, 1, 99, &o->low)) return cli_usage_error("daemon", "--evict-low '%s': use 1 to 99", optarg);
      low_given = true;
      break;
    case O_HIGH:
      if (parse_uint(optarg, 2, 100, &o->high))
        return cli_usage_error("daemon", "--evict-high '%s': use 2 to 100", optarg);
      high_given = true;
      break;
    case ':': return cli_usage_error("daemon", "option '%s' needs a value", argv[optind - 1]);
    default: return cli_bad_option("daemon", opts, argv[optind - 1]);
    }
  }
  /* The pool is positional as in 'umbp pool create NAME' and 'umbp inspect
   * NAME'; --pool NAME (the older spelling) is the same, and giving both is
   * fine when they agree. getopt_long has permuted the operands to the end. */
  if (optind < argc) {
    if (o->pool && strcmp(o->pool, argv[optind]))
      return cli_usage_error("daemon", "the pool is named twice, '%s' and --pool '%s': give it once", argv[optind],
                             o->pool);
    o->pool = argv[optind++];
  }
  if (optind < argc)
    return cli_usage_error("daemon", "unexpected argument '%s' after the pool name '%s': one pool per daemon", argv[optind],
                           o->pool);
  if (!o->pool) return cli_usage_error("daemon", "missing pool NAME: 'umbp daemon NAME --capacity SIZE'");
  if (umbp_pool_name_valid(o->pool)) return cli_usage_error("daemon", "%s", umbp_last_error());
  /* one of the two given: the other is its default, which the user did not
   * write ("--evict-low 5 must be below --evict-high 5" for --evict-high 5) */
  if (o->low >= o->high)
    return cli_usage_error("daemon", "--evict-low %u%s must be below --evict-high %u%s: %s", o->low,
                           low_given ? "" : " (the default)", o->high, high_given ? "" : " (the default)",
                           !low_given ? "give a lower --evict-low too"
                           : !high_given ? "give a higher --evict-high too"
                                         : "lower --evict-low or raise --evict-high");
  if (o->have_cap && cli_check_slots("daemon", o->pp.capacity, o->pp.slot_size) != CLI_OK) return CLI_USAGE;
  if (o->log && o->foreground) return cli_usage_error("daemon", "--log is for the background mode; with --foreground the log goes to stderr");
  return CLI_OK;
}

/* ---- pool setup ------------------------------------------------------------- */
static const char *uid_name(uid_t u, char *buf, size_t n) {
  struct passwd *pw = getpwuid(u);
  snprintf(buf, n, "%s", pw ? pw->pw_name : "?");
  return buf;
}

static int resolve_auto_nodes(struct dopts *o) {
  umbp_topo *topo;
  umbp_topo_plan *plan;
  int rc = umbp_topo_load(NULL, 0, &topo);
  if (rc) return fatal("--numa-nodes auto: %s", umbp_last_error());
  umbp_topo_plan_opts po = UMBP_TOPO_PLAN_OPTS_INIT;
  rc = umbp_topo_plan_make(topo, &po, &plan);
  if (rc) {
    umbp_topo_free(topo);
    return fatal("--numa-nodes auto: %s", umbp_last_error());
  }
  unsigned nodes[UMBP_MAX_PARTITIONS];
  int n = umbp_topo_plan_numa_nodes(plan, nodes, UMBP_MAX_PARTITIONS);
  o->pp.n_numa_nodes = 0;
  for (int i = 0; i < n && i < UMBP_MAX_PARTITIONS; i++) o->pp.numa_nodes[o->pp.n_numa_nodes++] = (int)nodes[i];
  umbp_topo_plan_free(plan);
  umbp_topo_free(topo);
  return CLI_OK;
}

/* Adopt an existing pool: checks with a read-only handle first (owner uid, a
 * running daemon), then attaches read-write as the daemon. */
static int adopt(struct dopts *o, umbp_pool **ret) {
  umbp_attach_opts ao;
  umbp_attach_opts_init(&ao);
  ao.read_only = true;
  umbp_pool *ro;
  int rc = umbp_pool_attach(o->pool, &ao, &ro);
  if (rc == -ENOENT && !o->have_cap)
    return fatal("no pool named '%s' and no --capacity to create it: give --capacity SIZE (e.g. 8GiB)", o->pool);
  if (rc == -EOWNERDEAD && !o->have_cap)
    return fatal("cannot adopt pool '%s': %s; a daemon given --capacity SIZE replaces it too", o->pool,
                 umbp_last_error());
  if (rc == -EBADMSG || rc == -EPROTO)
    return fatal("cannot adopt pool '%s': %s (if it is corrupted: 'umbp pool destroy %s', then start the daemon "
                 "again)",
                 o->pool, umbp_last_error(), o->pool);
  if (rc == -EACCES) {
    /* Another user's pool that this uid may not even read: the attach's
     * advice ("ask its owner to create it with group access") would not let
     * this daemon adopt it either, as the uid check below refuses it then.
     * Say what does (as for a readable pool of another uid). */
    char path[600], hdir[256], a[64], b[64];
    struct stat fst;
    snprintf(path, sizeof path, "/dev/shm/umbp.%s", o->pool);
    bool found = stat(path, &fst) == 0;
    if (!found && umbp_admin_hugetlbfs_mount(hdir, sizeof hdir) == 0) {
      snprintf(path, sizeof path, "%s/umbp.%s", hdir, o->pool);
      found = stat(path, &fst) == 0;
    }
    if (found && fst.st_uid != geteuid())
      return fatal("refusing to adopt pool '%s': its file %s belongs to uid %u (%s), not to this daemon's uid %u "
                   "(%s); run the daemon as that user, or destroy the pool (as that user) and let this daemon "
                   "create it",
                   o->pool, path, (unsigned)fst.st_uid, uid_name(fst.st_uid, a, sizeof a), (unsigned)geteuid(),
                   uid_name(geteuid(), b, sizeof b));
  }
  if (rc) return fatal("cannot adopt pool '%s': %s", o->pool, umbp_last_error());
  struct stat st;
  if (umbp_admin_pool_stat(ro, &st) != 0) {
    cli_pool_detach(ro);
    return fatal("cannot stat pool '%s': %s", o->pool, umbp_last_error());
  }
  if (st.st_uid != geteuid()) {
    char a[64], b[64];
    umbp_pool_info ri;
    umbp_pool_get_info(ro, &ri); /* the path, for the message */
    const char *path = ri.path;
    cli_pool_detach(ro);
    return fatal("refusing to adopt pool '%s': its file %s belongs to uid %u (%s), not to this daemon's uid %u "
                 "(%s); run the daemon as that user, or destroy the pool and let this daemon create it",
                 o->pool, path, (unsigned)st.st_uid, uid_name(st.st_uid, a, sizeof a), (unsigned)geteuid(),
                 uid_name(geteuid(), b, sizeof b));
  }
  int pid = -1;
  if (umbp_admin_daemon_query(ro, &pid, NULL) == 1) {
    cli_pool_detach(ro);
    char adv[256];
    if (pid > 0)
      return fatal("pool '%s' already has a daemon (pid %d): %s", o->pool, pid, cli_stop_advice(pid, adv, sizeof adv));
    return fatal("pool '%s' already has a daemon (pid unknown): stop it first", o->pool);
  }
  cli_pool_detach(ro);
  ao.read_only = false;
  ao.role = UMBP_ROLE_DAEMON;
  umbp_pool *p;
  rc = umbp_pool_attach(o->pool, &ao, &p);
  if (rc) return fatal("cannot adopt pool '%s': %s", o->pool, umbp_last_error());
  uint64_t gen = 0; /* this adoption's run generation: one more than the last run's */
  rc = umbp_admin_daemon_lock(p, &gen);
  if (rc) {
    cli_pool_detach(p);
    return fatal("%s", umbp_last_error());
  }
  umbp_slot_census c;
  umbp_census(p, &c);
  umbp_pool_info info;
  umbp_pool_get_info(p, &info);
  char b1[32], b2[32];
  dlog("adopted pool '%s' (%s, %u slots of %s): run generation %llu, %llu published blocks kept", o->pool,
       info.path, info.slot_count, cli_fmt_size(info.slot_size, b1, sizeof b1), (unsigned long long)gen,
       (unsigned long long)c.published);
  /* Name only the options given that differ: the capacity in bytes of whole
   * slots (of --slot-size when given, else of the pool's slot size), the
   * slot size when given. */
  uint64_t slot = o->have_slot ? o->pp.slot_size : info.slot_size;
  bool cap_differs = o->have_cap && o->pp.capacity / slot * slot != (uint64_t)info.slot_count * info.slot_size;
  bool slot_differs = o->have_slot && o->pp.slot_size != info.slot_size;
  if (cap_differs || slot_differs) {
    char what[96];
    snprintf(what, sizeof what, "%s%s%s%s%s", cap_differs ? "--capacity " : "",
             cap_differs ? cli_fmt_size(o->pp.capacity, b1, sizeof b1) : "", cap_differs && slot_differs ? " / " : "",
             slot_differs ? "--slot-size " : "", slot_differs ? cli_fmt_size(o->pp.slot_size, b2, sizeof b2) : "");
    dlog("note: %s %s from the existing pool's; %s only when the pool is created (destroy it to change %s)", what,
         cap_differs && slot_differs ? "differ" : "differs", cap_differs && slot_differs ? "they apply" : "it applies",
         cap_differs && slot_differs ? "them" : "it");
  }
  /* So do an explicit --numa-nodes list and --index-pages huge/small: a
   * changed one was ignored without a word ('auto' and 'all' are not
   * compared: they name no nodes until a pool is created). */
  bool nodes_differ = false;
  if (o->pp.n_numa_nodes && !o->auto_nodes) {
    nodes_differ = o->pp.n_numa_nodes != info.n_partitions;
    for (unsigned i = 0; !nodes_differ && i < o->pp.n_numa_nodes; i++)
      nodes_differ = o->pp.numa_nodes[i] != info.partitions[i].numa_node;
  }
  if (nodes_differ) {
    char have[160] = "";
    size_t l = 0;
    for (unsigned i = 0; i < info.n_partitions && l < sizeof have - 16; i++)
      l += info.partitions[i].numa_node < 0
               ? (size_t)snprintf(have + l, sizeof have - l, "%snone", i ? "," : "")
               : (size_t)snprintf(have + l, sizeof have - l, "%s%d", i ? "," : "", info.partitions[i].numa_node);
    dlog("note: --numa-nodes differs from the existing pool's partitions (on node%s %s): it applies only when the "
         "pool is created; destroy the pool ('umbp pool destroy %s') and start the daemon again to change it",
         info.n_partitions == 1 ? "" : "s", have, o->pool);
  }
  if ((o->pp.index_pages == UMBP_INDEX_PAGES_HUGE && !info.index_hugepages) ||
      (o->pp.index_pages == UMBP_INDEX_PAGES_SMALL && info.index_hugepages))
    dlog("note: --index-pages %s differs from the existing pool's (index on %s pages): it applies only when the pool "
         "is created; destroy the pool ('umbp pool destroy %s') and start the daemon again to change it",
         o->pp.index_pages == UMBP_INDEX_PAGES_HUGE ? "huge" : "small", info.index_hugepages ? "2 MiB" : "4 KiB",
         o->pool);
  /* --group too applies only at creation: a pool made 0600, or for another
   * group (UMBP_GROUP changed in the systemd unit), stays so, and the
   * group's engines cannot attach; that was not said anywhere. */
  if (o->pp.group_access && ((st.st_mode & 0060) != 0060 || st.st_gid != o->pp.group)) {
    char g1[64], g2[64];
    struct group *gr = getgrgid(o->pp.group);
    snprintf(g1, sizeof g1, "%s", gr ? gr->gr_name : "");
    gr = getgrgid(st.st_gid);
    snprintf(g2, sizeof g2, "%s", gr ? gr->gr_name : "?");
    dlog("note: --group %s%s%u%s differs from the existing pool's (mode %04o, group %u (%s)): it applies only when the "
         "pool is created, so processes of that group that are not uid %u cannot attach; destroy the pool "
         "('umbp pool destroy %s') and start the daemon again to change it",
         g1, *g1 ? " (gid " : "", (unsigned)o->pp.group, *g1 ? ")" : "", (unsigned)(st.st_mode & 07777),
         (unsigned)st.st_gid, g2, (unsigned)st.st_uid, o->pool);
  }
  *ret = p;
  return CLI_OK;
}

static int open_pool(struct dopts *o, umbp_pool **ret) {
  if (o->have_cap) {
    if (o->auto_nodes && resolve_auto_nodes(o) != CLI_OK) return CLI_RUNTIME;
    umbp_pool *p;
    int rc = umbp_pool_create(o->pool, &o->pp, &p);
    if (rc == 0) {
      rc = umbp_admin_set_role(p, UMBP_ROLE_DAEMON, -1); /* created under role "other" */
      if (!rc) rc = umbp_admin_daemon_lock(p, NULL);    /* run generation 1: the creation's */
      if (rc) {
        cli_pool_detach(p);
        return fatal("%s", umbp_last_error());
      }
      char b1[32], b2[32];
      umbp_pool_info info;
      char ib[256];
      umbp_pool_get_info(p, &info);
      dlog("created pool '%s' (%s): %u slots of %s in %u partition%s, %s in all; index on %s", o->pool, info.path,
           info.slot_count, cli_fmt_size(info.slot_size, b1, sizeof b1), info.n_partitions,
           info.n_partitions == 1 ? "" : "s", cli_fmt_size(info.total_size, b2, sizeof b2),
           cli_fmt_index_pages(&info, ib, sizeof ib));
      *ret = p;
      return CLI_OK;
    }
    if (rc != -EEXIST) return fatal("cannot create pool '%s': %s", o->pool, umbp_last_error());
  }
  return adopt(o, ret);
}

/* ---- the pool file under the daemon ------------------------------------------ */
/* Is the pool this daemon maps still the pool of that name, whole? NULL when
 * it is; else why not, in why (for the log). Checked every reap period:
 * `umbp pool destroy --force` unlinks the file under a running daemon (which
 * would go on serving a pool nobody can attach to, while a second daemon
 * starts on a re-created one), and a file truncated under the mapping makes
 * every process touching the lost part die of SIGBUS. */
static const char *pool_file_lost(umbp_pool *p, const umbp_pool_info *info, char *why, size_t n) {
  struct stat mine, named;
  if (umbp_admin_pool_stat(p, &mine) != 0) {
    snprintf(why, n, "%s", umbp_last_error());
    return why;
  }
  if (mine.st_nlink == 0 || stat(info->path, &named) != 0 || named.st_ino != mine.st_ino ||
      named.st_dev != mine.st_dev) {
    snprintf(why, n, "pool '%s' was destroyed while this daemon ran (%s %s): nobody can attach to the pool it serves; "
                     "start the daemon again to create or adopt the pool of that name",
             info->name, info->path, stat(info->path, &named) == 0 ? "now names another pool" : "was removed");
    return why;
  }
  if ((uint64_t)mine.st_size < info->total_size) {
    char a[32], b[32];
    snprintf(why, n, "the file of pool '%s' (%s) shrank from %s to %s under the running processes: any of them that "
                     "touches the lost part dies of SIGBUS; stop them, destroy the pool ('umbp pool destroy %s') and "
                     "create it again",
             info->name, info->path, cli_fmt_size(info->total_size, a, sizeof a),
             cli_fmt_size((uint64_t)mine.st_size, b, sizeof b), info->name);
    return why;
  }
  return NULL;
}

/* ---- paths and the log file ---------------------------------------------- */
/* Make *name (the value of option opt) absolute in buf when it is relative:
 * 0, or -1 said with cli_error(). */
static int make_absolute(const char *opt, const char **name, char *buf, size_t n) {
  if (!*name || (*name)[0] == '/') return 0;
  char cwd[4096];
  if (!getcwd(cwd, sizeof cwd)) {
    cli_error("%s %s: cannot tell the current directory to make it absolute: %s", opt, *name, strerror(errno));
    return -1;
  }
  if ((size_t)snprintf(buf, n, "%s/%s", strcmp(cwd, "/") ? cwd : "", *name) >= n) {
    cli_error("%s %s: its absolute name (in %s) is longer than %zu bytes", opt, *name, cwd, n - 1);
    return -1;
  }
  *name = buf;
  return 0;
}

/* Open --log FILE for appending: the fd, or -errno. O_NONBLOCK: open(2) of a
 * FIFO for writing waits for a reader, which hung `umbp daemon --log FIFO`
 * for good; without a reader it now fails with ENXIO. It stays set: a log
 * reader that stops reading costs the lines that do not fit in the pipe,
 * never a stalled main loop or evictor. A regular file ignores it. */
static int open_log(const char *path) {
  int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC | O_NONBLOCK, 0640);
  return fd >= 0 ? fd : -errno;
}

static const char *log_open_error(int e, char *buf, size_t n) {
  if (e == ENXIO)
    snprintf(buf, n, "it is a FIFO that no process has open for reading: start its reader first, or log to a "
                     "regular file");
  else if (e == EISDIR)
    snprintf(buf, n, "%s: name a file (in that directory, e.g. umbp-daemon.log) to append the log to", strerror(e));
  else
    snprintf(buf, n, "%s", strerror(e));
  return buf;
}

/* SIGHUP: open --log FILE again, so that a log rotated by renaming it
 * (logrotate's default, then 'kill -HUP') is written anew under its name
 * instead of on into the renamed file. If it cannot be opened, the log goes
 * on into the file open before, which says so. */
static void reopen_log(const char *path) {
  int fd = open_log(path);
  if (fd < 0) {
    char why[300];
    dlog("error: SIGHUP: cannot reopen log file %s: %s; logging on to the file opened before", path,
         log_open_error(-fd, why, sizeof why));
    return;
  }
  if (dup2(fd, 2) < 0) dlog("error: SIGHUP: cannot reopen log file %s: dup2: %s", path, strerror(errno));
  else dlog("SIGHUP: log file %s reopened", path);
  close(fd);
}

/* ---- daemonising ------------------------------------------------------------ */
/* Returns in the daemon (grandchild); the first parent exits from here with
 * the daemon's verdict. */
static void daemonise(const char *pool, int log_fd) {
  int pfd[2];
  if (pipe(pfd) != 0) {
    cli_error("cannot create a pipe: %s", strerror(errno));
    exit(CLI_RUNTIME);
  }
  fflush(NULL);
  pid_t pid = fork();
  if (pid < 0) {
    cli_error("cannot fork: %s", strerror(errno));
    exit(CLI_RUNTIME);
  }
  if (pid > 0) {
    close(pfd[1]);
    int st;
    waitpid(pid, &st, 0); /* the intermediate child exits at once */
    /* The intermediate child writes the daemon's "pid N\n" before it exits,
     * the daemon then its verdict, which may take minutes (pre-faulting a
     * large pool). A daemon stopped before it (SIGSTOP,
     * a debugger) never gives one, and this command waited for it without
     * bound: while it waits it looks every second whether the daemon is
     * stopped, and then says so and gives up. */
    char msg[1100];
    size_t n = 0;
    int dpid = -1;
    for (;;) {
      struct pollfd pf = {.fd = pfd[0], .events = POLLIN};
      int pr = poll(&pf, 1, 1000);
      if (pr < 0 && errno == EINTR) continue;
      if (pr == 0) {
        if (dpid > 0 && cli_pid_stopped(dpid)) {
          cli_error("daemon for pool '%s' did not start: its process (pid %d) is stopped (SIGSTOP or a debugger) "
                    "before it was ready; resume it (kill -CONT %d) and it goes on, 'umbp inspect %s' then names "
                    "it, or end it (kill -KILL %d)",
                    pool, dpid, dpid, pool, dpid);
          exit(CLI_RUNTIME);
        }
        continue;
      }
      ssize_t r = pr < 0 ? -1 : read(pfd[0], msg + n, sizeof msg - 1 - n);
      if (r <= 0) break;
      n += (size_t)r;
      msg[n] = 0;
      char *nl = dpid < 0 && !strncmp(msg, "pid ", 4) ? strchr(msg, '\n') : NULL;
      if (nl) { /* the daemon's pid: kept, and taken off the message */
        dpid = atoi(msg + 4);
        size_t h = (size_t)(nl + 1 - msg);
        memmove(msg, nl + 1, n - h);
        n -= h;
      }
      if (n + 1 >= sizeof msg) break;
    }
    msg[n] = 0;
    if (!strncmp(msg, "ok ", 3)) {
      printf("umbp daemon: pool '%s' is served by pid %s\n", pool, msg + 3);
      exit(cli_stdout_check("daemon")); /* main()'s check is not reached from here */
    }
    cli_error("daemon for pool '%s' did not start: %s", pool, n ? msg : "it exited without a word (see its --log)");
    exit(CLI_RUNTIME);
  }
  close(pfd[0]);
  /* The caller's stdout and stderr are given up here, before the daemon is
   * forked: a daemon stopped at any point (SIGSTOP, a debugger) must not hold
   * the caller's pipe open, or `out=$(umbp daemon P)` waits for it. A parent
   * gone (its user pressed Ctrl-C) is no reason to die of SIGPIPE. */
  signal(SIGPIPE, SIG_IGN);
  if (chdir("/") != 0) { /* nothing depends on the cwd */
  }
  int nul = open("/dev/null", O_RDWR);
  if (nul >= 0) {
    dup2(nul, 0);
    dup2(nul, 1);
    dup2(log_fd >= 0 ? log_fd : nul, 2);
    if (nul > 2) close(nul);
  }
  if (log_fd > 2) close(log_fd);
  if (setsid() < 0) _exit(CLI_RUNTIME);
  int order[2]; /* the daemon writes nothing before this process has exited */
  if (pipe(order) != 0) _exit(CLI_RUNTIME);
  pid = fork();
  if (pid < 0) _exit(CLI_RUNTIME);
  if (pid > 0) {
    /* the daemon's pid, for the waiting parent (see above), sent from here so
     * that the parent has it even when the daemon is stopped before its first
     * step; the verdict's write fails the same way, harmlessly */
    char hello[32];
    int hl = snprintf(hello, sizeof hello, "pid %d\n", (int)pid);
    if (write(pfd[1], hello, (size_t)hl) < 0) {
    }
    _exit(0); /* closes order[1]: the daemon's read below returns */
  }
  close(order[1]);
  char b;
  while (read(order[0], &b, 1) < 0 && errno == EINTR) {
  }
  close(order[0]);
  report_fd = pfd[1];
}

/* ---- main ------------------------------------------------------------------- */
/* Processes the daemon saw stopped (state T in /proc) at its last check, by
 * registry slot: since when, and under which incarnation of the slot. */
struct stopped_seen {
  uint64_t since_ns, incarnation;
  bool logged;
};

static uint64_t mono_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* One check per reap period: log a live process that stays stopped (SIGSTOP,
 * a debugger) with the pins it holds (nothing else of the pool waits for it:
 * src/index), once, and again when it resumes. */
static void watch_stopped(umbp_pool *p, struct stopped_seen *seen) {
  umbp_proc_info pr[UMBP_MAX_PROCS];
  int np = umbp_pool_list_procs(p, pr, UMBP_MAX_PROCS);
  bool now_stopped[UMBP_MAX_PROCS] = {false};
  uint64_t pins[UMBP_MAX_PROCS];
  bool have_pins = false;
  uint64_t now = mono_ns();
  for (int k = 0; k < np; k++) {
    const umbp_proc_info *q = &pr[k];
    if (!q->alive || q->pid <= 0 || q->slot >= UMBP_MAX_PROCS) continue;
    if (!cli_pid_stopped(q->pid)) continue;
    now_stopped[q->slot] = true;
    struct stopped_seen *e = &seen[q->slot];
    if (!e->since_ns || e->incarnation != q->incarnation) {
      *e = (struct stopped_seen){.since_ns = now, .incarnation = q->incarnation};
      continue; /* logged if still stopped at the next check */
    }
    if (e->logged) continue;
    if (!have_pins) have_pins = umbp_admin_pins_by_proc(p, pins, UMBP_MAX_PROCS) > 0;
    dlog("process %d (%s, registry slot %u) has been stopped for %.1f s (SIGSTOP or a debugger); it holds %llu "
         "pins, whose blocks cannot be evicted until it resumes (kill -CONT %d); nothing else waits for it",
         q->pid, q->comm, q->slot, (double)(now - e->since_ns) / 1e9,
         have_pins ? (unsigned long long)pins[q->slot] : 0ull, q->pid);
    e->logged = true;
  }
  for (unsigned i = 0; i < UMBP_MAX_PROCS; i++) {
    if (now_stopped[i] || !seen[i].since_ns) continue;
    if (seen[i].logged) dlog("registry slot %u's process resumed (or left) after %.1f s stopped", i,
                             (double)(now - seen[i].since_ns) / 1e9);
    seen[i] = (struct stopped_seen){0};
  }
}

/* Does pool `name` exist with a daemon running? *pid: its pid (-1: not
 * known). A read-only attach: it changes nothing, and false when the pool
 * cannot be attached. */
static bool pool_has_daemon(const char *name, int *pid) {
  umbp_attach_opts ao;
  umbp_attach_opts_init(&ao);
  ao.read_only = true;
  ao.role = UMBP_ROLE_TOOL;
  umbp_pool *ro;
  if (umbp_pool_attach(name, &ao, &ro)) return false;
  bool yes = umbp_admin_daemon_query(ro, pid, NULL) == 1;
  umbp_pool_detach(ro);
  return yes;
}

int cmd_daemon(int argc, char **argv) {
  if (want_help(argc, argv)) {
    printf(daemon_usage, metrics_http_available() ? " (this one is)" : " (this one is NOT: install libmicrohttpd-dev and rebuild)");
    return CLI_OK;
  }
  static struct dopts o; /* quotas table: keep it off the stack */
  memset(&o, 0, sizeof o);
  int rc = parse_opts(argc, argv, &o);
  if (rc != CLI_OK) return rc;
  /* static: the first parent of daemonise() exits with it allocated, and a
   * pointer held only in a dead register is reported as a leak by LSan */
  static struct quota *fileq; /* the file's quotas in force, then room for a re-read on SIGHUP */
  fileq = calloc(2 * MAX_QUOTAS, sizeof *fileq);
  if (!fileq) return CLI_RUNTIME;
  struct quota *newq = fileq + MAX_QUOTAS;
  unsigned nfileq = 0, nnewq = 0;
  char err[600];
  /* --quota-file is read again and --log opened again on SIGHUP, after
   * daemonise() has changed to "/": a relative name is made absolute against
   * the directory it was given in. Not realpath(): a symlink stays a symlink,
   * so that pointing it at a new file and sending SIGHUP reads the new file. */
  static char qpath[4096], lpath[4096];
  if (make_absolute("--quota-file", &o.quota_file, qpath, sizeof qpath) ||
      make_absolute("--log", &o.log, lpath, sizeof lpath)) {
    free(fileq);
    return CLI_RUNTIME;
  }
  if (o.quota_file && read_quota_file(o.quota_file, fileq, &nfileq, err, sizeof err)) {
    cli_error("%s", err);
    free(fileq);
    return CLI_RUNTIME;
  }
  int log_fd = -1;
  if (!o.foreground && o.log) {
    log_fd = open_log(o.log);
    if (log_fd < 0) {
      char why[300];
      cli_error("cannot open log file %s: %s", o.log, log_open_error(-log_fd, why, sizeof why));
      free(fileq);
      return CLI_RUNTIME;
    }
  }
  if (!o.foreground) daemonise(o.pool, log_fd);
  /* --foreground logs to stderr. A pipe or socket whose reader stopped
   * reading (a stopped 'less' or 'tee', a stuck journal) filled up and held
   * the daemon in write() without bound: no reaping, no eviction, SIGTERM not
   * acted on. As for a --log FIFO, a line it has no room for is dropped, not
   * waited for. A terminal or a file is left blocking (a terminal's open file
   * description is the shell's too). */
  struct stat efd;
  if (o.foreground && fstat(2, &efd) == 0 && (S_ISFIFO(efd.st_mode) || S_ISSOCK(efd.st_mode))) {
    int fl = fcntl(2, F_GETFL);
    if (fl >= 0) fcntl(2, F_SETFL, fl | O_NONBLOCK);
  }

  /* Signals are taken synchronously by the main loop; block them before any
   * library thread (the evictor) starts so that it inherits the mask. */
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &set, NULL);
  signal(SIGPIPE, SIG_IGN);
  umbp_log_set(lib_log, NULL, UMBP_LOG_INFO);

  /* The metrics socket is bound before the pool is created, so a port that
   * is taken leaves no new pool behind. */
  int mfd = -1;
  if (o.metrics) {
    if (!metrics_http_available()) {
      free(fileq);
      return fatal("--metrics %s: this umbp was built without libmicrohttpd: install libmicrohttpd-dev "
                   "(scripts/setup.sh) and rebuild, or use 'umbp inspect %s --prometheus'", o.metrics, o.pool);
    }
    mfd = metrics_listen(&o.maddr, o.mlen);
    /* A daemon started twice with the same --metrics finds the port taken by
     * the pool's own daemon: "pick another one" sent the operator to another
     * port, only for the start to fail there on that daemon. Say which. */
    int dpid = -1;
    if (mfd == -EADDRINUSE && pool_has_daemon(o.pool, &dpid)) {
      free(fileq);
      char adv[256];
      if (dpid > 0)
        return fatal("--metrics %s: cannot listen: %s: pool '%s' already has a daemon (pid %d), which may be the one "
                     "on this port: %s",
                     o.metrics, strerror(EADDRINUSE), o.pool, dpid, cli_stop_advice(dpid, adv, sizeof adv));
      return fatal("--metrics %s: cannot listen: %s: pool '%s' already has a daemon (pid unknown): stop it first",
                   o.metrics, strerror(EADDRINUSE), o.pool);
    }
    if (mfd < 0) {
      free(fileq);
      bool v6 = o.maddr.ss_family == AF_INET6; /* the fix names an address of the same family */
      return fatal("--metrics %s: cannot listen: %s%s", o.metrics, strerror(-mfd),
                   mfd == -EADDRINUSE ? " (another process has this port: pick another one)"
                   : mfd == -EADDRNOTAVAIL
                       ? (v6 ? " (no interface of this host has that address: use [::1] or [::])"
                             : " (no interface of this host has that address: use 127.0.0.1 or 0.0.0.0)")
                   : mfd == -EAFNOSUPPORT ? " (IPv6 is disabled on this host: use 127.0.0.1 or 0.0.0.0)"
                   : mfd == -EACCES       ? " (ports below 1024 need root or CAP_NET_BIND_SERVICE: use a higher one)"
                                          : "");
    }
  }

  umbp_pool *p = NULL;
  if (open_pool(&o, &p) != CLI_OK) {
    if (mfd >= 0) close(mfd);
    free(fileq);
    return CLI_RUNTIME;
  }
  char who[48]; /* a SIGBUS on the pool is logged like every other error line */
  snprintf(who, sizeof who, "umbp-daemon[%d]: error", (int)getpid());
  cli_fault_watch(p, who, true);
  apply_quotas(p, o.quotas, o.nquotas);
  apply_quotas(p, fileq, nfileq);
  static bool set_by_pattern[UMBP_MAX_NAMESPACES];
  apply_pattern_quotas(p, o.pool, o.quotas, o.nquotas, fileq, nfileq, set_by_pattern);
  rc = umbp_evictor_start(p, o.low, o.high, EVICTOR_PERIOD_MS);
  if (rc) {
    umbp_admin_daemon_unlock(p);
    cli_pool_detach(p);
    free(fileq);
    return fatal("cannot start the evictor: %s", umbp_last_error());
  }
  struct metrics_server *msrv = NULL;
  if (mfd >= 0) {
    char why[400];
    rc = metrics_serve(mfd, o.pool, &msrv, why, sizeof why);
    if (rc) {
      umbp_evictor_stop(p);
      umbp_admin_daemon_unlock(p);
      cli_pool_detach(p);
      free(fileq);
      return fatal("--metrics %s: %s", o.metrics, why);
    }
    dlog("serving metrics at http://%s/metrics", o.metrics);
  }
  int n = umbp_pool_reap(p);
  if (n > 0) dlog("reaped %d dead process%s left from before", n, n == 1 ? "" : "es");
  dlog("ready: pool '%s', reaping every %u ms, evicting below %u%% free up to %u%%", o.pool, o.reap_ms, o.low,
       o.high);
  notify_ready();
  if (report_fd >= 0) {
    char ok[32];
    int l = snprintf(ok, sizeof ok, "ok %d", (int)getpid());
    ssize_t w = write(report_fd, ok, (size_t)l);
    (void)w;
    close(report_fd);
    report_fd = -1;
  }

  int stop_sig = 0;
  struct stopped_seen stopped_since[UMBP_MAX_PROCS];
  memset(stopped_since, 0, sizeof stopped_since);
  char lost[700];
  const char *lost_why = NULL;
  umbp_pool_info pinfo; /* name, path and size: fixed for the pool's life */
  umbp_pool_get_info(p, &pinfo);
  /* The file is looked at after each wait, just before the period's work
   * touches the pool: a truncation during the wait is then seen (status 1)
   * before the heartbeat or a reap can fault on it. */
  while (!stop_sig) {
    struct timespec ts = {o.reap_ms / 1000, (long)(o.reap_ms % 1000) * 1000000L};
    int sig = sigtimedwait(&set, NULL, &ts);
    if (sig == SIGTERM || sig == SIGINT) {
      stop_sig = sig;
      break;
    }
    if ((lost_why = pool_file_lost(p, &pinfo, lost, sizeof lost))) break;
    if (sig == SIGHUP) {
      if (!o.foreground && o.log) reopen_log(o.log);
      if (!o.quota_file) {
        dlog("SIGHUP: no --quota-file to re-read; quotas unchanged");
      } else if (read_quota_file(o.quota_file, newq, &nnewq, err, sizeof err)) {
        dlog("error: SIGHUP: %s; quotas unchanged", err);
      } else {
        dlog("SIGHUP: re-reading quotas from %s (%u entr%s)", o.quota_file, nnewq, nnewq == 1 ? "y" : "ies");
        drop_removed_quotas(p, o.quotas, o.nquotas, fileq, nfileq, newq, nnewq);
        apply_quotas(p, newq, nnewq);
        memcpy(fileq, newq, nnewq * sizeof *newq);
        nfileq = nnewq;
      }
    }
    umbp_pool_heartbeat(p);
    apply_pattern_quotas(p, o.pool, o.quotas, o.nquotas, fileq, nfileq, set_by_pattern);
    n = umbp_pool_reap(p);
    if (n > 0) dlog("reaped %d dead process%s", n, n == 1 ? "" : "es");
    watch_stopped(p, stopped_since);
  }
  if (stop_sig) dlog("stopping on %s", stop_sig == SIGTERM ? "SIGTERM" : "SIGINT");
  if (!lost_why) lost_why = pool_file_lost(p, &pinfo, lost, sizeof lost); /* also lost by the signal's time? */
  if (lost_why) dlog("error: %s; stopping", lost_why);
  metrics_stop(msrv);
  umbp_evictor_stop(p);
  /* A short file: the header may be gone too, and a detach would fault on
   * the lost part; cli_pool_detach() abandons the handle instead (the kernel
   * drops its locks at exit; the pool's reaper sees this daemon dead). */
  bool is_short = cli_pool_file_short(p);
  if (!is_short) umbp_admin_daemon_unlock(p);
  if (cli_pool_detach(p) == 1)
    dlog("the pool's file is shorter than its mapping: let go of it without writing to it (this daemon's registry "
         "slot and daemon lock are released when it exits, as after a crash)");
  free(fileq);
  if (lost_why) {
    rc = -1; /* not ours to remove or keep any more */
  } else if (o.unlink_on_exit) {
    rc = umbp_pool_destroy(o.pool);
    notes_remove(o.pool); /* its notes (namespace labels) go with it */
    if (rc) dlog("error: --unlink-on-exit: %s", umbp_last_error());
    else dlog("pool '%s' destroyed (--unlink-on-exit)", o.pool);
  } else {
    dlog("pool '%s' kept for the next daemon", o.pool);
  }
  dlog("stopped");
  return rc ? CLI_RUNTIME : CLI_OK;
}
