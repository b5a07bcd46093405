//! `nimbus status`, the smbstatus of Nimbus: what a running node says
//! about itself (sessions, open files, persistent and durable handles
//! waiting for their clients, leases, locked files, files it owns in a
//! cluster), and how the command reads it back.
//!
//! A node publishes its figures every `PUBLISH_EVERY`: a cluster node to
//! etcd (`status/<node>`, under its lease, so a dead node's goes with it),
//! a single node with a `state_dir` to `state_dir/status.json` (written to a
//! temporary file, then renamed). The command reads the whole cluster (or
//! one node of it) from etcd, or the single node's file, and prints a table
//! or JSON. A figure is as old as its `updated` time; a node whose last
//! figures are older than `STALE_AFTER` is shown as not answering.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use nimbus_state::etcd_store::Op;
use nimbus_state::{EtcdStore, StateStore};
use serde::{Deserialize, Serialize};

use crate::config::Config;
use crate::server::Server;

/// Key prefix of the cluster nodes' figures.
pub const STATUS_PREFIX: &[u8] = b"status/";

/// How often a node publishes its figures.
pub const PUBLISH_EVERY: Duration = Duration::from_secs(2);

/// Figures older than this are a node that does not answer.
pub const STALE_AFTER: Duration = Duration::from_secs(10);

/// The file a single node writes in its state directory.
pub const STATUS_FILE: &str = "status.json";

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
                None => self.config.listen.iter().map(|a| a.to_string()).collect(),
            },
            sessions: self.sessions.len(),
            open_files: self.opens.len(),
            disconnected_handles: self.durables.disconnected_count(),
            leases: self.oplocks.lease_count(),
            locked_files: self.locks.locked_files(),
            owned_files: self.cluster.as_ref().map_or(0, |m| m.owned_files()),
            updated: now_unix(),
        }
    }
}

/// Publishes this node's figures once (see the module text); errors are
/// logged, the next round tries again.
pub fn publish(server: &Server) {
    let status = server.status();
    let Ok(json) = serde_json::to_vec(&status) else {
        return;
    };
    if let Some(m) = &server.cluster {
        let mut key = STATUS_PREFIX.to_vec();
        key.extend_from_slice(m.node.as_bytes());
        if let Err(e) = m.store.txn(&[], &[Op::Put(&key, &json, m.lease())], &[]) {
            tracing::debug!("status: not published: {e}");
        }
    } else if let Some(dir) = &server.config.state_dir {
        let tmp = dir.join(format!("{STATUS_FILE}.tmp"));
        let written =
            std::fs::write(&tmp, &json).and_then(|()| std::fs::rename(&tmp, dir.join(STATUS_FILE)));
        if let Err(e) = written {
            tracing::debug!("status: {} not written: {e}", dir.display());
        }
    }
}

/// Publishes for as long as the server runs (a cluster node, or a single
/// node with a state directory).
pub async fn publish_forever(server: Arc<Server>) {
    if server.cluster.is_none() && server.config.state_dir.is_none() {
        return;
    }
    loop {
        let s = server.clone();
        let _ = tokio::task::spawn_blocking(move || publish(&s)).await;
        tokio::time::sleep(PUBLISH_EVERY).await;
    }
}

fn health(status: &NodeStatus) -> &'static str {
    if now_unix().saturating_sub(status.updated) > STALE_AFTER.as_secs() {
        "not answering"
    } else {
        "up"
    }
}

/// What the servers of configuration `file` say: every node of its
/// cluster (or the one named `only`), or the single node's file.
pub fn read(file: &Path, only: Option<&str>) -> Result<Vec<NodeReport>, String> {
    let cfg = Config::from_file(file).map_err(|errors| {
        errors
            .iter()
            .map(|e| e.to_string())
            .collect::<Vec<_>>()
            .join("\n")
    })?;
    match &cfg.cluster {
        Some(c) => read_cluster(&c.etcd, only),
        None => {
            let dir = cfg.state_dir.as_ref().ok_or_else(|| {
                format!(
                    "{}: a single node publishes its status in its state directory, and \
                     none is configured; set the top-level key state_dir, or [cluster]",
                    file.display()
                )
            })?;
            read_local(dir).map(|r| vec![r])
        }
    }
}

fn read_local(dir: &Path) -> Result<NodeReport, String> {
    let path: PathBuf = dir.join(STATUS_FILE);
    let bytes = std::fs::read(&path).map_err(|e| {
        format!(
            "{}: {e} (is the server running with this state_dir?)",
            path.display()
        )
    })?;
    let status: NodeStatus = serde_json::from_slice(&bytes)
        .map_err(|e| format!("{}: not a status file: {e}", path.display()))?;
    Ok(NodeReport {
        node: status.node.clone(),
        health: health(&status).into(),
        status: Some(status),
    })
}

fn read_cluster(etcd: &[String], only: Option<&str>) -> Result<Vec<NodeReport>, String> {
    let store = EtcdStore::new(etcd, crate::cluster::KEY_PREFIX, Duration::from_secs(3))
        .map_err(|e| format!("[cluster] etcd: {e}"))?;
    let members = store
        .scan_prefix(crate::cluster::NODES_PREFIX)
        .map_err(|e| format!("[cluster] etcd: {e}"))?;
    let figures = store
        .scan_prefix(STATUS_PREFIX)
        .map_err(|e| format!("[cluster] etcd: {e}"))?;
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
        out.push(NodeReport {
            health: status.as_ref().map_or("starting", health).into(),
            node,
            status,
        });
    }
    if let (Some(o), true) = (only, out.is_empty()) {
        return Err(format!("no node \"{o}\" in the cluster"));
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
    ]
    .map(String::from)];
    for r in reports {
        let s = r.status.as_ref();
        let n = |f: fn(&NodeStatus) -> usize| s.map_or("-".into(), |s| f(s).to_string());
        rows.push([
            if r.node.is_empty() {
                "(single)".into()
            } else {
                r.node.clone()
            },
            r.health.clone(),
            s.map_or("-".into(), |s| s.listen.join(",")),
            n(|s| s.sessions),
            n(|s| s.open_files),
            n(|s| s.disconnected_handles),
            n(|s| s.leases),
            n(|s| s.locked_files),
            n(|s| s.owned_files),
        ]);
    }
    let widths: Vec<usize> = (0..rows[0].len())
        .map(|i| rows.iter().map(|r| r[i].len()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for r in &rows {
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
            updated,
        }
    }

    #[test]
    fn figures_read_back_and_age_into_not_answering() {
        let s = figures(now_unix());
        let back: NodeStatus = serde_json::from_slice(&serde_json::to_vec(&s).unwrap()).unwrap();
        assert_eq!(back, s);
        assert_eq!(health(&s), "up");
        assert_eq!(health(&figures(now_unix() - 60)), "not answering");
    }

    #[test]
    fn the_table_has_a_line_per_node_and_dashes_for_missing_figures() {
        let t = table(&[
            NodeReport {
                node: "n1".into(),
                health: "up".into(),
                status: Some(figures(now_unix())),
            },
            NodeReport {
                node: "n2".into(),
                health: "starting".into(),
                status: None,
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
}
