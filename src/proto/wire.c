/* wire.c: NBD message encoding and decoding. See wire.h for contracts. */
#include "wire.h"

#include <errno.h>
#include <string.h>

void
wire_encode_greeting(uint8_t out[NBD_GREETING_LEN], uint16_t hflags)
{
  wire_put64(out, NBD_INIT_PASSWD);
  wire_put64(out + 8, NBD_IHAVEOPT);
  wire_put16(out + 16, hflags);
}

bool
wire_greeting_prefix_ok(const uint8_t *p, size_t n)
{
  uint8_t magic[8];
  wire_put64(magic, NBD_INIT_PASSWD);
  return n <= sizeof magic && memcmp(p, magic, n) == 0;
}

enum wire_greeting_style
wire_decode_greeting(const uint8_t in[16])
{
  if (wire_get64(in) != NBD_INIT_PASSWD)
    return WIRE_GREETING_UNKNOWN;
  switch (wire_get64(in + 8)) {
  case NBD_IHAVEOPT:
    return WIRE_GREETING_NEWSTYLE;
  case NBD_CLISERV_MAGIC:
    return WIRE_GREETING_OLDSTYLE;
  default:
    return WIRE_GREETING_UNKNOWN;
  }
}

uint16_t
wire_decode_hflags(const uint8_t in[2])
{
  return wire_get16(in);
}

void
wire_encode_cflags(uint8_t out[4], uint32_t cflags)
{
  wire_put32(out, cflags);
}

uint32_t
wire_decode_cflags(const uint8_t in[4])
{
  return wire_get32(in);
}

size_t
wire_encode_export_name_reply(
    uint8_t out[NBD_EXPORT_NAME_REPLY_LEN + NBD_ZEROES_LEN], uint64_t size,
    uint16_t tflags, bool zeroes)
{
  wire_put64(out, size);
  wire_put16(out + 8, tflags);
  if (!zeroes)
    return NBD_EXPORT_NAME_REPLY_LEN;
  memset(out + NBD_EXPORT_NAME_REPLY_LEN, 0, NBD_ZEROES_LEN);
  return NBD_EXPORT_NAME_REPLY_LEN + NBD_ZEROES_LEN;
}

void
wire_decode_export_name_reply(const uint8_t in[NBD_EXPORT_NAME_REPLY_LEN],
                              uint64_t *size, uint16_t *tflags)
{
  *size = wire_get64(in);
  *tflags = wire_get16(in + 8);
}

void
wire_decode_oldstyle(const uint8_t in[12], uint64_t *size, uint16_t *tflags)
{
  *size = wire_get64(in);
  *tflags = (uint16_t)wire_get32(in + 8);
}

void
wire_encode_opt(uint8_t out[NBD_OPT_HDR_LEN], uint32_t option, uint32_t length)
{
  wire_put64(out, NBD_IHAVEOPT);
  wire_put32(out + 8, option);
  wire_put32(out + 12, length);
}

int
wire_decode_opt(const uint8_t in[NBD_OPT_HDR_LEN], struct wire_opt *o)
{
  if (wire_get64(in) != NBD_IHAVEOPT)
    return -EPROTO;
  o->option = wire_get32(in + 8);
  o->length = wire_get32(in + 12);
  return 0;
}

void
wire_encode_opt_reply(uint8_t out[NBD_OPT_REPLY_HDR_LEN], uint32_t option,
                      uint32_t type, uint32_t length)
{
  wire_put64(out, NBD_REP_MAGIC);
  wire_put32(out + 8, option);
  wire_put32(out + 12, type);
  wire_put32(out + 16, length);
}

int
wire_decode_opt_reply(const uint8_t in[NBD_OPT_REPLY_HDR_LEN],
                      struct wire_opt_reply *r)
{
  if (wire_get64(in) != NBD_REP_MAGIC)
    return -EPROTO;
  r->option = wire_get32(in + 8);
  r->type = wire_get32(in + 12);
  r->length = wire_get32(in + 16);
  return 0;
}

