//! A seeded, Mooncake-like synthetic workload.
//!
//! Used when the real trace is not at hand (CI, quick runs). The model
//! mimics the structure of the Mooncake conversation trace, where many
//! requests share a system-prompt block (hash id 0) and multi-turn
//! conversations resend their whole history:
//!
//! - **System prompts.** [`SYSTEM_PROMPT_BLOCKS`] shared prefixes of 1, 2
//!   and 4 blocks, created first (so the most popular one starts at hash id
//!   0) and chosen with probabilities 70 %, 20 % and 10 %.
//! - **Conversations.** A conversation starts with a system prompt plus 2-8
//!   new blocks and is planned to last 2-5 turns. Each follow-up turn
//!   repeats the conversation's previous `hash_ids` in full and appends 1-4
//!   new blocks (the previous answer and the new question). A conversation
//!   ends after its planned turns or once it reaches [`MAX_BLOCKS`] blocks.
//! - **One-off requests.** Half of them start with a system prompt; all add
//!   1-10 new blocks.
//!
//! Each request is a follow-up of a random live conversation with
//! probability 45 % (always when [`MAX_LIVE_CONVERSATIONS`] are live), else
//! a new conversation (65 %) or a one-off (35 %). Arrival gaps are uniform
//! in 1..=600 ms, so timestamps strictly increase (mean rate about 3.3
//! requests/s, like the real trace's 12,031 requests per hour).
//! `input_length` is `blocks * 512` minus 0..=511 tokens (a partial last
//! block) and `output_length` is uniform in 1..=1024 tokens.
//!
//! New hash ids are allocated sequentially from 0. With an unbounded cache
//! the default workload (400 requests) reuses roughly 60 % of its blocks
//! (see [`crate::trace::TraceStats::ideal_hit_ratio`]).
//!
//! The generator uses its own SplitMix64 PRNG: the output depends only on
//! `(requests, seed)`, on every platform and Rust version.

use crate::pattern::mix64;
use crate::trace::{TraceRequest, BLOCK_TOKENS};

/// Sizes in blocks of the shared system-prompt prefixes.
pub const SYSTEM_PROMPT_BLOCKS: [usize; 3] = [1, 2, 4];
/// Most blocks a conversation grows to before it ends.
pub const MAX_BLOCKS: usize = 64;
/// Most conversations awaiting a follow-up turn at once.
pub const MAX_LIVE_CONVERSATIONS: usize = 24;
/// The request count of the default synthetic workload.
pub const DEFAULT_REQUESTS: usize = 400;

/// SplitMix64 (Steele, Lea and Flood, OOPSLA 2014): tiny, fast, seedable.
#[derive(Debug, Clone)]
struct SplitMix64(u64);

