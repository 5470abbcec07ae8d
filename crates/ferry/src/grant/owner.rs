//! The owner's side of a grant.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering::SeqCst};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use ferry_proto::grant::{BlockRef, CmaGrant, GrantError, GrantId, GrantMetadata, TcpGrant};
use ferry_proto::Token;

use super::control::{ControlPage, Header, REVOKED};
use super::{fence, ring, sys, GrantOptions, Notification};
use crate::{host, Error, Pool, Result};

/// How long the notification thread parks before it looks at its stop
/// flag again (a drop wakes it at once; this only bounds a lost wake-up).
const PARK: Duration = Duration::from_secs(1);

/// A standing grant over a [`Pool`], on its owner's side: made by
/// [`Connector::grant`](crate::Connector::grant), handed to its holder as
/// [`metadata`](Self::metadata).
///
/// The holder reads and writes the pool's blocks by index, one-sidedly,
/// until [`revoke`](Self::revoke) (or the drop of the grant, or its
/// expiry). The grant keeps the pool's memory alive while it lives, and
/// after it is dropped until no operation of the holder is in flight.
///
/// The grant does not take the pool's blocks ([`Pool::blocks`]): the owner
/// keeps using them, and hands a block on only once it knows the holder is
/// done with it (a [`Notification`]), or [`retire`](Self::retire)s it
/// before reusing it, so that a late transfer that names the old
/// generation is refused.
pub struct Grant {
    inner: Arc<Owned>,
}

pub(super) struct Owned {
    pub(super) meta: GrantMetadata,
    pub(super) page: Arc<ControlPage>,
    pub(super) pool: Pool,
    /// The last sequence number of a notification pushed for a TCP
    /// request, and the lock that makes this process one producer.
    pub(super) tcp_seq: Mutex<u64>,
    /// Serialises drains (a revoke and a retire, or two retires).
    drains: Mutex<()>,
    deadline: Duration,
    notes: Arc<Notes>,
    /// The UCX lane, where offered.
    ucx: Option<super::ucx::UcxOwner>,
}

/// The owner's end of the notification ring.
///
/// [`Grant::next_notification`] takes from the ring itself, a batch at a
/// time (whatever is queued), and hands them out from `taken`: no thread
/// between the ring and the caller while notifications keep coming. Only
/// when the ring is empty does a caller wait: with [`GrantOptions::spin`]
/// it first spins on the ring for that long; then it asks the
/// notification thread (`want`), which parks on a futex on the ring's tail
/// (no CPU while idle), and, woken by the holder's push, wakes the caller
/// and goes back to sleep until the next caller waits.
struct Notes {
    page: Arc<ControlPage>,
    /// Taken from the ring, not yet handed out, in order. Whoever holds
    /// this lock is the ring's one consumer.
    taken: Mutex<VecDeque<Notification>>,
    /// Wakes the caller waiting in [`Grant::next_notification`].
    wake: tokio::sync::Notify,
    /// 1 while a caller waits for the ring (the thread watches it then).
    want: AtomicU32,
    /// 1 while the thread sleeps on `want`.
    sleeping: AtomicU32,
    stop: AtomicBool,
    spin: Duration,
}

