//! A model of the CUDA driver API over host memory: the functions Ferry
//! resolves from `libcuda` (`crates/ferry/src/cuda/driver.rs`), built as
//! `libferry_fake_cuda.so` and loaded in its place with
//! `FERRY_CUDA_LIB=target/debug/libferry_fake_cuda.so`. On a machine
//! without a GPU, Ferry then runs the code it runs with a real driver:
//! contexts, device buffers, pinned staging buffers, streams, the pointer
//! checks, CUDA IPC export and import between processes, and its copies.
//!
//! It models what a driver would make fail, and is stricter where Ferry's
//! own discipline is at stake:
//!
//! - device memory is a `memfd` whose given address has no access: host
//!   code touching a device address faults, `process_vm_readv` of it fails;
//! - calls that need a context fail without a current, retained one;
//!   releasing a primary context's last reference resets it (its memory
//!   and streams are gone, as the driver's `cuDevicePrimaryCtxRelease`
//!   does);
//! - asynchronous copies land only when their stream is synchronized (or
//!   memory is freed, which synchronizes the device), so reading a
//!   destination before the wait sees the old bytes;
//! - IPC handles name a process and one of its allocations: a handle of a
//!   dead process, of a freed allocation or of this process fails to open,
//!   and a handle opened again in one context is counted (the same
//!   address; the mapping goes with its last `cuIpcCloseMemHandle`);
//! - copies outside an allocation, unknown streams, frees of unknown
//!   addresses and calls before `cuInit` are the caller's mistake: told on
//!   standard error, then the process aborts (`FERRY_FAKE_CUDA_MISUSE=error`
//!   returns the error instead).
//!
//! `FERRY_FAKE_CUDA_DEVICES` sets the number of devices (1; 0 makes
//! `cuInit` fail with `CUDA_ERROR_NO_DEVICE`); `FERRY_FAKE_CUDA_TRACE`
//! tells every refusal. Nothing here measures anything: its copies are
//! `memcpy`s.
//!
//! Every function follows `cuda.h`'s signature; the `# Safety` of each is
//! the driver API's: out pointers are valid for writes of their type, and
//! host ranges handed to copies are valid for their length.

mod codes;
mod model;

use std::ffi::{c_char, c_int, c_uint, c_void};

use codes::*;
use model::{lock, misuse, refuse, Copy, Model, Place};

/// `CUipcMemHandle`: 64 bytes, passed by value.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct IpcMemHandle {
    reserved: [c_char; 64],
}

/// `CUuuid`.
#[repr(C)]
pub struct CuUuid {
    bytes: [c_char; 16],
}

const HANDLE_MAGIC: &[u8; 8] = b"FERRYFKC";
const CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS: c_uint = 1;
const CU_POINTER_ATTRIBUTE_MEMORY_TYPE: c_int = 2;
const CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL: c_int = 9;
const CU_MEMORYTYPE_HOST: c_uint = 1;
const CU_MEMORYTYPE_DEVICE: c_uint = 2;

/// Runs `f` on the initialised model.
fn with(call: &str, f: impl FnOnce(&mut Model) -> CuResult) -> CuResult {
    let mut g = lock();
    match g.as_mut().filter(|m| m.initialised) {
        Some(m) => f(m),
        None => misuse(call, NOT_INITIALIZED, "called before cuInit"),
    }
}

/// [`with`], for calls that need a current, retained context: `f` also
/// gets its device.
fn with_ctx(call: &str, f: impl FnOnce(&mut Model, u32) -> CuResult) -> CuResult {
    with(call, |m| match m.current_device(call) {
        Ok(dev) => f(m, dev),
        Err(r) => r,
    })
}

/// Writes `v` through an out pointer, refusing a null one.
///
/// # Safety
///
/// `p` is null or valid for a write of `T`.
unsafe fn put<T>(call: &str, p: *mut T, v: T) -> CuResult {
    if p.is_null() {
        return misuse(call, INVALID_VALUE, "a null out pointer");
    }
    // SAFETY: non-null, and valid for a write by the caller's contract.
    unsafe { p.write(v) };
    SUCCESS
}

