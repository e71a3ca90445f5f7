//! The Mooncake JSONL trace format.
//!
//! One JSON object per line (the format of the Mooncake FAST'25 traces,
//! `kvcache-ai/Mooncake`, `FAST25-release/traces/*.jsonl`):
//!
//! ```text
//! {"timestamp": 27482, "input_length": 6955, "output_length": 52, "hash_ids": [46, 47, 48]}
//! ```
//!
//! - `timestamp`: arrival time in milliseconds since the first request;
//! - `input_length`, `output_length`: prompt and generated lengths in tokens;
//! - `hash_ids`: the prompt as a list of [`BLOCK_TOKENS`]-token KV blocks.
//!   Equal ids mean an identical prefix block.
//!
//! Unknown extra keys are ignored. Reading never panics: every malformed
//! line becomes a [`TraceError`] naming the file and the 1-based line.

use std::collections::HashSet;
use std::fs::File;
use std::io::{self, BufRead, BufReader};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// Tokens per KV block (one hash id) in the Mooncake traces.
pub const BLOCK_TOKENS: u32 = 512;

/// One request of a trace.
///
/// Serializes to (and deserializes from) the Mooncake key names
/// (`timestamp`, `input_length`, `output_length`, `hash_ids`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TraceRequest {
    /// Arrival time in milliseconds since the first request of the trace.
    #[serde(rename = "timestamp")]
    pub timestamp_ms: u64,
    /// Prompt length in tokens.
    pub input_length: u32,
    /// Generated length in tokens.
    pub output_length: u32,
    /// The prompt's KV blocks ([`BLOCK_TOKENS`] tokens each), in prompt order.
    pub hash_ids: Vec<u64>,
}

impl TraceRequest {
    /// Serializes the request as one Mooncake JSONL line (no trailing newline).
    pub fn to_json_line(&self) -> String {
        // Serializing a plain struct of integers cannot fail.
        serde_json::to_string(self).unwrap_or_default()
    }
}

/// A line that is not a valid trace request.
#[derive(Debug, thiserror::Error)]
#[error("invalid trace line")]
pub struct ParseLineError(
    #[from]
    #[source]
    serde_json::Error,
);

/// Errors from [`read_trace`].
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    /// The trace file could not be opened.
    #[error("cannot open trace {}", path.display())]
    Open {
        /// The trace file.
        path: PathBuf,
        /// The underlying I/O error.
        source: io::Error,
    },
    /// Reading the trace failed at a line.
    #[error("cannot read trace {} at line {line}", path.display())]
    Read {
        /// The trace file.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// The underlying I/O error.
        source: io::Error,
    },
    /// A line is not a valid trace request.
    #[error("{}:{line}", path.display())]
    Parse {
        /// The trace file.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// Why the line was rejected.
        source: ParseLineError,
    },
}

/// Parses one trace line (surrounding whitespace allowed; the line must hold
/// exactly one JSON object with the four Mooncake keys; other keys are ignored).
pub fn parse_trace_line(line: &str) -> Result<TraceRequest, ParseLineError> {
    parse_line_bytes(line.as_bytes())
}

fn parse_line_bytes(line: &[u8]) -> Result<TraceRequest, ParseLineError> {
    Ok(serde_json::from_slice(line.trim_ascii())?)
}

