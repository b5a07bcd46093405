//! Every request decoder of nimbus-wire fed every truncation of a valid
//! message: each prefix must be refused as truncated (never a panic, never
//! a shorter message taken for the whole), except the prefixes listed for
//! a decoder, which the layout genuinely allows.

use nimbus_wire::close::{CloseRequest, FlushRequest, FLAG_POSTQUERY_ATTRIB};
use nimbus_wire::create::{
    context_name, encode_create_contexts, parse_create_contexts, CreateContext, CreateRequest,
};
use nimbus_wire::fscc::{RenameInfo, SetBasicInfo};
use nimbus_wire::header::{flags, Command, Header, TRANSFORM_PROTOCOL_ID};
use nimbus_wire::info::{info_type, QueryInfoRequest, SetInfoRequest};
use nimbus_wire::ioctl::{ctl_code, IoctlRequest, ValidateNegotiateInfo, IOCTL_IS_FSCTL};
use nimbus_wire::lock::{lock_flags, LockElement, LockRequest};
use nimbus_wire::negotiate::{
    context_type, id_list_context, parse_id_list, NegotiateRequest, PreauthIntegrity,
};
use nimbus_wire::notify::{completion_filter, ChangeNotifyRequest, WATCH_TREE};
use nimbus_wire::oplock::{
    lease_flags, lease_state, oplock_level, BreakAck, LeaseBreakAck, LeaseBreakNotification,
    LeaseContext, OplockBreak, LEASE_BREAK_ACK_REQUIRED,
};
use nimbus_wire::query_directory::QueryDirectoryRequest;
use nimbus_wire::read::ReadRequest;
use nimbus_wire::session_setup::SessionSetupRequest;
use nimbus_wire::simple::parse_empty;
use nimbus_wire::transform::{TransformHeader, FLAG_ENCRYPTED, TRANSFORM_HEADER_SIZE};
use nimbus_wire::tree_connect::TreeConnectRequest;
use nimbus_wire::write::WriteRequest;
use nimbus_wire::{FileId, NtStatus, WireError, WireResult, HEADER_SIZE};

struct Case {
    /// What the message is, for failure messages.
    what: &'static str,
    /// The command whose request body this is (None: a header, or a
    /// structure inside a body).
    command: Option<Command>,
    /// A complete, valid message.
    message: Vec<u8>,
    decode: fn(&[u8]) -> WireResult<()>,
    /// Lengths shorter than the whole message that decode anyway.
    also_decodes: &'static [usize],
    /// Whether a prefix may be refused with an error other than
    /// `WireError::Truncated`.
    any_error: bool,
}

fn case(
    what: &'static str,
    command: Option<Command>,
    message: Vec<u8>,
    decode: fn(&[u8]) -> WireResult<()>,
) -> Case {
    Case {
        what,
        command,
        message,
        decode,
        also_decodes: &[],
        any_error: false,
    }
}

fn encoded(f: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
    let mut out = Vec::new();
    f(&mut out);
    out
}

const FILE_ID: FileId = FileId {
    persistent: 0x0102_0304_0506_0708,
    volatile: 0x1112_1314_1516_1718,
};

fn header(flags: u32) -> Vec<u8> {
    let mut slot = [0u8; HEADER_SIZE];
    Header {
        credit_charge: 1,
        status: NtStatus::SUCCESS,
        command: Command::Read as u16,
        credits: 1,
        flags,
        next_command: 0,
        message_id: 9,
        async_id: 0x77,
        tree_id: 3,
        reserved: 0xFEFF,
        session_id: 0x4000_0000_0001,
        signature: [0xAB; 16],
    }
    .write_into(&mut slot);
    slot.to_vec()
}

