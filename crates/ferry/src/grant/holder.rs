//! The holder's side of a grant: one-sided reads and writes of the owner's
//! blocks.

use std::sync::atomic::Ordering::SeqCst;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ferry_proto::grant::{check, BlockRef, GrantError, GrantMetadata, Rights};

use super::control::{ControlPage, Header, LIVE};
use super::remote_tcp::TcpHeld;
use super::{copy, fence, ipc, ring, sys, GrantLane, Notification, NotificationKind};
use crate::transport::cma::{self, Peer};
use crate::{Error, Pool, Result};

mod ranges;

/// Transfers of at least this many bytes are copied on a blocking thread;
/// smaller ones in place (a copy of up to 1 MiB takes tens of
/// microseconds, about what a hand-over to a blocking thread adds to it
/// on a busy host).
pub const INLINE_MAX: usize = 2 << 20;

/// How long a write waits for room in the owner's notification ring.
const RING_PATIENCE: Duration = Duration::from_secs(1);

/// A grant opened by its holder ([`Connector::open_grant`](crate::Connector::open_grant)):
/// reads and writes blocks of the owner's memory by index, from and into
/// blocks of a local [`Pool`], one-sidedly.
///
/// Each operation checks that the grant is live and that every block it
/// names is at the generation it names, then copies, inside the fence the
/// owner's [`revoke`](crate::Grant::revoke) and
/// [`retire`](crate::Grant::retire) wait on. Local blocks are taken from
/// the local pool for the copy, as an operation takes them
/// ([`PoolError::Busy`](crate::PoolError::Busy) if another holds them).
#[derive(Clone)]
pub struct RemoteGrant {
    lane: Lane,
}

/// How the holder reaches the owner's memory.
#[derive(Clone)]
enum Lane {
    /// Cross-memory attach: copies itself, fenced by the control page.
    Cma(Arc<Held>),
    /// TCP: the owner's runtime serves each request.
    Tcp(Arc<TcpHeld>),
    /// UCX: gets and puts with the grant's remote keys.
    Ucx(Arc<super::ucx::holder::UcxHeld>),
}

struct Held {
    meta: GrantMetadata,
    page: Arc<ControlPage>,
    owner: Peer,
    alive: Liveness,
    base: u64,
    me: u32,
    /// The process's producer lock on the notification ring, and the last
    /// sequence number pushed.
    producer: Mutex<u64>,
    /// The owner's device memory, mapped (a grant of device memory).
    ipc: Option<super::ipc::Mapped>,
}

impl Drop for Held {
    fn drop(&mut self) {
        // Every operation holds this value: none is in flight any more.
        let _ = self
            .page
            .holder_pid()
            .compare_exchange(self.me, 0, SeqCst, SeqCst);
    }
}

/// Opens a grant for this worker (see
/// [`Connector::open_grant`](crate::Connector::open_grant)) by lane `via`:
/// cross-memory attach where it reaches the owner, else TCP over
/// `tcp` (this connector's connections; `None`: no TCP lane).
pub(crate) async fn open(
    worker_id: &str,
    host_id: &str,
    meta: &GrantMetadata,
    via: GrantLane,
    tcp: Option<&Arc<crate::transport::tcp::TcpTransport>>,
) -> Result<RemoteGrant> {
    meta.validate()?;
    check::holder(meta.holder.as_deref(), worker_id)?;
    check::expiry(meta.expires_at_ms, super::now_ms())?;
    if !meta.device.is_cpu() && meta.cuda_ipc.is_none() {
        return Err(GrantError::NoLane(format!(
            "the granted memory is on {} and the grant offers no CUDA IPC lane",
            meta.device
        ))
        .into());
    }
    let by_tcp = || -> Result<RemoteGrant> {
        let tcp = tcp.ok_or_else(|| GrantError::NoLane("no TCP transport here".into()))?;
        let held = TcpHeld::new(meta, tcp.clone())?;
        Ok(RemoteGrant::over(Lane::Tcp(Arc::new(held))))
    };
    let by_ucx = || async {
        let held = super::ucx::holder::open(meta).await?;
        Ok::<_, Error>(RemoteGrant::over(Lane::Ucx(Arc::new(held))))
    };
    match via {
        GrantLane::Tcp => return by_tcp(),
        GrantLane::Cma => return open_cma(host_id, meta).await,
        GrantLane::Ucx => return by_ucx().await,
        _ => {}
    }
    match open_cma(host_id, meta).await {
        // The grant's own answers (forged, revoked, claimed) stand; only
        // a lane that does not reach the owner falls back: to UCX where
        // the grant offers it, else to TCP.
        Err(Error::Grant(GrantError::NoLane(why))) if meta.ucx.is_some() => {
            tracing::debug!("grant {}: by UCX ({why})", meta.grant.0);
            by_ucx().await
        }
        Err(Error::Grant(GrantError::NoLane(why))) if meta.tcp.is_some() && tcp.is_some() => {
            tracing::debug!("grant {}: by TCP ({why})", meta.grant.0);
            by_tcp()
        }
        r => r,
    }
}

