/* cmd_sparse_dd.c: xapi's sparse_dd command line, run as a copy.
 *
 * xapi starts sparse_dd for storage migration and VDI copies as
 *   sparse_dd -machine -src SRC -dest DEST -size BYTES [-prezeroed]
 *     [-base BASE] [-dest-proto nbd|chunked|none] [-nbd-export NAME]
 *     [-good-ciphersuites S] [-legacy-ciphersuites S] [-ssl-legacy]
 *     [-encryption-mode always|never|user] [-nice N] [-ionice_class C
 *     [-ionice_class_data N]] [-unbuffered BOOL]
 * and reads its progress from stdout: with -machine, Chunked frames whose
 * payload is "Progress: N", closed by the end header once the copy
 * succeeded or ended with status 5 (any other failure leaves the stream
 * without it). Exit status 5 says that the NBD server answered with an
 * error; any other failure is 1 (usage errors 2).
 *
 * As xapi's sparse_dd, it then reads /etc/sparse_dd.conf and the files of
 * /etc/sparse_dd.conf.d (xapi's service library's format: util/keyval.h),
 * whose keys are its options' names and set them over the command line's.
 *
 * Each option becomes the copy option that does the same (docs/copy.md
 * has the table); the progress comes from copy's --progress=FD lines
 * ("N/100") through a pipe, turned into frames by a thread. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "cli/cmd.h"
#include "proto/chunked.h"
#include "util/keyval.h"
#include "util/ocaml_int.h"
#include "util/size.h"
#include "util/uri.h"

#define SPARSE_DD_NBD_ERROR 5

static void
sparse_dd_usage(FILE *f)
{
  fprintf(f,
"Usage: nbdflow sparse_dd -src SRC -dest DEST -size BYTES [-machine]\n"
"         [-progress] [-prezeroed] [-base BASE]\n"
"         [-dest-proto nbd|chunked|none]\n"
"         [-nbd-export NAME] [-encryption-mode always|never|user]\n"
"         [-good-ciphersuites S] [-legacy-ciphersuites S] [-ssl-legacy]\n"
"         [-verify-dest [-cert-bundle-path FILE]] [-sni NAME]\n"
"         [-nice N] [-ionice_class C [-ionice_class_data N]]\n"
"         [-unbuffered true|false]\n"
"\n"
"xapi's sparse_dd command line, run as 'nbdflow copy':\n"
"  -src SRC            a file, block device or NBD URI\n"
"  -dest DEST          a file (or file:///PATH), an NBD URI, or an http(s)\n"
"                      URL (a PUT, then NBD or Chunked as the answer says)\n"
"  -size BYTES         the destination's size: the source may not be\n"
"                      larger (copy --dst-size); as xapi's sparse_dd reads\n"
"                      it (OCaml's Int64.of_string: 4096, 0x1000, 0o10_000),\n"
"                      or with a unit (8M); negative or 2^63 and more\n"
"                      refused\n"
"  -prezeroed          the destination reads as zeroes: skip zero ranges\n"
"                      (copy --target-is-zero)\n"
"  -dest-proto P       nbd or chunked (copy --dst-protocol); none: the raw\n"
"                      bytes, into a file only\n"
"  -nbd-export NAME    the export an http(s) destination's NBD session asks\n"
"                      for (an NBD URI names its own)\n"
"  -encryption-mode M  always: http becomes https; never: https becomes\n"
"                      http; user (the default): as written\n"
"  -machine            progress on stdout as Chunked frames 'Progress: N',\n"
"                      then the end header if the copy succeeded (or ends\n"
"                      with status 5)\n"
"  -progress           without -machine: the percentage on stderr even when\n"
"                      it is not a terminal\n"
"  -good-ciphersuites S OpenSSL suites, as the GnuTLS priority offering\n"
"                      their AEAD ciphers (copy --tls-priority; see\n"
"                      docs/sparse_dd.md)\n"
"  -legacy-ciphersuites S, -ssl-legacy: accepted; TLS 1.0/1.1 and CBC\n"
"                      suites are never offered\n"
"  -base BASE          the destination holds BASE: send only the blocks\n"
"                      where SRC differs (copy --base)\n"
"  -verify-dest        https: check the server certificate's chain (not\n"
"                      its name), against -cert-bundle-path FILE (PEM) or\n"
"                      the system's CAs; without it, nothing is checked,\n"
"                      as xapi's sparse_dd does\n"
"  -sni NAME           https: the server name sent\n"
"  -nice N             the whole copy's CPU priority (-20 to 19, as nice)\n"
"  -ionice_class C     its I/O class (as ionice -c: 0 none, 1 realtime,\n"
"                      2 best-effort, 3 idle), with -ionice_class_data N\n"
"                      (0 to 7) for classes 1 and 2; as xapi's sparse_dd,\n"
"                      a value that is not a number is ignored with a\n"
"                      message, and one out of range is clipped\n"
"  -unbuffered BOOL    accepted (true or false): files are read through\n"
"                      the page cache (true is said not to be honoured)\n"
"  -experimental-reads-bypass-tapdisk, -experimental-writes-bypass-tapdisk\n"
"                      refused: SRC and DEST are used as given\n"
"  -help, --help       show this help\n"
"\n"
"Without -verify-dest, $NBDFLOW_TLS_CERTIFICATES (a directory holding\n"
"ca-cert.pem) asks for the whole check of an https server, name too.\n"
"\n"
"As xapi's sparse_dd, once the command line is read, /etc/sparse_dd.conf\n"
"and then each file of /etc/sparse_dd.conf.d (in name order) set options\n"
"over it, one 'NAME = VALUE' a line, NAME a setting of xapi's sparse_dd:\n"
"an option above without its dash (nice = 19, encryption-mode = never;\n"
"for a flag, true or false), but for -progress, -legacy-ciphersuites and\n"
"-ssl-legacy, which only the command line takes.\n"
"A missing file is no configuration; an unknown key is skipped; a bad\n"
"size, boolean or encryption mode there fails with status 1.\n"
"$NBDFLOW_SPARSE_DD_CONF names another FILE (and FILE.d); set but empty,\n"
"no configuration is read. See docs/sparse_dd.md.\n"
"\n"
"Exit status: 0 copied; 5 the NBD server answered with an error; 2 usage\n"
"error; 1 any other failure.\n");
}

/* A priority as given: its value (NULL: not given), and where: "" on
 * the command line, "FILE:LINE: " in the configuration. Messages about
 * it start with where, then name it as given there: -nice, or nice. */
