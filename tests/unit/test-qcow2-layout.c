/* test-qcow2-layout.c: unit tests for src/format/qcow2_layout.{h,c}.
 *
 * The headers, header extensions, L1/L2 entries and compressed bytes
 * below were written by qemu-img and qemu-io 7.2:
 *   qemu-img create -f qcow2 -o compat=0.10 v2.qcow2 64M
 *   qemu-img create -f qcow2 -o compat=0.10 -b v2.qcow2 -F qcow2 v2back.qcow2
 *   qemu-img create -f qcow2 -o compat=1.1 v3.qcow2 64M
 *   qemu-img create -f qcow2 -o cluster_size=512 c512.qcow2 64M  (and 2M)
 *   qemu-img create -f qcow2 -o extended_l2=on extl2.qcow2 64M
 *   qemu-img create -f qcow2 -o compression_type=zstd zstd.qcow2 64M
 *   qemu-img create -f qcow2 -b v3.qcow2 -F qcow2 back.qcow2  (and -F raw)
 * then data written with qemu-io -c 'write -P 0x55 0 64k' -c 'write -z 1M
 * 64k' -c 'write -P 0xaa 2M 64k' (v3data, v2data, c512data; extdata with
 * subcluster-sized writes), and `qemu-img convert -c` of a raw file whose
 * first cluster is 64 KiB of 0x55 and second 700 bytes of lcg() then
 * zeroes (compm). The header area of every v3 image with 64 KiB clusters
 * is its 112-byte header then the same feature table (feature_area), so
 * it is stored once. Inputs are heap allocated to their exact size so
 * that AddressSanitizer sees any read past them. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "format/qcow2_layout.h"
#include "proto/wire.h"
#include "tap.h"

#define EINVAL_RC ((uint64_t)(int64_t)-EINVAL)
#define MIB (UINT64_C(1) << 20)

/* v2.qcow2: the 72-byte header, then the end of extensions. */
static const uint8_t v2_head[80] = {
  0x51, 0x46, 0x49, 0xfb, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00, 0x00,
  0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x10,
  0x00, 0x00, 0x00, 0x00, 0x04, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
  0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x03, 0x00, 0x00,
  0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01,
  0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
  0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
};

/* v2back.qcow2: header, a backing format extension ("qcow2"), the end
 * marker, and the backing file name "v2.qcow2" at 96. */
static const uint8_t v2back_head[104] = {
  0x51, 0x46, 0x49, 0xfb, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00, 0x00,
  0x00, 0x00, 0x00, 0x60, 0x00, 0x00, 0x00, 0x08, 0x00, 0x00, 0x00, 0x10,
  0x00, 0x00, 0x00, 0x00, 0x04, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
  0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x03, 0x00, 0x00,
  0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01,
  0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
  0xe2, 0x79, 0x2a, 0xca, 0x00, 0x00, 0x00, 0x05, 0x71, 0x63, 0x6f, 0x77,
  0x32, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
  0x76, 0x32, 0x2e, 0x71, 0x63, 0x6f, 0x77, 0x32,
};

/* v3.qcow2 (compat=1.1, 64 KiB clusters): the 112-byte header. */
static const uint8_t v3_head[112] = {
  0x51, 0x46, 0x49, 0xfb, 0x00, 0x00, 0x00, 0x03, 0x00, 0x00, 0x00, 0x00,
  0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x10,
  0x00, 0x00, 0x00, 0x00, 0x04, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
  0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x03, 0x00, 0x00,
  0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01,
  0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
  0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
  0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
  0x00, 0x00, 0x00, 0x04, 0x00, 0x00, 0x00, 0x70, 0x00, 0x00, 0x00, 0x00,
  0x00, 0x00, 0x00, 0x00,
};

/* Bytes 112-511 of every 64 KiB-cluster v3 image: the feature name table
 * extension (8 entries of 48 bytes) and the end marker. */
static const uint8_t feature_area[400] = {
  0x68, 0x03, 0xf8, 0x57, 0x00, 0x00, 0x01, 0x80, 0x00, 0x00, 0x64, 0x69,
  0x72, 0x74, 0x79, 0x20, 0x62, 0x69, 0x74, 0x00, 0x00, 0x00, 0x00, 0x00,
  0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
  0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
  0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x63, 0x6f,
  0x72, 0x72, 0x75, 0x70, 0x74, 0x20, 0x62, 0x69, 0x74, 0x00, 0x00, 0x00,
  0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
  0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
  0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x02, 0x65, 0x78,
  0x74, 0x65, 0x72, 0x6e, 0x61, 0x6c, 0x20, 0x64, 0x61, 0x74, 0x61, 0x20,
  0x66, 0x69, 0x6c, 0x65, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
  0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
  0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x03, 0x63, 0x6f,
  0x6d, 0x70, 0x72, 0x65, 0x73, 0x73, 0x69, 0x6f, 0x6e, 0x20, 0x74, 0x79,
  0x70, 0x65, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
  0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
  0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x04, 0x65, 0x78,
  0x74, 0x65, 0x6e, 0x64, 0x65, 0x64, 0x20, 0x4c, 0x32, 0x20, 0x65, 0x6e,
  0x74, 0x72, 0x69, 0x65, 0x73, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
  0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
  0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x00, 0x6c, 0x61,
  0x7a, 0x79, 0x20, 0x72, 0x65, 0x66, 0x63, 0x6f, 0x75, 0x6e, 0x74, 0x73,
  0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
  0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
  0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x02, 0x00, 0x62, 0x69,
  0x74, 0x6d, 0x61, 0x70, 0x73, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
  0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
  0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
  0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x02, 0x01, 0x72, 0x61,
  0x77, 0x20, 0x65, 0x78, 0x74, 0x65, 0x72, 0x6e, 0x61, 0x6c, 0x20, 0x64,
  0x61, 0x74, 0x61, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
  0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
  0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
  0x00, 0x00, 0x00, 0x00,
};

/* c512.qcow2 (512-byte clusters): header and end marker; qemu-img
 * leaves the feature table out of so small a cluster. */
static const uint8_t c512_head[120] = {
  0x51, 0x46, 0x49, 0xfb, 0x00, 0x00, 0x00, 0x03, 0x00, 0x00, 0x00, 0x00,
  0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x09,
  0x00, 0x00, 0x00, 0x00, 0x04, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
  0x00, 0x00, 0x08, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x06, 0x00,
  0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00, 0x00, 0x01,
  0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
  0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
  0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
  0x00, 0x00, 0x00, 0x04, 0x00, 0x00, 0x00, 0x70, 0x00, 0x00, 0x00, 0x00,
  0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
};

/* c2m.qcow2 (2 MiB clusters): the header. */
static const uint8_t c2m_head[112] = {
  0x51, 0x46, 0x49, 0xfb, 0x00, 0x00, 0x00, 0x03, 0x00, 0x00, 0x00, 0x00,
  0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x15,
  0x00, 0x00, 0x00, 0x00, 0x04, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
  0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x60, 0x00, 0x00,
  0x00, 0x00, 0x00, 0x00, 0x00, 0x20, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01,
  0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
  0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
  0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
  0x00, 0x00, 0x00, 0x04, 0x00, 0x00, 0x00, 0x70, 0x00, 0x00, 0x00, 0x00,
  0x00, 0x00, 0x00, 0x00,
};

/* extl2.qcow2 (extended_l2=on): the header; incompatible bit 4. */
static const uint8_t extl2_head[112] = {
  0x51, 0x46, 0x49, 0xfb, 0x00, 0x00, 0x00, 0x03, 0x00, 0x00, 0x00, 0x00,
  0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x10,
  0x00, 0x00, 0x00, 0x00, 0x04, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
  0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x03, 0x00, 0x00,
  0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01,
  0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
  0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x10, 0x00, 0x00, 0x00, 0x00,
  0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
  0x00, 0x00, 0x00, 0x04, 0x00, 0x00, 0x00, 0x70, 0x00, 0x00, 0x00, 0x00,
  0x00, 0x00, 0x00, 0x00,
};

/* zstd.qcow2: the header; compression type 1 at byte 104, bit 3. */
static const uint8_t zstd_head[112] = {
  0x51, 0x46, 0x49, 0xfb, 0x00, 0x00, 0x00, 0x03, 0x00, 0x00, 0x00, 0x00,
  0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x10,
  0x00, 0x00, 0x00, 0x00, 0x04, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
  0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x03, 0x00, 0x00,
  0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01,
  0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
  0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x08, 0x00, 0x00, 0x00, 0x00,
  0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
  0x00, 0x00, 0x00, 0x04, 0x00, 0x00, 0x00, 0x70, 0x01, 0x00, 0x00, 0x00,
  0x00, 0x00, 0x00, 0x00,
};

/* back.qcow2 (-b v3.qcow2 -F qcow2): header, backing format extension;
 * then feature_area's table, the end marker at 520, the name at 528. */
static const uint8_t back_head[128] = {
  0x51, 0x46, 0x49, 0xfb, 0x00, 0x00, 0x00, 0x03, 0x00, 0x00, 0x00, 0x00,
  0x00, 0x00, 0x02, 0x10, 0x00, 0x00, 0x00, 0x08, 0x00, 0x00, 0x00, 0x10,
  0x00, 0x00, 0x00, 0x00, 0x04, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
  0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x03, 0x00, 0x00,
  0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01,
  0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
  0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
  0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
  0x00, 0x00, 0x00, 0x04, 0x00, 0x00, 0x00, 0x70, 0x00, 0x00, 0x00, 0x00,
  0x00, 0x00, 0x00, 0x00, 0xe2, 0x79, 0x2a, 0xca, 0x00, 0x00, 0x00, 0x05,
  0x71, 0x63, 0x6f, 0x77, 0x32, 0x00, 0x00, 0x00,
};

