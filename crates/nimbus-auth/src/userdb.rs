//! The local user database: user name -> NT hash (MD4 of the UTF-16LE
//! password, MS-NLMP 3.3.1 NTOWFv1). Passwords themselves are never stored.
//!
//! It is also the server's account database (the SAM of a Windows
//! server): the server's machine SID, and each user's relative id (RID),
//! which together make the SID that names the user in security
//! descriptors. Those must never change once descriptors use them.
//!
//! File format (text, UTF-8):
//! ```text
//! # nimbus user database v2
//! machine-sid S-1-5-21-3623811015-3361044348-30300820
//! alice:8846f7eaee8fb117ad06bdd830b7586c:1000
//! [groups]
//! staff:1001:alice,bob
//! ```
//! After the `[groups]` line, each line is a group of the server: its name,
//! its RID (from the same numbers as the users') and its members.
//! Lines after the header may also be empty or start with `#`. Version 1
//! files (no machine SID, `name:hash` lines) still load: a user without a
//! RID gets the next free one in name order, and a database without a
//! machine SID uses one derived from its path (see [`UserDb::machine_sid`]);
//! the next `nimbus user add` writes both down.
//!
//! The file holds password equivalents (an NT hash is all NTLM needs to log
//! on), so it must be private to its owner: a file that group or others may
//! read or write is refused ([`UserDbError::Permissions`]).

use std::collections::HashMap;
use std::fmt;
use std::fs;
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, RwLock};
use std::time::{Duration, Instant};

use nimbus_crypto::CryptoProvider;
use zeroize::{Zeroize, ZeroizeOnDrop};

const HEADER: &str = "# nimbus user database v2";
const HEADER_V1: &str = "# nimbus user database v1";
const MACHINE_SID_KEY: &str = "machine-sid ";
/// The line after which groups follow.
const GROUPS_SECTION: &str = "[groups]";
/// The first RID of an ordinary account (Windows reserves those below).
pub const FIRST_USER_RID: u32 = 1000;
/// Longest user name accepted (Windows allows 20 for SAM accounts, UPNs up
/// to 256 characters: take the larger).
const MAX_NAME_CHARS: usize = 256;

/// An NT hash (NTOWFv1), wiped from memory on drop.
#[derive(Clone, Zeroize, ZeroizeOnDrop)]
pub struct NtHash([u8; 16]);

/// Constant-time, so comparing hashes leaks nothing about them.
impl PartialEq for NtHash {
    fn eq(&self, other: &Self) -> bool {
        nimbus_crypto::ct_eq(&self.0, &other.0)
    }
}

impl Eq for NtHash {}

impl NtHash {
    /// Wraps raw hash bytes.
    pub fn from_bytes(bytes: [u8; 16]) -> Self {
        NtHash(bytes)
    }

    /// The raw hash bytes (the key of NTOWFv2).
    pub fn as_bytes(&self) -> &[u8; 16] {
        &self.0
    }
}

impl fmt::Debug for NtHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("NtHash(<redacted>)")
    }
}

/// Why the user database could not be read, written or changed.
#[derive(Debug)]
pub enum UserDbError {
    /// Reading or writing the file failed.
    Io {
        /// The database file.
        path: PathBuf,
        /// The underlying error.
        source: io::Error,
    },
    /// A line of the file is not valid.
    Parse {
        /// The database file.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// What is wrong with it.
        reason: String,
    },
    /// The crypto provider offers no MD4 (FIPS mode), so NT hashes cannot be
    /// computed.
    NtlmUnavailable,
    /// A user name given to [`UserDb::add`] is not acceptable.
    InvalidName {
        /// The rejected name.
        name: String,
        /// Why.
        reason: &'static str,
    },
    /// A group names a member that is not a user of the database.
    UnknownMember {
        /// The group.
        group: String,
        /// The name that is no user.
        member: String,
    },
    /// The file may be read or written by group or others.
    Permissions {
        /// The database file.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
}

impl fmt::Display for UserDbError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            UserDbError::Io { path, source } => write!(
                f,
                "user database {}: {source} (check that the path exists and is readable and \
                 writable by the server; `nimbus user add` creates it)",
                path.display()
            ),
            UserDbError::Parse { path, line, reason } => write!(
                f,
                "user database {}, line {line}: {reason} (each line must be \
                 `name:<32 hex digits of the NT hash>:<RID>` after the header `{HEADER}`; fix or delete \
                 the line, then re-add the user with `nimbus user add`)",
                path.display()
            ),
            UserDbError::NtlmUnavailable => f.write_str(
                "NT hashes need MD4, which the FIPS crypto provider does not offer \
                 (turn FIPS mode off to use local NTLM users)",
            ),
            UserDbError::InvalidName { name, reason } => {
                write!(f, "invalid user name {name:?}: {reason}")
            }
            UserDbError::UnknownMember { group, member } => write!(
                f,
                "group {group:?}: {member:?} is not a user of the database (add it with `nimbus \
                 user add {member}` first)"
            ),
            UserDbError::Permissions { path, mode } => write!(
                f,
                "user database {}: mode {mode:04o} lets group or others read or write it, and it \
                 holds NT hashes, which log on as the user without the password (fix: `chmod 600 \
                 {}`)",
                path.display(),
                path.display()
            ),
        }
    }
}

impl std::error::Error for UserDbError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            UserDbError::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}

struct Entry {
    /// The name as given when the user was added.
    name: String,
    hash: NtHash,
    /// The relative id: the last sub-authority of the user's SID.
    rid: u32,
}

