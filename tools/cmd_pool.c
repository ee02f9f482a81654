/* SPDX-License-Identifier: Apache-2.0 */
/* umbp pool — create, destroy, list, describe, reap and collect pools. */
#include <dirent.h>
#include <errno.h>
#include <getopt.h>
#include <grp.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "pool_notes.h" /* embedded pools, their engines and namespace labels */
#include "snapshot.h" /* snap_fmt_time: the time format of 'umbp inspect' */
#include "umbp/admin.h"
#include "umbp/index.h"
#include "umbp/pool.h"
#include "umbp/topo.h"

/* Attach timeouts (ms) of read-only looks at a pool that may still be being
 * created: a destroy only asks who is attached, so it does not wait long;
 * info and ls wait a little longer for a creator that is nearly done. */
#define DESTROY_LOOK_TIMEOUT_MS 200
#define INFO_ATTACH_TIMEOUT_MS 1000

static const char *pool_usage =
    "Usage: umbp pool SUBCOMMAND [OPTIONS]\n"
    "\n"
    "Manage umbp pools: POSIX shared-memory segments (/dev/shm/umbp.NAME) that hold\n"
    "KV-cache blocks for every process on the host.\n"
    "\n"
    "Subcommands:\n"
    "  create NAME --capacity SIZE [--slot-size SIZE]\n"
    "              [--numa-nodes LIST|all|auto [--ranks N]]\n"
    "              [--mempolicy bind|preferred|interleave|none] [--group GROUP]\n"
    "              [--hugepages [--hugetlbfs DIR]] [--index-pages try|huge|small]\n"
    "              [--prefault-threads N | --no-prefault [--no-reserve]]\n"
    "              [--event-capacity N] [--quiet]\n"
    "  destroy NAME [--force]\n"
    "  ls [--json]\n"
    "  info NAME [--json]\n"
    "  reap NAME\n"
    "  gc [NAME...] [--dry-run]\n"
    "\n"
    "Run 'umbp pool SUBCOMMAND --help' for details.\n"
    "Exit status: 0 success; 1 runtime error; 2 usage error.\n"
    "Examples:\n"
    "  umbp pool create kv --capacity 8GiB --numa-nodes auto\n"
    "  umbp pool ls\n"
    "  umbp pool info kv\n"
    "  umbp pool gc\n"
    "  umbp pool destroy kv\n";

static const char *create_usage =
    "Usage: umbp pool create NAME --capacity SIZE [OPTIONS]\n"
    "\n"
    "Create pool NAME and pre-fault its memory. The pool stays until 'umbp pool\n"
    "destroy NAME' or a reboot; processes attach to it by name.\n"
    "NAME is 1-64 characters from [A-Za-z0-9._-], not starting with '-' nor\n"
    "ending in .feed, .tier or .ipc (the names of a pool's side files).\n"
    "\n"
    "Options:\n"
    "  --capacity SIZE      bytes of block slots, e.g. 8GiB (required). SIZE takes\n"
    "                       B, KiB, MiB, GiB, TiB (K/M/G/T and KB/MB/GB are read as\n"
    "                       binary units too) and decimals: 1.5GiB.\n"
    "  --slot-size SIZE     bytes per block slot (default 256KiB): the KV bytes of\n"
    "                       one block on one rank; a multiple of 64, 4KiB to 4GiB.\n"
    "  --numa-nodes LIST    NUMA nodes that get a partition each, e.g. 0,1; 'all'\n"
    "                       (default): every node with memory; 'auto': the nodes\n"
    "                       local to the GPUs, from the topology plan (see 'umbp\n"
    "                       topo'; --ranks N plans N ranks, default one per GPU).\n"
    "  --ranks N            with --numa-nodes auto: plan for N tensor-parallel ranks.\n"
    "  --mempolicy POLICY   bind (default): each partition on its node; preferred;\n"
    "                       interleave: pages spread over the nodes; none (or\n"
    "                       default, the word of umbp topo): the kernel's own.\n"
    "  --group GROUP        let GROUP (name or gid) read and write the pool (mode\n"
    "                       0660); by default only the creating user can (0600).\n"
    "  --hugepages          back the pool with 2 MiB pages from a hugetlbfs mount.\n"
    "  --hugetlbfs DIR      the hugetlbfs mount: the first in /proc/mounts (the\n"
    "                       default), the only one umbp commands look in for pools.\n"
    "  --index-pages MODE   pages of the lookup-hot index (bucket array and slot\n"
    "                       metadata: 72 MiB for 1M slots, sized by the slot count).\n"
    "                       Lookups touch it at random; on 2 MiB pages they miss\n"
    "                       the TLB far less (single hits 0.9x -> 1.1x rte_hash in\n"
    "                       'umbp bench index'). try (default): 2 MiB pages in\n"
    "                       umbp-index.NAME on the first hugetlbfs mount when it has\n"
    "                       enough free pages (sysctl vm.nr_hugepages), else 4 KiB\n"
    "                       pages, with a note saying why; huge: 2 MiB pages or\n"
    "                       fail; small: 4 KiB pages. With --hugepages the whole\n"
    "                       pool is on 2 MiB pages already.\n"
    "  --prefault-threads N threads that fault the memory in (default min(CPUs, 8)).\n"
    "  --no-prefault        leave the slot bytes to fault in on first use; their\n"
    "                       blocks in /dev/shm are still reserved (fallocate), so a\n"
    "                       /dev/shm that fills up later cannot kill a writer with\n"
    "                       SIGBUS. The index metadata (160 MiB for 1M slots) is\n"
    "                       allocated at creation either way, and mapped by every\n"
    "                       read-write attach, so lookups and removes never take a\n"
    "                       page fault.\n"
    "  --no-reserve         with --no-prefault: do not reserve the slot bytes either\n"
    "                       (a sparse pool, for tests: when /dev/shm fills up, a\n"
    "                       process writing a block dies of SIGBUS; a warning says so).\n"
    "  --event-capacity N   events kept for subscribers (default 65536).\n"
    "  -q, --quiet          no progress output.\n"
    "\n"
    "The size is checked against /dev/shm's free space, MemAvailable and the chosen\n"
    "nodes' memory before anything is allocated. Ctrl-C, SIGTERM, SIGHUP or SIGQUIT\n"
    "while the pool is being made removes the half-made pool; one that comes after it\n"
    "was made keeps it, and says so.\n"
    "\n"
    "Exit status: 0 created; 1 runtime error (exists, does not fit, ...); 2 usage error;\n"
    "128 + N stopped by signal N.\n"
    "Example: umbp pool create kv --capacity 8GiB --slot-size 256KiB --numa-nodes 0,1\n";

