/* tcpinfo.c: see tcpinfo.h.
 *
 * Only this file includes <linux/tcp.h>: its struct tcp_info is the
 * kernel's full one, while glibc's <netinet/tcp.h> stops at older fields,
 * and the two headers cannot be included together. */
#include "tcpinfo.h"

#include <errno.h>
#include <linux/tcp.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>

/* True when a struct tcp_info of len bytes, as returned by the running
 * kernel, covers field f. */
#define TI_HAS(len, f) \
  ((len) >= offsetof(struct tcp_info, f) + sizeof(((struct tcp_info *)0)->f))

void
tcpinfo_init(struct tcpinfo_stats *s)
{
  memset(s, 0, sizeof *s);
}

static void
tcpinfo_copy_counters(struct tcpinfo_counters *c, const struct tcp_info *ti)
{
  c->bytes_sent = ti->tcpi_bytes_sent;
  c->bytes_retrans = ti->tcpi_bytes_retrans;
  c->bytes_acked = ti->tcpi_bytes_acked;
  c->bytes_received = ti->tcpi_bytes_received;
  c->busy_us = ti->tcpi_busy_time;
  c->rwnd_limited_us = ti->tcpi_rwnd_limited;
  c->sndbuf_limited_us = ti->tcpi_sndbuf_limited;
  c->data_segs_out = ti->tcpi_data_segs_out;
  c->data_segs_in = ti->tcpi_data_segs_in;
  c->total_retrans = ti->tcpi_total_retrans;
}

/* Bytes sent but not yet acknowledged. bytes_sent counts retransmitted
 * bytes again, so new data sent is bytes_sent - bytes_retrans, which is
 * snd_nxt - snd_una once bytes_acked is taken off. Without those counters
 * (old kernels) fall back to unacked segments times the MSS, an upper
 * bound. */
static uint64_t
tcpinfo_inflight_bytes(const struct tcp_info *ti, bool have_bytes)
{
  if (!have_bytes)
    return (uint64_t)ti->tcpi_unacked * ti->tcpi_snd_mss;
  uint64_t fresh = ti->tcpi_bytes_sent - ti->tcpi_bytes_retrans;
  return fresh > ti->tcpi_bytes_acked ? fresh - ti->tcpi_bytes_acked : 0;
}

int
tcpinfo_sample(struct tcpinfo_stats *s, int fd)
{
  struct tcp_info ti;
  socklen_t len = sizeof ti;

  memset(&ti, 0, sizeof ti);
  if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &len) < 0) {
    int err = errno;
    s->errors++;
    return -err;
  }

  bool first = s->samples == 0;
  s->samples++;
  s->have_notsent = TI_HAS(len, tcpi_notsent_bytes);
  s->have_delivery = TI_HAS(len, tcpi_delivery_rate);
  s->have_limited = TI_HAS(len, tcpi_sndbuf_limited);
  s->have_bytes_sent = TI_HAS(len, tcpi_bytes_retrans);
  s->have_snd_wnd = TI_HAS(len, tcpi_snd_wnd);

  /* Fields beyond len stayed zero from the memset, so copying them is
   * harmless; the have_ bits tell the formatter to print null. */
  tcpinfo_copy_counters(&s->last, &ti);
  if (first)
    s->first = s->last;

  s->snd_mss = ti.tcpi_snd_mss;
  s->pmtu = ti.tcpi_pmtu;
  s->rtt_us = ti.tcpi_rtt;
  s->rttvar_us = ti.tcpi_rttvar;
  s->min_rtt_us = ti.tcpi_min_rtt;
  s->snd_cwnd = ti.tcpi_snd_cwnd;
  s->snd_wnd = ti.tcpi_snd_wnd;
  s->unacked = ti.tcpi_unacked;
  s->notsent_bytes = ti.tcpi_notsent_bytes;
  s->delivery_rate = ti.tcpi_delivery_rate;

  /* A stall: less than one MSS of payload waits in the send queue while
   * earlier data is still unacknowledged. That is the Nagle hold (or a
   * cork that was never released): the kernel will not send a sub-MSS
   * segment until the ACK comes, and a delayed ACK makes that up to
   * ~40 ms. A full MSS waiting is not counted: that is ordinary
   * congestion- or window-limited sending. */
  if (ti.tcpi_notsent_bytes > 0 && ti.tcpi_notsent_bytes < ti.tcpi_snd_mss
      && ti.tcpi_unacked > 0)
    s->stall_samples++;

  uint64_t inflight = tcpinfo_inflight_bytes(&ti, s->have_bytes_sent);
  s->unacked_sum += ti.tcpi_unacked;
  if (ti.tcpi_unacked > s->unacked_max)
    s->unacked_max = ti.tcpi_unacked;
  s->inflight_bytes_sum += inflight;
  if (inflight > s->inflight_bytes_max)
    s->inflight_bytes_max = inflight;

  s->rtt_sum_us += ti.tcpi_rtt;
  if (ti.tcpi_rtt > s->rtt_max_us)
    s->rtt_max_us = ti.tcpi_rtt;

  /* The kernel reports 0 until the first delivery-rate sample exists;
   * leave those out of the mean. */
  if (ti.tcpi_delivery_rate > 0) {
    s->delivery_rate_sum += ti.tcpi_delivery_rate;
    s->delivery_rate_samples++;
    if (ti.tcpi_delivery_rate > s->delivery_rate_max)
      s->delivery_rate_max = ti.tcpi_delivery_rate;
  }
  return 0;
}

