//! A socket-free door into the server for the fuzz targets in `fuzz/` and
//! for the regression tests of what they found: byte streams go into a
//! connection exactly as the reader task would pass them, responses come
//! back, and nothing needs a runtime. Not an API for anything else.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use nimbus_auth::UserDb;
use nimbus_crypto::{CipherAlgorithm, CryptoProvider, SigningAlgorithm};
use nimbus_wire::header::chain_offsets;
use nimbus_wire::nbss::frame_length;
use nimbus_wire::negotiate::Dialect;
use nimbus_wire::transform::TransformHeader;
use nimbus_wire::HEADER_SIZE;

/// Where an SMB2 header holds its SessionId (MS-SMB2 2.2.1.2).
const SESSION_ID: std::ops::Range<usize> = 40..48;
/// Headers of one compound message the harness looks at.
const MAX_CHAIN: usize = 64;

use crate::config::{Config, ShareConfig};
use crate::connection::Connection;
use crate::connection::Dispatch;
use crate::frames::response_allowance;
use crate::security::{session_signer, sign, verify, SessionCipher};
use crate::server::Server;

/// The user the fuzz server knows (NTLM needs a random challenge, so
/// recorded logons of this user fail; guest logons work).
pub const USER: &str = "fuzzuser";
pub const PASSWORD: &str = "fuzz-password";

/// A server over `dir/share` (created), with one user and guest access.
pub fn server(dir: &Path) -> Result<Arc<Server>, String> {
    let share = dir.join("share");
    std::fs::create_dir_all(&share).map_err(|e| e.to_string())?;
    let db_path = dir.join("users.db");
    let provider = CryptoProvider::default_provider();
    let mut db = UserDb::load_or_empty(&db_path).map_err(|e| e.to_string())?;
    db.add(USER, PASSWORD, &provider)
        .map_err(|e| e.to_string())?;
    db.save(&db_path).map_err(|e| e.to_string())?;
    let config = Config {
        listen: vec![SocketAddr::from(([127, 0, 0, 1], 0))],
        user_db: db_path,
        shares: vec![ShareConfig {
            guest_ok: true,
            ..ShareConfig::new("share", share)
        }],
        ..Config::default()
    };
    let server = Server::new(config).map_err(|e| e.to_string())?;
    server
        .predictable_file_ids
        .store(true, std::sync::atomic::Ordering::Relaxed);
    Ok(server)
}

/// One client connection without a socket.
pub struct Harness {
    conn: Arc<Connection>,
    /// Session ids the server assigned, in order; requests that name
    /// session 1..=8 are given the n-th of these, so that a recorded stream
    /// (whose ids were random) reaches the session it set up.
    sessions: Vec<u64>,
}

impl Harness {
    pub fn new(server: &Arc<Server>) -> Option<Harness> {
        let peer = SocketAddr::from(([127, 0, 0, 1], 50000));
        let slot = server
            .admission
            .admit(peer.ip(), &server.config().limits)
            .ok()?;
        Some(Harness {
            conn: Connection::new(
                server.clone(),
                Arc::new(crate::dispatch::Smb2),
                peer,
                peer,
                slot,
            ),
            sessions: Vec::new(),
        })
    }

    pub fn is_closed(&self) -> bool {
        self.conn.is_closing()
    }

    /// Feeds a byte stream: NBSS frames are cut as the reader task cuts
    /// them and processed in order. Stops where the connection would close
    /// (bad frame header, truncated frame, protocol violation). Returns the
    /// response frames.
    pub fn feed_stream(&mut self, mut bytes: &[u8]) -> Vec<Vec<u8>> {
        let limits = self.conn.server.config().limits.clone();
        let mut responses = Vec::new();
        while !self.is_closed() && bytes.len() >= 4 {
            let head = [bytes[0], bytes[1], bytes[2], bytes[3]];
            bytes = &bytes[4..];
            let len = match frame_length(head, limits.max_frame_bytes) {
                Ok(Some(len)) => len,
                Ok(None) => continue,
                Err(_) => break,
            };
            if bytes.len() < len {
                break;
            }
            let mut frame = bytes[..len].to_vec();
            bytes = &bytes[len..];
            if let Some(r) = self.feed_frame(&mut frame) {
                responses.push(r);
            }
        }
        responses
    }

