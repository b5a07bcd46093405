//! `nimbus status`, the smbstatus of Nimbus: what a running node says
//! about itself (sessions, open files, persistent and durable handles
//! waiting for their clients, leases, locked files, files it owns in a
//! cluster), and how the command reads it back.
//!
//! A single node with a `state_dir` writes its figures to
//! `state_dir/status.json` every `PUBLISH_EVERY` (to a temporary file,
//! then renamed). A cluster node puts them in etcd (`status/<node>`, under
//! its lease, so a dead node's goes with it), and only when they changed,
//! at most once per `CLUSTER_CHANGED_EVERY`, or, unchanged, once per
//! `CLUSTER_HEARTBEAT` so that a node that stopped publishing shows: every
//! write is a Raft write on every member, and every node's figures each
//! 2 s were most of what an idle cluster asked of etcd (issue 49:
//! 0.5 writes/s per node). The command reads the whole cluster (or one
//! node of it) from etcd, or the single node's file, and prints a table or
//! JSON. A figure is as old as its `updated` time; a node whose last
//! figures are older than `STALE_AFTER` (a cluster node's:
//! `CLUSTER_STALE_AFTER`) is shown as not answering.
//!
//! Beside its figures a node publishes its listing of sessions and open
//! files (`crate::status_listing`, for `--sessions` and `--files`): under
//! `status-listing/<node>` or in `state_dir/status-listing.json`, and only
//! when it changed.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use nimbus_state::etcd_store::Op;
use nimbus_state::StateStore;
use serde::{Deserialize, Serialize};

use crate::config::Config;
use crate::server::Server;
use crate::status_listing::{Listing, OpenLine, SessionLine};

/// Key prefix of the cluster nodes' figures.
pub const STATUS_PREFIX: &[u8] = b"status/";

/// How often a node looks at its figures (a single node: writes them).
pub const PUBLISH_EVERY: Duration = Duration::from_secs(2);

/// A cluster node's changed figures go to etcd at most this often.
pub const CLUSTER_CHANGED_EVERY: Duration = Duration::from_secs(10);

/// A cluster node's unchanged figures go to etcd this often.
pub const CLUSTER_HEARTBEAT: Duration = Duration::from_secs(30);

/// A single node's figures older than this are a node that does not
/// answer.
pub const STALE_AFTER: Duration = Duration::from_secs(10);

/// A cluster node's figures older than this (two heartbeats and a half)
/// are a node that does not answer.
pub const CLUSTER_STALE_AFTER: Duration = Duration::from_secs(75);

/// The file a single node writes in its state directory.
pub const STATUS_FILE: &str = "status.json";

/// Key prefix of the cluster nodes' listings.
pub const LISTING_PREFIX: &[u8] = b"status-listing/";

/// The file a single node writes its listing to.
pub const LISTING_FILE: &str = "status-listing.json";

/// A cluster node looks at its listing every this many rounds (10 s):
/// each look reads the caching and locks of its opens, and those of files
/// another node decides come from etcd.
const CLUSTER_LISTING_ROUNDS: u32 = 5;

/// One node's figures, as published.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeStatus {
    /// The cluster node name ("" for a single node).
    pub node: String,
    /// Where clients reach it.
    pub listen: Vec<String>,
    /// Sessions logged on.
    pub sessions: usize,
    /// Opens of files and directories, connected or not.
    pub open_files: usize,
    /// Durable and persistent handles waiting for their clients.
    pub disconnected_handles: usize,
    /// Leases granted on this node's opens.
    pub leases: usize,
    /// Files with byte-range locks this node knows of.
    pub locked_files: usize,
    /// Files whose state this cluster node owns (decided in its memory).
    pub owned_files: usize,
    /// Witness registrations this node's witness service holds (absent
    /// from the figures of a node older than the service).
    #[serde(default)]
    pub witness_registrations: usize,
    /// Unix seconds of these figures.
    pub updated: u64,
}

