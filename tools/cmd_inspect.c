/* SPDX-License-Identifier: Apache-2.0 */
/*
 * umbp inspect — everything in a pool, read-only.
 *
 * The pool is attached read-only (PROT_READ, no registry slot), so inspect
 * works for a user who may only read the pool file and cannot change the
 * segment: every figure comes from loads. Recent events are peeked at by
 * reading the event ring's cells, never dequeued (draining would take them
 * from their subscribers).
 */
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "pool_fault.h"
#include "pool_notes.h" /* namespace labels */
#include "snapshot.h"
#include "umbp/admin.h"
#include "umbp/check.h"
#include "umbp/index.h"
#include "umbp/pool.h"

/* How long inspect waits for a pool whose creator is still initialising it, ms. */
#define INSPECT_ATTACH_TIMEOUT_MS 2000

static const char *inspect_usage =
    "Usage: umbp inspect NAME [--json] [--watch SECONDS] [--check] [--events N]\n"
    "       umbp inspect NAME --stat [SECONDS]\n"
    "       umbp inspect NAME --prometheus\n"
    "\n"
    "Show what pool NAME holds. The pool is attached read-only and never changed,\n"
    "so read permission on its file (/dev/shm/umbp.NAME) is enough.\n"
    "\n"
    "Sections: header (layout version, sizes, creation time, run generation, file\n"
    "owner and mode), daemon (whether one holds the pool, its pid), partitions\n"
    "(NUMA node, capacity, used, free), index (entries, load factor = entries /\n"
    "ways, probe-length histogram: entries found d buckets from their home),\n"
    "slots by state, processes (registry slot, pid, role, rank, alive or dead,\n"
    "pins held, heartbeat age), namespaces (id, name, blocks, bytes, quota, hit\n"
    "rate = hits / lookups, per lookup since the pool was created, and the label\n"
    "the vLLM connector gave a derived namespace: model, TP, dtype), recent events\n"
    "(peeked, not consumed; 'not recorded' until a process first drains the\n"
    "ring: removals skip it until then; 'no consumer attached' when a process\n"
    "turned recording on but has taken nothing yet), counters summed\n"
    "over every process, live and reaped (a live process's figures lag by up to\n"
    "64 operations per thread).\n"
    "\n"
    "Options:\n"
    "  --json            one JSON object instead of text (schema: docs/operations.md).\n"
    "  --watch SECONDS   redraw every SECONDS (0.1 to 86400, decimals allowed) until\n"
    "                    Ctrl-C, with a timestamp and per-second rates beside the\n"
    "                    totals.\n"
    "  --check           verify every invariant of the pool (ways point at valid\n"
    "                    published slots in their key's neighbourhood, no slot\n"
    "                    reachable twice, pins only of claimed registry slots and\n"
    "                    in the pin mask, free slots == free-ring contents, every\n"
    "                    slot accounted for, namespace counts) and list each\n"
    "                    violation; see docs/operations.md. Slots held by dead\n"
    "                    processes that the daemon has not reaped yet are\n"
    "                    reported, not violations.\n"
    "  --events N        show the N most recent events (0 to 64, default 10; 0: none).\n"
    "                    With --watch they are counted by type and namespace.\n"
    "  --stat [SECONDS]  one line per interval (0.1 to 86400 s, default 1), like\n"
    "                    redis-cli --stat: time, used % (slots not free),\n"
    "                    lookups/s, hit % over the interval ('-': no lookup in\n"
    "                    it), inserts/s, evictions/s, pinned blocks, live\n"
    "                    processes. Rates come from the difference of the\n"
    "                    cumulative counters between two lines; the first line\n"
    "                    has none. The header repeats every 20 lines. Until\n"
    "                    Ctrl-C.\n"
    "                    Example: umbp inspect kv --stat 5\n"
    "  --prometheus      print the metrics of 'umbp daemon --metrics' once, in the\n"
    "                    Prometheus text format (for node_exporter's textfile\n"
    "                    collector when no daemon serves them).\n"
    "                    Example: umbp inspect kv --prometheus > /var/lib/node_exporter/umbp.prom.$$ &&\n"
    "                             mv /var/lib/node_exporter/umbp.prom.$$ /var/lib/node_exporter/umbp.prom\n"
    "\n"
    "Exit status: 0 shown (with --check: no violation); 1 the pool cannot be\n"
    "opened (missing, corrupted, no permission), was destroyed (or created\n"
    "again) under --watch or --stat, or --check found violations;\n"
    "2 usage error; 3 a SIGBUS on the pool (its file truncated under the running\n"
    "processes, or its file system full), said on stderr with the cause.\n"
    "Example: umbp inspect kv --check && umbp inspect kv --json | jq .slots\n";

static volatile sig_atomic_t stop_watch;
static void on_sigint(int s) {
  (void)s;
  stop_watch = 1;
}

