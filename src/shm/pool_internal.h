/* SPDX-License-Identifier: Apache-2.0 */
/* The process-local pool handle (never in shared memory). */
#ifndef UMBP_POOL_INTERNAL_H
#define UMBP_POOL_INTERNAL_H

#include <limits.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "shm/layout.h"
#include "umbp/pool.h"

/* The block index's per-process state (src/index). The segment layer never
 * dereferences it: the index's attach hook (module.h) sets it and its detach
 * hook clears it. A field of its own rather than a slot of a per-module
 * array, because every index call loads it first (index_inline.h). */
struct umbp_index;

struct umbp_pool {
  int fd;
  void *base;              /* this process's mapping */
  size_t size;
  bool read_only;
  bool created;            /* this handle created the pool (umbp_admin_daemon_lock(): run generation) */
  bool hugepages;
  uint64_t index_huge_bytes; /* umbp-index.NAME mapped over the bucket array and slot metadata; 0: none */
  char index_path[256];      /* that file, and its identity when mapped (the SIGBUS message: sigbus.c) */
  dev_t index_dev;
  ino_t index_ino;
  int proc_slot;           /* registry slot, -1 if read-only */
  uint16_t owner_id;       /* proc_slot + 1: the id this process writes into shared words */
  char name[UMBP_NAME_MAX + 1];
  char path[256];
  struct umbp_shm_header *hdr;
  struct umbp_proc_slot *procs;
  struct umbp_index *index;/* the index's state in this process (read-write handles; see above) */
  /* fork(): set in a child's copy of the handle by the index's atfork child
   * handler (umbp_pool_fork_child()); every call on it then fails with
   * -ECHILD. attach_pid is the process that attached, for that message. */
  bool forked;
  int attach_pid;
  struct umbp_index *forked_index; /* the parent's index state, freed by the child's detach */
  struct umbp_pool *live_next;     /* this process's attached handles (segment.c, umbp_pool_detach()) */
  uint64_t attach_serial;          /* unique per attach in this process (umbp_pool_attached()) */
  _Atomic bool reaping[UMBP_MAX_PROCS]; /* registry slots a thread of this handle is reaping now: the claim
                                          * between its threads, taken by compare-and-swap (registry.c) */
};

/* Checked offset-to-pointer: NULL when [off, off+len) is not inside the mapping. */
static inline void *umbp_pool_at(const umbp_pool *p, uint64_t off, uint64_t len) {
  if (off > p->size || len > p->size - off) return NULL;
  return (char *)p->base + off;
}

static inline void *umbp_pool_region(const umbp_pool *p, int region) {
  return (char *)p->base + p->hdr->regions[region].offset;
}

/* Is registry slot `slot` owned by a live process? Uses the OFD lock. */
bool umbp_registry_alive(const umbp_pool *p, unsigned slot);

/* Reap registry slot `slot` if its owner is dead and nobody else is reaping
 * it: 1 reaped, 0 not (alive, being reaped, free, or held by this handle). */
int umbp_registry_reap_slot(umbp_pool *p, unsigned slot);

/* Whether p is still an attached handle of this process and the same attach
 * whose attach_serial was `serial` (a handle freed by umbp_pool_detach() and
 * a new one malloc'd at its address differ in serial). For objects that
 * outlive their pool handle (a data-path job holding reserved slots): a
 * detach already gave back what they hold. */
bool umbp_pool_attached(const umbp_pool *p, uint64_t serial);

/* fork(): in the child, make the inherited handle p unusable and stop it
 * from keeping the parent's registry, daemon and creation lock bytes held
 * (segment.c). Runs in the atfork child handler: system calls only. */
void umbp_pool_fork_child(umbp_pool *p);
/* The error of a call on a handle inherited through fork(): -ECHILD, with a
 * message telling the child to attach on its own. */
int umbp_pool_forked_fail(const umbp_pool *p);
/* Compute the layout of a pool with these parameters into *h (regions,
 * partitions, totals). Exposed for tests and the fuzzer. */
int umbp_layout_compute(const umbp_pool_params *params, const int *nodes, unsigned n_nodes,
                        struct umbp_shm_header *h);
/* Validate a header against the size of the file it came from; 0, -EPROTO or
 * -EBADMSG with a message. Never reads outside [hdr, hdr + UMBP_HEADER_BYTES). */
int umbp_header_validate(const struct umbp_shm_header *h, uint64_t file_size);
/* The pool's ABI fingerprint (layout.h): the segment layer's struct sizes
 * and constants folded with every module's abi_part() (module.h). */
uint64_t umbp_abi_fingerprint(void);
/* The fingerprint with module m's part given instead of m->abi_part() (tests:
 * a build whose index hashed keys or placed them differently would give
 * another part, and so another fingerprint). umbp_abi_fingerprint() ==
 * umbp_abi_fingerprint_with(m, m->abi_part()) for every module m. */
struct umbp_shm_module;
uint64_t umbp_abi_fingerprint_with(const struct umbp_shm_module *m, uint64_t part);
/* The first hugetlbfs mount in /proc/mounts into out: 0, or -ENOENT. */
int umbp_hugetlbfs_mount(char *out, size_t n);
uint64_t umbp_header_checksum(const struct umbp_shm_header *h);

#endif
