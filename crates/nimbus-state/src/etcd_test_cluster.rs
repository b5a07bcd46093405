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
                    format!("http://127.0.0.1:{client}"),
                    "--advertise-client-urls".into(),
                    format!("http://127.0.0.1:{client}"),
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
                .stdout(log.try_clone().unwrap())
                .stderr(log)
                .spawn()
                .expect("etcd (Debian package etcd-server; scripts/test.sh installs it)");
            members.push(child);
        }
        let urls: Vec<String> = ports
            .iter()
            .map(|(c, _)| format!("http://127.0.0.1:{c}"))
            .collect();
        let cluster = Cluster { dir, members, urls };
        // Ready when every member answers a linearizable read (a leader
        // exists, and each serves clients): a test may count which member
        // a connection went to.
        let until = std::time::Instant::now() + Duration::from_secs(30);
        for url in &cluster.urls {
            let store = EtcdStore::new(
                std::slice::from_ref(url),
                b"/ready/",
                Duration::from_secs(2),
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
