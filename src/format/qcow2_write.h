/* qcow2_write.h: writing a qcow2 (version 3, 64 KiB clusters, 16-bit
 * refcounts, no backing file) in one forward pass, as a stream, as xapi's
 * qcow2 export does: the header cluster, the L1 table, the refcount table
 * and blocks, the L2 tables, then the data clusters in guest order. Every
 * table is computed from the source's allocation before the first byte,
 * so the refcounts are right and `qemu-img check` finds nothing; clusters
 * the allocation calls empty stay unallocated (data into one must be
 * zeroes: else -EIO, the source changed under the copy).
 *
 * Not thread-safe: one writer, data in offset order. Blocks on fd. */
#ifndef NBDFLOW_FORMAT_QCOW2_WRITE_H
#define NBDFLOW_FORMAT_QCOW2_WRITE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define QCOW2_WRITE_CLUSTER (UINT32_C(64) << 10)

struct qcow2_writer;

/* A writer of a disk of size bytes (rounded up to a sector). alloc has one
 * bit per 64 KiB cluster, LSB first; NULL: every cluster holds data.
 * Writes nothing yet. */
int qcow2_writer_new(uint64_t size, const uint8_t *alloc,
                     struct qcow2_writer **out, char *err, size_t errlen);
/* The next len bytes at off (where the last put ended) into fd (borrowed,
 * the same every call); buf NULL: zeroes. The tables leave on the first
 * call; the image is whole once the disk's last byte is in. */
int qcow2_writer_put(struct qcow2_writer *w, int fd, uint64_t off,
                     const uint8_t *buf, uint64_t len, char *err,
                     size_t errlen);
bool qcow2_writer_done(const struct qcow2_writer *w);
void qcow2_writer_free(struct qcow2_writer *w);

#endif
