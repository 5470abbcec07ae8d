//! Prepared groups: one transfer over several region pairs (a KV cache
//! registered as one region per layer, as vLLM's `NixlConnector` does),
//! posted as one, NIXL's way. Each part is a `PreparedRanges` over its own
//! grant; a post takes every part's local blocks, moves every part (one
//! after the other in the call when small, side by side on Ferry's
//! runtime otherwise), then sends the notifications, in order, through a
//! mailbox grant: the owner sees them after every byte landed. No Python
//! code runs between the post and its end, so a caller polling the result
//! with the GIL held never slows it down.

use std::sync::Arc;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use super::prepared::{LastPost, PreparedRanges, Shared, DONE, FAILED, IN_PROGRESS};
use super::ranges::Ranges;
use super::{Gate, RemoteGrant};
use crate::bridge::{block_on_detached, spawn};

/// Several prepared transfers posted as one, with trailing notifications.
#[pyclass(frozen, module = "ferry._ferry")]
pub(crate) struct PreparedGroup {
    parts: Vec<Py<PreparedRanges>>,
    mailbox: Option<ferry::RemoteGrant>,
    /// Whether a post runs on the runtime (it moves at least
    /// `ferry.grant.INLINE_MAX` bytes in all).
    large: bool,
    last: LastPost,
}

/// One part of a post: its grant, whether it writes, and its arguments.
type Part = (ferry::RemoteGrant, bool, Ranges);

async fn run(
    parts: Vec<Part>,
    mailbox: Option<ferry::RemoteGrant>,
    notify: Vec<Vec<u8>>,
    side_by_side: bool,
) -> ferry::Result<()> {
    let mut first_error = None;
    if side_by_side {
        let mut set = tokio::task::JoinSet::new();
        for (g, write, t) in parts {
            set.spawn(PreparedRanges::run(g, write, t, None));
        }
        // Every part ends before the post does (their copies and claims
        // with them), failed or not.
        while let Some(r) = set.join_next().await {
            let r = r.unwrap_or_else(|e| {
                Err(ferry::Error::Config(format!("a grant's copy failed: {e}")))
            });
            if let (Err(e), None) = (r, &first_error) {
                first_error = Some(e);
            }
        }
    } else {
        for (g, write, t) in parts {
            if let Err(e) = PreparedRanges::run(g, write, t, None).await {
                first_error.get_or_insert(e);
            }
        }
    }
    if let Some(e) = first_error {
        return Err(e);
    }
    if let Some(m) = mailbox {
        for p in notify {
            m.notify(&p).await?;
        }
    }
    Ok(())
}

#[pymethods]
impl PreparedGroup {
    /// A group of `parts` whose notifications go through `mailbox` (a
    /// grant of the owner's mailbox offer; needed to post notifications),
    /// posted only while every one of `gates` is open.
    #[new]
    #[pyo3(signature = (parts, mailbox=None, gates=Vec::new()))]
    fn new(
        py: Python<'_>,
        parts: Vec<Py<PreparedRanges>>,
        mailbox: Option<PyRef<'_, RemoteGrant>>,
        gates: Vec<Py<Gate>>,
    ) -> PyResult<Self> {
        if parts.is_empty() {
            return Err(PyValueError::new_err(
                "a prepared group has at least one part",
            ));
        }
        let total = parts
            .iter()
            .map(|p| p.bind(py).get().nbytes_of())
            .fold(0u64, u64::saturating_add);
        Ok(PreparedGroup {
            large: total >= ferry::grant::INLINE_MAX as u64,
            parts,
            mailbox: mailbox.map(|m| m.inner.clone()),
            last: LastPost::new(gates),
        })
    }

    /// Posts once, as `PreparedRanges.post` does (the same answers), then
    /// sends `notify` (in order) through the mailbox once every part has
    /// moved its bytes.
    #[pyo3(signature = (notify=Vec::new()))]
    fn post(&self, py: Python<'_>, notify: Vec<Vec<u8>>) -> PyResult<u8> {
        let shared = match self.last.begin(py) {
            Ok(s) => s,
            Err(code) => return Ok(code),
        };
        if !notify.is_empty() && self.mailbox.is_none() {
            shared.fail(
                py,
                PyValueError::new_err("no mailbox to send the notification through"),
            );
            return Ok(FAILED);
        }
        let mut parts = Vec::with_capacity(self.parts.len());
        for p in &self.parts {
            let p = p.bind(py).get();
            match p.take(py) {
                Ok(t) => {
                    let (g, write) = p.grant();
                    parts.push((g, write, t));
                }
                Err(e) => {
                    // The parts taken so far give their blocks back here.
                    drop(parts);
                    shared.fail(py, e);
                    return Ok(FAILED);
                }
            }
        }
        let work = run(parts, self.mailbox.clone(), notify, self.large);
        if self.large {
            let s: Arc<Shared> = shared.clone();
            let work = Box::pin(work);
            if let Err(e) = spawn(async move { s.finish(work.await) }) {
                shared.fail(py, e);
                return Ok(FAILED);
            }
            shared.posted();
            return Ok(if shared.is_done() { DONE } else { IN_PROGRESS });
        }
        let r = match block_on_detached(py, Box::pin(work)) {
            Ok(r) => r,
            Err(e) => {
                shared.fail(py, e);
                return Ok(FAILED);
            }
        };
        let ok = r.is_ok();
        shared.finish(r);
        shared.posted();
        Ok(if ok { DONE } else { FAILED })
    }

    /// As `PreparedRanges.done`, for the group's last post.
    fn done(&self) -> bool {
        self.last.done()
    }

    /// As `PreparedRanges.error`.
    fn error(&self, py: Python<'_>) -> Option<Py<PyAny>> {
        self.last.error(py)
    }

    /// As `PreparedRanges.finished_ns`.
    fn finished_ns(&self, py: Python<'_>) -> PyResult<Option<u64>> {
        self.last.finished_ns(py)
    }

    /// Nothing: a post in progress is never cut short.
    fn cancel(&self) {}

    /// As `PreparedRanges.wait`.
    fn wait(&self, py: Python<'_>, timeout: f64) -> PyResult<bool> {
        self.last.wait(py, timeout)
    }

    /// As `PreparedRanges.times`.
    fn times(&self) -> Option<(u64, u64, Option<u64>)> {
        self.last.times()
    }

    /// Whether a post runs on Ferry's runtime.
    #[getter]
    fn large(&self) -> bool {
        self.large
    }
}
