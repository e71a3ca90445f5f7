//! The runtime opens the GPU its config names (`gpu: { ordinal }`), not
//! always GPU 0 (issue 29: one worker per GPU). Runs anywhere: an ordinal no
//! machine here has is refused with an error naming it.

use tutti::config::{DataPathConfig, Execution};
use tutti::{Config, Error, Runtime};

#[test]
fn a_gpu_ordinal_the_machine_lacks_is_refused_by_name() {
    let mut cfg = Config::builtin_striped_ram(2, 16 << 20, 1 << 20);
    for dp in cfg.datapaths.values_mut() {
        if let DataPathConfig::StripedLocalNvme(s) = dp {
            s.execution = Execution::Gpu;
        }
    }
    cfg.gpu.ordinal = 99;
    let e = Runtime::from_config(cfg).expect_err("no machine here has 100 GPUs");
    assert!(matches!(e, Error::Gpu { .. }), "{e:?}");
    assert!(tutti::error_chain(&e).contains("opening GPU 99 (config gpu.ordinal)"), "{e}");
}

#[test]
fn a_cpu_only_runtime_reports_no_gpu_ordinal() {
    let rt = Runtime::from_config(Config::builtin_striped_ram(2, 16 << 20, 1 << 20)).unwrap();
    assert_eq!(rt.gpu_ordinal(), None);
}