/// Reads a Mooncake JSONL trace, line by line.
///
/// Stops after `limit` requests when given (`Some(0)` reads nothing but still
/// opens the file). Blank lines (only whitespace) are skipped and do not
/// count. Lines are read as bytes, so invalid UTF-8 is a [`TraceError::Parse`]
/// for that line rather than an I/O error.
pub fn read_trace(path: &Path, limit: Option<usize>) -> Result<Vec<TraceRequest>, TraceError> {
    let file = File::open(path).map_err(|source| TraceError::Open { path: path.to_path_buf(), source })?;
    let mut reader = BufReader::with_capacity(1 << 16, file);
    let limit = limit.unwrap_or(usize::MAX);
    let mut out = Vec::new();
    let mut buf = Vec::new();
    let mut line_no = 0usize;
    while out.len() < limit {
        buf.clear();
        let n = reader.read_until(b'\n', &mut buf).map_err(|source| TraceError::Read {
            path: path.to_path_buf(),
            line: line_no + 1,
            source,
        })?;
        if n == 0 {
            break;
        }
        line_no += 1;
        if buf.trim_ascii().is_empty() {
            continue;
        }
        let req = parse_line_bytes(&buf).map_err(|source| TraceError::Parse {
            path: path.to_path_buf(),
            line: line_no,
            source,
        })?;
        out.push(req);
    }
    Ok(out)
}

/// Block-level statistics of a trace, assuming an unbounded cache.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize)]
pub struct TraceStats {
    /// Number of requests.
    pub requests: u64,
    /// Sum of `hash_ids.len()` over all requests (blocks).
    pub total_blocks: u64,
    /// Distinct hash ids (blocks that must be saved at least once).
    pub unique_blocks: u64,
    /// Blocks whose id was seen in an earlier request or earlier in the same
    /// request (`total_blocks - unique_blocks`).
    pub reused_blocks: u64,
    /// `reused_blocks / total_blocks` (0 when there are no blocks): the best
    /// hit ratio any cache can reach on this trace.
    pub ideal_hit_ratio: f64,
    /// Last timestamp minus first timestamp, in milliseconds.
    pub span_ms: u64,
}

