//! The server's oplocks and leases. Each file's caching state (its opens
//! and grants, breaks under way) is a record in the server's `StateStore`,
//! changed only by `nimbus_state::caching`'s rules through compare-and-set
//! (`nimbus_state::records`), so that a cluster store can later hold it
//! for every node. What only this node can hold stays here: the CREATEs
//! and renames waiting for breaks to end, the acknowledgement timers
//! (`oplock_break_timeout`, 35 s by default as on Windows), and the way to
//! each holder's client, behind the `Notifier` that sends break
//! notifications (MS-SMB2 3.3.4.6 and 3.3.4.7).
//!
//! A file's turn (`turns`) orders this node's steps on that file, from
//! the read of its record to the table settled after the write, so that a
//! waiter parked after reading "breaking" cannot miss the acknowledgement
//! that ends the break; the record's compare-and-set orders them against
//! other writers of the store. The table's own lock is held only while
//! the table is read or changed, never across a store call.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use nimbus_state::caching::{
    self, AckError, Acked, BreakOrder, Contention, FileCaching, Granted, Holder, LeaseId, OpenAsk,
    Want,
};
use nimbus_state::records::{self, CACHING_PREFIX};
use nimbus_state::share_modes::Gone;
use nimbus_state::{FileKey, OpenRecord, ShareModes, SharingError, StateError, StateStore};
use nimbus_wire::header::{flags, Command, Header};
use nimbus_wire::oplock::{LeaseBreakNotification, OplockBreak, LEASE_BREAK_ACK_REQUIRED};
use nimbus_wire::{FileId, NtStatus};

use crate::open::Open;
use crate::pending::ResponseChannel;
use crate::security::SessionCipher;
use crate::sync::lock;

mod grouped;
mod together;
mod turns;

/// How to reach the client of one open.
#[derive(Clone)]
pub struct Route {
    /// The connection the open was made on; if it is gone, another
    /// channel of the open's session (MS-SMB2 3.3.4.1.6).
    pub conn: Weak<dyn ResponseChannel>,
    pub session: Weak<dyn SessionChannels>,
    pub session_id: u64,
    pub file_id: FileId,
    /// Seal breaks with this session's cipher (the session or the tree
    /// requires encryption); otherwise they go in the clear, unsigned, as
    /// Windows sends them.
    pub seal: Option<Arc<SessionCipher>>,
}

impl Route {
    /// The connection a break goes on. An oplock's: the open's own while
    /// it lasts, else the first live channel of its session (multichannel:
    /// the session outlives a lost connection, MS-SMB2 3.3.4.1.6). A
    /// lease's: the first live channel of the session, as a lease is the
    /// client's rather than one open's (3.3.4.7); should that channel fail,
    /// the break goes again on the next (`redeliver_breaks`), in the order
    /// the channels were bound, as Samba's smbd sends them and smbtorture's
    /// smb2.multichannel.leases tests expect.
    fn channel(&self, lease: bool) -> Option<Arc<dyn ResponseChannel>> {
        let first_of_session = || {
            let session = self.session.upgrade()?;
            session.channels().into_iter().find(|c| !c.is_closing())
        };
        if lease {
            if let Some(conn) = first_of_session() {
                return Some(conn);
            }
        }
        if let Some(conn) = self.conn.upgrade().filter(|c| !c.is_closing()) {
            return Some(conn);
        }
        first_of_session()
    }
}

impl Route {
    /// The route of an open whose client is not connected (a persistent
    /// open restored from its record): a break reaches no connection.
    pub fn unconnected(file_id: FileId) -> Route {
        Route {
            conn: Weak::<Unconnected>::new(),
            session: Weak::<Unconnected>::new(),
            session_id: 0,
            file_id,
            seal: None,
        }
    }
}

/// What an unconnected route points at: never made, so never reached.
struct Unconnected;

impl ResponseChannel for Unconnected {
    fn send_frame(&self, _: crate::pending::Frame) {}
    fn forget_pending(&self, _: u64) {}
    fn is_closing(&self) -> bool {
        true
    }
    fn close_unsendable(&self) {}
    fn peer(&self) -> std::net::SocketAddr {
        std::net::SocketAddr::from(([0, 0, 0, 0], 0))
    }
}

impl SessionChannels for Unconnected {
    fn channels(&self) -> Vec<Arc<dyn ResponseChannel>> {
        Vec::new()
    }
}

/// The live connections (channels) of a session, for a break whose open's
/// own connection is gone. The session layer implements it.
pub trait SessionChannels: Send + Sync {
    fn channels(&self) -> Vec<Arc<dyn ResponseChannel>>;
}

/// Delivers break notifications to the client of an open. On one node
/// that is a connection of this process; a cluster node will forward a
/// break for an open it does not serve to the node that does.
pub trait Notifier: Send + Sync {
    /// Sends `order` to the client of open `open_id`; an open whose client
    /// is gone is skipped (its close will clean up).
    fn deliver(&self, open_id: u64, order: BreakOrder);
}

/// The notifier of a single node: the route of every open that may be
/// sent a break, and the durable opens whose client is gone.
pub struct LocalNotifier {
    routes: Mutex<HashMap<u64, Destination>>,
    /// The last break each open was sent that needs an acknowledgement,
    /// and the connection it went on: sent again on another channel of the
    /// open's session if that connection is lost (`redeliver_breaks`).
    last_sent: Mutex<HashMap<u64, Sent>>,
    /// What a break that needs acknowledgement does to a disconnected
    /// durable open instead (`OplockHost::disconnected_break`).
    host: Arc<dyn OplockHost>,
}

/// What the oplock service asks of the node it runs in, given once at
/// construction (`Oplocks::with_host`). Each default is that of a node
/// alone without persistent handles (`Alone`): no durable open to close,
/// no byte-range locks asked about, no records following caching, no
/// other node.
pub trait OplockHost: Send + Sync {
    /// A break that needs acknowledgement, for a disconnected durable open:
    /// MS-SMB2 3.3.4.6-7 have no client to ask, so the node closes the
    /// open (or takes a persistent one's break as acknowledged).
    fn disconnected_break(&self, _open_id: u64, _order: BreakOrder) {}
    /// Whether a file holds byte-range locks
    /// (`crate::locks::ByteRangeLocks::has_locks`): a lease or oplock is
    /// not granted read or handle caching beside them.
    fn has_locks(&self, _file: FileKey) -> bool {
        false
    }
    /// Whether the node keeps records that follow the caching of opens
    /// (persistent handles, or a cluster): only then are changes worked
    /// out and told (`caching_changed`).
    fn follows_caching(&self) -> bool {
        false
    }
    /// The caching some opens hold changed without a CREATE of theirs (a
    /// break sent, acknowledged or timed out): their records follow.
    fn caching_changed(&self, _open_ids: &[u64]) {}
    /// Whether the node is one of a cluster: a break for an open not
    /// served here goes to another node (`forward`), and breaks to opens
    /// no node serves are looked for (`stranded`).
    fn in_cluster(&self) -> bool {
        false
    }
    /// Sends a break to the node that serves an open this node does not;
    /// false when no node does (a gone node's persistent open nobody took
    /// over yet: its client cannot answer, so the break is taken as
    /// acknowledged, as for a disconnected persistent open on one node).
    fn forward(&self, _open_id: u64, _order: BreakOrder) -> bool {
        false
    }
    /// Runs `f` on the node's oplocks after `after` (off the runtime's
    /// workers: it may wait on the store). A host without a runtime runs
    /// nothing: its breaks end by their record's timer.
    fn later(&self, _after: Duration, _f: Box<dyn FnOnce(&Oplocks) + Send>) {}

    /// Whether an open is stranded: a gone node's persistent open nobody
    /// took over (its breaks are taken as acknowledged).
    fn stranded(&self, _open_id: u64) -> bool {
        false
    }
}

/// A node alone without persistent handles: every default of
/// `OplockHost`.
pub struct Alone;

impl OplockHost for Alone {}

#[derive(Clone)]
enum Destination {
    Client(Route),
    /// A durable open kept after its connection was lost.
    Disconnected,
}

impl LocalNotifier {
    fn new(host: Arc<dyn OplockHost>) -> LocalNotifier {
        LocalNotifier {
            routes: Mutex::default(),
            last_sent: Mutex::default(),
            host,
        }
    }

    fn register(&self, open_id: u64, route: Route) {
        lock(&self.routes).insert(open_id, Destination::Client(route));
    }

    fn unregister(&self, open_id: u64) {
        let mut routes = lock(&self.routes);
        routes.remove(&open_id);
        lock(&self.last_sent).remove(&open_id);
    }
}

