/* SPDX-License-Identifier: Apache-2.0 */
/*
 * abi.c — sizes of the public structs, by name, for bindings that mirror them
 * by hand (python/umbp/_lib.py checks each of its ctypes structures against
 * this at load, so a binding and a library of different versions refuse each
 * other with a message instead of corrupting memory). It sits above every
 * module because it names every module's public types.
 */
#include <stddef.h>
#include <string.h>

#include "umbp/umbp.h" /* every public header */

#define ROW(t) {#t, sizeof(t)}
static const struct {
  const char *name;
  size_t size;
} abi_sizes[] = {
    ROW(umbp_key),           ROW(umbp_pool_params),     ROW(umbp_attach_opts),
    ROW(umbp_kv_region),     ROW(umbp_dp_opts),         ROW(umbp_event),
    ROW(umbp_conn_event),    ROW(umbp_conn_stats_snapshot), ROW(umbp_conn_ns_params),
    ROW(umbp_slot_census),   ROW(umbp_topo_plan_opts),  ROW(umbp_topo_rank_info),
    ROW(umbp_ns_info),       ROW(umbp_counters),        ROW(umbp_pool_info),
    ROW(umbp_proc_info),     ROW(umbp_partition_info),  ROW(umbp_admin_index_info),
    ROW(umbp_admin_event_ring),
    ROW(umbp_feed_opts),     ROW(umbp_feed_entry),      ROW(umbp_feed_info),
    ROW(umbp_tier_params),   ROW(umbp_tier_job),        ROW(umbp_tier_info),
};

UMBP_API size_t umbp_abi_struct_size(const char *name) {
  if (!name) return 0;
  for (size_t i = 0; i < sizeof abi_sizes / sizeof abi_sizes[0]; i++)
    if (!strcmp(abi_sizes[i].name, name)) return abi_sizes[i].size;
  return 0;
}
