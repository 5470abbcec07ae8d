//! The part of UCX's UCP API that Ferry calls, declared by hand and loaded
//! at run time (no header, no link-time dependency).
//!
//! UCP's parameter structs carry a `field_mask` that says which fields the
//! caller filled; a library reads no field outside the mask, and new
//! releases only append fields. So the layouts below, those of UCX 1.13,
//! work with every 1.x library Ferry loads (1.10 on): every field used
//! here sits at the same offset from 1.11 on, and 1.10, which has no
//! `ucp_params_t::name` yet, ignores its mask bit (`UCP_PARAM_FIELD_NAME`)
//! and never reads it. The offsets were taken from the 1.13 headers
//! (`offsetof`), are checked at compile time below, and were checked
//! against the 1.22 headers (which append fields only).

use std::ffi::{c_char, c_int, c_uint, c_void};
use std::path::{Path, PathBuf};

use libloading::Library;

pub(crate) type Status = i8;
pub(crate) type StatusPtr = *mut c_void;
pub(crate) type Context = *mut c_void;
pub(crate) type Worker = *mut c_void;
pub(crate) type Ep = *mut c_void;
pub(crate) type MemH = *mut c_void;
pub(crate) type RKey = *mut c_void;
pub(crate) type Config = *mut c_void;
pub(crate) type Address = c_void;

pub(crate) const UCS_OK: Status = 0;
pub(crate) const UCS_INPROGRESS: Status = 1;
pub(crate) const UCS_ERR_BUSY: Status = -15;
pub(crate) const UCS_ERR_CANCELED: Status = -16;

pub(crate) const UCP_PARAM_FIELD_FEATURES: u64 = 1 << 0;
pub(crate) const UCP_PARAM_FIELD_MT_WORKERS_SHARED: u64 = 1 << 5;
pub(crate) const UCP_PARAM_FIELD_NAME: u64 = 1 << 8;
pub(crate) const UCP_FEATURE_RMA: u64 = 1 << 1;
pub(crate) const UCP_FEATURE_WAKEUP: u64 = 1 << 4;
pub(crate) const UCP_FEATURE_AM: u64 = 1 << 6;
pub(crate) const UCP_AM_HANDLER_PARAM_FIELD_ID: u64 = 1 << 0;
pub(crate) const UCP_AM_HANDLER_PARAM_FIELD_CB: u64 = 1 << 2;
pub(crate) const UCP_AM_HANDLER_PARAM_FIELD_ARG: u64 = 1 << 3;
pub(crate) const UCP_AM_RECV_ATTR_FLAG_RNDV: u64 = 1 << 17;
pub(crate) const UCP_AM_SEND_FLAG_EAGER: u32 = 1 << 1;

pub(crate) const UCP_WORKER_PARAM_FIELD_THREAD_MODE: u64 = 1 << 0;
pub(crate) const UCS_THREAD_MODE_MULTI: c_uint = 2;

pub(crate) const UCP_EP_PARAM_FIELD_REMOTE_ADDRESS: u64 = 1 << 0;
pub(crate) const UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE: u64 = 1 << 1;
pub(crate) const UCP_EP_PARAM_FIELD_ERR_HANDLER: u64 = 1 << 2;
pub(crate) const UCP_ERR_HANDLING_MODE_PEER: c_uint = 1;
pub(crate) const UCP_EP_CLOSE_FLAG_FORCE: u32 = 1 << 0;

/// `UCP_ATTR_FIELD_MEMORY_TYPES`: `ucp_context_query` fills `memory_types`.
pub(crate) const UCP_ATTR_FIELD_MEMORY_TYPES: u64 = 1 << 2;
/// `UCS_MEMORY_TYPE_CUDA`: the index of CUDA device memory's bit in
/// `memory_types`.
pub(crate) const UCS_MEMORY_TYPE_CUDA: u32 = 1;
pub(crate) const UCP_MEM_MAP_PARAM_FIELD_ADDRESS: u64 = 1 << 0;
pub(crate) const UCP_MEM_MAP_PARAM_FIELD_LENGTH: u64 = 1 << 1;

