/* linkem.c: a user-space link emulator between two network namespaces.
 *
 * The kernel here has no netem qdisc, so delay, rate and loss are applied
 * by this process: it owns one TUN device in each of two namespaces
 * (created beforehand by netns-up.sh), reads every IP packet that one
 * namespace sends into its TUN, and writes it into the other namespace's
 * TUN once the emulated link would have delivered it.
 *
 * The model, per direction, is one bottleneck link:
 *   arrival -> random loss -> drop-tail queue -> serialisation at --rate
 *   -> propagation delay of --delay-ms -> delivery.
 * A packet of L bytes arriving at t starts serialising at
 * max(t, end of the previous packet's serialisation), finishes L*8/rate
 * later, and is delivered --delay-ms after that. The queue holds the
 * packets whose serialisation has not finished yet; it is bounded in
 * packets and bytes, and a packet that does not fit is dropped (drop-tail,
 * as a router would). Packets on the "wire" (serialised, waiting out the
 * delay) do not count against the queue. Sizes are IP packet sizes; link
 * framing (Ethernet headers, preamble) is not emulated.
 *
 * Release times within one direction never decrease, so each direction is
 * a FIFO ring, and a single timerfd armed at the earliest head release
 * time drives both. One thread, epoll, no locks.
 *
 * Safety: the process only opens TUN devices inside namespaces whose names
 * start with "nbdflow-", and never touches any other interface. It stays in
 * the first namespace after set-up, so netns-down.sh finds it there. */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <linux/if.h>
#include <linux/if_tun.h>
#include <math.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

#include "util/size.h"

#define LINKEM_NS_PREFIX "nbdflow-"
#define LINKEM_NETNS_DIR "/var/run/netns/"
/* Packets read per direction per wake-up, so one busy direction cannot
 * starve the other or the release timer. */
#define LINKEM_READ_BATCH 64

struct linkem_pkt {
  uint64_t ser_done_ns; /* end of serialisation on the bottleneck */
  uint64_t release_ns;  /* delivery time into the far namespace */
  uint32_t len;
  uint8_t *data;        /* owned by the ring slot; allocated on first use,
                           kept until exit, reused for every packet */
};

struct linkem_stats {
  uint64_t pkts_in, bytes_in;
  uint64_t pkts_out, bytes_out;
  uint64_t lost;        /* dropped by --loss */
  uint64_t queue_drops; /* drop-tail */
  uint64_t ring_drops;  /* more packets in flight than ring slots */
  uint64_t write_errs;  /* write into the far TUN failed */
  uint64_t oversize;    /* packet larger than the MTU buffer */
  uint32_t max_queue_pkts;
  uint64_t max_queue_bytes;
  uint32_t max_ring;
};

/* One direction of the link: packets read from in_fd, written to out_fd. */
struct linkem_dir {
  const char *name;     /* "a->b" */
  int in_fd, out_fd;    /* TUN fds, owned by struct linkem */
  struct linkem_pkt *ring;
  uint32_t cap;         /* ring slots */
  uint32_t head;        /* oldest packet (next to deliver) */
  uint32_t ser;         /* oldest packet still serialising */
  uint32_t count;       /* packets in the ring */
  uint32_t q_pkts;      /* packets from ser to the tail */
  uint64_t q_bytes;
  uint64_t link_free_ns; /* when the bottleneck finishes its last packet */
  struct linkem_stats st;
};

struct linkem_cfg {
  const char *ns_a, *ns_b, *dev_a, *dev_b;
  double delay_ms;      /* one way */
  uint64_t rate_bps;    /* bits/s; 0 = unlimited */
  double loss_pct;
  uint64_t queue_pkts;  /* 0 = default */
  uint64_t queue_bytes; /* 0 = default */
  uint32_t ring;
  uint64_t seed;
  double stats_s;       /* periodic stats interval; 0 = only at exit */
  double spin_us;       /* busy-wait this long before each release */
  bool quiet;
};

