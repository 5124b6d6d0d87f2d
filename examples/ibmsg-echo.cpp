// ibmsg-echo - echo messages over RDMA: a small complete program using only the C++ wrapper.
//
//   ibmsg-echo --server [-p PORT] IP [--threads N]   echo every message back on its connection
//   ibmsg-echo [-p PORT] IP [-n COUNT] [-s SIZE]     send COUNT messages, check every echo
//   (the port may also follow IP, the old form: ibmsg-echo IP PORT ...)
//
// Each connection is an object of its own that sets its socket's handlers (received, closed,
// ...; ibmsg::socket::on_received()), so nothing maps sockets to connections, and each echo is
// sent with socket::send() and a handler of its own, so nothing keeps a list of messages in
// flight. The server accepts any number of connections. With --threads N it runs N loops on N
// threads (one loop per thread, as ibmsg wants): the listener on the first, and
// ibmsg_listen_spread() (socket::spread()) spreading its connections over all N in turn; a
// connection's handlers run on its loop's thread, and the only call between the threads is
// loop::call() (ibmsg_event_loop_call()), with which the main thread tells the others to close
// everything on a signal. A message it cannot echo at once (all send buffers busy, or the send
// queue full) waits in the connection's backlog, still unfreed, so the client runs out of
// credits instead of the server running out of memory: flow control comes from holding
// received messages.
//
// Any size works without options: ibmsg sends a message above the eager size (16384 bytes by
// default) by rendezvous, the receiver reading it, and both sides' maximum is 2^32 - 1 bytes.
// For such messages the client keeps fewer in flight (window_bytes), and the server's echo is
// a new buffer of the received size.
#include <getopt.h>
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "ibmsg.hpp"

