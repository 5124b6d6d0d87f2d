#!/bin/sh
# demo.sh - show ibmsg at work: ibmsg-recv and ibmsg-send exchange verified messages,
# ibmsg-rdma writes into a server's buffer with RDMA and reads it back, and ibmsg-rpc stores a
# value in a key-value server and reads it back (requests and replies carrying protobuf
# messages; only when it was built, with protobuf-c); then, between two VMs
# (examples/demo-twohost.sh), messages cross an emulated network and a cut link is reported.
#
# Run by `make demo` from the build directory, where the tools are ./examples/ibmsg-*.
# With IBMSG_TEST_ADDR set (the address of a real RDMA device, or we are inside the Soft-RoCE
# VM) it runs right here, one host only; otherwise it runs itself again inside the VM
# (test/softroce/run), then the two-host round on two VMs (test/softroce/run --hosts 2).
# Exits non-zero if anything failed.
set -u

me=$0
srcdir=$(cd "$(dirname "$0")/.." && pwd) || exit 1

if [ -z "${IBMSG_TEST_ADDR:-}" ]; then
  echo "demo: IBMSG_TEST_ADDR is not set: running the demo in a Soft-RoCE VM (about a minute)"
  "$srcdir/test/softroce/run" --timeout 600 -- "$me" "$@"
  one=$?
  echo
  echo "demo: and between two Soft-RoCE VMs linked by an emulated network (about two minutes)"
  "$srcdir/test/softroce/run" --hosts 2 --timeout 600 -- "$srcdir/examples/demo-twohost.sh"
  two=$?
  echo
  if [ "$one" = 0 ] && [ "$two" = 0 ]; then echo "demo: one host and two hosts passed"; exit 0; fi
  echo "demo: FAILED (one host: exit status $one, two hosts: exit status $two)"
  exit 1
fi

# The tools: IBMSG_DEMO_BINDIR, else the build directory we run in (make demo), else the
# bootstrap Makefile's build directory in the source tree.
bindir=${IBMSG_DEMO_BINDIR:-}
if [ -z "$bindir" ]; then
  for dir in ./examples "$srcdir/build/examples"; do
    if [ -x "$dir/ibmsg-send" ] && [ -x "$dir/ibmsg-recv" ] && [ -x "$dir/ibmsg-rdma" ]; then
      bindir=$dir
      break
    fi
  done
fi
if [ -z "$bindir" ] || [ ! -x "$bindir/ibmsg-send" ] || [ ! -x "$bindir/ibmsg-recv" ] ||
   [ ! -x "$bindir/ibmsg-rdma" ]; then
  echo "demo: ibmsg-send, ibmsg-recv and ibmsg-rdma not found: build them and run 'make demo'" >&2
  exit 1
fi

addr=$IBMSG_TEST_ADDR
# In the VM only /tmp and the current directory are writable, whatever TMPDIR says.
tmp=$(mktemp -d "${TMPDIR:-/tmp}/ibmsg-demo.XXXXXX" 2>/dev/null ||
  mktemp -d /tmp/ibmsg-demo.XXXXXX) || exit 1
