// ibmsg-echo - echo messages over RDMA: a small complete program using only the C++ wrapper.
//
//   ibmsg-echo --server IP [PORT] [--threads N] echo every message back on its connection
//   ibmsg-echo IP [PORT] [-n COUNT] [-s SIZE]   send COUNT messages, check every echo
//
// The server accepts any number of connections. With --threads N it runs N loops on N threads
// (one loop per thread, as ibmsg wants): the listener on the first, and ibmsg_listen_spread()
// spreading its connections over all N in turn; each loop's callbacks serve its own
// connections, and the only call between the threads is loop::call() (ibmsg_event_loop_call()),
// with which the main thread tells the others to close everything on a signal. A message it cannot echo at once (all send
// buffers busy, or the send queue full) waits in the connection's backlog, still unfreed, so the
// client runs out of credits instead of the server running out of memory: flow control comes
// from holding received messages.
//
// Any size works without options: ibmsg sends a message above the eager size (16384 bytes by
// default) by rendezvous, the receiver reading it, and both sides' maximum is 2^32 - 1 bytes.
// For such messages the client keeps fewer in flight (window_bytes), and the server's echo is
// a new buffer of the received size.
#include <getopt.h>
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cerrno>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "ibmsg.hpp"

namespace {

const char *const prog = "ibmsg-echo";
constexpr unsigned short default_port = 12345;
constexpr int tick_ms = 200;         // how long one dispatch waits: signals are seen this fast
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
               "Usage: %s --server IP [PORT] [--threads N] [--eager-size BYTES]\n"
               "       %s IP [PORT] [-n COUNT] [-s SIZE] [--eager-size BYTES]\n"
               "Echo messages over RDMA with ibmsg (an example of the C++ wrapper ibmsg.hpp).\n"
               "\n"
               "  --server              listen on IP and PORT and echo every message back\n"
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
               "  -h, --help            show this help and exit\n"
               "\n"
               "SIZE and BYTES may end in K, M or G (times 1024, 1024^2, 1024^3).\n"
               "PORT defaults to %u; a server given port 0 picks a free one and prints it.\n"
               "The client exits with status 0 when every echo came back identical.\n",
               prog, prog, default_port);
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
  ibmsg::socket conn;
  std::list<ibmsg::message> in_flight;  // posted, waiting for their message_sent
  std::uint64_t sent = 0, echoed = 0;
  double started = 0, finished = 0, last_progress = now();
  const std::size_t window = std::max<std::size_t>(1, window_bytes / (size ? size : 1));
  // The longest a step may take: the server reading a message, or this side reading its echo.
  const double idle_limit = idle_limit_s + double(size) / idle_bytes_per_s;

  if (eager_size) loop.set_option(IBMSG_OPT_EAGER_SIZE, eager_size);

  // Sends until count messages are out, window of them are in flight, the send buffers are all
  // busy or the queue is full; message_sent calls it again. (While the connection closes,
  // posting would fail.)
  auto send_more = [&](ibmsg::socket &s) {
    while (sent < count && in_flight.size() < window && s.status() == IBMSG_CONNECTED) {
      ibmsg::message m;
      if (!m.alloc(s, size)) return;
      fill(static_cast<unsigned char *>(m.data()), size, sent);
      if (!m.post(s)) return;
      in_flight.push_back(std::move(m));
      ++sent;
    }
  };

  loop.on_connection_established([&](ibmsg::socket &s) {
    doing = "echo";
    if (size > s.max_msg_size())
      throw std::runtime_error("size " + std::to_string(size) +
                               " is larger than the connection's maximum message size " +
                               std::to_string(s.max_msg_size()));
    started = last_progress = now();
    if (count == 0) s.disconnect();
    send_more(s);
  });
  loop.on_message_sent([&](ibmsg::socket &s, ibmsg::message &m, int status) {
    // IBMSG_ECANCELED: the connection is closing, and the closed callback says why.
    if (status != IBMSG_OK && status != IBMSG_ECANCELED) throw ibmsg::error(status);
    in_flight.remove_if([&](const ibmsg::message &x) { return &x == &m; });
    last_progress = now();  // the server has it (a large one took it a while to read)
    send_more(s);
  });
  loop.on_message_received([&](ibmsg::socket &s, ibmsg::message m) {
    if (m.size() != size)
      throw std::runtime_error("echo of message " + std::to_string(echoed) + " has " +
                               std::to_string(m.size()) + " bytes, not " + std::to_string(size));
    std::size_t at =
        first_difference(static_cast<const unsigned char *>(m.data()), size, echoed);
    if (at != size)
      throw std::runtime_error("echo of message " + std::to_string(echoed) + " differs at byte " +
                               std::to_string(at));
    last_progress = now();
    if (++echoed == count) {
      finished = last_progress;
      s.disconnect();
    }
  });  // `m` dies here: its buffer goes back to the server as a credit
  loop.on_connection_closed([&](ibmsg::socket &, int reason) {
    if (reason != IBMSG_OK) throw ibmsg::error(reason);
  });

  doing = std::string("connect to ") + ip + " port " + std::to_string(port);
  conn.connect(loop, ip, port);
  while (conn.is_open()) {
    loop.dispatch(tick_ms);
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
}  // on an exception, the destructors disconnect and free whatever is left

