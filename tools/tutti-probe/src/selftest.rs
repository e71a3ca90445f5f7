//! `tutti-probe selftest <addr> --lba-range A..B --yes`: writes a seeded
//! pattern to a scratch LBA range through one of tutti's I/O queue pairs,
//! reads it back and compares. DESTROYS the data in the range.
//!
//! A stop request (SIGINT/SIGTERM) is honoured between commands: the write
//! or read in flight completes, the chunk it belongs to is compared, then
//! the queue is deleted and the controller shut down as on success.

use std::str::FromStr;
use std::time::{Duration, Instant};

use nvm_queue::{plan_io, Controller, DataRef, DmaBuffer, IoOp, NamespaceInfo, QueuePair};
use nvme_pci::PciAddr;

use crate::interrupt::{Signal, Stop};
use crate::util::{bring_up, context};
use crate::{Ctx, Failure, Outcome};

/// Bound on one command, from submission to completion.
pub const COMMAND_TIMEOUT: Duration = Duration::from_secs(30);

/// Largest transfer per command used by the self-test, bytes.
pub const MAX_CHUNK: usize = 1 << 20;

/// A half-open range of logical blocks `start..end`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LbaRange {
    /// First LBA.
    pub start: u64,
    /// One past the last LBA.
    pub end: u64,
}

impl FromStr for LbaRange {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let (a, b) =
            s.split_once("..").ok_or_else(|| format!("{s:?}: expected START..END (end exclusive)"))?;
        let num = |t: &str| -> Result<u64, String> {
            let t = t.trim();
            match t.strip_prefix("0x") {
                Some(h) => u64::from_str_radix(h, 16),
                None => t.parse(),
            }
            .map_err(|_| format!("{t:?} is not a block number"))
        };
        let (start, end) = (num(a)?, num(b)?);
        if end <= start {
            return Err(format!("{s:?}: the range is empty (end is exclusive)"));
        }
        Ok(Self { start, end })
    }
}

/// Arguments of `selftest`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// PCI address of a function bound to vfio-pci.
    addr: PciAddr,
    /// Logical blocks to overwrite, START..END (end exclusive). Required.
    #[arg(long, value_name = "START..END")]
    lba_range: Option<LbaRange>,
    /// Confirm that the data in the range may be destroyed. Required.
    #[arg(long)]
    yes: bool,
    /// Namespace (default: the first active one tutti can use, i.e.
    /// formatted without metadata).
    #[arg(long)]
    nsid: Option<u32>,
    /// Seed of the data pattern.
    #[arg(long, default_value_t = 0x7475_7474_6900_0001)]
    seed: u64,
}

/// The pattern of logical block `lba`: its LBA and the seed in the first
/// 16 bytes, then xorshift64* output seeded from both, so every block of
/// every run differs.
pub fn fill_block(buf: &mut [u8], lba: u64, seed: u64) {
    buf[..8].copy_from_slice(&lba.to_le_bytes());
    buf[8..16].copy_from_slice(&seed.to_le_bytes());
    let mut x = (seed ^ lba.wrapping_mul(0x9E37_79B9_7F4A_7C15)) | 1;
    for c in buf[16..].chunks_mut(8) {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        let v = x.wrapping_mul(0x2545_F491_4F6C_DD1D).to_le_bytes();
        c.copy_from_slice(&v[..c.len()]);
    }
}

