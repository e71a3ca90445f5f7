//! Active namespaces as the driver records them: the formatted LBA format,
//! every LBA format the namespace offers, and whether this driver can use
//! it (NVM Command Set 1.0, 4.1.5.1 Identify Namespace: NSZE, NLBAF, FLBAS,
//! LBAF).
//!
//! The driver moves logical block data only. A namespace formatted with
//! metadata (the formatted LBAF has MS != 0), whether the metadata travels
//! at the end of each block's data (extended LBA, FLBAS bit 4 = 1) or in a
//! separate buffer (FLBAS bit 4 = 0, pointed to by MPTR), is recorded and
//! reported, but refused for I/O with [`NamespaceError::Metadata`]: its
//! block size on the wire is not the LBA data size, or each command needs a
//! metadata pointer this driver never builds.

use std::fmt;

use nvme_regs::{DecodeError, IdentifyNamespace, LbaFormat};

use crate::io::NamespaceInfo;

/// The LBA format a namespace is formatted with (FLBAS and the LBAF it
/// selects).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct NamespaceFormat {
    /// Index of the formatted LBA format: FLBAS bits 3:0, with bits 6:5 as
    /// index bits 5:4 when NLBAF >= 16.
    pub lbaf_index: u8,
    /// LBA data size in bytes, `2^LBADS` (512 to 64 KiB).
    pub lba_data_size: u32,
    /// MS: metadata bytes per logical block; 0 = no metadata.
    pub metadata_size: u16,
    /// FLBAS bit 4: metadata is transferred at the end of each block's data
    /// (extended LBA); `false` = in a separate buffer (MPTR). Meaningless
    /// when `metadata_size` is 0.
    pub extended: bool,
}

impl NamespaceFormat {
    /// The formatted LBA format of `id`; [`DecodeError::LbaFormatIndex`] when
    /// FLBAS selects a format beyond NLBAF, [`DecodeError::LbaDataSize`]
    /// unless its LBADS is in 9..=16.
    pub fn from_identify(id: &IdentifyNamespace) -> Result<Self, DecodeError> {
        let lbaf = id.formatted_lba_format()?;
        Ok(Self {
            lbaf_index: id.formatted_lba_index(),
            lba_data_size: lbaf.block_size()?,
            metadata_size: lbaf.ms(),
            extended: id.extended_metadata(),
        })
    }

    /// Whether blocks carry metadata (MS != 0).
    pub fn has_metadata(&self) -> bool {
        self.metadata_size != 0
    }

    /// Where the metadata travels: `"extended LBA"`, `"separate buffer"`,
    /// or `"none"`.
    pub fn metadata_layout(&self) -> &'static str {
        match (self.has_metadata(), self.extended) {
            (false, _) => "none",
            (true, true) => "extended LBA",
            (true, false) => "separate buffer",
        }
    }
}

impl fmt::Display for NamespaceFormat {
    /// `LBAF 0: 512-byte blocks, no metadata` or `LBAF 1: 512-byte blocks
    /// + 8 bytes of metadata (extended LBA)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "LBAF {}: {}-byte blocks", self.lbaf_index, self.lba_data_size)?;
        if self.has_metadata() {
            write!(f, " + {} bytes of metadata ({})", self.metadata_size, self.metadata_layout())
        } else {
            f.write_str(", no metadata")
        }
    }
}

/// An active namespace as Identify Namespace describes it, usable by this
/// driver or not ([`ActiveNamespace::usable`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ActiveNamespace {
    /// Namespace identifier.
    pub nsid: u32,
    /// NSZE: size in logical blocks.
    pub blocks: u64,
    /// The formatted LBA format.
    pub format: NamespaceFormat,
    /// LBA formats `0..=NLBAF` the namespace supports, raw (the index is
    /// the position; an LBADS outside 9..=16 is a format not available).
    pub lba_formats: Vec<LbaFormat>,
}

