//! What each item of a cell must come back as, and the cell's tally:
//! items by outcome, wrong bytes, how far waits ran past their deadlines,
//! and the first few problems in words.

use std::time::Duration;

use nvme_regs::Status;
use tutti_kv::ItemStatus;

/// Problems kept in words per cell (the rest are only counted).
const KEEP_PROBLEMS: usize = 4;

/// The status an item must have.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Want {
    /// A durable put.
    Ok,
    /// A verified get of an object of this many bytes.
    Hit(u64),
    /// The media error injected on this item's read or write: a device
    /// error carrying this NVMe status (SCT and SC; DNR not compared).
    DeviceError(Status),
    /// No object: the key whose put failed by an injected fault.
    Miss,
    /// A read completing past the wait's deadline: `Timeout`; or, where
    /// `late_hit_allowed` (GPU-executed: the wait returns when the kernel
    /// ends, docs/gpu.md "Limits"), a verified hit of this many bytes.
    Late {
        /// The object's length, bytes.
        len: u64,
        /// Whether a hit is acceptable too.
        late_hit_allowed: bool,
    },
}

/// How one item came out against what it had to be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The success it had to be: its bytes are to be compared.
    Good,
    /// The injected failure it had to be: its bytes are not compared.
    Injected,
    /// Anything else.
    Bad,
}

/// Judges one item's status.
pub fn judge(got: &ItemStatus, want: Want) -> Verdict {
    match (want, got) {
        (Want::Ok, ItemStatus::Ok) => Verdict::Good,
        (Want::Hit(n), ItemStatus::Hit { len }) if *len == n => Verdict::Good,
        (Want::DeviceError(s), ItemStatus::Device { status: Some(g), .. })
            if g.sct == s.sct && g.sc == s.sc =>
        {
            Verdict::Injected
        }
        (Want::Miss, ItemStatus::Miss) => Verdict::Injected,
        (Want::Late { .. }, ItemStatus::Timeout) => Verdict::Injected,
        (Want::Late { len: n, late_hit_allowed: true }, ItemStatus::Hit { len }) if *len == n => {
            Verdict::Good
        }
        _ => Verdict::Bad,
    }
}

/// A cell's (or one lane's) account.
#[derive(Debug, Clone, Default)]
pub struct Tally {
    /// Items waited on.
    pub items: u64,
    /// Items that came back as the success they had to be.
    pub good: u64,
    /// Items that came back as the injected failure they had to be.
    pub injected: u64,
    /// Items that came back as anything else.
    pub bad: u64,
    /// Bytes that differ from what was put (or from zero past an object).
    pub wrong_bytes: u64,
    /// The furthest a wait returned past its deadline, among waits that
    /// must honour it.
    pub worst_overrun: Duration,
    /// The furthest a GPU-executed wait returned past its deadline where
    /// that is the documented behaviour (the wait ends with its kernel,
    /// docs/gpu.md "Limits"): reported, not failed.
    pub kernel_bound: Duration,
    /// Problems not counted above (a wait that overran its bound, a drive
    /// that counted a protocol violation, a fault that did not fire).
    pub other: u64,
    /// The first few problems, in words.
    pub problems: Vec<String>,
}

impl Tally {
    /// Records a problem in words (kept only for the first few).
    pub fn problem(&mut self, what: String) {
        if self.problems.len() < KEEP_PROBLEMS {
            self.problems.push(what);
        }
    }

    /// Records a problem that no item count shows.
    pub fn fail(&mut self, what: String) {
        self.other += 1;
        self.problem(what);
    }

    /// Counts one item's status; `what` names it for the problem line.
    pub fn item(&mut self, what: &dyn Fn() -> String, got: &ItemStatus, want: Want) -> Verdict {
        self.items += 1;
        let v = judge(got, want);
        match v {
            Verdict::Good => self.good += 1,
            Verdict::Injected => self.injected += 1,
            Verdict::Bad => {
                self.bad += 1;
                self.problem(format!("{}: {got} (expected {want:?})", what()));
            }
        }
        v
    }

    /// Counts `n` wrong bytes in the object `what` names.
    pub fn bytes(&mut self, what: &dyn Fn() -> String, n: u64) {
        if n > 0 {
            self.wrong_bytes += n;
            self.problem(format!("{}: {n} wrong bytes", what()));
        }
    }

    /// Adds another lane's account.
    pub fn merge(&mut self, o: Tally) {
        self.items += o.items;
        self.good += o.good;
        self.injected += o.injected;
        self.bad += o.bad;
        self.wrong_bytes += o.wrong_bytes;
        self.worst_overrun = self.worst_overrun.max(o.worst_overrun);
        self.kernel_bound = self.kernel_bound.max(o.kernel_bound);
        self.other += o.other;
        for p in o.problems {
            self.problem(p);
        }
    }

    /// Whether nothing went wrong.
    pub fn clean(&self) -> bool {
        self.bad == 0 && self.wrong_bytes == 0 && self.other == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nvme_regs::status::media;

    fn device(s: Status) -> ItemStatus {
        ItemStatus::Device { status: Some(s), drive: Some("d0".into()), message: s.to_string() }
    }

    #[test]
    fn statuses_are_judged_against_what_they_had_to_be() {
        let read_err = Status::media(media::UNRECOVERED_READ_ERROR);
        assert_eq!(judge(&ItemStatus::Ok, Want::Ok), Verdict::Good);
        assert_eq!(judge(&ItemStatus::Hit { len: 5 }, Want::Hit(5)), Verdict::Good);
        assert_eq!(judge(&ItemStatus::Hit { len: 4 }, Want::Hit(5)), Verdict::Bad);
        assert_eq!(judge(&ItemStatus::Miss, Want::Hit(5)), Verdict::Bad);
        assert_eq!(judge(&device(read_err.with_dnr(true)), Want::DeviceError(read_err)), Verdict::Injected);
        let write_err = Status::media(media::WRITE_FAULT);
        assert_eq!(judge(&device(write_err), Want::DeviceError(read_err)), Verdict::Bad);
        assert_eq!(judge(&device(read_err), Want::Hit(5)), Verdict::Bad);
        let late = |ok| Want::Late { len: 5, late_hit_allowed: ok };
        assert_eq!(judge(&ItemStatus::Timeout, late(false)), Verdict::Injected);
        assert_eq!(judge(&ItemStatus::Hit { len: 5 }, late(false)), Verdict::Bad);
        assert_eq!(judge(&ItemStatus::Hit { len: 5 }, late(true)), Verdict::Good);
        assert_eq!(judge(&ItemStatus::Timeout, Want::Hit(5)), Verdict::Bad);
    }

    #[test]
    fn a_tally_keeps_the_first_problems_and_counts_all() {
        let mut t = Tally::default();
        for i in 0..10 {
            t.item(&|| format!("item {i}"), &ItemStatus::Miss, Want::Ok);
        }
        assert_eq!((t.items, t.bad, t.problems.len()), (10, 10, KEEP_PROBLEMS));
        assert!(!t.clean());
        let mut u = Tally::default();
        u.merge(t);
        assert_eq!(u.bad, 10);
    }
}
