//! The AFP_AfpInfo stream, as a macOS server keeps it. Finder treats it as
//! one 60-byte record, not as data: it is read whole whatever the offset
//! (up to its end), written whole, and only a valid one (signature "AFP",
//! version 1) is kept. Until one is written the stream exists only for the
//! handle that created it: it reads as an empty record and is 60 bytes
//! long, but nobody else can open it and listings do not show it. Writing
//! one whose Finder information is all zeros deletes it.
//!
//! On disk it is a named stream like any other: 60 bytes once valid, 0
//! while only created (such a leftover is removed when its last handle
//! closes).

use nimbus_wire::apple::afp_info::{self as layout, FINDER_INFO, FINDER_INFO_LEN, SIZE};
use nimbus_wire::NtStatus;

use crate::errors::vfs_status;
use crate::open::Open;

/// What the stream holds now: the stored record, or an empty one while
/// none is.
fn current(open: &Open) -> Result<[u8; SIZE], NtStatus> {
    let mut blob = [0u8; SIZE];
    let st = open.handle.stat().map_err(|e| vfs_status(&e))?;
    if st.size == SIZE as u64 {
        let n = open
            .handle
            .read_at(&mut blob, 0)
            .map_err(|e| vfs_status(&e))?;
        if n == SIZE {
            return Ok(blob);
        }
    }
    Ok(layout::empty())
}

/// READ: up to `length` bytes of the record from its start when `offset`
/// is within it (a macOS server reads the record whole; smbtorture
/// vfs.fruit "read metadata"), nothing past it.
pub fn read(open: &Open, offset: u64, length: u32) -> Result<Vec<u8>, NtStatus> {
    if offset > SIZE as u64 {
        return Ok(Vec::new());
    }
    let blob = current(open)?;
    Ok(blob[..(length as usize).min(SIZE)].to_vec())
}

/// WRITE of `data` at `offset`: refused (INVALID_PARAMETER) unless it
/// starts a record ("AFP", at least 3 bytes; at an offset other than 0 only
/// a whole record); one that ends before the Finder information changes
/// nothing; otherwise the record is stored at the start of the stream,
/// whatever the offset. A record with empty Finder information truncates
/// the stream and deletes it when this handle closes. Returns the bytes to
/// report written: all of them.
pub fn write(open: &Open, offset: u64, data: &[u8]) -> Result<usize, NtStatus> {
    if data.len() < 3 || (offset != 0 && data.len() < SIZE) || &data[..3] != b"AFP" {
        return Err(NtStatus::INVALID_PARAMETER);
    }
    if data.len() <= FINDER_INFO {
        return Ok(data.len());
    }
    let mut blob = layout::empty();
    let n = data.len().min(SIZE);
    blob[..n].copy_from_slice(&data[..n]);
    if layout::finder_info(&blob).is_none() {
        return Err(NtStatus::INVALID_PARAMETER);
    }
    let vfs = |e: nimbus_vfs::VfsError| vfs_status(&e);
    if blob[FINDER_INFO..FINDER_INFO + FINDER_INFO_LEN]
        .iter()
        .all(|&b| b == 0)
    {
        // A Mac clears a file's Finder information by writing it empty;
        // a macOS server then deletes the stream (the handle stays usable
        // until it closes, and listings stop showing it at once).
        open.handle.set_len(0).map_err(vfs)?;
        open.delete_on_close
            .store(true, std::sync::atomic::Ordering::SeqCst);
        return Ok(data.len());
    }
    open.handle.write_at(&blob, 0).map_err(vfs)?;
    open.handle.set_len(SIZE as u64).map_err(vfs)?;
    Ok(data.len())
}

/// SET_INFO FileEndOfFileInformation (or allocation): the record's size
/// is fixed; a larger one is ALLOTTED_SPACE_EXCEEDED, a smaller one changes
/// nothing (Finder truncates before it writes).
pub fn set_size(size: u64) -> Result<(), NtStatus> {
    if size > SIZE as u64 {
        return Err(NtStatus::ALLOTTED_SPACE_EXCEEDED);
    }
    Ok(())
}

/// The size a query reports for an open of the stream: always the
/// record's.
pub const REPORTED_SIZE: u64 = SIZE as u64;

/// Whether the stream an open of it closes holds no record (it was only
/// created, or cleared): then it goes when its last handle closes.
pub fn holds_no_record(open: &Open) -> bool {
    open.handle.stat().is_ok_and(|st| st.size != SIZE as u64)
}
