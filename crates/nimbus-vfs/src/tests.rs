//! Behaviour tests of the local backend against real temporary directories.

use std::collections::HashSet;
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::symlink;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::{CreateMode, Identity, Kind, LocalFs, OpenOptions, Stat, Timespec, VfsError};

/// A scratch directory `base/` holding `base/share/` (the share root) and `base/outside/`
/// (a secret the share must never reach). Removed on drop.
struct Scratch {
    base: PathBuf,
    fs: LocalFs,
}

impl Scratch {
    fn new() -> Scratch {
        static N: AtomicUsize = AtomicUsize::new(0);
        let base = std::env::temp_dir().join(format!(
            "nimbus-vfs-test-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&base);
        std::fs::create_dir_all(base.join("share")).unwrap();
        std::fs::create_dir_all(base.join("outside")).unwrap();
        std::fs::write(base.join("outside/secret"), b"secret").unwrap();
        let fs = LocalFs::new(&base.join("share")).unwrap();
        Scratch { base, fs }
    }

    fn share(&self) -> PathBuf {
        self.base.join("share")
    }

    fn outside(&self) -> PathBuf {
        self.base.join("outside")
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.base);
    }
}

fn opts(read: bool, write: bool, mode: CreateMode, kind: Kind) -> OpenOptions {
    OpenOptions {
        read,
        write,
        mode,
        kind,
        perm: 0o644,
        append_only: false,
        expect: None,
    }
}

fn rw(mode: CreateMode) -> OpenOptions {
    opts(true, true, mode, Kind::File)
}

fn mkdir(fs: &LocalFs, path: &str) {
    let (h, st, created) = fs
        .open(
            path,
            &opts(false, false, CreateMode::CreateNew, Kind::Directory),
        )
        .unwrap();
    assert!(h.is_dir() && st.is_dir && created);
}

fn write_file(fs: &LocalFs, path: &str, data: &[u8]) {
    let (h, _, _) = fs.open(path, &rw(CreateMode::CreateOrTruncate)).unwrap();
    assert_eq!(h.write_at(data, 0).unwrap(), data.len());
}

fn read_file(fs: &LocalFs, path: &str) -> Vec<u8> {
    let (h, st, _) = fs
        .open(
            path,
            &opts(true, false, CreateMode::OpenExisting, Kind::File),
        )
        .unwrap();
    let mut buf = vec![0u8; st.size as usize + 16];
    let n = h.read_at(&mut buf, 0).unwrap();
    buf.truncate(n);
    buf
}

macro_rules! assert_err {
    ($e:expr, $pat:pat) => {
        match $e {
            Err($pat) => {}
            Err(other) => panic!("expected {}, got error {other:?}", stringify!($pat)),
            Ok(_) => panic!("expected {}, got Ok", stringify!($pat)),
        }
    };
}

#[test]
fn new_requires_directory() {
    let s = Scratch::new();
    assert_eq!(s.fs.root_path(), s.share().as_path());
    assert_err!(
        LocalFs::new(&s.outside().join("secret")),
        VfsError::NotADirectory
    );
    assert_err!(LocalFs::new(&s.base.join("nope")), VfsError::NotFound);
}

#[test]
fn create_modes() {
    let s = Scratch::new();
    let fs = &s.fs;
    assert_err!(
        fs.open("f", &rw(CreateMode::OpenExisting)),
        VfsError::NotFound
    );
    assert_err!(
        fs.open("f", &rw(CreateMode::TruncateExisting)),
        VfsError::NotFound
    );

    let (h, st, created) = fs.open("f", &rw(CreateMode::CreateNew)).unwrap();
    assert!(created && !st.is_dir && st.size == 0 && !h.is_dir());
    h.write_at(b"hello", 0).unwrap();
    drop(h);
    assert_err!(fs.open("f", &rw(CreateMode::CreateNew)), VfsError::Exists);

    let (_, st, created) = fs.open("f", &rw(CreateMode::OpenExisting)).unwrap();
    assert!(!created && st.size == 5);
    let (_, st, created) = fs.open("f", &rw(CreateMode::OpenOrCreate)).unwrap();
    assert!(!created && st.size == 5);
    let (_, st, created) = fs.open("f", &rw(CreateMode::TruncateExisting)).unwrap();
    assert!(!created && st.size == 0);

    write_file(fs, "f", b"again");
    let (_, st, created) = fs.open("f", &rw(CreateMode::CreateOrTruncate)).unwrap();
    assert!(!created && st.size == 0);

    let (_, _, created) = fs.open("g", &rw(CreateMode::OpenOrCreate)).unwrap();
    assert!(created);
    let (_, _, created) = fs.open("h", &rw(CreateMode::CreateOrTruncate)).unwrap();
    assert!(created);
    // Kind::Any creates a file.
    let (h, st, created) = fs
        .open("i", &opts(true, true, CreateMode::CreateNew, Kind::Any))
        .unwrap();
    assert!(created && !st.is_dir && !h.is_dir());
    assert!(s.share().join("i").is_file());
}

#[test]
fn directories_and_kinds() {
    let s = Scratch::new();
    let fs = &s.fs;
    mkdir(fs, "d");
    assert!(s.share().join("d").is_dir());
    assert_err!(
        fs.open(
            "d",
            &opts(false, false, CreateMode::CreateNew, Kind::Directory)
        ),
        VfsError::Exists
    );
    let (_, _, created) = fs
        .open(
            "d",
            &opts(false, false, CreateMode::OpenOrCreate, Kind::Directory),
        )
        .unwrap();
    assert!(!created);
    let (_, _, created) = fs
        .open(
            "e",
            &opts(false, false, CreateMode::OpenOrCreate, Kind::Directory),
        )
        .unwrap();
    assert!(created && s.share().join("e").is_dir());

    // Kind::Any with write access on a directory still opens it as a directory.
    let (h, st, _) = fs
        .open("d", &opts(true, true, CreateMode::OpenExisting, Kind::Any))
        .unwrap();
    assert!(h.is_dir() && st.is_dir);
    assert_err!(h.read_at(&mut [0u8; 4], 0), VfsError::IsADirectory);
    assert_err!(h.write_at(b"x", 0), VfsError::IsADirectory);
    h.sync().unwrap();

    assert_err!(
        fs.open("d", &rw(CreateMode::OpenExisting)),
        VfsError::IsADirectory
    );
    assert_err!(
        fs.open(
            "d",
            &opts(true, true, CreateMode::TruncateExisting, Kind::Any)
        ),
        VfsError::IsADirectory
    );
    write_file(fs, "file", b"x");
    assert_err!(
        fs.open(
            "file",
            &opts(false, false, CreateMode::OpenExisting, Kind::Directory)
        ),
        VfsError::NotADirectory
    );
    assert_err!(
        fs.open(
            "file",
            &opts(false, false, CreateMode::OpenOrCreate, Kind::Directory)
        ),
        VfsError::NotADirectory
    );
    assert_err!(h.set_len(0), VfsError::IsADirectory);
    let fh = fs.open("file", &rw(CreateMode::OpenExisting)).unwrap().0;
    assert_err!(fh.read_dir(), VfsError::NotADirectory);
}

#[test]
fn root_opens_as_directory() {
    let s = Scratch::new();
    let fs = &s.fs;
    let (h, st, created) = fs
        .open("", &opts(true, false, CreateMode::OpenExisting, Kind::Any))
        .unwrap();
    assert!(h.is_dir() && st.is_dir && !created);
    let (h2, _, _) = fs
        .open(
            "",
            &opts(false, false, CreateMode::OpenOrCreate, Kind::Directory),
        )
        .unwrap();
    assert!(h2.is_dir());
    assert_err!(
        fs.open("", &rw(CreateMode::OpenExisting)),
        VfsError::IsADirectory
    );
    assert_err!(
        fs.open(
            "",
            &opts(false, false, CreateMode::CreateNew, Kind::Directory)
        ),
        VfsError::Exists
    );
    assert!(fs.stat("").unwrap().is_dir);
    assert_err!(fs.rmdir(""), VfsError::AccessDenied);
    assert_err!(fs.unlink(""), VfsError::IsADirectory);
    assert_err!(fs.rename("", "x", false), VfsError::AccessDenied);
    write_file(fs, "x", b"");
    let names: Vec<_> = h.read_dir().unwrap().into_iter().map(|e| e.name).collect();
    assert_eq!(names, ["x"]);
}

#[test]
fn read_write_round_trip() {
    let s = Scratch::new();
    let fs = &s.fs;
    let (h, _, _) = fs.open("data", &rw(CreateMode::CreateNew)).unwrap();
    let payload: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
    assert_eq!(h.write_at(&payload, 0).unwrap(), payload.len());
    assert_eq!(h.write_at(b"tail", 300_000).unwrap(), 4);
    let st = h.stat().unwrap();
    assert_eq!(st.size, 300_004);

    let mut buf = vec![0u8; payload.len()];
    assert_eq!(h.read_at(&mut buf, 0).unwrap(), payload.len());
    assert_eq!(buf, payload);
    // The hole reads as zeros; a read across EOF is short.
    let mut buf = [1u8; 8];
    assert_eq!(h.read_at(&mut buf, 299_998).unwrap(), 6);
    assert_eq!(&buf[..6], b"\0\0tail");
    assert_eq!(h.read_at(&mut buf, 1_000_000).unwrap(), 0);
    assert_eq!(read_file(fs, "data").len(), 300_004);
    // read_append grows the Vec by what was read, after what it held.
    let mut grown = b"head".to_vec();
    assert_eq!(h.read_append(&mut grown, 100, 299_998).unwrap(), 6);
    assert_eq!(grown, b"head\0\0tail");
    assert_eq!(h.read_append(&mut grown, 8, 1_000_000).unwrap(), 0);
    assert_eq!(grown.len(), 10);
    assert_eq!(h.read_append(&mut grown, 1000, 0).unwrap(), 1000);
    assert_eq!(&grown[10..], &payload[..1000]);

    h.set_len(10).unwrap();
    assert_eq!(h.stat().unwrap().size, 10);
    h.allocate(1 << 20).unwrap();
    assert_eq!(h.stat().unwrap().size, 10);
    h.sync().unwrap();

    assert_err!(h.write_at(b"x", u64::MAX), VfsError::InvalidParameter);
    assert_err!(h.read_at(&mut buf, 1 << 63), VfsError::InvalidParameter);
    assert_err!(
        h.read_append(&mut grown, 1, 1 << 63),
        VfsError::InvalidParameter
    );
    assert_err!(h.set_len(u64::MAX), VfsError::InvalidParameter);

    let t = Timespec {
        sec: 1_000_000_000,
        nsec: 123_456_789,
    };
    h.set_times(Some(t), None).unwrap();
    let st = h.stat().unwrap();
    assert_eq!(st.atime, t);
    assert_ne!(st.mtime, t);
    h.set_times(None, Some(t)).unwrap();
    assert_eq!(h.stat().unwrap().mtime, t);
    h.set_mode(0o600).unwrap();
    assert_eq!(h.stat().unwrap().mode, 0o600);
    assert_eq!(fs.stat("data").unwrap().mode, 0o600);
}

/// `read_append_cached` on a file just written (so in the page cache), on
/// the temporary directory's file system and, where there is one, on
/// tmpfs (which may not know RWF_NOWAIT and is read in full anyway).
/// The temporary directory (a disk file system, ext4 on the test
/// machines) and /dev/shm (tmpfs) where there is one: the page-cache
/// tests run on both.
fn disk_and_memory_roots() -> Vec<std::path::PathBuf> {
    let mut roots = vec![std::env::temp_dir()];
    if std::path::Path::new("/dev/shm").is_dir() {
        roots.push("/dev/shm".into());
    }
    roots
}

#[test]
fn cached_reads_read_what_the_page_cache_holds() {
    for root in disk_and_memory_roots() {
        let base = root.join(format!("nimbus-vfs-cached-{}", std::process::id()));
        std::fs::create_dir_all(&base).unwrap();
        let fs = LocalFs::new(&base).unwrap();
        let (h, _, _) = fs.open("data", &rw(CreateMode::CreateNew)).unwrap();
        let payload: Vec<u8> = (0..100_000u32).map(|i| (i % 253) as u8).collect();
        h.write_at(&payload, 0).unwrap();
        let mut got = b"head".to_vec();
        let (n, short) = h.read_append_cached(&mut got, 70_000, 40_000).unwrap();
        // Whatever was read is right; a short read is finished by
        // read_append, as handlers::read does.
        let rest = if short {
            h.read_append(&mut got, 70_000 - n, 40_000 + n as u64)
                .unwrap()
        } else {
            0
        };
        assert_eq!(n + rest, 60_000, "{root:?}: end of file");
        assert_eq!(&got[..4], b"head");
        assert_eq!(&got[4..], &payload[40_000..], "{root:?}");
        // tmpfs holds all its files: never short there (a disk file
        // system without RWF_NOWAIT may say it cannot tell).
        if root.starts_with("/dev/shm") {
            assert!(!short, "{root:?}: a read from memory stopped short");
        }
        // Again on the same handle (on tmpfs without RWF_NOWAIT, now
        // known to be in memory: read at once).
        let mut again = Vec::new();
        let (n, short) = h.read_append_cached(&mut again, 1_000, 99_500).unwrap();
        let rest = if short {
            h.read_append(&mut again, 1_000 - n, 99_500 + n as u64)
                .unwrap()
        } else {
            0
        };
        assert_eq!(n + rest, 500, "{root:?}: the second read's end of file");
        assert_eq!(again, &payload[99_500..], "{root:?}: the second read");
        let (n, short) = h.read_append_cached(&mut got, 10, 1 << 30).unwrap();
        assert_eq!((n, short), (0, false), "{root:?}: past the end");
        assert_err!(
            h.read_append_cached(&mut got, 1, 1 << 63),
            VfsError::InvalidParameter
        );
        drop(h);
        let _ = std::fs::remove_dir_all(&base);
    }
}

#[test]
fn cached_writes_write_what_need_not_wait() {
    for root in disk_and_memory_roots() {
        let base = root.join(format!("nimbus-vfs-cached-w-{}", std::process::id()));
        std::fs::create_dir_all(&base).unwrap();
        let fs = LocalFs::new(&base).unwrap();
        let (h, _, _) = fs.open("data", &rw(CreateMode::CreateNew)).unwrap();
        let payload: Vec<u8> = (0..70_000u32).map(|i| (i % 251) as u8).collect();
        // Finished by write_at when short, as handlers::write does.
        let write = |at: u64| {
            let (n, short) = h.write_at_cached(&payload, at).unwrap();
            let rest = if short {
                h.write_at(&payload[n..], at + n as u64).unwrap()
            } else {
                0
            };
            assert_eq!(n + rest, payload.len(), "{root:?}: written");
            short
        };
        let short = write(10_000);
        let mut got = vec![0u8; 80_000];
        assert_eq!(h.read_at(&mut got, 0).unwrap(), 80_000);
        assert_eq!(&got[..10_000], &[0u8; 10_000][..], "{root:?}: the hole");
        assert_eq!(&got[10_000..], &payload[..], "{root:?}: the data");
        if root.starts_with("/dev/shm") {
            // tmpfs has no disk to wait for: never short, and known so.
            assert!(!short, "{root:?}: a write to memory stopped short");
            assert!(h.writes_without_waiting());
        }
        // What the first write learnt holds for the next: a file system
        // that refused RWF_NOWAIT writes is not asked again.
        if !h.writes_without_waiting() {
            assert_eq!(h.write_at_cached(&payload, 0).unwrap(), (0, true));
        }
        write(5);
        got.fill(0);
        assert_eq!(h.read_at(&mut got, 0).unwrap(), 80_000);
        assert_eq!(&got[5..70_005], &payload[..], "{root:?}: the second write");
        assert_err!(h.write_at_cached(b"x", 1 << 63), VfsError::InvalidParameter);
        let (ro, _, _) = fs
            .open(
                "data",
                &opts(true, false, CreateMode::OpenExisting, Kind::File),
            )
            .unwrap();
        assert_err!(ro.write_at_cached(b"x", 0), VfsError::AccessDenied);
        drop(ro);
        drop(h);
        let _ = std::fs::remove_dir_all(&base);
    }
}

#[test]
fn access_is_enforced_per_handle() {
    let s = Scratch::new();
    let fs = &s.fs;
    write_file(fs, "f", b"content");
    let ro = fs
        .open(
            "f",
            &opts(true, false, CreateMode::OpenExisting, Kind::File),
        )
        .unwrap()
        .0;
    assert_err!(ro.write_at(b"x", 0), VfsError::AccessDenied);
    assert_err!(ro.set_len(0), VfsError::AccessDenied);
    let wo = fs
        .open(
            "f",
            &opts(false, true, CreateMode::OpenExisting, Kind::File),
        )
        .unwrap()
        .0;
    assert_err!(wo.read_at(&mut [0u8; 4], 0), VfsError::AccessDenied);

    // Attribute-only opens give a handle that can stat and set attributes but not do I/O.
    let (attr, st, _) = fs
        .open(
            "f",
            &opts(false, false, CreateMode::OpenExisting, Kind::Any),
        )
        .unwrap();
    assert_eq!(st.size, 7);
    assert_err!(attr.read_at(&mut [0u8; 4], 0), VfsError::AccessDenied);
    assert_err!(attr.write_at(b"x", 0), VfsError::AccessDenied);
    let t = Timespec { sec: 42, nsec: 0 };
    attr.set_times(None, Some(t)).unwrap();
    assert_eq!(fs.stat("f").unwrap().mtime, t);
    attr.sync().unwrap();
}

#[test]
fn fifo_is_attribute_only() {
    let s = Scratch::new();
    let p = CString::new(s.share().join("fifo").as_os_str().as_bytes()).unwrap();
    // SAFETY: p is NUL-terminated.
    assert_eq!(unsafe { libc::mkfifo(p.as_ptr(), 0o644) }, 0);
    let fs = &s.fs;
    // Must not block waiting for a writer.
    let (h, st, _) = fs
        .open(
            "fifo",
            &opts(false, false, CreateMode::OpenExisting, Kind::Any),
        )
        .unwrap();
    assert!(!st.is_dir && !h.is_dir());
    assert_err!(h.read_at(&mut [0u8; 1], 0), VfsError::AccessDenied);
    assert_err!(
        fs.open(
            "fifo",
            &opts(true, false, CreateMode::OpenExisting, Kind::Any)
        ),
        VfsError::AccessDenied
    );
}

#[test]
fn mkdir_rmdir_unlink() {
    let s = Scratch::new();
    let fs = &s.fs;
    mkdir(fs, "a");
    mkdir(fs, "a/b");
    write_file(fs, "a/b/f", b"1");
    assert_err!(fs.rmdir("a"), VfsError::NotEmpty);
    assert_err!(fs.rmdir("a/b/f"), VfsError::NotADirectory);
    assert_err!(fs.unlink("a/b"), VfsError::IsADirectory);
    fs.unlink("a/b/f").unwrap();
    assert_err!(fs.unlink("a/b/f"), VfsError::NotFound);
    fs.rmdir("a/b").unwrap();
    fs.rmdir("a").unwrap();
    assert_err!(fs.rmdir("a"), VfsError::NotFound);
    assert!(!s.share().join("a").exists());
}

#[test]
fn not_found_vs_path_not_found() {
    let s = Scratch::new();
    let fs = &s.fs;
    mkdir(fs, "d");
    write_file(fs, "file", b"x");
    let o = rw(CreateMode::OpenExisting);
    let create = rw(CreateMode::CreateNew);

    assert_err!(fs.open("d/missing", &o), VfsError::NotFound);
    assert_err!(fs.stat("d/missing"), VfsError::NotFound);
    assert_err!(fs.unlink("d/missing"), VfsError::NotFound);

    for p in ["missing/x", "missing/y/z", "file/x", "d/missing/x"] {
        assert_err!(fs.open(p, &o), VfsError::PathNotFound);
        assert_err!(fs.open(p, &create), VfsError::PathNotFound);
        assert_err!(fs.stat(p), VfsError::PathNotFound);
        assert_err!(fs.unlink(p), VfsError::PathNotFound);
        assert_err!(fs.rmdir(p), VfsError::PathNotFound);
        assert_err!(fs.rename("file", p, false), VfsError::PathNotFound);
    }
    assert_err!(fs.rename("d/missing", "d/new", false), VfsError::NotFound);
}

#[test]
fn rename_with_and_without_replace() {
    let s = Scratch::new();
    let fs = &s.fs;
    write_file(fs, "a", b"A");
    write_file(fs, "b", b"B");
    mkdir(fs, "dir");

    assert_err!(fs.rename("a", "b", false), VfsError::Exists);
    assert_eq!(read_file(fs, "b"), b"B");
    fs.rename("a", "b", true).unwrap();
    assert_eq!(read_file(fs, "b"), b"A");
    assert_err!(fs.stat("a"), VfsError::NotFound);

    fs.rename("b", "dir/c", false).unwrap();
    assert_eq!(read_file(fs, "dir/c"), b"A");

    // Never replace a directory.
    write_file(fs, "x", b"X");
    assert_err!(fs.rename("x", "dir", true), VfsError::AccessDenied);
    assert_err!(fs.rename("x", "dir", false), VfsError::Exists);
    mkdir(fs, "empty");
    mkdir(fs, "other");
    assert_err!(fs.rename("other", "empty", true), VfsError::AccessDenied);

    // Directories move, with their content.
    fs.rename("dir", "moved", false).unwrap();
    assert_eq!(read_file(fs, "moved/c"), b"A");
    assert_err!(
        fs.rename("moved", "moved/sub", false),
        VfsError::InvalidParameter
    );
}

#[test]
fn escapes_are_refused() {
    let s = Scratch::new();
    let fs = &s.fs;
    mkdir(fs, "a");
    symlink("/etc", s.share().join("abs")).unwrap();
    symlink("../outside/secret", s.share().join("rel")).unwrap();
    symlink("../outside", s.share().join("outdir")).unwrap();
    symlink("../../outside", s.share().join("a/up")).unwrap();
    let o = opts(true, false, CreateMode::OpenExisting, Kind::Any);
    let create = rw(CreateMode::OpenOrCreate);

    for p in [
        "../x",
        "a/../../x",
        "a/..",
        "/etc/passwd",
        "../outside/secret",
    ] {
        assert_err!(fs.open(p, &o), VfsError::Escape);
        assert_err!(fs.open(p, &create), VfsError::Escape);
        assert_err!(fs.stat(p), VfsError::Escape);
        assert_err!(fs.unlink(p), VfsError::Escape);
        assert_err!(fs.rmdir(p), VfsError::Escape);
        assert_err!(fs.rename("a", p, false), VfsError::Escape);
    }
    // Final components that are escaping symlinks: opens refuse; stat describes the link.
    for p in ["abs", "rel", "outdir", "a/up"] {
        assert_err!(fs.open(p, &o), VfsError::Escape);
        assert_err!(
            fs.open(p, &rw(CreateMode::TruncateExisting)),
            VfsError::Escape
        );
        let st = fs.stat(p).unwrap();
        assert!(st.is_symlink && !st.is_dir);
    }
    assert_err!(fs.open("abs/passwd", &o), VfsError::Escape);
    // Escaping symlinks used as intermediate components.
    for p in ["abs/passwd", "outdir/secret", "a/up/secret", "outdir/new"] {
        assert_err!(fs.open(p, &o), VfsError::Escape);
        assert_err!(fs.open(p, &create), VfsError::Escape);
        assert_err!(
            fs.open(
                p,
                &opts(false, false, CreateMode::CreateNew, Kind::Directory)
            ),
            VfsError::Escape
        );
        assert_err!(fs.stat(p), VfsError::Escape);
        assert_err!(fs.unlink(p), VfsError::Escape);
        assert_err!(fs.rmdir(p), VfsError::Escape);
        assert_err!(fs.rename("a", p, true), VfsError::Escape);
        assert_err!(fs.rename(p, "stolen", true), VfsError::Escape);
    }
    // Symlinks themselves can be removed and renamed without touching the target.
    fs.rename("rel", "rel2", false).unwrap();
    fs.unlink("rel2").unwrap();
    fs.unlink("outdir").unwrap();
    assert_eq!(
        std::fs::read(s.outside().join("secret")).unwrap(),
        b"secret"
    );
    assert!(!s.outside().join("new").exists());
    assert!(!s.share().join("stolen").exists());
}

#[test]
fn symlinks_inside_the_share_work() {
    let s = Scratch::new();
    let fs = &s.fs;
    mkdir(fs, "sub");
    mkdir(fs, "other");
    write_file(fs, "sub/file", b"inside");
    symlink("sub/file", s.share().join("flink")).unwrap();
    symlink("sub", s.share().join("dlink")).unwrap();
    symlink("../sub/file", s.share().join("other/up")).unwrap();

    assert_eq!(read_file(fs, "flink"), b"inside");
    assert_eq!(read_file(fs, "dlink/file"), b"inside");
    assert_eq!(read_file(fs, "other/up"), b"inside");
    let (h, st, _) = fs
        .open(
            "dlink",
            &opts(false, false, CreateMode::OpenExisting, Kind::Directory),
        )
        .unwrap();
    assert!(h.is_dir() && st.is_dir);
    let st = fs.stat("flink").unwrap();
    assert!(st.is_symlink && st.size == 6);
    assert!(fs.stat("dlink").unwrap().is_dir);

    // A handle on a symlink refers to the target.
    let (h, _, _) = fs.open("flink", &rw(CreateMode::OpenExisting)).unwrap();
    h.write_at(b"I", 0).unwrap();
    assert_eq!(
        std::fs::read(s.share().join("sub/file")).unwrap(),
        b"Inside"
    );

    write_file(fs, "dlink/new", b"n");
    assert!(s.share().join("sub/new").is_file());

    // read_dir reports links as links.
    let root = fs
        .open(
            "",
            &opts(false, false, CreateMode::OpenExisting, Kind::Directory),
        )
        .unwrap()
        .0;
    let entries = root.read_dir().unwrap();
    let dlink = entries.iter().find(|e| e.name == "dlink").unwrap();
    assert!(dlink.stat.is_symlink && !dlink.stat.is_dir);

    // A dangling link blocks creation instead of creating through it.
    symlink("sub/nothing", s.share().join("dangling")).unwrap();
    assert_err!(
        fs.open("dangling", &rw(CreateMode::OpenExisting)),
        VfsError::NotFound
    );
    assert_err!(
        fs.open("dangling", &rw(CreateMode::OpenOrCreate)),
        VfsError::Exists
    );
    assert!(!s.share().join("sub/nothing").exists());
}

#[test]
fn invalid_names() {
    let s = Scratch::new();
    let fs = &s.fs;
    assert_err!(
        fs.open("a\0b", &rw(CreateMode::OpenOrCreate)),
        VfsError::NameInvalid
    );
    let long = "x".repeat(300);
    assert_err!(
        fs.open(&long, &rw(CreateMode::OpenOrCreate)),
        VfsError::NameInvalid
    );
    // Redundant separators and "." are accepted.
    write_file(fs, "./f", b"1");
    assert_eq!(read_file(fs, "f"), b"1");
}

#[test]
fn read_dir_lists_everything() {
    let s = Scratch::new();
    let fs = &s.fs;
    mkdir(fs, "big");
    let dir = s.share().join("big");
    for i in 0..10_000 {
        std::fs::File::create(dir.join(format!("file-{i:05}"))).unwrap();
    }
    std::fs::create_dir(dir.join("subdir")).unwrap();
    // A name that is not UTF-8 is skipped.
    std::fs::File::create(dir.join(std::ffi::OsStr::from_bytes(b"bad\xff"))).unwrap();

    let (h, _, _) = fs
        .open(
            "big",
            &opts(true, false, CreateMode::OpenExisting, Kind::Directory),
        )
        .unwrap();
    for _ in 0..2 {
        let entries = h.read_dir().unwrap();
        assert_eq!(entries.len(), 10_001);
        let names: HashSet<&str> = entries.iter().map(|e| e.name.as_str()).collect();
        assert_eq!(names.len(), 10_001);
        for i in [0, 1, 4_999, 9_999] {
            assert!(names.contains(format!("file-{i:05}").as_str()));
        }
        let sub = entries.iter().find(|e| e.name == "subdir").unwrap();
        assert!(sub.stat.is_dir);
        assert!(entries
            .iter()
            .filter(|e| e.name != "subdir")
            .all(|e| !e.stat.is_dir));
    }
}

#[test]
fn statfs_reports_totals() {
    let s = Scratch::new();
    let st = s.fs.statfs().unwrap();
    assert!(st.block_size > 0);
    assert!(st.total_blocks > 0);
    assert!(st.max_name_len > 0);
    assert!(st.free_blocks >= st.avail_blocks);
}

#[test]
fn handles_are_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<LocalFs>();
    check::<crate::FileHandle>();
}

