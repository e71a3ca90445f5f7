//! The `--json` documents against their types (tutti_bench::schema) and
//! their documentation (docs/benchmarks.md, "JSON output"): each benchmark
//! that runs on a CPU runs briefly here, and its output must parse into its
//! type and serialize back to the very same JSON (so no field is unknown,
//! missing or renamed on either side), carry the run's facts, and every
//! field name must be documented. The recorded fixtures pass the same
//! checks (issue 28).

use std::path::Path;
use std::process::Command;

use serde_json::Value;
use tutti_bench::schema::AnyDocument;

fn run_json(args: &[&str]) -> Value {
    let o = Command::new(env!("CARGO_BIN_EXE_tutti-bench")).args(args).output().unwrap();
    assert!(o.status.success(), "{args:?}: {}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{args:?}: {e}"))
}

/// Every object key in `v`, recursively.
fn keys(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::Object(m) => {
            for (k, x) in m {
                out.push(k.clone());
                keys(x, out);
            }
        }
        Value::Array(a) => a.iter().for_each(|x| keys(x, out)),
        _ => {}
    }
}

fn check(v: &Value, bench: &str) {
    let doc = AnyDocument::from_value(v.clone()).unwrap_or_else(|e| panic!("{bench}: {e}: {v:#}"));
    assert_eq!(doc.bench(), bench);
    assert_eq!(&doc.to_value(), v, "{bench}: the typed document differs from the output");
    let run = doc.run().expect("a tutti-bench document has its run");
    assert!(
        run.command_line.len() >= 2 && run.command_line[0].contains("tutti-bench"),
        "{:?}",
        run.command_line
    );
    assert!(!run.git_commit.is_empty() && !run.hostname.is_empty() && run.cpus >= 1);
    assert!(run.started_utc.ends_with('Z') && run.started_utc.len() == 20, "{}", run.started_utc);
    assert_eq!(v["schema_version"], 1);
    let docs =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/benchmarks.md"))
            .unwrap();
    let mut names = Vec::new();
    keys(v, &mut names);
    for k in names {
        assert!(
            docs.contains(&format!("`{k}`")),
            "{bench}: field `{k}` is not documented in docs/benchmarks.md"
        );
    }
}

#[test]
fn live_documents_match_their_types_and_docs() {
    let stripe = run_json(&["stripe", "--seconds", "0.1", "--max-drives", "2", "--json"]);
    check(&stripe, "stripe");
    assert_eq!(stripe["points"].as_array().unwrap().len(), 2);
    assert_eq!(stripe["run"]["command_line"][1], "stripe");
    check(&run_json(&["rate", "--commands", "20000", "--json"]), "rate");
    check(&run_json(&["rate", "--compare", "--commands", "20000", "--json"]), "rate-compare");
    let kv = ["kv", "--drives", "1", "--drive-mib", "64", "--rounds", "1", "--recovery", "500", "--json"];
    check(&run_json(&kv), "kv");
    let replay = run_json(&["replay", "--requests", "20", "--json"]);
    check(&replay, "replay");
    assert!(!replay["load_latency_cdf"].as_array().unwrap().is_empty());
    let timeline = replay["timeline"].as_array().unwrap();
    assert_eq!(timeline.len(), 20);
    assert_eq!(timeline[19]["requests"], 20);
}

#[test]
fn fixtures_match_their_types_and_docs() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let mut n = 0;
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "json") {
            let v: Value = serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
            let bench = v["bench"].as_str().unwrap().to_string();
            check(&v, &bench);
            n += 1;
        }
    }
    assert!(n >= 5);
}
