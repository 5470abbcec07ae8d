//! The capability a metadata record carries.

use std::fmt;

use super::transports::{hex_decode, hex_encode};

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

    pub(crate) fn to_hex(self) -> String {
        hex_encode(&self.0)
    }

    pub(crate) fn from_hex(s: &str) -> Option<Token> {
        if s.len() != 32 {
            return None;
        }
        hex_decode(s)?.try_into().ok().map(Token)
    }
}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Token(<redacted>)")
    }
}

impl PartialEq for Token {
    fn eq(&self, other: &Self) -> bool {
        self.ct_eq(other)
    }
}
impl Eq for Token {}
