/* SPDX-License-Identifier: Apache-2.0 */
#include "cli.h"
int cmd_replay(int argc, char **argv) { (void)argc; (void)argv; cli_error("replay: not built yet"); return CLI_RUNTIME; }
