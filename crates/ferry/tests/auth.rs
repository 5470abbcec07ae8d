//! Optional mutual authentication with a shared secret.

use std::time::Duration;

use ferry::{Connector, Error};
use ferry_proto::wire::{self, AbortReason, Hello, Message, Open};
use ferry_proto::OperationKind;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

mod support;

use support::{transports, Via};

/// A connector over `t` (see `support::Via`), with `secret` if any.
async fn with_secret(secret: Option<&str>, t: Via) -> Connector {
    let mut b = t.builder();
    if let Some(s) = secret {
        b = b.secret(s);
    }
    b.build().await.unwrap()
}

/// Writes 4 KiB from `from` into a writable of `to`; the active side's result.
async fn write(from: &Connector, to: &Connector) -> Result<(), Error> {
    let w = to
        .create_writable(vec![vec![0u8; 4096].into()])
        .await
        .unwrap();
    let op = match from
        .begin_write(vec![vec![1u8; 4096].into()], w.metadata())
        .await
    {
        Ok(op) => op,
        Err(e) => return Err(e),
    };
    let r = op
        .wait_for_completion_timeout(Duration::from_secs(15))
        .await;
    if r.is_ok() {
        w.wait_for_completion().await.unwrap();
        assert!(w.descriptors().unwrap()[0]
            .as_slice()
            .unwrap()
            .iter()
            .all(|&x| x == 1));
    } else {
        assert_eq!(
            w.status(),
            ferry::OperationStatus::Initialized,
            "a refused peer touched nothing"
        );
    }
    r
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_secret_on_both_sides_works() {
    for t in transports() {
        let a = with_secret(Some("s3cret-of-the-deployment"), t).await;
        let b = with_secret(Some("s3cret-of-the-deployment"), t).await;
        write(&a, &b).await.unwrap();
        write(&b, &a).await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_or_different_secret_is_refused_in_both_directions() {
    for t in transports() {
        for (active, passive) in [
            (None, Some("x-secret-of-16-bytes")),
            (Some("x-secret-of-16-bytes"), None),
            (Some("x-secret-of-16-bytes"), Some("y-secret-of-16-bytes")),
        ] {
            let a = with_secret(active, t).await;
            let p = with_secret(passive, t).await;
            let err = write(&a, &p).await.unwrap_err();
            // Over every transport setting: a local copy needs the same
            // secret too, so these go over TCP and fail its handshake.
            assert!(
                matches!(err, Error::Unauthenticated { .. }),
                "{active:?} -> {passive:?} over {t}: {err}"
            );
            assert!(err.to_string().contains("same secret"), "{err}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_raw_peer_with_a_valid_token_but_no_secret_touches_nothing() {
    let p = with_secret(Some("k-secret-of-16-bytes"), Via::TCP).await;
    let w = p.create_writable(vec![vec![0u8; 64].into()]).await.unwrap();
    let m = w.metadata().clone();
    let mut s = tokio::net::TcpStream::connect(p.local_addr())
        .await
        .unwrap();
    let mut out = Message::Hello(Hello {
        version: wire::PROTOCOL_VERSION,
        worker_id: "intruder".into(),
    })
    .to_vec();
    Message::Open(Open {
        req: 9,
        op_id: m.operation_id(),
        token: *m.token(),
        kind: OperationKind::Write,
        sizes: vec![64].into(),
        pull: false,
        part: 0,
        parts: 1,
    })
    .encode(&mut out);
    s.write_all(&out).await.unwrap();
    let mut got = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut got))
        .await
        .unwrap()
        .unwrap();
    // Hello, then an Abort for request 9 saying why, then the connection closes.
    let (hello, used) = wire::decode_frame(&got).unwrap().unwrap();
    assert!(matches!(hello, Message::Hello(_)));
    let (abort, _) = wire::decode_frame(&got[used..]).unwrap().unwrap();
    assert!(
        matches!(&abort, Message::Abort(a) if a.req == 9 && a.reason == AbortReason::Unauthenticated),
        "{abort:?}"
    );
    assert_eq!(w.status(), ferry::OperationStatus::Initialized);
    // The capability is intact for the rightful holder.
    let b = with_secret(Some("k-secret-of-16-bytes"), Via::TCP).await;
    let op = b.begin_write(vec![vec![4u8; 64].into()], &m).await.unwrap();
    op.wait_for_completion().await.unwrap();
}

#[tokio::test]
async fn a_short_secret_is_refused() {
    let err = Connector::builder()
        .secret("short")
        .build()
        .await
        .unwrap_err();
    assert!(
        matches!(
            &err,
            Error::InvalidSetting(ferry::config::SettingError {
                name: ferry::SECRET_ENV,
                origin: ferry::config::Origin::Builder,
                value: None,
                problem: ferry::config::Problem::TooShort(ferry::MIN_SECRET),
            })
        ),
        "{err}"
    );
    assert!(!err.to_string().contains("short\""), "{err}");
}
