// Connections accepted onto other loops. The listener's loop takes the request (its callback
// decides) and hands it over: the CM id moves to the other loop's event channel
// (rdma_migrate_id, which waits for no event: each is acknowledged as it is read), and the other
// loop, at its next iteration through the hand-over (handover.cpp), sets the connection up on its
// own device, completion queues and buffers and accepts it; from then on it is that loop's
// socket like any other. A failure there is that loop's connection_closed, as a failed connect
// is. The listener counts these connections for max_connections through a count they share with
// it across threads (AwayCount); a spreading listener's accepts go to its loops in turn.
#include "spread.hpp"

#include <memory>
#include <new>

#include "internal.hpp"
#include "close.hpp"
#include "cm.hpp"
#include "conn.hpp"
#include "setup.hpp"

namespace ibmsg {

namespace {

// A request on its way to another loop: what the accept needs of it (the request itself is
// valid only during the listener's callback).
struct Handed {
  Loop *to;
  ibmsg_socket *pub;
  Options opts;
  wire::Hello hello;
  tp::CmId *id;
  AwayCount *away;
};

// On the other loop's thread.
void on_handed(void *arg) {
  std::unique_ptr<Handed> h(static_cast<Handed *>(arg));
  Loop *loop = h->to;
  Socket *s = new_socket(loop, h->pub, &h->opts);
  int err = IBMSG_ENOMEM;
  if (s) {
    s->id = h->id;
    err = accept_socket(s, h->hello);
  } else {
    reject_id(h->id, "the server could not set up the connection");
  }
  if (!err) {
    s->away = h->away;      // (its reference, taken by accept_on)
    socket_handed(h->pub);  // (open now: registered as such)
    return;
  }
  h->away->open.fetch_sub(1, std::memory_order_relaxed);
  away_release(h->away);
  ibmsg_socket *pub = h->pub;
  socket_handed(pub);  // (the application may set it up again in its callback)
  pub->status = IBMSG_ERROR;
  pub->loop = loop->pub;
  pub->close_reason = err;
  pub->impl = nullptr;
  closed_callback(loop, pub, err, ibmsg_stats{});
}

}  // namespace

int accept_on(ibmsg_connection_request *req, Loop *to, ibmsg_socket *pub, const Options *opts) {
  ibmsg__request *r = req->impl;
  if (req->status != IBMSG_UNDECIDED) return IBMSG_ESTATE;
  Socket *l = r->listener;
  if (!l->away && !(l->away = new (std::nothrow) AwayCount())) return IBMSG_ENOMEM;
  std::unique_ptr<Handed> h(
      new (std::nothrow) Handed{to, pub, opts ? *opts : l->opts, r->hello, r->id, l->away});
  if (!h) return IBMSG_ENOMEM;
  // The struct counts as open from here (another accept of it is refused) until `to` has it.
  if (int err = socket_hand_over(pub)) return err;
  // Its events come to the other loop from now on; until that loop has its socket they find none.
  tp::cm_id_set_user(r->id, nullptr);
  int err = tp::cm_migrate(r->id, to->cm);
  bool moved = !err;
  if (!err) {
    // Counted before the other loop may run it (and uncount it, if it fails there).
    l->away->open.fetch_add(1, std::memory_order_relaxed);
    l->away->refs.fetch_add(1, std::memory_order_relaxed);
    err = handover_post(to, on_handed, h.get());
    if (!err) {
      h.release();  // (on_handed's)
      req->status = IBMSG_ACCEPTED;
      return IBMSG_OK;
    }
    l->away->open.fetch_sub(1, std::memory_order_relaxed);
    away_release(l->away);  // (the listener's own reference keeps it)
  }
  socket_handed(pub);
  if (moved && tp::cm_migrate(r->id, l->loop->cm)) {
    // It cannot come back: its events would reach the other loop with nobody to take them.
    req->status = IBMSG_REJECTED;
    reject_id(r->id, "the server could not set up the connection");
    return err;
  }
  tp::cm_id_set_user(r->id, l);  // the request stays undecided
  return err;
}

int accept_spread(ibmsg_connection_request *req, ibmsg_socket *pub, const Options *opts) {
  Spread *sp = req->impl->listener->spread;
  Loop *to = sp->loops[sp->next];
  sp->next = (sp->next + 1) % sp->count;
  return to == req->impl->listener->loop ? accept_here(req, pub, opts)
                                         : accept_on(req, to, pub, opts);
}

int listen_spread(Socket *l, Loop *const *loops, int count) {
  if (count == 0) {
    delete l->spread;
    l->spread = nullptr;
    return IBMSG_OK;
  }
  if (!l->spread && !(l->spread = new (std::nothrow) Spread())) return IBMSG_ENOMEM;
  for (int i = 0; i < count; ++i) l->spread->loops[i] = loops[i];
  l->spread->count = count;
  l->spread->next = 0;
  return IBMSG_OK;
}

}  // namespace ibmsg
