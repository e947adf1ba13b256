/* sock.h: one short function per socket chore. All return 0 or a
 * non-negative fd on success and -errno on failure, and log nothing: the
 * caller knows the context and names it. */
#ifndef NBDFLOW_NET_SOCK_H
#define NBDFLOW_NET_SOCK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* "HOST:PORT", "[V6]:PORT", "HOST" or ":PORT" into host and port. host and
 * port must hold 256 and 32 bytes. Returns 0 or -EINVAL. */
int sock_split_hostport(const char *s, char *host, char *port,
                        const char *default_port);

/* A host name the resolver could not turn into an address: the TCP
 * functions below return SOCK_ERR_RESOLVE(EAI_* code) then, a value below
 * any -errno, and sock_strerror says the resolver's reason ("Name or
 * service not known") instead of an errno's text. */
#define SOCK_EAI_BASE         10000
#define SOCK_ERR_RESOLVE(eai) (-SOCK_EAI_BASE - ((eai) < 0 ? -(eai) : (eai)))
static inline bool
sock_err_is_resolve(int err)
{
  return err <= -SOCK_EAI_BASE;
}
/* The text of a -errno or a SOCK_ERR_RESOLVE value. */
const char *sock_strerror(int err);

/* Listening sockets (non-blocking, close-on-exec). sock_listen_tcp binds
 * every address host resolves to, up to max fds; returns how many. */
int sock_listen_tcp(const char *host, const char *port, int *fds, int max);
int sock_listen_unix(const char *path);
/* Sockets passed by systemd (LISTEN_FDS/LISTEN_PID), up to max. Returns
 * the count, 0 when none were passed. */
int sock_activation_fds(int *fds, int max);

/* Connects that return when done; the fd is returned blocking,
 * close-on-exec. When on_fd is given, each socket is passed to it before
 * its connect starts, and -1 is passed before a socket that failed is
 * closed: another thread may shutdown(2) the socket meanwhile to abort a
 * connect that hangs (over TCP at once, on a Unix socket within 10 ms).
 * timeout_ms >= 0 bounds the wait (over all of a host's addresses):
 * -ETIMEDOUT when a server neither accepts nor refuses in time, as one
 * whose accept queue stays full. */
typedef void (*sock_fd_fn)(void *arg, int fd);
int sock_connect_tcp(const char *host, const char *port, int timeout_ms,
                     sock_fd_fn on_fd, void *arg);
int sock_connect_unix(const char *path, int timeout_ms, sock_fd_fn on_fd,
                      void *arg);

int sock_set_nonblock(int fd, bool on);
int sock_set_nodelay(int fd, bool on);
int sock_set_quickack(int fd);
int sock_set_keepalive(int fd);
/* Asks for size bytes of send buffer; *effective receives what the kernel
 * granted (Linux reports twice the usable size; we report it halved). */
int sock_set_sndbuf(int fd, int size, int *effective);
/* The same past net.core.wmem_max where the process may
 * (CAP_NET_ADMIN: SO_SNDBUFFORCE), else as sock_set_sndbuf. */
int sock_set_sndbuf_force(int fd, int size, int *effective);
int sock_set_rcvbuf(int fd, int size, int *effective);
/* The largest send and receive buffers TCP autotuning may grow a socket
 * to (the third figures of net.ipv4.tcp_wmem and tcp_rmem, as this
 * process's network namespace sets them). -ENOENT when unreadable. */
int sock_tcp_autotune_max(uint64_t *send, uint64_t *recv);
bool sock_is_tcp(int fd);
bool sock_is_unix(int fd);
/* A TCP socket whose peer is a loopback address (127.0.0.0/8, ::1 or
 * ::ffff:127.0.0.0/104): both ends on this host. */
bool sock_is_tcp_loopback(int fd);
/* Moves up to len bytes from socket fd into the pipe pipefd without
 * copying them through user space; non-blocking. Returns bytes moved, 0 at
 * EOF, -EAGAIN or -errno. */
ssize_t sock_splice_to_pipe(int fd, int pipefd, size_t len);
/* Bytes waiting to be read on socket fd (FIONREAD), or -errno. */
int sock_readable_bytes(int fd);
/* A non-blocking pipe holding at least size bytes; -errno when the kernel
 * will not grow one that far. */
int sock_pipe_sized(int fds[2], size_t size);
/* fs.pipe-max-size: the largest pipe a process without CAP_SYS_RESOURCE
 * may ask for (1 MiB when it cannot be read). */
size_t sock_pipe_max_size(void);
/* Empties a non-blocking pipe, discarding its bytes. */
void sock_pipe_drain(int fd);
/* "host:port" or "unix:path" of the peer, for log lines. */
void sock_peer_name(int fd, char *buf, size_t len);
/* The same for the socket's own address: a listener's real port. */
void sock_local_name(int fd, char *buf, size_t len);

#endif
