//! Resolvers: URI key -> byte extent of a datapath's space.

mod slab;

pub use slab::Slab;
