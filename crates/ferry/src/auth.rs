//! The deployment's shared secret, and the key the secure channel derives
//! from it (`transport/secure.rs` runs the handshake).

use std::fmt;
use std::sync::Arc;

use hkdf::Hkdf;
use sha2::Sha256;

/// A deployment's shared secret. Never printed.
#[derive(Clone)]
pub(crate) struct Secret(Arc<[u8]>);

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

impl PartialEq for Secret {
    fn eq(&self, other: &Self) -> bool {
        // Only used to decide whether two connectors of one process may
        // talk directly; timing is not observable by a remote.
        self.0 == other.0
    }
}

impl Secret {
    pub(crate) fn new(bytes: &[u8]) -> Self {
        Secret(bytes.into())
    }

    pub(crate) fn len(&self) -> usize {
        self.0.len()
    }

    /// The 32-byte pre-shared key of the Noise handshake: HKDF-SHA-256 of
    /// the secret (a secret of any length and shape becomes a uniform key),
    /// bound to the handshake's name so that it serves nothing else.
    pub(crate) fn psk(&self, pattern: &str) -> [u8; 32] {
        let mut key = [0u8; 32];
        Hkdf::<Sha256>::new(Some(b"ferry shared secret v1"), &self.0)
            .expand(pattern.as_bytes(), &mut key)
            // 32 bytes is far below HKDF-SHA-256's limit of 255 * 32.
            .unwrap_or_else(|_| unreachable!("32 bytes of HKDF-SHA-256 output"));
        key
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_depend_on_secret_and_pattern_and_are_never_printed() {
        let s = Secret::new(b"deployment secret");
        assert_eq!(s.psk("a"), Secret::new(b"deployment secret").psk("a"));
        assert_ne!(s.psk("a"), s.psk("b"));
        assert_ne!(s.psk("a"), Secret::new(b"deployment secreT").psk("a"));
        assert!(!format!("{s:?}").contains("deployment"));
    }
}
