/* transmit.c: the client's transmission phase. Requests are queued under
 * unique cookies and sent header-with-payload in vectored writes; replies
 * (simple, structured or extended) are parsed incrementally as bytes
 * arrive, and READ data lands directly in the request's buffer. */
#include "client/client.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/sendfile.h>
#include <unistd.h>

#include "net/loop.h"
#include "proto/wire.h"
#include "util/log.h"

enum rx_state {
  RX_HDR,     /* reading a reply header into rx_hdr */
  RX_OFFSET,  /* reading the u64 offset of an OFFSET_DATA chunk */
  RX_DATA,    /* reading READ payload into the request's buffer */
  RX_SCRATCH, /* reading a small payload into scratch */
};

#define CLIENT_MAX_ERROR_CHUNK (6 + NBD_MAX_STRING + 8)
#define CLIENT_RECV_BUDGET 256 /* recv calls per event, for fairness */

static void client_rx_reset(struct client_conn *c);

static void
client_set_msg(struct client_conn *c, const char *msg)
{
  if (c->errmsg[0] == '\0')
    snprintf(c->errmsg, sizeof c->errmsg, "%s", msg);
}

uint64_t
client_max_payload(const struct client_conn *c)
{
  return c->info.max_block;
}

bool
client_can_send_file(const struct client_conn *c)
{
  return c->tp.ops == &transport_plain_ops;
}

bool
client_wants_write(const struct client_conn *c)
{
  return c->sendq != NULL || c->flush_pending;
}

static void
client_complete(struct client_conn *c, struct client_req *r, int err)
{
  uint32_t idx = (uint32_t)r->cookie;
  c->slots[idx] = NULL;
  c->free_slots[c->nfree++] = idx;
  c->inflight--;
  if (r->type == NBD_CMD_READ || r->type == NBD_CMD_WRITE)
    c->inflight_bytes -= r->length;
  r->completed = true;
  if (err)
    r->err = err; /* what client_run returns: the connection's death too */
  if (r->done)
    r->done(r, err);
}

/* Marks the connection dead and calls back every in-flight request. */
static int
client_die(struct client_conn *c, int err, const char *why)
{
  if (c->fatal)
    return -c->fatal;
  c->fatal = err;
  client_set_msg(c, why);
  c->sendq = c->sendq_tail = NULL;
  c->send_off = 0;
  for (uint32_t i = 0; i < c->nslots; i++)
    if (c->slots[i])
      client_complete(c, c->slots[i], err);
  return -err;
}

int
client_abort(struct client_conn *c, int err, const char *why)
{
  if (!c->fatal)
    c->lost = true;
  return client_die(c, err, why);
}

static int client_recv_some(struct client_conn *c);

/* A send failed because the server is gone (EPIPE, ECONNRESET). It may
 * have answered first: an error reply that says why, or only the end of
 * its stream. What it sent is read before the connection dies, so the
 * reason reported is the server's, not the broken pipe its leaving
 * caused; nothing more is sent meanwhile. Returns -errno. */
static int
client_send_failed(struct client_conn *c, int err, const char *why)
{
  if (!c->fatal)
    c->lost = true;
  if (!c->fatal && !c->send_broken && (err == EPIPE || err == ECONNRESET)) {
    c->send_broken = true;
    c->sendq = c->sendq_tail = NULL; /* still in their slots */
    c->send_off = 0;
    (void)client_recv_some(c);
  }
  return client_die(c, err, why);
}

static int
client_grow_slots(struct client_conn *c)
{
  uint32_t n = c->nslots ? c->nslots * 2 : 64;
  struct client_req **s = realloc(c->slots, n * sizeof *s);
  if (s == NULL)
    return -ENOMEM;
  c->slots = s;
  uint32_t *f = realloc(c->free_slots, n * sizeof *f);
  if (f == NULL)
    return -ENOMEM;
  c->free_slots = f;
  struct client_spans *sp = realloc(c->spans, n * sizeof *sp);
  if (sp == NULL)
    return -ENOMEM;
  c->spans = sp;
  for (uint32_t i = c->nslots; i < n; i++) {
    s[i] = NULL;
    sp[i] = (struct client_spans){ NULL, 0, 0 };
    f[c->nfree++] = n - 1 - (i - c->nslots);
  }
  c->nslots = n;
  return 0;
}

/* Checks a request against the export before it goes out: the server
 * would refuse it, and some servers disconnect instead. */
