//! Scriptable fault injection: rules that make chosen commands fail, never
//! complete, complete late, complete in ways that break the queue protocol
//! (twice, with a foreign CID, with a lagging SQHD, phase tag before body),
//! bring the whole controller down (CSTS.CFS), or cut its power.
//!
//! The rules live in [`Shared`](crate::controller::Shared), so the
//! [`crate::Emulator`] handle can add and clear them while the controller
//! thread runs. The thread consults them once per fetched command, before
//! executing it. With no rules the check is one relaxed atomic load; the
//! lock is taken only while at least one rule is installed.

use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use nvme_regs::opcode::nvm_opcode;
use nvme_regs::{Sqe, Status};

/// Which commands a [`FaultRule`] matches. Every condition that is `Some`
/// must hold; the default (all `None`, `io_only` false) matches every
/// command.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct FaultMatch {
    /// The SQ the command was fetched from (0 = admin).
    pub qid: Option<u16>,
    /// The command's opcode (admin or NVM, depending on the SQ).
    pub opcode: Option<u8>,
    /// The command's NSID (CDW1).
    pub nsid: Option<u32>,
    /// I/O commands (Read, Write, Write Uncorrectable, Compare, Write
    /// Zeroes, Verify) whose blocks `SLBA..=SLBA + NLB` overlap this range
    /// of logical blocks. A rule with an LBA range never matches admin
    /// commands or I/O commands without an LBA range (Flush, Dataset
    /// Management); an empty range matches nothing.
    pub lba: Option<Range<u64>>,
    /// Match only commands of I/O SQs (qid != 0). Admin and NVM opcodes
    /// share numbers (01h is both Write and Create I/O SQ), so a rule meant
    /// for I/O that names only an opcode should set this.
    pub io_only: bool,
}

/// What happens to a command a [`FaultRule`] matched.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FaultAction {
    /// Complete with this status (no data moved), e.g.
    /// `Status::media(media::UNRECOVERED_READ_ERROR).with_dnr(true)`. The
    /// command is not executed; its CQE is posted at once (the timing model
    /// does not delay it).
    Fail(Status),
    /// Fetch it (the SQ head advances, SQHD reflects it) but never post a
    /// completion. The command is not executed. The host's CID stays
    /// outstanding until it deletes the SQ (Delete I/O SQ completes it
    /// with "Command Aborted due to SQ Deletion") or resets the controller
    /// (no completion); Abort never aborts.
    NeverComplete,
    /// Execute it normally, but post its CQE only after this extra delay
    /// (added to the timing model's due time when there is a timing model).
    Delay(Duration),
    /// Execute it normally and post its CQE twice: the second is a
    /// duplicate (same CID, status and DW0) in the next CQ slot, with the
    /// SQHD current when it is written. A driver should count the second
    /// as a protocol error, never complete another request with it.
    CompleteTwice,
    /// Execute it normally, but post its CQE with this CID instead of the
    /// command's. The command itself then never completes (its CID stays
    /// outstanding at the host until a controller reset), and the CQE
    /// names a CID the host may not have in flight.
    UnknownCid(u16),
    /// Execute and complete it normally, but report in its CQE an SQHD one
    /// entry behind the SQ head (`(head + size - 1) % size`), as a
    /// controller that publishes its head late. Later CQEs carry the real
    /// head again. (A CQE posted after its SQ was deleted still reports
    /// SQHD 0.)
    LaggingSqhd,
    /// Execute and complete it normally, but write its CQE's DW3 (CID,
    /// status, phase tag) first and the body (DW0 to DW2: result, SQHD,
    /// SQID) about 200 us later, as a device that does not order its
    /// writes. The entry ends up correct, but a host that sees the new
    /// phase tag in the meantime reads the slot's previous body (zeroes on
    /// the CQ's first pass, so SQID 0, or the CQE written there one pass
    /// earlier). The controller thread spins through the delay.
    PhaseBeforeBody,
    /// A fatal controller error on this command: it is not executed and
    /// never completed; CSTS.CFS becomes 1 and the controller stops
    /// processing every queue (no fetches, no completions, scheduled ones
    /// included) until the host resets it (CC.EN 1 -> 0 clears CFS and
    /// deletes all queues, as on real hardware).
    ControllerFatal,
    /// The power fails on this command, as [`crate::Emulator::power_fail`]
    /// from inside the controller: the command is executed (a Write's data
    /// goes into the write cache, not durable unless FUA), then, before its
    /// CQE is posted, the controller stops answering (registers read all
    /// ones, nothing more is fetched or completed, this command included),
    /// each non-durable block is kept or lost, and the backing store is
    /// released. [`crate::Emulator::power_fail_report`] has the outcome.
    /// Use [`FaultRule::skip`] to cut the power on the k-th matching
    /// command.
    PowerFail,
}