pub(crate) const UCP_OP_ATTR_FIELD_CALLBACK: u32 = 1 << 1;
pub(crate) const UCP_OP_ATTR_FIELD_USER_DATA: u32 = 1 << 2;
pub(crate) const UCP_OP_ATTR_FIELD_FLAGS: u32 = 1 << 4;

/// `ucp_params_t`, up to `name`.
#[repr(C)]
pub(crate) struct Params {
    pub(crate) field_mask: u64,
    pub(crate) features: u64,
    pub(crate) request_size: usize,
    pub(crate) request_init: Option<unsafe extern "C" fn(*mut c_void)>,
    pub(crate) request_cleanup: Option<unsafe extern "C" fn(*mut c_void)>,
    pub(crate) tag_sender_mask: u64,
    pub(crate) mt_workers_shared: c_int,
    pub(crate) estimated_num_eps: usize,
    pub(crate) estimated_num_ppn: usize,
    pub(crate) name: *const c_char,
}

/// `ucp_worker_params_t`, up to `thread_mode` (the rest is never masked in;
/// the padding keeps the struct as large as UCX 1.13's).
#[repr(C)]
pub(crate) struct WorkerParams {
    pub(crate) field_mask: u64,
    pub(crate) thread_mode: c_uint,
    pub(crate) rest: [u8; 188],
}

/// `ucp_err_handler_t`.
#[repr(C)]
pub(crate) struct ErrHandler {
    pub(crate) cb: Option<unsafe extern "C" fn(*mut c_void, Ep, Status)>,
    pub(crate) arg: *mut c_void,
}

/// `ucp_ep_params_t`, up to `err_handler` (plus padding to 1.13's size).
#[repr(C)]
pub(crate) struct EpParams {
    pub(crate) field_mask: u64,
    pub(crate) address: *const Address,
    pub(crate) err_mode: c_uint,
    pub(crate) err_handler: ErrHandler,
    pub(crate) rest: [u8; 64],
}

/// `ucp_context_attr_t`, up to `name` (UCX 1.13's whole struct), with room
/// for the fields later versions append (never masked in).
#[repr(C)]
pub(crate) struct ContextAttr {
    pub(crate) field_mask: u64,
    pub(crate) request_size: usize,
    pub(crate) thread_mode: c_uint,
    pub(crate) memory_types: u64,
    pub(crate) name: [c_char; 32],
    pub(crate) rest: [u8; 256],
}

/// `ucp_mem_map_params_t`.
#[repr(C)]
pub(crate) struct MemMapParams {
    pub(crate) field_mask: u64,
    pub(crate) address: *mut c_void,
    pub(crate) length: usize,
    pub(crate) flags: c_uint,
    pub(crate) prot: c_uint,
    pub(crate) memory_type: c_uint,
}

/// The completion callback of a send-like request (`ucp_send_nbx_callback_t`).
pub(crate) type SendCallback = unsafe extern "C" fn(*mut c_void, Status, *mut c_void);

/// `ucp_request_param_t`.
#[repr(C)]
pub(crate) struct RequestParam {
    pub(crate) op_attr_mask: u32,
    pub(crate) flags: u32,
    pub(crate) request: *mut c_void,
    pub(crate) cb: Option<SendCallback>,
    pub(crate) datatype: u64,
    pub(crate) user_data: *mut c_void,
    pub(crate) reply_buffer: *mut c_void,
    pub(crate) memory_type: c_uint,
    pub(crate) recv_info: *mut c_void,
    pub(crate) memh: MemH,
}

impl RequestParam {
    /// Nothing masked in.
    pub(crate) fn empty() -> Self {
        RequestParam {
            op_attr_mask: 0,
            flags: 0,
            request: std::ptr::null_mut(),
            cb: None,
            datatype: 0,
            user_data: std::ptr::null_mut(),
            reply_buffer: std::ptr::null_mut(),
            memory_type: 0,
            recv_info: std::ptr::null_mut(),
            memh: std::ptr::null_mut(),
        }
    }
}