static bool want_help(int argc, char **argv) {
  for (int i = 1; i < argc; i++)
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) return true;
  return false;
}

/* Per-second rate of a cumulative counter between two snapshots. */
static double rate(uint64_t now, uint64_t before, const struct snap *s, const struct snap *prev) {
  double dt = (double)(s->mono_ns - prev->mono_ns) / 1e9;
  return dt > 0 && now >= before ? (double)(now - before) / dt : 0.0;
}

/* The event ring's state in words: a ring no one has drained records
 * nothing; with a consumer that takes nothing, a full ring that drops is the
 * expected state, not an error. */
static void print_event_state(const struct snap *s) {
  if (!s->ev_recording && !s->ev_pending && !s->ev_dropped)
    printf("events: not recorded (no process has drained the event ring yet; a consumer's first "
           "umbp_events_drain() turns recording on for the pool's life)\n");
  else if (!s->ev_recording)
    printf("events: removals not recorded (no process has drained the ring yet); %llu stored events pending of "
           "%llu, %llu dropped\n",
           (unsigned long long)s->ev_pending, (unsigned long long)s->ev_cap, (unsigned long long)s->ev_dropped);
  else if (!s->ev_drained)
    printf("events: no consumer attached (recording, but nothing taken yet: %llu of %llu cells hold events, %llu "
           "more dropped; expected without a subscriber)\n",
           (unsigned long long)s->ev_pending, (unsigned long long)s->ev_cap, (unsigned long long)s->ev_dropped);
  else
    printf("events: %llu pending of %llu, %llu drained, %llu dropped%s\n", (unsigned long long)s->ev_pending,
           (unsigned long long)s->ev_cap, (unsigned long long)s->ev_drained, (unsigned long long)s->ev_dropped,
           s->ev_pending == s->ev_cap ? " (ring full: the consumer is behind)" : "");
}

/* The peeked events counted by type and namespace. */
static void print_event_summary(umbp_pool *p, const struct snap *s) {
  if (!s->nev) return;
  printf("  newest %u: ", s->nev);
  bool first = true;
  for (int type = UMBP_EV_STORED; type <= UMBP_EV_REMOVED; type++) {
    unsigned n = 0;
    for (unsigned k = 0; k < s->nev; k++) n += s->ev[k].type == type;
    if (!n) continue;
    printf("%s%s %u (", first ? "" : "; ", snap_event_name(type), n);
    first = false;
    bool firstns = true;
    for (unsigned k = 0; k < s->nev; k++) {
      if (s->ev[k].type != type) continue;
      bool seen = false; /* count each namespace once, at its first event */
      for (unsigned q = 0; q < k && !seen; q++) seen = s->ev[q].type == type && s->ev[q].key.ns == s->ev[k].key.ns;
      if (seen) continue;
      unsigned m = 0;
      for (unsigned q = k; q < s->nev; q++) m += s->ev[q].type == type && s->ev[q].key.ns == s->ev[k].key.ns;
      char name[136] = "";
      if (umbp_ns_name(p, s->ev[k].key.ns, name, sizeof name) != 0) snprintf(name, sizeof name, "ns %u", s->ev[k].key.ns);
      char safe[136];
      printf("%s%s %u", firstns ? "" : ", ", snap_term_safe(name, safe, sizeof safe), m);
      firstns = false;
    }
    printf(")");
  }
  printf("\n");
}

/* The pool's notes (~200 KiB, so not on the stack): namespace labels. */
static struct pool_notes g_notes;

