//! UCX (UCP) as a backend: one context per process, one worker per
//! connector whose event descriptor the connector's runtime watches,
//! endpoints per connection with peer error handling, memory registration
//! and remote keys. The pulls themselves are in `transport::pull::ucx`.
//!
//! `libucp` is loaded at run time ([`ffi::candidates`] says from where).
//! Without it, or where it fails to start, the backend is simply absent:
//! [`ucx`] says why, once, in a debug log line.
//!
//! Trust: the worker address a peer sends and the remote keys in its
//! leases are parsed by UCX, which does not defend against crafted input.
//! They are only exchanged on a connection that passed Ferry's handshake
//! (and its authentication, where a secret is set): see `docs/transports.md`.

use std::ffi::{c_void, CString};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::time::{Duration, Instant};

use tokio::io::unix::AsyncFd;
use tokio::runtime::Handle;
use tokio::sync::{watch, Notify};

pub(crate) mod ffi;
mod get;
pub(crate) mod mem;
pub(crate) mod raw;

pub(crate) use get::{post_get, post_with, Batch};
pub(crate) use mem::{decode_keys, encode_keys, MemReg, RemoteKeys};

pub(crate) use crate::sync::lock;
use ffi::{Api, Status, UCS_ERR_BUSY, UCS_INPROGRESS, UCS_OK};

/// The environment variable that names the `libucp` to load (a file, or the
/// directory holding it).
pub(crate) use crate::config::UCX_LIB_ENV as LIB_ENV;

/// Error-handler states a worker keeps before pruning closed endpoints'.
const MAX_KEPT_STATES: usize = 4096;

/// The longest worker address a peer may send (UCX's are a few hundred
/// bytes; one with many devices a few kilobytes).
pub(crate) const MAX_ADDRESS: usize = 64 * 1024;

/// The UCX worker of a connector over `transports` (`named`: chosen by
/// the caller rather than by default), with which UCX is set up on every
/// connection that allows it: `None` when UCX is not among the
/// transports, or was not named and has no RDMA or CUDA transport here, or
/// is absent and was not named (one debug line says why).
pub(crate) fn start_for(
    transports: &[crate::TransportKind],
    named: bool,
    handle: &Handle,
    shutdown: &watch::Receiver<bool>,
    strict_registration: bool,
) -> crate::Result<Option<Arc<Worker>>> {
    if !transports.contains(&crate::TransportKind::Ucx) {
        return Ok(None);
    }
    // Not named, and no transport that would beat Ferry's own: no worker
    // (nothing would use it; a peer's offer is declined). The context
    // starts here if it has not yet: with this connector's registration.
    if let Ok(u) = ucx_for(strict_registration) {
        if !named && !u.has_fast_transport() {
            tracing::debug!(
                "UCX not used by default here (no RDMA or CUDA transport): {}",
                u.describe()
            );
            return Ok(None);
        }
    }
    match Worker::start(handle, shutdown.clone(), strict_registration) {
        Ok(w) => {
            tracing::debug!("{}", w.ucx.describe());
            Ok(Some(w))
        }
        Err(why) if named => Err(crate::Error::Config(format!(
            "the ucx transport was asked for but cannot start: {why} (set {LIB_ENV} to a libucp.so, or install libucx0)"
        ))),
        Err(why) => {
            tracing::debug!("UCX backend absent: {why}");
            Ok(None)
        }
    }
}

/// One UCP context for the process.
pub(crate) struct Ucx {
    pub(crate) api: Api,
    context: ffi::Context,
    /// `major.minor.release` of the loaded library.
    pub(crate) version: String,
    /// The transports the context found (`tl/device`, from its resources).
    pub(crate) transports: Vec<String>,
    /// The context lists CUDA device memory among its memory types (a
    /// UCX built with CUDA, such as PyPI's `libucx-cu12`, whose CUDA
    /// modules found the driver).
    pub(crate) cuda_memory: bool,
    /// Started for strict registration: UCX's InfiniBand registration
    /// cache is off (where the host has InfiniBand or RoCE).
    pub(crate) strict_registration: bool,
}