fn identity(fs: &LocalFs, path: &str) -> Identity {
    Identity::of(&fs.stat(path).unwrap())
}

#[test]
fn expected_identity_is_checked_before_truncating() {
    let s = Scratch::new();
    let fs = &s.fs;
    write_file(fs, "checked", b"the file that was checked");
    let checked = identity(fs, "checked");
    // Another client replaces the name between the check and the open.
    std::fs::rename(s.share().join("checked"), s.share().join("moved")).unwrap();
    std::fs::write(s.share().join("checked"), b"someone else's file").unwrap();
    let o = OpenOptions {
        expect: Some(checked),
        ..rw(CreateMode::TruncateExisting)
    };
    assert_err!(fs.open("checked", &o), VfsError::Changed);
    // Neither file was cut.
    assert_eq!(
        std::fs::read(s.share().join("checked")).unwrap(),
        b"someone else's file"
    );
    assert_eq!(
        std::fs::read(s.share().join("moved")).unwrap(),
        b"the file that was checked"
    );
    // The expected object under its own name is opened and truncated.
    let o = OpenOptions {
        expect: Some(checked),
        ..rw(CreateMode::TruncateExisting)
    };
    let (_, st, _) = fs.open("moved", &o).unwrap();
    assert_eq!(
        (st.dev, st.ino, st.gen, st.size),
        (checked.dev, checked.ino, checked.gen, 0)
    );
}

