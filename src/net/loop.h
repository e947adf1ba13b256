/* loop.h: a small epoll event loop.
 *
 * Callbacks run on the loop's thread. loop_mod and loop_wake may be called
 * from any thread (epoll_ctl and eventfd writes are thread-safe); everything
 * else belongs to the loop's thread. File descriptors index a table, so
 * registering one allocates nothing. */
#ifndef NBDFLOW_NET_LOOP_H
#define NBDFLOW_NET_LOOP_H

#include <stdint.h>
#include <sys/epoll.h>

struct loop;

/* events is a mask of EPOLLIN, EPOLLOUT, EPOLLHUP, EPOLLERR. */
typedef void (*loop_fd_fn)(struct loop *l, int fd, uint32_t events,
                           void *arg);
/* Called every tick interval, and after each loop_wake. */
typedef void (*loop_tick_fn)(struct loop *l, void *arg);

struct loop *loop_new(void);
void loop_free(struct loop *l);

int loop_add(struct loop *l, int fd, uint32_t events, loop_fd_fn fn,
             void *arg);
int loop_mod(struct loop *l, int fd, uint32_t events);
/* Stops watching fd; a callback for it pending in the same batch is
 * dropped. Does not close fd. */
int loop_del(struct loop *l, int fd);

/* One tick function; interval_ms 0 disables. */
void loop_set_tick(struct loop *l, int interval_ms, loop_tick_fn fn,
                   void *arg);

/* Runs until loop_stop, which it then forgets, so that it can run
 * again. Returns 0, or -errno if epoll fails. */
int loop_run(struct loop *l);
void loop_stop(struct loop *l); /* any thread */
/* Wakes the loop from another thread so that the tick function runs. */
void loop_wake(struct loop *l);

/* Monotonic (CLOCK_MONOTONIC) milliseconds and microseconds. */
uint64_t loop_now_ms(void);
uint64_t loop_now_us(void);

#endif
