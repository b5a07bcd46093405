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
    pub access: crate::etcd_store::Access,
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

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
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

    fn start_with(name: &str, tls: bool) -> Cluster {
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
        let mut access = crate::etcd_store::Access::default();
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
        let mut members = Vec::new();
        for (i, (client, peer)) in ports.iter().enumerate() {
            let log = std::fs::File::create(dir.join(format!("m{i}.log"))).unwrap();
            let child = std::process::Command::new("etcd")
                .args([
                    "--name".into(),
                    format!("m{i}"),
                    "--data-dir".into(),
                    dir.join(format!("m{i}")).display().to_string(),
                    "--listen-client-urls".into(),
                    format!("{scheme}://127.0.0.1:{client}"),
                    "--advertise-client-urls".into(),
                    format!("{scheme}://127.0.0.1:{client}"),
                    "--listen-peer-urls".into(),
                    format!("http://127.0.0.1:{peer}"),
                    "--initial-advertise-peer-urls".into(),
                    format!("http://127.0.0.1:{peer}"),
                    "--initial-cluster".into(),
                    initial.clone(),
                    "--initial-cluster-state".into(),
                    "new".into(),
                    "--initial-cluster-token".into(),
                    format!("nimbus-{name}-{}", std::process::id()),
                    "--heartbeat-interval".into(),
                    "50".into(),
                    "--election-timeout".into(),
                    "500".into(),
                ])
                .args(&tls_args)
                .stdout(log.try_clone().unwrap())
                .stderr(log)
                .spawn()
                .expect("etcd (Debian package etcd-server; scripts/test.sh installs it)");
            members.push(child);
        }
        let urls: Vec<String> = ports
            .iter()
            .map(|(c, _)| format!("{scheme}://127.0.0.1:{c}"))
            .collect();
        let cluster = Cluster {
            dir,
            members,
            urls,
            access,
        };
        // Ready when every member answers a linearizable read (a leader
        // exists, and each serves clients): a test may count which member
        // a connection went to.
        let until = std::time::Instant::now() + Duration::from_secs(30);
        for url in &cluster.urls {
            let store = EtcdStore::with_access(
                std::slice::from_ref(url),
                b"/ready/",
                Duration::from_secs(2),
                cluster.access.clone(),
            )
            .unwrap();
            while let Err(e) = store.check() {
                assert!(
                    std::time::Instant::now() < until,
                    "etcd member {url} not ready: {e}"
                );
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        cluster
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