#[test]
fn append_only_handles_never_overwrite() {
    let s = Scratch::new();
    let fs = &s.fs;
    write_file(fs, "log", b"0123456789");
    let o = OpenOptions {
        append_only: true,
        ..opts(false, true, CreateMode::OpenExisting, Kind::File)
    };
    let (h, _, _) = fs.open("log", &o).unwrap();
    // The offset asked for is ignored: data goes to the end.
    h.write_at(b"AB", 0).unwrap();
    h.write_at(b"CD", 3).unwrap();
    assert_eq!(
        std::fs::read(s.share().join("log")).unwrap(),
        b"0123456789ABCD"
    );
}

#[test]
fn remove_and_rename_act_only_on_the_expected_object() {
    let s = Scratch::new();
    let fs = &s.fs;
    write_file(fs, "a", b"first");
    let first = identity(fs, "a");
    std::fs::rename(s.share().join("a"), s.share().join("elsewhere")).unwrap();
    std::fs::write(s.share().join("a"), b"second").unwrap();
    assert_err!(fs.remove_if("a", false, first), VfsError::Changed);
    assert_err!(fs.rename_if("a", "b", false, first), VfsError::Changed);
    assert_eq!(std::fs::read(s.share().join("a")).unwrap(), b"second");
    assert!(!s.share().join("b").exists());
    fs.rename_if("elsewhere", "b", false, first).unwrap();
    assert_eq!(std::fs::read(s.share().join("b")).unwrap(), b"first");
    fs.remove_if("b", false, first).unwrap();
    assert!(!s.share().join("b").exists());

    mkdir(fs, "d");
    let d = identity(fs, "d");
    write_file(fs, "d/x", b"x");
    assert_err!(fs.remove_if("d", true, d), VfsError::NotEmpty);
    fs.unlink("d/x").unwrap();
    fs.remove_if("d", true, d).unwrap();
    assert!(!s.share().join("d").exists());
}

