/* SPDX-License-Identifier: Apache-2.0 */
/* `umbp tier` and `umbp bench tier` (tools/cmd_tier.c): both run the umbp
 * Python package's module, since Mooncake Store's published client is Python
 * (and C++). */
#ifndef UMBP_TOOLS_CMD_TIER_H
#define UMBP_TOOLS_CMD_TIER_H

int cmd_tier(int argc, char **argv);
int cmd_bench_tier(int argc, char **argv);

#endif