/// Makes a grant over `pool` (see [`Connector::grant`](crate::Connector::grant)).
///
/// `tcp`: the addresses its TCP lane is served at (`None`: not offered);
/// the caller enters the grant in its connector's table
/// (`served::create`).
pub(crate) fn create(
    owner: &str,
    host_id: &str,
    pool: &Pool,
    opts: GrantOptions,
    tcp: Option<Vec<SocketAddr>>,
) -> Result<Grant> {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    if opts.holder.is_none() && !opts.bearer {
        return Err(GrantError::Unbound.into());
    }
    if opts.rights.is_empty() {
        return Err(GrantError::Malformed("a grant of no rights".into()).into());
    }
    // Device memory: its allocation's IPC handle, exported once.
    let cuda_ipc = if super::ipc::is_device(pool) {
        Some(super::ipc::export(pool)?)
    } else {
        None
    };
    if opts.rights.allows(ferry_proto::grant::Rights::WRITE) && !pool.is_writable() {
        return Err(crate::PoolError::ReadOnly.into());
    }
    let block_count = u32::try_from(pool.block_count()).map_err(|_| {
        GrantError::Malformed(format!(
            "{} blocks: a grant takes at most 2^32 - 1",
            pool.block_count()
        ))
    })?;
    let expires_at_ms = opts
        .expires_after
        .map(|d| super::now_ms().saturating_add(d.as_millis().min(u64::MAX as u128) as u64));
    let token = Token::from_bytes(host::random_bytes());
    let cookie = host::random_bytes();
    let grant = GrantId(NEXT.fetch_add(1, SeqCst));
    let base = pool.base() as usize as u64;
    let page = ControlPage::create(&Header {
        block_count,
        cookie,
        token_hash: super::ipc::page_hash(&token, cuda_ipc.as_ref()),
        grant,
        base,
        block_size: pool.block_size() as u64,
        expires_at_ms: expires_at_ms.unwrap_or(0),
        rights: opts.rights,
    })?;
    // The TCP lane serves host memory only: the owner's runtime copies
    // with the CPU, which never touches device memory.
    let tcp = tcp.filter(|_| opts.tcp && cuda_ipc.is_none());
    let page = Arc::new(page);
    let len = pool.block_size() as u64 * u64::from(block_count);
    // The UCX lane registers host memory only here (its registration of
    // device memory is not built for grants): a device pool says so.
    if cuda_ipc.is_some() && opts.ucx == Some(true) {
        return Err(GrantError::NoLane(
            "a grant of device memory offers CUDA IPC only: UCX grants of GPU memory are not \
             built; use a per-operation transfer for another host"
                .into(),
        )
        .into());
    }
    let lane = super::ucx::offer(opts.ucx, grant, &token, base, len, &page)?;
    let (ucx, ucx_meta) = lane.map_or((None, None), |(o, m)| (Some(o), Some(m)));
    let mut meta = GrantMetadata {
        owner: owner.to_string(),
        host_id: host_id.to_string(),
        grant,
        token,
        holder: opts.holder.clone(),
        rights: opts.rights,
        expires_at_ms,
        block_size: pool.block_size() as u64,
        block_count,
        device: pool.device(),
        cma: opts.cma.then(|| CmaGrant {
            pid: std::process::id(),
            control_fd: page.raw_fd(),
            cookie,
            base,
        }),
        cuda_ipc,
        tcp: tcp
            .as_ref()
            .map(|addrs| TcpGrant {
                addresses: addrs
                    .iter()
                    .take(ferry_proto::grant::MAX_TCP_ADDRESSES)
                    .copied()
                    .collect(),
            })
            .filter(|t| !t.addresses.is_empty()),
        ucx: ucx_meta,
    };
    // The TCP lane's addresses make the metadata longer: past 1 KiB
    // (long worker ids, many addresses), fewer of them, then none.
    while matches!(meta.to_json(), Err(GrantError::TooLarge { .. })) {
        match &mut meta.tcp {
            Some(t) if t.addresses.len() > 1 => {
                t.addresses.pop();
            }
            Some(_) => meta.tcp = None,
            None => break,
        }
    }
    // Refuses metadata over 1 KiB (worker ids JSON escapes) now, not later.
    meta.to_json()?;
    let notes = Arc::new(Notes {
        page: page.clone(),
        taken: Mutex::new(VecDeque::new()),
        wake: tokio::sync::Notify::new(),
        want: AtomicU32::new(0),
        sleeping: AtomicU32::new(0),
        stop: AtomicBool::new(false),
        spin: opts.spin.unwrap_or(Duration::ZERO),
    });
    {
        let notes = notes.clone();
        let (started, up) = std::sync::mpsc::sync_channel(1);
        std::thread::Builder::new()
            .name(format!("ferry-grant-{}", grant.0))
            .spawn(move || {
                // Its id, for the holder's liveness check (`holder::Liveness`),
                // before the metadata leaves this function.
                notes.page.owner_tid().store(sys::gettid(), SeqCst);
                let _ = started.send(());
                notes.watch();
            })?;
        // Microseconds; without it the holder falls back to reading the
        // owner's memory before each write.
        let _ = up.recv_timeout(Duration::from_secs(1));
    }
    let inner = Arc::new(Owned {
        meta,
        page,
        pool: pool.clone(),
        tcp_seq: Mutex::new(0),
        drains: Mutex::new(()),
        deadline: opts.revoke_deadline,
        notes,
        ucx,
    });
    if let Some(after) = opts.expires_after {
        let weak = Arc::downgrade(&inner);
        tokio::spawn(expire(weak, after));
    }
    Ok(Grant { inner })
}

