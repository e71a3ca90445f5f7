//! Targets: `tutti://<store>/<key>` URIs opened into [`TargetHandle`]s
//! naming a byte extent of a store's datapath, and closed again.
//!
//! Locks: the targets table (write to open or close, read to look up).

use std::sync::atomic::Ordering;

use super::{Runtime, Target, URI_SCHEME};
use crate::error::{Error, UriError};
use crate::handle::{HandleKind, TargetHandle, SLOT_MAX};

impl Runtime {
    /// Opens `tutti://<store>/<key>` and returns a handle naming the byte
    /// extent the store's resolver gives `key` (for `slab`, the slot
    /// number).
    ///
    /// # Errors
    ///
    /// [`Error::Uri`] with a [`UriError`] for a malformed URI, an unknown
    /// store, or a key the resolver refuses; [`Error::ShuttingDown`].
    pub fn open(&self, uri: &str) -> Result<TargetHandle, Error> {
        if self.shutting_down.load(Ordering::Acquire) {
            return Err(Error::ShuttingDown);
        }
        let bad = |kind: UriError| Error::Uri { uri: uri.to_owned(), kind };
        let rest = uri.strip_prefix(URI_SCHEME).ok_or_else(|| bad(UriError::Scheme))?;
        let (store, key) = rest.split_once('/').ok_or_else(|| bad(UriError::NoKey))?;
        let si = *self.store_index.get(store).ok_or_else(|| {
            bad(UriError::UnknownStore {
                store: store.to_owned(),
                known: self.stores.iter().map(|s| s.name.clone()).collect(),
            })
        })?;
        let s = &self.stores[si];
        let extent =
            s.resolver.resolve(key, self.datapaths[s.datapath].capacity()).map_err(|e| bad(e.into()))?;
        let mut t = self.targets.write().unwrap_or_else(|p| p.into_inner());
        t.insert(Target { store: si, extent })
            .map(TargetHandle)
            .ok_or(Error::TooManyHandles { kind: HandleKind::Target, limit: u64::from(SLOT_MAX) + 1 })
    }

    /// Opens several URIs; one result per URI, in order.
    pub fn open_batch(&self, uris: &[&str]) -> Vec<Result<TargetHandle, Error>> {
        uris.iter().map(|u| self.open(u)).collect()
    }

    /// Size in bytes of an opened target.
    ///
    /// # Errors
    ///
    /// [`Error::Handle`] for a stale, foreign or forged handle.
    pub fn target_len(&self, target: TargetHandle) -> Result<u64, Error> {
        let t = self.targets.read().unwrap_or_else(|p| p.into_inner());
        Ok(t.get(target.0)?.extent.len)
    }

    /// Closes a target; the handle (and every copy) is stale afterwards.
    /// Operations already submitted on it run to completion.
    ///
    /// # Errors
    ///
    /// [`Error::Handle`] for a stale, foreign or forged handle.
    pub fn close(&self, target: TargetHandle) -> Result<(), Error> {
        let mut t = self.targets.write().unwrap_or_else(|p| p.into_inner());
        t.remove(target.0)?;
        Ok(())
    }
}