/// A node as `nimbus status` shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct NodeReport {
    pub node: String,
    /// "up": figures fresh; "not answering": figures older than
    /// STALE_AFTER; "starting": registered, no figures yet.
    pub health: String,
    #[serde(flatten)]
    pub status: Option<NodeStatus>,
    /// Its sessions and open files, when asked for (`--sessions`,
    /// `--files`) and published.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub listing: Option<Listing>,
}

/// What a node last published of its listing, so that an unchanged one is
/// not written again.
#[derive(Default)]
pub struct Published {
    /// A cluster node's figures last put, without their time; when, and
    /// under which lease.
    figures: Vec<u8>,
    figures_at: Option<std::time::Instant>,
    figures_lease: i64,
    listing: Vec<u8>,
    /// The cluster lease it was put under: a node that registered again
    /// (its old lease, and the keys under it, gone) puts it again.
    lease: i64,
    round: u32,
}

fn now_unix() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl Server {
    /// This node's figures now.
    pub fn status(&self) -> NodeStatus {
        NodeStatus {
            node: self
                .cluster
                .as_ref()
                .map_or_else(String::new, |m| m.node.clone()),
            listen: match &self.cluster {
                Some(m) => vec![m.advertise.to_string()],
                None => self.config().listen.iter().map(|a| a.to_string()).collect(),
            },
            sessions: self.sessions.len(),
            open_files: self.opens.len(),
            disconnected_handles: self.durables.disconnected_count(),
            leases: self.oplocks.lease_count(),
            locked_files: self.locks.locked_files(),
            owned_files: self.cluster.as_ref().map_or(0, |m| m.owned_files()),
            witness_registrations: self.witness.registration_count(),
            updated: now_unix(),
        }
    }
}

/// Publishes this node's figures once, and its listing if it changed
/// since `last` (see the module text); errors are logged, the next round
/// tries again.
pub fn publish(server: &Server, last: &mut Published) {
    let status = server.status();
    let Ok(json) = serde_json::to_vec(&status) else {
        return;
    };
    match &server.cluster {
        None => {
            put(server, STATUS_PREFIX, STATUS_FILE, &json);
        }
        Some(m) => {
            let figures = serde_json::to_vec(&NodeStatus {
                updated: 0,
                ..status
            })
            .unwrap_or_default();
            let lease = m.lease();
            if figures_due(last, &figures, lease) && put(server, STATUS_PREFIX, STATUS_FILE, &json)
            {
                last.figures = figures;
                last.figures_at = Some(std::time::Instant::now());
                last.figures_lease = lease;
            }
        }
    }
    last.round = last.round.wrapping_add(1);
    if server.cluster.is_some() && last.round % CLUSTER_LISTING_ROUNDS != 1 {
        return;
    }
    let Ok(listing) = serde_json::to_vec(&server.listing()) else {
        return;
    };
    let lease = server.cluster.as_ref().map_or(0, |m| m.lease());
    if listing == last.listing && lease == last.lease {
        return;
    }
    if put(server, LISTING_PREFIX, LISTING_FILE, &listing) {
        last.listing = listing;
        last.lease = lease;
    }
}

/// Whether a cluster node puts its figures now: never put under this
/// lease (a node that registered again lost the old key with its lease),
/// changed and `CLUSTER_CHANGED_EVERY` since the last, or a heartbeat due.
fn figures_due(last: &Published, figures: &[u8], lease: i64) -> bool {
    let Some(at) = last.figures_at else {
        return true;
    };
    let since = at.elapsed();
    lease != last.figures_lease
        || since >= CLUSTER_HEARTBEAT
        || (figures != last.figures.as_slice() && since >= CLUSTER_CHANGED_EVERY)
}

