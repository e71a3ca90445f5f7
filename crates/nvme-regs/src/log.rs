//! Log pages read with Get Log Page (NVMe Base 2.0, 5.16): Error Information
//! (LID 01h, 5.16.1.2) and SMART / Health Information (LID 02h, 5.16.1.3).
//!
//! Structures have alignment 1 and parse from any slice of the right
//! length; wrong lengths give [`DecodeError::WrongLength`].

use crate::error::DecodeError;
use crate::status::Status;
use zerocopy::little_endian::{U128, U16, U32, U64};
use zerocopy::{FromBytes, FromZeros, Immutable, IntoBytes, KnownLayout};

/// Log page identifiers, LID (Get Log Page CDW10 bits 7:0; NVMe Base 2.0,
/// 5.16).
pub mod log_id {
    /// 01h: Error Information (Base 2.0 5.16.1.2); entries of
    /// [`super::ErrorLogEntry`].
    pub const ERROR_INFORMATION: u8 = 0x01;
    /// 02h: SMART / Health Information (Base 2.0 5.16.1.3); see
    /// [`super::SmartLog`].
    pub const SMART_HEALTH: u8 = 0x02;
    /// 03h: Firmware Slot Information (Base 2.0 5.16.1.4).
    pub const FIRMWARE_SLOT: u8 = 0x03;
}

/// SMART / Health Information log page (LID 02h), 512 bytes (NVMe Base 2.0,
/// 5.16.1.3).
///
/// The 128-bit counters are little-endian. "Data units" are thousands of
/// 512-byte units (1 data unit = 512,000 bytes), rounded up.
#[repr(C)]
#[derive(Clone, PartialEq, Eq, Debug, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct SmartLog {
    /// Critical Warning (byte 0), bit field.
    pub critical_warning: u8,
    /// Composite Temperature (bytes 2:1), Kelvin.
    pub composite_temperature: U16,
    /// Available Spare (byte 3), percent (0..=100).
    pub available_spare: u8,
    /// Available Spare Threshold (byte 4), percent.
    pub available_spare_threshold: u8,
    /// Percentage Used (byte 5), percent of rated life (may exceed 100).
    pub percentage_used: u8,
    /// Endurance Group Critical Warning Summary (byte 6).
    pub endurance_group_critical_warning: u8,
    /// Bytes 31:7, reserved.
    pub rsvd7: [u8; 25],
    /// Data Units Read (bytes 47:32), units of 512,000 bytes.
    pub data_units_read: U128,
    /// Data Units Written (bytes 63:48), units of 512,000 bytes.
    pub data_units_written: U128,
    /// Host Read Commands (bytes 79:64), commands completed.
    pub host_read_commands: U128,
    /// Host Write Commands (bytes 95:80), commands completed.
    pub host_write_commands: U128,
    /// Controller Busy Time (bytes 111:96), minutes.
    pub controller_busy_time: U128,
    /// Power Cycles (bytes 127:112).
    pub power_cycles: U128,
    /// Power On Hours (bytes 143:128), hours.
    pub power_on_hours: U128,
    /// Unsafe Shutdowns (bytes 159:144).
    pub unsafe_shutdowns: U128,
    /// Media and Data Integrity Errors (bytes 175:160).
    pub media_errors: U128,
    /// Number of Error Information Log Entries (bytes 191:176), over the
    /// controller's life.
    pub num_err_log_entries: U128,
    /// Warning Composite Temperature Time (bytes 195:192), minutes.
    pub warning_temp_time: U32,
    /// Critical Composite Temperature Time (bytes 199:196), minutes.
    pub critical_temp_time: U32,
    /// Temperature Sensors 1..8 (bytes 215:200), Kelvin, 0 = not present.
    pub temp_sensors: [U16; 8],
    /// Bytes 511:216 (thermal management counters, reserved).
    pub rsvd216: [u8; 296],
}

