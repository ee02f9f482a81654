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
#include "index/index_internal.h"
#include "shm/daemon.h"
#include "shm/ring.h"
#include "umbp/check.h"
#include "umbp/index.h"
#include "umbp/pool.h"

static const char *inspect_usage =
    "Usage: umbp inspect NAME [--json] [--watch SECONDS] [--check] [--events N]\n"
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
    "rate = hits / lookups), recent events (peeked, not consumed), counters summed\n"
    "over every process, live and reaped (a live process's figures lag by up to\n"
    "64 operations per thread).\n"
    "\n"
    "Options:\n"
    "  --json            one JSON object instead of text (schema: docs/operations.md).\n"
    "  --watch SECONDS   redraw every SECONDS (decimals allowed) until Ctrl-C.\n"
    "  --check           verify every invariant of the pool (ways point at valid\n"
    "                    published slots in their key's neighbourhood, no slot\n"
    "                    reachable twice, pins only of claimed registry slots and\n"
    "                    in the pin mask, free slots == free-ring contents, every\n"
    "                    slot accounted for, namespace counts) and list each\n"
    "                    violation; see docs/operations.md. Slots held by dead\n"
    "                    processes that the daemon has not reaped yet are\n"
    "                    reported, not violations.\n"
    "  --events N        show the N most recent events (default 10, 0: none).\n"
    "\n"
    "Exit status: 0 shown (with --check: no violation); 1 the pool cannot be\n"
    "opened (missing, corrupted, no permission) or --check found violations;\n"
    "2 usage error.\n"
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

struct ev_peek {
  int type;
  uint64_t pos;
  struct umbp_key_shm key;
};

/* Read up to max of the newest events from the ring's cells (loads only). */
static unsigned peek_events(umbp_pool *p, struct ev_peek *out, unsigned max, uint64_t *ret_pending,
                            uint64_t *ret_dropped, uint64_t *ret_cap) {
  void *ring = umbp_pool_region(p, UMBP_REG_EVENTS);
  *ret_pending = *ret_dropped = *ret_cap = 0;
  if (umbp_ring_check_header(ring, p->hdr->regions[UMBP_REG_EVENTS].size)) return 0;
  struct umbp_ring_hdr *h = ring;
  *ret_cap = h->capacity;
  *ret_pending = umbp_ring_count(ring);
  *ret_dropped = umbp_ring_dropped(ring);
  uint64_t enq = atomic_load_explicit(&h->enq_pos, memory_order_acquire);
  uint64_t deq = atomic_load_explicit(&h->deq_pos, memory_order_acquire);
  uint64_t first = enq - deq > h->capacity ? enq - h->capacity : deq;
  if (enq - first > max) first = enq - max;
  unsigned n = 0;
  for (uint64_t pos = first; pos != enq && n < max; pos++) {
    struct umbp_ring_cell *c = umbp_ring__cell(h, pos);
    uint64_t w = atomic_load_explicit(&c->word, memory_order_acquire);
    unsigned kind = umbp_ring__wkind(w);
    if (umbp_ring__seqdiff(umbp_ring__wseq(w), pos + 1) != 0 || (kind != UMBP_RING_STABLE && kind != UMBP_RING_READING))
      continue;
    struct umbp_event_shm ev;
    memcpy(&ev, c->payload, sizeof ev);
    atomic_thread_fence(memory_order_acquire);
    if (atomic_load_explicit(&c->word, memory_order_relaxed) != w) continue;
    out[n].type = ev.type;
    out[n].pos = pos;
    out[n].key = ev.key;
    n++;
  }
  return n;
}

static const char *ev_name(int t) { return t == 1 ? "stored" : t == 2 ? "removed" : t == 3 ? "cleared" : "?"; }

static void hash_hex(const struct umbp_key_shm *k, char *buf, size_t n) {
  size_t l = k->hash_len < 8 ? k->hash_len : 8, o = 0;
  for (size_t i = 0; i < l && o + 3 < n; i++) o += (size_t)snprintf(buf + o, n - o, "%02x", k->hash[i]);
  buf[o] = 0;
}

