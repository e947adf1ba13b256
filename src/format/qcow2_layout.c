/* qcow2_layout.c: the qcow2 on-disk structures. See qcow2_layout.h for
 * contracts; the layouts are those of qemu's docs/interop/qcow2.rst, and
 * what is refused is what qemu's block/qcow2.c (qcow2_do_open,
 * qcow2_read_extensions) and block/qcow2-cluster.c refuse when they open
 * an image or map a cluster, plus what the spec calls reserved. Every
 * value read from a file is hostile: sums of offsets and lengths are
 * compared by subtraction from a bound already checked, and no shift
 * count comes from a field that was not range-checked first. */
#include "qcow2_layout.h"

#include "format/common.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "proto/wire.h"

/* Header field offsets, named as in the spec. */
#define HEADER_MAGIC                   0
#define HEADER_VERSION                 4
#define HEADER_BACKING_FILE_OFFSET     8
#define HEADER_BACKING_FILE_SIZE       16
#define HEADER_CLUSTER_BITS            20
#define HEADER_SIZE                    24
#define HEADER_CRYPT_METHOD            32
#define HEADER_L1_SIZE                 36
#define HEADER_L1_TABLE_OFFSET         40
#define HEADER_REFCOUNT_TABLE_OFFSET   48
#define HEADER_REFCOUNT_TABLE_CLUSTERS 56
#define HEADER_NB_SNAPSHOTS            60
#define HEADER_SNAPSHOTS_OFFSET        64
#define HEADER_INCOMPATIBLE_FEATURES   QCOW2_HEADER_INCOMPAT_OFFSET
#define HEADER_COMPATIBLE_FEATURES     80
#define HEADER_AUTOCLEAR_FEATURES      88
#define HEADER_REFCOUNT_ORDER          96
#define HEADER_HEADER_LENGTH           100
#define HEADER_COMPRESSION_TYPE        104

#define EXT_HEADER_LEN 8u /* u32 type, u32 length */

/* Version 2 has 16-bit refcounts; qemu refuses refcounts wider than 64
 * bits (order 6). */
#define V2_REFCOUNT_ORDER  4u
#define MAX_REFCOUNT_ORDER 6u

/* Extended L2: 32 subclusters a cluster, each at least a 512-byte sector
 * (qemu: "Unsupported subcluster size"), so clusters of 16 KiB or more. */
#define EXTL2_MIN_CLUSTER_BITS 14u

/* Feature name table entries: u8 type, u8 bit number, 46 bytes of name. */
#define FEATURE_ENTRY_LEN 48u
#define FEATURE_NAME_LEN  46u
#define FEATURE_INCOMPAT  0u

/* Compressed clusters: sizes count 512-byte sectors whatever the cluster
 * size, and host offsets past bit 55 must be 0 (qcow2.rst). */
#define COMPRESSED_SECTOR 512u
#define HOST_OFFSET_LIMIT (UINT64_C(1) << 56)

static bool
cluster_bits_ok(uint32_t bits)
{
  return bits >= QCOW2_MIN_CLUSTER_BITS && bits <= QCOW2_MAX_CLUSTER_BITS;
}

static bool
has_extl2(const struct qcow2_header *h)
{
  return (h->incompat & QCOW2_INCOMPAT_EXTL2) != 0;
}

/* Where the header extensions end: at the backing file name when there is
 * one (qemu writes it right after them), else at the end of the first
 * cluster. Capped at the cluster for a header not yet checked. */
static uint64_t
ext_end(const struct qcow2_header *h)
{
  uint64_t cs = qcow2_cluster_size(h);
  if (h->backing_offset != 0 && h->backing_offset < cs)
    return h->backing_offset;
  return cs;
}

int
qcow2_ext_decode(const uint8_t *p, size_t len, struct qcow2_ext *x)
{
  if (len < EXT_HEADER_LEN)
    return -EINVAL;
  uint32_t type = wire_get32(p);
  uint32_t n = wire_get32(p + 4);
  size_t room = len - EXT_HEADER_LEN;
  if (n > room)
    return -EINVAL;
  /* The padding must fit too, as the contract says "the whole
   * extension"; qemu checks only the data, but every writer pads, so
   * only a forged header can tell the two apart. n <= room, so rounding
   * up adds at most 7 to a size_t below len. */
  size_t padded = ((size_t)n + 7) & ~(size_t)7;
  if (padded > room)
    return -EINVAL;
  x->type = type;
  x->data = p + EXT_HEADER_LEN;
  x->len = n;
  x->total = EXT_HEADER_LEN + padded;
  return 0;
}

