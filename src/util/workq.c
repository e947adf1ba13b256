/* workq.c: see workq.h. */
#include "workq.h"

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <sys/prctl.h>

struct workq {
  pthread_mutex_t lock;
  pthread_cond_t cond;
  /* Owners with items queued, in turn order; protected by lock. */
  struct workq_owner *first, *last;
  struct workq_owner own; /* for workq_push */
  bool stop;
  int nthreads;
  pthread_t *threads;
};

/* Puts o at the back of the ring of owners with items. Under q->lock. */
static void
workq_ring_append(struct workq *q, struct workq_owner *o)
{
  o->next = NULL;
  if (q->last)
    q->last->next = o;
  else
    q->first = o;
  q->last = o;
}

static void *
workq_thread(void *arg)
{
  struct workq *q = arg;
  prctl(PR_SET_NAME, "nbdflow-io"); /* tells workers apart in ps, traces */
  for (;;) {
    pthread_mutex_lock(&q->lock);
    while (q->first == NULL && !q->stop)
      pthread_cond_wait(&q->cond, &q->lock);
    struct workq_owner *o = q->first;
    if (o == NULL) {
      pthread_mutex_unlock(&q->lock);
      return NULL;
    }
    /* The first owner's oldest item; the owner goes to the back of the
     * ring if it has more. */
    struct work *w = o->head;
    o->head = w->next;
    q->first = o->next;
    if (q->first == NULL)
      q->last = NULL;
    if (o->head == NULL) {
      o->tail = NULL;
      o->queued = false;
    } else {
      workq_ring_append(q, o);
    }
    pthread_mutex_unlock(&q->lock);
    w->fn(w);
  }
}

struct workq *
workq_new(int nthreads)
{
  struct workq *q = calloc(1, sizeof *q);
  if (q == NULL)
    return NULL;
  q->threads = calloc((size_t)nthreads, sizeof *q->threads);
  if (q->threads == NULL) {
    free(q);
    return NULL;
  }
  pthread_mutex_init(&q->lock, NULL);
  pthread_cond_init(&q->cond, NULL);
  for (int i = 0; i < nthreads; i++) {
    int r = pthread_create(&q->threads[i], NULL, workq_thread, q);
    if (r != 0) {
      q->nthreads = i;
      workq_free(q);
      errno = r;
      return NULL;
    }
  }
  q->nthreads = nthreads;
  return q;
}

void
workq_push_owned(struct workq *q, struct work *w, struct workq_owner *o)
{
  if (o == NULL)
    o = &q->own;
  w->next = NULL;
  pthread_mutex_lock(&q->lock);
  if (o->tail)
    o->tail->next = w;
  else
    o->head = w;
  o->tail = w;
  if (!o->queued) {
    o->queued = true;
    workq_ring_append(q, o);
  }
  pthread_mutex_unlock(&q->lock);
  /* Signalled after the unlock: a worker woken while we still held the
   * lock would only block on it again (two more futex calls and a switch
   * per item, measured). A worker that misses this signal is not waiting,
   * so it takes the item on its next turn round the loop. */
  pthread_cond_signal(&q->cond);
}

void
workq_push(struct workq *q, struct work *w)
{
  workq_push_owned(q, w, NULL);
}

void
workq_free(struct workq *q)
{
  if (q == NULL)
    return;
  pthread_mutex_lock(&q->lock);
  q->stop = true;
  pthread_cond_broadcast(&q->cond);
  pthread_mutex_unlock(&q->lock);
  for (int i = 0; i < q->nthreads; i++)
    pthread_join(q->threads[i], NULL);
  pthread_mutex_destroy(&q->lock);
  pthread_cond_destroy(&q->cond);
  free(q->threads);
  free(q);
}
