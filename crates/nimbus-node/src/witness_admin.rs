//! The administrator's side of the witness service: `nimbus witness
//! list`, `nimbus witness move` and `nimbus drain`, run as commands against
//! the cluster's etcd (not inside a node). They read the registrations
//! every node keeps in etcd (`nimbus_cluster::witness_records`) and put
//! their messages only in the boxes of the nodes holding the registrations
//! concerned; each such node tells its clients (`crate::witness`).

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use nimbus_cluster::witness_records::{self, HeldRecord, WitnessRecord};
use nimbus_state::StateStore;

/// What `nimbus drain` does: the witness clients of the node `file`
/// configures are told to move (to `to`, or to every other node), and the
/// node stops once they have gone, or after `within`. What to print.
pub fn drain_command(
    file: &std::path::Path,
    to: Option<&str>,
    within: Duration,
) -> Result<String, String> {
    use nimbus_cluster::witness_move::{encode_drain, encode_stop, now, post, Drain, WitnessDrain};
    let (cfg, store, members) = cluster_members(file)?;
    let me = cfg
        .cluster
        .as_ref()
        .map(|c| c.node.clone())
        .unwrap_or_default();
    if !members.iter().any(|(n, _)| *n == me) {
        return Err(format!("node {me} is not running in the cluster"));
    }
    let targets: Vec<(String, IpAddr)> = members
        .iter()
        .filter(|(n, _)| *n != me && to.is_none_or(|t| t == n))
        .filter_map(|(n, a)| a.map(|a| (n.clone(), a)))
        .collect();
    if targets.is_empty() {
        return Err(match to {
            Some(t) => format!("--to {t}: no such node in the cluster besides {me}"),
            None => format!("{me} is the only node: its clients have nowhere to go"),
        });
    }
    // The node's current run: the newest incarnation recorded for it.
    let incarnation = store
        .scan_prefix(crate::cluster::INCARNATIONS_PREFIX)
        .map_err(|e| format!("etcd: reading the incarnations: {e}"))?
        .into_iter()
        .filter(|(_, v)| v.value == me.as_bytes())
        .filter_map(|(k, _)| {
            std::str::from_utf8(&k[crate::cluster::INCARNATIONS_PREFIX.len()..])
                .ok()?
                .parse::<u64>()
                .ok()
        })
        .max()
        .ok_or_else(|| format!("node {me} has no incarnation record in etcd; is it running?"))?;
    let (held, _) = read_records(&store)?;
    let holders = witness_records::holders(&held, |r| r.node == me);
    let m = WitnessDrain {
        node: me.clone(),
        to: targets.iter().map(|(_, a)| *a).collect(),
        sent: now(),
    };
    if !holders.is_empty() {
        post(&store, &holders, &encode_drain(&m)).map_err(|e| format!("etcd: {e}"))?;
    }
    let stop = Drain {
        incarnation,
        within_secs: u32::try_from(within.as_secs()).unwrap_or(u32::MAX),
        sent: now(),
    };
    post(&store, std::slice::from_ref(&me), &encode_stop(&stop)).map_err(|e| {
        format!(
            "etcd: {e}; {me} was not asked to stop{}: run the command again",
            if holders.is_empty() {
                ""
            } else {
                " (its witness clients were told to move)"
            }
        )
    })?;
    let told = match holders.len() {
        0 => "no witness client is registered for it".to_string(),
        _ => format!(
            "its witness clients (registered through {}) are told to move to {}",
            holders.join(", "),
            targets
                .iter()
                .map(|(n, a)| format!("{n} ({a})"))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    Ok(format!(
        "{me} drains: {told}; it stops once its clients have gone, or in {}s",
        within.as_secs()
    ))
}

/// The configuration `file`, a store on its cluster's etcd, and the
/// members: names and advertised addresses.
#[allow(clippy::type_complexity)]
fn cluster_members(
    file: &std::path::Path,
) -> Result<
    (
        crate::config::Config,
        nimbus_state::etcd_store::EtcdStore,
        Vec<(String, Option<IpAddr>)>,
    ),
    String,
> {
    let cfg = crate::config::Config::from_file(file).map_err(|errors| {
        errors
            .iter()
            .map(|e| e.to_string())
            .collect::<Vec<_>>()
            .join("\n")
    })?;
    let Some(cluster) = &cfg.cluster else {
        return Err(format!(
            "{}: no [cluster]: a witness client moves to another node of a cluster, and a \
             single node has none",
            file.display()
        ));
    };
    let store = crate::cluster::reader_store(cluster, Duration::from_secs(3))
        .map_err(|e| format!("etcd: {e}"))?;
    let members = store
        .scan_prefix(crate::cluster::NODES_PREFIX)
        .map_err(|e| format!("etcd: reading the members: {e}"))?
        .into_iter()
        .map(|(key, value)| {
            let node =
                String::from_utf8_lossy(&key[crate::cluster::NODES_PREFIX.len()..]).into_owned();
            let addr = String::from_utf8_lossy(&value.value)
                .parse::<SocketAddr>()
                .ok()
                .map(|a| a.ip());
            (node, addr)
        })
        .collect();
    Ok((cfg, store, members))
}

/// `nimbus witness move [--client IP] [--share NAME] --to NODE`: asks
/// the nodes of the cluster `file` configures that hold registrations of
/// the witness clients at `client` to tell them to move to `to`'s
/// advertised address (MS-SWN CLIENT_MOVE), or with a share, those holding
/// registrations for it (of `client` only, when named) to move that share
/// there (SHARE_MOVE). What to print.
pub fn move_command(
    file: &std::path::Path,
    client: Option<IpAddr>,
    share: Option<&str>,
    to: &str,
) -> Result<String, String> {
    use nimbus_cluster::witness_move::{encode, encode_share, post, ShareMove, WitnessMove};
    let (cfg, store, members) = cluster_members(file)?;
    if let Some(share) = share {
        if share.chars().count() > nimbus_cluster::witness_move::MAX_SHARE_NAME {
            return Err(format!(
                "--share {share}: longer than a share name may be ({} characters)",
                nimbus_cluster::witness_move::MAX_SHARE_NAME
            ));
        }
        if !cfg
            .shares
            .iter()
            .any(|s| s.name.eq_ignore_ascii_case(share))
        {
            let names: Vec<&str> = cfg.shares.iter().map(|s| s.name.as_str()).collect();
            return Err(format!(
                "--share {share}: {} configures no such share (its shares: {})",
                file.display(),
                names.join(", ")
            ));
        }
    }
    let addr = match members.iter().find(|(n, _)| n == to) {
        Some((_, Some(a))) => *a,
        Some((_, None)) => {
            return Err(format!(
                "--to {to}: its membership record names no address clients can use"
            ))
        }
        None => {
            let nodes: Vec<&str> = members.iter().map(|(n, _)| n.as_str()).collect();
            return Err(format!(
                "--to {to}: no such node in the cluster (its members: {})",
                nodes.join(", ")
            ));
        }
    };
    let sent = nimbus_cluster::witness_move::now();
    let (message, whom) = match (share, client) {
        (Some(share), client) => (
            encode_share(&ShareMove {
                share: share.to_string(),
                client,
                to: vec![addr],
                sent,
            }),
            match client {
                Some(c) => format!("the witness clients at {c} registered for share {share}"),
                None => format!("the witness clients registered for share {share}"),
            },
        ),
        (None, Some(client)) => (
            encode(&WitnessMove {
                client,
                to: vec![addr],
                sent,
            }),
            format!("the witness clients at {client}"),
        ),
        (None, None) => return Err("name --client IP, --share NAME, or both".into()),
    };
    let (held, _) = read_records(&store)?;
    let holders = witness_records::holders(&held, |r| concerns(r, client, share));
    if holders.is_empty() {
        return Err(format!(
            "no registration of {whom} is held in the cluster (`nimbus witness list` shows \
             those that are): nobody was asked to move"
        ));
    }
    let posted = post(&store, &holders, &message).map_err(|e| format!("etcd: {e}"))?;
    Ok(format!(
        "asked {posted} node(s) ({}) to move {whom} to {to} ({addr}); each logs how many \
         registrations it told",
        holders.join(", ")
    ))
}

/// Whether a move of `client`'s registrations, or of `share`'s (of
/// `client` only, when named), concerns registration `r`: what the holding
/// node checks again (`Witness::move_client`, `Witness::move_share`).
fn concerns(r: &WitnessRecord, client: Option<IpAddr>, share: Option<&str>) -> bool {
    let client_ok = client.is_none_or(|c| c == r.client);
    match share {
        Some(share) => {
            client_ok
                && r.share
                    .as_deref()
                    .is_some_and(|s| s.eq_ignore_ascii_case(share))
        }
        None => client.is_some() && client_ok,
    }
}

/// Every registration in etcd; one that does not decode is named on
/// stderr and left out.
fn read_records(
    store: &nimbus_state::etcd_store::EtcdStore,
) -> Result<(Vec<HeldRecord>, usize), String> {
    let (held, refused) = witness_records::read_all(store)
        .map_err(|e| format!("etcd: reading the witness registrations: {e}"))?;
    if refused > 0 {
        eprintln!(
            "{refused} witness registration record(s) in etcd do not decode (not sealed with \
             this cluster's key, or damaged): left out"
        );
    }
    Ok((held, refused))
}

/// `nimbus witness list`: every witness registration the cluster `file`
/// configures holds, as a table or (with `json`) a JSON array. What to
/// print.
pub fn list_command(file: &std::path::Path, json: bool) -> Result<String, String> {
    let (_, store, _) = cluster_members(file)?;
    let (held, _) = read_records(&store)?;
    if json {
        let rows: Vec<serde_json::Value> = held
            .iter()
            .map(|h| {
                serde_json::json!({
                    "holder": h.holder,
                    "handle": h.handle,
                    "client": h.record.client.to_string(),
                    "client_name": h.record.client_name,
                    "node": h.record.node,
                    "address": h.record.addr.to_string(),
                    "share": h.record.share,
                    "ip_notify": h.record.ip_notify,
                    "since": h.record.since,
                })
            })
            .collect();
        return Ok(serde_json::Value::Array(rows).to_string());
    }
    let now = nimbus_cluster::witness_move::now();
    let mut rows = vec![[
        "HELD BY".to_string(),
        "CLIENT".into(),
        "COMPUTER".into(),
        "FOR NODE".into(),
        "ADDRESS".into(),
        "SHARE".into(),
        "IP_CHANGE".into(),
        "AGE".into(),
    ]];
    rows.extend(held.iter().map(|h| {
        let r = &h.record;
        [
            h.holder.clone(),
            r.client.to_string(),
            // From the network: no control characters to the terminal.
            r.client_name
                .chars()
                .map(|c| if c.is_control() { '?' } else { c })
                .collect(),
            r.node.clone(),
            r.addr.to_string(),
            r.share.clone().unwrap_or_else(|| "-".into()),
            if r.ip_notify { "yes" } else { "no" }.into(),
            format!("{}s", now.saturating_sub(r.since)),
        ]
    }));
    let mut out = crate::status::columns(&rows);
    out.push_str(&format!("{} registration(s)", held.len()));
    Ok(out)
}
