/* SPDX-License-Identifier: Apache-2.0 */
/*
 * umbp.h — the whole public API of umbp: include this one header.
 *
 *   umbp/common.h     conventions (errors, umbp_last_error(), logging, versions)
 *   umbp/pool.h       the pool segment and its process registry
 *   umbp/index.h      the block index: namespaces, reserve/publish, lookup/pin, events, counters
 *   umbp/check.h      umbp_pool_check(): every invariant of a pool, verified with loads only
 *   umbp/datapath.h   KV layouts, the copy engine, CUDA IPC
 *   umbp/connector.h  key codec, namespace derivation, matched tokens, KV events (for connectors)
 *   umbp/topo.h       hwloc topology and placement plans
 *   umbp/admin.h      for daemons, inspectors and benchmarks: the daemon lock, inspection snapshots
 *   umbp/feed.h       the published-key feed: every publish and removal, to consumers at their own cursors
 *   umbp/tier.h       the request table between schedulers and the host tier (`umbp tier`)
 *
 * Each header can also be included alone; each includes what it needs.
 */
#ifndef UMBP_UMBP_H
#define UMBP_UMBP_H

#include "umbp/common.h"
#include "umbp/pool.h"
#include "umbp/index.h"
#include "umbp/check.h"
#include "umbp/datapath.h"
#include "umbp/connector.h"
#include "umbp/topo.h"
#include "umbp/admin.h"
#include "umbp/feed.h"
#include "umbp/tier.h"

#endif
