//! The `nimbus` command: serve shares, manage the user database, check a
//! configuration. Holds no protocol logic.

use std::io::BufRead;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod bench_crypto;
mod logging;
mod reload_command;
use nimbus_auth::UserDb;
use nimbus_crypto::CryptoProvider;
use nimbus_server::{Config, Server, ShareConfig, SigningPolicy};

#[derive(Parser)]
#[command(
    name = "nimbus",
    version,
    about = "Nimbus: a scale-out SMB 2/3 file server",
    after_help = "Documentation (in the Nimbus source): README.md; docs/CONFIGURATION.md, every \
                  configuration key with its default and values; docs/OPERATIONS.md, \
                  docs/CLUSTER.md, docs/SECURITY.md, docs/FEATURES.md, docs/TESTING.md."
)]
struct Cli {
    /// Log debug detail (repeat for trace).
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    verbose: u8,
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Serve shares over SMB 2/3.
    Serve(ServeArgs),
    /// Manage the user database.
    User {
        #[command(subcommand)]
        command: UserCmd,
    },
    /// Manage the server's groups (kept in the user database), which
    /// security descriptors can grant or deny as a whole.
    Group {
        #[command(subcommand)]
        command: GroupCmd,
    },
    /// Validate a configuration file and report every problem.
    Config {
        #[command(subcommand)]
        command: ConfigCmd,
    },
    /// Show the running servers of a configuration: every node of its
    /// cluster (or one), or the single node; sessions, open files, handles
    /// waiting for their clients, leases, locked and owned files.
    Status {
        /// The configuration file the servers run with.
        #[arg(long)]
        config: PathBuf,
        /// Only this cluster node.
        #[arg(long)]
        node: Option<String>,
        /// JSON instead of a table.
        #[arg(long)]
        json: bool,
        /// Each node's sessions too: user, client addresses, dialect,
        /// protection, shares.
        #[arg(long)]
        sessions: bool,
        /// Each node's open files too: user, share, access, sharing,
        /// caching (oplock or lease), durable or persistent, locks, path.
        #[arg(long)]
        files: bool,
    },
    /// Make the running server of a configuration read it again
    /// (SIGHUP): shares, limits and the log level change without dropping
    /// clients. The file is checked first; the server's log says what the
    /// reload changed, or why it refused it.
    Reload {
        /// The configuration file the server runs with, as given to
        /// `nimbus serve --config`.
        #[arg(long)]
        config: PathBuf,
    },
    /// Measure this machine.
    Bench {
        #[command(subcommand)]
        command: BenchCmd,
    },
    /// Drain this node of a cluster: its witness clients are told to move
    /// to other nodes, new connections are refused, and once its clients
    /// have gone (or the time is up) it stops as at SIGTERM, handing its
    /// durable handles back.
    Drain {
        /// The node's configuration file.
        #[arg(long)]
        config: PathBuf,
        /// The node to move clients to; default: every other node.
        #[arg(long)]
        to: Option<String>,
        /// Seconds to wait for the clients to move before stopping anyway.
        #[arg(long, default_value_t = 60)]
        within: u64,
    },
    /// The witness service's clients (MS-SWN).
    Witness {
        #[command(subcommand)]
        command: WitnessCmd,
    },
}

