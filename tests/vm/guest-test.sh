#!/bin/sh
# Runs inside the QEMU guest (started by /init). Every step prints
#   TUTTI-VM-STEP <name> BEGIN
#   ...its output (stdout and stderr)...
#   TUTTI-VM-STEP <name> rc=<exit status> secs=<guest seconds>
# and the script ends with TUTTI-VM-DONE. tests/vm.rs parses these lines.
#
# run.sh boots the guest twice over the same four disk images; /init sets
# TUTTI_VM_BOOT from the kernel argument tutti.boot=N:
#   boot 1: every step below, ending with a replay that formats a tutti-kv
#           store on the drives and saves its blocks there;
#   boot 2: the drives bound again and the same replay without --format
#           (step replay-restart): the store is recovered from the media,
#           and the blocks boot 1 saved are loaded and verified.
#
# The four controllers (tests/vm/run.sh pins their addresses):
#   0000:00:10.0 512-byte blocks      0000:00:11.0 4096-byte blocks
#   0000:00:12.0 mdts=2               0000:00:13.0 max_ioqpairs=2
export PATH=/usr/sbin:/usr/bin:/sbin:/bin
export RUST_BACKTRACE=1
ADDRS="0000:00:10.0 0000:00:11.0 0000:00:12.0 0000:00:13.0"
BOOT=${TUTTI_VM_BOOT:-1}
# The replay of both boots: the same trace (the synthetic one, 200
# requests) over the same store, so boot 2 looks up the blocks boot 1 saved.
REPLAY="tutti-bench replay --config /vm/replay.yaml --store kv --requests 200 --json"
# Per-step limit (guest seconds); the host's QEMU timeout covers the rest.
STEP_TIMEOUT=${STEP_TIMEOUT:-300}

now() { cut -d' ' -f1 /proc/uptime; }

# step NAME COMMAND...: runs COMMAND (a program, or a function of this
# script) with the markers around it.
step() {
    name=$1
    shift
    echo "TUTTI-VM-STEP $name BEGIN"
    t0=$(now)
    if type "$1" 2>/dev/null | grep -q 'function'; then
        "$@" 2>&1
    else
        timeout "$STEP_TIMEOUT" "$@" 2>&1
    fi
    rc=$?
    t1=$(now)
    echo "TUTTI-VM-STEP $name rc=$rc secs=$(awk "BEGIN { printf \"%.2f\", $t1 - $t0 }")"
    return 0
}

# The NVMe functions (class 0x010802) in /sys/bus/pci.
nvme_functions() {
    for d in /sys/bus/pci/devices/*; do
        [ "$(cat "$d/class")" = 0x010802 ] && basename "$d"
    done
}

driver_of() {
    if [ -e "/sys/bus/pci/devices/$1/driver" ]; then
        basename "$(readlink "/sys/bus/pci/devices/$1/driver")"
    else
        echo none
    fi
}

# Block devices of a function bound to nvme (nvmeXnY), space separated.
blockdevs_of() {
    ls -d /sys/bus/pci/devices/"$1"/nvme/nvme*/nvme*n* 2>/dev/null | while read -r b; do
        printf '%s ' "$(basename "$b")"
    done
}

# wait_nvme ADDR...: until each function is bound to nvme and has a block
# device (the kernel driver probes asynchronously). 60 guest seconds.
wait_nvme() {
    i=0
    while [ $i -lt 600 ]; do
        ok=1
        for a in "$@"; do
            if [ "$(driver_of "$a")" != nvme ] || [ -z "$(blockdevs_of "$a")" ]; then
                ok=0
            fi
        done
        [ $ok = 1 ] && return 0
        sleep 0.1
        i=$((i + 1))
    done
    return 1
}

# The four controllers are present, NVMe class, on the kernel nvme driver
# with a block device each.
check_controllers() {
    local waited rc found a d drv b
    wait_nvme $ADDRS
    waited=$?
    rc=0
    found=$(nvme_functions | tr '\n' ' ')
    echo "nvme functions: $found"
    for a in $ADDRS; do
        d=/sys/bus/pci/devices/$a
        if [ ! -e "$d" ]; then
            echo "$a: missing"
            rc=1
            continue
        fi
        drv=$(driver_of "$a")
        echo "$a class=$(cat "$d/class") id=$(cat "$d/vendor"):$(cat "$d/device") driver=$drv" \
            "iommu_group=$(basename "$(readlink "$d/iommu_group" 2>/dev/null)" 2>/dev/null)" \
            "block=$(blockdevs_of "$a")"
        [ "$(cat "$d/class")" = 0x010802 ] || rc=1
        [ "$drv" = nvme ] || rc=1
    done
    [ "$(echo $found | wc -w)" = 4 ] || rc=1
    [ $waited = 0 ] || { echo "timed out waiting for the nvme driver"; rc=1; }
    for b in /sys/block/nvme*; do
        [ -e "$b" ] && echo "$(basename "$b"): $(cat "$b/size") sectors, logical_block_size $(cat "$b/queue/logical_block_size"), max_hw_sectors_kb $(cat "$b/queue/max_hw_sectors_kb")"
    done
    return $rc
}

