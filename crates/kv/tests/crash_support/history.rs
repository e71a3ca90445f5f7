//! What happened to each key before the power failed, and the check of
//! what the reopened store holds against it.

use std::collections::HashMap;

use super::{len_of, SLOT};
use crate::common::fill;

/// What happened to one key, in the order of the one thread that owns it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// A put of this version: acknowledged (`true`) or not (in flight at
    /// the crash, failed, or refused).
    Put(u64, bool),
    /// A remove; `true` once a `sync` the owner issued after it returned
    /// `Ok`.
    Remove(bool),
}

/// Per key, its events.
pub type History = HashMap<u64, Vec<Event>>;

/// Counts of one scenario's points.
#[derive(Debug, Default, Clone)]
pub struct Tally {
    /// Points run.
    pub points: u64,
    /// Points whose power failed while the workload ran (not at its end).
    pub crashed_in_workload: u64,
    /// Gets (during the workload or after the restart) that returned bytes
    /// that are not exactly one version put for their key.
    pub wrong_bytes: u64,
    /// Keys whose acknowledged put was missing (or older) after the
    /// restart, with no remove or eviction after it.
    pub acked_lost: u64,
    /// Keys removed, synced, and back after the restart.
    pub removes_undone: u64,
    /// Puts acknowledged in the workloads.
    pub puts_acked: u64,
    /// Commit rounds the stores ran (fewer than acknowledged puts: rounds
    /// were shared).
    pub commit_rounds: u64,
    /// Objects evicted.
    pub evictions: u64,
}

impl Tally {
    /// Violations of the store's promises: wrong bytes, acknowledged puts
    /// lost, synced removes undone.
    pub fn violations(&self) -> (u64, u64, u64) {
        (self.wrong_bytes, self.acked_lost, self.removes_undone)
    }
}

/// Whether the first `len` bytes of `got` are exactly the payload of one
/// version of key `k` (every word of [`fill`] names both). Payloads
/// shorter than a word cannot name their version and pass; the check
/// after the restart covers them.
pub fn is_a_version_of(got: &[u8], k: u64, len: u64) -> bool {
    if len < 8 {
        return true;
    }
    if len > SLOT || got.len() < len as usize {
        return false;
    }
    let w0 = u64::from_le_bytes(got[..8].try_into().expect("8 bytes"));
    let v = (w0 >> 20) & 0xF_FFFF;
    let mut want = vec![0u8; SLOT as usize];
    fill(&mut want, k, v);
    len_of(k, v) == len && got[..len as usize] == want[..len as usize]
}

/// The version of `candidates` whose bytes `got` holds (key `k`, `len`
/// bytes), if one does.
pub fn version_of(got: &[u8], k: u64, len: u64, candidates: &[u64]) -> Option<u64> {
    candidates.iter().copied().find(|&v| {
        if len_of(k, v) != len {
            return false;
        }
        let mut want = vec![0u8; SLOT as usize];
        fill(&mut want, k, v);
        got[..len as usize] == want[..len as usize]
    })
}

/// What the restarted store returned for a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Found {
    /// A verified hit of this version.
    Version(u64),
    /// No object.
    Absent,
    /// Bytes of no version put for the key, or a status that is neither a
    /// hit nor a miss.
    Wrong,
}

/// Checks key `k` after the restart: `found` is what the store returned,
/// `events` its history, `live_at_end` whether the old store's index held
/// it when its workload stopped (a key an eviction took out is allowed to
/// be absent). Counts violations in `t` and says why on stderr.
pub fn check_key(k: u64, found: Found, events: &[Event], live_at_end: bool, t: &mut Tally) {
    let found = match found {
        Found::Wrong => {
            t.wrong_bytes += 1;
            eprintln!("key {k}: wrong bytes or status after the restart ({events:?})");
            return;
        }
        Found::Version(v) => Some(v),
        Found::Absent => None,
    };
    // The last event that must be durable: an acknowledged put, or a
    // remove a completed sync followed.
    let Some(i) = events.iter().rposition(|e| matches!(e, Event::Put(_, true) | Event::Remove(true))) else {
        return;
    };
    let later_puts: Vec<u64> =
        events[i..].iter().filter_map(|e| if let Event::Put(v, _) = e { Some(*v) } else { None }).collect();
    let removed_later = events[i + 1..].iter().any(|e| matches!(e, Event::Remove(_)));
    match (events[i], found) {
        (Event::Put(..), Some(v)) if later_puts.contains(&v) => {}
        (Event::Put(..), None) if removed_later || !live_at_end => {}
        (Event::Put(v, _), _) => {
            t.acked_lost += 1;
            eprintln!("key {k}: acknowledged put of version {v} lost, found {found:?} ({events:?})");
        }
        (Event::Remove(_), None) => {}
        (Event::Remove(_), Some(v)) if later_puts.contains(&v) => {}
        (Event::Remove(_), Some(v)) => {
            t.removes_undone += 1;
            eprintln!("key {k}: removed and synced, but version {v} is back ({events:?})");
        }
    }
}
