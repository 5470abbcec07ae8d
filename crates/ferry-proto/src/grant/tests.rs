use proptest::prelude::*;

use super::*;
use crate::{Device, Token};

fn sample() -> GrantMetadata {
    GrantMetadata {
        owner: "prefill-0".into(),
        host_id: "0b1e5a9c-6a57-4e9b-9c3e-2f1f1a0c7e11".into(),
        grant: GrantId(7),
        token: Token::from_bytes([0xab; 16]),
        holder: Some("decode-3".into()),
        rights: Rights::READ_WRITE,
        expires_at_ms: Some(1_800_000_000_000),
        block_size: 32768,
        block_count: 16384,
        device: Device::CPU,
        cma: Some(CmaGrant {
            pid: 4242,
            control_fd: 17,
            cookie: [0x5c; 16],
            base: 0x7f00_0000_0000,
        }),
        cuda_ipc: None,
        tcp: Some(TcpGrant {
            addresses: vec!["10.0.0.7:7100".parse().unwrap()],
        }),
        ucx: None,
    }
}

/// [`sample`] for the UCX lane's tests.
pub(super) fn sample_metadata() -> GrantMetadata {
    sample()
}

#[test]
fn metadata_round_trips() {
    let m = sample();
    let json = m.to_json().unwrap();
    assert_eq!(GrantMetadata::from_json(&json).unwrap(), m);
    assert_eq!(GrantMetadata::decode(&m.encode().unwrap()).unwrap(), m);
    let bearer = GrantMetadata {
        holder: None,
        expires_at_ms: None,
        cma: None,
        tcp: None,
        ..m
    };
    let json = bearer.to_json().unwrap();
    assert!(!json.contains("holder") && !json.contains("cma") && !json.contains("tcp"));
    assert_eq!(GrantMetadata::from_json(&json).unwrap(), bearer);
    // Debug hides the secrets.
    let dbg = format!("{bearer:?} {:?}", sample());
    assert!(!dbg.contains("abab") && !dbg.contains("5c5c"));
}

#[test]
fn metadata_is_small_whatever_the_pool_size() {
    for (size, count) in [
        (1u64, 1u32),
        (4096, u32::MAX),
        (1 << 40, 256),
        (u64::from(u32::MAX), 65536),
    ] {
        let m = GrantMetadata {
            owner: "o".repeat(256),
            holder: Some("h".repeat(256)),
            grant: GrantId(u64::MAX),
            expires_at_ms: Some(u64::MAX),
            block_size: size,
            block_count: count,
            device: Device::cuda(u32::MAX),
            cma: Some(CmaGrant {
                pid: u32::MAX,
                control_fd: i32::MAX,
                cookie: [0xff; 16],
                base: 1,
            }),
            ..sample()
        };
        match m.to_json() {
            Ok(j) => assert!(j.len() <= MAX_GRANT_JSON, "{} bytes", j.len()),
            // Past 256 TiB: refused as malformed, never large.
            Err(e) => assert!(matches!(e, GrantError::Malformed(_)), "{e}"),
        }
    }
    // The longest names with a boot id fit.
    let big = GrantMetadata {
        owner: "o".repeat(256),
        holder: Some("h".repeat(256)),
        ..sample()
    };
    assert!(big.to_json().unwrap().len() <= MAX_GRANT_JSON);
    // Names that JSON escapes may not: a typed error, not a longer grant.
    let escaped = GrantMetadata {
        owner: "\u{1}".repeat(256),
        ..sample()
    };
    assert!(matches!(
        escaped.to_json(),
        Err(GrantError::TooLarge { .. })
    ));
}