#[derive(Subcommand)]
enum WitnessCmd {
    /// Every witness registration in the cluster: the node holding it, the
    /// client, the node and address it watches, the share (RegisterEx).
    List {
        /// The cluster's configuration file.
        #[arg(long)]
        config: PathBuf,
        /// Print a JSON array instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Tell the witness clients at an address to move to another node
    /// (CLIENT_MOVE): they reconnect there, keeping their persistent
    /// handles. With --share, the clients registered for that share move
    /// it (SHARE_MOVE): all of them, or those at --client.
    Move {
        /// The cluster's configuration file.
        #[arg(long)]
        config: PathBuf,
        /// The client's address, as its witness connection comes from.
        #[arg(long, required_unless_present = "share")]
        client: Option<std::net::IpAddr>,
        /// A share (scale-out): move its registered clients' connections.
        #[arg(long)]
        share: Option<String>,
        /// The node to move it to, by name.
        #[arg(long)]
        to: String,
    },
}

#[derive(Subcommand)]
enum BenchCmd {
    /// GB/s of every SMB cipher, signer and hash of every crypto provider,
    /// one core, at 4 KiB, 64 KiB and 1 MiB.
    Crypto {
        /// Milliseconds to measure each cell of the table.
        #[arg(long, default_value_t = 300)]
        millis: u64,
    },
}

#[derive(clap::Args)]
struct ServeArgs {
    /// TOML configuration file; the flags below override it.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Address to listen on (repeatable), e.g. 127.0.0.1:4450.
    #[arg(long)]
    listen: Vec<SocketAddr>,
    /// A share as NAME=PATH (repeatable).
    #[arg(long = "share", value_name = "NAME=PATH")]
    shares: Vec<String>,
    /// User database file (see `nimbus user add`).
    #[arg(long)]
    user_db: Option<PathBuf>,
    /// Directory of the state that must outlive the process (durable and
    /// persistent handles); created with mode 0700.
    #[arg(long)]
    state_dir: Option<PathBuf>,
    /// required: every authenticated request must be signed; auto: sign when the client asks.
    #[arg(long, value_parser = ["required", "auto"])]
    signing: Option<String>,
}

#[derive(Subcommand)]
enum UserCmd {
    /// Add a user or change its password.
    Add {
        name: String,
        #[arg(long)]
        db: PathBuf,
        /// Read the password from the first line of standard input.
        #[arg(long)]
        password_stdin: bool,
    },
    /// Remove a user.
    Del {
        name: String,
        #[arg(long)]
        db: PathBuf,
    },
    /// List user names.
    List {
        #[arg(long)]
        db: PathBuf,
        /// Also print each user's SID (S-1-5-21-<machine>-<RID>), the name
        /// security descriptors use for the user.
        #[arg(long)]
        sids: bool,
    },
}

#[derive(Subcommand)]
enum GroupCmd {
    /// Make a group, or give one its members anew.
    Set {
        name: String,
        #[arg(long)]
        db: PathBuf,
        /// Its members, users of the database (comma-separated; none for
        /// an empty group).
        #[arg(long, value_delimiter = ',')]
        members: Vec<String>,
    },
    /// Remove a group.
    Del {
        name: String,
        #[arg(long)]
        db: PathBuf,
    },
    /// List the groups: name, SID and members.
    List {
        #[arg(long)]
        db: PathBuf,
    },
}

#[derive(Subcommand)]
enum ConfigCmd {
    /// Check a configuration file. Every key, with its default and its
    /// values, is in docs/CONFIGURATION.md.
    Check { file: PathBuf },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let level = match cli.verbose {
        0 => "info",
        1 => "debug",
        _ => "trace",
    };
    // NIMBUS_LOG, then -v, pin the level; otherwise the configuration's
    // log_level sets it.
    let pinned = std::env::var("NIMBUS_LOG")
        .ok()
        .filter(|f| tracing_subscriber::EnvFilter::try_new(f).is_ok())
        .or_else(|| (cli.verbose > 0).then(|| level.to_string()));
    let logging = logging::init(pinned);
    let result = match cli.command {
        Cmd::Serve(args) => serve(args, &logging),
        Cmd::Reload { config } => reload_command::run(&config, config_check),
        Cmd::User { command } => user(command),
        Cmd::Group { command } => group(command),
        Cmd::Config {
            command: ConfigCmd::Check { file },
        } => config_check(&file),
        Cmd::Status {
            config,
            node,
            json,
            sessions,
            files,
        } => nimbus_server::status::read(&config, node.as_deref(), sessions || files)
            .map_err(|e| e.to_string())
            .map(|reports| {
                if json {
                    println!("{}", nimbus_server::status::json(&reports));
                    return;
                }
                print!("{}", nimbus_server::status::table(&reports));
                if sessions {
                    print!("\n{}", nimbus_server::status::sessions_table(&reports));
                }
                if files {
                    print!("\n{}", nimbus_server::status::files_table(&reports));
                }
            }),
        Cmd::Drain { config, to, within } => nimbus_server::witness_admin::drain_command(
            &config,
            to.as_deref(),
            std::time::Duration::from_secs(within),
        )
        .map(|m| println!("{m}")),
        Cmd::Witness {
            command: WitnessCmd::List { config, json },
        } => nimbus_server::witness_admin::list_command(&config, json).map(|m| println!("{m}")),
        Cmd::Witness {
            command:
                WitnessCmd::Move {
                    config,
                    client,
                    share,
                    to,
                },
        } => nimbus_server::witness_admin::move_command(&config, client, share.as_deref(), &to)
            .map(|m| println!("{m}")),
        Cmd::Bench {
            command: BenchCmd::Crypto { millis },
        } => {
            print!(
                "{}",
                bench_crypto::run(std::time::Duration::from_millis(millis))
            );
            Ok(())
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(msg) => {
            eprintln!("nimbus: {msg}");
            ExitCode::FAILURE
        }
    }
}

fn config_check(file: &Path) -> Result<(), String> {
    match Config::from_file(file) {
        Ok(cfg) => {
            // The keytab must hold the keys the server would accept with:
            // acquiring them now finds a wrong or empty keytab before a
            // client does.
            if let Some(k) = &cfg.kerberos {
                if let Err(e) = nimbus_server::kerberos_acceptor(k) {
                    eprintln!(
                        "{}: kerberos.keytab: {e} (fix: add the cifs/ principal's keys to it, \
                         e.g. kadmin: ktadd -k {} cifs/HOST)",
                        file.display(),
                        k.keytab.display()
                    );
                    return Err(format!("1 problem(s) in {}", file.display()));
                }
            }
            println!(
                "{}: OK ({} share(s), listening on {})",
                file.display(),
                cfg.shares.len(),
                cfg.listen
                    .iter()
                    .map(|a| a.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            Ok(())
        }
        Err(errors) => {
            for e in &errors {
                eprintln!("{e}");
            }
            eprintln!("every key, with its default and its values: docs/CONFIGURATION.md");
            Err(format!("{} problem(s) in {}", errors.len(), file.display()))
        }
    }
}

fn build_config(args: &ServeArgs) -> Result<Config, String> {
    let mut cfg = match &args.config {
        Some(path) => Config::from_file(path).map_err(|errs| {
            errs.iter()
                .map(|e| e.to_string())
                .collect::<Vec<_>>()
                .join("\n")
        })?,
        None => Config::default(),
    };
    if !args.listen.is_empty() {
        cfg.listen = args.listen.clone();
        // Checked again: the file's check saw its own `listen`.
        if let Some((key, problem)) = cfg.listener_clashes().first() {
            return Err(format!(
                "--listen ({key}): {problem}; give each listener an address and port of its own"
            ));
        }
    } else if args.config.is_none() {
        cfg.listen = vec![SocketAddr::from(([127, 0, 0, 1], 4450))];
    }
    if let Some(db) = &args.user_db {
        cfg.user_db = db.clone();
    }
    if let Some(dir) = &args.state_dir {
        cfg.state_dir = Some(dir.clone());
    }
    if let Some(s) = &args.signing {
        cfg.signing = if s == "auto" {
            SigningPolicy::Auto
        } else {
            SigningPolicy::Required
        };
    }
    if !args.shares.is_empty() {
        cfg.shares.clear();
        for s in &args.shares {
            let (name, path) = s.split_once('=').ok_or_else(|| {
                format!("--share {s}: expected NAME=PATH, e.g. --share data=/srv/data")
            })?;
            cfg.shares.push(ShareConfig::new(name, PathBuf::from(path)));
        }
    }
    let problems = cfg.validate_shares("command line");
    if !problems.is_empty() {
        return Err(problems
            .iter()
            .map(|e| e.to_string())
            .collect::<Vec<_>>()
            .join("\n"));
    }
    if cfg.shares.is_empty() {
        return Err(
            "no shares to serve: give --share NAME=PATH or [[share]] entries in --config".into(),
        );
    }
    Ok(cfg)
}

/// How long a stopping server waits for its connections' requests.
const STOP_WITHIN: std::time::Duration = std::time::Duration::from_secs(10);

fn serve(args: ServeArgs, logging: &logging::Logging) -> Result<(), String> {
    let cfg = build_config(&args)?;
    logging.apply(cfg.log_format, &cfg.log_level)?;
    if let Some(addr) = cfg.metrics_listen {
        // Before the server is made: its shares register their counters
        // with the recorder installed here.
        metrics_endpoint(addr)?;
    }
    let server = Server::new(cfg).map_err(|e| e.to_string())?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the runtime: {e}"))?;
    let running = server.clone();
    let result = rt.block_on(async move {
        use tokio::signal::unix::{signal, SignalKind};
        let mut term = signal(SignalKind::terminate())
            .map_err(|e| format!("cannot watch for SIGTERM: {e}"))?;
        let mut hangup =
            signal(SignalKind::hangup()).map_err(|e| format!("cannot watch for SIGHUP: {e}"))?;
        let run = running.clone().run(nimbus_server::dispatcher());
        tokio::pin!(run);
        loop {
            tokio::select! {
                r = &mut run => return r.map_err(|e| e.to_string()),
                _ = tokio::signal::ctrl_c() => {
                    tracing::info!("interrupted; shutting down");
                    break;
                }
                _ = term.recv() => {
                    tracing::info!("terminated; shutting down");
                    break;
                }
                _ = running.drain.stop_requested() => {
                    tracing::info!("drained; shutting down");
                    break;
                }
                _ = hangup.recv() => reload(&args, &running, logging).await,
            }
        }
        // Requests already read are answered and a cluster node hands its
        // durable handles on before the sockets close; a second signal
        // does not wait for that.
        tokio::select! {
            _ = running.stop(STOP_WITHIN) => {}
            _ = tokio::signal::ctrl_c() => tracing::warn!("interrupted again; not waiting"),
            _ = term.recv() => tracing::warn!("terminated again; not waiting"),
        }
        Ok(())
    });
    server.shutdown();
    result
}

/// SIGHUP: the configuration read again and, if it passes `config check`
/// and changes nothing that needs a restart, put in place
/// (`nimbus_server::reload`). Either way the server goes on serving.
async fn reload(args: &ServeArgs, server: &std::sync::Arc<Server>, logging: &logging::Logging) {
    let Some(file) = &args.config else {
        tracing::warn!("reload (SIGHUP): the server was started without --config; nothing to read");
        return;
    };
    tracing::info!("reload (SIGHUP): reading {}", file.display());
    let cfg = match build_config(args).and_then(|cfg| {
        // The same checks as `nimbus config check`.
        if let Some(k) = &cfg.kerberos {
            nimbus_server::kerberos_acceptor(k).map_err(|e| format!("kerberos.keytab: {e}"))?;
        }
        Ok(cfg)
    }) {
        Ok(cfg) => cfg,
        Err(e) => {
            tracing::error!(
                "reload refused, the configuration stays as it was: {}",
                e.replace('\n', "; ")
            );
            return;
        }
    };
    let (format, level) = (cfg.log_format, cfg.log_level.clone());
    let s = server.clone();
    let outcome = tokio::task::spawn_blocking(move || nimbus_server::reload::reload(&s, cfg)).await;
    match outcome {
        Ok(Ok(report)) => {
            if let Err(e) = logging.apply(format, &level) {
                tracing::error!("reload: {e}");
            }
            tracing::info!("reload of {} done: {report}", file.display());
        }
        Ok(Err(e)) => tracing::error!(
            "reload of {} refused, the configuration stays as it was: {e}",
            file.display()
        ),
        Err(e) => tracing::error!("reload of {}: {e}", file.display()),
    }
}

/// Serves Prometheus's text format on `addr` (its own thread and runtime,
/// apart from the server's) and installs the recorder the server's
/// metrics go to (`nimbus_server::metrics`).
fn metrics_endpoint(addr: SocketAddr) -> Result<(), String> {
    use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
    let fail = |e: &dyn std::fmt::Display| format!("metrics.listen {addr}: {e}");
    PrometheusBuilder::new()
        .with_http_listener(addr)
        .set_buckets_for_metric(
            Matcher::Suffix("_seconds".into()),
            nimbus_server::metrics::LATENCY_BUCKETS,
        )
        .map_err(|e| fail(&e))?
        .install()
        .map_err(|e| fail(&e))?;
    nimbus_server::metrics::describe();
    tracing::info!("metrics: serving Prometheus's text format on http://{addr}/metrics");
    Ok(())
}

fn read_password(stdin: bool) -> Result<String, String> {
    if stdin {
        let mut line = String::new();
        std::io::stdin()
            .lock()
            .read_line(&mut line)
            .map_err(|e| format!("reading the password from standard input: {e}"))?;
        let pw = line.trim_end_matches(['\n', '\r']).to_string();
        if pw.is_empty() {
            return Err("empty password on standard input".into());
        }
        return Ok(pw);
    }
    let pw = rpassword::prompt_password("Password: ")
        .map_err(|e| format!("reading the password: {e}"))?;
    let again =
        rpassword::prompt_password("Again: ").map_err(|e| format!("reading the password: {e}"))?;
    if pw != again {
        return Err("the passwords differ".into());
    }
    if pw.is_empty() {
        return Err("empty password".into());
    }
    Ok(pw)
}

fn group(cmd: GroupCmd) -> Result<(), String> {
    let provider = CryptoProvider::default_provider();
    match cmd {
        GroupCmd::Set { name, db, members } => {
            let mut users = UserDb::load(&db).map_err(|e| e.to_string())?;
            users
                .set_group(&name, &members)
                .map_err(|e| e.to_string())?;
            users.save(&db).map_err(|e| e.to_string())?;
            println!("group {name} saved in {}", db.display());
        }
        GroupCmd::Del { name, db } => {
            let mut users = UserDb::load(&db).map_err(|e| e.to_string())?;
            if !users.remove_group(&name) {
                return Err(format!("no group {name} in {}", db.display()));
            }
            users.save(&db).map_err(|e| e.to_string())?;
            println!("group {name} removed from {}", db.display());
        }
        GroupCmd::List { db } => {
            let users = UserDb::load(&db).map_err(|e| e.to_string())?;
            let machine = users.machine_sid(&provider);
            for (name, rid, members) in users.groups() {
                println!("{name} {machine}-{rid} {}", members.join(","));
            }
        }
    }
    Ok(())
}

fn user(cmd: UserCmd) -> Result<(), String> {
    let provider = CryptoProvider::default_provider();
    match cmd {
        UserCmd::Add {
            name,
            db,
            password_stdin,
        } => {
            // Refuse a name the file cannot hold before asking for a password.
            UserDb::validate_name(&name).map_err(|e| e.to_string())?;
            let mut users = UserDb::load_or_empty(&db).map_err(|e| e.to_string())?;
            let pw = read_password(password_stdin)?;
            users
                .add(&name, &pw, &provider)
                .map_err(|e| e.to_string())?;
            users.save(&db).map_err(|e| e.to_string())?;
            println!("user {name} saved in {}", db.display());
        }
        UserCmd::Del { name, db } => {
            let mut users = UserDb::load(&db).map_err(|e| e.to_string())?;
            if !users.remove(&name) {
                return Err(format!("no user {name} in {}", db.display()));
            }
            users.save(&db).map_err(|e| e.to_string())?;
            println!("user {name} removed from {}", db.display());
        }
        UserCmd::List { db, sids } => {
            let users = UserDb::load(&db).map_err(|e| e.to_string())?;
            let machine = users.machine_sid(&provider);
            for n in users.names() {
                match users.rid(&n).filter(|_| sids) {
                    Some(rid) => println!("{n} {machine}-{rid}"),
                    None => println!("{n}"),
                }
            }
        }
    }
    Ok(())
}