struct linkem {
  struct linkem_cfg cfg;
  int tun_a, tun_b;
  uint32_t bufsize;     /* MTU + slack: every slot buffer has this size */
  uint64_t delay_ns;
  uint64_t ps_per_byte; /* serialisation time, picoseconds per byte */
  uint64_t qlim_pkts, qlim_bytes;
  double loss_p;        /* probability of loss, 0..1 */
  uint64_t rng;
  int ep, tfd, sfd;
  uint64_t armed_ns;    /* what tfd is armed for; 0 = disarmed */
  uint64_t spin_ns;
  uint64_t next_ns;     /* earliest release pending; 0 = none */
  uint8_t *scratch;     /* bufsize bytes, for packets that are dropped */
  struct linkem_dir dir[2];
};

static void
linkem_err(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static void
linkem_err(const char *fmt, ...)
{
  va_list ap;
  fputs("nbdflow-linkem: ", stderr);
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fputc('\n', stderr);
}

static uint64_t
linkem_now_ns(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* xorshift64*: quality is ample for a loss coin, and it is reproducible
 * from --seed. */
static uint64_t
linkem_rand(struct linkem *le)
{
  uint64_t x = le->rng;
  x ^= x >> 12;
  x ^= x << 25;
  x ^= x >> 27;
  le->rng = x;
  return x * 0x2545F4914F6CDD1DULL;
}

/* "1gbit", "100mbit", "2.5gbit", "800kbit", "1000bit", "125mbps"
 * (bytes/s), or a bare number of bits/s. Decimal multipliers, as tc uses. */
static int
linkem_parse_rate(const char *s, uint64_t *bps)
{
  static const struct {
    const char *suffix;
    double mult;
  } units[] = {
    { "", 1 }, { "bit", 1 }, { "k", 1e3 }, { "kbit", 1e3 }, { "m", 1e6 },
    { "mbit", 1e6 }, { "g", 1e9 }, { "gbit", 1e9 }, { "bps", 8 },
    { "kbps", 8e3 }, { "mbps", 8e6 }, { "gbps", 8e9 },
  };
  char *end;
  errno = 0;
  double v = strtod(s, &end);
  if (errno || end == s || !(v > 0))
    return -EINVAL;
  for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
    if (strcasecmp(end, units[i].suffix) == 0) {
      double r = v * units[i].mult;
      if (r < 1000 || r > 1e12)
        return -ERANGE;
      *bps = (uint64_t)r;
      return 0;
    }
  }
  return -EINVAL;
}

static int
linkem_parse_double(const char *s, double lo, double hi, double *out)
{
  char *end;
  errno = 0;
  double v = strtod(s, &end);
  if (errno || end == s || *end || !(v >= lo && v <= hi))
    return -EINVAL;
  *out = v;
  return 0;
}

/* Opens TUN device dev inside namespace ns (which must carry our prefix)
 * and returns its fd, non-blocking; *mtu receives the device's MTU. The
 * calling thread is left inside ns. Returns -1 after logging. */
static int
linkem_open_tun(const char *ns, const char *dev, int *mtu)
{
  char path[PATH_MAX];
  struct ifreq ifr;
  int nsfd = -1, fd = -1, s = -1;

  if (strncmp(ns, LINKEM_NS_PREFIX, strlen(LINKEM_NS_PREFIX)) != 0) {
    linkem_err("namespace \"%s\": refusing, only %s* namespaces are ours",
               ns, LINKEM_NS_PREFIX);
    return -1;
  }
  if (strlen(dev) >= IFNAMSIZ) {
    linkem_err("device name \"%s\" too long", dev);
    return -1;
  }
  snprintf(path, sizeof path, "%s%s", LINKEM_NETNS_DIR, ns);
  nsfd = open(path, O_RDONLY | O_CLOEXEC);
  if (nsfd < 0) {
    linkem_err("namespace \"%s\": %s (run netns-up.sh first)", ns,
               strerror(errno));
    goto fail;
  }
  if (setns(nsfd, CLONE_NEWNET) < 0) {
    linkem_err("setns \"%s\": %s", ns, strerror(errno));
    goto fail;
  }
  /* The TUN file binds to the namespace current at open time. */
  fd = open("/dev/net/tun", O_RDWR | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    linkem_err("/dev/net/tun: %s", strerror(errno));
    goto fail;
  }
  memset(&ifr, 0, sizeof ifr);
  ifr.ifr_flags = IFF_TUN | IFF_NO_PI;
  memcpy(ifr.ifr_name, dev, strlen(dev));
  if (ioctl(fd, TUNSETIFF, &ifr) < 0) {
    linkem_err("attach to %s in %s: %s", dev, ns, strerror(errno));
    goto fail;
  }
  s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (s < 0 || ioctl(s, SIOCGIFMTU, &ifr) < 0) {
    linkem_err("MTU of %s in %s: %s", dev, ns, strerror(errno));
    goto fail;
  }
  *mtu = ifr.ifr_mtu;
  close(s);
  close(nsfd);
  return fd;

fail:
  if (s >= 0)
    close(s);
  if (fd >= 0)
    close(fd);
  if (nsfd >= 0)
    close(nsfd);
  return -1;
}

/* Queue limit defaults: the bandwidth-delay product of the round trip
 * (what one TCP flow needs queued to keep a drop-tail bottleneck busy
 * through a congestion-window halving), with a floor of 256 packets so
 * that short RTTs still absorb bursts, e.g. a TSO-sized burst from the
 * sender. Without a rate there is no bottleneck and no queue limit. */
static void
linkem_size_queue(struct linkem *le)
{
  if (le->cfg.rate_bps == 0) {
    le->qlim_pkts = UINT64_MAX;
    le->qlim_bytes = UINT64_MAX;
    return;
  }
  double bdp = (double)le->cfg.rate_bps / 8.0 * 2.0 * le->cfg.delay_ms / 1e3;
  uint64_t floor_bytes = 256ull * le->bufsize;
  uint64_t bytes = bdp > (double)floor_bytes ? (uint64_t)bdp : floor_bytes;
  le->qlim_bytes = le->cfg.queue_bytes ? le->cfg.queue_bytes : bytes;
  le->qlim_pkts = le->cfg.queue_pkts ? le->cfg.queue_pkts : UINT64_MAX;
  if (le->cfg.queue_pkts && !le->cfg.queue_bytes)
    le->qlim_bytes = UINT64_MAX;
}

static int
linkem_dir_init(struct linkem_dir *d, const char *name, int in_fd,
                int out_fd, uint32_t cap)
{
  memset(d, 0, sizeof *d);
  d->name = name;
  d->in_fd = in_fd;
  d->out_fd = out_fd;
  d->cap = cap;
  d->ring = calloc(cap, sizeof *d->ring);
  if (d->ring == NULL) {
    linkem_err("ring of %u slots: out of memory", cap);
    return -1;
  }
  return 0;
}

/* Moves the serialisation pointer past packets that finished by now. */
static void
linkem_dir_advance(struct linkem_dir *d, uint64_t now)
{
  while (d->q_pkts > 0 && d->ring[d->ser].ser_done_ns <= now) {
    d->q_bytes -= d->ring[d->ser].len;
    d->q_pkts--;
    d->ser = (d->ser + 1) % d->cap;
  }
}

/* Admits the packet just read into the tail slot, or drops it. */
static void
linkem_dir_admit(struct linkem *le, struct linkem_dir *d, uint32_t len,
                 uint64_t now)
{
  uint32_t tail = (d->head + d->count) % d->cap;
  struct linkem_pkt *p = &d->ring[tail];

  d->st.pkts_in++;
  d->st.bytes_in += len;
  /* The top 53 bits of the generator as a uniform double in [0, 1). */
  if (le->loss_p > 0
      && (double)(linkem_rand(le) >> 11) * 0x1.0p-53 < le->loss_p) {
    d->st.lost++;
    return;
  }
  linkem_dir_advance(d, now);
  if (d->q_pkts + 1 > le->qlim_pkts || d->q_bytes + len > le->qlim_bytes) {
    d->st.queue_drops++;
    return;
  }
  if (le->ps_per_byte) {
    uint64_t start = d->link_free_ns > now ? d->link_free_ns : now;
    d->link_free_ns = start + (len * le->ps_per_byte + 999) / 1000;
    p->ser_done_ns = d->link_free_ns;
  } else {
    p->ser_done_ns = now;
  }
  p->release_ns = p->ser_done_ns + le->delay_ns;
  p->len = len;
  if (d->q_pkts == 0)
    d->ser = tail;
  d->q_pkts++;
  d->q_bytes += len;
  d->count++;
  if (d->q_pkts > d->st.max_queue_pkts)
    d->st.max_queue_pkts = d->q_pkts;
  if (d->q_bytes > d->st.max_queue_bytes)
    d->st.max_queue_bytes = d->q_bytes;
  if (d->count > d->st.max_ring)
    d->st.max_ring = d->count;
}

/* Reads up to a batch of packets from the direction's input TUN. Returns
 * 0, or -1 on a fatal read error (device gone). */
static int
linkem_dir_read(struct linkem *le, struct linkem_dir *d)
{
  for (int i = 0; i < LINKEM_READ_BATCH; i++) {
    uint32_t tail = (d->head + d->count) % d->cap;
    uint8_t *buf = le->scratch;
    bool have_slot = d->count < d->cap;

    if (have_slot) {
      if (d->ring[tail].data == NULL) {
        d->ring[tail].data = malloc(le->bufsize);
        if (d->ring[tail].data == NULL)
          have_slot = false;
      }
      if (have_slot)
        buf = d->ring[tail].data;
    }
    ssize_t n = read(d->in_fd, buf, le->bufsize);
    if (n < 0) {
      if (errno == EAGAIN || errno == EINTR)
        return 0;
      linkem_err("%s: read: %s", d->name, strerror(errno));
      return -1;
    }
    if (n == 0)
      return 0;
    if ((uint32_t)n >= le->bufsize) {
      d->st.pkts_in++;
      d->st.oversize++;
      continue;
    }
    if (!have_slot) {
      d->st.pkts_in++;
      d->st.ring_drops++;
      continue;
    }
    linkem_dir_admit(le, d, (uint32_t)n, linkem_now_ns());
  }
  return 0;
}

/* Delivers every packet due by now. */
static void
linkem_dir_release(struct linkem_dir *d, uint64_t now)
{
  linkem_dir_advance(d, now);
  while (d->count > 0 && d->ring[d->head].release_ns <= now) {
    struct linkem_pkt *p = &d->ring[d->head];
    /* release >= ser_done, so advance() already moved ser past it. */
    ssize_t n = write(d->out_fd, p->data, p->len);
    if (n == (ssize_t)p->len) {
      d->st.pkts_out++;
      d->st.bytes_out += p->len;
    } else {
      d->st.write_errs++;
    }
    d->head = (d->head + 1) % d->cap;
    d->count--;
  }
}

/* Arms the timer spin_ns before the earliest head release, if that
 * changed, and records the release time in le->next_ns. */
static int
linkem_arm(struct linkem *le)
{
  uint64_t next = 0;
  for (int i = 0; i < 2; i++) {
    struct linkem_dir *d = &le->dir[i];
    if (d->count > 0 && (next == 0 || d->ring[d->head].release_ns < next))
      next = d->ring[d->head].release_ns;
  }
  le->next_ns = next;
  uint64_t wake = next > le->spin_ns ? next - le->spin_ns : next;
  if (next && wake == 0)
    wake = 1;
  if (wake == le->armed_ns)
    return 0;
  struct itimerspec its = { 0 };
  if (wake) {
    its.it_value.tv_sec = (time_t)(wake / 1000000000u);
    its.it_value.tv_nsec = (long)(wake % 1000000000u);
  }
  if (timerfd_settime(le->tfd, TFD_TIMER_ABSTIME, &its, NULL) < 0) {
    linkem_err("timerfd_settime: %s", strerror(errno));
    return -1;
  }
  le->armed_ns = wake;
  return 0;
}

static void
linkem_print_stats(const struct linkem *le, const char *when)
{
  if (le->cfg.quiet)
    return;
  for (int i = 0; i < 2; i++) {
    const struct linkem_dir *d = &le->dir[i];
    const struct linkem_stats *st = &d->st;
    fprintf(stderr,
            "nbdflow-linkem: %s %s: in %llu pkts %llu B, out %llu pkts "
            "%llu B, lost %llu, queue drops %llu, ring drops %llu, "
            "oversize %llu, write errors %llu, max queue %u pkts %llu B, "
            "max in flight %u pkts\n",
            when, d->name, (unsigned long long)st->pkts_in,
            (unsigned long long)st->bytes_in,
            (unsigned long long)st->pkts_out,
            (unsigned long long)st->bytes_out,
            (unsigned long long)st->lost,
            (unsigned long long)st->queue_drops,
            (unsigned long long)st->ring_drops,
            (unsigned long long)st->oversize,
            (unsigned long long)st->write_errs, st->max_queue_pkts,
            (unsigned long long)st->max_queue_bytes, st->max_ring);
  }
}

/* Serves until SIGINT/SIGTERM. Returns the exit status. */
static int
linkem_run(struct linkem *le)
{
  struct epoll_event evs[8];
  uint64_t next_stats = 0;

  if (le->cfg.stats_s > 0)
    next_stats = linkem_now_ns() + (uint64_t)(le->cfg.stats_s * 1e9);
  for (;;) {
    /* Within spin_ns of a release, poll instead of sleeping: waking from
     * idle costs tens of microseconds on a virtual machine, which would
     * otherwise be added to every packet's delay. */
    int timeout = next_stats ? 1000 : -1;
    if (le->next_ns && le->next_ns <= linkem_now_ns() + le->spin_ns)
      timeout = 0;
    int n = epoll_wait(le->ep, evs, 8, timeout);
    if (n < 0) {
      if (errno == EINTR)
        continue;
      linkem_err("epoll_wait: %s", strerror(errno));
      return 1;
    }
    for (int i = 0; i < n; i++) {
      int fd = evs[i].data.fd;
      if (fd == le->sfd) {
        struct signalfd_siginfo si;
        ssize_t r = read(le->sfd, &si, sizeof si);
        (void)r;
        return 0;
      } else if (fd == le->tfd) {
        uint64_t ticks;
        ssize_t r = read(le->tfd, &ticks, sizeof ticks);
        (void)r;
        le->armed_ns = 0; /* a one-shot timer that fired is disarmed */
      } else {
        struct linkem_dir *d = fd == le->tun_a ? &le->dir[0] : &le->dir[1];
        if (linkem_dir_read(le, d) < 0)
          return 1;
      }
    }
    uint64_t now = linkem_now_ns();
    linkem_dir_release(&le->dir[0], now);
    linkem_dir_release(&le->dir[1], now);
    if (linkem_arm(le) < 0)
      return 1;
    if (next_stats && now >= next_stats) {
      linkem_print_stats(le, "periodic");
      next_stats = now + (uint64_t)(le->cfg.stats_s * 1e9);
    }
  }
}

static int
linkem_watch(struct linkem *le, int fd)
{
  struct epoll_event ev = { .events = EPOLLIN, .data.fd = fd };
  if (epoll_ctl(le->ep, EPOLL_CTL_ADD, fd, &ev) < 0) {
    linkem_err("epoll_ctl: %s", strerror(errno));
    return -1;
  }
  return 0;
}

/* Opens both TUNs (ending inside namespace A), the timer, the signal fd
 * and the epoll set, and sizes the rings and the queue. */
static int
linkem_setup(struct linkem *le)
{
  int mtu_a = 0, mtu_b = 0;
  sigset_t mask;

  /* Both names are checked before either namespace is entered. */
  const char *names[2] = { le->cfg.ns_a, le->cfg.ns_b };
  for (int i = 0; i < 2; i++) {
    if (strncmp(names[i], LINKEM_NS_PREFIX, strlen(LINKEM_NS_PREFIX)) != 0
        || strchr(names[i], '/') != NULL) {
      linkem_err("namespace \"%s\": refusing, only %s* namespaces are ours",
                 names[i], LINKEM_NS_PREFIX);
      return -1;
    }
  }
  if (strcmp(names[0], names[1]) == 0) {
    linkem_err("--ns-a and --ns-b are both \"%s\"", names[0]);
    return -1;
  }
  le->tun_b = linkem_open_tun(le->cfg.ns_b, le->cfg.dev_b, &mtu_b);
  if (le->tun_b < 0)
    return -1;
  le->tun_a = linkem_open_tun(le->cfg.ns_a, le->cfg.dev_a, &mtu_a);
  if (le->tun_a < 0)
    return -1;
  /* One byte more than the largest MTU: a read that fills the buffer
   * means a packet was truncated. */
  le->bufsize = (uint32_t)(mtu_a > mtu_b ? mtu_a : mtu_b) + 1;
  le->scratch = malloc(le->bufsize);
  if (le->scratch == NULL)
    return -1;
  le->delay_ns = (uint64_t)llround(le->cfg.delay_ms * 1e6);
  le->spin_ns = (uint64_t)llround(le->cfg.spin_us * 1e3);
  if (le->cfg.rate_bps)
    le->ps_per_byte = (uint64_t)llround(8e12 / (double)le->cfg.rate_bps);
  le->loss_p = le->cfg.loss_pct / 100.0;
  le->rng = le->cfg.seed ? le->cfg.seed : 0x9E3779B97F4A7C15ULL;
  linkem_size_queue(le);

  if (linkem_dir_init(&le->dir[0], "a->b", le->tun_a, le->tun_b,
                      le->cfg.ring) < 0
      || linkem_dir_init(&le->dir[1], "b->a", le->tun_b, le->tun_a,
                         le->cfg.ring) < 0)
    return -1;

  /* Timer slack would round our wake-ups up by 50 us by default; ask for
   * the finest the kernel gives. */
  prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);
  sigemptyset(&mask);
  sigaddset(&mask, SIGINT);
  sigaddset(&mask, SIGTERM);
  if (sigprocmask(SIG_BLOCK, &mask, NULL) < 0)
    return -1;
  le->sfd = signalfd(-1, &mask, SFD_CLOEXEC);
  le->tfd = timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK);
  le->ep = epoll_create1(EPOLL_CLOEXEC);
  if (le->sfd < 0 || le->tfd < 0 || le->ep < 0) {
    linkem_err("signalfd/timerfd/epoll: %s", strerror(errno));
    return -1;
  }
  if (linkem_watch(le, le->sfd) < 0 || linkem_watch(le, le->tfd) < 0
      || linkem_watch(le, le->tun_a) < 0 || linkem_watch(le, le->tun_b) < 0)
    return -1;
  return 0;
}

