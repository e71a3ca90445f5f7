//! The watchdog's view of a cell: which blocking call each lane is in
//! (a wait, a submission, a copy, the runtime's start or shutdown), since
//! when, and by when it must have returned. The cell's worker marks each
//! one ([`Watch::within`]); the main thread polls [`Watch::overdue`] and
//! calls the cell hung when one runs past its limit plus the hang bound.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Lanes a cell drives at once (a pair of stores at most).
pub const LANES: usize = 2;

/// One wait in progress.
#[derive(Debug, Clone)]
struct Waiting {
    since: Instant,
    /// Its deadline plus the lateness it is allowed.
    limit: Duration,
    /// What it waits for, in words.
    what: String,
}

/// The waits in progress, one slot per lane.
#[derive(Debug, Default)]
pub struct Watch {
    lanes: Mutex<[Option<Waiting>; LANES]>,
}

impl Watch {
    /// Runs `f` (one blocking call that must return within `limit`: for a
    /// wait, its deadline plus any lateness it is allowed) marked as lane
    /// `lane`'s call `what`; returns its result and how long it took.
    pub fn within<T>(
        &self,
        lane: usize,
        what: &dyn Fn() -> String,
        limit: Duration,
        f: impl FnOnce() -> T,
    ) -> (T, Duration) {
        let since = Instant::now();
        self.set(lane, Some(Waiting { since, limit, what: what() }));
        let r = f();
        let took = since.elapsed();
        self.set(lane, None);
        (r, took)
    }

    fn set(&self, lane: usize, w: Option<Waiting>) {
        let mut lanes = self.lanes.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(slot) = lanes.get_mut(lane) {
            *slot = w;
        }
    }

    /// The first wait that has run longer than its limit plus `hang`, in
    /// words, or `None`.
    pub fn overdue(&self, hang: Duration) -> Option<String> {
        let lanes = self.lanes.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        lanes.iter().find_map(|w| {
            let w = w.as_ref()?;
            let ran = w.since.elapsed();
            (ran > w.limit + hang).then(|| {
                format!(
                    "{} has not returned after {} ms (limit {} ms + hang bound {} ms)",
                    w.what,
                    ran.as_millis(),
                    w.limit.as_millis(),
                    hang.as_millis()
                )
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wait_past_its_limit_and_the_hang_bound_is_overdue() {
        let w = std::sync::Arc::new(Watch::default());
        let w2 = w.clone();
        let t = std::thread::spawn(move || {
            w2.within(1, &|| "get batch 0".to_owned(), Duration::from_millis(10), || {
                std::thread::sleep(Duration::from_millis(300))
            })
        });
        std::thread::sleep(Duration::from_millis(150));
        let o = w.overdue(Duration::from_millis(50)).expect("overdue");
        assert!(o.starts_with("get batch 0 has not returned"), "{o}");
        assert!(w.overdue(Duration::from_secs(60)).is_none());
        let ((), took) = t.join().unwrap();
        assert!(took >= Duration::from_millis(300));
        assert!(w.overdue(Duration::ZERO).is_none(), "the wait returned");
    }
}