fn negotiate(dialects: &[u16]) -> Vec<u8> {
    let contexts = if dialects.contains(&0x0311) {
        vec![
            PreauthIntegrity {
                hash_algorithms: vec![1],
                salt: vec![0x5A; 32],
            }
            .to_context(),
            id_list_context(context_type::ENCRYPTION_CAPABILITIES, &[2, 1]),
            id_list_context(context_type::SIGNING_CAPABILITIES, &[2, 1, 0]),
        ]
    } else {
        Vec::new()
    };
    encoded(|out| {
        NegotiateRequest {
            security_mode: 1,
            capabilities: 0x7F,
            client_guid: [3; 16],
            dialects: dialects.to_vec(),
            contexts,
        }
        .encode(out)
    })
}

fn cases() -> Vec<Case> {
    let vni = encoded(|out| {
        ValidateNegotiateInfo {
            capabilities: 0x7F,
            guid: [4; 16],
            security_mode: 1,
            dialects: vec![0x0300, 0x0302],
        }
        .encode(out)
    });
    let ioctl = |ctl: u32, input: &[u8]| {
        encoded(|out| {
            IoctlRequest {
                ctl_code: ctl,
                file_id: FileId::RELATED,
                input,
                max_input_response: 0,
                max_output_response: 65536,
                flags: IOCTL_IS_FSCTL,
            }
            .encode(out)
        })
    };
    let empty = vec![0x04, 0x00, 0x00, 0x00];
    let mut transform = [0u8; TRANSFORM_HEADER_SIZE];
    TransformHeader {
        signature: [0xCD; 16],
        nonce: [7; 16],
        original_message_size: 0x68,
        flags: FLAG_ENCRYPTED,
        session_id: 0x4000_0000_0001,
    }
    .write_into(&mut transform);
    assert_eq!(transform[..4], TRANSFORM_PROTOCOL_ID);

    vec![
        case("SMB2 header, sync", None, header(0), |b| {
            Header::parse(b).map(drop)
        }),
        case(
            "SMB2 header, async",
            None,
            header(flags::ASYNC_COMMAND),
            |b| Header::parse(b).map(drop),
        ),
        case("TRANSFORM header", None, transform.to_vec(), |b| {
            TransformHeader::parse(b).map(drop)
        }),
        case(
            "NEGOTIATE, 3.1.1 with contexts",
            Some(Command::Negotiate),
            negotiate(&[0x0202, 0x0210, 0x0300, 0x0302, 0x0311]),
            |b| NegotiateRequest::parse(b).map(drop),
        ),
        case(
            "NEGOTIATE, 2.x and 3.0 only",
            Some(Command::Negotiate),
            negotiate(&[0x0202, 0x0210, 0x0300]),
            |b| NegotiateRequest::parse(b).map(drop),
        ),
        case(
            "SESSION_SETUP",
            Some(Command::SessionSetup),
            encoded(|out| {
                SessionSetupRequest {
                    flags: 0,
                    security_mode: 1,
                    capabilities: 1,
                    previous_session_id: 0,
                    security_buffer: &[0x60, 0x48, 0x06, 0x06, 0x2B],
                }
                .encode(out)
            }),
            |b| SessionSetupRequest::parse(b).map(drop),
        ),
        case("LOGOFF", Some(Command::Logoff), empty.clone(), parse_empty),
        case(
            "TREE_CONNECT",
            Some(Command::TreeConnect),
            encoded(|out| {
                TreeConnectRequest {
                    flags: 0,
                    path: r"\\127.0.0.1\share".into(),
                }
                .encode(out)
            }),
            |b| TreeConnectRequest::parse(b).map(drop),
        ),
        case(
            "TREE_DISCONNECT",
            Some(Command::TreeDisconnect),
            empty.clone(),
            parse_empty,
        ),
        case(
            "CREATE with create contexts",
            Some(Command::Create),
            encoded(|out| {
                CreateRequest {
                    requested_oplock_level: 0,
                    impersonation_level: 2,
                    desired_access: 0x0012_0089,
                    file_attributes: 0x80,
                    share_access: 7,
                    create_disposition: 1,
                    create_options: 0x40,
                    name: r"dir\file.txt".into(),
                    contexts: vec![
                        CreateContext {
                            name: context_name::QUERY_MAXIMAL_ACCESS.to_vec(),
                            data: vec![],
                        },
                        CreateContext {
                            name: context_name::ALLOCATION_SIZE.to_vec(),
                            data: 4096u64.to_le_bytes().to_vec(),
                        },
                    ],
                }
                .encode(out)
            }),
            |b| CreateRequest::parse(b).map(drop),
        ),
        case(
            "CLOSE",
            Some(Command::Close),
            encoded(|out| {
                CloseRequest {
                    flags: FLAG_POSTQUERY_ATTRIB,
                    file_id: FILE_ID,
                }
                .encode(out)
            }),
            |b| CloseRequest::parse(b).map(drop),
        ),
        case(
            "FLUSH",
            Some(Command::Flush),
            // MS-SMB2 2.2.17: StructureSize 24, Reserved1 (2), Reserved2
            // (4), FileId (16).
            hex(concat!(
                "1800",
                "0000",
                "00000000",
                "0807060504030201",
                "1817161514131211"
            )),
            |b| FlushRequest::parse(b).map(drop),
        ),
        case(
            "LOCK",
            Some(Command::Lock),
            encoded(|out| {
                LockRequest {
                    lock_sequence: 0x21,
                    file_id: FILE_ID,
                    locks: vec![
                        LockElement {
                            offset: 10,
                            length: 20,
                            flags: lock_flags::EXCLUSIVE_LOCK | lock_flags::FAIL_IMMEDIATELY,
                        },
                        LockElement {
                            offset: 40,
                            length: 0,
                            flags: lock_flags::SHARED_LOCK | lock_flags::FAIL_IMMEDIATELY,
                        },
                    ],
                }
                .encode(out)
            }),
            |b| LockRequest::parse(b).map(drop),
        ),
        case(
            "CHANGE_NOTIFY",
            Some(Command::ChangeNotify),
            encoded(|out| {
                ChangeNotifyRequest {
                    flags: WATCH_TREE,
                    output_buffer_length: 4096,
                    file_id: FILE_ID,
                    completion_filter: completion_filter::FILE_NAME | completion_filter::DIR_NAME,
                }
                .encode(out)
            }),
            |b| ChangeNotifyRequest::parse(b).map(drop),
        ),
        Case {
            // MS-SMB2 2.2.19: the fixed part is 48 bytes, then a Buffer of
            // which the client sends one byte and the server MUST ignore.
            also_decodes: &[48],
            ..case(
                "READ",
                Some(Command::Read),
                encoded(|out| {
                    ReadRequest {
                        flags: 0,
                        length: 65536,
                        offset: 4096,
                        file_id: FILE_ID,
                        minimum_count: 1,
                    }
                    .encode(out)
                }),
                |b| ReadRequest::parse(b).map(drop),
            )
        },
        case(
            "WRITE",
            Some(Command::Write),
            encoded(|out| {
                WriteRequest {
                    offset: 9,
                    file_id: FILE_ID,
                    flags: 0,
                    data: b"hello, world",
                }
                .encode(out)
            }),
            |b| WriteRequest::parse(b).map(drop),
        ),
        case(
            "IOCTL, VALIDATE_NEGOTIATE_INFO",
            Some(Command::Ioctl),
            ioctl(ctl_code::FSCTL_VALIDATE_NEGOTIATE_INFO, &vni),
            |b| IoctlRequest::parse(b).map(drop),
        ),
        case(
            "IOCTL without input, QUERY_NETWORK_INTERFACE_INFO",
            Some(Command::Ioctl),
            ioctl(ctl_code::FSCTL_QUERY_NETWORK_INTERFACE_INFO, &[]),
            |b| IoctlRequest::parse(b).map(drop),
        ),
        case(
            "OPLOCK_BREAK, oplock acknowledgment",
            Some(Command::OplockBreak),
            encoded(|out| {
                OplockBreak {
                    oplock_level: oplock_level::II,
                    file_id: FILE_ID,
                }
                .encode(out)
            }),
            |b| BreakAck::parse(b).map(drop),
        ),
        case(
            "OPLOCK_BREAK, lease acknowledgment",
            Some(Command::OplockBreak),
            encoded(|out| {
                LeaseBreakAck {
                    flags: 0,
                    lease_key: [6; 16],
                    lease_state: lease_state::READ | lease_state::HANDLE,
                    lease_duration: 0,
                }
                .encode(out)
            }),
            |b| BreakAck::parse(b).map(drop),
        ),
        case("CANCEL", Some(Command::Cancel), empty.clone(), parse_empty),
        case("ECHO", Some(Command::Echo), empty, parse_empty),
        case(
            "QUERY_DIRECTORY",
            Some(Command::QueryDirectory),
            encoded(|out| {
                QueryDirectoryRequest {
                    info_class: 0x25,
                    flags: 1,
                    file_index: 0,
                    file_id: FILE_ID,
                    pattern: "*.txt".into(),
                    output_buffer_length: 65536,
                }
                .encode(out)
            }),
            |b| QueryDirectoryRequest::parse(b).map(drop),
        ),
        case(
            "QUERY_INFO with an input buffer",
            Some(Command::QueryInfo),
            encoded(|out| {
                QueryInfoRequest {
                    info_type: info_type::QUOTA,
                    info_class: 0,
                    output_buffer_length: 4096,
                    input: &[1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
                    additional_information: 0,
                    flags: 0,
                    file_id: FILE_ID,
                }
                .encode(out)
            }),
            |b| QueryInfoRequest::parse(b).map(drop),
        ),
        case(
            "QUERY_INFO without input",
            Some(Command::QueryInfo),
            encoded(|out| {
                QueryInfoRequest {
                    info_type: info_type::FILE,
                    info_class: 18,
                    output_buffer_length: 4096,
                    input: &[],
                    additional_information: 0,
                    flags: 0,
                    file_id: FILE_ID,
                }
                .encode(out)
            }),
            |b| QueryInfoRequest::parse(b).map(drop),
        ),
        case(
            "SET_INFO",
            Some(Command::SetInfo),
            encoded(|out| {
                SetInfoRequest {
                    info_type: info_type::FILE,
                    info_class: 20,
                    buffer: &5u64.to_le_bytes(),
                    additional_information: 0,
                    file_id: FILE_ID,
                }
                .encode(out)
            }),
            |b| SetInfoRequest::parse(b).map(drop),
        ),
        // Structures inside request bodies.
        case("VALIDATE_NEGOTIATE_INFO", None, vni, |b| {
            ValidateNegotiateInfo::parse(b).map(drop)
        }),
        case(
            "SMB2_PREAUTH_INTEGRITY_CAPABILITIES",
            None,
            PreauthIntegrity {
                hash_algorithms: vec![1],
                salt: vec![9; 32],
            }
            .to_context()
            .data,
            |b| PreauthIntegrity::parse(b).map(drop),
        ),
        case(
            "SMB2_SIGNING_CAPABILITIES",
            None,
            id_list_context(context_type::SIGNING_CAPABILITIES, &[2, 1, 0]).data,
            |b| parse_id_list(b).map(drop),
        ),
        Case {
            // Names and data are checked against the chain's length, so a
            // cut one is refused as out of bounds.
            any_error: true,
            ..case(
                "SMB2_CREATE_CONTEXT chain",
                None,
                encoded(|out| {
                    encode_create_contexts(
                        out,
                        &[
                            CreateContext {
                                name: context_name::QUERY_MAXIMAL_ACCESS.to_vec(),
                                data: vec![],
                            },
                            CreateContext {
                                name: context_name::ALLOCATION_SIZE.to_vec(),
                                data: 4096u64.to_le_bytes().to_vec(),
                            },
                        ],
                    )
                }),
                |b| parse_create_contexts(b).map(drop),
            )
        },
        case(
            "FILE_RENAME_INFORMATION_TYPE_2",
            None,
            encoded(|out| {
                RenameInfo {
                    replace_if_exists: true,
                    root_directory: 0,
                    name: r"dir
ew.txt"
                        .into(),
                }
                .encode(out)
            }),
            |b| RenameInfo::parse(b).map(drop),
        ),
        case(
            "SMB2_CREATE_REQUEST_LEASE",
            None,
            encoded(|out| {
                LeaseContext {
                    version: 1,
                    lease_key: [6; 16],
                    state: lease_state::READ | lease_state::WRITE,
                    flags: 0,
                    duration: 0,
                    parent_key: [0; 16],
                    epoch: 0,
                }
                .encode(out)
            }),
            |b| LeaseContext::parse(b).map(drop),
        ),
        Case {
            // MS-SMB2 2.2.13.2.10: the version is told by the length alone,
            // so 32 to 51 bytes are the 32-byte v1 form plus trailing bytes.
            also_decodes: &[
                32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51,
            ],
            ..case(
                "SMB2_CREATE_REQUEST_LEASE_V2",
                None,
                encoded(|out| {
                    LeaseContext {
                        version: 2,
                        lease_key: [6; 16],
                        state: lease_state::READ | lease_state::HANDLE,
                        flags: lease_flags::PARENT_LEASE_KEY_SET,
                        duration: 0,
                        parent_key: [7; 16],
                        epoch: 1,
                    }
                    .encode(out)
                }),
                |b| LeaseContext::parse(b).map(drop),
            )
        },
        // MS-SMB2 2.2.23.2: sent by the server, not a request, but its
        // decoder must refuse every prefix all the same.
        case(
            "Lease Break Notification",
            None,
            encoded(|out| {
                LeaseBreakNotification {
                    new_epoch: 2,
                    flags: LEASE_BREAK_ACK_REQUIRED,
                    lease_key: [6; 16],
                    current_state: lease_state::READ | lease_state::HANDLE,
                    new_state: lease_state::READ,
                }
                .encode(out)
            }),
            |b| LeaseBreakNotification::parse(b).map(drop),
        ),
        Case {
            // MS-FSCC 2.4.7: the last 4 of the 40 bytes are Reserved; like
            // Samba, the server takes the 36 bytes that carry values.
            also_decodes: &[36, 37, 38, 39],
            ..case("FileBasicInformation", None, vec![0x11; 40], |b| {
                SetBasicInfo::parse(b).map(drop)
            })
        },
    ]
}

fn hex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex"))
        .collect()
}

#[test]
fn every_truncation_of_every_request_is_refused() {
    let mut failures = Vec::new();
    for c in cases() {
        assert_eq!((c.decode)(&c.message), Ok(()), "{}: whole message", c.what);
        let mut decoded = Vec::new();
        for n in 0..c.message.len() {
            match (c.decode)(&c.message[..n]) {
                Ok(()) => decoded.push(n),
                Err(WireError::Truncated) => {}
                Err(_) if c.any_error => {}
                Err(e) => failures.push(format!(
                    "{}: {n} of {} bytes refused, but not as truncated: {e}",
                    c.what,
                    c.message.len()
                )),
            }
        }
        if decoded != c.also_decodes {
            failures.push(format!(
                "{}: prefixes of {} bytes that decode: {decoded:?}, expected {:?}",
                c.what,
                c.message.len(),
                c.also_decodes
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The table above names every command (each has a request decoder).
#[test]
fn every_decoded_command_is_in_the_table() {
    let listed: Vec<Command> = cases().iter().filter_map(|c| c.command).collect();
    for v in 0..=0x12u16 {
        let cmd = Command::from_u16(v).expect("command code");
        assert!(listed.contains(&cmd), "{cmd:?}: not in the table");
    }
}
