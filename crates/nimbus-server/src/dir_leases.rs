//! Directory leases (SMB 3.x, SMB2_GLOBAL_CAP_DIRECTORY_LEASING): a client
//! holding a read-handle lease on a directory caches its listing and keeps
//! its handle open, so any change that would show in that listing breaks
//! the lease: a name created, removed or renamed in or out, and a child's
//! size, times or attributes (a write is counted when its handle closes,
//! as Windows does: smbtorture smb2.lease.v2_request checks that a write
//! alone breaks nothing). The rules are `caching::contend_children`; this
//! module only finds the directory a change happened in.

use nimbus_state::caching::LeaseId;
use nimbus_state::FileKey;
use nimbus_vfs::LocalFs;

use crate::server::Server;
use crate::session::Open;

/// `path` (relative to the share root of `fs`) was created, removed,
/// renamed or changed by a client whose open named `by` as its parent
/// lease. While no directory holds a lease this costs one atomic load.
pub fn child_changed(server: &Server, fs: &LocalFs, path: &str, by: Option<LeaseId>) {
    if !server.oplocks.has_dir_leases() {
        return;
    }
    // The share root has no directory above it that a lease could cache.
    if path.is_empty() {
        return;
    }
    // The directory as it is named now; if it went meanwhile, so did its
    // leases' reason to exist.
    let Ok(st) = fs.stat(crate::names::parent(path)) else {
        return;
    };
    server.oplocks.contend_children(
        FileKey {
            dev: st.dev,
            ino: st.ino,
        },
        by,
    );
}

/// The same for a change made through `open`.
pub fn open_changed(server: &Server, open: &Open) {
    if !server.oplocks.has_dir_leases() {
        return;
    }
    if let Some(fs) = open.share.fs.as_ref() {
        child_changed(server, fs, &open.path(), open.parent_lease);
    }
}
