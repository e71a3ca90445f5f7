//! `run`: where and when a `--json` document was made.

use std::sync::OnceLock;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

/// The commit tutti-bench was built from (see build.rs), or "unknown".
pub const GIT_COMMIT: &str = env!("TUTTI_BENCH_GIT_COMMIT");

/// Where and when a run happened; the `run` object of every document.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunInfo {
    /// The command line, program name first, as given.
    pub command_line: Vec<String>,
    /// tutti-bench's version (the workspace's).
    pub tutti_version: String,
    /// The git commit tutti-bench was built from, or "unknown".
    pub git_commit: String,
    /// The machine's host name ("unknown" when it cannot be read).
    pub hostname: String,
    /// CPUs this process may run on.
    pub cpus: usize,
    /// When the run started, UTC, RFC 3339 (`2026-12-04T21:30:00Z`).
    pub started_utc: String,
    /// The same instant, seconds since the Unix epoch.
    pub started_unix_s: u64,
}

impl RunInfo {
    /// The facts of this process, taken now.
    pub fn collect() -> Self {
        let now = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
        Self {
            command_line: std::env::args().collect(),
            tutti_version: env!("CARGO_PKG_VERSION").to_string(),
            git_commit: GIT_COMMIT.to_string(),
            hostname: hostname(),
            cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
            started_utc: rfc3339_utc(now),
            started_unix_s: now,
        }
    }

    /// The facts taken at the first call in this process (call it when the
    /// run starts, so `started_utc` is the start).
    pub fn process() -> &'static RunInfo {
        static RUN: OnceLock<RunInfo> = OnceLock::new();
        RUN.get_or_init(RunInfo::collect)
    }
}

fn hostname() -> String {
    ["/proc/sys/kernel/hostname", "/etc/hostname"]
        .iter()
        .find_map(|p| std::fs::read_to_string(p).ok().map(|s| s.trim().to_string()).filter(|s| !s.is_empty()))
        .unwrap_or_else(|| "unknown".into())
}

/// `unix_s` as `YYYY-MM-DDTHH:MM:SSZ` (proleptic Gregorian, UTC).
pub fn rfc3339_utc(unix_s: u64) -> String {
    let (days, secs) = (unix_s / 86_400, unix_s % 86_400);
    let (y, m, d) = civil_from_days(days as i64);
    format!("{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z", secs / 3600, secs / 60 % 60, secs % 60)
}

/// Days since 1970-01-01 to (year, month, day): H. Hinnant's
/// `civil_from_days`.
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates() {
        assert_eq!(rfc3339_utc(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339_utc(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339_utc(1_796_420_445), "2026-12-04T21:40:45Z");
    }

    #[test]
    fn collect_fills_every_field() {
        let r = RunInfo::collect();
        assert!(!r.command_line.is_empty());
        assert!(r.cpus >= 1);
        assert!(!r.git_commit.is_empty() && !r.hostname.is_empty());
        assert_eq!(r.started_utc.len(), 20);
    }
}
