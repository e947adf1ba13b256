/* engine_priv.h: what the files of the copy engine share, and nothing
 * outside them sees: the engine's state and a piece's.
 *
 *   engine.c     the loop that drives pieces: issue, completion, the
 *                buffer pool, the window, finishing, signals
 *   plan.c       the planner: the source's extents cut into pieces
 *   pacing.c     progress, window and connection adaptation, --rate
 *   watchdog.c   --timeout: an NBD endpoint that stopped answering
 *   checkpoint.c --checkpoint: flushing and recording what has landed;
 *                going back after a lost destination connection
 *   digest.c     hashing in offset order for sum and --verify
 *
 * Everything here runs on the loop thread, except where a function says
 * it runs on a worker. */
#ifndef NBDFLOW_COPY_ENGINE_PRIV_H
#define NBDFLOW_COPY_ENGINE_PRIV_H

#include <stdbool.h>
#include <stdint.h>
#include <xxhash.h>

#include "copy/engine.h"

#define ENG_EXT_BATCH 1024
#define ENG_EXT_CAP (4 * ENG_EXT_BATCH)
#define ENG_MAX_COPS 4096
#define ENG_ADAPT_MIN_US 100000  /* window adaptation period bounds */
#define ENG_ADAPT_MAX_US 1000000
#define ENG_RATE_TICK_MS 20 /* the tick under --rate: its pacing step */
#define ENG_DURABLE_US 10000000 /* flushes for --retry without --checkpoint */
#define ENG_PROBE_MIN (UINT64_C(256) << 20) /* smallest source probed */
#define ENG_PROBE_TURN_MAX (UINT64_C(32) << 20)

enum cop_state { COP_FREE, COP_READING, COP_READY, COP_WRITING };

/* One piece of the image on its way from source to destination. */
struct cop {
  struct engine *eng;
  enum cop_state state;
  uint64_t offset, length;
  bool zero;          /* carries no data worth writing */
  bool hashed;
  bool in_order;      /* linked in the ordering gate's list */
  bool data;          /* a data piece: charged to the window */
  bool from_file;     /* data sent straight from the file range that the
                         source mapped (file_fd at file_off), which this
                         piece borrows until release; no buf */
  int file_fd;
  uint64_t file_off;
  bool padding;       /* wop is reading the destination's last block */
  bool padded;        /* buf holds the piece up to the end of that block */
  uint8_t *buf;       /* from the pool; owned by this piece until release */
  bool own_buf;       /* buf is the opening piece's own, freed on release */
  uint64_t charge;    /* bytes counted against the window */
  uint64_t cap;       /* bytes buf can hold (0: no buf) */
  uint64_t t0_us;
  uint64_t t_sub_us;  /* when its read or write was submitted */
  bool replay;        /* written again after a lost connection: its bytes
                         were counted (and hashed) by the piece before */
  struct ep_op rop, wop;
  struct cop *prev, *next; /* gate list, or free list (next only) */
};

struct engine {
  struct ep_env *env;
  struct endpoint *src, *dst;
  const struct copy_opts *o;
  struct copy_stats *st;

  uint64_t size;        /* bytes to copy; UINT64_MAX until a pipe ends */
  uint64_t rsize, align, zero_max;
  uint64_t open_len;    /* length of the opening data piece while it is
                           still to be sent; 0 once sent or when no
                           endpoint wants one */
  uint64_t open_max;    /* the same, as set up */
  uint64_t window;
  bool adaptive;
  bool ordered;         /* pieces pass the gate in offset order */
  bool send_file;       /* data pieces the source can map skip the read:
                           the destination sends them from the source's
                           file (sendfile) */
  /* The probe (eng_probe_*): over TCP to this host, which of sendfile
   * and buffers moves data faster, and whether one connection does
   * better than several, depend on the machine and the server, so a
   * copy large enough times both ways of each, in turns, and keeps the
   * faster: the data path first, then the connections. */
  struct eng_probe {
    bool on;              /* probing: the turns set what they compare */
    bool done;            /* the data path is chosen */
    enum { ENG_PROBE_PATH = 1, ENG_PROBE_CONNS } stage;
    unsigned turn;        /* the stage's turns begun (in the data path
                             stage, 0 in the warm-up) */
    unsigned of;          /* turns planned: COPY_PROBE_TURNS, or
                             COPY_PROBE_TURNS_MAX when those were unclear */
    unsigned arm;         /* what the turn under way takes: 0 sendfile
                             (one connection), 1 buffers (every one) */
    uint64_t turn_bytes;  /* data bytes each turn issues */
    uint64_t left;        /* data bytes left in this turn */
    uint64_t lead;        /* ... before its clock starts */
    uint64_t t_turn_us;   /* when its clock started */
    uint64_t us[2];       /* the stage's turns by arm, summed */
    uint64_t worst_us[2]; /* the longest turn of each */
    unsigned path_turns;  /* the data path stage, once done: its turns */
    uint64_t path_us[2];  /* ... and times, less the longest of each */
    bool conns;           /* the destination spreads its requests: the
                             connection stage follows */
    bool conns_done;      /* the connection stage chose */
    bool all_conns;       /* ... every connection */
  } probe;
  uint32_t pad;         /* the destination's minimum block size (0: none):
                           a last piece that ends inside such a block is
                           read-modify-written (eng_needs_pad) */
  uint8_t *pad_buf;     /* pad bytes: that block as the destination has it */

