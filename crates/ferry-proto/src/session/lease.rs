//! Memory lent to the peer, and leases: what this side does when it could
//! not lend what it promised, when a lease comes, and when a copy ends.

use super::{Action, Fence, Path, Role, Session, Step, Violation, DEVICE_MEMORY_BY_IPC_ONLY};
use crate::wire::{Lease, Message};

impl<T: Fence> Session<T> {
    /// Gives back the memory request `req` lent, whose lease the driver
    /// never sent (the peer cannot be copying it): for an active request
    /// that found its connection dead before it began.
    pub fn unlend(&mut self, req: u64) {
        self.give_back(req);
    }

    /// The driver could not lend the memory of request `req` (its
    /// [`Action::Lend`] failed: a CUDA IPC export, a registration), `why`:
    /// nothing was lent, and nothing must be given back. A READ this side
    /// serves falls back to streaming where its memory moves in band (its
    /// lease has not gone out: [`serve`](Self::serve) then streams), and is
    /// refused with `Abort(DeviceMemory)` where it does not. False where
    /// the lease is already promised (this side's own request, whose lease
    /// goes out with its `Open`): the driver must end the request, which
    /// holds nothing lent any more.
    pub fn lend_failed(&mut self, req: u64, why: &str) -> bool {
        match self.lent.remove(&req) {
            None => return true,
            Some((_, promised, _)) if promised => return false,
            Some(_) => {}
        }
        let Some(r) = self.requests.get_mut(&req) else {
            return true;
        };
        let target = r.target.clone();
        if target.moves_in_band() {
            r.path = Path::InBand;
            self.push(Action::Via {
                target,
                lent: false,
                lane: None,
            });
        } else {
            self.requests.remove(&req);
            self.refuse_device(req, target, format!("{DEVICE_MEMORY_BY_IPC_ONLY}: {why}"));
        }
        true
    }

    /// The copy of request `req` ended (`done`: every byte landed and the
    /// operation is sealed; else it stopped, or never started): the frame
    /// to send, if any. With RDMA leases, a copy that stopped says so
    /// (`Release`): only then does the source release the memory.
    pub fn pull_ended(&mut self, req: u64, done: bool) -> Option<Message> {
        if done {
            Some(Message::Finish { req })
        } else {
            self.rdma_leases.then_some(Message::Release { req })
        }
    }

    /// Leases on this connection go through an RDMA backend (each side
    /// learns it from the lane's exchange: [`LaneProof::release_leases`](super::LaneProof::release_leases);
    /// a driver may also say it). There the source's memory may still be read by gets that
    /// the destination posted before it stopped, so a lease ends only with
    /// the destination's `Finish` or `Release`, sent once its copy has
    /// stopped ([`Session::pull_ended`]), never with an `Abort` from either
    /// side (or with the connection).
    pub fn rdma_leases(&mut self) {
        self.rdma_leases = true;
    }

    pub(super) fn on_lease(&mut self, l: Lease) -> Result<Step<T>, Violation> {
        let want = match self.role {
            Role::Passive => {
                if !self.caps.attach || !self.caps.can_pull {
                    return Err(Violation::LeaseWithoutAttach);
                }
                Path::AwaitLease
            }
            Role::Active => {
                if !self.caps.can_pull || l.req >= self.next_req {
                    return Err(Violation::UnaskedLease { req: l.req });
                }
                Path::Requested
            }
        };
        let Some(r) = self.requests.get_mut(&l.req) else {
            // Ended here meanwhile: the source must not wait for a copy
            // that never starts.
            self.reply(Message::Release { req: l.req });
            return Ok(Step::Done);
        };
        if r.path != want {
            return Err(Violation::UnaskedLease { req: l.req });
        }
        // Its lengths are checked against the request's sizes before a
        // segment is expanded: what that costs follows the request.
        let sizes = r.cursor.sizes();
        if l.segments.len() != sizes.len() || l.segments.lens().first_difference(sizes).is_some() {
            return Err(Violation::LeaseShapeMismatch { req: l.req });
        }
        r.path = Path::Pulling;
        let target = r.target.clone();
        if self.role == Role::Active {
            self.push(Action::Via {
                target: target.clone(),
                lent: true,
                lane: Some(l.lane),
            });
        }
        self.push(Action::Pull {
            req: l.req,
            target,
            lane: l.lane,
            segments: l.segments.expand(),
            key: l.key,
        });
        Ok(Step::Done)
    }
}
