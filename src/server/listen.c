/* listen.c: the server's start and stop, its listeners and event loops:
 * accepting, handing sockets to the loop with the fewest connections
 * (also those a session of xapi.c hands over, server_adopt), each loop's
 * periodic work, and the shutdown drain. What a connection does on its
 * loop is conn.c's. See server.h for the threading rules. */
#include "server.h"
#include "server_priv.h"
#include "server/xapi.h"

#include <ctype.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "net/sock.h"
#include "util/log.h"

uint64_t
server_stopping(struct server *s)
{
  return __atomic_load_n(&s->stop_deadline_ms, __ATOMIC_ACQUIRE);
}

/* ---- accepting ---- */

/* Counts an accepted socket in and picks the loop with the fewest
 * connections for it. Returns NULL, the socket closed, when
 * --max-connections is reached or the handoff cannot grow. */
static struct sloop *
server_assign(struct server *s, int fd)
{
  struct sloop *sl = NULL;
  int was = 0;
  pthread_mutex_lock(&s->lock);
  if (s->cfg.max_connections && s->nconns >= s->cfg.max_connections) {
    was = s->nconns;
  } else {
    sl = &s->loops[0];
    for (int i = 1; i < s->nloops; i++)
      if (s->loops[i].nowned < sl->nowned)
        sl = &s->loops[i];
    if (sl != &s->loops[0] && sl->nhandoff == sl->handoff_cap) {
      int cap = sl->handoff_cap ? 2 * sl->handoff_cap : 16;
      struct handoff *h = realloc(sl->handoff, (size_t)cap * sizeof *h);
      if (h == NULL) {
        sl = NULL;
      } else {
        sl->handoff = h;
        sl->handoff_cap = cap;
      }
    }
    if (sl) {
      if (sl != &s->loops[0])
        sl->handoff[sl->nhandoff++] = (struct handoff){ .fd = fd };
      sl->nowned++;
      s->nconns++;
    }
  }
  pthread_mutex_unlock(&s->lock);
  if (sl == NULL) {
    char peer[80];
    sock_peer_name(fd, peer, sizeof peer);
    if (was)
      log_warn("%s: refused: %d connections already (--max-connections)",
               peer, was);
    else
      log_warn("%s: refused: out of memory", peer);
    close(fd);
  }
  return sl;
}

int
server_take_slot(struct server *s)
{
  int r = 0;
  pthread_mutex_lock(&s->lock);
  if (s->cfg.max_connections && s->nconns >= s->cfg.max_connections)
    r = -EBUSY;
  else
    s->nconns++;
  pthread_mutex_unlock(&s->lock);
  return r;
}

void
server_release_slot(struct server *s)
{
  pthread_mutex_lock(&s->lock);
  s->nconns--;
  pthread_mutex_unlock(&s->lock);
}

int
server_adopt(struct server *s, int fd, const struct transport *tls,
             struct export *dflt)
{
  if (server_stopping(s))
    return -ESHUTDOWN; /* the loops drain: one may have stopped already */
  pthread_mutex_lock(&s->lock);
  struct sloop *sl = &s->loops[0];
  for (int i = 1; i < s->nloops; i++)
    if (s->loops[i].nowned < sl->nowned)
      sl = &s->loops[i];
  if (sl->nhandoff == sl->handoff_cap) {
    int cap = sl->handoff_cap ? 2 * sl->handoff_cap : 16;
    struct handoff *h = realloc(sl->handoff, (size_t)cap * sizeof *h);
    if (h == NULL) {
      pthread_mutex_unlock(&s->lock);
      return -ENOMEM;
    }
    sl->handoff = h;
    sl->handoff_cap = cap;
  }
  sl->handoff[sl->nhandoff++] = (struct handoff){ .fd = fd, .dflt = dflt };
  if (tls)
    sl->handoff[sl->nhandoff - 1].tls = *tls;
  sl->nowned++;
  pthread_mutex_unlock(&s->lock);
  loop_wake(sl->loop);
  return 0;
}

