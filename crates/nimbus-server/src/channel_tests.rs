//! Session.ChannelList bookkeeping (MS-SMB2 3.3.7.1, 3.3.5.6): which
//! connection loss or logoff ends a session bound to two connections.

use std::net::SocketAddr;
use std::sync::Arc;

use nimbus_crypto::SigningAlgorithm;
use nimbus_wire::negotiate::Dialect;

use crate::connection::{ChannelEntry, Connection, Negotiated};
use crate::server::Server;
use crate::session::Session;
use crate::sync::lock;

fn server(name: &str) -> Arc<Server> {
    let dir = std::env::temp_dir().join(format!("nimbus-channels-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    crate::fuzz_api::server(&dir).expect("server")
}

fn connection(server: &Arc<Server>, port: u16) -> Arc<Connection> {
    let peer = SocketAddr::from(([127, 0, 0, 1], port));
    let slot = server
        .admission
        .admit(peer.ip(), &server.config().limits)
        .expect("admitted");
    Connection::new(
        server.clone(),
        Arc::new(crate::dispatch::Smb2),
        peer,
        peer,
        slot,
    )
}

/// A session made on `first` and bound to `second`.
fn bound_session(
    server: &Arc<Server>,
    first: &Arc<Connection>,
    second: &Arc<Connection>,
) -> Arc<Session> {
    let origin = Arc::new(Negotiated {
        dialect: Dialect::Smb311,
        client_guid: [7; 16],
        client_security_mode: 0,
        client_capabilities: 0,
        client_dialects: vec![Dialect::Smb311 as u16],
        server_security_mode: 0,
        server_capabilities: 0,
        signing_algorithm: SigningAlgorithm::AesGmac,
        cipher: None,
        max_io: 65536,
    });
    let exchange = server.auth.start_at(first.local.ip());
    let s = Arc::new(Session::new(42, exchange, [0; 64], origin, first));
    lock(&first.sessions).insert(s.id, ChannelEntry::first(s.clone()));
    server.sessions.register(&s);
    assert!(s.add_channel(second, 32));
    lock(&second.sessions).insert(s.id, ChannelEntry::first(s.clone()));
    s
}

#[test]
fn losing_one_channel_keeps_the_session_losing_both_ends_it() {
    let server = server("loss");
    let (a, b) = (connection(&server, 50001), connection(&server, 50002));
    let s = bound_session(&server, &a, &b);
    assert_eq!(s.channel_count(), 2);
    a.close();
    a.teardown();
    assert!(!s.has_ended());
    assert!(b.session(s.id).is_some(), "still on the other channel");
    assert!(server.sessions.find(s.id).is_some());
    assert_eq!(s.connections().len(), 1);
    b.close();
    b.teardown();
    assert!(s.has_ended());
    assert!(
        server.sessions.find(s.id).is_none(),
        "gone from the GlobalSessionTable"
    );
    assert!(
        !s.add_channel(&connection(&server, 50003), 32),
        "an ended session takes no channel"
    );
}

#[test]
fn logoff_on_one_channel_ends_the_session_on_all() {
    let server = server("logoff");
    let (a, b) = (connection(&server, 50011), connection(&server, 50012));
    let s = bound_session(&server, &a, &b);
    crate::session_end::end_everywhere(&server, &s);
    assert!(s.has_ended());
    assert!(a.session(s.id).is_none() && b.session(s.id).is_none());
    // A second end (the other connection's loss) changes nothing.
    b.teardown();
    assert!(server.sessions.find(s.id).is_none());
}

#[test]
fn the_channel_limit_counts_the_first_connection() {
    let server = server("limit");
    let (a, b) = (connection(&server, 50021), connection(&server, 50022));
    let s = bound_session(&server, &a, &b);
    assert!(!s.add_channel(&connection(&server, 50023), 2));
    assert!(s.add_channel(&connection(&server, 50024), 3));
}
