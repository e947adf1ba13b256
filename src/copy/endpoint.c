/* endpoint.c: endpoint dispatch, the completion queue, and the local
 * kinds: files and block devices, pipes ('-') and null:. File and pipe
 * I/O may block, so it runs on the worker pool. */
#include "copy/endpoint.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/falloc.h>
#include <linux/fs.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include "copy/nbd_io.h"
#include "format/image.h"
#include "format/target.h"
#include "proto/http.h"
#include "net/loop.h"
#include "util/fileio.h"
#include "util/zero.h"

#define FILE_SPARSE_BLOCK 4096
#define FILE_PREFETCH_EXTENTS 256

/* Read-only zeros for ZERO on pipes and devices without zeroing. */
static const uint8_t ep_zero_page[256 << 10];

struct file_priv {
  int fd;
  bool fresh;          /* destination was empty: reads as zeroes */
  bool dense;          /* -S 0: data is written whole even where fresh */
  bool is_pipe;        /* read or written in order: '-', a FIFO, a
                          character device */
  bool std_fd;         /* fd is stdin or stdout ('-'): not closed here */
  bool mappable;       /* a readable regular file or device: map works */
  /* A destination file whose size is unknown (the source is a pipe)
   * starts empty and grows. Every write and zero first grows it to its
   * own end under grow_lock, so no ftruncate can cut off what another
   * worker is writing, and zeroes at the end still reach the size. */
  bool growing;
  uint64_t grow_goal;        /* the largest end grown to; grow_lock's */
  pthread_mutex_t grow_lock;
  /* A source's first extents, looked up on a worker from the moment it is
   * opened: SEEK_HOLE can take milliseconds per GiB of data (tmpfs walks
   * its pages), and so it overlaps connecting the destination instead of
   * holding up the first read. The fields below are the loop thread's. */
  struct ep_op pf_op;
  struct endpoint_extent pf_ext[FILE_PREFETCH_EXTENTS];
  enum { PF_NONE, PF_RUNNING, PF_DONE, PF_USED } pf_state;
  struct ep_op *pf_waiter; /* the caller's EXTENTS at 0, until PF_DONE */
};

int
ep_env_init(struct ep_env *env, struct loop *loop, int nthreads)
{
  memset(env, 0, sizeof *env);
  env->loop = loop;
  pthread_mutex_init(&env->lock, NULL);
  env->wq = workq_new(nthreads);
  return env->wq ? 0 : -errno;
}

void
ep_env_fini(struct ep_env *env)
{
  if (env->wq)
    workq_free(env->wq);
  env->wq = NULL;
  pthread_mutex_destroy(&env->lock);
}

void
ep_env_complete(struct ep_env *env, struct ep_op *op)
{
  op->next_done = NULL;
  pthread_mutex_lock(&env->lock);
  /* Only the op that finds the list empty wakes the loop: ep_env_drain
   * takes the whole list, so a list that holds ops has a wake on its way
   * (its first op's) that the loop has not yet answered. One write per
   * batch instead of one per op: each costs the worker a syscall and the
   * loop a read and another turn. */
  bool wake = env->done_head == NULL;
  if (env->done_tail)
    env->done_tail->next_done = op;
  else
    env->done_head = op;
  env->done_tail = op;
  pthread_mutex_unlock(&env->lock);
  if (wake)
    loop_wake(env->loop);
}

void
ep_env_drain(struct ep_env *env)
{
  pthread_mutex_lock(&env->lock);
  struct ep_op *op = env->done_head;
  env->done_head = env->done_tail = NULL;
  pthread_mutex_unlock(&env->lock);
  while (op) {
    struct ep_op *next = op->next_done;
    op->done(op);
    op = next;
  }
}

/* ---- worker-side file and pipe I/O ---- */

static int
file_pread_all(int fd, uint8_t *buf, size_t len, uint64_t off, bool pipe,
               size_t *got)
{
  size_t done = 0;
  while (done < len) {
    ssize_t n = pipe ? read(fd, buf + done, len - done)
                     : pread(fd, buf + done, len - done, (off_t)(off + done));
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0 && errno == EAGAIN && pipe) {
      int r = file_wait_ready(fd, POLLIN);
      if (r < 0)
        return -r;
      continue;
    }
    if (n < 0)
      return errno;
    if (n == 0)
      break;
    done += (size_t)n;
  }
  *got = done;
  return 0;
}

