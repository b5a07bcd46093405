//! Single-node backend: a BTreeMap behind a mutex. Fast, and lost on exit,
//! which is right for the state of opens that die with their connections.

use std::collections::BTreeMap;
use std::sync::Mutex;

use crate::store::{StateError, StateStore, Versioned};

#[derive(Default)]
pub struct MemoryStore {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    map: BTreeMap<Vec<u8>, Versioned>,
    next_version: u64,
}

impl MemoryStore {
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A panic while holding the lock cannot leave a half-written record
        // (every update is a single map operation), so poisoning is ignored.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl StateStore for MemoryStore {
    fn get(&self, key: &[u8]) -> Result<Option<Versioned>, StateError> {
        Ok(self.lock().map.get(key).cloned())
    }

    fn compare_and_set(
        &self,
        key: &[u8],
        expected: Option<u64>,
        value: Option<Vec<u8>>,
    ) -> Result<Option<u64>, StateError> {
        let mut inner = self.lock();
        let current = inner.map.get(key).map(|v| v.version);
        if current != expected {
            return Ok(None);
        }
        match value {
            Some(value) => {
                inner.next_version += 1;
                let version = inner.next_version;
                inner.map.insert(key.to_vec(), Versioned { version, value });
                Ok(Some(version))
            }
            None => {
                inner.map.remove(key);
                Ok(Some(0))
            }
        }
    }

    fn scan_prefix(&self, prefix: &[u8]) -> Result<Vec<(Vec<u8>, Versioned)>, StateError> {
        let inner = self.lock();
        Ok(inner
            .map
            .range(prefix.to_vec()..)
            .take_while(|(k, _)| k.starts_with(prefix))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conforms() {
        crate::conformance::run_all(&MemoryStore::new());
    }
}
