/* endpoint.h: the things a copy reads from and writes to, behind one
 * table: raw files and block devices, NBD exports (one or more
 * connections), null: (discards), '-' (a pipe on stdin or stdout), and
 * generated sources for tests and benchmarks.
 *
 * Every operation is asynchronous: submit() either refuses it at once
 * (-errno, nothing happens) or accepts it, and then op->done is called
 * exactly once, always on the loop thread (blocking file I/O runs on the
 * environment's worker pool and its completion is passed back). done may
 * run before submit returns, so callers must not rely on ordering.
 *
 * Buffer ownership: op->buf belongs to whoever owns the op (the copy
 * engine); the endpoint borrows it from submit until done. A WRITE to an
 * endpoint with can_send_file may carry a file range instead of a buffer
 * (from_file): a descriptor and host offset that the source's map
 * operation gave for the range, borrowed the same way until done; the
 * payload then never enters user space. Only map says where a virtual
 * range lies in a file: an endpoint without it never feeds from_file. */
#ifndef NBDFLOW_COPY_ENDPOINT_H
#define NBDFLOW_COPY_ENDPOINT_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "client/client.h"
#include "format/image.h"
#include "util/workq.h"

/* Connections opened to a server advertising multi-conn, unless told;
 * over TCP the count may then grow to ENDPOINT_MAX_CONNECTIONS while the
 * copy runs (see endpoint_ops.fit_window). */
#define ENDPOINT_AUTO_CONNECTIONS 4
#define ENDPOINT_MAX_CONNECTIONS 16
/* One EXTENTS query covers at most this much (block status is a hint). */
#define ENDPOINT_STATUS_SPAN (UINT64_C(1) << 30)
/* A FLUSH (and the wait for a Chunked receiver's close, which covers its
 * flush) gets this many --timeouts: it writes back what the server
 * cached, possibly gigabytes to slow storage. */
#define ENDPOINT_FLUSH_TIMEOUT_FACTOR 10
/* Largest single ZERO operation. A server that zeroes by writing does it
 * at disk speed, and the no-reply watchdog (--timeout) waits for one
 * request as long as for any: 64 MiB asks it for 1.1 MiB/s at the
 * default 60 s, where a 1 GiB hole in one request asked for 17 MiB/s. */
#define ENDPOINT_ZERO_MAX (UINT64_C(64) << 20)
/* First READ or WRITE an NBD endpoint asks for (endpoint.opening_request).
 * A server that mallocs each request's buffer (qemu-nbd) under glibc
 * otherwise faults in every page of every payload: glibc maps large
 * buffers afresh, or trims its heap under them, until it has freed one
 * buffer of a size that raises its thresholds (to that size, and twice it
 * for trimming) above the copy's own churn (docs/copy-engine.md, "Opening
 * request", gives the page faults measured). */
#define ENDPOINT_OPENING_REQUEST (UINT64_C(4) << 20)
/* --retry: the longest wait between two reconnection attempts. */
#define ENDPOINT_RETRY_MAX_DELAY_MS 60000
/* --retry: a source is read at up to 3 places of this many bytes when it
 * is opened and again after each reconnection; a different answer means
 * a different disk. */
#define ENDPOINT_SAMPLE_LEN (64u << 10)
/* The largest preferred block size that pieces are aligned to. */
#define ENDPOINT_ALIGN_CAP (1u << 20)

struct loop;
struct endpoint;

/* Where a virtual range of a readable endpoint lies in a file: length
 * bytes at host_off of fd (owned by the endpoint, valid until close). */
struct endpoint_map {
  int fd;
  uint64_t host_off;
  uint64_t length;
};

struct endpoint_extent {
  uint64_t length;
  bool zero; /* reads as zeroes (hole or known zero); else data */
};

enum ep_op_type { EP_READ, EP_WRITE, EP_ZERO, EP_FLUSH, EP_EXTENTS };

struct ep_op;
typedef void (*ep_done_fn)(struct ep_op *op);

struct ep_op {
  /* Set by the caller. */
  enum ep_op_type type;
  uint64_t offset;
  uint64_t length;  /* READ from a pipe: shrinks to what was read at EOF */
  uint8_t *buf;     /* READ/WRITE; borrowed until done */
  bool from_file;   /* WRITE: payload is file_fd at file_off (from the
                       source's map), buf unused */
  int file_fd;
  uint64_t file_off;
  struct endpoint_extent *extents; /* EXTENTS: room for max_extents */
  size_t max_extents;
  ep_done_fn done;
  void *arg;