/// A break that awaits acknowledgement, as it was sent.
#[derive(Clone)]
struct Sent {
    order: BreakOrder,
    via: Weak<dyn ResponseChannel>,
    /// Order of sending, across all opens: of a lease's breaks (sent to
    /// whichever of its opens comes first) only the latest is sent again.
    serial: u64,
}

static SENT_SERIAL: AtomicU64 = AtomicU64::new(0);

impl Notifier for LocalNotifier {
    fn deliver(&self, open_id: u64, order: BreakOrder) {
        let Some(dest) = lock(&self.routes).get(&open_id).cloned() else {
            return;
        };
        match dest {
            Destination::Client(route) => {
                crate::metrics::break_sent(matches!(order.holder, Holder::Lease(_)));
                let via = Outbound { order, route }.send();
                if let (true, Some(via)) = (order.ack_required, via) {
                    // Recorded only while the open is still routed (its
                    // close unregisters it under the same lock).
                    let routes = lock(&self.routes);
                    if routes.contains_key(&open_id) {
                        let serial = SENT_SERIAL.fetch_add(1, Ordering::Relaxed);
                        lock(&self.last_sent).insert(
                            open_id,
                            Sent {
                                order,
                                via: Arc::downgrade(&via),
                                serial,
                            },
                        );
                    }
                }
            }
            // A break the holder must acknowledge (it caches writes or
            // handles) cannot be, so the open goes; a break to none of
            // read caching needs no answer and only changes the state the
            // client finds when it reclaims the open.
            Destination::Disconnected if order.ack_required => {
                tracing::debug!(
                    "break {:#x} -> {:#x} of disconnected open {open_id}: closing it",
                    order.from,
                    order.to
                );
                self.host.disconnected_break(open_id, order);
            }
            Destination::Disconnected => {}
        }
    }
}

/// Whether changed caching is to be told: the host follows it, and some
/// changed.
fn watch_told(host: &dyn OplockHost, changed: &[u64]) -> bool {
    host.follows_caching() && !changed.is_empty()
}

/// A CREATE or rename waiting for breaks on a file to end.
struct Waiter {
    async_id: u64,
    wake: Box<dyn FnOnce() + Send>,
    /// When it was parked: a waiter whose breaks were sent by a node that
    /// died meanwhile (no timer left anywhere) ends them itself.
    since: Instant,
}

/// The directory leases of other cluster nodes, and the way to tell them
/// of this node's (`nimbus_cluster::dir_leases::ClusterDirLeases`).
pub trait DirLeasesElsewhere: Send + Sync {
    /// Whether another node holds a lease on any directory.
    fn any(&self) -> bool;
    /// Whether another node holds a lease on `dir`.
    fn holds(&self, dir: FileKey) -> bool;
    /// This node holds a lease on `dir` now, or no more.
    fn set_mine(&self, dir: FileKey, held: bool);
}

/// What this node keeps about one file beside its record.
#[derive(Default)]
struct Local {
    waiters: Vec<Waiter>,
    /// Which break each holder's timer belongs to: an acknowledged break
    /// followed by a new one must not be timed out by the old timer.
    break_serial: HashMap<Holder, u64>,
}

#[derive(Default)]
struct Table {
    files: HashMap<FileKey, Local>,
    /// Files whose record holds a grant: writes to other files (every
    /// WRITE asks) cost no look-up in the store.
    granted: HashSet<FileKey>,
    /// The file each lease is on (a lease key names one file).
    lease_files: HashMap<LeaseId, FileKey>,
    /// Leases held through this node's groups (`grouped`): an open outside
    /// the group gets no lease of its own under the same key.
    members: HashSet<LeaseId>,
    /// Directories that hold a lease: changes inside them must break it.
    dirs: HashSet<FileKey>,
    /// Directories that came into `dirs` or left it since other cluster
    /// nodes were last told.
    dirs_touched: Vec<FileKey>,
    /// Group leases (`grouped`) whose grants went from their records, to
    /// be forgotten once the table's lock is let go.
    groups_gone: Vec<LeaseId>,
    next_serial: u64,
}

/// What admits claimed in the table before their write (`claim_for_admit`),
/// given back if the write does not happen.
#[derive(Default)]
struct Claimed {
    leases: Vec<LeaseId>,
    /// The file was marked as holding grants by these admits.
    marked: bool,
}

impl Table {
    /// Before an admit's write, which other files' changes may overtake
    /// (each holds only its own file's turn): the file is marked as
    /// holding grants, so that a rename or delete meanwhile looks at the
    /// record; and a lease key names one file, so an admit whose key
    /// another file holds gets no lease (found by the state_rules fuzz
    /// target), and a key no file holds is claimed for this one.
    fn claim_for_admit(&mut self, file: FileKey, ask: &mut OpenAsk, claimed: &mut Claimed) {
        if matches!(ask.want, Want::Nothing) {
            return;
        }
        claimed.marked |= self.granted.insert(file);
        if let Want::Lease { id, .. } = ask.want {
            match self.lease_files.get(&id) {
                Some(k) if *k != file || self.members.contains(&id) => ask.want = Want::Nothing,
                Some(_) => {}
                None => {
                    self.lease_files.insert(id, file);
                    claimed.leases.push(id);
                }
            }
        }
    }

    /// Undoes `claim_for_admit` for a write that did not happen.
    fn give_back(&mut self, file: FileKey, claimed: Claimed) {
        for id in claimed.leases {
            self.lease_files.remove(&id);
        }
        if claimed.marked {
            self.granted.remove(&file);
        }
    }

    /// Notes what a record now holds, and drops the file's local entry
    /// once nothing is cached there and nobody waits.
    fn settle(&mut self, file: FileKey, state: &Summary) {
        if state.has_grants {
            self.granted.insert(file);
        } else {
            self.granted.remove(&file);
        }
        if state.empty {
            if self.dirs.remove(&file) {
                self.dirs_touched.push(file);
            }
            if self.files.get(&file).is_some_and(|l| l.waiters.is_empty()) {
                self.files.remove(&file);
            }
        }
    }
}

/// What a record holds after a change, for the node-local indexes.
struct Summary {
    has_grants: bool,
    empty: bool,
    breaking: bool,
    /// The opens whose caching the change altered, when watched.
    changed: Vec<u64>,
}

impl Summary {
    fn of(s: &FileCaching) -> Summary {
        Summary {
            has_grants: !s.grants.is_empty(),
            empty: s.is_empty(),
            breaking: s.breaking(),
            changed: Vec::new(),
        }
    }
}

/// Each open's caching state in `s` (an open without a grant holds none).
fn caching_of(s: &FileCaching) -> Vec<(u64, u32)> {
    s.grants
        .iter()
        .flat_map(|g| g.opens.iter().map(move |o| (*o, g.state)))
        .collect()
}

/// The opens of `after` whose caching differs from `before`'s.
fn changed_opens(before: &[(u64, u32)], after: &FileCaching) -> Vec<u64> {
    let now = caching_of(after);
    let state_in =
        |list: &[(u64, u32)], id: u64| list.iter().find(|(o, _)| *o == id).map_or(0, |(_, st)| *st);
    after
        .opens
        .iter()
        .map(|o| o.open_id)
        .filter(|id| state_in(before, *id) != state_in(&now, *id))
        .collect()
}

/// A break to send, and the open whose client receives it.
type Target = (BreakOrder, u64);

/// The opens to send `breaks` to: an oplock's own open, a lease's first
/// open (any open of a lease reaches its client).
fn targets(s: &FileCaching, breaks: &[BreakOrder]) -> Vec<Target> {
    breaks
        .iter()
        .filter_map(|b| {
            let open_id = match b.holder {
                Holder::Oplock(id) => Some(id),
                Holder::Lease(_) => s.grant(b.holder).and_then(|g| g.opens.first().copied()),
            };
            open_id.map(|id| (*b, id))
        })
        .collect()
}

