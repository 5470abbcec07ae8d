//! The session over an in-process channel, without a socket: a channel
//! pair that injects faults (`link.rs`: delay, split, stall, cut) and a
//! driver of `ferry_proto::session::Session` on each end (`driver.rs`).
//! The whole protocol (handshake, requests, liveness, the hostile-input
//! rules) runs here deterministically, under faults a test chooses.
//!
//! A first step towards `local` as a driver of the same session (issue
//! 34): the same-process transport (`transport/local.rs`) still copies
//! between the two regions itself; this driver has its own operations
//! (`Op`) rather than the connector's regions and exposure table, and
//! moves bytes in band only. Test-only until it drives the connector's
//! operations.

mod driver;
mod link;
#[cfg(test)]
mod tests;
