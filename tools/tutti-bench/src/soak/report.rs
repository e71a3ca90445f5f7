//! What `gpu-soak` prints: one line per cell (parameters, outcome, item
//! counts, wrong bytes, worst wait overrun, elapsed time), the one-line
//! summary (`^gpu-soak:`), and the optional JSON file.

use std::time::Duration;

use serde::Serialize;

use super::cells::Cell;
use super::supervise::Outcome;
use super::verify::Tally;

/// A cell's verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    /// Every item as it had to be, every byte right, every wait in bound.
    Ok,
    /// Something else (the reason says what).
    Fail,
    /// A wait did not return within its deadline plus the hang bound.
    Hang,
}

/// One cell's result.
#[derive(Debug, Clone, Serialize)]
pub struct CellResult {
    /// The cell's name.
    pub name: String,
    /// Its parameters.
    pub cell: Cell,
    /// Who executed each lane's commands (`gpu`, `cpu`, `gpu+cpu`, ...).
    pub execution: String,
    /// Its verdict.
    pub verdict: Verdict,
    /// Why, when not ok.
    pub reason: Option<String>,
    /// Items waited on.
    pub items: u64,
    /// Items that succeeded as they had to.
    pub good: u64,
    /// Items that failed as the injected fault made them.
    pub injected: u64,
    /// Items with any other status.
    pub bad: u64,
    /// Bytes that differed.
    pub wrong_bytes: u64,
    /// Furthest a wait returned past its deadline (waits that must honour
    /// it), milliseconds.
    pub worst_overrun_ms: f64,
    /// Furthest a GPU-executed wait returned past its deadline where the
    /// wait ends with its kernel by design (docs/gpu.md "Limits"),
    /// milliseconds.
    pub kernel_bound_ms: f64,
    /// Wall time of the cell, seconds.
    pub elapsed_s: f64,
}

impl CellResult {
    /// The result of `cell` from its worker's outcome.
    pub fn new(cell: &Cell, execution: String, outcome: &Outcome, elapsed: Duration) -> Self {
        let (verdict, reason, t) = match outcome {
            Outcome::Done(t) if t.clean() => (Verdict::Ok, None, t.clone()),
            Outcome::Done(t) => (Verdict::Fail, Some(problems(t)), t.clone()),
            Outcome::Hung { why, returned: Some(t) } => {
                (Verdict::Hang, Some(format!("{why}; then {}", problems(t))), t.clone())
            }
            Outcome::Hung { why, returned: None } => {
                (Verdict::Hang, Some(format!("{why}; its worker never returned")), Tally::default())
            }
        };
        Self {
            name: cell.name(),
            cell: cell.clone(),
            execution,
            verdict,
            reason,
            items: t.items,
            good: t.good,
            injected: t.injected,
            bad: t.bad,
            wrong_bytes: t.wrong_bytes,
            worst_overrun_ms: ms(t.worst_overrun),
            kernel_bound_ms: ms(t.kernel_bound),
            elapsed_s: elapsed.as_secs_f64(),
        }
    }

    /// The cell's one line (`i` of `n`).
    pub fn line(&self, i: usize, n: usize) -> String {
        let outcome = match (&self.verdict, &self.reason) {
            (Verdict::Ok, _) => "ok".to_owned(),
            (Verdict::Fail, r) => format!("FAIL ({})", r.as_deref().unwrap_or("?")),
            (Verdict::Hang, r) => format!("HANG ({})", r.as_deref().unwrap_or("?")),
        };
        let kernel = if self.kernel_bound_ms > 0.0 {
            format!(
                " (GPU waits ended with their kernel up to {:.0} ms past the deadline)",
                self.kernel_bound_ms
            )
        } else {
            String::new()
        };
        format!(
            "cell {}/{n} {}: {outcome} | {}, {} | items {} good {} injected {} bad {} | wrong bytes {} | overrun {:.0} ms{kernel} | {:.2} s",
            i + 1,
            self.name,
            self.cell.describe(),
            self.execution,
            self.items,
            self.good,
            self.injected,
            self.bad,
            self.wrong_bytes,
            self.worst_overrun_ms,
            self.elapsed_s,
        )
    }
}

/// Milliseconds of `d`.
fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// A tally's problems in words, with the counts.
fn problems(t: &Tally) -> String {
    let mut s = format!("{} bad items, {} wrong bytes, {} other problems", t.bad, t.wrong_bytes, t.other);
    for p in &t.problems {
        s.push_str("; ");
        s.push_str(p);
    }
    s
}

/// The whole run.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    /// Cells run.
    pub cells: usize,
    /// Cells ok.
    pub ok: usize,
    /// Cells failed.
    pub failed: usize,
    /// Cells hung.
    pub hung: usize,
    /// Furthest any wait that must honour its deadline returned past it,
    /// milliseconds.
    pub worst_overrun_ms: f64,
    /// Wall time, seconds.
    pub elapsed_s: f64,
    /// `--execution`.
    pub execution: String,
    /// `full` or `short`.
    pub mode: String,
}

impl Summary {
    /// The summary of `results`.
    pub fn of(results: &[CellResult], elapsed: Duration, execution: &str, mode: &str) -> Self {
        let count = |v| results.iter().filter(|r| r.verdict == v).count();
        Self {
            cells: results.len(),
            ok: count(Verdict::Ok),
            failed: count(Verdict::Fail),
            hung: count(Verdict::Hang),
            worst_overrun_ms: results.iter().map(|r| r.worst_overrun_ms).fold(0.0, f64::max),
            elapsed_s: elapsed.as_secs_f64(),
            execution: execution.to_owned(),
            mode: mode.to_owned(),
        }
    }

    /// The one summary line.
    pub fn line(&self) -> String {
        format!(
            "gpu-soak: {} cells, {} ok, {} failed, {} hung, worst overrun {:.0} ms, {:.0} s (execution {}, {})",
            self.cells, self.ok, self.failed, self.hung, self.worst_overrun_ms, self.elapsed_s, self.execution, self.mode
        )
    }

    /// Whether the run passed.
    pub fn passed(&self) -> bool {
        self.failed == 0 && self.hung == 0
    }
}

/// The JSON file's document.
#[derive(Debug, Serialize)]
pub struct JsonReport<'a> {
    /// The summary.
    pub summary: &'a Summary,
    /// Every cell run, in order.
    pub cells: &'a [CellResult],
}