/// Opens a grant by cross-memory attach.
async fn open_cma(host_id: &str, meta: &GrantMetadata) -> Result<RemoteGrant> {
    let Some(lane) = meta.cma else {
        return Err(
            GrantError::NoLane("the grant offers no cross-memory attach lane".into()).into(),
        );
    };
    if meta.host_id != host_id {
        return Err(GrantError::NoLane("the owner is on another host".into()).into());
    }
    let meta = meta.clone();
    tokio::task::spawn_blocking(move || attach(meta, lane.pid, lane.control_fd, lane.base))
        .await
        .map_err(|e| Error::Config(format!("opening a grant failed: {e}")))?
}

impl RemoteGrant {
    fn over(lane: Lane) -> RemoteGrant {
        RemoteGrant { lane }
    }
}

/// Takes hold of the owner process, maps its control page and claims the
/// grant. Blocking (file system, the owner's memory).
fn attach(meta: GrantMetadata, pid: u32, fd: i32, base: u64) -> Result<RemoteGrant> {
    let no_lane =
        |e: std::io::Error| GrantError::NoLane(format!("cannot attach to process {pid}: {e}"));
    // The handle first, then the page through it: both name one process.
    let owner = Peer::open(pid).map_err(no_lane)?;
    let name = std::ffi::CString::new(format!("fd/{fd}"))
        .map_err(|_| GrantError::Forged { what: "descriptor" })?;
    let file = match cma::open_in(
        owner.dir(),
        &name,
        libc::O_RDWR | libc::O_NOCTTY | libc::O_NONBLOCK,
    ) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            // The owner holds no such descriptor: the grant was dropped
            // (or the metadata never was the owner's).
            return Err(GrantError::Revoked.into());
        }
        Err(e) => return Err(no_lane(e).into()),
    };
    let page = ControlPage::open(
        file,
        &Header {
            block_count: meta.block_count,
            cookie: meta.cma.map(|c| c.cookie).unwrap_or_default(),
            token_hash: super::ipc::page_hash(&meta.token, meta.cuda_ipc.as_ref()),
            grant: meta.grant,
            base,
            block_size: meta.block_size,
            expires_at_ms: meta.expires_at_ms.unwrap_or(0),
            rights: meta.rights,
        },
    )
    .map_err(|e| super::ipc::forged(e, &meta))?;
    if page.state().load(SeqCst) != LIVE {
        return Err(GrantError::Revoked.into());
    }
    // Device memory: its handle opened once, for the grant's life.
    let ipc = match &meta.cuda_ipc {
        Some(lane) => Some(super::ipc::open(&meta, lane, pid)?),
        None => None,
    };
    let me = std::process::id();
    if let Err(pid) = page.holder_pid().compare_exchange(0, me, SeqCst, SeqCst) {
        return Err(GrantError::Claimed { pid }.into());
    }
    page.holder_start()
        .store(sys::process_start(me).unwrap_or(0), SeqCst);
    let alive = Liveness::take(&owner, page.owner_tid().load(SeqCst));
    Ok(RemoteGrant {
        lane: Lane::Cma(Arc::new(Held {
            meta,
            page: Arc::new(page),
            owner,
            alive,
            base,
            me,
            producer: Mutex::new(0),
            ipc,
        })),
    })
}

