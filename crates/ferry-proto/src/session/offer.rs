//! The order of the [`LaneOffer`] frames that set a lane up on a
//! connection, for both roles. The active side opens a lane's exchange
//! (round 0, [`Session::lane_open`]); the sides then answer each other,
//! one round at a time, until the lane's code on one side says the
//! exchange is over and what it proved ([`Session::lane_answered`] with a
//! [`LaneProof`]). Lanes are set up one at a time, in the order of their
//! ids, and none after one proved that a side can copy from the other.
//!
//! The session never reads a lane's bytes: the lane does, on each side
//! (cross-memory attach checks its cookie and the proof bytes the peer
//! echoes; UCX reaches the peer's worker). What the session keeps is
//! whose turn it is, and what each lane proved, which becomes the
//! connection's [`Caps`](super::Caps).

use super::{Fence, Role, Session, Step, Violation};
use crate::lane::{LaneId, LaneSet, Mem};
use crate::wire::{LaneOffer, Message};
use crate::OperationKind;

/// What a lane's exchange proved, as the lane found it on this side.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LaneProof {
    /// This side proved it can copy from the peer.
    pub can_pull: bool,
    /// The peer proved it can copy from this side (only its proof counts,
    /// never its word: the lane checks it).
    pub peer_pulls: bool,
    /// Both sides move device memory by this lane (or by the lanes that
    /// ride on its exchange: CUDA IPC on cross-memory attach's).
    pub device: bool,
    /// A lease by this lane ends only with the destination's `Finish` or
    /// `Release` (see [`Session::rdma_leases`]).
    pub release_leases: bool,
}

impl LaneProof {
    /// Whether either side may copy from the other.
    pub fn proves_any(&self) -> bool {
        self.can_pull || self.peer_pulls
    }
}

/// A lane's answer to the peer's offer.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LaneAnswer {
    /// The offer to send back (the next round), if any.
    pub bytes: Option<Vec<u8>>,
    /// The exchange is over here, having proved this.
    pub settled: Option<LaneProof>,
}

/// Where one lane's exchange stands on this side.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LaneState {
    /// Waiting for the peer's round `n`.
    Awaiting(u8),
    /// The peer's round `n` arrived; this side's lane is answering.
    Answering(u8),
    /// Over, having proved this.
    Settled(LaneProof),
}

/// The lanes of one connection: those whose offers this side answers, and
/// where each exchange stands, in the order they began.
#[derive(Debug, Clone, Default)]
pub(super) struct LaneStates {
    known: Vec<LaneId>,
    states: Vec<(LaneId, LaneState)>,
    /// The lanes the two sides share, as the driver found them once a
    /// lane settled ([`Session::agree_lanes`]): what lends and what pulls.
    pub(super) agreed: LaneSet,
}

impl LaneStates {
    fn get(&self, lane: LaneId) -> Option<LaneState> {
        self.states.iter().find(|s| s.0 == lane).map(|s| s.1)
    }

    fn set(&mut self, lane: LaneId, state: LaneState) {
        match self.states.iter_mut().find(|s| s.0 == lane) {
            Some(s) => s.1 = state,
            None => self.states.push((lane, state)),
        }
    }

    /// Whether lane `lane` may begin: no exchange in flight, none that
    /// proved anything, none of a later lane.
    fn may_begin(&self, lane: LaneId) -> bool {
        self.states
            .iter()
            .all(|&(id, s)| id < lane && matches!(s, LaneState::Settled(p) if !p.proves_any()))
    }
}

impl<T: Fence> Session<T> {
    /// The lanes whose offers this side answers (the build's lanes that
    /// set themselves up by [`LaneOffer`], enabled or not: a disabled one
    /// declines in its own bytes). An offer for another lane is
    /// [`Violation::UnknownLane`].
    pub fn set_lanes(&mut self, known: &[LaneId]) {
        self.lanes.known = known.to_vec();
    }

    /// The lanes this connection shares with its peer, narrowed to what
    /// the exchanges proved ([`LaneSet::agreed`]): the driver builds them
    /// from its lanes' caps once a lane settles, and the session plans by
    /// them from then on. None before: nothing is lent.
    pub fn agree_lanes(&mut self, lanes: LaneSet) {
        self.lanes.agreed = lanes;
    }

