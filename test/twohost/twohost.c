/* twohost.c - helpers for test programs on the two hosts of test/softroce/run --hosts 2 (see
 * twohost.h).
 *
 * Files (IBMSG_TEST_SHARED_DIR is mounted uncached in both VMs, so a file one host renames into
 * place is visible to the other host's next open()):
 *   SHARED/twohost/SCOPE/B-HASH-N.I   host I reached the N-th barrier named B (its name, made
 *                                     safe and hashed), content "name\ndata"
 *   SHARED/twohost/SCOPE/exit.I       written by test/twohost/run when host I's program exited
 *   SHARED/twohost/SCOPE/abandoned.I  prefixes of barriers host I gave up on, one a line
 *   LINKDIR/request.I, LINKDIR/state.I  the relay's control files (test/softroce/relay.c)
 * SCOPE is IBMSG_TWOHOST_SCOPE (test/twohost/run sets one per program run), else "default". */
#define _POSIX_C_SOURCE 200809L

#include "twohost.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define TH_MAX_DATA 200
#define TH_MAX_NAMES 512

static int th_ready = -1; /* -1: not read yet; 0: outside the rig; 1: ready */
static int th_host;
static const char *th_addr4, *th_addr6, *th_peer4, *th_peer6;
static char th_dir[1024];  /* SHARED/twohost/SCOPE */
static char th_linkdir[1024]; /* the relay's control directory */
static char th_err[512];

static struct {
  char *name;
  int count;
} th_names[TH_MAX_NAMES];
static int th_n_names;

static int th_fail(const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 1, 2)))
#endif
    ;

static int th_fail(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(th_err, sizeof th_err, fmt, ap);
  va_end(ap);
  return -1;
}

const char *twohost_error(void) { return th_err; }

static const char *th_env(const char *name) {
  const char *v = getenv(name);
  return v && *v ? v : NULL;
}

/* A failure shows when the first file is written there. */
static void th_mkdir(const char *path) { (void)mkdir(path, 0777); }

int twohost_init(void) {
  const char *hosts, *index, *shared, *link, *scope;

  if (th_ready == 1) return 0;
  th_ready = 0;
  hosts = th_env("IBMSG_TEST_HOSTS");
  index = th_env("IBMSG_TEST_HOST_INDEX");
  if (!hosts || strcmp(hosts, "2") != 0 || !index || (strcmp(index, "1") != 0 && strcmp(index, "2") != 0))
    return th_fail("not on one of two test hosts (IBMSG_TEST_HOSTS=2 and IBMSG_TEST_HOST_INDEX=1 "
                   "or 2 are not set): run it with test/twohost/run PROGRAM, or "
                   "test/softroce/run --hosts 2 -- PROGRAM");
  th_host = index[0] - '0';
  th_addr4 = th_env("IBMSG_TEST_ADDR");
  th_addr6 = th_env("IBMSG_TEST_ADDR6");
  th_peer4 = th_env("IBMSG_TEST_PEER_ADDR");
  th_peer6 = th_env("IBMSG_TEST_PEER_ADDR6");
  shared = th_env("IBMSG_TEST_SHARED_DIR");
  link = th_env("IBMSG_TEST_LINK_DIR");
  scope = th_env("IBMSG_TWOHOST_SCOPE");
  if (!th_addr4 || !th_peer4 || !shared)
    return th_fail("IBMSG_TEST_ADDR, IBMSG_TEST_PEER_ADDR or IBMSG_TEST_SHARED_DIR is not set");
  if (!th_addr6) th_addr6 = "";
  if (!th_peer6) th_peer6 = "";
  snprintf(th_dir, sizeof th_dir, "%s/twohost", shared);
  th_mkdir(th_dir);
  snprintf(th_dir, sizeof th_dir, "%s/twohost/%s", shared, scope ? scope : "default");
  th_mkdir(th_dir);
  snprintf(th_linkdir, sizeof th_linkdir, "%s", link ? link : "");
  th_ready = 1;
  return 0;
}

static int th_check(void) {
  if (th_ready == 1) return 0;
  if (twohost_init() == 0) return 0;
  return -1;
}

int twohost_index(void) { return th_check() == 0 ? th_host : 0; }
int twohost_is_client(void) { return twohost_index() == 1; }
int twohost_is_server(void) { return twohost_index() == 2; }
const char *twohost_role(void) { return twohost_is_client() ? "client" : "server"; }
const char *twohost_addr(void) { return th_check() == 0 ? th_addr4 : ""; }
const char *twohost_addr6(void) { return th_check() == 0 ? th_addr6 : ""; }
const char *twohost_peer_addr(void) { return th_check() == 0 ? th_peer4 : ""; }
const char *twohost_peer_addr6(void) { return th_check() == 0 ? th_peer6 : ""; }

uint64_t twohost_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static void th_sleep_ms(int ms) {
  struct timespec ts;
  ts.tv_sec = ms / 1000;
  ts.tv_nsec = (long)(ms % 1000) * 1000000L;
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) continue;
}