static void
server_accept(struct loop *l, int lfd, uint32_t events, void *arg)
{
  struct server *s = arg;

  for (;;) {
    int fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      int err = errno;
      if (err == EMFILE || err == ENFILE || err == ENOBUFS ||
          err == ENOMEM) {
        /* The listener stays readable: without a pause the loop would
         * spin here. The tick turns it back on. Another listener of
         * the same batch finds them paused already. */
        if (!s->accept_starved)
          log_warn("accept: %s; pausing new connections until fds are "
                   "free", strerror(err));
        s->accept_starved = true;
        if (s->accept_paused_ms == 0) {
          for (int i = 0; i < s->nlisten; i++)
            loop_mod(l, s->listen_fds[i], 0);
          s->accept_paused_ms = loop_now_ms();
        }
      } else if (err != EAGAIN && err != EINTR && err != ECONNABORTED) {
        log_warn("accept: %s", strerror(err));
      }
      return;
    }
    if (s->accept_starved) {
      s->accept_starved = false;
      log_info("accepting connections again");
    }
    struct sloop *sl = server_assign(s, fd);
    if (sl == &s->loops[0])
      conn_create(sl, fd, NULL, NULL);
    else if (sl)
      loop_wake(sl->loop);
  }
}

/* ---- the loop's periodic work ---- */

/* Shutting down (§Terminating the transmission phase): a connection in
 * transmission is closed once it is between requests with every reply
 * out; new requests meanwhile get ESHUTDOWN and new options
 * ERR_SHUTDOWN. Each loop drains its own connections and stops when
 * none is left, or at the deadline; server_cleanup closes the rest. */
static void
sloop_drain(struct sloop *sl)
{
  struct conn *c, *next;
  for (c = sl->conns; c; c = next) {
    next = c->next;
    if (c->exp == NULL || c->state != CS_REQ_HDR || c->have > 0 ||
        c->in_off < c->in_len)
      continue;
    /* Requests already sent but not yet read get their ESHUTDOWN first
     * ("subsequently received requests SHOULD" get it), instead of a
     * reset. */
    if (sock_readable_bytes(c->fd) > 0 ||
        (c->t.ops->pending && c->t.ops->pending(&c->t) > 0))
      continue;
    pthread_mutex_lock(&c->lock);
    bool idle = c->inflight == 0 && c->sendq == NULL && !c->want_out;
    pthread_mutex_unlock(&c->lock);
    if (idle)
      conn_close(c, NULL);
  }
  /* loops[0] stays up until every loop's connections are gone, so that
   * a second signal is still heard while the others drain. Another loop
   * counts the sockets handed to it and not yet taken up, too (nowned):
   * one accepted just before the signal may still be on its way. */
  pthread_mutex_lock(&sl->srv->lock);
  bool empty = sl == &sl->srv->loops[0] ? sl->srv->nconns == 0
                                        : sl->nowned == 0;
  pthread_mutex_unlock(&sl->srv->lock);
  if (empty || loop_now_ms() >= server_stopping(sl->srv))
    loop_stop(sl->loop);
}

/* Swap switched on after start-up lets tmpfs pages wait for the swap
 * device, and an event loop must not wait for a device: loops[0] looks
 * again at each sweep and moves the writes of swappable exports to the
 * workers while swap is active, and back when it is gone. When
 * /proc/swaps cannot be read (out of file descriptors, say), nothing
 * changes. */
static void
server_watch_swap(struct server *s)
{
  bool any = false;
  for (int i = 0; i < s->nexports; i++)
    any = any || s->exports[i]->swappable;
  if (!any)
    return;
  int swap = export_swap_active();
  if (swap < 0) {
    if (!s->swaps_unreadable)
      log_warn("cannot read /proc/swaps: %s; writes stay where they run "
               "until it can be read", strerror(-swap));
    s->swaps_unreadable = true;
    return;
  }
  if (s->swaps_unreadable)
    log_info("/proc/swaps can be read again");
  s->swaps_unreadable = false;
  bool in_memory = swap == 0;
  for (int i = 0; i < s->nexports; i++) {
    struct export *e = s->exports[i];
    if (!e->swappable ||
        __atomic_load_n(&e->write_in_memory, __ATOMIC_RELAXED) == in_memory)
      continue;
    __atomic_store_n(&e->write_in_memory, in_memory, __ATOMIC_RELAXED);
    if (in_memory && e->read_only)
      log_info("export \"%s\": no swap is active now: READ data leaves "
               "from the file's pages again", e->name);
    else if (in_memory)
      log_info("export \"%s\": no swap is active now: writes up to %u MiB "
               "run on the event loop again", e->name,
               SERVER_INLINE_WRITE >> 20);
    else
      log_info("export \"%s\": swap is active now: %s", e->name,
               e->read_only ? "READ data is read into buffers"
                            : "its writes go to the workers");
  }
}

