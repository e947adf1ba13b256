/* server.h: the NBD server: configuration, connections and requests.
 *
 * Files: listen.c starts and stops the server and owns its listeners and
 * event loops; conn.c is an NBD connection on its loop (lifecycle and the
 * reading state machine), handshake.c and transmission.c the two phases
 * it reads for. xapi.c is the other kind of session: HTTP receivers on
 * threads of their own, which may hand their socket to the loops as an
 * NBD connection (server_adopt). server_priv.h is between listen.c and
 * conn.c only.
 *
 * Threads: a few event-loop threads (struct sloop). The first owns the
 * listeners and the stop signals; it accepts, and hands each connection
 * to the loop that has the fewest, which owns from then on its reading
 * side and its handshake. Requests run on a worker pool, but for small
 * WRITEs to an export in memory, which the loop runs itself
 * (SERVER_INLINE_WRITE); whoever ran a request sends its reply when the
 * socket takes it at once, and otherwise leaves it queued for the
 * connection's loop to flush on EPOLLOUT. Nothing on a loop thread waits
 * for a device. */
#ifndef NBDFLOW_SERVER_SERVER_H
#define NBDFLOW_SERVER_SERVER_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>
#include <sys/uio.h>

#include "net/loop.h"
#include "net/tcpinfo.h"
#include "net/tls.h"
#include "net/transport.h"
#include "proto/wire.h"
#include "server/export.h"
#include "util/workq.h"

#define SERVER_MAX_LISTEN 8
#define SERVER_MAX_LOOPS 8 /* the default is one per CPU, up to this */
#define SERVER_DEFAULT_INFLIGHT 32
#define SERVER_MAX_PAYLOAD (32u << 20) /* advertised maximum block size */
#define SERVER_PREFERRED_BLOCK 4096
/* A client that never agreed to our block sizes (EXPORT_NAME, or GO
 * without NBD_INFO_BLOCK_SIZE) may not know SERVER_MAX_PAYLOAD, and
 * "SHOULD" then be served requests up to the export's size (§Size
 * constraints; nbd-server's test client reads 42 MiB at once). Its READs
 * and WRITEs up to this length are served, in pieces of SERVER_PIECE
 * (the only buffer they take, and what they count against
 * SERVER_CONN_BUDGET); longer ones are refused as from any client. The
 * limit keeps one request from holding its connection for minutes. */
#define SERVER_MAX_UNSIZED (1u << 30)
#define SERVER_PIECE (4u << 20)
#define SERVER_MAX_OPTION (64u << 10) /* option data we agree to buffer */
/* Option data up to this is dropped as it comes and the option answered
 * after it (ERR_TOO_BIG, ERR_UNSUP...), and haggling goes on; a length
 * announced beyond it is answered at once with ERR_TOO_BIG, and the
 * connection closed. No option needs it (the largest this server takes
 * is SERVER_MAX_OPTION; a string is at most 4096 bytes), and reading a
 * made-up 4 GiB to its end would hold the client until the handshake
 * timeout. nbdkit closes past 64 MiB. */
#define SERVER_MAX_OPTION_DROP (1u << 20)
/* Payload bytes (READ data, WRITE payloads, buffered or spliced) one
 * connection may hold for requests in flight. A header whose request
 * would go past it waits, reading paused, until replies free room; one
 * request is always admitted when nothing else is held, so any length up
 * to SERVER_MAX_PAYLOAD gets through. Without it, max_inflight requests
 * of SERVER_MAX_PAYLOAD would pin 1 GiB per connection. */
#define SERVER_CONN_BUDGET (64u << 20)
/* Request buffers larger than this are freed when the reply has left, so
 * an idle connection keeps only ordinary-sized buffers for reuse. */
