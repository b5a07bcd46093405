//! A share as the server serves it: what a tree connect names.
//!
//! Some of a share's settings may change while clients use it (a reload,
//! `nimbus_node::reload`): they are kept behind a lock and read where they
//! decide something, so that a change applies to the next request of
//! every connected client. The rest (the path, guest access, continuous
//! availability, Apple's extensions) were promised to the client at its
//! tree connect; a change of those replaces the share instead, and its
//! clients connect anew.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};

use nimbus_vfs::LocalFs;

use crate::config::{EncryptionPolicy, ShareConfig};
use crate::hide::HideNames;

/// What may change under connected clients.
pub struct ShareSettings {
    pub read_only: bool,
    /// This share's encryption policy (its own, else the server-wide one).
    /// A tree connect decides from it whether its requests must be
    /// encrypted (MS-SMB2 TreeConnect's ENCRYPT_DATA, told to the client
    /// then), so a change applies to tree connects made after it.
    pub encryption: EncryptionPolicy,
    /// Listings leave out what the user may not read (crate::acl).
    pub access_based_enumeration: bool,
    /// Shown beside the name when clients list the shares.
    pub comment: String,
    /// Names shown with FILE_ATTRIBUTE_HIDDEN (`crate::hide`).
    pub hide: HideNames,
}

pub struct Share {
    pub name: String,
    /// None for IPC$, which has no files.
    pub fs: Option<LocalFs>,
    pub guest_ok: bool,
    /// FILETIME reported as the volume's creation time.
    pub created: u64,
    /// Continuously available: persistent handles may be granted here.
    pub continuous_availability: bool,
    /// Apple's extensions for macOS clients (nimbus_node::apple).
    pub apple_extensions: bool,
    /// Bytes read and written here (`crate::metrics`).
    pub counters: crate::metrics::ShareCounters,
    settings: RwLock<Arc<ShareSettings>>,
    /// Taken out of the configuration: its tree connects are gone, and a
    /// request that still names one is told NETWORK_NAME_DELETED.
    removed: AtomicBool,
}

impl ShareSettings {
    /// A share's settings in `config`; `server_encryption` is the
    /// server-wide policy it falls back to.
    pub fn of(config: &ShareConfig, server_encryption: EncryptionPolicy) -> ShareSettings {
        ShareSettings {
            read_only: config.read_only,
            encryption: config.encryption.unwrap_or(server_encryption),
            access_based_enumeration: config.access_based_enumeration,
            comment: config.comment.clone(),
            // Checked with the configuration (share[i].hide_files).
            hide: HideNames::new(config.hide_dot_files, &config.hide_files)
                .unwrap_or_else(|_| HideNames::none()),
        }
    }
}

impl Share {
    /// A disk share over the directory `config` names.
    pub fn open(
        config: &ShareConfig,
        server_encryption: EncryptionPolicy,
        created: u64,
    ) -> nimbus_vfs::VfsResult<Share> {
        let fs = LocalFs::new(&config.path)?;
        Ok(Share {
            name: config.name.clone(),
            fs: Some(fs),
            guest_ok: config.guest_ok,
            created,
            continuous_availability: config.continuous_availability,
            apple_extensions: config.apple_extensions,
            counters: crate::metrics::ShareCounters::new(&config.name),
            settings: RwLock::new(Arc::new(ShareSettings::of(config, server_encryption))),
            removed: AtomicBool::new(false),
        })
    }

    /// IPC$, the named pipes' share.
    pub fn ipc(encryption: EncryptionPolicy, created: u64) -> Share {
        Share {
            name: "IPC$".into(),
            fs: None,
            guest_ok: false,
            created,
            continuous_availability: false,
            apple_extensions: false,
            counters: crate::metrics::ShareCounters::new("IPC$"),
            settings: RwLock::new(Arc::new(ShareSettings {
                read_only: true,
                encryption,
                access_based_enumeration: false,
                // As Windows describes its IPC$.
                comment: "Remote IPC".into(),
                hide: HideNames::none(),
            })),
            removed: AtomicBool::new(false),
        }
    }

    /// A share with default settings over `fs` (unit tests).
    #[cfg(test)]
    pub fn for_test(fs: Option<LocalFs>) -> Share {
        Share {
            name: "t".into(),
            fs,
            guest_ok: false,
            created: 0,
            continuous_availability: false,
            apple_extensions: false,
            counters: crate::metrics::ShareCounters::new("t"),
            settings: RwLock::new(Arc::new(ShareSettings {
                read_only: false,
                encryption: EncryptionPolicy::Off,
                access_based_enumeration: false,
                comment: String::new(),
                hide: HideNames::none(),
            })),
            removed: AtomicBool::new(false),
        }
    }

    pub fn is_ipc(&self) -> bool {
        self.fs.is_none()
    }

    /// The settings now; each request reads them once.
    pub fn settings(&self) -> Arc<ShareSettings> {
        match self.settings.read() {
            Ok(s) => s.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    pub fn read_only(&self) -> bool {
        self.settings().read_only
    }

    pub fn encryption(&self) -> EncryptionPolicy {
        self.settings().encryption
    }

    pub fn access_based_enumeration(&self) -> bool {
        self.settings().access_based_enumeration
    }

    /// Puts new settings in place (a reload).
    pub fn set_settings(&self, settings: ShareSettings) {
        let settings = Arc::new(settings);
        match self.settings.write() {
            Ok(mut s) => *s = settings,
            Err(poisoned) => *poisoned.into_inner() = settings,
        }
    }

    /// Whether a change from `old` to `new` must replace this share: it
    /// changes what clients were told when they connected, or its files.
    pub fn must_replace(old: &ShareConfig, new: &ShareConfig) -> bool {
        old.path != new.path
            || old.guest_ok != new.guest_ok
            || old.continuous_availability != new.continuous_availability
            || old.apple_extensions != new.apple_extensions
    }

    pub fn mark_removed(&self) {
        self.removed.store(true, Ordering::SeqCst);
    }

    pub fn is_removed(&self) -> bool {
        self.removed.load(Ordering::SeqCst)
    }
}
