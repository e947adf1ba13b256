/* journal.c: see journal.h.
 *
 * The text, one record a line:
 *
 *   nbdflow-checkpoint 1
 *   src HEX SIZE FILE DEV INO MTIME_NS
 *   dst HEX SIZE FILE DEV INO MTIME_NS
 *   done OFFSET
 *   sum XXH64
 *
 * HEX is the name as written, in hexadecimal (a name may hold any byte);
 * numbers are decimal; XXH64 is XXH3-64 of every byte before its line,
 * in 16 hexadecimal digits. */
#include "copy/journal.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "format/target.h"
#include "util/fileio.h"

#define JOURNAL_MAGIC "nbdflow-checkpoint 1\n"

struct journal {
  char *path;     /* owned */
  char *tmp_path; /* path + ".new", owned */
  char *dir;      /* the directory holding path, owned */
  struct journal_rec rec;
};

/* ---- text ---- */

static size_t
journal_put_side(char *buf, size_t len, const char *tag,
                 const struct journal_side *s)
{
  static const char hex[] = "0123456789abcdef";
  size_t n = (size_t)snprintf(buf, len, "%s ", tag);
  for (const unsigned char *p = (const unsigned char *)s->spec;
       *p && n + 2 < len; p++) {
    buf[n++] = hex[*p >> 4];
    buf[n++] = hex[*p & 15];
  }
  n += (size_t)snprintf(buf + n, len - n,
                        " %" PRIu64 " %d %" PRIu64 " %" PRIu64 " %" PRId64 "\n",
                        s->size, s->file ? 1 : 0, s->dev, s->ino, s->mtime_ns);
  return n < len ? n : len - 1;
}

size_t
journal_encode(const struct journal_rec *rec, char *buf, size_t len)
{
  size_t n = (size_t)snprintf(buf, len, "%s", JOURNAL_MAGIC);
  n += journal_put_side(buf + n, len - n, "src", &rec->src);
  n += journal_put_side(buf + n, len - n, "dst", &rec->dst);
  n += (size_t)snprintf(buf + n, len - n, "done %" PRIu64 "\n", rec->done);
  uint64_t sum = XXH3_64bits(buf, n);
  n += (size_t)snprintf(buf + n, len - n, "sum %016" PRIx64 "\n", sum);
  return n < len ? n : len - 1;
}

/* A cursor over the text being decoded. */
struct journal_cur {
  const char *p, *end;
};

/* Takes the word "want" and one space. */
static bool
journal_take(struct journal_cur *c, const char *want)
{
  size_t n = strlen(want);
  if ((size_t)(c->end - c->p) < n || memcmp(c->p, want, n) != 0)
    return false;
  c->p += n;
  return true;
}

/* Takes a decimal number (no sign, no leading spaces) and the separator
 * after it (' ' or '\n'). */
static bool
journal_num(struct journal_cur *c, char sep, uint64_t *out)
{
  uint64_t v = 0;
  const char *start = c->p;
  while (c->p < c->end && *c->p >= '0' && *c->p <= '9') {
    unsigned d = (unsigned)(*c->p - '0');
    if (v > (UINT64_MAX - d) / 10)
      return false;
    v = v * 10 + d;
    c->p++;
  }
  if (c->p == start || c->p - start > 20 || c->p >= c->end || *c->p != sep)
    return false;
  c->p++;
  *out = v;
  return true;
}

static int
journal_hexval(char ch)
{
  if (ch >= '0' && ch <= '9')
    return ch - '0';
  if (ch >= 'a' && ch <= 'f')
    return ch - 'a' + 10;
  return -1;
}

