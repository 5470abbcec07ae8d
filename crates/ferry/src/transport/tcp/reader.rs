//! The reader of a connection: every frame that arrives, in either role.

use super::*;

/// The reader loop of a connection. `inner` is set for connections accepted
/// by the listener (they serve passive operations).
pub(super) async fn run_connection(
    conn: Arc<Conn>,
    mut rd: FrameReader,
    mut shutdown: watch::Receiver<bool>,
    inner: Option<Arc<Served>>,
    idle_timeout: Duration,
) {
    let mut dead = conn.dead.subscribe();
    let err = loop {
        // Kept across wake-ups of the idle timer: a frame half read must
        // not be dropped.
        let mut frame = std::pin::pin!(step(&conn, &mut rd, inner.as_ref()));
        let step = loop {
            let idle = conn.idle_for().unwrap_or_default();
            tokio::select! {
                r = &mut frame => break r,
                _ = until(&mut dead, |d| d.is_some()) => {
                    let cause = conn.dead.borrow().clone().unwrap_or_default();
                    break Err(ConnError::Closed(Error::ConnectionLost { peer: conn.peer.clone(), cause }));
                }
                _ = until(&mut shutdown, |s| *s) => break Err(ConnError::Closed(Error::Shutdown)),
                _ = tokio::time::sleep(idle_timeout.saturating_sub(idle)) => {
                    if conn.idle_for().is_some_and(|d| d >= idle_timeout) {
                        break Err(ConnError::Closed(Error::ConnectionLost {
                            peer: conn.peer.clone(),
                            cause: format!("idle for {idle_timeout:?}"),
                        }));
                    }
                }
            }
        };
        conn.touch();
        if let Err(e) = step {
            break e.into_error(&conn.peer);
        }
    };
    tracing::debug!(peer = conn.peer, "connection closed: {err}");
    conn.kill(err.to_string());
    let active: Vec<ActiveReq> = lock(&conn.active).drain().map(|(_, r)| r).collect();
    for r in active {
        r.region.close();
        r.shared.fail(err.clone());
    }
    let passive: Vec<PassiveReq> = lock(&conn.passive).drain().map(|(_, r)| r).collect();
    if let Some(inner) = &inner {
        for r in passive {
            inner
                .host
                .exposures
                .finish(&r.exposure, OperationStatus::Errored, Some(err.clone()));
        }
    }
    // Our own copies from the peer have stopped (regions closed above); the
    // peer's copies from us end with its process or its reader (it closes
    // its regions the same way when it sees the connection end).
    let leases: Vec<Arc<Region>> = lock(&conn.leases).drain().map(|(_, r)| r).collect();
    for r in leases {
        r.give_back();
    }
    conn.closed();
    // Writers abandon their writes once the connection is dead, so the lock
    // comes free; bound the wait all the same.
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        let _ = conn.writer.lock().await.shutdown().await;
    })
    .await;
}

