//! Reload: a new configuration taken while clients stay connected
//! (SIGHUP, `nimbus reload`).
//!
//! What may change: shares (added, removed, changed), `[limits]`,
//! `server_comment`, `[security] admins`, and the log's level and format
//! (the binary applies those two). Everything else was used to start:
//! listen addresses, names, the user database, the state directory,
//! signing, encryption and ciphers server-wide, `[cluster]`,
//! `[kerberos]`, `[metrics]`. A file that changes any of those is refused
//! whole, with the keys named, and the server goes on with what it had:
//! a reload either takes a file entirely or not at all.
//!
//! A share whose settings change keeps serving: read-only, access-based
//! enumeration, hidden names and the comment hold for the next request of
//! every client connected to it; encryption holds for tree connects made
//! after the reload (a tree connect tells the client whether to encrypt).
//! A share that is removed, or whose path, guest access, continuous
//! availability or Apple extensions change (what its clients were told
//! when they connected), is taken away: its tree connects end, their open
//! handles are closed as a TREE_DISCONNECT closes them, and a client's
//! next request on one is answered STATUS_NETWORK_NAME_DELETED; a changed
//! one is then served anew under its name.

use std::sync::Arc;

use crate::config::{Config, ShareConfig};
use crate::server::Server;
use crate::share::{Share, ShareSettings};
use crate::sync::lock;

/// What a reload changed, for its log line.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Reloaded {
    pub added: Vec<String>,
    pub removed: Vec<String>,
    /// Served anew under the same name (see the module text).
    pub replaced: Vec<String>,
    /// Settings changed in place.
    pub changed: Vec<String>,
    pub limits_changed: bool,
    /// Tree connects and open handles closed with the shares taken away.
    pub trees_closed: usize,
    pub opens_closed: usize,
}

impl std::fmt::Display for Reloaded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let list = |names: &[String]| {
            if names.is_empty() {
                "none".to_string()
            } else {
                names.join(", ")
            }
        };
        write!(
            f,
            "shares added: {}; removed: {}; replaced: {}; changed: {}; limits {}; {} tree \
             connect(s) and {} open handle(s) closed",
            list(&self.added),
            list(&self.removed),
            list(&self.replaced),
            list(&self.changed),
            if self.limits_changed {
                "changed"
            } else {
                "unchanged"
            },
            self.trees_closed,
            self.opens_closed
        )
    }
}

/// Why a reload was refused; the running configuration stays as it was.
#[derive(Debug)]
pub enum Refused {
    /// Keys that only a restart changes (`needs_restart`).
    NeedsRestart(Vec<String>),
    /// A share of the new file cannot be served.
    Share {
        name: String,
        path: std::path::PathBuf,
        why: nimbus_vfs::VfsError,
    },
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refused::NeedsRestart(keys) => write!(
                f,
                "{} cannot change without a restart; restart the server for it, or put the \
                 running value back",
                keys.join(", ")
            ),
            Refused::Share { name, path, why } => {
                write!(f, "share \"{name}\": path {}: {why}", path.display())
            }
        }
    }
}