/// # Safety
///
/// None beyond the driver API's (no pointer is taken).
#[no_mangle]
pub unsafe extern "C" fn cuInit(flags: c_uint) -> CuResult {
    if flags != 0 {
        return misuse("cuInit", INVALID_VALUE, "flags must be 0");
    }
    let devices = std::env::var("FERRY_FAKE_CUDA_DEVICES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1u32);
    if devices == 0 {
        return NO_DEVICE;
    }
    lock().get_or_insert_with(Model::default).init(devices);
    SUCCESS
}

/// # Safety
///
/// `v` is valid for a write of an `int`.
#[no_mangle]
pub unsafe extern "C" fn cuDriverGetVersion(v: *mut c_int) -> CuResult {
    // SAFETY: the caller's contract.
    unsafe { put("cuDriverGetVersion", v, 12040) }
}

/// # Safety
///
/// `n` is valid for a write of an `int`.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetCount(n: *mut c_int) -> CuResult {
    // SAFETY: the caller's contract.
    with("cuDeviceGetCount", |m| unsafe {
        put("cuDeviceGetCount", n, m.devices as c_int)
    })
}

/// # Safety
///
/// `dev` is valid for a write of a `CUdevice`.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGet(dev: *mut c_int, ordinal: c_int) -> CuResult {
    with("cuDeviceGet", |m| {
        if ordinal < 0 || ordinal as u32 >= m.devices {
            return refuse("cuDeviceGet", INVALID_DEVICE, "no such ordinal");
        }
        // SAFETY: the caller's contract.
        unsafe { put("cuDeviceGet", dev, ordinal) }
    })
}

/// # Safety
///
/// `buf` is valid for writes of `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetName(buf: *mut c_char, len: c_int, dev: c_int) -> CuResult {
    with("cuDeviceGetName", |m| {
        if dev < 0 || dev as u32 >= m.devices {
            return refuse("cuDeviceGetName", INVALID_DEVICE, "no such device");
        }
        if buf.is_null() || len <= 0 {
            return misuse("cuDeviceGetName", INVALID_VALUE, "no buffer");
        }
        let name = b"Ferry fake CUDA device (host memory)";
        let n = name.len().min(len as usize - 1);
        // SAFETY: `buf` holds `len` bytes (the caller's contract); `n + 1`
        // of them are written.
        unsafe {
            std::ptr::copy_nonoverlapping(name.as_ptr().cast::<c_char>(), buf, n);
            buf.add(n).write(0);
        }
        SUCCESS
    })
}

/// # Safety
///
/// `uuid` is valid for a write of a `CUuuid`.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetUuid_v2(uuid: *mut CuUuid, dev: c_int) -> CuResult {
    with("cuDeviceGetUuid_v2", |m| {
        if dev < 0 || dev as u32 >= m.devices {
            return refuse("cuDeviceGetUuid_v2", INVALID_DEVICE, "no such device");
        }
        // The same in every process, as one GPU's UUID is.
        let mut bytes = [0 as c_char; 16];
        for (b, c) in bytes.iter_mut().zip(b"ferry-fake-cuda") {
            *b = *c as c_char;
        }
        bytes[15] = dev as c_char;
        // SAFETY: the caller's contract.
        unsafe { put("cuDeviceGetUuid_v2", uuid, CuUuid { bytes }) }
    })
}

/// # Safety
///
/// `ctx` is valid for a write of a `CUcontext`.
#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxRetain(ctx: *mut *mut c_void, dev: c_int) -> CuResult {
    with("cuDevicePrimaryCtxRetain", |m| {
        if dev < 0 || dev as u32 >= m.devices {
            return refuse("cuDevicePrimaryCtxRetain", INVALID_DEVICE, "no such device");
        }
        let h = m.retain(dev as u32);
        // SAFETY: the caller's contract.
        unsafe { put("cuDevicePrimaryCtxRetain", ctx, h as *mut c_void) }
    })
}

/// # Safety
///
/// None beyond the driver API's.
#[no_mangle]
pub unsafe extern "C" fn cuDevicePrimaryCtxRelease_v2(dev: c_int) -> CuResult {
    // A reset unmaps memory: no copy may run under it.
    let _gate = model::exclusive();
    with("cuDevicePrimaryCtxRelease_v2", |m| {
        if dev < 0 || dev as u32 >= m.devices {
            return refuse(
                "cuDevicePrimaryCtxRelease_v2",
                INVALID_DEVICE,
                "no such device",
            );
        }
        m.release(dev as u32)
    })
}

