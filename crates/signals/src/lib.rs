//! SIGINT and SIGTERM for tutti's tools: the first one asks the run to
//! stop, the second ends the process at once. Also the tools' stderr
//! logging ([`init_logging`]), so each tool starts the same way:
//! [`Stop::install`], then [`init_logging`].
//!
//! The handlers (signal-hook's flag API) only store to atomics. A tool
//! checks [`Stop::requested`] between batches or commands (library code
//! takes the plain flag, [`Stop::flag`]): it issues nothing new, lets what
//! is in flight finish (bounded), shuts its queues and controllers down in
//! order, prints one line and exits with [`Signal::exit_code`] (128 + the
//! signal number: 130, 143). The libraries the tools drive know nothing of
//! signals.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use signal_hook::consts::{SIGINT, SIGTERM};

mod logging;

pub use logging::{init_logging, init_logging_from};

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
#[derive(Debug, Clone, Default)]
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
        let stop = Stop::default();
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

    /// The signal that asked to stop, if one did.
    pub fn requested(&self) -> Option<Signal> {
        if !self.flag.load(Ordering::SeqCst) {
            return None;
        }
        match self.signal.load(Ordering::SeqCst) {
            n if n == SIGTERM as usize => Some(Signal::Term),
            _ => Some(Signal::Int),
        }
    }

    /// The flag itself, for library code that takes a plain stop flag
    /// (`nvme_conformance::Options::stop`).
    pub fn flag(&self) -> Arc<AtomicBool> {
        self.flag.clone()
    }
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
    fn a_stop_not_yet_requested_reads_none() {
        let stop = Stop::default();
        assert_eq!(stop.requested(), None);
        stop.signal.store(SIGTERM as usize, Ordering::SeqCst);
        stop.flag().store(true, Ordering::SeqCst);
        assert_eq!(stop.requested(), Some(Signal::Term));
    }
}
