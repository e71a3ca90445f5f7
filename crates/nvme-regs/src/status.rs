//! The completion status field (NVMe Base 2.0, 4.2.3 "Status Field
//! Definition"; Base 1.4, 4.6.1).
//!
//! In a completion queue entry the status field occupies DW3 bits 31:17, next
//! to the phase tag in bit 16. Seen as the `u16` at byte offset 14 of the CQE
//! (DW3 bits 31:16), the layout is:
//!
//! | bits | field |
//! | --- | --- |
//! | 0 | P, phase tag (not part of the status) |
//! | 8:1 | SC, Status Code |
//! | 11:9 | SCT, Status Code Type |
//! | 13:12 | CRD, Command Retry Delay |
//! | 14 | M, More |
//! | 15 | DNR, Do Not Retry |

use core::fmt;

/// A decoded completion status (NVMe Base 2.0, 4.2.3).
///
/// Fields are public; values wider than their spec field (`sct` > 7, `crd`
/// > 3) are masked by [`Status::to_field`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Status {
    /// SCT, Status Code Type (3 bits): see [`StatusCodeType`].
    pub sct: u8,
    /// SC, Status Code (8 bits), meaning depends on `sct`: see [`generic`],
    /// [`command_specific`], [`media`], [`path`].
    pub sc: u8,
    /// CRD, Command Retry Delay (2 bits): 0 = retry at once, 1..=3 select
    /// Identify Controller CRDT1..CRDT3 (units of 100 ms).
    pub crd: u8,
    /// M, More: more status information is in the Error Information log.
    pub more: bool,
    /// DNR, Do Not Retry: the same command would fail again.
    pub dnr: bool,
}

impl Default for Status {
    fn default() -> Self {
        Status::SUCCESS
    }
}

/// SCT, Status Code Type (NVMe Base 2.0, 4.2.3).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StatusCodeType {
    /// 0h: Generic Command Status ([`generic`]).
    Generic,
    /// 1h: Command Specific Status ([`command_specific`]).
    CommandSpecific,
    /// 2h: Media and Data Integrity Errors ([`media`]).
    MediaAndDataIntegrity,
    /// 3h: Path Related Status ([`path`]).
    PathRelated,
    /// 7h: Vendor Specific.
    VendorSpecific,
    /// 4h..=6h: reserved; carries the raw value.
    Reserved(u8),
}

impl StatusCodeType {
    /// Decodes a raw 3-bit SCT (higher bits ignored).
    pub const fn from_raw(sct: u8) -> StatusCodeType {
        match sct & 7 {
            0 => StatusCodeType::Generic,
            1 => StatusCodeType::CommandSpecific,
            2 => StatusCodeType::MediaAndDataIntegrity,
            3 => StatusCodeType::PathRelated,
            7 => StatusCodeType::VendorSpecific,
            other => StatusCodeType::Reserved(other),
        }
    }

    /// The raw 3-bit SCT value.
    pub const fn raw(self) -> u8 {
        match self {
            StatusCodeType::Generic => 0,
            StatusCodeType::CommandSpecific => 1,
            StatusCodeType::MediaAndDataIntegrity => 2,
            StatusCodeType::PathRelated => 3,
            StatusCodeType::VendorSpecific => 7,
            StatusCodeType::Reserved(v) => v & 7,
        }
    }
}

impl From<StatusCodeType> for u8 {
    fn from(sct: StatusCodeType) -> u8 {
        sct.raw()
    }
}

/// Raw SCT values (NVMe Base 2.0, 4.2.3).
pub mod sct {
    /// 0h: Generic Command Status.
    pub const GENERIC: u8 = 0;
    /// 1h: Command Specific Status.
    pub const COMMAND_SPECIFIC: u8 = 1;
    /// 2h: Media and Data Integrity Errors.
    pub const MEDIA_AND_DATA_INTEGRITY: u8 = 2;
    /// 3h: Path Related Status.
    pub const PATH_RELATED: u8 = 3;
    /// 7h: Vendor Specific.
    pub const VENDOR_SPECIFIC: u8 = 7;
}

