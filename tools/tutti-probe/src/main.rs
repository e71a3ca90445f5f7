//! `tutti-probe`: the operator's tool for NVMe drives on a tutti host.
//!
//! Lists NVMe functions and what uses them, moves drives between the
//! kernel `nvme` driver and `vfio-pci` (the way SPDK's `setup.sh` does),
//! reports the host's VFIO/IOMMU state, identifies controllers through
//! tutti's own admin queue, and runs a write/read/compare self-test
//! through tutti's own I/O queues.
//!
//! Exit codes: 0 success, 1 failure, 2 usage error, 130 / 143 when SIGINT /
//! SIGTERM stopped `selftest` or `conformance` (they finish the command in
//! flight, delete their I/O queues and shut the controller down first; see
//! [`interrupt`]). A second signal exits at once.
//!
//! Adding a subcommand: one variant in [`Cmd`] and one `run` function in
//! its own module, dispatched in [`run`].

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use nvme_pci::{OpenOptions, Sysfs};

mod bind;
mod conformance;
mod identify;
mod interrupt;
mod list;
mod selftest;
mod status;
mod util;

/// List, bind, identify and self-test NVMe drives for tutti.
#[derive(Debug, Parser)]
#[command(
    name = "tutti-probe",
    version,
    about,
    long_about = None,
    after_help = "Exit status: 0 success, 1 failure, 2 usage error. SIGINT or SIGTERM stops selftest and \
                  conformance in order (the command in flight finishes, the I/O queues are deleted, the \
                  controller shut down with CC.SHN), exit status 130 (SIGINT) or 143 (SIGTERM); a second \
                  signal exits at once."
)]
struct Cli {
    /// Filesystem root for sys/, proc/ and dev/vfio (tests use a fake tree).
    #[arg(long, global = true, hide = true, value_name = "PATH")]
    sysfs_root: Option<PathBuf>,
    /// Accept drives on uio_pci_generic or VFIO no-IOMMU mode, where device
    /// DMA is NOT confined by an IOMMU (dangerous; see docs/real-drives.md).
    #[arg(long, global = true)]
    allow_no_iommu: bool,
    #[command(subcommand)]
    cmd: Cmd,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
enum Cmd {
    /// Table of NVMe functions: address, model, serial, firmware,
    /// namespaces, driver, NUMA node, IOMMU group, what uses them.
    List(list::Args),
    /// Bind drives to vfio-pci (refuses drives in use unless --force).
    Bind(bind::BindArgs),
    /// Give drives back to the kernel nvme driver.
    Unbind(bind::UnbindArgs),
    /// Host VFIO/IOMMU state and each function's driver and group access.
    Status(status::Args),
    /// Controller and namespace facts through tutti's own admin queue.
    Identify(identify::Args),
    /// Write, read back and compare an LBA range (DESTROYS its data).
    Selftest(selftest::Args),
    /// Run the driver conformance checks on a scratch LBA range (DESTROYS
    /// its data).
    Conformance(conformance::Args),
}

/// What every subcommand gets.
#[derive(Debug)]
pub struct Ctx {
    /// The sysfs/procfs view.
    pub sysfs: Sysfs,
    /// Options for opening devices.
    pub open: OpenOptions,
    /// Set by the first SIGINT or SIGTERM.
    pub stop: interrupt::Stop,
}

/// A subcommand's failure.
#[derive(Debug)]
pub enum Failure {
    /// Bad invocation (exit 2).
    Usage(String),
    /// The operation failed (exit 1); printed with its cause chain.
    Error(Box<dyn std::error::Error + Send + Sync>),
    /// The operation failed (exit 1); already explained in the output.
    Reported(String),
    /// A signal stopped the operation after an orderly shutdown (exit 130
    /// or 143); `detail` says how far it got and how the shutdown went.
    Interrupted {
        /// The signal.
        signal: interrupt::Signal,
        /// Progress and shutdown, for the one line `main` prints.
        detail: String,
    },
}

impl<E: std::error::Error + Send + Sync + 'static> From<E> for Failure {
    fn from(e: E) -> Self {
        Failure::Error(Box::new(e))
    }
}

/// A subcommand's result.
pub type Outcome = Result<(), Failure>;

fn run(cli: Cli, stop: interrupt::Stop) -> Outcome {
    let root = cli.sysfs_root.clone().unwrap_or_else(|| PathBuf::from("/"));
    let ctx = Ctx {
        sysfs: Sysfs::with_root(&root),
        open: OpenOptions { allow_no_iommu: cli.allow_no_iommu, root: cli.sysfs_root.clone() },
        stop,
    };
    match cli.cmd {
        Cmd::List(a) => list::run(&ctx, a),
        Cmd::Bind(a) => bind::run_bind(&ctx, a),
        Cmd::Unbind(a) => bind::run_unbind(&ctx, a),
        Cmd::Status(a) => status::run(&ctx, a),
        Cmd::Identify(a) => identify::run(&ctx, a),
        Cmd::Selftest(a) => selftest::run(&ctx, a),
        Cmd::Conformance(a) => conformance::run(&ctx, a),
    }
}

fn main() -> ExitCode {
    // Before anything else, so that no signal finds the default handler
    // once a drive is touched.
    let stop = match interrupt::Stop::install() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("tutti-probe: error: cannot install the SIGINT/SIGTERM handlers: {e}");
            return ExitCode::from(1);
        }
    };
    tutti_signals::init_logging();
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            // Help and version go to stdout with 0, usage errors exit 2.
            let code = if e.use_stderr() { 2 } else { 0 };
            let _ = e.print();
            return ExitCode::from(code);
        }
    };
    match run(cli, stop) {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure::Usage(msg)) => {
            eprintln!("tutti-probe: usage: {msg}");
            ExitCode::from(2)
        }
        Err(Failure::Error(e)) => {
            eprintln!("tutti-probe: error: {e}");
            let mut src = e.source();
            while let Some(s) = src {
                eprintln!("  caused by: {s}");
                src = s.source();
            }
            ExitCode::from(1)
        }
        Err(Failure::Reported(msg)) => {
            eprintln!("tutti-probe: {msg}");
            ExitCode::from(1)
        }
        Err(Failure::Interrupted { signal, detail }) => {
            eprintln!("tutti-probe: interrupted by {}: {detail}", signal.name());
            ExitCode::from(signal.exit_code())
        }
    }
}
