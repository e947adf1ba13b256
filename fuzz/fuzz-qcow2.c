/* fuzz-qcow2.c: the qcow2 layout decoders (format/qcow2_layout.h) over
 * hostile bytes. The input is read as the start of a qcow2 file: a header
 * at 0 and its extensions; the file's size is the input's, the big-endian
 * u64 of its last 8 bytes, and 2^64 - 1. The whole input is also a run of
 * L1 entries and of L2 entries (8 bytes, or 16 with extended L2), decoded
 * under the input's own header when it has one and under fixed headers of
 * every kind (version 2 and 3, 512-byte to 2 MiB clusters, extended L2,
 * external data file).
 *
 * Every decoder's verdict is recomputed from the spec independently, in
 * 128-bit arithmetic where sums could wrap: what decodes keeps its own
 * invariants and re-encodes to itself; what qcow2_check_layout accepts
 * lies inside the file; the extension walk ends and stays inside the
 * input; decoded clusters are what their entry's bits say. */
#include <errno.h>
#include <stdbool.h>
#include <string.h>

#include "format/qcow2_layout.h"
#include "fuzz.h"

typedef unsigned __int128 u128;

/* A copy of exactly n bytes, so that ASan sees a read past them. */
static uint8_t *
dup_exact(const uint8_t *p, size_t n)
{
  uint8_t *b = malloc(n ? n : 1);
  CHECK(b);
  if (n)
    memcpy(b, p, n);
  return b;
}

static uint64_t
be64(const uint8_t *p)
{
  uint64_t v = 0;
  for (int i = 0; i < 8; i++)
    v = v << 8 | p[i];
  return v;
}

static uint32_t
be32(const uint8_t *p)
{
  return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 |
         p[3];
}

static void
check_err(int r, const char *err, size_t errlen)
{
  CHECK(r == 0 || r == -EINVAL);
  CHECK(strnlen(err, errlen) < errlen);
  if (r < 0)
    CHECK(err[0] != '\0');
}

static bool
header_eq(const struct qcow2_header *a, const struct qcow2_header *b)
{
  return a->version == b->version && a->backing_offset == b->backing_offset &&
         a->backing_len == b->backing_len &&
         a->cluster_bits == b->cluster_bits && a->size == b->size &&
         a->crypt_method == b->crypt_method &&
         a->l1_entries == b->l1_entries && a->l1_offset == b->l1_offset &&
         a->refcount_offset == b->refcount_offset &&
         a->refcount_clusters == b->refcount_clusters &&
         a->nb_snapshots == b->nb_snapshots &&
         a->snapshots_offset == b->snapshots_offset &&
         a->incompat == b->incompat && a->compat == b->compat &&
         a->autoclear == b->autoclear &&
         a->refcount_order == b->refcount_order &&
         a->header_len == b->header_len && a->compression == b->compression;
}

static bool
extl2(const struct qcow2_header *h)
{
  return (h->incompat & QCOW2_INCOMPAT_EXTL2) != 0;
}

/* The extensions of a decoded header, walked by hand over the area
 * [header_len, backing name or end of the first cluster): at most one
 * step per 8 bytes; each extension, padding included, inside the area;
 * those wholly inside the input decoded by qcow2_ext_decode with their
 * data inside it; bytes past the input are zeroes, an end marker. */
static void
ext_walk(const uint8_t *p, size_t n, const struct qcow2_header *h)
{
  u128 end = h->backing_offset ? h->backing_offset : qcow2_cluster_size(h);
  u128 off = h->header_len;
  size_t steps = 0;
  CHECK(end <= qcow2_cluster_size(h));
  while (off < end && off < n) {
    uint8_t hd[8] = { 0 };
    size_t o = (size_t)off;
    memcpy(hd, p + o, n - o < 8 ? n - o : 8);
    u128 total = 8 + ((u128)be32(hd + 4) + 7) / 8 * 8;
    CHECK(++steps <= n / 8 + 1);
    CHECK(end - off >= 8 && total <= end - off);
    if (be32(hd) == QCOW2_EXT_END)
      break;
    struct qcow2_ext x;
    int r = qcow2_ext_decode(p + o, n - o, &x);
    CHECK((r == 0) == (total <= n - off));
    if (r == 0) {
      CHECK(x.type == be32(hd) && x.len == be32(hd + 4));
      CHECK(x.data == p + o + 8 && WITHIN(x.data, x.len, p, n));
      CHECK(x.total == total);
    }
    off += total;
  }
}

