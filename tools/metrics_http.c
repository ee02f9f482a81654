/* SPDX-License-Identifier: Apache-2.0 */
/* The daemon's /metrics endpoint (see metrics_http.h). */
#include "metrics_http.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli_config.h" /* UMBP_HAVE_MICROHTTPD */
#include "pool_fault.h"
#include "snapshot.h"

int metrics_parse_addr(const char *arg, struct sockaddr_storage *ss, socklen_t *len, char *why, size_t n) {
  /* "[::1]" has colons of its own: the port's colon is the one after ']' */
  const char *rb = arg[0] == '[' ? strchr(arg, ']') : NULL;
  if (arg[0] == '[' && !rb) {
    snprintf(why, n, "'%s' is not a numeric address: an IPv6 one needs its closing ']', e.g. [::1]:9478", arg);
    return -EINVAL;
  }
  const char *colon = rb ? (rb[1] == ':' ? rb + 1 : NULL) : strrchr(arg, ':');
  if (!colon) {
    snprintf(why, n, "give ADDRESS:PORT, e.g. 127.0.0.1:9478 or [::1]:9478 (no port in '%s')", arg);
    return -EINVAL;
  }
  char *end;
  errno = 0;
  unsigned long port = strtoul(colon + 1, &end, 10);
  /* digits only: strtoul() also takes leading blanks and a sign */
  if (colon[1] >= '0' && colon[1] <= '9' && !*end && !errno && port == 0) {
    /* bind() would pick a free port, which nobody could find to scrape */
    snprintf(why, n, "port 0 (any free port) would leave Prometheus nothing to scrape: give a fixed port, 1 to "
                     "65535, e.g. 127.0.0.1:9478");
    return -EINVAL;
  }
  if (colon[1] < '0' || colon[1] > '9' || *end || errno || port < 1 || port > 65535) {
    snprintf(why, n, "'%s' is not a port: use 1 to 65535, e.g. 127.0.0.1:9478", colon + 1);
    return -EINVAL;
  }
  char host[64];
  size_t hl = (size_t)(colon - arg);
  bool v6 = hl >= 2 && arg[0] == '[' && arg[hl - 1] == ']';
  if (v6) {
    arg++;
    hl -= 2;
  }
  if (hl == 0) {
    snprintf(why, n, "no address before the port: use e.g. 127.0.0.1:9478 (loopback only) or 0.0.0.0:9478 (every "
                     "interface)");
    return -EINVAL;
  }
  if (hl >= sizeof host) { /* longer than any numeric address */
    snprintf(why, n, "'%.*s...' is not a numeric address: use e.g. 127.0.0.1, 0.0.0.0 or [::1]; host names are not "
                     "resolved", 20, arg);
    return -EINVAL;
  }
  memcpy(host, arg, hl);
  host[hl] = 0;
  memset(ss, 0, sizeof *ss);
  if (!v6) {
    struct sockaddr_in *a = (struct sockaddr_in *)ss;
    if (inet_pton(AF_INET, host, &a->sin_addr) != 1) {
      snprintf(why, n, "'%s' is not a numeric IPv4 address (or an IPv6 one in brackets, [::1]:9478); host names are "
                       "not resolved", host);
      return -EINVAL;
    }
    /* bind() and listen() take these, and the daemon then served nothing,
     * with no message: no TCP connection can reach a group or broadcast address */
    uint32_t h = ntohl(a->sin_addr.s_addr);
    if ((h >> 28) == 0xe || h == 0xffffffffu) {
      snprintf(why, n, "'%s' is a %s address, which no TCP connection can reach: use 127.0.0.1 (this host only), "
                       "0.0.0.0 (every interface) or an address of one of this host's interfaces",
               host, h == 0xffffffffu ? "broadcast" : "multicast");
      return -EINVAL;
    }
    a->sin_family = AF_INET;
    a->sin_port = htons((uint16_t)port);
    *len = sizeof *a;
  } else {
    struct sockaddr_in6 *a = (struct sockaddr_in6 *)ss;
    if (inet_pton(AF_INET6, host, &a->sin6_addr) != 1) {
      snprintf(why, n, "'[%s]' is not a numeric IPv6 address", host);
      return -EINVAL;
    }
    if (IN6_IS_ADDR_MULTICAST(&a->sin6_addr)) { /* served nothing, as above */
      snprintf(why, n, "'[%s]' is a multicast address, which no TCP connection can reach: use [::1] (this host "
                       "only), [::] (every interface) or an address of one of this host's interfaces", host);
      return -EINVAL;
    }
    /* bind() needs the interface of a link-local address (fe80::1%eth0),
     * and failed with a bare "Invalid argument" */
    if (IN6_IS_ADDR_LINKLOCAL(&a->sin6_addr)) {
      snprintf(why, n, "'[%s]' is link-local, which needs an interface that --metrics does not take: use [::1] "
                       "(this host only), [::] (every interface) or a global address of this host", host);
      return -EINVAL;
    }
    a->sin6_family = AF_INET6;
    a->sin6_port = htons((uint16_t)port);
    *len = sizeof *a;
  }
  return 0;
}

