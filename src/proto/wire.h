/* wire.h: encode and decode NBD messages over byte buffers.
 *
 * Pure functions: no I/O, no allocation. Decoders never trust a length from
 * the wire: each takes the number of bytes available and says how many it
 * needs. Every parser of peer bytes in the project lives here (and in
 * nbd_uri.c) so that one fuzz harness per parser covers it; so does every
 * encoder of NBD's byte layouts, so that no other module spells one. */
#ifndef NBDFLOW_PROTO_WIRE_H
#define NBDFLOW_PROTO_WIRE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "nbd.h"

/* Big-endian load/store. */
static inline uint16_t
wire_get16(const uint8_t *p)
{
  return (uint16_t)((p[0] << 8) | p[1]);
}
static inline uint32_t
wire_get32(const uint8_t *p)
{
  return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) |
         ((uint32_t)p[2] << 8) | p[3];
}
static inline uint64_t
wire_get64(const uint8_t *p)
{
  return ((uint64_t)wire_get32(p) << 32) | wire_get32(p + 4);
}
static inline void
wire_put16(uint8_t *p, uint16_t v)
{
  p[0] = (uint8_t)(v >> 8);
  p[1] = (uint8_t)v;
}
static inline void
wire_put32(uint8_t *p, uint32_t v)
{
  p[0] = (uint8_t)(v >> 24);
  p[1] = (uint8_t)(v >> 16);
  p[2] = (uint8_t)(v >> 8);
  p[3] = (uint8_t)v;
}
static inline void
wire_put64(uint8_t *p, uint64_t v)
{
  wire_put32(p, (uint32_t)(v >> 32));
  wire_put32(p + 4, (uint32_t)v);
}

/* ---- Handshake ---- */

/* Server greeting, 18 bytes. */
void wire_encode_greeting(uint8_t out[NBD_GREETING_LEN], uint16_t hflags);

/* What a client reads first: "NBDMAGIC", then IHAVEOPT (newstyle, u16
 * handshake flags follow) or the oldstyle magic (NBD_OLDSTYLE_LEN - 16
 * bytes of export data follow). */
enum wire_greeting_style {
  WIRE_GREETING_UNKNOWN, /* "NBDMAGIC" with another second magic */
  WIRE_GREETING_NEWSTYLE,
  WIRE_GREETING_OLDSTYLE,
};
/* Whether the n bytes at p (n <= 8) start "NBDMAGIC", so that a peer
 * speaking another protocol is named at its first wrong byte. */
bool wire_greeting_prefix_ok(const uint8_t *p, size_t n);
/* The style of the 16 bytes that start a greeting (the first 8 checked by
 * wire_greeting_prefix_ok). */
enum wire_greeting_style wire_decode_greeting(const uint8_t in[16]);
/* The newstyle handshake flags (u16) after the 16 bytes above. */
uint16_t wire_decode_hflags(const uint8_t in[2]);
/* The client's flags (u32) in answer to them. */
void wire_encode_cflags(uint8_t out[4], uint32_t cflags);
uint32_t wire_decode_cflags(const uint8_t in[4]);

/* Export data: the reply to NBD_OPT_EXPORT_NAME (u64 size, u16
 * transmission flags, then 124 zeroes unless NO_ZEROES) and the rest of an
 * oldstyle greeting (u64 size, u32 flags, 124 zeroes). The encoder writes
 * the 10 bytes and, when zeroes, the 124 zeroes; returns what it wrote. */
size_t wire_encode_export_name_reply(
    uint8_t out[NBD_EXPORT_NAME_REPLY_LEN + NBD_ZEROES_LEN], uint64_t size,
    uint16_t tflags, bool zeroes);
void wire_decode_export_name_reply(const uint8_t in[NBD_EXPORT_NAME_REPLY_LEN],
                                   uint64_t *size, uint16_t *tflags);
/* Oldstyle flags are 32 bits of which the low 16 are transmission flags;
 * *tflags gets those. in holds 12 bytes. */
void wire_decode_oldstyle(const uint8_t in[12], uint64_t *size,
                          uint16_t *tflags);

/* Client option header (16 bytes) and server option reply header (20). */
struct wire_opt {
  uint32_t option;
  uint32_t length;
};
void wire_encode_opt(uint8_t out[NBD_OPT_HDR_LEN], uint32_t option,
                     uint32_t length);
