/* keyval.c: see keyval.h. The line's rules are those of xapi's service
 * library (its Config_file module): once the comment and the trailing
 * spaces and tabs are gone, a search for the pattern (Emacs syntax, as
 * it is written there)
 *   \([^=\ \t]+\)[\ \t]*=[\ \t]*\(.*\)
 * (\t standing for a tab), then the quotes. Emacs syntax has no escapes
 * in a bracket, so each bracket holds a backslash: a key never holds
 * one, and backslashes next to the '=' go with the blanks there. */
#include "keyval.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"

/* The pattern's [\ \t]: what may stand around the '='. */
#define KEYVAL_PAD "\\ \t"

bool
keyval_parse_line(char *line, char **key, char **value)
{
  line[strcspn(line, "#")] = '\0';
  size_t n = strlen(line);
  while (n > 0 && (line[n - 1] == ' ' || line[n - 1] == '\t'))
    line[--n] = '\0';
  /* The search's first match starts a run of key bytes: one that is not
   * followed by pad bytes and '=' matches from none of its bytes. */
  char *p = line;
  for (;;) {
    p += strspn(p, "=" KEYVAL_PAD);
    if (*p == '\0')
      return false;
    char *k = p;
    p += strcspn(p, "=" KEYVAL_PAD);
    char *end = p;
    p += strspn(p, KEYVAL_PAD);
    if (*p != '=')
      continue;
    char *v = p + 1;
    *end = '\0';
    v += strspn(v, KEYVAL_PAD);
    size_t vlen = strlen(v);
    if (vlen >= 2 && v[0] == v[vlen - 1] && (v[0] == '"' || v[0] == '\'')) {
      v[vlen - 1] = '\0';
      v++;
    }
    *key = k;
    *value = v;
    return true;
  }
}

int
keyval_read_file(const char *file, keyval_fn fn, void *arg)
{
  FILE *f = fopen(file, "re");
  if (f == NULL) {
    if (errno == ENOENT || errno == ENOTDIR)
      return 0;
    int err = errno;
    log_error("configuration %s: %s", file, strerror(err));
    return -err;
  }
  char *line = NULL; /* getline's buffer: owned here, freed at the end */
  size_t cap = 0;
  unsigned lineno = 0, nul_first = 0, nul_lines = 0;
  int rc = 0;
  ssize_t len;
  errno = 0;
  while ((len = getline(&line, &cap, f)) >= 0) {
    lineno++;
    if (len > 0 && line[len - 1] == '\n')
      line[--len] = '\0';
    char *key, *value;
    /* A line with a NUL byte (an editor's swap file, a binary file left
     * in the directory) is skipped wherever the NUL is, not an error.
     * The service library reads such a line too, and takes its key
     * unless the NUL is in the key (which then names no option) or in
     * its value. Said once a file: a binary file has many. */
    if (strlen(line) != (size_t)len) {
      if (nul_lines++ == 0)
        nul_first = lineno;
    } else if (keyval_parse_line(line, &key, &value))
      rc = fn(arg, file, lineno, key, value);
    if (rc < 0)
      break;
    errno = 0;
  }
  if (nul_lines == 1)
    log_warn("configuration %s:%u: a NUL byte: line skipped", file, nul_first);
  else if (nul_lines > 1)
    log_warn("configuration %s:%u: a NUL byte: line skipped (and %u more "
             "such line%s)",
             file, nul_first, nul_lines - 1, nul_lines == 2 ? "" : "s");
  if (rc == 0 && ferror(f)) {
    int err = errno ? errno : EIO;
    log_error("configuration %s: %s", file, strerror(err));
    rc = -err;
  }
  free(line);
  fclose(f);
  return rc;
}

static int
keyval_cmp(const void *a, const void *b)
{
  return strcmp(*(char *const *)a, *(char *const *)b);
}

int
keyval_read_dir(const char *dir, keyval_fn fn, void *arg)
{
  DIR *d = opendir(dir);
  if (d == NULL)
    return 0;
  char **names = NULL; /* owned here, each name and the array */
  size_t n = 0;
  int rc = 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
      continue;
    char **more = realloc(names, (n + 1) * sizeof *names);
    char *path = NULL;
    if (more)
      names = more;
    if (more == NULL || asprintf(&path, "%s/%s", dir, e->d_name) < 0) {
      log_error("configuration %s: out of memory", dir);
      rc = -ENOMEM;
      break;
    }
    names[n++] = path;
  }
  closedir(d);
  /* Not for an empty directory: names is NULL then, and qsort's array
   * must not be, even for no element. */
  if (rc == 0 && n > 1)
    qsort(names, n, sizeof *names, keyval_cmp);
  for (size_t i = 0; i < n && rc == 0; i++)
    rc = keyval_read_file(names[i], fn, arg);
  for (size_t i = 0; i < n; i++)
    free(names[i]);
  free(names);
  return rc;
}
