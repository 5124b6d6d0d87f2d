/*
 * twohost.h - helpers for test programs that run on both hosts of test/softroce/run --hosts 2.
 *
 * test/twohost/run starts the same program on both hosts at about the same time. Host 1 plays
 * the client, host 2 the server; each learns its role, its own and its peer's addresses from
 * the environment the rig sets (IBMSG_TEST_HOST_INDEX, IBMSG_TEST_ADDR, IBMSG_TEST_PEER_ADDR ...).
 *
 * The two processes coordinate through files in IBMSG_TEST_SHARED_DIR, a directory both VMs
 * mount read-write without caching: a named barrier (twohost_sync) that can also swap a short
 * string (twohost_exchange, e.g. a listener's port). test/twohost/run gives each program run its
 * own subdirectory (IBMSG_TWOHOST_SCOPE) and marks there when a host's program has exited, so
 * that a barrier fails at once, instead of at its timeout, when the peer's program is gone.
 *
 * twohost_link_cut() / twohost_link_restore() partition the hosts silently (frames dropped both
 * ways by the rig's relay; carriers and RDMA ports stay up) and heal the partition.
 *
 * Every function that can fail returns 0 on success and -1 on failure, and then
 * twohost_error() says why. None of them exits or aborts, so they are safe inside cmocka tests
 * and ibmsg callbacks (a barrier blocks, though: do not call it from a callback that must not
 * block). Not thread-safe.
 */
#ifndef IBMSG_TEST_TWOHOST_H
#define IBMSG_TEST_TWOHOST_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/** Reads the environment of the two-host rig. Returns 0 if this process runs on one of the two
 *  hosts (IBMSG_TEST_HOSTS=2 and a valid IBMSG_TEST_HOST_INDEX, addresses and
 *  IBMSG_TEST_SHARED_DIR), else -1 with a message that says how to run the program. The other
 *  functions call it themselves; calling it first is only needed for that message. */
int twohost_init(void);

/** This host's number: 1 (the client) or 2 (the server); 0 outside the rig. */
int twohost_index(void);
/** 1 on host 1, which plays the client (connects), else 0. */
int twohost_is_client(void);
/** 1 on host 2, which plays the server (listens, accepts), else 0. */
int twohost_is_server(void);
/** "client" or "server" (for messages). */
const char *twohost_role(void);
/** This host's IPv4 / IPv6 address of its RDMA device (IBMSG_TEST_ADDR / IBMSG_TEST_ADDR6). */
const char *twohost_addr(void);
const char *twohost_addr6(void);
/** The other host's IPv4 / IPv6 address (IBMSG_TEST_PEER_ADDR / IBMSG_TEST_PEER_ADDR6). */
const char *twohost_peer_addr(void);
const char *twohost_peer_addr6(void);

/** Milliseconds of CLOCK_MONOTONIC (this host's own clock: the two hosts' clocks are not
 *  comparable). */
uint64_t twohost_now_ms(void);

/** Barrier: returns once the other host's process has called twohost_sync() (or
 *  twohost_exchange()) with the same name, or fails after timeout_ms, or at once when the
 *  peer's program has exited (test/twohost/run marks that). Names are matched, not counted:
 *  the n-th call with a given name meets the peer's n-th call with that name, so after a
 *  failure one side may skip barriers and the two meet again at the next name both reach
 *  (see twohost_abandon() to make the peer give up on the skipped ones at once).
 *  Names may contain any character but '\0' (kept short: they become file names). */
int twohost_sync(const char *name, int timeout_ms);

/** twohost_sync() that also swaps a string: mine (NULL: "") goes to the peer, the peer's lands
 *  in theirs (len bytes with the terminating NUL; NULL/0 to discard it). Both strings are at
 *  most 200 bytes; fails if the peer's does not fit in len. */
int twohost_exchange(const char *name, const char *mine, char *theirs, size_t len, int timeout_ms);

/** twohost_exchange() that calls idle(arg) between its looks at the peer's file instead of
 *  sleeping, e.g. to keep running an event loop whose peer may need an answer while waiting
 *  (idle should return within about 10 ms). twohost_sync_idle() is the same without data. */
int twohost_exchange_idle(const char *name, const char *mine, char *theirs, size_t len,
                          int timeout_ms, void (*idle)(void *arg), void *arg);
int twohost_sync_idle(const char *name, int timeout_ms, void (*idle)(void *arg), void *arg);

/** Tells the peer that this host gives up on every barrier whose name starts with prefix, e.g.
 *  "TEST:" for a test that failed midway: the peer's waits for such barriers (now or later)
 *  fail at once instead of at their timeout. Barriers this host has reached already still
 *  count. */
int twohost_abandon(const char *prefix);

/** Partitions the two hosts: from its return on, every frame between them is dropped, both
 *  ways, until twohost_link_restore(). Silent: both carriers and RDMA ports stay up, no device
 *  event happens on either host (a failed switch). Either host may call it; it returns once
 *  the relay has applied it (typically 20-80 ms in the emulated VMs), -1 if the relay
 *  does not answer in 5 s. */
int twohost_link_cut(void);
/** Ends a partition: frames flow again from its return on. */
int twohost_link_restore(void);
/** 1 if the link is cut, 0 if it is up, -1 on error. */
int twohost_link_is_cut(void);

/** Why the last failing call failed (a static string; "" if none failed yet). */
const char *twohost_error(void);

#ifdef __cplusplus
}
#endif

#endif /* IBMSG_TEST_TWOHOST_H */
