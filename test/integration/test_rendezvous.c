/* test_rendezvous.c - messages of any size: above IBMSG_OPT_EAGER_SIZE the receiver reads them
 * with RDMA reads (rendezvous). Sizes around the threshold up to 1 GiB arrive byte-exact, eager
 * and rendezvous messages keep their order both ways at once, and a connection closing in the
 * middle of a rendezvous, on either side, ends with exactly one callback per message. */
#define _DEFAULT_SOURCE /* MAP_ANONYMOUS */
#define _POSIX_C_SOURCE 200809L

#include "harness.h"

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define KiB ((size_t)1024)
#define MiB (1024 * KiB)
#define EAGER ((size_t)16384) /* the default IBMSG_OPT_EAGER_SIZE */

/* Received sizes, in order (on_received hook). */
#define MAX_SIZES 512
struct sizes {
  size_t got[2][MAX_SIZES]; /* [0] the client's, [1] the server's */
  int n[2];
};

static void record_size(h_conn *c, ibmsg_buffer *msg) {
  h_ctx *ctx = c->ctx;
  struct sizes *z = ctx->data;
  int side = c == &ctx->clients[0] ? 0 : 1;
  if (z->n[side] < MAX_SIZES) z->got[side][z->n[side]++] = msg->size;
  if (msg->size && !msg->data) h_note_error(ctx, "%s: a message of %zu bytes without data", c->name, msg->size);
  if (ibmsg_free_msg(msg) != IBMSG_OK) h_note_error(ctx, "%s: ibmsg_free_msg failed", c->name);
}

/* Posts one message of each size from `from` (msgs[first...]), all at once, in order. */
static void post_sizes(h_ctx *ctx, h_conn *from, int first, const size_t *sizes, int count) {
  int i;
  for (i = 0; i < count; i++) {
    h_alloc_fill(from, &ctx->msgs[first + i], sizes[i]);
    h_post(from, &ctx->msgs[first + i]);
  }
}

static void free_msgs(h_ctx *ctx, int first, int count) {
  int i;
  for (i = first; i < first + count; i++) H_ASSERT_OK(ibmsg_free_msg(&ctx->msgs[i]));
}

static void sizes_around_the_threshold_arrive_byte_exact(void **state) {
  h_ctx *ctx = *state;
  h_conn *client, *server;
  struct sizes z;
  static const size_t sizes[] = {0, 1, EAGER - 1, EAGER, EAGER + 1, MiB, 100 * MiB, 3};
  const int count = (int)(sizeof sizes / sizeof sizes[0]);
  int i;

  memset(&z, 0, sizeof z);
  ctx->data = &z;
  ctx->on_received = record_size;
  h_pair(ctx, &client, &server);
  H_ASSERT_EQ(ibmsg_socket_max_msg_size(&client->sock), 0xffffffffu,
              "the client's maximum message size (default IBMSG_OPT_MAX_MSG_SIZE)");
  server->verify = 1;
  server->expect_size = -1;
  post_sizes(ctx, client, 0, sizes, count);
  H_RUN_UNTIL_PROGRESS(ctx, server->received == count && client->sent == count, 120000);
  h_run_for(ctx, 200);
  H_ASSERT_EQ(server->received, count, "messages received");
  H_ASSERT_EQ(client->sent_ok, count, "message_sent(IBMSG_OK) callbacks");
  for (i = 0; i < count; i++) {
    if (z.got[1][i] != sizes[i])
      h_fail_at(__FILE__, __LINE__, "message %d has %zu bytes, expected %zu", i, z.got[1][i],
                sizes[i]);
    H_ASSERT_EQ(ctx->msgs[i].status, IBMSG_SENT, "msg.status after message_sent(IBMSG_OK)");
  }
  free_msgs(ctx, 0, count);
  h_finish(ctx);
}

