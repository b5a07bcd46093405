//! What macOS clients expect of an SMB server beyond MS-SMB2 (Apple's
//! extensions; nimbus_wire::apple has their layouts). A share serves them
//! unless it says `apple_extensions = false`.
//!
//! - The AAPL create context: a Mac asks on its first CREATE what the
//!   server offers and says what it wants; the answer holds for the whole
//!   connection (`AppleState`).
//! - The two streams a Mac keeps per file: AFP_AfpInfo, 60 bytes whose
//!   Finder information (type, creator, colour label...) Finder reads and
//!   writes as a whole (`afp_info`), and AFP_Resource, the resource fork.
//!   Their rules are those a macOS server applies (the ones smbtorture's
//!   vfs.fruit suite checks): an AfpInfo exists only once a valid one was
//!   written, and one with empty Finder information is deleted; an empty
//!   resource fork is not listed, and a Mac's request to delete a resource
//!   fork that has data is ignored.
//! - For a connection that negotiated AAPL: empty named streams do not
//!   exist for an open that does not create them (macOS clients create
//!   streams speculatively and treat an empty one as absent); directory
//!   listings carry each file's Finder information, resource fork size and
//!   Unix mode (`readdir`); security descriptors carry the Unix owner,
//!   group and mode (`nfs_ace`); a copy-chunk request without chunks copies
//!   a whole file with its streams (the IOCTL handler's `copyfile`); and a directory handle may
//!   be renamed with files below it open, as on a Mac's own file systems.

pub mod afp_info;
pub mod apple_double;
pub mod nfs_ace;
pub mod readdir;

use std::sync::atomic::{AtomicU8, Ordering};

use nimbus_wire::apple::{afp_info as layout, bitmap, caps, command, AaplReply, AaplRequest};
use nimbus_wire::create::CreateContext;
use nimbus_wire::NtStatus;

use nimbus_vfs::{CreateMode, Kind, OpenOptions};

use crate::open::Open;
use crate::share::Share;

/// How this module opens the streams (and companion files) it reads and
/// writes itself: as plain files, the server's own.
pub fn file_options(mode: CreateMode, read: bool, write: bool) -> OpenOptions {
    OpenOptions {
        read,
        write,
        mode,
        kind: Kind::File,
        perm: 0o600,
        append_only: false,
        expect: None,
    }
}

/// What a connection negotiated with the AAPL create context.
#[derive(Default, Debug)]
pub struct AppleState(AtomicU8);

const NEGOTIATED: u8 = 0x1;
const READ_DIR_ATTR: u8 = 0x2;
const COPYFILE: u8 = 0x4;

impl AppleState {
    fn has(&self, bit: u8) -> bool {
        self.0.load(Ordering::Relaxed) & bit != 0
    }

    /// The connection's client is a Mac that asked for Apple's semantics,
    /// and `share` serves them.
    pub fn on(&self, share: &Share) -> bool {
        share.apple_extensions && self.has(NEGOTIATED)
    }

    /// Listings of `share` carry READ_DIR_ATTR's fields.
    pub fn readdir_attr(&self, share: &Share) -> bool {
        self.on(share) && self.has(READ_DIR_ATTR)
    }

    /// A copy-chunk request without chunks copies a whole file.
    pub fn copyfile(&self, share: &Share) -> bool {
        self.on(share) && self.has(COPYFILE)
    }
}

/// The server capabilities offered: all four are served.
const SERVER_CAPS: u64 = caps::UNIX_BASED
    | caps::SUPPORTS_READ_DIR_ATTR
    | caps::SUPPORTS_OSX_COPYFILE
    | caps::SUPPORTS_NFS_ACE;

/// Answers the AAPL contexts of a CREATE (each of them: a client may ask
/// again on the same connection), and records what the connection now
/// has. None when the request carries none or the share does not serve
/// Apple's extensions (the context is then ignored, as any unknown one).
pub fn negotiate(
    apple_model: &str,
    state: &AppleState,
    share: &Share,
    contexts: &[CreateContext],
) -> Result<Option<Vec<u8>>, NtStatus> {
    let Some(c) = contexts
        .iter()
        .find(|c| c.name.as_slice() == nimbus_wire::apple::CONTEXT_NAME)
    else {
        return Ok(None);
    };
    if !share.apple_extensions {
        return Ok(None);
    }
    let req = AaplRequest::parse(&c.data).map_err(|_| NtStatus::INVALID_PARAMETER)?;
    if req.command != command::SERVER_QUERY {
        return Err(NtStatus::INVALID_PARAMETER);
    }
    let reply_bitmap =
        req.request_bitmap & (bitmap::SERVER_CAPS | bitmap::VOLUME_CAPS | bitmap::MODEL_INFO);
    // READ_DIR_ATTR changes listings: only for a client that says it
    // reads them that way.
    let server_caps = if req.client_caps & caps::SUPPORTS_READ_DIR_ATTR != 0 {
        SERVER_CAPS
    } else {
        SERVER_CAPS & !caps::SUPPORTS_READ_DIR_ATTR
    };
    let mut bits = NEGOTIATED;
    if server_caps & caps::SUPPORTS_READ_DIR_ATTR != 0 {
        bits |= READ_DIR_ATTR;
    }
    // A client that learnt of OSX_COPYFILE may rely on it.
    if reply_bitmap & bitmap::SERVER_CAPS != 0 {
        bits |= COPYFILE;
    }
    state.0.fetch_or(bits, Ordering::Relaxed);
    let mut out = Vec::with_capacity(64);
    AaplReply {
        reply_bitmap,
        server_caps,
        // Names are matched ignoring case, FULL_SYNC is Time Machine's and
        // file ids are not resolved to paths: none of the three.
        volume_caps: 0,
        model: apple_model,
    }
    .encode(&mut out);
    Ok(Some(out))
}

/// One of the two streams a Mac keeps per file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AppleStream {
    AfpInfo,
    Resource,
}

/// Which of the Apple streams `name` (without `:$DATA`) is on `share`, if
/// any (macOS spells them one way; they are matched ignoring case, as
/// every stream name is).
pub fn stream_kind(share: &Share, name: &str) -> Option<AppleStream> {
    if !share.apple_extensions {
        None
    } else if name.eq_ignore_ascii_case(layout::STREAM_NAME) {
        Some(AppleStream::AfpInfo)
    } else if name.eq_ignore_ascii_case(nimbus_wire::apple::RESOURCE_STREAM_NAME) {
        Some(AppleStream::Resource)
    } else {
        None
    }
}

/// The Apple stream an open is of, if it is one.
pub fn open_kind(open: &Open) -> Option<AppleStream> {
    let stream = open.stream.as_ref()?;
    stream_kind(&open.share, &crate::sync::lock(&stream.name))
}

/// Whether the named stream `name` of `size` bytes exists for the client
/// of `state`: an AfpInfo only once a valid one is stored (60 bytes), and
/// for a Mac no empty stream at all.
pub fn stream_exists(state: &AppleState, share: &Share, name: &str, size: u64) -> bool {
    if stream_kind(share, name) == Some(AppleStream::AfpInfo) && size != layout::SIZE as u64 {
        return false;
    }
    !(size == 0 && state.on(share))
}

/// Whether a stream listing (FileStreamInformation) shows the stream: as
/// `stream_exists`, and never an empty resource fork.
pub fn stream_listed(state: &AppleState, share: &Share, name: &str, size: u64) -> bool {
    if size == 0 && stream_kind(share, name) == Some(AppleStream::Resource) {
        return false;
    }
    stream_exists(state, share, name, size)
}