pub(super) async fn step(
    conn: &Arc<Conn>,
    rd: &mut FrameReader,
    inner: Option<&Arc<Served>>,
) -> Result<(), ConnError> {
    let msg = rd.next().await?;
    match (msg, inner) {
        (Message::Hello(_), _) => Err(ConnError::Violation("unexpected hello".into())),
        (Message::Auth(_), inner) => {
            // With a secret, the handshake consumed the Auth frames: another
            // one is out of place. Without one, say so to the peer.
            let has_secret = inner.is_some_and(|i| i.host.secret.is_some());
            let detail = if has_secret {
                "unexpected authentication frame"
            } else {
                "this worker has no shared secret configured"
            };
            conn.send_detached(Message::Abort(Abort {
                req: 0,
                reason: AbortReason::Unauthenticated,
                detail: detail.into(),
            }));
            Err(ConnError::Violation(detail.into()))
        }
        (Message::Attach(a), Some(inner)) => on_attach(conn, inner, a),
        (Message::Attach(_), None) => Err(ConnError::Violation("unexpected attach".into())),
        (Message::Lease(l), Some(inner)) => {
            // A pulled WRITE: the active side lends its source.
            if !inner.cma || conn.peer_pid.get().is_none() {
                return Err(ConnError::Violation(
                    "a lease to a worker that did not agree to attach".into(),
                ));
            }
            let job = match lock(&conn.passive).get_mut(&l.req) {
                Some(r) => {
                    take_lease(&mut r.cma, Cma::AwaitLease, &l, &r.exposure.region)?;
                    Some((r.exposure.region.clone(), r.exposure.shared.clone()))
                }
                None => None,
            };
            conn.pull_or_release(l, job);
            Ok(())
        }
        (Message::Lease(l), None) => {
            // A pulled READ: the passive side lends its source.
            if conn.peer_pid.get().is_none() || l.req >= conn.next_req.load(Ordering::Relaxed) {
                return Err(ConnError::Violation(
                    "a lease this worker did not ask for".into(),
                ));
            }
            let job = match lock(&conn.active).get_mut(&l.req) {
                Some(r) => {
                    take_lease(&mut r.cma, Cma::Requested, &l, &r.region)?;
                    r.shared.set_transport(TransportKind::Cma);
                    Some((r.region.clone(), r.shared.clone()))
                }
                None => None,
            };
            conn.pull_or_release(l, job);
            Ok(())
        }
        (Message::Release { req }, _) => {
            conn.give_back(req);
            Ok(())
        }
        (Message::Open(o), Some(inner)) => on_open(conn, inner, o),
        (Message::Open(_), None) => {
            Err(ConnError::Violation("open sent to the active side".into()))
        }
        (Message::Data(d), Some(_)) => {
            let region = {
                let mut passive = lock(&conn.passive);
                match passive.get_mut(&d.req) {
                    Some(PassiveReq {
                        cursor: Some(c),
                        exposure,
                        ..
                    }) => {
                        c.accept(d.desc, d.offset, d.len)
                            .map_err(|e| ConnError::Violation(e.to_string()))?;
                        Some(exposure.region.clone())
                    }
                    Some(_) => {
                        return Err(ConnError::Violation(
                            "data sent for a READ or a leased WRITE".into(),
                        ))
                    }
                    None => None,
                }
            };
            rd.payload(d.len, region.as_deref().map(|r| (r, d.desc, d.offset)))
                .await
        }
        (Message::Data(d), None) => {
            let region = {
                let mut active = lock(&conn.active);
                match active.get_mut(&d.req) {
                    Some(r) if r.kind == OperationKind::Read && r.cma != Cma::Pulling => {
                        if r.cma == Cma::Requested {
                            // The passive side chose to stream instead of lending.
                            r.cma = Cma::No;
                            r.shared.set_transport(TransportKind::Tcp);
                        }
                        r.cursor
                            .accept(d.desc, d.offset, d.len)
                            .map_err(|e| ConnError::Violation(e.to_string()))?;
                        Some(r.region.clone())
                    }
                    Some(_) => {
                        return Err(ConnError::Violation(
                            "data sent for a WRITE or a leased READ".into(),
                        ))
                    }
                    None => None,
                }
            };
            rd.payload(d.len, region.as_deref().map(|r| (r, d.desc, d.offset)))
                .await
        }
        (Message::Finish { req }, Some(inner)) => {
            // A destination that copied from us has stopped.
            conn.give_back(req);
            let part = part_finished(conn, &mut lock(&conn.passive), req, |r| {
                (&mut r.part, r.cursor.as_ref(), &r.exposure.region)
            });
            if let Some(end) = part {
                return end.map_err(|detail| {
                    // Out of the table before the violation ends the
                    // operation: ending it takes the table again.
                    let r = lock(&conn.passive).remove(&req);
                    match r {
                        Some(r) => passive_violation(conn, inner, &r.exposure, detail),
                        None => ConnError::Violation(detail),
                    }
                });
            }
            let Some(r) = lock(&conn.passive).remove(&req) else {
                return Ok(());
            };
            match r.cma {
                Cma::Lent => {
                    // A leased READ: the remote has every byte. Commit,
                    // unless a cancel got here first (it tells the remote).
                    let e = &r.exposure;
                    if e.region.seal_if_open(|| e.shared.seal()) {
                        if inner
                            .host
                            .exposures
                            .finish(e, OperationStatus::Complete, None)
                        {
                            conn.send_soon(Message::Finish { req }.to_vec(), None, true);
                        } else {
                            conn.abort_detached(req, AbortReason::Cancelled, String::new());
                        }
                    }
                    return Ok(());
                }
                Cma::Pulling => {
                    // A pulled WRITE: the source commits what we copied.
                    if !r.exposure.shared.is_sealed() {
                        let detail = "finish before the copy ended".into();
                        return Err(passive_violation(conn, inner, &r.exposure, detail));
                    }
                    inner
                        .host
                        .exposures
                        .finish(&r.exposure, OperationStatus::Complete, None);
                    return Ok(());
                }
                Cma::AwaitLease => {
                    let detail = "finish before the lease".into();
                    return Err(passive_violation(conn, inner, &r.exposure, detail));
                }
                Cma::No | Cma::Requested => {}
            }
            // A write's Finish must follow all its data; a read's confirmation
            // must follow our own Finish (sent only once sealed).
            let premature = match &r.cursor {
                Some(c) => !c.is_done() || parts_missing(&r.part),
                None => !r.exposure.shared.is_sealed(),
            };
            if premature {
                let detail = "finish before all data".into();
                return Err(passive_violation(conn, inner, &r.exposure, detail));
            }
            // A write is complete only if every byte landed: if the owner
            // began to close the region (a cancel in progress), some may
            // have been dropped; the cancel ends it and tells the writer.
            if r.cursor.is_some() && !r.exposure.region.close_if_intact() {
                return Ok(());
            }
            let won = inner
                .host
                .exposures
                .finish(&r.exposure, OperationStatus::Complete, None);
            if r.cursor.is_some() {
                // A write: confirm that every byte landed.
                if won {
                    conn.send_detached(Message::Finish { req });
                } else {
                    conn.abort_detached(req, AbortReason::Cancelled, String::new());
                }
            }
            Ok(())
        }
        (Message::Finish { req }, None) => {
            // A destination that copied from us has stopped.
            conn.give_back(req);
            let part = part_finished(conn, &mut lock(&conn.active), req, |r| {
                let cursor = (r.kind == OperationKind::Read).then_some(&r.cursor);
                (&mut r.part, cursor, &r.region)
            });
            if let Some(end) = part {
                return end.map_err(|detail| {
                    let r = lock(&conn.active).remove(&req);
                    match r {
                        Some(r) => active_violation(conn, &r, detail),
                        None => ConnError::Violation(detail),
                    }
                });
            }
            let Some(r) = lock(&conn.active).remove(&req) else {
                return Ok(());
            };
            match r.cma {
                Cma::Lent => {
                    // A leased WRITE: the remote has every byte. Commit,
                    // unless a cancel got here first (it tells the remote).
                    if r.region.seal_if_open(|| r.shared.seal()) {
                        r.region.close();
                        r.shared.end(OperationStatus::Complete, None);
                        conn.send_soon(Message::Finish { req }.to_vec(), None, true);
                    }
                    return Ok(());
                }
                Cma::Pulling => {
                    // A leased READ: the source commits what we copied.
                    if !r.shared.is_sealed() {
                        let detail = "finish before the copy ended".into();
                        return Err(active_violation(conn, &r, detail));
                    }
                    r.region.close();
                    r.shared.end(OperationStatus::Complete, None);
                    return Ok(());
                }
                Cma::No | Cma::Requested | Cma::AwaitLease => {}
            }
            // A read is complete only if every byte landed: if a local
            // cancel began to close the region, some may have been dropped;
            // that cancel ends the read and tells the remote.
            let intact = r.region.close_if_intact();
            if r.kind == OperationKind::Read && !intact {
                return Ok(());
            }
            // A read's Finish must follow all its data; a write's confirmation
            // must follow our own Finish (sent only once sealed).
            let premature = match r.kind {
                OperationKind::Read => !r.cursor.is_done() || parts_missing(&r.part),
                OperationKind::Write => !r.shared.is_sealed(),
            };
            if premature {
                let detail = "finish before all data".into();
                return Err(active_violation(conn, &r, detail));
            }
            if let Some(p) = &r.part {
                // The other parts leave their tables before anyone wakes.
                p.stripe.abandon(None);
            }
            let won = r.shared.end(OperationStatus::Complete, None);
            if r.kind == OperationKind::Read {
                // Confirm receipt, unless a local cancel got there first.
                if won {
                    conn.send_detached(Message::Finish { req });
                } else {
                    conn.abort_detached(req, AbortReason::Cancelled, String::new());
                }
            }
            Ok(())
        }
        (Message::Abort(a), Some(inner)) => {
            // A destination that copied from us has stopped.
            conn.give_back(a.req);
            let removed = lock(&conn.passive).remove(&a.req);
            if let Some(r) = removed {
                if r.part.is_some() && ending_here(&r.exposure.region, &r.exposure.shared) {
                    return Ok(());
                }
                let err = remote_error(&a);
                let status = if matches!(err, Error::RemoteCancelled) {
                    OperationStatus::Cancelled
                } else {
                    OperationStatus::Errored
                };
                // Closes the region: our copy from the source stops first.
                inner.host.exposures.finish(&r.exposure, status, Some(err));
                if r.cma == Cma::Pulling {
                    conn.release(a.req);
                }
            }
            Ok(())
        }
        (Message::Abort(a), None) => {
            // A destination that copied from us has stopped.
            conn.give_back(a.req);
            let removed = lock(&conn.active).remove(&a.req);
            if let Some(r) = removed {
                if r.part.is_some() && ending_here(&r.region, &r.shared) {
                    return Ok(());
                }
                if a.reason == AbortReason::OperationEnded
                    && r.part.as_ref().is_some_and(|p| p.index != 0)
                {
                    // A further part arrived after the remote ended the
                    // operation: how it ended comes on part 0 (its `Abort`
                    // if part 0 was bound, else the refusal of part 0), so
                    // that a remote cancel reads as one on this side too.
                    return Ok(());
                }
                // Our copy from the source (if any) stops here.
                r.region.close();
                r.shared.fail(remote_error(&a));
                if r.cma == Cma::Pulling {
                    conn.release(a.req);
                }
            }
            Ok(())
        }
    }
}

