/* test-keyval.c: unit tests for src/util/keyval.{h,c}: lines of xapi's
 * service configuration files, as its service library reads them, and
 * the reading of such files (in a directory of its own under $TMPDIR). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

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

/* What the readers passed to keyval_fn, one "LINE:KEY=VALUE;" each. */
struct seen {
  char text[256];
};

static int
record(void *arg, const char *file, unsigned line, const char *key,
       const char *value)
{
  struct seen *s = arg;
  size_t n = strlen(s->text);
  (void)file;
  snprintf(s->text + n, sizeof s->text - n, "%u:%s=%s;", line, key, value);
  return 0;
}

/* Writes len bytes of data into dir/name; the path into path. */
static int
write_file(const char *dir, const char *name, const char *data, size_t len,
           char *path, size_t pathlen)
{
  snprintf(path, pathlen, "%s/%s", dir, name);
  FILE *f = fopen(path, "we");
  if (f == NULL)
    return -1;
  size_t put = fwrite(data, 1, len, f);
  return fclose(f) == 0 && put == len ? 0 : -1;
}

static void
files(const char *dir)
{
  char path[512];
  /* A NUL byte skips its line, said, and the lines around it are read. */
  static const char nul[] = "a = 1\nb\0x = 2\nc = \0\nd = 4\n";
  int w = write_file(dir, "nul.conf", nul, sizeof nul - 1, path, sizeof path);
  if (!ok(w == 0, "wrote %s", path))
    return;
  struct seen s = { "" };
  is(keyval_read_file(path, record, &s), 0,
     "a line with a NUL byte is no error");
  ok(strcmp(s.text, "1:a=1;4:d=4;") == 0,
     "lines 2 and 3 (NUL bytes) skipped: got \"%s\"", s.text);
  unlink(path);
}

static void
dirs(const char *dir)
{
  char sub[300], path[512];
  snprintf(sub, sizeof sub, "%s/FILE.d", dir);
  if (!ok(mkdir(sub, 0700) == 0, "made %s", sub))
    return;
  /* An empty directory: nothing to sort, nothing read. */
  struct seen s = { "" };
  is(keyval_read_dir(sub, record, &s), 0, "an empty directory is no error");
  ok(s.text[0] == '\0', "an empty directory: no key (got \"%s\")", s.text);
  /* Files are read in the byte order of their names. */
  int w = write_file(sub, "b", "k = 2\n", 6, path, sizeof path);
  w |= write_file(sub, "a", "k = 1\n", 6, path, sizeof path);
  w |= write_file(sub, "B", "k = 0\n", 6, path, sizeof path);
  if (ok(w == 0, "wrote three files in %s", sub)) {
    is(keyval_read_dir(sub, record, &s), 0, "a directory of three files");
    ok(strcmp(s.text, "1:k=0;1:k=1;1:k=2;") == 0,
       "read B, a, b in that order: got \"%s\"", s.text);
  }
  static const char *const names[] = { "a", "b", "B" };
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
    snprintf(path, sizeof path, "%s/%s", sub, names[i]);
    unlink(path);
  }
  rmdir(sub);
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
  /* The pattern's brackets hold a backslash (no escapes there in Emacs
   * syntax): it pads the '=' as blanks do, and no key holds one. */
  kv("k = \\v", "k", "v");
  kv("k =\\\\ \\v", "k", "v");
  kv("k\\ = v", "k", "v");
  kv("k\\=v", "k", "v");
  kv("\\k = v", "k", "v");
  kv("a\\b = c", "b", "c");
  kv("k = \\", "k", "");
  kv("k = a\\b\\", "k", "a\\b\\");
  kv("k = \\\"v\"", "k", "v");

  none("");
  none("   \t ");
  none("# nice = 19");
  none("   # nice = 19");
  none("nice 19");
  none("= 19");
  none("==");
  none("x y z");
  none("k #= v");
  none("\\ = v");
  none("k \\ v");

  const char *tmp = getenv("TMPDIR");
  char dir[256];
  int n = snprintf(dir, sizeof dir, "%s/test-keyval.XXXXXX",
                   tmp && *tmp ? tmp : "/tmp");
  if (n < 0 || (size_t)n >= sizeof dir) /* a TMPDIR too long for paths */
    snprintf(dir, sizeof dir, "/tmp/test-keyval.XXXXXX");
  if (ok(mkdtemp(dir) != NULL, "made a directory under $TMPDIR")) {
    files(dir);
    dirs(dir);
    rmdir(dir);
  }
  return tap_done();
}
