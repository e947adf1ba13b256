/* tls_creds.c: the credentials a TLS session starts with: a server's
 * X.509 certificate, key and CA and its PSK file, a client's for one
 * server, and the GnuTLS priority string both ends use. Loaded and
 * checked once, with errors that name the bad file; shared read-only by
 * every session afterwards (tls.c), and freed once none is left. */
#include "tls.h"
#include "tls_priv.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <gnutls/gnutls.h>

#include "util/log.h"

#define TLS_PSK_LINE_MAX 4096
#define TLS_PSK_KEY_MIN 4 /* bytes: GnuTLS clients take no shorter key */
/* TLS 1.2 and later only (§TLS versions). AEAD ciphers only, AES-GCM
 * first and the server's order winning: with AES-NI, GnuTLS runs
 * AES-128-GCM about ten times faster than ChaCha20 here, and a client
 * left to choose often picks the slow one. */
#define TLS_PRIO_BASE "NORMAL:-VERS-ALL:+VERS-TLS1.3:+VERS-TLS1.2:" \
  "-CIPHER-ALL:+AES-128-GCM:+AES-256-GCM:+CHACHA20-POLY1305:" \
  "+AES-128-CCM:+AES-256-CCM:%SERVER_PRECEDENCE"
#define TLS_PRIO_PSK ":+ECDHE-PSK:+DHE-PSK:+PSK"
/* Anonymous key exchange exists in TLS 1.2 only. */
#define TLS_PRIO_ANON ":-VERS-TLS1.3:+ANON-ECDH:+ANON-DH"

/* The priority string both ends use: TLS 1.2 and 1.3, AEAD ciphers with
 * AES-GCM first, plus the PSK key exchanges when psk, or only TLS 1.2 and
 * the anonymous ones when anon; or the user's own, given. On failure
 * *prio is NULL, err says why, and the result is -EINVAL. */
static int
tls_priority(gnutls_priority_t *prio, bool psk, bool anon, const char *given,
             char *err, size_t errlen)
{
  const char *s = given  ? given
                  : psk  ? TLS_PRIO_BASE TLS_PRIO_PSK
                  : anon ? TLS_PRIO_BASE TLS_PRIO_ANON
                         : TLS_PRIO_BASE;
  int r = gnutls_priority_init(prio, s, NULL);
  if (r < 0) {
    *prio = NULL;
    tls_err(err, errlen, "TLS priority \"%s\": %s", s, gnutls_strerror(r));
    return -EINVAL;
  }
  return 0;
}

/* ---- server credentials ---- */

static char *
tls_path(const char *dir, const char *name)
{
  size_t n = strlen(dir) + strlen(name) + 2;
  char *p = malloc(n);
  if (p)
    snprintf(p, n, "%s/%s", dir, name);
  return p;
}

/* Checks a psktool file: "username:hexkey" lines. Returns 0 or -errno. */
static int
tls_psk_check(const char *file, char *err, size_t errlen)
{
  FILE *f = fopen(file, "r");
  if (f == NULL) {
    int e = errno;
    tls_err(err, errlen, "cannot read PSK file %s: %s", file, strerror(e));
    return -e;
  }
  char line[TLS_PSK_LINE_MAX];
  int lineno = 0, keys = 0, r = 0;
  while (fgets(line, sizeof line, f)) {
    lineno++;
    size_t n = strcspn(line, "\n");
    if (line[n] != '\n' && !feof(f)) {
      tls_err(err, errlen, "PSK file %s line %d: longer than %d bytes",
              file, lineno, TLS_PSK_LINE_MAX - 2);
      r = -EINVAL;
      break;
    }
    /* GnuTLS reads the server's file itself, and takes a carriage
     * return for part of the key: every handshake would then fail. */
    if (n > 0 && line[n - 1] == '\r') {
      tls_err(err, errlen, "PSK file %s line %d ends in a carriage return "
              "(DOS line ends?); write it with \\n line ends, as psktool "
              "does", file, lineno);
      r = -EINVAL;
      break;
    }
    line[n] = '\0';
    if (n == 0)
      continue;
    char *colon = strchr(line, ':');
    const char *hex = colon ? colon + 1 : "";
    size_t hl = strlen(hex);
    bool ok = colon && colon > line && hl > 0 && hl % 2 == 0;
    for (size_t i = 0; ok && i < hl; i++)
      ok = isxdigit((unsigned char)hex[i]);
    if (!ok) {
      tls_err(err, errlen, "PSK file %s line %d: expected "
              "\"username:hexkey\"", file, lineno);
      r = -EINVAL;
      break;
    }
    if (hl < 2 * TLS_PSK_KEY_MIN) {
      /* GnuTLS clients refuse them ("The request is invalid"). */
      tls_err(err, errlen, "PSK file %s line %d: a key of %zu bytes; at "
              "least %d are needed", file, lineno, hl / 2, TLS_PSK_KEY_MIN);
      r = -EINVAL;
      break;
    }
    keys++;
  }
  explicit_bzero(line, sizeof line);
  fclose(f);
  if (r == 0 && keys == 0) {
    tls_err(err, errlen, "PSK file %s holds no key", file);
    r = -EINVAL;
  }
  return r;
}

