//! The driver's state in one process: its devices, their primary contexts
//! and reference counts, each thread's current context, the allocations
//! (device memory, pinned host memory, a peer's memory opened by IPC) and
//! the streams with their queued copies.
//!
//! Device memory is a `memfd` mapped twice: once without access at the
//! address the caller is given (so that host code which touches a device
//! address faults, as it would on a GPU, and `process_vm_readv` of it
//! fails), once readable and writable where the model's copies read and
//! write. IPC hands the `memfd` over by `/proc/<pid>/fd/<fd>`.

use std::cell::Cell;
use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::ffi::c_int;
use std::sync::{Condvar, Mutex, MutexGuard, RwLock};

use crate::codes::*;

/// What a context handle is: a number the caller never dereferences.
const CTX_BASE: usize = 0x0c0d_e000;
/// What a stream handle is, likewise.
const STREAM_BASE: usize = 0x05e7_0000;
/// Where the handles of the devices' legacy (null) streams start: one per
/// device, which the null stream stands for in its primary context.
const LEGACY_BASE: usize = 0x0001_e600;

/// A place a copy reads or writes.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Place {
    /// An address the model gave out (device memory, pinned host memory or
    /// an opened peer's memory).
    Device(u64),
    /// Host memory of the caller's (any address that is not device memory).
    Host(usize),
}

/// One copy: queued on a stream until it is synchronized, or run at once.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Copy {
    pub(crate) dst: Place,
    pub(crate) src: Place,
    pub(crate) n: usize,
    pub(crate) call: &'static str,
}

/// What an allocation is.
#[derive(Debug)]
pub(crate) enum Kind {
    /// `cuMemAlloc_v2`: a `memfd` of this process.
    Device { fd: c_int, id: u64 },
    /// `cuIpcOpenMemHandle_v2`: allocation `id` of process `pid`.
    Opened { pid: u32, id: u64 },
    /// `cuMemHostAlloc`: host memory, its address its own backing.
    Pinned,
}

#[derive(Debug)]
pub(crate) struct Alloc {
    pub(crate) size: u64,
    pub(crate) device: u32,
    pub(crate) kind: Kind,
    /// Where the bytes are read and written.
    backing: usize,
}

#[derive(Default)]
pub(crate) struct Stream {
    device: u32,
    queued: VecDeque<Copy>,
    /// A thread is running copies taken from `queued`.
    running: bool,
}

#[derive(Default)]
pub(crate) struct Model {
    pub(crate) initialised: bool,
    pub(crate) devices: u32,
    /// The primary context's reference count, per device.
    refs: Vec<u32>,
    /// By the address given out.
    allocs: BTreeMap<u64, Alloc>,
    /// Device memory freed by a context's reset, by address: freeing it
    /// afterwards is the caller's mistake, told as such.
    reset: HashSet<u64>,
    /// What this process opened, by (pid, id, device of the context that
    /// opened it): its address and how many opens it still has (the
    /// driver counts a second open in one context and returns the same
    /// address; each `cuIpcCloseMemHandle` takes one back).
    opened: HashMap<(u32, u64, u32), (u64, u32)>,
    streams: HashMap<usize, Stream>,
    next: u64,
}

static MODEL: Mutex<Option<Model>> = Mutex::new(None);
/// Signalled when a stream's running copies end.
static STREAM_IDLE: Condvar = Condvar::new();
/// Held shared while copies run outside [`MODEL`]'s lock, exclusively by
/// whatever unmaps memory: a free waits for the copies in flight, as the
/// driver's frees synchronize the device.
static GATE: RwLock<()> = RwLock::new(());

thread_local! {
    /// This thread's current context (0: none).
    static CURRENT: Cell<usize> = const { Cell::new(0) };
}

/// The model, locked.
pub(crate) fn lock() -> MutexGuard<'static, Option<Model>> {
    MODEL.lock().unwrap_or_else(|p| p.into_inner())
}

