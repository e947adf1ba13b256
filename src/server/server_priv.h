/* server_priv.h: what listen.c, which owns the loops, calls in conn.c,
 * which owns what a connection does on its loop; internal to those two.
 * What handshake.c, transmission.c and xapi.c use is in server.h. */
#ifndef NBDFLOW_SERVER_SERVER_PRIV_H
#define NBDFLOW_SERVER_SERVER_PRIV_H

#include "server/server.h"

/* Takes up a socket handed to the loop sl (accepted, or handed over by a
 * session: server_adopt), from sl's thread, and starts its handshake.
 * Its place in nconns and sl->nowned was taken before: by the accepting
 * loop, or by the session (server_take_slot) and server_adopt. tls, when
 * not NULL and set, is an established TLS transport the connection takes
 * over; dflt, when not NULL, the export the empty name means. On
 * failure the socket is closed and its place given back. */
void conn_create(struct sloop *sl, int fd, const struct transport *tls,
                 struct export *dflt);

/* Reads and handles what the socket has, without blocking, for one turn
 * (SERVER_TURN_BYTES); a connection with more to read then queues itself
 * behind the loop's other work (yielded), and its tick reads on. Loop
 * thread; c may be closed when it returns, and freed unless the caller
 * holds a reference. */
void conn_read(struct conn *c);

#endif
