//! Liveness of the peer of a connection that carries work: when to send a
//! heartbeat, and when to take the peer for stopped or unreachable. No
//! clock of its own: the driver passes the time, arms one timer at
//! [`Liveness::poll_timeout`] and calls [`Liveness::on_timeout`] when it
//! fires.
//!
//! The rules:
//!
//! - Only while the connection carries an operation in progress (either
//!   role: [`Liveness::set_busy`]) is there a timer at all. An idle
//!   connection has none: no heartbeat, no wake-up, no cost.
//! - While busy, a side that has sent nothing for [`Liveness::interval`]
//!   (a quarter of the bound) sends a [`Message::Ping`]; a side that
//!   receives one answers [`Message::Pong`] at once, busy or not (the
//!   session does: [`Session::handle_frame`]).
//! - Any byte received counts ([`Liveness::on_frame`]): a frame, a
//!   heartbeat, payload bytes. A side that has received nothing at all for
//!   the bound while busy declares the peer unresponsive
//!   ([`Tick::Unresponsive`]): the driver then ends every operation of the
//!   connection ([`Session::unresponsive`] tells the peer why, where it can
//!   still hear) and closes it.
//! - Silence is measured from when the connection became busy, never
//!   from before: an operation that starts on a connection idle for an
//!   hour is not declared dead at once.
//! - A timer that fires long after it was due (more than half the bound
//!   late) means that this process itself did not run (it was stopped, or
//!   starved): the bytes the peer sent meanwhile may be waiting unread.
//!   The silence then counts from one interval before the bound, so that
//!   they are read first; the peer is declared unresponsive only if
//!   nothing arrives in that interval either.
//!
//! [`Message::Ping`]: crate::wire::Message::Ping
//! [`Message::Pong`]: crate::wire::Message::Pong
//! [`Session::handle_frame`]: super::Session::handle_frame
//! [`Session::unresponsive`]: super::Session::unresponsive

use std::time::{Duration, Instant};

/// The default bound: a peer with work in progress that sends nothing at
/// all for this long is taken for stopped or unreachable.
pub const DEFAULT_BOUND: Duration = Duration::from_millis(1500);

/// The smallest bound accepted (a smaller one would mistake scheduling
/// delays for a dead peer).
pub const MIN_BOUND: Duration = Duration::from_millis(20);

/// The largest bound taken (a larger one is lowered to it): a day, so that
/// no arithmetic on instants can overflow, whatever a user sets.
pub const MAX_BOUND: Duration = Duration::from_secs(24 * 3600);

/// What a timer that fired asks of the driver.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tick {
    /// Nothing to do now (arm the timer again at
    /// [`Liveness::poll_timeout`]).
    Wait,
    /// Send a [`Message::Ping`](crate::wire::Message::Ping) (then arm
    /// the timer again).
    Ping,
    /// Nothing arrived from the peer for `after` (at least the bound)
    /// while the connection carried work: end its operations and close it.
    Unresponsive {
        /// How long the peer was silent.
        after: Duration,
    },
}

/// The liveness state of one connection (see the module documentation).
#[derive(Debug, Clone)]
pub struct Liveness {
    /// `None`: off (no heartbeat, no detection).
    bound: Option<Duration>,
    /// The connection carries an operation in progress.
    busy: bool,
    /// When something last arrived from the peer (or the connection
    /// became busy, if later).
    heard: Instant,
    /// When this side last sent something (or became busy).
    sent: Instant,
    /// When the timer was last due: a firing much later than that means
    /// this process did not run meanwhile.
    due: Option<Instant>,
    /// The peer was declared unresponsive: nothing more to do.
    spent: bool,
}

impl Liveness {
    /// A connection's liveness with `bound` (`None` or zero: off), at
    /// `now`, idle.
    pub fn new(bound: Option<Duration>, now: Instant) -> Self {
        Liveness {
            bound: bound
                .filter(|b| !b.is_zero())
                .map(|b| b.clamp(MIN_BOUND, MAX_BOUND)),
            busy: false,
            heard: now,
            sent: now,
            due: None,
            spent: false,
        }
    }

    /// The bound, if liveness is on.
    pub fn bound(&self) -> Option<Duration> {
        self.bound
    }

