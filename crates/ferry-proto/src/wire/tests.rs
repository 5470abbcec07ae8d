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
            cuda: true,
        }),
        Message::Rdma(Rdma {
            address: Vec::new(),
            verdict: Verdict::Refused,
            cuda: false,
        }),
        Message::Attach(Attach {
            pid: 1234,
            addr: 0x5555_0000,
            cookie: [7; 16],
            verdict: Verdict::CanPull,
            cuda_ipc: false,
        }),
        Message::Attach(Attach {
            pid: 1235,
            addr: 0,
            cookie: [8; 16],
            verdict: Verdict::Unknown,
            cuda_ipc: true,
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
fn a_cuda_ipc_offer_is_a_yes_or_a_no() {
    let mut v = Message::Attach(Attach {
        pid: 1,
        addr: 2,
        cookie: [3; 16],
        verdict: Verdict::Unknown,
        cuda_ipc: true,
    })
    .to_vec();
    let last = v.len() - 1;
    assert_eq!(v[last], 1);
    v[last] = 2;
    assert_eq!(
        decode_frame(&v),
        Err(WireError::InvalidField("cuda ipc offer"))
    );
}

#[test]
fn an_rdma_cuda_flag_is_a_yes_or_a_no() {
    let mut v = Message::Rdma(Rdma {
        address: vec![1, 2],
        verdict: Verdict::CanPull,
        cuda: true,
    })
    .to_vec();
    let last = v.len() - 1;
    assert_eq!(v[last], 1);
    v[last] = 7;
    assert_eq!(
        decode_frame(&v),
        Err(WireError::InvalidField("rdma cuda memory"))
    );
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

/// A lease body: req 4, no key, `lens` as runs, then `addresses` as given.
fn lease_body(lens: &[u64], addresses: &[u8]) -> Vec<u8> {
    let mut body = 4u64.to_le_bytes().to_vec();
    body.extend_from_slice(&0u32.to_le_bytes());
    put_runs(&mut body, lens.iter().copied());
    body.extend_from_slice(addresses);
    let mut v = header_for(T_LEASE, body.len());
    v.extend_from_slice(&body);
    v
}

fn address_run(addr: u64, n: u32) -> Vec<u8> {
    [addr.to_le_bytes().as_slice(), &n.to_le_bytes()].concat()
}

#[test]
fn lease_addresses_go_as_runs_where_that_is_shorter() {
    // 64 runs of 64 blocks of 2 KiB that follow each other, out of order.
    let segments: Vec<(u64, u64)> = (0..4096u64)
        .map(|i| (((i / 64 * 37) % 64 * 64 + i % 64) * 2048 + (1 << 40), 2048))
        .collect();
    let m = Message::Lease(Lease {
        req: 9,
        segments: segments.clone(),
        key: Vec::new(),
    });
    let v = m.to_vec();
    assert!(v.len() < 1024, "{} bytes for 64 runs", v.len());
    assert_eq!(decode_frame(&v).unwrap().unwrap().0, m);
    // Nothing follows anything: one address each, as before.
    let scattered: Vec<(u64, u64)> = (0..4096u64).map(|i| (i * 4096, 2048)).collect();
    let m = Message::Lease(Lease {
        req: 9,
        segments: scattered,
        key: Vec::new(),
    });
    let v = m.to_vec();
    assert!(v.len() >= 4096 * 8);
    assert_eq!(decode_frame(&v).unwrap().unwrap().0, m);
    // An address that would wrap ends a run rather than continuing it.
    let m = Message::Lease(Lease {
        req: 1,
        segments: vec![(u64::MAX - 1, 2), (0, 1), (1, 1), (2, 1), (3, 1)],
        key: Vec::new(),
    });
    assert_eq!(decode_frame(&m.to_vec()).unwrap().unwrap().0, m);
}

#[test]
fn hostile_address_runs_are_refused() {
    let lens = [8u64; 4];
    let runs = |rs: &[(u64, u32)]| {
        let mut a = vec![ADDRESSES_RUNS];
        a.extend_from_slice(&(rs.len() as u32).to_le_bytes());
        for &(addr, n) in rs {
            a.extend_from_slice(&address_run(addr, n));
        }
        a
    };
    let ok = lease_body(&lens, &runs(&[(0, 2), (100, 2)]));
    let Message::Lease(l) = decode_frame(&ok).unwrap().unwrap().0 else {
        panic!("not a lease")
    };
    assert_eq!(l.segments, vec![(0, 8), (8, 8), (100, 8), (108, 8)]);
    for (what, addresses) in [
        ("no runs", runs(&[])),
        ("a run of none", runs(&[(0, 0), (8, 4)])),
        ("too few segments", runs(&[(0, 3)])),
        ("too many segments", runs(&[(0, 3), (0, 2)])),
        ("more runs than segments", runs(&[(0, 1); 5])),
        ("a count past the end", runs(&[(0, u32::MAX)])),
        ("addresses that wrap", runs(&[(u64::MAX - 8, 4)])),
        ("an unknown form", vec![2]),
        ("no form", vec![]),
    ] {
        let v = lease_body(&lens, &addresses);
        assert!(decode_frame(&v).is_err(), "{what} was accepted");
    }
    // Cut short or run on: also refused.
    let mut long = runs(&[(0, 4)]);
    long.push(0);
    assert!(decode_frame(&lease_body(&lens, &long)).is_err());
    let short = runs(&[(0, 2), (100, 2)]);
    assert!(decode_frame(&lease_body(&lens, &short[..short.len() - 1])).is_err());
}

proptest! {
    #[test]
    fn leases_round_trip(segs in proptest::collection::vec((0u64..64, 1u64..4, any::<bool>()), 1..200)) {
        // Each segment either follows the one before or jumps.
        let mut at = 1u64 << 30;
        let segments: Vec<(u64, u64)> = segs
            .iter()
            .map(|&(jump, len, follows)| {
                if !follows {
                    at += jump * 4096;
                }
                let s = (at, len);
                at += len;
                s
            })
            .collect();
        let m = Message::Lease(Lease { req: 2, segments, key: vec![7] });
        let v = m.to_vec();
        prop_assert_eq!(decode_frame(&v).unwrap().unwrap().0, m);
    }
}