/// Runs `selftest`.
pub fn run(ctx: &Ctx, args: Args) -> Outcome {
    let Some(range) = args.lba_range else {
        return Err(Failure::Usage(
            "selftest overwrites data: give the scratch range with --lba-range START..END and confirm with --yes"
                .into(),
        ));
    };
    if !args.yes {
        return Err(Failure::Usage(format!(
            "selftest destroys the data in LBAs {}..{} of {}: add --yes to confirm",
            range.start, range.end, args.addr
        )));
    }
    let mut ctrl = bring_up(ctx, &args.addr, 1)?;
    let ns = match pick_namespace(&ctrl, args.nsid, &args.addr.to_string()) {
        Ok(ns) => ns,
        Err(e) => {
            let _ = ctrl.shutdown();
            return Err(e);
        }
    };
    if range.end > ns.blocks {
        let _ = ctrl.shutdown();
        return Err(Failure::Usage(format!(
            "--lba-range {}..{} is past the end of namespace {} ({} blocks of {} bytes)",
            range.start, range.end, ns.nsid, ns.blocks, ns.block_size
        )));
    }
    let mut qp = match ctrl.create_io_queue_pair(1, 64, 16) {
        Ok(q) => q,
        Err(e) => {
            let _ = ctrl.shutdown();
            return Err(context("creating I/O queue pair 1 failed", e));
        }
    };
    let result = exercise(&ctrl, &mut qp, &ns, range, args.seed, &ctx.stop);
    // Delete the queues and shut down before the queue memory goes away.
    let shut = ctrl.shutdown();
    if shut.is_err() {
        // The controller may still own the queue: disable it (Controller's
        // drop clears CC.EN) before the queue memory can go.
        drop(ctrl);
    }
    drop(qp);
    let Exercised { blocks, secs, interrupted } = result?;
    if let Some(signal) = interrupted {
        let how = shut.map_or_else(|e| format!("FAILED: {e}"), |()| "OK".to_owned());
        let detail = format!(
            "selftest {}: namespace {}, LBAs {}..{} ({blocks} blocks) written, read back and compared before the \
             stop; I/O queue 1 deleted and controller shut down (CC.SHN): {how}",
            args.addr,
            ns.nsid,
            range.start,
            range.start + blocks
        );
        return Err(Failure::Interrupted { signal, detail });
    }
    let bytes = blocks * u64::from(ns.block_size);
    let mbps = (2 * bytes) as f64 / 1e6 / secs.max(1e-9);
    println!(
        "selftest {}: namespace {}, LBAs {}..{}: {blocks} blocks ({bytes} bytes) written, read back and compared: OK",
        args.addr, ns.nsid, range.start, range.end
    );
    println!("throughput: {mbps:.1} MB/s (write + read, queue depth 1, {secs:.3} s)");
    shut.map_err(|e| context("controller shutdown (CC.SHN) failed", e))
}

/// The namespace to test: `nsid` if given, else the first one tutti can
/// use. A namespace not active or formatted with metadata is a usage error
/// (exit 2) whose message says why and what to do; a controller without
/// any active namespace is a failure (exit 1).
pub fn pick_namespace(ctrl: &Controller, nsid: Option<u32>, addr: &str) -> Result<NamespaceInfo, Failure> {
    if let Some(n) = nsid {
        return ctrl.usable_namespace(n).map_err(|e| Failure::Usage(format!("{addr}: {e}")));
    }
    if let Some(ns) = ctrl.namespaces().first() {
        return Ok(*ns);
    }
    // None usable: every active namespace has a reason.
    let reasons: Vec<String> =
        ctrl.active_namespaces().iter().filter_map(|n| n.usable().err()).map(|e| e.to_string()).collect();
    Err(match reasons.as_slice() {
        [] => Failure::Reported(format!("{addr}: the controller has no active namespace")),
        [one] => Failure::Usage(format!("{addr}: {one}")),
        [first, ..] => Failure::Usage(format!(
            "{addr}: none of its {} active namespaces can be used (`tutti-probe identify {addr}` says why for \
             each); the first: {first}",
            reasons.len()
        )),
    })
}

/// What [`exercise`] did.
struct Exercised {
    /// Blocks written, read back and compared, from the range's start.
    blocks: u64,
    /// Seconds it took.
    secs: f64,
    /// The signal whose stop request ended it before the range's end.
    interrupted: Option<Signal>,
}