static int
file_pwrite_all(int fd, const uint8_t *buf, size_t len, uint64_t off,
                bool pipe)
{
  /* fileio's loops, as a positive errno; a stream waits on EAGAIN. */
  return pipe ? -file_write_stream(fd, buf, len)
              : -file_pwrite_full(fd, buf, len, off);
}

/* Writes into a file known to read as zeroes, skipping zero blocks, so
 * that the destination stays sparse. */
static int
file_write_sparse(int fd, const uint8_t *buf, size_t len, uint64_t off)
{
  size_t i = 0;
  while (i < len) {
    size_t blk = FILE_SPARSE_BLOCK - (size_t)((off + i) % FILE_SPARSE_BLOCK);
    if (blk > len - i)
      blk = len - i;
    if (buf_is_zero(buf + i, blk)) {
      i += blk;
      continue;
    }
    size_t start = i;
    while (i < len) {
      blk = FILE_SPARSE_BLOCK - (size_t)((off + i) % FILE_SPARSE_BLOCK);
      if (blk > len - i)
        blk = len - i;
      if (buf_is_zero(buf + i, blk))
        break;
      i += blk;
    }
    int r = file_pwrite_all(fd, buf + start, i - start, off + start, false);
    if (r)
      return r;
  }
  return 0;
}

/* Makes a growing file at least end bytes long; never shrinks it. */
static int
file_grow_to(struct file_priv *p, uint64_t end)
{
  struct stat st;
  int r = 0;
  pthread_mutex_lock(&p->grow_lock);
  if (end > p->grow_goal) {
    p->grow_goal = end;
    if (fstat(p->fd, &st) < 0)
      r = errno;
    else if ((uint64_t)st.st_size < end &&
             ftruncate(p->fd, (off_t)end) < 0)
      r = errno;
  }
  pthread_mutex_unlock(&p->grow_lock);
  return r;
}

static int
file_zero(struct file_priv *p, uint64_t off, uint64_t len, bool *skipped)
{
  if (p->is_pipe) {
    while (len > 0) {
      size_t n = len > sizeof ep_zero_page ? sizeof ep_zero_page : len;
      int r = file_pwrite_all(p->fd, ep_zero_page, n, 0, true);
      if (r)
        return r;
      len -= n;
    }
    return 0;
  }
  /* A growing file first reaches the range's end (a file of known size
   * got its size when it was opened). */
  int r = p->growing ? file_grow_to(p, off + len) : 0;
  if (r)
    return r;
  if (p->fresh) { /* already zero */
    *skipped = true;
    return 0;
  }
  if (file_punch_or_zero(p->fd, off, len) == 0)
    return 0;
  while (len > 0) {
    size_t n = len > sizeof ep_zero_page ? sizeof ep_zero_page : len;
    r = file_pwrite_all(p->fd, ep_zero_page, n, off, false);
    if (r)
      return r;
    off += n;
    len -= n;
  }
  return 0;
}

static int
file_extents(struct endpoint *e, struct ep_op *op)
{
  struct file_priv *p = e->priv;
  uint64_t off = op->offset, end = op->offset + op->length;
  while (off < end && op->nextents < op->max_extents) {
    struct file_run run;
    int r = file_run_at(p->fd, off, e->size, &run);
    if (r == -ENXIO) {
      snprintf(op->errmsg, sizeof op->errmsg,
               "the file is now shorter than the %llu bytes being copied",
               (unsigned long long)e->size);
      return -EIO;
    }
    if (r < 0)
      return r;
    op->extents[op->nextents++] = (struct endpoint_extent){ run.length,
                                                            run.hole };
    off += run.length;
  }
  return 0;
}

