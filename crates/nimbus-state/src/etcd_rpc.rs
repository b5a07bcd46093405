//! Calls to etcd's members over its native gRPC API, through the
//! `etcd-client` crate (tonic), from the synchronous `StateStore` world.
//!
//! Why a library and one runtime of its own: gRPC over HTTP/2 with TLS and
//! etcd's token authentication is what every etcd client speaks, and a
//! maintained crate does it; the store's callers are request handlers on
//! tokio's blocking pool and dedicated threads, which wait for an answer.
//! Each call is spawned on the store's own small runtime and waited for
//! over a channel: that works from any thread (a worker of the server's
//! runtime, its blocking pool, a plain thread, a test), where `block_on`
//! would panic inside another runtime.
//!
//! Why one client per member instead of the crate's balanced channel: a
//! call must be able to move on from a member that does not answer within
//! its share of the deadline (the balanced channel keeps routing to a
//! member whose connection failed), and a transaction must never be sent
//! to a second member once the first may have applied it. So this module
//! picks the member: a read goes on to the next one after any failure, a
//! write only after a failure to connect, which applied nothing.
//!
//! **Following the membership.** Every `FOLLOW_EVERY` the member list is
//! read from etcd, and when members were replaced the calls go to the
//! client URLs the members now advertise, without a restart. Only when the
//! configured endpoints name members (at least one of them is a member's
//! own advertised URL at the first look): endpoints that are proxies or a
//! load balancer are kept as given. "At least one", not "all": a member
//! may have been replaced before the node started, or between its start
//! and its first look, and its configuration not yet updated. The first
//! look is made at once, the next ones every `FOLLOW_EVERY`.
//!
//! **The leader first.** The same look asks which member leads, and calls
//! try that member first. A member that does not lead forwards a write to
//! the leader and asks it before a linearizable read, a hop more on the
//! members' links; sent to the leader, a take cost etcd 7-22 % less CPU
//! and was answered 15-27 % sooner (BENCHMARKS.md, "The leader first"),
//! and a read 20-24 % less and 22-24 % sooner. Only a member that says
//! itself that it leads is taken for the leader: during an election a
//! follower may still name the old one. A leader that does not answer, or
//! cannot be reached, is forgotten by the call that found out, so that the
//! calls after it are spread over the members again until a later look
//! finds the new one; a look that began before it was forgotten does not
//! bring it back. A read waits for the leader at most its even share of
//! the deadline (time left / members) before it asks the next member: a
//! leader cut off by a silent network costs a read that share, until a
//! call forgets it.

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use etcd_client::{Certificate, Client, ConnectOptions, Identity, TlsOptions};

use crate::store::StateError;

/// Largest answer taken (a scan of many records); beyond it the call
/// fails rather than allocate without bound.
pub(crate) const MAX_RESPONSE: usize = 64 << 20;

/// How long a connection may stay silent before it is taken for dead: a
/// member cut off by a silent network is noticed by the next call rather
/// than by a TCP timeout minutes later.
const KEEP_ALIVE: Duration = Duration::from_secs(2);

/// How a node proves itself to etcd, and etcd to it: what a production
/// etcd asks for (`[cluster]` ca_file, cert_file, key_file, username,
/// password_file), read from the files by the caller.
/// Why a PEM file cannot be the CA of the etcd members' certificates, or
/// the node's own certificate and key.
#[derive(Debug, PartialEq, Eq)]
pub enum PemProblem {
    /// A certificate block that does not parse.
    NotACertificate(String),
    /// No certificate (BEGIN CERTIFICATE) in the file.
    NoCertificate,
    /// A private key block that does not parse.
    NotAKey(String),
    /// A private key TLS cannot use.
    UnusableKey(String),
    /// The key is not the one the certificate was made for.
    NotTheCertificatesKey(String),
    /// The certificate expired this many days ago.
    Expired { days: u64 },
    /// The certificate is valid only in this many days.
    NotYetValid { days: u64 },
}

/// Which of the node's identity files a `PemProblem` is in.
#[derive(Debug, PartialEq, Eq, Clone, Copy)]
pub enum PemFile {
    /// `[cluster] cert_file`.
    Cert,
    /// `[cluster] key_file`.
    Key,
}