static bool
journal_get_side(struct journal_cur *c, const char *tag, struct journal_side *s)
{
  if (!journal_take(c, tag) || !journal_take(c, " "))
    return false;
  size_t n = 0;
  while (c->p + 1 < c->end && *c->p != ' ') {
    int hi = journal_hexval(c->p[0]), lo = journal_hexval(c->p[1]);
    if (hi < 0 || lo < 0 || n >= JOURNAL_SPEC_MAX || (hi == 0 && lo == 0))
      return false;
    s->spec[n++] = (char)(hi << 4 | lo);
    c->p += 2;
  }
  s->spec[n] = '\0';
  uint64_t file, mtime;
  if (n == 0 || !journal_take(c, " ") || !journal_num(c, ' ', &s->size)
      || !journal_num(c, ' ', &file) || file > 1
      || !journal_num(c, ' ', &s->dev) || !journal_num(c, ' ', &s->ino)
      || !journal_num(c, '\n', &mtime) || mtime > INT64_MAX)
    return false;
  s->file = file == 1;
  s->mtime_ns = (int64_t)mtime;
  return true;
}

int
journal_decode(const char *text, size_t len, struct journal_rec *rec, char *err,
               size_t errlen)
{
  struct journal_cur c = { text, text + len };
  memset(rec, 0, sizeof *rec);
  if (!journal_take(&c, JOURNAL_MAGIC)) {
    snprintf(err, errlen, "not a checkpoint journal of this version");
    return -EINVAL;
  }
  if (!journal_get_side(&c, "src", &rec->src)
      || !journal_get_side(&c, "dst", &rec->dst) || !journal_take(&c, "done ")
      || !journal_num(&c, '\n', &rec->done)) {
    snprintf(err, errlen,
             "damaged (a record does not parse, at byte "
             "%zu)",
             (size_t)(c.p - text));
    return -EINVAL;
  }
  uint64_t want = XXH3_64bits(text, (size_t)(c.p - text)), got = 0;
  if (!journal_take(&c, "sum ") || c.end - c.p != 17 || c.p[16] != '\n') {
    snprintf(err, errlen, "damaged (no checksum line at its end)");
    return -EINVAL;
  }
  for (int i = 0; i < 16; i++) {
    int v = journal_hexval(c.p[i]);
    if (v < 0) {
      snprintf(err, errlen, "damaged (a bad checksum line)");
      return -EINVAL;
    }
    got = got << 4 | (uint64_t)v;
  }
  if (got != want) {
    snprintf(err, errlen,
             "damaged (checksum %016" PRIx64 ", its text "
             "gives %016" PRIx64 ")",
             got, want);
    return -EINVAL;
  }
  if (rec->done > rec->src.size) {
    snprintf(err, errlen,
             "damaged (done %" PRIu64 " is beyond the "
             "source's %" PRIu64 " bytes)",
             rec->done, rec->src.size);
    return -EINVAL;
  }
  return 0;
}

/* ---- sides ---- */

int
journal_side_init(struct journal_side *side, const char *spec, bool src,
                  uint64_t size, char *err, size_t errlen)
{
  memset(side, 0, sizeof *side);
  if (strlen(spec) > JOURNAL_SPEC_MAX || spec[0] == '\0') {
    snprintf(err, errlen,
             "--checkpoint: a name of %zu bytes is too long "
             "to record (%d at most)",
             strlen(spec), JOURNAL_SPEC_MAX);
    return -ENAMETOOLONG;
  }
  snprintf(side->spec, sizeof side->spec, "%s", spec);
  side->size = size;
  struct target t;
  target_parse(spec, src, &t);
  struct stat st;
  if (t.kind != TARGET_FILE || stat(t.arg, &st) < 0)
    return 0; /* NBD, generated, or not there: the name and size say it */
  side->file = true;
  if (S_ISBLK(st.st_mode)) {
    side->dev = (uint64_t)st.st_rdev;
  } else {
    side->dev = (uint64_t)st.st_dev;
    side->ino = (uint64_t)st.st_ino;
    if (src)
      side->mtime_ns
          = (int64_t)st.st_mtim.tv_sec * 1000000000 + st.st_mtim.tv_nsec;
  }
  return 0;
}

