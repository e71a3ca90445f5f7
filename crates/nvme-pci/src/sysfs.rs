//! A view of sysfs and procfs rooted at a path, so that tests can build a
//! fake tree in a temporary directory.
//!
//! Files read (Linux ABI, `Documentation/ABI/testing/sysfs-bus-pci`,
//! `sysfs-block`, `proc(5)`): `sys/bus/pci/devices/<addr>/{class,vendor,
//! device,numa_node,resource,driver,iommu_group,driver_override}`,
//! `sys/bus/pci/drivers/<driver>/{bind,unbind}`, `sys/bus/pci/drivers_probe`,
//! `sys/block/<dev>/{size,dev,holders/,<part>/}`, `proc/self/mountinfo`
//! (or `proc/mounts`), `proc/swaps`, `proc/<pid>/{fd/*,comm}`.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use crate::addr::PciAddr;
use crate::error::{errno_hint, PciError};

/// sysfs, procfs and `/dev` under one root directory.
#[derive(Debug)]
pub struct Sysfs {
    root: PathBuf,
    settle: Duration,
    writes: Mutex<Vec<(PathBuf, String)>>,
}

/// One mounted filesystem (a line of `/proc/self/mountinfo`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mount {
    /// `major:minor` of the mounted device (field 3).
    pub dev: String,
    /// Mount point (field 5, octal escapes decoded).
    pub mount_point: String,
    /// Mount source (after the `-` separator, e.g. `/dev/nvme0n1p2`).
    pub source: String,
}

impl Sysfs {
    /// The running system: root `/`.
    pub fn system() -> Self {
        Self::with_root("/")
    }

    /// A tree rooted at `root` (tests use a temporary directory).
    pub fn with_root(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into(), settle: Duration::from_secs(2), writes: Mutex::new(Vec::new()) }
    }

    /// How long bind/unbind wait for the `driver` link to show the new
    /// driver after writing `drivers_probe` (default 2 s; the kernel probes
    /// synchronously, so this only covers slow probes).
    pub fn with_settle_time(mut self, settle: Duration) -> Self {
        self.settle = settle;
        self
    }

    /// The root directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    pub(crate) fn settle_time(&self) -> Duration {
        self.settle
    }

    /// `<root>/<rel>`; `rel` is relative (no leading `/`).
    pub fn path(&self, rel: &str) -> PathBuf {
        self.root.join(rel.trim_start_matches('/'))
    }

    /// `<root>/sys/bus/pci/devices/<addr>`.
    pub fn pci_device_dir(&self, addr: &PciAddr) -> PathBuf {
        self.path(&format!("sys/bus/pci/devices/{addr}"))
    }

    /// `<root>/sys/bus/pci/drivers/<driver>`.
    pub fn pci_driver_dir(&self, driver: &str) -> PathBuf {
        self.path(&format!("sys/bus/pci/drivers/{driver}"))
    }

    /// Every attribute write this value made, in order: (path, value).
    pub fn writes(&self) -> Vec<(PathBuf, String)> {
        self.writes.lock().map(|w| w.clone()).unwrap_or_default()
    }

    /// Writes `value` to the attribute at `path` (as `echo value > path`).
    pub fn write_attr(&self, path: &Path, value: &str) -> Result<(), PciError> {
        if let Ok(mut w) = self.writes.lock() {
            w.push((path.to_owned(), value.to_owned()));
        }
        fs::write(path, value).map_err(|source| PciError::Write {
            path: path.to_owned(),
            value: value.trim().to_owned(),
            hint: errno_hint(&source, &path.display().to_string()),
            source,
        })
    }

    /// Reads a whole file as text, trimmed.
    pub fn read_trimmed(&self, path: &Path) -> Result<String, PciError> {
        fs::read_to_string(path)
            .map(|s| s.trim().to_owned())
            .map_err(|source| PciError::Read { path: path.to_owned(), source })
    }

    /// Reads a file as text, `None` when it does not exist or is unreadable.
    pub fn read_opt(&self, path: &Path) -> Option<String> {
        fs::read_to_string(path).ok().map(|s| s.trim().to_owned())
    }

    /// Reads a `0x`-prefixed (or bare) hex number.
    pub fn read_hex(&self, path: &Path) -> Result<u64, PciError> {
        let s = self.read_trimmed(path)?;
        let t = s.strip_prefix("0x").unwrap_or(&s);
        u64::from_str_radix(t, 16).map_err(|_| PciError::Parse { path: path.to_owned(), value: s.clone() })
    }

    /// Basename of the symlink at `path`, `None` when there is no link.
    pub fn link_name(&self, path: &Path) -> Option<String> {
        fs::read_link(path).ok().and_then(|t| t.file_name().map(|n| n.to_string_lossy().into_owned()))
    }

    /// Names of the entries of a directory, sorted; empty when it is missing.
    pub fn list_dir(&self, path: &Path) -> Vec<String> {
        let mut v: Vec<String> = match fs::read_dir(path) {
            Ok(rd) => {
                rd.filter_map(|e| e.ok()).map(|e| e.file_name().to_string_lossy().into_owned()).collect()
            }
            Err(_) => Vec::new(),
        };
        v.sort();
        v
    }

    /// The current driver of a PCI function (basename of its `driver` link).
    pub fn driver_of(&self, addr: &PciAddr) -> Option<String> {
        self.link_name(&self.pci_device_dir(addr).join("driver"))
    }

    /// The mounted filesystems, from `proc/self/mountinfo`, or from
    /// `proc/mounts` when mountinfo is missing (then `dev` is empty).
    pub fn mounts(&self) -> Vec<Mount> {
        if let Some(text) = self.read_opt(&self.path("proc/self/mountinfo")) {
            return text.lines().filter_map(parse_mountinfo_line).collect();
        }
        let text = self.read_opt(&self.path("proc/mounts")).unwrap_or_default();
        text.lines()
            .filter_map(|l| {
                let mut f = l.split_whitespace();
                let source = unescape(f.next()?);
                let mount_point = unescape(f.next()?);
                Some(Mount { dev: String::new(), mount_point, source })
            })
            .collect()
    }

    /// Swap devices in use (`proc/swaps`, first column).
    pub fn swaps(&self) -> Vec<String> {
        let text = self.read_opt(&self.path("proc/swaps")).unwrap_or_default();
        text.lines().skip(1).filter_map(|l| l.split_whitespace().next().map(unescape)).collect()
    }

    /// Processes holding `/dev/<name>` open, for every `name` whose
    /// `/dev/<name>` is the target of some `proc/<pid>/fd/*` link: name ->
    /// [(pid, comm)]. Unreadable processes and fds (other users' processes
    /// when not root, processes that exit meanwhile) are skipped.
    pub fn open_devices(&self) -> BTreeMap<String, Vec<(u32, String)>> {
        let mut out: BTreeMap<String, Vec<(u32, String)>> = BTreeMap::new();
        let proc_dir = self.path("proc");
        let Ok(rd) = fs::read_dir(&proc_dir) else { return out };
        for entry in rd.flatten() {
            let Some(pid) = entry.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else { continue };
            let Ok(fds) = fs::read_dir(entry.path().join("fd")) else { continue };
            let mut names: Vec<String> = Vec::new();
            for fd in fds.flatten() {
                let Ok(target) = fs::read_link(fd.path()) else { continue };
                let Some(name) = target.to_str().and_then(|t| t.strip_prefix("/dev/")) else { continue };
                if !names.iter().any(|n| n == name) {
                    names.push(name.to_owned());
                }
            }
            if names.is_empty() {
                continue;
            }
            let comm = self.read_opt(&entry.path().join("comm")).unwrap_or_else(|| "?".to_owned());
            for n in names {
                out.entry(n).or_default().push((pid, comm.clone()));
            }
        }
        for v in out.values_mut() {
            v.sort();
        }
        out
    }
}