// --- server ---------------------------------------------------------------------------------

// Set by a loop's thread that ended early on an error: the main thread then shuts down.
std::atomic<bool> thread_failed{false};

struct connection {
  ibmsg::socket sock;
  std::string peer;                     // "ADDRESS port PORT", for the messages
  std::deque<ibmsg::message> backlog;   // received, not yet echoed (their credits held)
  std::list<ibmsg::message> in_flight;  // echoes posted, waiting for their message_sent
};

// Echoes what the backlog holds until the send buffers or the send queue run out;
// message_sent calls it again.
void echo(connection &c) {
  while (!c.backlog.empty() && c.sock.status() == IBMSG_CONNECTED) {
    const ibmsg::message &in = c.backlog.front();
    ibmsg::message out;
    if (!out.alloc(c.sock, in.size())) return;
    if (in.size()) std::memcpy(out.data(), in.data(), in.size());
    if (!out.post(c.sock)) return;  // `out` is freed; the echo is retried later
    c.in_flight.push_back(std::move(out));
    c.backlog.pop_front();  // frees the received message: a credit back to the peer
  }
}

// Connections accepted on the listener's thread and not yet taken by the thread of the loop
// they went to. With --threads N the listener spreads its connections over N loops
// (ibmsg_listen_spread): the connection then belongs to that loop's thread, which takes it from
// here at its first callback for it (established, or closed if the accept failed). A connection
// lives on the heap, so its socket stays where it is while it changes hands.
class arrivals {
 public:
  // Accepts req into a new connection and keeps it here. The lock spans the accept, so that
  // the loop the connection goes to cannot look for it before it is here.
  void accept(ibmsg::connection_request &req) {
    auto c = std::make_unique<connection>();
    c->peer = std::string(req.peer_address()) + " port " + std::to_string(req.peer_port());
    std::lock_guard<std::mutex> lock(m_);
    try {
      req.accept(c->sock);
    } catch (const ibmsg::error &e) {
      std::fprintf(stderr, "%s: cannot accept %s: %s\n", prog, c->peer.c_str(), e.what());
      return;
    }
    ibmsg_socket *key = c->sock.handle();
    waiting_.emplace(key, std::move(c));
  }
  // The connection of socket s, if it waits here.
  std::unique_ptr<connection> take(ibmsg_socket *s) {
    std::lock_guard<std::mutex> lock(m_);
    auto it = waiting_.find(s);
    if (it == waiting_.end()) return nullptr;
    std::unique_ptr<connection> c = std::move(it->second);
    waiting_.erase(it);
    return c;
  }
  bool empty() {
    std::lock_guard<std::mutex> lock(m_);
    return waiting_.empty();
  }
  // After every thread has ended: the connections nobody took (they disconnect as they die).
  void clear() { waiting_.clear(); }