int metrics_listen(const struct sockaddr_storage *ss, socklen_t len) {
  int fd = socket(ss->ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -errno;
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (bind(fd, (const struct sockaddr *)ss, len) != 0 || listen(fd, 16) != 0) {
    int e = errno;
    close(fd);
    return -e;
  }
  return fd;
}

#if UMBP_HAVE_MICROHTTPD
#include <microhttpd.h>

/* Connections at once. A client that trickles its request a byte at a time
 * is never idle, so MHD's inactivity timeout does not end it: 64 such
 * connections from 8 addresses (8 each, MHD's per-address limit) held every
 * slot for as long as they trickled, and every scraper was reset at connect,
 * without bound. MHD checks its own limit before asking on_accept(), so its
 * limit is set above this one (MHD_HEADROOM): a connection that comes when
 * METRICS_MAX_CONN are open is let in and the oldest one is shut down to make
 * room. A scrape is answered within milliseconds of its connect, so the
 * oldest connection is one that sends nothing or trickles; a scraper always
 * gets in. */
enum { METRICS_MAX_CONN = 64, MHD_HEADROOM = 16 };

/* One open connection, oldest first. Only the MHD thread touches the list
 * (on_accept, on_connection and on_request all run on it; MHD_stop_daemon
 * joins it before metrics_stop frees what is left). */
struct mconn {
  struct mconn *prev, *next;
  int fd;       /* MHD's socket: shut down (never closed) here to evict */
  bool evicted; /* shut down, waiting for MHD to close it */
};

struct metrics_server {
  struct MHD_Daemon *mhd;
  umbp_pool *pool;
  struct snap *snap;
  uint64_t drained_served; /* the highest umbp_events_drained_total served (scrapes are one at a time) */
  struct mconn *head, *tail;
  unsigned live; /* connections on the list not yet evicted */
};

bool metrics_http_available(void) { return true; }

static enum MHD_Result reply(struct MHD_Connection *c, unsigned status, char *body, size_t len, const char *type) {
  struct MHD_Response *r = MHD_create_response_from_buffer(len, body, MHD_RESPMEM_MUST_FREE);
  if (!r) {
    free(body);
    return MHD_NO;
  }
  MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, type);
  if (status == MHD_HTTP_METHOD_NOT_ALLOWED) MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, "GET, HEAD"); /* RFC 9110 */
  enum MHD_Result ret = MHD_queue_response(c, status, r);
  MHD_destroy_response(r);
  return ret;
}

static enum MHD_Result text(struct MHD_Connection *c, unsigned status, const char *msg) {
  char *b = strdup(msg);
  return b ? reply(c, status, b, strlen(b), "text/plain; charset=utf-8") : MHD_NO;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *upload, size_t *upload_size, void **state) {
  (void)version;
  (void)upload;
  (void)upload_size;
  (void)state;
  struct metrics_server *srv = cls;
  if (strcmp(method, "GET") && strcmp(method, "HEAD"))
    return text(c, MHD_HTTP_METHOD_NOT_ALLOWED, "only GET (and HEAD) /metrics is served\n");
  if (strcmp(url, "/metrics"))
    return text(c, MHD_HTTP_NOT_FOUND, "umbp daemon: the metrics are at /metrics\n");
  snap_take(srv->pool, srv->snap, 0);
  /* The events drained are an estimate from the ring's positions and its drop
   * count, three words read at different moments (umbp_admin_events_peek):
   * while a consumer drains a ring that overflows, a scrape came out below the
   * one before it, by 1 to thousands. A counter that goes down is a reset to
   * Prometheus (rate() and increase() count its whole value again), so a
   * figure below one already served is served as that one. */
  if (srv->snap->ev_drained < srv->drained_served) srv->snap->ev_drained = srv->drained_served;
  srv->drained_served = srv->snap->ev_drained;
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  if (!f) return text(c, MHD_HTTP_INTERNAL_SERVER_ERROR, "out of memory\n");
  int rc = snap_prometheus(srv->snap, f);
  fclose(f);
  if (rc) {
    free(buf);
    return text(c, MHD_HTTP_INTERNAL_SERVER_ERROR, "cannot format the metrics\n");
  }
  return reply(c, MHD_HTTP_OK, buf, len, "text/plain; version=0.0.4; charset=utf-8");
}

static enum MHD_Result on_accept(void *cls, const struct sockaddr *addr, socklen_t len) {
  (void)addr;
  (void)len;
  struct metrics_server *srv = cls;
  if (srv->live < METRICS_MAX_CONN) return MHD_YES;
  for (struct mconn *m = srv->head; m; m = m->next) {
    if (m->evicted) continue;
    /* MHD sees the end of the stream at its next poll and closes the
     * connection itself (on_connection's CLOSED then frees m) */
    shutdown(m->fd, SHUT_RDWR);
    m->evicted = true;
    srv->live--;
    break;
  }
  return MHD_YES;
}