  /* Results. */
  int err;          /* 0 or a positive errno */
  bool eof;         /* READ from a pipe hit end of input */
  bool skipped;     /* ZERO that needed no work (already zero) */
  size_t nextents;
  char errmsg[256]; /* server's message, if any */

  /* Private to the endpoint. */
  struct endpoint *ep;
  struct client_req req;
  struct work work;
  struct ep_op *next_done;
  struct ep_op *next_parked; /* waiting for a reconnection (--retry) */
  bool fast_zero_tried;
  unsigned err_tries; /* error replies resent (--retry-errors) */
};

/* What every endpoint shares: the loop, the worker pool for blocking
 * file I/O, and the queue that carries worker completions back. */
struct ep_env {
  struct loop *loop;
  struct workq *wq;
  pthread_mutex_t lock;
  struct ep_op *done_head, *done_tail; /* guarded by lock */
  /* Called on the loop thread after an endpoint handled socket events
   * (which may have called done on some ops). */
  void (*kick)(void *arg);
  void *kick_arg;
};

struct endpoint_ops {
  const char *kind;
  int (*submit)(struct endpoint *e, struct ep_op *op);
  void (*close)(struct endpoint *e);
  /* Optional, loop thread: samples the transport and returns the smallest
   * round-trip time seen (microseconds), 0 when unknown. */
  uint32_t (*sample_rtt)(struct endpoint *e);
  /* Optional: TCP diagnostics of the first connection as a JSON object
   * into buf; returns 0, or -1 when there is nothing to report. */
  int (*tcp_json)(struct endpoint *e, char *buf, size_t len);
  /* Optional: the same for every TCP connection that joined, as a JSON
   * array in connection order; connections that do not fit in buf are
   * left out. Returns 0, or -1 when there is nothing to report. */
  int (*tcp_json_each)(struct endpoint *e, char *buf, size_t len);
  /* Optional, loop thread: what TLS the first connection negotiated
   * (net/tls.h), and in *uniform whether every other connection that
   * joined negotiated the same. Returns 0, or -1 when the endpoint runs
   * without TLS. */
  int (*tls)(struct endpoint *e, struct tls_params *out, bool *uniform);
  /* Optional, loop thread, about every 200 ms: takes one TCP_INFO sample
   * of every TCP connection and returns the share of all samples so far
   * that stalled, in percent, with the sample count in *samples; -1 when
   * there is no TCP connection. */
  double (*sample_tcp)(struct endpoint *e, uint64_t *samples);
  /* Optional, loop thread: the engine wants `bytes` in flight on this
   * endpoint (2 x its bandwidth-delay product). An endpoint whose
   * connection count is automatic may start more connections so that
   * none has to hold more than its transport can; it never closes any. */
  void (*fit_window)(struct endpoint *e, uint64_t bytes);
  /* Optional, loop thread: new requests go to the first n live
   * connections only (0: to all). Returns false, and changes nothing,
   * when the endpoint opens a single connection or the user fixed
   * their count. Requests in flight finish where they are. */
  bool (*spread)(struct endpoint *e, unsigned n);
  /* Optional, loop thread, never blocks: where [off, off + len) of a
   * readable endpoint lies in a file, so that its bytes may leave by
   * sendfile(2) without being read here. Fills m with a run of 1 to len
   * bytes from off and returns 0, or returns -EAGAIN when the range (or
   * its start) cannot be mapped without I/O or not at all: the caller
   * then reads it. A raw file maps one to one; a format maps within its
   * data blocks. */
  int (*map)(struct endpoint *e, uint64_t off, uint64_t len,
             struct endpoint_map *m);
  /* Optional, loop thread, every engine tick (about 200 ms, and after a
   * loop_wake): time-driven work such as a reconnection (--retry). */
  void (*tick)(struct endpoint *e);
  /* Optional, loop thread: the engine's watchdog found the endpoint
   * silent for --timeout (why says so). An endpoint that may reconnect
   * drops its connections, reconnects and sends what was in flight
   * again, and returns 0; -1 otherwise, and the engine abandons the
   * requests in flight as it does without this. */
  int (*lost)(struct endpoint *e, const char *why);
  /* Optional: an endpoint over others (the --base delta) says whether
   * one of them had an error reply (see peer_error below). */
  bool (*inner_peer_error)(const struct endpoint *e);
};

