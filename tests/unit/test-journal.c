/* test-journal.c: unit tests for the checkpoint journal's text
 * (src/copy/journal.{h,c}): what is encoded decodes to itself, and any
 * damage (a changed byte, a cut, a wrong checksum) is refused. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "copy/journal.h"
#include "tap.h"

static void
sample(struct journal_rec *r)
{
  memset(r, 0, sizeof *r);
  strcpy(r->src.spec, "disk with spaces\nand a newline.img");
  r->src.size = 1ull << 40;
  r->src.file = true;
  r->src.dev = 2049;
  r->src.ino = 123456789;
  r->src.mtime_ns = 1700000000123456789ll;
  strcpy(r->dst.spec, "nbd+unix:///x?socket=/run/a b.sock");
  r->dst.size = (1ull << 40) + 4096;
  r->done = 64ull << 20;
}

static void
test_round_trip(void)
{
  struct journal_rec a, b;
  char *text = malloc(JOURNAL_TEXT_MAX), err[256];
  sample(&a);
  size_t n = journal_encode(&a, text, JOURNAL_TEXT_MAX);
  ok(n > 0 && n < JOURNAL_TEXT_MAX, "encodes (%zu bytes)", n);
  is(journal_decode(text, n, &b, err, sizeof err), 0, "decodes");
  ok(strcmp(a.src.spec, b.src.spec) == 0, "source name kept");
  ok(strcmp(a.dst.spec, b.dst.spec) == 0, "destination name kept");
  is(b.src.size, a.src.size, "source size");
  is(b.dst.size, a.dst.size, "destination size");
  ok(b.src.file && !b.dst.file, "file flags");
  is(b.src.dev, a.src.dev, "device");
  is(b.src.ino, a.src.ino, "inode");
  is(b.src.mtime_ns, a.src.mtime_ns, "mtime");
  is(b.done, a.done, "done");

  /* Every single-byte change and every cut is refused. */
  unsigned bad = 0;
  for (size_t i = 0; i < n; i++) {
    char keep = text[i];
    text[i] = (char)(keep ^ 0x01);
    if (journal_decode(text, n, &b, err, sizeof err) == -EINVAL)
      bad++;
    text[i] = keep;
  }
  is(bad, n, "each of %zu flipped bytes is refused", n);
  bad = 0;
  for (size_t k = 0; k < n; k++)
    if (journal_decode(text, k, &b, err, sizeof err) == -EINVAL)
      bad++;
  is(bad, n, "each of %zu cuts is refused", n);
  free(text);
}

static void
test_refusals(void)
{
  struct journal_rec a, b;
  char *text = malloc(JOURNAL_TEXT_MAX), err[256];
  sample(&a);
  a.done = a.src.size + 1;
  size_t n = journal_encode(&a, text, JOURNAL_TEXT_MAX);
  is(journal_decode(text, n, &b, err, sizeof err), -EINVAL,
     "done beyond the source is refused: %s", err);
  const char *junk = "hello\n";
  is(journal_decode(junk, strlen(junk), &b, err, sizeof err), -EINVAL,
     "another file is refused: %s", err);
  free(text);
}

int
main(void)
{
  test_round_trip();
  test_refusals();
  return tap_done();
}
