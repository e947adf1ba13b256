/* keyval.h: the configuration files of xapi's OCaml services, which
 * their service library reads (/etc/NAME.conf, then the files of
 * /etc/NAME.conf.d): one "key = value" a line. */
#ifndef NBDFLOW_UTIL_KEYVAL_H
#define NBDFLOW_UTIL_KEYVAL_H

#include <stdbool.h>

/* Reads one line, without its newline, in place, as that library does:
 * from the first '#' on it is a comment; spaces and tabs at its end are
 * dropped; the key is the first run of bytes other than '=', '\\',
 * space and tab that is followed by such pad bytes ('\\', space, tab;
 * or none) and '=' (what comes before it is skipped); the value is all
 * that follows the '=' and the pad bytes after it ("k = \\v" gives v),
 * less one pair of the same quotes ('"' or '\'') around it. True with
 * *key and *value pointing into line, each NUL-terminated there; false
 * for a line with no key (blank, a comment, no '='), which is skipped.
 * Pure: line may be changed either way. */
bool keyval_parse_line(char *line, char **key, char **value);

/* Called for each key of a file, in order; file and line (from 1) say
 * where. key and value live until it returns. Returns 0 to go on, or a
 * negative number to stop, which the reader then returns. */
typedef int (*keyval_fn)(void *arg, const char *file, unsigned line,
                         const char *key, const char *value);

/* Reads file (lines end at '\n') through keyval_parse_line, calling fn
 * for each key. A line that holds a NUL byte is skipped, wherever the
 * NUL is, with one warning a file naming the first such line and how
 * many more (a swap or binary file in a .d directory must not stop
 * every command). A file that does not exist is no configuration: 0,
 * no call. Returns 0, fn's negative return, or -errno
 * after a message on stderr: opening or reading failed (-EISDIR: a
 * directory). May block on the file. */
int keyval_read_file(const char *file, keyval_fn fn, void *arg);

/* keyval_read_file on each entry of dir but "." and "..", in the byte
 * order of their names (a subdirectory is an error, as for
 * keyval_read_file). A directory that cannot be listed is none, as the
 * service library takes it: 0, no call. Returns as keyval_read_file. */
int keyval_read_dir(const char *dir, keyval_fn fn, void *arg);

#endif