/// Tells of a caller's mistake on standard error and, unless
/// `FERRY_FAKE_CUDA_MISUSE=error`, aborts the process: a real driver
/// would have faulted the context, or worse. Returns `code` otherwise.
pub(crate) fn misuse(call: &str, code: CuResult, what: &str) -> CuResult {
    eprintln!("ferry-fake-cuda: {call}: misuse: {what}");
    if std::env::var("FERRY_FAKE_CUDA_MISUSE").as_deref() != Ok("error") {
        eprintln!("ferry-fake-cuda: aborting (FERRY_FAKE_CUDA_MISUSE=error returns the error)");
        std::process::abort();
    }
    code
}

/// Tells of a call that fails as the driver's would, on standard error
/// when `FERRY_FAKE_CUDA_TRACE` is set.
pub(crate) fn refuse(call: &str, code: CuResult, what: &str) -> CuResult {
    if std::env::var_os("FERRY_FAKE_CUDA_TRACE").is_some() {
        eprintln!("ferry-fake-cuda: {call}: {} ({what})", name(code));
    }
    code
}

pub(crate) fn ctx_handle(device: u32) -> usize {
    CTX_BASE + 16 * device as usize
}

/// The handle of `device`'s legacy stream, what the null stream means in
/// its primary context: synchronous device-to-device copies queue there
/// (they do not make the host wait) and `cuStreamSynchronize(NULL)` runs
/// them.
pub(crate) fn legacy_stream(device: u32) -> usize {
    LEGACY_BASE + 16 * device as usize
}

pub(crate) fn current() -> usize {
    CURRENT.with(|c| c.get())
}

pub(crate) fn set_current(ctx: usize) {
    CURRENT.with(|c| c.set(ctx))
}

impl Model {
    pub(crate) fn init(&mut self, devices: u32) {
        if !self.initialised {
            self.initialised = true;
            self.devices = devices;
            self.refs = vec![0; devices as usize];
        }
    }

    /// The device of a context handle, if it is one.
    pub(crate) fn ctx_device(&self, ctx: usize) -> Option<u32> {
        let off = ctx.checked_sub(CTX_BASE)?;
        (off % 16 == 0 && off / 16 < self.devices as usize).then_some((off / 16) as u32)
    }

    /// The device of this thread's current context, which must be an
    /// active (retained) primary context.
    pub(crate) fn current_device(&self, call: &str) -> Result<u32, CuResult> {
        let ctx = current();
        if ctx == 0 {
            return Err(misuse(
                call,
                INVALID_CONTEXT,
                "no context is current on this thread",
            ));
        }
        match self.ctx_device(ctx) {
            Some(d) if self.refs[d as usize] > 0 => Ok(d),
            Some(d) => Err(misuse(
                call,
                INVALID_CONTEXT,
                &format!("the current context (cuda:{d}'s primary) was released"),
            )),
            None => Err(misuse(
                call,
                INVALID_CONTEXT,
                "the current context is unknown",
            )),
        }
    }

    pub(crate) fn retain(&mut self, device: u32) -> usize {
        self.refs[device as usize] += 1;
        self.streams
            .entry(legacy_stream(device))
            .or_insert_with(|| Stream {
                device,
                ..Stream::default()
            });
        ctx_handle(device)
    }

    /// Releases one reference; the last resets the context: every
    /// allocation and stream made in it is gone (queued copies run first).
    pub(crate) fn release(&mut self, device: u32) -> CuResult {
        let refs = &mut self.refs[device as usize];
        if *refs == 0 {
            return misuse(
                "cuDevicePrimaryCtxRelease_v2",
                INVALID_CONTEXT,
                &format!("cuda:{device}'s primary context released more often than retained"),
            );
        }
        *refs -= 1;
        if *refs > 0 {
            return SUCCESS;
        }
        self.flush();
        let gone: Vec<u64> = self
            .allocs
            .iter()
            .filter(|(_, a)| a.device == device)
            .map(|(&b, _)| b)
            .collect();
        for base in gone {
            self.unmap(base);
            self.reset.insert(base);
        }
        self.streams.retain(|_, s| s.device != device);
        SUCCESS
    }

