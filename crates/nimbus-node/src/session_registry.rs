//! MS-SMB2 GlobalSessionTable: every session of the server by id, so that
//! a logon naming its PreviousSessionId (MS-SMB2 3.3.5.5.3) ends that
//! session wherever it is (a client that lost its connection reconnects
//! before the server has noticed the loss, and its durable opens must be
//! free for it to reclaim), and a channel can be bound to a session made
//! on another connection (3.3.5.5). Weak references: a session belongs to
//! its channels' connections; this table only finds it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

use crate::session::Session;
use crate::sync::lock;

type Entry = Weak<Session>;

#[derive(Default)]
pub struct SessionRegistry {
    sessions: Mutex<HashMap<u64, Entry>>,
}

impl SessionRegistry {
    pub fn register(&self, session: &Arc<Session>) {
        lock(&self.sessions).insert(session.id, Arc::downgrade(session));
    }

    /// How many sessions are logged on.
    pub fn len(&self) -> usize {
        lock(&self.sessions).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn forget(&self, id: u64) {
        lock(&self.sessions).remove(&id);
    }

    /// How many tree connects each share has now, by share name.
    pub fn trees_by_share(&self) -> std::collections::HashMap<String, u32> {
        let sessions: Vec<Arc<Session>> = lock(&self.sessions)
            .values()
            .filter_map(|s| s.upgrade())
            .collect();
        let mut uses = std::collections::HashMap::new();
        for s in sessions {
            for t in lock(&s.trees).values() {
                *uses.entry(t.share.name.clone()).or_insert(0) += 1;
            }
        }
        uses
    }

    /// Every session that exists now.
    pub fn all(&self) -> Vec<Arc<Session>> {
        lock(&self.sessions)
            .values()
            .filter_map(|s| s.upgrade())
            .collect()
    }

    /// The session `id`, while it exists.
    pub fn find(&self, id: u64) -> Option<Arc<Session>> {
        lock(&self.sessions).get(&id)?.upgrade()
    }
}
