//! MS-SMB2 3.3.5.4 Receiving an SMB2 NEGOTIATE Request (and 3.3.5.3.1, the
//! SMB1 multi-protocol negotiate that upgrades to SMB2).

use std::sync::Arc;

use nimbus_crypto::{CipherAlgorithm, SigningAlgorithm};
use nimbus_wire::negotiate::{
    capabilities, context_type, id_list_context, parse_cipher_list, parse_id_list, security_mode,
    Dialect, NegotiateRequest, NegotiateResponse, PreauthIntegrity, DIALECT_WILDCARD, HASH_SHA512,
};
use nimbus_wire::NtStatus;

use super::malformed;
use crate::config::SigningPolicy;
use crate::connection::{Connection, Negotiated};
use crate::ctx::{Ctx, HandlerResult};
use crate::server::now_filetime;
use crate::sync::lock;

/// Signing algorithms offered to 3.1.1 clients, most preferred first: GMAC
/// is parallel and far faster than CMAC on AES-NI hardware.
const SIGNING_PREFERENCE: [SigningAlgorithm; 3] = [
    SigningAlgorithm::AesGmac,
    SigningAlgorithm::AesCmac,
    SigningAlgorithm::HmacSha256,
];

fn server_security_mode(conn: &Connection) -> u16 {
    match conn.server.config().signing {
        SigningPolicy::Required => security_mode::SIGNING_ENABLED | security_mode::SIGNING_REQUIRED,
        SigningPolicy::Auto => security_mode::SIGNING_ENABLED,
    }
}

fn max_io(conn: &Connection, dialect: Dialect) -> u32 {
    // 2.0.2 has no multi-credit requests, so 64 KiB is its limit.
    if dialect == Dialect::Smb202 {
        65536
    } else {
        conn.server.config().limits.max_io()
    }
}

fn response(conn: &Connection, dialect: u16, capabilities: u32, max: u32) -> NegotiateResponse {
    NegotiateResponse {
        security_mode: server_security_mode(conn),
        dialect,
        server_guid: conn.server.guid,
        capabilities,
        max_transact_size: max,
        max_read_size: max,
        max_write_size: max,
        system_time: now_filetime(),
        server_start_time: 0,
        security_buffer: conn.server.auth.negotiate_token(),
        contexts: Vec::new(),
    }
}

/// What this server can offer a client whatever the client asks (MS-SMB2
/// 3.3.1.5 globals): the inputs of `negotiated_capabilities` besides the
/// dialect and the request.
pub(crate) struct Offers {
    /// Some share is continuously available and there is a state store.
    pub persistent_handles: bool,
    /// IsMultiChannelCapable (the `multichannel` setting).
    pub multichannel: bool,
    /// AES-128-CCM is among the configured ciphers: the only cipher of 3.0
    /// and 3.0.2.
    pub aes128_ccm: bool,
}

