//! Checks of single calls into the caching rules, against the file's
//! state before the call: the breaks a call sends, what an admitted open
//! is granted, what an acknowledgement is answered.

use nimbus_state::caching::{
    oplock_state, AckError, Acked, BreakOrder, FileCaching, Granted, Holder,
};
use nimbus_state::caching::{OpenAsk, Want, HANDLE, READ, WRITE};

use crate::states::{is_lease, only, subset, LEASE_STATES, STAT};

/// The breaks one call of the rules sent, against the state before it:
/// each names a holder once, lowers what it holds (to a state it may
/// hold), needs an acknowledgement exactly when it takes away write or
/// handle caching, and is recorded as under way or done; no other grant
/// changes what it holds or was sent.
pub fn breaks(before: &FileCaching, after: &FileCaching, orders: &[BreakOrder]) {
    for (i, o) in orders.iter().enumerate() {
        assert!(
            orders[..i].iter().all(|p| p.holder != o.holder),
            "two breaks for {:?} in one step: {orders:?}",
            o.holder
        );
        let g = before
            .grant(o.holder)
            .unwrap_or_else(|| panic!("break {o:?} for no grant of {before:?}"));
        assert!(
            g.breaking.is_none(),
            "break {o:?} sent while one awaits acknowledgement: {g:?}"
        );
        assert_eq!(o.from, g.state, "break {o:?} from a state not held: {g:?}");
        assert!(
            subset(o.to, o.from) && o.to != o.from,
            "break {o:?} does not lower the state"
        );
        if is_lease(o.holder) {
            assert!(
                LEASE_STATES.contains(&o.to),
                "break {o:?} to no lease state"
            );
        } else {
            assert!(o.to == 0 || o.to == READ, "oplock break {o:?} to no level");
        }
        assert_eq!(
            o.ack_required,
            o.from & (WRITE | HANDLE) != 0,
            "break {o:?}: acknowledgement needed exactly for write or handle caching"
        );
        assert_eq!(
            o.epoch,
            g.epoch.wrapping_add(1),
            "break {o:?}: epoch after {g:?}"
        );
        match after.grant(o.holder) {
            Some(a) if o.ack_required => {
                assert_eq!(a.state, o.from, "{o:?}: state before the ack");
                assert_eq!(a.breaking.map(|b| b.sent), Some(o.to), "{o:?}: under way");
            }
            Some(a) => {
                assert_eq!((a.state, a.breaking), (o.to, None), "{o:?}: done at once");
            }
            None => assert!(
                !is_lease(o.holder) && o.to == 0 && !o.ack_required,
                "{o:?}: grant gone"
            ),
        }
    }
    for g in &before.grants {
        if orders.iter().any(|o| o.holder == g.holder) {
            continue;
        }
        let a = after
            .grant(g.holder)
            .unwrap_or_else(|| panic!("{:?} vanished without a break", g.holder));
        assert_eq!(a.state, g.state, "{:?} changed without a break", g.holder);
        assert_eq!(
            a.breaking.map(|b| b.sent),
            g.breaking.map(|b| b.sent),
            "{:?}: break under way changed without a message",
            g.holder
        );
        if let (Some(x), Some(y)) = (g.breaking, a.breaking) {
            assert!(
                subset(y.required, x.required),
                "{:?}: required rose",
                g.holder
            );
        }
    }
}

