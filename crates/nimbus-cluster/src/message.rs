//! What one node's message to another is, told by its first byte: every
//! kind a node sends through its peers' message boxes in etcd, decoded
//! into one enum so that the receiving node matches on it whole and a new
//! kind cannot be left unhandled. Each kind's layout lives with the
//! module that sends it; this one only tells them apart. A message that
//! does not decode is refused with the name of the kind it claimed to be.

use nimbus_state::caching::BreakOrder;
use nimbus_state::{FileKey, StateError};

use crate::app_instance_handover::{
    self, CloseAppInstance, APP_INSTANCE_CLOSED_V1, CLOSE_APP_INSTANCE_V2,
};
use crate::cluster_notify::{self, CHANGES_V1, DIR_DELETE_PENDING_V2};
use crate::group_revoke::{self, RevokeGroups, GROUPS_REVOKED_V1, REVOKE_GROUPS_V2};
use crate::lease_ack_handover::{self, AckLease, Found, ACK_LEASE_V1, LEASE_ACKED_V1};
use crate::let_go_handover::{
    self, Asked, LetGoAnswer, LET_GO_DONE_V1, LET_GO_REFUSED_V1, LET_GO_V4,
};
use crate::session_handover::{self, EndSession, END_SESSION_V1, SESSION_ENDED_V1};
use crate::witness_move::{
    self, Drain, ShareMove, WitnessDrain, WitnessMove, DRAIN_V1, WITNESS_DRAIN_V1, WITNESS_MOVE_V1,
    WITNESS_SHARE_MOVE_V1,
};

/// One message from another node.
#[derive(Debug)]
pub enum ClusterMessage<'a> {
    /// Changes for this node's change-notify watches, still encoded: the
    /// relay decodes them against what it knows of its registrations.
    Changes(&'a [u8]),
    /// A directory watched here may have been marked delete-pending.
    DirDeletePending(FileKey),
    /// Let go of an open whose client reconnects on the sending node.
    LetGo(Asked),
    /// The answer to this node's request to let go of an open.
    LetGoAnswered {
        answer: LetGoAnswer,
        open_id: u64,
        nonce: u64,
    },
    /// End a session of this node that a logon elsewhere names as its
    /// previous one.
    EndSession(EndSession),
    /// The answer to this node's request to end a session.
    SessionEnded { nonce: u64, ended: bool },
    /// Close an application instance's opens here.
    CloseAppInstance(CloseAppInstance),
    /// The answer to this node's request to close an application's opens.
    AppInstanceClosed { nonce: u64, closed: bool },
    /// A lease acknowledgement for a lease this node holds.
    AckLease(AckLease),
    /// The answer to this node's forwarded lease acknowledgement.
    LeaseAcked { nonce: u64, found: Found },
    /// Revoke this node's groups of alike opens of a file, which another
    /// node sets delete-pending.
    RevokeGroups(RevokeGroups),
    /// The answer to this node's request to revoke groups.
    GroupsRevoked { nonce: u64 },
    /// A break for an open of this node.
    Break { open_id: u64, order: BreakOrder },
    /// `nimbus witness move`: tell a witness client to move.
    WitnessMove(WitnessMove),
    /// `nimbus witness move --share`: tell a share's witness clients to
    /// move.
    ShareMove(ShareMove),
    /// `nimbus drain`: tell the witness clients of a draining node to move.
    WitnessDrain(WitnessDrain),
    /// `nimbus drain` of this node.
    Drain(Drain),
}

/// A message that did not decode: which kind it claimed to be, and what
/// was wrong where the decoder says (a break's).
#[derive(Debug)]
pub struct Malformed {
    pub kind: &'static str,
    pub why: Option<StateError>,
}

impl std::fmt::Display for Malformed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "a malformed {}", self.kind)?;
        match &self.why {
            Some(why) => write!(f, ": {why}"),
            None => Ok(()),
        }
    }
}

