/* tls.h: the TLS transport (GnuTLS) and the credentials behind it.
 * tls.c holds the session, tls_creds.c the credentials.
 *
 * After NBD_OPT_STARTTLS has been acknowledged, tls_server_start (or
 * tls_client_start) swaps a connection's plain transport for this one, on
 * the same fd; protocol code above keeps calling the transport table and
 * never asks whether TLS is on.
 *
 * Send semantics (what sendv and flush promise under TLS):
 * - sendv packs plaintext into records of the largest size the session
 *   allows (16 KiB). Small pieces (headers, short replies) are gathered in
 *   a record buffer inside the transport; a large piece is encrypted
 *   straight from the caller's memory, one full record at a time.
 * - With TRANSPORT_SEND_MORE the last partial record stays in the record
 *   buffer, so that a header and the data that follows leave as one
 *   record. Without it, sendv ends by sending that partial record.
 * - A byte counts as sent (is included in sendv's result) once GnuTLS or
 *   the transport holds it; the caller may then reuse its memory.
 * - Encrypted records are gathered in a send buffer inside the transport
 *   and leave several per send(2); the buffer goes to the socket when the
 *   next record would not fit and when a message ends (sendv without
 *   SEND_MORE), as far as the socket takes it.
 * - When the send buffer is full and the socket too, GnuTLS keeps an
 *   encrypted record that must be pushed again before anything else: the
 *   transport remembers that, and the next sendv or flush completes it
 *   first (-EAGAIN while it cannot).
 * - flush pushes the pending record, the record buffer and the send
 *   buffer; 0 when all is on the socket, -EAGAIN while the socket is full
 *   (call again on EPOLLOUT), -errno when the session is dead.
 * - recv reads the socket in large chunks into a receive buffer inside
 *   the transport and returns decrypted bytes, as many records' worth as
 *   have arrived and fit. pending() counts what epoll cannot see: the
 *   decrypted bytes GnuTLS holds and the received bytes in that buffer.
 *   After recv returned -EAGAIN, the receive buffer is empty; a caller
 *   that stops reading earlier must come back while pending() > 0. The
 *   handshake may leave bytes there too: read before waiting on epoll.
 * Threads: one thread may receive while another sends (under the caller's
 * lock); the handshake must finish before either starts. */
#ifndef NBDFLOW_NET_TLS_H
#define NBDFLOW_NET_TLS_H

#include <stdbool.h>
#include <stddef.h>

#include "net/transport.h"

/* File names in a certificate directory (the layout qemu and nbdkit use). */
#define TLS_CA_CERT "ca-cert.pem"
#define TLS_SERVER_CERT "server-cert.pem"
#define TLS_SERVER_KEY "server-key.pem"
#define TLS_CLIENT_CERT "client-cert.pem"
#define TLS_CLIENT_KEY "client-key.pem"

enum tls_mode {
  TLS_OFF,     /* NOTLS: STARTTLS is refused */
  TLS_ON,      /* TLS offered; every export also in clear */
  TLS_REQUIRE, /* FORCEDTLS: nothing but STARTTLS and ABORT in clear */
};

struct tls_server_config {
  const char *certs_dir; /* X.509 directory, or NULL */
  const char *psk_file;  /* psktool "username:hexkey" lines, or NULL */
  bool verify_peer;      /* X.509: demand a client certificate the CA signed */
};

/* Credentials, a server's or a client's for one server: loaded once,
 * read-only afterwards, and shared by every session that uses them, from
 * any thread. */
struct tls_creds;

/* Loads and checks the server's credentials. At least one of certs_dir
 * and psk_file must be set. Returns 0, or -errno with a sentence for the
 * user in err that names the bad file. */
int tls_creds_server_new(const struct tls_server_config *cfg,
                         struct tls_creds **out, char *err, size_t errlen);
void tls_creds_free(struct tls_creds *creds);

/* Installs the TLS transport on t (a plain transport on a non-blocking
 * socket) as a server. The handshake has not run yet: drive it with
 * tls_handshake_step. creds must outlive the transport. On failure t is
 * left as it was. */
