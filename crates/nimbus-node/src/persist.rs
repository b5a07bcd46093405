//! Persistent handles (MS-SMB2 3.3.5.9.10 with SMB2_DHANDLE_FLAG_PERSISTENT,
//! on a continuously available share): the open's record goes to the store
//! on disk (`state_dir`) before its CREATE is answered, follows its locks
//! (on disk before the LOCK is answered), its caching (a lease or oplock
//! broken, acknowledged or timed out), position and mode (those without
//! waiting for the disk), is marked answered once the response is written,
//! and goes when the open closes. At start, every record is opened again
//! and kept disconnected for its client to reclaim, until its timeout.
//! That includes a record not marked answered: the mark is written after
//! the response left, so a client may hold the handle though a crash took
//! the mark (tests/test_power_loss.py). A record whose answer really never
//! left only keeps its file for the handle's timeout, or until its client
//! replays the CREATE.
//!
//! What a restart loses on purpose: write caching. A restored open holds
//! its lease without W (an oplock no more than level II): its client
//! flushes what it cached when it reconnects, and nobody waits on a break
//! it cannot acknowledge meanwhile.

use std::sync::Arc;
use std::time::{Duration, Instant};

use nimbus_state::caching::{self, Granted, OpenAsk, Want};
use nimbus_state::durable_record::{Answered, Caching, DurableOpen, OPEN_PREFIX};
use nimbus_state::{records, Durability, FileKey, OpenRecord, StateError};
use nimbus_vfs::{CreateMode, FileHandle, Identity, Kind, OpenOptions, VfsError};
use nimbus_wire::create::CreateAction;
use nimbus_wire::fscc::access;
use nimbus_wire::FileId;

use crate::durable::{Durable, Owner};
use crate::open::{NewOpen, Open, ReplayOf};
use crate::oplocks::Route;
use crate::server::{Server, Share};
use crate::sync::lock;

/// Writes `open`'s record as it stands now, on disk before it returns.
/// Errors are the caller's: a CREATE whose record could not be written is
/// answered without the persistent flag.
pub fn save(server: &Server, open: &Open) -> Result<(), StateError> {
    save_with(server, open, Durability::Now)
}

fn save_with(server: &Server, open: &Open, durability: Durability) -> Result<(), StateError> {
    save_as(server, open, durability, None)
}

/// The file of `open` (or a directory above it) is about to be renamed
/// from `from` to `to` (share-relative): its record says so, on disk
/// before the rename, so that a start after a crash in between finds the
/// file under either name. `changed` after the rename clears it.
pub fn renaming(server: &Server, open: &Open, from: &str, to: &str) {
    if !open.has_record() {
        return;
    }
    if let Err(e) = save_as(
        server,
        open,
        Durability::Now,
        Some((from.into(), to.into())),
    ) {
        tracing::error!("durable open {}: record not updated: {e}", open.open_id);
    }
}

fn save_as(
    server: &Server,
    open: &Open,
    durability: Durability,
    renaming: Option<(String, String)>,
) -> Result<(), StateError> {
    let Some(store) = server.disk_store.as_ref() else {
        return Err(StateError::Unavailable("no state_dir".into()));
    };
    // Held until the record is written: two saves of one open (a LOCK's
    // and the answered mark's) write in turn, the later one seeing all the
    // earlier one did.
    let guard = lock(&open.durable);
    let Some(d) = guard.as_ref().filter(|d| d.in_store && !d.forgotten) else {
        return Ok(());
    };
    let (granted, lease) = server.oplocks.held_by(open.file_key, open.open_id);
    let caching = match (granted, lease) {
        (
            Granted::Lease {
                state,
                epoch,
                version,
                ..
            },
            Some(id),
        ) => Caching::Lease {
            id,
            state,
            epoch,
            version,
        },
        (Granted::Oplock(level), _) if level != caching::OPLOCK_NONE => Caching::Oplock(level),
        _ => Caching::Nothing,
    };
    let (client_guid, create_guid, create_action) = match &open.replay {
        Some(r) => (r.key.0, r.key.1, r.create_action as u8),
        None => ([0; 16], [0; 16], CreateAction::Opened as u8),
    };
    let record = DurableOpen {
        open_id: open.open_id,
        file: open.file_key,
        share: open.share.name.clone(),
        path: open.path(),
        access: open.access,
        share_access: open.share_access,
        mode: open.mode.load(std::sync::atomic::Ordering::Relaxed),
        position: open.position.load(std::sync::atomic::Ordering::Relaxed),
        delete_on_close: open
            .delete_on_close
            .load(std::sync::atomic::Ordering::Relaxed),
        owner_sid: d.owner.sid.clone(),
        owner_name: d.owner.name.clone(),
        client_guid,
        create_guid,
        timeout_ms: d.timeout.as_millis().min(u32::MAX as u128) as u32,
        caching,
        locks: server.locks.held_by(open.file_key, open.open_id),
        lock_sequences: *lock(&open.lock_sequences),
        create_action,
        answered: if d.answered {
            Answered::Yes
        } else {
            Answered::Not
        },
        persistent: d.persistent,
        renaming,
    };
    // On a cluster node the file's records stay in etcd from now on, so
    // that they outlive this node (`crate::failover`).
    if let Some(m) = &server.cluster {
        m.pin(open.open_id);
        m.share_file(open.file_key)?;
    }
    let written = records::update_with::<DurableOpen, _, StateError>(
        &**store,
        &DurableOpen::key(open.open_id),
        durability,
        |r| {
            *r = record.clone();
            Ok(())
        },
    );
    drop(guard);
    written
}