static void fmt_time(uint64_t ns, char *buf, size_t n) {
  time_t t = (time_t)(ns / 1000000000ull);
  struct tm tm;
  gmtime_r(&t, &tm);
  strftime(buf, n, "%Y-%m-%dT%H:%M:%SZ", &tm);
}

struct snap {
  umbp_pool_info info;
  struct stat st;
  int daemon_running, daemon_pid, daemon_last_pid;
  umbp_slot_census census;
  uint64_t entries, hist[UMBP_MAX_PROBE];
  umbp_proc_info procs[UMBP_MAX_PROCS];
  int nprocs;
  uint64_t pins_by[UMBP_MAX_PROCS];
  umbp_counters total;
  struct ev_peek ev[64];
  unsigned nev;
  uint64_t ev_pending, ev_dropped, ev_cap;
};

static void take(umbp_pool *p, struct snap *s, unsigned nevents) {
  memset(s, 0, sizeof *s);
  umbp_pool_get_info(p, &s->info);
  fstat(p->fd, &s->st);
  s->daemon_pid = s->daemon_last_pid = -1;
  s->daemon_running = umbp_daemon_query(p, &s->daemon_pid, &s->daemon_last_pid);
  umbp_census(p, &s->census);
  umbp_index_stats(p, &s->entries, s->hist, UMBP_MAX_PROBE);
  s->nprocs = umbp_pool_list_procs(p, s->procs, UMBP_MAX_PROCS);
  if (s->nprocs < 0) s->nprocs = 0;
  const _Atomic uint8_t *pins = umbp_pool_region(p, UMBP_REG_PINS);
  uint64_t stride = umbp_pin_stride(p->hdr->slot_count);
  for (unsigned i = 0; i < UMBP_MAX_PROCS; i++) {
    const _Atomic uint8_t *row = pins + (uint64_t)i * stride;
    const _Atomic uint64_t *w = (const _Atomic uint64_t *)(const void *)row;
    for (uint64_t q = 0; q < stride / 8; q++) {
      if (!atomic_load_explicit(&w[q], memory_order_relaxed)) continue;
      for (unsigned j = 0; j < 8; j++) s->pins_by[i] += atomic_load_explicit(&row[q * 8 + j], memory_order_relaxed);
    }
  }
  umbp_counters_ns(p, UINT32_MAX, &s->total);
  s->nev = peek_events(p, s->ev, nevents > 64 ? 64 : nevents, &s->ev_pending, &s->ev_dropped, &s->ev_cap);
}

static double ratio(uint64_t a, uint64_t b) { return b ? (double)a / (double)b : 0.0; }