struct endpoint {
  const struct endpoint_ops *ops;
  struct ep_env *env;
  const char *name;   /* as the user wrote it, for messages */
  uint64_t size;
  bool size_known;    /* false for a pipe source */
  bool sequential;    /* pipes: one op at a time, in offset order */
  bool readable, writable;
  bool has_extents;   /* EXTENTS tells data from zeroes */
  bool can_zero;      /* ZERO is supported (else write zeroes) */
  bool can_flush;
  uint32_t align;     /* offsets and lengths must be multiples */
  uint32_t min_block; /* the server's minimum block size: every request's
                         offset and length must be a multiple (NBD; 0 or
                         1: none) */
  uint64_t max_request; /* largest READ or WRITE */
  uint64_t opening_request; /* a first READ or WRITE this large (capped
                               by max_request) helps; 0: no preference */
  unsigned connections;
  bool multi_conn;    /* server allows several connections */
  bool can_send_file; /* WRITE accepts from_file (plain NBD transport) */
  bool loopback;      /* TCP to a loopback address: with can_send_file,
                          which path is faster depends on the machine
                          (the receiver copies every payload either way),
                          so the engine times both (its data path probe:
                          docs/copy-engine.md) */
  /* --retry: reconnections that succeeded, and WRITE payload bytes
   * that had left on a lost connection and were sent again. */
  uint64_t reconnects;
  uint64_t resent_bytes;
  bool retries;       /* --retry is on for it: a lost connection that
                         still fails the copy was retried already */
  uint64_t t_answer_us; /* loop_now_us() of the last answer
                           to part of an op still in flight (an op sent
                           in pieces); 0: none. The no-reply watchdog
                           counts it as a reply. Loop thread. */
  /* The peer answered a request with an error (NBD: an error reply), as
   * opposed to losing the connection (sparse_dd's exit status 5). Loop
   * thread. */
  bool peer_error;
  void *priv;
};

/* How a destination URL or stream is spoken (--dst-protocol). */
enum ep_protocol {
  EP_PROTO_AUTO,    /* what the target implies; http(s): NBD when the
                       answer says so, else Chunked */
  EP_PROTO_NBD,
  EP_PROTO_CHUNKED, /* xapi's Chunked frames (endpoint_chunked.c) */
};

/* An http(s):// destination: the URL, the PUT's settings and the TLS
 * credentials, owned by the endpoint that speaks over it. */
struct ep_http {
  struct http_url *url;
  struct client_http h;
  struct tls_creds *creds;  /* https */
  struct client_conn body;  /* an answer that expects a body: fd >= 0 */
};
void ep_http_free(struct ep_http *x);
/* The NBD URI an http(s) URL's upgraded session connects with (plain:
 * any TLS is the HTTPS session's). */
int nbd_uri_from_http(const struct ep_http *x, const char *export_name,
                      struct nbd_uri *u, char *err, size_t errlen);

