//! Every chart drawn from a recorded `--json` document (tests/fixtures/,
//! CPU runs of the release build) by `tutti-bench plot`: the file exists,
//! parses as SVG, and names its axes and its series (issue 28).

use std::path::{Path, PathBuf};
use std::process::Command;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name)
}

/// Runs `tutti-bench plot FIXTURE -o OUT` and returns the SVG's text
/// content (every `<text>` node, in order).
fn plot(name: &str) -> Vec<String> {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("chart.svg");
    let o = Command::new(env!("CARGO_BIN_EXE_tutti-bench"))
        .args(["plot", fixture(name).to_str().unwrap(), "-o", out.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(out.is_file(), "no {}", out.display());
    let svg = std::fs::read_to_string(&out).unwrap();
    let doc = roxmltree::Document::parse(&svg).unwrap_or_else(|e| panic!("{name}: not XML: {e}"));
    let root = doc.root_element();
    assert_eq!(root.tag_name().name(), "svg", "{name}");
    assert_eq!(root.tag_name().namespace(), Some("http://www.w3.org/2000/svg"), "{name}");
    let drawn =
        root.descendants().filter(|n| ["rect", "polyline", "line", "circle"].contains(&n.tag_name().name()));
    assert!(drawn.count() > 10, "{name}: almost nothing drawn");
    root.descendants()
        .filter(|n| n.has_tag_name("text"))
        .filter_map(|n| n.text().map(|t| t.trim().to_string()))
        .collect()
}

fn assert_names(name: &str, texts: &[String], wanted: &[&str]) {
    for w in wanted {
        assert!(texts.iter().any(|t| t.contains(w)), "{name}: no text {w:?} in {texts:?}");
    }
}

#[test]
fn stripe_chart_names_drives_bandwidth_path_and_model() {
    let t = plot("stripe-cpu.json");
    assert_names(
        "stripe",
        &t,
        &[
            "drives",
            "bandwidth, GB/s",
            "measured, CPU path",
            "modelled limit: drives x 500 MB/s",
            "Striped read",
        ],
    );
}

#[test]
fn stripe_daemon_chart_names_owner_client_and_model() {
    let t = plot("stripe-daemon.json");
    assert_names(
        "stripe-daemon",
        &t,
        &[
            "drives",
            "bandwidth, GB/s",
            "runtime owning the drives",
            "runtime as a tuttid client",
            "modelled limit",
        ],
    );
}

#[test]
fn kv_chart_names_operations_and_both_paths() {
    let t = plot("kv.json");
    assert_names(
        "kv",
        &t,
        &["operation", "bandwidth, GB/s", "raw runtime I/O", "tutti-kv", "put (tutti-kv)", "read (raw)"],
    );
}

#[test]
fn rate_charts_name_runs_and_paths() {
    let t = plot("rate.json");
    assert_names("rate", &t, &["million commands per second", "run (in the order measured)", "queue pair"]);
    let t = plot("rate-compare.json");
    assert_names("rate-compare", &t, &["million commands per second", "queue pair #2", "runtime API #2"]);
}

#[test]
fn replay_chart_names_the_cdf_and_bandwidth() {
    let t = plot("replay.json");
    assert_names(
        "replay",
        &t,
        &[
            "load latency, microseconds",
            "share of loads at or below",
            "block loads, cpu",
            "save (put)",
            "load (get)",
            "requests replayed",
            "hit ratio of the requests so far",
            "save, GB/s within the step",
            "load, GB/s within the step",
        ],
    );
}

#[test]
fn a_document_without_a_chart_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("gpu-soak.json");
    std::fs::write(&bad, r#"{"schema_version":1,"bench":"gpu-soak"}"#).unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_tutti-bench"))
        .args(["plot", bad.to_str().unwrap(), "-o", dir.path().join("x.svg").to_str().unwrap()])
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("gpu-soak"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
}

#[test]
fn ttft_chart_stacks_restore_and_prefill_per_prompt_and_variant() {
    // A report crates/python/bench/ttft.py wrote on the H200 (commit
    // 111905c, 2026-12-04): three prompt lengths, three variants each.
    let name = "ttft/ttft-h200-111905c.json";
    let t = plot(name);
    assert_names(
        name,
        &t,
        &[
            "Time to first token, llama3-8b-shape on NVIDIA H200",
            "milliseconds (median)",
            "prompt tokens and variant",
            "restore of the prefix",
            "prefill of the rest",
            "8192 pinned",
            "16384 recompute",
            "32768 tutti",
        ],
    );
    // Every prompt length's variants, shortest prompt first.
    let labels: Vec<&String> =
        t.iter().filter(|x| x.starts_with(char::is_numeric) && x.contains(' ')).collect();
    assert_eq!(labels.len(), 9, "{labels:?}");
    assert!(labels[0].starts_with("8192 ") && labels[8].starts_with("32768 "), "{labels:?}");
}