/* 0 when path can be read, else -errno (-ENOENT: there is none). GnuTLS
 * says only "Error while reading file", without the file or the reason. */
static int
tls_readable(const char *path)
{
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return -errno;
  close(fd);
  return 0;
}

/* Both files of a certificate and its key can be read, or err says which
 * cannot, and why. */
static int
tls_pair_readable(const char *cert, const char *key, char *err,
                  size_t errlen)
{
  const char *path[2] = { cert, key };
  for (int i = 0; i < 2; i++) {
    int r = tls_readable(path[i]);
    if (r < 0) {
      tls_err(err, errlen, "cannot read %s: %s", path[i], strerror(-r));
      return r;
    }
  }
  return 0;
}

static int
tls_creds_load_x509(struct tls_creds *c, const char *dir, bool verify,
                    char *err, size_t errlen)
{
  char *ca = tls_path(dir, TLS_CA_CERT);
  char *cert = tls_path(dir, TLS_SERVER_CERT);
  char *key = tls_path(dir, TLS_SERVER_KEY);
  int ret = -ENOMEM, r;

  if (ca == NULL || cert == NULL || key == NULL)
    goto cleanup;
  r = gnutls_certificate_allocate_credentials(&c->x509);
  if (r < 0) {
    c->x509 = NULL;
    tls_err(err, errlen, "GnuTLS: %s", gnutls_strerror(r));
    goto cleanup;
  }
  ret = -EINVAL;
  if (tls_pair_readable(cert, key, err, errlen) < 0)
    goto cleanup;
  r = gnutls_certificate_set_x509_key_file(c->x509, cert, key,
                                           GNUTLS_X509_FMT_PEM);
  if (r < 0) {
    tls_err(err, errlen, "cannot load %s with key %s: %s", cert, key,
            gnutls_strerror(r));
    goto cleanup;
  }
  r = tls_readable(ca);
  if (r < 0 && r != -ENOENT) {
    tls_err(err, errlen, "cannot read CA certificate %s: %s", ca,
            strerror(-r));
    goto cleanup;
  }
  if (r == 0) {
    r = gnutls_certificate_set_x509_trust_file(c->x509, ca,
                                               GNUTLS_X509_FMT_PEM);
    if (r <= 0) {
      tls_err(err, errlen, "cannot load CA certificate %s: %s", ca,
              r < 0 ? gnutls_strerror(r) : "no certificate in it");
      goto cleanup;
    }
  } else if (verify) {
    tls_err(err, errlen, "--tls-verify-peer needs %s to check client "
            "certificates", ca);
    goto cleanup;
  }
  ret = 0;
cleanup:
  if (ret == -ENOMEM && err[0] == '\0')
    tls_err(err, errlen, "out of memory");
  free(ca);
  free(cert);
  free(key);
  return ret;
}

/* Empty credentials, and err cleared; NULL with err set. */
static struct tls_creds *
tls_creds_alloc(char *err, size_t errlen)
{
  if (errlen)
    err[0] = '\0';
  struct tls_creds *c = calloc(1, sizeof *c);
  if (c == NULL)
    tls_err(err, errlen, "out of memory");
  return c;
}

int
tls_creds_server_new(const struct tls_server_config *cfg,
                     struct tls_creds **out, char *err, size_t errlen)
{
  struct tls_creds *c = tls_creds_alloc(err, errlen);
  int r;

