/* journal.h: the checkpoint file of a copy (--checkpoint FILE).
 *
 * It says how far from the start the destination holds every byte of
 * the source, acknowledged and then flushed, and which source and
 * destination that was: each one's name as the user wrote it, its size,
 * and for a file or block device its identity (device and inode, and a
 * source file's modification time). A copy run again with the same
 * names and the same file continues from that offset; a journal that
 * names another pair, or a side whose size or identity changed, is
 * refused.
 *
 * The file is small text, one record per line, ending with a checksum
 * of everything before it. It is never written in place: each commit
 * writes a new file beside it, syncs it, renames it over the old one and
 * syncs the directory, so that a crash at any moment leaves the old
 * journal or the new one, never a mix; a file that does not parse or
 * whose checksum is wrong is refused, not trusted.
 *
 * journal_encode and journal_decode are pure (no I/O) for the unit
 * test; the rest does the file work. Nothing here is thread-safe: the
 * copy's loop thread calls journal_commit. */
#ifndef NBDFLOW_COPY_JOURNAL_H
#define NBDFLOW_COPY_JOURNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define JOURNAL_SPEC_MAX 4096 /* a longer name is refused */
#define JOURNAL_TEXT_MAX (4 * JOURNAL_SPEC_MAX + 512) /* a whole file */

/* One side of the copy. */
struct journal_side {
  char spec[JOURNAL_SPEC_MAX + 1]; /* as written on the command line */
  uint64_t size;
  bool file;         /* a file or block device: the fields below count */
  uint64_t dev, ino; /* a block device: its st_rdev, ino 0 */
  int64_t mtime_ns;  /* source files only (a destination changes); else 0 */
};

struct journal_rec {
  struct journal_side src, dst;
  uint64_t done; /* every byte below this has landed, flushed */
};

/* Writes rec as the journal's text into buf (JOURNAL_TEXT_MAX bytes).
 * Returns the length. */
size_t journal_encode(const struct journal_rec *rec, char *buf, size_t len);
/* Parses a journal's text (len bytes, not NUL-terminated). Returns 0, or
 * -EINVAL with a sentence in err: a wrong header, a bad field, a wrong
 * checksum, or done beyond the source's size. */
int journal_decode(const char *text, size_t len, struct journal_rec *rec,
                   char *err, size_t errlen);

/* Fills side from spec (a path, URI, generated source...) and its size:
 * a spec that names an existing file or block device gets its identity
 * (src: with the modification time). Returns 0, or -errno with a
 * sentence in err (a name too long). */
int journal_side_init(struct journal_side *side, const char *spec, bool src,
                      uint64_t size, char *err, size_t errlen);

/* Before the destination is opened (which may truncate or create it),
 * so that a journal that would be refused leaves it untouched: when path
 * holds a journal, it must parse and name src and dst_spec, with the
 * destination's identity as it is now, and, when dst_raw says it is
 * written raw, a regular file's size too (journal_open checks the size
 * of the rest); when path does not exist, its directory must be
 * writable. *dst_size: the destination's size the journal holds, or
 * UINT64_MAX when there is none yet. Returns 0, or -errno with a
 * sentence in err. */
int journal_precheck(const char *path, const struct journal_side *src,
                     const char *dst_spec, bool dst_raw, uint64_t *dst_size,
                     char *err, size_t errlen);

struct journal;

/* Opens the journal at path for a copy from src to dst. When the file
 * exists, it must name the same pair, sizes and identities: *done is
 * then where the copy continues (else -ESTALE, with what differs in
 * err). When it does not exist, a journal saying 0 is written at once,
 * so that a path that cannot be written fails before the copy. Returns
 * 0 with *out, or -errno with a sentence in err. */
int journal_open(const char *path, const struct journal_side *src,
                 const struct journal_side *dst, struct journal **out,
                 uint64_t *done, char *err, size_t errlen);
/* Records that every byte below done has landed (new file, fsync,
 * rename, fsync of the directory). Returns 0, or -errno with a sentence
 * in err; the old journal then stays as it was. */
int journal_commit(struct journal *j, uint64_t done, char *err, size_t errlen);
void journal_free(struct journal *j);

#endif
