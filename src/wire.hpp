// Wire format: what travels between two ibmsg peers besides the payload (ibmsg(7), WIRE
// PROTOCOL, says the same for users).
//
// Every message is an RDMA SEND with immediate data. The 32-bit immediate carries the message's
// opcode and the credits the sender returns, so the payload needs no header and stays aligned:
//   bits  0..15  data credits returned (receive buffers the sender re-posted since its last message);
//                with kFeatureShared, bits 0..14 (at most 32767 a message) and bit 15 "wants":
//                more data messages wait behind this one at its sender (a receiver that shares
//                its receive buffers among connections gives it more credits, up to the cap of
//                its hello, while buffers are free)
//   bits 16..23  control credits returned
//   bits 24..27  rendezvous messages of the peer this side has read, in the order they came
//                (kFeatureRndv; zero without it): they are done, the peer's buffers free again
//   bits 28..31  opcode: 0 data, 1 credit-only, 3 rendezvous (an RTS or a FIN, below; needs
//                kFeatureRndv), 5 data with an application immediate (the payload ends in 4
//                more bytes: the immediate, little-endian; needs kFeatureImm), 6 return (a
//                credit-only message, spending a control credit, whose bits 0..14 give data
//                credits back: its sender held more than the peer's base and had nothing to send
//                with them; needs kFeatureShared), 2 keepalive probe (a credit-only message that
//                asks the peer to answer at once with any message; needs kFeatureKeepalive),
//                7 request and 8 reply (data messages whose payload ends in a ReqTrailer, below;
//                need kFeatureRequest); 4 and 9..15 reserved (4 RDMA notice is set aside for the
//                feature that will use it)
// An RDMA write with immediate (kFeatureRdma) carries the application's immediate in all 32 bits:
// the receiver tells it from a message by its completion (not a receive), and it spends one data
// credit without returning any.
// Connection set-up exchanges a Hello in the rdma_cm private data (connect and accept): protocol
// major/minor version and feature bits, the receive depths and maximum size, and (1.5) the
// session of the sender's requests; a rejection
// carries a Reject with the reason text. Multi-byte fields are little-endian.
#pragma once
#include <cstddef>
#include <cstdint>

