/* hash.c: see hash.h. */
#include "hash.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <nettle/md5.h>
#include <nettle/sha1.h>
#include <nettle/sha2.h>
#include <xxhash.h>

static const char *const hash_names_tab[] = {
  [HASH_XXH128] = "xxh128", [HASH_XXH64] = "xxh64",
  [HASH_SHA256] = "sha256", [HASH_SHA512] = "sha512",
  [HASH_SHA1] = "sha1",     [HASH_MD5] = "md5",
};

/* A read-only page of zeros fed to hashes for holes. */
static const uint8_t hash_zero_page[64 << 10];

int
hash_parse(const char *name, enum hash_algo *algo)
{
  for (size_t i = 0; i < sizeof hash_names_tab / sizeof hash_names_tab[0];
       i++)
    if (strcmp(name, hash_names_tab[i]) == 0) {
      *algo = (enum hash_algo)i;
      return 0;
    }
  return -EINVAL;
}

const char *
hash_name(enum hash_algo algo)
{
  return hash_names_tab[algo];
}

const char *
hash_names(void)
{
  return "xxh128 xxh64 sha256 sha512 sha1 md5";
}

int
hash_init(struct hash_ctx *h, enum hash_algo algo)
{
  h->algo = algo;
  switch (algo) {
  case HASH_XXH128:
    h->state = XXH3_createState();
    if (h->state)
      XXH3_128bits_reset(h->state);
    break;
  case HASH_XXH64:
    h->state = XXH64_createState();
    if (h->state)
      XXH64_reset(h->state, 0);
    break;
  case HASH_SHA256:
    h->state = malloc(sizeof(struct sha256_ctx));
    if (h->state)
      sha256_init(h->state);
    break;
  case HASH_SHA512:
    h->state = malloc(sizeof(struct sha512_ctx));
    if (h->state)
      sha512_init(h->state);
    break;
  case HASH_SHA1:
    h->state = malloc(sizeof(struct sha1_ctx));
    if (h->state)
      sha1_init(h->state);
    break;
  case HASH_MD5:
    h->state = malloc(sizeof(struct md5_ctx));
    if (h->state)
      md5_init(h->state);
    break;
  }
  return h->state ? 0 : -ENOMEM;
}

void
hash_update(struct hash_ctx *h, const void *p, size_t len)
{
  switch (h->algo) {
  case HASH_XXH128:
    XXH3_128bits_update(h->state, p, len);
    break;
  case HASH_XXH64:
    XXH64_update(h->state, p, len);
    break;
  case HASH_SHA256:
    sha256_update(h->state, len, p);
    break;
  case HASH_SHA512:
    sha512_update(h->state, len, p);
    break;
  case HASH_SHA1:
    sha1_update(h->state, len, p);
    break;
  case HASH_MD5:
    md5_update(h->state, len, p);
    break;
  }
}

void
hash_update_zeros(struct hash_ctx *h, uint64_t len)
{
  while (len > 0) {
    size_t n = len > sizeof hash_zero_page ? sizeof hash_zero_page
                                           : (size_t)len;
    hash_update(h, hash_zero_page, n);
    len -= n;
  }
}

size_t
hash_final(struct hash_ctx *h, uint8_t out[HASH_MAX_DIGEST])
{
  size_t n = 0;
  switch (h->algo) {
  case HASH_XXH128: {
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, XXH3_128bits_digest(h->state));
    memcpy(out, &c, n = sizeof c);
    break;
  }
  case HASH_XXH64: {
    XXH64_canonical_t c;
    XXH64_canonicalFromHash(&c, XXH64_digest(h->state));
    memcpy(out, &c, n = sizeof c);
    break;
  }
  case HASH_SHA256:
    sha256_digest(h->state, n = SHA256_DIGEST_SIZE, out);
    break;
  case HASH_SHA512:
    sha512_digest(h->state, n = SHA512_DIGEST_SIZE, out);
    break;
  case HASH_SHA1:
    sha1_digest(h->state, n = SHA1_DIGEST_SIZE, out);
    break;
  case HASH_MD5:
    md5_digest(h->state, n = MD5_DIGEST_SIZE, out);
    break;
  }
  hash_discard(h);
  return n;
}

void
hash_discard(struct hash_ctx *h)
{
  if (h->state == NULL)
    return;
  if (h->algo == HASH_XXH128)
    XXH3_freeState(h->state);
  else if (h->algo == HASH_XXH64)
    XXH64_freeState(h->state);
  else
    free(h->state);
  h->state = NULL;
}

void
hash_hex(const uint8_t *d, size_t len, char *out)
{
  static const char hex[] = "0123456789abcdef";
  for (size_t i = 0; i < len; i++) {
    out[2 * i] = hex[d[i] >> 4];
    out[2 * i + 1] = hex[d[i] & 15];
  }
  out[2 * len] = '\0';
}