int
wire_decode_info_req(const uint8_t *data, size_t len, struct wire_info_req *r)
{
  if (len < 6)
    return -EINVAL;
  uint32_t n = wire_get32(data);
  if (n > len - 6)
    return -EINVAL;
  uint16_t k = wire_get16(data + 4 + n);
  if ((size_t)k * 2 != len - 6 - n)
    return -EINVAL;
  r->name = data + 4;
  r->name_len = n;
  r->nreqs = k;
  r->reqs = data + 6 + n;
  return 0;
}

size_t
wire_encode_info_req(uint8_t *out, const char *name, uint32_t name_len,
                     const uint16_t *reqs, uint16_t nreqs)
{
  wire_put32(out, name_len);
  memcpy(out + 4, name, name_len);
  wire_put16(out + 4 + name_len, nreqs);
  for (uint16_t i = 0; i < nreqs; i++)
    wire_put16(out + 6 + name_len + 2 * i, reqs[i]);
  return 6 + (size_t)name_len + 2 * (size_t)nreqs;
}

int
wire_decode_meta_req(const uint8_t *data, size_t len, struct wire_meta_req *r)
{
  if (len < 8)
    return -EINVAL;
  uint32_t n = wire_get32(data);
  if (n > len - 8)
    return -EINVAL;
  r->name = data + 4;
  r->name_len = n;
  r->nqueries = wire_get32(data + 4 + n);
  r->queries = data + 8 + n;
  r->queries_len = len - 8 - n;

  /* Validate every query length now, so the caller may reply before
   * acting on any of them. */
  const uint8_t *p = r->queries;
  size_t left = r->queries_len;
  for (uint32_t i = 0; i < r->nqueries; i++) {
    if (left < 4)
      return -EINVAL;
    uint32_t ql = wire_get32(p);
    if (ql > left - 4)
      return -EINVAL;
    p += 4 + ql;
    left -= 4 + (size_t)ql;
  }
  if (left != 0)
    return -EINVAL;
  return 0;
}

int
wire_meta_next(struct wire_meta_req *r, const uint8_t **q, uint32_t *qlen)
{
  if (r->queries_len < 4)
    return 0;
  uint32_t ql = wire_get32(r->queries);
  if (ql > r->queries_len - 4)
    return 0;
  *q = r->queries + 4;
  *qlen = ql;
  r->queries += 4 + ql;
  r->queries_len -= 4 + (size_t)ql;
  return 1;
}

size_t
wire_encode_meta_req(uint8_t *out, const char *name, uint32_t name_len,
                     const char *const *queries, uint32_t nqueries)
{
  size_t off = 0;
  wire_put32(out, name_len);
  memcpy(out + 4, name, name_len);
  off = 4 + name_len;
  wire_put32(out + off, nqueries);
  off += 4;
  for (uint32_t i = 0; i < nqueries; i++) {
    uint32_t ql = (uint32_t)strlen(queries[i]);
    wire_put32(out + off, ql);
    memcpy(out + off + 4, queries[i], ql);
    off += 4 + ql;
  }
  return off;
}

size_t
wire_encode_request(uint8_t *out, bool extended, const struct wire_request *r)
{
  wire_put32(out, extended ? NBD_EXTENDED_REQUEST_MAGIC : NBD_REQUEST_MAGIC);
  wire_put16(out + 4, r->flags);
  wire_put16(out + 6, r->type);
  wire_put64(out + 8, r->cookie);
  wire_put64(out + 16, r->offset);
  if (extended) {
    wire_put64(out + 24, r->length);
    return NBD_EXTENDED_REQUEST_LEN;
  }
  wire_put32(out + 24, (uint32_t)r->length);
  return NBD_REQUEST_LEN;
}

