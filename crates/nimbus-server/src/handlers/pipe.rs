//! The SMB2 commands on a named pipe of IPC$: CREATE (MS-SMB2 3.3.5.9,
//! a pipe name instead of a path), WRITE and READ (3.3.5.13, 3.3.5.12),
//! FSCTL_PIPE_TRANSCEIVE (3.3.5.15.4) and CLOSE. The pipes carry DCE/RPC
//! for share browsing and name lookups (nimbus-rpc: srvsvc, wkssvc,
//! lsarpc); an answer longer than
//! the client's read is returned in parts with STATUS_BUFFER_OVERFLOW,
//! as a message-mode pipe does.
//!
//! A client may write requests and never read their answers, so what the
//! pipes hold is bounded twice: a session opens at most
//! `limits.max_pipes_per_session` of them, and what they hold unread
//! counts against their connection's memory budget (`crate::held_bytes`),
//! past which a write fails rather than the server grow.

use std::sync::{Arc, Mutex};

use nimbus_rpc::{
    Account, Clock, ConnectionEntry, FileEntry, Host, HostSource, Pipe, Service, SessionEntry,
    ShareEntry, ShareKind, Sid,
};
use nimbus_wire::close::{CloseRequest, CloseResponse};
use nimbus_wire::create::{CreateAction, CreateRequest, CreateResponse, FileTimesAndSizes};
use nimbus_wire::fscc::attributes;
use nimbus_wire::ioctl::{encode_ioctl_response, IoctlRequest};
use nimbus_wire::read::{encode_read_response_head, ReadRequest};
use nimbus_wire::write::{encode_write_response, WriteRequest};
use nimbus_wire::{FileId, NtStatus};

use super::check_credit_charge;
use crate::config::EncryptionPolicy;
use crate::ctx::{Ctx, HandlerResult};
use crate::held_bytes::HeldCharge;
use crate::session::{HeldPipe, PipeOpen, Session, SessionState};
use crate::sync::lock;

/// Whether the request runs on IPC$, whose file ids are pipes.
pub fn on_ipc(ctx: &Ctx<'_>) -> bool {
    ctx.tree.as_ref().is_some_and(|t| t.share.is_ipc())
}

pub fn create(ctx: &mut Ctx<'_>, req: &CreateRequest, out: &mut Vec<u8>) -> HandlerResult {
    let Some(service) = Service::by_pipe_name(&req.name) else {
        tracing::debug!("{}: no pipe \"{}\" on IPC$", ctx.conn.peer, req.name);
        return Err(NtStatus::OBJECT_NAME_NOT_FOUND);
    };
    let session = ctx.session()?.clone();
    let tree_id = ctx.tree()?.id;
    let limits = &ctx.server.config().limits;
    let mut pipes = lock(&session.pipes);
    let opens = lock(&session.opens);
    if pipes.len() + opens.len() >= limits.max_open_files_per_session {
        return Err(NtStatus::TOO_MANY_OPENED_FILES);
    }
    if pipes.len() >= limits.max_pipes_per_session {
        tracing::warn!(
            "{}: pipe \"{}\" refused: session {:#x} has {} pipes open \
             (limits.max_pipes_per_session)",
            ctx.conn.peer,
            req.name,
            session.id,
            pipes.len()
        );
        return Err(NtStatus::INSUFFICIENT_RESOURCES);
    }
    let persistent = ctx.server.new_open_id();
    let volatile = ctx.server.new_volatile_id(persistent, |id| {
        pipes.contains_key(&id) || opens.contains_key(&id)
    });
    drop(opens);
    let file_id = FileId {
        persistent,
        volatile,
    };
    pipes.insert(
        volatile,
        Arc::new(PipeOpen {
            file_id,
            tree_id,
            pipe: Mutex::new(HeldPipe {
                pipe: Pipe::with_security(
                    service,
                    ctx.server.auth.clone(),
                    ctx.conn.local.ip(),
                    Some(crate::rpc_logon_gate::ServerLogonGate::for_client(
                        ctx.server.clone(),
                        ctx.conn.peer.ip(),
                    )),
                ),
                charge: HeldCharge::default(),
            }),
        }),
    );
    drop(pipes);
    ctx.chain_file_id = Some(file_id);
    CreateResponse {
        oplock_level: 0,
        create_action: CreateAction::Opened,
        info: FileTimesAndSizes {
            allocation_size: 4096,
            file_attributes: attributes::NORMAL,
            ..FileTimesAndSizes::default()
        },
        file_id,
        contexts: Vec::new(),
    }
    .encode(out);
    Ok(NtStatus::SUCCESS)
}