// The offsets UCX 1.13's headers give (x86_64 and aarch64 alike).
const _: () = {
    use std::mem::{offset_of, size_of};
    assert!(size_of::<Params>() == 80 && offset_of!(Params, name) == 72);
    assert!(offset_of!(Params, mt_workers_shared) == 48);
    assert!(size_of::<WorkerParams>() == 200 && offset_of!(WorkerParams, thread_mode) == 8);
    assert!(offset_of!(EpParams, err_mode) == 16 && offset_of!(EpParams, err_handler) == 24);
    assert!(size_of::<EpParams>() == 104);
    assert!(size_of::<MemMapParams>() == 40 && offset_of!(MemMapParams, flags) == 24);
    assert!(offset_of!(ContextAttr, memory_types) == 24 && offset_of!(ContextAttr, name) == 32);
    assert!(size_of::<RequestParam>() == 72 && offset_of!(RequestParam, memh) == 64);
    assert!(offset_of!(RequestParam, user_data) == 32 && offset_of!(RequestParam, cb) == 16);
};

/// `ucp_am_recv_callback_t`.
pub(crate) type AmRecvCallback = unsafe extern "C" fn(
    *mut c_void,
    *const c_void,
    usize,
    *mut c_void,
    usize,
    *const AmRecvParam,
) -> Status;

/// `ucp_am_handler_param_t` (UCX 1.10 and newer).
#[repr(C)]
pub(crate) struct AmHandlerParam {
    pub(crate) field_mask: u64,
    pub(crate) id: c_uint,
    pub(crate) flags: u32,
    pub(crate) cb: Option<AmRecvCallback>,
    pub(crate) arg: *mut c_void,
}

/// `ucp_am_recv_param_t`: its head (`recv_attr`), the only field read.
#[repr(C)]
pub(crate) struct AmRecvParam {
    pub(crate) recv_attr: u64,
    pub(crate) reply_ep: Ep,
}

const _: () = {
    use std::mem::{offset_of, size_of};
    assert!(size_of::<AmHandlerParam>() == 32 && offset_of!(AmHandlerParam, arg) == 24);
};

/// The functions Ferry calls, resolved from one loaded `libucp`.
pub(crate) struct Api {
    pub(crate) get_version: unsafe extern "C" fn(*mut c_uint, *mut c_uint, *mut c_uint),
    pub(crate) config_read:
        unsafe extern "C" fn(*const c_char, *const c_char, *mut Config) -> Status,
    pub(crate) config_release: unsafe extern "C" fn(Config),
    pub(crate) config_modify: unsafe extern "C" fn(Config, *const c_char, *const c_char) -> Status,
    pub(crate) init_version:
        unsafe extern "C" fn(c_uint, c_uint, *const Params, Config, *mut Context) -> Status,
    pub(crate) context_print_info: unsafe extern "C" fn(Context, *mut libc::FILE),
    pub(crate) context_query: unsafe extern "C" fn(Context, *mut ContextAttr) -> Status,
    pub(crate) worker_create:
        unsafe extern "C" fn(Context, *const WorkerParams, *mut Worker) -> Status,
    pub(crate) worker_destroy: unsafe extern "C" fn(Worker),
    pub(crate) worker_get_address:
        unsafe extern "C" fn(Worker, *mut *mut Address, *mut usize) -> Status,
    pub(crate) worker_release_address: unsafe extern "C" fn(Worker, *mut Address),
    pub(crate) worker_progress: unsafe extern "C" fn(Worker) -> c_uint,
    pub(crate) worker_get_efd: unsafe extern "C" fn(Worker, *mut c_int) -> Status,
    pub(crate) worker_arm: unsafe extern "C" fn(Worker) -> Status,
    pub(crate) worker_signal: unsafe extern "C" fn(Worker) -> Status,
    pub(crate) ep_create: unsafe extern "C" fn(Worker, *const EpParams, *mut Ep) -> Status,
    pub(crate) ep_close_nbx: unsafe extern "C" fn(Ep, *const RequestParam) -> StatusPtr,
    pub(crate) ep_print_info: unsafe extern "C" fn(Ep, *mut libc::FILE),
    pub(crate) mem_map: unsafe extern "C" fn(Context, *const MemMapParams, *mut MemH) -> Status,
    pub(crate) mem_unmap: unsafe extern "C" fn(Context, MemH) -> Status,
    pub(crate) rkey_pack:
        unsafe extern "C" fn(Context, MemH, *mut *mut c_void, *mut usize) -> Status,
    pub(crate) rkey_buffer_release: unsafe extern "C" fn(*mut c_void),
    pub(crate) ep_rkey_unpack: unsafe extern "C" fn(Ep, *const c_void, *mut RKey) -> Status,
    pub(crate) rkey_destroy: unsafe extern "C" fn(RKey),
    pub(crate) get_nbx:
        unsafe extern "C" fn(Ep, *mut c_void, usize, u64, RKey, *const RequestParam) -> StatusPtr,
    pub(crate) put_nbx:
        unsafe extern "C" fn(Ep, *const c_void, usize, u64, RKey, *const RequestParam) -> StatusPtr,
    pub(crate) ep_flush_nbx: unsafe extern "C" fn(Ep, *const RequestParam) -> StatusPtr,
    pub(crate) am_send_nbx: unsafe extern "C" fn(
        Ep,
        c_uint,
        *const c_void,
        usize,
        *const c_void,
        usize,
        *const RequestParam,
    ) -> StatusPtr,
    pub(crate) worker_set_am_recv_handler:
        unsafe extern "C" fn(Worker, *const AmHandlerParam) -> Status,
    pub(crate) request_check_status: unsafe extern "C" fn(*mut c_void) -> Status,
    pub(crate) request_free: unsafe extern "C" fn(*mut c_void),
    pub(crate) status_string: unsafe extern "C" fn(Status) -> *const c_char,
    /// Kept loaded for as long as the functions above may be called.
    _lib: Library,
    /// `libucs` (for `ucs_status_string`).
    _ucs: Library,
    /// Where `libucp` was found.
    pub(crate) path: PathBuf,
}

