//! Gets and their completion: [`post_get`] posts one `ucp_get_nbx`,
//! counted in a [`Batch`] until its callback ([`on_get_done`]) runs;
//! [`Batch::wait`] waits for a batch the way every copy thread does.

use std::ffi::c_void;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use super::ffi::{self, Status, UCS_OK};
use super::{lock, ucx, Endpoint, Worker};

/// How long a waiter progresses the worker itself before it sleeps (see
/// [`Batch::wait`]).
const POLL: Duration = Duration::from_micros(200);

/// Requests of one batch of gets: how many are still in flight and the
/// first failure.
pub(crate) struct Batch {
    state: Mutex<(usize, Option<Status>)>,
    done: Condvar,
}

impl Batch {
    pub(crate) fn new() -> Arc<Batch> {
        Arc::new(Batch {
            state: Mutex::new((0, None)),
            done: Condvar::new(),
        })
    }

    /// One more request posted.
    pub(crate) fn add(&self) {
        lock(&self.state).0 += 1;
    }

    /// One request ended with `status`.
    pub(crate) fn end(&self, status: Status) {
        let mut s = lock(&self.state);
        s.0 = s.0.saturating_sub(1);
        if status != UCS_OK && s.1.is_none() {
            s.1 = Some(status);
        }
        if s.0 == 0 {
            self.done.notify_all();
        }
    }

    /// `None` while requests are in flight; once all ended, the first
    /// failure, if any.
    pub(crate) fn poll(&self) -> Option<Option<Status>> {
        let s = lock(&self.state);
        (s.0 == 0).then_some(s.1)
    }

    /// Waits until every request ended: the first failure, if any.
    pub(crate) fn wait(&self, worker: &Worker) -> Option<Status> {
        self.wait_until(worker, None).unwrap_or_default()
    }

    /// Waits until every request ended (`Some` of the first failure, if
    /// any), or until `deadline` (`None`). For up to [`POLL`] this thread
    /// progresses the worker itself, which sees a get that ends within
    /// microseconds (a small one, or one that UCX completes inline) at
    /// once; then it sleeps until the progress task, woken by the worker's
    /// events, reports the end (progressing and waking the worker every
    /// 50 ms, in case a wake-up was lost or the task cannot run): a long
    /// transfer leaves the CPU to whoever moves its bytes.
    pub(crate) fn wait_until(
        &self,
        worker: &Worker,
        deadline: Option<Instant>,
    ) -> Option<Option<Status>> {
        if let Some(s) = worker.poll(self, POLL) {
            return Some(s);
        }
        worker.wake();
        let mut s = lock(&self.state);
        while s.0 > 0 {
            let mut wait = Duration::from_millis(50);
            if let Some(d) = deadline {
                wait = wait.min(d.saturating_duration_since(Instant::now()));
                if wait.is_zero() {
                    return None;
                }
            }
            let (g, t) = self
                .done
                .wait_timeout(s, wait)
                .unwrap_or_else(|e| e.into_inner());
            s = g;
            if t.timed_out() {
                // The progress task would have seen the end by now, unless
                // it cannot run: its runtime's threads are busy or blocked
                // (an async caller waiting synchronously for this very
                // copy to stop, say). Progress here too, then wake it.
                drop(s);
                worker.progress_all();
                worker.wake();
                s = lock(&self.state);
            }
        }
        Some(s.1)
    }
}

/// Posts one `ucp_get_nbx` of `n` bytes at the peer's `addr` (covered by
/// `rkey`) into `dst`, counted in `batch` until it ends; `Err` if UCX
/// refused it at once (then nothing is in flight).
///
/// # Safety
///
/// `dst` must be valid for writes of `n` bytes, and `rkey` a key unpacked
/// on `ep` and not destroyed, until `batch` has no request in flight
/// (`Batch::wait` or `Batch::poll` says so): UCX writes into `dst` and
/// reads the key until the get ends.
pub(crate) unsafe fn post_get(
    ep: &Endpoint,
    batch: &Arc<Batch>,
    dst: *mut u8,
    n: usize,
    addr: u64,
    rkey: ffi::RKey,
) -> Result<(), Status> {
    let api = &ep.worker.ucx.api;
    let mut param = ffi::RequestParam::empty();
    param.op_attr_mask = ffi::UCP_OP_ATTR_FIELD_CALLBACK | ffi::UCP_OP_ATTR_FIELD_USER_DATA;
    param.cb = Some(on_get_done);
    let user = Arc::into_raw(batch.clone());
    param.user_data = user as *mut c_void;
    batch.add();
    // SAFETY: a live endpoint (`with_raw`); `dst` and `rkey` stay valid
    // until the get ends (this function's contract); `user` is one count
    // of `batch`, given to the callback if the get is in flight.
    let r = ep.with_raw(|raw| unsafe { (api.get_nbx)(raw, dst.cast(), n, addr, rkey, &param) });
    // Closed: nothing was posted.
    match r.map_or(Err(ffi::UCS_ERR_CANCELED), ffi::ptr_status) {
        Ok(Some(_)) => Ok(()),
        done => {
            // Done or failed at once: no callback; the count is ours.
            // SAFETY: the `Arc::into_raw` above, not given away.
            drop(unsafe { Arc::from_raw(user) });
            batch.end(done.err().unwrap_or(UCS_OK));
            done.map(drop)
        }
    }
}

/// The completion callback of one get: `user` is a `Batch` counted for it.
pub(crate) unsafe extern "C" fn on_get_done(req: *mut c_void, status: Status, user: *mut c_void) {
    // SAFETY: `user` is a reference count of a `Batch` that `post_get`
    // gave up for exactly this callback, which UCX calls once.
    let batch = unsafe { Arc::from_raw(user as *const Batch) };
    batch.end(status);
    if let Ok(u) = ucx() {
        // SAFETY: the request is done and ours; freed once, here.
        unsafe { (u.api.request_free)(req) };
    }
}
