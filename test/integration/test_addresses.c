/* test_addresses.c - IPv4, IPv6 and host names; listening on all addresses; port 0; the
 * addresses and device a socket reports; the IBMSG_OPT_DEVICE and IBMSG_OPT_SOURCE_ADDR options. */
#define _POSIX_C_SOURCE 200809L

#include "harness.h"

#include <arpa/inet.h>
#include <string.h>

#define FOREIGN_ADDR "169.254.99.99" /* not an address of this host */

/* True if the numeric addresses a and b are the same address (either family). */
static int same_address(const char *a, const char *b) {
  unsigned char x[16], y[16];
  if (inet_pton(AF_INET, a, x) == 1 && inet_pton(AF_INET, b, y) == 1) return memcmp(x, y, 4) == 0;
  if (inet_pton(AF_INET6, a, x) == 1 && inet_pton(AF_INET6, b, y) == 1) return memcmp(x, y, 16) == 0;
  return 0;
}

#define ASSERT_ADDRESS(getter, conn, expected, what)                                            \
  do {                                                                                          \
    char h__buf[64];                                                                            \
    H_ASSERT_OK(getter(&(conn)->sock, h__buf, sizeof h__buf, NULL));                            \
    H_CHECK(same_address(h__buf, (expected)), "%s is \"%s\", expected \"%s\"", (what), h__buf,  \
            (expected));                                                                        \
  } while (0)

/* getter (the local or the peer address) of the client and of the accepted socket must be
 * IBMSG_TEST_ADDR; stores their ports. */
static void both_ends_at(h_ctx *ctx, int (*getter)(const ibmsg_socket *, char *, size_t, unsigned short *),
                         const char *kind, h_conn *client, h_conn *server, unsigned short *cport,
                         unsigned short *sport) {
  char caddr[64], saddr[64];
  H_ASSERT_OK(getter(&client->sock, caddr, sizeof caddr, cport));
  H_ASSERT_OK(getter(&server->sock, saddr, sizeof saddr, sport));
  H_CHECK(same_address(caddr, ctx->addr), "the client's %s address is \"%s\", expected \"%s\"",
          kind, caddr, ctx->addr);
  H_CHECK(same_address(saddr, ctx->addr), "the accepted socket's %s address is \"%s\", expected \"%s\"",
          kind, saddr, ctx->addr);
}

/* Streams n verified messages each way over an established pair. */
static void exchange(h_ctx *ctx, h_conn *client, h_conn *server, int n) {
  client->verify = server->verify = 1;
  h_stream_both(ctx, client, server, n, 300, 8, 60000);
}

static void ipv6_connection_exchanges_messages(void **state) {
  h_ctx *ctx = *state;
  const char *addr6 = h_env("IBMSG_TEST_ADDR6");
  h_conn *client, *server;

  h_listen(ctx, addr6, 8);
  h_pair_to(ctx, addr6, &client, &server);
  exchange(ctx, client, server, 100);
  ASSERT_ADDRESS(ibmsg_socket_peer_address, server, addr6, "peer address of the accepted socket");
  ASSERT_ADDRESS(ibmsg_socket_local_address, client, addr6, "local address of the client");
  h_finish(ctx);
}

/* Listens on name and connects to name; the accepted socket's peer must be expected_peer. */
static void connect_by_name(h_ctx *ctx, const char *name, const char *expected_peer) {
  h_conn *client, *server;
  char peer[64];

  h_listen(ctx, name, 8);
  h_pair_to(ctx, name, &client, &server);
  exchange(ctx, client, server, 10);
  H_ASSERT_OK(ibmsg_socket_peer_address(&server->sock, peer, sizeof peer, NULL));
  print_message("%s: connected, peer address %s\n", name, peer);
  if (expected_peer)
    H_CHECK(same_address(peer, expected_peer), "peer address over %s is \"%s\", expected \"%s\"",
            name, peer, expected_peer);
  h_finish(ctx);
}

static void ipv4_host_name_connects(void **state) {
  h_ctx *ctx = *state;
  connect_by_name(ctx, "ibmsg-test4", ctx->addr);
}

static void ipv6_host_name_connects(void **state) {
  h_ctx *ctx = *state;
  connect_by_name(ctx, "ibmsg-test6", h_env("IBMSG_TEST_ADDR6"));
}

static void dual_stack_host_name_connects(void **state) {
  h_ctx *ctx = *state;
  connect_by_name(ctx, h_env("IBMSG_TEST_HOST"), NULL);
}

