//! The part of the CUDA driver API (`libcuda`) that Ferry calls, declared by
//! hand and loaded at run time (no header, no link-time dependency, no CUDA
//! toolkit at build time), in the style of `transport::ucx::ffi`.
//!
//! Signatures are those of `cuda.h` (CUDA 11 and 12); the `_v2` names are
//! the symbols `cuda.h` maps the plain names to. `CUresult` is an `int`,
//! `CUdevice` an `int`, `CUdeviceptr` a 64-bit integer, contexts and streams
//! opaque pointers, and `CUipcMemHandle` 64 bytes passed by value.
//!
//! Verified on one H100 on 2026-11-24 (driver 580.159.04, driver API
//! 13.0): every symbol resolved, `cuInit` succeeded, and the GPU tests ran
//! Ferry's calls through these declarations (`docs/gpu.md`). Without a
//! GPU, only the loading failures (no library, a library that is not
//! `libcuda`) are tested.

use std::ffi::{c_char, c_int, c_uint, c_void, CStr, OsString};
use std::path::{Path, PathBuf};

use libloading::Library;

use super::CudaError;

pub(crate) type CuResult = c_int;
pub(crate) type CuDevice = c_int;
pub(crate) type CuDevicePtr = u64;
pub(crate) type CuContext = *mut c_void;
pub(crate) type CuStream = *mut c_void;

pub(crate) const CUDA_SUCCESS: CuResult = 0;
/// `cuInit`: the driver found no CUDA-capable device.
pub(crate) const CUDA_ERROR_NO_DEVICE: CuResult = 100;

/// `cuMemHostAlloc`: pinned memory usable from every context.
pub(crate) const CU_MEMHOSTALLOC_PORTABLE: c_uint = 0x01;
/// `cuStreamCreate`: no implicit synchronisation with the legacy stream.
pub(crate) const CU_STREAM_NON_BLOCKING: c_uint = 0x1;
/// `cuIpcOpenMemHandle`: enable peer access lazily where devices differ.
pub(crate) const CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS: c_uint = 0x1;
/// `CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMORY_TYPE` (a `CUmemorytype`).
pub(crate) const CU_POINTER_ATTRIBUTE_MEMORY_TYPE: c_int = 2;
/// `CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL` (an `int`).
pub(crate) const CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL: c_int = 9;
/// `CUmemorytype::CU_MEMORYTYPE_DEVICE`.
pub(crate) const CU_MEMORYTYPE_DEVICE: c_uint = 2;

/// The environment variable that names the `libcuda` to load (a path).
pub(crate) use crate::config::CUDA_LIB_ENV as LIB_ENV;

/// `CUipcMemHandle`: an opaque 64-byte handle, passed by value.
#[repr(C)]
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) struct IpcMemHandle {
    pub(crate) reserved: [c_char; 64],
}

const _: () = assert!(std::mem::size_of::<IpcMemHandle>() == 64);

/// `CUuuid`: a device's 16-byte UUID (`cuDeviceGetUuid_v2`: a MIG
/// instance's own where the device is one).
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct CuUuid {
    pub(crate) bytes: [c_char; 16],
}

const _: () = assert!(std::mem::size_of::<CuUuid>() == 16);

