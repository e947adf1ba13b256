/* vhd_write.h: writing a dynamic VHD in one forward pass, as a stream
 * (a pipe, a socket or a new file): footer copy, dynamic header, BAT,
 * then the allocated blocks in order, each its sector bitmap and data,
 * then the footer. The BAT leaves first, so which blocks hold data must
 * be known before the first byte: the caller passes the source's
 * allocation. Blocks it calls empty stay unallocated; data written into
 * one must be zeroes (else -EIO: the source changed under the copy).
 *
 * Not thread-safe: one writer, data in offset order. Blocks on fd. */
#ifndef NBDFLOW_FORMAT_VHD_WRITE_H
#define NBDFLOW_FORMAT_VHD_WRITE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct vhd_writer;

/* A writer of a disk of size bytes (rounded up to a sector; at most
 * VHD_MAX_SIZE) in blocks of block bytes. alloc has one bit per block,
 * LSB first (bit b of byte b / 8): set when the block holds data; NULL:
 * every block does. Writes nothing yet. */
int vhd_writer_new(uint64_t size, uint32_t block, const uint8_t *alloc,
                   struct vhd_writer **out, char *err, size_t errlen);
/* The next len bytes of the disk at off, which must be where the last
 * call ended, into fd (borrowed; the same every call); buf NULL means
 * zeroes. Writes the tables first on the first call, and the footer once
 * the disk's last byte is in. Returns 0 or -errno with a sentence in
 * err. */
int vhd_writer_put(struct vhd_writer *w, int fd, uint64_t off,
                   const uint8_t *buf, uint64_t len, char *err,
                   size_t errlen);
/* Whether the footer has been written (the VHD is complete). */
bool vhd_writer_done(const struct vhd_writer *w);
void vhd_writer_free(struct vhd_writer *w);

#endif