#[test]
fn bad_metadata_is_typed() {
    let good = sample().to_json().unwrap();
    let cases: Vec<String> = vec![
        String::new(),
        "null".into(),
        "[]".into(),
        good.replace("\"version\":1", "\"version\":2"),
        good.replace("\"rights\":3", "\"rights\":4"),
        good.replace("\"rights\":3", "\"rights\":0"),
        good.replace("\"block_size\":32768", "\"block_size\":0"),
        good.replace("\"block_count\":16384", "\"block_count\":0"),
        good.replace("\"block_size\":32768", "\"block_size\":1099511627776"),
        good.replace("\"pid\":4242", "\"pid\":0"),
        good.replace("\"control_fd\":17", "\"control_fd\":-1"),
        good.replace("\"base\":139637976727552", "\"base\":18446744073709551615"),
        good.replace(&"5c".repeat(16), "zz"),
        good.replace(&"ab".repeat(16), &"ab".repeat(15)),
        good.replace("\"owner\":\"prefill-0\"", "\"owner\":\"\""),
        good.replace("\"device\":\"cpu\"", "\"device\":\"tpu\""),
        good.replace('}', ",\"extra\":1}"),
    ];
    for c in cases {
        assert_ne!(c, good);
        match GrantMetadata::from_json(&c) {
            Err(GrantError::Malformed(_)) => {}
            other => panic!("{c}: {other:?}"),
        }
    }
    assert!(matches!(
        GrantMetadata::decode(&[0xff, 0xfe]),
        Err(GrantError::Malformed(_))
    ));
    assert!(matches!(
        GrantMetadata::decode(&[b' '; 1025]),
        Err(GrantError::TooLarge { len: 1025, .. })
    ));
}

proptest! {
    #[test]
    fn any_bytes_parse_or_fail_typed(b in proptest::collection::vec(any::<u8>(), 0..1100)) {
        let _ = GrantMetadata::decode(&b);
    }

    #[test]
    fn truncated_or_flipped_metadata_never_panics(cut in 0usize..600, at in 0usize..600, bit in 0u8..8) {
        let good = sample().encode().unwrap();
        let cut = cut.min(good.len());
        let _ = GrantMetadata::decode(&good[..cut]);
        let mut f = good.clone();
        let at = at % f.len();
        f[at] ^= 1 << bit;
        if let Ok(m) = GrantMetadata::decode(&f) {
            prop_assert!(m.validate().is_ok());
        }
    }
}

#[test]
fn checks() {
    use check::*;
    assert!(rights(Rights::READ_WRITE, Rights::WRITE).is_ok());
    assert_eq!(
        rights(Rights::READ, Rights::WRITE),
        Err(GrantError::RightsMissing {
            needed: Rights::WRITE,
            granted: Rights::READ
        })
    );
    assert!(expiry(None, u64::MAX).is_ok());
    assert!(expiry(Some(10), 9).is_ok());
    assert_eq!(
        expiry(Some(10), 10),
        Err(GrantError::Expired {
            at_ms: 10,
            now_ms: 10
        })
    );
    assert!(holder(None, "me").is_ok());
    assert!(holder(Some("me"), "me").is_ok());
    assert!(matches!(
        holder(Some("you"), "me"),
        Err(GrantError::NotYours { .. })
    ));
    let r = |index, generation| BlockRef { index, generation };
    assert!(blocks(&[r(0, 0), r(3, 9)], 4).is_ok());
    assert_eq!(
        blocks(&[r(0, 0), r(4, 0)], 4),
        Err(GrantError::OutOfRange { index: 4, count: 4 })
    );
    assert!(blocks(&[], 4).is_err());
    let table = [0u32, 2, 1];
    assert!(generations(&[r(1, 2), r(2, 1)], |i| table[i as usize]).is_ok());
    assert_eq!(
        generations(&[r(0, 0), r(1, 1)], |i| table[i as usize]),
        Err(GrantError::StaleGeneration {
            index: 1,
            named: 1,
            current: 2
        })
    );
    assert!(shape(2, 4096, 2, 4096).is_ok());
    assert!(matches!(
        shape(2, 4096, 3, 4096),
        Err(GrantError::LengthMismatch {
            what: "block counts",
            ..
        })
    ));
    assert!(matches!(
        shape(2, 4096, 2, 8192),
        Err(GrantError::LengthMismatch {
            what: "block sizes",
            ..
        })
    ));
    assert!(payload(MAX_NOTIFICATION).is_ok());
    assert_eq!(
        payload(257),
        Err(GrantError::NotificationTooLarge { len: 257, max: 256 })
    );
    assert_eq!(
        ranges(1000, 10, [0, 1, 2, 5, 4, 5]),
        vec![(1000, 30), (1050, 10), (1040, 20)]
    );
    assert_eq!(Rights::from_bits(4), None);
    assert_eq!(Rights::READ | Rights::WRITE, Rights::READ_WRITE);
    assert_eq!(Rights::READ_WRITE.to_string(), "READ|WRITE");
}