namespace {

const char *const prog = "ibmsg-echo";
constexpr unsigned short default_port = 12345;
constexpr auto tick = std::chrono::milliseconds(200);  // one dispatch's wait: signals are seen this fast
constexpr double idle_limit_s = 10;  // a client with no progress for this long gives up ...
constexpr double idle_bytes_per_s = 16 << 20;  // ... plus the time for a message at this rate
constexpr double close_limit_s = 5;  // how long closing may take on the way out
constexpr int max_threads = 64;      // --threads: ibmsg_listen_spread() takes up to 64 loops
constexpr std::uint64_t max_size = 4294967295u;  // ibmsg's largest message, 2^32 - 1
constexpr std::uint64_t max_eager_size = 1u << 30;  // the largest IBMSG_OPT_EAGER_SIZE
// Default COUNT: 1000 messages, or of large ones as many as make 1 GiB (at least 1).
constexpr std::uint64_t default_count = 1000;
constexpr std::uint64_t default_bytes = std::uint64_t(1) << 30;
// The bytes of messages the client keeps in flight, at least one message: each rendezvous
// message pins a registered buffer of its own size until the server has read it.
constexpr std::uint64_t window_bytes = std::uint64_t(512) << 20;

enum { exit_ok = 0, exit_failure = 1, exit_usage = 2 };

volatile sig_atomic_t stop_requested = 0;

void on_signal(int) { stop_requested = 1; }

void catch_signals() {
  struct sigaction sa;
  std::memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
}

double now() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

// What the program is doing, for error messages: "connect to 169.254.7.1 port 12345".
std::string doing;

void usage(FILE *out) {
  std::fprintf(out,
               "Usage: %s --server [-p PORT] IP [--threads N] [--eager-size BYTES]\n"
               "       %s [-p PORT] IP [-n COUNT] [-s SIZE] [--eager-size BYTES]\n"
               "       %s ... IP PORT   (the old form: the port after IP)\n"
               "Echo messages over RDMA with ibmsg (an example of the C++ wrapper ibmsg.hpp).\n"
               "\n"
               "  --server              listen on IP and PORT and echo every message back\n"
               "  -p, --port PORT       the server's port (default %u; a server given 0\n"
               "                        picks a free one and prints it)\n"
               "  --threads N           server: serve with N event loops on N threads,\n"
               "                        the connections spread over them in turn, and\n"
               "                        print each thread's counts at exit (1..64,\n"
               "                        default 1)\n"
               "  -n, --count COUNT     client: messages to send (default 1000, fewer\n"
               "                        above 1 MiB: as many as make 1 GiB, at least 1)\n"
               "  -s, --size SIZE       client: bytes per message, 0 to 4294967295\n"
               "                        (default 1024)\n"
               "  --eager-size BYTES    messages above BYTES go by rendezvous: the\n"
               "                        receiver reads them (default: ibmsg's, 16384)\n"
               "  --version             print the version and exit\n"
               "  -h, --help            show this help and exit\n"
               "\n"
               "SIZE and BYTES may end in K, M or G (times 1024, 1024^2, 1024^3).\n"
               "The client exits with status 0 when every echo came back identical.\n",
               prog, prog, prog, default_port);
}

[[noreturn]] void usage_error(const std::string &what) {
  std::fprintf(stderr, "%s: error: %s (try '%s --help')\n", prog, what.c_str(), prog);
  std::exit(exit_usage);
}

// A decimal number in [min, max], or a usage error naming the option. With suffixes, a size:
// it may end in K, M or G (times 1024, 1024^2, 1024^3).
unsigned long long parse_number(const char *what, const char *arg, unsigned long long min,
                                unsigned long long max, bool suffixes = false) {
  char *end = nullptr;
  errno = 0;
  unsigned long long v = std::strtoull(arg, &end, 10);
  int shift = 0;
  if (suffixes && end != arg && end[0] && !end[1]) {
    switch (*end) {
      case 'k': case 'K': shift = 10; ++end; break;
      case 'm': case 'M': shift = 20; ++end; break;
      case 'g': case 'G': shift = 30; ++end; break;
      default: break;
    }
  }
  bool overflow = shift && v > (~0ull >> shift);
  v <<= shift;
  if (errno || overflow || end == arg || *end || arg[0] < '0' || arg[0] > '9' || v < min ||
      v > max)
    usage_error(std::string("bad ") + what + " '" + arg + "': expected " + std::to_string(min) +
                ".." + std::to_string(max) + (suffixes ? " (a suffix may be K, M or G)" : ""));
  return v;
}

// Waits, on the way out, for what the loop still closes (sockets that died open, messages in
// flight), so that the loop's destructor finds nothing left: it never waits itself.
struct drain_on_exit {
  ibmsg::loop &loop;
  ~drain_on_exit() {
    try {
      (void)loop.drain(std::chrono::duration<double>(close_limit_s));
    } catch (...) {  // a handler's exception on the way out: the first one is reported already
    }
  }
};

// --- client ---------------------------------------------------------------------------------

// The payload of message seq, 8 bytes at a time (a large message fills fast): every word depends
// on seq and on its position, so a lost, repeated, reordered or damaged echo shows. A pattern
// for this program only: it never leaves the client's own memory but as the echo.
class pattern {
 public:
  explicit pattern(std::uint64_t seq) : x_(seq * 0x9e3779b97f4a7c15ull + 1) {}
  std::uint64_t next() {
    x_ ^= x_ << 13;
    x_ ^= x_ >> 7;
    x_ ^= x_ << 17;
    return x_;
  }