/// Status codes of SCT 0h, Generic Command Status (NVMe Base 2.0, 4.2.3.1;
/// for 80h.., NVM Command Set 1.0 "Status Information").
pub mod generic {
    /// 00h: Successful Completion.
    pub const SUCCESS: u8 = 0x00;
    /// 01h: Invalid Command Opcode.
    pub const INVALID_OPCODE: u8 = 0x01;
    /// 02h: Invalid Field in Command.
    pub const INVALID_FIELD: u8 = 0x02;
    /// 03h: Command ID Conflict (CID already in use on that SQ).
    pub const COMMAND_ID_CONFLICT: u8 = 0x03;
    /// 04h: Data Transfer Error.
    pub const DATA_TRANSFER_ERROR: u8 = 0x04;
    /// 05h: Commands Aborted due to Power Loss Notification.
    pub const ABORTED_POWER_LOSS: u8 = 0x05;
    /// 06h: Internal Error.
    pub const INTERNAL_ERROR: u8 = 0x06;
    /// 07h: Command Abort Requested.
    pub const ABORT_REQUESTED: u8 = 0x07;
    /// 08h: Command Aborted due to SQ Deletion.
    pub const ABORTED_SQ_DELETION: u8 = 0x08;
    /// 09h: Command Aborted due to Failed Fused Command.
    pub const ABORTED_FAILED_FUSED: u8 = 0x09;
    /// 0Ah: Command Aborted due to Missing Fused Command.
    pub const ABORTED_MISSING_FUSED: u8 = 0x0A;
    /// 0Bh: Invalid Namespace or Format.
    pub const INVALID_NAMESPACE_OR_FORMAT: u8 = 0x0B;
    /// 0Ch: Command Sequence Error.
    pub const COMMAND_SEQUENCE_ERROR: u8 = 0x0C;
    /// 13h: PRP Offset Invalid.
    pub const PRP_OFFSET_INVALID: u8 = 0x13;
    /// 80h: LBA Out of Range (NVM command set).
    pub const LBA_OUT_OF_RANGE: u8 = 0x80;
    /// 81h: Capacity Exceeded (NVM command set).
    pub const CAPACITY_EXCEEDED: u8 = 0x81;
    /// 82h: Namespace Not Ready.
    pub const NAMESPACE_NOT_READY: u8 = 0x82;
    /// 83h: Reservation Conflict.
    pub const RESERVATION_CONFLICT: u8 = 0x83;
    /// 84h: Format In Progress.
    pub const FORMAT_IN_PROGRESS: u8 = 0x84;
}

