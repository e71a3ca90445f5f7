#!/usr/bin/env bash
# Builds everything the QEMU guest needs, cached under target/vm/:
#   target/vm/kernel/<pkg>/   the Debian kernel package, unpacked (dpkg -x),
#                             vmlinux (uncompressed ELF) or the bzImage
#   target/vm/cargo/          statically linked tutti-probe / tutti-bench / tuttid
#   target/vm/initramfs/      the guest's root (busybox, modules, binaries)
#   target/vm/initramfs.cpio.gz
# Prints the paths for run.sh as KEY=VALUE lines on stdout (everything else
# goes to stderr). Idempotent; exits 77 with "SKIP: ..." when a host tool is
# missing.
#
# Environment:
#   TUTTI_VM_KERNEL_PKG    kernel package to use (default: the one
#                          linux-image-amd64 depends on, else the cached one)
#   TUTTI_VM_NO_CARGO=1    do not build the binaries (use what is cached)
#   TUTTI_VM_GUEST_SCRIPT  a script to run in the guest instead of
#                          tests/vm/guest-test.sh (experiments)
#   TUTTI_VM_WITHOUT_PROBE=1  build the guest without tutti-probe (for
#                          working on the harness itself)
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
HERE="$ROOT/tests/vm"
VM="$ROOT/target/vm"
mkdir -p "$VM"

log() { echo "build.sh: $*" >&2; }
skip() { echo "SKIP: $*" >&2; exit 77; }

INSTALL_HINT="apt-get install --no-install-recommends qemu-system-x86 busybox-static cpio xz-utils zstd"
for tool in cpio gzip xz dpkg; do
    command -v "$tool" >/dev/null 2>&1 || skip "$tool not installed ($INSTALL_HINT)"
done
# An ELF with a program interpreter (PT_INTERP) is dynamically linked.
is_dynamic() {
    if command -v file >/dev/null 2>&1; then
        LC_ALL=C file -L "$1" | grep -q 'dynamically linked'
    elif command -v readelf >/dev/null 2>&1; then
        LC_ALL=C readelf -lW "$1" 2>/dev/null | grep -q 'INTERP'
    else
        LC_ALL=C grep -qa 'ld-linux' "$1"
    fi
}
BUSYBOX=""
for b in /bin/busybox /usr/bin/busybox; do
    if [ -x "$b" ] && ! is_dynamic "$b"; then
        BUSYBOX=$b
        break
    fi
done
[ -n "$BUSYBOX" ] || skip "static busybox not installed ($INSTALL_HINT)"

# ---------------------------------------------------------------- kernel --
KPKG=${TUTTI_VM_KERNEL_PKG:-}
if [ -z "$KPKG" ] && command -v apt-cache >/dev/null 2>&1; then
    KPKG=$(apt-cache depends linux-image-amd64 2>/dev/null |
        awk '$1 == "Depends:" && $2 ~ /^linux-image-/ { print $2; exit }' || true)
fi
if [ -z "$KPKG" ]; then
    # No package index: use whatever a previous run unpacked.
    KPKG=$(ls -1 "$VM/kernel" 2>/dev/null | sort -V | tail -n 1 || true)
fi
[ -n "$KPKG" ] || skip "cannot determine the kernel package (run apt-get update, or set TUTTI_VM_KERNEL_PKG)"

