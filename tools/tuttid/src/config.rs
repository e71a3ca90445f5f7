//! The daemon's YAML config: the socket (path, file mode, group), the
//! lease, and the drives with their allow lists and quotas. Unknown keys
//! are refused. Drive devices use the runtime's drive shapes
//! (`tutti::config::DriveConfig`).
//!
//! ```yaml
//! socket: /run/tutti.sock
//! socket_mode: "0660"          # octal, applied to the socket file
//! socket_gid: 1001             # optional: chown the socket to this group
//! lease_ms: 3000               # silence this long (no heartbeat) = dead client
//! drives:
//!   d0:
//!     device: { emulated: { namespaces: [ { capacity: 256MiB, block_size: 4096 } ], io_queues: 32 } }
//!     allow: { uids: [1000], gids: [1001] }
//!     queues_per_client: 4
//!   n0:
//!     device: { pci: { addr: "0000:01:00.0" } }   # mediated submission by default
//!     allow: { uids: [1000, 1001] }
//!     partitions: [ { uids: [1000], first_lba: 0, blocks: 1048576 }, { uids: [1001], first_lba: 1048576, blocks: 1048576 } ]
//! ```

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use tutti::config::DriveConfig;

/// The whole config.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DaemonConfig {
    /// Path of the listening Unix socket (a stale socket file there is
    /// replaced; any other file is refused).
    pub socket: PathBuf,
    /// File mode of the socket, octal string (default "0600": the
    /// daemon's user only). Connecting needs write permission on it.
    #[serde(default = "default_mode")]
    pub socket_mode: String,
    /// Group to give the socket file (chown), so a group of users can
    /// connect with mode 0660. Default: unchanged.
    #[serde(default)]
    pub socket_gid: Option<u32>,
    /// Lease in milliseconds: a client silent this long (no request, no
    /// heartbeat) is reclaimed. 100..=600000, default 3000.
    #[serde(default = "default_lease")]
    pub lease_ms: u32,
    /// Most memory registrations one uid may hold (all drives, all its
    /// connections). Default 4096.
    #[serde(default = "default_registrations")]
    pub registrations_per_client: u32,
    /// Most bytes of memory one uid may register (all drives, all its
    /// connections). Default 1 TiB.
    #[serde(default = "default_memory")]
    pub memory_per_uid: u64,
    /// Most connections one uid may hold at once. Default 64.
    #[serde(default = "default_connections_per_uid")]
    pub connections_per_uid: u32,
    /// Most connections (each a thread) the daemon serves at once.
    /// Default 1024.
    #[serde(default = "default_max_connections")]
    pub max_connections: u32,
    /// The drives, by name.
    pub drives: BTreeMap<String, DriveEntry>,
}

/// One drive the daemon owns.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DriveEntry {
    /// The device, in the runtime's drive syntax: `emulated` (the
    /// controller runs inside the daemon) or `pci` (a function bound to
    /// vfio-pci, `tutti-probe bind`). `daemon` drives are refused.
    pub device: DriveConfig,
    /// How clients ring the doorbells: `pages` (emulated drives only, the
    /// default for them: CAP.DSTRD forced to 9, each queue pair's doorbell
    /// page a memfd passed to its client) or `forwarded` (the only choice
    /// for `pci` drives and their default: clients write shadow pages
    /// that a daemon thread validates and copies to the real doorbells;
    /// docs/tuttid.md, "Forwarded doorbells").
    #[serde(default)]
    pub doorbells: Option<DoorbellMode>,
    /// Forwarded doorbells: microseconds the forwarding thread keeps
    /// polling without sleeping after the last doorbell change (0..=1000000,
    /// default 200). Longer: lower latency after a pause, more CPU; 0:
    /// it sleeps 20 µs between every pass with no change (for small VMs,
    /// where a polling thread takes a vCPU from the clients).
    #[serde(default)]
    pub forward_spin_us: Option<u32>,
    /// Who may use it.
    pub allow: Allow,
    /// Most queue pairs one uid holds on this drive at once, all its
    /// connections together (default 4).
    #[serde(default = "default_quota")]
    pub queues_per_client: u16,
    /// Namespace served (default 1).
    #[serde(default = "default_nsid")]
    pub nsid: u32,
    /// Mediated submission (docs/tuttid.md, "Mediated submission"):
    /// clients write SQEs into shadow rings and the forwarding thread
    /// checks each (opcode, NSID, LBA partition, PRPs inside the client's
    /// own registrations) before the controller sees it. Default: on for
    /// `pci` drives, off for emulated ones (which isolate clients' DMA by
    /// per-connection domains instead); `true` on an emulated drive is how
    /// CI tests it. Implies forwarded doorbells. `false` on a `pci` drive
    /// gives up DMA isolation between its clients (a warning at start).
    #[serde(default)]
    pub mediated: Option<bool>,
    /// LBA partitions of a mediated drive: each entry gives the uids and
    /// gids listed (one tenant, or a group sharing its blocks) the LBAs
    /// `first_lba .. first_lba + blocks`; entries may not overlap. Empty
    /// (the default): every allowed peer may name every LBA of the
    /// namespace. Not empty: an allowed peer on no entry gets no queue.
    /// Needs mediation (nothing else can confine LBAs).
    #[serde(default)]
    pub partitions: Vec<PartitionEntry>,
}