#[test]
fn has_entries_sees_any_name() {
    let s = Scratch::new();
    let fs = &s.fs;
    mkdir(fs, "d");
    let dir = |fs: &LocalFs| {
        fs.open(
            "d",
            &opts(false, false, CreateMode::OpenExisting, Kind::Directory),
        )
        .unwrap()
        .0
    };
    assert!(!dir(fs).has_entries().unwrap());
    // A name that is not UTF-8 still makes the directory non-empty.
    let odd = std::ffi::OsStr::from_bytes(b"\xff\xfe");
    std::fs::write(s.share().join("d").join(odd), b"").unwrap();
    assert!(dir(fs).has_entries().unwrap());
}

fn pattern(len: usize, seed: u32) -> Vec<u8> {
    (0..len as u32)
        .map(|i| (i.wrapping_mul(31).wrapping_add(seed) % 251) as u8)
        .collect()
}

#[test]
fn copy_from_between_files_and_within_one() {
    let s = Scratch::new();
    let fs = &s.fs;
    let data = pattern(3 << 20, 7);
    write_file(fs, "src", &data);
    let (src, _, _) = fs
        .open(
            "src",
            &opts(true, false, CreateMode::OpenExisting, Kind::File),
        )
        .unwrap();
    let (dst, _, _) = fs.open("dst", &rw(CreateMode::CreateNew)).unwrap();
    // A copy past the end of the file leaves a hole before it.
    assert_eq!(dst.copy_from(&src, 1000, 5000, 2 << 20).unwrap(), 2 << 20);
    let got = read_file(fs, "dst");
    assert_eq!(got.len(), 5000 + (2 << 20));
    assert!(got[..5000].iter().all(|b| *b == 0));
    assert_eq!(&got[5000..], &data[1000..1000 + (2 << 20)]);
    // The source ends first: the copy is short.
    assert_eq!(dst.copy_from(&src, (3 << 20) - 10, 0, 100).unwrap(), 10);
    assert_eq!(dst.copy_from(&src, 1 << 40, 0, 100).unwrap(), 0);
    assert_eq!(dst.copy_from(&src, 0, 0, 0).unwrap(), 0);
    // Access: the source must be readable, the target writable.
    assert_err!(src.copy_from(&dst, 0, 0, 10), VfsError::AccessDenied);
    assert_err!(
        dst.copy_from(&src, u64::MAX - 5, 0, 10),
        VfsError::InvalidParameter
    );

    // Within one file, overlapping both ways: as if read whole first.
    let (same, _, _) = fs.open("same", &rw(CreateMode::CreateNew)).unwrap();
    let small = pattern(4 << 20, 3);
    same.write_at(&small, 0).unwrap();
    assert_eq!(same.copy_from(&same, 0, 1 << 20, 3 << 20).unwrap(), 3 << 20);
    let mut want = small.clone();
    want.copy_within(0..3 << 20, 1 << 20);
    assert_eq!(read_file(fs, "same"), want);
    assert_eq!(
        same.copy_from(&same, 1 << 20, 100, 3 << 20).unwrap(),
        3 << 20
    );
    want.copy_within(1 << 20..4 << 20, 100);
    assert_eq!(read_file(fs, "same"), want);
    // Overlapping past the end of the source copies what it holds.
    assert_eq!(
        same.copy_from(&same, (4 << 20) - 50, (4 << 20) - 20, 100)
            .unwrap(),
        50
    );
    assert_eq!(same.stat().unwrap().size, (4 << 20) + 30);
}