    pub(crate) fn next_id(&mut self) -> u64 {
        self.next += 1;
        self.next
    }

    /// The allocation `addr` lies in, with its address.
    pub(crate) fn find(&self, addr: u64) -> Option<(u64, &Alloc)> {
        let (&base, a) = self.allocs.range(..=addr).next_back()?;
        (addr < base + a.size).then_some((base, a))
    }

    pub(crate) fn insert(&mut self, base: u64, alloc: Alloc) {
        self.reset.remove(&base);
        if let Kind::Opened { pid, id } = alloc.kind {
            self.opened.insert((pid, id, alloc.device), (base, 1));
        }
        self.allocs.insert(base, alloc);
    }

    /// Where allocation `id` of process `pid` is open in `device`'s
    /// context already, counting this open; `None` if it is not.
    pub(crate) fn reopen(&mut self, pid: u32, id: u64, device: u32) -> Option<u64> {
        let (base, refs) = self.opened.get_mut(&(pid, id, device))?;
        *refs += 1;
        Some(*base)
    }

    /// Takes one open of the opened allocation at `base` back: `true` when
    /// it was the last (the caller unmaps it).
    pub(crate) fn close_one(&mut self, base: u64) -> bool {
        let Some(a) = self.allocs.get(&base) else {
            return true;
        };
        let Kind::Opened { pid, id } = a.kind else {
            return true;
        };
        match self.opened.get_mut(&(pid, id, a.device)) {
            Some((_, refs)) if *refs > 1 => {
                *refs -= 1;
                false
            }
            _ => true,
        }
    }

    pub(crate) fn was_reset(&self, base: u64) -> bool {
        self.reset.contains(&base)
    }

    /// Removes the allocation at `base` and unmaps it.
    pub(crate) fn unmap(&mut self, base: u64) {
        let Some(a) = self.allocs.remove(&base) else {
            return;
        };
        // SAFETY: both mappings were made by `map_device`/`map_fd`/
        // `map_pinned` for `a.size` bytes and are unmapped once, here
        // (removed from `allocs` above); no copy runs: every caller (`free`
        // and the context's reset) holds the gate exclusively
        // (`exclusive`), and copies run only under it held shared.
        unsafe {
            libc::munmap(a.backing as *mut libc::c_void, a.size as usize);
            if a.backing as u64 != base {
                libc::munmap(base as *mut libc::c_void, a.size as usize);
            }
        }
        match a.kind {
            Kind::Device { fd, .. } => {
                // SAFETY: the allocation's own descriptor, closed once.
                unsafe { libc::close(fd) };
            }
            Kind::Opened { pid, id } => {
                self.opened.remove(&(pid, id, a.device));
            }
            Kind::Pinned => {}
        }
    }

    /// Where `n` bytes at `place` are read or written, or why not.
    fn resolve(&self, place: Place, n: usize) -> Result<*mut u8, String> {
        match place {
            Place::Device(addr) => {
                let Some((base, a)) = self.find(addr) else {
                    return Err(format!("{addr:#x} is in no allocation"));
                };
                let off = addr - base;
                if off + n as u64 > a.size {
                    return Err(format!(
                        "{n} bytes at {addr:#x} run past the end of the allocation at \
                         {base:#x} of {} bytes",
                        a.size
                    ));
                }
                Ok((a.backing as u64 + off) as *mut u8)
            }
            Place::Host(p) => {
                if n == 0 {
                    return Ok(p as *mut u8);
                }
                let (start, len) = (p as u64, n as u64);
                let Some(end) = start.checked_add(len) else {
                    return Err(format!("{n} bytes at {p:#x} wrap around"));
                };
                // The last allocation that starts before the range ends is
                // the only one that can overlap its end; any other that
                // overlaps it starts inside it.
                for (&base, a) in self.allocs.range(..end).rev() {
                    if base.saturating_add(a.size) <= start {
                        break;
                    }
                    let pinned = matches!(a.kind, Kind::Pinned);
                    if !pinned {
                        return Err(format!(
                            "host range {p:#x}+{n} covers device memory (the allocation at \
                             {base:#x})"
                        ));
                    }
                    if start >= base && end > base + a.size {
                        return Err(format!(
                            "{n} bytes at {p:#x} run past the end of the pinned allocation \
                             at {base:#x} of {} bytes",
                            a.size
                        ));
                    }
                }
                Ok(p as *mut u8)
            }
        }
    }

