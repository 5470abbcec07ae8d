//! What this connection's lanes are, and who its copies read from. Which
//! lane lends and pulls a region is the planner's answer
//! (`ferry_proto::session`), from the lanes the connection agreed on
//! ([`Conn::lanes`]); the lane itself is reached through the registry
//! (`transport::pull::lanes`).

use ferry_proto::lane::{LaneId, LaneSet};
use ferry_proto::session::Caps;

use crate::kind::TransportKind;
use crate::region::Region;
use crate::transport::pull::lanes::Lanes;
use crate::transport::pull::LeaseBlob;
use crate::transport::stall::{CopySlot, NoSlot, PeerKey};

use super::conn::Conn;

impl Conn {
    /// The lanes this connection shares with its peer, where the session
    /// found `caps`.
    pub(super) fn lanes(&self, caps: Caps) -> LaneSet {
        self.lanes.agreed(&self.peers.proven(&caps))
    }

    /// The lane that lends `region` on this connection (with `caps`).
    pub(super) fn lending_lane(&self, region: &Region, caps: Caps) -> Option<LaneId> {
        self.lanes(caps).lending(region.mem())
    }

    /// The transport that lent bytes of `region` travel by on this
    /// connection (a destination learns it from the lease:
    /// `OpShared::moved_by`).
    pub(super) fn lending_kind(&self, region: &Region, caps: Caps) -> TransportKind {
        self.lending_lane(region, caps)
            .map_or(TransportKind::Tcp, Lanes::kind)
    }

    /// Who this connection's copies read from, for the copy shares
    /// (`stall.rs`): the process that passed the attach probe, or, where a
    /// lane reaches the network, the two hosts' addresses; `None` where
    /// this side copies nothing.
    fn copy_peer(&self) -> Option<PeerKey> {
        // Which lanes, not what memory they move, says how far they reach.
        if self.lanes(Caps::default()).reaches_network() {
            let (a, p) = self.tuple.get()?;
            let (a, p) = (a.ip().to_canonical(), p.ip().to_canonical());
            return Some(PeerKey::Hosts(a.min(p), a.max(p)));
        }
        let (pid, image) = self.peers.process.get()?.identity();
        Some(PeerKey::Process(pid, image))
    }

    /// A slot for one copy from the peer, at once, or why there is none
    /// (see `stall.rs`): taken when the copy is planned (an active READ
    /// that will ask for a lease, a passive WRITE whose source lends), kept
    /// with its request until the copy ends. Never waits.
    pub(super) fn copy_slot(&self) -> Result<CopySlot, NoSlot> {
        self.copy_slots.try_acquire(self.copy_key())
    }

    /// [`copy_peer`](Self::copy_peer), or a key shared by every connection
    /// without a verified peer (which copies nothing: the session refuses
    /// a lease on it).
    pub(super) fn copy_key(&self) -> PeerKey {
        self.copy_peer().unwrap_or(PeerKey::Process(0, [0; 16]))
    }

    /// What the peer needs to copy `region`: a lease by the lane that lends
    /// it on this connection (with `caps`; it was registered when it was
    /// lent).
    pub(super) fn lease_of(&self, region: &Region, caps: Caps) -> LeaseBlob {
        // Lent means a lane lends it; addresses alone otherwise (the
        // destination refuses a lane it did not agree on).
        let lane = self.lending_lane(region, caps).unwrap_or(LaneId::CMA);
        self.lanes.lend(lane, region)
    }
}
