//! MS-SMB2 2.2.14.1 SMB2_FILEID.

use crate::codec::{Put, Reader, WireResult};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct FileId {
    pub persistent: u64,
    pub volatile: u64,
}

impl FileId {
    /// All ones: in a related compound request it means "the file the
    /// previous request opened" (MS-SMB2 3.3.5.2.7.2).
    pub const RELATED: FileId = FileId {
        persistent: u64::MAX,
        volatile: u64::MAX,
    };

    pub fn read(r: &mut Reader<'_>) -> WireResult<FileId> {
        Ok(FileId {
            persistent: r.u64()?,
            volatile: r.u64()?,
        })
    }

    pub fn write(&self, out: &mut Vec<u8>) {
        out.put_u64(self.persistent);
        out.put_u64(self.volatile);
    }
}