/* A listener on all addresses accepts a client over IPv4 and one over IPv6. */
static void listen_everywhere(h_ctx *ctx, const char *any) {
  const char *addr6 = h_env("IBMSG_TEST_ADDR6");
  h_conn *c4, *s4, *c6, *s6;

  h_listen(ctx, any, 8);
  h_pair_to(ctx, ctx->addr, &c4, &s4);
  h_pair_to(ctx, addr6, &c6, &s6);
  exchange(ctx, c4, s4, 10);
  exchange(ctx, c6, s6, 10);
  ASSERT_ADDRESS(ibmsg_socket_peer_address, s4, ctx->addr, "peer address of the IPv4 connection");
  ASSERT_ADDRESS(ibmsg_socket_peer_address, s6, addr6, "peer address of the IPv6 connection");
  h_finish(ctx);
}

static void listener_on_null_accepts_ipv4_and_ipv6(void **state) { listen_everywhere(*state, NULL); }

static void listener_on_empty_string_accepts_ipv4_and_ipv6(void **state) { listen_everywhere(*state, ""); }

static void port_zero_picks_a_free_port(void **state) {
  h_ctx *ctx = *state;
  h_conn *second, *client, *server;
  unsigned short port2 = 0;
  char addr[64];

  h_listen(ctx, ctx->addr, 8); /* asserts a non-zero port */
  H_ASSERT_OK(ibmsg_socket_local_address(&ctx->listener.sock, addr, sizeof addr, NULL));
  H_CHECK(same_address(addr, ctx->addr), "the listener's local address is \"%s\", expected \"%s\"",
          addr, ctx->addr);
  /* A second listener on port 0 (kept in a client slot so the harness closes it). */
  second = &ctx->clients[ctx->n_clients++];
  H_ASSERT_OK(ibmsg_listen(&ctx->loop, &second->sock, ctx->addr, 0, 8));
  second->sock.user_data = second;
  second->active = 1;
  H_ASSERT_OK(ibmsg_socket_local_address(&second->sock, NULL, 0, &port2));
  H_CHECK(port2 != 0 && port2 != ctx->port, "two listeners on port 0 got ports %u and %u",
          (unsigned)ctx->port, (unsigned)port2);
  h_pair(ctx, &client, &server);
  h_finish(ctx);
}

static void addresses_of_both_ends_match(void **state) {
  h_ctx *ctx = *state;
  h_conn *client, *server;
  unsigned short cport = 0, sport = 0, cpeer_port = 0, speer_port = 0;

  h_pair(ctx, &client, &server);
  both_ends_at(ctx, ibmsg_socket_local_address, "local", client, server, &cport, &sport);
  H_ASSERT_EQ(sport, ctx->port, "the accepted socket's local port (the listener's)");
  H_CHECK(cport != 0, "the client's local port is 0");

  both_ends_at(ctx, ibmsg_socket_peer_address, "peer", client, server, &cpeer_port, &speer_port);
  H_ASSERT_EQ(cpeer_port, ctx->port, "the client's peer port");
  H_ASSERT_EQ(speer_port, cport, "the accepted socket's peer port (the client's local port)");
  H_CHECK(same_address(ctx->request_peer, ctx->addr), "request->peer_address is \"%s\", expected \"%s\"",
          ctx->request_peer, ctx->addr);
  h_finish(ctx);
}

static void check_device(const ibmsg_socket *s, const char *expected, const char *what) {
  const char *dev = ibmsg_socket_device(s);
  H_CHECK(dev != NULL && strcmp(dev, expected) == 0, "the device of %s is \"%s\", expected \"%s\"",
          what, dev ? dev : "(NULL)", expected);
}

static void sockets_report_the_test_device(void **state) {
  h_ctx *ctx = *state;
  const char *device = h_env("IBMSG_TEST_DEVICE");
  h_conn *client, *server;

  h_pair(ctx, &client, &server);
  check_device(&client->sock, device, "the client");
  check_device(&server->sock, device, "the accepted socket");
  check_device(&ctx->listener.sock, device, "a listener bound to IBMSG_TEST_ADDR");
  h_finish(ctx);
}

static void device_option_naming_the_device_connects(void **state) {
  h_ctx *ctx = *state;
  const char *device = h_env("IBMSG_TEST_DEVICE");
  h_conn *client, *server;

  h_setopt_str(ctx, IBMSG_OPT_DEVICE, device);
  h_pair(ctx, &client, &server);
  check_device(&client->sock, device, "the client");
  exchange(ctx, client, server, 10);
  h_finish(ctx);
}

static void device_option_naming_no_device_fails_with_enodev(void **state) {
  h_ctx *ctx = *state;

  h_listen(ctx, ctx->addr, 8);
  h_setopt_str(ctx, IBMSG_OPT_DEVICE, "nosuchdev");
  h_connect_must_fail(ctx, ctx->addr, ctx->port, IBMSG_ENODEV, H_TIMEOUT_MS, 1,
                      "with IBMSG_OPT_DEVICE \"nosuchdev\"");
  H_ASSERT_EQ(ctx->n_servers, 0, "sockets accepted for a connection that must not start");
  h_finish(ctx);
}

