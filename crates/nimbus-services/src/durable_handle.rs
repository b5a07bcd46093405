//! What an open granted durability carries (MS-SMB2 Open.IsDurable,
//! Open.DurableOwner, Open.DurableOpenTimeout, Open.CreateGuid), below
//! the open and the durable-handle service (`nimbus_node::durable`) alike.

use std::time::Duration;

/// Who opened a durable handle (MS-SMB2 Open.DurableOwner, "the security
/// context of the user"): only the same user may reclaim it. The user is
/// its SID, the token's user, never a name: names are typed by clients and
/// fold differently (a guest keeps whatever name it sent), while a SID is
/// what the server itself gave the logon. Guest and anonymous sessions
/// have no owner at all, so their opens are never made durable.
#[derive(Clone, Debug)]
pub struct Owner {
    /// The user's SID in its string form (`S-1-5-21-...`).
    pub sid: String,
    /// The user name it logged on with, for logs and listings only: never
    /// compared.
    pub name: String,
}

impl PartialEq for Owner {
    fn eq(&self, other: &Owner) -> bool {
        self.sid == other.sid
    }
}

impl Eq for Owner {}

impl std::hash::Hash for Owner {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.sid.hash(state);
    }
}

/// The durability an open was granted.
#[derive(Clone, Debug)]
pub struct Durable {
    /// How long the open is kept after its connection is lost.
    pub timeout: Duration,
    pub persistent: bool,
    /// Its record is in the state store (`nimbus_node::persist`): every
    /// persistent open, and on a cluster node a durable open that a leaving
    /// node handed back (`nimbus_node::failover`). Its changes follow it there,
    /// and its close removes it.
    pub in_store: bool,
    pub owner: Owner,
    /// Opens with a record: the CREATE's response has been written (a
    /// record of one never answered is dropped at start).
    pub answered: bool,
    /// Opens with a record: closed, the record removed; a save racing the
    /// close (a break acknowledged by another client) writes nothing.
    pub forgotten: bool,
}

/// (ClientGuid, CreateGuid) of a CREATE with a DH2Q context: a CreateGuid
/// is unique per client (MS-SMB2 3.3.5.9.10).
pub type GuidKey = ([u8; 16], [u8; 16]);