KDIR="$VM/kernel/$KPKG"
if [ ! -f "$KDIR/.unpacked" ]; then
    command -v apt-get >/dev/null 2>&1 || skip "apt-get not available to download $KPKG"
    log "downloading $KPKG"
    rm -rf "$KDIR"
    mkdir -p "$KDIR/deb"
    # apt-get download as root warns that _apt cannot write here; harmless.
    (cd "$KDIR/deb" && apt-get download "$KPKG" >&2) ||
        skip "apt-get download $KPKG failed (run apt-get update?)"
    dpkg -x "$KDIR"/deb/*.deb "$KDIR/root"
    touch "$KDIR/.unpacked"
fi
KVER=$(ls -1 "$KDIR/root/lib/modules" | head -n 1)
MODROOT="$KDIR/root/lib/modules/$KVER"
BZIMAGE="$KDIR/root/boot/vmlinuz-$KVER"
[ -f "$BZIMAGE" ] || { log "no kernel image in $KDIR/root/boot"; exit 1; }

# The uncompressed ELF vmlinux boots ~4 s faster under TCG (no in-guest
# decompression). Same method as the kernel's scripts/extract-vmlinux: find
# the compressed payload's magic and decompress from there.
extract_vmlinux() {
    local img=$1 out=$2 magic cmd off
    for pair in \
        "\xfd7zXZ\x00|xz -dc" \
        "\x28\xb5\x2f\xfd|zstd -dc" \
        "\x1f\x8b\x08|gzip -dc" \
        "\x02\x21\x4c\x18|lz4 -dc" \
        "\x5d\x00\x00\x00|unlzma -c" \
        "BZh|bunzip2 -c"; do
        magic=${pair%%|*}
        cmd=${pair#*|}
        command -v "${cmd%% *}" >/dev/null 2>&1 || continue
        for off in $(LC_ALL=C grep -obUaP "$magic" "$img" 2>/dev/null | cut -d: -f1 | head -n 8); do
            # The payload is followed by more bytes: decompressors complain
            # about trailing garbage, so judge by the output, not the status.
            tail -c +"$((off + 1))" "$img" | $cmd >"$out.tmp" 2>/dev/null || true
            if [ -s "$out.tmp" ] && [ "$(head -c 4 "$out.tmp" | od -An -tx1 | tr -d ' \n')" = "7f454c46" ]; then
                mv "$out.tmp" "$out"
                return 0
            fi
        done
    done
    rm -f "$out.tmp"
    return 1
}
KERNEL="$KDIR/vmlinux"
if [ ! -f "$KERNEL" ]; then
    log "extracting vmlinux from $(basename "$BZIMAGE")"
    if ! extract_vmlinux "$BZIMAGE" "$KERNEL"; then
        log "could not extract vmlinux; booting the compressed bzImage (slower)"
        KERNEL=$BZIMAGE
    fi
fi

# --------------------------------------------------------------- modules --
# Wanted (by module name); their dependencies are resolved from each
# module's .modinfo "depends=" (the package ships no modules.dep: depmod
# runs at install time). vfio_iommu_type1 is only a soft dependency of vfio,
# hence listed explicitly.
WANT_MODULES="vfio vfio_iommu_type1 vfio_virqfd irqbypass vfio_pci_core vfio_pci nvme_core nvme"

declare -A MODFILE=()
while IFS= read -r f; do
    n=${f##*/}
    n=${n%%.ko*}
    MODFILE[${n//-/_}]=$f
done < <(find "$MODROOT/kernel" -name '*.ko' -o -name '*.ko.xz' -o -name '*.ko.zst' -o -name '*.ko.gz')

mod_cat() {
    case $1 in
        *.ko.xz) xz -dc "$1" ;;
        *.ko.zst) zstd -dcq "$1" ;;
        *.ko.gz) gzip -dc "$1" ;;
        *) cat "$1" ;;
    esac
}
is_builtin() {
    grep -qE "/${1//_/[-_]}\.ko\$" "$MODROOT/modules.builtin" 2>/dev/null
}

