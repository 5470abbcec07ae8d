use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;

use serde::de::{MapAccess, Visitor};
use serde::ser::SerializeMap;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

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
/// The most transport blobs metadata may carry ([`RdmaMetadata::MAX_TRANSPORTS`]).
const MAX_TRANSPORTS: usize = 16;
/// The longest transport name, in bytes ([`RdmaMetadata::MAX_TRANSPORT_NAME`]).
const MAX_TRANSPORT_NAME: usize = 32;
/// The largest transport blob, in bytes ([`RdmaMetadata::MAX_TRANSPORT_BLOB`]).
const MAX_TRANSPORT_BLOB: usize = 4096;

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
    /// A transport name is not 1 to [`RdmaMetadata::MAX_TRANSPORT_NAME`]
    /// bytes of `[a-z][a-z0-9_-]*`.
    #[error(
        "transports: name {0:?} is not 1 to {MAX_TRANSPORT_NAME} characters of [a-z][a-z0-9_-]*"
    )]
    BadTransportName(
        /// The name (its first 64 characters).
        String,
    ),
    /// More than [`RdmaMetadata::MAX_TRANSPORTS`] transport blobs.
    #[error("transports: {0} entries, more than the limit of {MAX_TRANSPORTS}")]
    TooManyTransports(
        /// How many (at least: a parse stops counting one past the limit).
        usize,
    ),
    /// A transport blob is larger than [`RdmaMetadata::MAX_TRANSPORT_BLOB`].
    #[error("transports: the blob of {name:?} is {len} bytes, more than the limit of {MAX_TRANSPORT_BLOB}")]
    TransportBlobTooLarge {
        /// The transport's name.
        name: String,
        /// The blob's length in bytes (at least; half its hex digits, rounded up).
        len: usize,
    },
    /// A transport blob is not an even number of hexadecimal digits.
    #[error("transports: the blob of {0:?} is not an even number of hexadecimal digits")]
    InvalidTransportBlob(
        /// The transport's name.
        String,
    ),
    /// The same transport name twice.
    #[error("transports: name {0:?} appears twice")]
    DuplicateTransport(
        /// The name.
        String,
    ),
}

/// What a passive operation hands to its remote, through any side channel, so
/// that the remote can read or write the exposed memory.
///
/// It is a capability: whoever holds it may touch the described bytes of this
/// one operation until the operation ends. Its `Debug` output hides the token;
/// treat its JSON like a password.
///
/// Besides the fields every transport reads, metadata may carry one opaque
/// blob per transport, under the transport's name (`"transports"` in the
/// JSON, a map from name to hexadecimal digits; absent when there is none,
/// so metadata without blobs is exactly the version-1 JSON it always was).
/// A reader asks for the names it knows
/// ([`transport_blob`](Self::transport_blob)) and ignores the others, which
/// still survive a parse and [`to_json`](Self::to_json) unchanged. Limits:
/// at most [`MAX_TRANSPORTS`](Self::MAX_TRANSPORTS) (16) blobs, each at most
/// [`MAX_TRANSPORT_BLOB`](Self::MAX_TRANSPORT_BLOB) (4 KiB) long, under names
/// of 1 to [`MAX_TRANSPORT_NAME`](Self::MAX_TRANSPORT_NAME) (32) characters
/// of `[a-z][a-z0-9_-]*`, each name once.
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
    transports: BTreeMap<String, Vec<u8>>,
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
    #[serde(default, skip_serializing_if = "Option::is_none")]
    transports: Option<RawTransports>,
}

/// The `transports` map as it appears in the JSON: names and hexadecimal
/// blobs, in the order given, duplicates kept (so that they can be refused;
/// a plain map would keep the last one silently).
struct RawTransports(Vec<(String, String)>);

impl Serialize for RawTransports {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(self.0.len()))?;
        for (name, hex) in &self.0 {
            map.serialize_entry(name, hex)?;
        }
        map.end()
    }
}

impl<'de> Deserialize<'de> for RawTransports {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = RawTransports;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a map from transport name to hexadecimal string")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut a: A) -> Result<RawTransports, A::Error> {
                let mut out = Vec::new();
                while let Some((name, hex)) = a.next_entry::<String, String>()? {
                    if out.len() == MAX_TRANSPORTS {
                        // Stop at once rather than collect what will be refused.
                        return Err(serde::de::Error::custom(MetadataError::TooManyTransports(
                            MAX_TRANSPORTS + 1,
                        )));
                    }
                    out.push((name, hex));
                }
                Ok(RawTransports(out))
            }
        }
        d.deserialize_map(V)
    }
}

fn check_name(s: &str, field: &'static str) -> Result<(), MetadataError> {
    if s.is_empty() || s.len() > MAX_NAME {
        return Err(MetadataError::BadName { field });
    }
    Ok(())
}

/// A transport name: 1 to 32 bytes of `[a-z][a-z0-9_-]*`.
fn check_transport_name(name: &str) -> Result<(), MetadataError> {
    let b = name.as_bytes();
    let ok = (1..=MAX_TRANSPORT_NAME).contains(&b.len())
        && b[0].is_ascii_lowercase()
        && b[1..]
            .iter()
            .all(|&c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'_' || c == b'-');
    if !ok {
        return Err(MetadataError::BadTransportName(quote(name)));
    }
    Ok(())
}

/// At most the first 64 characters of untrusted text, for an error message.
fn quote(s: &str) -> String {
    s.chars().take(64).collect()
}

fn hex_encode(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(2 * bytes.len());
    for &b in bytes {
        s.push(DIGITS[usize::from(b >> 4)] as char);
        s.push(DIGITS[usize::from(b & 0xf)] as char);
    }
    s
}

