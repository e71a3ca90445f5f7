//! Shared helpers for the cross-crate tests in this folder: an emulated
//! controller brought up by the driver.

use std::sync::Arc;

use nvm_queue::{Controller, ControllerOptions, NvmeDevice};
use nvme_emu::{Emulator, EmulatorConfig, NamespaceSpec};

/// An emulator plus the driver's controller on it.
pub struct Rig {
    /// The emulated controller (for its stats).
    pub emu: Arc<Emulator>,
    /// The same, as the driver sees it.
    pub dev: Arc<dyn NvmeDevice>,
    /// The driver's controller.
    pub ctrl: Controller,
}

/// Starts an emulator configured by `f` (on top of one 4096-byte-block
/// namespace of 64 MiB) and brings it up with the driver.
pub fn rig(f: impl FnOnce(&mut EmulatorConfig)) -> Rig {
    let mut cfg = EmulatorConfig::new("test", vec![NamespaceSpec::new(16384, 4096)]);
    f(&mut cfg);
    let emu = Emulator::start(cfg).expect("emulator starts");
    let dev: Arc<dyn NvmeDevice> = emu.clone();
    let ctrl = Controller::init(dev.clone(), ControllerOptions::default()).expect("controller comes up");
    Rig { emu, dev, ctrl }
}