static void source_address_option_connects_from_it(void **state) {
  h_ctx *ctx = *state;
  h_conn *client, *server;

  h_setopt_str(ctx, IBMSG_OPT_SOURCE_ADDR, ctx->addr);
  h_pair(ctx, &client, &server);
  ASSERT_ADDRESS(ibmsg_socket_local_address, client, ctx->addr, "the client's local address");
  ASSERT_ADDRESS(ibmsg_socket_peer_address, server, ctx->addr, "the accepted socket's peer address");
  exchange(ctx, client, server, 10);
  h_finish(ctx);
}

static void ipv6_source_address_option_connects_from_it(void **state) {
  h_ctx *ctx = *state;
  const char *addr6 = h_env("IBMSG_TEST_ADDR6");
  h_conn *client, *server;

  h_listen(ctx, addr6, 8);
  h_setopt_str(ctx, IBMSG_OPT_SOURCE_ADDR, addr6);
  h_pair_to(ctx, addr6, &client, &server);
  ASSERT_ADDRESS(ibmsg_socket_local_address, client, addr6, "the client's local address");
  h_finish(ctx);
}

static void source_address_that_is_not_local_fails(void **state) {
  h_ctx *ctx = *state;

  h_listen(ctx, ctx->addr, 8);
  h_setopt_str(ctx, IBMSG_OPT_SOURCE_ADDR, FOREIGN_ADDR);
  h_connect_must_fail(ctx, ctx->addr, ctx->port, IBMSG_EADDRNOTAVAIL, H_TIMEOUT_MS, 0,
                      "from source address " FOREIGN_ADDR);
  h_finish(ctx);
}

/* ibmsg_listen on ip/port must fail with `expected` and set nothing up. */
static void listen_must_fail(h_ctx *ctx, const char *ip, unsigned short port, int expected) {
  h_conn *l = &ctx->clients[ctx->n_clients++];
  int rc = ibmsg_listen(&ctx->loop, &l->sock, ip, port, 8);
  if (rc == IBMSG_OK) {
    l->sock.user_data = l;
    l->active = 1;
  }
  H_CHECK(rc == expected, "ibmsg_listen(%s, %u) returned %s, expected %s", ip, (unsigned)port,
          ibmsg_err_name(rc), ibmsg_err_name(expected));
  h_run_for(ctx, 200);
  H_ASSERT_EQ(l->closed, 0, "connection_closed callbacks after ibmsg_listen failed");
}

static void listen_on_port_in_use_fails_with_eaddrinuse(void **state) {
  h_ctx *ctx = *state;
  h_listen(ctx, ctx->addr, 8);
  listen_must_fail(ctx, ctx->addr, ctx->port, IBMSG_EADDRINUSE);
  h_finish(ctx);
}

static void listen_on_foreign_address_fails_with_eaddrnotavail(void **state) {
  h_ctx *ctx = *state;
  listen_must_fail(ctx, FOREIGN_ADDR, 0, IBMSG_EADDRNOTAVAIL);
  h_finish(ctx);
}

static void listen_on_unresolvable_name_fails_with_enoaddr(void **state) {
  h_ctx *ctx = *state;
  listen_must_fail(ctx, "no-such-host.invalid", 0, IBMSG_ENOADDR);
  h_finish(ctx);
}

int main(int argc, char **argv) {
  const struct CMUnitTest tests[] = {
      H_TEST(ipv6_connection_exchanges_messages),
      H_TEST(ipv4_host_name_connects),
      H_TEST(ipv6_host_name_connects),
      H_TEST(dual_stack_host_name_connects),
      H_TEST(listener_on_null_accepts_ipv4_and_ipv6),
      H_TEST(listener_on_empty_string_accepts_ipv4_and_ipv6),
      H_TEST(port_zero_picks_a_free_port),
      H_TEST(addresses_of_both_ends_match),
      H_TEST(sockets_report_the_test_device),
      H_TEST(device_option_naming_the_device_connects),
      H_TEST(device_option_naming_no_device_fails_with_enodev),
      H_TEST(source_address_option_connects_from_it),
      H_TEST(ipv6_source_address_option_connects_from_it),
      H_TEST(source_address_that_is_not_local_fails),
      H_TEST(listen_on_port_in_use_fails_with_eaddrinuse),
      H_TEST(listen_on_foreign_address_fails_with_eaddrnotavail),
      H_TEST(listen_on_unresolvable_name_fails_with_enoaddr),
  };
  h_init(argc, argv);
  return cmocka_run_group_tests(tests, NULL, NULL);
}