impl PemProblem {
    /// The file at fault, of the node's certificate and key.
    pub fn file(&self) -> PemFile {
        match self {
            PemProblem::NotAKey(_)
            | PemProblem::UnusableKey(_)
            | PemProblem::NotTheCertificatesKey(_) => PemFile::Key,
            _ => PemFile::Cert,
        }
    }
}

impl std::fmt::Display for PemProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PemProblem::NotACertificate(e) => write!(f, "not a PEM certificate: {e}"),
            PemProblem::NoCertificate => {
                f.write_str("no PEM certificate (BEGIN CERTIFICATE) in it")
            }
            PemProblem::NotAKey(e) => write!(f, "not a PEM private key: {e}"),
            PemProblem::UnusableKey(e) => write!(f, "a private key TLS cannot use: {e}"),
            PemProblem::NotTheCertificatesKey(e) => {
                write!(f, "not the key of the certificate in cert_file ({e})")
            }
            PemProblem::Expired { days } => {
                write!(
                    f,
                    "the certificate expired {days} day(s) ago; etcd refuses it"
                )
            }
            PemProblem::NotYetValid { days } => write!(
                f,
                "the certificate is not valid for {days} more day(s); etcd refuses it (is the \
                 clock right?)"
            ),
        }
    }
}

impl std::error::Error for PemProblem {}

/// Whether `ca_pem` holds at least one PEM certificate.
pub fn check_ca(ca_pem: &[u8]) -> Result<(), PemProblem> {
    use rustls::pki_types::{pem::PemObject, CertificateDer};
    match CertificateDer::pem_slice_iter(ca_pem).next() {
        Some(Ok(_)) => Ok(()),
        Some(Err(e)) => Err(PemProblem::NotACertificate(e.to_string())),
        None => Err(PemProblem::NoCertificate),
    }
}

/// Why `cert_pem` (a PEM certificate chain, the node's own first) and
/// `key_pem` (a PEM private key) cannot be one TLS identity: one does not
/// parse, or the key is not the certificate's (`PemProblem::file` names
/// the file at fault).
pub fn check_identity(cert_pem: &[u8], key_pem: &[u8]) -> Result<(), PemProblem> {
    use rustls::pki_types::{pem::PemObject, CertificateDer, PrivateKeyDer};
    let certs = CertificateDer::pem_slice_iter(cert_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| PemProblem::NotACertificate(e.to_string()))?;
    let Some(node) = certs.first().cloned() else {
        return Err(PemProblem::NoCertificate);
    };
    let key =
        PrivateKeyDer::from_pem_slice(key_pem).map_err(|e| PemProblem::NotAKey(e.to_string()))?;
    let signer = rustls::crypto::aws_lc_rs::default_provider()
        .key_provider
        .load_private_key(key)
        .map_err(|e| PemProblem::UnusableKey(e.to_string()))?;
    rustls::sign::CertifiedKey::new(certs, signer)
        .keys_match()
        .map_err(|e| PemProblem::NotTheCertificatesKey(e.to_string()))?;
    in_its_dates(&node)
}

/// Whether certificate `cert` is valid today. webpki checks a
/// certificate's dates before it looks for its issuer, so a chain to the
/// certificate itself tells its dates apart from everything else, which
/// etcd decides.
fn in_its_dates(cert: &rustls::pki_types::CertificateDer<'_>) -> Result<(), PemProblem> {
    use rustls::pki_types::UnixTime;
    let Ok(ee) = webpki::EndEntityCert::try_from(cert) else {
        return Ok(());
    };
    let Ok(anchor) = webpki::anchor_from_trusted_cert(cert) else {
        return Ok(());
    };
    let now = UnixTime::now();
    let days = |a: UnixTime, b: UnixTime| a.as_secs().saturating_sub(b.as_secs()).div_ceil(86_400);
    match ee.verify_for_usage(
        webpki::ALL_VERIFICATION_ALGS,
        &[anchor],
        &[],
        now,
        webpki::KeyUsage::client_auth(),
        None,
        None,
    ) {
        Err(webpki::Error::CertExpired { not_after, .. }) => Err(PemProblem::Expired {
            days: days(now, not_after),
        }),
        Err(webpki::Error::CertNotValidYet { not_before, .. }) => Err(PemProblem::NotYetValid {
            days: days(not_before, now),
        }),
        _ => Ok(()),
    }
}