/// Saves a persistent open after a change (its locks), on disk before it
/// returns; a store that fails is logged: the change itself stands, the
/// record is behind.
pub fn changed(server: &Server, open: &Open) {
    changed_with(server, open, Durability::Now)
}

/// Saves a persistent open after a change the client did not wait on the
/// disk for (its caching lowered by a break, its position or mode set),
/// without waiting for the disk: the write rides with the next durable
/// commit, or the store's flush a few milliseconds later.
pub fn changed_soon(server: &Server, open: &Open) {
    changed_with(server, open, Durability::Soon)
}

fn changed_with(server: &Server, open: &Open, durability: Durability) {
    if !open.has_record() {
        return;
    }
    if let Err(e) = save_with(server, open, durability) {
        tracing::error!("durable open {}: record not updated: {e}", open.open_id);
    }
}

/// The CREATE's response was written: the record now names a handle the
/// client knows. The mark need not wait for the disk (`Durability::Soon`):
/// the record itself already is there, and a start restores it marked or
/// not.
///
/// On a cluster node the mark is an etcd write: the connection's writer
/// waits for it (the next response goes out after it, so a client that
/// heard of anything later on the connection has an answered record), and
/// lets the runtime move its other tasks to another worker meanwhile.
pub fn answered(server: &Server, open: &Open) {
    if let Some(d) = lock(&open.durable).as_mut() {
        d.answered = true;
    }
    changed_with(server, open, Durability::Soon);
}

/// `open` closed for good: its record goes. Without waiting for the disk
/// (`Durability::Soon`): a crash within the store's flush delay brings the
/// handle back at start, where, never reclaimed, it expires with its
/// timeout.
pub fn forget(server: &Server, open: &Open) {
    // Marked under the lock saves hold while they write: a save that
    // started first is on the store before the removal, a later one
    // writes nothing.
    let mut guard = lock(&open.durable);
    match guard.as_mut() {
        Some(d) if d.in_store => d.forgotten = true,
        _ => return,
    }
    let Some(store) = server.disk_store.as_ref() else {
        return;
    };
    let key = DurableOpen::key(open.open_id);
    let r = (|| {
        let Some(current) = store.get(&key)? else {
            return Ok(());
        };
        store.compare_and_set_with(&key, Some(current.version), None, Durability::Soon)?;
        Ok::<(), StateError>(())
    })();
    drop(guard);
    if let Err(e) = r {
        tracing::error!("durable open {}: record not removed: {e}", open.open_id);
    }
    if let Some(m) = &server.cluster {
        m.closed(open.open_id);
    }
}

/// At start: every answered record becomes a disconnected open again,
/// kept for its timeout (from now) for its client to reclaim. Returns how
/// many were restored.
pub fn restore(server: &Arc<Server>) -> Result<usize, StateError> {
    let Some(store) = server.disk_store.clone() else {
        return Ok(0);
    };
    let now = Instant::now();
    let mut restored = 0;
    for (key, v) in store.scan_prefix(OPEN_PREFIX)? {
        let record = match <DurableOpen as records::Record>::decode(&v.value) {
            Ok(r) => r,
            Err(e) => {
                // Never silently: the operator sees which record and why.
                tracing::error!(
                    "state store: open record {} unreadable: {e}; dropped",
                    crate::oplocks::hex(&key)
                );
                crate::errors::cleanup(
                    format_args!("dropping open record {}", crate::oplocks::hex(&key)),
                    store.compare_and_set(&key, Some(v.version), None),
                );
                continue;
            }
        };
        server.reserve_open_id(record.open_id);
        match reopen(server, &record, now) {
            Ok(()) => restored += 1,
            Err(why) => {
                tracing::warn!(
                    "persistent open {} of {} not restored: {why}; its record is dropped",
                    record.open_id,
                    record.path
                );
                crate::errors::cleanup(
                    format_args!("dropping the record of open {}", record.open_id),
                    store.compare_and_set(&key, Some(v.version), None),
                );
            }
        }
    }
    Ok(restored)
}

