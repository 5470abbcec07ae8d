use super::encode::put_runs;
use super::*;
use crate::runs;
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
            sizes: vec![1, 2, 3].into(),
            pull: true,
            part: 0,
            parts: 1,
        }),
        Message::Open(Open {
            req: 5,
            op_id: 6,
            token: Token::from_bytes([8; 16]),
            kind: OperationKind::Read,
            sizes: vec![1 << 30].into(),
            pull: false,
            part: 15,
            parts: 16,
        }),
        Message::Lease(Lease {
            lane: crate::lane::LaneId::CMA,
            req: 4,
            segments: vec![(0x7f00_0000_1000, 4096), (1, u64::MAX)].into(),
            key: vec![1, 2, 3],
        }),
        Message::LaneOffer(LaneOffer {
            lane: LaneId::UCX,
            round: 0,
            bytes: vec![9; 215],
        }),
        Message::LaneOffer(LaneOffer {
            lane: LaneId(200),
            round: 3,
            bytes: Vec::new(),
        }),
        Message::LaneOffer(LaneOffer {
            lane: LaneId::CMA,
            round: 2,
            bytes: vec![7; 30],
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
    // Refused from its header: no valid `Auth` is that long.
    let too_long = (2 + MAX_HANDSHAKE + 1) as u32;
    assert_eq!(decode_frame(&v), Err(WireError::BodyTooLarge(too_long)));
    // A body within the bound whose length field claims more.
    let mut v = header_for(T_AUTH, 2 + MAX_HANDSHAKE);
    v.extend_from_slice(&((MAX_HANDSHAKE + 1) as u16).to_le_bytes());
    v.resize(v.len() + MAX_HANDSHAKE, 0);
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
fn a_lane_offer_is_bounded_and_the_old_set_up_frames_are_gone() {
    let mut v = Message::LaneOffer(LaneOffer {
        lane: LaneId::CMA,
        round: 0,
        bytes: vec![1, 2],
    })
    .to_vec();
    // A length past the limit, in a body that fits the header's bound.
    let n = HEADER_LEN + 2;
    v[n..n + 4].copy_from_slice(&(MAX_LANE_OFFER as u32 + 1).to_le_bytes());
    assert_eq!(
        decode_frame(&v),
        Err(WireError::InvalidField("lane offer length"))
    );
    // A body longer than any offer: refused from the header.
    v[4..8].copy_from_slice(&(max_body(T_LANE_OFFER) + 1).to_le_bytes());
    assert!(matches!(decode_frame(&v), Err(WireError::BodyTooLarge(_))));
    // Protocol 11's `Attach` (8) and `Rdma` (10) are unknown types now.
    for ty in [8, 10, 19] {
        let mut h = [0u8; HEADER_LEN];
        h[0] = ty;
        assert_eq!(decode_header(&h), Err(WireError::UnknownType(ty)));
    }
}

#[test]
fn impossible_parts_are_refused() {
    let open = |part, parts, pull| {
        Message::Open(Open {
            req: 1,
            op_id: 1,
            token: Token::from_bytes([0; 16]),
            kind: OperationKind::Read,
            sizes: vec![8].into(),
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
    fn decoder_never_panics_on_valid_headers(ty in 1u8..=10, body in proptest::collection::vec(any::<u8>(), 0..300)) {
        let mut v = vec![ty, 0, 0, 0];
        v.extend_from_slice(&(body.len() as u32).to_le_bytes());
        v.extend_from_slice(&body);
        let _ = decode_frame(&v);
    }
}

/// A lease body: req 4, no key, `lens` as runs, then `addresses` as given.
fn lease_body(lens: &[u64], addresses: &[u8]) -> Vec<u8> {
    let mut body = 4u64.to_le_bytes().to_vec();
    body.push(1); // the lane
    body.extend_from_slice(&0u32.to_le_bytes());
    put_runs(&mut body, &runs::runs(lens.iter().copied()));
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
        lane: crate::lane::LaneId::CMA,
        req: 9,
        segments: segments.clone().into(),
        key: Vec::new(),
    });
    let v = m.to_vec();
    assert!(v.len() < 1024, "{} bytes for 64 runs", v.len());
    assert_eq!(decode_frame(&v).unwrap().unwrap().0, m);
    // Nothing follows anything: one address each, as before.
    let scattered: Vec<(u64, u64)> = (0..4096u64).map(|i| (i * 4096, 2048)).collect();
    let m = Message::Lease(Lease {
        lane: crate::lane::LaneId::CMA,
        req: 9,
        segments: scattered.into(),
        key: Vec::new(),
    });
    let v = m.to_vec();
    assert!(v.len() >= 4096 * 8);
    assert_eq!(decode_frame(&v).unwrap().unwrap().0, m);
    // An address that would wrap ends a run rather than continuing it.
    let m = Message::Lease(Lease {
        lane: crate::lane::LaneId::CMA,
        req: 1,
        segments: vec![(u64::MAX - 1, 2), (0, 1), (1, 1), (2, 1), (3, 1)].into(),
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
    assert_eq!(
        l.segments.expand(),
        vec![(0, 8), (8, 8), (100, 8), (108, 8)]
    );
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
        let m = Message::Lease(Lease { lane: crate::lane::LaneId::CMA, req: 2, segments: segments.into(), key: vec![7] });
        let v = m.to_vec();
        prop_assert_eq!(decode_frame(&v).unwrap().unwrap().0, m);
    }
}

/// An `Open` body of `runs`, for the fields after the fixed ones.
fn open_with_runs(runs: &[(u64, u32)]) -> Vec<u8> {
    let mut body = Vec::new();
    body.extend_from_slice(&1u64.to_le_bytes());
    body.extend_from_slice(&2u64.to_le_bytes());
    body.extend_from_slice(&[0; 16]);
    body.extend_from_slice(&[OperationKind::Read.as_u8(), 0]);
    body.extend_from_slice(&0u16.to_le_bytes());
    body.extend_from_slice(&1u16.to_le_bytes());
    put_runs(&mut body, runs);
    let mut v = header_for(T_OPEN, body.len());
    v.extend_from_slice(&body);
    v
}

#[test]
fn runs_stay_runs_until_a_grant_is_checked() {
    // 62 bytes that describe 2^20 blocks: decoded as one run.
    let v = open_with_runs(&[(4096, 1 << 20)]);
    assert_eq!(v.len(), 62);
    let Message::Open(o) = decode_frame(&v).unwrap().unwrap().0 else {
        panic!("not an open")
    };
    assert_eq!((o.sizes.len(), o.sizes.run_count()), (1 << 20, 1));
    assert_eq!(o.sizes.total(), 4096 << 20);
    // More than MAX_DESCRIPTORS blocks in all: refused before anything.
    let v = open_with_runs(&[(1, 1 << 20), (2, 1)]);
    assert_eq!(
        decode_frame(&v),
        Err(WireError::InvalidField("descriptor count"))
    );
    // Runs that a canonical encoder would merge are kept as they came, so
    // that the frame encodes to the bytes it came from.
    let v = open_with_runs(&[(8, 1), (8, 2)]);
    let (m, _) = decode_frame(&v).unwrap().unwrap();
    assert_eq!(m.to_vec(), v);
    let Message::Open(o) = m else { panic!() };
    assert_eq!(o.sizes.first_difference(&[8, 8, 8]), None);
    // A lease of 2^20 segments in 54 bytes: runs of lengths and addresses.
    let mut body = 4u64.to_le_bytes().to_vec();
    body.push(1); // the lane
    body.extend_from_slice(&0u32.to_le_bytes());
    put_runs(&mut body, &[(4096, 1 << 20)]);
    body.push(ADDRESSES_RUNS);
    put_runs(&mut body, &[(0x1000, 1 << 20)]);
    let mut v = header_for(T_LEASE, body.len());
    v.extend_from_slice(&body);
    assert_eq!(v.len(), 54);
    let (m, _) = decode_frame(&v).unwrap().unwrap();
    assert_eq!(m.to_vec(), v);
    let Message::Lease(l) = m else { panic!() };
    assert_eq!(
        (l.segments.len(), l.segments.lens().run_count()),
        (1 << 20, 1)
    );
}

#[test]
fn a_header_that_announces_more_than_its_type_holds_is_refused() {
    for t in FrameType::ALL {
        let largest = max_body(t.code());
        let large = [
            FrameType::Lease,
            FrameType::GrantRequest,
            FrameType::GrantReply,
        ];
        assert!(largest <= MAX_BODY || large.contains(&t), "{t}");
        let mut h = [t.code(), 0, 0, 0, 0, 0, 0, 0];
        h[4..].copy_from_slice(&largest.to_le_bytes());
        let ok = decode_header(&h).unwrap();
        assert_eq!(ok.frame_type(), t);
        h[4..].copy_from_slice(&(largest + 1).to_le_bytes());
        assert_eq!(decode_header(&h), Err(WireError::BodyTooLarge(largest + 1)));
    }
    // Each sample is within its type's largest body.
    for m in samples() {
        let v = m.to_vec();
        let h = decode_header(v[..HEADER_LEN].try_into().unwrap()).unwrap();
        assert!(h.body_len <= max_body(v[0]), "{m:?}");
    }
    // The largest valid bodies: fixed frames exactly, the others at their limits.
    let fixed = [
        Message::Data(Data {
            req: 1,
            desc: 2,
            offset: 3,
            len: 4,
        }),
        Message::Finish { req: 1 },
        Message::Release { req: 1 },
        Message::Digest(Digest {
            req: 1,
            crc32: Some(u32::MAX),
        }),
        Message::Abort(Abort {
            req: 1,
            reason: AbortReason::Cancelled,
            detail: "x".repeat(MAX_DETAIL),
        }),
        Message::Auth(Auth {
            handshake: vec![1; MAX_HANDSHAKE],
        }),
        Message::LaneOffer(LaneOffer {
            lane: LaneId::UCX,
            round: 1,
            bytes: vec![1; MAX_LANE_OFFER],
        }),
        Message::Open(Open {
            req: 1,
            op_id: 2,
            token: Token::from_bytes([0; 16]),
            kind: OperationKind::Read,
            sizes: (0..MAX_RUNS as u64)
                .map(|i| i & 1)
                .collect::<Vec<_>>()
                .into(),
            pull: false,
            part: 0,
            parts: 1,
        }),
    ];
    for m in fixed {
        let v = m.to_vec();
        assert_eq!(v.len() - HEADER_LEN, max_body(v[0]) as usize, "{m:?}");
        assert_eq!(decode_frame(&v).unwrap().unwrap().0, m);
    }
}

#[test]
fn a_refused_frame_names_its_request_from_its_first_bytes() {
    let v = Message::Finish { req: 77 }.to_vec();
    let h = decode_header(v[..HEADER_LEN].try_into().unwrap()).unwrap();
    assert_eq!(
        Expect::AUTH.check(&h),
        Err(WireError::Unexpected(FrameType::Finish))
    );
    assert_eq!(h.req(&v[HEADER_LEN..]), Some(77));
    assert_eq!(h.req(&v[HEADER_LEN..HEADER_LEN + 7]), None);
    let v = samples()[0].to_vec();
    let h = decode_header(v[..HEADER_LEN].try_into().unwrap()).unwrap();
    assert_eq!(h.req(&v[HEADER_LEN..]), None, "a hello names no request");
}

#[test]
fn a_digest_is_a_crc32_or_nothing() {
    for crc32 in [None, Some(0), Some(0xdead_beef)] {
        let m = Message::Digest(Digest { req: 7, crc32 });
        let v = m.to_vec();
        assert_eq!(v.len(), HEADER_LEN + 13);
        assert_eq!(decode_frame(&v).unwrap().unwrap().0, m);
    }
    // An algorithm this build does not know, or a value with none.
    let mut v = Message::Digest(Digest {
        req: 7,
        crc32: Some(1),
    })
    .to_vec();
    v[HEADER_LEN + 8] = 2;
    assert_eq!(decode_frame(&v), Err(WireError::InvalidField("digest")));
    v[HEADER_LEN + 8] = 0;
    assert_eq!(decode_frame(&v), Err(WireError::InvalidField("digest")));
    assert_eq!(AbortReason::from_code(17), AbortReason::DigestMismatch);
    assert_eq!(AbortReason::DigestMismatch.code(), 17);
}