#define SERVER_KEEP_BUF (4u << 20)
#define SERVER_UNIX_SNDBUF (2 << 20)
#define SERVER_SPLICE_MIN (64u << 10) /* smaller payloads are copied */
/* WRITEs up to this size, without FUA, to an export whose writes only
 * copy into memory (write_in_memory) run on the event loop: the write is
 * a copy like the one the loop makes of every smaller payload, and waking
 * a worker for it cost more than the copy on a machine whose cores the
 * client keeps busy. Larger ones go to a worker, so that the loop goes on
 * reading while a client with a small socket buffer sends the next.
 * Over TCP, a loop that finds the file busy (export write_lock) gives
 * the write to a worker too: waiting there left the socket full, and the
 * client's sending cost more than the worker. Over a Unix socket it
 * waits, as handing off did not pay there (docs/internals.md, "Threads
 * and who owns what"). */
#define SERVER_INLINE_WRITE (1u << 20)
/* Pipes one spliced payload may span: a process without CAP_SYS_RESOURCE
 * gets pipes of at most fs.pipe-max-size (1 MiB by default), and partly
 * filled pages may take more slots than the payload's size says. */
#define REQ_PIPES 4
/* What one connection may read in one turn of its loop, counting each
 * message handled as SERVER_TURN_MSG bytes, before its loop's other
 * connections, timers and signals get theirs: a client that sends cheap
 * requests, or WRITEs that run on the loop, faster than they are answered
 * would otherwise keep the loop to itself. */
#define SERVER_TURN_BYTES (4u << 20)
#define SERVER_TURN_MSG 4096u
#define SERVER_TICK_MS 200
/* After SIGTERM/SIGINT: how long requests in flight may take to be
 * answered, and clients still negotiating to leave, before the server
 * closes what is left. */
#define SERVER_STOP_GRACE_MS 5000
#define CONN_LOG_CAP 16 /* conn_log lines per connection */

struct server_config {
  const char *listen;  /* HOST:PORT, NULL for the default */
  const char *http_listen;    /* --http HOST:PORT (server/xapi.h), or NULL */
  const char *chunked_listen; /* --chunked-listen HOST:PORT, or NULL */
  const char *unix_path;
  bool read_only;
  int max_connections;  /* 0: unlimited */
  int max_inflight;     /* per connection */
  int handshake_timeout; /* seconds */
  int body_timeout;     /* seconds an xapi body may send nothing; 0: no limit */
  int threads;
  int loops;            /* event-loop threads; 0: one per CPU */
  const char *pidfile;
  const char *description; /* of every export; NULL: none */
  bool ignore_checksums;   /* images whose checksums are wrong are served */
  bool stats;
  bool zero_copy; /* --zero-copy: sendfile READ data to loopback peers too */
  enum tls_mode tls_mode;
  struct tls_server_config tls;
};

struct conn;
struct server;

/* A socket on its way to a loop: accepted, or handed over by a session
 * (server_adopt), with its TLS transport when it has one (ops NULL:
 * plain). */
struct handoff {
  int fd;
  struct transport tls;
  struct export *dflt; /* the empty name's export, or NULL (server_adopt) */
};

/* One event-loop thread and the connections it owns. */
struct sloop {
  struct server *srv;
  struct loop *loop;
  pthread_t thread;
  bool running;           /* thread started (loops[0] runs on the caller) */
  struct conn *conns;     /* this loop's connections, its thread only */
  uint64_t last_sweep_ms; /* handshake deadlines last checked */

  /* Under srv->lock. */
  int nowned;             /* connections handed here and not yet gone */
  struct handoff *handoff; /* sockets for this loop to take up */
  int nhandoff, handoff_cap;
  /* Connections a worker asked the loop to look at again (resume reading
   * after backpressure, flush, or finish closing). */
  struct conn *resume;
};

