//! What must hold after every step (checks of single calls into the
//! rules are in `calls`). Each check panics with the state that breaks
//! it, which is what the fuzzer reports. The conflict tests for byte
//! ranges and share modes are written here again from the definitions
//! rather than borrowed from the rules they check.

use nimbus_state::byte_range::{try_lock, RangeLock};
use nimbus_state::caching::{FileCaching, Holder, Want, HANDLE, WRITE};
use nimbus_state::{FileKey, OpenRecord};

use crate::input::{APPEND_DATA, DELETE, EXECUTE, READ_DATA, WRITE_DATA};
use crate::oplock_service::{Entry, Timer};
use crate::states::{is_lease, only, subset, LEASE_STAT, LEASE_STATES, OPLOCK_STATES, STAT};
use crate::world::World;

/// Everything at once, after every step.
pub fn world(w: &World) {
    for o in &w.opens {
        assert_eq!(o.key, w.key(o.file), "open {} of a deleted file", o.id);
    }
    for s in &w.stalled {
        assert_eq!(s.key, w.key(s.req.file), "stalled open of a deleted file");
    }
    for e in &w.oplocks.files {
        caching(w, e);
    }
    leases(w);
    for f in &w.locks.files {
        let admitted = admitted(w, f.key);
        assert!(
            !f.granted.is_empty() || !f.waiting.is_empty(),
            "empty lock entry kept"
        );
        for (i, a) in f.granted.iter().enumerate() {
            assert!(admitted.contains(&a.owner), "lock of a closed open: {a:?}");
            for b in &f.granted[i + 1..] {
                assert!(!locks_conflict(a, b), "locks {a:?} and {b:?} conflict");
            }
        }
        for x in &f.waiting {
            assert!(admitted.contains(&x.owner), "waiting lock of a closed open");
            assert!(
                try_lock(&f.granted, x.owner, &x.ranges).is_err(),
                "lock {x:?} waits though it could be granted: nothing will retry it"
            );
        }
    }
    for file in 0..crate::input::FILES {
        share_modes(w, w.key(file));
    }
    requests(w);
}

/// The opens of `key` that were admitted, and those past the caching
/// check but not yet admitted.
fn admitted(w: &World, key: FileKey) -> Vec<u64> {
    w.opens
        .iter()
        .filter(|o| o.key == key)
        .map(|o| o.id)
        .collect()
}

fn stalled(w: &World, key: FileKey) -> Vec<u64> {
    w.stalled
        .iter()
        .filter(|s| s.key == key)
        .map(|s| s.ask.open_id)
        .collect()
}

/// The access the caching rules saw for an open.
fn ask_access(w: &World, id: u64) -> u32 {
    w.opens
        .iter()
        .find(|o| o.id == id)
        .map(|o| o.ask_access)
        .or_else(|| {
            w.stalled
                .iter()
                .find(|s| s.ask.open_id == id)
                .map(|s| s.ask.access)
        })
        .unwrap_or_else(|| panic!("open {id} unknown"))
}

fn sorted(mut v: Vec<u64>) -> Vec<u64> {
    v.sort_unstable();
    v
}

fn caching(w: &World, e: &Entry) {
    let s = &e.state;
    let admitted = admitted(w, e.key);
    let mut all = admitted.clone();
    all.extend(stalled(w, e.key));
    assert_eq!(
        sorted(s.opens.iter().map(|o| o.open_id).collect()),
        sorted(all),
        "the file's opens are not the opens of the file"
    );
    assert_eq!(sorted(e.routes.clone()), sorted(admitted.clone()), "routes");
    assert!(
        !s.is_empty() || !e.waiters.is_empty(),
        "an entry nothing needs is kept"
    );
    let is_dir = e.key.ino & 0xFF == crate::input::DIR as u64;
    let mut owned: Vec<u64> = Vec::new();
    for (i, g) in s.grants.iter().enumerate() {
        assert!(
            s.grants[..i].iter().all(|h| h.holder != g.holder),
            "two grants for {:?}",
            g.holder
        );
        assert!(!g.opens.is_empty(), "{:?} held by no open", g.holder);
        for id in &g.opens {
            assert!(
                admitted.contains(id),
                "{:?} held by open {id}, not admitted",
                g.holder
            );
            assert!(!owned.contains(id), "open {id} in two grants");
            owned.push(*id);
        }
        match g.holder {
            Holder::Oplock(id) => {
                assert_eq!(g.opens, vec![id], "oplock shared");
                assert!(
                    OPLOCK_STATES.contains(&g.state),
                    "oplock state {:#x}",
                    g.state
                );
                assert!(!is_dir, "oplock on a directory");
            }
            Holder::Lease(id) => {
                assert!(
                    LEASE_STATES.contains(&g.state),
                    "{id:?} in state {:#x}",
                    g.state
                );
                assert!(!is_dir || g.state & WRITE == 0, "directory lease with W");
                for o in &g.opens {
                    let lease = w.opens.iter().find(|x| x.id == *o).and_then(|x| x.lease);
                    assert_eq!(lease, Some(id), "open {o} in a lease it did not ask for");
                }
            }
        }
        if let Some(b) = g.breaking {
            assert!(
                subset(b.sent, g.state) && b.sent != g.state,
                "{:?}: break {b:?} from {:#x} lowers nothing",
                g.holder,
                g.state
            );
            assert!(subset(b.required, b.sent), "{:?}: break {b:?}", g.holder);
            let serial = e
                .break_serial
                .iter()
                .find(|(h, _)| *h == g.holder)
                .map(|&(_, s)| s);
            let timed = serial.is_some_and(|serial| {
                w.oplocks.timers.contains(&Timer {
                    file: e.key,
                    holder: g.holder,
                    serial,
                })
            });
            assert!(
                timed,
                "break of {:?} has no timer: only a close ends it",
                g.holder
            );
        }
        if g.state & WRITE != 0 {
            write_caching_alone(w, s, g.holder, &g.opens);
        }
    }
    if s.grants
        .iter()
        .any(|g| is_lease(g.holder) && g.state & HANDLE != 0)
    {
        assert!(
            !s.grants.iter().any(|g| !is_lease(g.holder)),
            "handle-caching lease beside an oplock: {:?}",
            s.grants
        );
    }
    assert!(
        e.waiters.is_empty() || s.breaking(),
        "requests wait on a file where no break is under way: nothing wakes them"
    );
}

