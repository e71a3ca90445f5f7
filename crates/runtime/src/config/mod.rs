//! The runtime's YAML configuration: the [`Config`] type and its parse,
//! load and print entry points. The section entries' types are in
//! `schema.rs`, [`ByteSize`] in `size.rs`, the semantic checks in
//! `validate.rs`, [`ConfigError`] in `error.rs`; all are re-exported here.
//!
//! A config describes a graph of four kinds of named objects:
//!
//! - **drives** (resources): NVMe controllers, emulated
//!   ([`DriveConfig::Emulated`]) or PCI functions bound to vfio-pci
//!   ([`DriveConfig::Pci`]);
//! - **resolvers**: turn a key into byte extents of a datapath's byte space
//!   ([`ResolverConfig::Slab`]);
//! - **datapaths**: turn byte requests into NVMe commands on one drive
//!   ([`DataPathConfig::LocalNvme`]) or striped over 2 to 4 drives
//!   ([`DataPathConfig::StripedLocalNvme`]);
//! - **stores**: join one resolver to one datapath ([`StoreConfig`]).
//!
//! Every section is a map keyed by name; every drive, resolver and datapath
//! entry is an externally tagged single-key map naming its kind:
//!
//! ```yaml
//! drives:
//!   d0:
//!     emulated:
//!       namespaces:
//!         - { capacity: 1GiB, block_size: 4096 }
//!       backing: ram
//!   d1:
//!     emulated:
//!       namespaces: [ { capacity: 1GiB, block_size: 4096 } ]
//! resolvers:
//!   kv:
//!     slab: { slot_size: 1MiB }
//! datapaths:
//!   stripe:
//!     striped_local_nvme: { drives: [d0, d1], stripe_unit: 128KiB }
//! stores:
//!   kv: { resolver: kv, datapath: stripe }
//! ```
//!
//! The config fails closed: an unknown key, a duplicate key, a map naming two
//! kinds at once, or a byte size with a unit other than `B`, `KiB`, `MiB`,
//! `GiB`, `TiB` is refused while parsing; dangling references, out-of-range
//! values and shared drives are refused by [`Config::validate`], which
//! [`Config::from_yaml_str`] and [`Config::from_path`] always run. Every
//! [`ConfigError`] names the key path of the offending value
//! ([`ConfigError::path`]), e.g. `drives.d0.emulated.mqes` or
//! `datapaths.stripe.striped_local_nvme.drives[2]`, and says what is wrong
//! with it ([`ConfigError::kind`], a [`ConfigErrorKind`] to match on).

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

mod error;
mod schema;
mod size;
mod validate;

pub use error::{ConfigError, ConfigErrorKind, RefKind};
use schema::{default_nsid, default_queue_depth, default_queues, default_stripe_unit};
pub use schema::{
    Backing, DaemonDriveConfig, DataPathConfig, DriveConfig, EmulatedDriveConfig, Execution,
    FaultActionConfig, FaultConfig, FaultOp, GpuConfig, LocalNvmeConfig, MetadataConfig, NamespaceConfig,
    PciDriveConfig, ResolverConfig, SlabConfig, StoreConfig, StripedConfig, TimingConfig, WriteCacheConfig,
};
pub use size::{ByteSize, ByteSizeParseError};
pub use validate::{normalize_pci_addr, MAX_STRIPE_DRIVES, MIN_STRIPE_DRIVES};

/// The whole runtime configuration: four maps keyed by object name, and
/// the GPU GPU-executed datapaths use.
///
/// Every section may be omitted (empty). Names are non-empty strings; the
/// map order (sorted by name) is the order in which the runtime assembles
/// objects.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// NVMe drives (resources), by name.
    #[serde(default)]
    pub drives: BTreeMap<String, DriveConfig>,
    /// Resolvers (key -> byte extents), by name.
    #[serde(default)]
    pub resolvers: BTreeMap<String, ResolverConfig>,
    /// Datapaths (byte requests -> NVMe commands), by name.
    #[serde(default)]
    pub datapaths: BTreeMap<String, DataPathConfig>,
    /// Stores (one resolver joined to one datapath), by name.
    #[serde(default)]
    pub stores: BTreeMap<String, StoreConfig>,
    /// The GPU of `execution: gpu` datapaths (YAML `gpu: { ordinal: 1 }`;
    /// default GPU 0).
    #[serde(default, skip_serializing_if = "GpuConfig::is_default")]
    pub gpu: GpuConfig,
}

impl Config {
    /// Parses a YAML document and [validates](Config::validate) it.
    ///
    /// # Errors
    ///
    /// [`ConfigErrorKind::Parse`] (with key path, line and column) for
    /// malformed YAML or a schema mismatch; any other kind from
    /// [`Config::validate`].
    pub fn from_yaml_str(yaml: &str) -> Result<Config, ConfigError> {
        let config = Self::parse_yaml_str(yaml)?;
        config.validate()?;
        Ok(config)
    }

