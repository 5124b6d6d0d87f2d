#!/bin/sh
# demo-twohost.sh - the two-host round of `make demo`: ibmsg-recv on host 2, ibmsg-send on host 1,
# verified messages across the emulated network between two Soft-RoCE VMs; then the link is cut
# while a second pair streams, and both tools report the dead peer (keepalive) with -v.
#
# Run on both hosts by examples/demo.sh through test/softroce/run --hosts 2 (each host learns its
# role from IBMSG_TEST_HOST_INDEX; the two meet through files in IBMSG_TEST_SHARED_DIR).
# IBMSG_DEMO_BINDIR names the tools' directory (default ./examples). Exits non-zero on failure.
set -u

bindir=${IBMSG_DEMO_BINDIR:-./examples}
host=${IBMSG_TEST_HOST_INDEX:?not on a host of test/softroce/run --hosts 2}
shared=${IBMSG_TEST_SHARED_DIR:?IBMSG_TEST_SHARED_DIR is not set}
tmp=$(mktemp -d /tmp/ibmsg-demo.XXXXXX) || exit 1
trap 'rm -rf "$tmp"' EXIT

# mark NAME / await NAME SECONDS: one host says it reached NAME, the other waits for it.
mark() { : >"$shared/demo-$1"; }
await() {
  n=0
  while [ ! -e "$shared/demo-$1" ]; do
    [ "$n" -ge $(($2 * 10)) ] && { echo "demo: the other host never reached '$1'" >&2; return 1; }
    sleep 0.1
    n=$((n + 1))
  done
}
# Waits until file $1 says "listening on" (ibmsg-recv is ready), at most 10 s.
listening() {
  n=0
  until grep -q "listening on" "$1" 2>/dev/null; do
    [ "$n" -ge 100 ] && return 1
    sleep 0.1
    n=$((n + 1))
  done
}

failed=0
if [ "$host" = 2 ]; then
  echo "=== two hosts, round 1: host 2 receives 5000 verified messages of 4096 bytes"
  "$bindir/ibmsg-recv" -p 12400 -n 5000 --verify "$IBMSG_TEST_ADDR" >"$tmp/recv.out" 2>&1 &
  pid=$!
  listening "$tmp/recv.out"
  mark listening-1
  wait "$pid" || failed=1
  sed 's/^/  | /' "$tmp/recv.out"

  echo "=== two hosts, round 2: host 2 receives until host 1 cuts the link"
  "$bindir/ibmsg-recv" -p 12401 -c 1 -v "$IBMSG_TEST_ADDR" >"$tmp/recv.out" 2>&1 &
  pid=$!
  listening "$tmp/recv.out"
  mark listening-2
  # Expected: exit status 1, "timed out", about 30 s (ibmsg's default keepalive) after the cut.
  wait "$pid"
  st=$?
  sed 's/^/  | /' "$tmp/recv.out"
  echo "  ibmsg-recv exit status $st (1 and \"timed out\" expected)"
  [ "$st" = 1 ] && grep -q "timed out" "$tmp/recv.out" || failed=1
else
  echo "=== two hosts, round 1: host 1 sends 5000 verified messages of 4096 bytes to host 2"
  await listening-1 60 || exit 1
  "$bindir/ibmsg-send" -p 12400 -n 5000 -s 4096 --verify "$IBMSG_TEST_PEER_ADDR" >"$tmp/send.out" 2>&1 ||
    failed=1
  sed 's/^/  | /' "$tmp/send.out"

  echo "=== two hosts, round 2: host 1 streams to host 2 and cuts the link after 3 s"
  await listening-2 60 || exit 1
  "$bindir/ibmsg-send" -p 12401 -n 100000000 -s 1024 -v "$IBMSG_TEST_PEER_ADDR" >"$tmp/send.out" 2>&1 &
  pid=$!
  sleep 3
  ibmsg-link cut
  echo "  link cut at $(date +%T): both sides should give up within 30 s"
  wait "$pid"
  st=$?
  echo "  ibmsg-send ended at $(date +%T)"
  ibmsg-link restore
  sed 's/^/  | /' "$tmp/send.out"
  echo "  ibmsg-send exit status $st (1 and \"timed out\" expected)"
  [ "$st" = 1 ] && grep -q "timed out" "$tmp/send.out" || failed=1
fi
[ "$failed" = 0 ] && echo "host $host: two-host rounds OK" || echo "host $host: two-host rounds FAILED"
exit "$failed"