impl Notes {
    /// The notification thread: while a caller waits, parks on the ring's
    /// tail until an entry comes, then wakes the caller; else sleeps on
    /// `want`. Takes nothing from the ring itself.
    fn watch(&self) {
        let page = &self.page;
        while !self.stop.load(SeqCst) {
            if self.want.load(SeqCst) == 0 {
                self.sleeping.store(1, SeqCst);
                if self.want.load(SeqCst) == 0 && !self.stop.load(SeqCst) {
                    sys::futex_wait(&self.want, 0, Some(PARK));
                }
                self.sleeping.store(0, SeqCst);
                continue;
            }
            if page.ring_tail().load(SeqCst) == page.ring_head().load(SeqCst) {
                ring::wait(page, Duration::ZERO, PARK);
                continue;
            }
            self.want.store(0, SeqCst);
            self.wake.notify_one();
        }
    }

    /// Whether the ring holds an entry not yet taken.
    fn queued(&self) -> bool {
        self.page.ring_tail().load(SeqCst) != self.page.ring_head().load(SeqCst)
    }

    /// The next notification, from what was taken or else from the ring
    /// (all it holds, at once: the holder gets its room back in batches).
    fn take(&self) -> Option<Notification> {
        let mut q = self.taken.lock().unwrap_or_else(|e| e.into_inner());
        if q.is_empty() {
            for _ in 0..self.page.ring_cap() {
                match ring::take(&self.page) {
                    ring::Taken::One(n) => q.push_back(n),
                    ring::Taken::Garbage => tracing::warn!(
                        "a grant's holder queued a notification that does not decode: dropped"
                    ),
                    ring::Taken::Empty => break,
                }
            }
        }
        let n = q.pop_front();
        if n.is_some() && !q.is_empty() {
            // Another caller may be waiting: it takes the next.
            self.wake.notify_one();
        }
        n
    }

    /// Spins on the ring for the low-latency mode's time: whether an entry
    /// came.
    fn spin(&self) -> bool {
        if self.spin.is_zero() {
            return false;
        }
        let until = Instant::now() + self.spin;
        loop {
            for _ in 0..64 {
                if self.queued() {
                    return true;
                }
                std::hint::spin_loop();
            }
            if Instant::now() >= until {
                return false;
            }
        }
    }

    async fn next(&self) -> Notification {
        loop {
            if let Some(n) = self.take() {
                return n;
            }
            if self.spin() {
                continue;
            }
            let woken = self.wake.notified();
            tokio::pin!(woken);
            woken.as_mut().enable();
            self.want.store(1, SeqCst);
            if self.sleeping.load(SeqCst) != 0 {
                sys::futex_wake(&self.want);
            }
            if self.queued() {
                continue;
            }
            woken.await;
        }
    }
}

async fn expire(grant: Weak<Owned>, after: Duration) {
    tokio::time::sleep(after).await;
    if let Some(g) = grant.upgrade() {
        let _ = Owned::revoke(g).await;
    }
}

impl Owned {
    fn set_revoked(&self) {
        self.page.state().store(REVOKED, SeqCst);
    }

    /// Whether nothing is in flight in either phase: after a store the
    /// holder's later operations will see, nothing that saw the old value
    /// can still be copying.
    fn idle(&self) -> bool {
        self.page.inflight(0).load(SeqCst) == 0 && self.page.inflight(1).load(SeqCst) == 0
    }

