/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The daemon's /metrics endpoint: the Prometheus text of a read-only
 * snapshot (snapshot.h), served by libmicrohttpd from one thread of its own.
 *
 * The server attaches to the pool a second time, read-only (PROT_READ, no
 * registry slot), so a scrape only loads from the segment: it never takes a
 * lock, a pin or a reader slot, and cannot perturb the pool however often it
 * comes. Scrapes are served one at a time (MHD's single internal thread).
 *
 * Every connection is bounded: at most 8 from one address, closed after 10 s
 * without a byte, and when a 65th comes the oldest open one is shut down to
 * make room, so clients that trickle their requests (never idle) cannot hold
 * every slot and lock a scraper out (metrics_http.c, on_accept).
 */
#ifndef UMBP_TOOLS_METRICS_HTTP_H
#define UMBP_TOOLS_METRICS_HTTP_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/socket.h>

/* True when this umbp was built with libmicrohttpd. */
bool metrics_http_available(void);

/* Parse "ADDRESS:PORT" (a numeric IPv4 address or [IPv6], port 1-65535) into
 * *ss and *len. 0, or -EINVAL with the reason (and the fix) in why. */
int metrics_parse_addr(const char *arg, struct sockaddr_storage *ss, socklen_t *len, char *why, size_t n);

/* A listening TCP socket on the address (SO_REUSEADDR, close-on-exec): the fd,
 * or -errno (EADDRINUSE: the port is taken; EADDRNOTAVAIL: no interface has
 * the address; EACCES: a port below 1024 without the privilege). */
int metrics_listen(const struct sockaddr_storage *ss, socklen_t len);

struct metrics_server;
/* Serve GET /metrics on listening socket fd (owned by the server from then
 * on, closed on failure too) for pool `pool`, attached read-only here.
 * 0 and *ret, or -errno with the reason in why. Call from the thread whose
 * signal mask the server thread should inherit. */
int metrics_serve(int fd, const char *pool, struct metrics_server **ret, char *why, size_t n);
/* Stop serving, close the socket and detach. NULL is a no-op. */
void metrics_stop(struct metrics_server *srv);

#endif