  /* Planner. */
  uint64_t pos;
  struct endpoint_extent ext[ENG_EXT_CAP];
  size_t ext_head, ext_count;
  uint64_t ext_end;     /* where the known extents end */
  bool ext_pending;
  struct endpoint_extent ext_batch[ENG_EXT_BATCH];
  struct ep_op ext_op;
  bool src_eof;

  /* Pieces and buffers. */
  struct cop *cops;     /* ENG_MAX_COPS, handed out from the start as
                           needed, so untouched ones cost no pages */
  size_t cops_used;     /* cops[0..cops_used) have been handed out */
  struct cop *free_cops;
  unsigned active, data_active, zero_active;
  uint8_t **free_bufs;  /* pool of rsize buffers, owned by the engine */
  size_t nfree_bufs, nbufs, max_bufs;
  uint8_t *zero_buf;    /* read-only zeroes, shared by zero writes */
  uint64_t inflight;
  double rate_tokens;   /* --rate: bytes that may leave now (< 0: owed) */
  uint64_t rate_last_us; /* when rate_tokens was last filled; 0: never */
  unsigned src_busy, dst_busy;
  struct cop *gate_head, *gate_tail;

  /* Ordered hashing. */
  uint64_t hash_pos;
  XXH3_state_t *chunk_state;
  uint64_t chunk_fill;
  uint64_t zero_chunk_digest;

  /* Completions, collected by the done callbacks, handled by the pump. */
  struct ep_op *done_head, *done_tail;
  bool pumping;

  struct ep_op flush_op;
  bool flushing, flushed;

  /* --checkpoint (copy_opts.checkpoint): one at a time, a FLUSH of the
   * destination for the offset measured when it was sent, then the
   * callback on a worker (it syncs a file: the loop never waits for a
   * device). */
  struct ep_op ckpt_op;
  bool ckpt_busy;           /* ckpt_op is out (flush, or commit) */
  bool ckpt_committing;     /* ... and it is the commit, on a worker */
  uint64_t ckpt_below;      /* what the checkpoint under way vouches for */
  uint64_t ckpt_committed;  /* the last offset handed to checkpoint */
  uint64_t t_last_ckpt_us, t_ckpt_us;

  /* A lost destination connection (--retry): what it acknowledged but
   * no FLUSH covered may be gone (NBD promises nothing of it), so the
   * copy goes back to the last offset that a FLUSH of every connection
   * vouched for, with no loss since, and writes from there again
   * (eng_rewind). Flushes for that run every ENG_DURABLE_US when no
   * --checkpoint does them. */
  uint64_t durable;         /* below it: flushed, no connection lost since */
  uint64_t replay_end;      /* pieces issued below it are replays */
  uint64_t replayed;        /* bytes the replays wrote */
  uint64_t dst_lost_seen;   /* dst->reconnects when last looked at */
  uint64_t ckpt_lost;       /* ... when ckpt_op's FLUSH was sent */
  uint64_t flush_lost;      /* ... when flush_op was sent */
  bool ext_discard;         /* the extents in flight predate a rewind */

  int failed;
  char *err;
  size_t errlen;

  /* Progress and adaptation. */
  uint64_t t_start_us, t_last_print_us, t_last_adapt_us;
  uint64_t copied_at_last_adapt; /* data bytes: zeroes never fill a link */
  double bw_est;              /* smoothed data bytes/s, 0 before the first */
  bool window_held;           /* since the last adaptation a data piece
                                 waited for room in the window */
  uint64_t adapt_period_us;   /* 4 RTTs as eng_adapt takes them, 100 ms
                                 .. 1 s */
  bool tty;
  bool finished;
  bool stall_warned;    /* the --progress stall warning was given */
  int fd_percent;       /* last "N/100" written for --progress=FD, or -1 */
  uint64_t t_last_tcp_us; /* last TCP_INFO sample */

