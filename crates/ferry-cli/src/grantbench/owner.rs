//! The owner's side of a grant in `ferry grant-target`: grant the pool,
//! and timestamp each write's notification as it arrives.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use ferry::{Connector, Grant, GrantOptions, Pool};

/// A grant the owner holds open, and the task that listens to its
/// notifications.
pub(super) struct Granted {
    /// Its metadata, as JSON.
    pub(super) metadata: String,
    grant: Arc<Grant>,
    listener: tokio::task::JoinHandle<()>,
}

/// Grants `pool` (READ and WRITE) to `holder` (a bearer grant without
/// one), spinning `spin_us` before parking if given (low-latency mode).
/// Each notification's latency, its arrival here less the post time in
/// its payload's first eight bytes (both `CLOCK_MONOTONIC`), goes to
/// `notes`.
pub(super) async fn grant(
    c: &Connector,
    pool: &Pool,
    holder: Option<&str>,
    spin_us: Option<u64>,
    notes: Arc<Mutex<Vec<u64>>>,
) -> anyhow::Result<Granted> {
    let mut o = GrantOptions::read_write();
    o = match holder {
        Some(h) => o.holder(h),
        None => o.bearer(),
    };
    if let Some(us) = spin_us {
        o = o.spin(Duration::from_micros(us));
    }
    let grant = Arc::new(c.grant(pool, o).await?);
    let metadata = grant.metadata().to_json()?;
    let g = grant.clone();
    let listener = tokio::spawn(async move {
        while let Some(n) = g.next_notification().await {
            let now = crate::clock::monotonic_ns();
            if let Some(Ok(post)) = n.payload.get(..8).map(<[u8; 8]>::try_from) {
                let post = u64::from_le_bytes(post);
                notes.lock().unwrap().push(now.saturating_sub(post));
            }
        }
    });
    Ok(Granted {
        metadata,
        grant,
        listener,
    })
}

impl Granted {
    /// Stops listening and revokes the grant.
    pub(super) async fn revoke(self) -> anyhow::Result<()> {
        self.listener.abort();
        let _ = self.listener.await;
        Ok(self.grant.revoke().await?)
    }
}