/// A group of the server's users.
#[derive(Clone, Debug)]
struct Group {
    name: String,
    rid: u32,
    /// Members as stored (users' names).
    members: Vec<String>,
}

/// The three sub-authorities after S-1-5-21 that identify this server's
/// accounts (MS-DTYP 2.4.2.4: a machine's local accounts live under
/// S-1-5-21-X-Y-Z).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MachineSid(pub [u32; 3]);

impl fmt::Display for MachineSid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let [a, b, c] = self.0;
        write!(f, "S-1-5-21-{a}-{b}-{c}")
    }
}

impl MachineSid {
    /// Parses `S-1-5-21-X-Y-Z`.
    pub fn parse(text: &str) -> Option<MachineSid> {
        let rest = text.trim().strip_prefix("S-1-5-21-")?;
        let mut parts = rest.split('-').map(|p| p.parse::<u32>().ok());
        let sid = MachineSid([parts.next()??, parts.next()??, parts.next()??]);
        parts.next().is_none().then_some(sid)
    }

    /// A new random machine SID (as Windows makes one at installation).
    fn random(provider: &CryptoProvider) -> MachineSid {
        let mut bytes = [0u8; 12];
        provider.fill_random(&mut bytes);
        MachineSid(std::array::from_fn(|i| {
            u32::from_le_bytes(bytes[4 * i..4 * i + 4].try_into().unwrap_or_default())
        }))
    }

    /// The machine SID of a database that has none written down: derived
    /// from where the database is, so that the server and the next `nimbus
    /// user add` agree on it without either writing anything.
    fn of_path(provider: &CryptoProvider, path: &Path) -> MachineSid {
        let path = fs::canonicalize(path).unwrap_or_else(|_| path.to_owned());
        let digest =
            provider.sha512(&[b"nimbus machine SID\0", path.as_os_str().as_encoded_bytes()]);
        MachineSid(std::array::from_fn(|i| {
            u32::from_le_bytes(digest[4 * i..4 * i + 4].try_into().unwrap_or_default())
        }))
    }
}

/// User name -> NT hash. Lookup is case-insensitive (like Windows account
/// names); names are stored and listed as given.
#[derive(Default)]
pub struct UserDb {
    users: HashMap<String, Entry>,
    /// Groups by folded name.
    groups: HashMap<String, Group>,
    /// As written in the file; None for a version 1 file or a new database.
    machine_sid: Option<MachineSid>,
    /// The file this was loaded from, and its identity then (for reloads).
    source: Option<(PathBuf, FileStamp)>,
}

impl fmt::Debug for UserDb {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UserDb")
            .field("names", &self.names())
            .finish()
    }
}

/// The lookup key of a name: full Unicode upper case, so every spelling
/// that reaches one account ("sam", "SAM", "ſam" with U+017F) has one key.
fn fold(name: &str) -> String {
    name.to_uppercase()
}

/// Why `name` cannot be a user name, if it cannot: the file format must be
/// able to hold it and give it back unchanged.
fn check_name(name: &str) -> Result<(), &'static str> {
    if name.is_empty() {
        return Err("the name is empty");
    }
    if name.starts_with('#') {
        return Err("the name starts with '#', which marks a comment line in the file");
    }
    if name.contains(':') {
        return Err("the name contains ':', which separates name and hash in the file");
    }
    if name.chars().any(char::is_control) {
        return Err("the name contains a control character");
    }
    if name.chars().count() > MAX_NAME_CHARS {
        return Err("the name is longer than 256 characters");
    }
    Ok(())
}

/// A RID field of the file (a user's or a group's): a number of at least
/// FIRST_USER_RID that no account before it has.
fn new_rid(field: &str, seen: &mut std::collections::HashSet<u32>) -> Result<u32, String> {
    let rid = field
        .trim()
        .parse::<u32>()
        .ok()
        .filter(|r| *r >= FIRST_USER_RID)
        .ok_or_else(|| format!("the RID {field:?} is not a number of at least {FIRST_USER_RID}"))?;
    if !seen.insert(rid) {
        return Err(format!("the RID {rid} appears twice"));
    }
    Ok(rid)
}

/// Why `name` cannot be a group name: a user name that the group line can
/// hold (no ',' between members).
fn check_group_name(name: &str) -> Result<(), &'static str> {
    check_name(name)?;
    if name.contains(',') {
        return Err("the name contains ',', which separates the members of a group in the file");
    }
    if name == GROUPS_SECTION {
        return Err("the name is the line that starts the groups in the file");
    }
    Ok(())
}

impl UserDb {
    /// An empty database.
    pub fn new() -> Self {
        Self::default()
    }

    /// The key under which the database finds `name`: two spellings reach
    /// the same account exactly when their keys are equal. Anything that
    /// counts per user (the failed-logon back-off) must count by this key,
    /// for unknown names too, or each respelling gets a budget of its own.
    pub fn canonical_key(name: &str) -> String {
        fold(name)
    }

    /// Whether `name` can be stored (the file format can hold it).
    pub fn validate_name(name: &str) -> Result<(), UserDbError> {
        check_name(name).map_err(|reason| UserDbError::InvalidName {
            name: name.to_owned(),
            reason,
        })
    }

    /// Reads the database at `path`; a missing file is an error, and so is a
    /// file that group or others may read or write.
    pub fn load(path: &Path) -> Result<UserDb, UserDbError> {
        let file = fs::File::open(path).map_err(|source| UserDbError::Io {
            path: path.to_owned(),
            source,
        })?;
        Self::read_private(path, file)
    }

