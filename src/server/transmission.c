/* transmission.c: requests and replies (§Transmission).
 *
 * Over 1000 lines on purpose: it is one request's whole life (checks,
 * dispatch, the backend call, the reply in each of the three reply forms,
 * sending), and the steps share the request's states; the byte layouts
 * are in proto/wire.c, the reading in conn.c.
 *
 * A request's life: the loop reads and checks its header (and a WRITE's
 * payload), dispatches it to a worker, the worker runs it against the
 * backend and builds the reply in the request itself (headers in q->hdr,
 * data as slices of q->buf), then req_send writes it, or queues it for
 * the loop when the socket is full. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sys/sendfile.h>
#include <unistd.h>

#include "server.h"
#include "net/sock.h"
#include "util/log.h"

#define BS_MAX_EXTENTS 2048 /* descriptors in one BLOCK_STATUS reply */

/* READ data past the end of a file that shrank while it was being sent. */
static const uint8_t req_zeroes[64 << 10];


/* ---- request objects ---- */

static struct req *
req_get(struct conn *c)
{
  pthread_mutex_lock(&c->lock);
  struct req *q = c->free_reqs;
  if (q) {
    c->free_reqs = q->next;
    c->nfree--;
  }
  pthread_mutex_unlock(&c->lock);
  if (q == NULL) {
    q = calloc(1, sizeof *q);
    if (q == NULL)
      return NULL;
  }
  q->spliced = q->on_loop = q->write_locked = false;
  q->file_left = 0;
  q->file_ended = false;
  q->cost = 0;
  q->part_off = q->part_left = 0;
  q->part_len = 0;
  q->part_done = false;
  q->c = c;
  q->error = 0;
  q->errmsg = NULL;
  q->next = NULL;
  return q;
}

int
req_reserve(struct req *q, size_t n)
{
  if (n <= q->buf_cap)
    return 0;
  free(q->buf);
  q->buf = malloc(n);
  q->buf_cap = q->buf ? n : 0;
  return q->buf ? 0 : -ENOMEM;
}

/* ---- building replies ---- */

static void
reply_iov(struct req *q, void *p, size_t n)
{
  q->iov[q->iovcnt].iov_base = p;
  q->iov[q->iovcnt].iov_len = n;
  q->iovcnt++;
}

static void
reply_error(struct req *q)
{
  struct conn *c = q->c;
  q->iovcnt = 0;
  /* After structured replies, READ and BLOCK_STATUS must be answered in
   * chunks, errors included; an error chunk also carries a message. */
  bool chunked = q->r.type == NBD_CMD_READ ||
                 q->r.type == NBD_CMD_BLOCK_STATUS;
  if (c->extended || (c->structured && chunked)) {
    const char *m = q->errmsg ? q->errmsg : "";
    uint16_t ml = (uint16_t)strlen(m);
    reply_iov(q, q->hdr,
              wire_encode_error_chunk(q->hdr, c->extended,
                                      NBD_REPLY_FLAG_DONE, q->r.cookie,
                                      q->r.offset, q->error, m, ml));
    return;
  }
  reply_iov(q, q->hdr, wire_encode_simple_reply(q->hdr, q->r.cookie,
                                                 q->error));
}

static void
reply_ok(struct req *q)
{
  struct conn *c = q->c;
  q->iovcnt = 0;
  if (c->extended)
    reply_iov(q, q->hdr,
              wire_encode_none_chunk(q->hdr, true, q->r.cookie,
                                     q->r.offset));
  else
    reply_iov(q, q->hdr, wire_encode_simple_reply(q->hdr, q->r.cookie, 0));
}

static void
req_fail(struct req *q, int err, const char *msg)
{
  q->error = wire_errno_to_nbd(err);
  q->errmsg = msg;
}

/* Whether this READ's data may leave straight from the export's page
 * cache (sendfile(2)) instead of being read into buf and copied again
 * into the socket: a file on tmpfs or ramfs whose pages are in memory,
 * so that sending never waits for a device even on the loop, over the
 * plain transport (TLS must encrypt in user space). The header is sent
 * before the data is read, so a file that fails then costs the
 * connection, not just the request (a file in memory does not fail); one
 * that another process cut short sends zeroes for what it lost. A reply
 * built before swap came on may still finish from the loop. The backend's
 * map says where [off, off + len) lies (one to one for a raw file, a data
 * block for an image); a range it cannot place whole is read instead.
 * Not to a TCP peer on this host unless --zero-copy asks: there the
 * loop's sendfile of a 512 KiB reply took longer than a worker's pread
 * into a buffer and the loop's send of it, which run in parallel (a
 * 1 GiB read from tmpfs took 0.74x the time for qemu-img, 0.77x for
 * nbdflow copy). Sets q->file_fd and q->file_off. */
static bool
req_from_file(struct req *q, uint64_t off, uint64_t len)
{
  struct conn *c = q->c;
  struct export *e = c->exp;
  int fd;
  uint64_t host, run;
  if (e->ops->map == NULL || c->t.ops != &transport_plain_ops ||
      (c->loopback && !c->srv->cfg.zero_copy) ||
      !__atomic_load_n(&e->write_in_memory, __ATOMIC_RELAXED) ||
      e->ops->map(e, off, len, &fd, &host, &run) < 0 || run < len)
    return false;
  q->file_fd = fd;
  q->file_off = host;
  return true;
}

/* Worker: the buffer a READ's data is read into; false (the error reply
 * built) when there is no memory for it. */
static bool
req_read_buf(struct req *q)
{
  if (req_reserve(q, q->r.length) == 0)
    return true;
  conn_log(q->c, "export \"%s\": READ offset %llu length %llu: no memory "
           "for the data", q->c->exp->name,
           (unsigned long long)q->r.offset, (unsigned long long)q->r.length);
  req_fail(q, ENOMEM, "out of memory");
  reply_error(q);
  return false;
}

/* Keeps the first n extents a backend gave within len bytes, cutting the
 * one that crosses it; returns how many are left. The backends promise
 * no more than the range (export.h), but the data is read into a buffer
 * of len bytes and the lengths go out as 32-bit fields: a backend that
 * broke the promise must not write past either. */
