//! The conformance checks against the software controller, in the shapes
//! the VM harness gives QEMU's controllers (512- and 4096-byte LBAs, a small
//! MDTS, two granted queue pairs), plus runs where the emulator misbehaves
//! on purpose, to show that each check can fail.

use std::sync::Arc;

use nvm_queue::NvmeDevice;
use nvme_conformance::{run, Options, Outcome, Report, CHECKS, MIN_SCRATCH_BYTES};
use nvme_emu::{Emulator, EmulatorConfig, FaultAction, FaultMatch, FaultRule, NamespaceSpec};
use nvme_regs::Status;

fn run_on(cfg: EmulatorConfig, scratch_blocks: u64) -> (Report, Arc<Emulator>) {
    let emu = Emulator::start(cfg).expect("emulator starts");
    let dev: Arc<dyn NvmeDevice> = emu.clone();
    let report = run(dev, &Options::new(1, 0..scratch_blocks));
    (report, emu)
}

fn assert_all_pass(r: &Report) {
    assert_eq!(r.results.len(), CHECKS.len(), "{r}");
    assert!(r.is_ok() && r.passed() == CHECKS.len(), "{r}");
    let names: Vec<&str> = r.results.iter().map(|c| c.name).collect();
    assert_eq!(names, CHECKS);
}

fn detail<'a>(r: &'a Report, name: &str) -> &'a str {
    match r.outcome(name) {
        Some(Outcome::Pass(t) | Outcome::Fail(t) | Outcome::Skip(t)) => t,
        None => panic!("{name} did not run"),
    }
}

#[test]
fn passes_on_512_byte_blocks() {
    let (r, emu) = run_on(EmulatorConfig::new("c512", vec![NamespaceSpec::new(65536, 512)]), 16384);
    assert_all_pass(&r);
    assert!(detail(&r, "slba_nlb").starts_with("512-byte LBAs"), "{r}");
    assert_eq!(emu.stats().doorbell_violations, 0);
}

#[test]
fn passes_on_4096_byte_blocks_with_the_lba_math_in_4k_units() {
    let (r, _emu) = run_on(EmulatorConfig::new("c4k", vec![NamespaceSpec::new(16384, 4096)]), 2048);
    assert_all_pass(&r);
    assert!(detail(&r, "slba_nlb").contains("4096-byte LBAs"), "{r}");
}

#[test]
fn splits_by_a_small_mdts() {
    let mut cfg = EmulatorConfig::new("mdts2", vec![NamespaceSpec::new(65536, 512)]);
    cfg.mdts = 2;
    let (r, _emu) = run_on(cfg, 16384);
    assert_all_pass(&r);
    // 3 x 16 KiB + one block = 4 commands.
    assert!(detail(&r, "mdts_split").contains("16384-byte transfer limit: 4 commands"), "{r}");
}

#[test]
fn uses_the_two_queue_pairs_granted_of_eight_asked() {
    let mut cfg = EmulatorConfig::new("q2", vec![NamespaceSpec::new(65536, 512)]);
    cfg.io_queues = 2;
    let (r, _emu) = run_on(cfg, 16384);
    assert_all_pass(&r);
    assert!(detail(&r, "queue_grant").starts_with("asked 8, granted 2"), "{r}");
}

#[test]
fn a_wrong_status_on_the_out_of_range_read_fails_that_check() {
    // The controller answers the past-the-end read with a media error
    // instead of LBA Out of Range: the check must notice.
    let mut cfg = EmulatorConfig::new("liar", vec![NamespaceSpec::new(16384, 512)]);
    cfg.faults.push(FaultRule {
        matches: FaultMatch { lba: Some(16384..16385), ..Default::default() },
        action: FaultAction::Fail(Status::media(0x81)),
        times: None,
        skip: 0,
    });
    let (r, _emu) = run_on(cfg, 16384);
    assert!(matches!(r.outcome("lba_out_of_range_in_batch"), Some(Outcome::Fail(_))), "{r}");
    assert_eq!(r.failed(), 1, "{r}");
}

#[test]
fn a_failing_scratch_block_fails_the_checks_that_touch_it_and_not_the_run() {
    let mut cfg = EmulatorConfig::new("bad-block", vec![NamespaceSpec::new(16384, 512)]);
    cfg.faults.push(FaultRule {
        matches: FaultMatch { lba: Some(3..4), ..Default::default() },
        action: FaultAction::Fail(Status::media(0x81)),
        times: None,
        skip: 0,
    });
    let (r, _emu) = run_on(cfg, 16384);
    // slba_nlb reads blocks 3..16; phase_wrap writes block 3.
    assert!(matches!(r.outcome("slba_nlb"), Some(Outcome::Fail(_))), "{r}");
    assert!(matches!(r.outcome("phase_wrap"), Some(Outcome::Fail(_))), "{r}");
    // Checks that stay away from block 3 still pass, and so does shutdown:
    // a failed check deletes its queue.
    assert!(matches!(r.outcome("many_outstanding"), Some(Outcome::Pass(_))), "{r}");
    assert!(matches!(r.outcome("shutdown"), Some(Outcome::Pass(_))), "{r}");
}

