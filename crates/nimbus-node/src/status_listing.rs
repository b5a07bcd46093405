//! What `nimbus status --sessions` and `--files` list of a node: each
//! session (who, from where, with what protection) and each open file
//! (whose, what access and sharing, what it caches, whether it is durable
//! or waits for its client, how many byte-range locks it holds). A node
//! publishes its listing beside its figures (`crate::status`); only when
//! it changed, so that an idle cluster writes nothing more to etcd.

use std::sync::Arc;

use nimbus_state::caching::Granted;
use serde::{Deserialize, Serialize};

use crate::server::Server;
use crate::session::{Open, Session, SessionState};
use crate::sync::lock;

/// At most this many sessions, and as many opens, are listed per node (a
/// listing stays well under etcd's request size limit); the rest are
/// counted.
pub const LISTED_AT_MOST: usize = 500;

/// A node's sessions and open files.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Listing {
    pub sessions: Vec<SessionLine>,
    pub opens: Vec<OpenLine>,
    /// Sessions beyond LISTED_AT_MOST, not listed.
    pub more_sessions: usize,
    /// Opens beyond LISTED_AT_MOST, not listed.
    pub more_opens: usize,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionLine {
    /// SessionId, in hex as Windows shows it.
    pub id: String,
    /// The user as the server knows it (the user database's name; not the
    /// domain a client may send along, which proves nothing), or
    /// "(guest)", "(anonymous)", "(logging on)".
    pub user: String,
    /// The client address of each channel, the first channel first.
    pub clients: Vec<String>,
    /// "2.0.2" to "3.1.1".
    pub dialect: String,
    /// "encrypted (Aes128Gcm)", "signed (AesGmac)" or "none": what every
    /// request of the session must be.
    pub protection: String,
    /// The shares it is connected to, once each.
    pub shares: Vec<String>,
    pub opens: usize,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OpenLine {
    /// Its session's id; "" while it waits for its client to reconnect.
    pub session: String,
    /// The user of its session (or the durable open's owner).
    pub user: String,
    pub share: String,
    /// Share-relative, `\`-separated; a named stream as `file:stream`.
    pub path: String,
    pub directory: bool,
    /// The access mask granted, in hex.
    pub access: String,
    /// The sharing it allows others: R, W, D, or "-" for each it denies.
    pub sharing: String,
    /// "none", "level II", "exclusive", "batch", or "lease RWH" (the
    /// letters it holds; "breaking" while a break awaits its client).
    pub caching: String,
    /// "durable", "persistent" or "".
    pub handle: String,
    /// Kept for its client, which has lost its connection.
    pub disconnected: bool,
    /// Byte-range locks it holds.
    pub locks: usize,
}

impl Server {
    /// This node's sessions and opens now, in a stable order (sessions by
    /// id, opens by share and path) so that an unchanged listing is
    /// byte-identical.
    pub fn listing(&self) -> Listing {
        let mut sessions = self.sessions.all();
        sessions.sort_by_key(|s| s.id);
        let mut opens = self.opens.matching(|_| true);
        opens.sort_by_cached_key(|o| (o.share.name.clone(), shown_path(o), o.open_id));
        Listing {
            more_sessions: sessions.len().saturating_sub(LISTED_AT_MOST),
            more_opens: opens.len().saturating_sub(LISTED_AT_MOST),
            sessions: sessions
                .iter()
                .take(LISTED_AT_MOST)
                .map(|s| session_line(s))
                .collect(),
            opens: opens
                .iter()
                .take(LISTED_AT_MOST)
                .map(|o| self.open_line(o))
                .collect(),
        }
    }

    fn open_line(&self, open: &Arc<Open>) -> OpenLine {
        let (session, user, disconnected) = self.open_owner(open);
        let (granted, _) = self.oplocks.held_by(open.file_key, open.open_id);
        OpenLine {
            session: session.map_or_else(String::new, |s| format!("{:#018x}", s.id)),
            user,
            share: open.share.name.clone(),
            path: shown_path(open),
            directory: open.is_dir,
            access: format!("{:#010x}", open.access),
            sharing: sharing(open.share_access),
            caching: caching(&granted),
            handle: if open.is_persistent() {
                "persistent"
            } else if open.is_durable() {
                "durable"
            } else {
                ""
            }
            .into(),
            disconnected,
            locks: self.locks.held_by(open.file_key, open.open_id).len(),
        }
    }
}

impl Server {
    /// An open's session (None while it waits for its client to
    /// reconnect), the user it is listed under (its session's, else the
    /// durable open's owner), and whether it is disconnected.
    pub fn open_owner(&self, open: &Open) -> (Option<Arc<Session>>, String, bool) {
        let disconnected = self.durables.find_disconnected(open.open_id).is_some();
        let session = (!disconnected)
            .then(|| self.sessions.find(open.session_id()))
            .flatten();
        let user = match &session {
            Some(s) => user_of(s),
            None => lock(&open.durable)
                .as_ref()
                .map(|d| d.owner.name.clone())
                .unwrap_or_default(),
        };
        (session, user, disconnected)
    }
}

fn session_line(s: &Session) -> SessionLine {
    let protection = match &*lock(&s.state) {
        SessionState::Valid(a) if a.encrypt_data => match &a.cipher {
            Some(c) => format!("encrypted ({:?})", c.algorithm()),
            None => "encrypted".into(),
        },
        SessionState::Valid(a) if a.signing_required => {
            format!("signed ({:?})", s.origin.signing_algorithm)
        }
        _ => "none".into(),
    };
    let mut shares: Vec<String> = lock(&s.trees)
        .values()
        .map(|t| t.share.name.clone())
        .collect();
    shares.sort();
    shares.dedup();
    SessionLine {
        id: format!("{:#018x}", s.id),
        user: user_of(s),
        clients: s
            .connections()
            .iter()
            .map(|c| c.peer().to_string())
            .collect(),
        dialect: dialect(s.origin.dialect).into(),
        protection,
        shares,
        opens: lock(&s.opens).len(),
    }
}

fn user_of(s: &Session) -> String {
    match &*lock(&s.state) {
        SessionState::Valid(a) if a.user.is_empty() => "(anonymous)".into(),
        SessionState::Valid(a) if a.guest => "(guest)".into(),
        SessionState::Valid(a) => a.user.clone(),
        SessionState::InProgress { .. } => "(logging on)".into(),
    }
}

/// The name a Windows client would show: `\` between components, a named
/// stream after a colon.
fn shown_path(open: &Open) -> String {
    let path = lock(&open.path).replace('/', "\\");
    match &open.stream {
        Some(s) => format!("{path}:{}", lock(&s.name)),
        None => path,
    }
}

pub(crate) fn dialect(d: nimbus_wire::negotiate::Dialect) -> &'static str {
    use nimbus_wire::negotiate::Dialect;
    match d {
        Dialect::Smb202 => "2.0.2",
        Dialect::Smb210 => "2.1",
        Dialect::Smb300 => "3.0",
        Dialect::Smb302 => "3.0.2",
        Dialect::Smb311 => "3.1.1",
    }
}