 private:
  std::mutex m_;
  std::map<ibmsg_socket *, std::unique_ptr<connection>> waiting_;
};

// One loop and its connections; with --threads N there are N, each run by a thread of its own
// (the first by the main thread, with the listener). Everything in it but the loop's call() is
// touched only by its own thread.
struct server_loop {
  int index = 0;       // 1..N, for the messages
  bool named = false;  // --threads above 1: the messages say which thread
  ibmsg::loop loop;    // first: it must outlive the sockets and the messages
  std::map<ibmsg_socket *, std::unique_ptr<connection>> conns;
  bool stopping = false;  // told to close everything (by a call() from the main thread)
  double deadline = 0;    // when stopping: how long closing may take
  std::uint64_t connections = 0, echoed = 0;  // established here, echoes confirmed here
  std::string error;  // what ended the thread early ("": nothing)
  std::thread thread;
};

// Disconnects every connection of the loop; the closed callbacks follow.
void close_all(server_loop &sl) {
  for (auto &entry : sl.conns)
    if (entry.second->sock.status() == IBMSG_CONNECTED) entry.second->sock.disconnect();
}

// The callbacks of one loop: each handles the connections of its own loop.
void serve(server_loop &sl, arrivals &incoming) {
  // Per-connection trouble closes that connection, not the server.
  auto guarded = [&](connection &c, auto &&body) {
    try {
      body();
    } catch (const ibmsg::error &e) {
      std::fprintf(stderr, "%s: connection from %s: %s\n", prog, c.peer.c_str(), e.what());
      if (c.sock.status() == IBMSG_CONNECTED) c.sock.disconnect();
    }
  };
  // The connection of socket s: this loop's, or one that has just come to it.
  auto find = [&](ibmsg::socket &s) -> connection * {
    auto it = sl.conns.find(s.handle());
    if (it != sl.conns.end()) return it->second.get();
    std::unique_ptr<connection> c = incoming.take(s.handle());
    if (!c) return nullptr;  // the listener
    connection *p = c.get();
    sl.conns.emplace(s.handle(), std::move(c));
    return p;
  };
  std::string on_thread = sl.named ? " on thread " + std::to_string(sl.index) : std::string();

  sl.loop.on_connection_established([&sl, find, on_thread](ibmsg::socket &s) {
    connection *c = find(s);
    if (!c) return;
    ++sl.connections;
    std::printf("%s: connection from %s%s\n", prog, c->peer.c_str(), on_thread.c_str());
    std::fflush(stdout);
    if (sl.stopping) s.disconnect();  // it came while the server shuts down
  });
  sl.loop.on_message_received([&sl, guarded](ibmsg::socket &s, ibmsg::message m) {
    connection &c = *sl.conns.at(s.handle());
    c.backlog.push_back(std::move(m));
    guarded(c, [&] { echo(c); });
  });
  sl.loop.on_message_sent([&sl, guarded](ibmsg::socket &s, ibmsg::message &m, int status) {
    connection &c = *sl.conns.at(s.handle());
    if (status == IBMSG_OK)
      ++sl.echoed;
    else if (status != IBMSG_ECANCELED)
      std::fprintf(stderr, "%s: connection from %s: echo lost: %s\n", prog, c.peer.c_str(),
                   ibmsg_strerror(status));
    c.in_flight.remove_if([&](const ibmsg::message &x) { return &x == &m; });
    guarded(c, [&] { echo(c); });
  });
  sl.loop.on_connection_closed([&sl, find](ibmsg::socket &s, int reason) {
    connection *c = find(s);
    if (!c) return;  // the listener
    std::printf("%s: connection from %s closed: %s\n", prog, c->peer.c_str(),
                reason == IBMSG_OK ? "by this side" : ibmsg_strerror(reason));
    std::fflush(stdout);
    sl.conns.erase(s.handle());  // frees the socket and any backlog
  });
}