#[derive(Clone, Default)]
pub struct Access {
    /// PEM of the CA that signed the members' certificates: the members
    /// are reached over TLS (https:// endpoints) and must prove they are
    /// the cluster's.
    pub ca_pem: Option<Vec<u8>>,
    /// PEM certificate chain and private key of this node, for members
    /// run with `--client-cert-auth`.
    pub identity: Option<(Vec<u8>, Vec<u8>)>,
    /// An etcd user and its password (etcd's own authentication, with
    /// roles).
    pub user: Option<(String, String)>,
}

impl std::fmt::Debug for Access {
    // The password never goes into a log.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Access")
            .field("tls", &self.ca_pem.is_some())
            .field("client_certificate", &self.identity.is_some())
            .field("user", &self.user.as_ref().map(|(u, _)| u))
            .finish()
    }
}

/// One member's client URL and its client.
pub(crate) struct Endpoint {
    pub(crate) url: String,
    /// Whether this member said at the last look that it leads, and no
    /// call found it silent or unreachable since (module comment).
    leads: AtomicBool,
    /// How many times a call forgot that this member leads: a look that
    /// began before the last time does not mark it (`look_at_members`).
    forgotten: AtomicU64,
    /// Made on first use (a client connects lazily; a member that is down
    /// fails the call, not the making).
    client: tokio::sync::OnceCell<Client>,
}

impl Endpoint {
    fn new(url: String) -> Arc<Endpoint> {
        Arc::new(Endpoint {
            url,
            leads: AtomicBool::new(false),
            forgotten: AtomicU64::new(0),
            client: tokio::sync::OnceCell::new(),
        })
    }
}

/// The endpoints calls go to, as one list (replaced whole).
pub(crate) type Endpoints = Arc<Vec<Arc<Endpoint>>>;

/// How often the member list is read again (`Members::follow`).
const FOLLOW_EVERY: Duration = Duration::from_secs(5);

/// The members and the runtime their calls run on.
pub(crate) struct Members {
    endpoints: std::sync::RwLock<Endpoints>,
    access: Access,
    /// Whether the member list decides the endpoints: None until the first
    /// look (see the module comment).
    following: std::sync::Mutex<Option<bool>>,
    runtime: Option<tokio::runtime::Runtime>,
    /// The member the next call tries first when the leader is not
    /// known: calls are spread over the members instead of all landing on
    /// the first one configured.
    next: AtomicUsize,
}

impl Drop for Members {
    fn drop(&mut self) {
        // A runtime dropped inside another runtime's context panics; one
        // shut down in the background does not.
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }
}

/// Whether a call may be made again on another member after a failure.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Retry {
    /// A read, or a lease call: doing it twice does no harm.
    Anywhere,
    /// A write: only when it cannot have reached the member.
    IfNotSent,
}