/// Writes `value` under `prefix`<node> (a cluster node, under its lease)
/// or to `file` in the state directory (through a temporary file, so a
/// reader never sees half of it). Whether it was written.
fn put(server: &Server, prefix: &[u8], file: &str, value: &[u8]) -> bool {
    if let Some(m) = &server.cluster {
        let mut key = prefix.to_vec();
        key.extend_from_slice(m.node.as_bytes());
        if let Err(e) = m.store.txn(&[], &[Op::Put(&key, value, m.lease())], &[]) {
            tracing::debug!("status: not published: {e}");
            return false;
        }
        true
    } else if let Some(dir) = &server.config().state_dir {
        let tmp = dir.join(format!("{file}.tmp"));
        let written =
            write_private(&tmp, value).and_then(|()| std::fs::rename(&tmp, dir.join(file)));
        if let Err(e) = &written {
            tracing::debug!("status: {} not written: {e}", dir.display());
        }
        written.is_ok()
    } else {
        false
    }
}

/// Writes `value` to the file at `path`, mode 0600 whatever the umask (a
/// file left there with a wider mode is narrowed): the figures and the
/// listing name sessions, users and open files, for the server's user
/// only, as everything in the state directory.
fn write_private(path: &Path, value: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)?;
    f.set_permissions(std::fs::Permissions::from_mode(0o600))?;
    f.write_all(value)
}

/// Publishes for as long as the server runs (a cluster node, or a single
/// node with a state directory).
pub async fn publish_forever(server: Arc<Server>) {
    if server.cluster.is_none() && server.config().state_dir.is_none() {
        return;
    }
    let mut last = Published::default();
    loop {
        let s = server.clone();
        // A panic in one round (there should be none) starts the next
        // one afresh: everything is published again.
        last = tokio::task::spawn_blocking(move || {
            publish(&s, &mut last);
            last
        })
        .await
        .unwrap_or_default();
        tokio::time::sleep(PUBLISH_EVERY).await;
    }
}

fn health(status: &NodeStatus) -> &'static str {
    let stale_after = if status.node.is_empty() {
        STALE_AFTER
    } else {
        CLUSTER_STALE_AFTER
    };
    if now_unix().saturating_sub(status.updated) > stale_after.as_secs() {
        "not answering"
    } else {
        "up"
    }
}

/// Why `nimbus status` could not read what the servers say.
#[derive(Debug)]
pub enum ReadError {
    /// The configuration file does not load; each error names its key.
    Config(Vec<crate::config::ConfigError>),
    /// A single node without a state directory publishes nothing.
    NoStateDir { file: PathBuf },
    /// The single node's status file cannot be read.
    StatusFile {
        path: PathBuf,
        error: std::io::Error,
    },
    /// The single node's status file is not one.
    NotAStatusFile {
        path: PathBuf,
        error: serde_json::Error,
    },
    /// etcd could not be reached as `[cluster]` says.
    Reach(crate::cluster::JoinError),
    /// etcd did not answer a read.
    Etcd(nimbus_state::StateError),
    /// `--node` names no member of the cluster.
    NoSuchNode(String),
}

impl std::fmt::Display for ReadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReadError::Config(errors) => {
                let lines: Vec<String> = errors.iter().map(|e| e.to_string()).collect();
                write!(f, "{}", lines.join("\n"))
            }
            ReadError::NoStateDir { file } => write!(
                f,
                "{}: a single node publishes its status in its state directory, and none is \
                 configured; set the top-level key state_dir, or [cluster]",
                file.display()
            ),
            ReadError::StatusFile { path, error } => write!(
                f,
                "{}: {error} (is the server running with this state_dir?)",
                path.display()
            ),
            ReadError::NotAStatusFile { path, error } => {
                write!(f, "{}: not a status file: {error}", path.display())
            }
            ReadError::Reach(e) => write!(f, "{e}"),
            ReadError::Etcd(e) => write!(f, "[cluster] etcd: {e}"),
            ReadError::NoSuchNode(node) => write!(f, "no node \"{node}\" in the cluster"),
        }
    }
}

impl std::error::Error for ReadError {}

