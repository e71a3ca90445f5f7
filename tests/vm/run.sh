#!/usr/bin/env bash
# Boots the tutti test guest under QEMU with four NVMe controllers and an
# emulated Intel IOMMU twice over the same four disk images, runs
# tests/vm/guest-test.sh inside, and prints the guest's console. Boot 1 runs
# every step and ends with a replay that saves its blocks in a tutti-kv
# store on the drives; boot 2 (kernel argument tutti.boot=2) replays the
# same trace over the store recovered from the images. Before each boot
# run.sh prints TUTTI-VM-BOOT <n>. Exit status: 0 when both boots ran to
# TUTTI-VM-DONE (the steps' own results are in the output: TUTTI-VM-STEP
# <name> rc=N), 77 when a tool is missing (SKIP), 1 otherwise.
#
# Logs in target/vm/: console.log (serial console, both boots),
# console-boot1.log and console-boot2.log (each boot's), build.log.
#
# Environment:
#   TUTTI_VM_TIMEOUT   seconds before QEMU is killed, per boot (default 600)
#   TUTTI_VM_ACCEL     tcg (default) | kvm | auto (kvm if it really works)
#   TUTTI_VM_BOOTS     2 (default) | 1 (boot 1 only, for work on the harness)
#   TUTTI_VM_KEEP_DISKS=1  keep the disk images (target/vm/disks) afterwards
#   and those of build.sh.
set -euo pipefail

if [ $# -gt 0 ]; then
    # No arguments: everything is set through the environment (above).
    sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'
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

# ---- disks: fresh sparse images every run, the same files for both boots ---
DISKS="$VM/disks"
rm -rf "$DISKS"
mkdir -p "$DISKS"
for i in 0 1 2 3; do
    truncate -s 256M "$DISKS/nvme$i.img"
done
BOOTS=${TUTTI_VM_BOOTS:-2}
case $BOOTS in
    1 | 2) ;;
    *) echo "run.sh: TUTTI_VM_BOOTS must be 1 or 2, not $BOOTS"; exit 2 ;;
esac

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
# The images are plain raw files, written by QEMU with pwrite as the guest's
# writes complete: what boot 1 wrote is in them (in the host's page cache at
# least) once its QEMU has exited, and boot 2's QEMU reads it from there.
# cache=unsafe only skips the fsync of a guest Flush, which matters for a
# host crash, not for a second process on the same host.
qemu_args() { # BOOT
    QEMU_ARGS=(
        -machine "$MACHINE" -cpu "$CPU" -m 2G -smp 2
        -nographic -no-reboot -nodefaults -serial stdio -monitor none
        -kernel "$KERNEL" -initrd "$INITRD"
        -append "console=ttyS0 intel_iommu=on quiet panic=-1 mitigations=off tutti.boot=$1"
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
}
TIMEOUT=${TUTTI_VM_TIMEOUT:-600}
echo "run.sh: kernel $KVER ($(basename "$KERNEL")), accel $ACCEL, timeout ${TIMEOUT}s per boot, $BOOTS boot(s)"
: >"$VM/console.log"
: >"$VM/qemu-cmdline.txt"
secs() { awk "BEGIN { printf \"%.1f\", $2 - $1 }"; }
# The images' allocated sizes: what the guest wrote into them.
disk_usage() {
    local i out=""
    for i in 0 1 2 3; do
        out="$out nvme$i.img $(du -k "$DISKS/nvme$i.img" | cut -f1) KiB,"
    done
    echo "${out%,}"
}

# boot N: one QEMU run; its console goes to stdout, console.log and
# console-bootN.log, after a TUTTI-VM-BOOT N line. Sets qrc.
boot() {
    local n=$1 t0 t1 log="$VM/console-boot$1.log"
    qemu_args "$n"
    echo "run.sh: boot $n: $QEMU ${QEMU_ARGS[*]}" >>"$VM/qemu-cmdline.txt"
    : >"$log"
    echo "TUTTI-VM-BOOT $n" | tee -a "$VM/console.log" "$log"
    t0=$(date +%s.%N)
    set +e
    timeout --kill-after=10 "$TIMEOUT" "$QEMU" "${QEMU_ARGS[@]}" </dev/null 2>&1 |
        tr -d '\r' | tee -a "$VM/console.log" "$log"
    qrc=${PIPESTATUS[0]}
    set -e
    t1=$(date +%s.%N)
    echo "run.sh: boot $n: qemu $(secs "$t0" "$t1") s (exit $qrc)," \
        "guest booted at $(sed -n 's/.*TUTTI-VM-BOOTED.*uptime=\([0-9.]*\).*/\1/p' "$log" | head -n 1) s guest time"
    echo "run.sh: boot $n: disk images:$(disk_usage)"
}

t_boot0=$(date +%s.%N)
failed=""
n=1
while [ "$n" -le "$BOOTS" ]; do
    boot "$n"
    # One line per guest step, for a reader at a terminal (tests/vm.rs
    # checks the details).
    echo "run.sh: boot $n: steps:"
    sed -n 's/^TUTTI-VM-STEP \([^ ]*\) rc=\([0-9]*\).*/  \2  \1/p' "$VM/console-boot$n.log" |
        awk '{ printf "    %-6s %s\n", ($1 == 0 ? "ok" : "FAILED"), $2 }'
    if [ "$qrc" = 124 ] || [ "$qrc" = 137 ]; then
        failed="boot $n: QEMU timed out after ${TIMEOUT}s"
    elif ! grep -q '^TUTTI-VM-DONE' "$VM/console-boot$n.log"; then
        failed="boot $n: the guest did not reach TUTTI-VM-DONE"
    fi
    # Boot 2 reads what boot 1 left on the drives: without a boot 1 that ran
    # to its end there is nothing to check.
    [ -z "$failed" ] || break
    n=$((n + 1))
done
t_end=$(date +%s.%N)
echo "run.sh: build $(secs "$t_build0" "$t_build1") s, qemu $(secs "$t_boot0" "$t_end") s in all"
echo "run.sh: console log $VM/console.log"
if [ "${TUTTI_VM_KEEP_DISKS:-0}" = 1 ]; then
    echo "run.sh: disk images kept in $DISKS"
else
    rm -rf "$DISKS"
fi
if [ -n "$failed" ]; then
    echo "run.sh: $failed"
    exit 1
fi
exit 0
