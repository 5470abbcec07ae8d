//! The TCP transport: one pooled connection per remote worker, shared by all
//! operations to it, framed by `ferry_proto::wire`.
//!
//! Payload bytes move without staging copies: the sender hands slices of the
//! source memory straight to the socket, the receiver reads from the socket
//! straight into the destination memory (only a payload's first bytes that
//! arrived together with its frame header are copied out of the read buffer).
//! With a shared secret, every byte after the handshake goes through the
//! secure channel instead (`secure.rs`; the streams are in `conn_io.rs`).
//! Every access to operation memory goes through [`Region`], so a cancel or a
//! drop fences the transport out before the memory is released.
//!
//! All writes to a socket happen in spawned tasks holding the connection's
//! write lock for one frame, so a caller that drops a future can never leave
//! half a frame on the wire. Each connection has one reader task; it never
//! waits for the write side, so two connectors writing to each other cannot
//! deadlock.

use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use ferry_proto::wire::{
    self, part_range, Abort, AbortReason, Attach, Auth, Data, Hello, Lease, Message, Open, Verdict,
    WireError, MAX_LEASE_SEGMENTS, MAX_PARTS,
};
use ferry_proto::{Cursor, OperationKind, OperationStatus, RdmaMetadata};
use tokio::net::{TcpListener, TcpStream};
use tokio::runtime::Handle;
use tokio::sync::watch;

use super::admission::{Admission, Ticket};
use super::conn_io::{ConnWriter, FrameReader};
use super::probe::verify_peer;
use super::secure;
use super::stall::{self, CopySlot, CopySlots};
use super::{cma, ActiveJob, ActiveLink, BoxFuture, Transport, TransportKind};
use crate::auth::Secret;
use crate::connector::Inner;
use crate::exposure::{abort_reason, Binding, Exposure};
use crate::host;
use crate::op::OpShared;
use crate::region::{Denied, Region};
use crate::{Error, Result};

/// Operations up to this size go out in one write: header, payload and end.
const SMALL: u64 = 64 * 1024;
/// Larger ones are sent in chunks of this size, so that concurrent operations
/// on one connection take turns.
const CHUNK: u32 = 2 * 1024 * 1024;
/// How long a new connection may take to say hello.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// The most control frames a connection may have waiting to be sent.
const MAX_QUEUED: usize = 4096;
/// A cross-memory copy holds the destination's lock for at most this many
/// bytes, so that a cancel waits at most that long.
const PULL_CHUNK: u64 = cma::CHUNK as u64;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// What went wrong on a connection; it is closed afterwards.
pub(super) enum ConnError {
    Io(io::Error),
    Wire(WireError),
    Violation(String),
    Closed(Error),
}

impl From<io::Error> for ConnError {
    fn from(e: io::Error) -> Self {
        ConnError::Io(e)
    }
}
impl From<WireError> for ConnError {
    fn from(e: WireError) -> Self {
        ConnError::Wire(e)
    }
}

impl ConnError {
    fn into_error(self, peer: &str) -> Error {
        match self {
            ConnError::Io(e) if e.kind() == io::ErrorKind::UnexpectedEof => Error::ConnectionLost {
                peer: peer.to_string(),
                cause: "the remote closed the connection (did the remote process exit?)".into(),
            },
            ConnError::Io(e) => Error::ConnectionLost {
                peer: peer.to_string(),
                cause: e.to_string(),
            },
            ConnError::Wire(e) => Error::Protocol {
                peer: peer.to_string(),
                detail: e.to_string(),
            },
            ConnError::Violation(d) => Error::Protocol {
                peer: peer.to_string(),
                detail: d,
            },
            ConnError::Closed(e) => e,
        }
    }
}

/// The `Open` behind `opened` is on the wire (or never will be): an
/// `Abort` waiting for it may follow.
fn mark_opened(opened: &Option<Arc<watch::Sender<bool>>>) {
    if let Some(o) = opened {
        o.send_replace(true);
    }
}

/// Tries to write the last frame of a transfer, sealing the operation
/// under the region's lock at the moment its first byte enters the socket
/// (see [`Conn::write_final`]): `None` if the region is closed (nothing
/// sent), else what `try_write` returned.
fn try_write_sealed(
    w: &mut ConnWriter,
    region: &Region,
    shared: &OpShared,
    frame: &[u8],
) -> Option<io::Result<usize>> {
    let mut r = None;
    region.seal_if_open(|| {
        // Sealed before the bytes can reach the remote (its answer may be
        // read before `try_write` even returns here), and unsealed if
        // nothing went out: all under the lock, so a cancel never sees the
        // difference.
        shared.seal();
        let x = w.try_write(frame);
        if !matches!(x, Ok(n) if n > 0) {
            shared.unseal();
        }
        r = Some(x);
    });
    r
}

/// The part a request plays in a cross-memory-attach transfer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cma {
    /// The bytes go in `Data` frames.
    No,
    /// This side is the source and lent its memory (`Lease` sent).
    Lent,
    /// A READ asked for a lease; the answer is a `Lease` or `Data` frames.
    Requested,
    /// A pulled WRITE whose `Lease` has not arrived yet.
    AwaitLease,
    /// This side is the destination and copies from the peer.
    Pulling,
}

/// Where a connection stands in setting up cross-memory attach.
enum Attaching {
    /// Nothing received yet.
    Idle,
    /// The passive side answered the active side's nonce (`None`: declined).
    Offered(Option<([u8; 16], [u8; 16])>),
    /// Set up, or declined.
    Done,
}

/// An active operation waiting for its remote.
struct ActiveReq {
    kind: OperationKind,
    region: Arc<Region>,
    shared: Arc<OpShared>,
    cursor: Cursor,
    cma: Cma,
    /// The transfer is striped and this request carries one part of it.
    part: Option<Part>,
}

/// The part of a striped transfer that a request carries.
struct Part {
    stripe: Arc<Stripe>,
    index: u16,
    /// A part other than 0 that has ended (landed, or confirmed): it stays
    /// in the table until the operation ends, so that an `Abort` or a lost
    /// connection on it still ends the operation.
    done: bool,
    /// The source of a part other than 0 has sent all of it: only then may
    /// the destination confirm it.
    sent: bool,
}

impl Part {
    fn new(stripe: Arc<Stripe>, index: u16) -> Option<Self> {
        Some(Part {
            stripe,
            index,
            done: false,
            sent: false,
        })
    }
}

/// Whether `part` is of a striped transfer whose other parts have not all
/// landed (a commit now would be premature).
fn parts_missing(part: &Option<Part>) -> bool {
    part.as_ref().is_some_and(|p| !p.stripe.all_done())
}

/// A passive operation bound to a request on this connection.
struct PassiveReq {
    exposure: Arc<Exposure>,
    /// For writes: where the next payload byte must go.
    cursor: Option<Cursor>,
    cma: Cma,
    /// As in [`ActiveReq`].
    part: Option<Part>,
}

/// A transfer split into parts, each a request on a connection of its own
/// (see `docs/transports.md`, "Striping"). Part 0 travels on the first
/// connection and commits the whole: its source sends the sealing `Finish`
/// only after the destination has confirmed every other part.
pub(crate) struct Stripe {
    parts: u16,
    /// The worker that sends the parts (passive side): all must come from it.
    peer: String,
    /// Parts other than 0 whose bytes have all landed: the destination
    /// counts them as their `Finish` arrives, the source as their
    /// confirmation does.
    done: watch::Sender<u16>,
    /// The request of each part, once bound.
    members: Mutex<Vec<Option<Member>>>,
}

#[derive(Clone)]
struct Member {
    conn: Weak<Conn>,
    req: u64,
    /// Active side: set once the part's `Open` is on the wire.
    opened: Option<Arc<watch::Sender<bool>>>,
}

impl Stripe {
    pub(crate) fn new(parts: u16, peer: String) -> Arc<Self> {
        Arc::new(Stripe {
            parts,
            peer,
            done: watch::Sender::new(0),
            members: Mutex::new((0..parts).map(|_| None).collect()),
        })
    }

    pub(crate) fn parts(&self) -> u16 {
        self.parts
    }

    pub(crate) fn peer(&self) -> &str {
        &self.peer
    }

    /// Records the request that carries `part`; false if it has one already.
    pub(crate) fn bind(
        &self,
        part: u16,
        conn: Weak<Conn>,
        req: u64,
        opened: Option<Arc<watch::Sender<bool>>>,
    ) -> bool {
        let mut m = lock(&self.members);
        match m.get_mut(usize::from(part)) {
            Some(slot @ None) => {
                *slot = Some(Member { conn, req, opened });
                true
            }
            _ => false,
        }
    }

    fn part_done(&self) {
        self.done.send_modify(|n| *n += 1);
    }

    fn all_done(&self) -> bool {
        *self.done.borrow() + 1 >= self.parts
    }

    /// Ends every part's request still in a connection's table; with a
    /// reason, each part is also told with an `Abort` (after its `Open`,
    /// which it must not overtake). May be called again (first without a
    /// reason, to leave the tables before waking waiters, then with one).
    pub(crate) fn abandon(&self, abort: Option<(AbortReason, String)>) {
        let members: Vec<Member> = lock(&self.members).iter().flatten().cloned().collect();
        for m in members {
            let Some(conn) = m.conn.upgrade() else {
                continue;
            };
            lock(&conn.active).remove(&m.req);
            lock(&conn.passive).remove(&m.req);
            // Told even if its request has left the table: on the passive
            // side a part bound just before the end may not be in it yet
            // (its reader inserts it after binding, then sees the end and
            // leaves it out); an `Abort` for a request that ended is ignored.
            let Some((reason, detail)) = abort.clone() else {
                continue;
            };
            match m.opened {
                Some(o) if !*o.borrow() => {
                    let mut o = o.subscribe();
                    let h = conn.handle.clone();
                    h.spawn(async move {
                        until(&mut o, |o| *o).await;
                        conn.abort_detached(m.req, reason, detail);
                    });
                }
                _ => conn.abort_detached(m.req, reason, detail),
            }
        }
    }
}

/// How a stream of `Data` frames ends.
enum Last {
    /// With the `Finish` that seals the operation (not striped).
    Seal,
    /// With a plain `Finish`: a part other than 0, which the destination
    /// confirms.
    Part,
    /// Part 0: with the sealing `Finish`, once every other part is confirmed.
    SealAfter(Arc<Stripe>),
}

/// How a cross-memory copy ended.
enum PullEnd {
    /// Every byte landed and the operation is sealed.
    Done,
    /// The destination closed (a cancel or the end of the operation).
    Closed,
    /// The copy failed; the operation must fail on both sides.
    Failed(String),
}

