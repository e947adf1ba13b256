/* test-workq.c: unit tests for src/util/workq.{h,c}: each owner's items
 * run in order, and owners with items waiting take turns. */
#include <pthread.h>
#include <stdbool.h>

#include "tap.h"
#include "util/workq.h"

struct item {
  struct work work;
  char name;
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cond = PTHREAD_COND_INITIALIZER;
static bool started, released;
static char order[32];
static unsigned norder;

/* Runs first and holds the pool's one thread until released. */
static void
hold(struct work *w)
{
  (void)w;
  pthread_mutex_lock(&lock);
  started = true;
  pthread_cond_broadcast(&cond);
  while (!released)
    pthread_cond_wait(&cond, &lock);
  pthread_mutex_unlock(&lock);
}

static void
record(struct work *w)
{
  struct item *it = (struct item *)w;
  pthread_mutex_lock(&lock);
  order[norder++] = it->name;
  pthread_mutex_unlock(&lock);
}

int
main(void)
{
  struct workq *q = workq_new(1);
  ok(q != NULL, "a pool of one thread");
  if (q == NULL)
    return tap_done();
  struct workq_owner a = { 0 }, b = { 0 }, c = { 0 };
  struct item blocker = { .work.fn = hold };
  workq_push_owned(q, &blocker.work, &a);
  pthread_mutex_lock(&lock);
  while (!started)
    pthread_cond_wait(&cond, &lock);
  pthread_mutex_unlock(&lock);

  /* Queued while the thread is held: owner a four items, then b one,
   * then c two, then a one more, then an item of the pool's own. */
  static struct item items[] = {
    { .name = '1' }, { .name = '2' }, { .name = '3' }, { .name = '4' },
    { .name = 'b' }, { .name = 'c' }, { .name = 'C' }, { .name = '5' },
    { .name = 'n' },
  };
  struct workq_owner *owners[] = { &a, &a, &a, &a, &b, &c, &c, &a, NULL };
  for (unsigned i = 0; i < sizeof items / sizeof items[0]; i++) {
    items[i].work.fn = record;
    workq_push_owned(q, &items[i].work, owners[i]);
  }
  pthread_mutex_lock(&lock);
  released = true;
  pthread_cond_broadcast(&cond);
  pthread_mutex_unlock(&lock);
  workq_free(q); /* finishes the queued items first */

  order[norder] = '\0';
  /* a, b, c and the pool's own owner take turns in the order they first
   * queued; each owner's items keep their order. */
  ok(strcmp(order, "1bcn2C345") == 0, "turns between owners: %s", order);
  is(a.queued || b.queued || c.queued, 0, "no owner is left queued");
  return tap_done();
}
