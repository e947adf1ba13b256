/* pacing.c: how fast the copy goes and what it says about it: the
 * --rate token bucket, progress (bar, JSON, nbdcopy's FD lines), TCP
 * samples and the stall warning, and the adaptation of the window and
 * of the NBD connection count to the bandwidth and RTT seen. Called
 * from the engine's tick (and eng_rate_allows before each data piece).
 * See engine_priv.h. */
#include "copy/engine_priv.h"

#include <stdio.h>

#include "net/loop.h"
#include "util/log.h"
#include "util/size.h"

/* --rate: a token bucket. Bytes earn o->rate a second, up to one
 * request plus one tick's worth, so that time spent waiting (a
 * reconnection, a stretch of zeroes) earns no burst; it starts with one
 * request's worth. A piece goes when the bucket holds it (a piece longer
 * than the bucket, when it is full) and takes its bytes, into debt if
 * need be. Zeroing and holes carry no payload and are not counted. The
 * tick (every ENG_RATE_TICK_MS then) issues what time has allowed. */
bool
eng_rate_allows(struct engine *e, uint64_t len)
{
  uint64_t now = loop_now_us();
  double rate = (double)e->o->rate;
  double cap = (double)e->rsize + rate * ENG_RATE_TICK_MS / 1000.0;
  if (e->rate_last_us == 0)
    e->rate_tokens = (double)e->rsize;
  else
    e->rate_tokens += rate * (double)(now - e->rate_last_us) / 1e6;
  if (e->rate_tokens > cap)
    e->rate_tokens = cap;
  e->rate_last_us = now;
  return e->rate_tokens >= ((double)len < cap ? (double)len : cap);
}

#define ENG_PROGRESS_LOG_US 10000000 /* a progress line in a log: 10 s */

void
eng_progress(struct engine *e, bool final)
{
  uint64_t now = loop_now_us();
  const struct copy_stats *st = e->st;
  double secs = (double)(now - e->t_start_us) / 1e6;
  double mibs = secs > 0 ? (double)(st->done - st->resumed) / 1048576.0 /
                               secs : 0;
  uint64_t total = e->size == UINT64_MAX ? 0 : e->size;
  if (e->o->progress == COPY_PROGRESS_FD) {
    /* nbdcopy's format: "N/100" whenever N moves. 100 is the command's
     * to write, once nothing after the transfer can fail it. */
    int pct = total ? (int)(st->done * 100 / total) : 0;
    if (pct > 99)
      pct = 99;
    if (pct != e->fd_percent)
      (void)dprintf(e->o->progress_fd, "%d/100\n", pct);
    e->fd_percent = pct;
  } else if (e->o->progress == COPY_PROGRESS_JSON) {
    if (!final && now - e->t_last_print_us < 1000000)
      return;
    uint64_t rc = e->src->reconnects + (e->dst ? e->dst->reconnects : 0);
    uint64_t rs = e->src->resent_bytes + (e->dst ? e->dst->resent_bytes : 0) +
                  e->replayed;
    fprintf(stderr,
            "{\"phase\": \"%s\", \"done\": %llu, \"total\": %llu, "
            "\"percent\": %.1f, \"seconds\": %.2f, \"mib_per_s\": %.1f, "
            "\"inflight\": %llu, \"reconnects\": %llu, "
            "\"bytes_resent\": %llu, \"rate_limit\": %llu}\n",
            e->o->label, (unsigned long long)st->done,
            (unsigned long long)total,
            total ? 100.0 * (double)st->done / (double)total : 100.0, secs,
            mibs, (unsigned long long)e->inflight, (unsigned long long)rc,
            (unsigned long long)rs, (unsigned long long)e->o->rate);
  } else if (e->o->progress == COPY_PROGRESS_BAR) {
    /* On a terminal a bar redrawn in place; in a log (no terminal) a
     * line every ENG_PROGRESS_LOG_US and one at the end. */
    if (!final && now - e->t_last_print_us <
                      (e->tty ? 200000 : ENG_PROGRESS_LOG_US))
      return;
    char a[32], b[32];
    double frac = total ? (double)st->done / (double)total : 0;
    int fill = (int)(frac * 30);
    double eta = mibs > 0 && total ? (double)(total - st->done) / 1048576.0 / mibs : 0;
    if (e->tty)
      fprintf(stderr, "\r%s [%-30.*s] ", e->o->label, fill,
              "##############################");
    else
      fprintf(stderr, "%s: ", e->o->label);
    fprintf(stderr, "%5.1f%% %s / %s %.0f MiB/s ETA %d:%02d",
            100.0 * frac, size_format(st->done, a, sizeof a),
            size_format(total, b, sizeof b), mibs, (int)eta / 60,
            (int)eta % 60);
    if (e->o->rate)
      fprintf(stderr, " (--rate %.1f MiB/s)",
              (double)e->o->rate / 1048576.0);
    fputc(final || !e->tty ? '\n' : ' ', stderr);
  }
  e->t_last_print_us = now;
}

