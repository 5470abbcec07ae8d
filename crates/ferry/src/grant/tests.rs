//! The grant runtime within one process (the owner and the holder are the
//! same process here; `tests/grant.rs` crosses a process boundary).

use std::time::Duration;

use super::*;
use crate::{Error, Pool};

/// A grant with no TCP lane (the cma lane's tests).
fn create(o: &str, h: &str, pool: &Pool, opts: GrantOptions) -> crate::Result<Grant> {
    super::owner::create(o, h, pool, opts, None)
}

async fn open(w: &str, h: &str, meta: &GrantMetadata) -> crate::Result<RemoteGrant> {
    super::holder::open(w, h, meta, GrantLane::Any, None).await
}

fn pattern(pool: &Pool, id: u32, byte: u8) {
    pool.with_block_mut(id, |b| b.fill(byte)).unwrap();
}

fn all(pool: &Pool, id: u32, byte: u8) -> bool {
    pool.with_block(id, |b| b.iter().all(|&x| x == byte))
        .unwrap()
}

#[tokio::test]
async fn read_write_retire_revoke_in_one_process() {
    let owner = Pool::allocate(8 * 4096, 4096).unwrap();
    let mine = Pool::allocate(4 * 4096, 4096).unwrap();
    pattern(&owner, 5, 0x55);
    let g = create(
        "owner",
        "host",
        &owner,
        GrantOptions::read_write().holder("holder"),
    )
    .unwrap();
    let json = g.metadata().to_json().unwrap();
    assert!(json.len() <= 1024);
    let meta = GrantMetadata::from_json(&json).unwrap();
    assert!(matches!(
        open("stranger", "host", &meta).await,
        Err(Error::Grant(GrantError::NotYours { .. }))
    ));
    assert!(matches!(
        open("holder", "elsewhere", &meta).await,
        Err(Error::Grant(GrantError::NoLane(_)))
    ));
    let h = open("holder", "host", &meta).await.unwrap();
    assert!(matches!(
        open("holder", "host", &meta).await,
        Err(Error::Grant(GrantError::Claimed { .. }))
    ));
    // READ block 5 into local block 1.
    let r5 = h.block_refs(&[5]).unwrap();
    h.read_blocks(&r5, &mine, &[1]).await.unwrap();
    assert!(all(&mine, 1, 0x55));
    // WRITE local block 2 into block 6 and 7, with notifications.
    pattern(&mine, 2, 0x66);
    pattern(&mine, 3, 0x77);
    let r = h.block_refs(&[6, 7]).unwrap();
    h.write_blocks(&mine, &[2, 3], &r, Some(b"kv ready"))
        .await
        .unwrap();
    assert!(all(&owner, 6, 0x66) && all(&owner, 7, 0x77));
    let n = tokio::time::timeout(Duration::from_secs(5), g.next_notification())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        n,
        Notification {
            seq: 1,
            kind: NotificationKind::Write,
            first_block: 6,
            block_count: 2,
            payload: b"kv ready".to_vec(),
            holder: Some("holder".into()),
        }
    );
    // A retired generation is refused, and nothing lands.
    let fresh = g.retire(&[6]).await.unwrap();
    assert_eq!(fresh, vec![BlockRef::new(6, 1)]);
    pattern(&mine, 2, 0x99);
    let e = h
        .write_blocks(&mine, &[2], &r[..1], None)
        .await
        .unwrap_err();
    assert!(matches!(
        e,
        Error::Grant(GrantError::StaleGeneration {
            index: 6,
            named: 0,
            current: 1
        })
    ));
    assert!(all(&owner, 6, 0x66));
    h.write_blocks(&mine, &[2], &fresh, None).await.unwrap();
    assert!(all(&owner, 6, 0x99));
    // Busy local blocks are the pool's error.
    let held = mine.blocks(&[0]).unwrap();
    assert!(matches!(
        h.read_blocks(&r5, &mine, &[0]).await,
        Err(Error::Pool(crate::PoolError::Busy { id: 0 }))
    ));
    drop(held);
    // Revoked: every later operation is refused.
    g.revoke().await.unwrap();
    assert!(h.is_revoked() && g.is_revoked());
    assert!(matches!(
        h.read_blocks(&r5, &mine, &[0]).await,
        Err(Error::Grant(GrantError::Revoked))
    ));
    g.revoke().await.unwrap();
}