/* qcow2_ext_decode on any bytes: it decodes exactly when the 8-byte
 * header, the data and its padding fit. */
static void
ext_any(const uint8_t *p, size_t n)
{
  struct qcow2_ext x;
  uint8_t *b = dup_exact(p, n);
  int r = qcow2_ext_decode(b, n, &x);
  bool fits = n >= 8 && ((u128)be32(p + 4) + 7) / 8 * 8 + 8 <= n;
  CHECK((r == 0) == fits);
  if (r == 0)
    CHECK(x.data == b + 8 && x.len == be32(p + 4) && x.total <= n &&
          x.total % 8 == 0);
  free(b);
}

/* What the decoder promises of a header it returns, against the bytes. */
static void
header_invariants(const uint8_t *p, size_t n, const struct qcow2_header *h)
{
  uint32_t cs = qcow2_cluster_size(h);
  CHECK(h->version == 2 || h->version == 3);
  CHECK(h->cluster_bits >= QCOW2_MIN_CLUSTER_BITS &&
        h->cluster_bits <= QCOW2_MAX_CLUSTER_BITS);
  CHECK(be32(p) == QCOW2_MAGIC && be32(p + 4) == h->version);
  CHECK(h->backing_offset == be64(p + 8) && h->cluster_bits == be32(p + 20));
  CHECK(h->size == be64(p + 24) && h->crypt_method == be32(p + 32));
  CHECK(h->l1_entries == be32(p + 36) && h->l1_offset == be64(p + 40));
  CHECK(h->refcount_offset == be64(p + 48) &&
        h->refcount_clusters == be32(p + 56));
  CHECK(h->nb_snapshots == be32(p + 60) && h->snapshots_offset == be64(p + 64));
  if (h->version == 2) {
    CHECK(h->incompat == 0 && h->compat == 0 && h->autoclear == 0);
    CHECK(h->refcount_order == 4 && h->header_len == QCOW2_V2_HEADER_LEN);
    CHECK(h->compression == QCOW2_COMPRESSION_DEFLATE);
  } else {
    CHECK(h->incompat == be64(p + 72) && h->compat == be64(p + 80) &&
          h->autoclear == be64(p + 88));
    CHECK(h->refcount_order == be32(p + 96) && h->refcount_order <= 6);
    CHECK(h->header_len == be32(p + 100));
    CHECK(h->header_len >= QCOW2_V3_HEADER_LEN && h->header_len % 8 == 0);
    CHECK(h->compression == (h->header_len > 104 ? p[104] : 0));
  }
  /* The fields read are in the input; the rest of the header need not. */
  CHECK(h->header_len <= cs);
  CHECK(n >= (h->version == 2 ? 72u : h->header_len > 104 ? 105u : 104u));
  CHECK((h->incompat & ~QCOW2_INCOMPAT_KNOWN) == 0);
  CHECK(h->compression == QCOW2_COMPRESSION_DEFLATE ||
        h->compression == QCOW2_COMPRESSION_ZSTD);
  CHECK(!!(h->incompat & QCOW2_INCOMPAT_COMPRESSION) ==
        (h->compression == QCOW2_COMPRESSION_ZSTD));
  if (extl2(h))
    CHECK(cs >= 16384);
  if (h->backing_offset == 0) {
    CHECK(h->backing_len == 0);
  } else {
    CHECK(h->backing_len == be32(p + 16));
    CHECK(h->backing_len <= QCOW2_MAX_BACKING_NAME);
    CHECK((u128)h->backing_offset + h->backing_len <= cs);
  }
  CHECK(qcow2_l2_entries(h) == cs / (extl2(h) ? 16 : 8));
}

/* A v3 header re-encodes to the bytes it came from (what the struct
 * keeps of them) and decodes to itself; a v2 one becomes a v3 of 104. */
static void
round_trip(const uint8_t *p, const struct qcow2_header *h)
{
  char err[256] = "";
  size_t room = h->header_len < 104 ? 104 : h->header_len;
  uint8_t *out = malloc(room);
  struct qcow2_header g;
  CHECK(out);
  size_t r = qcow2_header_encode(h, out);
  CHECK(r == room);
  uint8_t *b = dup_exact(out, r);
  int d = qcow2_header_decode(b, r, &g, err, sizeof err);
  CHECK(d == 0);
  /* Without a name offset the name's length is not kept. */
  uint8_t in[104];
  memcpy(in, p, h->version == 3 ? 104 : 72);
  if (h->backing_offset == 0)
    memset(in + 16, 0, 4);
  if (h->version == 3) {
    CHECK(header_eq(h, &g));
    CHECK(memcmp(out, in, 104) == 0);
    if (h->header_len > 104)
      CHECK(out[104] == p[104]);
  } else {
    struct qcow2_header w = *h;
    w.version = 3;
    w.header_len = 104;
    CHECK(header_eq(&w, &g));
    CHECK(memcmp(out + 8, in + 8, 64) == 0);
  }
  free(b);
  free(out);
}

