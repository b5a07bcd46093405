//! A file's AppleDouble companion (`._name`, nimbus_wire::apple_double),
//! turned into the named streams a Mac reads over SMB: Finder information
//! into AFP_AfpInfo, the resource fork into AFP_Resource, each extended
//! attribute into a stream of its name (':' written as U+F022, as macOS
//! writes it in SMB names). Such files arrive when a Mac's files are
//! copied from a volume without streams (a USB disk, an archive, another
//! server); a Mac that sees Nimbus's streams never reads them. The
//! companion is removed once converted, so that it is never applied twice
//! over newer data; one in use, damaged or not written by macOS is left.
//!
//! Done when a Mac's stream of the file is opened, and when a Mac lists
//! the directory, and only for a session that could write what the
//! companion holds into the file itself (`Writer`): the companion is
//! anybody's file in the directory, and the streams are the file's data
//! (FILE_WRITE_DATA) and its Finder information its metadata
//! (FILE_WRITE_ATTRIBUTES). It must also be allowed to read the companion
//! (its content ends up readable with the file) and to delete it (it is
//! removed). Otherwise the companion stays as it is.

use nimbus_vfs::{CreateMode, FileHandle, Identity, Kind, LocalFs, OpenOptions, Streams, VfsError};
use nimbus_wire::apple::{afp_info, RESOURCE_STREAM_NAME};
use nimbus_wire::apple_double::{self, AppleDouble, MACOS_FILLER};
use nimbus_wire::fscc::access;

use crate::acl::check::{self, ALL_RIGHTS};
use crate::acl::{store, Token};
use crate::fileinfo::is_readonly;
use crate::server::{Server, Share};
use nimbus_vfs::names::{join, parent};

/// The prefix of an AppleDouble companion's name.
pub const PREFIX: &str = "._";
/// The most of a companion read to find its Finder information and
/// extended attributes (macOS keeps them within the first 64 KiB).
const MAX_HEAD: u64 = 1 << 20;

/// The session a conversion is done for: its SIDs, and the most its tree
/// connect allows (TREE_CONNECT's MaximalAccess).
#[derive(Clone, Copy)]
pub struct Writer<'a> {
    pub token: &'a Token,
    pub tree_max: u32,
}

impl Writer<'_> {
    /// The rights the session has on the open file `h` (`what` names it
    /// in the log): its tree's, limited by the file's stored descriptor.
    fn rights_on(&self, h: &FileHandle, what: &str) -> Result<u32, VfsError> {
        let by_sd = match store::read_handle(h, what)? {
            Some(sd) => check::granted(&sd, self.token),
            // A file without a stored descriptor limits nothing
            // (crate::acl).
            None => ALL_RIGHTS,
        };
        Ok(self.tree_max & by_sd)
    }
}

/// Converts `path`'s companion, if it has one and `writer` may write what
/// it holds into the file. Returns whether it did.
pub fn convert(
    server: &Server,
    share: &Share,
    fs: &LocalFs,
    path: &str,
    writer: Writer<'_>,
) -> bool {
    if share.read_only() {
        return false;
    }
    let (dir, leaf) = match path.rsplit_once('/') {
        Some((d, l)) => (d, l),
        None => ("", path),
    };
    if leaf.is_empty() || leaf.starts_with(PREFIX) {
        return false;
    }
    let companion = join(dir, &format!("{PREFIX}{leaf}"));
    let Ok(st) = fs.stat(&companion) else {
        return false;
    };
    debug_assert_eq!(parent(&companion), dir);
    if st.is_dir || st.is_symlink {
        return false;
    }
    // A client has it open (perhaps still writing it): not now. Looked up
    // as an open of the name would, through its directory's claim.
    let Ok(dir) = crate::directory_scope::directory_of(server, fs, &companion) else {
        return false;
    };
    let _through = crate::directory_scope::through(dir);
    let key = nimbus_state::FileKey {
        dev: st.dev,
        ino: st.ino,
        gen: st.gen,
    };
    if server
        .share_modes
        .record(key)
        .map_or(true, |r| !r.opens.is_empty())
    {
        return false;
    }
    match convert_companion(fs, path, &companion, st.size, writer) {
        Ok(true) => {}
        Ok(false) => return false,
        Err(e) => {
            tracing::warn!(
                "share {}: AppleDouble file {companion} not converted: {e}",
                share.name
            );
            return false;
        }
    }
    let _own = server.notify.own_change(share, &[&companion]);
    match fs.remove_if(&companion, false, Identity::of(&st)) {
        Ok(()) => server.notify.removed(share, &companion, false),
        Err(e) => tracing::warn!(
            "share {}: converted {companion} not removed: {e}",
            share.name
        ),
    }
    true
}

