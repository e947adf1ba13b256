/* client.h: one NBD client connection.
 *
 * Two phases, as in the protocol. The handshake (client_connect) is
 * blocking, bounded by a timeout, and runs over the connection's transport
 * table, so that a TLS transport can later be installed after STARTTLS
 * without touching the option code. Transmission is non-blocking and
 * event driven: the caller submits requests (client_submit), watches the
 * fd (EPOLLIN always, EPOLLOUT while client_wants_write), and calls
 * client_on_events when it is ready. Replies are matched by cookie and may
 * arrive in any order.
 *
 * Buffer ownership: a request's buf is borrowed by the connection from
 * client_submit until its done callback has been called. For READ the
 * connection writes reply data straight into it; for WRITE it sends from
 * it. The caller must neither touch nor free it in between.
 *
 * A WRITE may instead name a file range (file_fd, file_off) on a plain
 * transport (client_can_send_file): the payload then goes from the page
 * cache to the socket with sendfile(2), never through user space. The
 * range is borrowed the same way: the file must stay open and that range
 * unmodified until done, because on TCP the kernel queues references to
 * the file's pages, not copies. A file that turns out shorter than the
 * range kills the connection (the header already promised the bytes).
 *
 * Lengths from the server are never trusted: every chunk is checked
 * against the request it answers before a byte of its payload is read. */
#ifndef NBDFLOW_CLIENT_CLIENT_H
#define NBDFLOW_CLIENT_CLIENT_H

#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "net/tls.h"
#include "net/transport.h"
#include "proto/nbd.h"
#include "proto/nbd_uri.h"

/* Per-connection limits on what the server may make us read. */
/* Descriptors per status chunk: "SHOULD NOT send more than 2^20"
 * (§NBD_REPLY_TYPE_BLOCK_STATUS), and nbdkit sends that many. */
#define CLIENT_MAX_EXTENTS (1u << 20)
#define CLIENT_KEEP_SCRATCH (64u << 10) /* a larger scratch is freed */
#define CLIENT_MAX_OPT_REPLY (64u << 10)  /* one option reply payload */
#define CLIENT_MAX_SPANS 4096  /* separate pieces of one READ's reply */

/* An NBD connection that starts as an HTTP(S) PUT (xapi's nbdproxy and
 * import URLs): see client/http.c. */
struct http_url;
struct client_conn;
struct client_http {
  const struct http_url *url;
  bool chunked_cookie;    /* send "Cookie: chunked=true" */
  bool need_nbd;          /* an answer without Transfer-Encoding: nbd is
                           * an error; else the connection moves to body */
  struct client_conn *body; /* !need_nbd: receives the connection (fd
                             * >= 0) when the answer expects a body */
  bool tls_start;         /* https: TLS from the first byte */
  struct tls_client_config tls; /* https: the peer check */
};

struct client_opts {
  const char *export_name;  /* "" for the default export */
  bool want_structured;     /* STRUCTURED_REPLY (needed for block status) */
  bool want_extended;       /* try EXTENDED_HEADERS first */
  bool want_allocation;     /* SET_META_CONTEXT base:allocation */
  bool want_list;           /* collect NBD_OPT_LIST before GO */
  bool list_only;           /* with want_list: no GO; end with
                             * NBD_OPT_ABORT and close the socket */
  int timeout_ms;           /* connect and handshake; -1 for none */
  /* Diagnostics, to reproduce stock clients (docs/copy.md): leave
   * Nagle's algorithm on (no TCP_NODELAY), and send every WRITE's header
   * and payload in two separate writes, without MSG_MORE. */
  bool nagle;
  bool split_writes;
  /* For an nbds URI, required: its credentials from client_tls_load,
   * shared by every connection given these options (the caller keeps
   * them until the last is closed). */
  const struct tls_creds *tls_creds;
  /* Optional, called on the connecting thread: with each socket before
   * its connect starts, and with -1 before client_connect closes it or
   * returns, so that another thread may shutdown(2) it meanwhile (under
   * its own lock) to abandon the connect or the handshake. */
  void (*on_socket)(void *arg, int fd);
  void *on_socket_arg;
  /* Optional: a PUT comes first (https: inside TLS from the first byte,
   * with tls_creds from the caller); the NBD handshake follows only on an
   * answer with Transfer-Encoding: nbd. */
  const struct client_http *http;
};

