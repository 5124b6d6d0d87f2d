// test_handover.cpp - ibmsg_event_loop_call, the hand-over of work from any thread to a loop's
// thread (issue 25), over the fake transport (no device: a loop needs none), through the public
// C API: calls from many threads run each exactly once, on the loop's thread, in the order each
// thread posted them; a loop asleep in ibmsg_dispatch_event_loop wakes up for a call, and so does
// a foreign loop watching ibmsg_event_loop_fd; a call posted by a call runs at the next
// iteration; calls may use the loop's API; the loop cannot be destroyed while calls wait; bad
// arguments are refused; loops torn down while other threads post to other loops; with IBMSG_DEBUG, another function called from another thread while the
// loop's thread runs the loop is refused (and said on stderr). And the C++ wrapper's loop::call: the same from threads, an exception
// a call throws comes out of the dispatch that ran it, an empty function is refused, the
// destructor runs calls still waiting.
//
// The tests wait on events, never on a fixed time: where a wake-up that never comes would block,
// the wait is bounded by a limit far above any slow machine's need (60 s) and a test that reaches
// it says so.
#include <poll.h>
#include <pthread.h>
#include <time.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>

#include <csetjmp>
#include <cstdarg>
#include <cstddef>
extern "C" {  // cmocka.h 1.1 has no extern "C" of its own
#include <cmocka.h>
}

#include "fake.hpp"
#include "ibmsg.h"
#include "ibmsg.hpp"

namespace fake = ibmsg::fake;

namespace {

constexpr int kLimitMs = 60000;  // a wake-up that does not come: the test fails after this

double now_ms() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return double(ts.tv_sec) * 1e3 + double(ts.tv_nsec) / 1e6;
}

struct Fixture {
  ibmsg_event_loop loop{};
  pthread_t loop_thread{};
};

int setup(void **state) {
  fake::reset();
  auto *f = new Fixture;
  if (ibmsg_init_event_loop(&f->loop) != IBMSG_OK) {
    delete f;
    return -1;
  }
  f->loop_thread = pthread_self();
  *state = f;
  return 0;
}

int teardown(void **state) {
  auto *f = static_cast<Fixture *>(*state);
  const int rc = ibmsg_destroy_event_loop(&f->loop);
  delete f;
  return rc == IBMSG_OK ? 0 : -1;
}

// Dispatches until done() or kLimitMs; whether done() came.
template <class F>
bool dispatch_until(ibmsg_event_loop *loop, F done) {
  const double start = now_ms();
  while (!done()) {
    if (now_ms() - start > kLimitMs) {
      fprintf(stderr, "test_handover: gave up after its own limit of %d ms\n", kLimitMs);
      return false;
    }
    if (ibmsg_dispatch_event_loop_timeout(loop, 1000) != IBMSG_OK) return false;
  }
  return true;
}

// --- many threads -------------------------------------------------------------------------------

constexpr int kThreads = 8;
constexpr uint32_t kPerThread = 20000;

struct Counter {
  pthread_t loop_thread;
  uint32_t next[kThreads] = {};    // the sequence number each thread's next call must have
  uint64_t total = 0;
  uint64_t out_of_order = 0;       // a call before an earlier one of its thread, or twice
  uint64_t off_thread = 0;         // a call that ran on another thread than the loop's
};
Counter *g_counter;

void count_call(void *arg) {
  const uintptr_t v = reinterpret_cast<uintptr_t>(arg);
  const int t = int(v >> 32);
  const uint32_t seq = uint32_t(v);
  Counter *c = g_counter;
  if (!pthread_equal(pthread_self(), c->loop_thread)) ++c->off_thread;
  if (t < 0 || t >= kThreads || seq != c->next[t]) ++c->out_of_order;
  else ++c->next[t];
  ++c->total;
}