/* Every loop's periodic work, and its work on being woken: sockets
 * handed over, connections a worker asked about, TCP_INFO samples,
 * handshake deadlines and the shutdown drain; and on loops[0] the
 * listeners' pause and the swap watch. */
static void
sloop_tick(struct loop *l, void *arg)
{
  struct sloop *sl = arg;
  struct server *s = sl->srv;
  struct handoff *fds = NULL;
  int nfds = 0;

  pthread_mutex_lock(&s->lock);
  struct conn *list = sl->resume;
  sl->resume = NULL;
  if (sl->nhandoff > 0) {
    fds = sl->handoff;
    nfds = sl->nhandoff;
    sl->handoff = NULL;
    sl->nhandoff = sl->handoff_cap = 0;
  }
  pthread_mutex_unlock(&s->lock);

  for (int i = 0; i < nfds; i++)
    conn_create(sl, fds[i].fd, &fds[i].tls, fds[i].dflt);
  free(fds);

  while (list) {
    struct conn *c = list;
    /* Take the link before c may be queued again: conn_resume rewrites
     * resume_next as soon as in_resume is false. */
    pthread_mutex_lock(&s->lock);
    list = c->resume_next;
    c->in_resume = false;
    pthread_mutex_unlock(&s->lock);
    if (!c->dead) {
      pthread_mutex_lock(&c->lock);
      bool done = c->closing && c->inflight == 0 && c->sendq == NULL &&
                  !c->want_out; /* TLS may still hold bytes */
      bool failed = c->send_failed;
      pthread_mutex_unlock(&c->lock);
      if (failed) {
        conn_close(c, "sending a reply failed");
      } else if (done) {
        conn_close(c, NULL);
      } else {
        /* A worker resumed reading or wants EPOLLOUT, or the
         * connection's last turn ran out. */
        pthread_mutex_lock(&c->lock);
        conn_update_events(c);
        pthread_mutex_unlock(&c->lock);
        c->yielded = false;
        conn_read(c);
      }
    }
    conn_put(c);
  }

  if (s->cfg.stats)
    for (struct conn *c = sl->conns; c; c = c->next)
      if (c->is_tcp)
        tcpinfo_sample(&c->tcp, c->fd);

  if (server_stopping(s))
    sloop_drain(sl);
  uint64_t now = loop_now_ms();
  if (sl == &s->loops[0] && s->accept_paused_ms &&
      now - s->accept_paused_ms >= 1000) {
    s->accept_paused_ms = 0;
    for (int i = 0; i < s->nlisten; i++)
      loop_mod(l, s->listen_fds[i], EPOLLIN);
  }
  if (sl == &s->loops[0])
    xapi_tick(s);
  if (now - sl->last_sweep_ms < 500)
    return;
  sl->last_sweep_ms = now;
  if (sl == &s->loops[0])
    server_watch_swap(s);
  struct conn *c, *next;
  for (c = sl->conns; c; c = next) {
    next = c->next;
    if (c->deadline_ms && now > c->deadline_ms) {
      char why[96];
      snprintf(why, sizeof why, "handshake not finished within %d s",
               s->cfg.handshake_timeout);
      conn_close(c, why);
    }
  }
}

/* Removes our Unix socket's file, once, and only while it is still ours:
 * a successor that bound the path after our listeners closed keeps its
 * socket. */
static void
server_unlink_unix(struct server *s)
{
  struct stat st;
  if (s->bound_unix && lstat(s->cfg.unix_path, &st) == 0 &&
      st.st_dev == s->unix_dev && st.st_ino == s->unix_ino)
    unlink(s->cfg.unix_path);
  s->bound_unix = false;
}

static void
server_on_signal(struct loop *l, int fd, uint32_t events, void *arg)
{
  struct server *s = arg;
  struct signalfd_siginfo si;
  ssize_t n = read(fd, &si, sizeof si);
  unsigned sig = n == (ssize_t)sizeof si ? si.ssi_signo : 0;

  if (server_stopping(s)) {
    log_info("signal %u again: stopping now", sig);
    for (int i = 0; i < s->nloops; i++)
      loop_stop(s->loops[i].loop);
    return;
  }
  log_info("signal %u: shutting down; requests in flight get %d s",
           sig, SERVER_STOP_GRACE_MS / 1000);
  for (int i = 0; i < s->nlisten; i++) {
    loop_del(l, s->listen_fds[i]);
    close(s->listen_fds[i]);
  }
  s->nlisten = 0;
  xapi_stop_listening(s);
  server_unlink_unix(s); /* the path is free for a successor now */
  __atomic_store_n(&s->stop_deadline_ms, loop_now_ms() + SERVER_STOP_GRACE_MS,
                   __ATOMIC_RELEASE);
  /* Each loop drains its own connections, from its tick. */
  for (int i = 1; i < s->nloops; i++)
    loop_wake(s->loops[i].loop);
  sloop_drain(&s->loops[0]);
}