double
tcpinfo_stall_pct(const struct tcpinfo_stats *s)
{
  if (s->samples == 0)
    return 0.0;
  return 100.0 * (double)s->stall_samples / (double)s->samples;
}

/* Payload per data segment: the growth of bytes_sent over the growth of
 * data_segs_out between the first and the latest sample. Both counters
 * include retransmissions, and with TSO/GSO data_segs_out counts wire
 * segments, not the super-packets handed to the driver, so the figure is
 * directly comparable with the MSS: a bulk sender sits at the MSS, a
 * sender that writes small messages without corking sits far below. */
double
tcpinfo_bytes_per_seg(const struct tcpinfo_stats *s)
{
  uint32_t segs = s->last.data_segs_out - s->first.data_segs_out;
  if (segs == 0 || !s->have_bytes_sent)
    return 0.0;
  return (double)(s->last.bytes_sent - s->first.bytes_sent) / (double)segs;
}

/* Same for the receiving direction. */
static double
tcpinfo_bytes_per_seg_in(const struct tcpinfo_stats *s)
{
  uint32_t segs = s->last.data_segs_in - s->first.data_segs_in;
  if (segs == 0)
    return 0.0;
  return (double)(s->last.bytes_received - s->first.bytes_received)
         / (double)segs;
}

/* Share of the busy time (the kernel's time with data to send, which
 * includes the limited periods) spent limited by the send buffer (the
 * application did not give the kernel enough, or SO_SNDBUF is too small
 * for bandwidth x RTT) or by the peer's receive window (the receiver's
 * buffer is too small, or it reads too slowly). The kernel measures both
 * in jiffies, so short connections show coarse values. Returns -1 when
 * unknown. */
static double
tcpinfo_limited_pct(const struct tcpinfo_stats *s, bool rwnd)
{
  uint64_t busy = s->last.busy_us - s->first.busy_us;
  if (!s->have_limited || busy == 0)
    return -1.0;
  uint64_t lim = rwnd ? s->last.rwnd_limited_us - s->first.rwnd_limited_us
                      : s->last.sndbuf_limited_us - s->first.sndbuf_limited_us;
  return 100.0 * (double)lim / (double)busy;
}

static double
tcpinfo_mean(uint64_t sum, uint64_t n)
{
  return n ? (double)sum / (double)n : 0.0;
}

/* Appends printf-style output to a fixed buffer, remembering overflow. */
struct tcpinfo_out {
  char *buf;
  size_t len;
  size_t pos;
  bool full;
};

