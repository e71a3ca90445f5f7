//! One request of the replay against the tutti-kv store: ask
//! `lookup_prefix` how many of its blocks, from the first, the store
//! holds; load that prefix with `get` and verify every byte; save the rest
//! with `put`.

use std::time::{Duration, Instant};

use tutti_bench::{pattern_version, BlockKeys, LatencyRecorder, RestartHits, Summary, TraceRequest};
use tutti_kv::{Get, ItemStatus, Key, KvMemory, KvStore, Put, Value};

use super::staging::Staging;
use crate::interrupt::{Signal, Stop};

/// Bound on one batch's wait.
const WAIT: Duration = Duration::from_secs(60);
/// Blocks per batch (bounds the staging buffer).
pub const BATCH_BLOCKS: usize = 64;

/// A block of a request.
#[derive(Debug, Clone, Copy)]
struct Block {
    /// Trace hash id.
    hash: u64,
    /// Its store key.
    key: Key,
    /// Its pattern version (a function of the key).
    version: u64,
}

/// The replay between requests: the store, the staging buffer, and the
/// numbers so far.
pub struct Replay<'a> {
    /// The store.
    pub kv: &'a KvStore,
    /// The staging buffer's registration with `kv`.
    pub mem: &'a KvMemory,
    /// The staging buffer (at least [`BATCH_BLOCKS`] blocks).
    pub staging: &'a mut Staging,
    /// Key derivation.
    pub keys: &'a BlockKeys,
    /// Bytes per block.
    pub block_bytes: u64,
    /// Per-request load latency.
    pub latency: LatencyRecorder,
    /// Restart hits so far.
    pub restart: RestartHits,
    /// The summary so far.
    pub s: Summary,
    /// The current request's distinct blocks, in prompt order.
    blocks: Vec<Block>,
    /// Their keys (what `lookup_prefix` takes).
    block_keys: Vec<Key>,
    /// How many of `blocks`, from the first, the store holds.
    prefix: usize,
}

impl<'a> Replay<'a> {
    /// A replay of blocks of `block_bytes` bytes through `kv`, staged in
    /// `staging` (registered as `mem`), with summary `s` so far.
    pub fn new(
        kv: &'a KvStore,
        mem: &'a KvMemory,
        staging: &'a mut Staging,
        keys: &'a BlockKeys,
        block_bytes: u64,
        s: Summary,
    ) -> Self {
        Self {
            kv,
            mem,
            staging,
            keys,
            block_bytes,
            latency: LatencyRecorder::new(),
            restart: RestartHits::new(),
            s,
            blocks: Vec::new(),
            block_keys: Vec::new(),
            prefix: 0,
        }
    }

    /// Replays one request: its loads first (the prefix a serving engine
    /// would fetch), then its saves. Returns the signal when a stop request
    /// cut it short before one of its batches (it is then not counted).
    pub fn request(&mut self, req: &TraceRequest, stop: &Stop) -> Result<Option<Signal>, String> {
        self.plan(req);
        let d = match self.load(stop)? {
            Ok(d) => d,
            Err(signal) => return Ok(Some(signal)),
        };
        if self.prefix > 0 {
            self.latency.record(d);
            self.s.load_seconds += d.as_secs_f64();
            self.s.blocks_loaded += self.prefix as u64;
            self.s.bytes_loaded += self.prefix as u64 * self.block_bytes;
        }
        let (saved, full) = match self.save(stop)? {
            Err(signal) => return Ok(Some(signal)),
            Ok(counts) => counts,
        };
        self.s.blocks_saved += saved;
        self.s.bytes_saved += saved * self.block_bytes;
        self.s.blocks_uncacheable += full;
        self.s.requests += 1;
        Ok(None)
    }

    /// The request's distinct blocks (a hash id repeated within one request
    /// is the same block: loaded or saved once) and the prefix of them the
    /// store holds.
    fn plan(&mut self, req: &TraceRequest) {
        self.blocks.clear();
        self.block_keys.clear();
        for &hash in &req.hash_ids {
            if self.blocks.iter().any(|b| b.hash == hash) {
                continue;
            }
            let key = self.keys.key(hash);
            self.blocks.push(Block { hash, key, version: pattern_version(&key) });
            self.block_keys.push(key);
        }
        self.prefix = self.kv.lookup_prefix(&self.block_keys);
        for (i, b) in self.blocks.iter().enumerate() {
            self.restart.looked_up(b.hash, i < self.prefix);
        }
    }