#[tokio::test]
async fn options_are_checked() {
    let pool = Pool::allocate(4096, 1024).unwrap();
    assert!(matches!(
        create("o", "h", &pool, GrantOptions::read()),
        Err(Error::Grant(GrantError::Unbound))
    ));
    let g = create("o", "h", &pool, GrantOptions::read().bearer()).unwrap();
    assert_eq!(g.metadata().holder, None);
    let ro = Pool::from_vec(vec![0; 4096], 1024).unwrap();
    assert!(create("o", "h", &ro, GrantOptions::write().bearer()).is_ok());
    let short = create(
        "o",
        "h",
        &pool,
        GrantOptions::read()
            .bearer()
            .expires_after(Duration::from_millis(1)),
    )
    .unwrap();
    tokio::time::sleep(Duration::from_millis(5)).await;
    assert!(matches!(
        open("x", "h", short.metadata()).await,
        Err(Error::Grant(GrantError::Expired { .. }))
    ));
}

#[tokio::test]
async fn a_tcp_lane_that_does_not_fit_1_kib_is_shortened() {
    let pool = Pool::allocate(4 * 4096, 4096).unwrap();
    let addrs: Vec<std::net::SocketAddr> = (0..8)
        .map(|i| {
            format!("[fd00:1234:5678:9abc:def0:1234:5678:{i}]:65000")
                .parse()
                .unwrap()
        })
        .collect();
    let long = "w".repeat(256);
    let g = super::owner::create(
        &long,
        "0b1e5a9c-6a57-4e9b-9c3e-2f1f1a0c7e11",
        &pool,
        GrantOptions::read().holder("h".repeat(200)),
        Some(addrs.clone()),
    )
    .unwrap();
    let json = g.metadata().to_json().unwrap();
    assert!(json.len() <= 1024);
    let n = g.metadata().tcp.as_ref().map_or(0, |t| t.addresses.len());
    assert!(n < addrs.len(), "{n} addresses in {} bytes", json.len());
    // Short names keep every address.
    let g =
        super::owner::create("o", "h", &pool, GrantOptions::read().bearer(), Some(addrs)).unwrap();
    assert_eq!(g.metadata().tcp.as_ref().unwrap().addresses.len(), 8);
}

/// What a write's liveness check rests on (`holder::Liveness`): a thread's
/// pidfd says alive while it runs, and exited once it has.
#[cfg(target_os = "linux")]
#[test]
fn a_thread_pidfd_sees_its_thread_exit() {
    let (tx, rx) = std::sync::mpsc::channel();
    let (stop, stopped) = std::sync::mpsc::channel::<()>();
    let t = std::thread::spawn(move || {
        tx.send(sys::gettid()).unwrap();
        let _ = stopped.recv();
    });
    let tid = rx.recv().unwrap();
    let Ok(fd) = sys::thread_pidfd(tid) else {
        // No PIDFD_THREAD (Linux before 6.9): writes read the image instead.
        return;
    };
    assert!(sys::thread_alive(&fd).unwrap());
    drop(stop);
    t.join().unwrap();
    // A join returns when the thread let go of its memory, a moment before
    // the kernel marks it exited.
    let start = std::time::Instant::now();
    while sys::thread_alive(&fd).unwrap() {
        assert!(start.elapsed() < Duration::from_secs(5), "never seen gone");
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(sys::thread_pidfd(0).is_err());
}