/// MS-SMB2 3.3.5.4: the Capabilities of the NEGOTIATE response, which are
/// also Connection.ServerCapabilities: what the rest of the connection may
/// use. A capability that needs the client's support is answered only when
/// the request's Capabilities carry it; a client takes a bit it did not
/// ask for as a promise, and one that cannot keep its side fails (impacket
/// takes DIRECTORY_LEASING as its cue to track parent directory leases and
/// fails every CREATE).
///
/// - DFS: not set; DFS referrals are not served.
/// - LEASING (2.1 and 3.x): the server's alone ("if the server supports
///   leasing"); Windows and Samba set it whatever the client sent.
/// - LARGE_MTU (2.1 and 3.x): Connection.SupportsMultiCredit, which
///   depends on the transport (TCP), not on the client's Capabilities.
/// - MULTI_CHANNEL (3.x): "IsMultiChannelCapable is TRUE, and
///   SMB2_GLOBAL_CAP_MULTI_CHANNEL is set in the Capabilities field of the
///   request". A binding (MS-SMB2 3.3.5.5) and LOCK replay detection
///   (3.3.5.14) go by this connection's answer.
/// - PERSISTENT_HANDLES (3.x): "SMB2_GLOBAL_CAP_PERSISTENT_HANDLES is set
///   in the Capabilities field of the request, and the server supports
///   persistent handles"; a DH2Q asking for persistence is granted it only
///   on a connection that has the bit (3.3.5.9.10).
/// - DIRECTORY_LEASING (3.x): the server supports directory leases and the
///   request carries the bit, as Samba decides (4.22 and later); a
///   directory lease is granted only on a connection that has it.
/// - ENCRYPTION: 3.0 and 3.0.2 only, when AES-128-CCM is configured and the
///   request carries the bit. 3.1.1 agrees on a cipher by the
///   SMB2_ENCRYPTION_CAPABILITIES context and never sets this bit, even for
///   a client that sets it in its request.
/// - NOTIFICATIONS (3.1.1): not set; server-to-client notifications are
///   not sent.
pub(crate) fn negotiated_capabilities(dialect: Dialect, client: u32, offers: &Offers) -> u32 {
    let asked = |cap: u32| client & cap != 0;
    let mut caps = 0;
    if dialect != Dialect::Smb202 {
        caps |= capabilities::LARGE_MTU | capabilities::LEASING;
    }
    if dialect.is_smb3() {
        if asked(capabilities::DIRECTORY_LEASING) {
            caps |= capabilities::DIRECTORY_LEASING;
        }
        if offers.persistent_handles && asked(capabilities::PERSISTENT_HANDLES) {
            caps |= capabilities::PERSISTENT_HANDLES;
        }
        if offers.multichannel && asked(capabilities::MULTI_CHANNEL) {
            caps |= capabilities::MULTI_CHANNEL;
        }
    }
    if matches!(dialect, Dialect::Smb300 | Dialect::Smb302)
        && offers.aes128_ccm
        && asked(capabilities::ENCRYPTION)
    {
        caps |= capabilities::ENCRYPTION;
    }
    caps
}