static int
extents_clip(struct extent *ext, int n, uint64_t len)
{
  uint64_t sum = 0;
  for (int i = 0; i < n; i++) {
    if (ext[i].length > len - sum)
      ext[i].length = len - sum;
    sum += ext[i].length;
    if (ext[i].length == 0 || sum == len)
      return ext[i].length == 0 ? i : i + 1;
  }
  return n;
}

/* Structured READ: one chunk per data or zero extent (§NBD_CMD_READ). */
static void
read_structured(struct req *q)
{
  struct conn *c = q->c;
  struct export *e = c->exp;
  struct extent ext[REQ_MAX_CHUNKS];
  uint64_t len = q->r.length, off = q->r.offset;
  int n = 0;

  if (len == 0) {
    q->iovcnt = 0;
    reply_iov(q, q->hdr, wire_encode_none_chunk(q->hdr, c->extended,
                                                q->r.cookie, off));
    return;
  }
  if (!(q->r.flags & NBD_CMD_FLAG_DF))
    n = e->ops->extents(e, off, len, ext, REQ_MAX_CHUNKS - 1);
  if (n <= 0)
    n = 0;
  n = extents_clip(ext, n, len);
  /* Cover the whole range: what the map did not describe is data. */
  uint64_t covered = 0;
  for (int i = 0; i < n; i++) {
    ext[i].flags = (ext[i].flags & NBD_STATE_ZERO) ? NBD_STATE_ZERO : 0;
    covered += ext[i].length;
  }
  if (covered < len)
    ext[n++] = (struct extent){ .length = len - covered, .flags = 0 };

  /* One data extent from a file in memory: its chunk's data leaves from
   * the file after the header, and nothing is read here. */
  bool from_file = n == 1 && ext[0].flags == 0 && req_from_file(q, off, len);
  if (!from_file && !req_read_buf(q))
    return;
  uint64_t rel = 0;
  for (int i = 0; i < n; rel += ext[i].length, i++) {
    if (ext[i].flags || from_file)
      continue;
    int r = e->ops->pread(e, q->buf + rel, ext[i].length, off + rel);
    if (r < 0) {
      conn_log(c, "export \"%s\": READ offset %llu length %llu: %s", e->name,
               (unsigned long long)(off + rel),
               (unsigned long long)ext[i].length, strerror(-r));
      req_fail(q, -r, "read failed");
      reply_error(q);
      return;
    }
  }
  q->iovcnt = 0;
  uint8_t *h = q->hdr;
  rel = 0;
  for (int i = 0; i < n; rel += ext[i].length, i++) {
    uint16_t done = i == n - 1 ? NBD_REPLY_FLAG_DONE : 0;
    uint8_t *start = h;
    if (ext[i].flags) {
      h += wire_encode_hole_chunk(h, c->extended, done, q->r.cookie, off,
                                  off + rel, (uint32_t)ext[i].length);
      reply_iov(q, start, (size_t)(h - start));
    } else {
      h += wire_encode_data_chunk(h, c->extended, done, q->r.cookie, off,
                                  off + rel, ext[i].length);
      reply_iov(q, start, (size_t)(h - start));
      if (from_file) {
        q->file_left = len; /* file_fd at file_off: req_from_file's */
        q->file_ended = false;
      } else {
        reply_iov(q, q->buf + rel, ext[i].length);
      }
    }
  }
}

/* Worker: reads the next piece of a READ longer than SERVER_MAX_PAYLOAD
 * (SERVER_MAX_UNSIZED) into buf, at part_off, and builds what of the
 * reply goes with it. Simple replies, and chunked ones with DF, are one
 * header for the whole length (sent with the first piece) and data
 * piece after piece: a piece that fails after the header has left can
 * only cut the connection, as §Simple reply message says of a simple
 * READ. Without DF, each piece is a data chunk of its own, and one that
 * fails ends the reply with an error chunk. */
static void
read_long_part(struct req *q)
{
  struct conn *c = q->c;
  struct export *e = c->exp;
  bool first = q->part_off == 0;
  bool chunks = c->structured && !(q->r.flags & NBD_CMD_FLAG_DF);
  uint64_t left = q->r.length - q->part_off;
  size_t len = left < SERVER_PIECE ? (size_t)left : SERVER_PIECE;
  uint64_t off = q->r.offset + q->part_off;

  q->part_len = len;
  q->part_left = left - len;
  q->iovcnt = 0;
  int r = req_reserve(q, SERVER_PIECE) < 0 ? -ENOMEM
          : e->ops->pread(e, q->buf, len, off);
  if (r < 0) {
    q->part_left = 0;
    if (first || chunks) {
      conn_log(c, "export \"%s\": READ offset %llu length %zu: %s", e->name,
               (unsigned long long)off, len, strerror(-r));
      req_fail(q, -r, "read failed");
      reply_error(q);
      return;
    }
    conn_log(c, "export \"%s\": READ offset %llu length %zu: %s; the "
             "reply's header has left, so the connection is cut", e->name,
             (unsigned long long)off, len, strerror(-r));
    pthread_mutex_lock(&c->lock);
    c->send_failed = true; /* the loop closes: req_send resumes it */
    pthread_mutex_unlock(&c->lock);
    return;
  }
  uint8_t *h = q->hdr;
  if (chunks) {
    uint16_t done = q->part_left == 0 ? NBD_REPLY_FLAG_DONE : 0;
    h += wire_encode_data_chunk(h, c->extended, done, q->r.cookie,
                                q->r.offset, off, len);
  } else if (first && c->structured) {
    h += wire_encode_data_chunk(h, c->extended, NBD_REPLY_FLAG_DONE,
                                q->r.cookie, q->r.offset, off, q->r.length);
  } else if (first) {
    h += wire_encode_simple_reply(h, q->r.cookie, 0);
  }
  if (h > q->hdr)
    reply_iov(q, q->hdr, (size_t)(h - q->hdr));
  reply_iov(q, q->buf, len);
}

