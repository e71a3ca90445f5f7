//! The checks the schema cannot express ([`Config::validate`]): names,
//! ranges, references between sections, and sharing (one datapath per
//! drive, one store per resolver and datapath); and the key paths those
//! checks report ([`Config::datapath_key`]).

use std::collections::BTreeMap;
use std::path::PathBuf;

use super::{
    Backing, Config, ConfigError, ConfigErrorKind, DataPathConfig, DriveConfig, EmulatedDriveConfig,
    FaultActionConfig, FaultOp, LocalNvmeConfig, NamespaceConfig, RefKind, ResolverConfig, StripedConfig,
};

/// Fewest drives in a striped datapath.
pub const MIN_STRIPE_DRIVES: usize = 2;
/// Most drives in a striped datapath.
pub const MAX_STRIPE_DRIVES: usize = 4;

/// Which datapath uses each drive, by drive name.
type DriveOwners<'a> = BTreeMap<&'a str, &'a str>;

impl Config {
    /// Checks everything the schema cannot: references, ranges, sharing.
    ///
    /// Rules (the first violation found is returned, sections checked in
    /// the order drives, resolvers, datapaths, stores, each in name order):
    ///
    /// - names are non-empty;
    /// - emulated drives: at least one namespace; block size 512 or 4096;
    ///   capacity a non-zero multiple of the block size; CAP.MQES >= 1;
    ///   CAP.DSTRD <= 15; MDTS <= 31; `io_queues` >= 1; timing caps, when
    ///   present, non-zero; a write cache capacity of at least 4096 bytes;
    ///   a RAM disk name non-empty; no backing file or RAM disk shared by
    ///   two drives;
    /// - slab: slot size a non-zero multiple of 4096;
    /// - datapaths: every drive exists; the NSID exists on it; `queue_depth`
    ///   in 2..=65536 and <= CAP.MQES + 1; queues in 1..=`io_queues`; a
    ///   striped datapath has 2..=4 distinct drives and a stripe unit that is
    ///   a power of two, >= 4096 and a multiple of each namespace's block
    ///   size; no drive is used by two datapaths;
    /// - stores: the resolver and datapath exist; no resolver or datapath is
    ///   joined by two stores (they would share one byte space).
    ///
    /// # Errors
    ///
    /// The first rule broken, as a [`ConfigError`] naming its key path.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.validate_drives()?;
        self.validate_resolvers()?;
        self.validate_datapaths()?;
        self.validate_stores()
    }

    /// The key path of field `field` of datapath `datapath`:
    /// `datapaths.<datapath>.<kind>.<field>`, where `<kind>` is
    /// `local_nvme` or `striped_local_nvme` as the config says (e.g.
    /// `datapaths.fast.striped_local_nvme.stripe_unit`). For a name that is
    /// not a datapath of this config, `datapaths.<datapath>.<field>`.
    ///
    /// `field` may carry an index (`drives[2]`). For the path of a
    /// [`ConfigError`] made after validation, e.g. when a drive is opened.
    pub fn datapath_key(&self, datapath: &str, field: &str) -> String {
        match self.datapaths.get(datapath) {
            Some(dp) => format!("datapaths.{datapath}.{}.{field}", dp.yaml_tag()),
            None => format!("datapaths.{datapath}.{field}"),
        }
    }

    /// Drive names, emulated drives' own fields, and the sharing of PCI
    /// functions, backing files and RAM disks between drives.
    fn validate_drives(&self) -> Result<(), ConfigError> {
        let mut files: BTreeMap<PathBuf, &str> = BTreeMap::new();
        let mut ram_disks: BTreeMap<&str, &str> = BTreeMap::new();
        let mut functions: BTreeMap<String, &str> = BTreeMap::new();
        for (name, drive) in &self.drives {
            check_name("drives", name)?;
            match drive {
                DriveConfig::Pci(pci) => {
                    let path = format!("drives.{name}.pci.addr");
                    let Some(addr) = normalize_pci_addr(&pci.addr) else {
                        return Err(ConfigError::new(
                            path,
                            ConfigErrorKind::PciAddr { addr: pci.addr.clone() },
                        ));
                    };
                    if let Some(other) = functions.insert(addr.clone(), name) {
                        let other = other.to_owned();
                        return Err(ConfigError::new(
                            path,
                            ConfigErrorKind::SharedPciFunction { addr, other },
                        ));
                    }
                }
                DriveConfig::Emulated(emu) => {
                    emu.validate(&format!("drives.{name}.emulated"))?;
                    check_backing_shared(name, &emu.backing, &mut files, &mut ram_disks)?;
                }
                // The daemon checks the drive name and everything else.
                DriveConfig::Daemon(_) => {}
            }
        }
        Ok(())
    }

    /// Resolver names and slab slot sizes.
    fn validate_resolvers(&self) -> Result<(), ConfigError> {
        for (name, resolver) in &self.resolvers {
            check_name("resolvers", name)?;
            match resolver {
                ResolverConfig::Slab(slab) => {
                    let slot_size = slab.slot_size;
                    if slot_size.0 == 0 || slot_size.0 % 4096 != 0 {
                        return Err(ConfigError::new(
                            format!("resolvers.{name}.slab.slot_size"),
                            ConfigErrorKind::SlotSize { slot_size },
                        ));
                    }
                }
            }
        }
        Ok(())
    }

    /// Datapath names, their drives, namespaces, queues and stripe
    /// geometry, and one datapath per drive.
    fn validate_datapaths(&self) -> Result<(), ConfigError> {
        let mut owners = DriveOwners::new();
        for (name, dp) in &self.datapaths {
            check_name("datapaths", name)?;
            match dp {
                DataPathConfig::LocalNvme(c) => self.validate_local(name, c, &mut owners)?,
                DataPathConfig::StripedLocalNvme(c) => self.validate_striped(name, c, &mut owners)?,
            }
        }
        Ok(())
    }

    /// One `local_nvme` datapath.
    fn validate_local<'a>(
        &'a self,
        name: &'a str,
        c: &'a LocalNvmeConfig,
        owners: &mut DriveOwners<'a>,
    ) -> Result<(), ConfigError> {
        let base = format!("datapaths.{name}.local_nvme");
        let path = format!("{base}.drive");
        let drive = self.drive(&path, &c.drive)?;
        claim(owners, &path, &c.drive, name)?;
        check_queues(&base, "queues", c.queues, c.queue_depth, &c.drive, drive)?;
        namespace(&format!("{base}.nsid"), &c.drive, drive, c.nsid)?;
        Ok(())
    }

    /// One `striped_local_nvme` datapath: its width and stripe unit, then
    /// each member drive in stripe order.
    fn validate_striped<'a>(
        &'a self,
        name: &'a str,
        c: &'a StripedConfig,
        owners: &mut DriveOwners<'a>,
    ) -> Result<(), ConfigError> {
        let base = format!("datapaths.{name}.striped_local_nvme");
        let count = c.drives.len();
        if !(MIN_STRIPE_DRIVES..=MAX_STRIPE_DRIVES).contains(&count) {
            return Err(ConfigError::new(
                format!("{base}.drives"),
                ConfigErrorKind::StripeWidth { count, min: MIN_STRIPE_DRIVES, max: MAX_STRIPE_DRIVES },
            ));
        }
        let stripe_unit = c.stripe_unit;
        if !stripe_unit.0.is_power_of_two() || stripe_unit.0 < 4096 {
            return Err(ConfigError::new(
                format!("{base}.stripe_unit"),
                ConfigErrorKind::StripeUnit { stripe_unit },
            ));
        }
        for (i, dname) in c.drives.iter().enumerate() {
            let path = format!("{base}.drives[{i}]");
            let drive = self.drive(&path, dname)?;
            if c.drives[..i].contains(dname) {
                return Err(ConfigError::new(
                    path,
                    ConfigErrorKind::DuplicateStripeDrive { drive: dname.clone() },
                ));
            }
            claim(owners, &path, dname, name)?;
            check_queues(&base, "queues_per_drive", c.queues_per_drive, c.queue_depth, dname, drive)?;
            if let Some(ns) = namespace(&format!("{base}.nsid"), dname, drive, c.nsid)? {
                if !stripe_unit.0.is_multiple_of(u64::from(ns.block_size)) {
                    return Err(ConfigError::new(
                        format!("{base}.stripe_unit"),
                        ConfigErrorKind::StripeUnitBlockSize {
                            stripe_unit,
                            drive: dname.clone(),
                            nsid: c.nsid,
                            block_size: ns.block_size,
                        },
                    ));
                }
            }
        }
        Ok(())
    }

    /// Store names, their references, and one store per resolver and per
    /// datapath.
    fn validate_stores(&self) -> Result<(), ConfigError> {
        let mut resolver_owner: BTreeMap<&str, &str> = BTreeMap::new();
        let mut datapath_owner: BTreeMap<&str, &str> = BTreeMap::new();
        for (name, store) in &self.stores {
            check_name("stores", name)?;
            let path = format!("stores.{name}.resolver");
            let (section, kind) = (&self.resolvers, RefKind::Resolver);
            join_store(&mut resolver_owner, section, kind, path, &store.resolver, name)?;
            let path = format!("stores.{name}.datapath");
            let (section, kind) = (&self.datapaths, RefKind::DataPath);
            join_store(&mut datapath_owner, section, kind, path, &store.datapath, name)?;
        }
        Ok(())
    }

    /// The drive named `name`, referenced at key path `path`.
    fn drive(&self, path: &str, name: &str) -> Result<&DriveConfig, ConfigError> {
        self.drives.get(name).ok_or_else(|| {
            ConfigError::new(
                path,
                ConfigErrorKind::UnknownReference { kind: RefKind::Drive, name: name.to_owned() },
            )
        })
    }
}