pub fn handle(ctx: &mut Ctx<'_>, body: &[u8], out: &mut Vec<u8>) -> HandlerResult {
    if ctx.conn.negotiated().is_some() {
        // MS-SMB2 3.3.5.4: a second NEGOTIATE on a connection is a violation.
        tracing::warn!("{}: second NEGOTIATE; closing", ctx.conn.peer);
        ctx.disconnect = true;
        return Err(NtStatus::INVALID_PARAMETER);
    }
    let req = NegotiateRequest::parse(body).map_err(malformed)?;
    let dialect = Dialect::ALL
        .iter()
        .rev()
        .copied()
        .find(|d| req.dialects.contains(&(*d as u16)))
        .ok_or_else(|| {
            tracing::info!(
                "{}: no common dialect in {:x?}",
                ctx.conn.peer,
                req.dialects
            );
            NtStatus::NOT_SUPPORTED
        })?;
    let mut signing_algorithm = if dialect.is_smb3() {
        SigningAlgorithm::AesCmac
    } else {
        SigningAlgorithm::HmacSha256
    };
    let mut resp_contexts = Vec::new();
    let offers = Offers {
        persistent_handles: ctx.server.offers_persistent_handles(),
        multichannel: ctx.server.config().multichannel,
        aes128_ccm: ctx
            .server
            .config()
            .ciphers
            .contains(&CipherAlgorithm::Aes128Ccm),
    };
    let caps = negotiated_capabilities(dialect, req.capabilities, &offers);
    // 3.0 and 3.0.2 know one cipher, agreed by the capability alone.
    let mut cipher = (caps & capabilities::ENCRYPTION != 0).then_some(CipherAlgorithm::Aes128Ccm);
    if dialect == Dialect::Smb311 {
        let count = |t| req.contexts.iter().filter(|c| c.context_type == t).count();
        if count(context_type::PREAUTH_INTEGRITY_CAPABILITIES) != 1
            || count(context_type::ENCRYPTION_CAPABILITIES) > 1
            || count(context_type::SIGNING_CAPABILITIES) > 1
            || count(context_type::COMPRESSION_CAPABILITIES) > 1
        {
            return Err(NtStatus::INVALID_PARAMETER);
        }
        let mut salt = vec![0u8; 32];
        ctx.server.provider.fill_random(&mut salt);
        for c in &req.contexts {
            match c.context_type {
                context_type::PREAUTH_INTEGRITY_CAPABILITIES => {
                    let p = PreauthIntegrity::parse(&c.data).map_err(malformed)?;
                    if !p.hash_algorithms.contains(&HASH_SHA512) {
                        return Err(NtStatus::NO_PREAUTH_INTEGRITY_HASH_OVERLAP);
                    }
                    resp_contexts.push(
                        PreauthIntegrity {
                            hash_algorithms: vec![HASH_SHA512],
                            salt: salt.clone(),
                        }
                        .to_context(),
                    );
                }
                context_type::ENCRYPTION_CAPABILITIES => {
                    let offered = parse_cipher_list(&c.data).map_err(malformed)?;
                    // An empty list (which MS-SMB2 2.2.3.1.2 forbids, and
                    // which the Rust `smb` crate sends when it wants no
                    // encryption) offers nothing: answered as if the
                    // context were absent, with no context back. That
                    // client cannot decode a cipher id of 0, and Samba
                    // ignores the context of a client that does not set
                    // SMB2_GLOBAL_CAP_ENCRYPTION, as that one does not.
                    if offered.is_empty() {
                        continue;
                    }
                    // The server's order decides (MS-SMB2 3.3.5.4 lets the
                    // server pick any common cipher); id 0 means "none".
                    cipher = ctx
                        .server
                        .config()
                        .ciphers
                        .iter()
                        .copied()
                        .find(|a| offered.contains(&a.id()));
                    resp_contexts.push(id_list_context(
                        context_type::ENCRYPTION_CAPABILITIES,
                        &[cipher.map_or(0, CipherAlgorithm::id)],
                    ));
                }
                context_type::SIGNING_CAPABILITIES => {
                    let offered = parse_id_list(&c.data).map_err(malformed)?;
                    if let Some(alg) = SIGNING_PREFERENCE
                        .iter()
                        .find(|a| offered.contains(&a.id()))
                    {
                        signing_algorithm = *alg;
                        resp_contexts.push(id_list_context(
                            context_type::SIGNING_CAPABILITIES,
                            &[alg.id()],
                        ));
                    }
                }
                // Unknown contexts are ignored (MS-SMB2 3.3.5.4).
                _ => {}
            }
        }
        let mut p = lock(&ctx.conn.preauth);
        *p = ctx.server.provider.sha512(&[&[0u8; 64], ctx.msg]);
    }
    let max = max_io(ctx.conn, dialect);
    let mut resp = response(ctx.conn, dialect as u16, caps, max);
    resp.contexts = resp_contexts;
    resp.encode(out);
    *lock(&ctx.conn.negotiated) = Some(Arc::new(Negotiated {
        dialect,
        client_guid: req.client_guid,
        client_security_mode: req.security_mode,
        client_capabilities: req.capabilities,
        client_dialects: req.dialects,
        server_security_mode: resp.security_mode,
        server_capabilities: caps,
        signing_algorithm,
        cipher,
        max_io: max,
    }));
    tracing::debug!(
        "{}: negotiated {:?}, signing {:?}, cipher {:?}",
        ctx.conn.peer,
        dialect,
        signing_algorithm,
        cipher
    );
    Ok(NtStatus::SUCCESS)
}

/// Answers an SMB1 negotiate that offers SMB2: with the wildcard 0x02FF the
/// client follows up with a real SMB2 NEGOTIATE; with only "SMB 2.002" the
/// connection is settled on 2.0.2 now.
pub fn smb1_upgrade(conn: &Arc<Connection>, wildcard: bool, out: &mut Vec<u8>) -> NtStatus {
    let dialect = if wildcard {
        DIALECT_WILDCARD
    } else {
        Dialect::Smb202 as u16
    };
    let max = max_io(conn, Dialect::Smb202);
    response(conn, dialect, 0, max).encode(out);
    if !wildcard {
        *lock(&conn.negotiated) = Some(Arc::new(Negotiated {
            dialect: Dialect::Smb202,
            client_guid: [0; 16],
            client_security_mode: 0,
            client_capabilities: 0,
            client_dialects: vec![Dialect::Smb202 as u16],
            server_security_mode: server_security_mode(conn),
            server_capabilities: 0,
            signing_algorithm: SigningAlgorithm::HmacSha256,
            cipher: None,
            max_io: max,
        }));
    }
    NtStatus::SUCCESS
}

