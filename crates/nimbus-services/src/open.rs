//! What a session holds open: trees, opens of files and directories, and
//! opens of named pipes (MS-SMB2 3.3.1.10 Tree Connect, 3.3.1.10 Open).
//! Below the session and the connection: the services that act on opens
//! (oplocks, locks, notify, durable handles, write times) need these, not
//! the session that holds them.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use nimbus_state::caching::LeaseId;
use nimbus_state::FileKey;
use nimbus_vfs::{DirEntry, FileHandle};

use crate::dir_budget::EntryLease;
use crate::durable_handle::{Durable, GuidKey};
use crate::held_bytes::HeldCharge;
use crate::open_files::OpenFileSlot;
use crate::share::Share;
use crate::sync::lock;

/// An open of a named pipe on IPC$ (srvsvc, wkssvc): the RPC
/// association of the client with that service.
pub struct PipeOpen {
    pub file_id: nimbus_wire::FileId,
    pub tree_id: u32,
    pub pipe: Mutex<HeldPipe>,
}

/// A pipe and what the bytes it holds count against a connection's memory
/// budget (`crate::held_bytes`), kept equal after every write and read.
pub struct HeldPipe {
    pub pipe: nimbus_rpc::Pipe,
    pub charge: HeldCharge,
}

pub struct Tree {
    pub id: u32,
    pub share: Arc<Share>,
    /// Requests on this tree must arrive encrypted (Share.EncryptData).
    pub encrypt_data: bool,
    /// When the tree was connected (NetrConnectionEnum's time).
    pub connected: std::time::Instant,
}

impl Tree {
    /// Access this session has on the share (MS-SMB2
    /// TreeConnect.MaximalAccess): read-only follows the share's setting
    /// now, so that a reload that makes a share read-only holds for
    /// the trees already connected.
    pub fn maximal_access(&self) -> u32 {
        share_maximal_access(&self.share)
    }
}

/// The most a tree connect of `share` allows.
pub fn share_maximal_access(share: &Share) -> u32 {
    use nimbus_wire::fscc::access;
    if share.read_only() || share.is_ipc() {
        access::FILE_GENERIC_READ | access::FILE_GENERIC_EXECUTE
    } else {
        access::FILE_ALL_ACCESS
    }
}

/// Where a directory enumeration stands (MS-SMB2 Open.EnumerationLocation).
pub struct DirEnum {
    /// Entries matching the pattern, "." and ".." first; taken by position.
    pub entries: Vec<DirEntry>,
    pub pos: usize,
    /// The entries' place in the connection's budget.
    pub _lease: EntryLease,
}

pub struct Open {
    /// FileId.Volatile; a reclaimed durable open gets a new one in its new
    /// session.
    volatile_id: AtomicU64,
    pub open_id: u64,
    /// The tree connect it is reached through; a reclaimed durable open
    /// moves to the tree of the reconnect.
    tree_id: AtomicU32,
    pub share: Arc<Share>,
    pub handle: FileHandle,
    /// Path relative to the share root ('/'-separated); changes on rename.
    pub path: Mutex<String>,
    pub is_dir: bool,
    pub access: u32,
    /// ShareAccess it was opened with (a persistent open's record keeps it).
    pub share_access: u32,
    pub file_key: FileKey,
    pub delete_on_close: AtomicBool,
    pub position: AtomicU64,
    pub mode: AtomicU32,
    pub dir_enum: Mutex<Option<DirEnum>>,
    /// The directory lease the client named as this open's parent
    /// (ParentLeaseKey): changes through this open do not break it.
    pub parent_lease: Option<LeaseId>,
    /// Data was written through this open: its directory's leases break
    /// when it closes.
    pub wrote: AtomicBool,
    /// The next extended attribute a FileFullEaInformation query without
    /// SL_RESTART_SCAN returns (0-based).
    pub ea_index: AtomicU32,
    /// Kept through a lost connection for a reconnect (MS-SMB2
    /// Open.IsDurable and what goes with it); None for other opens.
    pub durable: Mutex<Option<Durable>>,
    /// Made by a CREATE with a DH2Q context: what a replay of that CREATE
    /// needs.
    pub replay: Option<ReplayOf>,
    /// A CREATE replayed with this open's CreateGuid gets this open back
    /// (MS-SMB2 Open.IsReplayEligible); cleared by the first other request
    /// on it, after which the client is known to have had the response.
    pub replay_eligible: AtomicBool,
    /// MS-SMB2 Open.AppInstanceId: a later durable CREATE of the same file
    /// under the same id (an application failed over to another client
    /// node) closes this open.
    pub app_instance: Option<[u8; 16]>,
    /// The session it belongs to (a reclaimed durable open moves).
    session_id: AtomicU64,
    /// MS-SMB2 Open.LockSequenceArray: per bucket (1..=64), the sequence
    /// number of the last LOCK that succeeded with it, or NO_LOCK_SEQUENCE;
    /// kept by durable opens, whose client may replay a LOCK it sent before
    /// a reconnect (3.3.5.14).
    pub lock_sequences: Mutex<[u8; 64]>,
    /// MS-SMB2 Open.ChannelSequence (3.x): a WRITE, SET_INFO or IOCTL
    /// naming an older one is refused (3.3.5.2.10).
    pub channel_sequence: std::sync::atomic::AtomicU16,
    /// This open's place in the server-wide count of open files.
    pub _file_slot: OpenFileSlot,
    /// Set when the open is of a named stream: `handle` reads and writes
    /// the stream, the file's metadata is its base's.
    pub stream: Option<StreamOf>,
    /// Counted among its file's opens in the state store (share modes and
    /// caching). False for an attribute-only open a cluster node let go on
    /// without a record (`ShareModes::attribute_open`): its close has
    /// nothing of it to remove.
    pub recorded: bool,
}