static void one_gib_arrives_byte_exact(void **state) {
  h_ctx *ctx = *state;
  h_conn *client, *server;
  const size_t size = 1024 * MiB;

  uint64_t cap = size;

  h_watchdog(600);
  h_pair(ctx, &client, &server);
  server->verify = 1;
  server->expect_size = (long)size;
  h_alloc_fill(client, &ctx->msgs[0], size);
  /* Above the default IBMSG_OPT_RNDV_MEMORY (512 MiB): declined unread, the connection goes on. */
  h_post(client, &ctx->msgs[0]);
  H_RUN_UNTIL(ctx, client->sent == 1, 300000);
  H_ASSERT_REASON(client->last_sent_status, IBMSG_EDECLINED, "message_sent status (above the cap)");
  H_ASSERT_EQ(server->received, 0, "messages received");
  /* With room for it, it arrives. */
  H_ASSERT_CODE(ibmsg_setopt(&ctx->loop, IBMSG_OPT_RNDV_MEMORY, &cap, sizeof cap), IBMSG_OK);
  server->recv_seq = 0;
  h_post(client, &ctx->msgs[0]);
  H_RUN_UNTIL(ctx, server->received == 1 && client->sent == 2, 300000);
  H_ASSERT_REASON(client->last_sent_status, IBMSG_OK, "message_sent status");
  free_msgs(ctx, 0, 1);
  h_finish(ctx);
}

/* Both sides send eager and rendezvous messages mixed, at once; each side checks the order (the
 * sequence number in every message) and the sizes. */
static void eager_and_rendezvous_interleaved_both_ways_keep_order(void **state) {
  h_ctx *ctx = *state;
  h_conn *client, *server;
  struct sizes z;
  static const size_t pattern[] = {10, 200 * KiB, 20, EAGER + 1, 0, 2 * MiB, EAGER, 9 * MiB + 5};
  const int plen = (int)(sizeof pattern / sizeof pattern[0]);
  const int rounds = 3, count = plen * rounds;
  size_t sizes[64];
  int i, side;

  memset(&z, 0, sizeof z);
  ctx->data = &z;
  ctx->on_received = record_size;
  for (i = 0; i < count; i++) sizes[i] = pattern[i % plen];
  h_pair(ctx, &client, &server);
  client->verify = server->verify = 1;
  client->expect_size = server->expect_size = -1;
  post_sizes(ctx, client, 0, sizes, count);
  post_sizes(ctx, server, count, sizes, count);
  H_RUN_UNTIL_PROGRESS(ctx, server->received == count && client->received == count &&
                                client->sent == count && server->sent == count,
                       180000);
  h_run_for(ctx, 200);
  H_ASSERT_EQ(client->sent_ok, count, "the client's message_sent(IBMSG_OK)");
  H_ASSERT_EQ(server->sent_ok, count, "the server's message_sent(IBMSG_OK)");
  for (side = 0; side < 2; side++) {
    H_ASSERT_EQ(z.n[side], count, "messages recorded");
    for (i = 0; i < count; i++)
      if (z.got[side][i] != sizes[i])
        h_fail_at(__FILE__, __LINE__, "%s message %d has %zu bytes, expected %zu",
                  side ? "server" : "client", i, z.got[side][i], sizes[i]);
  }
  free_msgs(ctx, 0, 2 * count);
  h_finish(ctx);
}

/* message_sent must come in posting order: the harness's sent counter at each callback. */
struct order {
  int next;
  int bad;
};

static void check_sent_order(h_conn *c, ibmsg_buffer *msg, int status) {
  struct order *o = c->ctx->data;
  int index = (int)(msg - c->ctx->msgs);
  (void)status;
  if (index != o->next && !o->bad) {
    o->bad = 1;
    h_note_error(c->ctx, "%s: message_sent for message %d, expected %d (posting order)", c->name,
                 index, o->next);
  }
  o->next++;
}

