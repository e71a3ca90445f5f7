//! Assembly: a validated [`Config`] becomes drives (devices started,
//! controllers up, I/O queues created), datapaths, resolvers and stores,
//! with each store's resolver/datapath binding checked.
//!
//! Checks that need an opened drive (a stripe unit against a member's LBA
//! size, a namespace the controller lacks) are reported as
//! [`crate::config::ConfigError`]s naming the YAML key, like the checks
//! `Config::validate` makes before any drive is touched.
//!
//! Locks: none (nothing is shared yet).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize};
use std::sync::{Arc, Mutex, RwLock};

use gpu_io::Gpu;

use super::{DataPathFacts, Runtime, Store};
use crate::binding::Resolver;
use crate::config::{
    Config, ConfigError, ConfigErrorKind, DataPathConfig, Execution, RefKind, ResolverConfig,
};
use crate::datapath::{DataPath, LocalNvme, StripedLocalNvme};
use crate::drive::{Drive, DriveUse};
use crate::error::Error;
use crate::handle::{next_runtime_id, HandleKind, HandleTable, RUNTIME_ID_MAX};
use crate::resolver::Slab;

impl Runtime {
    /// Assembles a runtime: validates `config`, starts every drive, brings
    /// up its controller and queues, builds the resolvers and datapaths, and
    /// checks that each store's resolver and datapath agree on their
    /// binding.
    ///
    /// # Errors
    ///
    /// [`Error::Config`] (with the key path) for a refused config, a stripe
    /// unit that is not a multiple of a member drive's LBA size or a
    /// namespace a drive lacks; [`Error::BindingMismatch`]; the drive's
    /// errors ([`Error::Emulator`], [`Error::Pci`], [`Error::Controller`],
    /// [`Error::Gpu`]).
    pub fn from_config(config: Config) -> Result<Self, Error> {
        config.validate()?;
        let usage = drive_usage(&config);
        // A GPU only when some datapath asks for GPU execution.
        let gpu = if usage.values().any(|u| u.execution == Execution::Gpu) {
            Some(Arc::new(Gpu::open(config.gpu.ordinal as usize).map_err(|source| Error::Gpu {
                context: format!("opening GPU {} (config gpu.ordinal)", config.gpu.ordinal),
                source,
            })?))
        } else {
            None
        };
        let mut drives = Vec::new();
        for (i, (name, cfg)) in config.drives.iter().enumerate() {
            drives.push(Arc::new(Drive::start(
                i,
                name,
                cfg,
                usage.get(name.as_str()).cloned(),
                gpu.as_deref(),
            )?));
        }
        let lanes = match &gpu {
            Some(g) => {
                // The fewest GPU queues of any drive: each lane's queue is
                // then its own on every drive (with more lanes than a
                // drive's queues, two lanes would share one there).
                let n = drives.iter().filter_map(|d| d.gpu.as_ref()).map(|q| q.queues.len()).min();
                let lanes = super::lanes::GpuLanes::new(g, n.unwrap_or(1))
                    .map_err(|source| Error::Gpu { context: "creating launch streams".into(), source })?;
                Some(lanes)
            }
            None => None,
        };
        let (datapaths, dp_index) = build_datapaths(&config, &drives)?;
        let (stores, store_index) = build_stores(&config, &datapaths, &dp_index)?;
        let id = next_runtime_id().ok_or(Error::TooManyRuntimes { limit: RUNTIME_ID_MAX })?;
        Ok(Self {
            drives,
            datapaths,
            stores,
            store_index,
            targets: RwLock::new(HandleTable::new(id, HandleKind::Target)),
            memory: RwLock::new(HandleTable::new(id, HandleKind::Memory)),
            ops: Mutex::new(HandleTable::new(id, HandleKind::Operation)),
            shutting_down: AtomicBool::new(false),
            shut_down: AtomicBool::new(false),
            shutdown_hooks: super::hooks::ShutdownHooks::default(),
            queues_gone: AtomicBool::new(false),
            submitters: AtomicUsize::new(0),
            lanes,
            gpu,
            gpu_budget_ns: AtomicU64::new(super::GPU_COMMAND_BUDGET.as_nanos() as u64),
            gpu_budget_max_ns: AtomicU64::new(super::GPU_COMMAND_BUDGET.as_nanos() as u64),
            gpu_ordinal: config.gpu.ordinal,
            late_completions: AtomicU64::new(0),
        })
    }
}

