//! Generation-checked opaque handles.
//!
//! Every object the runtime hands out (an open target, a registered memory
//! region, an in-flight operation) is named by a handle made of three
//! numbers: the identity of the runtime that minted it, a slot index
//! in that runtime's table, and the slot's generation when it was minted.
//! Every use is checked against the table (`HandleTable`):
//!
//! - a handle minted by another runtime instance is **foreign**;
//! - a handle whose slot has since been freed (and possibly reused) is
//!   **stale**: removing a value bumps its slot's generation;
//! - a handle naming a slot past the end of the table, or a generation the
//!   slot never had, is **forged**.
//!
//! Generations start at 1 and runtime ids at 1, so an all-zero handle is
//! never valid. None of these cases can crash or reach the wrong object:
//! each is a [`HandleError`].
//!
//! Each part is bounded so that a handle fits in 64 bits, the form the C
//! and Python bindings carry (`to_u64` / `from_u64` on every handle type):
//!
//! | bits   | part                                          |
//! | ------ | --------------------------------------------- |
//! | 63..48 | runtime id, 1..=[`RUNTIME_ID_MAX`]            |
//! | 47..24 | slot index, 0..=[`SLOT_MAX`]                  |
//! | 23..0  | generation, 1..=[`GENERATION_MAX`]            |
//!
//! A slot whose generation reaches [`GENERATION_MAX`] is retired, never
//! reused, so a generation never wraps and a stale handle never becomes
//! valid again; a table refuses a value when every slot index is taken or
//! retired. A process gets at most [`RUNTIME_ID_MAX`] runtimes.

use std::fmt;
use std::sync::atomic::{AtomicU32, Ordering};

/// Which table a handle belongs to; used in error messages.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum HandleKind {
    /// A [`TargetHandle`]: an opened object of a store.
    Target,
    /// A [`MemoryHandle`]: a registered memory region.
    Memory,
    /// An [`OpHandle`]: a submitted operation.
    Operation,
}

impl fmt::Display for HandleKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            HandleKind::Target => "target",
            HandleKind::Memory => "memory",
            HandleKind::Operation => "operation",
        })
    }
}

/// A handle that does not name a live object of the table it was checked
/// against.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, thiserror::Error)]
#[non_exhaustive]
pub enum HandleError {
    /// The handle was minted by another runtime instance.
    #[error("foreign {kind} handle: minted by runtime {got_runtime}, used with runtime {expected_runtime}")]
    Foreign {
        /// The table's kind.
        kind: HandleKind,
        /// The id of the runtime it was used with.
        expected_runtime: u32,
        /// The runtime id the handle carries.
        got_runtime: u32,
    },
    /// The handle's object was removed (closed, deregistered, completed);
    /// its slot may since hold another object.
    #[error("stale {kind} handle (slot {slot}, generation {generation}): closed, consumed or released")]
    Stale {
        /// The table's kind.
        kind: HandleKind,
        /// The slot index the handle carries.
        slot: u32,
        /// The generation the handle carries.
        generation: u32,
    },
    /// The handle was never minted by this runtime: its slot is past the end
    /// of the table, or its generation is one the slot never had.
    #[error("forged {kind} handle: slot {slot} was never minted with this generation")]
    Forged {
        /// The table's kind.
        kind: HandleKind,
        /// The slot index the handle carries.
        slot: u32,
    },
}

/// Largest runtime id (16 bits): runtimes a process may create.
pub const RUNTIME_ID_MAX: u32 = 0xFFFF;
/// Largest slot index of a handle table (24 bits).
pub const SLOT_MAX: u32 = 0xFF_FFFF;
/// Largest generation of a slot (24 bits); a slot that reaches it is
/// retired.
pub const GENERATION_MAX: u32 = 0xFF_FFFF;

static NEXT_RUNTIME_ID: AtomicU32 = AtomicU32::new(1);

/// A fresh process-wide runtime identity (1, 2, ...), one per runtime
/// instance, so that handles of one instance are foreign to every other;
/// `None` once [`RUNTIME_ID_MAX`] runtimes have been created in this
/// process (an id is never reused: that would make old handles valid
/// again).
pub(crate) fn next_runtime_id() -> Option<u32> {
    NEXT_RUNTIME_ID
        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |id| (id <= RUNTIME_ID_MAX).then_some(id + 1))
        .ok()
}

