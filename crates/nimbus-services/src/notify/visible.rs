//! Which changes a watcher hears of: the names a listing would show it.
//!
//! The handle of a watch was checked for the right to list the watched
//! directory only (MS-FSA 2.1.5.10), but a WATCH_TREE watch hears of names
//! in every directory beneath it, and each entry names the path down to
//! them. So an entry is reported only when the watcher may list
//! (FILE_LIST_DIRECTORY) every directory between the watched one and the
//! changed name, as it would have to in order to see the name. On a share
//! with access-based enumeration, every name on that path must moreover
//! be one a listing shows the watcher (`check::SEEN_WITH_ABE`, as
//! nimbus_server::handlers::query_directory leaves out the rest), the changed name
//! included.
//!
//! The rights are those the stored descriptors grant the watcher's token
//! (crate::acl); a file or directory without one limits nothing, and one
//! whose descriptor cannot be read shows nothing. A name already gone is
//! judged by its descriptor as the change left it: a rename's old name by
//! the new one (the same file), a file deleted through SMB by the
//! descriptor read from its handle at the deletion (`Known`). Otherwise,
//! under access-based enumeration, a name no longer there is not reported
//! (a file removed on the server's disk, or on another cluster node): its
//! descriptor is gone with it, and the name may have been one the watcher
//! was not to see.
//!
//! Checked at delivery to each watch (`ChangeNotify::deliver_local`), the
//! one place changes made through SMB, seen on disk and relayed from
//! other cluster nodes all pass, outside the watches' mutex. Only entries
//! that need it are checked: those below the watched directory, and on a
//! share with access-based enumeration all of them. The descriptors read
//! are kept for the delivery, so a batch reads each path's once.

use std::collections::HashMap;
use std::sync::Arc;

use nimbus_vfs::LocalFs;
use nimbus_wire::fscc::access;
use nimbus_wire::notify::NotifyAction;
use nimbus_wire::security_descriptor::SecurityDescriptor;

use super::{parent_of, Change};
use crate::acl::check::{self, ALL_RIGHTS};
use crate::acl::{store, Token};
use crate::share::Share;

/// Whom a watch reports to: the watcher's SIDs, and the share it watches
/// through (its files, and whether it enumerates by access).
#[derive(Clone)]
pub struct Viewer {
    pub token: Arc<Token>,
    pub share: Arc<Share>,
}

impl Viewer {
    /// Whether an entry of a watch needs checking: it is below the watched
    /// directory (`direct` false), or the share enumerates by access.
    pub(super) fn checks(&self, direct: bool) -> bool {
        !direct || self.share.access_based_enumeration()
    }
}

/// A stored descriptor as read: None when the file has none; Err when it
/// cannot be read (gone, or an error of the disk).
pub type Stored = Result<Option<SecurityDescriptor>, ()>;

/// Descriptors known at the change, by share-relative path: what the
/// handler that made it read before the name went.
pub type Known = Vec<(String, Stored)>;

/// The descriptors read in one delivery, by share-relative path.
pub(super) struct Descriptors {
    read: HashMap<String, Stored>,
}

impl Descriptors {
    pub(super) fn new(known: Known) -> Descriptors {
        Descriptors {
            read: known.into_iter().collect(),
        }
    }

    fn stored(&mut self, fs: &LocalFs, path: &str) -> &Stored {
        self.read
            .entry(path.to_string())
            .or_insert_with(|| store::read(fs, path).map_err(|_| ()))
    }

    /// The rights the descriptor of `path` grants `token`.
    fn rights(&mut self, fs: &LocalFs, path: &str, token: &Token) -> u32 {
        match self.stored(fs, path) {
            Ok(Some(sd)) => check::granted(sd, token),
            Ok(None) => ALL_RIGHTS,
            Err(()) => 0,
        }
    }

    /// Whether `viewer`, watching the directory `watched`, may hear of
    /// the change `path` whose own descriptor is `object`'s (see
    /// `object_of`).
    pub(super) fn may_see(
        &mut self,
        viewer: &Viewer,
        watched: &str,
        path: &str,
        object: &str,
    ) -> bool {
        let Some(fs) = viewer.share.fs.as_ref() else {
            return false;
        };
        let token = &*viewer.token;
        let abe = viewer.share.access_based_enumeration();
        // Every directory between the watched one and the name: listed to
        // reach it (and under access-based enumeration, shown).
        let need = if abe {
            check::SEEN_WITH_ABE
        } else {
            access::FILE_LIST_DIRECTORY
        };
        let mut dir = parent_of(path);
        while let Some(d) = dir {
            if d == watched {
                break;
            }
            if self.rights(fs, d, token) & need != need {
                return false;
            }
            dir = parent_of(d);
        }
        !abe || self.rights(fs, object, token) & check::SEEN_WITH_ABE == check::SEEN_WITH_ABE
    }
}

