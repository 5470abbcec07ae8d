//! The listener and the passive side's handshake.

use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use ferry_proto::session::{Caps, Role, Session};
use ferry_proto::wire::{self, Abort, AbortReason, Auth, Expect, FrameType, Hello, Message};
use tokio::net::TcpListener;

use crate::auth::Secret;
use crate::metrics::ConnMeter;
use crate::transport::admission::{Activity, Admission, Grouping};
use crate::transport::api::{Config, Host};
use crate::transport::pull::exchange::OFFERED;
use crate::Result;

use super::conn::*;
use super::conn_io::*;
use super::error::ConnError;
use super::reader::*;
use super::secure;
use super::util::*;

/// The accepted connections: their places (see `admission.rs`) and who
/// they are, for `close_all` and `pending`.
pub(super) struct Accepted {
    admission: Admission,
    conns: Mutex<Vec<Weak<Conn>>>,
}

impl Accepted {
    pub(super) fn new(max_connections: usize, grouping: Grouping) -> Self {
        Accepted {
            admission: Admission::new(max_connections, grouping),
            conns: Mutex::new(Vec::new()),
        }
    }

    fn track(&self, c: &Arc<Conn>) {
        let mut v = lock(&self.conns);
        v.retain(|w| w.strong_count() > 0);
        v.push(Arc::downgrade(c));
    }

    /// Every accepted connection still open.
    pub(super) fn all(&self) -> Vec<Arc<Conn>> {
        lock(&self.conns).iter().filter_map(Weak::upgrade).collect()
    }

    /// Forgets them all (to close them).
    pub(super) fn take_all(&self) -> Vec<Weak<Conn>> {
        std::mem::take(&mut *lock(&self.conns))
    }
}

/// Accepts connections until the connector shuts down.
pub(super) async fn listen(
    host: Arc<Host>,
    cfg: Arc<Config>,
    accepted: Arc<Accepted>,
    listener: TcpListener,
) {
    let mut shutdown = host.shutdown.clone();
    let inner = Arc::new(Served {
        host,
        cma: cfg.cma,
        digest: cfg.digest,
        // Declined on connections that cannot be trusted with UCX.
        ucx: cfg.ucx.clone().filter(|_| cfg.ucx_trusted),
        ucx_emulated_rma: cfg.ucx_emulated_rma,
        lanes: cfg.lanes,
    });
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
        let Some(ticket) = accepted.admission.admit(addr.ip()) else {
            tracing::debug!(%addr, "refused a connection: every place is held by a live operation");
            continue;
        };
        let (accepted, cfg) = (accepted.clone(), cfg.clone());
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
                    worker_id: inner.host.worker_id.clone(),
                })
                .to_vec();
                w.write_all(&hello).await.map_err(|e| e.to_string())?;
                if let Some(secret) = &inner.host.secret {
                    authenticate(secret, &mut rd, &mut w, &peer, &hello).await?;
                    // A flood that cannot authenticate no longer evicts it.
                    ticket.authenticated();
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
            let caps = Caps {
                attach: inner.cma,
                secret: inner.host.secret.is_some(),
                ..Caps::default()
            };
            let mut session = Session::new(Role::Passive, caps);
            session.set_digest(inner.digest);
            session.set_lanes(&OFFERED);
            let conn = Conn::new(peer, w, inner.host.handle.clone(), session, inner.lanes);
            // Closed if it must make room while it carries no live
            // operation (see `admission.rs`).
            let weak = Arc::downgrade(&conn);
            tokio::spawn(async move {
                if evicted.wait_for(|e| *e).await.is_ok() {
                    if let Some(c) = weak.upgrade() {
                        c.kill(
                            "closed to make room for other peers: it carried no live operation"
                                .into(),
                        );
                    }
                }
            });
            ticket.watch(Arc::downgrade(&conn) as Weak<dyn Activity>);
            let _ = conn.ticket.set(ticket);
            if let (Ok(act), Ok(pas)) = tuple {
                let _ = conn.tuple.set((act, pas));
            }
            accepted.track(&conn);
            let idle = (cfg.idle_timeout, cfg.liveness);
            let meter = ConnMeter::new(&cfg.metrics, true);
            run_connection(conn, rd, shutdown, Some(inner), idle, meter).await;
        });
    }
}

/// The passive side of the handshake of the secure channel (see
/// `secure.rs`); `mine`: the `Hello` this side sent. On failure the remote
/// is told why, and the connection must be closed.
pub(super) async fn authenticate(
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
    // Only an `Auth` is decoded here: any other frame is refused from its
    // header (an `Open` is told by its request number, read alone).
    let auth = rd.next_expecting(Expect::AUTH);
    let theirs = match tokio::time::timeout(HANDSHAKE_TIMEOUT, auth).await {
        Ok(Ok(Message::Auth(a))) => a,
        Ok(Err(ConnError::Unexpected(FrameType::Open, Some(req)))) => {
            return refuse(
                w,
                req,
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
