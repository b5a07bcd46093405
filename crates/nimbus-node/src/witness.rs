//! The witness service (MS-SWN): a client of a continuously available
//! share registers, through one node's witness service, for the interface
//! it reaches the share at on another node, and waits in AsyncNotify; when
//! that node leaves the cluster (its membership record goes: a leave, or
//! its lease expired after a kill), the waiting call answers
//! RESOURCE_CHANGE and the client moves before its TCP connection times
//! out.
//!
//! What it serves: DCE/RPC over TCP on `[witness] listen`, NTLM and
//! Kerberos logons at the integrity or privacy level (or packet, served
//! as integrity; `nimbus_rpc::ip_tcp`), WitnessrGetInterfaceList,
//! Register, RegisterEx,
//! UnRegister and AsyncNotify (RESOURCE_CHANGE, CLIENT_MOVE, SHARE_MOVE,
//! IP_CHANGE), and the endpoint mapper's ept_map (`[witness]
//! endpoint_mapper`, port 135 by default), through which Windows and
//! rpcclient find the service. Registrations live with the association
//! that made them, as context handles do (MS-SWN 3.1.1.1), and on a
//! cluster node also in etcd (`crate::witness_registry`); the node that
//! serves them watches the membership. `nimbus witness move` and `nimbus
//! drain` (`crate::witness_admin`) put their messages in the boxes of the
//! nodes holding the registrations concerned.

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;

use nimbus_rpc::epmapper;
use nimbus_rpc::ip_tcp::{Association, Call, Served, MAX_FRAG};
use nimbus_rpc::pdu::{Header, HEADER_LEN};
use nimbus_rpc::witness::{self, opnum, werror, Handle, InterfaceInfo, Register};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, Notify};

use crate::rpc_logon_gate::ServerLogonGate;
use crate::server::Server;
use crate::witness_registry::{lock, Registration};

/// Connections served at once; more are closed at accept.
const MAX_CONNECTIONS: usize = 1024;
/// Registrations one association may hold.
const MAX_REGISTRATIONS: usize = 64;
/// How often the membership is read while registrations exist even when
/// the watch of the membership reports nothing (a watch that lags).
const MEMBERSHIP_AGAIN: Duration = Duration::from_secs(30);
/// How soon a read of the membership that failed is tried again.
const MEMBERSHIP_RETRY: Duration = Duration::from_secs(1);
/// Answers queued for one connection's writer.
const QUEUED: usize = 64;
/// AsyncNotify calls one association may have waiting.
const MAX_WAITING: usize = 8;
/// How long a connection not yet logged on may take per PDU.
const LOGON_WITHIN: Duration = Duration::from_secs(30);

/// The cluster's interfaces as a client asking `local` sees them: each
/// member's advertised address, or on a single node its own listening
/// addresses.
fn interfaces(server: &Server, local: IpAddr) -> Result<Vec<InterfaceInfo>, String> {
    let cfg = server.config();
    match &server.cluster {
        Some(m) => Ok(m
            .members()
            .map_err(|e| e.to_string())?
            .into_iter()
            .filter_map(|x| {
                let addr = x.advertise.parse::<SocketAddr>().ok()?.ip();
                Some(InterfaceInfo {
                    witness_if: addr != local,
                    group_name: x.node,
                    available: true,
                    addr,
                })
            })
            .collect()),
        None => Ok(cfg
            .listen
            .iter()
            .map(|a| {
                if a.ip().is_unspecified() {
                    local
                } else {
                    a.ip()
                }
            })
            // One interface per address, however many ports listen on it.
            .collect::<std::collections::BTreeSet<IpAddr>>()
            .into_iter()
            .map(|addr| InterfaceInfo {
                group_name: cfg.server_name.clone(),
                available: true,
                addr,
                witness_if: false,
            })
            .collect()),
    }
}