static void print_text(umbp_pool *p, const struct snap *s, const struct snap *prev, const umbp_check_report *ck) {
  const umbp_pool_info *i = &s->info;
  char a[32], b[32], c[32], t[32];
  if (prev) {
    snap_fmt_time(s->wall_ns, t, sizeof t);
    if (prev == s) printf("at %s; rates per second from the next frame on\n", t);
    else printf("at %s; rates per second over the last %.1f s\n", t, (double)(s->mono_ns - prev->mono_ns) / 1e9);
  }
  snap_fmt_time(i->created_ns, t, sizeof t);
  printf("pool %s (%s)\n", i->name, i->path);
  char uuid[40];
  printf("  layout %u.%u  uuid %s  abi 0x%016llx  features compat 0x%llx incompat 0x%llx\n", i->layout_major,
         i->layout_minor, cli_fmt_uuid(i->uuid, uuid, sizeof uuid), (unsigned long long)i->abi_fingerprint, (unsigned long long)i->compat_features,
         (unsigned long long)i->incompat_features);
  printf("  size %s: %u slots of %s, %u buckets x %d ways, event ring %u\n", cli_fmt_size(i->total_size, a, sizeof a),
         i->slot_count, cli_fmt_size(i->slot_size, b, sizeof b), s->index.n_buckets, s->index.bucket_ways,
         s->index.event_capacity);
  printf("  created %s by pid %d (uid %u), run generation %llu, file uid %u mode %04o%s\n", t, i->creator_pid,
         i->creator_uid, (unsigned long long)i->run_generation, (unsigned)s->st.st_uid,
         (unsigned)(s->st.st_mode & 07777), i->hugepages ? ", huge pages" : "");
  char ib[256];
  printf("  index on %s\n", cli_fmt_index_pages(i, ib, sizeof ib));
  if (s->daemon_running == 1 && cli_pid_stopped(s->daemon_pid))
    /* alive but not reaping or evicting until resumed: "running" misled */
    printf("daemon: stopped (SIGSTOP or a debugger), pid %d: it reaps and evicts nothing until resumed "
           "(kill -CONT %d)\n",
           s->daemon_pid, s->daemon_pid);
  else if (s->daemon_running == 1)
    printf("daemon: running, pid %d\n", s->daemon_pid);
  else if (s->daemon_last_pid > 0)
    printf("daemon: none (the last one, pid %d, is gone)\n", s->daemon_last_pid);
  else
    printf("daemon: none\n");
  printf("partitions:\n  %-4s %-5s %12s %10s %10s %10s\n", "part", "node", "capacity", "slots", "used", "free");
  for (unsigned k = 0; k < i->n_partitions; k++) {
    const umbp_partition_info *q = &i->partitions[k];
    char node[16];
    snprintf(node, sizeof node, "%d", q->numa_node);
    printf("  %-4u %-5s %12s %10u %10llu %10llu\n", k, q->numa_node < 0 ? "-" : node, cli_fmt_size(q->bytes, a, sizeof a),
           q->slot_count, (unsigned long long)(q->slot_count - q->free_slots), (unsigned long long)q->free_slots);
  }
  uint64_t ways = (uint64_t)s->index.n_buckets * s->index.bucket_ways;
  printf("index: %llu entries, load factor %.3f (of %llu ways)\n  probe length:", (unsigned long long)s->entries,
         snap_ratio(s->entries, ways), (unsigned long long)ways);
  unsigned last = 0;
  for (unsigned d = 0; d < s->index.max_probe && d < SNAP_MAX_PROBE; d++)
    if (s->hist[d]) last = d;
  for (unsigned d = 0; d <= last; d++) printf(" %u:%llu", d, (unsigned long long)s->hist[d]);
  printf("\n");
  const umbp_slot_census *cs = &s->census;
  printf("slots: %llu total = %llu free + %llu published (%llu pinned) + %llu reserved + %llu evicting; "
         "%llu on the free rings\n",
         (unsigned long long)cs->total, (unsigned long long)cs->free_, (unsigned long long)cs->published,
         (unsigned long long)cs->pinned, (unsigned long long)cs->reserved, (unsigned long long)cs->evicting,
         (unsigned long long)cs->in_rings);
  printf("processes: %u live, %u dead (reapable)\n", i->procs_live, i->procs_dead);
  if (s->nprocs) printf("  %-4s %-8s %-9s %-5s %-7s %6s %10s  %s\n", "slot", "pid", "role", "rank", "state", "pins", "heartbeat", "comm");
  uint64_t now = s->wall_ns; /* CLOCK_REALTIME when the snapshot was taken */
  for (int k = 0; k < s->nprocs; k++) {
    const umbp_proc_info *q = &s->procs[k];
    char hb[32], comm[sizeof q->comm];
    snprintf(hb, sizeof hb, "%.1fs ago", q->heartbeat_ns && now > q->heartbeat_ns ? (double)(now - q->heartbeat_ns) / 1e9 : 0.0);
    printf("  %-4u %-8d %-9s %-5d %-7s %6llu %10s  %s\n", q->slot, q->pid, umbp_role_name(q->role), q->rank,
           !q->alive ? "dead" : s->stopped[k] ? "stopped" : "alive", (unsigned long long)s->pins_by[q->slot], hb,
           snap_term_safe(q->comm, comm, sizeof comm));
  }
  if (s->procs_stopped)
    printf("  (a stopped process holds its pins and reserved slots, and nothing else, until it is resumed: "
           "kill -CONT PID)\n");
  printf("namespaces:\n");
  notes_read(i->name, i->uuid, &g_notes);
  int shown = 0;
  for (unsigned k = 0; k < s->nns; k++) {
    const struct snap_ns *n = &s->ns[k];
    if (!shown++)
      printf("  %-4s %-20s %8s %12s %12s %8s %10s%s  label   (hit rate: hits / lookups since the pool was created)\n",
             "id", "name", "blocks", "bytes", "quota", "hit rate", "lookups", prev ? "   lookups/s" : "");
    char nm[sizeof n->name];
    printf("  %-4u %-20.20s %8llu %12s %12s %7.1f%% %10llu", n->id, snap_term_safe(n->name, nm, sizeof nm),
           (unsigned long long)n->blocks,
           cli_fmt_size(n->blocks * i->slot_size, a, sizeof a), n->quota_bytes ? cli_fmt_size(n->quota_bytes, b, sizeof b) : "none",
           100.0 * snap_ratio(n->c.hits, n->c.lookups), (unsigned long long)n->c.lookups);
    const struct snap_ns *pn = NULL;
    for (unsigned q = 0; prev && q < prev->nns && !pn; q++)
      if (prev->ns[q].id == n->id) pn = &prev->ns[q];
    if (prev) printf(" %12.1f", pn ? rate(n->c.lookups, pn->c.lookups, s, prev) : 0.0);
    const char *label = notes_label(&g_notes, n->name);
    char lb[256];
    printf("  %s\n", label ? snap_term_safe(label, lb, sizeof lb) : "-");
  }
  if (!shown) printf("  (none registered)\n");
  print_event_state(s);
  if (prev) {
    print_event_summary(p, s);
  } else {
    for (unsigned k = 0; k < s->nev; k++) {
      char hx[20];
      snap_hash_hex(&s->ev[k].key, hx, sizeof hx);
      printf("  #%-8llu %-8s ns %u tp %u hash %s...\n", (unsigned long long)s->ev[k].pos, snap_event_name(s->ev[k].type),
             s->ev[k].key.ns, s->ev[k].key.tp_rank, hx);
    }
  }
  const umbp_counters *ct = &s->total;
  if (!prev) {
    printf("counters: lookups %llu hits %llu misses %llu (hit rate %.1f%% per lookup since the pool was created) "
           "inserts %llu duplicates %llu evictions %llu removes %llu pins %llu\n",
           (unsigned long long)ct->lookups, (unsigned long long)ct->hits, (unsigned long long)ct->misses,
           100.0 * snap_ratio(ct->hits, ct->lookups), (unsigned long long)ct->inserts,
           (unsigned long long)ct->duplicates, (unsigned long long)ct->evictions, (unsigned long long)ct->removes,
           (unsigned long long)ct->pins);
  } else {
    const umbp_counters *pc = &prev->total;
    uint64_t dl = ct->lookups - pc->lookups, dh = ct->hits - pc->hits;
    printf("counters (total, /s):\n");
    printf("  lookups   %14llu %12.1f/s   hit rate %5.1f%% since creation, %s over the interval\n",
           (unsigned long long)ct->lookups, rate(ct->lookups, pc->lookups, s, prev),
           100.0 * snap_ratio(ct->hits, ct->lookups), dl ? (snprintf(c, sizeof c, "%.1f%%", 100.0 * snap_ratio(dh, dl)), c) : "-");
    const struct {
      const char *name;
      uint64_t now, before;
    } rows[] = {{"hits", ct->hits, pc->hits},       {"misses", ct->misses, pc->misses},
                {"inserts", ct->inserts, pc->inserts}, {"duplicates", ct->duplicates, pc->duplicates},
                {"evictions", ct->evictions, pc->evictions}, {"removes", ct->removes, pc->removes},
                {"pins", ct->pins, pc->pins}};
    for (unsigned k = 0; k < sizeof rows / sizeof rows[0]; k++)
      printf("  %-10s%14llu %12.1f/s\n", rows[k].name, (unsigned long long)rows[k].now,
             rate(rows[k].now, rows[k].before, s, prev));
  }
  (void)c;
  if (ck) {
    if (!ck->n_violations)
      printf("check: clean (%llu slots judged, %llu moving during the scan, %llu ways, %llu free-ring entries; "
             "%llu items held by dead processes await reaping)\n",
             (unsigned long long)ck->slots, (unsigned long long)ck->slots_in_flux, (unsigned long long)ck->ways,
             (unsigned long long)ck->ring_entries, (unsigned long long)ck->dead_leftovers);
    else {
      printf("check: %llu violation%s\n", (unsigned long long)ck->n_violations, ck->n_violations == 1 ? "" : "s");
      for (unsigned k = 0; k < ck->n_listed; k++) printf("  - %s\n", ck->violation[k]);
      if (ck->n_violations > ck->n_listed)
        printf("  ... and %llu more\n", (unsigned long long)(ck->n_violations - ck->n_listed));
    }
  }
}

