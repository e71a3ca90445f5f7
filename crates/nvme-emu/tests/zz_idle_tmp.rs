mod common;
#[test]
fn idle_cpu() {
    let _h = common::Harness::start(common::config("idle"));
    let _h2 = common::Harness::start(common::config("idle2"));
    let t = |s: &str| -> u64 { let v: Vec<&str> = s.split_whitespace().collect(); v[13].parse::<u64>().unwrap() + v[14].parse::<u64>().unwrap() };
    let a = t(&std::fs::read_to_string("/proc/self/stat").unwrap());
    std::thread::sleep(std::time::Duration::from_secs(2));
    let b = t(&std::fs::read_to_string("/proc/self/stat").unwrap());
    eprintln!("idle CPU: {} ticks in 2 s (100 ticks = 1 core-second)", b - a);
}
