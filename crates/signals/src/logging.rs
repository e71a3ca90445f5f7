//! The tools' logging: the libraries' warnings and errors (queue grants
//! lowered, queue depths clamped, unconfined no-IOMMU DMA, fatal
//! controllers) go to stderr, in colour only on a terminal.

use tracing_subscriber::EnvFilter;

/// Sends `tracing` events at `warn` and above to stderr. `RUST_LOG` (e.g.
/// `RUST_LOG=debug`) overrides the level. Call it once, after
/// [`crate::Stop::install`]; a second call (or a subscriber installed
/// already) leaves the first in place.
pub fn init_logging() {
    init_logging_from("RUST_LOG");
}

/// [`init_logging`], with the level read from the environment variable
/// `var` instead of `RUST_LOG` (`tuttid` reads `TUTTID_LOG`, so that a
/// client's `RUST_LOG` does not make the daemon verbose).
pub fn init_logging_from(var: &str) {
    let filter = EnvFilter::try_from_env(var).unwrap_or_else(|_| EnvFilter::new("warn"));
    let color = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(color)
        .try_init();
}