/* print_json's sections, each one key of the object. */
static void json_header(struct jb *j, const struct snap *s) {
  const umbp_pool_info *i = &s->info;
  char t[32], lay[16], uuid[40];
  jb_obj(j, "header");
  jb_str(j, "name", i->name);
  jb_str(j, "path", i->path);
  snprintf(lay, sizeof lay, "%u.%u", i->layout_major, i->layout_minor);
  jb_str(j, "layout", lay);
  jb_str(j, "uuid", cli_fmt_uuid(i->uuid, uuid, sizeof uuid));
  jb_u64(j, "abi_fingerprint", i->abi_fingerprint);
  jb_u64(j, "compat_features", i->compat_features);
  jb_u64(j, "incompat_features", i->incompat_features);
  jb_u64(j, "total_bytes", i->total_size);
  jb_u64(j, "slot_size", i->slot_size);
  jb_u64(j, "slot_count", i->slot_count);
  jb_u64(j, "buckets", s->index.n_buckets);
  jb_u64(j, "event_capacity", s->index.event_capacity);
  snap_fmt_time(i->created_ns, t, sizeof t);
  jb_str(j, "created", t);
  jb_u64(j, "created_unix", i->created_ns / 1000000000ull);
  jb_i64(j, "creator_pid", i->creator_pid);
  jb_u64(j, "creator_uid", i->creator_uid);
  jb_u64(j, "run_generation", i->run_generation);
  jb_bool(j, "hugepages", i->hugepages);
  jb_bool(j, "index_hugepages", i->index_hugepages);
  jb_u64(j, "index_huge_bytes", i->index_huge_bytes);
  jb_u64(j, "file_uid", s->st.st_uid);
  jb_u64(j, "file_gid", s->st.st_gid);
  jb_u64(j, "file_mode", s->st.st_mode & 07777);
  jb_end_obj(j);
}

