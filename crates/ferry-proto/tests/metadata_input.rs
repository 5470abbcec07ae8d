//! Hostile metadata JSON: too large, unknown or duplicated fields, negative
//! and huge numbers, huge descriptor counts, deep nesting, odd encodings.
//! Complements the unit tests in `src/metadata.rs`.
//!
//! Whatever the input, parsing returns a typed error or metadata that obeys
//! every documented limit, and never panics or recurses without bound.

use std::net::SocketAddr;

use ferry_proto::{
    DescriptorInfo, Device, MetadataError, OperationKind, RdmaMetadata, Token, MAX_ADDRESSES,
    MAX_DESCRIPTORS, MAX_METADATA_JSON,
};
use proptest::prelude::*;
use serde_json::{json, Value};

/// The largest single descriptor (`metadata::MAX_DESCRIPTOR_SIZE`, not exported).
const MAX_DESCRIPTOR_SIZE: u64 = 1 << 40;
/// The largest total (`metadata::MAX_TOTAL_SIZE`, not exported).
const MAX_TOTAL_SIZE: u64 = 1 << 48;
const TOKEN_HEX: &str = "0123456789abcdef0123456789abcdef";

fn sample() -> RdmaMetadata {
    RdmaMetadata::new(
        OperationKind::Write,
        "worker-a".into(),
        "host".into(),
        "boot-1".into(),
        vec!["127.0.0.1:4000".parse().unwrap()],
        7,
        Token::from_bytes([
            0x01, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd, 0xef, 0x01, 0x23, 0x45, 0x67, 0x89, 0xab,
            0xcd, 0xef,
        ]),
        vec![
            DescriptorInfo::new(Device::CPU, 10),
            DescriptorInfo::new(Device::CPU, 0),
        ],
    )
    .unwrap()
}

fn sample_value() -> Value {
    serde_json::from_str(&sample().to_json()).unwrap()
}

fn parse(v: &Value) -> Result<RdmaMetadata, MetadataError> {
    RdmaMetadata::from_json(&v.to_string())
}

fn edited(f: impl FnOnce(&mut Value)) -> Result<RdmaMetadata, MetadataError> {
    let mut v = sample_value();
    f(&mut v);
    parse(&v)
}

/// Every limit holds for metadata that parsed, and it survives a round trip.
fn check_accepted(m: &RdmaMetadata) {
    let n = m.descriptor_count();
    assert!((1..=MAX_DESCRIPTORS).contains(&n), "{n} descriptors");
    assert!(m.descriptors().iter().all(|d| d.count >= 1));
    assert_eq!(m.sizes().len(), n);
    assert!(m
        .descriptors()
        .iter()
        .all(|d| d.size <= MAX_DESCRIPTOR_SIZE));
    assert!(m.total_size() <= MAX_TOTAL_SIZE);
    assert!((1..=MAX_ADDRESSES).contains(&m.addresses().len()));
    for s in [m.worker_id(), m.hostname(), m.host_id()] {
        assert!((1..=256).contains(&s.len()), "name of {} bytes", s.len());
    }
    assert!(m.transport_blobs().count() <= RdmaMetadata::MAX_TRANSPORTS);
    for (name, blob) in m.transport_blobs() {
        assert!(is_transport_name(name), "transport name {name:?}");
        assert!(blob.len() <= RdmaMetadata::MAX_TRANSPORT_BLOB);
        assert_eq!(m.transport_blob(name), Some(blob));
    }
    let json = m.to_json();
    let back = RdmaMetadata::from_json(&json).expect("accepted metadata re-parses");
    assert_eq!(&back, m);
    assert_eq!(back.to_json(), json, "serialization is canonical");
}

/// What a transport name may be: 1 to 32 bytes of `[a-z][a-z0-9_-]*`.
fn is_transport_name(name: &str) -> bool {
    let b = name.as_bytes();
    (1..=RdmaMetadata::MAX_TRANSPORT_NAME).contains(&b.len())
        && b[0].is_ascii_lowercase()
        && b.iter()
            .all(|&c| matches!(c, b'a'..=b'z' | b'0'..=b'9' | b'_' | b'-'))
}