/// Why an open's record could not be made an open again, at a restart
/// or a take-over of a gone node's open.
#[derive(Debug)]
pub(crate) enum NotReopened {
    /// The node's earlier incarnation could not be adopted.
    Incarnation(StateError),
    /// The share is gone, or a persistent open's share is no longer
    /// continuously available.
    ShareGone(String),
    NotDiskShare,
    /// The file is not found again: by its name, nor as renamed to
    /// `moved` (a rename under way when the record was last written).
    File {
        moved: Option<String>,
        error: nimbus_vfs::VfsError,
    },
    TooManyOpenFiles,
    ShareModes(nimbus_state::SharingError),
    Locks(nimbus_wire::NtStatus),
    /// Not kept as a disconnected open (too many).
    NotKept(crate::durable::NotKept),
}

impl std::fmt::Display for NotReopened {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NotReopened::Incarnation(e) => write!(f, "cannot adopt its node incarnation: {e}"),
            NotReopened::ShareGone(share) => write!(
                f,
                "share \"{share}\" is gone or no longer continuously available"
            ),
            NotReopened::NotDiskShare => write!(f, "not a disk share"),
            NotReopened::File {
                moved: Some(moved),
                error,
            } => write!(
                f,
                "the file cannot be opened again, by its name or as renamed to {moved}: {error}"
            ),
            NotReopened::File { moved: None, error } => {
                write!(f, "the file cannot be opened again: {error}")
            }
            NotReopened::TooManyOpenFiles => write!(f, "too many open files"),
            NotReopened::ShareModes(e) => write!(f, "share modes: {e:?}"),
            NotReopened::Locks(s) => write!(f, "its byte-range locks: {s:?}"),
            NotReopened::NotKept(why) => write!(f, "{why:?}"),
        }
    }
}

fn reopen(server: &Arc<Server>, r: &DurableOpen, now: Instant) -> Result<(), NotReopened> {
    if r.answered != Answered::Yes {
        tracing::info!(
            "persistent open {} of {}: its CREATE's answer is not marked (the mark may have been lost with the crash); kept for its client as the others",
            r.open_id,
            r.path
        );
    }
    // An open of this node's earlier run: that run's incarnation lives on
    // under this node's lease, so other nodes do not take its entries for
    // a dead node's.
    if let Some(m) = &server.cluster {
        m.adopt(crate::cluster::incarnation_of(r.open_id))
            .map_err(NotReopened::Incarnation)?;
    }
    let (share, handle, file, path) = open_file_again(server, r)?;
    let _through = opened_through(server, &share, &path)?;
    let r = &DurableOpen { path, ..r.clone() };
    let slot = server
        .open_files
        .reserve()
        .ok_or(NotReopened::TooManyOpenFiles)?;
    add_share_mode(server, r, file)?;
    let open = open_of_record(server, r, share, handle, file, slot);
    if !r.locks.is_empty() {
        server
            .locks
            .lock(file, r.open_id, r.locks.clone(), None)
            .granted()
            .map_err(NotReopened::Locks)?;
    }
    // Its caching comes back without write caching (see the module text).
    let want = match r.caching {
        Caching::Nothing => Want::Nothing,
        Caching::Oplock(_) => Want::Oplock(caching::OPLOCK_II),
        Caching::Lease {
            id,
            state,
            epoch,
            version,
        } => Want::Lease {
            id,
            state: state & !caching::WRITE,
            version,
            parent_key: None,
            epoch,
        },
    };
    let ask = OpenAsk {
        open_id: r.open_id,
        access: r.access,
        overwrite: false,
        sharing_violation: false,
        is_dir: false,
        has_byte_range_locks: false,
        want,
    };
    server.oplocks.contend(file, &ask);
    let route = Route::unconnected(FileId {
        persistent: r.open_id,
        volatile: open.volatile_id(),
    });
    server.oplocks.admit(file, &ask, route);
    wait_for_client(server, &open, r, now)?;
    tracing::info!(
        "persistent open {} of {} restored; its client has {} ms to reclaim it",
        r.open_id,
        r.path,
        r.timeout_ms
    );
    Ok(())
}

