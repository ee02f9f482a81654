/* SPDX-License-Identifier: Apache-2.0 */
/*
 * One read-only snapshot of a pool, shared by `umbp inspect` (text, JSON,
 * --watch, --stat, --prometheus) and the daemon's /metrics endpoint, so every
 * view shows the same figures gathered by the same code.
 *
 * Everything is read with loads from a handle attached read-only (PROT_READ,
 * no registry slot): taking a snapshot never changes the pool, whoever calls
 * it and however often. The figures are a scan, not an instant: slots and
 * counters move while it runs. Counters of a live process lag by up to 64
 * operations per thread (they are flushed in batches).
 */
#ifndef UMBP_TOOLS_SNAPSHOT_H
#define UMBP_TOOLS_SNAPSHOT_H

#include <stdint.h>
#include <stdio.h>
#include <sys/stat.h>

#include "umbp/admin.h"
#include "umbp/index.h"
#include "umbp/pool.h"

struct ev_peek {
  int type; /* enum umbp_event_type */
  uint64_t pos;
  umbp_key key;
};

struct snap_ns {
  uint32_t id;
  char name[136];
  uint64_t blocks, quota_bytes; /* quota 0: none */
  umbp_counters c;
};

#define SNAP_MAX_EVENTS 64
#define SNAP_MAX_PROBE 64 /* room for the probe histogram (umbp_admin_index_info.max_probe entries) */

struct snap {
  uint64_t mono_ns;   /* CLOCK_MONOTONIC when taken (for rates) */
  uint64_t wall_ns;   /* CLOCK_REALTIME when taken */
  umbp_pool_info info;
  struct stat st;
  umbp_admin_index_info index; /* geometry and readers */
  int daemon_running, daemon_pid, daemon_last_pid;
  umbp_slot_census census;
  umbp_slot_census part_census[UMBP_MAX_PARTITIONS];
  uint64_t entries, hist[SNAP_MAX_PROBE]; /* hist: index.max_probe entries */
  umbp_proc_info procs[UMBP_MAX_PROCS];
  int nprocs;
  uint64_t pins_by[UMBP_MAX_PROCS];
  umbp_counters total;
  struct snap_ns ns[UMBP_MAX_NAMESPACES];
  unsigned nns;
  /* procs[k] is stopped (state T in /proc), and how many are */
  bool stopped[UMBP_MAX_PROCS];
  uint64_t procs_stopped;
  struct ev_peek ev[SNAP_MAX_EVENTS];
  unsigned nev;
  uint64_t ev_pending, ev_dropped, ev_cap, ev_drained; /* ev_drained: events ever dequeued */
  bool ev_recording;                                   /* removals record events (a process drained the ring) */
};

/* Fill *s from pool p (attached read-only or not) with the nevents newest
 * events (at most SNAP_MAX_EVENTS). Loads only. */
void snap_take(umbp_pool *p, struct snap *s, unsigned nevents);

/* a / b, 0 when b is 0 */
double snap_ratio(uint64_t a, uint64_t b);
/* "stored", "removed" or "?" */
const char *snap_event_name(int type);
/* The first 8 bytes of a key's hash in hex. */
void snap_hash_hex(const umbp_key *k, char *buf, size_t n);
/* "2026-12-02T16:00:00Z" */
void snap_fmt_time(uint64_t unix_ns, char *buf, size_t n);

/* Write s as the Prometheus text exposition format (version 0.0.4) to f:
 * every metric with its HELP and TYPE lines; the list is in
 * docs/operations.md. 0, or -EIO when f failed. */
int snap_prometheus(const struct snap *s, FILE *f);
/* v for a terminal into buf (n bytes, NUL-terminated): control characters
 * (C0, DEL, C1) and bytes that are not UTF-8 as '?', so that a name another
 * process wrote (a namespace, a process name, a notes label) cannot move the
 * cursor or rewrite what the operator's terminal shows. Returns buf. */
const char *snap_term_safe(const char *v, char *buf, size_t n);

#endif
