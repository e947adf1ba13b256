/* vhd_layout.h: the VHD on-disk structures (Microsoft VHD specification
 * 1.0: hard disk footer, dynamic disk header, parent locators, block
 * allocation table and sector bitmaps), decoded from and encoded into
 * byte buffers. Pure: no I/O, no allocation, so that fuzz/fuzz-vhd.c can
 * feed it anything. Every field is big-endian on disk; a sector is 512
 * bytes.
 *
 * The decoders check what one structure can say about itself (cookie,
 * checksum, version, disk type, block size); vhd_check_layout checks what
 * the structures claim about the file (every table inside it). The I/O
 * side (vhd.c) adds only what needs the file: reading it, parents. */
#ifndef NBDFLOW_FORMAT_VHD_LAYOUT_H
#define NBDFLOW_FORMAT_VHD_LAYOUT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define VHD_SECTOR 512u
#define VHD_FOOTER_LEN 512u
#define VHD_OLD_FOOTER_LEN 511u /* Virtual PC before 2004 */
#define VHD_HEADER_LEN 1024u
#define VHD_LOCATORS 8
#define VHD_LOCATOR_OFF 576u  /* within the header */
#define VHD_BAT_UNUSED 0xFFFFFFFFu
/* The largest disk the format holds: the BAT's sector numbers are 32-bit,
 * and every writer limits the size to 2040 GiB. */
#define VHD_MAX_SIZE (UINT64_C(2040) << 30)
#define VHD_MIN_BLOCK VHD_SECTOR
#define VHD_MAX_BLOCK (UINT32_C(1) << 28) /* sanity, not the spec */
#define VHD_DEFAULT_BLOCK (UINT32_C(2) << 20)
#define VHD_FOOTER_COOKIE "conectix"
#define VHD_HEADER_COOKIE "cxsparse"
#define VHD_BATMAP_COOKIE "tdbatmap"

enum vhd_disk_type {
  VHD_TYPE_FIXED = 2,
  VHD_TYPE_DYNAMIC = 3,
  VHD_TYPE_DIFF = 4,
};

/* Parent locator platform codes (big-endian ASCII). */
#define VHD_LOC_NONE 0u
#define VHD_LOC_W2RU 0x57327275u /* relative Windows path, UTF-16LE */
#define VHD_LOC_W2KU 0x57326B75u /* absolute Windows path, UTF-16LE */
#define VHD_LOC_MACX 0x4D616358u /* file:// URL, UTF-8 */

struct vhd_footer {
  uint32_t features;
  uint32_t version;
  uint64_t data_offset;   /* the dynamic header; all ones for fixed */
  uint32_t timestamp;     /* seconds since 2000-01-01 UTC */
  char creator_app[5];    /* the 4 bytes as stored, NUL-terminated */
  uint32_t creator_version;
  uint32_t creator_os;
  uint64_t original_size;
  uint64_t current_size;
  uint16_t cylinders;
  uint8_t heads;
  uint8_t sectors;
  uint32_t disk_type;     /* enum vhd_disk_type */
  uint32_t checksum;      /* as stored */
  bool checksum_ok;       /* stored == computed */
  uint8_t uuid[16];
  uint8_t saved_state;
};

struct vhd_locator {
  uint32_t code;    /* VHD_LOC_* or anything else (skipped) */
  uint32_t space;   /* as stored: sectors, or bytes from some writers */
  uint32_t length;  /* bytes of locator data */
  uint64_t offset;  /* byte offset of the data in the file */
};

struct vhd_header {
  uint64_t data_offset;
  uint64_t table_offset;  /* the BAT */
  uint32_t version;
  uint32_t max_entries;   /* BAT entries */
  uint32_t block_size;    /* bytes; a power of two */
  uint32_t checksum;
  bool checksum_ok;
  uint8_t parent_uuid[16];
  uint32_t parent_timestamp;
  char parent_name[1024]; /* UTF-8 from the UTF-16BE field, '' if none */
  struct vhd_locator loc[VHD_LOCATORS];
};

/* The spec's checksum: the ones' complement of the byte sum of p[0..len),
 * counting the 4 bytes at csum_off as zero. */
uint32_t vhd_checksum(const uint8_t *p, size_t len, size_t csum_off);

/* Decodes a footer of len bytes (512, or 511 for the oldest writers).
 * Fails (-EINVAL, a sentence in err) on a wrong cookie, an unknown disk
 * type or format version; a bad checksum is not a failure here: it is
 * reported in checksum_ok for the caller to judge. */
int vhd_footer_decode(const uint8_t *p, size_t len, struct vhd_footer *f,
                      char *err, size_t errlen);