/// One fault rule: the commands it matches, what happens to them, and how
/// many times.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FaultRule {
    /// The commands it applies to.
    pub matches: FaultMatch,
    /// What it does to them.
    pub action: FaultAction,
    /// `None` = every match; `Some(n)` = the first `n` matches only (the
    /// rule is removed once spent). Counted after `skip`.
    pub times: Option<u64>,
    /// Matching commands to let pass first: the rule applies from the
    /// `skip + 1`-th match on (0 = from the first). A command a rule lets
    /// pass is checked against the rules after it, and is not counted in
    /// [`crate::EmuStats::faults_injected`].
    pub skip: u64,
}

impl FaultMatch {
    /// Whether the command `sqe` fetched from SQ `qid` matches.
    pub(crate) fn matches(&self, qid: u16, sqe: &Sqe) -> bool {
        if self.qid.is_some_and(|q| q != qid)
            || (self.io_only && qid == 0)
            || self.opcode.is_some_and(|o| o != sqe.opcode())
            || self.nsid.is_some_and(|n| n != sqe.nsid)
        {
            return false;
        }
        match &self.lba {
            None => true,
            Some(r) => match command_lbas(qid, sqe) {
                // Blocks slba..=last overlap r.start..r.end.
                Some((slba, last)) => slba < r.end && r.start <= last && r.start < r.end,
                None => false,
            },
        }
    }
}

/// Verify (0Ch), not among `nvme_regs`' opcodes (the emulator rejects it).
const VERIFY: u8 = 0x0C;

/// First and last logical block of an I/O command that carries SLBA (CDW10,
/// CDW11) and a zero-based NLB (CDW12 bits 15:0).
fn command_lbas(qid: u16, sqe: &Sqe) -> Option<(u64, u64)> {
    if qid == 0 {
        return None;
    }
    match sqe.opcode() {
        nvm_opcode::READ
        | nvm_opcode::WRITE
        | nvm_opcode::WRITE_UNCORRECTABLE
        | nvm_opcode::COMPARE
        | nvm_opcode::WRITE_ZEROES
        | VERIFY => {
            let slba = u64::from(sqe.cdw10) | u64::from(sqe.cdw11) << 32;
            let nlb = u64::from(sqe.cdw12 & 0xFFFF);
            Some((slba, slba.saturating_add(nlb)))
        }
        _ => None,
    }
}

/// The installed rules, shared by the handle and the controller thread.
#[derive(Debug, Default)]
pub(crate) struct Faults {
    /// `true` while `rules` may be non-empty: the fast path reads only this.
    present: AtomicBool,
    rules: Mutex<Vec<FaultRule>>,
    /// Commands a rule applied to.
    pub injected: AtomicU64,
}

impl Faults {
    pub(crate) fn new(rules: Vec<FaultRule>) -> Self {
        let f = Faults::default();
        f.lock().extend(rules);
        f.present.store(!f.lock().is_empty(), Ordering::Release);
        f
    }

    fn lock(&self) -> MutexGuard<'_, Vec<FaultRule>> {
        // A panic while holding the lock leaves a valid Vec: keep using it.
        self.rules.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Appends `rule` (checked after the rules already installed).
    pub(crate) fn add(&self, rule: FaultRule) {
        let mut rules = self.lock();
        if rule.times == Some(0) {
            return;
        }
        rules.push(rule);
        self.present.store(true, Ordering::SeqCst);
    }

    /// Removes every rule.
    pub(crate) fn clear(&self) {
        let mut rules = self.lock();
        rules.clear();
        self.present.store(false, Ordering::SeqCst);
    }

    /// The action for the command `sqe` fetched from SQ `qid`: the first
    /// matching rule's, using up one of its `times`. `None` (after one
    /// atomic load) when no rule is installed.
    #[inline]
    pub(crate) fn check(&self, qid: u16, sqe: &Sqe) -> Option<FaultAction> {
        if !self.present.load(Ordering::Acquire) {
            return None;
        }
        self.check_slow(qid, sqe)
    }

