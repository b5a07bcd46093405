//! Case-insensitive name resolution. Windows clients expect names to match
//! regardless of case (MS-FSA 2.1.5.1: names are compared case-insensitively
//! unless the open asks for case sensitivity, which SMB2 cannot), while the
//! local file system compares bytes. Existing spellings are found by
//! listing the directory, only when the name as given does not exist.

use nimbus_vfs::{CreateMode, Kind, LocalFs, OpenOptions};

use nimbus_vfs::names::{dos_name, eq_ignore_case, join, may_be_dos_name, pick_ignoring_case};

/// `path` with every component that exists under another case replaced by
/// its on-disk spelling, and every component that is the made 8.3 name
/// (`nimbus_vfs::names::dos_name`) of an entry and no name of its own replaced
/// by that entry's name (MS-FSA 2.1.5.1: a name is found by its long or its
/// short name); components that exist in neither form are kept as given
/// (the caller then creates them, or reports them missing).
///
/// A directory's entries are tried as 8.3 names only up to
/// `max_dos_entries` of them (`limits.max_directory_entries`, the most one
/// listing shows: a short name is learnt from a listing).
pub fn resolve(fs: &LocalFs, path: &str, max_dos_entries: usize) -> String {
    if path.is_empty() || fs.stat(path).is_ok() {
        return path.to_string();
    }
    let mut resolved = String::with_capacity(path.len());
    let mut components = path.split('/');
    for comp in components.by_ref() {
        let candidate = join(&resolved, comp);
        if fs.stat(&candidate).is_ok() {
            resolved = candidate;
            continue;
        }
        match spelling_in(fs, &resolved, comp, max_dos_entries) {
            Some(found) => resolved = join(&resolved, &found),
            None => {
                resolved = candidate;
                break;
            }
        }
    }
    for rest in components {
        resolved = join(&resolved, rest);
    }
    resolved
}

/// The on-disk name in directory `dir` equal to `name` ignoring case, or
/// whose 8.3 name it is (among the first `max_dos_entries` listed). A
/// large directory's names are indexed (nimbus_vfs::NameIndex, kept from
/// the kernel's change events), so that creating many new names in it
/// does not list it each time; others are listed.
fn spelling_in(fs: &LocalFs, dir: &str, name: &str, max_dos_entries: usize) -> Option<String> {
    let opts = OpenOptions {
        read: false,
        write: false,
        mode: CreateMode::OpenExisting,
        kind: Kind::Directory,
        perm: 0,
        append_only: false,
        expect: None,
    };
    let (handle, st, _) = fs.open(dir, &opts).ok()?;
    let key = (st.dev, st.ino);
    // A made 8.3 name (nimbus_vfs::names::dos_name) reaches its long name: only
    // a listing finds that.
    let short = may_be_dos_name(name);
    let index = fs.name_index();
    if !short {
        if let Some(spellings) = index.and_then(|i| i.spellings(key, name)) {
            return pick_ignoring_case(&spellings, name).map(str::to_string);
        }
    }
    // The listing grows with the directory: let the runtime move this
    // worker's other tasks elsewhere meanwhile (a no-op off the runtime's
    // workers), and keep only the names that could be meant.
    let mut entries = 0usize;
    let names = nimbus_state::blocking::off_worker(|| {
        handle.find_names(|n| {
            entries += 1;
            // The share's store of named streams is the server's own: no
            // spelling of a client's, its 8.3 name included, reaches it
            // (the name as given is refused before: names::to_vfs_path).
            if dir.is_empty() && eq_ignore_case(n, nimbus_vfs::STORE_DIR) {
                return false;
            }
            eq_ignore_case(n, name)
                || (short && entries <= max_dos_entries && eq_ignore_case(&dos_name(n), name))
        })
    })
    .ok()?;
    if let Some(index) = index {
        nimbus_state::blocking::off_worker(|| index.index(&handle, key, entries));
    }
    if let Some(found) = pick_ignoring_case(&names, name) {
        return Some(found.to_string());
    }
    names.into_iter().min()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The 8.3 name of the share's stream store names no entry: a client
    /// that spells the store that way reaches a name of its own, never the
    /// store.
    #[test]
    fn no_spelling_reaches_the_stream_store() {
        let dir = std::env::temp_dir().join(format!("nimbus-lookup-store-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join(nimbus_vfs::STORE_DIR).join("inside")).unwrap();
        std::fs::create_dir_all(dir.join("Long Directory")).unwrap();
        let fs = LocalFs::new(&dir).unwrap();
        let short = dos_name(nimbus_vfs::STORE_DIR);
        assert_eq!(
            resolve(&fs, &format!("{short}/inside"), 1000),
            format!("{short}/inside")
        );
        // Other short names still reach their entries.
        assert_eq!(
            resolve(&fs, &dos_name("Long Directory"), 1000),
            "Long Directory"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn short_names_reach_long_names_in_every_component() {
        let dir = std::env::temp_dir().join(format!("nimbus-lookup-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("Long Directory/Inner Folder Name")).unwrap();
        std::fs::write(
            dir.join("Long Directory/Inner Folder Name/report 2024.xlsx"),
            b"x",
        )
        .unwrap();
        let fs = LocalFs::new(&dir).unwrap();
        let path = format!(
            "{}/{}/{}",
            dos_name("Long Directory").to_lowercase(),
            dos_name("Inner Folder Name"),
            dos_name("report 2024.xlsx")
        );
        assert_eq!(
            resolve(&fs, &path, 1000),
            "Long Directory/Inner Folder Name/report 2024.xlsx"
        );
        // Case alone, and a name that is neither: kept as given from there.
        assert_eq!(
            resolve(&fs, "long directory/x~1.txt", 1000),
            "Long Directory/x~1.txt"
        );
        // Beyond the entries a listing shows, no 8.3 name is tried.
        let short = dos_name("Long Directory");
        assert_eq!(resolve(&fs, &short, 0), short);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
