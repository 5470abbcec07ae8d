//! The owner's side of a grant in `ferry grant-target`: grant the pool,
//! and timestamp each write's notification as it arrives.

use std::sync::{Arc, Mutex};

use ferry::{Connector, Pool};

/// A grant the owner holds open, and what listens to its notifications.
pub(super) struct Granted {
    /// Its metadata, as JSON.
    pub(super) metadata: String,
}

/// Grants `pool` (READ and WRITE) to `holder`, spinning `spin_us` before
/// parking if given; each notification's latency (arrival less the post
/// time in its payload's first eight bytes) goes to `notes`.
pub(super) async fn grant(
    _c: &Connector,
    _pool: &Pool,
    _holder: Option<&str>,
    _spin_us: Option<u64>,
    _notes: Arc<Mutex<Vec<u64>>>,
) -> anyhow::Result<Granted> {
    anyhow::bail!("this build has no grants yet")
}

impl Granted {
    /// Stops listening and revokes the grant.
    pub(super) async fn revoke(self) -> anyhow::Result<()> {
        Ok(())
    }
}