static void
file_work(struct work *w)
{
  struct ep_op *op = (struct ep_op *)((char *)w - offsetof(struct ep_op, work));
  struct endpoint *e = op->ep;
  struct file_priv *p = e->priv;
  size_t got = 0;
  switch (op->type) {
  case EP_READ:
    op->err = file_pread_all(p->fd, op->buf, (size_t)op->length, op->offset,
                             p->is_pipe, &got);
    if (op->err == 0 && got < op->length) {
      if (p->is_pipe) {
        op->eof = true;
        op->length = got;
      } else {
        op->err = EIO;
        snprintf(op->errmsg, sizeof op->errmsg, "file ended early");
      }
    }
    break;
  case EP_WRITE:
    if (p->growing &&
        (op->err = file_grow_to(p, op->offset + op->length)) != 0)
      break;
    if (p->fresh && !p->dense)
      op->err = file_write_sparse(p->fd, op->buf, (size_t)op->length,
                                  op->offset);
    else
      op->err = file_pwrite_all(p->fd, op->buf, (size_t)op->length,
                                op->offset, p->is_pipe);
    break;
  case EP_ZERO:
    op->err = file_zero(p, op->offset, op->length, &op->skipped);
    break;
  case EP_EXTENTS:
    op->err = -file_extents(e, op);
    break;
  case EP_FLUSH:
    if (!p->is_pipe && fdatasync(p->fd) < 0)
      op->err = errno;
    break;
  default:
    op->err = EINVAL;
    break;
  }
  ep_env_complete(e->env, op);
}

/* Hands the prefetched extents to the caller's op, cut to what it asked
 * for and has room for; the extents are contiguous from 0, so any prefix
 * of them is a true answer. */
static void
file_prefetch_deliver(struct file_priv *p, struct ep_op *op)
{
  op->err = p->pf_op.err;
  memcpy(op->errmsg, p->pf_op.errmsg, sizeof op->errmsg);
  uint64_t covered = 0;
  for (size_t i = 0; !op->err && i < p->pf_op.nextents &&
                     op->nextents < op->max_extents && covered < op->length;
       i++) {
    struct endpoint_extent x = p->pf_ext[i];
    if (x.length > op->length - covered)
      x.length = op->length - covered;
    op->extents[op->nextents++] = x;
    covered += x.length;
  }
  p->pf_state = PF_USED;
}

/* The prefetch finished (on the loop thread, through the done queue). */
static void
file_prefetch_done(struct ep_op *pf)
{
  struct endpoint *e = pf->ep;
  struct file_priv *p = e->priv;
  p->pf_state = PF_DONE;
  struct ep_op *op = p->pf_waiter;
  p->pf_waiter = NULL;
  if (op) {
    file_prefetch_deliver(p, op);
    op->done(op);
  }
}

static void
file_prefetch_start(struct endpoint *e)
{
  struct file_priv *p = e->priv;
  p->pf_op = (struct ep_op){
    .type = EP_EXTENTS, .offset = 0,
    .length = e->size < ENDPOINT_STATUS_SPAN ? e->size : ENDPOINT_STATUS_SPAN,
    .extents = p->pf_ext, .max_extents = FILE_PREFETCH_EXTENTS,
    .done = file_prefetch_done, .ep = e };
  p->pf_op.work.fn = file_work;
  p->pf_state = PF_RUNNING;
  workq_push(e->env->wq, &p->pf_op.work);
}

static int
file_submit(struct endpoint *e, struct ep_op *op)
{
  struct file_priv *p = e->priv;
  /* A second lookup at 0 while the prefetch has a waiter takes the
   * ordinary path (the engine asks one at a time, so it does not). */
  if (op->type == EP_EXTENTS && op->offset == 0 &&
      (p->pf_state == PF_DONE ||
       (p->pf_state == PF_RUNNING && p->pf_waiter == NULL))) {
    if (p->pf_state == PF_RUNNING) {
      p->pf_waiter = op;
      return 0;
    }
    file_prefetch_deliver(p, op);
    ep_env_complete(e->env, op);
    return 0;
  }
  bool reads = op->type == EP_READ || op->type == EP_EXTENTS;
  if ((reads && !e->readable) || (!reads && !e->writable) ||
      (op->type == EP_EXTENTS && !e->has_extents))
    return -EBADF;
  op->work.fn = file_work;
  workq_push(e->env->wq, &op->work);
  return 0;
}

