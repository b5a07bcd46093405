//! The fuzzer's bytes read as requests: one byte picks the request, the
//! next few fill it in. Running out of bytes reads zeros, so every input
//! means something and a short input is a short sequence. Which open,
//! waiter or timer a request names is a raw byte, taken modulo whatever
//! exists when the request runs.

/// Clients (each its own connection and client GUID).
pub const CLIENTS: u8 = 4;
/// Files: three regular ones, all inside the directory that is the last.
pub const FILES: usize = 4;
pub const DIR: usize = FILES - 1;
/// Lease keys per client.
pub const KEYS: u8 = 3;
/// Requests per input: enough for a few interleaved break and lock
/// stories, few enough that one run stays in the microseconds.
pub const MAX_OPS: usize = 96;

// MS-SMB2 2.2.13.1 access rights the requests use.
pub const READ_DATA: u32 = 0x1;
pub const WRITE_DATA: u32 = 0x2;
pub const APPEND_DATA: u32 = 0x4;
pub const EXECUTE: u32 = 0x20;
pub const READ_ATTRIBUTES: u32 = 0x80;
pub const WRITE_ATTRIBUTES: u32 = 0x100;
pub const DELETE: u32 = 0x1_0000;
pub const READ_CONTROL: u32 = 0x2_0000;
pub const SYNCHRONIZE: u32 = 0x10_0000;

/// The access masks a CREATE may ask for: attribute-only ("stat") opens,
/// a security-descriptor read (a stat open to leases only), data rights.
const ACCESS: [u32; 10] = [
    READ_ATTRIBUTES,
    READ_ATTRIBUTES | WRITE_ATTRIBUTES | SYNCHRONIZE,
    READ_CONTROL,
    READ_DATA,
    WRITE_DATA,
    READ_DATA | WRITE_DATA,
    DELETE,
    READ_DATA | WRITE_DATA | DELETE,
    APPEND_DATA | READ_ATTRIBUTES,
    EXECUTE | READ_DATA,
];

/// Lock offsets and lengths: small overlapping ranges, zero lengths, and
/// ranges at (and past) the top of the 64-bit space.
const OFFSETS: [u64; 8] = [0, 1, 2, 4, 8, 10, u64::MAX - 1, u64::MAX];
const LENGTHS: [u64; 8] = [0, 1, 2, 4, 8, 16, 3, u64::MAX];

/// What a CREATE asks to cache, before the server's own adjustments.
#[derive(Clone, Copy, Debug)]
pub enum Caching {
    Nothing,
    /// RequestedOplockLevel II, EXCLUSIVE or BATCH.
    Oplock(u8),
    Lease {
        key: u8,
        /// Any state the client sends, invalid ones included.
        state: u32,
        version: u8,
        parent: Option<u8>,
        epoch: u16,
    },
}

#[derive(Clone, Copy, Debug)]
pub struct CreateReq {
    pub client: u8,
    pub file: usize,
    pub access: u32,
    pub share: u32,
    pub caching: Caching,
    /// OVERWRITE_IF of the existing file.
    pub overwrite: bool,
    pub delete_on_close: bool,
    /// Stop between the caching check and the grant (where the server
    /// opens the file on disk), so that other requests run in between.
    pub stall: bool,
}

#[derive(Clone, Debug)]
pub enum Op {
    Create(CreateReq),
    /// A stalled CREATE goes on: admitted, or failed (the disk open failed).
    Finish {
        pick: u8,
        fail: bool,
    },
    Close {
        pick: u8,
    },
    /// OPLOCK_BREAK acknowledgement with any level.
    AckOplock {
        pick: u8,
        level: u8,
    },
    /// Lease break acknowledgement with any state, for any key.
    AckLease {
        client: u8,
        key: u8,
        state: u32,
    },
    /// An acknowledgement timer fires (perhaps one whose break is over).
    Timeout {
        pick: u8,
    },
    /// WRITE, or SET_INFO end-of-file (which also changes the directory
    /// listing at once).
    Write {
        pick: u8,
        set_eof: bool,
    },
    Rename {
        pick: u8,
    },
    /// SET_INFO FileDispositionInformation.
    Delete {
        pick: u8,
    },
    /// A change inside the directory made elsewhere, through the client's
    /// parent lease `key` or none.
    ChildChange {
        client: u8,
        key: Option<u8>,
    },
    Lock {
        pick: u8,
        ranges: Vec<(u64, u64, bool)>,
        fail_immediately: bool,
    },
    Unlock {
        pick: u8,
        ranges: Vec<(u64, u64)>,
    },
    /// CANCEL of a waiting CREATE, rename or LOCK.
    Cancel {
        pick: u8,
    },
    /// The client's connection drops: its waiters end, its handles close.
    Disconnect {
        client: u8,
    },
}