struct server {
  struct server_config cfg;
  struct export **exports; /* exports[0] is also the default export */
  int nexports;
  struct sloop *loops; /* loops[0] also owns the listeners and signals */
  int nloops;
  struct workq *workq;
  int listen_fds[SERVER_MAX_LISTEN];
  int nlisten;
  uint64_t accept_paused_ms; /* listeners off since (out of fds), or 0 */
  bool accept_starved;       /* out of fds since the last accept */
  bool swaps_unreadable;     /* loops[0]: the last look at swap failed */
  size_t pipe_max;           /* fs.pipe-max-size: largest pipe we ask for */
  bool warned_sndbuf;     /* atomic: the clipped-SO_SNDBUF warning was given */
  struct tls_creds *tls; /* NULL when cfg.tls_mode is TLS_OFF */
  bool wrote_pidfile;    /* cfg.pidfile is ours to remove at exit */
  bool bound_unix;       /* cfg.unix_path is ours to remove at exit... */
  dev_t unix_dev;        /* ...while it is still the socket we bound */
  ino_t unix_ino;
  /* Atomic: shutting down until then; 0 while serving. */
  uint64_t stop_deadline_ms;

  struct xapi *xapi;     /* the xapi listeners and sessions, or NULL */
  pthread_mutex_t lock; /* nconns, and each loop's fields marked so */
  int nconns;           /* live connections, every loop's */
};

enum conn_state {
  CS_CLIENT_FLAGS, /* reading the 4-byte client flags */
  CS_TLS_HANDSHAKE, /* after STARTTLS's ACK: the TLS handshake runs */
  CS_OPT_HDR,
  CS_OPT_DATA,
  CS_OPT_DISCARD, /* option data too large to keep: dropped as it comes */
  CS_REQ_HDR,
  CS_REQ_PAYLOAD,
  CS_REQ_DISCARD, /* WRITE payload of a request that already failed */
  CS_REQ_SPLICE,  /* WRITE payload moving socket -> the request's pipe */
  CS_REQ_PART,    /* a worker writes a piece of a long WRITE: no reading */
  CS_CLOSING,     /* no more reading; close when the last reply is out */
};

#define REQ_MAX_CHUNKS 16

/* One request in transmission. Owned by the loop while its payload is
 * read, then by one worker (or the loop: SERVER_INLINE_WRITE) while it
 * runs, then by the connection's send queue until its reply has left;
 * then it returns to the connection's free list. buf belongs to the
 * request the whole time: no one else writes it. */
struct req {
  struct work work;
  struct conn *c;
  struct wire_request r;
  uint8_t *buf;       /* WRITE payload or READ data */
  size_t buf_cap;
  uint32_t error;     /* NBD error to send, 0 for success */
  const char *errmsg; /* static text for structured error chunks */
  struct extent *ext; /* BLOCK_STATUS result, owned, grown on demand */
  int ext_cap;
  int next_count;
  size_t cost;        /* payload bytes counted in c->held, 0 if none */

  /* The reply: headers in hdr, data slices of buf, ready for writev. */
  uint8_t hdr[REQ_MAX_CHUNKS * WIRE_HOLE_CHUNK_MAX + 64];
  struct iovec iov[2 * REQ_MAX_CHUNKS + 2];
  int iovcnt;
  struct iovec *iov_cur; /* first unsent slice */
  int iov_left;
  /* A READ reply's data sent from the export's file after the iovecs
   * (sendfile(2)), when file_left > 0: see req_from_file. */
  int file_fd;        /* the export's, borrowed: see req_from_file */
  uint64_t file_off;
  size_t file_left;
  bool file_ended;    /* the file ended early: the rest goes as zeroes */
  struct req *next;   /* free list or send queue link */
  /* Splice path: the payload waits in pipes 0..pipe_cur, pipe_len[i]
   * bytes in pipe i, in payload order. npipes are open, each sized at
   * least pipe_size; they stay open, empty, for the request's next use. */
  int pipe[REQ_PIPES][2];
  size_t pipe_len[REQ_PIPES];
  unsigned npipes, pipe_cur;
  size_t pipe_size;
  bool spliced;       /* this WRITE's payload is in the pipes, not buf */
  bool on_loop;       /* this WRITE runs on the loop that read it */
  bool write_locked;  /* the loop took exp->write_lock for this WRITE */
  /* The part of the request buf holds: a WRITE's payload bytes
   * [part_off, part_off + part_len) (all of it but for a long request,
   * SERVER_MAX_UNSIZED), or the piece of a long READ being sent.
   * part_left: bytes after that part still to read (from the socket for
   * a WRITE, from the export for a READ). part_done: a worker has
   * written a WRITE's part (under c->lock). */
  uint64_t part_off;
  size_t part_len;
  uint64_t part_left;
  bool part_done;
};

