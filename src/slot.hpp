// A message buffer slot (pure): what a slot of a pool holds, by concern -- the message it
// carries, its work request, a rendezvous it receives, a request's trailer, a payload in a region.
#pragma once
#include <cstddef>
#include <cstdint>

#include "handles.hpp"
#include "ibmsg.h"
#include "list.hpp"
#include "work.hpp"

namespace ibmsg {

enum class SlotState : uint8_t {
  Free,      // send: in the pool;            recv: not posted (connection closing)
  Allocated, // send: owned by the application
  Queued,    // send: posted by the application, waiting for a credit
  InFlight,  // send: posted to the QP
  Posted,    // recv: posted to the QP
  Lent,      // recv: lent to the application until ibmsg_free_msg
};

constexpr uint32_t kSlotMagic = 0x51a7b0c5;

// Something a connection hands to its queue pair: a message or a one-sided operation. It waits in
// the connection's send queue (posting order) and then sits in its in-flight list until its
// completion; wr comes back in the completion and says which it is (wr.owner: a Slot or an Op).
struct Work {
  ListNode link;   // the connection's send queue or in-flight list
  tp::WorkCtx wr;
  // In flight: it completed (its completion came, or a later one's: a send queue completes in
  // order), with this status; its callback waits for everything posted before it (work_done).
  bool done = false;
  int status = IBMSG_OK;
  // A rendezvous message (rndv.cpp) is done once its RTS went (sent) and the peer read it (read).
  bool rndv = false;
  bool sent = false;
  bool read = false;
  int read_status = IBMSG_OK;  // IBMSG_EDECLINED if the peer declined it
};

struct LargeMem;  // a registered large buffer (memory.cpp)

// A slot's part for requests and replies (requests.cpp, dedup.cpp). Send: what it is posted as
// (MsgKind) and its trailer; a kept reply the library sends again itself (internal: no
// message_sent, freed once sent). Recv: what arrived, the requester's session, and whether the
// application answered it.
struct SlotRequest {
  uint8_t kind;
  bool retry;
  bool internal;
  bool answered;
  uint64_t id;
  uint64_t floor;
  uint64_t session;
};

// A sent message's payload in the application's region (ibmsg_msg_from_region; message.cpp): the
// region, where in it, its registration on the connection's device, and the exact-range
// registration a rendezvous from it lends the peer.
struct SlotSource {
  ::ibmsg__region *region;
  size_t off;
  const tp::Mr *mr;
  tp::Mr *xmr;
};

// A receive slot holding a rendezvous message (rndv.cpp): where its data is, and how far the
// reads into the destination got.
struct RndvIn {
  uint64_t remote = 0;  // the sender's buffer
  uint64_t length = 0;
  uint64_t next = 0;    // bytes read or being read
  uint64_t done = 0;    // bytes read (the reads complete in order)
  uint32_t rkey = 0;
  uint32_t id = 0;      // the sender's (its FIN echoes it)
  uint32_t reads = 0;   // in flight
  bool ready = false;   // delivered as soon as everything before it is
  bool declined = false;  // the application declined it: a FIN goes back instead of reads
  uint8_t *dest = nullptr;  // where the data goes: a large buffer, or the application's region
  const tp::Mr *dest_mr = nullptr;
  ibmsg__region *region = nullptr;  // the application's (busy until the message is freed)
  tp::WorkCtx wr{tp::Op::RndvRead, 0, nullptr};
  tp::WorkCtx fin_wr{tp::Op::RndvFin, 0, nullptr};
  ListNode read_link;   // in the connection's rendezvous with reads (or a FIN) still to post
};

}  // namespace ibmsg

struct ibmsg__slot {
  uint32_t magic;
  ibmsg::SlotState state;
  ibmsg::Pool *pool;
  uint8_t *buf;
  ibmsg_buffer *msg;  // send: the application's struct; recv: &own
  ibmsg_buffer own;   // recv: the struct lent to the application
  ibmsg::ListNode link;  // send: the free list, then the rendezvous waiting to be read;
                         // recv: the messages waiting to be delivered in order
  ibmsg::Work work;      // what the transport hands back when its work request completes
  bool has_imm;          // send: posted with ibmsg_post_send_imm
  uint32_t imm;
  ibmsg::SlotRequest req;  // requests.cpp, dedup.cpp
  ibmsg::LargeMem *large;  // the payload's large buffer (send) or destination (recv), if any
  ibmsg::RndvIn in;        // recv: a rendezvous message
  // send: the connection that allocated it (nullptr once it closed).
  // recv, shared (Pool::shared): the connection whose message it took (nullptr while posted and
  // once that connection closed), and whether that message came with a data credit (not a
  // control message, a peer's protocol violation or a receive flushed at a close): only then
  // does a credit come of it when it is posted again.
  ::ibmsg__socket *sock;
  bool credited;
  ibmsg::SlotSource src;  // message.cpp: a payload in the application's region
};

namespace ibmsg {

// Whether s points at a slot of any pool (by its magic); used to reject garbage pointers early.
inline bool slot_valid(const Slot *s) { return s && s->magic == kSlotMagic; }

}  // namespace ibmsg
