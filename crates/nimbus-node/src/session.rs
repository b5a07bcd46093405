//! Per-connection protocol objects: sessions, tree connects and opens
//! (MS-SMB2 3.3.1.8 Session, 3.3.1.9 TreeConnect, 3.3.1.10 Open).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

use nimbus_auth::AuthExchange;

use crate::negotiated::Negotiated;

pub use crate::open::{
    share_maximal_access, DirEnum, HeldPipe, NewOpen, Open, PipeOpen, ReplayOf, StreamOf, Tree,
    NO_LOCK_SEQUENCE,
};
use crate::security::SessionCipher;
pub use crate::security::SigningKey;

use crate::sync::lock;

/// A connection as a session sees it: one of its channels (MS-SMB2
/// 3.3.1.8 Session.ChannelList). The connection loop implements it; a
/// session never knows more of its connections.
pub trait Channel: crate::pending::ResponseChannel {
    /// Whether the client is known to be gone (its connection closing or
    /// silent past its keep-alive).
    fn client_gone(&self) -> bool;
    /// Stops reading and closes the connection now.
    fn drop_now(&self);
    /// Whether the connection has ended, its sessions released.
    fn has_ended(&self) -> bool;
    /// `session` ended: it leaves this connection's session table and
    /// bindings.
    fn forget_session(&self, session: &Session);
    /// `session` ended: its requests still waiting on this connection end
    /// CANCELLED.
    fn end_requests_of(&self, session_id: u64);
}

/// Whether `w` (a channel's address) is `conn`'s.
fn same_channel(w: *const dyn Channel, conn: &dyn Channel) -> bool {
    std::ptr::addr_eq(w, conn as *const dyn Channel)
}

pub enum SessionState {
    /// SESSION_SETUP exchange under way (MS-SMB2 3.3.5.5).
    InProgress {
        exchange: Box<AuthExchange>,
        /// 3.1.1 Session.PreauthIntegrityHashValue so far.
        preauth: [u8; 64],
    },
    Valid(Authenticated),
}

pub struct Authenticated {
    /// The SIDs the session acts with in access checks.
    pub token: Arc<crate::acl::Token>,
    pub user: String,
    pub domain: String,
    pub guest: bool,
    /// None for guest and anonymous sessions, which cannot sign.
    pub signer: Option<SigningKey>,
    /// Every request must be signed (MS-SMB2 Session.SigningRequired).
    pub signing_required: bool,
    /// Encryption keys, if a cipher was negotiated and the session has a key.
    pub cipher: Option<Arc<SessionCipher>>,
    /// Session.EncryptData: every request must arrive encrypted.
    pub encrypt_data: bool,
    /// Session.ExpirationTime (the Kerberos ticket's end): past it, only
    /// SESSION_SETUP (re-authentication), LOGOFF, CLOSE and LOCK are
    /// served (MS-SMB2 3.3.5.2.9). None: never.
    pub expires: Option<std::time::Instant>,
}

pub struct Session {
    pub id: u64,
    pub state: Mutex<SessionState>,
    pub trees: Mutex<HashMap<u32, Arc<Tree>>>,
    pub opens: Mutex<HashMap<u64, Arc<Open>>>,
    /// Named pipes open on IPC$, by volatile id (kept apart from the
    /// file opens: no share modes, locks or caching).
    pub pipes: Mutex<HashMap<u64, Arc<PipeOpen>>>,
    /// A re-authentication of this valid session under way (MS-SMB2
    /// 3.3.5.5.2), between its legs.
    pub reauth: Mutex<Option<AuthExchange>>,
    /// What the connection that made the session negotiated: a channel
    /// bound later must have negotiated the same dialect, cipher and
    /// ClientGuid (MS-SMB2 3.3.5.5, Session.Connection).
    pub origin: Arc<Negotiated>,
    channels: Mutex<Channels>,
    next_tree_id: AtomicU32,
    /// When the session began (NetrSessionEnum's session time).
    pub started: std::time::Instant,
    /// Milliseconds from `started` to its last request (its idle time).
    last_request_ms: AtomicU64,
}

/// Session.ChannelList (MS-SMB2 3.3.1.8): the connections the session is
/// reachable on, the one that made it first. The session ends when the
/// last one goes (3.3.7.1) or when it is logged off on any of them.
#[derive(Default)]
struct Channels {
    conns: Vec<Weak<dyn Channel>>,
    /// Ended (logged off, replaced, or its last channel lost): no channel
    /// may be bound to it any more.
    ended: bool,
}