    /// Checks a copy's two places.
    pub(crate) fn check(&self, c: &Copy) -> Result<(), String> {
        self.resolve(c.dst, c.n)?;
        self.resolve(c.src, c.n)?;
        Ok(())
    }

    /// Runs one copy while the model is locked.
    fn run_locked(&self, c: &Copy) -> CuResult {
        match (self.resolve(c.dst, c.n), self.resolve(c.src, c.n)) {
            (Ok(d), Ok(s)) => {
                // SAFETY: both ranges lie in live mappings (device memory
                // resolved above) or are the caller's host memory, valid
                // for `n` bytes by the driver API's contract; `copy`
                // allows overlap.
                unsafe { std::ptr::copy(s, d, c.n) };
                SUCCESS
            }
            (Err(e), _) | (_, Err(e)) => misuse(c.call, ILLEGAL_ADDRESS, &e),
        }
    }

    /// Runs every queued copy of every stream (a device synchronization).
    pub(crate) fn flush(&mut self) {
        let queued: Vec<Copy> = self
            .streams
            .values_mut()
            .flat_map(|s| s.queued.drain(..))
            .collect();
        for c in &queued {
            self.run_locked(c);
        }
    }

    pub(crate) fn add_stream(&mut self, device: u32) -> usize {
        let id = self.next_id() as usize;
        let handle = STREAM_BASE + 16 * id;
        self.streams.insert(
            handle,
            Stream {
                device,
                ..Stream::default()
            },
        );
        handle
    }

    pub(crate) fn has_stream(&self, s: usize) -> bool {
        self.streams.contains_key(&s)
    }

    pub(crate) fn enqueue(&mut self, s: usize, c: Copy) {
        if let Some(st) = self.streams.get_mut(&s) {
            st.queued.push_back(c);
        }
    }

    pub(crate) fn remove_stream(&mut self, s: usize) {
        self.streams.remove(&s);
    }
}

/// Runs copies outside the model's lock (the gate held shared, so that no
/// memory is unmapped under them); the first failure is returned.
pub(crate) fn run(copies: &[Copy]) -> CuResult {
    let _gate = GATE.read().unwrap_or_else(|p| p.into_inner());
    run_gated(lock(), copies)
}

/// [`run`], the gate held by the caller and the model locked by `g`
/// (unlocked before the bytes move).
fn run_gated(g: MutexGuard<'static, Option<Model>>, copies: &[Copy]) -> CuResult {
    let Some(m) = g.as_ref() else {
        return NOT_INITIALIZED;
    };
    let mut resolved = Vec::with_capacity(copies.len());
    for c in copies {
        match (m.resolve(c.dst, c.n), m.resolve(c.src, c.n)) {
            (Ok(d), Ok(s)) => resolved.push((d, s, c.n)),
            (Err(e), _) | (_, Err(e)) => return misuse(c.call, ILLEGAL_ADDRESS, &e),
        }
    }
    drop(g);
    for (d, s, n) in resolved {
        // SAFETY: as in `run_locked`; the gate keeps the mappings alive.
        unsafe { std::ptr::copy(s, d, n) };
    }
    SUCCESS
}