static const char *destroy_usage =
    "Usage: umbp pool destroy NAME [--force]\n"
    "\n"
    "Remove pool NAME. Processes that still have it mapped keep their mapping until\n"
    "they detach, but no one can attach any more. Without --force, a pool with live\n"
    "processes attached is not removed. Its notes (/dev/shm/umbp-notes.NAME: who\n"
    "made it, namespace labels) and its index file go with it, also when they are\n"
    "left without their pool.\n"
    "\n"
    "Options:\n"
    "  -f, --force  remove it even with live processes attached (they keep their\n"
    "               mapping; a daemon that owns it notices and stops with status 1).\n"
    "\n"
    "Exit status: 0 removed; 1 no such pool, in use, or no permission; 2 usage error.\n"
    "Examples:\n"
    "  umbp pool destroy kv\n"
    "  umbp pool destroy kv --force     (engines still attached)\n";

static const char *ls_usage =
    "Usage: umbp pool ls [--json]\n"
    "\n"
    "List the pools on this host (/dev/shm/umbp.*, and umbp.* on the hugetlbfs\n"
    "mount for --hugepages pools) with their size, slots, where their index is\n"
    "(INDEX: 2M on 2 MiB pages, 4K on 4 KiB pages) and attached processes; and index\n"
    "files left without their pool (umbp-index.NAME on the hugetlbfs mount, after\n"
    "/dev/shm/umbp.NAME was removed alone), which 'umbp pool destroy NAME' removes.\n"
    "STATUS says what a pool needs: 'has dead processes' (umbp pool reap frees what\n"
    "they held), or, for an embedded pool (made by a vLLM engine, no daemon) whose\n"
    "processes are all gone, that umbp pool gc removes it.\n"
    "JSON: one object a row: name, slot_count, slot_size, total_bytes, procs_alive,\n"
    "procs_dead, hugepages, index_hugepages, embedded, status (\"ok\" or what is\n"
    "wrong).\n"
    "\n"
    "Exit status: 0; 1 on a runtime error; 2 usage error.\n"
    "Examples:\n"
    "  umbp pool ls\n"
    "  umbp pool ls --json | jq -r '.[] | select(.status != \"ok\") | .name'\n";

static const char *info_usage =
    "Usage: umbp pool info NAME [--json]\n"
    "\n"
    "Describe pool NAME: layout version, sizes, partitions, free slots, creation,\n"
    "who owns it (a daemon, a vLLM engine in embedded mode, or no one), its\n"
    "namespaces with their labels (model, TP, dtype: written by the vLLM\n"
    "connector), and the processes in its registry (alive or dead, with the vLLM\n"
    "engine each belongs to). Attaches read-only.\n"
    "\n"
    "JSON fields: name, path, layout (\"MAJOR.MINOR\"), uuid, total_bytes, slot_size,\n"
    "slot_count, hugepages, index_hugepages, index_huge_bytes, created (UTC),\n"
    "created_unix, creator_pid, run_generation,\n"
    "partitions[] {index, numa_node, slots, first_slot, bytes, free_slots},\n"
    "slots {free, reserved, published, evicting, retired (= evicting, the key\n"
    "of older layouts), pinned}, embedded (null, or\n"
    "{instance, namespace, creator_pid, capacity}), namespaces[] {id, name, label,\n"
    "blocks, quota_bytes}, processes[] {slot, pid, role, rank, alive, attach_unix,\n"
    "heartbeat_unix, comm, engine}.\n"
    "\n"
    "Times are UTC (2026-12-02T16:00:00Z) and the uuid is 8-4-4-4-12 hex, as in\n"
    "'umbp inspect'.\n"
    "\n"
    "Exit status: 0; 1 no such pool or unreadable; 2 usage error.\n"
    "Examples:\n"
    "  umbp pool info kv\n"
    "  umbp pool info kv --json | jq '.processes[] | select(.alive | not)'\n";

static const char *reap_usage =
    "Usage: umbp pool reap NAME\n"
    "\n"
    "Free the registry slots of dead processes and what they held (pins, reserved\n"
    "slots, half-done queue operations). Live processes are never touched.\n"
    "\n"
    "Exit status: 0; 1 runtime error; 2 usage error.\n"
    "Example: umbp pool reap kv   (what 'umbp pool ls' suggests for 'has dead processes')\n";

static const char *gc_usage =
    "Usage: umbp pool gc [NAME...] [--dry-run]\n"
    "\n"
    "Remove embedded pools whose processes are all dead: a vLLM engine in embedded\n"
    "mode (no daemon) creates its pool and removes it at exit, but an engine killed\n"
    "with SIGKILL (or by the OOM killer) leaves it in /dev/shm with all its memory.\n"
    "A pool is embedded when its notes (/dev/shm/umbp-notes.NAME, written by the\n"
    "connector) say so; pools made by 'umbp pool create' or a daemon are never\n"
    "removed here. Notes left without their pool are removed too. Without NAME,\n"
    "every pool on the host is looked at. The next engine that starts with the\n"
    "same pool name does the same for its pool.\n"
    "\n"
    "Options:\n"
    "  --dry-run   print what would be removed, remove nothing.\n"
    "\n"
    "Exit status: 0; 1 a pool could not be removed (another user's, or its notes\n"
    "stayed locked); 2 usage error.\n"
    "Examples:\n"
    "  umbp pool gc\n"
    "  umbp pool gc vllm --dry-run\n";

/* umbp.NAME names a side file of pool BASE when NAME is BASE.feed (the
 * published-key feed), BASE.tier (the tier's request table) or BASE.ipc (the
 * CUDA IPC table) */
static bool side_file_name(const char *name) {
  const char *dot = strrchr(name, '.');
  return dot && dot != name && (!strcmp(dot, ".feed") || !strcmp(dot, ".tier") || !strcmp(dot, ".ipc"));
}

static bool want_help(int argc, char **argv) {
  for (int i = 1; i < argc; i++)
    if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) return true;
  return false;
}

static void progress_cb(void *arg, const char *what, uint64_t done, uint64_t total) {
  (void)arg;
  static int last = -1;
  int pct = total ? (int)(done * 100 / total) : 100;
  if (pct == last) return;
  last = pct;
  fprintf(stderr, "\r%s: %3d%% (%llu of %llu MiB)", what, pct, (unsigned long long)(done >> 20),
          (unsigned long long)(total >> 20));
  if (done >= total) fputc('\n', stderr);
  fflush(stderr);
}

/* Ctrl-C, SIGTERM, SIGHUP or SIGQUIT during 'pool create' (pre-faulting a large pool
 * takes a while) left the half-made file, its reserved memory and its index
 * file in place until someone ran create or destroy again. The file is this
 * process's once pre-faulting has begun (the first progress report: the
 * library made it with O_EXCL, or took over a dead creator's), and only then
 * is it removed: before, the name may be another process's pool. */
static const char *g_creating;   /* the pool being created; NULL once create returned */
static const char *g_made;       /* the pool, once create made it */
static _Atomic bool g_create_ours;
static bool g_create_tty;        /* progress lines drawn */

