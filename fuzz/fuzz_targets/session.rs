//! An active and a passive `ferry_proto::session::Session` on one
//! connection, driven by a script: honest frames and hostile ones (built
//! from the input or decoded from its raw bytes) in any order, cancels, a
//! lost connection. Never a panic; every `Err` a `Violation` with its
//! documented reason; and no `Step::Payload`, `Stream`, `Pull`, `Commit`,
//! `Complete` or `PartDone` beyond what the request's grant allows. The
//! harness lives in `crates/ferry-proto/tests/support/session_fuzz.rs` (its
//! checks in `session_fuzz_checks.rs` beside it), which
//! `tests/session_fuzz.rs` also runs on stable under proptest.
#![no_main]

use libfuzzer_sys::fuzz_target;

#[allow(dead_code)]
#[path = "../../crates/ferry-proto/tests/support/session_fuzz.rs"]
mod session_fuzz;

fuzz_target!(|data: &[u8]| {
    session_fuzz::run(data);
});