/// Which datapath uses which drive, and how (validation made each drive
/// belong to one datapath at most).
fn drive_usage(config: &Config) -> HashMap<&str, DriveUse> {
    let mut usage = HashMap::new();
    for (name, dp) in &config.datapaths {
        let nsid_key = config.datapath_key(name, "nsid");
        match dp {
            DataPathConfig::LocalNvme(l) => {
                usage.insert(
                    l.drive.as_str(),
                    DriveUse {
                        nsid: l.nsid,
                        nsid_key,
                        queues: l.queues,
                        queue_depth: l.queue_depth,
                        execution: l.execution,
                    },
                );
            }
            DataPathConfig::StripedLocalNvme(s) => {
                for d in &s.drives {
                    usage.insert(
                        d.as_str(),
                        DriveUse {
                            nsid: s.nsid,
                            nsid_key: nsid_key.clone(),
                            queues: s.queues_per_drive,
                            queue_depth: s.queue_depth,
                            execution: s.execution,
                        },
                    );
                }
            }
        }
    }
    usage
}

type DataPaths = (Vec<Arc<dyn DataPath>>, HashMap<String, usize>);

fn build_datapaths(config: &Config, drives: &[Arc<Drive>]) -> Result<DataPaths, Error> {
    let get_drive = |name: &String| drives.iter().find(|d| &d.name == name).cloned();
    let mut datapaths: Vec<Arc<dyn DataPath>> = Vec::new();
    let mut dp_index = HashMap::new();
    for (name, cfg) in &config.datapaths {
        let dp: Arc<dyn DataPath> = match cfg {
            DataPathConfig::LocalNvme(l) => {
                let d = get_drive(&l.drive)
                    .ok_or_else(|| unknown(config.datapath_key(name, "drive"), RefKind::Drive, &l.drive))?;
                Arc::new(LocalNvme::new(name, d))
            }
            DataPathConfig::StripedLocalNvme(s) => {
                let ds = s
                    .drives
                    .iter()
                    .enumerate()
                    .map(|(i, n)| {
                        get_drive(n).ok_or_else(|| {
                            unknown(config.datapath_key(name, &format!("drives[{i}]")), RefKind::Drive, n)
                        })
                    })
                    .collect::<Result<Vec<Arc<Drive>>, Error>>()?;
                // PCI drives' LBA sizes are known only now (config
                // validation checked the emulated ones).
                if let Some(d) =
                    ds.iter().find(|d| !s.stripe_unit.0.is_multiple_of(u64::from(d.ns.block_size)))
                {
                    return Err(ConfigError::new(
                        config.datapath_key(name, "stripe_unit"),
                        ConfigErrorKind::StripeUnitVsLbaSize {
                            unit: s.stripe_unit.0,
                            drive: d.name.clone(),
                            lba_size: d.ns.block_size,
                        },
                    )
                    .into());
                }
                let stripe = StripedLocalNvme::new(name, ds, s.stripe_unit.0).ok_or_else(|| {
                    ConfigError::new(
                        config.datapath_key(name, "stripe_unit"),
                        ConfigErrorKind::StripeUnit { stripe_unit: s.stripe_unit },
                    )
                })?;
                Arc::new(stripe)
            }
        };
        dp_index.insert(name.clone(), datapaths.len());
        datapaths.push(dp);
    }
    Ok((datapaths, dp_index))
}