struct export *
server_find_export(struct server *s, const uint8_t *name, size_t len)
{
  if (len == 0)
    return s->nexports ? s->exports[0] : NULL;
  for (int i = 0; i < s->nexports; i++)
    if (strlen(s->exports[i]->name) == len &&
        memcmp(s->exports[i]->name, name, len) == 0)
      return s->exports[i];
  return NULL;
}

static int
server_listen(struct server *s)
{
  int n = sock_activation_fds(s->listen_fds, SERVER_MAX_LISTEN);
  if (n > 0) {
    s->nlisten = n;
    if (s->cfg.listen || s->cfg.unix_path)
      log_warn("ignoring %s %s: listening on the socket(s) passed by the "
               "service manager instead",
               s->cfg.listen ? "--listen" : "--unix",
               s->cfg.listen ? s->cfg.listen : s->cfg.unix_path);
    log_info("listening on %d socket(s) passed by the service manager", n);
    return 0;
  }
  if (s->cfg.unix_path) {
    int fd = sock_listen_unix(s->cfg.unix_path);
    if (fd < 0) {
      log_error("cannot listen on unix socket %s: %s", s->cfg.unix_path,
                strerror(-fd));
      return fd;
    }
    s->listen_fds[s->nlisten++] = fd;
    struct stat st;
    if (lstat(s->cfg.unix_path, &st) == 0) {
      s->bound_unix = true;
      s->unix_dev = st.st_dev;
      s->unix_ino = st.st_ino;
    }
    log_info("listening on unix socket %s", s->cfg.unix_path);
    return 0;
  }
  const char *spec = s->cfg.listen ? s->cfg.listen : "127.0.0.1";
  char host[256], port[32];
  if (sock_split_hostport(spec, host, port, "10809") < 0) {
    log_error("bad --listen address \"%s\": want HOST:PORT, [IPV6]:PORT "
              "or HOST", spec);
    return -EINVAL;
  }
  char *end;
  unsigned long pn = strtoul(port, &end, 10);
  if (!isdigit((unsigned char)port[0]) || *end || pn > 65535) {
    log_error("bad --listen address \"%s\": the port must be a number "
              "from 0 to 65535 (0: any free port)", spec);
    return -EINVAL;
  }
  n = sock_listen_tcp(host, port, s->listen_fds, SERVER_MAX_LISTEN);
  if (n < 0) {
    /* "::1:20004" is one IPv6 address with the default port, which is
     * rarely what was meant. */
    bool bare_v6 = strchr(host, ':') != NULL && spec[0] != '[';
    const char *hint = bare_v6 ? " (an IPv6 address with a port is written "
                                 "[ADDRESS]:PORT)" : "";
    if (sock_err_is_resolve(n)) {
      log_error("cannot resolve %s: %s%s", host, sock_strerror(n), hint);
      return -EADDRNOTAVAIL;
    }
    log_error("cannot listen on %s port %s: %s%s", host, port, strerror(-n),
              hint);
    return n;
  }
  s->nlisten = n;
  for (int i = 0; i < n; i++) { /* the real port, also for port 0 */
    char name[64];
    sock_local_name(s->listen_fds[i], name, sizeof name);
    log_info("listening on %s", name);
  }
  return 0;
}

/* Each request in flight may hold up to REQ_PIPES pipes (two fds each)
 * for spliced payloads: raise the soft fd limit to the hard one, so that
 * a few busy clients do not starve accept(2) at the usual 1024. */
static void
server_raise_fd_limit(void)
{
  struct rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
    rlim_t was = rl.rlim_cur;
    rl.rlim_cur = rl.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &rl) == 0)
      log_debug("open file limit raised from %llu to %llu",
                (unsigned long long)was, (unsigned long long)rl.rlim_max);
  }
}

