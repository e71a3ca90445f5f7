//! The crash harness's parts (`tests/crash.rs` has the model and the
//! scenarios): a seeded generator, the drives and their power, one
//! workload thread, and what happened to each key.

#![allow(dead_code)]

pub mod history;
pub mod worker;

use std::sync::atomic::{AtomicBool, Ordering};

use tutti::Runtime;

/// Object (slot) size of the harness's stores, bytes.
pub const SLOT: u64 = 16 << 10;

/// A tiny deterministic generator (SplitMix64), so each point replays
/// from its seed (up to the interleaving of its threads).
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator for `seed`.
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// The next 64 random bits.
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `0..n`.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Payload length of (key, version), bytes: 1 byte to a whole slot, often
/// not a multiple of the block size.
pub fn len_of(k: u64, v: u64) -> u64 {
    1 + (k * 7919 + v * 104_729) % SLOT
}

/// The power of a point's drives: cut once, by whichever thread sees the
/// first failure (or by the workload's end), on every drive at once.
pub struct Power<'a> {
    rt: &'a Runtime,
    off: AtomicBool,
}

impl<'a> Power<'a> {
    /// The power of `rt`'s drives, on.
    pub fn new(rt: &'a Runtime) -> Self {
        Self { rt, off: AtomicBool::new(false) }
    }

    /// Cuts every drive's power (those a fault rule cut already stay off);
    /// only the first call acts.
    pub fn cut(&self) {
        if !self.off.swap(true, Ordering::SeqCst) {
            power_off(self.rt);
        }
    }

    /// `true` once [`Power::cut`] ran: the workload threads stop.
    pub fn is_off(&self) -> bool {
        self.off.load(Ordering::SeqCst)
    }
}

/// Every drive of `rt` loses power now.
pub fn power_off(rt: &Runtime) {
    for d in rt.drive_names() {
        rt.emulator(&d).expect("an emulated drive").power_fail();
    }
}
