/* SPDX-License-Identifier: Apache-2.0 */
/* A read-only snapshot of a pool and its Prometheus form (see snapshot.h). */
#include "snapshot.h"

#include "cli.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static uint64_t clock_ns(clockid_t id) {
  struct timespec ts;
  clock_gettime(id, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

double snap_ratio(uint64_t a, uint64_t b) { return b ? (double)a / (double)b : 0.0; }

const char *snap_event_name(int t) { return t == UMBP_EV_STORED ? "stored" : t == UMBP_EV_REMOVED ? "removed" : "?"; }

void snap_hash_hex(const umbp_key *k, char *buf, size_t n) {
  size_t l = k->hash_len < 8 ? k->hash_len : 8, o = 0;
  for (size_t i = 0; i < l && o + 3 < n; i++) o += (size_t)snprintf(buf + o, n - o, "%02x", k->hash[i]);
  buf[o] = 0;
}

void snap_fmt_time(uint64_t ns, char *buf, size_t n) {
  time_t t = (time_t)(ns / 1000000000ull);
  struct tm tm;
  gmtime_r(&t, &tm);
  strftime(buf, n, "%Y-%m-%dT%H:%M:%SZ", &tm);
}

/* Up to max of the newest events, peeked (umbp_admin_events_peek: draining
 * would take them from their subscribers). */
static unsigned peek_events(umbp_pool *p, struct snap *s, unsigned max) {
  umbp_event ev[SNAP_MAX_EVENTS];
  uint64_t pos[SNAP_MAX_EVENTS];
  umbp_admin_event_ring r;
  int n = umbp_admin_events_peek(p, max, ev, pos, &r);
  if (n < 0) return 0; /* a corrupted ring header: no events, no ring figures (inspect --check says why) */
  s->ev_cap = r.capacity;
  s->ev_pending = r.pending;
  s->ev_dropped = r.dropped;
  s->ev_drained = r.drained;
  s->ev_recording = r.recording != 0;
  for (int k = 0; k < n; k++) {
    s->ev[k].type = ev[k].type;
    s->ev[k].pos = pos[k];
    s->ev[k].key = ev[k].key;
  }
  return (unsigned)n;
}

/* Live processes in s->procs that are stopped (state T or t in /proc:
 * SIGSTOP, a debugger): they hold their pins and reservations until resumed,
 * and nothing else (src/index: nothing on the data path waits for another
 * process). */
static void stopped(struct snap *s) {
  for (int k = 0; k < s->nprocs; k++) {
    if (!s->procs[k].alive || s->procs[k].pid <= 0) continue;
    if (cli_pid_stopped(s->procs[k].pid)) {
      s->stopped[k] = true;
      s->procs_stopped++;
    }
  }
}

void snap_take(umbp_pool *p, struct snap *s, unsigned nevents) {
  memset(s, 0, sizeof *s);
  s->mono_ns = clock_ns(CLOCK_MONOTONIC);
  s->wall_ns = clock_ns(CLOCK_REALTIME);
  umbp_pool_get_info(p, &s->info);
  umbp_admin_pool_stat(p, &s->st);
  umbp_admin_index_info_get(p, &s->index);
  s->daemon_pid = s->daemon_last_pid = -1;
  s->daemon_running = umbp_admin_daemon_query(p, &s->daemon_pid, &s->daemon_last_pid);
  umbp_census(p, &s->census);
  if (s->info.n_partitions == 1) s->part_census[0] = s->census; /* one walk of the slots, not two */
  else
    for (unsigned k = 0; k < s->info.n_partitions && k < UMBP_MAX_PARTITIONS; k++) umbp_census_part(p, k, &s->part_census[k]);
  unsigned nhist = s->index.max_probe < SNAP_MAX_PROBE ? s->index.max_probe : SNAP_MAX_PROBE;
  umbp_index_stats(p, &s->entries, s->hist, nhist);
  s->nprocs = umbp_pool_list_procs(p, s->procs, UMBP_MAX_PROCS);
  if (s->nprocs < 0) s->nprocs = 0;
  umbp_admin_pins_by_proc(p, s->pins_by, UMBP_MAX_PROCS);
  umbp_counters_ns(p, UINT32_MAX, &s->total);
  umbp_ns_info *nsi = malloc(UMBP_MAX_NAMESPACES * sizeof *nsi); /* 40 KiB: off the stack of a scrape thread */
  int nn = nsi ? umbp_admin_ns_list(p, nsi, UMBP_MAX_NAMESPACES) : 0;
  for (int k = 0; k < nn; k++) {
    struct snap_ns *n = &s->ns[s->nns++];
    n->id = nsi[k].id;
    snprintf(n->name, sizeof n->name, "%s", nsi[k].name);
    n->blocks = nsi[k].blocks;
    n->quota_bytes = nsi[k].quota_bytes;
    umbp_counters_ns(p, n->id, &n->c);
  }
  free(nsi);
  stopped(s);
  s->nev = peek_events(p, s, nevents > SNAP_MAX_EVENTS ? SNAP_MAX_EVENTS : nevents);
}

/* ---- Prometheus text format ------------------------------------------------- */

/* Bytes of the UTF-8 sequence at q (1 to 4), or 0 when it is not one
 * (overlong forms, surrogates and code points past U+10FFFF included). */
static size_t utf8_len(const unsigned char *q) {
  if (q[0] < 0x80) return 1;
  size_t n = q[0] >= 0xc2 && q[0] <= 0xdf ? 2 : q[0] >= 0xe0 && q[0] <= 0xef ? 3 : q[0] >= 0xf0 && q[0] <= 0xf4 ? 4 : 0;
  for (size_t k = 1; k < n; k++)
    if ((q[k] & 0xc0) != 0x80) return 0;
  if ((q[0] == 0xe0 && q[1] < 0xa0) || (q[0] == 0xed && q[1] > 0x9f) || (q[0] == 0xf0 && q[1] < 0x90) ||
      (q[0] == 0xf4 && q[1] > 0x8f))
    return 0;
  return n;
}

const char *snap_term_safe(const char *v, char *buf, size_t n) {
  size_t o = 0;
  if (!n) return "";
  for (const unsigned char *q = (const unsigned char *)v; v && *q && o + 1 < n;) {
    size_t l = utf8_len(q);
    /* C0 controls, DEL, C1 controls (U+0080..U+009F: 0xc2 0x80..0x9f) and bytes that are not UTF-8 */
    bool bad = !l || *q < 0x20 || *q == 0x7f || (q[0] == 0xc2 && q[1] < 0xa0);
    if (bad || o + l >= n) {
      buf[o++] = '?';
      q += l ? l : 1;
      continue;
    }
    memcpy(buf + o, q, l);
    o += l;
    q += l;
  }
  buf[o] = 0;
  return buf;
}

/* A label value: backslash, double quote and newline escaped. The text
 * format is UTF-8 and Prometheus refuses a whole scrape with one byte that
 * is not: a namespace name is any bytes to the library, so such a byte is
 * written as '?' (as inspect --json does). */
static void label_value(FILE *f, const char *v) {
  fputc('"', f);
  for (const unsigned char *q = (const unsigned char *)v; *q;) {
    size_t n = utf8_len(q);
    if (*q == '\\' || *q == '"') {
      fputc('\\', f);
      fputc(*q, f);
    } else if (*q == '\n') {
      fputs("\\n", f);
    } else if (!n) {
      fputc('?', f);
      n = 1;
    } else {
      fwrite(q, 1, n, f);
    }
    q += n;
  }
  fputc('"', f);
}

static void family(FILE *f, const char *name, const char *type, const char *help) {
  fprintf(f, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void sample(FILE *f, const char *name, uint64_t v) { fprintf(f, "%s %llu\n", name, (unsigned long long)v); }

static void ns_sample(FILE *f, const char *name, const struct snap_ns *n, uint64_t v) {
  fprintf(f, "%s{namespace=", name);
  label_value(f, n->name);
  fprintf(f, ",id=\"%u\"} %llu\n", n->id, (unsigned long long)v);
}

int snap_prometheus(const struct snap *s, FILE *f) {
  const umbp_pool_info *i = &s->info;
  family(f, "umbp_pool_info", "gauge", "Constant 1, labelled with the pool's name and layout version.");
  fputs("umbp_pool_info{pool=", f);
  label_value(f, i->name);
  fprintf(f, ",layout=\"%u.%u\"} 1\n", i->layout_major, i->layout_minor);
  family(f, "umbp_segment_bytes", "gauge", "Bytes of the whole shared segment (slots, index and metadata).");
  sample(f, "umbp_segment_bytes", i->total_size);
  family(f, "umbp_slot_size_bytes", "gauge", "Bytes of one slot (one block of one rank).");
  sample(f, "umbp_slot_size_bytes", i->slot_size);
  family(f, "umbp_capacity_bytes", "gauge", "Bytes of block slots, all partitions.");
  sample(f, "umbp_capacity_bytes", (uint64_t)i->slot_count * i->slot_size);
  family(f, "umbp_used_bytes", "gauge", "Bytes of slots that are not free (published, reserved, evicting, retired).");
  sample(f, "umbp_used_bytes", (s->census.total - s->census.free_) * i->slot_size);
  family(f, "umbp_run_generation", "gauge", "Daemon runs of this pool: goes up by one each time a daemon adopts it.");
  sample(f, "umbp_run_generation", i->run_generation);
  family(f, "umbp_daemon_running", "gauge", "1 when a daemon holds the pool, else 0.");
  sample(f, "umbp_daemon_running", s->daemon_running == 1);

  family(f, "umbp_partition_slots", "gauge", "Slots of a partition (its NUMA node in the label; -1: no placement).");
  for (unsigned k = 0; k < i->n_partitions; k++)
    fprintf(f, "umbp_partition_slots{partition=\"%u\",numa_node=\"%d\"} %u\n", k, i->partitions[k].numa_node,
            i->partitions[k].slot_count);
  family(f, "umbp_slots", "gauge",
         "Slots of a partition by state: free, published, pinned (published slots with at least one pin, a subset "
         "of published), reserved (being written), evicting (being removed), retired (layouts before 6 only: always 0).");
  for (unsigned k = 0; k < i->n_partitions; k++) {
    const umbp_slot_census *c = &s->part_census[k];
    const struct {
      const char *state;
      uint64_t v;
    } st[] = {{"free", c->free_},       {"published", c->published}, {"pinned", c->pinned},
              {"reserved", c->reserved}, {"evicting", c->evicting},  {"retired", c->retired}};
    for (unsigned j = 0; j < sizeof st / sizeof st[0]; j++)
      fprintf(f, "umbp_slots{partition=\"%u\",numa_node=\"%d\",state=\"%s\"} %llu\n", k, i->partitions[k].numa_node,
              st[j].state, (unsigned long long)st[j].v);
  }
  family(f, "umbp_index_entries", "gauge", "Keys in the index.");
  sample(f, "umbp_index_entries", s->entries);

  const umbp_counters *t = &s->total;
  const struct {
    const char *name, *help;
    uint64_t v;
  } cs[] = {
      {"umbp_lookups_total", "Keys looked up, every namespace, every process live or reaped.", t->lookups},
      {"umbp_hits_total", "Lookups that found their key.", t->hits},
      {"umbp_misses_total", "Lookups that did not find their key.", t->misses},
      {"umbp_inserts_total", "Blocks published.", t->inserts},
      {"umbp_duplicates_total", "Publishes of a key already present (the new copy was dropped).", t->duplicates},
      {"umbp_evictions_total", "Blocks evicted to make room.", t->evictions},
      {"umbp_removes_total", "Blocks removed on request.", t->removes},
      {"umbp_pins_total", "Pins taken on blocks.", t->pins},
  };
  for (unsigned k = 0; k < sizeof cs / sizeof cs[0]; k++) {
    family(f, cs[k].name, "counter", cs[k].help);
    sample(f, cs[k].name, cs[k].v);
  }

  const struct {
    const char *name, *type, *help;
    size_t off; /* of the figure in struct snap_ns; (size_t)-1: blocks * slot size */
  } nf[] = {
      {"umbp_namespace_blocks", "gauge", "Blocks the namespace holds.", offsetof(struct snap_ns, blocks)},
      {"umbp_namespace_bytes", "gauge", "Bytes of slots the namespace holds.", (size_t)-1},
      {"umbp_namespace_quota_bytes", "gauge", "The namespace's byte quota (0: none).",
       offsetof(struct snap_ns, quota_bytes)},
      {"umbp_namespace_lookups_total", "counter", "Keys of the namespace looked up.",
       offsetof(struct snap_ns, c.lookups)},
      {"umbp_namespace_hits_total", "counter", "Lookups of the namespace that found their key.",
       offsetof(struct snap_ns, c.hits)},
      {"umbp_namespace_misses_total", "counter", "Lookups of the namespace that did not find their key.",
       offsetof(struct snap_ns, c.misses)},
      {"umbp_namespace_inserts_total", "counter", "Blocks of the namespace published.",
       offsetof(struct snap_ns, c.inserts)},
      {"umbp_namespace_evictions_total", "counter", "Blocks of the namespace evicted.",
       offsetof(struct snap_ns, c.evictions)},
      {"umbp_namespace_removes_total", "counter", "Blocks of the namespace removed on request.",
       offsetof(struct snap_ns, c.removes)},
  };
  for (unsigned k = 0; k < sizeof nf / sizeof nf[0]; k++) {
    family(f, nf[k].name, nf[k].type, nf[k].help);
    for (unsigned j = 0; j < s->nns; j++) {
      const struct snap_ns *n = &s->ns[j];
      uint64_t v;
      if (nf[k].off == (size_t)-1) v = n->blocks * i->slot_size;
      else memcpy(&v, (const char *)n + nf[k].off, sizeof v);
      ns_sample(f, nf[k].name, n, v);
    }
  }

  family(f, "umbp_processes", "gauge",
         "Attached processes by state: alive, or dead (killed or exited without detaching, not yet reaped).");
  fprintf(f, "umbp_processes{state=\"alive\"} %u\numbp_processes{state=\"dead\"} %u\n", i->procs_live, i->procs_dead);
  family(f, "umbp_processes_stopped", "gauge",
         "Attached processes that are stopped (SIGSTOP, a debugger): each holds its pins and reservations until "
         "resumed, and nothing else.");
  sample(f, "umbp_processes_stopped", s->procs_stopped);
  family(f, "umbp_events_recording", "gauge",
         "1 once a process has drained the event ring: removals record events from then on; 0 before.");
  sample(f, "umbp_events_recording", s->ev_recording);
  family(f, "umbp_events_capacity", "gauge", "Cells of the event ring.");
  sample(f, "umbp_events_capacity", s->ev_cap);
  family(f, "umbp_events_pending", "gauge", "Events on the ring not yet drained.");
  sample(f, "umbp_events_pending", s->ev_pending);
  family(f, "umbp_events_drained_total", "counter", "Events drained by consumers (0: no consumer ever attached).");
  sample(f, "umbp_events_drained_total", s->ev_drained);
  family(f, "umbp_events_dropped_total", "counter", "Events dropped because the ring was full.");
  sample(f, "umbp_events_dropped_total", s->ev_dropped);
  fflush(f);
  return ferror(f) ? -EIO : 0;
}
