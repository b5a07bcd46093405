//! MS-SMB2 3.3.5.18 Receiving an SMB2 QUERY_DIRECTORY Request.

use nimbus_vfs::{DirEntry, Stat};
use nimbus_wire::apple::ReaddirAttr;
use nimbus_wire::codec::{Put, HEADER_SIZE};
use nimbus_wire::fscc::{
    access, encode_directory_entry, file_class, is_directory_class, DirectoryEntry,
};
use nimbus_wire::query_directory::{flags, QueryDirectoryRequest};
use nimbus_wire::NtStatus;

use super::{check_credit_charge, malformed};
use crate::acl::{check, store, Token};
use crate::ctx::{Ctx, HandlerResult};
use crate::dosinfo::DosInfo;
use crate::eas;
use crate::errors::vfs_status;
use crate::fileinfo::file_info;
use crate::session::{DirEnum, Open};
use crate::sync::lock;
use nimbus_vfs::names::{dos_name, has_wildcards, is_8dot3, join, parent, SearchPattern};

pub fn handle(ctx: &mut Ctx<'_>, body: &[u8], out: &mut Vec<u8>) -> HandlerResult {
    let req = QueryDirectoryRequest::parse(body).map_err(malformed)?;
    let open = ctx.open(req.file_id)?;
    if !open.is_dir {
        return Err(NtStatus::INVALID_PARAMETER);
    }
    if !is_directory_class(req.info_class) {
        return Err(NtStatus::INVALID_INFO_CLASS);
    }
    if open.access & access::FILE_READ_DATA == 0 {
        return Err(NtStatus::ACCESS_DENIED);
    }
    check_credit_charge(ctx, req.output_buffer_length)?;
    // Fewer entries than asked for is always allowed; the client asks again.
    let limits = &ctx.server.config().limits;
    let limit = (req.output_buffer_length as usize).min(limits.max_directory_response_bytes);

    let mut guard = lock(&open.dir_enum);
    let restart = req.flags & (flags::RESTART_SCANS | flags::REOPEN) != 0 || guard.is_none();
    if restart {
        // Checked and compiled once for the whole listing; a pattern that is
        // no valid name component (too long, a path separator) is refused
        // before the directory is read (MS-FSA 2.1.5.6.3).
        let pattern = SearchPattern::parse(&req.pattern)?;
        // This open's earlier listing gives its entries back first.
        *guard = None;
        // The connection's enumerations share one budget of entries; take
        // what is free before reading, keep only what matched.
        let refused = |held: usize| {
            tracing::warn!(
                "{}: listing of directory \"{}\" refused: it would take this connection's \
                 directory listings past {} entries ({held} held by its other open \
                 directories; limits.max_directory_entries)",
                ctx.conn.peer,
                open.path(),
                limits.max_directory_entries
            );
            NtStatus::INSUFFICIENT_RESOURCES
        };
        let budget = &ctx.conn.dir_entries;
        let mut lease = budget
            .take_up_to(limits.max_directory_entries)
            .ok_or_else(|| refused(budget.held()))?;
        let entries = match list(&open, &pattern, lease.len()) {
            Err(NtStatus::INSUFFICIENT_RESOURCES) => {
                let others = budget.held() - lease.len();
                drop(lease);
                return Err(refused(others));
            }
            r => r?,
        };
        // A Mac's listing shows the streams of files copied with
        // AppleDouble companions, and not the companions (crate::apple).
        let mut entries = entries;
        if ctx.conn.apple.on(&open.share) && !open.share.read_only() {
            convert_apple_doubles(ctx, &open, &mut entries);
        }
        lease.shrink_to(entries.len());
        *guard = Some(DirEnum {
            entries,
            pos: 0,
            _lease: lease,
        });
    }
    let Some(en) = guard.as_mut() else {
        return Err(NtStatus::INVALID_PARAMETER);
    };

    // The response body: StructureSize, OutputBufferOffset, OutputBufferLength.
    let head = out.len();
    out.put_u16(9);
    out.put_u16((HEADER_SIZE + 8) as u16);
    out.put_u32(0);
    let data_start = out.len();
    let mut last_entry: Option<usize> = None;
    // Only FileDirectoryInformation and FileNamesInformation have no EaSize.
    let with_eas = !matches!(req.info_class, file_class::DIRECTORY | file_class::NAMES);
    let mut count = 0usize;
    // Access-based enumeration: what the user may not read is not listed.
    let hide_from = if open.share.access_based_enumeration() {
        ctx.session()?.token()
    } else {
        None
    };
    // A Mac that asked for READ_DIR_ATTR gets Finder's fields in
    // FileIdBothDirectoryInformation (crate::apple::readdir).
    let token = ctx.session()?.token();
    let apple = (req.info_class == file_class::ID_BOTH_DIRECTORY
        && ctx.conn.apple.readdir_attr(&open.share))
    .then(|| ReaddirAsk {
        tree_max: ctx.tree().map_or(0, |t| t.maximal_access()),
        token: token.as_deref(),
    });
    while en.pos < en.entries.len() {
        // Entries listed by an earlier request may have been deleted or
        // changed since: look again, and skip the ones that are gone, as a
        // server reading the directory lazily would (MS-FSA 2.1.5.6.3 does
        // not return names that no longer exist).
        let entry = &en.entries[en.pos];
        let Some(listed) = current(
            &open,
            entry,
            !restart,
            with_eas,
            hide_from.as_deref(),
            apple.as_ref(),
        ) else {
            en.pos += 1;
            continue;
        };
        let e = &en.entries[en.pos];
        let entry_start = if last_entry.is_some() {
            // Entries are 8-byte aligned from the start of the buffer.
            data_start + (out.len() - data_start).next_multiple_of(8)
        } else {
            data_start
        };
        let before = out.len();
        out.resize(entry_start, 0);
        let mut info = file_info(&listed.stat, &listed.dos, false);
        open.share.settings().hide.apply(&e.name, &mut info);
        let file = nimbus_state::FileKey {
            dev: listed.stat.dev,
            ino: listed.stat.ino,
            gen: listed.stat.gen,
        };
        ctx.server.write_times.adjust(file, &mut info);
        // Only the classes that carry one need the 8.3 name. A name that is
        // 8.3 already, in whatever case, has none besides itself: NTFS makes
        // no second name for it, and ShortNameLength is 0 (MS-FSCC
        // FileBothDirectoryInformation).
        let short = if matches!(
            req.info_class,
            file_class::BOTH_DIRECTORY | file_class::ID_BOTH_DIRECTORY
        ) && e.name != "."
            && e.name != ".."
            && !is_8dot3(&e.name)
        {
            dos_name(&e.name)
        } else {
            String::new()
        };
        encode_directory_entry(
            req.info_class,
            &DirectoryEntry {
                name: &e.name,
                short_name: &short,
                ea_size: listed.ea_size,
                info: &info,
            },
            out,
        );
        if let Some(attrs) = &listed.apple {
            attrs.patch_id_both_entry(&mut out[entry_start..]);
        }
        if out.len() - data_start > limit {
            out.truncate(before);
            break;
        }
        if let Some(prev) = last_entry {
            let next = (entry_start - prev) as u32;
            out[prev..prev + 4].copy_from_slice(&next.to_le_bytes());
        }
        last_entry = Some(entry_start);
        en.pos += 1;
        count += 1;
        if req.flags & flags::RETURN_SINGLE_ENTRY != 0 {
            break;
        }
    }
    if count == 0 {
        out.truncate(head);
        if en.pos < en.entries.len() {
            // Not even one entry fits the client's buffer.
            return Err(NtStatus::INFO_LENGTH_MISMATCH);
        }
        return Err(if restart && en.entries.is_empty() {
            NtStatus::NO_SUCH_FILE
        } else {
            NtStatus::NO_MORE_FILES
        });
    }
    let len = (out.len() - data_start) as u32;
    out[head + 4..head + 8].copy_from_slice(&len.to_le_bytes());
    Ok(NtStatus::SUCCESS)
}