const _: () = {
    use core::mem::{align_of, offset_of, size_of};
    type S = SmartLog;
    assert!(size_of::<S>() == SmartLog::SIZE);
    assert!(align_of::<S>() == 1);
    assert!(offset_of!(S, critical_warning) == 0);
    assert!(offset_of!(S, composite_temperature) == 1);
    assert!(offset_of!(S, available_spare) == 3);
    assert!(offset_of!(S, available_spare_threshold) == 4);
    assert!(offset_of!(S, percentage_used) == 5);
    assert!(offset_of!(S, data_units_read) == 32);
    assert!(offset_of!(S, data_units_written) == 48);
    assert!(offset_of!(S, host_read_commands) == 64);
    assert!(offset_of!(S, host_write_commands) == 80);
    assert!(offset_of!(S, controller_busy_time) == 96);
    assert!(offset_of!(S, power_cycles) == 112);
    assert!(offset_of!(S, power_on_hours) == 128);
    assert!(offset_of!(S, unsafe_shutdowns) == 144);
    assert!(offset_of!(S, media_errors) == 160);
    assert!(offset_of!(S, num_err_log_entries) == 176);
    assert!(offset_of!(S, warning_temp_time) == 192);
    assert!(offset_of!(S, temp_sensors) == 200);
    assert!(offset_of!(S, rsvd216) == 216);
};

impl SmartLog {
    /// Size of the log page in bytes.
    pub const SIZE: usize = 512;
    /// Bytes per data unit (1000 * 512), for the data units counters.
    pub const DATA_UNIT_BYTES: u64 = 512_000;

    /// Views a 512-byte buffer as the SMART / Health log.
    /// [`DecodeError::WrongLength`] for any other length.
    pub fn parse(bytes: &[u8]) -> Result<&SmartLog, DecodeError> {
        SmartLog::ref_from_bytes(bytes).map_err(|_| DecodeError::WrongLength {
            what: "SMART / Health log",
            expected: SmartLog::SIZE,
            actual: bytes.len(),
        })
    }

    /// An all-zero log page, for the emulator.
    pub fn new_zeroed() -> SmartLog {
        <SmartLog as FromZeros>::new_zeroed()
    }

    /// Critical Warning (byte 0), bit field.
    pub fn critical_warning(&self) -> u8 {
        self.critical_warning
    }

    /// Composite Temperature, Kelvin.
    pub fn composite_temperature(&self) -> u16 {
        self.composite_temperature.get()
    }

    /// Available Spare, percent.
    pub fn available_spare(&self) -> u8 {
        self.available_spare
    }

    /// Available Spare Threshold, percent.
    pub fn available_spare_threshold(&self) -> u8 {
        self.available_spare_threshold
    }

    /// Percentage Used, percent of rated endurance.
    pub fn percentage_used(&self) -> u8 {
        self.percentage_used
    }

    /// Data Units Read, units of 512,000 bytes (rounded up).
    pub fn data_units_read(&self) -> u128 {
        self.data_units_read.get()
    }

    /// Data Units Written, units of 512,000 bytes (rounded up).
    pub fn data_units_written(&self) -> u128 {
        self.data_units_written.get()
    }

    /// Host Read Commands completed.
    pub fn host_read_commands(&self) -> u128 {
        self.host_read_commands.get()
    }

    /// Host Write Commands completed.
    pub fn host_write_commands(&self) -> u128 {
        self.host_write_commands.get()
    }

    /// Controller Busy Time, minutes.
    pub fn controller_busy_time(&self) -> u128 {
        self.controller_busy_time.get()
    }

    /// Power Cycles.
    pub fn power_cycles(&self) -> u128 {
        self.power_cycles.get()
    }

    /// Power On Hours.
    pub fn power_on_hours(&self) -> u128 {
        self.power_on_hours.get()
    }

    /// Unsafe Shutdowns.
    pub fn unsafe_shutdowns(&self) -> u128 {
        self.unsafe_shutdowns.get()
    }

    /// Media and Data Integrity Errors.
    pub fn media_errors(&self) -> u128 {
        self.media_errors.get()
    }

    /// Number of Error Information Log Entries.
    pub fn num_err_log_entries(&self) -> u128 {
        self.num_err_log_entries.get()
    }