    #[cold]
    fn check_slow(&self, qid: u16, sqe: &Sqe) -> Option<FaultAction> {
        let mut rules = self.lock();
        let mut found = None;
        for (i, r) in rules.iter_mut().enumerate() {
            if r.times == Some(0) || !r.matches.matches(qid, sqe) {
                continue;
            }
            if r.skip > 0 {
                r.skip -= 1;
                continue;
            }
            found = Some(i);
            break;
        }
        let i = found?;
        let action = rules[i].action.clone();
        if let Some(n) = &mut rules[i].times {
            *n -= 1;
            if *n == 0 {
                rules.remove(i);
                if rules.is_empty() {
                    self.present.store(false, Ordering::SeqCst);
                }
            }
        }
        self.injected.fetch_add(1, Ordering::Relaxed);
        Some(action)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nvme_regs::status::media;

    fn read(slba: u64, blocks: u32) -> Sqe {
        Sqe {
            cdw0: u32::from(nvm_opcode::READ),
            nsid: 1,
            cdw10: slba as u32,
            cdw11: (slba >> 32) as u32,
            cdw12: blocks - 1,
            ..Sqe::default()
        }
    }

    #[test]
    fn lba_overlap_is_inclusive_of_the_last_block() {
        let m = FaultMatch { lba: Some(10..11), ..Default::default() };
        assert!(m.matches(1, &read(10, 1)));
        assert!(m.matches(1, &read(8, 3))); // 8..=10
        assert!(!m.matches(1, &read(8, 2))); // 8..=9
        assert!(!m.matches(1, &read(11, 4)));
        assert!(!m.matches(0, &read(10, 1)), "admin SQ has no LBAs");
        let empty = FaultMatch { lba: Some(10..10), ..Default::default() };
        assert!(!empty.matches(1, &read(0, 64)));
        let q = FaultMatch {
            qid: Some(2),
            nsid: Some(1),
            opcode: Some(nvm_opcode::READ),
            lba: None,
            io_only: false,
        };
        assert!(q.matches(2, &read(0, 1)));
        assert!(!q.matches(1, &read(0, 1)));
    }

    #[test]
    fn io_only_keeps_an_nvm_opcode_off_the_admin_queue() {
        // 01h is Write on an I/O SQ and Create I/O SQ on the admin SQ.
        let create_sq = Sqe::new(nvm_opcode::WRITE, 0);
        let any = FaultMatch { opcode: Some(nvm_opcode::WRITE), ..Default::default() };
        assert!(any.matches(0, &create_sq), "without io_only an opcode matches both sets");
        let io = FaultMatch { io_only: true, ..any };
        assert!(!io.matches(0, &create_sq));
        assert!(io.matches(1, &Sqe::new(nvm_opcode::WRITE, 1)));
    }

    #[test]
    fn first_matching_rule_with_times_left_applies() {
        let fail = FaultAction::Fail(Status::media(media::UNRECOVERED_READ_ERROR));
        let f = Faults::new(vec![
            FaultRule {
                matches: FaultMatch { lba: Some(0..1), ..Default::default() },
                action: fail.clone(),
                times: Some(1),
                skip: 0,
            },
            FaultRule {
                matches: FaultMatch::default(),
                action: FaultAction::NeverComplete,
                times: Some(2),
                skip: 0,
            },
        ]);
        assert_eq!(f.check(1, &read(0, 1)), Some(fail));
        assert_eq!(f.check(1, &read(0, 1)), Some(FaultAction::NeverComplete));
        assert_eq!(f.check(1, &read(5, 1)), Some(FaultAction::NeverComplete));
        assert_eq!(f.check(1, &read(0, 1)), None);
        assert!(!f.present.load(Ordering::Relaxed), "spent rules are removed");
        assert_eq!(f.injected.load(Ordering::Relaxed), 3);
        f.add(FaultRule {
            matches: FaultMatch::default(),
            action: FaultAction::NeverComplete,
            times: None,
            skip: 0,
        });
        assert!(f.check(0, &read(0, 1)).is_some());
        f.clear();
        assert_eq!(f.check(0, &read(0, 1)), None);
    }

    #[test]
    fn skip_lets_matches_pass_to_later_rules_first() {
        let lba0 = FaultMatch { lba: Some(0..1), ..Default::default() };
        let f = Faults::new(vec![
            FaultRule { matches: lba0, action: FaultAction::PowerFail, times: Some(1), skip: 2 },
            FaultRule {
                matches: FaultMatch::default(),
                action: FaultAction::LaggingSqhd,
                times: None,
                skip: 0,
            },
        ]);
        assert_eq!(f.check(1, &read(5, 1)), Some(FaultAction::LaggingSqhd), "not a match: skip unchanged");
        assert_eq!(f.check(1, &read(0, 1)), Some(FaultAction::LaggingSqhd), "first match passes");
        assert_eq!(f.check(1, &read(0, 1)), Some(FaultAction::LaggingSqhd), "second match passes");
        assert_eq!(f.check(1, &read(0, 1)), Some(FaultAction::PowerFail), "the third applies");
        assert_eq!(f.check(1, &read(0, 1)), Some(FaultAction::LaggingSqhd), "spent");
        assert_eq!(f.injected.load(Ordering::Relaxed), 5);
    }
}
