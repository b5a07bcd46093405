//! The metrics that are counts of what the server holds now (sessions by
//! protection, handles waiting for their clients, memory), set from the server's
//! tables every `EVERY` rather than kept up to date at each change: a
//! scrape is seconds apart, and a count recomputed cannot drift.

use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::Duration;

use nimbus_crypto::SigningAlgorithm;

use crate::server::Server;
use crate::session::SessionState;
use crate::sync::lock;

/// How often the counts are taken.
pub const EVERY: Duration = Duration::from_secs(2);

/// Sets the counts every `EVERY` for as long as the server runs.
pub async fn refresh_forever(server: Weak<Server>) {
    loop {
        let Some(s) = server.upgrade() else { return };
        refresh(&s);
        drop(s);
        tokio::time::sleep(EVERY).await;
    }
}

fn refresh(server: &Arc<Server>) {
    let mut groups = HashMap::new();
    for s in server.sessions.all() {
        // The state's lock is let go before the trees' is taken.
        let (signing, whole, cipher) = match &*lock(&s.state) {
            SessionState::Valid(a) => (
                match a.signer {
                    Some(_) => signing_name(s.origin.signing_algorithm),
                    None => "none",
                },
                a.encrypt_data,
                a.cipher.as_ref().map(|c| c.algorithm().name()),
            ),
            SessionState::InProgress { .. } => continue,
        };
        let encrypts = whole || lock(&s.trees).values().any(|t| t.encrypt_data);
        let cipher = cipher.filter(|_| encrypts).unwrap_or("none");
        let dialect = crate::status_listing::dialect(s.origin.dialect);
        *groups.entry((dialect, signing, cipher)).or_insert(0) += 1;
    }
    crate::metrics::sessions(&groups);
    crate::metrics::handles_waiting(server.durables.disconnected_count());
    crate::metrics::memory(
        crate::memory_use::heap_in_use(),
        crate::memory_use::resident(),
    );
}

fn signing_name(a: SigningAlgorithm) -> &'static str {
    match a {
        SigningAlgorithm::HmacSha256 => "HMAC-SHA256",
        SigningAlgorithm::AesCmac => "AES-128-CMAC",
        SigningAlgorithm::AesGmac => "AES-128-GMAC",
    }
}
