//! One workload thread of a crash point: random puts (batches of 1 to 3,
//! sometimes the same key twice), gets, removes, syncs and remove chains
//! (put K, put K again, remove K, sync) on its own keys, recording what
//! happened to each key.

use std::ops::Range;

use tutti_kv::{Get, ItemStatus, KvMemory, KvStore, Put, Value};

use super::history::{is_a_version_of, Event, History};
use super::{len_of, Power, Rng, SLOT};
use crate::common::{fill, key, T};

/// Bytes of a worker's buffer: three payloads and one landing area.
pub const WORKER_BUF: usize = 4 * SLOT as usize;

/// What one operation saw.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// It went through (or was refused for a reason of its own, such as a
    /// full store).
    Done,
    /// A device failed it: the power is failing.
    Failed,
}

/// A workload thread.
pub struct Worker<'a> {
    kv: &'a KvStore,
    mem: &'a KvMemory,
    buf: &'a mut [u8],
    /// The keys this thread puts and removes (no other thread does).
    keys: Range<u64>,
    /// Every key of the point: gets read any of them.
    all_keys: u64,
    /// Versions are `first_version + n * stride`: unique in the point.
    next_version: u64,
    stride: u64,
    /// What happened to its keys.
    pub history: History,
    /// Gets that returned bytes not of one version of their key.
    pub wrong_bytes: u64,
    /// Puts acknowledged.
    pub puts_acked: u64,
}

impl<'a> Worker<'a> {
    /// Worker `index` of `threads`, owning `keys`, with a registered
    /// buffer of [`WORKER_BUF`] bytes.
    pub fn new(
        kv: &'a KvStore,
        mem: &'a KvMemory,
        buf: &'a mut [u8],
        keys: Range<u64>,
        all_keys: u64,
        (index, threads): (usize, usize),
    ) -> Self {
        Self {
            kv,
            mem,
            buf,
            keys,
            all_keys,
            next_version: 1 + index as u64,
            stride: threads as u64,
            history: History::new(),
            wrong_bytes: 0,
            puts_acked: 0,
        }
    }

    /// Runs up to `ops` random operations (puts 4 in 10, gets 2, removes
    /// 1.5, syncs 1.5, remove chains 1), stopping at the first failure
    /// (after cutting the power of every drive) or once the power is off.
    pub fn run_random(&mut self, rng: &mut Rng, ops: usize, power: &Power<'_>) {
        for _ in 0..ops {
            if power.is_off() {
                return;
            }
            let k = self.own_key(rng);
            let step = match rng.below(20) {
                0..=7 => self.put(rng),
                8..=11 => self.get(rng.below(self.all_keys)),
                12..=14 => self.remove(k),
                15..=17 => self.sync(),
                _ => self.chain(k),
            };
            if step == Step::Failed {
                power.cut();
                return;
            }
        }
    }

    /// Overwrites and syncs until the power is off (at most `ops`
    /// operations): the other threads of the remove + sync race.
    pub fn run_overwrites(&mut self, rng: &mut Rng, ops: usize, power: &Power<'_>) {
        for i in 0..ops {
            if power.is_off() {
                return;
            }
            let step = if i % 2 == 0 { self.put(rng) } else { self.sync() };
            if step == Step::Failed {
                power.cut();
                return;
            }
        }
    }

    /// Runs remove chains on its keys and cuts every drive's power right
    /// after the `cut_after`-th chain's `sync` returned `Ok` (or at the
    /// first failure).
    pub fn run_chains(&mut self, cut_after: usize, power: &Power<'_>) {
        for c in 0..=cut_after {
            let k = self.keys.start + c as u64 % (self.keys.end - self.keys.start);
            if self.chain(k) == Step::Failed {
                break;
            }
        }
        power.cut();
    }

    fn own_key(&self, rng: &mut Rng) -> u64 {
        self.keys.start + rng.below(self.keys.end - self.keys.start)
    }

    fn version(&mut self) -> u64 {
        let v = self.next_version;
        self.next_version += self.stride;
        v
    }

    /// A batch of 1 to 3 puts of its keys (the same key twice now and
    /// then: the later item wins).
    fn put(&mut self, rng: &mut Rng) -> Step {
        let n = 1 + rng.below(3) as usize;
        let mut items: Vec<(u64, u64)> = Vec::with_capacity(n);
        for j in 0..n {
            let k = match items.last() {
                Some(&(prev, _)) if rng.below(4) == 0 => prev,
                _ => self.own_key(rng),
            };
            let v = self.version();
            fill(&mut self.buf[j * SLOT as usize..(j + 1) * SLOT as usize], k, v);
            items.push((k, v));
        }
        self.put_items(&items)
    }

    /// Puts (key, version) items, recording each as acknowledged or not.
    fn put_items(&mut self, items: &[(u64, u64)]) -> Step {
        let mem = self.mem;
        let puts: Vec<Put> = items
            .iter()
            .enumerate()
            .map(|(j, &(k, v))| Put {
                key: key(k),
                value: Value { memory: mem, offset: j as u64 * SLOT, len: len_of(k, v) },
            })
            .collect();
        let st = self.kv.put_sync(&puts, T);
        let mut step = Step::Done;
        for (j, &(k, v)) in items.iter().enumerate() {
            let s = st.as_ref().map_or(None, |s| Some(&s[j]));
            let acked = s == Some(&ItemStatus::Ok);
            self.puts_acked += u64::from(acked);
            if !acked && s != Some(&ItemStatus::Full) {
                step = Step::Failed;
            }
            self.history.entry(k).or_default().push(Event::Put(v, acked));
        }
        step
    }

    /// A get of any key of the point: a hit must be exactly one version of
    /// that key.
    fn get(&mut self, k: u64) -> Step {
        let into = Value { memory: self.mem, offset: 3 * SLOT, len: SLOT };
        match self.kv.get_sync(&[Get { key: key(k), into }], T) {
            Ok(s) => match s[0] {
                ItemStatus::Hit { len } => {
                    if !is_a_version_of(&self.buf[3 * SLOT as usize..], k, len) {
                        self.wrong_bytes += 1;
                        eprintln!("key {k}: a get returned {len} bytes of no version of it");
                    }
                    Step::Done
                }
                ItemStatus::Device { .. } | ItemStatus::Timeout => Step::Failed,
                _ => Step::Done,
            },
            Err(_) => Step::Failed,
        }
    }

    fn remove(&mut self, k: u64) -> Step {
        self.kv.remove(&[key(k)]);
        self.history.entry(k).or_default().push(Event::Remove(false));
        Step::Done
    }

    /// A sync: once it returns `Ok`, every remove this thread made before
    /// it is durable.
    fn sync(&mut self) -> Step {
        if self.kv.sync().is_err() {
            return Step::Failed;
        }
        for e in self.history.values_mut().flatten() {
            if let Event::Remove(synced) = e {
                *synced = true;
            }
        }
        Step::Done
    }

    /// Put K, put K again (two records of K on the media), remove K, sync.
    fn chain(&mut self, k: u64) -> Step {
        for _ in 0..2 {
            let v = self.version();
            fill(&mut self.buf[..SLOT as usize], k, v);
            if self.put_items(&[(k, v)]) == Step::Failed {
                return Step::Failed;
            }
        }
        self.remove(k);
        self.sync()
    }
}
