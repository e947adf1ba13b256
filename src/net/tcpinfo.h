/* tcpinfo.h: cheap periodic TCP_INFO sampling of one connection, and a
 * summary of what the samples show (stalls, segment fill, in-flight data,
 * RTT, delivery rate, send-buffer and receive-window limits).
 *
 * Use: tcpinfo_init once per connection, tcpinfo_sample every ~200 ms from
 * the connection's own thread or loop (one getsockopt, no allocation, no
 * logging), and tcpinfo_format_json / tcpinfo_format_line when a report is
 * due. The struct is owned by the caller and is not thread-safe; sample and
 * format it from one thread, or copy it under the caller's lock.
 *
 * Counter-based figures (bytes per segment, retransmits, limited time) are
 * deltas between the first and the latest sample, so take the first sample
 * at the start of the phase to be measured (right after connecting, or
 * after the handshake). */
#ifndef NBDFLOW_NET_TCPINFO_H
#define NBDFLOW_NET_TCPINFO_H

#include <stddef.h>
#include <stdint.h>

/* Cumulative kernel counters copied from one sample. Internal to the
 * summary; callers read struct tcpinfo_stats through the format functions
 * or the accessors below. */
struct tcpinfo_counters {
  uint64_t bytes_sent;      /* data bytes sent, retransmissions included */
  uint64_t bytes_retrans;
  uint64_t bytes_acked;
  uint64_t bytes_received;
  uint64_t busy_us;         /* time with data outstanding or queued */
  uint64_t rwnd_limited_us;
  uint64_t sndbuf_limited_us;
  uint32_t data_segs_out;
  uint32_t data_segs_in;
  uint32_t total_retrans;   /* retransmitted segments */
};

struct tcpinfo_stats {
  uint64_t samples;         /* successful getsockopt calls */
  uint64_t errors;          /* failed ones (socket closed, not TCP...) */
  uint64_t stall_samples;   /* see tcpinfo_sample for the test */
  /* Which optional kernel fields the running kernel reported; older
   * kernels return a shorter struct tcp_info. */
  unsigned have_notsent : 1;
  unsigned have_delivery : 1;
  unsigned have_limited : 1; /* busy/rwnd/sndbuf times */
  unsigned have_bytes_sent : 1;
  unsigned have_snd_wnd : 1;

  struct tcpinfo_counters first;  /* from the first successful sample */
  struct tcpinfo_counters last;   /* from the latest one */

  /* Latest values of the gauges. */
  uint32_t snd_mss;
  uint32_t pmtu;
  uint32_t rtt_us;
  uint32_t rttvar_us;
  uint32_t min_rtt_us;
  uint32_t snd_cwnd;        /* segments */
  uint32_t snd_wnd;         /* peer's receive window, bytes */
  uint32_t unacked;         /* segments */
  uint32_t notsent_bytes;
  uint64_t delivery_rate;   /* bytes/s */

  /* Sums and maxima over samples, for means. */
  uint64_t unacked_sum;
  uint32_t unacked_max;
  uint64_t inflight_bytes_sum;
  uint64_t inflight_bytes_max;
  uint64_t rtt_sum_us;
  uint32_t rtt_max_us;
  uint64_t delivery_rate_sum;     /* over samples with a rate reported */
  uint64_t delivery_rate_samples;
  uint64_t delivery_rate_max;
};

/* Zeroes s. */
void tcpinfo_init(struct tcpinfo_stats *s);

/* Takes one sample of TCP socket fd into s. Returns 0, or -errno when
 * getsockopt fails (s->errors counts it, nothing else changes). Safe on
 * any fd: a non-TCP socket fails with -EOPNOTSUPP or -ENOPROTOOPT. */
int tcpinfo_sample(struct tcpinfo_stats *s, int fd);

/* Share of samples that stalled, in percent (0 when no samples). */
double tcpinfo_stall_pct(const struct tcpinfo_stats *s);

/* Mean payload bytes per data segment sent since the first sample; 0 when
 * no data segment was sent. */
double tcpinfo_bytes_per_seg(const struct tcpinfo_stats *s);

/* Writes the summary as one JSON object (no trailing newline) into buf.
 * Fields the kernel did not report are null. Returns the length written,
 * or -ENOSPC if len is too small (1024 bytes always suffice; buf then
 * holds a truncated string). */
int tcpinfo_format_json(const struct tcpinfo_stats *s, char *buf,
                        size_t len);

/* Writes the summary as one human log line (no newline):
 * "samples N, stall P%, B B/seg (mss M, P%), inflight S seg / K KiB
 *  (max S / K KiB), rtt R ms (min R, max R, var R), rate M Mbit/s
 *  (max M), sndbuf-limited P%, rwnd-limited P%, retrans N", with
 * "no data sent (mss M)" in place of the B/seg part when nothing was
 * sent, and the rate and the limited shares only when the kernel
 * reports them. Returns as tcpinfo_format_json. */
int tcpinfo_format_line(const struct tcpinfo_stats *s, char *buf,
                        size_t len);

#endif
