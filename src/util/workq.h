/* workq.h: a fixed pool of threads running queued work items.
 *
 * The item is embedded in the caller's struct (intrusive), so queuing
 * allocates nothing. fn runs on a pool thread and owns the item until it
 * returns; it may block (file I/O), which is the point of the pool. */
#ifndef NBDFLOW_UTIL_WORKQ_H
#define NBDFLOW_UTIL_WORKQ_H

struct work {
  void (*fn)(struct work *w);
  struct work *next; /* queue link, owned by the queue while queued */
};

struct workq;

/* Returns NULL with errno set on failure. */
struct workq *workq_new(int nthreads);
void workq_push(struct workq *q, struct work *w);
/* Finishes the queued items, then joins the threads. */
void workq_free(struct workq *q);

#endif
