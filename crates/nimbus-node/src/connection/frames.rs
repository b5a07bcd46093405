//! What the connection loop learns of a received frame before it is
//! dispatched: the room its responses may take, whether it runs in place
//! or on the blocking pool, in order or side by side, and, for a small
//! sealed frame, its messages opened where it was read (MS-SMB2
//! 3.3.5.2.1.1). Reads headers only; requests are handled by the
//! dispatcher (`crate::connection::Dispatch`).

use std::sync::Arc;

use nimbus_wire::create::create_options::WRITE_THROUGH;
use nimbus_wire::header::{chain_offsets, Command, TRANSFORM_PROTOCOL_ID};
use nimbus_wire::transform::{TransformHeader, TRANSFORM_HEADER_SIZE};
use nimbus_wire::write::WRITEFLAG_WRITE_THROUGH;

use crate::connection::{Connection, Outgoing};
use crate::limits::Limits;
use crate::security::SessionCipher;
use crate::session::SessionState;
use crate::sync::lock;

/// Something to do once a response is on its way to the client.
pub type OnSent = Box<dyn FnOnce() + Send>;

/// Room reserved for any one response beyond its payload: headers, error
/// responses and the small responses of most commands.
pub const RESPONSE_OVERHEAD: usize = 64 * 1024;

/// How many bytes the responses to a received frame may take, reserved
/// from the connection's memory budget before the frame is processed. A
/// request that moves data is charged one credit per 64 KiB (MS-SMB2
/// 3.3.5.2.5), so its charge bounds its response. Given the messages of a
/// small sealed frame the reader opened (`unseal_small`), it counts them;
/// a sealed frame left unopened (larger than `SEALED_OPEN_MAX`) cannot be
/// looked into and may hold one request of the largest size.
pub fn response_allowance(frame: &[u8], limits: &Limits) -> usize {
    let max_io = limits.max_io() as usize;
    if frame.starts_with(&TRANSFORM_PROTOCOL_ID) {
        return max_io + RESPONSE_OVERHEAD;
    }
    let total: usize = chain_offsets(frame, limits.max_compound_requests)
        .map(|off| {
            let charge = u16::from_le_bytes([frame[off + 6], frame[off + 7]]).max(1) as usize;
            (charge * 65536).min(max_io) + RESPONSE_OVERHEAD
        })
        .sum();
    total.max(RESPONSE_OVERHEAD)
}

/// Frames larger than this, less the data of their quick WRITEs, always
/// go to the blocking pool.
pub const QUICK_FRAME_MAX: usize = 16 * 1024;

/// READs of at most this many bytes run in place (`is_quick`): a read from
/// the page cache costs little more than the copy, 64 KiB in some 5 µs, so
/// less than the hand-over it saves; larger ones (streaming) still spread
/// over the pool's threads.
const QUICK_READ_MAX: u32 = 64 * 1024;

/// WRITEs of at most this many bytes run in place (`is_quick`) when their
/// file's file system lets them be written without waiting (`quick_write`):
/// the copy into the page cache costs what a READ's copy out of it does.
const QUICK_WRITE_MAX: u32 = 64 * 1024;

/// A little-endian u32 of the request body at `off` + 64 + `at`.
fn body_u32(frame: &[u8], off: usize, at: usize) -> Option<u32> {
    let start = off.checked_add(64 + at)?;
    let bytes = frame.get(start..start.checked_add(4)?)?;
    Some(u32::from_le_bytes(bytes.try_into().ok()?))
}

/// The data length of the WRITE request at `off` if it may run in place,
/// or None. MS-SMB2 2.2.21: after the 64-byte header, StructureSize (2),
/// DataOffset (2), Length (4), Offset (8), FileId (16: persistent, then
/// volatile), Channel (4), RemainingBytes (4), WriteChannelInfoOffset (2),
/// WriteChannelInfoLength (2), Flags (4). In place: at most
/// `QUICK_WRITE_MAX` bytes, not written through (an fsync waits for the
/// disk: by the request's flag or its open's mode, MS-FSA 2.1.5.3), to an
/// open of this connection's session (not a related request's FileId of
/// all ones) whose file system takes writes that do not wait
/// (`FileHandle::writes_without_waiting`: on ext4, whose buffered writes
/// refuse RWF_NOWAIT, a write waits for the writeback when the page cache
/// is full of dirty pages, so it goes to the pool).
fn quick_write(frame: &[u8], off: usize, conn: &Connection) -> Option<usize> {
    let len = body_u32(frame, off, 4)?;
    if len > QUICK_WRITE_MAX || body_u32(frame, off, 44)? & WRITEFLAG_WRITE_THROUGH != 0 {
        return None;
    }
    let word = |at: usize| {
        let start = off.checked_add(at)?;
        let bytes = frame.get(start..start.checked_add(8)?)?;
        Some(u64::from_le_bytes(bytes.try_into().ok()?))
    };
    let (session, volatile) = (word(40)?, word(64 + 24)?);
    let open = conn.session(session)?.open(volatile)?;
    let through = open.mode.load(std::sync::atomic::Ordering::Relaxed) & WRITE_THROUGH != 0;
    (!open.is_dir && !through && open.handle.writes_without_waiting()).then_some(len as usize)
}

