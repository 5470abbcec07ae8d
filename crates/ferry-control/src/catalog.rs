//! What a worker publishes: keys and their metadata JSON.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use crate::{Error, Result};

/// Keys → metadata JSON, shared by a server and its publications.
#[derive(Clone, Default)]
pub(crate) struct Catalog(Arc<Mutex<HashMap<String, Arc<str>>>>);

impl Catalog {
    fn lock(&self) -> MutexGuard<'_, HashMap<String, Arc<str>>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Adds `key`; refuses a key already there.
    pub(crate) fn insert(&self, key: &str, json: String) -> Result<()> {
        let mut map = self.lock();
        if map.contains_key(key) {
            return Err(Error::AlreadyPublished { key: key.into() });
        }
        map.insert(key.into(), json.into());
        Ok(())
    }

    pub(crate) fn get(&self, key: &str) -> Option<Arc<str>> {
        self.lock().get(key).cloned()
    }

    pub(crate) fn remove(&self, key: &str) {
        self.lock().remove(key);
    }

    pub(crate) fn len(&self) -> usize {
        self.lock().len()
    }
}

/// Metadata published under a key. Dropping it (or [`withdraw`](Self::withdraw))
/// withdraws the metadata: later fetches get [`Error::NotFound`].
#[must_use = "dropping a Publication withdraws the metadata at once"]
pub struct Publication {
    key: String,
    on_drop: Option<Box<dyn FnOnce() + Send + Sync>>,
}

impl Publication {
    pub(crate) fn new(key: &str, on_drop: impl FnOnce() + Send + Sync + 'static) -> Self {
        Publication {
            key: key.into(),
            on_drop: Some(Box::new(on_drop)),
        }
    }

    /// The key it is published under.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// Withdraws the metadata now.
    pub fn withdraw(self) {}
}

impl Drop for Publication {
    fn drop(&mut self) {
        if let Some(f) = self.on_drop.take() {
            f();
        }
    }
}

impl std::fmt::Debug for Publication {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the metadata: it is a capability.
        f.debug_struct("Publication")
            .field("key", &self.key)
            .finish()
    }
}