static void
linkem_usage(FILE *f)
{
  fprintf(f,
    "usage: nbdflow-linkem [options]\n"
    "Forwards IP packets between TUN devices in two network namespaces\n"
    "(made by netns-up.sh), adding a one-way delay, a rate limit and loss.\n"
    "  --ns-a NAME         first namespace (default nbdflow-a)\n"
    "  --ns-b NAME         second namespace (default nbdflow-b)\n"
    "  --dev NAME          TUN device name in both (default nbdf0)\n"
    "  --delay-ms MS       one-way delay, fractional allowed (default 0)\n"
    "  --rate RATE         bottleneck rate each way: 1gbit, 500mbit, 125mbps\n"
    "                      (default unlimited)\n"
    "  --loss PCT          random loss each way, percent (default 0)\n"
    "  --queue-pkts N      drop-tail queue limit in packets\n"
    "  --queue-bytes SIZE  drop-tail queue limit in bytes (512K, 4M...);\n"
    "                      default: rate x RTT, at least 256 packets\n"
    "  --ring N            packets in flight per direction (default 65536)\n"
    "  --seed N            seed of the loss generator\n"
    "  --spin-us US        busy-wait up to US before each release instead of\n"
    "                      sleeping, for precise short delays (default 100)\n"
    "  --stats SECONDS     print counters periodically (always at exit)\n"
    "  --quiet             no counters at exit\n"
    "Stops on SIGINT or SIGTERM.\n");
}

