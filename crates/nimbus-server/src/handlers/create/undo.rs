//! CREATE: what a stage that fails after `contend` undoes.

use nimbus_state::grouped_opens::Leaving;
use nimbus_state::FileKey;
use nimbus_vfs::Identity;

use super::super::create_stream;
use super::found::Found;
use super::request::Create;
use crate::ctx::Ctx;

/// Takes the open `open_id` of `c` out of file `key`'s entries (and its
/// caching), as `f` found the file.
pub fn unregister(ctx: &Ctx<'_>, c: &Create<'_>, f: &Found, open_id: u64, key: FileKey) {
    ctx.server.oplocks.leave_member(open_id);
    // The entry to take out: the open's own, or its group's when it was
    // the group's last member (none while other members remain).
    let Some(entry) = ctx.server.share_modes.grouped().entry_to_leave(open_id) else {
        return;
    };
    match (&f.base, &f.stream_name) {
        (Some(b), Some(name)) => abandon_stream(ctx, b, name, key, entry),
        _ => abandon_entry(ctx, c.share, &c.path, f.is_dir, key, entry),
    }
    ctx.server.oplocks.forget(key, entry);
}

/// Takes a CREATE that did not go on out of the file's opens; if that left
/// a delete-pending file without opens, the file goes (as at a close).
/// An open that joined a group of alike opens (nimbus_state::
/// grouped_opens) leaves it: the group's entry goes with its last member,
/// from both the share modes and the caching record.
pub fn abandon(
    ctx: &Ctx<'_>,
    share: &crate::server::Share,
    path: &str,
    is_dir: bool,
    key: FileKey,
    open_id: u64,
) {
    ctx.server.oplocks.leave_member(open_id);
    match ctx.server.share_modes.grouped().leave(open_id) {
        Leaving::Alone => abandon_entry(ctx, share, path, is_dir, key, open_id),
        Leaving::Stays => {}
        Leaving::Last(entry) => {
            abandon_entry(ctx, share, path, is_dir, key, entry);
            ctx.server.oplocks.forget(key, entry);
        }
    }
}

/// `abandon` of the entry `entry` of the file's records.
fn abandon_entry(
    ctx: &Ctx<'_>,
    share: &crate::server::Share,
    path: &str,
    is_dir: bool,
    key: FileKey,
    entry: u64,
) {
    let _ = crate::release::leave_record(ctx.server, key, entry, || {
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
            let _ = streams.remove_if(name, Identity::new(key.dev, key.ino, key.gen));
        }
    });
}
