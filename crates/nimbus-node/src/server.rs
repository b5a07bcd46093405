//! `Server`: a node's shares, its configuration and the services every
//! request and every background task reaches (share modes, oplocks, locks,
//! notify, durable opens, sessions, the cluster membership), with the ids
//! it hands out. It imports only the types of what it holds; building and
//! running it is `crate::start`.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use nimbus_auth::Authenticator;
use nimbus_crypto::CryptoProvider;
use nimbus_state::{ShareModes, StateStore};
use nimbus_wire::fscc::unix_to_filetime;

use crate::admission::Admission;
use crate::config::Config;
use crate::locks::ByteRangeLocks;
use crate::logon_guard::LogonGuard;
use crate::open_files::OpenFiles;
use crate::open_registry::OpenRegistry;
use crate::oplocks::Oplocks;

pub use crate::share::Share;

pub struct Server {
    /// The configuration now (`Server::config`); a reload replaces it.
    pub(crate) config: RwLock<Arc<Config>>,
    pub provider: Arc<CryptoProvider>,
    pub auth: Authenticator,
    /// The shares now (`Server::shares`), IPC$ last; a reload replaces
    /// the list.
    pub(crate) shares: RwLock<Arc<Vec<Arc<Share>>>>,
    pub share_modes: ShareModes,
    pub guid: [u8; 16],
    pub start_time: u64,
    /// Connection counts against `[limits]`.
    pub admission: Arc<Admission>,
    /// Failed-logon back-off per user and per address.
    pub logon_guard: LogonGuard,
    /// Opens of the whole server, capped below the descriptor limit.
    pub open_files: OpenFiles,
    /// Byte-range locks of every file, and the requests waiting on them.
    pub locks: ByteRangeLocks,
    /// Oplocks and leases of every file, and the CREATEs waiting on breaks.
    pub oplocks: Oplocks,
    /// Every open, so that a rename is seen by all opens of the file.
    pub opens: OpenRegistry,
    /// Connections whose client has gone, their opens being released.
    pub teardowns: crate::teardowns::Teardowns,
    /// Change notify: watches on open directories and the changes for them.
    pub notify: Arc<crate::notify::ChangeNotify>,
    /// Files whose write time moves later than their data (Windows'
    /// delayed write-time update).
    pub write_times: crate::write_times::WriteTimes,
    /// Durable opens kept after their connection was lost, and the
    /// CreateGuids of v2 durable opens.
    pub durables: crate::durable::DurableOpens,
    /// Every session, found by id from any connection.
    pub sessions: crate::session_registry::SessionRegistry,
    /// Stopping without losing what clients were told (`crate::drain`).
    pub drain: crate::drain::Drain,
    /// The store on disk in `state_dir`, for what must outlive the process.
    pub disk_store: Option<Arc<dyn StateStore>>,
    /// This node's membership of its cluster (`[cluster]`), or None.
    pub cluster: Option<Arc<crate::cluster::Membership>>,
    /// A cluster node's way to other nodes' change notify watches.
    pub(crate) notify_relay: Option<Arc<crate::cluster_notify::NotifyRelay>>,
    /// The witness service's registrations (`[witness] listen`).
    pub(crate) witness: Arc<crate::witness_registry::Witness>,
    pub(crate) next_session_id: AtomicU64,
    pub(crate) next_open_id: AtomicU64,
    /// Volatile FileIds equal the open id instead of being random: only for
    /// the fuzz harness, whose recorded streams name the FileIds a fresh
    /// server handed out, and whose runs must be reproducible.
    #[doc(hidden)]
    pub predictable_file_ids: AtomicBool,
}

pub fn now_filetime() -> u64 {
    let d = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    unix_to_filetime(d.as_secs() as i64, d.subsec_nanos())
}

impl Server {
    /// Whether file `key` is delete-pending, by its share-mode record (an
    /// unreadable record: not known to be).
    pub fn delete_pending(&self, key: nimbus_state::FileKey) -> bool {
        self.share_modes.record(key).is_ok_and(|r| r.delete_pending)
    }

    /// Whether 3.x clients are offered persistent handles (MS-SMB2
    /// SMB2_GLOBAL_CAP_PERSISTENT_HANDLES): some share is continuously
    /// available, and there is a store on disk to keep them in.
    pub fn offers_persistent_handles(&self) -> bool {
        self.disk_store.is_some() && self.shares().iter().any(|s| s.continuous_availability)
    }

