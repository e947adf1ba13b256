/* target.c: see target.h. */
#include "format/target.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "proto/nbd_uri.h"

static bool
has_prefix(const char *s, const char *p)
{
  return strncmp(s, p, strlen(p)) == 0;
}

void
target_parse(const char *spec, bool gen, struct target *t)
{
  static const char *const gens[] = { "pattern:", "random:", "zero:",
                                      "sparse:" };
  *t = (struct target){ .kind = TARGET_FILE, .arg = spec,
                        .format = IMAGE_FORMAT_AUTO };
  if (uri_is_uri(spec)) {
    t->kind = TARGET_NBD;
  } else if (strcmp(spec, "-") == 0) {
    t->kind = TARGET_PIPE;
  } else if (has_prefix(spec, "null:")) {
    t->kind = TARGET_NULL;
    t->arg = spec + 5;
  } else if (has_prefix(spec, "memory:")) {
    t->kind = TARGET_MEMORY;
    t->arg = spec + 7;
  } else if (has_prefix(spec, "vhd:")) {
    t->arg = spec + 4;
    t->format = IMAGE_FORMAT_VHD;
    t->format_given = true;
  } else if (has_prefix(spec, "qcow2:")) {
    t->arg = spec + 6;
    t->format = IMAGE_FORMAT_QCOW2;
    t->format_given = true;
  } else if (has_prefix(spec, "raw:")) {
    t->arg = spec + 4;
    t->format = IMAGE_FORMAT_RAW;
    t->format_given = true;
  } else if (gen) {
    for (size_t i = 0; i < sizeof gens / sizeof gens[0]; i++)
      if (has_prefix(spec, gens[i]))
        t->kind = TARGET_GEN;
  }
  if (t->format_given && strcmp(t->arg, "-") == 0)
    t->kind = TARGET_PIPE; /* "vhd:-": stdin or stdout, as "-" is */
}

int
target_check_prefix(const struct target *t, const char *spec, char *err,
                    size_t errlen)
{
  if (t->kind != TARGET_FILE || !t->format_given || !uri_is_uri(t->arg))
    return 0;
  snprintf(err, errlen, "%s: a format prefix names a local file, not a "
           "URI; over NBD the format is an option (copy --src-format FMT, "
           "info and sum -f FMT)", spec);
  return -EINVAL;
}