/// Runs a stream's queued copies, and waits for those another thread
/// runs: when this returns, everything queued before the call has landed.
/// The gate is taken before the copies leave the queue, so that a free
/// (which runs what is queued) never misses copies in flight.
pub(crate) fn synchronize(s: usize, call: &str) -> CuResult {
    loop {
        let _gate = GATE.read().unwrap_or_else(|p| p.into_inner());
        let mut g = lock();
        let Some(m) = g.as_mut() else {
            return NOT_INITIALIZED;
        };
        let Some(st) = m.streams.get_mut(&s) else {
            return misuse(call, INVALID_HANDLE, &format!("unknown stream {s:#x}"));
        };
        if st.running {
            drop(STREAM_IDLE.wait(g).unwrap_or_else(|p| p.into_inner()));
            continue;
        }
        if st.queued.is_empty() {
            return SUCCESS;
        }
        let copies: Vec<Copy> = st.queued.drain(..).collect();
        st.running = true;
        let r = run_gated(g, &copies);
        if let Some(st) = lock().as_mut().and_then(|m| m.streams.get_mut(&s)) {
            st.running = false;
        }
        STREAM_IDLE.notify_all();
        if r != SUCCESS {
            return r;
        }
    }
}

/// Holds every copy off while memory is unmapped.
pub(crate) fn exclusive() -> std::sync::RwLockWriteGuard<'static, ()> {
    GATE.write().unwrap_or_else(|p| p.into_inner())
}

/// Maps `size` bytes of new device memory: `(fd, address, alloc)`.
pub(crate) fn map_device(size: u64, device: u32, id: u64) -> Result<(u64, Alloc), String> {
    let name =
        std::ffi::CString::new(format!("ferry-fake-cuda-{id}")).map_err(|e| e.to_string())?;
    // SAFETY: a NUL-terminated name and flags; returns a new descriptor.
    let fd = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(format!("memfd_create: {}", std::io::Error::last_os_error()));
    }
    // SAFETY: our own new descriptor.
    if unsafe { libc::ftruncate(fd, size as libc::off_t) } != 0 {
        let e = std::io::Error::last_os_error();
        // SAFETY: closed once, on this failure.
        unsafe { libc::close(fd) };
        return Err(format!("ftruncate: {e}"));
    }
    match map_fd(fd, size) {
        Ok((base, backing)) => Ok((
            base,
            Alloc {
                size,
                device,
                kind: Kind::Device { fd, id },
                backing,
            },
        )),
        Err(e) => {
            // SAFETY: closed once, on this failure.
            unsafe { libc::close(fd) };
            Err(e)
        }
    }
}

/// Maps the `memfd` `fd` of `size` bytes twice: `(address without
/// access, backing)`.
pub(crate) fn map_fd(fd: c_int, size: u64) -> Result<(u64, usize), String> {
    let len = size as usize;
    // SAFETY: new shared mappings of a descriptor at least `len` long, at
    // addresses the kernel picks; nothing existing is replaced.
    let (base, backing) = unsafe {
        (
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_NONE,
                libc::MAP_SHARED,
                fd,
                0,
            ),
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                0,
            ),
        )
    };
    if base == libc::MAP_FAILED || backing == libc::MAP_FAILED {
        let e = std::io::Error::last_os_error();
        for p in [base, backing] {
            if p != libc::MAP_FAILED {
                // SAFETY: a mapping made just above, of `len` bytes.
                unsafe { libc::munmap(p, len) };
            }
        }
        return Err(format!("mmap: {e}"));
    }
    Ok((base as u64, backing as usize))
}

/// An allocation of a peer's memory opened here.
pub(crate) fn opened(size: u64, device: u32, pid: u32, id: u64, backing: usize) -> Alloc {
    Alloc {
        size,
        device,
        kind: Kind::Opened { pid, id },
        backing,
    }
}

/// Maps `size` bytes of pinned host memory.
pub(crate) fn map_pinned(size: u64, device: u32) -> Result<(u64, Alloc), String> {
    // SAFETY: a new private anonymous mapping at an address the kernel picks.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            size as usize,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(format!("mmap: {}", std::io::Error::last_os_error()));
    }
    Ok((
        p as u64,
        Alloc {
            size,
            device,
            kind: Kind::Pinned,
            backing: p as usize,
        },
    ))
}
