//! Every session of the server by id, with the connection that holds it,
//! so that a logon naming its PreviousSessionId (MS-SMB2 3.3.5.5.3) ends
//! that session wherever it is: a client that lost its connection
//! reconnects before the server has noticed the loss, and its durable
//! opens must be free for it to reclaim. Weak references: a session
//! belongs to its connection; this table only finds it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

use crate::connection::Connection;
use crate::session::{lock, Session};

/// A session and the connection it lives on.
type Entry = (Weak<Session>, Weak<Connection>);

#[derive(Default)]
pub struct SessionRegistry {
    sessions: Mutex<HashMap<u64, Entry>>,
}

impl SessionRegistry {
    pub fn register(&self, session: &Arc<Session>, conn: &Arc<Connection>) {
        lock(&self.sessions).insert(session.id, (Arc::downgrade(session), Arc::downgrade(conn)));
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
            .filter_map(|(s, _)| s.upgrade())
            .collect();
        let mut uses = std::collections::HashMap::new();
        for s in sessions {
            for t in lock(&s.trees).values() {
                *uses.entry(t.share.name.clone()).or_insert(0) += 1;
            }
        }
        uses
    }

    /// The session `id` and its connection, while both exist.
    pub fn find(&self, id: u64) -> Option<(Arc<Session>, Arc<Connection>)> {
        let (s, c) = lock(&self.sessions).get(&id).cloned()?;
        Some((s.upgrade()?, c.upgrade()?))
    }
}