    /// Processes one frame (without its NBSS header); returns the response
    /// frame (with its NBSS header), if any.
    pub fn feed_frame(&mut self, frame: &mut [u8]) -> Option<Vec<u8>> {
        self.map_session_ids(frame);
        let allowance = response_allowance(frame, &self.conn.server.config().limits);
        let out = crate::dispatch::Smb2.process_frame(&self.conn, frame, allowance, None, None)?;
        let resp = out.buf[out.start..].to_vec();
        self.conn.pool.give(out.buf);
        self.note_sessions(&resp);
        Some(resp)
    }

    fn map_session_ids(&self, frame: &mut [u8]) {
        let offsets: Vec<usize> = chain_offsets(frame, MAX_CHAIN).collect();
        for off in offsets {
            let range = off + SESSION_ID.start..off + SESSION_ID.end;
            let mut id = [0u8; 8];
            id.copy_from_slice(&frame[range.clone()]);
            let n = u64::from_le_bytes(id);
            if (1..=8).contains(&n) {
                if let Some(real) = self.sessions.get(n as usize - 1) {
                    frame[range].copy_from_slice(&real.to_le_bytes());
                }
            }
        }
    }

    fn note_sessions(&mut self, resp: &[u8]) {
        let msg = &resp[4.min(resp.len())..];
        for off in chain_offsets(msg, MAX_CHAIN) {
            let mut id = [0u8; 8];
            id.copy_from_slice(&msg[off + SESSION_ID.start..off + SESSION_ID.end]);
            let id = u64::from_le_bytes(id);
            if id != 0 && !self.sessions.contains(&id) && self.sessions.len() < 8 {
                self.sessions.push(id);
            }
        }
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        self.conn.teardown();
    }
}

/// The connection security layer on attacker-chosen bytes: TRANSFORM
/// parsing and decryption under a key the attacker does not know, signature
/// verification with every algorithm, and (as a property) that what is
/// sealed or signed opens or verifies again.
pub fn security_layer(data: &[u8]) {
    let provider = CryptoProvider::default_provider();
    let key = [0x5Au8; 16];
    let preauth = [0x11u8; 64];
    let selector = data.first().copied().unwrap_or(0);
    let alg = CipherAlgorithm::ALL[selector as usize % CipherAlgorithm::ALL.len()];
    let Ok(cipher) = SessionCipher::derive(&provider, Dialect::Smb311, alg, &key, &preauth) else {
        return;
    };
    let mut frame = data.to_vec();
    if let Ok(hdr) = TransformHeader::parse(&frame) {
        let _ = cipher.open(&hdr, &mut frame);
    }
    let sig_alg = [
        SigningAlgorithm::HmacSha256,
        SigningAlgorithm::AesCmac,
        SigningAlgorithm::AesGmac,
    ][(selector >> 2) as usize % 3];
    let dialect = if sig_alg == SigningAlgorithm::HmacSha256 {
        Dialect::Smb210
    } else {
        Dialect::Smb311
    };
    if let Ok(signer) = session_signer(&provider, dialect, sig_alg, &key, &preauth) {
        let mut msg = data.to_vec();
        let _ = verify(signer.as_ref(), &mut msg);
        if msg.len() >= HEADER_SIZE {
            sign(signer.as_ref(), &mut msg);
            assert!(
                verify(signer.as_ref(), &mut msg),
                "a signed message must verify"
            );
        }
    }
    // Sealing any payload gives a TRANSFORM header that parses back.
    let mut sealed = vec![0u8; nimbus_wire::transform::TRANSFORM_HEADER_SIZE];
    sealed.extend_from_slice(data);
    if cipher.seal(7, &mut sealed).is_ok() {
        let hdr = TransformHeader::parse(&sealed).expect("sealed header parses");
        assert_eq!(hdr.session_id, 7);
        assert_eq!(hdr.original_message_size as usize, data.len());
    }
}

/// A QUERY_DIRECTORY search pattern (names.rs) checked and matched against
/// one name: None if the pattern is refused (MS-FSA 2.1.5.6.3), else
/// whether the name matches. A pattern the server accepts is at most 255
/// UTF-16 code units and free of path separators.
pub fn search_pattern(pattern: &str, name: &str) -> Option<bool> {
    let compiled = nimbus_vfs::names::SearchPattern::parse(pattern).ok()?;
    assert!(pattern.encode_utf16().count() <= nimbus_vfs::names::MAX_COMPONENT_UTF16);
    assert!(!pattern.contains(['\\', '/']));
    Some(compiled.matches(name))
}

