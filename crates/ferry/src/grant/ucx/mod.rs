//! The UCX lane of grants, the owner's side: a UCX worker per grant, the
//! granted memory registered for this grant alone (its own memory handle),
//! the control words (state and generations) registered read-only for the
//! holder's one-sided checks, and an active-message handler that queues
//! the holder's notifications into the grant's ring.
//!
//! Revoking unmaps both registrations (with an RDMA transport the NIC then
//! refuses the keys) and shuts the grant's worker down (with transports
//! that emulate gets and puts, such as UCX over TCP, the owner's worker is
//! what answers them, with no key check: once it is destroyed nothing
//! answers). The holder's side is in [`holder`].

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::atomic::Ordering::SeqCst;
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

use ferry_proto::grant::{GrantError, GrantId, UcxGrant, MAX_NOTIFICATION};
use ferry_proto::Token;
use tokio::sync::watch;

use super::control::ControlPage;
use super::{ring, Notification, NotificationKind};
use crate::transport::ucx::{self as tu, ffi, lock, MemReg, Worker};

pub(super) mod holder;

/// The active-message id of grant notifications.
const AM_ID: u32 = 0x4647;
/// A notification's header: grant id, sequence, first block, block count.
const HEADER: usize = 28;
/// How long a revoke waits for the grant's worker to be destroyed.
const SHUTDOWN: Duration = Duration::from_secs(2);

/// The seal of a ucx section: SHA-256 of the grant's token, its id and the
/// section's other fields, cut to 16 bytes.
pub(super) fn seal(token: &Token, grant: GrantId, lane: &UcxGrant) -> [u8; 16] {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    h.update(b"ferry-grant-ucx-v1\0");
    h.update(token.as_bytes());
    h.update(grant.0.to_le_bytes());
    h.update(lane.sealed_bytes());
    let d: [u8; 32] = h.finalize().into();
    let mut out = [0; 16];
    out.copy_from_slice(&d[..16]);
    out
}

/// The control pages of this process's grants with a UCX lane, by grant
/// id: where the notification handler queues what a holder sends.
fn pages() -> &'static Mutex<HashMap<u64, Weak<ControlPage>>> {
    static PAGES: OnceLock<Mutex<HashMap<u64, Weak<ControlPage>>>> = OnceLock::new();
    PAGES.get_or_init(Default::default)
}

/// The UCX lane of one grant on its owner's side.
pub(super) struct UcxOwner {
    grant: GrantId,
    /// The grant's worker, until the grant is revoked.
    worker: Mutex<Option<Arc<Worker>>>,
    gone: Weak<Worker>,
    stop: watch::Sender<bool>,
    /// The granted memory's registration and the control words'.
    regs: Mutex<Vec<Arc<MemReg>>>,
}

impl UcxOwner {
    /// Starts the lane of grant `grant` over `len` bytes at `base`, with
    /// control page `page`: its section of the metadata (sealed with
    /// `token`). `emulated`: offered even where UCX has no RMA transport
    /// (gets and puts answered by this process; see `docs/security.md`).
    pub(super) fn start(
        grant: GrantId,
        token: &Token,
        base: u64,
        len: u64,
        page: &Arc<ControlPage>,
        emulated: bool,
    ) -> Result<(UcxOwner, UcxGrant), String> {
        let ucx = tu::ucx_for(true).map_err(str::to_string)?;
        if !emulated && !ucx.has_fast_transport() {
            return Err(format!(
                "UCX has no RDMA transport here ({}): its gets and puts would be emulated",
                ucx.describe()
            ));
        }
        let handle = tokio::runtime::Handle::try_current()
            .map_err(|_| "a grant's UCX lane needs a Tokio runtime".to_string())?;
        let (stop, rx) = watch::channel(false);
        let worker = Worker::start(&handle, rx, true)?;
        let owner = UcxOwner {
            grant,
            gone: Arc::downgrade(&worker),
            worker: Mutex::new(Some(worker.clone())),
            stop,
            regs: Mutex::new(Vec::new()),
        };
        let data = MemReg::register(ucx, base, len)?;
        let (cbase, clen) = page.control_words();
        let control = MemReg::register(ucx, cbase, clen)?;
        lock(pages()).insert(grant.0, Arc::downgrade(page));
        let params = ffi::AmHandlerParam {
            field_mask: ffi::UCP_AM_HANDLER_PARAM_FIELD_ID
                | ffi::UCP_AM_HANDLER_PARAM_FIELD_CB
                | ffi::UCP_AM_HANDLER_PARAM_FIELD_ARG,
            id: AM_ID,
            flags: 0,
            cb: Some(on_notification),
            arg: grant.0 as usize as *mut c_void,
        };
        // SAFETY: a live worker; `params` valid for its mask; the argument
        // is a plain number, not a pointer.
        let s = unsafe { (ucx.api.worker_set_am_recv_handler)(worker.raw(), &params) };
        tu::check(&ucx.api, s, "ucp_worker_set_am_recv_handler")?;
        let mut lane = UcxGrant {
            address: worker.address().to_vec(),
            rkey: data.rkey().to_vec(),
            base,
            control_rkey: control.rkey().to_vec(),
            control_base: cbase,
            seal: [0; 16],
        };
        lane.seal = seal(token, grant, &lane);
        *lock(&owner.regs) = vec![data, control];
        Ok((owner, lane))
    }

