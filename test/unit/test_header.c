/* test_header.c - ibmsg.h as a C99 -pedantic program sees it (test_header_cxx.cpp is the C++
 * half): every public type and constant compiles and means the same in C and C++.
 *
 * ibmsg.h comes first, so that it must compile on its own. */
#include <ibmsg.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

/* Defined in test_header_cxx.cpp. */
size_t header_cxx_layout(const char *what);
size_t header_cxx_layout_count(void);
const char *header_cxx_strerror(int code);
int header_cxx_wrapper_error_matches(void);

/* The version macros work in the preprocessor. */
#if !defined(IBMSG_VERSION) || IBMSG_VERSION < 10000
#error "IBMSG_VERSION is missing or not a number the preprocessor can compare"
#endif

/* Every public type as a variable; static so that the test functions see them. */
static ibmsg_event_loop the_loop;
static ibmsg_socket the_socket;
static ibmsg_buffer the_buffer;
static ibmsg_connection_request the_request;
static enum ibmsg_error an_error = IBMSG_OK;
static enum ibmsg_socket_status a_socket_status = IBMSG_UNCONNECTED;
static enum ibmsg_buffer_status a_buffer_status = IBMSG_WAITING;
static enum ibmsg_request_status a_request_status = IBMSG_UNDECIDED;
static enum ibmsg_option an_option = IBMSG_OPT_RECV_DEPTH;

/* Callbacks with the documented signatures: assigning them to the loop's fields only compiles
 * (with -Werror) if the typedefs agree. */
static void on_request(ibmsg_connection_request *request) { (void)request; }
static void on_established(ibmsg_socket *socket) { (void)socket; }
static void on_received(ibmsg_socket *socket, ibmsg_buffer *msg) {
  (void)socket;
  (void)msg;
}
static void on_sent(ibmsg_socket *socket, ibmsg_buffer *msg, int status) {
  (void)socket;
  (void)msg;
  (void)status;
}
static void on_closed(ibmsg_socket *socket, int reason) {
  (void)socket;
  (void)reason;
}
static ibmsg_connection_request_cb request_cb = on_request;
static ibmsg_connection_established_cb established_cb = on_established;
static ibmsg_message_received_cb received_cb = on_received;
static ibmsg_message_sent_cb sent_cb = on_sent;
static ibmsg_connection_closed_cb closed_cb = on_closed;

/* The list test_header_cxx.cpp includes too: what must be the same in both languages. */
static const struct {
  const char *what;
  size_t c_value;
} layout[] = {
#include "test_header_layout.h"
};
#define NLAYOUT (sizeof layout / sizeof layout[0])

/* Whether the n values are pairwise different; *a and *b name the first equal pair. */
static int all_distinct(const int *values, size_t n, size_t *a, size_t *b) {
  size_t i, j;
  for (i = 0; i < n; ++i)
    for (j = i + 1; j < n; ++j)
      if (values[i] == values[j]) {
        *a = i;
        *b = j;
        return 0;
      }
  return 1;
}

static void c_and_cxx_see_the_same_layout_and_values(void **state) {
  size_t i;
  (void)state;
  for (i = 0; i < NLAYOUT; ++i) {
    size_t cxx = header_cxx_layout(layout[i].what);
    if (cxx == (size_t)-1) fail_msg("the C++ half does not know %s", layout[i].what);
    if (cxx != layout[i].c_value)
      fail_msg("%s is %lu in C but %lu in C++", layout[i].what, (unsigned long)layout[i].c_value,
               (unsigned long)cxx);
  }
  /* Both lists must be complete: nothing the C++ half checks may be missing here. */
  assert_int_equal(header_cxx_layout_count(), NLAYOUT);
}

static void socket_statuses_are_distinct(void **state) {
  const int v[] = {IBMSG_UNCONNECTED,   IBMSG_ADDRESS_RESOLVED, IBMSG_ROUTE_RESOLVED,
                   IBMSG_CONNECTED,     IBMSG_DISCONNECTING,    IBMSG_ERROR,
                   IBMSG_LISTENING};
  size_t a = 0, b = 0;
  (void)state;
  if (!all_distinct(v, sizeof v / sizeof v[0], &a, &b))
    fail_msg("socket statuses %lu and %lu are both %d", (unsigned long)a, (unsigned long)b, v[a]);
  /* A zeroed ibmsg_socket reads as not set up. */
  assert_int_equal(IBMSG_UNCONNECTED, 0);
}

static void buffer_statuses_are_distinct(void **state) {
  const int v[] = {IBMSG_WAITING, IBMSG_SENT, IBMSG_RECEIVED, IBMSG_SEND_FAILED, IBMSG_FREED};
  size_t a = 0, b = 0;
  (void)state;
  if (!all_distinct(v, sizeof v / sizeof v[0], &a, &b))
    fail_msg("buffer statuses %lu and %lu are both %d", (unsigned long)a, (unsigned long)b, v[a]);
}