impl<'a> ClusterMessage<'a> {
    pub fn decode(msg: &'a [u8]) -> Result<ClusterMessage<'a>, Malformed> {
        use ClusterMessage as M;
        let Some(&tag) = msg.first() else {
            return Err(Malformed {
                kind: "message (empty)",
                why: None,
            });
        };
        let decoded = match tag {
            CHANGES_V1 => Some(M::Changes(msg)),
            DIR_DELETE_PENDING_V2 => {
                cluster_notify::decode_delete_pending(msg).map(M::DirDeletePending)
            }
            LET_GO_V4 => let_go_handover::decode_let_go(msg).map(M::LetGo),
            LET_GO_REFUSED_V1 | LET_GO_DONE_V1 => {
                let_go_handover::decode_answer(msg).map(|(answer, open_id, nonce)| {
                    M::LetGoAnswered {
                        answer,
                        open_id,
                        nonce,
                    }
                })
            }
            END_SESSION_V1 => session_handover::decode_end_session(msg).map(M::EndSession),
            SESSION_ENDED_V1 => session_handover::decode_answer(msg)
                .map(|(nonce, ended)| M::SessionEnded { nonce, ended }),
            CLOSE_APP_INSTANCE_V2 => {
                app_instance_handover::decode_request(msg).map(M::CloseAppInstance)
            }
            APP_INSTANCE_CLOSED_V1 => app_instance_handover::decode_answer(msg)
                .map(|(nonce, closed)| M::AppInstanceClosed { nonce, closed }),
            ACK_LEASE_V1 => lease_ack_handover::decode_request(msg).map(M::AckLease),
            LEASE_ACKED_V1 => lease_ack_handover::decode_answer(msg)
                .map(|(nonce, found)| M::LeaseAcked { nonce, found }),
            REVOKE_GROUPS_V2 => group_revoke::decode_request(msg).map(M::RevokeGroups),
            GROUPS_REVOKED_V1 => {
                group_revoke::decode_answer(msg).map(|nonce| M::GroupsRevoked { nonce })
            }
            WITNESS_MOVE_V1 => witness_move::decode(msg).map(M::WitnessMove),
            WITNESS_DRAIN_V1 => witness_move::decode_drain(msg).map(M::WitnessDrain),
            WITNESS_SHARE_MOVE_V1 => witness_move::decode_share(msg).map(M::ShareMove),
            DRAIN_V1 => witness_move::decode_stop(msg).map(M::Drain),
            _ => {
                return nimbus_state::records::decode_break(msg)
                    .map(|(open_id, order)| M::Break { open_id, order })
                    .map_err(|why| Malformed {
                        kind: kind(tag),
                        why: Some(why),
                    })
            }
        };
        decoded.ok_or(Malformed {
            kind: kind(tag),
            why: None,
        })
    }
}

/// The kind a message's first byte names, for the log.
fn kind(tag: u8) -> &'static str {
    match tag {
        CHANGES_V1 => "list of notify changes",
        DIR_DELETE_PENDING_V2 => "delete-pending message",
        LET_GO_V4 => "request to let go of an open",
        LET_GO_REFUSED_V1 | LET_GO_DONE_V1 => "answer to a request to let go",
        END_SESSION_V1 => "request to end a session",
        SESSION_ENDED_V1 => "answer to a request to end a session",
        CLOSE_APP_INSTANCE_V2 => "request to close an application's opens",
        APP_INSTANCE_CLOSED_V1 => "answer about an application's opens",
        ACK_LEASE_V1 => "lease acknowledgement",
        LEASE_ACKED_V1 => "answer about a lease acknowledgement",
        REVOKE_GROUPS_V2 => "request to revoke groups of opens",
        GROUPS_REVOKED_V1 => "answer about revoked groups of opens",
        WITNESS_MOVE_V1 => "witness client move",
        WITNESS_DRAIN_V1 => "witness clients' move off a draining node",
        WITNESS_SHARE_MOVE_V1 => "witness share move",
        DRAIN_V1 => "drain",
        _ => "break (or a message of no known kind)",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use nimbus_services::durable_handle::Owner;
    use nimbus_state::caching::Holder;
    use nimbus_wire::notify::NotifyAction;

    /// Every kind of message, as its own module encodes it, with what it
    /// must decode to.
    fn every_kind() -> Vec<(Vec<u8>, &'static str)> {
        let key = FileKey::new(0x801, 42, 9);
        let change = crate::notify::Change {
            action: NotifyAction::Added,
            filter: 1,
            path: "dir\\new.txt",
        };
        let asked = Asked {
            req: let_go_handover::LetGo {
                open_id: 0x2a,
                create_guid: Some([7; 16]),
                owner: Owner {
                    sid: "S-1-5-21-1-2-3-1001".into(),
                    name: "alice".into(),
                },
            },
            reply_to: "n2".into(),
            nonce: 9,
        };
        let end = EndSession {
            session_id: 0x0000_0300_1234_0001,
            nonce: 9,
            reply_to: "n2".into(),
            user: "alice".into(),
            domain: "NIMBUS".into(),
        };
        let close = CloseAppInstance {
            nonce: 3,
            dev: 0x801,
            ino: 42,
            gen: 9,
            app_instance: [5; 16],
            client_guid: [6; 16],
            reply_to: "n2".into(),
            share: "data".into(),
            owner_sid: "S-1-5-21-1-2-3-1001".into(),
        };
        let ack = AckLease {
            nonce: 4,
            client_guid: [6; 16],
            lease_key: [8; 16],
            lease_state: 0x3,
            reply_to: "n2".into(),
        };
        let order = BreakOrder {
            holder: Holder::Oplock(0x2a),
            from: 0x0b,
            to: 0x01,
            ack_required: true,
            epoch: 0,
            version: 0,
        };
        vec![
            (
                cluster_notify::encode_changes("data", &[&change]),
                "Changes",
            ),
            (
                cluster_notify::encode_delete_pending(key),
                "DirDeletePending",
            ),
            (let_go_handover::encode_let_go(&asked), "LetGo"),
            (
                let_go_handover::encode_answer(LetGoAnswer::Refused, 0x2a, 9),
                "LetGoAnswered Refused",
            ),
            (
                let_go_handover::encode_answer(LetGoAnswer::Done, 0x2a, 9),
                "LetGoAnswered Done",
            ),
            (session_handover::encode_end_session(&end), "EndSession"),
            (session_handover::encode_answer(9, true), "SessionEnded"),
            (
                app_instance_handover::encode_request(&close),
                "CloseAppInstance",
            ),
            (
                app_instance_handover::encode_answer(3, false),
                "AppInstanceClosed",
            ),
            (lease_ack_handover::encode_request(&ack), "AckLease"),
            (
                lease_ack_handover::encode_answer(4, Found::Refused),
                "LeaseAcked",
            ),
            (
                group_revoke::encode_request(&RevokeGroups {
                    nonce: 6,
                    file: key,
                    reply_to: "n2".into(),
                }),
                "RevokeGroups",
            ),
            (group_revoke::encode_answer(6), "GroupsRevoked"),
            (nimbus_state::records::encode_break(0x2a, &order), "Break"),
            (
                witness_move::encode(&WitnessMove {
                    client: "192.0.2.7".parse().unwrap(),
                    to: vec!["127.0.0.3".parse().unwrap()],
                    sent: 1,
                }),
                "WitnessMove",
            ),
            (
                witness_move::encode_share(&ShareMove {
                    share: "data".into(),
                    client: None,
                    to: vec!["127.0.0.3".parse().unwrap()],
                    sent: 1,
                }),
                "ShareMove",
            ),
            (
                witness_move::encode_drain(&WitnessDrain {
                    node: "n1".into(),
                    to: vec!["127.0.0.3".parse().unwrap()],
                    sent: 1,
                }),
                "WitnessDrain",
            ),
            (
                witness_move::encode_stop(&Drain {
                    incarnation: 3,
                    within_secs: 60,
                    sent: 1,
                }),
                "Drain",
            ),
        ]
    }

    /// What a decoded message is, in the names `every_kind` uses, with its
    /// fields checked against the samples there.
    fn name(msg: &ClusterMessage<'_>) -> &'static str {
        use ClusterMessage as M;
        match msg {
            M::Changes(_) => "Changes",
            M::DirDeletePending(key) if key.ino == 42 => "DirDeletePending",
            M::LetGo(a) if a.req.open_id == 0x2a && a.nonce == 9 => "LetGo",
            M::LetGoAnswered {
                answer: LetGoAnswer::Refused,
                open_id: 0x2a,
                nonce: 9,
            } => "LetGoAnswered Refused",
            M::LetGoAnswered {
                answer: LetGoAnswer::Done,
                open_id: 0x2a,
                nonce: 9,
            } => "LetGoAnswered Done",
            M::EndSession(e) if e.nonce == 9 => "EndSession",
            M::SessionEnded {
                nonce: 9,
                ended: true,
            } => "SessionEnded",
            M::CloseAppInstance(c) if c.nonce == 3 => "CloseAppInstance",
            M::AppInstanceClosed {
                nonce: 3,
                closed: false,
            } => "AppInstanceClosed",
            M::AckLease(a) if a.nonce == 4 => "AckLease",
            M::LeaseAcked {
                nonce: 4,
                found: Found::Refused,
            } => "LeaseAcked",
            M::RevokeGroups(r) if r.nonce == 6 && r.file.ino == 42 => "RevokeGroups",
            M::GroupsRevoked { nonce: 6 } => "GroupsRevoked",
            M::Break {
                open_id: 0x2a,
                order,
            } if order.to == 0x01 => "Break",
            M::WitnessMove(m) if m.to.len() == 1 => "WitnessMove",
            M::WitnessDrain(d) if d.node == "n1" => "WitnessDrain",
            M::ShareMove(m) if m.share == "data" => "ShareMove",
            M::Drain(d) if d.within_secs == 60 && d.incarnation == 3 => "Drain",
            _ => "a wrong decoding",
        }
    }

    #[test]
    fn each_kind_is_told_apart_by_its_first_byte() {
        for (msg, kind) in every_kind() {
            let decoded = ClusterMessage::decode(&msg).unwrap_or_else(|e| panic!("{kind}: {e}"));
            assert_eq!(name(&decoded), kind);
        }
    }

    #[test]
    fn a_message_cut_short_is_refused_whole() {
        for (msg, kind) in every_kind() {
            // A list of changes is decoded by the relay, which refuses it
            // there (cluster_notify's tests).
            if kind == "Changes" {
                continue;
            }
            for len in 1..msg.len() {
                assert!(
                    ClusterMessage::decode(&msg[..len]).is_err(),
                    "{kind} cut at {len}"
                );
            }
        }
    }

    #[test]
    fn a_message_that_does_not_decode_is_refused_with_its_kind() {
        assert_eq!(
            ClusterMessage::decode(&[]).unwrap_err().kind,
            "message (empty)"
        );
        let answer = let_go_handover::encode_answer(LetGoAnswer::Refused, 1, 2);
        assert_eq!(
            ClusterMessage::decode(&answer[..answer.len() - 1])
                .unwrap_err()
                .kind,
            "answer to a request to let go"
        );
        let unknown = ClusterMessage::decode(&[0xee, 1, 2]).unwrap_err();
        assert_eq!(unknown.kind, "break (or a message of no known kind)");
        assert!(unknown.why.is_some(), "the break decoder's reason is kept");
        assert_eq!(
            ClusterMessage::decode(&[SESSION_ENDED_V1])
                .unwrap_err()
                .to_string(),
            "a malformed answer to a request to end a session"
        );
    }
}
