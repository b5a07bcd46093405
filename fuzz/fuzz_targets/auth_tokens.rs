//! SPNEGO and NTLM token decoding in the logon exchange: a sequence of
//! attacker-chosen SESSION_SETUP security buffers (split at 0xFF 0x00
//! markers) is fed to one exchange, as a client would send them.
#![no_main]

use std::sync::{Arc, OnceLock, RwLock};

use libfuzzer_sys::fuzz_target;
use nimbus_auth::{AuthConfig, AuthStep, Authenticator, UserDb};
use nimbus_crypto::CryptoProvider;

fn authenticator() -> &'static Authenticator {
    static AUTH: OnceLock<Authenticator> = OnceLock::new();
    AUTH.get_or_init(|| {
        let provider = CryptoProvider::default_provider();
        let mut users = UserDb::new();
        users
            .add("fuzzuser", "fuzz-password", &provider)
            .expect("user");
        Authenticator::new(
            provider,
            Arc::new(RwLock::new(users)),
            AuthConfig {
                netbios_computer: "NIMBUS".into(),
                netbios_domain: "WORKGROUP".into(),
                dns_computer: "nimbus".into(),
                dns_domain: String::new(),
                allow_guest: true,
                aliases: Vec::new(),
            },
        )
    })
}

fuzz_target!(|data: &[u8]| {
    let mut exchange = authenticator().start();
    for token in data.split(|b| *b == 0xFF).take(4) {
        match exchange.step(token) {
            Ok(AuthStep::Continue(_)) => {}
            Ok(AuthStep::Complete(_)) | Err(_) => break,
        }
    }
});