/// Status codes of SCT 1h, Command Specific Status (NVMe Base 2.0, 4.2.3.2;
/// 80h.. from NVM Command Set 1.0 "Status Information").
pub mod command_specific {
    /// 00h: Completion Queue Invalid (Create I/O SQ names a CQ that does not
    /// exist).
    pub const COMPLETION_QUEUE_INVALID: u8 = 0x00;
    /// 01h: Invalid Queue Identifier.
    pub const INVALID_QUEUE_IDENTIFIER: u8 = 0x01;
    /// 02h: Invalid Queue Size.
    pub const INVALID_QUEUE_SIZE: u8 = 0x02;
    /// 03h: Abort Command Limit Exceeded.
    pub const ABORT_COMMAND_LIMIT_EXCEEDED: u8 = 0x03;
    /// 05h: Asynchronous Event Request Limit Exceeded.
    pub const ASYNC_EVENT_REQUEST_LIMIT_EXCEEDED: u8 = 0x05;
    /// 08h: Invalid Interrupt Vector.
    pub const INVALID_INTERRUPT_VECTOR: u8 = 0x08;
    /// 09h: Invalid Log Page.
    pub const INVALID_LOG_PAGE: u8 = 0x09;
    /// 0Ah: Invalid Format.
    pub const INVALID_FORMAT: u8 = 0x0A;
    /// 0Ch: Invalid Queue Deletion (e.g. deleting a CQ that still has SQs).
    pub const INVALID_QUEUE_DELETION: u8 = 0x0C;
    /// 0Dh: Feature Identifier Not Saveable.
    pub const FEATURE_NOT_SAVEABLE: u8 = 0x0D;
    /// 0Eh: Feature Not Changeable.
    pub const FEATURE_NOT_CHANGEABLE: u8 = 0x0E;
    /// 0Fh: Feature Not Namespace Specific.
    pub const FEATURE_NOT_NAMESPACE_SPECIFIC: u8 = 0x0F;
    /// 80h: Conflicting Attributes (NVM command set: Dataset Management,
    /// Read, Write).
    pub const CONFLICTING_ATTRIBUTES: u8 = 0x80;
    /// 81h: Invalid Protection Information (NVM command set).
    pub const INVALID_PROTECTION_INFORMATION: u8 = 0x81;
    /// 82h: Attempted Write to Read Only Range (NVM command set).
    pub const WRITE_TO_READ_ONLY_RANGE: u8 = 0x82;
}

/// Status codes of SCT 2h, Media and Data Integrity Errors (NVMe Base 2.0,
/// 4.2.3.3; NVM Command Set 1.0 "Status Information").
pub mod media {
    /// 80h: Write Fault.
    pub const WRITE_FAULT: u8 = 0x80;
    /// 81h: Unrecovered Read Error.
    pub const UNRECOVERED_READ_ERROR: u8 = 0x81;
    /// 82h: End-to-end Guard Check Error.
    pub const GUARD_CHECK_ERROR: u8 = 0x82;
    /// 83h: End-to-end Application Tag Check Error.
    pub const APPLICATION_TAG_CHECK_ERROR: u8 = 0x83;
    /// 84h: End-to-end Reference Tag Check Error.
    pub const REFERENCE_TAG_CHECK_ERROR: u8 = 0x84;
    /// 85h: Compare Failure.
    pub const COMPARE_FAILURE: u8 = 0x85;
    /// 86h: Access Denied.
    pub const ACCESS_DENIED: u8 = 0x86;
    /// 87h: Deallocated or Unwritten Logical Block.
    pub const DEALLOCATED_OR_UNWRITTEN: u8 = 0x87;
}

/// Status codes of SCT 3h, Path Related Status (NVMe Base 2.0, 4.2.3.4;
/// "Path Related Status Values").
pub mod path {
    /// 00h: Internal Path Error.
    pub const INTERNAL_PATH_ERROR: u8 = 0x00;
    /// 01h: Asymmetric Access Persistent Loss.
    pub const ASYMMETRIC_ACCESS_PERSISTENT_LOSS: u8 = 0x01;
    /// 02h: Asymmetric Access Inaccessible.
    pub const ASYMMETRIC_ACCESS_INACCESSIBLE: u8 = 0x02;
    /// 03h: Asymmetric Access Transition.
    pub const ASYMMETRIC_ACCESS_TRANSITION: u8 = 0x03;
    /// 60h: Controller Pathing Error.
    pub const CONTROLLER_PATHING_ERROR: u8 = 0x60;
    /// 70h: Host Pathing Error.
    pub const HOST_PATHING_ERROR: u8 = 0x70;
    /// 71h: Command Aborted By Host.
    pub const COMMAND_ABORTED_BY_HOST: u8 = 0x71;
}

impl Status {
    /// Successful Completion: SCT 0h, SC 00h, no CRD, M or DNR.
    pub const SUCCESS: Status = Status::new(sct::GENERIC, generic::SUCCESS);

