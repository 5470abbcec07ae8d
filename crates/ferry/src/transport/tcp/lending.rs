//! What this connection's lanes are, and who its copies read from. Which
//! lane lends and pulls a region is the planner's answer, inside the
//! session (`ferry_proto::session`: `Session::lane_for`, and the lane each
//! `Lend` / `SendLease` names), from the lanes the connection agreed on
//! ([`Conn::agree_lanes`]); who a copy reads from is the registry's
//! (`transport::pull::lanes`). Nothing here chooses a lane.

use ferry_proto::lane::{LaneId, LaneSet};
use ferry_proto::session::Session;

use crate::region::Region;
use crate::transport::pull::LeaseBlob;
use crate::transport::stall::{CopySlot, NoSlot, PeerKey};

use super::conn::Conn;
use super::request::Target;
use super::util::lock;

impl Conn {
    /// Tells `session` the lanes this connection shares with its peer, as
    /// the registry finds them from what the lanes' exchanges proved and
    /// the session's caps: called once a lane settles, so that the
    /// session plans by them.
    pub(super) fn agree_lanes(&self, session: &mut Session<Target>) {
        let agreed = self.lanes.agreed(&self.peers.proven(&session.caps()));
        session.agree_lanes(agreed);
    }

    /// The lanes this connection shares with its peer (the session's).
    pub(super) fn agreed_lanes(&self) -> LaneSet {
        lock(&self.session).agreed_lanes().clone()
    }

    /// A slot for one copy from the peer, at once, or why there is none
    /// (see `stall.rs`): taken when the copy is planned (an active READ
    /// that will ask for a lease, a passive WRITE whose source lends), kept
    /// with its request until the copy ends. Never waits.
    pub(super) fn copy_slot(&self) -> Result<CopySlot, NoSlot> {
        self.copy_slots.try_acquire(self.copy_key())
    }

    /// Who this connection's copies read from (the registry's answer:
    /// `Peers::copy_peer`), or a key shared by every connection without a
    /// verified peer (which copies nothing: the session refuses a lease on
    /// it).
    pub(super) fn copy_key(&self) -> PeerKey {
        let hosts = self.tuple.get().map(|(a, p)| (a.ip(), p.ip()));
        self.peers
            .copy_peer(hosts)
            .unwrap_or(PeerKey::Process(0, [0; 16]))
    }

    /// What the peer needs to copy `region`: a lease by `lane`, the lane
    /// the session said lends it (registered when it was lent).
    pub(super) fn lease_of(&self, lane: LaneId, region: &Region) -> LeaseBlob {
        self.lanes.lend(lane, region)
    }
}
