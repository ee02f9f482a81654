/* SPDX-License-Identifier: Apache-2.0 */
/*
 * libFuzzer target over segment attach and validation.
 *
 * Input format (so that mutations reach past the header page):
 *   bytes [0, 4096)   the header page (zero-padded when the input is shorter);
 *   byte  4096        flags: bit 0 = recompute the header checksum after the
 *                     mutation (so the fuzzer gets past the checksum into the
 *                     region and partition checks), bit 1 = file size is
 *                     total_size + 4096 (a resized segment);
 *   then patches      { u32 offset (LE, taken modulo the file size), u8 len,
 *                       len bytes } written over the otherwise zero file.
 * The file is /dev/shm/umbp.fz-PID, sized by the header's total_size when that
 * is between 4 KiB and 64 MiB (else 8 KiB). Each input goes to
 * umbp_header_validate() directly, then is attached read-only and read-write;
 * whatever attaches is walked by get_info, census, index_stats, list_procs,
 * umbp_pool_check, the daemon query and (read-write) reap.
 * Seeds: fuzz/gen_seeds (run by fuzz/build.sh) writes real pools in this form.
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "umbp/admin.h"
#include "shm/pool_internal.h"
#include "umbp/check.h"
#include "umbp/index.h"
#include "umbp/pool.h"

#define MAX_FILE (64u << 20)

static char name[64], path[128];
static umbp_check_report report;

static void walk(umbp_pool *p, bool rw) {
  umbp_pool_info info;
  umbp_pool_get_info(p, &info);
  umbp_slot_census c;
  umbp_census(p, &c);
  uint64_t entries, hist[16];
  umbp_index_stats(p, &entries, hist, 16);
  umbp_proc_info procs[UMBP_MAX_PROCS];
  umbp_pool_list_procs(p, procs, UMBP_MAX_PROCS);
  umbp_pool_check(p, &report);
  int pid;
  umbp_admin_daemon_query(p, &pid, NULL);
  umbp_counters ct;
  umbp_counters_ns(p, UINT32_MAX, &ct);
  if (rw) umbp_pool_reap(p);
}

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  snprintf(name, sizeof name, "fz-%d", (int)getpid());
  snprintf(path, sizeof path, "/dev/shm/umbp.%s", name);
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static _Alignas(64) unsigned char page[UMBP_HEADER_BYTES];
  memset(page, 0, sizeof page);
  memcpy(page, data, size < sizeof page ? size : sizeof page);
  struct umbp_shm_header *h = (struct umbp_shm_header *)page;
  uint8_t flags = size > UMBP_HEADER_BYTES ? data[UMBP_HEADER_BYTES] : 0;
  if (flags & 1) h->header_checksum = umbp_header_checksum(h);
  uint64_t fsize = h->total_size >= UMBP_HEADER_BYTES && h->total_size <= MAX_FILE ? h->total_size : 8192;
  if (flags & 2) fsize += 4096;

  /* the validator on its own, against the declared and the input's sizes */
  umbp_header_validate(h, fsize);
  umbp_header_validate(h, size);

  int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
  if (fd < 0) abort();
  if (ftruncate(fd, (off_t)fsize) != 0) abort();
  if (pwrite(fd, page, sizeof page, 0) != (ssize_t)sizeof page) abort();
  for (size_t i = UMBP_HEADER_BYTES + 1; i + 5 <= size;) {
    uint32_t off;
    memcpy(&off, data + i, 4);
    size_t len = data[i + 4];
    i += 5;
    if (len > size - i) len = size - i;
    off %= (uint32_t)fsize;
    if (len > fsize - off) len = fsize - off;
    if (len && pwrite(fd, data + i, len, off) != (ssize_t)len) abort();
    i += len;
  }
  close(fd);

  umbp_attach_opts o;
  umbp_attach_opts_init(&o);
  o.timeout_ms = 1;
  o.read_only = true;
  umbp_pool *p;
  if (umbp_pool_attach(name, &o, &p) == 0) {
    walk(p, false);
    umbp_pool_detach(p);
  }
  o.read_only = false;
  if (umbp_pool_attach(name, &o, &p) == 0) {
    walk(p, true);
    umbp_pool_detach(p);
  }
  unlink(path);
  return 0;
}