/* The 8-byte header of the extension at off < len: its type and data
 * length, bytes past len read as zeroes. */
static void
ext_header_at(const uint8_t *p, size_t len, uint64_t off, uint32_t *type,
              uint32_t *n)
{
  uint8_t b[EXT_HEADER_LEN] = { 0 };
  size_t k = len - off < EXT_HEADER_LEN ? (size_t)(len - off) : EXT_HEADER_LEN;
  memcpy(b, p + off, k);
  *type = wire_get32(b);
  *n = wire_get32(b + 4);
}

/* Walks the header area [h->header_len, ext_end(h)) as qemu does: every
 * extension, padding included, must fit in the area; the walk stops at
 * the end marker or the area's end. Bytes past the input are past the
 * end of the file, which qemu reads as zeroes: an end marker there, and
 * an extension cut by the input is checked against the area only. fn is
 * called for each extension wholly inside the input. Returns 0, the first
 * nonzero value of fn, or -EINVAL with *bad the offset of the extension
 * that does not fit. Each step advances by 8 bytes or more, so the walk
 * ends. */
typedef int (*ext_fn)(const struct qcow2_ext *x, void *opaque);

static int
ext_walk(const uint8_t *p, size_t len, const struct qcow2_header *h,
         ext_fn fn, void *opaque, uint64_t *bad)
{
  uint64_t end = ext_end(h);
  for (uint64_t off = h->header_len; off < end && off < len;) {
    uint32_t type, n;
    *bad = off;
    ext_header_at(p, len, off, &type, &n);
    /* At least 8: an area of fewer bytes left is refused too, as qemu
     * does, even for an end marker. */
    uint64_t total = EXT_HEADER_LEN + (((uint64_t)n + 7) & ~UINT64_C(7));
    if (total > end - off)
      return -EINVAL;
    if (type == QCOW2_EXT_END)
      return 0;
    struct qcow2_ext x;
    if (total <= len - off &&
        qcow2_ext_decode(p + off, (size_t)total, &x) == 0) {
      int r = fn(&x, opaque);
      if (r != 0)
        return r;
    }
    off += total;
  }
  return 0;
}

static int
ext_ignore(const struct qcow2_ext *x, void *opaque)
{
  (void)x;
  (void)opaque;
  return 0;
}

struct feature_query {
  uint32_t bit;
  char name[FEATURE_NAME_LEN + 1];
};

/* Finds the name of incompatible feature q->bit in a feature name table;
 * returns 1 (stop) when found. */
static int
ext_feature_name(const struct qcow2_ext *x, void *opaque)
{
  struct feature_query *q = opaque;
  if (x->type != QCOW2_EXT_FEATURE_TABLE)
    return 0;
  for (uint32_t i = 0; x->len - i >= FEATURE_ENTRY_LEN;
       i += FEATURE_ENTRY_LEN) {
    const uint8_t *e = x->data + i;
    if (e[0] != FEATURE_INCOMPAT || e[1] != q->bit)
      continue;
    /* Text from the file, for a message: printable ASCII only. */
    size_t n = 0;
    for (; n < FEATURE_NAME_LEN && e[2 + n] != 0; n++)
      q->name[n] = e[2 + n] >= 0x20 && e[2 + n] < 0x7f ? (char)e[2 + n] : '?';
    q->name[n] = '\0';
    return 1;
  }
  return 0;
}

static int
lowest_bit(uint64_t v)
{
  int b = 0;
  while (!(v & 1)) {
    v >>= 1;
    b++;
  }
  return b;
}

/* Refuses unknown incompatible bits, naming the lowest one, and its name
 * when the image's feature table has one (as qemu does). */