static void
run_read(struct req *q)
{
  struct conn *c = q->c;
  struct export *e = c->exp;

  if (q->r.length > SERVER_MAX_PAYLOAD && c->structured &&
      (q->r.flags & NBD_CMD_FLAG_DF)) {
    /* One content chunk would have to announce DONE before the pieces
     * after it were read, and a failed piece could then only cut the
     * connection: refused up front, as the spec allows for DF. */
    req_fail(q, EOVERFLOW, "a read this long cannot be sent unfragmented");
    reply_error(q);
    return;
  }
  if (q->r.length > SERVER_MAX_PAYLOAD) {
    read_long_part(q);
    return;
  }
  if (c->structured) {
    read_structured(q);
    return;
  }
  if (q->r.length > 0 && req_from_file(q, q->r.offset, q->r.length)) {
    reply_ok(q);
    q->file_left = q->r.length;
    q->file_ended = false;
    return;
  }
  if (!req_read_buf(q))
    return;
  int r = q->r.length ? e->ops->pread(e, q->buf, q->r.length, q->r.offset)
                       : 0;
  if (r < 0) {
    conn_log(c, "export \"%s\": READ offset %llu length %llu: %s", e->name,
             (unsigned long long)q->r.offset,
             (unsigned long long)q->r.length, strerror(-r));
    req_fail(q, -r, "read failed");
    reply_error(q);
    return;
  }
  reply_ok(q);
  reply_iov(q, q->buf, q->r.length);
}

static void
run_block_status(struct req *q)
{
  struct conn *c = q->c;
  struct export *e = c->exp;
  int max = (q->r.flags & NBD_CMD_FLAG_REQ_ONE) ? 1 : BS_MAX_EXTENTS;

  if (q->ext_cap < max) {
    free(q->ext);
    q->ext = malloc((size_t)max * sizeof *q->ext);
    q->ext_cap = q->ext ? max : 0;
  }
  if (q->ext == NULL ||
      req_reserve(q, wire_status_len(c->extended, (size_t)max)) < 0) {
    req_fail(q, ENOMEM, "out of memory");
    reply_error(q);
    return;
  }
  int n = e->ops->extents(e, q->r.offset, q->r.length, q->ext, max);
  if (n > 0)
    n = extents_clip(q->ext, n, q->r.length);
  if (n <= 0) {
    conn_log(c, "export \"%s\": BLOCK_STATUS offset %llu: %s", e->name,
             (unsigned long long)q->r.offset, strerror(n < 0 ? -n : EIO));
    req_fail(q, n < 0 ? -n : EIO, "block status failed");
    reply_error(q);
    return;
  }
  int m = 0; /* merge equal neighbours */
  for (int i = 1; i < n; i++) {
    if (q->ext[i].flags == q->ext[m].flags)
      q->ext[m].length += q->ext[i].length;
    else
      q->ext[++m] = q->ext[i];
  }
  n = m + 1;
  /* The context id is the one SET_META_CONTEXT gave. */
  size_t plen = wire_encode_status_head(q->buf, c->extended, 1, (uint32_t)n);
  for (int i = 0; i < n; i++)
    plen += wire_encode_status_desc(q->buf + plen, c->extended,
                                    q->ext[i].length, q->ext[i].flags);
  q->iovcnt = 0;
  reply_iov(q, q->hdr,
            wire_encode_chunk(q->hdr, c->extended, NBD_REPLY_FLAG_DONE,
                              c->extended ? NBD_REPLY_TYPE_BLOCK_STATUS_EXT
                                          : NBD_REPLY_TYPE_BLOCK_STATUS,
                              q->r.cookie, q->r.offset, plen));
  reply_iov(q, q->buf, plen);
}

/* Worker (or loop): writes a spliced payload, pipe after pipe, and leaves
 * every pipe empty whatever happens (the request reuses them). FUA goes
 * with the last piece, whose flush covers them all. */
static int
req_splice_out(struct req *q, bool fua)
{
  struct export *e = q->c->exp;
  uint64_t off = q->r.offset;
  int r = 0;
  for (unsigned i = 0; i <= q->pipe_cur; i++) {
    size_t len = q->pipe_len[i];
    q->pipe_len[i] = 0;
    if (r < 0) { /* an earlier piece failed: just empty this pipe */
      sock_pipe_drain(q->pipe[i][0]);
      continue;
    }
    r = e->ops->splice_in(e, q->pipe[i][0], len, off, fua &&
                          i == q->pipe_cur);
    off += len;
  }
  return r;
}

/* A WRITE, under the export's write_lock when its file is in memory:
 * taken here by a worker, or already by the loop that runs it over TCP
 * (write_locked); over a Unix socket the loop writes without it
 * (SERVER_INLINE_WRITE). */
static int
run_write(struct req *q, bool fua)
{
  struct export *e = q->c->exp;
  bool lock = e->write_serial && !q->write_locked && !q->on_loop;
  int r;

  if (lock)
    pthread_mutex_lock(e->write_serial);
  if (q->spliced)
    r = req_splice_out(q, fua);
  else
    r = e->ops->pwrite(e, q->buf, q->part_len, q->r.offset + q->part_off,
                       fua);
  if (lock || q->write_locked)
    pthread_mutex_unlock(e->write_serial);
  q->write_locked = q->on_loop = false;
  return r;
}

/* Runs the write-type commands, FLUSH and CACHE; returns 0 or -errno. */
static int
run_simple(struct req *q)
{
  struct export *e = q->c->exp;
  const struct wire_request *r = &q->r;
  bool fua = r->flags & NBD_CMD_FLAG_FUA;

  switch (r->type) {
  case NBD_CMD_WRITE:
    if (fua && q->part_off > 0) {
      /* The last piece of a long WRITE: the earlier ones went without
       * FUA, and a write-through of this one would leave them out. */
      int rc = run_write(q, false);
      return rc < 0 ? rc : e->ops->flush(e);
    }
    return run_write(q, fua);
  case NBD_CMD_FLUSH:
    return e->ops->flush(e);
  case NBD_CMD_TRIM:
    return e->ops->trim(e, r->length, r->offset, fua);
  case NBD_CMD_CACHE:
    return e->ops->cache(e, r->length, r->offset);
  case NBD_CMD_WRITE_ZEROES:
    return e->ops->zero(e, r->length, r->offset,
                        !(r->flags & NBD_CMD_FLAG_NO_HOLE),
                        r->flags & NBD_CMD_FLAG_FAST_ZERO, fua);
  default:
    return -EINVAL;
  }
}