    /// A status with the given SCT (masked to 3 bits) and SC, CRD 0, M and
    /// DNR clear.
    pub const fn new(sct: u8, sc: u8) -> Status {
        Status { sct: sct & 7, sc, crd: 0, more: false, dnr: false }
    }

    /// SCT 0h (Generic Command Status) with the given SC ([`generic`]).
    pub const fn generic(sc: u8) -> Status {
        Status::new(sct::GENERIC, sc)
    }

    /// SCT 1h (Command Specific Status) with the given SC
    /// ([`command_specific`]).
    pub const fn command_specific(sc: u8) -> Status {
        Status::new(sct::COMMAND_SPECIFIC, sc)
    }

    /// SCT 2h (Media and Data Integrity Errors) with the given SC ([`media`]).
    pub const fn media(sc: u8) -> Status {
        Status::new(sct::MEDIA_AND_DATA_INTEGRITY, sc)
    }

    /// SCT 3h (Path Related Status) with the given SC ([`path`]).
    pub const fn path(sc: u8) -> Status {
        Status::new(sct::PATH_RELATED, sc)
    }

    /// Sets DNR (Do Not Retry).
    pub const fn with_dnr(self, dnr: bool) -> Status {
        Status { dnr, ..self }
    }

    /// Sets M (More).
    pub const fn with_more(self, more: bool) -> Status {
        Status { more, ..self }
    }

    /// Sets CRD (Command Retry Delay), masked to 2 bits.
    pub const fn with_crd(self, crd: u8) -> Status {
        Status { crd: crd & 3, ..self }
    }

    /// True for Successful Completion (SCT 0h and SC 00h; CRD, M and DNR are
    /// not looked at).
    pub const fn is_success(&self) -> bool {
        self.sct == sct::GENERIC && self.sc == generic::SUCCESS
    }

    /// The status code type as an enum.
    pub const fn sct_kind(&self) -> StatusCodeType {
        StatusCodeType::from_raw(self.sct)
    }

    /// Decodes the upper half of CQE DW3 (the `u16` at byte 14 of the CQE).
    /// Bit 0 (the phase tag) is ignored.
    pub const fn from_field(field: u16) -> Status {
        Status {
            sc: (field >> 1) as u8,
            sct: ((field >> 9) & 7) as u8,
            crd: ((field >> 12) & 3) as u8,
            more: field & (1 << 14) != 0,
            dnr: field & (1 << 15) != 0,
        }
    }

    /// Encodes the status into the upper half of CQE DW3, with the phase
    /// tag `phase` in bit 0. `sct` and `crd` are masked to their widths.
    pub const fn to_field(self, phase: bool) -> u16 {
        phase as u16
            | (self.sc as u16) << 1
            | ((self.sct & 7) as u16) << 9
            | ((self.crd & 3) as u16) << 12
            | (self.more as u16) << 14
            | (self.dnr as u16) << 15
    }

