//! `tuttid`: the one process that owns the drives. It brings their
//! controllers up, keeps their admin queues, and grants I/O queue pairs
//! (rings in shared memory, one doorbell page each) to client processes
//! that connect to its Unix socket, checked by their peer credentials
//! against each drive's allow list and quota. A client's connection is its
//! lease: when it closes or goes silent, its SQs are deleted, then its CQs,
//! and only then is its memory unmapped. docs/tuttid.md has the details.
//!
//! ```text
//! tuttid serve --config tuttid.yaml
//! tuttid status --socket /run/tutti.sock
//! ```

//!
//! The library holds the daemon (its binary, `main.rs`, parses the command
//! line), so that a fuzz target can run a server in-process
//! (`tests/fuzz_bodies.rs`, `tuttid_session`).

mod accounts;
pub mod attack;
pub mod config;
mod drive;
mod error;
mod forward;
mod mediate;
pub mod server;
mod session;
pub mod verify;

pub use config::DaemonConfig;
pub use error::DaemonError;
pub use server::{bind, Server};
