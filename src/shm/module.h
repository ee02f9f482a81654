/* SPDX-License-Identifier: Apache-2.0 */
/*
 * module.h — how a module above the segment layer keeps state in a pool
 * (internal).
 *
 * Design note. The segment layer (src/shm) owns the header, the region table,
 * the partitions and their free rings' placement, and the process registry;
 * it does not know what the other regions mean. A module that keeps state in
 * the segment (today the block index, src/index) describes itself to the
 * segment layer with one struct umbp_shm_module:
 *  - its part of the layout: which ids of the region table it owns, how many
 *    bytes each needs for a pool's parameters, and the header fields it
 *    chooses (layout(), checked again at attach by validate());
 *  - its part of the ABI fingerprint (abi_part()): the sizes of its shared
 *    structs, its constants, and the results on fixed inputs of functions that
 *    every process sharing a pool must compute alike;
 *  - hooks at the points of a pool's life where it must act: init (the
 *    creator, before the magic is stored), attach and detach (every
 *    read-write handle, the creator's too), reap (a dead process's registry
 *    slot, its lock held), forget (a fork() child's copy of a handle), info
 *    (its figures in umbp_pool_get_info()).
 * The segment layer calls these through the table and never by name, and it
 * includes no header of a module above it: dependencies run one way.
 *
 * The list (umbp_shm_modules[]) is fixed when the library is linked, in
 * src/modules.c, the one file that names every module. Not registered at
 * run time by constructors: a static library pulls in only the objects a
 * program references, so a program that never named the index would lay out
 * pools without its regions, and another process would refuse them.
 * Hooks run in the list's order; detach runs in reverse. Nothing in the
 * segment names a module or holds a function pointer (STYLE 6): the table
 * lives in each process's own memory.
 *
 * Every region id below UMBP_REG_ARENA other than UMBP_REG_REGISTRY and
 * UMBP_REG_FREERINGS (the segment layer's own) is owned by exactly one module
 * (tests/shm/test_segment.c checks it).
 */
#ifndef UMBP_SHM_MODULE_H
#define UMBP_SHM_MODULE_H

#include <stdint.h>

#include "shm/layout.h"
#include "umbp/pool.h"

struct umbp_shm_module {
  const char *name;
  /* Bit r set: region id r (enum umbp_region_id) is this module's. */
  uint32_t regions;
  /* The least size in bytes of region r (one of this module's) in the pool
   * that header h describes, once layout() has filled the module's fields:
   * the segment layer lays the region out that large and refuses a header
   * whose region is smaller. Pure; any thread. */
  uint64_t (*region_bytes)(const struct umbp_shm_header *h, int region);
  /* Choose this module's header fields for a pool being laid out (h holds
   * the slot size, slot count and partitions). 0, or a negative errno with
   * a message. NULL: none. */
  int (*layout)(const umbp_pool_params *params, struct umbp_shm_header *h);
  /* Check this module's header fields of a segment being attached, before
   * any region is read: 0, or -EBADMSG with a message (the index: -ENOTSUP
   * for a CPU it cannot hash keys on). Loads of h only.
   * NULL: nothing to check. */
  int (*validate)(const struct umbp_shm_header *h);
  /* This module's part of the ABI fingerprint (layout.h). Pure. */
  uint64_t (*abi_part)(void);
  /* The creator, before the magic is stored: initialise the regions. 0 or a
   * negative errno with a message (the pool is then removed). */
  int (*init)(umbp_pool *p);
  /* A read-write handle was made (created or attached) and holds its
   * registry slot: set up this process's state. 0 or a negative errno with a
   * message (the handle is then given up, after the detach hooks of the
   * modules attached before this one). */
  int (*attach)(umbp_pool *p);
  /* umbp_pool_detach() of a read-write handle, before its registry slot is
   * released (its lock is held): release everything this process holds. */
  void (*detach)(umbp_pool *p);
  /* Registry slot `slot` belongs to a dead process and the caller holds its
   * lock: release what that process held. */
  void (*reap)(umbp_pool *p, unsigned slot);
  /* umbp_pool_detach() of a handle that a fork() child inherited: free this
   * module's process-local state of the parent's without writing the segment. */
  void (*forget)(umbp_pool *p);
  /* Fill this module's fields of *info (umbp_pool_get_info()); loads only,
   * read-only handles too. */
  void (*info)(umbp_pool *p, umbp_pool_info *info);
};

/* The modules of this build, in hook order (src/modules.c). */
extern const struct umbp_shm_module *const umbp_shm_modules[];
extern const unsigned umbp_shm_n_modules;

/* The module that owns region id r, or NULL (the segment layer's own). */
const struct umbp_shm_module *umbp_shm_region_owner(int region);

#endif
