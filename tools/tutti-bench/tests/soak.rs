//! `tutti-bench gpu-soak` end to end, on CPU threads (no GPU needed): the
//! short sweep passes with every byte verified and one greppable summary
//! line, `--filter` and `--list` select cells, and `--execution gpu`
//! without a GPU is refused with status 2 and a message, not a panic.

use std::process::{Command, Output};

fn bench(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tutti-bench")).args(args).output().expect("runs")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// The one `gpu-soak:` summary line of a run's stdout.
fn summary(stdout: &str) -> &str {
    let lines: Vec<&str> = stdout.lines().filter(|l| l.starts_with("gpu-soak:")).collect();
    assert_eq!(lines.len(), 1, "one summary line:\n{stdout}");
    lines[0]
}

#[test]
fn the_short_sweep_on_cpu_threads_passes_every_cell() {
    let o = bench(&["gpu-soak", "--short", "--execution", "cpu"]);
    let (out, err) = (text(&o.stdout), text(&o.stderr));
    assert_eq!(o.status.code(), Some(0), "{out}\n{err}");
    let cells: Vec<&str> = out.lines().filter(|l| l.starts_with("cell ")).collect();
    assert!(cells.len() >= 10, "{out}");
    for c in &cells {
        assert!(c.contains(": ok |") && c.contains("| wrong bytes 0 |"), "{c}");
    }
    // The fault cells saw their injected failures, nothing else.
    for f in ["fault-read-error", "fault-write-error", "fault-read-delay"] {
        let line = cells.iter().find(|c| c.contains(f)).unwrap_or_else(|| panic!("no {f} cell:\n{out}"));
        assert!(!line.contains("injected 0 "), "{line}");
        assert!(line.contains(" bad 0 "), "{line}");
    }
    let s = summary(&out);
    assert!(
        s.starts_with(&format!("gpu-soak: {n} cells, {n} ok, 0 failed, 0 hung,", n = cells.len())),
        "{s}"
    );
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn filter_and_list_select_cells_by_name() {
    let all = text(&bench(&["gpu-soak", "--list"]).stdout);
    let faults = text(&bench(&["gpu-soak", "--list", "--filter", "fault-read"]).stdout);
    let (all, faults): (Vec<&str>, Vec<&str>) = (all.lines().collect(), faults.lines().collect());
    assert!(all.len() > faults.len() && !faults.is_empty(), "{all:?}\n{faults:?}");
    assert!(faults.iter().all(|n| n.starts_with("fault-read-") && all.contains(n)), "{faults:?}");
    assert_eq!(all.iter().filter(|n| n.contains("fault-read")).count(), faults.len());
    // A filter picks the cells that run; --json FILE holds them, stamped
    // with the run's facts like every --json document.
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("soak.json");
    let o = bench(&[
        "gpu-soak",
        "--short",
        "--execution",
        "cpu",
        "--filter",
        "fault-read-error",
        "--json",
        json.to_str().unwrap(),
    ]);
    let out = text(&o.stdout);
    assert_eq!(o.status.code(), Some(0), "{out}\n{}", text(&o.stderr));
    assert_eq!(out.lines().filter(|l| l.starts_with("cell ")).count(), 1, "{out}");
    assert!(summary(&out).starts_with("gpu-soak: 1 cells, 1 ok, 0 failed, 0 hung,"), "{out}");
    let doc: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    assert_eq!(doc["bench"], "gpu-soak");
    assert_eq!(doc["run"]["command_line"][1], "gpu-soak");
    assert_eq!(doc["cells"].as_array().unwrap().len(), 1);
    assert!(doc["summary"].is_object());
    // No cell matches: refused, status 2.
    let o = bench(&["gpu-soak", "--short", "--filter", "no-such-cell"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o.stderr).contains("no cell name contains"), "{}", text(&o.stderr));
}

#[test]
fn gpu_execution_without_a_gpu_is_refused_with_status_2() {
    let o = bench(&["gpu-soak", "--short", "--filter", "fault-read-error"]);
    let (out, err) = (text(&o.stdout), text(&o.stderr));
    match o.status.code() {
        // No CUDA driver or GPU here.
        Some(2) => assert!(err.contains("--execution gpu needs a CUDA GPU"), "{err}"),
        // A GPU machine: the one small cell runs.
        Some(0) => assert!(summary(&out).contains("1 ok, 0 failed, 0 hung"), "{out}"),
        other => panic!("status {other:?}:\n{out}\n{err}"),
    }
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn one_in_flight_runs_every_short_cell_one_batch_at_a_time_with_as_many_objects() {
    let usual = text(&bench(&["gpu-soak", "--short", "--list"]).stdout);
    let o = bench(&["gpu-soak", "--short", "--execution", "cpu", "--one-in-flight"]);
    let (out, err) = (text(&o.stdout), text(&o.stderr));
    assert_eq!(o.status.code(), Some(0), "{out}\n{err}");
    let cells: Vec<&str> = out.lines().filter(|l| l.starts_with("cell ")).collect();
    assert_eq!(cells.len(), usual.lines().count(), "{out}");
    for c in &cells {
        assert!(c.contains(" x1 in flight x") && c.contains(": ok |"), "{c}");
    }
    // Two put batches of 8 in flight for 2 rounds became 4 rounds of one.
    let put = cells.iter().find(|c| c.contains("put-b8x1-64k-odd")).expect("the put cell");
    assert!(put.contains("batch 8 x1 in flight x4 rounds"), "{put}");
    assert!(summary(&out).contains(" 0 failed, 0 hung,"), "{out}");
}
