// Thin adapters over libibverbs / librdmacm for one connection: queues, pools, posting.
#pragma once
#include "internal.hpp"

namespace ibmsg {

constexpr uint64_t kCtrlWrId = 1;  // wr_id of credit-only sends (slots are aligned: never 1)

// Creates the CQ, the QP (on s->id), both pools (registered) and posts all receive buffers.
// s->dev and s->opts must be set. On failure everything created is released again.
int conn_create(Socket *s);
// Destroys the QP and the CQ (pools stay: the application may still hold messages).
void conn_destroy_queues(Socket *s);

int post_recv(Socket *s, Slot *slot);
int post_data(Socket *s, Slot *slot, uint32_t imm);
int post_ctrl(Socket *s, uint32_t imm);

int pool_register(Device *dev, Pool *p);
void pool_deregister(Pool *p);

}  // namespace ibmsg