/// The `Finish` of request `req` if it carries a part other than 0 of a
/// striped transfer (`None` otherwise: the caller handles it). At the
/// destination (`cursor` is the part's) it says every byte of the part was
/// sent: checked, then confirmed, unless a cancel is closing the region
/// (the cancel tells the remote). At the source it is that confirmation,
/// valid only once this side has sent the whole part. The
/// part is marked done and stays in the table until the operation ends; a
/// repeated `Finish` is ignored. `Err`: a premature `Finish` (the caller
/// ends the operation and the connection).
pub(super) fn part_finished<R>(
    conn: &Arc<Conn>,
    table: &mut HashMap<u64, R>,
    req: u64,
    view: impl FnOnce(&mut R) -> PartView<'_>,
) -> Option<Result<(), String>> {
    let r = table.get_mut(&req)?;
    let (part, cursor, region) = view(r);
    let p = part.as_mut().filter(|p| p.index != 0)?;
    if p.done {
        return Some(Ok(()));
    }
    match cursor {
        Some(c) if !c.is_done() => {
            return Some(Err(format!("finish before all data of part {}", p.index)))
        }
        Some(_) => {
            if region.is_open() {
                p.done = true;
                p.stripe.part_done();
                conn.send_soon(Message::Finish { req }.to_vec(), None, true);
            }
        }
        None if !p.sent => {
            return Some(Err(format!(
                "part {} confirmed before this side sent all of it",
                p.index
            )))
        }
        None => {
            p.done = true;
            p.stripe.part_done();
        }
    }
    Some(Ok(()))
}

