//! `tutti-probe conformance <addr> --lba-range A..B --yes`: runs the
//! driver conformance checks (`nvme-conformance`, the same ones `cargo
//! test` runs against the emulator) on a controller bound to vfio-pci.
//! DESTROYS the data in the range.
//!
//! A stop request (SIGINT/SIGTERM) is honoured between checks: the check
//! running finishes and deletes its queues, the rest are skipped except the
//! controller shutdown (CC.SHN), and the report is printed as usual.

use std::sync::Arc;
use std::time::Duration;

use nvm_queue::NvmeDevice;
use nvme_conformance::{Options, Outcome as Check, MIN_SCRATCH_BYTES};
use nvme_pci::{PciAddr, VfioNvme};

use crate::selftest::LbaRange;
use crate::{Ctx, Failure, Outcome};

/// Arguments of `conformance`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// PCI address of a function bound to vfio-pci.
    addr: PciAddr,
    /// Scratch logical blocks the checks may overwrite, START..END (end
    /// exclusive; at least 4 MiB). Required.
    #[arg(long, value_name = "START..END")]
    lba_range: Option<LbaRange>,
    /// Confirm that the data in the range may be destroyed. Required.
    #[arg(long)]
    yes: bool,
    /// Namespace of the scratch range.
    #[arg(long, default_value_t = 1)]
    nsid: u32,
    /// I/O queue pairs to ask for (the checks use what is granted), 1 or more.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u16).range(1..))]
    queues: u16,
    /// Bound on each wait for a completion, seconds (1 or more).
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..))]
    timeout_s: u64,
    /// Print the report as JSON instead of text.
    #[arg(long)]
    json: bool,
}

/// Runs the checks; exit status 1 if any failed.
pub fn run(ctx: &Ctx, a: Args) -> Outcome {
    let (Some(range), true) = (a.lba_range, a.yes) else {
        return Err(Failure::Usage(format!(
            "conformance writes to the drive: give the scratch blocks with --lba-range START..END (at least \
             {} MiB) and confirm with --yes",
            MIN_SCRATCH_BYTES >> 20
        )));
    };
    // A no-IOMMU open logs its warning (stderr) from nvme-pci.
    let dev: Arc<dyn NvmeDevice> = Arc::new(VfioNvme::open(&a.addr, &ctx.open)?);
    let mut opts = Options::new(a.nsid, range.start..range.end);
    opts.ask_queues = a.queues;
    opts.timeout = Duration::from_secs(a.timeout_s);
    opts.stop = Some(ctx.stop.flag());
    let report = nvme_conformance::run(dev, &opts);
    if a.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        println!("{report}");
    }
    if let (true, Some(signal)) = (report.interrupted, ctx.stop.requested()) {
        let shutdown = match report.outcome("shutdown") {
            Some(Check::Pass(_)) => "OK".to_owned(),
            Some(Check::Fail(why)) => format!("FAILED: {why}"),
            Some(Check::Skip(why)) => format!("not done ({why})"),
            None => "not done".to_owned(),
        };
        let detail = format!(
            "conformance {}: {} passed, {} failed before the stop, the rest skipped; controller shutdown (CC.SHN): \
             {shutdown}",
            a.addr,
            report.passed(),
            report.failed()
        );
        Err(Failure::Interrupted { signal, detail })
    } else if let Some(why) = &report.options_error {
        // The caller's range or namespace does not fit: not the drive's fault.
        Err(Failure::Usage(format!("{}: {why}", a.addr)))
    } else if report.is_ok() {
        Ok(())
    } else {
        Err(Failure::Reported(format!("{}: {} conformance check(s) failed", a.addr, report.failed())))
    }
}