/// A CREATE name (names.rs) split into a share path and a stream: false
/// if refused. An accepted one has no component that leaves its directory,
/// holds a separator, or reaches the share's store of streams; a stream
/// name is never empty and holds no separator; every component has an 8.3
/// name (`dos_name`) that is one.
pub fn create_name(name: &str) -> bool {
    use nimbus_vfs::names::{dos_name, eq_ignore_case, is_8dot3, to_vfs_path_and_stream, Stream};
    let Ok((path, stream)) = to_vfs_path_and_stream(name) else {
        return false;
    };
    for (i, comp) in path.split('/').filter(|c| !c.is_empty()).enumerate() {
        assert!(comp != "." && comp != "..", "{name:?}");
        assert!(!comp.contains(['\\', '\0', ':']), "{name:?}");
        assert!(comp.len() <= 255, "{name:?}");
        assert!(
            i > 0 || !eq_ignore_case(comp, nimbus_vfs::STORE_DIR),
            "{name:?}"
        );
        let dos = dos_name(comp);
        assert!(is_8dot3(&dos) && dos.len() <= 12, "{comp:?} -> {dos:?}");
    }
    if let Stream::Named(s) = &stream {
        assert!(!s.is_empty() && !s.contains(['\\', '/', '\0']), "{name:?}");
    }
    true
}

/// A security descriptor as a client sends it (SET_INFO, the SD_BUFFER
/// create context): false if refused. One that parses must encode to bytes
/// that parse to the same descriptor, survive the store's encoding, and
/// go through the access check, the inheritance of a new file and
/// directory below it, and a SET_INFO merge, for a user and a guest,
/// without panicking; the access check never grants more than a file's
/// rights, nor a privilege.
pub fn security_descriptor(data: &[u8]) -> bool {
    use crate::acl::{assign, check, store, Token};
    use nimbus_auth::MachineSid;
    use nimbus_wire::security_descriptor::SecurityDescriptor;
    let Ok(sd) = SecurityDescriptor::parse(data) else {
        return false;
    };
    let again = SecurityDescriptor::parse(&sd.encode_all()).expect("an encoded descriptor parses");
    assert_eq!(again, sd);
    assert_eq!(store::decode(&store::encode(&sd), "fuzz"), sd);
    let machine = MachineSid([1, 2, 3]);
    for token in [Token::user(machine, 1000), Token::guest(machine)] {
        let rights = check::granted(&sd, &token);
        assert_eq!(rights & !check::ALL_RIGHTS, 0, "{rights:#x}");
        for is_dir in [false, true] {
            if let Ok(child) = assign::for_new_file(Some(&sd), None, &token, is_dir) {
                let _ = SecurityDescriptor::parse(&child.encode_all());
            }
            let _ = assign::for_new_file(None, Some(&sd), &token, is_dir);
        }
        for info in [0x1, 0x4, 0x7, 0xF] {
            let _ = assign::with_changes(&sd, &sd, info, &token);
        }
    }
    true
}

/// One RPC pipe of IPC$ fed attacker-chosen writes: the first byte picks
/// the service, then each write is a 2-byte length and that many bytes
/// (cut short at the end). After each write every answer is read in
/// pieces of a size the input chooses; each answer must be one whole PDU
/// whose header gives its length, and a pipe closed by a protocol error
/// must refuse every later write.
pub fn rpc_pipe(data: &[u8]) -> PipeRun {
    use nimbus_rpc::{Host, Pipe, Service, ShareEntry, ShareKind};
    let mut run = PipeRun::default();
    let Some((&first, mut rest)) = data.split_first() else {
        return run;
    };
    let share = |name: &str, kind| ShareEntry {
        name: name.into(),
        kind,
        comment: format!("{name} comment"),
        current_uses: 1,
        encrypt_data: false,
    };
    let host = Host {
        name: "NIMBUS".into(),
        workgroup: "WORKGROUP".into(),
        comment: "fuzz".into(),
        shares: vec![
            share("data", ShareKind::Disk),
            share("IPC$", ShareKind::Ipc),
        ],
        may_enumerate: first & 2 == 0,
    };
    let service = if first & 4 != 0 {
        Service::Lsarpc
    } else if first & 1 == 0 {
        Service::Srvsvc
    } else {
        Service::Wkssvc
    };
    // Half the inputs reach RPC's own logon on the pipe too.
    let mut pipe = if first & 8 != 0 {
        Pipe::with_security(
            service,
            fuzz_authenticator(),
            std::net::Ipv4Addr::LOCALHOST.into(),
            None,
        )
    } else {
        Pipe::new(service)
    };
    let mut closed = false;
    while rest.len() >= 2 {
        let n = (u16::from_le_bytes([rest[0], rest[1]]) as usize).min(rest.len() - 2);
        let chunk = &rest[2..2 + n];
        rest = &rest[2 + n..];
        let wrote = pipe.write(chunk, &host);
        assert!(!(closed && wrote.is_ok()), "a closed pipe took a write");
        closed |= wrote.is_err();
        run.closed = closed;
        let piece = 1 + (n % 97) * 64;
        let mut message = Vec::new();
        while let Some(r) = pipe.read(piece) {
            assert!(r.data.len() <= piece);
            message.extend_from_slice(&r.data);
            if r.more {
                continue;
            }
            assert!(
                message.len() >= nimbus_rpc::pdu::HEADER_LEN,
                "answer shorter than a header"
            );
            let frag = u16::from_le_bytes([message[8], message[9]]) as usize;
            assert_eq!(frag, message.len(), "frag_length disagrees with the answer");
            assert!(frag <= nimbus_rpc::pipe::MAX_FRAG as usize);
            run.answers.push(message[2]);
            message.clear();
        }
        assert!(message.is_empty(), "an answer was cut short");
    }
    run
}

