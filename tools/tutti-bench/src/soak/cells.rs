//! The sweep: which cells `gpu-soak` runs, in full and in `--short` mode.
//!
//! Not a cross product. Each value of each dimension appears at least
//! once, and the risky combinations get cells of their own: big batches
//! with several batches in flight on rings of a few entries, 4 MiB objects
//! cut into 16 KiB stripe units, odd lengths, puts of new keys in flight
//! while gets of old ones run, a GPU-executed store beside a CPU-executed
//! one, and injected faults (a media error on one object's LBA, a failed
//! write command, a read completing past the wait's deadline).

use serde::Serialize;

/// KiB, bytes.
const K: u64 = 1 << 10;
/// MiB, bytes.
const M: u64 = 1 << 20;

/// What a cell's batches do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mix {
    /// Puts of new keys (then every key read back and checked).
    Put,
    /// Gets of keys put before the timed part.
    Get,
    /// Each round, one put batch of new keys in flight together with the
    /// get batches of old keys (then the new keys read back and checked).
    Mixed,
}

/// A fault injected into one drive of the store (the emulator's
/// [`nvme_emu::FaultRule`]s, the same as a drive's YAML `faults:`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Fault {
    /// Reads of one object's first logical block fail with a media error
    /// (SCT 2h, SC 81h Unrecovered Read Error): exactly that object's get
    /// is a device error, every other a verified hit; with the rule
    /// removed, the object reads back whole.
    ReadError,
    /// One payload write command (the k-th on the store's first drive)
    /// fails with a media error (SCT 2h, SC 80h Write Fault): exactly one
    /// put is a device error and its key absent, every other put durable.
    WriteError,
    /// The read of one object's first logical block completes past the
    /// wait's deadline: that get alone times out (CPU-executed) and the
    /// wait returns by its deadline; once the late command has completed,
    /// the same gets complete normally.
    ReadDelay,
}

/// One cell of the sweep. Sizes in bytes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Cell {
    /// What the batches do.
    pub mix: Mix,
    /// Objects per batch (1 to 1,024).
    pub batch: usize,
    /// Batches issued before the first is waited on (1 to 4).
    pub inflight: usize,
    /// Rounds of `inflight` batches.
    pub rounds: usize,
    /// Object (slab slot) size, bytes: 4 KiB to 4 MiB.
    pub object: u64,
    /// Lengths of three objects in four are shorter than the slot and
    /// not multiples of 8 (nor of the 4096-byte logical block).
    pub odd: bool,
    /// Emulated drives per store (1: `local_nvme`, 2 to 4:
    /// `striped_local_nvme`).
    pub drives: usize,
    /// Stripe unit, bytes (unused for one drive).
    pub stripe_unit: u64,
    /// I/O queues per drive (1 to 4).
    pub queues: u16,
    /// Entries per I/O queue (`queue_depth`, 2 to 1,024).
    pub queue_depth: u32,
    /// Two stores in one runtime driven at once: one executed as the run
    /// asks (`--execution`), one always CPU-executed.
    pub pair: bool,
    /// An injected fault, if any.
    pub fault: Option<Fault>,
    /// `mixed`: the round's puts are waited on before its gets are issued
    /// (`--one-in-flight`), instead of both in flight together.
    pub serial: bool,
}

impl Cell {
    /// The same cell with one batch in flight and as many more rounds, so
    /// that the same objects move (`gpu-soak --one-in-flight`).
    pub fn one_in_flight(self) -> Self {
        Self { rounds: self.rounds * self.inflight, inflight: 1, serial: true, ..self }
    }