    /// As [`UserDb::load`], but a missing file gives an empty database.
    pub fn load_or_empty(path: &Path) -> Result<UserDb, UserDbError> {
        match fs::File::open(path) {
            Ok(file) => Self::read_private(path, file),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(UserDb::new()),
            Err(source) => Err(UserDbError::Io {
                path: path.to_owned(),
                source,
            }),
        }
    }

    /// Checks the mode of the open file (so what is checked is what is read)
    /// and parses it.
    fn read_private(path: &Path, mut file: fs::File) -> Result<UserDb, UserDbError> {
        let io_err = |source| UserDbError::Io {
            path: path.to_owned(),
            source,
        };
        let meta = file.metadata().map_err(io_err)?;
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = meta.permissions().mode() & 0o7777;
            if mode & 0o077 != 0 {
                return Err(UserDbError::Permissions {
                    path: path.to_owned(),
                    mode,
                });
            }
        }
        let mut text = zeroize::Zeroizing::new(String::new());
        file.read_to_string(&mut text).map_err(io_err)?;
        let mut db = Self::parse(path, &text)?;
        db.source = Some((path.to_owned(), FileStamp::of(&meta)));
        Ok(db)
    }

    fn parse(path: &Path, text: &str) -> Result<UserDb, UserDbError> {
        let err = |line: usize, reason: String| UserDbError::Parse {
            path: path.to_owned(),
            line,
            reason,
        };
        let mut lines = text.lines().enumerate();
        match lines.next() {
            Some((_, first)) if [HEADER, HEADER_V1].contains(&first.trim_end()) => {}
            _ => return Err(err(1, format!("the first line must be `{HEADER}`"))),
        }
        let mut db = UserDb::new();
        let mut rids = std::collections::HashSet::new();
        let mut in_groups = false;
        let mut group_lines = Vec::new();
        for (i, raw) in lines {
            let line_no = i + 1;
            let line = raw.trim_end_matches('\r');
            if line.trim().is_empty() || line.starts_with('#') {
                continue;
            }
            if line == GROUPS_SECTION {
                in_groups = true;
                continue;
            }
            if in_groups {
                group_lines.push((line_no, line));
                continue;
            }
            // User lines always hold a ':'; this one never does.
            if let Some(sid) = line
                .strip_prefix(MACHINE_SID_KEY)
                .filter(|_| !line.contains(':'))
            {
                if db.machine_sid.is_some() {
                    return Err(err(line_no, "a second machine-sid line".into()));
                }
                db.machine_sid = Some(MachineSid::parse(sid).ok_or_else(|| {
                    err(
                        line_no,
                        format!("{sid:?} is not a machine SID of the form S-1-5-21-X-Y-Z"),
                    )
                })?);
                continue;
            }
            let (name, rest) = line
                .split_once(':')
                .ok_or_else(|| err(line_no, "no ':' between name and hash".into()))?;
            check_name(name).map_err(|r| err(line_no, r.into()))?;
            let (hex, rid) = match rest.split_once(':') {
                Some((hex, rid)) => {
                    let rid = new_rid(rid, &mut rids).map_err(|r| err(line_no, r))?;
                    (hex, rid)
                }
                None => (rest, 0),
            };
            let hash = parse_hex16(hex.trim())
                .ok_or_else(|| err(line_no, "the hash is not 32 hexadecimal digits".into()))?;
            let key = fold(name);
            if db.users.contains_key(&key) {
                return Err(err(line_no, format!("user {name:?} appears twice")));
            }
            db.users.insert(
                key,
                Entry {
                    name: name.to_owned(),
                    hash,
                    rid,
                },
            );
        }
        for (line_no, line) in group_lines {
            let mut fields = line.splitn(3, ':');
            let (Some(name), Some(rid), Some(members)) =
                (fields.next(), fields.next(), fields.next())
            else {
                return Err(err(
                    line_no,
                    "a group line is `name:RID:member,member,...`".into(),
                ));
            };
            check_group_name(name).map_err(|r| err(line_no, r.into()))?;
            let rid = new_rid(rid, &mut rids).map_err(|r| err(line_no, r))?;
            let key = fold(name);
            if db.users.contains_key(&key) || db.groups.contains_key(&key) {
                return Err(err(
                    line_no,
                    format!("{name:?} names a user or group already"),
                ));
            }
            let members = members
                .split(',')
                .map(str::trim)
                .filter(|m| !m.is_empty())
                .map(str::to_owned)
                .collect();
            db.groups.insert(
                key,
                Group {
                    name: name.to_owned(),
                    rid,
                    members,
                },
            );
        }
        // Users from a version 1 line: the next free RIDs, in name order,
        // so that every reader of the same file gives the same ones.
        let mut unnumbered: Vec<&mut Entry> =
            db.users.values_mut().filter(|e| e.rid == 0).collect();
        unnumbered.sort_by(|a, b| a.name.cmp(&b.name));
        let mut next = rids
            .iter()
            .max()
            .map_or(FIRST_USER_RID, |m| m.saturating_add(1));
        for e in unnumbered {
            e.rid = next;
            next = next.saturating_add(1);
        }
        Ok(db)
    }

    /// Writes the database atomically: a temporary file beside `path`,
    /// created with mode 0600, then renamed over `path`.
    pub fn save(&self, path: &Path) -> Result<(), UserDbError> {
        let io_err = |source| UserDbError::Io {
            path: path.to_owned(),
            source,
        };
        let mut text = String::with_capacity(64 + self.users.len() * 48);
        text.push_str(HEADER);
        text.push('\n');
        if let Some(sid) = self.machine_sid {
            text.push_str(&format!("{MACHINE_SID_KEY}{sid}\n"));
        }
        let mut entries: Vec<&Entry> = self.users.values().collect();
        entries.sort_by(|a, b| a.name.cmp(&b.name));
        for e in entries {
            text.push_str(&e.name);
            text.push(':');
            for b in e.hash.as_bytes() {
                text.push_str(&format!("{b:02x}"));
            }
            text.push_str(&format!(":{}\n", e.rid));
        }
        if !self.groups.is_empty() {
            text.push_str(GROUPS_SECTION);
            text.push('\n');
            let mut groups: Vec<&Group> = self.groups.values().collect();
            groups.sort_by(|a, b| a.name.cmp(&b.name));
            for g in groups {
                text.push_str(&format!("{}:{}:{}\n", g.name, g.rid, g.members.join(",")));
            }
        }
        let text = zeroize::Zeroizing::new(text);

        let file_name = path.file_name().ok_or_else(|| {
            io_err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "not a file path",
            ))
        })?;
        let mut tmp_name = std::ffi::OsString::from(".");
        tmp_name.push(file_name);
        tmp_name.push(format!(".tmp.{}", std::process::id()));
        let tmp = path.with_file_name(tmp_name);

        // A leftover from a crashed run of this same process id; create_new
        // below must not follow or reuse anything already there.
        let _ = fs::remove_file(&tmp);
        let mut opts = fs::OpenOptions::new();
        opts.write(true).create_new(true);
        #[cfg(unix)]
        {
            use std::os::unix::fs::OpenOptionsExt;
            // Mode at creation, so the file is never readable by others, not
            // even between create and chmod.
            opts.mode(0o600);
        }
        let result = (|| {
            let mut f = opts.open(&tmp)?;
            f.write_all(text.as_bytes())?;
            f.sync_all()?;
            drop(f);
            fs::rename(&tmp, path)?;
            // Persist the rename itself; best effort (not all file systems
            // allow fsync on a directory).
            if let Some(dir) = path.parent() {
                let dir = if dir.as_os_str().is_empty() {
                    Path::new(".")
                } else {
                    dir
                };
                if let Ok(d) = fs::File::open(dir) {
                    let _ = d.sync_all();
                }
            }
            Ok(())
        })();
        if result.is_err() {
            let _ = fs::remove_file(&tmp);
        }
        result.map_err(io_err)
    }

    /// Adds `name` with the NT hash of `password`, replacing any user of the
    /// same (case-insensitive) name.
    pub fn add(
        &mut self,
        name: &str,
        password: &str,
        provider: &CryptoProvider,
    ) -> Result<(), UserDbError> {
        Self::validate_name(name)?;
        let ntlm = provider.ntlm().ok_or(UserDbError::NtlmUnavailable)?;
        let utf16 = zeroize::Zeroizing::new(utf16le(password));
        let hash = NtHash(ntlm.md4(&utf16));
        // The SID a database gets when its first user is written down; one
        // read from a file keeps the one the server has been using.
        if self.machine_sid.is_none() {
            self.machine_sid = Some(match &self.source {
                Some((path, _)) => MachineSid::of_path(provider, path),
                None => MachineSid::random(provider),
            });
        }
        // A new password keeps the account (and so its SID); a new user
        // gets the next RID, never one a removed user had while a higher
        // one is in use.
        if self.groups.contains_key(&fold(name)) {
            return Err(UserDbError::InvalidName {
                name: name.to_owned(),
                reason: "a group has that name",
            });
        }
        let rid = match self.users.get(&fold(name)) {
            Some(e) => e.rid,
            None => self.next_rid(),
        };
        self.users.insert(
            fold(name),
            Entry {
                name: name.to_owned(),
                hash,
                rid,
            },
        );
        Ok(())
    }

    /// The server's machine SID: as written in the file, or for a database
    /// that has none yet, the one derived from its path (an in-memory
    /// database without a file: S-1-5-21-0-0-0).
    pub fn machine_sid(&self, provider: &CryptoProvider) -> MachineSid {
        match (self.machine_sid, &self.source) {
            (Some(sid), _) => sid,
            (None, Some((path, _))) => MachineSid::of_path(provider, path),
            (None, None) => MachineSid([0; 3]),
        }
    }

    /// The RID of `name` (case-insensitive).
    pub fn rid(&self, name: &str) -> Option<u32> {
        self.users.get(&fold(name)).map(|e| e.rid)
    }

    /// The stored name of the user with RID `rid`.
    pub fn name_of_rid(&self, rid: u32) -> Option<&str> {
        self.users
            .values()
            .find(|e| e.rid == rid)
            .map(|e| e.name.as_str())
    }

    /// Removes `name` (case-insensitive), and from its groups; true if it
    /// was there.
    pub fn remove(&mut self, name: &str) -> bool {
        let key = fold(name);
        for g in self.groups.values_mut() {
            g.members.retain(|m| fold(m) != key);
        }
        self.users.remove(&key).is_some()
    }

    /// The RID the next account gets: above every user's and group's.
    fn next_rid(&self) -> u32 {
        self.users
            .values()
            .map(|e| e.rid)
            .chain(self.groups.values().map(|g| g.rid))
            .max()
            .map_or(FIRST_USER_RID, |m| m.saturating_add(1))
    }

    /// Makes group `name` (or changes its members) with exactly `members`,
    /// each a user of the database.
    pub fn set_group(&mut self, name: &str, members: &[String]) -> Result<(), UserDbError> {
        check_group_name(name).map_err(|reason| UserDbError::InvalidName {
            name: name.to_owned(),
            reason,
        })?;
        let key = fold(name);
        if self.users.contains_key(&key) {
            return Err(UserDbError::InvalidName {
                name: name.to_owned(),
                reason: "a user has that name",
            });
        }
        let mut stored = Vec::new();
        for m in members {
            let user = self
                .users
                .get(&fold(m))
                .ok_or_else(|| UserDbError::UnknownMember {
                    group: name.to_owned(),
                    member: m.clone(),
                })?;
            if !stored.contains(&user.name) {
                stored.push(user.name.clone());
            }
        }
        // An existing group keeps its RID and the spelling it was made with.
        let (name, rid) = match self.groups.get(&key) {
            Some(g) => (g.name.clone(), g.rid),
            None => (name.to_owned(), self.next_rid()),
        };
        self.groups.insert(
            key,
            Group {
                name,
                rid,
                members: stored,
            },
        );
        Ok(())
    }

    /// Removes group `name`; true if it was there.
    pub fn remove_group(&mut self, name: &str) -> bool {
        self.groups.remove(&fold(name)).is_some()
    }

    /// Every group as (name, RID, members), sorted by name.
    pub fn groups(&self) -> Vec<(String, u32, Vec<String>)> {
        let mut v: Vec<_> = self
            .groups
            .values()
            .map(|g| (g.name.clone(), g.rid, g.members.clone()))
            .collect();
        v.sort();
        v
    }

    /// The RIDs of the groups `user` is a member of.
    pub fn group_rids_of(&self, user: &str) -> Vec<u32> {
        let key = fold(user);
        let mut v: Vec<u32> = self
            .groups
            .values()
            .filter(|g| g.members.iter().any(|m| fold(m) == key))
            .map(|g| g.rid)
            .collect();
        v.sort_unstable();
        v
    }

    /// The RID of group `name`.
    pub fn group_rid(&self, name: &str) -> Option<u32> {
        self.groups.get(&fold(name)).map(|g| g.rid)
    }

    /// The stored name of the group with RID `rid`.
    pub fn group_of_rid(&self, rid: u32) -> Option<&str> {
        self.groups
            .values()
            .find(|g| g.rid == rid)
            .map(|g| g.name.as_str())
    }

    /// All user names, as stored, sorted.
    pub fn names(&self) -> Vec<String> {
        let mut v: Vec<String> = self.users.values().map(|e| e.name.clone()).collect();
        v.sort();
        v
    }

    /// The NT hash of `name` (case-insensitive).
    pub fn nt_hash(&self, name: &str) -> Option<&NtHash> {
        self.users.get(&fold(name)).map(|e| &e.hash)
    }

    /// The stored spelling of `name` (case-insensitive lookup).
    pub(crate) fn canonical_name(&self, name: &str) -> Option<&str> {
        self.users.get(&fold(name)).map(|e| e.name.as_str())
    }
}

