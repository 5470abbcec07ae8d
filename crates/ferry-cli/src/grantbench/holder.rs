//! The holder's side of a grant in the bench: open the owner's grant and
//! read or write its blocks one-sidedly, naming each block at the
//! generation it had when the grant was opened (nothing retires blocks in
//! the bench).

use ferry::{BlockRef, Connector, GrantLane, GrantMetadata, Pool, RemoteGrant};

/// An open grant and the generation of each of its blocks.
pub(super) struct Held {
    grant: RemoteGrant,
    generations: Vec<u32>,
}

/// Opens the grant whose metadata is `json`, by lane `via`.
pub(super) async fn open(c: &Connector, json: &str, via: GrantLane) -> anyhow::Result<Held> {
    let meta = GrantMetadata::from_json(json)?;
    let grant = c.open_grant_via(&meta, via).await?;
    let generations = (0..meta.block_count)
        .map(|i| grant.generation(i))
        .collect::<Result<Vec<u32>, _>>()?;
    Ok(Held { grant, generations })
}

impl Held {
    /// Blocks `ids` at their generations.
    fn refs(&self, ids: &[u32]) -> Vec<BlockRef> {
        ids.iter()
            .map(|&i| {
                let g = self.generations.get(i as usize).copied().unwrap_or(0);
                BlockRef::new(i, g)
            })
            .collect()
    }

    /// READ: blocks `remote` of the grant into blocks `local_ids` of `local`.
    pub(super) async fn read(
        &self,
        remote: &[u32],
        local: &Pool,
        local_ids: &[u32],
    ) -> anyhow::Result<()> {
        let refs = self.refs(remote);
        Ok(self.grant.read_blocks(&refs, local, local_ids).await?)
    }

    /// WRITE: blocks `local_ids` of `local` into blocks `remote` of the
    /// grant, with `note` for the owner.
    pub(super) async fn write(
        &self,
        local: &Pool,
        local_ids: &[u32],
        remote: &[u32],
        note: Option<&[u8]>,
    ) -> anyhow::Result<()> {
        let refs = self.refs(remote);
        Ok(self
            .grant
            .write_blocks(local, local_ids, &refs, note)
            .await?)
    }
}
