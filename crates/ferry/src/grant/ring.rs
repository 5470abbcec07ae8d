//! The notification ring on a grant's control page: the holder pushes one
//! entry after each write that asked for a notification, inside the fence;
//! the owner takes them, in order, in batches, from the task that waits
//! for them (`owner::Notes`); while there are none, the owner's
//! notification thread parks on a futex on the ring's tail (no CPU while
//! idle) and wakes that task at the next push.
//!
//! One producer (the holder's process, which serialises its own pushes)
//! and one consumer (the owner, under its lock). An entry is 36 words: sequence;
//! what (1 read, 2 write, 3 a bare message) and payload length; first block and block count;
//! 32 words of payload.

use std::sync::atomic::Ordering::{Acquire, Relaxed, Release, SeqCst};
use std::time::{Duration, Instant};

use ferry_proto::grant::{GrantError, MAX_NOTIFICATION};

use super::control::{ControlPage, LIVE};
use super::sys;
use super::{Notification, NotificationKind};

const PAYLOAD_WORDS: usize = MAX_NOTIFICATION / 8;

/// Pushes one notification; waits while the ring is full (sleeping in
/// short slices), at most `patience`, then [`GrantError::NotificationsFull`].
/// The caller holds its process's producer lock.
pub(super) fn push(
    page: &ControlPage,
    n: &Notification,
    patience: Duration,
) -> Result<(), GrantError> {
    let cap = page.ring_cap();
    let tail = page.ring_tail().load(Relaxed);
    let start = Instant::now();
    let mut spins = 0u32;
    while tail.wrapping_sub(page.ring_head().load(Acquire)) >= cap {
        if page.state().load(SeqCst) != LIVE {
            return Err(GrantError::Revoked);
        }
        let waited = start.elapsed();
        if waited >= patience {
            return Err(GrantError::NotificationsFull {
                waited_ms: waited.as_millis() as u64,
            });
        }
        spins += 1;
        if spins < 64 {
            std::thread::yield_now();
        } else {
            std::thread::sleep(Duration::from_micros(200));
        }
    }
    let kind = match n.kind {
        NotificationKind::Read => 1u64,
        NotificationKind::Write => 2u64,
        NotificationKind::Message => 3u64,
    };
    let len = n.payload.len().min(MAX_NOTIFICATION);
    page.entry_word(tail, 0).store(n.seq, Relaxed);
    page.entry_word(tail, 1)
        .store(kind | (len as u64) << 32, Relaxed);
    page.entry_word(tail, 2).store(
        u64::from(n.first_block) | u64::from(n.block_count) << 32,
        Relaxed,
    );
    for (i, chunk) in n.payload[..len].chunks(8).enumerate() {
        let mut w = [0u8; 8];
        w[..chunk.len()].copy_from_slice(chunk);
        page.entry_word(tail, 3 + i)
            .store(u64::from_le_bytes(w), Relaxed);
    }
    page.ring_tail().store(tail.wrapping_add(1), SeqCst);
    if page.owner_parked().load(SeqCst) != 0 {
        sys::futex_wake(page.ring_tail());
    }
    Ok(())
}

/// What the consumer found.
pub(super) enum Taken {
    /// The next notification.
    One(Notification),
    /// An entry that does not decode (a hostile holder): skipped.
    Garbage,
    /// Nothing queued.
    Empty,
}

/// Takes the next notification, if any. The owner's thread only.
pub(super) fn take(page: &ControlPage) -> Taken {
    let head = page.ring_head().load(Relaxed);
    let tail = page.ring_tail().load(Acquire);
    let queued = tail.wrapping_sub(head);
    if queued == 0 {
        return Taken::Empty;
    }
    if queued > page.ring_cap() {
        // Only a holder that scribbled on the page gets here: drop what it
        // claims is queued.
        page.ring_head().store(tail, Release);
        return Taken::Garbage;
    }
    let seq = page.entry_word(head, 0).load(Relaxed);
    let w1 = page.entry_word(head, 1).load(Relaxed);
    let w2 = page.entry_word(head, 2).load(Relaxed);
    let len = (w1 >> 32) as usize;
    let kind = match w1 as u32 {
        1 => Some(NotificationKind::Read),
        2 => Some(NotificationKind::Write),
        3 => Some(NotificationKind::Message),
        _ => None,
    };
    let mut payload = Vec::with_capacity(len.min(MAX_NOTIFICATION));
    if len <= MAX_NOTIFICATION {
        for i in 0..len.div_ceil(8).min(PAYLOAD_WORDS) {
            let w = page.entry_word(head, 3 + i).load(Relaxed).to_le_bytes();
            let take = (len - 8 * i).min(8);
            payload.extend_from_slice(&w[..take]);
        }
    }
    page.ring_head().store(head.wrapping_add(1), Release);
    match kind {
        Some(kind) if len <= MAX_NOTIFICATION => Taken::One(Notification {
            seq,
            kind,
            first_block: w2 as u32,
            block_count: (w2 >> 32) as u32,
            payload,
            holder: None,
        }),
        _ => Taken::Garbage,
    }
}