/// One version of the database file. `save` renames a new file over the
/// old one (a new inode), an edit in place changes the size or mtime, a
/// chmod changes the ctime: any of these is a change to look at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct FileStamp {
    dev: u64,
    ino: u64,
    size: u64,
    mtime_ns: i128,
    ctime_ns: i128,
}

impl FileStamp {
    fn of(meta: &fs::Metadata) -> FileStamp {
        #[cfg(unix)]
        {
            use std::os::unix::fs::MetadataExt;
            let ns = |s: i64, n: i64| i128::from(s) * 1_000_000_000 + i128::from(n);
            FileStamp {
                dev: meta.dev(),
                ino: meta.ino(),
                size: meta.size(),
                mtime_ns: ns(meta.mtime(), meta.mtime_nsec()),
                ctime_ns: ns(meta.ctime(), meta.ctime_nsec()),
            }
        }
        #[cfg(not(unix))]
        {
            let mtime_ns = meta
                .modified()
                .ok()
                .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                .map_or(0, |d| d.as_nanos() as i128);
            FileStamp {
                dev: 0,
                ino: 0,
                size: meta.len(),
                mtime_ns,
                ctime_ns: 0,
            }
        }
    }
}

/// How often, at most, a logon looks at the database file for changes.
pub(crate) const RELOAD_CHECK_INTERVAL: Duration = Duration::from_secs(1);