# The IOMMU is on: DMA remapping groups exist and every controller has one.
check_iommu() {
    local rc n g a
    rc=0
    dmesg | grep -iE 'DMAR|IOMMU' | grep -viE 'ACPI' | head -n 8
    n=$(ls /sys/kernel/iommu_groups 2>/dev/null | wc -l)
    echo "iommu groups: $n"
    [ "$n" -gt 0 ] || rc=1
    for a in $ADDRS; do
        g=$(readlink "/sys/bus/pci/devices/$a/iommu_group" 2>/dev/null)
        if [ -z "$g" ]; then
            echo "$a: no iommu_group"
            rc=1
        else
            echo "$a: group $(basename "$g"): $(ls "/sys/bus/pci/devices/$a/iommu_group/devices" | tr '\n' ' ')"
        fi
    done
    return $rc
}

# Hand one controller to vfio-pci through sysfs alone (driver_override,
# unbind, drivers_probe), check that /dev/vfio/<group> appears, and give it
# back to nvme. Proves the IOMMU/VFIO setup independently of tutti-probe.
check_vfio_sysfs() {
    local a d g rc
    a=0000:00:13.0
    d=/sys/bus/pci/devices/$a
    g=$(basename "$(readlink "$d/iommu_group")")
    rc=0
    echo vfio-pci >"$d/driver_override"
    [ -e "$d/driver" ] && echo "$a" >"$d/driver/unbind"
    echo "$a" >/sys/bus/pci/drivers_probe
    echo "$a: driver=$(driver_of "$a")"
    [ "$(driver_of "$a")" = vfio-pci ] || rc=1
    ls -l /dev/vfio/
    [ -c "/dev/vfio/$g" ] || { echo "/dev/vfio/$g missing"; rc=1; }
    # Back to the kernel driver.
    echo "$a" >"$d/driver/unbind"
    echo >"$d/driver_override"
    echo "$a" >/sys/bus/pci/drivers_probe
    if wait_nvme "$a"; then
        echo "$a: back on $(driver_of "$a") with $(blockdevs_of "$a")"
    else
        echo "$a: not back on nvme (driver=$(driver_of "$a"))"
        rc=1
    fi
    return $rc
}

# ---------------------------------------------------------------- tuttid --
# The daemon owns the four vfio-bound controllers (/vm/tuttid.yaml: pci
# drives, doorbells forwarded from shadow pages); two `tuttid verify`
# clients stripe over all four through granted queues, every byte
# verified, and hold their queues until the status was read; after they
# exit, the daemon's pool is whole.
TUTTID_SOCK=/run/tuttid.sock
TUTTID_DRIVES=q0,q1,q2,q3
TUTTID_TMP=/tmp/tuttid

# tuttid_serve: starts the daemon in the background, waits for
# "listening" (30 s).
tuttid_serve() {
    local i
    rm -rf "$TUTTID_TMP"
    mkdir -p "$TUTTID_TMP"
    tuttid serve --config /vm/tuttid.yaml >"$TUTTID_TMP/daemon.log" 2>&1 &
    echo $! >"$TUTTID_TMP/daemon.pid"
    i=0
    while [ $i -lt 300 ]; do
        if grep -q listening "$TUTTID_TMP/daemon.log"; then
            cat "$TUTTID_TMP/daemon.log"
            return 0
        fi
        kill -0 "$(cat "$TUTTID_TMP/daemon.pid")" 2>/dev/null || break
        sleep 0.1
        i=$((i + 1))
    done
    echo "tuttid did not start listening"
    cat "$TUTTID_TMP/daemon.log"
    return 1
}

# The number of client processes (distinct pids) holding queues in the
# status at $1.
tuttid_client_pids() {
    grep 'queues \[[a-z]' "$1" | awk '{ print $2 }' | sort -u | wc -l
}

