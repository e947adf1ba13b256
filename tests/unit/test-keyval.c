/* test-keyval.c: unit tests for src/util/keyval.{h,c}: lines of xapi's
 * service configuration files, as its service library reads them. */
#include <string.h>

#include "tap.h"
#include "util/keyval.h"

static void
kv(const char *in, const char *want_key, const char *want_value)
{
  char line[256];
  char *key = NULL, *value = NULL;
  snprintf(line, sizeof line, "%s", in);
  bool got = keyval_parse_line(line, &key, &value);
  ok(got, "\"%s\" has a key", in);
  if (!got)
    return;
  ok(strcmp(key, want_key) == 0, "\"%s\": key \"%s\" (got \"%s\")", in,
     want_key, key);
  ok(strcmp(value, want_value) == 0, "\"%s\": value \"%s\" (got \"%s\")", in,
     want_value, value);
}

static void
none(const char *in)
{
  char line[256];
  char *key = NULL, *value = NULL;
  snprintf(line, sizeof line, "%s", in);
  ok(!keyval_parse_line(line, &key, &value), "\"%s\" has no key", in);
}

int
main(void)
{
  kv("nice = 19", "nice", "19");
  kv("nice=19", "nice", "19");
  kv("  nice\t=\t19  ", "nice", "19");
  kv("encryption-mode = never # as the pool's", "encryption-mode", "never");
  kv("nice =", "nice", "");
  kv("nice =   \t", "nice", "");
  kv("k = a = b", "k", "a = b");
  kv("nice==3", "nice", "=3");
  kv("=a=1", "a", "1");
  kv("a=b c=d", "a", "b c=d");
  /* The first run of key bytes followed by '=' is the key; what comes
   * before it is skipped, as a pattern search does. */
  kv("a b = c", "b", "c");
  kv("x y z k=v", "k", "v");
  /* A comment starts at any '#', a URL's fragment too. */
  kv("dest = http://h/p#frag", "dest", "http://h/p");
  kv("k=#v", "k", "");
  /* One pair of the same quotes goes; blanks inside them stay. */
  kv("nice = \"19\"", "nice", "19");
  kv("nice = '19'", "nice", "19");
  kv("k = \" v \"", "k", " v ");
  kv("k = \"\"", "k", "");
  kv("k = \"", "k", "\"");
  kv("k = \"19'", "k", "\"19'");
  kv("k = ''x''", "k", "'x'");
  kv("k = 'v", "k", "'v");
  /* Only spaces and tabs are blanks: a CR stays. */
  kv("k = v\r", "k", "v\r");
  kv("k\r= v", "k\r", "v");
  kv("k = v w ", "k", "v w");

  none("");
  none("   \t ");
  none("# nice = 19");
  none("   # nice = 19");
  none("nice 19");
  none("= 19");
  none("==");
  none("x y z");
  none("k #= v");
  return tap_done();
}
