/*
 * relay.c - the "switch" between the two VMs of test/softroce/run --hosts 2, and the
 * ibmsg-link command that controls it from inside the VMs (the same program, by its name).
 *
 * Each VM's virtio-net card is a qemu stream socket netdev (-netdev socket,connect=...) that
 * connects to one of the two ports this program listens on (127.0.0.1 only). Qemu frames every
 * Ethernet frame on the stream as a 4-byte big-endian length and the frame. The relay copies
 * frames from one VM to the other, whole, and while the link is cut it reads and drops them:
 * both carriers stay up and neither VM sees a device event, as with a failed switch. A reader
 * that does not keep up stops the relay from reading the sender (no frame is lost while the
 * link is up).
 *
 * Control (files in DIR, which both VMs see read-write): host N writes "cut SEQ", "restore SEQ"
 * or "status SEQ" to DIR/request.N (one write); within 5 ms the relay applies it and
 * answers in DIR/state.N with "up SEQ ..." or "cut SEQ ..." (the state after the request, the
 * same SEQ, and counters). Host N's ibmsg-link waits for that answer, so a cut is in effect when
 * it returns.
 *
 * Usage: relay DIR. Writes "PORT1 PORT2" to DIR/ports once it listens; VM 1 connects to PORT1,
 * VM 2 to PORT2. Exits when both VMs have connected and closed their connection again, when its
 * parent dies, or on SIGTERM/SIGINT.
 *
 * Called as ibmsg-link (test/softroce/run copies it into each VM, linked statically where
 * possible: a process starts in ~15 ms there, a bash script in ~150 ms):
 *   ibmsg-link cut|restore|status
 * writes the request for this host (IBMSG_TEST_HOST_INDEX) into IBMSG_TEST_LINK_DIR and waits
 * for the relay's answer; status prints it without the SEQ ("up forwarded=A,B dropped=C,D").
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define BUF_SIZE (512 * 1024)  /* per direction; a frame is at most ~70 KB */
#define MAX_FRAME (256 * 1024) /* a larger length field means the stream is garbage */
#define CHECK_MS 5             /* control files are read this often */

static const char *dir;
static volatile sig_atomic_t stop;

struct side {
  int listen_fd;
  int fd;       /* -1 before the VM connected and after it closed */
  int seen;     /* it connected once */
  char last_req[128];
};

/* Frames from one side to the other: buf[0 .. len) has been read; the first out bytes of it
 * are complete frames to write (the rest is not decided yet). */
struct dirn {
  int from, to;
  unsigned char buf[BUF_SIZE];
  size_t len, out;
  unsigned long long forwarded, dropped;
};

static struct side sides[2];
static struct dirn dirs[2]; /* dirs[0]: 1 -> 2, dirs[1]: 2 -> 1 */
static int cut;

static void die(const char *what) {
  fprintf(stderr, "softroce/relay: %s: %s\n", what, strerror(errno));
  exit(1);
}

static uint64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static int write_file(const char *name, const char *text) {
  char path[4096], tmp[4100];
  FILE *f;
  snprintf(path, sizeof path, "%s/%s", dir, name);
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  f = fopen(tmp, "w");
  if (!f) return -1;
  fputs(text, f);
  if (fclose(f) != 0) return -1;
  return rename(tmp, path);
}

static int listen_local(void) {
  struct sockaddr_in a;
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) die("socket");
  memset(&a, 0, sizeof a);
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  if (bind(fd, (struct sockaddr *)&a, sizeof a) < 0) die("bind 127.0.0.1:0");
  if (listen(fd, 1) < 0) die("listen");
  return fd;
}

static unsigned port_of(int fd) {
  struct sockaddr_in a;
  socklen_t len = sizeof a;
  if (getsockname(fd, (struct sockaddr *)&a, &len) < 0) die("getsockname");
  return ntohs(a.sin_port);
}