impl ActiveNamespace {
    /// Namespace `nsid` from its Identify Namespace data; fails as
    /// [`NamespaceFormat::from_identify`] does.
    pub fn from_identify(nsid: u32, id: &IdentifyNamespace) -> Result<Self, DecodeError> {
        Ok(Self {
            nsid,
            blocks: id.nsze(),
            format: NamespaceFormat::from_identify(id)?,
            lba_formats: id.lba_formats().collect(),
        })
    }

    /// Data bytes (NSZE x LBA data size, metadata not counted; saturating).
    pub fn capacity_bytes(&self) -> u64 {
        self.blocks.saturating_mul(u64::from(self.format.lba_data_size))
    }

    /// Whether this driver can do I/O on it.
    pub fn is_usable(&self) -> bool {
        self.usable().is_ok()
    }

    /// The namespace as the I/O path uses it, or
    /// [`NamespaceError::Metadata`] when it is formatted with metadata.
    pub fn usable(&self) -> Result<NamespaceInfo, NamespaceError> {
        if self.format.has_metadata() {
            return Err(NamespaceError::Metadata {
                nsid: self.nsid,
                format: self.format,
                reformat_to: self.format_without_metadata(),
            });
        }
        Ok(NamespaceInfo { nsid: self.nsid, block_size: self.format.lba_data_size, blocks: self.blocks })
    }

    /// A supported LBA format without metadata to reformat to: one with the
    /// current LBA data size if there is one, else the first.
    pub fn format_without_metadata(&self) -> Option<NamespaceFormat> {
        let plain: Vec<NamespaceFormat> = self
            .lba_formats
            .iter()
            .enumerate()
            .filter(|(_, f)| f.ms() == 0)
            .filter_map(|(i, f)| {
                let lba_data_size = f.block_size().ok()?;
                Some(NamespaceFormat {
                    lbaf_index: i as u8,
                    lba_data_size,
                    metadata_size: 0,
                    extended: false,
                })
            })
            .collect();
        plain.iter().find(|f| f.lba_data_size == self.format.lba_data_size).or(plain.first()).copied()
    }
}

/// Why a namespace cannot be used for I/O.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NamespaceError {
    /// The controller does not list the NSID as active (Identify CNS 02h).
    #[error("namespace {nsid} is not active (active: {active:?})")]
    NotActive {
        /// The NSID asked for.
        nsid: u32,
        /// The active NSIDs, usable or not.
        active: Vec<u32>,
    },
    /// The namespace is formatted with metadata (MS != 0), which this
    /// driver does not transfer.
    #[error(
        "namespace {nsid} is formatted with {} bytes of metadata per block ({}, LBAF {}); tutti supports \
         only formats without metadata: {}",
        .format.metadata_size,
        .format.metadata_layout(),
        .format.lbaf_index,
        remedy(*.nsid, .reformat_to)
    )]
    Metadata {
        /// The namespace.
        nsid: u32,
        /// Its formatted LBA format.
        format: NamespaceFormat,
        /// A format without metadata that the namespace supports, if any
        /// (see [`ActiveNamespace::format_without_metadata`]).
        reformat_to: Option<NamespaceFormat>,
    },
}

