//! READ_DIR_ATTR: what a Mac's directory listing (FileIdBothDirectory-
//! Information) carries once it asked for it, so that Finder can draw a
//! folder without opening every file: the user's maximal access, the
//! resource fork's size, the compressed Finder information and the Unix
//! mode (nimbus_wire::apple::ReaddirAttr has the layout).

use nimbus_vfs::{CreateMode, FileHandle, LocalFs, Stat};
use nimbus_wire::apple::{afp_info, ReaddirAttr, AFP_DATE_DELTA, RESOURCE_STREAM_NAME};

use crate::acl::{check, store, Token};

/// File type bits of st_mode (Stat::mode holds only the permissions).
const S_IFDIR: u32 = 0o040000;
const S_IFREG: u32 = 0o100000;
const S_IFLNK: u32 = 0o120000;

/// The READ_DIR_ATTR fields of the entry `name`, whose handle is `entry`.
/// `tree_max` is what the tree connect allows the user; a stored
/// descriptor limits it further.
pub fn attrs(
    fs: &LocalFs,
    entry: &FileHandle,
    name: &str,
    stat: &Stat,
    tree_max: u32,
    token: Option<&Token>,
) -> ReaddirAttr {
    let max_access = match (token, store::read_handle(entry, name)) {
        (Some(token), Ok(Some(sd))) => tree_max & check::granted(&sd, token),
        (_, Ok(_)) => tree_max,
        // Unknown permissions: nothing.
        (_, Err(_)) => 0,
    };
    let mut resource_fork_size = 0;
    let mut finder_info = None;
    if let Ok(Some(streams)) = fs.streams(entry, false) {
        if !stat.is_dir {
            resource_fork_size = streams.stat(RESOURCE_STREAM_NAME).map_or(0, |s| s.size);
        }
        finder_info = stored_finder_info(&streams);
    }
    let date_added = stat.btime.map_or(0, |t| {
        (t.sec - AFP_DATE_DELTA).clamp(0, u32::MAX as i64) as u32
    });
    let file_type = if stat.is_dir {
        S_IFDIR
    } else if stat.is_symlink {
        S_IFLNK
    } else {
        S_IFREG
    };
    ReaddirAttr {
        max_access,
        resource_fork_size,
        finder_info: ReaddirAttr::compress_finder_info(
            finder_info.as_ref().map_or(&[][..], |f| &f[..]),
            stat.is_dir,
            date_added,
        ),
        unix_mode: (file_type | (stat.mode & 0o7777)) as u16,
    }
}

/// The 32 bytes of Finder information of a file's stored AfpInfo.
fn stored_finder_info(streams: &nimbus_vfs::Streams) -> Option<Vec<u8>> {
    let st = streams.stat(afp_info::STREAM_NAME).ok()?;
    if st.size != afp_info::SIZE as u64 {
        return None;
    }
    let opts = super::file_options(CreateMode::OpenExisting, true, false);
    let (h, _, _) = streams.open(afp_info::STREAM_NAME, &opts).ok()?;
    let mut blob = [0u8; afp_info::SIZE];
    if h.read_at(&mut blob, 0).ok()? != afp_info::SIZE {
        return None;
    }
    afp_info::finder_info(&blob).map(<[u8]>::to_vec)
}
