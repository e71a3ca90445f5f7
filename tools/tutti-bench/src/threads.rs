//! CPU time of the application's threads: every thread of this process
//! except the emulator's controller threads (`nvme-emu-*`), which stand in
//! for the drives. Read from `/proc/self/task/*/stat` (utime + stime, in
//! clock ticks of `USER_HZ` = 100 per second on Linux, so 10 ms
//! resolution). Threads that end between two readings take their time
//! with them; the benchmarks read it around runs whose threads live
//! throughout.

/// Clock ticks per second of `/proc/*/stat` (`USER_HZ`, fixed at 100 by
/// the Linux ABI on every architecture this project builds for).
const USER_HZ: f64 = 100.0;

/// Seconds of CPU time (user + system) used so far by the live threads of
/// this process other than the emulator's; 0.0 where `/proc` cannot be
/// read.
pub fn app_cpu_seconds() -> f64 {
    let Ok(dir) = std::fs::read_dir("/proc/self/task") else { return 0.0 };
    let mut ticks = 0u64;
    for entry in dir.flatten() {
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else { continue };
        if let Some((comm, t)) = parse_stat(&stat) {
            if !comm.starts_with("nvme-emu") {
                ticks += t;
            }
        }
    }
    ticks as f64 / USER_HZ
}

/// A thread's name and utime + stime (ticks) from its `stat` line:
/// `tid (comm) state ppid ... utime stime ...` (fields 14 and 15); the
/// name may itself hold spaces and parentheses, so it ends at the last
/// `)`.
fn parse_stat(stat: &str) -> Option<(&str, u64)> {
    let open = stat.find('(')?;
    let close = stat.rfind(')')?;
    let comm = stat.get(open + 1..close)?;
    let mut rest = stat.get(close + 1..)?.split_whitespace();
    // After the name: state is field 3, so utime (14) is the 12th.
    let utime: u64 = rest.nth(11)?.parse().ok()?;
    let stime: u64 = rest.next()?.parse().ok()?;
    Some((comm, utime + stime))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_lines_parse_with_odd_names() {
        let line = "4242 (nvme-emu-d0) S 1 2 3 4 5 6 7 8 9 10 1234 56 0 0 20 0 1 0 100 0 0";
        assert_eq!(parse_stat(line), Some(("nvme-emu-d0", 1290)));
        let odd = "7 (a (b) c) R 1 2 3 4 5 6 7 8 9 10 3 4 0 0";
        assert_eq!(parse_stat(odd), Some(("a (b) c", 7)));
        assert_eq!(parse_stat("7 (x) R 1 2"), None);
        assert_eq!(parse_stat("garbage"), None);
    }

    #[test]
    fn a_busy_thread_is_counted() {
        // Spins until the counter shows 100 ms of CPU, or gives up after
        // 20 s of wall time: on a loaded machine the spinning thread may
        // get little of a core, so wall time says nothing; a counter that
        // never counts it fails.
        let before = app_cpu_seconds();
        let t0 = std::time::Instant::now();
        let mut x = 0u64;
        while app_cpu_seconds() - before < 0.1 && t0.elapsed() < std::time::Duration::from_secs(20) {
            for _ in 0..100_000 {
                x = std::hint::black_box(x.wrapping_add(1));
            }
        }
        assert!(app_cpu_seconds() - before >= 0.1, "20 s of spinning counted as less than 100 ms of CPU");
    }
}