static int
check_incompat(const uint8_t *p, size_t len, const struct qcow2_header *h,
               char *err, size_t errlen)
{
  uint64_t unknown = h->incompat & ~QCOW2_INCOMPAT_KNOWN;
  if (unknown == 0)
    return 0;
  struct feature_query q = { .bit = (uint32_t)lowest_bit(unknown) };
  uint64_t bad;
  if (ext_walk(p, len, h, ext_feature_name, &q, &bad) == 1)
    return fmt_fail(err, errlen, -EINVAL,
                "qcow2 image uses unknown incompatible feature bit %u "
                "(\"%s\"; incompatible features 0x%llx)",
                q.bit, q.name, (unsigned long long)h->incompat);
  return fmt_fail(err, errlen, -EINVAL,
              "qcow2 image uses unknown incompatible feature bit %u "
              "(incompatible features 0x%llx)",
              q.bit, (unsigned long long)h->incompat);
}

/* The fields common to versions 2 and 3 (the first 72 bytes). */
static void
decode_v2_fields(const uint8_t *p, struct qcow2_header *h)
{
  h->version = wire_get32(p + HEADER_VERSION);
  h->backing_offset = wire_get64(p + HEADER_BACKING_FILE_OFFSET);
  h->backing_len = wire_get32(p + HEADER_BACKING_FILE_SIZE);
  h->cluster_bits = wire_get32(p + HEADER_CLUSTER_BITS);
  h->size = wire_get64(p + HEADER_SIZE);
  h->crypt_method = wire_get32(p + HEADER_CRYPT_METHOD);
  h->l1_entries = wire_get32(p + HEADER_L1_SIZE);
  h->l1_offset = wire_get64(p + HEADER_L1_TABLE_OFFSET);
  h->refcount_offset = wire_get64(p + HEADER_REFCOUNT_TABLE_OFFSET);
  h->refcount_clusters = wire_get32(p + HEADER_REFCOUNT_TABLE_CLUSTERS);
  h->nb_snapshots = wire_get32(p + HEADER_NB_SNAPSHOTS);
  h->snapshots_offset = wire_get64(p + HEADER_SNAPSHOTS_OFFSET);
  h->refcount_order = V2_REFCOUNT_ORDER;
  h->header_len = QCOW2_V2_HEADER_LEN;
  h->compression = QCOW2_COMPRESSION_DEFLATE;
}

/* The version 3 fields, and the header length's own rules. */
static int
decode_v3_fields(const uint8_t *p, size_t len, struct qcow2_header *h,
                 char *err, size_t errlen)
{
  if (len < QCOW2_V3_HEADER_LEN)
    return fmt_fail(err, errlen, -EINVAL,
                "qcow2 version 3 header needs %u bytes, only %zu given",
                QCOW2_V3_HEADER_LEN, len);
  h->incompat = wire_get64(p + HEADER_INCOMPATIBLE_FEATURES);
  h->compat = wire_get64(p + HEADER_COMPATIBLE_FEATURES);
  h->autoclear = wire_get64(p + HEADER_AUTOCLEAR_FEATURES);
  h->refcount_order = wire_get32(p + HEADER_REFCOUNT_ORDER);
  h->header_len = wire_get32(p + HEADER_HEADER_LENGTH);
  if (h->header_len < QCOW2_V3_HEADER_LEN)
    return fmt_fail(err, errlen, -EINVAL,
                "qcow2 version 3 header length %u is shorter than %u",
                h->header_len, QCOW2_V3_HEADER_LEN);
  if (h->header_len % 8 != 0)
    return fmt_fail(err, errlen, -EINVAL, "qcow2 header length %u is not a multiple of 8",
                h->header_len);
  if (h->header_len > qcow2_cluster_size(h))
    return fmt_fail(err, errlen, -EINVAL,
                "qcow2 header length %u exceeds the cluster size %u",
                h->header_len, qcow2_cluster_size(h));
  /* Older images stop at 104 bytes: deflate, the only type then. The
   * fields past it that this code does not know need not be given. */
  if (h->header_len > HEADER_COMPRESSION_TYPE) {
    if (len <= HEADER_COMPRESSION_TYPE)
      return fmt_fail(err, errlen, -EINVAL,
                  "qcow2 header of %u bytes has its compression type at "
                  "byte 104, past the %zu bytes given",
                  h->header_len, len);
    h->compression = p[HEADER_COMPRESSION_TYPE];
  }
  return 0;
}

