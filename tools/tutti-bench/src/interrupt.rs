//! SIGINT and SIGTERM: the first one asks the run to stop, the second ends
//! the process at once.
//!
//! The handlers (signal-hook's flag API) only store to atomics. The runs
//! check [`Stop::requested`] between batches: they stop issuing work, let
//! the batch in flight finish (each wait is bounded), shut the runtime down
//! in order ([`tutti::Runtime::shutdown`]: SQs, then CQs, then CC.SHN) and
//! end with [`Ended::Interrupted`], which `main` prints as one line and
//! turns into exit status 128 + the signal number (130, 143).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use signal_hook::consts::{SIGINT, SIGTERM};
use tutti::ShutdownReport;

/// A signal that stops a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signal {
    /// SIGINT (Ctrl-C).
    Int,
    /// SIGTERM.
    Term,
}

impl Signal {
    /// The signal's name, e.g. `SIGINT`.
    pub fn name(self) -> &'static str {
        match self {
            Signal::Int => "SIGINT",
            Signal::Term => "SIGTERM",
        }
    }

    /// The exit status of a run it stopped: 128 + the signal number.
    pub fn exit_code(self) -> u8 {
        match self {
            Signal::Int => 130,
            Signal::Term => 143,
        }
    }
}

/// The stop request set by the first SIGINT or SIGTERM.
#[derive(Debug, Clone)]
pub struct Stop {
    /// Set by the first signal; arms the immediate exit on the second.
    flag: Arc<AtomicBool>,
    /// The number of the last signal that arrived.
    signal: Arc<AtomicUsize>,
}

impl Stop {
    /// Installs the handlers. Call it before any work starts: a signal that
    /// arrives earlier still ends the process the default way.
    pub fn install() -> std::io::Result<Self> {
        let stop = Stop { flag: Arc::default(), signal: Arc::default() };
        for (sig, code) in [(SIGINT, Signal::Int.exit_code()), (SIGTERM, Signal::Term.exit_code())] {
            // Registration order is the order the actions run in: the exit
            // first (a no-op until the flag is set), then the number, then
            // the flag, so a reader that sees the flag sees the number.
            signal_hook::flag::register_conditional_shutdown(sig, i32::from(code), stop.flag.clone())?;
            signal_hook::flag::register_usize(sig, stop.signal.clone(), sig as usize)?;
            signal_hook::flag::register(sig, stop.flag.clone())?;
        }
        Ok(stop)
    }

    /// The signal that asked the run to stop, if one did.
    pub fn requested(&self) -> Option<Signal> {
        if !self.flag.load(Ordering::SeqCst) {
            return None;
        }
        match self.signal.load(Ordering::SeqCst) {
            n if n == SIGTERM as usize => Some(Signal::Term),
            _ => Some(Signal::Int),
        }
    }
}

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
    fn exit_codes_are_128_plus_the_signal() {
        assert_eq!(i32::from(Signal::Int.exit_code()), 128 + SIGINT);
        assert_eq!(i32::from(Signal::Term.exit_code()), 128 + SIGTERM);
    }

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