/// Puts record `r`'s share-mode entry on `file` (again: an entry of the
/// same open id is replaced, so one still there is kept as it is).
pub(crate) fn add_share_mode(
    server: &Server,
    r: &DurableOpen,
    file: FileKey,
) -> Result<(), NotReopened> {
    server
        .share_modes
        .add_open(
            file,
            OpenRecord {
                open_id: r.open_id,
                access: r.access,
                share_access: r.share_access,
            },
        )
        .map_err(NotReopened::ShareModes)
}

/// Opens the file of record `r` again on its share, which must still be
/// continuously available for a persistent open; the file must be the one
/// the record names. Returns the path it was found at: the record's, or,
/// when a rename was in progress, the renamed one.
/// The scope under which a file reopened at `path` is looked up
/// (`crate::directory_scope`).
pub(crate) fn opened_through(
    server: &Server,
    share: &Share,
    path: &str,
) -> Result<Option<nimbus_state::OpeningIn>, NotReopened> {
    let Some(fs) = share.fs.as_ref() else {
        return Ok(None);
    };
    let dir = crate::directory_scope::directory_of(server, fs, path)
        .map_err(|error| NotReopened::File { moved: None, error })?;
    Ok(crate::directory_scope::through(dir))
}

pub(crate) fn open_file_again(
    server: &Server,
    r: &DurableOpen,
) -> Result<(Arc<Share>, FileHandle, FileKey, String), NotReopened> {
    let share = server
        .find_share(&r.share)
        .filter(|s| s.continuous_availability || !r.persistent)
        .ok_or_else(|| NotReopened::ShareGone(r.share.clone()))?;
    let fs = share.fs.as_ref().ok_or(NotReopened::NotDiskShare)?;
    let write_rights = access::FILE_WRITE_DATA | access::FILE_APPEND_DATA;
    let opts = OpenOptions {
        read: r.access & (access::FILE_READ_DATA | access::FILE_EXECUTE) != 0,
        write: r.access & write_rights != 0,
        mode: CreateMode::OpenExisting,
        kind: Kind::File,
        perm: 0o644,
        append_only: r.access & write_rights == access::FILE_APPEND_DATA,
        expect: Some(Identity::new(r.file.dev, r.file.ino, r.file.gen)),
    };
    let (path, (handle, st, _)) = match (fs.open(&r.path, &opts), r.moved_path()) {
        (Ok(found), _) => (r.path.clone(), found),
        (Err(_), Some(moved)) => match fs.open(&moved, &opts) {
            Ok(found) => (moved, found),
            Err(error) => {
                return Err(NotReopened::File {
                    moved: Some(moved),
                    error,
                })
            }
        },
        (Err(error), None) => return Err(NotReopened::File { moved: None, error }),
    };
    // The open checked device and inode; a file made since under the
    // record's name may have reused the inode (a delete and a create
    // while the server was down, or on another node). Its handle differs.
    // A record written before generations were kept has 0: not checked.
    if r.file.gen != 0 && st.gen != r.file.gen {
        return Err(NotReopened::File {
            moved: (path != r.path).then_some(path),
            error: VfsError::Changed,
        });
    }
    let file = FileKey {
        dev: st.dev,
        ino: st.ino,
        gen: st.gen,
    };
    Ok((share, handle, file, path))
}

/// The open record `r` describes, on `handle` (its position, mode and lock
/// sequences as recorded); nothing knows of it yet.
pub(crate) fn open_of_record(
    server: &Server,
    r: &DurableOpen,
    share: Arc<Share>,
    handle: FileHandle,
    file: FileKey,
    file_slot: crate::open_files::OpenFileSlot,
) -> Arc<Open> {
    let replay = (r.create_guid != [0; 16]).then_some(ReplayOf {
        key: (r.client_guid, r.create_guid),
        create_action: match r.create_action {
            0 => CreateAction::Superseded,
            2 => CreateAction::Created,
            3 => CreateAction::Overwritten,
            _ => CreateAction::Opened,
        },
    });
    let open = Arc::new(Open::new(NewOpen {
        volatile_id: server.new_volatile_id(r.open_id, |_| false),
        open_id: r.open_id,
        tree_id: 0,
        share,
        handle,
        path: r.path.clone(),
        is_dir: false,
        access: r.access,
        file_key: file,
        delete_on_close: r.delete_on_close,
        mode: r.mode,
        parent_lease: None,
        file_slot,
        replay,
        channel_sequence: 0,
        app_instance: None,
        session_id: 0,
        share_access: r.share_access,
        // Opens of named streams are never made durable.
        stream: None,
        recorded: true,
    }));
    open.position
        .store(r.position, std::sync::atomic::Ordering::Relaxed);
    *lock(&open.lock_sequences) = r.lock_sequences;
    open
}