static void create_progress(void *arg, const char *what, uint64_t done, uint64_t total) {
  atomic_store(&g_create_ours, true);
  if (g_create_tty) progress_cb(arg, what, done, total);
}

static void create_cleanup(int sig) { /* on cli_fatal_signals()' thread, under its lock */
  if (g_made) { /* a signal just after the work was done: said, or the pool looks half-made to its user */
    fprintf(stderr, "%sumbp: pool create ended by %s after pool '%s' was made: the pool is kept ('umbp pool destroy %s' "
                    "removes it)\n",
            g_create_tty ? "\n" : "", strsignal(sig), g_made, g_made);
    return;
  }
  if (!g_creating || !atomic_load(&g_create_ours)) return;
  umbp_pool_destroy(g_creating);
  fprintf(stderr, "%sumbp: pool create stopped by %s: the half-made pool '%s' was removed\n", g_create_tty ? "\n" : "",
          strsignal(sig), g_creating);
}

static void log_cb(void *arg, int level, const char *msg) {
  (void)arg;
  fprintf(stderr, "umbp: %s: %s\n", level == UMBP_LOG_ERROR ? "error" : level == UMBP_LOG_WARN ? "warning" : "note",
          msg);
}

static int fail_rc(int rc) {
  const char *d = umbp_last_error();
  cli_error("%s", d && *d ? d : umbp_strerror(rc));
  return CLI_RUNTIME;
}

/* --group NAME|GID into pp (group access on). CLI_OK or CLI_USAGE with the
 * message printed. */
/* --numa-nodes auto: the nodes of this machine's topology plan for ranks
 * ranks (0: one per GPU) into pp, printed unless quiet. CLI_OK or the
 * runtime error's exit code. */
static int plan_numa_nodes(umbp_pool_params *pp, int ranks, bool quiet) {
  umbp_topo *topo;
  umbp_topo_plan *plan;
  int rc = umbp_topo_load(NULL, 0, &topo);
  if (rc) return fail_rc(rc);
  umbp_topo_plan_opts po = UMBP_TOPO_PLAN_OPTS_INIT;
  po.nranks = ranks;
  rc = umbp_topo_plan_make(topo, &po, &plan);
  if (rc) {
    umbp_topo_free(topo);
    return fail_rc(rc);
  }
  unsigned nodes[UMBP_MAX_PARTITIONS];
  int n = umbp_topo_plan_numa_nodes(plan, nodes, UMBP_MAX_PARTITIONS);
  pp->n_numa_nodes = 0;
  for (int i = 0; i < n && i < UMBP_MAX_PARTITIONS; i++) pp->numa_nodes[pp->n_numa_nodes++] = (int)nodes[i];
  if (!quiet) {
    printf("numa nodes from the topology plan (%d rank%s):", umbp_topo_plan_nranks(plan),
           umbp_topo_plan_nranks(plan) == 1 ? "" : "s");
    for (unsigned i = 0; i < pp->n_numa_nodes; i++) printf(" %d", pp->numa_nodes[i]);
    printf("\n");
    for (int i = 0; i < umbp_topo_plan_note_count(plan); i++) printf("  note: %s\n", umbp_topo_plan_note(plan, i));
  }
  umbp_topo_plan_free(plan);
  umbp_topo_free(topo);
  return CLI_OK;
}