static void req_send(struct req *q);

static void
req_run(struct work *w)
{
  struct req *q = (struct req *)w;
  struct export *e = q->c->exp;

  if (q->r.type == NBD_CMD_READ) {
    run_read(q);
  } else if (q->r.type == NBD_CMD_BLOCK_STATUS) {
    run_block_status(q);
  } else {
    int r = run_simple(q);
    if (r == 0) {
      reply_ok(q);
    } else {
      bool zero = q->r.type == NBD_CMD_WRITE_ZEROES;
      bool quiet = zero && r == -ENOTSUP &&
                   (q->r.flags & NBD_CMD_FLAG_FAST_ZERO);
      if (!quiet)
        conn_log(q->c, "export \"%s\": %s offset %llu length %llu: %s",
                 e->name, wire_cmd_name(q->r.type),
                 (unsigned long long)q->r.offset,
                 (unsigned long long)q->r.length, strerror(-r));
      const char *why = quiet ? "zeroing would not be fast" : strerror(-r);
      if (zero && r == -ENOTSUP && !quiet)
        r = -EIO; /* ENOTSUP is FAST_ZERO's answer alone (§WRITE_ZEROES) */
      req_fail(q, -r, why);
      reply_error(q);
    }
  }
  req_send(q);
}

/* ---- sending ---- */

/* How far req_try_send got with a reply; a failure is -errno instead. */
enum send_progress {
  SEND_WAIT = 0,  /* the rest must wait for EPOLLOUT */
  SEND_DONE = 1,  /* the transport has taken all of it: q's buffers are
                   * free again (the transport may still hold bytes for
                   * its flush) */
  SEND_PIECE = 2, /* it has taken the piece of a long READ that buf held,
                   * and the next must be read (part_left) */
};

/* Hands the reply to the transport: returns an enum send_progress, or
 * -errno on failure. flags: 0, or TRANSPORT_SEND_MORE when another reply
 * follows at once. Under c->lock. */
static int
req_try_send(struct conn *c, struct req *q, int flags)
{
  while (q->iov_left > 0) {
    /* A header whose data follows from the file waits for it (MSG_MORE),
     * so that the two leave in the same segments; a piece whose next
     * one is still to be read waits for nothing. */
    int more = q->file_left > 0 ? TRANSPORT_SEND_MORE
               : q->part_left > 0 ? 0 : flags;
    ssize_t n = c->t.ops->sendv(&c->t, q->iov_cur, q->iov_left, more);
    if (n == -EAGAIN)
      return SEND_WAIT;
    if (n < 0)
      return (int)n;
    q->iov_left = transport_iov_advance(&q->iov_cur, q->iov_left, (size_t)n);
  }
  while (q->file_left > 0) {
    ssize_t n;
    if (q->file_ended) {
      /* The file shrank under us: the rest reads as zeroes, as a hole
       * (and as file_pread has it). */
      struct iovec z = { (void *)req_zeroes, q->file_left };
      if (z.iov_len > sizeof req_zeroes)
        z.iov_len = sizeof req_zeroes;
      n = c->t.ops->sendv(&c->t, &z, 1, 0);
      if (n == -EAGAIN)
        return SEND_WAIT;
      if (n < 0)
        return (int)n;
    } else {
      off_t off = (off_t)q->file_off;
      n = sendfile(c->fd, q->file_fd, &off, q->file_left);
      if (n < 0 && errno == EINTR)
        continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
        return SEND_WAIT;
      if (n < 0) {
        /* The header has promised the data: the stream cannot go on. A
         * client gone is said by whoever sees the send fail; a file
         * that fails is said here, as nothing else would name it. */
        int err = errno;
        if (err != EPIPE && err != ECONNRESET)
          conn_log(c, "export \"%s\": READ offset %llu: sending %zu bytes "
                   "from the file failed: %s", c->exp->name,
                   (unsigned long long)q->file_off, q->file_left,
                   strerror(err));
        return -err;
      }
      if (n == 0) {
        q->file_ended = true;
        continue;
      }
    }
    q->file_off += (uint64_t)n;
    q->file_left -= (size_t)n;
  }
  return q->r.type == NBD_CMD_READ && q->part_left > 0 ? SEND_PIECE
                                                         : SEND_DONE;
}

/* A request holding cost payload bytes fits beside what the requests in
 * flight hold: within SERVER_CONN_BUDGET, or alone. Under c->lock. */
static bool
conn_fits_locked(const struct conn *c, size_t cost)
{
  return cost == 0 || c->held == 0 || c->held + cost <= SERVER_CONN_BUDGET;
}

/* Reading may go on: below max_inflight, and a header parked for want
 * of budget (wait_cost, 0 if none) now fits. Under c->lock. */
static bool
conn_may_resume_locked(struct conn *c)
{
  return c->inflight < c->srv->cfg.max_inflight &&
         conn_fits_locked(c, c->wait_cost);
}

/* q is no longer in flight: its slot and its payload bytes are free.
 * Under c->lock. */
static void
req_release_locked(struct conn *c, struct req *q)
{
  c->inflight--;
  c->held -= q->cost;
  q->cost = 0;
}

/* The reply left: the request slot and its buffer become free. Under
 * c->lock; returns true when the loop should look at the connection
 * (and set its epoll events: only the loop does, as they depend on the
 * loop's own state). */