int
wire_decode_request(const uint8_t *in, bool extended, struct wire_request *r)
{
  uint32_t magic = wire_get32(in);
  if (magic != (extended ? NBD_EXTENDED_REQUEST_MAGIC : NBD_REQUEST_MAGIC))
    return -EPROTO;
  r->flags = wire_get16(in + 4);
  r->type = wire_get16(in + 6);
  r->cookie = wire_get64(in + 8);
  r->offset = wire_get64(in + 16);
  r->length = extended ? wire_get64(in + 24) : wire_get32(in + 24);
  return 0;
}

size_t
wire_reply_len(const uint8_t magic[4])
{
  switch (wire_get32(magic)) {
  case NBD_SIMPLE_REPLY_MAGIC:
    return NBD_SIMPLE_REPLY_LEN;
  case NBD_STRUCTURED_REPLY_MAGIC:
    return NBD_STRUCTURED_REPLY_LEN;
  case NBD_EXTENDED_REPLY_MAGIC:
    return NBD_EXTENDED_REPLY_LEN;
  default:
    return 0;
  }
}

int
wire_decode_reply(const uint8_t *in, struct wire_reply *r)
{
  memset(r, 0, sizeof *r);
  r->magic = wire_get32(in);
  switch (r->magic) {
  case NBD_SIMPLE_REPLY_MAGIC:
    r->flags = NBD_REPLY_FLAG_DONE;
    r->type = NBD_REPLY_TYPE_NONE;
    r->error = wire_get32(in + 4);
    r->cookie = wire_get64(in + 8);
    return 0;
  case NBD_STRUCTURED_REPLY_MAGIC:
    r->flags = wire_get16(in + 4);
    r->type = wire_get16(in + 6);
    r->cookie = wire_get64(in + 8);
    r->length = wire_get32(in + 16);
    return 0;
  case NBD_EXTENDED_REPLY_MAGIC:
    r->flags = wire_get16(in + 4);
    r->type = wire_get16(in + 6);
    r->cookie = wire_get64(in + 8);
    r->offset = wire_get64(in + 16);
    r->length = wire_get64(in + 24);
    return 0;
  default:
    return -EPROTO;
  }
}

size_t
wire_encode_simple_reply(uint8_t out[NBD_SIMPLE_REPLY_LEN], uint64_t cookie,
                         uint32_t error)
{
  wire_put32(out, NBD_SIMPLE_REPLY_MAGIC);
  wire_put32(out + 4, error);
  wire_put64(out + 8, cookie);
  return NBD_SIMPLE_REPLY_LEN;
}

size_t
wire_encode_chunk(uint8_t *out, bool extended, uint16_t flags, uint16_t type,
                  uint64_t cookie, uint64_t offset, uint64_t length)
{
  wire_put16(out + 4, flags);
  wire_put16(out + 6, type);
  wire_put64(out + 8, cookie);
  if (extended) {
    wire_put32(out, NBD_EXTENDED_REPLY_MAGIC);
    wire_put64(out + 16, offset);
    wire_put64(out + 24, length);
    return NBD_EXTENDED_REPLY_LEN;
  }
  wire_put32(out, NBD_STRUCTURED_REPLY_MAGIC);
  wire_put32(out + 16, (uint32_t)length);
  return NBD_STRUCTURED_REPLY_LEN;
}

size_t
wire_encode_none_chunk(uint8_t *out, bool extended, uint64_t cookie,
                       uint64_t req_offset)
{
  return wire_encode_chunk(out, extended, NBD_REPLY_FLAG_DONE,
                           NBD_REPLY_TYPE_NONE, cookie, req_offset, 0);
}

size_t
wire_encode_data_chunk(uint8_t *out, bool extended, uint16_t flags,
                       uint64_t cookie, uint64_t req_offset,
                       uint64_t data_offset, uint64_t data_len)
{
  size_t h = wire_encode_chunk(out, extended, flags, NBD_REPLY_TYPE_OFFSET_DATA,
                               cookie, req_offset, 8 + data_len);
  wire_put64(out + h, data_offset);
  return h + 8;
}

