//! Passive operations that expire: fenced and given back as on a cancel,
//! with the cause `Expired` on both sides.

use std::time::{Duration, Instant};

use ferry::{AbortReason, Connector, Descriptor, Error, OperationStatus, TransportKind};
use ferry_proto::wire::{self, Hello, Message, Open, PROTOCOL_VERSION};
use ferry_proto::OperationKind;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

async fn connector() -> Connector {
    Connector::builder()
        .listen("127.0.0.1:0".parse().unwrap())
        .transports(&[TransportKind::Tcp])
        .tcp_streams(1)
        .build()
        .await
        .expect("connector starts")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exposure_that_expires_is_fenced_and_a_later_read_is_refused() {
    let owner = connector().await;
    let remote = connector().await;
    let after = Duration::from_millis(200);
    let t = Instant::now();
    let r = owner
        .create_readable(vec![Descriptor::from_vec(vec![9u8; 4096])])
        .await
        .unwrap()
        .expires_after(after);
    let m = r.metadata().clone();
    let e = r.wait_for_completion().await.unwrap_err();
    let lapsed = t.elapsed();
    assert!(
        matches!(e, Error::Expired { after: a } if a == after),
        "{e:?}"
    );
    assert!(lapsed >= after && lapsed < after + Duration::from_secs(2));
    assert_eq!(r.status(), OperationStatus::Cancelled);
    assert!(r.is_released());
    assert_eq!(owner.exposed_count(), 0);
    // A READ that comes later is refused as expired; no byte moves.
    let refused = match remote
        .begin_read(&m, vec![Descriptor::from_vec(vec![0u8; 4096])])
        .await
    {
        Err(e) => (e, None),
        Ok(read) => (read.wait_for_completion().await.unwrap_err(), Some(read)),
    };
    assert!(
        matches!(
            refused.0,
            Error::Rejected {
                reason: AbortReason::Expired,
                ..
            }
        ),
        "{:?}",
        refused.0
    );
    if let Some(read) = refused.1 {
        let back = read.into_descriptors();
        assert!(back[0].as_slice().unwrap().iter().all(|&b| b == 0));
    }
    // The owner has its memory back, untouched.
    let back = r.into_descriptors();
    assert!(back[0].as_slice().unwrap().iter().all(|&b| b == 9));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operation_that_ends_first_never_expires() {
    let owner = connector().await;
    let remote = connector().await;
    let w = owner
        .create_writable(vec![Descriptor::from_vec(vec![0u8; 4096])])
        .await
        .unwrap()
        .expires_after(Duration::from_millis(300));
    let op = remote
        .begin_write(vec![Descriptor::from_vec(vec![5u8; 4096])], w.metadata())
        .await
        .unwrap();
    op.wait_for_completion().await.unwrap();
    w.wait_for_completion().await.unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(w.status(), OperationStatus::Complete);
    assert_eq!(w.descriptors().unwrap()[0].as_slice().unwrap()[0], 5);
}

/// A transfer in progress when the expiry lapses (a peer that opened a
/// READ and reads nothing) is aborted: the owner's operation ends
/// `Expired` at once, its memory fenced, and the peer is told `Expired`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transfer_in_progress_at_the_expiry_is_aborted_with_expired() {
    let owner = connector().await;
    let size = 64usize << 20;
    let after = Duration::from_millis(300);
    let r = owner
        .create_readable(vec![Descriptor::from_vec(vec![3u8; size])])
        .await
        .unwrap()
        .expires_after(after);
    let m = r.metadata().clone();
    let mut s = tokio::net::TcpStream::connect(owner.local_addr())
        .await
        .unwrap();
    let mut frames = Message::Hello(Hello {
        version: PROTOCOL_VERSION,
        worker_id: "slow".into(),
    })
    .to_vec();
    Message::Open(Open {
        req: 1,
        op_id: m.operation_id(),
        token: *m.token(),
        kind: OperationKind::Read,
        sizes: vec![size as u64].into(),
        pull: false,
        part: 0,
        parts: 1,
    })
    .encode(&mut frames);
    s.write_all(&frames).await.unwrap();
    let t = Instant::now();
    let e = r
        .wait_for_completion_timeout(Duration::from_secs(5))
        .await
        .unwrap_err();
    assert!(matches!(e, Error::Expired { .. }), "{e:?}");
    assert!(t.elapsed() < after + Duration::from_secs(1));
    assert_eq!(r.status(), OperationStatus::Cancelled);
    // The peer reads on: the bytes sent before the fence, then the abort.
    let mut abort = None;
    let mut buf = vec![0u8; 1 << 20];
    let deadline = Instant::now() + Duration::from_secs(10);
    while abort.is_none() && Instant::now() < deadline {
        let mut h = [0u8; wire::HEADER_LEN];
        s.read_exact(&mut h).await.unwrap();
        let header = wire::decode_header(&h).unwrap();
        let mut body = vec![0u8; header.body_len as usize];
        s.read_exact(&mut body).await.unwrap();
        match wire::decode_body(header, &body).unwrap() {
            Message::Data(d) => {
                let mut left = d.len as usize;
                while left > 0 {
                    let n = left.min(buf.len());
                    s.read_exact(&mut buf[..n]).await.unwrap();
                    left -= n;
                }
            }
            Message::Abort(a) => abort = Some(a),
            // Its hello, and heartbeats while the transfer was in progress.
            _ => {}
        }
    }
    let a = abort.expect("the peer is told");
    assert_eq!(a.req, 1);
    assert_eq!(a.reason, AbortReason::Expired);
    let back = r.into_descriptors();
    assert_eq!(back[0].size(), size);
}
