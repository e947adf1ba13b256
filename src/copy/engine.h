/* engine.h: the pipelined copy engine.
 *
 * The planner walks the source's extents and cuts them into pieces: data
 * pieces of at most the request size on a grid of that size, and zero
 * pieces. Each data piece takes a buffer from the pool, which then
 * belongs to that piece alone until the destination has acknowledged the
 * write (or the copy failed): no other piece can overwrite it. Pieces are
 * issued while the bytes in flight stay within the window.
 *
 * Progress counts bytes whose write has completed, never bytes issued.
 * Any failure stops issuing; the pieces already in flight are awaited,
 * and copy_run returns -errno with one line describing the first failure.
 * An NBD endpoint that stays silent for timeout_s is not awaited: its
 * requests are abandoned (their buffers freed, the connections left to
 * endpoint_close, which must follow before the loop runs again).
 *
 * When a hash is wanted (sum, verify), pieces pass an ordering gate after
 * their read: they are hashed in offset order, holes as zeroes without
 * being read. */
#ifndef NBDFLOW_COPY_ENGINE_H
#define NBDFLOW_COPY_ENGINE_H

#include <stdbool.h>
#include <stdint.h>

#include "copy/endpoint.h"
#include "net/tls.h"
#include "util/hash.h"

/* Defaults and limits (documented in docs/copy.md and
 * docs/copy-engine.md). */
#define COPY_DEFAULT_REQUEST (512u << 10)
#define COPY_WINDOW_FLOOR_REQUESTS 8      /* adaptive window floor */
#define COPY_WINDOW_CAP (UINT64_C(256) << 20) /* adaptive window cap */
#define COPY_PROBE_TURNS 8 /* data path probe: S B B S B S S B */
#define COPY_PROBE_TURNS_MAX 16 /* ... then B S S B S B B S when unclear */
#define COPY_MAX_ZERO_INFLIGHT 16
#define COPY_CHUNK (UINT64_C(4) << 20)    /* verify digest granularity */
/* --progress warns once the share of TCP_INFO samples that stalled (a
 * sub-MSS payload unsent while data is unacked) passes this, in percent,
 * over at least COPY_STALL_WARN_SAMPLES samples (~200 ms apart). */
#define COPY_STALL_WARN_PCT 5.0
#define COPY_STALL_WARN_SAMPLES 10
/* --timeout default and largest value, seconds (copy_opts.timeout_s). */
#define COPY_DEFAULT_TIMEOUT 60
#define COPY_MAX_TIMEOUT 1000000

/* FD: nbdcopy's --progress=FD, "N/100" lines on copy_opts.progress_fd. */
enum copy_progress { COPY_PROGRESS_NONE, COPY_PROGRESS_BAR,
                     COPY_PROGRESS_JSON, COPY_PROGRESS_FD };

/* Per-chunk digests of a stream, for --verify: one XXH3-64 per COPY_CHUNK
 * bytes. */
struct copy_chunks {
  uint64_t *d;
  uint64_t n, cap;
};

/* The largest fixed window (--inflight): 64 times the adaptive cap. A
 * larger one could only fail to allocate its bookkeeping. */
#define COPY_INFLIGHT_MAX (16ull << 30)

struct copy_opts {
  uint64_t request_size; /* 0: automatic */
  uint64_t inflight;     /* bytes; 0: adaptive */
  uint64_t max_bytes;    /* copy at most this much of src; 0: all */
  bool allocated;        /* write every byte, zeroes included */
  bool dst_is_zero;      /* destination already reads as zeroes */
  bool no_flush;
  bool no_zero_detect;   /* data that reads as zeroes is still written */
  bool no_extents;       /* read the whole source, ignoring its extents */
  bool no_zero_copy;     /* always read into buffers (zero detection on
                            all data); else file -> plain NBD uses
                            sendfile */
  bool zero_copy;        /* sendfile over TCP to a loopback address too,
                            where the data path probe chooses otherwise */
  unsigned max_requests; /* data and zero requests in flight at most,
                            over all connections; 0: no limit */
  unsigned request_limit; /* the same as a tuning limit (nbdcopy's -R),
                             which keeps the opening request; 0: none */
  uint64_t rate;         /* --rate: data bytes a second at most, over all
                            connections; 0: no limit */
  unsigned timeout_s;    /* an NBD endpoint with requests in flight that
                            answers none of them for this long fails the
                            copy with ETIMEDOUT; 0: wait forever */
  enum copy_progress progress;
  int progress_fd;       /* COPY_PROGRESS_FD only */
  const char *label;     /* progress label, e.g. "copy" or "verify" */
  struct hash_ctx *hash; /* whole-stream digest of the source, or NULL */
  struct copy_chunks *chunks; /* per-chunk digests to record, or NULL */
  /* Where the data is: each block of data_map_block bytes in which a
   * piece read held a non-zero byte gets its bit set in data_map (LSB
   * first; the caller's, with a bit for every block of the source). A
   * format writer that leaves its tables first walks the source with it
   * before the copy (dst NULL). NULL: not kept. */
  uint8_t *data_map;
  uint32_t data_map_block;
  /* A resumed copy (--checkpoint): every byte below start has landed
   * already; the copy begins there. A multiple of COPY_CHUNK, so that
   * chunks (kept from start on, the first for [start, start +
   * COPY_CHUNK)) join those of the part before. */
  uint64_t start;
  /* --checkpoint: about every checkpoint_us the destination is flushed
   * (where it can be), then checkpoint(arg, below) is told an offset
   * below which every byte has been acknowledged before that flush, a
   * multiple of COPY_CHUNK or the size; and once more with the size
   * after the final flush. Called on the loop thread; it may block
   * briefly (an fsync). Returns 0, or -errno with a sentence in err to
   * fail the copy. NULL: none. */
  int (*checkpoint)(void *arg, uint64_t below, char *err, size_t errlen);
  void *checkpoint_arg;
  uint64_t checkpoint_us;
};