/// What [`part_finished`] looks at in a table entry: its part, the part's
/// cursor (destination only), the region.
pub(super) type PartView<'a> = (&'a mut Option<Part>, Option<&'a Cursor>, &'a Region);

/// Ends a passive operation as ERRORED because the peer broke the protocol
/// (`detail` says how); the caller closes the connection with the result.
pub(super) fn passive_violation(
    conn: &Conn,
    inner: &Served,
    e: &Exposure,
    detail: String,
) -> ConnError {
    let err = Error::Protocol {
        peer: conn.peer.clone(),
        detail: detail.clone(),
    };
    inner
        .host
        .exposures
        .finish(e, OperationStatus::Errored, Some(err));
    ConnError::Violation(detail)
}

/// Ends an active operation as ERRORED because the peer broke the protocol
/// (`detail` says how); the caller closes the connection with the result.
pub(super) fn active_violation(conn: &Conn, r: &ActiveReq, detail: String) -> ConnError {
    r.region.close();
    r.shared.fail(Error::Protocol {
        peer: conn.peer.clone(),
        detail: detail.clone(),
    });
    ConnError::Violation(detail)
}

/// Whether this side has begun to end a striped operation (a cancel in
/// progress, another part failed): it closed the region and will settle the
/// outcome and tell the remote. The remote's answers on the other parts
/// (its `Abort`s, a refusal of a part whose `Open` arrived after the end)
/// must not settle it first, or a local cancel could end as an error. A
/// sealed operation is the remote's to settle.
pub(super) fn ending_here(region: &Region, shared: &OpShared) -> bool {
    !region.is_open() && !shared.is_sealed()
}