/* qcow2_check_layout accepts exactly what the spec's bounds allow,
 * recomputed without wrap-around. */
static void
layout(const struct qcow2_header *h, uint64_t file_size)
{
  char err[256] = "";
  int r = qcow2_check_layout(h, file_size, err, sizeof err);
  check_err(r, err, sizeof err);
  u128 cs = qcow2_cluster_size(h), fs = file_size;
  u128 per_l1 = cs * qcow2_l2_entries(h);
  u128 need = ((u128)h->size + per_l1 - 1) / per_l1;
  bool l1_in = h->l1_entries == 0 ||
               (u128)h->l1_offset + (u128)h->l1_entries * 8 <= fs;
  bool name_in = h->backing_offset == 0 ||
                 (u128)h->backing_offset + h->backing_len <= fs;
  bool want = h->size <= QCOW2_MAX_SIZE &&
              h->l1_entries <= QCOW2_MAX_L1_ENTRIES &&
              h->l1_offset % cs == 0 && need <= h->l1_entries && l1_in &&
              name_in && h->refcount_offset % cs == 0;
  CHECK((r == 0) == want);
  if (r == 0 && h->l1_entries != 0)
    CHECK((u128)h->l1_offset + (u128)h->l1_entries * 8 <= fs);
}

static void
l1_entry(const struct qcow2_header *h, uint64_t e)
{
  char err[256] = "";
  uint64_t off = 1;
  int r = qcow2_l1_decode(h, e, &off, err, sizeof err);
  check_err(r, err, sizeof err);
  uint64_t want = e & QCOW2_OFFSET_MASK;
  bool good = (e & QCOW2_L1_RESERVED) == 0 &&
              want % qcow2_cluster_size(h) == 0;
  CHECK((r == 0) == good);
  CHECK(off == (r == 0 ? want : 0));
}

/* The verdict and the cluster an L2 entry (and subcluster word) give,
 * from qcow2.rst's bit layout. */
static void
l2_entry(const struct qcow2_header *h, uint64_t e, uint64_t sub)
{
  char err[256] = "";
  struct qcow2_cluster c;
  int r = qcow2_l2_decode(h, e, sub, &c, err, sizeof err);
  check_err(r, err, sizeof err);
  uint32_t cb = h->cluster_bits;
  uint64_t cs = qcow2_cluster_size(h);
  bool ext = extl2(h);
  if (r == 0 && !ext)
    CHECK(c.sub_alloc == 0 && c.sub_zero == 0);

  if (e & QCOW2_OFLAG_COMPRESSED) {
    uint32_t x = 62 - (cb - 8);
    uint64_t host = e & ((UINT64_C(1) << x) - 1);
    uint64_t nb = (e >> x) & ((UINT64_C(1) << (cb - 8)) - 1);
    bool good = host < (UINT64_C(1) << 56) && (!ext || sub == 0);
    CHECK((r == 0) == good);
    if (r < 0)
      return;
    CHECK(c.kind == QCOW2_COMPRESSED && c.host_off == host);
    CHECK(c.comp_len == (nb + 1) * 512 - host % 512);
    /* At most 2^(cb - 8) sectors of 512 bytes, at least one byte, and
     * to the end of a sector. */
    CHECK(c.comp_len >= 1 && c.comp_len <= (UINT64_C(1) << (cb + 1)));
    CHECK((c.host_off + c.comp_len) % 512 == 0);
    CHECK(c.sub_alloc == 0 && c.sub_zero == 0);
    return;
  }

  uint64_t off = e & QCOW2_OFFSET_MASK;
  bool zero = e & QCOW2_OFLAG_ZERO;
  bool allocated = off != 0 || ((h->incompat & QCOW2_INCOMPAT_DATA_FILE) &&
                                (e & QCOW2_OFLAG_COPIED));
  uint32_t alloc = (uint32_t)sub, zsub = (uint32_t)(sub >> 32);
  bool good = (e & QCOW2_L2_RESERVED) == 0 &&
              !(zero && (h->version < 3 || ext)) && off % cs == 0;
  if (ext)
    good = good && (alloc & zsub) == 0 && (allocated || alloc == 0);
  CHECK((r == 0) == good);
  if (r < 0)
    return;
  CHECK(c.host_off == off && off % cs == 0 && off < (UINT64_C(1) << 56));
  CHECK(c.comp_len == 0);
  if (ext) {
    CHECK(c.sub_alloc == alloc && c.sub_zero == zsub);
    CHECK((c.sub_alloc & c.sub_zero) == 0);
    CHECK(c.kind == (allocated ? QCOW2_NORMAL : QCOW2_UNALLOCATED));
    if (c.kind == QCOW2_UNALLOCATED)
      CHECK(c.sub_alloc == 0);
  } else if (zero) {
    CHECK(c.kind == QCOW2_ZERO && h->version == 3);
  } else {
    CHECK(c.kind == (allocated ? QCOW2_NORMAL : QCOW2_UNALLOCATED));
  }
}