    /// How long this side may stay silent while busy before it sends a
    /// heartbeat: a quarter of the bound, so that three may be lost or
    /// late before the peer's bound runs out.
    pub fn interval(&self) -> Option<Duration> {
        self.bound.map(|b| b / 4)
    }

    /// Whether the connection carries an operation in progress now. When
    /// it becomes busy, silence counts from `now`.
    pub fn set_busy(&mut self, busy: bool, now: Instant) {
        if busy && !self.busy {
            self.heard = self.heard.max(now);
            self.sent = self.sent.max(now);
            self.due = None;
        }
        self.busy = busy;
    }

    /// Whether the connection carries an operation in progress.
    pub fn is_busy(&self) -> bool {
        self.busy
    }

    /// Something arrived from the peer at `at` (a frame, payload bytes).
    pub fn on_frame(&mut self, at: Instant) {
        self.heard = self.heard.max(at);
    }

    /// This side sent something at `at`.
    pub fn on_sent(&mut self, at: Instant) {
        self.sent = self.sent.max(at);
    }

    /// When the driver's timer must fire next: `None` when liveness is off,
    /// the connection is idle, or the peer was already declared
    /// unresponsive (no timer at all).
    pub fn poll_timeout(&self) -> Option<Instant> {
        let bound = self.bound?;
        if !self.busy || self.spent {
            return None;
        }
        let interval = bound / 4;
        Some((self.sent + interval).min(self.heard + bound))
    }

    /// The timer fired at `now`: what to do (see [`Tick`]). A
    /// [`Tick::Ping`] counts as sent at `now`.
    pub fn on_timeout(&mut self, now: Instant) -> Tick {
        let Some(bound) = self.bound else {
            return Tick::Wait;
        };
        if !self.busy || self.spent {
            return Tick::Wait;
        }
        let interval = bound / 4;
        if let Some(due) = self.due.or_else(|| self.poll_timeout()) {
            if now.saturating_duration_since(due) > bound / 2 {
                // This process did not run for a while: read what the peer
                // sent meanwhile before judging it.
                if let Some(from) = now.checked_sub(bound - interval) {
                    self.heard = self.heard.max(from);
                }
            }
        }
        let silent = now.saturating_duration_since(self.heard);
        if silent >= bound {
            self.spent = true;
            self.due = None;
            return Tick::Unresponsive { after: silent };
        }
        let tick = if now.saturating_duration_since(self.sent) >= interval {
            self.sent = now;
            Tick::Ping
        } else {
            Tick::Wait
        };
        self.due = self.poll_timeout();
        tick
    }