recv_pid=
server_pid=
# shellcheck disable=SC2317 # called by the trap
cleanup() {
  [ -n "$recv_pid" ] && kill "$recv_pid" 2>/dev/null
  [ -n "$server_pid" ] && kill "$server_pid" 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Waits up to $2 tenths of a second for process $1 to exit; 0 if it did.
wait_exit() {
  n=0
  while kill -0 "$1" 2>/dev/null; do
    [ "$n" -ge "$2" ] && return 1
    sleep 0.1
    n=$((n + 1))
  done
  return 0
}

# Prints a tool's output with a label in front of every line.
show() {
  sed "s/^/  $1 /" "$2"
}

failures=0
round=0

# run_round COUNT SIZE CONNECTIONS
run_round() {
  count=$1 size=$2 conns=$3
  round=$((round + 1))
  port=$((12344 + round))
  echo
  echo "=== round $round: $count messages of $size bytes over $conns connection(s) ==="

  "$bindir/ibmsg-recv" -p "$port" -n "$count" --verify "$addr" >"$tmp/recv.out" 2>&1 &
  recv_pid=$!
  # The receiver says "listening" once it is ready for the sender.
  n=0
  until grep -q "listening on" "$tmp/recv.out" 2>/dev/null; do
    if ! kill -0 "$recv_pid" 2>/dev/null || [ "$n" -ge 100 ]; then
      break
    fi
    sleep 0.1
    n=$((n + 1))
  done

  "$bindir/ibmsg-send" -p "$port" -n "$count" -s "$size" -c "$conns" --verify "$addr" \
    >"$tmp/send.out" 2>&1
  send_status=$?

  # The receiver ends by itself after COUNT messages; give it a little time.
  if wait_exit "$recv_pid" 150; then
    wait "$recv_pid"
    recv_status=$?
  else
    kill "$recv_pid" 2>/dev/null
    wait "$recv_pid" 2>/dev/null
    echo "  demo: ibmsg-recv did not exit within 15 s after the sender" >>"$tmp/recv.out"
    recv_status=1
  fi
  recv_pid=

  echo "receiver: ibmsg-recv -p $port -n $count --verify $addr (exit status $recv_status)"
  show "|" "$tmp/recv.out"
  echo "sender: ibmsg-send -p $port -n $count -s $size -c $conns --verify $addr" \
    "(exit status $send_status)"
  show "|" "$tmp/send.out"
  if [ "$send_status" = 0 ] && [ "$recv_status" = 0 ]; then
    echo "round $round: OK"
  else
    echo "round $round: FAILED"
    failures=$((failures + 1))
  fi
}

# run_rdma_round STRING: an ibmsg-rdma server offers a buffer; a client writes STRING into it
# with an RDMA write, reads it back with an RDMA read and compares; SIGINT ends the server.
run_rdma_round() {
  string=$1
  round=$((round + 1))
  port=$((12344 + round))
  echo
  echo "=== round $round: one-sided RDMA: \"$string\" written into a server's buffer, read back ==="

  "$bindir/ibmsg-rdma" --server -p "$port" "$addr" >"$tmp/server.out" 2>&1 &
  server_pid=$!
  n=0
  until grep -q "listening on" "$tmp/server.out" 2>/dev/null; do
    if ! kill -0 "$server_pid" 2>/dev/null || [ "$n" -ge 100 ]; then
      break
    fi
    sleep 0.1
    n=$((n + 1))
  done

  "$bindir/ibmsg-rdma" -p "$port" --string "$string" "$addr" >"$tmp/client.out" 2>&1
  client_status=$?

  # The server serves until interrupted: SIGINT is its normal end (exit status 0).
  kill -INT "$server_pid" 2>/dev/null
  if wait_exit "$server_pid" 100; then
    wait "$server_pid"
    server_status=$?
  else
    kill "$server_pid" 2>/dev/null
    wait "$server_pid" 2>/dev/null
    echo "  demo: ibmsg-rdma --server did not exit within 10 s after SIGINT" >>"$tmp/server.out"
    server_status=1
  fi
  server_pid=

  echo "server: ibmsg-rdma --server -p $port $addr (exit status $server_status)"
  show "|" "$tmp/server.out"
  echo "client: ibmsg-rdma -p $port --string \"$string\" $addr (exit status $client_status)"
  show "|" "$tmp/client.out"
  if [ "$client_status" = 0 ] && [ "$server_status" = 0 ] && grep -q "^SUCCESS" "$tmp/client.out"
  then
    echo "round $round: OK"
  else
    echo "round $round: FAILED"
    failures=$((failures + 1))
  fi
}

# run_rpc_round KEY VALUE: an ibmsg-rpc server; one client stores VALUE under KEY, another
# reads it back, a third asks for a key that is not there (exit status 1, "not found"); each is
# one request and its reply, protobuf messages. SIGINT ends the server.
run_rpc_round() {
  key=$1 value=$2
  if [ ! -x "$bindir/ibmsg-rpc" ]; then
    echo
    echo "=== skipped: ibmsg-rpc was not built (configure found no protobuf-c:" \
      "apt-get install protobuf-c-compiler libprotobuf-c-dev) ==="
    return
  fi
  round=$((round + 1))
  port=$((12344 + round))
  echo
  echo "=== round $round: requests and replies: a key-value store, its messages protobuf ==="

  "$bindir/ibmsg-rpc" --server -v -p "$port" "$addr" >"$tmp/server.out" 2>&1 &
  server_pid=$!
  n=0
  until grep -q "listening on" "$tmp/server.out" 2>/dev/null; do
    if ! kill -0 "$server_pid" 2>/dev/null || [ "$n" -ge 100 ]; then
      break
    fi
    sleep 0.1
    n=$((n + 1))
  done

  "$bindir/ibmsg-rpc" -p "$port" "$addr" put "$key" "$value" >"$tmp/put.out" 2>&1
  put_status=$?
  "$bindir/ibmsg-rpc" -p "$port" "$addr" get "$key" >"$tmp/get.out" 2>"$tmp/get.err"
  get_status=$?
  "$bindir/ibmsg-rpc" -p "$port" "$addr" get "no such key" >"$tmp/miss.out" 2>&1
  miss_status=$?

  # The server serves until interrupted: SIGINT is its normal end (exit status 0).
  kill -INT "$server_pid" 2>/dev/null
  if wait_exit "$server_pid" 100; then
    wait "$server_pid"
    server_status=$?
  else
    kill "$server_pid" 2>/dev/null
    wait "$server_pid" 2>/dev/null
    echo "  demo: ibmsg-rpc --server did not exit within 10 s after SIGINT" >>"$tmp/server.out"
    server_status=1
  fi
  server_pid=

  echo "server: ibmsg-rpc --server -v -p $port $addr (exit status $server_status)"
  show "|" "$tmp/server.out"
  echo "client: ibmsg-rpc -p $port $addr put \"$key\" \"$value\" (exit status $put_status)"
  show "|" "$tmp/put.out"
  echo "client: ibmsg-rpc -p $port $addr get \"$key\" (exit status $get_status)"
  show "|" "$tmp/get.out"
  show "|" "$tmp/get.err"
  echo "client: ibmsg-rpc -p $port $addr get \"no such key\" (exit status $miss_status," \
    "1 expected)"
  show "|" "$tmp/miss.out"
  if [ "$put_status" = 0 ] && [ "$get_status" = 0 ] && [ "$(cat "$tmp/get.out")" = "$value" ] &&
     [ "$miss_status" = 1 ] && grep -q "not found" "$tmp/miss.out" && [ "$server_status" = 0 ]
  then
    echo "round $round: OK"
  else
    echo "round $round: FAILED"
    failures=$((failures + 1))
  fi
}

echo "ibmsg demo on $addr${IBMSG_TEST_DEVICE:+ (device $IBMSG_TEST_DEVICE)}"
run_round 10000 4096 1
run_round 10000 4096 4
run_round 2000 0 2
run_rdma_round "hello rdma"
run_rpc_round greeting "hello rpc"

echo
if [ "$failures" = 0 ]; then
  echo "demo: all $round rounds passed"
  exit 0
fi
echo "demo: $failures of $round rounds FAILED"
exit 1
