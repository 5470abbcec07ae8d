//! The operations of `pair_world.rs`: memory in `Vec`s, the fence the
//! sessions ask about, how each ended; and the test data helpers.

use std::cell::{Cell, RefCell};
use std::rc::Rc;

use ferry_proto::session::{Fence, StripeState};
use ferry_proto::wire::{Abort, AbortReason, Message};
use ferry_proto::Token;

/// What memory that nothing wrote holds.
pub const UNTOUCHED: u8 = 0xEE;

// ---------------------------------------------------------------------------
// Operations: memory, a fence, an outcome.

/// How an operation ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Complete,
    /// Cancelled here.
    Cancelled,
    /// Ended by the peer's `Abort`.
    Aborted(AbortReason),
    /// Its connection closed (a violation, or lost).
    Errored(String),
}

#[derive(Debug)]
pub struct Op {
    /// Names its memory in a lease's addresses.
    pub key: u64,
    pub bufs: RefCell<Vec<Vec<u8>>>,
    pub sealed: Cell<bool>,
    pub open: Cell<bool>,
    pub outcome: RefCell<Option<Outcome>>,
    /// A striped operation's parts, shared by their requests.
    pub stripe: RefCell<Option<StripeState>>,
    /// Each `Via` reported (`true`: lent).
    pub via: RefCell<Vec<bool>>,
    /// `(connection, request)` of each request that carries it.
    pub reqs: RefCell<Vec<(usize, u64)>>,
    /// Lent and not yet given back.
    pub lends: Cell<i32>,
}

/// The driver's handle on an operation.
#[derive(Clone, Debug)]
pub struct H(pub Rc<Op>);

impl Fence for H {
    fn is_sealed(&self) -> bool {
        self.0.sealed.get()
    }
    fn is_open(&self) -> bool {
        self.0.open.get()
    }
    fn can_commit(&self) -> bool {
        self.0
            .stripe
            .borrow()
            .as_ref()
            .map_or(true, StripeState::can_commit)
    }
}

impl H {
    pub fn outcome(&self) -> Option<Outcome> {
        self.0.outcome.borrow().clone()
    }
    pub fn bytes(&self) -> Vec<Vec<u8>> {
        self.0.bufs.borrow().clone()
    }
    pub fn sizes(&self) -> Vec<u64> {
        self.0
            .bufs
            .borrow()
            .iter()
            .map(|b| b.len() as u64)
            .collect()
    }
    pub fn via(&self) -> Vec<bool> {
        self.0.via.borrow().clone()
    }
    /// Its memory as a lease: descriptor `i` at `key << 40 | i << 32`.
    pub fn segments(&self) -> Vec<(u64, u64)> {
        self.sizes()
            .into_iter()
            .enumerate()
            .map(|(i, len)| (self.0.key << 40 | (i as u64) << 32, len))
            .collect()
    }
    pub fn stripe_done(&self) -> u16 {
        self.0.stripe.borrow().as_ref().map_or(0, StripeState::done)
    }
}

/// What the active side knows of a passive operation (its metadata).
#[derive(Debug, Clone)]
pub struct Meta {
    pub op_id: u64,
    pub token: Token,
    pub sizes: Vec<u64>,
}

// ---------------------------------------------------------------------------
// Test data.

pub fn abort(req: u64, reason: AbortReason) -> Message {
    Message::Abort(Abort {
        req,
        reason,
        detail: format!("{reason:?}"),
    })
}

/// Deterministic bytes, different per seed.
pub fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 8) as u8)
        .collect()
}

pub fn patterns(sizes: &[usize], seed: u8) -> Vec<Vec<u8>> {
    sizes
        .iter()
        .enumerate()
        .map(|(i, &n)| pattern(n, seed.wrapping_add(i as u8 * 17)))
        .collect()
}

pub fn untouched(sizes: &[usize]) -> Vec<Vec<u8>> {
    sizes.iter().map(|&n| vec![UNTOUCHED; n]).collect()
}

/// Several descriptors, one empty, none a multiple of the chunk.
pub const SIZES: [usize; 4] = [37, 0, 1, 64];