/* What qemu checks of the feature bits and fields that depend on them. */
static int
check_features(const struct qcow2_header *h, char *err, size_t errlen)
{
  bool zstd_bit = (h->incompat & QCOW2_INCOMPAT_COMPRESSION) != 0;
  if (h->compression != QCOW2_COMPRESSION_DEFLATE &&
      h->compression != QCOW2_COMPRESSION_ZSTD)
    return fmt_fail(err, errlen, -EINVAL,
                "qcow2 compression type %u is neither 0 (deflate) nor 1 "
                "(zstd)",
                h->compression);
  if (zstd_bit != (h->compression != QCOW2_COMPRESSION_DEFLATE))
    return fmt_fail(err, errlen, -EINVAL,
                "qcow2 compression type %u %s the compression type "
                "incompatible bit 3, which is %s",
                h->compression,
                h->compression == QCOW2_COMPRESSION_DEFLATE ? "forbids"
                                                            : "needs",
                zstd_bit ? "set" : "clear");
  if (has_extl2(h) && h->cluster_bits < EXTL2_MIN_CLUSTER_BITS)
    return fmt_fail(err, errlen, -EINVAL,
                "qcow2 extended L2 entries need clusters of at least %u "
                "bytes, not %u",
                UINT32_C(1) << EXTL2_MIN_CLUSTER_BITS, qcow2_cluster_size(h));
  if (h->refcount_order > MAX_REFCOUNT_ORDER)
    return fmt_fail(err, errlen, -EINVAL,
                "qcow2 refcount order %u is above %u (64-bit refcounts)",
                h->refcount_order, MAX_REFCOUNT_ORDER);
  return 0;
}

/* The backing file name lies in the first cluster (qemu reads it from
 * there); its place in the file is qcow2_check_layout's. */
static int
check_backing_name(const struct qcow2_header *h, char *err, size_t errlen)
{
  uint32_t cs = qcow2_cluster_size(h);
  if (h->backing_offset == 0)
    return 0;
  if (h->backing_len > QCOW2_MAX_BACKING_NAME)
    return fmt_fail(err, errlen, -EINVAL,
                "qcow2 backing file name of %u bytes is longer than %u",
                h->backing_len, QCOW2_MAX_BACKING_NAME);
  if (h->backing_offset > cs || h->backing_len > cs - h->backing_offset)
    return fmt_fail(err, errlen, -EINVAL,
                "qcow2 backing file name at byte %llu, %u bytes long, ends "
                "past the first cluster of %u bytes",
                (unsigned long long)h->backing_offset, h->backing_len, cs);
  return 0;
}

/* The order is qemu's: what the header says of itself, unknown features
 * (before anything they may change the meaning of), the feature-dependent
 * fields, the backing name, then the extensions. Only the bytes read are
 * needed (104, or 105 for the compression type); the extensions are
 * checked as far as p goes, so a reader checks them all by passing the
 * first cluster, or the whole file when it is shorter (what lies past the
 * file reads as zeroes, as in qemu). */
int
qcow2_header_decode(const uint8_t *p, size_t len, struct qcow2_header *h,
                    char *err, size_t errlen)
{
  int r;
  memset(h, 0, sizeof *h);
  if (len < 4)
    return fmt_fail(err, errlen, -EINVAL, "%zu bytes are too few for a qcow2 header", len);
  if (wire_get32(p + HEADER_MAGIC) != QCOW2_MAGIC)
    return fmt_fail(err, errlen, -EINVAL,
                "magic 0x%08x is not qcow2's 0x%08x (\"QFI\\xfb\")",
                wire_get32(p + HEADER_MAGIC), QCOW2_MAGIC);
  if (len < QCOW2_V2_HEADER_LEN)
    return fmt_fail(err, errlen, -EINVAL, "qcow2 header needs %u bytes, only %zu given",
                QCOW2_V2_HEADER_LEN, len);
  decode_v2_fields(p, h);
  if (h->version != 2 && h->version != 3)
    return fmt_fail(err, errlen, -EINVAL, h->version == 1
                    ? "a qcow image of version 1 (qemu's format 'qcow'), "
                      "which is not read here: convert it with qemu-img"
                    : "qcow2 version %u is not 2 or 3", h->version);
  if (!cluster_bits_ok(h->cluster_bits))
    return fmt_fail(err, errlen, -EINVAL,
                "qcow2 cluster bits %u are outside %u to %u (512 bytes to "
                "2 MiB)",
                h->cluster_bits, QCOW2_MIN_CLUSTER_BITS,
                QCOW2_MAX_CLUSTER_BITS);
  if (h->version == 3) {
    r = decode_v3_fields(p, len, h, err, errlen);
    if (r < 0)
      return r;
  }
  /* Without a name offset there is no backing file, whatever the length
   * says (qemu ignores it): 0 keeps backing_len within its bound. */
  if (h->backing_offset == 0)
    h->backing_len = 0;
  r = check_incompat(p, len, h, err, errlen);
  if (r < 0)
    return r;
  r = check_features(h, err, errlen);
  if (r < 0)
    return r;
  r = check_backing_name(h, err, errlen);
  if (r < 0)
    return r;
  uint64_t bad;
  if (ext_walk(p, len, h, ext_ignore, NULL, &bad) < 0)
    return fmt_fail(err, errlen, -EINVAL,
                "qcow2 header extension at byte %llu runs past byte %llu, "
                "the end of the header area",
                (unsigned long long)bad, (unsigned long long)ext_end(h));
  return 0;
}

