//! The checks of `session_fuzz.rs` (which includes this file): each step
//! and action the sessions hand the honest driver, against the driver's
//! model of each side.
//!
//! Whatever the script: nothing panics; each `Err` is a [`Violation`] with
//! the documented reason, that queued nothing but (for an authentication
//! violation) the `Abort` that tells the peer; and the session never hands
//! the driver more than the request's grant allows:
//!
//! - every `Step::Payload` is for a live request that this side receives,
//!   names that request's handle and exactly the frame's place, lies inside
//!   the descriptors the driver granted (`bound`) or asked for (`open`) and
//!   inside the request's part, and continues the bytes already landed
//!   (in order: no byte twice, no gap);
//! - a `Stream` covers exactly the granted bytes, ending as its part
//!   requires; a `Pull` only for a receiving request, with the lease's
//!   shape; a `SendLease` only of lent memory;
//! - `Commit` of received bytes only once every byte of the request landed
//!   (part 0: once the fence says every other part is done); `Complete`
//!   only of a sealed operation; `PartDone` only of a part other than 0
//!   that landed (or, at its source, was all sent), once;
//! - each request ends at most once (`Commit`, `Complete`, `RemoteAbort`,
//!   `forget`, or the end of the connection), memory is given back only if
//!   lent, and `drain` hands back exactly the memory still lent and only
//!   requests that did not end.

use super::*;

/// The variant's name, by an exhaustive match.
pub fn variant(v: &Violation) -> &'static str {
    match v {
        Violation::UnexpectedHello => "UnexpectedHello",
        Violation::UnexpectedAuth => "UnexpectedAuth",
        Violation::AuthWithoutSecret => "AuthWithoutSecret",
        Violation::UnknownLane { .. } => "UnknownLane",
        Violation::LaneOutOfTurn { .. } => "LaneOutOfTurn",
        Violation::OpenToActiveSide => "OpenToActiveSide",
        Violation::RequestNumberInUse(_) => "RequestNumberInUse",
        Violation::UnexpectedData { .. } => "UnexpectedData",
        Violation::DataOutOfOrder(_) => "DataOutOfOrder",
        Violation::FinishBeforeAllData { .. } => "FinishBeforeAllData",
        Violation::PartFinishedEarly { .. } => "PartFinishedEarly",
        Violation::PartConfirmedBeforeSent { .. } => "PartConfirmedBeforeSent",
        Violation::FinishBeforeCopyEnded { .. } => "FinishBeforeCopyEnded",
        Violation::FinishBeforeLease { .. } => "FinishBeforeLease",
        Violation::LeaseWithoutAttach => "LeaseWithoutAttach",
        Violation::UnaskedLease { .. } => "UnaskedLease",
        Violation::LeaseShapeMismatch { .. } => "LeaseShapeMismatch",
        // `Violation` is non-exhaustive outside its crate.
        _ => "other",
    }
}

pub(super) fn action_name<T>(a: &Action<T>) -> &'static str {
    match a {
        Action::Send { .. } => "Send",
        Action::Stream { .. } => "Stream",
        Action::Via { .. } => "Via",
        Action::Lend { .. } => "Lend",
        Action::SendLease { .. } => "SendLease",
        Action::GiveBack { .. } => "GiveBack",
        Action::Pull { .. } => "Pull",
        Action::PartDone { .. } => "PartDone",
        Action::Commit { .. } => "Commit",
        Action::Complete { .. } => "Complete",
        Action::RemoteAbort { .. } => "RemoteAbort",
    }
}