impl EmulatedDriveConfig {
    /// Checks the drive whose fields are at key path `base`
    /// (`drives.<name>.emulated`).
    fn validate(&self, base: &str) -> Result<(), ConfigError> {
        self.validate_namespaces(base)?;
        range(base, "mqes", self.mqes.into(), 1, u16::MAX.into())?;
        range(base, "dstrd", self.dstrd.into(), 0, 15)?;
        range(base, "mdts", self.mdts.into(), 0, 31)?;
        range(base, "io_queues", self.io_queues.into(), 1, u16::MAX.into())?;
        self.validate_faults(base)?;
        if let Some(c) = &self.write_cache {
            range(&format!("{base}.write_cache"), "capacity", c.capacity.0, 4096, u64::MAX)?;
        }
        if let Backing::RamDisk(n) = &self.backing {
            if n.is_empty() {
                return Err(ConfigError::new(format!("{base}.backing"), ConfigErrorKind::EmptyRamDiskName));
            }
        }
        if let Some(t) = &self.timing {
            let base = format!("{base}.timing");
            if let Some(bw) = t.bandwidth_mb_s {
                range(&base, "bandwidth_mb_s", bw, 1, u64::MAX)?;
            }
            if let Some(iops) = t.iops {
                range(&base, "iops", iops, 1, u64::MAX)?;
            }
        }
        Ok(())
    }

