//! The watchdog: each cell runs on a worker thread while the main thread
//! watches its waits. A wait that runs past its limit plus the hang bound
//! (or a cell that runs past the cell limit) makes the cell HUNG; the
//! worker then gets a grace period to return, and if it does not, the run
//! cannot go on (its runtime still holds the drives and perhaps the GPU).

use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::cells::Cell;
use super::error::CellError;
use super::run::{panic_text, run_cell};
use super::verify::Tally;
use super::watch::Watch;
use super::Settings;

/// How often the main thread looks at the worker.
const POLL: Duration = Duration::from_millis(10);

/// How a cell's worker ended.
#[derive(Debug)]
pub enum Outcome {
    /// It returned its tally within its limits.
    Done(Tally),
    /// A wait (or the cell) ran past its limit; `returned` is what the
    /// worker returned within the grace period, `None` if it did not.
    Hung {
        /// What ran past its limit, in words.
        why: String,
        /// The worker's result, if it returned during the grace period.
        returned: Option<Tally>,
    },
}

/// Runs `cell` on a worker thread under the watchdog; its outcome and how
/// long it took.
pub fn supervise(cell: &Cell, s: &Settings) -> (Outcome, Duration) {
    let start = Instant::now();
    let watch = Arc::new(Watch::default());
    let (c, st, w) = (cell.clone(), s.clone(), watch.clone());
    let spawned = std::thread::Builder::new().name("soak-cell".into()).spawn(move || run_cell(&c, &st, &w));
    let handle = match spawned {
        Ok(h) => h,
        Err(e) => {
            let mut t = Tally::default();
            t.fail(tutti::error_chain(&CellError::Spawn(e)));
            return (Outcome::Done(t), start.elapsed());
        }
    };
    let why = loop {
        if handle.is_finished() {
            return (Outcome::Done(join(handle)), start.elapsed());
        }
        if let Some(why) = watch.overdue(s.hang) {
            break why;
        }
        if start.elapsed() > s.cell_limit {
            break format!(
                "the cell has run {} s (limit {} s)",
                start.elapsed().as_secs(),
                s.cell_limit.as_secs()
            );
        }
        std::thread::sleep(POLL);
    };
    let hung_at = Instant::now();
    while hung_at.elapsed() < s.grace {
        if handle.is_finished() {
            return (Outcome::Hung { why, returned: Some(join(handle)) }, start.elapsed());
        }
        std::thread::sleep(POLL);
    }
    // The worker is left running: the caller exits the process.
    (Outcome::Hung { why, returned: None }, start.elapsed())
}

/// The worker's tally; a panic is a problem in it.
fn join(h: JoinHandle<Tally>) -> Tally {
    h.join().unwrap_or_else(|p| {
        let mut t = Tally::default();
        t.fail(tutti::error_chain(&CellError::Panicked(panic_text(&p))));
        t
    })
}
