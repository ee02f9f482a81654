/* SPDX-License-Identifier: Apache-2.0 */
/* umbp — one binary, one subcommand per area. */
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "cmd_tier.h"
#include "umbp/common.h"

static const struct cli_command commands[] = {
    {"pool", "create, destroy, list, describe, reap and gc pools", cmd_pool},
    {"topo", "show the machine's GPU/NUMA topology and the per-rank placement plan", cmd_topo},
    {"bench", "benchmarks: index lookups, copy bandwidth, the host tier", cmd_bench},
    {"replay", "replay a serving trace through a real pool with N worker processes", cmd_replay},
    {"daemon", "create or adopt a pool and own it: reap, evict, quotas", cmd_daemon},
    {"inspect", "show (read-only) everything in a pool; --check verifies its invariants", cmd_inspect},
    {"size", "a model's block, slot and pool size from its config.json", cmd_size},
    {"tier", "keep the pool in front of a Mooncake Store shared by several hosts", cmd_tier},
};

static void usage(FILE *f) {
  fprintf(f,
          "Usage: umbp COMMAND [ARGS...]\n"
          "       umbp --version | --help\n"
          "\n"
          "umbp keeps LLM KV-cache blocks in a host-DRAM pool that every process on the\n"
          "host shares through POSIX shared memory.\n"
          "\n"
          "Commands:\n");
  for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
    fprintf(f, "  %-8s %s\n", commands[i].name, commands[i].summary);
  fprintf(f,
          "\n"
          "Options:\n"
          "  --version  print the version (umbp %s) and exit.\n"
          "  --help     print this help and exit.\n"
          "\n"
          "Run 'umbp COMMAND --help' for a command's options.\n"
          "Exit status: 0 success, 1 runtime error, 2 usage error, 3 a SIGBUS on a pool\n"
          "(its file truncated, or its file system full: daemon, inspect, replay, bench).\n"
          "Examples:\n"
          "  umbp pool create kv --capacity 8GiB\n"
          "  umbp daemon kv --capacity 64GiB\n"
          "  umbp size --model-config config.json --tp 8\n",
          umbp_version());
}

/* Opens each of fds 0-2 that is closed (a caller's '2>&-', a supervisor
 * that closed them) on /dev/null, read-only, before anything else is opened:
 * a write to it still fails as on a closed fd (cli_stdout_check() names it),
 * but a pool's segment, a trace or an output file can no longer become
 * standard output or error, where a message or the daemon's log would be
 * written into it (over the pool's header: the pool is then refused and the
 * daemon crashes). Child processes (replay's workers, the bench's) inherit
 * the three. */
static void hold_std_fds(void) {
  for (int fd = 0; fd <= 2; fd++)
    if (fcntl(fd, F_GETFD) < 0 && errno == EBADF) {
      int n = open("/dev/null", O_RDONLY); /* the lowest free fd: this one */
      if (n > 2) close(n);
    }
}

int main(int argc, char **argv) {
  hold_std_fds();
  if (argc < 2) {
    usage(stderr);
    return CLI_USAGE;
  }
  bool help = !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help");
  if (help || !strcmp(argv[1], "--version")) {
    /* 'umbp help pool' (as 'git help pull'): that command's help, as 'umbp pool
     * --help' and 'umbp pool help' give it; it was a usage error naming no fix */
    if (help && argc == 3)
      for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (!strcmp(argv[2], commands[i].name)) {
          char *hargv[] = {argv[2], "--help", NULL};
          int rc = commands[i].fn(2, hargv);
          if (rc == CLI_OK) rc = cli_stdout_check(commands[i].name);
          return rc;
        }
    if (argc > 2 && help) {
      char names[128] = "";
      for (size_t i = 0, l = 0; i < sizeof commands / sizeof commands[0] && l < sizeof names; i++)
        l += (size_t)snprintf(names + l, sizeof names - l, "%s%s", i ? ", " : "", commands[i].name);
      if (argc > 3) return cli_usage_error(NULL, "%s takes one command, not more ('%s' after '%s')", argv[1], argv[3], argv[2]);
      return cli_usage_error(NULL, "%s takes a command: '%s' is none of %s", argv[1], argv[2], names);
    }
    if (argc > 2) return cli_usage_error(NULL, "%s takes no arguments ('%s' given)", argv[1], argv[2]);
    if (help) usage(stdout);
    else printf("umbp %s\n", umbp_version());
    return cli_stdout_check(argv[1]);
  }
  for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
    if (!strcmp(argv[1], commands[i].name)) {
      int rc = commands[i].fn(argc - 1, argv + 1);
      /* A command that succeeded but whose output was lost (stdout full,
       * closed, a broken pipe) failed; one that failed has said why already. */
      if (rc == CLI_OK) rc = cli_stdout_check(commands[i].name);
      return rc;
    }
  fprintf(stderr, "umbp: unknown command '%s'\n\n", argv[1]);
  usage(stderr);
  return CLI_USAGE;
}