impl Members {
    pub(crate) fn new(urls: &[String], access: Access) -> std::io::Result<Members> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("nimbus-etcd")
            .enable_all()
            .build()?;
        Ok(Members {
            endpoints: std::sync::RwLock::new(Arc::new(
                urls.iter().cloned().map(Endpoint::new).collect(),
            )),
            access,
            following: std::sync::Mutex::new(None),
            runtime: Some(runtime),
            next: AtomicUsize::new(0),
        })
    }

    fn handle(&self) -> &tokio::runtime::Handle {
        // Always Some until drop.
        self.runtime
            .as_ref()
            .map(tokio::runtime::Runtime::handle)
            .expect("the runtime lives as long as the members")
    }

    /// Runs `task` on the members' runtime, on its own (a watch).
    pub(crate) fn spawn(&self, task: impl Future<Output = ()> + Send + 'static) {
        self.handle().spawn(task);
    }

    /// The endpoints calls go to now.
    pub(crate) fn endpoints(&self) -> Endpoints {
        self.endpoints
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Their URLs.
    pub(crate) fn urls(&self) -> Vec<String> {
        self.endpoints().iter().map(|e| e.url.clone()).collect()
    }

    /// Reads the member list every `FOLLOW_EVERY` for as long as these
    /// members are in use.
    pub(crate) fn follow(self: &Arc<Self>) {
        let members = Arc::downgrade(self);
        self.spawn(async move {
            loop {
                let Some(me) = members.upgrade() else {
                    return;
                };
                me.look_at_members().await;
                drop(me);
                tokio::time::sleep(FOLLOW_EVERY).await;
            }
        });
    }

    /// One look at the member list (from the first member that gives it):
    /// the client URLs of the configured scheme, sorted, and the URL of the
    /// member that member names the leader, when it does; None when no
    /// member answered.
    async fn advertised(&self, list: &Endpoints) -> Option<(Vec<String>, Option<String>)> {
        let scheme = if self.access.ca_pem.is_some() {
            "https://"
        } else {
            "http://"
        };
        for e in list.iter() {
            let Ok(mut client) = self.client(e, FOLLOW_EVERY / 2).await else {
                continue;
            };
            let Ok(Ok(r)) = tokio::time::timeout(FOLLOW_EVERY / 2, client.member_list()).await
            else {
                continue;
            };
            let mut urls: Vec<String> = r
                .members()
                .iter()
                // A learner answers no client call until it is promoted.
                .filter(|m| !m.is_learner())
                .flat_map(|m| m.client_urls())
                .filter(|u| u.starts_with(scheme))
                .cloned()
                .collect();
            urls.sort();
            urls.dedup();
            let named = match tokio::time::timeout(FOLLOW_EVERY / 2, client.status()).await {
                Ok(Ok(status)) => r
                    .members()
                    .iter()
                    .find(|m| m.id() == status.leader())
                    .and_then(|m| m.client_urls().iter().find(|u| u.starts_with(scheme)))
                    .cloned(),
                _ => None,
            };
            return Some((urls, named));
        }
        None
    }

    /// The URL of the member calls try first, when one is taken for the
    /// leader.
    #[cfg(test)]
    pub(crate) fn leader(&self) -> Option<String> {
        let list = self.endpoints();
        let leader = list.iter().find(|e| e.leads.load(Ordering::SeqCst));
        leader.map(|e| e.url.clone())
    }

    /// Where in `list` a watch starts: at the leader, which has a change
    /// before the followers apply it, else at each member in turn.
    pub(crate) fn first_for_watch(&self, list: &Endpoints) -> usize {
        list.iter()
            .position(|e| e.leads.load(Ordering::SeqCst))
            .unwrap_or_else(|| self.next.fetch_add(1, Ordering::Relaxed) % list.len().max(1))
    }

    /// Whether the member at `endpoint` answers that it leads itself.
    async fn says_it_leads(&self, endpoint: &Endpoint) -> bool {
        let Ok(mut client) = self.client(endpoint, FOLLOW_EVERY / 2).await else {
            return false;
        };
        match tokio::time::timeout(FOLLOW_EVERY / 2, client.status()).await {
            Ok(Ok(status)) => status
                .header()
                .is_some_and(|h| h.member_id() == status.leader()),
            _ => false,
        }
    }

    /// Forgets that `endpoint` leads: a call found it silent or
    /// unreachable. The count goes up before the mark goes, so that a look
    /// that marked it before this sees the count changed (`look_at_members`).
    /// Counted even when it is not marked: a look under way may be about
    /// to mark it.
    fn forget_leader(&self, endpoint: &Endpoint) {
        endpoint.forgotten.fetch_add(1, Ordering::SeqCst);
        endpoint.leads.store(false, Ordering::SeqCst);
    }

    async fn look_at_members(&self) {
        let list = self.endpoints();
        // Each member's count of forgets as the look begins. A member that
        // joins during the look was never marked, so it starts at 0.
        let forgotten: Vec<(Arc<Endpoint>, u64)> = list
            .iter()
            .map(|e| (e.clone(), e.forgotten.load(Ordering::SeqCst)))
            .collect();
        let forgotten_at_start = |e: &Arc<Endpoint>| {
            forgotten
                .iter()
                .find(|(f, _)| Arc::ptr_eq(f, e))
                .map_or(0, |(_, n)| *n)
        };
        let Some((advertised, named)) = self.advertised(&list).await else {
            return;
        };
        let mut current: Vec<String> = list.iter().map(|e| e.url.clone()).collect();
        current.sort();
        let follows = *crate::blocking::lock(&self.following).get_or_insert_with(|| {
            let ours = current.iter().any(|u| advertised.contains(u));
            if !ours {
                tracing::info!(
                    "etcd: the configured endpoints are not the members' own client URLs \
                     ({}): they are kept as given, and a replaced member is not followed",
                    advertised.join(", ")
                );
            }
            ours
        });
        let list = if follows && !advertised.is_empty() && advertised != current {
            self.follow_members(&list, &advertised, &current)
        } else {
            list
        };
        // Endpoints kept as given may not be members (a proxy): no leader.
        let mut leader = None;
        if let Some(named) = named.filter(|_| follows) {
            if let Some(e) = list.iter().find(|e| e.url == named) {
                if self.says_it_leads(e).await {
                    leader = Some(e.clone());
                }
            }
        }
        for e in list.iter() {
            let leads = leader.as_ref().is_some_and(|l| Arc::ptr_eq(l, e));
            e.leads.store(leads, Ordering::SeqCst);
            if leads && e.forgotten.load(Ordering::SeqCst) != forgotten_at_start(e) {
                // A call forgot this member meanwhile: the look may have
                // asked it before it fell silent. A forget of another
                // member (the old leader) does not undo this mark.
                e.leads.store(false, Ordering::SeqCst);
            }
        }
    }

    /// Replaces the endpoints of `list` with the members' `advertised`
    /// URLs (`current` are the list's, sorted); the new list.
    fn follow_members(
        &self,
        list: &Endpoints,
        advertised: &[String],
        current: &[String],
    ) -> Endpoints {
        // Kept members keep their connections.
        let next: Vec<Arc<Endpoint>> = advertised
            .iter()
            .map(|u| {
                list.iter()
                    .find(|e| &e.url == u)
                    .cloned()
                    .unwrap_or_else(|| Endpoint::new(u.clone()))
            })
            .collect();
        tracing::info!(
            "etcd: the cluster's members changed: calls go to {} (were {})",
            advertised.join(", "),
            current.join(", ")
        );
        let next = Arc::new(next);
        *self.endpoints.write().unwrap_or_else(|p| p.into_inner()) = next.clone();
        next
    }

    /// Runs `op` on the runtime and waits for it until `deadline`.
    pub(crate) fn run<T: Send + 'static>(
        &self,
        deadline: Instant,
        op: impl Future<Output = Result<T, StateError>> + Send + 'static,
    ) -> Result<T, StateError> {
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        // `op` keeps to the deadline itself (each member's try is bounded
        // by it) and then says which members failed and how; this bound,
        // a little later, only catches an `op` that does not, so that the
        // two never race at the same instant.
        let bound = deadline + Duration::from_millis(50);
        self.handle().spawn(async move {
            let _ = tx.send(tokio::time::timeout_at(bound.into(), op).await);
        });
        // A little past that: the task ends by it, and its answer is worth
        // the wait.
        let wait = bound.saturating_duration_since(Instant::now()) + Duration::from_millis(100);
        match crate::blocking::off_worker(|| rx.recv_timeout(wait)) {
            Ok(Ok(answer)) => answer,
            Ok(Err(_)) | Err(_) => Err(StateError::Unavailable(
                "etcd: no answer in time; the request's outcome is unknown".into(),
            )),
        }
    }

    /// Calls `op` on one member after another until one answers, all by
    /// `deadline`; each try takes at most half the time left, unless it
    /// is the last, so that a member that never answers leaves the others
    /// time.
    pub(crate) fn call<T, F, Fut>(
        self: &Arc<Self>,
        deadline: Instant,
        retry: Retry,
        op: F,
    ) -> Result<T, StateError>
    where
        T: Send + 'static,
        F: Fn(Client) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<T, etcd_client::Error>> + Send + 'static,
    {
        let me = self.clone();
        self.run(deadline, async move {
            let list = me.endpoints();
            let n = list.len();
            let leader = list.iter().position(|e| e.leads.load(Ordering::SeqCst));
            let first = leader.unwrap_or_else(|| me.next.fetch_add(1, Ordering::Relaxed) % n);
            let mut errors = Vec::new();
            for i in 0..n {
                let endpoint = &list[(first + i) % n];
                let url = &endpoint.url;
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    errors.push("no time left".to_string());
                    break;
                }
                let share = if i + 1 == n {
                    left
                } else if i == 0 && leader.is_some() && retry == Retry::Anywhere {
                    // A read waits for the leader its even share only.
                    left / n as u32
                } else {
                    left / 2
                };
                let client = match me.client(endpoint, share).await {
                    Ok(c) => c,
                    Err(e) => {
                        me.forget_leader(endpoint);
                        errors.push(format!("{url}: {}", describe(&e)));
                        continue;
                    }
                };
                // Err(None): no answer in time.
                let answer = match tokio::time::timeout(share, op(client)).await {
                    Ok(answer) => answer.map_err(Some),
                    Err(_) => Err(None),
                };
                // Silent or unreachable, not a refusal of this request: the
                // calls after this one are spread again (module comment).
                if matches!(&answer, Err(None))
                    || matches!(&answer, Err(Some(e)) if cannot_serve(e))
                {
                    me.forget_leader(endpoint);
                }
                match answer {
                    Ok(v) => return Ok(v),
                    Err(Some(e)) if retry == Retry::IfNotSent && !not_sent(&e) => {
                        return Err(StateError::Unavailable(format!(
                            "etcd {url}: {}; the request's outcome is unknown",
                            describe(&e)
                        )))
                    }
                    Err(None) if retry == Retry::IfNotSent => {
                        return Err(StateError::Unavailable(format!(
                            "etcd {url}: no answer within {share:?}; the request's outcome is \
                             unknown"
                        )))
                    }
                    Err(Some(e)) => errors.push(format!("{url}: {}", describe(&e))),
                    Err(None) => errors.push(format!("{url}: no answer within {share:?}")),
                }
            }
            let errors = errors.join("; ");
            let hint = me.tls_hint(&errors);
            Err(StateError::Unavailable(format!(
                "etcd: no member answered ({errors}){hint}"
            )))
        })
    }

    /// What TLS failures among `errors` most likely mean, for the operator.
    fn tls_hint(&self, errors: &str) -> &'static str {
        if self.access.ca_pem.is_none() {
            // A TLS member answers a plain HTTP/2 preface by closing.
            let closed = [
                "BrokenPipe",
                "broken pipe",
                "ConnectionReset",
                "connection closed",
            ];
            return if closed.iter().any(|w| errors.contains(w)) {
                ". A member closed the connection at once: if the members serve TLS, use \
                 https:// endpoints and set [cluster] ca_file (see docs/SECURITY.md)"
            } else {
                ""
            };
        }
        if errors.contains("UnknownIssuer") || errors.contains("invalid peer certificate") {
            ". The members' certificates are not signed by the CA of [cluster] ca_file, or \
             do not name the host of the endpoint"
        } else if [
            "BadCertificate",
            "CertificateRequired",
            "connection closed",
            "broken pipe",
        ]
        .iter()
        .any(|w| errors.contains(w))
        {
            if self.access.identity.is_none() {
                ". A member closed the TLS connection: it wants a client certificate; set \
                 [cluster] cert_file and key_file to one its CA signed"
            } else {
                ". A member closed the TLS connection: it does not accept this node's \
                 certificate ([cluster] cert_file); is it signed by the members' CA, and \
                 still valid?"
            }
        } else {
            ""
        }
    }

    /// The client of `endpoint`, made on first use.
    pub(crate) async fn client(
        &self,
        endpoint: &Endpoint,
        within: Duration,
    ) -> Result<Client, etcd_client::Error> {
        let url = endpoint.url.clone();
        let access = self.access.clone();
        endpoint
            .client
            .get_or_try_init(|| async move {
                let mut options = ConnectOptions::new()
                    .with_connect_timeout(within)
                    .with_keep_alive(KEEP_ALIVE, KEEP_ALIVE)
                    .with_keep_alive_while_idle(true)
                    .with_require_leader(true);
                if let Some(ca) = &access.ca_pem {
                    let mut tls = TlsOptions::new().ca_certificate(Certificate::from_pem(ca));
                    if let Some((cert, key)) = &access.identity {
                        tls = tls.identity(Identity::from_pem(cert, key));
                    }
                    options = options.with_tls(tls);
                }
                if let Some((user, password)) = &access.user {
                    // A token etcd let expire is fetched again, once, before
                    // the call is sent again: nothing was applied.
                    options = options
                        .with_user(user.clone(), password.clone())
                        .with_auto_token_refresh(true);
                }
                Client::connect([url], Some(options)).await
            })
            .await
            .cloned()
    }
}