    /// Drains (see [`fence::drain`]), on a blocking thread unless nothing
    /// is in flight.
    async fn drain(this: Arc<Owned>) -> Result<()> {
        if this.idle() {
            return Ok(());
        }
        tokio::task::spawn_blocking(move || {
            let _one = this.drains.lock().unwrap_or_else(|e| e.into_inner());
            fence::drain(&this.page, this.deadline)
        })
        .await
        .map_err(|e| Error::Config(format!("a grant's drain failed: {e}")))?
        .map_err(Error::from)
    }

    async fn revoke(this: Arc<Owned>) -> Result<()> {
        this.set_revoked();
        if this.ucx.is_some() {
            let t = this.clone();
            tokio::task::spawn_blocking(move || t.ucx.as_ref().map(|u| u.shut(true)))
                .await
                .map_err(|e| Error::Config(format!("a grant's revoke failed: {e}")))?
                .filter(|&gone| gone)
                .ok_or(GrantError::Stalled {
                    pending: 1,
                    waited_ms: 2000,
                })?;
        }
        Owned::drain(this).await
    }
}

impl Grant {
    pub(super) fn owned(&self) -> &Arc<Owned> {
        &self.inner
    }

    /// The grant's name.
    pub fn id(&self) -> GrantId {
        self.inner.meta.grant
    }

    /// What to hand to the holder (as [`GrantMetadata::to_json`], at most
    /// 1 KiB). A capability: send it only to the holder.
    pub fn metadata(&self) -> &GrantMetadata {
        &self.inner.meta
    }

    /// The pool the grant is over.
    pub fn pool(&self) -> &Pool {
        &self.inner.pool
    }

    /// Whether the grant was revoked (or expired).
    pub fn is_revoked(&self) -> bool {
        self.inner.page.state().load(SeqCst) == REVOKED
    }

    /// Revokes the grant: once this returns `Ok`, no byte moves in or out
    /// of the pool through it; the holder's operations in flight ended
    /// (they were waited for), and its later ones fail with
    /// [`GrantError::Revoked`]. Returns as soon as a holder process killed
    /// mid-operation is seen gone. Idempotent.
    ///
    /// [`GrantError::Stalled`] if an operation of a live holder is still in
    /// flight after the grant's revoke deadline (a stopped holder): when
    /// it resumes, it may complete that one operation. The memory stays
    /// alive for it.
    pub async fn revoke(&self) -> Result<()> {
        Owned::revoke(self.inner.clone()).await
    }

    /// Retires blocks `indices` before the owner reuses them: bumps each
    /// one's generation, then waits for the holder's operations in flight
    /// that may have checked the old ones. When it returns, a transfer that
    /// names an old generation is refused
    /// ([`GrantError::StaleGeneration`]) and moves nothing. Returns the
    /// blocks' new references, for the holder's next transfers.
    pub async fn retire(&self, indices: &[u32]) -> Result<Vec<BlockRef>> {
        let page = &self.inner.page;
        let mut out = Vec::with_capacity(indices.len());
        for &i in indices {
            page.generation(i).ok_or(GrantError::OutOfRange {
                index: i,
                count: page.block_count(),
            })?;
        }
        for &i in indices {
            if let Some(g) = page.generation(i) {
                let now = g.fetch_add(1, SeqCst).wrapping_add(1);
                out.push(BlockRef::new(i, now));
            }
        }
        Owned::drain(self.inner.clone()).await?;
        Ok(out)
    }

    /// Block `index`'s generation now.
    pub fn generation(&self, index: u32) -> Result<u32> {
        let page = &self.inner.page;
        page.generation(index)
            .map(|g| g.load(SeqCst))
            .ok_or_else(|| {
                GrantError::OutOfRange {
                    index,
                    count: page.block_count(),
                }
                .into()
            })
    }