// 8 threads post 20000 calls each while the loop runs: every call runs once, on the loop's
// thread, each thread's in its order.
void test_many_threads(void **state) {
  auto *f = static_cast<Fixture *>(*state);
  Counter counter;
  counter.loop_thread = f->loop_thread;
  g_counter = &counter;
  std::atomic<int> failed_posts{0};
  std::atomic<bool> go{false};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      while (!go.load()) std::this_thread::yield();
      for (uint32_t i = 0; i < kPerThread; ++i) {
        const uintptr_t v = (uintptr_t(t) << 32) | i;
        if (ibmsg_event_loop_call(&f->loop, count_call, reinterpret_cast<void *>(v)) != IBMSG_OK)
          ++failed_posts;
      }
    });
  }
  go = true;
  const uint64_t want = uint64_t(kThreads) * kPerThread;
  const bool all = dispatch_until(&f->loop, [&] {
    return counter.total + uint64_t(failed_posts.load()) >= want;
  });
  for (auto &th : threads) th.join();
  // (what was posted after the last dispatch: none, all were counted or failed)
  assert_true(all);
  assert_int_equal(failed_posts.load(), 0);
  assert_int_equal(counter.total, want);
  assert_int_equal(counter.out_of_order, 0);
  assert_int_equal(counter.off_thread, 0);
  for (int t = 0; t < kThreads; ++t) assert_int_equal(counter.next[t], kPerThread);
  // Nothing more runs: one more round without waiting changes nothing.
  assert_int_equal(ibmsg_event_loop_process(&f->loop), IBMSG_OK);
  assert_int_equal(counter.total, want);
}

// --- waking -------------------------------------------------------------------------------------

std::atomic<int> g_ran{0};
void mark(void *) { ++g_ran; }

// A loop asleep in ibmsg_dispatch_event_loop_timeout (nothing else to do) wakes up for a call
// another thread posts, runs it and returns.
void test_wakes_sleeping_loop(void **state) {
  auto *f = static_cast<Fixture *>(*state);
  g_ran = 0;
  std::atomic<bool> entered{false};
  std::thread poster([&] {
    // Posted after the loop went to sleep, as near as a test can tell: after the dispatch
    // started (a post before it would be found at once, which proves less).
    while (!entered.load()) std::this_thread::yield();
    struct timespec ts = {0, 20 * 1000 * 1000};
    nanosleep(&ts, nullptr);
    assert_int_equal(ibmsg_event_loop_call(&f->loop, mark, nullptr), IBMSG_OK);
  });
  const double start = now_ms();
  entered = true;
  int rc = IBMSG_OK;
  while (g_ran.load() == 0 && now_ms() - start < kLimitMs && rc == IBMSG_OK)
    rc = ibmsg_dispatch_event_loop_timeout(&f->loop, kLimitMs);
  poster.join();
  if (g_ran.load() == 0) fprintf(stderr, "test_handover: the call did not wake the loop in %d ms\n", kLimitMs);
  assert_int_equal(rc, IBMSG_OK);
  assert_int_equal(g_ran.load(), 1);
}

// A foreign loop watching ibmsg_event_loop_fd sees it readable after a call from another thread;
// ibmsg_event_loop_process runs the call; then the fd is quiet again.
void test_foreign_fd(void **state) {
  auto *f = static_cast<Fixture *>(*state);
  g_ran = 0;
  const int fd = ibmsg_event_loop_fd(&f->loop);
  assert_true(fd >= 0);
  pollfd p = {fd, POLLIN, 0};
  assert_int_equal(poll(&p, 1, 0), 0);  // quiet before
  std::thread poster([&] { assert_int_equal(ibmsg_event_loop_call(&f->loop, mark, nullptr), IBMSG_OK); });
  const int n = poll(&p, 1, kLimitMs);
  poster.join();
  assert_int_equal(n, 1);
  assert_true(p.revents & POLLIN);
  assert_int_equal(g_ran.load(), 0);  // not before the loop processes
  assert_int_equal(ibmsg_event_loop_process(&f->loop), IBMSG_OK);
  assert_int_equal(g_ran.load(), 1);
  p.revents = 0;
  assert_int_equal(poll(&p, 1, 0), 0);  // quiet after
}

// --- from the loop's own thread ----------------------------------------------------------------

struct Chain {
  ibmsg_event_loop *loop;
  int first = 0, second = 0;
  int second_during_first = -1;
  int dispatch_inside = -1;
  int setopt_inside = -1;
};

void second_call(void *arg) { ++static_cast<Chain *>(arg)->second; }

void first_call(void *arg) {
  auto *c = static_cast<Chain *>(arg);
  ++c->first;
  // Posted from a call: it runs at the next iteration, not within this one.
  assert_int_equal(ibmsg_event_loop_call(c->loop, second_call, c), IBMSG_OK);
  c->second_during_first = c->second;
  // A call runs as a callback does: the loop does not nest, its API works.
  c->dispatch_inside = ibmsg_dispatch_event_loop_timeout(c->loop, 0);
  const int depth = 8;
  c->setopt_inside = ibmsg_setopt(c->loop, IBMSG_OPT_RECV_DEPTH, &depth, sizeof depth);
}