// Runs a loop that is not the listener's until the main thread tells it to stop (stop_loop())
// and its connections have closed, on a thread of its own.
void run_loop(server_loop &sl, arrivals &incoming) {
  try {
    while (!sl.stopping || ((!sl.conns.empty() || !incoming.empty()) && now() < sl.deadline))
      sl.loop.dispatch(tick_ms);
  } catch (const ibmsg::error &e) {
    sl.error = std::string(e.what()) + " (" + e.name() + ")";
    thread_failed = true;
  } catch (const std::exception &e) {
    sl.error = e.what();
    thread_failed = true;
  }
  sl.conns.clear();  // what did not close in time disconnects here, on the loop's thread
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
  arrivals incoming;       // emptied after the threads ended, before the loops go
  ibmsg::socket listener;  // closed before the loops go
  std::vector<ibmsg_event_loop *> handles;

  for (int i = 0; i < threads; ++i) {
    loops.push_back(std::make_unique<server_loop>());
    server_loop &sl = *loops.back();
    sl.index = i + 1;
    sl.named = threads > 1;
    if (eager_size) sl.loop.set_option(IBMSG_OPT_EAGER_SIZE, eager_size);
    serve(sl, incoming);
    handles.push_back(sl.loop.handle());
  }
  server_loop &first = *loops[0];
  first.loop.on_connection_request([&](ibmsg::connection_request &req) { incoming.accept(req); });

  doing = std::string("listen on ") + ip + " port " + std::to_string(port);
  listener.listen(first.loop, ip, port, 64 * threads);
  if (threads > 1) {
    // ibmsg_accept() (connection_request::accept()) now accepts onto the N loops in turn.
    int rc = ibmsg_listen_spread(listener.handle(), handles.data(), threads);
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
    sl.thread = std::thread([&sl, &incoming] { run_loop(sl, incoming); });
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
    while (!stop_requested && !thread_failed && listener.is_open()) first.loop.dispatch(tick_ms);

    // Orderly shutdown: close everything and let the closed callbacks run. The listener goes
    // first: any accept it handed to another loop runs there before that loop's stop call.
    doing = "shut down";
    if (listener.is_open()) listener.disconnect();
    stop_all();
    stop_loop(first);
    while ((listener.is_open() || !first.conns.empty() || !incoming.empty()) &&
           now() < first.deadline)
      first.loop.dispatch(tick_ms);
    first.conns.clear();
  } catch (...) {
    stop_all();  // the other threads end too before the loops go
    join_all();
    throw;
  }
  join_all();

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
  static const struct option options[] = {
      {"server", no_argument, nullptr, 'S'},
      {"count", required_argument, nullptr, 'n'},
      {"size", required_argument, nullptr, 's'},
      {"eager-size", required_argument, nullptr, 'E'},
      {"threads", required_argument, nullptr, 'T'},
      {"help", no_argument, nullptr, 'h'},
      {nullptr, 0, nullptr, 0},
  };
  bool server = false, client_options = false, count_given = false;
  std::uint64_t count = default_count;
  std::size_t size = 1024;
  int eager_size = 0, threads = 1, c;  // eager_size 0: ibmsg's default
  bool threads_given = false;
  opterr = 0;
  while ((c = getopt_long(argc, argv, ":n:s:h", options, nullptr)) != -1) {
    switch (c) {
      case 'S':
        server = true;
        break;
      case 'n':
        count = parse_number("count", optarg, 0, 1000000000);
        client_options = count_given = true;
        break;
      case 's':
        size = parse_number("size", optarg, 0, max_size, true);
        client_options = true;
        break;
      case 'E':
        eager_size = int(parse_number("eager size", optarg, 1, max_eager_size, true));
        break;
      case 'T':
        threads = int(parse_number("thread count", optarg, 1, max_threads));
        threads_given = true;
        break;
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
  if (server && client_options) usage_error("-n and -s are for the client, not --server");
  if (!server && threads_given) usage_error("--threads is for --server");
  if (!count_given && size > default_bytes / default_count)
    count = size >= default_bytes ? 1 : default_bytes / size;
  const char *ip = argv[optind];
  unsigned short port = default_port;
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