/// Copies every segment of a lease from process `peer` into `region`, one
/// chunk per system call, each outside the region's lock (the peer may stall
/// it: see `Region::copy_into`), then seals the operation under that lock.
/// Every copy, a check before the first and a confirmation before the seal
/// make sure that `peer` still runs the program that passed the attach probe.
fn pull_all(peer: &cma::Peer, region: &Region, shared: &OpShared, segs: &[(u64, u64)]) -> PullEnd {
    /// The most iovecs of one system call: one fewer than Linux's
    /// `IOV_MAX`, since `Peer::pull_many` adds the range that checks the
    /// program image.
    const MAX_IOV: usize = 1023;
    let pid = peer.pid();
    let failed =
        |e: io::Error| PullEnd::Failed(format!("cross-memory copy from process {pid} failed: {e}"));
    if let Err(e) = peer.check() {
        return failed(e);
    }
    let mut i = 0;
    while i < segs.len() {
        // Small segments in a row: one vectored call for up to a chunk.
        let mut count = 0;
        let mut bytes = 0u64;
        while i + count < segs.len() && count < MAX_IOV && segs[i + count].1 <= PULL_CHUNK - bytes {
            bytes += segs[i + count].1;
            count += 1;
        }
        if count > 1 {
            let batch = &segs[i..i + count];
            let r = region.copy_into(i, count, None, |local| {
                if local.iter().zip(batch).any(|(l, r)| l.1 as u64 != r.1) {
                    return Err(io::Error::other("lease larger than the destination"));
                }
                // SAFETY: `copy_into` hands out whole segments of the region,
                // counted as in flight until we return: valid for writes and
                // touched by nothing else meanwhile; the lengths match the
                // lease pairwise (checked above) and `count` <= IOV_MAX.
                unsafe { peer.pull_many(local, batch) }
            });
            match r {
                Ok(Ok(())) => {}
                Ok(Err(e)) => return failed(e),
                Err(Denied::Closed) => return PullEnd::Closed,
                Err(Denied::OutOfBounds) => {
                    return PullEnd::Failed("lease larger than the destination".into())
                }
            }
            i += count;
            continue;
        }
        let (addr, len) = segs[i];
        let mut off = 0u64;
        while off < len {
            let n = (len - off).min(PULL_CHUNK) as usize;
            let Some(at) = addr.checked_add(off) else {
                return PullEnd::Failed("lease address overflows".into());
            };
            // SAFETY: `copy_into` hands out `n` bytes at `off` of segment
            // `i` (bounds checked), counted as in flight until we return:
            // valid for writes and touched by nothing else meanwhile; one
            // local and one remote range of the same length.
            let r = region.copy_into(i, 1, Some((off, n)), |local| unsafe {
                peer.pull_many(local, &[(at, n as u64)])
            });
            match r {
                Ok(Ok(())) => off += n as u64,
                Ok(Err(e)) => return failed(e),
                Err(Denied::Closed) => return PullEnd::Closed,
                Err(Denied::OutOfBounds) => {
                    return PullEnd::Failed("lease larger than the destination".into())
                }
            }
        }
        i += 1;
    }
    if let Err(e) = peer.confirm() {
        return failed(e);
    }
    if region.seal_if_open(|| shared.seal()) {
        PullEnd::Done
    } else {
        PullEnd::Closed
    }
}

/// Takes a `Lease` for a request that waits for one (its `cma` is `want`):
/// the segments must match the request's descriptors one for one; the
/// request then copies (`Pulling`).
fn take_lease(cma: &mut Cma, want: Cma, l: &Lease, region: &Region) -> Result<(), ConnError> {
    if *cma != want {
        return Err(ConnError::Violation("unexpected lease".into()));
    }
    let sizes_match = l.segments.len() == region.sizes().count()
        && l.segments.iter().map(|s| s.1).eq(region.sizes());
    if !sizes_match {
        return Err(ConnError::Violation(
            "the lease does not match the descriptors".into(),
        ));
    }
    *cma = Cma::Pulling;
    Ok(())
}

/// One connection to a remote connector, in either direction.
pub(crate) struct Conn {
    peer: String,
    writer: Arc<tokio::sync::Mutex<ConnWriter>>,
    dead: watch::Sender<Option<String>>,
    active: Mutex<HashMap<u64, ActiveReq>>,
    passive: Mutex<HashMap<u64, PassiveReq>>,
    next_req: AtomicU64,
    queued: AtomicUsize,
    handle: Handle,
    /// The peer's process (its pid, and the program it runs), once this
    /// process has proven it can copy from it.
    peer_pid: OnceLock<Arc<cma::Peer>>,
    /// The peer has proven it can copy from this process.
    peer_pulls: AtomicBool,
    /// The passive side's progress through the four `Attach` frames, and
    /// the cookie this side keeps in memory for the peer to read.
    attach: Mutex<Attaching>,
    /// `(active, passive)` socket addresses of this connection.
    tuple: OnceLock<(SocketAddr, SocketAddr)>,
    /// This side's cookie, kept at a fixed address for the peer to read
    /// while the connection lives.
    cookie: Mutex<Option<Box<[u8; 16]>>>,
    /// Source memory lent to the peer, by request.
    leases: Mutex<HashMap<u64, Arc<Region>>>,
    /// Bounds this connection's copies from the peer (see `stall.rs`).
    copy_slots: Arc<CopySlots>,
    /// What to do once the reader has ended (`None` inside: it has).
    on_close: Mutex<Option<Vec<CloseHook>>>,
    /// An accepted connection's place (see `admission.rs`).
    ticket: OnceLock<Ticket>,
    /// When a frame last arrived or an operation last began, in
    /// milliseconds since `clock::epoch()`.
    last_active: AtomicU64,
}

type CloseHook = Box<dyn FnOnce() + Send>;

impl Conn {
    fn new(peer: String, writer: ConnWriter, handle: Handle) -> Arc<Self> {
        Arc::new(Conn {
            peer,
            writer: Arc::new(tokio::sync::Mutex::new(writer)),
            dead: watch::Sender::new(None),
            active: Mutex::new(HashMap::new()),
            passive: Mutex::new(HashMap::new()),
            next_req: AtomicU64::new(1),
            queued: AtomicUsize::new(0),
            handle,
            peer_pid: OnceLock::new(),
            peer_pulls: AtomicBool::new(false),
            attach: Mutex::new(Attaching::Idle),
            tuple: OnceLock::new(),
            cookie: Mutex::new(None),
            leases: Mutex::new(HashMap::new()),
            copy_slots: Arc::new(CopySlots::new()),
            on_close: Mutex::new(Some(Vec::new())),
            ticket: OnceLock::new(),
            last_active: AtomicU64::new(now_ms()),
        })
    }

    /// Every byte of the part that request `req` carries has been sent.
    fn part_sent(&self, req: u64) {
        if let Some(r) = lock(&self.active).get_mut(&req) {
            r.part.iter_mut().for_each(|p| p.sent = true);
            return;
        }
        if let Some(r) = lock(&self.passive).get_mut(&req) {
            r.part.iter_mut().for_each(|p| p.sent = true);
        }
    }

    /// The worker at the other end.
    pub(crate) fn peer(&self) -> &str {
        &self.peer
    }

    /// Lends `region` to the peer for request `req`.
    fn lend(&self, req: u64, region: &Arc<Region>) {
        region.lend();
        lock(&self.leases).insert(req, region.clone());
        // The reader drains the leases after marking the connection dead.
        if !self.is_alive() {
            self.give_back(req);
        }
    }

    /// The peer no longer copies from the memory of request `req`.
    fn give_back(&self, req: u64) {
        let r = lock(&self.leases).remove(&req);
        if let Some(r) = r {
            r.give_back();
        }
    }

    /// Copies lease `l` into the request's region and shared state, or, if
    /// the request has ended here meanwhile, tells the source at once (it
    /// must not wait for a copy that never starts).
    fn pull_or_release(self: &Arc<Self>, l: Lease, job: Option<(Arc<Region>, Arc<OpShared>)>) {
        match job {
            Some((region, shared)) => self.spawn_pull(l.req, region, shared, l.segments),
            None => self.release(l.req),
        }
    }

    /// Tells the source of request `req` that this side stopped copying
    /// (a reply: bounded like every frame the peer provokes).
    fn release(self: &Arc<Self>, req: u64) {
        self.send_detached(Message::Release { req });
    }

    /// Copies a lease into `region` from a blocking thread (never the
    /// reader task: the peer's pages may fault slowly, or never arrive),
    /// once a copy slot is free (see `stall.rs`), then tells the
    /// source that every byte is copied (`Finish`). A closed region ends it silently:
    /// whoever closed it tells the peer. A failed copy means the peer died
    /// (its memory went away) or lent memory it does not have: either way
    /// the connection is closed, which fails every operation on it, on both
    /// sides, with [`Error::ConnectionLost`] and the cause.
    fn spawn_pull(
        self: &Arc<Self>,
        req: u64,
        region: Arc<Region>,
        shared: Arc<OpShared>,
        segs: Vec<(u64, u64)>,
    ) {
        let Some(peer) = self.peer_pid.get().cloned() else {
            return self.kill("the peer lent memory to a process that cannot attach to it".into());
        };
        let shared_ended = shared.clone();
        // The copy thread answers the peer itself (no hop back to the
        // runtime) and holds the connection only weakly: a copy that the
        // peer stalls must not keep its socket alive.
        let conn = Arc::downgrade(self);
        let copy = move |slot: CopySlot| {
            let end = pull_all(&peer, &region, &shared, &segs);
            drop(slot);
            let Some(conn) = conn.upgrade() else {
                return;
            };
            match end {
                PullEnd::Done => conn.send_soon(Message::Finish { req }.to_vec(), None, false),
                PullEnd::Closed => {}
                PullEnd::Failed(why) => conn.kill(why),
            }
        };
        if let Some(slot) = self.copy_slots.try_acquire() {
            return stall::run(move || copy(slot));
        }
        let (slots, ended) = (self.copy_slots.clone(), shared_ended);
        self.handle.spawn(async move {
            let slot = tokio::select! {
                slot = slots.acquire() => slot,
                // Ended while waiting: whoever ended it tells the peer.
                _ = ended.ended() => return,
            };
            stall::run(move || copy(slot));
        });
    }

    fn is_alive(&self) -> bool {
        self.dead.borrow().is_none()
    }

    /// Something happened on the connection: it is not idle.
    fn touch(&self) {
        self.last_active.store(now_ms(), Ordering::Relaxed);
    }

    /// How long nothing has happened, if no operation is in progress on it
    /// (`None` if one is).
    fn idle_for(&self) -> Option<Duration> {
        let busy = !lock(&self.active).is_empty()
            || !lock(&self.passive).is_empty()
            || !lock(&self.leases).is_empty();
        (!busy).then(|| {
            Duration::from_millis(now_ms().saturating_sub(self.last_active.load(Ordering::Relaxed)))
        })
    }