/// What one look at the database file found.
#[derive(Debug)]
pub(crate) enum Reload {
    /// Not time to look yet, another logon is looking, or nothing changed.
    Unchanged,
    /// The file changed and now holds this many users, which are in use.
    Reloaded { users: usize },
    /// The file changed (or went away) and cannot be used; the users loaded
    /// before stay in use. Reported once per version of the file.
    Failed(UserDbError),
}

/// Keeps a [`UserDb`] current with the file it was loaded from, so that
/// `nimbus user add/del` take effect without a restart. Logons call
/// [`Reloader::check`]: at most once per [`RELOAD_CHECK_INTERVAL`] it costs
/// one stat() of the file; only a changed file is read again (with the same
/// checks as at start, permissions included). Time is passed in.
pub(crate) struct Reloader {
    path: PathBuf,
    state: Mutex<ReloadState>,
}

struct ReloadState {
    next_check: Option<Instant>,
    /// The version last looked at (loaded or refused); None while the file
    /// is missing.
    seen: Option<FileStamp>,
}

impl Reloader {
    /// A reloader for `db`, if it was loaded from a file.
    pub(crate) fn for_db(db: &UserDb) -> Option<Reloader> {
        let (path, stamp) = db.source.as_ref()?;
        Some(Reloader {
            path: path.clone(),
            state: Mutex::new(ReloadState {
                next_check: None,
                seen: Some(*stamp),
            }),
        })
    }