pub(super) fn remote_error(a: &Abort) -> Error {
    match a.reason {
        AbortReason::Cancelled => Error::RemoteCancelled,
        AbortReason::Unauthenticated => Error::Unauthenticated {
            peer: String::new(),
            detail: a.detail.clone(),
        },
        AbortReason::PartFailed => Error::ConnectionLost {
            peer: String::new(),
            cause: format!(
                "another stream of this striped transfer failed at the remote: {}",
                a.detail
            ),
        },
        reason => Error::Rejected {
            reason,
            detail: a.detail.clone(),
        },
    }
}

/// The passive side's part of setting up cross-memory attach (see
/// [`Attach`]).
pub(super) fn on_attach(conn: &Arc<Conn>, inner: &Arc<Served>, a: Attach) -> Result<(), ConnError> {
    let mut state = lock(&conn.attach);
    match (&*state, a.verdict) {
        (Attaching::Idle, Verdict::Unknown) => {
            // 1 -> 2: offer our cookie, or decline.
            let tuple = conn.tuple.get().copied();
            let usable = tuple.filter(|&(act, pas)| inner.cma && cma::is_local(pas, act));
            let answer = match usable {
                Some((act, pas)) => {
                    let np = host::random_bytes();
                    let cookie =
                        Box::new(cma::cookie(cma::Side::Passive, &a.cookie, &np, act, pas));
                    let at = cookie.as_ptr() as u64;
                    *state = Attaching::Offered(Some((a.cookie, np)));
                    *lock(&conn.cookie) = Some(cookie);
                    Attach {
                        pid: cma::pid(),
                        addr: at,
                        cookie: np,
                        verdict: Verdict::Unknown,
                    }
                }
                None => {
                    *state = Attaching::Offered(None);
                    Attach {
                        pid: 0,
                        addr: 0,
                        cookie: [0; 16],
                        verdict: Verdict::Unknown,
                    }
                }
            };
            drop(state);
            conn.send_detached(Message::Attach(answer));
            Ok(())
        }
        (Attaching::Offered(nonces), v) if v != Verdict::Unknown => {
            // 3 -> 4: their verdict on us; probe them; answer ours.
            let nonces = *nonces;
            *state = Attaching::Done;
            drop(state);
            conn.peer_pulls
                .store(nonces.is_some() && v == Verdict::CanPull, Ordering::Release);
            let conn = conn.clone();
            let tuple = conn.tuple.get().copied();
            tokio::spawn(async move {
                let verified = match (nonces, tuple) {
                    (Some((na, np)), Some((act, pas))) => {
                        // The active end of this connection is `act` -> `pas`.
                        verify_peer(a.pid, a.addr, act, pas, move || {
                            cma::cookie(cma::Side::Active, &na, &np, act, pas)
                        })
                        .await
                    }
                    _ => None,
                };
                let ok = verified.is_some();
                if let Some(p) = verified {
                    let _ = conn.peer_pid.set(p);
                }
                conn.send_detached(Message::Attach(Attach {
                    pid: 0,
                    addr: 0,
                    cookie: [0; 16],
                    verdict: if ok {
                        Verdict::CanPull
                    } else {
                        Verdict::Refused
                    },
                }));
            });
            Ok(())
        }
        _ => Err(ConnError::Violation("an attach frame out of turn".into())),
    }
}