    /// Reads a YAML file and parses and validates it as
    /// [`Config::from_yaml_str`] does.
    ///
    /// # Errors
    ///
    /// [`ConfigErrorKind::Io`] (path: the file's) if the file cannot be
    /// read, else as [`Config::from_yaml_str`].
    pub fn from_path(path: impl AsRef<Path>) -> Result<Config, ConfigError> {
        let path = path.as_ref();
        let yaml = std::fs::read_to_string(path).map_err(|source| {
            let kind = ConfigErrorKind::Io { file: path.to_owned(), source };
            ConfigError::new(path.display().to_string(), kind)
        })?;
        Self::from_yaml_str(&yaml)
    }

    /// Parses without semantic validation (schema errors only).
    fn parse_yaml_str(yaml: &str) -> Result<Config, ConfigError> {
        let mut key_path: Option<String> = None;
        let result = serde_saphyr::with_deserializer_from_str(yaml, |de| {
            serde_path_to_error::deserialize(de).map_err(|e| {
                key_path = Some(e.path().to_string());
                e.into_inner()
            })
        });
        result.map_err(|e| {
            let location = e.location();
            let message = e.without_snippet().to_string();
            // Keep the message on one line, and drop serde-saphyr's own
            // " at line X, column Y" suffix: the fields carry it.
            let mut message = message.lines().next().unwrap_or_default().to_owned();
            if let Some(l) = location {
                let suffix = format!(" at line {}, column {}", l.line(), l.column());
                if message.ends_with(&suffix) {
                    message.truncate(message.len() - suffix.len());
                }
            }
            // serde-saphyr's wording for a second key after an externally
            // tagged enum's variant (`emulated: ..` next to `pci: ..`).
            if message.starts_with("expected end of mapping after enum variant") {
                message.push_str("; an entry names exactly one kind (mixed kind keys are refused)");
            }
            ConfigError::new(
                key_path.unwrap_or_else(|| ".".to_owned()),
                ConfigErrorKind::Parse {
                    line: location.map(|l| l.line() as u32),
                    column: location.map(|l| l.column() as u32),
                    message,
                },
            )
        })
    }

    /// Prints the config back as YAML; [`Config::from_yaml_str`] parses the
    /// output to an equal config.
    ///
    /// # Errors
    ///
    /// The serializer's error, which does not happen for these types.
    pub fn to_yaml_string(&self) -> Result<String, serde_saphyr::SerializeError> {
        serde_saphyr::to_string(self)
    }

    /// The bench's default config: `drives` emulated RAM drives named
    /// `d0`, `d1`, ... with one namespace of `capacity_per_drive` bytes in
    /// 4096-byte blocks (all other drive fields at their defaults), one slab
    /// resolver `kv` with `slot_size`-byte slots, and one store `kv`.
    ///
    /// With 2 or more drives the datapath is `stripe`, a
    /// `striped_local_nvme` over all of them with a 128 KiB stripe unit; with
    /// one drive it is `local`, a `local_nvme` on `d0`. The result is not
    /// validated: more than 4 drives, no drive, or sizes that are not
    /// multiples of 4096 are reported by [`Config::validate`].
    pub fn builtin_striped_ram(drives: usize, capacity_per_drive: u64, slot_size: u64) -> Config {
        let names: Vec<String> = (0..drives).map(|i| format!("d{i}")).collect();
        let drive = DriveConfig::Emulated(EmulatedDriveConfig::with_namespaces(vec![NamespaceConfig {
            capacity: ByteSize(capacity_per_drive),
            block_size: 4096,
            metadata: None,
        }]));
        let (dp_name, datapath) = if drives == 1 {
            (
                "local",
                DataPathConfig::LocalNvme(LocalNvmeConfig {
                    drive: names[0].clone(),
                    nsid: default_nsid(),
                    queues: default_queues(),
                    queue_depth: default_queue_depth(),
                    execution: Execution::Cpu,
                }),
            )
        } else {
            (
                "stripe",
                DataPathConfig::StripedLocalNvme(StripedConfig {
                    drives: names.clone(),
                    nsid: default_nsid(),
                    stripe_unit: default_stripe_unit(),
                    queues_per_drive: default_queues(),
                    queue_depth: default_queue_depth(),
                    execution: Execution::Cpu,
                }),
            )
        };
        Config {
            drives: names.into_iter().map(|n| (n, drive.clone())).collect(),
            resolvers: BTreeMap::from([(
                "kv".to_owned(),
                ResolverConfig::Slab(SlabConfig { slot_size: ByteSize(slot_size) }),
            )]),
            datapaths: BTreeMap::from([(dp_name.to_owned(), datapath)]),
            stores: BTreeMap::from([(
                "kv".to_owned(),
                StoreConfig { resolver: "kv".to_owned(), datapath: dp_name.to_owned() },
            )]),
            gpu: GpuConfig::default(),
        }
    }
}

#[cfg(test)]
mod tests;