pub struct Oplocks {
    table: Arc<Mutex<Table>>,
    /// Each file's turn, held from a read of its record to the table
    /// settled after the write (`turns`).
    turns: Arc<turns::Turns>,
    store: Arc<dyn StateStore>,
    notifier: Arc<LocalNotifier>,
    /// Milliseconds; a reload may change it (`set_break_timeout`).
    break_timeout: std::sync::atomic::AtomicU64,
    /// The node this service runs in (`OplockHost`).
    host: Arc<dyn OplockHost>,
    /// How many directories hold a lease, read without the lock: while
    /// none does, a change to a file costs no look-up of its directory.
    dir_leases: AtomicUsize,
    /// On a cluster node: whether an open belongs to a node that is gone
    /// (its grants hold nothing any more).
    gone: Option<Gone>,
    /// On a cluster node: the directory leases of the others.
    elsewhere: Option<Arc<dyn DirLeasesElsewhere>>,
    /// Orders the telling of other nodes (see `publish_dirs`).
    publishing: Mutex<()>,
    /// CREATEs and closes of shared files waiting to be written together.
    gatherings: together::Gatherings,
    /// Told when a request starts waiting for breaks (a cluster node's
    /// watch of the caching records runs only while requests wait).
    on_wait: std::sync::OnceLock<Box<dyn Fn() + Send + Sync>>,
    /// Leases granted through this node's groups of alike opens
    /// (`grouped`); None: each lease is a grant of its own.
    groups: Option<Mutex<nimbus_state::group_leases::GroupLeases>>,
}

/// An open id no open has (ids count from 1 within each incarnation).
const NO_OPEN: u64 = 0;

/// What follows an acknowledgement's write (`Oplocks::after_ack`).
#[derive(Default)]
struct AckEffects {
    sends: Vec<Target>,
    woken: Vec<Waiter>,
    changed: Vec<u64>,
}

/// What an acknowledgement came to.
pub enum AckOutcome {
    Done(Acked),
    Refused(AckError),
}

fn record_key(file: FileKey) -> Vec<u8> {
    file.record_key(CACHING_PREFIX)
}

/// Applies a rule to `file`'s record in `store`. A store that fails is
/// logged and the rule's effect is lost: callers then grant no caching.
/// With `watch`, the summary names the opens whose caching changed.
fn apply<T>(
    store: &dyn StateStore,
    file: FileKey,
    watch: bool,
    mut f: impl FnMut(&mut FileCaching) -> T,
) -> Option<(T, Summary)> {
    let r = records::update::<FileCaching, _, StateError>(store, &record_key(file), |s| {
        Ok(summarized(watch, s, &mut f))
    });
    match r {
        Ok(v) => Some(v),
        Err(e) => {
            tracing::error!("caching state of {file:?}: {e}");
            None
        }
    }
}

/// `f` applied to `s`, and what `s` came to.
fn summarized<T>(
    watch: bool,
    s: &mut FileCaching,
    f: &mut impl FnMut(&mut FileCaching) -> T,
) -> (T, Summary) {
    let before = if watch { caching_of(s) } else { Vec::new() };
    let out = f(s);
    let mut summary = Summary::of(s);
    if watch {
        summary.changed = changed_opens(&before, s);
    }
    (out, summary)
}