  if (c == NULL)
    return -ENOMEM;
  c->verify_peer = cfg->verify_peer;
  if (cfg->certs_dir == NULL && cfg->psk_file == NULL) {
    tls_err(err, errlen, "TLS needs credentials: --tls-certs DIR or "
            "--tls-psk FILE");
    r = -EINVAL;
    goto fail;
  }
  if (cfg->certs_dir) {
    r = tls_creds_load_x509(c, cfg->certs_dir, cfg->verify_peer, err, errlen);
    if (r < 0)
      goto fail;
  }
  if (cfg->psk_file) {
    r = tls_psk_check(cfg->psk_file, err, errlen);
    if (r < 0)
      goto fail;
    r = gnutls_psk_allocate_server_credentials(&c->psk);
    if (r >= 0)
      r = gnutls_psk_set_server_credentials_file(c->psk, cfg->psk_file);
    if (r < 0) {
      tls_err(err, errlen, "PSK file %s: %s", cfg->psk_file,
              gnutls_strerror(r));
      r = -EINVAL;
      goto fail;
    }
  }
  r = tls_priority(&c->prio, cfg->psk_file != NULL, false, NULL, err,
                   errlen);
  if (r < 0)
    goto fail;
  *out = c;
  return 0;
fail:
  tls_creds_free(c);
  return r;
}

void
tls_creds_free(struct tls_creds *c)
{
  if (c == NULL)
    return;
  if (c->x509)
    gnutls_certificate_free_credentials(c->x509);
  if (c->psk)
    gnutls_psk_free_server_credentials(c->psk);
  if (c->psk_client)
    gnutls_psk_free_client_credentials(c->psk_client);
  if (c->anon)
    gnutls_anon_free_client_credentials(c->anon);
  if (c->prio)
    gnutls_priority_deinit(c->prio);
  free(c);
}

/* ---- client credentials ---- */

/* Finds user's key in a psktool file; *key is a new hex string. */
static int
tls_psk_find(const char *file, const char *user, char **key, char *err,
             size_t errlen)
{
  int r = tls_psk_check(file, err, errlen);
  if (r < 0)
    return r;
  FILE *f = fopen(file, "r");
  if (f == NULL) {
    int e = errno;
    tls_err(err, errlen, "cannot read PSK file %s: %s", file, strerror(e));
    return -e;
  }
  char line[TLS_PSK_LINE_MAX];
  size_t ul = strlen(user);
  r = -ENOENT;
  while (fgets(line, sizeof line, f)) {
    line[strcspn(line, "\r\n")] = '\0';
    if (strncmp(line, user, ul) == 0 && line[ul] == ':') {
      *key = strdup(line + ul + 1);
      r = *key ? 0 : -ENOMEM;
      break;
    }
  }
  explicit_bzero(line, sizeof line);
  fclose(f);
  if (r == -ENOENT) {
    char esc[LOG_ESCAPE_BUF]; /* the name comes from a URI: any bytes */
    tls_err(err, errlen, "PSK file %s has no key for user \"%s\"", file,
            log_escape(esc, user, strlen(user)));
  }
  return r;
}

/* X.509: the CA to check the server with (or the system's, or none
 * when nothing is checked), and a client certificate when the directory
 * has one. */