static void message_sent_comes_in_posting_order(void **state) {
  h_ctx *ctx = *state;
  h_conn *client, *server;
  struct order o = {0, 0};
  /* A large message first: the small ones behind it complete on the wire earlier. */
  static const size_t sizes[] = {32 * MiB, 8, 16, EAGER + 1, 8, 4 * MiB, 1, 2};
  const int count = (int)(sizeof sizes / sizeof sizes[0]);

  ctx->data = &o;
  ctx->on_sent = check_sent_order;
  h_pair(ctx, &client, &server);
  server->verify = 1;
  server->expect_size = -1;
  post_sizes(ctx, client, 0, sizes, count);
  H_RUN_UNTIL_PROGRESS(ctx, server->received == count && client->sent == count, 120000);
  H_ASSERT_EQ(o.next, count, "message_sent callbacks");
  H_ASSERT_EQ(client->sent_ok, count, "message_sent(IBMSG_OK)");
  free_msgs(ctx, 0, count);
  h_finish(ctx);
}

/* A receiver that holds rendezvous messages keeps the sender's credits; freeing them lets the
 * rest through. */
static void held_rendezvous_messages_hold_credits_until_freed(void **state) {
  h_ctx *ctx = *state;
  h_conn *client, *server;
  const int depth = 4, total = 12;
  size_t sizes[12];
  int i;

  for (i = 0; i < total; i++) sizes[i] = i % 2 ? EAGER + 100 : 300 * KiB;
  h_setopt_int(ctx, IBMSG_OPT_SHARED_RECV, 0); /* exactly depth credits */
  h_setopt_int(ctx, IBMSG_OPT_RECV_DEPTH, depth);
  h_pair(ctx, &client, &server);
  server->verify = 1;
  server->expect_size = -1;
  server->hold = 1;
  post_sizes(ctx, client, 0, sizes, total);
  H_RUN_UNTIL(ctx, server->received == depth, H_TIMEOUT_MS);
  h_run_for(ctx, 500);
  H_ASSERT_EQ(server->received, depth, "messages delivered while the receiver holds them all");
  H_CHECK(!client->closed && !server->closed, "a connection closed: %s / %s",
          ibmsg_err_name(client->close_reason), ibmsg_err_name(server->close_reason));
  server->hold = 0;
  h_release_held(server);
  H_RUN_UNTIL_PROGRESS(ctx, server->received == total && client->sent == total, 60000);
  H_ASSERT_EQ(client->sent_ok, total, "message_sent(IBMSG_OK)");
  free_msgs(ctx, 0, total);
  h_finish(ctx);
}

/* Closing in the middle of a rendezvous. The message is large enough that its reads take seconds
 * on Soft-RoCE; `who` disconnects once the first part has had time to go. */
static void close_mid_transfer(h_ctx *ctx, int receiver_closes) {
  h_conn *client, *server;
  const size_t size = 256 * MiB;

  h_pair(ctx, &client, &server);
  client->expect_send_errors = 1;
  server->expect_send_errors = 1;
  h_alloc_fill(client, &ctx->msgs[0], 100);
  h_post(client, &ctx->msgs[0]);
  h_alloc_fill(client, &ctx->msgs[1], size);
  h_post(client, &ctx->msgs[1]);
  h_alloc_fill(client, &ctx->msgs[2], 200);
  h_post(client, &ctx->msgs[2]);
  H_RUN_UNTIL(ctx, server->received >= 1, H_TIMEOUT_MS);
  h_run_for(ctx, 300);
  H_ASSERT_EQ(server->received, 1, "messages received before the close (the large one is read)");
  H_ASSERT_OK(ibmsg_disconnect(receiver_closes ? &server->sock : &client->sock));
  H_RUN_UNTIL(ctx, client->closed && server->closed, H_TIMEOUT_MS);
  h_run_for(ctx, 200);
  /* Exactly one message_sent per message, all before connection_closed; the first is done, the
   * large one and the one behind it are not. */
  H_ASSERT_EQ(client->sent, 3, "the client's message_sent callbacks");
  H_ASSERT_EQ(client->sent_at_close, 3, "message_sent callbacks before connection_closed");
  H_ASSERT_EQ(client->sent_ok, 1, "message_sent(IBMSG_OK): only the first message");
  H_ASSERT_EQ(server->received, 1, "messages received: none of the interrupted rendezvous");
  H_ASSERT_EQ(ctx->msgs[1].status, IBMSG_SEND_FAILED, "the large message's status");
  free_msgs(ctx, 0, 3);
  h_finish(ctx);
}