void test_post_from_a_call(void **state) {
  auto *f = static_cast<Fixture *>(*state);
  Chain c;
  c.loop = &f->loop;
  // From the loop's own thread, outside a dispatch: it waits for the next one.
  assert_int_equal(ibmsg_event_loop_call(&f->loop, first_call, &c), IBMSG_OK);
  assert_int_equal(c.first, 0);
  assert_int_equal(ibmsg_event_loop_process(&f->loop), IBMSG_OK);
  assert_int_equal(c.first, 1);
  assert_int_equal(c.second_during_first, 0);
  assert_int_equal(c.dispatch_inside, IBMSG_EBUSY);
  assert_int_equal(c.setopt_inside, IBMSG_OK);
  assert_true(dispatch_until(&f->loop, [&] { return c.second == 1; }));
  assert_int_equal(c.first, 1);
  assert_int_equal(c.second, 1);
}

// Calls from one thread run in the order posted, also many posted before the loop runs.
std::vector<int> *g_order;
void record(void *arg) { g_order->push_back(int(reinterpret_cast<uintptr_t>(arg))); }

void test_order(void **state) {
  auto *f = static_cast<Fixture *>(*state);
  std::vector<int> order;
  g_order = &order;
  for (int i = 0; i < 100; ++i)
    assert_int_equal(ibmsg_event_loop_call(&f->loop, record, reinterpret_cast<void *>(uintptr_t(i))),
                     IBMSG_OK);
  assert_true(dispatch_until(&f->loop, [&] { return order.size() == 100; }));
  for (int i = 0; i < 100; ++i) assert_int_equal(order[size_t(i)], i);
}

// --- refusals -----------------------------------------------------------------------------------

void test_invalid(void **state) {
  auto *f = static_cast<Fixture *>(*state);
  assert_int_equal(ibmsg_event_loop_call(nullptr, mark, nullptr), IBMSG_EINVAL);
  assert_int_equal(ibmsg_event_loop_call(&f->loop, nullptr, nullptr), IBMSG_EINVAL);
  ibmsg_event_loop never_initialized;
  memset(&never_initialized, 0, sizeof never_initialized);
  assert_int_equal(ibmsg_event_loop_call(&never_initialized, mark, nullptr), IBMSG_EINVAL);
}

// The loop is not destroyed while a call waits (it would be lost): IBMSG_EBUSY, then after the
// call ran, it is.
void test_destroy_waits_for_calls(void **) {
  fake::reset();
  ibmsg_event_loop loop;
  assert_int_equal(ibmsg_init_event_loop(&loop), IBMSG_OK);
  g_ran = 0;
  assert_int_equal(ibmsg_event_loop_call(&loop, mark, nullptr), IBMSG_OK);
  assert_int_equal(ibmsg_destroy_event_loop(&loop), IBMSG_EBUSY);
  assert_int_equal(g_ran.load(), 0);
  assert_int_equal(ibmsg_event_loop_process(&loop), IBMSG_OK);
  assert_int_equal(g_ran.load(), 1);
  assert_int_equal(ibmsg_destroy_event_loop(&loop), IBMSG_OK);
}

// Loops torn down while other threads post: a second loop runs on a thread of its own; four
// threads post to it and four others to the fixture's loop. Midway the second loop's posters
// are stopped and joined, then its thread drains it and destroys it (IBMSG_EBUSY only while a
// call still waits) and a third loop is made and torn down on that thread, all while the other
// four keep posting to the first loop. Every call of either loop runs exactly once, in each
// thread's order, on its loop's thread; the first loop's posters notice nothing.
struct Tally {
  pthread_t thread;
  uint32_t next[4] = {};
  uint64_t total = 0, out_of_order = 0, off_thread = 0;
};

void tally_call(void *arg) {
  auto *p = static_cast<std::pair<Tally *, uintptr_t> *>(arg);
  Tally *t = p->first;
  const int who = int(p->second >> 32);
  const uint32_t seq = uint32_t(p->second);
  if (!pthread_equal(pthread_self(), t->thread)) ++t->off_thread;
  if (who < 0 || who >= 4 || seq != t->next[who]) ++t->out_of_order;
  else ++t->next[who];
  ++t->total;
  delete p;
}

