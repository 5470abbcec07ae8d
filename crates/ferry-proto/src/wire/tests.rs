use super::*;
use proptest::prelude::*;

fn samples() -> Vec<Message> {
    vec![
        Message::Hello(Hello {
            version: PROTOCOL_VERSION,
            worker_id: "w-1".into(),
        }),
        Message::Open(Open {
            req: 1,
            op_id: 2,
            token: Token::from_bytes([9; 16]),
            kind: OperationKind::Write,
            sizes: vec![1, 2, 3],
            pull: true,
            part: 0,
            parts: 1,
        }),
        Message::Open(Open {
            req: 5,
            op_id: 6,
            token: Token::from_bytes([8; 16]),
            kind: OperationKind::Read,
            sizes: vec![1 << 30],
            pull: false,
            part: 15,
            parts: 16,
        }),
        Message::Lease(Lease {
            req: 4,
            segments: vec![(0x7f00_0000_1000, 4096), (1, u64::MAX)],
            key: vec![1, 2, 3],
        }),
        Message::Rdma(Rdma {
            address: vec![9; 215],
            verdict: Verdict::Unknown,
        }),
        Message::Rdma(Rdma {
            address: Vec::new(),
            verdict: Verdict::Refused,
        }),
        Message::Attach(Attach {
            pid: 1234,
            addr: 0x5555_0000,
            cookie: [7; 16],
            verdict: Verdict::CanPull,
        }),
        Message::Data(Data {
            req: 5,
            desc: 1,
            offset: 1 << 33,
            len: 4096,
        }),
        Message::Finish { req: 77 },
        Message::Release { req: 78 },
        Message::Auth(Auth {
            handshake: vec![1; 48],
        }),
        Message::Abort(Abort {
            req: 3,
            reason: AbortReason::SizeMismatch,
            detail: "descriptor 0: 4 != 5".into(),
        }),
    ]
}

#[test]
fn round_trip() {
    for m in samples() {
        let v = m.to_vec();
        let (back, used) = decode_frame(&v).unwrap().unwrap();
        assert_eq!(back, m);
        assert_eq!(used, v.len());
        for cut in 0..v.len() {
            assert_eq!(decode_frame(&v[..cut]).unwrap(), None, "{m:?} cut at {cut}");
        }
    }
}

#[test]
fn the_longest_hello_is_max_hello_body() {
    let longest = Message::Hello(Hello {
        version: PROTOCOL_VERSION,
        worker_id: "é".repeat(200),
    })
    .to_vec();
    assert_eq!(longest.len(), HEADER_LEN + MAX_HELLO_BODY as usize);
    let (back, _) = decode_frame(&longest).unwrap().unwrap();
    assert!(matches!(back, Message::Hello(h) if h.worker_id.len() == MAX_WORKER_ID));
    let mut v = header_for(T_AUTH, 2 + MAX_HANDSHAKE + 1);
    v.extend_from_slice(&((MAX_HANDSHAKE + 1) as u16).to_le_bytes());
    v.resize(v.len() + MAX_HANDSHAKE + 1, 0);
    assert_eq!(decode_frame(&v), Err(WireError::InvalidField("handshake")));
}

fn header_for(ty: u8, body_len: usize) -> Vec<u8> {
    let mut v = vec![ty, 0, 0, 0];
    v.extend_from_slice(&(body_len as u32).to_le_bytes());
    v
}

#[test]
fn absurd_length_and_garbage_are_errors() {
    let mut h = [T_OPEN, 0, 0, 0, 0, 0, 0, 0];
    h[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
    assert_eq!(decode_header(&h), Err(WireError::BodyTooLarge(u32::MAX)));
    assert_eq!(
        decode_header(b"GET / HT"),
        Err(WireError::UnknownType(b'G'))
    );
    let mut hello = samples()[0].to_vec();
    hello[HEADER_LEN] = b'X';
    assert_eq!(decode_frame(&hello), Err(WireError::BadMagic));
}

#[test]
fn impossible_parts_are_refused() {
    let open = |part, parts, pull| {
        Message::Open(Open {
            req: 1,
            op_id: 1,
            token: Token::from_bytes([0; 16]),
            kind: OperationKind::Read,
            sizes: vec![8],
            pull,
            part,
            parts,
        })
        .to_vec()
    };
    assert!(decode_frame(&open(3, 4, false)).is_ok());
    for (part, parts, pull) in [(0, 0, false), (4, 4, false), (0, 17, false), (1, 2, true)] {
        assert_eq!(
            decode_frame(&open(part, parts, pull)),
            Err(WireError::InvalidField("part")),
            "part {part} of {parts}, pull {pull}"
        );
    }
}

proptest! {
    #[test]
    fn parts_cover_every_byte_once_in_order(total in any::<u64>(), parts in 1u16..=MAX_PARTS) {
        let mut at = 0;
        for p in 0..parts {
            let (start, end) = part_range(total, p, parts);
            prop_assert_eq!(start, at);
            prop_assert!(end >= start);
            prop_assert!(end - start <= total / u64::from(parts) + 1);
            at = end;
        }
        prop_assert_eq!(at, total);
    }

    #[test]
    fn decoder_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
        let _ = decode_frame(&bytes);
    }

    #[test]
    fn decoder_never_panics_on_valid_headers(ty in 1u8..=9, body in proptest::collection::vec(any::<u8>(), 0..300)) {
        let mut v = vec![ty, 0, 0, 0];
        v.extend_from_slice(&(body.len() as u32).to_le_bytes());
        v.extend_from_slice(&body);
        let _ = decode_frame(&v);
    }
}