/// What the servers of configuration `file` say: every node of its
/// cluster (or the one named `only`), or the single node's file; with
/// `listings`, each node's sessions and open files too.
pub fn read(file: &Path, only: Option<&str>, listings: bool) -> Result<Vec<NodeReport>, ReadError> {
    let cfg = Config::from_file(file).map_err(ReadError::Config)?;
    match &cfg.cluster {
        Some(c) => read_cluster(c, only, listings),
        None => {
            let dir = cfg
                .state_dir
                .as_ref()
                .ok_or_else(|| ReadError::NoStateDir {
                    file: file.to_path_buf(),
                })?;
            read_local(dir, listings).map(|r| vec![r])
        }
    }
}

fn read_local(dir: &Path, listings: bool) -> Result<NodeReport, ReadError> {
    let path: PathBuf = dir.join(STATUS_FILE);
    let bytes = match std::fs::read(&path) {
        Ok(bytes) => bytes,
        Err(error) => return Err(ReadError::StatusFile { path, error }),
    };
    let status: NodeStatus = match serde_json::from_slice(&bytes) {
        Ok(status) => status,
        Err(error) => return Err(ReadError::NotAStatusFile { path, error }),
    };
    // Written after the first figures: a server just started may not
    // have one yet.
    let listing = listings
        .then(|| std::fs::read(dir.join(LISTING_FILE)).ok())
        .flatten()
        .and_then(|bytes| serde_json::from_slice(&bytes).ok());
    Ok(NodeReport {
        node: status.node.clone(),
        health: health(&status).into(),
        status: Some(status),
        listing,
    })
}

fn read_cluster(
    cfg: &crate::config::ClusterConfig,
    only: Option<&str>,
    listings: bool,
) -> Result<Vec<NodeReport>, ReadError> {
    let store =
        crate::cluster::reader_store(cfg, Duration::from_secs(3)).map_err(ReadError::Reach)?;
    let members = store
        .scan_prefix(crate::cluster::NODES_PREFIX)
        .map_err(ReadError::Etcd)?;
    let figures = store.scan_prefix(STATUS_PREFIX).map_err(ReadError::Etcd)?;
    let lists = if listings {
        store.scan_prefix(LISTING_PREFIX).map_err(ReadError::Etcd)?
    } else {
        Vec::new()
    };
    let mut out = Vec::new();
    for (key, _) in members {
        let node = String::from_utf8_lossy(&key[crate::cluster::NODES_PREFIX.len()..]).into_owned();
        if only.is_some_and(|o| o != node) {
            continue;
        }
        let status = figures
            .iter()
            .find(|(k, _)| k.strip_prefix(STATUS_PREFIX) == Some(node.as_bytes()))
            .and_then(|(_, v)| serde_json::from_slice::<NodeStatus>(&v.value).ok());
        let listing = lists
            .iter()
            .find(|(k, _)| k.strip_prefix(LISTING_PREFIX) == Some(node.as_bytes()))
            .and_then(|(_, v)| serde_json::from_slice::<Listing>(&v.value).ok());
        out.push(NodeReport {
            health: status.as_ref().map_or("starting", health).into(),
            node,
            status,
            listing,
        });
    }
    if let (Some(o), true) = (only, out.is_empty()) {
        return Err(ReadError::NoSuchNode(o.to_string()));
    }
    Ok(out)
}

/// The reports as JSON: a list of nodes, each with its health and figures.
pub fn json(reports: &[NodeReport]) -> String {
    serde_json::to_string_pretty(reports).unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"))
}

/// The reports as a table, one line per node.
pub fn table(reports: &[NodeReport]) -> String {
    let mut rows = vec![[
        "NODE", "HEALTH", "ADDRESS", "SESSIONS", "OPENS", "WAITING", "LEASES", "LOCKED", "OWNED",
        "WITNESS",
    ]
    .map(String::from)];
    for r in reports {
        let s = r.status.as_ref();
        let n = |f: fn(&NodeStatus) -> usize| s.map_or("-".into(), |s| f(s).to_string());
        rows.push([
            node_name(r),
            r.health.clone(),
            s.map_or("-".into(), |s| s.listen.join(",")),
            n(|s| s.sessions),
            n(|s| s.open_files),
            n(|s| s.disconnected_handles),
            n(|s| s.leases),
            n(|s| s.locked_files),
            n(|s| s.owned_files),
            n(|s| s.witness_registrations),
        ]);
    }
    columns(&rows)
}