/// An acceptor with no users: every logon fails, which is what fuzzed
/// tokens reach.
fn fuzz_authenticator() -> nimbus_auth::Authenticator {
    let provider = CryptoProvider::default_provider();
    let users = Arc::new(std::sync::RwLock::new(UserDb::new()));
    let config = nimbus_auth::AuthConfig {
        netbios_computer: "NIMBUS".into(),
        netbios_domain: "WORKGROUP".into(),
        dns_computer: String::new(),
        dns_domain: String::new(),
        allow_guest: false,
        aliases: Vec::new(),
    };
    nimbus_auth::Authenticator::new(provider, users, config)
}

/// DCE/RPC over TCP (the witness service's association, the `rpc_ip_tcp`
/// target): the first byte picks what the rest is.
/// - 0: PDUs, each a 2-byte little-endian length and its bytes, fed to an
///   association serving the witness (integrity required) and the
///   endpoint mapper; every answer must be one whole PDU, nothing comes
///   after the association closed, and each call that comes out has its
///   stub run through the decoders.
/// - 1: a stub for every witness decoder.
/// - 2: a stub for the endpoint mapper's decoder.
///
/// Returns the PDU type of each answer.
pub fn rpc_ip_tcp(data: &[u8]) -> Vec<u8> {
    use nimbus_rpc::ip_tcp::{Association, Served};
    use nimbus_rpc::{epmapper, witness};
    let decode_all = |stub: &[u8]| {
        let _ = witness::decode_register(stub);
        let _ = witness::decode_register_ex(stub);
        let _ = witness::decode_handle(stub);
        let _ = epmapper::decode_map(stub).map(|r| epmapper::encode_map(&r, None));
    };
    let mut answers = Vec::new();
    let Some((&mode, mut rest)) = data.split_first() else {
        return answers;
    };
    match mode {
        1 => decode_all(rest),
        2 => {
            if let Ok(r) = epmapper::decode_map(rest) {
                let at = std::net::SocketAddrV4::new(std::net::Ipv4Addr::LOCALHOST, 5445);
                let _ = epmapper::encode_map(&r, Some(at));
            }
        }
        _ => {
            let auth = fuzz_authenticator();
            let served = vec![
                Served {
                    syntax: witness::INTERFACE,
                    needs_integrity: true,
                },
                Served {
                    syntax: epmapper::INTERFACE,
                    needs_integrity: false,
                },
            ];
            let mut a = Association::new(served, auth, std::net::Ipv4Addr::LOCALHOST.into(), None);
            let mut closed = false;
            while rest.len() >= 2 && !closed {
                let n = (u16::from_le_bytes([rest[0], rest[1]]) as usize).min(rest.len() - 2);
                let pdu = rest[2..2 + n].to_vec();
                rest = &rest[2 + n..];
                let r = a.receive(pdu);
                let mut out = r.out;
                if let Some(call) = &r.call {
                    decode_all(&call.stub);
                    out.extend(a.respond(call, &call.stub));
                }
                for o in &out {
                    assert!(
                        o.len() >= nimbus_rpc::pdu::HEADER_LEN,
                        "answer shorter than a header"
                    );
                    let frag = u16::from_le_bytes([o[8], o[9]]) as usize;
                    assert_eq!(frag, o.len(), "frag_length disagrees with the answer");
                    answers.push(o[2]);
                }
                closed = r.close.is_some();
            }
        }
    }
    answers
}