static int
tls_client_load_x509(gnutls_certificate_credentials_t x509,
                     const struct tls_client_config *cfg, char *err,
                     size_t errlen)
{
  int r;
  if (cfg->ca_file) {
    r = tls_readable(cfg->ca_file);
    int n = r < 0 ? 0 : gnutls_certificate_set_x509_trust_file(
                            x509, cfg->ca_file, GNUTLS_X509_FMT_PEM);
    if (n <= 0) {
      tls_err(err, errlen, "cannot load the CA bundle %s: %s", cfg->ca_file,
              r < 0 ? strerror(-r) : n < 0 ? gnutls_strerror(n)
                                           : "no certificate in it");
      return r < 0 ? r : -EINVAL;
    }
    if (cfg->certs_dir == NULL)
      return 0;
  }
  if (cfg->certs_dir == NULL) {
    if (!cfg->verify_peer)
      return 0;
    r = gnutls_certificate_set_x509_system_trust(x509);
    if (r <= 0) {
      tls_err(err, errlen, "no system CA certificates to verify the server "
              "with (give tls-certificates=DIR)");
      return -ENOENT;
    }
    return 0;
  }
  char *ca = tls_path(cfg->certs_dir, TLS_CA_CERT);
  char *cert = tls_path(cfg->certs_dir, TLS_CLIENT_CERT);
  char *key = tls_path(cfg->certs_dir, TLS_CLIENT_KEY);
  r = -ENOMEM;
  if (ca && cert && key) {
    /* A CA bundle given apart replaces the directory's CA; its client
     * certificate still counts. */
    r = cfg->ca_file ? -ENOENT : tls_readable(ca);
    if (r < 0 && r != -ENOENT)
      tls_err(err, errlen, "cannot read CA certificate %s: %s", ca,
              strerror(-r));
    else if (r == 0) {
      int n = gnutls_certificate_set_x509_trust_file(x509, ca,
                                                     GNUTLS_X509_FMT_PEM);
      if (n <= 0) {
        tls_err(err, errlen, "cannot load CA certificate %s: %s", ca,
                n < 0 ? gnutls_strerror(n) : "no certificate in it");
        r = -EINVAL;
      }
    } else if (cfg->verify_peer && !cfg->ca_file) {
      tls_err(err, errlen, "no %s to verify the server with", ca);
    } else {
      r = 0;
    }
    /* A client certificate is optional; its key is not, once it is
     * there. */
    if (r == 0 && tls_readable(cert) != -ENOENT &&
        (r = tls_pair_readable(cert, key, err, errlen)) == 0) {
      int n = gnutls_certificate_set_x509_key_file(x509, cert, key,
                                                   GNUTLS_X509_FMT_PEM);
      if (n < 0) {
        tls_err(err, errlen, "cannot load %s with key %s: %s", cert, key,
                gnutls_strerror(n));
        r = -EINVAL;
      }
    }
  } else {
    tls_err(err, errlen, "out of memory");
  }
  free(ca);
  free(cert);
  free(key);
  return r;
}

/* PSK: the user's key from the psktool file. */
static int
tls_client_load_psk(gnutls_psk_client_credentials_t psk,
                    const struct tls_client_config *cfg, char *err,
                    size_t errlen)
{
  const char *user = cfg->username;
  if (user == NULL)
    user = getenv("LOGNAME");
  if (user == NULL)
    user = getlogin();
  if (user == NULL) {
    tls_err(err, errlen, "no PSK username (put it in the URI: "
            "nbds://USER@HOST/)");
    return -EINVAL;
  }
  char *hex = NULL;
  int r = tls_psk_find(cfg->psk_file, user, &hex, err, errlen);
  if (r < 0)
    return r;
  gnutls_datum_t key = { (unsigned char *)hex, (unsigned)strlen(hex) };
  r = gnutls_psk_set_client_credentials(psk, user, &key, GNUTLS_PSK_KEY_HEX);
  explicit_bzero(hex, strlen(hex));
  free(hex);
  if (r < 0) {
    tls_err(err, errlen, "PSK file %s: %s", cfg->psk_file,
            gnutls_strerror(r));
    return -EINVAL;
  }
  return 0;
}

int
tls_creds_client_new(const struct tls_client_config *cfg,
                     struct tls_creds **out, char *err, size_t errlen)
{
  struct tls_creds *c = tls_creds_alloc(err, errlen);
  int r;

  if (c == NULL)
    return -ENOMEM;
  if (cfg->anon)
    r = gnutls_anon_allocate_client_credentials(&c->anon);
  else if (cfg->psk_file)
    r = gnutls_psk_allocate_client_credentials(&c->psk_client);
  else
    r = gnutls_certificate_allocate_credentials(&c->x509);
  if (r < 0) {
    c->anon = NULL;
    c->psk_client = NULL;
    c->x509 = NULL;
    tls_err(err, errlen, "GnuTLS: %s", gnutls_strerror(r));
    r = -ENOMEM;
    goto fail;
  }
  if (c->psk_client)
    r = tls_client_load_psk(c->psk_client, cfg, err, errlen);
  else if (c->x509)
    r = tls_client_load_x509(c->x509, cfg, err, errlen);
  if (r < 0)
    goto fail;
  r = tls_priority(&c->prio, cfg->psk_file != NULL, cfg->anon,
                   cfg->priority, err, errlen);
  if (r < 0)
    goto fail;
  *out = c;
  return 0;
fail:
  tls_creds_free(c);
  return r;
}