static bool
req_finish_locked(struct conn *c, struct req *q)
{
  bool resume = false;
  req_release_locked(c, q);
  if (c->nfree < c->srv->cfg.max_inflight) {
    if (q->buf_cap > SERVER_KEEP_BUF) { /* rare sizes are not kept */
      free(q->buf);
      q->buf = NULL;
      q->buf_cap = 0;
    }
    q->next = c->free_reqs;
    c->free_reqs = q;
    c->nfree++;
  } else {
    req_destroy(q);
  }
  if (c->paused && conn_may_resume_locked(c)) {
    __atomic_store_n(&c->paused, false, __ATOMIC_RELEASE);
    resume = true;
  }
  if (c->closing && c->inflight == 0 && c->sendq == NULL)
    resume = true;
  return resume;
}

/* Worker: the piece of a long READ that buf held has left; the next is
 * read into it and sent, the connection's other replies waiting behind
 * (c->streaming). */
static void
req_refill(struct work *w)
{
  struct req *q = (struct req *)w;
  q->part_off += q->part_len;
  read_long_part(q);
  req_send(q);
}

static void
req_send(struct req *q)
{
  struct conn *c = q->c;
  bool resume = false, refill = false;

  q->iov_cur = q->iov;
  q->iov_left = q->iovcnt;
  pthread_mutex_lock(&c->lock);
  /* A long READ's later piece goes before anything queued meanwhile. */
  bool streamed = c->streaming == q;
  if (streamed)
    c->streaming = NULL;
  if (c->dead) {
    req_release_locked(c, q);
    pthread_mutex_unlock(&c->lock);
    req_destroy(q);
    conn_put(c);
    return;
  }
  bool wait = !streamed && (c->sendq != NULL || c->streaming != NULL);
  int r = wait ? SEND_WAIT : req_try_send(c, q, 0);
  if (r == SEND_DONE || r == SEND_PIECE) {
    /* What the transport still holds (a TLS record the socket did not
     * take) goes on EPOLLOUT; the reply itself is done. */
    int f = c->t.ops->flush(&c->t);
    if (f == -EAGAIN && !c->want_out) {
      c->want_out = true; /* the loop arms EPOLLOUT */
      resume = true;
    } else if (f < 0 && f != -EAGAIN) {
      c->send_failed = true;
    }
  }
  /* A queued reply keeps its reference. */
  bool finished = r == SEND_DONE || r < 0;
  if (r == SEND_PIECE) {
    c->streaming = q; /* q keeps its reference */
    refill = true;
  } else if (r == SEND_DONE) {
    resume = req_finish_locked(c, q) || c->send_failed || resume;
    if (streamed && c->sendq && !c->want_out) {
      c->want_out = true; /* what waited behind it */
      resume = true;
    }
  } else if (r == SEND_WAIT) {
    if (streamed) {
      q->next = c->sendq;
      c->sendq = q;
      if (c->sendq_tail == NULL)
        c->sendq_tail = q;
    } else {
      if (c->sendq_tail)
        c->sendq_tail->next = q;
      else
        c->sendq = q;
      c->sendq_tail = q;
      q->next = NULL;
    }
    if (!c->want_out) {
      c->want_out = true; /* the loop arms EPOLLOUT */
      resume = true;
      /* q's reference now belongs to the send queue, which the loop may
       * empty (closing c) before conn_resume below: hold c for it. */
      c->refs++;
      finished = true;
    }
  } else {
    c->send_failed = true;
    req_release_locked(c, q);
    req_destroy(q);
    resume = true;
  }
  pthread_mutex_unlock(&c->lock);
  if (refill) {
    q->work.fn = req_refill;
    workq_push_owned(c->srv->workq, &q->work, &c->work_owner);
  }
  if (resume)
    conn_resume(c);
  if (finished)
    conn_put(c);
}

int
transmission_flush(struct conn *c)
{
  int puts = 0, ret = 0;
  bool rearm = false;
  struct req *refill = NULL;
  pthread_mutex_lock(&c->lock);
  /* While a long READ's next piece is read (c->streaming), nothing else
   * may leave; its worker sends it and asks for EPOLLOUT again. */
  while (c->sendq && c->streaming == NULL) {
    struct req *q = c->sendq;
    /* Replies queued together leave together: only the last one
     * uncorks. */
    int r = req_try_send(c, q, q->next ? TRANSPORT_SEND_MORE : 0);
    if (r == SEND_WAIT)
      break;
    if (r < 0) {
      ret = -1;
      break;
    }
    c->sendq = q->next;
    if (c->sendq == NULL)
      c->sendq_tail = NULL;
    if (r == SEND_PIECE) {
      c->streaming = refill = q;
      break;
    }
    rearm |= req_finish_locked(c, q);
    puts++;
  }
  if (ret == 0 && (c->sendq == NULL || c->streaming)) {
    int r = c->t.ops->flush(&c->t);
    if (r < 0 && r != -EAGAIN)
      ret = -1;
    c->want_out = r == -EAGAIN;
    rearm = true;
  }
  if (rearm)
    conn_update_events(c);
  bool done = c->closing && c->inflight == 0 && c->sendq == NULL &&
              !c->want_out;
  pthread_mutex_unlock(&c->lock);
  if (refill) {
    refill->work.fn = req_refill;
    workq_push_owned(c->srv->workq, &refill->work, &c->work_owner);
  }
  while (puts-- > 0)
    conn_put(c); /* the loop's own reference keeps c alive here */
  return (ret < 0 || done) ? -1 : 0;
}

/* ---- reading requests ---- */

/* A READ or WRITE over SERVER_MAX_PAYLOAD served in pieces: from a
 * client that never agreed to our block sizes, up to SERVER_MAX_UNSIZED.
 * Any other client MUST keep to them (§Size constraints) and is refused. */
static bool
req_is_long(const struct conn *c, const struct wire_request *r)
{
  return (r->type == NBD_CMD_READ || r->type == NBD_CMD_WRITE) &&
         r->length > SERVER_MAX_PAYLOAD && r->length <= SERVER_MAX_UNSIZED &&
         !c->sizes_agreed;
}

