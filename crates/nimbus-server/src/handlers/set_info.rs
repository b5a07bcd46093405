//! MS-SMB2 3.3.5.21 Receiving an SMB2 SET_INFO Request.

use std::sync::atomic::Ordering;

use nimbus_state::share_modes::{compatible, STREAM_OPEN};
use nimbus_state::{FileKey, OpenRecord};
use nimbus_vfs::{Identity, Timespec, VfsError};
use nimbus_wire::codec::{utf16le_to_string, Reader};
use nimbus_wire::fscc::{
    access, attributes, file_class, filetime_to_unix, parse_u32, parse_u64, parse_u8, RenameInfo,
    SetBasicInfo,
};
use nimbus_wire::info::{encode_set_info_response, info_type, SetInfoRequest};
use nimbus_wire::NtStatus;

use super::{malformed, require};
use crate::ctx::{Ctx, HandlerResult};
use crate::dosinfo::{ChangeTime, DosInfo, STORED_ATTRIBUTES};
use crate::errors::{sharing_status, vfs_status};
use crate::fileinfo::is_readonly;
use crate::session::{Open, StreamOf};
use crate::sync::lock;
use nimbus_vfs::names::{
    eq_ignore_case, join, parent, to_vfs_path, to_vfs_path_and_stream, Stream,
};

/// MS-FSCC 2.4.11 FILE_DISPOSITION_INFORMATION_EX flags.
const DISPOSITION_EX_DELETE: u32 = 0x1;
const DISPOSITION_EX_IGNORE_READONLY: u32 = 0x10;
/// MS-FSCC 2.4.38.2 FILE_RENAME_INFORMATION_EX flags.
const RENAME_EX_REPLACE_IF_EXISTS: u32 = 0x1;

pub fn handle(ctx: &mut Ctx<'_>, body: &[u8], out: &mut Vec<u8>) -> HandlerResult {
    let req = SetInfoRequest::parse(body).map_err(malformed)?;
    let open = ctx.open(req.file_id)?;
    match req.info_type {
        info_type::FILE => {
            if let Waiting(Some(file)) = set_file_info(ctx, &open, req.info_class, req.buffer)? {
                return super::deferred::defer(ctx, file, body, handle);
            }
        }
        info_type::SECURITY => {
            super::security_info::set(ctx, &open, req.additional_information, req.buffer)?
        }
        // Quotas are not kept.
        info_type::QUOTA => return Err(NtStatus::NOT_SUPPORTED),
        info_type::FILESYSTEM => return Err(NtStatus::INVALID_INFO_CLASS),
        _ => return Err(NtStatus::INVALID_PARAMETER),
    }
    encode_set_info_response(out);
    Ok(NtStatus::SUCCESS)
}

fn to_timespec(ft: u64) -> Option<Timespec> {
    // 0: leave unchanged; all ones / all ones minus one: stop / resume
    // automatic updates, which POSIX cannot express, so leave unchanged.
    if ft == 0 || ft >= u64::MAX - 1 {
        return None;
    }
    let (sec, nsec) = filetime_to_unix(ft);
    Some(Timespec { sec, nsec })
}

/// A FILETIME of FILE_BASIC_INFORMATION that asks for a change: 0 leaves
/// the time alone, -1 and -2 (stop / resume automatic updates) cannot be
/// expressed on POSIX and leave it alone too.
fn explicit_time(ft: u64) -> Option<u64> {
    (ft != 0 && ft < u64::MAX - 1).then_some(ft)
}