static int pool_create(int argc, char **argv) {
  if (want_help(argc, argv)) {
    fputs(create_usage, stdout);
    return CLI_OK;
  }
  enum { O_CAP = 256, O_SLOT, O_NODES, O_POL, O_GROUP, O_HUGE, O_HDIR, O_PFT, O_NOPF, O_EVCAP, O_RANKS, O_IPAGES, O_NORES };
  static const struct option opts[] = {
      {"capacity", required_argument, 0, O_CAP},       {"slot-size", required_argument, 0, O_SLOT},
      {"numa-nodes", required_argument, 0, O_NODES},   {"mempolicy", required_argument, 0, O_POL},
      {"group", required_argument, 0, O_GROUP},        {"hugepages", no_argument, 0, O_HUGE},
      {"hugetlbfs", required_argument, 0, O_HDIR},     {"prefault-threads", required_argument, 0, O_PFT},
      {"no-prefault", no_argument, 0, O_NOPF},         {"event-capacity", required_argument, 0, O_EVCAP},
      {"ranks", required_argument, 0, O_RANKS},        {"quiet", no_argument, 0, 'q'},
      {"index-pages", required_argument, 0, O_IPAGES}, {"no-reserve", no_argument, 0, O_NORES},
      {0, 0, 0, 0}};
  umbp_pool_params pp;
  umbp_pool_params_init(&pp);
  bool quiet = false, have_cap = false, auto_nodes = false;
  int ranks = 0;
  int c;
  optind = 1;
  opterr = 0;
  while ((c = getopt_long(argc, argv, ":q", opts, NULL)) != -1) {
    uint64_t v;
    switch (c) {
    case O_CAP:
      if (cli_parse_size(optarg, &v) || v == 0)
        return cli_usage_error("pool create", "--capacity '%s' is not a size: use e.g. 8GiB or 512MiB", optarg);
      pp.capacity = v;
      have_cap = true;
      break;
    case O_SLOT:
      if (cli_parse_slot_size("pool create", optarg, &pp.slot_size) != CLI_OK) return CLI_USAGE;
      break;
    case O_NODES:
      if (cli_parse_numa_nodes("pool create", optarg, &pp, &auto_nodes) != CLI_OK) return CLI_USAGE;
      break;
    case O_POL:
      if (!strcmp(optarg, "bind")) pp.mempolicy = UMBP_MPOL_BIND;
      else if (!strcmp(optarg, "preferred")) pp.mempolicy = UMBP_MPOL_PREFERRED;
      else if (!strcmp(optarg, "interleave")) pp.mempolicy = UMBP_MPOL_INTERLEAVE;
      /* "default": what 'umbp topo' (and its plan) calls the kernel's own policy */
      else if (!strcmp(optarg, "none") || !strcmp(optarg, "default")) pp.mempolicy = UMBP_MPOL_NONE;
      else return cli_usage_error("pool create", "--mempolicy '%s': use bind, preferred, interleave or none (also "
                                                 "called default)", optarg);
      break;
    case O_GROUP:
      pp.group_access = true;
      if (cli_parse_group("pool create", optarg, &pp.group) != CLI_OK) return CLI_USAGE;
      break;
    case O_HUGE: pp.hugepages = true; break;
    case O_HDIR:
      if (!*optarg) return cli_usage_error("pool create", "--hugetlbfs '': give the directory of a hugetlbfs mount");
      pp.hugetlbfs_dir = optarg;
      break;
    case O_IPAGES:
      if (cli_parse_index_pages(optarg, &pp.index_pages))
        return cli_usage_error("pool create", "--index-pages '%s': use try, huge or small", optarg);
      break;
    case O_PFT: {
      char *end;
      long n = strtol(optarg, &end, 10);
      if (*end || n < 1 || n > 64) return cli_usage_error("pool create", "--prefault-threads '%s': use 1 to 64", optarg);
      pp.prefault_threads = (unsigned)n;
      break;
    }
    case O_NOPF: pp.no_prefault = true; break;
    case O_NORES: pp.no_reserve = true; break;
    case O_EVCAP: {
      char *end;
      long n = strtol(optarg, &end, 10);
      if (*end || n < 2 || n > (1 << 24))
        return cli_usage_error("pool create", "--event-capacity '%s': use 2 to 16777216", optarg);
      pp.event_capacity = (uint32_t)n;
      break;
    }
    case O_RANKS: {
      char *end;
      long n = strtol(optarg, &end, 10);
      if (*end || n < 1 || n > 1024) return cli_usage_error("pool create", "--ranks '%s': use 1 to 1024", optarg);
      ranks = (int)n;
      break;
    }
    case 'q': quiet = true; break;
    case ':': return cli_usage_error("pool create", "option '%s' needs a value", argv[optind - 1]);
    default: return cli_bad_option("pool create", opts, argv[optind - 1]);
    }
  }
  if (optind >= argc) return cli_usage_error("pool create", "missing pool NAME");
  if (optind < argc - 1)
    return cli_usage_error("pool create", "too many arguments: '%s' after pool NAME '%s'", argv[optind + 1], argv[optind]);
  const char *name = argv[optind];
  if (umbp_pool_name_valid(name)) return cli_usage_error("pool create", "%s", umbp_last_error());
  if (!have_cap) return cli_usage_error("pool create", "--capacity is required, e.g. --capacity 8GiB");
  if (name[0] == '-')
    return cli_usage_error("pool create", "pool name '%s' starts with '-', which commands read as an option: start it "
                                          "with a letter, a digit, '.' or '_'", name);
  const char *dot = strrchr(name, '.'); /* the library refuses these too (umbp_pool_create) */
  if (side_file_name(name))
    return cli_usage_error("pool create", "pool name '%s' ends in '%s', the name of a side file of pool '%.*s': "
                                          "choose a name that does not end in .feed, .tier or .ipc",
                           name, dot, (int)(dot - name), name);
  if (cli_check_slots("pool create", pp.capacity, pp.slot_size) != CLI_OK) return CLI_USAGE;
  if (ranks && !auto_nodes) return cli_usage_error("pool create", "--ranks only makes sense with --numa-nodes auto");
  if (pp.hugetlbfs_dir && !pp.hugepages)
    return cli_usage_error("pool create", "--hugetlbfs only makes sense with --hugepages (it names the mount the "
                                          "pool's 2 MiB pages come from)");
  /* the synopsis's alternatives: with --no-prefault nothing is pre-faulted,
   * so the threads were silently unused */
  if (pp.prefault_threads && pp.no_prefault)
    return cli_usage_error("pool create", "--prefault-threads %u and --no-prefault: nothing is pre-faulted with "
                                          "--no-prefault; give one of them",
                           pp.prefault_threads);
  if (pp.no_reserve && !pp.no_prefault)
    return cli_usage_error("pool create", "--no-reserve only makes sense with --no-prefault (pre-faulting allocates "
                                          "every block)");
  if (auto_nodes) {
    int rc = plan_numa_nodes(&pp, ranks, quiet);
    if (rc != CLI_OK) return rc;
  }
  g_create_tty = !quiet && cli_stderr_tty();
  pp.progress = create_progress;
  /* notes too: where the index went, and why when "try" fell back */
  umbp_log_set(log_cb, NULL, quiet ? UMBP_LOG_WARN : UMBP_LOG_INFO);
  g_creating = name;
  if (cli_fatal_signals(create_cleanup) != 0) g_creating = NULL; /* no signal thread: the default action, as before */
  umbp_pool *p;
  int rc = umbp_pool_create(name, &pp, &p);
  cli_fatal_lock(); /* a signal from here on keeps the pool: it is made */
  g_creating = NULL;
  if (rc == 0) g_made = name;
  cli_fatal_unlock();
  if (rc) return fail_rc(rc);
  umbp_pool_info info;
  umbp_pool_get_info(p, &info);
  char a[32], b[32], t[32];
  if (!quiet)
    printf("created pool %s: %u slots of %s (%s) in %u partition%s, segment %s at %s\n", name, info.slot_count,
           cli_fmt_size(info.slot_size, a, sizeof a), cli_fmt_size((uint64_t)info.slot_count * info.slot_size, b, sizeof b),
           info.n_partitions, info.n_partitions == 1 ? "" : "s", cli_fmt_size(info.total_size, t, sizeof t), info.path);
  char ib[256];
  if (!quiet) printf("index on %s\n", cli_fmt_index_pages(&info, ib, sizeof ib));
  umbp_pool_detach(p);
  return CLI_OK;
}

static int pool_destroy(int argc, char **argv) {
  if (want_help(argc, argv)) {
    fputs(destroy_usage, stdout);
    return CLI_OK;
  }
  bool force = false;
  const char *name = NULL;
  bool operands = false; /* after "--": a pool an older build let start with '-' */
  for (int i = 1; i < argc; i++) {
    if (!operands && !strcmp(argv[i], "--")) operands = true;
    else if (!operands && (!strcmp(argv[i], "--force") || !strcmp(argv[i], "-f"))) force = true;
    else if (!operands && argv[i][0] == '-') return cli_usage_error("pool destroy", "unknown option '%s'", argv[i]);
    else if (name) return cli_usage_error("pool destroy", "too many arguments: '%s' after pool NAME '%s'", argv[i], name);
    else name = argv[i];
  }
  if (!name) return cli_usage_error("pool destroy", "missing pool NAME");
  if (umbp_pool_name_valid(name)) return cli_usage_error("pool destroy", "%s", umbp_last_error());
  if (!force) {
    umbp_attach_opts o;
    umbp_attach_opts_init(&o);
    o.read_only = true;
    o.timeout_ms = DESTROY_LOOK_TIMEOUT_MS;
    umbp_pool *p;
    if (umbp_pool_attach(name, &o, &p) == 0) {
      umbp_proc_info pi[UMBP_MAX_PROCS];
      int n = umbp_pool_list_procs(p, pi, UMBP_MAX_PROCS);
      int live = 0;
      char pids[256] = "";
      size_t l = 0;
      for (int i = 0; i < n; i++)
        if (pi[i].alive) {
          live++;
          if (l < sizeof pids - 16) l += (size_t)snprintf(pids + l, sizeof pids - l, "%s%d", l ? ", " : "", pi[i].pid);
        }
      umbp_pool_detach(p);
      if (live) {
        cli_error("pool %s has %d live process%s attached (pid %s): stop them first, or pass --force (they keep "
                  "their mapping until they detach)",
                  name, live, live == 1 ? "" : "es", pids);
        return CLI_RUNTIME;
      }
    }
  }
  int rc = umbp_pool_destroy(name);
  int nr = notes_remove(name); /* the pool's notes go with it, also ones left alone */
  if (rc == -ENOENT && nr == 0) {
    char np[256];
    printf("removed %s (notes left without their pool)\n", notes_path(name, np, sizeof np));
    return CLI_OK;
  }
  if (rc) return fail_rc(rc);
  printf("destroyed pool %s\n", name);
  return CLI_OK;
}

