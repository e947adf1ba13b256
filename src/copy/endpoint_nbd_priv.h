/* endpoint_nbd_priv.h: what the two files of the NBD endpoint share.
 *
 *   endpoint_nbd.c        the request path (submit, replies, FLUSH on
 *                         every connection, zeroing in pieces), the
 *                         connections and their connect threads, TCP
 *                         figures, opening
 *   endpoint_nbd_retry.c  --retry (parking ops, dropping and
 *                         reconnecting, checking it is the same export)
 *                         and --retry-errors (holding ops for another
 *                         try)
 *
 * Everything runs on the loop thread unless a function says otherwise. */
#ifndef NBDFLOW_COPY_ENDPOINT_NBD_PRIV_H
#define NBDFLOW_COPY_ENDPOINT_NBD_PRIV_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "client/client.h"
#include "copy/endpoint.h"
#include "net/tcpinfo.h"
#include "net/tls.h"
#include "util/uri.h"

#define NBD_STATUS_BATCH 1024

struct nbd_connect_job;

struct nbd_slot {
  struct client_conn c;
  struct endpoint *e;
  bool live;       /* connected and in the loop: only then is c ours */
  bool registered;
  bool want_out; /* EPOLLOUT currently requested */
  bool tcp;
  struct tcpinfo_stats ti; /* sampled on the loop thread */
  bool has_tls;            /* tls holds what the connection negotiated */
  struct tls_params tls;   /* taken when it joins the loop (static strings,
                              so it outlives the session) */
};

struct nbd_priv {
  struct nbd_uri uri;
  struct client_opts co;  /* read by connecting threads */
  struct tls_creds *tls; /* co.tls_creds: every connection's */
  struct ep_http *http;  /* an http(s) URL's PUT and TLS, owned; or NULL */
  unsigned n;             /* slots allocated (the most connections) */
  unsigned started;       /* slots in use: the first, plus jobs started */
  struct nbd_slot *slots;
  struct nbd_connect_job *jobs; /* one per slot; [0] unused */
  unsigned connecting;    /* jobs not yet joined */
  uint64_t conn_bytes;    /* in flight one connection can carry; 0 when
                             the count is fixed */
  bool closing;           /* late failures are no news any more */
  bool no_fast_zero;      /* FAST_ZERO was refused once: stop trying */
  uint64_t zero_cap;      /* largest WRITE_ZEROES once one longer than
                             the maximum payload was refused; 0: none */
  struct client_extent status[NBD_STATUS_BATCH]; /* the one EXTENTS op */
  uint64_t status_span;   /* longest BLOCK_STATUS to ask for now (0: not
                             yet set; see client_status_span) */
  struct client_req *flush_reqs; /* one per connection */
  struct ep_op *flush_op;
  unsigned flush_pending;
  int flush_err;
  bool flush_lost;        /* a connection died under it (--retry) */

  /* --retry. A connection lost to its transport parks the ops it carried
   * (and every op submitted meanwhile) on `parked`; the next tick drops
   * every connection, and reconnection attempts run on jobs[0], the
   * first after retry_delay_ms, each next one after twice the wait.
   * Once slot 0 is back (same export, same sample), the parked ops go
   * out again and the other connections are started anew. */
  unsigned retry_max;     /* attempts in a row without a reply; 0: off */
  unsigned retry_delay_ms;
  unsigned attempts;      /* made since the last reply */
  bool reconnecting;
  bool drop_pending;      /* the connections are still to be dropped */
  bool gave_up;           /* no more attempts: failures are final */
  uint64_t retry_at_us;   /* when the next attempt starts */
  struct ep_op *parked, *parked_tail; /* owned by the engine, held here */
  bool flush_parked;      /* flush_op waits among them */
  unsigned first_conns;   /* connections to start at once (at open) */
  bool auto_conns;        /* the count is ours (no --connections) */
  unsigned spread;        /* new requests go to the first `spread` live
                             connections; 0: to all (endpoint_ops.spread) */
  int lost_err;           /* why the last connection was lost */
  char lost_msg[256];
  /* --retry-errors: ops whose error reply is worth another try, held
   * until again_at_us (the latest wait any of them asked for). */
  bool retry_errors;
  struct ep_op *again, *again_tail; /* owned by the engine, held here */
  uint64_t again_at_us;
  int again_logged;       /* their warnings (log_take, NBD_AGAIN_LOG_MAX) */
  struct client_info info0; /* the export as first seen (scalars only) */
  bool sampled;           /* sample_digest holds the source's sample */
  uint64_t sample_digest;
};