    /// Loads the prefix batch by batch and verifies every byte. Returns
    /// the time the loads took (each batch's `get` and `wait_get`: what a
    /// serving engine waits for; the poisoning before and the verification
    /// after are the benchmark's own and not counted), or the signal that
    /// stopped it.
    fn load(&mut self, stop: &Stop) -> Result<Result<Duration, Signal>, String> {
        let bb = self.block_bytes as usize;
        let mut took = Duration::ZERO;
        for chunk in self.blocks[..self.prefix].chunks(BATCH_BLOCKS) {
            if let Some(signal) = stop.requested() {
                return Ok(Err(signal));
            }
            // Poison the staging area first, so that a read that moves no
            // data (or not all of it) cannot pass verification with bytes
            // left over from an earlier save.
            self.staging.poison(chunk.len() * bb)?;
            let gets: Vec<Get> = chunk
                .iter()
                .enumerate()
                .map(|(i, b)| Get {
                    key: b.key,
                    into: Value { memory: self.mem, offset: (i * bb) as u64, len: self.block_bytes },
                })
                .collect();
            let t = Instant::now();
            let statuses = self
                .kv
                .get(&gets)
                .and_then(|p| self.kv.wait_get(p, WAIT))
                .map_err(|e| format!("loading blocks: {}", tutti::error_chain(&e)))?;
            took += t.elapsed();
            for (i, (b, st)) in chunk.iter().zip(&statuses).enumerate() {
                check_load(self.staging, i * bb, self.block_bytes, b, st)?;
                self.s.blocks_verified += 1;
            }
        }
        Ok(Ok(took))
    }

    /// Saves the blocks after the prefix batch by batch, each filled with
    /// its pattern. Returns (blocks saved, blocks the full store refused),
    /// or the signal that stopped it.
    fn save(&mut self, stop: &Stop) -> Result<Result<(u64, u64), Signal>, String> {
        let bb = self.block_bytes as usize;
        let (mut saved, mut full) = (0, 0);
        for chunk in self.blocks[self.prefix..].chunks(BATCH_BLOCKS) {
            if let Some(signal) = stop.requested() {
                return Ok(Err(signal));
            }
            for (i, b) in chunk.iter().enumerate() {
                self.staging.fill(i * bb, bb, b.hash, b.version)?;
            }
            let puts: Vec<Put> = chunk
                .iter()
                .enumerate()
                .map(|(i, b)| Put {
                    key: b.key,
                    value: Value { memory: self.mem, offset: (i * bb) as u64, len: self.block_bytes },
                })
                .collect();
            let t = Instant::now();
            let statuses = self
                .kv
                .put(&puts)
                .and_then(|p| self.kv.wait_put(p, WAIT))
                .map_err(|e| format!("saving blocks: {}", tutti::error_chain(&e)))?;
            self.s.save_seconds += t.elapsed().as_secs_f64();
            for (b, st) in chunk.iter().zip(&statuses) {
                match st {
                    ItemStatus::Ok => saved += 1,
                    ItemStatus::Full => full += 1,
                    other => return Err(format!("save of block {} failed: {other:?}", b.hash)),
                }
            }
        }
        Ok(Ok((saved, full)))
    }

    /// The summary, with the run's wall time, load latencies and restart
    /// hits.
    pub fn finish(mut self, elapsed: Duration) -> Summary {
        self.s.elapsed_seconds = elapsed.as_secs_f64();
        self.s.set_load_latency(&self.latency);
        self.s.restart_lookups = self.restart.lookups();
        self.s.restart_hits = self.restart.hits();
        self.s.finish();
        self.s
    }
}

/// Checks the load of block `b` into staging bytes `at..at + len`: the
/// store's verdict `st`, then every byte against the block's pattern
/// (also when the store's checksum failed, to say what arrived).
fn check_load(staging: &mut Staging, at: usize, len: u64, b: &Block, st: &ItemStatus) -> Result<(), String> {
    let crc = match st {
        ItemStatus::Hit { len: got } if *got == len => None,
        ItemStatus::Hit { len: got } => {
            return Err(format!("block {} loaded {got} bytes, not {len}", b.hash));
        }
        ItemStatus::ChecksumMismatch { stored, computed } => Some((*stored, *computed)),
        other => return Err(format!("load of block {} failed: {other:?}", b.hash)),
    };
    let verdict = staging.verify(at, len as usize, b.hash, b.version);
    match (verdict, crc) {
        (Ok(()), None) => Ok(()),
        (Err(m), crc) => Err(format!(
            "block {} (pattern version {:#018x}) loaded wrong data: byte {} is {:#04x}, expected {:#04x}{}",
            b.hash,
            b.version,
            m.offset,
            m.actual,
            m.expected,
            crc.map(|(s, c)| format!(
                " (the store's CRC32C failed too: stored {s:#010x}, computed {c:#010x})"
            ))
            .unwrap_or_default()
        )),
        (Ok(()), Some((s, c))) => Err(format!(
            "block {}: the store's CRC32C failed (stored {s:#010x}, computed {c:#010x}) on bytes that match \
             the block's pattern",
            b.hash
        )),
    }
}