// SAFETY: the context is created with `mt_workers_shared`, so its workers
// may run on different threads; UCP's context calls used here (memory
// mapping, worker creation) are thread safe in a library built with
// multi-threading support (`--enable-mt`, as Debian's and the PyPI builds
// are; a library without it fails `worker_create` in `MULTI` mode, and the
// backend is then absent). The function pointers are plain code.
unsafe impl Send for Ucx {}
// SAFETY: see `Send`.
unsafe impl Sync for Ucx {}

/// The process's UCX, or why there is none. Started (the first time) with
/// strict registration where `FERRY_UCX_STRICT_REGISTRATION` says so.
pub(crate) fn ucx() -> Result<&'static Ucx, &'static str> {
    ucx_for(crate::config::process().ucx_strict_registration.value)
}

/// The process's UCX for a connector that registers strictly (`strict`)
/// or not: the context starts with UCX's InfiniBand registration cache off
/// if the first to start it registers strictly. A context already started
/// without it stays as it is (a debug line says so): the connector's
/// registrations are still made per operation.
pub(crate) fn ucx_for(strict: bool) -> Result<&'static Ucx, &'static str> {
    static UCX: OnceLock<Result<Ucx, String>> = OnceLock::new();
    let u = UCX.get_or_init(|| {
        let r = Ucx::start(strict);
        if let Err(why) = &r {
            tracing::debug!("UCX backend absent: {why}");
        }
        r
    });
    if let Ok(u) = u {
        if strict && !u.strict_registration {
            tracing::debug!(
                "UCX started in this process without strict registration: its InfiniBand \
                 registration cache stays on"
            );
        }
    }
    u.as_ref().map_err(|s| s.as_str())
}

impl Ucx {
    fn start(strict_registration: bool) -> Result<Ucx, String> {
        let mut tried = Vec::new();
        let mut api = None;
        for path in ffi::candidates(crate::config::process()) {
            match Api::load(&path) {
                Ok(a) => {
                    api = Some(a);
                    break;
                }
                Err(e) => tried.push(e),
            }
        }
        let Some(api) = api else {
            return Err(format!("no libucp found ({})", tried.join("; ")));
        };
        let (mut major, mut minor, mut release) = (0, 0, 0);
        // SAFETY: three valid out-pointers.
        unsafe { (api.get_version)(&mut major, &mut minor, &mut release) };
        let version = format!("{major}.{minor}.{release}");
        if major != 1 || minor < 10 {
            return Err(format!(
                "{} is UCX {version}; Ferry needs 1.10 or newer",
                api.path.display()
            ));
        }
        let mut config: ffi::Config = std::ptr::null_mut();
        // SAFETY: null prefix and file read the `UCX_` environment; the
        // out-pointer is valid.
        let s = unsafe { (api.config_read)(std::ptr::null(), std::ptr::null(), &mut config) };
        check(&api, s, "ucp_config_read")?;
        let has_ib =
            std::fs::read_dir("/sys/class/infiniband").is_ok_and(|mut d| d.next().is_some());
        if has_ib && strict_registration {
            // Strict registration: memory UCX unregisters is unregistered
            // from the NIC at once, not kept in UCX's InfiniBand cache.
            let (name, value) = (c"IB_REG_METHODS", c"direct");
            // (Asked only where the host has an InfiniBand or RoCE device:
            // elsewhere UCX warns that the option is unknown.)
            // SAFETY: a live config and two NUL-terminated strings. A UCX
            // without InfiniBand support has no such option (an error that
            // changes nothing).
            let _ = unsafe { (api.config_modify)(config, name.as_ptr(), value.as_ptr()) };
        }
        let name = CString::new("ferry").unwrap_or_default();
        let params = ffi::Params {
            field_mask: ffi::UCP_PARAM_FIELD_FEATURES
                | ffi::UCP_PARAM_FIELD_MT_WORKERS_SHARED
                | ffi::UCP_PARAM_FIELD_NAME,
            // AM: the notifications of grants' UCX lane (`grant/ucx.rs`).
            features: ffi::UCP_FEATURE_RMA | ffi::UCP_FEATURE_WAKEUP | ffi::UCP_FEATURE_AM,
            request_size: 0,
            request_init: None,
            request_cleanup: None,
            tag_sender_mask: 0,
            mt_workers_shared: 1,
            estimated_num_eps: 0,
            estimated_num_ppn: 0,
            name: name.as_ptr(),
        };
        let mut context: ffi::Context = std::ptr::null_mut();
        // SAFETY: `params` is a valid `ucp_params_t` for the fields its mask
        // names (the name string outlives the call), `config` came from
        // `config_read`, the out-pointer is valid. API 1.10: the oldest
        // this backend supports, accepted by every newer 1.x.
        let s = unsafe { (api.init_version)(1, 10, &params, config, &mut context) };
        // SAFETY: `config` came from `config_read` and is released once.
        unsafe { (api.config_release)(config) };
        check(&api, s, "ucp_init")?;
        let transports = resources(&api, context);
        let cuda_memory = memory_types(&api, context) & (1 << ffi::UCS_MEMORY_TYPE_CUDA) != 0;
        Ok(Ucx {
            api,
            context,
            version,
            transports,
            cuda_memory,
            strict_registration,
        })
    }