#[cfg(test)]
mod tests {
    use super::*;
    use capabilities::{
        DFS, DIRECTORY_LEASING, ENCRYPTION, LARGE_MTU, LEASING, MULTI_CHANNEL, PERSISTENT_HANDLES,
    };

    const EVERYTHING: Offers = Offers {
        persistent_handles: true,
        multichannel: true,
        aes128_ccm: true,
    };
    const NOTHING: Offers = Offers {
        persistent_handles: false,
        multichannel: false,
        aes128_ccm: false,
    };
    const SMB3: [Dialect; 3] = [Dialect::Smb300, Dialect::Smb302, Dialect::Smb311];
    /// Every capability bit a client can send (MS-SMB2 2.2.3), and the
    /// NOTIFICATIONS bit of 3.1.1.
    const ALL_CLIENT: u32 = DFS
        | LEASING
        | LARGE_MTU
        | MULTI_CHANNEL
        | PERSISTENT_HANDLES
        | DIRECTORY_LEASING
        | ENCRYPTION
        | 0x80;

    #[test]
    fn a_client_that_asks_for_nothing_gets_only_what_depends_on_the_server_alone() {
        assert_eq!(negotiated_capabilities(Dialect::Smb202, 0, &EVERYTHING), 0);
        for d in [
            Dialect::Smb210,
            Dialect::Smb300,
            Dialect::Smb302,
            Dialect::Smb311,
        ] {
            assert_eq!(
                negotiated_capabilities(d, 0, &EVERYTHING),
                LEASING | LARGE_MTU,
                "{d:?}"
            );
        }
    }

    #[test]
    fn each_capability_that_needs_the_client_is_answered_on_3x_when_asked() {
        for d in SMB3 {
            for cap in [DIRECTORY_LEASING, PERSISTENT_HANDLES, MULTI_CHANNEL] {
                assert_eq!(
                    negotiated_capabilities(d, cap, &EVERYTHING),
                    LEASING | LARGE_MTU | cap,
                    "{d:?} asking {cap:#x}"
                );
            }
        }
        for d in [Dialect::Smb300, Dialect::Smb302] {
            assert_eq!(
                negotiated_capabilities(d, ENCRYPTION, &EVERYTHING),
                LEASING | LARGE_MTU | ENCRYPTION,
                "{d:?}"
            );
        }
    }

    #[test]
    fn a_client_asking_for_everything_gets_what_its_dialect_and_the_server_allow() {
        let file_caps = LEASING | LARGE_MTU;
        let smb3_caps = file_caps | MULTI_CHANNEL | PERSISTENT_HANDLES | DIRECTORY_LEASING;
        assert_eq!(
            negotiated_capabilities(Dialect::Smb202, ALL_CLIENT, &EVERYTHING),
            0
        );
        assert_eq!(
            negotiated_capabilities(Dialect::Smb210, ALL_CLIENT, &EVERYTHING),
            file_caps
        );
        for d in [Dialect::Smb300, Dialect::Smb302] {
            assert_eq!(
                negotiated_capabilities(d, ALL_CLIENT, &EVERYTHING),
                smb3_caps | ENCRYPTION
            );
        }
        // 3.1.1 agrees on a cipher by negotiate context, never by this bit;
        // DFS and NOTIFICATIONS are never answered.
        assert_eq!(
            negotiated_capabilities(Dialect::Smb311, ALL_CLIENT, &EVERYTHING),
            smb3_caps
        );
    }

    #[test]
    fn what_the_server_does_not_offer_is_not_answered_even_when_asked() {
        for d in SMB3 {
            assert_eq!(
                negotiated_capabilities(d, ALL_CLIENT, &NOTHING),
                LEASING | LARGE_MTU | DIRECTORY_LEASING,
                "{d:?}"
            );
        }
    }

    #[test]
    fn impacket_asking_only_for_encryption_gets_no_directory_leasing() {
        // impacket 0.13 sends Capabilities = ENCRYPTION and nothing else.
        assert_eq!(
            negotiated_capabilities(Dialect::Smb300, ENCRYPTION, &EVERYTHING),
            LEASING | LARGE_MTU | ENCRYPTION
        );
        assert_eq!(
            negotiated_capabilities(Dialect::Smb311, ENCRYPTION, &EVERYTHING),
            LEASING | LARGE_MTU
        );
    }
}
