/* qcow2_layout.h: the qcow2 on-disk structures (qemu docs/interop/
 * qcow2.rst: header, header extensions, L1 and L2 entries, compressed
 * cluster descriptors, refcount entries), decoded from and encoded into
 * byte buffers. Pure: no I/O, no allocation, so that fuzz/fuzz-qcow2.c
 * can feed it anything. Every field is big-endian.
 *
 * The decoders check what the header can say about itself and about the
 * file (tables inside it, sizes bounded); the I/O side (qcow2.c) reads
 * the tables and follows backing files. Nothing here sizes an allocation
 * from a field it did not bound first. */
#ifndef NBDFLOW_FORMAT_QCOW2_LAYOUT_H
#define NBDFLOW_FORMAT_QCOW2_LAYOUT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define QCOW2_MAGIC 0x514649FBu /* "QFI\xfb" */
#define QCOW2_V2_HEADER_LEN 72u
#define QCOW2_V3_HEADER_LEN 104u
#define QCOW2_MIN_CLUSTER_BITS 9u  /* 512 B */
#define QCOW2_MAX_CLUSTER_BITS 21u /* 2 MiB, qemu's limit */
#define QCOW2_MAX_BACKING_NAME 1023u
/* Largest virtual size we open: 2^56 bytes would overflow the offset
 * bits of an entry; qemu's own limit is 2^55 (32 MiB L1 tables). */
#define QCOW2_MAX_SIZE (UINT64_C(1) << 55)
/* L1 entries read into memory: qemu's limit (32 MiB of table). */
#define QCOW2_MAX_L1_ENTRIES (UINT32_C(1) << 22)

/* Incompatible feature bits. */
#define QCOW2_INCOMPAT_DIRTY (UINT64_C(1) << 0)
#define QCOW2_INCOMPAT_CORRUPT (UINT64_C(1) << 1)
#define QCOW2_INCOMPAT_DATA_FILE (UINT64_C(1) << 2)
#define QCOW2_INCOMPAT_COMPRESSION (UINT64_C(1) << 3)
#define QCOW2_INCOMPAT_EXTL2 (UINT64_C(1) << 4)
#define QCOW2_INCOMPAT_KNOWN UINT64_C(0x1f)
/* Where the incompatible features field lies in the header. */
#define QCOW2_HEADER_INCOMPAT_OFFSET 72

#define QCOW2_COMPAT_LAZY_REFCOUNTS (UINT64_C(1) << 0)

/* Header extension types. */
#define QCOW2_EXT_END 0u
#define QCOW2_EXT_BACKING_FORMAT 0xE2792ACAu
#define QCOW2_EXT_FEATURE_TABLE 0x6803F857u
#define QCOW2_EXT_BITMAPS 0x23852875u
#define QCOW2_EXT_ENCRYPTION 0x0537BE77u
#define QCOW2_EXT_DATA_FILE 0x44415441u

#define QCOW2_COMPRESSION_DEFLATE 0u
#define QCOW2_COMPRESSION_ZSTD 1u

/* L1 and L2 entry bits. */
#define QCOW2_OFLAG_COPIED (UINT64_C(1) << 63)
#define QCOW2_OFLAG_COMPRESSED (UINT64_C(1) << 62)
#define QCOW2_OFLAG_ZERO UINT64_C(1)
#define QCOW2_OFFSET_MASK UINT64_C(0x00fffffffffffe00) /* bits 9-55 */
#define QCOW2_L1_RESERVED UINT64_C(0x7f000000000001ff)
#define QCOW2_L2_RESERVED UINT64_C(0x3f000000000001fe)

struct qcow2_header {
  uint32_t version;         /* 2 or 3 */
  uint64_t backing_offset;  /* 0: no backing file */
  uint32_t backing_len;     /* <= QCOW2_MAX_BACKING_NAME */
  uint32_t cluster_bits;
  uint64_t size;            /* virtual */
  uint32_t crypt_method;
  uint32_t l1_entries;
  uint64_t l1_offset;
  uint64_t refcount_offset;
  uint32_t refcount_clusters;
  uint32_t nb_snapshots;
  uint64_t snapshots_offset;
  uint64_t incompat;        /* v3; 0 for v2 */
  uint64_t compat;
  uint64_t autoclear;
  uint32_t refcount_order;  /* v3; 4 for v2 */
  uint32_t header_len;      /* v3; 72 for v2 */
  uint8_t compression;      /* QCOW2_COMPRESSION_*; deflate unless the
                               header is long enough to say */
};

