//! Registered memory and remote keys: what a source lends over UCX.
//!
//! A source registers exactly the ranges it lends (its region's segments,
//! neighbours merged), never more: a remote key grants the bytes of one
//! operation. The keys travel in the `Lease`, encoded by [`encode_keys`]:
//!
//! ```text
//! u32 count, then per key: u64 base, u64 length, u32 n, n bytes of packed rkey
//! ```
//!
//! (little endian). The destination unpacks them on its endpoint to the
//! source ([`RemoteKeys`]) and finds, for each lent segment, the key whose
//! range holds it.

use std::ffi::c_void;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use super::{check, ffi, Endpoint, Ucx};

/// Registrations alive in this process (see [`live`]), and made in all.
static LIVE: AtomicUsize = AtomicUsize::new(0);
static MADE: AtomicUsize = AtomicUsize::new(0);

/// How many ranges this process has registered with UCX in all.
pub(crate) fn made() -> usize {
    MADE.load(Ordering::Acquire)
}

/// How many ranges this process has registered with UCX and not yet
/// unregistered: each remote key a peer may hold works (on transports that
/// check keys) only while its range is counted here.
pub(crate) fn live() -> usize {
    LIVE.load(Ordering::Acquire)
}

/// The most keys one lease carries.
pub(crate) const MAX_KEYS: usize = 1 << 16;

/// One registered range (`ucp_mem_map`) and its packed remote key;
/// unregistered when dropped.
pub(crate) struct MemReg {
    ucx: &'static Ucx,
    memh: ffi::MemH,
    pub(crate) base: u64,
    pub(crate) len: u64,
    rkey: Vec<u8>,
    /// This process moves CUDA memory through UCX: unregistered with a
    /// CUDA context current, as registered.
    cuda: bool,
}

// SAFETY: a memory handle of a context shared between workers
// (`mt_workers_shared`); UCP's mapping calls are thread safe there.
unsafe impl Send for MemReg {}
// SAFETY: see `Send`; `&MemReg` reads only plain fields.
unsafe impl Sync for MemReg {}

impl MemReg {
    /// Registers `len` bytes at `base` with UCX and packs their remote key.
    ///
    /// The memory must stay mapped until the registration is dropped (the
    /// caller keeps it with the region that lends it).
    pub(crate) fn register(ucx: &'static Ucx, base: u64, len: u64) -> Result<Arc<MemReg>, String> {
        let api = &ucx.api;
        let params = ffi::MemMapParams {
            field_mask: ffi::UCP_MEM_MAP_PARAM_FIELD_ADDRESS | ffi::UCP_MEM_MAP_PARAM_FIELD_LENGTH,
            address: base as *mut c_void,
            length: len as usize,
            flags: 0,
            prot: 0,
            memory_type: 0,
        };
        let mut memh: ffi::MemH = std::ptr::null_mut();
        // SAFETY: a live context; the range is memory of this process that
        // the caller keeps mapped for the registration's life (see above);
        // no allocation flag, so UCX only registers it.
        check(
            api,
            unsafe { (api.mem_map)(ucx.context, &params, &mut memh) },
            "ucp_mem_map",
        )?;
        LIVE.fetch_add(1, Ordering::AcqRel);
        MADE.fetch_add(1, Ordering::AcqRel);
        // From here on dropping `reg` unregisters the memory (on failure).
        let mut reg = MemReg {
            ucx,
            memh,
            base,
            len,
            rkey: Vec::new(),
            cuda: super::moves_cuda(),
        };
        let mut buf: *mut c_void = std::ptr::null_mut();
        let mut n = 0usize;
        // SAFETY: a live context and handle, valid out-pointers.
        let s = unsafe { (api.rkey_pack)(ucx.context, memh, &mut buf, &mut n) };
        check(api, s, "ucp_rkey_pack")?;
        // SAFETY: UCX wrote `n` bytes at `buf`; copied, then released once.
        reg.rkey = unsafe { std::slice::from_raw_parts(buf.cast::<u8>(), n) }.to_vec();
        // SAFETY: the buffer `rkey_pack` returned, released once.
        unsafe { (api.rkey_buffer_release)(buf) };
        Ok(Arc::new(reg))
    }
}

impl MemReg {
    /// The packed remote key.
    pub(crate) fn rkey(&self) -> &[u8] {
        &self.rkey
    }
}

impl Drop for MemReg {
    fn drop(&mut self) {
        // SAFETY: a handle `mem_map` returned, unmapped once.
        let unmap = || unsafe { (self.ucx.api.mem_unmap)(self.ucx.context, self.memh) };
        if self.cuda {
            // UCX's CUDA transports release what they made of device
            // memory (an IPC export) in the thread's context.
            crate::cuda::context::on_any_device(unmap);
        } else {
            unmap();
        }
        LIVE.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The lease's key bytes for `regs`.
pub(crate) fn encode_keys(regs: &[Arc<MemReg>]) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&(regs.len() as u32).to_le_bytes());
    for r in regs {
        out.extend_from_slice(&r.base.to_le_bytes());
        out.extend_from_slice(&r.len.to_le_bytes());
        out.extend_from_slice(&(r.rkey.len() as u32).to_le_bytes());
        out.extend_from_slice(&r.rkey);
    }
    out
}

