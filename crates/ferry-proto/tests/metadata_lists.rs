//! Hostile metadata JSON, lists and blobs: descriptor entries and their
//! counts, address lists, names, and per-transport blobs. The rest of the
//! hostile input (size, shape, numbers, nesting, tokens) is in
//! `metadata_input.rs`.

#[path = "support/metadata_sample.rs"]
mod metadata_sample;

use ferry_proto::{
    DescriptorInfo, Device, MetadataError, RdmaMetadata, MAX_ADDRESSES, MAX_DESCRIPTORS,
    MAX_METADATA_JSON,
};
use metadata_sample::*;
use serde_json::{json, Value};
use std::net::SocketAddr;

// ---------------------------------------------------------------------------
// Counts.

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
