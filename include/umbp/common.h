/* SPDX-License-Identifier: Apache-2.0 */
/*
 * common.h — conventions shared by every umbp module; every other public
 * header includes it. To use the whole library, include umbp/umbp.h.
 *
 * Errors: every fallible call returns 0 (or a non-negative count where its
 * comment says so) or a negative errno. Outputs go through trailing ret_
 * pointers that are written only on success. The library never prints
 * (except one line on stderr just before a SIGBUS in a pool's mapping kills
 * the process: umbp_admin_pool_sigbus_quiet() in admin.h) and never sets
 * errno for its callers. Two things turn a code into words:
 *
 *   umbp_strerror(code)   a fixed sentence for the code;
 *   umbp_last_error()     the detailed message of the last failure of *this
 *                         thread* ("layout major 2 != this build's 1 ..."),
 *                         naming the cause and the fix.
 *
 * Logging: the library reports non-fatal conditions (mbind refused, a dead
 * process reaped) through a process-wide callback set with umbp_log_set();
 * with no callback such reports are dropped.
 */
#ifndef UMBP_COMMON_H
#define UMBP_COMMON_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(UMBP_BUILDING_LIB)
#define UMBP_API __attribute__((visibility("default")))
#else
#define UMBP_API
#endif

/* Library version string, e.g. "0.1.0". Any thread. */
UMBP_API const char *umbp_version(void);

/* sizeof the public struct named `name` ("umbp_key", "umbp_pool_params",
 * ... as spelled in these headers), or 0 for a name it does not know. For
 * bindings that mirror the structs by hand: python/umbp/_lib.py compares
 * every structure it declares at load. Any thread. */
UMBP_API size_t umbp_abi_struct_size(const char *name);

/* A fixed sentence for a negative errno code (or 0). Never NULL. Any thread. */
UMBP_API const char *umbp_strerror(int code);

/* The message of the last failed call made by the calling thread, or "" when
 * none failed yet: it names the cause and the fix. Every failing call sets it
 * except a lookup miss (-ENOENT from umbp_lookup_pin), which is an answer;
 * successful calls leave it as it was. The buffer is thread-local and valid
 * until the thread's next failing umbp call. */
UMBP_API const char *umbp_last_error(void);

enum umbp_log_level { UMBP_LOG_ERROR = 0, UMBP_LOG_WARN = 1, UMBP_LOG_INFO = 2, UMBP_LOG_DEBUG = 3 };

typedef void (*umbp_log_fn)(void *arg, int level, const char *msg);

/* Install the process-wide log callback (NULL: drop reports). It may be
 * called from any thread that calls into umbp, including library threads,
 * and must not call back into umbp. Not safe to change while other threads
 * are inside umbp calls. */
UMBP_API void umbp_log_set(umbp_log_fn fn, void *arg, int max_level);

/* Progress of long operations (pre-faulting, registration): done of total
 * units; what names the phase. Called from the thread that runs the
 * operation or from its helper threads, serialised by the library. */
typedef void (*umbp_progress_fn)(void *arg, const char *what, uint64_t done, uint64_t total);

#ifdef __cplusplus
}
#endif
#endif
