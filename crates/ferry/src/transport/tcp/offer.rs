//! Claims on offers: the driver's part. It carries a worker's
//! [`OfferClaim`] to the offer's owner and the owner's [`OfferReply`]
//! back, one round trip; what a claim gets is decided by the owner's offer
//! table (`crate::grant`, with `ferry_proto::grant::claim`), never here.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ferry_proto::grant::GrantError;
use ferry_proto::wire::{Message, OfferAnswer, OfferClaim, OfferReply};
use ferry_proto::RdmaMetadata;
use tokio::sync::oneshot;

use crate::grant::OfferTable;
use crate::{Error, Result};

use super::conn::Conn;
use super::TcpTransport;

/// How long a claimer waits for the owner's reply (the owner makes a
/// grant: a control page, a thread; a replaced grant is revoked first).
const REPLY_TIMEOUT: Duration = Duration::from_secs(30);

type Waiting = HashMap<u64, oneshot::Sender<OfferAnswer>>;

/// A connection's claims waiting for their replies (claimer side).
#[derive(Default)]
pub(crate) struct ClaimCalls {
    next: AtomicU64,
    waiting: Mutex<Waiting>,
}

impl ClaimCalls {
    fn lock(&self) -> std::sync::MutexGuard<'_, Waiting> {
        self.waiting.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Hands reply `r` to its waiter; one nobody waits for is dropped.
    pub(super) fn deliver(&self, r: OfferReply) {
        if let Some(tx) = self.lock().remove(&r.req) {
            let _ = tx.send(r.answer);
        }
    }

    /// The connection ended: every waiter learns it.
    pub(super) fn fail_all(&self) {
        self.lock().clear();
    }
}

struct Forget<'a>(&'a Arc<Conn>, u64);

impl Drop for Forget<'_> {
    fn drop(&mut self) {
        self.0.claims.lock().remove(&self.1);
    }
}

impl TcpTransport {
    /// Sends claim `c` (its number is set here) to the owner `remote` over
    /// the pooled connection, and waits for the answer.
    pub(crate) async fn offer_call(
        &self,
        remote: &RdmaMetadata,
        mut c: OfferClaim,
    ) -> Result<OfferAnswer> {
        let conn = self.conn_for(remote, 0).await?;
        c.req = conn.claims.next.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        conn.claims.lock().insert(c.req, tx);
        let _forget = Forget(&conn, c.req);
        let lost = |conn: &Arc<Conn>| Error::ConnectionLost {
            peer: conn.peer.clone(),
            cause: conn.dead.borrow().clone().unwrap_or_default(),
        };
        if !conn.is_alive() {
            return Err(lost(&conn));
        }
        conn.touch();
        conn.send_soon(Message::OfferClaim(c).to_vec(), None, false);
        match tokio::time::timeout(REPLY_TIMEOUT, rx).await {
            Ok(Ok(answer)) => Ok(answer),
            Ok(Err(_)) => Err(lost(&conn)),
            Err(_) => Err(Error::PeerUnresponsive {
                peer: conn.peer.clone(),
                after: REPLY_TIMEOUT,
            }),
        }
    }
}

/// Serves a worker's claim on an accepted connection (owner side), in a
/// task of its own (the owner makes the grant, and may first revoke the
/// one the worker had), and sends the reply. The grant is bound to the
/// connection's peer, as its handshake authenticated it.
pub(super) fn serve(conn: &Arc<Conn>, offers: &Arc<OfferTable>, c: OfferClaim) {
    let (conn, offers) = (conn.clone(), offers.clone());
    conn.handle.clone().spawn(async move {
        let reply = offers.claim(&conn.peer, c).await;
        let forged = matches!(
            reply.answer,
            OfferAnswer::Refused(GrantError::Forged { .. })
        );
        if !forged {
            conn.prove();
            conn.touch();
        }
        conn.send_soon(Message::OfferReply(reply).to_vec(), None, true);
    });
}