/// Writes, reads back and compares `range`, chunk by chunk, until its end
/// or until `stop` is requested (checked before each chunk).
fn exercise(
    ctrl: &Controller,
    qp: &mut QueuePair,
    ns: &NamespaceInfo,
    range: LbaRange,
    seed: u64,
    stop: &Stop,
) -> Result<Exercised, Failure> {
    let bs = ns.block_size as usize;
    let chunk = (ctrl.max_transfer().min(MAX_CHUNK) / bs).max(1) * bs;
    let dev = ctrl.device();
    let wbuf = DmaBuffer::new(dev, chunk).map_err(|e| context("allocating DMA memory", e))?;
    let rbuf = DmaBuffer::new(dev, chunk).map_err(|e| context("allocating DMA memory", e))?;
    let mut expect = vec![0u8; chunk];
    let mut got = vec![0u8; chunk];
    let t0 = Instant::now();
    let mut lba = range.start;
    while lba < range.end {
        if let Some(signal) = stop.requested() {
            let secs = t0.elapsed().as_secs_f64();
            return Ok(Exercised { blocks: lba - range.start, secs, interrupted: Some(signal) });
        }
        let blocks = ((range.end - lba) as usize).min(chunk / bs);
        let len = blocks * bs;
        for (i, b) in expect[..len].chunks_mut(bs).enumerate() {
            fill_block(b, lba + i as u64, seed);
        }
        wbuf.write_bytes(0, &expect[..len]).map_err(|e| context("filling DMA memory", e))?;
        rbuf.fill(0xA5);
        let mut failed = None;
        for (op, buf) in [(IoOp::Write, &wbuf), (IoOp::Read, &rbuf)] {
            if let Err(e) = command(ctrl, qp, ns, op, lba, len, buf) {
                failed = Some(e);
                break;
            }
        }
        if let Some((e, timed_out)) = failed {
            if timed_out {
                // The controller may still read or write these buffers
                // until it is reset: never free them.
                wbuf.leak_until_reset();
                rbuf.leak_until_reset();
            }
            return Err(e);
        }
        rbuf.read_bytes(0, &mut got[..len]).map_err(|e| context("reading DMA memory", e))?;
        if got[..len] != expect[..len] {
            let off = got[..len].iter().zip(&expect[..len]).position(|(a, b)| a != b).unwrap_or(0);
            return Err(Failure::Reported(format!(
                "MISMATCH at LBA {} (byte {} of the block): wrote {:#04x}, read {:#04x}",
                lba + (off / bs) as u64,
                off % bs,
                expect[off],
                got[off]
            )));
        }
        lba += blocks as u64;
    }
    Ok(Exercised { blocks: range.end - range.start, secs: t0.elapsed().as_secs_f64(), interrupted: None })
}

/// Runs one I/O command of `len` bytes at `lba` on `buf` and waits for it.
/// The error's flag is `true` when the command may still be in flight.
fn command(
    ctrl: &Controller,
    qp: &mut QueuePair,
    ns: &NamespaceInfo,
    op: IoOp,
    lba: u64,
    len: usize,
    buf: &DmaBuffer,
) -> Result<(), (Failure, bool)> {
    let r = command_inner(ctrl, qp, ns, op, lba, len, buf);
    r.map_err(|e| {
        let in_flight =
            matches!(&e, Failure::Reported(m) if m.contains("timed out") || m.contains("CSTS.CFS"));
        (e, in_flight)
    })
}