size_t
wire_encode_hole_chunk(uint8_t *out, bool extended, uint16_t flags,
                       uint64_t cookie, uint64_t req_offset,
                       uint64_t hole_offset, uint32_t hole_len)
{
  size_t h = wire_encode_chunk(out, extended, flags, NBD_REPLY_TYPE_OFFSET_HOLE,
                               cookie, req_offset, 12);
  wire_put64(out + h, hole_offset);
  wire_put32(out + h + 8, hole_len);
  return h + 12;
}

size_t
wire_encode_error_chunk(uint8_t *out, bool extended, uint16_t flags,
                        uint64_t cookie, uint64_t req_offset, uint32_t error,
                        const char *msg, uint16_t msg_len)
{
  size_t h = wire_encode_chunk(out, extended, flags, NBD_REPLY_TYPE_ERROR,
                               cookie, req_offset, 6u + msg_len);
  wire_put32(out + h, error);
  wire_put16(out + h + 4, msg_len);
  if (msg_len)
    memcpy(out + h + 6, msg, msg_len);
  return h + 6 + msg_len;
}

int
wire_decode_error_chunk_unknown(const uint8_t *p, size_t len,
                                struct wire_error_chunk *e)
{
  if (len < 6)
    return -EINVAL;
  e->error = wire_get32(p);
  e->msg_len = wire_get16(p + 4);
  e->msg = p + 6;
  e->offset = 0;
  if (6 + (size_t)e->msg_len > len)
    return -EINVAL;
  return 0;
}

int
wire_decode_error_chunk(const uint8_t *p, size_t len, bool with_offset,
                        struct wire_error_chunk *e)
{
  if (len < 6)
    return -EINVAL;
  e->error = wire_get32(p);
  e->msg_len = wire_get16(p + 4);
  e->msg = p + 6;
  size_t need = 6 + (size_t)e->msg_len + (with_offset ? 8 : 0);
  if (need != len)
    return -EINVAL;
  e->offset = with_offset ? wire_get64(p + 6 + e->msg_len) : 0;
  return 0;
}

int
wire_decode_info_item(const uint8_t *p, size_t len, struct wire_info_item *it)
{
  memset(it, 0, sizeof *it);
  if (len < 2 || len > UINT32_MAX)
    return -EINVAL;
  it->type = wire_get16(p);
  it->text = p + 2;
  it->text_len = (uint32_t)(len - 2);
  switch (it->type) {
  case NBD_INFO_EXPORT:
    if (len != 12)
      return -EINVAL;
    it->size = wire_get64(p + 2);
    it->tflags = wire_get16(p + 10);
    return 0;
  case NBD_INFO_BLOCK_SIZE:
    if (len != 14)
      return -EINVAL;
    it->minimum = wire_get32(p + 2);
    it->preferred = wire_get32(p + 6);
    it->maximum = wire_get32(p + 10);
    return 0;
  default:
    return 0;
  }
}

size_t
wire_encode_info_export(uint8_t out[12], uint64_t size, uint16_t tflags)
{
  wire_put16(out, NBD_INFO_EXPORT);
  wire_put64(out + 2, size);
  wire_put16(out + 10, tflags);
  return 12;
}

size_t
wire_encode_info_block_size(uint8_t out[14], uint32_t minimum,
                            uint32_t preferred, uint32_t maximum)
{
  wire_put16(out, NBD_INFO_BLOCK_SIZE);
  wire_put32(out + 2, minimum);
  wire_put32(out + 6, preferred);
  wire_put32(out + 10, maximum);
  return 14;
}

size_t
wire_encode_info_text(uint8_t *out, uint16_t type, const void *text, size_t len)
{
  wire_put16(out, type);
  if (len)
    memcpy(out + 2, text, len);
  return 2 + len;
}

