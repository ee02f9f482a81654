/* SPDX-License-Identifier: Apache-2.0 */
/* Entry points of the `umbp bench` subcommands (one file each in tools/bench/).
 * Each takes argv[0] == its own name ("index", "copy") and returns a CLI exit
 * code (CLI_OK, CLI_RUNTIME, CLI_USAGE). */
#ifndef UMBP_TOOLS_BENCH_H
#define UMBP_TOOLS_BENCH_H

/* umbp bench index: lookup and churn throughput of the block index beside
 * DPDK rte_hash and liburcu cds_lfht (tools/bench/bench_index.c). */
int bench_index_main(int argc, char **argv);

/* umbp bench copy: copy bandwidth (tools/bench/bench_copy.c; built and
 * dispatched only where UMBP_HAVE_BENCH_COPY is defined). */
int bench_copy_main(int argc, char **argv);

#endif