/* backraw.qcow2 (-b base.raw -F raw): the same with "raw". */
static const uint8_t backraw_head[128] = {
  0x51, 0x46, 0x49, 0xfb, 0x00, 0x00, 0x00, 0x03, 0x00, 0x00, 0x00, 0x00,
  0x00, 0x00, 0x02, 0x10, 0x00, 0x00, 0x00, 0x08, 0x00, 0x00, 0x00, 0x10,
  0x00, 0x00, 0x00, 0x00, 0x04, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
  0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x03, 0x00, 0x00,
  0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01,
  0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
  0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
  0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
  0x00, 0x00, 0x00, 0x04, 0x00, 0x00, 0x00, 0x70, 0x00, 0x00, 0x00, 0x00,
  0x00, 0x00, 0x00, 0x00, 0xe2, 0x79, 0x2a, 0xca, 0x00, 0x00, 0x00, 0x03,
  0x72, 0x61, 0x77, 0x00, 0x00, 0x00, 0x00, 0x00,
};

/* compm.qcow2 (4 MiB, qemu-img convert -c): the header. */
static const uint8_t compm_head[112] = {
  0x51, 0x46, 0x49, 0xfb, 0x00, 0x00, 0x00, 0x03, 0x00, 0x00, 0x00, 0x00,
  0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x10,
  0x00, 0x00, 0x00, 0x00, 0x00, 0x40, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
  0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x03, 0x00, 0x00,
  0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01,
  0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
  0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
  0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
  0x00, 0x00, 0x00, 0x04, 0x00, 0x00, 0x00, 0x70, 0x00, 0x00, 0x00, 0x00,
  0x00, 0x00, 0x00, 0x00,
};

/* compm.qcow2 bytes 0x50000-0x503ce, the rest of its last sector
 * (to the end of the file at 0x50400) being zeroes: the deflate streams
 * of its two compressed clusters. */
static const uint8_t compm_data[974] = {
  0xed, 0xc1, 0x81, 0x00, 0x00, 0x00, 0x00, 0x80, 0x20, 0xca, 0xfd, 0x55,
  0x16, 0xa9, 0x0a, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
  0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
  0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
  0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
  0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
  0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x6a, 0xed, 0xc1, 0xfb, 0x37, 0x15,
  0x06, 0x00, 0xc0, 0xf1, 0x32, 0xef, 0x59, 0xe1, 0xca, 0x94, 0x57, 0x9d,
  0x39, 0x1b, 0x42, 0x3b, 0xb6, 0x09, 0x9b, 0x19, 0x61, 0x1d, 0xe3, 0xcc,
  0x6a, 0x3b, 0x5e, 0xe9, 0x7a, 0x4c, 0x99, 0x62, 0xb7, 0xa6, 0x15, 0x33,
  0x74, 0xda, 0x3c, 0xea, 0xd6, 0x51, 0xe8, 0x16, 0x71, 0x70, 0xd6, 0xe6,
  0x39, 0x13, 0xa1, 0x4b, 0xd6, 0x72, 0x77, 0x0c, 0x1b, 0x5d, 0xaf, 0xa6,
  0x70, 0x4d, 0xba, 0xad, 0x88, 0xa1, 0x2b, 0x4c, 0xd9, 0x3f, 0xb1, 0x1f,
  0xbf, 0x9f, 0xcf, 0xb0, 0x7a, 0x74, 0x85, 0x65, 0xb5, 0x79, 0xc8, 0x9d,
  0xfb, 0x55, 0xa6, 0x16, 0x42, 0x81, 0x28, 0xf1, 0xe0, 0x33, 0xfd, 0xd5,
  0x8d, 0x35, 0xe1, 0xe6, 0xea, 0x55, 0xf5, 0xe6, 0x6a, 0x5b, 0x7d, 0x8e,
  0x7d, 0xe1, 0x3a, 0xa7, 0x10, 0xfe, 0xd8, 0xa8, 0x1d, 0x2c, 0x9f, 0x76,
  0xd1, 0xef, 0xda, 0x99, 0x77, 0xf5, 0xf7, 0x2c, 0x1b, 0x83, 0x55, 0xcd,
  0x86, 0x48, 0x07, 0xc5, 0x3b, 0x4b, 0x6f, 0x3d, 0xfb, 0x20, 0xd7, 0xba,
  0x53, 0x27, 0xd9, 0xab, 0x4e, 0x6d, 0xef, 0x79, 0x61, 0xdd, 0xa3, 0xb8,
  0xaa, 0x7e, 0xfb, 0xe3, 0xf1, 0x9f, 0xd5, 0x8c, 0x29, 0x33, 0xfc, 0x2e,
  0xa9, 0x3f, 0xe8, 0x75, 0x0a, 0xb3, 0x0b, 0xef, 0x78, 0xf4, 0x24, 0x71,
  0x21, 0xbd, 0x78, 0x32, 0xe7, 0xd5, 0x89, 0x48, 0xc3, 0x81, 0x97, 0xba,
  0xea, 0x8e, 0x6e, 0x88, 0x8d, 0x75, 0x8d, 0x91, 0x9e, 0xb9, 0x9b, 0xa0,
  0xed, 0x53, 0x34, 0xdf, 0x5d, 0xa7, 0xbb, 0x78, 0x6b, 0x24, 0xa6, 0x79,
  0x51, 0xb8, 0x6c, 0x35, 0xd7, 0xbb, 0x62, 0x92, 0xf1, 0xef, 0x9e, 0x0c,
  0x69, 0xbd, 0xb3, 0xe3, 0xe5, 0x02, 0x53, 0x37, 0xfd, 0xe4, 0xa7, 0xc7,
  0x06, 0x53, 0xc7, 0xe3, 0x16, 0x0d, 0xce, 0xda, 0xa4, 0xe4, 0xe4, 0x75,
  0x19, 0xfe, 0x1a, 0xd8, 0x1d, 0x32, 0xdb, 0x6f, 0x6c, 0x72, 0x7b, 0x63,
  0x8b, 0x7a, 0x68, 0xca, 0xc5, 0xe8, 0xd9, 0xd2, 0xdc, 0x43, 0x32, 0xdb,
  0xaa, 0xd8, 0x72, 0x67, 0xd9, 0x91, 0xf6, 0x6a, 0x47, 0x67, 0x35, 0x4b,
  0x8d, 0xb7, 0xed, 0x2e, 0x6e, 0x5a, 0x99, 0xdc, 0x30, 0xda, 0x13, 0x23,
  0x1d, 0x4b, 0x6e, 0x19, 0xb4, 0x90, 0x98, 0xe6, 0xbf, 0x58, 0xd8, 0x2a,
  0x89, 0xea, 0x3b, 0xb7, 0x52, 0xa3, 0x28, 0x15, 0x4b, 0x5e, 0xf1, 0x8e,
  0x9c, 0x1c, 0xd1, 0x8a, 0x16, 0xad, 0x06, 0x65, 0xc5, 0xf6, 0x3c, 0xed,
  0x9c, 0x76, 0x37, 0x7b, 0x38, 0xa1, 0x1b, 0x73, 0x7f, 0x34, 0xe7, 0xb4,
  0xf3, 0xa5, 0xaf, 0xaf, 0xdf, 0x0e, 0xd5, 0xe9, 0x7f, 0x30, 0xfe, 0x86,
  0x97, 0xbb, 0xaf, 0x58, 0x56, 0x92, 0x3d, 0xd8, 0xd4, 0x34, 0x1c, 0x21,
  0x94, 0x9f, 0xb1, 0x6e, 0x0d, 0x5e, 0x57, 0x11, 0x60, 0x1a, 0x70, 0x32,
  0xd6, 0xc9, 0x46, 0x29, 0x52, 0x7c, 0x72, 0x54, 0x3a, 0xec, 0x15, 0xb7,
  0xa3, 0xb9, 0x5c, 0xfb, 0xe5, 0xc1, 0x1b, 0x0b, 0x5f, 0x69, 0x47, 0x88,
  0x86, 0xec, 0x3b, 0x0c, 0x0f, 0x87, 0x5a, 0xa5, 0xdc, 0x1c, 0xbf, 0x53,
  0x7b, 0x45, 0xbd, 0x68, 0x73, 0x5a, 0xc2, 0xf6, 0xfc, 0xcf, 0xb3, 0xf5,
  0x46, 0x1c, 0xf6, 0x1e, 0x56, 0xe9, 0xec, 0x6c, 0x08, 0x92, 0x4b, 0x1e,
  0xb6, 0x89, 0x6b, 0xe3, 0xfb, 0x46, 0x0c, 0xbd, 0x22, 0x1d, 0xf5, 0x8c,
  0x7e, 0xa8, 0x71, 0x5f, 0xd6, 0x1b, 0x1d, 0x14, 0x74, 0x0b, 0xd2, 0xbb,
  0x02, 0x8b, 0xdf, 0x9f, 0x08, 0x6d, 0x95, 0x7b, 0xd7, 0x3b, 0x0d, 0x64,
  0x3e, 0xef, 0x5d, 0xe3, 0x31, 0x97, 0x51, 0xbb, 0xfe, 0x84, 0x30, 0x21,
  0x5a, 0x6a, 0xed, 0x63, 0xbc, 0x4b, 0x91, 0x59, 0x2a, 0x18, 0xfa, 0xd9,
  0x73, 0xa6, 0xd1, 0xe0, 0xea, 0xa8, 0x56, 0x6a, 0x47, 0xa2, 0xf4, 0x5e,
  0x59, 0x90, 0x6f, 0xf9, 0xdf, 0xf6, 0x65, 0xfe, 0x01, 0x85, 0xca, 0x0b,
  0x07, 0xc6, 0xcb, 0xf3, 0x7b, 0xb6, 0xf8, 0xed, 0xb3, 0x15, 0x0f, 0x64,
  0x1b, 0x6c, 0xbf, 0xb0, 0x3f, 0xab, 0xb9, 0x7a, 0xfe, 0xa3, 0xd3, 0x82,
  0x6a, 0x95, 0x59, 0xc9, 0xda, 0xdc, 0xaa, 0x9f, 0xbe, 0x39, 0xa8, 0x3a,
  0xa9, 0xb2, 0x4d, 0x3a, 0xab, 0x9a, 0xaf, 0xdc, 0x96, 0xee, 0x28, 0x3d,
  0xee, 0xbd, 0xd9, 0xad, 0x6d, 0xbf, 0x51, 0x66, 0xd2, 0x91, 0xec, 0xdf,
  0xa2, 0xda, 0xb5, 0xc6, 0x2c, 0x6e, 0x8a, 0x5e, 0xc8, 0x97, 0x9f, 0x32,
  0x76, 0xb7, 0x5a, 0x68, 0x1b, 0xdd, 0x3a, 0x13, 0x16, 0x22, 0x57, 0x7e,
  0x29, 0x48, 0xec, 0xf4, 0x34, 0xbe, 0xa6, 0x5f, 0xa1, 0x31, 0x74, 0xe2,
  0xf5, 0x76, 0xdd, 0x9e, 0x6f, 0xff, 0xd9, 0xd7, 0x35, 0x35, 0x53, 0x95,
  0xe5, 0xb7, 0xdc, 0x68, 0x69, 0x22, 0x6d, 0x7b, 0x53, 0xd1, 0x10, 0xee,
  0x7b, 0x25, 0xcd, 0xf1, 0x0f, 0x97, 0x92, 0x78, 0x45, 0xae, 0x97, 0xd1,
  0x5f, 0xf3, 0xdf, 0x4f, 0xfd, 0xf2, 0xc4, 0x65, 0x87, 0xe6, 0x8d, 0x82,
  0xc8, 0xc2, 0x7b, 0xae, 0x7d, 0x11, 0x33, 0x6d, 0xbb, 0x0f, 0xdc, 0xfa,
  0xf0, 0xbc, 0xe5, 0xb4, 0xff, 0xf5, 0x79, 0x0d, 0x7b, 0xc9, 0x73, 0x99,
  0xbc, 0xc0, 0xfb, 0xb5, 0xfa, 0x52, 0x59, 0xee, 0x9f, 0x9f, 0xbe, 0xdb,
  0x74, 0xe8, 0x9a, 0xcc, 0x72, 0xf7, 0x29, 0xed, 0x3c, 0xb3, 0x22, 0xe1,
  0x7b, 0x5b, 0x56, 0x25, 0x49, 0x9b, 0xfc, 0x53, 0x45, 0xe2, 0xca, 0x6d,
  0xc9, 0xcb, 0x69, 0xa6, 0x9e, 0x9d, 0xaa, 0xbb, 0xe2, 0x25, 0xbb, 0x26,
  0x65, 0x8a, 0xc7, 0xc2, 0x52, 0xea, 0xda, 0x89, 0x32, 0xa7, 0xb8, 0xef,
  0xa6, 0x4a, 0x1f, 0x4b, 0x45, 0x8f, 0x3f, 0x0e, 0x9c, 0x2c, 0x96, 0x44,
  0x79, 0x64, 0xf9, 0xfb, 0x07, 0xc7, 0x28, 0xcf, 0xb5, 0xec, 0xa9, 0x5c,
  0x37, 0xaf, 0x9f, 0xa8, 0x59, 0x78, 0xd9, 0x6d, 0x76, 0x57, 0x98, 0xc3,
  0x1a, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
  0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
  0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
  0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
  0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
  0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
  0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
  0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0xff,
  0xab, 0xff,
};

