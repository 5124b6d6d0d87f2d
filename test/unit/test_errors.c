/* test_errors.c - error texts and names, the version, and the argument checks of the C API that
 * need no RDMA device (NULL and never-initialized handles). */
#include <errno.h>
#include <limits.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "ibmsg.h"

struct code {
  int value;
  const char *name; /* "IBMSG_EINVAL" */
  const char *text; /* the text the header documents */
};

/* Every code of the header's tables, IBMSG_OK first. */
static const struct code codes[] = {
    {IBMSG_OK, "IBMSG_OK", NULL},
#define CODE(name, value, text) {IBMSG_##name, "IBMSG_" #name, text},
    IBMSG_ERRNO_MAP(CODE) IBMSG_ERROR_MAP(CODE)
#undef CODE
};
#define NCODES (sizeof codes / sizeof codes[0])

static int is_known_code(int value) {
  size_t i;
  for (i = 0; i < NCODES; ++i)
    if (codes[i].value == value) return 1;
  return 0;
}

/* --- ibmsg_strerror ----------------------------------------------------------------------- */

static void strerror_gives_the_documented_text_for_every_code(void **state) {
  size_t i;
  (void)state;
  for (i = 1; i < NCODES; ++i) {
    const char *text = ibmsg_strerror(codes[i].value);
    if (!text) fail_msg("ibmsg_strerror(%s) returned NULL", codes[i].name);
    if (strcmp(text, codes[i].text) != 0)
      fail_msg("ibmsg_strerror(%s) is \"%s\", the header documents \"%s\"", codes[i].name, text,
               codes[i].text);
  }
}

static void strerror_of_ok_is_a_text(void **state) {
  const char *text = ibmsg_strerror(IBMSG_OK);
  (void)state;
  assert_non_null(text);
  assert_true(text[0] != '\0');
}

static void strerror_texts_are_non_empty_and_distinct(void **state) {
  size_t i, j;
  (void)state;
  for (i = 0; i < NCODES; ++i) {
    const char *a = ibmsg_strerror(codes[i].value);
    if (!a || !a[0]) fail_msg("ibmsg_strerror(%s) is NULL or empty", codes[i].name);
    for (j = i + 1; j < NCODES; ++j)
      if (strcmp(a, ibmsg_strerror(codes[j].value)) == 0)
        fail_msg("%s and %s have the same text \"%s\"", codes[i].name, codes[j].name, a);
  }
}

static void strerror_of_an_unknown_code_is_a_text_of_its_own(void **state) {
  const int unknown[] = {-1, -IBMSG_EINVAL, INT_MIN, INT_MAX, IBMSG_EBASE + 100,
                         IBMSG__ERROR_END, 100000};
  size_t i, j;
  (void)state;
  for (i = 0; i < sizeof unknown / sizeof unknown[0]; ++i) {
    const char *text = ibmsg_strerror(unknown[i]);
    if (!text || !text[0]) fail_msg("ibmsg_strerror(%d) is NULL or empty", unknown[i]);
    /* An unknown code must not pass for a known one. */
    for (j = 0; j < NCODES; ++j)
      if (strcmp(text, ibmsg_strerror(codes[j].value)) == 0)
        fail_msg("ibmsg_strerror(%d) is \"%s\", the text of %s", unknown[i], text, codes[j].name);
  }
}

static void strerror_of_an_errno_outside_the_map_is_the_systems_text(void **state) {
  const int errnos[] = {EPERM, ENOENT, EEXIST, ENOSPC, EPIPE, EROFS};
  size_t i;
  (void)state;
  for (i = 0; i < sizeof errnos / sizeof errnos[0]; ++i) {
    char expected[256];
    const char *text;
    if (is_known_code(errnos[i])) fail_msg("errno %d is in the map: pick another", errnos[i]);
    snprintf(expected, sizeof expected, "%s", strerror(errnos[i]));
    text = ibmsg_strerror(errnos[i]);
    if (!text || strcmp(text, expected) != 0)
      fail_msg("ibmsg_strerror(%d) is \"%s\", expected strerror's \"%s\"", errnos[i],
               text ? text : "(null)", expected);
  }
}