static void
file_close(struct endpoint *e)
{
  struct file_priv *p = e->priv;
  if (!p->std_fd && p->fd >= 0)
    close(p->fd);
  pthread_mutex_destroy(&p->grow_lock);
  free(p);
}

/* A raw file or device maps one to one. */
static int
file_map(struct endpoint *e, uint64_t off, uint64_t len,
         struct endpoint_map *m)
{
  struct file_priv *p = e->priv;
  if (!p->mappable || off >= e->size)
    return -EAGAIN;
  uint64_t n = e->size - off < len ? e->size - off : len;
  *m = (struct endpoint_map){ p->fd, off, n };
  return 0;
}

static const struct endpoint_ops file_ops = {
  .kind = "file",
  .submit = file_submit,
  .close = file_close,
  .map = file_map,
};

static int
ep_fail(char *err, size_t errlen, int r, const char *fmt, const char *a)
{
  /* A name of thousands of bytes would push the reason out of the line:
   * its start and its end are kept. */
  char shown[200];
  size_t n = strlen(a);
  if (n >= sizeof shown) {
    snprintf(shown, sizeof shown, "%.120s...%s", a, a + n - 60);
    a = shown;
  }
  snprintf(err, errlen, fmt, a, strerror(-r));
  return r;
}

struct endpoint *
endpoint_new(struct ep_env *env, const char *name,
             const struct endpoint_ops *ops, void *priv)
{
  struct endpoint *e = calloc(1, sizeof *e);
  if (e == NULL)
    return NULL;
  e->ops = ops;
  e->env = env;
  e->name = name;
  e->align = 1;
  e->max_request = 32u << 20;
  e->connections = 1;
  e->size_known = true;
  e->priv = priv;
  return e;
}

static int null_open(struct ep_env *env, const char *spec,
                     const struct endpoint_opts *o, struct endpoint **out,
                     char *err, size_t errlen);

/* A character device or a FIFO named by path, found before it is opened
 * (opening a FIFO to read waits for a writer). As a destination it is
 * written in order, as '-' is, and the null device discards as null:
 * does. As a source it has no size, so nothing could say where the copy
 * ends: refused, saying what to use. */
static int
stream_open(struct ep_env *env, const char *spec, const char *path,
            const struct stat *st, const struct endpoint_opts *o,
            struct endpoint **out, char *err, size_t errlen)
{
  bool fifo = S_ISFIFO(st->st_mode);
  if (!o->write) {
    snprintf(err, errlen, "%s is a %s: it has no size to copy (%s)", spec,
             fifo ? "named pipe" : "character device",
             fifo ? "read it as a stream: 'nbdflow copy - DST < PIPE'"
                  : "for zeroes or random bytes use zero:SIZE or "
                    "random:SIZE");
    return -ESPIPE;
  }
  if (!fifo && major(st->st_rdev) == 1 && minor(st->st_rdev) == 3)
    return null_open(env, spec, o, out, err, errlen);
  struct file_priv *p = calloc(1, sizeof *p);
  struct endpoint *e = p ? endpoint_new(env, spec, &file_ops, p) : NULL;
  if (e == NULL) {
    free(p);
    return ep_fail(err, errlen, -ENOMEM, "%s: %s", spec);
  }
  pthread_mutex_init(&p->grow_lock, NULL);
  p->is_pipe = true;
  p->fd = open(path, O_WRONLY | O_CLOEXEC);
  if (p->fd < 0) {
    int r = ep_fail(err, errlen, -errno, "open %s: %s", spec);
    file_close(e);
    free(e);
    return r;
  }
  e->writable = e->can_zero = e->can_flush = true;
  e->sequential = true;
  e->size_known = false;
  e->size = UINT64_MAX;
  *out = e;
  return 0;
}

