/* chunked.h: xapi's Chunked framing (vhd-tool, import_raw_vdi).
 *
 * A stream of frames, each a 12-byte little-endian header {u64 byte
 * offset, u32 length} and then length bytes of data for that offset; the
 * stream ends with an all-zero header and nothing after it. There is no
 * magic, no checksum, no zero frame and no reply. A header with length 0
 * ends the stream (receivers differ on a non-zero offset there: we treat
 * it as the end too, and send only the all-zero one).
 *
 * Senders here keep to what the reference receiver handles: offsets and
 * lengths multiples of 512 (but at the disk's end), frames of at most
 * CHUNKED_MAX_FRAME, and never a length of 2^31 or more. */
#ifndef NBDFLOW_PROTO_CHUNKED_H
#define NBDFLOW_PROTO_CHUNKED_H

#include <errno.h>
#include <stdbool.h>
#include <stdint.h>

#define CHUNKED_HEADER_LEN 12
#define CHUNKED_MAX_FRAME (2u << 20)   /* what we send */
#define CHUNKED_ALIGN 512u
#define CHUNKED_LIMIT_LEN 0x80000000u  /* first length a receiver refuses */

struct chunked_header {
  uint64_t offset;
  uint32_t length;
};

static inline void
chunked_put(uint8_t *p, uint64_t offset, uint32_t length)
{
  for (int i = 0; i < 8; i++)
    p[i] = (uint8_t)(offset >> (8 * i));
  for (int i = 0; i < 4; i++)
    p[8 + i] = (uint8_t)(length >> (8 * i));
}

static inline void
chunked_get(const uint8_t *p, struct chunked_header *h)
{
  h->offset = 0;
  h->length = 0;
  for (int i = 7; i >= 0; i--)
    h->offset = (h->offset << 8) | p[i];
  for (int i = 3; i >= 0; i--)
    h->length = (h->length << 8) | p[8 + i];
}

static inline bool
chunked_is_end(const struct chunked_header *h)
{
  return h->length == 0;
}

/* Whether a frame may be written into a disk of size bytes: 0, or a
 * positive errno (EFBIG: beyond the disk; EMSGSIZE: a length of 2^31 or
 * more). */
static inline int
chunked_check(const struct chunked_header *h, uint64_t size)
{
  if (h->length >= CHUNKED_LIMIT_LEN)
    return EMSGSIZE;
  if (h->offset > size || h->length > size - h->offset)
    return EFBIG;
  return 0;
}

#endif
