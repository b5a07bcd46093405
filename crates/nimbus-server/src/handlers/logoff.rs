//! MS-SMB2 3.3.5.6 Receiving an SMB2 LOGOFF Request. The end of the
//! session itself, which disconnect and teardown share, is
//! `crate::session_end`.

use nimbus_wire::simple::{encode_empty, parse_empty};
use nimbus_wire::NtStatus;

use super::malformed;
use crate::ctx::{Ctx, HandlerResult};
use crate::session::SessionState;
use crate::sync::lock;

pub fn handle(ctx: &mut Ctx<'_>, body: &[u8], out: &mut Vec<u8>) -> HandlerResult {
    parse_empty(body).map_err(malformed)?;
    let session = ctx.session()?.clone();
    if let SessionState::Valid(auth) = &*lock(&session.state) {
        tracing::info!(
            "session logoff: user {}\\{} from {}",
            auth.domain,
            auth.user,
            ctx.conn.peer
        );
    }
    crate::session_end::end_everywhere(ctx.server, &session);
    encode_empty(out);
    Ok(NtStatus::SUCCESS)
}