/* Returns 0, or -EPROTO when the magic is not IHAVEOPT. */
int wire_decode_opt(const uint8_t in[NBD_OPT_HDR_LEN], struct wire_opt *o);

struct wire_opt_reply {
  uint32_t option;
  uint32_t type;
  uint32_t length;
};
void wire_encode_opt_reply(uint8_t out[NBD_OPT_REPLY_HDR_LEN],
                           uint32_t option, uint32_t type, uint32_t length);
int wire_decode_opt_reply(const uint8_t in[NBD_OPT_REPLY_HDR_LEN],
                          struct wire_opt_reply *r);

/* INFO / GO option data: u32 name length, name, u16 count, u16 requests.
 * On success name points into data (not NUL-terminated) and requests at the
 * first u16 request code. Returns 0 or -EINVAL when the lengths overrun. */
struct wire_info_req {
  const uint8_t *name;
  uint32_t name_len;
  uint16_t nreqs;
  const uint8_t *reqs; /* nreqs big-endian u16 */
};
int wire_decode_info_req(const uint8_t *data, size_t len,
                         struct wire_info_req *r);
/* The i-th request code (i < r->nreqs). */
static inline uint16_t
wire_info_req_code(const struct wire_info_req *r, uint16_t i)
{
  return wire_get16(r->reqs + 2 * (size_t)i);
}
/* Encoded size is 4 + name_len + 2 + 2 * nreqs; out must hold it. */
size_t wire_encode_info_req(uint8_t *out, const char *name, uint32_t name_len,
                            const uint16_t *reqs, uint16_t nreqs);

/* LIST/SET_META_CONTEXT data: u32 name length, name, u32 query count,
 * then (u32 length, query) pairs. Decoding validates the whole structure
 * and then iterates with wire_meta_next. */
struct wire_meta_req {
  const uint8_t *name;
  uint32_t name_len;
  uint32_t nqueries;
  const uint8_t *queries; /* cursor */
  size_t queries_len;
};
int wire_decode_meta_req(const uint8_t *data, size_t len,
                         struct wire_meta_req *r);
/* Yields the next query; returns 1 with *q and *qlen set, 0 at the end. */
int wire_meta_next(struct wire_meta_req *r, const uint8_t **q, uint32_t *qlen);
size_t wire_encode_meta_req(uint8_t *out, const char *name, uint32_t name_len,
                            const char *const *queries, uint32_t nqueries);

/* NBD_REP_INFO payload: u16 information type, then its data. A payload
 * under 2 bytes, an NBD_INFO_EXPORT of other than 12 bytes or an
 * NBD_INFO_BLOCK_SIZE of other than 14 is -EINVAL ("length MUST be"). The
 * fields of the type that came are set; text and text_len are the bytes
 * after the type for every type (the NAME or DESCRIPTION, not
 * NUL-terminated). On -EINVAL, type is still set when len is at least 2. */
struct wire_info_item {
  uint16_t type;
  uint64_t size;    /* NBD_INFO_EXPORT */
  uint16_t tflags;  /* NBD_INFO_EXPORT */
  uint32_t minimum, preferred, maximum; /* NBD_INFO_BLOCK_SIZE */
  const uint8_t *text;
  uint32_t text_len;
};
int wire_decode_info_item(const uint8_t *p, size_t len,
                          struct wire_info_item *it);
/* Encoders of NBD_REP_INFO payloads; each returns the payload length.
 * NBD_INFO_EXPORT: 12 bytes. NBD_INFO_BLOCK_SIZE: 14 bytes. NBD_INFO_NAME
 * or NBD_INFO_DESCRIPTION: 2 + len bytes, the text copied after the type
 * (len <= NBD_MAX_STRING is the caller's to check). */
size_t wire_encode_info_export(uint8_t out[12], uint64_t size, uint16_t tflags);
size_t wire_encode_info_block_size(uint8_t out[14], uint32_t minimum,
                                   uint32_t preferred, uint32_t maximum);
size_t wire_encode_info_text(uint8_t *out, uint16_t type, const void *text,
                             size_t len);

/* NBD_REP_SERVER payload (a LIST reply): u32 name length, name, then the
 * description up to the end. Returns 0 or -EINVAL when the name overruns
 * the payload. */
