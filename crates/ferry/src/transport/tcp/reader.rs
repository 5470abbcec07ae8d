//! The reader of a connection: every frame that arrives, in either role.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ferry_proto::lane::{LaneId, Mem};
use ferry_proto::session::{self, lends, Liveness, Step, Tick};
use ferry_proto::wire::{AbortReason, Message, Open};
use ferry_proto::{OperationKind, OperationStatus};
use tokio::sync::watch;

use crate::exposure::{PassiveLink, Refusal};
use crate::metrics::ConnMeter;
use crate::transport::api::Host;
use crate::transport::pull::exchange::Exchange;
use crate::transport::pull::lanes::Lanes;
use crate::transport::pull::offer::{Kept, OfferCtx};
use crate::transport::stall::NoSlot;
use crate::transport::ucx::Worker;
use crate::{Error, Result};

use super::conn::*;
use super::conn_io::*;
use super::error::*;
use super::request::*;
use super::util::*;

/// What the reader of an accepted connection serves passive operations
/// from.
pub(crate) struct Served {
    pub(super) host: Arc<Host>,
    /// Cross-memory attach is enabled here.
    pub(super) cma: bool,
    /// The end-to-end integrity check is on.
    pub(super) digest: bool,
    /// This connector's UCX worker, if UCX is enabled and loaded.
    pub(super) ucx: Option<Arc<Worker>>,
    /// UCX may carry operations over endpoints without an RMA lane.
    pub(super) ucx_emulated_rma: bool,
    /// The lanes this connector offers.
    pub(super) lanes: Lanes,
}

/// The reader loop of a connection. `inner` is set for connections accepted
/// by the listener (they serve passive operations). `timers`: the idle
/// timeout, and the liveness bound (zero: off).
pub(super) async fn run_connection(
    conn: Arc<Conn>,
    mut rd: FrameReader,
    mut shutdown: watch::Receiver<bool>,
    inner: Option<Arc<Served>>,
    timers: (Duration, Duration),
    meter: ConnMeter,
) {
    let (idle_timeout, bound) = timers;
    let mut dead = conn.dead.subscribe();
    // Only this task keeps the connection's liveness: it arms one timer
    // while the connection carries a live operation, none otherwise.
    let mut liveness = Liveness::new(Some(bound), Instant::now());
    let heard = rd.heard();
    // One timer, moved only when its deadline changes (not at every frame).
    let mut timer = std::pin::pin!(tokio::time::sleep(Duration::ZERO));
    let mut armed = None;
    let err = loop {
        // Kept across wake-ups of the idle timer: a frame half read must
        // not be dropped.
        let mut frame = std::pin::pin!(step(&conn, &mut rd, inner.as_ref()));
        let step = loop {
            // Idle: the clock runs out unless an operation begins. Busy:
            // looked at again soon, so that the clock starts near the end
            // of the last operation (frames do not move it: see `idle_for`).
            let idle = conn.idle_for();
            let wait = match idle {
                Some(idle) => idle_timeout.saturating_sub(idle),
                None => (idle_timeout / 8).max(Duration::from_millis(1)),
            };
            liveness.set_busy(idle.is_none(), Instant::now());
            liveness.on_frame(at_ms(heard.load(Ordering::Relaxed)));
            let due = liveness.poll_timeout();
            if let Some(at) = due {
                liveness.armed(at);
                if armed != due {
                    timer.as_mut().reset(at.into());
                    armed = due;
                }
            }
            tokio::select! {
                r = &mut frame => break r,
                // An operation began: arm the liveness timer.
                _ = conn.began.notified(), if due.is_none() && bound > Duration::ZERO => {}
                _ = timer.as_mut(), if due.is_some() => {
                    // Fired: the next deadline moves it again.
                    armed = None;
                    // The operations may have ended since the timer was
                    // armed: an idle connection is never judged.
                    let now = Instant::now();
                    liveness.set_busy(conn.idle_for().is_none(), now);
                    liveness.on_frame(at_ms(heard.load(Ordering::Relaxed)));
                    match liveness.on_timeout(now) {
                        Tick::Wait => meter.liveness(false, false),
                        Tick::Ping => {
                            meter.liveness(true, false);
                            conn.send_soon(Message::Ping.to_vec(), None, false);
                        }
                        Tick::Unresponsive { after } => {
                            meter.liveness(false, true);
                            break Err(unresponsive(&conn, after));
                        }
                    }
                }
                _ = until(&mut dead, |d| d.is_some()) => {
                    let cause = conn.dead.borrow().clone().unwrap_or_default();
                    break Err(ConnError::Closed(Error::ConnectionLost { peer: conn.peer.clone(), cause }));
                }
                _ = until(&mut shutdown, |s| *s) => break Err(ConnError::Closed(Error::Shutdown)),
                _ = tokio::time::sleep(wait) => {
                    if conn.idle_for().is_some_and(|d| d >= idle_timeout) {
                        break Err(ConnError::Closed(Error::ConnectionLost {
                            peer: conn.peer.clone(),
                            cause: format!("idle for {idle_timeout:?}"),
                        }));
                    }
                }
            }
        };
        if let Err(e) = step {
            let told = matches!(e, ConnError::Violation(_));
            let err = e.into_error(&conn.peer);
            if told {
                // Its operations end while the connection still lives, so
                // that the peer's other parts of a striped one hear how;
                // no new operation picks it meanwhile.
                conn.closing.store(true, Ordering::Release);
                end_all(&conn, &err);
            }
            break err;
        }
    };
    tracing::debug!(peer = conn.peer, "connection closed: {err}");
    conn.kill(err.to_string());
    // After marking it dead: an operation that starts on it from now on
    // finds it dead (it checks after entering the session).
    end_all(&conn, &err);
    conn.closed();
    // Writers abandon their writes once the connection is dead, so the lock
    // comes free; bound the wait all the same.
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        let _ = conn.writer.lock().await.shutdown().await;
    })
    .await;
    drop(meter);
}

