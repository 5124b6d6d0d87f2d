# Runs inside the Soft-RoCE test VM, chrooted into the host's filesystem (see init.sh):
# sets up rxe0, then runs the caller's command with its stdout/stderr on ttyS1/ttyS2.
share=/run/softroce
status() { echo "$1" > $share/status.tmp && mv $share/status.tmp $share/status; }
fail() { echo "softroce/run: $*" >&2; status 67; exit 0; }

exec 3<>/dev/ttyS1 4<>/dev/ttyS2
stty raw -echo <&3; stty raw -echo <&4   # byte-exact output: no \n -> \r\n
exec 2>&4

ip link set lo up
if [ -f $share/twohost ]; then
  # Two hosts: rxe0 on the virtio card that leads to the other VM (through the relay).
  host=$(cat $share/twohost) peer=$((3 - $(cat $share/twohost)))
  for i in $(seq 50); do [ -e /sys/class/net/eth0 ] && break; sleep 0.1; done
  ip link set eth0 mtu 9000 up || fail "no network card eth0"
  ip addr add 169.254.7.$host/24 dev eth0
  ip -6 addr add fd00::$host/64 dev eth0 nodad
  # Permanent neighbours: no ARP or ND, so a cut link never leaves a failed entry behind.
  ip neigh replace 169.254.7.$peer lladdr 52:54:00:49:42:0$peer dev eth0 nud permanent
  ip -6 neigh replace fd00::$peer lladdr 52:54:00:49:42:0$peer dev eth0 nud permanent
  rdma link add rxe0 type rxe netdev eth0 || fail "rdma link add rxe0 failed"
else
  ip link add rdma0 type dummy || fail "cannot create the dummy device"
  ip link set rdma0 mtu 9000 up
  ip addr add 169.254.7.1/32 dev rdma0
  ip -6 addr add fd00::1/128 dev rdma0 nodad
  rdma link add rxe0 type rxe netdev rdma0 || fail "rdma link add rxe0 failed"
fi
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