/// The three numbers behind every handle.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct RawHandle {
    /// The minting runtime's id ([`next_runtime_id`]).
    pub(crate) runtime: u32,
    /// Slot index in the table.
    pub(crate) slot: u32,
    /// The slot's generation when minted (>= 1).
    pub(crate) generation: u32,
}

macro_rules! public_handle {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        ///
        /// Opaque: minted only by the runtime, checked on every use (a stale,
        /// foreign or forged handle is an error, never a crash or a wrong
        /// route). Equality is identity of the three raw numbers.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub struct $name(pub(crate) RawHandle);

        impl $name {
            /// Builds a handle from its raw parts (runtime id, slot,
            /// generation).
            ///
            /// **Not a way to obtain a valid handle.** It exists only so that
            /// tests (and any future binding that must carry a handle as
            /// integers) can build handles; whatever it returns is still
            /// checked on every use.
            #[doc(hidden)]
            pub fn from_raw_parts(runtime: u32, slot: u32, generation: u32) -> Self {
                Self(RawHandle {
                    runtime,
                    slot,
                    generation,
                })
            }

            /// The raw parts `(runtime id, slot, generation)`, for tests; see
            /// [`Self::from_raw_parts`].
            #[doc(hidden)]
            pub fn to_raw_parts(self) -> (u32, u32, u32) {
                (self.0.runtime, self.0.slot, self.0.generation)
            }

            /// The handle as one 64-bit value: runtime id in bits 63..48,
            /// slot in 47..24, generation in 23..0 (module docs). Every
            /// handle the runtime mints fits; the value is as opaque as the
            /// handle and is what the C and Python bindings carry.
            pub fn to_u64(self) -> u64 {
                (u64::from(self.0.runtime & RUNTIME_ID_MAX) << 48)
                    | (u64::from(self.0.slot & SLOT_MAX) << 24)
                    | u64::from(self.0.generation & GENERATION_MAX)
            }

            /// The handle a 64-bit value of [`Self::to_u64`] stands for.
            /// Any value decodes; whatever it names is still checked on
            /// every use (a made-up value is a foreign, stale or forged
            /// handle, never another object).
            pub fn from_u64(v: u64) -> Self {
                Self(RawHandle {
                    runtime: (v >> 48) as u32,
                    slot: ((v >> 24) as u32) & SLOT_MAX,
                    generation: (v as u32) & GENERATION_MAX,
                })
            }
        }

        impl From<RawHandle> for $name {
            fn from(raw: RawHandle) -> Self {
                Self(raw)
            }
        }
    };
}

public_handle!(
    /// Names an opened target (an object of a store).
    TargetHandle
);
public_handle!(
    /// Names a registered memory region.
    MemoryHandle
);
public_handle!(
    /// Names a submitted operation.
    OpHandle
);

/// One slot of a [`HandleTable`]. `generation` is the generation of the
/// value in it, or, when free, of the value it held last (0 if it never held
/// one); the next value gets `generation + 1`.
#[derive(Debug)]
struct Slot<T> {
    generation: u32,
    value: Option<T>,
}

/// A slab that mints generation-checked handles for its values.
///
/// Free slots are reused (most recently freed first); each reuse takes the
/// next generation, so handles to earlier occupants stay stale. A slot whose
/// generation reaches [`GENERATION_MAX`] is retired and never reused.
#[derive(Debug)]
pub(crate) struct HandleTable<T> {
    runtime: u32,
    kind: HandleKind,
    slots: Vec<Slot<T>>,
    free: Vec<u32>,
    len: usize,
}

impl<T> HandleTable<T> {
    /// An empty table for handles of `kind` minted by runtime `runtime_id`
    /// (from [`next_runtime_id`]).
    pub(crate) fn new(runtime_id: u32, kind: HandleKind) -> Self {
        Self { runtime: runtime_id, kind, slots: Vec::new(), free: Vec::new(), len: 0 }
    }

    /// The runtime id this table mints handles for.
    #[cfg_attr(not(test), allow(dead_code, reason = "only the unit tests below call it at present"))]
    pub(crate) fn runtime_id(&self) -> u32 {
        self.runtime
    }

    /// The kind of handles this table mints.
    #[allow(dead_code, reason = "called by nothing at present; kept with the rest of the table's accessors")]
    pub(crate) fn kind(&self) -> HandleKind {
        self.kind
    }