#define ENG_TCP_SAMPLE_US 190000 /* ~200 ms, tolerating tick jitter */

/* Samples TCP_INFO on both endpoints about every 200 ms and, with
 * --progress, warns once when the NBD side stalls too often. */
void
eng_sample_tcp(struct engine *e)
{
  struct endpoint *eps[2] = { e->src, e->dst };
  struct endpoint *nbd = e->dst && e->dst->ops->tcp_json ? e->dst : e->src;
  uint64_t samples = 0;
  double pct = -1;
  uint64_t now = loop_now_us();
  if (now - e->t_last_tcp_us < ENG_TCP_SAMPLE_US)
    return; /* the tick also runs after every wake-up */
  e->t_last_tcp_us = now;
  for (int i = 0; i < 2; i++) {
    uint64_t n;
    if (eps[i] == NULL || eps[i]->ops->sample_tcp == NULL)
      continue;
    double p = eps[i]->ops->sample_tcp(eps[i], &n);
    if (eps[i] == nbd) {
      pct = p;
      samples = n;
    }
  }
  e->st->stall_pct = pct;
  if (e->o->progress == COPY_PROGRESS_NONE || e->stall_warned ||
      samples < COPY_STALL_WARN_SAMPLES || pct <= COPY_STALL_WARN_PCT)
    return;
  e->stall_warned = true;
  if (e->o->progress == COPY_PROGRESS_JSON) {
    fprintf(stderr, "{\"phase\": \"%s\", \"warning\": \"tcp_stalls\", "
            "\"stall_pct\": %.1f, \"samples\": %llu}\n", e->o->label, pct,
            (unsigned long long)samples);
    return;
  }
  if (e->tty)
    fputc('\n', stderr);
  log_warn("TCP stalls in %.0f%% of samples: small writes wait for delayed "
           "ACKs (Nagle, split writes, one request in flight?); see "
           "'Diagnostic options' in docs/copy.md", pct);
}

/* Lets each NBD endpoint fit its connection count to its own share of
 * the window: 2 x bandwidth x its own RTT (a nearby source is not grown
 * for a far destination), no more than a fixed --inflight allows. Not
 * while the work left is under 4 windows: connections that join then
 * would carry nothing. */
static void
eng_fit_connections(struct engine *e, double bw, const uint32_t rtts[2])
{
  struct endpoint *eps[2] = { e->src, e->dst };
  if (e->size != UINT64_MAX && e->size - e->pos < 4 * e->window)
    return;
  for (int i = 0; i < 2; i++) {
    if (eps[i] == NULL || eps[i]->ops->fit_window == NULL || rtts[i] == 0)
      continue;
    uint64_t want = (uint64_t)(2 * bw * (double)rtts[i] / 1e6);
    if (want > COPY_WINDOW_CAP)
      want = COPY_WINDOW_CAP;
    if (!e->adaptive && want > e->window)
      want = e->window;
    eps[i]->ops->fit_window(eps[i], want);
  }
}