    /// Sets Critical Warning.
    pub fn set_critical_warning(&mut self, v: u8) {
        self.critical_warning = v;
    }

    /// Sets Composite Temperature (Kelvin).
    pub fn set_composite_temperature(&mut self, kelvin: u16) {
        self.composite_temperature = U16::new(kelvin);
    }

    /// Sets Available Spare (percent).
    pub fn set_available_spare(&mut self, percent: u8) {
        self.available_spare = percent;
    }

    /// Sets Available Spare Threshold (percent).
    pub fn set_available_spare_threshold(&mut self, percent: u8) {
        self.available_spare_threshold = percent;
    }

    /// Sets Percentage Used (percent).
    pub fn set_percentage_used(&mut self, percent: u8) {
        self.percentage_used = percent;
    }

    /// Sets Data Units Read (units of 512,000 bytes).
    pub fn set_data_units_read(&mut self, v: u128) {
        self.data_units_read = U128::new(v);
    }

    /// Sets Data Units Written (units of 512,000 bytes).
    pub fn set_data_units_written(&mut self, v: u128) {
        self.data_units_written = U128::new(v);
    }

    /// Sets Host Read Commands.
    pub fn set_host_read_commands(&mut self, v: u128) {
        self.host_read_commands = U128::new(v);
    }

    /// Sets Host Write Commands.
    pub fn set_host_write_commands(&mut self, v: u128) {
        self.host_write_commands = U128::new(v);
    }

    /// Sets Controller Busy Time (minutes).
    pub fn set_controller_busy_time(&mut self, v: u128) {
        self.controller_busy_time = U128::new(v);
    }

    /// Sets Power Cycles.
    pub fn set_power_cycles(&mut self, v: u128) {
        self.power_cycles = U128::new(v);
    }

    /// Sets Power On Hours.
    pub fn set_power_on_hours(&mut self, v: u128) {
        self.power_on_hours = U128::new(v);
    }

    /// Sets Unsafe Shutdowns.
    pub fn set_unsafe_shutdowns(&mut self, v: u128) {
        self.unsafe_shutdowns = U128::new(v);
    }

    /// Sets Media and Data Integrity Errors.
    pub fn set_media_errors(&mut self, v: u128) {
        self.media_errors = U128::new(v);
    }

    /// Sets Number of Error Information Log Entries.
    pub fn set_num_err_log_entries(&mut self, v: u128) {
        self.num_err_log_entries = U128::new(v);
    }
}

/// One Error Information log entry (LID 01h), 64 bytes (NVMe Base 2.0,
/// 5.16.1.2). The page holds up to ELPE + 1 entries (Identify Controller),
/// newest first; an entry with Error Count 0 is empty.
#[repr(C)]
#[derive(Clone, Copy, PartialEq, Eq, Debug, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct ErrorLogEntry {
    /// Error Count (bytes 7:0): unique, incrementing; 0 = empty entry.
    pub error_count: U64,
    /// Submission Queue ID (bytes 9:8); `FFFFh` if not specific to a queue.
    pub sqid: U16,
    /// Command ID (bytes 11:10); `FFFFh` if not specific to a command.
    pub cid: U16,
    /// Status Field (bytes 13:12): bit 0 phase tag, bits 15:1 status, the
    /// same layout as the CQE's upper DW3 half.
    pub status_field: U16,
    /// Parameter Error Location (bytes 15:14): byte 7:0 and bit 10:8 of the
    /// command field in error; `FFFFh` if not specific.
    pub parameter_error_location: U16,
    /// LBA (bytes 23:16): first LBA of the error, if any.
    pub lba: U64,
    /// Namespace (bytes 27:24); `FFFF_FFFFh` if not specific.
    pub nsid: U32,
    /// Vendor Specific Information Available (byte 28): log page id, or 0.
    pub vendor_specific: u8,
    /// Transport Type (byte 29).
    pub trtype: u8,
    /// Bytes 31:30, reserved.
    pub rsvd30: [u8; 2],
    /// Command Specific Information (bytes 39:32).
    pub command_specific: U64,
    /// Transport Type Specific Information (bytes 41:40).
    pub trtype_specific: U16,
    /// Bytes 63:42, reserved.
    pub rsvd42: [u8; 22],
}