/// The name a node goes by in the tables.
fn node_name(r: &NodeReport) -> String {
    if r.node.is_empty() {
        "(single)".into()
    } else {
        r.node.clone()
    }
}

/// The sessions of the reports' listings, a line each.
pub fn sessions_table(reports: &[NodeReport]) -> String {
    let mut rows = vec![[
        "NODE",
        "SESSION",
        "USER",
        "CLIENT",
        "DIALECT",
        "PROTECTION",
        "SHARES",
        "OPENS",
    ]
    .map(String::from)];
    let mut more = 0;
    for r in reports {
        let Some(l) = &r.listing else { continue };
        more += l.more_sessions;
        for s in &l.sessions {
            let SessionLine {
                id,
                user,
                clients,
                dialect,
                protection,
                shares,
                opens,
            } = s;
            rows.push([
                node_name(r),
                id.clone(),
                user.clone(),
                or_dash(clients.join(",")),
                dialect.clone(),
                protection.clone(),
                or_dash(shares.join(",")),
                opens.to_string(),
            ]);
        }
    }
    with_more(columns(&rows), more, "sessions")
}

/// The open files of the reports' listings, a line each; the path last,
/// as it may hold spaces.
pub fn files_table(reports: &[NodeReport]) -> String {
    let mut rows = vec![[
        "NODE", "SESSION", "USER", "SHARE", "ACCESS", "SHARING", "CACHING", "HANDLE", "LOCKS",
        "PATH",
    ]
    .map(String::from)];
    let mut more = 0;
    for r in reports {
        let Some(l) = &r.listing else { continue };
        more += l.more_opens;
        for o in &l.opens {
            let OpenLine {
                session,
                user,
                share,
                path,
                directory,
                access,
                sharing,
                caching,
                handle,
                disconnected,
                locks,
            } = o;
            rows.push([
                node_name(r),
                if *disconnected {
                    "(waiting)".into()
                } else {
                    session.clone()
                },
                or_dash(user.clone()),
                share.clone(),
                access.clone(),
                sharing.clone(),
                caching.clone(),
                or_dash(handle.clone()),
                locks.to_string(),
                if *directory {
                    format!("{path}\\")
                } else {
                    path.clone()
                },
            ]);
        }
    }
    with_more(columns(&rows), more, "open files")
}

fn or_dash(s: String) -> String {
    if s.is_empty() {
        "-".into()
    } else {
        s
    }
}

fn with_more(mut table: String, more: usize, what: &str) -> String {
    if more > 0 {
        table.push_str(&format!("(and {more} more {what}, not listed)\n"));
    }
    table
}