    /// The database file.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Looks at the file if it is time to, and swaps a changed, valid
    /// database into `users`.
    pub(crate) fn check(&self, users: &RwLock<UserDb>, now: Instant) -> Reload {
        let mut st = match self.state.try_lock() {
            Ok(g) => g,
            Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
            // Another logon is looking right now.
            Err(std::sync::TryLockError::WouldBlock) => return Reload::Unchanged,
        };
        if st.next_check.is_some_and(|t| now < t) {
            return Reload::Unchanged;
        }
        st.next_check = Some(now + RELOAD_CHECK_INTERVAL);
        let stamp = match fs::metadata(&self.path) {
            Ok(m) => FileStamp::of(&m),
            Err(source) => {
                if st.seen.take().is_none() {
                    return Reload::Unchanged; // already reported
                }
                return Reload::Failed(UserDbError::Io {
                    path: self.path.clone(),
                    source,
                });
            }
        };
        if st.seen == Some(stamp) {
            return Reload::Unchanged;
        }
        st.seen = Some(stamp);
        match UserDb::load(&self.path) {
            Ok(db) => {
                if let Some((_, loaded)) = &db.source {
                    st.seen = Some(*loaded);
                }
                let n = db.users.len();
                *users.write().unwrap_or_else(|p| p.into_inner()) = db;
                Reload::Reloaded { users: n }
            }
            Err(e) => Reload::Failed(e),
        }
    }
}

/// UTF-16LE encoding (MS-NLMP strings are UTF-16LE when UNICODE is negotiated).
pub(crate) fn utf16le(s: &str) -> Vec<u8> {
    s.encode_utf16().flat_map(u16::to_le_bytes).collect()
}

