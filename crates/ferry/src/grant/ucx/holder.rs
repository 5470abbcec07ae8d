//! The UCX lane of grants, the holder's side: an endpoint to the owner's
//! grant worker and the two remote keys, unpacked once at open; per
//! operation a get of the control words (state, the named blocks'
//! generations), then the gets or puts of the blocks (puts flushed), then
//! the notification as an active message. Nothing of the owner's
//! application runs for it.

use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ferry_proto::grant::{check, BlockRef, GrantError, GrantMetadata, UcxGrant};
use tokio::sync::watch;

use super::super::control::{GENERATIONS, LIVE, STATE_AT};
use super::{encode_header, failed, seal, AM_ID};
use crate::grant::NotificationKind;
use crate::transport::ucx::{self as tu, ffi, post_get, post_with, Batch, Endpoint};
use crate::{Pool, Result};

mod ranges;

/// How long one step of an operation (the control read, the transfer, the
/// notification) may take before the holder gives up on it.
const STEP: Duration = Duration::from_secs(10);

/// A grant opened over UCX.
pub(in crate::grant) struct UcxHeld {
    /// Declared before the endpoint: destroyed first.
    keys: Keys,
    ep: Endpoint,
    lane: UcxGrant,
    block_size: u64,
    /// The holder's worker runs until this drops.
    stop: watch::Sender<bool>,
    /// The notification sequence (and the lock that orders them).
    producer: Mutex<u64>,
    grant: ferry_proto::grant::GrantId,
    meta: GrantMetadata,
    /// An operation found the grant revoked (or its owner gone).
    revoked: AtomicBool,
}

impl Drop for UcxHeld {
    fn drop(&mut self) {
        // Ends the holder worker's progress task (a dropped sender alone
        // would not); the keys, then the endpoint, drop after this, and
        // the worker with the endpoint's reference.
        let _ = self.stop.send(true);
    }
}

/// The remote keys of the granted memory and of the control words,
/// unpacked on the endpoint.
struct Keys {
    data: ffi::RKey,
    control: ffi::RKey,
}

// SAFETY: remote keys of an endpoint of a worker in MULTI mode; UCX's
// calls on them (posting, destroying) are thread safe there.
unsafe impl Send for Keys {}
// SAFETY: see `Send`.
unsafe impl Sync for Keys {}

impl Drop for Keys {
    fn drop(&mut self) {
        if let Ok(u) = tu::ucx() {
            for k in [self.data, self.control] {
                // SAFETY: unpacked once each; no request uses them any more
                // (every operation waited for its requests, or leaked the
                // whole grant when one never ended).
                unsafe { (u.api.rkey_destroy)(k) };
            }
        }
    }
}

/// Opens `meta`'s UCX lane: checks its seal, starts a worker, connects to
/// the owner's and unpacks the keys, then reads the grant's state once.
pub(in crate::grant) async fn open(meta: &GrantMetadata) -> Result<UcxHeld> {
    let Some(lane) = meta.ucx.clone() else {
        return Err(GrantError::NoLane("the grant offers no UCX lane".into()).into());
    };
    if seal(&meta.token, meta.grant, &lane) != lane.seal {
        return Err(GrantError::Forged {
            what: "ucx section",
        }
        .into());
    }
    let no_lane = |why: String| GrantError::NoLane(format!("UCX: {why}"));
    let ucx = tu::ucx_for(true).map_err(|w| no_lane(w.to_string()))?;
    let handle = tokio::runtime::Handle::current();
    let (stop, rx) = watch::channel(false);
    let worker = tu::Worker::start(&handle, rx, true).map_err(no_lane)?;
    let ep = worker.connect(&lane.address).map_err(no_lane)?;
    // In a block of its own: the raw keys are not `Send`, and the future
    // must be (no raw pointer lives across the await below).
    let keys = {
        let mut unpacked = Vec::with_capacity(2);
        for packed in [&lane.rkey, &lane.control_rkey] {
            let mut out: ffi::RKey = std::ptr::null_mut();
            // SAFETY: a live endpoint; `packed` is a buffer of the length the
            // sealed metadata carries (see `docs/security.md` on what UCX
            // parses); a valid out-pointer.
            let s = ep
                .with_raw(|raw| unsafe {
                    (ucx.api.ep_rkey_unpack)(raw, packed.as_ptr().cast(), &mut out)
                })
                .unwrap_or(ffi::UCS_ERR_CANCELED);
            if s != ffi::UCS_OK {
                for k in unpacked {
                    // SAFETY: unpacked above, used by nothing.
                    unsafe { (ucx.api.rkey_destroy)(k) };
                }
                return Err(no_lane(format!("ucp_ep_rkey_unpack: {}", ucx.api.describe(s))).into());
            }
            unpacked.push(out);
        }
        Keys {
            data: unpacked[0],
            control: unpacked[1],
        }
    };
    let held = UcxHeld {
        keys,
        ep,
        lane,
        block_size: meta.block_size,
        stop,
        producer: Mutex::new(0),
        grant: meta.grant,
        meta: meta.clone(),
        revoked: AtomicBool::new(false),
    };
    let held = tokio::task::spawn_blocking(move || held.control(&[]).map(|_| held))
        .await
        .map_err(|e| crate::Error::Config(format!("opening a grant failed: {e}")))??;
    Ok(held)
}