/// Whether a frame may be processed on the connection's reader task rather
/// than handed to the blocking pool. Handing over costs two thread wake-ups
/// per request (to a pool thread, and back to the writer), which on small
/// metadata requests was most of the server's CPU (BENCHMARKS.md);
/// requests that only touch metadata finish in microseconds on a local
/// file system, so they run in place. So do small READs (up to
/// `QUICK_READ_MAX`): they read what the page cache holds without waiting
/// and hand only a read that must wait for the disk off the worker
/// (the READ handler); and small WRITEs where the file system lets them
/// (`quick_write`), likewise. Other data transfer (FLUSH, larger READs
/// and WRITEs), directory listings, IOCTLs and the encrypted frames the
/// reader did not open (`unseal_small`: those larger than
/// `SEALED_OPEN_MAX`, which may ask for a read of any size) still go to
/// the pool, where a slow disk blocks nobody else. The cost: a metadata
/// call that is slow after all (unlinking a huge file on delete-on-close,
/// truncating one on overwrite, a hung network file system) holds one
/// runtime worker meanwhile; the other workers take over its queued tasks.
/// CREATE and LOCK on a continuously available share go to the pool:
/// they may wait for the state store's fsync (a persistent handle's record
/// is on disk before the client hears of it), and many of them waiting
/// together is what lets one commit serve them all.
///
/// A cluster node decides the files it owns from memory, so its metadata
/// commands run in place too; when one needs etcd after all, it waits off
/// the worker (`nimbus_state::blocking`). They stay in order with the
/// connection's requests queued before them (`is_ordered`): while that
/// queue holds any, they join it.
pub fn is_quick(frame: &[u8], limits: &Limits, conn: &Connection) -> bool {
    if frame.starts_with(&TRANSFORM_PROTOCOL_ID) {
        return false;
    }
    // Looked into only when small, or when a WRITE's data may be most of it.
    if frame.len() > QUICK_FRAME_MAX + QUICK_WRITE_MAX as usize {
        return false;
    }
    let mut write_data = 0usize;
    let each = chain_offsets(frame, limits.max_compound_requests).all(|off| {
        let command = u16::from_le_bytes([frame[off + 12], frame[off + 13]]);
        match Command::from_u16(command) {
            // MS-SMB2 2.2.19: Length after StructureSize (2), Padding (1)
            // and Flags (1).
            Some(Command::Read) => body_u32(frame, off, 4).is_some_and(|n| n <= QUICK_READ_MAX),
            Some(Command::Write) => quick_write(frame, off, conn)
                .map(|n| write_data += n)
                .is_some(),
            Some(Command::Flush | Command::QueryDirectory | Command::Ioctl) => false,
            Some(Command::Create | Command::Lock)
                if conn.server.offers_persistent_handles() && on_ca_share(frame, off, conn) =>
            {
                false
            }
            // CANCEL must reach what waits in the queue; ECHO keeps the
            // connection alive.
            Some(Command::Cancel | Command::Echo) => true,
            _ if conn.server.cluster.is_some() => conn.ordered_queue_is_empty(),
            _ => true,
        }
    });
    each && frame.len().saturating_sub(write_data) <= QUICK_FRAME_MAX
}

/// Whether a frame that is not quick must run after the connection's
/// earlier such frames (`Connection`'s serial queue): on a cluster node,
/// a frame of metadata commands only, which would run in place, in order,
/// on a single node. Data transfer, listings and IOCTLs, and encrypted
/// frames (which cannot be looked into), run side by side.
pub fn is_ordered(frame: &[u8], limits: &Limits, conn: &Connection) -> bool {
    if conn.server.cluster.is_none() || frame.starts_with(&TRANSFORM_PROTOCOL_ID) {
        return false;
    }
    chain_offsets(frame, limits.max_compound_requests).all(|off| !is_data_command(frame, off))
}

/// Whether the request at `off` of a chain moves data or lists (READ,
/// WRITE, FLUSH, QUERY_DIRECTORY, IOCTL): it never waits on another client.
fn is_data_command(frame: &[u8], off: usize) -> bool {
    matches!(
        Command::from_u16(u16::from_le_bytes([frame[off + 12], frame[off + 13]])),
        Some(
            Command::Read
                | Command::Write
                | Command::Flush
                | Command::QueryDirectory
                | Command::Ioctl
        )
    )
}

/// Whether the request at `off` (or, for a related request naming no tree,
/// the frame's first) is on a tree of a continuously available share.
fn on_ca_share(frame: &[u8], off: usize, conn: &Connection) -> bool {
    let ids = |at: usize| {
        let mut tree = [0u8; 4];
        let mut session = [0u8; 8];
        tree.copy_from_slice(&frame[at + 36..at + 40]);
        session.copy_from_slice(&frame[at + 40..at + 48]);
        (u32::from_le_bytes(tree), u64::from_le_bytes(session))
    };
    let ca = |(tree, session): (u32, u64)| {
        conn.session(session)
            .and_then(|s| lock(&s.trees).get(&tree).cloned())
            .map(|t| t.share.continuous_availability)
    };
    ca(ids(off)).or_else(|| ca(ids(0))).unwrap_or(false)
}