/// MS-FSA 2.1.5.15.1 FileBasicInformation.
fn set_basic(ctx: &Ctx<'_>, open: &Open, buf: &[u8]) -> Result<(), NtStatus> {
    let vfs = |e: VfsError| vfs_status(&e);
    require(open, access::FILE_WRITE_ATTRIBUTES)?;
    // A stream's times and attributes are its file's.
    let meta = open.meta();
    let is_dir = open.stream.as_ref().map_or(open.is_dir, |s| s.base_is_dir);
    let b = SetBasicInfo::parse(buf).map_err(malformed)?;
    let times = [
        b.creation_time,
        b.last_access_time,
        b.last_write_time,
        b.change_time,
    ];
    // Negative times other than -1 and -2 are invalid.
    if times.iter().any(|&t| (t as i64) < -2) {
        return Err(NtStatus::INVALID_PARAMETER);
    }
    let a = b.attributes;
    if a & !(attributes::SETTABLE | attributes::DIRECTORY) != 0
        || (!is_dir && a & attributes::DIRECTORY != 0)
        || (is_dir && a & attributes::TEMPORARY != 0)
    {
        return Err(NtStatus::INVALID_PARAMETER);
    }
    let (atime, mtime) = (
        to_timespec(b.last_access_time),
        to_timespec(b.last_write_time),
    );
    if atime.is_some() || mtime.is_some() {
        meta.set_times(atime, mtime).map_err(vfs)?;
    }
    // A write time set stays through this file's pending update and
    // closes; setting anything else makes a pending update now (as
    // Windows 2016 does, even for all-zero times).
    match mtime {
        Some(t) => ctx.server.write_times.set_explicitly(open, t),
        None => ctx.server.write_times.flush(open),
    }
    let mut dos = DosInfo::load(meta);
    let before = dos;
    if let Some(ct) = explicit_time(b.creation_time) {
        dos.create_time = Some(ct);
    }
    if let Some(ct) = explicit_time(b.change_time) {
        let st = meta.stat().map_err(vfs)?;
        dos.change_time = Some(ChangeTime {
            filetime: ct,
            mtime_stamp: st.mtime,
        });
    }
    let mut new_mode = None;
    if a != 0 {
        // Directories keep READONLY with the other attributes: on Windows
        // it does not stop creating files in them, unlike a POSIX mode.
        let stored_mask = if is_dir {
            STORED_ATTRIBUTES | attributes::READONLY
        } else {
            STORED_ATTRIBUTES
        };
        // Only FSCTL_SET_SPARSE changes SPARSE_FILE.
        let sparse = before.stored_or_default(is_dir) & attributes::SPARSE_FILE;
        dos.attributes = Some(a & stored_mask | sparse);
        if !is_dir {
            let st = meta.stat().map_err(vfs)?;
            let want_ro = a & attributes::READONLY != 0;
            if want_ro != is_readonly(st.mode) {
                new_mode = Some(if want_ro {
                    st.mode & !0o222
                } else {
                    st.mode | 0o200
                });
            }
        }
    }
    // Extended attributes need write permission when not running as root:
    // store them while the file is still (or already) writable.
    let clearing_readonly = new_mode.is_some_and(|m| !is_readonly(m));
    if clearing_readonly {
        set_mode(open, new_mode)?;
    }
    if dos != before {
        dos.save(meta).map_err(vfs)?;
    }
    if !clearing_readonly {
        set_mode(open, new_mode)?;
    }
    Ok(())
}

fn set_mode(open: &Open, mode: Option<u32>) -> Result<(), NtStatus> {
    match mode {
        Some(m) => open.meta().set_mode(m).map_err(|e| vfs_status(&e)),
        None => Ok(()),
    }
}

/// Whether a SET_INFO must wait for the breaks on a file (Some) before it
/// can be done.
struct Waiting(Option<FileKey>);