impl UcxHeld {
    pub(in crate::grant) fn metadata(&self) -> &GrantMetadata {
        &self.meta
    }

    /// Whether an operation found the grant revoked or its owner gone.
    pub(in crate::grant) fn seen_revoked(&self) -> bool {
        self.revoked.load(SeqCst)
    }

    /// The generations of blocks `indices`, read one-sidedly in one
    /// batch (with the state: `Revoked` if the grant is).
    pub(in crate::grant) fn generations(&self, indices: &[u32]) -> Result<Vec<u32>> {
        let refs: Vec<BlockRef> = indices.iter().map(|&i| BlockRef::new(i, 0)).collect();
        check::blocks(&refs, self.meta.block_count)?;
        let mut words = self.words(&refs)?;
        words.remove(0);
        Ok(words)
    }

    /// Waits for `batch`, at most [`STEP`]; a failure is UCX's words.
    /// `Err(None)`: it did not end (buffers it writes must be leaked).
    fn wait(&self, batch: &Batch) -> std::result::Result<(), Option<String>> {
        let api = &self.ep.worker.ucx.api;
        match batch.wait_until(&self.ep.worker, Some(Instant::now() + STEP)) {
            None => Err(None),
            Some(None) => Ok(()),
            Some(Some(s)) => Err(Some(
                self.ep
                    .failure()
                    .map_or_else(|| api.describe(s), |f| format!("{}: {f}", api.describe(s))),
            )),
        }
    }

    /// Reads the state and the generations of `remote` one-sidedly and
    /// checks them: `Revoked`, `StaleGeneration`, or the words read.
    fn control(&self, remote: &[BlockRef]) -> Result<()> {
        let words = self.words(remote)?;
        check::generations(remote, |i| {
            remote
                .iter()
                .position(|r| r.index == i)
                .map_or(u32::MAX, |p| words[p + 1])
        })?;
        Ok(())
    }

    /// The state (checked: `Revoked`), then the generations of `remote`,
    /// read one-sidedly in one batch.
    fn words(&self, remote: &[BlockRef]) -> Result<Vec<u32>> {
        let mut words = vec![0u32; 1 + remote.len()];
        let batch = Batch::new();
        let api = &self.ep.worker.ucx.api;
        let base = self.lane.control_base;
        let at = |i: usize| -> u64 {
            if i == 0 {
                base + STATE_AT as u64
            } else {
                base + GENERATIONS as u64 + 4 * u64::from(remote[i - 1].index)
            }
        };
        let mut posted = Ok(());
        for i in 0..words.len() {
            let dst = words[i..].as_mut_ptr().cast::<u8>();
            // SAFETY: `words` lives until the batch ended (waited below; on
            // a timeout it is leaked), 4 writable bytes at `dst`; the
            // control key is unpacked on this endpoint and outlives it.
            posted = unsafe { post_get(&self.ep, &batch, dst, 4, at(i), self.keys.control) };
            if posted.is_err() {
                break;
            }
        }
        let what = "reading the grant's state";
        match (self.wait(&batch), posted) {
            (Err(None), _) => {
                std::mem::forget(words);
                return Err(failed(what, format!("no answer in {STEP:?}")).into());
            }
            (_, Err(s)) => {
                self.revoked.store(true, SeqCst);
                return Err(failed(what, api.describe(s)).into());
            }
            (Err(Some(why)), _) => {
                self.revoked.store(true, SeqCst);
                return Err(failed(what, why).into());
            }
            (Ok(()), Ok(())) => {}
        }
        if words[0] != LIVE {
            self.revoked.store(true, SeqCst);
            return Err(GrantError::Revoked.into());
        }
        Ok(words)
    }

    /// The owner's address of block `index`.
    fn addr(&self, index: u32) -> u64 {
        self.lane.base + u64::from(index) * self.block_size
    }

