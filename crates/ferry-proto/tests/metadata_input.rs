//! Hostile metadata JSON: too large, unknown or duplicated fields, negative
//! and huge numbers, deep nesting, tokens, odd encodings (descriptor
//! counts, addresses, names and transport blobs: `metadata_lists.rs`).
//! Complements the unit tests in `src/metadata/tests.rs`.
//!
//! Whatever the input, parsing returns a typed error or metadata that obeys
//! every documented limit, and never panics or recurses without bound.

use ferry_proto::{MetadataError, RdmaMetadata, MAX_DESCRIPTORS, MAX_METADATA_JSON};
use proptest::prelude::*;
use serde_json::{json, Value};

#[path = "support/metadata_sample.rs"]
mod metadata_sample;

use metadata_sample::*;

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