static void request_statuses_are_distinct(void **state) {
  const int v[] = {IBMSG_UNDECIDED, IBMSG_ACCEPTED, IBMSG_REJECTED};
  size_t a = 0, b = 0;
  (void)state;
  if (!all_distinct(v, sizeof v / sizeof v[0], &a, &b))
    fail_msg("request statuses %lu and %lu are both %d", (unsigned long)a, (unsigned long)b, v[a]);
  assert_int_equal(IBMSG_UNDECIDED, 0); /* a request left alone is undecided */
}

static void options_are_distinct_and_not_zero(void **state) {
  const int v[] = {IBMSG_OPT_RECV_DEPTH,   IBMSG_OPT_SEND_DEPTH,      IBMSG_OPT_SEND_QUEUE,
                   IBMSG_OPT_MAX_MSG_SIZE, IBMSG_OPT_CONNECT_TIMEOUT, IBMSG_OPT_RNR_RETRY,
                   IBMSG_OPT_SOURCE_ADDR,  IBMSG_OPT_DEVICE,          IBMSG_OPT_RDMA,
                   IBMSG_OPT_RDMA_DEPTH,   IBMSG_OPT_BUSY_POLL,       IBMSG_OPT_EAGER_SIZE,
                   IBMSG_OPT_SHARED_RECV,  IBMSG_OPT_KEEPALIVE,       IBMSG_OPT_KEEPALIVE_COUNT,
                   IBMSG_OPT_ACK_TIMEOUT,  IBMSG_OPT_RETRY_COUNT,     IBMSG_OPT_REQUEST_WINDOW,
                   IBMSG_OPT_REPLY_CACHE,  IBMSG_OPT_RNDV_MEMORY,     IBMSG_OPT_VIOLATION_BAN,
                   IBMSG_OPT_CONNECT_LIMIT, IBMSG_OPT_SHARED_RECV_BUDGET};
  size_t i, a = 0, b = 0;
  (void)state;
  if (!all_distinct(v, sizeof v / sizeof v[0], &a, &b))
    fail_msg("options %lu and %lu are both %d", (unsigned long)a, (unsigned long)b, v[a]);
  for (i = 0; i < sizeof v / sizeof v[0]; ++i)
    if (v[i] == 0)
      fail_msg("option %lu is 0, which a zeroed variable would pick", (unsigned long)i);
}

static void error_codes_are_distinct(void **state) {
  const int v[] = {
      IBMSG_OK,
#define CODE(name, value, text) IBMSG_##name,
      IBMSG_ERRNO_MAP(CODE) IBMSG_ERROR_MAP(CODE)
#undef CODE
  };
  size_t a = 0, b = 0;
  (void)state;
  if (!all_distinct(v, sizeof v / sizeof v[0], &a, &b))
    fail_msg("error codes %s and %s are both %d", ibmsg_err_name(v[a]), ibmsg_err_name(v[b]), v[a]);
}

static void original_ibmsg_names_are_ibmsg_error_codes(void **state) {
  /* Programs written for the original ibmsg compare results with these names. */
  const struct {
    const char *name;
    int value;
  } old[] = {
#define OLD(n) {#n, n},
      OLD(IBMSG_FCNTL_FAILED) OLD(IBMSG_GETADDRINFO_FAILED) OLD(IBMSG_CREATE_ID_FAILED)
      OLD(IBMSG_BIND_FAILED) OLD(IBMSG_LISTEN_FAILED) OLD(IBMSG_ADDRESS_RESOLUTION_FAILED)
      OLD(IBMSG_FETCH_EVENT_FAILED) OLD(IBMSG_ACK_EVENT_FAILED) OLD(IBMSG_ALLOC_FAILED)
      OLD(IBMSG_MEMORY_REGISTRATION_FAILED) OLD(IBMSG_POST_SEND_FAILED)
      OLD(IBMSG_DISCONNECT_FAILED) OLD(IBMSG_FREE_BUFFER_FAILED) OLD(IBMSG_CREATE_QP_FAILED)
      OLD(IBMSG_ACCEPT_FAILED) OLD(IBMSG_EPOLL_FAILED) OLD(IBMSG_EPOLL_ADD_FD_FAILED)
      OLD(IBMSG_EPOLL_WAIT_FAILED)
#undef OLD
  };
  size_t i;
  (void)state;
  for (i = 0; i < sizeof old / sizeof old[0]; ++i) {
    if (old[i].value == IBMSG_OK) fail_msg("%s is IBMSG_OK: old code would miss the failure",
                                           old[i].name);
    if (strcmp(ibmsg_err_name(old[i].value), "IBMSG_UNKNOWN") == 0)
      fail_msg("%s is %d, which is no ibmsg error code", old[i].name, old[i].value);
  }
}