    /// The connection presented a valid capability (an accepted one is
    /// then never closed to make room).
    fn prove(&self) {
        if let Some(t) = self.ticket.get() {
            t.prove();
        }
    }

    /// Runs `f` once the connection's reader has ended (at once if it has).
    fn when_closed(&self, f: CloseHook) {
        let mut hooks = lock(&self.on_close);
        match hooks.as_mut() {
            Some(v) => v.push(f),
            None => {
                drop(hooks);
                f();
            }
        }
    }

    /// The reader has ended: runs what waited for it.
    fn closed(&self) {
        let hooks = lock(&self.on_close).take().unwrap_or_default();
        for f in hooks {
            f();
        }
    }

    fn kill(&self, cause: String) {
        self.dead.send_if_modified(|d| {
            if d.is_none() {
                *d = Some(cause);
                true
            } else {
                false
            }
        });
    }

    /// Runs a write unless, or until, the connection dies: a write blocked
    /// on a peer that stopped reading is abandoned once the connection is
    /// declared dead (the connection is unusable afterwards anyway).
    async fn unless_dead<T>(
        &self,
        f: impl std::future::Future<Output = io::Result<T>>,
    ) -> io::Result<T> {
        let mut dead = self.dead.subscribe();
        tokio::select! {
            r = f => r,
            _ = until(&mut dead, |d| d.is_some()) => Err(io::Error::other("connection closed")),
        }
    }

    async fn send_frame(&self, frame: &[u8]) -> io::Result<()> {
        self.unless_dead(async {
            let mut w = self.writer.lock().await;
            w.write_all(frame).await
        })
        .await
    }