/* The input as a table of L1 entries and one of L2 entries. */
static void
tables(const uint8_t *p, size_t n, const struct qcow2_header *h)
{
  size_t step = extl2(h) ? 16 : 8;
  for (size_t i = 0; i + 8 <= n && i < 2048; i += 8)
    l1_entry(h, be64(p + i));
  for (size_t i = 0; i + step <= n && i < 4096; i += step)
    l2_entry(h, be64(p + i), step == 16 ? be64(p + i + 8) : 0);
}

/* Headers of every kind, as the decoder returns them. */
static void
fixed_headers(struct qcow2_header hs[6])
{
  static const struct {
    uint32_t version, bits;
    uint64_t incompat;
  } k[6] = {
    { 2, 9, 0 },
    { 2, 16, 0 },
    { 3, 16, 0 },
    { 3, 14, QCOW2_INCOMPAT_EXTL2 },
    { 3, 21, QCOW2_INCOMPAT_EXTL2 | QCOW2_INCOMPAT_DATA_FILE },
    { 3, 12, QCOW2_INCOMPAT_DATA_FILE },
  };
  for (int i = 0; i < 6; i++) {
    memset(&hs[i], 0, sizeof hs[i]);
    hs[i].version = k[i].version;
    hs[i].cluster_bits = k[i].bits;
    hs[i].incompat = k[i].incompat;
    hs[i].refcount_order = 4;
    hs[i].header_len = k[i].version == 2 ? 72 : 112;
  }
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
  uint8_t *p = dup_exact(data, size);
  struct qcow2_header h;
  char err[256] = "";

  int r = qcow2_header_decode(p, size, &h, err, sizeof err);
  check_err(r, err, sizeof err);
  if (r == 0) {
    header_invariants(p, size, &h);
    /* A decoded header's extensions all fit, and the walk ends. */
    ext_walk(p, size, &h);
    round_trip(p, &h);
    layout(&h, size);
    layout(&h, UINT64_MAX);
    if (size >= 8)
      layout(&h, be64(p + size - 8));
    /* And files that end exactly at the L1 table's end or the name's,
     * or one byte short of it. */
    u128 ends[2] = { (u128)h.l1_offset + (u128)h.l1_entries * 8,
                     (u128)h.backing_offset + h.backing_len };
    for (int i = 0; i < 2; i++) {
      if (ends[i] == 0 || ends[i] > UINT64_MAX)
        continue;
      layout(&h, (uint64_t)ends[i]);
      layout(&h, (uint64_t)ends[i] - 1);
    }
    tables(p, size, &h);
  }
  /* Shorter views of the same file: only the error contract. */
  static const size_t cuts[] = { 3, 71, 72, 103, 104, 111, 112, 512 };
  for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
    if (cuts[i] >= size)
      break;
    uint8_t *b = dup_exact(p, cuts[i]);
    struct qcow2_header g;
    int q = qcow2_header_decode(b, cuts[i], &g, err, sizeof err);
    check_err(q, err, sizeof err);
    if (q == 0)
      header_invariants(b, cuts[i], &g);
    free(b);
  }

  struct qcow2_header hs[6];
  fixed_headers(hs);
  for (int i = 0; i < 6; i++)
    tables(p, size < 512 ? size : 512, &hs[i]);
  ext_any(p, size);
  if (size > 8)
    ext_any(p + 8, size - 8);
  free(p);
  return 0;
}