static uint32_t
req_check(struct conn *c, const struct wire_request *r, char *why,
          size_t wl)
{
  struct export *e = c->exp;
  uint16_t allowed;

  switch (r->type) {
  case NBD_CMD_READ:
    allowed = NBD_CMD_FLAG_FUA | (c->structured ? NBD_CMD_FLAG_DF : 0);
    break;
  case NBD_CMD_WRITE:
    allowed = NBD_CMD_FLAG_FUA;
    break;
  case NBD_CMD_FLUSH:
  case NBD_CMD_TRIM:
  case NBD_CMD_CACHE:
    allowed = NBD_CMD_FLAG_FUA;
    break;
  case NBD_CMD_WRITE_ZEROES:
    allowed = NBD_CMD_FLAG_FUA | NBD_CMD_FLAG_NO_HOLE | NBD_CMD_FLAG_FAST_ZERO;
    break;
  case NBD_CMD_BLOCK_STATUS:
    allowed = NBD_CMD_FLAG_FUA | NBD_CMD_FLAG_REQ_ONE;
    break;
  default:
    snprintf(why, wl, "unknown command %u", r->type);
    return NBD_EINVAL;
  }
  if (c->extended)
    allowed |= NBD_CMD_FLAG_PAYLOAD_LEN;
  if (r->flags & ~allowed) {
    snprintf(why, wl, "%s with unsupported flags 0x%x",
             wire_cmd_name(r->type), r->flags & ~allowed);
    return NBD_EINVAL;
  }
  if ((r->flags & NBD_CMD_FLAG_PAYLOAD_LEN) && r->type != NBD_CMD_WRITE) {
    snprintf(why, wl, "%s with a payload", wire_cmd_name(r->type));
    return NBD_EINVAL;
  }
  if (c->extended && r->type == NBD_CMD_WRITE &&
      !(r->flags & NBD_CMD_FLAG_PAYLOAD_LEN)) {
    snprintf(why, wl, "WRITE without PAYLOAD_LEN (no payload follows)");
    return NBD_EINVAL;
  }
  bool writes = r->type == NBD_CMD_WRITE || r->type == NBD_CMD_TRIM ||
                r->type == NBD_CMD_WRITE_ZEROES;
  if (writes && e->read_only) {
    snprintf(why, wl, "%s on read-only export \"%s\"",
             wire_cmd_name(r->type), e->name);
    return NBD_EPERM;
  }
  if (r->type == NBD_CMD_FLUSH) {
    if (r->offset || r->length) {
      snprintf(why, wl, "FLUSH with offset %llu length %llu",
               (unsigned long long)r->offset, (unsigned long long)r->length);
      return NBD_EINVAL;
    }
    return 0;
  }
  if (r->offset > e->size || r->length > e->size - r->offset) {
    snprintf(why, wl, "export \"%s\": %s offset %llu + length %llu beyond "
             "size %llu", e->name, wire_cmd_name(r->type),
             (unsigned long long)r->offset, (unsigned long long)r->length,
             (unsigned long long)e->size);
    bool grows = r->type == NBD_CMD_WRITE || r->type == NBD_CMD_WRITE_ZEROES;
    return grows ? NBD_ENOSPC : NBD_EINVAL;
  }
  /* §Error values: EINVAL "if a read or write request is not aligned to
   * advertised minimum block sizes" (a SHOULD). Only a client that
   * agreed to the sizes is held to them: any other may assume the
   * default minimum of 1, which an image's read-modify-write still
   * serves. The other commands are served as before, as a client's slip
   * there costs nothing. */
  if (c->sizes_agreed && e->min_block > 1 &&
      (r->type == NBD_CMD_READ || r->type == NBD_CMD_WRITE) &&
      ((r->offset % e->min_block) || (r->length % e->min_block))) {
    snprintf(why, wl, "export \"%s\": %s offset %llu length %llu not "
             "aligned to the minimum block size %u the client agreed to",
             e->name, wire_cmd_name(r->type),
             (unsigned long long)r->offset, (unsigned long long)r->length,
             e->min_block);
    return NBD_EINVAL;
  }
  if (r->type == NBD_CMD_READ && r->length > SERVER_MAX_PAYLOAD &&
      !req_is_long(c, r)) {
    snprintf(why, wl, "READ of %llu bytes exceeds the maximum %u%s",
             (unsigned long long)r->length,
             c->sizes_agreed ? SERVER_MAX_PAYLOAD : SERVER_MAX_UNSIZED,
             c->sizes_agreed ? " the client agreed to" : "");
    /* §NBD_CMD_READ: a client of chunked replies is told to expect
     * EOVERFLOW for a read too large, and to retry smaller. */
    bool chunked = c->structured || c->extended;
    return chunked ? NBD_EOVERFLOW : NBD_EINVAL;
  }
  if (r->type == NBD_CMD_BLOCK_STATUS) {
    if (!c->meta_base_allocation) {
      snprintf(why, wl, "BLOCK_STATUS without a metadata context");
      return NBD_EINVAL;
    }
    if (r->length == 0) {
      snprintf(why, wl, "BLOCK_STATUS of length 0");
      return NBD_EINVAL;
    }
  }
  return 0;
}

/* Whether the loop runs this WRITE itself (SERVER_INLINE_WRITE): a
 * small one without FUA into memory, unless over TCP the file is busy. */
static bool
req_write_on_loop(struct conn *c, struct req *q)
{
  struct export *e = c->exp;
  if (q->r.type != NBD_CMD_WRITE ||
      !__atomic_load_n(&e->write_in_memory, __ATOMIC_RELAXED) ||
      q->r.length > SERVER_INLINE_WRITE || (q->r.flags & NBD_CMD_FLAG_FUA))
    return false;
  if (!e->write_serial || !c->is_tcp)
    return true;
  q->write_locked = pthread_mutex_trylock(e->write_serial) == 0;
  return q->write_locked;
}

/* Hands a request over: to a worker, or straight to the socket when there
 * is nothing for the backend to do. */