/// The session whose keys decrypted a request frame; they encrypt the
/// response.
pub struct Encrypted {
    pub session_id: u64,
    pub cipher: Arc<SessionCipher>,
}

/// MS-SMB2 3.3.5.2.1.1: a TRANSFORM message is decrypted with the keys of
/// the session it names. Anything wrong (too short, unknown session, no
/// keys, bad size, failed authentication) closes the connection.
pub fn decrypt(conn: &Connection, frame: &mut [u8]) -> Option<Encrypted> {
    let Ok(hdr) = TransformHeader::parse(frame) else {
        refuse(conn, "encrypted message shorter than its TRANSFORM header");
        return None;
    };
    let cipher = conn
        .session(hdr.session_id)
        .and_then(|s| match &*lock(&s.state) {
            SessionState::Valid(auth) => auth.cipher.clone(),
            SessionState::InProgress { .. } => None,
        });
    let Some(cipher) = cipher else {
        refuse(
            conn,
            &format!(
                "encrypted message for session {:#x}, which has no encryption keys",
                hdr.session_id
            ),
        );
        return None;
    };
    if let Err(e) = cipher.open(&hdr, frame) {
        refuse(
            conn,
            &format!(
                "encrypted message for session {:#x} not accepted: {e:?}",
                hdr.session_id
            ),
        );
        return None;
    }
    Some(Encrypted {
        session_id: hdr.session_id,
        cipher,
    })
}

/// A sealed frame that could not be opened: the connection was closed
/// (`refuse` logged why).
#[derive(Debug)]
pub struct Refused;

/// A sealed frame opened on the connection's reader (`unseal_small`):
/// its messages follow the TRANSFORM header in plaintext.
pub struct Unsealed(pub Encrypted);

/// Sealed frames of at most this many bytes are opened where they were
/// read (`unseal_small`): room for a quick WRITE's data besides the
/// requests, so that a small encrypted WRITE can run in place too.
const SEALED_OPEN_MAX: usize = TRANSFORM_HEADER_SIZE + QUICK_FRAME_MAX + QUICK_WRITE_MAX as usize;

/// Opens a sealed frame of at most SEALED_OPEN_MAX bytes where it was
/// read: a few microseconds of AES, after which it is looked into like a
/// frame that came in the clear (run in place when quick, in order with
/// the frames around it). Unopened it went to the pool, where a request
/// could overtake the CANCEL before it: smbtorture smb2.session.expire2e
/// saw a NOTIFY's answer before the CANCELLED of the NOTIFY it had
/// cancelled first. Ok(None): not sealed, or big (opened on the pool);
/// Err: refused, the connection closes.
pub fn unseal_small(conn: &Connection, frame: &mut [u8]) -> Result<Option<Unsealed>, Refused> {
    if frame.len() > SEALED_OPEN_MAX || !frame.starts_with(&TRANSFORM_PROTOCOL_ID) {
        return Ok(None);
    }
    decrypt(conn, frame)
        .map(|e| Some(Unsealed(e)))
        .ok_or(Refused)
}

/// The SMB2 messages of a frame: after its TRANSFORM header once opened.
pub fn messages<'a>(frame: &'a [u8], unsealed: &Option<Unsealed>) -> &'a [u8] {
    match unsealed {
        Some(_) => &frame[TRANSFORM_HEADER_SIZE..],
        None => frame,
    }
}

pub fn refuse(conn: &Connection, why: &str) -> Option<Outgoing> {
    tracing::warn!("{}: {why}; closing connection", conn.peer);
    conn.close();
    None
}

pub fn ends_handles_command(cmd: Option<Command>) -> bool {
    matches!(
        cmd,
        Some(Command::Close | Command::TreeDisconnect | Command::Logoff)
    )
}

/// Whether a plaintext frame holds only data commands (READ, WRITE, FLUSH,
/// QUERY_DIRECTORY, IOCTL), which never wait on another client: the
/// frames a CLOSE behind them waits for (`crate::arrivals`).
pub fn data_only(frame: &[u8], limits: &Limits) -> bool {
    !frame.starts_with(&TRANSFORM_PROTOCOL_ID)
        && chain_offsets(frame, limits.max_compound_requests).all(|off| is_data_command(frame, off))
}

/// Whether a frame holds a CLOSE, TREE_DISCONNECT or LOGOFF, which must
/// not overtake the connection's frames already on the blocking pool
/// (`crate::arrivals`). An encrypted frame cannot be looked into: it runs
/// on the pool, and waits there if it holds one.
pub fn ends_handles(frame: &[u8], limits: &Limits) -> bool {
    !frame.starts_with(&TRANSFORM_PROTOCOL_ID)
        && chain_offsets(frame, limits.max_compound_requests).any(|off| {
            ends_handles_command(Command::from_u16(u16::from_le_bytes([
                frame[off + 12],
                frame[off + 13],
            ])))
        })
}