struct sparse_dd_given {
  const char *v;
  const char *from;
};

#define SPARSE_DD_GIVEN_FMT "%s%s%s"
#define SPARSE_DD_GIVEN_ARGS(g, name)                                        \
  (g)->from, *(g)->from ? "" : "-", (name)

/* A -nice or -ionice_class[_data] value, read as OCaml's int_of_string
 * reads it (xapi's sparse_dd does), into OCaml's 63-bit int
 * (ocaml_int_parse). False after a message for anything else, as xapi's
 * sparse_dd ignores such a value and copies all the same (its
 * configuration supplies them). Not given: false, no message. */
static bool
sparse_dd_int(const struct sparse_dd_given *g, const char *name,
              long long *out)
{
  if (g->v == NULL)
    return false;
  int64_t v;
  if (ocaml_int_parse(g->v, OCAML_INT_BITS, &v) < 0) {
    log_error("%signoring %s%s '%.100s': not a number",
              SPARSE_DD_GIVEN_ARGS(g, name), g->v);
    return false;
  }
  *out = v;
  return true;
}

static int
sparse_dd_clip(const struct sparse_dd_given *g, const char *name,
               long long v, int lo, int hi)
{
  if (v >= lo && v <= hi)
    return (int)v;
  int c = v < lo ? lo : hi;
  log_warn(SPARSE_DD_GIVEN_FMT " %.100s is out of range (%d to %d): using %d",
           SPARSE_DD_GIVEN_ARGS(g, name), g->v, lo, hi, c);
  return c;
}

/* A -size, as xapi's sparse_dd reads it (OCaml's Int64.of_string: 4096,
 * 0x1000, 0o10_000, 0u4096...), or a decimal number with a unit (8M),
 * which nbdflow takes too. A negative one (0xffffffffffffffff is -1
 * there; one below Int64's range is said to be negative too) or one
 * beyond 2^63 - 1 is refused. 0, or -1 with the reason in why, where
 * (the option) first. */
static int
sparse_dd_size(const char *where, const char *s, uint64_t *out, char *why,
               size_t whylen)
{
  int64_t v;
  uint64_t u;
  int rc = ocaml_int_parse(s, OCAML_INT64_BITS, &v);
  if (rc == 0 && v < 0) {
    char dec[24];
    snprintf(dec, sizeof dec, "%lld", (long long)v);
    snprintf(why, whylen, "%s '%.100s' is negative%s%s%s", where, s,
             strcmp(dec, s) ? " (" : "", strcmp(dec, s) ? dec : "",
             strcmp(dec, s) ? " as xapi's sparse_dd reads it)" : "");
    return -1;
  }
  if (rc == 0) {
    *out = (uint64_t)v;
    return 0;
  }
  if (rc == -EINVAL)
    rc = size_parse(s, &u);
  if (rc == 0 && u > INT64_MAX)
    rc = -ERANGE;
  if (rc == -ERANGE) {
    /* Only OCaml's forms reach here with a sign: size_parse takes none. */
    if (s[0] == '-')
      snprintf(why, whylen, "%s '%.100s' is negative, and out of Int64's "
               "range", where, s);
    else
      snprintf(why, whylen, "%s '%.100s' is more than 2^63 - 1 bytes",
               where, s);
    return -1;
  }
  if (rc < 0) {
    snprintf(why, whylen, "%s: a number of bytes, not '%.100s'", where, s);
    return -1;
  }
  *out = u;
  return 0;
}

#define SPARSE_DD_IOPRIO_SHIFT 13 /* the kernel's IOPRIO_CLASS_SHIFT */
#define SPARSE_DD_IOPRIO_WHO_PROCESS 1
#define SPARSE_DD_IOPRIO_DATA 4 /* ionice's level when none is given */

/* Sets the CPU and I/O priority of this thread, before any other starts:
 * the threads the copy starts inherit both. A refusal (raising the
 * priority needs CAP_SYS_NICE) is said and the copy goes on, as in
 * xapi's sparse_dd, which runs renice and ionice and ignores them. */