/* What differs between the recorded side a and the present b, or NULL. */
static const char *
journal_side_diff(const struct journal_side *a, const struct journal_side *b)
{
  if (strcmp(a->spec, b->spec) != 0)
    return "another name";
  if (a->size != b->size)
    return "another size";
  if (a->file != b->file || a->dev != b->dev || a->ino != b->ino)
    return "another file (device or inode)";
  if (a->mtime_ns != b->mtime_ns)
    return "a file modified since";
  return NULL;
}

/* ---- files ---- */

static int
journal_read(const char *path, char *buf, size_t cap, size_t *len)
{
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return -errno;
  size_t n = 0;
  int r = 0;
  for (;;) {
    ssize_t k = read(fd, buf + n, cap - n);
    if (k < 0 && errno == EINTR)
      continue;
    if (k < 0) {
      r = -errno;
      break;
    }
    if (k == 0)
      break;
    n += (size_t)k;
    if (n == cap) {
      r = -EFBIG;
      break;
    }
  }
  close(fd);
  *len = n;
  return r;
}

/* Syncs a directory, so that a rename in it lasts. */
static int
journal_sync_dir(const char *dir)
{
  int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0)
    return -errno;
  int r = fsync(fd) < 0 ? -errno : 0;
  close(fd);
  return r;
}

int
journal_commit(struct journal *j, uint64_t done, char *err, size_t errlen)
{
  char *text = malloc(JOURNAL_TEXT_MAX);
  int r = 0, fd = -1;
  if (text == NULL) {
    snprintf(err, errlen, "--checkpoint %s: out of memory", j->path);
    return -ENOMEM;
  }
  struct journal_rec rec = j->rec;
  rec.done = done;
  size_t len = journal_encode(&rec, text, JOURNAL_TEXT_MAX);
  const char *step = "create";
  fd = open(j->tmp_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0)
    goto fail;
  step = "write";
  if ((r = file_pwrite_full(fd, text, len, 0)) < 0) {
    errno = -r;
    goto fail;
  }
  step = "sync";
  if (fsync(fd) < 0)
    goto fail;
  close(fd);
  fd = -1;
  step = "rename";
  if (rename(j->tmp_path, j->path) < 0)
    goto fail;
  step = "sync the directory of";
  if ((r = journal_sync_dir(j->dir)) < 0) {
    errno = -r;
    goto fail;
  }
  j->rec.done = done;
  free(text);
  return 0;
fail:
  r = -errno;
  snprintf(err, errlen, "--checkpoint: cannot %s %s: %s", step,
           fd >= 0 || strcmp(step, "create") == 0 ? j->tmp_path : j->path,
           strerror(-r));
  if (fd >= 0)
    close(fd);
  unlink(j->tmp_path);
  free(text);
  return r;
}

/* Checks a journal found at path against the present pair: 0, or
 * -ESTALE with what differs in err. */
static int
journal_check(const char *path, const struct journal_side *src,
              const struct journal_side *dst, const struct journal_rec *old,
              char *err, size_t errlen)
{
  const char *why = journal_side_diff(&old->src, src);
  const char *which = "source";
  if (why == NULL) {
    why = journal_side_diff(&old->dst, dst);
    which = "destination";
  }
  if (why) {
    const struct journal_side *was = which[0] == 's' ? &old->src : &old->dst;
    snprintf(err, errlen,
             "--checkpoint %s records a copy with %s as "
             "%s (%" PRIu64 " bytes); this one has %s: refusing to "
             "continue it (remove the file to start again)",
             path, was->spec, which, was->size, why);
    return -ESTALE;
  }
  return 0;
}

/* Reads and decodes the journal at path into *old: 0, -ENOENT (no
 * journal), or -errno with a sentence in err. */