static int
client_validate(const struct client_conn *c, struct client_req *r)
{
  const struct client_info *in = &c->info;
  uint16_t tf = in->tflags;
  if (r->type == NBD_CMD_FLUSH)
    return (tf & NBD_FLAG_SEND_FLUSH) ? 0 : -ENOTSUP;
  if (r->length == 0 || r->offset > in->size ||
      r->length > in->size - r->offset)
    return -EINVAL;
  if (!in->extended && r->length > UINT32_MAX)
    return -EINVAL;
  /* "MUST ensure that offset and length are integer multiples of any
   * advertised minimum block size" (§Size constraints): also at the end
   * of an export whose size is not one (endpoints refuse those). */
  if (in->min_block > 1 &&
      (r->offset % in->min_block || r->length % in->min_block)) {
    snprintf(r->errmsg, sizeof r->errmsg, "not a multiple of the server's "
             "minimum block size %u", in->min_block);
    return -EINVAL;
  }
  switch (r->type) {
  case NBD_CMD_READ:
    return r->length <= in->max_block && r->buf ? 0 : -EINVAL;
  case NBD_CMD_WRITE:
    if (tf & NBD_FLAG_READ_ONLY)
      return -EPERM;
    if (r->from_file)
      return r->length <= in->max_block && r->file_fd >= 0 &&
                 client_can_send_file(c) ? 0 : -EINVAL;
    return r->length <= in->max_block && r->buf ? 0 : -EINVAL;
  case NBD_CMD_WRITE_ZEROES:
    if (tf & NBD_FLAG_READ_ONLY)
      return -EPERM;
    if (!(tf & NBD_FLAG_SEND_WRITE_ZEROES))
      return -ENOTSUP;
    if ((r->flags & NBD_CMD_FLAG_FAST_ZERO) && !(tf & NBD_FLAG_SEND_FAST_ZERO))
      return -ENOTSUP;
    return 0;
  case NBD_CMD_BLOCK_STATUS:
    return in->allocation && r->extents ? 0 : -ENOTSUP;
  default:
    return -ENOTSUP;
  }
}

/* Bytes a request occupies on the wire: header, then any payload. */
static size_t
client_wire_len(const struct client_req *r)
{
  return r->hdr_len + (r->type == NBD_CMD_WRITE ? (size_t)r->length : 0);
}

/* The queue's head is a file-backed WRITE whose header is out: sends its
 * payload with sendfile(2) from the page cache. Returns 1 when the whole
 * payload went, 0 when the socket is full, -errno when the connection
 * died. */
static int
client_send_file(struct client_conn *c)
{
  struct client_req *r = c->sendq;
  size_t done = c->send_off - r->hdr_len;
  while (done < r->length) {
    off_t off = (off_t)(r->file_off + done);
    ssize_t w = sendfile(c->fd, r->file_fd, &off, (size_t)r->length - done);
    if (w < 0 && errno == EINTR)
      continue;
    if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
      break;
    if (w < 0)
      return client_send_failed(c, errno, "sending a write payload from "
                                          "the file failed");
    if (w == 0)
      /* The header promised bytes the file no longer has: the stream
       * cannot continue. */
      return client_die(c, EIO, "source file ended inside a write");
    done += (size_t)w;
  }
  c->send_off = r->hdr_len + done;
  return done == r->length ? 1 : 0;
}

/* Split writes (a diagnostic): sends the queue's head request as a stock
 * client does, its header in one write and its payload in another, with
 * no MSG_MORE. Returns 1 when the request is out, 0 when the socket is
 * full, -errno when the connection died. */
static int
client_send_split(struct client_conn *c)
{
  struct client_req *r = c->sendq;
  size_t len = client_wire_len(r);
  while (c->send_off < len) {
    if (r->from_file && c->send_off >= r->hdr_len) {
      int k = client_send_file(c);
      if (k <= 0)
        return k;
      break;
    }
    struct iovec iov;
    if (c->send_off < r->hdr_len)
      iov = (struct iovec){ r->hdr + c->send_off, r->hdr_len - c->send_off };
    else
      iov = (struct iovec){ (uint8_t *)r->buf + (c->send_off - r->hdr_len),
                            len - c->send_off };
    ssize_t w = c->tp.ops->sendv(&c->tp, &iov, 1, 0);
    if (w == -EAGAIN)
      return 0;
    if (w < 0)
      return client_send_failed(c, (int)-w, "connection lost while sending");
    c->send_off += (size_t)w;
  }
  c->sendq = r->next;
  r->next = NULL;
  r->sent = true; /* from now on a reply may complete it */
  c->send_off = 0;
  if (c->sendq == NULL)
    c->sendq_tail = NULL;
  return 1;
}