/// # Safety
///
/// None beyond the driver API's (the handle is not dereferenced).
#[no_mangle]
pub unsafe extern "C" fn cuCtxSetCurrent(ctx: *mut c_void) -> CuResult {
    with("cuCtxSetCurrent", |m| {
        if !ctx.is_null() && m.ctx_device(ctx as usize).is_none() {
            return misuse("cuCtxSetCurrent", INVALID_CONTEXT, "not a context handle");
        }
        model::set_current(ctx as usize);
        SUCCESS
    })
}

/// # Safety
///
/// `ctx` is valid for a write of a `CUcontext`.
#[no_mangle]
pub unsafe extern "C" fn cuCtxGetCurrent(ctx: *mut *mut c_void) -> CuResult {
    // SAFETY: the caller's contract.
    with("cuCtxGetCurrent", |_| unsafe {
        put("cuCtxGetCurrent", ctx, model::current() as *mut c_void)
    })
}

/// # Safety
///
/// `p` is valid for a write of a `CUdeviceptr`.
#[no_mangle]
pub unsafe extern "C" fn cuMemAlloc_v2(p: *mut u64, size: usize) -> CuResult {
    const CALL: &str = "cuMemAlloc_v2";
    with_ctx(CALL, |m, dev| {
        if size == 0 {
            return refuse(CALL, INVALID_VALUE, "0 bytes");
        }
        let id = m.next_id();
        match model::map_device(size as u64, dev, id) {
            Ok((base, alloc)) => {
                m.insert(base, alloc);
                // SAFETY: the caller's contract.
                unsafe { put(CALL, p, base) }
            }
            Err(e) => refuse(CALL, OUT_OF_MEMORY, &e),
        }
    })
}

/// Frees what `alloc` names, if it is of the kind `want` says.
fn free(call: &str, addr: u64, want: fn(&model::Kind) -> bool) -> CuResult {
    let _gate = model::exclusive();
    with(call, |m| {
        m.flush();
        match m.find(addr) {
            Some((base, a)) if base == addr && want(&a.kind) => {
                // An opened allocation stays mapped until its last close.
                if m.close_one(base) {
                    m.unmap(base);
                }
                SUCCESS
            }
            Some((base, a)) => misuse(
                call,
                INVALID_VALUE,
                &format!(
                    "{addr:#x} is not what this call frees ({:?} at {base:#x})",
                    a.kind
                ),
            ),
            None if m.was_reset(addr) => misuse(
                call,
                INVALID_CONTEXT,
                &format!(
                    "{addr:#x} was freed when its primary context was released for the \
                     last time"
                ),
            ),
            None => misuse(call, INVALID_VALUE, &format!("{addr:#x} is not allocated")),
        }
    })
}

/// # Safety
///
/// None beyond the driver API's.
#[no_mangle]
pub unsafe extern "C" fn cuMemFree_v2(p: u64) -> CuResult {
    free("cuMemFree_v2", p, |k| {
        matches!(k, model::Kind::Device { .. })
    })
}

/// A copy run now, in the current context.
fn copy_now(call: &'static str, dst: Place, src: Place, n: usize) -> CuResult {
    let r = with_ctx(call, |_, _| SUCCESS);
    if r != SUCCESS {
        return r;
    }
    model::run(&[Copy { dst, src, n, call }])
}

/// A copy queued on `stream` (the null stream: the current context's
/// legacy stream).
fn copy_async(
    call: &'static str,
    dst: Place,
    src: Place,
    n: usize,
    stream: *mut c_void,
) -> CuResult {
    with_ctx(call, |m, here| {
        let s = if stream.is_null() {
            model::legacy_stream(here)
        } else {
            stream as usize
        };
        if !m.has_stream(s) {
            return misuse(call, INVALID_HANDLE, &format!("unknown stream {s:#x}"));
        }
        let c = Copy { dst, src, n, call };
        if let Err(e) = m.check(&c) {
            return misuse(call, ILLEGAL_ADDRESS, &e);
        }
        m.enqueue(s, c);
        SUCCESS
    })
}