/// Writes the companion's contents as streams of `path`; false when it is
/// not a macOS AppleDouble file or `writer` may not convert it (left as it
/// is).
fn convert_companion(
    fs: &LocalFs,
    path: &str,
    companion: &str,
    size: u64,
    writer: Writer<'_>,
) -> Result<bool, VfsError> {
    let (ad_file, _, _) = fs.open(
        companion,
        &super::file_options(CreateMode::OpenExisting, true, false),
    )?;
    let mut head = vec![0u8; size.min(MAX_HEAD) as usize];
    let n = read_full(&ad_file, &mut head)?;
    head.truncate(n);
    if head.get(8..24) != Some(&MACOS_FILLER[..]) {
        return Ok(false);
    }
    let Ok(ad) = apple_double::parse(&head, size) else {
        return Ok(false);
    };
    let base_opts = OpenOptions {
        kind: Kind::Any,
        ..super::file_options(CreateMode::OpenExisting, false, false)
    };
    let (base, _, _) = match fs.open(path, &base_opts) {
        Ok(b) => b,
        // A companion without its file: nothing to give it to.
        Err(VfsError::NotFound) => return Ok(false),
        Err(e) => return Err(e),
    };
    if !may_convert(fs, &ad, (&base, path), (&ad_file, companion), writer)? {
        tracing::debug!("{companion}: not converted, the session may not write it into {path}");
        return Ok(false);
    }
    if nothing_in(&ad) {
        return Ok(true);
    }
    let Some(streams) = fs.streams(&base, true)? else {
        return Ok(false);
    };
    write_streams(&streams, &ad, &ad_file)?;
    Ok(true)
}

/// The rights on the file that writing `ad` into it takes: the resource
/// fork and extended attributes are named streams, the file's data
/// (FILE_WRITE_DATA, as for a CREATE adding a stream: MS-FSA 2.1.5.1.2.1);
/// the Finder information is metadata (FILE_WRITE_ATTRIBUTES).
fn rights_needed(ad: &AppleDouble<'_>) -> u32 {
    let mut need = 0;
    if ad.finder_info.is_some_and(|f| f.iter().any(|&b| b != 0)) {
        need |= access::FILE_WRITE_ATTRIBUTES;
    }
    if ad.resource_fork.is_some_and(|(_, len)| len > 0) || !ad.xattrs.is_empty() {
        need |= access::FILE_WRITE_DATA;
    }
    need
}

/// Whether `writer` may convert the companion `ad` (open as `ad_file`)
/// into the file `base`: the rights `ad` needs on the file (a READONLY
/// file's data is not written, as a CREATE for writing it is refused),
/// and on the companion the right to read it and to delete it (DELETE, or
/// FILE_DELETE_CHILD on the directory).
fn may_convert(
    fs: &LocalFs,
    ad: &AppleDouble<'_>,
    (base, path): (&FileHandle, &str),
    (ad_file, companion): (&FileHandle, &str),
    writer: Writer<'_>,
) -> Result<bool, VfsError> {
    let need = rights_needed(ad);
    let mut on_base = writer.rights_on(base, path)?;
    let st = base.stat()?;
    if !st.is_dir && is_readonly(st.mode) {
        on_base &= !(access::FILE_WRITE_DATA | access::FILE_APPEND_DATA);
    }
    if need & !on_base != 0 {
        return Ok(false);
    }
    let on_companion = writer.rights_on(ad_file, companion)?;
    if on_companion & access::FILE_READ_DATA == 0 || writer.tree_max & access::DELETE == 0 {
        return Ok(false);
    }
    Ok(store::may_delete(fs, companion, writer.token).is_ok())
}

fn nothing_in(ad: &AppleDouble<'_>) -> bool {
    ad.finder_info.is_none_or(|f| f.iter().all(|&b| b == 0))
        && ad.resource_fork.is_none_or(|(_, len)| len == 0)
        && ad.xattrs.is_empty()
}

fn write_streams(
    streams: &Streams,
    ad: &AppleDouble<'_>,
    ad_file: &FileHandle,
) -> Result<(), VfsError> {
    let create = super::file_options(CreateMode::OpenOrCreate, false, true);
    let put = |name: &str, data: &[u8]| -> Result<(), VfsError> {
        let (h, _, _) = streams.open(name, &create)?;
        h.set_len(0)?;
        h.write_at(data, 0)?;
        Ok(())
    };
    if let Some(fi) = ad.finder_info.filter(|f| f.iter().any(|&b| b != 0)) {
        let mut record = afp_info::empty();
        record[afp_info::FINDER_INFO..afp_info::FINDER_INFO + afp_info::FINDER_INFO_LEN]
            .copy_from_slice(fi);
        put(afp_info::STREAM_NAME, &record)?;
    }
    if let Some((offset, len)) = ad.resource_fork.filter(|(_, len)| *len > 0) {
        let (h, _, _) = streams.open(RESOURCE_STREAM_NAME, &create)?;
        h.set_len(0)?;
        h.copy_from(ad_file, offset, 0, len)?;
    }
    for (name, value) in &ad.xattrs {
        // What macOS keeps elsewhere, and names no stream can have.
        if matches!(
            name.as_str(),
            "com.apple.FinderInfo" | "com.apple.ResourceFork"
        ) || name.contains(['/', '\0'])
        {
            continue;
        }
        put(&stream_name(name), value)?;
    }
    Ok(())
}

/// An extended attribute's name as macOS spells it in an SMB stream name:
/// the characters NTFS does not allow there mapped into the private use
/// area (':' is U+F022, '\' U+F026).
fn stream_name(xattr: &str) -> String {
    xattr
        .chars()
        .map(|c| match c {
            ':' => '\u{F022}',
            '\\' => '\u{F026}',
            c => c,
        })
        .collect()
}

fn read_full(h: &FileHandle, buf: &mut [u8]) -> Result<usize, VfsError> {
    let mut done = 0;
    while done < buf.len() {
        let n = h.read_at(&mut buf[done..], done as u64)?;
        if n == 0 {
            break;
        }
        done += n;
    }
    Ok(done)
}