static int
file_open(struct ep_env *env, const char *spec, const char *path, bool pipe,
          const struct endpoint_opts *o, struct endpoint **out, char *err,
          size_t errlen)
{
  struct stat pre;
  if (!pipe && stat(path, &pre) == 0 &&
      (S_ISCHR(pre.st_mode) || S_ISFIFO(pre.st_mode)))
    return stream_open(env, spec, path, &pre, o, out, err, errlen);
  struct file_priv *p = calloc(1, sizeof *p);
  struct endpoint *e = p ? endpoint_new(env, spec, &file_ops, p) : NULL;
  int r;
  if (e == NULL) {
    free(p);
    return ep_fail(err, errlen, -ENOMEM, "%s: %s", spec);
  }
  pthread_mutex_init(&p->grow_lock, NULL);
  p->is_pipe = pipe;
  p->std_fd = pipe;
  if (pipe)
    p->fd = o->write ? STDOUT_FILENO : STDIN_FILENO;
  else
    p->fd = open(path, o->write ? O_WRONLY | O_CREAT | O_CLOEXEC
                                : O_RDONLY | O_CLOEXEC, 0644);
  if (p->fd < 0) {
    r = ep_fail(err, errlen, -errno, "open %s: %s", spec);
    goto fail;
  }
  e->readable = !o->write;
  e->writable = o->write;
  e->can_zero = e->can_flush = true;
  if (pipe) {
    e->sequential = true;
    e->size_known = false;
    e->size = UINT64_MAX;
    *out = e;
    return 0;
  }
  struct stat st;
  if (fstat(p->fd, &st) < 0) {
    r = ep_fail(err, errlen, -errno, "stat %s: %s", spec);
    goto fail;
  }
  if (o->write && S_ISREG(st.st_mode)) {
    /* An empty file reads as zeroes: zero ranges stay holes. A file with
     * content keeps its blocks: it is written over in place (pre-allocated
     * images stay allocated where data lands), its zero ranges are
     * punched, and it takes the source's size. Without a size (a pipe)
     * it starts empty and grows. */
    bool empty = st.st_size == 0;
    int t = 0;
    if (o->create_size == UINT64_MAX) {
      t = empty ? 0 : ftruncate(p->fd, 0);
      empty = true;
    } else if ((uint64_t)st.st_size != o->create_size) {
      t = ftruncate(p->fd, (off_t)o->create_size);
    }
    if (t < 0) {
      r = ep_fail(err, errlen, -errno, "truncate %s: %s", spec);
      goto fail;
    }
    p->fresh = empty && !o->allocated;
    p->dense = o->dense;
    p->growing = o->create_size == UINT64_MAX;
  } else if (o->write && !S_ISBLK(st.st_mode)) {
    r = ep_fail(err, errlen, -EINVAL, "%s: %s (not a file, device or '-')",
                spec);
    goto fail;
  }
  r = file_size(p->fd, &e->size);
  if (r < 0) {
    r = ep_fail(err, errlen, r, "size of %s: %s", spec);
    goto fail;
  }
  if (o->write && S_ISREG(st.st_mode) && o->create_size == UINT64_MAX) {
    e->size = UINT64_MAX; /* grows with the copy */
    e->size_known = false;
  }
  e->has_extents = S_ISREG(st.st_mode);
  p->mappable = !o->write; /* regular file or device: sendfile reads it */
  if (!o->write && e->has_extents && e->size > 0 && !o->no_extents)
    file_prefetch_start(e);
  *out = e;
  return 0;
fail:
  file_close(e);
  free(e);
  return r;
}

/* ---- null: ---- */

static int
null_submit(struct endpoint *e, struct ep_op *op)
{
  if (op->type == EP_READ || op->type == EP_EXTENTS)
    return -EBADF;
  ep_env_complete(e->env, op);
  return 0;
}

static void
null_close(struct endpoint *e)
{
  (void)e;
}

static const struct endpoint_ops null_ops = {
  .kind = "null",
  .submit = null_submit,
  .close = null_close,
};

static int
null_open(struct ep_env *env, const char *spec, const struct endpoint_opts *o,
          struct endpoint **out, char *err, size_t errlen)
{
  if (!o->write)
    return ep_fail(err, errlen, -EINVAL, "%s: %s (only as destination)",
                   spec);
  struct endpoint *e = endpoint_new(env, spec, &null_ops, NULL);
  if (e == NULL)
    return ep_fail(err, errlen, -ENOMEM, "%s: %s", spec);
  e->writable = e->can_zero = e->can_flush = true;
  e->size = UINT64_MAX;
  e->size_known = false;
  *out = e;
  return 0;
}

/* An image held by an NBD export as raw bytes, read through the format
 * layer: the format is named (an export is never probed). */