/* Encodes f into 512 bytes, computing the checksum (f->checksum ignored). */
void vhd_footer_encode(const struct vhd_footer *f, uint8_t out[VHD_FOOTER_LEN]);

/* Decodes a dynamic disk header. Fails on a wrong cookie, a block size
 * that is not a power of two in [VHD_MIN_BLOCK, VHD_MAX_BLOCK], or no BAT
 * entries; the checksum as for the footer. */
int vhd_header_decode(const uint8_t p[VHD_HEADER_LEN], struct vhd_header *h,
                      char *err, size_t errlen);
/* Encodes h into 1024 bytes, computing the checksum; parent_name is
 * written as UTF-16BE. */
void vhd_header_encode(const struct vhd_header *h,
                       uint8_t out[VHD_HEADER_LEN]);

/* The disk's size as a reader should see it: current_size for every
 * creator but Virtual PC ("vpc ") and older qemu ("qemu"), whose size is
 * the CHS geometry's unless that is at its maximum (65535/16/255), as
 * qemu does since 10.0. */
uint64_t vhd_virtual_size(const struct vhd_footer *f);
/* The geometry of the spec's appendix for a disk of size bytes. */
void vhd_geometry(uint64_t size, uint16_t *cyl, uint8_t *heads,
                  uint8_t *sectors);

/* Bytes of sector bitmap in front of each block: one bit per sector,
 * rounded up to whole sectors (512 for every block size up to 2 MiB). */
uint32_t vhd_bitmap_len(uint32_t block_size);
/* Bytes the BAT occupies on disk: 4 per entry, rounded up to a sector. */
uint64_t vhd_bat_len(uint32_t entries);

/* Whether the tables the footer and header describe fit the file:
 * the header and BAT inside it and not overlapping the footer, enough
 * BAT entries for the virtual size, the size within VHD_MAX_SIZE.
 * Returns 0 or -EINVAL with a sentence in err. Fixed disks: h is NULL. */
int vhd_check_layout(const struct vhd_footer *f, const struct vhd_header *h,
                     uint64_t file_size, char *err, size_t errlen);

/* XenServer's batmap header (cookie "tdbatmap"), in the sector after the
 * BAT: where its bitmap lies. Readers ignore it (docs/formats.md); check
 * counts its space as used. */
struct vhd_batmap {
  uint64_t offset;   /* byte offset of the bitmap */
  uint32_t sectors;  /* its length */
  uint32_t version;
};
/* Decodes the batmap header at p (len bytes): -EINVAL when it does not
 * start with the cookie or len is less than its 24 bytes. */
int vhd_batmap_decode(const uint8_t *p, size_t len, struct vhd_batmap *b);

/* The BAT entry i of a table read from disk (big-endian u32). */
static inline uint32_t
vhd_bat_entry(const uint8_t *bat, uint32_t i)
{
  const uint8_t *p = bat + 4 * (size_t)i;
  return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 |
         p[3];
}

/* Whether the block at sector number entry (its bitmap first, then its
 * data) lies inside a file of file_size bytes, before its last footer. */
bool vhd_block_inside(uint32_t entry, uint32_t block_size, uint64_t file_size);

/* The run of equal bits in a sector bitmap (MSB first) starting at sector
 * first and ending at limit at most: returns its length in sectors (at
 * least 1 when first < limit) and whether its bits are set. */
uint32_t vhd_bitmap_run(const uint8_t *bitmap, uint32_t first,
                        uint32_t limit, bool *set);

/* A parent locator's data as a path with '/' separators, UTF-8, NUL-
 * terminated in out: MacX is a file:// URL (percent-decoded, "file://"
 * and any host stripped), W2ru and W2ku are UTF-16 (little-endian, or
 * big-endian when a byte-order mark says so), trailing NULs dropped,
 * backslashes turned into slashes, a drive letter kept as "C:/...".
 * Returns 0, or -EINVAL for an unknown code, bad encoding, an empty
 * path or one that does not fit in outlen. */
int vhd_locator_path(uint32_t code, const uint8_t *data, size_t len,
                     char *out, size_t outlen);

/* UTF-16 (big-endian or little-endian) to UTF-8, stopping at the first
 * NUL; surrogate pairs combined, unpaired ones refused. Returns the
 * length written (NUL not counted) or -EINVAL. */
int vhd_utf16_to_utf8(const uint8_t *p, size_t len, bool big_endian,
                      char *out, size_t outlen);

/* Formats a UUID as 8-4-4-4-12 lower-case hex into out[37]. */
void vhd_uuid_str(const uint8_t uuid[16], char out[37]);

#endif