    /// Ends the lane: unmaps the registrations (an RDMA NIC refuses the
    /// keys from then on) and stops the grant's worker; `wait`: until it
    /// is destroyed (nothing answers an emulated get or put of the grant
    /// any more), at most [`SHUTDOWN`]. Whether it is gone.
    pub(super) fn shut(&self, wait: bool) -> bool {
        lock(&self.regs).clear();
        let _ = self.stop.send(true);
        if let Some(w) = lock(&self.worker).take() {
            w.wake();
        }
        let start = Instant::now();
        loop {
            if self.gone.strong_count() == 0 {
                lock(pages()).remove(&self.grant.0);
                return true;
            }
            if !wait || start.elapsed() > SHUTDOWN {
                return false;
            }
            std::thread::sleep(Duration::from_micros(500));
        }
    }
}

/// The lane of a new grant, as `want` says: `Some(true)` offered (even
/// where UCX emulates gets and puts) or refused with the reason;
/// `Some(false)` or `None`: none.
pub(super) fn offer(
    want: Option<bool>,
    grant: GrantId,
    token: &Token,
    base: u64,
    len: u64,
    page: &Arc<ControlPage>,
) -> Result<Option<(UcxOwner, UcxGrant)>, GrantError> {
    if want != Some(true) {
        return Ok(None);
    }
    UcxOwner::start(grant, token, base, len, page, true)
        .map(Some)
        .map_err(|why| GrantError::NoLane(format!("the UCX lane cannot start: {why}")))
}

impl Drop for UcxOwner {
    fn drop(&mut self) {
        self.shut(false);
        lock(pages()).remove(&self.grant.0);
    }
}

/// Decodes a notification's header.
fn header(h: &[u8]) -> Option<(u64, u64, u32, u32, NotificationKind)> {
    if h.len() != HEADER {
        return None;
    }
    let u64_ = |i: usize| u64::from_le_bytes(h[i..i + 8].try_into().unwrap_or_default());
    let u32_ = |i: usize| u32::from_le_bytes(h[i..i + 4].try_into().unwrap_or_default());
    let kind = match u32_(24) {
        1 => NotificationKind::Read,
        2 => NotificationKind::Write,
        3 => NotificationKind::Message,
        _ => return None,
    };
    Some((u64_(0), u64_(8), u32_(16), u32_(20), kind))
}

/// A notification's header, as the holder sends it: the grant, the
/// sequence number, the first block and block count, what (1 read, 2
/// write, 3 a bare message).
pub(super) fn encode_header(
    grant: GrantId,
    seq: u64,
    first: u32,
    count: u32,
    kind: NotificationKind,
) -> [u8; HEADER] {
    let kind: u32 = match kind {
        NotificationKind::Read => 1,
        NotificationKind::Write => 2,
        NotificationKind::Message => 3,
    };
    let mut h = [0u8; HEADER];
    h[..8].copy_from_slice(&grant.0.to_le_bytes());
    h[8..16].copy_from_slice(&seq.to_le_bytes());
    h[16..20].copy_from_slice(&first.to_le_bytes());
    h[20..24].copy_from_slice(&count.to_le_bytes());
    h[24..].copy_from_slice(&kind.to_le_bytes());
    h
}

