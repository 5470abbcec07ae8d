//! The compiled core of Ferry's Python package, imported as `ferry._ferry`.
//!
//! The public API (`ferry.Connector`, `ferry.Descriptor`, the four operation
//! classes, the enums and the exceptions) is written in Python, in
//! `python/ferry/`, on top of the few classes here:
//!
//! - `Connector` (`connector.rs`) wraps a [`ferry::Connector`]. Creating a readable or a
//!   writable is synchronous (nothing waits); `begin_read`/`begin_write`
//!   return an `asyncio.Future` (or block, releasing the GIL, in their
//!   `_blocking` forms).
//! - `Operation` (`ops.rs`) is any of the four operations, together with
//!   the Python objects that own the memory it moves (`memory.rs`: the
//!   descriptors) and its claim on that memory (`claims.rs`: what keeps two
//!   operations off the same bytes).
//! - `Metadata` (`metadata.rs`) wraps a [`ferry::RdmaMetadata`].
//! - `Pool` and `Blocks` (`pool.rs`): a registered region cut into blocks,
//!   and blocks of it by id (a paged descriptor), taken by an operation
//!   while it is in progress.
//! - `GrantMetadata`, `Grant` and `RemoteGrant` (`grant.rs`): standing
//!   grants, the owner's and the holder's sides, with one-sided transfers
//!   by block index.
//! - `OfferMetadata` and `Offer` (`offer.rs`): a pool offered to any
//!   number of workers, each claiming a grant of its own.
//! - `HttpServer`, `NatsChannel`, `Publication` and `http_fetch`
//!   (`control.rs`): the control plane of `ferry-control`, blocking without
//!   the GIL; `ferry.control` wraps them in coroutines.
//!
//! One multi-thread Tokio runtime per process runs every connector. A future
//! that is ready at once (most are: creating a readable, starting a read on a
//! pooled connection) completes on the calling thread. The others run on the
//! runtime and post their result to the `Mailbox` of the event loop that
//! awaits them, which wakes that loop through a socket pair it watches
//! (`bridge.rs`, and `python/ferry/_bridge.py` for the loops' registry). So no thread but the loop's ever takes the GIL, nothing
//! polls, and a Python thread that blocks on Rust releases the GIL first.
//! Ferry's errors become Python exceptions in `errors.rs`.
#![deny(unsafe_code)]

mod bridge;
mod claims;
mod connector;
mod control;
mod errors;
mod grant;
mod memory;
mod metadata;
mod offer;
mod ops;
mod pool;

use std::sync::{Mutex, MutexGuard};

use ferry::{Device, DeviceKind};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyModule};

use crate::bridge::Bridge;
use crate::connector::Connector;
use crate::metadata::Metadata;
use crate::ops::Operation;

/// Locks `m`, also after a panic of a thread that held it.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Parses "cpu", "cuda" or "cuda:N" into `(kind, id)`, kind 1 for host
/// memory and 2 for CUDA (the reference's `DeviceKind` numbers).
#[pyfunction]
fn parse_device(device: &str) -> PyResult<(u8, u32)> {
    let d: Device = device
        .parse()
        .map_err(|e: ferry::ParseDeviceError| PyValueError::new_err(e.to_string()))?;
    let kind = match d.kind() {
        DeviceKind::Cpu => 1,
        DeviceKind::Cuda => 2,
    };
    Ok((kind, d.id()))
}

/// `(address, length)` of the bytes of a `bytes` object (or of a subclass:
/// the length is the object's own, read in C, whatever its `__len__` says).
/// Immutable, and valid while the object lives.
#[pyfunction]
fn bytes_address(data: &Bound<'_, PyBytes>) -> (usize, usize) {
    let bytes = data.as_bytes();
    (bytes.as_ptr() as usize, bytes.len())
}

/// The GPU whose memory `ptr` is, as the CUDA driver says
/// (`ferry::cuda::device_of`); `None` where there is no driver to ask (no
/// GPU, or a simulated one) or where it does not know the address.
#[pyfunction]
fn cuda_device_of(ptr: u64) -> Option<u32> {
    ferry::cuda::device_of(ptr).ok()
}

/// For tests only: set to `1` in a process's environment before it imports
/// `ferry`, it makes that process treat every CUDA address it is given as
/// host memory (`ferry::cuda::simulate_with_host_memory`), so that GPU
/// memory's staged paths run without a GPU (`tests/test_simulated_gpu.py`).
/// Ignored (with a warning) where the CUDA driver sees a GPU: there device
/// addresses may be real.
const SIMULATED_GPU_ENV: &str = "FERRY_TEST_SIMULATED_GPU";

/// Ferry's compiled core; use the `ferry` package instead.
#[pymodule]
fn _ferry(m: &Bound<'_, PyModule>) -> PyResult<()> {
    if std::env::var(SIMULATED_GPU_ENV).as_deref() == Ok("1") && ferry::cuda::available() {
        eprintln!("ferry: {SIMULATED_GPU_ENV}=1 ignored: this host has a GPU");
    } else if std::env::var(SIMULATED_GPU_ENV).as_deref() == Ok("1") {
        // SAFETY: whoever sets the variable promises what
        // `simulate_with_host_memory` asks: every CUDA address this process
        // describes is host memory (the tests' arrays that present host
        // memory through `__cuda_array_interface__`). It runs as the module
        // loads, before any descriptor exists.
        #[allow(unsafe_code)]
        unsafe {
            ferry::cuda::simulate_with_host_memory()
        };
    }
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_class::<Connector>()?;
    m.add_class::<Operation>()?;
    m.add_class::<Metadata>()?;
    m.add_class::<Bridge>()?;
    m.add_class::<pool::Pool>()?;
    m.add_class::<pool::Blocks>()?;
    m.add_class::<grant::GrantMetadata>()?;
    m.add_class::<grant::Grant>()?;
    m.add_class::<grant::RemoteGrant>()?;
    m.add_class::<grant::PreparedRanges>()?;
    m.add_class::<grant::Pending>()?;
    m.add_class::<grant::Gate>()?;
    m.add_class::<grant::PreparedGroup>()?;
    m.add_class::<offer::OfferMetadata>()?;
    m.add_class::<offer::Offer>()?;
    m.add_function(wrap_pyfunction!(parse_device, m)?)?;
    m.add_function(wrap_pyfunction!(bytes_address, m)?)?;
    m.add_function(wrap_pyfunction!(cuda_device_of, m)?)?;
    control::register(m)?;
    Ok(())
}