/// The peer sent nothing for `after` while the connection carried work:
/// no new operation picks the connection; the peer is told why each
/// request ends (where it can still hear); the error every operation of
/// the connection then ends with.
fn unresponsive(conn: &Arc<Conn>, after: Duration) -> ConnError {
    tracing::debug!(peer = conn.peer, ?after, "peer unresponsive");
    conn.closing.store(true, Ordering::Release);
    let detail = format!("nothing heard for {after:?}");
    conn.with_session(|s| s.unresponsive(&detail));
    ConnError::Closed(Error::PeerUnresponsive {
        peer: conn.peer.clone(),
        after,
    })
}

/// Ends every operation on the connection with `err` and gives back what
/// was lent.
fn end_all(conn: &Arc<Conn>, err: &Error) {
    conn.grants.fail_all();
    conn.claims.fail_all();
    let (reqs, lent) = lock(&conn.session).drain();
    for t in reqs {
        t.end(OperationStatus::Errored, Some(err.clone()));
    }
    // Our own copies from the peer have stopped (regions closed above); the
    // peer's copies from us end with its process or its reader (it closes
    // its regions the same way when it sees the connection end). Over UCX
    // the endpoint closes first: gets of ours still in flight end, and
    // this process no longer answers the peer's emulated gets, before the
    // memory they would read goes back to its owner.
    if let Some(ep) = conn.peers.ucx.get() {
        ep.close();
    }
    for t in lent {
        give_back(&t);
    }
}