impl RemoteGrant {
    /// The grant's metadata.
    pub fn metadata(&self) -> &GrantMetadata {
        match &self.lane {
            Lane::Cma(h) => &h.meta,
            Lane::Tcp(t) => t.metadata(),
            Lane::Ucx(u) => u.metadata(),
        }
    }

    /// What the grant allows.
    pub fn rights(&self) -> Rights {
        self.metadata().rights
    }

    /// The lane the grant was opened by: [`GrantLane::Cma`],
    /// [`GrantLane::Tcp`] or [`GrantLane::Ucx`].
    pub fn lane(&self) -> GrantLane {
        match &self.lane {
            Lane::Cma(_) => GrantLane::Cma,
            Lane::Tcp(_) => GrantLane::Tcp,
            Lane::Ucx(_) => GrantLane::Ucx,
        }
    }

    /// Whether the owner revoked the grant (or it expired). Over TCP and
    /// UCX: as far as this holder learned (at its last operation).
    pub fn is_revoked(&self) -> bool {
        let expired = check::expiry(self.metadata().expires_at_ms, super::now_ms()).is_err();
        match &self.lane {
            Lane::Cma(h) => h.page.state().load(SeqCst) != LIVE || expired,
            Lane::Tcp(t) => t.is_revoked() || expired,
            Lane::Ucx(u) => u.seen_revoked() || expired,
        }
    }

    /// Block `index`'s generation now (cma: read from the owner's control
    /// page; UCX: one get of it; TCP: the last one this holder learned,
    /// from the owner's refusals of a stale one, 0 at first).
    pub fn generation(&self, index: u32) -> Result<u32> {
        let h = match &self.lane {
            Lane::Cma(h) => h,
            Lane::Tcp(t) => return t.generation(index),
            Lane::Ucx(u) => return Ok(u.generations(&[index])?[0]),
        };
        let page = &h.page;
        match page.generation(index) {
            Some(g) => Ok(g.load(SeqCst)),
            None => Err(GrantError::OutOfRange {
                index,
                count: page.block_count(),
            }
            .into()),
        }
    }

    /// The current references of blocks `indices` (over UCX, read in one
    /// batch of gets).
    pub fn block_refs(&self, indices: &[u32]) -> Result<Vec<BlockRef>> {
        if let Lane::Ucx(u) = &self.lane {
            let g = u.generations(indices)?;
            return Ok(indices
                .iter()
                .zip(g)
                .map(|(&i, g)| BlockRef::new(i, g))
                .collect());
        }
        indices
            .iter()
            .map(|&i| Ok(BlockRef::new(i, self.generation(i)?)))
            .collect()
    }