/* Sends as much of the queue as the socket takes, many requests per
 * sendmsg: each WRITE header travels in the same call as its payload. A
 * file-backed WRITE ends its batch: its header goes with MSG_MORE so the
 * kernel joins it to the payload that sendfile appends. */
static int
client_send_some(struct client_conn *c)
{
  while (c->sendq) {
    struct client_req *h = c->sendq;
    if (c->split_writes) {
      int r = client_send_split(c);
      if (r <= 0)
        return r;
      continue;
    }
    if (h->from_file && c->send_off >= h->hdr_len) {
      int r = client_send_file(c);
      if (r <= 0)
        return r;
      c->sendq = h->next;
      h->next = NULL;
      h->sent = true; /* from now on a reply may complete it */
      c->send_off = 0;
      if (c->sendq == NULL)
        c->sendq_tail = NULL;
      continue;
    }
    struct iovec iov[64];
    int n = 0;
    size_t total = 0;
    int more = 0;
    for (struct client_req *r = c->sendq; r && n < 62; r = r->next) {
      iov[n++] = (struct iovec){ r->hdr, r->hdr_len };
      total += r->hdr_len;
      if (r->type == NBD_CMD_WRITE && r->from_file) {
        more = TRANSPORT_SEND_MORE;
        break;
      }
      if (r->type == NBD_CMD_WRITE) {
        iov[n++] = (struct iovec){ r->buf, (size_t)r->length };
        total += r->length;
      }
    }
    struct iovec *p = iov;
    size_t want = total - c->send_off;
    int cnt = transport_iov_advance(&p, n, c->send_off);
    ssize_t w = c->tp.ops->sendv(&c->tp, p, cnt, more);
    if (w == -EAGAIN)
      return 0;
    if (w < 0)
      return client_send_failed(c, (int)-w, "connection lost while sending");
    size_t done = c->send_off + (size_t)w;
    while (c->sendq) {
      struct client_req *r = c->sendq;
      if (r->from_file && done >= r->hdr_len)
        break; /* header out; the payload follows by sendfile */
      size_t len = client_wire_len(r);
      if (done < len)
        break;
      done -= len;
      c->sendq = r->next;
      r->next = NULL;
      r->sent = true; /* from now on a reply may complete it */
    }
    if (c->sendq == NULL)
      c->sendq_tail = NULL;
    c->send_off = done;
    if ((size_t)w < want)
      return 0; /* socket full: wait for EPOLLOUT */
  }
  int r = c->tp.ops->flush(&c->tp);
  c->flush_pending = r == -EAGAIN;
  if (r < 0 && r != -EAGAIN)
    return client_send_failed(c, -r, "connection lost while sending");
  return 0;
}

int
client_submit(struct client_conn *c, struct client_req *r)
{
  if (c->fatal)
    return -c->fatal;
  if (c->send_broken)
    return -EPIPE; /* a callback while the dying connection is read */
  if (c->rx_need == 0)
    client_rx_reset(c);
  int err = client_validate(c, r);
  if (err < 0)
    return err;
  if (c->nfree == 0 && (err = client_grow_slots(c)) < 0)
    return err;
  uint32_t idx = c->free_slots[--c->nfree];
  r->cookie = ((uint64_t)++c->generation << 32) | idx;
  r->completed = false;
  r->err = 0;
  r->covered = 0;
  r->run_lo = r->run_hi = 0;
  r->status_seen = false;
  c->spans[idx].n = 0;
  r->nextents = 0;
  r->extents_dropped = false;
  r->errmsg[0] = '\0';
  r->next = NULL;
  r->sent = false;
  struct wire_request w = { .flags = r->flags, .type = r->type,
                            .cookie = r->cookie, .offset = r->offset,
                            .length = r->length };
  if (r->type == NBD_CMD_FLUSH)
    w.offset = w.length = 0;
  if (c->info.extended && r->type == NBD_CMD_WRITE)
    w.flags |= NBD_CMD_FLAG_PAYLOAD_LEN;
  r->hdr_len = (uint8_t)wire_encode_request(r->hdr, c->info.extended, &w);
  c->slots[idx] = r;
  c->inflight++;
  if (r->type == NBD_CMD_READ || r->type == NBD_CMD_WRITE)
    c->inflight_bytes += r->length;
  if (c->sendq_tail)
    c->sendq_tail->next = r;
  else
    c->sendq = r;
  c->sendq_tail = r;
  if (c->sendq == r)
    client_send_some(c); /* errors reach r through its callback */
  return 0;
}

