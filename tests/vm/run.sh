#!/usr/bin/env bash
# Boots the tutti test guest under QEMU with four NVMe controllers and an
# emulated Intel IOMMU, runs tests/vm/guest-test.sh inside, and prints the
# guest's console. Exit status: 0 when the guest ran to TUTTI-VM-DONE (the
# steps' own results are in the output: TUTTI-VM-STEP <name> rc=N), 77 when
# a tool is missing (SKIP), 1 otherwise.
#
# Logs: target/vm/console.log (serial console), target/vm/build.log.
#
# Environment:
#   TUTTI_VM_TIMEOUT   seconds before QEMU is killed (default 600)
#   TUTTI_VM_ACCEL     tcg (default) | kvm | auto (kvm if it really works)
#   and those of build.sh.
set -euo pipefail

if [ $# -gt 0 ]; then
    # No arguments: everything is set through the environment (above).
    sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
fi

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
VM="$ROOT/target/vm"
mkdir -p "$VM"
QEMU=${QEMU:-qemu-system-x86_64}
INSTALL_HINT="apt-get install --no-install-recommends qemu-system-x86 busybox-static cpio xz-utils zstd"

if ! command -v "$QEMU" >/dev/null 2>&1; then
    echo "SKIP: $QEMU not installed ($INSTALL_HINT)"
    exit 77
fi
for tool in timeout truncate; do
    command -v "$tool" >/dev/null 2>&1 || { echo "SKIP: $tool not installed (coreutils)"; exit 77; }
done

# ---- build (kernel, modules, static binaries, initramfs) ----------------
t_build0=$(date +%s.%N)
set +e
"$ROOT/tests/vm/build.sh" >"$VM/build.env" 2> >(tee "$VM/build.log" >&2)
rc=$?
set -e
wait
if [ $rc = 77 ]; then
    # build.sh printed the SKIP reason on stderr; repeat it on stdout.
    grep '^SKIP:' "$VM/build.log" || echo "SKIP: build.sh skipped"
    exit 77
elif [ $rc != 0 ]; then
    echo "run.sh: build failed (rc=$rc); see $VM/build.log"
    exit 1
fi
# shellcheck disable=SC1091
. "$VM/build.env"
t_build1=$(date +%s.%N)

# ---- disks: fresh sparse images every run ---------------------------------
DISKS="$VM/disks"
rm -rf "$DISKS"
mkdir -p "$DISKS"
for i in 0 1 2 3; do
    truncate -s 256M "$DISKS/nvme$i.img"
done

# ---- accelerator -----------------------------------------------------------
# /dev/kvm exists on the CI machines but cannot run a stock kernel: TCG by
# default; "auto" uses KVM only when a tiny KVM guest really starts.
ACCEL=${TUTTI_VM_ACCEL:-tcg}
if [ "$ACCEL" = auto ]; then
    # A paused KVM machine that is still alive after 3 s got through KVM
    # initialisation (timeout's 124); one that cannot use KVM exits at once.
    # This cannot tell a KVM that fails later in the guest kernel: on such
    # machines leave the default (tcg).
    ACCEL=tcg
    if [ -w /dev/kvm ]; then
        set +e
        timeout 3 "$QEMU" -machine q35,accel=kvm -cpu host -m 64M -nodefaults \
            -display none -S -monitor none -serial none </dev/null >/dev/null 2>&1
        [ $? = 124 ] && ACCEL=kvm
        set -e
    fi
fi
if [ "$ACCEL" = kvm ]; then
    MACHINE="q35,accel=kvm,kernel-irqchip=split"
    CPU=host
else
    MACHINE="q35,accel=tcg,kernel-irqchip=split"
    CPU=max
fi

# ---- boot --------------------------------------------------------------------
# Four controllers at pinned addresses 0000:00:10.0 .. 0000:00:13.0 (the
# guest test and replay.yaml name them):
#   nvme0 plain, 512-byte blocks
#   nvme1 namespace with 4096-byte logical blocks (separate nvme-ns device)
#   nvme2 mdts=2: 16 KiB per command with 4 KiB pages
#   nvme3 max_ioqpairs=2
QEMU_ARGS=(
    -machine "$MACHINE" -cpu "$CPU" -m 2G -smp 2
    -nographic -no-reboot -nodefaults -serial stdio -monitor none
    -kernel "$KERNEL" -initrd "$INITRD"
    -append "console=ttyS0 intel_iommu=on quiet panic=-1 mitigations=off"
    -device intel-iommu,intremap=on,caching-mode=on
    -drive "file=$DISKS/nvme0.img,if=none,id=disk0,format=raw,cache=unsafe"
    -device nvme,id=nvme0,serial=tutti0,addr=0x10,drive=disk0
    -drive "file=$DISKS/nvme1.img,if=none,id=disk1,format=raw,cache=unsafe"
    -device nvme,id=nvme1,serial=tutti1,addr=0x11
    -device nvme-ns,drive=disk1,bus=nvme1,nsid=1,logical_block_size=4096,physical_block_size=4096
    -drive "file=$DISKS/nvme2.img,if=none,id=disk2,format=raw,cache=unsafe"
    -device nvme,id=nvme2,serial=tutti2,addr=0x12,drive=disk2,mdts=2
    -drive "file=$DISKS/nvme3.img,if=none,id=disk3,format=raw,cache=unsafe"
    -device nvme,id=nvme3,serial=tutti3,addr=0x13,drive=disk3,max_ioqpairs=2
)
TIMEOUT=${TUTTI_VM_TIMEOUT:-600}
echo "run.sh: kernel $KVER ($(basename "$KERNEL")), accel $ACCEL, timeout ${TIMEOUT}s"
echo "run.sh: $QEMU ${QEMU_ARGS[*]}" >"$VM/qemu-cmdline.txt"
t_boot0=$(date +%s.%N)
set +e
timeout --kill-after=10 "$TIMEOUT" "$QEMU" "${QEMU_ARGS[@]}" </dev/null 2>&1 |
    tr -d '\r' | tee "$VM/console.log"
qrc=${PIPESTATUS[0]}
set -e
t_end=$(date +%s.%N)

secs() { awk "BEGIN { printf \"%.1f\", $2 - $1 }"; }
echo "run.sh: build $(secs "$t_build0" "$t_build1") s, qemu $(secs "$t_boot0" "$t_end") s (exit $qrc)," \
    "guest booted at $(sed -n 's/.*TUTTI-VM-BOOTED.*uptime=\([0-9.]*\).*/\1/p' "$VM/console.log" | head -n 1) s guest time"
echo "run.sh: console log $VM/console.log"
rm -rf "$DISKS"
if [ "$qrc" = 124 ] || [ "$qrc" = 137 ]; then
    echo "run.sh: QEMU timed out after ${TIMEOUT}s"
    exit 1
fi
# One line per guest step, for a reader at a terminal (tests/vm.rs checks
# the details).
echo "run.sh: steps:"
sed -n 's/^TUTTI-VM-STEP \([^ ]*\) rc=\([0-9]*\).*/  \2  \1/p' "$VM/console.log" |
    awk '{ printf "    %-6s %s\n", ($1 == 0 ? "ok" : "FAILED"), $2 }'
if ! grep -q '^TUTTI-VM-DONE' "$VM/console.log"; then
    echo "run.sh: the guest did not reach TUTTI-VM-DONE"
    exit 1
fi
exit 0
