/* target.h: the one parser of TARGET strings, shared by serve, copy, info
 * and sum, so that every command reads "vhd:disk.vhd" or "null:" alike.
 * It classifies; each command refuses the kinds it does not take. */
#ifndef NBDFLOW_FORMAT_TARGET_H
#define NBDFLOW_FORMAT_TARGET_H

#include <stdbool.h>
#include <stddef.h>

#include "format/image.h"

enum target_kind {
  TARGET_FILE,   /* a path: file or block device, raw or an image */
  TARGET_NBD,    /* an NBD URI (nbd://, nbds://, nbd+unix://...) */
  TARGET_PIPE,   /* "-" (or "vhd:-"...): stdin or stdout */
  TARGET_NULL,   /* "null:" or "null:SIZE" */
  TARGET_MEMORY, /* "memory:SIZE" */
  TARGET_GEN,    /* pattern:, random:, zero:, sparse: (generated) */
};

struct target {
  enum target_kind kind;
  const char *arg;  /* the path, URI, or what follows the prefix;
                       points into the parsed string */
  /* TARGET_FILE: "vhd:PATH", "qcow2:PATH" and "raw:PATH" name the
   * format; otherwise
   * format is AUTO and format_given false. */
  enum image_format format;
  bool format_given;
};

/* Classifies spec. Generated sources are recognised only when gen is
 * true (copy and sum sources), so a file may be called "zero:x" where a
 * generated source makes no sense. Never fails: anything else is a path. */
void target_parse(const char *spec, bool gen, struct target *t);
/* A format prefix before a URI ("qcow2:nbd://h/x"): a prefix names a
 * local file, so this one would be a path that is not there. Writes
 * what to do instead into err and returns -EINVAL; else 0. */
int target_check_prefix(const struct target *t, const char *spec, char *err,
                        size_t errlen);

#endif
