//! Records the git commit tutti-bench was built from, for the `run.git_commit`
//! field of every `--json` document (docs/benchmarks.md, "JSON output").
//!
//! `TUTTI_GIT_COMMIT` at build time wins (a build outside a git checkout,
//! e.g. from a source tarball, can name its commit); otherwise
//! `git rev-parse HEAD`; otherwise "unknown".

use std::process::Command;

fn main() {
    println!("cargo:rerun-if-env-changed=TUTTI_GIT_COMMIT");
    // A new commit moves HEAD or the ref it names; watching them keeps the
    // recorded commit current. Only paths that exist are named: cargo reruns
    // a build script on every build for a missing one.
    if let Some(dir) = git(&["rev-parse", "--git-dir"]) {
        let dir = std::path::PathBuf::from(dir.trim());
        for p in ["HEAD", "refs/heads", "packed-refs"].map(|p| dir.join(p)) {
            if p.exists() {
                println!("cargo:rerun-if-changed={}", p.display());
            }
        }
    }
    let commit = std::env::var("TUTTI_GIT_COMMIT")
        .ok()
        .filter(|c| !c.trim().is_empty())
        .or_else(|| git(&["rev-parse", "HEAD"]))
        .unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=TUTTI_BENCH_GIT_COMMIT={}", commit.trim());
}

/// `git ARGS`' standard output, when git ran and succeeded with some.
fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    let s = String::from_utf8(out.stdout).ok()?;
    (out.status.success() && !s.trim().is_empty()).then_some(s)
}