/// MS-SWN 3.1.4.2: NetName must be the server's name (ServerGlobalName):
/// its NetBIOS name, an alias, or a DNS name whose first label is one.
fn is_our_name(server: &Server, name: &str) -> bool {
    let cfg = server.config();
    let first = name.split('.').next().unwrap_or(name);
    std::iter::once(&cfg.server_name)
        .chain(cfg.server_aliases.iter())
        .any(|n| n.eq_ignore_ascii_case(name) || n.eq_ignore_ascii_case(first))
}

/// What a listener serves.
#[derive(Clone, Copy)]
enum Port {
    /// The witness service (and the mapper, harmlessly).
    Witness,
    /// The endpoint mapper alone.
    Mapper,
}

impl Port {
    fn count(self, w: &crate::witness_registry::Witness) -> &std::sync::atomic::AtomicUsize {
        match self {
            Port::Witness => &w.connections,
            Port::Mapper => &w.mapper_connections,
        }
    }

    fn served(self) -> Vec<Served> {
        let mapper = Served {
            syntax: epmapper::INTERFACE,
            needs_integrity: false,
        };
        match self {
            Port::Witness => vec![
                Served {
                    syntax: witness::INTERFACE,
                    needs_integrity: true,
                },
                mapper,
            ],
            Port::Mapper => vec![mapper],
        }
    }
}

/// Why the witness service could not start.
#[derive(Debug)]
pub struct BindError {
    pub addr: SocketAddr,
    pub key: &'static str,
    pub error: std::io::Error,
}

/// Binds `[witness] listen` and the endpoint mapper, and serves them
/// until the server goes.
pub async fn serve(
    server: Arc<Server>,
    listen: Vec<SocketAddr>,
    mapper: Option<Vec<SocketAddr>>,
) -> Result<(), BindError> {
    let mut listeners = Vec::new();
    for a in &listen {
        let l = TcpListener::bind(a).await.map_err(|error| BindError {
            addr: *a,
            key: "witness.listen",
            error,
        })?;
        tracing::info!("witness: listening on {a}");
        listeners.push((l, Port::Witness));
    }
    let chosen = mapper.is_some();
    let mapper = mapper.unwrap_or_else(|| {
        listen
            .iter()
            .map(|a| SocketAddr::new(a.ip(), 135))
            .collect()
    });
    for a in &mapper {
        match TcpListener::bind(a).await {
            Ok(l) => {
                tracing::info!("witness: endpoint mapper on {a}");
                listeners.push((l, Port::Mapper));
            }
            Err(error) if chosen => {
                return Err(BindError {
                    addr: *a,
                    key: "witness.endpoint_mapper",
                    error,
                })
            }
            Err(e) => tracing::warn!(
                "witness: no endpoint mapper on {a} ({e}): Windows clients and rpcclient, which \
                 ask port 135 for the witness service's port, will not find it; run with \
                 CAP_NET_BIND_SERVICE or set [witness] endpoint_mapper"
            ),
        }
    }
    let weak = Arc::downgrade(&server);
    drop(server);
    for (l, port) in listeners {
        tokio::spawn(accept(weak.clone(), l, port));
    }
    tokio::spawn(follow_members(weak));
    Ok(())
}

