//! nimbus-lazyfs: the disk of the power-loss tests (tests/test_power_loss.py).
//!
//! A FUSE file system over a backing directory that keeps every file's
//! written data in memory until the file is fsynced, the way Jepsen's
//! LazyFS does. Killing this process (SIGKILL) and unmounting is a power
//! loss: the backing directory then holds exactly what was synced. The
//! state store, the journal and the shares live on it in those tests.
//!
//! Written here because no maintained crate or Debian package provides
//! such a layer (LazyFS itself is a C++ project built from source); the
//! FUSE protocol comes from the `fuser` crate.
//!
//! Usage: nimbus-lazyfs [--ignore-fsync] BACKING_DIR MOUNTPOINT
//!
//! `--ignore-fsync` acknowledges every fsync without writing anything
//! back: the mutation under which a power-loss test must fail. SIGUSR1
//! does the same from then on, and prints "ignoring fsync" once it has.
//! The process prints "mounted" on standard output once the mount is up
//! and serves until killed.

mod dirty;
mod fs;

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::Ordering;

use fuser::{Config, MountOption, SessionACL};

fn main() -> ExitCode {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let ignore_fsync = args.first().is_some_and(|a| a == "--ignore-fsync");
    if ignore_fsync {
        args.remove(0);
    }
    let [backing, mountpoint] = args.as_slice() else {
        eprintln!("usage: nimbus-lazyfs [--ignore-fsync] BACKING_DIR MOUNTPOINT");
        return ExitCode::from(2);
    };
    fs::IGNORE_FSYNC.store(ignore_fsync, Ordering::SeqCst);
    if let Err(e) = on_sigusr1_ignore_fsync() {
        eprintln!("nimbus-lazyfs: cannot handle SIGUSR1: {e}");
        return ExitCode::FAILURE;
    }
    let fs = match fs::LazyFs::new(PathBuf::from(backing)) {
        Ok(fs) => fs,
        Err(e) => {
            eprintln!("nimbus-lazyfs: backing directory {backing}: {e}");
            return ExitCode::FAILURE;
        }
    };
    let mut config = Config::default();
    config.mount_options = vec![MountOption::FSName("nimbus-lazyfs".into()), MountOption::RW];
    config.acl = SessionACL::All;
    let session = match fuser::Session::new(fs, mountpoint, &config) {
        Ok(s) => s,
        Err(e) => {
            eprintln!(
                "nimbus-lazyfs: cannot mount on {mountpoint}: {e} (needs /dev/fuse and root)"
            );
            return ExitCode::FAILURE;
        }
    };
    println!("mounted");
    let _ = std::io::stdout().flush();
    match session.run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("nimbus-lazyfs: {e}");
            ExitCode::FAILURE
        }
    }
}

extern "C" fn ignore_fsync_from_now(_signal: libc::c_int) {
    fs::IGNORE_FSYNC.store(true, Ordering::SeqCst);
    let msg = b"ignoring fsync\n";
    // SAFETY: write(2) is async-signal-safe; the buffer is static.
    unsafe { libc::write(1, msg.as_ptr().cast(), msg.len()) };
}

fn on_sigusr1_ignore_fsync() -> std::io::Result<()> {
    // SAFETY: all-zero is a valid sigaction; the handler only stores an
    // atomic and calls write(2). SA_RESTART: the FUSE read it interrupts
    // goes on.
    unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = ignore_fsync_from_now as extern "C" fn(libc::c_int) as usize;
        action.sa_flags = libc::SA_RESTART;
        libc::sigemptyset(&mut action.sa_mask);
        if libc::sigaction(libc::SIGUSR1, &action, std::ptr::null_mut()) != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}