/// Waits for an entry: spins for `spin`, then parks on the tail (until a
/// push wakes it, or `park` passes). Returns at once if one is queued.
pub(super) fn wait(page: &ControlPage, spin: Duration, park: Duration) {
    let head = page.ring_head().load(Relaxed);
    if !spin.is_zero() {
        let until = Instant::now() + spin;
        while Instant::now() < until {
            if page.ring_tail().load(Acquire) != head {
                return;
            }
            std::hint::spin_loop();
        }
    }
    page.owner_parked().store(1, SeqCst);
    if page.ring_tail().load(SeqCst) == head {
        sys::futex_wait(page.ring_tail(), head, Some(park));
    }
    page.owner_parked().store(0, SeqCst);
}

#[cfg(test)]
mod tests {
    use ferry_proto::grant::{GrantId, Rights};

    use super::super::control::{Header, REVOKED};
    use super::*;

    fn page() -> ControlPage {
        ControlPage::create(&Header {
            block_count: 2,
            cookie: [1; 16],
            token_hash: [2; 32],
            grant: GrantId(1),
            base: 0x1000,
            block_size: 64,
            expires_at_ms: 0,
            rights: Rights::READ_WRITE,
        })
        .unwrap()
    }

    fn note(seq: u64, payload: &[u8]) -> Notification {
        Notification {
            seq,
            kind: NotificationKind::Write,
            first_block: seq as u32,
            block_count: 1,
            payload: payload.to_vec(),
            holder: None,
        }
    }

    #[test]
    fn notifications_come_out_in_order_and_a_full_ring_is_an_error() {
        let page = page();
        let cap = page.ring_cap();
        for seq in 1..=u64::from(cap) {
            push(
                &page,
                &note(seq, &[seq as u8; 200][..(seq as usize % 200)]),
                Duration::ZERO,
            )
            .unwrap();
        }
        // Full, and nobody takes: refused after the patience, typed.
        let e = push(&page, &note(999, b"x"), Duration::from_millis(20)).unwrap_err();
        assert!(matches!(e, GrantError::NotificationsFull { .. }), "{e}");
        // Full, and the grant is revoked meanwhile: Revoked at once.
        page.state().store(REVOKED, SeqCst);
        assert_eq!(
            push(&page, &note(999, b"x"), Duration::from_secs(10)).err(),
            Some(GrantError::Revoked)
        );
        for seq in 1..=u64::from(cap) {
            match take(&page) {
                Taken::One(n) => {
                    assert_eq!(n, note(seq, &[seq as u8; 200][..(seq as usize % 200)]))
                }
                _ => panic!("entry {seq}"),
            }
        }
        assert!(matches!(take(&page), Taken::Empty));
        // A full payload survives whole.
        page.state().store(0, SeqCst);
        let big: Vec<u8> = (0..MAX_NOTIFICATION).map(|i| i as u8).collect();
        push(&page, &note(7, &big), Duration::ZERO).unwrap();
        match take(&page) {
            Taken::One(n) => assert_eq!(n.payload, big),
            _ => panic!("the full payload"),
        }
    }

    #[test]
    fn entries_a_holder_scribbled_are_dropped() {
        let page = page();
        push(&page, &note(1, b"ok"), Duration::ZERO).unwrap();
        // An impossible kind and length.
        let head = page.ring_head().load(SeqCst);
        page.entry_word(head, 1).store(9 | 5000 << 32, SeqCst);
        assert!(matches!(take(&page), Taken::Garbage));
        // A tail far past the head: resynchronised, not read out of bounds.
        page.ring_tail().fetch_add(10_000, SeqCst);
        assert!(matches!(take(&page), Taken::Garbage));
        assert!(matches!(take(&page), Taken::Empty));
        // And it goes on working.
        push(&page, &note(2, b"again"), Duration::ZERO).unwrap();
        assert!(matches!(take(&page), Taken::One(n) if n.payload == b"again"));
    }

    #[test]
    fn a_parked_consumer_returns_when_an_entry_comes() {
        let page = std::sync::Arc::new(page());
        let p = page.clone();
        let t = std::thread::spawn(move || {
            let start = Instant::now();
            wait(&p, Duration::ZERO, Duration::from_secs(10));
            start.elapsed()
        });
        std::thread::sleep(Duration::from_millis(30));
        push(&page, &note(1, b"wake"), Duration::ZERO).unwrap();
        let waited = t.join().unwrap();
        assert!(waited < Duration::from_secs(5), "{waited:?}");
    }
}
