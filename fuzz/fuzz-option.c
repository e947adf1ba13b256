/* fuzz-option.c: the option data a client sends to our server: INFO/GO
 * requests (wire_decode_info_req) and LIST/SET_META_CONTEXT requests
 * (wire_decode_meta_req, wire_meta_next). Whatever decodes must lie
 * inside the input and encode back to the same bytes. */
#include <string.h>

#include "fuzz.h"
#include "proto/wire.h"

static void
info_req(const uint8_t *data, size_t size)
{
  struct wire_info_req r;
  if (wire_decode_info_req(data, size, &r) < 0)
    return;
  CHECK(6 + (size_t)r.name_len + 2 * (size_t)r.nreqs == size);
  CHECK(WITHIN(r.name, r.name_len, data, size));
  CHECK(WITHIN(r.reqs, 2 * (size_t)r.nreqs, data, size));
  uint16_t *reqs = malloc(2 * (size_t)r.nreqs + 1);
  uint8_t *out = malloc(size);
  CHECK(reqs && out);
  for (uint16_t i = 0; i < r.nreqs; i++)
    reqs[i] = wire_get16(r.reqs + 2 * i);
  CHECK(wire_encode_info_req(out, (const char *)r.name, r.name_len, reqs,
                             r.nreqs) == size);
  CHECK(memcmp(out, data, size) == 0);
  free(reqs);
  free(out);
}

static void
meta_req(const uint8_t *data, size_t size)
{
  struct wire_meta_req r;
  if (wire_decode_meta_req(data, size, &r) < 0)
    return;
  CHECK(WITHIN(r.name, r.name_len, data, size));
  /* Every query the count promised, each inside the input, then no more;
   * queries without NUL bytes encode back to the input. */
  char **q = calloc((size_t)r.nqueries + 1, sizeof *q);
  CHECK(q);
  bool text = true;
  const uint8_t *qp;
  uint32_t ql, n = 0;
  while (wire_meta_next(&r, &qp, &ql)) {
    CHECK(n < r.nqueries);
    CHECK(WITHIN(qp, ql, data, size));
    text = text && memchr(qp, 0, ql) == NULL;
    q[n] = strndup((const char *)qp, ql);
    CHECK(q[n]);
    n++;
  }
  CHECK(n == r.nqueries);
  if (text) {
    uint8_t *out = malloc(size);
    CHECK(out);
    CHECK(wire_encode_meta_req(out, (const char *)r.name, r.name_len,
                               (const char *const *)q, n) == size);
    CHECK(memcmp(out, data, size) == 0);
    free(out);
  }
  for (uint32_t i = 0; i < n; i++)
    free(q[i]);
  free(q);
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
  info_req(data, size);
  meta_req(data, size);
  return 0;
}