/// # Safety
///
/// `src` is valid for reads of `n` bytes.
#[no_mangle]
pub unsafe extern "C" fn cuMemcpyHtoD_v2(dst: u64, src: *const c_void, n: usize) -> CuResult {
    copy_now(
        "cuMemcpyHtoD_v2",
        Place::Device(dst),
        Place::Host(src as usize),
        n,
    )
}

/// # Safety
///
/// `dst` is valid for writes of `n` bytes.
#[no_mangle]
pub unsafe extern "C" fn cuMemcpyDtoH_v2(dst: *mut c_void, src: u64, n: usize) -> CuResult {
    copy_now(
        "cuMemcpyDtoH_v2",
        Place::Host(dst as usize),
        Place::Device(src),
        n,
    )
}

/// # Safety
///
/// None beyond the driver API's.
#[no_mangle]
pub unsafe extern "C" fn cuMemcpyDtoD_v2(dst: u64, src: u64, n: usize) -> CuResult {
    // The driver does not make the host wait for a device-to-device copy:
    // it lands when the legacy stream is synchronized (or at a free).
    let (d, s) = (Place::Device(dst), Place::Device(src));
    copy_async("cuMemcpyDtoD_v2", d, s, n, std::ptr::null_mut())
}

/// # Safety
///
/// `src` stays valid for reads of `n` bytes until the stream is synchronized.
#[no_mangle]
pub unsafe extern "C" fn cuMemcpyHtoDAsync_v2(
    dst: u64,
    src: *const c_void,
    n: usize,
    stream: *mut c_void,
) -> CuResult {
    let (d, s) = (Place::Device(dst), Place::Host(src as usize));
    copy_async("cuMemcpyHtoDAsync_v2", d, s, n, stream)
}

/// # Safety
///
/// `dst` stays valid for writes of `n` bytes until the stream is synchronized.
#[no_mangle]
pub unsafe extern "C" fn cuMemcpyDtoHAsync_v2(
    dst: *mut c_void,
    src: u64,
    n: usize,
    stream: *mut c_void,
) -> CuResult {
    let (d, s) = (Place::Host(dst as usize), Place::Device(src));
    copy_async("cuMemcpyDtoHAsync_v2", d, s, n, stream)
}

/// # Safety
///
/// None beyond the driver API's.
#[no_mangle]
pub unsafe extern "C" fn cuMemcpyDtoDAsync_v2(
    dst: u64,
    src: u64,
    n: usize,
    stream: *mut c_void,
) -> CuResult {
    let (d, s) = (Place::Device(dst), Place::Device(src));
    copy_async("cuMemcpyDtoDAsync_v2", d, s, n, stream)
}

/// # Safety
///
/// `p` is valid for a write of a pointer.
#[no_mangle]
pub unsafe extern "C" fn cuMemHostAlloc(
    p: *mut *mut c_void,
    size: usize,
    _flags: c_uint,
) -> CuResult {
    const CALL: &str = "cuMemHostAlloc";
    with_ctx(CALL, |m, dev| {
        if size == 0 {
            return refuse(CALL, INVALID_VALUE, "0 bytes");
        }
        match model::map_pinned(size as u64, dev) {
            Ok((base, alloc)) => {
                m.insert(base, alloc);
                // SAFETY: the caller's contract.
                unsafe { put(CALL, p, base as *mut c_void) }
            }
            Err(e) => refuse(CALL, OUT_OF_MEMORY, &e),
        }
    })
}

/// # Safety
///
/// None beyond the driver API's.
#[no_mangle]
pub unsafe extern "C" fn cuMemFreeHost(p: *mut c_void) -> CuResult {
    free("cuMemFreeHost", p as u64, |k| {
        matches!(k, model::Kind::Pinned)
    })
}

/// # Safety
///
/// `s` is valid for a write of a `CUstream`.
#[no_mangle]
pub unsafe extern "C" fn cuStreamCreate(s: *mut *mut c_void, flags: c_uint) -> CuResult {
    const CALL: &str = "cuStreamCreate";
    with_ctx(CALL, |m, dev| {
        if flags > 1 {
            return misuse(CALL, INVALID_VALUE, &format!("flags {flags:#x}"));
        }
        let h = m.add_stream(dev);
        // SAFETY: the caller's contract.
        unsafe { put(CALL, s, h as *mut c_void) }
    })
}