/// The named stream an open is of (MS-FSCC 2.1.5.3). Its share modes,
/// oplocks and locks are its own (`Open::file_key` is the stream's); its
/// times, attributes, EAs and file id are those of the file it belongs to.
pub struct StreamOf {
    /// As created (a rename changes it); without `:$DATA`.
    pub name: Mutex<String>,
    /// An attribute-only handle of the file the stream belongs to.
    pub base: FileHandle,
    pub base_key: FileKey,
    pub base_is_dir: bool,
}

/// An entry of `Open::lock_sequences` that holds no sequence number (they
/// are 4 bits).
pub const NO_LOCK_SEQUENCE: u8 = 0xFF;

/// The CREATE that made an open, as a replay of it is answered.
pub struct ReplayOf {
    pub key: GuidKey,
    pub create_action: nimbus_wire::create::CreateAction,
}

/// What an `Open` is made of; `Open::new` adds the state every open
/// starts with.
pub struct NewOpen {
    pub volatile_id: u64,
    pub open_id: u64,
    pub tree_id: u32,
    pub share: Arc<Share>,
    pub handle: FileHandle,
    pub path: String,
    pub is_dir: bool,
    pub access: u32,
    pub file_key: FileKey,
    pub delete_on_close: bool,
    pub mode: u32,
    pub parent_lease: Option<LeaseId>,
    pub file_slot: OpenFileSlot,
    pub replay: Option<ReplayOf>,
    pub channel_sequence: u16,
    pub app_instance: Option<[u8; 16]>,
    pub session_id: u64,
    pub share_access: u32,
    pub stream: Option<StreamOf>,
    pub recorded: bool,
}

impl Open {
    pub fn new(n: NewOpen) -> Open {
        Open {
            volatile_id: AtomicU64::new(n.volatile_id),
            open_id: n.open_id,
            tree_id: AtomicU32::new(n.tree_id),
            share: n.share,
            handle: n.handle,
            path: Mutex::new(n.path),
            is_dir: n.is_dir,
            access: n.access,
            share_access: n.share_access,
            file_key: n.file_key,
            delete_on_close: AtomicBool::new(n.delete_on_close),
            position: AtomicU64::new(0),
            mode: AtomicU32::new(n.mode),
            dir_enum: Mutex::new(None),
            parent_lease: n.parent_lease,
            wrote: AtomicBool::new(false),
            ea_index: AtomicU32::new(0),
            durable: Mutex::new(None),
            replay_eligible: AtomicBool::new(n.replay.is_some()),
            replay: n.replay,
            channel_sequence: std::sync::atomic::AtomicU16::new(n.channel_sequence),
            app_instance: n.app_instance,
            lock_sequences: Mutex::new([NO_LOCK_SEQUENCE; 64]),
            session_id: AtomicU64::new(n.session_id),
            _file_slot: n.file_slot,
            stream: n.stream,
            recorded: n.recorded,
        }
    }

    /// The handle of the file's metadata (times, attributes, EAs): the
    /// base file's for an open of a named stream.
    pub fn meta(&self) -> &FileHandle {
        self.stream.as_ref().map_or(&self.handle, |s| &s.base)
    }

    /// The file whose metadata this open shows: the base file's for an
    /// open of a named stream.
    pub fn meta_key(&self) -> FileKey {
        self.stream.as_ref().map_or(self.file_key, |s| s.base_key)
    }

    /// The name a client sees for this open, as FileNameInformation gives
    /// it: `\dir\file`, or `\dir\file:stream` without `:$DATA`.
    pub fn smb_name(&self) -> String {
        let mut name = nimbus_vfs::names::to_smb_name(&self.path());
        if let Some(s) = &self.stream {
            name.push(':');
            name.push_str(&lock(&s.name));
        }
        name
    }

    pub fn path(&self) -> String {
        lock(&self.path).clone()
    }

    pub fn volatile_id(&self) -> u64 {
        self.volatile_id.load(Ordering::Relaxed)
    }

    pub fn tree_id(&self) -> u32 {
        self.tree_id.load(Ordering::Relaxed)
    }

    pub fn session_id(&self) -> u64 {
        self.session_id.load(Ordering::Relaxed)
    }

    /// A reclaimed durable open is reached through its new session and
    /// tree under a new volatile id.
    pub fn reattach(&self, session_id: u64, tree_id: u32, volatile_id: u64) {
        self.session_id.store(session_id, Ordering::Relaxed);
        self.tree_id.store(tree_id, Ordering::Relaxed);
        self.volatile_id.store(volatile_id, Ordering::Relaxed);
    }

    pub fn is_durable(&self) -> bool {
        lock(&self.durable).is_some()
    }

    pub fn is_persistent(&self) -> bool {
        lock(&self.durable).as_ref().is_some_and(|d| d.persistent)
    }

    /// Whether the open's record is in the state store (see
    /// `Durable::in_store`).
    pub fn has_record(&self) -> bool {
        lock(&self.durable).as_ref().is_some_and(|d| d.in_store)
    }
}
