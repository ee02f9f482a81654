/* SPDX-License-Identifier: Apache-2.0 */
/* Shared helpers of the umbp command-line tool. */
#ifndef UMBP_TOOLS_CLI_H
#define UMBP_TOOLS_CLI_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

#include <jansson.h>

/* Exit codes of every subcommand. CLI_POOL_FAULT: a SIGBUS on a pool's
 * mapping (its file truncated, or its file system full), said on stderr
 * (pool_fault.h). */
enum { CLI_OK = 0, CLI_RUNTIME = 1, CLI_USAGE = 2, CLI_POOL_FAULT = 3 };

/* A subcommand: argv[0] is the subcommand's own name. Returns an exit code. */
typedef int (*cli_fn)(int argc, char **argv);

struct cli_command {
  const char *name;
  const char *summary;
  cli_fn fn;
};

/* Subcommands (one file each in tools/). */
int cmd_pool(int argc, char **argv);
int cmd_topo(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_replay(int argc, char **argv);
int cmd_daemon(int argc, char **argv);
int cmd_inspect(int argc, char **argv);
int cmd_size(int argc, char **argv);

/* Parse "8GiB", "256KiB", "4096", "1.5GiB", "64MB" (MB = MiB here, said in --help):
 * decimal digits with at most one '.', then a unit; no hex ("0x100000"),
 * exponent ("1e6"), sign or "inf". Returns 0 or -EINVAL. */
int cli_parse_size(const char *s, uint64_t *ret);
/* "1.5 GiB" style formatting into buf. */
const char *cli_fmt_size(uint64_t bytes, char *buf, size_t n);
/* bytes as a size option takes it, exactly: "2GiB", "512MiB", "1100KiB" or
 * "4097" (the largest unit that divides it, no space); buf returned. */
const char *cli_fmt_size_arg(uint64_t bytes, char *buf, size_t n);
/* Parse a comma-separated list of non-negative ints ("0,1,3"); returns count or -EINVAL. */
int cli_parse_int_list(const char *s, int *out, int max);
/* --slot-size of `umbp SUB`: a size, a multiple of 64 from 4KiB to 4GiB (the
 * pool's own rule, checked here so that a bad value is a usage error, exit 2,
 * whatever it is). CLI_OK and *out, or CLI_USAGE with the message printed. */
int cli_parse_slot_size(const char *sub, const char *arg, uint64_t *out);
struct umbp_pool_params;
/* --numa-nodes all|auto|LIST of `umbp SUB` into pp (all: n_numa_nodes 0;
 * auto: *auto_nodes). A list names each node once. CLI_OK, or CLI_USAGE with
 * the message printed. */
int cli_parse_numa_nodes(const char *sub, const char *arg, struct umbp_pool_params *pp, bool *auto_nodes);
/* --index-pages try|huge|small -> enum umbp_index_pages: 0 or -EINVAL. */
int cli_parse_index_pages(const char *s, int *out);
/* The option's word for an enum umbp_index_pages value. */
const char *cli_index_pages_name(int mode);
/* Whether pool NAME has its file, in /dev/shm or (--hugepages) on the
 * hugetlbfs mount. */
bool cli_pool_file_exists(const char *name);
/* "2 MiB pages, 72 MiB in /dev/hugepages/umbp-index.NAME" or "4 KiB pages"
 * for a pool's index (umbp_pool_info); buf returned. */
const char *cli_fmt_index_pages(const void *pool_info, char *buf, size_t n);

/* A pool's 16-byte uuid as 8-4-4-4-12 lower-case hex (37 bytes with the NUL),
 * the one form 'pool info' and 'inspect' print, in text and JSON. */
const char *cli_fmt_uuid(const uint8_t *uuid, char *buf, size_t n);

/* Print "umbp: <msg>" to stderr. */
void cli_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Flush stdout and check it: CLI_OK, or CLI_RUNTIME after "umbp WHAT: writing
 * the output failed: <cause>" (stdout full, closed, a broken pipe). main()
 * runs it after every command that succeeded; loops that print until Ctrl-C
 * run it after each frame, so that they end rather than print into nothing. */
int cli_stdout_check(const char *what);
/* The most slots a pool can have: a bucket way holds slot + 1 in 24 bits
 * (src/index/index_shm.h, UMBP_MAX_SLOTS; the library checks it again). */
#define CLI_MAX_SLOTS ((1u << 24) - 1)
/* capacity / slot_size against what any pool needs (2 slots; a pool split
 * into NUMA partitions needs 2 in each, which the library checks) and
 * CLI_MAX_SLOTS: CLI_OK, or CLI_USAGE with the message printed. */
int cli_check_slots(const char *sub, uint64_t capacity, uint64_t slot_size);
/* Report an option word getopt_long() refused ('?'): "ambiguous", naming the
 * long options it begins, or "unknown"; returns CLI_USAGE. */
struct option;
int cli_bad_option(const char *sub, const struct option *opts, const char *word);
/* Whether s is a plain decimal number (digits, at most one '.'): what strtod()
 * would also read as hex, an exponent, inf or nan is not. */
bool cli_decimal(const char *s);
/* Report a usage error: message + "Try 'umbp SUB --help'." (SUB NULL: 'umbp
 * --help') and return CLI_USAGE. */
int cli_usage_error(const char *sub, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* JSON output of every --json: a jansson tree built in document order and
 * dumped once by jb_finish (compact, keys in insertion order, reals with 10
 * significant digits). The builder only tracks the open object or array, so
 * that callers keep writing fields in the order they appear; jansson owns the
 * values, the escaping and the number formats. key is NULL for array items
 * and for the top-level value. */
struct jb {
  FILE *f;
  json_t *root;
  json_t *open[32]; /* open[depth - 1] is the innermost object or array */
  int depth;
  bool failed; /* an allocation failed: jb_finish reports it */
};
void jb_begin(struct jb *j, FILE *f);
void jb_obj(struct jb *j, const char *key);
void jb_arr(struct jb *j, const char *key);
void jb_end_obj(struct jb *j);
void jb_end_arr(struct jb *j);
void jb_str(struct jb *j, const char *key, const char *v); /* NULL gives null */
/* Above INT64_MAX (jansson's integers are signed 64-bit) v is written as a
 * decimal string, so that no digit is lost. */
void jb_u64(struct jb *j, const char *key, uint64_t v);
void jb_i64(struct jb *j, const char *key, int64_t v);
void jb_dbl(struct jb *j, const char *key, double v); /* NaN and infinities give null */
void jb_bool(struct jb *j, const char *key, bool v);
void jb_null(struct jb *j, const char *key);
/* Dump the tree and a newline to f, flush, free the tree. 0; -ENOMEM with the
 * message printed; -EIO (f full or closed), reported by the caller or, for
 * stdout, by main()'s cli_stdout_check(). */
int jb_finish(struct jb *j);

/* snap_term_safe() (snapshot.h: control characters and bytes that are not
 * UTF-8 as '?') into one of four rotating 1 KiB buffers of the thread, so that
 * up to four results can sit in one printf: for text output of names that
 * come from files (a topology XML's GPU model, a config.json's architecture),
 * where an escape sequence would reach the terminal. NULL gives "". */
const char *cli_safe(const char *s);

/* True when stderr is a terminal (progress lines are drawn only then). */
bool cli_stderr_tty(void);

/* --group GROUP of command `sub` (pool create, daemon): a group name, or a
 * gid of digits alone, 0 to (gid_t)-2 ((gid_t)-1 means "no group" to
 * chown(2)); a name made of digits is looked up when the number is out of
 * range. CLI_OK and *ret, or the usage error's code after its message. */
int cli_parse_group(const char *sub, const char *arg, gid_t *ret);

/* The state letter of process pid from /proc/PID/stat (R, S, D, T, t, Z,
 * ...), 0 when it is gone or cannot be seen (another PID namespace). */
char cli_proc_state(int pid);

/* True when process pid is stopped (state T or t in /proc/PID/stat: SIGSTOP,
 * a debugger); false when it runs, is gone or cannot be seen. */
bool cli_pid_stopped(int pid);

/* The advice to stop daemon pid, for a message that names it: "kill -TERM
 * PID", or, when it is stopped (SIGSTOP, a debugger), which acts on SIGTERM
 * only once resumed, "kill -TERM PID; kill -CONT PID" with the reason. */
const char *cli_stop_advice(int pid, char *buf, size_t n);

/* SIGINT, SIGTERM, SIGHUP and SIGQUIT ending a command whose cleanup needs more than
 * async-signal-safe calls (umbp_pool_destroy() reads /proc/mounts with stdio,
 * which a handler that interrupted malloc could deadlock in). The handler only
 * writes the signal's number to a pipe; a thread of its own reads it, takes
 * the lock below, runs cleanup(sig), and then the process dies of that
 * signal as it would have without a handler. A signal the process ignores
 * (nohup) stays ignored. Call once; 0, or -errno (nothing installed). */
int cli_fatal_signals(void (*cleanup)(int sig));
/* Held around what cleanup() must see whole (a pool created and its name
 * recorded): a signal meanwhile is handled after the unlock. */
void cli_fatal_lock(void);
void cli_fatal_unlock(void);

#endif