/// The pipe a request names, on the tree it runs on.
fn find(ctx: &mut Ctx<'_>, id: FileId) -> Result<Arc<PipeOpen>, NtStatus> {
    let id = ctx.resolve_file_id(id)?;
    let pipe = lock(&ctx.session()?.pipes)
        .get(&id.volatile)
        .cloned()
        .ok_or(NtStatus::FILE_CLOSED)?;
    if pipe.file_id != id || Some(pipe.tree_id) != ctx.tree.as_ref().map(|t| t.id) {
        return Err(NtStatus::FILE_CLOSED);
    }
    ctx.chain_file_id = Some(id);
    Ok(pipe)
}

/// The server as this session may see it through the pipes: its
/// description for srvsvc and wkssvc, built only when a call needs it;
/// for an administrator its sessions, tree connects and open files; and
/// the Unix accounts lsarpc names.
struct View<'a> {
    server: &'a std::sync::Arc<crate::server::Server>,
    guest: bool,
    admin: bool,
}

fn view<'a>(ctx: &Ctx<'a>) -> Result<View<'a>, NtStatus> {
    let (guest, admin) = match &*lock(&ctx.session()?.state) {
        SessionState::Valid(a) => (a.guest, a.token.is_administrator()),
        SessionState::InProgress { .. } => return Err(NtStatus::USER_SESSION_DELETED),
    };
    Ok(View {
        server: ctx.server,
        guest,
        admin,
    })
}

/// Seconds of a duration, as the 32-bit counts of MS-SRVS.
fn seconds(d: std::time::Duration) -> u32 {
    u32::try_from(d.as_secs()).unwrap_or(u32::MAX)
}

/// A session's client address and user, as srvsvc lists them; None for a
/// session still logging on.
fn session_who(s: &Session) -> Option<(String, String, bool)> {
    let (user, guest) = match &*lock(&s.state) {
        SessionState::Valid(a) => (a.user.clone(), a.guest),
        SessionState::InProgress { .. } => return None,
    };
    let client = s
        .connections()
        .first()
        .map(|c| c.peer().ip().to_canonical().to_string())
        .unwrap_or_default();
    Some((client, user, guest))
}

/// The local zone's offset, in minutes west of UTC (TIME_OF_DAY_INFO
/// tod_timezone).
fn minutes_west_of_utc() -> i32 {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs();
    let Ok(t) = libc::time_t::try_from(now) else {
        return 0;
    };
    // SAFETY: localtime_r reads `t` and fills `tm`, both ours, and keeps
    // neither.
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    if unsafe { libc::localtime_r(&t, &mut tm) }.is_null() {
        return 0;
    }
    i32::try_from(-tm.tm_gmtoff / 60).unwrap_or(0)
}