declare -A SEEN=()
ORDER=()
BUILTIN=()
visit() {
    local m=${1//-/_} deps d info pre
    [ -n "${SEEN[$m]:-}" ] && return 0
    SEEN[$m]=1
    if [ -z "${MODFILE[$m]:-}" ]; then
        if is_builtin "$m"; then
            BUILTIN+=("$m")
            return 0
        fi
        log "module $m: neither a module nor built in to $KVER"
        exit 1
    fi
    info=$(mod_cat "${MODFILE[$m]}" | tr '\0' '\n' | grep -a -E '^(depends|softdep)=' || true)
    deps=$(echo "$info" | sed -n 's/^depends=//p' | head -n 1)
    for d in ${deps//,/ }; do
        visit "$d"
    done
    # "softdep=pre: a b post: c": load the pre ones first where they are
    # modules (some are crypto aliases, e.g. crct10dif: skipped, the
    # module then uses its built-in fallback).
    pre=$(echo "$info" | sed -n 's/^softdep=//p' | sed -n 's/.*pre:\(.*\)/\1/p' | sed 's/post:.*//')
    for d in $pre; do
        if [ -n "${MODFILE[${d//-/_}]:-}" ]; then
            visit "$d"
        fi
    done
    ORDER+=("$m")
}
for m in $WANT_MODULES; do
    visit "$m"
done
log "kernel $KVER; modules in load order: ${ORDER[*]}${BUILTIN:+; built in: ${BUILTIN[*]}}"

# ------------------------------------------------------------ binaries ----
# Statically linked so that they run in a guest with no libc; the explicit
# --target keeps proc-macros (built for the host) dynamic. A separate
# --target-dir: no wait on the lock of an outer cargo build/test.
CARGO_OUT="$VM/cargo/x86_64-unknown-linux-gnu/release"
PKGS=(-p tutti-bench -p tuttid)
HAVE_PROBE=0
if [ "${TUTTI_VM_WITHOUT_PROBE:-0}" = 1 ]; then
    log "TUTTI_VM_WITHOUT_PROBE=1: the guest has no tutti-probe (its steps fail with rc=127)"
elif [ -f "$ROOT/tools/tutti-probe/Cargo.toml" ]; then
    PKGS+=(-p tutti-probe)
    HAVE_PROBE=1
else
    log "tools/tutti-probe does not exist (TUTTI_VM_WITHOUT_PROBE=1 builds the guest without it)"
    exit 1
fi
if [ "${TUTTI_VM_NO_CARGO:-0}" != 1 ]; then
    command -v cargo >/dev/null 2>&1 || skip "cargo not found"
    log "cargo build (static) ${PKGS[*]}"
    # Run from the workspace root; do not inherit an outer cargo's
    # target settings or build flags. No debug info (the workspace's
    # release profile has debug = 1): it would be stripped from the guest's
    # copies anyway, and it slows the build.
    (cd "$ROOT" &&
        env -u CARGO_TARGET_DIR -u CARGO_BUILD_TARGET -u CARGO_BUILD_TARGET_DIR \
            -u CARGO_ENCODED_RUSTFLAGS -u CARGO_BUILD_RUSTFLAGS \
            RUSTFLAGS="-C target-feature=+crt-static" CARGO_PROFILE_RELEASE_DEBUG=0 \
            cargo build --release --locked --target x86_64-unknown-linux-gnu \
            --target-dir "$VM/cargo" "${PKGS[@]}" >&2)
fi
BINS=(tutti-bench tuttid)
[ "$HAVE_PROBE" = 1 ] && BINS+=(tutti-probe)
for b in "${BINS[@]}"; do
    [ -x "$CARGO_OUT/$b" ] || { log "missing $CARGO_OUT/$b"; exit 1; }
    if is_dynamic "$CARGO_OUT/$b"; then
        log "$b is dynamically linked; it would not run in the guest"
        exit 1
    fi
done

# ------------------------------------------------------------ initramfs ---
IR="$VM/initramfs"
rm -rf "$IR"
mkdir -p "$IR"/{bin,sbin,usr/bin,usr/sbin,proc,sys,dev,tmp,run,mnt,vm/modules,lib/modules}
cp "$BUSYBOX" "$IR/bin/busybox"
for applet in $("$BUSYBOX" --list-full); do
    [ "$applet" = bin/busybox ] && continue
    mkdir -p "$IR/$(dirname "$applet")"
    ln -sf /bin/busybox "$IR/$applet"
done
: >"$IR/vm/modules/order"
for m in "${ORDER[@]}"; do
    mod_cat "${MODFILE[$m]}" >"$IR/vm/modules/$m.ko"
    echo "$m" >>"$IR/vm/modules/order"
done
for b in "${BINS[@]}"; do
    # Without debug info (release builds carry it): a smaller initramfs;
    # symbols stay for backtraces.
    if command -v objcopy >/dev/null 2>&1; then
        objcopy --strip-debug "$CARGO_OUT/$b" "$IR/usr/bin/$b"
    else
        cp "$CARGO_OUT/$b" "$IR/usr/bin/$b"
    fi
done
install -m 0755 "$HERE/init" "$IR/init"
install -m 0755 "${TUTTI_VM_GUEST_SCRIPT:-$HERE/guest-test.sh}" "$IR/vm/guest-test.sh"
install -m 0644 "$HERE/replay.yaml" "$IR/vm/replay.yaml"
install -m 0644 "$HERE/tuttid.yaml" "$IR/vm/tuttid.yaml"
echo "$KVER" >"$IR/vm/kernel-version"

INITRD="$VM/initramfs.cpio.gz"
(cd "$IR" && find . -print0 | LC_ALL=C sort -z |
    cpio --null -o -H newc --owner=0:0 --quiet) | gzip -1 >"$INITRD.tmp"
mv "$INITRD.tmp" "$INITRD"
log "initramfs: $INITRD ($(du -h "$INITRD" | cut -f1))"

echo "KERNEL=$KERNEL"
echo "INITRD=$INITRD"
echo "KVER=$KVER"
echo "HAVE_PROBE=$HAVE_PROBE"