# tuttid_clients: two verify clients (regions 0 and 1), the status while
# both hold their queues, then their exit codes and output.
tuttid_clients() {
    local r i rc n pids
    rc=0
    pids=""
    for r in 0 1; do
        timeout "$STEP_TIMEOUT" tuttid verify --socket "$TUTTID_SOCK" --drives "$TUTTID_DRIVES" \
            --region $r --rounds 2 --hold "$TUTTID_TMP/release" >"$TUTTID_TMP/client$r.log" 2>&1 &
        pids="$pids $!"
    done
    i=0
    while [ $i -lt 1200 ]; do
        n=$(grep -l holding "$TUTTID_TMP/client0.log" "$TUTTID_TMP/client1.log" 2>/dev/null | wc -l)
        [ "$n" = 2 ] && break
        for p in $pids; do kill -0 "$p" 2>/dev/null || i=1200; done
        sleep 0.1
        i=$((i + 1))
    done
    tuttid status --socket "$TUTTID_SOCK" >"$TUTTID_TMP/status-during" 2>&1
    cat "$TUTTID_TMP/status-during"
    n=$(tuttid_client_pids "$TUTTID_TMP/status-during")
    echo "client processes holding queues: $n"
    [ "$n" = 2 ] || rc=1
    touch "$TUTTID_TMP/release"
    r=0
    for p in $pids; do
        wait "$p"
        echo "client $r rc=$?" >>"$TUTTID_TMP/rcs"
        sed "s/^/client $r: /" "$TUTTID_TMP/client$r.log"
        r=$((r + 1))
    done
    cat "$TUTTID_TMP/rcs"
    grep -q 'rc=[1-9]' "$TUTTID_TMP/rcs" && rc=1
    return $rc
}

# tuttid_pool: once only the status connection is left, every queue pair
# is back in each drive's pool and no registration is left (30 s).
tuttid_pool() {
    local i
    i=0
    while [ $i -lt 300 ]; do
        tuttid status --socket "$TUTTID_SOCK" >"$TUTTID_TMP/status-after" 2>&1
        if grep -q '^clients: 1 connected' "$TUTTID_TMP/status-after" &&
            awk '/^drive /{ d = 1; next } /^clients:/{ d = 0 } d { split($2, q, "/"); n++; if (q[1] != q[2] || $3 != 0) bad = 1 }
                 END { exit (bad || n != 4) }' "$TUTTID_TMP/status-after"; then
            cat "$TUTTID_TMP/status-after"
            echo "pool whole"
            return 0
        fi
        sleep 0.1
        i=$((i + 1))
    done
    cat "$TUTTID_TMP/status-after"
    echo "pool not whole"
    return 1
}

# tuttid_stop: SIGTERM; the daemon shuts its controllers down, prints
# "stopped" and exits 143 (128 + SIGTERM). A watchdog kills it after 60 s.
tuttid_stop() {
    local pid rc w
    pid=$(cat "$TUTTID_TMP/daemon.pid")
    kill -TERM "$pid"
    (sleep 60 && kill -KILL "$pid" 2>/dev/null) &
    w=$!
    wait "$pid"
    rc=$?
    kill "$w" 2>/dev/null
    cat "$TUTTID_TMP/daemon.log"
    echo "tuttid exited with $rc"
    grep -q stopped "$TUTTID_TMP/daemon.log"
}

if [ "$BOOT" = 2 ]; then
    # The store boot 1 left on the drives: no --format, no checks that
    # write (conformance, selftest) before it.
    step controllers check_controllers
    step bind tutti-probe bind --all-unused
    step replay-restart $REPLAY
    step unbind tutti-probe unbind $ADDRS
    echo "TUTTI-VM-DONE"
    exit 0
fi

step controllers check_controllers
step iommu check_iommu
step vfio-sysfs check_vfio_sysfs

if ! command -v tutti-probe >/dev/null 2>&1; then
    echo "tutti-probe is not in this guest: the tutti-probe steps fail with rc=127"
fi
step list tutti-probe list
step status tutti-probe status
step bind tutti-probe bind --all-unused
step list-json tutti-probe list --json
for a in $ADDRS; do
    step "identify-$a" tutti-probe identify "$a"
done
# The checks need a scratch range of at least 4 MiB, in logical blocks:
# 8 MiB on each controller (0000:00:11.0 has 4096-byte blocks, the others
# 512). The disks are fresh images: nothing to lose.
for a in $ADDRS; do
    case $a in
        0000:00:11.0) range=0..2048 ;;
        *) range=0..16384 ;;
    esac
    step "conformance-$a" tutti-probe conformance "$a" --lba-range "$range" --yes
done
step selftest tutti-probe selftest 0000:00:10.0 --lba-range 0..2048 --yes
# tuttid before the replay: its clients write the first 16 MiB of the
# stripe, which the replay's --format then claims for its store.
step tuttid-serve tuttid_serve
step tuttid-clients tuttid_clients
step tuttid-pool tuttid_pool
# A hostile client on q0 (mediated, the pci default): attacks on another
# client's memory through PRPs, admin opcodes, another NSID; each refused.
step tuttid-attack tuttid attack --socket "$TUTTID_SOCK" --drive q0
step tuttid-stop tuttid_stop
# --format: conformance and selftest left their data on the drives; the
# replay's tutti-kv store would refuse it as not a store of its own. Boot 2
# replays the same trace over the blocks this replay saves.
step replay $REPLAY --format
step unbind tutti-probe unbind $ADDRS
step list-final tutti-probe list
echo "TUTTI-VM-DONE"