    /// The timer was armed for `at` (the driver calls it when it arms the
    /// timer, so that a late firing can be told from a timely one).
    pub fn armed(&mut self, at: Instant) {
        self.due = Some(at);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const B: Duration = Duration::from_millis(1000);

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// Runs the timer the way a driver does (sending the pings it asks
    /// for) until the peer is declared or `until` passes; returns the tick
    /// and when it happened.
    fn run(l: &mut Liveness, until: Instant) -> Option<(Tick, Instant)> {
        while let Some(at) = l.poll_timeout() {
            if at > until {
                return None;
            }
            l.armed(at);
            match l.on_timeout(at) {
                Tick::Wait | Tick::Ping => {}
                t => return Some((t, at)),
            }
        }
        None
    }

    #[test]
    fn an_idle_connection_has_no_timer() {
        let t0 = Instant::now();
        let mut l = Liveness::new(Some(B), t0);
        assert_eq!(l.poll_timeout(), None);
        assert_eq!(l.on_timeout(t0 + ms(5000)), Tick::Wait);
        l.set_busy(true, t0 + ms(10));
        assert!(l.poll_timeout().is_some());
        l.set_busy(false, t0 + ms(20));
        assert_eq!(l.poll_timeout(), None);
    }

    #[test]
    fn off_means_no_timer_even_when_busy() {
        let t0 = Instant::now();
        for bound in [None, Some(Duration::ZERO)] {
            let mut l = Liveness::new(bound, t0);
            l.set_busy(true, t0);
            assert_eq!(l.poll_timeout(), None);
            assert_eq!(l.on_timeout(t0 + ms(60_000)), Tick::Wait);
        }
    }

    #[test]
    fn a_busy_side_pings_each_interval_and_a_silent_peer_is_declared_at_the_bound() {
        let t0 = Instant::now();
        let mut l = Liveness::new(Some(B), t0);
        // Idle for a long time before: silence counts from busy.
        let busy = t0 + ms(3_600_000);
        l.set_busy(true, busy);
        let mut pings = Vec::new();
        loop {
            let at = l.poll_timeout().unwrap();
            l.armed(at);
            match l.on_timeout(at) {
                Tick::Ping => pings.push(at - busy),
                Tick::Wait => {}
                Tick::Unresponsive { after } => {
                    assert_eq!(after, B);
                    assert_eq!(at - busy, B);
                    break;
                }
            }
        }
        assert_eq!(pings, vec![ms(250), ms(500), ms(750)]);
        assert_eq!(l.poll_timeout(), None, "declared once, then no timer");
    }

    #[test]
    fn anything_heard_keeps_the_peer_alive() {
        let t0 = Instant::now();
        let mut l = Liveness::new(Some(B), t0);
        l.set_busy(true, t0);
        // The peer answers each ping 10 ms later.
        let mut now = t0;
        for _ in 0..100 {
            let at = l.poll_timeout().unwrap();
            l.armed(at);
            let t = l.on_timeout(at);
            assert!(matches!(t, Tick::Wait | Tick::Ping), "{t:?}");
            if t == Tick::Ping {
                l.on_frame(at + ms(10));
            }
            now = at;
        }
        assert!(now - t0 >= ms(10_000));
        // Then it stops answering: declared one bound after the last
        // answer.
        let last = l.heard;
        let (t, at) = run(&mut l, now + ms(10_000)).unwrap();
        assert_eq!(t, Tick::Unresponsive { after: B });
        assert_eq!(at - last, B);
    }

    #[test]
    fn sending_delays_the_ping() {
        let t0 = Instant::now();
        let mut l = Liveness::new(Some(B), t0);
        l.set_busy(true, t0);
        l.on_sent(t0 + ms(200));
        assert_eq!(l.poll_timeout(), Some(t0 + ms(450)));
    }

    #[test]
    fn a_late_firing_reads_first_then_declares() {
        let t0 = Instant::now();
        let mut l = Liveness::new(Some(B), t0);
        l.set_busy(true, t0);
        let at = l.poll_timeout().unwrap();
        l.armed(at);
        // This process was stopped for 30 s: the timer fires late.
        let woke = at + ms(30_000);
        assert_eq!(l.on_timeout(woke), Tick::Ping);
        // What the peer sent meanwhile is read within the interval: alive.
        l.on_frame(woke + ms(1));
        let (t, _) = run(&mut l, woke + ms(900)).unwrap_or((Tick::Wait, woke));
        assert_eq!(t, Tick::Wait);
        // Nothing arrives: declared one interval after waking.
        let mut l2 = Liveness::new(Some(B), t0);
        l2.set_busy(true, t0);
        let at = l2.poll_timeout().unwrap();
        l2.armed(at);
        assert_eq!(l2.on_timeout(woke), Tick::Ping);
        let (t, when) = run(&mut l2, woke + ms(10_000)).unwrap();
        assert!(matches!(t, Tick::Unresponsive { .. }));
        assert_eq!(when - woke, ms(250));
    }

    #[test]
    fn a_timely_firing_is_not_taken_for_a_stop() {
        let t0 = Instant::now();
        let mut l = Liveness::new(Some(B), t0);
        l.set_busy(true, t0);
        // Fired 400 ms late (a loaded machine), less than half the bound:
        // judged as is.
        l.armed(t0 + ms(250));
        assert_eq!(l.on_timeout(t0 + ms(650)), Tick::Ping);
        l.armed(t0 + ms(900));
        assert_eq!(
            l.on_timeout(t0 + ms(1300)),
            Tick::Unresponsive { after: ms(1300) }
        );
    }

    #[test]
    fn a_tiny_bound_is_raised_and_a_huge_one_lowered() {
        let t0 = Instant::now();
        let l = Liveness::new(Some(ms(1)), t0);
        assert_eq!(l.bound(), Some(MIN_BOUND));
        let mut l = Liveness::new(Some(Duration::MAX), t0);
        assert_eq!(l.bound(), Some(MAX_BOUND));
        l.set_busy(true, t0);
        let at = l.poll_timeout().unwrap();
        l.armed(at);
        assert_eq!(l.on_timeout(at + MAX_BOUND), Tick::Ping);
    }
}
