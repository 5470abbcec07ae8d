use std::fmt;
use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

use crate::{Device, OperationKind};

/// The metadata format this build writes and reads.
pub const METADATA_VERSION: u32 = 1;
/// The most descriptors one operation may have.
pub const MAX_DESCRIPTORS: usize = 16_384;
/// The most addresses metadata may list.
pub const MAX_ADDRESSES: usize = 16;
/// The longest metadata JSON that is parsed at all.
pub const MAX_METADATA_JSON: usize = 4 << 20;
/// The largest single descriptor (1 TiB).
pub const MAX_DESCRIPTOR_SIZE: u64 = 1 << 40;
/// The largest total size of one operation (256 TiB).
pub const MAX_TOTAL_SIZE: u64 = 1 << 48;
const MAX_NAME: usize = 256;

/// An unguessable 128-bit capability for one operation.
///
/// Its `Debug` and `Display` never print the secret.
#[derive(Clone, Copy)]
pub struct Token([u8; 16]);

impl Token {
    /// A token with these bytes (the caller draws them from a secure RNG).
    pub const fn from_bytes(b: [u8; 16]) -> Self {
        Token(b)
    }

    /// The secret bytes.
    pub const fn as_bytes(&self) -> &[u8; 16] {
        &self.0
    }

    /// Compares in time that does not depend on where the tokens differ.
    pub fn ct_eq(&self, other: &Token) -> bool {
        self.0
            .iter()
            .zip(other.0.iter())
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0
    }

    fn to_hex(self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }

    fn from_hex(s: &str) -> Option<Token> {
        // Only hexadecimal digits: `from_str_radix` alone would accept a sign.
        if s.len() != 32 || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        let mut out = [0u8; 16];
        for (i, o) in out.iter_mut().enumerate() {
            *o = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok()?;
        }
        Some(Token(out))
    }
}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Token(<redacted>)")
    }
}

/// What metadata says about one remote descriptor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DescriptorInfo {
    /// Where the memory lives.
    pub device: Device,
    /// Its length in bytes.
    pub size: u64,
}

/// Why metadata was refused. Every variant says which field is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum MetadataError {
    /// Not JSON, or JSON of the wrong shape (missing, unknown or mistyped fields).
    #[error("metadata is not valid RdmaMetadata JSON: {0}")]
    Json(String),
    /// The JSON is larger than [`MAX_METADATA_JSON`].
    #[error("metadata JSON is {len} bytes, more than the limit of {MAX_METADATA_JSON}")]
    TooLarge {
        /// Its length.
        len: usize,
    },
    /// Written by a Ferry with another metadata format.
    #[error("metadata format version {found} is not supported (this build reads version {METADATA_VERSION}); upgrade both workers to the same Ferry")]
    UnsupportedVersion {
        /// The version found.
        found: u32,
    },
    /// `operation_kind` is not 1 (READ) or 2 (WRITE).
    #[error("operation_kind {0} is invalid: expected 1 (READ) or 2 (WRITE)")]
    InvalidKind(u8),
    /// The descriptor list is empty.
    #[error("metadata lists no descriptors")]
    NoDescriptors,
    /// More than [`MAX_DESCRIPTORS`] descriptors.
    #[error("metadata lists {0} descriptors, more than the limit of {MAX_DESCRIPTORS}")]
    TooManyDescriptors(usize),
    /// One descriptor is larger than 1 TiB.
    #[error(
        "descriptor {index} has size {size}, more than the limit of {MAX_DESCRIPTOR_SIZE} bytes"
    )]
    DescriptorTooLarge {
        /// Which descriptor.
        index: usize,
        /// Its size.
        size: u64,
    },
    /// The sizes add up to more than 256 TiB.
    #[error("the descriptors add up to more than {MAX_TOTAL_SIZE} bytes")]
    TotalTooLarge,
    /// `token` is not 32 hexadecimal digits.
    #[error("token is not 32 hexadecimal digits")]
    InvalidToken,
    /// No address to reach the worker at.
    #[error("metadata lists no address")]
    NoAddress,
    /// Too many addresses.
    #[error("metadata lists {0} addresses, more than the limit of {MAX_ADDRESSES}")]
    TooManyAddresses(usize),
    /// An address is not `ip:port`.
    #[error("address {0:?} is not of the form ip:port")]
    InvalidAddress(String),
    /// A name field is empty or too long.
    #[error("field {field} must be 1 to {MAX_NAME} characters long")]
    BadName {
        /// Which field.
        field: &'static str,
    },
}