    /// The cell's name, made of its parameters:
    /// `[fault-KIND-]MIX-bBATCHxINFLIGHT-SIZE[-odd]-dDRIVES[sUNIT]-qQUEUESxDEPTH[-pair]`.
    pub fn name(&self) -> String {
        let what = match self.fault {
            Some(Fault::ReadError) => "fault-read-error".to_owned(),
            Some(Fault::WriteError) => "fault-write-error".to_owned(),
            Some(Fault::ReadDelay) => "fault-read-delay".to_owned(),
            None => format!("{:?}", self.mix).to_lowercase(),
        };
        let unit = if self.drives > 1 { format!("s{}", size_name(self.stripe_unit)) } else { String::new() };
        format!(
            "{what}-b{}x{}-{}{}-d{}{unit}-q{}x{}{}",
            self.batch,
            self.inflight,
            size_name(self.object),
            if self.odd { "-odd" } else { "" },
            self.drives,
            self.queues,
            self.queue_depth,
            if self.pair { "-pair" } else { "" },
        )
    }

    /// Length of object `key` (keys are numbered from 0 in each store),
    /// bytes: the slot size, or with `odd` for three keys in four a
    /// shorter length that is not a multiple of 8.
    pub fn len_of(&self, key: u64) -> u64 {
        if !self.odd {
            return self.object;
        }
        let step = (self.object / 4 - 1).min(4099);
        self.object - (key % 4) * step
    }

    /// A human-readable account of the parameters, for the cell's line.
    pub fn describe(&self) -> String {
        let what = match self.fault {
            Some(Fault::ReadError) => "read error fault".to_owned(),
            Some(Fault::WriteError) => "write error fault".to_owned(),
            Some(Fault::ReadDelay) => "read delay fault".to_owned(),
            None => format!("{:?}", self.mix).to_lowercase(),
        };
        let layout = if self.drives == 1 {
            "1 drive".to_owned()
        } else {
            format!("{} drives, stripe {}", self.drives, size_name(self.stripe_unit))
        };
        format!(
            "{what}, batch {} x{} in flight x{} rounds, {}{}, {layout}, {} queues x {} entries{}",
            self.batch,
            self.inflight,
            self.rounds,
            size_name(self.object),
            if self.odd { " odd lengths" } else { "" },
            self.queues,
            self.queue_depth,
            if self.pair { ", pair" } else { "" },
        )
    }
}

/// `4k`, `64k`, `1m`, `4m`: a size in the unit that divides it.
pub fn size_name(bytes: u64) -> String {
    if bytes >= M && bytes.is_multiple_of(M) {
        format!("{}m", bytes / M)
    } else if bytes.is_multiple_of(K) {
        format!("{}k", bytes / K)
    } else {
        format!("{bytes}b")
    }
}

/// A cell from its parameters in name order (mix, batch x in flight,
/// rounds, object, odd, drives, stripe unit, queues x depth).
#[allow(clippy::too_many_arguments)]
const fn c(
    mix: Mix,
    batch: usize,
    inflight: usize,
    rounds: usize,
    object: u64,
    odd: bool,
    drives: usize,
    stripe_unit: u64,
    queues: u16,
    queue_depth: u32,
) -> Cell {
    Cell {
        mix,
        batch,
        inflight,
        rounds,
        object,
        odd,
        drives,
        stripe_unit,
        queues,
        queue_depth,
        pair: false,
        fault: None,
        serial: false,
    }
}

/// `cell` as a pair of stores in one runtime.
fn pair(cell: Cell) -> Cell {
    Cell { pair: true, ..cell }
}

/// `cell` with an injected fault (its mix is the fault's own flow).
fn fault(f: Fault, cell: Cell) -> Cell {
    Cell { fault: Some(f), ..cell }
}

