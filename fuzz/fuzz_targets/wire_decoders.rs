//! Every request decoder of nimbus-wire on attacker-chosen bytes: the first
//! byte picks the decoder, the rest is its input. Decoders must return an
//! error, never panic or allocate beyond their input; headers that parse
//! must survive a round trip.
#![no_main]

use libfuzzer_sys::fuzz_target;
use nimbus_wire::{close, create, fscc, fsctl, header, info, ioctl, negotiate, query_directory, read};
use nimbus_wire::{session_setup, simple, smb1, transform, tree_connect, write, HEADER_SIZE};

fuzz_target!(|data: &[u8]| {
    let Some((&which, input)) = data.split_first() else {
        return;
    };
    match which % 34 {
        0 => {
            if let Ok(h) = header::Header::parse(input) {
                let mut slot = [0u8; HEADER_SIZE];
                h.write_into(&mut slot);
                let again = header::Header::parse(&slot).expect("a written header parses");
                assert_eq!(again, h);
            }
        }
        1 => drop(negotiate::NegotiateRequest::parse(input)),
        2 => drop(negotiate::NegotiateResponse::parse(input)),
        3 => drop(negotiate::PreauthIntegrity::parse(input)),
        4 => drop(negotiate::parse_id_list(input)),
        5 => drop(session_setup::SessionSetupRequest::parse(input)),
        6 => drop(tree_connect::TreeConnectRequest::parse(input)),
        7 => drop(create::CreateRequest::parse(input)),
        8 => drop(create::parse_create_contexts(input)),
        9 => drop(close::CloseRequest::parse(input)),
        10 => drop(close::FlushRequest::parse(input)),
        11 => drop(read::ReadRequest::parse(input)),
        12 => drop(write::WriteRequest::parse(input)),
        13 => drop(ioctl::IoctlRequest::parse(input)),
        14 => drop(ioctl::ValidateNegotiateInfo::parse(input)),
        15 => drop(query_directory::QueryDirectoryRequest::parse(input)),
        16 => drop(info::QueryInfoRequest::parse(input)),
        17 => drop(info::SetInfoRequest::parse(input)),
        18 => drop(fscc::SetBasicInfo::parse(input)),
        19 => drop(fscc::RenameInfo::parse(input)),
        20 => {
            let _ = (
                fscc::parse_u64(input),
                fscc::parse_u32(input),
                fscc::parse_u8(input),
            );
        }
        21 => drop(transform::TransformHeader::parse(input)),
        22 => drop(smb1::smb1_negotiate_offer(input)),
        23 => drop(nimbus_wire::lock::LockRequest::parse(input)),
        24 => {
            // The chunks are decoded lazily: never more than announced, nor
            // more than the buffer holds.
            if let Ok(c) = fsctl::CopyChunkCopy::parse(input) {
                let n = c.chunks().count();
                assert!(n as u64 <= u64::from(c.chunk_count));
                assert!(n <= input.len() / fsctl::CopyChunk::LEN);
                assert_eq!(c.has_all_chunks(), n as u64 == u64::from(c.chunk_count));
            }
        }
        25 => drop(fsctl::ZeroDataInformation::parse(input)),
        26 => drop(fsctl::AllocatedRange::parse(input)),
        27 => drop(fsctl::CopyChunkResponse::parse(input)),
        28 => {
            let _ = (
                fsctl::parse_compression_state(input),
                fsctl::set_sparse_requested(input),
            );
        }
        29 => drop(nimbus_wire::ea::parse_full_ea_list(input)),
        30 => drop(nimbus_wire::ea::parse_get_ea_list(input)),
        31 => drop(simple::parse_empty(input)),
        32 => drop(nimbus_wire::apple::AaplRequest::parse(input)),
        // An AppleDouble file a client wrote, whole or only its head.
        _ => {
            let _ = nimbus_wire::apple_double::parse(input, input.len() as u64);
            let _ = nimbus_wire::apple_double::parse(&input[..input.len() / 2], input.len() as u64);
        }
    }
});