static int
server_write_pidfile(const char *path)
{
  char tmp[4096];
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  FILE *f = fopen(tmp, "w");
  int err = 0;
  if (f == NULL)
    err = errno;
  else {
    if (fprintf(f, "%ld\n", (long)getpid()) < 0)
      err = errno ? errno : EIO;
    if (fclose(f) != 0 && err == 0)
      err = errno;
    if (err == 0 && rename(tmp, path) < 0)
      err = errno;
    if (err)
      unlink(tmp);
  }
  if (err) {
    log_error("cannot write pid file %s: %s", path, strerror(err));
    return -err;
  }
  return 0;
}

static void *
sloop_thread(void *arg)
{
  struct sloop *sl = arg;
  prctl(PR_SET_NAME, "nbdflow-loop");
  if (loop_run(sl->loop) < 0)
    log_error("event loop failed: %s", strerror(errno));
  return NULL;
}

/* Sets up the loops, each with its tick; loops[0] runs on the caller. */
static int
server_start_loops(struct server *s)
{
  int n = s->cfg.loops;
  if (n <= 0) {
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    n = cpus < 1 ? 1 : cpus > SERVER_MAX_LOOPS ? SERVER_MAX_LOOPS : (int)cpus;
  }
  s->loops = calloc((size_t)n, sizeof *s->loops);
  if (s->loops == NULL)
    return -ENOMEM;
  for (int i = 0; i < n; i++) {
    struct sloop *sl = &s->loops[i];
    sl->srv = s;
    errno = 0;
    sl->loop = loop_new();
    if (sl->loop == NULL)
      return errno ? -errno : -ENOMEM; /* EMFILE under a tight ulimit -n */
    s->nloops++;
    loop_set_tick(sl->loop, SERVER_TICK_MS, sloop_tick, sl);
  }
  for (int i = 1; i < n; i++) {
    int r = pthread_create(&s->loops[i].thread, NULL, sloop_thread,
                           &s->loops[i]);
    if (r != 0) {
      log_error("cannot start event-loop thread %d: %s", i, strerror(r));
      return -r;
    }
    s->loops[i].running = true;
  }
  log_debug("%d event loop%s", n, n == 1 ? "" : "s");
  return 0;
}

/* After loops[0] has stopped: waits for the others, which have stopped
 * or will at the deadline when shutting down, and are stopped here
 * otherwise (start-up failed). */
static void
server_join_loops(struct server *s)
{
  for (int i = 1; i < s->nloops; i++) {
    struct sloop *sl = &s->loops[i];
    if (!sl->running)
      continue;
    if (!server_stopping(s))
      loop_stop(sl->loop);
    pthread_join(sl->thread, NULL);
    sl->running = false;
  }
}

static void
server_cleanup(struct server *s)
{
  xapi_stop(s); /* its sessions write into exports and hand over fds */
  server_join_loops(s);
  for (int i = 0; i < s->nloops; i++) {
    struct sloop *sl = &s->loops[i];
    while (sl->conns)
      conn_close(sl->conns, NULL);
    for (int j = 0; j < sl->nhandoff; j++) {
      struct handoff *ho = &sl->handoff[j];
      if (ho->tls.ops)
        ho->tls.ops->free(&ho->tls);
      close(ho->fd);
    }
    free(sl->handoff);
  }
  workq_free(s->workq); /* finishes queued requests first */
  for (int i = 0; i < s->nlisten; i++)
    close(s->listen_fds[i]);
  server_unlink_unix(s);
  if (s->wrote_pidfile)
    unlink(s->cfg.pidfile);
  for (int i = 0; i < s->nexports; i++)
    export_close(s->exports[i]);
  free(s->exports);
  tls_creds_free(s->tls);
  for (int i = 0; i < s->nloops; i++) {
    /* Requests the workers just finished may have queued their
     * connection here, each holding a reference. */
    struct conn *c = s->loops[i].resume, *next;
    for (; c; c = next) {
      next = c->resume_next;
      conn_put(c);
    }
    loop_free(s->loops[i].loop);
  }
  free(s->loops);
  pthread_mutex_destroy(&s->lock);
}

