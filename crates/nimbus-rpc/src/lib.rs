//! DCE/RPC over SMB named pipes (MS-RPCE, C706), for the services a
//! client browsing a server asks IPC$ for: srvsvc (MS-SRVS: shares,
//! server information), wkssvc (MS-WKST: workstation information) and
//! lsarpc (MS-LSAT: the names of the SIDs in security descriptors); and
//! over TCP (`ip_tcp`, authenticated) for the witness service (MS-SWN,
//! `witness`).
//!
//! The crate does no I/O. The server opens a [`Pipe`] for a CREATE of
//! `srvsvc`, `wkssvc` or `lsarpc` on IPC$, hands it what the client writes (WRITE,
//! or FSCTL_PIPE_TRANSCEIVE) and returns what it has to read, one PDU per
//! message, with a [`Host`] describing the server as the caller may see
//! it.
//!
//! No published crate fit: `dcerpc` and its `ms-ndr` are client stacks
//! (an SMB client, tokio and NTLM come with them) and young; what a
//! server needs here is a small PDU codec and an NDR writer for a
//! handful of calls, kept short and fuzzed.

pub mod epmapper;
mod fragments;
pub mod ip_tcp;
pub mod lsarpc;
pub mod ndr;
pub mod pdu;
pub mod pipe;
mod security;
pub use security::LogonGate;
pub mod srvsvc;
pub mod witness;
pub mod wkssvc;

pub use lsarpc::{Account, SidNameUse};
pub use nimbus_wire::dtyp::Sid;
pub use pipe::{Pipe, PipeError, ReadResult};

/// Why a PDU or a stub was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RpcError {
    /// The PDU breaks C706/MS-RPCE (what, for the log).
    Protocol(&'static str),
    /// The stub does not decode as the operation's parameters.
    BadStub,
}

/// C706 Appendix E and MS-RPCE 2.2.2.11: the fault statuses used here.
pub mod fault {
    pub const OP_RNG_ERROR: u32 = 0x1C01_0002;
    pub const UNK_IF: u32 = 0x1C01_0003;
    pub const PROTO_ERROR: u32 = 0x1C01_000B;
    /// RPC_X_BAD_STUB_DATA, as Windows answers a stub that does not decode.
    pub const BAD_STUB_DATA: u32 = 0x0000_06F7;
}

/// Win32 error codes the calls return (MS-ERREF 2.2).
pub mod werror {
    pub const OK: u32 = 0;
    pub const ACCESS_DENIED: u32 = 5;
    pub const INVALID_LEVEL: u32 = 124;
    pub const MORE_DATA: u32 = 234;
    pub const INVALID_PARAMETER: u32 = 87;
    pub const NET_NAME_NOT_FOUND: u32 = 2310;
    pub const DEVICE_NOT_SHARED: u32 = 2311;
    pub const CLIENT_NAME_NOT_FOUND: u32 = 2312;
    pub const USER_NOT_FOUND: u32 = 2221;
}

/// MS-SRVS 2.2.2.6 and MS-WKST 2.2.1.4: the platform id of the NT family.
pub(crate) const PLATFORM_ID_NT: u32 = 500;
/// The version reported by both services: that of the Windows releases
/// whose SMB dialects Nimbus speaks (3.1.1).
pub(crate) const VERSION_MAJOR: u32 = 10;
pub(crate) const VERSION_MINOR: u32 = 0;

/// What a share is, for its `shi*_type` (MS-SRVS 2.2.2.4).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShareKind {
    Disk,
    Ipc,
}

/// One share as the services report it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShareEntry {
    pub name: String,
    pub kind: ShareKind,
    pub comment: String,
    /// Tree connects to it now, on this server.
    pub current_uses: u32,
    /// Data is encrypted on it (SHI1005_FLAGS_ENCRYPT_DATA).
    pub encrypt_data: bool,
}

/// The server as the calling session may see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Host {
    /// NetBIOS name, as the server's `server_name`.
    pub name: String,
    pub workgroup: String,
    pub comment: String,
    /// Every share, IPC$ included, in the order the server lists them.
    pub shares: Vec<ShareEntry>,
    /// The caller may list the shares (an authenticated user, or a guest
    /// where guests are served).
    pub may_enumerate: bool,
}

/// One SMB session, as NetrSessionEnum reports it (MS-SRVS 2.2.4.15-19).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionEntry {
    /// The client's address (an IP address: Nimbus knows no client
    /// computer names), without the leading `\\`.
    pub client: String,
    /// The user's name; empty for an anonymous session.
    pub user: String,
    pub guest: bool,
    /// Files the session has open.
    pub opens: u32,
    /// Seconds since the session was established.
    pub seconds: u32,
    /// Seconds since its last request.
    pub idle_seconds: u32,
}