/* ---- who uses a pool: the registry and the notes -------------------------------- */
struct pool_users {
  umbp_pool_info info;
  umbp_proc_info procs[UMBP_MAX_PROCS];
  int nprocs;
  unsigned alive;  /* alive processes that keep it in use (tools do not) */
  bool daemon;     /* a daemon has a registry slot (alive or dead) */
  bool embedded;   /* the notes say a vLLM engine made it in embedded mode */
};

/* The notes are ~200 KiB: one static copy for the subcommand that runs. */
static struct pool_notes g_notes;

/* Who made an embedded pool, in words: a vLLM engine by its instance id, or
 * `umbp bench tier`, whose pools carry notes of their own kind
 * (python/umbp/bench_tier.py, NOTES_INSTANCE) so that gc removes them after
 * a SIGKILL. */
static const char *notes_maker(const struct pool_notes *n) {
  static char buf[96];
  if (!strcmp(n->instance, "umbp-bench-tier")) return "a umbp bench tier run";
  snprintf(buf, sizeof buf, "vLLM engine %s", n->instance);
  return buf;
}

/* Fill *u (and g_notes) for pool `name` through a read-only attach: 0 or the attach's -errno. */
static int pool_users(const char *name, struct pool_users *u) {
  umbp_attach_opts o;
  umbp_attach_opts_init(&o);
  o.read_only = true;
  o.timeout_ms = 1000;
  umbp_pool *p;
  int rc = umbp_pool_attach(name, &o, &p);
  if (rc) return rc;
  memset(u, 0, sizeof *u);
  umbp_pool_get_info(p, &u->info);
  u->nprocs = umbp_pool_list_procs(p, u->procs, UMBP_MAX_PROCS);
  if (u->nprocs < 0) u->nprocs = 0;
  umbp_pool_detach(p);
  for (int i = 0; i < u->nprocs; i++) {
    if (u->procs[i].alive && u->procs[i].role != UMBP_ROLE_TOOL) u->alive++;
    if (u->procs[i].role == UMBP_ROLE_DAEMON) u->daemon = true;
  }
  notes_read(name, u->info.uuid, &g_notes);
  u->embedded = g_notes.valid && g_notes.embedded;
  return 0;
}

/* An embedded pool that no process uses any more: what `pool gc` removes. */
static bool pool_is_garbage(const struct pool_users *u) { return u->embedded && !u->daemon && u->alive == 0; }

/* "1234, 1240" of the processes (alive or dead as asked) into buf. */
static const char *fmt_pids(const struct pool_users *u, bool alive, char *buf, size_t n) {
  size_t l = 0;
  buf[0] = 0;
  for (int i = 0; i < u->nprocs && l + 16 < n; i++)
    if (u->procs[i].alive == alive && (!alive || u->procs[i].role != UMBP_ROLE_TOOL))
      l += (size_t)snprintf(buf + l, n - l, "%s%d", l ? ", " : "", u->procs[i].pid);
  if (!l) snprintf(buf, n, "none");
  return buf;
}

static int attach_ro(const char *name, umbp_pool **p) {
  umbp_attach_opts o;
  umbp_attach_opts_init(&o);
  o.read_only = true;
  o.timeout_ms = INFO_ATTACH_TIMEOUT_MS;
  return umbp_pool_attach(name, &o, p);
}