fn set_file_info(
    ctx: &mut Ctx<'_>,
    open: &Open,
    class: u8,
    buf: &[u8],
) -> Result<Waiting, NtStatus> {
    let vfs = |e: VfsError| vfs_status(&e);
    if open.share.read_only() && !matches!(class, file_class::POSITION | file_class::MODE) {
        return Err(NtStatus::ACCESS_DENIED);
    }
    // What reaches the disk is reported by `info_set` (or `renamed`), not
    // again by the disk watch.
    let touches_disk = matches!(
        class,
        file_class::BASIC | file_class::END_OF_FILE | file_class::ALLOCATION | file_class::FULL_EA
    );
    let _own = touches_disk
        .then(|| ctx.server.notify.own_change_of(open))
        .flatten();
    match class {
        file_class::BASIC => set_basic(ctx, open, buf)?,
        file_class::RENAME | file_class::RENAME_EX => {
            require(open, access::DELETE)?;
            let (replace, root, name) = if class == file_class::RENAME {
                let r = RenameInfo::parse(buf).map_err(malformed)?;
                (r.replace_if_exists, r.root_directory, r.name)
            } else {
                let mut r = Reader::new(buf);
                let flags = r.u32().map_err(malformed)?;
                let _ = r.u32().map_err(malformed)?;
                let root = r.u64().map_err(malformed)?;
                let len = r.u32().map_err(malformed)? as usize;
                let name =
                    utf16le_to_string(r.bytes(len).map_err(malformed)?).map_err(malformed)?;
                (flags & RENAME_EX_REPLACE_IF_EXISTS != 0, root, name)
            };
            if root != 0 {
                return Err(NtStatus::INVALID_PARAMETER);
            }
            if let Some(file) = rename(ctx, open, &name, replace)? {
                return Ok(Waiting(Some(file)));
            }
        }
        file_class::DISPOSITION | file_class::DISPOSITION_EX => {
            require(open, access::DELETE)?;
            let (delete, ignore_ro) = if class == file_class::DISPOSITION {
                (parse_u8(buf).map_err(malformed)? != 0, false)
            } else {
                let f = parse_u32(buf).map_err(malformed)?;
                (
                    f & DISPOSITION_EX_DELETE != 0,
                    f & DISPOSITION_EX_IGNORE_READONLY != 0,
                )
            };
            if delete {
                // READONLY is the file's, whichever stream is deleted.
                let st = open.meta().stat().map_err(vfs)?;
                if is_readonly(st.mode) && !st.is_dir && !ignore_ro {
                    return Err(NtStatus::CANNOT_DELETE);
                }
                if open.is_dir && open.handle.has_entries().map_err(vfs)? {
                    return Err(NtStatus::DIRECTORY_NOT_EMPTY);
                }
            }
            ctx.server
                .share_modes
                .set_delete_pending(open.file_key, delete)
                .map_err(|e| sharing_status(&e))?;
            if delete {
                // Holders of cached handles must close them for the file
                // to go (MS-FSA 2.1.5.14.3).
                ctx.server
                    .oplocks
                    .contend_handles(open.file_key, open.open_id);
            } else {
                open.delete_on_close.store(false, Ordering::SeqCst);
            }
        }
        file_class::POSITION => {
            let pos = parse_u64(buf).map_err(malformed)?;
            if pos > i64::MAX as u64 {
                return Err(NtStatus::INVALID_PARAMETER);
            }
            open.position.store(pos, Ordering::Relaxed);
            crate::persist::changed_soon(ctx.server, open);
        }
        file_class::MODE => {
            // MS-FSCC 2.4.26: only these mode bits may be set.
            let m = parse_u32(buf).map_err(malformed)?;
            if m & !0x103E != 0 {
                return Err(NtStatus::INVALID_PARAMETER);
            }
            open.mode.store(m, Ordering::Relaxed);
            crate::persist::changed_soon(ctx.server, open);
        }
        file_class::END_OF_FILE => {
            require(open, access::FILE_WRITE_DATA)?;
            let eof = parse_u64(buf).map_err(malformed)?;
            if open.is_dir {
                return Err(NtStatus::INVALID_PARAMETER);
            }
            // A Mac's AfpInfo keeps its size (crate::apple::afp_info).
            if crate::apple::open_kind(open) == Some(crate::apple::AppleStream::AfpInfo) {
                return crate::apple::afp_info::set_size(eof).map(|()| Waiting(None));
            }
            ctx.server
                .oplocks
                .contend_readers(open.file_key, open.open_id);
            open.handle.set_len(eof).map_err(vfs)?;
            ctx.server.write_times.size_set(open);
        }
        file_class::ALLOCATION => {
            require(open, access::FILE_WRITE_DATA)?;
            let size = parse_u64(buf).map_err(malformed)?;
            if open.is_dir {
                return Err(NtStatus::INVALID_PARAMETER);
            }
            if crate::apple::open_kind(open) == Some(crate::apple::AppleStream::AfpInfo) {
                return crate::apple::afp_info::set_size(size).map(|()| Waiting(None));
            }
            let st = open.handle.stat().map_err(vfs)?;
            // Any change of allocation ends others' cached reads, as on
            // Windows; a smaller one truncates the file (MS-FSA 2.1.5.15.1).
            ctx.server
                .oplocks
                .contend_readers(open.file_key, open.open_id);
            if size < st.size {
                open.handle.set_len(size).map_err(vfs)?;
            } else {
                open.handle.allocate(size).map_err(vfs)?;
            }
            ctx.server.write_times.size_set(open);
        }
        file_class::FULL_EA => {
            require(open, access::FILE_WRITE_EA)?;
            let list = nimbus_wire::ea::parse_full_ea_list(buf)
                .map_err(|_| NtStatus::EA_LIST_INCONSISTENT)?;
            crate::eas::apply(open.meta(), &list)?;
        }
        _ => return Err(NtStatus::INVALID_INFO_CLASS),
    }
    ctx.server.notify.info_set(open, class, buf);
    if matches!(
        class,
        file_class::BASIC | file_class::END_OF_FILE | file_class::ALLOCATION
    ) {
        crate::dir_leases::open_changed(&ctx.server.oplocks, open);
    }
    Ok(Waiting(None))
}