static void public_structs_hold_what_the_header_promises(void **state) {
  (void)state;
  /* The peer's reject text (up to 128 bytes) must fit with its terminator. */
  assert_true(sizeof the_socket.reject_reason >= 128 + 1);
  /* The fields the application writes take what it has. */
  the_loop.connection_request = request_cb;
  the_loop.connection_established = established_cb;
  the_loop.message_received = received_cb;
  the_loop.message_sent = sent_cb;
  the_loop.connection_closed = closed_cb;
  the_loop.user_data = &the_socket;
  the_socket.user_data = &the_buffer;
  the_buffer.user_data = &the_request;
  the_buffer.size = (size_t)-1;
  assert_true(the_loop.message_sent == on_sent);
  assert_ptr_equal(the_loop.user_data, &the_socket);
  assert_true(the_buffer.size == (size_t)-1); /* size_t, not a narrower type */
  /* The zero-initialized statics read as "nothing yet". */
  assert_int_equal(the_socket.status, IBMSG_UNCONNECTED);
  assert_int_equal(the_request.status, IBMSG_UNDECIDED);
  assert_int_equal(an_error + a_socket_status + a_buffer_status + a_request_status, 0);
  assert_int_equal(an_option, IBMSG_OPT_RECV_DEPTH);
}

/* Later minor versions add fields in the reserved room, so it must be the last member of each
 * caller-allocated struct and hold n pointers (four, less what 1.x versions took from it: the
 * message immediate and flags took one of ibmsg_buffer's, write_received and message_incoming
 * two of the loop's). */
#define ASSERT_ENDS_IN_RESERVED(t, n)                                                            \
  do {                                                                                           \
    t *x = NULL;                                                                                 \
    if (sizeof x->reserved != (n) * sizeof(void *))                                              \
      fail_msg(#t ".reserved is %zu bytes, expected room for %d pointers", sizeof x->reserved,  \
               (n));                                                                             \
    if (offsetof(t, reserved) + sizeof x->reserved != sizeof(t))                                 \
      fail_msg(#t ".reserved ends at %zu, but the struct is %zu bytes: it is not last",          \
               offsetof(t, reserved) + sizeof x->reserved, sizeof(t));                           \
  } while (0)

static void public_structs_end_in_reserved_room(void **state) {
  (void)state;
  ASSERT_ENDS_IN_RESERVED(ibmsg_buffer, 3);
  ASSERT_ENDS_IN_RESERVED(ibmsg_socket, 4);
  ASSERT_ENDS_IN_RESERVED(ibmsg_event_loop, 1); /* log took one in 1.4 */
  ASSERT_ENDS_IN_RESERVED(ibmsg_incoming, 3); /* request took one in 1.5 */
  ASSERT_ENDS_IN_RESERVED(ibmsg_connection_request, 4);
  ASSERT_ENDS_IN_RESERVED(ibmsg_region, 4);
  ASSERT_ENDS_IN_RESERVED(ibmsg_op, 4);
}

/* The sizes of ABI 1 (soname libibmsg.so.1) on LP64: a change here breaks compiled programs and
 * needs a new soname; new fields go into the reserved room instead. */
static void struct_sizes_are_those_of_abi_1(void **state) {
  (void)state;
#if defined(__LP64__)
  assert_int_equal(sizeof(ibmsg_buffer), 72);
  assert_int_equal(sizeof(ibmsg_socket), 200);
  assert_int_equal(sizeof(ibmsg_event_loop), 88);
  assert_int_equal(sizeof(ibmsg_connection_request), 80);
  assert_int_equal(sizeof(ibmsg_region), 80);
  assert_int_equal(sizeof(ibmsg_op), 72);
  assert_int_equal(sizeof(ibmsg_descriptor), IBMSG_DESCRIPTOR_SIZE);
#else
  skip();
#endif
}

static void cxx_calls_the_same_library(void **state) {
  (void)state;
  /* The same static string: the C++ half linked the same extern "C" symbol. */
  assert_ptr_equal(header_cxx_strerror(IBMSG_EMSGSIZE), ibmsg_strerror(IBMSG_EMSGSIZE));
}

static void cxx_wrapper_error_carries_the_c_code_and_text(void **state) {
  int r = header_cxx_wrapper_error_matches();
  (void)state;
  if (r < 0) skip(); /* no ibmsg.hpp in this tree */
  assert_int_equal(r, 1);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(c_and_cxx_see_the_same_layout_and_values),
      cmocka_unit_test(socket_statuses_are_distinct),
      cmocka_unit_test(buffer_statuses_are_distinct),
      cmocka_unit_test(request_statuses_are_distinct),
      cmocka_unit_test(options_are_distinct_and_not_zero),
      cmocka_unit_test(error_codes_are_distinct),
      cmocka_unit_test(original_ibmsg_names_are_ibmsg_error_codes),
      cmocka_unit_test(public_structs_hold_what_the_header_promises),
      cmocka_unit_test(public_structs_end_in_reserved_room),
      cmocka_unit_test(struct_sizes_are_those_of_abi_1),
      cmocka_unit_test(cxx_calls_the_same_library),
      cmocka_unit_test(cxx_wrapper_error_carries_the_c_code_and_text),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