static int pool_info(int argc, char **argv) {
  if (want_help(argc, argv)) {
    fputs(info_usage, stdout);
    return CLI_OK;
  }
  bool json = false;
  const char *name = NULL;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--json")) json = true;
    else if (argv[i][0] == '-') return cli_usage_error("pool info", "unknown option '%s'", argv[i]);
    else if (name) return cli_usage_error("pool info", "too many arguments: '%s' after pool NAME '%s'", argv[i], name);
    else name = argv[i];
  }
  if (!name) return cli_usage_error("pool info", "missing pool NAME");
  if (umbp_pool_name_valid(name)) return cli_usage_error("pool info", "%s", umbp_last_error());
  umbp_pool *p;
  int rc = attach_ro(name, &p);
  if (rc) return fail_rc(rc);
  umbp_pool_info info;
  umbp_pool_get_info(p, &info);
  umbp_slot_census cs;
  umbp_census(p, &cs);
  umbp_proc_info pi[UMBP_MAX_PROCS];
  int np = umbp_pool_list_procs(p, pi, UMBP_MAX_PROCS);
  if (np < 0) np = 0;
  notes_read(name, info.uuid, &g_notes);
  const struct pool_notes *nt = &g_notes;
  int daemon_i = -1;
  unsigned alive = 0;
  for (int i = 0; i < np; i++) {
    if (pi[i].role == UMBP_ROLE_DAEMON && (daemon_i < 0 || pi[i].alive)) daemon_i = i;
    if (pi[i].alive && pi[i].role != UMBP_ROLE_TOOL) alive++;
  }
  umbp_ns_info nsi[UMBP_MAX_NAMESPACES];
  int nns = 0;
  for (uint32_t id = 0; id < UMBP_MAX_NAMESPACES; id++)
    if (umbp_ns_info_get(p, id, &nsi[nns]) == 0) nns++;
  char uuid[40], a[32], b[32];
  cli_fmt_uuid(info.uuid, uuid, sizeof uuid);
  char tbuf[32]; /* UTC, ISO 8601, as 'umbp inspect' and the daemon's log print it */
  snap_fmt_time(info.created_ns, tbuf, sizeof tbuf);
  if (json) {
    struct jb j;
    jb_begin(&j, stdout);
    jb_obj(&j, NULL);
    jb_str(&j, "name", info.name);
    jb_str(&j, "path", info.path);
    char lay[16];
    snprintf(lay, sizeof lay, "%u.%u", info.layout_major, info.layout_minor);
    jb_str(&j, "layout", lay);
    jb_str(&j, "uuid", uuid);
    jb_u64(&j, "total_bytes", info.total_size);
    jb_u64(&j, "slot_size", info.slot_size);
    jb_u64(&j, "slot_count", info.slot_count);
    jb_bool(&j, "hugepages", info.hugepages);
    jb_bool(&j, "index_hugepages", info.index_hugepages);
    jb_u64(&j, "index_huge_bytes", info.index_huge_bytes);
    jb_str(&j, "created", tbuf);
    jb_u64(&j, "created_unix", info.created_ns / 1000000000ull);
    jb_i64(&j, "creator_pid", info.creator_pid);
    jb_u64(&j, "run_generation", info.run_generation);
    jb_arr(&j, "partitions");
    for (unsigned k = 0; k < info.n_partitions; k++) {
      jb_obj(&j, NULL);
      jb_u64(&j, "index", k);
      jb_i64(&j, "numa_node", info.partitions[k].numa_node);
      jb_u64(&j, "slots", info.partitions[k].slot_count);
      jb_u64(&j, "first_slot", info.partitions[k].first_slot);
      jb_u64(&j, "bytes", info.partitions[k].bytes);
      jb_u64(&j, "free_slots", info.partitions[k].free_slots);
      jb_end_obj(&j);
    }
    jb_end_arr(&j);
    jb_obj(&j, "slots");
    jb_u64(&j, "free", cs.free_);
    jb_u64(&j, "reserved", cs.reserved);
    jb_u64(&j, "published", cs.published);
    jb_u64(&j, "evicting", cs.retired + cs.evicting);
    jb_u64(&j, "retired", cs.retired + cs.evicting); /* the same figure, under the key of layouts before 6 */
    jb_u64(&j, "pinned", cs.pinned);
    jb_end_obj(&j);
    if (nt->embedded) {
      jb_obj(&j, "embedded");
      jb_str(&j, "instance", nt->instance);
      jb_str(&j, "namespace", nt->ns);
      jb_i64(&j, "creator_pid", nt->creator_pid);
      jb_u64(&j, "capacity", nt->capacity);
      jb_end_obj(&j);
    } else {
      jb_null(&j, "embedded");
    }
    jb_arr(&j, "namespaces");
    for (int k = 0; k < nns; k++) {
      jb_obj(&j, NULL);
      jb_u64(&j, "id", nsi[k].id);
      jb_str(&j, "name", nsi[k].name);
      jb_str(&j, "label", notes_label(nt, nsi[k].name));
      jb_u64(&j, "blocks", nsi[k].blocks);
      jb_u64(&j, "quota_bytes", nsi[k].quota_bytes);
      jb_end_obj(&j);
    }
    jb_end_arr(&j);
    jb_arr(&j, "processes");
    for (int i = 0; i < np; i++) {
      jb_obj(&j, NULL);
      jb_u64(&j, "slot", pi[i].slot);
      jb_i64(&j, "pid", pi[i].pid);
      jb_str(&j, "role", umbp_role_name(pi[i].role));
      jb_i64(&j, "rank", pi[i].rank);
      jb_bool(&j, "alive", pi[i].alive);
      jb_u64(&j, "attach_unix", pi[i].attach_ns / 1000000000ull);
      jb_u64(&j, "heartbeat_unix", pi[i].heartbeat_ns / 1000000000ull);
      jb_str(&j, "comm", pi[i].comm);
      jb_str(&j, "engine", notes_proc_instance(nt, pi[i].pid));
      jb_end_obj(&j);
    }
    jb_end_arr(&j);
    jb_end_obj(&j);
    jb_finish(&j);
  } else {
    printf("pool %s\n", info.name);
    printf("  path          %s%s\n", info.path, info.hugepages ? " (hugepages)" : "");
    printf("  layout        %u.%u  uuid %s  generation %llu\n", info.layout_major, info.layout_minor, uuid,
           (unsigned long long)info.run_generation);
    printf("  created       %s by pid %d (uid %u)\n", tbuf, info.creator_pid, info.creator_uid);
    if (daemon_i >= 0)
      printf("  owner         daemon, pid %d (%s)\n", pi[daemon_i].pid, pi[daemon_i].alive ? "alive" : "DEAD");
    else if (nt->embedded)
      printf("  owner         embedded in %s (namespace %s, created by pid %d); %s\n", notes_maker(nt),
             nt->ns[0] ? nt->ns : "-", nt->creator_pid,
             alive ? "the last process to leave removes it"
                   : "its processes are gone: 'umbp pool gc' removes it");
    else
      printf("  owner         none recorded (no daemon attached, not a vLLM engine's embedded pool): kept until "
             "destroyed\n");
    printf("  segment       %s\n", cli_fmt_size(info.total_size, a, sizeof a));
    char ib[256];
    printf("  index pages   %s\n", cli_fmt_index_pages(&info, ib, sizeof ib));
    printf("  slots         %u x %s = %s\n", info.slot_count, cli_fmt_size(info.slot_size, a, sizeof a),
           cli_fmt_size((uint64_t)info.slot_count * info.slot_size, b, sizeof b));
    /* retired: layouts before 6 only (0 since); the JSON keeps the key */
    printf("  slot states   free %llu, reserved %llu, published %llu (pinned %llu), evicting %llu\n",
           (unsigned long long)cs.free_, (unsigned long long)cs.reserved, (unsigned long long)cs.published,
           (unsigned long long)cs.pinned, (unsigned long long)(cs.retired + cs.evicting));
    printf("  partitions    %u\n", info.n_partitions);
    for (unsigned k = 0; k < info.n_partitions; k++) {
      char node[16];
      if (info.partitions[k].numa_node < 0) snprintf(node, sizeof node, "-");
      else snprintf(node, sizeof node, "%d", info.partitions[k].numa_node);
      printf("    #%u  node %-3s  slots %u (from %u)  %s  free %llu\n", k, node, info.partitions[k].slot_count,
             info.partitions[k].first_slot, cli_fmt_size(info.partitions[k].bytes, a, sizeof a),
             (unsigned long long)info.partitions[k].free_slots);
    }
    printf("  namespaces    %d\n", nns);
    if (nns > 0) printf("    %-4s %10s  %-40s %s\n", "ID", "BLOCKS", "NAME", "LABEL");
    for (int k = 0; k < nns; k++) {
      const char *l = notes_label(nt, nsi[k].name);
      printf("    %-4u %10llu  %-40s %s\n", nsi[k].id, (unsigned long long)nsi[k].blocks, nsi[k].name, l ? l : "-");
    }
    printf("  processes     %d (%u alive, %u dead)\n", np, info.procs_live, info.procs_dead);
    if (np > 0)
      printf("    %-4s %-7s %-9s %-4s %-5s %-20s %-16s %s\n", "SLOT", "PID", "ROLE", "RANK", "STATE", "ATTACHED", "COMMAND",
             "ENGINE");
    for (int i = 0; i < np; i++) {
      char at[32];
      snap_fmt_time(pi[i].attach_ns, at, sizeof at);
      const char *eng = notes_proc_instance(nt, pi[i].pid);
      printf("    %-4u %-7d %-9s %-4d %-5s %-20s %-16s %s\n", pi[i].slot, pi[i].pid, umbp_role_name(pi[i].role),
             pi[i].rank, pi[i].alive ? "alive" : "DEAD", at, pi[i].comm, eng ? eng : "-");
    }
  }
  umbp_pool_detach(p);
  return CLI_OK;
}