/// One tree connect, as NetrConnectionEnum reports it (MS-SRVS 2.2.4.1-2).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectionEntry {
    pub id: u32,
    pub share: String,
    pub kind: ShareKind,
    /// Its session's client address and user (see `SessionEntry`).
    pub client: String,
    pub user: String,
    /// Files open through it.
    pub opens: u32,
    /// Seconds since the tree connect.
    pub seconds: u32,
}

/// One open file, as NetrFileEnum reports it (MS-SRVS 2.2.4.7-8).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileEntry {
    pub id: u32,
    /// The access granted (MS-SMB2 2.2.13.1 access mask).
    pub access: u32,
    pub locks: u32,
    /// Where the file is on the server.
    pub path: String,
    pub user: String,
}

/// The server's clock for NetrRemoteTOD.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Clock {
    pub now: std::time::SystemTime,
    /// Milliseconds since the server started (TIME_OF_DAY_INFO tod_msecs,
    /// "from an arbitrary starting point").
    pub msecs: u32,
    /// Minutes west of UTC of the server's local time (tod_timezone).
    pub timezone_minutes: i32,
}

/// Where a pipe gets the server's description when a call needs it: a
/// `Host`, or a closure that builds one (the server's walks its sessions,
/// so it is not built for a BIND or a fragment); and the accounts lsarpc
/// translates, beyond the well-known ones it knows itself.
pub trait HostSource {
    fn host(&self) -> Host;

    /// The caller may translate SIDs and names: whoever may list the
    /// shares.
    fn may_look_up(&self) -> bool {
        self.host().may_enumerate
    }

    fn account_by_sid(&self, _sid: &Sid) -> Option<Account> {
        None
    }

    /// The caller is an administrator of the server (BUILTIN\Administrators
    /// in its token): it may list sessions, connections and open files.
    fn is_admin(&self) -> bool {
        false
    }

    fn sessions(&self) -> Vec<SessionEntry> {
        Vec::new()
    }

    fn connections(&self) -> Vec<ConnectionEntry> {
        Vec::new()
    }

    fn open_files(&self) -> Vec<FileEntry> {
        Vec::new()
    }

    fn clock(&self) -> Clock {
        Clock {
            now: std::time::SystemTime::now(),
            msecs: 0,
            timezone_minutes: 0,
        }
    }

    /// `domain` as the client wrote it (`DOMAIN\name`), if it did.
    fn account_by_name(&self, _domain: Option<&str>, _name: &str) -> Option<Account> {
        None
    }
}

impl HostSource for Host {
    fn host(&self) -> Host {
        self.clone()
    }
}

impl<F: Fn() -> Host> HostSource for F {
    fn host(&self) -> Host {
        self()
    }
}

/// The interface a pipe serves, chosen by the pipe's name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Service {
    Srvsvc,
    Wkssvc,
    Lsarpc,
}

impl Service {
    /// The service behind a pipe name as a CREATE on IPC$ gives it.
    pub fn by_pipe_name(name: &str) -> Option<Service> {
        let name = name.trim_start_matches('\\');
        let name = if name.len() > 5 && name[..5].eq_ignore_ascii_case("PIPE\\") {
            &name[5..]
        } else {
            name
        };
        if name.eq_ignore_ascii_case("srvsvc") {
            Some(Service::Srvsvc)
        } else if name.eq_ignore_ascii_case("wkssvc") {
            Some(Service::Wkssvc)
        } else if name.eq_ignore_ascii_case("lsarpc") || name.eq_ignore_ascii_case("lsass") {
            Some(Service::Lsarpc)
        } else {
            None
        }
    }

    /// The port spec a BIND_ACK names.
    pub fn endpoint(self) -> &'static str {
        match self {
            Service::Srvsvc => "\\PIPE\\srvsvc",
            Service::Wkssvc => "\\PIPE\\wkssvc",
            // Windows' name for the process behind lsarpc.
            Service::Lsarpc => "\\PIPE\\lsass",
        }
    }

    pub fn interface(self) -> pdu::SyntaxId {
        match self {
            Service::Srvsvc => srvsvc::INTERFACE,
            Service::Wkssvc => wkssvc::INTERFACE,
            Service::Lsarpc => lsarpc::INTERFACE,
        }
    }

    /// Runs one call: its response stub, or a fault status. `handles`
    /// are the pipe's open LSA policy handles.
    pub fn call<H: HostSource + ?Sized>(
        self,
        opnum: u16,
        stub: &[u8],
        host: &H,
        handles: &mut lsarpc::PolicyHandles,
    ) -> Result<Vec<u8>, u32> {
        let result = match self {
            Service::Srvsvc => srvsvc::call(opnum, stub, host),
            Service::Wkssvc => wkssvc::call(opnum, stub, &host.host()),
            Service::Lsarpc => lsarpc::call(opnum, stub, host, handles),
        };
        match result {
            Ok(Some(out)) => Ok(out),
            Ok(None) => Err(fault::OP_RNG_ERROR),
            Err(_) => Err(fault::BAD_STUB_DATA),
        }
    }
}