async fn accept(server: Weak<Server>, listener: TcpListener, port: Port) {
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(a) => a,
            Err(e) => {
                // Out of descriptors, most likely: wait rather than spin.
                tracing::warn!("witness: accepting a connection: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Some(s) = server.upgrade() else { return };
        let w = s.witness.clone();
        if port.count(&w).fetch_add(1, Ordering::SeqCst) >= MAX_CONNECTIONS {
            port.count(&w).fetch_sub(1, Ordering::SeqCst);
            tracing::warn!("witness: {peer} refused: {MAX_CONNECTIONS} connections already");
            continue;
        }
        tokio::spawn(async move {
            connection(s, stream, port).await;
            port.count(&w).fetch_sub(1, Ordering::SeqCst);
        });
    }
}

/// Reads the membership when it changes (and now and then), while
/// registrations exist, and reports what left.
async fn follow_members(server: Weak<Server>) {
    // A single node's interfaces do not go while it serves.
    let Some(mut changes) = server
        .upgrade()
        .and_then(|s| s.cluster.as_ref().map(|m| m.membership_changes()))
    else {
        return;
    };
    let mut failed = false;
    loop {
        let Some(s) = server.upgrade() else { return };
        // Woken by the cluster's watch of its runs when one joins or goes,
        // or by a new registration; a read that failed is tried again
        // each second.
        let wait = if failed {
            MEMBERSHIP_RETRY
        } else {
            MEMBERSHIP_AGAIN
        };
        let recheck = s.witness.recheck.clone();
        drop(s);
        let woken = tokio::time::timeout(wait, async {
            tokio::select! {
                changed = changes.changed() => changed.is_ok(),
                () = recheck.notified() => true,
            }
        });
        if let Ok(false) = woken.await {
            // The membership is gone (shutting down): no more wake-ups.
            tokio::time::sleep(MEMBERSHIP_AGAIN).await;
        }
        let Some(s) = server.upgrade() else { return };
        if lock(&s.witness.registrations).is_empty() {
            failed = false;
            continue;
        }
        let upto = s.witness.issued();
        let s2 = s.clone();
        let live =
            tokio::task::spawn_blocking(move || interfaces(&s2, IpAddr::from([0, 0, 0, 0]))).await;
        failed = match live {
            Ok(Ok(live)) => {
                s.witness.note_members(&live, upto);
                false
            }
            Ok(Err(e)) => {
                tracing::debug!("witness: reading the membership: {e}");
                true
            }
            Err(_) => true,
        };
    }
}

/// Queues the call's answer for the writer; when it could not be
/// protected (the association ended), an empty PDU that closes the
/// connection instead.
async fn answer(a: &mut Association, call: &Call, stub: &[u8], tx: &mpsc::Sender<Vec<u8>>) {
    for out in a.respond(call, stub) {
        let _ = tx.send(out).await;
    }
    if a.is_closed() {
        let _ = tx.send(Vec::new()).await;
    }
}

/// Reads one whole PDU; None at the end of the stream or on a length no
/// client sends.
async fn read_pdu(rd: &mut tokio::net::tcp::OwnedReadHalf) -> Option<Vec<u8>> {
    let mut head = [0u8; HEADER_LEN];
    rd.read_exact(&mut head).await.ok()?;
    let hdr = Header::parse(&head).ok()?;
    let len = hdr.frag_length as usize;
    if len > MAX_FRAG as usize {
        return None;
    }
    let mut pdu = vec![0u8; len];
    pdu[..HEADER_LEN].copy_from_slice(&head);
    rd.read_exact(&mut pdu[HEADER_LEN..]).await.ok()?;
    Some(pdu)
}

async fn connection(server: Arc<Server>, stream: TcpStream, port: Port) {
    let Ok(local) = stream.local_addr() else {
        return;
    };
    let peer = stream.peer_addr().ok();
    // An IPv4 client of a dual-stack listener, as `--client` names it.
    let peer_ip = peer.map_or(local.ip(), |p| p.ip().to_canonical());
    let _ = stream.set_nodelay(true);
    let (mut rd, mut wr) = stream.into_split();
    let assoc = Arc::new(tokio::sync::Mutex::new(Association::new(
        port.served(),
        server.auth.clone(),
        local.ip(),
        Some(ServerLogonGate::for_client(server.clone(), peer_ip)),
    )));
    let id = server
        .witness
        .next_association
        .fetch_add(1, Ordering::Relaxed);
    let (tx, mut rx) = mpsc::channel::<Vec<u8>>(QUEUED);
    let writer = tokio::spawn(async move {
        while let Some(pdu) = rx.recv().await {
            // An empty one: the association ended after an answer it could
            // not protect; the client sees the connection close.
            if pdu.is_empty() {
                let _ = wr.shutdown().await;
                return;
            }
            if wr.write_all(&pdu).await.is_err() {
                return;
            }
        }
    });
    let waiting = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    // Told by a waiting AsyncNotify whose answer closed the association
    // (one it could not protect): the reader stops at once rather than
    // when the client next sends.
    let closed = Arc::new(Notify::new());
    loop {
        let logged_on = assoc.lock().await.caller().is_some();
        let read = async {
            if logged_on {
                read_pdu(&mut rd).await
            } else {
                tokio::time::timeout(LOGON_WITHIN, read_pdu(&mut rd))
                    .await
                    .ok()
                    .flatten()
            }
        };
        let pdu = tokio::select! {
            pdu = read => pdu,
            _ = closed.notified() => None,
        };
        let Some(pdu) = pdu else { break };
        let mut a = assoc.lock().await;
        let r = a.receive(pdu);
        for out in r.out {
            if tx.send(out).await.is_err() {
                break;
            }
        }
        if let Some(why) = r.close {
            tracing::info!("witness: closing the connection of {peer:?}: {why}");
            break;
        }
        let Some(call) = r.call else { continue };
        drop(a);
        match run(&server, id, (local.ip(), peer_ip), &call).await {
            Answer::Now(stub) => {
                let mut a = assoc.lock().await;
                answer(&mut a, &call, &stub, &tx).await;
                if a.is_closed() {
                    break;
                }
            }
            Answer::Fault(status) => {
                let a = assoc.lock().await;
                let _ = tx.send(a.fault(&call, status)).await;
            }
            Answer::Wait(..) if waiting.load(Ordering::SeqCst) >= MAX_WAITING => {
                let stub = witness::encode_notify(Err(werror::NO_SYSTEM_RESOURCES));
                let mut a = assoc.lock().await;
                answer(&mut a, &call, &stub, &tx).await;
                if a.is_closed() {
                    break;
                }
            }
            Answer::Wait(handle, wake, timeout) => {
                let (server, assoc, tx) = (server.clone(), assoc.clone(), tx.clone());
                let (waiting, closed) = (waiting.clone(), closed.clone());
                waiting.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    let stub = notify_when(&server, handle, wake, timeout).await;
                    let mut a = assoc.lock().await;
                    answer(&mut a, &call, &stub, &tx).await;
                    if a.is_closed() {
                        closed.notify_one();
                    }
                    waiting.fetch_sub(1, Ordering::SeqCst);
                });
            }
        }
    }
    assoc.lock().await.close();
    let gone = server.witness.drop_association(id);
    if !gone.is_empty() {
        let s = server.clone();
        let _ = tokio::task::spawn_blocking(move || s.witness.forget_records(&gone)).await;
    }
    drop(tx);
    let _ = writer.await;
}

