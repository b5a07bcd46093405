//! A CREATE refused (sharing violation, delete pending) because of opens
//! whose client has gone: it waits, briefly, for them to be released
//! (`crate::teardowns` says why), and looks again.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use nimbus_state::FileKey;

use crate::connection::Connection;
use crate::server::Server;
use crate::sync::lock;

/// Opens of `file` held by sessions all of whose connections' clients
/// have gone (other than `me`), not durable (a durable open stays for its
/// client: nothing to wait for).
fn leaving_holders(server: &Server, file: FileKey, me: &Connection) -> Vec<u64> {
    let Ok(rec) = server.share_modes.record(file) else {
        return Vec::new();
    };
    let ids: HashSet<u64> = rec.opens.iter().map(|o| o.open_id).collect();
    if ids.is_empty() {
        return Vec::new();
    }
    let mut leaving = Vec::new();
    for s in server.sessions.all() {
        // Taken out first: an open's durable state is not looked at under
        // the session's lock (a save holds it through a store write).
        let held: Vec<std::sync::Arc<crate::open::Open>> = lock(&s.opens)
            .values()
            .filter(|o| ids.contains(&o.open_id))
            .cloned()
            .collect();
        let held: Vec<u64> = held
            .iter()
            .filter(|o| lock(&o.durable).is_none())
            .map(|o| o.open_id)
            .collect();
        if held.is_empty() {
            continue;
        }
        let conns = s.connections();
        let gone = !conns.is_empty()
            && conns.iter().all(|c| {
                !std::ptr::addr_eq(Arc::as_ptr(c), me as *const Connection) && c.client_gone()
            });
        if gone {
            leaving.extend(held);
        }
    }
    leaving
}

/// A CREATE of `file` on `me` was refused (sharing violation, delete
/// pending): waits up to `limit` for opens of clients that have gone to be
/// released. Whether there were any and they were, so that a look again
/// may find otherwise.
pub fn waited_for_leaving(
    server: &Server,
    file: FileKey,
    me: &Connection,
    limit: Duration,
) -> bool {
    let leaving = leaving_holders(server, file, me);
    if leaving.is_empty() {
        return server
            .teardowns
            .wait_for_others(crate::teardowns::id(me), limit);
    }
    let deadline = Instant::now() + limit;
    nimbus_state::blocking::off_worker(|| loop {
        let still = server
            .share_modes
            .record(file)
            .map(|r| r.opens.iter().any(|o| leaving.contains(&o.open_id)))
            .unwrap_or(false);
        if !still {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(1));
    })
}