static int
linkem_parse_args(struct linkem_cfg *c, int argc, char **argv)
{
  static const struct option opts[] = {
    { "ns-a", required_argument, NULL, 'A' },
    { "ns-b", required_argument, NULL, 'B' },
    { "dev", required_argument, NULL, 'D' },
    { "delay-ms", required_argument, NULL, 'd' },
    { "rate", required_argument, NULL, 'r' },
    { "loss", required_argument, NULL, 'l' },
    { "queue-pkts", required_argument, NULL, 'p' },
    { "queue-bytes", required_argument, NULL, 'b' },
    { "ring", required_argument, NULL, 'R' },
    { "seed", required_argument, NULL, 's' },
    { "stats", required_argument, NULL, 'S' },
    { "spin-us", required_argument, NULL, 'w' },
    { "quiet", no_argument, NULL, 'q' },
    { "help", no_argument, NULL, 'h' },
    { NULL, 0, NULL, 0 },
  };
  uint64_t v;
  double ring;
  int o, idx = 0;

  while ((o = getopt_long(argc, argv, "h", opts, &idx)) != -1) {
    switch (o) {
    case 'A': c->ns_a = optarg; break;
    case 'B': c->ns_b = optarg; break;
    case 'D': c->dev_a = c->dev_b = optarg; break;
    case 'q': c->quiet = true; break;
    case 'h': linkem_usage(stdout); exit(0);
    case 'd':
      if (linkem_parse_double(optarg, 0, 10000, &c->delay_ms) < 0)
        goto bad;
      break;
    case 'r':
      if (linkem_parse_rate(optarg, &c->rate_bps) < 0)
        goto bad;
      break;
    case 'l':
      if (linkem_parse_double(optarg, 0, 100, &c->loss_pct) < 0)
        goto bad;
      break;
    case 'p':
      if (size_parse(optarg, &v) < 0 || v == 0)
        goto bad;
      c->queue_pkts = v;
      break;
    case 'b':
      if (size_parse(optarg, &v) < 0 || v == 0)
        goto bad;
      c->queue_bytes = v;
      break;
    case 'R':
      if (linkem_parse_double(optarg, 16, 1 << 22, &ring) < 0)
        goto bad;
      c->ring = (uint32_t)ring;
      break;
    case 's':
      if (size_parse(optarg, &c->seed) < 0)
        goto bad;
      break;
    case 'w':
      if (linkem_parse_double(optarg, 0, 10000, &c->spin_us) < 0)
        goto bad;
      break;
    case 'S':
      if (linkem_parse_double(optarg, 0.1, 3600, &c->stats_s) < 0)
        goto bad;
      break;
    default:
      linkem_usage(stderr);
      return -1;
    }
  }
  if (optind != argc) {
    linkem_err("unexpected argument \"%s\"", argv[optind]);
    return -1;
  }
  return 0;

bad:
  linkem_err("--%s: bad value \"%s\"", opts[idx].name, optarg);
  return -1;
}

