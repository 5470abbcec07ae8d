//! Optional mutual authentication of connectors with a shared secret.
//!
//! Right after the `Hello`s, the active side sends a fresh nonce, the
//! passive side answers with its own nonce and an HMAC-SHA-256 proof over
//! both nonces and both worker ids, and the active side answers with its
//! proof. Each proof is bound to the other side's fresh nonce, so a recorded
//! proof is worthless later; the roles are part of what is signed, so a
//! proof cannot be reflected back.

use std::fmt;
use std::sync::Arc;

use hmac::{Hmac, Mac};
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

/// Which side a proof is for.
#[derive(Clone, Copy)]
pub(crate) enum Role {
    Active,
    Passive,
}

/// What both sides sign.
pub(crate) struct Transcript<'a> {
    pub(crate) active_nonce: &'a [u8; 16],
    pub(crate) passive_nonce: &'a [u8; 16],
    pub(crate) active_id: &'a str,
    pub(crate) passive_id: &'a str,
}

impl Secret {
    pub(crate) fn new(bytes: &[u8]) -> Self {
        Secret(bytes.into())
    }

    pub(crate) fn len(&self) -> usize {
        self.0.len()
    }

    fn hmac(&self, role: Role, t: &Transcript<'_>) -> Hmac<Sha256> {
        let mut m =
            <Hmac<Sha256> as Mac>::new_from_slice(&self.0).expect("HMAC takes keys of any length");
        m.update(match role {
            Role::Active => b"ferry-auth-1 active\0",
            Role::Passive => b"ferry-auth-1 passive",
        });
        m.update(t.active_nonce);
        m.update(t.passive_nonce);
        for id in [t.active_id, t.passive_id] {
            m.update(&(id.len() as u16).to_le_bytes());
            m.update(id.as_bytes());
        }
        m
    }

    /// The proof of `role` over the transcript.
    pub(crate) fn prove(&self, role: Role, t: &Transcript<'_>) -> [u8; 32] {
        self.hmac(role, t).finalize().into_bytes().into()
    }

    /// Checks a proof in constant time.
    pub(crate) fn verify(&self, role: Role, t: &Transcript<'_>, proof: &[u8; 32]) -> bool {
        self.hmac(role, t).verify_slice(proof).is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proofs_bind_secret_role_nonces_and_ids() {
        let s = Secret::new(b"deployment secret");
        let t = Transcript {
            active_nonce: &[1; 16],
            passive_nonce: &[2; 16],
            active_id: "a",
            passive_id: "b",
        };
        let p = s.prove(Role::Active, &t);
        assert!(s.verify(Role::Active, &t, &p));
        assert!(!s.verify(Role::Passive, &t, &p), "reflected");
        assert!(
            !Secret::new(b"other").verify(Role::Active, &t, &p),
            "other secret"
        );
        let t2 = Transcript {
            passive_nonce: &[3; 16],
            ..t
        };
        assert!(
            !s.verify(Role::Active, &t2, &p),
            "replayed against a new nonce"
        );
        assert!(!format!("{s:?}").contains("deployment"));
    }
}
