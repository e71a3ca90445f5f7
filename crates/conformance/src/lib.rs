//! Driver conformance checks that run against any [`NvmeDevice`].
//!
//! The same checks run in three places: against the software controller
//! (`nvme-emu`) in `cargo test`, against QEMU's NVMe controller through
//! vfio-pci inside the VM harness (`tests/vm`), and against a real drive
//! with `tutti-probe conformance`. They therefore use only what every
//! controller offers: registers, admin commands and I/O through the
//! project's own queues. Checks that need to look inside the controller
//! (doorbell values, fetch counts) stay in the emulator-only tests.
//!
//! **Destructive:** the checks write to the logical blocks of
//! [`Options::scratch`] on namespace [`Options::nsid`]. Nothing outside that
//! range is written; one check reads one block past the namespace's end to
//! see the controller refuse it.
//!
//! Each check brings its own queue pair (QID 1 unless it says otherwise),
//! and deletes it again whether it passes or fails, so one failing check
//! does not poison the next.

use std::cell::RefCell;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use nvm_queue::{Controller, ControllerOptions, NvmeDevice};

/// What to run the checks on.
#[derive(Debug, Clone)]
pub struct Options {
    /// Namespace to do I/O on (NSID, 1-based).
    pub nsid: u32,
    /// Scratch range in **logical blocks** of `nsid`, end exclusive. Its
    /// contents are destroyed. It must hold at least [`MIN_SCRATCH_BYTES`].
    pub scratch: Range<u64>,
    /// I/O queue pairs to ask for with Set Features (Number of Queues); the
    /// controller may grant fewer and the checks use what it grants.
    pub ask_queues: u16,
    /// Bound on every wait for a completion.
    pub timeout: Duration,
    /// Upper bound on one command's transfer in bytes, on top of MDTS
    /// (see [`ControllerOptions::max_transfer_cap`]).
    pub max_transfer_cap: usize,
    /// Stop request, checked before each check (a tool sets it from a
    /// signal handler). Once it is `true`, the checks left are skipped and
    /// the report marked [`Report::interrupted`], except `shutdown`, which
    /// still runs: every check deletes its queues before it returns, so the
    /// controller is left shut down (CC.SHN) with no I/O queue.
    pub stop: Option<Arc<AtomicBool>>,
}

impl Options {
    /// Defaults for namespace `nsid` with scratch blocks `scratch`: ask for
    /// 8 queue pairs, 10 s per wait, 1 MiB transfer cap.
    pub fn new(nsid: u32, scratch: Range<u64>) -> Self {
        Self {
            nsid,
            scratch,
            ask_queues: 8,
            timeout: Duration::from_secs(10),
            max_transfer_cap: 1 << 20,
            stop: None,
        }
    }
}

/// Smallest scratch range the checks need, in bytes (enough for the
/// MDTS-splitting check on a controller whose transfer limit is the 1 MiB
/// cap).
pub const MIN_SCRATCH_BYTES: u64 = 4 << 20;

mod checks;
mod ctx;
mod report;

use checks::{
    check_cq_head_doorbell, check_delete_recreate, check_identify, check_lba_out_of_range_in_batch,
    check_many_outstanding, check_mdts_split, check_phase_wrap, check_queue_grant, check_shutdown,
    check_slba_nlb,
};
use ctx::{chain, Ctx};
pub use report::{CheckResult, Outcome, Report};

/// The checks, in the order [`run`] runs them after bring-up.
pub const CHECKS: &[&str] = &[
    "bring_up",
    "identify",
    "queue_grant",
    "phase_wrap",
    "cq_head_doorbell",
    "slba_nlb",
    "mdts_split",
    "lba_out_of_range_in_batch",
    "many_outstanding",
    "delete_recreate",
    "shutdown",
];

type CheckFn = fn(&mut Ctx) -> Result<Outcome, String>;