    /// Stores `value` and returns a fresh handle to it; `None` (and `value`
    /// dropped) when every slot index up to [`SLOT_MAX`] is in use or
    /// retired.
    pub(crate) fn insert(&mut self, value: T) -> Option<RawHandle> {
        let slot = match self.free.pop() {
            Some(slot) => slot,
            None => {
                let slot = u32::try_from(self.slots.len()).ok().filter(|s| *s <= SLOT_MAX)?;
                self.slots.push(Slot { generation: 0, value: None });
                slot
            }
        };
        let entry = &mut self.slots[slot as usize];
        debug_assert!(entry.value.is_none());
        // Free slots never sit at GENERATION_MAX (see `remove`), so this
        // stays within 24 bits.
        entry.generation += 1;
        entry.value = Some(value);
        self.len += 1;
        Some(RawHandle { runtime: self.runtime, slot, generation: entry.generation })
    }

    fn check(&self, h: RawHandle) -> Result<usize, HandleError> {
        // Runtime ids start at 1: a handle naming runtime 0 (an all-zero
        // or made-up value) was minted by no runtime at all.
        if h.runtime == 0 {
            return Err(HandleError::Forged { kind: self.kind, slot: h.slot });
        }
        if h.runtime != self.runtime {
            return Err(HandleError::Foreign {
                kind: self.kind,
                expected_runtime: self.runtime,
                got_runtime: h.runtime,
            });
        }
        let forged = HandleError::Forged { kind: self.kind, slot: h.slot };
        let Some(entry) = self.slots.get(h.slot as usize) else {
            return Err(forged);
        };
        // Generations a slot has had: 1..=entry.generation. The live one is
        // entry.generation when occupied; all earlier ones are stale.
        if h.generation == 0 || h.generation > entry.generation {
            return Err(forged);
        }
        if h.generation == entry.generation && entry.value.is_some() {
            Ok(h.slot as usize)
        } else {
            Err(HandleError::Stale { kind: self.kind, slot: h.slot, generation: h.generation })
        }
    }

    /// The value `h` names.
    ///
    /// # Errors
    ///
    /// [`HandleError::Foreign`], [`HandleError::Stale`] or
    /// [`HandleError::Forged`].
    pub(crate) fn get(&self, h: RawHandle) -> Result<&T, HandleError> {
        let i = self.check(h)?;
        Ok(self.slots[i].value.as_ref().expect("checked live"))
    }

    /// The value `h` names, mutably. Errors as [`HandleTable::get`].
    pub(crate) fn get_mut(&mut self, h: RawHandle) -> Result<&mut T, HandleError> {
        let i = self.check(h)?;
        Ok(self.slots[i].value.as_mut().expect("checked live"))
    }

    /// Removes and returns the value `h` names; `h` (and every copy of it)
    /// is stale from now on. Errors as [`HandleTable::get`].
    pub(crate) fn remove(&mut self, h: RawHandle) -> Result<T, HandleError> {
        let i = self.check(h)?;
        let entry = &mut self.slots[i];
        let value = entry.value.take().expect("checked live");
        self.len -= 1;
        // Retire a slot whose next generation would not fit in 24 bits.
        if entry.generation < GENERATION_MAX {
            self.free.push(h.slot);
        }
        Ok(value)
    }

    /// The live value in slot `slot`, with its full handle, for internal
    /// routing where only the slot travels (e.g. inside an NVMe command tag);
    /// the caller checks the generation bits it carried.
    pub(crate) fn get_mut_by_slot(&mut self, slot: u32) -> Option<(RawHandle, &mut T)> {
        let runtime = self.runtime;
        let s = self.slots.get_mut(slot as usize)?;
        let generation = s.generation;
        s.value.as_mut().map(|v| (RawHandle { runtime, slot, generation }, v))
    }

