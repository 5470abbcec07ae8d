//! Gets and their completion: [`post_get`] posts one `ucp_get_nbx`,
//! counted in a [`Batch`] until its callback ([`on_get_done`]) runs;
//! [`Batch::wait_or_recall`] waits for a batch the way every copy thread
//! does, and recalls the gets of a destination closed meanwhile that the
//! peer does not answer.

use std::ffi::c_void;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use super::ffi::{self, Status, UCS_OK};
use super::{lock, ucx, Endpoint, Worker};

/// How long a waiter progresses the worker itself before it sleeps (see
/// [`Batch::wait_until`]).
const POLL: Duration = Duration::from_micros(200);

/// How often a waiter that found no end progresses the worker itself and
/// wakes the progress task (see [`Batch::wait_until`]).
const NUDGE: Duration = Duration::from_millis(50);

/// How often a waiter looks whether the destination of its gets was
/// closed (see [`Batch::wait_or_recall`]).
const TICK: Duration = Duration::from_millis(5);

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
        self.wait_ticking(worker, deadline, NUDGE, || {})
    }

    /// Waits, as [`wait_until`](Self::wait_until) does, until every request ended,
    /// unless `open` turns false (the destination was closed: a cancel)
    /// and requests are still in flight `grace` later: then it *recalls*
    /// them by force-closing `ep` (`ucp_ep_close_nbx` with
    /// `UCP_EP_CLOSE_FLAG_FORCE`), which, as UCX documents it, completes
    /// every outstanding request of the endpoint with `UCS_ERR_CANCELED`,
    /// and waits for that. UCX 1.13 recalls a get no other way
    /// (`ucp_request_cancel` cancels only receives). Once every request
    /// ended, UCX no longer touches their buffers. The first failure, if
    /// any, and whether it recalled (the endpoint is then closed: no get
    /// goes over it again).
    pub(crate) fn wait_or_recall(
        &self,
        ep: &Endpoint,
        open: impl Fn() -> bool,
        grace: Duration,
    ) -> (Option<Status>, bool) {
        let mut closed_at: Option<Instant> = None;
        let mut recalled = false;
        let status = self.wait_ticking(&ep.worker, None, TICK, || {
            if recalled || open() {
                return;
            }
            let at = *closed_at.get_or_insert_with(Instant::now);
            if at.elapsed() >= grace {
                tracing::debug!(
                    "UCX: gets still in flight {grace:?} after their destination was closed: \
                     recalled by closing the endpoint"
                );
                ep.close();
                recalled = true;
                ep.worker.progress_all();
            }
        });
        (status.unwrap_or_default(), recalled)
    }

    /// [`wait_until`](Self::wait_until), calling `tick` (without the
    /// batch's lock) every `slice` while requests are in flight.
    fn wait_ticking(
        &self,
        worker: &Worker,
        deadline: Option<Instant>,
        slice: Duration,
        mut tick: impl FnMut(),
    ) -> Option<Option<Status>> {
        if let Some(s) = worker.poll(self, POLL) {
            return Some(s);
        }
        worker.wake();
        let mut nudged = Instant::now();
        let mut s = lock(&self.state);
        while s.0 > 0 {
            let mut wait = slice;
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
                drop(s);
                tick();
                if nudged.elapsed() >= NUDGE {
                    // The progress task would have seen the end by now,
                    // unless it cannot run: its runtime's threads are busy
                    // or blocked (an async caller waiting synchronously
                    // for this very copy to stop, say). Progress here
                    // too, then wake it.
                    worker.progress_all();
                    worker.wake();
                    nudged = Instant::now();
                }
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
/// (`Batch::wait_until`, `Batch::wait_or_recall` or `Batch::poll` says so): UCX writes into `dst` and
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

/// Posts one request of another kind (a put, a flush, an active message)
/// with `post`, which gets the raw endpoint and parameters that name
/// [`on_get_done`] as the callback, counted in `batch` until it ends;
/// `Err` if UCX refused it at once. `flags`: the request's
/// `UCP_OP_ATTR_FIELD_FLAGS` flags, if any.
///
/// # Safety
///
/// What `post` hands to UCX (buffers, keys) must stay valid until `batch`
/// has no request in flight, as for [`post_get`].
pub(crate) unsafe fn post_with(
    ep: &Endpoint,
    batch: &Arc<Batch>,
    flags: Option<u32>,
    post: impl FnOnce(ffi::Ep, &ffi::RequestParam) -> ffi::StatusPtr,
) -> Result<(), Status> {
    let mut param = ffi::RequestParam::empty();
    param.op_attr_mask = ffi::UCP_OP_ATTR_FIELD_CALLBACK | ffi::UCP_OP_ATTR_FIELD_USER_DATA;
    if let Some(f) = flags {
        param.op_attr_mask |= ffi::UCP_OP_ATTR_FIELD_FLAGS;
        param.flags = f;
    }
    param.cb = Some(on_get_done);
    let user = Arc::into_raw(batch.clone());
    param.user_data = user as *mut c_void;
    batch.add();
    let r = ep.with_raw(|raw| post(raw, &param));
    match r.map_or(Err(ffi::UCS_ERR_CANCELED), ffi::ptr_status) {
        Ok(Some(_)) => Ok(()),
        done => {
            // SAFETY: the `Arc::into_raw` above, not given away (no
            // callback for a request that ended at once).
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