/* A header_len below 104 (a decoded version 2 header) is written as 104,
 * the shortest version 3 header, and 104 is returned. */
size_t
qcow2_header_encode(const struct qcow2_header *h, uint8_t *out)
{
  size_t n = h->header_len < QCOW2_V3_HEADER_LEN ? QCOW2_V3_HEADER_LEN
                                                 : h->header_len;
  memset(out, 0, n);
  wire_put32(out + HEADER_MAGIC, QCOW2_MAGIC);
  wire_put32(out + HEADER_VERSION, 3);
  wire_put64(out + HEADER_BACKING_FILE_OFFSET, h->backing_offset);
  wire_put32(out + HEADER_BACKING_FILE_SIZE, h->backing_len);
  wire_put32(out + HEADER_CLUSTER_BITS, h->cluster_bits);
  wire_put64(out + HEADER_SIZE, h->size);
  wire_put32(out + HEADER_CRYPT_METHOD, h->crypt_method);
  wire_put32(out + HEADER_L1_SIZE, h->l1_entries);
  wire_put64(out + HEADER_L1_TABLE_OFFSET, h->l1_offset);
  wire_put64(out + HEADER_REFCOUNT_TABLE_OFFSET, h->refcount_offset);
  wire_put32(out + HEADER_REFCOUNT_TABLE_CLUSTERS, h->refcount_clusters);
  wire_put32(out + HEADER_NB_SNAPSHOTS, h->nb_snapshots);
  wire_put64(out + HEADER_SNAPSHOTS_OFFSET, h->snapshots_offset);
  wire_put64(out + HEADER_INCOMPATIBLE_FEATURES, h->incompat);
  wire_put64(out + HEADER_COMPATIBLE_FEATURES, h->compat);
  wire_put64(out + HEADER_AUTOCLEAR_FEATURES, h->autoclear);
  wire_put32(out + HEADER_REFCOUNT_ORDER, h->refcount_order);
  wire_put32(out + HEADER_HEADER_LENGTH, (uint32_t)n);
  if (n > HEADER_COMPRESSION_TYPE)
    out[HEADER_COMPRESSION_TYPE] = h->compression;
  return n;
}

uint64_t
qcow2_l2_entries(const struct qcow2_header *h)
{
  return UINT64_C(1) << (h->cluster_bits - (has_extl2(h) ? 4 : 3));
}

/* L1 entries needed to map size bytes: each maps a whole L2 table. With
 * size <= 2^55 and the shift at most 21 + 18, nothing overflows. */
static uint64_t
l1_needed(const struct qcow2_header *h)
{
  uint32_t shift = h->cluster_bits * 2 - (has_extl2(h) ? 4 : 3);
  uint64_t mask = (UINT64_C(1) << shift) - 1;
  return (h->size >> shift) + ((h->size & mask) != 0);
}