static void json_processes(struct jb *j, const struct snap *s) {
  jb_arr(j, "processes");
  for (int k = 0; k < s->nprocs; k++) {
    const umbp_proc_info *q = &s->procs[k];
    jb_obj(j, NULL);
    jb_u64(j, "slot", q->slot);
    jb_i64(j, "pid", q->pid);
    jb_str(j, "role", umbp_role_name(q->role));
    jb_i64(j, "rank", q->rank);
    jb_bool(j, "alive", q->alive);
    jb_bool(j, "stopped", s->stopped[k]);
    jb_u64(j, "pins", s->pins_by[q->slot]);
    jb_u64(j, "attach_unix_ns", q->attach_ns);
    jb_u64(j, "heartbeat_unix_ns", q->heartbeat_ns);
    jb_u64(j, "incarnation", q->incarnation);
    jb_str(j, "comm", q->comm);
    jb_end_obj(j);
  }
  jb_end_arr(j);
}

static void json_namespaces(struct jb *j, const struct snap *s) {
  const umbp_pool_info *i = &s->info;
  notes_read(i->name, i->uuid, &g_notes);
  jb_arr(j, "namespaces");
  for (unsigned k = 0; k < s->nns; k++) {
    const struct snap_ns *n = &s->ns[k];
    jb_obj(j, NULL);
    jb_u64(j, "id", n->id);
    jb_str(j, "name", n->name);
    jb_u64(j, "blocks", n->blocks);
    jb_u64(j, "bytes", n->blocks * i->slot_size);
    jb_u64(j, "quota_bytes", n->quota_bytes);
    jb_u64(j, "lookups", n->c.lookups);
    jb_u64(j, "hits", n->c.hits);
    jb_dbl(j, "hit_rate", snap_ratio(n->c.hits, n->c.lookups));
    jb_u64(j, "inserts", n->c.inserts);
    jb_u64(j, "evictions", n->c.evictions);
    jb_u64(j, "removes", n->c.removes);
    jb_str(j, "label", notes_label(&g_notes, n->name)); /* last: readers match the fields before it */
    jb_end_obj(j);
  }
  jb_end_arr(j);
}

static void json_events(struct jb *j, const struct snap *s) {
  jb_obj(j, "events");
  jb_bool(j, "recording", s->ev_recording);
  jb_u64(j, "capacity", s->ev_cap);
  jb_u64(j, "pending", s->ev_pending);
  jb_u64(j, "dropped", s->ev_dropped);
  jb_arr(j, "recent");
  for (unsigned k = 0; k < s->nev; k++) {
    char hx[20];
    snap_hash_hex(&s->ev[k].key, hx, sizeof hx);
    jb_obj(j, NULL);
    jb_u64(j, "position", s->ev[k].pos);
    jb_str(j, "type", snap_event_name(s->ev[k].type));
    jb_u64(j, "ns", s->ev[k].key.ns);
    jb_u64(j, "tp_rank", s->ev[k].key.tp_rank);
    jb_str(j, "hash_prefix", hx);
    jb_end_obj(j);
  }
  jb_end_arr(j);
  jb_end_obj(j);
}

