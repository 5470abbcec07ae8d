//! The `ferry` command's library: the peer process that the demo, the
//! benchmark and the cross-process tests drive over a pipe, and the data
//! patterns they check bytes with.
// Only `clock` and `grantbench`'s raw baseline call into libc, `gpu` turns
// the GPU simulation on and `buffers` describes simulated device memory
// (each with its own `allow`).
#![deny(unsafe_code)]
#![warn(missing_docs)]

pub mod bench;
pub mod buffers;
pub mod clock;
pub mod demo;
pub mod gpu;
pub mod grantbench;
pub mod kv;
pub mod pattern;
pub mod peer;
pub mod plot;
pub mod status;