/// MS-FSA 2.1.5.15.14 FileRenameInformation, within one share. Returns
/// the file to wait on when other holders must first give up the handles
/// they cache (the rename is then tried again).
fn rename(
    ctx: &mut Ctx<'_>,
    open: &Open,
    new_name: &str,
    replace: bool,
) -> Result<Option<FileKey>, NtStatus> {
    let fs = open.share.fs.as_ref().ok_or(NtStatus::INVALID_PARAMETER)?;
    if let Some(stream) = &open.stream {
        return rename_stream(ctx, open, stream, new_name, replace).map(|()| None);
    }
    if new_name.starts_with(':') {
        // Naming the unnamed data stream: not a rename Nimbus can do
        // (MS-FSA 2.1.5.15.11.1 lets NTFS turn it into a named stream).
        return Err(NtStatus::INVALID_PARAMETER);
    }
    let from = open.path();
    let to = to_vfs_path(new_name)?;
    // The target directory may be spelled in another case; the new name
    // itself is kept as given (it may be a case-only rename).
    let (dir, leaf) = to.rsplit_once('/').unwrap_or(("", to.as_str()));
    let max_entries = ctx.server.config().limits.max_directory_entries;
    let to = join(&crate::lookup::resolve(fs, dir, max_entries), leaf);
    if to.is_empty() || from.is_empty() {
        return Err(NtStatus::ACCESS_DENIED);
    }
    if to == from {
        return Ok(None);
    }
    // The new name's directory must let this user add it (its stored
    // descriptor, if it has one: crate::acl).
    let token = ctx
        .session()?
        .token()
        .ok_or(NtStatus::USER_SESSION_DELETED)?;
    super::create_security::may_add_to(fs, parent(&to), open.is_dir, &token)?;
    // Adding a name to a directory opens it, implicitly, to add a file
    // (FILE_ADD_FILE, the WRITE_DATA bit) sharing read and write only: an
    // open of the target's directory that holds DELETE access, or that
    // does not share writing, refuses the rename with a sharing violation
    // (smbtorture smb2.oplock.exclusive6, batch19, batch20,
    // smb2.rename.no_share_delete_no_delete_access).
    if let Ok(target_dir) = fs.stat(parent(&to)) {
        let opens = ctx
            .server
            .share_modes
            .record(FileKey {
                dev: target_dir.dev,
                ino: target_dir.ino,
                gen: target_dir.gen,
            })
            .map_err(|e| sharing_status(&e))?
            .opens;
        let implied = |o: &OpenRecord| compatible(o, ADD_FILE, SHARE_READ_WRITE);
        if !opens.iter().all(implied) {
            return Err(NtStatus::SHARING_VIOLATION);
        }
    }
    // A file with open streams keeps its name (Windows, and smbtorture
    // smb2.streams.basefile-rename-with-open-stream).
    let own = ctx
        .server
        .share_modes
        .record(open.file_key)
        .map_err(|e| sharing_status(&e))?;
    if own.opens.iter().any(|o| o.share_access & STREAM_OPEN != 0) {
        return Err(NtStatus::ACCESS_DENIED);
    }
    // A directory with open files beneath it keeps its name (MS-FSA
    // 2.1.5.15.14; smbtorture smb2.rename.rename_dir_openfile), except for
    // a Mac, whose own file systems rename it (the opens below follow it).
    if open.is_dir
        && !ctx.conn.apple.on(&open.share)
        && ctx.server.opens.open_below(fs.root_path(), &from)
    {
        return Err(NtStatus::ACCESS_DENIED);
    }
    let case_only = to.eq_ignore_ascii_case(&from);
    if !case_only {
        if let Ok(target) = fs.stat(&to) {
            if !replace {
                return Err(NtStatus::OBJECT_NAME_COLLISION);
            }
            if target.is_dir {
                return Err(NtStatus::ACCESS_DENIED);
            }
            // A file someone holds open cannot be replaced: looked up as
            // an open of the name would, through its directory's claim.
            // Unreadable only through a link that escapes, dangles or
            // loops: `target` is then the link itself, which no claim
            // covers (only regular files made here are held under one).
            let dir = crate::directory_scope::directory_of(ctx.server, fs, &to).unwrap_or(None);
            let _through = crate::directory_scope::through(dir);
            if held_open(ctx, &target)? {
                return Err(NtStatus::ACCESS_DENIED);
            }
            // Replacing deletes the target: its descriptor (or its
            // directory's FILE_DELETE_CHILD) must let this user delete it.
            crate::acl::store::may_delete(fs, &to, &token)?;
        }
    }
    // Others' cached handles would keep the old name (MS-FSA 2.1.5.14.11):
    // they are asked to close them, and the rename waits for their answer
    // (as Windows and Samba do: smbtorture smb2.lease.rename_wait).
    if ctx
        .server
        .oplocks
        .contend_handles(open.file_key, open.open_id)
    {
        return Ok(Some(open.file_key));
    }
    // Persistent opens of the file, or beneath it, note the rename in
    // their records first: a crash before their records name the new path
    // leaves them findable under either name.
    let prefix = format!("{from}/");
    // (Each open's own locks are taken outside the registry's.)
    let same_share = ctx
        .server
        .opens
        .matching(|o| o.share.name == open.share.name);
    for o in same_share {
        if o.file_key == open.file_key || o.path().starts_with(&prefix) {
            crate::persist::renaming(ctx.server, &o, &from, &to);
        }
    }
    // A file made under a claim on its directory (docs/SCALING.md, "New
    // files") is owned before it shows under a directory the claim does
    // not cover.
    if parent(&from) != parent(&to) {
        ctx.server
            .share_modes
            .naming_elsewhere(open.file_key)
            .map_err(|e| sharing_status(&e))?;
    }
    // Rename the open file, not whatever its old name reaches by now.
    let identity = Identity::new(open.file_key.dev, open.file_key.ino, open.file_key.gen);
    let _own = ctx.server.notify.own_change(&open.share, &[&from, &to]);
    fs.rename_if(&from, &to, replace || case_only, identity)
        .map_err(|e| match e {
            VfsError::Exists => NtStatus::OBJECT_NAME_COLLISION,
            e => vfs_status(&e),
        })?;
    // Every open of the file (and beneath it) now goes by the new name,
    // and a persistent one's record too, on the disk before the rename is
    // answered: a restart reopens the file by the recorded name.
    let moved = ctx
        .server
        .opens
        .renamed(fs.root_path(), open.file_key, &from, &to);
    for o in &moved {
        crate::persist::changed(ctx.server, o);
    }
    ctx.server.notify.renamed(open, &from, &to);
    // The name left one listing and joined another (or the same one: its
    // lease is then breaking already and the second call sends nothing).
    crate::dir_leases::child_changed(&ctx.server.oplocks, fs, &from, open.parent_lease);
    crate::dir_leases::child_changed(&ctx.server.oplocks, fs, &to, open.parent_lease);
    Ok(None)
}