static void receiver_closing_mid_transfer_cancels_the_message(void **state) { close_mid_transfer(*state, 1); }

static void sender_closing_mid_transfer_cancels_the_message(void **state) { close_mid_transfer(*state, 0); }

/* A side with IBMSG_OPT_MAX_MSG_SIZE at the eager size offers no rendezvous: the peer's maximum
 * is the eager size too, and larger allocations fail. */
static void no_rendezvous_when_the_maximum_is_the_eager_size(void **state) {
  h_ctx *ctx = *state;
  h_conn *client, *server;
  ibmsg_buffer m;
  uint64_t max64 = 0;
  size_t len = sizeof max64;
  int max_int = 0;

  h_setopt_int(ctx, IBMSG_OPT_MAX_MSG_SIZE, (int)EAGER);
  h_pair(ctx, &client, &server);
  H_ASSERT_EQ(ibmsg_socket_max_msg_size(&client->sock), EAGER, "the client's maximum");
  H_ASSERT_EQ(ibmsg_socket_max_msg_size(&server->sock), EAGER, "the server's maximum");
  H_ASSERT_CODE(ibmsg_alloc_msg(&m, &client->sock, EAGER + 1), IBMSG_EMSGSIZE);
  H_ASSERT_OK(ibmsg_getopt(&ctx->loop, IBMSG_OPT_MAX_MSG_SIZE, &max64, &len));
  H_ASSERT_EQ(max64, EAGER, "IBMSG_OPT_MAX_MSG_SIZE read as uint64_t");
  max64 = 0xffffffffu;
  H_ASSERT_OK(ibmsg_setopt(&ctx->loop, IBMSG_OPT_MAX_MSG_SIZE, &max64, sizeof max64));
  len = sizeof max_int;
  H_ASSERT_OK(ibmsg_getopt(&ctx->loop, IBMSG_OPT_MAX_MSG_SIZE, &max_int, &len));
  H_ASSERT_EQ(max_int, 0x7fffffff, "2^32 - 1 read into an int (clamped)");
  h_finish(ctx);
}

/* --- zero copy from a region, the receiver's choice of destination, declines ---------------- */

/* What message_incoming does, per message in arrival order: 0 library buffer, 1 into the test's
 * region, 2 decline, 3 a region too small (then the library buffer). */
struct incoming {
  int plan[16];
  int n;                 /* message_incoming calls */
  int to_region_rc[16];  /* what ibmsg_incoming_to_region returned */
  ibmsg_region *region;  /* the receiver's, 64 MiB */
  ibmsg_region *small;   /* 1 KiB */
  size_t offset;         /* where the next message goes in region */
  size_t sizes[16];      /* in->size seen */
  uint32_t imms[16];
  uint32_t flags[16];
};

static void on_incoming(ibmsg_socket *socket, ibmsg_incoming *in) {
  h_ctx *ctx = socket->loop->user_data;
  struct incoming *g = ctx->data;
  int i = g->n++;
  if (i >= 16) return;
  g->sizes[i] = in->size;
  g->imms[i] = in->imm;
  g->flags[i] = in->flags;
  switch (g->plan[i]) {
    case 1:
      g->to_region_rc[i] = ibmsg_incoming_to_region(in, g->region, g->offset);
      g->offset += in->size;
      break;
    case 2: g->to_region_rc[i] = ibmsg_incoming_decline(in); break;
    case 3: g->to_region_rc[i] = ibmsg_incoming_to_region(in, g->small, 0); break;
    default: g->to_region_rc[i] = 0; break;
  }
}

/* The sender sends from a region without a copy (eager and rendezvous, with and without an
 * immediate); the receiver puts some into its region, declines one, leaves some to the library
 * and names a region too small for another. Everything not declined arrives byte-exact, in
 * order; the declined one gets IBMSG_EDECLINED and the connection stays up. */