    /// Reads the owner's blocks `remote` into blocks `local_blocks` of
    /// `local` (pairwise; the pools' block sizes must match). Refused,
    /// with nothing copied, if the grant is revoked or expired, gives no
    /// READ, or a block is out of range or at another generation than
    /// named.
    pub async fn read_blocks(
        &self,
        remote: &[BlockRef],
        local: &Pool,
        local_blocks: &[u32],
    ) -> Result<()> {
        self.precheck(Rights::READ, remote, local, local_blocks)?;
        let inner = match &self.lane {
            Lane::Cma(h) => h.clone(),
            // Boxed, as every TCP-lane future here: they are kilobytes, and
            // unboxed they would make every lane's operation as large.
            Lane::Tcp(t) => return Box::pin(t.read_blocks(remote, local, local_blocks)).await,
            Lane::Ucx(u) => {
                let bytes = remote_len(self.metadata(), local_blocks.len());
                let (u, remote, local) = (u.clone(), remote.to_vec(), local.clone());
                let local_blocks = local_blocks.to_vec();
                let op = move || u.read(&remote, &local, &local_blocks);
                return self.run(bytes, op).await;
            }
        };
        let desc = local.blocks(local_blocks)?;
        let remote = remote.to_vec();
        let op = move || -> Result<()> {
            let mut segs = Vec::with_capacity(desc.block_count());
            desc.raw_segments(&mut segs);
            let _in = inner.enter(&remote)?;
            if let Some(m) = &inner.ipc {
                // SAFETY: `desc` holds the local blocks exclusively (taken
                // writable from their pool, which `precheck` showed is on
                // the mapping's GPU) until it drops after the copy.
                unsafe { m.copy(ipc::Dir::Read, &segs, &remote) }
                    .map_err(|e| inner.ipc_failed(e))?;
                drop(desc);
                return Ok(());
            }
            let (l, r) = copy::pair(&segs, &inner.ranges(&remote));
            let plan = copy::plan(&l, &r);
            copy::run(&plan, |l, r| {
                // SAFETY: `desc` holds the local blocks exclusively (taken
                // writable from their pool) until it drops after the copy,
                // so each range is valid for writes and touched by nothing
                // else; the plan's units are disjoint parts of them (no
                // two threads write one byte), equal pairwise.
                unsafe { copy::read(&inner.owner, l, r) }
            })
            .map_err(|e| inner.copy_failed(e))?;
            drop(desc);
            Ok(())
        };
        self.run(remote_len(self.metadata(), local_blocks.len()), op)
            .await
    }

    /// Writes blocks `local_blocks` of `local` into the owner's blocks
    /// `remote` (pairwise), then, with `notify` (at most
    /// [`MAX_NOTIFICATION`](super::MAX_NOTIFICATION) bytes; `Some(&[])` for
    /// none), queues a notification for the owner, before the operation
    /// leaves the fence. Refused, with nothing copied, as
    /// [`read_blocks`](Self::read_blocks) is (WRITE needed).
    pub async fn write_blocks(
        &self,
        local: &Pool,
        local_blocks: &[u32],
        remote: &[BlockRef],
        notify: Option<&[u8]>,
    ) -> Result<()> {
        if let Some(p) = notify {
            check::payload(p.len())?;
        }
        self.precheck(Rights::WRITE, remote, local, local_blocks)?;
        let payload = notify.map(<[u8]>::to_vec);
        let inner = match &self.lane {
            Lane::Cma(c) => c.clone(),
            Lane::Tcp(t) => {
                return Box::pin(t.write_blocks(local, local_blocks, remote, notify)).await
            }
            Lane::Ucx(u) => {
                let bytes = remote_len(self.metadata(), local_blocks.len());
                let (u, remote, local) = (u.clone(), remote.to_vec(), local.clone());
                let local_blocks = local_blocks.to_vec();
                let op = move || u.write(&local, &local_blocks, &remote, payload);
                return self.run(bytes, op).await;
            }
        };
        let desc = local.shared_blocks(local_blocks)?;
        let remote = remote.to_vec();
        let op = move || -> Result<()> {
            let mut segs = Vec::with_capacity(desc.block_count());
            desc.raw_segments(&mut segs);
            let _in = inner.enter(&remote)?;
            if let Some(m) = &inner.ipc {
                // SAFETY: `desc` holds the local blocks shared (no writer)
                // until it drops after the copy; `precheck` showed they
                // are on the mapping's GPU.
                unsafe { m.copy(ipc::Dir::Write, &segs, &remote) }
                    .map_err(|e| inner.ipc_failed(e))?;
            } else {
                let (l, r) = copy::pair(&segs, &inner.ranges(&remote));
                let l: Vec<(*const u8, usize)> =
                    l.into_iter().map(|(p, n)| (p.cast_const(), n)).collect();
                let plan = copy::plan(&l, &r);
                // Never into a process that is not the owner (see `Liveness`).
                inner.owner_alive()?;
                let pid = inner.owner.pid();
                copy::run(&plan, |l, r| {
                    // SAFETY: `desc` holds the local blocks shared (no writer)
                    // until it drops after the copy, so each range is valid
                    // for reads; the plan keeps lengths equal pairwise.
                    unsafe { copy::write(pid, l, r) }
                })
                .map_err(|e| inner.copy_failed(e))?;
            }
            drop(desc);
            if let Some(payload) = payload {
                inner.notify(&remote, payload)?;
            }
            Ok(())
        };
        self.run(remote_len(self.metadata(), local_blocks.len()), op)
            .await
    }