struct endpoint_opts {
  /* EXTENTS is issued one at a time per endpoint. */
  bool write;           /* open as destination */
  bool as_dst;          /* a source named as a destination is (copy
                           --verify reads DST back): "zero:1M" is a file
                           there, never a generated source */
  const char *shown;    /* the name for messages (an http URL with its
                           secrets hidden), or NULL: the spec; borrowed */
  unsigned connections; /* NBD: 0 = automatic */
  uint64_t create_size; /* file destination: size to give it;
                           UINT64_MAX when the source size is unknown */
  bool allocated;       /* file destination: write zero blocks too */
  bool dense;           /* file destination: data pieces are written whole,
                           zero blocks in them included */
  bool no_extents;      /* file source: its extents will not be asked for
                           (--no-extents), so none are looked up ahead */
  /* NBD, diagnostics (client_opts): Nagle on, header and payload in
   * separate writes. */
  bool nagle;
  bool split_writes;
  unsigned timeout_s; /* NBD: the command's --timeout (client_handshake_ms) */
  /* NBD, --retry: reconnection attempts in a row without a reply (0: a
   * lost connection fails the copy), and the wait before the first of
   * them, doubled for each next one (ENDPOINT_RETRY_MAX_DELAY_MS at
   * most). */
  unsigned retry;
  unsigned retry_delay_ms;
  /* NBD, --retry-errors (with --retry): an error reply of EIO, ENOMEM or
   * ENOSPC to a READ, WRITE or zeroing sends the request again after
   * the same waits, up to `retry` error replies in a row. */
  bool retry_errors;
  /* Files: the image format (--src-format / --dst-format; a "vhd:" or
   * "raw:" prefix on the target wins), whether the user named it (only
   * then may a source open parents), and --ignore-checksums. */
  enum image_format format;
  bool format_given;
  bool ignore_checksums;
  /* An image destination (VHD, qcow2): the source's allocation, one bit
   * per block of alloc_block bytes (set: holds data), LSB first, owned by
   * the caller until the endpoint is closed; NULL: every block holds
   * data. */
  const uint8_t *alloc;
  uint32_t alloc_block;
  /* Destinations: --dst-protocol; the export an http(s) URL's NBD
   * session asks for (--nbd-export); https: the CA directory and the
   * peer check (--tls-certificates, --tls-verify-peer). */
  enum ep_protocol protocol;
  const char *nbd_export;
  const char *tls_certificates;
  bool no_tls_verify;
  const char *tls_priority; /* --tls-priority, or NULL */
  const char *tls_ca_file;  /* --tls-ca-file: CAs in one PEM file */
  const char *tls_server_name; /* --tls-server-name: SNI, or NULL: the
                                  URL's host */
  bool tls_chain_only;      /* --tls-verify-peer chain: the certificate's
                               chain is checked, not its name */
  /* Set by endpoint_open for endpoint_open_nbd: an http(s) URL whose
   * PUT comes before the NBD handshake. endpoint_open_nbd owns it from
   * the call on, but when it returns CLIENT_HTTP_BODY (the answer expects
   * a body: the connection is in http->body). */
  struct ep_http *http;
};

/* What endpoint_open would refuse from spec and o alone, before it
 * touches anything: an empty name, a malformed generated source, http or
 * Chunked URL, a format prefix that contradicts --src/--dst-format or
 * comes before a URI, a kind that cannot be this side (null: as a
 * source, memory:), a format where none applies. 0, or -EINVAL with one
 * line in err: the command line is wrong (a usage error). */
int endpoint_check(const char *spec, const struct endpoint_opts *o,
                   char *err, size_t errlen);
/* Opens spec: an NBD URI, "null:", "-", a generated source
 * (pattern:SIZE, random:SIZE[:SEED], zero:SIZE,
 * sparse:SIZE[:PERIOD[:DATALEN]]), or a file. Returns 0 or -errno with
 * a sentence in err (endpoint_check's refusals first). */
int endpoint_open(struct ep_env *env, const char *spec,
                  const struct endpoint_opts *o, struct endpoint **out,
                  char *err, size_t errlen);
/* E (may be NULL), or an endpoint under it, had an error reply. */
static inline bool
endpoint_peer_error(const struct endpoint *e)
{
  return e && (e->peer_error ||
               (e->ops->inner_peer_error && e->ops->inner_peer_error(e)));
}

/* Frees E. Its env's workers must have been joined first (ep_env_fini):
 * a file source's first extents lookup may still be queued on them, and
 * its completion is never drained after that. */
void endpoint_close(struct endpoint *e);
static inline int
endpoint_submit(struct endpoint *e, struct ep_op *op)
{
  op->ep = e;
  op->err = 0;
  op->eof = op->skipped = false;
  op->nextents = 0;
  op->errmsg[0] = '\0';
  return e->ops->submit(e, op);
}

/* Walks src's extents from 0 to its size on env's loop (not while a
 * copy runs it), calling fn for each run in order: zero when it reads as
 * zeroes. A source without extents is one data run. 0 or -errno with a
 * sentence in err. */
typedef void (*endpoint_scan_fn)(void *arg, uint64_t off, uint64_t len,
                                 bool zero);
int endpoint_scan(struct ep_env *env, struct endpoint *src,
                  endpoint_scan_fn fn, void *arg, char *err, size_t errlen);

int ep_env_init(struct ep_env *env, struct loop *loop, int nthreads);
void ep_env_fini(struct ep_env *env);
/* From any thread: hands a finished op back to the loop thread. */
void ep_env_complete(struct ep_env *env, struct ep_op *op);
/* On the loop thread: calls done for every op handed back. */
void ep_env_drain(struct ep_env *env);

/* The one constructor of struct endpoint, for every kind: the shared
 * defaults (one connection, alignment 1, 32 MiB requests, a known size),
 * with ops and priv (owned by the endpoint from here on). NULL when out
 * of memory. */
