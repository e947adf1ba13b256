/* test-size.c: unit tests for src/util/size.{h,c}. */
#include <errno.h>
#include <string.h>

#include "tap.h"
#include "util/size.h"

static void
parses(const char *s, uint64_t want)
{
  uint64_t v = 0xdeadbeef;
  int rc = size_parse(s, &v);
  is(rc, 0, "\"%s\" parses", s);
  is(v, want, "\"%s\" is %llu", s, (unsigned long long)want);
}

static void
refused(const char *s, int err)
{
  uint64_t v = 0x5a5a5a5a;
  int rc = size_parse(s, &v);
  is((int64_t)rc, (int64_t)-err, "\"%s\" refused with %s", s,
     err == EINVAL ? "EINVAL" : "ERANGE");
  is(v, 0x5a5a5a5a, "\"%s\": output untouched on error", s);
}

static void
test_parse(void)
{
  parses("0", 0);
  parses("1", 1);
  parses("4096", 4096);
  parses("512M", UINT64_C(512) << 20);
  parses("10G", UINT64_C(10) << 30);
  parses("1k", 1024);
  parses("1K", 1024);
  parses("1m", UINT64_C(1) << 20);
  parses("3T", UINT64_C(3) << 40);
  parses("2P", UINT64_C(2) << 50);
  parses("1E", UINT64_C(1) << 60);
  parses("1GiB", UINT64_C(1) << 30);
  parses("1GB", UINT64_C(1) << 30);
  parses("1kb", 1024); /* either case, the B and iB too */
  parses("1gib", UINT64_C(1) << 30);
  parses("1MIB", UINT64_C(1) << 20);
  parses("1Mb", UINT64_C(1) << 20);
  parses("007", 7);
  parses("0G", 0);
  parses("18446744073709551615", UINT64_MAX);
  parses("15E", UINT64_C(15) << 60);
  parses("16777215T", (UINT64_C(16777215) << 40));

  /* Junk. */
  refused("", EINVAL);
  refused("G", EINVAL);
  refused("-1", EINVAL);
  refused("+1", EINVAL);
  refused(" 1", EINVAL);
  refused("1 ", EINVAL);
  refused("1X", EINVAL);
  refused("1GX", EINVAL);
  refused("1Gi", EINVAL);
  refused("1GiBB", EINVAL);
  refused("1.5G", EINVAL);
  refused("0x10", EINVAL);
  refused("1KM", EINVAL);

  /* Overflow of the number itself and of the shift. */
  refused("18446744073709551616", ERANGE);
  refused("99999999999999999999", ERANGE);
  refused("184467440737095516150", ERANGE);
  refused("16E", ERANGE);
  refused("16777216T", ERANGE);
  refused("17179869184G", ERANGE);
  refused("18446744073709551615K", ERANGE);
}

static void
formats(uint64_t n, const char *want)
{
  char buf[32];
  memset(buf, 'z', sizeof buf);
  char *r = size_format(n, buf, sizeof buf);
  ok(r == buf, "size_format returns its buffer");
  ok(strcmp(buf, want) == 0, "%llu formats as \"%s\" (got \"%s\")",
     (unsigned long long)n, want, buf);
}

static void
test_format(void)
{
  formats(0, "0 B");
  formats(1, "1 B");
  formats(1023, "1023 B");
  formats(1024, "1.0 KiB");
  formats(1536, "1.5 KiB");
  formats(UINT64_C(1) << 20, "1.0 MiB");
  formats(UINT64_C(3) << 29, "1.5 GiB");
  formats(UINT64_C(2) << 40, "2.0 TiB");
  formats(UINT64_C(1) << 50, "1.0 PiB");
  formats(UINT64_C(1) << 60, "1.0 EiB");
  formats(UINT64_MAX, "16.0 EiB");

  /* Truncation: a short buffer still gets a terminated string. */
  char small[4];
  memset(small, 'z', sizeof small);
  size_format(UINT64_C(3) << 29, small, sizeof small);
  ok(memchr(small, '\0', sizeof small) != NULL,
     "short buffer is NUL-terminated");
  ok(strncmp(small, "1.5", 3) == 0, "short buffer holds the prefix");
}

static void
test_round_trip(void)
{
  /* Every unit suffix parsed gives what the power says; and formatting
   * whole multiples names the same unit. */
  static const char *const units[] = { "K", "M", "G", "T", "P", "E" };
  static const char *const names[] = { "KiB", "MiB", "GiB", "TiB", "PiB",
                                       "EiB" };
  for (unsigned i = 0; i < 6; i++) {
    char in[16], want[16], buf[32];
    uint64_t v;
    snprintf(in, sizeof in, "7%s", units[i]);
    is(size_parse(in, &v), 0, "\"%s\" parses", in);
    is(v, UINT64_C(7) << (10 * (i + 1)), "\"%s\" value", in);
    snprintf(want, sizeof want, "7.0 %s", names[i]);
    size_format(v, buf, sizeof buf);
    ok(strcmp(buf, want) == 0, "\"%s\" formats back as \"%s\" (got \"%s\")",
       in, want, buf);
  }
}

static void
test_format_exact(void)
{
  /* nbdinfo's export-size-str: the largest whole unit, else bytes. */
  static const struct {
    uint64_t n;
    const char *want;
  } cases[] = {
    { 0, "0" },
    { 513, "513" },
    { 1000000, "1000000" },
    { 1024, "1K" },
    { 1572864, "1536K" },
    { UINT64_C(100) << 20, "100M" },
    { (UINT64_C(1) << 30) + 1, "1073741825" },
    { UINT64_C(32) << 30, "32G" },
    { UINT64_C(3) << 40, "3T" },
    { UINT64_C(1) << 60, "1E" },
    { UINT64_C(1) << 63, "8E" },
    { UINT64_MAX, "18446744073709551615" },
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char buf[32];
    char *r = size_format_exact(cases[i].n, buf, sizeof buf);
    ok(r == buf && strcmp(buf, cases[i].want) == 0,
       "exact %llu is \"%s\" (got \"%s\")", (unsigned long long)cases[i].n,
       cases[i].want, buf);
  }
}

/* count_parse: digits alone, at most max. */
static void
test_count(void)
{
  static const struct {
    const char *in;
    uint64_t max;
    int rc;
    uint64_t want;
  } cases[] = {
    { "0", 8, 0, 0 },       { "8", 8, 0, 8 },
    { "9", 8, -ERANGE, 0 }, { "10", 8, -ERANGE, 0 },
    { "65536", 65536, 0, 65536 }, { "65537", 65536, -ERANGE, 0 },
    { "18446744073709551615", UINT64_MAX, 0, UINT64_MAX },
    { "18446744073709551616", UINT64_MAX, -ERANGE, 0 },
    { "", 8, -EINVAL, 0 },  { "1K", 65536, -EINVAL, 0 },
    { " 3", 8, -EINVAL, 0 }, { "+3", 8, -EINVAL, 0 },
    { "-0", 8, -EINVAL, 0 }, { "3 ", 8, -EINVAL, 0 },
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    uint64_t v = 77;
    int rc = count_parse(cases[i].in, cases[i].max, &v);
    is((int64_t)rc, (int64_t)cases[i].rc, "count \"%s\" (max %llu): %d",
       cases[i].in, (unsigned long long)cases[i].max, cases[i].rc);
    is(v, rc == 0 ? cases[i].want : 77, "count \"%s\": value",
       cases[i].in);
  }
}

int
main(void)
{
  test_parse();
  test_count();
  test_format();
  test_format_exact();
  test_round_trip();
  return tap_done();
}
