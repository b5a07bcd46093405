//! RPC's own logons (the witness's TCP port, a BIND with a logon on an
//! IPC$ pipe) pass the failed-logon back-off SMB's SESSION_SETUP passes
//! (`limits.max_failed_logons_per_user` and `_per_address`): the
//! `nimbus_rpc::LogonGate` of one connection.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Instant;

use nimbus_auth::AuthError;
use nimbus_rpc::LogonGate;

use crate::logon_guard::BackedOff;
use crate::server::Server;

pub struct ServerLogonGate {
    server: Arc<Server>,
    /// The client's address.
    peer: IpAddr,
}

impl ServerLogonGate {
    pub fn for_client(server: Arc<Server>, peer: IpAddr) -> Arc<dyn LogonGate> {
        Arc::new(ServerLogonGate { server, peer })
    }
}

impl LogonGate for ServerLogonGate {
    fn may_log_on(&self, user: &str) -> bool {
        let limits = &self.server.config().limits;
        let key = match self
            .server
            .logon_guard
            .check(user, self.peer, Instant::now(), limits)
        {
            Ok(()) => return true,
            Err(BackedOff::User { .. }) => "max_failed_logons_per_user",
            Err(BackedOff::Address { .. }) => "max_failed_logons_per_address",
        };
        if let Some(n) = crate::log_limit::occurred(key) {
            tracing::warn!(
                "rpc: logon of user {user:?} from {} refused: too many failed logons \
                 (limits.{key}){}",
                self.peer,
                crate::log_limit::times(n)
            );
        }
        false
    }

    fn failed(&self, user: &str, why: &AuthError) {
        let limits = &self.server.config().limits;
        self.server
            .logon_guard
            .failed(user, self.peer, Instant::now(), limits);
        if let Some(n) = crate::log_limit::occurred("rpc logon failure") {
            tracing::info!(
                "rpc: logon from {} refused: {why}{}",
                self.peer,
                crate::log_limit::times(n)
            );
        }
    }

    fn succeeded(&self, user: &str) {
        self.server.logon_guard.succeeded(user, self.peer);
    }
}