/// The full sweep (under 5 minutes on an H200 with `--execution gpu`).
pub fn full() -> Vec<Cell> {
    use Mix::{Get, Mixed, Put};
    let (t, f) = (true, false);
    vec![
        // Single objects and the smallest rings.
        c(Get, 1, 1, 16, 4 * K, t, 1, 0, 1, 2),
        c(Put, 1, 4, 8, 64 * K, f, 1, 0, 1, 2),
        c(Get, 1, 4, 16, M, f, 4, 16 * K, 4, 4),
        c(Put, 1, 1, 16, 4 * M, t, 4, 128 * K, 1, 2),
        c(Mixed, 1, 2, 16, 4 * K, f, 2, 128 * K, 3, 1024),
        // Small batches.
        c(Get, 8, 1, 8, 64 * K, t, 2, 16 * K, 1, 4),
        c(Mixed, 8, 4, 4, M, f, 4, 128 * K, 2, 16),
        c(Put, 8, 2, 4, 4 * M, f, 2, 128 * K, 2, 16),
        c(Get, 8, 3, 4, 4 * M, t, 1, 0, 1, 1024),
        // The serving engine's restore shapes (1 MiB, 4 drives, 2 x 256).
        c(Put, 63, 1, 2, M, t, 4, 128 * K, 2, 256),
        c(Get, 63, 2, 2, M, f, 4, 128 * K, 2, 256),
        c(Get, 127, 1, 2, M, t, 4, 128 * K, 2, 256),
        c(Get, 127, 2, 2, M, f, 4, 128 * K, 2, 256),
        c(Get, 256, 2, 1, M, f, 4, 128 * K, 2, 256),
        // 4 MiB objects: 32 commands of 128 KiB (MDTS) each.
        c(Get, 63, 4, 1, 4 * M, t, 4, 128 * K, 4, 64),
        c(Mixed, 63, 1, 4, 4 * M, t, 3, 128 * K, 1, 256),
        c(Get, 256, 1, 1, 4 * M, f, 4, 128 * K, 2, 1024),
        // 1 MiB objects over 16 KiB stripe units: 64 commands per object.
        c(Put, 127, 2, 2, M, f, 2, 16 * K, 1, 64),
        // Big batches x several in flight x small rings.
        c(Get, 1024, 1, 2, 4 * K, t, 1, 0, 1, 2),
        c(Get, 1024, 4, 1, 4 * K, f, 2, 16 * K, 1, 4),
        c(Put, 1024, 4, 1, 4 * K, t, 4, 16 * K, 1, 2),
        c(Mixed, 1024, 2, 2, 64 * K, t, 4, 128 * K, 4, 64),
        c(Put, 1024, 1, 1, 64 * K, f, 4, 16 * K, 2, 256),
        c(Mixed, 127, 3, 2, 4 * K, t, 2, 16 * K, 2, 2),
        c(Get, 127, 4, 2, 64 * K, f, 4, 16 * K, 4, 1024),
        c(Get, 256, 4, 2, 64 * K, f, 3, 16 * K, 3, 16),
        c(Put, 256, 3, 2, 64 * K, t, 3, 128 * K, 4, 4),
        c(Mixed, 256, 4, 1, 4 * K, f, 1, 0, 4, 16),
        // Two stores in one runtime, driven at once.
        pair(c(Mixed, 63, 2, 2, 64 * K, t, 2, 16 * K, 2, 64)),
        pair(c(Get, 256, 4, 1, 4 * K, f, 1, 0, 1, 4)),
        pair(c(Put, 8, 1, 4, M, f, 2, 128 * K, 2, 16)),
        pair(c(Mixed, 1024, 2, 1, 4 * K, t, 2, 128 * K, 2, 16)),
        pair(c(Get, 127, 3, 1, M, t, 1, 0, 2, 256)),
        // Injected faults.
        fault(Fault::ReadError, c(Get, 8, 2, 1, 64 * K, f, 1, 0, 1, 16)),
        fault(Fault::ReadError, c(Get, 63, 2, 1, M, t, 4, 128 * K, 2, 256)),
        fault(Fault::ReadError, c(Get, 1024, 1, 1, 4 * K, f, 1, 0, 1, 2)),
        fault(Fault::WriteError, c(Put, 8, 1, 1, 64 * K, t, 1, 0, 1, 16)),
        fault(Fault::WriteError, c(Put, 127, 1, 1, 4 * K, f, 2, 16 * K, 2, 4)),
        fault(Fault::ReadDelay, c(Get, 8, 2, 1, 64 * K, f, 1, 0, 1, 16)),
        fault(Fault::ReadDelay, c(Get, 63, 2, 1, M, f, 4, 128 * K, 2, 256)),
        fault(Fault::ReadDelay, c(Get, 256, 1, 1, 4 * K, t, 2, 16 * K, 1, 4)),
    ]
}