/// Parses one line of `/proc/<pid>/mountinfo` (proc(5)): `id parent
/// major:minor root mount_point options [optional...] - fstype source
/// super_options`.
pub(crate) fn parse_mountinfo_line(line: &str) -> Option<Mount> {
    let fields: Vec<&str> = line.split(' ').collect();
    let sep = fields.iter().position(|f| *f == "-")?;
    if sep < 6 || fields.len() < sep + 3 {
        return None;
    }
    Some(Mount {
        dev: fields[2].to_owned(),
        mount_point: unescape(fields[4]),
        source: unescape(fields[sep + 2]),
    })
}

/// Decodes the octal escapes (`\040` for a space) that the kernel uses in
/// mount tables.
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 3 < b.len() && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c)) {
            let v = (b[i + 1] - b'0') as u32 * 64 + (b[i + 2] - b'0') as u32 * 8 + (b[i + 3] - b'0') as u32;
            out.push(v as u8);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_lines() {
        let m = parse_mountinfo_line(
            "36 35 259:2 / /mnt/my\\040data rw,noatime master:1 - ext4 /dev/nvme0n1p2 rw,errors=continue",
        )
        .unwrap();
        assert_eq!(m.dev, "259:2");
        assert_eq!(m.mount_point, "/mnt/my data");
        assert_eq!(m.source, "/dev/nvme0n1p2");
        let m = parse_mountinfo_line("22 1 259:1 / / rw - xfs /dev/nvme1n1 rw").unwrap();
        assert_eq!((m.mount_point.as_str(), m.dev.as_str()), ("/", "259:1"));
        assert!(parse_mountinfo_line("garbage").is_none());
    }

    #[test]
    fn unescapes() {
        assert_eq!(unescape("a\\040b\\011c"), "a b\tc");
        assert_eq!(unescape("trailing\\04"), "trailing\\04");
    }
}