    /// At least one namespace; block sizes 512 or 4096; capacities non-zero
    /// multiples of the block size.
    fn validate_namespaces(&self, base: &str) -> Result<(), ConfigError> {
        if self.namespaces.is_empty() {
            return Err(ConfigError::new(format!("{base}.namespaces"), ConfigErrorKind::NoNamespaces));
        }
        for (i, ns) in self.namespaces.iter().enumerate() {
            let NamespaceConfig { capacity, block_size, .. } = *ns;
            if block_size != 512 && block_size != 4096 {
                return Err(ConfigError::new(
                    format!("{base}.namespaces[{i}].block_size"),
                    ConfigErrorKind::BlockSize { block_size },
                ));
            }
            if capacity.0 == 0 || capacity.0 % u64::from(block_size) != 0 {
                return Err(ConfigError::new(
                    format!("{base}.namespaces[{i}].capacity"),
                    ConfigErrorKind::Capacity { capacity, block_size },
                ));
            }
        }
        Ok(())
    }

    /// Fault rules: non-empty LBA ranges, none for a Flush, SCT in 0..=7.
    fn validate_faults(&self, base: &str) -> Result<(), ConfigError> {
        for (i, f) in self.faults.iter().enumerate() {
            let path = format!("{base}.faults[{i}]");
            if f.op == Some(FaultOp::Flush) && f.lba.is_some() {
                return Err(ConfigError::new(format!("{path}.lba"), ConfigErrorKind::FaultFlushLba));
            }
            if let Some([start, end]) = f.lba {
                if start >= end {
                    return Err(ConfigError::new(
                        format!("{path}.lba"),
                        ConfigErrorKind::FaultRange { start, end },
                    ));
                }
            }
            if let FaultActionConfig::Fail { sct, .. } = f.action {
                range(&format!("{path}.action.fail"), "sct", sct.into(), 0, 7)?;
            }
        }
        Ok(())
    }
}

/// Refuses a backing file or RAM disk that an earlier drive (in name
/// order) already uses: two drives on one store would overwrite each
/// other's blocks.
fn check_backing_shared<'a>(
    name: &'a str,
    backing: &'a Backing,
    files: &mut BTreeMap<PathBuf, &'a str>,
    ram_disks: &mut BTreeMap<&'a str, &'a str>,
) -> Result<(), ConfigError> {
    let path = || format!("drives.{name}.emulated.backing");
    match backing {
        Backing::File(f) => {
            // Compare canonical paths where the file exists.
            let key = std::fs::canonicalize(f).unwrap_or_else(|_| f.clone());
            if let Some(other) = files.insert(key, name) {
                let kind = ConfigErrorKind::SharedBackingFile { file: f.clone(), other: other.to_owned() };
                return Err(ConfigError::new(path(), kind));
            }
        }
        Backing::RamDisk(disk) => {
            if let Some(other) = ram_disks.insert(disk, name) {
                let kind = ConfigErrorKind::SharedRamDisk { name: disk.clone(), other: other.to_owned() };
                return Err(ConfigError::new(path(), kind));
            }
        }
        Backing::Ram | Backing::Null => {}
    }
    Ok(())
}

