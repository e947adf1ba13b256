/* fuzz-payload.c: the payloads a server sends our client: option replies
 * (NBD_REP_INFO items, LIST's NBD_REP_SERVER, NBD_REP_META_CONTEXT) and
 * reply chunks (errors with and without an offset, errors of an unknown
 * type, holes, compact and extended block status). Whatever decodes must
 * lie inside the input and account for every byte of it (an unknown
 * error type: every byte up to its message). */
#include <string.h>

#include "fuzz.h"
#include "proto/wire.h"

static void
option_replies(const uint8_t *p, size_t n)
{
  struct wire_info_item it;
  if (wire_decode_info_item(p, n, &it) == 0) {
    CHECK(n >= 2 && it.text_len == n - 2 && it.text == p + 2);
    CHECK(it.type != NBD_INFO_EXPORT || n == 12);
    CHECK(it.type != NBD_INFO_BLOCK_SIZE || n == 14);
  } else {
    CHECK(n < 2 || (it.type == NBD_INFO_EXPORT && n != 12) ||
          (it.type == NBD_INFO_BLOCK_SIZE && n != 14));
  }
  struct wire_rep_server s;
  if (wire_decode_rep_server(p, n, &s) == 0) {
    CHECK(WITHIN(s.name, s.name_len, p, n));
    CHECK(WITHIN(s.desc, s.desc_len, p, n));
    CHECK(4 + (size_t)s.name_len + s.desc_len == n);
  }
  struct wire_rep_meta m;
  if (wire_decode_rep_meta(p, n, &m) == 0)
    CHECK(m.name == p + 4 && 4 + (size_t)m.name_len == n);
}

static void
chunks(const uint8_t *p, size_t n)
{
  for (int off = 0; off <= 1; off++) {
    struct wire_error_chunk e;
    if (wire_decode_error_chunk(p, n, off, &e) == 0) {
      CHECK(WITHIN(e.msg, e.msg_len, p, n));
      CHECK(6 + (size_t)e.msg_len + (off ? 8 : 0) == n);
    }
  }
  /* An error chunk of a type the client does not know. */
  struct wire_error_chunk u;
  if (wire_decode_error_chunk_unknown(p, n, &u) == 0)
    CHECK(WITHIN(u.msg, u.msg_len, p, n) && u.msg == p + 6 && u.offset == 0);
  else
    CHECK(n < 6 || 6 + (size_t)wire_get16(p + 4) > n);
  uint64_t hoff;
  uint32_t hlen;
  CHECK((wire_decode_hole_chunk(p, n, &hoff, &hlen) == 0) == (n == 12));
  for (int ext = 0; ext <= 1; ext++) {
    struct wire_status_chunk st;
    if (wire_decode_status_chunk(p, n, ext, &st) < 0)
      continue;
    uint32_t count = st.count;
    CHECK(count > 0 && wire_status_len(ext, count) == n);
    uint64_t len;
    uint32_t flags, seen = 0;
    while (wire_status_next(&st, &len, &flags)) {
      CHECK(seen < count);
      seen++;
    }
    CHECK(seen == count && st.desc == p + n);
  }
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
  /* A copy of exactly the input's size: libFuzzer's own buffer may have
   * room after it. */
  uint8_t *p = malloc(size ? size : 1);
  CHECK(p);
  memcpy(p, data, size);
  option_replies(p, size);
  chunks(p, size);
  free(p);
  return 0;
}