impl HostSource for View<'_> {
    fn host(&self) -> Host {
        let server = self.server;
        let uses = server.sessions.trees_by_share();
        Host {
            name: server.config().server_name.to_uppercase(),
            workgroup: server.config().workgroup.to_uppercase(),
            comment: server.config().server_comment.clone(),
            shares: server
                .shares()
                .iter()
                .map(|s| ShareEntry {
                    name: s.name.clone(),
                    kind: if s.is_ipc() {
                        ShareKind::Ipc
                    } else {
                        ShareKind::Disk
                    },
                    comment: s.settings().comment.clone(),
                    current_uses: uses.get(&s.name).copied().unwrap_or(0),
                    encrypt_data: s.encryption() != EncryptionPolicy::Off,
                })
                .collect(),
            may_enumerate: self.may_look_up(),
        }
    }

    /// Guests see the list, and translate names, only where the server
    /// serves guests at all, as anonymous enumeration is refused on
    /// Windows.
    fn may_look_up(&self) -> bool {
        !self.guest || self.server.shares().iter().any(|s| s.guest_ok)
    }

    fn is_admin(&self) -> bool {
        self.admin
    }

    fn sessions(&self) -> Vec<SessionEntry> {
        let mut sessions = self.server.sessions.all();
        sessions.sort_by_key(|s| s.id);
        sessions
            .iter()
            .filter_map(|s| {
                let (client, user, guest) = session_who(s)?;
                Some(SessionEntry {
                    client,
                    user,
                    guest,
                    opens: lock(&s.opens).len() as u32,
                    seconds: seconds(s.started.elapsed()),
                    idle_seconds: seconds(s.idle()),
                })
            })
            .collect()
    }

    fn connections(&self) -> Vec<ConnectionEntry> {
        let mut sessions = self.server.sessions.all();
        sessions.sort_by_key(|s| s.id);
        let mut out = Vec::new();
        for s in &sessions {
            let Some((client, user, _)) = session_who(s) else {
                continue;
            };
            let mut trees: Vec<Arc<crate::session::Tree>> =
                lock(&s.trees).values().cloned().collect();
            trees.sort_by_key(|t| t.id);
            let opens: Vec<u32> = lock(&s.opens).values().map(|o| o.tree_id()).collect();
            out.extend(trees.iter().map(|t| ConnectionEntry {
                id: t.id,
                share: t.share.name.clone(),
                kind: if t.share.is_ipc() {
                    ShareKind::Ipc
                } else {
                    ShareKind::Disk
                },
                client: client.clone(),
                user: user.clone(),
                opens: opens.iter().filter(|&&id| id == t.id).count() as u32,
                seconds: seconds(t.connected.elapsed()),
            }));
        }
        out
    }

    /// Every open file, with its path on the server (as Windows gives the
    /// local path); the named pipes of IPC$ are not listed.
    fn open_files(&self) -> Vec<FileEntry> {
        let server = self.server;
        let mut opens = server.opens.matching(|_| true);
        opens.sort_by_key(|o| o.open_id);
        opens
            .iter()
            .map(|o| {
                let (_, user, _) = server.open_owner(o);
                let relative = o.path();
                let mut path = match &o.share.fs {
                    Some(fs) if !relative.is_empty() => {
                        fs.root_path().join(&relative).display().to_string()
                    }
                    Some(fs) => fs.root_path().display().to_string(),
                    None => relative,
                };
                if let Some(stream) = &o.stream {
                    path.push(':');
                    path.push_str(&lock(&stream.name));
                }
                FileEntry {
                    // The volatile FileId's low half: unique among opens
                    // of this server as far as 2^32 opens go.
                    id: o.volatile_id() as u32,
                    access: o.access,
                    locks: server.locks.held_by(o.file_key, o.open_id).len() as u32,
                    path,
                    user,
                }
            })
            .collect()
    }

    fn clock(&self) -> Clock {
        let since_start =
            crate::server::now_filetime().saturating_sub(self.server.start_time) / 10_000;
        Clock {
            now: std::time::SystemTime::now(),
            // Wraps after 49.7 days, as Windows' tick count does.
            msecs: since_start as u32,
            timezone_minutes: minutes_west_of_utc(),
        }
    }

    fn account_by_sid(&self, sid: &Sid) -> Option<Account> {
        let server = self.server;
        crate::accounts::machine_by_sid(&server.auth, &server.config().server_name, sid)
            .or_else(|| crate::accounts::by_sid(sid))
    }

    fn account_by_name(&self, domain: Option<&str>, name: &str) -> Option<Account> {
        let server = self.server;
        crate::accounts::machine_by_name(&server.auth, &server.config().server_name, domain, name)
            .or_else(|| crate::accounts::by_name(domain, name))
    }
}

