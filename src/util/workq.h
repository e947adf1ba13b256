/* workq.h: a fixed pool of threads running queued work items.
 *
 * The item is embedded in the caller's struct (intrusive), so queuing
 * allocates nothing. fn runs on a pool thread and owns the item until it
 * returns; it may block (file I/O), which is the point of the pool. */
#ifndef NBDFLOW_UTIL_WORKQ_H
#define NBDFLOW_UTIL_WORKQ_H

#include <stdbool.h>

struct work {
  void (*fn)(struct work *w);
  struct work *next; /* queue link, owned by the queue while queued */
};

/* Whose work it is: each owner's items run in the order queued, and the
 * pool takes turns between owners that have items waiting, so one that
 * queues many long items (a client pipelining large zeroings) delays
 * another's by at most the items already running, not by its queue.
 * Zero-initialise; owned by the queue while it has items queued. */
struct workq_owner {
  struct work *head, *tail;
  struct workq_owner *next; /* in the queue's ring of owners with items */
  bool queued;
};

struct workq;

/* Returns NULL with errno set on failure. */
struct workq *workq_new(int nthreads);
/* Queues w for owner o, or for the queue's own owner when o is NULL. */
void workq_push_owned(struct workq *q, struct work *w, struct workq_owner *o);
void workq_push(struct workq *q, struct work *w);
/* Finishes the queued items, then joins the threads. */
void workq_free(struct workq *q);

#endif