void test_teardown_while_others_post(void **state) {
  auto *f = static_cast<Fixture *>(*state);
  constexpr uint32_t kFirst = 20000;  // calls each poster of the first loop makes
  Tally first, second;
  first.thread = f->loop_thread;
  std::atomic<bool> stop_second{false}, second_done{false};
  std::atomic<int> failed{0}, second_posted[4] = {};
  ibmsg_event_loop loop2{};
  assert_int_equal(ibmsg_init_event_loop(&loop2), IBMSG_OK);
  std::atomic<int> destroyed{-1}, busy_seen{0}, third{-1};
  std::thread second_thread([&] {
    second.thread = pthread_self();
    while (!second_done.load()) ibmsg_dispatch_event_loop_timeout(&loop2, 10);
    // Its posters are joined: what they posted runs, then the loop goes.
    int rc;
    while ((rc = ibmsg_destroy_event_loop(&loop2)) == IBMSG_EBUSY) {
      ++busy_seen;
      ibmsg_event_loop_process(&loop2);
    }
    destroyed = rc;
    // And a loop made and torn down here meanwhile.
    ibmsg_event_loop loop3{};
    rc = ibmsg_init_event_loop(&loop3);
    if (rc == IBMSG_OK) rc = ibmsg_destroy_event_loop(&loop3);
    third = rc;
  });
  std::vector<std::thread> posters;
  for (int t = 0; t < 4; ++t) {
    posters.emplace_back([&, t] {  // the first loop's
      for (uint32_t i = 0; i < kFirst; ++i) {
        auto *p = new std::pair<Tally *, uintptr_t>(&first, (uintptr_t(t) << 32) | i);
        if (ibmsg_event_loop_call(&f->loop, tally_call, p) != IBMSG_OK) {
          ++failed;
          delete p;
        }
      }
    });
  }
  std::vector<std::thread> second_posters;
  for (int t = 0; t < 4; ++t) {
    second_posters.emplace_back([&, t] {  // the second loop's, until told to stop
      for (uint32_t i = 0; !stop_second.load(); ++i) {
        auto *p = new std::pair<Tally *, uintptr_t>(&second, (uintptr_t(t) << 32) | i);
        if (ibmsg_event_loop_call(&loop2, tally_call, p) != IBMSG_OK) {
          ++failed;
          delete p;
          break;
        }
        ++second_posted[t];
      }
    });
  }
  const uint64_t want = uint64_t(4) * kFirst;
  bool stopped = false;
  const bool all = dispatch_until(&f->loop, [&] {
    if (!stopped && first.total >= want / 2) {  // midway: the second loop goes
      stopped = true;
      stop_second = true;
      for (auto &th : second_posters) th.join();
      second_done = true;
    }
    return first.total + uint64_t(failed.load()) >= want;
  });
  for (auto &th : posters) th.join();
  second_thread.join();
  assert_true(all);
  assert_true(stopped);
  assert_int_equal(failed.load(), 0);
  assert_int_equal(first.total, want);
  assert_int_equal(first.out_of_order + first.off_thread, 0);
  for (int t = 0; t < 4; ++t) assert_int_equal(first.next[t], kFirst);
  assert_int_equal(destroyed.load(), IBMSG_OK);
  assert_int_equal(third.load(), IBMSG_OK);
  uint64_t posted2 = 0;
  for (int t = 0; t < 4; ++t) {
    posted2 += uint64_t(second_posted[t].load());
    assert_int_equal(second.next[t], uint32_t(second_posted[t].load()));
  }
  assert_int_equal(second.total, posted2);
  assert_int_equal(second.out_of_order + second.off_thread, 0);
  assert_true(posted2 > 0);
}

// --- the wrong thread (IBMSG_DEBUG) ------------------------------------------------------------

struct Meeting {
  std::mutex mu;
  std::condition_variable cv;
  bool in_call = false, released = false;
};

void hold_the_loop(void *arg) {  // runs on the loop's thread, inside its dispatch
  auto *m = static_cast<Meeting *>(arg);
  std::unique_lock<std::mutex> lock(m->mu);
  m->in_call = true;
  m->cv.notify_all();
  // (bounded: a broken test fails instead of hanging)
  m->cv.wait_for(lock, std::chrono::milliseconds(kLimitMs), [&] { return m->released; });
}