static void json_check(struct jb *j, const umbp_check_report *ck) {
  jb_obj(j, "check");
  jb_bool(j, "clean", ck->n_violations == 0);
  jb_u64(j, "violation_count", ck->n_violations);
  jb_arr(j, "violations");
  for (unsigned k = 0; k < ck->n_listed; k++) jb_str(j, NULL, ck->violation[k]);
  jb_end_arr(j);
  jb_u64(j, "slots_judged", ck->slots);
  jb_u64(j, "slots_in_flux", ck->slots_in_flux);
  jb_u64(j, "ways", ck->ways);
  jb_u64(j, "ring_entries", ck->ring_entries);
  jb_u64(j, "dead_leftovers", ck->dead_leftovers);
  jb_end_obj(j);
}

static void print_json(const struct snap *s, const umbp_check_report *ck) {
  const umbp_pool_info *i = &s->info;
  struct jb j;
  jb_begin(&j, stdout);
  jb_obj(&j, NULL);
  json_header(&j, s);
  jb_obj(&j, "daemon");
  jb_bool(&j, "running", s->daemon_running == 1);
  if (s->daemon_running == 1 && s->daemon_pid > 0) jb_i64(&j, "pid", s->daemon_pid);
  else jb_null(&j, "pid");
  jb_bool(&j, "stopped", s->daemon_running == 1 && cli_pid_stopped(s->daemon_pid));
  if (s->daemon_last_pid > 0) jb_i64(&j, "last_pid", s->daemon_last_pid);
  else jb_null(&j, "last_pid");
  jb_end_obj(&j);
  jb_arr(&j, "partitions");
  for (unsigned k = 0; k < i->n_partitions; k++) {
    const umbp_partition_info *q = &i->partitions[k];
    jb_obj(&j, NULL);
    jb_u64(&j, "index", k);
    jb_i64(&j, "numa_node", q->numa_node);
    jb_u64(&j, "capacity_bytes", q->bytes);
    jb_u64(&j, "slots", q->slot_count);
    jb_u64(&j, "used_slots", q->slot_count - q->free_slots);
    jb_u64(&j, "free_slots", q->free_slots);
    jb_end_obj(&j);
  }
  jb_end_arr(&j);
  uint64_t ways = (uint64_t)s->index.n_buckets * s->index.bucket_ways;
  jb_obj(&j, "index");
  jb_u64(&j, "entries", s->entries);
  jb_u64(&j, "ways", ways);
  jb_dbl(&j, "load_factor", snap_ratio(s->entries, ways));
  jb_arr(&j, "probe_histogram");
  for (unsigned d = 0; d < s->index.max_probe && d < SNAP_MAX_PROBE; d++) jb_u64(&j, NULL, s->hist[d]);
  jb_end_arr(&j);
  jb_end_obj(&j);
  const umbp_slot_census *cs = &s->census;
  jb_obj(&j, "slots");
  jb_u64(&j, "total", cs->total);
  jb_u64(&j, "free", cs->free_);
  jb_u64(&j, "published", cs->published);
  jb_u64(&j, "pinned", cs->pinned);
  jb_u64(&j, "reserved", cs->reserved);
  jb_u64(&j, "evicting", cs->evicting);
  jb_u64(&j, "retired", cs->retired);
  jb_u64(&j, "in_rings", cs->in_rings);
  jb_end_obj(&j);
  json_processes(&j, s);
  json_namespaces(&j, s);
  json_events(&j, s);
  const umbp_counters *ct = &s->total;
  jb_obj(&j, "counters");
  jb_u64(&j, "lookups", ct->lookups);
  jb_u64(&j, "hits", ct->hits);
  jb_u64(&j, "misses", ct->misses);
  jb_u64(&j, "inserts", ct->inserts);
  jb_u64(&j, "duplicates", ct->duplicates);
  jb_u64(&j, "evictions", ct->evictions);
  jb_u64(&j, "removes", ct->removes);
  jb_u64(&j, "pins", ct->pins);
  jb_end_obj(&j);
  if (ck) json_check(&j, ck);
  jb_end_obj(&j);
  jb_finish(&j);
}

/* One --stat line: rates over [prev, s]; prev NULL for the first line. */
static void print_stat_line(const struct snap *s, const struct snap *prev, unsigned *lines) {
  if (*lines % 20 == 0)
    printf("%-8s %6s %11s %6s %10s %10s %7s %6s\n", "time", "used", "lookups/s", "hit", "inserts/s", "evict/s",
           "pinned", "procs");
  (*lines)++;
  time_t now = (time_t)(s->wall_ns / 1000000000ull);
  struct tm tm;
  char t[16], lk[24] = "-", hit[16] = "-", ins[24] = "-", ev[24] = "-";
  localtime_r(&now, &tm);
  strftime(t, sizeof t, "%H:%M:%S", &tm);
  if (prev) {
    const umbp_counters *c = &s->total, *b = &prev->total;
    snprintf(lk, sizeof lk, "%.1f", rate(c->lookups, b->lookups, s, prev));
    snprintf(ins, sizeof ins, "%.1f", rate(c->inserts, b->inserts, s, prev));
    snprintf(ev, sizeof ev, "%.1f", rate(c->evictions, b->evictions, s, prev));
    if (c->lookups > b->lookups) snprintf(hit, sizeof hit, "%.1f%%", 100.0 * snap_ratio(c->hits - b->hits, c->lookups - b->lookups));
  }
  printf("%-8s %5.1f%% %11s %6s %10s %10s %7llu %6u\n", t,
         100.0 * snap_ratio(s->census.total - s->census.free_, s->census.total), lk, hit, ins, ev,
         (unsigned long long)s->census.pinned, s->info.procs_live);
}

