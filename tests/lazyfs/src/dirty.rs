//! The unsynced data of one file: whole pages written since its last
//! fsync, and the size the file has as its writers see it. Nothing here
//! touches the backing file; `fs.rs` fills new pages from it, overlays
//! reads and writes the pages back on fsync.

use std::collections::BTreeMap;

/// The unit of caching. A page holds the file's bytes as the writers left
/// them; bytes past the file's size are zero.
pub const PAGE: u64 = 4096;

pub struct Dirty {
    pages: BTreeMap<u64, Box<[u8]>>,
    size: u64,
}

impl Dirty {
    /// A file with nothing unsynced yet, `size` bytes long on the backing disk.
    pub fn new(size: u64) -> Dirty {
        Dirty {
            pages: BTreeMap::new(),
            size,
        }
    }

    pub fn size(&self) -> u64 {
        self.size
    }

    /// Caches `data` at `offset`. `fill` reads the backing file's bytes
    /// for a page taken into the cache for the first time (zeros past its
    /// end), so that a partial write keeps the bytes around it.
    pub fn write(&mut self, offset: u64, data: &[u8], mut fill: impl FnMut(u64, &mut [u8])) {
        let mut done = 0usize;
        while done < data.len() {
            let at = offset + done as u64;
            let index = at / PAGE;
            let within = (at % PAGE) as usize;
            let n = (PAGE as usize - within).min(data.len() - done);
            let page = self.pages.entry(index).or_insert_with(|| {
                let mut page = vec![0u8; PAGE as usize].into_boxed_slice();
                fill(index * PAGE, &mut page);
                page
            });
            page[within..within + n].copy_from_slice(&data[done..done + n]);
            done += n;
        }
        self.size = self.size.max(offset + data.len() as u64);
    }

    /// Lays the cached bytes over `buf`, which holds the backing file's
    /// bytes from `offset` on.
    pub fn overlay(&self, offset: u64, buf: &mut [u8]) {
        let end = offset + buf.len() as u64;
        for (&index, page) in self.pages.range(offset / PAGE..end.div_ceil(PAGE)) {
            let start = (index * PAGE).max(offset);
            let stop = ((index + 1) * PAGE).min(end);
            let from = (start - index * PAGE) as usize;
            let to = (start - offset) as usize;
            let n = (stop - start) as usize;
            buf[to..to + n].copy_from_slice(&page[from..from + n]);
        }
    }

    /// The file was cut or extended to `size` (applied to the backing
    /// file at once): cached bytes past it go, so that a later extension
    /// reads zeros there.
    pub fn truncate(&mut self, size: u64) {
        self.pages.split_off(&size.div_ceil(PAGE));
        if !size.is_multiple_of(PAGE) {
            if let Some(page) = self.pages.get_mut(&(size / PAGE)) {
                page[(size % PAGE) as usize..].fill(0);
            }
        }
        self.size = size;
    }

    /// The backing file grew to `size` by other means (fallocate).
    pub fn grow(&mut self, size: u64) {
        self.size = self.size.max(size);
    }

    /// Zeroes the cached bytes of a range whose backing bytes were
    /// punched out.
    pub fn zero(&mut self, offset: u64, len: u64) {
        let end = offset.saturating_add(len);
        for (&index, page) in self.pages.range_mut(offset / PAGE..end.div_ceil(PAGE)) {
            let start = (index * PAGE).max(offset) - index * PAGE;
            let stop = ((index + 1) * PAGE).min(end) - index * PAGE;
            page[start as usize..stop as usize].fill(0);
        }
    }

    /// What an fsync writes back: each page's offset and its bytes up to
    /// the file's size.
    pub fn pages(&self) -> impl Iterator<Item = (u64, &[u8])> {
        self.pages.iter().filter_map(|(&index, page)| {
            let at = index * PAGE;
            let n = self.size.saturating_sub(at).min(PAGE) as usize;
            (n > 0).then(|| (at, &page[..n]))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn backing(content: &[u8]) -> impl FnMut(u64, &mut [u8]) + '_ {
        move |at, page| {
            let at = at as usize;
            if at < content.len() {
                let n = (content.len() - at).min(page.len());
                page[..n].copy_from_slice(&content[at..at + n]);
            }
        }
    }

    fn read(d: &Dirty, content: &[u8], offset: u64, len: usize) -> Vec<u8> {
        let mut buf = vec![0u8; len];
        for (i, b) in buf.iter_mut().enumerate() {
            *b = content.get(offset as usize + i).copied().unwrap_or(0);
        }
        d.overlay(offset, &mut buf);
        buf
    }

    #[test]
    fn a_partial_write_keeps_the_backing_bytes_around_it() {
        let disk = vec![7u8; 10_000];
        let mut d = Dirty::new(disk.len() as u64);
        d.write(4090, b"abcdefghij", backing(&disk));
        let got = read(&d, &disk, 4085, 20);
        assert_eq!(&got[..5], &[7; 5]);
        assert_eq!(&got[5..15], b"abcdefghij");
        assert_eq!(&got[15..], &[7; 5]);
        assert_eq!(d.size(), 10_000);
        let written: Vec<_> = d.pages().map(|(at, b)| (at, b.len())).collect();
        assert_eq!(written, vec![(0, 4096), (4096, 4096)]);
    }

    #[test]
    fn a_write_past_the_end_grows_the_file_and_writes_back_no_more() {
        let mut d = Dirty::new(0);
        d.write(5000, b"xyz", backing(&[]));
        assert_eq!(d.size(), 5003);
        let written: Vec<_> = d.pages().map(|(at, b)| (at, b.len())).collect();
        assert_eq!(written, vec![(4096, 907)]);
        assert_eq!(read(&d, &[], 4999, 5), b"\0xyz\0");
    }

    #[test]
    fn a_truncated_tail_reads_as_zeros_after_growing_again() {
        let mut d = Dirty::new(0);
        d.write(0, &[1u8; 9000], backing(&[]));
        d.truncate(4100);
        assert_eq!(d.size(), 4100);
        d.grow(9000);
        let got = read(&d, &[], 4090, 20);
        assert_eq!(&got[..10], &[1; 10]);
        assert_eq!(&got[10..], &[0; 10]);
        assert_eq!(d.pages().count(), 2);
        d.truncate(0);
        assert_eq!(d.pages().count(), 0);
    }

    #[test]
    fn a_punched_range_reads_as_zeros() {
        let mut d = Dirty::new(0);
        d.write(0, &[1u8; 8192], backing(&[]));
        d.zero(100, 5000);
        let got = read(&d, &[], 0, 8192);
        assert!(got[..100].iter().all(|&b| b == 1));
        assert!(got[100..5100].iter().all(|&b| b == 0));
        assert!(got[5100..].iter().all(|&b| b == 1));
    }
}