int
main(int argc, char **argv)
{
  static struct linkem le;

  le.cfg = (struct linkem_cfg){ .ns_a = "nbdflow-a", .ns_b = "nbdflow-b",
                                .dev_a = "nbdf0", .dev_b = "nbdf0",
                                .ring = 65536, .spin_us = 100 };
  le.tun_a = le.tun_b = le.ep = le.tfd = le.sfd = -1;
  if (linkem_parse_args(&le.cfg, argc, argv) < 0)
    return 2;
  if (linkem_setup(&le) < 0)
    return 1;
  if (!le.cfg.quiet) {
    char rate[32] = "unlimited";
    if (le.cfg.rate_bps)
      snprintf(rate, sizeof rate, "%.1f Mbit/s", le.cfg.rate_bps / 1e6);
    fprintf(stderr,
            "nbdflow-linkem: %s <-> %s: delay %.3f ms each way, rate %s, "
            "loss %.2f%%, queue limit %llu B, MTU %u\n",
            le.cfg.ns_a, le.cfg.ns_b, le.cfg.delay_ms, rate, le.cfg.loss_pct,
            (unsigned long long)le.qlim_bytes, le.bufsize - 1);
  }
  int rc = linkem_run(&le);
  linkem_print_stats(&le, "exit");
  return rc;
}
