//! CREATE, stage 3: the file's share modes and other clients' caching,
//! before the file is touched (MS-SMB2 3.3.5.9, MS-FSA 2.1.5.1.2). The
//! CREATE may wait here for other clients' breaks.

use nimbus_state::caching::{OpenAsk, Want};
use nimbus_state::{AttributeOpen, FileKey, OpenRecord, SharingError};
use nimbus_wire::fscc::access;
use nimbus_wire::NtStatus;

use super::super::create_durable::{self, DurableAsk};
use super::super::create_stream::BaseEntry;
use super::found::Found;
use super::request::Create;
use super::{undo, Failed};
use crate::ctx::Ctx;
use crate::errors::sharing_status;
use crate::server::Server;

/// Access that writes the file's data: an open granted any of it keeps its
/// lease to itself (a write breaks every other holder's read caching).
const WRITES: u32 = access::FILE_WRITE_DATA
    | access::FILE_APPEND_DATA
    | access::GENERIC_WRITE
    | access::GENERIC_ALL
    | access::MAXIMUM_ALLOWED;

/// A CREATE let on to open its file.
pub struct Admitted<'s> {
    /// The open's persistent FileId.
    pub open_id: u64,
    pub record: OpenRecord,
    /// The file's, when it existed.
    pub existing_key: Option<FileKey>,
    pub ask: OpenAsk,
    /// The file whose share modes hold the open already (checked before
    /// the open), if any.
    pub registered: Option<FileKey>,
    /// Whether the open's caching entry was written with its share modes
    /// (`Oplocks::contend_opening`): its admit then writes nothing more.
    pub counted: bool,
    /// Whether the open is among its file's share modes at all (an
    /// attribute-only open on a cluster may not be).
    pub recorded: bool,
    /// A stream's open is also one of its file's.
    pub base_entry: Option<BaseEntry<'s>>,
    pub app_instance: Option<[u8; 16]>,
    /// The group whose lease the open's lease is granted through
    /// (`Oplocks::admit_member`), if any.
    pub group_lease: Option<u64>,
}

