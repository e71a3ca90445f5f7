//! `tutti-bench kv` runs end to end on small drives and reports both paths,
//! their ratios and the recovery it timed.

use std::process::Command;

#[test]
fn kv_bench_reports_raw_and_store_bandwidth_and_recovery() {
    let out = Command::new(env!("CARGO_BIN_EXE_tutti-bench"))
        .args(["kv", "--drives", "2", "--drive-mib", "8", "--object-kib", "64", "--batch", "8"])
        .args(["--depth", "2", "--rounds", "1", "--recovery", "500", "--json"])
        .output()
        .expect("runs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(v["drives"], 2);
    assert_eq!(v["object_bytes"], 64 << 10);
    // 2 x 8 MiB of 64 KiB slots, one slot for the raw path's skipped slot 0.
    assert_eq!(v["objects"], 255);
    for path in ["raw", "store"] {
        let p = &v[path][0];
        assert!(p["write_gbps"].as_f64().unwrap() > 0.0 && p["read_gbps"].as_f64().unwrap() > 0.0, "{v}");
    }
    assert!(v["put_ratio"].as_f64().unwrap() > 0.0 && v["get_ratio"].as_f64().unwrap() > 0.0);
    assert_eq!(v["recovery"][0][0], 500);
    assert!(v["recovery"][0][1].as_f64().unwrap() > 0.0);
}
