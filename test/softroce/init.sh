#!/bin/busybox sh
# /init of the Soft-RoCE test VM (built into the initramfs by test/softroce/run).
# Loads the virtio-9p and RDMA modules, mounts the host's / read-only, the caller's current
# directory read-write and the result share, then runs job.sh from the share in a chroot.
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev

halt() { sync; echo o > /proc/sysrq-trigger; sleep 10; }

for m in @MODULES@; do
  insmod /lib/modules/$m.ko || echo "init: insmod $m failed"
done

opts=trans=virtio,version=9p2000.L,msize=512000
mount -t 9p -o $opts,cache=none share /share || { echo "init: cannot mount the share"; halt; }
# Two hosts (test/softroce/run --hosts 2): /share/twohost holds this host's number.
host=
[ -f /share/twohost ] && host=$(cat /share/twohost)
if [ -n "$host" ]; then
  for m in @NET_MODULES@; do
    insmod /lib/modules/$m.ko || echo "init: insmod $m failed"
  done
fi
mount -t 9p -o $opts,ro,cache=loose hostroot /newroot || { echo "init: cannot mount the host root"; echo 67 > /share/status; halt; }
mount -t proc proc /newroot/proc
mount -t sysfs sysfs /newroot/sys
mount -t devtmpfs devtmpfs /newroot/dev
mkdir -p /newroot/dev/pts /newroot/dev/shm 2>/dev/null
mount -t devpts devpts /newroot/dev/pts
mount -t tmpfs tmpfs /newroot/dev/shm
# /tmp: the host's files stay visible (a checkout under /tmp must work), writes stay in the VM.
mkdir -p /overlay && mount -t tmpfs tmpfs /overlay && mkdir -p /overlay/upper /overlay/work &&
  chmod 1777 /overlay/upper &&
  mount -t overlay overlay -o lowerdir=/newroot/tmp,upperdir=/overlay/upper,workdir=/overlay/work /newroot/tmp ||
  mount -t tmpfs -o mode=1777 tmpfs /newroot/tmp
mount -t tmpfs -o mode=755 tmpfs /newroot/run
if [ -n "$host" ]; then
  # The directory both VMs share, uncached so that each sees the other's writes at once.
  mkdir -p /newroot/run/softroce-common
  mount -t 9p -o $opts,cache=none common /newroot/run/softroce-common ||
    { echo "init: cannot mount the common directory"; echo 67 > /share/status; halt; }
fi
cwd=$(cat /share/cwd)
if [ "$cwd" != / ]; then
  mkdir -p "/newroot$cwd" 2>/dev/null   # only needed (and possible) under the tmpfs
  mount -t 9p -o $opts cwd "/newroot$cwd" || { echo "init: cannot mount $cwd"; echo 67 > /share/status; halt; }
fi
mkdir -p /newroot/run/softroce
mount --bind /share /newroot/run/softroce
# Test host names: a private copy of the host's /etc/hosts.
cat /newroot/etc/hosts > /newroot/run/hosts 2>/dev/null
if [ -z "$host" ]; then
  printf '169.254.7.1 ibmsg-test ibmsg-test4\nfd00::1 ibmsg-test ibmsg-test6\n' >> /newroot/run/hosts
else
  peer=$((3 - host))
  printf '169.254.7.%s ibmsg-test ibmsg-test4 ibmsg-h%s\nfd00::%s ibmsg-test ibmsg-test6 ibmsg-h%s\n' \
    $host $host $host $host >> /newroot/run/hosts
  printf '169.254.7.%s ibmsg-peer ibmsg-peer4 ibmsg-h%s\nfd00::%s ibmsg-peer ibmsg-peer6 ibmsg-h%s\n' \
    $peer $peer $peer $peer >> /newroot/run/hosts
fi
mount --bind /newroot/run/hosts /newroot/etc/hosts

chroot /newroot /bin/bash /run/softroce/job.sh
halt