    /// The checks that need no fence.
    fn precheck(
        &self,
        needed: Rights,
        remote: &[BlockRef],
        local: &Pool,
        local_blocks: &[u32],
    ) -> Result<()> {
        let m = self.metadata();
        check::rights(m.rights, needed)?;
        let held = match &self.lane {
            Lane::Cma(h) => Some(h),
            Lane::Tcp(_) | Lane::Ucx(_) => None,
        };
        check::expiry(m.expires_at_ms, super::now_ms()).inspect_err(|_| {
            if let Some(h) = held {
                h.unmap();
            }
        })?;
        check::blocks(remote, m.block_count)?;
        check::shape(
            local_blocks.len(),
            local.block_size() as u64,
            remote.len(),
            m.block_size,
        )?;
        match held.and_then(|h| h.ipc.as_ref()) {
            Some(m) => m.check_local(local.device())?,
            None if !local.device().is_cpu() => {
                return Err(GrantError::NoLane(format!(
                    "the granted memory is host memory and the local pool is on {}: a grant \
                     copies host to host here, GPU to GPU by CUDA IPC",
                    local.device()
                ))
                .into())
            }
            None => {}
        }
        Ok(())
    }

    /// Runs `op` in place, or on a blocking thread for large transfers.
    async fn run(
        &self,
        bytes: u64,
        op: impl FnOnce() -> Result<()> + Send + 'static,
    ) -> Result<()> {
        if bytes < INLINE_MAX as u64 {
            return op();
        }
        tokio::task::spawn_blocking(op)
            .await
            .map_err(|e| Error::Config(format!("a grant's copy failed: {e}")))?
    }
}

fn remote_len(meta: &GrantMetadata, blocks: usize) -> u64 {
    meta.block_size.saturating_mul(blocks as u64)
}

/// How a write makes sure that the owner's pid still names the owner,
/// running the image that passed the attach probe, before it writes by pid
/// (`process_vm_writev` takes a pid, and cannot read the image's random
/// bytes in the same call as a read does).
///
/// The owner's notification thread lives, in the owner process, exactly as
/// long as the grant does there, and publishes its thread id on the control
/// page. At attach the holder takes a descriptor of that very thread
/// (`pidfd_open(tid, PIDFD_THREAD)`), then checks that the thread id is one
/// of the owner's (`task/<tid>` in the owner's `/proc` handle, which never
/// names a later process) and that the owner still shows the probed
/// image's random bytes ([`Peer::check`]). From then on the descriptor
/// names that thread and nothing else, whatever reuses its id, and polls
/// readable once it has exited, which it does when:
///
/// - the owner process exits (then its pid may come to name another
///   process: the descriptor does not follow the pid);
/// - the owner replaces its program (`exec` kills every other thread, and
///   waits until they have exited, before it maps the new image);
/// - the owner drops the grant.
///
/// So a thread that is still alive at the poll means the pid names the
/// owner, running the probed image, at that moment; a write checks that
/// before it copies, as [`Peer::check`] did, at the cost of a poll that
/// does not wait instead of a cross-process read (which takes the owner's
/// memory-map lock and pins a page). Both leave the same microseconds
/// between the check and the copy. Without a thread id (an older owner) or
/// without `PIDFD_THREAD` (Linux before 6.9), every write reads the random
/// bytes, as before.
enum Liveness {
    Thread(std::os::fd::OwnedFd),
    Probe,
}