fn command_inner(
    ctrl: &Controller,
    qp: &mut QueuePair,
    ns: &NamespaceInfo,
    op: IoOp,
    lba: u64,
    len: usize,
    buf: &DmaBuffer,
) -> Result<(), Failure> {
    let bs = u64::from(ns.block_size);
    let mut plan =
        plan_io(ns, lba * bs, len as u64, ctrl.max_transfer()).map_err(|e| context("planning I/O", e))?;
    let chunk = plan.next().ok_or_else(|| Failure::Reported("empty I/O plan".into()))?;
    debug_assert!(plan.next().is_none());
    let data = DataRef { mapping: buf.mapping(), offset: 0, len };
    let cid = qp.submit(op.sqe(ns.nsid, &chunk), Some(data), 0).map_err(|e| context("submitting", e))?;
    qp.ring();
    let deadline = Instant::now() + COMMAND_TIMEOUT;
    let mut done = None;
    loop {
        qp.poll(|c| {
            if c.cid == cid {
                done = Some(c);
            }
        });
        if let Some(c) = done {
            if !c.status.is_success() {
                return Err(Failure::Reported(format!(
                    "{op:?} of LBAs {lba}..{} failed with NVMe status {} (SCT {:#x}, SC {:#04x})",
                    lba + len as u64 / bs,
                    c.status,
                    c.status.sct,
                    c.status.sc
                )));
            }
            return Ok(());
        }
        if ctrl.csts().map(|c| c.cfs()).unwrap_or(true) {
            return Err(Failure::Reported(format!(
                "{op:?} of LBA {lba}: the controller reports a fatal status (CSTS.CFS) or is gone"
            )));
        }
        if Instant::now() >= deadline {
            // The command may still complete and write `buf`: keep it mapped.
            return Err(Failure::Reported(format!(
                "{op:?} of LBA {lba} timed out after {COMMAND_TIMEOUT:?}; {}",
                qp.dump()
            )));
        }
        std::thread::sleep(Duration::from_micros(10));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges() {
        assert_eq!("0..8".parse::<LbaRange>(), Ok(LbaRange { start: 0, end: 8 }));
        assert_eq!("0x10..0x20".parse::<LbaRange>(), Ok(LbaRange { start: 16, end: 32 }));
        assert!("8..8".parse::<LbaRange>().is_err());
        assert!("9..8".parse::<LbaRange>().is_err());
        assert!("8".parse::<LbaRange>().is_err());
    }

    /// An emulated controller brought up by the driver.
    fn controller(namespaces: Vec<nvme_emu::NamespaceSpec>) -> Controller {
        let emu = nvme_emu::Emulator::start(nvme_emu::EmulatorConfig::new("probe", namespaces)).unwrap();
        Controller::init(emu, nvm_queue::ControllerOptions::default()).unwrap()
    }

    fn usage(r: Result<NamespaceInfo, Failure>) -> String {
        match r {
            Err(Failure::Usage(m)) => m,
            other => panic!("expected a usage error (exit 2), got {other:?}"),
        }
    }

    #[test]
    fn a_namespace_with_metadata_is_refused_as_a_usage_error_that_says_why() {
        use nvme_emu::NamespaceSpec;
        let mut ctrl = controller(vec![
            NamespaceSpec::new(2048, 512).with_metadata(8, true),
            NamespaceSpec::new(1024, 4096),
        ]);
        let a = "0000:00:10.0";
        assert_eq!(
            usage(pick_namespace(&ctrl, Some(1), a)),
            "0000:00:10.0: namespace 1 is formatted with 8 bytes of metadata per block (extended LBA, LBAF 1); \
             tutti supports only formats without metadata: reformat with `nvme format /dev/nvmeX -n 1 \
             --lbaf=0` (512-byte blocks, no metadata; erases the namespace) or pick another namespace"
        );
        assert_eq!(
            usage(pick_namespace(&ctrl, Some(7), a)),
            "0000:00:10.0: namespace 7 is not active (active: [1, 2])"
        );
        // Named or by default, the namespace without metadata is taken.
        assert_eq!(pick_namespace(&ctrl, Some(2), a).unwrap().nsid, 2);
        assert_eq!(pick_namespace(&ctrl, None, a).unwrap().nsid, 2);
        ctrl.shutdown().unwrap();
    }

    #[test]
    fn no_usable_namespace_at_all_says_why() {
        use nvme_emu::NamespaceSpec;
        let mut ctrl = controller(vec![NamespaceSpec::new(64, 4096).with_metadata(8, false)]);
        let m = usage(pick_namespace(&ctrl, None, "x"));
        assert!(
            m.starts_with(
                "x: namespace 1 is formatted with 8 bytes of metadata per block (separate buffer, LBAF 1)"
            ),
            "{m}"
        );
        ctrl.shutdown().unwrap();
        let mut ctrl = controller(vec![
            NamespaceSpec::new(64, 4096).with_metadata(8, false),
            NamespaceSpec::new(64, 512).with_metadata(16, true),
        ]);
        let m = usage(pick_namespace(&ctrl, None, "x"));
        assert!(m.starts_with("x: none of its 2 active namespaces can be used"), "{m}");
        assert!(m.contains("the first: namespace 1 is formatted with 8 bytes"), "{m}");
        ctrl.shutdown().unwrap();
    }

    #[test]
    fn blocks_differ() {
        let (mut a, mut b, mut c) = (vec![0u8; 512], vec![0u8; 512], vec![0u8; 512]);
        fill_block(&mut a, 1, 7);
        fill_block(&mut b, 2, 7);
        fill_block(&mut c, 1, 8);
        assert!(a != b && a != c && b != c);
        let mut a2 = vec![0u8; 512];
        fill_block(&mut a2, 1, 7);
        assert_eq!(a, a2);
    }
}