/// What a passive operation hands to its remote, through any side channel, so
/// that the remote can read or write the exposed memory.
///
/// It is a capability: whoever holds it may touch the described bytes of this
/// one operation until the operation ends. Its `Debug` output hides the token;
/// treat its JSON like a password.
///
/// ```
/// # use ferry_proto::RdmaMetadata;
/// let err = RdmaMetadata::from_json("{\"version\": 1}").unwrap_err();
/// assert!(err.to_string().contains("missing field"));
/// ```
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "RawMetadata", into = "RawMetadata")]
pub struct RdmaMetadata {
    kind: OperationKind,
    worker_id: String,
    hostname: String,
    host_id: String,
    addresses: Vec<SocketAddr>,
    operation_id: u64,
    token: Token,
    descriptors: Vec<DescriptorInfo>,
    process_id: Option<String>,
}

impl PartialEq for Token {
    fn eq(&self, other: &Self) -> bool {
        self.ct_eq(other)
    }
}
impl Eq for Token {}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawMetadata {
    version: u32,
    operation_kind: u8,
    worker_id: String,
    hostname: String,
    host_id: String,
    addresses: Vec<String>,
    operation_id: u64,
    token: String,
    descriptors: Vec<DescriptorInfo>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    process_id: Option<String>,
}

fn check_name(s: &str, field: &'static str) -> Result<(), MetadataError> {
    if s.is_empty() || s.len() > MAX_NAME {
        return Err(MetadataError::BadName { field });
    }
    Ok(())
}

impl TryFrom<RawMetadata> for RdmaMetadata {
    type Error = MetadataError;

    fn try_from(r: RawMetadata) -> Result<Self, MetadataError> {
        if r.version != METADATA_VERSION {
            return Err(MetadataError::UnsupportedVersion { found: r.version });
        }
        let kind = OperationKind::from_u8(r.operation_kind)
            .ok_or(MetadataError::InvalidKind(r.operation_kind))?;
        let token = Token::from_hex(&r.token).ok_or(MetadataError::InvalidToken)?;
        if r.addresses.is_empty() {
            return Err(MetadataError::NoAddress);
        }
        if r.addresses.len() > MAX_ADDRESSES {
            return Err(MetadataError::TooManyAddresses(r.addresses.len()));
        }
        let addresses = r
            .addresses
            .iter()
            .map(|a| {
                a.parse::<SocketAddr>()
                    .map_err(|_| MetadataError::InvalidAddress(a.chars().take(64).collect()))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let m = RdmaMetadata::new(
            kind,
            r.worker_id,
            r.hostname,
            r.host_id,
            addresses,
            r.operation_id,
            token,
            r.descriptors,
        )?;
        match r.process_id {
            Some(p) => m.with_process_id(p),
            None => Ok(m),
        }
    }
}

impl From<RdmaMetadata> for RawMetadata {
    fn from(m: RdmaMetadata) -> Self {
        RawMetadata {
            version: METADATA_VERSION,
            operation_kind: m.kind.as_u8(),
            worker_id: m.worker_id,
            hostname: m.hostname,
            host_id: m.host_id,
            addresses: m.addresses.iter().map(|a| a.to_string()).collect(),
            operation_id: m.operation_id,
            token: m.token.to_hex(),
            descriptors: m.descriptors,
            process_id: m.process_id,
        }
    }
}

impl RdmaMetadata {
    /// Builds metadata, checking every field as [`from_json`](Self::from_json) does.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        kind: OperationKind,
        worker_id: String,
        hostname: String,
        host_id: String,
        addresses: Vec<SocketAddr>,
        operation_id: u64,
        token: Token,
        descriptors: Vec<DescriptorInfo>,
    ) -> Result<Self, MetadataError> {
        check_name(&worker_id, "worker_id")?;
        check_name(&hostname, "hostname")?;
        check_name(&host_id, "host_id")?;
        if addresses.is_empty() {
            return Err(MetadataError::NoAddress);
        }
        if addresses.len() > MAX_ADDRESSES {
            return Err(MetadataError::TooManyAddresses(addresses.len()));
        }
        if descriptors.is_empty() {
            return Err(MetadataError::NoDescriptors);
        }
        if descriptors.len() > MAX_DESCRIPTORS {
            return Err(MetadataError::TooManyDescriptors(descriptors.len()));
        }
        let mut total = 0u64;
        for (index, d) in descriptors.iter().enumerate() {
            if d.size > MAX_DESCRIPTOR_SIZE {
                return Err(MetadataError::DescriptorTooLarge {
                    index,
                    size: d.size,
                });
            }
            total += d.size; // cannot overflow: at most 2^14 terms of at most 2^40
        }
        if total > MAX_TOTAL_SIZE {
            return Err(MetadataError::TotalTooLarge);
        }
        Ok(RdmaMetadata {
            kind,
            worker_id,
            hostname,
            host_id,
            addresses,
            operation_id,
            token,
            descriptors,
            process_id: None,
        })
    }

    /// Names the process that exposed the memory (an opaque random id), so
    /// that a connector in the same process can move the bytes with a plain
    /// copy.
    pub fn with_process_id(mut self, id: String) -> Result<Self, MetadataError> {
        check_name(&id, "process_id")?;
        self.process_id = Some(id);
        Ok(self)
    }

    /// The exposing process's id, if the metadata names it.
    pub fn process_id(&self) -> Option<&str> {
        self.process_id.as_deref()
    }

    /// Parses and validates metadata JSON.
    pub fn from_json(json: &str) -> Result<Self, MetadataError> {
        Self::from_json_bytes(json.as_bytes())
    }

    /// Parses and validates metadata JSON given as bytes.
    pub fn from_json_bytes(json: &[u8]) -> Result<Self, MetadataError> {
        if json.len() > MAX_METADATA_JSON {
            return Err(MetadataError::TooLarge { len: json.len() });
        }
        serde_json::from_slice(json).map_err(|e| {
            // serde_json wraps our own validation errors in its message; keep
            // the message, it already says which field is wrong.
            MetadataError::Json(e.to_string())
        })
    }

    /// The JSON form, to hand to the remote worker.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("metadata always serializes")
    }