    /// Whether UCX has a transport here that beats Ferry's own paths: an
    /// RDMA one (InfiniBand or RoCE: `rc`, `dc`, `ud`) or a CUDA one.
    pub(crate) fn has_fast_transport(&self) -> bool {
        self.transports.iter().any(|t| {
            let tl = t.split('/').next().unwrap_or("");
            ["rc", "dc", "ud", "cuda_ipc", "gdr_copy"]
                .iter()
                .any(|p| tl.starts_with(p))
        })
    }

    /// A description for logs: the library, its version, its transports.
    pub(crate) fn describe(&self) -> String {
        format!(
            "UCX {} ({}{}{}): {}",
            self.version,
            self.api.path.display(),
            if self.cuda_memory {
                ", moves CUDA memory"
            } else {
                ""
            },
            if self.strict_registration {
                ", strict registration"
            } else {
                ""
            },
            self.transports.join(", ")
        )
    }
}

/// The memory types `context` supports (`ucp_context_query`), as a mask
/// of `ucs_memory_type_t` bits; 0 where the query fails.
fn memory_types(api: &Api, context: ffi::Context) -> u64 {
    let mut attr = ffi::ContextAttr {
        field_mask: ffi::UCP_ATTR_FIELD_MEMORY_TYPES,
        request_size: 0,
        thread_mode: 0,
        memory_types: 0,
        name: [0; 32],
        rest: [0; 256],
    };
    // SAFETY: a live context and a writable attribute struct at least as
    // large as the library's (the mask asks for one field of its head).
    let s = unsafe { (api.context_query)(context, &mut attr) };
    if s == UCS_OK {
        attr.memory_types
    } else {
        0
    }
}

/// Whether this process lends and pulls CUDA device memory through UCX:
/// `FERRY_UCX_CUDA` is `1`, its UCX lists the CUDA memory type and a CUDA
/// driver that sees a device is here (not a simulation); or a test said
/// so ([`simulate_ucx_cuda`](crate::cuda::simulate_ucx_cuda)). What it
/// says in its UCX offers (`pull/ucx/offer.rs`).
pub(crate) fn moves_cuda() -> bool {
    if crate::cuda::simulates_ucx_cuda() {
        return true;
    }
    crate::config::process().ucx_cuda.value
        && crate::cuda::lends_device_memory()
        && ucx().is_ok_and(|u| u.cuda_memory)
}