impl Session {
    pub fn new<C: Channel + 'static>(
        id: u64,
        exchange: AuthExchange,
        preauth: [u8; 64],
        origin: Arc<Negotiated>,
        conn: &Arc<C>,
    ) -> Session {
        let first: Weak<C> = Arc::downgrade(conn);
        Session {
            id,
            state: Mutex::new(SessionState::InProgress {
                exchange: Box::new(exchange),
                preauth,
            }),
            trees: Mutex::new(HashMap::new()),
            opens: Mutex::new(HashMap::new()),
            pipes: Mutex::new(HashMap::new()),
            reauth: Mutex::new(None),
            origin,
            channels: Mutex::new(Channels {
                conns: vec![first as Weak<dyn Channel>],
                ended: false,
            }),
            next_tree_id: AtomicU32::new(1),
            started: std::time::Instant::now(),
            last_request_ms: AtomicU64::new(0),
        }
    }

    /// Notes a request of the session, for its idle time.
    pub fn touch(&self) {
        let ms = self.started.elapsed().as_millis();
        self.last_request_ms
            .store(u64::try_from(ms).unwrap_or(u64::MAX), Ordering::Relaxed);
    }

    /// How long since the session's last request.
    pub fn idle(&self) -> std::time::Duration {
        let last = std::time::Duration::from_millis(self.last_request_ms.load(Ordering::Relaxed));
        self.started.elapsed().saturating_sub(last)
    }

    /// The connections of the session's channels that still exist, first
    /// channel first.
    pub fn connections(&self) -> Vec<Arc<dyn Channel>> {
        lock(&self.channels)
            .conns
            .iter()
            .filter_map(Weak::upgrade)
            .collect()
    }

    pub fn channel_count(&self) -> usize {
        lock(&self.channels).conns.len()
    }

    /// Adds `conn` as a channel (a completed binding); false if the session
    /// ended meanwhile or already has `max` channels.
    pub fn add_channel<C: Channel + 'static>(&self, conn: &Arc<C>, max: usize) -> bool {
        let mut ch = lock(&self.channels);
        if ch.ended || ch.conns.len() >= max {
            return false;
        }
        let conn: Weak<C> = Arc::downgrade(conn);
        ch.conns.push(conn as Weak<dyn Channel>);
        true
    }

    /// Removes the channel of `conn` (its connection is gone): true if it
    /// was the last one, and the session now ends (MS-SMB2 3.3.7.1).
    pub fn leave(&self, conn: &dyn Channel) -> bool {
        let mut ch = lock(&self.channels);
        ch.conns
            .retain(|w| !same_channel(w.as_ptr(), conn) && w.strong_count() > 0);
        if ch.conns.is_empty() && !ch.ended {
            ch.ended = true;
            return true;
        }
        false
    }

    /// Ends the session on every channel: the connections it was on, or
    /// None if it had already ended.
    pub fn end_channels(&self) -> Option<Vec<Arc<dyn Channel>>> {
        let mut ch = lock(&self.channels);
        if ch.ended {
            return None;
        }
        ch.ended = true;
        Some(ch.conns.drain(..).filter_map(|w| w.upgrade()).collect())
    }

    pub fn has_ended(&self) -> bool {
        lock(&self.channels).ended
    }

    /// Session.SigningKey, once logged on (not for guests).
    pub fn signing_key(&self) -> Option<SigningKey> {
        match &*lock(&self.state) {
            SessionState::Valid(a) => a.signer.clone(),
            SessionState::InProgress { .. } => None,
        }
    }

    pub fn next_tree_id(&self) -> u32 {
        self.next_tree_id.fetch_add(1, Ordering::Relaxed)
    }

    /// The SIDs of a logged-on session (None while it logs on).
    pub fn token(&self) -> Option<Arc<crate::acl::Token>> {
        match &*lock(&self.state) {
            SessionState::Valid(a) => Some(a.token.clone()),
            _ => None,
        }
    }

    pub fn is_valid(&self) -> bool {
        matches!(*lock(&self.state), SessionState::Valid(_))
    }

    pub fn open(&self, volatile: u64) -> Option<Arc<Open>> {
        lock(&self.opens).get(&volatile).cloned()
    }

    /// Puts a whole open (caching granted, breaks routed) in the session
    /// under its volatile id; false if the session ended meanwhile (its
    /// opens already let go) or the id is taken. The caller then does
    /// with the open what the session's end would have done.
    pub fn add_open(&self, open: &Arc<Open>) -> bool {
        let mut opens = lock(&self.opens);
        // A share a reload took away (`crate::reload`) marks itself before
        // it sweeps the sessions' opens under this lock: an open either
        // is in the sweep or is refused here.
        if self.has_ended() || open.share.is_removed() || opens.contains_key(&open.volatile_id()) {
            return false;
        }
        opens.insert(open.volatile_id(), open.clone());
        true
    }

    /// Puts `new` in the place of `old` (same volatile id), if `old` is
    /// still there.
    pub fn replace_open(&self, old: &Arc<Open>, new: Arc<Open>) -> bool {
        let mut opens = lock(&self.opens);
        match opens.get_mut(&old.volatile_id()) {
            Some(o) if Arc::ptr_eq(o, old) => {
                *o = new;
                true
            }
            _ => false,
        }
    }

    /// Takes `open` out of the session, if it is still there.
    pub fn take_open(&self, open: &Arc<Open>) -> Option<Arc<Open>> {
        let mut opens = lock(&self.opens);
        match opens.get(&open.volatile_id()) {
            Some(o) if Arc::ptr_eq(o, open) => opens.remove(&open.volatile_id()),
            _ => None,
        }
    }
}

/// The channels a break may go on when its open's own connection is gone.
impl crate::oplocks::SessionChannels for Session {
    fn channels(&self) -> Vec<Arc<dyn crate::pending::ResponseChannel>> {
        self.connections()
            .into_iter()
            .map(|c| c as Arc<dyn crate::pending::ResponseChannel>)
            .collect()
    }
}
