//! The one way this crate takes a mutex.

use std::sync::{Mutex, MutexGuard};

/// Locks `m`, through poisoning: every value behind a lock here stays
/// consistent between statements, so a panic elsewhere leaves it usable.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