/// `Ok` if `s` is `UCS_OK`, else what failed and UCX's words for it.
pub(crate) fn check(api: &Api, s: Status, what: &str) -> Result<(), String> {
    if s == UCS_OK {
        Ok(())
    } else {
        Err(format!("{what}: {}", api.describe(s)))
    }
}

/// What `print` writes to a C stream, as text (empty if no stream).
///
/// # Safety
///
/// `print` must only write to the stream it is given (and not close it).
unsafe fn printed(print: impl FnOnce(*mut libc::FILE)) -> String {
    let mut buf: *mut libc::c_char = std::ptr::null_mut();
    let mut len: libc::size_t = 0;
    // SAFETY: `open_memstream` with two valid out-pointers.
    let f = unsafe { libc::open_memstream(&mut buf, &mut len) };
    if f.is_null() {
        return String::new();
    }
    print(f);
    // SAFETY: an open stream, closed once; closing sets `buf`/`len` to
    // the text written.
    unsafe { libc::fclose(f) };
    if buf.is_null() {
        return String::new();
    }
    // SAFETY: `buf` holds `len` bytes written by the stream.
    let text = unsafe { std::slice::from_raw_parts(buf.cast::<u8>(), len) };
    let text = String::from_utf8_lossy(text).into_owned();
    // SAFETY: `open_memstream`'s buffer is the caller's to free, once.
    unsafe { libc::free(buf.cast()) };
    text
}

/// The `tl/device` names of the context's resources, from
/// `ucp_context_print_info` (UCP has no query for them before 1.14).
fn resources(api: &Api, context: ffi::Context) -> Vec<String> {
    // SAFETY: a live context; UCX only writes to the stream.
    let text = unsafe { printed(|f| (api.context_print_info)(context, f)) };
    text.lines()
        .filter(|l| l.contains("resource"))
        .filter_map(|l| l.split_whitespace().last().map(str::to_string))
        .filter(|t| t.contains('/'))
        .collect()
}

/// One connector's UCP worker: its address for peers, endpoints to them,
/// and the task that progresses it whenever its event descriptor fires.
pub(crate) struct Worker {
    pub(crate) ucx: &'static Ucx,
    raw: ffi::Worker,
    address: Vec<u8>,
    efd: RawFd,
    /// The close requests of endpoints being closed, freed by the progress
    /// task once they complete.
    closing: Mutex<Vec<usize>>,
    /// What the error handler of every endpoint of this worker points at,
    /// kept for as long as the worker lives: UCX gives no guarantee that
    /// an endpoint's handler is never called after its close, and the
    /// state is a few bytes (pruned of closed endpoints' past a bound).
    states: Mutex<Vec<Arc<EpState>>>,
    /// A thread progresses the worker itself ([`Worker::poll`]): the
    /// progress task stands aside until `resume`.
    polling: AtomicBool,
    resume: Notify,
    /// Blocks of pools are registered per operation too, rather than once
    /// per pool (`ConnectorBuilder::ucx_strict_registration`).
    pub(crate) strict_registration: bool,
    /// Where this process moves CUDA memory through UCX ([`moves_cuda`]):
    /// the context its progress runs in where a thread has none.
    cuda: Option<Arc<crate::cuda::PrimaryCtx>>,
}

// SAFETY: the worker is created in `UCS_THREAD_MODE_MULTI`: UCP serializes
// concurrent calls on it (progress, posting, endpoint creation and close).
unsafe impl Send for Worker {}
// SAFETY: see `Send`.
unsafe impl Sync for Worker {}