/* Window = 2 x bandwidth x RTT (the smallest RTT the transport saw on
 * each NBD endpoint, the larger of the two), at least a floor of
 * requests that keeps the servers busy, capped. Not floor + 2 x BDP: on
 * a long link that overfills the bottleneck's queue (docs/copy-engine.md,
 * "Adaptive window", gives the losses measured). A window-limited copy
 * still grows: its bandwidth is window / RTT, so the next window
 * doubles.
 * It adapts every 4 RTTs (100 ms .. 1 s): adapting once a second held a
 * long link's first seconds below a small window. Doubling outright
 * while the window held pieces back grew no faster (TCP's own start-up
 * was the bound) and overshot into losses; following the period's own
 * rate while the window held pieces back (at most doubling) does not
 * overshoot, and saved 0.2 s of a 256 MiB copy at 50 ms. A fixed window
 * (--inflight) stays as it is, but the connection count still follows. */
void
eng_adapt(struct engine *e)
{
  uint64_t now = loop_now_us();
  if (now - e->t_last_adapt_us < e->adapt_period_us)
    return;
  double dt = (double)(now - e->t_last_adapt_us) / 1e6;
  uint64_t moved = e->st->copied - e->copied_at_last_adapt;
  if (moved == 0) {
    /* Zeroes and holes only (or a stall): nothing says what the link
     * carries, and shrinking to the floor would only cost a regrowth. */
    e->t_last_adapt_us = now;
    return;
  }
  /* Completions arrive in bursts: over a few RTTs one period can see
   * more than the link carries, so the estimate is smoothed. */
  double raw = (double)moved / dt, bw = raw;
  if (e->bw_est > 0)
    bw = (bw + e->bw_est) / 2;
  e->bw_est = bw;
  bool held = e->window_held;
  e->window_held = false;
  uint32_t rtts[2] = { 0, 0 }, rtt = 0;
  struct endpoint *eps[2] = { e->src, e->dst };
  for (int i = 0; i < 2; i++)
    if (eps[i] && eps[i]->ops->sample_rtt) {
      rtts[i] = eps[i]->ops->sample_rtt(eps[i]);
      if (rtts[i] > rtt)
        rtt = rtts[i];
    }
  eng_fit_connections(e, bw, rtts);
  if (e->adaptive) {
    uint64_t w = (uint64_t)(2 * bw * (double)rtt / 1e6);
    /* Window-limited and growing: the smoothing would halve each step
     * of the start-up; the period's own rate is what the window let
     * through, so follow it, at most doubling. */
    if (held && raw > bw) {
      uint64_t g = (uint64_t)(2 * raw * (double)rtt / 1e6);
      if (g > 2 * e->window)
        g = 2 * e->window;
      if (g > w)
        w = g;
    }
    if (w < COPY_WINDOW_FLOOR_REQUESTS * e->rsize)
      w = COPY_WINDOW_FLOOR_REQUESTS * e->rsize;
    if (w > COPY_WINDOW_CAP)
      w = COPY_WINDOW_CAP;
    e->window = w;
    e->max_bufs = (size_t)((w + e->rsize - 1) / e->rsize) + 1;
  }
  e->t_last_adapt_us = now;
  e->copied_at_last_adapt = e->st->copied;
  e->adapt_period_us = ENG_ADAPT_MIN_US;
  if ((uint64_t)rtt * 4 > e->adapt_period_us)
    e->adapt_period_us = (uint64_t)rtt * 4;
  if (e->adapt_period_us > ENG_ADAPT_MAX_US)
    e->adapt_period_us = ENG_ADAPT_MAX_US;
}