 private:
  std::uint64_t x_;
};

void fill(unsigned char *p, std::size_t size, std::uint64_t seq) {
  pattern gen(seq);
  for (std::size_t i = 0; i < size; i += 8) {
    std::uint64_t w = gen.next();
    std::memcpy(p + i, &w, size - i < 8 ? size - i : 8);
  }
}

// The first byte of p that is not message seq's, or size if all are.
std::size_t first_difference(const unsigned char *p, std::size_t size, std::uint64_t seq) {
  pattern gen(seq);
  for (std::size_t i = 0; i < size; i += 8) {
    unsigned char want[8];
    std::uint64_t w = gen.next();
    std::size_t n = size - i < 8 ? size - i : 8;
    std::memcpy(want, &w, 8);
    if (std::memcmp(p + i, want, n) != 0) {
      std::size_t at = 0;
      while (p[i + at] == want[at]) ++at;
      return i + at;
    }
  }
  return size;
}

int run_client(const char *ip, unsigned short port, std::uint64_t count, std::size_t size,
               int eager_size) {
  ibmsg::loop loop;  // first: it must outlive the socket and the messages
  drain_on_exit drained{loop};
  ibmsg::socket conn;
  std::uint64_t sent = 0, echoed = 0, in_flight = 0;
  double started = 0, finished = 0, last_progress = now();
  const std::size_t window = std::max<std::size_t>(1, window_bytes / (size ? size : 1));
  // The longest a step may take: the server reading a message, or this side reading its echo.
  const double idle_limit = idle_limit_s + double(size) / idle_bytes_per_s;

  if (eager_size) loop.set_option(IBMSG_OPT_EAGER_SIZE, eager_size);

  // Sends until count messages are out, window of them are in flight, the send buffers are all
  // busy or the queue is full; each send's handler calls it again. (While the connection
  // closes, posting would fail.)
  std::function<void(ibmsg::socket &)> send_more = [&](ibmsg::socket &s) {
    while (sent < count && in_flight < window && s.status() == IBMSG_CONNECTED) {
      ibmsg::message m;
      if (!m.alloc(s, size)) return;
      fill(m.data<unsigned char>(), size, sent);
      bool posted = s.send(m, [&](ibmsg::socket &sock, ibmsg::message, int status) {
        --in_flight;
        // IBMSG_ECANCELED: the connection is closing, and the closed handler says why.
        if (status != IBMSG_OK && status != IBMSG_ECANCELED) throw ibmsg::error(status);
        last_progress = now();  // the server has it (a large one took it a while to read)
        send_more(sock);
      });  // the message is the send's now; it comes back to the handler, which lets it go
      if (!posted) return;
      ++in_flight;
      ++sent;
    }
  };

  conn.on_established([&](ibmsg::socket &s) {
    doing = "echo";
    if (size > s.max_msg_size())
      throw std::runtime_error("size " + std::to_string(size) +
                               " is larger than the connection's maximum message size " +
                               std::to_string(s.max_msg_size()));
    started = last_progress = now();
    if (count == 0) s.disconnect();
    send_more(s);
  });
  conn.on_received([&](ibmsg::socket &s, ibmsg::message m) {
    if (m.size() != size)
      throw std::runtime_error("echo of message " + std::to_string(echoed) + " has " +
                               std::to_string(m.size()) + " bytes, not " + std::to_string(size));
    std::size_t at = first_difference(m.data<unsigned char>(), size, echoed);
    if (at != size)
      throw std::runtime_error("echo of message " + std::to_string(echoed) + " differs at byte " +
                               std::to_string(at));
    last_progress = now();
    if (++echoed == count) {
      finished = last_progress;
      s.disconnect();
    }
  });  // `m` dies here: its buffer goes back to the server as a credit
  conn.on_closed([&](ibmsg::socket &, int reason) {
    if (reason != IBMSG_OK) throw ibmsg::error(reason);
  });

  doing = std::string("connect to ") + ip + " port " + std::to_string(port);
  conn.connect(loop, ip, port);
  while (conn.is_open()) {
    loop.dispatch(tick);
    if (stop_requested) throw std::runtime_error("interrupted");
    if (now() - last_progress > idle_limit)
      throw std::runtime_error("no progress for " + std::to_string(int(idle_limit)) + " s (" +
                               std::to_string(echoed) + " of " + std::to_string(count) +
                               " came back)");
  }

  double seconds = finished > started ? finished - started : 0;
  double bytes = double(count) * double(size);
  std::printf("%s: echoed %" PRIu64 " messages, %.0f bytes in %.3f s: %.2f MB/s, %.0f msg/s\n",
              prog, count, bytes, seconds, seconds > 0 ? bytes / seconds / 1e6 : 0.0,
              seconds > 0 ? double(count) / seconds : 0.0);
  return exit_ok;
}  // on an exception, the socket disconnects as it dies, and drained waits for it to close

// --- server ---------------------------------------------------------------------------------

// Set by a loop's thread that ended early on an error: the main thread then shuts down.
std::atomic<bool> thread_failed{false};
// Connections accepted and not yet closed, on every loop: the loops run until none is left
// when they shut down.
std::atomic<int> alive{0};

struct server_loop;

// One connection: made by the listener's request handler, which sets its socket's handlers and
// accepts it; from then on it belongs to the thread of the loop it was accepted onto, where its
// handlers run; its closed handler deletes it.
struct connection {
  ibmsg::socket sock;
  std::string peer;                    // "ADDRESS port PORT", for the messages
  server_loop *home = nullptr;         // the loop it lives on, from its established handler on
  std::deque<ibmsg::message> backlog;  // received, not yet echoed (their credits held)
  connection *prev = nullptr, *next = nullptr;  // in home's list of established connections
};

// One loop and its connections; with --threads N there are N, each run by a thread of its own
// (the first by the main thread, with the listener). Everything in it but the loop's call() is
// touched only by its own thread.
struct server_loop {
  int index = 0;       // 1..N, for the messages
  bool named = false;  // --threads above 1: the messages say which thread
  ibmsg::loop loop;    // first: it must outlive the sockets and the messages
  connection *conns = nullptr;  // the established connections (a list through the connections)
  bool stopping = false;  // told to close everything (by a call() from the main thread)
  double deadline = 0;    // when stopping: how long closing may take
  std::uint64_t connections = 0, echoed = 0;  // established here, echoes confirmed here
  std::string error;  // what ended the thread early ("": nothing)
  std::thread thread;
};

// Per-connection trouble closes that connection, not the server.
template <class F>
void guarded(connection &c, F &&body) {
  try {
    body();
  } catch (const ibmsg::error &e) {
    std::fprintf(stderr, "%s: connection from %s: %s\n", prog, c.peer.c_str(), e.what());
    if (c.sock.status() == IBMSG_CONNECTED) c.sock.disconnect();
  }
}

// Echoes what the backlog holds until the send buffers or the send queue run out; each echo's
// handler calls it again.
void echo(connection &c) {
  while (!c.backlog.empty() && c.sock.status() == IBMSG_CONNECTED) {
    const ibmsg::message &in = c.backlog.front();
    ibmsg::message out;
    if (!out.alloc(c.sock, in.bytes())) return;  // a copy of the received bytes
    connection *p = &c;  // alive until its closed handler, which runs after every send's
    bool posted = c.sock.send(out, [p](ibmsg::socket &, ibmsg::message, int status) {
      if (status == IBMSG_OK)
        ++p->home->echoed;
      else if (status != IBMSG_ECANCELED)
        std::fprintf(stderr, "%s: connection from %s: echo lost: %s\n", prog, p->peer.c_str(),
                     ibmsg_strerror(status));
      guarded(*p, [p] { echo(*p); });
    });
    if (!posted) return;  // `out` is freed; the echo is tried again later
    c.backlog.pop_front();  // frees the received message: a credit back to the peer
  }
}

// The loop of the thread this runs on: the one whose C loop holds s.
server_loop &home_of(const std::vector<std::unique_ptr<server_loop>> &loops, ibmsg::socket &s) {
  for (auto &sl : loops)
    if (sl->loop.handle() == s.handle()->loop) return *sl;
  throw std::logic_error("a connection on no loop of this server");
}

// At c's first handler on its loop's thread: c joins that loop's list.
server_loop &attach(connection *c, const std::vector<std::unique_ptr<server_loop>> &loops,
                    ibmsg::socket &s) {
  if (c->home) return *c->home;
  server_loop &sl = home_of(loops, s);
  c->home = &sl;
  c->next = sl.conns;
  if (sl.conns) sl.conns->prev = c;
  sl.conns = c;
  return sl;
}

// The listener's request handler: a new connection with its handlers, accepted onto the next
// loop (ibmsg_listen_spread with --threads) or this one.
void accept(ibmsg::connection_request &req, const std::vector<std::unique_ptr<server_loop>> &loops) {
  auto made = std::make_unique<connection>();
  connection *c = made.get();
  c->peer = std::string(req.peer_address()) + " port " + std::to_string(req.peer_port());
  c->sock.on_established([c, &loops](ibmsg::socket &s) {
    server_loop &sl = attach(c, loops, s);
    ++sl.connections;
    std::printf("%s: connection from %s%s\n", prog, c->peer.c_str(),
                sl.named ? (" on thread " + std::to_string(sl.index)).c_str() : "");
    std::fflush(stdout);
    if (sl.stopping) s.disconnect();  // it came while the server shuts down
  });
  c->sock.on_received([c, &loops](ibmsg::socket &s, ibmsg::message m) {
    attach(c, loops, s);  // (data may come before the established handler)
    c->backlog.push_back(std::move(m));
    guarded(*c, [c] { echo(*c); });
  });
  c->sock.on_closed([c](ibmsg::socket &, int reason) {
    std::printf("%s: connection from %s closed: %s\n", prog, c->peer.c_str(),
                reason == IBMSG_OK ? "by this side" : ibmsg_strerror(reason));
    std::fflush(stdout);
    if (server_loop *sl = c->home) {
      if (c->prev) c->prev->next = c->next; else sl->conns = c->next;
      if (c->next) c->next->prev = c->prev;
    }
    --alive;
    delete c;  // its socket too: the wrapper allows that inside its own closed handler
  });
  // From the accept on, c is the thread's of the loop it goes to, which may call back at once:
  // this thread does not touch it after.
  ++alive;
  made.release();
  try {
    req.accept(c->sock);
  } catch (const ibmsg::error &e) {  // no handler runs for a failed accept
    std::fprintf(stderr, "%s: cannot accept %s: %s\n", prog, c->peer.c_str(), e.what());
    --alive;
    delete c;
  }
}

// Disconnects every connection of the loop; the closed handlers follow.
void close_all(server_loop &sl) {
  for (connection *c = sl.conns; c; c = c->next)
    if (c->sock.status() == IBMSG_CONNECTED) c->sock.disconnect();
}

// On the way out, on the loop's thread: what did not close in time disconnects as it dies, and
// the loop gets the rest of the time to see it closed.
void drop_all(server_loop &sl) {
  while (connection *c = sl.conns) {
    sl.conns = c->next;
    --alive;
    delete c;
  }
  try {
    (void)sl.loop.drain(std::chrono::duration<double>(std::max(0.1, sl.deadline - now())));
  } catch (...) {
  }
}

// Runs a loop that is not the listener's until the main thread tells it to stop (stop_loop())
// and the connections have closed, on a thread of its own.
void run_loop(server_loop &sl) {
  try {
    while (!sl.stopping || (alive > 0 && now() < sl.deadline)) sl.loop.dispatch(tick);
  } catch (const ibmsg::error &e) {
    sl.error = std::string(e.what()) + " (" + e.name() + ")";
    thread_failed = true;
  } catch (const std::exception &e) {
    sl.error = e.what();
    thread_failed = true;
  }
  drop_all(sl);
}

// On the loop's own thread: close everything and let run_loop() end.
void stop_loop(server_loop &sl) {
  if (sl.stopping) return;
  sl.stopping = true;
  sl.deadline = now() + close_limit_s;
  close_all(sl);
}

int run_server(const char *ip, unsigned short port, int eager_size, int threads) {
  std::vector<std::unique_ptr<server_loop>> loops;  // first: they outlive every socket
  ibmsg::socket listener;  // closed before the loops go

  for (int i = 0; i < threads; ++i) {
    loops.push_back(std::make_unique<server_loop>());
    server_loop &sl = *loops.back();
    sl.index = i + 1;
    sl.named = threads > 1;
    if (eager_size) sl.loop.set_option(IBMSG_OPT_EAGER_SIZE, eager_size);
  }
  server_loop &first = *loops[0];
  first.loop.on_connection_request([&](ibmsg::connection_request &req) { accept(req, loops); });

  doing = std::string("listen on ") + ip + " port " + std::to_string(port);
  listener.listen(first.loop, ip, port, 64 * threads);
  if (threads > 1) {
    // connection_request::accept() now accepts onto the N loops in turn.
    ibmsg_event_loop *handles[max_threads];
    for (int i = 0; i < threads; ++i) handles[i] = loops[i]->loop.handle();
    int rc = ibmsg_listen_spread(listener.handle(), handles, threads);
    if (rc != IBMSG_OK) throw ibmsg::error(rc);
    std::printf("%s: listening on %s port %u, %d threads\n", prog, ip, listener.local_port(),
                threads);
  } else {
    std::printf("%s: listening on %s port %u\n", prog, ip, listener.local_port());
  }
  std::fflush(stdout);
  doing = "serve";

  // The other loops run on threads of their own from here on: this thread touches them only
  // through call() (ibmsg_event_loop_call()), until it has joined their threads.
  for (int i = 1; i < threads; ++i) {
    server_loop &sl = *loops[i];
    sl.thread = std::thread([&sl] { run_loop(sl); });
  }
  auto stop_all = [&] {
    for (int i = 1; i < threads; ++i) {
      server_loop &sl = *loops[i];
      sl.loop.call([&sl] { stop_loop(sl); });
    }
  };
  auto join_all = [&] {
    for (int i = 1; i < threads; ++i)
      if (loops[i]->thread.joinable()) loops[i]->thread.join();
  };

  try {
    while (!stop_requested && !thread_failed && listener.is_open()) first.loop.dispatch(tick);

    // Orderly shutdown: close everything and let the closed handlers run. The listener goes
    // first: any accept it handed to another loop runs there before that loop's stop call.
    doing = "shut down";
    if (listener.is_open()) listener.disconnect();
    stop_all();
    stop_loop(first);
    while ((listener.is_open() || alive > 0) && now() < first.deadline)
      first.loop.dispatch(tick);
  } catch (...) {
    stop_all();  // the other threads end too before the loops go
    join_all();
    drop_all(first);
    throw;
  }
  join_all();
  drop_all(first);

  int status = exit_ok;
  if (threads > 1) {
    for (auto &sl : loops) {
      std::printf("%s: thread %d: %" PRIu64 " connections, %" PRIu64 " messages echoed\n", prog,
                  sl->index, sl->connections, sl->echoed);
      if (!sl->error.empty()) {
        std::fprintf(stderr, "%s: error: thread %d: %s\n", prog, sl->index, sl->error.c_str());
        status = exit_failure;
      }
    }
    std::fflush(stdout);
  }
  return status;
}

}  // namespace