static void print_text(umbp_pool *p, const struct snap *s, const umbp_check_report *ck) {
  const umbp_pool_info *i = &s->info;
  char a[32], b[32], c[32], t[32];
  fmt_time(i->created_ns, t, sizeof t);
  printf("pool %s (%s)\n", i->name, i->path);
  printf("  layout %u.%u  abi 0x%016llx  features compat 0x%llx incompat 0x%llx\n", i->layout_major, i->layout_minor,
         (unsigned long long)i->abi_fingerprint, (unsigned long long)i->compat_features,
         (unsigned long long)i->incompat_features);
  printf("  size %s: %u slots of %s, %u buckets x %d ways, event ring %u\n", cli_fmt_size(i->total_size, a, sizeof a),
         i->slot_count, cli_fmt_size(i->slot_size, b, sizeof b), p->hdr->n_buckets, UMBP_BUCKET_WAYS,
         p->hdr->event_capacity);
  printf("  created %s by pid %d (uid %u), run generation %llu, file uid %u mode %04o%s\n", t, i->creator_pid,
         i->creator_uid, (unsigned long long)i->run_generation, (unsigned)s->st.st_uid,
         (unsigned)(s->st.st_mode & 07777), i->hugepages ? ", huge pages" : "");
  char ib[256];
  printf("  index on %s\n", cli_fmt_index_pages(i, ib, sizeof ib));
  if (s->daemon_running == 1)
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
  uint64_t ways = (uint64_t)p->hdr->n_buckets * UMBP_BUCKET_WAYS;
  printf("index: %llu entries, load factor %.3f (of %llu ways)\n  probe length:", (unsigned long long)s->entries,
         ratio(s->entries, ways), (unsigned long long)ways);
  unsigned last = 0;
  for (unsigned d = 0; d < UMBP_MAX_PROBE; d++)
    if (s->hist[d]) last = d;
  for (unsigned d = 0; d <= last; d++) printf(" %u:%llu", d, (unsigned long long)s->hist[d]);
  printf("\n");
  const umbp_slot_census *cs = &s->census;
  printf("slots: %llu total = %llu free + %llu published (%llu pinned) + %llu reserved + %llu evicting + %llu retired; "
         "%llu on the free rings\n",
         (unsigned long long)cs->total, (unsigned long long)cs->free_, (unsigned long long)cs->published,
         (unsigned long long)cs->pinned, (unsigned long long)cs->reserved, (unsigned long long)cs->evicting,
         (unsigned long long)cs->retired, (unsigned long long)cs->in_rings);
  printf("processes: %u live, %u dead (reapable)\n", i->procs_live, i->procs_dead);
  if (s->nprocs) printf("  %-4s %-8s %-9s %-5s %-5s %6s %10s  %s\n", "slot", "pid", "role", "rank", "state", "pins", "heartbeat", "comm");
  uint64_t now = umbp_realtime_ns();
  for (int k = 0; k < s->nprocs; k++) {
    const umbp_proc_info *q = &s->procs[k];
    char hb[32];
    snprintf(hb, sizeof hb, "%.1fs ago", q->heartbeat_ns && now > q->heartbeat_ns ? (double)(now - q->heartbeat_ns) / 1e9 : 0.0);
    printf("  %-4u %-8d %-9s %-5d %-5s %6llu %10s  %s\n", q->slot, q->pid, umbp_role_name(q->role), q->rank,
           q->alive ? "alive" : "dead", (unsigned long long)s->pins_by[q->slot], hb, q->comm);
  }
  const struct umbp_ns_shm *nss = umbp_pool_region(p, UMBP_REG_NAMESPACES);
  printf("namespaces:\n");
  int shown = 0;
  for (unsigned k = 0; k < UMBP_MAX_NAMESPACES; k++) {
    if (atomic_load_explicit(&nss[k].state, memory_order_acquire) != 1) continue;
    if (!shown++) printf("  %-4s %-20s %8s %12s %12s %8s %10s\n", "id", "name", "blocks", "bytes", "quota", "hit rate", "lookups");
    char name[136] = "";
    umbp_ns_name(p, k, name, sizeof name);
    uint64_t used = atomic_load_explicit(&nss[k].used_slots, memory_order_relaxed);
    uint64_t quota = atomic_load_explicit(&nss[k].quota_bytes, memory_order_relaxed);
    umbp_counters cn;
    umbp_counters_ns(p, k, &cn);
    printf("  %-4u %-20.20s %8llu %12s %12s %7.1f%% %10llu\n", k, name, (unsigned long long)used,
           cli_fmt_size(used * i->slot_size, a, sizeof a), quota ? cli_fmt_size(quota, b, sizeof b) : "none",
           100.0 * ratio(cn.hits, cn.lookups), (unsigned long long)cn.lookups);
  }
  if (!shown) printf("  (none registered)\n");
  printf("events: %llu pending of %llu, %llu dropped\n", (unsigned long long)s->ev_pending,
         (unsigned long long)s->ev_cap, (unsigned long long)s->ev_dropped);
  for (unsigned k = 0; k < s->nev; k++) {
    char hx[20];
    hash_hex(&s->ev[k].key, hx, sizeof hx);
    printf("  #%-8llu %-8s ns %u tp %u hash %s...\n", (unsigned long long)s->ev[k].pos, ev_name(s->ev[k].type),
           s->ev[k].key.ns, s->ev[k].key.tp, hx);
  }
  const umbp_counters *ct = &s->total;
  printf("counters: lookups %llu hits %llu misses %llu (hit rate %.1f%%) inserts %llu duplicates %llu evictions %llu "
         "removes %llu pins %llu\n",
         (unsigned long long)ct->lookups, (unsigned long long)ct->hits, (unsigned long long)ct->misses,
         100.0 * ratio(ct->hits, ct->lookups), (unsigned long long)ct->inserts, (unsigned long long)ct->duplicates,
         (unsigned long long)ct->evictions, (unsigned long long)ct->removes, (unsigned long long)ct->pins);
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

static void print_json(umbp_pool *p, const struct snap *s, const umbp_check_report *ck) {
  const umbp_pool_info *i = &s->info;
  struct json j;
  char t[32], lay[16], uuid[40];
  json_begin(&j, stdout);
  json_obj(&j, NULL);
  json_obj(&j, "header");
  json_str(&j, "name", i->name);
  json_str(&j, "path", i->path);
  snprintf(lay, sizeof lay, "%u.%u", i->layout_major, i->layout_minor);
  json_str(&j, "layout", lay);
  for (int k = 0; k < 16; k++) snprintf(uuid + 2 * k, 3, "%02x", i->uuid[k]);
  json_str(&j, "uuid", uuid);
  json_u64(&j, "abi_fingerprint", i->abi_fingerprint);
  json_u64(&j, "compat_features", i->compat_features);
  json_u64(&j, "incompat_features", i->incompat_features);
  json_u64(&j, "total_bytes", i->total_size);
  json_u64(&j, "slot_size", i->slot_size);
  json_u64(&j, "slot_count", i->slot_count);
  json_u64(&j, "buckets", p->hdr->n_buckets);
  json_u64(&j, "event_capacity", p->hdr->event_capacity);
  fmt_time(i->created_ns, t, sizeof t);
  json_str(&j, "created", t);
  json_u64(&j, "created_unix", i->created_ns / 1000000000ull);
  json_i64(&j, "creator_pid", i->creator_pid);
  json_u64(&j, "creator_uid", i->creator_uid);
  json_u64(&j, "run_generation", i->run_generation);
  json_bool(&j, "hugepages", i->hugepages);
  json_bool(&j, "index_hugepages", i->index_hugepages);
  json_u64(&j, "index_huge_bytes", i->index_huge_bytes);
  json_u64(&j, "file_uid", s->st.st_uid);
  json_u64(&j, "file_gid", s->st.st_gid);
  json_u64(&j, "file_mode", s->st.st_mode & 07777);
  json_end_obj(&j);
  json_obj(&j, "daemon");
  json_bool(&j, "running", s->daemon_running == 1);
  if (s->daemon_running == 1 && s->daemon_pid > 0) json_i64(&j, "pid", s->daemon_pid);
  else json_null(&j, "pid");
  if (s->daemon_last_pid > 0) json_i64(&j, "last_pid", s->daemon_last_pid);
  else json_null(&j, "last_pid");
  json_end_obj(&j);
  json_arr(&j, "partitions");
  for (unsigned k = 0; k < i->n_partitions; k++) {
    const umbp_partition_info *q = &i->partitions[k];
    json_obj(&j, NULL);
    json_u64(&j, "index", k);
    json_i64(&j, "numa_node", q->numa_node);
    json_u64(&j, "capacity_bytes", q->bytes);
    json_u64(&j, "slots", q->slot_count);
    json_u64(&j, "used_slots", q->slot_count - q->free_slots);
    json_u64(&j, "free_slots", q->free_slots);
    json_end_obj(&j);
  }
  json_end_arr(&j);
  uint64_t ways = (uint64_t)p->hdr->n_buckets * UMBP_BUCKET_WAYS;
  json_obj(&j, "index");
  json_u64(&j, "entries", s->entries);
  json_u64(&j, "ways", ways);
  json_dbl(&j, "load_factor", ratio(s->entries, ways));
  json_arr(&j, "probe_histogram");
  for (unsigned d = 0; d < UMBP_MAX_PROBE; d++) json_u64(&j, NULL, s->hist[d]);
  json_end_arr(&j);
  json_end_obj(&j);
  const umbp_slot_census *cs = &s->census;
  json_obj(&j, "slots");
  json_u64(&j, "total", cs->total);
  json_u64(&j, "free", cs->free_);
  json_u64(&j, "published", cs->published);
  json_u64(&j, "pinned", cs->pinned);
  json_u64(&j, "reserved", cs->reserved);
  json_u64(&j, "evicting", cs->evicting);
  json_u64(&j, "retired", cs->retired);
  json_u64(&j, "in_rings", cs->in_rings);
  json_end_obj(&j);
  json_arr(&j, "processes");
  for (int k = 0; k < s->nprocs; k++) {
    const umbp_proc_info *q = &s->procs[k];
    json_obj(&j, NULL);
    json_u64(&j, "slot", q->slot);
    json_i64(&j, "pid", q->pid);
    json_str(&j, "role", umbp_role_name(q->role));
    json_i64(&j, "rank", q->rank);
    json_bool(&j, "alive", q->alive);
    json_u64(&j, "pins", s->pins_by[q->slot]);
    json_u64(&j, "attach_unix_ns", q->attach_ns);
    json_u64(&j, "heartbeat_unix_ns", q->heartbeat_ns);
    json_u64(&j, "incarnation", q->incarnation);
    json_str(&j, "comm", q->comm);
    json_end_obj(&j);
  }
  json_end_arr(&j);
  json_arr(&j, "namespaces");
  const struct umbp_ns_shm *nss = umbp_pool_region(p, UMBP_REG_NAMESPACES);
  for (unsigned k = 0; k < UMBP_MAX_NAMESPACES; k++) {
    if (atomic_load_explicit(&nss[k].state, memory_order_acquire) != 1) continue;
    char name[136] = "";
    umbp_ns_name(p, k, name, sizeof name);
    uint64_t used = atomic_load_explicit(&nss[k].used_slots, memory_order_relaxed);
    umbp_counters cn;
    umbp_counters_ns(p, k, &cn);
    json_obj(&j, NULL);
    json_u64(&j, "id", k);
    json_str(&j, "name", name);
    json_u64(&j, "blocks", used);
    json_u64(&j, "bytes", used * i->slot_size);
    json_u64(&j, "quota_bytes", atomic_load_explicit(&nss[k].quota_bytes, memory_order_relaxed));
    json_u64(&j, "lookups", cn.lookups);
    json_u64(&j, "hits", cn.hits);
    json_dbl(&j, "hit_rate", ratio(cn.hits, cn.lookups));
    json_u64(&j, "inserts", cn.inserts);
    json_u64(&j, "evictions", cn.evictions);
    json_u64(&j, "removes", cn.removes);
    json_end_obj(&j);
  }
  json_end_arr(&j);
  json_obj(&j, "events");
  json_u64(&j, "capacity", s->ev_cap);
  json_u64(&j, "pending", s->ev_pending);
  json_u64(&j, "dropped", s->ev_dropped);
  json_arr(&j, "recent");
  for (unsigned k = 0; k < s->nev; k++) {
    char hx[20];
    hash_hex(&s->ev[k].key, hx, sizeof hx);
    json_obj(&j, NULL);
    json_u64(&j, "position", s->ev[k].pos);
    json_str(&j, "type", ev_name(s->ev[k].type));
    json_u64(&j, "ns", s->ev[k].key.ns);
    json_u64(&j, "tp_rank", s->ev[k].key.tp);
    json_str(&j, "hash_prefix", hx);
    json_end_obj(&j);
  }
  json_end_arr(&j);
  json_end_obj(&j);
  const umbp_counters *ct = &s->total;
  json_obj(&j, "counters");
  json_u64(&j, "lookups", ct->lookups);
  json_u64(&j, "hits", ct->hits);
  json_u64(&j, "misses", ct->misses);
  json_u64(&j, "inserts", ct->inserts);
  json_u64(&j, "duplicates", ct->duplicates);
  json_u64(&j, "evictions", ct->evictions);
  json_u64(&j, "removes", ct->removes);
  json_u64(&j, "pins", ct->pins);
  json_end_obj(&j);
  if (ck) {
    json_obj(&j, "check");
    json_bool(&j, "clean", ck->n_violations == 0);
    json_u64(&j, "violation_count", ck->n_violations);
    json_arr(&j, "violations");
    for (unsigned k = 0; k < ck->n_listed; k++) json_str(&j, NULL, ck->violation[k]);
    json_end_arr(&j);
    json_u64(&j, "slots_judged", ck->slots);
    json_u64(&j, "slots_in_flux", ck->slots_in_flux);
    json_u64(&j, "ways", ck->ways);
    json_u64(&j, "ring_entries", ck->ring_entries);
    json_u64(&j, "dead_leftovers", ck->dead_leftovers);
    json_end_obj(&j);
  }
  json_end_obj(&j);
  json_finish(&j);
}

int cmd_inspect(int argc, char **argv) {
  if (want_help(argc, argv)) {
    fputs(inspect_usage, stdout);
    return CLI_OK;
  }
  enum { O_JSON = 256, O_WATCH, O_CHECK, O_EVENTS };
  static const struct option opts[] = {{"json", no_argument, 0, O_JSON},
                                       {"watch", required_argument, 0, O_WATCH},
                                       {"check", no_argument, 0, O_CHECK},
                                       {"events", required_argument, 0, O_EVENTS},
                                       {0, 0, 0, 0}};
  bool json = false, check = false;
  double watch = 0;
  unsigned nevents = 10;
  optind = 1;
  opterr = 0;
  int c;
  while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
    char *end;
    switch (c) {
    case O_JSON: json = true; break;
    case O_CHECK: check = true; break;
    case O_WATCH:
      watch = strtod(optarg, &end);
      if (*end || end == optarg || !(watch >= 0.1 && watch <= 86400))
        return cli_usage_error("inspect", "--watch '%s': give seconds between redraws, 0.1 to 86400", optarg);
      break;
    case O_EVENTS: {
      long v = strtol(optarg, &end, 10);
      if (*end || end == optarg || v < 0 || v > 64) return cli_usage_error("inspect", "--events '%s': use 0 to 64", optarg);
      nevents = (unsigned)v;
      break;
    }
    default: return cli_usage_error("inspect", "unknown or incomplete option '%s'", argv[optind - 1]);
    }
  }
  if (optind != argc - 1)
    return cli_usage_error("inspect", optind >= argc ? "missing pool NAME" : "too many arguments");
  const char *name = argv[optind];
  if (umbp_pool_name_valid(name)) return cli_usage_error("inspect", "%s", umbp_last_error());
  if (watch > 0 && check) return cli_usage_error("inspect", "--check gives one verdict: use it without --watch");

  umbp_attach_opts ao;
  umbp_attach_opts_init(&ao);
  ao.read_only = true;
  ao.role = UMBP_ROLE_TOOL;
  ao.timeout_ms = 2000;
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
  struct snap *s = malloc(sizeof *s);
  umbp_check_report *ck = check ? malloc(sizeof *ck) : NULL;
  if (!s || (check && !ck)) {
    cli_error("out of memory");
    umbp_pool_detach(p);
    return CLI_RUNTIME;
  }
  int ret = CLI_OK;
  if (watch > 0) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigint;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
  }
  bool tty = isatty(1);
  for (;;) {
    take(p, s, nevents);
    if (ck && umbp_pool_check(p, ck) != 0) {
      cli_error("check failed: %s", umbp_last_error());
      ret = CLI_RUNTIME;
      break;
    }
    if (watch > 0 && tty && !json) fputs("\033[H\033[2J", stdout);
    if (json) print_json(p, s, ck);
    else print_text(p, s, ck);
    fflush(stdout);
    if (ck && ck->n_violations) ret = CLI_RUNTIME;
    if (watch <= 0 || stop_watch) break;
    struct timespec ts = {(time_t)watch, (long)((watch - (double)(time_t)watch) * 1e9)};
    while (nanosleep(&ts, &ts) != 0 && !stop_watch) {
    }
    if (stop_watch) break;
    if (!json) printf("\n");
  }
  free(s);
  free(ck);
  umbp_pool_detach(p);
  return ret;
}