/* The connections after the first connect on threads of their own while
 * the copy already runs on the first: on a 50 ms link each handshake
 * costs 3 round trips, 150 ms that the first connection now spends
 * sending. The loop thread joins a finished connection the next time it
 * picks one for a request; a connection that fails to join is dropped
 * with a warning, and the copy goes on with the others. */
struct nbd_connect_job {
  struct nbd_slot *s;
  struct nbd_priv *p;
  struct client_opts co; /* p->co, plus this job's socket hook */
  int r;
  bool sample;       /* reconnecting a source: read its sample too */
  uint64_t digest;   /* the sample's digest, when sample and r == 0 */
  pthread_t thread;
  bool started;      /* thread created, not yet joined */
  atomic_bool done;  /* set by the thread as its last act */
  /* The socket while its handshake runs, else -1: close shuts it down to
   * abandon a handshake that a silent server would hold for 30 s. */
  pthread_mutex_t lock;
  int fd;
  bool cancel; /* close came: shut down any socket published from now */
};
/* endpoint_nbd.c */

int ep_nbd_submit(struct endpoint *e, struct ep_op *op);
/* FLUSH goes to every live connection (parked while reconnecting). */
int ep_nbd_submit_flush(struct endpoint *e, struct ep_op *op);
/* Puts a connected slot into the loop. Returns 0, or -errno. */
int ep_nbd_register(struct endpoint *e, struct nbd_slot *s);
/* Abandons the connects still running and joins every connect thread. */
void ep_nbd_join_all(struct endpoint *e);
/* Starts a thread that connects slot i (and, with sample, reads the
 * source's sample). False when no thread could be made. */
bool ep_nbd_job_start(struct endpoint *e, unsigned i, bool sample);
/* Starts the connect jobs of slots started .. upto-1. */
void ep_nbd_start_jobs(struct endpoint *e, unsigned upto);
/* Sleeps us on a connect job's thread (j NULL: the opening one); false,
 * at once, when the job is cancelled. */
bool ep_nbd_job_sleep(struct nbd_connect_job *j, uint64_t us);

/* endpoint_nbd_retry.c */

/* A failure (err, on connection c) that --retry may undo by
 * reconnecting. */
bool ep_nbd_retryable(const struct nbd_priv *p, const struct client_conn *c,
                      int err);
/* An error reply (err to op on s) that --retry-errors sends again. */
bool ep_nbd_error_retryable(const struct nbd_priv *p, const struct nbd_slot *s,
                            const struct ep_op *op, int err);
/* Holds op, whose reply was err (msg), until its wait has passed. */
void ep_nbd_hold_error(struct endpoint *e, struct ep_op *op, int err,
                       const char *msg);
/* Holds op until the endpoint has reconnected. */
void ep_nbd_park(struct endpoint *e, struct ep_op *op);
/* A connection was lost (err, why): schedules the reconnection. */
void ep_nbd_lost(struct endpoint *e, int err, const char *why);
/* Reads and hashes a source's sample, blocking (j: the connect job it
 * runs on, or NULL). Returns 0, or -errno with c->errmsg set. */
int ep_nbd_read_sample(const struct nbd_priv *p, struct nbd_connect_job *j,
                       struct client_conn *c, uint64_t *digest);
/* endpoint_ops.tick: sends held ops again, drives a reconnection. */
void ep_nbd_tick(struct endpoint *e);
/* endpoint_ops.lost: the engine's watchdog found the server silent. */
int ep_nbd_lost_op(struct endpoint *e, const char *why);

#endif