/* Decodes the header from the first len bytes of the file. Fails with
 * -EINVAL and one sentence in err on: a wrong magic, a version other than
 * 2 or 3, cluster bits outside [9, 21], a header length too short for
 * its version or longer than a cluster, a backing name longer than 1023
 * bytes, backing name or header extensions past the first cluster (see
 * qcow2_check_layout for what needs the file's size), an unknown
 * incompatible bit (named by number),
 * a compression type other than deflate or zstd. Encryption, external
 * data files and the corrupt bit are decoded, not refused: the reader
 * refuses them by name. */
int qcow2_header_decode(const uint8_t *p, size_t len, struct qcow2_header *h,
                        char *err, size_t errlen);
/* Encodes h as a version 3 header of h->header_len bytes (104, or 112
 * with the compression type at byte 104 and zero padding, as qemu writes
 * it) into out, which has room for them. Returns h->header_len. */
size_t qcow2_header_encode(const struct qcow2_header *h, uint8_t *out);

/* Checks what the header says against a file of file_size bytes: the L1
 * table (l1_entries x 8 bytes at an aligned l1_offset) inside it and
 * large enough for the virtual size, the size within QCOW2_MAX_SIZE, the
 * L1 within QCOW2_MAX_L1_ENTRIES, the backing name inside the first
 * cluster and the file. Overflow-safe. 0 or -EINVAL with err. */
int qcow2_check_layout(const struct qcow2_header *h, uint64_t file_size,
                       char *err, size_t errlen);

/* A header extension at p (len bytes left in the header area): its type,
 * its data and the bytes the whole extension takes (8 + length padded to
 * 8). Returns 0, or -EINVAL when it does not fit in len. */
struct qcow2_ext {
  uint32_t type;
  const uint8_t *data;
  uint32_t len;
  size_t total;
};
int qcow2_ext_decode(const uint8_t *p, size_t len, struct qcow2_ext *x);

static inline uint32_t
qcow2_cluster_size(const struct qcow2_header *h)
{
  return UINT32_C(1) << h->cluster_bits;
}
/* L2 entries per table: cluster/8, or cluster/16 with extended L2. */
uint64_t qcow2_l2_entries(const struct qcow2_header *h);

/* What one guest cluster is, from its L2 entry (and, with extended L2,
 * the subcluster bitmap word). */
enum qcow2_kind {
  QCOW2_UNALLOCATED, /* read from the backing file, or zeroes */
  QCOW2_ZERO,        /* reads as zeroes */
  QCOW2_NORMAL,      /* data at host_off */
  QCOW2_COMPRESSED,  /* compressed: host_off, comp_len bytes at most */
};

struct qcow2_cluster {
  enum qcow2_kind kind;
  uint64_t host_off;  /* NORMAL: cluster-aligned; COMPRESSED: any byte */
  uint64_t comp_len;  /* COMPRESSED: bytes to read from host_off */
  /* Extended L2: per subcluster (32 of them), allocated / reads-as-zero
   * bits; the cluster kind is then NORMAL or UNALLOCATED and these say
   * which subclusters hold what. 0 without extended L2. */
  uint32_t sub_alloc;
  uint32_t sub_zero;
};

/* Decodes an L2 entry (entry, and sub for extended L2: the second u64)
 * for a header h. Fails (-EINVAL, err) on reserved bits set, an offset
 * not aligned to a cluster for a normal cluster, a compressed cluster in
 * an extended-L2 image with subcluster bits set, or subcluster bits both
 * allocated and zero. */
int qcow2_l2_decode(const struct qcow2_header *h, uint64_t entry,
                    uint64_t sub, struct qcow2_cluster *c, char *err,
                    size_t errlen);
/* The L2 table offset of an L1 entry (0: unallocated); -EINVAL when its
 * reserved bits are set or it is not cluster-aligned. */
int qcow2_l1_decode(const struct qcow2_header *h, uint64_t entry,
                    uint64_t *l2_off, char *err, size_t errlen);

static inline uint64_t
qcow2_get64(const uint8_t *p)
{
  uint64_t v = 0;
  for (int i = 0; i < 8; i++)
    v = v << 8 | p[i];
  return v;
}

static inline void
qcow2_put64(uint8_t *p, uint64_t v)
{
  for (int i = 7; i >= 0; i--, v >>= 8)
    p[i] = (uint8_t)v;
}

#endif
