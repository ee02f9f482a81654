/* SPDX-License-Identifier: Apache-2.0 */
/*
 * check.h — verify every invariant of a pool segment without changing it.
 *
 * umbp_pool_check() walks the whole segment (registry, slot states, buckets,
 * pins, free rings, namespaces) through loads only, so it works on a
 * read-only handle (`umbp inspect NAME --check`, a user with read permission
 * only) as well as on a read-write one, and it may run while other processes
 * keep working on the pool. What it verifies:
 *
 *  - every way of every bucket points at a valid slot in a state that may be
 *    linked (PUBLISHED; RESERVED inside publish; EVICTING inside a removal),
 *    whose key's signature matches the way and whose home bucket is at most
 *    UMBP_MAX_PROBE-1 buckets before the way's bucket;
 *  - no slot is reachable through two ways; no PUBLISHED slot is unreachable;
 *  - every bucket's overflow count >= the entries homed there that live in a
 *    later bucket, its reach >= their distances, and its filter holds each
 *    one's bit;
 *  - each FREE slot is on its own partition's free ring (or left off a ring
 *    that was held up, which reserves scan for), and no ring holds a slot id
 *    of another partition (an entry whose slot was taken meanwhile is stale:
 *    a reserve drops it);
 *  - every slot's state byte is one of FREE, RESERVED, PUBLISHED, EVICTING,
 *    RETIRED (so free + reserved + published + evicting + retired == total),
 *    FREE and PUBLISHED carry no owner, and RESERVED/EVICTING/RETIRED name an
 *    owner whose registry slot is claimed (a live process, or a dead one that
 *    umbp_pool_reap() will repair) — or, for RETIRED, a released slot that
 *    left them as orphans for its next claimant;
 *  - pin bytes belong only to claimed registry slots;
 *  - each namespace's used_slots equals its slots flagged counted (PUBLISHED,
 *    and EVICTING or RESERVED ones inside a removal or publish);
 *  - the free rings' and the event ring's headers are intact (a free ring
 *    that cannot be read is that one violation: its slots are not also
 *    reported lost);
 *  - the pool header still describes the segment: a partition count in
 *    1..UMBP_MAX_PARTITIONS, and regions inside the mapping that hold the
 *    slots and buckets it counts (processes use the copy they validated at
 *    attach; if the regions do not fit, that is the one violation reported
 *    and nothing else is read).
 *
 * A busy pool is never frozen: a slot is judged only when its state word
 * (whose generation bumps on every transition) is the same before and after
 * the scan, slots that a live thread is moving (its ledger names them) are
 * skipped, and the namespace counts allow one in-flight update per registered
 * thread of a claimed registry slot. On a quiescent pool the check is exact.
 */
#ifndef UMBP_CHECK_H
#define UMBP_CHECK_H

#include <stdbool.h>
#include <stdint.h>

#include "umbp/pool.h"

#ifdef __cplusplus
extern "C" {
#endif

#define UMBP_CHECK_MAX_LISTED 64 /* violations kept as sentences; more are only counted */
#define UMBP_CHECK_MSG_MAX 200

typedef struct umbp_check_report {
  uint64_t n_violations;          /* all violations found */
  unsigned n_listed;              /* sentences in violation[] (<= UMBP_CHECK_MAX_LISTED) */
  char violation[UMBP_CHECK_MAX_LISTED][UMBP_CHECK_MSG_MAX];
  /* what was looked at */
  uint64_t slots, slots_in_flux;  /* slots judged / skipped because they moved during the scan */
  uint64_t ways;                  /* non-empty ways seen */
  uint64_t ring_entries;          /* slot ids found on the free rings */
  uint32_t procs_live, procs_dead;/* claimed registry slots by liveness */
  uint64_t dead_leftovers;        /* slots/pins held by dead, not yet reaped processes */
} umbp_check_report;

/* Check every invariant listed above. Returns 0 and fills *ret (whether or not
 * violations were found: see ret->n_violations), -EINVAL for NULL arguments,
 * -ENOMEM. Writes nothing into the segment. Any thread, any handle (read-only
 * too), concurrently with every other call. The report is large (~13 KiB):
 * keep it off small stacks. */
UMBP_API int umbp_pool_check(umbp_pool *pool, umbp_check_report *ret);

#ifdef __cplusplus
}
#endif
#endif