#[test]
fn holes_zeroing_and_data_ranges() {
    let s = Scratch::new();
    let fs = &s.fs;
    let (h, _, _) = fs.open("sparse", &rw(CreateMode::CreateNew)).unwrap();
    let block = 64 * 1024u64;
    // Ten 128 KiB pieces, the first half of each punched out.
    for i in 0..10u64 {
        h.write_at(&pattern(2 * block as usize, i as u32), i * 2 * block)
            .unwrap();
        h.punch_hole(i * 2 * block, block).unwrap();
    }
    assert_eq!(h.stat().unwrap().size, 20 * block);
    let (ranges, more) = h.data_ranges(0, 20 * block, 100).unwrap();
    assert!(!more);
    let want: Vec<(u64, u64)> = (0..10u64).map(|i| (i * 2 * block + block, block)).collect();
    assert_eq!(ranges, want);
    // Clipped to the range asked about, and to `max` with the flag set.
    let (ranges, more) = h.data_ranges(block + 10, 3 * block + 5, 100).unwrap();
    assert_eq!(ranges, [(block + 10, block - 10), (3 * block, 5)]);
    assert!(!more);
    let (ranges, more) = h.data_ranges(0, 20 * block, 3).unwrap();
    assert_eq!(ranges.len(), 3);
    assert!(more);
    assert_eq!(h.data_ranges(20 * block, 21 * block, 10).unwrap().0, []);
    assert_eq!(h.data_ranges(0, block, 10).unwrap().0, []);

    // Punched and zeroed bytes read as zeros; the size never changes.
    let mut buf = vec![1u8; block as usize];
    h.read_at(&mut buf, 0).unwrap();
    assert!(buf.iter().all(|b| *b == 0));
    h.zero_range(block, 100).unwrap();
    let mut buf = vec![1u8; 200];
    h.read_at(&mut buf, block).unwrap();
    assert!(buf[..100].iter().all(|b| *b == 0));
    assert_eq!(
        &buf[100..],
        &pattern(2 * block as usize, 0)[block as usize + 100..block as usize + 200]
    );
    h.punch_hole(19 * block, 5 * block).unwrap();
    h.zero_range(19 * block, 5 * block).unwrap();
    assert_eq!(h.stat().unwrap().size, 20 * block);
    h.punch_hole(0, 0).unwrap();
    assert_err!(h.punch_hole(u64::MAX - 1, 10), VfsError::InvalidParameter);

    let (ro, _, _) = fs
        .open(
            "sparse",
            &opts(true, false, CreateMode::OpenExisting, Kind::File),
        )
        .unwrap();
    assert_err!(ro.punch_hole(0, 10), VfsError::AccessDenied);
    assert_err!(ro.zero_range(0, 10), VfsError::AccessDenied);
    // The last piece's data was punched out above.
    assert_eq!(ro.data_ranges(0, 20 * block, 100).unwrap().0.len(), 9);
}