static int
nbd_image_open(struct ep_env *env, const char *spec,
               const struct endpoint_opts *o, struct endpoint **out,
               char *err, size_t errlen)
{
  struct image_io *io;
  int r = nbd_io_open(spec, o->timeout_s, &io, err, errlen);
  if (r < 0)
    return r;
  struct image_opts io_opts = { .format = o->format, .format_given = true,
                                .ignore_checksums = o->ignore_checksums };
  struct image *img;
  r = image_open_io(io, spec, &io_opts, &img, err, errlen);
  if (r < 0)
    return r;
  return endpoint_open_image(env, spec, img, out, err, errlen);
}

/* A file source: an image in a format goes through the format layer, a
 * raw file is read as it is. */
static int
source_open(struct ep_env *env, const char *spec, const struct target *t,
            const struct endpoint_opts *o, struct endpoint **out, char *err,
            size_t errlen)
{
  struct image_opts io = {
    .format = t->format_given ? t->format : o->format,
    .format_given = t->format_given || o->format_given,
    .ignore_checksums = o->ignore_checksums,
  };
  struct image *img;
  struct stat st; /* probing would wait for a FIFO's writer */
  if (stat(t->arg, &st) == 0 && (S_ISCHR(st.st_mode) || S_ISFIFO(st.st_mode)))
    return stream_open(env, spec, t->arg, &st, o, out, err, errlen);
  int r = image_open(t->arg, &io, &img, err, errlen);
  if (r < 0)
    return r;
  if (r > 0)
    return endpoint_open_image(env, spec, img, out, err, errlen);
  return file_open(env, spec, t->arg, false, o, out, err, errlen);
}

/* --dst-protocol chunked into a file or '-': the frames themselves are
 * the file's content (as vhd-tool's chunked output to a file). */
