//! Starting and running a node: `Server::new` builds and wires every
//! service, `run` binds the listeners and serves, the inbox acts on other
//! cluster nodes' messages, and `stop` drains before the process exits.
//! The only module that knows every other; nothing imports it.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, RwLock};
use std::time::Duration;

/// How often a cluster node reads its whole message box though its watch
/// delivered every message: a safety net that costs one read.
const INBOX_READ_AGAIN: Duration = Duration::from_secs(30);

use nimbus_auth::{AuthConfig, Authenticator, UserDb};
use nimbus_crypto::{CipherAlgorithm, CryptoProvider};
use nimbus_state::{FileKey, MemoryStore, ShareModes, StateStore};
use tokio::net::TcpListener;

use crate::admission::Admission;
use crate::config::Config;
use crate::locks::ByteRangeLocks;
use crate::logon_guard::LogonGuard;
use crate::open_files::{open_file_cap, raise_descriptor_limit, OpenFiles};
use crate::open_registry::OpenRegistry;
use crate::oplocks::Oplocks;

use crate::server::{now_filetime, Server, Share};

/// Why the server could not start; each is one line for the operator.
#[derive(Debug)]
pub enum StartError {
    UserDb(nimbus_auth::UserDbError),
    Share {
        name: String,
        path: String,
        reason: nimbus_vfs::VfsError,
    },
    Bind {
        addr: SocketAddr,
        reason: String,
    },
    /// `[security] fips = true` in a binary built without the FIPS
    /// provider.
    FipsNotBuilt,
    /// The state directory or its store could not be opened.
    StateDir(nimbus_state::redb_store::OpenError),
    /// The persistent handles of the last run could not be read back.
    Restore(nimbus_state::StateError),
    /// `[cluster]`: etcd out of reach, refused, or the node name taken.
    Cluster(crate::cluster::JoinError),
    /// `[kerberos]`: the keytab cannot be used.
    Kerberos(KeytabError),
}

impl std::fmt::Display for StartError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            // The user database's errors name the file themselves.
            StartError::UserDb(e) => write!(f, "{e}"),
            StartError::Share { name, path, reason } => {
                write!(f, "share \"{name}\": path {path}: {reason}")
            }
            StartError::Bind { addr, reason } => write!(f, "cannot listen on {addr}: {reason}"),
            StartError::FipsNotBuilt => write!(
                f,
                "[security] fips = true, but this binary was built without the FIPS provider \
                 (build with `cargo build --release --features fips`)"
            ),
            StartError::Cluster(e) => write!(f, "{e}"),
            StartError::Kerberos(e) => write!(
                f,
                "[kerberos]: {e} (keytab and principal in the configuration name the keys)"
            ),
            StartError::StateDir(e) => write!(
                f,
                "{e} (state_dir in the configuration, or --state-dir, names the directory)"
            ),
            StartError::Restore(e) => write!(
                f,
                "{e} (state_dir in the configuration, or --state-dir, names the directory)"
            ),
        }
    }
}

impl std::error::Error for StartError {}

/// The crypto provider `[security]` asks for, logged once, and the
/// configured ciphers cut to those it offers.
fn crypto_provider(config: &mut Config) -> Result<Arc<CryptoProvider>, StartError> {
    let provider = if config.fips {
        let p = CryptoProvider::fips_if_built().ok_or(StartError::FipsNotBuilt)?;
        if config.kerberos.is_some() {
            tracing::info!(
                "FIPS mode: crypto provider \"{}\" (AWS-LC FIPS module only); Kerberos logons \
                 only: NTLM needs MD4, MD5 and RC4, which FIPS does not approve",
                p.name()
            );
        } else {
            tracing::warn!(
                "FIPS mode: crypto provider \"{}\" (AWS-LC FIPS module only). NTLM logon is \
                 disabled (it needs MD4, MD5 and RC4, which FIPS does not approve) and no \
                 [kerberos] is configured, so no user can log on",
                p.name()
            );
        }
        p
    } else {
        let p = CryptoProvider::default_provider();
        tracing::info!("{}", p.summary());
        p
    };
    let (offered, dropped): (Vec<CipherAlgorithm>, Vec<CipherAlgorithm>) = config
        .ciphers
        .iter()
        .copied()
        .partition(|c| provider.offers_cipher(*c));
    if !dropped.is_empty() {
        tracing::warn!(
            "ciphers {:?} are not offered: provider \"{}\" has no approved implementation \
             (SMB 3.0 and 3.0.2 clients cannot encrypt without AES-128-CCM)",
            dropped.iter().map(|c| c.name()).collect::<Vec<_>>(),
            provider.name()
        );
    }
    config.ciphers = offered;
    Ok(provider)
}

