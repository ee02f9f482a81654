/* SPDX-License-Identifier: Apache-2.0 */
/* umbp bench — benchmark subcommands; each lives in tools/bench/. */
#include <stdio.h>
#include <string.h>

#include "bench/bench.h"
#include "cli.h"
#include "cmd_tier.h"

struct bench_sub {
  const char *name;
  const char *summary;
  cli_fn fn;
};

static const struct bench_sub subs[] = {
    {"index", "lookup and churn throughput of the block index vs rte_hash and cds_lfht", bench_index_main},
#ifdef UMBP_HAVE_BENCH_COPY
    /* `umbp bench copy` (tools/bench/bench_copy.c) */
    {"copy", "copy bandwidth between the pool and host/GPU memory", bench_copy_main},
#endif
    /* `umbp bench tier` (tools/cmd_tier.c, python/umbp/bench_tier.py) */
    {"tier", "bring a remote prefix into the pool vs Mooncake Store's own get; TTFT", cmd_bench_tier},
};

static void usage(FILE *f) {
  fprintf(f,
          "Usage: umbp bench SUBCOMMAND [OPTIONS]\n"
          "\n"
          "Benchmarks that print our figure beside a reference measured in the same\n"
          "run, with their ratio (medians of several repetitions).\n"
          "\n"
          "Subcommands:\n");
  for (size_t i = 0; i < sizeof subs / sizeof subs[0]; i++) fprintf(f, "  %-6s %s\n", subs[i].name, subs[i].summary);
  fprintf(f,
          "\n"
          "Run 'umbp bench SUBCOMMAND --help' for its options.\n"
          "Exit status: 0 success, 1 runtime error, 2 usage error, 3 a SIGBUS on the\n"
          "benchmark's pool (its file truncated, or /dev/shm full), said on stderr.\n");
}

int cmd_bench(int argc, char **argv) {
  if (argc < 2) {
    usage(stderr);
    return CLI_USAGE;
  }
  if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
    usage(stdout);
    return CLI_OK;
  }
  for (size_t i = 0; i < sizeof subs / sizeof subs[0]; i++)
    if (!strcmp(argv[1], subs[i].name)) return subs[i].fn(argc - 1, argv + 1);
  return cli_usage_error("bench", "unknown benchmark '%s'", argv[1]);
}