size_t
wire_encode_rep_server(uint8_t *out, const char *name, uint32_t name_len,
                       const char *desc, uint32_t desc_len)
{
  wire_put32(out, name_len);
  memcpy(out + 4, name, name_len);
  if (desc_len)
    memcpy(out + 4 + name_len, desc, desc_len);
  return 4 + (size_t)name_len + desc_len;
}

size_t
wire_encode_rep_meta(uint8_t *out, uint32_t id, const char *name,
                     uint32_t name_len)
{
  wire_put32(out, id);
  memcpy(out + 4, name, name_len);
  return 4 + (size_t)name_len;
}

int
wire_decode_rep_server(const uint8_t *p, size_t len,
                       struct wire_rep_server *s)
{
  if (len < 4 || len > UINT32_MAX)
    return -EINVAL;
  uint32_t n = wire_get32(p);
  if (n > len - 4)
    return -EINVAL;
  s->name = p + 4;
  s->name_len = n;
  s->desc = p + 4 + n;
  s->desc_len = (uint32_t)(len - 4 - n);
  return 0;
}

int
wire_decode_rep_meta(const uint8_t *p, size_t len, struct wire_rep_meta *m)
{
  if (len < 4 || len > UINT32_MAX)
    return -EINVAL;
  m->id = wire_get32(p);
  m->name = p + 4;
  m->name_len = (uint32_t)(len - 4);
  return 0;
}

int
wire_decode_hole_chunk(const uint8_t *p, size_t len, uint64_t *offset,
                       uint32_t *hole_len)
{
  if (len != 12)
    return -EINVAL;
  *offset = wire_get64(p);
  *hole_len = wire_get32(p + 8);
  return 0;
}

int
wire_decode_status_chunk(const uint8_t *p, size_t len, bool extended,
                         struct wire_status_chunk *s)
{
  size_t hdr = wire_status_len(extended, 0);
  size_t each = wire_status_len(extended, 1) - hdr;
  if (len < hdr + each || (len - hdr) % each != 0)
    return -EINVAL;
  size_t n = (len - hdr) / each;
  if (n > UINT32_MAX || (extended && wire_get32(p + 4) != n))
    return -EINVAL;
  s->context_id = wire_get32(p);
  s->count = (uint32_t)n;
  s->extended = extended;
  s->desc = p + hdr;
  return 0;
}

size_t
wire_encode_status_head(uint8_t *out, bool extended, uint32_t context_id,
                        uint32_t count)
{
  wire_put32(out, context_id);
  if (!extended)
    return 4;
  wire_put32(out + 4, count);
  return 8;
}

size_t
wire_encode_status_desc(uint8_t *out, bool extended, uint64_t length,
                        uint32_t flags)
{
  if (extended) {
    wire_put64(out, length);
    wire_put64(out + 8, flags);
    return 16;
  }
  wire_put32(out, (uint32_t)length);
  wire_put32(out + 4, flags);
  return 8;
}

int
wire_status_next(struct wire_status_chunk *s, uint64_t *length,
                 uint32_t *flags)
{
  if (s->count == 0)
    return 0;
  if (s->extended) {
    *length = wire_get64(s->desc);
    *flags = (uint32_t)wire_get64(s->desc + 8);
    s->desc += 16;
  } else {
    *length = wire_get32(s->desc);
    *flags = wire_get32(s->desc + 4);
    s->desc += 8;
  }
  s->count--;
  return 1;
}

uint32_t
wire_errno_to_nbd(int err)
{
  switch (err) {
  case 0:
    return 0;
  case EPERM:
  case EROFS:
    return NBD_EPERM;
  case ENOMEM:
    return NBD_ENOMEM;
  case EINVAL:
    return NBD_EINVAL;
  case ENOSPC:
  case EDQUOT:
  case EFBIG:
    return NBD_ENOSPC;
  case EOVERFLOW:
    return NBD_EOVERFLOW;
  case ENOTSUP:
    return NBD_ENOTSUP;
  case ESHUTDOWN:
    return NBD_ESHUTDOWN;
  default:
    return NBD_EIO;
  }
}