/// `ucp_am_recv_callback_t` of the grant workers: queues a holder's
/// notification into its grant's ring (the owner's notification thread
/// hands it on), or drops it with a warning if it does not decode, names
/// another grant, or finds the ring full or held by a same-host holder.
unsafe extern "C" fn on_notification(
    arg: *mut c_void,
    header_ptr: *const c_void,
    header_len: usize,
    data: *mut c_void,
    len: usize,
    param: *const ffi::AmRecvParam,
) -> ffi::Status {
    let grant = arg as usize as u64;
    // SAFETY: UCX passes `header_len` readable bytes at `header_ptr`
    // (none when the length is 0), valid for this call.
    let h = (!header_ptr.is_null() && header_len == HEADER)
        .then(|| unsafe { std::slice::from_raw_parts(header_ptr.cast::<u8>(), header_len) });
    // SAFETY: UCX passes a valid parameter struct for this call.
    let rndv =
        !param.is_null() && unsafe { (*param).recv_attr } & ffi::UCP_AM_RECV_ATTR_FLAG_RNDV != 0;
    let payload = (!rndv && len <= MAX_NOTIFICATION && (len == 0 || !data.is_null())).then(|| {
        if len == 0 {
            Vec::new()
        } else {
            // SAFETY: not a rendezvous: `len` bytes of data at `data`,
            // valid for this call.
            unsafe { std::slice::from_raw_parts(data.cast::<u8>(), len) }.to_vec()
        }
    });
    match (h.and_then(header), payload) {
        (Some((g, seq, first, count, kind)), Some(payload)) if g == grant => {
            queue(
                grant,
                Notification {
                    seq,
                    kind,
                    first_block: first,
                    block_count: count,
                    payload,
                    holder: None,
                },
            );
        }
        _ => {
            tracing::warn!("a grant's UCX holder sent a notification that does not decode: dropped")
        }
    }
    ffi::UCS_OK
}

fn queue(grant: u64, n: Notification) {
    let Some(page) = lock(pages()).get(&grant).and_then(Weak::upgrade) else {
        return;
    };
    // The ring has one producer: this process's handler, unless a
    // same-host holder claimed the grant first.
    let me = std::process::id();
    match page.holder_pid().compare_exchange(0, me, SeqCst, SeqCst) {
        Ok(_) => {}
        Err(p) if p == me => {}
        Err(p) => {
            tracing::warn!("a grant held by process {p} got a UCX notification: dropped");
            return;
        }
    }
    if let Err(e) = ring::push(&page, &n, Duration::ZERO) {
        tracing::warn!("a grant's UCX notification was not queued: {e}");
    }
}

/// UCX's failure of an operation on the lane, typed.
pub(super) fn failed(what: &str, why: String) -> GrantError {
    GrantError::OwnerGone(format!(
        "{what} over UCX failed ({why}): the owner revoked the grant (its UCX worker is shut \
         down) or exited"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notification_headers_decode_as_encoded_and_refuse_other_shapes() {
        let h = encode_header(GrantId(7), 42, 3, 2, NotificationKind::Write);
        assert_eq!(header(&h), Some((7, 42, 3, 2, NotificationKind::Write)));
        let h = encode_header(GrantId(7), 43, 0, 0, NotificationKind::Message);
        assert_eq!(header(&h), Some((7, 43, 0, 0, NotificationKind::Message)));
        assert_eq!(header(&h[..27]), None);
        assert_eq!(header(&[0; 29]), None);
        let mut odd = h;
        odd[24] = 9;
        assert_eq!(header(&odd), None);
    }

    #[test]
    fn the_seal_covers_every_field_and_the_token() {
        let lane = UcxGrant {
            address: vec![1; 100],
            rkey: vec![2; 30],
            base: 4096,
            control_rkey: vec![3; 30],
            control_base: 8192,
            seal: [0; 16],
        };
        let t = Token::from_bytes([9; 16]);
        let s = seal(&t, GrantId(1), &lane);
        assert_ne!(s, seal(&Token::from_bytes([8; 16]), GrantId(1), &lane));
        assert_ne!(s, seal(&t, GrantId(2), &lane));
        let edits: [fn(&mut UcxGrant); 5] = [
            |l| l.address[0] ^= 1,
            |l| l.rkey.push(0),
            |l| l.base += 1,
            |l| l.control_rkey[5] = 0,
            |l| l.control_base -= 1,
        ];
        for edit in edits {
            let mut l = lane.clone();
            edit(&mut l);
            assert_ne!(s, seal(&t, GrantId(1), &l));
        }
    }
}
