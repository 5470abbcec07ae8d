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
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, Weak};

use ferry_proto::lane::Mem;
use ferry_proto::session::{self, OpenParams, Plan, Thresholds};
use ferry_proto::{OperationKind, RdmaMetadata};
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::exposure::abort_reason;
use crate::kind::TransportKind;
use crate::transport::api::{ActiveJob, ActiveLink, BoxFuture, Config, Host, Transport};
use crate::transport::pull::lanes::Lanes;
use crate::transport::stall::NoSlot;
use crate::{Error, Result};

mod conn;
mod conn_io;
mod error;
mod grant;
mod handshake;
mod land;
mod lending;
mod listen;
mod offer;
mod pull;
mod reader;
mod request;
mod secure;
mod staged;
mod stream;
mod util;

use conn::*;
pub(crate) use grant::GrantCalls;
use listen::*;
pub(crate) use offer::ClaimCalls;
use request::*;
use util::*;

type Slot = Arc<tokio::sync::Mutex<Option<Arc<Conn>>>>;
/// A remote worker, its addresses, and the stream's number.
type PoolKey = (String, Vec<SocketAddr>, u16);

pub(crate) struct TcpTransport {
    local: Arc<Config>,
    /// By remote worker, its addresses and the stream's number (0 carries
    /// everything that is not a further part of a striped transfer). A slot
    /// leaves when its connection ends or cannot be made, so that peers
    /// that come and go leave nothing behind (no socket, no entry).
    pool: Arc<Mutex<HashMap<PoolKey, Slot>>>,
    /// Every outgoing connection, also those whose slot is busy connecting
    /// a replacement, for `close_all` and `pending`.
    outgoing: Mutex<Vec<Weak<Conn>>>,
    /// The accepted connections and their bounds.
    accepted: Arc<Accepted>,
}

impl TcpTransport {
    pub(crate) fn new(local: Arc<Config>) -> Self {
        TcpTransport {
            accepted: Arc::new(Accepted::new(local.max_connections, local.admission)),
            local,
            pool: Arc::new(Mutex::new(HashMap::new())),
            outgoing: Mutex::new(Vec::new()),
        }
    }

    /// Accepts connections on `listener` for `host` until it shuts down.
    pub(crate) fn serve(&self, host: Arc<Host>, listener: TcpListener) {
        let (local, accepted) = (self.local.clone(), self.accepted.clone());
        host.handle
            .clone()
            .spawn(listen::listen(host, local, accepted, listener));
    }

    /// Closes every pooled connection; the next operation reconnects.
    pub(crate) fn close_all(&self, cause: &str) {
        lock(&self.pool).clear();
        let mut all = std::mem::take(&mut *lock(&self.outgoing));
        all.append(&mut self.accepted.take_all());
        for c in all.iter().filter_map(Weak::upgrade) {
            c.kill(cause.to_string());
        }
    }