static void region_messages_destinations_and_declines(void **state) {
  h_ctx *ctx = *state;
  h_conn *client, *server;
  struct incoming g;
  ibmsg_region src, dst, small;
  /* sizes and plans, in posting order; plan applies to rendezvous messages only */
  static const size_t sizes[] = {100, 5 * MiB, 200 * KiB, EAGER + 1, 3 * MiB, 10, 70000, 2 * MiB};
  /* for the 6 messages above EAGER, in order: 5 MiB declined, 200 KiB into the region, ... */
  static const int plan[] = {2, 1, 0, 3, 1, 0};
  static const int with_imm[] = {1, 0, 1, 0, 1, 1, 0, 1};
  const int count = (int)(sizeof sizes / sizeof sizes[0]);
  size_t off = 0, region_off = 0;
  int i, big = 0, received_big = 0;
  ibmsg_buffer *held[8];

  memset(&g, 0, sizeof g);
  memcpy(g.plan, plan, sizeof plan);
  ctx->data = &g;
  H_ASSERT_OK(ibmsg_alloc_region(&ctx->loop, &src, 32 * MiB, 0));
  H_ASSERT_OK(ibmsg_alloc_region(&ctx->loop, &dst, 64 * MiB, IBMSG_ACCESS_LOCAL_WRITE));
  H_ASSERT_OK(ibmsg_alloc_region(&ctx->loop, &small, KiB, IBMSG_ACCESS_LOCAL_WRITE));
  g.region = &dst;
  g.small = &small;
  ctx->loop.message_incoming = on_incoming;
  h_pair(ctx, &client, &server);
  server->hold = 1; /* checked below, then freed */
  for (i = 0; i < count; i++) {
    ibmsg_buffer *m = &ctx->msgs[i];
    H_ASSERT_OK(ibmsg_msg_from_region(m, &client->sock, &src, off, sizes[i]));
    H_CHECK(m->data == (char *)src.addr + off, "msg->data is not the region's bytes");
    h_fill(m->data, sizes[i], (uint32_t)i);
    off += sizes[i];
    if (with_imm[i]) {
      H_ASSERT_OK(ibmsg_post_send_imm(&client->sock, m, 0x1000u + (uint32_t)i));
      client->posted++;
      ctx->outstanding[i]++;
    } else {
      h_post(client, m);
    }
  }
  H_ASSERT_CODE(ibmsg_deregister_region(&src), IBMSG_EBUSY); /* messages point into it */
  H_RUN_UNTIL_PROGRESS(ctx, client->sent == count && server->received == count - 1, 60000);
  h_run_for(ctx, 300);
  H_ASSERT_EQ(server->received, count - 1, "messages received (one declined)");
  H_ASSERT_EQ(client->sent_ok, count - 1, "message_sent(IBMSG_OK)");
  H_ASSERT_EQ(client->sent_other, 1, "message_sent with another status");
  H_ASSERT_EQ(g.n, 6, "message_incoming calls (the messages above the eager size)");
  H_ASSERT_CODE(g.to_region_rc[0], IBMSG_OK); /* the decline */
  H_ASSERT_CODE(g.to_region_rc[1], IBMSG_OK);
  H_ASSERT_CODE(g.to_region_rc[3], IBMSG_ERANGE); /* 64 KiB + 1 into 1 KiB */
  H_ASSERT_CODE(g.to_region_rc[4], IBMSG_OK);
  H_ASSERT_EQ(ctx->msgs[1].status, IBMSG_SEND_FAILED, "the declined message's status");
  H_CHECK(!client->closed && !server->closed, "a connection closed: %s / %s",
          ibmsg_err_name(client->close_reason), ibmsg_err_name(server->close_reason));
  /* the declined message (index 1) is missing; the rest in order, byte-exact */
  H_ASSERT_EQ(server->n_held, count - 1, "messages held");
  for (i = 0; i < count; i++) {
    char why[160];
    ibmsg_buffer *r;
    int k = i < 1 ? i : i - 1;
    if (i == 1) {
      big++;
      continue;
    }
    r = server->held[k];
    H_ASSERT_EQ(r->size, sizes[i], "a received message's size");
    if (h_check(r->data, r->size, (uint32_t)i, why, sizeof why) != 0)
      h_fail_at(__FILE__, __LINE__, "message %d: %s", i, why);
    H_ASSERT_EQ(r->flags & IBMSG_MSG_IMM, with_imm[i] ? IBMSG_MSG_IMM : 0, "IBMSG_MSG_IMM");
    if (with_imm[i]) H_ASSERT_EQ(r->imm, 0x1000u + (uint32_t)i, "the immediate");
    if (sizes[i] > EAGER) {
      const int p = plan[big++];
      received_big++;
      H_ASSERT_EQ(r->flags & IBMSG_MSG_REGION, p == 1 ? IBMSG_MSG_REGION : 0, "IBMSG_MSG_REGION");
      if (p == 1) {
        H_CHECK(r->data == (char *)dst.addr + region_off, "message %d is not where it was put", i);
        region_off += sizes[i];
      }
    }
    held[k] = r;
  }
  for (i = 0; i < 6; i++) {
    H_ASSERT_EQ(g.sizes[i], sizes[i < 3 ? i + 1 : i < 4 ? 4 : i + 2], "in->size");
  }
  (void)held;
  H_ASSERT_EQ(received_big, 5, "rendezvous messages received");
  H_ASSERT_CODE(ibmsg_deregister_region(&dst), IBMSG_EBUSY); /* received messages point into it */
  server->hold = 0;
  h_release_held(server);
  for (i = 0; i < count; i++) H_ASSERT_OK(ibmsg_free_msg(&ctx->msgs[i]));
  H_ASSERT_OK(ibmsg_deregister_region(&src));
  H_ASSERT_OK(ibmsg_deregister_region(&dst));
  H_ASSERT_OK(ibmsg_deregister_region(&small));
  ctx->loop.message_incoming = NULL;
  h_finish(ctx);
}

