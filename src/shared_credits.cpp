#include "shared_credits.hpp"

namespace ibmsg {

bool SharedCredits::join(ShareConn *c) {
  if (c->joined || unassigned() < base_) return false;
  c->joined = true;
  c->granted = 0;
  c->owed = base_;
  c->held = 0;
  c->wants = false;
  assigned_ += base_;
  return true;
}

void SharedCredits::leave(ShareConn *c) {
  if (!c->joined) return;
  unwait(c);
  assigned_ -= c->total();
  c->granted = c->owed = c->held = 0;
  c->joined = false;
}

bool SharedCredits::on_arrival(ShareConn *c, bool wants) {
  if (!c->joined || c->granted == 0 || free_ == 0) return false;
  --c->granted;
  --assigned_;
  --free_;
  ++c->held;
  c->wants = wants;
  if (!wants || full(c)) {
    unwait(c);
    if (!wants) {
      // Nothing more waits at its peer: what it is owed above the base stays in the pool.
      const uint32_t keep = c->granted < base_ ? base_ - c->granted : 0;
      if (c->owed > keep) {
        assigned_ -= c->owed - keep;
        c->owed = keep;
      }
    }
  } else if (unassigned() > 0) {
    give(c);  // nobody waits while the pool has units (serve_waiting, on_freed)
  } else if (!c->wait_node.linked()) {
    waiting_.push_back(c);
  }
  return true;
}

void SharedCredits::on_wants(ShareConn *c) {
  if (!c->joined) return;
  c->wants = true;
  if (full(c)) return;
  if (unassigned() > 0) give(c);
  else if (!c->wait_node.linked()) waiting_.push_back(c);
}

bool SharedCredits::on_given_back(ShareConn *c, uint32_t n) {
  // The peer holds at most what we granted (less what is on its way to it), and keeps its base.
  if (!c->joined || n > c->granted || c->granted - n < base_) return false;
  c->granted -= n;
  assigned_ -= n;
  c->wants = false;  // nothing waits at its peer
  unwait(c);
  // Nor does it need what it is owed above the base.
  const uint32_t keep = c->granted < base_ ? base_ - c->granted : 0;
  if (c->owed > keep) {
    assigned_ -= c->owed - keep;
    c->owed = keep;
  }
  return true;
}

ShareConn *SharedCredits::on_freed(ShareConn *c) {
  ++free_;
  if (c && !c->joined) c = nullptr;
  if (c && c->held) --c->held;
  // Its own connection back to its base first: every connection can always send again once the
  // application frees what it holds.
  if (c && c->total() < base_) {
    give(c);
    return c;
  }
  if (ShareConn *w = serve_waiting()) return w;
  // Nobody waits: the credit stays where the traffic is.
  if (c && c->wants && !full(c)) {
    give(c);
    return c;
  }
  return nullptr;
}

ShareConn *SharedCredits::serve_waiting() {
  if (unassigned() == 0) return nullptr;
  ShareConn *w = waiting_.pop_front();
  while (w && full(w)) w = waiting_.pop_front();  // (at its cap since: it waits no more)
  if (!w) return nullptr;
  give(w);
  if (!full(w)) waiting_.push_back(w);  // one unit each in turn
  return w;
}

uint32_t SharedCredits::take_owed(ShareConn *c) {
  uint32_t n = c->owed;
  c->granted += n;
  c->owed = 0;
  return n;
}

}  // namespace ibmsg
