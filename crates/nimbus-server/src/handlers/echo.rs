//! MS-SMB2 3.3.5.20 Receiving an SMB2 ECHO Request.

use nimbus_wire::simple::{encode_empty, parse_empty};
use nimbus_wire::NtStatus;

use super::malformed;
use crate::ctx::{Ctx, HandlerResult};

pub fn handle(_ctx: &mut Ctx<'_>, body: &[u8], out: &mut Vec<u8>) -> HandlerResult {
    parse_empty(body).map_err(malformed)?;
    encode_empty(out);
    Ok(NtStatus::SUCCESS)
}
