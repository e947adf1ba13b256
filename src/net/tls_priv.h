/* tls_priv.h: what tls.c (the session) and tls_creds.c (the credentials
 * it starts with) share; internal to those two. */
#ifndef NBDFLOW_NET_TLS_PRIV_H
#define NBDFLOW_NET_TLS_PRIV_H

#include <stdbool.h>
#include <stddef.h>

#include <gnutls/gnutls.h>

/* A server's credentials, or a client's for one server: loaded once,
 * then shared, read-only, by every session that uses them. */
struct tls_creds {
  /* Server: --tls-certs and/or --tls-psk. Client: exactly one of x509,
   * psk_client and anon. */
  gnutls_certificate_credentials_t x509;
  gnutls_psk_server_credentials_t psk;
  gnutls_psk_client_credentials_t psk_client;
  gnutls_anon_client_credentials_t anon;
  gnutls_priority_t prio;
  bool verify_peer; /* server: demand a client certificate */
};

/* Writes a message into err, a buffer of errlen bytes (nothing when
 * errlen is 0), printf-style. */
void tls_err(char *err, size_t errlen, const char *fmt, ...)
  __attribute__((format(printf, 3, 4)));

#endif