    /// The configuration the server runs with now.
    pub fn config(&self) -> Arc<Config> {
        match self.config.read() {
            Ok(c) => c.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// The shares served now, IPC$ last.
    pub fn shares(&self) -> Arc<Vec<Arc<Share>>> {
        match self.shares.read() {
            Ok(s) => s.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// Puts a reloaded configuration and its shares in place
    /// (`crate::reload`).
    pub(crate) fn replace_config(&self, config: Config, shares: Vec<Arc<Share>>) {
        let (config, shares) = (Arc::new(config), Arc::new(shares));
        match self.shares.write() {
            Ok(mut s) => *s = shares,
            Err(poisoned) => *poisoned.into_inner() = shares,
        }
        match self.config.write() {
            Ok(mut c) => *c = config,
            Err(poisoned) => *poisoned.into_inner() = config,
        }
    }

    /// A cluster node's way to other nodes' change notify watches.
    pub(crate) fn notify_relay(&self) -> Option<&Arc<crate::cluster_notify::NotifyRelay>> {
        self.notify_relay.as_ref()
    }

    pub fn find_share(&self, name: &str) -> Option<Arc<Share>> {
        self.shares()
            .iter()
            .find(|s| s.name.eq_ignore_ascii_case(name))
            .cloned()
    }

    /// Session ids are unpredictable-looking but unique: a counter in the
    /// low bits, so a client cannot guess another connection's session.
    /// On a cluster node the top bits are the node's incarnation, as in an
    /// open id (`crate::cluster::incarnation_of`), so that a logon on
    /// another node naming it as its PreviousSessionId knows which node to
    /// ask to end it (`crate::session_handover`); 7 random bits are left,
    /// and such ids can be guessed. That costs nothing: a session id is no
    /// secret (every header carries it in clear, a transform header too);
    /// what protects a session is its signing and encryption keys, and a
    /// PreviousSessionId ends only a session of the same user.
    pub fn new_session_id(&self) -> u64 {
        let n = self.next_session_id.fetch_add(1, Ordering::Relaxed);
        let mut salt = [0u8; 4];
        self.provider.fill_random(&mut salt);
        let high = match &self.cluster {
            Some(m) => {
                (m.incarnation() << (crate::cluster::OPEN_ID_SHIFT - 32)) | salt[0] as u64 | 1
            }
            None => u32::from_le_bytes(salt) as u64 | 1,
        };
        (high << 32) | (n & 0xFFFF_FFFF)
    }

    /// A new open's id, the persistent half of its FileId: random bits
    /// (below the node's incarnation on a cluster node, which
    /// `crate::cluster::incarnation_of` reads back), so that one FileId
    /// tells nothing of another's. A v1 durable reconnect names this half
    /// alone, so a counter would let a client walk through other users'
    /// handles. Unique among the opens the server holds, connected or
    /// waiting for their client; 40 random bits or more make two CREATEs
    /// drawing the same id before either is registered a 2^-40 event.
    pub fn new_open_id(&self) -> u64 {
        let counted = self.next_open_id.fetch_add(1, Ordering::Relaxed);
        if self.predictable_file_ids.load(Ordering::Relaxed) {
            return counted;
        }
        let (base, mask) = match &self.cluster {
            Some(m) => (
                m.incarnation() << crate::cluster::OPEN_ID_SHIFT,
                (1u64 << crate::cluster::OPEN_ID_SHIFT) - 1,
            ),
            None => (0, u64::MAX),
        };
        loop {
            let mut b = [0u8; 8];
            self.provider.fill_random(&mut b);
            let low = u64::from_le_bytes(b) & mask;
            let id = base | low;
            // 0 and all ones are never an open's (all ones is the
            // "previous file" FileId of related compounds, MS-SMB2
            // 3.3.5.2.7.2).
            // A group of alike opens keeps the id of its first member
            // after that one closed (nimbus_state::grouped_opens).
            if low != 0
                && id != u64::MAX
                && !self.opens.contains(id)
                && !self.share_modes.grouped().is_group(id)
            {
                return id;
            }
        }
    }

    /// An open id restored from the store: the fuzz harness's counted ids
    /// go above it.
    pub fn reserve_open_id(&self, id: u64) {
        self.next_open_id
            .fetch_max(id.saturating_add(1), Ordering::Relaxed);
    }

    /// The volatile half of a new open's FileId, one that `taken` (the
    /// session's opens) does not hold: 64 random bits, so that a FileId
    /// cannot be guessed from another.
    pub fn new_volatile_id(&self, open_id: u64, taken: impl Fn(u64) -> bool) -> u64 {
        if self.predictable_file_ids.load(Ordering::Relaxed) && !taken(open_id) {
            return open_id;
        }
        loop {
            let mut b = [0u8; 8];
            self.provider.fill_random(&mut b);
            let id = u64::from_le_bytes(b);
            // All ones is the "previous file" FileId of related compounds
            // (MS-SMB2 3.3.5.2.7.2).
            if id != 0 && id != u64::MAX && !taken(id) {
                return id;
            }
        }
    }

    pub(crate) fn leave_cluster(&self) {
        if let Some(m) = &self.cluster {
            if !m.is_stopping() {
                // Past this, other nodes take the node for gone: no join is
                // decided from memory (`nimbus_state::grouped_opens`).
                self.share_modes.grouped().revoke_all();
                m.leave();
            }
        }
    }

    /// Before the process exits on a signal: the node leaves its cluster
    /// (if `stop` has not), and what the stores hold only in memory for a
    /// few milliseconds goes to disk.
    pub fn shutdown(&self) {
        self.leave_cluster();
        if let Some(store) = &self.disk_store {
            if let Err(e) = store.flush() {
                tracing::error!("state store: last flush failed: {e}");
            }
        }
    }
}