/// `UCS_PTR_IS_ERR` / `UCS_PTR_STATUS` of a `ucs_status_ptr_t`: `Ok(None)`
/// done at once, `Ok(Some(request))` in progress, `Err(status)` failed.
pub(crate) fn ptr_status(p: StatusPtr) -> Result<Option<*mut c_void>, Status> {
    let v = p as isize;
    if v == 0 {
        Ok(None)
    } else if (-100..0).contains(&v) {
        Err(v as Status)
    } else {
        Ok(Some(p))
    }
}

impl Api {
    /// Loads `libucp` from `path` (and `libucs` next to it).
    pub(crate) fn load(path: &Path) -> Result<Api, String> {
        // SAFETY: loading UCX runs its library constructors, which only set
        // up UCX's own state (configuration, memory hooks); no Rust state is
        // touched, and the library stays loaded for the process's life (the
        // `Api` lives in a static).
        let lib = unsafe { Library::new(path) }.map_err(|e| format!("{}: {e}", path.display()))?;
        let open = |p: &Path| {
            // SAFETY: as above; `libucp` already loaded its own `libucs`,
            // so this finds the same one (or the soname through the loader).
            unsafe { Library::new(p) }
        };
        let ucs = open(&path.with_file_name("libucs.so.0"))
            .or_else(|_| open(&path.with_file_name("libucs.so")))
            .or_else(|_| open(Path::new("libucs.so.0")))
            .map_err(|e| format!("libucs: {e}"))?;
        macro_rules! sym {
            ($l:expr, $name:literal) => {
                // SAFETY: the symbol is a function of UCP's public API whose
                // C signature is the type this field declares (see the
                // 1.13 headers); the library outlives the pointer (kept in
                // the same struct).
                *unsafe { $l.get(concat!($name, "\0").as_bytes()) }
                    .map_err(|e| format!("{}: {e}", $name))?
            };
        }
        Ok(Api {
            get_version: sym!(lib, "ucp_get_version"),
            config_read: sym!(lib, "ucp_config_read"),
            config_release: sym!(lib, "ucp_config_release"),
            config_modify: sym!(lib, "ucp_config_modify"),
            init_version: sym!(lib, "ucp_init_version"),
            context_query: sym!(lib, "ucp_context_query"),
            context_print_info: sym!(lib, "ucp_context_print_info"),
            worker_create: sym!(lib, "ucp_worker_create"),
            worker_destroy: sym!(lib, "ucp_worker_destroy"),
            worker_get_address: sym!(lib, "ucp_worker_get_address"),
            worker_release_address: sym!(lib, "ucp_worker_release_address"),
            worker_progress: sym!(lib, "ucp_worker_progress"),
            worker_get_efd: sym!(lib, "ucp_worker_get_efd"),
            worker_arm: sym!(lib, "ucp_worker_arm"),
            worker_signal: sym!(lib, "ucp_worker_signal"),
            ep_create: sym!(lib, "ucp_ep_create"),
            ep_close_nbx: sym!(lib, "ucp_ep_close_nbx"),
            ep_print_info: sym!(lib, "ucp_ep_print_info"),
            mem_map: sym!(lib, "ucp_mem_map"),
            mem_unmap: sym!(lib, "ucp_mem_unmap"),
            rkey_pack: sym!(lib, "ucp_rkey_pack"),
            rkey_buffer_release: sym!(lib, "ucp_rkey_buffer_release"),
            ep_rkey_unpack: sym!(lib, "ucp_ep_rkey_unpack"),
            rkey_destroy: sym!(lib, "ucp_rkey_destroy"),
            get_nbx: sym!(lib, "ucp_get_nbx"),
            put_nbx: sym!(lib, "ucp_put_nbx"),
            ep_flush_nbx: sym!(lib, "ucp_ep_flush_nbx"),
            am_send_nbx: sym!(lib, "ucp_am_send_nbx"),
            worker_set_am_recv_handler: sym!(lib, "ucp_worker_set_am_recv_handler"),
            request_check_status: sym!(lib, "ucp_request_check_status"),
            request_free: sym!(lib, "ucp_request_free"),
            status_string: sym!(ucs, "ucs_status_string"),
            _lib: lib,
            _ucs: ucs,
            path: path.to_path_buf(),
        })
    }