impl SplitMix64 {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        mix64(self.0)
    }

    /// Uniform in `0..n` (`n > 0`), by multiply-high (bias < n / 2^64).
    fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }

    /// Uniform in `lo..=hi`.
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi - lo + 1)
    }

    /// True with probability `percent / 100`.
    fn percent(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

#[derive(Debug)]
struct Conversation {
    id: usize,
    hash_ids: Vec<u64>,
    turns_left: u32,
}

struct Generator {
    rng: SplitMix64,
    next_hash: u64,
    system: Vec<Vec<u64>>,
}

impl Generator {
    fn new_blocks(&mut self, out: &mut Vec<u64>, n: u64) {
        for _ in 0..n {
            out.push(self.next_hash);
            self.next_hash += 1;
        }
    }

    fn system_prompt(&mut self) -> Vec<u64> {
        let r = self.rng.below(100);
        let i = if r < 70 {
            0
        } else if r < 90 {
            1
        } else {
            2
        };
        self.system[i].clone()
    }
}

/// One generated request and, for tests, the conversation it belongs to.
fn generate(requests: usize, seed: u64) -> Vec<(TraceRequest, Option<usize>)> {
    let mut g = Generator { rng: SplitMix64(seed), next_hash: 0, system: Vec::new() };
    for &n in &SYSTEM_PROMPT_BLOCKS {
        let mut p = Vec::new();
        g.new_blocks(&mut p, n as u64);
        g.system.push(p);
    }
    let mut live: Vec<Conversation> = Vec::new();
    let mut conversations = 0usize;
    let mut now_ms = 0u64;
    let mut out = Vec::with_capacity(requests);
    for k in 0..requests {
        if k > 0 {
            now_ms += g.rng.range(1, 600);
        }
        let (hash_ids, conv) =
            if !live.is_empty() && (live.len() >= MAX_LIVE_CONVERSATIONS || g.rng.percent(45)) {
                let i = g.rng.below(live.len() as u64) as usize;
                let new = g.rng.range(1, 4);
                let mut ids = std::mem::take(&mut live[i].hash_ids);
                g.new_blocks(&mut ids, new);
                let c = &mut live[i];
                c.hash_ids = ids.clone();
                c.turns_left -= 1;
                let id = c.id;
                if c.turns_left == 0 || c.hash_ids.len() >= MAX_BLOCKS {
                    live.swap_remove(i);
                }
                (ids, Some(id))
            } else if g.rng.percent(65) {
                let mut ids = g.system_prompt();
                let new = g.rng.range(2, 8);
                g.new_blocks(&mut ids, new);
                let id = conversations;
                conversations += 1;
                // planned 2..=5 turns, this first one included
                let turns_left = g.rng.range(1, 4) as u32;
                live.push(Conversation { id, hash_ids: ids.clone(), turns_left });
                (ids, Some(id))
            } else {
                let mut ids = if g.rng.percent(50) { g.system_prompt() } else { Vec::new() };
                let new = g.rng.range(1, 10);
                g.new_blocks(&mut ids, new);
                (ids, None)
            };
        let blocks = hash_ids.len() as u64;
        let input = blocks * u64::from(BLOCK_TOKENS) - g.rng.below(u64::from(BLOCK_TOKENS));
        let request = TraceRequest {
            timestamp_ms: now_ms,
            input_length: u32::try_from(input).unwrap_or(u32::MAX),
            output_length: g.rng.range(1, 1024) as u32,
            hash_ids,
        };
        out.push((request, conv));
    }
    out
}

/// Generates `requests` requests of the synthetic workload described in the
/// [module documentation](self), deterministically from `seed`.
pub fn synthetic_trace(requests: usize, seed: u64) -> Vec<TraceRequest> {
    generate(requests, seed).into_iter().map(|(r, _)| r).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::TraceStats;
    use std::collections::HashMap;

    #[test]
    fn deterministic_per_seed() {
        assert_eq!(synthetic_trace(400, 7), synthetic_trace(400, 7));
        assert_ne!(synthetic_trace(400, 7), synthetic_trace(400, 8));
    }

    #[test]
    fn request_count() {
        for n in [0, 1, 2, 399, 400, 1000] {
            assert_eq!(synthetic_trace(n, 1).len(), n);
        }
    }

    #[test]
    fn timestamps_increase_and_lengths_match_blocks() {
        let t = synthetic_trace(DEFAULT_REQUESTS, 3);
        assert_eq!(t[0].timestamp_ms, 0);
        assert!(t.windows(2).all(|w| w[0].timestamp_ms < w[1].timestamp_ms));
        for r in &t {
            assert!(!r.hash_ids.is_empty());
            let blocks = r.input_length.div_ceil(BLOCK_TOKENS) as usize;
            assert_eq!(blocks, r.hash_ids.len());
            assert!((1..=1024).contains(&r.output_length));
        }
    }

    #[test]
    fn follow_up_turns_extend_their_prefix() {
        let mut last: HashMap<usize, Vec<u64>> = HashMap::new();
        let mut follow_ups = 0;
        for (r, conv) in generate(2000, 11) {
            let Some(c) = conv else { continue };
            if let Some(prev) = last.get(&c) {
                assert!(r.hash_ids.starts_with(prev));
                let added = r.hash_ids.len() - prev.len();
                assert!((1..=4).contains(&added), "added {added}");
                follow_ups += 1;
            }
            last.insert(c, r.hash_ids);
        }
        assert!(follow_ups > 500, "only {follow_ups} follow-ups");
    }

    #[test]
    fn shared_system_prompt_starts_at_zero() {
        let t = synthetic_trace(DEFAULT_REQUESTS, 5);
        let with_zero = t.iter().filter(|r| r.hash_ids[0] == 0).count();
        assert!(with_zero * 3 > t.len(), "{with_zero} of {}", t.len());
    }

    #[test]
    fn default_hit_ratio_in_range() {
        for seed in 0..20 {
            let s = TraceStats::from_requests(&synthetic_trace(DEFAULT_REQUESTS, seed));
            assert!((0.40..=0.70).contains(&s.ideal_hit_ratio), "seed {seed}: {}", s.ideal_hit_ratio);
        }
    }
}