int
wire_nbd_to_errno(uint32_t nbd_err)
{
  switch (nbd_err) {
  case 0:
    return 0;
  case NBD_EPERM:
    return EPERM;
  case NBD_EIO:
    return EIO;
  case NBD_ENOMEM:
    return ENOMEM;
  case NBD_ENOSPC:
    return ENOSPC;
  case NBD_EOVERFLOW:
    return EOVERFLOW;
  case NBD_ENOTSUP:
    return ENOTSUP;
  case NBD_ESHUTDOWN:
    return ESHUTDOWN;
  default: /* NBD_EINVAL and anything unknown (§Error values) */
    return EINVAL;
  }
}

const char *
wire_opt_name(uint32_t opt)
{
  static const char *const names[] = {
    [NBD_OPT_EXPORT_NAME] = "EXPORT_NAME",
    [NBD_OPT_ABORT] = "ABORT",
    [NBD_OPT_LIST] = "LIST",
    [NBD_OPT_PEEK_EXPORT] = "PEEK_EXPORT",
    [NBD_OPT_STARTTLS] = "STARTTLS",
    [NBD_OPT_INFO] = "INFO",
    [NBD_OPT_GO] = "GO",
    [NBD_OPT_STRUCTURED_REPLY] = "STRUCTURED_REPLY",
    [NBD_OPT_LIST_META_CONTEXT] = "LIST_META_CONTEXT",
    [NBD_OPT_SET_META_CONTEXT] = "SET_META_CONTEXT",
    [NBD_OPT_EXTENDED_HEADERS] = "EXTENDED_HEADERS",
  };
  if (opt < sizeof names / sizeof names[0] && names[opt])
    return names[opt];
  return "unknown option";
}

const char *
wire_cmd_name(uint16_t cmd)
{
  static const char *const names[] = {
    [NBD_CMD_READ] = "READ",
    [NBD_CMD_WRITE] = "WRITE",
    [NBD_CMD_DISC] = "DISC",
    [NBD_CMD_FLUSH] = "FLUSH",
    [NBD_CMD_TRIM] = "TRIM",
    [NBD_CMD_CACHE] = "CACHE",
    [NBD_CMD_WRITE_ZEROES] = "WRITE_ZEROES",
    [NBD_CMD_BLOCK_STATUS] = "BLOCK_STATUS",
    [NBD_CMD_RESIZE] = "RESIZE",
  };
  if (cmd < sizeof names / sizeof names[0] && names[cmd])
    return names[cmd];
  return "unknown command";
}

const char *
wire_rep_name(uint32_t rep)
{
  switch (rep) {
  case NBD_REP_ACK:
    return "ACK";
  case NBD_REP_SERVER:
    return "SERVER";
  case NBD_REP_INFO:
    return "INFO";
  case NBD_REP_META_CONTEXT:
    return "META_CONTEXT";
  case NBD_REP_ERR_UNSUP:
    return "ERR_UNSUP";
  case NBD_REP_ERR_POLICY:
    return "ERR_POLICY";
  case NBD_REP_ERR_INVALID:
    return "ERR_INVALID";
  case NBD_REP_ERR_PLATFORM:
    return "ERR_PLATFORM";
  case NBD_REP_ERR_TLS_REQD:
    return "ERR_TLS_REQD";
  case NBD_REP_ERR_UNKNOWN:
    return "ERR_UNKNOWN";
  case NBD_REP_ERR_SHUTDOWN:
    return "ERR_SHUTDOWN";
  case NBD_REP_ERR_BLOCK_SIZE_REQD:
    return "ERR_BLOCK_SIZE_REQD";
  case NBD_REP_ERR_TOO_BIG:
    return "ERR_TOO_BIG";
  case NBD_REP_ERR_EXT_HEADER_REQD:
    return "ERR_EXT_HEADER_REQD";
  default:
    return (rep & NBD_REP_FLAG_ERROR) ? "unknown error" : "unknown reply";
  }
}