/// The path whose descriptor is that of what `changes[i]` names: a named
/// stream's file; for a rename's old name (RENAMED_OLD_NAME, or REMOVED
/// across directories, followed by its new name in the same batch), the
/// new name; otherwise the name itself.
pub(super) fn object_of<'c>(changes: &[Change<'c>], i: usize) -> &'c str {
    let c = changes[i];
    match c.action {
        NotifyAction::AddedStream | NotifyAction::RemovedStream | NotifyAction::ModifiedStream => {
            c.path.rsplit_once(':').map_or(c.path, |(file, _)| file)
        }
        NotifyAction::RenamedOldName | NotifyAction::Removed => match changes.get(i + 1) {
            Some(next)
                if changes.len() == 2
                    && next.filter == c.filter
                    && matches!(
                        (c.action, next.action),
                        (NotifyAction::RenamedOldName, NotifyAction::RenamedNewName)
                            | (NotifyAction::Removed, NotifyAction::Added)
                    ) =>
            {
                next.path
            }
            _ => c.path,
        },
        _ => c.path,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::acl::token::well_known;
    use nimbus_auth::MachineSid;
    use nimbus_wire::security_descriptor::{ace_type, control, Ace, Acl};

    const M: MachineSid = MachineSid([7, 8, 9]);

    fn change(action: NotifyAction, path: &str) -> Change<'_> {
        Change {
            action,
            filter: 1,
            path,
        }
    }

    #[test]
    fn a_renames_old_name_and_a_streams_change_are_judged_by_what_they_name() {
        use NotifyAction::*;
        let pair = [
            change(RenamedOldName, "d/old"),
            change(RenamedNewName, "d/new"),
        ];
        assert_eq!(object_of(&pair, 0), "d/new");
        assert_eq!(object_of(&pair, 1), "d/new");
        let across = [change(Removed, "a/f"), change(Added, "b/f")];
        assert_eq!(object_of(&across, 0), "b/f");
        // A removal on its own is the name itself.
        assert_eq!(object_of(&[change(Removed, "a/f")], 0), "a/f");
        assert_eq!(object_of(&[change(AddedStream, "d/f:s")], 0), "d/f");
    }

    #[test]
    fn directories_on_the_way_must_be_listable() {
        let alice = Token::user(M, 1000);
        let mallory = Token::user(M, 1001);
        let dir = tempdir();
        std::fs::create_dir_all(dir.join("top/hr")).unwrap();
        let fs = LocalFs::new(&dir).unwrap();
        // hr: mallory may not list it; alice may.
        let sd = SecurityDescriptor {
            control: control::SELF_RELATIVE | control::DACL_PRESENT,
            owner: Some(alice.user.clone()),
            group: None,
            sacl: None,
            dacl: Some(Acl::new(vec![
                Ace::new(
                    ace_type::ACCESS_DENIED,
                    0,
                    access::FILE_LIST_DIRECTORY,
                    mallory.user.clone(),
                ),
                Ace::new(
                    ace_type::ACCESS_ALLOWED,
                    0,
                    ALL_RIGHTS,
                    well_known::everyone(),
                ),
            ])),
        };
        let (h, _, _) = fs
            .open(
                "top/hr",
                &nimbus_vfs::OpenOptions {
                    read: true,
                    write: false,
                    mode: nimbus_vfs::CreateMode::OpenExisting,
                    kind: nimbus_vfs::Kind::Any,
                    perm: 0o700,
                    append_only: false,
                    expect: None,
                },
            )
            .unwrap();
        store::write(&h, &sd).unwrap();
        let share = Arc::new(test_share(fs));
        let viewer = |token: &Token| Viewer {
            token: Arc::new(token.clone()),
            share: share.clone(),
        };
        let mut sds = Descriptors::new(Vec::new());
        for (path, mallory_sees) in [
            ("top/hr/secret.xlsx", false),
            ("top/hr", true),
            ("top/public.txt", true),
        ] {
            assert_eq!(
                sds.may_see(&viewer(&mallory), "", path, path),
                mallory_sees,
                "{path}"
            );
            assert!(sds.may_see(&viewer(&alice), "", path, path), "{path}");
        }
        // A watch of hr itself was checked when its handle was opened.
        assert!(sds.may_see(&viewer(&mallory), "top/hr", "top/hr/x", "top/hr/x"));
        // A directory gone, or one whose descriptor cannot be read, shows
        // nothing beneath it.
        let mut gone = Descriptors::new(vec![("top".into(), Err(()))]);
        assert!(!gone.may_see(&viewer(&alice), "", "top/public.txt", "top/public.txt"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    fn tempdir() -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("nimbus-notify-visible-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn test_share(fs: LocalFs) -> Share {
        Share::for_test(Some(fs))
    }
}