/// Reads one frame and hands it to the session; runs what it asks.
pub(super) async fn step(
    conn: &Arc<Conn>,
    rd: &mut FrameReader,
    inner: Option<&Arc<Served>>,
) -> Result<(), ConnError> {
    let msg = rd.next().await?;
    let data_for = match &msg {
        Message::Data(d) => Some(d.req),
        _ => {
            // Whatever it says about a transfer comes after its bytes.
            rd.settle().await?;
            None
        }
    };
    match conn.with_session(|s| s.handle_frame(msg))? {
        Step::Done => Ok(()),
        Step::Payload {
            target,
            desc,
            offset,
            len,
        } => {
            if desc == 0 && offset == 0 {
                target.shared.first_byte();
            }
            // A failed copy into device memory ends this request alone.
            let fail = match (data_for, target.region.is_host()) {
                (Some(req), false) => {
                    let (conn, target) = (Arc::downgrade(conn), target.clone());
                    Some(Arc::new(move |why: String| {
                        if let Some(conn) = conn.upgrade() {
                            conn.fail_request(req, &target, why);
                        }
                    }) as super::land::OnFail)
                }
                _ => None,
            };
            rd.payload(len, Some((&target.region, desc, offset)), fail)
                .await
        }
        Step::Verify { req, target, range } => {
            // One pass over what landed (or what this side lent), outside
            // the session's lock; the session compares.
            let local = crate::transport::digest::of_range(&target.region, range);
            match conn.with_session(|s| s.verified(req, local))? {
                Step::Done => Ok(()),
                _ => Err(ConnError::Channel(
                    "a digest's verdict asked for more than the finish".into(),
                )),
            }
        }
        Step::Discard { len } => rd.payload(len, None, None).await,
        // Only a passive session asks for these.
        Step::CheckGrant(o) => match inner {
            Some(inner) => {
                on_open(conn, inner, o);
                Ok(())
            }
            None => Ok(()),
        },
        Step::ServeGrant(r) => {
            if let Some(inner) = inner {
                super::grant::serve(conn, &inner.host.grants, r);
            }
            Ok(())
        }
        Step::GrantReply(r) => {
            conn.grants.deliver(r);
            Ok(())
        }
        Step::ServeClaim(c) => {
            if let Some(inner) = inner {
                super::offer::serve(conn, &inner.host.offers, c);
            }
            Ok(())
        }
        Step::OfferReply(r) => {
            conn.claims.deliver(r);
            Ok(())
        }
        Step::LaneOffer { lane, round, bytes } => match inner {
            Some(inner) => answer_offer(conn, inner, lane, round, &bytes).await,
            // An active side's lanes were set up in its handshake.
            None => Ok(()),
        },
    }
}

/// Answers the peer's offer of `round` in lane `lane`'s set-up with that
/// lane's code, and sends what it answers. The reader waits for it (a
/// probe is bounded: `transport::probe`): what the lane proves must be the
/// session's before the next frame is.
async fn answer_offer(
    conn: &Arc<Conn>,
    inner: &Arc<Served>,
    lane: LaneId,
    round: u8,
    bytes: &[u8],
) -> Result<(), ConnError> {
    let taken = lock(&conn.exchange).take();
    let mut exchange = match taken {
        Some(e) if round > 0 => e,
        _ => {
            let ctx = OfferCtx {
                cma: inner.cma,
                same_host: true,
                tuple: conn.tuple.get().copied(),
                ucx: inner.ucx.clone(),
                ucx_emulated_rma: inner.ucx_emulated_rma,
            };
            match Exchange::answering(lane, &ctx) {
                Some(e) => e,
                None => return Ok(()),
            }
        }
    };
    let answer = exchange.accept(round, bytes).await?;
    if let Some(proof) = answer.settled {
        exchange.keep(Kept {
            peers: &conn.peers,
            cookie: &conn.cookie,
        });
        if proof.proves_any() {
            conn.peers.set_proved(lane);
        }
    } else {
        *lock(&conn.exchange) = Some(exchange);
    }
    let settles = answer.settled.is_some();
    let m = {
        let mut s = lock(&conn.session);
        let m = s.lane_answered(lane, answer);
        if settles {
            conn.agree_lanes(&mut s);
        }
        m
    };
    if let Some(m) = m {
        conn.send_detached(m);
    }
    Ok(())
}

