//! Translates POSIX metadata into the SMB view of a file.

use nimbus_vfs::{FsStat, Stat, Timespec};
use nimbus_wire::create::FileTimesAndSizes;
use nimbus_wire::fscc::{attributes, fs_attributes, unix_to_filetime, FileInfo, VolumeInfo};

use crate::dosinfo::DosInfo;
use crate::open::Open;

fn ft(t: Timespec) -> u64 {
    unix_to_filetime(t.sec, t.nsec)
}

/// FILE_ATTRIBUTE_READONLY stands for "nobody may write": no write bit set.
pub fn is_readonly(mode: u32) -> bool {
    mode & 0o222 == 0
}

/// MS-FSCC 2.6 file attributes: a file's READONLY from the permission bits,
/// DIRECTORY from the file type, the rest as stored; NORMAL when none is set.
pub fn attributes_of(st: &Stat, dos: &DosInfo) -> u32 {
    let mut a = dos.stored_or_default(st.is_dir);
    if st.is_dir {
        a |= attributes::DIRECTORY;
    } else {
        a &= !attributes::READONLY;
    }
    if is_readonly(st.mode) {
        a |= attributes::READONLY;
    }
    if a == 0 {
        a = attributes::NORMAL;
    }
    a
}

pub fn file_info(st: &Stat, dos: &DosInfo, delete_pending: bool) -> FileInfo {
    // Without a birth time, the older of mtime and ctime is the best
    // stand-in: it never claims a file is newer than its content.
    let birth = st.btime.unwrap_or(
        if (st.mtime.sec, st.mtime.nsec) < (st.ctime.sec, st.ctime.nsec) {
            st.mtime
        } else {
            st.ctime
        },
    );
    FileInfo {
        creation_time: dos.create_time.unwrap_or_else(|| ft(birth)),
        last_access_time: ft(st.atime),
        last_write_time: ft(st.mtime),
        change_time: dos
            .change_time_for(st.mtime)
            .unwrap_or_else(|| ft(st.ctime)),
        allocation_size: if st.is_dir { 0 } else { st.alloc_size },
        end_of_file: if st.is_dir { 0 } else { st.size },
        attributes: attributes_of(st, dos),
        // A delete-pending name no longer counts as a link (MS-FSA 2.1.5.12.27
        // FileStandardInformation: NumberOfLinks excludes links pending deletion).
        number_of_links: (st.nlink.saturating_sub(u64::from(delete_pending))).min(u32::MAX as u64)
            as u32,
        delete_pending,
        is_directory: st.is_dir,
        file_id: st.ino,
        volume_serial: st.dev,
    }
}

/// What a named stream looks like to a query (MS-FSA 2.1.5.12): its file's
/// times, attributes and id, its own sizes, and never a directory (a
/// directory's streams are data like a file's).
pub fn stream_info(base: &Stat, dos: &DosInfo, stream: &Stat, delete_pending: bool) -> FileInfo {
    let mut info = file_info(base, dos, delete_pending);
    info.end_of_file = stream.size;
    info.allocation_size = stream.alloc_size;
    info.is_directory = false;
    info.attributes &= !attributes::DIRECTORY;
    if info.attributes == 0 {
        info.attributes = attributes::NORMAL;
    }
    info
}

/// What an open's file (or stream) looks like to a query now.
pub fn open_info(open: &Open, delete_pending: bool) -> Result<FileInfo, nimbus_vfs::VfsError> {
    let mut st = open.handle.stat()?;
    // The data's allocation, without a block of extended attributes.
    st.alloc_size = open.handle.data_allocation(&st);
    let mut info = open_info_of(open, &st, delete_pending)?;
    open.share
        .settings()
        .hide
        .apply(&crate::sync::lock(&open.path), &mut info);
    Ok(info)
}

fn open_info_of(
    open: &Open,
    st: &Stat,
    delete_pending: bool,
) -> Result<FileInfo, nimbus_vfs::VfsError> {
    Ok(match &open.stream {
        None => file_info(st, &DosInfo::load(&open.handle), delete_pending),
        Some(s) => {
            let mut info =
                stream_info(&s.base.stat()?, &DosInfo::load(&s.base), st, delete_pending);
            // A Mac's AfpInfo is one record of fixed size, written or not.
            if crate::apple::open_kind(open) == Some(crate::apple::AppleStream::AfpInfo) {
                info.end_of_file = crate::apple::afp_info::REPORTED_SIZE;
            }
            info
        }
    })
}

pub fn times_and_sizes(info: &FileInfo) -> FileTimesAndSizes {
    FileTimesAndSizes {
        creation_time: info.creation_time,
        last_access_time: info.last_access_time,
        last_write_time: info.last_write_time,
        change_time: info.change_time,
        allocation_size: info.allocation_size,
        end_of_file: info.end_of_file,
        file_attributes: info.attributes,
    }
}

/// `block_cloning`: the file system shares extents, so
/// FSCTL_DUPLICATE_EXTENTS_TO_FILE is offered.
pub fn volume_info(fs: &FsStat, share_name: &str, created: u64, block_cloning: bool) -> VolumeInfo {
    // Report allocation units of one "sector" of the fs block size, so the
    // numbers multiply back to the real byte counts.
    let bytes_per_sector = 512u32;
    let sectors_per_unit = (fs.block_size / bytes_per_sector as u64).max(1) as u32;
    VolumeInfo {
        creation_time: created,
        serial: (fs.fs_id ^ (fs.fs_id >> 32)) as u32,
        label: share_name.to_string(),
        total_units: fs.total_blocks,
        caller_available_units: fs.avail_blocks,
        actual_available_units: fs.free_blocks,
        sectors_per_unit,
        bytes_per_sector,
        max_name_len: fs.max_name_len.min(255) as u32,
        fs_attributes: fs_attributes::CASE_SENSITIVE_SEARCH
            | fs_attributes::CASE_PRESERVED_NAMES
            | fs_attributes::UNICODE_ON_DISK
            | fs_attributes::SUPPORTS_SPARSE_FILES
            | fs_attributes::SUPPORTS_EXTENDED_ATTRIBUTES
            | if block_cloning {
                fs_attributes::SUPPORTS_BLOCK_REFCOUNTING
            } else {
                0
            },
        fs_name: "NTFS".into(),
    }
}