/// The metadata of a listed entry: as listed, or (`refresh`) as it is now;
/// None if it no longer exists.
/// The entry as it is now; None when it is gone, or when `hide_from` (the
/// session of a share with access-based enumeration) may not read it:
/// its stored descriptor does not grant FILE_GENERIC_READ (SYNCHRONIZE
/// aside), as Windows hides what a user has no Read permission on.
fn current(
    open: &Open,
    e: &DirEntry,
    refresh: bool,
    with_eas: bool,
    hide_from: Option<&Token>,
    apple: Option<&ReaddirAsk<'_>>,
) -> Option<Listed> {
    let of = |handle: &nimbus_vfs::FileHandle| Listed {
        stat: e.stat.clone(),
        dos: DosInfo::load(handle),
        ea_size: if with_eas {
            eas::load(handle).map_or(0, |l| eas::size_of(&l))
        } else {
            0
        },
        apple: apple.and_then(|ask| {
            let fs = open.share.fs.as_ref()?;
            Some(crate::apple::readdir::attrs(
                fs,
                handle,
                &e.name,
                &e.stat,
                ask.tree_max,
                ask.token,
            ))
        }),
    };
    if e.name == "." {
        return Some(of(&open.handle));
    }
    if e.name == ".." {
        return Some(Listed {
            stat: e.stat.clone(),
            dos: DosInfo::default(),
            ea_size: 0,
            apple: None,
        });
    }
    let mut stat = if refresh {
        let fs = open.share.fs.as_ref()?;
        fs.stat(&join(&open.path(), &e.name)).ok()?
    } else {
        e.stat.clone()
    };
    let listed = match open.handle.entry(&e.name) {
        Ok(h) => {
            // The data's allocation, as a query of an open of it reports.
            stat.alloc_size = h.data_allocation(&stat);
            if let Some(token) = hide_from {
                let read = check::SEEN_WITH_ABE;
                match store::read_handle(&h, &e.name) {
                    Ok(Some(sd)) if check::granted(&sd, token) & read != read => return None,
                    Ok(_) => {}
                    // Unknown permissions: not shown.
                    Err(_) => return None,
                }
            }
            of(&h)
        }
        Err(_) => Listed {
            stat: e.stat.clone(),
            dos: DosInfo::default(),
            ea_size: 0,
            apple: None,
        },
    };
    Some(Listed { stat, ..listed })
}

