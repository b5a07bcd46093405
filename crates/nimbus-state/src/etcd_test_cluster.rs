//! Tests' etcd: a real 3-member cluster (Debian's etcd-server) on
//! loopback ports, its data in a temp dir.

use std::time::Duration;

use crate::EtcdStore;

/// A real 3-member etcd cluster on loopback, in a temp dir, stopped
/// (and removed) on drop.
pub struct Cluster {
    pub dir: std::path::PathBuf,
    pub members: Vec<std::process::Child>,
    pub urls: Vec<String>,
    /// With TLS: what a client needs to be let in.
    pub access: crate::etcd_rpc::Access,
}

/// What a member is started with.
struct Member {
    name: String,
    client_url: String,
    peer: u16,
}

/// Starts etcd member `m` of the cluster in `dir`.
fn spawn(
    dir: &std::path::Path,
    m: &Member,
    initial_cluster: &str,
    state: &str,
    token: &str,
    tls_args: &[String],
) -> std::process::Child {
    let log = std::fs::File::create(dir.join(format!("{}.log", m.name))).unwrap();
    let peer_url = format!("http://127.0.0.1:{}", m.peer);
    std::process::Command::new("etcd")
        .args(["--name", &m.name, "--data-dir"])
        .arg(dir.join(&m.name))
        .args(["--listen-client-urls", &m.client_url])
        .args(["--advertise-client-urls", &m.client_url])
        .args(["--listen-peer-urls", &peer_url])
        .args(["--initial-advertise-peer-urls", &peer_url])
        .args(["--initial-cluster", initial_cluster])
        .args(["--initial-cluster-state", state])
        .args(["--initial-cluster-token", token])
        .args(["--heartbeat-interval", "50", "--election-timeout", "500"])
        .args(tls_args)
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .expect("etcd (Debian package etcd-server; scripts/test.sh installs it)")
}

/// Runs etcdctl (a plain cluster's) against `endpoint`: its output, or
/// its error output.
fn try_etcdctl(endpoint: &str, args: &[&str]) -> Result<String, String> {
    let out = std::process::Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        .arg(format!("--endpoints={endpoint}"))
        .args(args)
        .output()
        .expect("etcdctl (Debian package etcd-client)");
    match out.status.success() {
        true => Ok(String::from_utf8_lossy(&out.stdout).into_owned()),
        false => Err(String::from_utf8_lossy(&out.stderr).into_owned()),
    }
}

fn etcdctl(endpoint: &str, args: &[&str]) -> String {
    try_etcdctl(endpoint, args).unwrap_or_else(|e| panic!("etcdctl {args:?}: {e}"))
}

/// Runs openssl with `args` in `dir`.
fn openssl(dir: &std::path::Path, args: &[&str]) {
    let out = std::process::Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("openssl (Debian package openssl)");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A CA, a certificate for the members (127.0.0.1) and one for a client,
/// made in `dir`: ca.pem, member.pem/member.key, client.pem/client.key.
/// A second CA (other-ca.pem) signs nothing the members trust.
pub fn make_certificates(dir: &std::path::Path) {
    for ca in ["ca", "other-ca"] {
        openssl(
            dir,
            &[
                "req",
                "-x509",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:prime256v1",
                "-nodes",
                "-days",
                "2",
                "-subj",
                &format!("/CN=nimbus test {ca}"),
                "-keyout",
                &format!("{ca}.key"),
                "-out",
                &format!("{ca}.pem"),
            ],
        );
    }
    for (who, ext) in [
        (
            "member",
            "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth",
        ),
        ("client", "extendedKeyUsage=clientAuth"),
    ] {
        std::fs::write(dir.join(format!("{who}.ext")), ext).unwrap();
        openssl(
            dir,
            &[
                "req",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:prime256v1",
                "-nodes",
                "-subj",
                &format!("/CN=nimbus-{who}"),
                "-keyout",
                &format!("{who}.key"),
                "-out",
                &format!("{who}.csr"),
            ],
        );
        openssl(
            dir,
            &[
                "x509",
                "-req",
                "-in",
                &format!("{who}.csr"),
                "-CA",
                "ca.pem",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-days",
                "2",
                "-extfile",
                &format!("{who}.ext"),
                "-out",
                &format!("{who}.pem"),
            ],
        );
    }
}

/// A loopback port nothing listens on, below Linux's ephemeral range
/// (32768 and up by default). A port the kernel handed out and took
/// back (bind to port 0) can be handed again to an outgoing connection,
/// such as one member's link to another, before etcd binds it: etcd then
/// exits with "address already in use". Ports are taken in turn from a
/// place set by the process id, so the clusters a test binary starts at
/// once never pick the same one.
fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    const LOW: u32 = 10_000;
    const SPAN: u32 = 22_000;
    static NEXT: AtomicU32 = AtomicU32::new(u32::MAX);
    let _ = NEXT.compare_exchange(
        u32::MAX,
        std::process::id().wrapping_mul(7919) % SPAN,
        Ordering::Relaxed,
        Ordering::Relaxed,
    );
    for _ in 0..SPAN {
        let port = (LOW + NEXT.fetch_add(1, Ordering::Relaxed) % SPAN) as u16;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free loopback port in {LOW}..{}", LOW + SPAN)
}

/// The last lines of member `name`'s log in `dir`.
fn log_tail(dir: &std::path::Path, name: &str) -> String {
    let log = std::fs::read_to_string(dir.join(format!("{name}.log"))).unwrap_or_default();
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(5)..].join("\n")
}

