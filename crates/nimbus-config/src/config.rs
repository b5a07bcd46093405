//! Server configuration: the TOML file format, its validation, and the
//! command-line overrides. Every error names the file, the key and the fix.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use nimbus_crypto::{CipherAlgorithm, CryptoProvider};
use serde::Deserialize;

use crate::limits::{Limits, RawLimits};

/// Whether authenticated sessions must sign every message.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SigningPolicy {
    /// Every request of an authenticated session must carry a valid signature.
    #[default]
    Required,
    /// Sign when the client asks for it (or requires it).
    Auto,
}

/// Whether SMB3 encryption is asked of clients (server-wide or per share).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum EncryptionPolicy {
    /// The server does not ask for encryption. A client that encrypts on its
    /// own accord is still answered encrypted (refusing would only leave it
    /// less protected).
    #[default]
    Off,
    /// Clients that can encrypt are told to (session or share flag
    /// ENCRYPT_DATA) and their unencrypted requests are refused; clients
    /// that cannot (SMB 2.x, no common cipher, guests) are served in clear.
    Desired,
    /// Like `Desired`, but clients that cannot encrypt are refused.
    Required,
}

impl EncryptionPolicy {
    fn parse(s: &str) -> Option<Self> {
        match s {
            "off" => Some(EncryptionPolicy::Off),
            "desired" => Some(EncryptionPolicy::Desired),
            "required" => Some(EncryptionPolicy::Required),
            _ => None,
        }
    }
}

/// The values of `log_level`, least verbose first.
pub const LOG_LEVELS: [&str; 5] = ["error", "warn", "info", "debug", "trace"];

/// `log_format`: lines for people to read, or one JSON object per line
/// (with an RFC 3339 timestamp) for log shippers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShareConfig {
    pub name: String,
    pub path: PathBuf,
    pub read_only: bool,
    /// Allow unauthenticated (guest/anonymous) sessions to use this share.
    pub guest_ok: bool,
    /// Overrides the server-wide `[security] encryption` for this share.
    pub encryption: Option<EncryptionPolicy>,
    /// Continuously available (MS-SMB2 Share.IsCA): 3.x clients may ask
    /// for persistent handles, kept in `state_dir` through a restart.
    pub continuous_availability: bool,
    /// Shown beside the share's name when clients list the shares.
    pub comment: String,
    /// Access-based enumeration (MS-SMB2 SHI1005_FLAGS_ACCESS_BASED_DIRECTORY_ENUM):
    /// listings leave out what the user may not read.
    pub access_based_enumeration: bool,
    /// Apple's SMB extensions for macOS clients (`crate::apple`): the AAPL
    /// create context and the AFP_AfpInfo / AFP_Resource stream rules.
    pub apple_extensions: bool,
    /// Names starting with a dot are shown with FILE_ATTRIBUTE_HIDDEN
    /// (`crate::hide`).
    pub hide_dot_files: bool,
    /// Names shown with FILE_ATTRIBUTE_HIDDEN: search patterns (`*`, `?`)
    /// matched against the last component without case.
    pub hide_files: Vec<String>,
}

impl ShareConfig {
    /// A share of `path` with every other key at its default (as a
    /// `--share NAME=PATH` flag gives it).
    pub fn new(name: &str, path: PathBuf) -> ShareConfig {
        ShareConfig {
            name: name.to_string(),
            path,
            read_only: false,
            guest_ok: false,
            encryption: None,
            comment: String::new(),
            continuous_availability: false,
            access_based_enumeration: false,
            apple_extensions: true,
            hide_dot_files: true,
            hide_files: Vec::new(),
        }
    }
}

/// `[cluster]`: this node is one of several serving the same shares, with
/// the protocol state they share in etcd.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterConfig {
    /// Client URLs of the etcd members (`http://HOST:PORT`).
    pub etcd: Vec<String>,
    /// Unique, stable name of this node.
    pub node: String,
    /// Where clients reach this node.
    pub advertise: SocketAddr,
    /// How long this node's membership outlives its last renewal (a dead
    /// node's records become reclaimable after it).
    pub node_ttl_secs: u32,
    /// TLS to the etcd members (https:// endpoints), and this node's
    /// client certificate for members run with `--client-cert-auth`.
    pub tls: Option<EtcdTls>,
    /// etcd's own authentication: a user and the file its password is in.
    pub user: Option<(String, PathBuf)>,
    /// The cluster secret, the same on every node: the records nodes write
    /// to etcd are tagged with a key derived from it.
    pub secret_file: Option<PathBuf>,
    /// `group_leases`: read and read-handle leases of a node's alike opens
    /// are held in the file's record as one grant of the node's, the
    /// clients' own leases in the node's memory (docs/SCALING.md). On by
    /// default; `false` gives every lease its own grant in the record.
    pub group_leases: bool,
}

/// `[cluster]` ca_file, cert_file and key_file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EtcdTls {
    pub ca_file: PathBuf,
    pub cert_file: Option<PathBuf>,
    pub key_file: Option<PathBuf>,
}

/// `[kerberos]`: Kerberos logons with the keys of a keytab.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KerberosConfig {
    /// The keytab holding the service principal's keys.
    pub keytab: PathBuf,
    /// The principal to accept tickets for; None: any cifs/ key of the
    /// keytab.
    pub principal: Option<String>,
    /// Offer and accept NTLM too (never with fips = true).
    pub ntlm: bool,
    /// Principal (`name@REALM`, case-insensitive) to user name.
    pub user_map: Vec<(String, String)>,
    /// Take `alice@REALM` for user `alice` when the map does not name it.
    pub map_by_name: bool,
}

/// The default of `[cluster] node_ttl_secs`.
pub const DEFAULT_NODE_TTL_SECS: u32 = 10;

/// The validated configuration the server runs with.
#[derive(Clone, Debug)]
pub struct Config {
    pub listen: Vec<SocketAddr>,
    pub user_db: PathBuf,
    /// Where the state that must outlive the process is kept (a redb
    /// store); None: nowhere, and nothing outlives it.
    pub state_dir: Option<PathBuf>,
    pub signing: SigningPolicy,
    /// Server-wide encryption policy: the default of every share (and of
    /// IPC$); see `Config::share_encryption`.
    pub encryption: EncryptionPolicy,
    /// Ciphers offered, most preferred first (3.1.1 negotiation follows this
    /// order; 3.0/3.0.2 can encrypt only if AES-128-CCM is listed).
    pub ciphers: Vec<CipherAlgorithm>,
    /// Use only FIPS-approved algorithms (turns NTLM off).
    pub fips: bool,
    pub shares: Vec<ShareConfig>,
    /// NetBIOS name reported in NTLM challenges.
    pub server_name: String,
    /// Other host names or addresses clients use for this server (DNS
    /// aliases, a load balancer's or NAT's address):
    /// NTLM logons naming them as target are not taken for relays.
    pub server_aliases: Vec<String>,
    pub workgroup: String,
    /// The server's description, shown when clients browse it.
    pub server_comment: String,
    /// The Mac model whose icon Finder shows for this server (the AAPL
    /// create context's model string).
    pub apple_model: String,
    /// SMB 3.x multichannel: clients may bind more connections to a
    /// session (MS-SMB2 3.3.5.5); `multichannel = false` turns it off.
    pub multichannel: bool,
    /// Bounds on what clients may make the server hold (`[limits]`).
    pub limits: Limits,
    /// `[cluster]`, or None: a single node with its embedded store.
    pub cluster: Option<ClusterConfig>,
    /// `[kerberos]`, or None: NTLM logons only.
    pub kerberos: Option<KerberosConfig>,
    /// How log lines are written: text, or one JSON object per line.
    pub log_format: LogFormat,
    /// `log_level`: the least severe lines written ("error", "warn",
    /// "info", "debug" or "trace"); `-v` and NIMBUS_LOG, when given, win.
    pub log_level: String,
    /// `[metrics] listen`: where Prometheus scrapes `/metrics`; None: no
    /// endpoint, and nothing is counted.
    pub metrics_listen: Option<SocketAddr>,
    /// `[witness] listen`: where the witness service (MS-SWN) takes
    /// DCE/RPC over TCP; empty: no witness service.
    pub witness_listen: Vec<SocketAddr>,
    /// `[witness] endpoint_mapper`: where the endpoint mapper answers
    /// which port the witness service is at; None: port 135 at the
    /// `listen` addresses, skipped with a warning where that is refused.
    pub witness_endpoint_mapper: Option<Vec<SocketAddr>>,
    /// `[security] admins`: users and groups of the user database whose
    /// sessions are administrators (BUILTIN\Administrators in the token).
    pub admins: Vec<String>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            listen: vec![SocketAddr::from(([127, 0, 0, 1], 445))],
            user_db: PathBuf::from("users.db"),
            state_dir: None,
            signing: SigningPolicy::Required,
            encryption: EncryptionPolicy::Off,
            ciphers: CipherAlgorithm::ALL.to_vec(),
            fips: false,
            shares: Vec::new(),
            server_name: "NIMBUS".into(),
            server_aliases: Vec::new(),
            workgroup: "WORKGROUP".into(),
            server_comment: "Nimbus file server".into(),
            apple_model: DEFAULT_APPLE_MODEL.into(),
            multichannel: true,
            limits: Limits::default(),
            cluster: None,
            kerberos: None,
            log_format: LogFormat::Text,
            log_level: "info".into(),
            metrics_listen: None,
            witness_listen: Vec::new(),
            witness_endpoint_mapper: None,
            admins: Vec::new(),
        }
    }
}