/// The short sweep: a dozen small cells (for compute-sanitizer, which
/// runs 10 to 50 times slower, and for CI on CPU).
pub fn short() -> Vec<Cell> {
    use Mix::{Get, Mixed, Put};
    let (t, f) = (true, false);
    vec![
        c(Get, 1, 1, 4, 4 * K, t, 1, 0, 1, 2),
        c(Put, 8, 2, 2, 64 * K, t, 2, 16 * K, 1, 4),
        c(Mixed, 63, 2, 1, 4 * K, f, 4, 16 * K, 2, 4),
        c(Get, 256, 4, 1, 4 * K, t, 2, 16 * K, 2, 4),
        c(Get, 8, 1, 1, M, t, 4, 128 * K, 2, 16),
        c(Put, 4, 1, 1, 4 * M, t, 2, 128 * K, 1, 64),
        c(Get, 1024, 1, 1, 4 * K, f, 2, 16 * K, 4, 1024),
        c(Get, 127, 3, 1, 4 * K, f, 3, 16 * K, 3, 2),
        pair(c(Mixed, 16, 2, 1, 64 * K, t, 2, 16 * K, 2, 16)),
        fault(Fault::ReadError, c(Get, 8, 2, 1, 64 * K, f, 1, 0, 1, 16)),
        fault(Fault::WriteError, c(Put, 8, 1, 1, 64 * K, t, 1, 0, 1, 16)),
        fault(Fault::ReadDelay, c(Get, 8, 2, 1, 64 * K, f, 1, 0, 1, 16)),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    fn check(cells: &[Cell]) {
        let names: HashSet<String> = cells.iter().map(Cell::name).collect();
        assert_eq!(names.len(), cells.len(), "cell names are unique");
        for c in cells {
            assert!((1..=1024).contains(&c.batch), "{}", c.name());
            assert!((1..=4).contains(&c.inflight), "{}", c.name());
            assert!((1..=4).contains(&c.drives), "{}", c.name());
            assert!((1..=4).contains(&c.queues), "{}", c.name());
            assert!((2..=1024).contains(&c.queue_depth), "{}", c.name());
            assert!(c.rounds >= 1);
            for k in 0..8 {
                let l = c.len_of(k);
                assert!(l > 0 && l <= c.object, "{}: key {k} length {l}", c.name());
            }
        }
    }

    #[test]
    fn both_sweeps_are_valid_and_every_value_is_covered() {
        check(&full());
        check(&short());
        let f = full();
        for b in [1, 8, 63, 127, 256, 1024] {
            assert!(f.iter().any(|c| c.batch == b), "batch {b}");
        }
        for o in [4 * K, 64 * K, M, 4 * M] {
            assert!(f.iter().any(|c| c.object == o), "object {o}");
        }
        for q in [2, 4, 16, 64, 256, 1024] {
            assert!(f.iter().any(|c| c.queue_depth == q), "depth {q}");
        }
        for n in 1..=4 {
            assert!(f.iter().any(|c| c.inflight == n), "in flight {n}");
            assert!(f.iter().any(|c| c.drives == n), "drives {n}");
            assert!(f.iter().any(|c| c.queues == n as u16), "queues {n}");
        }
        for fl in [Fault::ReadError, Fault::WriteError, Fault::ReadDelay] {
            assert!(f.iter().any(|c| c.fault == Some(fl)));
            assert!(short().iter().any(|c| c.fault == Some(fl)));
        }
        assert!(f.iter().any(|c| c.pair) && short().iter().any(|c| c.pair));
    }

    #[test]
    fn odd_lengths_are_not_block_or_word_multiples() {
        let c = c(Mix::Get, 1, 1, 1, 4 * K, true, 1, 0, 1, 2);
        assert_eq!(c.len_of(0), 4096);
        for k in 1..4 {
            assert_ne!(c.len_of(k) % 8, 0, "key {k}: {}", c.len_of(k));
        }
        assert_eq!(c.name(), "get-b1x1-4k-odd-d1-q1x2");
    }
}