/// A failure in words an operator can act on: the error and what caused
/// it, down the chain (a TLS alert or a certificate the node does not
/// trust is several causes deep in a transport error).
fn describe(e: &etcd_client::Error) -> String {
    let mut words = e.to_string();
    let mut cause = std::error::Error::source(e);
    while let Some(c) = cause {
        let more = c.to_string();
        if !words.contains(&more) {
            words.push_str(": ");
            words.push_str(&more);
        }
        cause = c.source();
    }
    words
}

/// Whether a failed call cannot have reached the member: its connection
/// could not be made, so nothing was sent. tonic reports a failed connect
/// as UNAVAILABLE with the connector's message, and its source is the
/// transport's ConnectError: a connection a proxy accepted and reset
/// because the member behind it is down says only "Connection reset by
/// peer" in its message, and ConnectError in its source.
///
/// A message of etcd's own ("etcdserver: ...") came back from a member,
/// so the request reached it, and it counts as sent unless it is one of
/// the refusals etcd's gRPC interceptor answers before the request reaches
/// the server (`REFUSED_UNSENT`): "request timed out, possibly due to
/// connection lost" is UNAVAILABLE and speaks of a connection, yet the
/// member may have proposed the write, and sending it to another member
/// could apply it twice.
fn not_sent(e: &etcd_client::Error) -> bool {
    match e {
        etcd_client::Error::TransportError(_) => true,
        etcd_client::Error::GRpcStatus(s) => {
            let m = s.message();
            if m.starts_with("etcdserver:") {
                return REFUSED_UNSENT.contains(&m);
            }
            let source = std::error::Error::source(s).map(|e| format!("{e:?}"));
            s.code() == tonic::Code::Unavailable
                && (m.contains("connect")
                    || m.contains("Connection refused")
                    || source.is_some_and(|s| s.contains("ConnectError")))
        }
        _ => false,
    }
}