struct wire_rep_server {
  const uint8_t *name;
  uint32_t name_len;
  const uint8_t *desc;
  uint32_t desc_len;
};
int wire_decode_rep_server(const uint8_t *p, size_t len,
                           struct wire_rep_server *s);
/* Encodes one; out holds 4 + name_len + desc_len bytes, the length
 * returned. desc may be NULL when desc_len is 0. */
size_t wire_encode_rep_server(uint8_t *out, const char *name, uint32_t name_len,
                              const char *desc, uint32_t desc_len);

/* NBD_REP_META_CONTEXT payload: u32 context ID, then the name up to the
 * end. Returns 0 or -EINVAL under 4 bytes. */
struct wire_rep_meta {
  uint32_t id;
  const uint8_t *name;
  uint32_t name_len;
};
int wire_decode_rep_meta(const uint8_t *p, size_t len, struct wire_rep_meta *m);
/* Encodes one; out holds 4 + name_len bytes, the length returned. */
size_t wire_encode_rep_meta(uint8_t *out, uint32_t id, const char *name,
                            uint32_t name_len);

/* ---- Transmission ---- */

/* A request, compact or extended. length is the effect length (or the
 * payload length with PAYLOAD_LEN); compact headers carry only 32 bits. */
struct wire_request {
  uint16_t flags;
  uint16_t type;
  uint64_t cookie;
  uint64_t offset;
  uint64_t length;
};
/* Returns the header size written: 28, or 32 when extended. */
size_t wire_encode_request(uint8_t *out, bool extended,
                           const struct wire_request *r);
/* in holds at least wire_request_len(extended) bytes. Returns 0 or -EPROTO
 * on a wrong magic. */
int wire_decode_request(const uint8_t *in, bool extended,
                        struct wire_request *r);
static inline size_t
wire_request_len(bool extended)
{
  return extended ? NBD_EXTENDED_REQUEST_LEN : NBD_REQUEST_LEN;
}

/* A reply header of any of the three forms. For a simple reply, type is
 * NBD_REPLY_TYPE_NONE, flags DONE, length 0 and error is set; for chunks,
 * error is 0 and length is the chunk's payload length. */
struct wire_reply {
  uint32_t magic;
  uint16_t flags;
  uint16_t type;
  uint32_t error; /* simple replies only */
  uint64_t cookie;
  uint64_t offset; /* extended replies only */
  uint64_t length;
};
/* Header size of the reply whose first 4 bytes are given, or 0 when the
 * magic is unknown. */
size_t wire_reply_len(const uint8_t magic[4]);
int wire_decode_reply(const uint8_t *in, struct wire_reply *r);
size_t wire_encode_simple_reply(uint8_t out[NBD_SIMPLE_REPLY_LEN],
                                uint64_t cookie, uint32_t error);
/* Structured (20 bytes) or, when extended, extended (32 bytes) chunk
 * header. offset is the request's offset (echoed only when extended). */
size_t wire_encode_chunk(uint8_t *out, bool extended, uint16_t flags,
                         uint16_t type, uint64_t cookie, uint64_t offset,
                         uint64_t length);

/* Whole chunks, header and payload, for the server. Each writes into out
 * (the caller's header buffer) and returns the bytes written; cookie and
 * req_offset are the request's, flags is 0 or NBD_REPLY_FLAG_DONE.
 *
 * NBD_REPLY_TYPE_NONE, with DONE (the only chunk that may carry no
 * payload): a header alone. */
size_t wire_encode_none_chunk(uint8_t *out, bool extended, uint64_t cookie,
                              uint64_t req_offset);
/* NBD_REPLY_TYPE_OFFSET_DATA: the header and the u64 offset of the data,
 * but not the data_len bytes of data, which the caller sends after them
 * from wherever they are (its buffer, or a file): no copy. Writes at most
 * WIRE_DATA_CHUNK_HDR_MAX bytes. */
#define WIRE_DATA_CHUNK_HDR_MAX (NBD_EXTENDED_REPLY_LEN + 8)
size_t wire_encode_data_chunk(uint8_t *out, bool extended, uint16_t flags,
                              uint64_t cookie, uint64_t req_offset,
                              uint64_t data_offset, uint64_t data_len);
/* NBD_REPLY_TYPE_OFFSET_HOLE: the header, u64 offset, u32 hole size. Writes
 * at most WIRE_HOLE_CHUNK_MAX bytes. */
