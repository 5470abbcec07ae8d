//! The holder's side of a grant in the bench: open the owner's grant and
//! read or write its blocks one-sidedly.

use ferry::{Connector, Pool};

/// An open grant and the generation of each of its blocks.
pub(super) struct Held;

/// Opens the grant whose metadata is `json`.
pub(super) async fn open(_c: &Connector, _json: &str) -> anyhow::Result<Held> {
    anyhow::bail!("this build has no grants yet")
}

impl Held {
    /// READ: blocks `remote` of the grant into blocks `local_ids` of `local`.
    pub(super) async fn read(
        &self,
        _remote: &[u32],
        _local: &Pool,
        _local_ids: &[u32],
    ) -> anyhow::Result<()> {
        anyhow::bail!("this build has no grants yet")
    }

    /// WRITE: blocks `local_ids` of `local` into blocks `remote` of the
    /// grant, with `note` for the owner.
    pub(super) async fn write(
        &self,
        _local: &Pool,
        _local_ids: &[u32],
        _remote: &[u32],
        _note: Option<&[u8]>,
    ) -> anyhow::Result<()> {
        anyhow::bail!("this build has no grants yet")
    }
}
