//! Directory leases (SMB 3.x, SMB2_GLOBAL_CAP_DIRECTORY_LEASING): a client
//! holding a read-handle lease on a directory caches its listing and keeps
//! its handle open, so any change that would show in that listing breaks
//! the lease: a name created, removed or renamed in or out, and a child's
//! size, times or attributes (a write is counted when its handle closes,
//! as Windows does: smbtorture smb2.lease.v2_request checks that a write
//! alone breaks nothing). The rules are `caching::contend_children`; this
//! module only finds the directory a change happened in, and on a cluster
//! node knows which directories other nodes' clients hold leases on.

use std::sync::Arc;

use nimbus_state::caching::LeaseId;
use nimbus_state::FileKey;
use nimbus_vfs::LocalFs;

use crate::cluster::Membership;
use crate::cluster_registry::Registry;
use crate::open::Open;
use crate::oplocks::{DirLeasesElsewhere, Oplocks};

/// Key prefix of a cluster node's directory leases:
/// `dirlease/<node>/<dev>-<ino>` (hexadecimal).
pub const DIRLEASE_PREFIX: &[u8] = b"dirlease/";

/// The directory leases of a cluster's nodes (`crate::cluster_registry`):
/// a change made on one node inside a directory another node's client
/// holds a lease on breaks that lease through the directory's caching
/// record, which the cluster store shares between them.
pub struct ClusterDirLeases(Arc<Registry>);

fn item(dir: FileKey) -> String {
    format!("{:x}-{:x}-{:x}", dir.dev, dir.ino, dir.gen)
}

impl ClusterDirLeases {
    /// Registers this node's leases and keeps a copy of the others' (a
    /// watch thread).
    pub fn start(m: Arc<Membership>) -> Arc<ClusterDirLeases> {
        let registry = Registry::new(m, DIRLEASE_PREFIX, "lease on directory");
        registry.follow("nimbus-dirleases");
        Arc::new(ClusterDirLeases(registry))
    }
}

impl DirLeasesElsewhere for ClusterDirLeases {
    fn any(&self) -> bool {
        self.0.any()
    }

    fn holds(&self, dir: FileKey) -> bool {
        self.0.others().contains_key(&item(dir))
    }

    fn set_mine(&self, dir: FileKey, held: bool) {
        self.0.set_mine(&item(dir), held.then_some(&b"1"[..]));
    }
}

/// `path` (relative to the share root of `fs`) was created, removed,
/// renamed or changed by a client whose open named `by` as its parent
/// lease. While no directory holds a lease this costs one atomic load.
pub fn child_changed(oplocks: &Oplocks, fs: &LocalFs, path: &str, by: Option<LeaseId>) {
    if !oplocks.has_dir_leases() {
        return;
    }
    // The share root has no directory above it that a lease could cache.
    if path.is_empty() {
        return;
    }
    // The directory as it is named now; if it went meanwhile, so did its
    // leases' reason to exist.
    let Ok(st) = fs.stat(nimbus_vfs::names::parent(path)) else {
        return;
    };
    // The parent's own records: not under the claim of the directory the
    // open came through (another one, when its name was a symlink).
    let _directory = nimbus_state::of_a_directory();
    oplocks.contend_children(
        FileKey {
            dev: st.dev,
            ino: st.ino,
            gen: st.gen,
        },
        by,
    );
}

/// The same for a change made through `open`.
pub fn open_changed(oplocks: &Oplocks, open: &Open) {
    if !oplocks.has_dir_leases() {
        return;
    }
    if let Some(fs) = open.share.fs.as_ref() {
        child_changed(oplocks, fs, &open.path(), open.parent_lease);
    }
}