impl Worker {
    /// A worker of the process's UCX context, progressed by a task on
    /// `handle` that waits on its event descriptor and ends at `shutdown`.
    pub(crate) fn start(
        handle: &Handle,
        shutdown: watch::Receiver<bool>,
        strict_registration: bool,
    ) -> Result<Arc<Self>, String> {
        let ucx = ucx_for(strict_registration).map_err(str::to_string)?;
        let api = &ucx.api;
        let params = ffi::WorkerParams {
            field_mask: ffi::UCP_WORKER_PARAM_FIELD_THREAD_MODE,
            thread_mode: ffi::UCS_THREAD_MODE_MULTI,
            rest: [0; 188],
        };
        let mut raw: ffi::Worker = std::ptr::null_mut();
        // SAFETY: a live context, valid params for the masked field, a
        // valid out-pointer.
        check(
            api,
            unsafe { (api.worker_create)(ucx.context, &params, &mut raw) },
            "ucp_worker_create",
        )?;
        let mut addr: *mut ffi::Address = std::ptr::null_mut();
        let mut len = 0usize;
        // SAFETY: a live worker and valid out-pointers.
        let s = unsafe { (api.worker_get_address)(raw, &mut addr, &mut len) };
        let address = if s == UCS_OK && !addr.is_null() {
            // SAFETY: UCX wrote `len` bytes at `addr`; copied, then released once.
            let v = unsafe { std::slice::from_raw_parts(addr.cast::<u8>(), len) }.to_vec();
            // SAFETY: the address `worker_get_address` returned, released once.
            unsafe { (api.worker_release_address)(raw, addr) };
            v
        } else {
            // SAFETY: the worker was created above and is destroyed once.
            unsafe { (api.worker_destroy)(raw) };
            return Err(format!("ucp_worker_get_address: {}", api.describe(s)));
        };
        let mut efd: libc::c_int = -1;
        // SAFETY: a live worker, a valid out-pointer.
        let s = unsafe { (api.worker_get_efd)(raw, &mut efd) };
        if s != UCS_OK {
            // SAFETY: as above.
            unsafe { (api.worker_destroy)(raw) };
            return Err(format!("ucp_worker_get_efd: {}", api.describe(s)));
        }
        let w = Arc::new(Worker {
            ucx,
            raw,
            address,
            efd,
            closing: Mutex::new(Vec::new()),
            states: Mutex::new(Vec::new()),
            polling: AtomicBool::new(false),
            resume: Notify::new(),
            strict_registration,
            // The first device's context, entered where none is current,
            // kept for the worker's life (none in a simulated process).
            cuda: moves_cuda()
                .then(|| crate::cuda::context::primary_ctx(0).ok())
                .flatten(),
        });
        let _enter = handle.enter();
        // SAFETY: the descriptor belongs to the worker, which `Efd` holds:
        // it stays open, the same descriptor, until the `AsyncFd` (and with
        // it the `Efd`) is dropped.
        let fd = unsafe {
            AsyncFd::register_with_interest(Efd(w.clone()), tokio::io::Interest::READABLE)
        }
        .map_err(|e| {
            format!(
                "cannot watch the UCX worker's event descriptor: {}",
                e.into_parts().1
            )
        })?;
        handle.spawn(progress(fd, shutdown));
        Ok(w)
    }

    /// The raw worker, for calls this module does not wrap (a grant's
    /// active-message handler); live while `self` is.
    pub(crate) fn raw(&self) -> ffi::Worker {
        self.raw
    }

    /// What a peer needs to reach this worker.
    pub(crate) fn address(&self) -> &[u8] {
        &self.address
    }

    /// Makes the progress task run a pass now (after posting requests
    /// from another thread).
    pub(crate) fn wake(&self) {
        // SAFETY: a live worker; signalling is thread safe.
        unsafe { (self.ucx.api.worker_signal)(self.raw) };
    }