const _: () = {
    use core::mem::{align_of, offset_of, size_of};
    type E = ErrorLogEntry;
    assert!(size_of::<E>() == ErrorLogEntry::SIZE);
    assert!(align_of::<E>() == 1);
    assert!(offset_of!(E, error_count) == 0);
    assert!(offset_of!(E, sqid) == 8);
    assert!(offset_of!(E, cid) == 10);
    assert!(offset_of!(E, status_field) == 12);
    assert!(offset_of!(E, parameter_error_location) == 14);
    assert!(offset_of!(E, lba) == 16);
    assert!(offset_of!(E, nsid) == 24);
    assert!(offset_of!(E, vendor_specific) == 28);
    assert!(offset_of!(E, command_specific) == 32);
    assert!(offset_of!(E, trtype_specific) == 40);
};

impl ErrorLogEntry {
    /// Size of one entry in bytes.
    pub const SIZE: usize = 64;

    /// Views a 64-byte buffer as one entry; [`DecodeError::WrongLength`]
    /// for any other length.
    pub fn parse(bytes: &[u8]) -> Result<&ErrorLogEntry, DecodeError> {
        ErrorLogEntry::ref_from_bytes(bytes).map_err(|_| DecodeError::WrongLength {
            what: "Error Information log entry",
            expected: ErrorLogEntry::SIZE,
            actual: bytes.len(),
        })
    }

    /// Views a whole Error Information log page (a multiple of 64 bytes) as
    /// its entries, including empty ones (Error Count 0).
    /// [`DecodeError::WrongLength`] when the length is not a multiple of 64
    /// (`expected` then names the next smaller multiple).
    pub fn parse_page(bytes: &[u8]) -> Result<&[ErrorLogEntry], DecodeError> {
        <[ErrorLogEntry]>::ref_from_bytes(bytes).map_err(|_| DecodeError::WrongLength {
            what: "Error Information log page",
            expected: bytes.len() / ErrorLogEntry::SIZE * ErrorLogEntry::SIZE,
            actual: bytes.len(),
        })
    }

    /// An all-zero (empty) entry, for the emulator.
    pub fn new_zeroed() -> ErrorLogEntry {
        <ErrorLogEntry as FromZeros>::new_zeroed()
    }

    /// Error Count; 0 = empty entry.
    pub fn error_count(&self) -> u64 {
        self.error_count.get()
    }

    /// Submission Queue ID (`FFFFh` = not queue specific).
    pub fn sqid(&self) -> u16 {
        self.sqid.get()
    }

    /// Command ID (`FFFFh` = not command specific).
    pub fn cid(&self) -> u16 {
        self.cid.get()
    }

    /// The status of the failed command (phase bit ignored).
    pub fn status(&self) -> Status {
        Status::from_field(self.status_field.get())
    }

    /// Parameter Error Location, raw.
    pub fn parameter_error_location(&self) -> u16 {
        self.parameter_error_location.get()
    }

    /// LBA of the error, in logical blocks.
    pub fn lba(&self) -> u64 {
        self.lba.get()
    }

    /// Namespace ID (`FFFF_FFFFh` = not namespace specific).
    pub fn nsid(&self) -> u32 {
        self.nsid.get()
    }

    /// Sets Error Count.
    pub fn set_error_count(&mut self, v: u64) {
        self.error_count = U64::new(v);
    }

    /// Sets SQID.
    pub fn set_sqid(&mut self, v: u16) {
        self.sqid = U16::new(v);
    }

    /// Sets CID.
    pub fn set_cid(&mut self, v: u16) {
        self.cid = U16::new(v);
    }

    /// Sets the status field (phase bit 0).
    pub fn set_status(&mut self, status: Status) {
        self.status_field = U16::new(status.to_field(false));
    }

    /// Sets Parameter Error Location.
    pub fn set_parameter_error_location(&mut self, v: u16) {
        self.parameter_error_location = U16::new(v);
    }