static int
journal_load(const char *path, struct journal_rec *old, char *err,
             size_t errlen)
{
  char *text = malloc(JOURNAL_TEXT_MAX);
  size_t len = 0;
  if (text == NULL) {
    snprintf(err, errlen, "--checkpoint: out of memory");
    return -ENOMEM;
  }
  int r = journal_read(path, text, JOURNAL_TEXT_MAX, &len);
  if (r < 0 && r != -ENOENT) {
    snprintf(err, errlen, "--checkpoint %s: %s", path,
             r == -EFBIG ? "too large for a checkpoint journal" : strerror(-r));
  } else if (r == 0) {
    char why[200];
    r = journal_decode(text, len, old, why, sizeof why);
    if (r < 0)
      snprintf(err, errlen, "--checkpoint %s: %s", path, why);
  }
  free(text);
  return r;
}

/* path's directory, in a new string (NULL: no memory). */
static char *
journal_dir(const char *path)
{
  char *dir = strdup(path);
  if (dir == NULL)
    return NULL;
  char *slash = strrchr(dir, '/');
  if (slash == NULL)
    strcpy(dir, ".");
  else if (slash == dir)
    slash[1] = '\0';
  else
    *slash = '\0';
  return dir;
}

int
journal_precheck(const char *path, const struct journal_side *src,
                 const char *dst_spec, bool dst_raw, uint64_t *dst_size,
                 char *err, size_t errlen)
{
  struct journal_rec old;
  *dst_size = UINT64_MAX;
  int r = journal_load(path, &old, err, errlen);
  if (r == -ENOENT) {
    /* A new journal: its directory must take the file. */
    char *dir = journal_dir(path);
    if (dir == NULL) {
      snprintf(err, errlen, "--checkpoint: out of memory");
      return -ENOMEM;
    }
    r = access(dir, W_OK | X_OK) < 0 ? -errno : 0;
    if (r < 0)
      snprintf(err, errlen, "--checkpoint %s: cannot create it in %s: %s",
               path, dir, strerror(-r));
    free(dir);
    return r;
  }
  if (r < 0)
    return r;
  /* The destination as it is now. Opening it comes later, and checks
   * its size then; but a raw file is cut or grown to the source's size
   * by that open, which would hide one emptied or cut since: its size
   * counts now. */
  uint64_t size = old.dst.size;
  struct target t;
  struct stat st;
  target_parse(dst_spec, false, &t);
  if (dst_raw && t.kind == TARGET_FILE && stat(t.arg, &st) == 0 &&
      S_ISREG(st.st_mode))
    size = (uint64_t)st.st_size;
  struct journal_side dst;
  r = journal_side_init(&dst, dst_spec, false, size, err, errlen);
  if (r == 0)
    r = journal_check(path, src, &dst, &old, err, errlen);
  if (r == 0)
    *dst_size = old.dst.size;
  return r;
}

int
journal_open(const char *path, const struct journal_side *src,
             const struct journal_side *dst, struct journal **out,
             uint64_t *done, char *err, size_t errlen)
{
  struct journal *j = calloc(1, sizeof *j);
  int r;
  *done = 0;
  if (j == NULL)
    goto nomem;
  size_t plen = strlen(path);
  j->path = strdup(path);
  j->tmp_path = malloc(plen + 5);
  j->dir = journal_dir(path);
  if (j->path == NULL || j->tmp_path == NULL || j->dir == NULL)
    goto nomem;
  memcpy(j->tmp_path, path, plen);
  memcpy(j->tmp_path + plen, ".new", 5);
  j->rec.src = *src;
  j->rec.dst = *dst;
  struct journal_rec old;
  r = journal_load(path, &old, err, errlen);
  if (r == -ENOENT) {
    r = journal_commit(j, 0, err, errlen); /* can it be written at all? */
  } else if (r == 0) {
    r = journal_check(path, src, dst, &old, err, errlen);
    if (r == 0)
      *done = j->rec.done = old.done;
  }
  if (r < 0) {
    journal_free(j);
    return r;
  }
  *out = j;
  return 0;
nomem:
  journal_free(j);
  snprintf(err, errlen, "--checkpoint: out of memory");
  return -ENOMEM;
}

void
journal_free(struct journal *j)
{
  if (j == NULL)
    return;
  free(j->path);
  free(j->tmp_path);
  free(j->dir);
  free(j);
}
