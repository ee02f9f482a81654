/* SPDX-License-Identifier: Apache-2.0 */
/* Internal helpers shared by all modules: error detail, logging, small utils. */
#ifndef UMBP_INTERNAL_COMMON_H
#define UMBP_INTERNAL_COMMON_H

#include <errno.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "umbp/common.h"

#define UMBP_CACHELINE 64
#define UMBP_ALIGNED __attribute__((aligned(UMBP_CACHELINE)))
#define UMBP_LIKELY(x) __builtin_expect(!!(x), 1)
#define UMBP_UNLIKELY(x) __builtin_expect(!!(x), 0)
#define UMBP_ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))

/* Record a detailed message for umbp_last_error() and return code (< 0). */
int umbp_fail(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Report through the log callback, if any. */
void umbp_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

uint64_t umbp_now_ns(void);      /* CLOCK_MONOTONIC */
uint64_t umbp_realtime_ns(void); /* CLOCK_REALTIME */
/* Process start time in clock ticks since boot (field 22 of /proc/PID/stat), 0 if unknown. */
uint64_t umbp_proc_start_time(int pid);
/* The state letter of process pid from /proc/PID/stat (R, S, D, T, t, Z,
 * ...), 0 when it is gone or cannot be seen (another PID namespace). */
char umbp_proc_state(int pid);
/* true when process pid is stopped (state T or t in /proc/PID/stat: SIGSTOP,
 * a debugger); false when it runs, is gone or cannot be seen. For messages:
 * a stopped process acts on no signal but SIGCONT and SIGKILL. */
bool umbp_proc_stopped(int pid);

/* 64-bit FNV-1a, used for header checksums and fingerprints (not for keys). */
uint64_t umbp_fnv1a(const void *p, size_t n, uint64_t seed);

static inline void umbp_cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield" ::: "memory");
#endif
}


#endif
