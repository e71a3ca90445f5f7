//! `tutti-probe bind` and `tutti-probe unbind`.

use nvme_pci::{bind_vfio, enumerate, unbind_to_kernel, PciAddr, PciError, VFIO_PCI};

use crate::{Ctx, Failure, Outcome};

/// Arguments of `bind`.
#[derive(Debug, clap::Args)]
pub struct BindArgs {
    /// PCI addresses (0000:00:04.0 or 00:04.0).
    #[arg(value_name = "ADDR", conflicts_with = "all_unused")]
    addrs: Vec<PciAddr>,
    /// Every NVMe function not on vfio-pci and not in use.
    #[arg(long)]
    all_unused: bool,
    /// Take drives that are mounted, stacked or open anyway (never the one
    /// holding the root filesystem).
    #[arg(long)]
    force: bool,
}

/// Arguments of `unbind`.
#[derive(Debug, clap::Args)]
pub struct UnbindArgs {
    /// PCI addresses to give back to the kernel nvme driver.
    #[arg(value_name = "ADDR", required = true)]
    addrs: Vec<PciAddr>,
}

/// Runs `bind`.
pub fn run_bind(ctx: &Ctx, args: BindArgs) -> Outcome {
    let targets: Vec<PciAddr> = if args.all_unused {
        let mut v = Vec::new();
        for f in enumerate(&ctx.sysfs)? {
            if f.driver.as_deref() == Some(VFIO_PCI) {
                println!("{}: skipped: already on vfio-pci", f.addr);
                continue;
            }
            let uses = f.uses();
            if !uses.is_empty() {
                let u: Vec<String> = uses.iter().map(ToString::to_string).collect();
                println!("{}: skipped: in use: {}", f.addr, u.join("; "));
                continue;
            }
            v.push(f.addr);
        }
        if v.is_empty() {
            println!("nothing to bind");
        }
        v
    } else if args.addrs.is_empty() {
        return Err(Failure::Usage("bind needs PCI addresses or --all-unused".into()));
    } else {
        args.addrs
    };
    each_addr(targets, "bind", |addr| {
        let o = bind_vfio(&ctx.sysfs, addr, args.force)?;
        if o.unchanged {
            println!("{addr}: already on vfio-pci");
        } else {
            println!("{addr}: {} -> vfio-pci", o.previous.as_deref().unwrap_or("no driver"));
            for u in &o.forced_over {
                println!("{addr}: WARNING: forced while in use: {u}");
            }
        }
        Ok(())
    })
}

/// Runs `unbind`.
pub fn run_unbind(ctx: &Ctx, args: UnbindArgs) -> Outcome {
    each_addr(args.addrs, "unbind", |addr| {
        let o = unbind_to_kernel(&ctx.sysfs, addr)?;
        if o.unchanged {
            println!("{addr}: already on nvme");
        } else {
            println!("{addr}: {} -> nvme", o.previous.as_deref().unwrap_or("no driver"));
        }
        Ok(())
    })
}

/// Runs `f` on every address, reporting each failure and going on; fails
/// (exit 1) naming the addresses `verb` failed for.
fn each_addr(
    addrs: Vec<PciAddr>,
    verb: &str,
    mut f: impl FnMut(&PciAddr) -> Result<(), PciError>,
) -> Outcome {
    let mut failed = Vec::new();
    for addr in addrs {
        if let Err(e) = f(&addr) {
            report(&addr, &e);
            failed.push(addr.to_string());
        }
    }
    if failed.is_empty() {
        Ok(())
    } else {
        Err(Failure::Reported(format!("{verb} failed for {}", failed.join(", "))))
    }
}

fn report(addr: &PciAddr, e: &PciError) {
    // Most errors name the address already; do not say it twice.
    let msg = e.to_string();
    if msg.starts_with(&addr.to_string()) {
        eprintln!("tutti-probe: error: {msg}");
    } else {
        eprintln!("tutti-probe: error: {addr}: {msg}");
    }
    let mut src = std::error::Error::source(e);
    while let Some(s) = src {
        eprintln!("  caused by: {s}");
        src = s.source();
    }
}