impl TraceStats {
    /// Computes the statistics of `requests`.
    pub fn from_requests(requests: &[TraceRequest]) -> Self {
        let mut seen = HashSet::new();
        let mut total = 0u64;
        for r in requests {
            total += r.hash_ids.len() as u64;
            seen.extend(r.hash_ids.iter().copied());
        }
        let unique = seen.len() as u64;
        let reused = total - unique;
        let span_ms = match (
            requests.iter().map(|r| r.timestamp_ms).min(),
            requests.iter().map(|r| r.timestamp_ms).max(),
        ) {
            (Some(lo), Some(hi)) => hi - lo,
            _ => 0,
        };
        Self {
            requests: requests.len() as u64,
            total_blocks: total,
            unique_blocks: unique,
            reused_blocks: reused,
            ideal_hit_ratio: if total == 0 { 0.0 } else { reused as f64 / total as f64 },
            span_ms,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    /// The real trace: `<workspace>/../shared/traces/...`, i.e. three levels
    /// up from this package (`<workspace>/tools/tutti-bench`).
    const REAL_TRACE: &str =
        concat!(env!("CARGO_MANIFEST_DIR"), "/../../../shared/traces/mooncake_conversation_trace.jsonl");

    fn temp_file(name: &str, contents: &[u8]) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("tutti-bench-trace-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(name);
        let mut f = File::create(&path).unwrap();
        f.write_all(contents).unwrap();
        path
    }

    #[test]
    fn parses_example_line() {
        let r = parse_trace_line(
            r#"{"timestamp": 27482, "input_length": 6955, "output_length": 52, "hash_ids": [46, 47, 48]}"#,
        )
        .unwrap();
        assert_eq!(
            r,
            TraceRequest {
                timestamp_ms: 27482,
                input_length: 6955,
                output_length: 52,
                hash_ids: vec![46, 47, 48],
            }
        );
        // Round trip through the Mooncake key names.
        assert_eq!(parse_trace_line(&r.to_json_line()).unwrap(), r);
    }

    #[test]
    fn tolerates_extra_keys_and_whitespace() {
        let r = parse_trace_line(
            "  {\"extra\": {\"x\": [1]}, \"timestamp\": 1, \"input_length\": 2, \
             \"output_length\": 3, \"hash_ids\": []}\r\n",
        )
        .unwrap();
        assert_eq!(r.timestamp_ms, 1);
        assert!(r.hash_ids.is_empty());
    }

    #[test]
    fn rejects_bad_lines() {
        for bad in [
            "",
            "{",
            "[]",
            "null",
            r#"{"timestamp": 1, "input_length": 2, "output_length": 3}"#,
            r#"{"timestamp": -1, "input_length": 2, "output_length": 3, "hash_ids": []}"#,
            r#"{"timestamp": 1, "input_length": 5000000000, "output_length": 3, "hash_ids": []}"#,
            r#"{"timestamp": 1, "input_length": 2, "output_length": 3, "hash_ids": [1.5]}"#,
            r#"{"timestamp": 1, "input_length": 2, "output_length": 3, "hash_ids": []} {}"#,
        ] {
            assert!(parse_trace_line(bad).is_err(), "accepted {bad:?}");
        }
    }

    #[test]
    fn read_skips_blank_lines_honours_limit_and_reports_line() {
        let good = r#"{"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": [0]}"#;
        let text = format!("{good}\n\n   \n{good}\r\n{good}\nnot json\n{good}");
        let path = temp_file("blank.jsonl", text.as_bytes());

        assert_eq!(read_trace(&path, Some(2)).unwrap().len(), 2);
        assert_eq!(read_trace(&path, Some(3)).unwrap().len(), 3);
        assert!(read_trace(&path, Some(0)).unwrap().is_empty());
        match read_trace(&path, None) {
            Err(TraceError::Parse { path: p, line, .. }) => {
                assert_eq!(p, path);
                assert_eq!(line, 6);
            }
            other => panic!("expected a parse error, got {other:?}"),
        }
        let err = read_trace(&path, None).unwrap_err().to_string();
        assert!(err.ends_with(":6"), "{err}");
    }

    #[test]
    fn last_line_without_newline_and_invalid_utf8() {
        let path = temp_file(
            "utf8.jsonl",
            b"{\"timestamp\": 0, \"input_length\": 1, \"output_length\": 1, \"hash_ids\": [0]}\n\xff\xfe\n",
        );
        match read_trace(&path, None) {
            Err(TraceError::Parse { line: 2, .. }) => {}
            other => panic!("expected a parse error at line 2, got {other:?}"),
        }
    }

    #[test]
    fn missing_file_is_open_error() {
        let err = read_trace(Path::new("/nonexistent/tutti-bench/trace.jsonl"), None);
        assert!(matches!(err, Err(TraceError::Open { .. })));
    }

    #[test]
    fn stats() {
        let reqs = [
            parse_trace_line(
                r#"{"timestamp": 5, "input_length": 1, "output_length": 1, "hash_ids": [0, 1]}"#,
            )
            .unwrap(),
            parse_trace_line(
                r#"{"timestamp": 9, "input_length": 1, "output_length": 1, "hash_ids": [0, 1, 2]}"#,
            )
            .unwrap(),
        ];
        let s = TraceStats::from_requests(&reqs);
        assert_eq!(s.requests, 2);
        assert_eq!(s.total_blocks, 5);
        assert_eq!(s.unique_blocks, 3);
        assert_eq!(s.reused_blocks, 2);
        assert!((s.ideal_hit_ratio - 0.4).abs() < 1e-12);
        assert_eq!(s.span_ms, 4);
        assert_eq!(TraceStats::from_requests(&[]), TraceStats::default());
    }

    #[test]
    fn real_mooncake_trace() {
        let path = Path::new(REAL_TRACE);
        if !path.exists() {
            eprintln!("note: {REAL_TRACE} not present; skipping the real-trace test");
            return;
        }
        let reqs = read_trace(path, Some(500)).unwrap();
        assert_eq!(reqs.len(), 500);
        let first = &reqs[0];
        assert_eq!(first.timestamp_ms, 0);
        assert_eq!(first.hash_ids.len(), 14);
        assert_eq!(first.hash_ids, (0..14).collect::<Vec<u64>>());
        assert!(reqs.windows(2).all(|w| w[0].timestamp_ms <= w[1].timestamp_ms));
    }
}