#[test]
fn cloning_works_or_says_it_is_unsupported() {
    let s = Scratch::new();
    let fs = &s.fs;
    let data = pattern(64 * 1024, 9);
    write_file(fs, "src", &data);
    let (src, _, _) = fs
        .open(
            "src",
            &opts(true, false, CreateMode::OpenExisting, Kind::File),
        )
        .unwrap();
    let (dst, _, _) = fs.open("dst", &rw(CreateMode::CreateNew)).unwrap();
    dst.set_len(data.len() as u64).unwrap();
    let r = dst.clone_from(&src, 0, 0, data.len() as u64);
    // The answer is the same whether asked once for the share or per call:
    // the temporary files of the probe leave nothing behind.
    if fs.can_clone() {
        r.unwrap();
        assert_eq!(read_file(fs, "dst"), data);
    } else {
        assert_err!(r, VfsError::Unsupported);
    }
    assert_eq!(
        std::fs::read_dir(s.share()).unwrap().count(),
        2,
        "only src and dst in the share"
    );
    dst.clone_from(&src, 0, 0, 0).unwrap();
    assert_err!(src.clone_from(&dst, 0, 0, 10), VfsError::AccessDenied);
}

/// Every file directory in the store of named streams.
fn stream_dirs(s: &Scratch) -> Vec<PathBuf> {
    let store = s.share().join(crate::STORE_DIR);
    let Ok(buckets) = std::fs::read_dir(&store) else {
        return Vec::new();
    };
    buckets
        .flat_map(|b| std::fs::read_dir(b.unwrap().path()).unwrap())
        .map(|e| e.unwrap().path())
        .collect()
}

#[test]
fn streams_are_files_of_their_own_that_go_with_their_file() {
    let s = Scratch::new();
    let rw = opts(true, true, CreateMode::OpenOrCreate, Kind::File);
    let (base, _, _) = s.fs.open("f", &rw).unwrap();
    assert!(s.fs.streams(&base, false).unwrap().is_none());
    let streams = s.fs.streams(&base, true).unwrap().unwrap();
    // Larger than any extended attribute, and names no file name could be.
    let big = vec![7u8; 300_000];
    let (h, _, created) = streams.open("Big", &rw).unwrap();
    assert!(created);
    h.write_at(&big, 0).unwrap();
    streams.open("..", &rw).unwrap();
    let mut names = streams.names().unwrap();
    names.sort();
    assert_eq!(names, ["..", "Big"]);
    let sizes: Vec<u64> = {
        let mut l = streams.list().unwrap();
        l.sort_by(|a, b| a.0.cmp(&b.0));
        l.iter().map(|(_, st)| st.size).collect()
    };
    assert_eq!(sizes, [0, 300_000]);
    // The same store is found again through the file, after a rename too.
    s.fs.rename("f", "g", false).unwrap();
    let again = s.fs.streams(&base, false).unwrap().unwrap();
    let mut buf = vec![0u8; 300_000];
    let (h2, st, created) = again
        .open(
            "Big",
            &opts(true, false, CreateMode::OpenExisting, Kind::File),
        )
        .unwrap();
    assert!(!created);
    assert_eq!(h2.read_at(&mut buf, 0).unwrap(), 300_000);
    assert_eq!(buf, big);
    // A stream is removed only while it is the file it was.
    assert!(matches!(
        again.remove_if("Big", Identity::new(st.dev, st.ino + 1, st.gen)),
        Err(VfsError::Changed)
    ));
    assert!(matches!(
        again.remove_if("Big", Identity::new(st.dev, st.ino, st.gen ^ 1)),
        Err(VfsError::Changed)
    ));
    again.remove_if("Big", Identity::of(&st)).unwrap();
    assert_eq!(again.names().unwrap(), [".."]);
    // Removing the file's last name removes its streams.
    assert_eq!(stream_dirs(&s).len(), 1);
    s.fs.unlink("g").unwrap();
    assert!(stream_dirs(&s).is_empty());
}

#[test]
fn a_copy_with_the_files_xattrs_does_not_share_its_streams() {
    let s = Scratch::new();
    let rw = opts(true, true, CreateMode::OpenOrCreate, Kind::File);
    let (a, _, _) = s.fs.open("a", &rw).unwrap();
    let streams = s.fs.streams(&a, true).unwrap().unwrap();
    streams
        .open("s", &rw)
        .unwrap()
        .0
        .write_at(b"of a", 0)
        .unwrap();
    // As `cp -a` copies a file: its data and its extended attributes.
    std::fs::write(s.share().join("b"), b"").unwrap();
    let id = a.get_xattr("user.nimbus.streams").unwrap().unwrap();
    let (b, _, _) = s.fs.open("b", &rw).unwrap();
    b.set_xattr("user.nimbus.streams", &id).unwrap();
    assert!(s.fs.streams(&b, false).unwrap().is_none());
    let own = s.fs.streams(&b, true).unwrap().unwrap();
    assert!(own.names().unwrap().is_empty());
    assert_ne!(b.get_xattr("user.nimbus.streams").unwrap().unwrap(), id);
    // Removing the copy leaves the original's streams alone.
    s.fs.unlink("b").unwrap();
    assert_eq!(streams.names().unwrap(), ["s"]);
    // An overwrite of the original drops them.
    s.fs.remove_streams(&a).unwrap();
    assert!(s.fs.streams(&a, false).unwrap().is_none());
    assert!(stream_dirs(&s).is_empty());
}

