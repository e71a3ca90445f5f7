//! SIGINT and SIGTERM during `tutti-bench replay`: the run stops between
//! batches, the runtime shuts down in order (queues deleted, CC.SHN), one
//! line on stderr says so, and the exit status is 128 + the signal.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Starts a replay far too long to finish during the test and returns it
/// once it has started replaying, with its stderr lines arriving on `rx`.
fn start_long_replay() -> (Child, mpsc::Receiver<String>) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_tutti-bench"))
        .args(["replay", "--requests", "100000", "--json"])
        .env("RUST_LOG", "tutti_bench=info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("tutti-bench starts");
    let stderr = child.stderr.take().expect("stderr is piped");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(line) if line.contains("replay started") => break,
            Ok(_) => {}
            Err(e) => {
                let _ = child.kill();
                panic!("no \"replay started\" line within 60 s: {e}");
            }
        }
    }
    // Let a few batches run, so the signal lands in the middle of the work.
    std::thread::sleep(Duration::from_millis(300));
    (child, rx)
}

/// Sends `signal` to `child`, waits (at most 60 s) for it to exit, and
/// returns its status and everything it wrote to stderr.
fn interrupt(mut child: Child, rx: &mpsc::Receiver<String>, signal: libc::c_int) -> (ExitStatus, String) {
    let pid = libc::pid_t::try_from(child.id()).expect("pid fits pid_t");
    // SAFETY: kill(2) on our own child, which has not been waited for (so
    // its pid cannot have been reused); no memory is involved.
    #[allow(unsafe_code)]
    let rc = unsafe { libc::kill(pid, signal) };
    assert_eq!(rc, 0, "kill: {}", std::io::Error::last_os_error());
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(st) = child.try_wait().expect("try_wait") {
            break st;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            panic!("tutti-bench did not exit within 60 s of the signal");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    // The reader thread ends at EOF, once the process is gone.
    let stderr: Vec<String> = rx.iter().collect();
    (status, stderr.join("\n"))
}

#[test]
fn sigint_during_replay_shuts_the_drives_down_and_exits_130() {
    let (child, rx) = start_long_replay();
    let (status, stderr) = interrupt(child, &rx, libc::SIGINT);
    assert_eq!(status.code(), Some(130), "{status:?}\n{stderr}");
    let line =
        stderr.lines().find(|l| l.contains("interrupted by SIGINT")).unwrap_or_else(|| panic!("{stderr}"));
    assert!(line.contains("requests"), "{line}");
    assert!(line.contains("0 operations and 0 commands in flight"), "{line}");
    assert!(line.contains("0 lost"), "{line}");
    assert!(line.contains("drives d0, d1, d2, d3 shut down OK"), "{line}");
    assert!(!stderr.contains("FAILED") && !stderr.contains("panicked"), "{stderr}");
}

#[test]
fn sigterm_during_replay_exits_143_after_the_same_shutdown() {
    let (child, rx) = start_long_replay();
    let (status, stderr) = interrupt(child, &rx, libc::SIGTERM);
    assert_eq!(status.code(), Some(143), "{status:?}\n{stderr}");
    let line =
        stderr.lines().find(|l| l.contains("interrupted by SIGTERM")).unwrap_or_else(|| panic!("{stderr}"));
    assert!(line.contains("drives d0, d1, d2, d3 shut down OK"), "{line}");
}
