//! The CUDA primitives the GPU path is built from, each released on drop:
//! device memory ([`DeviceMem`]), host memory mapped into the GPU
//! ([`HostMapping`], [`PinnedBuf`]), streams ([`Stream`]), events
//! ([`KernelEvent`]), loaded modules ([`Module`]) and the gate of the
//! crate's memory management ([`Quiesce`]). They know nothing of queues,
//! drives or launches.

mod event;
mod memory;
mod module;
mod quiesce;
mod stream;

pub(crate) use event::KernelEvent;
pub(crate) use memory::{DeviceMem, HostMapping, PinnedBuf};
pub(crate) use module::{load_module, Module};
pub(crate) use quiesce::Quiesce;
pub(crate) use stream::Stream;