/// Checks request `o` against the exposure table, binds it, and starts
/// serving it as the session decides.
fn on_open(conn: &Arc<Conn>, inner: &Arc<Served>, o: Open) {
    let mut joined = None;
    let mut bind =
        |bound: Option<&Arc<dyn PassiveLink>>| bind_request(conn, &o, bound, &mut joined);
    let table = &inner.host.exposures;
    let (session_caps, lanes) = {
        let s = lock(&conn.session);
        (s.caps(), s.agreed_lanes().clone())
    };
    // What the table's device check sees lent (`session::table_caps`).
    let caps = session::table_caps(session_caps, &lanes);
    // A WRITE whose source lends its memory: this side will copy it, under
    // a copy slot taken now (`stall.rs`). Where the process has none free
    // it is refused at once, before it binds (the operation stays free),
    // never queued behind copies other peers may be stalling; a request the
    // table would refuse anyway hears the table's refusal (it learns
    // nothing more). Where only its own connection's or peer's share is in
    // use, its copy waits for one of its own (`spawn_pull`).
    let mut slot = None;
    if o.kind == OperationKind::Write
        && o.pull
        && o.parts <= 1
        && session_caps.attach
        && session_caps.can_pull
    {
        match conn.copy_slot() {
            Ok(s) => slot = Some(s),
            Err(NoSlot::Connection | NoSlot::Peer) => {}
            Err(why @ NoSlot::Process) => {
                let refusal = match table.check(&o, Some(&conn.peer), caps) {
                    Err(r) => r,
                    Ok(_) => (AbortReason::CopySlots, why.to_string()),
                };
                tracing::debug!(peer = conn.peer, op = o.op_id, "refused a WRITE: {why}");
                conn.with_session(|s| s.bound(&o, Err(refusal)));
                return;
            }
        }
    }
    let verdict = match table.open(&o, Some(&conn.peer), caps, &mut bind) {
        Ok((e, _)) => {
            conn.touch();
            conn.prove();
            Ok(Target::passive(e, table.clone(), joined).with_slot(slot.take()))
        }
        Err((reason, detail)) => {
            tracing::debug!(
                peer = conn.peer,
                op = o.op_id,
                ?reason,
                "refused an operation: {detail}"
            );
            Err((reason, detail))
        }
    };
    let shared = verdict.as_ref().ok().map(|t| t.shared.clone());
    // A READ this side will lend: its memory is registered (UCX) or
    // exported (CUDA IPC) now, by the lane that lends it, before the
    // session's lock is taken, so that other tasks of this connection
    // (completions, cancels) do not wait behind it; `bound` then lends it,
    // or falls back where that failed. The caps may change between the two
    // locks (an attach verdict): then `bound` prepares under its lock as
    // before, or what was prepared stays with the region unused until it
    // drops; either is harmless. (Cross-memory attach registers nothing.)
    let prepared = match &verdict {
        Ok(t) => {
            let mem = t.region.mem();
            lanes
                .lending(mem)
                .filter(|_| lends(&o, mem == Mem::Device, session_caps))
                .map(|lane| conn.prepare_lent(lane, &t.region))
        }
        _ => None,
    };
    conn.with_session_prepared(prepared, |s| s.bound(&o, verdict));
    let Some(shared) = shared else {
        return;
    };
    // The owner may have withdrawn it between the check and the insert
    // (memory it lends is lent by now: an owner that drops the operation
    // from then on finds it lent).
    if shared.status().is_terminal() {
        conn.with_session(|s| {
            s.forget(o.req);
            s.unlend(o.req);
        });
        return;
    }
    conn.with_session(|s| s.serve(o.req));
}

/// Binds request `o` of `conn` to an exposure: a request of its own binds a
/// free exposure; a part of a striped transfer makes the stripe (the first
/// part to arrive) or joins it (`joined`: the stripe it belongs to).
pub(super) fn bind_request(
    conn: &Arc<Conn>,
    o: &Open,
    bound: Option<&Arc<dyn PassiveLink>>,
    joined: &mut Option<Arc<Stripe>>,
) -> Result<Arc<dyn PassiveLink>, Refusal> {
    if o.parts <= 1 {
        return match bound {
            None => Ok(Arc::new(ReqLink {
                conn: Arc::downgrade(conn),
                req: o.req,
            })),
            Some(_) => Err((AbortReason::Busy, String::new())),
        };
    }
    let stripe = match bound {
        None => Stripe::new(o.parts, conn.peer.clone()),
        // Another part of the same transfer, from the same worker.
        Some(b) => match b.as_any().downcast_ref::<Stripe>() {
            Some(s) if s.parts == o.parts && s.peer == conn.peer => {
                s.me.upgrade().ok_or((AbortReason::Busy, String::new()))?
            }
            _ => return Err((AbortReason::Busy, String::new())),
        },
    };
    if !stripe.bind(o.part, conn.me.clone(), o.req, None) {
        return Err((AbortReason::Busy, format!("part {} bound twice", o.part)));
    }
    *joined = Some(stripe.clone());
    Ok(stripe)
}