/* Reads a small file whole; -1 if it does not exist (yet). */
static int th_read(const char *path, char *buf, size_t len) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  ssize_t n;
  size_t got = 0;
  if (fd < 0) return -1;
  while (got + 1 < len && (n = read(fd, buf + got, len - 1 - got)) > 0) got += (size_t)n;
  close(fd);
  buf[got] = 0;
  return (int)got;
}

/* Writes a file whole with one write(): a reader sees nothing, or all of it (or, if not
 * atomic, an empty file while it is being truncated: readers treat that as "not yet"). When
 * rename_into_place, it appears only complete (through a temporary file). */
static int th_put(const char *path, int flags, const char *verb, const char *text,
                  int check_close) {
  size_t len = strlen(text);
  int fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC | flags, 0666);
  if (fd < 0) return th_fail("cannot %s %s: %s", verb, path, strerror(errno));
  if (write(fd, text, len) != (ssize_t)len) {
    int e = errno;
    close(fd);
    return th_fail("cannot write %s: %s", path, strerror(e));
  }
  if (close(fd) != 0 && check_close) return th_fail("cannot write %s: %s", path, strerror(errno));
  return 0;
}

static int th_write(const char *path, const char *text, int rename_into_place) {
  char tmp[1232]; /* room for a path of 1200 and ".tmp" and the host number */
  const char *target = path;
  if (rename_into_place) {
    snprintf(tmp, sizeof tmp, "%s.tmp%d", path, th_host);
    target = tmp;
  }
  if (th_put(target, O_TRUNC, "create", text, 1) != 0) return -1;
  if (rename_into_place && rename(tmp, path) != 0)
    return th_fail("cannot rename %s: %s", tmp, strerror(errno));
  return 0;
}

/* The n-th use of name in this process (1, 2, ...). */
static int th_occurrence(const char *name) {
  int i;
  for (i = 0; i < th_n_names; i++)
    if (strcmp(th_names[i].name, name) == 0) return ++th_names[i].count;
  if (th_n_names < TH_MAX_NAMES) {
    th_names[th_n_names].name = strdup(name);
    if (th_names[th_n_names].name) {
      th_names[th_n_names].count = 1;
      th_n_names++;
    }
  }
  return 1;
}

/* The barrier's file of host `host`: its name made safe for a file name, and a hash that keeps
 * names apart that look alike once made safe. */
static void th_barrier_path(char *out, size_t len, const char *name, int n, int host) {
  char safe[65];
  uint32_t h = 2166136261u;
  size_t i, j = 0;
  for (i = 0; name[i]; i++) {
    unsigned char c = (unsigned char)name[i];
    h = (h ^ c) * 16777619u;
    if (j < sizeof safe - 1)
      safe[j++] = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                          c == '-' || c == '_'
                      ? (char)c
                      : '_';
  }
  safe[j] = 0;
  snprintf(out, len, "%s/%s-%08x-%d.%d", th_dir, safe, (unsigned)h, n, host);
}

/* 1 if the peer's abandoned file has a line that is a prefix of name. */
static int th_abandoned(const char *path, const char *name) {
  static char buf[65536];
  char *line, *save;
  if (th_read(path, buf, sizeof buf) <= 0) return 0;
  for (line = strtok_r(buf, "\n", &save); line; line = strtok_r(NULL, "\n", &save))
    if (strncmp(name, line, strlen(line)) == 0) return 1;
  return 0;
}

int twohost_abandon(const char *prefix) {
  char path[1200], line[600];
  if (th_check() != 0) return -1;
  if (!prefix || !*prefix || strchr(prefix, '\n') || strlen(prefix) > 500)
    return th_fail("twohost_abandon: empty or too long prefix, or a newline in it");
  snprintf(path, sizeof path, "%s/abandoned.%d", th_dir, th_host);
  snprintf(line, sizeof line, "%s\n", prefix);
  return th_put(path, O_APPEND, "open", line, 0);
}

