//! The opt-in integrity check (see [`Digest`]): which side digests the
//! bytes of a request and which compares, when a digest must have arrived,
//! and what a difference ends.
//!
//! The side that sends the first `Finish` of a request (an in-band source,
//! a destination that copied lent memory) sends its [`Digest`] right
//! before it when its check is on ([`Session::set_digest`]). The side that
//! receives that `Finish` (an in-band destination, a lending source) is
//! the one that compares: a `Digest` that arrived is always compared
//! (the peer asked for the check by sending it), and where this side's
//! check is on, a `Finish` without one is a violation
//! ([`Violation::MissingDigest`]). The comparison needs this side's digest
//! of the same bytes, which the driver computes outside the session's lock
//! ([`Step::Verify`], then [`Session::verified`]); a difference ends the
//! request on both sides with [`AbortReason::DigestMismatch`], before the
//! destination commits: its memory is never reported complete.

use super::{Fence, Path, Request, Session, Side, Step, Violation};
use crate::wire::{AbortReason, Digest, Message};

/// Where a request stands in the integrity check.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) enum DigestState {
    /// No `Digest` from the peer (yet).
    #[default]
    Absent,
    /// The peer's digest arrived (`None`: it could not read the bytes).
    Received(Option<u32>),
    /// Compared (or left unchecked, where a side could not read the bytes):
    /// the `Finish` goes on as without a digest.
    Verified,
}

/// Whether this side compares the digest of request `r`: it receives the
/// request's first `Finish` (an in-band destination, a lending source).
fn compares<T>(r: &Request<T>) -> bool {
    matches!(
        (r.side, r.path),
        (_, Path::Lent) | (Side::Destination, Path::InBand | Path::Requested)
    )
}

impl<T: Fence> Session<T> {
    /// Turns this side's integrity check on or off (off by default): on, it
    /// sends a [`Digest`] before each first `Finish` it sends
    /// ([`pull_ended_digest`](Self::pull_ended_digest); the driver's
    /// streams), and requires one before each first `Finish` it receives.
    pub fn set_digest(&mut self, on: bool) {
        self.digest = on;
    }

    /// Whether this side's integrity check is on.
    pub fn digests(&self) -> bool {
        self.digest
    }

    pub(super) fn on_digest(&mut self, d: Digest) -> Result<Step<T>, Violation> {
        let Some(r) = self.requests.get_mut(&d.req) else {
            // Ended here meanwhile: its `Finish` is ignored too.
            return Ok(Step::Done);
        };
        if !compares(r) || r.digest != DigestState::Absent {
            return Err(Violation::UnexpectedDigest { req: d.req });
        }
        r.digest = DigestState::Received(d.crc32);
        Ok(Step::Done)
    }

    /// Before the first `Finish` of request `req` takes effect: `Some` if
    /// the driver must digest this side's bytes first ([`Step::Verify`]).
    pub(super) fn digest_gate(&mut self, req: u64) -> Result<Option<Step<T>>, Violation> {
        let Some(r) = self.requests.get(&req) else {
            return Ok(None);
        };
        if !compares(r) {
            return Ok(None);
        }
        match r.digest {
            DigestState::Verified => Ok(None),
            DigestState::Received(_) => Ok(Some(Step::Verify {
                req,
                target: r.target.clone(),
                range: r.span,
            })),
            DigestState::Absent if self.digest => Err(Violation::MissingDigest { req }),
            DigestState::Absent => Ok(None),
        }
    }

    /// This side's digest of request `req`'s bytes (after a
    /// [`Step::Verify`]; `None`: they could not be read, device memory or
    /// a region that closed meanwhile). Equal to the peer's, or either
    /// missing, the `Finish` takes effect as it would have; different, the
    /// request ends on both sides with [`AbortReason::DigestMismatch`]
    /// (the peer told; the operation here ended by the queued
    /// [`Action::RemoteAbort`](super::Action::RemoteAbort) with that
    /// reason), never committed. An `Err` closes the connection.
    pub fn verified(&mut self, req: u64, local: Option<u32>) -> Result<Step<T>, Violation> {
        let Some(r) = self.requests.get_mut(&req) else {
            return Ok(Step::Done);
        };
        let DigestState::Received(peer) = r.digest else {
            return Ok(Step::Done);
        };
        if let (Some(peer), Some(local)) = (peer, local) {
            if peer != local {
                let detail = match r.side {
                    Side::Destination => {
                        format!("the source digested {peer:08x}, what landed here is {local:08x}")
                    }
                    Side::Source => {
                        format!("this side lent {local:08x}, what landed at the peer is {peer:08x}")
                    }
                };
                let Some(r) = self.requests.remove(&req) else {
                    return Ok(Step::Done);
                };
                self.abort(req, AbortReason::DigestMismatch, detail.clone());
                self.push(super::Action::RemoteAbort {
                    target: r.target,
                    reason: AbortReason::DigestMismatch,
                    detail,
                });
                return Ok(Step::Done);
            }
        }
        r.digest = DigestState::Verified;
        self.on_finish(req)
    }

    /// [`pull_ended`](Self::pull_ended) with this side's digest of what
    /// landed (`crc32`, computed where this side's check is on): the
    /// frames to send, a [`Digest`] before the `Finish` of a copy that is
    /// done where the check is on.
    pub fn pull_ended_digest(&mut self, req: u64, done: bool, crc32: Option<u32>) -> Vec<Message> {
        let mut out = Vec::new();
        if done && self.digest {
            out.push(Message::Digest(Digest { req, crc32 }));
        }
        out.extend(self.pull_ended(req, done));
        out
    }
}