static int
client_proto(struct client_conn *c, const char *why)
{
  char msg[200];
  snprintf(msg, sizeof msg, "protocol error from server: %s", why);
  return client_die(c, EPROTO, msg);
}

static void
client_rx_expect(struct client_conn *c, enum rx_state st, uint8_t *dst,
                 uint64_t len)
{
  c->rx_state = st;
  c->rx_dst = dst;
  c->rx_len = len;
}

static void
client_rx_reset(struct client_conn *c)
{
  c->rx_state = RX_HDR;
  c->rx_have = 0;
  c->rx_need = c->info.extended ? NBD_EXTENDED_REPLY_LEN : NBD_SIMPLE_REPLY_LEN;
  c->rx_req = NULL;
}

/* The current chunk has been consumed entirely. */
static int
client_rx_chunk_end(struct client_conn *c)
{
  struct client_req *r = c->rx_req;
  /* Ready for the next header before the callback runs: it may submit,
   * and a failed send reads the socket (client_send_failed). */
  client_rx_reset(c);
  if (c->rx_flags & NBD_REPLY_FLAG_DONE) {
    if (r->err == 0 && r->type == NBD_CMD_READ && r->covered != r->length) {
      r->err = EIO;
      snprintf(r->errmsg, sizeof r->errmsg,
               "server's reply did not cover the whole read");
    }
    /* A reply without error holds "exactly one status chunk" for each
     * context we selected (§NBD_REPLY_TYPE_BLOCK_STATUS). */
    if (r->err == 0 && r->type == NBD_CMD_BLOCK_STATUS && !r->status_seen) {
      r->err = EPROTO;
      snprintf(r->errmsg, sizeof r->errmsg,
               "server's block status reply had no status for "
               "base:allocation");
    }
    client_complete(c, r, r->err);
  }
  return 0;
}

/* Is [off, off+len) inside request r? */
static bool
client_in_req(const struct client_req *r, uint64_t off, uint64_t len)
{
  return off >= r->offset && off - r->offset <= r->length &&
         len <= r->length - (off - r->offset);
}

/* Adds [lo, hi) to sp: 0, -EEXIST when it overlaps a piece already
 * there, -E2BIG past CLIENT_MAX_SPANS pieces, -ENOMEM. Touching pieces
 * merge, so a reply that arrives in order stays one piece. */
static int
client_spans_add(struct client_spans *sp, uint64_t lo, uint64_t hi)
{
  uint32_t a = 0, b = sp->n; /* p: the first piece that starts at or past lo */
  while (a < b) {
    uint32_t m = a + (b - a) / 2;
    if (sp->v[m].lo < lo)
      a = m + 1;
    else
      b = m;
  }
  uint32_t p = a;
  bool left = p > 0 && sp->v[p - 1].hi == lo;
  bool right = p < sp->n && sp->v[p].lo == hi;
  if ((p > 0 && sp->v[p - 1].hi > lo) || (p < sp->n && sp->v[p].lo < hi))
    return -EEXIST;
  if (left && right) {
    sp->v[p - 1].hi = sp->v[p].hi;
    memmove(&sp->v[p], &sp->v[p + 1], (sp->n - p - 1) * sizeof *sp->v);
    sp->n--;
  } else if (left) {
    sp->v[p - 1].hi = hi;
  } else if (right) {
    sp->v[p].lo = lo;
  } else {
    if (sp->n == CLIENT_MAX_SPANS)
      return -E2BIG;
    if (sp->n == sp->cap) {
      uint32_t cap = sp->cap ? sp->cap * 2 : 16;
      struct client_span *v = realloc(sp->v, cap * sizeof *v);
      if (v == NULL)
        return -ENOMEM;
      sp->v = v;
      sp->cap = cap;
    }
    memmove(&sp->v[p + 1], &sp->v[p], (sp->n - p) * sizeof *sp->v);
    sp->v[p] = (struct client_span){ lo, hi };
    sp->n++;
  }
  return 0;
}