static void
sparse_dd_priorities(const struct sparse_dd_given *nice,
                     const struct sparse_dd_given *ioclass,
                     const struct sparse_dd_given *iodata)
{
  long long n = 0, c = 0, d = 0;
  if (sparse_dd_int(nice, "nice", &n)) {
    int v = sparse_dd_clip(nice, "nice", n, -20, 19);
    if (setpriority(PRIO_PROCESS, 0, v) < 0)
      log_warn(SPARSE_DD_GIVEN_FMT " %d: %s",
               SPARSE_DD_GIVEN_ARGS(nice, "nice"), v, strerror(errno));
  }
  /* Read (and a bad one said) whatever the class, as the original. */
  bool has_data = sparse_dd_int(iodata, "ionice_class_data", &d);
  if (!sparse_dd_int(ioclass, "ionice_class", &c))
    return;
  if (c < 0 || c > 3) {
    log_error("%signoring %s%s %.100s: the classes are 0 to 3",
              SPARSE_DD_GIVEN_ARGS(ioclass, "ionice_class"), ioclass->v);
    return;
  }
  int prio = (int)c << SPARSE_DD_IOPRIO_SHIFT;
  if (c == 1 || c == 2)
    prio |= has_data ? sparse_dd_clip(iodata, "ionice_class_data", d, 0, 7)
                     : SPARSE_DD_IOPRIO_DATA;
  if (syscall(SYS_ioprio_set, SPARSE_DD_IOPRIO_WHO_PROCESS, 0, prio) < 0)
    log_warn(SPARSE_DD_GIVEN_FMT " %d: %s",
             SPARSE_DD_GIVEN_ARGS(ioclass, "ionice_class"), (int)c,
             strerror(errno));
}

/* Checks a value where it is taken, so that a bad one is said with its
 * place: place is "-NAME" on the command line, "FILE:LINE: NAME" in the
 * configuration. 0, or -1 with the reason in why. */
typedef int (*sparse_dd_check_fn)(const char *place, const char *v,
                                  char *why, size_t whylen);

static int
sparse_dd_check_size(const char *place, const char *v, char *why,
                     size_t whylen)
{
  uint64_t size;
  return sparse_dd_size(place, v, &size, why, whylen);
}

static int
sparse_dd_check_mode(const char *place, const char *v, char *why,
                     size_t whylen)
{
  if (strcmp(v, "always") == 0 || strcmp(v, "never") == 0 ||
      strcmp(v, "user") == 0)
    return 0;
  snprintf(why, whylen, "%s: always, never or user, not '%.100s'", place, v);
  return -1;
}

/* What an option takes: the same on the command line (-NAME) and in the
 * configuration (NAME = ...), but for a flag. */
enum sparse_dd_kind {
  SPARSE_DD_VALUE, /* -NAME VALUE; NAME = VALUE */
  SPARSE_DD_BOOL,  /* -NAME true|false; NAME = true|false */
  SPARSE_DD_FLAG,  /* -NAME; NAME = true|false (false clears it) */
};

/* A second -NAME is refused: the option names what is copied. */
#define SPARSE_DD_ONCE    0x1u
/* The command line's only: nbdflow's own, or older xapi's. */
#define SPARSE_DD_ARGV    0x2u
/* The configuration's only: a setting of xapi's service library. */
#define SPARSE_DD_CONF    0x4u
/* -NAME is a usage error; NAME = true is said and not honoured. */
#define SPARSE_DD_REFUSED 0x8u

/* An option of xapi's sparse_dd, each of which is also a key of its
 * configuration, or one of nbdflow's. */
struct sparse_dd_opt {
  const char *name; /* without the '-' */
  enum sparse_dd_kind kind;
  unsigned flags;
  const char **value; /* VALUE, BOOL: where it goes; NULL: not used */
  bool *flag;         /* FLAG, BOOL: set or cleared; NULL: not used */
  const char **from;  /* VALUE: where it was given, as in sparse_dd_given */
  sparse_dd_check_fn check;
  /* What nbdflow does instead of what the option asks, said when it is
   * given (a BOOL or FLAG: as true); NULL: it does what is asked. */
  const char *instead;
};

/* What the command line and then the configuration set: the places the
 * options' table points to. Strings point into argv or into the kept
 * copies of configuration values (struct sparse_dd_kept). */
struct sparse_dd_settings {
  const char *src, *dest, *size, *base;
  const char *proto;        /* -dest-proto; NULL: as DEST says */
  const char *export_name;  /* -nbd-export */
  const char *mode;         /* -encryption-mode */
  const char *good;         /* -good-ciphersuites */
  const char *bundle, *sni; /* -cert-bundle-path, -sni */
  struct sparse_dd_given nice, ioclass, iodata;
  const char *conf_dir; /* the configuration's config-dir */
  bool machine, prezeroed, verify_dest;
  bool progress_bar; /* -progress */
};

#define SPARSE_DD_SETTINGS_INIT                                              \
  {                                                                          \
    .mode = "user", .nice = { NULL, "" }, .ioclass = { NULL, "" },           \
    .iodata = { NULL, "" },                                                  \
  }

/* Configuration read once at start-up, as the command runs once a
 * process; cmd_sparse_dd resets these settings when it is done. */
static struct sparse_dd_settings sparse_dd_set = SPARSE_DD_SETTINGS_INIT;

/* What SRC and DEST are, for the experimental bypass options. */
#define SPARSE_DD_AS_GIVEN                                                   \
  "SRC and DEST are read and written as given (vhd:PATH reads a VHD "      \
  "file's disk)"
/* What nbdflow does with the logging settings of xapi's services. */
#define SPARSE_DD_STDERR "nbdflow's messages go to stderr, as they are"