static void
tcpinfo_put(struct tcpinfo_out *o, const char *fmt, ...)
  __attribute__((format(printf, 2, 3)));

static void
tcpinfo_put(struct tcpinfo_out *o, const char *fmt, ...)
{
  va_list ap;

  if (o->full)
    return;
  va_start(ap, fmt);
  int n = vsnprintf(o->buf + o->pos, o->len - o->pos, fmt, ap);
  va_end(ap);
  if (n < 0 || (size_t)n >= o->len - o->pos) {
    o->full = true;
    return;
  }
  o->pos += (size_t)n;
}

static int
tcpinfo_out_end(const struct tcpinfo_out *o)
{
  return o->full ? -ENOSPC : (int)o->pos;
}

/* JSON number or null. Values are finite by construction. */
static void
tcpinfo_put_num(struct tcpinfo_out *o, const char *key, bool have, double v,
                int decimals)
{
  if (have)
    tcpinfo_put(o, ",\"%s\":%.*f", key, decimals, v);
  else
    tcpinfo_put(o, ",\"%s\":null", key);
}

int
tcpinfo_format_json(const struct tcpinfo_stats *s, char *buf, size_t len)
{
  struct tcpinfo_out o = { buf, len, 0, false };
  if (len == 0)
    return -ENOSPC;
  buf[0] = '\0';

  double sndbuf = tcpinfo_limited_pct(s, false);
  double rwnd = tcpinfo_limited_pct(s, true);
  double bps = tcpinfo_bytes_per_seg(s);

  tcpinfo_put(&o, "{\"samples\":%llu,\"stall_samples\":%llu",
              (unsigned long long)s->samples,
              (unsigned long long)s->stall_samples);
  tcpinfo_put_num(&o, "stall_pct", s->have_notsent, tcpinfo_stall_pct(s), 2);
  tcpinfo_put(&o, ",\"mss\":%u,\"pmtu\":%u", s->snd_mss, s->pmtu);
  tcpinfo_put_num(&o, "bytes_sent", s->have_bytes_sent,
                  (double)(s->last.bytes_sent - s->first.bytes_sent), 0);
  tcpinfo_put(&o, ",\"data_segs_out\":%u",
              s->last.data_segs_out - s->first.data_segs_out);
  tcpinfo_put_num(&o, "bytes_per_seg", s->have_bytes_sent, bps, 1);
  tcpinfo_put_num(&o, "bytes_per_seg_pct_mss",
                  s->have_bytes_sent && s->snd_mss > 0,
                  s->snd_mss ? 100.0 * bps / s->snd_mss : 0.0, 1);
  tcpinfo_put(&o, ",\"bytes_received\":%llu,\"data_segs_in\":%u",
              (unsigned long long)(s->last.bytes_received
                                   - s->first.bytes_received),
              s->last.data_segs_in - s->first.data_segs_in);
  tcpinfo_put_num(&o, "bytes_per_seg_in", true, tcpinfo_bytes_per_seg_in(s),
                  1);
  tcpinfo_put_num(&o, "inflight_segs_avg", true,
                  tcpinfo_mean(s->unacked_sum, s->samples), 1);
  tcpinfo_put(&o, ",\"inflight_segs_max\":%u", s->unacked_max);
  tcpinfo_put_num(&o, "inflight_bytes_avg", true,
                  tcpinfo_mean(s->inflight_bytes_sum, s->samples), 0);
  tcpinfo_put(&o, ",\"inflight_bytes_max\":%llu",
              (unsigned long long)s->inflight_bytes_max);
  tcpinfo_put(&o, ",\"rtt_us\":%u,\"rtt_avg_us\":%.0f,\"rtt_min_us\":%u,"
              "\"rtt_max_us\":%u,\"rttvar_us\":%u",
              s->rtt_us, tcpinfo_mean(s->rtt_sum_us, s->samples),
              s->min_rtt_us, s->rtt_max_us, s->rttvar_us);
  tcpinfo_put(&o, ",\"cwnd\":%u", s->snd_cwnd);
  tcpinfo_put_num(&o, "snd_wnd", s->have_snd_wnd, (double)s->snd_wnd, 0);
  tcpinfo_put_num(&o, "delivery_rate_bps", s->have_delivery,
                  8.0 * (double)s->delivery_rate, 0);
  tcpinfo_put_num(&o, "delivery_rate_avg_bps", s->have_delivery,
                  8.0 * tcpinfo_mean(s->delivery_rate_sum,
                                     s->delivery_rate_samples), 0);
  tcpinfo_put_num(&o, "delivery_rate_max_bps", s->have_delivery,
                  8.0 * (double)s->delivery_rate_max, 0);
  tcpinfo_put_num(&o, "busy_ms", s->have_limited,
                  (double)(s->last.busy_us - s->first.busy_us) / 1000.0, 1);
  tcpinfo_put_num(&o, "sndbuf_limited_ms", s->have_limited,
                  (double)(s->last.sndbuf_limited_us
                           - s->first.sndbuf_limited_us) / 1000.0, 1);
  tcpinfo_put_num(&o, "sndbuf_limited_pct", sndbuf >= 0, sndbuf, 1);
  tcpinfo_put_num(&o, "rwnd_limited_ms", s->have_limited,
                  (double)(s->last.rwnd_limited_us
                           - s->first.rwnd_limited_us) / 1000.0, 1);
  tcpinfo_put_num(&o, "rwnd_limited_pct", rwnd >= 0, rwnd, 1);
  tcpinfo_put(&o, ",\"retrans_segs\":%u",
              s->last.total_retrans - s->first.total_retrans);
  tcpinfo_put_num(&o, "retrans_bytes", s->have_bytes_sent,
                  (double)(s->last.bytes_retrans - s->first.bytes_retrans),
                  0);
  tcpinfo_put(&o, "}");
  return tcpinfo_out_end(&o);
}