/* A data or hole chunk filled [off, off+len) of READ r (inside r, len >
 * 0). Content chunks may come in any order but "MUST NOT overlap with
 * the bounds of any earlier content chunk" (§Structured reply chunk
 * message types); one that repeats a range would leave another part of
 * the buffer unfilled while the byte count still added up. 0, or the
 * -errno of the failed connection. */
static int
client_cover(struct client_conn *c, struct client_req *r, uint64_t off,
             uint64_t len)
{
  uint64_t lo = off - r->offset, hi = lo + len;
  struct client_spans *sp = &c->spans[(uint32_t)r->cookie];
  int e = 0;
  if (sp->n == 0) { /* the chunks so far fill one range, or none */
    if (r->run_lo == r->run_hi) {
      r->run_lo = lo;
      r->run_hi = hi;
    } else if (lo == r->run_hi) {
      r->run_hi = hi;
    } else if (hi == r->run_lo) {
      r->run_lo = lo;
    } else {
      e = client_spans_add(sp, r->run_lo, r->run_hi);
    }
    if (e == 0 && sp->n == 0) {
      r->covered += len;
      return 0;
    }
  }
  if (e == 0)
    e = client_spans_add(sp, lo, hi);
  if (e == -EEXIST)
    return client_proto(c, "read chunks overlap");
  if (e == -E2BIG)
    return client_proto(c, "read reply split into too many pieces");
  if (e < 0)
    return client_die(c, -e, "out of memory");
  r->covered += len;
  return 0;
}

static int
client_rx_status(struct client_conn *c, const uint8_t *p, size_t len,
                 bool ext)
{
  struct client_req *r = c->rx_req;
  struct wire_status_chunk st;
  /* The chunk's length was checked with its header; what fails here is
   * an extended chunk whose count disagrees with it. */
  if (wire_decode_status_chunk(p, len, ext, &st) < 0)
    return client_proto(c, "block status descriptor count mismatch");
  if (st.context_id != c->info.allocation_id)
    return 0; /* a context we did not ask about: ignore */
  /* "exactly one status chunk per negotiated metadata context ID"
   * (§NBD_REPLY_TYPE_BLOCK_STATUS): a second one cannot be placed. */
  if (r->status_seen)
    return client_proto(c, "two block status chunks for one context");
  r->status_seen = true;
  uint64_t sum = 0; /* of the extents so far, saturated */
  uint64_t elen;
  uint32_t flags;
  while (wire_status_next(&st, &elen, &flags)) {
    if (elen == 0)
      return client_proto(c, "zero-length extent");
    /* Only the last extent may reach past the request's end: the first
     * N-1 "MUST" add up to less than its length. */
    if (sum >= r->length)
      return client_proto(c, "block status extents run past the request");
    sum = elen > UINT64_MAX - sum ? UINT64_MAX : sum + elen;
    if (r->nextents < r->max_extents)
      r->extents[r->nextents++] = (struct client_extent){ elen, flags };
    else
      r->extents_dropped = true;
  }
  return 0;
}

static int
client_rx_error(struct client_conn *c, const uint8_t *p, size_t len)
{
  struct client_req *r = c->rx_req;
  struct wire_error_chunk e;
  bool with_off = c->rx_type == NBD_REPLY_TYPE_ERROR_OFFSET;
  if (c->rx_type != NBD_REPLY_TYPE_ERROR && !with_off) {
    /* Unknown error type: the request fails, the connection lives,
     * "unless the message length is too large" (§Structured reply
     * chunk message types). */
    if (wire_decode_error_chunk_unknown(p, len, &e) < 0)
      return client_proto(c, "error chunk message longer than the chunk");
    if (r->err == 0)
      r->err = e.error ? wire_nbd_to_errno(e.error) : EINVAL;
    return 0;
  }
  if (wire_decode_error_chunk(p, len, with_off, &e) < 0)
    return client_proto(c, "malformed error chunk");
  /* "MUST lie within the original offset and length" */
  if (with_off && (r->length == 0 || !client_in_req(r, e.offset, 1)))
    return client_proto(c, "error offset outside the request");
  if (r->err == 0) {
    char why[LOG_ESCAPE_BUF]; /* the server's text, made safe to print */
    r->err = e.error ? wire_nbd_to_errno(e.error) : EIO;
    snprintf(r->errmsg, sizeof r->errmsg, "%s",
             log_escape(why, e.msg, e.msg_len));
  }
  return 0;
}