impl Cluster {
    pub fn start(name: &str) -> Cluster {
        Cluster::start_with(name, false)
    }

    /// A cluster whose members serve clients over TLS only and ask each
    /// for a certificate their CA signed (`--client-cert-auth`).
    pub fn start_tls(name: &str) -> Cluster {
        Cluster::start_with(name, true)
    }

    /// Starts the cluster, again on new ports if a member exits or does
    /// not answer (a port taken between its choice and etcd's bind).
    fn start_with(name: &str, tls: bool) -> Cluster {
        let mut failures = Vec::new();
        for _ in 0..3 {
            match Cluster::try_start(name, tls) {
                Ok(cluster) => return cluster,
                Err(e) => failures.push(e),
            }
        }
        panic!("etcd cluster {name} did not start: {}", failures.join("; "))
    }

    fn try_start(name: &str, tls: bool) -> Result<Cluster, String> {
        let dir = std::env::temp_dir().join(format!("nimbus-etcd-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let ports: Vec<(u16, u16)> = (0..3).map(|_| (free_port(), free_port())).collect();
        let initial = ports
            .iter()
            .enumerate()
            .map(|(i, (_, peer))| format!("m{i}=http://127.0.0.1:{peer}"))
            .collect::<Vec<_>>()
            .join(",");
        let scheme = if tls { "https" } else { "http" };
        let mut tls_args: Vec<String> = Vec::new();
        let mut access = crate::etcd_rpc::Access::default();
        if tls {
            make_certificates(&dir);
            let path = |f: &str| dir.join(f).display().to_string();
            tls_args = vec![
                "--cert-file".into(),
                path("member.pem"),
                "--key-file".into(),
                path("member.key"),
                "--trusted-ca-file".into(),
                path("ca.pem"),
                "--client-cert-auth".into(),
            ];
            let read = |f: &str| std::fs::read(dir.join(f)).unwrap();
            access.ca_pem = Some(read("ca.pem"));
            access.identity = Some((read("client.pem"), read("client.key")));
        }
        let token = format!("nimbus-{name}-{}", std::process::id());
        let members = ports
            .iter()
            .enumerate()
            .map(|(i, &(client, peer))| {
                let member = Member {
                    name: format!("m{i}"),
                    client_url: format!("{scheme}://127.0.0.1:{client}"),
                    peer,
                };
                spawn(&dir, &member, &initial, "new", &token, &tls_args)
            })
            .collect();
        let urls: Vec<String> = ports
            .iter()
            .map(|(c, _)| format!("{scheme}://127.0.0.1:{c}"))
            .collect();
        let mut cluster = Cluster {
            dir,
            members,
            urls,
            access,
        };
        // Ready when every member answers a linearizable read (a leader
        // exists, and each serves clients): a test may count which member
        // a connection went to.
        for url in cluster.urls.clone() {
            cluster.wait_ready(&url, 0..3)?;
        }
        Ok(cluster)
    }

    /// Waits until the member at `url` answers a linearizable read: an
    /// error, with the member's log, if one of the members `watched`
    /// exits or 30 s pass.
    fn wait_ready(&mut self, url: &str, watched: std::ops::Range<usize>) -> Result<(), String> {
        let until = std::time::Instant::now() + Duration::from_secs(30);
        let store = EtcdStore::with_access(
            &[url.to_string()],
            b"/ready/",
            Duration::from_secs(2),
            self.access.clone(),
        )
        .unwrap();
        while let Err(e) = store.check() {
            for i in watched.clone() {
                if let Ok(Some(status)) = self.members[i].try_wait() {
                    let name = format!("m{i}");
                    return Err(format!(
                        "member {name} exited ({status}): {}",
                        log_tail(&self.dir, &name)
                    ));
                }
            }
            if std::time::Instant::now() >= until {
                return Err(format!("etcd member {url} not ready: {e}"));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(())
    }
}

/// The number after `"field":` in etcdctl's JSON output.
fn json_number(json: &str, field: &str) -> Option<u64> {
    let at = json.find(&format!("\"{field}\":"))? + field.len() + 3;
    let digits: String = json[at..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().ok()
}

impl Cluster {
    /// The member that leads now, as its place in `urls` and its id; None
    /// when no member that answers names itself the leader.
    pub fn leader(&self) -> Option<(usize, u64)> {
        self.urls.iter().enumerate().find_map(|(i, url)| {
            // A member that is stopped holds the question up for a second.
            let args = [
                "--dial-timeout=1s",
                "--command-timeout=1s",
                "endpoint",
                "status",
                "-w",
                "json",
            ];
            let status = try_etcdctl(url, &args).ok()?;
            let id = json_number(&status, "member_id")?;
            (json_number(&status, "leader")? == id).then_some((i, id))
        })
    }

    /// Replaces member `i` of a plain cluster as an operator would: a new
    /// member (new name, new ports) is added and started, then member `i`
    /// is removed and stopped. The new member's client URL.
    pub fn replace_member(&mut self, i: usize) -> String {
        let kept = self.urls[(i + 1) % self.urls.len()].clone();
        let n = self.members.len();
        let member = Member {
            name: format!("m{n}"),
            client_url: format!("http://127.0.0.1:{}", free_port()),
            peer: free_port(),
        };
        let peer_url = format!("--peer-urls=http://127.0.0.1:{}", member.peer);
        // etcd adds a member only once every member has been connected to
        // the leader for a few seconds (its "unhealthy cluster" refusal).
        let until = std::time::Instant::now() + Duration::from_secs(30);
        let added = loop {
            match try_etcdctl(&kept, &["member", "add", &member.name, &peer_url]) {
                Ok(out) => break out,
                Err(e) if e.contains("unhealthy cluster") && std::time::Instant::now() < until => {
                    std::thread::sleep(Duration::from_millis(250))
                }
                Err(e) => panic!("etcdctl member add: {e}"),
            }
        };
        let initial = added
            .lines()
            .find_map(|l| l.strip_prefix("ETCD_INITIAL_CLUSTER=\""))
            .and_then(|l| l.strip_suffix('"'))
            .expect("etcdctl member add names the cluster");
        let token = "unused-for-an-existing-cluster";
        self.members
            .push(spawn(&self.dir, &member, initial, "existing", token, &[]));
        if let Err(e) = self.wait_ready(&member.client_url, n..n + 1) {
            panic!("the new member m{n}: {e}");
        }
        // The old member's id, from `id, status, name, peers, clients, learner`.
        let list = etcdctl(&kept, &["member", "list"]);
        let old = format!("m{i}");
        let id = list
            .lines()
            .map(|l| l.split(", ").collect::<Vec<_>>())
            .find(|f| f.get(2) == Some(&old.as_str()))
            .map(|f| f[0].to_string())
            .expect("the old member is listed");
        etcdctl(&kept, &["member", "remove", &id]);
        let _ = self.members[i].kill();
        let _ = self.members[i].wait();
        self.urls[i] = member.client_url.clone();
        member.client_url
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for m in &mut self.members {
            let _ = m.kill();
            let _ = m.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
