//! The named-stream part of CREATE (MS-FSCC 2.1.5.3, `file:stream:$DATA`):
//! the file a stream belongs to, made when a stream of a missing file is
//! created (as NTFS does), and the stream's entry among that file's opens.

use nimbus_state::share_modes::STREAM_OPEN;
use nimbus_state::{FileKey, OpenRecord};
use nimbus_vfs::{CreateMode, FileHandle, Kind, LocalFs, OpenOptions, Stat, Streams, VfsError};
use nimbus_wire::create::CreateDisposition;
use nimbus_wire::NtStatus;

use crate::errors::{sharing_status, vfs_status};
use crate::server::{Server, Share};
use nimbus_vfs::names::pick_ignoring_case;

/// The file a stream CREATE names.
pub struct Base {
    /// Attribute-only: its metadata, and the way to its streams.
    pub handle: FileHandle,
    pub stat: Stat,
    pub key: FileKey,
    /// Made by this CREATE.
    pub created: bool,
    /// None while the file has no named streams.
    pub streams: Option<Streams>,
}

impl Base {
    /// The stream `name` as it is spelled on disk (matched ignoring case,
    /// as Windows matches stream names), and its metadata; None when the
    /// file has no such stream.
    pub fn find(&self, name: &str) -> Result<Option<(String, Stat)>, NtStatus> {
        let Some(streams) = &self.streams else {
            return Ok(None);
        };
        if let Ok(st) = streams.stat(name) {
            return Ok(Some((name.to_string(), st)));
        }
        let names = streams.names().map_err(|e| vfs_status(&e))?;
        let Some(spelled) = pick_ignoring_case(&names, name) else {
            return Ok(None);
        };
        match streams.stat(spelled) {
            Ok(st) => Ok(Some((spelled.to_string(), st))),
            Err(VfsError::NotFound) => Ok(None),
            Err(e) => Err(vfs_status(&e)),
        }
    }

    /// Gives the file a (new, empty) store of streams if it has none, for
    /// a stream about to be created.
    pub fn make_streams(&mut self, fs: &LocalFs) -> Result<(), NtStatus> {
        if self.streams.is_none() {
            self.streams = fs.streams(&self.handle, true).map_err(|e| vfs_status(&e))?;
        }
        Ok(())
    }
}

/// Opens the file a stream CREATE names. A missing one is made, as an
/// empty file, when the disposition creates and `may_create`; otherwise
/// the stream is OBJECT_NAME_NOT_FOUND.
pub fn open_base(
    fs: &LocalFs,
    path: &str,
    disposition: CreateDisposition,
    may_create: bool,
) -> Result<Base, NtStatus> {
    let mut opts = OpenOptions {
        read: false,
        write: false,
        mode: CreateMode::OpenExisting,
        kind: Kind::Any,
        perm: 0o644,
        append_only: false,
        expect: None,
    };
    let (handle, stat, created) = match fs.open(path, &opts) {
        Ok(found) => found,
        Err(VfsError::NotFound) if disposition.creates() => {
            if !may_create {
                return Err(NtStatus::ACCESS_DENIED);
            }
            opts.mode = CreateMode::OpenOrCreate;
            opts.kind = Kind::File;
            fs.open(path, &opts).map_err(|e| vfs_status(&e))?
        }
        Err(e) => return Err(vfs_status(&e)),
    };
    let streams = fs.streams(&handle, false).map_err(|e| vfs_status(&e))?;
    Ok(Base {
        key: FileKey {
            dev: stat.dev,
            ino: stat.ino,
            gen: stat.gen,
        },
        handle,
        stat,
        created,
        streams,
    })
}

/// A stream open's entry among its file's opens (`STREAM_OPEN`): refused
/// while the file is delete-pending, and dropped again unless the CREATE
/// goes through (`keep`).
pub struct BaseEntry<'a> {
    server: &'a Server,
    share: &'a Share,
    path: String,
    base_is_dir: bool,
    key: FileKey,
    open_id: u64,
    kept: bool,
}

impl<'a> BaseEntry<'a> {
    pub fn add(
        server: &'a Server,
        share: &'a Share,
        path: &str,
        base: &Base,
        open_id: u64,
        share_access: u32,
    ) -> Result<BaseEntry<'a>, NtStatus> {
        let record = OpenRecord {
            open_id,
            access: 0,
            share_access: STREAM_OPEN | (share_access & 0x7),
        };
        server
            .share_modes
            .add_open(base.key, record)
            .map_err(|e| sharing_status(&e))?;
        Ok(BaseEntry {
            server,
            share,
            path: path.to_string(),
            base_is_dir: base.stat.is_dir,
            key: base.key,
            open_id,
            kept: false,
        })
    }

    /// The CREATE went through: the entry stays until the open closes.
    pub fn keep(mut self) {
        self.kept = true;
    }
}

impl Drop for BaseEntry<'_> {
    fn drop(&mut self) {
        if self.kept {
            return;
        }
        // The last entry of a file deleted meanwhile: the file goes now.
        if let Ok(true) = self.server.share_modes.remove_open(self.key, self.open_id) {
            crate::release::delete_abandoned(
                self.server,
                self.share,
                &self.path,
                self.base_is_dir,
                self.key,
            );
        }
    }
}