#define WIRE_HOLE_CHUNK_MAX (NBD_EXTENDED_REPLY_LEN + 12)
size_t wire_encode_hole_chunk(uint8_t *out, bool extended, uint16_t flags,
                              uint64_t cookie, uint64_t req_offset,
                              uint64_t hole_offset, uint32_t hole_len);
/* NBD_REPLY_TYPE_ERROR: the header, u32 error (an NBD error value), u16
 * message length, the message (copied: it is short). Writes at most
 * NBD_EXTENDED_REPLY_LEN + 6 + msg_len bytes. */
size_t wire_encode_error_chunk(uint8_t *out, bool extended, uint16_t flags,
                               uint64_t cookie, uint64_t req_offset,
                               uint32_t error, const char *msg,
                               uint16_t msg_len);

/* Error chunk payload: u32 error, u16 message length, message
 * [, u64 offset for ERROR_OFFSET]. Returns 0 or -EINVAL on overrun. */
struct wire_error_chunk {
  uint32_t error;
  const uint8_t *msg;
  uint16_t msg_len;
  uint64_t offset; /* ERROR_OFFSET only */
};
int wire_decode_error_chunk(const uint8_t *p, size_t len, bool with_offset,
                            struct wire_error_chunk *e);
/* An error chunk of a type this side does not know: only its error and
 * message are read, and what follows the message is left alone. Returns 0
 * (offset 0), or -EINVAL when the message overruns the payload. */
int wire_decode_error_chunk_unknown(const uint8_t *p, size_t len,
                                    struct wire_error_chunk *e);

/* NBD_REPLY_TYPE_OFFSET_HOLE payload: u64 offset, u32 hole size (12 bytes
 * in both header forms). Returns 0 or -EINVAL for any other length. */
int wire_decode_hole_chunk(const uint8_t *p, size_t len, uint64_t *offset,
                           uint32_t *hole_len);

/* The u64 offset that opens an NBD_REPLY_TYPE_OFFSET_DATA payload; the
 * data (payload length - 8) follows it. */
static inline uint64_t
wire_decode_data_offset(const uint8_t in[8])
{
  return wire_get64(in);
}

/* BLOCK_STATUS (compact) or BLOCK_STATUS_EXT payload: u32 context ID, [u32
 * descriptor count,] then descriptors of (u32 length, u32 flags) or (u64
 * length, u64 flags). Decoding checks that the payload holds at least one
 * whole descriptor and nothing else, and, when extended, that the count
 * says so; wire_status_next then yields each descriptor. */
struct wire_status_chunk {
  uint32_t context_id;
  uint32_t count; /* descriptors not yet yielded */
  bool extended;
  const uint8_t *desc; /* cursor */
};
int wire_decode_status_chunk(const uint8_t *p, size_t len, bool extended,
                             struct wire_status_chunk *s);
/* Returns 1 with *length and *flags set, or 0 after the last descriptor.
 * A flags word of an extended descriptor above 32 bits is cut to 32 bits:
 * base:allocation defines two. */
int wire_status_next(struct wire_status_chunk *s, uint64_t *length,
                     uint32_t *flags);
/* Payload bytes of a status chunk of n descriptors. */
static inline size_t
wire_status_len(bool extended, size_t n)
{
  return extended ? 8 + 16 * n : 4 + 8 * n;
}
/* Encoding a status chunk's payload in place: its head (u32 context ID,
 * and when extended the u32 descriptor count), then each descriptor at
 * out + wire_status_len(extended, i). Lengths of compact descriptors are
 * cut to 32 bits: the caller keeps them within the request's length. Each
 * returns the bytes written. */
size_t wire_encode_status_head(uint8_t *out, bool extended, uint32_t context_id,
                               uint32_t count);
size_t wire_encode_status_desc(uint8_t *out, bool extended, uint64_t length,
                               uint32_t flags);

/* Map a host errno to the NBD error value and back (§Error values). */
uint32_t wire_errno_to_nbd(int err);
int wire_nbd_to_errno(uint32_t nbd_err);

/* Names for logs. */
const char *wire_opt_name(uint32_t opt);
const char *wire_cmd_name(uint16_t cmd);
const char *wire_rep_name(uint32_t rep);

#endif