    /// The specification's name for this SCT/SC pair, or `None` for codes
    /// this crate does not name (vendor specific, reserved, or not listed).
    pub const fn name(&self) -> Option<&'static str> {
        let name = match (self.sct & 7, self.sc) {
            (sct::GENERIC, sc) => match sc {
                generic::SUCCESS => "Successful Completion",
                generic::INVALID_OPCODE => "Invalid Command Opcode",
                generic::INVALID_FIELD => "Invalid Field in Command",
                generic::COMMAND_ID_CONFLICT => "Command ID Conflict",
                generic::DATA_TRANSFER_ERROR => "Data Transfer Error",
                generic::ABORTED_POWER_LOSS => "Commands Aborted due to Power Loss Notification",
                generic::INTERNAL_ERROR => "Internal Error",
                generic::ABORT_REQUESTED => "Command Abort Requested",
                generic::ABORTED_SQ_DELETION => "Command Aborted due to SQ Deletion",
                generic::ABORTED_FAILED_FUSED => "Command Aborted due to Failed Fused Command",
                generic::ABORTED_MISSING_FUSED => "Command Aborted due to Missing Fused Command",
                generic::INVALID_NAMESPACE_OR_FORMAT => "Invalid Namespace or Format",
                generic::COMMAND_SEQUENCE_ERROR => "Command Sequence Error",
                generic::PRP_OFFSET_INVALID => "PRP Offset Invalid",
                generic::LBA_OUT_OF_RANGE => "LBA Out of Range",
                generic::CAPACITY_EXCEEDED => "Capacity Exceeded",
                generic::NAMESPACE_NOT_READY => "Namespace Not Ready",
                generic::RESERVATION_CONFLICT => "Reservation Conflict",
                generic::FORMAT_IN_PROGRESS => "Format In Progress",
                _ => return None,
            },
            (sct::COMMAND_SPECIFIC, sc) => match sc {
                command_specific::COMPLETION_QUEUE_INVALID => "Completion Queue Invalid",
                command_specific::INVALID_QUEUE_IDENTIFIER => "Invalid Queue Identifier",
                command_specific::INVALID_QUEUE_SIZE => "Invalid Queue Size",
                command_specific::ABORT_COMMAND_LIMIT_EXCEEDED => "Abort Command Limit Exceeded",
                command_specific::ASYNC_EVENT_REQUEST_LIMIT_EXCEEDED => {
                    "Asynchronous Event Request Limit Exceeded"
                }
                command_specific::INVALID_INTERRUPT_VECTOR => "Invalid Interrupt Vector",
                command_specific::INVALID_LOG_PAGE => "Invalid Log Page",
                command_specific::INVALID_FORMAT => "Invalid Format",
                command_specific::INVALID_QUEUE_DELETION => "Invalid Queue Deletion",
                command_specific::FEATURE_NOT_SAVEABLE => "Feature Identifier Not Saveable",
                command_specific::FEATURE_NOT_CHANGEABLE => "Feature Not Changeable",
                command_specific::FEATURE_NOT_NAMESPACE_SPECIFIC => "Feature Not Namespace Specific",
                command_specific::CONFLICTING_ATTRIBUTES => "Conflicting Attributes",
                command_specific::INVALID_PROTECTION_INFORMATION => "Invalid Protection Information",
                command_specific::WRITE_TO_READ_ONLY_RANGE => "Attempted Write to Read Only Range",
                _ => return None,
            },
            (sct::MEDIA_AND_DATA_INTEGRITY, sc) => match sc {
                media::WRITE_FAULT => "Write Fault",
                media::UNRECOVERED_READ_ERROR => "Unrecovered Read Error",
                media::GUARD_CHECK_ERROR => "End-to-end Guard Check Error",
                media::APPLICATION_TAG_CHECK_ERROR => "End-to-end Application Tag Check Error",
                media::REFERENCE_TAG_CHECK_ERROR => "End-to-end Reference Tag Check Error",
                media::COMPARE_FAILURE => "Compare Failure",
                media::ACCESS_DENIED => "Access Denied",
                media::DEALLOCATED_OR_UNWRITTEN => "Deallocated or Unwritten Logical Block",
                _ => return None,
            },
            (sct::PATH_RELATED, sc) => match sc {
                path::INTERNAL_PATH_ERROR => "Internal Path Error",
                path::ASYMMETRIC_ACCESS_PERSISTENT_LOSS => "Asymmetric Access Persistent Loss",
                path::ASYMMETRIC_ACCESS_INACCESSIBLE => "Asymmetric Access Inaccessible",
                path::ASYMMETRIC_ACCESS_TRANSITION => "Asymmetric Access Transition",
                path::CONTROLLER_PATHING_ERROR => "Controller Pathing Error",
                path::HOST_PATHING_ERROR => "Host Pathing Error",
                path::COMMAND_ABORTED_BY_HOST => "Command Aborted By Host",
                _ => return None,
            },
            _ => return None,
        };
        Some(name)
    }
}