/// What to do about a namespace formatted with metadata.
fn remedy(nsid: u32, reformat_to: &Option<NamespaceFormat>) -> String {
    match reformat_to {
        Some(f) => format!(
            "reformat with `nvme format /dev/nvmeX -n {nsid} --lbaf={}` ({}-byte blocks, no metadata; erases \
             the namespace) or pick another namespace",
            f.lbaf_index, f.lba_data_size
        ),
        None => "it offers no LBA format without metadata: pick another namespace".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn identify(nlbaf: u8, formats: &[(u16, u8)], flbas: u8, nsze: u64) -> IdentifyNamespace {
        let mut id = IdentifyNamespace::new_zeroed();
        id.set_nsze(nsze);
        id.set_nlbaf(nlbaf);
        for (i, &(ms, lbads)) in formats.iter().enumerate() {
            id.set_lbaf(i, LbaFormat::new(ms, lbads, 0)).unwrap();
        }
        id.set_flbas(flbas);
        id
    }

    #[test]
    fn plain_namespace_is_usable() {
        let ns = ActiveNamespace::from_identify(3, &identify(1, &[(0, 12), (8, 12)], 0, 100)).unwrap();
        assert_eq!(
            ns.format,
            NamespaceFormat { lbaf_index: 0, lba_data_size: 4096, metadata_size: 0, extended: false }
        );
        assert_eq!(ns.format.metadata_layout(), "none");
        assert_eq!(ns.format.to_string(), "LBAF 0: 4096-byte blocks, no metadata");
        assert_eq!(ns.lba_formats.len(), 2);
        assert_eq!(ns.usable(), Ok(NamespaceInfo { nsid: 3, block_size: 4096, blocks: 100 }));
        assert_eq!(ns.capacity_bytes(), 409_600);
        // FLBAS bit 4 means nothing without metadata.
        let ns = ActiveNamespace::from_identify(3, &identify(0, &[(0, 9)], 0x10, 8)).unwrap();
        assert!(ns.is_usable());
    }

    #[test]
    fn extended_metadata_is_refused_with_the_reformat_hint() {
        let ns = ActiveNamespace::from_identify(1, &identify(1, &[(0, 9), (8, 9)], 0x11, 2048)).unwrap();
        assert_eq!(ns.format.metadata_layout(), "extended LBA");
        assert_eq!(ns.format.to_string(), "LBAF 1: 512-byte blocks + 8 bytes of metadata (extended LBA)");
        let e = ns.usable().unwrap_err();
        assert!(
            matches!(e, NamespaceError::Metadata { nsid: 1, reformat_to: Some(f), .. } if f.lbaf_index == 0)
        );
        assert_eq!(
            e.to_string(),
            "namespace 1 is formatted with 8 bytes of metadata per block (extended LBA, LBAF 1); tutti supports \
             only formats without metadata: reformat with `nvme format /dev/nvmeX -n 1 --lbaf=0` (512-byte \
             blocks, no metadata; erases the namespace) or pick another namespace"
        );
    }

    #[test]
    fn separate_metadata_prefers_a_plain_format_of_the_same_size() {
        // QEMU's table: 512+0, 512+8, 512+16, 512+64, 4096+0, 4096+8, ...
        let formats = [(0, 9), (8, 9), (16, 9), (64, 9), (0, 12), (8, 12), (16, 12), (64, 12)];
        let ns = ActiveNamespace::from_identify(2, &identify(7, &formats, 5, 64)).unwrap();
        assert_eq!(ns.format.metadata_layout(), "separate buffer");
        let e = ns.usable().unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains("8 bytes of metadata per block (separate buffer, LBAF 5)"), "{msg}");
        assert!(msg.contains("--lbaf=4` (4096-byte blocks"), "{msg}");
    }

    #[test]
    fn no_plain_format_says_pick_another_namespace() {
        let ns = ActiveNamespace::from_identify(4, &identify(1, &[(8, 9), (0, 0)], 0, 64)).unwrap();
        assert_eq!(ns.format_without_metadata(), None);
        let msg = ns.usable().unwrap_err().to_string();
        assert!(msg.ends_with("it offers no LBA format without metadata: pick another namespace"), "{msg}");
    }

    #[test]
    fn malformed_formats_are_decode_errors() {
        assert!(ActiveNamespace::from_identify(1, &identify(0, &[(0, 9)], 1, 8)).is_err());
        assert!(ActiveNamespace::from_identify(1, &identify(0, &[(0, 20)], 0, 8)).is_err());
    }

    #[test]
    fn not_active_names_the_active_ones() {
        let e = NamespaceError::NotActive { nsid: 3, active: vec![1, 2] };
        assert_eq!(e.to_string(), "namespace 3 is not active (active: [1, 2])");
    }
}
