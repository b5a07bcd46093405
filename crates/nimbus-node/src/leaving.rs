//! A CREATE refused (sharing violation, delete pending) because of opens
//! whose client has gone: it waits, briefly, for them to be released
//! (`crate::teardowns` says why), and looks again. So does a durable
//! reconnect that finds no disconnected open, for the connection its client
//! has just left (`reconnect_look`).

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use nimbus_state::FileKey;

use crate::connection::Connection;
use crate::durable::Owner;
use crate::server::Server;
use crate::session::Channel;
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
            .filter(|o| ids.contains(&server.share_modes.grouped().entry_id(o.open_id)))
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
    leaving_entries(server, leaving, &ids)
}

/// The record entries that go once `leaving` are released: an open's
/// own, and a group's (nimbus_state::grouped_opens) only when every
/// member of it is among them.
fn leaving_entries(server: &Server, leaving: Vec<u64>, ids: &HashSet<u64>) -> Vec<u64> {
    let grouped = server.share_modes.grouped();
    let mut leaving_of: std::collections::HashMap<u64, usize> = Default::default();
    for open_id in leaving {
        *leaving_of.entry(grouped.entry_id(open_id)).or_default() += 1;
    }
    leaving_of
        .into_iter()
        .filter(|(entry, n)| {
            ids.contains(entry) && (!grouped.is_group(*entry) || grouped.members(*entry) <= *n)
        })
        .map(|(entry, _)| entry)
        .collect()
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

/// A durable reconnect on `me` names open `open_id`, and `look` finds no
/// disconnected open: a client that closes a connection and at once
/// reconnects on another (smbtorture's durable tests do, within a
/// millisecond) may get here before the server has read the old
/// connection's end of stream, or while its teardown is moving the open to
/// the disconnected table. Waits up to `limit` for that connection (or for
/// the teardowns under way) to end, and looks once more. `asker` is the
/// reconnect's connection and user: only an open of that user's is waited
/// for, so that how long a refusal takes tells nobody whose open a FileId
/// names.
pub fn reconnect_look<T>(
    server: &Server,
    open_id: u64,
    asker: (&Connection, &Owner),
    limit: Duration,
    mut look: impl FnMut() -> Option<T>,
) -> Option<T> {
    let (me, owner) = asker;
    if let Some(found) = look() {
        return Some(found);
    }
    if waited_for_holder(server, open_id, me, owner, limit) {
        return look();
    }
    server
        .teardowns
        .look_after_others(crate::teardowns::id(me), limit, look)
}

/// Waits up to `limit` for the connections of the session holding
/// `owner`'s durable open `open_id` to end, when the clients of all of them
/// have gone (other than `me`). Whether there were such and they ended.
fn waited_for_holder(
    server: &Server,
    open_id: u64,
    me: &Connection,
    owner: &Owner,
    limit: Duration,
) -> bool {
    // Neither the open nor its session is held during the wait: the
    // teardown releases them.
    let conns = {
        let Some(open) = server.opens.get(open_id) else {
            return false;
        };
        let owned = lock(&open.durable)
            .as_ref()
            .is_some_and(|d| d.owner == *owner);
        if !owned {
            return false;
        }
        let Some(session) = server.sessions.find(open.session_id()) else {
            return false;
        };
        session.connections()
    };
    let me: &dyn Channel = me;
    waited_for_gone(&conns, me, limit)
}

/// Waits up to `limit` for `conns` to end, when the clients of all of them
/// have gone and none is `me`. Whether there were such and they ended.
fn waited_for_gone(conns: &[Arc<dyn Channel>], me: &dyn Channel, limit: Duration) -> bool {
    let gone = !conns.is_empty()
        && conns.iter().all(|c| {
            !std::ptr::addr_eq(Arc::as_ptr(c), me as *const dyn Channel) && c.client_gone()
        });
    if !gone {
        return false;
    }
    let deadline = Instant::now() + limit;
    nimbus_state::blocking::off_worker(|| loop {
        if conns.iter().all(|c| c.has_ended()) {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(1));
    })
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};

    use super::*;
    use crate::pending::{Frame, ResponseChannel};
    use crate::session::Session;

    /// A connection as a session sees it: only whether its client has gone
    /// and whether it has ended matter here.
    #[derive(Default)]
    struct Line {
        gone: AtomicBool,
        ended: AtomicBool,
    }

    impl ResponseChannel for Line {
        fn send_frame(&self, _: Frame) {}
        fn forget_pending(&self, _: u64) {}
        fn is_closing(&self) -> bool {
            self.gone.load(Ordering::SeqCst)
        }
        fn close_unsendable(&self) {}
        fn peer(&self) -> std::net::SocketAddr {
            std::net::SocketAddr::from(([127, 0, 0, 1], 1))
        }
    }

    impl Channel for Line {
        fn client_gone(&self) -> bool {
            self.gone.load(Ordering::SeqCst)
        }
        fn drop_now(&self) {}
        fn has_ended(&self) -> bool {
            self.ended.load(Ordering::SeqCst)
        }
        fn forget_session(&self, _: &Session) {}
        fn end_requests_of(&self, _: u64) {}
    }

    fn line(gone: bool) -> Arc<Line> {
        let l = Arc::new(Line::default());
        l.gone.store(gone, Ordering::SeqCst);
        l
    }

    #[test]
    fn a_reconnect_waits_for_the_connection_its_client_left_to_end() {
        let me = line(false);
        let old = line(true);
        let conns: Vec<Arc<dyn Channel>> = vec![old.clone()];
        std::thread::scope(|s| {
            let waiter = s.spawn(|| waited_for_gone(&conns, &*me, Duration::from_secs(30)));
            std::thread::yield_now();
            old.ended.store(true, Ordering::SeqCst);
            assert!(waiter.join().unwrap(), "waited for the end");
        });
        // Ended too late: not waited for past the limit.
        let late = line(true);
        let conns: Vec<Arc<dyn Channel>> = vec![late];
        assert!(!waited_for_gone(&conns, &*me, Duration::from_millis(20)));
    }

    #[test]
    fn a_live_client_or_the_asking_connection_is_not_waited_for() {
        let me = line(true);
        let (live, gone) = (line(false), line(true));
        // One channel of the holder still has its client: the open is not
        // disconnected, and the reconnect is refused at once.
        let conns: Vec<Arc<dyn Channel>> = vec![gone.clone(), live];
        assert!(!waited_for_gone(&conns, &*me, Duration::from_secs(30)));
        // The holder is the asking connection itself.
        let conns: Vec<Arc<dyn Channel>> = vec![me.clone()];
        assert!(!waited_for_gone(&conns, &*me, Duration::from_secs(30)));
        assert!(!waited_for_gone(&[], &*me, Duration::from_secs(30)));
    }
}