impl Grant {
    /// Checks that `(desc, offset, len)` starts inside the grant, lies in
    /// its part, and continues at `next`; returns its end.
    pub(super) fn check_chunk(
        &self,
        desc: u32,
        offset: u64,
        len: u32,
        next: u128,
        what: &str,
    ) -> u128 {
        let d = desc as usize;
        assert!(len > 0, "{what}: empty chunk");
        assert!(
            d < self.sizes.len(),
            "{what}: descriptor {desc} of {:?}",
            self.sizes
        );
        // A chunk starts inside its descriptor and may run on into the
        // ones that follow (protocol 7), never past the part.
        assert!(
            offset < self.sizes[d],
            "{what}: ({desc}, {offset}, {len}) starts past descriptor of {}",
            self.sizes[d]
        );
        let flat = self.flat(desc, offset);
        assert_eq!(flat, next, "{what}: ({desc}, {offset}, {len}) out of order");
        assert!(
            flat >= self.start && flat + u128::from(len) <= self.end,
            "{what}: ({desc}, {offset}, {len}) outside the part [{}, {})",
            self.start,
            self.end
        );
        flat + u128::from(len)
    }
}

impl Harness<'_> {
    pub(super) fn feed(&mut self, i: usize, msg: Message) {
        self.stats.frames += 1;
        let data = match &msg {
            Message::Data(d) => Some(*d),
            _ => None,
        };
        let open = match &msg {
            Message::Open(o) => Some(o.clone()),
            _ => None,
        };
        let offered = match &msg {
            Message::LaneOffer(o) => Some(o.clone()),
            _ => None,
        };
        let step = self.ends[i].s.handle_frame(msg);
        match step {
            Ok(Step::Done) => {}
            Ok(Step::Payload {
                target,
                desc,
                offset,
                len,
            }) => {
                let d = data.expect("a payload step for a frame that is not data");
                assert_eq!((desc, offset, len), (d.desc, d.offset, d.len));
                let g = self.ends[i].grant(d.req, &target, "a payload");
                assert!(g.dest, "a payload for request {}, which sends", d.req);
                let next = g.check_chunk(desc, offset, len, g.next, "a payload");
                self.ends[i].grants.get_mut(&d.req).unwrap().next = next;
                self.stats.payloads += 1;
            }
            Ok(Step::Verify { req, .. }) => {
                panic!("a digest to verify for request {req}, but no digest was fed")
            }
            Ok(Step::Discard { len }) => {
                let d = data.expect("a discard step for a frame that is not data");
                assert_eq!(len, d.len);
                self.stats.discards += 1;
            }
            Ok(Step::CheckGrant(o)) => {
                assert_eq!(i, PASSIVE, "an open checked at the active side");
                assert_eq!(Some(&o), open.as_ref());
                self.grant(o);
            }
            // Grant frames are handed on, by role, and change nothing.
            Ok(Step::ServeGrant(_)) => assert_eq!(i, PASSIVE, "a grant request served actively"),
            Ok(Step::GrantReply(_)) => assert_ne!(i, PASSIVE, "a grant reply to the passive side"),
            // So are offer claims and their replies.
            Ok(Step::ServeClaim(_)) => assert_eq!(i, PASSIVE, "an offer claim served actively"),
            Ok(Step::OfferReply(_)) => assert_ne!(i, PASSIVE, "an offer reply to the passive side"),
            Ok(Step::LaneOffer { lane, round, bytes }) => {
                // Only the passive side answers offers it did not ask for
                // (the active side here opens none).
                assert_eq!(i, PASSIVE);
                let o = offered.expect("a lane step for a frame that is not an offer");
                assert_eq!((lane, round, &bytes), (o.lane, o.round, &o.bytes));
                assert!(LANES[..2].contains(&lane), "an unknown lane answered");
                let settled = self.input.bit().then(|| LaneProof {
                    can_pull: self.input.bit(),
                    peer_pulls: self.input.bit(),
                    device: self.input.bit(),
                    release_leases: self.input.bit(),
                });
                let bytes = self.input.bit().then(|| vec![7; 4]);
                let e = &mut self.ends[i];
                let before = e.s.caps();
                let answer = LaneAnswer {
                    bytes: bytes.clone(),
                    settled,
                };
                let m = e.s.lane_answered(lane, answer);
                // The answer is the next round, of the same lane.
                match (&m, &bytes) {
                    (Some(Message::LaneOffer(a)), Some(b)) => {
                        assert_eq!((a.lane, a.round, &a.bytes), (lane, round + 1, b));
                    }
                    (None, None) => {}
                    (None, Some(_)) => assert_eq!(round, u8::MAX),
                    other => panic!("{other:?}"),
                }
                // What a lane proved becomes the connection's; a lane that
                // proved nothing changes only its word on device memory.
                let caps = e.s.caps();
                match settled {
                    Some(p) if p.can_pull || p.peer_pulls => {
                        assert!(caps.attach);
                        assert_eq!((caps.can_pull, caps.peer_pulls), (p.can_pull, p.peer_pulls));
                        assert_eq!(caps.device, p.device);
                    }
                    Some(p) => {
                        assert_eq!(
                            caps,
                            Caps {
                                device: p.device,
                                ..before
                            }
                        );
                    }
                    None => assert_eq!(caps, before),
                }
                e.caps = caps;
                drop(m);
            }
            Err(v) => return self.violation(i, v),
        }
        self.pump(i);
    }

    fn violation(&mut self, i: usize, v: Violation) {
        let told = matches!(v, Violation::UnexpectedAuth | Violation::AuthWithoutSecret);
        assert_eq!(v.is_told(), told, "{v:?}");
        let reason = if told {
            AbortReason::Unauthenticated
        } else {
            AbortReason::Protocol
        };
        assert_eq!(v.abort_reason(), reason, "{v:?}");
        assert!(!v.to_string().is_empty());
        let queued: Vec<_> = std::iter::from_fn(|| self.ends[i].s.poll_action()).collect();
        if told {
            assert_eq!(queued.len(), 1, "{v:?}");
            match &queued[0] {
                Action::Send {
                    msg: Message::Abort(a),
                    reply: true,
                } => {
                    assert_eq!((a.req, a.reason), (0, AbortReason::Unauthenticated));
                    assert_eq!(a.detail, v.to_string());
                }
                other => panic!("{v:?} queued {}", action_name(other)),
            }
        } else {
            let names: Vec<_> = queued.iter().map(action_name).collect();
            assert!(names.is_empty(), "{v:?} left {names:?} queued");
        }
        *self.stats.violations.entry(variant(&v)).or_default() += 1;
        self.lose_connection();
    }

    pub(super) fn act(&mut self, i: usize, a: Action<T>) {
        *self.stats.actions.entry(action_name(&a)).or_default() += 1;
        let e = &mut self.ends[i];
        match a {
            Action::Send { msg, .. } => {
                // A lane's exchange is the lanes' own, never an action.
                assert!(!matches!(msg, Message::LaneOffer(_)));
                self.send(i, msg);
            }
            Action::Stream {
                req,
                target,
                cursor,
                last,
            } => self.stream(i, req, target, cursor, last),
            Action::Via { target, .. } => {
                e.by_id(target.id(), "Via");
            }
            Action::Lend { req, target, .. } => {
                let (_, g) = e.by_id(target.id(), "Lend");
                assert!(!g.dest, "lends memory it receives into");
                if self.input.u8() % 8 == 0 {
                    // The driver could not lend it (an export failed):
                    // nothing is lent; a request the session cannot move
                    // otherwise ends with the connection.
                    if e.s.lend_failed(req, "fuzz") {
                        *self.stats.actions.entry("LendFellBack").or_default() += 1;
                    } else {
                        *self.stats.actions.entry("LendFailed").or_default() += 1;
                        self.lose_connection();
                    }
                    return;
                }
                assert!(e.lent.insert(target.id()), "lent twice");
            }
            Action::SendLease { req, target, .. } => {
                let g = e.grant(req, &target, "SendLease");
                assert!(e.lent.contains(&target.id()), "a lease of memory not lent");
                let segments = lease_of(&g.sizes);
                self.send(
                    i,
                    Message::Lease(Lease {
                        lane: ferry_proto::lane::LaneId::CMA,
                        req,
                        segments: segments.into(),
                        key: vec![],
                    }),
                );
            }
            Action::GiveBack { target } => {
                assert!(e.lent.remove(&target.id()), "gives back memory not lent");
            }
            Action::Pull {
                req,
                target,
                segments,
                ..
            } => {
                let g = e.grant(req, &target, "Pull");
                assert!(g.dest, "pulls into a request that sends");
                assert!(segments.iter().map(|s| s.1).eq(g.sizes.iter().copied()));
                e.jobs.push(Job::Pull { req, target });
            }
            Action::PartDone { target } => {
                let (_, g) = e.by_id(target.id(), "PartDone");
                assert!(
                    matches!(g.part, Some(p) if p != 0),
                    "PartDone of {:?}",
                    g.part
                );
                if g.dest {
                    assert_eq!(g.next, g.end, "a part done before its bytes landed");
                } else {
                    assert!(g.sent, "a part done before it was sent");
                }
                assert!(e.parts_done.insert(target.id()), "a part done twice");
            }
            Action::Commit { req, target, lent } => {
                let g = e.grant(req, &target, "Commit");
                if lent {
                    assert!(!g.dest, "commits lent memory it received into");
                } else {
                    assert!(g.dest, "commits received bytes of a request that sends");
                    assert_eq!(g.next, g.end, "a commit before every byte landed");
                    if g.part.is_some() {
                        assert_eq!(g.part, Some(0), "a commit on a part other than 0");
                        assert!(target.can_commit(), "part 0 commits before the others");
                    }
                }
                self.ended_here(i, target.id());
                let m = if target.is_open() {
                    target.0.open.set(false);
                    if lent {
                        target.0.sealed.set(true);
                    }
                    Message::Finish { req }
                } else {
                    Message::Abort(Abort {
                        req,
                        reason: AbortReason::Cancelled,
                        detail: String::new(),
                    })
                };
                self.send(i, m);
            }
            Action::Complete { target } => {
                assert!(target.is_sealed(), "complete, not sealed");
                e.by_id(target.id(), "Complete");
                target.0.open.set(false);
                self.ended_here(i, target.id());
            }
            Action::RemoteAbort { target, .. } => {
                e.by_id(target.id(), "RemoteAbort");
                target.0.open.set(false);
                self.ended_here(i, target.id());
            }
        }
    }

    pub(super) fn stream(&mut self, i: usize, req: u64, target: T, cursor: Cursor, last: Last) {
        let e = &mut self.ends[i];
        let g = e.grant(req, &target, "Stream").clone();
        assert!(!g.dest, "streams a request that receives");
        assert_eq!(cursor.sizes(), &g.sizes[..]);
        let want = match g.part {
            None => Last::Seal,
            Some(0) => Last::SealAfterParts,
            Some(_) => Last::Part,
        };
        assert_eq!(last, want);
        let chunk = match self.input.u8() {
            255 => MAX_CHUNK,
            b => 1 + u32::from(b % 16),
        };
        let next = g.start;
        self.ends[i].jobs.push(Job::Stream {
            req,
            target,
            cursor,
            last,
            chunk,
            next,
            grant: g,
        });
    }

    /// The connection ends: both sessions hand back what they hold.
    pub(super) fn lose_connection(&mut self) {
        self.stats.connections += 1;
        for i in [ACTIVE, PASSIVE] {
            let e = &mut self.ends[i];
            let (reqs, lent) = e.s.drain();
            assert_eq!(e.s.pending(), 0);
            assert!(e.s.poll_action().is_none());
            let lent: BTreeSet<u32> = lent.iter().map(T::id).collect();
            assert_eq!(lent, e.lent, "drain hands back the memory still lent");
            let mut seen = BTreeSet::new();
            for t in &reqs {
                assert!(seen.insert(t.id()), "drained twice");
                assert!(!self.ended.contains(&t.id()), "drained after it ended");
                e.by_id(t.id(), "drain");
            }
            for g in e.grants.values() {
                g.target.0.open.set(false);
            }
            self.ended.extend(seen);
            let role = if i == ACTIVE {
                Role::Active
            } else {
                Role::Passive
            };
            *e = End::new(role, e.caps);
        }
    }
}