/// Prints the name (or `unknown`), then SCT and SC in hex, then the flags
/// that are set: e.g. `LBA Out of Range (SCT 0h, SC 80h, DNR)` or
/// `unknown (SCT 3h, SC 12h)`.
impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (SCT {:X}h, SC {:02X}h", self.name().unwrap_or("unknown"), self.sct & 7, self.sc)?;
        if self.crd & 3 != 0 {
            write!(f, ", CRD {}", self.crd & 3)?;
        }
        if self.more {
            f.write_str(", M")?;
        }
        if self.dnr {
            f.write_str(", DNR")?;
        }
        f.write_str(")")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::format;

    #[test]
    fn field_round_trip_exhaustive() {
        for field in 0..=u16::MAX {
            let st = Status::from_field(field);
            assert_eq!(st.to_field(field & 1 != 0), field);
            assert_eq!(st.to_field(false), field & !1);
            assert!(st.sct < 8 && st.crd < 4);
        }
    }

    #[test]
    fn field_bits() {
        let st = Status::generic(generic::LBA_OUT_OF_RANGE).with_dnr(true);
        assert_eq!(st.to_field(false), 0x80 << 1 | 1 << 15);
        let st = Status::new(7, 0xFF).with_crd(3).with_more(true).with_dnr(true);
        assert_eq!(st.to_field(true), 0xFFFF);
        assert_eq!(Status::from_field(0xFFFF), st);
        assert_eq!(Status::from_field(1), Status::SUCCESS);
        assert!(Status::from_field(1).is_success());
        assert!(Status::SUCCESS.with_dnr(true).is_success());
        assert!(!Status::media(media::WRITE_FAULT).is_success());
        assert!(!Status::command_specific(0).is_success());
        assert_eq!(Status::new(9, 0).sct, 1);
        assert_eq!(Status::default(), Status::SUCCESS);
    }

    #[test]
    fn sct_kind() {
        assert_eq!(Status::generic(0).sct_kind(), StatusCodeType::Generic);
        assert_eq!(Status::command_specific(0).sct_kind(), StatusCodeType::CommandSpecific);
        assert_eq!(Status::media(0x80).sct_kind(), StatusCodeType::MediaAndDataIntegrity);
        assert_eq!(Status::path(0).sct_kind(), StatusCodeType::PathRelated);
        assert_eq!(Status::new(7, 0).sct_kind(), StatusCodeType::VendorSpecific);
        assert_eq!(Status::new(5, 0).sct_kind(), StatusCodeType::Reserved(5));
        for raw in 0..8 {
            assert_eq!(StatusCodeType::from_raw(raw).raw(), raw);
        }
        assert_eq!(u8::from(StatusCodeType::PathRelated), 3);
    }

    #[test]
    fn display() {
        let st = Status::generic(generic::LBA_OUT_OF_RANGE).with_dnr(true);
        assert_eq!(format!("{st}"), "LBA Out of Range (SCT 0h, SC 80h, DNR)");
        assert_eq!(format!("{}", Status::new(3, 0x12)), "unknown (SCT 3h, SC 12h)");
        assert_eq!(format!("{}", Status::SUCCESS), "Successful Completion (SCT 0h, SC 00h)");
        assert_eq!(
            format!("{}", Status::generic(generic::INVALID_OPCODE).with_crd(1).with_more(true)),
            "Invalid Command Opcode (SCT 0h, SC 01h, CRD 1, M)"
        );
        assert_eq!(
            format!("{}", Status::command_specific(command_specific::INVALID_QUEUE_IDENTIFIER)),
            "Invalid Queue Identifier (SCT 1h, SC 01h)"
        );
        assert_eq!(
            format!("{}", Status::media(media::UNRECOVERED_READ_ERROR)),
            "Unrecovered Read Error (SCT 2h, SC 81h)"
        );
        assert_eq!(Status::new(7, 0x80).name(), None);
    }
}
