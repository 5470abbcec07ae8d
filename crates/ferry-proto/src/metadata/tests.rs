//! Unit and property tests of metadata.

use super::*;
use proptest::prelude::*;

fn sample() -> RdmaMetadata {
    RdmaMetadata::new(
        OperationKind::Write,
        "worker-a".into(),
        "host".into(),
        "boot-1".into(),
        vec!["127.0.0.1:4000".parse().unwrap()],
        7,
        Token::from_bytes([0xab; 16]),
        vec![
            DescriptorInfo::new(Device::CPU, 10),
            DescriptorInfo::new(Device::CPU, 0),
        ],
    )
    .unwrap()
}

#[test]
fn json_round_trip_and_version() {
    let m = sample();
    let json = m.to_json();
    assert!(json.contains("\"version\":1"), "{json}");
    assert!(json.contains("\"operation_kind\":2"), "{json}");
    assert_eq!(RdmaMetadata::from_json(&json).unwrap(), m);
    assert!(
        json.len() < 400,
        "metadata should be small: {} bytes",
        json.len()
    );
}

/// The sample's JSON, byte for byte as version 1 wrote it before
/// metadata could carry transport blobs.
const SAMPLE_JSON: &str = concat!(
    r#"{"version":1,"operation_kind":2,"worker_id":"worker-a","hostname":"host","#,
    r#""host_id":"boot-1","addresses":["127.0.0.1:4000"],"operation_id":7,"#,
    r#""token":"abababababababababababababababab","descriptors":"#,
    r#"[{"device":"cpu","size":10},{"device":"cpu","size":0}]}"#
);

#[test]
fn metadata_without_transports_is_unchanged() {
    assert_eq!(sample().to_json(), SAMPLE_JSON);
    let m = RdmaMetadata::from_json(SAMPLE_JSON).unwrap();
    assert_eq!(m, sample());
    assert_eq!(m.transport_blobs().count(), 0);
    assert_eq!(m.transport_blob("tcp"), None);
    // An empty map, or null, is the same as none, and is not written back.
    for t in ["{}", "null"] {
        let json = format!(
            "{},\"transports\":{t}}}",
            &SAMPLE_JSON[..SAMPLE_JSON.len() - 1]
        );
        let m = RdmaMetadata::from_json(&json).unwrap();
        assert_eq!(m, sample());
        assert_eq!(m.to_json(), SAMPLE_JSON);
    }
}

#[test]
fn transport_blobs_round_trip() {
    let big: Vec<u8> = (0..RdmaMetadata::MAX_TRANSPORT_BLOB)
        .map(|i| i as u8)
        .collect();
    let m = sample()
        .with_transport_blob("tcp", vec![0x00, 0xff, 0x10])
        .unwrap()
        .with_transport_blob("rdma-v2_x", big.clone())
        .unwrap()
        .with_transport_blob("empty", Vec::new())
        .unwrap();
    let json = m.to_json();
    // Sorted by name, lower-case hexadecimal, after every other field.
    let big_hex: String = big.iter().map(|b| format!("{b:02x}")).collect();
    let want = format!(
        r#"{},"transports":{{"empty":"","rdma-v2_x":"{big_hex}","tcp":"00ff10"}}}}"#,
        &SAMPLE_JSON[..SAMPLE_JSON.len() - 1]
    );
    assert_eq!(json, want);
    let back = RdmaMetadata::from_json(&json).unwrap();
    assert_eq!(back, m);
    assert_eq!(back.to_json(), json);
    assert_eq!(back.transport_blob("tcp"), Some(&[0x00, 0xff, 0x10][..]));
    assert_eq!(back.transport_blob("rdma-v2_x"), Some(&big[..]));
    assert_eq!(back.transport_blob("empty"), Some(&[][..]));
    assert_eq!(back.transport_blob("ucx"), None);
    assert_eq!(
        back.transport_blobs().map(|(n, _)| n).collect::<Vec<_>>(),
        ["empty", "rdma-v2_x", "tcp"]
    );
    // Metadata with blobs differs from metadata without.
    assert_ne!(back, sample());
    // The same name again replaces the blob.
    let m = m.with_transport_blob("tcp", vec![1]).unwrap();
    assert_eq!(m.transport_blob("tcp"), Some(&[1u8][..]));
    assert_eq!(m.transport_blobs().count(), 3);
}