static void on_connection(void *cls, struct MHD_Connection *c, void **socket_context,
                          enum MHD_ConnectionNotificationCode code) {
  struct metrics_server *srv = cls;
  struct mconn *m = *socket_context;
  if (code == MHD_CONNECTION_NOTIFY_STARTED) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    m = ci ? calloc(1, sizeof *m) : NULL;
    if (!m) return; /* untracked: it cannot be evicted, and MHD's limit still bounds it */
    m->fd = ci->connect_fd;
    m->prev = srv->tail;
    if (srv->tail) srv->tail->next = m;
    else srv->head = m;
    srv->tail = m;
    srv->live++;
    *socket_context = m;
  } else if (m) { /* MHD_CONNECTION_NOTIFY_CLOSED, before MHD closes the socket */
    if (m->prev) m->prev->next = m->next;
    else srv->head = m->next;
    if (m->next) m->next->prev = m->prev;
    else srv->tail = m->prev;
    if (!m->evicted) srv->live--;
    free(m);
    *socket_context = NULL;
  }
}

int metrics_serve(int fd, const char *pool, struct metrics_server **ret, char *why, size_t n) {
  struct metrics_server *srv = calloc(1, sizeof *srv);
  if (srv) srv->snap = malloc(sizeof *srv->snap);
  if (!srv || !srv->snap) {
    if (srv) free(srv);
    close(fd);
    snprintf(why, n, "out of memory");
    return -ENOMEM;
  }
  umbp_attach_opts ao;
  umbp_attach_opts_init(&ao);
  ao.read_only = true;
  ao.role = UMBP_ROLE_TOOL;
  int rc = umbp_pool_attach(pool, &ao, &srv->pool);
  if (rc) {
    snprintf(why, n, "cannot attach pool '%s' read-only for the metrics: %s", pool, umbp_last_error());
    free(srv->snap);
    free(srv);
    close(fd);
    return rc;
  }
  /* This attach is a second mapping of the pool, and a scrape reads parts of
   * it (namespaces, counters, the event ring) that the daemon's own threads
   * may not touch between two checks of the file: a scrape of a pool whose
   * file was truncated killed the daemon with a bare SIGBUS (no message,
   * status 135). Watched like the daemon's own mapping, it ends in the same
   * logged message and status 3. */
  char who[48];
  snprintf(who, sizeof who, "umbp-daemon[%d]: error", (int)getpid());
  cli_fault_watch(srv->pool, who, true);
  srv->mhd = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD, 0, on_accept, srv, on_request, srv,
                              MHD_OPTION_LISTEN_SOCKET, fd, MHD_OPTION_CONNECTION_TIMEOUT, 10u,
                              MHD_OPTION_CONNECTION_LIMIT, (unsigned)(METRICS_MAX_CONN + MHD_HEADROOM),
                              MHD_OPTION_NOTIFY_CONNECTION, on_connection, srv,
                              /* The timeout is one of inactivity: a client that trickles a
                               * header line every few seconds keeps its connection. 64 such
                               * connections from one host locked every scraper out; now one
                               * address holds at most 8 (and from 8 addresses or more, the
                               * oldest connection makes room for a new one: on_accept). */
                              MHD_OPTION_PER_IP_CONNECTION_LIMIT, 8u, MHD_OPTION_END);
  if (!srv->mhd) {
    snprintf(why, n, "libmicrohttpd could not start serving the metrics socket");
    cli_pool_detach(srv->pool);
    free(srv->snap);
    free(srv);
    close(fd);
    return -EIO;
  }
  *ret = srv;
  return 0;
}

void metrics_stop(struct metrics_server *srv) {
  if (!srv) return;
  MHD_stop_daemon(srv->mhd); /* closes the listening socket too; its thread is joined */
  while (srv->head) { /* MHD notifies each close; this frees what a version that does not left */
    struct mconn *m = srv->head;
    srv->head = m->next;
    free(m);
  }
  cli_pool_detach(srv->pool); /* ends the watch; a short file is let go of without touching it */
  free(srv->snap);
  free(srv);
}

#else /* built without libmicrohttpd */

struct metrics_server {
  int unused;
};

bool metrics_http_available(void) { return false; }

int metrics_serve(int fd, const char *pool, struct metrics_server **ret, char *why, size_t n) {
  (void)pool;
  (void)ret;
  close(fd);
  snprintf(why, n, "this umbp was built without libmicrohttpd: install libmicrohttpd-dev (scripts/setup.sh) and "
                   "rebuild, or use 'umbp inspect NAME --prometheus'");
  return -ENOTSUP;
}

void metrics_stop(struct metrics_server *srv) { (void)srv; }

#endif
