//! Why a grant, or an operation on one, was refused.

use super::Rights;

/// Why a grant, or a one-sided operation on one, was refused.
///
/// Every variant is a refusal: no byte moved through the grant for the
/// operation that got it (except [`Stalled`](Self::Stalled), which the
/// owner's `revoke` returns, and [`NotificationsFull`](Self::NotificationsFull),
/// whose write landed). Each message says what to do.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum GrantError {
    /// The grant metadata does not parse or does not validate.
    #[error("malformed grant metadata: {0}; ask the owner for fresh grant metadata")]
    Malformed(String),
    /// The grant metadata is longer than [`MAX_GRANT_JSON`](super::MAX_GRANT_JSON).
    #[error("grant metadata of {len} bytes, more than the {max} a grant may take: use shorter worker ids")]
    TooLarge {
        /// Its length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// The owner revoked the grant (or dropped it): ask it for a new one.
    #[error("the grant was revoked by its owner: ask the owner for a new grant")]
    Revoked,
    /// The grant's expiry has passed.
    #[error("the grant expired at {at_ms} ms after the epoch (now {now_ms}): ask the owner for a new grant")]
    Expired {
        /// When it expired (unix milliseconds).
        at_ms: u64,
        /// The clock when it was checked.
        now_ms: u64,
    },
    /// The grant is bound to another worker.
    #[error("the grant is bound to worker {holder:?}, not to this worker {me:?}: open it from the worker it names")]
    NotYours {
        /// The worker it is bound to.
        holder: String,
        /// This worker.
        me: String,
    },
    /// A grant names neither the worker it is bound to nor that it is a
    /// bearer grant.
    #[error("a grant must name the worker it is for (GrantOptions::holder) or be a bearer grant (GrantOptions::bearer)")]
    Unbound,
    /// Another process holds the grant already (one holder per grant).
    #[error("the grant is already held by process {pid}: a grant has one holder at a time; ask the owner for another grant")]
    Claimed {
        /// The process that holds it.
        pid: u32,
    },
    /// A block index past the granted blocks.
    #[error("block {index} is out of range: the grant has blocks 0 to {count} (exclusive)")]
    OutOfRange {
        /// The index named.
        index: u32,
        /// How many blocks the grant has.
        count: u32,
    },
    /// The block was retired by its owner since the generation the
    /// transfer names: nothing moved. Fetch the current generation.
    #[error("block {index} is at generation {current}, the transfer names {named}: the owner reused it; nothing moved")]
    StaleGeneration {
        /// The block.
        index: u32,
        /// The generation named.
        named: u32,
        /// Its generation now.
        current: u32,
    },
    /// The grant does not give the right the operation needs.
    #[error("the operation needs {needed}, the grant gives {granted}: ask the owner for a grant with {needed}")]
    RightsMissing {
        /// What the operation needs.
        needed: Rights,
        /// What the grant gives.
        granted: Rights,
    },
    /// No lane of this grant reaches this holder.
    #[error("no lane of this grant reaches this worker: {0}")]
    NoLane(String),
    /// The grant's secret or layout does not match what the owner keeps:
    /// forged, tampered with, or stale metadata.
    #[error("the grant's {what} does not match the owner's: forged or stale metadata; ask the owner for a fresh grant")]
    Forged {
        /// Which part differs.
        what: &'static str,
    },
    /// Block counts or sizes of the two sides differ.
    #[error("{what}: {local} on this side, {remote} in the grant; they must match")]
    LengthMismatch {
        /// What differs (block counts, block sizes).
        what: &'static str,
        /// This side's.
        local: u64,
        /// The grant's.
        remote: u64,
    },
    /// A notification payload larger than [`MAX_NOTIFICATION`](super::MAX_NOTIFICATION).
    #[error(
        "a notification of {len} bytes; at most {max} are carried: send the rest in the blocks"
    )]
    NotificationTooLarge {
        /// Its length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// The owner's notification queue stayed full: the write landed, but
    /// its notification was not queued. The owner is not reading its
    /// notifications.
    #[error("the owner's notification queue stayed full for {waited_ms} ms: the write landed but was not notified; the owner must read its notifications")]
    NotificationsFull {
        /// How long the write waited.
        waited_ms: u64,
    },
    /// The owner process is gone (it exited, or replaced its program).
    #[error("the grant's owner process is gone: {0}")]
    OwnerGone(String),
    /// The holder process is gone.
    #[error("the grant's holder process is gone")]
    HolderGone,
    /// `revoke` or `retire` gave up waiting for an operation in flight
    /// whose holder process is alive but did not finish (stopped, or
    /// stalled in the kernel): when it resumes, it may still complete that
    /// one operation. The grant is revoked for everything after it.
    #[error("{pending} operation(s) of a live holder still in flight after {waited_ms} ms: a stopped holder may still complete one operation when it resumes; its later ones are refused")]
    Stalled {
        /// Operations in flight.
        pending: u32,
        /// How long it waited.
        waited_ms: u64,
    },
    /// A copy failed (the kernel's error): nothing, or part, of the range
    /// moved.
    #[error("the copy failed: {0}")]
    Copy(String),
    /// An offer has as many holders as it takes: a claim of a worker that
    /// holds none of its grants is refused.
    #[error(
        "the offer has its {max} holders already: ask its owner to revoke one \
         (Offer::revoke_holder) or to offer with a larger OfferOptions::max_holders"
    )]
    TooManyHolders {
        /// The most it takes.
        max: u32,
    },
}