/// One LBA partition of a drive (see [`DriveEntry::partitions`]).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PartitionEntry {
    /// User ids whose commands are confined to it.
    #[serde(default)]
    pub uids: Vec<u32>,
    /// Group ids (primary gid from SO_PEERCRED); a uid entry wins.
    #[serde(default)]
    pub gids: Vec<u32>,
    /// First LBA.
    pub first_lba: u64,
    /// Length in logical blocks.
    pub blocks: u64,
}

impl PartitionEntry {
    /// As a [`Partition`](crate::mediate::Partition).
    pub fn range(&self) -> crate::mediate::Partition {
        crate::mediate::Partition { first: self.first_lba, blocks: self.blocks }
    }
}

/// How clients reach a drive's doorbells (see [`DriveEntry::doorbells`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DoorbellMode {
    /// The emulator's per-queue doorbell pages.
    Pages,
    /// Shadow pages forwarded by the daemon.
    Forwarded,
}

impl DriveEntry {
    /// The forwarder's polling time after a change (`forward_spin_us`).
    pub fn forward_spin(&self) -> std::time::Duration {
        self.forward_spin_us
            .map_or(crate::forward::SPIN_FOR, |us| std::time::Duration::from_micros(u64::from(us)))
    }

    /// Whether submission is mediated (explicitly, or by default for a
    /// `pci` drive).
    pub fn mediated(&self) -> bool {
        self.mediated.unwrap_or(matches!(self.device, DriveConfig::Pci(_)))
    }

    /// Whether the drive's doorbells are forwarded (explicitly, by
    /// default for a `pci` drive, or because submission is mediated).
    pub fn forwarded(&self) -> bool {
        if self.mediated() {
            return true;
        }
        match self.doorbells {
            Some(m) => m == DoorbellMode::Forwarded,
            None => matches!(self.device, DriveConfig::Pci(_)),
        }
    }
}

/// Peers allowed on a drive: a connection whose SO_PEERCRED uid is in
/// `uids` or whose gid is in `gids` may use it. Empty lists allow nobody.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Allow {
    /// User ids.
    #[serde(default)]
    pub uids: Vec<u32>,
    /// Group ids (the peer's primary gid as SO_PEERCRED reports it).
    #[serde(default)]
    pub gids: Vec<u32>,
}

impl Allow {
    /// `true` when `uid` or `gid` is listed.
    pub fn permits(&self, uid: u32, gid: u32) -> bool {
        self.uids.contains(&uid) || self.gids.contains(&gid)
    }
}

/// The partition of a peer (`uid`, `gid`) among `partitions`: a uid
/// entry first, then a gid entry; `Some(None)` (the whole namespace) when
/// there are none; `None` when there are some and none for this peer.
pub fn partition_of(
    partitions: &[PartitionEntry],
    uid: u32,
    gid: u32,
) -> Option<Option<crate::mediate::Partition>> {
    if partitions.is_empty() {
        return Some(None);
    }
    let by_uid = partitions.iter().find(|e| e.uids.contains(&uid));
    let found = by_uid.or_else(|| partitions.iter().find(|e| e.gids.contains(&gid)));
    found.map(|e| Some(e.range()))
}

