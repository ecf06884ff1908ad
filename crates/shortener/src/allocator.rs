//! Hands out generated codes: ids from blocks leased from the store, scrambled by the keyed
//! permutation, skipping any that a custom alias already holds.

use crate::store::Store;
use shortener_core::audit::Origin;
use shortener_core::code::{CodePermutation, ID_SPACE, encode_id};
use shortener_core::link::Link;
use shortener_core::store::{InsertOutcome, StoreError};
use std::ops::Range;
use std::sync::Arc;
use tokio::sync::Mutex;

/// Allocator of generated codes for one process.
#[derive(Debug)]
pub(crate) struct CodeAllocator {
    store: Arc<dyn Store>,
    permutation: CodePermutation,
    block_size: u64,
    /// Ids of the current block not yet handed out. The lock is held across the lease of a
    /// new block on purpose: concurrent creates wait for one lease instead of leasing many.
    block: Mutex<Range<u64>>,
}

impl CodeAllocator {
    /// Loads (or creates, on first start) the permutation key from the store.
    pub(crate) async fn new(store: Arc<dyn Store>, block_size: u64) -> Result<Self, StoreError> {
        let key = store.code_key(rand::random()).await?;
        Ok(Self {
            store,
            permutation: CodePermutation::new(key),
            block_size,
            block: Mutex::new(0..0),
        })
    }

    async fn next_id(&self) -> Result<u64, StoreError> {
        let mut block = self.block.lock().await;
        if block.is_empty() {
            let leased = self.store.lease_ids(self.block_size).await?;
            if leased.start >= ID_SPACE {
                return Err(StoreError::IdSpaceExhausted);
            }
            *block = leased.start..leased.end.min(ID_SPACE);
        }
        block.next().ok_or(StoreError::IdSpaceExhausted)
    }

    /// The next generated code (not yet checked against custom aliases).
    pub(crate) async fn next_code(&self) -> Result<String, StoreError> {
        let id = self.next_id().await?;
        encode_id(self.permutation.permute(id)).ok_or(StoreError::IdSpaceExhausted)
    }

    /// Stores `link` under the next free generated code and returns that code. A code that a
    /// custom alias holds already is skipped (and counted), never overwritten.
    pub(crate) async fn insert_generated(
        &self,
        mut link: Link,
        origin: &Origin,
        on_skip: impl Fn(),
    ) -> Result<Link, StoreError> {
        loop {
            link.code = self.next_code().await?;
            match self.store.insert_link(&link, origin).await? {
                InsertOutcome::Inserted => return Ok(link),
                InsertOutcome::CodeTaken => on_skip(),
            }
        }
    }
}