impl Oplocks {
    /// The node's caching table, held for moments: no store call is made
    /// under it (a file's turn orders those).
    fn table(&self) -> MutexGuard<'_, Table> {
        lock(&self.table)
    }

    /// `file`'s turn. On a cluster node whoever holds it may be waiting
    /// on etcd (a file being handed over from another node, up to twice
    /// the node TTL): a request that finds it taken waits off its runtime
    /// worker, so that one slow hand-over does not stop the whole runtime
    /// (other connections' reads and writes, the writers, accept).
    fn turn(&self, file: FileKey) -> turns::Turn<'_> {
        self.turns.take(file)
    }

    /// How long a break waits for its acknowledgement now.
    pub fn break_timeout(&self) -> Duration {
        Duration::from_millis(self.break_timeout.load(Ordering::Relaxed))
    }

    /// A reloaded configuration's break timeout, for breaks sent from now.
    pub fn set_break_timeout(&self, timeout: Duration) {
        self.break_timeout.store(millis(timeout), Ordering::Relaxed);
    }

    /// The oplocks of a node alone without persistent handles (`Alone`).
    pub fn new(break_timeout: Duration, store: Arc<dyn StateStore>) -> Oplocks {
        let host: Arc<dyn OplockHost> = Arc::new(Alone);
        Oplocks {
            table: Arc::new(Mutex::new(Table::default())),
            turns: Arc::default(),
            store,
            notifier: Arc::new(LocalNotifier::new(host.clone())),
            break_timeout: std::sync::atomic::AtomicU64::new(millis(break_timeout)),
            host,
            dir_leases: AtomicUsize::new(0),
            gone: None,
            elsewhere: None,
            publishing: Mutex::new(()),
            gatherings: together::Gatherings::default(),
            on_wait: std::sync::OnceLock::new(),
            groups: None,
        }
    }

    /// What to tell when a request starts waiting for breaks (set once).
    pub fn on_wait(&self, f: Box<dyn Fn() + Send + Sync>) {
        let _ = self.on_wait.set(f);
    }

    /// The same, run in `host`: at construction, before any open is
    /// routed.
    pub fn with_host(self, host: Arc<dyn OplockHost>) -> Oplocks {
        Oplocks {
            notifier: Arc::new(LocalNotifier::new(host.clone())),
            host,
            ..self
        }
    }

    /// The same, knowing where other nodes' directory leases are.
    pub fn with_elsewhere(self, e: Arc<dyn DirLeasesElsewhere>) -> Oplocks {
        Oplocks {
            elsewhere: Some(e),
            ..self
        }
    }

    /// Tells other nodes whether this node still holds leases on the
    /// directories `touched` names. Each is told the state it has when
    /// told, one at a time: whoever tells last tells the latest.
    fn publish_dirs(&self, touched: Vec<FileKey>) {
        let Some(e) = &self.elsewhere else {
            return;
        };
        if touched.is_empty() {
            return;
        }
        let _order = lock(&self.publishing);
        for dir in touched {
            let held = self.table().dirs.contains(&dir);
            e.set_mine(dir, held);
        }
    }

    /// The oplocks of a cluster node: `store` is shared with other nodes,
    /// and the grants of opens `gone` names are dropped when they are in
    /// the way.
    pub fn with_liveness(
        break_timeout: Duration,
        store: Arc<dyn StateStore>,
        gone: Gone,
    ) -> Oplocks {
        Oplocks {
            gone: Some(gone),
            ..Oplocks::new(break_timeout, store)
        }
    }

    /// Takes a break nobody can receive as acknowledged with what it asked.
    fn ack_stranded(&self, file: FileKey, order: BreakOrder) {
        let _ = self.ack(file, |s| match order.holder {
            Holder::Lease(id) => s.ack_lease(id, order.to),
            Holder::Oplock(o) => s.ack_oplock(o, caching::oplock_level(order.to)),
        });
    }

    /// Whether breaks for `open_id` end on this node (a connection of its,
    /// or a durable open waiting here for its client).
    pub fn serves_here(&self, open_id: u64) -> bool {
        lock(&self.notifier.routes).contains_key(&open_id)
    }

    /// Delivers a break another node sent for an open of this one.
    pub fn deliver_here(&self, open_id: u64, order: BreakOrder) {
        match self.group_of_order(&order) {
            // Off the inbox's thread: the group's acknowledgement may be
            // written at once, an etcd round trip under the file's turn.
            Some(group) => self.host.later(
                Duration::ZERO,
                Box::new(move |oplocks: &Oplocks| oplocks.fan_out(group, &order)),
            ),
            None => self.notifier.deliver(open_id, order),
        }
    }

    /// Drops the opens of gone nodes from `s`; whether a break ended with
    /// them.
    fn purge_gone(&self, s: &mut FileCaching) -> bool {
        let Some(gone) = &self.gone else {
            return false;
        };
        let mut ids: Vec<u64> = s.opens.iter().map(|o| o.open_id).collect();
        ids.extend(s.grants.iter().flat_map(|g| g.opens.iter().copied()));
        ids.sort_unstable();
        ids.dedup();
        let mut ended = false;
        for id in ids.into_iter().filter(|id| gone(*id)) {
            ended |= s.remove_open(id);
        }
        ended
    }

    fn watching(&self) -> bool {
        self.host.follows_caching()
    }

    /// Sends what an open of `file` requires of other holders first. When
    /// the answer is to wait, the caller parks its CREATE with `wait`. An
    /// open that may go on is counted among the file's opens at once (so
    /// that a racing open cannot be granted write caching beside it); it
    /// must be `admit`ted or `forget`ten.
    pub fn contend(&self, file: FileKey, ask: &OpenAsk) -> Contention {
        let turn = self.turn(file);
        let rule = |s: &mut FileCaching| self.contend_rule(s, ask);
        match apply(&*self.store, file, self.watching(), rule) {
            Some(((c, to), summary)) => self.contended(turn, file, c, to, summary),
            None => Contention::default(),
        }
    }

    /// `contend` for an open whose share modes `share_modes` checks in the
    /// same write, on a file cluster nodes share: one etcd transaction
    /// where `add_open` and `contend` would be two, carrying the other
    /// CREATEs and closes of the file that came on this node meanwhile
    /// (`together`). A refusal of the share modes changes nothing. None:
    /// not written together, nothing written (the caller calls
    /// `add_open`, then `contend`).
    pub fn contend_opening(
        &self,
        file: FileKey,
        ask: &OpenAsk,
        share_modes: &ShareModes,
        open: OpenRecord,
    ) -> Option<Result<Contention, SharingError>> {
        let step = together::Step::Open { ask: *ask, open };
        Some(match self.together(file, step, share_modes)? {
            Ok(together::Stepped::Opened(c)) => Ok(c),
            Ok(_) => Err(SharingError::Store(StateError::Unavailable(
                "an open's write came back as a close's".into(),
            ))),
            Err(e) => Err(e),
        })
    }

    /// The rule of `contend`: the breaks the open needs, to whom.
    fn contend_rule(&self, s: &mut FileCaching, ask: &OpenAsk) -> (Contention, Vec<Target>) {
        self.purge_gone(s);
        let c = s.contend(ask);
        // A group of alike opens (nimbus_state::grouped_opens) is counted
        // once, under its id, however many join it.
        let counted = s.opens.iter().any(|o| o.open_id == ask.open_id);
        if !c.wait && !ask.sharing_violation && !counted {
            s.opens.push(caching::OpenEntry {
                open_id: ask.open_id,
                stat: caching::stat_open(ask.access),
            });
        }
        let to = targets(s, &c.breaks);
        (c, to)
    }

    /// What `contend` does once the record is written: the breaks sent,
    /// the table settled, those whose caching changed told.
    fn contended(
        &self,
        turn: turns::Turn<'_>,
        file: FileKey,
        c: Contention,
        to: Vec<Target>,
        summary: Summary,
    ) -> Contention {
        let mut t = self.table();
        let sends = self.prepare_breaks(&mut t, file, to);
        t.settle(file, &summary);
        self.count_dirs(&t);
        drop(t);
        // Before the breaks go: one that reaches a disconnected durable
        // open closes it, and that close takes the file's turn.
        drop(turn);
        self.send(file, sends);
        self.tell(summary.changed);
        c
    }

    /// Whether `lease` may be used on `file` (None: a file about to be
    /// created): a lease key names one file (MS-SMB2 3.3.5.9.8).
    pub fn lease_fits(&self, lease: LeaseId, file: Option<FileKey>) -> bool {
        match self.table().lease_files.get(&lease) {
            None => true,
            Some(k) => Some(*k) == file,
        }
    }

    /// `open_id` lost its client but is kept (a durable open): breaks to it
    /// go to `OplockHost::disconnected_break`.
    pub fn detach(&self, open_id: u64) {
        lock(&self.notifier.routes).insert(open_id, Destination::Disconnected);
    }

    /// A persistent open of a gone cluster node is taken over here
    /// (`nimbus_node::failover`): its grant is in the file's record already;
    /// this node learns its lease and keeps it disconnected.
    pub fn take_over(&self, file: FileKey, open_id: u64) {
        let _turn = self.turn(file);
        let s = records::read::<FileCaching>(&*self.store, &record_key(file)).unwrap_or_default();
        {
            let mut t = self.table();
            for g in s.grants.iter().filter(|g| g.opens.contains(&open_id)) {
                if let Holder::Lease(id) = g.holder {
                    t.lease_files.insert(id, file);
                }
                t.granted.insert(file);
            }
        }
        self.detach(open_id);
    }

    /// Breaks for `open_id` no longer end here: a disconnected open this
    /// node took over was let go to another node (`nimbus_node::failover::let_go`;
    /// its grant stays in the file's record, for the node that takes it),
    /// or an open that holds no grant closed.
    pub fn let_go(&self, open_id: u64) {
        self.notifier.unregister(open_id);
    }

    /// A disconnected durable open was reclaimed: breaks go to its new
    /// connection.
    pub fn attach(&self, open_id: u64, route: Route) {
        self.notifier.register(open_id, route);
    }

    /// Acknowledges `order` on behalf of a holder that cannot (a
    /// persistent open waiting for its client): its state goes to what the
    /// break asked at once.
    pub fn acknowledge_for(&self, file: FileKey, open_id: u64, order: BreakOrder) {
        let _ = match order.holder {
            Holder::Lease(id) => self.ack_lease(id, order.to),
            Holder::Oplock(_) => {
                Some(self.ack_oplock(file, open_id, caching::oplock_level(order.to)))
            }
        };
    }

    /// Acknowledges on behalf of `open_id` every break of what it holds
    /// that awaits acknowledgement, to the state the break must end at:
    /// for a persistent open whose connection was lost with a break under
    /// way, which stays for its client (as `acknowledge_for` does for a
    /// break that reaches it disconnected). Whether there was any.
    pub fn acknowledge_pending_for(&self, file: FileKey, open_id: u64) -> bool {
        let Ok(s) = records::read::<FileCaching>(&*self.store, &record_key(file)) else {
            return false;
        };
        // Only for grants none of whose opens can still answer: a lease
        // shared with an open whose connection lives is acknowledged by
        // its client, which may have writes to flush first.
        let pending: Vec<(Holder, u32)> = {
            let routes = lock(&self.notifier.routes);
            s.grants
                .iter()
                .filter(|g| g.opens.contains(&open_id))
                .filter(|g| {
                    g.opens.iter().all(|o| {
                        *o == open_id || matches!(routes.get(o), Some(Destination::Disconnected))
                    })
                })
                .filter_map(|g| g.breaking.map(|b| (g.holder, b.required)))
                .collect()
        };
        for (holder, to) in &pending {
            let _ = match holder {
                Holder::Lease(id) => self.ack_lease(*id, *to),
                Holder::Oplock(_) => {
                    Some(self.ack_oplock(file, open_id, caching::oplock_level(*to)))
                }
            };
        }
        !pending.is_empty()
    }

    /// Whether breaks on `file` await acknowledgement.
    pub fn is_breaking(&self, file: FileKey) -> bool {
        records::read::<FileCaching>(&*self.store, &record_key(file))
            .map(|s| s.breaking())
            .unwrap_or(false)
    }

    /// Whether a break of what `open_id` holds awaits acknowledgement.
    pub fn open_breaking(&self, file: FileKey, open_id: u64) -> bool {
        // A member's break is its own, in memory (the record's grant is
        // its group's, and names only the group's entry).
        if let Some((Granted::Lease { breaking, .. }, _)) = self.member_holds(open_id) {
            return breaking;
        }
        records::read::<FileCaching>(&*self.store, &record_key(file))
            .map(|s| {
                s.grants
                    .iter()
                    .any(|g| g.breaking.is_some() && g.opens.contains(&open_id))
            })
            .unwrap_or(false)
    }

    /// What `open_id` caches now: its oplock level, or its lease's state
    /// and the lease's key.
    pub fn held_by(&self, file: FileKey, open_id: u64) -> (Granted, Option<LeaseId>) {
        if let Some((granted, id)) = self.member_holds(open_id) {
            return (granted, Some(id));
        }
        let s = records::read::<FileCaching>(&*self.store, &record_key(file)).unwrap_or_default();
        // A group's grant names the group's entry, whose id is its first
        // open's: that open holds it only as a member (answered above).
        let own = |g: &&caching::Grant| {
            g.opens.contains(&open_id)
                && !matches!(g.holder, Holder::Lease(id) if nimbus_state::group_leases::is_group_lease(&id))
        };
        match s.grants.iter().find(own) {
            Some(g) => match g.holder {
                Holder::Oplock(_) => (Granted::Oplock(caching::oplock_level(g.state)), None),
                Holder::Lease(id) => (
                    Granted::Lease {
                        state: g.state,
                        epoch: g.epoch,
                        breaking: g.breaking.is_some(),
                        version: g.version,
                    },
                    Some(id),
                ),
            },
            None => (Granted::Oplock(caching::OPLOCK_NONE), None),
        }
    }

    /// `admit` for an open `contend_opening` counted among the file's
    /// opens. One that asks to cache nothing it could be granted changes
    /// nothing more in the record, so the record is not written or read
    /// again (a round trip on a file cluster nodes share). One that asks
    /// for caching is written with the file's other CREATEs and closes
    /// that come on this node meanwhile (`together`), where it would be a
    /// transaction of its own.
    pub fn admit_counted(
        &self,
        file: FileKey,
        ask: &OpenAsk,
        route: Route,
        share_modes: &ShareModes,
    ) -> Granted {
        let nothing = match ask.want {
            Want::Nothing => true,
            Want::Oplock(_) => ask.is_dir || caching::stat_open(ask.access),
            Want::Lease { .. } => false,
        };
        if nothing {
            self.notifier.register(ask.open_id, route);
            return Granted::Oplock(caching::OPLOCK_NONE);
        }
        // Routed before the write: once it is written, another node may
        // break the grant at once, and its break must find the open.
        self.notifier.register(ask.open_id, route.clone());
        match self.together(file, together::Step::Admit { ask: *ask }, share_modes) {
            None => {
                // Now decided here, step by step: the lock check the write
                // would have made is made for this admit alone.
                let mut ask = *ask;
                ask.has_byte_range_locks |= !ask.overwrite && self.host.has_locks(file);
                self.admit(file, &ask, route)
            }
            Some(Ok(together::Stepped::Admitted(granted))) => granted,
            Some(Err(e)) => {
                tracing::error!("caching state of {file:?}: {e:?}");
                nothing_granted(ask)
            }
            Some(Ok(_)) => nothing_granted(ask),
        }
    }

    /// Records an open that went ahead and returns what it was granted.
    pub fn admit(&self, file: FileKey, ask: &OpenAsk, route: Route) -> Granted {
        self.admit_routed(file, ask, Some(route))
            .unwrap_or_else(|| nothing_granted(ask))
    }

    /// `admit` of a group's entry for a member (`grouped`): the member's
    /// own open is routed, not the entry. None: the store did not take it.
    fn admit_unrouted(&self, file: FileKey, ask: &OpenAsk) -> Option<Granted> {
        self.admit_routed(file, ask, None)
    }

    fn admit_routed(&self, file: FileKey, ask: &OpenAsk, route: Option<Route>) -> Option<Granted> {
        let turn = self.turn(file);
        let mut ask = *ask;
        // `lease_fits` was asked before the file was opened; a CREATE
        // naming the same key on another file may have been granted its
        // lease meanwhile.
        let mut claimed = Claimed::default();
        self.table().claim_for_admit(file, &mut ask, &mut claimed);
        let ask = &ask;
        let Some((granted, summary)) = apply(&*self.store, file, self.watching(), |s| {
            s.opens.retain(|o| o.open_id != ask.open_id);
            s.admit(ask)
        }) else {
            self.table().give_back(file, claimed);
            return None;
        };
        if let Some(route) = route {
            self.notifier.register(ask.open_id, route);
        }
        let mut t = self.table();
        if let Want::Lease { .. } = ask.want {
            if ask.is_dir && t.dirs.insert(file) {
                t.dirs_touched.push(file);
            }
        }
        t.settle(file, &summary);
        self.count_dirs(&t);
        let touched = std::mem::take(&mut t.dirs_touched);
        drop(t);
        drop(turn);
        // Other nodes learn of a directory lease before its client does.
        self.publish_dirs(touched);
        // The new open's own record is written by its CREATE; a lease it
        // joined changed for the lease's other opens.
        let mut changed = summary.changed;
        changed.retain(|id| *id != ask.open_id);
        self.tell(changed);
        Some(granted)
    }

    /// Forgets an open: closed, or its CREATE failed after `contend`.
    /// Wakes the requests waiting on a break that went with it.
    pub fn forget(&self, file: FileKey, open_id: u64) {
        self.notifier.unregister(open_id);
        let turn = self.turn(file);
        let rule = |s: &mut FileCaching| s.remove_open_and_leases(open_id);
        if let Some(((ended_break, gone), summary)) =
            apply(&*self.store, file, self.watching(), rule)
        {
            self.forgotten(turn, file, ended_break, gone, summary);
        }
    }

    /// A close's `ShareModes::remove_open_unless_last_of_deleted` and
    /// `forget` in one write, on a file cluster nodes share (one etcd
    /// transaction where they would be two, carrying the other CREATEs
    /// and closes of the file that came on this node meanwhile:
    /// `together`). `Some(Ok(true))`: both done. `Some(Ok(false))`: the
    /// last open of a delete-pending file, nothing done (the close deletes
    /// the file, then removes the open and forgets it one record at a time). None:
    /// not written together, nothing done.
    pub fn forget_closing(
        &self,
        file: FileKey,
        open_id: u64,
        share_modes: &ShareModes,
    ) -> Option<Result<bool, SharingError>> {
        let step = together::Step::Close { open_id };
        Some(match self.together(file, step, share_modes)? {
            Ok(together::Stepped::Closed(left)) => Ok(left),
            Ok(_) => Err(SharingError::Store(StateError::Unavailable(
                "a close's write came back as an open's".into(),
            ))),
            Err(e) => Err(e),
        })
    }

    /// What `forget` does once the record is written: waiters on a break
    /// that ended woken, the table settled, leases that went forgotten.
    fn forgotten(
        &self,
        turn: turns::Turn<'_>,
        file: FileKey,
        ended_break: bool,
        gone: Vec<LeaseId>,
        summary: Summary,
    ) {
        let wake_them = ended_break || !summary.breaking;
        let mut t = self.table();
        let (woken, touched) = self.settle_leaving(&mut t, file, wake_them, gone, &summary);
        drop(t);
        drop(turn);
        self.forget_gone_groups();
        self.publish_dirs(touched);
        self.tell(summary.changed);
        wake(woken);
    }

    /// Settles the table after opens of `file` left its record (`forget`,
    /// and a batch with closes): with `wake_them` (a break ended with
    /// them, or none is under way) the requests waiting on the file are
    /// taken, to be woken; the leases that went with them are forgotten.
    /// The waiters, and the directories whose leases other nodes must
    /// hear of.
    fn settle_leaving(
        &self,
        t: &mut Table,
        file: FileKey,
        wake_them: bool,
        gone: Vec<LeaseId>,
        summary: &Summary,
    ) -> (Vec<Waiter>, Vec<FileKey>) {
        let woken = match t.files.get_mut(&file) {
            Some(local) if wake_them => std::mem::take(&mut local.waiters),
            _ => Vec::new(),
        };
        t.settle(file, summary);
        self.count_dirs(t);
        for id in &gone {
            t.lease_files.remove(id);
        }
        // The groups' lock is never taken under the table's (`grouped`
        // takes one, lets it go, then the other): their leases are
        // forgotten once it is let go (`forget_gone_groups`).
        t.groups_gone.extend(
            gone.into_iter()
                .filter(nimbus_state::group_leases::is_group_lease),
        );
        (woken, std::mem::take(&mut t.dirs_touched))
    }

    /// Parks a request until the file's breaks end; `wake` retries it. If
    /// they ended already (acknowledged between the request's check and
    /// now), it is retried at once.
    pub fn wait(&self, file: FileKey, async_id: u64, wake_fn: Box<dyn FnOnce() + Send>) {
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            let _ = RUNTIME.set(rt);
        }
        let now = {
            let _turn = self.turn(file);
            let breaking = records::read::<FileCaching>(&*self.store, &record_key(file))
                .map(|s| s.breaking())
                .unwrap_or(false);
            if breaking {
                let mut t = self.table();
                t.files.entry(file).or_default().waiters.push(Waiter {
                    async_id,
                    wake: wake_fn,
                    since: Instant::now(),
                });
                if let Some(f) = self.on_wait.get() {
                    f();
                }
                None
            } else {
                Some(wake_fn)
            }
        };
        if let Some(w) = now {
            spawn(w);
        }
    }

    /// Looks again at a file whose requests wait for breaks another node
    /// may have ended (its record changed in etcd, or once a second): they
    /// go on once nothing on the file is breaking. A gone node's grants
    /// are dropped, and breaks older than the timeout (their sender died
    /// with its timer) are taken as done.
    pub fn retry(&self, file: FileKey) {
        let (woken, changed) = {
            let _turn = self.turn(file);
            let Some(oldest) = self
                .table()
                .files
                .get(&file)
                .and_then(|l| l.waiters.iter().map(|w| w.since).min())
            else {
                return;
            };
            // A group's grant is given GROUP_GRACE more, as its timer is
            // (`start_timer`): its node answers for its members first.
            let waited = oldest.elapsed();
            let overdue = |h: Holder| {
                let grace = if self.gone.is_some() && Self::is_group_holder(h) {
                    grouped::GROUP_GRACE
                } else {
                    Duration::ZERO
                };
                waited > self.break_timeout() + grace + Duration::from_secs(1)
            };
            let Some(((), summary)) = apply(&*self.store, file, self.watching(), |s| {
                self.purge_gone(s);
                let breaking: Vec<Holder> = s
                    .grants
                    .iter()
                    .filter(|g| g.breaking.is_some() && overdue(g.holder))
                    .map(|g| g.holder)
                    .collect();
                for h in breaking {
                    s.break_timed_out(h);
                }
            }) else {
                return;
            };
            let mut t = self.table();
            let woken = match t.files.get_mut(&file) {
                Some(local) if !summary.breaking => std::mem::take(&mut local.waiters),
                _ => Vec::new(),
            };
            t.settle(file, &summary);
            (woken, summary.changed)
        };
        self.tell(changed);
        wake(woken);
        // Breaks sent while their node still looked alive, to opens no
        // node serves now.
        if self.host.in_cluster() {
            let stranded = |open_id: u64| self.host.stranded(open_id);
            let s =
                records::read::<FileCaching>(&*self.store, &record_key(file)).unwrap_or_default();
            for g in s.grants.iter() {
                let Some(b) = g.breaking else { continue };
                if !g.opens.is_empty() && g.opens.iter().all(|o| stranded(*o)) {
                    self.ack_stranded(
                        file,
                        BreakOrder {
                            holder: g.holder,
                            from: g.state,
                            to: b.sent,
                            ack_required: true,
                            epoch: g.epoch,
                            version: g.version,
                        },
                    );
                }
            }
        }
    }

    /// The files with requests waiting for breaks.
    pub fn waiting_files(&self) -> Vec<FileKey> {
        self.table()
            .files
            .iter()
            .filter(|(_, l)| !l.waiters.is_empty())
            .map(|(k, _)| *k)
            .collect()
    }

    /// Takes a waiting request out (cancelled, or its connection went).
    pub fn withdraw(&self, file: FileKey, async_id: u64) {
        let mut t = self.table();
        if let Some(local) = t.files.get_mut(&file) {
            local.waiters.retain(|w| w.async_id != async_id);
            if local.waiters.is_empty() && local.break_serial.is_empty() {
                t.files.remove(&file);
            }
        }
    }

    /// OPLOCK_BREAK acknowledgement of an oplock.
    pub fn ack_oplock(&self, file: FileKey, open_id: u64, level: u8) -> AckOutcome {
        self.ack(file, |s| s.ack_oplock(open_id, level))
    }

    /// OPLOCK_BREAK acknowledgement of a lease; None when the lease is
    /// unknown.
    pub fn ack_lease(&self, id: LeaseId, state: u32) -> Option<AckOutcome> {
        if let Some(outcome) = self.ack_member(id, state) {
            return Some(outcome);
        }
        let file = *self.table().lease_files.get(&id)?;
        Some(self.ack(file, |s| s.ack_lease(id, state)))
    }

    fn ack(
        &self,
        file: FileKey,
        f: impl FnMut(&mut FileCaching) -> Result<Acked, AckError>,
    ) -> AckOutcome {
        let (outcome, effects) = self.ack_applied(file, f);
        self.after_ack(file, effects);
        outcome
    }

    /// `ack`'s change of the record, and what is to follow it
    /// (`after_ack`).
    fn ack_applied(
        &self,
        file: FileKey,
        mut f: impl FnMut(&mut FileCaching) -> Result<Acked, AckError>,
    ) -> (AckOutcome, AckEffects) {
        let _turn = self.turn(file);
        let Some((r, summary)) = apply(&*self.store, file, self.watching(), |s| {
            f(s).map(|acked| {
                let follow: Vec<BreakOrder> = acked.follow_up.into_iter().collect();
                (acked, targets(s, &follow))
            })
        }) else {
            return (
                AckOutcome::Refused(AckError::NotBreaking),
                AckEffects::default(),
            );
        };
        let (acked, to) = match r {
            Ok(v) => v,
            Err(e) => return (AckOutcome::Refused(e), AckEffects::default()),
        };
        let mut t = self.table();
        let woken = match t.files.get_mut(&file) {
            Some(local) if !summary.breaking => std::mem::take(&mut local.waiters),
            _ => Vec::new(),
        };
        let sends = self.prepare_breaks(&mut t, file, to);
        t.settle(file, &summary);
        let effects = AckEffects {
            sends,
            woken,
            changed: summary.changed,
        };
        (AckOutcome::Done(acked), effects)
    }

    /// What follows an acknowledgement's write: further breaks sent, the
    /// opens whose caching changed told, waiting requests woken.
    fn after_ack(&self, file: FileKey, effects: AckEffects) {
        self.send(file, effects.sends);
        self.tell(effects.changed);
        wake(effects.woken);
    }

    /// Another open writes, truncates or locks: read caching of the other
    /// holders goes, without waiting (MS-FSA 2.1.4.12).
    pub fn contend_readers(&self, file: FileKey, writer_open: u64) {
        // A member's lease is its group's grant in the record, which names
        // the group's entry (perhaps this very open's id): its lock breaks
        // the grant like anyone's, so that the other members' read caching
        // goes too (its own goes with it). So does a lock of an open of the
        // group that asked no lease, when its id names the entry (it was
        // the group's first): the grant is the members', not its own.
        let writer =
            if self.member_holds(writer_open).is_some() || self.names_group_lease(writer_open) {
                NO_OPEN
            } else {
                writer_open
            };
        self.contend_with(file, |s| s.contend_readers(writer));
    }

    /// The file is being deleted or renamed through `by`: other holders'
    /// handle caching goes. Returns whether a holder keeps it until it
    /// acknowledges (a rename then `wait`s; a delete goes on).
    pub fn contend_handles(&self, file: FileKey, by: u64) -> bool {
        self.contend_with(file, |s| {
            let c = s.contend_handles(by);
            (c.breaks, c.wait)
        })
    }

    /// How many leases this node's opens hold.
    pub fn lease_count(&self) -> usize {
        let t = self.table();
        if self.groups.is_none() {
            return t.lease_files.len();
        }
        // Group leases (`grouped`) stand for their members, which are
        // counted themselves.
        t.lease_files
            .keys()
            .filter(|id| !nimbus_state::group_leases::is_group_lease(id))
            .count()
    }

    /// Forgets the groups whose grants went from their records
    /// (`settle_leaving` notes them under the table's lock).
    fn forget_gone_groups(&self) {
        let gone = std::mem::take(&mut self.table().groups_gone);
        for id in gone {
            self.forget_group_lease(&id);
        }
    }

    /// Whether any directory holds a lease now, here or on another node.
    pub fn has_dir_leases(&self) -> bool {
        self.dir_leases.load(Ordering::Acquire) != 0
            || self.elsewhere.as_ref().is_some_and(|e| e.any())
    }

    fn count_dirs(&self, t: &Table) {
        self.dir_leases.store(t.dirs.len(), Ordering::Release);
    }

    /// Something changed inside directory `dir`: its leases go to none,
    /// except the one `by` names (the client's own parent lease). Nobody
    /// waits for these acknowledgements.
    pub fn contend_children(&self, dir: FileKey, by: Option<LeaseId>) {
        let here = self.table().dirs.contains(&dir);
        if !here && !self.elsewhere.as_ref().is_some_and(|e| e.holds(dir)) {
            return;
        }
        self.contend_with(dir, |s| s.contend_children(by));
    }

    /// Applies a rule that breaks other holders without admitting anyone,
    /// on a file that holds grants (others cost no store look-up), and
    /// sends its breaks.
    fn contend_with<T: BreakList>(
        &self,
        file: FileKey,
        mut rule: impl FnMut(&mut FileCaching) -> T,
    ) -> T::Extra {
        // Grants of another node's clients are in a record this node does
        // not own: it is read. A single node (no liveness to ask) owns
        // every record, and asks nothing per WRITE, not even a turn. A
        // grant whose admit is settling meanwhile is taken as coming after
        // this change: its CREATE has not been answered yet.
        let shared = self.gone.is_some() && !self.store.is_local(&record_key(file));
        if !shared && !self.table().granted.contains(&file) {
            return T::Extra::default();
        }
        let (extra, sends, changed) = {
            let _turn = self.turn(file);
            let Some(((extra, to), summary)) = apply(&*self.store, file, self.watching(), |s| {
                let (breaks, extra) = rule(s).split();
                (extra, targets(s, &breaks))
            }) else {
                return T::Extra::default();
            };
            let mut t = self.table();
            let sends = self.prepare_breaks(&mut t, file, to);
            t.settle(file, &summary);
            (extra, sends, summary.changed)
        };
        self.send(file, sends);
        self.tell(changed);
        extra
    }

    /// Starts the acknowledgement timers of `to`'s breaks that need one.
    /// Under the table lock; sending happens after, outside it.
    fn prepare_breaks(&self, t: &mut Table, file: FileKey, to: Vec<Target>) -> Vec<Target> {
        for (b, _) in &to {
            if !b.ack_required {
                continue;
            }
            t.next_serial += 1;
            let serial = t.next_serial;
            t.files
                .entry(file)
                .or_default()
                .break_serial
                .insert(b.holder, serial);
            self.start_timer(file, b.holder, serial);
        }
        to
    }

    fn start_timer(&self, file: FileKey, holder: Holder, serial: u64) {
        let table = Arc::downgrade(&self.table);
        let turns = self.turns.clone();
        let store = self.store.clone();
        let host = self.host.clone();
        let mut after = self.break_timeout();
        if self.gone.is_some() && Self::is_group_holder(holder) {
            after += grouped::GROUP_GRACE;
        }
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let timed_out = move || {
            let Some(table) = table.upgrade() else {
                return;
            };
            let (woken, changed) = {
                let _turn = turns.take(file);
                {
                    let mut t = lock(&table);
                    let Some(local) = t.files.get_mut(&file) else {
                        return;
                    };
                    if local.break_serial.get(&holder) != Some(&serial) {
                        return;
                    }
                    local.break_serial.remove(&holder);
                }
                let watch = host.follows_caching();
                let Some((timed_out, summary)) =
                    apply(&*store, file, watch, |s| s.break_timed_out(holder))
                else {
                    return;
                };
                if !timed_out {
                    return;
                }
                log_timeout(holder, after);
                crate::metrics::break_timed_out();
                let mut t = lock(&table);
                let woken = match t.files.get_mut(&file) {
                    Some(local) if !summary.breaking => std::mem::take(&mut local.waiters),
                    _ => Vec::new(),
                };
                t.settle(file, &summary);
                (woken, summary.changed)
            };
            if watch_told(&*host, &changed) {
                host.caching_changed(&changed);
            }
            wake(woken);
        };
        let current = Arc::downgrade(&self.table);
        rt.spawn(async move {
            tokio::time::sleep(after).await;
            // A break acknowledged (or followed by a newer one) meanwhile
            // is let be here: serials only ever leave the table.
            let stale = current.upgrade().is_none_or(|t| {
                lock(&t)
                    .files
                    .get(&file)
                    .and_then(|l| l.break_serial.get(&holder))
                    != Some(&serial)
            });
            if stale {
                return;
            }
            // The file's turn may be held across an etcd round trip: not
            // waited for on a runtime worker.
            let _ = tokio::task::spawn_blocking(timed_out).await;
        });
    }

    /// Tells the server of opens whose caching changed. Outside the table
    /// lock: the server reads the caching state back.
    fn tell(&self, changed: Vec<u64>) {
        if watch_told(&*self.host, &changed) {
            self.host.caching_changed(&changed);
        }
    }

    fn send(&self, file: FileKey, sends: Vec<Target>) {
        let mut stranded = Vec::new();
        for (order, open_id) in sends {
            if let Some(group) = self.group_of_order(&order) {
                self.fan_out(group, &order);
                continue;
            }
            let here = lock(&self.notifier.routes).contains_key(&open_id);
            if self.host.in_cluster() && !here {
                if !self.host.forward(open_id, order) && order.ack_required {
                    stranded.push(order);
                }
            } else {
                self.notifier.deliver(open_id, order);
            }
        }
        for order in stranded {
            self.ack_stranded(file, order);
        }
    }
}