fn default_mode() -> String {
    "0600".into()
}
fn default_lease() -> u32 {
    3000
}
fn default_quota() -> u16 {
    4
}
fn default_nsid() -> u32 {
    1
}
fn default_registrations() -> u32 {
    4096
}
fn default_memory() -> u64 {
    1 << 40
}
fn default_connections_per_uid() -> u32 {
    64
}
fn default_max_connections() -> u32 {
    1024
}

/// A config that cannot be used, naming the key and the rule.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file cannot be read.
    #[error("reading {path}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// YAML syntax, an unknown key, a wrong type.
    #[error("parsing the config: {0}")]
    Parse(String),
    /// A `pci` drive asks for `allow_no_iommu`. Without an IOMMU the
    /// controller's DMA addresses are host physical addresses: every PRP a
    /// client writes would reach all of host RAM (the daemon's, the
    /// kernel's, other tenants'), so a shared daemon never accepts it.
    #[error(
        "{key}: refused: without an IOMMU PRPs are host physical addresses, so any allowed client could read or write all host RAM through its queues; bind the drive to vfio-pci with the IOMMU on"
    )]
    NoIommu {
        /// YAML key path (`drives.NAME.device.pci.allow_no_iommu`).
        key: String,
    },
    /// A value breaks a rule.
    #[error("{key}: {rule}")]
    Invalid {
        /// YAML key path.
        key: String,
        /// What is wrong.
        rule: String,
    },
}

impl DaemonConfig {
    /// Reads and validates the file at `path`.
    ///
    /// # Errors
    ///
    /// [`ConfigError`].
    pub fn from_path(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|source| ConfigError::Read { path: path.to_owned(), source })?;
        Self::from_yaml(&text)
    }

    /// Parses and validates YAML text.
    ///
    /// # Errors
    ///
    /// [`ConfigError`].
    pub fn from_yaml(text: &str) -> Result<Self, ConfigError> {
        let c: Self = serde_saphyr::from_str(text).map_err(|e| ConfigError::Parse(e.to_string()))?;
        c.validate()?;
        Ok(c)
    }

    /// The socket mode as bits.
    ///
    /// # Errors
    ///
    /// [`ConfigError::Invalid`] for anything but an octal number up to 0777.
    pub fn mode(&self) -> Result<u32, ConfigError> {
        u32::from_str_radix(self.socket_mode.trim_start_matches("0o"), 8)
            .ok()
            .filter(|m| *m <= 0o777)
            .ok_or_else(|| invalid("socket_mode", "an octal file mode such as \"0660\""))
    }

    fn validate(&self) -> Result<(), ConfigError> {
        self.mode()?;
        if !(100..=600_000).contains(&self.lease_ms) {
            return Err(invalid("lease_ms", "must be 100..=600000"));
        }
        if self.registrations_per_client == 0 {
            return Err(invalid("registrations_per_client", "must be at least 1"));
        }
        if self.memory_per_uid == 0 {
            return Err(invalid("memory_per_uid", "must be at least 1"));
        }
        if !(1..=65_536).contains(&self.max_connections) {
            return Err(invalid("max_connections", "must be 1..=65536"));
        }
        if self.connections_per_uid == 0 || self.connections_per_uid > self.max_connections {
            return Err(invalid("connections_per_uid", "must be 1..=max_connections"));
        }
        if self.drives.is_empty() || self.drives.len() > 64 {
            return Err(invalid("drives", "1 to 64 drives"));
        }
        for (name, d) in &self.drives {
            let key = |k: &str| format!("drives.{name}.{k}");
            if name.is_empty()
                || name.len() > 64
                || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
            {
                return Err(invalid(&format!("drives.{name}"), "names are 1-64 of [A-Za-z0-9_-]"));
            }
            if d.forward_spin_us.is_some_and(|us| us > 1_000_000) {
                return Err(invalid(&key("forward_spin_us"), "must be 0..=1000000"));
            }
            if d.queues_per_client == 0 || d.queues_per_client > 64 {
                return Err(invalid(&key("queues_per_client"), "must be 1..=64"));
            }
            validate_mediation(name, d)?;
            match (&d.device, d.doorbells) {
                (DriveConfig::Pci(p), m) => {
                    if m == Some(DoorbellMode::Pages) {
                        return Err(invalid(
                            &key("doorbells"),
                            "pci drives need forwarded doorbells: their doorbells share one BAR0 page (CAP.DSTRD = 0), which cannot be handed to a client (docs/tuttid.md, \"Real drives\")",
                        ));
                    }
                    if p.allow_no_iommu {
                        return Err(ConfigError::NoIommu { key: key("device.pci.allow_no_iommu") });
                    }
                    if p.addr.trim().parse::<nvme_pci::PciAddr>().is_err() {
                        return Err(invalid(&key("device.pci.addr"), "a PCI address such as 0000:01:00.0"));
                    }
                }
                (DriveConfig::Emulated(_), _) => {}
                _ => {
                    return Err(invalid(
                        &key("device"),
                        "tuttid serves emulated and pci drives, not daemon drives",
                    ));
                }
            }
        }
        Ok(())
    }
}