static int
client_rx_scratch_done(struct client_conn *c)
{
  struct client_req *r = c->rx_req;
  const uint8_t *p = c->scratch;
  size_t len = (size_t)(c->rx_dst - c->scratch);
  int err = 0;
  switch (c->rx_type) {
  case NBD_REPLY_TYPE_OFFSET_HOLE: {
    uint64_t off;
    uint32_t hlen;
    if (wire_decode_hole_chunk(p, len, &off, &hlen) < 0 || hlen == 0 ||
        !client_in_req(r, off, hlen))
      return client_proto(c, "hole chunk outside the request");
    if ((err = client_cover(c, r, off, hlen)) < 0)
      return err;
    memset((uint8_t *)r->buf + (off - r->offset), 0, hlen);
    break;
  }
  case NBD_REPLY_TYPE_BLOCK_STATUS:
    err = client_rx_status(c, p, len, false);
    break;
  case NBD_REPLY_TYPE_BLOCK_STATUS_EXT:
    err = client_rx_status(c, p, len, true);
    break;
  default:
    err = client_rx_error(c, p, len);
    break;
  }
  if (c->scratch_size > CLIENT_KEEP_SCRATCH) { /* up to 16 MiB: not kept */
    free(c->scratch);
    c->scratch = NULL;
    c->scratch_size = 0;
  }
  return err < 0 ? err : client_rx_chunk_end(c);
}

static int
client_rx_scratch(struct client_conn *c, uint64_t len)
{
  if (c->scratch_size < len) {
    uint8_t *s = realloc(c->scratch, (size_t)len);
    if (s == NULL)
      return client_die(c, ENOMEM, "out of memory");
    c->scratch = s;
    c->scratch_size = (size_t)len;
  }
  client_rx_expect(c, RX_SCRATCH, c->scratch, len);
  return 0;
}

/* Decides what the chunk's payload is and where it goes, checking its
 * length against the request before reading any of it. */
static int
client_rx_chunk(struct client_conn *c, const struct wire_reply *rep)
{
  struct client_req *r = c->rx_req;
  uint64_t len = rep->length;
  bool ext = c->info.extended;
  switch (rep->type) {
  case NBD_REPLY_TYPE_NONE:
    if (len != 0 || !(rep->flags & NBD_REPLY_FLAG_DONE))
      return client_proto(c, "bad NONE chunk");
    return client_rx_chunk_end(c);
  case NBD_REPLY_TYPE_OFFSET_DATA:
    if (r->type != NBD_CMD_READ || len < 9 || len - 8 > r->length)
      return client_proto(c, "data chunk does not fit the request");
    c->rx_have = 0;
    client_rx_expect(c, RX_OFFSET, c->rx_hdr, 8);
    c->rx_len = len - 8; /* data bytes, once the offset is known */
    return 0;
  case NBD_REPLY_TYPE_OFFSET_HOLE:
    if (r->type != NBD_CMD_READ || len != 12)
      return client_proto(c, "bad hole chunk");
    return client_rx_scratch(c, len);
  case NBD_REPLY_TYPE_BLOCK_STATUS:
  case NBD_REPLY_TYPE_BLOCK_STATUS_EXT: {
    size_t hdr = wire_status_len(ext, 0), each = wire_status_len(ext, 1) - hdr;
    if (r->type != NBD_CMD_BLOCK_STATUS ||
        (rep->type == NBD_REPLY_TYPE_BLOCK_STATUS_EXT) != ext ||
        len < hdr + each || (len - hdr) % each ||
        len > hdr + each * (uint64_t)CLIENT_MAX_EXTENTS)
      return client_proto(c, "bad block status chunk");
    return client_rx_scratch(c, len);
  }
  default:
    if (!(rep->type & NBD_REPLY_TYPE_ERROR_BIT))
      return client_proto(c, "unknown chunk type");
    if (len < 6 || len > CLIENT_MAX_ERROR_CHUNK)
      return client_proto(c, "error chunk of impossible length");
    return client_rx_scratch(c, len);
  }
}