/// Whether anyone has the file (or stream) open.
fn held_open(ctx: &Ctx<'_>, st: &nimbus_vfs::Stat) -> Result<bool, NtStatus> {
    let key = FileKey {
        dev: st.dev,
        ino: st.ino,
        gen: st.gen,
    };
    let rec = ctx
        .server
        .share_modes
        .record(key)
        .map_err(|e| sharing_status(&e))?;
    Ok(!rec.opens.is_empty())
}

/// MS-FSA 2.1.5.15.11.1 FileRenameInformation of a named stream: the new
/// name is `:name[:$DATA]` (a path is SHARING_VIOLATION, as Windows
/// answers: smbtorture smb2.streams.rename2). An existing stream is
/// replaced only with ReplaceIfExists, only when nobody has it open and
/// only when it is empty (INVALID_PARAMETER otherwise). Renaming a stream
/// to `::$DATA` makes it the file's data (`super::stream_to_data`).
fn rename_stream(
    ctx: &mut Ctx<'_>,
    open: &Open,
    stream: &StreamOf,
    new_name: &str,
    replace: bool,
) -> Result<(), NtStatus> {
    let fs = open.share.fs.as_ref().ok_or(NtStatus::INVALID_PARAMETER)?;
    let vfs = |e: VfsError| vfs_status(&e);
    if !new_name.starts_with(':') {
        return Err(NtStatus::SHARING_VIOLATION);
    }
    let to = match to_vfs_path_and_stream(new_name)? {
        (path, Stream::Named(to)) if path.is_empty() => to,
        (path, Stream::UnnamedData) if path.is_empty() => {
            return super::stream_to_data::rename(ctx, open, stream, replace);
        }
        _ => return Err(NtStatus::OBJECT_NAME_INVALID),
    };
    let streams = fs
        .streams(&stream.base, false)
        .map_err(vfs)?
        .ok_or(NtStatus::OBJECT_NAME_NOT_FOUND)?;
    let from = lock(&stream.name).clone();
    if to == from {
        return Ok(());
    }
    let names = streams.names().map_err(vfs)?;
    let existing = names
        .iter()
        .find(|n| **n == to)
        .or_else(|| names.iter().find(|n| eq_ignore_case(n, &to)))
        .filter(|n| !eq_ignore_case(n, &from));
    if let Some(target) = existing {
        if !replace {
            return Err(NtStatus::OBJECT_NAME_COLLISION);
        }
        let st = streams.stat(target).map_err(vfs)?;
        if held_open(ctx, &st)? {
            return Err(NtStatus::SHARING_VIOLATION);
        }
        if st.size != 0 {
            return Err(NtStatus::INVALID_PARAMETER);
        }
        if *target != to {
            // Replaced under its own spelling, then named as asked.
            streams.rename(&from, target, true).map_err(vfs)?;
            streams.rename(target, &to, false).map_err(vfs)?;
            stream_renamed(ctx, open, &from, &to);
            *lock(&stream.name) = to;
            return Ok(());
        }
    }
    // A change of case only replaces the stream itself.
    let replace = existing.is_some() || eq_ignore_case(&to, &from);
    streams.rename(&from, &to, replace).map_err(|e| match e {
        VfsError::Exists => NtStatus::OBJECT_NAME_COLLISION,
        e => vfs_status(&e),
    })?;
    stream_renamed(ctx, open, &from, &to);
    *lock(&stream.name) = to;
    Ok(())
}

/// A stream renamed is one name removed and one added, to watchers.
fn stream_renamed(ctx: &Ctx<'_>, open: &Open, from: &str, to: &str) {
    let path = open.path();
    let notify = &ctx.server.notify;
    notify.stream_named(&open.share, &path, from, false);
    notify.stream_named(&open.share, &path, to, true);
}

/// FILE_ADD_FILE (MS-SMB2 2.2.13.1.2), and the share access of the open a
/// rename makes of its target directory.
const ADD_FILE: u32 = 0x2;
const SHARE_READ_WRITE: u32 = 0x3;