struct endpoint *endpoint_new(struct ep_env *env, const char *name,
                              const struct endpoint_ops *ops, void *priv);

/* Per-kind constructors, used by endpoint_open. */
int endpoint_open_nbd(struct ep_env *env, const char *spec,
                      const struct endpoint_opts *o, struct endpoint **out,
                      char *err, size_t errlen);
/* Returns -ENOENT, writing nothing, when spec names no generator. */
int endpoint_gen_check(const char *spec, char *err, size_t errlen);
int endpoint_open_gen(struct ep_env *env, const char *spec,
                      struct endpoint **out, char *err, size_t errlen);
/* Whether an image of format f may be written as a stream to path
 * (NULL: stdout): 0, or -errno with why in err (a VHD onto a block
 * device: its footer must end the file). Before anything is read. */
int endpoint_image_out_check(const char *spec, const char *path,
                             enum image_format f, char *err, size_t errlen);
/* An image in format f (a dynamic VHD, a qcow2) written in one forward
 * pass (format/image.h's writer) into path, or stdout when path is NULL;
 * o->create_size is the disk's size, o->alloc its allocation. */
int endpoint_open_image_out(struct ep_env *env, const char *spec,
                            const char *path, enum image_format f,
                            const struct endpoint_opts *o,
                            struct endpoint **out, char *err, size_t errlen);
/* Chunked frames (endpoint_chunked.c) over conn, which is taken over
 * (closed at the end when own_fd; a pipe or file has no transport); http,
 * when given, is owned from the call on. */
int endpoint_open_chunked(struct ep_env *env, const char *spec,
                          struct client_conn *conn, bool own_fd,
                          struct ep_http *http, const struct endpoint_opts *o,
                          struct endpoint **out, char *err, size_t errlen);
/* "chunked+tcp://HOST:PORT" or "chunked+unix:///PATH". */
int endpoint_open_chunked_socket(struct ep_env *env, const char *spec,
                                 const struct endpoint_opts *o,
                                 struct endpoint **out, char *err,
                                 size_t errlen);
/* The address in such a spec: 1 for chunked+unix (its path follows the
 * 15-byte prefix), 0 for chunked+tcp with host and *port (into spec)
 * set, -EINVAL with why in err. */
int endpoint_chunked_addr(const char *spec, char *host, size_t hostlen,
                          const char **port, char *err, size_t errlen);
/* SRC seen against BASE (both owned from the call on, closed on
 * failure): compares them now, on env's loop, then reads as SRC with
 * extents that call every block equal to BASE's a zero extent, so that
 * a copy with dst_is_zero sends only what differs (endpoint_delta.c).
 * When SRC is an image whose chain holds the file base_path (may be
 * NULL), the blocks its levels above BASE allocate are the difference,
 * and nothing is compared. On success the delta owns SRC and BASE; on
 * failure they stay the caller's, to close after ep_env_fini like any
 * endpoint (a file's extents prefetch may still be queued). */
int endpoint_open_delta(struct ep_env *env, struct endpoint *src,
                        struct endpoint *base, const char *base_path,
                        struct endpoint **out, char *err, size_t errlen);
/* Bytes of the blocks found different (a multiple of the block size). */
uint64_t endpoint_delta_changed(const struct endpoint *e);
/* The difference came from the source's image chain, BASE unread. */
bool endpoint_delta_by_chain(const struct endpoint *e);
/* The image an endpoint reads through the format layer, or NULL. */
struct image *endpoint_image(const struct endpoint *e);
/* An http:// or https:// destination (endpoint_chunked.c). */
int endpoint_open_http(struct ep_env *env, const char *spec,
                       const struct endpoint_opts *o, struct endpoint **out,
                       char *err, size_t errlen);
/* Whether path is an existing image of format f that is written in
 * place (a VHD: through the format layer, as serve writes it), rather
 * than a new one written as a stream over it. */
bool endpoint_image_exists(const char *path, enum image_format f);
/* That existing image as a destination, in place. */
int endpoint_open_image_dst(struct ep_env *env, const char *spec,
                            const char *path, enum image_format f,
                            struct endpoint **out, char *err, size_t errlen);
/* A disk image in a format (VHD...) read through the format layer. */
struct image;
int endpoint_open_image(struct ep_env *env, const char *spec,
                        struct image *img, struct endpoint **out,
                        char *err, size_t errlen);

#endif