    /// Progresses the worker on this thread until `batch` has no request
    /// in flight (then its first failure, if any), for at most `budget`;
    /// `None` if the budget ran out first, or at once if another thread
    /// polls already. Meanwhile the progress task stands aside (one
    /// thread progresses the worker: the one waiting for it).
    fn poll(&self, batch: &Batch, budget: Duration) -> Option<Option<Status>> {
        if self
            .polling
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            return batch.poll();
        }
        // Gives the worker back to the progress task, whatever happens.
        struct Resume<'a>(&'a Worker);
        impl Drop for Resume<'_> {
            fn drop(&mut self) {
                self.0.polling.store(false, Ordering::Release);
                self.0.resume.notify_one();
            }
        }
        let _resume = Resume(self);
        let start = Instant::now();
        loop {
            if let Some(s) = batch.poll() {
                return Some(s);
            }
            if start.elapsed() > budget {
                return None;
            }
            // SAFETY: a live worker (MULTI mode).
            unsafe { (self.ucx.api.worker_progress)(self.raw) };
        }
    }

    /// Runs `f` (progress, arming) with a CUDA context current on this
    /// thread where this process moves CUDA memory through UCX, whose CUDA
    /// transports expect one when they end or poll their copies: the one
    /// current already (a pull's), else the first device's; as it is
    /// elsewhere.
    fn in_context<R>(&self, f: impl FnOnce() -> R) -> R {
        match &self.cuda {
            Some(ctx) => crate::cuda::context::on_any_device_with(ctx, f),
            None => f(),
        }
    }

    /// Progresses until nothing more happens, then frees finished closes.
    fn progress_all(&self) {
        self.in_context(|| self.progress_closes())
    }

    /// [`progress_all`](Self::progress_all), on this thread as it is.
    fn progress_closes(&self) {
        let api = &self.ucx.api;
        // SAFETY: a live worker (MULTI mode).
        while unsafe { (api.worker_progress)(self.raw) } != 0 {}
        let mut closing = lock(&self.closing);
        closing.retain(|req| {
            let req = *req as *mut c_void;
            // SAFETY: a request `ep_close_nbx` returned and that nobody
            // freed: checked, and freed once when done.
            let s = unsafe { (api.request_check_status)(req) };
            if s == UCS_INPROGRESS {
                return true;
            }
            // SAFETY: done, and dropped from the list here: freed once.
            unsafe { (api.request_free)(req) };
            false
        });
    }

    /// An endpoint to the worker at `address` (a peer's, from the
    /// handshake), with peer error handling: a peer that dies fails the
    /// requests in flight to it. (UCX 1.13 drops its shared-memory
    /// transports under peer error handling, which cannot report a peer's
    /// death; without it, a get from a dead peer over shared memory waits
    /// for ever, so Ferry keeps it, and UCX goes over TCP on one host.)
    pub(crate) fn connect(self: &Arc<Self>, address: &[u8]) -> Result<Endpoint, String> {
        if address.is_empty() || address.len() > MAX_ADDRESS {
            return Err(format!("a worker address of {} bytes", address.len()));
        }
        let api = &self.ucx.api;
        let state = Arc::new(EpState::default());
        {
            let mut states = lock(&self.states);
            if states.len() >= MAX_KEPT_STATES {
                // The oldest half of the closed endpoints' states go: an
                // endpoint closed that long ago has long stopped calling.
                let closed: Vec<usize> = (0..states.len())
                    .filter(|&i| states[i].closed.load(Ordering::Acquire))
                    .take(MAX_KEPT_STATES / 2)
                    .collect();
                for i in closed.into_iter().rev() {
                    states.remove(i);
                }
            }
            states.push(state.clone());
        }
        let params = ffi::EpParams {
            field_mask: ffi::UCP_EP_PARAM_FIELD_REMOTE_ADDRESS
                | ffi::UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE
                | ffi::UCP_EP_PARAM_FIELD_ERR_HANDLER,
            address: address.as_ptr().cast(),
            err_mode: ffi::UCP_ERR_HANDLING_MODE_PEER,
            err_handler: ffi::ErrHandler {
                cb: Some(on_ep_error),
                arg: Arc::as_ptr(&state) as *mut c_void,
            },
            rest: [0; 64],
        };
        let mut ep: ffi::Ep = std::ptr::null_mut();
        // SAFETY: a live worker; `params` valid for its mask (the address
        // outlives the call: UCX copies what it keeps); the handler's
        // argument is `state`, which `states` keeps for the worker's life
        // (pruned only of closed endpoints, past a bound).
        let s = unsafe { (api.ep_create)(self.raw, &params, &mut ep) };
        check(api, s, "ucp_ep_create")?;
        self.wake();
        Ok(Endpoint {
            worker: self.clone(),
            raw: ep,
            state,
            open: RwLock::new(true),
        })
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        // Every endpoint holds the worker, and the progress task (which
        // held it too) has dropped its watch of the descriptor.
        self.progress_all();
        // SAFETY: the last reference: no endpoint, no request, no watcher.
        unsafe { (self.ucx.api.worker_destroy)(self.raw) };
    }
}