/* Every option and key, and its place in sparse_dd_set. */
static const struct sparse_dd_opt sparse_dd_opts[] = {
  { "src", SPARSE_DD_VALUE, SPARSE_DD_ONCE, &sparse_dd_set.src },
  { "dest", SPARSE_DD_VALUE, SPARSE_DD_ONCE, &sparse_dd_set.dest },
  { "size", SPARSE_DD_VALUE, SPARSE_DD_ONCE, &sparse_dd_set.size,
    .check = sparse_dd_check_size },
  { "base", SPARSE_DD_VALUE, SPARSE_DD_ONCE, &sparse_dd_set.base },
  { "dest-proto", SPARSE_DD_VALUE, 0, &sparse_dd_set.proto },
  { "nbd-export", SPARSE_DD_VALUE, 0, &sparse_dd_set.export_name },
  { "encryption-mode", SPARSE_DD_VALUE, 0, &sparse_dd_set.mode,
    .check = sparse_dd_check_mode },
  { "good-ciphersuites", SPARSE_DD_VALUE, 0, &sparse_dd_set.good },
  { "cert-bundle-path", SPARSE_DD_VALUE, 0, &sparse_dd_set.bundle },
  { "sni", SPARSE_DD_VALUE, 0, &sparse_dd_set.sni },
  { "nice", SPARSE_DD_VALUE, 0, &sparse_dd_set.nice.v,
    .from = &sparse_dd_set.nice.from },
  { "ionice_class", SPARSE_DD_VALUE, 0, &sparse_dd_set.ioclass.v,
    .from = &sparse_dd_set.ioclass.from },
  { "ionice_class_data", SPARSE_DD_VALUE, 0, &sparse_dd_set.iodata.v,
    .from = &sparse_dd_set.iodata.from },
  /* O_DIRECT in xapi's sparse_dd, which is its default. */
  { "unbuffered", SPARSE_DD_BOOL, 0,
    .instead = "files are read through the page cache, never with "
               "O_DIRECT" },
  { "machine", SPARSE_DD_FLAG, 0, .flag = &sparse_dd_set.machine },
  { "prezeroed", SPARSE_DD_FLAG, 0, .flag = &sparse_dd_set.prezeroed },
  { "verify-dest", SPARSE_DD_FLAG, 0, .flag = &sparse_dd_set.verify_dest },
  { "experimental-reads-bypass-tapdisk", SPARSE_DD_FLAG, SPARSE_DD_REFUSED,
    .instead = SPARSE_DD_AS_GIVEN },
  { "experimental-writes-bypass-tapdisk", SPARSE_DD_FLAG, SPARSE_DD_REFUSED,
    .instead = SPARSE_DD_AS_GIVEN },
  { "progress", SPARSE_DD_FLAG, SPARSE_DD_ARGV,
    .flag = &sparse_dd_set.progress_bar },
  /* Legacy suites and TLS 1.0 and 1.1 are never offered (docs/xapi.md):
   * taken and not used. */
  { "legacy-ciphersuites", SPARSE_DD_VALUE, SPARSE_DD_ARGV },
  { "ssl-legacy", SPARSE_DD_FLAG, SPARSE_DD_ARGV },
  /* xapi's service library's: config-dir names the directory of the
   * configuration's other files; the others concern xapi's daemons,
   * or its logging, which nbdflow's messages do not go through. */
  { "config-dir", SPARSE_DD_VALUE, SPARSE_DD_CONF, &sparse_dd_set.conf_dir },
  { "config", SPARSE_DD_VALUE, SPARSE_DD_CONF },
  { "use-switch", SPARSE_DD_BOOL, SPARSE_DD_CONF },
  { "switch-path", SPARSE_DD_VALUE, SPARSE_DD_CONF },
  { "search-path", SPARSE_DD_VALUE, SPARSE_DD_CONF },
  { "pidfile", SPARSE_DD_VALUE, SPARSE_DD_CONF },
  { "log", SPARSE_DD_VALUE, SPARSE_DD_CONF },
  { "daemon", SPARSE_DD_BOOL, SPARSE_DD_CONF },
  { "inventory", SPARSE_DD_VALUE, SPARSE_DD_CONF },
  { "loglevel", SPARSE_DD_VALUE, SPARSE_DD_CONF, .instead = SPARSE_DD_STDERR },
  { "disable-logging-for", SPARSE_DD_VALUE, SPARSE_DD_CONF,
    .instead = SPARSE_DD_STDERR },
  { NULL },
};

static const struct sparse_dd_opt *
sparse_dd_find(const struct sparse_dd_opt *opts, const char *name,
               unsigned not_from)
{
  for (; opts->name; opts++)
    if (!(opts->flags & not_from) && strcmp(opts->name, name) == 0)
      return opts;
  return NULL;
}

/* Takes v for opt, given at place (as for sparse_dd_check_fn), from
 * from (as in sparse_dd_given): checks it, says what nbdflow does
 * instead when it cannot do what v asks, and puts it where the option
 * goes (over what was there). v and from must live as long as the
 * command. 0, or -1 with the reason in why. */
static int
sparse_dd_take(const struct sparse_dd_opt *opt, const char *place,
               const char *from, const char *v, char *why, size_t whylen)
{
  bool is_bool = opt->kind != SPARSE_DD_VALUE;
  if (is_bool && strcmp(v, "true") != 0 && strcmp(v, "false") != 0) {
    snprintf(why, whylen, "%s: true or false, not '%.100s'", place, v);
    return -1;
  }
  if (opt->check && opt->check(place, v, why, whylen) < 0)
    return -1;
  if (opt->instead && (!is_bool || strcmp(v, "true") == 0))
    log_warn("%s%s%.100s is not honoured: %s", place, *from ? " = " : " ", v,
             opt->instead);
  if (opt->flag)
    *opt->flag = strcmp(v, "true") == 0;
  if (opt->value)
    *opt->value = v;
  if (opt->from)
    *opt->from = from;
  return 0;
}

