//! Grants served over TCP: the driver's part. It carries a holder's
//! [`GrantRequest`]s to the owner and the owner's [`GrantReply`]s back,
//! one round trip each; what a request may do is decided by the owner's
//! grant table (`crate::grant`, with `ferry_proto::grant::serve`), never
//! here.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ferry_proto::wire::{GrantAnswer, GrantReply, GrantRequest, Message};
use ferry_proto::RdmaMetadata;
use tokio::sync::oneshot;

use crate::grant::GrantTable;
use crate::{Error, Result};

use super::conn::Conn;
use super::TcpTransport;

/// How long a holder waits for the owner's reply to one request (at most
/// a megabyte each way) before it takes the owner for unresponsive.
const REPLY_TIMEOUT: Duration = Duration::from_secs(30);

/// Requests of at least this many bytes are served on a blocking thread,
/// so that the connection's reader goes on meanwhile; smaller ones in
/// place (a copy of a few pages is shorter than a hand-over).
const SERVE_INLINE_MAX: u32 = 256 * 1024;

/// A connection's grant requests waiting for their replies (holder side).
#[derive(Default)]
pub(crate) struct GrantCalls {
    next: AtomicU64,
    waiting: Mutex<HashMap<u64, oneshot::Sender<GrantAnswer>>>,
}

impl GrantCalls {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, oneshot::Sender<GrantAnswer>>> {
        self.waiting.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Hands reply `r` to its waiter; a reply nobody waits for (its
    /// caller gave up) is dropped.
    pub(super) fn deliver(&self, r: GrantReply) {
        if let Some(tx) = self.lock().remove(&r.req) {
            let _ = tx.send(r.answer);
        }
    }

    /// The connection ended: every waiter learns it.
    pub(super) fn fail_all(&self) {
        self.lock().clear();
    }
}

impl TcpTransport {
    /// Sends request `req` (its number is set here) to the owner `remote`
    /// over the pooled connection, and waits for the answer.
    pub(crate) async fn grant_call(
        &self,
        remote: &RdmaMetadata,
        mut req: GrantRequest,
    ) -> Result<GrantAnswer> {
        let conn = self.conn_for(remote, 0).await?;
        req.req = conn.grants.next.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        conn.grants.lock().insert(req.req, tx);
        let id = req.req;
        // Forget the waiter however this call ends (a dropped future too).
        let _forget = Forget(&conn, id);
        if !conn.is_alive() {
            let cause = conn.dead.borrow().clone().unwrap_or_default();
            return Err(Error::ConnectionLost {
                peer: conn.peer.clone(),
                cause,
            });
        }
        // Grant requests are no session operations: they keep the
        // connection from counting as idle themselves.
        conn.touch();
        conn.send_soon(Message::GrantRequest(req).to_vec(), None, false);
        match tokio::time::timeout(REPLY_TIMEOUT, rx).await {
            Ok(Ok(answer)) => {
                conn.touch();
                Ok(answer)
            }
            Ok(Err(_)) => {
                let cause = conn.dead.borrow().clone().unwrap_or_default();
                Err(Error::ConnectionLost {
                    peer: conn.peer.clone(),
                    cause,
                })
            }
            Err(_) => Err(Error::PeerUnresponsive {
                peer: conn.peer.clone(),
                after: REPLY_TIMEOUT,
            }),
        }
    }
}

struct Forget<'a>(&'a Arc<Conn>, u64);

impl Drop for Forget<'_> {
    fn drop(&mut self) {
        self.0.grants.lock().remove(&self.1);
    }
}

/// Serves a holder's request on an accepted connection (owner side) and
/// sends the reply: in place when small, else on a blocking thread while
/// the reader goes on.
pub(super) fn serve(conn: &Arc<Conn>, grants: &Arc<GrantTable>, req: GrantRequest) {
    if req.len < SERVE_INLINE_MAX {
        let reply = grants.serve(&conn.peer, req);
        answer(conn, reply);
        return;
    }
    let (conn, grants) = (conn.clone(), grants.clone());
    conn.handle.clone().spawn(async move {
        let peer = conn.peer.clone();
        let id = req.req;
        let reply = tokio::task::spawn_blocking(move || grants.serve(&peer, req))
            .await
            .unwrap_or_else(|e| GrantReply {
                req: id,
                answer: GrantAnswer::Refused(ferry_proto::grant::GrantError::Copy(e.to_string())),
            });
        answer(&conn, reply);
    });
}

/// Sends the reply. A request that named a grant under its token proved
/// the connection (it is not closed to make room for others, like one
/// that presented an operation's capability) and keeps it from counting
/// as idle.
fn answer(conn: &Arc<Conn>, reply: GrantReply) {
    let forged = matches!(
        reply.answer,
        GrantAnswer::Refused(ferry_proto::grant::GrantError::Forged { .. })
    );
    if !forged {
        conn.prove();
        conn.touch();
    }
    conn.send_soon(Message::GrantReply(reply).to_vec(), None, true);
}
