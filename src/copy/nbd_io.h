/* nbd_io.h: an NBD export read as the bytes of an image (see nbd_io.c). */
#ifndef NBDFLOW_COPY_NBD_IO_H
#define NBDFLOW_COPY_NBD_IO_H

#include <stddef.h>

#include "format/image.h"

/* Connects to the URI spec (TLS as its parameters say). timeout_s bounds
 * the handshake and each read (0: reads wait forever). Returns 0 with
 * *out, or -errno with a sentence in err. */
int nbd_io_open(const char *spec, unsigned timeout_s, struct image_io **out,
                char *err, size_t errlen);

#endif