fn parse_hex16(s: &str) -> Option<NtHash> {
    let bytes = s.as_bytes();
    if bytes.len() != 32 {
        return None;
    }
    let mut out = [0u8; 16];
    for (o, pair) in out.iter_mut().zip(bytes.chunks_exact(2)) {
        let hi = (pair[0] as char).to_digit(16)?;
        let lo = (pair[1] as char).to_digit(16)?;
        *o = (hi * 16 + lo) as u8;
    }
    Some(NtHash(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmpdir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("nimbus-userdb-{tag}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn add_stores_nt_hash_and_lookup_is_case_insensitive() {
        let p = CryptoProvider::default_provider();
        let mut db = UserDb::new();
        db.add("User", "Password", &p).unwrap();
        // MS-NLMP 4.2.2.1.2 NTOWFv1("Password").
        assert_eq!(
            hex::encode(db.nt_hash("uSeR").unwrap().as_bytes()),
            "a4f49c406510bdcab6824ee7c30fd852"
        );
        db.add("USER", "other", &p).unwrap();
        assert_eq!(db.names(), vec!["USER".to_string()]);
        assert!(db.remove("user"));
        assert!(!db.remove("user"));
        assert!(db.nt_hash("user").is_none());
    }

    #[test]
    fn rejects_bad_names() {
        let p = CryptoProvider::default_provider();
        let mut db = UserDb::new();
        for bad in [
            "",
            "a:b",
            "a\nb",
            "tab\there",
            "nul\0",
            "#x",
            "# nimbus user database v1",
        ] {
            assert!(
                matches!(db.add(bad, "x", &p), Err(UserDbError::InvalidName { .. })),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn every_accepted_name_survives_save_and_load() {
        let p = CryptoProvider::default_provider();
        let dir = tmpdir("names");
        let path = dir.join("users.db");
        let mut db = UserDb::new();
        let names = ["x#", " #lead-space", "trail ", "ſam", "a=b", "é"];
        for n in names {
            db.add(n, "pw", &p).unwrap();
        }
        db.save(&path).unwrap();
        let mut want: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        want.sort();
        assert_eq!(UserDb::load(&path).unwrap().names(), want);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn canonical_key_joins_the_spellings_of_one_account() {
        let p = CryptoProvider::default_provider();
        let mut db = UserDb::new();
        db.add("sam", "pw", &p).unwrap();
        // U+017F LATIN SMALL LETTER LONG S upper-cases to 'S'; U+0131
        // dotless i to 'I'. Both reach the account "sam" / "alice".
        assert!(db.nt_hash("ſam").is_some());
        assert_eq!(UserDb::canonical_key("ſam"), UserDb::canonical_key("SAM"));
        assert_eq!(
            UserDb::canonical_key("alıce"),
            UserDb::canonical_key("Alice")
        );
        assert_ne!(UserDb::canonical_key("sam"), UserDb::canonical_key("bob"));
    }

    #[cfg(unix)]
    #[test]
    fn file_others_can_read_or_write_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let p = CryptoProvider::default_provider();
        let dir = tmpdir("mode");
        let path = dir.join("users.db");
        let mut db = UserDb::new();
        db.add("alice", "pw", &p).unwrap();
        db.save(&path).unwrap();
        for mode in [0o640, 0o604, 0o620, 0o602, 0o660, 0o644] {
            fs::set_permissions(&path, fs::Permissions::from_mode(mode)).unwrap();
            for r in [UserDb::load(&path), UserDb::load_or_empty(&path)] {
                match r {
                    Err(e @ UserDbError::Permissions { .. }) => {
                        let msg = e.to_string();
                        assert!(msg.contains(&format!("{mode:04o}")), "{msg}");
                        assert!(
                            msg.contains(&format!("chmod 600 {}", path.display())),
                            "{msg}"
                        );
                    }
                    other => panic!("mode {mode:o}: {other:?}"),
                }
            }
        }
        for mode in [0o600, 0o400] {
            fs::set_permissions(&path, fs::Permissions::from_mode(mode)).unwrap();
            assert_eq!(
                UserDb::load(&path).unwrap().names(),
                vec!["alice".to_string()]
            );
        }
        fs::remove_dir_all(&dir).unwrap();
    }

    #[cfg(unix)]
    #[test]
    fn reloader_swaps_in_changes_and_keeps_the_old_users_on_errors() {
        use std::os::unix::fs::PermissionsExt;
        let p = CryptoProvider::default_provider();
        let dir = tmpdir("reload");
        let path = dir.join("users.db");
        let mut db = UserDb::new();
        db.add("alice", "pw", &p).unwrap();
        db.save(&path).unwrap();
        let users = RwLock::new(UserDb::load(&path).unwrap());
        let r = Reloader::for_db(&users.read().unwrap()).unwrap();
        let names = || users.read().unwrap().names();
        let t0 = Instant::now();
        let step = RELOAD_CHECK_INTERVAL;
        assert!(matches!(r.check(&users, t0), Reload::Unchanged));

        db.add("bob", "pw", &p).unwrap();
        db.save(&path).unwrap();
        // Within the interval nothing is looked at.
        assert!(matches!(r.check(&users, t0), Reload::Unchanged));
        assert!(matches!(
            r.check(&users, t0 + step),
            Reload::Reloaded { users: 2 }
        ));
        assert_eq!(names(), vec!["alice".to_string(), "bob".to_string()]);

        // Bad permissions: refused once, the users stay.
        fs::set_permissions(&path, fs::Permissions::from_mode(0o644)).unwrap();
        match r.check(&users, t0 + step * 2) {
            Reload::Failed(e @ UserDbError::Permissions { .. }) => {
                assert!(e.to_string().contains("chmod 600"))
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(r.check(&users, t0 + step * 3), Reload::Unchanged));
        assert_eq!(names().len(), 2);
        // Fixed: loaded again.
        fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).unwrap();
        assert!(matches!(
            r.check(&users, t0 + step * 4),
            Reload::Reloaded { users: 2 }
        ));

        // A broken file and a missing one: reported, the users stay.
        fs::write(&path, "garbage\n").unwrap();
        assert!(matches!(
            r.check(&users, t0 + step * 5),
            Reload::Failed(UserDbError::Parse { .. })
        ));
        fs::remove_file(&path).unwrap();
        assert!(matches!(
            r.check(&users, t0 + step * 6),
            Reload::Failed(UserDbError::Io { .. })
        ));
        assert!(matches!(r.check(&users, t0 + step * 7), Reload::Unchanged));
        assert_eq!(names().len(), 2);
        // `nimbus user del bob` writes a new file.
        db.remove("bob");
        db.save(&path).unwrap();
        assert!(matches!(
            r.check(&users, t0 + step * 8),
            Reload::Reloaded { users: 1 }
        ));
        assert_eq!(names(), vec!["alice".to_string()]);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn save_load_round_trip_with_private_mode() {
        let p = CryptoProvider::default_provider();
        let dir = tmpdir("rt");
        let path = dir.join("users.db");
        let mut db = UserDb::new();
        db.add("bob", "b", &p).unwrap();
        db.add("Alice", "a", &p).unwrap();
        db.save(&path).unwrap();
        let text = fs::read_to_string(&path).unwrap();
        assert!(text.starts_with("# nimbus user database v2\nmachine-sid S-1-5-21-"));
        assert!(!text.contains(":a\n"));
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = fs::metadata(&path).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o600);
        }
        let back = UserDb::load(&path).unwrap();
        assert_eq!(back.names(), vec!["Alice".to_string(), "bob".to_string()]);
        assert_eq!(back.nt_hash("ALICE"), db.nt_hash("alice"));
        // Saving again replaces the file and leaves no temporary behind.
        back.save(&path).unwrap();
        assert_eq!(fs::read_dir(&dir).unwrap().count(), 1);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn missing_file() {
        let dir = tmpdir("missing");
        let path = dir.join("nope.db");
        assert!(matches!(UserDb::load(&path), Err(UserDbError::Io { .. })));
        assert!(UserDb::load_or_empty(&path).unwrap().names().is_empty());
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn rids_and_machine_sid() {
        let p = CryptoProvider::default_provider();
        let path = Path::new("/etc/nimbus/users.db");
        // Version 1: RIDs in name order, no machine SID written.
        let v1 = "# nimbus user database v1\nzed:a4f49c406510bdcab6824ee7c30fd852\n\
                  amy:a4f49c406510bdcab6824ee7c30fd852\n";
        let db = UserDb::parse(path, v1).unwrap();
        assert_eq!((db.rid("amy"), db.rid("ZED")), (Some(1000), Some(1001)));
        assert_eq!(db.name_of_rid(1001), Some("zed"));
        assert!(db.machine_sid.is_none());
        // Version 2: RIDs as written; unnumbered lines come after them.
        let v2 = "# nimbus user database v2\nmachine-sid S-1-5-21-1-2-3\n\
                  bob:a4f49c406510bdcab6824ee7c30fd852:1007\n\
                  al:a4f49c406510bdcab6824ee7c30fd852\n";
        let mut db = UserDb::parse(path, v2).unwrap();
        assert_eq!(db.machine_sid(&p), MachineSid([1, 2, 3]));
        assert_eq!((db.rid("bob"), db.rid("al")), (Some(1007), Some(1008)));
        // A new user gets the next RID; a new password keeps the old one.
        db.add("cy", "c", &p).unwrap();
        db.add("bob", "new", &p).unwrap();
        assert_eq!((db.rid("cy"), db.rid("bob")), (Some(1009), Some(1007)));
        assert_eq!(db.machine_sid(&p), MachineSid([1, 2, 3]));
        // A new database gets a random machine SID, kept on save.
        let dir = tmpdir("sid");
        let file = dir.join("users.db");
        let mut fresh = UserDb::new();
        fresh.add("x", "y", &p).unwrap();
        let sid = fresh.machine_sid(&p);
        assert_ne!(sid, MachineSid([0; 3]));
        fresh.save(&file).unwrap();
        assert_eq!(UserDb::load(&file).unwrap().machine_sid(&p), sid);
        assert_eq!(MachineSid::parse(&sid.to_string()), Some(sid));
        // A version 1 file's derived SID is the one its next save writes.
        fs::write(&file, v1).unwrap();
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            fs::set_permissions(&file, fs::Permissions::from_mode(0o600)).unwrap();
        }
        let mut old = UserDb::load(&file).unwrap();
        let derived = old.machine_sid(&p);
        old.add("new", "n", &p).unwrap();
        old.save(&file).unwrap();
        let reread = UserDb::load(&file).unwrap();
        assert_eq!(reread.machine_sid(&p), derived);
        assert_eq!(reread.rid("amy"), Some(1000));
        assert_eq!(reread.rid("new"), Some(1002));
        fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn groups_share_the_rids_and_survive_save_and_load() {
        let p = CryptoProvider::default_provider();
        let mut db = UserDb::new();
        db.add("alice", "a", &p).unwrap();
        db.add("bob", "b", &p).unwrap();
        db.set_group("Staff", &["ALICE".to_string(), "bob".to_string()])
            .unwrap();
        assert_eq!(db.group_rid("staff"), Some(1002));
        db.add("cy", "c", &p).unwrap();
        assert_eq!(db.rid("cy"), Some(1003));
        assert_eq!(db.group_rids_of("Alice"), vec![1002]);
        assert!(db.group_rids_of("cy").is_empty());
        // Names are one namespace; members must be users.
        assert!(db.set_group("alice", &[]).is_err());
        assert!(db.add("staff", "s", &p).is_err());
        assert!(matches!(
            db.set_group("x", &["nobody".to_string()]),
            Err(UserDbError::UnknownMember { .. })
        ));
        assert!(db.set_group("a,b", &[]).is_err());
        // New members keep the group's RID.
        db.set_group("staff", &["cy".to_string()]).unwrap();
        assert_eq!(db.group_rid("Staff"), Some(1002));
        assert_eq!(db.group_rids_of("alice"), Vec::<u32>::new());
        let dir = tmpdir("groups");
        let file = dir.join("users.db");
        db.set_group("staff", &["alice".to_string(), "cy".to_string()])
            .unwrap();
        db.save(&file).unwrap();
        let text = fs::read_to_string(&file).unwrap();
        assert!(text.contains("\n[groups]\nStaff:1002:alice,cy\n"), "{text}");
        let mut again = UserDb::load(&file).unwrap();
        assert_eq!(again.group_of_rid(1002), Some("Staff"));
        assert_eq!(again.group_rids_of("cy"), vec![1002]);
        // A removed user leaves its groups.
        assert!(again.remove("cy"));
        assert_eq!(
            again.groups(),
            vec![("Staff".to_string(), 1002, vec!["alice".to_string()])]
        );
        assert!(again.remove_group("STAFF"));
        assert!(again.groups().is_empty());
        fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn parse_errors_name_the_line() {
        let path = Path::new("/etc/nimbus/users.db");
        let cases = [
            ("nope\n", 1),
            ("# nimbus user database v1\nalice\n", 2),
            ("# nimbus user database v1\n\n# c\nalice:123\n", 4),
            ("# nimbus user database v1\nalice:a4f49c406510bdcab6824ee7c30fd85g\n", 2),
            ("# nimbus user database v1\n:a4f49c406510bdcab6824ee7c30fd852\n", 2),
            (
                "# nimbus user database v1\na:a4f49c406510bdcab6824ee7c30fd852\nA:a4f49c406510bdcab6824ee7c30fd852\n",
                3,
            ),
            ("# nimbus user database v2\nmachine-sid S-1-5-21-1-2\n", 2),
            ("# nimbus user database v2\na:a4f49c406510bdcab6824ee7c30fd852:999\n", 2),
            (
                "# nimbus user database v2\na:a4f49c406510bdcab6824ee7c30fd852:1000\nb:a4f49c406510bdcab6824ee7c30fd852:1000\n",
                3,
            ),
            (
                "# nimbus user database v2\na:a4f49c406510bdcab6824ee7c30fd852:1000\n[groups]\ng:1000:a\n",
                4,
            ),
            ("# nimbus user database v2\n[groups]\ng:1001\n", 3),
            (
                "# nimbus user database v2\na:a4f49c406510bdcab6824ee7c30fd852:1000\n[groups]\nA:1001:\n",
                4,
            ),
        ];
        for (text, want) in cases {
            match UserDb::parse(path, text) {
                Err(e @ UserDbError::Parse { line, .. }) => {
                    assert_eq!(line, want, "{text:?}");
                    let msg = e.to_string();
                    assert!(
                        msg.contains("/etc/nimbus/users.db")
                            && msg.contains(&format!("line {want}")),
                        "{msg}"
                    );
                }
                other => panic!("{text:?}: {other:?}"),
            }
        }
        let ok = UserDb::parse(
            path,
            "# nimbus user database v1\r\nx:A4F49C406510BDCAB6824EE7C30FD852\r\n",
        )
        .unwrap();
        assert_eq!(ok.names(), vec!["x".to_string()]);
    }
}