#[test]
fn a_hard_linked_file_keeps_its_streams_until_its_last_name_goes() {
    let s = Scratch::new();
    let rw = opts(true, true, CreateMode::OpenOrCreate, Kind::File);
    let (a, _, _) = s.fs.open("a", &rw).unwrap();
    s.fs.streams(&a, true)
        .unwrap()
        .unwrap()
        .open("s", &rw)
        .unwrap();
    std::fs::hard_link(s.share().join("a"), s.share().join("b")).unwrap();
    s.fs.remove_if("a", false, Identity::of(&a.stat().unwrap()))
        .unwrap();
    assert_eq!(
        s.fs.streams(&a, false).unwrap().unwrap().names().unwrap(),
        ["s"]
    );
    // Replaced by a rename: its last name is gone.
    std::fs::write(s.share().join("c"), b"").unwrap();
    s.fs.rename("c", "b", true).unwrap();
    assert!(stream_dirs(&s).is_empty());
}

/// Sets `user.t` on a path of the scratch directory (outside the VFS).
fn set_user_t(path: &std::path::Path, value: &[u8]) {
    let p = CString::new(path.as_os_str().as_bytes()).unwrap();
    // SAFETY: both strings are NUL-terminated; value is readable for its length.
    let r = unsafe {
        libc::lsetxattr(
            p.as_ptr(),
            c"user.t".as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    };
    assert_eq!(r, 0, "{}", std::io::Error::last_os_error());
}

#[test]
fn lookup_reads_the_entrys_attribute_or_its_directorys() {
    let s = Scratch::new();
    mkdir(&s.fs, "d");
    write_file(&s.fs, "d/f", b"x");
    set_user_t(&s.share().join("d"), b"dir");
    set_user_t(&s.share().join("d/f"), b"file");
    set_user_t(&s.share(), b"root");
    set_user_t(&s.outside().join("secret"), b"outside");
    let fs = &s.fs;
    let found = fs.lookup("d/f", "user.t").unwrap();
    assert_eq!(found.stat.map(|st| st.size), Some(1));
    assert_eq!(found.xattr.as_deref(), Some(&b"file"[..]));
    assert!(found.parent_xattr.is_none());
    let missing = fs.lookup("d/new", "user.t").unwrap();
    assert!(missing.stat.is_none() && missing.xattr.is_none());
    assert_eq!(missing.parent_xattr.as_deref(), Some(&b"dir"[..]));
    assert_eq!(
        fs.lookup("", "user.t").unwrap().xattr.as_deref(),
        Some(&b"root"[..])
    );
    assert_eq!(
        fs.lookup("new", "user.t").unwrap().parent_xattr.as_deref(),
        Some(&b"root"[..])
    );
    assert!(fs.lookup("d/f", "user.none").unwrap().xattr.is_none());
    assert!(matches!(
        fs.lookup("nodir/f", "user.t"),
        Err(VfsError::PathNotFound)
    ));
    // A symlink inside reads its target's; one that leaves reads nothing
    // from outside.
    symlink("d/f", s.share().join("in")).unwrap();
    symlink("../outside/secret", s.share().join("out")).unwrap();
    assert_eq!(
        fs.lookup("in", "user.t").unwrap().xattr.as_deref(),
        Some(&b"file"[..])
    );
    let out = fs.lookup("out", "user.t").unwrap();
    assert!(out.stat.unwrap().is_symlink);
    assert_ne!(out.xattr.as_deref(), Some(&b"outside"[..]));
    // The path without getxattrat gives the same answers.
    let parent = s.fs.root();
    let name = CString::new("in").unwrap();
    assert_eq!(
        crate::sys::getxattr_by_proc(parent, &CString::new("d").unwrap(), c"user.t")
            .unwrap()
            .as_deref(),
        Some(&b"dir"[..])
    );
    assert!(crate::sys::getxattr_by_proc(parent, &name, c"user.t")
        .unwrap()
        .is_none());
    assert_eq!(
        crate::sys::getxattr_by_proc(parent, c"", c"user.t")
            .unwrap()
            .as_deref(),
        Some(&b"root"[..])
    );
    assert_eq!(
        fs.get_xattr("d", "user.t").unwrap().as_deref(),
        Some(&b"dir"[..])
    );
}

#[test]
fn get_xattr_reads_files_and_directories() {
    let s = Scratch::new();
    mkdir(&s.fs, "d");
    write_file(&s.fs, "d/f", b"x");
    set_user_t(&s.share().join("d/f"), b"file");
    set_user_t(&s.share().join("d"), b"dir");
    assert_eq!(
        s.fs.get_xattr("d/f", "user.t").unwrap().as_deref(),
        Some(&b"file"[..])
    );
    assert_eq!(
        s.fs.get_xattr("d", "user.t").unwrap().as_deref(),
        Some(&b"dir"[..])
    );
    assert!(s.fs.get_xattr("d/f", "user.none").unwrap().is_none());
    assert!(matches!(
        s.fs.get_xattr("d/g", "user.t"),
        Err(VfsError::NotFound)
    ));
}

/// A file's generation is the same however it is reached (by name, by an
/// open handle) and differs for a new file that reuses a deleted file's
/// inode: what keeps another node's ownership of the deleted file, or a
/// durable handle's record of it, off the new one.
#[test]
fn a_new_file_on_a_reused_inode_has_a_generation_of_its_own() {
    let s = Scratch::new();
    write_file(&s.fs, "first", b"1");
    let by_name = s.fs.stat("first").unwrap();
    let (handle, by_handle, _) =
        s.fs.open(
            "first",
            &opts(true, false, CreateMode::OpenExisting, Kind::File),
        )
        .unwrap();
    assert_ne!(by_name.gen, 0, "the scratch file system gives file handles");
    assert_eq!(by_name.gen, by_handle.gen);
    assert_eq!(handle.stat().unwrap().gen, by_name.gen);
    drop(handle);
    write_file(&s.fs, "other", b"2");
    assert_ne!(s.fs.stat("other").unwrap().gen, by_name.gen);
    let reused = replaced_on_its_inode(&s, "first");
    assert_eq!((reused.dev, reused.ino), (by_name.dev, by_name.ino));
    assert_ne!(reused.gen, by_name.gen);
}

/// Deletes `name` and makes a new file of that name until the new one
/// reuses the deleted one's inode; the new file's stat. ext4 and XFS hand
/// a freed inode to the next file made in the directory's group; a
/// bounded number of tries finds the reuse.
fn replaced_on_its_inode(s: &Scratch, name: &str) -> Stat {
    let ino = s.fs.stat(name).unwrap().ino;
    for i in 0..64 {
        std::fs::remove_file(s.share().join(name)).unwrap();
        write_file(&s.fs, name, format!("new {i}").as_bytes());
        let st = s.fs.stat(name).unwrap();
        if st.ino == ino {
            return st;
        }
    }
    panic!("the scratch file system (ext4 in CI) reuses a freed inode");
}

#[test]
fn a_new_file_that_took_the_name_and_the_inode_is_not_acted_on() {
    let s = Scratch::new();
    let fs = &s.fs;
    write_file(fs, "a", b"the file that was checked");
    let checked = identity(fs, "a");
    let now = replaced_on_its_inode(&s, "a");
    assert_eq!((now.dev, now.ino), (checked.dev, checked.ino));
    let o = OpenOptions {
        expect: Some(checked),
        ..rw(CreateMode::TruncateExisting)
    };
    assert_err!(fs.open("a", &o), VfsError::Changed);
    assert_err!(fs.remove_if("a", false, checked), VfsError::Changed);
    assert_err!(fs.rename_if("a", "b", false, checked), VfsError::Changed);
    assert!(std::fs::read(s.share().join("a"))
        .unwrap()
        .starts_with(b"new "));
    assert!(!s.share().join("b").exists());
    // A generation not known (0) compares device and inode only.
    let unknown = Identity::new(checked.dev, checked.ino, 0);
    fs.rename_if("a", "b", false, unknown).unwrap();
    fs.remove_if("b", false, Identity::of(&now)).unwrap();
}

/// The directory a name is an entry of, through a final symlink that stays
/// inside the share: its target's directory (chains followed); a missing
/// name's is the directory it would be made in; a symlink out of the share,
/// is refused; one to a directory by "." or ".." gives that directory.
#[test]
fn the_directory_of_a_name_follows_a_final_symlink_to_its_target() {
    let s = Scratch::new();
    let fs = &s.fs;
    std::fs::create_dir_all(s.share().join("d")).unwrap();
    std::fs::create_dir_all(s.share().join("e/f")).unwrap();
    write_file(fs, "d/x", b"made in d");
    let root = s.share();
    let root_dir = s.share();
    std::os::unix::fs::symlink("../d/x", root.join("e/link")).unwrap();
    std::os::unix::fs::symlink("link", root.join("e/again")).unwrap();
    std::os::unix::fs::symlink("../again", root.join("e/f/deeper")).unwrap();
    std::os::unix::fs::symlink("/etc/hostname", root.join("e/out")).unwrap();
    std::os::unix::fs::symlink("../d", root.join("e/dir")).unwrap();
    let d = fs.stat("d").unwrap();
    let e = fs.stat("e").unwrap();
    let key = |st: &Stat| (st.dev, st.ino, st.gen);
    let of = |name: &str| key(&fs.entry_directory(name).unwrap().unwrap());
    for name in ["d/x", "d/new", "e/link", "e/again", "e/f/deeper"] {
        assert_eq!(of(name), key(&d), "{name}");
    }
    assert_eq!(of("e/new"), key(&e));
    assert_err!(fs.entry_directory("e/out"), VfsError::Escape);
    let root = fs.stat("").unwrap();
    assert_eq!(of("e/dir"), key(&root));
    std::os::unix::fs::symlink("..", s.share().join("e/up")).unwrap();
    assert_eq!(of("e/up"), key(&root));
    assert!(fs.entry_directory("").unwrap().is_none());
    // 40 links, as the kernel follows, and not one more.
    std::os::unix::fs::symlink("x", root_dir.join("d/l0")).unwrap();
    for i in 1..=40 {
        std::os::unix::fs::symlink(format!("l{}", i - 1), root_dir.join(format!("d/l{i}")))
            .unwrap();
    }
    assert!(std::fs::read(root_dir.join("d/l39")).is_ok());
    assert_eq!(of("d/l39"), key(&d));
    assert!(std::fs::read(root_dir.join("d/l40")).is_err());
    assert_err!(fs.entry_directory("d/l40"), VfsError::Escape);
    assert_err!(fs.entry_directory("missing/x"), VfsError::PathNotFound);
}

/// A new file made "in" a directory read before is made only there: when
/// another directory was renamed into its place meanwhile, nothing is made
/// (`Changed`); once the directory read is back in place, it is made.
#[test]
fn a_file_made_in_a_directory_read_before_is_not_made_in_another_in_its_place() {
    let s = Scratch::new();
    let fs = &s.fs;
    std::fs::create_dir_all(s.share().join("d")).unwrap();
    let d = Identity::of(&fs.stat("d").unwrap());
    let new = opts(true, true, CreateMode::CreateNew, Kind::File);
    let (_, _, created) = fs.open_making_in("d/one", &new, &d).unwrap();
    assert!(created);
    fs.rename("d", "away", false).unwrap();
    std::fs::create_dir_all(s.share().join("d")).unwrap();
    assert_err!(fs.open_making_in("d/two", &new, &d), VfsError::Changed);
    assert!(
        !s.share().join("d/two").exists(),
        "nothing made in the other"
    );
    // Only a new file is checked: what exists is opened as `open` does.
    write_file(fs, "d/there", b"x");
    let existing = opts(true, false, CreateMode::OpenOrCreate, Kind::File);
    let (_, _, created) = fs.open_making_in("d/there", &existing, &d).unwrap();
    assert!(!created);
    fs.rename("d", "other", false).unwrap();
    fs.rename("away", "d", false).unwrap();
    let (_, _, created) = fs.open_making_in("d/two", &new, &d).unwrap();
    assert!(created);
    assert!(s.share().join("d/two").exists());
}

#[test]
fn a_lookup_in_a_directory_names_the_directory_it_looked_in() {
    let s = Scratch::new();
    let fs = &s.fs;
    mkdir(fs, "d");
    write_file(fs, "d/f", b"x");
    let id = |st: &Stat| (st.dev, st.ino, st.gen);
    // The directory the lookup went through is the one `entry_directory`
    // reads by name, while nothing is renamed.
    let before = fs.entry_directory("d/f").unwrap().unwrap();
    let found = fs.lookup_in_directory("d/f", "user.t").unwrap();
    assert_eq!(found.directory.as_ref().map(id), Some(id(&before)));
    let missing = fs.lookup_in_directory("d/new", "user.t").unwrap();
    assert!(missing.stat.is_none());
    assert_eq!(missing.directory.as_ref().map(id), Some(id(&before)));
    // Not asked, the root, a symlink: none.
    assert!(fs.lookup("d/f", "user.t").unwrap().directory.is_none());
    assert!(fs
        .lookup_in_directory("", "user.t")
        .unwrap()
        .directory
        .is_none());
    symlink("d/f", s.share().join("in")).unwrap();
    assert!(fs
        .lookup_in_directory("in", "user.t")
        .unwrap()
        .directory
        .is_none());
    // Another directory in d's place: the lookup names it, not the first.
    fs.rename("d", "away", false).unwrap();
    mkdir(fs, "d");
    write_file(fs, "d/f", b"y");
    let other = fs.lookup_in_directory("d/f", "user.t").unwrap();
    let other_dir = other.directory.as_ref().map(id).unwrap();
    assert_ne!(other_dir, id(&before));
    assert_eq!(other_dir, id(&fs.stat("d").unwrap()));
}