int twohost_exchange_idle(const char *name, const char *mine, char *theirs, size_t len,
                          int timeout_ms, void (*idle)(void *arg), void *arg) {
  char mine_path[1200], peer_path[1200], exit_path[1200], abandoned_path[1200];
  char content[TH_MAX_DATA + 600], got[TH_MAX_DATA + 600];
  uint64_t start, deadline, now;
  int n, peer, wait_ms = 1;
  const char *nl;

  if (th_check() != 0) return -1;
  if (!name) return th_fail("twohost_exchange: no name");
  if (!mine) mine = "";
  if (strlen(mine) > TH_MAX_DATA || strchr(name, '\n') || strlen(name) > 500)
    return th_fail("barrier '%s': name or data too long, or a newline in the name", name);
  peer = 3 - th_host;
  n = th_occurrence(name);
  th_barrier_path(mine_path, sizeof mine_path, name, n, th_host);
  th_barrier_path(peer_path, sizeof peer_path, name, n, peer);
  snprintf(exit_path, sizeof exit_path, "%s/exit.%d", th_dir, peer);
  snprintf(abandoned_path, sizeof abandoned_path, "%s/abandoned.%d", th_dir, peer);
  snprintf(content, sizeof content, "%s\n%s", name, mine);
  if (th_write(mine_path, content, 1) != 0) return -1;

  start = twohost_now_ms();
  deadline = start + (uint64_t)(timeout_ms > 0 ? timeout_ms : 0);
  for (;;) {
    if (th_read(peer_path, got, sizeof got) >= 0) {
      nl = strchr(got, '\n');
      if (!nl || (size_t)(nl - got) != strlen(name) || strncmp(got, name, strlen(name)) != 0)
        return th_fail("barrier '%s': the peer's file %s belongs to another barrier ('%.*s')",
                       name, peer_path, nl ? (int)(nl - got) : (int)strlen(got), got);
      if (theirs && len > 0) {
        if (strlen(nl + 1) >= len)
          return th_fail("barrier '%s': the peer's data (%zu bytes) does not fit in %zu", name,
                         strlen(nl + 1), len);
        memcpy(theirs, nl + 1, strlen(nl + 1) + 1);
      }
      return 0;
    }
    if (th_abandoned(abandoned_path, name))
      return th_fail("barrier '%s' (%d): the peer gave up on it (twohost_abandon)", name, n);
    if (th_read(exit_path, got, sizeof got) >= 0)
      return th_fail("barrier '%s' (%d): the peer's program has exited (status %s) without "
                     "reaching it", name, n, got[0] ? strtok(got, "\n") : "?");
    now = twohost_now_ms();
    if (now >= deadline)
      return th_fail("barrier '%s' (%d): the peer did not reach it within %d ms", name, n,
                     timeout_ms);
    if (idle) {
      idle(arg);
    } else {
      /* Poll fast at first (a barrier the peer reached already costs ~1 ms), then back off. */
      th_sleep_ms(wait_ms);
      if (now - start > 100 && wait_ms < 10) wait_ms = 10;
    }
  }
}

int twohost_exchange(const char *name, const char *mine, char *theirs, size_t len, int timeout_ms) {
  return twohost_exchange_idle(name, mine, theirs, len, timeout_ms, NULL, NULL);
}

int twohost_sync(const char *name, int timeout_ms) {
  return twohost_exchange_idle(name, NULL, NULL, 0, timeout_ms, NULL, NULL);
}

int twohost_sync_idle(const char *name, int timeout_ms, void (*idle)(void *arg), void *arg) {
  return twohost_exchange_idle(name, NULL, NULL, 0, timeout_ms, idle, arg);
}

/* Sends op to the relay and waits for its answer; the answer's first word is the link state. */
static int th_link(const char *op, char *answer, size_t len) {
  char req_path[1200], state_path[1200], req[128], got[256], seq[64];
  static unsigned counter;
  struct timespec ts;
  uint64_t deadline;
  char *word, *save;

  if (th_check() != 0) return -1;
  if (!th_linkdir[0]) return th_fail("IBMSG_TEST_LINK_DIR is not set: no link control on this rig");
  clock_gettime(CLOCK_REALTIME, &ts);
  snprintf(seq, sizeof seq, "c%ld%09ld-%ld-%u", (long)ts.tv_sec, ts.tv_nsec, (long)getpid(), ++counter);
  snprintf(req_path, sizeof req_path, "%s/request.%d", th_linkdir, th_host);
  snprintf(state_path, sizeof state_path, "%s/state.%d", th_linkdir, th_host);
  snprintf(req, sizeof req, "%s %s\n", op, seq);
  if (th_write(req_path, req, 0) != 0) return -1;
  /* It answers in 20-80 ms; 30 s tells a relay that is gone from a loaded machine. */
  deadline = twohost_now_ms() + 30000;
  while (twohost_now_ms() < deadline) {
    if (th_read(state_path, got, sizeof got) > 0) {
      char copy[256];
      memcpy(copy, got, sizeof copy);
      word = strtok_r(copy, " \n", &save);
      word = word ? strtok_r(NULL, " \n", &save) : NULL;
      if (word && strcmp(word, seq) == 0) {
        if (strstr(got, "error=")) return th_fail("the relay refused '%s': %s", op, got);
        if (answer) snprintf(answer, len, "%s", got);
        return 0;
      }
    }
    th_sleep_ms(1);
  }
  return th_fail("the relay did not answer '%s' within 30 s (its own limit; %s)", op, state_path);
}

int twohost_link_cut(void) { return th_link("cut", NULL, 0); }

int twohost_link_restore(void) { return th_link("restore", NULL, 0); }

int twohost_link_is_cut(void) {
  char answer[256];
  if (th_link("status", answer, sizeof answer) != 0) return -1;
  if (strncmp(answer, "cut ", 4) == 0) return 1;
  if (strncmp(answer, "up ", 3) == 0) return 0;
  return th_fail("unexpected answer from the relay: %s", answer);
}