pub struct Bytes<'a> {
    data: &'a [u8],
}

impl<'a> Bytes<'a> {
    pub fn new(data: &'a [u8]) -> Self {
        Bytes { data }
    }

    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    pub fn byte(&mut self) -> u8 {
        match self.data.split_first() {
            Some((&b, rest)) => {
                self.data = rest;
                b
            }
            None => 0,
        }
    }

    fn bit(b: u8, n: u32) -> bool {
        b >> n & 1 != 0
    }

    /// The next request.
    pub fn op(&mut self) -> Op {
        match self.byte() % 15 {
            // CREATE is the one request everything else needs: two of the
            // fifteen selectors.
            0 | 1 => Op::Create(self.create()),
            2 => {
                let b = self.byte();
                Op::Finish {
                    pick: b >> 1,
                    fail: Self::bit(b, 0),
                }
            }
            3 => Op::Close { pick: self.byte() },
            4 => {
                let pick = self.byte();
                let level = self.byte();
                Op::AckOplock { pick, level }
            }
            5 => {
                let b = self.byte();
                Op::AckLease {
                    client: b % CLIENTS,
                    key: (b >> 2) % KEYS,
                    state: u32::from(self.byte()),
                }
            }
            6 => Op::Timeout { pick: self.byte() },
            7 => {
                let b = self.byte();
                Op::Write {
                    pick: b >> 1,
                    set_eof: Self::bit(b, 0),
                }
            }
            8 => Op::Rename { pick: self.byte() },
            9 => Op::Delete { pick: self.byte() },
            10 => {
                let b = self.byte();
                Op::ChildChange {
                    client: b % CLIENTS,
                    key: Self::bit(b, 7).then_some((b >> 2) % KEYS),
                }
            }
            11 => {
                let pick = self.byte();
                let b = self.byte();
                let count = 1 + usize::from(Self::bit(b, 0));
                let ranges = (0..count)
                    .map(|_| {
                        let r = self.byte();
                        (
                            OFFSETS[usize::from(r & 7)],
                            LENGTHS[usize::from(r >> 3 & 7)],
                            Self::bit(r, 6),
                        )
                    })
                    .collect();
                Op::Lock {
                    pick,
                    ranges,
                    fail_immediately: Self::bit(b, 1),
                }
            }
            12 => {
                let pick = self.byte();
                let b = self.byte();
                let count = 1 + usize::from(Self::bit(b, 7));
                let mut ranges = vec![(
                    OFFSETS[usize::from(b & 7)],
                    LENGTHS[usize::from(b >> 3 & 7)],
                )];
                if count == 2 {
                    let r = self.byte();
                    ranges.push((
                        OFFSETS[usize::from(r & 7)],
                        LENGTHS[usize::from(r >> 3 & 7)],
                    ));
                }
                Op::Unlock { pick, ranges }
            }
            13 => Op::Cancel { pick: self.byte() },
            _ => Op::Disconnect {
                client: self.byte() % CLIENTS,
            },
        }
    }

    fn create(&mut self) -> CreateReq {
        let b = self.byte();
        let access = ACCESS[usize::from(self.byte()) % ACCESS.len()];
        let share = u32::from(self.byte() & 7);
        let want = self.byte();
        let caching = match want % 8 {
            0 => Caching::Nothing,
            1 => Caching::Oplock(0x01),
            2 => Caching::Oplock(0x08),
            3 => Caching::Oplock(0x09),
            _ => {
                let k = self.byte();
                let state = u32::from(self.byte());
                Caching::Lease {
                    key: k % KEYS,
                    state,
                    version: if Self::bit(k, 7) { 1 } else { 2 },
                    parent: Self::bit(k, 6).then_some((k >> 2) % KEYS),
                    epoch: if Self::bit(want, 7) {
                        u16::from(self.byte())
                    } else {
                        0
                    },
                }
            }
        };
        CreateReq {
            client: b % CLIENTS,
            file: usize::from(b >> 2) % FILES,
            access,
            share,
            caching,
            overwrite: Self::bit(b, 4),
            delete_on_close: Self::bit(b, 5),
            stall: Self::bit(b, 6),
        }
    }
}