    /// Sets LBA.
    pub fn set_lba(&mut self, v: u64) {
        self.lba = U64::new(v);
    }

    /// Sets NSID.
    pub fn set_nsid(&mut self, v: u32) {
        self.nsid = U32::new(v);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::status::generic;
    use std::vec;
    use zerocopy::IntoBytes;

    #[test]
    fn smart_round_trip() {
        let mut s = SmartLog::new_zeroed();
        s.set_composite_temperature(310);
        s.set_available_spare(100);
        s.set_available_spare_threshold(10);
        s.set_percentage_used(3);
        s.set_data_units_read(u128::MAX - 1);
        s.set_data_units_written(7);
        s.set_host_read_commands(8);
        s.set_host_write_commands(9);
        s.set_power_cycles(10);
        s.set_power_on_hours(11);
        s.set_unsafe_shutdowns(12);
        s.set_media_errors(13);
        s.set_num_err_log_entries(14);
        let b = s.as_bytes();
        assert_eq!(b.len(), 512);
        assert_eq!(&b[1..3], &310u16.to_le_bytes());
        assert_eq!(&b[32..48], &(u128::MAX - 1).to_le_bytes());
        assert_eq!(b[48], 7);
        assert_eq!(b[176], 14);
        let p = SmartLog::parse(b).unwrap();
        assert_eq!(p.composite_temperature(), 310);
        assert_eq!(p.available_spare(), 100);
        assert_eq!(p.available_spare_threshold(), 10);
        assert_eq!(p.percentage_used(), 3);
        assert_eq!(p.data_units_read(), u128::MAX - 1);
        assert_eq!(p.data_units_written(), 7);
        assert_eq!(p.host_read_commands(), 8);
        assert_eq!(p.host_write_commands(), 9);
        assert_eq!(p.power_cycles(), 10);
        assert_eq!(p.power_on_hours(), 11);
        assert_eq!(p.unsafe_shutdowns(), 12);
        assert_eq!(p.media_errors(), 13);
        assert_eq!(p.num_err_log_entries(), 14);
        assert_eq!(
            SmartLog::parse(&b[..511]),
            Err(DecodeError::WrongLength { what: "SMART / Health log", expected: 512, actual: 511 })
        );
        let big = vec![0u8; 513];
        assert!(SmartLog::parse(&big).is_err());
        assert!(SmartLog::parse(&big[1..]).is_ok());
    }

    #[test]
    fn error_log() {
        let mut e = ErrorLogEntry::new_zeroed();
        e.set_error_count(5);
        e.set_sqid(1);
        e.set_cid(0x42);
        e.set_status(Status::generic(generic::LBA_OUT_OF_RANGE).with_dnr(true));
        e.set_parameter_error_location(0xFFFF);
        e.set_lba(0x1234);
        e.set_nsid(1);
        let b = e.as_bytes();
        assert_eq!(b.len(), 64);
        assert_eq!(b[0], 5);
        assert_eq!(&b[12..14], &(0x80u16 << 1 | 1 << 15).to_le_bytes());
        let p = ErrorLogEntry::parse(b).unwrap();
        assert_eq!(p.error_count(), 5);
        assert_eq!(p.sqid(), 1);
        assert_eq!(p.cid(), 0x42);
        assert_eq!(p.status(), Status::generic(generic::LBA_OUT_OF_RANGE).with_dnr(true));
        assert_eq!(p.parameter_error_location(), 0xFFFF);
        assert_eq!(p.lba(), 0x1234);
        assert_eq!(p.nsid(), 1);
        assert!(ErrorLogEntry::parse(&b[..63]).is_err());

        let mut page = vec![0u8; 4 * 64];
        page[64..128].copy_from_slice(b);
        let entries = ErrorLogEntry::parse_page(&page).unwrap();
        assert_eq!(entries.len(), 4);
        assert_eq!(entries[0].error_count(), 0);
        assert_eq!(entries[1].cid(), 0x42);
        assert!(ErrorLogEntry::parse_page(&page[..100]).is_err());
        assert_eq!(ErrorLogEntry::parse_page(&[]).unwrap().len(), 0);
    }
}