struct conn {
  struct server *srv;
  struct sloop *sl;  /* the loop that owns this connection */
  struct loop *loop; /* sl->loop */
  int fd;
  struct transport t;
  char peer[80];
  struct export *dflt_export; /* the empty name's when not the first */
  bool is_tcp;
  bool loopback; /* TCP to an address of this host (sock_is_tcp_loopback) */
  enum conn_state state;
  struct tcpinfo_stats tcp; /* --stats: sampled by the loop's tick */
  uint64_t deadline_ms; /* end of the handshake time limit, 0 after it */
  /* This connection's turn in the worker pool: its requests run in
   * order, and connections take turns (workq_push_owned). */
  struct workq_owner work_owner;

  /* Input: small messages land in inbuf; large payloads are read straight
   * into the request buffer. dst/need/have describe the current target. */
  uint8_t inbuf[16384];
  size_t in_off, in_len;
  uint8_t *dst;
  size_t need, have;
  uint8_t msg[64]; /* the fixed-size message being read */
  int nlogged;     /* lines logged (atomic), to cap a flood */
  uint32_t last_refusal; /* hash of the last option refusal logged */

  /* Handshake state. */
  uint32_t cflags;
  struct wire_opt opt;
  uint8_t *opt_buf;        /* owned, the current option's data */
  uint64_t discard_left;   /* bytes still to drop (option or payload) */
  uint8_t discard_buf[4096];
  bool structured, extended, tls;
  bool tls_starting; /* STARTTLS acknowledged: TLS begins once it is out */
  bool tls_refused;  /* an option was refused for want of TLS (logged) */
  struct export *meta_export; /* last SET_META_CONTEXT's export, or NULL */
  bool meta_base_allocation;  /* base:allocation selected */
  struct export *exp;         /* after GO / EXPORT_NAME */
  bool sizes_agreed; /* GO asked NBD_INFO_BLOCK_SIZE: it keeps to them */

  /* Handshake output, flushed before reading more. Owned here. */
  uint8_t *hs_out;
  size_t hs_out_len, hs_out_cap;

  /* Transmission. cur is the request being read (loop thread only). */
  struct req *cur;

  /* Shared between the loop and workers, under lock. */
  pthread_mutex_t lock;
  int refs;             /* loop's own + one per request out of the loop
                         * + one while on sl->resume */
  int inflight;         /* requests between header and reply sent */
  bool paused;          /* EPOLLIN off: max_inflight or budget reached */
  size_t held;          /* payload bytes of requests in flight */
  size_t wait_cost;     /* parked header's payload bytes, 0 if none */
  bool dead;            /* socket unusable: drop replies */
  bool want_out;        /* EPOLLOUT armed */
  bool closing;         /* DISC seen: close after the last reply */
  bool hs_failed;       /* handshake output could not be queued */
  bool send_failed;     /* a worker saw the socket fail: loop closes */
  bool last_spliced;    /* loop only: the last WRITE payload was spliced */
  bool yielded;         /* loop only: turn ran out; the tick reads on */
  bool unacked;         /* bytes read since the last forced ACK */
  bool in_resume;       /* on sl->resume (under srv->lock) */
  struct req *sendq, *sendq_tail; /* replies waiting for the socket */
  /* A long READ whose reply has partly left and whose next piece a
   * worker is reading: nothing else may be sent until it has. Owned by
   * that worker, not by the send queue. */
  struct req *streaming;
  struct req *free_reqs;
  int nfree;

  struct conn *next, *prev;   /* sl->conns, that loop's thread only */
  struct conn *resume_next;   /* sl->resume, under srv->lock */
};

int server_run(struct server_config *cfg, char **export_args, int nexports);

/* handshake.c */
void handshake_start(struct conn *c);
/* Called when the current option's data has been read into opt_buf (or
 * discarded). Returns 0, or -1 to close the connection. */
