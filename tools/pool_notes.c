/* SPDX-License-Identifier: Apache-2.0 */
/* A pool's notes (pool_notes.h): the reader of python/umbp/pool_notes.py's format. */
#include "pool_notes.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define NOTES_LOCK_POLL_MS 20

const char *notes_path(const char *pool, char *buf, size_t n) {
  snprintf(buf, n, "%s/%s%s", NOTES_DIR, NOTES_PREFIX, pool);
  return buf;
}

/* Split line (no newline) at tabs into at most max fields; returns the count. */
static int split(char *line, char **f, int max) {
  int k = 0;
  f[k++] = line;
  for (char *p = line; *p && k < max; p++)
    if (*p == '\t') {
      *p = 0;
      f[k++] = p + 1;
    }
  return k;
}

static void put_proc(struct pool_notes *n, int pid, const char *instance, const char *ns) {
  struct notes_proc *p = NULL;
  for (unsigned i = 0; i < n->nprocs && !p; i++)
    if (n->procs[i].pid == pid) p = &n->procs[i];
  if (!p) {
    if (n->nprocs == NOTES_MAX_PROCS) { /* keep the newest: drop the oldest record */
      memmove(&n->procs[0], &n->procs[1], sizeof n->procs[0] * (NOTES_MAX_PROCS - 1));
      n->nprocs--;
    }
    p = &n->procs[n->nprocs++];
  }
  p->pid = pid;
  snprintf(p->instance, sizeof p->instance, "%s", instance);
  snprintf(p->ns, sizeof p->ns, "%s", ns);
}

static void put_label(struct pool_notes *n, const char *ns, const char *label) {
  struct notes_label *l = NULL;
  for (unsigned i = 0; i < n->nlabels && !l; i++)
    if (!strcmp(n->labels[i].ns, ns)) l = &n->labels[i];
  if (!l) {
    if (n->nlabels == NOTES_MAX_LABELS) return;
    l = &n->labels[n->nlabels++];
    snprintf(l->ns, sizeof l->ns, "%s", ns);
  }
  snprintf(l->label, sizeof l->label, "%s", label);
}

void notes_read(const char *pool, const uint8_t uuid[16], struct pool_notes *out) {
  memset(out, 0, sizeof *out);
  char path[256];
  /* only a regular file is notes: O_NONBLOCK so that a FIFO of that name
   * cannot block the open, O_NOFOLLOW as every pool file */
  int fd = open(notes_path(pool, path, sizeof path), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOFOLLOW);
  struct stat st;
  if (fd < 0) return;
  FILE *f = fstat(fd, &st) == 0 && S_ISREG(st.st_mode) ? fdopen(fd, "r") : NULL;
  if (!f) {
    close(fd);
    return;
  }
  char line[1024];
  bool first = true;
  while (fgets(line, sizeof line, f)) {
    size_t len = strlen(line);
    if (!len || line[len - 1] != '\n') {
      /* a line longer than the buffer, or one a writer has not finished: skip it */
      while (len && line[len - 1] != '\n' && fgets(line, sizeof line, f)) len = strlen(line);
      first = false;
      continue;
    }
    line[len - 1] = 0;
    char *fld[6];
    int k = split(line, fld, 6);
    if (first) {
      first = false;
      if (k < 3 || strcmp(fld[0], "umbp-notes")) break;
      if (uuid) {
        char hex[33];
        for (int i = 0; i < 16; i++) snprintf(hex + 2 * i, 3, "%02x", uuid[i]);
        if (strcmp(fld[2], hex)) break; /* an earlier pool's notes */
      }
      out->valid = true;
      continue;
    }
    if (!out->valid) break;
    if (!strcmp(fld[0], "embedded") && k >= 5) {
      out->embedded = true;
      snprintf(out->instance, sizeof out->instance, "%s", fld[1]);
      snprintf(out->ns, sizeof out->ns, "%s", fld[2]);
      out->capacity = strtoull(fld[3], NULL, 10);
      out->creator_pid = atoi(fld[4]);
    } else if (!strcmp(fld[0], "proc") && k >= 4) {
      put_proc(out, atoi(fld[2]), fld[1], fld[3]);
    } else if (!strcmp(fld[0], "label") && k >= 3) {
      put_label(out, fld[1], fld[2]);
    }
  }
  fclose(f);
}

const char *notes_label(const struct pool_notes *n, const char *ns) {
  for (unsigned i = 0; n->valid && i < n->nlabels; i++)
    if (!strcmp(n->labels[i].ns, ns)) return n->labels[i].label;
  return NULL;
}

const char *notes_proc_instance(const struct pool_notes *n, int pid) {
  for (unsigned i = 0; n->valid && i < n->nprocs; i++)
    if (n->procs[i].pid == pid) return n->procs[i].instance;
  return NULL;
}

int notes_lock(const char *pool, unsigned wait_ms) {
  char path[256];
  notes_path(pool, path, sizeof path);
  struct timespec t0, now;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (;;) {
    int fd = open(path, O_RDWR | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) return -errno;
    while (flock(fd, LOCK_EX | LOCK_NB) != 0) {
      int e = errno;
      clock_gettime(CLOCK_MONOTONIC, &now);
      long ms = (now.tv_sec - t0.tv_sec) * 1000 + (now.tv_nsec - t0.tv_nsec) / 1000000;
      if (e != EWOULDBLOCK || ms >= (long)wait_ms) {
        close(fd);
        return e == EWOULDBLOCK ? -EWOULDBLOCK : -e;
      }
      usleep(NOTES_LOCK_POLL_MS * 1000);
    }
    /* removed (and perhaps made again) while this process waited: lock the one at the path */
    struct stat a, b;
    if (fstat(fd, &a) == 0 && stat(path, &b) == 0 && a.st_ino == b.st_ino && a.st_dev == b.st_dev) return fd;
    close(fd);
  }
}

void notes_unlock(int fd) {
  if (fd >= 0) close(fd); /* drops the flock */
}

int notes_remove(const char *pool) {
  char path[256];
  return unlink(notes_path(pool, path, sizeof path)) == 0 ? 0 : -errno;
}