/// Checks `c`'s sharing against the file's other opens and contends for
/// caching (`Failed::Waits` when the CREATE waits for breaks). `server`
/// is `ctx.server`, for what the admission keeps.
pub fn contend<'s>(
    ctx: &mut Ctx<'_>,
    server: &'s Server,
    c: &'s Create<'_>,
    f: &Found,
    body: &[u8],
    first: bool,
) -> Result<Admitted<'s>, Failed> {
    let (share, path, req) = (c.share, &c.path, &c.req);
    let (truncating, delete_on_close, durable, replay_key) =
        (c.truncating, c.delete_on_close, c.durable, c.replay_key);
    let (base, existing, creating, is_dir, want, granted) = (
        &f.base,
        &f.existing,
        f.creating,
        f.is_dir,
        f.want,
        f.granted,
    );
    let open_id = ctx.server.new_open_id();
    let record = OpenRecord {
        open_id,
        access: granted,
        share_access: req.share_access & 0x7,
    };
    let existing_key = existing.as_ref().map(|st| FileKey {
        dev: st.dev,
        ino: st.ino,
        gen: st.gen,
    });
    if let Want::Lease { id, .. } = want {
        // MS-SMB2 3.3.5.9.8: a lease key names one file.
        if !ctx.server.oplocks.lease_fits(id, existing_key) {
            return Err(NtStatus::INVALID_PARAMETER.into());
        }
    }
    let mut ask = OpenAsk {
        open_id,
        // Creating or overwriting writes the file, whatever was asked for:
        // such an open is never an attribute-only one to oplocks.
        access: if creating || truncating {
            granted | access::FILE_WRITE_DATA
        } else {
            granted
        },
        overwrite: truncating,
        sharing_violation: false,
        is_dir,
        has_byte_range_locks: false,
        want,
    };
    // Check sharing before touching an existing file, so an overwrite never
    // truncates a file another client holds without write sharing. Other
    // clients' oplocks and leases are broken first where the open needs it
    // (their cached writes flushed, their cached handles closed), and the
    // CREATE waits for their acknowledgements.
    let mut registered = None;
    // Whether the open's caching entry was written with its share modes
    // (`Oplocks::contend_opening`): its admit then writes nothing more.
    let mut counted = false;
    let mut group_lease = None;
    // A stream's open is also one of its file's (create_stream::BaseEntry).
    let base_entry = match &base {
        Some(b) => Some(BaseEntry::add(
            server,
            share,
            path,
            b,
            open_id,
            req.share_access,
        )?),
        None => None,
    };
    let app_instance = create_durable::app_instance(req, &durable);
    if let (Some(key), Some(id)) = (existing_key, app_instance) {
        create_durable::close_app_instance(ctx, key, id);
    }
    // An open of an existing file for attributes only, with no lease and
    // no durability: it conflicts with no open and caches nothing, so a
    // cluster node that does not hold the file's record lets it go on
    // without one (only delete-pending can refuse it).
    let attribute_only = base.is_none()
        && !creating
        && !truncating
        && !delete_on_close
        && nimbus_state::caching::stat_open(ask.access)
        && !matches!(want, Want::Lease { .. })
        && matches!(durable, DurableAsk::None);
    let recorded = match existing_key {
        Some(key) if attribute_only => {
            ctx.server
                .share_modes
                .attribute_open(key)
                .map_err(|e| sharing_status(&e))?
                == AttributeOpen::Record
        }
        _ => true,
    };
    // With `[cluster] group_leases`, a read or read-handle lease of an open
    // that reads (no writes: its own write would break its group's lease)
    // is granted through the node's group (`Oplocks::admit_member`).
    let lease_by_group = ctx.server.cluster.is_some()
        && matches!(want, Want::Lease { .. })
        && granted & WRITES == 0
        && existing_key.is_some_and(|k| ctx.server.oplocks.lease_groupable(k, &ask));
    // On a cluster, this node's alike opens of a file share one entry in
    // its records (nimbus_state::grouped_opens): where the file's records
    // are in etcd, an open that joins a recorded group reads them and
    // writes nothing, and a member's close that leaves others writes
    // nothing. Only an open nothing else follows by its id (or whose
    // lease its group holds for it) may join.
    let grouped = ctx.server.cluster.is_some()
        && existing_key.is_some()
        && recorded
        && !attribute_only
        && base.is_none()
        && !is_dir
        && !creating
        && !truncating
        && !delete_on_close
        && granted & access::DELETE == 0
        && (matches!(want, Want::Nothing) || lease_by_group)
        && matches!(durable, DurableAsk::None)
        && app_instance.is_none()
        && replay_key.is_none()
        // A kind that conflicts with itself (reading without sharing
        // reading, say) would refuse its second member: nothing to gain,
        // and a client reopening after a lost connection must wait for its
        // old open's own entry to go (`crate::leaving`).
        && nimbus_state::share_modes::compatible(&record, record.access, record.share_access);
    if let Some(key) = existing_key.filter(|_| recorded) {
        // The entry this open is recorded under, and its caching ask: its
        // group's where it joined one.
        let entry = match grouped {
            true => {
                let client = crate::teardowns::id(&**ctx.conn) as u64;
                ctx.server.share_modes.join_group(key, record, client)
            }
            false => record,
        };
        if grouped && lease_by_group {
            group_lease = Some(entry.open_id);
        }
        // A group's lease is asked for under the group's own lease key.
        let entry_ask = group_lease
            .and_then(|group| ctx.server.oplocks.group_lease_ask(key, group, &ask))
            .unwrap_or(OpenAsk {
                open_id: entry.open_id,
                ..ask
            });
        // A grouped CREATE that does not go on leaves its group, once; the
        // group's entry goes with its last member (`undo::abandon`).
        let in_group = std::cell::Cell::new(grouped);
        let leave_group = |ctx: &Ctx<'_>| {
            if in_group.replace(false) {
                undo::abandon(ctx, share, path, is_dir, key, open_id);
            }
        };
        // Share modes and caching in one write where they would be two
        // etcd transactions (a file cluster nodes share), else one by one.
        let together =
            ctx.server
                .oplocks
                .contend_opening(key, &entry_ask, &ctx.server.share_modes, entry);
        let added = match together {
            Some(r) => r.map(Some),
            None => ctx.server.share_modes.add_open(key, entry).map(|()| None),
        };
        if added.is_err() {
            // Refused: out of its group before it waits for anything, so
            // that the group's entry goes with its other members alone.
            leave_group(ctx);
        }
        let contended = match added {
            Ok(contended) => contended,
            // A persistent open waits for its client to reclaim it after a
            // restart or a lost connection: it is not taken from it
            // (MS-SMB2 3.3.5.9: STATUS_FILE_NOT_AVAILABLE).
            Err(SharingError::Violation)
                if ctx.server.durables.persistent_waits(key)
                    || crate::failover::waits_for_reclaim(ctx.server, key) =>
            {
                return Err(NtStatus::FILE_NOT_AVAILABLE.into())
            }
            // Refused perhaps by opens of clients that have gone, still
            // being released (`crate::teardowns`): once they are, look
            // again from the name (the file may be gone with them).
            Err(SharingError::Violation | SharingError::DeletePending)
                if first
                    && crate::leaving::waited_for_leaving(
                        ctx.server,
                        key,
                        ctx.conn,
                        crate::teardowns::WAIT,
                    ) =>
            {
                return Err(Failed::Raced)
            }
            Err(SharingError::Violation) => {
                ask.sharing_violation = true;
                None
            }
            Err(e) => return Err(sharing_status(&e).into()),
        };
        let contention = match contended {
            Some(c) => {
                // Counted among the file's caching opens in the same write
                // (unless it waits).
                counted = !c.wait;
                c
            }
            None => {
                let c = ctx.server.oplocks.contend(
                    key,
                    &OpenAsk {
                        sharing_violation: ask.sharing_violation,
                        ..entry_ask
                    },
                );
                // A group is counted in the caching record by `contend`
                // already, under its id: the admit writes nothing more.
                counted = grouped && !c.wait && !ask.sharing_violation;
                c
            }
        };
        if contention.wait {
            if grouped {
                leave_group(ctx);
            } else if !ask.sharing_violation {
                undo::abandon(ctx, share, path, is_dir, key, open_id);
            }
            // The breaks went to disconnected durable opens, which closed
            // instead: nothing is left to wait for.
            if !ctx.server.oplocks.is_breaking(key) {
                return Err(Failed::Raced);
            }
            let status = super::super::deferred::defer(ctx, key, body, super::handle)
                .map_err(Failed::Status)?;
            // A replay of this CREATE while it waits is told to come back.
            if let (Some(k), Some(request)) =
                (replay_key, ctx.resumed.as_ref().or(ctx.interim.as_ref()))
            {
                ctx.server.durables.name_pending(k, request);
                request.mark_replayable();
            }
            return Err(Failed::Waits(status));
        }
        if ask.sharing_violation {
            leave_group(ctx);
            return Err(NtStatus::SHARING_VIOLATION.into());
        }
        registered = Some(key);
    }
    Ok(Admitted {
        open_id,
        record,
        existing_key,
        ask,
        registered,
        counted,
        recorded,
        base_entry,
        app_instance,
        group_lease,
    })
}