static int
client_rx_header(struct client_conn *c)
{
  struct wire_reply rep;
  if (wire_decode_reply(c->rx_hdr, &rep) < 0)
    return client_proto(c, "bad reply magic");
  uint32_t idx = (uint32_t)rep.cookie;
  struct client_req *r = idx < c->nslots ? c->slots[idx] : NULL;
  if (r == NULL || r->cookie != rep.cookie || !r->sent) {
    /* The connection is lost for every request in flight: the error of
     * each names it, and this says which reply broke it. A reply to a
     * request still being sent (a server that refuses a WRITE before
     * reading its payload) carries the server's reason: say it. */
    char why[160];
    if (r != NULL && r->cookie == rep.cookie)
      snprintf(why, sizeof why, "a reply for cookie 0x%llx (%s) before "
               "its request was wholly sent",
               (unsigned long long)rep.cookie,
               rep.magic != NBD_SIMPLE_REPLY_MAGIC ? "a structured chunk"
               : rep.error != 0 ? strerror(wire_nbd_to_errno(rep.error))
                                : "success");
    else
      snprintf(why, sizeof why, "a reply for cookie 0x%llx, which names "
               "no request in flight", (unsigned long long)rep.cookie);
    return client_proto(c, why);
  }
  /* An extended reply's offset "MUST match the offset of the client's
   * request" (§Extended reply chunk message). */
  if (c->info.extended && rep.offset != r->offset) {
    char why[96];
    snprintf(why, sizeof why, "reply offset %llu for a request at %llu",
             (unsigned long long)rep.offset, (unsigned long long)r->offset);
    return client_proto(c, why);
  }
  c->rx_req = r;
  c->rx_type = rep.type;
  c->rx_flags = rep.flags;
  /* Read as a compact header, an extended one would have taken its
   * offset and length from bytes that never came. */
  if (rep.magic == NBD_EXTENDED_REPLY_MAGIC && !c->info.extended)
    return client_proto(c, "extended reply without extended headers");
  if (rep.magic != NBD_SIMPLE_REPLY_MAGIC)
    return client_rx_chunk(c, &rep);
  if (rep.error) {
    r->err = wire_nbd_to_errno(rep.error);
    return client_rx_chunk_end(c);
  }
  if (r->type == NBD_CMD_READ) {
    if (c->info.structured)
      return client_proto(c, "simple reply carrying read data");
    r->covered = r->length;
    client_rx_expect(c, RX_DATA, r->buf, r->length);
    return 0;
  }
  if (r->type == NBD_CMD_BLOCK_STATUS)
    return client_proto(c, "simple reply to block status");
  return client_rx_chunk_end(c);
}

/* Called when the bytes the current state waited for have all arrived. */
static int
client_rx_step(struct client_conn *c)
{
  switch (c->rx_state) {
  case RX_HDR:
    return client_rx_header(c);
  case RX_OFFSET: {
    struct client_req *r = c->rx_req;
    uint64_t off = wire_decode_data_offset(c->rx_hdr);
    if (!client_in_req(r, off, c->rx_len))
      return client_proto(c, "data chunk outside the request");
    int err = c->rx_len > 0 ? client_cover(c, r, off, c->rx_len) : 0;
    if (err < 0)
      return err;
    client_rx_expect(c, RX_DATA, (uint8_t *)r->buf + (off - r->offset),
                     c->rx_len);
    return 0;
  }
  case RX_DATA:
    return client_rx_chunk_end(c);
  default:
    return client_rx_scratch_done(c);
  }
}

/* Where the next recv goes and how much it may take. */
static size_t
client_rx_want(struct client_conn *c, uint8_t **dst)
{
  if (c->rx_state == RX_HDR) {
    *dst = c->rx_hdr + c->rx_have;
    return c->rx_need - c->rx_have;
  }
  if (c->rx_state == RX_OFFSET) {
    *dst = c->rx_hdr + c->rx_have;
    return 8 - c->rx_have;
  }
  *dst = c->rx_dst;
  return c->rx_state == RX_SCRATCH
           ? (size_t)(c->rx_len - (size_t)(c->rx_dst - c->scratch))
           : (size_t)c->rx_len;
}

static int
client_rx_got(struct client_conn *c, size_t n)
{
  if (c->rx_state == RX_HDR) {
    c->rx_have += n;
    if (c->rx_have == NBD_SIMPLE_REPLY_LEN && !c->info.extended &&
        wire_reply_len(c->rx_hdr) == NBD_STRUCTURED_REPLY_LEN &&
        c->rx_need == NBD_SIMPLE_REPLY_LEN) {
      if (!c->info.structured)
        return client_proto(c, "structured reply not negotiated");
      c->rx_need = NBD_STRUCTURED_REPLY_LEN;
    }
    /* Known from the magic alone: waiting for a whole extended header
     * would wait forever on a 16-byte simple reply. */
    if (c->info.extended && c->rx_have >= 4 &&
        wire_reply_len(c->rx_hdr) != NBD_EXTENDED_REPLY_LEN)
      return client_proto(c, "compact reply after extended headers");
    return c->rx_have == c->rx_need ? client_rx_step(c) : 0;
  }
  if (c->rx_state == RX_OFFSET) {
    c->rx_have += n;
    return c->rx_have == 8 ? client_rx_step(c) : 0;
  }
  c->rx_dst += n;
  if (c->rx_state == RX_DATA) {
    c->rx_len -= n;
    return c->rx_len == 0 ? client_rx_step(c) : 0;
  }
  return (uint64_t)(c->rx_dst - c->scratch) == c->rx_len ? client_rx_step(c)
                                                         : 0;
}