    /// Sends a frame at once if the socket is free and has room for all of
    /// it (no task switch: this is the small-operation fast path); otherwise
    /// hands it to a task of its own. Never blocks and never leaves half a
    /// frame behind: a partial write is finished by a task that keeps the
    /// write lock.
    fn send_soon(
        self: &Arc<Self>,
        frame: Vec<u8>,
        opened: Option<Arc<watch::Sender<bool>>>,
        reply: bool,
    ) {
        if !self.is_alive() {
            // A write may have been abandoned mid-frame: nothing may follow.
            return mark_opened(&opened);
        }
        if let Ok(mut guard) = self.writer.clone().try_lock_owned() {
            match guard.try_write(&frame) {
                Ok(n) if n == frame.len() && guard.flushed() => return mark_opened(&opened),
                Ok(n) => {
                    let conn = self.clone();
                    self.handle.spawn(async move {
                        let mut guard = guard;
                        let r = conn.unless_dead(guard.write_all(&frame[n..])).await;
                        mark_opened(&opened);
                        if let Err(e) = r {
                            conn.kill(format!("write failed: {e}"));
                        }
                    });
                    return;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => {
                    mark_opened(&opened);
                    return self.kill(format!("write failed: {e}"));
                }
            }
        }
        // Only replies the peer provokes count against it; our own frames
        // simply wait for their turn.
        if reply && self.queued.fetch_add(1, Ordering::Relaxed) >= MAX_QUEUED {
            self.queued.fetch_sub(1, Ordering::Relaxed);
            mark_opened(&opened);
            self.kill("the peer does not read its replies".into());
            return;
        }
        let conn = self.clone();
        self.handle.spawn(async move {
            let r = conn.send_frame(&frame).await;
            if reply {
                conn.queued.fetch_sub(1, Ordering::Relaxed);
            }
            mark_opened(&opened);
            if let Err(e) = r {
                conn.kill(format!("write failed: {e}"));
            }
        });
    }

    /// Sends a control frame soon (see [`send_soon`](Self::send_soon)). A peer
    /// that makes us queue more than [`MAX_QUEUED`] frames without reading is
    /// cut off.
    pub(crate) fn send_detached(self: &Arc<Self>, msg: Message) {
        self.send_soon(msg.to_vec(), None, true);
    }

    /// Writes the last frame of a transfer (its `Finish`, or a whole small
    /// transfer), sealing the operation under the region's lock at the
    /// moment its first byte enters the socket: a cancel either comes first
    /// (nothing of the frame is sent: `Ok(false)`) or finds the operation
    /// sealed, so the two sides cannot disagree; and while the socket is
    /// full, the operation is not sealed, so a cancel still ends it.
    async fn write_final(
        &self,
        w: &mut ConnWriter,
        region: &Region,
        shared: &OpShared,
        frame: &[u8],
    ) -> io::Result<bool> {
        loop {
            w.writable().await?;
            let Some(r) = try_write_sealed(w, region, shared, frame) else {
                return Ok(false);
            };
            match r {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => {
                    w.write_all(&frame[n..]).await?;
                    return Ok(true);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
        }
    }

    fn abort_detached(self: &Arc<Self>, req: u64, reason: AbortReason, detail: String) {
        self.send_detached(Message::Abort(Abort {
            req,
            reason,
            detail,
        }));
    }

    /// Sends one `Data` frame with its payload taken from the region. If the
    /// region closes meanwhile, the rest of the payload is zeros (the frame
    /// must be completed) and `Ok(false)` is returned.
    async fn send_chunk(
        &self,
        req: u64,
        region: &Region,
        desc: u32,
        offset: u64,
        len: u32,
    ) -> io::Result<bool> {
        self.unless_dead(self.send_chunk_inner(req, region, desc, offset, len))
            .await
    }

    async fn send_chunk_inner(
        &self,
        req: u64,
        region: &Region,
        desc: u32,
        offset: u64,
        len: u32,
    ) -> io::Result<bool> {
        let header = Message::Data(Data {
            req,
            desc,
            offset,
            len,
        })
        .to_vec();
        let mut w = self.writer.lock().await;
        w.send_data(&header, region, desc, offset, len).await
    }

    /// Sends `prefix`, then the bytes of the region under `cursor` as `Data`
    /// frames, then `Finish` as `last` says. Returns `Ok(false)` if the
    /// region closed on the way (the remote is then told with an `Abort`).
    #[allow(clippy::too_many_arguments)]
    async fn stream(
        self: &Arc<Self>,
        req: u64,
        region: &Region,
        cursor: Cursor,
        prefix: Vec<u8>,
        opened: Option<&watch::Sender<bool>>,
        shared: &OpShared,
        last: Last,
    ) -> io::Result<bool> {
        let r = self
            .stream_inner(req, region, cursor, &prefix, opened, shared, last)
            .await;
        if let Some(o) = opened {
            o.send_replace(true);
        }
        r
    }

    #[allow(clippy::too_many_arguments)]
    async fn stream_inner(
        self: &Arc<Self>,
        req: u64,
        region: &Region,
        mut cursor: Cursor,
        prefix: &[u8],
        opened: Option<&watch::Sender<bool>>,
        shared: &OpShared,
        last: Last,
    ) -> io::Result<bool> {
        let striped = !matches!(last, Last::Seal);
        let closed = |conn: &Arc<Conn>| {
            // A striped operation's remote is told by whoever ended it,
            // with how it ended (the region closes for a failed part too).
            if !striped {
                conn.abort_detached(req, AbortReason::Cancelled, String::new());
            }
            Ok(false)
        };
        if !prefix.is_empty() {
            self.send_frame(prefix).await?;
        }
        if let Some(o) = opened {
            o.send_replace(true);
        }
        while let Some((d, o, l)) = cursor.next_chunk(CHUNK) {
            if !self.send_chunk(req, region, d, o, l).await? {
                return closed(self);
            }
            let _ = cursor.accept(d, o, l);
        }
        let fin = Message::Finish { req }.to_vec();
        match last {
            Last::Seal => {}
            Last::Part => {
                // Not the commit: the destination confirms it, and part 0's
                // sealing `Finish` waits for that.
                self.part_sent(req);
                self.send_frame(&fin).await?;
                return Ok(true);
            }
            Last::SealAfter(stripe) => {
                let mut done = stripe.done.subscribe();
                let confirmed = self
                    .unless_dead(async {
                        tokio::select! {
                            _ = until(&mut done, |n| *n + 1 >= stripe.parts) => Ok(true),
                            // Ended meanwhile (a cancel, another part
                            // failed): whoever ended it told the remote.
                            _ = shared.ended() => Ok(false),
                        }
                    })
                    .await?;
                if !confirmed {
                    return Ok(false);
                }
            }
        }
        let sent = self
            .unless_dead(async {
                let mut w = self.writer.lock().await;
                self.write_final(&mut w, region, shared, &fin).await
            })
            .await?;
        if !sent {
            return closed(self);
        }
        Ok(true)
    }

    /// Appends a whole small transfer (data frames and `Finish`) to `out`;
    /// `false` if the region is closed.
    fn small_frames(req: u64, region: &Region, sizes: Vec<u64>, out: &mut Vec<u8>) -> bool {
        let total: u64 = sizes.iter().sum();
        out.reserve(total as usize + 64);
        let mut cursor = Cursor::new(sizes);
        while let Some((d, o, l)) = cursor.next_chunk(u32::MAX) {
            Message::Data(Data {
                req,
                desc: d,
                offset: o,
                len: l,
            })
            .encode(out);
            if region
                .read_at(d as usize, o, l as usize, |s| out.extend_from_slice(s))
                .is_err()
            {
                return false;
            }
            let _ = cursor.accept(d, o, l);
        }
        Message::Finish { req }.encode(out);
        true
    }

    /// Streams the region: a small transfer goes out at once as one write,
    /// a larger one from a task of its own. A write failure kills the
    /// connection.
    fn spawn_stream(
        self: &Arc<Self>,
        req: u64,
        region: Arc<Region>,
        sizes: Vec<u64>,
        prefix: Vec<u8>,
        opened: Option<Arc<watch::Sender<bool>>>,
        shared: Arc<OpShared>,
    ) {
        if sizes.iter().sum::<u64>() <= SMALL {
            // Cancelled before a byte went out: still send the `Open` (if
            // this is a write) followed by the `Abort`, so that the remote
            // learns of the cancel as it would mid-transfer.
            let mut cancelled = prefix.clone();
            Message::Abort(Abort {
                req,
                reason: AbortReason::Cancelled,
                detail: String::new(),
            })
            .encode(&mut cancelled);
            let mut frame = prefix;
            let aborted = move |conn: &Arc<Conn>, opened: &Option<Arc<watch::Sender<bool>>>| {
                conn.send_soon(cancelled, opened.clone(), false);
            };
            if !Self::small_frames(req, &region, sizes, &mut frame) {
                return aborted(self, &opened);
            }
            // Fast path: the whole transfer in one system call, now.
            if let Ok(mut guard) = self.writer.clone().try_lock_owned() {
                let Some(r) = try_write_sealed(&mut guard, &region, &shared, &frame) else {
                    return aborted(self, &opened);
                };
                match r {
                    Ok(n) if n == frame.len() && guard.flushed() => return mark_opened(&opened),
                    Ok(n) if n > 0 => {
                        let conn = self.clone();
                        self.handle.spawn(async move {
                            let r = conn.unless_dead(guard.write_all(&frame[n..])).await;
                            mark_opened(&opened);
                            if let Err(e) = r {
                                conn.kill(format!("write failed: {e}"));
                            }
                        });
                        return;
                    }
                    Ok(_) => {}
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    Err(e) => {
                        mark_opened(&opened);
                        return self.kill(format!("write failed: {e}"));
                    }
                }
            }
            let conn = self.clone();
            self.handle.spawn(async move {
                let r = conn
                    .unless_dead(async {
                        let mut w = conn.writer.lock().await;
                        conn.write_final(&mut w, &region, &shared, &frame).await
                    })
                    .await;
                match r {
                    Ok(true) => mark_opened(&opened),
                    Ok(false) => aborted(&conn, &opened),
                    Err(e) => {
                        mark_opened(&opened);
                        conn.kill(format!("write failed: {e}"));
                    }
                }
            });
            return;
        }
        self.spawn_part(
            req,
            region,
            Cursor::new(sizes),
            prefix,
            opened,
            shared,
            Last::Seal,
        );
    }

    /// Streams the bytes under `cursor` from a task of its own, ending as
    /// `last` says. A write failure kills the connection.
    #[allow(clippy::too_many_arguments)]
    fn spawn_part(
        self: &Arc<Self>,
        req: u64,
        region: Arc<Region>,
        cursor: Cursor,
        prefix: Vec<u8>,
        opened: Option<Arc<watch::Sender<bool>>>,
        shared: Arc<OpShared>,
        last: Last,
    ) {
        let conn = self.clone();
        self.handle.spawn(async move {
            let r = conn
                .stream(
                    req,
                    &region,
                    cursor,
                    prefix,
                    opened.as_deref(),
                    &shared,
                    last,
                )
                .await;
            if let Err(e) = r {
                conn.kill(format!("write failed: {e}"));
            }
        });
    }

    /// Requests in flight on this connection, in both roles.
    pub(crate) fn pending(&self) -> usize {
        lock(&self.active).len() + lock(&self.passive).len() + lock(&self.leases).len()
    }

    pub(crate) fn close(&self, cause: &str) {
        self.kill(cause.to_string());
    }

    pub(crate) fn forget_passive(&self, req: u64) {
        lock(&self.passive).remove(&req);
    }
}

/// The active side's handle on a request.
struct TcpLink {
    conn: Arc<Conn>,
    req: u64,
    /// Set once the `Open` is on the wire: an `Abort` must not overtake it.
    opened: Arc<watch::Sender<bool>>,
    /// The transfer is striped: these are all its requests.
    stripe: Option<Arc<Stripe>>,
}

impl ActiveLink for TcpLink {
    fn cancel(&self, changed: bool) {
        if let Some(s) = &self.stripe {
            // The watcher tells the remote how the operation really ended
            // (this cancel may have lost to a failure).
            s.abandon(None);
            return;
        }
        lock(&self.conn.active).remove(&self.req);
        if changed {
            let conn = self.conn.clone();
            let req = self.req;
            let mut opened = self.opened.subscribe();
            self.conn.handle.spawn(async move {
                until(&mut opened, |o| *o).await;
                conn.abort_detached(req, AbortReason::Cancelled, String::new());
            });
        }
    }
}

pub(crate) struct LocalInfo {
    pub(crate) worker_id: String,
    pub(crate) host_id: String,
    pub(crate) connect_timeout: Duration,
    pub(crate) secret: Option<Secret>,
    pub(crate) cma: bool,
    pub(crate) cma_threshold: u64,
    /// Streams per large transfer; `None`: by host (see `ConnectorBuilder::tcp_streams`).
    pub(crate) tcp_streams: Option<usize>,
    pub(crate) stripe_threshold: u64,
    /// Connections with no operation in progress for this long are closed.
    pub(crate) idle_timeout: Duration,
    /// Accepted connections kept at most (see `admission.rs`).
    pub(crate) max_connections: usize,
    pub(crate) shutdown: watch::Receiver<bool>,
    pub(crate) handle: Handle,
}

type Slot = Arc<tokio::sync::Mutex<Option<Arc<Conn>>>>;
/// A remote worker, its addresses, and the stream's number.
type PoolKey = (String, Vec<SocketAddr>, u16);

pub(crate) struct TcpTransport {
    local: Arc<LocalInfo>,
    /// By remote worker, its addresses and the stream's number (0 carries
    /// everything that is not a further part of a striped transfer). A slot
    /// leaves when its connection ends or cannot be made, so that peers
    /// that come and go leave nothing behind (no socket, no entry).
    pool: Arc<Mutex<HashMap<PoolKey, Slot>>>,
    /// Every outgoing connection, also those whose slot is busy connecting
    /// a replacement, for `close_all` and `pending`.
    outgoing: Mutex<Vec<Weak<Conn>>>,
    /// The accepted connections and their bounds.
    pub(crate) admission: Admission,
}

fn tune(s: &TcpStream) {
    let _ = s.set_nodelay(true);
    let sock = socket2::SockRef::from(s);
    let ka = socket2::TcpKeepalive::new()
        .with_time(Duration::from_secs(5))
        .with_interval(Duration::from_secs(1))
        .with_retries(5);
    let _ = sock.set_tcp_keepalive(&ka);
}

impl TcpTransport {
    pub(crate) fn new(local: Arc<LocalInfo>) -> Self {
        TcpTransport {
            admission: Admission::new(local.max_connections),
            local,
            pool: Arc::new(Mutex::new(HashMap::new())),
            outgoing: Mutex::new(Vec::new()),
        }
    }

    /// Closes every pooled connection; the next operation reconnects.
    pub(crate) fn close_all(&self, cause: &str) {
        lock(&self.pool).clear();
        let all = std::mem::take(&mut *lock(&self.outgoing));
        for c in all.iter().filter_map(Weak::upgrade) {
            c.kill(cause.to_string());
        }
    }

    /// Requests in flight on pooled (outgoing) connections.
    pub(crate) fn pending(&self) -> usize {
        let all: Vec<_> = lock(&self.outgoing)
            .iter()
            .filter_map(Weak::upgrade)
            .collect();
        all.iter().map(|c| c.pending()).sum()
    }

    /// How many pool entries there are: connections alive or being made
    /// (a connection that ended leaves once its reader has stopped).
    pub(crate) fn connection_count(&self) -> usize {
        lock(&self.pool).len()
    }

    async fn conn_for(&self, remote: &RdmaMetadata, stream: u16) -> Result<Arc<Conn>> {
        let key = (
            remote.worker_id().to_string(),
            remote.addresses().to_vec(),
            stream,
        );
        let slot = lock(&self.pool).entry(key.clone()).or_default().clone();
        let mut g = slot.lock().await;
        if let Some(c) = g.as_ref() {
            // One idle for more than half the idle timeout may be closed by
            // the remote at any moment (both sides use the same timeout by
            // default): a request must not race that close.
            let stale = c
                .idle_for()
                .is_some_and(|d| d >= self.local.idle_timeout / 2);
            if c.is_alive() && !stale {
                c.touch();
                let c = c.clone();
                drop(g);
                // It may have died while its slot was held here, when its
                // close hook could not take the slot.
                if !c.is_alive() {
                    forget_slot(&self.pool, &key, &slot);
                }
                return Ok(c);
            }
            if stale {
                c.kill("idle; replaced by a new connection".into());
            }
        }
        *g = None;
        let c = match self.connect(remote, stream == 0).await {
            Ok(c) => c,
            Err(e) => {
                drop(g);
                forget_slot(&self.pool, &key, &slot);
                return Err(e);
            }
        };
        {
            let mut all = lock(&self.outgoing);
            all.retain(|w| w.strong_count() > 0);
            all.push(Arc::downgrade(&c));
        }
        *g = Some(c.clone());
        drop(g);
        let (pool, slot) = (Arc::downgrade(&self.pool), Arc::downgrade(&slot));
        c.when_closed(Box::new(move || {
            if let (Some(pool), Some(slot)) = (pool.upgrade(), slot.upgrade()) {
                forget_slot(&pool, &key, &slot);
            }
        }));
        Ok(c)
    }

    /// Connects to `remote`; `attach`: also set up cross-memory attach when
    /// it is on this host.
    async fn connect(&self, remote: &RdmaMetadata, attach: bool) -> Result<Arc<Conn>> {
        let mut addrs = remote.addresses().to_vec();
        if remote.host_id() == self.local.host_id {
            addrs.sort_by_key(|a| !a.ip().is_loopback());
        } else if addrs.iter().any(|a| !a.ip().is_loopback()) {
            addrs.retain(|a| !a.ip().is_loopback());
        }
        let mut cause = String::from("no address");
        for a in &addrs {
            match tokio::time::timeout(self.local.connect_timeout, TcpStream::connect(a)).await {
                Ok(Ok(s)) => return self.handshake(s, *a, remote, attach).await,
                Ok(Err(e)) => cause = format!("{a}: {e}"),
                Err(_) => {
                    cause = format!(
                        "{a}: connect timed out after {:?}",
                        self.local.connect_timeout
                    )
                }
            }
        }
        Err(Error::Unreachable {
            worker: remote.worker_id().to_string(),
            addresses: addrs
                .iter()
                .map(|a| a.to_string())
                .collect::<Vec<_>>()
                .join(", "),
            cause,
        })
    }

    async fn handshake(
        &self,
        s: TcpStream,
        addr: SocketAddr,
        remote: &RdmaMetadata,
        attach: bool,
    ) -> Result<Arc<Conn>> {
        tune(&s);
        let (local_addr, peer_addr) = (s.local_addr(), s.peer_addr());
        let (r, w) = s.into_split();
        let mut w = ConnWriter::new(w);
        let unreachable = |cause: String| Error::Unreachable {
            worker: remote.worker_id().to_string(),
            addresses: addr.to_string(),
            cause,
        };
        let hello = Message::Hello(Hello {
            version: wire::PROTOCOL_VERSION,
            worker_id: self.local.worker_id.clone(),
        })
        .to_vec();
        let mut first = hello.clone();
        let noise = match &self.local.secret {
            Some(secret) => {
                let (hs, m) =
                    secure::Initiator::start(secret, &hello).map_err(|detail| Error::Protocol {
                        peer: addr.to_string(),
                        detail,
                    })?;
                Message::Auth(Auth { handshake: m }).encode(&mut first);
                Some(hs)
            }
            None => None,
        };
        w.write_all(&first)
            .await
            .map_err(|e| unreachable(e.to_string()))?;
        let mut rd = FrameReader::new(r);
        let answer = match tokio::time::timeout(HANDSHAKE_TIMEOUT, rd.next()).await {
            Err(_) => return Err(unreachable("no hello from the remote".into())),
            Ok(Err(e)) => return Err(e.into_error(&addr.to_string())),
            Ok(Ok(m)) => m,
        };
        let peer = match answer {
            Message::Hello(h) if h.version == wire::PROTOCOL_VERSION => h.worker_id,
            Message::Hello(h) => {
                return Err(Error::Protocol {
                    peer: addr.to_string(),
                    detail: format!(
                        "protocol version {} (this build speaks {})",
                        h.version,
                        wire::PROTOCOL_VERSION
                    ),
                })
            }
            _ => {
                return Err(Error::Protocol {
                    peer: addr.to_string(),
                    detail: "expected hello".into(),
                })
            }
        };
        if peer != remote.worker_id() {
            return Err(Error::WrongWorker {
                address: addr.to_string(),
                expected: remote.worker_id().to_string(),
                found: peer,
            });
        }
        if let Some(noise) = noise {
            let unauthenticated = |detail: &str| Error::Unauthenticated {
                peer: peer.clone(),
                detail: detail.to_string(),
            };
            let theirs = match tokio::time::timeout(HANDSHAKE_TIMEOUT, rd.next()).await {
                Ok(Ok(Message::Auth(a))) => a,
                Ok(Ok(Message::Abort(a))) if a.reason == AbortReason::Unauthenticated => {
                    return Err(unauthenticated(&a.detail))
                }
                Ok(Err(_)) | Err(_) => {
                    return Err(unauthenticated(
                        "the remote closed the connection or went silent during authentication",
                    ))
                }
                Ok(Ok(_)) => return Err(unauthenticated("the remote did not authenticate")),
            };
            // The hello as received (decoding is exact, so it re-encodes
            // to the same bytes).
            let theirs_hello = Message::Hello(Hello {
                version: wire::PROTOCOL_VERSION,
                worker_id: peer.clone(),
            })
            .to_vec();
            let (tx, rx) = noise
                .finish(&theirs.handshake, &theirs_hello)
                .map_err(unauthenticated)?
                .split();
            rd.secure(rx);
            w.secure(tx);
        }
        let (mut peer_pid, mut peer_pulls, mut my_cookie) = (None, false, None);
        let tuple = match (local_addr, peer_addr) {
            (Ok(l), Ok(p)) => Some((l, p)),
            _ => None,
        };
        if let Some((me, them)) = tuple.filter(|&(l, p)| {
            attach
                && self.local.cma
                && remote.host_id() == self.local.host_id
                && cma::is_local(l, p)
        }) {
            let next = async |rd: &mut FrameReader| -> Result<Attach> {
                match tokio::time::timeout(HANDSHAKE_TIMEOUT, rd.next()).await {
                    Ok(Ok(Message::Attach(a))) => Ok(a),
                    // A passive side with a secret refuses a peer without one
                    // at its first frame after the hello.
                    Ok(Ok(Message::Abort(a))) if a.reason == AbortReason::Unauthenticated => {
                        Err(Error::Unauthenticated {
                            peer: peer.clone(),
                            detail: a.detail,
                        })
                    }
                    Ok(Ok(_)) => Err(Error::Protocol {
                        peer: addr.to_string(),
                        detail: "expected an attach frame".into(),
                    }),
                    Ok(Err(e)) => Err(e.into_error(&addr.to_string())),
                    Err(_) => Err(unreachable("no answer to attach".into())),
                }
            };
            // 1. Our nonce.
            let na = host::random_bytes();
            let hello = Message::Attach(Attach {
                pid: cma::pid(),
                addr: 0,
                cookie: na,
                verdict: Verdict::Unknown,
            });
            w.write_all(&hello.to_vec())
                .await
                .map_err(|e| unreachable(e.to_string()))?;
            // 2. Theirs, and where their cookie lies (pid 0: declined).
            let theirs = next(&mut rd).await?;
            let np = theirs.cookie;
            let cookie = Box::new(cma::cookie(cma::Side::Active, &na, &np, me, them));
            // The passive end of this connection is `them` -> `me`.
            let verified = verify_peer(theirs.pid, theirs.addr, them, me, move || {
                cma::cookie(cma::Side::Passive, &na, &np, me, them)
            })
            .await;
            let ok = verified.is_some();
            // 3. Our verdict, and where our cookie lies.
            let answer = Message::Attach(Attach {
                pid: cma::pid(),
                addr: cookie.as_ptr() as u64,
                cookie: [0; 16],
                verdict: if ok {
                    Verdict::CanPull
                } else {
                    Verdict::Refused
                },
            });
            w.write_all(&answer.to_vec())
                .await
                .map_err(|e| unreachable(e.to_string()))?;
            // 4. Their verdict on us.
            peer_pulls = next(&mut rd).await?.verdict == Verdict::CanPull;
            peer_pid = verified;
            my_cookie = Some(cookie);
            tracing::debug!(
                peer,
                pull_from_peer = ok,
                peer_pulls,
                "cross-memory attach probed"
            );
        }
        let conn = Conn::new(peer, w, self.local.handle.clone());
        if let Some(p) = peer_pid {
            let _ = conn.peer_pid.set(p);
        }
        conn.peer_pulls.store(peer_pulls, Ordering::Release);
        *lock(&conn.cookie) = my_cookie;
        *lock(&conn.attach) = Attaching::Done;
        if let Some(t) = tuple {
            let _ = conn.tuple.set(t);
        }
        self.local.handle.spawn(run_connection(
            conn.clone(),
            rd,
            self.local.shutdown.clone(),
            None,
            self.local.idle_timeout,
        ));
        Ok(conn)
    }
}

impl Transport for TcpTransport {
    fn kind(&self) -> TransportKind {
        TransportKind::Tcp
    }

    fn reaches(&self, _remote: &RdmaMetadata) -> bool {
        true
    }

    fn start(&self, job: ActiveJob) -> BoxFuture<'_, Result<Arc<dyn ActiveLink>>> {
        Box::pin(async move {
            let conn = self.conn_for(&job.remote, 0).await?;
            let total: u64 = job.sizes.iter().sum();
            let pull = self.local.cma
                && total >= self.local.cma_threshold
                && job.sizes.len() <= MAX_LEASE_SEGMENTS
                && match job.kind {
                    OperationKind::Read => conn.peer_pid.get().is_some(),
                    OperationKind::Write => conn.peer_pulls.load(Ordering::Acquire),
                };
            if !pull {
                let parts = self.parts_for(&job.remote, total);
                let mut conns = vec![conn.clone()];
                for i in 1..parts {
                    match self.conn_for(&job.remote, i).await {
                        Ok(c) => conns.push(c),
                        // Fewer streams, then.
                        Err(e) => {
                            tracing::debug!(stream = i, "no further stream: {e}");
                            break;
                        }
                    }
                }
                if conns.len() > 1 {
                    return self.start_striped(job, conns);
                }
            }
            let req = conn.next_req.fetch_add(1, Ordering::Relaxed);
            let cma = match (pull, job.kind) {
                (false, _) => Cma::No,
                (true, OperationKind::Read) => Cma::Requested,
                (true, OperationKind::Write) => Cma::Lent,
            };
            match cma {
                Cma::No => job.shared.set_transport(TransportKind::Tcp),
                Cma::Lent => job.shared.set_transport(TransportKind::Cma),
                // Known once the remote answers with a lease or with data.
                _ => {}
            }
            job.shared.start();
            lock(&conn.active).insert(
                req,
                ActiveReq {
                    kind: job.kind,
                    region: job.region.clone(),
                    shared: job.shared.clone(),
                    cursor: Cursor::new(job.sizes.clone()),
                    cma,
                    part: None,
                },
            );
            // The reader task drains the table after marking the connection
            // dead; check after inserting so that no request is left behind.
            if !conn.is_alive() {
                lock(&conn.active).remove(&req);
                let cause = conn.dead.borrow().clone().unwrap_or_default();
                return Err(Error::ConnectionLost {
                    peer: conn.peer.clone(),
                    cause,
                });
            }
            let open = Message::Open(Open {
                req,
                op_id: job.remote.operation_id(),
                token: *job.remote.token(),
                kind: job.kind,
                sizes: job.sizes.clone(),
                pull,
                part: 0,
                parts: 1,
            })
            .to_vec();
            let opened = Arc::new(watch::Sender::new(false));
            match (job.kind, pull) {
                (OperationKind::Read, _) => conn.send_soon(open, Some(opened.clone()), false),
                (OperationKind::Write, true) => {
                    let mut frames = open;
                    Message::Lease(Lease {
                        req,
                        segments: job.region.segments(),
                    })
                    .encode(&mut frames);
                    conn.lend(req, &job.region);
                    conn.send_soon(frames, Some(opened.clone()), false);
                }
                (OperationKind::Write, false) => conn.spawn_stream(
                    req,
                    job.region,
                    job.sizes,
                    open,
                    Some(opened.clone()),
                    job.shared.clone(),
                ),
            }
            Ok(Arc::new(TcpLink {
                conn,
                req,
                opened,
                stripe: None,
            }) as Arc<dyn ActiveLink>)
        })
    }
}

impl TcpTransport {
    /// Into how many parts a TCP transfer of `total` bytes to `remote` is
    /// split (see `ConnectorBuilder::tcp_streams`).
    fn parts_for(&self, remote: &RdmaMetadata, total: u64) -> u16 {
        let streams = self
            .local
            .tcp_streams
            .unwrap_or(if remote.host_id() == self.local.host_id {
                1
            } else {
                crate::builder::DEFAULT_TCP_STREAMS
            });
        if streams <= 1 || total < self.local.stripe_threshold {
            return 1;
        }
        (streams as u64).min(u64::from(MAX_PARTS)).min(total) as u16
    }

    /// Starts a transfer striped over `conns`, one part on each; part 0 (on
    /// the first) commits it once the destination has confirmed the others.
    fn start_striped(&self, job: ActiveJob, conns: Vec<Arc<Conn>>) -> Result<Arc<dyn ActiveLink>> {
        let parts = conns.len() as u16;
        let total: u64 = job.sizes.iter().sum();
        let stripe = Stripe::new(parts, String::new());
        job.shared.set_transport(TransportKind::Tcp);
        job.shared.start();
        let mut reqs = Vec::with_capacity(conns.len());
        for (part, conn) in (0..parts).zip(&conns) {
            let req = conn.next_req.fetch_add(1, Ordering::Relaxed);
            let (start, end) = part_range(total, part, parts);
            let opened = Arc::new(watch::Sender::new(false));
            stripe.bind(part, Arc::downgrade(conn), req, Some(opened.clone()));
            lock(&conn.active).insert(
                req,
                ActiveReq {
                    kind: job.kind,
                    region: job.region.clone(),
                    shared: job.shared.clone(),
                    cursor: Cursor::range(job.sizes.clone(), start, end),
                    cma: Cma::No,
                    part: Part::new(stripe.clone(), part),
                },
            );
            reqs.push((req, opened, start, end));
        }
        // A reader drains its table after marking its connection dead;
        // check after inserting so that no request is left behind.
        if let Some(dead) = conns.iter().find(|c| !c.is_alive()) {
            stripe.abandon(None);
            let cause = dead.dead.borrow().clone().unwrap_or_default();
            return Err(Error::ConnectionLost {
                peer: dead.peer.clone(),
                cause,
            });
        }
        // However the operation ends, the parts still running end with it
        // (and the remote is told, unless it completed).
        let (shared, s) = (job.shared.clone(), stripe.clone());
        self.local.handle.spawn(async move {
            let (status, error) = shared.ended().await;
            s.abandon(abort_reason(status, error.as_ref()));
        });
        for ((part, conn), (req, opened, start, end)) in (0..parts).zip(&conns).zip(&reqs) {
            let open = Message::Open(Open {
                req: *req,
                op_id: job.remote.operation_id(),
                token: *job.remote.token(),
                kind: job.kind,
                sizes: job.sizes.clone(),
                pull: false,
                part,
                parts,
            })
            .to_vec();
            match job.kind {
                OperationKind::Read => conn.send_soon(open, Some(opened.clone()), false),
                OperationKind::Write => conn.spawn_part(
                    *req,
                    job.region.clone(),
                    Cursor::range(job.sizes.clone(), *start, *end),
                    open,
                    Some(opened.clone()),
                    job.shared.clone(),
                    if part == 0 {
                        Last::SealAfter(stripe.clone())
                    } else {
                        Last::Part
                    },
                ),
            }
        }
        Ok(Arc::new(TcpLink {
            conn: conns[0].clone(),
            req: reqs[0].0,
            opened: reqs[0].1.clone(),
            stripe: Some(stripe),
        }))
    }
}

/// Removes `slot` from the pool unless it holds a live connection or is in
/// use (whoever uses it fills it); a dead connection in it is dropped, and
/// with it its socket.
fn forget_slot(pool: &Mutex<HashMap<PoolKey, Slot>>, key: &PoolKey, slot: &Slot) {
    let Ok(mut g) = slot.try_lock() else {
        return;
    };
    if g.as_ref().is_some_and(|c| c.is_alive()) {
        return;
    }
    *g = None;
    let mut pool = lock(pool);
    if pool.get(key).is_some_and(|s| Arc::ptr_eq(s, slot)) {
        pool.remove(key);
    }
}

/// Milliseconds since the first call, on a monotonic clock.
fn now_ms() -> u64 {
    static EPOCH: OnceLock<std::time::Instant> = OnceLock::new();
    let epoch = *EPOCH.get_or_init(std::time::Instant::now);
    u64::try_from(epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
}

/// Waits until the watched value satisfies `f` (or its sender is gone).
async fn until<T>(rx: &mut watch::Receiver<T>, f: impl FnMut(&T) -> bool) {
    let _ = rx.wait_for(f).await;
}

/// Accepts connections until the connector shuts down.
pub(crate) async fn listen(
    inner: Arc<Inner>,
    listener: TcpListener,
    mut shutdown: watch::Receiver<bool>,
) {
    loop {
        let (s, addr) = tokio::select! {
            r = listener.accept() => match r {
                Ok(x) => x,
                Err(e) => {
                    tracing::warn!("accept failed: {e}");
                    // Out of file descriptors and the like: back off briefly
                    // instead of spinning.
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = until(&mut shutdown, |s| *s) => return,
        };
        // Room for it, or closed at once (see `admission.rs`).
        let Some(ticket) = inner.tcp.admission.admit(addr.ip()) else {
            tracing::debug!(%addr, "refused a connection: every place is held by a proven peer");
            continue;
        };
        let inner = inner.clone();
        let shutdown = shutdown.clone();
        tokio::spawn(async move {
            tune(&s);
            let tuple = (s.peer_addr(), s.local_addr());
            let (r, w) = s.into_split();
            let (mut rd, mut w) = (FrameReader::new(r), ConnWriter::new(w));
            // The whole handshake has one deadline, and ends if the
            // connection must make room for another.
            let mut evicted = ticket.evicted.clone();
            let handshake = async {
                let peer = match rd.next().await {
                    Ok(Message::Hello(h)) if h.version == wire::PROTOCOL_VERSION => h.worker_id,
                    _ => return Err("it did not start with a valid hello".to_string()),
                };
                let hello = Message::Hello(Hello {
                    version: wire::PROTOCOL_VERSION,
                    worker_id: inner.worker_id.clone(),
                })
                .to_vec();
                w.write_all(&hello).await.map_err(|e| e.to_string())?;
                if let Some(secret) = &inner.secret {
                    authenticate(secret, &mut rd, &mut w, &peer, &hello).await?;
                }
                Ok(peer)
            };
            let peer = tokio::select! {
                r = tokio::time::timeout(HANDSHAKE_TIMEOUT, handshake) => match r {
                    Ok(Ok(peer)) => peer,
                    Ok(Err(why)) => {
                        tracing::info!(%addr, "refused a connection: {why}");
                        let _ = w.shutdown().await;
                        return;
                    }
                    Err(_) => {
                        tracing::debug!(%addr, "dropped a connection: no handshake within {HANDSHAKE_TIMEOUT:?}");
                        return;
                    }
                },
                _ = until(&mut evicted, |e| *e) => return,
            };
            tracing::debug!(%addr, peer, "accepted a connection");
            let conn = Conn::new(peer, w, inner.handle.clone());
            // Closed if it must make room while it has proven nothing.
            let weak = Arc::downgrade(&conn);
            tokio::spawn(async move {
                if evicted.wait_for(|e| *e).await.is_ok() {
                    if let Some(c) = weak.upgrade() {
                        c.kill(
                            "closed to make room for other peers: it presented no capability"
                                .into(),
                        );
                    }
                }
            });
            let _ = conn.ticket.set(ticket);
            if let (Ok(act), Ok(pas)) = tuple {
                let _ = conn.tuple.set((act, pas));
            }
            inner.track_incoming(&conn);
            let idle = inner.tcp.local.idle_timeout;
            run_connection(conn, rd, shutdown, Some(inner), idle).await;
        });
    }
}

/// The passive side of the handshake of the secure channel (see
/// `secure.rs`); `mine`: the `Hello` this side sent. On failure the remote
/// is told why, and the connection must be closed.
async fn authenticate(
    secret: &Secret,
    rd: &mut FrameReader,
    w: &mut ConnWriter,
    peer: &str,
    mine: &[u8],
) -> Result<(), String> {
    let refuse = async |w: &mut ConnWriter, req: u64, detail: &str| {
        let abort = Message::Abort(Abort {
            req,
            reason: AbortReason::Unauthenticated,
            detail: detail.to_string(),
        });
        let _ = w.write_all(&abort.to_vec()).await;
        Err(detail.to_string())
    };
    let theirs = match tokio::time::timeout(HANDSHAKE_TIMEOUT, rd.next()).await {
        Ok(Ok(Message::Auth(a))) => a,
        Ok(Ok(Message::Open(o))) => {
            return refuse(
                w,
                o.req,
                "this worker requires a shared secret (FERRY_SECRET)",
            )
            .await
        }
        _ => return refuse(w, 0, "this worker requires a shared secret (FERRY_SECRET)").await,
    };
    // Their hello as received (decoding is exact: it re-encodes to the same bytes).
    let their_hello = Message::Hello(Hello {
        version: wire::PROTOCOL_VERSION,
        worker_id: peer.to_string(),
    })
    .to_vec();
    let (keys, answer) = match secure::respond(secret, &their_hello, &theirs.handshake, mine) {
        Ok(x) => x,
        Err(detail) => return refuse(w, 0, detail).await,
    };
    w.write_all(&Message::Auth(Auth { handshake: answer }).to_vec())
        .await
        .map_err(|e| e.to_string())?;
    let (tx, rx) = keys.split();
    rd.secure(rx);
    w.secure(tx);
    Ok(())
}

/// The reader loop of a connection. `inner` is set for connections accepted
/// by the listener (they serve passive operations).
async fn run_connection(
    conn: Arc<Conn>,
    mut rd: FrameReader,
    mut shutdown: watch::Receiver<bool>,
    inner: Option<Arc<Inner>>,
    idle_timeout: Duration,
) {
    let mut dead = conn.dead.subscribe();
    let err = loop {
        // Kept across wake-ups of the idle timer: a frame half read must
        // not be dropped.
        let mut frame = std::pin::pin!(step(&conn, &mut rd, inner.as_ref()));
        let step = loop {
            let idle = conn.idle_for().unwrap_or_default();
            tokio::select! {
                r = &mut frame => break r,
                _ = until(&mut dead, |d| d.is_some()) => {
                    let cause = conn.dead.borrow().clone().unwrap_or_default();
                    break Err(ConnError::Closed(Error::ConnectionLost { peer: conn.peer.clone(), cause }));
                }
                _ = until(&mut shutdown, |s| *s) => break Err(ConnError::Closed(Error::Shutdown)),
                _ = tokio::time::sleep(idle_timeout.saturating_sub(idle)) => {
                    if conn.idle_for().is_some_and(|d| d >= idle_timeout) {
                        break Err(ConnError::Closed(Error::ConnectionLost {
                            peer: conn.peer.clone(),
                            cause: format!("idle for {idle_timeout:?}"),
                        }));
                    }
                }
            }
        };
        conn.touch();
        if let Err(e) = step {
            break e.into_error(&conn.peer);
        }
    };
    tracing::debug!(peer = conn.peer, "connection closed: {err}");
    conn.kill(err.to_string());
    let active: Vec<ActiveReq> = lock(&conn.active).drain().map(|(_, r)| r).collect();
    for r in active {
        r.region.close();
        r.shared.fail(err.clone());
    }
    let passive: Vec<PassiveReq> = lock(&conn.passive).drain().map(|(_, r)| r).collect();
    if let Some(inner) = &inner {
        for r in passive {
            inner
                .exposures
                .finish(&r.exposure, OperationStatus::Errored, Some(err.clone()));
        }
    }
    // Our own copies from the peer have stopped (regions closed above); the
    // peer's copies from us end with its process or its reader (it closes
    // its regions the same way when it sees the connection end).
    let leases: Vec<Arc<Region>> = lock(&conn.leases).drain().map(|(_, r)| r).collect();
    for r in leases {
        r.give_back();
    }
    conn.closed();
    // Writers abandon their writes once the connection is dead, so the lock
    // comes free; bound the wait all the same.
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        let _ = conn.writer.lock().await.shutdown().await;
    })
    .await;
}

async fn step(
    conn: &Arc<Conn>,
    rd: &mut FrameReader,
    inner: Option<&Arc<Inner>>,
) -> Result<(), ConnError> {
    let msg = rd.next().await?;
    match (msg, inner) {
        (Message::Hello(_), _) => Err(ConnError::Violation("unexpected hello".into())),
        (Message::Auth(_), inner) => {
            // With a secret, the handshake consumed the Auth frames: another
            // one is out of place. Without one, say so to the peer.
            let has_secret = inner.is_some_and(|i| i.secret.is_some());
            let detail = if has_secret {
                "unexpected authentication frame"
            } else {
                "this worker has no shared secret configured"
            };
            conn.send_detached(Message::Abort(Abort {
                req: 0,
                reason: AbortReason::Unauthenticated,
                detail: detail.into(),
            }));
            Err(ConnError::Violation(detail.into()))
        }
        (Message::Attach(a), Some(inner)) => on_attach(conn, inner, a),
        (Message::Attach(_), None) => Err(ConnError::Violation("unexpected attach".into())),
        (Message::Lease(l), Some(inner)) => {
            // A pulled WRITE: the active side lends its source.
            if !inner.tcp.local.cma || conn.peer_pid.get().is_none() {
                return Err(ConnError::Violation(
                    "a lease to a worker that did not agree to attach".into(),
                ));
            }
            let job = match lock(&conn.passive).get_mut(&l.req) {
                Some(r) => {
                    take_lease(&mut r.cma, Cma::AwaitLease, &l, &r.exposure.region)?;
                    Some((r.exposure.region.clone(), r.exposure.shared.clone()))
                }
                None => None,
            };
            conn.pull_or_release(l, job);
            Ok(())
        }
        (Message::Lease(l), None) => {
            // A pulled READ: the passive side lends its source.
            if conn.peer_pid.get().is_none() || l.req >= conn.next_req.load(Ordering::Relaxed) {
                return Err(ConnError::Violation(
                    "a lease this worker did not ask for".into(),
                ));
            }
            let job = match lock(&conn.active).get_mut(&l.req) {
                Some(r) => {
                    take_lease(&mut r.cma, Cma::Requested, &l, &r.region)?;
                    r.shared.set_transport(TransportKind::Cma);
                    Some((r.region.clone(), r.shared.clone()))
                }
                None => None,
            };
            conn.pull_or_release(l, job);
            Ok(())
        }
        (Message::Release { req }, _) => {
            conn.give_back(req);
            Ok(())
        }
        (Message::Open(o), Some(inner)) => on_open(conn, inner, o),
        (Message::Open(_), None) => {
            Err(ConnError::Violation("open sent to the active side".into()))
        }
        (Message::Data(d), Some(_)) => {
            let region = {
                let mut passive = lock(&conn.passive);
                match passive.get_mut(&d.req) {
                    Some(PassiveReq {
                        cursor: Some(c),
                        exposure,
                        ..
                    }) => {
                        c.accept(d.desc, d.offset, d.len)
                            .map_err(|e| ConnError::Violation(e.to_string()))?;
                        Some(exposure.region.clone())
                    }
                    Some(_) => {
                        return Err(ConnError::Violation(
                            "data sent for a READ or a leased WRITE".into(),
                        ))
                    }
                    None => None,
                }
            };
            rd.payload(d.len, region.as_deref().map(|r| (r, d.desc, d.offset)))
                .await
        }
        (Message::Data(d), None) => {
            let region = {
                let mut active = lock(&conn.active);
                match active.get_mut(&d.req) {
                    Some(r) if r.kind == OperationKind::Read && r.cma != Cma::Pulling => {
                        if r.cma == Cma::Requested {
                            // The passive side chose to stream instead of lending.
                            r.cma = Cma::No;
                            r.shared.set_transport(TransportKind::Tcp);
                        }
                        r.cursor
                            .accept(d.desc, d.offset, d.len)
                            .map_err(|e| ConnError::Violation(e.to_string()))?;
                        Some(r.region.clone())
                    }
                    Some(_) => {
                        return Err(ConnError::Violation(
                            "data sent for a WRITE or a leased READ".into(),
                        ))
                    }
                    None => None,
                }
            };
            rd.payload(d.len, region.as_deref().map(|r| (r, d.desc, d.offset)))
                .await
        }
        (Message::Finish { req }, Some(inner)) => {
            // A destination that copied from us has stopped.
            conn.give_back(req);
            let part = part_finished(conn, &mut lock(&conn.passive), req, |r| {
                (&mut r.part, r.cursor.as_ref(), &r.exposure.region)
            });
            if let Some(end) = part {
                return end.map_err(|detail| {
                    // Out of the table before the violation ends the
                    // operation: ending it takes the table again.
                    let r = lock(&conn.passive).remove(&req);
                    match r {
                        Some(r) => passive_violation(conn, inner, &r.exposure, detail),
                        None => ConnError::Violation(detail),
                    }
                });
            }
            let Some(r) = lock(&conn.passive).remove(&req) else {
                return Ok(());
            };
            match r.cma {
                Cma::Lent => {
                    // A leased READ: the remote has every byte. Commit,
                    // unless a cancel got here first (it tells the remote).
                    let e = &r.exposure;
                    if e.region.seal_if_open(|| e.shared.seal()) {
                        if inner.exposures.finish(e, OperationStatus::Complete, None) {
                            conn.send_soon(Message::Finish { req }.to_vec(), None, true);
                        } else {
                            conn.abort_detached(req, AbortReason::Cancelled, String::new());
                        }
                    }
                    return Ok(());
                }
                Cma::Pulling => {
                    // A pulled WRITE: the source commits what we copied.
                    if !r.exposure.shared.is_sealed() {
                        let detail = "finish before the copy ended".into();
                        return Err(passive_violation(conn, inner, &r.exposure, detail));
                    }
                    inner
                        .exposures
                        .finish(&r.exposure, OperationStatus::Complete, None);
                    return Ok(());
                }
                Cma::AwaitLease => {
                    let detail = "finish before the lease".into();
                    return Err(passive_violation(conn, inner, &r.exposure, detail));
                }
                Cma::No | Cma::Requested => {}
            }
            // A write's Finish must follow all its data; a read's confirmation
            // must follow our own Finish (sent only once sealed).
            let premature = match &r.cursor {
                Some(c) => !c.is_done() || parts_missing(&r.part),
                None => !r.exposure.shared.is_sealed(),
            };
            if premature {
                let detail = "finish before all data".into();
                return Err(passive_violation(conn, inner, &r.exposure, detail));
            }
            // A write is complete only if every byte landed: if the owner
            // began to close the region (a cancel in progress), some may
            // have been dropped; the cancel ends it and tells the writer.
            if r.cursor.is_some() && !r.exposure.region.close_if_intact() {
                return Ok(());
            }
            let won = inner
                .exposures
                .finish(&r.exposure, OperationStatus::Complete, None);
            if r.cursor.is_some() {
                // A write: confirm that every byte landed.
                if won {
                    conn.send_detached(Message::Finish { req });
                } else {
                    conn.abort_detached(req, AbortReason::Cancelled, String::new());
                }
            }
            Ok(())
        }
        (Message::Finish { req }, None) => {
            // A destination that copied from us has stopped.
            conn.give_back(req);
            let part = part_finished(conn, &mut lock(&conn.active), req, |r| {
                let cursor = (r.kind == OperationKind::Read).then_some(&r.cursor);
                (&mut r.part, cursor, &r.region)
            });
            if let Some(end) = part {
                return end.map_err(|detail| {
                    let r = lock(&conn.active).remove(&req);
                    match r {
                        Some(r) => active_violation(conn, &r, detail),
                        None => ConnError::Violation(detail),
                    }
                });
            }
            let Some(r) = lock(&conn.active).remove(&req) else {
                return Ok(());
            };
            match r.cma {
                Cma::Lent => {
                    // A leased WRITE: the remote has every byte. Commit,
                    // unless a cancel got here first (it tells the remote).
                    if r.region.seal_if_open(|| r.shared.seal()) {
                        r.region.close();
                        r.shared.end(OperationStatus::Complete, None);
                        conn.send_soon(Message::Finish { req }.to_vec(), None, true);
                    }
                    return Ok(());
                }
                Cma::Pulling => {
                    // A leased READ: the source commits what we copied.
                    if !r.shared.is_sealed() {
                        let detail = "finish before the copy ended".into();
                        return Err(active_violation(conn, &r, detail));
                    }
                    r.region.close();
                    r.shared.end(OperationStatus::Complete, None);
                    return Ok(());
                }
                Cma::No | Cma::Requested | Cma::AwaitLease => {}
            }
            // A read is complete only if every byte landed: if a local
            // cancel began to close the region, some may have been dropped;
            // that cancel ends the read and tells the remote.
            let intact = r.region.close_if_intact();
            if r.kind == OperationKind::Read && !intact {
                return Ok(());
            }
            // A read's Finish must follow all its data; a write's confirmation
            // must follow our own Finish (sent only once sealed).
            let premature = match r.kind {
                OperationKind::Read => !r.cursor.is_done() || parts_missing(&r.part),
                OperationKind::Write => !r.shared.is_sealed(),
            };
            if premature {
                let detail = "finish before all data".into();
                return Err(active_violation(conn, &r, detail));
            }
            if let Some(p) = &r.part {
                // The other parts leave their tables before anyone wakes.
                p.stripe.abandon(None);
            }
            let won = r.shared.end(OperationStatus::Complete, None);
            if r.kind == OperationKind::Read {
                // Confirm receipt, unless a local cancel got there first.
                if won {
                    conn.send_detached(Message::Finish { req });
                } else {
                    conn.abort_detached(req, AbortReason::Cancelled, String::new());
                }
            }
            Ok(())
        }
        (Message::Abort(a), Some(inner)) => {
            // A destination that copied from us has stopped.
            conn.give_back(a.req);
            let removed = lock(&conn.passive).remove(&a.req);
            if let Some(r) = removed {
                if r.part.is_some() && ending_here(&r.exposure.region, &r.exposure.shared) {
                    return Ok(());
                }
                let err = remote_error(&a);
                let status = if matches!(err, Error::RemoteCancelled) {
                    OperationStatus::Cancelled
                } else {
                    OperationStatus::Errored
                };
                // Closes the region: our copy from the source stops first.
                inner.exposures.finish(&r.exposure, status, Some(err));
                if r.cma == Cma::Pulling {
                    conn.release(a.req);
                }
            }
            Ok(())
        }
        (Message::Abort(a), None) => {
            // A destination that copied from us has stopped.
            conn.give_back(a.req);
            let removed = lock(&conn.active).remove(&a.req);
            if let Some(r) = removed {
                if r.part.is_some() && ending_here(&r.region, &r.shared) {
                    return Ok(());
                }
                if a.reason == AbortReason::OperationEnded
                    && r.part.as_ref().is_some_and(|p| p.index != 0)
                {
                    // A further part arrived after the remote ended the
                    // operation: how it ended comes on part 0 (its `Abort`
                    // if part 0 was bound, else the refusal of part 0), so
                    // that a remote cancel reads as one on this side too.
                    return Ok(());
                }
                // Our copy from the source (if any) stops here.
                r.region.close();
                r.shared.fail(remote_error(&a));
                if r.cma == Cma::Pulling {
                    conn.release(a.req);
                }
            }
            Ok(())
        }
    }
}

/// The `Finish` of request `req` if it carries a part other than 0 of a
/// striped transfer (`None` otherwise: the caller handles it). At the
/// destination (`cursor` is the part's) it says every byte of the part was
/// sent: checked, then confirmed, unless a cancel is closing the region
/// (the cancel tells the remote). At the source it is that confirmation,
/// valid only once this side has sent the whole part. The
/// part is marked done and stays in the table until the operation ends; a
/// repeated `Finish` is ignored. `Err`: a premature `Finish` (the caller
/// ends the operation and the connection).
fn part_finished<R>(
    conn: &Arc<Conn>,
    table: &mut HashMap<u64, R>,
    req: u64,
    view: impl FnOnce(&mut R) -> PartView<'_>,
) -> Option<Result<(), String>> {
    let r = table.get_mut(&req)?;
    let (part, cursor, region) = view(r);
    let p = part.as_mut().filter(|p| p.index != 0)?;
    if p.done {
        return Some(Ok(()));
    }
    match cursor {
        Some(c) if !c.is_done() => {
            return Some(Err(format!("finish before all data of part {}", p.index)))
        }
        Some(_) => {
            if region.is_open() {
                p.done = true;
                p.stripe.part_done();
                conn.send_soon(Message::Finish { req }.to_vec(), None, true);
            }
        }
        None if !p.sent => {
            return Some(Err(format!(
                "part {} confirmed before this side sent all of it",
                p.index
            )))
        }
        None => {
            p.done = true;
            p.stripe.part_done();
        }
    }
    Some(Ok(()))
}

/// What [`part_finished`] looks at in a table entry: its part, the part's
/// cursor (destination only), the region.
type PartView<'a> = (&'a mut Option<Part>, Option<&'a Cursor>, &'a Region);

/// Ends a passive operation as ERRORED because the peer broke the protocol
/// (`detail` says how); the caller closes the connection with the result.
fn passive_violation(conn: &Conn, inner: &Inner, e: &Exposure, detail: String) -> ConnError {
    let err = Error::Protocol {
        peer: conn.peer.clone(),
        detail: detail.clone(),
    };
    inner
        .exposures
        .finish(e, OperationStatus::Errored, Some(err));
    ConnError::Violation(detail)
}

/// Ends an active operation as ERRORED because the peer broke the protocol
/// (`detail` says how); the caller closes the connection with the result.
fn active_violation(conn: &Conn, r: &ActiveReq, detail: String) -> ConnError {
    r.region.close();
    r.shared.fail(Error::Protocol {
        peer: conn.peer.clone(),
        detail: detail.clone(),
    });
    ConnError::Violation(detail)
}

/// Whether this side has begun to end a striped operation (a cancel in
/// progress, another part failed): it closed the region and will settle the
/// outcome and tell the remote. The remote's answers on the other parts
/// (its `Abort`s, a refusal of a part whose `Open` arrived after the end)
/// must not settle it first, or a local cancel could end as an error. A
/// sealed operation is the remote's to settle.
fn ending_here(region: &Region, shared: &OpShared) -> bool {
    !region.is_open() && !shared.is_sealed()
}

fn remote_error(a: &Abort) -> Error {
    match a.reason {
        AbortReason::Cancelled => Error::RemoteCancelled,
        AbortReason::Unauthenticated => Error::Unauthenticated {
            peer: String::new(),
            detail: a.detail.clone(),
        },
        AbortReason::PartFailed => Error::ConnectionLost {
            peer: String::new(),
            cause: format!(
                "another stream of this striped transfer failed at the remote: {}",
                a.detail
            ),
        },
        reason => Error::Rejected {
            reason,
            detail: a.detail.clone(),
        },
    }
}

/// The passive side's part of setting up cross-memory attach (see
/// [`Attach`]).
fn on_attach(conn: &Arc<Conn>, inner: &Arc<Inner>, a: Attach) -> Result<(), ConnError> {
    let mut state = lock(&conn.attach);
    match (&*state, a.verdict) {
        (Attaching::Idle, Verdict::Unknown) => {
            // 1 -> 2: offer our cookie, or decline.
            let tuple = conn.tuple.get().copied();
            let usable = tuple.filter(|&(act, pas)| inner.tcp.local.cma && cma::is_local(pas, act));
            let answer = match usable {
                Some((act, pas)) => {
                    let np = host::random_bytes();
                    let cookie =
                        Box::new(cma::cookie(cma::Side::Passive, &a.cookie, &np, act, pas));
                    let at = cookie.as_ptr() as u64;
                    *state = Attaching::Offered(Some((a.cookie, np)));
                    *lock(&conn.cookie) = Some(cookie);
                    Attach {
                        pid: cma::pid(),
                        addr: at,
                        cookie: np,
                        verdict: Verdict::Unknown,
                    }
                }
                None => {
                    *state = Attaching::Offered(None);
                    Attach {
                        pid: 0,
                        addr: 0,
                        cookie: [0; 16],
                        verdict: Verdict::Unknown,
                    }
                }
            };
            drop(state);
            conn.send_detached(Message::Attach(answer));
            Ok(())
        }
        (Attaching::Offered(nonces), v) if v != Verdict::Unknown => {
            // 3 -> 4: their verdict on us; probe them; answer ours.
            let nonces = *nonces;
            *state = Attaching::Done;
            drop(state);
            conn.peer_pulls
                .store(nonces.is_some() && v == Verdict::CanPull, Ordering::Release);
            let conn = conn.clone();
            let tuple = conn.tuple.get().copied();
            tokio::spawn(async move {
                let verified = match (nonces, tuple) {
                    (Some((na, np)), Some((act, pas))) => {
                        // The active end of this connection is `act` -> `pas`.
                        verify_peer(a.pid, a.addr, act, pas, move || {
                            cma::cookie(cma::Side::Active, &na, &np, act, pas)
                        })
                        .await
                    }
                    _ => None,
                };
                let ok = verified.is_some();
                if let Some(p) = verified {
                    let _ = conn.peer_pid.set(p);
                }
                conn.send_detached(Message::Attach(Attach {
                    pid: 0,
                    addr: 0,
                    cookie: [0; 16],
                    verdict: if ok {
                        Verdict::CanPull
                    } else {
                        Verdict::Refused
                    },
                }));
            });
            Ok(())
        }
        _ => Err(ConnError::Violation("an attach frame out of turn".into())),
    }
}

fn on_open(conn: &Arc<Conn>, inner: &Arc<Inner>, o: Open) -> Result<(), ConnError> {
    if lock(&conn.passive).contains_key(&o.req) || lock(&conn.leases).contains_key(&o.req) {
        return Err(ConnError::Violation(format!(
            "request number {} in use",
            o.req
        )));
    }
    match inner
        .exposures
        .open(&o, Binding::Tcp(Arc::downgrade(conn), o.req))
    {
        Err((reason, detail)) => {
            tracing::debug!(
                peer = conn.peer,
                op = o.op_id,
                ?reason,
                "refused an operation: {detail}"
            );
            conn.abort_detached(o.req, reason, detail);
            Ok(())
        }
        Ok((exposure, Some(stripe))) => {
            conn.prove();
            // A part of a striped transfer: TCP only.
            exposure.shared.set_transport(TransportKind::Tcp);
            let total = o.sizes.iter().fold(0u64, |a, s| a.saturating_add(*s));
            let (start, end) = part_range(total, o.part, o.parts);
            let cursor = (o.kind == OperationKind::Write)
                .then(|| Cursor::range(o.sizes.clone(), start, end));
            lock(&conn.passive).insert(
                o.req,
                PassiveReq {
                    exposure: exposure.clone(),
                    cursor,
                    cma: Cma::No,
                    part: Part::new(stripe.clone(), o.part),
                },
            );
            // The owner may have withdrawn it between the check and the insert.
            if exposure.shared.status().is_terminal() {
                conn.forget_passive(o.req);
                return Ok(());
            }
            if o.kind == OperationKind::Read {
                let last = if o.part == 0 {
                    Last::SealAfter(stripe)
                } else {
                    Last::Part
                };
                conn.spawn_part(
                    o.req,
                    exposure.region.clone(),
                    Cursor::range(o.sizes, start, end),
                    Vec::new(),
                    None,
                    exposure.shared.clone(),
                    last,
                );
            }
            Ok(())
        }
        Ok((exposure, None)) => {
            conn.prove();
            let cma = match (o.kind, o.pull) {
                (_, false) => Cma::No,
                (OperationKind::Read, true)
                    if inner.tcp.local.cma
                        && conn.peer_pulls.load(Ordering::Acquire)
                        && o.sizes.len() <= MAX_LEASE_SEGMENTS =>
                {
                    Cma::Lent
                }
                // Fall back to streaming the bytes.
                (OperationKind::Read, true) => Cma::No,
                (OperationKind::Write, true) => Cma::AwaitLease,
            };
            exposure.shared.set_transport(if cma == Cma::No {
                TransportKind::Tcp
            } else {
                TransportKind::Cma
            });
            let cursor =
                (o.kind == OperationKind::Write && !o.pull).then(|| Cursor::new(o.sizes.clone()));
            let region = exposure.region.clone();
            let shared = exposure.shared.clone();
            lock(&conn.passive).insert(
                o.req,
                PassiveReq {
                    exposure: exposure.clone(),
                    cursor,
                    cma,
                    part: None,
                },
            );
            // Lend before looking at the status: an owner that drops the
            // operation from now on finds the memory lent and keeps it alive.
            if cma == Cma::Lent {
                conn.lend(o.req, &region);
            }
            // The owner may have withdrawn it between the check and the insert.
            if exposure.shared.status().is_terminal() {
                conn.forget_passive(o.req);
                conn.give_back(o.req);
                return Ok(());
            }
            match (o.kind, cma) {
                (OperationKind::Read, Cma::Lent) => {
                    let lease = Message::Lease(Lease {
                        req: o.req,
                        segments: region.segments(),
                    });
                    conn.send_soon(lease.to_vec(), None, true);
                }
                (OperationKind::Read, _) => {
                    conn.spawn_stream(o.req, region, o.sizes, Vec::new(), None, shared)
                }
                (OperationKind::Write, _) => {}
            }
            Ok(())
        }
    }
}
