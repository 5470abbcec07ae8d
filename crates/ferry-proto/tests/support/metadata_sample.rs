//! Shared by the hostile-metadata tests: a sample, ways to edit it, and
//! the check that accepted metadata obeys every documented limit.
#![allow(dead_code)] // each test binary uses a part of it

use ferry_proto::{
    DescriptorInfo, Device, MetadataError, OperationKind, RdmaMetadata, Token, MAX_ADDRESSES,
    MAX_DESCRIPTORS,
};
use serde_json::Value;
/// The largest single descriptor (`metadata::MAX_DESCRIPTOR_SIZE`, not exported).
pub const MAX_DESCRIPTOR_SIZE: u64 = 1 << 40;
/// The largest total (`metadata::MAX_TOTAL_SIZE`, not exported).
pub const MAX_TOTAL_SIZE: u64 = 1 << 48;
pub const TOKEN_HEX: &str = "0123456789abcdef0123456789abcdef";

pub fn sample() -> RdmaMetadata {
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

pub fn sample_value() -> Value {
    serde_json::from_str(&sample().to_json()).unwrap()
}

pub fn parse(v: &Value) -> Result<RdmaMetadata, MetadataError> {
    RdmaMetadata::from_json(&v.to_string())
}

pub fn edited(f: impl FnOnce(&mut Value)) -> Result<RdmaMetadata, MetadataError> {
    let mut v = sample_value();
    f(&mut v);
    parse(&v)
}

/// Every limit holds for metadata that parsed, and it survives a round trip.
pub fn check_accepted(m: &RdmaMetadata) {
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
pub fn is_transport_name(name: &str) -> bool {
    let b = name.as_bytes();
    (1..=RdmaMetadata::MAX_TRANSPORT_NAME).contains(&b.len())
        && b[0].is_ascii_lowercase()
        && b.iter()
            .all(|&c| matches!(c, b'a'..=b'z' | b'0'..=b'9' | b'_' | b'-'))
}

pub fn err_text(r: Result<RdmaMetadata, MetadataError>) -> String {
    match r {
        Ok(m) => panic!("accepted: {m:?}"),
        Err(e) => e.to_string(),
    }
}

/// The sample's JSON with `n` descriptors of `size` bytes, built as text
/// (building a `serde_json::Value` of that size would be the slow part).
pub fn with_descriptors(n: usize, size: u64) -> String {
    with_entries(n, |_| format!("{{\"device\":\"cpu\",\"size\":{size}}}"))
}

/// The sample's JSON with `n` descriptor entries made by `entry`.
pub fn with_entries(n: usize, entry: impl Fn(usize) -> String) -> String {
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
pub fn with_list(list: &str) -> String {
    let json = sample().to_json();
    let key = "\"descriptors\":";
    let start = json.find(key).unwrap() + key.len();
    let end = start + json[start..].find(']').unwrap() + 1;
    format!("{}{list}{}", &json[..start], &json[end..])
}
