//! Every open of the server by open id, so that what one open changes
//! about a file is seen by the others: a rename moves the name every open
//! of that file (and of anything beneath it, for a directory) knows it by,
//! whichever session or connection holds it. Weak references: an open
//! belongs to its session; this table only finds it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

use nimbus_state::FileKey;

use crate::open::Open;
use crate::sync::lock;

#[derive(Default)]
pub struct OpenRegistry {
    opens: Mutex<HashMap<u64, Weak<Open>>>,
}

impl OpenRegistry {
    pub fn register(&self, open: &Arc<Open>) {
        lock(&self.opens).insert(open.open_id, Arc::downgrade(open));
    }

    pub fn forget(&self, open_id: u64) {
        lock(&self.opens).remove(&open_id);
    }

    /// The open `open_id`, while it is open.
    pub fn get(&self, open_id: u64) -> Option<Arc<Open>> {
        lock(&self.opens).get(&open_id).and_then(Weak::upgrade)
    }

    /// Every open that `pred` picks.
    pub fn matching(&self, pred: impl Fn(&Open) -> bool) -> Vec<Arc<Open>> {
        lock(&self.opens)
            .values()
            .filter_map(Weak::upgrade)
            .filter(|o| pred(o))
            .collect()
    }

    /// How many opens the server has.
    pub fn len(&self) -> usize {
        lock(&self.opens).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether `open_id` is open (not yet released).
    pub fn contains(&self, open_id: u64) -> bool {
        lock(&self.opens).contains_key(&open_id)
    }

    /// `file` was renamed from `from` to `to` (share-relative paths) on
    /// the share at `root`: every open of it, and every open beneath it,
    /// now goes by the new name. Returns those opens.
    pub fn renamed(
        &self,
        root: &std::path::Path,
        file: FileKey,
        from: &str,
        to: &str,
    ) -> Vec<Arc<Open>> {
        let opens: Vec<Arc<Open>> = lock(&self.opens)
            .values()
            .filter_map(Weak::upgrade)
            .collect();
        let prefix = format!("{from}/");
        let mut moved = Vec::new();
        for open in opens {
            let same_share = open
                .share
                .fs
                .as_ref()
                .is_some_and(|fs| fs.root_path() == root);
            if !same_share {
                continue;
            }
            let mut path = lock(&open.path);
            if open.file_key == file {
                *path = to.to_string();
            } else if let Some(rest) = path.strip_prefix(&prefix) {
                *path = format!("{to}/{rest}");
            } else {
                continue;
            }
            drop(path);
            moved.push(open);
        }
        moved
    }

    /// Whether anything beneath directory `dir` (share-relative) of the
    /// share at `root` is open: such a directory cannot be renamed.
    pub fn open_below(&self, root: &std::path::Path, dir: &str) -> bool {
        let prefix = format!("{dir}/");
        lock(&self.opens)
            .values()
            .filter_map(Weak::upgrade)
            .any(|open| {
                open.share
                    .fs
                    .as_ref()
                    .is_some_and(|fs| fs.root_path() == root)
                    && lock(&open.path).starts_with(&prefix)
            })
    }
}