pub(super) fn on_open(conn: &Arc<Conn>, inner: &Arc<Served>, o: Open) -> Result<(), ConnError> {
    if lock(&conn.passive).contains_key(&o.req) || lock(&conn.leases).contains_key(&o.req) {
        return Err(ConnError::Violation(format!(
            "request number {} in use",
            o.req
        )));
    }
    let mut joined = None;
    let mut bind =
        |bound: Option<&Arc<dyn PassiveLink>>| bind_request(conn, &o, bound, &mut joined);
    let opened = inner
        .host
        .exposures
        .open(&o, Some(&conn.peer), &mut bind)
        .map(|(e, _)| (e, joined));
    match opened {
        Err((reason, detail)) => {
            tracing::debug!(
                peer = conn.peer,
                op = o.op_id,
                ?reason,
                "refused an operation: {detail}"
            );
            conn.abort_detached(o.req, reason, detail);
            Ok(())
        }
        Ok((exposure, Some(stripe))) => {
            conn.prove();
            // A part of a striped transfer: TCP only.
            exposure.shared.set_transport(TransportKind::Tcp);
            let total = o.sizes.iter().fold(0u64, |a, s| a.saturating_add(*s));
            let (start, end) = part_range(total, o.part, o.parts);
            let cursor = (o.kind == OperationKind::Write)
                .then(|| Cursor::range(o.sizes.clone(), start, end));
            lock(&conn.passive).insert(
                o.req,
                PassiveReq {
                    exposure: exposure.clone(),
                    cursor,
                    cma: Cma::No,
                    part: Part::new(stripe.clone(), o.part),
                },
            );
            // The owner may have withdrawn it between the check and the insert.
            if exposure.shared.status().is_terminal() {
                conn.forget_passive(o.req);
                return Ok(());
            }
            if o.kind == OperationKind::Read {
                let last = if o.part == 0 {
                    Last::SealAfter(stripe)
                } else {
                    Last::Part
                };
                conn.spawn_part(
                    o.req,
                    exposure.region.clone(),
                    Cursor::range(o.sizes, start, end),
                    Vec::new(),
                    None,
                    exposure.shared.clone(),
                    last,
                );
            }
            Ok(())
        }
        Ok((exposure, None)) => {
            conn.prove();
            let cma = match (o.kind, o.pull) {
                (_, false) => Cma::No,
                (OperationKind::Read, true)
                    if inner.cma
                        && conn.peer_pulls.load(Ordering::Acquire)
                        && o.sizes.len() <= MAX_LEASE_SEGMENTS =>
                {
                    Cma::Lent
                }
                // Fall back to streaming the bytes.
                (OperationKind::Read, true) => Cma::No,
                (OperationKind::Write, true) => Cma::AwaitLease,
            };
            exposure.shared.set_transport(if cma == Cma::No {
                TransportKind::Tcp
            } else {
                TransportKind::Cma
            });
            let cursor =
                (o.kind == OperationKind::Write && !o.pull).then(|| Cursor::new(o.sizes.clone()));
            let region = exposure.region.clone();
            let shared = exposure.shared.clone();
            lock(&conn.passive).insert(
                o.req,
                PassiveReq {
                    exposure: exposure.clone(),
                    cursor,
                    cma,
                    part: None,
                },
            );
            // Lend before looking at the status: an owner that drops the
            // operation from now on finds the memory lent and keeps it alive.
            if cma == Cma::Lent {
                conn.lend(o.req, &region);
            }
            // The owner may have withdrawn it between the check and the insert.
            if exposure.shared.status().is_terminal() {
                conn.forget_passive(o.req);
                conn.give_back(o.req);
                return Ok(());
            }
            match (o.kind, cma) {
                (OperationKind::Read, Cma::Lent) => {
                    let lease = Message::Lease(Lease {
                        req: o.req,
                        segments: region.segments(),
                    });
                    conn.send_soon(lease.to_vec(), None, true);
                }
                (OperationKind::Read, _) => {
                    conn.spawn_stream(o.req, region, o.sizes, Vec::new(), None, shared)
                }
                (OperationKind::Write, _) => {}
            }
            Ok(())
        }
    }
}