/// Every configured share, opened (a share whose path cannot serve is a
/// reason not to start), and IPC$ last.
fn open_shares(config: &Config, start_time: u64) -> Result<Vec<Arc<Share>>, StartError> {
    let mut shares = Vec::new();
    for s in &config.shares {
        let share =
            Share::open(s, config.encryption, start_time).map_err(|reason| StartError::Share {
                name: s.name.clone(),
                path: s.path.display().to_string(),
                reason,
            })?;
        shares.push(Arc::new(share));
    }
    shares.push(Arc::new(Share::ipc(
        config.share_encryption(None),
        start_time,
    )));
    Ok(shares)
}

/// The user database (one without users, and no guest share, is
/// worth a warning: nobody can log on).
fn load_users(config: &Config) -> Result<UserDb, StartError> {
    let users = UserDb::load(&config.user_db).map_err(StartError::UserDb)?;
    if users.names().is_empty() && !config.shares.iter().any(|s| s.guest_ok) {
        tracing::warn!(
            "user database {} has no users: nobody can log on (add one with `nimbus user add NAME --db {}`)",
            config.user_db.display(),
            config.user_db.display()
        );
    }
    Ok(users)
}

/// The logon service: `users`, and the Kerberos acceptor of `[kerberos]`
/// (a keytab that cannot serve is a reason not to start).
fn authenticator(
    config: &Config,
    provider: &Arc<CryptoProvider>,
    users: UserDb,
) -> Result<Authenticator, StartError> {
    let kerberos = match &config.kerberos {
        Some(k) => Some(kerberos_acceptor(k).map_err(StartError::Kerberos)?),
        None => None,
    };
    Ok(Authenticator::with_kerberos(
        provider.clone(),
        Arc::new(RwLock::new(users)),
        AuthConfig {
            netbios_computer: config.server_name.to_uppercase(),
            netbios_domain: config.workgroup.to_uppercase(),
            dns_computer: config.server_name.to_lowercase(),
            dns_domain: String::new(),
            allow_guest: config.shares.iter().any(|s| s.guest_ok),
            aliases: config.server_aliases.clone(),
        },
        kerberos,
    ))
}

/// The protocol-state services: share modes, byte-range locks, oplocks
/// and leases, their records in memory on a node alone.
fn protocol_state(
    config: &Config,
    cluster: Option<&Arc<crate::cluster::Membership>>,
    provider: &CryptoProvider,
) -> (ShareModes, ByteRangeLocks, Oplocks) {
    let break_timeout = config.limits.oplock_break_timeout;
    // One store for every kind of per-file record (memory on one node).
    let store: Arc<dyn StateStore> = Arc::new(MemoryStore::new());
    // A cluster node decides share modes, byte-range locks, oplocks
    // and leases through per-file ownership over etcd.
    let (share_modes, locks, oplocks) = match cluster {
        Some(m) => {
            let owned = crate::cluster::owned_store(m);
            m.set_owned_store(owned.clone());
            let m2 = m.clone();
            let gone: nimbus_state::share_modes::Gone =
                Arc::new(move |open_id| m2.open_is_gone(open_id));
            let oplocks = Oplocks::with_liveness(break_timeout, owned.clone(), gone.clone());
            let mut oplocks =
                oplocks.with_elsewhere(crate::dir_leases::ClusterDirLeases::start(m.clone()));
            if config.cluster.as_ref().is_some_and(|c| c.group_leases) {
                // Names this node's group leases: bytes no client can see
                // or guess (open ids, which clients see, name the node's
                // incarnation).
                let mut node = [0; 8];
                provider.fill_random(&mut node);
                oplocks = oplocks.with_group_leases(node);
            }
            (
                ShareModes::with_liveness(owned.clone(), gone.clone())
                    .with_revoker(crate::group_revoker::revoker(m.clone()), m.revoke_wait()),
                ByteRangeLocks::with_liveness(owned, gone),
                oplocks,
            )
        }
        None => (
            ShareModes::new(store.clone()),
            ByteRangeLocks::new(store.clone()),
            Oplocks::new(break_timeout, store.clone()),
        ),
    };
    let locks = locks.with_caps(nimbus_state::byte_range::LockCaps {
        per_open: config.limits.max_byte_range_locks_per_open,
        per_file: config.limits.max_byte_range_locks_per_file,
    });
    (share_modes, locks, oplocks)
}