/// Registers `open` (of record `r`) as an open whose client is gone, kept
/// for its timeout from `since`, its record in the store.
pub(crate) fn wait_for_client(
    server: &Server,
    open: &Arc<Open>,
    r: &DurableOpen,
    since: Instant,
) -> Result<(), NotReopened> {
    server.opens.register(open);
    server.durables.granted(
        open,
        Durable {
            timeout: Duration::from_millis(r.timeout_ms as u64),
            persistent: r.persistent,
            in_store: true,
            owner: Owner {
                sid: r.owner_sid.clone(),
                name: r.owner_name.clone(),
            },
            answered: true,
            forgotten: false,
        },
    );
    server.durables.name_open(open);
    server.oplocks.detach(r.open_id);
    server
        .durables
        .disconnect(open, since)
        .map_err(NotReopened::NotKept)
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use nimbus_auth::UserDb;
    use nimbus_crypto::CryptoProvider;
    use nimbus_state::RedbStore;

    use super::*;
    use crate::config::{Config, ShareConfig};

    /// The record of an open of `name` in `share_dir` as a CREATE leaves it.
    fn record(share_dir: &Path, open_id: u64, name: &str, answered: Answered) -> DurableOpen {
        let path = share_dir.join(name);
        std::fs::write(&path, b"data").unwrap();
        let st = nimbus_vfs::LocalFs::new(share_dir)
            .unwrap()
            .stat(name)
            .unwrap();
        assert_ne!(st.gen, 0, "the test's file system gives file handles");
        DurableOpen {
            open_id,
            file: FileKey {
                dev: st.dev,
                ino: st.ino,
                gen: st.gen,
            },
            share: "ca".into(),
            path: name.into(),
            access: access::FILE_READ_DATA,
            share_access: 1,
            owner_sid: "S-1-5-21-1-2-3-1000".into(),
            timeout_ms: 60_000,
            answered,
            ..DurableOpen::default()
        }
    }

    /// Every record comes back at start as a handle waiting for its
    /// client, marked answered or not: the mark follows the response, so
    /// a crash can take the mark of a handle its client holds.
    #[test]
    fn start_restores_records_whether_or_not_their_answer_is_marked() {
        let dir = std::env::temp_dir().join(format!("nimbus-persist-start-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let share_dir = dir.join("share");
        let state_dir = dir.join("state");
        std::fs::create_dir_all(&share_dir).unwrap();
        {
            let store = RedbStore::open(&state_dir).unwrap();
            for r in [
                record(&share_dir, 7, "answered.txt", Answered::Yes),
                record(&share_dir, 8, "never.txt", Answered::Not),
            ] {
                records::update::<DurableOpen, _, StateError>(
                    &store,
                    &DurableOpen::key(r.open_id),
                    |slot| {
                        *slot = r.clone();
                        Ok(())
                    },
                )
                .unwrap();
            }
        }
        let db_path = dir.join("users.db");
        let mut db = UserDb::load_or_empty(&db_path).unwrap();
        db.add(
            "alice",
            "Al1ce-Secret!",
            &CryptoProvider::default_provider(),
        )
        .unwrap();
        db.save(&db_path).unwrap();
        let config = Config {
            listen: vec![std::net::SocketAddr::from(([127, 0, 0, 1], 0))],
            user_db: db_path,
            state_dir: Some(state_dir.clone()),
            shares: vec![ShareConfig {
                name: "ca".into(),
                path: share_dir,
                read_only: false,
                guest_ok: false,
                encryption: None,
                comment: String::new(),
                continuous_availability: true,
                access_based_enumeration: false,
                apple_extensions: true,
                hide_dot_files: true,
                hide_files: Vec::new(),
            }],
            ..Config::default()
        };
        let server = Server::new(config).unwrap();
        let store = server.disk_store.clone().unwrap();
        let left: Vec<u64> = store
            .scan_prefix(OPEN_PREFIX)
            .unwrap()
            .iter()
            .map(|(_, v)| {
                <DurableOpen as records::Record>::decode(&v.value)
                    .unwrap()
                    .open_id
            })
            .collect();
        assert_eq!(left, vec![7, 8]);
        assert_eq!(server.durables.disconnected_count(), 2);
        assert!(server.durables.find_disconnected(7).is_some());
        assert!(server.durables.find_disconnected(8).is_some());
        drop(store);
        drop(server);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
