/* fuzz-size.c: sizes as typed on a command line (size_parse). A size that
 * parses, printed exactly (size_format_exact), parses to itself. */
#include <string.h>

#include "fuzz.h"
#include "util/size.h"

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
  char *s = fuzz_cstr(data, size);
  uint64_t v, w;
  if (size_parse(s, &v) == 0) {
    char buf[64];
    CHECK(size_parse(size_format_exact(v, buf, sizeof buf), &w) == 0);
    CHECK(w == v);
    char human[64];
    size_format(v, human, sizeof human);
    CHECK(strnlen(human, sizeof human) < sizeof human);
  }
  free(s);
  return 0;
}
