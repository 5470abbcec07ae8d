//! Claims: which memory the operations in progress use, so that two of
//! them never race on the same bytes. Address ranges of host memory are
//! claimed in one process-wide list; the blocks of a pool in the pool's
//! own [`Table`], so that the descriptors of one pool conflict only on the
//! blocks they share. A claim lapses when its operation has let go of its
//! memory ([`Claimant`]), or is dropped.

use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};

use ferry::PoolError;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::errors::pool_error_to_py;
use crate::lock;

/// Host memory that operations in progress use. A second operation that
/// would write bytes another one uses, or use bytes another one writes, is
/// refused: the two would race on those bytes. (The reference leaves this to
/// the caller; from Python, passing one buffer to two operations is easy.)
static CLAIMS: Mutex<Vec<Claimed>> = Mutex::new(Vec::new());

struct Claimed {
    start: usize,
    end: usize,
    writes: bool,
    /// The pool whose blocks these are (0: none): the pool keeps apart the
    /// blocks of its own descriptors, so claims of one pool do not conflict.
    pool: u64,
    by: Arc<ClaimOwner>,
}

/// One descriptor's memory, to be claimed: descriptor `index` covers
/// `start..end` (all of its pool's memory if it is paged: `pool` is then
/// the pool's number, else 0).
pub(crate) struct Range {
    pub(crate) index: usize,
    pub(crate) start: usize,
    pub(crate) end: usize,
    pub(crate) pool: u64,
}

impl Range {
    fn overlaps(&self, start: usize, end: usize, pool: u64) -> bool {
        self.start < end && start < self.end && (pool == 0 || pool != self.pool)
    }
}

/// What a claim is for, as the claims see it: an operation, which may
/// touch its memory until it is released.
pub(crate) trait Claimant: Send + Sync {
    /// Whether the operation has let go of its memory for good (ended, no
    /// copy into it in flight, no lease of it outstanding).
    fn is_released(&self) -> bool;
}

/// The operation behind a claim: unknown while it starts.
#[derive(Default)]
pub(crate) struct ClaimOwner(OnceLock<Weak<dyn Claimant>>);

impl ClaimOwner {
    /// Whether the operation may still touch its memory: until it has
    /// ended and no copy into its memory (one a same-host peer stalled) is
    /// still in flight, nor a peer's lease of it outstanding
    /// (`is_released`). An ended operation has closed its region, even if
    /// its handle lives on. A handle found here is pushed to `found`, to be
    /// dropped only after `CLAIMS` is unlocked (its drop takes that lock).
    pub(crate) fn in_use(&self, found: &mut Vec<Arc<dyn Claimant>>) -> bool {
        match self.0.get() {
            None => true,
            Some(op) => match op.upgrade() {
                None => false,
                Some(h) => {
                    let open = !h.is_released();
                    found.push(h);
                    open
                }
            },
        }
    }
}

/// One operation's claim on its memory, released when dropped: its ranges
/// in `CLAIMS`, and the blocks it holds in the tables of pools.
pub(crate) struct Claim(Arc<ClaimOwner>, Vec<Arc<Table>>);

impl Claim {
    /// Claims `ranges`, or says which one conflicts.
    pub(crate) fn new(mut ranges: Vec<Range>, writes: bool) -> PyResult<Claim> {
        let by = Arc::new(ClaimOwner::default());
        if ranges.is_empty() {
            return Ok(Claim(by, Vec::new()));
        }
        ranges.sort_unstable_by_key(|r| r.start);
        // Descriptors of one pool claim the same span once: the pool
        // refuses blocks that two of them would conflict on.
        let mut pools = Vec::new();
        ranges.retain(|r| {
            if r.pool == 0 {
                return true;
            }
            let first = !pools.contains(&r.pool);
            pools.push(r.pool);
            first
        });
        if writes {
            if let Some(w) = ranges.windows(2).find(|w| w[1].start < w[0].end) {
                return Err(PyValueError::new_err(format!(
                    "descriptors {} and {} overlap, and this operation writes into them",
                    w[0].index.min(w[1].index),
                    w[0].index.max(w[1].index)
                )));
            }
        }
        let low = ranges[0].start;
        let high = ranges.iter().map(|r| r.end).max().unwrap_or(low);
        let mut found = Vec::new();
        let mut claims = lock(&CLAIMS);
        claims.retain(|c| c.by.in_use(&mut found));
        let conflict = claims
            .iter()
            .filter(|c| (writes || c.writes) && c.start < high && low < c.end)
            .find_map(|c| {
                ranges
                    .iter()
                    .find(|r| r.overlaps(c.start, c.end, c.pool))
                    .map(|r| (r.index, c.writes))
            });
        if conflict.is_none() {
            claims.extend(ranges.iter().map(|r| Claimed {
                start: r.start,
                end: r.end,
                writes,
                pool: r.pool,
                by: by.clone(),
            }));
        }
        drop(claims);
        drop(found);
        match conflict {
            None => Ok(Claim(by, Vec::new())),
            Some((index, other_writes)) => Err(PyValueError::new_err(format!(
                "descriptor {index} overlaps memory that an operation in progress {}: \
                 the two would race on those bytes; wait for the other operation to end \
                 (or cancel it), or use another buffer",
                if other_writes { "writes into" } else { "reads" }
            ))),
        }
    }