/// `mediated` and `partitions` of drive `name`: mediation needs forwarded
/// doorbells; partitions need mediation, a uid or gid each, a nonzero
/// length without overflow, and no overlap.
fn validate_mediation(name: &str, d: &DriveEntry) -> Result<(), ConfigError> {
    let key = |k: &str| format!("drives.{name}.{k}");
    if d.mediated() && d.doorbells == Some(DoorbellMode::Pages) {
        return Err(invalid(&key("doorbells"), "mediated submission needs forwarded doorbells"));
    }
    if d.partitions.is_empty() {
        return Ok(());
    }
    if !d.mediated() {
        return Err(invalid(
            &key("partitions"),
            "LBA partitions need mediated submission (mediated: true): without it a client's SQEs reach the controller unchecked",
        ));
    }
    for (i, p) in d.partitions.iter().enumerate() {
        let k = key(&format!("partitions[{i}]"));
        if p.uids.is_empty() && p.gids.is_empty() {
            return Err(invalid(&k, "names no uid and no gid"));
        }
        if p.blocks == 0 || p.first_lba.checked_add(p.blocks).is_none() {
            return Err(invalid(&k, "blocks must be nonzero and first_lba + blocks fit in 64 bits"));
        }
        if d.partitions[..i].iter().any(|q| q.range().overlaps(&p.range())) {
            return Err(invalid(&k, "overlaps an earlier partition (list the uids of a group in one entry)"));
        }
    }
    Ok(())
}