/// The driver's functions, resolved from one loaded `libcuda`, all at load,
/// so that a driver lacking one is refused then rather than halfway
/// through a transfer (the IPC calls are the CUDA IPC puller's:
/// `cuda/ipc.rs`).
// Some fields (the synchronous device-to-device copy) are not read yet.
#[allow(dead_code)]
pub(crate) struct Api {
    pub(crate) init: unsafe extern "C" fn(c_uint) -> CuResult,
    pub(crate) driver_get_version: unsafe extern "C" fn(*mut c_int) -> CuResult,
    pub(crate) device_get_count: unsafe extern "C" fn(*mut c_int) -> CuResult,
    pub(crate) device_get: unsafe extern "C" fn(*mut CuDevice, c_int) -> CuResult,
    pub(crate) device_get_name: unsafe extern "C" fn(*mut c_char, c_int, CuDevice) -> CuResult,
    pub(crate) device_get_uuid: unsafe extern "C" fn(*mut CuUuid, CuDevice) -> CuResult,
    pub(crate) primary_ctx_retain: unsafe extern "C" fn(*mut CuContext, CuDevice) -> CuResult,
    pub(crate) primary_ctx_release: unsafe extern "C" fn(CuDevice) -> CuResult,
    pub(crate) ctx_set_current: unsafe extern "C" fn(CuContext) -> CuResult,
    pub(crate) ctx_get_current: unsafe extern "C" fn(*mut CuContext) -> CuResult,
    pub(crate) mem_alloc: unsafe extern "C" fn(*mut CuDevicePtr, usize) -> CuResult,
    pub(crate) mem_free: unsafe extern "C" fn(CuDevicePtr) -> CuResult,
    pub(crate) memcpy_htod: unsafe extern "C" fn(CuDevicePtr, *const c_void, usize) -> CuResult,
    pub(crate) memcpy_dtoh: unsafe extern "C" fn(*mut c_void, CuDevicePtr, usize) -> CuResult,
    pub(crate) memcpy_dtod: unsafe extern "C" fn(CuDevicePtr, CuDevicePtr, usize) -> CuResult,
    pub(crate) memcpy_htod_async:
        unsafe extern "C" fn(CuDevicePtr, *const c_void, usize, CuStream) -> CuResult,
    pub(crate) memcpy_dtoh_async:
        unsafe extern "C" fn(*mut c_void, CuDevicePtr, usize, CuStream) -> CuResult,
    pub(crate) memcpy_dtod_async:
        unsafe extern "C" fn(CuDevicePtr, CuDevicePtr, usize, CuStream) -> CuResult,
    pub(crate) mem_host_alloc: unsafe extern "C" fn(*mut *mut c_void, usize, c_uint) -> CuResult,
    pub(crate) mem_free_host: unsafe extern "C" fn(*mut c_void) -> CuResult,
    pub(crate) stream_create: unsafe extern "C" fn(*mut CuStream, c_uint) -> CuResult,
    pub(crate) stream_destroy: unsafe extern "C" fn(CuStream) -> CuResult,
    pub(crate) stream_synchronize: unsafe extern "C" fn(CuStream) -> CuResult,
    pub(crate) pointer_get_attribute:
        unsafe extern "C" fn(*mut c_void, c_int, CuDevicePtr) -> CuResult,
    pub(crate) ipc_get_mem_handle: unsafe extern "C" fn(*mut IpcMemHandle, CuDevicePtr) -> CuResult,
    pub(crate) ipc_open_mem_handle:
        unsafe extern "C" fn(*mut CuDevicePtr, IpcMemHandle, c_uint) -> CuResult,
    pub(crate) ipc_close_mem_handle: unsafe extern "C" fn(CuDevicePtr) -> CuResult,
    pub(crate) mem_get_address_range:
        unsafe extern "C" fn(*mut CuDevicePtr, *mut usize, CuDevicePtr) -> CuResult,
    pub(crate) get_error_name: unsafe extern "C" fn(CuResult, *mut *const c_char) -> CuResult,
    /// Kept loaded for as long as the functions above may be called.
    _lib: Library,
}

impl Api {
    /// Opens `path` and resolves every function, or says which is missing.
    fn resolve(path: &Path) -> Result<Api, String> {
        // SAFETY: loading `libcuda` runs its constructors, which set up only
        // the driver's own state; no Rust state is touched. A library that
        // is not `libcuda` (a wrong `FERRY_CUDA_LIB`) is refused below by
        // its missing symbols before any of its code is called by us.
        let lib = unsafe { Library::new(path) }.map_err(|e| format!("{}: {e}", path.display()))?;
        macro_rules! sym {
            // The first of two names the library has (a newer version of
            // the function, then the one before it, of the same signature).
            ($name:literal, $fallback:literal) => {
                // SAFETY: as below, for either name.
                *unsafe { lib.get(concat!($name, "\0").as_bytes()) }
                    .or_else(|_| unsafe { lib.get(concat!($fallback, "\0").as_bytes()) })
                    .map_err(|e| {
                        format!(
                            "{}: no {} ({e}): not a CUDA driver library",
                            path.display(),
                            $fallback
                        )
                    })?
            };
            ($name:literal) => {
                // SAFETY: the symbol is a function of the CUDA driver API
                // whose C signature (`cuda.h`) is the type of the field it
                // fills; the library outlives the pointer (same struct).
                *unsafe { lib.get(concat!($name, "\0").as_bytes()) }.map_err(|e| {
                    format!(
                        "{}: no {} ({e}): not a CUDA driver library",
                        path.display(),
                        $name
                    )
                })?
            };
        }
        Ok(Api {
            init: sym!("cuInit"),
            driver_get_version: sym!("cuDriverGetVersion"),
            device_get_count: sym!("cuDeviceGetCount"),
            device_get: sym!("cuDeviceGet"),
            device_get_name: sym!("cuDeviceGetName"),
            // `_v2` (a MIG instance's own UUID) from CUDA 11.4 drivers on;
            // the plain one before (both take `CUuuid *, CUdevice`).
            device_get_uuid: sym!("cuDeviceGetUuid_v2", "cuDeviceGetUuid"),
            primary_ctx_retain: sym!("cuDevicePrimaryCtxRetain"),
            primary_ctx_release: sym!("cuDevicePrimaryCtxRelease_v2"),
            ctx_set_current: sym!("cuCtxSetCurrent"),
            ctx_get_current: sym!("cuCtxGetCurrent"),
            mem_alloc: sym!("cuMemAlloc_v2"),
            mem_free: sym!("cuMemFree_v2"),
            memcpy_htod: sym!("cuMemcpyHtoD_v2"),
            memcpy_dtoh: sym!("cuMemcpyDtoH_v2"),
            memcpy_dtod: sym!("cuMemcpyDtoD_v2"),
            memcpy_htod_async: sym!("cuMemcpyHtoDAsync_v2"),
            memcpy_dtoh_async: sym!("cuMemcpyDtoHAsync_v2"),
            memcpy_dtod_async: sym!("cuMemcpyDtoDAsync_v2"),
            mem_host_alloc: sym!("cuMemHostAlloc"),
            mem_free_host: sym!("cuMemFreeHost"),
            stream_create: sym!("cuStreamCreate"),
            stream_destroy: sym!("cuStreamDestroy_v2"),
            stream_synchronize: sym!("cuStreamSynchronize"),
            pointer_get_attribute: sym!("cuPointerGetAttribute"),
            ipc_get_mem_handle: sym!("cuIpcGetMemHandle"),
            ipc_open_mem_handle: sym!("cuIpcOpenMemHandle_v2"),
            ipc_close_mem_handle: sym!("cuIpcCloseMemHandle"),
            mem_get_address_range: sym!("cuMemGetAddressRange_v2"),
            get_error_name: sym!("cuGetErrorName"),
            _lib: lib,
        })
    }
}

