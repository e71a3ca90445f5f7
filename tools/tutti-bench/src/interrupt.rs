//! SIGINT and SIGTERM: the first one asks the run to stop, the second ends
//! the process at once.
//!
//! The handlers (signal-hook's flag API) only store to atomics. The runs
//! check [`Stop::requested`] between batches: they stop issuing work, let
//! the batch in flight finish (each wait is bounded), shut the runtime down
//! in order ([`tutti::Runtime::shutdown`]: SQs, then CQs, then CC.SHN) and
//! end with [`Ended::Interrupted`], which `main` prints as one line and
//! turns into exit status 128 + the signal number (130, 143).

use tutti::ShutdownReport;
pub use tutti_signals::{Signal, Stop};

/// How a run ended.
#[must_use]
#[derive(Debug)]
pub enum Ended {
    /// It did all its work.
    Complete,
    /// A signal stopped it early; `detail` says how far it got and how the
    /// shutdown went.
    Interrupted {
        /// The signal.
        signal: Signal,
        /// Progress and shutdown, for the one line `main` prints.
        detail: String,
    },
}

/// One line on what [`tutti::Runtime::shutdown`] found: what was still in
/// flight, and each drive's queue deletion and CC.SHN result.
pub fn shutdown_summary(r: &ShutdownReport) -> String {
    let mut s = format!(
        "shutdown: {} operations and {} commands in flight, {} commands reaped at queue deletion, {} lost",
        r.ops_in_flight, r.commands_in_flight, r.commands_reaped_at_deletion, r.commands_lost
    );
    let ok: Vec<&str> = r.drives.iter().filter(|(_, res)| res.is_ok()).map(|(d, _)| d.as_str()).collect();
    for (drive, res) in &r.drives {
        if let Err(e) = res {
            s.push_str(&format!("; drive {drive} FAILED to shut down: {e}"));
        }
    }
    if !ok.is_empty() {
        s.push_str(&format!("; drives {} shut down OK (queues deleted, CC.SHN)", ok.join(", ")));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shutdown_summary_names_failed_and_clean_drives() {
        let r = ShutdownReport {
            commands_lost: 2,
            drives: vec![("d0".into(), Ok(())), ("d1".into(), Err("CSTS.SHST timeout".into()))],
            ..ShutdownReport::default()
        };
        let s = shutdown_summary(&r);
        assert!(s.contains("0 commands in flight"), "{s}");
        assert!(s.contains("2 lost"), "{s}");
        assert!(s.contains("drive d1 FAILED to shut down: CSTS.SHST timeout"), "{s}");
        assert!(s.contains("drives d0 shut down OK"), "{s}");
    }
}