#[test]
fn a_controller_that_never_becomes_ready_fails_bring_up_and_skips_the_rest() {
    let mut cfg = EmulatorConfig::new("stuck", vec![NamespaceSpec::new(16384, 512)]);
    cfg.never_ready = true;
    let emu = Emulator::start(cfg).expect("emulator starts");
    let dev: Arc<dyn NvmeDevice> = emu.clone();
    let mut opts = Options::new(1, 0..16384);
    opts.timeout = std::time::Duration::from_secs(1);
    let r = run(dev, &opts);
    assert!(matches!(r.outcome("bring_up"), Some(Outcome::Fail(_))), "{r}");
    assert_eq!((r.failed(), r.skipped(), r.passed()), (1, CHECKS.len() - 1, 0), "{r}");
    assert!(!r.is_ok());
}

#[test]
fn a_scratch_range_too_small_or_outside_the_namespace_is_an_options_error_not_a_failure() {
    let emu = Emulator::start(EmulatorConfig::new("small", vec![NamespaceSpec::new(16384, 512)])).unwrap();
    let r = run(emu, &Options::new(1, 0..100));
    let why = r.options_error.as_deref().unwrap_or_else(|| panic!("no options error: {r}"));
    assert!(why.contains(&MIN_SCRATCH_BYTES.to_string()), "{r}");
    assert_eq!(r.failed(), 0, "a caller's mistake is not the drive failing: {r}");
    assert!(!r.is_ok());
    assert!(matches!(r.outcome("slba_nlb"), Some(Outcome::Skip(_))), "{r}");
    assert!(r.to_string().contains("options: scratch range 0..100"), "{r}");
    for (opts, text) in
        [(Options::new(1, 100..20000), "not inside"), (Options::new(3, 0..16384), "not active")]
    {
        let emu = Emulator::start(EmulatorConfig::new("e", vec![NamespaceSpec::new(16384, 512)])).unwrap();
        let r = run(emu, &opts);
        assert!(r.options_error.as_deref().is_some_and(|w| w.contains(text)), "{r}");
        assert_eq!(r.failed(), 0, "{r}");
    }
}

#[test]
fn a_namespace_formatted_with_metadata_is_an_options_error_that_says_so() {
    for (extended, layout) in [(true, "extended LBA"), (false, "separate buffer")] {
        let cfg = EmulatorConfig::new(
            "md",
            vec![NamespaceSpec::new(65536, 512).with_metadata(8, extended), NamespaceSpec::new(65536, 512)],
        );
        let emu = Emulator::start(cfg).unwrap();
        let r = run(emu, &Options::new(1, 0..16384));
        let why = r.options_error.as_deref().unwrap_or_else(|| panic!("no options error: {r}"));
        assert_eq!(
            why,
            format!(
                "namespace 1 is formatted with 8 bytes of metadata per block ({layout}, LBAF 1); tutti supports \
                 only formats without metadata: reformat with `nvme format /dev/nvmeX -n 1 --lbaf=0` (512-byte \
                 blocks, no metadata; erases the namespace) or pick another namespace"
            )
        );
        assert_eq!(r.failed(), 0, "a caller's mistake is not the drive failing: {r}");
        assert!(!r.is_ok());
        assert!(matches!(r.outcome("identify"), Some(Outcome::Skip(t)) if t.contains(why)), "{r}");
    }
    // The namespace without metadata beside it passes every check.
    let cfg = EmulatorConfig::new(
        "md2",
        vec![NamespaceSpec::new(65536, 512).with_metadata(8, true), NamespaceSpec::new(65536, 512)],
    );
    let emu = Emulator::start(cfg).unwrap();
    assert_all_pass(&run(emu, &Options::new(2, 0..16384)));
}

#[test]
fn a_check_that_times_out_fails_alone_and_its_queue_is_given_back() {
    // queue_grant's first read never completes: that check fails on its
    // timeout, Delete I/O SQ aborts the held command, and every later check
    // still gets QID 1 and passes.
    let mut cfg = EmulatorConfig::new("slow", vec![NamespaceSpec::new(65536, 512)]);
    cfg.faults.push(FaultRule {
        matches: FaultMatch { lba: Some(0..1), ..Default::default() },
        action: FaultAction::NeverComplete,
        times: Some(1),
        skip: 0,
    });
    let emu = Emulator::start(cfg).expect("emulator starts");
    let mut opts = Options::new(1, 0..16384);
    opts.timeout = std::time::Duration::from_millis(500);
    let r = run(emu.clone(), &opts);
    assert!(
        matches!(r.outcome("queue_grant"), Some(Outcome::Fail(t)) if t.contains("completions within")),
        "{r}"
    );
    assert_eq!((r.failed(), r.passed()), (1, CHECKS.len() - 1), "{r}");
    assert_eq!(emu.stats().sq_deletion_aborts, 1, "{r}");
}

#[test]
fn a_stop_request_skips_the_checks_left_and_still_shuts_the_controller_down() {
    let emu = Emulator::start(EmulatorConfig::new("stop", vec![NamespaceSpec::new(16384, 512)])).unwrap();
    let mut opts = Options::new(1, 0..16384);
    opts.stop = Some(Arc::new(std::sync::atomic::AtomicBool::new(true)));
    let r = run(emu, &opts);
    assert!(r.interrupted, "{r}");
    assert!(!r.is_ok(), "{r}");
    assert!(matches!(r.outcome("bring_up"), Some(Outcome::Pass(_))), "{r}");
    assert!(matches!(r.outcome("shutdown"), Some(Outcome::Pass(_))), "{r}");
    for name in &CHECKS[1..CHECKS.len() - 1] {
        assert_eq!(r.outcome(name), Some(&Outcome::Skip("not run: interrupted".into())), "{r}");
    }
    assert!(r.to_string().contains("interrupted"), "{r}");
}