/// Takes `new` in place of the running configuration, or refuses it with
/// the reason and leaves everything as it was. May wait on the state
/// store (closing handles of a share taken away): call it where blocking
/// is allowed.
pub fn reload(server: &Server, new: Config) -> Result<Reloaded, Refused> {
    let old = server.config();
    let fixed = needs_restart(&old, &new);
    if !fixed.is_empty() {
        return Err(Refused::NeedsRestart(fixed));
    }
    let current = server.shares();
    let find_old = |name: &str| {
        current
            .iter()
            .find(|s| !s.is_ipc() && s.name.eq_ignore_ascii_case(name))
            .cloned()
    };
    let old_config_of = |name: &str| {
        old.shares
            .iter()
            .find(|s| s.name.eq_ignore_ascii_case(name))
    };
    // Every new share is opened before anything changes: a path that
    // cannot be served refuses the whole file.
    let created = crate::server::now_filetime();
    let mut report = Reloaded::default();
    let mut shares: Vec<Arc<Share>> = Vec::new();
    let mut settle: Vec<(Arc<Share>, &ShareConfig)> = Vec::new();
    for s in &new.shares {
        let kept = match (find_old(&s.name), old_config_of(&s.name)) {
            (Some(share), Some(was)) if !Share::must_replace(was, s) => {
                if was != s {
                    report.changed.push(s.name.clone());
                }
                Some(share)
            }
            (Some(_), Some(_)) => {
                report.replaced.push(s.name.clone());
                None
            }
            _ => {
                report.added.push(s.name.clone());
                None
            }
        };
        let share =
            match kept {
                Some(share) => {
                    settle.push((share.clone(), s));
                    share
                }
                None => Arc::new(Share::open(s, new.encryption, created).map_err(|why| {
                    Refused::Share {
                        name: s.name.clone(),
                        path: s.path.clone(),
                        why,
                    }
                })?),
            };
        shares.push(share);
    }
    // IPC$ stays as it is: nothing of it can change.
    if let Some(ipc) = current.iter().find(|s| s.is_ipc()) {
        shares.push(ipc.clone());
    }
    let gone: Vec<Arc<Share>> = current
        .iter()
        .filter(|s| !s.is_ipc() && !shares.iter().any(|n| Arc::ptr_eq(n, s)))
        .cloned()
        .collect();
    report.removed = gone
        .iter()
        .map(|s| s.name.clone())
        .filter(|n| !report.replaced.contains(n))
        .collect();
    report.limits_changed = old.limits != new.limits;

    for (share, config) in settle {
        share.set_settings(ShareSettings::of(config, new.encryption));
    }
    apply_limits(server, &new.limits);
    let roots_of = |shares: &[Arc<Share>]| -> Vec<(std::path::PathBuf, String)> {
        shares
            .iter()
            .filter_map(|s| Some((s.fs.as_ref()?.root_path().to_path_buf(), s.name.clone())))
            .collect()
    };
    let roots = roots_of(&shares);
    // While the old shares' handles close, the relay knows both the new
    // shares (watches may start on them at once) and the old ones (a
    // closed watch withdraws its registration under its share's name).
    if let Some(relay) = server.notify_relay() {
        let mut both = roots.clone();
        both.extend(roots_of(&current));
        relay.set_shares(both);
    }
    server.replace_config(new, shares);
    for share in &gone {
        let (trees, opens) = take_away(server, share);
        report.trees_closed += trees;
        report.opens_closed += opens;
    }
    if let Some(relay) = server.notify_relay() {
        relay.set_shares(roots);
    }
    Ok(report)
}

/// The keys of `new` that differ from `old` and take effect only at
/// start. Every field of `Config` is named here, so that a new one must
/// be sorted into one kind or the other.
pub fn needs_restart(old: &Config, new: &Config) -> Vec<String> {
    let Config {
        listen,
        user_db,
        state_dir,
        signing,
        encryption,
        ciphers,
        fips,
        shares,
        server_name,
        server_aliases,
        workgroup,
        server_comment: _,
        apple_model,
        multichannel,
        limits,
        cluster,
        kerberos,
        log_format: _,
        log_level: _,
        metrics_listen,
        witness_listen,
        witness_endpoint_mapper,
        admins: _,
    } = new;
    let mut keys = Vec::new();
    let mut differs = |changed: bool, key: &str| {
        if changed {
            keys.push(key.to_string());
        }
    };
    differs(*listen != old.listen, "listen");
    differs(*user_db != old.user_db, "user_db");
    differs(*state_dir != old.state_dir, "state_dir");
    differs(*signing != old.signing, "security.signing");
    differs(*encryption != old.encryption, "security.encryption");
    differs(*ciphers != old.ciphers, "security.ciphers");
    differs(*fips != old.fips, "security.fips");
    differs(*server_name != old.server_name, "server_name");
    differs(*server_aliases != old.server_aliases, "server_aliases");
    differs(*workgroup != old.workgroup, "workgroup");
    differs(*apple_model != old.apple_model, "apple_model");
    differs(*multichannel != old.multichannel, "multichannel");
    differs(*cluster != old.cluster, "[cluster]");
    differs(*kerberos != old.kerberos, "[kerberos]");
    differs(*metrics_listen != old.metrics_listen, "metrics.listen");
    differs(*witness_listen != old.witness_listen, "witness.listen");
    differs(
        *witness_endpoint_mapper != old.witness_endpoint_mapper,
        "witness.endpoint_mapper",
    );
    differs(
        limits.max_inotify_watches != old.limits.max_inotify_watches,
        "limits.max_inotify_watches",
    );
    // Whether guests may log on at all is the authenticator's, set at
    // start from the shares.
    let guests = |shares: &[ShareConfig]| shares.iter().any(|s| s.guest_ok);
    differs(
        guests(shares) != guests(&old.shares),
        "share.guest_ok (the first guest share, or the last, decides whether guests may log on)",
    );
    // Encryption of whole sessions is decided at their logon from every
    // share's policy.
    differs(
        new.encrypt_whole_session() != old.encrypt_whole_session(),
        "share.encryption = \"off\" (it decides whether sessions are encrypted whole)",
    );
    keys
}