/// Channel `lost` of a session was lost (MS-SMB2 3.3.7.1) and the
/// session, whose opens are `opens`, lives on: the breaks of its opens that went out on that
/// connection and still await acknowledgement are sent again on a
/// remaining channel, as the lost one may never have delivered them
/// (3.3.4.6-7: the server picks another connection of the session). Of
/// one holder's breaks, only the latest.
pub fn redeliver_breaks(oplocks: &Oplocks, opens: &[Arc<Open>], lost: &dyn ResponseChannel) {
    let mut latest: HashMap<Holder, (u64, u64, FileKey, BreakOrder)> = HashMap::new();
    {
        let sent = lock(&oplocks.notifier.last_sent);
        for open in opens {
            let Some(s) = sent.get(&open.open_id) else {
                continue;
            };
            if !std::ptr::addr_eq(s.via.as_ptr(), lost as *const dyn ResponseChannel) {
                continue;
            }
            let entry = (s.serial, open.open_id, open.file_key, s.order);
            match latest.get(&s.order.holder) {
                Some(have) if have.0 > s.serial => {}
                _ => {
                    latest.insert(s.order.holder, entry);
                }
            }
        }
    }
    for (_, open_id, file, order) in latest.into_values() {
        if oplocks.open_breaking(file, open_id) {
            oplocks.notifier.deliver(open_id, order);
        }
    }
}