    /// The current references of blocks `indices` (index and generation).
    pub fn block_refs(&self, indices: &[u32]) -> Result<Vec<BlockRef>> {
        indices
            .iter()
            .map(|&i| Ok(BlockRef::new(i, self.generation(i)?)))
            .collect()
    }

    /// The next notification of the holder's operations, in order; `None`
    /// once the grant can have no more (never, while it lives). Takes them
    /// from the grant's ring directly while there are some; event driven
    /// while there are none (parked, no CPU; or a spin first, with
    /// [`GrantOptions::spin`]).
    pub async fn next_notification(&self) -> Option<Notification> {
        Some(self.held_by(self.inner.notes.next().await))
    }

    /// A notification already queued, if any, without waiting.
    pub fn try_next_notification(&self) -> Option<Notification> {
        self.inner.notes.take().map(|n| self.held_by(n))
    }

    /// `n`, naming the grant's holder.
    fn held_by(&self, mut n: Notification) -> Notification {
        n.holder.clone_from(&self.inner.meta.holder);
        n
    }
}

impl Drop for Grant {
    fn drop(&mut self) {
        let inner = &self.inner;
        inner.set_revoked();
        inner.notes.stop.store(true, SeqCst);
        sys::futex_wake(&inner.notes.want);
        sys::futex_wake(inner.page.ring_tail());
        if let Some(u) = &inner.ucx {
            u.shut(false);
        }
        if inner.idle() {
            return;
        }
        // Operations in flight: the pool's memory stays alive until they
        // ended or their process is gone, however long that takes (a
        // stopped holder).
        let keep = inner.clone();
        let moved = inner.clone();
        let spawned = std::thread::Builder::new()
            .name("ferry-grant-drop".into())
            .spawn(move || {
                let _one = moved.drains.lock().unwrap_or_else(|e| e.into_inner());
                while let Err(e) = fence::drain(&moved.page, moved.deadline) {
                    tracing::debug!("a dropped grant waits for its holder: {e}");
                }
            });
        if spawned.is_err() {
            // No thread to wait with: the memory is never freed rather
            // than freed under a copy.
            std::mem::forget(keep);
        }
    }
}

impl std::fmt::Debug for Grant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Grant")
            .field("id", &self.id())
            .field("revoked", &self.is_revoked())
            .field("metadata", &self.inner.meta)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicBool;
    use std::time::Instant;

    use super::*;

    /// Memory that says when it is freed.
    struct Watched {
        _mem: Vec<u8>,
        freed: Arc<AtomicBool>,
    }

    impl Drop for Watched {
        fn drop(&mut self) {
            self.freed.store(true, SeqCst);
        }
    }

    #[tokio::test]
    async fn a_dropped_grant_keeps_the_memory_until_the_copy_in_flight_ends() {
        let freed = Arc::new(AtomicBool::new(false));
        let mut mem = vec![0u8; 4 * 4096];
        let ptr = mem.as_mut_ptr();
        let watched = Watched {
            _mem: mem,
            freed: freed.clone(),
        };
        // SAFETY: the vector's buffer lives as long as `watched`, which the
        // pool owns; nothing else touches it.
        let pool = unsafe {
            Pool::from_raw_parts(ptr, 4 * 4096, 4096, ferry_proto::Device::CPU, true, watched)
        }
        .unwrap();
        let g = create("o", "h", &pool, GrantOptions::write().bearer(), None).unwrap();
        let page = g.inner.page.clone();
        // A holder (this process) with a copy in flight.
        let me = std::process::id();
        page.holder_pid().store(me, SeqCst);
        page.holder_start()
            .store(sys::process_start(me).unwrap(), SeqCst);
        let copy = fence::enter(&page).unwrap();
        drop(pool);
        drop(g);
        std::thread::sleep(Duration::from_millis(50));
        assert!(!freed.load(SeqCst), "the memory was freed under a copy");
        assert!(page.state().load(SeqCst) == REVOKED);
        drop(copy);
        let t = Instant::now();
        while !freed.load(SeqCst) {
            assert!(t.elapsed() < Duration::from_secs(5), "never freed");
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}