/// Hexadecimal digits (either case) to bytes; `None` for an odd count or
/// anything that is not a digit.
fn hex_decode(s: &str) -> Option<Vec<u8>> {
    fn digit(c: u8) -> Option<u8> {
        match c {
            b'0'..=b'9' => Some(c - b'0'),
            b'a'..=b'f' => Some(c - b'a' + 10),
            b'A'..=b'F' => Some(c - b'A' + 10),
            _ => None,
        }
    }
    let b = s.as_bytes();
    if b.len() % 2 != 0 {
        return None;
    }
    b.chunks_exact(2)
        .map(|p| Some(digit(p[0])? << 4 | digit(p[1])?))
        .collect()
}

fn check_transport_blob(name: &str, len: usize) -> Result<(), MetadataError> {
    if len > MAX_TRANSPORT_BLOB {
        return Err(MetadataError::TransportBlobTooLarge {
            name: name.to_owned(),
            len,
        });
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
        let mut m = match r.process_id {
            Some(p) => m.with_process_id(p)?,
            None => m,
        };
        for (name, hex) in r.transports.map(|t| t.0).unwrap_or_default() {
            check_transport_name(&name)?;
            // Sized before decoding: half the digits, rounded up.
            check_transport_blob(&name, hex.len().div_ceil(2))?;
            let blob = hex_decode(&hex)
                .ok_or_else(|| MetadataError::InvalidTransportBlob(name.clone()))?;
            if m.transports.contains_key(&name) {
                return Err(MetadataError::DuplicateTransport(name));
            }
            m = m.with_transport_blob(name, blob)?;
        }
        Ok(m)
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
            transports: (!m.transports.is_empty()).then(|| {
                RawTransports(
                    m.transports
                        .iter()
                        .map(|(name, blob)| (name.clone(), hex_encode(blob)))
                        .collect(),
                )
            }),
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
            transports: BTreeMap::new(),
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

    /// The most transport blobs one metadata may carry.
    pub const MAX_TRANSPORTS: usize = MAX_TRANSPORTS;
    /// The longest transport name, in bytes (names are `[a-z][a-z0-9_-]*`).
    pub const MAX_TRANSPORT_NAME: usize = MAX_TRANSPORT_NAME;
    /// The largest transport blob, in bytes (twice as many hexadecimal
    /// digits in the JSON).
    pub const MAX_TRANSPORT_BLOB: usize = MAX_TRANSPORT_BLOB;

    /// Attaches an opaque blob for the transport `name` (what that transport
    /// needs to reach the exposed memory: keys, addresses, ...), replacing
    /// any blob already under that name.
    ///
    /// Refused: a name that is not 1 to [`MAX_TRANSPORT_NAME`](Self::MAX_TRANSPORT_NAME)
    /// bytes of `[a-z][a-z0-9_-]*` ([`MetadataError::BadTransportName`]), a
    /// blob longer than [`MAX_TRANSPORT_BLOB`](Self::MAX_TRANSPORT_BLOB)
    /// ([`MetadataError::TransportBlobTooLarge`]), and a new name when
    /// [`MAX_TRANSPORTS`](Self::MAX_TRANSPORTS) are there already
    /// ([`MetadataError::TooManyTransports`]).
    ///
    /// ```
    /// # use ferry_proto::{DescriptorInfo, Device, OperationKind, RdmaMetadata, Token};
    /// # let m = RdmaMetadata::new(OperationKind::Read, "w".into(), "h".into(), "b".into(),
    /// #     vec!["127.0.0.1:1".parse().unwrap()], 1, Token::from_bytes([7; 16]),
    /// #     vec![DescriptorInfo { device: Device::CPU, size: 8 }]).unwrap();
    /// let m = m.with_transport_blob("rdma", vec![1, 2, 3])?;
    /// assert!(m.to_json().contains(r#""transports":{"rdma":"010203"}"#));
    /// let back = RdmaMetadata::from_json(&m.to_json())?;
    /// assert_eq!(back.transport_blob("rdma"), Some(&[1u8, 2, 3][..]));
    /// assert_eq!(back.transport_blob("ucx"), None);
    /// # Ok::<(), ferry_proto::MetadataError>(())
    /// ```
    pub fn with_transport_blob(
        mut self,
        name: impl Into<String>,
        blob: impl Into<Vec<u8>>,
    ) -> Result<Self, MetadataError> {
        let name = name.into();
        let blob = blob.into();
        check_transport_name(&name)?;
        check_transport_blob(&name, blob.len())?;
        if !self.transports.contains_key(&name) && self.transports.len() == MAX_TRANSPORTS {
            return Err(MetadataError::TooManyTransports(MAX_TRANSPORTS + 1));
        }
        self.transports.insert(name, blob);
        Ok(self)
    }

    /// The blob for the transport `name`, if the metadata carries one.
    pub fn transport_blob(&self, name: &str) -> Option<&[u8]> {
        self.transports.get(name).map(Vec::as_slice)
    }

    /// Every transport blob, by name in byte order (known and unknown names
    /// alike).
    pub fn transport_blobs(&self) -> impl Iterator<Item = (&str, &[u8])> {
        self.transports
            .iter()
            .map(|(name, blob)| (name.as_str(), blob.as_slice()))
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
            // Names only: a blob may hold keys.
            .field("transports", &self.transports.keys().collect::<Vec<_>>())
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
                sizes.iter().map(|&size| DescriptorInfo { device: Device::CPU, size }).collect(),
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
}
