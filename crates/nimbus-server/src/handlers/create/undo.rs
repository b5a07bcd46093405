//! CREATE: what a stage that fails after `contend` undoes.

use nimbus_state::FileKey;

use super::super::create_stream;
use super::found::Found;
use super::request::Create;
use crate::ctx::Ctx;

/// Takes the open `open_id` of `c` out of file `key`'s entries (and its
/// caching), as `f` found the file.
pub fn unregister(ctx: &Ctx<'_>, c: &Create<'_>, f: &Found, open_id: u64, key: FileKey) {
    match (&f.base, &f.stream_name) {
        (Some(b), Some(name)) => abandon_stream(ctx, b, name, key, open_id),
        _ => abandon(ctx, c.share, &c.path, f.is_dir, key, open_id),
    }
    ctx.server.oplocks.forget(key, open_id);
}

/// Takes a CREATE that did not go on out of the file's opens; if that left
/// a delete-pending file without opens, the file goes (as at a close).
pub fn abandon(
    ctx: &Ctx<'_>,
    share: &crate::server::Share,
    path: &str,
    is_dir: bool,
    key: FileKey,
    open_id: u64,
) {
    let _ = crate::release::leave_record(ctx.server, key, open_id, || {
        crate::release::delete_abandoned(ctx.server, share, path, is_dir, key)
    });
}

/// `abandon` for a stream: its file's entry goes with the guard that holds
/// it; a delete-pending stream left without opens goes now.
fn abandon_stream(
    ctx: &Ctx<'_>,
    base: &create_stream::Base,
    name: &str,
    key: FileKey,
    open_id: u64,
) {
    let _ = crate::release::leave_record(ctx.server, key, open_id, || {
        if let Some(streams) = &base.streams {
            let _ = streams.remove_if(name, (key.dev, key.ino));
        }
    });
}