int handshake_option(struct conn *c);
int handshake_flags(struct conn *c);
/* The option header just read announces more than SERVER_MAX_OPTION_DROP
 * bytes: answered without reading them. Returns 0 (the connection closes
 * once the answer is out), or -1 to close now. */
int handshake_option_oversized(struct conn *c);
/* Appends to the handshake output. */
void handshake_queue(struct conn *c, const void *p, size_t len);
/* How far a handshake step that waits on the socket got. */
enum hs_progress {
  HS_CLOSE = -1, /* close the connection (a failure is logged) */
  HS_WAIT = 0,   /* the rest waits for the socket */
  HS_DONE = 1,
};
/* Sends what is queued without blocking: HS_DONE when everything left,
 * HS_WAIT when the rest waits for EPOLLOUT, HS_CLOSE on error or once an
 * ABORT's answer has left. */
enum hs_progress handshake_flush(struct conn *c);
/* Drives the TLS handshake after STARTTLS: HS_DONE when it is complete,
 * HS_WAIT while it waits for the socket, HS_CLOSE when it failed
 * (logged; close). */
enum hs_progress handshake_tls_step(struct conn *c);

/* transmission.c */
/* A request header was read into c->dst. Returns 0, or -1 to close. */
int transmission_header(struct conn *c);
bool transmission_end(struct conn *c);
/* The WRITE payload (or discard) of c->cur is complete. */
int transmission_payload(struct conn *c);
/* Flushes the send queue (loop thread, EPOLLOUT). Returns -1 if dead. */
int transmission_flush(struct conn *c);
/* In CS_REQ_PART: once the worker has written the part, reading goes on
 * with the next one (or drops the rest after a failure). Loop thread.
 * Returns 0, or -1 to close. */
int transmission_part_next(struct conn *c);

/* conn.c */
void conn_expect(struct conn *c, enum conn_state s, void *dst, size_t need);
void conn_close(struct conn *c, const char *why);
void conn_put(struct conn *c);
void conn_resume(struct conn *c); /* any thread: ask the loop to look */
/* One warning line naming the client; at most CONN_LOG_CAP per connection,
 * so a hostile client, or one that keeps writing to a full disk, cannot
 * flood the log. Any thread (the count is atomic). */
void conn_log(struct conn *c, const char *fmt, ...)
  __attribute__((format(printf, 2, 3)));
/* Lines conn_log has been asked for so far on this connection. */
static inline int
conn_nlogged(struct conn *c)
{
  return __atomic_load_n(&c->nlogged, __ATOMIC_RELAXED);
}
/* Loop thread, under c->lock: sets the epoll events from the state. */
void conn_update_events(struct conn *c);
void req_destroy(struct req *q);

/* listen.c */
/* Shutting down: the stop deadline, 0 while serving. Any thread. */
uint64_t server_stopping(struct server *s);
/* For sessions outside the loops (server/xapi.c): a place under
 * --max-connections (0, or -EBUSY when full), its release, and the
 * hand-over of a socket that holds one to a loop as an NBD connection
 * (0, or -ENOMEM: the caller still owns fd and its place). tls, when not
 * NULL, is the socket's established TLS session (tls_server_start, its
 * handshake complete), whose transport the connection takes over on
 * success: the NBD handshake then runs inside it, as after STARTTLS.
 * dflt, when not NULL, is the export the empty name means on that
 * connection (the one an HTTP path named: PUT /nbd/NAME). Any thread. */
int server_take_slot(struct server *s);
void server_release_slot(struct server *s);
int server_adopt(struct server *s, int fd, const struct transport *tls,
                 struct export *dflt);
struct export *server_find_export(struct server *s, const uint8_t *name,
                                  size_t len);

/* transmission.c: a request's buffer and pipes */
void req_close_pipes(struct req *q);
int req_add_pipe(struct req *q); /* one more pipe of pipe_size */
int req_reserve(struct req *q, size_t n); /* buf of at least n bytes */

#endif