    /// The lanes this connection shares ([`agree_lanes`](Self::agree_lanes)).
    pub fn agreed_lanes(&self) -> &LaneSet {
        &self.lanes.agreed
    }

    /// The lane that carries an active operation of `kind` between this
    /// side's memory (`local`) and the peer's (`remote`), or `None` (in
    /// band): the planner's answer ([`super::lane_for`]) on this
    /// connection's lanes and caps.
    pub fn lane_for(&self, kind: OperationKind, local: Mem, remote: Mem) -> Option<LaneId> {
        super::lane_for(kind, local, remote, &self.lanes.agreed, self.caps)
    }

    /// The lane through which this side lends memory of kind `source` on
    /// this connection.
    pub(super) fn lending_lane(&self, source: Mem) -> Option<LaneId> {
        self.lanes.agreed.lending(source)
    }

    /// Where lane `lane`'s exchange stands (`None`: not begun).
    pub fn lane_state(&self, lane: LaneId) -> Option<LaneState> {
        self.lanes.get(lane)
    }

    /// The active side begins lane `lane`'s exchange with its offer
    /// `bytes`: the frame to send (round 0). `None` where this side is
    /// passive or the lane may not begin (see the module documentation).
    pub fn lane_open(&mut self, lane: LaneId, bytes: Vec<u8>) -> Option<Message> {
        if self.role != Role::Active || !self.lanes.may_begin(lane) {
            return None;
        }
        self.lanes.set(lane, LaneState::Awaiting(1));
        Some(Message::LaneOffer(LaneOffer {
            lane,
            round: 0,
            bytes,
        }))
    }

    pub(super) fn on_lane_offer(&mut self, o: LaneOffer) -> Result<Step<T>, Violation> {
        let out_of_turn = Violation::LaneOutOfTurn {
            lane: o.lane.0,
            round: o.round,
        };
        let next = match (self.lanes.get(o.lane), self.role) {
            (Some(LaneState::Awaiting(n)), _) if n == o.round => n,
            (None, Role::Passive) if o.round == 0 => {
                if !self.lanes.known.contains(&o.lane) {
                    return Err(Violation::UnknownLane { lane: o.lane.0 });
                }
                if !self.lanes.may_begin(o.lane) {
                    return Err(out_of_turn);
                }
                0
            }
            (None, _) if !self.lanes.known.contains(&o.lane) => {
                return Err(Violation::UnknownLane { lane: o.lane.0 })
            }
            _ => return Err(out_of_turn),
        };
        self.lanes.set(o.lane, LaneState::Answering(next));
        Ok(Step::LaneOffer {
            lane: o.lane,
            round: o.round,
            bytes: o.bytes,
        })
    }

    /// Lane `lane`'s code answered the peer's offer (see
    /// [`Step::LaneOffer`]): the frame to send, if any. Where `answer`
    /// settles the exchange, what it proved becomes this connection's:
    /// a lane that proved nothing leaves the caps as they were but for
    /// its word on device memory.
    pub fn lane_answered(&mut self, lane: LaneId, answer: LaneAnswer) -> Option<Message> {
        let Some(LaneState::Answering(n)) = self.lanes.get(lane) else {
            return None;
        };
        let round = n.checked_add(1);
        let state = match (answer.settled, round.and_then(|r| r.checked_add(1))) {
            (Some(p), _) => LaneState::Settled(p),
            (None, Some(after)) => LaneState::Awaiting(after),
            // No round left: the exchange proved nothing.
            (None, None) => LaneState::Settled(LaneProof::default()),
        };
        self.lanes.set(lane, state);
        if let LaneState::Settled(p) = state {
            self.settle(p);
        }
        let round = round?;
        answer
            .bytes
            .map(|bytes| Message::LaneOffer(LaneOffer { lane, round, bytes }))
    }

    fn settle(&mut self, p: LaneProof) {
        self.caps.device = p.device;
        if p.proves_any() {
            self.caps.attach = true;
            self.caps.can_pull = p.can_pull;
            self.caps.peer_pulls = p.peer_pulls;
            if p.release_leases {
                self.rdma_leases = true;
            }
        }
    }
}
