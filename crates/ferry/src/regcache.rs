//! Registrations that outlive operations: what a backend registered for
//! memory that is lent again and again (a [`Pool`](crate::Pool): a KV
//! cache), kept with that memory and dropped when its owner releases it.
//!
//! A cache covers one address range, the whole memory of its owner, and
//! holds at most one registration per backend type. Registering a pool
//! once and reusing the handle is what makes operations over its blocks
//! cheap (registration pins pages: microseconds to milliseconds per
//! range); the price is that a remote key of the range stays valid for as
//! long as the pool lives (see `docs/transports.md`, "Registration").
//!
//! The owner calls [`RegCache::release`] before its memory is freed: from
//! then on the cache is empty and refuses new registrations, so nothing
//! registered outlives the memory it describes.

use std::any::Any;
use std::sync::{Arc, Mutex};

/// The registrations of one range of memory (see the module docs).
pub(crate) struct RegCache {
    base: u64,
    len: u64,
    slot: Mutex<Slot>,
}

#[derive(Default)]
struct Slot {
    entries: Vec<Arc<dyn Any + Send + Sync>>,
    released: bool,
}

impl RegCache {
    /// An empty cache for `len` bytes at `base`.
    pub(crate) fn new(base: u64, len: u64) -> Arc<RegCache> {
        Arc::new(RegCache {
            base,
            len,
            slot: Mutex::new(Slot::default()),
        })
    }

    fn slot(&self) -> std::sync::MutexGuard<'_, Slot> {
        crate::sync::lock(&self.slot)
    }

    /// The registration of type `T` of this range, made by `make(base,
    /// len)` the first time; `Ok(None)` once the owner released the
    /// memory. `make` runs under the cache's lock, so a range is
    /// registered once even when operations race to lend it.
    pub(crate) fn get_or_make<T: Any + Send + Sync, E>(
        &self,
        make: impl FnOnce(u64, u64) -> Result<Arc<T>, E>,
    ) -> Result<Option<Arc<T>>, E> {
        let mut slot = self.slot();
        if slot.released {
            return Ok(None);
        }
        for e in &slot.entries {
            if let Ok(t) = Arc::clone(e).downcast::<T>() {
                return Ok(Some(t));
            }
        }
        let t = make(self.base, self.len)?;
        slot.entries.push(t.clone());
        Ok(Some(t))
    }

    /// How many registrations the cache holds.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.slot().entries.len()
    }

    /// The owner releases the memory: every registration is dropped (a
    /// backend's drop unregisters it), and none is made any more.
    pub(crate) fn release(&self) {
        let entries = {
            let mut slot = self.slot();
            slot.released = true;
            std::mem::take(&mut slot.entries)
        };
        drop(entries);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    struct Reg(&'static AtomicUsize);
    impl Drop for Reg {
        fn drop(&mut self) {
            self.0.fetch_sub(1, Ordering::AcqRel);
        }
    }

    #[test]
    fn registers_once_and_drops_on_release() {
        static LIVE: AtomicUsize = AtomicUsize::new(0);
        let c = RegCache::new(4096, 100);
        let make = |base, len| {
            assert_eq!((base, len), (4096, 100));
            LIVE.fetch_add(1, Ordering::AcqRel);
            Ok::<_, ()>(Arc::new(Reg(&LIVE)))
        };
        let a = c.get_or_make(make).unwrap().unwrap();
        let b = c.get_or_make(make).unwrap().unwrap();
        assert!(Arc::ptr_eq(&a, &b), "made once, then reused");
        assert_eq!((LIVE.load(Ordering::Acquire), c.len()), (1, 1));
        // Another type is another registration.
        let n = c.get_or_make(|_, _| Ok::<_, ()>(Arc::new(7u32))).unwrap();
        assert_eq!((n.as_deref(), c.len()), (Some(&7), 2));
        drop((a, b));
        assert_eq!(LIVE.load(Ordering::Acquire), 1, "the cache keeps it");
        c.release();
        assert_eq!((LIVE.load(Ordering::Acquire), c.len()), (0, 0));
        // Released: nothing is made any more.
        let after = c.get_or_make(|_, _| -> Result<Arc<Reg>, ()> { panic!("made") });
        assert!(after.unwrap().is_none());
    }

    #[test]
    fn a_failed_registration_is_not_kept() {
        let c = RegCache::new(0, 1);
        assert_eq!(c.get_or_make(|_, _| Err::<Arc<u8>, _>("no")), Err("no"));
        assert_eq!(c.len(), 0);
        assert!(c
            .get_or_make(|_, _| Ok::<_, ()>(Arc::new(1u8)))
            .unwrap()
            .is_some());
    }
}