fn invalid(key: &str, rule: &str) -> ConfigError {
    ConfigError::Invalid { key: key.to_owned(), rule: rule.to_owned() }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mediate::Partition;

    const GOOD: &str = r#"
socket: /tmp/t.sock
socket_mode: "0660"
drives:
  d0:
    device: { emulated: { namespaces: [ { capacity: 4MiB, block_size: 4096 } ] } }
    allow: { uids: [0, 1000] }
"#;

    #[test]
    fn parses_and_refuses() {
        let c = DaemonConfig::from_yaml(GOOD).unwrap();
        assert_eq!(c.mode().unwrap(), 0o660);
        assert_eq!(c.lease_ms, 3000);
        assert_eq!((c.connections_per_uid, c.max_connections, c.memory_per_uid), (64, 1024, 1 << 40));
        assert!(matches!(
            DaemonConfig::from_yaml(&format!("{GOOD}connections_per_uid: 2000\n")),
            Err(ConfigError::Invalid { key, .. }) if key == "connections_per_uid"
        ));
        let d = &c.drives["d0"];
        assert!(d.allow.permits(1000, 5) && !d.allow.permits(7, 7));
        assert_eq!(d.queues_per_client, 4);
        assert!(matches!(
            DaemonConfig::from_yaml(&GOOD.replace("0660", "9")),
            Err(ConfigError::Invalid { key, .. }) if key == "socket_mode"
        ));
        assert!(matches!(DaemonConfig::from_yaml(&format!("{GOOD}bogus: 1\n")), Err(ConfigError::Parse(_))));
        let pci = GOOD.replace(
            "{ emulated: { namespaces: [ { capacity: 4MiB, block_size: 4096 } ] } }",
            "{ pci: { addr: \"0000:01:00.0\" } }",
        );
        let c = DaemonConfig::from_yaml(&pci).unwrap();
        assert!(c.drives["d0"].forwarded());
        assert!(matches!(
            DaemonConfig::from_yaml(&pci.replace("allow:", "doorbells: pages\n    allow:")),
            Err(ConfigError::Invalid { key, .. }) if key == "drives.d0.doorbells"
        ));
        assert!(matches!(
            DaemonConfig::from_yaml(&pci.replace("0000:01:00.0", "nope")),
            Err(ConfigError::Invalid { key, .. }) if key == "drives.d0.device.pci.addr"
        ));
        let no_iommu = pci.replace("\"0000:01:00.0\"", "\"0000:01:00.0\", allow_no_iommu: true");
        let err = DaemonConfig::from_yaml(&no_iommu).unwrap_err();
        assert!(
            matches!(&err, ConfigError::NoIommu { key } if key == "drives.d0.device.pci.allow_no_iommu"),
            "{err:?}"
        );
        assert!(err.to_string().contains("physical addresses"), "{err}");
        assert!(DaemonConfig::from_yaml(
            &pci.replace("\"0000:01:00.0\"", "\"0000:01:00.0\", allow_no_iommu: false")
        )
        .is_ok());
        assert!(!DaemonConfig::from_yaml(GOOD).unwrap().drives["d0"].forwarded());
        let fwd =
            DaemonConfig::from_yaml(&GOOD.replace("allow:", "doorbells: forwarded\n    allow:")).unwrap();
        assert!(fwd.drives["d0"].forwarded());
        assert_eq!(fwd.drives["d0"].forward_spin(), crate::forward::SPIN_FOR);
        let spin = |us: &str| GOOD.replace("allow:", &format!("forward_spin_us: {us}\n    allow:"));
        assert_eq!(
            DaemonConfig::from_yaml(&spin("0")).unwrap().drives["d0"].forward_spin(),
            std::time::Duration::ZERO
        );
        assert!(matches!(
            DaemonConfig::from_yaml(&spin("2000000")),
            Err(ConfigError::Invalid { key, .. }) if key == "drives.d0.forward_spin_us"
        ));
    }

    #[test]
    fn mediation_and_partitions() {
        let with = |extra: &str| GOOD.replace("allow:", &format!("{extra}\n    allow:"));
        let key_of = |y: String| match DaemonConfig::from_yaml(&y) {
            Err(ConfigError::Invalid { key, .. }) => key,
            other => panic!("{other:?}"),
        };
        let pci = GOOD.replace(
            "{ emulated: { namespaces: [ { capacity: 4MiB, block_size: 4096 } ] } }",
            "{ pci: { addr: \"0000:01:00.0\" } }",
        );
        let c = DaemonConfig::from_yaml(&pci).unwrap();
        assert!(c.drives["d0"].mediated() && c.drives["d0"].forwarded(), "pci: mediated by default");
        assert!(!DaemonConfig::from_yaml(GOOD).unwrap().drives["d0"].mediated());
        let m = DaemonConfig::from_yaml(&with("mediated: true")).unwrap();
        assert!(m.drives["d0"].mediated() && m.drives["d0"].forwarded(), "mediation forwards doorbells");
        assert_eq!(key_of(with("mediated: true\n    doorbells: pages")), "drives.d0.doorbells");
        let part = |p: &str| with(&format!("mediated: true\n    partitions: [ {p} ]"));
        let c = DaemonConfig::from_yaml(&part(
            "{ uids: [1000], first_lba: 0, blocks: 8 }, { uids: [5], gids: [7], first_lba: 8, blocks: 8 }",
        ))
        .unwrap();
        let ps = &c.drives["d0"].partitions;
        assert_eq!(partition_of(ps, 1000, 7), Some(Some(Partition { first: 0, blocks: 8 })), "uid first");
        assert_eq!(partition_of(ps, 6, 7), Some(Some(Partition { first: 8, blocks: 8 })));
        assert_eq!(partition_of(ps, 6, 6), None, "listed nowhere");
        assert_eq!(partition_of(&[], 6, 6), Some(None), "no partitions: the whole namespace");
        for bad in [
            "{ uids: [1], first_lba: 0, blocks: 8 }, { uids: [2], first_lba: 7, blocks: 8 }",
            "{ first_lba: 0, blocks: 8 }",
            "{ uids: [1], first_lba: 0, blocks: 0 }",
            "{ uids: [1], first_lba: 18446744073709551615, blocks: 2 }",
        ] {
            assert!(key_of(part(bad)).starts_with("drives.d0.partitions["), "{bad}");
        }
        let unmediated = with("partitions: [ { uids: [1], first_lba: 0, blocks: 8 } ]");
        assert_eq!(key_of(unmediated), "drives.d0.partitions", "partitions need mediation");
    }
}
