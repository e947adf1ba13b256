/* fuzz-keyval.c: lines of xapi's service configuration files
 * (keyval_parse_line), as /etc/sparse_dd.conf brings them. A key is a
 * non-empty run of key bytes inside the line; neither it nor the value
 * holds a comment; and "KEY = VALUE" written back reads the same, when
 * the value has no blank, backslash or quote at its ends for the
 * reading to eat. */
#include <stdbool.h>

#include "fuzz.h"
#include "util/keyval.h"

/* Not a byte the reading of a value eats at either end (a backslash
 * pads the '=' as blanks do). */
static bool
plain_end(char c)
{
  return strchr(" \t\\\"'", c) == NULL;
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
  char *s = fuzz_cstr(data, size);
  size_t len = strlen(s);
  char *key, *value;
  if (keyval_parse_line(s, &key, &value)) {
    size_t klen = strlen(key), vlen = strlen(value);
    CHECK(klen > 0 && WITHIN(key, klen + 1, s, len + 1));
    CHECK(WITHIN(value, vlen + 1, s, len + 1));
    CHECK(strcspn(key, "= \t\\#") == klen);
    CHECK(strchr(value, '#') == NULL);
    if (vlen == 0 || (plain_end(value[0]) && plain_end(value[vlen - 1]))) {
      char *again = malloc(klen + vlen + 4);
      CHECK(again);
      sprintf(again, "%s = %s", key, value);
      char *k2, *v2;
      CHECK(keyval_parse_line(again, &k2, &v2));
      CHECK(strcmp(k2, key) == 0 && strcmp(v2, value) == 0);
      free(again);
    }
  }
  free(s);
  return 0;
}
