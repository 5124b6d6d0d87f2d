#include "wire.hpp"

#include <cstring>

namespace ibmsg::wire {
namespace {

constexpr uint8_t kKindHello = 1;
constexpr uint8_t kKindReject = 2;

// Explicit little-endian encoding: peers may differ in byte order.
void put32(uint8_t *p, uint32_t v) {
  p[0] = uint8_t(v);
  p[1] = uint8_t(v >> 8);
  p[2] = uint8_t(v >> 16);
  p[3] = uint8_t(v >> 24);
}
uint32_t get32(const uint8_t *p) {
  return uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24;
}
// magic, major, minor, kind, flags (zero)
void put_header(uint8_t *p, uint8_t kind) {
  put32(p, kMagic);
  p[4] = kMajor;
  p[5] = kMinor;
  p[6] = kind;
  p[7] = 0;
}
bool check_header(const uint8_t *p, uint8_t kind) { return get32(p) == kMagic && p[6] == kind; }

void put64(uint8_t *p, uint64_t v) {
  put32(p, uint32_t(v));
  put32(p + 4, uint32_t(v >> 32));
}
uint64_t get64(const uint8_t *p) { return uint64_t(get32(p)) | uint64_t(get32(p + 4)) << 32; }

constexpr uint16_t kDescMagic = 0xd35c;
constexpr uint8_t kDescVersion = 1;
uint32_t fnv1a(const uint8_t *p, size_t n) {
  uint32_t h = 2166136261u;
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 16777619u;
  return h;
}

}  // namespace

uint32_t encode_imm(const Imm &imm) {
  const uint32_t max = imm.wants ? kMaxSharedCreditsPerMsg : kMaxCreditsPerMsg;
  uint32_t credits = imm.credits > max ? max : imm.credits;
  if (imm.wants) credits |= kWantsBit;
  uint32_t ctrl = imm.ctrl_credits > kMaxCtrlCreditsPerMsg ? kMaxCtrlCreditsPerMsg : imm.ctrl_credits;
  uint32_t done = imm.done > kMaxDonePerMsg ? kMaxDonePerMsg : imm.done;
  return credits | ctrl << 16 | done << 24 | uint32_t(imm.op) << 28;
}

bool decode_imm(uint32_t value, Imm *out) {
  out->done = (value >> 24) & 0x0f;
  out->credits = value & 0xffff;
  out->ctrl_credits = (value >> 16) & 0xff;
  out->op = Opcode(value >> 28);
  out->wants = false;
  return true;
}

void encode_hello(const Hello &h, uint8_t out[kHelloSize]) {
  put_header(out, kKindHello);
  out[4] = h.major;
  out[5] = h.minor;
  put32(out + 8, h.features);
  put32(out + 12, h.recv_depth);
  put32(out + 16, h.ctrl_depth);
  put32(out + 20, h.max_msg_size);
  put32(out + 24, h.rndv_max_size);
  put32(out + 28, h.cap);
  put64(out + 32, h.session);
}

HelloResult decode_hello(const void *data, size_t len, Hello *out) {
  auto p = static_cast<const uint8_t *>(data);
  if (!p || len < kRejectHeader || !check_header(p, kKindHello)) return HelloResult::NotIbmsg;
  out->major = p[4];
  out->minor = p[5];
  // A later major may lay out the rest differently: only the version is read.
  if (out->major != kMajor) return HelloResult::OtherMajor;
  if (len < kHelloMinSize) return HelloResult::NotIbmsg;
  out->features = get32(p + 8);
  out->recv_depth = get32(p + 12);
  out->ctrl_depth = get32(p + 16);
  out->max_msg_size = get32(p + 20);
  out->rndv_max_size = len >= 28 ? get32(p + 24) : 0;
  out->cap = len >= 32 ? get32(p + 28) : 0;
  out->session = len >= kHelloSize ? get64(p + 32) : 0;
  if (out->cap < out->recv_depth) out->cap = out->recv_depth;  // 0: a hello before 1.3
  if (out->recv_depth == 0 || out->recv_depth > kMaxDepth || out->cap > kMaxDepth)
    return HelloResult::Invalid;
  if (out->ctrl_depth == 0 || out->ctrl_depth > kMaxCtrlDepth) return HelloResult::Invalid;
  if (out->max_msg_size == 0) return HelloResult::Invalid;
  if (out->rndv_max_size != 0 && out->rndv_max_size < out->max_msg_size) return HelloResult::Invalid;
  return HelloResult::Ok;
}

size_t encode_reject(const char *text, uint8_t out[kRejectMaxSize]) {
  put_header(out, kKindReject);
  size_t n = text ? strnlen(text, kRejectTextMax) : 0;
  if (n) memcpy(out + kRejectHeader, text, n);
  return kRejectHeader + n;
}

bool decode_reject(const void *data, size_t len, char *out, size_t out_size) {
  auto p = static_cast<const uint8_t *>(data);
  if (!p || len < kRejectHeader || !check_header(p, kKindReject) || out_size == 0) return false;
  // The transport may pad private data with zeros: the text ends at the first NUL.
  size_t n = len - kRejectHeader;
  if (n > kRejectTextMax) n = kRejectTextMax;
  if (n > out_size - 1) n = out_size - 1;
  n = strnlen(reinterpret_cast<const char *>(p + kRejectHeader), n);
  memcpy(out, p + kRejectHeader, n);
  out[n] = '\0';
  return true;
}

void encode_descriptor(const Descriptor &d, uint8_t out[kDescriptorSize]) {
  out[0] = uint8_t(kDescMagic);
  out[1] = uint8_t(kDescMagic >> 8);
  out[2] = kDescVersion;
  out[3] = d.access;
  put32(out + 4, d.rkey);
  put64(out + 8, d.addr);
  put64(out + 16, d.length);
  put32(out + 24, 0);
  put32(out + 28, fnv1a(out, 28));
}

bool decode_descriptor(const uint8_t in[kDescriptorSize], Descriptor *out) {
  if (in[0] != uint8_t(kDescMagic) || in[1] != uint8_t(kDescMagic >> 8) || in[2] != kDescVersion ||
      get32(in + 24) != 0 || get32(in + 28) != fnv1a(in, 28))
    return false;
  if (in[3] == 0 || (in[3] & ~kDescRights)) return false;
  out->access = in[3];
  out->rkey = get32(in + 4);
  out->addr = get64(in + 8);
  out->length = get64(in + 16);
  return out->length != 0 && out->addr + out->length > out->addr;
}

// --- rendezvous ---

void encode_rts(const Rts &r, uint8_t out[kRtsSize]) {
  out[0] = uint8_t(RndvKind::Rts);
  out[1] = uint8_t((r.has_imm ? 1 : 0) | (r.req & 3) << 1);
  out[2] = out[3] = 0;
  put32(out + 4, r.id);
  put32(out + 8, r.rkey);
  put32(out + 12, r.has_imm ? r.imm : 0);
  put64(out + 16, r.addr);
  put64(out + 24, r.length);
}

void encode_fin(const Fin &f, uint8_t out[kFinSize]) {
  out[0] = uint8_t(RndvKind::Fin);
  out[1] = uint8_t(f.status);
  out[2] = out[3] = 0;
  put32(out + 4, f.id);
}

namespace {
// An RTS's size by its flags: with a ReqTrailer when it names a Request or Reply. (p[1] is read
// only where the payload has it.)
size_t rts_size(const uint8_t *p) { return p[1] & 6 ? kRtsSize + kReqTrailer : kRtsSize; }
}  // namespace

bool rndv_kind(const void *data, size_t len, RndvKind *out) {
  const uint8_t *p = static_cast<const uint8_t *>(data);
  if (!p || len == 0) return false;
  if (p[0] == uint8_t(RndvKind::Rts) && len >= kRtsSize && len == rts_size(p)) *out = RndvKind::Rts;
  else if (p[0] == uint8_t(RndvKind::Fin) && len == kFinSize) *out = RndvKind::Fin;
  else return false;
  return true;
}

bool decode_rts(const void *data, size_t len, Rts *out) {
  const uint8_t *p = static_cast<const uint8_t *>(data);
  if (!p || len < kRtsSize || len != rts_size(p) || p[0] != uint8_t(RndvKind::Rts) ||
      (p[1] & ~7u) || (p[1] >> 1) == 3 || p[2] || p[3])
    return false;
  Rts r;
  r.has_imm = p[1] & 1;
  r.req = uint8_t(p[1] >> 1 & 3);
  r.id = get32(p + 4);
  r.rkey = get32(p + 8);
  r.imm = get32(p + 12);
  r.addr = get64(p + 16);
  r.length = get64(p + 24);
  if (!r.has_imm && r.imm) return false;  // reserved while no immediate is carried
  if (r.length == 0 || r.addr + r.length < r.addr) return false;
  *out = r;
  return true;
}

bool decode_fin(const void *data, size_t len, Fin *out) {
  const uint8_t *p = static_cast<const uint8_t *>(data);
  if (!p || len != kFinSize || p[0] != uint8_t(RndvKind::Fin) || p[1] > uint8_t(FinStatus::Failed) ||
      p[2] || p[3])
    return false;
  out->status = FinStatus(p[1]);
  out->id = get32(p + 4);
  return true;
}

void encode_req_trailer(const ReqTrailer &t, uint8_t out[kReqTrailer]) {
  put64(out, t.id);
  out[8] = uint8_t((t.has_imm ? 1 : 0) | (t.retry ? 2 : 0));
  out[9] = out[10] = out[11] = 0;
  put32(out + 12, t.has_imm ? t.imm : 0);
  put64(out + 16, t.floor);
}

bool decode_req_trailer(const void *payload, size_t len, ReqTrailer *out) {
  if (!payload || len < kReqTrailer) return false;
  const uint8_t *p = static_cast<const uint8_t *>(payload) + len - kReqTrailer;
  const uint32_t imm = get32(p + 12);
  if ((p[8] & ~3u) || p[9] || p[10] || p[11] || (!(p[8] & 1) && imm)) return false;
  out->id = get64(p);
  out->has_imm = (p[8] & 1) != 0;
  out->retry = (p[8] & 2) != 0;
  out->imm = imm;
  out->floor = get64(p + 16);
  return true;
}

bool req_trailer_ok(uint32_t features, const void *payload, size_t len, bool request,
                    ReqTrailer *tr) {
  return (features & kFeatureRequest) && decode_req_trailer(payload, len, tr) && tr->id &&
         !tr->has_imm && (request ? tr->floor <= tr->id : !tr->floor && !tr->retry);
}

void encode_imm_trailer(uint32_t imm, uint8_t out[4]) {
  out[0] = uint8_t(imm);
  out[1] = uint8_t(imm >> 8);
  out[2] = uint8_t(imm >> 16);
  out[3] = uint8_t(imm >> 24);
}

uint32_t decode_imm_trailer(const uint8_t in[4]) {
  return uint32_t(in[0]) | uint32_t(in[1]) << 8 | uint32_t(in[2]) << 16 | uint32_t(in[3]) << 24;
}

}  // namespace ibmsg::wire
