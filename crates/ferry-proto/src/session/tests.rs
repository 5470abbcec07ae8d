//! Session-level tests (see also `tests/session_pair.rs`).