/// Unacknowledged breaks since the last log line, and that line's second:
/// a client ignoring thousands of breaks gets one line a second, not one
/// per break.
static TIMEOUTS_UNLOGGED: AtomicU64 = AtomicU64::new(0);
static TIMEOUT_LOGGED_AT: AtomicU64 = AtomicU64::new(0);

fn log_timeout(holder: Holder, after: Duration) {
    let who = match holder {
        Holder::Oplock(open_id) => format!("oplock of open {open_id}"),
        Holder::Lease(id) => format!("lease {}", hex(&id.key)),
    };
    tracing::debug!("break of {who} not acknowledged in {after:?}; taken as done");
    TIMEOUTS_UNLOGGED.fetch_add(1, Ordering::Relaxed);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let last = TIMEOUT_LOGGED_AT.load(Ordering::Relaxed);
    if last != now
        && TIMEOUT_LOGGED_AT
            .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
    {
        let n = TIMEOUTS_UNLOGGED.swap(0, Ordering::Relaxed);
        tracing::info!(
            "{n} break(s) not acknowledged in {after:?} and taken as done (latest: {who})"
        );
    }
}

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A rule's breaks, and what else it answers (`()` or a wait flag).
trait BreakList {
    type Extra: Default;
    fn split(self) -> (Vec<BreakOrder>, Self::Extra);
}