static int
client_recv_some(struct client_conn *c)
{
  /* Past the budget, still drain what TLS has decrypted: epoll cannot
   * see it, so no event would bring us back for it. */
  for (int i = 0; (i < CLIENT_RECV_BUDGET || c->tp.ops->pending(&c->tp) > 0) &&
                  !c->fatal; i++) {
    uint8_t *dst;
    size_t want = client_rx_want(c, &dst);
    ssize_t n = c->tp.ops->recv(&c->tp, dst, want);
    if (n == -EAGAIN)
      return 0;
    if (n < 0 || n == 0)
      c->lost = true;
    if (n < 0)
      return client_die(c, (int)-n, "connection lost while receiving");
    if (n == 0) {
      if (c->inflight == 0 && c->rx_state == RX_HDR && c->rx_have == 0)
        return client_die(c, ESHUTDOWN, "server closed the connection");
      return client_die(c, ECONNRESET,
                        "server closed the connection with requests in "
                        "flight");
    }
    int r = client_rx_got(c, (size_t)n);
    if (r < 0)
      return r;
  }
  return c->fatal ? -c->fatal : 0;
}

int
client_on_events(struct client_conn *c, uint32_t events)
{
  if (c->fatal)
    return -c->fatal;
  if (c->rx_need == 0)
    client_rx_reset(c);
  if (events & (POLLIN | POLLHUP | POLLERR)) {
    int r = client_recv_some(c);
    if (r < 0)
      return r;
  }
  if ((events & POLLOUT) && client_wants_write(c))
    return client_send_some(c);
  return 0;
}

int
client_run(struct client_conn *c, struct client_req *r, int timeout_ms)
{
  uint64_t deadline = timeout_ms < 0 ? 0 : loop_now_ms() + (uint64_t)timeout_ms;
  int err = client_submit(c, r);
  if (err < 0)
    return err;
  if (c->rx_need == 0)
    client_rx_reset(c);
  while (!r->completed) {
    struct pollfd p = { .fd = c->fd,
                        .events = POLLIN |
                                  (client_wants_write(c) ? POLLOUT : 0) };
    int ms = -1;
    if (deadline) {
      uint64_t now = loop_now_ms();
      if (now >= deadline)
        return client_die(c, ETIMEDOUT, "timed out waiting for a reply");
      ms = (int)(deadline - now);
    }
    int n = poll(&p, 1, ms);
    if (n < 0 && errno != EINTR)
      return -errno;
    if (n > 0)
      client_on_events(c, (uint32_t)p.revents);
  }
  return r->err ? -r->err : 0;
}

void
client_drop_socket(struct client_conn *c)
{
  if (c->fd < 0)
    return;
  if (c->tp.ops) {
    c->tp.ops->shutdown(&c->tp);
    c->tp.ops->free(&c->tp);
  }
  close(c->fd);
  c->fd = -1;
}

void
client_close(struct client_conn *c)
{
  if (c->fd >= 0 && !c->fatal && c->inflight == 0 && c->info.protocol) {
    uint8_t hdr[NBD_EXTENDED_REQUEST_LEN];
    struct wire_request w = { .type = NBD_CMD_DISC };
    size_t len = wire_encode_request(hdr, c->info.extended, &w);
    transport_send_buf(&c->tp, hdr, len, 0, 1000);
  }
  client_drop_socket(c);
  for (size_t i = 0; i < c->info.nexports; i++)
    free(c->info.exports[i]);
  free(c->info.exports);
  free(c->info.name);
  free(c->info.description);
  for (uint32_t i = 0; i < c->nslots; i++)
    free(c->spans[i].v);
  free(c->spans);
  free(c->slots);
  free(c->free_slots);
  free(c->scratch);
  memset(c, 0, sizeof *c);
  c->fd = -1;
}