static void
req_dispatch(struct conn *c, struct req *q)
{
  bool inline_reply = q->error != 0;
  c->cur = NULL;
  pthread_mutex_lock(&c->lock);
  c->inflight++;
  c->refs++;
  if (c->inflight >= c->srv->cfg.max_inflight) {
    __atomic_store_n(&c->paused, true, __ATOMIC_RELEASE);
    conn_update_events(c);
  }
  pthread_mutex_unlock(&c->lock);

  if (!inline_reply && q->r.length == 0 && q->r.type != NBD_CMD_FLUSH &&
      q->r.type != NBD_CMD_READ) {
    reply_ok(q); /* zero-length write, trim, zero, cache: nothing to do */
    inline_reply = true;
  }
  if (inline_reply) {
    if (q->error)
      reply_error(q);
    req_send(q);
  } else if (req_write_on_loop(c, q)) {
    q->on_loop = true;
    req_run(&q->work); /* a copy into memory: see SERVER_INLINE_WRITE */
  } else {
    q->work.fn = req_run;
    workq_push_owned(c->srv->workq, &q->work, &c->work_owner);
  }
  conn_expect(c, CS_REQ_HDR, c->msg, wire_request_len(c->extended));
}

void
req_close_pipes(struct req *q)
{
  for (unsigned i = 0; i < q->npipes; i++) {
    close(q->pipe[i][0]);
    close(q->pipe[i][1]);
  }
  q->npipes = 0;
  q->pipe_size = 0;
}

/* Opens one more pipe of pipe_size; 0, -ENOSPC when the request holds
 * REQ_PIPES already, or the kernel's -errno. */
int
req_add_pipe(struct req *q)
{
  if (q->npipes >= REQ_PIPES)
    return -ENOSPC;
  int r = sock_pipe_sized(q->pipe[q->npipes], q->pipe_size);
  if (r == 0)
    q->npipes++;
  return r;
}

/* Large WRITE payloads for exports that can take them from a pipe skip
 * user space: socket -> pipes on the loop, pipes -> file on the worker.
 * Only for the plain transport; TLS must decrypt in user space anyway.
 * A pipe slot holds one page reference, often a whole fragment of a
 * socket buffer, but a sender using sendfile(2) delivers pages partly
 * filled around its headers. So the pipes start as large as the payload
 * (in pieces of at most fs.pipe-max-size, the limit of a process without
 * CAP_SYS_RESOURCE), conn_read_splice opens more if they fill, and past
 * REQ_PIPES the payload falls back to a copy. A pipe the kernel refuses
 * (fds, or the per-user pipe budget) costs this payload its splice, not
 * the connection's. */
static bool
req_use_splice(struct conn *c, struct req *q, uint64_t payload)
{
  if (q->r.type != NBD_CMD_WRITE || payload < SERVER_SPLICE_MIN ||
      c->exp->ops->splice_in == NULL || c->t.ops != &transport_plain_ops)
    return false;
  size_t per = c->srv->pipe_max < payload ? c->srv->pipe_max
                                           : (size_t)payload;
  unsigned k = (unsigned)((payload + per - 1) / per);
  if (k > REQ_PIPES)
    return false; /* copied; smaller payloads still splice */
  if (q->npipes > 0 && q->pipe_size < per)
    req_close_pipes(q);
  if (q->npipes < k)
    q->pipe_size = per; /* the open ones are at least as large */
  while (q->npipes < k) {
    int r = req_add_pipe(q);
    if (r < 0) {
      log_debug("%s: no pipe of %zu bytes (%s); copying this payload",
                c->peer, per, strerror(-r));
      return false;
    }
  }
  q->pipe_cur = 0;
  memset(q->pipe_len, 0, sizeof q->pipe_len);
  return true;
}

/* Payload bytes a request holds while in flight: its READ data, or its
 * WRITE payload (in buf or in pipes); one piece of a long one
 * (SERVER_PIECE). payload is at most SERVER_MAX_PAYLOAD, or long. */
static size_t
req_cost(const struct conn *c, const struct wire_request *r,
         uint64_t payload)
{
  if (req_is_long(c, r) || payload > SERVER_MAX_PAYLOAD)
    return SERVER_PIECE; /* a piece at a time, or dropped */
  if (r->type == NBD_CMD_READ && r->length <= SERVER_MAX_PAYLOAD)
    return (size_t)r->length;
  return (size_t)payload;
}

/* Counts cost bytes against the connection's SERVER_CONN_BUDGET, or, when
 * they do not fit beside what requests in flight hold, parks the header
 * just read: reading pauses, c->msg keeps the header, and once replies
 * free room (req_finish_locked) the loop runs transmission_header on it
 * again. Returns false when parked. Loop thread. */
static bool
conn_admit(struct conn *c, size_t cost)
{
  pthread_mutex_lock(&c->lock);
  bool fits = conn_fits_locked(c, cost);
  if (fits) {
    c->held += cost;
    c->wait_cost = 0;
  } else {
    c->wait_cost = cost;
    __atomic_store_n(&c->paused, true, __ATOMIC_RELEASE);
    conn_update_events(c);
  }
  pthread_mutex_unlock(&c->lock);
  return fits;
}

/* No more requests (NBD_CMD_DISC, or the client's EOF between two): the
 * requests in flight still get their replies, then the connection
 * closes. True when nothing is left and it may close now. */
bool
transmission_end(struct conn *c)
{
  c->state = CS_CLOSING;
  c->dst = NULL;
  pthread_mutex_lock(&c->lock);
  c->closing = true;
  bool now = c->inflight == 0 && c->sendq == NULL && !c->want_out;
  /* No more EPOLLIN: the client's EOF, level-triggered, would
   * otherwise wake the loop for nothing until the last reply. */
  if (!now)
    conn_update_events(c);
  pthread_mutex_unlock(&c->lock);
  return now;
}