/// What a listing says of one entry.
struct Listed {
    stat: Stat,
    dos: DosInfo,
    /// MS-FSCC 2.4.14 and the classes after it: EaSize.
    ea_size: u32,
    /// READ_DIR_ATTR's fields, for a Mac that asked for them.
    apple: Option<ReaddirAttr>,
}

/// What READ_DIR_ATTR's maximal access is computed from.
struct ReaddirAsk<'a> {
    tree_max: u32,
    token: Option<&'a Token>,
}

/// The entries of a directory that match `search`, "." and ".." first.
fn list(open: &Open, search: &SearchPattern, max: usize) -> Result<Vec<DirEntry>, NtStatus> {
    let fs = open.share.fs.as_ref().ok_or(NtStatus::INVALID_PARAMETER)?;
    let dir = open.path();
    let mut out = Vec::new();
    let pattern = search.as_str();
    if !has_wildcards(pattern) {
        // An exact name: try it as spelled, then case-insensitively or as
        // an 8.3 name (in the listing below).
        if pattern == "." || pattern == ".." {
            out.extend(
                dot_entries(open, fs, &dir)
                    .into_iter()
                    .filter(|e| e.name == pattern),
            );
            return Ok(out);
        }
        let hidden = dir.is_empty() && pattern == nimbus_vfs::STORE_DIR;
        if let (false, Ok(stat)) = (hidden, fs.stat(&join(&dir, pattern))) {
            out.push(DirEntry {
                name: pattern.to_string(),
                stat,
            });
            return Ok(out);
        }
    }
    out.extend(
        dot_entries(open, fs, &dir)
            .into_iter()
            .filter(|e| search.matches(&e.name)),
    );
    let entries = open
        .handle
        .read_dir_at_most(max)
        .map_err(|e| vfs_status(&e))?;
    // The share's store of named streams is the server's own.
    let at_root = dir.is_empty();
    out.extend(entries.into_iter().filter(|e| {
        search.matches_entry(&e.name) && !(at_root && e.name == nimbus_vfs::STORE_DIR)
    }));
    Ok(out)
}

fn dot_entries(open: &Open, fs: &nimbus_vfs::LocalFs, dir: &str) -> Vec<DirEntry> {
    let mut v = Vec::with_capacity(2);
    let this: Option<Stat> = open.handle.stat().ok();
    if let Some(stat) = this.clone() {
        v.push(DirEntry {
            name: ".".into(),
            stat,
        });
    }
    let up = if dir.is_empty() {
        this
    } else {
        fs.stat(parent(dir)).ok()
    };
    if let Some(stat) = up {
        v.push(DirEntry {
            name: "..".into(),
            stat,
        });
    }
    v
}

/// Converts the AppleDouble companions (`._name`) listed beside their
/// files, each only where the listing session may write it into its file
/// (crate::apple::apple_double), and leaves out of the listing those that
/// were.
fn convert_apple_doubles(ctx: &Ctx<'_>, open: &Open, entries: &mut Vec<DirEntry>) {
    let Some(fs) = open.share.fs.as_ref() else {
        return;
    };
    let (Some(token), Ok(tree)) = (ctx.session().ok().and_then(|s| s.token()), ctx.tree()) else {
        return;
    };
    let writer = crate::apple::apple_double::Writer {
        token: &token,
        tree_max: tree.maximal_access(),
    };
    let prefix = crate::apple::apple_double::PREFIX;
    let names: std::collections::HashSet<&str> = entries.iter().map(|e| e.name.as_str()).collect();
    let dir = open.path();
    let converted: std::collections::HashSet<String> = entries
        .iter()
        .filter_map(|e| e.name.strip_prefix(prefix))
        .filter(|file| !file.is_empty() && names.contains(file))
        .filter(|file| {
            crate::apple::apple_double::convert(
                ctx.server,
                &open.share,
                fs,
                &join(&dir, file),
                writer,
            )
        })
        .map(|file| format!("{prefix}{file}"))
        .collect();
    if !converted.is_empty() {
        entries.retain(|e| !converted.contains(&e.name));
    }
}