int recv_depth_from(ibmsg_event_loop *loop) {
  const int depth = 16;
  return ibmsg_setopt(loop, IBMSG_OPT_RECV_DEPTH, &depth, sizeof depth);
}

// While the loop's thread is inside the loop (here: held in a call), another thread's
// ibmsg_setopt on it fails with IBMSG_EINVAL under IBMSG_DEBUG, its ibmsg_event_loop_call does
// not; once the loop's thread is out of the loop, the other thread may use it (a hand-over).
void test_wrong_thread_debug(void **) {
  fake::reset();
  setenv("IBMSG_DEBUG", "1", 1);
  ibmsg_event_loop loop;
  const int rc = ibmsg_init_event_loop(&loop);
  unsetenv("IBMSG_DEBUG");
  assert_int_equal(rc, IBMSG_OK);
  Meeting m;
  int during = -1, call_during = -1;
  g_ran = 0;
  std::thread other([&] {
    assert_int_equal(ibmsg_event_loop_call(&loop, hold_the_loop, &m), IBMSG_OK);
    std::unique_lock<std::mutex> lock(m.mu);
    if (!m.cv.wait_for(lock, std::chrono::milliseconds(kLimitMs), [&] { return m.in_call; }))
      fprintf(stderr, "test_handover: the call did not run in %d ms\n", kLimitMs);
    else
      during = recv_depth_from(&loop);
    call_during = ibmsg_event_loop_call(&loop, mark, nullptr);
    m.released = true;
    m.cv.notify_all();
  });
  assert_true(dispatch_until(&loop, [&] { return g_ran.load() == 1; }));
  other.join();
  assert_int_equal(during, IBMSG_EINVAL);
  assert_int_equal(call_during, IBMSG_OK);
  int after = -1;
  std::thread later([&] { after = recv_depth_from(&loop); });
  later.join();
  assert_int_equal(after, IBMSG_OK);
  assert_int_equal(ibmsg_destroy_event_loop(&loop), IBMSG_OK);
}

// --- the C++ wrapper ----------------------------------------------------------------------------

void test_cxx_call(void **) {
  fake::reset();
  ibmsg::loop l;
  const pthread_t self = pthread_self();
  std::atomic<int> off_thread{0};
  int count = 0;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&] {
      for (int i = 0; i < 1000; ++i)
        l.call([&] {
          if (!pthread_equal(pthread_self(), self)) ++off_thread;
          ++count;
        });
    });
  const double start = now_ms();
  while (count < 4000 && now_ms() - start < kLimitMs) l.dispatch(1000);
  for (auto &th : threads) th.join();
  assert_int_equal(count, 4000);
  assert_int_equal(off_thread.load(), 0);

  // What a call throws comes out of the dispatch that ran it; the calls after it still run.
  bool later = false;
  l.call([] { throw std::runtime_error("from a call"); });
  l.call([&] { later = true; });
  bool caught = false;
  try {
    l.process();
  } catch (const std::runtime_error &e) {
    caught = strcmp(e.what(), "from a call") == 0;
  }
  assert_true(caught);
  assert_true(later);

  // An empty function is refused.
  int code = 0;
  try {
    l.call(std::function<void()>());
  } catch (const ibmsg::error &e) {
    code = e.code();
  }
  assert_int_equal(code, IBMSG_EINVAL);
}

void test_cxx_destructor_runs_waiting_calls(void **) {
  fake::reset();
  int ran = 0;
  {
    ibmsg::loop l;
    l.call([&] { ++ran; });
    l.call([&] { ++ran; });
    assert_int_equal(ran, 0);
  }
  assert_int_equal(ran, 2);
}

}  // namespace

#define T(name) cmocka_unit_test_setup_teardown(name, setup, teardown)

int main(void) {
  const struct CMUnitTest tests[] = {
      T(test_many_threads),
      T(test_wakes_sleeping_loop),
      T(test_foreign_fd),
      T(test_post_from_a_call),
      T(test_order),
      T(test_invalid),
      cmocka_unit_test(test_destroy_waits_for_calls),
      T(test_teardown_while_others_post),
      cmocka_unit_test(test_wrong_thread_debug),
      cmocka_unit_test(test_cxx_call),
      cmocka_unit_test(test_cxx_destructor_runs_waiting_calls),
  };
  return cmocka_run_group_tests(tests, nullptr, nullptr);
}
