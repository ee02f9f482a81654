/* SPDX-License-Identifier: Apache-2.0 */
#include "common/common.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <stdlib.h>
#include <time.h>

#include "umbp_config.h"

static _Thread_local char last_error[512];

static umbp_log_fn log_fn;
static void *log_arg;
static int log_max = UMBP_LOG_INFO;

UMBP_API const char *umbp_version(void) { return UMBP_VERSION; }

UMBP_API const char *umbp_last_error(void) { return last_error; }

int umbp_fail(int code, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(last_error, sizeof last_error, fmt, ap);
  va_end(ap);
  return code;
}

UMBP_API void umbp_log_set(umbp_log_fn fn, void *arg, int max_level) {
  log_fn = fn;
  log_arg = arg;
  log_max = max_level;
}

void umbp_log(int level, const char *fmt, ...) {
  if (!log_fn || level > log_max) return;
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  log_fn(log_arg, level, buf);
}

UMBP_API const char *umbp_strerror(int code) {
  switch (-code) {
  case 0: return "success";
  case EINVAL: return "invalid argument";
  case EEXIST: return "already exists";
  case ENOENT: return "no such pool or entry";
  case ENOSPC: return "no space left in the pool (or on the shared-memory file system)";
  case ENOMEM: return "out of memory";
  case ETIMEDOUT: return "timed out";
  case EACCES: return "permission denied";
  case EPERM: return "operation not permitted";
  case EPROTO: return "incompatible pool layout";
  case EBADMSG: return "corrupted pool segment";
  case EBUSY: return "resource busy";
  case EAGAIN: return "try again";
  case ENAMETOOLONG: return "name too long";
  case EUSERS: return "too many processes attached to the pool";
  case ECANCELED: return "operation cancelled";
  case EOVERFLOW: return "value too large";
  case ERANGE: return "value out of range";
  case ENODEV: return "no such device";
  case ENOSYS: return "not supported by this build or kernel";
  case EROFS: return "pool attached read-only";
  case ECHILD: return "pool handle inherited through fork(): attach in this process";
  case EIO: return "I/O error";
  case EOWNERDEAD: return "the pool's creator died before finishing it";
  default: return strerror(-code);
  }
}

uint64_t umbp_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

uint64_t umbp_realtime_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

uint64_t umbp_proc_start_time(int pid) {
  char path[64], buf[1024];
  snprintf(path, sizeof path, "/proc/%d/stat", pid);
  FILE *f = fopen(path, "re");
  if (!f) return 0;
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = 0;
  /* comm may contain spaces and parentheses: skip to the last ')' */
  char *p = strrchr(buf, ')');
  if (!p) return 0;
  p += 2; /* now at field 3 (state) */
  for (int field = 3; field < 22 && p; field++) {
    p = strchr(p, ' ');
    if (p) p++;
  }
  return p ? strtoull(p, NULL, 10) : 0;
}

char umbp_proc_state(int pid) {
  char path[64], line[512];
  if (pid <= 0) return 0;
  snprintf(path, sizeof path, "/proc/%d/stat", pid);
  FILE *f = fopen(path, "re");
  if (!f) return 0;
  char st = 0;
  if (fgets(line, sizeof line, f)) {
    const char *rp = strrchr(line, ')'); /* comm may hold ')' */
    if (rp && rp[1] == ' ') st = rp[2];
  }
  fclose(f);
  return st;
}

bool umbp_proc_stopped(int pid) {
  char st = umbp_proc_state(pid);
  return st == 'T' || st == 't';
}

uint64_t umbp_fnv1a(const void *p, size_t n, uint64_t seed) {
  const unsigned char *s = p;
  uint64_t h = 0xcbf29ce484222325ull ^ seed;
  for (size_t i = 0; i < n; i++) {
    h ^= s[i];
    h *= 0x100000001b3ull;
  }
  return h;
}