/// A reference `Config::validate` refuses (so this is not reached after
/// it): the unknown `kind` `name` at `path`.
fn unknown(path: String, kind: RefKind, name: &str) -> Error {
    ConfigError::new(path, ConfigErrorKind::UnknownReference { kind, name: name.to_owned() }).into()
}

type Stores = (Vec<Store>, HashMap<String, usize>);

fn build_stores(
    config: &Config,
    datapaths: &[Arc<dyn DataPath>],
    dp_index: &HashMap<String, usize>,
) -> Result<Stores, Error> {
    let mut stores = Vec::new();
    let mut store_index = HashMap::new();
    for (name, sc) in &config.stores {
        let (resolver, slot_size): (Box<dyn Resolver>, Option<u64>) = match config
            .resolvers
            .get(&sc.resolver)
            .ok_or_else(|| unknown(format!("stores.{name}.resolver"), RefKind::Resolver, &sc.resolver))?
        {
            ResolverConfig::Slab(s) => {
                let slab = Slab::new(s.slot_size.0).ok_or_else(|| {
                    ConfigError::new(
                        format!("resolvers.{}.slab.slot_size", sc.resolver),
                        ConfigErrorKind::SlotSize { slot_size: s.slot_size },
                    )
                })?;
                (Box::new(slab), Some(s.slot_size.0))
            }
        };
        let datapath = *dp_index
            .get(&sc.datapath)
            .ok_or_else(|| unknown(format!("stores.{name}.datapath"), RefKind::DataPath, &sc.datapath))?;
        check_binding(name, &sc.resolver, &*resolver, &*datapaths[datapath])?;
        store_index.insert(name.clone(), stores.len());
        let dp = &datapaths[datapath];
        let facts = DataPathFacts {
            block_size: dp.block_size(),
            gpu: dp.drives().first().is_some_and(|d| d.gpu.is_some()),
            single_drive: dp.single_drive().map(|d| d.index),
        };
        stores.push(Store { name: name.clone(), resolver, datapath, slot_size, facts });
    }
    Ok((stores, store_index))
}

pub(super) fn check_binding(
    store: &str,
    resolver_name: &str,
    resolver: &dyn Resolver,
    dp: &dyn DataPath,
) -> Result<(), Error> {
    let (p, c) = (resolver.binding(), dp.binding());
    if p != c {
        return Err(Error::BindingMismatch {
            store: store.to_owned(),
            resolver: resolver_name.to_owned(),
            datapath: dp.name().to_owned(),
            produced: p.to_string(),
            consumed: c.to_string(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::binding::{Binding, Extent, ResolveError};
    use crate::datapath::Piece;

    #[derive(Debug)]
    struct OtherResolver;
    impl Resolver for OtherResolver {
        fn binding(&self) -> Binding {
            Binding::of::<Extent>(2)
        }
        fn resolve(&self, key: &str, _: u64) -> Result<Extent, ResolveError> {
            Err(ResolveError::NotASlotNumber { key: key.to_owned() })
        }
    }

    #[derive(Debug)]
    struct FakePath;
    impl DataPath for FakePath {
        fn name(&self) -> &str {
            "fake"
        }
        fn binding(&self) -> Binding {
            Binding::of::<Extent>(crate::binding::EXTENT_V1)
        }
        fn capacity(&self) -> u64 {
            0
        }
        fn block_size(&self) -> u32 {
            512
        }
        fn drives(&self) -> &[Arc<Drive>] {
            &[]
        }
        fn for_each_piece(&self, _: u64, _: u64, _: &mut dyn FnMut(Piece)) {}
    }

    #[test]
    fn mismatched_binding_version_is_refused() {
        let e = check_binding("kv", "r", &OtherResolver, &FakePath).unwrap_err();
        let msg = e.to_string();
        assert!(matches!(e, Error::BindingMismatch { .. }));
        assert!(msg.contains("@2") && msg.contains("@1"), "{msg}");
        check_binding("kv", "slab", &Slab::new(4096).unwrap(), &FakePath).unwrap();
    }
}
