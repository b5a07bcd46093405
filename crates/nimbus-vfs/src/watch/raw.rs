//! The inotify(7) system interface: one descriptor, its watches, and the
//! event records read from it, parsed without trusting their lengths.
//!
//! Straight on `libc` rather than the `inotify` crate: four system calls are
//! all that is needed, and the crate's parser `expect`s on mask bits it does
//! not know (a newer kernel's) and asserts on record lengths, where a watch
//! reader must skip what it does not understand and go on.

use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use crate::sys::errno;

/// What every kernel watch asks for: names coming and going, renames (both
/// halves), content writes, metadata changes, and the watched directory
/// itself moving away. Not IN_OPEN, IN_ACCESS or IN_CLOSE_*: reads and
/// closes change nothing a client is told about. IN_EXCL_UNLINK: a file
/// unlinked while still open reports nothing more under its old name.
pub(crate) const WATCH_MASK: u32 = libc::IN_CREATE
    | libc::IN_DELETE
    | libc::IN_MOVED_FROM
    | libc::IN_MOVED_TO
    | libc::IN_MODIFY
    | libc::IN_ATTRIB
    | libc::IN_MOVE_SELF
    | libc::IN_ONLYDIR
    | libc::IN_EXCL_UNLINK;

/// Bytes of `struct inotify_event` before the name.
const HEADER: usize = 16;

/// Room for many events per read; one event needs at most
/// HEADER + NAME_MAX + 1 bytes, far less.
pub(crate) const READ_BUFFER: usize = 64 * 1024;

/// The inotify descriptor, non-blocking: reads never wait, `poll` does.
pub(crate) struct Inotify {
    fd: OwnedFd,
}

impl Inotify {
    pub(crate) fn new() -> Result<Inotify, i32> {
        // SAFETY: plain system call without pointers.
        let fd = unsafe { libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC) };
        if fd < 0 {
            return Err(errno());
        }
        // SAFETY: fd is a fresh descriptor owned by nobody else.
        Ok(Inotify {
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
        })
    }

    pub(crate) fn raw(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// Watches the directory open as `dir`. inotify takes a path, not a
    /// descriptor: `/proc/self/fd/N` names the very directory the caller
    /// resolved beneath its share root, so no second lookup by name can be
    /// led elsewhere. Returns the watch descriptor (the same one for a
    /// directory already watched) or the errno.
    pub(crate) fn add(&self, dir: &OwnedFd) -> Result<i32, i32> {
        self.add_with(dir.as_raw_fd(), WATCH_MASK)
    }

    /// `add` of the directory open as descriptor `dir`, for the events of
    /// `mask`.
    pub(crate) fn add_with(&self, dir: RawFd, mask: u32) -> Result<i32, i32> {
        let Ok(path) = CString::new(format!("/proc/self/fd/{dir}")) else {
            return Err(libc::EINVAL);
        };
        // SAFETY: path is NUL-terminated.
        let wd = unsafe { libc::inotify_add_watch(self.raw(), path.as_ptr(), mask) };
        if wd < 0 {
            Err(errno())
        } else {
            Ok(wd)
        }
    }

    /// Ends a watch. The kernel answers with an IN_IGNORED record later;
    /// a watch already gone (its directory removed) is no error here.
    pub(crate) fn remove(&self, wd: i32) {
        // SAFETY: plain system call without pointers.
        unsafe { libc::inotify_rm_watch(self.raw(), wd) };
    }

    /// Bytes of events queued now (FIONREAD).
    pub(crate) fn queued(&self) -> usize {
        let mut n: libc::c_int = 0;
        // SAFETY: n is a valid out pointer for FIONREAD.
        let r = unsafe { libc::ioctl(self.raw(), libc::FIONREAD, &mut n) };
        if r < 0 {
            0
        } else {
            usize::try_from(n).unwrap_or(0)
        }
    }

    /// Reads whole events into `buf`; 0 when none are queued.
    pub(crate) fn read(&self, buf: &mut [u8]) -> Result<usize, i32> {
        loop {
            // SAFETY: buf is valid for writes of buf.len() bytes.
            let n = unsafe { libc::read(self.raw(), buf.as_mut_ptr().cast(), buf.len()) };
            if n >= 0 {
                return Ok(n as usize);
            }
            match errno() {
                libc::EINTR => continue,
                libc::EAGAIN => return Ok(0),
                e => return Err(e),
            }
        }
    }
}

/// One `struct inotify_event`, its name copied out (NUL padding removed).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct RawEvent {
    pub wd: i32,
    pub mask: u32,
    pub cookie: u32,
    pub name: Vec<u8>,
}

/// Appends the events in `buf` (what one read returned) to `out`. A record
/// whose length runs past the end stops the parse: the kernel never writes
/// one, and should it, the rest is dropped rather than misread.
pub(crate) fn parse(buf: &[u8], out: &mut Vec<RawEvent>) {
    let mut at = 0;
    while let Some(header) = buf.get(at..at + HEADER) {
        let word = |i: usize| {
            let mut b = [0u8; 4];
            b.copy_from_slice(&header[i..i + 4]);
            b
        };
        let wd = i32::from_ne_bytes(word(0));
        let mask = u32::from_ne_bytes(word(4));
        let cookie = u32::from_ne_bytes(word(8));
        let len = u32::from_ne_bytes(word(12)) as usize;
        let Some(name) = (at + HEADER)
            .checked_add(len)
            .and_then(|end| buf.get(at + HEADER..end))
        else {
            return;
        };
        let end = name.iter().position(|&b| b == 0).unwrap_or(name.len());
        out.push(RawEvent {
            wd,
            mask,
            cookie,
            name: name[..end].to_vec(),
        });
        at += HEADER + len;
    }
}