/// Brings the controller up on `device` and runs every check of [`CHECKS`].
///
/// Never panics on what the device does: every failure is an
/// [`Outcome::Fail`] with the reason. If bring-up fails, the other checks
/// are reported as skipped.
pub fn run(device: Arc<dyn NvmeDevice>, opts: &Options) -> Report {
    let mut report = Report {
        device: device.name().to_owned(),
        results: Vec::new(),
        options_error: None,
        interrupted: false,
    };
    let copts = ControllerOptions {
        io_queues: opts.ask_queues.max(1),
        max_transfer_cap: opts.max_transfer_cap,
        ..ControllerOptions::default()
    };
    let ctrl = match Controller::init(device.clone(), copts) {
        Ok(c) => c,
        Err(e) => {
            report.results.push(CheckResult { name: "bring_up", outcome: Outcome::Fail(chain(&e)) });
            for name in &CHECKS[1..] {
                report.results.push(CheckResult { name, outcome: Outcome::Skip("bring-up failed".into()) });
            }
            return report;
        }
    };
    let cap = ctrl.cap();
    let info = ctrl.info().clone();
    report.results.push(CheckResult {
        name: "bring_up",
        outcome: Outcome::Pass(format!(
            "CSTS.RDY=1; VS {}.{}, CAP.MQES+1={} entries, CAP.DSTRD={}, CAP.TO={} ms, MDTS={} -> {} bytes per \
             command, {} of {} I/O queue pairs granted",
            info.ver >> 16,
            (info.ver >> 8) & 0xFF,
            cap.max_queue_entries(),
            cap.dstrd(),
            cap.timeout_ms(),
            info.mdts,
            ctrl.max_transfer(),
            ctrl.io_queues_granted(),
            opts.ask_queues.max(1),
        )),
    });
    let mut ctx = Ctx {
        ctrl,
        opts: opts.clone(),
        ns: None,
        options_error: None,
        broken: None,
        buffers: RefCell::default(),
    };
    let checks: [(&'static str, CheckFn); 10] = [
        ("identify", check_identify),
        ("queue_grant", check_queue_grant),
        ("phase_wrap", check_phase_wrap),
        ("cq_head_doorbell", check_cq_head_doorbell),
        ("slba_nlb", check_slba_nlb),
        ("mdts_split", check_mdts_split),
        ("lba_out_of_range_in_batch", check_lba_out_of_range_in_batch),
        ("many_outstanding", check_many_outstanding),
        ("delete_recreate", check_delete_recreate),
        ("shutdown", check_shutdown),
    ];
    for (name, f) in checks {
        // A stop request skips every check left but the shutdown.
        let stopping = name != "shutdown" && opts.stop.as_deref().is_some_and(|s| s.load(Ordering::SeqCst));
        report.interrupted |= stopping;
        let outcome = if let Some(why) = &ctx.broken {
            Outcome::Skip(format!("not run: {why}"))
        } else if stopping {
            Outcome::Skip("not run: interrupted".into())
        } else if name != "identify" && ctx.ns.is_none() && !(name == "shutdown" && report.interrupted) {
            Outcome::Skip("no usable namespace and scratch range (see identify)".into())
        } else {
            f(&mut ctx).unwrap_or_else(Outcome::Fail)
        };
        let buffers = std::mem::take(&mut *ctx.buffers.borrow_mut());
        if ctx.broken.is_some() {
            // A queue could not be deleted: its commands may still write
            // these, so they stay allocated and mapped for good.
            buffers.into_iter().for_each(std::mem::forget);
        }
        report.results.push(CheckResult { name, outcome });
    }
    report.options_error = ctx.options_error;
    report
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::ctx::block_pattern;
    #[test]
    fn pattern_names_its_block_and_word() {
        let p = block_pattern(7, 512, 0);
        assert_eq!(p.len(), 512);
        assert_eq!(u64::from_le_bytes(p[8..16].try_into().unwrap()), 7 << 20 | 1);
        assert_ne!(block_pattern(7, 512, 1), p);
        assert_ne!(block_pattern(8, 512, 0), p);
    }

    #[test]
    fn report_counts_and_prints_a_summary_line() {
        let r = Report {
            device: "emu:x".into(),
            results: vec![
                CheckResult { name: "a", outcome: Outcome::Pass("ok".into()) },
                CheckResult { name: "b", outcome: Outcome::Fail("bad".into()) },
                CheckResult { name: "c", outcome: Outcome::Skip("n/a".into()) },
            ],
            options_error: None,
            interrupted: false,
        };
        assert_eq!((r.passed(), r.failed(), r.skipped(), r.is_ok()), (1, 1, 1, false));
        let text = r.to_string();
        assert!(text.contains("FAIL  b: bad"));
        assert!(text.ends_with("conformance emu:x: 1 passed, 1 failed, 1 skipped"));
    }
}