/// Hands what the client wrote to the pipe, then counts what the pipe
/// holds against the connection's memory budget
/// (`limits.max_connection_memory_bytes`, `crate::held_bytes`). A pipe
/// that would take the connection past it is shut, its answers dropped,
/// and the write fails with STATUS_INSUFFICIENT_RESOURCES: its client
/// writes without reading, and the server does not grow for it.
fn write_into(ctx: &Ctx<'_>, held: &mut HeldPipe, data: &[u8]) -> Result<(), NtStatus> {
    let host = view(ctx)?;
    let written = held.pipe.write(data, &host);
    let budget = &ctx.conn.held;
    if !held.charge.set(budget, held.pipe.buffered()) {
        held.pipe.shut();
        held.charge.shrink_to(0);
        tracing::warn!(
            "{}: RPC pipe shut: its answers would take what this connection holds \
             unread past {} bytes (limits.max_connection_memory_bytes)",
            ctx.conn.peer,
            budget.max()
        );
        return Err(NtStatus::INSUFFICIENT_RESOURCES);
    }
    if let Err(e) = written {
        tracing::info!("{}: RPC pipe closed: {}", ctx.conn.peer, e.0);
        return Err(NtStatus::PIPE_DISCONNECTED);
    }
    Ok(())
}

pub fn write(ctx: &mut Ctx<'_>, req: &WriteRequest<'_>, out: &mut Vec<u8>) -> HandlerResult {
    let open = find(ctx, req.file_id)?;
    check_credit_charge(ctx, req.data.len() as u32)?;
    write_into(ctx, &mut lock(&open.pipe), req.data)?;
    encode_write_response(out, req.data.len() as u32);
    Ok(NtStatus::SUCCESS)
}

pub fn read(ctx: &mut Ctx<'_>, req: &ReadRequest, out: &mut Vec<u8>) -> HandlerResult {
    let open = find(ctx, req.file_id)?;
    check_credit_charge(ctx, req.length)?;
    // Every answer is queued by the write it answers: nothing queued is
    // nothing to wait for.
    let r = {
        let mut held = lock(&open.pipe);
        let r = held.pipe.read(req.length as usize);
        let left = held.pipe.buffered();
        held.charge.shrink_to(left);
        r
    };
    let Some(r) = r else {
        return Err(NtStatus::PIPE_EMPTY);
    };
    encode_read_response_head(out, r.data.len() as u32);
    out.extend_from_slice(&r.data);
    Ok(if r.more {
        NtStatus::BUFFER_OVERFLOW
    } else {
        NtStatus::SUCCESS
    })
}

/// MS-SMB2 3.3.5.15.4: a write and a read of the answer in one request.
pub fn transceive(ctx: &mut Ctx<'_>, req: &IoctlRequest<'_>, out: &mut Vec<u8>) -> HandlerResult {
    let open = find(ctx, req.file_id)?;
    let mut held = lock(&open.pipe);
    write_into(ctx, &mut held, req.input)?;
    let r = held.pipe.read(req.max_output_response as usize);
    let left = held.pipe.buffered();
    held.charge.shrink_to(left);
    drop(held);
    let (data, more) = r.map_or((Vec::new(), false), |r| (r.data, r.more));
    encode_ioctl_response(out, req.ctl_code, open.file_id, &data);
    Ok(if more {
        NtStatus::BUFFER_OVERFLOW
    } else {
        NtStatus::SUCCESS
    })
}

pub fn close(ctx: &mut Ctx<'_>, req: &CloseRequest, out: &mut Vec<u8>) -> HandlerResult {
    let open = find(ctx, req.file_id)?;
    lock(&ctx.session()?.pipes).remove(&open.file_id.volatile);
    CloseResponse {
        flags: 0,
        info: FileTimesAndSizes::default(),
    }
    .encode(out);
    Ok(NtStatus::SUCCESS)
}