impl Liveness {
    fn take(owner: &Peer, tid: u32) -> Liveness {
        let Ok(fd) = sys::thread_pidfd(tid) else {
            return Liveness::Probe;
        };
        let mine = std::ffi::CString::new(format!("task/{tid}"))
            .ok()
            .and_then(|n| cma::open_in(owner.dir(), &n, libc::O_DIRECTORY).ok())
            .is_some();
        // The descriptor was taken first: if the id was another process's
        // then and is the owner's now, that thread has exited, and the
        // descriptor says so (every write refused, never a wrong one).
        if mine && owner.check().is_ok() {
            Liveness::Thread(fd)
        } else {
            Liveness::Probe
        }
    }
}

impl Held {
    /// Unmaps the owner's device memory (the grant ended: revoked or
    /// expired); nothing for host memory.
    fn unmap(&self) {
        if let Some(m) = &self.ipc {
            m.close();
        }
    }

    /// Whether the owner process, running the probed image, still holds
    /// the grant (see [`Liveness`]): before every write.
    fn owner_alive(&self) -> Result<()> {
        let gone = match &self.alive {
            Liveness::Thread(fd) => !sys::thread_alive(fd).unwrap_or(false),
            Liveness::Probe => self.owner.check().is_err(),
        };
        if !gone {
            return Ok(());
        }
        if self.page.state().load(SeqCst) != LIVE {
            return Err(GrantError::Revoked.into());
        }
        Err(GrantError::OwnerGone("the owner process exited or replaced its program".into()).into())
    }

    /// Enters the fence and checks the named generations inside it.
    fn enter(&self, remote: &[BlockRef]) -> Result<fence::Entered> {
        let entered = fence::enter(&self.page).inspect_err(|_| self.unmap())?;
        check::generations(remote, |i| {
            self.page.generation(i).map_or(u32::MAX, |g| g.load(SeqCst))
        })?;
        Ok(entered)
    }

    /// The owner's address ranges of blocks `remote`.
    fn ranges(&self, remote: &[BlockRef]) -> Vec<(u64, u64)> {
        let bs = self.meta.block_size;
        remote
            .iter()
            .map(|r| {
                (
                    self.base
                        .saturating_add(u64::from(r.index).saturating_mul(bs)),
                    bs,
                )
            })
            .collect()
    }

    fn ipc_failed(&self, e: ipc::CopyError) -> Error {
        match e {
            ipc::CopyError::Grant(g) => g.into(),
            ipc::CopyError::Cuda(c) => self.copy_failed(std::io::Error::other(c)),
        }
    }

    fn copy_failed(&self, e: std::io::Error) -> Error {
        if self.owner.unchanged() {
            GrantError::Copy(e.to_string()).into()
        } else {
            GrantError::OwnerGone(e.to_string()).into()
        }
    }

    fn notify(&self, remote: &[BlockRef], payload: Vec<u8>) -> Result<()> {
        let mut seq = self.producer.lock().unwrap_or_else(|e| e.into_inner());
        *seq += 1;
        let n = Notification {
            seq: *seq,
            kind: NotificationKind::Write,
            first_block: remote.first().map_or(0, |r| r.index),
            block_count: remote.len() as u32,
            payload,
            holder: None,
        };
        ring::push(&self.page, &n, RING_PATIENCE).inspect_err(|_| *seq -= 1)?;
        Ok(())
    }
}

impl std::fmt::Debug for RemoteGrant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteGrant")
            .field("lane", &self.lane())
            .field("metadata", self.metadata())
            .field("revoked", &self.is_revoked())
            .finish()
    }
}
