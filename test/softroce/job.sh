# Runs inside the Soft-RoCE test VM, chrooted into the host's filesystem (see init.sh):
# sets up rxe0, then runs the caller's command with its stdout/stderr on ttyS1/ttyS2.
share=/run/softroce
status() { echo "$1" > $share/status.tmp && mv $share/status.tmp $share/status; }
fail() { echo "softroce/run: $*" >&2; status 67; exit 0; }

exec 3<>/dev/ttyS1 4<>/dev/ttyS2
stty raw -echo <&3; stty raw -echo <&4   # byte-exact output: no \n -> \r\n
exec 2>&4

ip link set lo up
ip link add rdma0 type dummy || fail "cannot create the dummy device"
ip link set rdma0 mtu 9000 up
ip addr add 169.254.7.1/32 dev rdma0
ip -6 addr add fd00::1/128 dev rdma0 nodad
rdma link add rxe0 type rxe netdev rdma0 || fail "rdma link add rxe0 failed"
for i in $(seq 50); do
  grep -q ACTIVE /sys/class/infiniband/rxe0/ports/1/state 2>/dev/null && break
  sleep 0.1
done
grep -q ACTIVE /sys/class/infiniband/rxe0/ports/1/state || fail "rxe0 port did not become active"

. $share/env.sh
cd -- "$cwd" || fail "cannot enter $cwd"
# CMD writes to pipes, not to the serial ttys, so that isatty() is false as it would be
# under a test harness on the host.
mkfifo /run/out /run/err
cat /run/out >&3 & cat_out=$!
cat /run/err >&4 & cat_err=$!
"${cmd[@]}" </dev/null >/run/out 2>/run/err
st=$?
# Let output drain (a daemon CMD left behind may hold the pipes open: do not wait forever).
for i in $(seq 100); do
  kill -0 $cat_out 2>/dev/null || kill -0 $cat_err 2>/dev/null || break
  sleep 0.05
done
status $st