/* A large message from read-only memory (a region registered without local write): the peer
 * reads it through a registration that asks for no local write either. */
static void rendezvous_from_read_only_memory(void **state) {
  h_ctx *ctx = *state;
  h_conn *client, *server;
  ibmsg_region ro;
  const size_t len = 2 * MiB;
  void *mem = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

  H_CHECK(mem != MAP_FAILED, "mmap failed");
  h_fill(mem, MiB, 0);
  h_fill((char *)mem + MiB, 100, 1);
  H_CHECK(mprotect(mem, len, PROT_READ) == 0, "mprotect failed");
  H_ASSERT_OK(ibmsg_register_region(&ctx->loop, &ro, mem, len, 0));
  h_pair(ctx, &client, &server);
  server->verify = 1;
  server->expect_size = -1;
  H_ASSERT_OK(ibmsg_msg_from_region(&ctx->msgs[0], &client->sock, &ro, 0, MiB));
  h_post(client, &ctx->msgs[0]);
  H_ASSERT_OK(ibmsg_msg_from_region(&ctx->msgs[1], &client->sock, &ro, MiB, 100));
  h_post(client, &ctx->msgs[1]);
  H_RUN_UNTIL(ctx, server->received == 2 && client->sent == 2, H_TIMEOUT_MS);
  H_ASSERT_EQ(client->sent_ok, 2, "message_sent(IBMSG_OK)");
  free_msgs(ctx, 0, 2);
  H_ASSERT_OK(ibmsg_deregister_region(&ro));
  munmap(mem, len);
  h_finish(ctx);
}

int main(int argc, char **argv) {
  const struct CMUnitTest tests[] = {
      H_TEST(sizes_around_the_threshold_arrive_byte_exact),
      H_TEST(eager_and_rendezvous_interleaved_both_ways_keep_order),
      H_TEST(message_sent_comes_in_posting_order),
      H_TEST(held_rendezvous_messages_hold_credits_until_freed),
      H_TEST(receiver_closing_mid_transfer_cancels_the_message),
      H_TEST(sender_closing_mid_transfer_cancels_the_message),
      H_TEST(no_rendezvous_when_the_maximum_is_the_eager_size),
      H_TEST(region_messages_destinations_and_declines),
      H_TEST(rendezvous_from_read_only_memory),
      H_TEST(one_gib_arrives_byte_exact),
  };
  h_init(argc, argv);
  return cmocka_run_group_tests(tests, NULL, NULL);
}
