//! Records the git commit tutti-bench was built from, for the `run.git_commit`
//! field of every `--json` document (docs/benchmarks.md, "JSON output").
//!
//! `TUTTI_GIT_COMMIT` at build time wins (a build outside a git checkout,
//! e.g. from a source tarball, can name its commit); otherwise
//! `git rev-parse HEAD`; otherwise "unknown".

use std::process::Command;

fn main() {
    println!("cargo:rerun-if-env-changed=TUTTI_GIT_COMMIT");
    // A new commit moves HEAD or the ref it names; rebuilding on either keeps
    // the recorded commit current (missing paths are simply never "changed").
    println!("cargo:rerun-if-changed=../../.git/HEAD");
    println!("cargo:rerun-if-changed=../../.git/refs/heads");
    let commit = std::env::var("TUTTI_GIT_COMMIT")
        .ok()
        .filter(|c| !c.trim().is_empty())
        .or_else(git_head)
        .unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=TUTTI_BENCH_GIT_COMMIT={}", commit.trim());
}

fn git_head() -> Option<String> {
    let out = Command::new("git").args(["rev-parse", "HEAD"]).output().ok()?;
    let s = String::from_utf8(out.stdout).ok()?;
    (out.status.success() && !s.trim().is_empty()).then_some(s)
}