enum Answer {
    Now(Vec<u8>),
    Fault(u32),
    /// AsyncNotify: answered when the registration has news.
    Wait(Handle, Arc<Notify>, u32),
}

async fn run(
    server: &Arc<Server>,
    association: u64,
    (local, peer): (IpAddr, IpAddr),
    call: &Call,
) -> Answer {
    if call.interface == epmapper::INTERFACE {
        return map(server, local, call);
    }
    match call.opnum {
        opnum::GET_INTERFACE_LIST => {
            let s = server.clone();
            match tokio::task::spawn_blocking(move || interfaces(&s, local)).await {
                Ok(Ok(list)) => Answer::Now(witness::encode_interface_list(&list)),
                Ok(Err(e)) => {
                    tracing::warn!("witness: listing the interfaces: {e}");
                    Answer::Now(witness::encode_result(werror::NO_SYSTEM_RESOURCES, true))
                }
                Err(_) => Answer::Now(witness::encode_result(werror::NO_SYSTEM_RESOURCES, true)),
            }
        }
        opnum::REGISTER | opnum::REGISTER_EX => {
            let decoded = if call.opnum == opnum::REGISTER {
                witness::decode_register(&call.stub)
            } else {
                witness::decode_register_ex(&call.stub)
            };
            let Ok(req) = decoded else {
                return Answer::Fault(nimbus_rpc::fault::BAD_STUB_DATA);
            };
            let s = server.clone();
            let ex = call.opnum == opnum::REGISTER_EX;
            let r = tokio::task::spawn_blocking(move || {
                register(&s, association, local, peer, &req, ex)
            })
            .await
            .unwrap_or(Err(werror::NO_SYSTEM_RESOURCES));
            Answer::Now(match r {
                Ok(h) => witness::encode_register_answer(Some(&h), werror::OK),
                Err(e) => witness::encode_register_answer(None, e),
            })
        }
        opnum::UNREGISTER => {
            let Ok(h) = witness::decode_handle(&call.stub) else {
                return Answer::Fault(nimbus_rpc::fault::BAD_STUB_DATA);
            };
            let removed = {
                let mut regs = lock(&server.witness.registrations);
                match regs.get(&h) {
                    Some(r) if r.association == association => regs.remove(&h),
                    _ => None,
                }
            };
            let Some(r) = removed else {
                return Answer::Now(witness::encode_result(werror::NOT_FOUND, false));
            };
            r.wake.notify_waiters();
            let s = server.clone();
            let _ = tokio::task::spawn_blocking(move || s.witness.forget_records(&[h])).await;
            Answer::Now(witness::encode_result(werror::OK, false))
        }
        opnum::ASYNC_NOTIFY => {
            let Ok(h) = witness::decode_handle(&call.stub) else {
                return Answer::Fault(nimbus_rpc::fault::BAD_STUB_DATA);
            };
            let regs = lock(&server.witness.registrations);
            match regs.get(&h) {
                Some(r) if r.association == association => {
                    Answer::Wait(h, r.wake.clone(), r.timeout)
                }
                _ => Answer::Now(witness::encode_notify(Err(werror::NOT_FOUND))),
            }
        }
        _ => Answer::Fault(nimbus_rpc::fault::OP_RNG_ERROR),
    }
}