/// One loaded and initialised CUDA driver.
pub(crate) struct Driver {
    pub(crate) api: Api,
    /// Where the library was found.
    pub(crate) path: PathBuf,
    /// `cuDriverGetVersion`: `1000 * major + 10 * minor` (12040 is 12.4).
    pub(crate) version: i32,
}

impl std::fmt::Debug for Driver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Driver")
            .field("path", &self.path)
            .field("version", &self.version)
            .finish_non_exhaustive()
    }
}

impl Driver {
    /// Loads the library at `path` (a file, or a name the dynamic loader
    /// resolves), resolves every function and calls `cuInit(0)`. Every
    /// failure is an `Err` saying what went wrong, never a panic.
    pub(crate) fn load(path: &Path) -> Result<Driver, String> {
        let api = Api::resolve(path)?;
        // SAFETY: `cuInit` takes a flags word that must be 0; it is safe to
        // call more than once and from any thread.
        let r = unsafe { (api.init)(0) };
        if r != CUDA_SUCCESS {
            return Err(format!(
                "{}: cuInit failed: {} ({r}){}",
                path.display(),
                error_name(&api, r),
                if r == CUDA_ERROR_NO_DEVICE {
                    ": no CUDA device"
                } else {
                    ""
                }
            ));
        }
        let mut version: c_int = 0;
        // SAFETY: `version` is a valid, writable `int`.
        let r = unsafe { (api.driver_get_version)(&mut version) };
        if r != CUDA_SUCCESS {
            return Err(format!(
                "{}: cuDriverGetVersion failed: {}",
                path.display(),
                error_name(&api, r)
            ));
        }
        Ok(Driver {
            api,
            path: path.to_path_buf(),
            version,
        })
    }

    /// Tries each of `paths` in order; the first that loads, or every
    /// reason, joined.
    pub(crate) fn load_first(paths: &[PathBuf]) -> Result<Driver, String> {
        let mut why = Vec::new();
        if paths.is_empty() {
            why.push("no library to try".to_string());
        }
        for p in paths {
            match Driver::load(p) {
                Ok(d) => return Ok(d),
                Err(e) => why.push(e),
            }
        }
        Err(format!(
            "{} (install the NVIDIA driver, or set {LIB_ENV} to the path of libcuda.so.1)",
            why.join("; ")
        ))
    }

    /// The driver's name for `code` (`CUDA_ERROR_INVALID_VALUE`).
    pub(crate) fn error_name(&self, code: CuResult) -> String {
        error_name(&self.api, code)
    }

    /// `Ok` for `CUDA_SUCCESS`, else the typed error of `call`.
    pub(crate) fn check(&self, call: &'static str, code: CuResult) -> Result<(), CudaError> {
        if code == CUDA_SUCCESS {
            Ok(())
        } else {
            Err(CudaError::Driver {
                call,
                code,
                name: self.error_name(code),
            })
        }
    }

    /// How many devices the driver sees.
    pub(crate) fn device_count(&self) -> Result<u32, CudaError> {
        let mut n: c_int = 0;
        // SAFETY: `n` is a valid, writable `int`; the driver is initialised.
        let r = unsafe { (self.api.device_get_count)(&mut n) };
        self.check("cuDeviceGetCount", r)?;
        Ok(n.max(0) as u32)
    }