int
qcow2_check_layout(const struct qcow2_header *h, uint64_t file_size,
                   char *err, size_t errlen)
{
  /* Checked by the decoder; again here, as shifts depend on it. */
  if (!cluster_bits_ok(h->cluster_bits))
    return fmt_fail(err, errlen, -EINVAL,
                "qcow2 cluster bits %u are outside %u to %u (512 bytes to "
                "2 MiB)",
                h->cluster_bits, QCOW2_MIN_CLUSTER_BITS,
                QCOW2_MAX_CLUSTER_BITS);
  uint32_t cs = qcow2_cluster_size(h);
  if (h->size > QCOW2_MAX_SIZE)
    return fmt_fail(err, errlen, -EINVAL,
                "qcow2 virtual size %llu is larger than the %llu bytes "
                "supported",
                (unsigned long long)h->size,
                (unsigned long long)QCOW2_MAX_SIZE);
  if (h->l1_entries > QCOW2_MAX_L1_ENTRIES)
    return fmt_fail(err, errlen, -EINVAL,
                "qcow2 L1 table of %u entries is larger than the %u "
                "supported",
                h->l1_entries, QCOW2_MAX_L1_ENTRIES);
  if (h->l1_offset % cs != 0)
    return fmt_fail(err, errlen, -EINVAL,
                "qcow2 L1 table offset %llu is not a multiple of the "
                "cluster size %u",
                (unsigned long long)h->l1_offset, cs);
  uint64_t need = l1_needed(h);
  if (need > h->l1_entries)
    return fmt_fail(err, errlen, -EINVAL,
                "qcow2 L1 table of %u entries is too small for the virtual "
                "size %llu, which needs %llu",
                h->l1_entries, (unsigned long long)h->size,
                (unsigned long long)need);
  /* An empty table is never read: qemu takes any aligned offset. */
  uint64_t l1_bytes = (uint64_t)h->l1_entries * 8;
  if (l1_bytes != 0 &&
      (h->l1_offset > file_size || l1_bytes > file_size - h->l1_offset))
    return fmt_fail(err, errlen, -EINVAL,
                "qcow2 L1 table at byte %llu, %llu bytes long, ends past the "
                "end of the %llu-byte file",
                (unsigned long long)h->l1_offset,
                (unsigned long long)l1_bytes, (unsigned long long)file_size);
  if (h->backing_offset != 0) {
    if (h->backing_len > QCOW2_MAX_BACKING_NAME ||
        h->backing_offset > cs || h->backing_len > cs - h->backing_offset)
      return fmt_fail(err, errlen, -EINVAL,
                  "qcow2 backing file name at byte %llu, %u bytes long, is "
                  "not within the first cluster of %u bytes",
                  (unsigned long long)h->backing_offset, h->backing_len, cs);
    if (h->backing_offset > file_size ||
        h->backing_len > file_size - h->backing_offset)
      return fmt_fail(err, errlen, -EINVAL,
                  "qcow2 backing file name at byte %llu, %u bytes long, "
                  "ends past the end of the %llu-byte file",
                  (unsigned long long)h->backing_offset, h->backing_len,
                  (unsigned long long)file_size);
  }
  if (h->refcount_offset % cs != 0)
    return fmt_fail(err, errlen, -EINVAL,
                "qcow2 refcount table offset %llu is not a multiple of the "
                "cluster size %u",
                (unsigned long long)h->refcount_offset, cs);
  return 0;
}

int
qcow2_l1_decode(const struct qcow2_header *h, uint64_t entry,
                uint64_t *l2_off, char *err, size_t errlen)
{
  *l2_off = 0;
  if (entry & QCOW2_L1_RESERVED)
    return fmt_fail(err, errlen, -EINVAL,
                "qcow2 L1 entry 0x%016llx has reserved bits 0x%016llx set",
                (unsigned long long)entry,
                (unsigned long long)(entry & QCOW2_L1_RESERVED));
  uint64_t off = entry & QCOW2_OFFSET_MASK;
  if (off % qcow2_cluster_size(h) != 0)
    return fmt_fail(err, errlen, -EINVAL,
                "qcow2 L2 table offset %llu is not a multiple of the cluster "
                "size %u",
                (unsigned long long)off, qcow2_cluster_size(h));
  *l2_off = off;
  return 0;
}

/* A compressed cluster descriptor: x = 62 - (cluster_bits - 8) bits of
 * host byte offset, then cluster_bits - 8 bits counting the 512-byte
 * sectors after the first. The length is what qemu reads: to the end of
 * the last sector, at most 2^(cluster_bits + 1) bytes. */