/* One row of `pool ls` for the pool file umbp.NAME, or for an index file
 * umbp-index.NAME or notes umbp-notes.NAME whose pool is gone (leftover: its
 * path). side: umbp.NAME is named as a side file of a pool (.feed, .tier,
 * .ipc): no row unless it is a pool (one an older build let be named so).
 * Whether a row was printed. */
static bool ls_row(const char *name, const char *leftover, bool side, bool json, struct jb *j) {
  if (leftover) {
    char msg[700];
    snprintf(msg, sizeof msg, "leftover %s %s, no pool: 'umbp pool destroy %s' removes it",
             strstr(leftover, NOTES_PREFIX) ? "notes" : "index file", leftover, name);
    if (json) {
      jb_obj(j, NULL);
      jb_str(j, "name", name);
      jb_str(j, "status", msg);
      jb_end_obj(j);
    } else {
      printf("%-24s %10s %10s %8s %5s %6s  %s\n", name, "-", "-", "-", "-", "-", msg);
    }
    return true;
  }
  static struct pool_users u;
  int rc = pool_users(name, &u);
  if (rc && side) return false;
  const umbp_pool_info *ip = &u.info;
  char a[32], b[32], status[300];
  if (rc == 0 && pool_is_garbage(&u))
    snprintf(status, sizeof status, "embedded pool of a vLLM engine that is gone: 'umbp pool gc' removes it");
  else if (rc == 0)
    snprintf(status, sizeof status, "%s", u.info.procs_dead ? "has dead processes (umbp pool reap)" : "ok");
  if (json) {
    jb_obj(j, NULL);
    jb_str(j, "name", name);
    if (rc == 0) {
      jb_u64(j, "slot_count", ip->slot_count);
      jb_u64(j, "slot_size", ip->slot_size);
      jb_u64(j, "total_bytes", ip->total_size);
      jb_u64(j, "procs_alive", ip->procs_live);
      jb_u64(j, "procs_dead", ip->procs_dead);
      jb_bool(j, "hugepages", ip->hugepages);
      jb_bool(j, "index_hugepages", ip->hugepages || ip->index_hugepages);
      jb_bool(j, "embedded", u.embedded);
      jb_str(j, "status", status);
    } else {
      jb_str(j, "status", umbp_last_error());
    }
    jb_end_obj(j);
  } else if (rc == 0) {
    char procs[16];
    snprintf(procs, sizeof procs, "%u", ip->procs_live);
    printf("%-24s %10u %10s %8s %5s %6s  %s\n", name, ip->slot_count, cli_fmt_size(ip->slot_size, a, sizeof a),
           cli_fmt_size(ip->total_size, b, sizeof b), ip->hugepages || ip->index_hugepages ? "2M" : "4K", procs,
           status);
  } else {
    printf("%-24s %10s %10s %8s %5s %6s  %s\n", name, "-", "-", "-", "-", "-", umbp_last_error());
  }
  return true;
}


static int pool_ls(int argc, char **argv) {
  if (want_help(argc, argv)) {
    fputs(ls_usage, stdout);
    return CLI_OK;
  }
  bool json = false;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--json")) json = true;
    else return cli_usage_error("pool ls", "unexpected argument '%s'", argv[i]);
  }
  /* pools: /dev/shm/umbp.NAME and, made with --hugepages, umbp.NAME on the
   * hugetlbfs mount, where index files umbp-index.NAME also live */
  char hdir[256];
  const char *dirs[2] = {"/dev/shm", umbp_admin_hugetlbfs_mount(hdir, sizeof hdir) == 0 ? hdir : NULL};
  DIR *d = opendir(dirs[0]);
  if (!d) {
    cli_error("cannot list /dev/shm: %s", strerror(errno));
    return CLI_RUNTIME;
  }
  struct jb j;
  if (json) {
    jb_begin(&j, stdout);
    jb_arr(&j, NULL);
  } else {
    printf("%-24s %10s %10s %8s %5s %6s  %s\n", "NAME", "SLOTS", "SLOT", "SEGMENT", "INDEX", "PROCS", "STATUS");
  }
  int count = 0;
  for (int di = 0; di < 2; di++) {
    if (di == 1 && (!dirs[1] || !(d = opendir(dirs[1])))) break;
    struct dirent *e;
    while ((e = readdir(d))) {
      const char *name = NULL;
      char leftover[600] = "";
      if (!strncmp(e->d_name, "umbp.", 5)) {
        name = e->d_name + 5;
      } else if (di == 0 && !strncmp(e->d_name, NOTES_PREFIX, strlen(NOTES_PREFIX))) {
        name = e->d_name + strlen(NOTES_PREFIX);
        if (cli_pool_file_exists(name)) continue; /* listed with its pool */
        snprintf(leftover, sizeof leftover, "%s/%s", dirs[0], e->d_name);
      } else if (di == 1 && !strncmp(e->d_name, "umbp-index.", 11)) {
        name = e->d_name + 11;
        char main_path[600];
        snprintf(main_path, sizeof main_path, "/dev/shm/umbp.%s", name);
        if (access(main_path, F_OK) == 0) continue; /* listed with its pool */
        snprintf(leftover, sizeof leftover, "%s/%s", dirs[1], e->d_name);
      }
      if (!name || umbp_pool_name_valid(name)) continue;
      if (ls_row(name, leftover[0] ? leftover : NULL, !leftover[0] && side_file_name(name), json, &j)) count++;
    }
    closedir(d);
  }
  if (json) {
    jb_end_arr(&j);
    jb_finish(&j);
  } else if (!count) {
    printf("(no pools)\n");
  }
  return CLI_OK;
}

static int pool_reap(int argc, char **argv) {
  if (want_help(argc, argv)) {
    fputs(reap_usage, stdout);
    return CLI_OK;
  }
  for (int i = 1; i < argc; i++)
    if (argv[i][0] == '-') return cli_usage_error("pool reap", "unknown option '%s'", argv[i]);
  if (argc < 2) return cli_usage_error("pool reap", "missing pool NAME");
  if (argc > 2) return cli_usage_error("pool reap", "too many arguments: '%s' after pool NAME '%s'", argv[2], argv[1]);
  if (umbp_pool_name_valid(argv[1])) return cli_usage_error("pool reap", "%s", umbp_last_error());
  umbp_log_set(log_cb, NULL, UMBP_LOG_INFO);
  umbp_attach_opts o;
  umbp_attach_opts_init(&o);
  o.role = UMBP_ROLE_TOOL;
  umbp_pool *p;
  int rc = umbp_pool_attach(argv[1], &o, &p);
  if (rc) return fail_rc(rc);
  int n = umbp_pool_reap(p);
  umbp_pool_detach(p);
  if (n < 0) return fail_rc(n);
  printf("reaped %d dead process%s\n", n, n == 1 ? "" : "es");
  return CLI_OK;
}