/* The connect and handshake limit of a command with the given timeout in
 * seconds (0: none): that timeout, but never more than 30 s. */
#define CLIENT_HANDSHAKE_MS 30000
static inline int
client_handshake_ms(unsigned timeout_s)
{
  return timeout_s > 0 && timeout_s < CLIENT_HANDSHAKE_MS / 1000
             ? (int)timeout_s * 1000
             : CLIENT_HANDSHAKE_MS;
}

/* What the handshake learnt. Strings are owned by the connection. */
struct client_info {
  const char *protocol;       /* "newstyle-fixed", "newstyle", "oldstyle" */
  uint64_t size;
  uint16_t tflags;            /* 0 when NBD_FLAG_HAS_FLAGS was clear */
  uint16_t tflags_sent;       /* as the server sent them */
  bool has_block_size;        /* server sent NBD_INFO_BLOCK_SIZE */
  uint32_t min_block, pref_block, max_block; /* defaults when not sent;
                                                * the maximum cut to whole
                                                * minimum blocks */
  uint32_t min_sent, pref_sent, max_sent; /* as the server sent them */
  char *name;                 /* NBD_INFO_NAME, or NULL */
  char *description;          /* NBD_INFO_DESCRIPTION, or NULL */
  const char *dropped;        /* "NBD_INFO_NAME" or "NBD_INFO_DESCRIPTION"
                               * when one held a NUL byte and was left
                               * out, or NULL */
  bool structured, extended;
  bool tls;                   /* the session runs inside TLS */
  bool allocation;            /* base:allocation was selected */
  uint32_t allocation_id;
  char **exports;             /* NBD_OPT_LIST names when asked */
  size_t nexports;
};

/* One extent of a BLOCK_STATUS reply (base:allocation flags). */
struct client_extent {
  uint64_t length;
  uint32_t flags;
};

struct client_req;
/* Called once per request, on the thread running client_on_events (or
 * client_submit never: submission errors are returned, not called back).
 * err is 0 or a positive errno. After it returns the request belongs to
 * the caller again. */
typedef void (*client_done_fn)(struct client_req *r, int err);

struct client_req {
  /* Filled by the caller. */
  uint16_t type;          /* NBD_CMD_* */
  uint16_t flags;         /* NBD_CMD_FLAG_* */
  uint64_t offset;
  uint64_t length;
  void *buf;              /* READ/WRITE data, borrowed until done */
  bool from_file;         /* WRITE: payload is file_fd at file_off, not buf */
  int file_fd;            /* borrowed until done, never closed here */
  uint64_t file_off;
  struct client_extent *extents; /* BLOCK_STATUS: room for max_extents */
  size_t max_extents;
  client_done_fn done;
  void *arg;

  /* Results. */
  size_t nextents;        /* BLOCK_STATUS: descriptors stored */
  bool extents_dropped;   /* BLOCK_STATUS: the server sent more than that */
  char errmsg[128];       /* server's error message, if any */
  bool completed;

  /* Private to the connection. */
  uint64_t cookie;
  uint8_t hdr[NBD_EXTENDED_REQUEST_LEN];
  uint8_t hdr_len;
  bool sent;              /* fully written: replies may complete it */
  int err;
  uint64_t covered;       /* READ: bytes filled by data and hole chunks */
  uint64_t run_lo, run_hi; /* READ: the filled range while it is one */
  bool status_seen;       /* BLOCK_STATUS: our context's chunk came */
  struct client_req *next;
};

/* The length to ask the next BLOCK_STATUS for, after a reply to one of
 * span bytes whose kept extents covered `covered`: a server that reports
 * small extents sends all of a long span's, and when some were dropped
 * (cut: more than there was room for) it would send them again from
 * where the kept ones end, over and over. So the span shrinks to what
 * was kept (rounded up to the minimum block, align) and grows back,
 * doubling, up to max while replies leave half their room (roomy). */
static inline uint64_t
client_status_span(uint64_t span, bool cut, bool roomy, uint64_t covered,
                   uint32_t align, uint64_t max)
{
  if (cut) {
    uint64_t s = (covered + align - 1) / align * align;
    return s > align ? s : align;
  }
  if (!roomy)
    return span;
  return span > max / 2 ? max : span * 2;
}

/* What the chunks of one READ have filled once they stopped being one
 * range: sorted, disjoint [lo, hi) pieces relative to the request. */