impl Server {
    /// Builds a node from `config` and wires every service: nothing is
    /// served until `run`.
    pub fn new(mut config: Config) -> Result<Arc<Server>, StartError> {
        let provider = crypto_provider(&mut config)?;
        let users = load_users(&config)?;
        let start_time = now_filetime();
        let shares = open_shares(&config, start_time)?;
        let auth = authenticator(&config, &provider, users)?;
        let mut guid = [0u8; 16];
        provider.fill_random(&mut guid);
        let logon_guard = LogonGuard::new(&config.limits);
        let descriptors = raise_descriptor_limit();
        let (open_cap, warning) = open_file_cap(descriptors, &config.limits);
        if let Some(w) = warning {
            tracing::warn!("{w}");
        }
        tracing::debug!("descriptor limit {descriptors}: up to {open_cap} files open server-wide");
        let max_inotify_watches = config.limits.max_inotify_watches;
        // Opened before anything is served: a damaged or unwritable store is
        // a reason not to start, never a silently empty one.
        let mut disk_store = match &config.state_dir {
            Some(dir) => {
                let s = nimbus_state::RedbStore::open(dir).map_err(StartError::StateDir)?;
                tracing::info!("state store {}", s.path().display());
                Some(Arc::new(s) as Arc<dyn StateStore>)
            }
            None => None,
        };
        // Joined before anything is served: a node that cannot reach etcd,
        // or whose name another node holds, does not start.
        let cluster = match &config.cluster {
            Some(c) => Some(Arc::new(
                crate::cluster::Membership::join(c).map_err(StartError::Cluster)?,
            )),
            None => None,
        };
        // A cluster node keeps persistent handles in etcd, where they
        // outlive it (`crate::failover`), whatever `state_dir` says.
        if let Some(m) = &cluster {
            disk_store = Some(m.store.clone() as Arc<dyn StateStore>);
        }
        let (share_modes, locks, oplocks) = protocol_state(&config, cluster.as_ref(), &provider);
        let first_open_id = cluster
            .as_ref()
            .map_or(0, |m| m.incarnation() << crate::cluster::OPEN_ID_SHIFT)
            + 1;
        let notify_relay = cluster.as_ref().map(|m| {
            let roots = shares
                .iter()
                .filter_map(|s| Some((s.fs.as_ref()?.root_path().to_path_buf(), s.name.clone())))
                .collect();
            Arc::new(crate::cluster_notify::NotifyRelay::new(m.clone(), roots))
        });
        let notify = Arc::new(crate::notify::ChangeNotify::new(max_inotify_watches));
        if let Some(r) = &notify_relay {
            notify.set_relay(r.clone());
        }
        let keep = crate::durable::KeepLimits {
            total: config.limits.max_durable_handles,
            per_user: config.limits.max_durable_handles_per_user,
        };
        let follows_caching = cluster.is_some()
            || (disk_store.is_some() && shares.iter().any(|s| s.continuous_availability));
        let host_cluster = cluster.clone();
        let server = Arc::new_cyclic(|weak| Server {
            config: RwLock::new(Arc::new(config)),
            provider,
            auth,
            shares: RwLock::new(Arc::new(shares)),
            share_modes,
            guid,
            start_time,
            admission: Arc::new(Admission::default()),
            logon_guard,
            open_files: OpenFiles::new(open_cap),
            locks,
            oplocks: oplocks.with_host(Arc::new(crate::oplock_host::NodeOplockHost {
                server: weak.clone(),
                cluster: host_cluster,
                follows_caching,
            })),
            opens: OpenRegistry::default(),
            teardowns: Default::default(),
            notify,
            write_times: Default::default(),
            durables: crate::durable::DurableOpens::new(keep),
            sessions: Default::default(),
            drain: Default::default(),
            disk_store,
            cluster,
            notify_relay,
            witness: Arc::default(),
            next_session_id: AtomicU64::new(1),
            next_open_id: AtomicU64::new(first_open_id),
            predictable_file_ids: AtomicBool::new(false),
        });
        if let Some(m) = &server.cluster {
            server
                .witness
                .keep_in(nimbus_cluster::cluster_registry::Registry::new(
                    m.clone(),
                    nimbus_cluster::witness_records::WITNESS_PREFIX,
                    "witness registration",
                ));
        }
        // A node that lost its lease drops its clients (`crate::lease_loss`).
        if let Some(m) = &server.cluster {
            let weak = Arc::downgrade(&server);
            m.on_lease_lost(Box::new(move || {
                if let Some(s) = weak.upgrade() {
                    crate::lease_loss::drop_clients(&s);
                }
            }));
        }
        // Persistent handles of the last run wait for their clients; a
        // cluster node's are taken over by whichever node their client
        // reconnects to.
        let restored = if server.cluster.is_some() {
            0
        } else {
            crate::persist::restore(&server).map_err(StartError::Restore)?
        };
        if restored > 0 {
            tracing::info!("{restored} persistent handle(s) restored from the state store");
        }
        Ok(server)
    }