fn err_text(r: Result<RdmaMetadata, MetadataError>) -> String {
    match r {
        Ok(m) => panic!("accepted: {m:?}"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn the_sample_token_is_what_the_tests_assume() {
    assert_eq!(sample_value()["token"], TOKEN_HEX);
}

// ---------------------------------------------------------------------------
// Size of the input.

#[test]
fn size_limit_is_checked_before_parsing() {
    let json = sample().to_json();
    // Exactly at the limit (padded with whitespace): parsed.
    let mut at = json.clone().into_bytes();
    at.resize(MAX_METADATA_JSON, b' ');
    check_accepted(&RdmaMetadata::from_json_bytes(&at).unwrap());
    // One byte more: refused by length alone.
    at.push(b' ');
    assert_eq!(
        RdmaMetadata::from_json_bytes(&at),
        Err(MetadataError::TooLarge {
            len: MAX_METADATA_JSON + 1
        })
    );
    // Far too large, and pathological: refused without being looked at.
    let huge = vec![b'['; 4 * MAX_METADATA_JSON];
    assert!(matches!(
        RdmaMetadata::from_json_bytes(&huge),
        Err(MetadataError::TooLarge { .. })
    ));
}

#[test]
fn empty_and_non_object_inputs_are_refused() {
    for input in [
        &b""[..],
        b" ",
        b"null",
        b"true",
        b"0",
        b"-1",
        b"\"metadata\"",
        b"[]",
        b"{}",
        b"\xef\xbb\xbf{}",
        b"\xff\xfe",
        b"{\"version\":1,",
    ] {
        assert!(
            RdmaMetadata::from_json_bytes(input).is_err(),
            "{:?}",
            String::from_utf8_lossy(input)
        );
    }
    // Valid metadata followed by anything else is refused too.
    let json = sample().to_json();
    for tail in ["x", "{}", ",", "\0"] {
        assert!(RdmaMetadata::from_json(&format!("{json}{tail}")).is_err());
    }
    // Surrounding whitespace is fine.
    check_accepted(&RdmaMetadata::from_json(&format!(" \n{json}\t\r\n")).unwrap());
}

// ---------------------------------------------------------------------------
// Shape: unknown, duplicated, misspelt fields.

#[test]
fn unknown_fields_are_refused_at_every_level() {
    // Fields a NIXL-style record would carry (raw addresses, remote keys)
    // have no meaning here: metadata that carries them is refused.
    for field in [
        "ptr",
        "addr",
        "rkey",
        "remote_key",
        "agent_metadata",
        "Token",
    ] {
        let err = err_text(edited(|v| v[field] = json!(12345)));
        assert!(err.contains("unknown field"), "{field}: {err}");
        let err = err_text(edited(|v| v["descriptors"][0][field] = json!(12345)));
        assert!(err.contains("unknown field"), "descriptor {field}: {err}");
    }
    // A descriptor must be an object with exactly device and size.
    for d in [
        json!([]),
        json!(10),
        json!("cpu"),
        json!({"device": "cpu"}),
        json!({"size": 1}),
        json!({"device": "cpu", "size": 1, "size2": 1}),
        json!(null),
    ] {
        assert!(edited(|v| v["descriptors"][0] = d.clone()).is_err(), "{d}");
    }
}

#[test]
fn duplicated_fields_are_refused() {
    let json = sample().to_json();
    for (field, value) in [
        ("token", "\"ffffffffffffffffffffffffffffffff\""),
        ("operation_id", "8"),
        ("operation_kind", "1"),
        ("addresses", "[\"10.0.0.1:1\"]"),
        ("version", "1"),
    ] {
        // Append a second copy of the field before the closing brace.
        let dup = format!("{},\"{field}\":{value}}}", &json[..json.len() - 1]);
        let err = err_text(RdmaMetadata::from_json(&dup));
        assert!(err.contains("duplicate field"), "{field}: {err}");
    }
    // The optional field too.
    let dup = format!(
        "{},\"transports\":{{}},\"transports\":{{\"tcp\":\"00\"}}}}",
        &json[..json.len() - 1]
    );
    let err = err_text(RdmaMetadata::from_json(&dup));
    assert!(err.contains("duplicate field"), "transports: {err}");
    let dup_size = json.replacen("\"size\":10", "\"size\":10,\"size\":11", 1);
    assert_ne!(dup_size, json);
    let err = err_text(RdmaMetadata::from_json(&dup_size));
    assert!(err.contains("duplicate field"), "{err}");
}

#[test]
fn every_field_is_required() {
    for field in [
        "version",
        "operation_kind",
        "worker_id",
        "hostname",
        "host_id",
        "addresses",
        "operation_id",
        "token",
        "descriptors",
    ] {
        let err = err_text(edited(|v| {
            v.as_object_mut().unwrap().remove(field);
        }));
        assert!(err.contains("missing field"), "{field}: {err}");
        let err = err_text(edited(|v| v[field] = Value::Null));
        assert!(err.contains("invalid type"), "{field} = null: {err}");
    }
}

// ---------------------------------------------------------------------------
// Numbers.

#[test]
fn negative_fractional_and_huge_sizes_are_refused() {
    let bad_sizes = [
        "-1",
        "-9223372036854775808",
        "1.5",
        "1e3",
        "10.0",
        "\"10\"",
        "18446744073709551616", // 2^64
        "1e400",
        "99999999999999999999999999999999999999",
        "18446744073709551615", // u64::MAX: parses, but over the limit
        "1099511627777",        // 2^40 + 1
        "true",
        "null",
        "[10]",
    ];
    let json = sample().to_json();
    for s in bad_sizes {
        let j = json.replacen("\"size\":10", &format!("\"size\":{s}"), 1);
        assert_ne!(j, json);
        assert!(RdmaMetadata::from_json(&j).is_err(), "size {s} accepted");
    }
    let err = err_text(edited(|v| v["descriptors"][0]["size"] = json!(u64::MAX)));
    assert!(
        err.contains("descriptor 0") && err.contains("limit"),
        "{err}"
    );
    // The limit itself is fine.
    let m = edited(|v| v["descriptors"][0]["size"] = json!(MAX_DESCRIPTOR_SIZE)).unwrap();
    check_accepted(&m);
    // "-0" is the integer zero to JSON; a size of 0 is allowed.
    let j = json.replacen("\"size\":10", "\"size\":-0", 1);
    if let Ok(m) = RdmaMetadata::from_json(&j) {
        assert_eq!(m.descriptors()[0].size, 0);
        check_accepted(&m);
    }
}

#[test]
fn total_size_is_bounded() {
    let at_limit = (MAX_TOTAL_SIZE / MAX_DESCRIPTOR_SIZE) as usize; // 256
    let m = RdmaMetadata::from_json(&with_descriptors(at_limit, MAX_DESCRIPTOR_SIZE)).unwrap();
    assert_eq!(m.total_size(), MAX_TOTAL_SIZE);
    check_accepted(&m);
    let over = with_descriptors(at_limit + 1, MAX_DESCRIPTOR_SIZE);
    let err = err_text(RdmaMetadata::from_json(&over));
    assert!(err.contains("add up to"), "{err}");
    // The most descriptors, each the largest: no overflow, a clean error.
    let most = with_list(&format!(
        "[{{\"device\":\"cpu\",\"size\":{MAX_DESCRIPTOR_SIZE},\"count\":{MAX_DESCRIPTORS}}}]"
    ));
    let err = err_text(RdmaMetadata::from_json(&most));
    assert!(err.contains("add up to"), "{err}");
}

#[test]
fn other_numbers_out_of_range_are_refused() {
    let cases: Vec<(&str, Value)> = vec![
        ("version", json!(-1)),
        ("version", json!(0)),
        ("version", json!(2)),
        ("version", json!(u32::MAX)),
        ("version", json!(u64::from(u32::MAX) + 1)),
        ("version", json!(1.0)),
        ("operation_kind", json!(0)),
        ("operation_kind", json!(3)),
        ("operation_kind", json!(255)),
        ("operation_kind", json!(256)),
        ("operation_kind", json!(-1)),
        ("operation_kind", json!("write")),
        ("operation_id", json!(-1)),
        ("operation_id", json!(1.5)),
        ("operation_id", json!("7")),
    ];
    for (field, value) in cases {
        assert!(
            edited(|v| v[field] = value.clone()).is_err(),
            "{field} = {value} accepted"
        );
    }
    // Every u64 is a valid operation id (unknown ids are the remote's business).
    check_accepted(&edited(|v| v["operation_id"] = json!(u64::MAX)).unwrap());
    check_accepted(&edited(|v| v["operation_id"] = json!(0)).unwrap());
}

// ---------------------------------------------------------------------------
// Counts.

/// The sample's JSON with `n` descriptors of `size` bytes, built as text
/// (building a `serde_json::Value` of that size would be the slow part).
fn with_descriptors(n: usize, size: u64) -> String {
    with_entries(n, |_| format!("{{\"device\":\"cpu\",\"size\":{size}}}"))
}

/// The sample's JSON with `n` descriptor entries made by `entry`.
fn with_entries(n: usize, entry: impl Fn(usize) -> String) -> String {
    let mut list = String::with_capacity(n * 32 + 2);
    list.push('[');
    for i in 0..n {
        if i > 0 {
            list.push(',');
        }
        list.push_str(&entry(i));
    }
    list.push(']');
    with_list(&list)
}

/// The sample's JSON with this descriptor list.
fn with_list(list: &str) -> String {
    let json = sample().to_json();
    let key = "\"descriptors\":";
    let start = json.find(key).unwrap() + key.len();
    let end = start + json[start..].find(']').unwrap() + 1;
    format!("{}{list}{}", &json[..start], &json[end..])
}

#[test]
fn huge_descriptor_counts_are_refused() {
    // Equal neighbours merge into one entry with a count.
    let m = RdmaMetadata::from_json(&with_descriptors(5000, 1)).unwrap();
    assert_eq!(
        m.descriptors(),
        &[DescriptorInfo::run(Device::CPU, 1, 5000)]
    );
    assert_eq!(m.descriptor_count(), 5000);
    check_accepted(&m);
    let run = |count: u64| {
        with_list(&format!(
            "[{{\"device\":\"cpu\",\"size\":1,\"count\":{count}}}]"
        ))
    };
    let m = RdmaMetadata::from_json(&run(MAX_DESCRIPTORS as u64)).unwrap();
    assert_eq!(m.descriptor_count(), MAX_DESCRIPTORS);
    assert!(m.to_json().len() < 1024, "a uniform list is one entry");
    check_accepted(&m);
    let err = err_text(RdmaMetadata::from_json(&run(MAX_DESCRIPTORS as u64 + 1)));
    assert!(err.contains(&format!("{}", MAX_DESCRIPTORS + 1)), "{err}");
    for count in [0, u64::from(u32::MAX) + 1, u64::MAX] {
        assert!(
            RdmaMetadata::from_json(&run(count)).is_err(),
            "count {count}"
        );
    }
    // Counts that overflow when added: a clean count error.
    let two = with_list(&format!(
        "[{{\"device\":\"cpu\",\"size\":1,\"count\":{m}}},{{\"device\":\"cpu\",\"size\":2,\"count\":{m}}}]",
        m = u32::MAX
    ));
    let err = err_text(RdmaMetadata::from_json(&two));
    assert!(err.contains("descriptors or more"), "{err}");
    // Entries that cannot merge: at most MAX_RUNS of them.
    let json = with_entries(120_000, |i| {
        format!("{{\"device\":\"cpu\",\"size\":{}}}", 1 + (i & 1))
    });
    assert!(json.len() < MAX_METADATA_JSON);
    let err = err_text(RdmaMetadata::from_json(&json));
    assert!(err.contains("120000 descriptor entries"), "{err}");
    // More than fit: refused by size before parsing.
    let json = with_descriptors(200_000, 1);
    assert!(matches!(
        RdmaMetadata::from_json(&json),
        Err(MetadataError::TooLarge { .. })
    ));
}

#[test]
fn address_lists_are_bounded_and_never_resolved() {
    let addrs = |n: usize| json!((0..n).map(|i| format!("10.0.0.{i}:80")).collect::<Vec<_>>());
    check_accepted(&edited(|v| v["addresses"] = addrs(MAX_ADDRESSES)).unwrap());
    let err = err_text(edited(|v| v["addresses"] = addrs(MAX_ADDRESSES + 1)));
    assert!(err.contains("addresses"), "{err}");
    // Names are not looked up (no DNS on parse); bad ports and junk are refused.
    for a in [
        "localhost:80",
        "example.com:443",
        "10.0.0.1",
        "10.0.0.1:65536",
        "10.0.0.1:-1",
        "::1:80",
        "",
        " 10.0.0.1:80",
    ] {
        let err = err_text(edited(|v| v["addresses"] = json!([a])));
        assert!(err.contains("ip:port"), "{a:?}: {err}");
    }
    let m = edited(|v| v["addresses"] = json!(["[::1]:80", "10.1.2.3:1"])).unwrap();
    assert_eq!(m.addresses()[0], "[::1]:80".parse::<SocketAddr>().unwrap());
    check_accepted(&m);
    // A huge address is quoted in the error only in part.
    let long = "9".repeat(100_000);
    let err = err_text(edited(|v| v["addresses"] = json!([long])));
    assert!(err.len() < 400, "error of {} bytes", err.len());
}

#[test]
fn names_are_bounded_in_bytes() {
    for field in ["worker_id", "hostname", "host_id"] {
        check_accepted(&edited(|v| v[field] = json!("w".repeat(256))).unwrap());
        let err = err_text(edited(|v| v[field] = json!("w".repeat(257))));
        assert!(err.contains(field), "{err}");
        // 129 two-byte characters: 258 bytes.
        assert!(edited(|v| v[field] = json!("é".repeat(129))).is_err());
        assert!(edited(|v| v[field] = json!("")).is_err());
        assert!(edited(|v| v[field] = json!("x".repeat(1 << 20))).is_err());
    }
}

// ---------------------------------------------------------------------------
// Nesting.

#[test]
fn deeply_nested_json_is_refused_without_deep_recursion() {
    // Run on a small stack: the parser's recursion limit, not luck, must
    // stop the descent.
    std::thread::Builder::new()
        .stack_size(512 * 1024)
        .spawn(|| {
            let depth = 100_000;
            let arrays = format!("{}{}", "[".repeat(depth), "]".repeat(depth));
            assert!(RdmaMetadata::from_json(&arrays).is_err());
            let objects = format!("{}1{}", "{\"a\":".repeat(depth), "}".repeat(depth));
            assert!(RdmaMetadata::from_json(&objects).is_err());
            let unclosed = "[".repeat(depth);
            assert!(RdmaMetadata::from_json(&unclosed).is_err());
            // Deep values inside fields, where a string or number is expected
            // and where an unknown field would be skipped by a laxer parser.
            for field in ["worker_id", "token", "descriptors", "extra", "transports"] {
                let mut v = sample_value();
                v.as_object_mut().unwrap().remove(field);
                let json = v.to_string();
                let with = format!("{},\"{field}\":{arrays}}}", &json[..json.len() - 1]);
                assert!(RdmaMetadata::from_json(&with).is_err(), "{field}");
            }
            let json = sample().to_json();
            let deep_desc = json.replacen("\"size\":10", &format!("\"size\":{objects}"), 1);
            assert!(RdmaMetadata::from_json(&deep_desc).is_err());
            // And where a transport blob is expected.
            let deep_blob = format!(
                "{},\"transports\":{{\"tcp\":{arrays}}}}}",
                &json[..json.len() - 1]
            );
            assert!(RdmaMetadata::from_json(&deep_blob).is_err());
        })
        .unwrap()
        .join()
        .expect("parsing deep JSON stays within a 512 KiB stack");
}

// ---------------------------------------------------------------------------
// Transport blobs.

#[test]
fn transport_blobs_are_optional_and_bounded() {
    // Absent, empty or null: no blobs, and none written back.
    check_accepted(&sample());
    for t in [json!({}), Value::Null] {
        let m = edited(|v| v["transports"] = t.clone()).unwrap();
        assert_eq!(m, sample(), "{t}");
        assert!(!m.to_json().contains("transports"));
    }
    // The most entries, each the longest name and the largest blob: about
    // 130 KiB of JSON, well within MAX_METADATA_JSON.
    let full = |n: usize, blob: usize| -> Value {
        let map: serde_json::Map<String, Value> = (0..n)
            .map(|i| {
                let name = format!("{:a<32}", format!("t{i}"));
                (name, json!("ab".repeat(blob)))
            })
            .collect();
        Value::Object(map)
    };
    let m = edited(|v| {
        v["transports"] = full(
            RdmaMetadata::MAX_TRANSPORTS,
            RdmaMetadata::MAX_TRANSPORT_BLOB,
        )
    })
    .unwrap();
    assert_eq!(m.transport_blobs().count(), RdmaMetadata::MAX_TRANSPORTS);
    assert!(m.to_json().len() < 140_000, "{}", m.to_json().len());
    check_accepted(&m);
    let err = err_text(edited(|v| {
        v["transports"] = full(RdmaMetadata::MAX_TRANSPORTS + 1, 1)
    }));
    assert!(err.contains("17 entries"), "{err}");
    let err = err_text(edited(|v| {
        v["transports"] = full(1, RdmaMetadata::MAX_TRANSPORT_BLOB + 1)
    }));
    assert!(err.contains("4097 bytes"), "{err}");
    // As many entries as fit in the size limit: refused after the 17th.
    let many: String = (0..200_000)
        .map(|i| format!("\"t{i}\":\"\""))
        .collect::<Vec<_>>()
        .join(",");
    let json = sample().to_json();
    let json = format!("{},\"transports\":{{{many}}}}}", &json[..json.len() - 1]);
    assert!(json.len() < MAX_METADATA_JSON);
    let err = err_text(RdmaMetadata::from_json(&json));
    assert!(err.contains("17 entries"), "{err}");
    // One blob as large as the input may be: refused by its length.
    let json = sample().to_json();
    let huge = format!(
        "{},\"transports\":{{\"tcp\":\"{}\"}}}}",
        &json[..json.len() - 1],
        "0".repeat(MAX_METADATA_JSON - json.len() - 100)
    );
    assert!(huge.len() <= MAX_METADATA_JSON);
    let err = err_text(RdmaMetadata::from_json(&huge));
    assert!(err.contains("more than the limit of 4096"), "{err}");
    assert!(err.len() < 400, "error of {} bytes", err.len());
}

#[test]
fn transport_names_and_blobs_are_checked() {
    for name in ["", "TCP", "9p", "-x", "a b", "a.b", "é", "a\u{0}", "tcp\n"] {
        let err = err_text(edited(|v| v["transports"] = json!({ name: "00" })));
        assert!(err.contains("transports: name"), "{name:?}: {err}");
    }
    let long = "a".repeat(100_000);
    let err = err_text(edited(|v| v["transports"] = json!({ long: "00" })));
    assert!(err.len() < 400, "error of {} bytes", err.len());
    for blob in ["0", "000", "0x00", "+f", "-1", "zz", " 00", "00 ", "éé"] {
        let err = err_text(edited(|v| v["transports"] = json!({ "tcp": blob })));
        assert!(err.contains("hexadecimal"), "{blob:?}: {err}");
    }
    for bad in [json!(1), json!(true), json!([]), json!({}), Value::Null] {
        let err = err_text(edited(|v| v["transports"] = json!({ "tcp": bad })));
        assert!(err.contains("invalid type"), "{bad}: {err}");
    }
    for bad in [json!(1), json!("tcp"), json!([["tcp", "00"]])] {
        let err = err_text(edited(|v| v["transports"] = bad.clone()));
        assert!(err.contains("invalid type"), "{bad}: {err}");
    }
    // Upper-case digits are the same blob; the name is not case-folded.
    let m = edited(|v| v["transports"] = json!({ "tcp": "DEADbeef" })).unwrap();
    assert_eq!(m.transport_blob("tcp"), Some(&[0xde, 0xad, 0xbe, 0xef][..]));
    assert!(m.to_json().contains("\"tcp\":\"deadbeef\""));
    check_accepted(&m);
    // The same name twice is refused, not collapsed.
    let json = sample().to_json();
    let dup = format!(
        "{},\"transports\":{{\"tcp\":\"00\",\"udp\":\"\",\"tcp\":\"00\"}}}}",
        &json[..json.len() - 1]
    );
    let err = err_text(RdmaMetadata::from_json(&dup));
    assert!(err.contains("appears twice"), "{err}");
}

#[test]
fn unknown_transport_names_survive_a_round_trip() {
    let m = edited(|v| v["transports"] = json!({ "z-future": "0102", "tcp": "", "a_9": "ff" }))
        .unwrap();
    check_accepted(&m);
    let json = m.to_json();
    assert!(
        json.ends_with(r#""transports":{"a_9":"ff","tcp":"","z-future":"0102"}}"#),
        "{json}"
    );
    assert_eq!(m.transport_blob("tcp"), Some(&[][..]));
    assert_eq!(m.transport_blob("Z-FUTURE"), None);
}

// ---------------------------------------------------------------------------
// Tokens.

#[test]
fn tokens_must_be_32_hex_digits() {
    for t in [
        "",
        "0",
        &TOKEN_HEX[..31],
        &format!("{TOKEN_HEX}0"),
        "0123456789abcdef0123456789abcdeg",
        " 123456789abcdef0123456789abcdef",
        "0x23456789abcdef0123456789abcdef",
        // 32 bytes, but not 32 ASCII digits.
        &"é".repeat(16),
    ] {
        let err = err_text(edited(|v| v["token"] = json!(t)));
        assert!(err.contains("token"), "{t:?}: {err}");
    }
    for bad in [json!(12), json!([1, 2]), json!({"hex": TOKEN_HEX})] {
        assert!(edited(|v| v["token"] = bad.clone()).is_err(), "{bad}");
    }
    // Upper-case digits are the same token.
    let m = edited(|v| v["token"] = json!(TOKEN_HEX.to_uppercase())).unwrap();
    assert_eq!(m.token(), sample().token());
}

#[test]
fn tokens_with_sign_characters_are_refused() {
    // "+f" is not two hexadecimal digits, but u8::from_str_radix("+f", 16) is 15.
    let signed = "+f".repeat(16);
    let r = edited(|v| v["token"] = json!(signed));
    assert!(
        matches!(r, Err(ref e) if e.to_string().contains("token")),
        "{r:?}"
    );
}

#[test]
fn errors_never_quote_the_token() {
    type Edit = Box<dyn Fn(&mut Value)>;
    let edits: Vec<Edit> = vec![
        Box::new(|v| v["version"] = json!(2)),
        Box::new(|v| v["operation_kind"] = json!(9)),
        Box::new(|v| v["addresses"] = json!(["nowhere"])),
        Box::new(|v| v["descriptors"] = json!([])),
        Box::new(|v| v["descriptors"][0]["size"] = json!(u64::MAX)),
        Box::new(|v| v["descriptors"][0]["device"] = json!("tpu")),
        Box::new(|v| v["worker_id"] = json!("")),
        Box::new(|v| v["extra"] = json!(1)),
    ];
    for f in edits {
        let err = err_text(edited(f));
        assert!(!err.contains(TOKEN_HEX), "{err}");
    }
    // A malformed token is not echoed either.
    let near = format!("{}zz", &TOKEN_HEX[..30]);
    let err = err_text(edited(|v| v["token"] = json!(near)));
    assert!(!err.contains(&near[..30]), "{err}");
}

// ---------------------------------------------------------------------------
// Properties.

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>().prop_map(Value::from),
        ".{0,40}".prop_map(Value::from),
        Just(json!(TOKEN_HEX)),
        Just(json!("cpu")),
        Just(json!("127.0.0.1:1")),
        Just(json!({"device": "cpu", "size": 1})),
        Just(json!({"tcp": "00ff"})),
        "[0-9a-fA-F]{0,12}".prop_map(Value::from),
    ];
    leaf.prop_recursive(4, 64, 8, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..8).prop_map(Value::from),
            proptest::collection::btree_map("[a-z_]{1,12}", inner, 0..8)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

const FIELDS: [&str; 11] = [
    "version",
    "operation_kind",
    "worker_id",
    "hostname",
    "host_id",
    "addresses",
    "operation_id",
    "token",
    "descriptors",
    "transports",
    "unknown",
];

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Any JSON value in any field (or in a descriptor): an error, or
    /// metadata that obeys every limit.
    #[test]
    fn any_value_in_any_field(field in 0..FIELDS.len(), in_desc in any::<bool>(),
                              value in json_value()) {
        let mut v = sample_value();
        if in_desc {
            let key = ["device", "size", "other"][field % 3];
            v["descriptors"][0][key] = value;
        } else {
            v[FIELDS[field]] = value;
        }
        if let Ok(m) = parse(&v) {
            check_accepted(&m);
        }
    }

    /// Random edits of valid JSON bytes: an error, or metadata within limits.
    #[test]
    fn mutated_json_bytes(edits in proptest::collection::vec((any::<u16>(), any::<u8>(), 0u8..3), 1..8)) {
        let mut b = sample().to_json().into_bytes();
        for (pos, byte, op) in edits {
            let i = pos as usize % (b.len() + 1);
            match op {
                0 if i < b.len() => b[i] = byte,
                1 => b.insert(i, byte),
                _ if i < b.len() => { b.remove(i); }
                _ => {}
            }
        }
        if let Ok(m) = RdmaMetadata::from_json_bytes(&b) {
            check_accepted(&m);
        }
    }

    /// A descriptor size is accepted exactly when it is within the limit.
    #[test]
    fn size_limit_is_exact(size in prop_oneof![any::<u64>(), 0..=MAX_DESCRIPTOR_SIZE,
                                               MAX_DESCRIPTOR_SIZE - 8..MAX_DESCRIPTOR_SIZE + 8]) {
        let r = edited(|v| v["descriptors"][0]["size"] = json!(size));
        prop_assert_eq!(r.is_ok(), size <= MAX_DESCRIPTOR_SIZE, "size {}", size);
        if let Ok(m) = r {
            prop_assert_eq!(m.descriptors()[0].size, size);
        }
    }

    /// Negative numbers are refused wherever an unsigned one is expected.
    #[test]
    fn negative_numbers_are_refused(n in i64::MIN..0, field in 0..4usize) {
        let r = edited(|v| match field {
            0 => v["descriptors"][0]["size"] = json!(n),
            1 => v["operation_id"] = json!(n),
            2 => v["version"] = json!(n),
            _ => v["operation_kind"] = json!(n),
        });
        prop_assert!(r.is_err());
    }

    /// Any JSON value as a transport blob, under any name: an error, or
    /// metadata within limits whose blob is what the digits say.
    #[test]
    fn any_value_in_transports(name in "[a-z][a-z0-9_-]{0,33}|[ -~]{0,6}|.{0,4}",
                               value in json_value()) {
        if let Ok(m) = edited(|v| v["transports"] = json!({ name.clone(): value.clone() })) {
            check_accepted(&m);
            prop_assert!(is_transport_name(&name));
            let hex = value.as_str().expect("only a string is a blob");
            prop_assert_eq!(m.transport_blob(&name).map(<[u8]>::len), Some(hex.len() / 2));
        }
    }

    /// A name is accepted exactly when it is 1 to 32 bytes of `[a-z][a-z0-9_-]*`.
    #[test]
    fn transport_names_are_checked_exactly(name in "[a-z][a-z0-9_-]{0,33}|[ -~]{0,34}|.{0,8}") {
        let r = edited(|v| v["transports"] = json!({ name.clone(): "0a" }));
        prop_assert_eq!(r.is_ok(), is_transport_name(&name), "{:?}", name);
        if let Ok(m) = r {
            prop_assert_eq!(m.transport_blob(&name), Some(&[10u8][..]));
        }
    }

    /// Any 32 hexadecimal digits, in either case, are a token; the token
    /// survives a round trip in canonical (lower-case) form.
    #[test]
    fn hex_tokens_round_trip(t in "[0-9a-fA-F]{32}") {
        let m = edited(|v| v["token"] = json!(t)).unwrap();
        prop_assert_eq!(m.to_json().contains(&t.to_lowercase()), true);
        check_accepted(&m);
    }

    /// Strings that are not exactly 32 hexadecimal digits are not tokens.
    #[test]
    fn non_hex_tokens_are_refused(t in "[0-9a-fA-F]{0,31}|[0-9a-fA-F]{33,40}|[0-9a-f]{0,31}[g-z ._-][0-9a-f]{0,31}") {
        prop_assume!(!(t.len() == 32 && t.bytes().all(|b| b.is_ascii_hexdigit())));
        prop_assert!(edited(|v| v["token"] = json!(t)).is_err());
    }
}
