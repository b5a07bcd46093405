//! The directory an open resolves its file's name through, for a cluster
//! node's lookups of that file (docs/SCALING.md, "New files"): a file
//! another node made under a claim on the directory has no `own/` record,
//! only the claim, so every lookup made while the file is opened compares
//! the claim of the directory the name came through. The store's calls
//! take keys only; the directory reaches them as a scope on the thread
//! (`nimbus_state::opening_in`).

use nimbus_state::{FileKey, OpeningIn};
use nimbus_vfs::{LocalFs, Stat, VfsResult};

use crate::server::Server;

/// The key of the directory `path` (share-relative, as on disk) is an
/// entry of, on a cluster node: through a final symlink, its target's (the
/// name the file was made by). None on a node alone, and for the share's
/// root. An error when it cannot be read: the open is refused then, not
/// looked up comparing no claim.
pub fn directory_of(server: &Server, fs: &LocalFs, path: &str) -> VfsResult<Option<FileKey>> {
    if server.cluster.is_none() {
        return Ok(None);
    }
    Ok(fs
        .entry_directory(path)?
        .and_then(|st| key_of_directory(&st)))
}

/// The key a directory's stat gives it in the lookups' scope (None for
/// what is not a directory): the same whether the stat came from
/// [`directory_of`] or from a lookup's descriptor
/// (`LocalFs::lookup_in_directory`).
pub fn key_of_directory(st: &Stat) -> Option<FileKey> {
    st.is_dir.then(|| FileKey::new(st.dev, st.ino, st.gen))
}

/// The lookups of this thread are of a file opened through `dir` while
/// the scope lives.
pub fn through(dir: Option<FileKey>) -> Option<OpeningIn> {
    dir.map(|d| nimbus_state::opening_in(d.record_key(&[])))
}