/// Refuses an empty name in section `section`.
fn check_name(section: &str, name: &str) -> Result<(), ConfigError> {
    if name.is_empty() {
        return Err(ConfigError::new(section, ConfigErrorKind::EmptyName));
    }
    Ok(())
}

/// Refuses `value` of `{base}.{field}` outside `min..=max`.
fn range(base: &str, field: &str, value: u64, min: u64, max: u64) -> Result<(), ConfigError> {
    if (min..=max).contains(&value) {
        Ok(())
    } else {
        Err(ConfigError::new(format!("{base}.{field}"), ConfigErrorKind::OutOfRange { value, min, max }))
    }
}

/// Records `datapath` as the owner of `drive`, refusing a second owner.
fn claim<'a>(
    owners: &mut DriveOwners<'a>,
    path: &str,
    drive: &'a str,
    datapath: &'a str,
) -> Result<(), ConfigError> {
    if let Some(owner) = owners.insert(drive, datapath) {
        return Err(ConfigError::new(
            path,
            ConfigErrorKind::DriveAlreadyOwned { drive: drive.to_owned(), owner: owner.to_owned() },
        ));
    }
    Ok(())
}

/// Records `store` as the one store joining `name`, a key of `section`
/// (the resolvers or the datapaths) referenced at key path `path`; refuses
/// a name that is not in `section` or that a second store joins.
fn join_store<'a, V>(
    owners: &mut BTreeMap<&'a str, &'a str>,
    section: &BTreeMap<String, V>,
    kind: RefKind,
    path: String,
    name: &'a str,
    store: &'a str,
) -> Result<(), ConfigError> {
    if !section.contains_key(name) {
        return Err(ConfigError::new(
            path,
            ConfigErrorKind::UnknownReference { kind, name: name.to_owned() },
        ));
    }
    if let Some(owner) = owners.insert(name, store) {
        let (name, owner) = (name.to_owned(), owner.to_owned());
        return Err(ConfigError::new(path, ConfigErrorKind::AlreadyInStore { kind, name, owner }));
    }
    Ok(())
}

/// Checks queue count and depth of a datapath against one of its drives.
fn check_queues(
    base: &str,
    queues_field: &str,
    queues: u16,
    queue_depth: u32,
    drive_name: &str,
    drive: &DriveConfig,
) -> Result<(), ConfigError> {
    range(base, queues_field, queues.into(), 1, u16::MAX.into())?;
    range(base, "queue_depth", queue_depth.into(), 2, 65536)?;
    match drive {
        DriveConfig::Emulated(emu) => {
            let max = u32::from(emu.mqes) + 1;
            if queue_depth > max {
                return Err(ConfigError::new(
                    format!("{base}.queue_depth"),
                    ConfigErrorKind::QueueDepthExceedsMqes { queue_depth, drive: drive_name.to_owned(), max },
                ));
            }
            if queues > emu.io_queues {
                return Err(ConfigError::new(
                    format!("{base}.{queues_field}"),
                    ConfigErrorKind::QueuesExceedIoQueues {
                        queues,
                        drive: drive_name.to_owned(),
                        io_queues: emu.io_queues,
                    },
                ));
            }
        }
        // MQES and the queue grant are read from the controller at start:
        // the depth is clamped to CAP.MQES + 1 and the queue count to what
        // Set Features grants, with a warning.
        DriveConfig::Pci(_) | DriveConfig::Daemon(_) => {}
    }
    Ok(())
}

/// `dddd:bb:dd.f` (lower case) for a PCI address written as `dddd:bb:dd.f`
/// or `bb:dd.f` (domain 0), surrounding spaces allowed; `None` when
/// malformed. The parsing is `nvme_pci::PciAddr`'s.
pub fn normalize_pci_addr(addr: &str) -> Option<String> {
    addr.trim().parse::<nvme_pci::PciAddr>().ok().map(|a| a.to_string())
}

/// Looks up namespace `nsid` of a drive. `Ok(None)` for drive kinds whose
/// namespaces are only known at run time (`pci`).
fn namespace<'a>(
    path: &str,
    drive_name: &str,
    drive: &'a DriveConfig,
    nsid: u32,
) -> Result<Option<&'a NamespaceConfig>, ConfigError> {
    match drive {
        DriveConfig::Emulated(emu) => {
            let ns = (nsid as usize).checked_sub(1).and_then(|i| emu.namespaces.get(i));
            match ns {
                Some(ns) => Ok(Some(ns)),
                None => Err(ConfigError::new(
                    path,
                    ConfigErrorKind::UnknownNamespace {
                        drive: drive_name.to_owned(),
                        nsid,
                        namespaces: emu.namespaces.len(),
                    },
                )),
            }
        }
        DriveConfig::Pci(_) | DriveConfig::Daemon(_) => Ok(None),
    }
}
