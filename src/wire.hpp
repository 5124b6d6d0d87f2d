// Wire format: what travels between two ibmsg peers besides the payload.
//
// Every message is an RDMA SEND with immediate data; the 32-bit immediate carries the credits
// the sender returns and the message kind, so the payload needs no header and stays aligned:
//   bits  0..15  data credits returned (receive buffers the sender re-posted since its last message)
//   bits 16..23  control credits returned
//   bit  24      CTRL: a credit-only message without payload
//   bits 25..31  zero (reserved)
// Connection set-up exchanges a Hello in the rdma_cm private data (connect and accept), and a
// rejection carries a Reject with the reason text.
#pragma once
#include <cstddef>
#include <cstdint>

namespace ibmsg::wire {

constexpr uint32_t kMaxCreditsPerMsg = 0xffff;
constexpr uint32_t kMaxCtrlCreditsPerMsg = 0xff;

struct Imm {
  uint32_t credits = 0;       // data credits returned
  uint32_t ctrl_credits = 0;  // control credits returned
  bool ctrl = false;          // credit-only message
};

// Host-order immediate value; the caller converts with htonl/ntohl at the verbs boundary.
uint32_t encode_imm(const Imm &imm);
// false if reserved bits are set (a peer that is not ibmsg, or a newer protocol).
bool decode_imm(uint32_t value, Imm *out);

constexpr uint32_t kMagic = 0x49424d53;  // "IBMS"
constexpr uint16_t kVersion = 1;

// Sent with rdma_connect() and rdma_accept(). Fits the 56 bytes an IB/RoCE REQ leaves for
// private data.
struct Hello {
  uint32_t recv_depth = 0;    // data credits the receiver of this hello starts with
  uint32_t ctrl_depth = 0;    // control credits likewise
  uint32_t max_msg_size = 0;  // largest message the sender of this hello can receive
};
constexpr size_t kHelloSize = 20;
void encode_hello(const Hello &h, uint8_t out[kHelloSize]);
// false if the data is not an ibmsg hello of this version (or too short).
bool decode_hello(const void *data, size_t len, Hello *out);

// Sent with rdma_reject(); the text is what the peer sees in ibmsg_socket.reject_reason.
constexpr size_t kRejectTextMax = 128;
constexpr size_t kRejectHeader = 8;
constexpr size_t kRejectMaxSize = kRejectHeader + kRejectTextMax;  // within the 148 bytes of a REJ
// Returns the encoded size; text is cut at kRejectTextMax bytes.
size_t encode_reject(const char *text, uint8_t out[kRejectMaxSize]);
// Copies the NUL-terminated text into out (size >= kRejectTextMax + 1); false if not an ibmsg reject.
bool decode_reject(const void *data, size_t len, char *out, size_t out_size);

}  // namespace ibmsg::wire
