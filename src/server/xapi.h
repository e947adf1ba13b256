/* xapi.h: the receiving side of xapi's transports, beside the NBD
 * listeners: an HTTP(S) listener (serve --http) that takes
 *   PUT /import_raw_vdi?vdi=NAME&format=raw  (a Chunked body with a
 *       "chunked" key in the query or a cookie, else a raw body of
 *       Content-Length bytes) into export NAME, and
 *   PUT /nbd/NAME  answered "200 OK" with "Transfer-encoding: nbd", after
 *       which the connection is an NBD session like any other,
 * and a raw Chunked listener (serve --chunked-listen) that writes one
 * Chunked stream per connection into the default export.
 *
 * Each session runs on a thread of its own (they are few and long), reads
 * with the handshake timeout for the head and the body timeout for the body
 * (silence, not the total),
 * and counts against --max-connections. */
#ifndef NBDFLOW_SERVER_XAPI_H
#define NBDFLOW_SERVER_XAPI_H

struct server;
struct loop;

/* Opens the listeners the configuration names and watches them on l.
 * 0, or -errno after logging why. */
int xapi_start(struct server *s, struct loop *l);
/* Closes the listeners, ends every session (shutdown(2) of its socket)
 * and waits for their threads. */
void xapi_stop(struct server *s);
/* The main loop's tick: listeners paused for want of fds listen again
 * after a second. */
void xapi_tick(struct server *s);
/* The first stop signal: the listeners close at once, as the NBD ones
 * do; sessions already open go on until xapi_stop. Main loop thread. */
void xapi_stop_listening(struct server *s);

#endif