struct copy_stats {
  uint64_t total;         /* bytes of the image */
  uint64_t done;          /* completed bytes (written, zeroed or skipped) */
  uint64_t copied;        /* written as data */
  uint64_t zeroed;        /* written as zeroes (WRITE_ZEROES, punch) */
  uint64_t skipped;       /* needed no write at all */
  uint64_t resumed;       /* landed in an earlier run (copy_opts.start),
                             counted in done too */
  uint64_t reconnects;    /* --retry: reconnections of both endpoints */
  uint64_t resent;        /* --retry: WRITE bytes sent a second time */
  uint64_t requests;
  double seconds;
  uint64_t request_size;
  uint64_t opening_request; /* length of the opening piece, 0: none */
  uint64_t window;        /* final in-flight byte limit */
  uint64_t peak_inflight; /* most bytes in flight at once */
  unsigned peak_depth;    /* most data requests in flight at once */
  unsigned src_connections, dst_connections;
  const char *data_path;  /* "buffer" or "sendfile"; "mixed" when the
                             data path probe was cut short */
  /* The data path probe (TCP to this host; docs/copy-engine.md): turns
   * timed, of probe_turn_bytes each, and their summed time by path. */
  bool probed;            /* the probe ran (it may have been cut short) */
  unsigned probe_turns;   /* turns timed, of probe_of */
  unsigned probe_of;      /* COPY_PROBE_TURNS, or _MAX once extended */
  uint64_t probe_turn_bytes;
  uint64_t probe_us[2];   /* [0] sendfile, [1] buffers; with all turns
                             timed, less the longest turn of each */
  /* Its connection stage, after the data path: the same for every
   * connection ([0]) and one ([1]). */
  bool conn_probed;       /* the stage ran (it may have been cut short) */
  unsigned conn_probe_turns, conn_probe_of;
  uint64_t conn_probe_us[2];
  const char *conn_choice; /* "all", "one", or "mixed" (cut short) */
  char tcp_json[1024];    /* TCP diagnostics of the NBD side, or "" */
  /* the same per connection (an array), or "": room for
   * ENDPOINT_MAX_CONNECTIONS entries of about 750 bytes */
  char tcp_json_each[24576];
  double stall_pct;       /* of the NBD side's samples; -1 without TCP */
  /* What TLS each side negotiated (endpoint_ops.tls), as the copy
   * ended: on is false for a side without TLS. */
  struct copy_tls {
    bool on;
    bool uniform;        /* every connection of the side agreed */
    struct tls_params p; /* the first connection's; static strings */
  } src_tls, dst_tls;
};

/* Copies src to dst (dst NULL: read and hash only). Returns 0, or -errno
 * with the first failure described in err. */
int copy_run(struct ep_env *env, struct endpoint *src, struct endpoint *dst,
             const struct copy_opts *o, struct copy_stats *st, char *err,
             size_t errlen);

void copy_chunks_free(struct copy_chunks *c);

/* The signal (SIGINT, SIGTERM) that stopped the last copy_run with
 * -EINTR, else 0. Commands exit with 128 + it, as a shell would. */
int copy_signal(void);

/* Parses a --timeout value: whole seconds, 0 to COPY_MAX_TIMEOUT.
 * Returns 0, or -1 (nothing written, the error logged) when s is not
 * one. */
int copy_timeout_parse(const char *s, unsigned *out);

#endif