/* compm's second cluster: the same generator as the script that wrote
 * the raw file (a 31-bit LCG, bits 16-23 of each state). */
static void
lcg(uint8_t *out, size_t n)
{
  uint32_t s = 12345;
  for (size_t i = 0; i < n; i++) {
    s = (s * 1103515245u + 12345u) & 0x7fffffffu;
    out[i] = (uint8_t)(s >> 16);
  }
}

/* A fresh allocation of exactly n bytes (at least 1). Caller frees. */
static uint8_t *
alloc_exact(size_t n)
{
  uint8_t *b = malloc(n ? n : 1);
  if (b == NULL) {
    perror("malloc");
    exit(2);
  }
  return b;
}

/* Copies n bytes into a fresh allocation of exactly n bytes. Caller
 * frees. */
static uint8_t *
dup_exact(const void *p, size_t n)
{
  uint8_t *b = alloc_exact(n);
  if (n)
    memcpy(b, p, n);
  return b;
}

/* A header area of exactly a + b bytes: a then b. Caller frees. */
static uint8_t *
cat2(const uint8_t *a, size_t alen, const uint8_t *b, size_t blen)
{
  uint8_t *p = alloc_exact(alen + blen);
  memcpy(p, a, alen);
  memcpy(p + alen, b, blen);
  return p;
}

/* The first 512 bytes of a 64 KiB-cluster v3 image made by qemu-img. */
static uint8_t *
v3_area(const uint8_t head[112])
{
  return cat2(head, 112, feature_area, sizeof feature_area);
}

#define V3_AREA_LEN (112 + sizeof feature_area)

/* back.qcow2's first 536 bytes from its parts. */
static uint8_t *
back_area(const uint8_t head[128], const char *name)
{
  uint8_t *p = alloc_exact(536);
  memcpy(p, head, 128);
  memcpy(p + 128, feature_area, 392); /* the table, not its end marker */
  memset(p + 520, 0, 8);
  memcpy(p + 528, name, 8);
  return p;
}

static int
decode(const uint8_t *p, size_t len, struct qcow2_header *h, char *err,
       size_t errlen)
{
  uint8_t *b = dup_exact(p, len);
  err[0] = '\0';
  int r = qcow2_header_decode(b, len, h, err, errlen);
  free(b);
  return r;
}

/* Refused with -EINVAL and a message that contains want. */
#define refused(r, err, want, ...)                                           \
  do {                                                                       \
    int r_ = (r);                                                            \
    if (!ok(r_ == -EINVAL && strstr(err, want) != NULL, __VA_ARGS__))       \
      printf("#   got %d \"%s\", want \"%s\"\n", r_, err, want);             \
  } while (0)

/* Walks the extensions of a decoded header over the first len bytes as a
 * reader does; returns their number up to the end marker, and their
 * types, lengths and offsets in the arrays (room for 8). */
static int
walk(const uint8_t *p, size_t len, const struct qcow2_header *h,
     uint32_t types[8], uint32_t lens[8], size_t offs[8], size_t *end_off)
{
  size_t end = h->backing_offset ? h->backing_offset : qcow2_cluster_size(h);
  if (end > len)
    end = len;
  int n = 0;
  size_t off = h->header_len;
  *end_off = 0;
  while (off < end && n < 8) {
    struct qcow2_ext x;
    if (qcow2_ext_decode(p + off, end - off, &x) < 0)
      return -1;
    if (x.data != p + off + 8 || x.total < 8 || x.total > end - off)
      return -1;
    if (x.type == QCOW2_EXT_END) {
      *end_off = off;
      break;
    }
    types[n] = x.type;
    lens[n] = x.len;
    offs[n] = off;
    n++;
    off += x.total;
  }
  return n;
}

static void
test_v2(void)
{
  struct qcow2_header h;
  char err[256];
  uint32_t types[8], lens[8];
  size_t offs[8], end;

  is(decode(v2_head, sizeof v2_head, &h, err, sizeof err), 0,
     "v2: qemu-img's header decodes");
  is(h.version, 2, "v2: version");
  is(h.backing_offset, 0, "v2: no backing file");
  is(h.backing_len, 0, "v2: no backing name");
  is(h.cluster_bits, 16, "v2: 64 KiB clusters");
  is(qcow2_cluster_size(&h), 65536, "v2: cluster size");
  is(h.size, 64 * MIB, "v2: 64 MiB");
  is(h.crypt_method, 0, "v2: not encrypted");
  is(h.l1_entries, 1, "v2: one L1 entry");
  is(h.l1_offset, 0x30000, "v2: L1 at 192 KiB");
  is(h.refcount_offset, 0x10000, "v2: refcount table at 64 KiB");
  is(h.refcount_clusters, 1, "v2: one refcount table cluster");
  is(h.nb_snapshots, 0, "v2: no snapshots");
  is(h.snapshots_offset, 0, "v2: no snapshot table");
  is(h.incompat, 0, "v2: no incompatible features");
  is(h.compat, 0, "v2: no compatible features");
  is(h.autoclear, 0, "v2: no autoclear features");
  is(h.refcount_order, 4, "v2: 16-bit refcounts");
  is(h.header_len, 72, "v2: header length 72");
  is(h.compression, QCOW2_COMPRESSION_DEFLATE, "v2: deflate");
  is(qcow2_l2_entries(&h), 8192, "v2: 8192 L2 entries a table");
  is(walk(v2_head, sizeof v2_head, &h, types, lens, offs, &end), 0,
     "v2: no extensions");
  is(end, 72, "v2: the end marker at 72");
  is(qcow2_check_layout(&h, 196616, err, sizeof err), 0,
     "v2: fits qemu-img's 196616-byte file");
  is(decode(v2_head, 72, &h, err, sizeof err), 0,
     "v2: the header alone decodes (the end of the input ends the list)");

  is(decode(v2back_head, sizeof v2back_head, &h, err, sizeof err), 0,
     "v2 with backing file decodes");
  is(h.backing_offset, 96, "v2 backing: name at 96");
  is(h.backing_len, 8, "v2 backing: 8 bytes");
  is_bytes(v2back_head + h.backing_offset, "v2.qcow2", 8,
           "v2 backing: the name");
  is(walk(v2back_head, sizeof v2back_head, &h, types, lens, offs, &end), 1,
     "v2 backing: one extension");
  is(types[0], QCOW2_EXT_BACKING_FORMAT, "v2 backing: backing format");
  is(lens[0], 5, "v2 backing: 5 bytes");
  is_bytes(v2back_head + offs[0] + 8, "qcow2", 5, "v2 backing: \"qcow2\"");
  is(end, 88, "v2 backing: end marker at 88, before the name");
  is(qcow2_check_layout(&h, 196616, err, sizeof err), 0,
     "v2 backing: fits its file");

  /* Zero flag: none in version 2. */
  struct qcow2_cluster c;
  is(qcow2_l2_decode(&h, UINT64_C(0x8000000000050000), 0, &c, err,
                     sizeof err),
     0, "v2data L2[0] decodes");
  ok(c.kind == QCOW2_NORMAL && c.host_off == 0x50000,
     "v2data L2[0]: data at 0x50000");
  refused(qcow2_l2_decode(&h, 1, 0, &c, err, sizeof err), err, "zero flag",
          "v2: a zero cluster refused");
  refused(qcow2_l2_decode(&h, UINT64_C(0x8000000000050001), 0, &c, err,
                          sizeof err),
          err, "version 2", "v2: a preallocated zero cluster refused");
}