struct client_spans {
  struct client_span {
    uint64_t lo, hi;
  } *v;
  uint32_t n, cap;
};

struct client_conn {
  struct transport tp;
  int fd;
  struct client_info info;
  char errmsg[256];      /* why the handshake or the connection failed */
  int fatal;             /* sticky errno once the connection is dead */
  bool lost;             /* it died of its transport (a reset, an EOF, a
                          * TLS failure, client_abort), not of a protocol
                          * violation: the same requests may be sent
                          * again on a new connection */
  bool send_broken;      /* a send failed: reading what came, then dying */

  /* Transmission state, private. */
  struct client_req **slots; /* in-flight requests indexed by cookie */
  struct client_spans *spans; /* per slot, reused; owned here */
  uint32_t nslots;
  uint32_t *free_slots;
  uint32_t nfree;
  uint32_t generation;
  struct client_req *sendq, *sendq_tail;
  size_t send_off;        /* bytes of sendq's head already sent */
  bool flush_pending;     /* the transport holds bytes (a TLS record the
                           * socket refused): flush on POLLOUT */
  bool split_writes;      /* client_opts.split_writes */
  unsigned inflight;
  uint64_t inflight_bytes;

  int rx_state;
  uint8_t rx_hdr[NBD_EXTENDED_REPLY_LEN];
  size_t rx_have, rx_need;
  struct client_req *rx_req;
  uint16_t rx_type, rx_flags;
  uint64_t rx_len;        /* payload bytes left in this chunk */
  uint8_t *rx_dst;        /* where payload bytes go */
  uint8_t *scratch;       /* small payloads (status, errors), owned */
  size_t scratch_size;
};

/* For an nbds URI: checks that its TLS parameters agree and loads the
 * credentials they name, before any connection, into *out (NULL for a
 * plain URI). Returns 0, or -errno with a sentence in err. Free them with
 * tls_creds_free. */
int client_tls_load(const struct nbd_uri *u, struct tls_creds **out,
                    char *err, size_t errlen);

/* Connects to the URI and runs the handshake. Returns 0, or -errno with a
 * sentence in c->errmsg. On failure the connection is already closed. */
int client_connect(struct client_conn *c, const struct nbd_uri *u,
                   const struct client_opts *o);
/* client_connect returns this when o->http's answer expects a body: the
 * connection (socket, transport, TLS) was moved to o->http->body. */
#define CLIENT_HTTP_BODY (-EPROTONOSUPPORT)
/* The PUT on c's fresh socket (client/http.c): 0 when the answer hands
 * over to NBD, 1 when it expects a body, or -errno with c->errmsg. */
int client_http_put(struct client_conn *c, const struct client_http *h,
                    const struct tls_creds *creds, int timeout_ms);
/* Sends DISC when the connection is healthy and idle, then closes and
 * frees everything. In-flight requests are not called back. */
void client_close(struct client_conn *c);

/* Ends the transport (TLS close_notify, shutdown(2)) and closes the
 * socket, sending nothing; what the handshake learnt stays. */
void client_drop_socket(struct client_conn *c);

/* Ends a live connection as if its transport had died with err (a
 * watchdog's ETIMEDOUT, a caller about to reconnect): every in-flight
 * request is called back with err, and c->lost is set. Returns -err. */
int client_abort(struct client_conn *c, int err, const char *why);

/* Queues a request and tries to send it now. Returns 0, or -errno when the
 * request is invalid for this export (nothing is queued then) or the
 * connection is dead. */
int client_submit(struct client_conn *c, struct client_req *r);
/* Handles readiness of c->fd. Returns 0, or -errno when the connection
 * died (every in-flight request has then been called back with the
 * error). */
int client_on_events(struct client_conn *c, uint32_t events);
bool client_wants_write(const struct client_conn *c);

/* Blocking helper for simple tools: submits r and runs the connection
 * until r completes. Returns r's error (0 or -errno). */
int client_run(struct client_conn *c, struct client_req *r, int timeout_ms);

/* True when WRITE payloads may come from a file range (from_file): the
 * connection runs on the plain transport, where sendfile(2) can reach the
 * socket. False under TLS, which must encrypt in user space. */
bool client_can_send_file(const struct client_conn *c);

/* The largest READ/WRITE payload this export accepts. */
uint64_t client_max_payload(const struct client_conn *c);

#endif