impl BreakList for Vec<BreakOrder> {
    type Extra = ();
    fn split(self) -> (Vec<BreakOrder>, ()) {
        (self, ())
    }
}

impl BreakList for (Vec<BreakOrder>, bool) {
    type Extra = bool;
    fn split(self) -> (Vec<BreakOrder>, bool) {
        self
    }
}

/// The answer to an open whose caching state could not be recorded.
fn nothing_granted(ask: &OpenAsk) -> Granted {
    match ask.want {
        Want::Lease { version, epoch, .. } => Granted::Lease {
            state: 0,
            epoch,
            breaking: false,
            version,
        },
        _ => Granted::Oplock(caching::OPLOCK_NONE),
    }
}

/// A break notification on its way to a client.
struct Outbound {
    order: BreakOrder,
    route: Route,
}

impl Outbound {
    /// Sends the break; the connection it went on, if any.
    fn send(self) -> Option<Arc<dyn ResponseChannel>> {
        let b = self.order;
        let conn = self.route.channel(matches!(b.holder, Holder::Lease(_)))?;
        tracing::debug!(
            "{}: break {:?} from {:#x} to {:#x} (ack {})",
            conn.peer(),
            b.holder,
            b.from,
            b.to,
            b.ack_required
        );
        // MS-SMB2 3.3.4.6 / 3.3.4.7: MessageId all ones, no credits; an
        // oplock break names the open's session, a lease break none.
        let session_id = match b.holder {
            Holder::Oplock(_) => self.route.session_id,
            Holder::Lease(_) => 0,
        };
        let header = Header {
            credit_charge: 0,
            status: NtStatus::SUCCESS,
            command: Command::OplockBreak as u16,
            credits: 0,
            flags: flags::SERVER_TO_REDIR,
            next_command: 0,
            message_id: u64::MAX,
            async_id: 0,
            tree_id: 0,
            reserved: nimbus_wire::header::DEFAULT_RESERVED,
            session_id,
            signature: [0; 16],
        };
        let seal = self
            .route
            .seal
            .clone()
            .map(|cipher| (self.route.session_id, cipher));
        let file_id = self.route.file_id;
        // A break awaiting acknowledgement on a session with several
        // channels goes again on another should this one prove dead.
        let watched = b.ack_required
            && self
                .route
                .session
                .upgrade()
                .is_some_and(|s| s.channels().iter().filter(|c| !c.is_closing()).count() > 1);
        let frame = crate::pending::build_message(
            conn.as_ref(),
            &header,
            |out| match b.holder {
                Holder::Oplock(_) => OplockBreak {
                    oplock_level: caching::oplock_level(b.to),
                    file_id,
                }
                .encode(out),
                Holder::Lease(id) => LeaseBreakNotification {
                    new_epoch: if b.version >= 2 { b.epoch } else { 0 },
                    flags: if b.ack_required {
                        LEASE_BREAK_ACK_REQUIRED
                    } else {
                        0
                    },
                    lease_key: id.key,
                    current_state: b.from,
                    new_state: b.to,
                }
                .encode(out),
            },
            None,
            seal.as_ref(),
        );
        match frame {
            Some(frame) if watched => conn.send_frame_watched(frame),
            Some(frame) => conn.send_frame(frame),
            None => {}
        }
        Some(conn)
    }
}