/* `pool gc` of one pool: 0 removed or kept (said why when `named`), 1 failed. */
static int gc_one(const char *name, bool named, bool dry_run, unsigned *removed) {
  static struct pool_users u;
  char pids[512], np[256];
  notes_path(name, np, sizeof np);
  if (!cli_pool_file_exists(name)) {
    if (access(np, F_OK) != 0) {
      if (named) printf("no pool named %s\n", name);
      return 0;
    }
    if (dry_run) {
      printf("would remove %s (notes left without their pool)\n", np);
    } else {
      int rc = notes_remove(name);
      if (rc && rc != -ENOENT) {
        cli_error("cannot remove %s: %s", np, strerror(-rc));
        return 1;
      }
      printf("removed %s (notes left without their pool)\n", np);
    }
    (*removed)++;
    return 0;
  }
  int rc = pool_users(name, &u);
  if (rc) {
    if (named) cli_error("pool gc: %s", umbp_last_error()); /* the message names the pool */
    return named ? 1 : 0;
  }
  if (!u.embedded || u.daemon) {
    if (named)
      printf("kept %s: not an embedded pool of a vLLM engine (%s); 'umbp pool destroy %s' removes it\n", name,
             u.daemon ? "a daemon owns it" : "made by 'umbp pool create' or an older connector", name);
    return 0;
  }
  if (u.alive) {
    printf("kept %s: embedded pool in use by %u live process%s (pid %s)\n", name, u.alive, u.alive == 1 ? "" : "es",
           fmt_pids(&u, true, pids, sizeof pids));
    return 0;
  }
  if (dry_run) {
    printf("would remove embedded pool %s (%s, created by pid %d; processes %s are dead)\n", name,
           notes_maker(&g_notes), g_notes.creator_pid, fmt_pids(&u, false, pids, sizeof pids));
    (*removed)++;
    return 0;
  }
  /* Under the notes' lock, as the connector's create-or-attach: an engine that
   * starts with this name now either finished first (and the pool is in use:
   * looked at again below) or waits, then finds no pool and creates one. */
  int fd = notes_lock(name, 2000);
  if (fd < 0) {
    if (fd == -ENOENT) return 0; /* removed by the next engine meanwhile */
    cli_error("skipped %s: %s %s", name, fd == -EWOULDBLOCK ? "an engine is creating or leaving it; its notes"
                                                             : "cannot lock its notes",
              fd == -EWOULDBLOCK ? "stayed locked: try again" : strerror(-fd));
    return 1;
  }
  int ret = 0;
  rc = pool_users(name, &u);
  if (rc == 0 && pool_is_garbage(&u)) {
    rc = umbp_pool_destroy(name);
    if (rc == 0 || rc == -ENOENT) {
      notes_remove(name);
      printf("removed embedded pool %s (%s, created by pid %d; processes %s are dead)\n", name,
             notes_maker(&g_notes), g_notes.creator_pid, fmt_pids(&u, false, pids, sizeof pids));
      (*removed)++;
    } else {
      cli_error("cannot remove pool %s: %s", name, umbp_last_error());
      ret = 1;
    }
  } else if (rc == 0) {
    printf("kept %s: an engine attached to it meanwhile\n", name);
  }
  notes_unlock(fd);
  return ret;
}

static int pool_gc(int argc, char **argv) {
  if (want_help(argc, argv)) {
    fputs(gc_usage, stdout);
    return CLI_OK;
  }
  bool dry_run = false;
  int nnames = 0;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--dry-run") || !strcmp(argv[i], "-n")) dry_run = true;
    else if (argv[i][0] == '-') return cli_usage_error("pool gc", "unknown option '%s'", argv[i]);
    else if (umbp_pool_name_valid(argv[i])) return cli_usage_error("pool gc", "%s", umbp_last_error());
    else nnames++;
  }
  unsigned removed = 0;
  int failed = 0;
  if (nnames) {
    for (int i = 1; i < argc; i++)
      if (argv[i][0] != '-') failed |= gc_one(argv[i], true, dry_run, &removed);
  } else {
    /* every pool and every notes file in /dev/shm (hugetlbfs pools are never embedded) */
    DIR *d = opendir(NOTES_DIR);
    if (!d) {
      cli_error("cannot list %s: %s", NOTES_DIR, strerror(errno));
      return CLI_RUNTIME;
    }
    /* every notes file, however many (the names are read first: gc_one()
     * removes files from the directory being listed) */
    char (*names)[UMBP_NAME_MAX + 1] = NULL;
    size_t n = 0, cap = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
      const char *name = NULL;
      if (!strncmp(e->d_name, NOTES_PREFIX, strlen(NOTES_PREFIX))) name = e->d_name + strlen(NOTES_PREFIX);
      if (!name || umbp_pool_name_valid(name)) continue; /* only pools with notes can be embedded ones */
      if (n == cap) {
        cap = cap ? 2 * cap : 64;
        void *nn = realloc(names, cap * sizeof *names);
        if (!nn) {
          closedir(d);
          free(names);
          cli_error("out of memory listing %s", NOTES_DIR);
          return CLI_RUNTIME;
        }
        names = nn;
      }
      snprintf(names[n++], sizeof names[0], "%s", name);
    }
    closedir(d);
    for (size_t k = 0; k < n; k++) failed |= gc_one(names[k], false, dry_run, &removed);
    free(names);
  }
  if (!removed && !failed) printf("nothing to remove\n");
  return failed ? CLI_RUNTIME : CLI_OK;
}

int cmd_pool(int argc, char **argv) {
  if (argc < 2) {
    fputs(pool_usage, stderr);
    return CLI_USAGE;
  }
  const char *sub = argv[1];
  if (!strcmp(sub, "--help") || !strcmp(sub, "-h") || !strcmp(sub, "help")) {
    fputs(pool_usage, stdout);
    return CLI_OK;
  }
  if (!strcmp(sub, "create")) return pool_create(argc - 1, argv + 1);
  if (!strcmp(sub, "destroy")) return pool_destroy(argc - 1, argv + 1);
  if (!strcmp(sub, "ls") || !strcmp(sub, "list")) return pool_ls(argc - 1, argv + 1);
  if (!strcmp(sub, "info")) return pool_info(argc - 1, argv + 1);
  if (!strcmp(sub, "reap")) return pool_reap(argc - 1, argv + 1);
  if (!strcmp(sub, "gc")) return pool_gc(argc - 1, argv + 1);
  return cli_usage_error("pool", "unknown subcommand '%s'", sub);
}