/// etcd's refusals of a request its gRPC interceptor answers before the
/// server proposes or reads anything: a member cut off from its leader
/// (the calls ask for one, `with_require_leader`), a member of an older
/// version than the cluster's, and a learner, which serves no client
/// call. Nothing was applied, so a write may go to another member.
const REFUSED_UNSENT: [&str; 3] = [
    "etcdserver: no leader",
    "etcdserver: not capable",
    "etcdserver: rpc not supported for learner",
];

/// Whether a failed call says the member cannot serve anything now (the
/// connection failed, or it has no leader), rather than refusing this one
/// request (a permission, a request too large).
fn cannot_serve(e: &etcd_client::Error) -> bool {
    match e {
        etcd_client::Error::TransportError(_) => true,
        // A member that lost its leadership says "not leader" with
        // FAILED_PRECONDITION, the code of etcd's refusals too.
        etcd_client::Error::GRpcStatus(s) => {
            matches!(
                s.code(),
                tonic::Code::Unavailable | tonic::Code::DeadlineExceeded
            ) || s.message().contains("etcdserver: not leader")
                || REFUSED_UNSENT.contains(&s.message())
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(code: tonic::Code, message: &str) -> etcd_client::Error {
        etcd_client::Error::GRpcStatus(tonic::Status::new(code, message))
    }

    #[test]
    fn an_answer_of_etcd_means_the_request_was_sent() {
        // etcd's ErrTimeoutDueToConnectionLost: the member had the write.
        let lost = status(
            tonic::Code::Unavailable,
            "etcdserver: request timed out, possibly due to connection lost",
        );
        assert!(!not_sent(&lost), "{lost}");
        assert!(cannot_serve(&lost), "{lost}");
        // A read's ReadIndex that an election interrupted: sent, though
        // only a read meets it.
        let changed = status(tonic::Code::Unavailable, "etcdserver: leader changed");
        assert!(!not_sent(&changed), "{changed}");
        // Refused before the server saw the request: nothing applied.
        // A learner's refusal is FAILED_PRECONDITION before etcd 3.5.
        for code in [tonic::Code::Unavailable, tonic::Code::FailedPrecondition] {
            for unsent in REFUSED_UNSENT {
                let e = status(code, unsent);
                assert!(not_sent(&e) && cannot_serve(&e), "{e}");
            }
        }
        // What tonic says when it could not connect at all.
        let refused = status(
            tonic::Code::Unavailable,
            "error trying to connect: tcp connect error: Connection refused (os error 111)",
        );
        assert!(not_sent(&refused), "{refused}");
        let denied = status(
            tonic::Code::PermissionDenied,
            "etcdserver: permission denied",
        );
        assert!(!not_sent(&denied) && !cannot_serve(&denied), "{denied}");
    }
}
