/* digest.c: hashing in offset order, for sum and --verify. Pieces pass
 * the ordering gate after their read and are hashed there, whole-stream
 * into copy_opts.hash and per COPY_CHUNK into copy_opts.chunks; holes
 * are hashed as zeroes without being read. See engine_priv.h. */
#include "copy/engine_priv.h"

#include <stdlib.h>

#include "util/hash.h"

static void
eng_chunk_feed(struct engine *e, const uint8_t *p, uint64_t len)
{
  struct copy_chunks *ch = e->o->chunks;
  while (len > 0) {
    if (e->chunk_fill == 0 && p == NULL && len >= COPY_CHUNK) {
      if (ch->n < ch->cap)
        ch->d[ch->n++] = e->zero_chunk_digest; /* whole zero chunk */
      len -= COPY_CHUNK;
      continue;
    }
    uint64_t n = eng_min(len, COPY_CHUNK - e->chunk_fill);
    if (p) {
      XXH3_64bits_update(e->chunk_state, p, (size_t)n);
      p += n;
    } else {
      static const uint8_t z[64 << 10];
      for (uint64_t k = 0; k < n; k += sizeof z)
        XXH3_64bits_update(e->chunk_state, z, (size_t)eng_min(sizeof z, n - k));
    }
    e->chunk_fill += n;
    len -= n;
    if (e->chunk_fill == COPY_CHUNK) {
      if (ch->n < ch->cap)
        ch->d[ch->n++] = XXH3_64bits_digest(e->chunk_state);
      XXH3_64bits_reset(e->chunk_state);
      e->chunk_fill = 0;
    }
  }
}

void
eng_hash_piece(struct engine *e, struct cop *c)
{
  const uint8_t *p = c->buf;
  if (e->o->hash) {
    if (p)
      hash_update(e->o->hash, p, (size_t)c->length);
    else
      hash_update_zeros(e->o->hash, c->length);
  }
  if (e->o->chunks)
    eng_chunk_feed(e, p, c->length);
  e->hash_pos += c->length;
  c->hashed = true;
}

void
eng_finish_chunks(struct engine *e)
{
  struct copy_chunks *ch = e->o->chunks;
  if (ch && e->chunk_fill > 0 && ch->n < ch->cap)
    ch->d[ch->n++] = XXH3_64bits_digest(e->chunk_state);
}

void
copy_chunks_free(struct copy_chunks *c)
{
  free(c->d);
  c->d = NULL;
  c->n = c->cap = 0;
}
