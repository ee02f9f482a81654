/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A pool's notes, /dev/shm/umbp-notes.NAME: what the segment does not record
 * (whether a vLLM engine made the pool in embedded mode, which processes of
 * which engine attached, a person's label for each derived namespace). The
 * vLLM connector writes them (python/umbp/pool_notes.py has the format and
 * the locking rules); the CLI reads them here for `pool ls/info/gc`,
 * `inspect` and the daemon's label quotas, and removes them with the pool.
 *
 * Notes name the pool's uuid in their first line: notes of an earlier pool of
 * the same name read as empty.
 */
#ifndef UMBP_TOOLS_POOL_NOTES_H
#define UMBP_TOOLS_POOL_NOTES_H

#include <stdbool.h>
#include <stdint.h>

#include "umbp/pool.h"

#define NOTES_DIR "/dev/shm"
#define NOTES_PREFIX "umbp-notes."
#define NOTES_MAX_PROCS 512
#define NOTES_MAX_LABELS 256 /* UMBP_MAX_NAMESPACES */

struct notes_proc {
  int pid;
  char instance[64];
  char ns[136];
};

struct notes_label {
  char ns[136];
  char label[488];
};

struct pool_notes {
  bool valid;    /* the file exists and describes this pool (its uuid) */
  bool embedded; /* made by a vLLM engine in embedded mode */
  char instance[64], ns[136]; /* of the engine that made it */
  uint64_t capacity;
  int creator_pid;
  struct notes_proc procs[NOTES_MAX_PROCS]; /* the last record of each pid */
  unsigned nprocs;
  struct notes_label labels[NOTES_MAX_LABELS]; /* the last record of each namespace */
  unsigned nlabels;
};

/* "/dev/shm/umbp-notes.NAME" into buf (buf returned). */
const char *notes_path(const char *pool, char *buf, size_t n);

/* Read the notes of pool `pool` whose uuid is `uuid` (NULL: any) into *out
 * (zeroed first; out->valid false when there are none or they are stale).
 * Never fails: unreadable notes are no notes. The struct is large (~200 KiB):
 * callers keep it off the stack. */
void notes_read(const char *pool, const uint8_t uuid[16], struct pool_notes *out);

/* The label of namespace `ns`, or NULL. */
const char *notes_label(const struct pool_notes *n, const char *ns);

/* The engine (instance id) that process `pid` was attached for, or NULL. */
const char *notes_proc_instance(const struct pool_notes *n, int pid);

/* Take the notes' exclusive flock as the connector's writers do (waiting up to
 * wait_ms), on the file that is at the path once locked. Returns an fd to
 * pass to notes_unlock, -ENOENT when there are no notes, -EWOULDBLOCK when
 * they stayed locked, or another -errno. */
int notes_lock(const char *pool, unsigned wait_ms);
void notes_unlock(int fd);

/* Remove the notes file of `pool`: 0, or -errno (-ENOENT: there was none). */
int notes_remove(const char *pool);

#endif