/// What an admitted open got: never more than asked for a new grant,
/// never an oplock on a directory or for a stat open, the lease's state
/// as the file records it, and nothing else on the file changed.
pub fn granted(before: &FileCaching, after: &FileCaching, ask: &OpenAsk, granted: Granted) {
    assert!(
        after.opens.iter().any(|o| o.open_id == ask.open_id),
        "admitted open {} not among the file's opens",
        ask.open_id
    );
    let own = match (ask.want, granted) {
        (Want::Nothing, Granted::Oplock(level)) => {
            assert_eq!(level, 0, "an oplock nobody asked for");
            None
        }
        (Want::Oplock(asked), Granted::Oplock(level)) => {
            assert!([0, 1, 8, 9].contains(&level), "oplock level {level:#x}");
            if level != 0 {
                let g = after
                    .grant(Holder::Oplock(ask.open_id))
                    .expect("oplock granted without a grant");
                assert_eq!(g.state, oplock_state(level));
                assert_eq!(g.opens, vec![ask.open_id]);
                assert!(
                    subset(g.state, oplock_state(asked)),
                    "oplock {level:#x} for {asked:#x}"
                );
                assert!(!ask.is_dir, "oplock on a directory");
                assert!(!only(ask.access, STAT), "oplock for a stat open");
            }
            Some(Holder::Oplock(ask.open_id))
        }
        (
            Want::Lease {
                id, state: asked, ..
            },
            Granted::Lease {
                state, breaking, ..
            },
        ) => {
            let g = after
                .grant(Holder::Lease(id))
                .expect("lease granted without a grant");
            assert_eq!(
                (state, breaking),
                (g.state, g.breaking.is_some()),
                "answer and record differ"
            );
            assert!(g.opens.contains(&ask.open_id), "open not in its lease");
            match before.grant(Holder::Lease(id)) {
                None => assert!(subset(state, asked), "new lease {state:#x} for {asked:#x}"),
                Some(b) => assert!(subset(b.state, state), "an open lowered its own lease"),
            }
            Some(Holder::Lease(id))
        }
        (want, granted) => panic!("{granted:?} for {want:?}"),
    };
    for g in &before.grants {
        if Some(g.holder) != own {
            assert_eq!(
                after.grant(g.holder),
                Some(g),
                "an open changed another's grant"
            );
        }
    }
}

/// An acknowledgement with `asked` (as a state): refused without a break
/// or above what was sent; accepted otherwise, ending the break or
/// stepping it down further toward what it must end at.
pub fn ack(
    before: &FileCaching,
    after: &FileCaching,
    holder: Holder,
    asked: u32,
    result: &Result<Acked, AckError>,
) {
    let g = before.grant(holder);
    let Some(b) = g.and_then(|g| g.breaking) else {
        assert!(
            result.is_err(),
            "{holder:?} acknowledged with no break: {result:?}"
        );
        assert_eq!(before, after, "a refused acknowledgement changed the file");
        return;
    };
    if !subset(asked, b.sent) {
        assert_eq!(
            result,
            &Err(AckError::TooMuch),
            "{holder:?}: {asked:#x} above {b:?}"
        );
        assert_eq!(before, after, "a refused acknowledgement changed the file");
        return;
    }
    if is_lease(holder) && !LEASE_STATES.contains(&asked) {
        assert_eq!(
            result,
            &Err(AckError::NotALeaseState),
            "{holder:?}: {asked:#x}"
        );
        assert_eq!(before, after, "a refused acknowledgement changed the file");
        return;
    }
    let acked = result
        .as_ref()
        .unwrap_or_else(|e| panic!("{holder:?}: {asked:#x} within {b:?} refused: {e:?}"));
    let a = after.grant(holder);
    match acked.follow_up {
        None => {
            assert!(
                subset(asked, b.required),
                "{holder:?}: {asked:#x} kept more than {b:?}"
            );
            match a {
                Some(a) => assert_eq!((a.state, a.breaking), (asked, None)),
                None => assert!(!is_lease(holder) && asked == 0, "{holder:?} vanished"),
            }
        }
        Some(f) => {
            assert_eq!((f.holder, f.from), (holder, asked), "follow-up {f:?}");
            assert!(
                subset(f.to, f.from) && f.to != f.from,
                "follow-up {f:?} does not lower the state"
            );
            assert_eq!(f.ack_required, f.from & (WRITE | HANDLE) != 0, "{f:?}");
            match a {
                Some(a) if f.ack_required => {
                    assert_eq!(a.state, asked);
                    let under_way = a.breaking.map(|x| (x.sent, x.required));
                    assert_eq!(under_way, Some((f.to, b.required)));
                }
                Some(a) => assert_eq!((a.state, a.breaking), (f.to, None)),
                // An oplock at none is no grant.
                None => assert!(
                    !is_lease(holder) && f.to == 0 && !f.ack_required,
                    "{holder:?} vanished with follow-up {f:?}"
                ),
            }
        }
    }
}