/// What `rpc_pipe` saw: the PDU type of each answer, and whether the
/// pipe was closed by a protocol error.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct PipeRun {
    pub answers: Vec<u8>,
    pub closed: bool,
}

/// Every decoder of what a cluster node reads from etcd, on bytes anyone
/// with etcd access could have written (the `etcd_records` target): the
/// first byte picks the decoder, the rest is the value. Decoders refuse
/// or accept, never panic or allocate past the input; a record they
/// accept writes back to bytes that decode to the same record. Selector 4
/// also runs the whole message dispatch (`ClusterMessage::decode`), which
/// accepts every kind of message. Whether the selected decoder accepted
/// the input.
pub fn etcd_record(data: &[u8]) -> bool {
    use nimbus_state::caching::FileCaching;
    use nimbus_state::durable_record::DurableOpen;
    use nimbus_state::records::{decode_break, LockList, Record};
    use nimbus_state::FileRecord;

    /// A record that decodes writes back to one that decodes the same.
    fn round_trip<R: Record + PartialEq + std::fmt::Debug>(input: &[u8]) -> bool {
        let Ok(r) = R::decode(input) else {
            return false;
        };
        let again = R::decode(&r.encode()).expect("a record written decodes");
        assert_eq!(again, r, "a record changed through encode and decode");
        true
    }
    let Some((&which, input)) = data.split_first() else {
        return false;
    };
    match which % 16 {
        0 => round_trip::<FileRecord>(input),
        1 => round_trip::<FileCaching>(input),
        2 => round_trip::<LockList>(input),
        3 => round_trip::<DurableOpen>(input),
        4 => decode_break(input).is_ok() | crate::message::ClusterMessage::decode(input).is_ok(),
        5 => crate::let_go_handover::decode_let_go(input).is_some_and(|a| {
            let again =
                crate::let_go_handover::decode_let_go(&crate::let_go_handover::encode_let_go(&a));
            assert_eq!(again.as_ref(), Some(&a), "a let-go request changed");
            true
        }),
        6 => {
            crate::let_go_handover::decode_answer(input).is_some()
                | crate::witness_records::decode(input).is_some_and(|r| {
                    let again = crate::witness_records::decode(&crate::witness_records::encode(&r));
                    assert_eq!(again.as_ref(), Some(&r), "a witness registration changed");
                    true
                })
        }
        7 => {
            crate::cluster_notify::decode_changes(input).is_ok()
                | crate::cluster_notify::decode_delete_pending(input).is_some()
        }
        8 => serde_json::from_slice::<crate::status::NodeStatus>(input).is_ok(),
        9 => serde_json::from_slice::<crate::status_listing::Listing>(input).is_ok(),
        10 => crate::session_handover::decode_end_session(input).is_some_and(|r| {
            let again = crate::session_handover::decode_end_session(
                &crate::session_handover::encode_end_session(&r),
            );
            assert_eq!(
                again.as_ref(),
                Some(&r),
                "a request to end a session changed"
            );
            true
        }),
        11 => crate::session_handover::decode_answer(input).is_some(),
        12 => crate::app_instance_handover::decode_request(input).is_some_and(|r| {
            let again = crate::app_instance_handover::decode_request(
                &crate::app_instance_handover::encode_request(&r),
            );
            assert_eq!(
                again.as_ref(),
                Some(&r),
                "a request to close an application's opens changed"
            );
            true
        }),
        13 => crate::app_instance_handover::decode_answer(input).is_some(),
        14 => crate::lease_ack_handover::decode_request(input).is_some_and(|r| {
            let again = crate::lease_ack_handover::decode_request(
                &crate::lease_ack_handover::encode_request(&r),
            );
            assert_eq!(again.as_ref(), Some(&r), "a lease acknowledgement changed");
            true
        }),
        15 => crate::lease_ack_handover::decode_answer(input).is_some(),
        _ => unreachable!("which % 16"),
    }
}

