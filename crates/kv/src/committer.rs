//! The group-commit queue of a store (`commit.rs` runs its rounds): puts
//! whose payloads are written wait in it for a leader to commit them.

use std::collections::HashMap;
use std::sync::{Condvar, Mutex};

use crate::error::ItemStatus;
use crate::format::Record;

/// A put whose payload is written, waiting for its record: (slot, record
/// without its generation, which the round assigns).
pub(crate) type PendingPut = (u32, Record);

#[derive(Debug, Default)]
pub(crate) struct Queue {
    pub next_id: u64,
    pub waiting: Vec<(u64, Vec<PendingPut>)>,
    pub leading: bool,
    pub done: HashMap<u64, Result<(), ItemStatus>>,
}

/// The group-commit queue of a store.
#[derive(Debug, Default)]
pub(crate) struct Committer {
    pub q: Mutex<Queue>,
    pub cv: Condvar,
}