    /// The driver's handle of `cuda:ordinal`.
    pub(crate) fn device(&self, ordinal: u32) -> Result<CuDevice, CudaError> {
        if ordinal >= self.device_count()? {
            return Err(CudaError::InvalidDevice(ordinal));
        }
        let mut dev: CuDevice = 0;
        // SAFETY: `dev` is writable; the ordinal is below the device count.
        let r = unsafe { (self.api.device_get)(&mut dev, ordinal as c_int) };
        self.check("cuDeviceGet", r)?;
        Ok(dev)
    }

    /// The UUID of `cuda:ordinal`: what names one GPU in every process
    /// of a host, however each numbers its devices.
    pub(crate) fn device_uuid(&self, ordinal: u32) -> Result<[u8; 16], CudaError> {
        let dev = self.device(ordinal)?;
        let mut uuid = CuUuid { bytes: [0; 16] };
        // SAFETY: `uuid` is a writable `CUuuid`; `dev` came from `cuDeviceGet`.
        let r = unsafe { (self.api.device_get_uuid)(&mut uuid, dev) };
        self.check("cuDeviceGetUuid_v2", r)?;
        Ok(uuid.bytes.map(|c| c as u8))
    }

    /// The marketing name of `cuda:ordinal` ("NVIDIA H100 80GB HBM3").
    pub(crate) fn device_name(&self, ordinal: u32) -> Result<String, CudaError> {
        let dev = self.device(ordinal)?;
        let mut buf = [0 as c_char; 256];
        // SAFETY: the buffer is writable for its whole length, which is
        // passed; the driver writes a NUL-terminated string into it.
        let r = unsafe { (self.api.device_get_name)(buf.as_mut_ptr(), buf.len() as c_int, dev) };
        self.check("cuDeviceGetName", r)?;
        // Terminated by the driver; the last byte is forced for safety.
        buf[buf.len() - 1] = 0;
        // SAFETY: NUL-terminated within the buffer (see above).
        Ok(unsafe { CStr::from_ptr(buf.as_ptr()) }
            .to_string_lossy()
            .into_owned())
    }
}

/// `cuGetErrorName` of `code`, or the number where the driver has no name.
fn error_name(api: &Api, code: CuResult) -> String {
    let mut p: *const c_char = std::ptr::null();
    // SAFETY: `p` is writable; the driver stores a pointer to a static
    // string, or returns an error for an unknown code.
    let r = unsafe { (api.get_error_name)(code, &mut p) };
    if r != CUDA_SUCCESS || p.is_null() {
        return format!("CUDA error {code}");
    }
    // SAFETY: non-null, NUL-terminated and static (the driver's table).
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

/// Where to look for `libcuda`, in order, given the value of
/// `FERRY_CUDA_LIB`: that path alone where it is set, else `libcuda.so.1`
/// then `libcuda.so` through the dynamic loader.
pub(crate) fn candidates(env: Option<OsString>) -> Vec<PathBuf> {
    match env {
        Some(v) if !v.is_empty() => vec![PathBuf::from(v)],
        _ => vec![PathBuf::from("libcuda.so.1"), PathBuf::from("libcuda.so")],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn candidates_follow_the_environment() {
        assert_eq!(
            candidates(None),
            [PathBuf::from("libcuda.so.1"), PathBuf::from("libcuda.so")]
        );
        assert_eq!(candidates(Some("".into())), candidates(None));
        assert_eq!(
            candidates(Some("/opt/x/libcuda.so.1".into())),
            [PathBuf::from("/opt/x/libcuda.so.1")]
        );
    }

    #[test]
    fn a_missing_library_is_a_clear_error() {
        let why = Driver::load(Path::new("/nonexistent/libcuda.so.1")).unwrap_err();
        assert!(why.contains("/nonexistent/libcuda.so.1"), "{why}");
    }

    #[test]
    fn a_library_that_is_not_cuda_is_refused() {
        // libc is loaded in every process: it opens, but has no `cuInit`.
        let why = Driver::load(Path::new("libc.so.6")).unwrap_err();
        assert!(
            why.contains("cuInit") && why.contains("not a CUDA driver"),
            "{why}"
        );
    }

    #[test]
    fn every_reason_is_reported_with_what_to_do() {
        let why = Driver::load_first(&[
            PathBuf::from("/nonexistent/libcuda.so.1"),
            PathBuf::from("libc.so.6"),
        ])
        .unwrap_err();
        assert!(why.contains("/nonexistent/libcuda.so.1"), "{why}");
        assert!(why.contains("libc.so.6"), "{why}");
        assert!(why.contains(LIB_ENV), "{why}");
        let why = Driver::load_first(&[]).unwrap_err();
        assert!(why.contains(LIB_ENV), "{why}");
    }
}
