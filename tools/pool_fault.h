/* SPDX-License-Identifier: Apache-2.0 */
/*
 * SIGBUS on a pool's mapping, turned into a message (issue 32 item 12).
 *
 * A process that touches a page of a pool whose backing file has no page
 * there gets SIGBUS from the kernel: the pool file was truncated under the
 * running processes, or the file system holding it could not allocate the
 * page (/dev/shm full for a pool created with --no-prefault and no
 * reservation, a hugetlbfs mount out of huge pages). By default that kills the
 * process without a word. The long-running commands (daemon, inspect, replay's
 * scheduler and workers, bench) watch each pool they map: a SIGBUS whose
 * fault address lies in a watched mapping writes one message naming the pool,
 * its file and the cause (the file's size now against the mapping's, from an
 * fstat(2) in the handler) with write(2) only, and the process exits with
 * CLI_POOL_FAULT. A SIGBUS anywhere else keeps its previous disposition.
 *
 * The handler uses async-signal-safe calls only (fstat, clock_gettime,
 * write, _exit) and a table filled before each mapping is used.
 */
#ifndef UMBP_TOOLS_POOL_FAULT_H
#define UMBP_TOOLS_POOL_FAULT_H

#include <stdbool.h>

#include "umbp/pool.h"

/* Watch pool p's mapping until cli_fault_unwatch(p): install the handler (the
 * first time) and record the mapping, name and file. who starts the message
 * ("umbp inspect", "umbp-daemon[PID]", ...); stamp: begin it with the UTC
 * time as the daemon's log lines do. 0, or -1 when the table is full (8
 * pools) or the pool's file cannot be opened (then SIGBUS stays as it was).
 * Call from the main thread before the pool is used by other threads. */
int cli_fault_watch(umbp_pool *p, const char *who, bool stamp);
/* Stop watching p (before umbp_pool_detach). Accepts an unwatched p. */
void cli_fault_unwatch(umbp_pool *p);
/* cli_fault_unwatch(p), then umbp_pool_detach(p): how the commands that
 * watch a pool let go of it (the range may be mapped again by anything). */
void cli_pool_detach(umbp_pool *p);

#endif