static void errno_based_codes_equal_the_systems_errno(void **state) {
  (void)state;
#define SAME(name, value, text)                                                                  \
  if (IBMSG_##name != name)                                                                       \
    fail_msg("IBMSG_" #name " is %d but the system's " #name " is %d", IBMSG_##name, name);
  IBMSG_ERRNO_MAP(SAME)
#undef SAME
}

static void codes_are_in_their_documented_ranges(void **state) {
  size_t i;
  (void)state;
  assert_int_equal(IBMSG_OK, 0);
#define BELOW(name, value, text)                                                                 \
  if (IBMSG_##name <= 0 || IBMSG_##name >= IBMSG_ERRNO_MAX)                                       \
    fail_msg("IBMSG_" #name " (%d) is not an errno value", IBMSG_##name);
  IBMSG_ERRNO_MAP(BELOW)
#undef BELOW
#define ABOVE(name, value, text)                                                                 \
  if (IBMSG_##name < IBMSG_EBASE)                                                                 \
    fail_msg("IBMSG_" #name " (%d) is below IBMSG_EBASE", IBMSG_##name);
  IBMSG_ERROR_MAP(ABOVE)
#undef ABOVE
  for (i = 1; i < NCODES; ++i)
    if (codes[i].value <= 0) fail_msg("%s is not positive", codes[i].name);
}

/* --- ibmsg_err_name ----------------------------------------------------------------------- */

static void err_name_round_trips_every_code(void **state) {
  size_t i;
  (void)state;
  for (i = 0; i < NCODES; ++i) {
    const char *name = ibmsg_err_name(codes[i].value);
    if (!name || strcmp(name, codes[i].name) != 0)
      fail_msg("ibmsg_err_name(%d) is \"%s\", expected \"%s\"", codes[i].value,
               name ? name : "(null)", codes[i].name);
  }
}

static void err_name_of_an_unknown_code_is_unknown(void **state) {
  const int unknown[] = {-1, INT_MIN, INT_MAX, EPERM, IBMSG_EBASE + 100, IBMSG__ERROR_END};
  size_t i;
  (void)state;
  for (i = 0; i < sizeof unknown / sizeof unknown[0]; ++i) {
    const char *name = ibmsg_err_name(unknown[i]);
    if (!name || strcmp(name, "IBMSG_UNKNOWN") != 0)
      fail_msg("ibmsg_err_name(%d) is \"%s\", expected \"IBMSG_UNKNOWN\"", unknown[i],
               name ? name : "(null)");
  }
}

/* --- version -------------------------------------------------------------------------------- */

static void version_matches_the_header(void **state) {
  int major = -1, minor = -1, patch = -1;
  (void)state;
  ibmsg_version(&major, &minor, &patch);
  assert_int_equal(major, IBMSG_VERSION_MAJOR);
  assert_int_equal(minor, IBMSG_VERSION_MINOR);
  assert_int_equal(patch, IBMSG_VERSION_PATCH);
  assert_int_equal(IBMSG_VERSION, 10000 * major + 100 * minor + patch);
}

static void version_accepts_null_pointers(void **state) {
  int minor = -1;
  (void)state;
  ibmsg_version(NULL, NULL, NULL);
  ibmsg_version(NULL, &minor, NULL);
  assert_int_equal(minor, IBMSG_VERSION_MINOR);
}

static void version_string_matches_the_numbers(void **state) {
  int major, minor, patch;
  char expected[64];
  const char *s = ibmsg_version_string();
  (void)state;
  ibmsg_version(&major, &minor, &patch);
  snprintf(expected, sizeof expected, "%d.%d.%d", major, minor, patch);
  assert_non_null(s);
  assert_string_equal(s, expected);
}

/* --- NULL handles ---------------------------------------------------------------------------- */

static void loop_functions_reject_a_null_loop(void **state) {
  int v = 32, ms = 77;
  size_t len = sizeof v;
  ibmsg_memory m;
  (void)state;
  memset(&m, 0x5a, sizeof m);
  assert_int_equal(ibmsg_init_event_loop(NULL), IBMSG_EINVAL);
  assert_int_equal(ibmsg_init_event_loop_ev(NULL, NULL), IBMSG_EINVAL);
  assert_int_equal(ibmsg_destroy_event_loop(NULL), IBMSG_EINVAL);
  assert_int_equal(ibmsg_dispatch_event_loop(NULL), IBMSG_EINVAL);
  assert_int_equal(ibmsg_dispatch_event_loop_timeout(NULL, 0), IBMSG_EINVAL);
  assert_int_equal(ibmsg_dispatch_event_loop_timeout(NULL, 10), IBMSG_EINVAL);
  assert_int_equal(ibmsg_event_loop_process(NULL), IBMSG_EINVAL);
  assert_int_equal(ibmsg_event_loop_fd(NULL), -1);
  assert_int_equal(ibmsg_event_loop_timeout(NULL), -1);
  assert_int_equal(ibmsg_event_loop_next_timeout(NULL, &ms), IBMSG_EINVAL);
  assert_int_equal(ms, 77); /* nothing written */
  assert_int_equal(ibmsg_loop_memory(NULL, &m), IBMSG_EINVAL);
  assert_int_equal(ibmsg_loop_memory_info(NULL, &m, sizeof m), IBMSG_EINVAL);
  assert_int_equal(ibmsg_socket_memory(NULL, &m), IBMSG_EINVAL);
  assert_int_equal(ibmsg_socket_memory_info(NULL, &m, sizeof m), IBMSG_EINVAL);
  assert_int_equal(m.buffers, (size_t)0x5a5a5a5a5a5a5a5aULL); /* nothing written */
  assert_int_equal(ibmsg_setopt(NULL, IBMSG_OPT_RECV_DEPTH, &v, sizeof v), IBMSG_EINVAL);
  assert_int_equal(ibmsg_getopt(NULL, IBMSG_OPT_RECV_DEPTH, &v, &len), IBMSG_EINVAL);
  assert_int_equal(v, 32); /* nothing written */
}

static void init_with_a_null_libev_loop_is_rejected(void **state) {
  ibmsg_event_loop loop;
  (void)state;
  memset(&loop, 0, sizeof loop);
  assert_int_equal(ibmsg_init_event_loop_ev(&loop, NULL), IBMSG_EINVAL);
  assert_null(loop.impl); /* nothing was set up */
}

static void socket_functions_reject_null_arguments(void **state) {
  ibmsg_socket sock;
  char buf[64];
  unsigned short port = 7;
  (void)state;
  memset(&sock, 0, sizeof sock);
  assert_int_equal(ibmsg_listen(NULL, &sock, NULL, 0, 1), IBMSG_EINVAL);
  assert_int_equal(ibmsg_connect(NULL, &sock, "192.0.2.1", 1), IBMSG_EINVAL);
  assert_int_equal(ibmsg_accept(NULL, &sock), IBMSG_EINVAL);
  assert_int_equal(ibmsg_reject(NULL, "no"), IBMSG_EINVAL);
  assert_int_equal(ibmsg_disconnect(NULL), IBMSG_EINVAL);
  assert_int_equal(ibmsg_socket_local_address(NULL, buf, sizeof buf, &port), IBMSG_EINVAL);
  assert_int_equal(ibmsg_socket_peer_address(NULL, buf, sizeof buf, &port), IBMSG_EINVAL);
  assert_int_equal(port, 7); /* nothing written */
  assert_null(ibmsg_socket_device(NULL));
  assert_int_equal(ibmsg_socket_max_msg_size(NULL), 0);
}

static void message_functions_reject_null_arguments(void **state) {
  ibmsg_socket sock;
  ibmsg_buffer msg;
  (void)state;
  memset(&sock, 0, sizeof sock);
  memset(&msg, 0, sizeof msg);
  assert_int_equal(ibmsg_alloc_msg(NULL, NULL, 0), IBMSG_EINVAL);
  assert_int_equal(ibmsg_alloc_msg(NULL, &sock, 0), IBMSG_EINVAL);
  assert_int_equal(ibmsg_alloc_msg(&msg, NULL, 0), IBMSG_EINVAL);
  assert_int_equal(ibmsg_post_send(NULL, NULL), IBMSG_EINVAL);
  assert_int_equal(ibmsg_post_send(NULL, &msg), IBMSG_EINVAL);
  assert_int_equal(ibmsg_post_send(&sock, NULL), IBMSG_EINVAL);
  assert_int_equal(ibmsg_free_msg(NULL), IBMSG_EINVAL);
}

/* --- handles that were never set up (zeroed) -------------------------------------------------- */

static void loop_functions_reject_a_loop_never_initialized(void **state) {
  ibmsg_event_loop loop;
  ibmsg_socket sock;
  ibmsg_memory m;
  int v = 32, ms = 77;
  size_t len = sizeof v;
  (void)state;
  memset(&loop, 0, sizeof loop);
  memset(&sock, 0, sizeof sock);
  assert_int_equal(ibmsg_destroy_event_loop(&loop), IBMSG_EINVAL);
  assert_int_equal(ibmsg_dispatch_event_loop(&loop), IBMSG_EINVAL);
  assert_int_equal(ibmsg_dispatch_event_loop_timeout(&loop, 0), IBMSG_EINVAL);
  assert_int_equal(ibmsg_event_loop_process(&loop), IBMSG_EINVAL);
  assert_int_equal(ibmsg_event_loop_fd(&loop), -1);
  assert_int_equal(ibmsg_event_loop_timeout(&loop), -1);
  assert_int_equal(ibmsg_event_loop_next_timeout(&loop, &ms), IBMSG_EINVAL);
  assert_int_equal(ms, 77);
  assert_int_equal(ibmsg_loop_memory_info(&loop, &m, sizeof m), IBMSG_EINVAL);
  assert_int_equal(ibmsg_socket_memory_info(&sock, &m, sizeof m), IBMSG_EINVAL);
  assert_int_equal(ibmsg_setopt(&loop, IBMSG_OPT_RECV_DEPTH, &v, sizeof v), IBMSG_EINVAL);
  assert_int_equal(ibmsg_getopt(&loop, IBMSG_OPT_RECV_DEPTH, &v, &len), IBMSG_EINVAL);
  assert_int_equal(ibmsg_listen(&loop, &sock, NULL, 0, 1), IBMSG_EINVAL);
  assert_int_equal(ibmsg_connect(&loop, &sock, "192.0.2.1", 1), IBMSG_EINVAL);
}

static void request_functions_reject_a_request_never_made(void **state) {
  ibmsg_connection_request req;
  ibmsg_socket sock;
  (void)state;
  memset(&req, 0, sizeof req);
  memset(&sock, 0, sizeof sock);
  assert_int_equal(ibmsg_accept(&req, &sock), IBMSG_EINVAL);
  assert_int_equal(ibmsg_reject(&req, "no"), IBMSG_EINVAL);
  assert_null(sock.impl); /* the socket was not touched */
}

static void post_send_on_a_socket_never_connected_is_enotconn(void **state) {
  ibmsg_socket sock;
  ibmsg_buffer msg;
  (void)state;
  memset(&sock, 0, sizeof sock);
  memset(&msg, 0, sizeof msg);
  assert_int_equal(ibmsg_post_send(&sock, &msg), IBMSG_ENOTCONN);
}

static void alloc_msg_on_a_socket_never_connected_is_enotconn(void **state) {
  ibmsg_socket sock;
  ibmsg_buffer msg;
  (void)state;
  memset(&sock, 0, sizeof sock);
  memset(&msg, 0, sizeof msg);
  assert_int_equal(ibmsg_alloc_msg(&msg, &sock, 0), IBMSG_ENOTCONN);
  assert_null(msg.data); /* no buffer attached */
  assert_null(msg.impl);
}

static void socket_queries_on_a_socket_never_connected_fail(void **state) {
  ibmsg_socket sock;
  char buf[64];
  unsigned short port = 7;
  (void)state;
  memset(&sock, 0, sizeof sock);
  assert_int_equal(ibmsg_disconnect(&sock), IBMSG_ENOTCONN);
  assert_int_equal(ibmsg_socket_local_address(&sock, buf, sizeof buf, &port), IBMSG_ENOTCONN);
  assert_int_equal(ibmsg_socket_peer_address(&sock, buf, sizeof buf, &port), IBMSG_ENOTCONN);
  assert_int_equal(port, 7);
  assert_null(ibmsg_socket_device(&sock));
}

static void free_msg_of_a_buffer_never_allocated_is_enotalloc(void **state) {
  ibmsg_buffer msg;
  (void)state;
  memset(&msg, 0, sizeof msg);
  assert_int_equal(ibmsg_free_msg(&msg), IBMSG_ENOTALLOC);
}

static void free_msg_of_a_buffer_pointing_at_garbage_is_enotalloc(void **state) {
  /* impl pointing at something that is not a slot: rejected by the slot's magic. */
  uint64_t garbage[16];
  ibmsg_buffer msg;
  (void)state;
  memset(garbage, 0x5a, sizeof garbage);
  memset(&msg, 0, sizeof msg);
  msg.impl = (struct ibmsg__slot *)(void *)garbage;
  assert_int_equal(ibmsg_free_msg(&msg), IBMSG_ENOTALLOC);
}

/* --- ibmsg_init_event_loop without an RDMA device -------------------------------------------- */

static void init_event_loop_fails_cleanly_or_works_without_a_device(void **state) {
  /* This host may or may not have the rdma_cm interface: either outcome is fine, but a failure
   * must be a documented code and leave a struct every other call rejects. */
  ibmsg_event_loop loop;
  int rc;
  (void)state;
  memset(&loop, 0xa5, sizeof loop);
  rc = ibmsg_init_event_loop(&loop);
  if (rc == IBMSG_OK) {
    assert_null(loop.connection_request); /* documented: all callbacks NULL */
    assert_null(loop.connection_established);
    assert_null(loop.message_received);
    assert_null(loop.message_sent);
    assert_null(loop.connection_closed);
    assert_int_equal(ibmsg_destroy_event_loop(&loop), IBMSG_OK);
    assert_int_equal(ibmsg_dispatch_event_loop(&loop), IBMSG_EINVAL); /* destroyed */
    return;
  }
  print_message("ibmsg_init_event_loop failed here with %s (%s)\n", ibmsg_err_name(rc),
                ibmsg_strerror(rc));
  if (!is_known_code(rc)) fail_msg("ibmsg_init_event_loop returned %d, not an ibmsg code", rc);
  assert_int_equal(ibmsg_dispatch_event_loop(&loop), IBMSG_EINVAL);
  assert_int_equal(ibmsg_event_loop_fd(&loop), -1);
  assert_int_equal(ibmsg_destroy_event_loop(&loop), IBMSG_EINVAL);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(strerror_gives_the_documented_text_for_every_code),
      cmocka_unit_test(strerror_of_ok_is_a_text),
      cmocka_unit_test(strerror_texts_are_non_empty_and_distinct),
      cmocka_unit_test(strerror_of_an_unknown_code_is_a_text_of_its_own),
      cmocka_unit_test(strerror_of_an_errno_outside_the_map_is_the_systems_text),
      cmocka_unit_test(errno_based_codes_equal_the_systems_errno),
      cmocka_unit_test(codes_are_in_their_documented_ranges),
      cmocka_unit_test(err_name_round_trips_every_code),
      cmocka_unit_test(err_name_of_an_unknown_code_is_unknown),
      cmocka_unit_test(version_matches_the_header),
      cmocka_unit_test(version_accepts_null_pointers),
      cmocka_unit_test(version_string_matches_the_numbers),
      cmocka_unit_test(loop_functions_reject_a_null_loop),
      cmocka_unit_test(init_with_a_null_libev_loop_is_rejected),
      cmocka_unit_test(socket_functions_reject_null_arguments),
      cmocka_unit_test(message_functions_reject_null_arguments),
      cmocka_unit_test(loop_functions_reject_a_loop_never_initialized),
      cmocka_unit_test(request_functions_reject_a_request_never_made),
      cmocka_unit_test(post_send_on_a_socket_never_connected_is_enotconn),
      cmocka_unit_test(alloc_msg_on_a_socket_never_connected_is_enotconn),
      cmocka_unit_test(socket_queries_on_a_socket_never_connected_fail),
      cmocka_unit_test(free_msg_of_a_buffer_never_allocated_is_enotalloc),
      cmocka_unit_test(free_msg_of_a_buffer_pointing_at_garbage_is_enotalloc),
      cmocka_unit_test(init_event_loop_fails_cleanly_or_works_without_a_device),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