struct v3_expect {
  const char *name;
  const uint8_t *head;
  size_t head_len;
  uint32_t cluster_bits;
  uint32_t l1_entries;
  uint64_t l1_offset;
  uint64_t refcount_offset;
  uint64_t incompat;
  uint8_t compression;
  uint64_t l2_entries;
  uint64_t file_size;
  bool feature_table;
};

static void
check_v3(const struct v3_expect *e)
{
  struct qcow2_header h;
  char err[256];
  uint32_t types[8], lens[8];
  size_t offs[8], end;
  uint8_t *p = e->feature_table ? v3_area(e->head)
                                : dup_exact(e->head, e->head_len);
  size_t len = e->feature_table ? V3_AREA_LEN : e->head_len;

  is(qcow2_header_decode(p, len, &h, err, sizeof err), 0, "%s: decodes",
     e->name);
  is(h.version, 3, "%s: version 3", e->name);
  ok(h.backing_offset == 0 && h.backing_len == 0, "%s: no backing file",
     e->name);
  is(h.cluster_bits, e->cluster_bits, "%s: cluster bits", e->name);
  is(h.size, 64 * MIB, "%s: 64 MiB", e->name);
  is(h.crypt_method, 0, "%s: not encrypted", e->name);
  is(h.l1_entries, e->l1_entries, "%s: L1 entries", e->name);
  is(h.l1_offset, e->l1_offset, "%s: L1 offset", e->name);
  is(h.refcount_offset, e->refcount_offset, "%s: refcount table offset",
     e->name);
  is(h.refcount_clusters, 1, "%s: one refcount table cluster", e->name);
  ok(h.nb_snapshots == 0 && h.snapshots_offset == 0, "%s: no snapshots",
     e->name);
  is(h.incompat, e->incompat, "%s: incompatible features", e->name);
  ok(h.compat == 0 && h.autoclear == 0, "%s: no other features", e->name);
  is(h.refcount_order, 4, "%s: refcount order 4", e->name);
  is(h.header_len, 112, "%s: header length 112", e->name);
  is(h.compression, e->compression, "%s: compression type", e->name);
  is(qcow2_l2_entries(&h), e->l2_entries, "%s: L2 entries", e->name);
  int n = walk(p, len, &h, types, lens, offs, &end);
  if (e->feature_table) {
    is(n, 1, "%s: one extension", e->name);
    ok(types[0] == QCOW2_EXT_FEATURE_TABLE && lens[0] == 384 &&
           offs[0] == 112,
       "%s: a feature table of 8 entries at 112", e->name);
    is(end, 504, "%s: end marker at 504", e->name);
  } else {
    is(n, 0, "%s: no extension", e->name);
    is(end, 112, "%s: end marker at 112", e->name);
  }
  is(qcow2_check_layout(&h, e->file_size, err, sizeof err), 0,
     "%s: fits qemu-img's %llu-byte file", e->name,
     (unsigned long long)e->file_size);

  /* Re-encoded: qemu-img's 112 bytes. */
  uint8_t out[112];
  is(qcow2_header_encode(&h, out), 112, "%s: encodes 112 bytes", e->name);
  is_bytes(out, e->head, 112, "%s: re-encoded header is qemu-img's",
           e->name);
  free(p);
}