/* The probe. Over TCP to this host the receiver copies every payload
 * out of the socket whichever way it was sent, and which of sendfile
 * (no copy in the sender, page references queued) and buffers (a
 * worker's pread in parallel, then sendmsg) moves data faster depends
 * on the machine: on one 2-core machine sendmsg of 512 KiB took 96 us
 * against sendfile's 227 us, on another of the same kernel 281 us
 * against 144 us. So a copy large enough times both. After a warm-up of
 * one turn (sendfile: connections join, the opening piece goes), eight
 * turns of turn_bytes of data each (size / 64, 8 to 32 MiB: turns of at
 * most 16 MiB lasted 2-5 ms into our server, near a scheduler tick, and
 * chose buffers for a third of the copies of the issue-31 VHD, which
 * then took 1.6x as long), in the order S B B S B S S B (each half of a
 * Thue-Morse sequence sums to the same under a steady drift). When the
 * two paths come within 10% of each other either way, eight turns more
 * follow, in the order B S S B S B B S, and the sixteen decide.
 * Pieces leave at the pace the window frees, that is at the pace the
 * pieces one window earlier complete; so a turn's clock starts once it
 * has issued one window (the turn before is still completing then) and
 * stops at the issue of the next turn's first piece. The longest turn of
 * each path is dropped (one preemption is not the path's fault).
 * sendfile is taken only when it took under 90% of the buffers' time:
 * into a freshly started nbdkit over TCP its turns measured close to
 * the buffers' while the whole copy took 1.4x as long (1.79 s against
 * 1.19-1.39 s for 2 GiB), so a near tie keeps buffers.
 * Where the destination has several connections of its own choosing, a
 * second stage of the same form then sets one against all (O A A O A O
 * O A): on two cores shared with the server, one connection took 0.8x
 * the time of four into our server and 0.9x into nbdkit, but 1.2x into
 * nbd-server (a process per connection), so the server decides. All
 * are kept only when they took under 90% of the time of one: a near tie
 * keeps one. */
void
eng_probe_setup(struct engine *e)
{
  /* What this run copies: a resumed copy starts at o->start. */
  uint64_t n = e->size == UINT64_MAX ? 0
             : e->size - eng_min(e->o->start, e->size);
  if (e->o->rate || n < ENG_PROBE_MIN)
    return; /* paced, or too short to time: buffers */
  uint64_t t = n / 64;
  if (t < (UINT64_C(8) << 20))
    t = UINT64_C(8) << 20;
  if (t > ENG_PROBE_TURN_MAX)
    t = ENG_PROBE_TURN_MAX;
  t = (t + e->rsize - 1) / e->rsize * e->rsize;
  e->probe = (struct eng_probe){ .on = true, .stage = ENG_PROBE_PATH,
                                 .of = COPY_PROBE_TURNS, .turn_bytes = t,
                                 .left = t };
  e->send_file = true;
  /* Every connection until the connection stage says otherwise: a copy
   * that ends inside the probe keeps the spread it always had. */
  e->probe.conns = e->dst->ops->spread && e->dst->ops->spread(e->dst, 0);
}

/* Sets what turn i of the stage compares: arm 0 (sendfile; one
 * connection) on the even turns of the Thue-Morse order, arm 1
 * (buffers; every connection) on the odd ones. */
static void
eng_probe_arm(struct engine *e, unsigned i)
{
  struct eng_probe *p = &e->probe;
  p->arm = __builtin_popcount(i) % 2;
  if (p->stage == ENG_PROBE_PATH)
    e->send_file = p->arm == 0;
  else
    e->dst->ops->spread(e->dst, p->arm == 0 ? 1 : 0);
}

/* The stage's verdict once its turns are timed: 1 when the challenger
 * (sendfile; every connection) took under 90% of the other's time, 0
 * when not, -1 when the two came within 10% of each other either way
 * and the stage has not yet been extended. */
static int
eng_probe_verdict(struct eng_probe *p)
{
  unsigned c = p->stage == ENG_PROBE_PATH ? 0 : 1;
  uint64_t ct = p->us[c] - p->worst_us[c];
  uint64_t dt = p->us[!c] - p->worst_us[!c];
  if (p->of == COPY_PROBE_TURNS && ct * 10 >= dt * 9 && ct * 10 < dt * 11)
    return -1;
  p->us[c] = ct;
  p->us[!c] = dt;
  return ct * 10 < dt * 9;
}