/* Reads the command line into the options' places. 0; 1 once the help
 * is shown; 2 after a usage error's message. */
static int
sparse_dd_argv(const struct sparse_dd_opt *opts, int argc, char **argv)
{
  for (int i = 1; i < argc; i++) {
    const char *o = argv[i];
    char what[320];
    if (strcmp(o, "-help") == 0 || strcmp(o, "--help") == 0 ||
        strcmp(o, "-h") == 0) {
      sparse_dd_usage(stdout);
      return 1;
    }
    const struct sparse_dd_opt *opt =
        o[0] == '-' ? sparse_dd_find(opts, o + 1, SPARSE_DD_CONF) : NULL;
    if (opt == NULL) {
      snprintf(what, sizeof what, "unknown option '%.100s'", o);
      return cmd_usage_error("sparse_dd", what);
    }
    if (opt->flags & SPARSE_DD_REFUSED) {
      snprintf(what, sizeof what, "%s is not supported: %s", o,
               opt->instead);
      return cmd_usage_error("sparse_dd", what);
    }
    if (opt->kind == SPARSE_DD_FLAG) {
      if (opt->flag)
        *opt->flag = true;
      continue;
    }
    if (i + 1 >= argc) {
      snprintf(what, sizeof what, "%s needs a value", o);
      return cmd_usage_error("sparse_dd", what);
    }
    if ((opt->flags & SPARSE_DD_ONCE) && *opt->value) {
      snprintf(what, sizeof what, "%s given twice", o);
      return cmd_usage_error("sparse_dd", what);
    }
    if (sparse_dd_take(opt, o, "", argv[++i], what, sizeof what) < 0)
      return cmd_usage_error("sparse_dd", what);
  }
  return 0;
}

/* Values taken from the configuration: copies owned here until the
 * command ends, as the options' places point to them. */
struct sparse_dd_kept {
  char **v;
  size_t n;
};

/* A copy of s, owned by k; NULL when out of memory. */
static char *
sparse_dd_keep(struct sparse_dd_kept *k, const char *s)
{
  char **more = realloc(k->v, (k->n + 1) * sizeof *more);
  if (more == NULL)
    return NULL;
  k->v = more;
  char *c = strdup(s);
  if (c)
    k->v[k->n++] = c;
  return c;
}

static void
sparse_dd_kept_free(struct sparse_dd_kept *k)
{
  for (size_t i = 0; i < k->n; i++)
    free(k->v[i]);
  free(k->v);
}

struct sparse_dd_conf {
  const struct sparse_dd_opt *opts;
  struct sparse_dd_kept *kept;
};

/* One key of the configuration (keyval_fn). */
static int
sparse_dd_conf_key(void *arg, const char *file, unsigned line,
                   const char *key, const char *value)
{
  struct sparse_dd_conf *c = arg;
  const struct sparse_dd_opt *opt =
      sparse_dd_find(c->opts, key, SPARSE_DD_ARGV);
  if (opt == NULL) {
    /* Skipped without a word by xapi's service library. */
    log_debug("%.200s:%u: '%.100s' is no key of sparse_dd's: skipped", file,
              line, key);
    return 0;
  }
  char at[240], place[340], why[480];
  snprintf(at, sizeof at, "%.200s:%u: ", file, line);
  snprintf(place, sizeof place, "%s%s", at, key);
  char *v = sparse_dd_keep(c->kept, value);
  char *from = sparse_dd_keep(c->kept, at);
  if (v == NULL || from == NULL) {
    log_error("%sout of memory", at);
    return -ENOMEM;
  }
  if (sparse_dd_take(opt, place, from, v, why, sizeof why) < 0) {
    log_error("%s", why);
    return -EINVAL;
  }
  return 0;
}

#define SPARSE_DD_CONF_FILE "/etc/sparse_dd.conf"

/* Reads xapi's sparse_dd configuration, as its service library does,
 * once the command line is read: the file ($NBDFLOW_SPARSE_DD_CONF, else
 * /etc/sparse_dd.conf; set but empty: none), then each file of the
 * directory its config-dir key names (*conf_dir), else of FILE.d, in
 * name order. A missing file or directory is no configuration. Each key
 * puts its value over the command line's. 0, or -1 after a message. */
static int
sparse_dd_conf_read(const struct sparse_dd_opt *opts,
                    struct sparse_dd_kept *kept, const char **conf_dir)
{
  struct sparse_dd_conf c = { .opts = opts, .kept = kept };
  const char *file = getenv("NBDFLOW_SPARSE_DD_CONF");
  if (file == NULL)
    file = SPARSE_DD_CONF_FILE;
  if (*file == '\0')
    return 0;
  if (keyval_read_file(file, sparse_dd_conf_key, &c) < 0)
    return -1;
  char *dir = NULL; /* FILE.d, owned here */
  if (*conf_dir == NULL && asprintf(&dir, "%s.d", file) < 0) {
    log_error("out of memory");
    return -1;
  }
  int rc = keyval_read_dir(dir ? dir : *conf_dir, sparse_dd_conf_key, &c);
  free(dir);
  return rc < 0 ? -1 : 0;
}

struct progress_relay {
  int rfd;
  bool machine;
  bool percent; /* without -machine: a percentage on stderr (a terminal,
                 * or -progress) */
};

/* The errno of the first frame that could not be written (0: none):
 * stdio keeps only a flag, which would be reported as EIO at the end. */
static int sparse_dd_frame_err;