static int
decode_compressed(const struct qcow2_header *h, uint64_t entry, uint64_t sub,
                  struct qcow2_cluster *c, char *err, size_t errlen)
{
  uint32_t size_bits = h->cluster_bits - 8;
  uint32_t x = 62 - size_bits;
  uint64_t host = entry & ((UINT64_C(1) << x) - 1);
  uint64_t sectors = (entry >> x) & ((UINT64_C(1) << size_bits) - 1);
  if (has_extl2(h) && sub != 0)
    return fmt_fail(err, errlen, -EINVAL,
                "qcow2 compressed cluster 0x%016llx has subcluster bits "
                "0x%016llx set",
                (unsigned long long)entry, (unsigned long long)sub);
  if (host >= HOST_OFFSET_LIMIT)
    return fmt_fail(err, errlen, -EINVAL,
                "qcow2 compressed cluster 0x%016llx has host offset %llu, "
                "at or past 2^56",
                (unsigned long long)entry, (unsigned long long)host);
  c->kind = QCOW2_COMPRESSED;
  c->host_off = host;
  c->comp_len = (sectors + 1) * COMPRESSED_SECTOR - host % COMPRESSED_SECTOR;
  return 0;
}

int
qcow2_l2_decode(const struct qcow2_header *h, uint64_t entry, uint64_t sub,
                struct qcow2_cluster *c, char *err, size_t errlen)
{
  memset(c, 0, sizeof *c);
  c->kind = QCOW2_UNALLOCATED;
  if (!cluster_bits_ok(h->cluster_bits))
    return fmt_fail(err, errlen, -EINVAL, "qcow2 cluster bits %u are outside %u to %u",
                h->cluster_bits, QCOW2_MIN_CLUSTER_BITS,
                QCOW2_MAX_CLUSTER_BITS);
  if (entry & QCOW2_OFLAG_COMPRESSED)
    return decode_compressed(h, entry, sub, c, err, errlen);

  uint64_t off = entry & QCOW2_OFFSET_MASK;
  bool zero = (entry & QCOW2_OFLAG_ZERO) != 0;
  if (entry & QCOW2_L2_RESERVED)
    return fmt_fail(err, errlen, -EINVAL,
                "qcow2 L2 entry 0x%016llx has reserved bits 0x%016llx set",
                (unsigned long long)entry,
                (unsigned long long)(entry & QCOW2_L2_RESERVED));
  if (zero && h->version < 3)
    return fmt_fail(err, errlen, -EINVAL,
                "qcow2 L2 entry 0x%016llx has the zero flag, which version "
                "%u does not have",
                (unsigned long long)entry, h->version);
  if (zero && has_extl2(h))
    return fmt_fail(err, errlen, -EINVAL,
                "qcow2 extended L2 entry 0x%016llx has the zero flag, which "
                "subclusters replace",
                (unsigned long long)entry);
  if (off % qcow2_cluster_size(h) != 0)
    return fmt_fail(err, errlen, -EINVAL,
                "qcow2 cluster offset %llu is not a multiple of the cluster "
                "size %u",
                (unsigned long long)off, qcow2_cluster_size(h));
  /* With an external data file, offset 0 is a place like any other and
   * the copied bit tells it from unallocated (qemu does the same). */
  bool allocated = off != 0 || ((h->incompat & QCOW2_INCOMPAT_DATA_FILE) &&
                                (entry & QCOW2_OFLAG_COPIED));
  c->host_off = off; /* for ZERO: a preallocation, never read */
  if (!has_extl2(h)) {
    c->kind = zero ? QCOW2_ZERO : allocated ? QCOW2_NORMAL : QCOW2_UNALLOCATED;
    return 0;
  }
  c->sub_alloc = (uint32_t)sub;
  c->sub_zero = (uint32_t)(sub >> 32);
  if (c->sub_alloc & c->sub_zero)
    return fmt_fail(err, errlen, -EINVAL,
                "qcow2 subclusters 0x%08x are both allocated and zero in "
                "L2 entry 0x%016llx",
                c->sub_alloc & c->sub_zero, (unsigned long long)entry);
  if (!allocated && c->sub_alloc != 0)
    return fmt_fail(err, errlen, -EINVAL,
                "qcow2 unallocated cluster has allocated subclusters 0x%08x",
                c->sub_alloc);
  c->kind = allocated ? QCOW2_NORMAL : QCOW2_UNALLOCATED;
  return 0;
}
