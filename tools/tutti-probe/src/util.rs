//! Helpers shared by the subcommands: bringing a controller up on a
//! vfio-bound function, and sizes in words.

use std::sync::Arc;

use nvm_queue::{Controller, ControllerOptions, NvmeDevice};
use nvme_pci::{PciAddr, VfioNvme};

use crate::{Ctx, Failure};

/// Opens `addr` through nvme-pci (which logs the no-IOMMU warning to stderr
/// when it applies) and brings the controller up asking for `io_queues`
/// I/O queue pairs.
pub fn bring_up(ctx: &Ctx, addr: &PciAddr, io_queues: u16) -> Result<Controller, Failure> {
    // A no-IOMMU open logs its warning (stderr) from nvme-pci.
    let dev: Arc<dyn NvmeDevice> = Arc::new(VfioNvme::open(addr, &ctx.open)?);
    Controller::init(dev, ControllerOptions { io_queues, ..ControllerOptions::default() })
        .map_err(|e| context(format!("bringing up the controller at {addr} failed"), e))
}

/// An error with a message and its cause.
#[derive(Debug, thiserror::Error)]
#[error("{msg}")]
pub struct Context {
    msg: String,
    #[source]
    source: Box<dyn std::error::Error + Send + Sync>,
}

/// Wraps `source` with `msg` as a [`Failure`].
pub fn context(msg: impl Into<String>, source: impl std::error::Error + Send + Sync + 'static) -> Failure {
    Failure::Error(Box::new(Context { msg: msg.into(), source: Box::new(source) }))
}

/// `bytes` in binary units with one decimal (`1.0 GiB`, `512 B`).
pub fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(human_bytes(512), "512 B");
        assert_eq!(human_bytes(1 << 30), "1.0 GiB");
        assert_eq!(human_bytes(3 << 39), "1.5 TiB");
    }
}