/// Limits kept outside the configuration, in the services that enforce
/// them; the rest are read from the configuration where they apply.
fn apply_limits(server: &Server, limits: &crate::limits::Limits) {
    server.logon_guard.set_limits(limits);
    let (cap, warning) =
        crate::open_files::open_file_cap(crate::open_files::raise_descriptor_limit(), limits);
    if let Some(w) = warning {
        tracing::warn!("{w}");
    }
    server.open_files.set_cap(cap);
    server.durables.set_limits(crate::durable::KeepLimits {
        total: limits.max_durable_handles,
        per_user: limits.max_durable_handles_per_user,
    });
    server.locks.set_caps(nimbus_state::byte_range::LockCaps {
        per_open: limits.max_byte_range_locks_per_open,
        per_file: limits.max_byte_range_locks_per_file,
    });
    server
        .oplocks
        .set_break_timeout(limits.oplock_break_timeout);
}

/// Ends every tree connect of `share` and closes the handles opened
/// through them, and its durable handles waiting for their clients.
/// Returns how many tree connects and handles.
fn take_away(server: &Server, share: &Arc<Share>) -> (usize, usize) {
    // First: a request that looks its tree up from now on is refused,
    // even one that raced the removal below.
    share.mark_removed();
    let (mut trees, mut opens) = (0, 0);
    for session in server.sessions.all() {
        let ids: Vec<u32> = {
            let mut table = lock(&session.trees);
            let ids: Vec<u32> = table
                .values()
                .filter(|t| Arc::ptr_eq(&t.share, share))
                .map(|t| t.id)
                .collect();
            for id in &ids {
                table.remove(id);
            }
            ids
        };
        if ids.is_empty() {
            continue;
        }
        trees += ids.len();
        let closing: Vec<_> = {
            let mut table = lock(&session.opens);
            let volatile: Vec<u64> = table
                .values()
                .filter(|o| ids.contains(&o.tree_id()))
                .map(|o| o.volatile_id())
                .collect();
            volatile.iter().filter_map(|v| table.remove(v)).collect()
        };
        for open in closing {
            crate::release::release(server, &open);
            opens += 1;
        }
    }
    for open in server.durables.all_disconnected() {
        if Arc::ptr_eq(&open.share, share) && crate::disconnected::purge(server, open.open_id) {
            opens += 1;
        }
    }
    (trees, opens)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_restart_only_key_is_named_and_a_reloadable_one_is_not() {
        let old = Config::default();
        let mut new = old.clone();
        new.server_comment = "another".into();
        new.limits.max_trees_per_session = 3;
        new.log_level = "debug".into();
        assert!(needs_restart(&old, &new).is_empty());
        new.listen = vec!["127.0.0.1:1".parse().unwrap()];
        new.limits.max_inotify_watches = 1;
        assert_eq!(
            needs_restart(&old, &new),
            ["listen", "limits.max_inotify_watches"]
        );
    }

    #[test]
    fn the_first_guest_share_needs_a_restart() {
        let share = |guest_ok| ShareConfig {
            guest_ok,
            ..ShareConfig::new("a", "/tmp".into())
        };
        let old = Config {
            shares: vec![share(false)],
            ..Config::default()
        };
        let mut new = old.clone();
        new.shares = vec![share(true)];
        assert_eq!(needs_restart(&old, &new).len(), 1);
    }
}