namespace ibmsg::wire {

constexpr uint32_t kMaxCreditsPerMsg = 0xffff;
constexpr uint32_t kMaxCtrlCreditsPerMsg = 0xff;

enum class Opcode : uint8_t {
  Data = 0,        // a message with payload, spends a data credit
  Credit = 1,      // credit-only, no payload, spends a control credit
  Keepalive = 2,   // credit-only, a probe the peer answers at once: kFeatureKeepalive
  Rendezvous = 3,  // an RTS (a data credit) or a FIN (a control credit): kFeatureRndv
  RdmaNotice = 4,  // reserved
  DataImm = 5,     // a message whose payload ends in a 4-byte application immediate
  Return = 6,      // credit-only, gives data credits back (credits field): kFeatureShared
  Request = 7,     // a data message that asks for a reply: payload + ReqTrailer (kFeatureRequest)
  Reply = 8,       // a data message that answers a Request: payload + ReqTrailer (kFeatureRequest)
};
constexpr uint32_t kImmTrailer = 4;  // bytes a DataImm message adds after the payload
constexpr uint32_t kMaxTrailer = 24;  // the most any message adds (a Request or Reply: kReqTrailer)
constexpr uint8_t kOpcodeCount = 16;  // the opcode field has 4 bits

struct Imm {
  Opcode op = Opcode::Data;
  uint32_t credits = 0;       // data credits returned
  uint32_t ctrl_credits = 0;  // control credits returned
  uint32_t done = 0;          // rendezvous messages read (at most kMaxDonePerMsg)
  bool wants = false;         // kFeatureShared: bit 15 of the credits field (encode_imm sets it;
                              // decode_imm leaves it in credits: split_wants takes it out)
};
constexpr uint32_t kMaxDonePerMsg = 15;
constexpr uint32_t kMaxSharedCreditsPerMsg = 0x7fff;  // with kFeatureShared
constexpr uint32_t kWantsBit = 0x8000;
// With kFeatureShared: the wants bit out of the credits field.
inline void split_wants(Imm *imm) {
  imm->wants = (imm->credits & kWantsBit) != 0;
  imm->credits &= kMaxSharedCreditsPerMsg;
}

// Host-order immediate value; the transport converts to network order.
uint32_t encode_imm(const Imm &imm);
// Every value decodes: whether an opcode or a done count is allowed on a connection depends on
// the features both sides agreed on.
bool decode_imm(uint32_t value, Imm *out);
// decode_imm, and with kFeatureShared agreed (shared) the wants bit out of the credits field:
// a received immediate, or one this side encoded and has not posted yet.
inline Imm imm_of(uint32_t value, bool shared) {
  Imm imm;
  decode_imm(value, &imm);
  if (shared) split_wants(&imm);
  return imm;
}

constexpr uint32_t kMagic = 0x49424d53;  // "IBMS"
// The protocol version: peers with the same major connect, using the features both have; a
// different major is refused with a reject text naming both versions.
constexpr uint8_t kMajor = 1;
constexpr uint8_t kMinor = 5;
// Feature bits of the hello: a connection uses a feature when both hellos have its bit.
constexpr uint32_t kFeatureRdma = 1u << 0;  // one-sided RDMA: this side accepts RDMA reads,
                                            // writes, write-immediates and atomics on the regions
                                            // it describes, and issues them
constexpr uint32_t kFeatureImm = 1u << 1;   // DataImm messages
// Rendezvous messages (protocol 1.2): larger than the eager limit, pulled by the receiver with
// RDMA reads, confirmed by the done count of the immediate.
constexpr uint32_t kFeatureRndv = 1u << 2;
// Shared receive buffers (protocol 1.3): the sender of the hello may grant more data credits than
// its recv_depth, up to its cap, to a peer whose messages say it wants them (the wants bit), and
// takes Return messages; its peer sets the wants bit and gives back what it holds above the
// recv_depth of the hello once it has nothing to send.
constexpr uint32_t kFeatureShared = 1u << 3;
// Keepalive (protocol 1.4): the sender of the hello answers a Keepalive probe at once (a
// credit-only message if nothing else goes), so a peer that hears nothing from it for long knows
// it is dead, frozen or cut off.
constexpr uint32_t kFeatureKeepalive = 1u << 4;
// Requests (protocol 1.5): Request and Reply messages, whose payload ends in a ReqTrailer naming
// the request; the hello carries the session of the requests its sender posts.
constexpr uint32_t kFeatureRequest = 1u << 5;
// every feature this version offers
constexpr uint32_t kFeatures = kFeatureRdma | kFeatureImm | kFeatureRndv | kFeatureShared |
                               kFeatureKeepalive | kFeatureRequest;

// Limits a hello must respect to make sense.
constexpr uint32_t kMaxDepth = 65535;     // data credits fit 16 bits
constexpr uint32_t kMaxCtrlDepth = 255;   // control credits fit 8 bits

// Sent with the connect and accept calls of the CM. Fits the 56 bytes an IB/RoCE REQ leaves for
// private data.
struct Hello {
  uint8_t major = kMajor;
  uint8_t minor = kMinor;
  uint32_t features = kFeatures;
  uint32_t recv_depth = 0;    // data credits the receiver of this hello starts with
  uint32_t ctrl_depth = 0;    // control credits likewise
  // Largest message the sender of this hello receives in a receive buffer (eagerly): all a
  // peer of protocol 1.1, which knows no rendezvous, may send it.
  uint32_t max_msg_size = 0;
  // Largest message it receives at all, the part above max_msg_size by rendezvous (with
  // kFeatureRndv on both sides); 0: none above max_msg_size. Zero in a hello of protocol 1.1
  // (24 bytes, or padded with zeros by the transport).
  uint32_t rndv_max_size = 0;
  // The most data credits the sender of this hello may grant (kFeatureShared; at least
  // recv_depth, which is what it grants at first and always gives back). 0 in the hello of a
  // peer before protocol 1.3 (28 bytes): recv_depth.
  uint32_t cap = 0;
  // The session of the requests the sender of this hello posts (kFeatureRequest): its event
  // loop's, random, never 0. A responder tells requests apart by session and id, also across
  // connections (a retry after a reconnection). 0 in a hello before 1.5 (32 bytes).
  uint64_t session = 0;
};
constexpr size_t kHelloSize = 40;
constexpr size_t kHelloMinSize = 24;  // protocol 1.1's hello, without rndv_max_size
void encode_hello(const Hello &h, uint8_t out[kHelloSize]);

enum class HelloResult {
  Ok,
  NotIbmsg,    // no ibmsg magic, wrong kind or too short
  OtherMajor,  // an ibmsg peer of an incompatible protocol version (major and minor are filled in)
  Invalid,     // fields that make no sense: a zero depth or maximum size, depths beyond the limits
};
HelloResult decode_hello(const void *data, size_t len, Hello *out);

// Sent with a CM rejection; the text is what the peer sees in ibmsg_socket.reject_reason. Its
// header carries any version: a peer of another major still reads the text.
constexpr size_t kRejectTextMax = 128;
constexpr size_t kRejectHeader = 8;
constexpr size_t kRejectMaxSize = kRejectHeader + kRejectTextMax;  // within the 148 bytes of a REJ
// Returns the encoded size; text is cut at kRejectTextMax bytes.
size_t encode_reject(const char *text, uint8_t out[kRejectMaxSize]);
// Copies the NUL-terminated text into out (size >= kRejectTextMax + 1); false if not an ibmsg reject.
bool decode_reject(const void *data, size_t len, char *out, size_t out_size);

// A remote descriptor (ibmsg_descriptor): 32 bytes, little-endian:
//   0..1 magic 0xd35c, 2 version 1, 3 rights (IBMSG_ACCESS_REMOTE_*), 4..7 rkey, 8..15 address,
//   16..23 length, 24..27 zero, 28..31 check (FNV-1a of bytes 0..27)
// The check catches a corrupted or made-up descriptor before anything is posted; it is no
// protection against a forged one (the key and the range registered on exactly those bytes are).
constexpr size_t kDescriptorSize = 32;
constexpr uint8_t kDescRights = 0x0e;  // IBMSG_ACCESS_REMOTE_READ | _WRITE | _ATOMIC
struct Descriptor {
  uint8_t access = 0;
  uint32_t rkey = 0;
  uint64_t addr = 0;
  uint64_t length = 0;
};
void encode_descriptor(const Descriptor &d, uint8_t out[kDescriptorSize]);
// false if the magic, version, reserved bytes or check are wrong, the rights are none or unknown
// ones, the length is 0 or the range wraps around.
bool decode_descriptor(const uint8_t in[kDescriptorSize], Descriptor *out);

// Rendezvous (kFeatureRndv). A message above the eager limit travels as an RTS: a message of
// opcode Rendezvous (spending a data credit like any) whose payload tells the receiver where to
// read the data. The receiver reads the RTSs in the order they came; once it has a message's
// data, it counts it in the done field of its next message's immediate (a credit-only one if
// nothing else goes), and the sender's buffer is free again. Little-endian:
//   RTS, 32 bytes: 0 kind 1, 1 flags (bit 0: imm carries the application's immediate; bits 1..2,
//        kFeatureRequest, protocol 1.5: the message is 1 a Request or 2 a Reply, and a
//        ReqTrailer follows, 56 bytes in all), 2..3 zero, 4..7 id (the sender's, for its own
//        checks), 8..11 rkey, 12..15 imm, 16..23 address, 24..31 length (not 0; the range does
//        not wrap)
//   FIN, 8 bytes:  0 kind 2, 1 status (0 done, 1 declined by the receiver, 2 failed), 2..3
//        zero, 4..7 id. Protocol 1.2 sends it only for a declined message (status 1), in the
//        place of that message's done count and in order with them, spending a control credit;
//        statuses 0 and 2 are reserved (a receiver refuses them: IBMSG_EPROTO).
constexpr size_t kRtsSize = 32;
constexpr size_t kFinSize = 8;
enum class RndvKind : uint8_t { Rts = 1, Fin = 2 };
struct Rts {
  uint32_t id = 0;
  uint32_t rkey = 0;
  bool has_imm = false;
  uint32_t imm = 0;
  uint64_t addr = 0;
  uint64_t length = 0;
  uint8_t req = 0;  // 0 a plain message, 1 a Request, 2 a Reply: a ReqTrailer follows
};
enum class FinStatus : uint8_t { Done = 0, Declined = 1, Failed = 2 };
struct Fin {
  uint32_t id = 0;
  FinStatus status = FinStatus::Done;
};
void encode_rts(const Rts &r, uint8_t out[kRtsSize]);
void encode_fin(const Fin &f, uint8_t out[kFinSize]);
// What a Rendezvous message's payload is: an RTS or FIN of exactly its size (an RTS with its
// trailer, if it names one) with every reserved bit zero (false otherwise: the connection closes
// with IBMSG_EPROTO). decode_rts also refuses a zero length and a wrapping range, decode_fin an
// unknown status. (The trailer is decode_req_trailer's, over the whole payload.)
bool rndv_kind(const void *data, size_t len, RndvKind *out);
bool decode_rts(const void *data, size_t len, Rts *out);
bool decode_fin(const void *data, size_t len, Fin *out);

// The end of a Request or Reply message's payload (kFeatureRequest), 24 bytes, little-endian:
//   0..7 id (the requester's, unique within its session, never 0), 8 flags (bit 0: imm carries
//   the application's immediate; bit 1: a retry of a request sent before with this id), 9..11
//   zero, 12..15 imm (zero without flag bit 0), 16..23 floor: in a Request, the lowest id of its
//   session the requester may still send (again), at most id: the responder forgets the requests
//   below it; zero in a Reply. (1.5 sends no immediates: flag bit 0 and imm are zero.)
constexpr size_t kReqTrailer = 24;
struct ReqTrailer {
  uint64_t id = 0;
  bool has_imm = false;
  bool retry = false;
  uint32_t imm = 0;
  uint64_t floor = 0;
};
void encode_req_trailer(const ReqTrailer &t, uint8_t out[kReqTrailer]);
// The trailer at the end of a payload of len bytes (len >= kReqTrailer); false if a reserved bit
// or byte is set or imm is not zero without flag bit 0 (the connection closes: IBMSG_EPROTO).
bool decode_req_trailer(const void *payload, size_t len, ReqTrailer *out);
// A Request's (request) or Reply's trailer at the end of len bytes, decoded into *tr; false if the
// features agreed (kFeature*) have no requests, there is no room for it, a reserved bit is set,
// its id is 0, it has an immediate (1.5 sends none), or its floor is above a request's id or set
// on a reply: the peer broke the protocol.
bool req_trailer_ok(uint32_t features, const void *payload, size_t len, bool request,
                    ReqTrailer *tr);

// The application's immediate of a DataImm message: kImmTrailer bytes behind the payload,
// little-endian.
void encode_imm_trailer(uint32_t imm, uint8_t out[4]);
uint32_t decode_imm_trailer(const uint8_t in[4]);

}  // namespace ibmsg::wire
