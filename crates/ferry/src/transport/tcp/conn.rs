//! One connection: its tables, its write side, and the streams of bytes
//! it sends.

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use ferry_proto::lane::LaneId;
use ferry_proto::session::{Action, Fence, Session};
use ferry_proto::wire::{Abort, AbortReason, Lease, Message};
use ferry_proto::OperationStatus;
use tokio::runtime::Handle;
use tokio::sync::watch;

use crate::exposure::{PassiveLink, Refusal};
use crate::kind::TransportKind;
use crate::outcome::OpShared;
use crate::region::Region;
use crate::transport::admission::{Activity, Ticket};
use crate::transport::api::ActiveLink;
use crate::transport::stall::CopySlots;
use crate::Error;

use super::conn_io::*;
use super::error::*;
use super::request::*;
use super::util::*;
use crate::transport::pull::exchange::Exchange;
use crate::transport::pull::lanes::{Lanes, Peers};
use crate::transport::pull::LeaseBlob;

/// The `Open` behind `opened` is on the wire (or never will be): an
/// `Abort` waiting for it may follow.
pub(super) fn mark_opened(opened: &Option<Arc<watch::Sender<bool>>>) {
    if let Some(o) = opened {
        o.send_replace(true);
    }
}

/// Tries to write the last frame of a transfer, sealing the operation
/// under the region's lock at the moment its first byte enters the socket
/// (see [`Conn::write_final`]): `None` if the region is closed (nothing
/// sent), else what `try_write` returned.
pub(super) fn try_write_sealed(
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

/// One connection to a remote connector, in either direction.
pub(crate) struct Conn {
    /// This connection, for the stripes that hold it as a `PartConn`.
    pub(super) me: Weak<Conn>,
    pub(super) peer: String,
    pub(super) writer: Arc<tokio::sync::Mutex<ConnWriter>>,
    pub(super) dead: watch::Sender<Option<String>>,
    /// The request protocol: every request in flight, in either role, and
    /// the memory lent to the peer (see `ferry_proto::session`). Held only
    /// to feed it and take its actions, never while executing them.
    pub(super) session: Mutex<Session<Target>>,
    pub(super) queued: AtomicUsize,
    pub(super) handle: Handle,
    /// The lanes this connector offers (see `transport::pull::lanes`).
    pub(super) lanes: Lanes,
    /// What the connection proved about the peer, and holds of it for the
    /// lanes (its process, its UCX endpoint, ...).
    pub(super) peers: Peers,
    /// `(active, passive)` socket addresses of this connection.
    pub(super) tuple: OnceLock<(SocketAddr, SocketAddr)>,
    /// This side's cookie and proof bytes (`cma::placed`), kept at a fixed
    /// address for the peer to read while the connection lives.
    pub(super) cookie: Mutex<Option<Box<[u8; 32]>>>,
    /// The lane being set up on an accepted connection, between the
    /// peer's offers (see `transport::pull::offer`).
    pub(super) exchange: Mutex<Option<Exchange>>,
    /// Bounds this connection's copies from the peer (see `stall.rs`).
    pub(super) copy_slots: Arc<CopySlots>,
    /// What to do once the reader has ended (`None` inside: it has).
    pub(super) on_close: Mutex<Option<Vec<CloseHook>>>,
    /// An accepted connection's place (see `admission.rs`).
    pub(super) ticket: OnceLock<Ticket>,
    /// When the connection was last seen carrying a live operation (or
    /// one began), in milliseconds since `clock::epoch()`: frames that
    /// belong to no live operation do not move it.
    pub(super) last_active: AtomicU64,
    /// Set before the operations of a connection that broke the protocol
    /// end, just before it closes.
    pub(super) closing: AtomicBool,
    /// Host buffers for device memory on its way out (`staged.rs`), kept
    /// between operations.
    pub(super) staging: Mutex<Vec<crate::cuda::stage::HostBuf>>,
    /// Woken when the connection goes from no live operation to one: its
    /// reader then arms the liveness timer (`session::liveness`).
    pub(super) began: tokio::sync::Notify,
    /// The end-to-end integrity check is on here (its session's setting):
    /// streams digest what they send.
    pub(super) digest: bool,
    /// This side's grant requests waiting for the peer's replies.
    pub(super) grants: super::GrantCalls,
    /// This side's claims on offers waiting for the peer's replies.
    pub(super) claims: super::ClaimCalls,
}

pub(super) type CloseHook = Box<dyn FnOnce() + Send>;

/// What follows a frame's write: `Ok` once it is in the socket, else why
/// it never will be.
pub(super) type Sent = Box<dyn FnOnce(Result<(), String>) + Send>;

impl Conn {
    pub(super) fn new(
        peer: String,
        writer: ConnWriter,
        handle: Handle,
        session: Session<Target>,
        lanes: Lanes,
    ) -> Arc<Self> {
        let digest = session.digests();
        Arc::new_cyclic(|me| Conn {
            me: me.clone(),
            peer,
            writer: Arc::new(tokio::sync::Mutex::new(writer)),
            dead: watch::Sender::new(None),
            session: Mutex::new(session),
            queued: AtomicUsize::new(0),
            handle,
            lanes,
            peers: Peers::default(),
            tuple: OnceLock::new(),
            cookie: Mutex::new(None),
            exchange: Mutex::new(None),
            copy_slots: Arc::new(CopySlots::new()),
            on_close: Mutex::new(Some(Vec::new())),
            ticket: OnceLock::new(),
            last_active: AtomicU64::new(now_ms()),
            closing: AtomicBool::new(false),
            staging: Mutex::new(Vec::new()),
            began: tokio::sync::Notify::new(),
            digest,
            grants: super::GrantCalls::default(),
            claims: super::ClaimCalls::default(),
        })
    }

    /// Feeds the session with `f` and runs the actions it queued, in
    /// order, outside its lock.
    pub(super) fn with_session<R>(
        self: &Arc<Self>,
        f: impl FnOnce(&mut Session<Target>) -> R,
    ) -> R {
        self.with_session_prepared(None, f)
    }

    /// [`with_session`](Self::with_session), where the memory that `f`
    /// may lend was prepared beforehand, outside the session's lock
    /// (`prepared`: how that went, see [`prepare_lent`](Self::prepare_lent)):
    /// the `Lend` it queues then only marks it lent.
    pub(super) fn with_session_prepared<R>(
        self: &Arc<Self>,
        mut prepared: Option<Result<(), String>>,
        f: impl FnOnce(&mut Session<Target>) -> R,
    ) -> R {
        let (r, actions) = {
            let mut s = lock(&self.session);
            let idle = s.live() == 0;
            let r = f(&mut s);
            if idle && s.live() > 0 {
                self.began.notify_one();
            }
            let mut actions = Vec::new();
            while let Some(a) = s.poll_action() {
                match a {
                    // Counted while the session still holds the lease: the
                    // reader's drain (under this lock) then always finds
                    // it counted, and its give-back always follows.
                    Action::Lend { req, target, lane } => {
                        if let Err(why) = self.lend(&target, prepared.take(), lane) {
                            // Nothing lent: a READ served here streams
                            // instead (or is refused); else the request
                            // ends with the connection.
                            tracing::debug!(peer = self.peer, req, "{why}");
                            if !s.lend_failed(req, &why) {
                                self.kill(why);
                            } else if target.moves_in_band() {
                                Lanes::fell_back(lane, &target.shared, &why);
                            }
                        }
                    }
                    a => actions.push(a),
                }
            }
            (r, actions)
        };
        for a in actions {
            self.execute(a);
        }
        r
    }

    /// Lends the target's memory to the peer by `lane`, the lane the
    /// session said lends it (registered first, if `prepared` does not say
    /// how that went), or says why it cannot.
    fn lend(
        &self,
        target: &Target,
        prepared: Option<Result<(), String>>,
        lane: LaneId,
    ) -> Result<(), String> {
        prepared.unwrap_or_else(|| self.prepare_lent(lane, &target.region))?;
        target.region.lend();
        Ok(())
    }

    /// Registers `region` with `lane`, which will lend it (UCX
    /// registration, CUDA IPC export; kept with the region), or says why it
    /// cannot be lent. Slow for large or device memory: the passive side
    /// does it before it takes the session's lock
    /// ([`with_session_prepared`](Self::with_session_prepared)).
    pub(super) fn prepare_lent(&self, lane: LaneId, region: &Region) -> Result<(), String> {
        let t = std::time::Instant::now();
        let r = self
            .lanes
            .register(lane, region)
            .map_err(|e| format!("cannot lend this memory: {e}"));
        tracing::debug!(us = t.elapsed().as_micros() as u64, %lane, "prepared to lend");
        r
    }

    /// Does what the session asked. No protocol decision here: only how.
    fn execute(self: &Arc<Self>, a: Action<Target>) {
        match a {
            Action::Send { msg, reply } => self.send_soon(msg.to_vec(), None, reply),
            Action::Stream {
                req,
                target,
                cursor,
                last,
            } => {
                target.shared.first_byte();
                self.stream_from(req, target, cursor, Vec::new(), None, last)
            }
            // The lease names the lane where this side did not know it
            // (`spawn_pull`).
            Action::Via { target, lent, lane } => match (lent, lane) {
                (true, Some(lane)) => target.shared.set_transport(Lanes::kind(lane)),
                (true, None) => {}
                (false, _) => target.shared.moved_by(TransportKind::Tcp),
            },
            // Run by `with_session`, under the session's lock.
            Action::Lend { .. } => {}
            Action::SendLease { req, target, lane } => {
                let (lane, segments, key) = self.lease_of(lane, &target.region).into_parts();
                let lease = Message::Lease(Lease {
                    req,
                    lane,
                    segments: segments.into(),
                    key,
                });
                self.send_soon(lease.to_vec(), None, true);
            }
            Action::GiveBack { target } => give_back(&target),
            Action::Pull {
                req,
                target,
                lane,
                segments,
                key,
            } => {
                target.shared.first_byte();
                let lease = LeaseBlob::new(lane, segments, key);
                self.spawn_pull(req, target, lease)
            }
            Action::PartDone { target } => {
                if let Some(s) = &target.stripe {
                    s.part_done();
                }
            }
            Action::Commit { req, target, lent } => {
                // Decided under the region's lock, unless a cancel got
                // there first (it tells the remote): a lent source seals; a
                // destination closes its region, intact, and seals. Sealed,
                // a cancel no longer changes the outcome.
                let seal = || target.shared.seal();
                let decided = if lent {
                    target.region.seal_if_open(seal)
                } else {
                    target.region.close_if_intact(seal)
                };
                if !decided {
                    return;
                }
                // COMPLETE only once the confirmation is in the socket: a
                // process that exits (or drops its connector) as soon as it
                // sees its operation complete must not take it along, for
                // the peer, sealed, would then end ERRORED where this side
                // ended COMPLETE. Once written, the kernel delivers it even
                // if this process ends at once.
                let peer = self.peer.clone();
                self.send_soon_then(
                    Message::Finish { req }.to_vec(),
                    None,
                    true,
                    Some(Box::new(move |sent: Result<(), String>| match sent {
                        Ok(()) => {
                            target.end(OperationStatus::Complete, None);
                        }
                        Err(cause) => {
                            target.end(
                                OperationStatus::Errored,
                                Some(Error::ConnectionLost { peer, cause }),
                            );
                        }
                    })),
                );
            }
            Action::Complete { target } => {
                target.end(OperationStatus::Complete, None);
            }
            Action::RemoteAbort {
                target,
                reason,
                detail,
            } => {
                let err = remote_error(reason, detail);
                let status = if matches!(err, Error::RemoteCancelled) {
                    OperationStatus::Cancelled
                } else {
                    OperationStatus::Errored
                };
                target.end(status, Some(err));
            }
        }
    }

    pub(super) fn is_alive(&self) -> bool {
        self.dead.borrow().is_none()
    }

    /// The connection is about to close (it still sends what its ending
    /// operations tell the peer): no new operation may pick it.
    pub(super) fn is_closing(&self) -> bool {
        self.closing.load(Ordering::Acquire) || !self.is_alive()
    }

    /// An operation began on the connection: it is not idle.
    pub(super) fn touch(&self) {
        self.last_active.store(now_ms(), Ordering::Relaxed);
    }

    /// How long it has carried no live operation (`None` if it carries one
    /// now: the clock then starts again from now).
    pub(super) fn idle_for(&self) -> Option<Duration> {
        let live = lock(&self.session).live();
        self.idle_given(live)
    }

    fn idle_given(&self, live: usize) -> Option<Duration> {
        if live > 0 {
            self.touch();
            return None;
        }
        Some(Duration::from_millis(
            now_ms().saturating_sub(self.last_active.load(Ordering::Relaxed)),
        ))
    }

    /// The connection presented a valid capability (an accepted one is
    /// then never closed to make room while it carries a live operation).
    pub(super) fn prove(&self) {
        if let Some(t) = self.ticket.get() {
            t.prove();
        }
    }

    /// Runs `f` once the connection's reader has ended (at once if it has).
    pub(super) fn when_closed(&self, f: CloseHook) {
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
    pub(super) fn closed(&self) {
        let hooks = lock(&self.on_close).take().unwrap_or_default();
        for f in hooks {
            f();
        }
    }

    pub(super) fn kill(&self, cause: String) {
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
    pub(super) async fn unless_dead<T>(
        &self,
        f: impl std::future::Future<Output = io::Result<T>>,
    ) -> io::Result<T> {
        let mut dead = self.dead.subscribe();
        tokio::select! {
            r = f => r,
            _ = until(&mut dead, |d| d.is_some()) => Err(io::Error::other("connection closed")),
        }
    }

    pub(super) async fn send_frame(&self, frame: &[u8]) -> io::Result<()> {
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
    pub(super) fn send_soon(
        self: &Arc<Self>,
        frame: Vec<u8>,
        opened: Option<Arc<watch::Sender<bool>>>,
        reply: bool,
    ) {
        self.send_soon_then(frame, opened, reply, None)
    }

    /// [`send_soon`](Self::send_soon), then `then`: `Ok` once every byte
    /// of the frame is in the socket (the kernel has it), or why it never
    /// will be.
    pub(super) fn send_soon_then(
        self: &Arc<Self>,
        frame: Vec<u8>,
        opened: Option<Arc<watch::Sender<bool>>>,
        reply: bool,
        then: Option<Sent>,
    ) {
        let fail = |then: Option<Sent>, why: String| {
            if let Some(f) = then {
                f(Err(why));
            }
        };
        if !self.is_alive() {
            // A write may have been abandoned mid-frame: nothing may follow.
            mark_opened(&opened);
            let cause = self.dead.borrow().clone().unwrap_or_default();
            return fail(then, cause);
        }
        if let Ok(mut guard) = self.writer.clone().try_lock_owned() {
            match guard.try_write(&frame) {
                Ok(n) if n == frame.len() && guard.flushed() => {
                    drop(guard);
                    mark_opened(&opened);
                    if let Some(f) = then {
                        f(Ok(()));
                    }
                    return;
                }
                Ok(n) => {
                    let conn = self.clone();
                    self.handle.spawn(async move {
                        let mut guard = guard;
                        let r = conn.unless_dead(guard.write_all(&frame[n..])).await;
                        drop(guard);
                        mark_opened(&opened);
                        conn.sent(r, then);
                    });
                    return;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => {
                    mark_opened(&opened);
                    let why = format!("write failed: {e}");
                    self.kill(why.clone());
                    return fail(then, why);
                }
            }
        }
        // Only replies the peer provokes count against it; our own frames
        // simply wait for their turn.
        if reply && self.queued.fetch_add(1, Ordering::Relaxed) >= MAX_QUEUED {
            self.queued.fetch_sub(1, Ordering::Relaxed);
            mark_opened(&opened);
            let why = "the peer does not read its replies".to_string();
            self.kill(why.clone());
            return fail(then, why);
        }
        let conn = self.clone();
        self.handle.spawn(async move {
            let r = conn.send_frame(&frame).await;
            if reply {
                conn.queued.fetch_sub(1, Ordering::Relaxed);
            }
            mark_opened(&opened);
            conn.sent(r, then);
        });
    }

    /// A write of [`send_soon_then`](Self::send_soon_then) ended with `r`.
    fn sent(&self, r: io::Result<()>, then: Option<Sent>) {
        let r = r.map_err(|e| format!("write failed: {e}"));
        if let Err(why) = &r {
            self.kill(why.clone());
        }
        if let Some(f) = then {
            f(r);
        }
    }

    /// Sends a control frame soon (see [`send_soon`](Self::send_soon)). A peer
    /// that makes us queue more than [`MAX_QUEUED`] frames without reading is
    /// cut off.
    pub(crate) fn send_detached(self: &Arc<Self>, msg: Message) {
        self.send_soon(msg.to_vec(), None, true);
    }

    pub(super) fn abort_detached(self: &Arc<Self>, req: u64, reason: AbortReason, detail: String) {
        self.send_detached(Message::Abort(Abort {
            req,
            reason,
            detail,
        }));
    }

    /// Requests in flight on this connection, in both roles.
    pub(crate) fn pending(&self) -> usize {
        lock(&self.session).pending()
    }

    pub(crate) fn forget_passive(&self, req: u64) {
        lock(&self.session).forget(req);
    }
}

impl Activity for Conn {
    fn idle(&self) -> Option<Duration> {
        // Asked under the admission's lock: never waits for the session's.
        let live = self.session.try_lock().ok()?.live();
        self.idle_given(live)
    }
}

/// The active side's handle on a request.
pub(super) struct TcpLink {
    pub(super) conn: Arc<Conn>,
    pub(super) req: u64,
    /// Set once the `Open` is on the wire: an `Abort` must not overtake it.
    pub(super) opened: Arc<watch::Sender<bool>>,
    /// The transfer is striped: these are all its requests.
    pub(super) stripe: Option<Arc<Stripe>>,
}

impl ActiveLink for TcpLink {
    fn cancel(&self, changed: bool) {
        if let Some(s) = &self.stripe {
            // The watcher tells the remote how the operation really ended
            // (this cancel may have lost to a failure).
            s.abandon(None);
            return;
        }
        lock(&self.conn.session).forget(self.req);
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

/// The binding of an exposure to one request on an accepted connection.
pub(super) struct ReqLink {
    pub(super) conn: Weak<Conn>,
    pub(super) req: u64,
}

impl PassiveLink for ReqLink {
    fn leave(&self) {}

    fn ended(&self, _how: Option<&Refusal>) {
        // The reader that ended it tells the remote itself.
    }

    fn withdrawn(&self, how: Option<Refusal>) {
        if let Some(conn) = self.conn.upgrade() {
            conn.forget_passive(self.req);
            // An expiry says so; anything else reads as a cancel.
            let (reason, detail) = match how {
                Some((AbortReason::Expired, detail)) => (AbortReason::Expired, detail),
                _ => (AbortReason::Cancelled, String::new()),
            };
            conn.abort_detached(self.req, reason, detail);
        }
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

impl PartConn for Conn {
    fn forget(&self, req: u64) {
        lock(&self.session).forget(req);
    }

    fn abort_after(
        &self,
        req: u64,
        reason: AbortReason,
        detail: String,
        opened: Option<watch::Receiver<bool>>,
    ) {
        let Some(conn) = self.me.upgrade() else {
            return;
        };
        match opened {
            Some(mut o) => {
                self.handle.spawn(async move {
                    until(&mut o, |o| *o).await;
                    conn.abort_detached(req, reason, detail);
                });
            }
            None => conn.abort_detached(req, reason, detail),
        }
    }
}

/// The peer no longer copies from the target's memory: its registration
/// ends first, then the lease (after which its owner may free it).
pub(super) fn give_back(target: &Target) {
    target.region.give_back();
}