    /// Number of live values.
    #[cfg_attr(not(test), allow(dead_code, reason = "only the unit tests below call it at present"))]
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Whether the table holds no live value.
    #[cfg_attr(not(test), allow(dead_code, reason = "only the unit tests below call it at present"))]
    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The live values with their handles, in slot order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (RawHandle, &T)> + '_ {
        let runtime = self.runtime;
        self.slots.iter().enumerate().filter_map(move |(i, s)| {
            s.value.as_ref().map(|v| {
                (
                    RawHandle {
                        runtime,
                        // Slot indices fit in u32: `insert` refuses more.
                        slot: i as u32,
                        generation: s.generation,
                    },
                    v,
                )
            })
        })
    }

    /// The live values mutably with their handles, in slot order.
    #[allow(dead_code, reason = "called by nothing at present; kept with the rest of the table's accessors")]
    pub(crate) fn iter_mut(&mut self) -> impl Iterator<Item = (RawHandle, &mut T)> + '_ {
        let runtime = self.runtime;
        self.slots.iter_mut().enumerate().filter_map(move |(i, s)| {
            let generation = s.generation;
            s.value.as_mut().map(|v| (RawHandle { runtime, slot: i as u32, generation }, v))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    fn table() -> HandleTable<String> {
        HandleTable::new(next_runtime_id().unwrap(), HandleKind::Target)
    }

    #[test]
    fn insert_get_remove() {
        let mut t = table();
        assert!(t.is_empty());
        let a = t.insert("a".to_owned()).unwrap();
        let b = t.insert("b".to_owned()).unwrap();
        assert_eq!(t.len(), 2);
        assert_eq!(t.get(a).unwrap(), "a");
        assert_eq!(t.get(b).unwrap(), "b");
        t.get_mut(b).unwrap().push('!');
        assert_eq!(t.get(b).unwrap(), "b!");
        assert_eq!(t.remove(a).unwrap(), "a");
        assert_eq!(t.len(), 1);
        let live: Vec<_> = t.iter().map(|(h, v)| (h, v.clone())).collect();
        assert_eq!(live, vec![(b, "b!".to_owned())]);
        assert_eq!(a.generation, 1);
    }

    #[test]
    fn stale_after_remove_and_reuse() {
        let mut t = table();
        let a = t.insert("a".to_owned()).unwrap();
        t.remove(a).unwrap();
        let stale = HandleError::Stale { kind: HandleKind::Target, slot: a.slot, generation: a.generation };
        assert_eq!(t.get(a), Err(stale));
        assert_eq!(t.remove(a), Err(stale));
        let c = t.insert("c".to_owned()).unwrap();
        assert_eq!(c.slot, a.slot, "free slot reused");
        assert_eq!(c.generation, a.generation + 1);
        assert_eq!(t.get(a), Err(stale));
        assert_eq!(t.get_mut(a), Err(stale));
        assert_eq!(t.get(c).unwrap(), "c");
        assert!(stale.to_string().contains("stale target handle"));
    }

    #[test]
    fn foreign_runtime_refused() {
        let mut t1 = table();
        let mut t2: HandleTable<String> = HandleTable::new(next_runtime_id().unwrap(), HandleKind::Memory);
        assert_ne!(t1.runtime_id(), t2.runtime_id());
        let h1 = t1.insert("one".to_owned()).unwrap();
        let _h2 = t2.insert("two".to_owned()).unwrap();
        // Same slot and generation, other runtime.
        let err = t2.get(h1).unwrap_err();
        assert_eq!(
            err,
            HandleError::Foreign {
                kind: HandleKind::Memory,
                expected_runtime: t2.runtime_id(),
                got_runtime: t1.runtime_id(),
            }
        );
        assert!(err.to_string().contains("foreign memory handle"));
    }

    #[test]
    fn forged_refused() {
        let mut t: HandleTable<u8> = HandleTable::new(next_runtime_id().unwrap(), HandleKind::Operation);
        let h = t.insert(7).unwrap();
        let past_end = RawHandle { slot: 5, ..h };
        let future_gen = RawHandle { generation: 2, ..h };
        let zero_gen = RawHandle { generation: 0, ..h };
        for f in [past_end, future_gen, zero_gen] {
            let err = t.get(f).unwrap_err();
            assert_eq!(err, HandleError::Forged { kind: HandleKind::Operation, slot: f.slot });
            assert!(err.to_string().contains("forged operation handle"));
        }
        let all_zero = RawHandle { runtime: 0, slot: 0, generation: 0 };
        assert_eq!(t.get(all_zero), Err(HandleError::Forged { kind: HandleKind::Operation, slot: 0 }));
        let t_same_rt_zero: HandleTable<u8> = HandleTable::new(t.runtime_id(), HandleKind::Target);
        assert!(matches!(
            t_same_rt_zero.get(RawHandle { runtime: t.runtime_id(), slot: 0, generation: 0 }),
            Err(HandleError::Forged { .. })
        ));
        assert_eq!(*t.get(h).unwrap(), 7);
    }

    #[test]
    fn public_handles_round_trip_raw_parts() {
        let h = TargetHandle::from_raw_parts(3, 4, 5);
        assert_eq!(h.to_raw_parts(), (3, 4, 5));
        assert_eq!(h.0, RawHandle { runtime: 3, slot: 4, generation: 5 });
        assert_eq!(MemoryHandle::from(h.0).to_raw_parts(), (3, 4, 5));
        assert_eq!(OpHandle::from_raw_parts(0, 0, 0).to_raw_parts(), (0, 0, 0));
    }

    #[test]
    fn runtime_ids_distinct_and_non_zero() {
        let a = next_runtime_id().unwrap();
        let b = next_runtime_id().unwrap();
        assert_ne!(a, 0);
        assert_ne!(a, b);
    }

    #[test]
    fn slot_at_max_generation_is_retired() {
        let mut t: HandleTable<u8> = HandleTable::new(next_runtime_id().unwrap(), HandleKind::Target);
        let h = t.insert(1).unwrap();
        t.slots[0].generation = GENERATION_MAX;
        let h = RawHandle { generation: GENERATION_MAX, ..h };
        t.remove(h).unwrap();
        let n = t.insert(2).unwrap();
        assert_ne!(n.slot, h.slot, "a slot at GENERATION_MAX is never reused");
        assert!(matches!(t.get(h), Err(HandleError::Stale { .. })));
    }

    #[test]
    fn u64_form_round_trips_and_bounds_hold() {
        let h = TargetHandle::from_raw_parts(RUNTIME_ID_MAX, SLOT_MAX, GENERATION_MAX);
        assert_eq!(h.to_u64(), u64::MAX);
        assert_eq!(TargetHandle::from_u64(u64::MAX), h);
        let m = MemoryHandle::from_raw_parts(7, 0x12_3456, 0xAB_CDEF);
        assert_eq!(m.to_u64(), 0x0007_1234_56AB_CDEF);
        assert_eq!(MemoryHandle::from_u64(m.to_u64()), m);
        assert_eq!(OpHandle::from_u64(0).to_raw_parts(), (0, 0, 0));
        // Minted handles fit: the table refuses slots past SLOT_MAX.
        let mut t: HandleTable<u8> = HandleTable::new(next_runtime_id().unwrap(), HandleKind::Memory);
        t.slots.resize_with(SLOT_MAX as usize + 1, || Slot { generation: GENERATION_MAX, value: None });
        assert!(t.insert(1).is_none(), "every slot index is taken or retired");
        let mut t: HandleTable<u8> = HandleTable::new(next_runtime_id().unwrap(), HandleKind::Memory);
        let h = t.insert(1).unwrap();
        let via = MemoryHandle::from_u64(MemoryHandle(h).to_u64());
        assert_eq!(*t.get(via.0).unwrap(), 1);
    }

    #[derive(Clone, Debug)]
    enum Op {
        Insert,
        Remove(usize),
    }

    proptest! {
        /// Under any sequence of inserts and removes, live handles resolve to
        /// their own value and removed handles never resolve again.
        #[test]
        fn removed_handles_never_resolve(
            ops in proptest::collection::vec(
                prop_oneof![Just(Op::Insert), any::<usize>().prop_map(Op::Remove)],
                0..300,
            )
        ) {
            let mut t: HandleTable<u64> = HandleTable::new(next_runtime_id().unwrap(), HandleKind::Target);
            let mut live: HashMap<RawHandle, u64> = HashMap::new();
            let mut live_order: Vec<RawHandle> = Vec::new();
            let mut dead: Vec<RawHandle> = Vec::new();
            let mut next = 0u64;
            for op in ops {
                match op {
                    Op::Insert => {
                        let h = t.insert(next).unwrap();
                        prop_assert!(h.generation >= 1);
                        prop_assert!(live.insert(h, next).is_none());
                        prop_assert!(!dead.contains(&h), "a handle was minted twice");
                        live_order.push(h);
                        next += 1;
                    }
                    Op::Remove(i) if !live_order.is_empty() => {
                        let h = live_order.swap_remove(i % live_order.len());
                        let v = live.remove(&h).unwrap();
                        prop_assert_eq!(t.remove(h), Ok(v));
                        dead.push(h);
                    }
                    Op::Remove(_) => {}
                }
                prop_assert_eq!(t.len(), live.len());
                for d in &dead {
                    let is_stale = matches!(t.get(*d), Err(HandleError::Stale { .. }));
                    prop_assert!(is_stale);
                }
                for (h, v) in &live {
                    prop_assert_eq!(t.get(*h), Ok(v));
                }
            }
            let listed: HashMap<RawHandle, u64> = t.iter().map(|(h, v)| (h, *v)).collect();
            prop_assert_eq!(listed, live);
        }
    }
}