/* Writes one frame of progress (or the end header when text is NULL). */
static void
sparse_dd_frame(const char *text)
{
  uint8_t hdr[CHUNKED_HEADER_LEN];
  size_t n = text ? strlen(text) : 0;
  chunked_put(hdr, 0, (uint32_t)n);
  errno = 0;
  if ((fwrite(hdr, 1, sizeof hdr, stdout) != sizeof hdr ||
       (n && fwrite(text, 1, n, stdout) != n) || fflush(stdout) != 0) &&
      sparse_dd_frame_err == 0)
    sparse_dd_frame_err = errno ? errno : EIO;
}

static void *
sparse_dd_relay(void *arg)
{
  struct progress_relay *pr = arg;
  FILE *f = fdopen(pr->rfd, "r");
  char line[64];
  int last = -1;
  while (f && fgets(line, sizeof line, f)) {
    int pct;
    if (sscanf(line, "%d/100", &pct) != 1 || pct == last)
      continue;
    last = pct;
    if (pr->machine) {
      char text[32];
      snprintf(text, sizeof text, "Progress: %d", pct);
      sparse_dd_frame(text);
    } else if (pr->percent) {
      __atomic_store_n(&log_line_open, true, __ATOMIC_RELEASE);
      fprintf(stderr, "\r%3d%%", pct);
    }
  }
  if (f)
    fclose(f);
  /* The end header is the command's to write, once the outcome is known. */
  if (!pr->machine && last >= 0 && pr->percent &&
      __atomic_exchange_n(&log_line_open, false, __ATOMIC_ACQ_REL))
    fprintf(stderr, "\n");
  return NULL;
}

/* The copy's DST for -dest d, or NULL after a message in why:
 * - file:///PATH (or file://localhost/PATH), percent-decoded, is PATH as
 *   it is: always absolute, so never one of copy's prefixes ("-",
 *   "null:", "vhd:"...); any other "file:..." is refused;
 * - http(s), in any case, follows -encryption-mode;
 * - anything else is copy's DST as written. */
static char *
sparse_dd_dest(const char *d, const char *mode, char *why, size_t whylen)
{
  if (strncasecmp(d, "file:", 5) == 0) {
    /* "file:x" (no "//") is no file URL we take; "./file:x" names such
     * a file. */
    const char *p = strncmp(d + 5, "//", 2) == 0 ? d + 7 : "";
    if (strncasecmp(p, "localhost/", 10) == 0)
      p += 9;
    /* '?' and '#' would begin a query or a fragment: %3F and %23 name
     * them in a path. */
    char *path = p[0] == '/' && strcspn(p, "?#") == strlen(p)
                     ? uri_decode(p, strlen(p), false, NULL)
                     : NULL;
    if (path == NULL)
      snprintf(why, whylen, "-dest '%.150s': a file URL is file:///PATH "
               "(an absolute path, %%XX escapes allowed, no host but "
               "localhost, no query or fragment)", d);
    return path;
  }
  bool http = strncasecmp(d, "http://", 7) == 0;
  bool https = strncasecmp(d, "https://", 8) == 0;
  char *out = NULL;
  if (strcmp(mode, "always") == 0 && http) {
    if (asprintf(&out, "https://%s", d + 7) < 0)
      out = NULL;
  } else if (strcmp(mode, "never") == 0 && https) {
    if (asprintf(&out, "http://%s", d + 8) < 0)
      out = NULL;
  } else {
    out = strdup(d);
  }
  if (out == NULL)
    snprintf(why, whylen, "out of memory");
  return out;
}

/* DST d writes to this process's stdout: "-", or a path to the file
 * that stdout is (/dev/stdout, /proc/self/fd/1, the file it redirects to). */
static bool
sparse_dd_is_stdout(const char *d)
{
  struct stat a, b;
  if (strcmp(d, "-") == 0)
    return true;
  return d[0] == '/' && stat(d, &a) == 0 && fstat(STDOUT_FILENO, &b) == 0 &&
         a.st_dev == b.st_dev && a.st_ino == b.st_ino;
}

/* -good-ciphersuites, in OpenSSL's syntax (suites separated by ':', ','
 * or spaces, e.g. ECDHE-RSA-AES256-GCM-SHA384), as the GnuTLS priority
 * that offers the nearest: our versions (TLS 1.2 and 1.3) with only the
 * AEAD ciphers the list names, and only ECDHE key exchange when every
 * suite it names is an ECDHE one. Suites of other ciphers (CBC, RC4,
 * 3DES) are dropped. 0, or -1 when nothing is left. */