    /// UCX's words for `s`.
    pub(crate) fn describe(&self, s: Status) -> String {
        // SAFETY: `ucs_status_string` returns a static NUL-terminated string
        // for every status value (unknown ones included).
        let p = unsafe { (self.status_string)(s) };
        if p.is_null() {
            return format!("UCX status {s}");
        }
        // SAFETY: non-null and NUL-terminated, static (see above).
        unsafe { std::ffi::CStr::from_ptr(p) }
            .to_string_lossy()
            .into_owned()
    }
}

/// Where to look for `libucp`, in order: `FERRY_UCX_LIB` (a file or a
/// directory), the system's (`libucp.so.0` through the loader), then the
/// libraries the PyPI packages `libucx-cu12` / `libucx-cu13` install under
/// the Python environments in use (UCX built with CUDA transports).
pub(crate) fn candidates(config: &crate::config::ProcessConfig) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Some(p) = &config.ucx_lib.value {
        out.push(if p.is_dir() {
            p.join("libucp.so.0")
        } else {
            p.clone()
        });
        return out;
    }
    out.push(PathBuf::from("libucp.so.0"));
    let mut roots: Vec<PathBuf> = config.python_lib_roots.clone();
    roots.push("/usr/local/lib".into());
    roots.push("/usr/lib".into());
    for root in roots {
        let Ok(dir) = std::fs::read_dir(&root) else {
            continue;
        };
        for py in dir.flatten() {
            if !py.file_name().to_string_lossy().starts_with("python3") {
                continue;
            }
            for site in ["site-packages", "dist-packages"] {
                for pkg in ["libucx", "libucx_cu12", "libucx_cu13"] {
                    for name in ["libucp.so.0", "libucp.so"] {
                        let lib = py.path().join(site).join(pkg).join("lib").join(name);
                        if lib.exists() {
                            out.push(lib);
                        }
                    }
                }
            }
        }
    }
    out
}