/* Does NAME still name the pool inspect maps? NULL when it does; else why
 * not, in why. `umbp pool destroy` does not wait for inspect (a read-only
 * attach claims no registry slot), so without this --watch and --stat would
 * go on showing the removed pool, or the old one after a create of the same
 * name, and keep its memory mapped. */
static const char *pool_gone(const struct snap *s, const char *again, char *why, size_t n) {
  struct stat named;
  bool exists = stat(s->info.path, &named) == 0;
  if (s->st.st_nlink && exists && named.st_ino == s->st.st_ino && named.st_dev == s->st.st_dev) return NULL;
  snprintf(why, n, "pool '%s' was destroyed while inspect watched it (%s %s): run '%s' again to %s", s->info.name,
           s->info.path, exists ? "now names another pool" : "was removed", again,
           exists ? "watch the new pool" : "watch it once it is created again");
  return why;
}

static void sleep_s(double sec) {
  struct timespec ts = {(time_t)sec, (long)((sec - (double)(time_t)sec) * 1e9)};
  while (nanosleep(&ts, &ts) != 0 && !stop_watch) {
  }
}

int cmd_inspect(int argc, char **argv) {
  if (want_help(argc, argv)) {
    fputs(inspect_usage, stdout);
    return CLI_OK;
  }
  enum { O_JSON = 256, O_WATCH, O_CHECK, O_EVENTS, O_STAT, O_PROM };
  static const struct option opts[] = {{"json", no_argument, 0, O_JSON},
                                       {"stat", optional_argument, 0, O_STAT},
                                       {"prometheus", no_argument, 0, O_PROM},
                                       {"watch", required_argument, 0, O_WATCH},
                                       {"check", no_argument, 0, O_CHECK},
                                       {"events", required_argument, 0, O_EVENTS},
                                       {0, 0, 0, 0}};
  bool json = false, check = false, prom = false;
  double watch = 0, stat = 0;
  unsigned nevents = 10;
  bool events_given = false; /* --events has nothing to show under --stat and --prometheus */
  optind = 1;
  opterr = 0;
  int c;
  while ((c = getopt_long(argc, argv, ":", opts, NULL)) != -1) {
    char *end;
    switch (c) {
    case O_JSON: json = true; break;
    case O_CHECK: check = true; break;
    case O_PROM: prom = true; break;
    case O_STAT: {
      /* --stat, --stat=S or --stat S (S: the next word when it is a number,
       * a negative one included, so that it is refused as a value rather than
       * as an unknown option) */
      const char *arg = optarg;
      if (!arg && optind < argc && (argv[optind][0] != '-' || (argv[optind][1] >= '0' && argv[optind][1] <= '9'))) {
        strtod(argv[optind], &end);
        if (!*end && end != argv[optind] && cli_decimal(argv[optind] + (argv[optind][0] == '-'))) arg = argv[optind++];
      }
      stat = arg ? strtod(arg, &end) : 1.0;
      if (arg && (*end || end == arg || !cli_decimal(arg) || !(stat >= 0.1 && stat <= 86400)))
        return cli_usage_error("inspect", "--stat '%s': give seconds per line, 0.1 to 86400 (default 1)", arg);
      break;
    }
    case O_WATCH:
      watch = strtod(optarg, &end);
      if (*end || end == optarg || !cli_decimal(optarg) || !(watch >= 0.1 && watch <= 86400))
        return cli_usage_error("inspect", "--watch '%s': give seconds between redraws, 0.1 to 86400", optarg);
      break;
    case O_EVENTS: {
      long v = strtol(optarg, &end, 10);
      if (*end || end == optarg || v < 0 || v > 64) return cli_usage_error("inspect", "--events '%s': use 0 to 64", optarg);
      nevents = (unsigned)v;
      events_given = true;
      break;
    }
    case ':': return cli_usage_error("inspect", "option '%s' needs a value", argv[optind - 1]);
    default: return cli_bad_option("inspect", opts, argv[optind - 1]);
    }
  }
  if (optind >= argc) return cli_usage_error("inspect", "missing pool NAME");
  if (optind < argc - 1)
    return cli_usage_error("inspect", "too many arguments: '%s' after pool NAME '%s'%s", argv[optind + 1], argv[optind],
                           stat > 0 ? " (--stat takes a number of seconds, 0.1 to 86400)" : "");
  const char *name = argv[optind];
  if (umbp_pool_name_valid(name)) return cli_usage_error("inspect", "%s", umbp_last_error());
  if (watch > 0 && check) return cli_usage_error("inspect", "--check gives one verdict: use it without --watch");
  /* --events was taken and silently ignored by these two, unlike every other option they cannot use */
  if (stat > 0 && (json || watch > 0 || check || prom || events_given))
    return cli_usage_error("inspect", "--stat prints its own lines: use it without --json, --watch, --check, "
                                      "--prometheus and --events");
  if (prom && (json || watch > 0 || check || events_given))
    return cli_usage_error("inspect", "--prometheus prints the metrics once: use it without --json, --watch, --check "
                                      "and --events");

  umbp_attach_opts ao;
  umbp_attach_opts_init(&ao);
  ao.read_only = true;
  ao.role = UMBP_ROLE_TOOL;
  ao.timeout_ms = INSPECT_ATTACH_TIMEOUT_MS;
  umbp_pool *p;
  int rc = umbp_pool_attach(name, &ao, &p);
  if (rc) {
    const char *why = umbp_last_error();
    if (rc == -EBADMSG || rc == -EPROTO)
      cli_error("cannot inspect pool '%s': %s", name, why);
    else
      cli_error("%s", why && *why ? why : umbp_strerror(rc));
    return CLI_RUNTIME;
  }
  cli_fault_watch(p, "umbp inspect", false); /* --watch and --stat run for long: a SIGBUS says why */
  /* two snapshots: the rates of --watch and --stat are differences */
  struct snap *s = malloc(sizeof *s), *prev = malloc(sizeof *prev);
  umbp_check_report *ck = check ? malloc(sizeof *ck) : NULL;
  if (!s || !prev || (check && !ck)) {
    cli_error("out of memory");
    free(s);
    free(prev);
    free(ck);
    cli_pool_detach(p);
    return CLI_RUNTIME;
  }
  int ret = CLI_OK;
  if (prom) {
    snap_take(p, s, 0);
    if (snap_prometheus(s, stdout)) {
      cli_error("cannot write the metrics: %s", strerror(errno));
      ret = CLI_RUNTIME;
    }
    free(s);
    free(prev);
    cli_pool_detach(p);
    return ret;
  }
  char again[128], why[1024]; /* the command that watches NAME again, and why it ended */
  snprintf(again, sizeof again, "umbp inspect %s%s --%s %g", name, json ? " --json" : "", stat > 0 ? "stat" : "watch",
           stat > 0 ? stat : watch);
  if (watch > 0 || stat > 0) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigint;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
  }
  if (stat > 0) {
    unsigned lines = 0;
    bool have_prev = false;
    while (!stop_watch) {
      snap_take(p, s, 0);
      if (pool_gone(s, again, why, sizeof why)) {
        cli_error("%s", why);
        ret = CLI_RUNTIME;
        break;
      }
      print_stat_line(s, have_prev ? prev : NULL, &lines);
      if (cli_stdout_check("inspect --stat") != CLI_OK) {
        free(s);
        free(prev);
        cli_pool_detach(p);
        return CLI_RUNTIME;
      }
      struct snap *tmp = prev;
      prev = s;
      s = tmp;
      have_prev = true;
      sleep_s(stat);
    }
    free(s);
    free(prev);
    cli_pool_detach(p);
    return ret;
  }
  bool tty = isatty(1), have_prev = false;
  if (watch > 0 && nevents) nevents = SNAP_MAX_EVENTS; /* summarised by type and namespace */
  for (;;) {
    snap_take(p, s, nevents);
    if (watch > 0 && pool_gone(s, again, why, sizeof why)) {
      cli_error("%s", why);
      ret = CLI_RUNTIME;
      break;
    }
    if (ck && umbp_pool_check(p, ck) != 0) {
      cli_error("check failed: %s", umbp_last_error());
      ret = CLI_RUNTIME;
      break;
    }
    if (watch > 0 && tty && !json) fputs("\033[H\033[2J", stdout);
    if (json) print_json(s, ck);
    else print_text(p, s, watch > 0 ? (have_prev ? prev : s) : NULL, ck);
    if (cli_stdout_check("inspect") != CLI_OK) {
      ret = CLI_RUNTIME;
      break;
    }
    if (ck && ck->n_violations) ret = CLI_RUNTIME;
    if (watch <= 0 || stop_watch) break;
    struct snap *tmp = prev;
    prev = s;
    s = tmp;
    have_prev = true;
    sleep_s(watch);
    if (stop_watch) break;
    if (!json) printf("\n");
  }
  free(s);
  free(prev);
  free(ck);
  cli_pool_detach(p);
  return ret;
}
