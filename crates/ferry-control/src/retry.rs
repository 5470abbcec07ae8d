//! Asking again until a deadline.

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

use crate::{Error, Result};

/// Runs `attempt` (given the time left) until it succeeds, fails for good,
/// or `deadline` passes; then returns the last transient error it saw, or
/// [`Error::Timeout`]. With `distrust_answers` (a fetch with a secret),
/// errors about an answer that came back are transient too: an answer
/// that is not sealed proves nothing, so it cannot end the fetch.
pub(crate) async fn until_deadline<T, F, Fut>(
    deadline: Duration,
    during: &'static str,
    distrust_answers: bool,
    mut attempt: F,
) -> Result<T>
where
    F: FnMut(Duration) -> Fut,
    Fut: Future<Output = Result<T>>,
{
    let start = Instant::now();
    let end = start + deadline;
    let mut pause = Duration::from_millis(5);
    let mut last: Option<Error> = None;
    loop {
        let left = end.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break;
        }
        match tokio::time::timeout(left, attempt(left)).await {
            Ok(Ok(v)) => return Ok(v),
            Ok(Err(e)) if e.is_transient() || distrust_answers && e.is_unauthenticated_answer() => {
                tracing::debug!(error = %e, "control plane: will ask again");
                last = Some(e);
            }
            Ok(Err(e)) => return Err(e),
            Err(_) => break,
        }
        let left = end.saturating_duration_since(Instant::now());
        tokio::time::sleep(pause.min(left)).await;
        pause = (pause * 2).min(Duration::from_millis(200));
    }
    let waited = start.elapsed();
    Err(match last {
        Some(Error::NotFound { key, .. }) => Error::NotFound { key, waited },
        Some(Error::Timeout { .. }) | None => Error::Timeout { waited, during },
        Some(e) => e,
    })
}