/// The runtime waiting requests run on again, for wake-ups that come from
/// outside it (a cluster node's watch thread).
static RUNTIME: std::sync::OnceLock<tokio::runtime::Handle> = std::sync::OnceLock::new();

/// Remembers the server's runtime, for work that comes from outside it
/// (`on_runtime`). Called once the server runs.
pub fn remember_runtime() {
    if let Ok(rt) = tokio::runtime::Handle::try_current() {
        let _ = RUNTIME.set(rt);
    }
}

/// Runs `f` on the runtime's blocking pool, from wherever it is called (a
/// cluster node's inbox thread): what it does may start a break's timer,
/// which needs the runtime.
pub fn on_runtime(f: Box<dyn FnOnce() + Send>) {
    spawn(f)
}

/// Runs `f` after `delay`, on the runtime's blocking pool (it may wait on
/// etcd); without a runtime, never.
pub fn after(delay: Duration, f: Box<dyn FnOnce() + Send>) {
    let rt = tokio::runtime::Handle::try_current()
        .ok()
        .or_else(|| RUNTIME.get().cloned());
    if let Some(rt) = rt {
        rt.spawn(async move {
            tokio::time::sleep(delay).await;
            let _ = tokio::task::spawn_blocking(f).await;
        });
    }
}

/// Runs a woken request again, on the runtime's blocking pool: it may
/// touch the disk and, on a cluster node, wait on etcd.
fn spawn(f: Box<dyn FnOnce() + Send>) {
    let rt = tokio::runtime::Handle::try_current()
        .ok()
        .or_else(|| RUNTIME.get().cloned());
    match rt {
        Some(rt) => {
            let _ = RUNTIME.set(rt.clone());
            rt.spawn_blocking(f);
        }
        None => f(),
    }
}

fn wake(waiters: Vec<Waiter>) {
    for w in waiters {
        spawn(w.wake);
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use nimbus_state::MemoryStore;

    pub(super) fn route() -> Route {
        Route {
            session_id: 1,
            ..Route::unconnected(FileId {
                persistent: 1,
                volatile: 1,
            })
        }
    }

    /// An open for reading data, asking for `want`.
    fn reading(open_id: u64, want: Want) -> OpenAsk {
        OpenAsk {
            open_id,
            access: 0x1,
            overwrite: false,
            sharing_violation: false,
            is_dir: false,
            has_byte_range_locks: false,
            want,
        }
    }

    #[test]
    fn racing_creates_cannot_put_one_lease_key_on_two_files() {
        let oplocks = Oplocks::new(Duration::from_secs(35), Arc::new(MemoryStore::new()));
        let id = LeaseId {
            client: [1; 16],
            key: [2; 16],
        };
        let (x, y) = (FileKey::new(1, 1, 1), FileKey::new(1, 2, 1));
        let ask = |open_id| {
            reading(
                open_id,
                Want::Lease {
                    id,
                    state: caching::READ,
                    version: 2,
                    parent_key: None,
                    epoch: 0,
                },
            )
        };
        // Both CREATEs check the key before either is granted.
        assert!(oplocks.lease_fits(id, Some(x)) && oplocks.lease_fits(id, Some(y)));
        oplocks.contend(x, &ask(1));
        oplocks.contend(y, &ask(2));
        assert!(matches!(
            oplocks.admit(x, &ask(1), route()),
            Granted::Lease {
                state: caching::READ,
                ..
            }
        ));
        assert_eq!(
            oplocks.admit(y, &ask(2), route()),
            Granted::Oplock(caching::OPLOCK_NONE)
        );
        // The key still names the first file, and goes with its last open.
        assert!(!oplocks.lease_fits(id, Some(y)));
        oplocks.forget(y, 2);
        assert!(oplocks.lease_fits(id, Some(x)) && !oplocks.lease_fits(id, Some(y)));
        oplocks.forget(x, 1);
        assert!(oplocks.lease_fits(id, Some(y)));
    }

    #[test]
    fn a_slow_write_of_one_file_holds_up_no_other_files_caching() {
        // On a cluster node a shared file's write is an etcd round trip,
        // and one of a file being handed over waits for its owner. The
        // node's other files must not wait with it (they did: the whole
        // table was locked across the write).
        use nimbus_state::conformance::SharedMemory;
        let store = Arc::new(SharedMemory::default());
        let oplocks = Arc::new(Oplocks::new(Duration::from_secs(35), store.clone()));
        let (slow, other) = (FileKey::new(1, 1, 1), FileKey::new(1, 2, 1));
        let ask = |open_id| reading(open_id, Want::Oplock(caching::OPLOCK_BATCH));
        store.close_gate_on(&record_key(slow));
        let opening = {
            let o = oplocks.clone();
            std::thread::spawn(move || o.contend(slow, &ask(1)))
        };
        store.wait_held(1);

        // Another file's open and close go through meanwhile.
        let (done, got) = std::sync::mpsc::channel();
        {
            let o = oplocks.clone();
            std::thread::spawn(move || {
                o.contend(other, &ask(2));
                let granted = o.admit(other, &ask(2), route());
                o.forget(other, 2);
                let _ = done.send(granted);
            });
        }
        let granted = got.recv_timeout(Duration::from_secs(10));
        assert_eq!(granted, Ok(Granted::Oplock(caching::OPLOCK_BATCH)));

        // The slow file's own next change waits for its turn, and is
        // applied after the held one.
        let closing = {
            let o = oplocks.clone();
            std::thread::spawn(move || o.forget(slow, 1))
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while oplocks.turns.waiting(slow) == 0 {
            assert!(Instant::now() < deadline, "the close never waited");
            std::thread::yield_now();
        }
        store.open_gate();
        assert!(!opening.join().unwrap().wait);
        closing.join().unwrap();
        let s = records::read::<FileCaching>(&*store, &record_key(slow)).unwrap();
        assert!(s.is_empty(), "the close was applied before the open");
        assert!(oplocks.turns.waiting(slow) == 0 && oplocks.waiting_files().is_empty());
    }

    #[test]
    fn the_server_is_told_when_a_break_lowers_an_opens_caching() {
        struct Follows(Arc<Mutex<Vec<u64>>>);
        impl OplockHost for Follows {
            fn follows_caching(&self) -> bool {
                true
            }
            fn caching_changed(&self, ids: &[u64]) {
                lock(&self.0).extend_from_slice(ids);
            }
        }
        let told = Arc::new(Mutex::new(Vec::<u64>::new()));
        let oplocks = Oplocks::new(Duration::from_secs(35), Arc::new(MemoryStore::new()))
            .with_host(Arc::new(Follows(told.clone())));
        let id = LeaseId {
            client: [1; 16],
            key: [2; 16],
        };
        let x = FileKey::new(1, 1, 1);
        let ask = OpenAsk {
            open_id: 1,
            access: 0x3,
            overwrite: false,
            sharing_violation: false,
            is_dir: false,
            has_byte_range_locks: false,
            want: Want::Lease {
                id,
                state: caching::READ | caching::HANDLE,
                version: 2,
                parent_key: None,
                epoch: 0,
            },
        };
        oplocks.contend(x, &ask);
        oplocks.admit(x, &ask, route());
        // Its own grant is its CREATE's to record.
        assert!(lock(&told).is_empty());
        // Another open writes: RH must be acknowledged before it goes, and
        // until then the holder still caches it.
        oplocks.contend_readers(x, 2);
        assert!(lock(&told).is_empty());
        assert!(matches!(
            oplocks.ack_lease(id, 0),
            Some(AckOutcome::Done(_))
        ));
        assert_eq!(*lock(&told), vec![1]);
        // Closing it tells nothing about it.
        lock(&told).clear();
        oplocks.forget(x, 1);
        assert!(lock(&told).is_empty());
    }
}
