/* hash.h: one streaming interface over the digests nbdflow offers, all
 * computed by libraries (libxxhash, nettle), never by code of our own.
 *
 * xxh128 (the default) is XXH3-128, printed as xxh128sum prints it;
 * xxh64 as xxhsum prints it; sha256, sha512, sha1, md5 as the coreutils
 * *sum tools print them. */
#ifndef NBDFLOW_UTIL_HASH_H
#define NBDFLOW_UTIL_HASH_H

#include <stddef.h>
#include <stdint.h>

enum hash_algo { HASH_XXH128, HASH_XXH64, HASH_SHA256, HASH_SHA512,
                 HASH_SHA1, HASH_MD5 };

#define HASH_MAX_DIGEST 64

struct hash_ctx {
  enum hash_algo algo;
  void *state; /* library state, owned by the context */
};

/* Returns 0 or -EINVAL for an unknown name. */
int hash_parse(const char *name, enum hash_algo *algo);
const char *hash_name(enum hash_algo algo);
/* Space-separated list of the names hash_parse accepts. */
const char *hash_names(void);

/* Returns 0 or -ENOMEM. hash_final releases the state. */
int hash_init(struct hash_ctx *h, enum hash_algo algo);
void hash_update(struct hash_ctx *h, const void *p, size_t len);
/* Feeds len zero bytes without the caller having to own them. */
void hash_update_zeros(struct hash_ctx *h, uint64_t len);
/* Writes the digest (big-endian canonical form) and returns its length. */
size_t hash_final(struct hash_ctx *h, uint8_t out[HASH_MAX_DIGEST]);
/* Frees the state without a digest (on error paths). */
void hash_discard(struct hash_ctx *h);

/* Lower-case hex of a digest into out (2 * len + 1 bytes). */
void hash_hex(const uint8_t *d, size_t len, char *out);

#endif