/// ept_map: the witness service's address, for a client that connected
/// to `local`: the listen address at that IP, or else the first.
fn map(server: &Server, local: IpAddr, call: &Call) -> Answer {
    if call.opnum != epmapper::OPNUM_MAP {
        return Answer::Fault(nimbus_rpc::fault::OP_RNG_ERROR);
    }
    let Ok(req) = epmapper::decode_map(&call.stub) else {
        return Answer::Fault(nimbus_rpc::fault::BAD_STUB_DATA);
    };
    let listen = server.config().witness_listen.clone();
    let at = (req.interface == witness::INTERFACE)
        .then(|| {
            listen
                .iter()
                .find(|a| a.ip() == local || a.ip().is_unspecified())
                .or(listen.first())
                .map(|a| {
                    if a.ip().is_unspecified() {
                        SocketAddr::new(local, a.port())
                    } else {
                        *a
                    }
                })
        })
        .flatten()
        .and_then(|a| match a {
            SocketAddr::V4(v4) => Some(v4),
            SocketAddr::V6(_) => None,
        });
    Answer::Now(epmapper::encode_map(&req, at))
}

/// MS-SWN 3.1.4.2 and 3.1.4.5: checks a registration and records it.
fn register(
    server: &Server,
    association: u64,
    local: IpAddr,
    client: IpAddr,
    req: &Register,
    ex: bool,
) -> Result<Handle, u32> {
    let version_ok = if ex {
        req.version == witness::VERSION_2
    } else {
        req.version == witness::VERSION_1
    };
    if !version_ok {
        return Err(werror::REVISION_MISMATCH);
    }
    let (Some(net_name), Some(ip), Some(client_name)) = (
        req.net_name.as_deref(),
        req.ip_address.as_deref(),
        req.client_computer_name.as_deref(),
    ) else {
        return Err(werror::INVALID_PARAMETER);
    };
    if !is_our_name(server, net_name) {
        return Err(werror::INVALID_PARAMETER);
    }
    if let Some(share) = req.share_name.as_deref() {
        let known = server
            .config()
            .shares
            .iter()
            .any(|s| s.name.eq_ignore_ascii_case(share));
        if !known {
            return Err(werror::INVALID_STATE);
        }
    }
    let addr: IpAddr = ip.parse().map_err(|_| werror::INVALID_STATE)?;
    let live = interfaces(server, local).map_err(|e| {
        tracing::warn!("witness: listing the interfaces: {e}");
        werror::NO_SYSTEM_RESOURCES
    })?;
    let Some(iface) = live.into_iter().find(|i| i.addr == addr) else {
        return Err(werror::INVALID_STATE);
    };
    let w = &server.witness;
    let held = lock(&w.registrations)
        .values()
        .filter(|r| r.association == association)
        .count();
    // Registrations of one association are made one at a time (its
    // connection waits for each answer), so the count cannot change
    // between this check and the insert below.
    if held >= MAX_REGISTRATIONS {
        return Err(werror::NO_SYSTEM_RESOURCES);
    }
    let (h, seq) = w.issue();
    let registration = Registration {
        seq,
        association,
        client,
        node: iface.group_name,
        addr,
        share: req.share_name.clone().filter(|_| ex),
        ip_notify: ex && req.flags & witness::REGISTER_IP_NOTIFICATION != 0,
        timeout: if ex { req.timeout } else { 0 },
        pending: Vec::new(),
        gone: false,
        wake: Arc::new(Notify::new()),
    };
    // Kept in etcd before the client hears of it, outside the lock (a
    // round trip).
    if !w.record(&h, &registration, client_name) {
        return Err(werror::NO_SYSTEM_RESOURCES);
    }
    lock(&w.registrations).insert(h, registration);
    // Its node may have gone since `interfaces` was read above.
    w.recheck.notify_one();
    Ok(h)
}