    /// Reads `remote` into `local_blocks` of `local` (checked by the
    /// caller: rights, range, shapes).
    pub(in crate::grant) fn read(
        &self,
        remote: &[BlockRef],
        local: &Pool,
        local_blocks: &[u32],
    ) -> Result<()> {
        let desc = local.blocks(local_blocks)?;
        let mut segs = Vec::with_capacity(desc.block_count());
        desc.raw_segments(&mut segs);
        self.control(remote)?;
        let batch = Batch::new();
        let api = &self.ep.worker.ucx.api;
        for (&(dst, n), r) in segs.iter().zip(remote) {
            // SAFETY: `desc` holds the local blocks exclusively until the
            // batch ended (leaked if it never does); the data key is
            // unpacked on this endpoint and outlives the batch.
            let p =
                unsafe { post_get(&self.ep, &batch, dst, n, self.addr(r.index), self.keys.data) };
            if let Err(s) = p {
                if self.wait(&batch).is_err_and(|e| e.is_none()) {
                    std::mem::forget(desc);
                }
                return Err(failed("a get", api.describe(s)).into());
            }
        }
        self.finish(batch, "a get", desc)
    }

    /// Writes `local_blocks` of `local` into `remote`, flushed, then sends
    /// `notify` as the grant's notification.
    pub(in crate::grant) fn write(
        &self,
        local: &Pool,
        local_blocks: &[u32],
        remote: &[BlockRef],
        notify: Option<Vec<u8>>,
    ) -> Result<()> {
        let desc = local.shared_blocks(local_blocks)?;
        let mut segs = Vec::with_capacity(desc.block_count());
        desc.raw_segments(&mut segs);
        self.control(remote)?;
        let batch = Batch::new();
        let api = &self.ep.worker.ucx.api;
        for (&(src, n), r) in segs.iter().zip(remote) {
            let (addr, key) = (self.addr(r.index), self.keys.data);
            // SAFETY: `desc` holds the local blocks shared (readable, no
            // writer) until the batch ended (leaked if it never does); the
            // key outlives the batch.
            let p = unsafe {
                post_with(&self.ep, &batch, None, |raw, param| {
                    (api.put_nbx)(raw, src.cast_const().cast(), n, addr, key, param)
                })
            };
            if let Err(s) = p {
                if self.wait(&batch).is_err_and(|e| e.is_none()) {
                    std::mem::forget(desc);
                }
                return Err(failed("a put", api.describe(s)).into());
            }
        }
        // The puts are complete at the owner once the flush ends.
        // SAFETY: a flush hands UCX nothing of ours.
        let f = unsafe {
            post_with(&self.ep, &batch, None, |raw, param| {
                (api.ep_flush_nbx)(raw, param)
            })
        };
        if let Err(s) = f {
            if self.wait(&batch).is_err_and(|e| e.is_none()) {
                std::mem::forget(desc);
            }
            return Err(failed("a flush", api.describe(s)).into());
        }
        self.finish(batch, "a put", desc)?;
        match notify {
            Some(payload) => {
                let first = remote.first().map_or(0, |r| r.index);
                self.notify(NotificationKind::Write, first, remote.len(), payload)
            }
            None => Ok(()),
        }
    }

    /// Waits for the transfer's batch, then gives the local blocks back
    /// (leaks them if the batch never ends: UCX may still touch them).
    fn finish<D>(&self, batch: Arc<Batch>, what: &str, desc: D) -> Result<()> {
        match self.wait(&batch) {
            Ok(()) => Ok(()),
            Err(None) => {
                std::mem::forget(desc);
                Err(failed(what, format!("no answer in {STEP:?}")).into())
            }
            Err(Some(why)) => Err(failed(what, why).into()),
        }
    }

    /// Sends the notification of an operation (`first` block, `count`
    /// blocks or ranges): an active message to the grant's worker, which
    /// queues it into the grant's ring.
    fn notify(
        &self,
        kind: NotificationKind,
        first: u32,
        count: usize,
        payload: Vec<u8>,
    ) -> Result<()> {
        let mut seq = tu::lock(&self.producer);
        let h = Box::new(encode_header(
            self.grant,
            *seq + 1,
            first,
            count as u32,
            kind,
        ));
        let api = &self.ep.worker.ucx.api;
        let batch = Batch::new();
        let (hp, pp, pl) = (h.as_ptr(), payload.as_ptr(), payload.len());
        // SAFETY: the header and payload live until the batch ended
        // (waited below; leaked if it never does).
        let r = unsafe {
            post_with(
                &self.ep,
                &batch,
                Some(ffi::UCP_AM_SEND_FLAG_EAGER),
                |raw, param| {
                    (api.am_send_nbx)(raw, AM_ID, hp.cast(), h.len(), pp.cast(), pl, param)
                },
            )
        };
        let ended = match r {
            Err(s) => Err(Some(api.describe(s))),
            Ok(()) => self.wait(&batch),
        };
        match ended {
            Ok(()) => {
                *seq += 1;
                Ok(())
            }
            Err(None) => {
                std::mem::forget(payload);
                std::mem::forget(h);
                Err(failed("a notification", format!("no answer in {STEP:?}")).into())
            }
            Err(Some(why)) => Err(failed("a notification", why).into()),
        }
    }
}
