/* loop.c: see loop.h. */
#include "loop.h"

#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#define LOOP_BATCH 64

struct loop_slot {
  loop_fd_fn fn; /* NULL when the slot is free */
  void *arg;
};

struct loop {
  int epfd;
  int wakefd;
  bool stop; /* atomic: loop_stop may come from another thread */
  struct loop_slot *slots; /* indexed by fd */
  int nslots;
  int tick_ms;
  loop_tick_fn tick_fn;
  void *tick_arg;
  uint64_t next_tick;
};

uint64_t
loop_now_us(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000 + (uint64_t)ts.tv_nsec / 1000;
}

uint64_t
loop_now_ms(void)
{
  return loop_now_us() / 1000;
}

struct loop *
loop_new(void)
{
  struct loop *l = calloc(1, sizeof *l);
  if (l == NULL)
    return NULL;
  l->epfd = epoll_create1(EPOLL_CLOEXEC);
  l->wakefd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (l->epfd < 0 || l->wakefd < 0)
    goto fail;
  struct epoll_event ev = { .events = EPOLLIN, .data.fd = l->wakefd };
  if (epoll_ctl(l->epfd, EPOLL_CTL_ADD, l->wakefd, &ev) < 0)
    goto fail;
  return l;
fail:
  loop_free(l);
  return NULL;
}

void
loop_free(struct loop *l)
{
  if (l == NULL)
    return;
  if (l->epfd >= 0)
    close(l->epfd);
  if (l->wakefd >= 0)
    close(l->wakefd);
  free(l->slots);
  free(l);
}

static int
loop_grow(struct loop *l, int fd)
{
  if (fd < l->nslots)
    return 0;
  int n = l->nslots ? l->nslots : 64;
  while (n <= fd)
    n *= 2;
  struct loop_slot *s = realloc(l->slots, (size_t)n * sizeof *s);
  if (s == NULL)
    return -ENOMEM;
  memset(s + l->nslots, 0, (size_t)(n - l->nslots) * sizeof *s);
  l->slots = s;
  l->nslots = n;
  return 0;
}

int
loop_add(struct loop *l, int fd, uint32_t events, loop_fd_fn fn, void *arg)
{
  int r = loop_grow(l, fd);
  if (r < 0)
    return r;
  struct epoll_event ev = { .events = events, .data.fd = fd };
  if (epoll_ctl(l->epfd, EPOLL_CTL_ADD, fd, &ev) < 0)
    return -errno;
  l->slots[fd].fn = fn;
  l->slots[fd].arg = arg;
  return 0;
}

int
loop_mod(struct loop *l, int fd, uint32_t events)
{
  struct epoll_event ev = { .events = events, .data.fd = fd };
  if (epoll_ctl(l->epfd, EPOLL_CTL_MOD, fd, &ev) < 0)
    return -errno;
  return 0;
}

int
loop_del(struct loop *l, int fd)
{
  if (fd >= 0 && fd < l->nslots)
    l->slots[fd].fn = NULL;
  if (epoll_ctl(l->epfd, EPOLL_CTL_DEL, fd, NULL) < 0)
    return -errno;
  return 0;
}

void
loop_set_tick(struct loop *l, int interval_ms, loop_tick_fn fn, void *arg)
{
  l->tick_ms = interval_ms;
  l->tick_fn = fn;
  l->tick_arg = arg;
  l->next_tick = loop_now_ms() + (uint64_t)interval_ms;
}

void
loop_stop(struct loop *l)
{
  __atomic_store_n(&l->stop, true, __ATOMIC_RELEASE);
  loop_wake(l);
}

void
loop_wake(struct loop *l)
{
  uint64_t one = 1;
  ssize_t r = write(l->wakefd, &one, sizeof one);
  (void)r; /* a full counter already means "wake" */
}

static int
loop_timeout(struct loop *l)
{
  if (l->tick_fn == NULL || l->tick_ms <= 0)
    return -1;
  uint64_t now = loop_now_ms();
  return now >= l->next_tick ? 0 : (int)(l->next_tick - now);
}

static void
loop_tick(struct loop *l, bool woken)
{
  if (l->tick_fn == NULL)
    return;
  uint64_t now = loop_now_ms();
  if (!woken && (l->tick_ms <= 0 || now < l->next_tick))
    return;
  if (l->tick_ms > 0 && now >= l->next_tick)
    l->next_tick = now + (uint64_t)l->tick_ms;
  l->tick_fn(l, l->tick_arg);
}

int
loop_run(struct loop *l)
{
  struct epoll_event evs[LOOP_BATCH];

  while (!__atomic_load_n(&l->stop, __ATOMIC_ACQUIRE)) {
    int n = epoll_wait(l->epfd, evs, LOOP_BATCH, loop_timeout(l));
    if (n < 0) {
      if (errno == EINTR)
        continue;
      return -errno;
    }
    bool woken = false;
    for (int i = 0; i < n; i++) {
      int fd = evs[i].data.fd;
      if (fd == l->wakefd) {
        uint64_t v;
        ssize_t r = read(l->wakefd, &v, sizeof v);
        (void)r;
        woken = true;
        continue;
      }
      if (fd < l->nslots && l->slots[fd].fn)
        l->slots[fd].fn(l, fd, evs[i].events, l->slots[fd].arg);
    }
    loop_tick(l, woken);
  }
  /* The stop is spent: the loop may run again (a copy runs it once to
   * look at its source, then again for the copy). */
  __atomic_store_n(&l->stop, false, __ATOMIC_RELEASE);
  return 0;
}