/* The data path is chosen: the connection stage follows where the
 * destination spreads its requests (several connections, their count
 * ours). */
static void
eng_probe_path_done(struct engine *e, bool send_file)
{
  struct eng_probe *p = &e->probe;
  e->send_file = send_file;
  p->done = true;
  p->path_turns = p->of;
  p->path_us[0] = p->us[0];
  p->path_us[1] = p->us[1];
  /* Connections that failed to join leave nothing to compare. */
  p->on = p->conns && e->dst->connections >= 2;
  if (!p->on)
    return;
  p->stage = ENG_PROBE_CONNS;
  p->turn = 0;
  p->of = COPY_PROBE_TURNS;
  p->us[0] = p->us[1] = p->worst_us[0] = p->worst_us[1] = 0;
}

void
eng_probe_step(struct engine *e, uint64_t len)
{
  struct eng_probe *p = &e->probe;
  uint64_t now = loop_now_us();
  if (p->left > 0) {
    if (p->lead > 0 && (p->lead = len >= p->lead ? 0 : p->lead - len) == 0)
      p->t_turn_us = now; /* one window issued: the clock starts */
    p->left = len >= p->left ? 0 : p->left - len;
    return;
  }
  /* This piece opens the next turn. */
  if (p->turn > 0) {
    uint64_t d = now - p->t_turn_us;
    p->us[p->arm] += d;
    if (d > p->worst_us[p->arm])
      p->worst_us[p->arm] = d;
  }
  if (p->turn == p->of) {
    int v = eng_probe_verdict(p);
    if (v < 0) {
      p->of = COPY_PROBE_TURNS_MAX; /* unclear: eight turns more */
    } else if (p->stage == ENG_PROBE_PATH) {
      eng_probe_path_done(e, v == 1);
      if (!p->on)
        return;
    } else {
      p->conns_done = true;
      p->all_conns = v == 1;
      e->dst->ops->spread(e->dst, p->all_conns ? 0 : 1);
      p->on = false;
      return;
    }
  }
  eng_probe_arm(e, p->turn);
  p->turn++;
  p->lead = eng_min(e->window, p->turn_bytes / 2);
  p->left = p->turn_bytes;
  eng_probe_step(e, len);
}

void
eng_probe_report(const struct engine *e, struct copy_stats *st)
{
  const struct eng_probe *p = &e->probe;
  /* Turns timed in the stage under way when the copy ended. */
  unsigned timed = p->turn == 0 ? 0 : p->turn - 1;
  st->probed = true;
  st->probe_turn_bytes = p->turn_bytes;
  if (p->done) {
    st->probe_turns = st->probe_of = p->path_turns;
    st->probe_us[0] = p->path_us[0];
    st->probe_us[1] = p->path_us[1];
    st->data_path = e->send_file ? "sendfile" : "buffer";
  } else {
    /* Cut short, the copy took both paths (the warm-up: sendfile). */
    st->probe_turns = timed;
    st->probe_of = p->of;
    st->probe_us[0] = p->us[0];
    st->probe_us[1] = p->us[1];
    st->data_path = p->turn < 2 ? "sendfile" : "mixed";
    return;
  }
  if (p->stage != ENG_PROBE_CONNS)
    return;
  st->conn_probed = true;
  st->conn_probe_turns = p->conns_done ? p->of : timed;
  st->conn_probe_of = p->of;
  st->conn_probe_us[0] = p->us[1]; /* all */
  st->conn_probe_us[1] = p->us[0]; /* one */
  /* Cut short: the first turn takes one connection, the second all. */
  st->conn_choice = p->conns_done ? (p->all_conns ? "all" : "one")
                  : p->turn < 2   ? "one"
                                  : "mixed";
}