/// # Safety
///
/// None beyond the driver API's.
#[no_mangle]
pub unsafe extern "C" fn cuStreamDestroy_v2(s: *mut c_void) -> CuResult {
    const CALL: &str = "cuStreamDestroy_v2";
    // The driver lets queued work finish: here, before the stream goes.
    let r = model::synchronize(s as usize, CALL);
    if r != SUCCESS {
        return r;
    }
    with(CALL, |m| {
        m.remove_stream(s as usize);
        SUCCESS
    })
}

/// # Safety
///
/// None beyond the driver API's.
#[no_mangle]
pub unsafe extern "C" fn cuStreamSynchronize(s: *mut c_void) -> CuResult {
    const CALL: &str = "cuStreamSynchronize";
    if s.is_null() {
        // The current context's legacy stream.
        let mut legacy = 0;
        let r = with_ctx(CALL, |_, d| {
            legacy = model::legacy_stream(d);
            SUCCESS
        });
        if r != SUCCESS {
            return r;
        }
        return model::synchronize(legacy, CALL);
    }
    model::synchronize(s as usize, CALL)
}

/// # Safety
///
/// `data` is valid for a write of the attribute's type.
#[no_mangle]
pub unsafe extern "C" fn cuPointerGetAttribute(
    data: *mut c_void,
    attr: c_int,
    ptr: u64,
) -> CuResult {
    const CALL: &str = "cuPointerGetAttribute";
    with(CALL, |m| {
        let Some((_, a)) = m.find(ptr) else {
            return refuse(CALL, INVALID_VALUE, &format!("{ptr:#x} is not known"));
        };
        let pinned = matches!(a.kind, model::Kind::Pinned);
        match attr {
            CU_POINTER_ATTRIBUTE_MEMORY_TYPE => {
                let t = if pinned {
                    CU_MEMORYTYPE_HOST
                } else {
                    CU_MEMORYTYPE_DEVICE
                };
                // SAFETY: a `CUmemorytype` (the caller's contract).
                unsafe { put(CALL, data.cast::<c_uint>(), t) }
            }
            CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL => {
                // SAFETY: an `int` (the caller's contract).
                unsafe { put(CALL, data.cast::<c_int>(), a.device as c_int) }
            }
            _ => refuse(
                CALL,
                INVALID_VALUE,
                &format!("attribute {attr} is not modelled"),
            ),
        }
    })
}

/// # Safety
///
/// `h` is valid for a write of a `CUipcMemHandle`.
#[no_mangle]
pub unsafe extern "C" fn cuIpcGetMemHandle(h: *mut IpcMemHandle, ptr: u64) -> CuResult {
    const CALL: &str = "cuIpcGetMemHandle";
    with_ctx(CALL, |m, _| {
        let Some((_, a)) = m.find(ptr) else {
            return refuse(CALL, INVALID_VALUE, &format!("{ptr:#x} is not allocated"));
        };
        let model::Kind::Device { fd, id } = a.kind else {
            return refuse(CALL, INVALID_VALUE, "not memory of cuMemAlloc");
        };
        let mut b = [0u8; 64];
        b[..8].copy_from_slice(HANDLE_MAGIC);
        b[8..12].copy_from_slice(&std::process::id().to_le_bytes());
        b[12..16].copy_from_slice(&fd.to_le_bytes());
        b[16..24].copy_from_slice(&id.to_le_bytes());
        b[24..32].copy_from_slice(&a.size.to_le_bytes());
        b[32..36].copy_from_slice(&a.device.to_le_bytes());
        let reserved = b.map(|x| x as c_char);
        // SAFETY: the caller's contract.
        unsafe { put(CALL, h, IpcMemHandle { reserved }) }
    })
}