static int
sparse_dd_priority(const char *list, char *out, size_t outlen)
{
  static const struct {
    const char *in; /* part of an OpenSSL suite name */
    const char *out; /* GnuTLS cipher */
  } map[] = {
    { "AES256-GCM", "AES-256-GCM" }, { "AES128-GCM", "AES-128-GCM" },
    /* CCM8 before CCM: the first match counts */
    { "AES256-CCM8", "AES-256-CCM-8" }, { "AES128-CCM8", "AES-128-CCM-8" },
    { "AES256-CCM", "AES-256-CCM" }, { "AES128-CCM", "AES-128-CCM" },
    { "CHACHA20-POLY1305", "CHACHA20-POLY1305" },
    /* TLS 1.3 names, should a list carry them */
    { "AES_256_GCM", "AES-256-GCM" }, { "AES_128_GCM", "AES-128-GCM" },
    { "AES_128_CCM_8", "AES-128-CCM-8" }, { "AES_128_CCM", "AES-128-CCM" },
    { "CHACHA20_POLY1305", "CHACHA20-POLY1305" },
  };
  bool used[sizeof map / sizeof map[0]] = { false };
  bool any = false, all_ecdhe = true;
  const char *p = list;
  while (*p) {
    size_t n = strcspn(p, ":, ");
    char suite[128];
    if (n > 0 && n < sizeof suite) {
      memcpy(suite, p, n);
      suite[n] = '\0';
      for (size_t i = 0; i < sizeof map / sizeof map[0]; i++)
        if (strstr(suite, map[i].in)) {
          used[i] = any = true;
          all_ecdhe &= strncmp(suite, "ECDHE-", 6) == 0 ||
                       strncmp(suite, "TLS_", 4) == 0;
          break;
        }
    }
    p += n;
    p += strspn(p, ":, ");
  }
  if (!any)
    return -1;
  size_t len = (size_t)snprintf(out, outlen, "NORMAL:-VERS-ALL:+VERS-TLS1.3:"
                                "+VERS-TLS1.2:-CIPHER-ALL");
  for (size_t i = 0; i < sizeof map / sizeof map[0] && len < outlen; i++) {
    bool dup = false;
    for (size_t j = 0; j < i; j++)
      dup |= used[j] && strcmp(map[j].out, map[i].out) == 0;
    if (used[i] && !dup)
      len += (size_t)snprintf(out + len, outlen - len, ":+%s", map[i].out);
  }
  if (all_ecdhe && len < outlen)
    len += (size_t)snprintf(out + len, outlen - len,
                            ":-KX-ALL:+ECDHE-RSA:+ECDHE-ECDSA");
  return len < outlen ? 0 : -1;
}

/* What the copy runs with, worked out from the settings before anything
 * starts. */
struct sparse_dd_job {
  char *dst; /* copy's DST (sparse_dd_dest): owned, freed by the caller */
  const char *dst_proto; /* copy's --dst-protocol */
  uint64_t size;
  bool https;
  /* "--tls-priority=P" for an https DST given -good-ciphersuites, else
   * empty. */
  char prio_opt[256];
};

/* Checks what the settings ask for and works out the job. 0; or the exit
 * status after a message, j->dst NULL. */
static int
sparse_dd_prepare(const struct sparse_dd_settings *s, struct sparse_dd_job *j)
{
  char why[320];
  j->dst = NULL;
  j->prio_opt[0] = '\0';
  if (s->src == NULL || s->dest == NULL || s->size == NULL)
    return cmd_usage_error("sparse_dd", "-src, -dest and -size are needed");
  if (sparse_dd_size("-size", s->size, &j->size, why, sizeof why) < 0)
    return cmd_usage_error("sparse_dd", why);
  bool raw = s->proto && strcmp(s->proto, "none") == 0;
  if (s->proto == NULL || raw)
    j->dst_proto = "auto";
  else if (strcmp(s->proto, "nbd") == 0 || strcmp(s->proto, "chunked") == 0)
    j->dst_proto = s->proto;
  else
    return cmd_usage_error("sparse_dd", "-dest-proto: nbd, chunked or none");
  char *d = sparse_dd_dest(s->dest, s->mode, why, sizeof why);
  if (d == NULL)
    return cmd_usage_error("sparse_dd", why);
  int rc = 0;
  if (s->machine && sparse_dd_is_stdout(d)) {
    rc = cmd_usage_error("sparse_dd", "-dest is stdout, which carries "
                         "-machine's progress frames");
  } else if (raw && strstr(d, "://") != NULL) {
    log_error("%s: -dest-proto none sends raw bytes, to a file only", d);
    rc = 2;
  }
  /* xapi passes its ciphers whatever the destination: they are read for
   * an https one only. */
  j->https = strncasecmp(d, "https://", 8) == 0;
  if (rc == 0 && s->good && j->https) {
    int n = snprintf(j->prio_opt, sizeof j->prio_opt, "--tls-priority=");
    if (sparse_dd_priority(s->good, j->prio_opt + n,
                           sizeof j->prio_opt - (size_t)n) < 0) {
      snprintf(why, sizeof why, "-good-ciphersuites '%.100s': no suite "
               "nbdflow offers (AES-GCM, AES-CCM, CHACHA20-POLY1305)",
               s->good);
      rc = cmd_usage_error("sparse_dd", why);
    }
  }
  if (rc != 0) {
    free(d);
    return rc;
  }
  j->dst = d;
  return 0;
}

/* copy's command line for a job: the strings it builds live here, the
 * rest point into the settings and the job. */
struct sparse_dd_cargs {
  char *v[32]; /* NULL-terminated */
  int n;
  char progress[32], proto[32], size[40];
};

/* The TLS options for an https DST (copy refuses them elsewhere). As
 * xapi's sparse_dd: without -verify-dest the server's certificate is not
 * checked (pool hosts have self-signed ones, and xapi names them by
 * address); with it, its chain is, against -cert-bundle-path (else the
 * system's CAs), and not its name; -sni is the name sent.
 * NBDFLOW_TLS_CERTIFICATES (a directory with ca-cert.pem) asks for the
 * whole check, name included, where -verify-dest is not given. */