int
tcpinfo_format_line(const struct tcpinfo_stats *s, char *buf, size_t len)
{
  struct tcpinfo_out o = { buf, len, 0, false };
  if (len == 0)
    return -ENOSPC;
  buf[0] = '\0';

  double bps = tcpinfo_bytes_per_seg(s);
  double sndbuf = tcpinfo_limited_pct(s, false);
  double rwnd = tcpinfo_limited_pct(s, true);

  tcpinfo_put(&o, "samples %llu, stall %.1f%%", (unsigned long long)s->samples,
              tcpinfo_stall_pct(s));
  if (bps > 0)
    tcpinfo_put(&o, ", %.0f B/seg (mss %u, %.0f%%)", bps, s->snd_mss,
                s->snd_mss ? 100.0 * bps / s->snd_mss : 0.0);
  else
    tcpinfo_put(&o, ", no data sent (mss %u)", s->snd_mss);
  tcpinfo_put(&o, ", inflight %.1f seg / %.0f KiB (max %u / %llu KiB)",
              tcpinfo_mean(s->unacked_sum, s->samples),
              tcpinfo_mean(s->inflight_bytes_sum, s->samples) / 1024.0,
              s->unacked_max,
              (unsigned long long)(s->inflight_bytes_max / 1024));
  tcpinfo_put(&o, ", rtt %.2f ms (min %.2f, max %.2f, var %.2f)",
              s->rtt_us / 1000.0, s->min_rtt_us / 1000.0,
              s->rtt_max_us / 1000.0, s->rttvar_us / 1000.0);
  if (s->have_delivery)
    tcpinfo_put(&o, ", rate %.0f Mbit/s (max %.0f)",
                8.0 * (double)s->delivery_rate / 1e6,
                8.0 * (double)s->delivery_rate_max / 1e6);
  if (sndbuf >= 0)
    tcpinfo_put(&o, ", sndbuf-limited %.1f%%, rwnd-limited %.1f%%", sndbuf,
                rwnd);
  tcpinfo_put(&o, ", retrans %u",
              s->last.total_retrans - s->first.total_retrans);
  return tcpinfo_out_end(&o);
}
