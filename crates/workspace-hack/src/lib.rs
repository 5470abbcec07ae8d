//! No code: see this crate's `Cargo.toml`.
#![forbid(unsafe_code)]