    /// What the remote may do: READ for a readable, WRITE for a writable.
    pub fn kind(&self) -> OperationKind {
        self.kind
    }
    /// The id of the worker that exposed the memory.
    pub fn worker_id(&self) -> &str {
        &self.worker_id
    }
    /// The host name of that worker (informational).
    pub fn hostname(&self) -> &str {
        &self.hostname
    }
    /// An identity of that worker's host (kernel boot id), used to detect same-host peers.
    pub fn host_id(&self) -> &str {
        &self.host_id
    }
    /// Where the worker listens.
    pub fn addresses(&self) -> &[SocketAddr] {
        &self.addresses
    }
    /// The operation's number within its connector.
    pub fn operation_id(&self) -> u64 {
        self.operation_id
    }
    /// The capability token.
    pub fn token(&self) -> &Token {
        &self.token
    }
    /// The exposed descriptors.
    pub fn descriptors(&self) -> &[DescriptorInfo] {
        &self.descriptors
    }
    /// The total number of exposed bytes.
    pub fn total_size(&self) -> u64 {
        self.descriptors.iter().map(|d| d.size).sum()
    }

    /// Replaces the addresses (e.g. after a NAT or port forward). Checked as on parse.
    pub fn with_addresses(mut self, addresses: Vec<SocketAddr>) -> Result<Self, MetadataError> {
        if addresses.is_empty() {
            return Err(MetadataError::NoAddress);
        }
        if addresses.len() > MAX_ADDRESSES {
            return Err(MetadataError::TooManyAddresses(addresses.len()));
        }
        self.addresses = addresses;
        Ok(self)
    }
}

impl fmt::Debug for RdmaMetadata {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RdmaMetadata")
            .field("kind", &self.kind)
            .field("worker_id", &self.worker_id)
            .field("hostname", &self.hostname)
            .field("addresses", &self.addresses)
            .field("operation_id", &self.operation_id)
            .field("token", &self.token)
            .field("descriptors", &self.descriptors.len())
            .field("total_size", &self.total_size())
            .finish()
    }
}

#[cfg(test)]
mod tests {
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
                DescriptorInfo {
                    device: Device::CPU,
                    size: 10,
                },
                DescriptorInfo {
                    device: Device::CPU,
                    size: 0,
                },
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
                sizes.iter().map(|&size| DescriptorInfo { device: Device::CPU, size }).collect(),
            ).unwrap();
            prop_assert_eq!(RdmaMetadata::from_json(&m.to_json()).unwrap(), m);
        }
    }
}
