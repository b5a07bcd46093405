//! `nimbus reload --config FILE`: checks the file, finds the running
//! `nimbus serve --config FILE` and sends it SIGHUP.
//!
//! The server is found through /proc (its command line names the same
//! file, resolved from its own working directory under its own root), so
//! no pid file has to be kept in step with the process. Under systemd, `systemctl reload
//! nimbus` does the same through the unit's ExecReload.

use std::path::{Path, PathBuf};

/// Checks `file` with `check` (what `nimbus config check` runs), then
/// signals every server that serves it.
pub fn run(file: &Path, check: fn(&Path) -> Result<(), String>) -> Result<(), String> {
    check(file).map_err(|e| format!("{e}; not reloaded"))?;
    let wanted = std::fs::canonicalize(file).map_err(|e| format!("{}: {e}", file.display()))?;
    let servers = servers_of(&wanted);
    if servers.is_empty() {
        return Err(format!(
            "no running `nimbus serve --config {}` found (is the server running, and \
             as a user whose processes this one may see?)",
            file.display()
        ));
    }
    let mut failed = Vec::new();
    for pid in servers {
        // SAFETY: kill(2) with a pid read from /proc and a valid signal
        // number touches no memory of this process.
        let sent = unsafe { libc::kill(pid, libc::SIGHUP) };
        if sent != 0 {
            failed.push(format!("pid {pid}: {}", std::io::Error::last_os_error()));
            continue;
        }
        println!(
            "sent SIGHUP to nimbus (pid {pid}); its log says what the reload changed, or \
             why it refused the file"
        );
    }
    if failed.is_empty() {
        return Ok(());
    }
    Err(format!(
        "cannot signal {} (run this as the server's user, or as root)",
        failed.join(", ")
    ))
}

/// The processes that run `nimbus serve` with `--config` naming `wanted`.
fn servers_of(wanted: &Path) -> Vec<i32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let me = std::process::id();
    let mut found = Vec::new();
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        if pid == me {
            continue;
        }
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let args: Vec<String> = cmdline
            .split(|b| *b == 0)
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        let Some(config) = served_config(&args) else {
            continue;
        };
        // The path as the process sees it: from its own working directory,
        // under its own root (a container's is not this one's). A process
        // whose directory cannot be read is not taken for the server.
        let within = if config.is_absolute() {
            config
        } else {
            let Ok(cwd) = std::fs::read_link(entry.path().join("cwd")) else {
                continue;
            };
            cwd.join(config)
        };
        let Ok(inside) = within.strip_prefix("/") else {
            continue;
        };
        let path = entry.path().join("root").join(inside);
        if std::fs::canonicalize(&path).is_ok_and(|p| p == wanted) {
            if let Ok(pid) = i32::try_from(pid) {
                found.push(pid);
            }
        }
    }
    found
}

/// The `--config` of a `nimbus serve` command line, or None for any other
/// process.
fn served_config(args: &[String]) -> Option<PathBuf> {
    let program = Path::new(args.first()?).file_name()?;
    if program != "nimbus" || !args.iter().any(|a| a == "serve") {
        return None;
    }
    let mut it = args.iter();
    while let Some(a) = it.next() {
        if a == "--config" {
            return it.next().map(PathBuf::from);
        }
        if let Some(v) = a.strip_prefix("--config=") {
            return Some(PathBuf::from(v));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn only_a_serving_nimbus_names_its_config() {
        assert_eq!(
            served_config(&args(&[
                "/usr/bin/nimbus",
                "serve",
                "--config",
                "/etc/n.toml"
            ])),
            Some(PathBuf::from("/etc/n.toml"))
        );
        assert_eq!(
            served_config(&args(&["nimbus", "-v", "serve", "--config=n.toml"])),
            Some(PathBuf::from("n.toml"))
        );
        assert_eq!(
            served_config(&args(&["nimbus", "reload", "--config", "n.toml"])),
            None
        );
        assert_eq!(
            served_config(&args(&["vim", "serve", "--config", "n.toml"])),
            None
        );
        assert_eq!(served_config(&args(&["nimbus", "serve"])), None);
    }
}
