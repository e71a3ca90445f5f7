//! SIGINT and SIGTERM: the first one asks the destructive subcommands
//! (`selftest`, `conformance`) to stop, the second ends the process at once.
//!
//! The handlers (signal-hook's flag API) only store to atomics. The
//! subcommands check [`Stop::requested`] between commands (conformance:
//! between checks, through [`Stop::flag`]): they finish the command in
//! flight, delete their I/O queues, shut the controller down (CC.SHN) and
//! fail with [`crate::Failure::Interrupted`], which `main` prints as one line
//! and turns into exit status 128 + the signal number (130, 143).

pub use tutti_signals::{Signal, Stop};