/// A holder caching writes is the only one caching anything, and every
/// other open of the file shares its lease (or will, once admitted) or is
/// one its caching ignores.
fn write_caching_alone(w: &World, s: &FileCaching, holder: Holder, opens: &[u64]) {
    let stat = if is_lease(holder) { LEASE_STAT } else { STAT };
    let joins = |id: u64| {
        w.stalled.iter().any(|x| {
            x.ask.open_id == id
                && matches!(x.ask.want, Want::Lease { id: l, .. } if Holder::Lease(l) == holder)
        })
    };
    for o in &s.opens {
        if !opens.contains(&o.open_id) && !joins(o.open_id) {
            let access = ask_access(w, o.open_id);
            assert!(
                only(access, stat),
                "{holder:?} caches writes beside open {} with access {access:#x}",
                o.open_id
            );
        }
    }
    for g in &s.grants {
        assert!(
            g.holder == holder || g.state == 0,
            "{holder:?} caches writes while {:?} caches {:#x}",
            g.holder,
            g.state
        );
    }
}

/// A lease key names one file, and the index of leases agrees with the
/// files' grants.
fn leases(w: &World) {
    let index = &w.oplocks.lease_files;
    for (i, (id, key)) in index.iter().enumerate() {
        assert!(
            index[..i].iter().all(|(l, _)| l != id),
            "{id:?} indexed twice"
        );
        let held = w
            .oplocks
            .state(*key)
            .is_some_and(|s| s.grant(Holder::Lease(*id)).is_some());
        assert!(held, "{id:?} indexed on {key:?}, which has no such lease");
    }
    for e in &w.oplocks.files {
        for g in &e.state.grants {
            if let Holder::Lease(id) = g.holder {
                assert!(
                    index.contains(&(id, e.key)),
                    "{id:?} on {:?} is not indexed there: acknowledgements go astray",
                    e.key
                );
            }
        }
    }
}

/// Whether two ranges share a byte; a zero-length range shares one with
/// a range it lies strictly inside of (MS-FSA 2.1.4.10 as Windows does it).
fn overlap(a: (u64, u64), b: (u64, u64)) -> bool {
    let end = |(off, len): (u64, u64)| u128::from(off) + u128::from(len);
    let (a0, b0) = (u128::from(a.0), u128::from(b.0));
    match (a.1 == 0, b.1 == 0) {
        (false, false) => a0 < end(b) && b0 < end(a),
        (true, false) => b0 < a0 && a0 < end(b),
        (false, true) => a0 < b0 && b0 < end(a),
        (true, true) => false,
    }
}

/// `a` granted before `b`: an exclusive lock overlaps nothing of another
/// open's, and an open cannot take an exclusive lock over its own.
fn locks_conflict(a: &RangeLock, b: &RangeLock) -> bool {
    if !overlap((a.offset, a.length), (b.offset, b.length)) {
        return false;
    }
    if a.owner == b.owner {
        b.exclusive
    } else {
        a.exclusive || b.exclusive
    }
}

/// MS-FSA 2.1.5.1.2: two opens' data access and sharing agree.
fn share_conflict(a: &OpenRecord, b: &OpenRecord) -> bool {
    let data = READ_DATA | WRITE_DATA | APPEND_DATA | EXECUTE | DELETE;
    if a.access & data == 0 || b.access & data == 0 {
        return false;
    }
    let refuses = |access: u32, share: u32| {
        (access & (READ_DATA | EXECUTE) != 0 && share & 1 == 0)
            || (access & (WRITE_DATA | APPEND_DATA) != 0 && share & 2 == 0)
            || (access & DELETE != 0 && share & 4 == 0)
    };
    refuses(a.access, b.share_access) || refuses(b.access, a.share_access)
}

fn share_modes(w: &World, key: FileKey) {
    let rec = w.shares.record(key).expect("memory store");
    let mut expected = admitted(w, key);
    expected.extend(stalled(w, key));
    assert_eq!(
        sorted(rec.opens.iter().map(|o| o.open_id).collect()),
        sorted(expected),
        "share modes list other opens"
    );
    for (i, a) in rec.opens.iter().enumerate() {
        for b in &rec.opens[i + 1..] {
            assert!(!share_conflict(a, b), "opens {a:?} and {b:?} share badly");
        }
    }
}

/// Every request answered STATUS_PENDING is waiting somewhere, or running
/// again (a CREATE stalled on its disk open), once: none is forgotten
/// without an answer.
fn requests(w: &World) {
    let mut parked: Vec<u64> = w
        .oplocks
        .files
        .iter()
        .flat_map(|e| e.waiters.iter().map(|x| x.async_id))
        .collect();
    parked.extend(
        w.locks
            .files
            .iter()
            .flat_map(|f| f.waiting.iter().map(|x| x.async_id)),
    );
    parked.extend(w.stalled.iter().filter_map(|s| s.async_id));
    assert_eq!(
        sorted(parked),
        sorted(w.outstanding.clone()),
        "pending requests and waiters differ"
    );
}