/// MS-SMB2 2.2.13 ShareAccess: FILE_SHARE_READ 1, WRITE 2, DELETE 4.
fn sharing(share_access: u32) -> String {
    [(1, 'R'), (2, 'W'), (4, 'D')]
        .iter()
        .map(|&(bit, c)| if share_access & bit != 0 { c } else { '-' })
        .collect()
}

/// MS-SMB2 2.2.13 RequestedOplockLevel and 2.2.13.2.8 LeaseState.
fn caching(granted: &Granted) -> String {
    match *granted {
        Granted::Oplock(0x01) => "level II".into(),
        Granted::Oplock(0x08) => "exclusive".into(),
        Granted::Oplock(0x09) => "batch".into(),
        Granted::Oplock(_) => "none".into(),
        Granted::Lease {
            state, breaking, ..
        } => {
            let letters: String = [(1, 'R'), (4, 'W'), (2, 'H')]
                .iter()
                .filter(|&&(bit, _)| state & bit != 0)
                .map(|&(_, c)| c)
                .collect();
            let letters = if letters.is_empty() {
                "none".into()
            } else {
                letters
            };
            if breaking {
                format!("lease {letters} (breaking)")
            } else {
                format!("lease {letters}")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sharing_and_caching_read_as_windows_names_them() {
        assert_eq!(sharing(7), "RWD");
        assert_eq!(sharing(1), "R--");
        assert_eq!(sharing(0), "---");
        assert_eq!(caching(&Granted::Oplock(0)), "none");
        assert_eq!(caching(&Granted::Oplock(9)), "batch");
        let lease = |state, breaking| Granted::Lease {
            state,
            epoch: 1,
            breaking,
            version: 2,
        };
        assert_eq!(caching(&lease(7, false)), "lease RWH");
        assert_eq!(caching(&lease(3, true)), "lease RH (breaking)");
        assert_eq!(caching(&lease(0, false)), "lease none");
    }
}
