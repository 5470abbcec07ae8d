//! The per-transport blobs: their JSON form (a map of names to
//! hexadecimal strings) and their limits.

use std::fmt;

use serde::de::{MapAccess, Visitor};
use serde::ser::SerializeMap;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::{MetadataError, MAX_TRANSPORTS, MAX_TRANSPORT_BLOB, MAX_TRANSPORT_NAME};

/// The `transports` map as it appears in the JSON: names and hexadecimal
/// blobs, in the order given, duplicates kept (so that they can be refused;
/// a plain map would keep the last one silently).
pub(super) struct RawTransports(pub(super) Vec<(String, String)>);

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

/// A transport name: 1 to 32 bytes of `[a-z][a-z0-9_-]*`.
pub(super) fn check_transport_name(name: &str) -> Result<(), MetadataError> {
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
pub(super) fn quote(s: &str) -> String {
    s.chars().take(64).collect()
}

pub(super) fn hex_encode(bytes: &[u8]) -> String {
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
pub(super) fn hex_decode(s: &str) -> Option<Vec<u8>> {
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

pub(super) fn check_transport_blob(name: &str, len: usize) -> Result<(), MetadataError> {
    if len > MAX_TRANSPORT_BLOB {
        return Err(MetadataError::TransportBlobTooLarge {
            name: name.to_owned(),
            len,
        });
    }
    Ok(())
}