pub use crate::config_error::ConfigError;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    listen: Option<Vec<String>>,
    user_db: Option<PathBuf>,
    state_dir: Option<PathBuf>,
    server_name: Option<String>,
    server_aliases: Option<Vec<String>>,
    workgroup: Option<String>,
    server_comment: Option<String>,
    apple_model: Option<String>,
    multichannel: Option<bool>,
    log_format: Option<String>,
    log_level: Option<String>,
    security: Option<RawSecurity>,
    limits: Option<RawLimits>,
    #[serde(default)]
    share: Vec<RawShare>,
    cluster: Option<RawCluster>,
    kerberos: Option<RawKerberos>,
    metrics: Option<RawMetrics>,
    witness: Option<RawWitness>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawWitness {
    listen: Option<Vec<String>>,
    endpoint_mapper: Option<Vec<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawMetrics {
    listen: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawKerberos {
    keytab: Option<PathBuf>,
    principal: Option<String>,
    ntlm: Option<bool>,
    #[serde(default)]
    user_map: std::collections::BTreeMap<String, String>,
    map_by_name: Option<bool>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCluster {
    etcd: Option<Vec<String>>,
    node: Option<String>,
    advertise: Option<String>,
    node_ttl_secs: Option<u32>,
    ca_file: Option<PathBuf>,
    cert_file: Option<PathBuf>,
    key_file: Option<PathBuf>,
    username: Option<String>,
    password_file: Option<PathBuf>,
    secret_file: Option<PathBuf>,
    group_leases: Option<bool>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSecurity {
    signing: Option<String>,
    encryption: Option<String>,
    ciphers: Option<Vec<String>>,
    fips: Option<bool>,
    admins: Option<Vec<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawShare {
    name: String,
    path: PathBuf,
    #[serde(default)]
    read_only: bool,
    #[serde(default)]
    guest_ok: bool,
    encryption: Option<String>,
    #[serde(default)]
    continuous_availability: bool,
    #[serde(default)]
    comment: String,
    #[serde(default)]
    access_based_enumeration: bool,
    #[serde(default = "yes")]
    apple_extensions: bool,
    #[serde(default = "yes")]
    hide_dot_files: bool,
    #[serde(default)]
    hide_files: Vec<String>,
}

fn yes() -> bool {
    true
}

/// An Apple server model Finder knows an icon for.
pub const DEFAULT_APPLE_MODEL: &str = "Xserve";

/// Validates `[cluster]`; each problem goes to `fail` (key, problem, fix).
fn cluster_config(
    c: RawCluster,
    fail: &mut dyn FnMut(&str, String, &str),
) -> Option<ClusterConfig> {
    const ETCD_FIX: &str =
        "list the etcd client URLs, e.g. etcd = [\"http://127.0.0.1:2379\", \"http://127.0.0.1:22379\"]";
    let etcd = c.etcd.unwrap_or_default();
    if etcd.is_empty() {
        fail("cluster.etcd", "no etcd endpoint given".into(), ETCD_FIX);
    }
    let mut ok = !etcd.is_empty();
    for (i, url) in etcd.iter().enumerate() {
        if let Err(e) = nimbus_state::etcd_store::parse_endpoint(url) {
            fail(&format!("cluster.etcd[{i}]"), e.0, ETCD_FIX);
            ok = false;
        }
    }
    let node = c.node.unwrap_or_default();
    let node_ok = !node.is_empty()
        && node.len() <= 63
        && node
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.');
    if !node_ok {
        fail(
            "cluster.node",
            format!("\"{node}\" is not a node name"),
            "give each node a unique, stable name of 1 to 63 letters, digits, '-', '_' or '.', \
             e.g. node = \"n1\"",
        );
        ok = false;
    }
    let advertise = match c.advertise.as_deref().map(str::parse::<SocketAddr>) {
        Some(Ok(a)) if !a.ip().is_unspecified() => Some(a),
        other => {
            fail(
                "cluster.advertise",
                match other {
                    None => "missing".into(),
                    Some(_) => format!(
                        "\"{}\" is not an address clients can reach",
                        c.advertise.as_deref().unwrap_or_default()
                    ),
                },
                "write the address and port clients use for this node, e.g. advertise = \"127.0.0.2:4450\"",
            );
            None
        }
    };
    let ttl = c.node_ttl_secs.unwrap_or(DEFAULT_NODE_TTL_SECS);
    if !(2..=300).contains(&ttl) {
        fail(
            "cluster.node_ttl_secs",
            format!("{ttl} is out of range"),
            "write a number of seconds from 2 to 300 (default 10)",
        );
        ok = false;
    }
    let https = etcd.iter().any(|u| u.starts_with("https://"));
    let tls = match (c.ca_file, c.cert_file, c.key_file) {
        (None, None, None) => None,
        (Some(ca_file), cert_file, key_file) => {
            ok &= readable_file("cluster.ca_file", &ca_file, false, fail)
                && pem_checked("cluster.ca_file", &ca_file, fail, |ca| {
                    nimbus_state::etcd_store::check_ca(ca)
                });
            match (&cert_file, &key_file) {
                (Some(cert), Some(key)) => {
                    ok &= readable_file("cluster.cert_file", cert, false, fail)
                        & readable_file("cluster.key_file", key, true, fail)
                        && identity_checked(cert, key, fail);
                }
                (None, None) => {}
                _ => {
                    fail(
                        "cluster.cert_file",
                        "cert_file and key_file go together".into(),
                        "give both the node's certificate and its key, or neither",
                    );
                    ok = false;
                }
            }
            Some(EtcdTls {
                ca_file,
                cert_file,
                key_file,
            })
        }
        (None, ..) => {
            fail(
                "cluster.ca_file",
                "a client certificate without the CA of the etcd members".into(),
                "add ca_file = \"/etc/nimbus/etcd-ca.pem\", the CA that signed the members' \
                 certificates",
            );
            ok = false;
            None
        }
    };
    if https != tls.is_some() || etcd.iter().any(|u| u.starts_with("https://") != https) {
        fail(
            "cluster.etcd",
            "https:// endpoints need ca_file, and with ca_file every endpoint is https://".into(),
            "use https:// client URLs and set ca_file (or http:// only, on a trusted network)",
        );
        ok = false;
    }
    let user = match (c.username, c.password_file) {
        (None, None) => None,
        (Some(u), Some(p)) if !u.is_empty() => {
            ok &= readable_file("cluster.password_file", &p, true, fail);
            Some((u, p))
        }
        _ => {
            fail(
                "cluster.username",
                "username and password_file go together".into(),
                "give the etcd user and the file its password is in (readable by its owner \
                 only), or neither",
            );
            ok = false;
            None
        }
    };
    const SECRET_FIX: &str =
        "make one with `head -c 32 /dev/urandom > /etc/nimbus/cluster.secret; \
                              chmod 600 /etc/nimbus/cluster.secret`, copy the same file to every \
                              node, and set secret_file = \"/etc/nimbus/cluster.secret\"";
    match &c.secret_file {
        Some(p) if readable_file("cluster.secret_file", p, true, fail) => {
            let min = nimbus_state::etcd_seal::MIN_SECRET as u64;
            let len = std::fs::metadata(p).map_or(0, |m| m.len());
            if len < min {
                fail(
                    "cluster.secret_file",
                    format!("{} holds {len} bytes, fewer than {min}", p.display()),
                    SECRET_FIX,
                );
                ok = false;
            }
        }
        Some(_) => ok = false,
        // A plain http:// cluster is unprotected anyway (warned about at
        // start); one reached over TLS must not trust its records blindly.
        None if tls.is_some() => {
            fail(
                "cluster.secret_file",
                "missing: without the cluster secret, whoever can write to etcd can forge \
                 the records nodes act on"
                    .into(),
                SECRET_FIX,
            );
            ok = false;
        }
        None => {}
    }
    Some(ClusterConfig {
        etcd,
        node,
        advertise: advertise?,
        node_ttl_secs: ttl,
        tls,
        user,
        secret_file: c.secret_file,
        group_leases: c.group_leases.unwrap_or(true),
    })
    .filter(|_| ok)
}

/// Whether the file `path` (the value of `key`) passes `check`.
fn pem_checked(
    key: &str,
    path: &std::path::Path,
    fail: &mut dyn FnMut(&str, String, &str),
    check: impl FnOnce(&[u8]) -> Result<(), nimbus_state::etcd_store::PemProblem>,
) -> bool {
    let checked = std::fs::read(path)
        .map_err(|e| e.to_string())
        .and_then(|pem| check(&pem).map_err(|p| p.to_string()));
    if let Err(why) = &checked {
        fail(
            key,
            format!("{}: {why}", path.display()),
            "give a PEM file (-----BEGIN CERTIFICATE-----)",
        );
    }
    checked.is_ok()
}

/// Whether `[cluster]` cert_file and key_file parse and go together.
fn identity_checked(
    cert: &std::path::Path,
    key: &std::path::Path,
    fail: &mut dyn FnMut(&str, String, &str),
) -> bool {
    let read = |p: &std::path::Path| std::fs::read(p).map_err(|e| format!("{}: {e}", p.display()));
    let (cert_pem, key_pem) = match (read(cert), read(key)) {
        (Ok(c), Ok(k)) => (c, k),
        (Err(why), _) | (_, Err(why)) => {
            fail("cluster.cert_file", why, "give files this process can read");
            return false;
        }
    };
    match nimbus_state::etcd_store::check_identity(&cert_pem, &key_pem) {
        Ok(()) => true,
        Err(why) => {
            let (k, path) = match why.file() {
                nimbus_state::etcd_store::PemFile::Cert => ("cluster.cert_file", cert),
                nimbus_state::etcd_store::PemFile::Key => ("cluster.key_file", key),
            };
            fail(
                k,
                format!("{}: {why}", path.display()),
                "give this node's PEM certificate in cert_file and the private key it was \
                 made for in key_file",
            );
            false
        }
    }
}

/// Whether `path` (the value of `key`) is a file this process can read;
/// a `secret` one must be readable by its owner only.
fn readable_file(
    key: &str,
    path: &std::path::Path,
    secret: bool,
    fail: &mut dyn FnMut(&str, String, &str),
) -> bool {
    use std::os::unix::fs::PermissionsExt;
    match std::fs::metadata(path) {
        Err(e) => {
            fail(
                key,
                format!("{}: {e}", path.display()),
                "give the path of an existing file",
            );
            false
        }
        Ok(m) if !m.is_file() => {
            fail(
                key,
                format!("{} is not a file", path.display()),
                "give the path of an existing file",
            );
            false
        }
        Ok(m) if secret && m.permissions().mode() & 0o077 != 0 => {
            fail(
                key,
                format!(
                    "{} is readable by others than its owner (mode {:o})",
                    path.display(),
                    m.permissions().mode() & 0o777
                ),
                &format!("chmod 600 {}", path.display()),
            );
            false
        }
        Ok(_) => true,
    }
}

/// Validates `[kerberos]`; each problem goes to `fail` (key, problem, fix).
/// The keytab must exist and be readable by its owner only: whoever reads
/// it can pose as this server to every client.
fn kerberos_config(
    k: RawKerberos,
    fips: bool,
    resolve: &dyn Fn(PathBuf) -> PathBuf,
    fail: &mut dyn FnMut(&str, String, &str),
) -> Option<KerberosConfig> {
    const KEYTAB_FIX: &str = "make a keytab for cifs/<host> (kadmin: ktadd -k FILE cifs/HOST), \
         write keytab = \"/etc/nimbus/cifs.keytab\" and chmod 600 it";
    let Some(keytab) = k.keytab.map(resolve) else {
        fail("kerberos.keytab", "missing".into(), KEYTAB_FIX);
        return None;
    };
    let mut ok = true;
    match std::fs::metadata(&keytab) {
        Err(e) => {
            fail(
                "kerberos.keytab",
                format!("{}: {e}", keytab.display()),
                KEYTAB_FIX,
            );
            ok = false;
        }
        Ok(m) if !m.is_file() => {
            fail(
                "kerberos.keytab",
                format!("{} is not a file", keytab.display()),
                KEYTAB_FIX,
            );
            ok = false;
        }
        Ok(m) => {
            use std::os::unix::fs::PermissionsExt;
            let mode = m.permissions().mode() & 0o777;
            if mode & 0o077 != 0 {
                fail(
                    "kerberos.keytab",
                    format!(
                        "{} is readable by others than its owner (mode {mode:o}): anyone who \
                         reads it can pose as this server",
                        keytab.display()
                    ),
                    &format!("chmod 600 {}", keytab.display()),
                );
                ok = false;
            }
        }
    }
    if let Some(p) = &k.principal {
        if !p.to_ascii_lowercase().starts_with("cifs/") || !p.contains('@') {
            fail(
                "kerberos.principal",
                format!("\"{p}\" is not a cifs/ service principal with a realm"),
                "write principal = \"cifs/files.example.test@EXAMPLE.TEST\", or leave it out to \
                 accept any cifs/ key of the keytab",
            );
            ok = false;
        }
    }
    if fips && k.ntlm == Some(true) {
        fail(
            "kerberos.ntlm",
            "NTLM cannot be turned on with fips = true (it needs MD4, MD5 and RC4)".into(),
            "remove ntlm = true, or set [security] fips = false",
        );
        ok = false;
    }
    ok.then(|| KerberosConfig {
        keytab,
        principal: k.principal,
        ntlm: !fips && k.ntlm.unwrap_or(true),
        user_map: k.user_map.into_iter().collect(),
        map_by_name: k.map_by_name.unwrap_or(true),
    })
}

const ENCRYPTION_FIX: &str =
    "write encryption = \"off\", encryption = \"desired\" or encryption = \"required\"";

impl Config {
    /// The encryption policy of a share: its own setting, else the
    /// server-wide one (IPC$ and shares without the key).
    pub fn share_encryption(&self, share: Option<&ShareConfig>) -> EncryptionPolicy {
        share.and_then(|s| s.encryption).unwrap_or(self.encryption)
    }

    /// Whether a client that can encrypt gets the session-wide ENCRYPT_DATA
    /// flag: only if every share, IPC$ included, asks for encryption. When
    /// some share opts out, encryption is requested per share instead, so
    /// the opted-out share really is served in clear ("per share wins").
    pub fn encrypt_whole_session(&self) -> bool {
        self.encryption != EncryptionPolicy::Off
            && self
                .shares
                .iter()
                .all(|s| s.encryption != Some(EncryptionPolicy::Off))
    }

    /// Whether a client that cannot encrypt is refused at logon: only if
    /// every share, IPC$ included, requires encryption. Otherwise it is
    /// refused per share, at TREE_CONNECT.
    pub fn refuse_clear_sessions(&self) -> bool {
        self.encryption == EncryptionPolicy::Required
            && self
                .shares
                .iter()
                .all(|s| s.encryption.is_none_or(|e| e == EncryptionPolicy::Required))
    }

    /// Parses and validates a TOML file. Returns every problem found, not
    /// just the first, so one run of `nimbus config check` shows them all.
    pub fn from_file(path: &Path) -> Result<Config, Vec<ConfigError>> {
        let file = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| {
            vec![ConfigError {
                file: file.clone(),
                key: "-".into(),
                problem: format!("cannot read the file: {e}"),
                fix: "pass the path of a readable TOML file to --config".into(),
            }]
        })?;
        Self::from_toml(&file, &text, path.parent())
    }

    /// `base` resolves relative paths (user_db, share paths) against the
    /// directory holding the config file.
    pub fn from_toml(
        file: &str,
        text: &str,
        base: Option<&Path>,
    ) -> Result<Config, Vec<ConfigError>> {
        let err = |key: &str, problem: String, fix: &str| ConfigError {
            file: file.to_string(),
            key: key.to_string(),
            problem,
            fix: fix.to_string(),
        };
        let raw: RawConfig = toml::from_str(text).map_err(|e| {
            let msg = e.message().to_string();
            let line = e
                .span()
                .map(|s| text[..s.start.min(text.len())].lines().count().max(1))
                .unwrap_or(0);
            vec![err(
                &format!("line {line}"),
                msg,
                "see docs/CONFIGURATION.md for every key of every section, its default and its values",
            )]
        })?;
        let mut errors = Vec::new();
        let resolve = |p: PathBuf| match base {
            Some(b) if p.is_relative() && !b.as_os_str().is_empty() => b.join(p),
            _ => p,
        };
        let mut cfg = Config::default();
        if let Some(listen) = raw.listen {
            cfg.listen.clear();
            for (i, l) in listen.iter().enumerate() {
                match l.parse::<SocketAddr>() {
                    Ok(a) => cfg.listen.push(a),
                    Err(_) => errors.push(err(
                        &format!("listen[{i}]"),
                        format!("\"{l}\" is not an address and port"),
                        "write an IP address and port such as \"127.0.0.1:4450\" or \"[::1]:445\"",
                    )),
                }
            }
            if listen.is_empty() {
                errors.push(err(
                    "listen",
                    "no address given".into(),
                    "list at least one address, e.g. listen = [\"127.0.0.1:4450\"]",
                ));
            }
        }
        if let Some(db) = raw.user_db {
            cfg.user_db = resolve(db);
        }
        if let Some(l) = raw.metrics.and_then(|m| m.listen) {
            match l.parse::<SocketAddr>() {
                Ok(a) => cfg.metrics_listen = Some(a),
                Err(_) => errors.push(err(
                    "metrics.listen",
                    format!("\"{l}\" is not an address and port"),
                    "write an IP address and port such as listen = \"127.0.0.1:9445\" \
                     (a loopback or management address: the endpoint has no authentication)",
                )),
            }
        }
        let witness = raw.witness.unwrap_or(RawWitness {
            listen: None,
            endpoint_mapper: None,
        });
        let mut addresses = |key: &str, list: &[String], out: &mut Vec<SocketAddr>| {
            for (i, l) in list.iter().enumerate() {
                match l.parse::<SocketAddr>() {
                    Ok(a) => out.push(a),
                    Err(_) => errors.push(err(
                        &format!("witness.{key}[{i}]"),
                        format!("\"{l}\" is not an address and port"),
                        "write addresses clients reach this node at, e.g. [\"192.0.2.10:5445\"]",
                    )),
                }
            }
        };
        addresses(
            "listen",
            witness.listen.as_deref().unwrap_or_default(),
            &mut cfg.witness_listen,
        );
        if let Some(list) = &witness.endpoint_mapper {
            let mut mapper = Vec::new();
            addresses("endpoint_mapper", list, &mut mapper);
            cfg.witness_endpoint_mapper = Some(mapper);
        }
        if let Some(dir) = raw.state_dir {
            cfg.state_dir = Some(resolve(dir));
        }
        if let Some(n) = raw.server_name {
            cfg.server_name = n;
        }
        if let Some(a) = raw.server_aliases {
            cfg.server_aliases = a;
        }
        if let Some(w) = raw.workgroup {
            cfg.workgroup = w;
        }
        if let Some(c) = raw.server_comment {
            cfg.server_comment = c;
        }
        if let Some(m) = raw.apple_model {
            // Sent in a 32-bit length as UTF-16; Finder shows a generic
            // icon for a model it does not know, nothing for an empty one.
            if m.is_empty() || m.chars().count() > 64 || m.chars().any(char::is_control) {
                errors.push(err(
                    "apple_model",
                    format!("\"{m}\" is not a model name (1 to 64 printable characters)"),
                    "name an Apple model, e.g. apple_model = \"Xserve\" (or \"RackMac\", \"MacPro\")",
                ));
            } else {
                cfg.apple_model = m;
            }
        }
        if let Some(m) = raw.multichannel {
            cfg.multichannel = m;
        }
        if let Some(f) = raw.log_format {
            match f.as_str() {
                "text" => cfg.log_format = LogFormat::Text,
                "json" => cfg.log_format = LogFormat::Json,
                other => errors.push(err(
                    "log_format",
                    format!("unknown value \"{other}\""),
                    "write log_format = \"text\" (lines for people) or log_format = \"json\" (one object per line, for log shippers)",
                )),
            }
        }
        if let Some(level) = raw.log_level {
            if LOG_LEVELS.contains(&level.as_str()) {
                cfg.log_level = level;
            } else {
                errors.push(err(
                    "log_level",
                    format!("unknown level \"{level}\""),
                    "write log_level = \"info\" (or \"error\", \"warn\", \"debug\", \"trace\")",
                ));
            }
        }
        if let Some(sec) = raw.security {
            if let Some(s) = sec.signing {
                match s.as_str() {
                    "required" => cfg.signing = SigningPolicy::Required,
                    "auto" => cfg.signing = SigningPolicy::Auto,
                    other => errors.push(err(
                        "security.signing",
                        format!("unknown value \"{other}\""),
                        "write signing = \"required\" or signing = \"auto\"",
                    )),
                }
            }
            if let Some(e) = sec.encryption {
                match EncryptionPolicy::parse(&e) {
                    Some(p) => cfg.encryption = p,
                    None => errors.push(err(
                        "security.encryption",
                        format!("unknown value \"{e}\""),
                        ENCRYPTION_FIX,
                    )),
                }
            }
            if let Some(list) = sec.ciphers {
                cfg.ciphers.clear();
                for (i, name) in list.iter().enumerate() {
                    match CipherAlgorithm::from_name(name) {
                        Some(c) if cfg.ciphers.contains(&c) => errors.push(err(
                            &format!("security.ciphers[{i}]"),
                            format!("\"{name}\" is listed twice"),
                            "list each cipher once",
                        )),
                        Some(c) => cfg.ciphers.push(c),
                        None => errors.push(err(
                            &format!("security.ciphers[{i}]"),
                            format!("unknown cipher \"{name}\""),
                            "use AES-128-GCM, AES-256-GCM, AES-128-CCM or AES-256-CCM",
                        )),
                    }
                }
            }
            for (i, name) in sec.admins.unwrap_or_default().into_iter().enumerate() {
                let key = nimbus_auth::UserDb::canonical_key(&name);
                let problem = match nimbus_auth::UserDb::validate_name(&name) {
                    Err(e) => Some(e.to_string()),
                    Ok(())
                        if cfg
                            .admins
                            .iter()
                            .any(|a| nimbus_auth::UserDb::canonical_key(a) == key) =>
                    {
                        Some(format!("\"{name}\" is listed twice"))
                    }
                    Ok(()) => None,
                };
                match problem {
                    Some(problem) => errors.push(err(
                        &format!("security.admins[{i}]"),
                        problem,
                        "name each user or group of the user database once, e.g. admins = [\"alice\", \"staff\"]",
                    )),
                    None => cfg.admins.push(name),
                }
            }
            if let Some(f) = sec.fips {
                cfg.fips = f;
                if f && CryptoProvider::fips_if_built().is_none() {
                    errors.push(err(
                        "security.fips",
                        "this nimbus binary was built without the FIPS provider".into(),
                        "build with `cargo build --release --features fips` (needs cmake and Go), or set fips = false",
                    ));
                }
            }
        }
        match raw.limits.unwrap_or_default().validate(file) {
            Ok(l) => cfg.limits = l,
            Err(e) => errors.extend(e),
        }
        // A cluster node keeps persistent handles in etcd instead.
        let clustered = raw.cluster.is_some();
        for (i, s) in raw.share.into_iter().enumerate() {
            let encryption = match s
                .encryption
                .as_deref()
                .map(|e| (e, EncryptionPolicy::parse(e)))
            {
                None => None,
                Some((_, Some(p))) => Some(p),
                Some((e, None)) => {
                    errors.push(err(
                        &format!("share[{i}].encryption"),
                        format!("unknown value \"{e}\""),
                        ENCRYPTION_FIX,
                    ));
                    None
                }
            };
            cfg.shares.push(ShareConfig {
                name: s.name,
                path: resolve(s.path),
                read_only: s.read_only,
                guest_ok: s.guest_ok,
                encryption,
                continuous_availability: s.continuous_availability,
                comment: s.comment,
                access_based_enumeration: s.access_based_enumeration,
                apple_extensions: s.apple_extensions,
                hide_dot_files: s.hide_dot_files,
                hide_files: s.hide_files.clone(),
            });
            if let Err(problem) = crate::hide::HideNames::new(s.hide_dot_files, &s.hide_files) {
                errors.push(err(
                    &format!("share[{i}].hide_files"),
                    problem.to_string(),
                    "give names or patterns of one path component, e.g. hide_files = [\"*.tmp\", \"desktop.ini\"]",
                ));
            }
            if s.continuous_availability && cfg.state_dir.is_none() && !clustered {
                errors.push(err(
                    &format!("share[{i}].continuous_availability"),
                    "a continuously available share keeps its persistent handles in the state \
                     directory (in etcd on a cluster node), and none is configured"
                        .into(),
                    "set the top-level key state_dir = \"/var/lib/nimbus\" (a directory only \
                     the server can read), or remove continuous_availability",
                ));
            }
        }
        let wants_encryption = cfg.encryption != EncryptionPolicy::Off
            || cfg
                .shares
                .iter()
                .any(|s| s.encryption.is_some_and(|e| e != EncryptionPolicy::Off));
        if cfg.ciphers.is_empty() && wants_encryption {
            errors.push(err(
                "security.ciphers",
                "encryption is desired or required but no cipher is listed".into(),
                "list at least one cipher, e.g. ciphers = [\"AES-128-GCM\"]",
            ));
        }
        if let Some(c) = raw.cluster {
            cfg.cluster = cluster_config(c, &mut |key, problem, fix| {
                errors.push(err(key, problem, fix))
            });
        }
        if let Some(k) = raw.kerberos {
            cfg.kerberos = kerberos_config(k, cfg.fips, &resolve, &mut |key, problem, fix| {
                errors.push(err(key, problem, fix))
            });
        }
        for (key, problem) in cfg.listener_clashes() {
            errors.push(err(&key, problem, LISTENER_CLASH_FIX));
        }
        errors.extend(cfg.validate_shares(file));
        if errors.is_empty() {
            Ok(cfg)
        } else {
            Err(errors)
        }
    }

    /// Each listener that cannot be bound beside an earlier one: its key,
    /// and the problem (`crate::listeners`).
    pub fn listener_clashes(&self) -> Vec<(String, String)> {
        let listeners = self.listeners();
        crate::listeners::clashes(&listeners)
            .into_iter()
            .map(|c| {
                let problem = format!(
                    "{} is also {} ({}): the server could not bind both",
                    c.later.1, c.earlier.0, c.earlier.1
                );
                (c.later.0.clone(), problem)
            })
            .collect()
    }

    /// Every address the server listens on, under its key (the order of
    /// the file: SMB, metrics, witness, endpoint mapper).
    pub fn listeners(&self) -> Vec<crate::listeners::Listener> {
        let mut out = Vec::new();
        let mut add = |key: &str, list: &[SocketAddr]| {
            out.extend(
                list.iter()
                    .enumerate()
                    .map(|(i, a)| (format!("{key}[{i}]"), *a)),
            );
        };
        add("listen", &self.listen);
        add("witness.listen", &self.witness_listen);
        add(
            "witness.endpoint_mapper",
            self.witness_endpoint_mapper.as_deref().unwrap_or_default(),
        );
        if let Some(m) = self.metrics_listen {
            out.insert(self.listen.len(), ("metrics.listen".into(), m));
        }
        out
    }

    /// Checks the shares: valid unique names, existing directories.
    pub fn validate_shares(&self, file: &str) -> Vec<ConfigError> {
        let mut errors = Vec::new();
        let mut seen = HashSet::new();
        for (i, s) in self.shares.iter().enumerate() {
            let key = format!("share[{i}]");
            let bad_char = s
                .name
                .chars()
                .any(|c| c.is_control() || "\\/:*?\"<>|[]+=;,".contains(c));
            if s.name.is_empty() || s.name.len() > 80 || bad_char {
                errors.push(ConfigError {
                    file: file.into(),
                    key: format!("{key}.name"),
                    problem: format!("\"{}\" is not a valid share name", s.name),
                    fix: "use 1 to 80 letters, digits, '-', '_', '.', '$' or spaces".into(),
                });
            }
            if s.name.eq_ignore_ascii_case("IPC$") {
                errors.push(ConfigError {
                    file: file.into(),
                    key: format!("{key}.name"),
                    problem: "IPC$ is reserved".into(),
                    fix: "choose another name".into(),
                });
            }
            if !seen.insert(s.name.to_lowercase()) {
                errors.push(ConfigError {
                    file: file.into(),
                    key: format!("{key}.name"),
                    problem: format!(
                        "share \"{}\" is defined twice (names are case-insensitive)",
                        s.name
                    ),
                    fix: "give each share a distinct name".into(),
                });
            }
            if !s.path.is_dir() {
                errors.push(ConfigError {
                    file: file.into(),
                    key: format!("{key}.path"),
                    problem: format!("\"{}\" is not an existing directory", s.path.display()),
                    fix: format!(
                        "create it (mkdir -p {}) or point path at an existing directory",
                        s.path.display()
                    ),
                });
            }
        }
        errors
    }
}

/// How to mend two listeners on one address and port.
pub const LISTENER_CLASH_FIX: &str = "give each listener an address and port of its own, e.g. \
     [witness] listen = [\"192.0.2.10:5445\"] beside listen = [\"192.0.2.10:445\"]";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_documented_example() {
        let dir = std::env::temp_dir();
        let text = format!(
            "listen = [\"127.0.0.1:4450\"]\nuser_db = \"users.db\"\nstate_dir = \"state\"\n[security]\nsigning = \"required\"\n[[share]]\nname = \"data\"\npath = \"{}\"\nread_only = false\n",
            dir.display()
        );
        let cfg = Config::from_toml("t.toml", &text, Some(Path::new("/etc/nimbus"))).unwrap();
        assert_eq!(cfg.listen, vec!["127.0.0.1:4450".parse().unwrap()]);
        assert_eq!(cfg.user_db, PathBuf::from("/etc/nimbus/users.db"));
        assert_eq!(cfg.state_dir, Some(PathBuf::from("/etc/nimbus/state")));
        assert_eq!(cfg.shares.len(), 1);
        assert_eq!(cfg.signing, SigningPolicy::Required);
    }

    #[test]
    fn cluster_section_with_the_documented_keys() {
        let dir = std::env::temp_dir();
        let text = format!(
            "[[share]]\nname = \"data\"\npath = \"{}\"\n[cluster]\n\
             etcd = [\"http://127.0.0.1:2379\", \"http://127.0.0.1:22379\", \"http://127.0.0.1:32379\"]\n\
             node = \"n1\"\nadvertise = \"127.0.0.2:4450\"\n",
            dir.display()
        );
        let cfg = Config::from_toml("t.toml", &text, None).unwrap();
        let c = cfg.cluster.unwrap();
        assert_eq!(c.etcd.len(), 3);
        assert_eq!(c.node, "n1");
        assert_eq!(c.advertise, "127.0.0.2:4450".parse().unwrap());
        assert_eq!(c.node_ttl_secs, DEFAULT_NODE_TTL_SECS);
        // Without [cluster]: a single node.
        let single = format!("[[share]]\nname = \"data\"\npath = \"{}\"\n", dir.display());
        assert!(Config::from_toml("t.toml", &single, None)
            .unwrap()
            .cluster
            .is_none());
    }

    #[test]
    fn cluster_problems_name_their_keys() {
        let text = "[cluster]\netcd = [\"https://e:2379\", \"e:2379\"]\nnode = \"a b\"\n\
                    advertise = \"0.0.0.0:445\"\nnode_ttl_secs = 1\n";
        let errs = Config::from_toml("c.toml", text, None).unwrap_err();
        let keys: Vec<_> = errs.iter().map(|e| e.key.as_str()).collect();
        for k in [
            "cluster.etcd",
            "cluster.etcd[1]",
            "cluster.node",
            "cluster.advertise",
            "cluster.node_ttl_secs",
        ] {
            assert!(keys.contains(&k), "{k} missing from {keys:?}");
        }
        assert!(errs
            .iter()
            .any(|e| e.problem.contains("https:// endpoints need ca_file")));
        let empty = Config::from_toml("c.toml", "[cluster]\n", None).unwrap_err();
        let keys: Vec<_> = empty.iter().map(|e| e.key.as_str()).collect();
        assert!(keys.contains(&"cluster.etcd") && keys.contains(&"cluster.node"));
        assert!(keys.contains(&"cluster.advertise"));
        let unknown = Config::from_toml("c.toml", "[cluster]\nnodes = \"x\"\n", None).unwrap_err();
        assert!(unknown[0].problem.contains("unknown field"), "{unknown:?}");
    }

    /// TLS and authentication keys: files that exist, secrets readable by
    /// their owner only, pairs given together, https:// with the CA.
    #[test]
    fn cluster_tls_and_user_keys_are_checked() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("nimbus-cfg-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        nimbus_state::etcd_test_cluster::make_certificates(&dir);
        std::fs::write(dir.join("password"), b"x").unwrap();
        std::fs::write(dir.join("secret"), [7; 32]).unwrap();
        for f in ["password", "secret", "client.key", "member.key"] {
            std::fs::set_permissions(dir.join(f), std::fs::Permissions::from_mode(0o600)).unwrap();
        }
        let p = |f: &str| dir.join(f).display().to_string();
        let base = "[cluster]\nnode = \"n1\"\nadvertise = \"127.0.0.2:4450\"\n";
        let with = |cert: &str, key: &str, secret: &str| {
            format!(
                "{base}etcd = [\"https://127.0.0.1:2379\"]\nca_file = \"{}\"\ncert_file = \"{}\"\n\
                 key_file = \"{}\"\nusername = \"nimbus\"\npassword_file = \"{}\"\n{secret}",
                p("ca.pem"),
                p(cert),
                p(key),
                p("password")
            )
        };
        let secret = format!("secret_file = \"{}\"\n", p("secret"));
        let good = with("client.pem", "client.key", &secret);
        let c = Config::from_toml("t.toml", &good, None)
            .unwrap()
            .cluster
            .unwrap();
        assert_eq!(c.tls.unwrap().ca_file, dir.join("ca.pem"));
        assert_eq!(c.user.unwrap().0, "nimbus");
        assert_eq!(c.secret_file, Some(dir.join("secret")));
        let refused = |toml: &str, key: &str, why: &str| {
            let errs = Config::from_toml("t.toml", toml, None).unwrap_err();
            assert!(
                errs.iter().any(|e| e.key == key && e.problem.contains(why)),
                "{key}: {why} not in {errs:?}"
            );
        };
        // Another certificate's key; a key for a certificate; no secret
        // with TLS, or a short one.
        let other_key = with("client.pem", "member.key", &secret);
        refused(
            &other_key,
            "cluster.key_file",
            "not the key of the certificate",
        );
        let not_pem = with("password", "client.key", &secret);
        refused(&not_pem, "cluster.cert_file", "PEM");
        refused(
            &with("client.pem", "client.key", ""),
            "cluster.secret_file",
            "missing",
        );
        std::fs::write(dir.join("secret"), [7; 31]).unwrap();
        refused(&good, "cluster.secret_file", "31 bytes");
        std::fs::write(dir.join("secret"), [7; 32]).unwrap();
        // A key others may read is refused, with chmod as the fix.
        std::fs::set_permissions(
            dir.join("client.key"),
            std::fs::Permissions::from_mode(0o640),
        )
        .unwrap();
        let errs = Config::from_toml("t.toml", &good, None).unwrap_err();
        assert!(
            errs.iter()
                .any(|e| e.key == "cluster.key_file" && e.fix.starts_with("chmod 600")),
            "{errs:?}"
        );
        // http:// with a CA, a certificate without its key, a user without
        // a password file.
        let bad = format!(
            "{base}etcd = [\"http://127.0.0.1:2379\"]\nca_file = \"{}\"\ncert_file = \"{}\"\n\
             username = \"nimbus\"\n",
            p("ca.pem"),
            p("client.pem")
        );
        let errs = Config::from_toml("t.toml", &bad, None).unwrap_err();
        let keys: Vec<_> = errs.iter().map(|e| e.key.as_str()).collect();
        for k in ["cluster.etcd", "cluster.cert_file", "cluster.username"] {
            assert!(keys.contains(&k), "{k} missing from {keys:?}");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn reports_every_problem_with_key_and_fix() {
        let text = "listen = [\"nope\"]\n[security]\nsigning = \"maybe\"\n[[share]]\nname = \"a/b\"\npath = \"/definitely/missing\"\n";
        let errs = Config::from_toml("bad.toml", text, None).unwrap_err();
        let keys: Vec<_> = errs.iter().map(|e| e.key.as_str()).collect();
        assert!(keys.contains(&"listen[0]"));
        assert!(keys.contains(&"security.signing"));
        assert!(keys.contains(&"share[0].name"));
        assert!(keys.contains(&"share[0].path"));
        assert!(errs.iter().all(|e| e.to_string().starts_with("bad.toml: ")));
    }

    #[test]
    fn two_listeners_on_one_address_are_refused_naming_both_keys() {
        let share = format!(
            "[[share]]\nname = \"d\"\npath = \"{}\"\n",
            std::env::temp_dir().display()
        );
        let text = "listen = [\"127.0.0.9:4450\"]\n[metrics]\nlisten = \"127.0.0.9:9445\"\n\
                    [witness]\nlisten = [\"0.0.0.0:4450\"]\n"
            .to_string()
            + &share;
        let errs = Config::from_toml("n.toml", &text, None).unwrap_err();
        assert_eq!(errs.len(), 1, "{errs:?}");
        assert_eq!(errs[0].key, "witness.listen[0]");
        assert!(
            errs[0].to_string().contains("listen[0] (127.0.0.9:4450)"),
            "{}",
            errs[0]
        );
        let apart = text.replace("0.0.0.0:4450", "127.0.0.9:5445");
        assert!(Config::from_toml("n.toml", &apart, None).is_ok());
    }

    #[test]
    fn admins_are_names_of_the_user_database_each_once() {
        let cfg = Config::from_toml(
            "t.toml",
            "[security]\nadmins = [\"alice\", \"ops\"]\n",
            None,
        )
        .unwrap();
        assert_eq!(cfg.admins, ["alice", "ops"]);
        assert!(Config::default().admins.is_empty());
        let text = "[security]\nadmins = [\"alice\", \"\", \"ALICE\", \"a:b\"]\n";
        let errs = Config::from_toml("bad.toml", text, None).unwrap_err();
        let keys: Vec<_> = errs.iter().map(|e| e.key.as_str()).collect();
        assert_eq!(
            keys,
            [
                "security.admins[1]",
                "security.admins[2]",
                "security.admins[3]"
            ]
        );
        assert!(errs[1].problem.contains("listed twice"), "{}", errs[1]);
        assert!(errs.iter().all(|e| e.fix.contains("admins = [")));
    }

    #[test]
    fn encryption_keys_and_per_share_override() {
        let dir = std::env::temp_dir();
        let text = format!(
            "[security]\nencryption = \"desired\"\nciphers = [\"AES-256-GCM\", \"aes-128-ccm\"]\n\
             [[share]]\nname = \"secret\"\npath = \"{0}\"\nencryption = \"required\"\n\
             [[share]]\nname = \"plain\"\npath = \"{0}\"\n",
            dir.display()
        );
        let cfg = Config::from_toml("t.toml", &text, None).unwrap();
        assert_eq!(cfg.encryption, EncryptionPolicy::Desired);
        assert_eq!(
            cfg.ciphers,
            vec![CipherAlgorithm::Aes256Gcm, CipherAlgorithm::Aes128Ccm]
        );
        assert_eq!(
            cfg.share_encryption(Some(&cfg.shares[0])),
            EncryptionPolicy::Required
        );
        assert_eq!(
            cfg.share_encryption(Some(&cfg.shares[1])),
            EncryptionPolicy::Desired
        );
        assert_eq!(cfg.share_encryption(None), EncryptionPolicy::Desired);
        assert!(cfg.encrypt_whole_session());
        assert!(!cfg.refuse_clear_sessions());
    }

    #[test]
    fn a_share_that_opts_out_keeps_the_session_in_clear() {
        let mut cfg = Config {
            encryption: EncryptionPolicy::Required,
            ..Config::default()
        };
        assert!(cfg.encrypt_whole_session() && cfg.refuse_clear_sessions());
        cfg.shares.push(ShareConfig {
            name: "fast".into(),
            path: "/tmp".into(),
            read_only: false,
            guest_ok: false,
            encryption: Some(EncryptionPolicy::Off),
            continuous_availability: false,
            comment: String::new(),
            access_based_enumeration: false,
            apple_extensions: true,
            hide_dot_files: true,
            hide_files: Vec::new(),
        });
        assert!(!cfg.encrypt_whole_session());
        assert!(!cfg.refuse_clear_sessions());
    }

    #[test]
    fn bad_encryption_settings_name_their_key() {
        let text = "[security]\nencryption = \"always\"\nciphers = [\"AES-128-GCM\", \"ROT13\", \"aes-128-gcm\"]\n\
                    [[share]]\nname = \"x\"\npath = \"/tmp\"\nencryption = \"yes\"\n";
        let errs = Config::from_toml("e.toml", text, None).unwrap_err();
        let keys: Vec<_> = errs.iter().map(|e| e.key.as_str()).collect();
        assert_eq!(
            keys,
            vec![
                "security.encryption",
                "security.ciphers[1]",
                "security.ciphers[2]",
                "share[0].encryption"
            ]
        );
        let text = "[security]\nencryption = \"required\"\nciphers = []\n";
        let errs = Config::from_toml("e.toml", text, None).unwrap_err();
        assert_eq!(errs[0].key, "security.ciphers");
    }

    #[test]
    fn hidden_names_are_read_and_a_bad_pattern_names_its_key() {
        let text = "[[share]]\nname = \"x\"\npath = \"/tmp\"\nhide_files = [\"*.tmp\"]\n\
                    [[share]]\nname = \"y\"\npath = \"/tmp\"\nhide_dot_files = false\n";
        let cfg = Config::from_toml("h.toml", text, None).unwrap();
        assert!(cfg.shares[0].hide_dot_files && !cfg.shares[1].hide_dot_files);
        assert_eq!(cfg.shares[0].hide_files, ["*.tmp"]);
        let text = "[[share]]\nname = \"x\"\npath = \"/tmp\"\nhide_files = [\"a\\\\b\"]\n";
        let errs = Config::from_toml("h.toml", text, None).unwrap_err();
        assert_eq!(errs[0].key, "share[0].hide_files");
        assert!(errs[0].fix.contains("hide_files = ["), "{}", errs[0].fix);
    }

    #[test]
    fn kerberos_settings_are_checked_and_name_their_key() {
        let dir = std::env::temp_dir().join(format!("nimbus-krb-cfg-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let keytab = dir.join("cifs.keytab");
        std::fs::write(&keytab, b"\x05\x02").unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&keytab, std::fs::Permissions::from_mode(0o600)).unwrap();
        let text = "[kerberos]\nkeytab = \"cifs.keytab\"\n[kerberos.user_map]\n\"ops/admin@R.TEST\" = \"alice\"\n";
        let cfg = Config::from_toml("k.toml", text, Some(&dir)).unwrap();
        let k = cfg.kerberos.unwrap();
        assert_eq!(
            k.keytab, keytab,
            "relative to the configuration's directory"
        );
        assert!(k.ntlm && k.map_by_name && k.principal.is_none());
        assert_eq!(
            k.user_map,
            vec![("ops/admin@R.TEST".into(), "alice".into())]
        );

        std::fs::set_permissions(&keytab, std::fs::Permissions::from_mode(0o640)).unwrap();
        let text = "[kerberos]\nkeytab = \"cifs.keytab\"\nprincipal = \"host/x@R\"\n";
        let errs = Config::from_toml("k.toml", text, Some(&dir)).unwrap_err();
        let keys: Vec<_> = errs.iter().map(|e| e.key.as_str()).collect();
        assert_eq!(keys, vec!["kerberos.keytab", "kerberos.principal"]);
        assert!(errs[0].fix.contains("chmod 600"), "{}", errs[0]);

        let errs = Config::from_toml("k.toml", "[kerberos]\nntlm = false\n", None).unwrap_err();
        assert_eq!(errs[0].key, "kerberos.keytab");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// One section of docs/CONFIGURATION.md: its heading as TOML writes it
    /// and the rows (key, default, values) of the table under it.
    struct DocSection {
        heading: String,
        rows: Vec<[String; 3]>,
    }

    /// The sections of docs/CONFIGURATION.md: headings `## top level` and
    /// `## [name]` / `## [[name]]`, each with the first table under it.
    fn doc_sections(doc: &str) -> Vec<DocSection> {
        let mut sections: Vec<DocSection> = Vec::new();
        // Rows are read until the first table under a heading ends.
        let mut reading = false;
        for line in doc.lines() {
            if let Some(title) = line.strip_prefix("## ") {
                reading = title == "top level" || title.starts_with('[');
                if reading {
                    sections.push(DocSection {
                        heading: title.to_string(),
                        rows: Vec::new(),
                    });
                }
                continue;
            }
            let Some(section) = sections.last_mut().filter(|_| reading) else {
                continue;
            };
            if line.starts_with("| `") {
                let cells: Vec<String> = line
                    .trim_matches('|')
                    .split('|')
                    .map(|c| c.trim().to_string())
                    .collect();
                assert_eq!(cells.len(), 4, "not four columns: {line}");
                let key = cells[0].trim_matches('`').to_string();
                section.rows.push([key, cells[1].clone(), cells[2].clone()]);
            } else if !line.starts_with('|') && !section.rows.is_empty() {
                reading = false;
            }
        }
        sections
    }

    /// The keys serde names in "unknown field `x`, expected one of `a`, `b`".
    fn expected_keys(problem: &str) -> std::collections::BTreeSet<String> {
        let (_, expected) = problem
            .split_once("expected")
            .unwrap_or_else(|| panic!("no list of keys in: {problem}"));
        expected
            .split('`')
            .skip(1)
            .step_by(2)
            .map(String::from)
            .collect()
    }

    /// A literal in backticks and nothing else (a default that is a value).
    fn literal(cell: &str) -> Option<&str> {
        let inner = cell.strip_prefix('`')?.strip_suffix('`')?;
        (!inner.contains('`')).then_some(inner)
    }

    /// "`A` to `B`...": an integer range.
    fn int_range(cell: &str) -> Option<(u64, u64)> {
        let (a, rest) = cell.strip_prefix('`')?.split_once('`')?;
        let (b, _) = rest.strip_prefix(" to `")?.split_once('`')?;
        Some((a.parse().ok()?, b.parse().ok()?))
    }

    /// docs/CONFIGURATION.md is checked against this code, so it cannot
    /// drift: each section lists exactly the keys the parser accepts (read
    /// from the parser's own refusal of an unknown key), each documented
    /// default gives the same configuration as leaving the key out, and
    /// each documented integer range is the one enforced.
    #[test]
    fn configuration_md_lists_every_key() {
        use std::collections::BTreeSet;
        use std::os::unix::fs::PermissionsExt;
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/CONFIGURATION.md");
        let doc = std::fs::read_to_string(path).expect("docs/CONFIGURATION.md");
        let sections = doc_sections(&doc);
        let dir = std::env::temp_dir().join(format!("nimbus-cfg-doc-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let keytab = dir.join("cifs.keytab");
        std::fs::write(&keytab, b"\x05\x02").unwrap();
        std::fs::set_permissions(&keytab, std::fs::Permissions::from_mode(0o600)).unwrap();
        // Per section: the least valid text that holds it, and the prefix
        // its keys have in errors.
        let minimal = |heading: &str| -> (String, &'static str) {
            match heading {
                "top level" => (String::new(), ""),
                "[security]" => ("[security]\n".into(), "security."),
                "[limits]" => ("[limits]\n".into(), "limits."),
                "[[share]]" => (
                    format!("[[share]]\nname = \"x\"\npath = \"{}\"\n", dir.display()),
                    "share[0].",
                ),
                "[cluster]" => (
                    "[cluster]\netcd = [\"http://127.0.0.1:2379\"]\nnode = \"n1\"\n\
                     advertise = \"127.0.0.2:4450\"\n"
                        .into(),
                    "cluster.",
                ),
                "[metrics]" => ("[metrics]\n".into(), "metrics."),
                "[witness]" => ("[witness]\n".into(), "witness."),
                "[kerberos]" => (
                    format!("[kerberos]\nkeytab = \"{}\"\n", keytab.display()),
                    "kerberos.",
                ),
                other => panic!("docs/CONFIGURATION.md: no minimal text for section {other}"),
            }
        };
        let parse = |text: &str| Config::from_toml("doc.toml", text, None);
        let headings: Vec<_> = sections.iter().map(|s| s.heading.as_str()).collect();
        assert!(headings.contains(&"top level"), "{headings:?}");
        for section in &sections {
            let (base, prefix) = minimal(&section.heading);
            let shown = |text: &str| format!("{:?}", parse(text).unwrap());
            let without = shown(&base);
            // (a) The keys: the parser names those it accepts when it
            // refuses one it does not know.
            let errs = parse(&format!("{base}zz_not_a_key = 1\n")).unwrap_err();
            let code = expected_keys(&errs[0].problem);
            let mut documented: BTreeSet<String> = BTreeSet::new();
            for row in &section.rows {
                assert!(
                    documented.insert(row[0].clone()),
                    "{}: `{}` listed twice",
                    section.heading,
                    row[0]
                );
            }
            if section.heading == "top level" {
                // The other sections are keys of the top level too.
                for s in sections.iter().filter(|s| s.heading != "top level") {
                    documented.insert(s.heading.trim_matches(['[', ']']).to_string());
                }
            }
            assert_eq!(
                code,
                documented,
                "docs/CONFIGURATION.md ## {}: keys the code accepts but the table lacks: {:?}; \
                 keys the table lists but the code refuses: {:?}",
                section.heading,
                code.difference(&documented).collect::<Vec<_>>(),
                documented.difference(&code).collect::<Vec<_>>()
            );
            for [key, default, values] in &section.rows {
                // (b) A documented default, written out, changes nothing.
                if let Some(value) = literal(default) {
                    let text = format!("{base}{key} = {value}\n");
                    let with = parse(&text).unwrap_or_else(|e| {
                        panic!("{}: `{key} = {value}` refused: {e:?}", section.heading)
                    });
                    assert_eq!(
                        format!("{with:?}"),
                        without,
                        "{}: `{key} = {value}` is not the default",
                        section.heading
                    );
                }
                // (c) A documented range is the one enforced: the first
                // value past each end is refused, and the fix names both
                // ends.
                if let Some((lo, hi)) = int_range(values) {
                    let full = format!("{prefix}{key}");
                    let errs = parse(&format!("{base}{key} = {}\n", hi + 1))
                        .err()
                        .unwrap_or_else(|| panic!("{full} = {} accepted", hi + 1));
                    let range = format!("from {lo} to {hi}");
                    assert!(
                        errs.iter().any(|e| e.key == full && e.fix.contains(&range)),
                        "{full} = {}: no error saying \"{range}\": {errs:?}",
                        hi + 1
                    );
                    if lo > 0 {
                        let errs = parse(&format!("{base}{key} = {}\n", lo - 1))
                            .err()
                            .unwrap_or_else(|| panic!("{full} = {} accepted", lo - 1));
                        assert!(errs.iter().any(|e| e.key == full), "{errs:?}");
                    }
                }
            }
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn unknown_keys_are_refused_with_a_line() {
        let errs =
            Config::from_toml("x.toml", "listen = []\nsigning = \"required\"\n", None).unwrap_err();
        assert_eq!(errs.len(), 1);
        assert!(errs[0].problem.contains("signing"), "{}", errs[0]);
    }
}