int tls_server_start(struct transport *t, const struct tls_creds *creds,
                     char *err, size_t errlen);

/* Runs the handshake as far as the socket allows, without blocking.
 * Returns 0 when it is complete; -EAGAIN when it waits for the socket
 * (*want_write says for which direction); another -errno when it failed,
 * with the reason (GnuTLS's, and the certificate verdict) in err. */
int tls_handshake_step(struct transport *t, bool *want_write, char *err,
                       size_t errlen);

/* What a session negotiated, for reports (copy --json, serve --stats).
 * Every member is a static string, never NULL ("?" for a name GnuTLS
 * does not know): the protocol version ("TLS1.3") and the cipher
 * ("AES-128-GCM") as GnuTLS names them, and how this end knows its peer:
 *   "psk"            both ends proved the same pre-shared key
 *   "x509-verified"  this end checked the peer's certificate against its
 *                    CA (a client with tls-verify-peer, a server with
 *                    --tls-verify-peer)
 *   "x509"           certificates, but this end checked none (a client
 *                    with tls-verify-peer=0; a server that asked its
 *                    client for none)
 *   "anon"           anonymous Diffie-Hellman: no one is authenticated */
struct tls_params {
  const char *version;
  const char *cipher;
  const char *auth;
};

/* Fills p from t's session, whose handshake has completed. Returns 0, or
 * -EINVAL (p untouched) when t is not a TLS transport. */
int tls_params_get(const struct transport *t, struct tls_params *p);

/* tls_params_get's fields as one line for logs, with a server's PSK
 * user name, which comes from the peer and wants escaping: "TLS1.3
 * AES-128-GCM, psk user \"alice\"", "TLS1.2 AES-256-GCM, x509". */
void tls_describe(struct transport *t, char *buf, size_t len);

/* True when t is a TLS transport. For logs and tests, not for protocol
 * decisions. */
bool tls_is_tls(const struct transport *t);

/* The name of the fatal alert the peer ended t's TLS session with, once a
 * receive has failed on it ("Certificate is required."); NULL when t is
 * not TLS or no such alert came. Static storage. */
const char *tls_peer_alert(const struct transport *t);

struct tls_client_config {
  const char *certs_dir; /* X.509: ca-cert.pem, optional client-cert.pem
                          * and client-key.pem; NULL to use the system
                          * trust store */
  const char *psk_file;  /* PSK instead of X.509 when set */
  bool anon;             /* neither: anonymous Diffie-Hellman, TLS 1.2,
                          * which encrypts but authenticates no one */
  const char *username;  /* PSK identity; NULL means the login name */
  const char *hostname;  /* name the server certificate must carry, or NULL
                          * to check only the chain */
  const char *ca_file;   /* X.509: a PEM bundle of CAs to check the server
                          * with, in place of certs_dir's ca-cert.pem */
  const char *sni;       /* server name to send (SNI), or NULL: hostname
                          * (never an IP address) */
  bool verify_peer;      /* false: accept any server certificate */
  const char *priority;  /* a GnuTLS priority string in place of ours
                          * (TLS 1.2 and 1.3, AEAD ciphers), or NULL */
};

/* Client side: the credentials cfg names (with its username, for PSK),
 * loaded before connecting, so that a missing file, key or PSK user
 * fails here with the reason in err, not as a handshake the server sees
 * cut. Free them with tls_creds_free. */
int tls_creds_client_new(const struct tls_client_config *cfg,
                         struct tls_creds **out, char *err, size_t errlen);

/* Client side: after the server's ACK to NBD_OPT_STARTTLS, installs the
 * TLS transport on t and completes the handshake, waiting with poll for
 * at most timeout_ms (-1: forever). creds, loaded from the same cfg, must
 * outlive the transport; cfg gives the name to check. Returns 0, or
 * -errno with the reason in err; on failure the caller must close the
 * connection (there is no going back to plaintext) and t is left as it
 * was. */
int tls_client_start(struct transport *t, const struct tls_client_config *cfg,
                     const struct tls_creds *creds, int timeout_ms,
                     char *err, size_t errlen);

#endif