static int
chunked_file_open(struct ep_env *env, const char *spec,
                  const struct target *t, const struct endpoint_opts *o,
                  struct endpoint **out, char *err, size_t errlen)
{
  struct client_conn c; /* a file or '-': endpoint_check refused others */
  memset(&c, 0, sizeof c);
  bool pipe = t->kind == TARGET_PIPE;
  c.fd = pipe ? STDOUT_FILENO
              : open(t->arg, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (c.fd < 0)
    return ep_fail(err, errlen, -errno, "%s: %s", spec);
  return endpoint_open_chunked(env, spec, &c, !pipe, NULL, o, out, err,
                               errlen);
}

int
endpoint_check(const char *spec, const struct endpoint_opts *o, char *err,
               size_t errlen)
{
  const char *name = o->shown ? o->shown : spec;
  const char *side = o->write ? "DESTINATION" : "SOURCE";
  bool image = o->format_given && o->format > IMAGE_FORMAT_RAW;
  if (spec[0] == '\0') {
    snprintf(err, errlen, "%s is an empty name", side);
    return -EINVAL;
  }
  if (http_url_is_http(spec) || strncmp(spec, "chunked+tcp://", 14) == 0 ||
      strncmp(spec, "chunked+unix://", 15) == 0) {
    bool http = http_url_is_http(spec);
    if (!o->write) {
      snprintf(err, errlen, "%s: %s is a destination only", name,
               http ? "an http(s) URL (xapi receives uploads there)"
                    : "a Chunked stream");
      return -EINVAL;
    }
    if (image) {
      snprintf(err, errlen, "%s: an image (--dst-format %s) is written to a "
               "file or '-'; an upload is raw", name,
               image_format_name(o->format));
      return -EINVAL;
    }
    if (http) {
      struct http_url u;
      char why[224];
      if (http_url_parse(spec, &u, why, sizeof why) < 0) {
        snprintf(err, errlen, "%s: %s", name, why);
        return -EINVAL;
      }
      http_url_free(&u);
      return 0;
    }
    if (o->protocol == EP_PROTO_NBD) {
      snprintf(err, errlen, "%s: a Chunked stream speaks Chunked, not NBD "
               "(--dst-protocol nbd)", name);
      return -EINVAL;
    }
    char host[256];
    const char *port;
    return endpoint_chunked_addr(spec, host, sizeof host, &port, err,
                                 errlen) < 0 ? -EINVAL : 0;
  }
  struct target t;
  target_parse(spec, !o->write && !o->as_dst, &t);
  if (target_check_prefix(&t, spec, err, errlen) < 0)
    return -EINVAL;
  if (t.format_given && o->format_given && t.format != o->format) {
    snprintf(err, errlen, "%s names the format %s, and the format option "
             "%s: give one", spec, image_format_name(t.format),
             image_format_name(o->format));
    return -EINVAL;
  }
  bool chunked = o->write && o->protocol == EP_PROTO_CHUNKED;
  static const char chunked_goes[] = "Chunked frames go to a file, '-', "
                                     "chunked+tcp://, chunked+unix:// or an "
                                     "http(s) URL";
  switch (t.kind) {
  case TARGET_FILE:
    if (t.arg[0] == '\0') {
      snprintf(err, errlen, "%s names no file after its format", spec);
      return -EINVAL;
    }
    return 0;
  case TARGET_PIPE:
    if (!o->write && (t.format_given ? t.format : o->format) >
                         IMAGE_FORMAT_RAW) {
      snprintf(err, errlen, "%s: an image is read from a file, not a pipe "
               "(its tables point anywhere in it)", spec);
      return -EINVAL;
    }
    return 0;
  case TARGET_NBD:
    if (o->write && image) {
      snprintf(err, errlen, "%s: an image (--dst-format %s) is written to a "
               "file or '-'; an NBD export is written raw", name,
               image_format_name(o->format));
      return -EINVAL;
    }
    if (chunked) {
      snprintf(err, errlen, "%s: %s", name, chunked_goes);
      return -EINVAL;
    }
    return 0;
  case TARGET_NULL:
    if (t.arg[0] != '\0') {
      snprintf(err, errlen, "%s: null: takes no size here (./%s names a file "
               "of that name)", spec, spec);
      return -EINVAL;
    }
    if (!o->write) {
      snprintf(err, errlen, "null: is a destination only (zero:SIZE reads "
               "as zeroes)");
      return -EINVAL;
    }
    if (image || chunked) {
      snprintf(err, errlen, "null: discards: %s",
               image ? "it takes no --dst-format" : chunked_goes);
      return -EINVAL;
    }
    return 0;
  case TARGET_MEMORY:
    snprintf(err, errlen, "%s: memory: is an export of serve, not a copy's "
             "%s (./%s names a file of that name)", spec, side, spec);
    return -EINVAL;
  case TARGET_GEN:
    if (endpoint_gen_check(spec, err, errlen) < 0)
      return -EINVAL;
    if (image) {
      snprintf(err, errlen, "%s: a generated source is raw: --src-format "
               "applies to files, pipes and NBD exports", spec);
      return -EINVAL;
    }
    return 0;
  }
  return 0;
}

int
endpoint_open(struct ep_env *env, const char *spec,
              const struct endpoint_opts *o, struct endpoint **out,
              char *err, size_t errlen)
{
  int r = endpoint_check(spec, o, err, errlen);
  if (r < 0)
    return r;
  if (http_url_is_http(spec))
    return endpoint_open_http(env, spec, o, out, err, errlen);
  if (strncmp(spec, "chunked+tcp://", 14) == 0 ||
      strncmp(spec, "chunked+unix://", 15) == 0)
    return endpoint_open_chunked_socket(env, spec, o, out, err, errlen);
  struct target t;
  target_parse(spec, !o->write && !o->as_dst, &t);
  if (o->write && o->protocol == EP_PROTO_CHUNKED)
    return chunked_file_open(env, spec, &t, o, out, err, errlen);
  switch (t.kind) {
  case TARGET_NBD:
    if (o->format > IMAGE_FORMAT_RAW)
      return nbd_image_open(env, spec, o, out, err, errlen);
    return endpoint_open_nbd(env, spec, o, out, err, errlen);
  case TARGET_NULL:
    return null_open(env, spec, o, out, err, errlen);
  case TARGET_GEN:
    return endpoint_open_gen(env, spec, out, err, errlen);
  default:
    break;
  }
  bool pipe = t.kind == TARGET_PIPE;
  enum image_format f = t.format_given ? t.format : o->format;
  if (o->write && f > IMAGE_FORMAT_RAW && !pipe &&
      endpoint_image_exists(t.arg, f))
    return endpoint_open_image_dst(env, spec, t.arg, f, out, err, errlen);
  if (o->write && f > IMAGE_FORMAT_RAW)
    return endpoint_open_image_out(env, spec, pipe ? NULL : t.arg, f, o, out,
                                   err, errlen);
  if (!o->write && !pipe) {
    r = source_open(env, spec, &t, o, out, err, errlen);
    struct stat st;
    if (r == -ENOENT && t.format_given && stat(spec, &st) == 0) {
      /* "vhd:x" read as the format and x, where a file has that name. */
      size_t k = strlen(err);
      snprintf(err + k, errlen - k, " (the prefix was taken as the format; "
               "./%s names the file)", spec);
    }
    return r;
  }
  return file_open(env, spec, t.arg, pipe, o, out, err, errlen);
}

void
endpoint_close(struct endpoint *e)
{
  if (e == NULL)
    return;
  e->ops->close(e);
  free(e);
}

/* ---- a walk over a source's extents before a copy ---- */

#define SCAN_BATCH 1024

struct scan {
  struct ep_env *env;
  struct endpoint *src;
  struct ep_op op;
  struct endpoint_extent ext[SCAN_BATCH];
  uint64_t pos;
  endpoint_scan_fn fn;
  void *arg;
  int err;
  char errmsg[128];
  bool busy;
};

static void scan_next(struct scan *s);

static void
scan_done(struct ep_op *op)
{
  struct scan *s = op->arg;
  s->busy = false;
  if (op->err == 0 && op->nextents == 0)
    op->err = EPROTO;
  if (op->err) {
    s->err = op->err;
    memcpy(s->errmsg, op->errmsg, sizeof s->errmsg);
    loop_stop(s->env->loop);
    return;
  }
  for (size_t i = 0; i < op->nextents && s->pos < s->src->size; i++) {
    uint64_t l = op->extents[i].length;
    if (l > s->src->size - s->pos)
      l = s->src->size - s->pos;
    s->fn(s->arg, s->pos, l, op->extents[i].zero);
    s->pos += l;
  }
  scan_next(s);
}

static void
scan_next(struct scan *s)
{
  if (s->pos >= s->src->size) {
    loop_stop(s->env->loop);
    return;
  }
  uint64_t len = s->src->size - s->pos;
  s->op = (struct ep_op){
    .type = EP_EXTENTS, .offset = s->pos,
    .length = len < ENDPOINT_STATUS_SPAN ? len : ENDPOINT_STATUS_SPAN,
    .extents = s->ext, .max_extents = SCAN_BATCH, .done = scan_done,
    .arg = s };
  s->busy = true;
  int r = endpoint_submit(s->src, &s->op);
  if (r < 0) {
    s->busy = false;
    s->err = -r;
    loop_stop(s->env->loop);
  }
}

static void
scan_tick(struct loop *l, void *arg)
{
  struct scan *s = arg;
  (void)l;
  ep_env_drain(s->env);
}

int
endpoint_scan(struct ep_env *env, struct endpoint *src, endpoint_scan_fn fn,
              void *arg, char *err, size_t errlen)
{
  if (!src->has_extents || !src->size_known) {
    if (src->size_known && src->size)
      fn(arg, 0, src->size, false);
    return 0;
  }
  struct scan *s = calloc(1, sizeof *s);
  if (s == NULL)
    return ep_fail(err, errlen, -ENOMEM, "%s: %s", src->name);
  *s = (struct scan){ .env = env, .src = src, .fn = fn, .arg = arg };
  loop_set_tick(env->loop, 100, scan_tick, s);
  scan_next(s);
  int r = loop_run(env->loop); /* every way out of the walk stops it */
  loop_set_tick(env->loop, 0, NULL, NULL);
  if (r == 0 && s->err)
    r = -s->err;
  if (r < 0)
    snprintf(err, errlen, "block status of %s at offset %llu: %s%s%s",
             src->name, (unsigned long long)s->pos, strerror(-r),
             s->errmsg[0] ? ": " : "", s->errmsg);
  free(s);
  return r;
}