/// The worker's event descriptor (owned by UCX, never closed here), with
/// the worker that keeps it open.
struct Efd(Arc<Worker>);

impl AsRawFd for Efd {
    fn as_raw_fd(&self) -> RawFd {
        self.0.efd
    }
}

/// Progresses `w` whenever its event descriptor fires, until the connector
/// shuts down or nothing else holds the worker. No thread spins: between
/// events the task sleeps on the descriptor (armed with `ucp_worker_arm`).
async fn progress(fd: AsyncFd<Efd>, mut shutdown: watch::Receiver<bool>) {
    let w = &fd.get_ref().0;
    let api = &w.ucx.api;
    loop {
        if w.polling.load(Ordering::Acquire) {
            // A waiting thread progresses the worker (`Worker::poll`).
            tokio::select! {
                _ = w.resume.notified() => {}
                _ = shutdown.changed() => {
                    if *shutdown.borrow() { break; }
                }
                _ = tokio::time::sleep(Duration::from_millis(100)) => {}
            }
            continue;
        }
        let s = w.in_context(|| {
            w.progress_closes();
            // SAFETY: a live worker.
            unsafe { (api.worker_arm)(w.raw) }
        });
        if s == UCS_ERR_BUSY {
            tokio::task::yield_now().await;
            continue;
        }
        if s != UCS_OK {
            tracing::warn!("UCX: ucp_worker_arm: {}", api.describe(s));
        }
        tokio::select! {
            r = fd.readable() => match r {
                Ok(mut g) => g.clear_ready(),
                Err(e) => {
                    tracing::warn!("UCX: the worker's event descriptor failed: {e}");
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
            },
            _ = shutdown.changed() => {
                if *shutdown.borrow() { break; }
            }
            // A guard, not a poll: a wake lost between an arm and a post
            // from another thread costs at most this long.
            _ = tokio::time::sleep(Duration::from_millis(100)) => {
                if Arc::strong_count(w) == 1 { break; }
            }
        }
    }
    w.progress_all();
}

/// What an endpoint's error handler records.
#[derive(Default)]
pub(crate) struct EpState {
    /// The endpoint was closed.
    closed: AtomicBool,
    failed: Mutex<Option<String>>,
    down: AtomicBool,
}

/// `ucp_err_handler_cb_t`: the peer of an endpoint failed.
unsafe extern "C" fn on_ep_error(arg: *mut c_void, _ep: ffi::Ep, status: Status) {
    // SAFETY: `arg` is an `EpState` that the worker keeps alive for as
    // long as it lives (see `Worker::states`; pruned only of endpoints
    // closed before thousands of others were made), and UCX calls
    // handlers only on a live worker.
    let state = unsafe { &*(arg as *const EpState) };
    let why = ucx().map(|u| u.api.describe(status)).unwrap_or_default();
    *lock(&state.failed) = Some(why);
    state.down.store(true, Ordering::Release);
}

/// A UCP endpoint to one peer's worker, closed (forcibly: requests still in
/// flight fail) when dropped.
pub(crate) struct Endpoint {
    pub(crate) worker: Arc<Worker>,
    raw: ffi::Ep,
    state: Arc<EpState>,
    /// Whether the endpoint is still open: read-locked around every call
    /// on `raw`, write-locked by [`Endpoint::close`], so no call races the
    /// close or follows it.
    open: RwLock<bool>,
}

// SAFETY: the endpoint belongs to a worker in MULTI mode (see `Worker`).
unsafe impl Send for Endpoint {}
// SAFETY: see `Send`.
unsafe impl Sync for Endpoint {}

impl Endpoint {
    /// Runs `f` on the raw endpoint while it is open (`None` once closed);
    /// the endpoint cannot be closed meanwhile.
    pub(crate) fn with_raw<R>(&self, f: impl FnOnce(ffi::Ep) -> R) -> Option<R> {
        let open = self.open.read().unwrap_or_else(|e| e.into_inner());
        open.then(|| f(self.raw))
    }

    /// Closes the endpoint now, forcibly: its requests in flight end with
    /// an error (their callbacks run), and the worker no longer serves
    /// the peer's requests on it (an emulated get of this process's
    /// memory, say). The connection calls it when it ends, before giving
    /// back what it lent; dropping the endpoint does it too.
    pub(crate) fn close(&self) {
        let mut open = self.open.write().unwrap_or_else(|e| e.into_inner());
        if !std::mem::replace(&mut *open, false) {
            return;
        }
        let api = &self.worker.ucx.api;
        let mut p = ffi::RequestParam::empty();
        p.op_attr_mask = ffi::UCP_OP_ATTR_FIELD_FLAGS;
        p.flags = ffi::UCP_EP_CLOSE_FLAG_FORCE;
        // SAFETY: a live endpoint (open until here), closed once, with no
        // other call on it in flight (the write lock); valid params.
        let r = unsafe { (api.ep_close_nbx)(self.raw, &p) };
        self.state.closed.store(true, Ordering::Release);
        if let Ok(Some(req)) = ffi::ptr_status(r) {
            // Finished (and freed) by the progress task.
            lock(&self.worker.closing).push(req as usize);
            self.worker.wake();
        }
    }

    /// The endpoint's lanes as `ucp_ep_print_info` shows them: per lane,
    /// its transport and device and what UCP uses it for, such as
    /// `tcp/lo.0 (am am_bw#0 keepalive wireup)`; `rma` among the uses is a
    /// lane that moves gets itself, without one gets are active messages.
    pub(crate) fn lanes(&self) -> Vec<String> {
        let api = &self.worker.ucx.api;
        // SAFETY: a live endpoint (`with_raw`); UCX only writes to the
        // stream.
        let text = self
            .with_raw(|raw| unsafe { printed(|f| (api.ep_print_info)(raw, f)) })
            .unwrap_or_default();
        text.lines()
            .filter(|l| l.contains("lane["))
            .filter_map(|l| {
                let (_, rest) = l.split_once("]:")?;
                let mut words = rest.split_whitespace();
                let tl = words.next()?.split_once(':').map_or("?", |t| t.1);
                let uses: Vec<&str> = words.skip_while(|w| *w != "->").skip(2).collect();
                Some(format!("{tl} ({})", uses.join(" ")))
            })
            .collect()
    }

    /// Whether UCX moves gets on this endpoint with a transport that does
    /// them itself (an `rma` lane: RDMA, or a reader-driven copy), rather
    /// than emulating them with messages that the source's own process
    /// answers by copying from its memory.
    pub(crate) fn has_rma_lane(&self) -> bool {
        self.lanes().iter().any(|l| {
            l.split_once('(')
                .is_some_and(|(_, uses)| uses.split_whitespace().any(|u| u.starts_with("rma")))
        })
    }

    /// Why the peer failed, if its error handler ran.
    pub(crate) fn failure(&self) -> Option<String> {
        if !self.state.down.load(Ordering::Acquire) {
            return None;
        }
        lock(&self.state.failed).clone()
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        self.close();
    }
}