#[test]
fn unknown_transport_names_are_kept_and_ignored() {
    let json = format!(
        "{},\"transports\":{{\"zz-future\":\"DEADbeef\",\"tcp\":\"01\"}}}}",
        &SAMPLE_JSON[..SAMPLE_JSON.len() - 1]
    );
    let m = RdmaMetadata::from_json(&json).unwrap();
    // A reader that knows "tcp" only asks for it.
    assert_eq!(m.transport_blob("tcp"), Some(&[1u8][..]));
    // The others survive, in canonical form (sorted, lower case).
    assert_eq!(
        m.transport_blob("zz-future"),
        Some(&[0xde, 0xad, 0xbe, 0xef][..])
    );
    assert!(
        m.to_json()
            .ends_with(r#""transports":{"tcp":"01","zz-future":"deadbeef"}}"#),
        "{}",
        m.to_json()
    );
    assert_eq!(RdmaMetadata::from_json(&m.to_json()).unwrap(), m);
}

#[test]
fn transport_limits_are_refused_with_typed_errors() {
    for name in [
        "",
        "TCP",
        "Tcp",
        "1tcp",
        "-tcp",
        "_tcp",
        "tc p",
        "tcp.v2",
        "tcp/x",
        "é",
        "tcp\0",
        &"a".repeat(RdmaMetadata::MAX_TRANSPORT_NAME + 1),
    ] {
        assert_eq!(
            sample().with_transport_blob(name, vec![1]),
            Err(MetadataError::BadTransportName(name.to_owned())),
            "{name:?}"
        );
    }
    // Long bad names are quoted in part only.
    let long = "A".repeat(1000);
    assert_eq!(
        sample().with_transport_blob(long, vec![]),
        Err(MetadataError::BadTransportName("A".repeat(64)))
    );
    // The longest name, the largest blob: accepted.
    let name = "a".repeat(RdmaMetadata::MAX_TRANSPORT_NAME);
    let blob = vec![7; RdmaMetadata::MAX_TRANSPORT_BLOB];
    let m = sample().with_transport_blob(name.clone(), blob).unwrap();
    assert_eq!(RdmaMetadata::from_json(&m.to_json()).unwrap(), m);
    assert_eq!(
        sample().with_transport_blob("tcp", vec![7; RdmaMetadata::MAX_TRANSPORT_BLOB + 1]),
        Err(MetadataError::TransportBlobTooLarge {
            name: "tcp".into(),
            len: RdmaMetadata::MAX_TRANSPORT_BLOB + 1
        })
    );
    // As many names as allowed; one more is refused, a known one replaced.
    let mut m = sample();
    for i in 0..RdmaMetadata::MAX_TRANSPORTS {
        m = m
            .with_transport_blob(format!("t{i}"), vec![i as u8])
            .unwrap();
    }
    assert_eq!(
        m.clone().with_transport_blob("one-more", vec![]),
        Err(MetadataError::TooManyTransports(
            RdmaMetadata::MAX_TRANSPORTS + 1
        ))
    );
    let m = m.with_transport_blob("t0", vec![9]).unwrap();
    assert_eq!(m.transport_blob("t0"), Some(&[9u8][..]));
    assert_eq!(RdmaMetadata::from_json(&m.to_json()).unwrap(), m);
}

#[test]
fn bad_transports_in_json_are_refused() {
    let with = |t: serde_json::Value| edit(|v| v["transports"] = t);
    let many: serde_json::Map<String, serde_json::Value> = (0..=RdmaMetadata::MAX_TRANSPORTS)
        .map(|i| (format!("t{i}"), "00".into()))
        .collect();
    let cases: Vec<(serde_json::Value, &str)> = vec![
        (serde_json::json!({"TCP": "00"}), "name \"TCP\""),
        (serde_json::json!({"": "00"}), "name \"\""),
        (serde_json::json!({"tcp": "0"}), "hexadecimal"),
        (serde_json::json!({"tcp": "0g"}), "hexadecimal"),
        (serde_json::json!({"tcp": "+f"}), "hexadecimal"),
        (serde_json::json!({"tcp": " 00"}), "hexadecimal"),
        (serde_json::json!({"tcp": "00".repeat(4097)}), "4097 bytes"),
        (serde_json::json!({"tcp": "0".repeat(8193)}), "4097 bytes"),
        (serde_json::Value::Object(many), "17 entries"),
        (serde_json::json!({"tcp": 1}), "invalid type"),
        (serde_json::json!({"tcp": [0]}), "invalid type"),
        (serde_json::json!({"tcp": null}), "invalid type"),
        (serde_json::json!(["tcp", "00"]), "invalid type"),
        (serde_json::json!("tcp"), "invalid type"),
    ];
    for (t, want) in cases {
        let err = with(t.clone()).unwrap_err().to_string();
        assert!(err.contains(want), "{t}: expected {want:?} in {err:?}");
    }
    // The same name twice (which a map type would collapse silently).
    let json = format!(
        "{},\"transports\":{{\"tcp\":\"00\",\"tcp\":\"01\"}}}}",
        &SAMPLE_JSON[..SAMPLE_JSON.len() - 1]
    );
    let err = RdmaMetadata::from_json(&json).unwrap_err().to_string();
    assert!(err.contains("\"tcp\" appears twice"), "{err}");
    // The field itself twice.
    let json = format!(
        "{},\"transports\":{{}},\"transports\":{{}}}}",
        &SAMPLE_JSON[..SAMPLE_JSON.len() - 1]
    );
    let err = RdmaMetadata::from_json(&json).unwrap_err().to_string();
    assert!(err.contains("duplicate field"), "{err}");
}

#[test]
fn debug_names_transports_but_hides_their_blobs() {
    let m = sample().with_transport_blob("rdma", vec![0x5a; 8]).unwrap();
    let dbg = format!("{m:?}");
    assert!(dbg.contains("\"rdma\""), "{dbg}");
    assert!(!dbg.contains("5a5a") && !dbg.contains("90, 90"), "{dbg}");
}

#[test]
fn debug_hides_the_token() {
    let dbg = format!("{:?}", sample());
    assert!(!dbg.contains("abab"), "{dbg}");
    assert!(dbg.contains("redacted"), "{dbg}");
}

fn edit(f: impl FnOnce(&mut serde_json::Value)) -> Result<RdmaMetadata, MetadataError> {
    let mut v: serde_json::Value = serde_json::from_str(&sample().to_json()).unwrap();
    f(&mut v);
    RdmaMetadata::from_json(&v.to_string())
}

#[test]
fn validation_names_the_bad_field() {
    type Edit = Box<dyn FnOnce(&mut serde_json::Value)>;
    let cases: Vec<(Edit, &str)> = vec![
        (Box::new(|v| v["version"] = 9.into()), "version 9"),
        (
            Box::new(|v| v["operation_kind"] = 3.into()),
            "operation_kind 3",
        ),
        (Box::new(|v| v["token"] = "zz".into()), "token"),
        (
            Box::new(|v| v["addresses"] = serde_json::json!([])),
            "no address",
        ),
        (
            Box::new(|v| v["addresses"] = serde_json::json!(["nowhere"])),
            "ip:port",
        ),
        (
            Box::new(|v| v["descriptors"] = serde_json::json!([])),
            "no descriptors",
        ),
        (
            Box::new(|v| v["descriptors"][0]["size"] = (-1).into()),
            "invalid value",
        ),
        (
            Box::new(|v| v["descriptors"][0]["size"] = (1u64 << 50).into()),
            "limit",
        ),
        (
            Box::new(|v| v["descriptors"][0]["device"] = "tpu".into()),
            "invalid device",
        ),
        (Box::new(|v| v["extra"] = 1.into()), "unknown field"),
        (Box::new(|v| v["worker_id"] = "".into()), "worker_id"),
        (
            Box::new(|v| {
                v.as_object_mut()
                    .unwrap()
                    .remove("token")
                    .map(drop)
                    .unwrap()
            }),
            "missing field",
        ),
    ];
    for (f, want) in cases {
        let err = edit(f).unwrap_err().to_string();
        assert!(err.contains(want), "expected {want:?} in {err:?}");
    }
}

#[test]
fn garbage_truncated_and_oversized_json_are_errors() {
    let json = sample().to_json();
    for cut in 0..json.len() {
        assert!(
            RdmaMetadata::from_json(&json[..cut]).is_err(),
            "prefix {cut}"
        );
    }
    assert!(RdmaMetadata::from_json("not json").is_err());
    let big = " ".repeat(MAX_METADATA_JSON + 1);
    assert!(matches!(
        RdmaMetadata::from_json(&big),
        Err(MetadataError::TooLarge { .. })
    ));
}

proptest! {
    #[test]
    fn parser_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        let _ = RdmaMetadata::from_json_bytes(&bytes);
    }

    #[test]
    fn round_trips(sizes in proptest::collection::vec(0u64..=MAX_DESCRIPTOR_SIZE, 1..40),
                   op in any::<u64>(), tok in any::<[u8; 16]>(), port in 1u16..) {
        let m = RdmaMetadata::new(
            OperationKind::Read, "w".into(), "h".into(), "b".into(),
            vec![SocketAddr::from(([127, 0, 0, 1], port))], op, Token::from_bytes(tok),
            sizes.iter().map(|&size| DescriptorInfo::new(Device::CPU, size)).collect(),
        ).unwrap();
        prop_assert_eq!(RdmaMetadata::from_json(&m.to_json()).unwrap(), m);
    }

    #[test]
    fn transports_round_trip(
        blobs in proptest::collection::btree_map(
            "[a-z][a-z0-9_-]{0,31}",
            proptest::collection::vec(any::<u8>(), 0..=MAX_TRANSPORT_BLOB),
            0..=MAX_TRANSPORTS,
        )
    ) {
        let mut m = sample();
        for (name, blob) in &blobs {
            m = m.with_transport_blob(name.as_str(), blob.clone()).unwrap();
        }
        let json = m.to_json();
        let back = RdmaMetadata::from_json(&json).unwrap();
        prop_assert_eq!(&back, &m);
        prop_assert_eq!(back.to_json(), json);
        for (name, blob) in &blobs {
            prop_assert_eq!(back.transport_blob(name), Some(&blob[..]));
        }
        prop_assert_eq!(back.transport_blobs().count(), blobs.len());
    }

    #[test]
    fn transport_names_are_checked_exactly(name in "[ -~]{0,34}|[a-z][a-z0-9_-]{0,33}|.{0,8}") {
        let b = name.as_bytes();
        let valid = (1..=32).contains(&b.len())
            && b[0].is_ascii_lowercase()
            && b.iter().all(|&c| matches!(c, b'a'..=b'z' | b'0'..=b'9' | b'_' | b'-'));
        let r = sample().with_transport_blob(name.as_str(), vec![1, 2]);
        prop_assert_eq!(r.is_ok(), valid, "{:?}", name);
        if let Ok(m) = r {
            prop_assert_eq!(RdmaMetadata::from_json(&m.to_json()).unwrap(), m);
        }
    }
}