int main(int argc, char **argv) {
  enum { opt_server = 256, opt_eager_size, opt_threads, opt_version };
  static const struct option options[] = {
      {"server", no_argument, nullptr, opt_server},
      {"port", required_argument, nullptr, 'p'},
      {"count", required_argument, nullptr, 'n'},
      {"size", required_argument, nullptr, 's'},
      {"eager-size", required_argument, nullptr, opt_eager_size},
      {"threads", required_argument, nullptr, opt_threads},
      {"version", no_argument, nullptr, opt_version},
      {"help", no_argument, nullptr, 'h'},
      {nullptr, 0, nullptr, 0},
  };
  bool server = false, client_options = false, count_given = false, port_given = false;
  std::uint64_t count = default_count;
  std::size_t size = 1024;
  int eager_size = 0, threads = 1, c;  // eager_size 0: ibmsg's default
  bool threads_given = false;
  const char *port_arg = nullptr;  // -p, checked once we know client or server
  opterr = 0;
  while ((c = getopt_long(argc, argv, ":p:n:s:h", options, nullptr)) != -1) {
    switch (c) {
      case opt_server:
        server = true;
        break;
      case 'p':
        port_arg = optarg;
        port_given = true;
        break;
      case 'n':
        count = parse_number("count", optarg, 0, 1000000000);
        client_options = count_given = true;
        break;
      case 's':
        size = parse_number("size", optarg, 0, max_size, true);
        client_options = true;
        break;
      case opt_eager_size:
        eager_size = int(parse_number("eager size", optarg, 1, max_eager_size, true));
        break;
      case opt_threads:
        threads = int(parse_number("thread count", optarg, 1, max_threads));
        threads_given = true;
        break;
      case opt_version:
        std::printf("%s %d.%d.%d (libibmsg %s)\n", prog, IBMSG_VERSION_MAJOR, IBMSG_VERSION_MINOR,
                    IBMSG_VERSION_PATCH, ibmsg::version_string());
        return exit_ok;
      case 'h':
        usage(stdout);
        return exit_ok;
      case ':':
        usage_error(std::string("option '") + argv[optind - 1] + "' needs a value");
      default:
        usage_error(std::string("unknown option '") + argv[optind - 1] + "'");
    }
  }
  int rest = argc - optind;
  if (rest < 1) usage_error("the IP address is missing");
  if (rest > 2) usage_error(std::string("unexpected argument '") + argv[optind + 2] + "'");
  if (rest == 2 && port_given)
    usage_error(std::string("the port is given twice: -p and '") + argv[optind + 1] +
                "' after IP");
  if (server && client_options) usage_error("-n and -s are for the client, not --server");
  if (!server && threads_given) usage_error("--threads is for --server");
  if (!count_given && size > default_bytes / default_count)
    count = size >= default_bytes ? 1 : default_bytes / size;
  const char *ip = argv[optind];
  unsigned short port = default_port;
  if (port_given) port = static_cast<unsigned short>(parse_number("port", port_arg, server ? 0 : 1, 65535));
  if (rest == 2)
    port =
        static_cast<unsigned short>(parse_number("port", argv[optind + 1], server ? 0 : 1, 65535));

  catch_signals();
  doing = "set up the event loop";
  try {
    return server ? run_server(ip, port, eager_size, threads)
                  : run_client(ip, port, count, size, eager_size);
  } catch (const ibmsg::error &e) {
    std::fprintf(stderr, "%s: error: %s: %s (%s)\n", prog, doing.c_str(), e.what(), e.name());
  } catch (const std::exception &e) {
    std::fprintf(stderr, "%s: error: %s: %s\n", prog, doing.c_str(), e.what());
  }
  return exit_failure;
}