/// Rows as left-aligned columns two spaces apart.
pub(crate) fn columns<const N: usize>(rows: &[[String; N]]) -> String {
    let widths: Vec<usize> = (0..N)
        .map(|i| rows.iter().map(|r| r[i].chars().count()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for r in rows {
        let cells: Vec<String> = r
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        out.push_str(cells.join("  ").trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn figures(updated: u64) -> NodeStatus {
        NodeStatus {
            node: "n1".into(),
            listen: vec!["127.0.0.1:4450".into()],
            sessions: 2,
            open_files: 5,
            disconnected_handles: 1,
            leases: 3,
            locked_files: 0,
            owned_files: 4,
            witness_registrations: 0,
            updated,
        }
    }

    #[test]
    fn figures_read_back_and_age_into_not_answering() {
        let s = figures(now_unix());
        let back: NodeStatus = serde_json::from_slice(&serde_json::to_vec(&s).unwrap()).unwrap();
        assert_eq!(back, s);
        assert_eq!(health(&s), "up");
        // A cluster node's figures: unchanged ones come every 30 s.
        assert_eq!(health(&figures(now_unix() - 60)), "up");
        assert_eq!(health(&figures(now_unix() - 80)), "not answering");
        // A single node's (no node name) are written every 2 s.
        let single = |updated| NodeStatus {
            node: String::new(),
            ..figures(updated)
        };
        assert_eq!(health(&single(now_unix() - 5)), "up");
        assert_eq!(health(&single(now_unix() - 11)), "not answering");
    }

    #[test]
    fn a_cluster_nodes_figures_go_out_when_changed_or_as_a_heartbeat() {
        let ago = |d: Duration| std::time::Instant::now().checked_sub(d);
        let last = |at, lease| Published {
            figures: b"same".to_vec(),
            figures_at: at,
            figures_lease: lease,
            ..Published::default()
        };
        // Never put: now.
        assert!(figures_due(&last(None, 7), b"same", 7));
        // Unchanged: only once the heartbeat is due.
        assert!(!figures_due(
            &last(ago(Duration::from_secs(20)), 7),
            b"same",
            7
        ));
        assert!(figures_due(&last(ago(CLUSTER_HEARTBEAT), 7), b"same", 7));
        // Changed: not twice within CLUSTER_CHANGED_EVERY.
        assert!(!figures_due(
            &last(ago(Duration::from_secs(3)), 7),
            b"new",
            7
        ));
        assert!(figures_due(&last(ago(CLUSTER_CHANGED_EVERY), 7), b"new", 7));
        // Registered again under another lease: the old key went with the
        // old lease, so at once.
        assert!(figures_due(
            &last(ago(Duration::from_secs(1)), 7),
            b"same",
            8
        ));
    }

    #[test]
    fn the_table_has_a_line_per_node_and_dashes_for_missing_figures() {
        let t = table(&[
            NodeReport {
                node: "n1".into(),
                health: "up".into(),
                status: Some(figures(now_unix())),
                listing: None,
            },
            NodeReport {
                node: "n2".into(),
                health: "starting".into(),
                status: None,
                listing: None,
            },
        ]);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 3);
        assert!(lines[0].starts_with("NODE"));
        assert!(lines[1].starts_with("n1") && lines[1].contains("127.0.0.1:4450"));
        assert!(
            lines[2].starts_with("n2") && lines[2].contains("starting") && lines[2].contains(" -")
        );
    }

    #[test]
    fn listings_show_a_line_per_session_and_open_and_count_the_rest() {
        let listing = Listing {
            sessions: vec![SessionLine {
                id: "0x0000000000000001".into(),
                user: "alice".into(),
                clients: vec!["127.0.0.1:50000".into(), "127.0.0.1:50002".into()],
                dialect: "3.1.1".into(),
                protection: "signed (AesGmac)".into(),
                shares: vec!["data".into()],
                opens: 1,
            }],
            opens: vec![OpenLine {
                session: String::new(),
                user: "alice".into(),
                share: "data".into(),
                path: "dir\\a file.txt".into(),
                directory: false,
                access: "0x0012019f".into(),
                sharing: "RW-".into(),
                caching: "lease RWH".into(),
                handle: "durable".into(),
                disconnected: true,
                locks: 2,
            }],
            more_sessions: 0,
            more_opens: 3,
        };
        let back: Listing = serde_json::from_slice(&serde_json::to_vec(&listing).unwrap()).unwrap();
        assert_eq!(back, listing);
        let reports = [NodeReport {
            node: String::new(),
            health: "up".into(),
            status: Some(figures(now_unix())),
            listing: Some(listing),
        }];
        let sessions: Vec<String> = sessions_table(&reports).lines().map(String::from).collect();
        assert_eq!(sessions.len(), 2);
        assert!(sessions[1].starts_with("(single)"));
        assert!(
            sessions[1].contains("alice")
                && sessions[1].contains("127.0.0.1:50000,127.0.0.1:50002")
        );
        let files: Vec<String> = files_table(&reports).lines().map(String::from).collect();
        assert_eq!(files.len(), 3);
        assert!(files[1].contains("(waiting)") && files[1].contains("lease RWH"));
        assert!(files[1].ends_with("dir\\a file.txt"));
        assert_eq!(files[2], "(and 3 more open files, not listed)");
    }
}