/// One key of a lease: `(base, length, packed remote key)`.
pub(crate) type LentKey<'a> = (u64, u64, &'a [u8]);

/// `(base, length, packed key)` per key of a lease, sorted by base, or why
/// the bytes are not a list of keys.
pub(crate) fn decode_keys(mut b: &[u8]) -> Result<Vec<LentKey<'_>>, String> {
    fn take<'a>(b: &mut &'a [u8], n: usize) -> Result<&'a [u8], String> {
        if b.len() < n {
            return Err("the lease's keys end early".into());
        }
        let (h, t) = b.split_at(n);
        *b = t;
        Ok(h)
    }
    let u32_ = |b: &mut &[u8]| -> Result<u32, String> {
        Ok(u32::from_le_bytes(
            take(b, 4)?.try_into().unwrap_or_default(),
        ))
    };
    let u64_ = |b: &mut &[u8]| -> Result<u64, String> {
        Ok(u64::from_le_bytes(
            take(b, 8)?.try_into().unwrap_or_default(),
        ))
    };
    let count = u32_(&mut b)? as usize;
    if count > MAX_KEYS {
        return Err(format!("{count} keys in one lease (at most {MAX_KEYS})"));
    }
    let mut out = Vec::with_capacity(count.min(b.len() / 20));
    for _ in 0..count {
        let base = u64_(&mut b)?;
        let len = u64_(&mut b)?;
        if base.checked_add(len).is_none() {
            return Err("a key's range overflows".into());
        }
        let n = u32_(&mut b)? as usize;
        let key = take(&mut b, n)?;
        if key.is_empty() {
            return Err("an empty remote key".into());
        }
        out.push((base, len, key));
    }
    if !b.is_empty() {
        return Err("bytes after the lease's keys".into());
    }
    out.sort_by_key(|k| k.0);
    Ok(out)
}

/// Remote keys unpacked on an endpoint, with their ranges; destroyed when
/// dropped.
pub(crate) struct RemoteKeys<'e> {
    ep: &'e Endpoint,
    keys: Vec<(u64, u64, ffi::RKey)>,
}

impl<'e> RemoteKeys<'e> {
    /// Unpacks the keys of a lease (from [`decode_keys`]) on `ep`.
    pub(crate) fn unpack(ep: &'e Endpoint, keys: &[LentKey<'_>]) -> Result<Self, String> {
        let api = &ep.worker.ucx.api;
        let mut out = RemoteKeys {
            ep,
            keys: Vec::with_capacity(keys.len()),
        };
        for &(base, len, packed) in keys {
            let mut rkey: ffi::RKey = std::ptr::null_mut();
            // SAFETY: a live endpoint (`with_raw`); `packed` is a buffer of
            // the length the peer sent (UCX reads the key's own length from
            // it: see the trust note in `ucx/mod.rs`); a valid out-pointer.
            let s = ep
                .with_raw(|raw| unsafe {
                    (api.ep_rkey_unpack)(raw, packed.as_ptr().cast(), &mut rkey)
                })
                .ok_or("the endpoint was closed")?;
            check(api, s, "ucp_ep_rkey_unpack")?;
            out.keys.push((base, len, rkey));
        }
        Ok(out)
    }

    /// The key whose range holds `len` bytes at `addr`.
    pub(crate) fn find(&self, addr: u64, len: u64) -> Option<ffi::RKey> {
        let i = self.keys.partition_point(|k| k.0 <= addr).checked_sub(1)?;
        let (base, n, rkey) = self.keys[i];
        let end = addr.checked_add(len)?;
        (end <= base + n).then_some(rkey)
    }

    pub(crate) fn endpoint(&self) -> &'e Endpoint {
        self.ep
    }
}

impl Drop for RemoteKeys<'_> {
    fn drop(&mut self) {
        for &(_, _, rkey) in &self.keys {
            // SAFETY: each key was unpacked once and no request uses it any
            // more (the pull waits for its requests before dropping these).
            unsafe { (self.ep.worker.ucx.api.rkey_destroy)(rkey) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_decode_as_encoded_and_refuse_garbage() {
        let mut b = Vec::new();
        b.extend_from_slice(&2u32.to_le_bytes());
        for (base, len, key) in [(4096u64, 100u64, &b"xyz"[..]), (0, 10, &b"a"[..])] {
            b.extend_from_slice(&base.to_le_bytes());
            b.extend_from_slice(&len.to_le_bytes());
            b.extend_from_slice(&(key.len() as u32).to_le_bytes());
            b.extend_from_slice(key);
        }
        let k = decode_keys(&b).unwrap();
        assert_eq!(k, vec![(0, 10, &b"a"[..]), (4096, 100, &b"xyz"[..])]);
        assert!(decode_keys(&b[..b.len() - 1]).is_err());
        let mut extra = b.clone();
        extra.push(0);
        assert!(decode_keys(&extra).is_err());
        assert!(decode_keys(&u32::MAX.to_le_bytes()).is_err());
        let mut over = 1u32.to_le_bytes().to_vec();
        over.extend_from_slice(&u64::MAX.to_le_bytes());
        over.extend_from_slice(&2u64.to_le_bytes());
        over.extend_from_slice(&1u32.to_le_bytes());
        over.push(1);
        assert!(decode_keys(&over).is_err());
    }
}