    /// Requests in flight on this connector's connections, in both roles.
    pub(crate) fn pending(&self) -> usize {
        let all: Vec<_> = lock(&self.outgoing)
            .iter()
            .filter_map(Weak::upgrade)
            .chain(self.accepted.all())
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
            if !c.is_closing() && !stale {
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
        let c = match handshake::connect(&self.local, remote, stream == 0).await {
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
}

impl Transport for TcpTransport {
    fn kind(&self) -> TransportKind {
        TransportKind::Tcp
    }

    fn reaches(&self, _remote: &RdmaMetadata) -> bool {
        true
    }

    fn start(&self, mut job: ActiveJob) -> BoxFuture<'_, Result<Arc<dyn ActiveLink>>> {
        Box::pin(async move {
            let conn = self.conn_for(&job.remote, 0).await?;
            // Which lane, if any, carries it: the session's planner, from
            // the connection's lanes and both sides' memory
            // (`Session::lane_for`). Memory no lane carries moves in band,
            // each side staging its own GPU memory through host memory
            // (`staged.rs`), whatever the size.
            let local = job.region.mem();
            let remote = Mem::of(job.remote.descriptors().iter().any(|d| !d.device.is_cpu()));
            let (mut lane, caps) = {
                let s = lock(&conn.session);
                (s.lane_for(job.kind, local, remote), s.caps())
            };
            let mut prepared = None;
            if let Some(l) =
                lane.filter(|_| job.kind == OperationKind::Write && local == Mem::Device)
            {
                // This side lends its GPU memory: exported (CUDA IPC) or
                // registered (UCX) now, so that memory the lane will not
                // take moves staged instead (a READ's source falls back by
                // itself: `Session::lend_failed`).
                match conn.prepare_lent(l, &job.region) {
                    Ok(()) => prepared = Some(Ok(())),
                    Err(why) => {
                        Lanes::fell_back(l, &job.shared, &why);
                        lane = None;
                    }
                }
            }
            // A READ that will copy from the peer takes its copy slot
            // before it is planned (`stall.rs`). Where only this
            // connection's or this peer's share is in use, its lease waits
            // for one of that peer's own copies to end (cancellable:
            // `Conn::spawn_pull`); where the process has none free, no lane
            // can copy it now, and it moves in band at once, never waiting
            // behind copies another peer may be stalling.
            let mut slot = None;
            if lane.is_some() && job.kind == OperationKind::Read {
                match conn.copy_slot() {
                    Ok(s) => slot = Some(s),
                    Err(NoSlot::Connection | NoSlot::Peer) => {}
                    Err(why) => {
                        tracing::debug!(peer = conn.peer, "READ in band: {why}");
                        lane = None;
                    }
                }
            }
            let thresholds = Thresholds {
                pull_from: self.local.cma_threshold,
                stripe_from: self.local.stripe_threshold,
                streams: self.streams_to(&job.remote),
            };
            let memory = (local, remote);
            let plan = session::route(job.kind, &job.sizes, memory, lane, caps, &thresholds);
            // A slot is held only by a copy.
            let slot = slot.filter(|_| plan == Plan::Pull);
            if let Plan::Striped { parts } = plan {
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
            let pull = plan == Plan::Pull;
            let target =
                Target::active(job.region.clone(), job.shared.clone(), None).with_slot(slot);
            let params = OpenParams {
                kind: job.kind,
                op_id: job.remote.operation_id(),
                token: *job.remote.token(),
                // Not needed here any more: moved, not copied (a paged
                // operation has one per block).
                sizes: std::mem::take(&mut job.sizes),
                pull,
                lane: lane.filter(|_| pull),
                part: (0, 1),
            };
            let (req, start) =
                conn.with_session_prepared(prepared, |s| s.open(params, target.clone()));
            job.shared.start();
            job.shared.opened(None);
            // The reader drains the session after marking the connection
            // dead; check after opening so that no request is left behind.
            if !conn.is_alive() {
                conn.with_session(|s| {
                    s.forget(req);
                    s.unlend(req);
                });
                let cause = conn.dead.borrow().clone().unwrap_or_default();
                return Err(Error::ConnectionLost {
                    peer: conn.peer.clone(),
                    cause,
                });
            }
            let opened = Arc::new(watch::Sender::new(false));
            conn.begin(req, target, start, Some(opened.clone()));
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
    /// Over how many streams large transfers to `remote` go (see
    /// `ConnectorBuilder::tcp_streams`).
    fn streams_to(&self, remote: &RdmaMetadata) -> u16 {
        let streams = self
            .local
            .tcp_streams
            .unwrap_or(if remote.host_id() == self.local.host_id {
                1
            } else {
                self.local.streams_to_other_hosts
            });
        u16::try_from(streams).unwrap_or(u16::MAX)
    }

    /// Starts a transfer striped over `conns`, one part on each; part 0 (on
    /// the first) commits it once the destination has confirmed the others.
    fn start_striped(&self, job: ActiveJob, conns: Vec<Arc<Conn>>) -> Result<Arc<dyn ActiveLink>> {
        let parts = conns.len() as u16;
        let stripe = Stripe::new(parts, String::new());
        let mut reqs = Vec::with_capacity(conns.len());
        for (part, conn) in (0..parts).zip(&conns) {
            let target =
                Target::active(job.region.clone(), job.shared.clone(), Some(stripe.clone()));
            let params = OpenParams {
                kind: job.kind,
                op_id: job.remote.operation_id(),
                token: *job.remote.token(),
                sizes: job.sizes.clone(),
                pull: false,
                lane: None,
                part: (part, parts),
            };
            let (req, start) = conn.with_session(|s| s.open(params, target.clone()));
            let opened = Arc::new(watch::Sender::new(false));
            stripe.bind(part, conn.me.clone(), req, Some(opened.clone()));
            reqs.push((req, opened, target, start));
        }
        job.shared.start();
        job.shared.opened(None);
        // A reader drains its session after marking its connection dead;
        // check after opening so that no request is left behind.
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
        let (req0, opened0) = (reqs[0].0, reqs[0].1.clone());
        for (conn, (req, opened, target, start)) in conns.iter().zip(reqs) {
            conn.begin(req, target, start, Some(opened));
        }
        Ok(Arc::new(TcpLink {
            conn: conns[0].clone(),
            req: req0,
            opened: opened0,
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