static void
test_v3(void)
{
  static const struct v3_expect cases[] = {
    { "v3", v3_head, 112, 16, 1, 0x30000, 0x10000, 0, 0, 8192, 196616,
      true },
    { "c512", c512_head, sizeof c512_head, 9, 2048, 1536, 512, 0, 0, 64,
      17920, false },
    { "c2m", c2m_head, 112, 21, 1, 6 * MIB, 2 * MIB, 0, 0, 262144, 6291464,
      true },
    { "extl2", extl2_head, 112, 16, 1, 0x30000, 0x10000,
      QCOW2_INCOMPAT_EXTL2, 0, 4096, 196616, true },
    { "zstd", zstd_head, 112, 16, 1, 0x30000, 0x10000,
      QCOW2_INCOMPAT_COMPRESSION, QCOW2_COMPRESSION_ZSTD, 8192, 196616,
      true },
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
    check_v3(&cases[i]);

  /* The feature table's entries, as a reader naming a bit sees them. */
  static const struct {
    uint8_t type, bit;
    const char *name;
  } features[] = {
    { 0, 0, "dirty bit" },      { 0, 1, "corrupt bit" },
    { 0, 2, "external data file" }, { 0, 3, "compression type" },
    { 0, 4, "extended L2 entries" }, { 1, 0, "lazy refcounts" },
    { 2, 0, "bitmaps" },        { 2, 1, "raw external data" },
  };
  const uint8_t *t = feature_area + 8;
  for (size_t i = 0; i < 8; i++, t += 48)
    ok(t[0] == features[i].type && t[1] == features[i].bit &&
           strncmp((const char *)t + 2, features[i].name, 46) == 0,
       "feature table entry %zu: %u/%u \"%s\"", i, features[i].type,
       features[i].bit, features[i].name);
}

static void
test_backing(void)
{
  static const struct {
    const char *name;
    const uint8_t *head;
    const char *file, *format;
  } cases[] = {
    { "back", back_head, "v3.qcow2", "qcow2" },
    { "backraw", backraw_head, "base.raw", "raw" },
  };
  for (size_t i = 0; i < 2; i++) {
    struct qcow2_header h;
    char err[256];
    uint32_t types[8], lens[8];
    size_t offs[8], end;
    uint8_t *p = back_area(cases[i].head, cases[i].file);
    const char *nm = cases[i].name;

    is(qcow2_header_decode(p, 536, &h, err, sizeof err), 0, "%s: decodes",
       nm);
    is(h.backing_offset, 528, "%s: backing name at 528", nm);
    is(h.backing_len, 8, "%s: 8 bytes", nm);
    is_bytes(p + h.backing_offset, cases[i].file, 8, "%s: name \"%s\"", nm,
             cases[i].file);
    is(h.l1_offset, 0x30000, "%s: L1 offset", nm);
    is(walk(p, 536, &h, types, lens, offs, &end), 2, "%s: two extensions",
       nm);
    ok(types[0] == QCOW2_EXT_BACKING_FORMAT && offs[0] == 112 &&
           lens[0] == strlen(cases[i].format) &&
           memcmp(p + 120, cases[i].format, lens[0]) == 0,
       "%s: backing format \"%s\" at 112", nm, cases[i].format);
    ok(types[1] == QCOW2_EXT_FEATURE_TABLE && offs[1] == 128 &&
           lens[1] == 384,
       "%s: then the feature table at 128", nm);
    is(end, 520, "%s: end marker at 520", nm);
    is(qcow2_check_layout(&h, 196616, err, sizeof err), 0,
       "%s: fits its file", nm);

    /* The extensions end where the name starts: one that runs into it
     * is refused, as qemu does. */
    wire_put64(p + 8, 256);
    refused(qcow2_header_decode(p, 536, &h, err, sizeof err), err,
            "extension at byte 128 runs past byte 256",
            "%s: the feature table across the name refused", nm);
    free(p);
  }
}

/* A v3 header to edit: v3.qcow2's 512 bytes, decoded into h. Caller
 * frees. */
static uint8_t *
v3_edit(struct qcow2_header *h)
{
  char err[256];
  uint8_t *p = v3_area(v3_head);
  if (qcow2_header_decode(p, V3_AREA_LEN, h, err, sizeof err) != 0) {
    printf("# v3 sample: %s\n", err);
    exit(2);
  }
  return p;
}

static void
test_header_refused(void)
{
  struct qcow2_header h, g;
  char err[256];
  uint8_t *p = v3_edit(&g);
  uint8_t b[V3_AREA_LEN];
#define RESET() memcpy(b, p, V3_AREA_LEN)

  RESET();
  b[3] = 0xfa;
  refused(decode(b, V3_AREA_LEN, &h, err, sizeof err), err,
          "magic 0x514649fa", "bad magic refused");
  refused(decode(b, 3, &h, err, sizeof err), err, "3 bytes",
          "3 bytes refused");
  RESET();
  refused(decode(b, 71, &h, err, sizeof err), err, "only 71",
          "71 bytes refused");
  refused(decode(b, 103, &h, err, sizeof err), err, "only 103",
          "a v3 header of 103 bytes refused");
  refused(decode(b, 104, &h, err, sizeof err), err,
          "compression type at byte 104, past the 104 bytes given",
          "a 112-byte header cut before its compression type refused");
  is(decode(b, 105, &h, err, sizeof err), 0,
     "105 bytes: all the fields that are read");
  is(h.header_len, 112, "105 bytes: header length 112");
  wire_put32(b + 4, 1);
  refused(decode(b, V3_AREA_LEN, &h, err, sizeof err), err, "version 1",
          "version 1 refused");
  wire_put32(b + 4, 4);
  refused(decode(b, V3_AREA_LEN, &h, err, sizeof err), err, "version 4",
          "version 4 refused");
  RESET();
  wire_put32(b + 20, 8);
  refused(decode(b, V3_AREA_LEN, &h, err, sizeof err), err, "bits 8",
          "cluster bits 8 refused");
  wire_put32(b + 20, 22);
  refused(decode(b, V3_AREA_LEN, &h, err, sizeof err), err, "bits 22",
          "cluster bits 22 refused");
  wire_put32(b + 20, 0xffffffff);
  refused(decode(b, V3_AREA_LEN, &h, err, sizeof err), err, "bits 4294967295",
          "cluster bits 2^32-1 refused");

  /* Unknown incompatible bits, named by number, and by name when the
   * feature table has one. */
  RESET();
  wire_put64(b + 72, 1u << 5);
  refused(decode(b, V3_AREA_LEN, &h, err, sizeof err), err,
          "unknown incompatible feature bit 5",
          "unknown incompatible bit 5 refused");
  wire_put64(b + 72, UINT64_C(1) << 63 | 1);
  refused(decode(b, V3_AREA_LEN, &h, err, sizeof err), err,
          "unknown incompatible feature bit 63", "bit 63 refused");
  memset(b + 120 + 4 * 48, 0, 48);
  memcpy(b + 120 + 4 * 48, "\x00\x05xyz feature", 13);
  wire_put64(b + 72, UINT64_C(0x60));
  refused(decode(b, V3_AREA_LEN, &h, err, sizeof err), err,
          "bit 5 (\"xyz feature\"",
          "an unknown bit named from the image's feature table");
  RESET();
  wire_put64(b + 72, QCOW2_INCOMPAT_KNOWN);
  wire_put32(b + 100, 112);
  b[104] = QCOW2_COMPRESSION_ZSTD;
  is(decode(b, V3_AREA_LEN, &h, err, sizeof err), 0,
     "every known incompatible bit decodes");
  ok(h.incompat == QCOW2_INCOMPAT_KNOWN, "and is kept: %s", err);

  /* Header length. */
  RESET();
  wire_put32(b + 100, 108);
  refused(decode(b, V3_AREA_LEN, &h, err, sizeof err), err,
          "108 is not a multiple of 8", "header length 108 refused");
  wire_put32(b + 100, 96);
  refused(decode(b, V3_AREA_LEN, &h, err, sizeof err), err,
          "96 is shorter than 104", "header length 96 refused");
  wire_put32(b + 100, 0);
  refused(decode(b, V3_AREA_LEN, &h, err, sizeof err), err,
          "0 is shorter", "header length 0 refused");
  wire_put32(b + 100, 520);
  is(decode(b, V3_AREA_LEN, &h, err, sizeof err), 0,
     "a header longer than the input: fields past 104 are not needed");
  is(h.header_len, 520, "header length 520");
  wire_put32(b + 100, 0xfffffff8);
  refused(decode(b, V3_AREA_LEN, &h, err, sizeof err), err,
          "exceeds the cluster size 65536", "header length 2^32-8 refused");
  uint8_t *c = dup_exact(c512_head, sizeof c512_head);
  wire_put32(c + 100, 1024);
  refused(decode(c, sizeof c512_head, &h, err, sizeof err), err,
          "1024 exceeds the cluster size 512",
          "a header longer than its 512-byte cluster refused");
  wire_put32(c + 100, 512);
  is(decode(c, sizeof c512_head, &h, err, sizeof err), 0,
     "a header of the whole 512-byte cluster decodes");
  free(c);

  /* Compression type: qemu's rules. */
  RESET();
  b[104] = 2;
  refused(decode(b, V3_AREA_LEN, &h, err, sizeof err), err,
          "compression type 2", "compression type 2 refused");
  b[104] = QCOW2_COMPRESSION_ZSTD;
  refused(decode(b, V3_AREA_LEN, &h, err, sizeof err), err, "needs",
          "zstd without its incompatible bit refused");
  b[104] = 0;
  wire_put64(b + 72, QCOW2_INCOMPAT_COMPRESSION);
  refused(decode(b, V3_AREA_LEN, &h, err, sizeof err), err, "forbids",
          "deflate with the compression bit refused");
  /* A 104-byte header has no compression type: byte 104 starts its
   * extensions (here one of type 0x07000000 and no data). */
  RESET();
  wire_put32(b + 100, 104);
  b[104] = 7;
  is(decode(b, V3_AREA_LEN, &h, err, sizeof err), 0,
     "header length 104: byte 104 is an extension");
  is(h.compression, QCOW2_COMPRESSION_DEFLATE, "and the type is deflate");
  uint8_t *s = dup_exact(v3_head, 112);
  wire_put32(s + 100, 104);
  is(decode(s, 104, &h, err, sizeof err), 0, "a 104-byte v3 header decodes");
  ok(h.header_len == 104 && h.compression == 0,
     "104 bytes: no compression type byte, deflate");
  free(s);

  /* Extended L2 needs 32 subclusters of 512 bytes at least (qemu). */
  RESET();
  wire_put64(b + 72, QCOW2_INCOMPAT_EXTL2);
  wire_put32(b + 20, 13);
  refused(decode(b, V3_AREA_LEN, &h, err, sizeof err), err,
          "at least 16384 bytes, not 8192",
          "extended L2 with 8 KiB clusters refused");
  wire_put32(b + 20, 14);
  is(decode(b, V3_AREA_LEN, &h, err, sizeof err), 0,
     "extended L2 with 16 KiB clusters decodes");
  is(qcow2_l2_entries(&h), 1024, "16 KiB clusters, 16-byte entries: 1024");

  RESET();
  wire_put32(b + 96, 7);
  refused(decode(b, V3_AREA_LEN, &h, err, sizeof err), err,
          "refcount order 7", "refcount order 7 refused");
  wire_put32(b + 96, 6);
  is(decode(b, V3_AREA_LEN, &h, err, sizeof err), 0, "refcount order 6 ok");

  /* Backing file name. */
  RESET();
  wire_put64(b + 8, 512);
  wire_put32(b + 16, 1024);
  refused(decode(b, V3_AREA_LEN, &h, err, sizeof err), err,
          "1024 bytes is longer than 1023", "a 1024-byte name refused");
  wire_put32(b + 16, 1023);
  is(decode(b, V3_AREA_LEN, &h, err, sizeof err), 0,
     "a 1023-byte name at 512 decodes");
  wire_put64(b + 8, 65536 - 8);
  wire_put32(b + 16, 8);
  is(decode(b, V3_AREA_LEN, &h, err, sizeof err), 0,
     "a name ending at the end of the first cluster decodes");
  wire_put64(b + 8, 65536 - 7);
  refused(decode(b, V3_AREA_LEN, &h, err, sizeof err), err,
          "at byte 65529, 8 bytes long, ends past the first cluster",
          "a name across the first cluster refused");
  wire_put64(b + 8, 65537);
  wire_put32(b + 16, 0);
  refused(decode(b, V3_AREA_LEN, &h, err, sizeof err), err,
          "past the first cluster", "a name after the first cluster refused");
  wire_put64(b + 8, UINT64_MAX);
  wire_put32(b + 16, 1);
  refused(decode(b, V3_AREA_LEN, &h, err, sizeof err), err,
          "past the first cluster", "a name at 2^64-1 refused");
  wire_put64(b + 8, 0);
  wire_put32(b + 16, 5000);
  is(decode(b, V3_AREA_LEN, &h, err, sizeof err), 0,
     "a length without a name offset is ignored, as qemu does");
  is(h.backing_len, 0, "and kept as 0");

  /* Extensions: each inside the header area (to the backing name or the
   * end of the first cluster), padding included; bytes past the input
   * are past the file, zeroes to qemu. */
  RESET();
  wire_put32(b + 116, 0xffffffff);
  refused(decode(b, V3_AREA_LEN, &h, err, sizeof err), err,
          "extension at byte 112 runs past byte 65536",
          "an extension of 2^32-1 bytes refused");
  wire_put32(b + 116, 65536 - 120);
  is(decode(b, V3_AREA_LEN, &h, err, sizeof err), 0,
     "an extension to the end of the first cluster, past the input, "
     "decodes");
  wire_put32(b + 116, 65536 - 120 + 1);
  refused(decode(b, V3_AREA_LEN, &h, err, sizeof err), err,
          "extension at byte 112 runs past byte 65536",
          "its data one byte past the first cluster refused");
  wire_put32(b + 116, 393);
  wire_put64(b + 8, 512);
  wire_put32(b + 16, 8);
  refused(decode(b, V3_AREA_LEN, &h, err, sizeof err), err,
          "extension at byte 112 runs past byte 512",
          "a feature table across the backing name at 512 refused");
  wire_put32(b + 116, 385);
  is(decode(b, V3_AREA_LEN, &h, err, sizeof err), 0,
     "385 bytes padded to 392 end at the name");
  wire_put64(b + 8, 508);
  wire_put32(b + 16, 4);
  refused(decode(b, V3_AREA_LEN, &h, err, sizeof err), err,
          "extension at byte 112 runs past byte 508",
          "data before the backing name, padding across it, refused");
  wire_put32(b + 116, 384);
  refused(decode(b, V3_AREA_LEN, &h, err, sizeof err), err,
          "extension at byte 504 runs past byte 508",
          "an end marker across the backing name refused (as qemu does)");
  RESET();
  wire_put32(b + 504, 0x12345678); /* the end marker becomes unknown */
  is(decode(b, V3_AREA_LEN, &h, err, sizeof err), 0,
     "an unknown extension of no data decodes");
  is(decode(b, 508, &h, err, sizeof err), 0,
     "its header cut by the input: the rest reads as zeroes");
  wire_put32(b + 508, 65536 - 512 + 1);
  refused(decode(b, V3_AREA_LEN, &h, err, sizeof err), err,
          "extension at byte 504 runs past byte 65536",
          "its length past the first cluster refused");
  is(decode(b, 504, &h, err, sizeof err), 0,
     "an input ending before it ends the list");

  /* 512-byte clusters: the header area is the 512 bytes given. */
  uint8_t a[512];
  memset(a, 0, sizeof a);
  memcpy(a, c512_head, 112);
  wire_put32(a + 112, 0x12345678);
  wire_put32(a + 116, 384);
  uint8_t *e = dup_exact(a, sizeof a);
  is(qcow2_header_decode(e, sizeof a, &h, err, sizeof err), 0,
     "c512: an extension to 504, then an end marker, decodes");
  free(e);
  wire_put32(a + 116, 385);
  e = dup_exact(a, sizeof a);
  is(qcow2_header_decode(e, sizeof a, &h, err, sizeof err), 0,
     "c512: 385 bytes padded to the cluster's end decode");
  free(e);
  wire_put32(a + 116, 393);
  e = dup_exact(a, sizeof a);
  refused(qcow2_header_decode(e, sizeof a, &h, err, sizeof err), err,
          "extension at byte 112 runs past byte 512",
          "c512: an extension past the cluster refused");
  free(e);
  RESET();
  wire_put32(b + 100, 512);
  is(decode(b, V3_AREA_LEN, &h, err, sizeof err), 0,
     "a 512-byte header (unknown fields past 104) decodes");
  ok(h.header_len == 512 && h.compression == 0, "header length 512, deflate");

  /* err may be NULL; the message is cut to errlen. */
  RESET();
  wire_put32(b + 4, 9);
  is(qcow2_header_decode(b, V3_AREA_LEN, &h, NULL, 0), EINVAL_RC,
     "no error buffer");
  char small[8];
  is(qcow2_header_decode(b, V3_AREA_LEN, &h, small, sizeof small),
     EINVAL_RC, "a short error buffer");
  ok(strlen(small) == 7, "the message is cut, NUL-terminated");
#undef RESET
  free(p);
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

static void
test_encode(void)
{
  struct qcow2_header h, g;
  char err[256];
  uint8_t out[128];

  memset(&h, 0, sizeof h);
  h.version = 3;
  h.backing_offset = 112;
  h.backing_len = 17;
  h.cluster_bits = 20;
  h.size = UINT64_C(3) << 40;
  h.crypt_method = 0;
  h.l1_entries = 24576;
  h.l1_offset = 5 * MIB;
  h.refcount_offset = 1 * MIB;
  h.refcount_clusters = 2;
  h.nb_snapshots = 3;
  h.snapshots_offset = 7 * MIB;
  h.incompat = QCOW2_INCOMPAT_DIRTY | QCOW2_INCOMPAT_EXTL2;
  h.compat = QCOW2_COMPAT_LAZY_REFCOUNTS;
  h.autoclear = UINT64_C(1) << 1;
  h.refcount_order = 5;
  h.header_len = 104;
  h.compression = 0;

  memset(out, 0xaa, sizeof out);
  is(qcow2_header_encode(&h, out), 104, "104-byte header: 104 bytes");
  is(out[104], 0xaa, "nothing written past 104");
  is(wire_get32(out), QCOW2_MAGIC, "magic");
  is(wire_get32(out + 4), 3, "version 3");
  is(wire_get64(out + 8), 112, "backing offset at 8");
  is(wire_get32(out + 16), 17, "backing length at 16");
  is(wire_get32(out + 20), 20, "cluster bits at 20");
  is(wire_get64(out + 24), UINT64_C(3) << 40, "size at 24");
  is(wire_get32(out + 36), 24576, "L1 entries at 36");
  is(wire_get64(out + 40), 5 * MIB, "L1 offset at 40");
  is(wire_get64(out + 48), 1 * MIB, "refcount table at 48");
  is(wire_get32(out + 56), 2, "refcount clusters at 56");
  is(wire_get32(out + 60), 3, "snapshots at 60");
  is(wire_get64(out + 64), 7 * MIB, "snapshot table at 64");
  is(wire_get64(out + 72), 0x11, "incompatible at 72");
  is(wire_get64(out + 80), 1, "compatible at 80");
  is(wire_get64(out + 88), 2, "autoclear at 88");
  is(wire_get32(out + 96), 5, "refcount order at 96");
  is(wire_get32(out + 100), 104, "header length at 100");
  is(decode(out, 104, &g, err, sizeof err), 0, "104 bytes decode");
  ok(header_eq(&h, &g), "104 bytes: the same header");
  is(qcow2_check_layout(&g, 7 * MIB, err, sizeof err), 0,
     "and its layout fits 7 MiB: %s", err);

  h.header_len = 112;
  h.incompat |= QCOW2_INCOMPAT_COMPRESSION;
  h.compression = QCOW2_COMPRESSION_ZSTD;
  h.backing_offset = 120;
  memset(out, 0xaa, sizeof out);
  is(qcow2_header_encode(&h, out), 112, "112-byte header: 112 bytes");
  is(out[104], 1, "compression type at 104");
  is_bytes(out + 105, "\0\0\0\0\0\0\0", 7, "zero padding to 112");
  is(out[112], 0xaa, "nothing written past 112");
  is(decode(out, 112, &g, err, sizeof err), 0, "112 bytes decode");
  ok(header_eq(&h, &g), "112 bytes: the same header");

  /* A version 2 header re-encodes as a version 3 of 104 bytes. */
  is(decode(v2_head, sizeof v2_head, &h, err, sizeof err), 0, "v2 decodes");
  is(qcow2_header_encode(&h, out), 104, "v2 encodes as 104 bytes");
  is(decode(out, 104, &g, err, sizeof err), 0, "which decode");
  ok(g.version == 3 && g.header_len == 104 && g.refcount_order == 4 &&
         g.l1_offset == h.l1_offset && g.size == h.size,
     "as version 3 with the same fields");
}

static void
test_check_layout(void)
{
  struct qcow2_header h, g;
  char err[256];
  uint8_t *p = v3_edit(&g);

  h = g;
  is(qcow2_check_layout(&h, 196616, err, sizeof err), 0, "v3 fits");
  is(qcow2_check_layout(&h, 196608 + 8, err, sizeof err), 0,
     "an L1 ending at the end of the file fits");
  refused(qcow2_check_layout(&h, 196608 + 7, err, sizeof err), err,
          "at byte 196608, 8 bytes long, ends past the end of the "
          "196615-byte file",
          "an L1 one byte past the end refused");
  refused(qcow2_check_layout(&h, 0, err, sizeof err), err,
          "past the end of the 0-byte file", "an empty file refused");
  h.l1_offset = 196608 + 512;
  refused(qcow2_check_layout(&h, 1 * MIB, err, sizeof err), err,
          "L1 table offset 197120 is not a multiple of the cluster size "
          "65536",
          "an unaligned L1 refused");
  h = g;
  h.l1_entries = 0;
  refused(qcow2_check_layout(&h, 1 * MIB, err, sizeof err), err,
          "0 entries is too small for the virtual size 67108864, which "
          "needs 1",
          "an empty L1 for 64 MiB refused");
  h.size = 0;
  h.l1_offset = UINT64_C(1) << 62;
  is(qcow2_check_layout(&h, 196616, err, sizeof err), 0,
     "an empty image's empty L1 may be anywhere aligned");
  h = g;
  /* An L1 entry maps an L2 table of 8192 64 KiB clusters: 512 MiB. */
  h.size = (UINT64_C(1) << 39) + 1;
  h.l1_entries = 1024;
  refused(qcow2_check_layout(&h, UINT64_MAX, err, sizeof err), err,
          "which needs 1025", "L1 one entry short (rounding up) refused");
  h.l1_entries = 1025;
  is(qcow2_check_layout(&h, UINT64_MAX, err, sizeof err), 0,
     "L1 exactly large enough");
  h.l1_entries = QCOW2_MAX_L1_ENTRIES + 1;
  refused(qcow2_check_layout(&h, UINT64_MAX, err, sizeof err), err,
          "4194305 entries is larger than the 4194304",
          "an L1 above 2^22 entries refused");

  /* The size limit, with 2 MiB clusters so that the L1 can be big
   * enough: 2^55 / 2^39 = 65536 entries. */
  uint8_t *c = dup_exact(c2m_head, 112);
  char e2[256];
  is(decode(c, 112, &h, e2, sizeof e2), 0, "c2m decodes");
  free(c);
  h.size = QCOW2_MAX_SIZE;
  h.l1_entries = 65536;
  is(qcow2_check_layout(&h, UINT64_MAX, err, sizeof err), 0,
     "2^55 bytes with 65536 L1 entries fit");
  h.size = QCOW2_MAX_SIZE + 1;
  h.l1_entries = 65537;
  refused(qcow2_check_layout(&h, UINT64_MAX, err, sizeof err), err,
          "virtual size 36028797018963969 is larger",
          "2^55 + 1 bytes refused");
  h.size = UINT64_MAX;
  h.l1_entries = UINT32_MAX;
  refused(qcow2_check_layout(&h, UINT64_MAX, err, sizeof err), err,
          "virtual size 18446744073709551615", "2^64 - 1 bytes refused");

  /* Hostile offsets: near 2^64, no wrap-around. */
  h = g;
  h.l1_offset = UINT64_MAX - 65535;
  is(qcow2_check_layout(&h, UINT64_MAX, err, sizeof err), 0,
     "an L1 in the last cluster of a 2^64-byte file");
  h.l1_entries = 8193;
  refused(qcow2_check_layout(&h, UINT64_MAX, err, sizeof err), err,
          "65544 bytes long, ends past the end",
          "an L1 across 2^64 refused");
  h.l1_entries = QCOW2_MAX_L1_ENTRIES;
  refused(qcow2_check_layout(&h, UINT64_MAX - 1, err, sizeof err), err,
          "33554432 bytes long", "2^22 entries across 2^64 refused");

  /* Backing name inside the file, and inside the first cluster. */
  h = g;
  h.l1_offset = 0;
  h.backing_offset = 96;
  h.backing_len = 8;
  is(qcow2_check_layout(&h, 104, err, sizeof err), 0,
     "a name ending at the end of the file fits");
  refused(qcow2_check_layout(&h, 103, err, sizeof err), err,
          "at byte 96, 8 bytes long, ends past the end of the 103-byte file",
          "a name past the end of the file refused");
  h.backing_offset = UINT64_MAX;
  refused(qcow2_check_layout(&h, UINT64_MAX, err, sizeof err), err,
          "not within the first cluster",
          "a name at 2^64-1 refused (a header not from the decoder)");
  h.backing_offset = 100;
  h.backing_len = 2000;
  refused(qcow2_check_layout(&h, UINT64_MAX, err, sizeof err), err,
          "2000 bytes long, is not within", "a 2000-byte name refused");

  h = g;
  h.refcount_offset = 65536 + 8;
  refused(qcow2_check_layout(&h, 196616, err, sizeof err), err,
          "refcount table offset 65544 is not a multiple",
          "an unaligned refcount table refused");
  h.refcount_offset = UINT64_C(1) << 62;
  is(qcow2_check_layout(&h, 196616, err, sizeof err), 0,
     "a refcount table outside the file is no business of a reader");

  h = g;
  h.cluster_bits = 64;
  refused(qcow2_check_layout(&h, 196616, err, sizeof err), err,
          "cluster bits 64", "a header not from the decoder: bits 64");
  free(p);
}

static void
test_l1(void)
{
  struct qcow2_header h;
  char err[256];
  uint64_t off;
  uint8_t *p = v3_edit(&h);

  is(qcow2_l1_decode(&h, UINT64_C(0x8000000000040000), &off, err,
                     sizeof err),
     0, "v3data L1[0] decodes");
  is(off, 0x40000, "its L2 table at 0x40000 (copied bit ignored)");
  is(qcow2_l1_decode(&h, 0, &off, err, sizeof err), 0, "0 decodes");
  is(off, 0, "0: unallocated");
  is(qcow2_l1_decode(&h, QCOW2_OFLAG_COPIED, &off, err, sizeof err), 0,
     "copied alone decodes");
  is(off, 0, "copied alone: unallocated");
  is(qcow2_l1_decode(&h, QCOW2_OFFSET_MASK & ~UINT64_C(0xffff), &off, err,
                     sizeof err),
     0, "the highest aligned offset decodes");
  is(off, UINT64_C(0x00ffffffffff0000), "2^56 - 64 KiB");

  static const uint64_t reserved[] = { 1, 0x100, UINT64_C(1) << 56,
                                       UINT64_C(1) << 62 };
  for (size_t i = 0; i < 4; i++) {
    off = 1;
    refused(qcow2_l1_decode(&h, UINT64_C(0x8000000000040000) | reserved[i],
                            &off, err, sizeof err),
            err, "reserved bits", "L1 reserved bit 0x%llx refused",
            (unsigned long long)reserved[i]);
    is(off, 0, "refused: offset 0");
  }
  refused(qcow2_l1_decode(&h, UINT64_C(0x8000000000040200), &off, err,
                          sizeof err),
          err, "L2 table offset 262656 is not a multiple",
          "an unaligned L2 table refused");
  free(p);

  /* 512-byte clusters: sector-aligned tables are aligned. */
  uint8_t *c = dup_exact(c512_head, sizeof c512_head);
  is(qcow2_header_decode(c, sizeof c512_head, &h, err, sizeof err), 0,
     "c512 decodes");
  is(qcow2_l1_decode(&h, UINT64_C(0x8000000000004600), &off, err,
                     sizeof err),
     0, "c512data L1[0] decodes");
  is(off, 0x4600, "its L2 table at 0x4600");
  free(c);
}

static void
cluster_is(const struct qcow2_header *h, uint64_t entry, uint64_t sub,
           enum qcow2_kind kind, uint64_t host, uint64_t comp_len,
           uint32_t alloc, uint32_t zero, const char *what)
{
  struct qcow2_cluster c;
  char err[256] = "";
  int r = qcow2_l2_decode(h, entry, sub, &c, err, sizeof err);
  if (!ok(r == 0 && c.kind == kind && c.host_off == host &&
              c.comp_len == comp_len && c.sub_alloc == alloc &&
              c.sub_zero == zero,
          "%s", what))
    printf("#   r %d \"%s\" kind %d host 0x%llx comp_len %llu alloc 0x%x "
           "zero 0x%x\n",
           r, err, (int)c.kind, (unsigned long long)c.host_off,
           (unsigned long long)c.comp_len, c.sub_alloc, c.sub_zero);
}

static void
test_l2(void)
{
  struct qcow2_header h;
  struct qcow2_cluster c;
  char err[256];
  uint8_t *p = v3_edit(&h);

  /* v3data.qcow2's L2 table. */
  cluster_is(&h, UINT64_C(0x8000000000050000), 0, QCOW2_NORMAL, 0x50000, 0,
             0, 0, "v3data L2[0]: data at 0x50000");
  cluster_is(&h, 1, 0, QCOW2_ZERO, 0, 0, 0, 0, "v3data L2[16]: zero");
  cluster_is(&h, UINT64_C(0x8000000000060000), 0, QCOW2_NORMAL, 0x60000, 0,
             0, 0, "v3data L2[32]: data at 0x60000");
  cluster_is(&h, 0, 0, QCOW2_UNALLOCATED, 0, 0, 0, 0,
             "v3data L2[1]: unallocated");
  cluster_is(&h, QCOW2_OFLAG_COPIED, 0, QCOW2_UNALLOCATED, 0, 0, 0, 0,
             "copied, offset 0: unallocated");
  cluster_is(&h, UINT64_C(0x0000000000070001), 0, QCOW2_ZERO, 0x70000, 0, 0,
             0, "zero with a preallocated cluster");
  cluster_is(&h, UINT64_C(0x8000000000050000), UINT64_MAX, QCOW2_NORMAL,
             0x50000, 0, 0, 0,
             "without extended L2 the second word is ignored");

  /* Refused standard entries. */
  static const uint64_t reserved[] = { 2, 0x100, UINT64_C(1) << 56,
                                       UINT64_C(1) << 61 };
  for (size_t i = 0; i < 4; i++)
    refused(qcow2_l2_decode(&h, UINT64_C(0x8000000000050000) | reserved[i], 0,
                            &c, err, sizeof err),
            err, "reserved bits", "L2 reserved bit 0x%llx refused",
            (unsigned long long)reserved[i]);
  refused(qcow2_l2_decode(&h, UINT64_C(0x8000000000050200), 0, &c, err,
                          sizeof err),
          err, "cluster offset 328192 is not a multiple of the cluster size",
          "an unaligned data cluster refused");
  refused(qcow2_l2_decode(&h, UINT64_C(0x0000000000050201), 0, &c, err,
                          sizeof err),
          err, "not a multiple", "an unaligned preallocated zero refused");

  /* External data file: offset 0 with the copied bit is data at 0. */
  struct qcow2_header d = h;
  d.incompat |= QCOW2_INCOMPAT_DATA_FILE;
  cluster_is(&d, QCOW2_OFLAG_COPIED, 0, QCOW2_NORMAL, 0, 0, 0, 0,
             "data file: copied, offset 0 is data at 0");
  cluster_is(&d, 0, 0, QCOW2_UNALLOCATED, 0, 0, 0, 0,
             "data file: 0 is unallocated");

  /* 512-byte clusters (c512data). */
  uint8_t *c5 = dup_exact(c512_head, sizeof c512_head);
  struct qcow2_header s;
  is(qcow2_header_decode(c5, sizeof c512_head, &s, err, sizeof err), 0,
     "c512 decodes");
  cluster_is(&s, UINT64_C(0x8000000000004800), 0, QCOW2_NORMAL, 0x4800, 0, 0,
             0, "c512data L2[0]: data at 0x4800");
  cluster_is(&s, 1, 0, QCOW2_ZERO, 0, 0, 0, 0, "c512data L1[32] L2[0]: zero");
  /* comp512.qcow2 L2[1]: x = 61, offset 0x4808, no extra sector. */
  cluster_is(&s, UINT64_C(0x4000000000004808), 0, QCOW2_COMPRESSED, 0x4808,
             504, 0, 0, "comp512 L2[1]: 504 bytes at 0x4808");
  cluster_is(&s, UINT64_C(0x6000000000004808), 0, QCOW2_COMPRESSED, 0x4808,
             1016, 0, 0, "512-byte clusters: bit 61 is the one size bit");
  refused(qcow2_l2_decode(&s, QCOW2_OFLAG_COMPRESSED | UINT64_C(1) << 56, 0,
                          &c, err, sizeof err),
          err, "at or past 2^56",
          "512-byte clusters: a compressed offset of 2^56 refused");
  cluster_is(&s, QCOW2_OFLAG_COMPRESSED | ((UINT64_C(1) << 56) - 1), 0,
             QCOW2_COMPRESSED, (UINT64_C(1) << 56) - 1, 1, 0, 0,
             "the largest compressed offset: 1 byte to its sector's end");
  free(c5);

  /* 2 MiB clusters: x = 49, 13 size bits; all of them set. */
  uint8_t *c2 = dup_exact(c2m_head, 112);
  struct qcow2_header m;
  is(qcow2_header_decode(c2, 112, &m, err, sizeof err), 0, "c2m decodes");
  cluster_is(&m, UINT64_C(0x7fffffffffffffff), 0, QCOW2_COMPRESSED,
             (UINT64_C(1) << 49) - 1, (UINT64_C(1) << 22) - 511, 0, 0,
             "2 MiB clusters: every bit set, 2^22 - 511 bytes");
  cluster_is(&m, QCOW2_OFLAG_COMPRESSED, 0, QCOW2_COMPRESSED, 0, 512, 0, 0,
             "2 MiB clusters: offset 0, one sector");
  free(c2);
  free(p);
}

/* compm.qcow2's two compressed clusters: decoded, their bytes read
 * where the entries say, inflated as qemu does (raw deflate, 4 KiB
 * window), and compared with what was written. */
static void
test_compressed(void)
{
  struct qcow2_header h;
  char err[256];
  uint8_t *p = v3_area(compm_head);
  is(qcow2_header_decode(p, V3_AREA_LEN, &h, err, sizeof err), 0,
     "compm decodes");
  is(h.size, 4 * MIB, "compm: 4 MiB");
  is(qcow2_check_layout(&h, 328704, err, sizeof err), 0,
     "compm: fits its 328704-byte file");
  free(p);

  /* The file's bytes 0x50000-0x50400. */
  const uint64_t base = 0x50000;
  uint8_t file[1024];
  memset(file, 0, sizeof file);
  memcpy(file, compm_data, sizeof compm_data);

  static const uint64_t entries[2] = { UINT64_C(0x4000000000050000),
                                       UINT64_C(0x404000000005004f) };
  static const uint64_t want_off[2] = { 0x50000, 0x5004f };
  static const uint64_t want_len[2] = { 512, 945 };
  uint8_t want[65536], got[65536];
  for (int i = 0; i < 2; i++) {
    struct qcow2_cluster c;
    is(qcow2_l2_decode(&h, entries[i], 0, &c, err, sizeof err), 0,
       "compm L2[%d] decodes", i);
    is(c.kind, QCOW2_COMPRESSED, "compm L2[%d]: compressed", i);
    is(c.host_off, want_off[i], "compm L2[%d]: host offset", i);
    is(c.comp_len, want_len[i], "compm L2[%d]: %llu bytes", i,
       (unsigned long long)want_len[i]);
    is((c.host_off + c.comp_len) % 512, 0,
       "compm L2[%d]: to the end of a sector", i);
    if (i == 1)
      is(c.host_off + c.comp_len, 328704, "compm L2[1]: to the file's end");
    if (c.host_off < base || c.host_off - base + c.comp_len > sizeof file)
      continue;

    z_stream z;
    memset(&z, 0, sizeof z);
    is(inflateInit2(&z, -12), Z_OK, "inflateInit2");
    z.next_in = file + (c.host_off - base);
    z.avail_in = (uInt)c.comp_len;
    z.next_out = got;
    z.avail_out = sizeof got;
    int zr = inflate(&z, Z_FINISH);
    is(zr, Z_STREAM_END, "compm L2[%d]: a whole deflate stream within "
                         "comp_len", i);
    is(z.total_out, 65536, "compm L2[%d]: inflates to one cluster", i);
    /* qemu rounds up to a sector: less than one sector is left over. */
    ok(z.avail_in < 512, "compm L2[%d]: %u bytes past the stream, < 512", i,
       z.avail_in);
    inflateEnd(&z);
    if (i == 0) {
      memset(want, 0x55, sizeof want);
    } else {
      memset(want, 0, sizeof want);
      lcg(want, 700);
    }
    ok(memcmp(got, want, sizeof want) == 0, "compm L2[%d]: the data written",
       i);
  }
}

/* extdata.qcow2 (extended_l2=on, 64 KiB clusters of 32 x 2 KiB). */
static void
test_extended_l2(void)
{
  struct qcow2_header h;
  struct qcow2_cluster c;
  char err[256];
  uint8_t *p = v3_area(extl2_head);
  is(qcow2_header_decode(p, V3_AREA_LEN, &h, err, sizeof err), 0,
     "extl2 decodes");
  free(p);

  cluster_is(&h, UINT64_C(0x8000000000050000), 3, QCOW2_NORMAL, 0x50000, 0,
             3, 0, "extdata L2[0]: write 0 4k: subclusters 0-1 allocated");
  cluster_is(&h, 0, UINT64_C(0xffffffff00000000), QCOW2_UNALLOCATED, 0, 0, 0,
             0xffffffff, "extdata L2[16]: write -z 1M 64k: all zero");
  cluster_is(&h, UINT64_C(0x8000000000060000), 0xffffffff, QCOW2_NORMAL,
             0x60000, 0, 0xffffffff, 0, "extdata L2[32]: all allocated");
  cluster_is(&h, UINT64_C(0x8000000000070000), UINT64_C(0x0000003000000001),
             QCOW2_NORMAL, 0x70000, 0, 1, 0x30,
             "extdata L2[48]: subcluster 0 data, 4-5 zero");
  cluster_is(&h, 0, 0, QCOW2_UNALLOCATED, 0, 0, 0, 0,
             "extdata L2[1]: unallocated");

  refused(qcow2_l2_decode(&h, UINT64_C(0x8000000000050000),
                          UINT64_C(0x0000000100000001), &c, err, sizeof err),
          err, "subclusters 0x00000001 are both allocated and zero",
          "a subcluster both allocated and zero refused");
  refused(qcow2_l2_decode(&h, 0, UINT64_C(0x8000000080000000), &c, err,
                          sizeof err),
          err, "0x80000000 are both", "subcluster 31 both ways refused");
  refused(qcow2_l2_decode(&h, 0, 4, &c, err, sizeof err), err,
          "unallocated cluster has allocated subclusters 0x00000004",
          "allocated subclusters without a cluster refused");
  refused(qcow2_l2_decode(&h, UINT64_C(0x4000000000050000), 1, &c, err,
                          sizeof err),
          err, "compressed cluster 0x4000000000050000 has subcluster bits",
          "a compressed cluster with subcluster bits refused");
  cluster_is(&h, UINT64_C(0x4000000000050000), 0, QCOW2_COMPRESSED, 0x50000,
             512, 0, 0, "a compressed cluster with a zero bitmap decodes");
  refused(qcow2_l2_decode(&h, UINT64_C(0x8000000000050001), 3, &c, err,
                          sizeof err),
          err, "zero flag", "the v3 zero flag in an extended entry refused");
  refused(qcow2_l2_decode(&h, UINT64_C(0x8000000000050000) | 0x100, 3, &c,
                          err, sizeof err),
          err, "reserved bits", "extended: reserved bits refused");

  struct qcow2_header bad = h;
  bad.cluster_bits = 70;
  refused(qcow2_l2_decode(&bad, 0, 0, &c, err, sizeof err), err,
          "cluster bits 70", "a header not from the decoder: no shift by 70");
}

static void
test_ext_decode(void)
{
  struct qcow2_ext x;
  static const uint8_t e[24] = { 0xe2, 0x79, 0x2a, 0xca, 0, 0, 0, 5,
                                 'q', 'c', 'o', 'w', '2', 0, 0, 0,
                                 0, 0, 0, 0, 0, 0, 0, 0 };
  uint8_t *b = dup_exact(e, sizeof e);
  is(qcow2_ext_decode(b, 24, &x), 0, "an extension decodes");
  ok(x.type == QCOW2_EXT_BACKING_FORMAT && x.len == 5 && x.data == b + 8 &&
         x.total == 16,
     "backing format, 5 bytes at +8, 16 in all");
  is(qcow2_ext_decode(b, 16, &x), 0, "exactly its 16 bytes");
  is(qcow2_ext_decode(b, 15, &x), EINVAL_RC, "padding cut: refused");
  is(qcow2_ext_decode(b, 12, &x), EINVAL_RC, "data cut: refused");
  is(qcow2_ext_decode(b, 7, &x), EINVAL_RC, "header cut: refused");
  is(qcow2_ext_decode(b + 16, 8, &x), 0, "an end marker decodes");
  ok(x.type == QCOW2_EXT_END && x.len == 0 && x.total == 8,
     "end marker: type 0, 8 bytes");
  b[4] = 0xff;
  is(qcow2_ext_decode(b, 24, &x), EINVAL_RC, "length 0xff000005 refused");
  wire_put32(b + 4, 0xfffffff9);
  is(qcow2_ext_decode(b, 24, &x), EINVAL_RC,
     "a length that would wrap when padded refused");
  wire_put32(b + 4, 8);
  is(qcow2_ext_decode(b, 16, &x), 0, "8 bytes need no padding");
  is(x.total, 16, "16 in all");
  free(b);
}

int
main(void)
{
  test_v2();
  test_v3();
  test_backing();
  test_header_refused();
  test_encode();
  test_check_layout();
  test_l1();
  test_l2();
  test_compressed();
  test_extended_l2();
  test_ext_decode();
  return tap_done();
}
