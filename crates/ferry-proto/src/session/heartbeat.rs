//! The session's side of liveness (see [`liveness`](super::liveness) for
//! the timing rules, which the driver runs): heartbeats are answered at
//! once, and a peer declared unresponsive is told why its requests end.

use super::{Fence, Session, Step};
use crate::wire::{AbortReason, Message};

impl<T: Fence> Session<T> {
    /// A heartbeat arrived: a `Ping` is answered at once, whatever is in
    /// progress here; a `Pong` asks for nothing.
    pub(super) fn on_heartbeat(&mut self, m: &Message) -> Step<T> {
        if matches!(m, Message::Ping) {
            self.reply(Message::Pong);
        }
        Step::Done
    }

    /// The peer was declared unresponsive (see
    /// [`liveness`](super::liveness)): tells it, where it can still hear,
    /// that every request in flight ends
    /// ([`AbortReason::PeerUnresponsive`], `detail` says after how long).
    /// The driver then ends them here and closes the connection
    /// ([`drain`](Self::drain)).
    pub fn unresponsive(&mut self, detail: &str) {
        let reqs: Vec<u64> = self.requests.keys().copied().collect();
        for req in reqs {
            self.abort(req, AbortReason::PeerUnresponsive, detail.to_string());
        }
    }
}
