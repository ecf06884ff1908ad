//! The addresses the server put in the pool, by where they came from (the upstream file or
//! the API), with stable ids for the API. The pool itself knows addresses only by URL.

use proxypool::{Pool, PoolError, ProxyAddress};
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

/// The API id of an address: the first 8 bytes of SHA-256 of its full URL, in hex. Stable
/// across restarts and never reveals the password.
pub(crate) fn id_of(address: &ProxyAddress) -> String {
    let digest = Sha256::digest(address.as_str().as_bytes());
    digest[..8].iter().map(|b| format!("{b:02x}")).collect()
}

#[derive(Debug, Clone, Copy, Default)]
struct Sources {
    file: bool,
    api: bool,
}

#[derive(Debug)]
struct Entry {
    address: ProxyAddress,
    sources: Sources,
}

/// Cheap to clone; clones share one registry.
#[derive(Debug, Clone)]
pub(crate) struct Registry {
    pool: Pool,
    entries: Arc<Mutex<HashMap<String, Entry>>>,
}

impl Registry {
    pub(crate) fn new(pool: Pool) -> Self {
        Self {
            pool,
            entries: Arc::default(),
        }
    }

    fn entries(&self) -> MutexGuard<'_, HashMap<String, Entry>> {
        match self.entries.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    /// Adds an address through the API; returns its id.
    pub(crate) async fn add_api(&self, address: ProxyAddress) -> Result<String, PoolError> {
        let id = id_of(&address);
        self.pool.add(address.as_str()).await?;
        self.entries().insert(
            id.clone(),
            Entry {
                address,
                sources: Sources {
                    file: false,
                    api: true,
                },
            },
        );
        Ok(id)
    }

    /// Removes an address by id, whoever added it. `None`: no such id.
    pub(crate) async fn remove(&self, id: &str) -> Option<Result<ProxyAddress, PoolError>> {
        let entry = self.entries().remove(id)?;
        Some(
            self.pool
                .remove(entry.address.as_str())
                .await
                .map(|()| entry.address),
        )
    }

    /// Makes the file's share of the pool equal to `wanted`: adds what is new, removes what the
    /// file no longer lists (unless the API added it too). Returns (added, removed).
    pub(crate) async fn sync_file(&self, wanted: &[ProxyAddress]) -> (usize, usize) {
        let wanted: HashMap<String, &ProxyAddress> = wanted.iter().map(|a| (id_of(a), a)).collect();
        let (to_add, to_remove) = {
            let mut entries = self.entries();
            let mut to_remove = Vec::new();
            entries.retain(|id, e| {
                if !e.sources.file || wanted.contains_key(id) {
                    return true;
                }
                e.sources.file = false;
                if e.sources.api {
                    return true;
                }
                to_remove.push(e.address.clone());
                false
            });
            let mut to_add = Vec::new();
            for (id, a) in &wanted {
                match entries.get_mut(id) {
                    Some(e) => e.sources.file = true,
                    None => to_add.push(((*id).clone(), (*a).clone())),
                }
            }
            (to_add, to_remove)
        };
        let mut removed = 0;
        for a in to_remove {
            match self.pool.remove(a.as_str()).await {
                Ok(()) => removed += 1,
                Err(e) => tracing::warn!(address = %a, error = %e, "cannot remove upstream"),
            }
        }
        let mut added = 0;
        for (id, a) in to_add {
            match self.pool.add(a.as_str()).await {
                Ok(()) | Err(PoolError::Duplicate(_)) => {
                    added += 1;
                    self.entries().insert(
                        id,
                        Entry {
                            address: a,
                            sources: Sources {
                                file: true,
                                api: false,
                            },
                        },
                    );
                }
                Err(e) => tracing::warn!(address = %a, error = %e, "cannot add upstream"),
            }
        }
        (added, removed)
    }

    /// Ids by redacted URL, to label snapshot rows. Addresses that differ only in their
    /// password share a redacted URL; all their ids are listed.
    pub(crate) fn ids_by_redacted(&self) -> HashMap<String, Vec<String>> {
        let mut out: HashMap<String, Vec<String>> = HashMap::new();
        for (id, e) in self.entries().iter() {
            out.entry(e.address.redacted().to_owned())
                .or_default()
                .push(id.clone());
        }
        for ids in out.values_mut() {
            ids.sort();
        }
        out
    }
}
