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
 * A watched pool is marked quiet for the library's own handler
 * (umbp_admin_pool_sigbus_quiet()), which would otherwise write its message
 * too: the command's line is the only one.
 *
 * The handler uses async-signal-safe calls only (fstat, clock_gettime,
 * umbp_admin_sigbus_write(), _exit) and a table filled before each mapping
 * is used.
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
/* Stop watching p (attached). Accepts an unwatched p. After this a SIGBUS in
 * p's mapping gets the library's message and kills the process (not status
 * CLI_POOL_FAULT): cli_pool_detach() is how commands let go of a pool. */
void cli_fault_unwatch(umbp_pool *p);
/* Is p's file now shorter than p's mapping (truncated under it)? From an
 * fstat(2) of the handle's file; false when it is whole or cannot be told.
 * Touches nothing of the mapping. Any thread. */
bool cli_pool_file_short(umbp_pool *p);
/* How the commands that watch a pool let go of it. Returns 0 when p was
 * detached, 1 when it was abandoned.
 *
 * Its file whole: umbp_pool_detach(p) with the watch still armed, then the
 * watch ends. A truncation that races the detach's writes (its release of
 * this process's registry slot, pins and reservations) thus ends in the
 * message and CLI_POOL_FAULT rather than a silent death. (Between the detach's
 * munmap and the end of the watch another thread could map something else at
 * that range; a SIGBUS there in that instant would be reported as the pool's.
 * It would have killed the process either way.)
 *
 * Its file short (cli_pool_file_short()): a detach would fault on the lost
 * part (a read-write handle's detach walks the slot metadata), so p is
 * abandoned instead: nothing of the mapping is read or written, the handle,
 * its mapping and its file stay until the process exits (the watch stays
 * armed), and then the kernel drops the registry slot's lock, so the pool's
 * reaper sees this process dead and releases what it held, as after a crash
 * (src/index/reap.c: a clean detach releases the same things). Nothing of
 * another process's is lost beyond what the truncation destroyed. */
int cli_pool_detach(umbp_pool *p);

#endif