int
server_run(struct server_config *cfg, char **export_args, int nexports)
{
  struct server s = { .cfg = *cfg };
  int ret = 1, sfd = -1;
  sigset_t mask;

  pthread_mutex_init(&s.lock, NULL);
  server_raise_fd_limit();
  s.pipe_max = sock_pipe_max_size();
  s.exports = calloc((size_t)nexports, sizeof *s.exports);
  if (s.exports == NULL)
    goto cleanup;
  for (int i = 0; i < nexports; i++) {
    struct export_opts eo = { .read_only = cfg->read_only,
                              .ignore_checksums = cfg->ignore_checksums };
    if (export_open(export_args[i], &eo, &s.exports[i]) < 0)
      goto cleanup;
    s.nexports++;
    if (cfg->description &&
        (s.exports[i]->description = strdup(cfg->description)) == NULL)
      goto cleanup;
  }
  if (cfg->tls_mode != TLS_OFF) {
    char err[512];
    if (tls_creds_server_new(&cfg->tls, &s.tls, err, sizeof err) < 0) {
      log_error("%s", err);
      goto cleanup;
    }
    log_info("TLS %s (%s%s%s)%s",
             cfg->tls_mode == TLS_REQUIRE ? "required" : "offered",
             cfg->tls.certs_dir ? "X.509" : "",
             cfg->tls.certs_dir && cfg->tls.psk_file ? ", " : "",
             cfg->tls.psk_file ? "PSK" : "",
             !cfg->tls.verify_peer ? ""
             : cfg->tls.psk_file ? "; X.509 clients need a certificate from "
                                   "the CA, PSK clients prove their key"
                                 : "; clients need a certificate from the CA");
    if (cfg->tls.verify_peer && cfg->tls_mode == TLS_ON)
      log_warn("--tls-verify-peer with --tls=on: a client that stays in "
               "plaintext needs no certificate; --tls=require demands TLS");
  }
  /* Block the stop signals before any thread starts, so that only the
   * first loop's signalfd sees them. */
  sigemptyset(&mask);
  sigaddset(&mask, SIGINT);
  sigaddset(&mask, SIGTERM);
  /* A hang-up or a quit stops as a TERM does (nbdkit's choice too): by
   * their default actions, they left the pidfile and the socket behind
   * and drained nothing. */
  sigaddset(&mask, SIGHUP);
  sigaddset(&mask, SIGQUIT);
  pthread_sigmask(SIG_BLOCK, &mask, NULL);
  s.workq = workq_new(cfg->threads);
  if (s.workq == NULL) {
    log_error("cannot start %d worker threads: %s", cfg->threads,
              strerror(errno));
    goto cleanup;
  }
  if (server_listen(&s) < 0)
    goto cleanup;
  int r = server_start_loops(&s);
  if (r < 0) {
    log_error("cannot start the event loops: %s", strerror(-r));
    goto cleanup;
  }
  struct loop *main_loop = s.loops[0].loop;
  for (int i = 0; i < s.nlisten; i++) {
    r = loop_add(main_loop, s.listen_fds[i], EPOLLIN, server_accept, &s);
    if (r < 0) {
      log_error("cannot watch the listening socket: %s", strerror(-r));
      goto cleanup;
    }
  }
  if (xapi_start(&s, main_loop) < 0)
    goto cleanup;
  /* The stop signals are blocked: without this descriptor SIGTERM would
   * never reach the server. */
  sfd = signalfd(-1, &mask, SFD_NONBLOCK | SFD_CLOEXEC);
  r = sfd < 0 ? -errno
              : loop_add(main_loop, sfd, EPOLLIN, server_on_signal, &s);
  if (r < 0) {
    log_error("cannot watch the stop signals: %s", strerror(-r));
    goto cleanup;
  }

  if (cfg->pidfile) {
    if (server_write_pidfile(cfg->pidfile) < 0)
      goto cleanup;
    s.wrote_pidfile = true;
  }
  for (int i = 0; i < s.nexports; i++) {
    const struct export *e = s.exports[i];
    char mem[64] = "";
    bool in_memory = e->ops->map != NULL &&
                     __atomic_load_n(&e->write_in_memory, __ATOMIC_RELAXED);
    if (in_memory && e->read_only)
      snprintf(mem, sizeof mem, ", in memory");
    else if (in_memory)
      snprintf(mem, sizeof mem,
               ", in memory (writes up to %u MiB on the event loop)",
               SERVER_INLINE_WRITE >> 20);
    log_info("export \"%s\": %s, %llu bytes%s%s", e->name, export_kind(e),
             (unsigned long long)e->size, e->read_only ? ", read-only" : "",
             mem);
  }
  ret = loop_run(main_loop) < 0 ? 1 : 0;
cleanup:
  if (sfd >= 0)
    close(sfd);
  server_cleanup(&s);
  return ret;
}