int
transmission_header(struct conn *c)
{
  struct wire_request r;
  char why[256];

  if (wire_decode_request(c->msg, c->extended, &r) < 0) {
    conn_log(c, "bad request magic 0x%08x", wire_get32(c->msg));
    return -1;
  }
  if (r.type == NBD_CMD_DISC) {
    log_debug("%s: disconnect requested", c->peer);
    return transmission_end(c) ? -1 : 0; /* -1 closes at once, gracefully */
  }
  /* Compact headers: only WRITE carries a payload, and PAYLOAD_LEN is
   * just a bad flag. Extended headers: the flag alone says whether a
   * payload follows, whatever the command (a WRITE without it has none,
   * and req_check refuses it). */
  bool has_payload = c->extended ? (r.flags & NBD_CMD_FLAG_PAYLOAD_LEN)
                                 : r.type == NBD_CMD_WRITE;
  uint64_t payload = has_payload ? r.length : 0;
  /* From a client that never agreed to block sizes, a payload up to
   * SERVER_MAX_UNSIZED is taken: a WRITE's in pieces, any other's
   * dropped after req_check refuses it. */
  bool unsized = payload > SERVER_MAX_PAYLOAD &&
                 payload <= SERVER_MAX_UNSIZED && !c->sizes_agreed;
  bool long_write = unsized && r.type == NBD_CMD_WRITE;
  if (payload > SERVER_MAX_PAYLOAD && !unsized) {
    /* §Size constraints: a payload past the maximum may be taken for a
     * denial of service, and the stream cut. */
    conn_log(c, "%s payload of %llu bytes exceeds the maximum %u%s",
             wire_cmd_name(r.type), (unsigned long long)payload,
             c->sizes_agreed ? SERVER_MAX_PAYLOAD : SERVER_MAX_UNSIZED,
             c->sizes_agreed ? " the client agreed to" : "");
    return -1;
  }
  size_t cost = req_cost(c, &r, payload);
  if (!conn_admit(c, cost))
    return 0;
  struct req *q = req_get(c);
  if (q == NULL)
    return -1;
  c->cur = q;
  q->r = r;
  q->cost = cost;
  q->error = req_check(c, &q->r, why, sizeof why);
  if (q->error) {
    conn_log(c, "%s", why);
    q->errmsg = NULL;
  } else if (server_stopping(c->srv)) {
    q->error = NBD_ESHUTDOWN; /* §Terminating the transmission phase */
    q->errmsg = "the server is shutting down";
  } else if (long_write) {
    /* Read and written a piece at a time (transmission_payload). */
    if (req_reserve(q, SERVER_PIECE) < 0) {
      q->error = NBD_ENOMEM;
    } else {
      q->part_len = SERVER_PIECE;
      q->part_left = payload - SERVER_PIECE;
    }
  } else if (payload > 0 && req_use_splice(c, q, payload)) {
    q->part_len = (size_t)payload; /* for conn_splice_fallback's buf */
    q->spliced = true;
    c->last_spliced = true;
    conn_expect(c, CS_REQ_SPLICE, NULL, payload);
    return 0;
  } else if (q->r.type == NBD_CMD_WRITE) {
    /* A READ's buffer is taken by the worker, and only if the data does
     * not leave from the file (req_read_buf). */
    q->part_len = (size_t)q->r.length;
    if (req_reserve(q, q->r.length) < 0)
      q->error = NBD_ENOMEM;
  }
  c->last_spliced = false;
  if (payload > 0 && q->error == 0) {
    conn_expect(c, CS_REQ_PAYLOAD, q->buf, q->part_len);
    return 0;
  }
  if (payload > 0) { /* keep the stream in step: drop the payload */
    c->discard_left = payload;
    size_t n = payload < sizeof c->discard_buf ? payload
                                               : sizeof c->discard_buf;
    conn_expect(c, CS_REQ_DISCARD, c->discard_buf, n);
    return 0;
  }
  req_dispatch(c, q);
  return 0;
}

/* Worker: writes one part of a long WRITE (not its last, which runs as
 * the request), then asks the loop to read the next. */
static void
req_run_part(struct work *w)
{
  struct req *q = (struct req *)w;
  struct conn *c = q->c;
  int r = run_write(q, false); /* FUA goes with the last part */
  if (r < 0) {
    conn_log(c, "export \"%s\": WRITE offset %llu length %zu: %s",
             c->exp->name, (unsigned long long)(q->r.offset + q->part_off),
             q->part_len, strerror(-r));
    req_fail(q, -r, strerror(-r));
  }
  pthread_mutex_lock(&c->lock);
  q->part_done = true;
  pthread_mutex_unlock(&c->lock);
  conn_resume(c);
  conn_put(c);
}

int
transmission_payload(struct conn *c)
{
  struct req *q = c->cur;
  if (q->part_left > 0 && q->error == 0) {
    /* A part of a long WRITE: written before its buffer takes the next,
     * and reading waits meanwhile (CS_REQ_PART). */
    c->state = CS_REQ_PART;
    c->dst = NULL;
    pthread_mutex_lock(&c->lock);
    c->refs++; /* the worker's, for the part */
    conn_update_events(c);
    pthread_mutex_unlock(&c->lock);
    q->work.fn = req_run_part;
    workq_push_owned(c->srv->workq, &q->work, &c->work_owner);
    return 0;
  }
  req_dispatch(c, q);
  return 0;
}

int
transmission_part_next(struct conn *c)
{
  struct req *q = c->cur;
  pthread_mutex_lock(&c->lock);
  bool done = q->part_done;
  q->part_done = false;
  pthread_mutex_unlock(&c->lock);
  if (!done)
    return 0;
  q->part_off += q->part_len;
  if (q->error) {
    /* Keep the stream in step: the rest is dropped, then the error sent
     * (transmission_payload). */
    c->discard_left = q->part_left;
    q->part_left = 0;
    size_t n = c->discard_left < sizeof c->discard_buf
                   ? (size_t)c->discard_left : sizeof c->discard_buf;
    conn_expect(c, CS_REQ_DISCARD, c->discard_buf, n);
  } else {
    q->part_len = q->part_left < SERVER_PIECE ? (size_t)q->part_left
                                              : SERVER_PIECE;
    q->part_left -= q->part_len;
    conn_expect(c, CS_REQ_PAYLOAD, q->buf, q->part_len);
  }
  pthread_mutex_lock(&c->lock);
  conn_update_events(c);
  pthread_mutex_unlock(&c->lock);
  return 0;
}