static void side_accept(struct side *s) {
  int one = 1;
  int fd = accept4(s->listen_fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
  if (fd < 0) return;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  s->fd = fd;
  s->seen = 1;
  close(s->listen_fd);
  s->listen_fd = -1;
}

static void side_close(struct side *s) {
  int i;
  if (s->fd < 0) return;
  close(s->fd);
  for (i = 0; i < 2; i++) { /* what was on its way to or from it is gone */
    if (dirs[i].from == s->fd || dirs[i].to == s->fd) dirs[i].len = dirs[i].out = 0;
  }
  s->fd = -1;
}

static uint32_t frame_len(const unsigned char *p) {
  return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

/* Decides the complete frames after d->out: forwarded (kept for writing) or dropped (removed).
 * Returns -1 if the stream is garbage. */
static int dirn_decide(struct dirn *d) {
  uint32_t n;
  while (d->len - d->out >= 4) {
    n = frame_len(d->buf + d->out);
    if (n > MAX_FRAME) return -1;
    if (d->len - d->out < 4 + (size_t)n) break;
    if (cut || d->to < 0) {
      memmove(d->buf + d->out, d->buf + d->out + 4 + n, d->len - d->out - 4 - n);
      d->len -= 4 + n;
      d->dropped++;
    } else {
      d->out += 4 + n;
      d->forwarded++;
    }
  }
  return 0;
}

/* Writes what is decided; 1 if all of it went out. */
static int dirn_flush(struct dirn *d) {
  ssize_t w;
  if (d->out == 0) return 1;
  if (d->to < 0) { /* the receiver is gone: drop */
    memmove(d->buf, d->buf + d->out, d->len - d->out);
    d->len -= d->out;
    d->out = 0;
    return 1;
  }
  w = send(d->to, d->buf, d->out, MSG_NOSIGNAL | MSG_DONTWAIT);
  if (w < 0) return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR ? 0 : -1;
  memmove(d->buf, d->buf + w, d->len - (size_t)w);
  d->len -= (size_t)w;
  d->out -= (size_t)w;
  return d->out == 0;
}

static void apply_request(int host, const char *req) {
  char op[32], seq[96], answer[256];
  if (sscanf(req, "%31s %95s", op, seq) != 2) return;
  if (strcmp(op, "cut") == 0) cut = 1;
  else if (strcmp(op, "restore") == 0) cut = 0;
  else if (strcmp(op, "status") != 0) snprintf(op, sizeof op, "unknown");
  snprintf(answer, sizeof answer, "%s %s forwarded=%llu,%llu dropped=%llu,%llu%s\n",
           cut ? "cut" : "up", seq, dirs[0].forwarded, dirs[1].forwarded, dirs[0].dropped,
           dirs[1].dropped, strcmp(op, "unknown") == 0 ? " error=unknown-request" : "");
  snprintf(op, sizeof op, "state.%d", host + 1);
  if (write_file(op, answer) != 0)
    fprintf(stderr, "softroce/relay: cannot write %s/%s: %s\n", dir, op, strerror(errno));
}

static void check_requests(void) {
  char path[4096], req[128];
  int i, fd;
  ssize_t n;
  for (i = 0; i < 2; i++) {
    snprintf(path, sizeof path, "%s/request.%d", dir, i + 1);
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    n = read(fd, req, sizeof req - 1);
    close(fd);
    if (n <= 0) continue;
    req[n] = 0;
    if (strcmp(req, sides[i].last_req) == 0) continue;
    memcpy(sides[i].last_req, req, (size_t)n + 1);
    apply_request(i, req);
  }
}

static void on_signal(int sig) {
  (void)sig;
  stop = 1;
}

/* --- ibmsg-link ----------------------------------------------------------------------------- */

static int link_main(int argc, char **argv) {
  const char *ldir = getenv("IBMSG_TEST_LINK_DIR"), *host = getenv("IBMSG_TEST_HOST_INDEX");
  char path[4096], req[160], seq[64], got[256], hostbuf[8] = "";
  struct timespec ts, nap = {0, 1000000};
  uint64_t deadline;
  ssize_t n;
  int fd;

  if (argc != 2 || (strcmp(argv[1], "cut") != 0 && strcmp(argv[1], "restore") != 0 &&
                    strcmp(argv[1], "status") != 0)) {
    if (argc == 2 && (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0)) {
      printf("usage: ibmsg-link cut|restore|status\n");
      return 0;
    }
    fprintf(stderr, "usage: ibmsg-link cut|restore|status\n");
    return 2;
  }
  if (!ldir || !*ldir) ldir = "/run/softroce-common/link";
  if (!host || !*host) { /* outside the command's environment: the VM knows its number */
    fd = open("/run/softroce/twohost", O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
      n = read(fd, hostbuf, sizeof hostbuf - 1);
      close(fd);
      if (n > 0) hostbuf[n] = 0;
      hostbuf[strcspn(hostbuf, "\n")] = 0;
    }
    host = hostbuf;
  }
  if (strcmp(host, "1") != 0 && strcmp(host, "2") != 0) {
    fprintf(stderr, "ibmsg-link: not inside a VM of test/softroce/run --hosts 2\n");
    return 1;
  }
  clock_gettime(CLOCK_REALTIME, &ts);
  snprintf(seq, sizeof seq, "%ld%09ld-%ld", (long)ts.tv_sec, ts.tv_nsec, (long)getpid());
  /* One small write: the relay reads the whole line, or an empty file (then it reads again). */
  snprintf(path, sizeof path, "%s/request.%s", ldir, host);
  snprintf(req, sizeof req, "%s %s\n", argv[1], seq);
  fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
  if (fd < 0 || write(fd, req, strlen(req)) != (ssize_t)strlen(req) || close(fd) != 0) {
    fprintf(stderr, "ibmsg-link: cannot write %s: %s\n", path, strerror(errno));
    return 1;
  }
  snprintf(path, sizeof path, "%s/state.%s", ldir, host);
  deadline = now_ms() + 5000;
  while (now_ms() < deadline) {
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
      n = read(fd, got, sizeof got - 1);
      close(fd);
      if (n > 0) {
        char *sp = strchr(got, ' ');
        got[n] = 0;
        if (sp && strncmp(sp + 1, seq, strlen(seq)) == 0 && sp[1 + strlen(seq)] == ' ') {
          if (strstr(got, "error=")) {
            fprintf(stderr, "ibmsg-link: the relay refused '%s': %s", argv[1], got);
            return 1;
          }
          /* "STATE SEQ COUNTERS" -> "STATE COUNTERS" */
          if (strcmp(argv[1], "status") == 0)
            printf("%.*s%s", (int)(sp - got), got, sp + 1 + strlen(seq));
          return 0;
        }
      }
    }
    nanosleep(&nap, NULL);
  }
  fprintf(stderr, "ibmsg-link: the relay did not answer '%s' within 5 s (%s)\n", argv[1], path);
  return 1;
}

int main(int argc, char **argv) {
  char ports[64];
  struct pollfd pfd[4];
  int nfds, i, rc, who[4];
  pid_t parent = getppid();
  uint64_t next_check = 0, now;
  struct sigaction sa;
  const char *base = strrchr(argv[0], '/');

  base = base ? base + 1 : argv[0];
  if (strcmp(base, "ibmsg-link") == 0) return link_main(argc, argv);
  if (argc != 2) {
    fprintf(stderr, "usage: relay DIR (or, named ibmsg-link: ibmsg-link cut|restore|status)\n");
    return 2;
  }
  dir = argv[1];
  prctl(PR_SET_PDEATHSIG, SIGTERM);
  if (getppid() != parent) return 0;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sigaction(SIGTERM, &sa, NULL);
  sigaction(SIGINT, &sa, NULL);
  signal(SIGPIPE, SIG_IGN);

  for (i = 0; i < 2; i++) {
    sides[i].listen_fd = listen_local();
    sides[i].fd = -1;
  }
  snprintf(ports, sizeof ports, "%u %u\n", port_of(sides[0].listen_fd), port_of(sides[1].listen_fd));
  if (write_file("ports", ports) != 0) die("cannot write the ports file");
  check_requests();

  while (!stop) {
    if (sides[0].seen && sides[1].seen && sides[0].fd < 0 && sides[1].fd < 0) break;
    if (getppid() != parent) break;
    dirs[0].from = sides[0].fd;
    dirs[0].to = sides[1].fd;
    dirs[1].from = sides[1].fd;
    dirs[1].to = sides[0].fd;

    nfds = 0;
    for (i = 0; i < 2; i++) {
      struct dirn *d = &dirs[i];
      if (sides[i].listen_fd >= 0) {
        pfd[nfds].fd = sides[i].listen_fd;
        pfd[nfds].events = POLLIN;
        who[nfds++] = 10 + i;
      }
      if (sides[i].fd >= 0) {
        short ev = 0;
        /* Read from side i only while nothing decided for the other side waits to be written
         * (backpressure) and there is room; write to side i when the other direction has some. */
        if (d->out == 0 && d->len < BUF_SIZE) ev |= POLLIN;
        if (dirs[1 - i].out > 0) ev |= POLLOUT;
        pfd[nfds].fd = sides[i].fd;
        pfd[nfds].events = ev;
        who[nfds++] = i;
      }
    }
    now = now_ms();
    rc = poll(pfd, nfds, next_check > now ? (int)(next_check - now) : 0);
    if (rc < 0 && errno != EINTR) die("poll");
    for (i = 0; rc > 0 && i < nfds; i++) {
      int s = who[i];
      if (!pfd[i].revents) continue;
      if (s >= 10) {
        side_accept(&sides[s - 10]);
        continue;
      }
      if (sides[s].fd < 0) continue;
      if (pfd[i].revents & POLLOUT) {
        if (dirn_flush(&dirs[1 - s]) < 0) {
          side_close(&sides[s]);
          continue;
        }
      }
      if (pfd[i].revents & (POLLIN | POLLHUP | POLLERR)) {
        struct dirn *d = &dirs[s];
        ssize_t n;
        int one = 1;
        if (d->len >= BUF_SIZE) continue;
        n = recv(sides[s].fd, d->buf + d->len, BUF_SIZE - d->len, MSG_DONTWAIT);
        if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
          side_close(&sides[s]);
          continue;
        }
        if (n < 0) continue;
        /* Acknowledge at once: qemu's socket has Nagle on, and a delayed ack here would hold
         * its next small frame back for up to 40 ms. */
        setsockopt(sides[s].fd, IPPROTO_TCP, TCP_QUICKACK, &one, sizeof one);
        d->len += (size_t)n;
        if (dirn_decide(d) < 0) {
          fprintf(stderr, "softroce/relay: garbage on the stream of host %d\n", s + 1);
          side_close(&sides[s]);
          continue;
        }
        if (dirn_flush(d) < 0) side_close(&sides[1 - s]);
      }
    }
    now = now_ms();
    if (now >= next_check) {
      check_requests();
      next_check = now + CHECK_MS;
    }
  }
  for (i = 0; i < 2; i++) side_close(&sides[i]);
  return 0;
}