    /// Binds every listen address, then serves until the process ends.
    pub async fn run(
        self: Arc<Self>,
        dispatch: Arc<dyn crate::connection::Dispatch>,
    ) -> Result<(), StartError> {
        let mut listeners = Vec::new();
        for addr in &self.config().listen {
            let l = TcpListener::bind(addr).await.map_err(|e| StartError::Bind {
                addr: *addr,
                reason: match e.kind() {
                    std::io::ErrorKind::AddrInUse => "address already in use (another server is running on that port; pick another port with --listen)".into(),
                    std::io::ErrorKind::PermissionDenied => "permission denied (ports below 1024 need root or CAP_NET_BIND_SERVICE; try --listen 127.0.0.1:4450)".into(),
                    _ => e.to_string(),
                },
            })?;
            tracing::info!(
                "listening on {} with shares: {}",
                addr,
                self.config()
                    .shares
                    .iter()
                    .map(|s| s.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            listeners.push(l);
        }
        let cfg = self.config();
        if !cfg.witness_listen.is_empty() {
            crate::witness::serve(
                self.clone(),
                cfg.witness_listen.clone(),
                cfg.witness_endpoint_mapper.clone(),
            )
            .await
            .map_err(|e| StartError::Bind {
                addr: e.addr,
                reason: format!("{}: {}", e.key, e.error),
            })?;
        }
        // Under systemd (Type=notify): ready once every address is bound.
        // Without NOTIFY_SOCKET this does nothing.
        if let Err(e) = sd_notify::notify(false, &[sd_notify::NotifyState::Ready]) {
            tracing::warn!("telling the service manager the server is ready: {e}");
        }
        let mut tasks = Vec::new();
        tokio::spawn(crate::disconnected::scavenge(self.clone()));
        tokio::spawn(crate::status::publish_forever(self.clone()));
        tokio::spawn(crate::gauges::refresh_forever(Arc::downgrade(&self)));
        crate::oplocks::remember_runtime();
        if let Some(m) = &self.cluster {
            m.clone().keep_alive();
            m.clone().follow_incarnations();
            m.clone().serve_ownership();
            // Waiting LOCK requests hear of unlocks on other nodes through
            // etcd, and of locks a gone node left behind once a second;
            // CREATEs and renames waiting for breaks hear of
            // acknowledgements the same way. Each watch runs only while
            // this node has such requests (`nimbus_cluster::interest`).
            let wake = self.watch_waiters(
                m,
                "nimbus-lockwatch",
                nimbus_state::records::LOCKS_PREFIX,
                |s, file| s.locks.retry(file),
                |s| s.locks.waiting_files(),
            );
            self.locks.on_wait(wake);
            let wake = self.watch_waiters(
                m,
                "nimbus-breakwatch",
                nimbus_state::records::CACHING_PREFIX,
                |s, file| s.oplocks.retry(file),
                |s| s.oplocks.waiting_files(),
            );
            self.oplocks.on_wait(wake);
            // Persistent opens of gone nodes nobody reclaimed in time,
            // looked for by one elected node.
            let weak = Arc::downgrade(&self);
            let sweeper = Arc::new(nimbus_cluster::sweeper::Sweeper::default());
            sweeper.follow(m);
            let spawned = std::thread::Builder::new()
                .name("nimbus-orphans".into())
                .spawn(move || {
                    let mut orphans = crate::failover::Orphans::default();
                    loop {
                        std::thread::sleep(Duration::from_secs(2));
                        let Some(s) = weak.upgrade() else { return };
                        let Some(m) = s.cluster.as_ref().filter(|m| !m.is_stopping()) else {
                            return;
                        };
                        let everyone = sweeper.is_mine(m);
                        crate::failover::sweep_orphans(&s, &mut orphans, everyone);
                        // Entries of closed opens etcd did not take out
                        // when they closed (it did not answer).
                        s.locks.retry_releases();
                        for file in s.share_modes.retry_releases() {
                            tracing::warn!(
                                "{file:?}: the last open of a delete-pending file was taken \
                                 out of its record late; the file stays"
                            );
                        }
                    }
                });
            if let Err(e) = spawned {
                tracing::error!("cluster: cannot start the orphan sweep: {e}");
            }
            // Breaks and changes other nodes send for this node's clients:
            // each taken as its watch delivers it. The box is read whole
            // when the watch starts (what came before it), after a take
            // etcd did not answer, and once per `INBOX_READ_AGAIN`.
            let (on_change, on_tick) = (Arc::downgrade(&self), Arc::downgrade(&self));
            let (m1, m2) = (m.clone(), m.clone());
            let missed = Arc::new(std::sync::atomic::AtomicBool::new(true));
            let (missed1, missed2) = (missed.clone(), missed);
            let last_read = std::sync::Mutex::new(None::<std::time::Instant>);
            m.clone().watch_records(
                "nimbus-inbox",
                m.inbox(),
                Duration::from_secs(1),
                move |e| {
                    let Some(s) = on_change.upgrade() else {
                        return;
                    };
                    match m1.take_delivered(e) {
                        Ok(Some(msg)) => s.on_message(&msg.value, msg.version),
                        Ok(None) => {}
                        Err(err) => {
                            tracing::debug!("cluster: taking a message: {err}");
                            missed1.store(true, std::sync::atomic::Ordering::SeqCst);
                        }
                    }
                },
                move |fresh| {
                    let Some(s) = on_tick.upgrade() else {
                        return;
                    };
                    let mut last = crate::sync::lock(&last_read);
                    let due = last.is_none_or(|at| at.elapsed() >= INBOX_READ_AGAIN);
                    let missed = missed2.swap(false, std::sync::atomic::Ordering::SeqCst);
                    if !(fresh || missed || due) {
                        return;
                    }
                    // Anything etcd did not answer is tried again at the
                    // next tick (a second), not at the next safety read.
                    let failed = |e: nimbus_state::StateError| {
                        tracing::debug!("cluster: reading messages: {e}");
                        missed2.store(true, std::sync::atomic::Ordering::SeqCst);
                    };
                    let keys = match m2.try_pending_messages() {
                        Ok(keys) => keys,
                        Err(e) => return failed(e),
                    };
                    *last = Some(std::time::Instant::now());
                    drop(last);
                    for key in keys {
                        match m2.try_take_message(&key) {
                            Ok(Some(msg)) => s.on_message(&msg.value, msg.version),
                            Ok(None) => {}
                            Err(e) => failed(e),
                        }
                    }
                },
            );
            // Which directories other nodes watch for changes.
            if let Some(relay) = &self.notify_relay {
                relay.follow();
            }
        }
        for l in listeners {
            let server = self.clone();
            let dispatch = dispatch.clone();
            tasks.push(tokio::spawn(async move {
                server.accept_loop(l, dispatch).await
            }));
        }
        for t in tasks {
            let _ = t.await;
        }
        Ok(())
    }

    /// Starts a thread that, while `waiting` names files (and a moment
    /// after), calls `retry` for each file whose record under `prefix`
    /// changes in etcd, and for every file `waiting` names once a second.
    /// Returns what the service calls when it parks a request.
    fn watch_waiters(
        self: &Arc<Self>,
        m: &Arc<crate::cluster::Membership>,
        name: &str,
        prefix: &'static [u8],
        retry: fn(&Server, FileKey),
        waiting: fn(&Server) -> Vec<FileKey>,
    ) -> nimbus_cluster::interest::Wake {
        let (on_change, on_tick, on_look) = (
            Arc::downgrade(self),
            Arc::downgrade(self),
            Arc::downgrade(self),
        );
        nimbus_cluster::interest::watch_while_waiting(
            m.clone(),
            name,
            prefix.to_vec(),
            Duration::from_secs(1),
            move || on_look.upgrade().is_some_and(|s| !waiting(&s).is_empty()),
            move |e| {
                if let (Some(s), Some(file)) = (
                    on_change.upgrade(),
                    FileKey::from_record_key(prefix, &e.key),
                ) {
                    retry(&s, file);
                }
            },
            move |_| {
                if let Some(s) = on_tick.upgrade() {
                    for file in waiting(&s) {
                        retry(&s, file);
                    }
                }
            },
        )
    }

    /// Another node's request to apply a client's acknowledgement of a
    /// lease this node may hold (`crate::lease_ack_handover`): applied on
    /// the runtime (a break it leads to starts its timer there), and
    /// answered.
    fn ack_lease_for_node(self: &Arc<Self>, req: crate::lease_ack_handover::AckLease) {
        let Some(m) = self.cluster.clone() else {
            return;
        };
        let server = self.clone();
        crate::oplocks::on_runtime(Box::new(move || {
            use crate::lease_ack_handover::{encode_answer, Found};
            let id = nimbus_state::caching::LeaseId {
                client: req.client_guid,
                key: req.lease_key,
            };
            let found = server
                .oplocks
                .ack_lease(id, req.lease_state)
                .map_or(Found::NotHere, crate::lease_ack_handover::found);
            if found != Found::NotHere {
                tracing::info!(
                    "a lease break acknowledged on node {} applied here: {found:?}",
                    req.reply_to
                );
            }
            if let Err(e) = m.post(&req.reply_to, &encode_answer(req.nonce, found)) {
                tracing::warn!("cluster: answering {} about a lease: {e}", req.reply_to);
            }
        }));
    }

    /// A message from another cluster node: a break for one of this node's
    /// opens, changes for its watches (or a watched directory now
    /// delete-pending), a request to let go of an open whose client
    /// reconnected there, to end a session, to close an application's
    /// opens or to apply a lease break's acknowledgement, or the answer to
    /// one of this node's requests.
    /// `revision`: the store's revision of the message's writing.
    fn on_message(self: &Arc<Self>, msg: &[u8], revision: u64) {
        use crate::message::ClusterMessage as M;
        let msg = match M::decode(msg) {
            Ok(msg) => msg,
            Err(malformed) => {
                tracing::warn!("cluster: {malformed} from another node");
                return;
            }
        };
        match msg {
            M::Changes(raw) => {
                let Some(relay) = &self.notify_relay else {
                    return;
                };
                if let Some((root, changes)) = relay.receive(raw, revision) {
                    let changes: Vec<crate::notify::Change<'_>> = changes
                        .iter()
                        .map(|(action, filter, path)| crate::notify::Change {
                            action: *action,
                            filter: *filter,
                            path,
                        })
                        .collect();
                    self.notify.deliver_local(&root, &changes);
                }
            }
            // Only a hint: the flag is read from the file's record, off
            // the inbox thread (the read may wait on etcd), and only for a
            // directory watched here.
            M::DirDeletePending(key) if self.notify.watches_file(key) => {
                let server = self.clone();
                crate::oplocks::on_runtime(Box::new(move || {
                    if server
                        .share_modes
                        .record(key)
                        .is_ok_and(|r| r.delete_pending)
                    {
                        server.notify.end_deleted_watches(key);
                    }
                }));
            }
            M::DirDeletePending(_) => {}
            M::LetGo(req) => crate::failover::let_go(self, &req),
            M::LetGoAnswered { open_id, nonce, .. } => {
                if let Some(m) = &self.cluster {
                    m.let_go_answered(open_id, nonce);
                }
            }
            M::EndSession(req) => crate::session_end::end_for_another_node(self, &req),
            M::SessionEnded { nonce, ended } => {
                if let Some(m) = &self.cluster {
                    m.answered(nonce, ended as u8);
                }
            }
            M::CloseAppInstance(req) => {
                crate::disconnected::close_app_instance_for_node(self, &req)
            }
            M::AppInstanceClosed { nonce, closed } => {
                if let Some(m) = &self.cluster {
                    m.answered(nonce, closed as u8);
                }
            }
            M::AckLease(req) => self.ack_lease_for_node(req),
            M::LeaseAcked { nonce, found } => {
                if let Some(m) = &self.cluster {
                    m.answered(nonce, found as u8);
                }
            }
            M::RevokeGroups(req) => crate::group_revoker::revoke_for_node(self, req),
            M::GroupsRevoked { nonce } => {
                if let Some(m) = &self.cluster {
                    m.answered(nonce, 1);
                }
            }
            M::Break { open_id, order } => {
                if !crate::failover::forward_break(self, open_id, &order) {
                    self.oplocks.deliver_here(open_id, order)
                }
            }
            M::WitnessDrain(d) if !nimbus_cluster::witness_move::fresh(d.sent) => {
                tracing::warn!(
                    "witness: a drain of {} too old or from the future: ignored",
                    d.node
                );
            }
            M::WitnessDrain(d) => {
                let moved = self.witness.move_node_clients(&d.node, &d.to);
                tracing::info!(
                    "witness: {} is draining: told {moved} registration(s) to move to {:?}",
                    d.node,
                    d.to
                );
            }
            M::Drain(d) => {
                let mine = self.cluster.as_ref().map(|m| m.incarnation());
                if mine != Some(d.incarnation) || !nimbus_cluster::witness_move::fresh(d.sent) {
                    tracing::warn!(
                        "a drain for run {} of this node, sent at {}: not this run's, or too \
                         old; ignored",
                        d.incarnation,
                        d.sent
                    );
                } else {
                    let within = Duration::from_secs(u64::from(d.within_secs));
                    crate::witness::drain(self.clone(), within)
                }
            }
            M::ShareMove(m) if !nimbus_cluster::witness_move::fresh(m.sent) => {
                tracing::warn!(
                    "witness: a move of share {} too old or from the future: ignored",
                    m.share
                );
            }
            M::ShareMove(m) => {
                let moved = self.witness.move_share(&m.share, m.client, &m.to);
                if moved > 0 {
                    tracing::info!(
                        "witness: told {moved} registration(s) for share {} to move to {:?}",
                        m.share,
                        m.to
                    );
                }
            }
            M::WitnessMove(m) if !nimbus_cluster::witness_move::fresh(m.sent) => {
                tracing::warn!(
                    "witness: a move of {} too old or from the future: ignored",
                    m.client
                );
            }
            M::WitnessMove(m) => {
                let moved = self.witness.move_client(m.client, &m.to);
                if moved > 0 {
                    tracing::info!(
                        "witness: told {moved} registration(s) of {} to move to {:?}",
                        m.client,
                        m.to
                    );
                }
            }
        }
    }

    /// On SIGTERM or Ctrl-C, before `shutdown`: no more requests are taken,
    /// those already read are answered, every connection's sessions end,
    /// and a cluster node hands its durable opens back to etcd and leaves;
    /// only then do the sockets close (`crate::drain`). A connection whose
    /// requests do not finish within `within` is not waited for.
    pub async fn stop(self: &Arc<Self>, within: Duration) {
        let open = self.drain.live();
        if !self.drain.begin(within).await {
            tracing::warn!(
                "stopping: {} of {open} connection(s) did not finish their requests within {}s",
                self.drain.live(),
                within.as_secs()
            );
        }
        if self.cluster.is_some() {
            let s = self.clone();
            let handed = tokio::task::spawn_blocking(move || {
                let n = crate::failover::hand_back(&s);
                s.leave_cluster();
                n
            })
            .await
            .unwrap_or(0);
            tracing::info!(
                "stopping: {handed} durable handle(s) handed back for their clients to \
                 reclaim on another node"
            );
        }
        self.drain.release();
    }

    async fn accept_loop(
        self: Arc<Self>,
        listener: TcpListener,
        dispatch: Arc<dyn crate::connection::Dispatch>,
    ) {
        let mut stage = self.drain.watch();
        loop {
            let accepted = tokio::select! {
                a = listener.accept() => a,
                // Stopping: the listener closes, a client's new connection
                // is refused and goes to another node.
                _ = crate::drain::reached(&mut stage, crate::drain::Stage::Draining) => return,
            };
            match accepted {
                Ok((_, peer)) if self.drain.refusing_new() => {
                    // `nimbus drain`: the client goes to another node.
                    tracing::debug!("{peer}: connection closed: the node is draining");
                }
                Ok((stream, peer)) => {
                    let slot = match self.admission.admit(peer.ip(), &self.config().limits) {
                        Ok(slot) => slot,
                        Err(why) => {
                            // Dropping the stream closes it at once.
                            self.admission.log_refusal(peer, &why);
                            continue;
                        }
                    };
                    let _ = stream.set_nodelay(true);
                    let server = self.clone();
                    let dispatch = dispatch.clone();
                    tokio::spawn(async move {
                        crate::connection::serve(server, dispatch, stream, peer, slot).await;
                    });
                }
                Err(e) => {
                    // Running out of file descriptors must not spin the loop.
                    tracing::warn!("accept failed: {e}");
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                }
            }
        }
    }
}

/// A keytab that cannot serve: which one, and what GSS-API said.
#[derive(Debug)]
pub struct KeytabError {
    pub keytab: String,
    pub error: nimbus_auth::GssError,
}

impl std::fmt::Display for KeytabError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "keytab {}: {}", self.keytab, self.error)
    }
}

/// The Kerberos acceptor of `[kerberos]`: the keytab's keys, acquired now so
/// that a keytab that cannot serve is a reason not to start.
pub fn kerberos_acceptor(
    k: &crate::config::KerberosConfig,
) -> Result<nimbus_auth::KerberosAcceptor, KeytabError> {
    let map = nimbus_auth::PrincipalMap {
        explicit: k.user_map.iter().cloned().collect(),
        explicit_only: !k.map_by_name,
    };
    let keytab = k.keytab.to_string_lossy();
    nimbus_auth::KerberosAcceptor::new(&keytab, k.principal.as_deref(), k.ntlm, map).map_err(
        |error| KeytabError {
            keytab: keytab.into_owned(),
            error,
        },
    )
}
