//! MS-SMB2 3.3.5.9 Receiving an SMB2 CREATE Request.
//!
//! A CREATE goes through stages, each a module, in the order Windows takes
//! them (and Samba's smb2_create.c):
//! 1. `request`: the request and its contexts, read and checked before
//!    anything on disk is looked at: `Create`;
//! 2. `found`: what the name holds, and what the caller may do to it:
//!    `Found`;
//! 3. `contend`: the file's share modes and other clients' caching; the
//!    CREATE may wait here for their breaks: `Admitted`;
//! 4. `open`: the file opened or made on disk: `Opened`;
//! 5. `finish`: what follows the open (attributes, descriptor, EAs, change
//!    notifications), the open registered and its caching granted:
//!    `Finished`;
//! 6. `response`: the open joins its session, and the answer goes out.
//!
//! The create state is `Create` and what each stage adds to it, each a
//! value of its own: nothing can be read before the stage that makes it
//! has run. A stage that fails after `contend` undoes the file's entries
//! (`undo`). Pipe opens leave before stage 1 (`super::pipe`); reconnects
//! and replays of durable opens leave at its start
//! (`super::create_durable`).

mod contend;
mod finish;
mod found;
mod open;
mod request;
mod response;
mod undo;

use nimbus_state::FileKey;
use nimbus_vfs::names::Stream;
use nimbus_wire::create::CreateRequest;
use nimbus_wire::fscc::access;
use nimbus_wire::NtStatus;

use super::create_durable::{self, DurableAsk};
use super::malformed;
use crate::ctx::{Ctx, HandlerResult};
use crate::errors::vfs_status;

/// The rights that write a file's data.
const WRITE_RIGHTS: u32 = access::FILE_WRITE_DATA | access::FILE_APPEND_DATA;

/// Why one attempt at a CREATE did not finish.
enum Failed {
    /// The answer to the client.
    Status(NtStatus),
    /// The name changed between our check and our open (another client
    /// created, replaced or removed it): look again.
    Raced,
    /// The CREATE waits for other clients' breaks (`contend`): answered
    /// with this (STATUS_PENDING) now, and run again once they are
    /// acknowledged.
    Waits(NtStatus),
}

impl From<NtStatus> for Failed {
    fn from(s: NtStatus) -> Failed {
        Failed::Status(s)
    }
}

pub fn handle(ctx: &mut Ctx<'_>, body: &[u8], out: &mut Vec<u8>) -> HandlerResult {
    for attempt in 0..3 {
        match open_or_create(ctx, body, out, attempt == 0) {
            Ok(status) => return Ok(status),
            Err(Failed::Status(status)) => return Err(status),
            Err(Failed::Waits(status)) => return Ok(status),
            Err(Failed::Raced) => continue,
        }
    }
    Err(NtStatus::SHARING_VIOLATION)
}

/// One attempt, through the stages. `first`: the CREATE's first look (a
/// refusal by opens of clients that have gone is waited out once).
fn open_or_create(
    ctx: &mut Ctx<'_>,
    body: &[u8],
    out: &mut Vec<u8>,
    first: bool,
) -> Result<NtStatus, Failed> {
    let req = CreateRequest::parse(body).map_err(malformed)?;
    let tree = ctx.tree()?.clone();
    let session = ctx.session()?.clone();
    let share = tree.share.clone();
    let Some(fs) = share.fs.as_ref() else {
        // IPC$: its names are named pipes.
        return Ok(super::pipe::create(ctx, &req, out)?);
    };
    let smb3 = ctx.conn.negotiated().is_some_and(|n| n.dialect.is_smb3());
    let durable = DurableAsk::parse(&req, smb3)?;
    // A reconnect acts on nothing else the request says: not even its
    // fixed fields are checked (clients send them zeroed).
    if let DurableAsk::Reconnect(how) = durable {
        return Ok(create_durable::reconnect(
            ctx, &req, how, body, out, handle,
        )?);
    }
    let replay_key = match (durable, ctx.conn.negotiated()) {
        (DurableAsk::V2(r), Some(n)) => Some((n.client_guid, r.create_guid)),
        _ => None,
    };
    if let Some(key) = replay_key {
        if let Some(status) = create_durable::replay(ctx, &req, key, out)? {
            return Ok(status);
        }
    }
    let on = request::On {
        tree: &tree,
        session: &session,
        share: &share,
        fs,
    };
    let mut create = request::read(ctx, req, on, durable, replay_key)?;
    // A named stream's directory was read with the request, the first of
    // two reads around its lookup (which goes through the file's own
    // descriptor, not noting its directory).
    let _stream_scope = crate::directory_scope::through(create.directory);
    let mut found = found::look(ctx, &create)?;
    let _through = match create.stream {
        Stream::Named(_) => {
            stream_directory_unchanged(ctx, &create)?;
            None
        }
        _ => {
            create.directory = directory_looked_in(ctx, &create, &mut found)?;
            crate::directory_scope::through(create.directory)
        }
    };
    // Copied out of `ctx`, so that what `contend` keeps borrows the server
    // and not the request's context.
    let server = ctx.server;
    let admitted = contend::contend(ctx, server, &create, &found, body, first)?;
    let opened = open::open(ctx, &create, &found, &admitted)?;
    let finished = finish::finish(ctx, &create, found, admitted, opened)?;
    Ok(response::answer(ctx, create, finished, out)?)
}

/// The directory a name other than a named stream's was looked up in, on
/// a cluster node: the store's lookups of the file then compare the claim
/// of the very directory the name came from (docs/SCALING.md, "New
/// files"), known from the lookup's own descriptor, with no read of the
/// directory by name (four system calls) before it. A symlink's file is
/// its target's, whose directory is read by name: before and after the
/// name is looked up again, and an open between two reads that differ
/// (the directory renamed meanwhile) is made again.
fn directory_looked_in(
    ctx: &Ctx<'_>,
    create: &request::Create<'_>,
    found: &mut found::Found,
) -> Result<Option<FileKey>, Failed> {
    if let Some(st) = &found.directory {
        return Ok(crate::directory_scope::key_of_directory(st));
    }
    let read = || {
        crate::directory_scope::directory_of(ctx.server, create.fs, &create.path)
            .map_err(|e| vfs_status(&e))
    };
    // On a node alone, and for the share's root: no directory.
    let Some(before) = read()? else {
        return Ok(None);
    };
    *found = found::look(ctx, create)?;
    let seen = match &found.directory {
        Some(st) => crate::directory_scope::key_of_directory(st),
        None => read().ok().flatten(),
    };
    if seen != Some(before) {
        tracing::debug!("create: the directory of the name changed during the open");
        return Err(Failed::Raced);
    }
    Ok(Some(before))
}

/// A named stream's file was looked up in the directory read with the
/// request, not in one renamed into its place meanwhile, whose claim the
/// lookups would not compare: read again by name (a stream's lookup goes
/// through its file's own descriptor, which does not note its directory).
fn stream_directory_unchanged(ctx: &Ctx<'_>, create: &request::Create<'_>) -> Result<(), Failed> {
    let Some(dir) = create.directory else {
        return Ok(());
    };
    let seen = crate::directory_scope::directory_of(ctx.server, create.fs, &create.path)
        .ok()
        .flatten();
    if seen != Some(dir) {
        tracing::debug!("create: the directory of the stream's file changed during the open");
        return Err(Failed::Raced);
    }
    Ok(())
}