    /// Who holds the claim (for the tables of pools).
    pub(crate) fn owner(&self) -> &Arc<ClaimOwner> {
        &self.0
    }

    /// Records that the claim holds blocks of `table`, to be given back
    /// when it is dropped.
    pub(crate) fn hold(&mut self, table: Arc<Table>) {
        self.1.push(table);
    }

    /// Ties the claim to the operation, so that it lapses when the
    /// operation ends.
    pub(crate) fn attach<C: Claimant + 'static>(&self, holder: &Arc<C>) {
        let holder: Weak<C> = Arc::downgrade(holder);
        let _ = self.0 .0.set(holder);
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        lock(&CLAIMS).retain(|c| !Arc::ptr_eq(&c.by, &self.0));
        for table in &self.1 {
            table.release(&self.0);
        }
    }
}

/// Which blocks of a pool operations in progress hold.
pub(crate) struct Table(Mutex<TableState>);

struct TableState {
    /// Per block: 0 free, n > 0 read by n operations, -1 written by one.
    taken: Vec<i32>,
    users: Vec<User>,
}

/// Blocks held by one operation (`by`), `shared` if it only reads them.
struct User {
    by: Arc<ClaimOwner>,
    ids: Arc<[u32]>,
    shared: bool,
}

fn undo(taken: &mut [i32], ids: &[u32], shared: bool) {
    for &id in ids {
        let v = &mut taken[id as usize];
        *v = if shared { *v - 1 } else { 0 };
    }
}

impl Table {
    /// The table of a pool of `blocks` blocks, none taken.
    pub(crate) fn new(blocks: usize) -> Table {
        Table(Mutex::new(TableState {
            taken: vec![0; blocks],
            users: Vec::new(),
        }))
    }

    fn state(&self) -> MutexGuard<'_, TableState> {
        lock(&self.0)
    }

    /// Takes `ids` for the operation `by`: shared, or exclusively.
    pub(crate) fn take(
        &self,
        py: Python<'_>,
        ids: &Arc<[u32]>,
        shared: bool,
        by: &Arc<ClaimOwner>,
    ) -> PyResult<()> {
        let mut found = Vec::new();
        let mut t = self.state();
        let TableState { taken, users } = &mut *t;
        // Blocks of operations that have ended are free again.
        users.retain(|u| {
            let keep = u.by.in_use(&mut found);
            if !keep {
                undo(taken, &u.ids, u.shared);
            }
            keep
        });
        let mut busy = None;
        for (index, &id) in ids.iter().enumerate() {
            let v = &mut taken[id as usize];
            let ok = if shared {
                (0..i32::MAX).contains(v)
            } else {
                *v == 0
            };
            if !ok {
                undo(taken, &ids[..index], shared);
                busy = Some(id);
                break;
            }
            *v = if shared { *v + 1 } else { -1 };
        }
        if busy.is_none() {
            users.push(User {
                by: by.clone(),
                ids: ids.clone(),
                shared,
            });
        }
        drop(t);
        // Operations found above are dropped (if that was their last handle)
        // only now: their drop releases their own blocks, under the lock.
        drop(found);
        match busy {
            None => Ok(()),
            Some(id) => Err(pool_error_to_py(py, PoolError::Busy { id })),
        }
    }

    /// Gives back what the operation `by` holds (it was dropped).
    pub(crate) fn release(&self, by: &Arc<ClaimOwner>) {
        let mut t = self.state();
        let TableState { taken, users } = &mut *t;
        users.retain(|u| {
            let mine = Arc::ptr_eq(&u.by, by);
            if mine {
                undo(taken, &u.ids, u.shared);
            }
            !mine
        });
    }
}