/// # Safety
///
/// `p` is valid for a write of a `CUdeviceptr`.
#[no_mangle]
pub unsafe extern "C" fn cuIpcOpenMemHandle_v2(
    p: *mut u64,
    h: IpcMemHandle,
    flags: c_uint,
) -> CuResult {
    const CALL: &str = "cuIpcOpenMemHandle_v2";
    with_ctx(CALL, |m, here| {
        if flags != CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS {
            return misuse(
                CALL,
                INVALID_VALUE,
                "flags must be CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS",
            );
        }
        let b = h.reserved.map(|c| c as u8);
        if &b[..8] != HANDLE_MAGIC {
            return refuse(CALL, INVALID_VALUE, "not a handle of this model");
        }
        let word = |r: std::ops::Range<usize>| {
            let mut x = [0u8; 8];
            x[..r.len()].copy_from_slice(&b[r]);
            u64::from_le_bytes(x)
        };
        let (pid, fd, id, size, _exporter_device) = (
            word(8..12) as u32,
            word(12..16) as i32,
            word(16..24),
            word(24..32),
            word(32..36) as u32,
        );
        if pid == std::process::id() {
            eprintln!("ferry-fake-cuda: {CALL}: a handle of this very process");
            return refuse(CALL, INVALID_CONTEXT, "a handle of this process");
        }
        // Opened in this context already: the same address, counted.
        if let Some(base) = m.reopen(pid, id, here) {
            // SAFETY: the caller's contract.
            return unsafe { put(CALL, p, base) };
        }
        let file = match open_peer(pid, fd, id, size) {
            Ok(f) => f,
            Err(e) => return refuse(CALL, INVALID_VALUE, &e),
        };
        use std::os::fd::AsRawFd;
        match model::map_fd(file.as_raw_fd(), size) {
            Ok((base, backing)) => {
                // The mappings keep the memory; the descriptor closes here.
                drop(file);
                // Recorded under the device of the context that opened it
                // (the exporter's device only names where the bytes are).
                m.insert(base, model::opened(size, here, pid, id, backing));
                // SAFETY: the caller's contract.
                unsafe { put(CALL, p, base) }
            }
            Err(e) => refuse(CALL, OUT_OF_MEMORY, &e),
        }
    })
}

/// Opens allocation `id` of process `pid` by its `memfd`, checking that
/// the descriptor still is that allocation of `size` bytes.
fn open_peer(pid: u32, fd: i32, id: u64, size: u64) -> Result<std::fs::File, String> {
    let path = format!("/proc/{pid}/fd/{fd}");
    let target = std::fs::read_link(&path).map_err(|e| format!("{path}: {e}"))?;
    let want = format!("/memfd:ferry-fake-cuda-{id} ");
    if !target.to_string_lossy().starts_with(&want) {
        return Err(format!("{path} is no longer allocation {id}"));
    }
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .map_err(|e| format!("{path}: {e}"))?;
    let len = f.metadata().map_err(|e| e.to_string())?.len();
    if len != size {
        return Err(format!("{path} holds {len} bytes, the handle says {size}"));
    }
    Ok(f)
}

/// # Safety
///
/// None beyond the driver API's.
#[no_mangle]
pub unsafe extern "C" fn cuIpcCloseMemHandle(p: u64) -> CuResult {
    free("cuIpcCloseMemHandle", p, |k| {
        matches!(k, model::Kind::Opened { .. })
    })
}

/// # Safety
///
/// `base` and `size` are each null or valid for a write of their type.
#[no_mangle]
pub unsafe extern "C" fn cuMemGetAddressRange_v2(
    base: *mut u64,
    size: *mut usize,
    p: u64,
) -> CuResult {
    const CALL: &str = "cuMemGetAddressRange_v2";
    with(CALL, |m| match m.find(p) {
        Some((b, a)) if !matches!(a.kind, model::Kind::Pinned) => {
            // SAFETY: each is null (not asked for) or writable.
            unsafe {
                if !base.is_null() {
                    base.write(b);
                }
                if !size.is_null() {
                    size.write(a.size as usize);
                }
            }
            SUCCESS
        }
        _ => refuse(CALL, NOT_FOUND, &format!("{p:#x} is not device memory")),
    })
}

/// # Safety
///
/// `s` is valid for a write of a pointer.
#[no_mangle]
pub unsafe extern "C" fn cuGetErrorName(code: CuResult, s: *mut *const c_char) -> CuResult {
    match c_name(code) {
        // SAFETY: the caller's contract; the name is static.
        Some(n) => unsafe { put("cuGetErrorName", s, n.as_ptr()) },
        None => INVALID_VALUE,
    }
}
