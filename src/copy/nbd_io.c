/* nbd_io.c: an image_io (format/image.h) over one NBD connection, so that
 * an image that an NBD export holds as raw bytes (a VHD on a server that
 * knows nothing of VHD) is read through the format layer: the copy's
 * source, or sum's, with --src-format. The format layer wants a
 * synchronous, thread-safe pread: one request at a time under a lock,
 * which costs the pipelining of a raw NBD source; a data block is still
 * read in requests of up to the export's maximum. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client/client.h"
#include "copy/endpoint.h"
#include "copy/nbd_io.h"

struct nbd_io {
  struct image_io io;
  pthread_mutex_t lock;   /* one request at a time on c */
  struct client_conn c;
  struct nbd_uri uri;
  struct tls_creds *tls;
  int timeout_ms;
};

/* READs of [off, off + len) into buf, in pieces of the export's maximum;
 * under n->lock. */
static int
nbd_io_read(struct nbd_io *n, uint8_t *buf, uint64_t len, uint64_t off)
{
  uint64_t max = client_max_payload(&n->c);
  int r = 0;
  while (len > 0 && r == 0) {
    uint64_t piece = len < max ? len : max;
    struct client_req q = { .type = NBD_CMD_READ, .offset = off,
                            .length = piece, .buf = buf };
    r = client_run(&n->c, &q, n->timeout_ms);
    buf += piece;
    off += piece;
    len -= piece;
  }
  return r;
}

static int
nbd_io_pread(struct image_io *io, void *buf, size_t len, uint64_t off)
{
  struct nbd_io *n = io->priv;
  if (off > io->size || len > io->size - off)
    return -EIO;
  /* The format reads footers, headers and table entries at any byte; a
   * server with a minimum block size takes only whole blocks, so those
   * are read whole into a bounce buffer (the size is a multiple of the
   * minimum: the handshake checked it). */
  uint64_t mb = n->c.info.min_block > 1 ? n->c.info.min_block : 1;
  uint64_t a = off / mb * mb, b = (off + len + mb - 1) / mb * mb;
  int r;
  pthread_mutex_lock(&n->lock);
  if (a == off && b == off + len) {
    r = nbd_io_read(n, buf, len, off);
  } else {
    uint8_t *bounce = malloc(b - a);
    r = bounce ? nbd_io_read(n, bounce, b - a, a) : -ENOMEM;
    if (r == 0)
      memcpy(buf, bounce + (off - a), len);
    free(bounce);
  }
  pthread_mutex_unlock(&n->lock);
  return r;
}

static void
nbd_io_close(struct image_io *io)
{
  struct nbd_io *n = io->priv;
  client_close(&n->c);
  tls_creds_free(n->tls);
  uri_free(&n->uri);
  pthread_mutex_destroy(&n->lock);
  free(n);
}

int
nbd_io_open(const char *spec, unsigned timeout_s, struct image_io **out,
            char *err, size_t errlen)
{
  struct nbd_io *n = calloc(1, sizeof *n);
  if (n == NULL) {
    snprintf(err, errlen, "%s: out of memory", spec);
    return -ENOMEM;
  }
  int r = uri_parse(spec, &n->uri, err, errlen);
  if (r < 0) {
    free(n);
    return r;
  }
  r = client_tls_load(&n->uri, &n->tls, err, errlen);
  if (r < 0) {
    uri_free(&n->uri);
    free(n);
    return r;
  }
  n->timeout_ms = timeout_s ? (int)timeout_s * 1000 : -1;
  struct client_opts co = { .export_name = n->uri.export_name,
                            .want_structured = true,
                            .want_extended = true,
                            .timeout_ms = client_handshake_ms(timeout_s),
                            .tls_creds = n->tls };
  r = client_connect(&n->c, &n->uri, &co);
  if (r == 0 && n->c.info.min_block > 1 &&
      n->c.info.size % n->c.info.min_block) {
    uint64_t size = n->c.info.size;
    uint32_t mb = n->c.info.min_block;
    client_close(&n->c);
    snprintf(n->c.errmsg, sizeof n->c.errmsg, "export size %llu is not a "
             "multiple of its minimum block size %u",
             (unsigned long long)size, mb);
    r = -EINVAL;
  }
  if (r < 0) {
    snprintf(err, errlen, "%s: %s", spec, n->c.errmsg);
    tls_creds_free(n->tls);
    uri_free(&n->uri);
    free(n);
    return r;
  }
  pthread_mutex_init(&n->lock, NULL);
  n->io = (struct image_io){ .size = n->c.info.size, .pread = nbd_io_pread,
                             .close = nbd_io_close, .priv = n };
  *out = &n->io;
  return 0;
}