/// What one event record says happened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// The queue overflowed: events were lost (IN_Q_OVERFLOW, no watch).
    Overflow,
    /// The watch ended: removed, its directory deleted or unmounted.
    Ignored,
    /// The watched directory itself was moved.
    SelfMoved,
    Created,
    Removed,
    /// Data written or size changed.
    Written,
    /// Mode, owner, times, extended attributes or link count changed.
    Metadata,
    MovedFrom,
    MovedTo,
    /// Anything else (IN_UNMOUNT, IN_DELETE_SELF before its IN_IGNORED,
    /// bits a newer kernel adds): nothing to report.
    Other,
}

/// Classifies a mask. The kernel sets one event bit per record (plus
/// IN_ISDIR); should several come, the first in this order wins, the
/// bookkeeping ones first.
pub(crate) fn classify(mask: u32) -> Kind {
    const ORDER: [(u32, Kind); 9] = [
        (libc::IN_Q_OVERFLOW, Kind::Overflow),
        (libc::IN_IGNORED, Kind::Ignored),
        (libc::IN_MOVE_SELF, Kind::SelfMoved),
        (libc::IN_CREATE, Kind::Created),
        (libc::IN_DELETE, Kind::Removed),
        (libc::IN_MOVED_FROM, Kind::MovedFrom),
        (libc::IN_MOVED_TO, Kind::MovedTo),
        (libc::IN_MODIFY, Kind::Written),
        (libc::IN_ATTRIB, Kind::Metadata),
    ];
    ORDER
        .iter()
        .find(|(bit, _)| mask & bit != 0)
        .map_or(Kind::Other, |&(_, kind)| kind)
}

/// Whether the record is about a directory.
pub(crate) fn is_dir(mask: u32) -> bool {
    mask & libc::IN_ISDIR != 0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(wd: i32, mask: u32, cookie: u32, name: &[u8], padded: usize) -> Vec<u8> {
        let mut v = Vec::new();
        v.extend_from_slice(&wd.to_ne_bytes());
        v.extend_from_slice(&mask.to_ne_bytes());
        v.extend_from_slice(&cookie.to_ne_bytes());
        v.extend_from_slice(&(padded as u32).to_ne_bytes());
        v.extend_from_slice(name);
        v.resize(HEADER + padded, 0);
        v
    }

    #[test]
    fn records_parse_with_their_padding_removed() {
        let mut buf = record(1, libc::IN_CREATE, 0, b"a.txt", 16);
        buf.extend(record(-1, libc::IN_Q_OVERFLOW, 0, b"", 0));
        buf.extend(record(2, libc::IN_MOVED_FROM | libc::IN_ISDIR, 7, b"d", 4));
        let mut out = Vec::new();
        parse(&buf, &mut out);
        assert_eq!(
            out,
            [
                RawEvent {
                    wd: 1,
                    mask: libc::IN_CREATE,
                    cookie: 0,
                    name: b"a.txt".to_vec()
                },
                RawEvent {
                    wd: -1,
                    mask: libc::IN_Q_OVERFLOW,
                    cookie: 0,
                    name: Vec::new()
                },
                RawEvent {
                    wd: 2,
                    mask: libc::IN_MOVED_FROM | libc::IN_ISDIR,
                    cookie: 7,
                    name: b"d".to_vec()
                },
            ]
        );
    }

    #[test]
    fn truncated_or_lying_records_end_the_parse_without_panic() {
        let good = record(1, libc::IN_DELETE, 0, b"x", 4);
        for cut in 0..good.len() {
            let mut out = Vec::new();
            parse(&good[..cut], &mut out);
            assert!(out.is_empty(), "cut at {cut}");
        }
        // A length far past the buffer, and one near u32::MAX.
        for len in [1000usize, u32::MAX as usize] {
            let mut bad = good.clone();
            bad[12..16].copy_from_slice(&(len as u32).to_ne_bytes());
            let mut out = Vec::new();
            parse(&bad, &mut out);
            assert!(out.is_empty());
        }
        // A name without NUL padding is taken whole.
        let mut out = Vec::new();
        parse(&record(3, libc::IN_MODIFY, 0, b"abcd", 4), &mut out);
        assert_eq!(out[0].name, b"abcd");
    }

    #[test]
    fn masks_classify() {
        use Kind::*;
        let cases = [
            (libc::IN_CREATE, Created),
            (libc::IN_CREATE | libc::IN_ISDIR, Created),
            (libc::IN_DELETE, Removed),
            (libc::IN_MODIFY, Written),
            (libc::IN_ATTRIB, Metadata),
            (libc::IN_ATTRIB | libc::IN_ISDIR, Metadata),
            (libc::IN_MOVED_FROM, MovedFrom),
            (libc::IN_MOVED_TO | libc::IN_ISDIR, MovedTo),
            (libc::IN_MOVE_SELF, SelfMoved),
            (libc::IN_IGNORED, Ignored),
            (libc::IN_Q_OVERFLOW, Overflow),
            (libc::IN_UNMOUNT, Other),
            (libc::IN_DELETE_SELF, Other),
            (0, Other),
            // Bits no kernel sets today.
            (0x0010_0000, Other),
            (0x0010_0000 | libc::IN_CREATE, Created),
            // Bookkeeping first.
            (libc::IN_IGNORED | libc::IN_CREATE, Ignored),
        ];
        for (mask, kind) in cases {
            assert_eq!(classify(mask), kind, "mask {mask:#x}");
        }
        assert!(is_dir(libc::IN_CREATE | libc::IN_ISDIR));
        assert!(!is_dir(libc::IN_CREATE));
    }
}
