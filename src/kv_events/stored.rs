//! One reading of a `BlockStored` event, shared by everything that takes
//! one apart (the encoder in [`super::wire`], `exact` mode's record in
//! `routing::prefix::held`), so they agree on what its fields mean.
//!
//! A `BlockStored` carries `block_hashes` in chain order and `token_ids`
//! holding `block_size` tokens per block; the first block follows
//! `parent_block_hash` (none: it starts a prompt). [`StoredBlocks::blocks`]
//! pairs each replica hash with its tokens; a trailing partial block (which
//! vLLM never sends) and a `block_size` of 0 yield no block.

use super::{BlockExtra, BlockKey, KvEvent};

/// The fields of a `BlockStored`, borrowed.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StoredBlocks<'a> {
    pub block_hashes: &'a [BlockKey],
    pub parent_block_hash: Option<BlockKey>,
    pub token_ids: &'a [u32],
    pub block_size: usize,
    pub lora_name: Option<&'a str>,
    pub medium: Option<&'a str>,
    /// Per block, what else keyed its hash (may be shorter than the blocks).
    pub extra_keys: &'a [BlockExtra],
}

impl<'a> StoredBlocks<'a> {
    /// Each stored block's replica hash with its tokens, in chain order.
    pub fn blocks(&self) -> impl Iterator<Item = (BlockKey, &'a [u32])> + 'a {
        let size = self.block_size.max(1);
        let tokens = if self.block_size == 0 {
            &[][..]
        } else {
            self.token_ids
        };
        self.block_hashes
            .iter()
            .copied()
            .zip(tokens.chunks_exact(size))
    }
}

impl KvEvent {
    /// The event as a [`StoredBlocks`], when it is a `BlockStored`.
    pub fn stored(&self) -> Option<StoredBlocks<'_>> {
        match self {
            KvEvent::BlockStored {
                block_hashes,
                parent_block_hash,
                token_ids,
                block_size,
                lora_name,
                medium,
                extra_keys,
            } => Some(StoredBlocks {
                block_hashes,
                parent_block_hash: *parent_block_hash,
                token_ids,
                block_size: *block_size,
                lora_name: lora_name.as_deref(),
                medium: medium.as_deref(),
                extra_keys,
            }),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stored(block_size: usize, tokens: Vec<u32>) -> KvEvent {
        KvEvent::BlockStored {
            block_hashes: vec![BlockKey(10), BlockKey(11)],
            parent_block_hash: Some(BlockKey(3)),
            token_ids: tokens,
            block_size,
            lora_name: Some("adapter".into()),
            medium: None,
            extra_keys: Vec::new(),
        }
    }

    #[test]
    fn blocks_pair_each_hash_with_its_tokens() {
        let e = stored(2, vec![1, 2, 3, 4, 5]);
        let s = e.stored().unwrap();
        assert_eq!(
            s.blocks().collect::<Vec<_>>(),
            vec![(BlockKey(10), &[1, 2][..]), (BlockKey(11), &[3, 4][..])]
        );
        assert_eq!(
            (s.parent_block_hash, s.lora_name),
            (Some(BlockKey(3)), Some("adapter"))
        );
        assert_eq!(stored(0, vec![1, 2]).stored().unwrap().blocks().count(), 0);
        assert!(KvEvent::AllBlocksCleared.stored().is_none());
    }
}