/// Waits until the registration has a notification (or goes, or its
/// timeout passes) and encodes the answer.
async fn notify_when(server: &Server, handle: Handle, wake: Arc<Notify>, timeout: u32) -> Vec<u8> {
    let deadline = (timeout > 0)
        .then(|| tokio::time::Instant::now() + Duration::from_secs(u64::from(timeout)));
    loop {
        // Registered for a wake-up before looking, so that one sent in
        // between is not missed (`notify_waiters` keeps no permit).
        let woken = wake.notified();
        tokio::pin!(woken);
        woken.as_mut().enable();
        {
            let mut regs = lock(&server.witness.registrations);
            let Some(r) = regs.get_mut(&handle) else {
                return witness::encode_notify(Err(werror::CALL_CANCELLED));
            };
            if !r.pending.is_empty() {
                let n = r.pending.remove(0);
                return witness::encode_notify(Ok(&n));
            }
        }
        match deadline {
            Some(d) => {
                if tokio::time::timeout_at(d, woken).await.is_err() {
                    return witness::encode_notify(Err(werror::TIMEOUT));
                }
            }
            None => woken.await,
        }
    }
}

/// How often a draining node looks whether its clients have gone.
const DRAIN_POLL: Duration = Duration::from_millis(200);

/// `nimbus drain` reached this node: new connections are closed, and once
/// its clients have gone (moved by their witness) or `within` passed, it
/// stops as at SIGTERM: durable handles handed back, the cluster left
/// (`Drain::request_stop`, which `nimbus serve` waits on).
pub fn drain(server: Arc<Server>, within: Duration) {
    if !server.drain.refuse_new() {
        return;
    }
    tracing::info!(
        "draining: new connections refused; stopping once this node's {} connection(s) have \
         gone, or in {}s",
        server.drain.live(),
        within.as_secs()
    );
    crate::oplocks::on_runtime(Box::new(move || {
        tokio::spawn(async move {
            let until = tokio::time::Instant::now() + within;
            while server.drain.live() > 0 && tokio::time::Instant::now() < until {
                tokio::time::sleep(DRAIN_POLL).await;
            }
            tracing::info!(
                "draining: {} connection(s) left; stopping",
                server.drain.live()
            );
            server.drain.request_stop();
        });
    }));
}