  /* The no-reply watchdog; index 0 is the source, 1 the destination. */
  bool watched[2];        /* NBD endpoints only */
  uint64_t t_reply_us[2]; /* last reply of each (start of the copy) */
  uint64_t t_ext_us, t_flush_us; /* submission of ext_op, flush_op */
  uint64_t t_last_watch_us;
  uint64_t t_watch_call_us; /* the watchdog's last call: a deaf loop */
  bool abandoned;         /* stopped waiting for a silent endpoint */
  uint64_t t_signal_us;   /* when a signal abandoned the run, else 0 */
};

/* What the planner says of the next piece (eng_plan). */
enum plan { PLAN_OK, PLAN_WAIT, PLAN_DONE };

static inline uint64_t
eng_min(uint64_t a, uint64_t b)
{
  return a < b ? a : b;
}

/* engine.c */

/* Records the first failure of the copy, what (e.g. "read from") of ep
 * at off and len failing with err (0: EIO) and msg (the peer's, or NULL
 * or ""); later failures are consequences and stay quiet. */
void eng_fail(struct engine *e, const char *what, const struct endpoint *ep,
              uint64_t off, uint64_t len, int err, const char *msg);
/* The done callback of the engine's own ops (ext_op, flush_op,
 * ckpt_op; arg is the engine): queues op for the pump. */
void eng_ctl_done(struct ep_op *op);
/* Ends the run (stops the loop) once nothing is left to wait for: every
 * piece done, flushed and recorded, or, after abandoning (--timeout, a
 * signal), once no local request still borrows memory. */
void eng_check_finish(struct engine *e);

/* plan.c */

/* True when a piece at off of len is the copy's last and ends inside the
 * destination's minimum block: it is read-modify-written. */
bool eng_needs_pad(const struct engine *e, uint64_t off, uint64_t len);
/* ext_op completed: its extents join the planner's table. */
void eng_extents_done(struct engine *e);
/* The next piece at e->pos: PLAN_OK with its length and whether it is a
 * zero piece, PLAN_WAIT until more extents arrive, or PLAN_DONE. May
 * send ext_op. */
enum plan eng_plan(struct engine *e, uint64_t *len, bool *zero);
/* The piece eng_plan proposed was issued: the planner moves past it. */
void eng_consume(struct engine *e, uint64_t len);

/* pacing.c */

/* --rate: whether a data piece of len may go now (its bytes are taken
 * from the bucket by the caller, once it is issued). */
bool eng_rate_allows(struct engine *e, uint64_t len);
/* Progress in the form copy_opts.progress asks for: rate-limited, or at
 * once when final. */
void eng_progress(struct engine *e, bool final);
/* A TCP_INFO sample of both endpoints (about every 200 ms), and the
 * --progress warning of stalls. */
void eng_sample_tcp(struct engine *e);
/* Window and connection count fitted to bandwidth and RTT (about every
 * 4 RTTs). */
void eng_adapt(struct engine *e);
/* Sets up the data path probe where it applies (at setup, with send_file
 * not yet set): sendfile would be taken but for a loopback destination,
 * neither path was asked for, and the copy is large enough to time. */
void eng_probe_setup(struct engine *e);
/* A data piece of len is about to be issued: moves the probe on, which
 * may switch send_file for this piece and the next. */
void eng_probe_step(struct engine *e, uint64_t len);
/* The probe's turns and choices, as far as it came, into st. */
void eng_probe_report(const struct engine *e, struct copy_stats *st);

/* watchdog.c */

/* --timeout: about every 200 ms, finds an NBD endpoint silent for
 * timeout_s with requests in flight; has it reconnect (--retry) or fails
 * the copy with ETIMEDOUT and abandons the run. */
void eng_watchdog(struct engine *e);

/* checkpoint.c */

/* Hands ckpt_below to copy_opts.checkpoint on a worker. */
void eng_ckpt_commit(struct engine *e);
/* ckpt_op completed: the FLUSH (then the commit starts) or the commit. */
void eng_ckpt_done(struct engine *e);
/* About every checkpoint_us (ENG_DURABLE_US for --retry alone) while
 * the copy runs: starts a checkpoint when more has landed than was last
 * recorded. */
void eng_checkpoint(struct engine *e);
/* When the destination reconnected (--retry) since the engine last
 * looked, the copy goes back to e->durable (see struct engine), or fails
 * when its source cannot be read again. True when it went back. */
bool eng_rewind_if_lost(struct engine *e);
/* A FLUSH sent when dst->reconnects was `lost` vouches for what it was
 * sent for only if no connection was lost since. */
bool eng_flush_vouches(const struct engine *e, uint64_t lost);

/* digest.c */

/* Piece c passes the gate: its bytes (c->buf, or zeroes) join the
 * digests. */
void eng_hash_piece(struct engine *e, struct cop *c);
/* At the end of the run: the last, partial chunk's digest. */
void eng_finish_chunks(struct engine *e);

#endif
