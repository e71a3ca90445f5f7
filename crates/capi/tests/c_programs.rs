//! C programs compiled with the system compiler against the committed
//! `include/tutti.h` and the static library this build made, then run:
//! `examples/save_load.c` and the C snippet of README.md ("Use from C"),
//! and the header alone as C99 and C++17 (`$CXX`, default `c++`).
//!
//! The compiler is `$CC` (default `cc`). Without one the tests skip with a
//! printed reason, unless `TUTTI_C_REQUIRED=1` (CI), where they fail.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::SystemTime;

const MANIFEST_DIR: &str = env!("CARGO_MANIFEST_DIR");

/// The C compiler command (`$CC` split on whitespace, or `cc`), or `None`
/// (after saying why) when there is none and none is required.
fn compiler() -> Option<Vec<String>> {
    find_compiler("CC", "cc")
}

/// The compiler named by env `var` (split on whitespace), else `default`.
fn find_compiler(var: &str, default: &str) -> Option<Vec<String>> {
    let cc = std::env::var(var).ok().filter(|c| !c.trim().is_empty()).unwrap_or_else(|| default.to_owned());
    let words: Vec<String> = cc.split_whitespace().map(str::to_owned).collect();
    let works =
        Command::new(&words[0]).args(&words[1..]).arg("--version").output().is_ok_and(|o| o.status.success());
    if works {
        return Some(words);
    }
    let required = std::env::var("TUTTI_C_REQUIRED").is_ok_and(|v| v == "1");
    assert!(!required, "TUTTI_C_REQUIRED=1 but the compiler {cc:?} does not run");
    eprintln!(
        "SKIPPED: no C compiler ({cc:?} does not run); set CC, or TUTTI_C_REQUIRED=1 to make this fail"
    );
    None
}

/// The static library of this build: `libtutti_c.a` in the profile folder
/// of the target dir this test runs from (it honours `CARGO_TARGET_DIR`:
/// the test binary sits in `<target>/<profile>/deps/`), or its copy in
/// `deps/`, whichever is newer (`cargo test` refreshes the latter).
fn static_lib() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    let deps = exe.parent().expect("deps folder");
    let profile = deps.parent().expect("profile folder");
    let modified = |p: &Path| p.metadata().and_then(|m| m.modified()).ok();
    [profile.join("libtutti_c.a"), deps.join("libtutti_c.a")]
        .into_iter()
        .filter_map(|p| modified(&p).map(|t| (t, p)))
        .max_by_key(|(t, _): &(SystemTime, PathBuf)| *t)
        .map(|(_, p)| p)
        .unwrap_or_else(|| panic!("no libtutti_c.a in {} or {}", profile.display(), deps.display()))
}

/// Compiles `source` into an executable named `name` and runs it; `None`
/// when skipped for want of a compiler.
fn compile_and_run(source: &Path, name: &str) -> Option<Output> {
    let cc = compiler()?;
    let exe = Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    let include = Path::new(MANIFEST_DIR).join("include");
    let built = Command::new(&cc[0])
        .args(&cc[1..])
        .args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-pedantic"])
        .arg("-I")
        .arg(&include)
        .arg(source)
        .arg(static_lib())
        // What the Rust standard library in a static library needs.
        .args(["-lpthread", "-ldl", "-lm", "-o"])
        .arg(&exe)
        .output()
        .expect("running the C compiler");
    assert!(
        built.status.success(),
        "compiling {} failed:\n{}",
        source.display(),
        String::from_utf8_lossy(&built.stderr)
    );
    Some(Command::new(&exe).output().expect("running the C program"))
}

/// Asserts a clean exit and returns stdout.
fn succeeded(out: &Output, what: &str) -> String {
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{what} exited with {:?}\nstdout:\n{stdout}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

#[test]
fn the_save_load_example_verifies_every_byte() {
    let src = Path::new(MANIFEST_DIR).join("examples/save_load.c");
    let Some(out) = compile_and_run(&src, "save_load") else { return };
    let stdout = succeeded(&out, "save_load");
    for line in [
        "store kv: 1073741824 bytes on 4 drives, 4096-byte blocks, 1024 slots of 1048576 bytes",
        "saved and loaded 8 blocks of 1048576 bytes: 8388608 bytes verified, 0 wrong",
        "forged handle: TUTTI_STATUS_HANDLE: forged target handle",
        "closed target: outcome NOT_ACCEPTED, op 0: target: stale target handle",
        "shutdown: 0 commands in flight",
        "save_load: OK",
    ] {
        assert!(stdout.contains(line), "missing {line:?} in:\n{stdout}");
    }
}

/// The first ```c block of README.md's "Use from C" section.
fn readme_snippet() -> String {
    let readme = std::fs::read_to_string(Path::new(MANIFEST_DIR).join("../../README.md")).expect("README.md");
    let section =
        readme.split("\n## Use from C\n").nth(1).expect("README.md has a \"## Use from C\" section");
    let section = section.split("\n## ").next().unwrap_or(section);
    let code = section.split("```c\n").nth(1).expect("the section has a ```c block");
    code.split("\n```").next().expect("the block is closed").to_owned()
}

#[test]
fn the_readme_c_snippet_compiles_and_runs() {
    let src = Path::new(env!("CARGO_TARGET_TMPDIR")).join("readme_snippet.c");
    std::fs::write(&src, readme_snippet()).expect("writing the snippet");
    let Some(out) = compile_and_run(&src, "readme_snippet") else { return };
    let stdout = succeeded(&out, "the README snippet");
    assert_eq!(stdout, "saved and loaded 1 MiB at tutti://kv/42\n");
}

#[test]
fn the_header_compiles_as_c99_and_as_cpp() {
    let include = Path::new(MANIFEST_DIR).join("include");
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"));
    let c_src = dir.join("header_c99.c");
    std::fs::write(
        &c_src,
        "#include \"tutti.h\"\nint main(void) { tutti_request r = {TUTTI_DIRECTION_READ, 0, 0, 0, 0, 0};\n\
         return (int)r.len + (int)TUTTI_STATUS_OK + (int)TUTTI_OUTCOME_SUCCESS; }\n",
    )
    .unwrap();
    let cpp_src = dir.join("header.cpp");
    std::fs::write(
        &cpp_src,
        "#include \"tutti.h\"\nint main() { tutti_runtime *rt = nullptr; tutti_status s = TUTTI_STATUS_OK;\n\
         tutti_runtime_destroy(rt); return s == TUTTI_STATUS_OK ? 0 : 1; }\n",
    )
    .unwrap();
    for (var, default, std, src) in [("CC", "cc", "-std=c99", &c_src), ("CXX", "c++", "-std=c++17", &cpp_src)]
    {
        let Some(cc) = find_compiler(var, default) else { continue };
        let out = Command::new(&cc[0])
            .args(&cc[1..])
            .args([std, "-Wall", "-Wextra", "-Werror", "-pedantic", "-fsyntax-only", "-I"])
            .arg(&include)
            .arg(src)
            .output()
            .expect("running the compiler");
        assert!(
            out.status.success(),
            "{std}: tutti.h does not compile:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