static void
sparse_dd_cargs_tls(const struct sparse_dd_settings *s,
                    const struct sparse_dd_job *j, struct sparse_dd_cargs *a)
{
  if (!j->https)
    return;
  const char *ca = getenv("NBDFLOW_TLS_CERTIFICATES");
  if (j->prio_opt[0])
    a->v[a->n++] = (char *)j->prio_opt;
  if (s->verify_dest) {
    a->v[a->n++] = "--tls-verify-peer=chain";
    if (s->bundle) {
      a->v[a->n++] = "--tls-ca-file";
      a->v[a->n++] = (char *)s->bundle;
    } else if (ca && *ca) {
      a->v[a->n++] = "--tls-certificates";
      a->v[a->n++] = (char *)ca;
    }
  } else if (ca && *ca) {
    a->v[a->n++] = "--tls-certificates";
    a->v[a->n++] = (char *)ca;
  } else {
    a->v[a->n++] = "--tls-verify-peer=false";
  }
  if (s->sni) {
    a->v[a->n++] = "--tls-server-name";
    a->v[a->n++] = (char *)s->sni;
  }
}

/* Builds copy's command line for job j, its progress going to
 * progress_fd. */
static void
sparse_dd_cargs_build(const struct sparse_dd_settings *s,
                      const struct sparse_dd_job *j, int progress_fd,
                      struct sparse_dd_cargs *a)
{
  snprintf(a->progress, sizeof a->progress, "--progress=%d", progress_fd);
  snprintf(a->proto, sizeof a->proto, "--dst-protocol=%s", j->dst_proto);
  snprintf(a->size, sizeof a->size, "--dst-size=%llu",
           (unsigned long long)j->size);
  a->n = 0;
  a->v[a->n++] = "copy";
  a->v[a->n++] = a->progress;
  a->v[a->n++] = a->proto;
  a->v[a->n++] = a->size;
  if (s->prezeroed)
    a->v[a->n++] = "--target-is-zero";
  /* Values as arguments of their own: never cut, never re-parsed. */
  if (s->base) {
    a->v[a->n++] = "--base";
    a->v[a->n++] = (char *)s->base;
  }
  if (s->export_name) {
    a->v[a->n++] = "--nbd-export";
    a->v[a->n++] = (char *)s->export_name;
  }
  sparse_dd_cargs_tls(s, j, a);
  a->v[a->n++] = "--";
  a->v[a->n++] = (char *)s->src;
  a->v[a->n++] = j->dst;
  a->v[a->n] = NULL;
}

/* Runs the copy of job j, its progress relayed by a thread (frames on
 * stdout with -machine), and closes the frames as the outcome says.
 * Returns the exit status. */
static int
sparse_dd_copy(const struct sparse_dd_settings *s,
               const struct sparse_dd_job *j)
{
  int pfd[2];
  if (pipe2(pfd, O_CLOEXEC) < 0) {
    log_error("pipe: %s", strerror(errno));
    return 1;
  }
  struct progress_relay pr = { .rfd = pfd[0], .machine = s->machine,
                               .percent = s->progress_bar ||
                                          isatty(STDERR_FILENO) };
  pthread_t t;
  if (pthread_create(&t, NULL, sparse_dd_relay, &pr) != 0) {
    log_error("cannot start the progress thread");
    close(pfd[0]);
    close(pfd[1]);
    return 1;
  }
  struct sparse_dd_cargs a;
  sparse_dd_cargs_build(s, j, pfd[1], &a);
  int rc = cmd_copy(a.n, a.v);
  close(pfd[1]);
  pthread_join(t, NULL);
  if (rc != 0 && rc != 2 && copy_peer_error)
    rc = SPARSE_DD_NBD_ERROR;
  /* As xapi's sparse_dd: the end header closes the progress of a copy
   * that succeeded; after a failure the stream just stops, the message
   * on stderr. Status 5 closes it too, or xapi could never see that
   * status: its reader of the frames (Chunk.fold, in
   * sparse_dd_wrapper.ml) raises End_of_file at a stream that stops
   * without the end header, so its waitpid, and the branch for
   * WEXITED 5 there, are reached only after one. */
  if (s->machine && (rc == 0 || rc == SPARSE_DD_NBD_ERROR))
    sparse_dd_frame(NULL);
  if (sparse_dd_frame_err) {
    /* Said with its own errno; stdout's flag is cleared so that it is
     * not said again as EIO. The copy itself went on: the data is what
     * it says. */
    log_error("-machine: writing progress to stdout: %s",
              strerror(sparse_dd_frame_err));
    clearerr(stdout);
    if (rc == 0)
      rc = 1;
  }
  return rc;
}

/* Reads the command line and then the configuration into sparse_dd_set,
 * works out the job, sets the priorities and copies. */
static int
sparse_dd_run(int argc, char **argv, struct sparse_dd_kept *kept)
{
  const struct sparse_dd_settings *s = &sparse_dd_set;
  int parsed = sparse_dd_argv(sparse_dd_opts, argc, argv);
  if (parsed != 0)
    return parsed == 1 ? 0 : parsed;
  if (sparse_dd_conf_read(sparse_dd_opts, kept, &sparse_dd_set.conf_dir) < 0)
    return 1;
  struct sparse_dd_job j;
  int rc = sparse_dd_prepare(s, &j);
  if (rc != 0)
    return rc;
  sparse_dd_priorities(&s->nice, &s->ioclass, &s->iodata);
  rc = sparse_dd_copy(s, &j);
  free(j.dst);
  return rc;
}

int
cmd_sparse_dd(int argc, char **argv)
{
  struct sparse_dd_kept kept = { NULL, 0 };
  int rc = sparse_dd_run(argc, argv, &kept);
  sparse_dd_kept_free(&kept);
  /* Its strings pointed into kept and argv. */
  sparse_dd_set = (struct sparse_dd_settings)SPARSE_DD_SETTINGS_INIT;
  return rc;
}