/// Genuine values of every kind `etcd_record` decodes, each behind its
/// selector byte: where the replay test's truncations and bit flips start.
pub fn etcd_record_samples() -> Vec<Vec<u8>> {
    use nimbus_state::caching::{BreakOrder, FileCaching, Holder};
    use nimbus_state::durable_record::DurableOpen;
    use nimbus_state::records::{encode_break, LockList, Record};
    use nimbus_state::{FileRecord, LockRange, RangeLock};

    let open = DurableOpen {
        open_id: 0x0000_0300_0000_002a,
        share: "ca".into(),
        path: "dir/ledger.dat".into(),
        access: 0x0012_019f,
        owner_sid: "S-1-5-21-1-2-3-1001".into(),
        owner_name: "alice".into(),
        locks: vec![LockRange {
            offset: 10,
            length: 20,
            exclusive: true,
        }],
        // Both optional sections, so that truncations and flips reach them.
        file: nimbus_state::FileKey::new(0x803, 0x2a, 0x1234_5678_9abc_def0),
        renaming: Some(("dir/old.dat".into(), "dir/ledger.dat".into())),
        ..DurableOpen::default()
    };
    let held = RangeLock {
        owner: 0x2a,
        offset: 10,
        length: 20,
        exclusive: true,
    };
    let order = BreakOrder {
        holder: Holder::Oplock(0x2a),
        from: 0x0b,
        to: 0x01,
        ack_required: true,
        epoch: 0,
        version: 0,
    };
    let asked = crate::let_go_handover::Asked {
        req: crate::let_go_handover::LetGo {
            open_id: 0x2a,
            create_guid: Some([7; 16]),
            owner: crate::durable::Owner {
                sid: "S-1-5-21-1-2-3-1001".into(),
                name: "alice".into(),
            },
        },
        reply_to: "n2".into(),
        nonce: 9,
    };
    let change = crate::notify::Change {
        action: nimbus_wire::notify::NotifyAction::Added,
        filter: 1,
        path: "dir\\new.txt",
    };
    let status = serde_json::to_vec(&crate::status_listing::Listing::default()).unwrap_or_default();
    let end_session = crate::session_handover::EndSession {
        session_id: 0x0000_0300_1234_0001,
        nonce: 9,
        reply_to: "n2".into(),
        user: "alice".into(),
        domain: "NIMBUS".into(),
    };
    let close_app = crate::app_instance_handover::CloseAppInstance {
        nonce: 3,
        dev: 0x801,
        ino: 42,
        gen: 9,
        app_instance: [5; 16],
        client_guid: [6; 16],
        reply_to: "n2".into(),
        share: "data".into(),
        owner_sid: "S-1-5-21-1-2-3-1001".into(),
    };
    let ack = crate::lease_ack_handover::AckLease {
        nonce: 4,
        client_guid: [6; 16],
        lease_key: [8; 16],
        lease_state: 0x3,
        reply_to: "n2".into(),
    };
    let registration = crate::witness_records::WitnessRecord {
        client: std::net::IpAddr::from([192, 0, 2, 7]),
        client_name: "WS7".into(),
        node: "n1".into(),
        addr: std::net::IpAddr::from([127, 0, 0, 1]),
        share: Some("ca".into()),
        ip_notify: true,
        since: 1_790_000_000,
    };
    let values: [(u8, Vec<u8>); 16] = [
        (0, FileRecord::default().encode()),
        (1, FileCaching::default().encode()),
        (2, LockList(vec![held]).encode()),
        (3, open.encode()),
        (4, encode_break(0x2a, &order)),
        (5, crate::let_go_handover::encode_let_go(&asked)),
        (
            6,
            crate::let_go_handover::encode_answer(
                crate::let_go_handover::LetGoAnswer::Done,
                0x2a,
                9,
            ),
        ),
        (6, crate::witness_records::encode(&registration)),
        (7, crate::cluster_notify::encode_changes("data", &[&change])),
        (9, status),
        (
            10,
            crate::session_handover::encode_end_session(&end_session),
        ),
        (11, crate::session_handover::encode_answer(9, true)),
        (12, crate::app_instance_handover::encode_request(&close_app)),
        (13, crate::app_instance_handover::encode_answer(3, true)),
        (14, crate::lease_ack_handover::encode_request(&ack)),
        (
            15,
            crate::lease_ack_handover::encode_answer(4, crate::lease_ack_handover::Found::Acked),
        ),
    ];
    values
        .into_iter()
        .map(|(which, v)| [&[which][..], &v].concat())
        .collect()
}
