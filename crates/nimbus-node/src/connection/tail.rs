//! A READ response's data sent from the page cache (sendfile): the
//! response's head goes out from its buffer, then the file's bytes go
//! straight from the page cache to the socket, so a plain READ copies its
//! data once, in the kernel, instead of into a buffer and out of it again.
//! Only for a response that is neither signed nor sealed (both need the
//! bytes in this process) and is alone in its frame (`handlers::read`
//! decides, and `dispatch` falls back to reading the bytes when it may
//! not); sent by the connection's writer task.
//!
//! The bytes are read when they are sent, not when the READ was handled:
//! a WRITE answered in between (by another client; this one waits for
//! its READ's answer) may show in them, as it may on Samba with sendfile
//! on. A READ racing a WRITE or a truncate gets the data of some moment
//! during it, which is what a client can rely on anyway.

use std::os::fd::{AsFd, BorrowedFd};
use std::sync::Arc;

use tokio::io::{AsyncWriteExt, Interest};
use tokio::net::tcp::OwnedWriteHalf;

use crate::session::Open;

/// The bytes of a file that end a response frame: `len` bytes at
/// `offset`, counted in the frame's NBSS length already.
pub struct FileTail {
    pub open: Arc<Open>,
    pub offset: u64,
    pub len: usize,
}

/// Zeros stand in for bytes the file no longer has (see `send`).
static ZEROS: [u8; 64 * 1024] = [0; 64 * 1024];

impl FileTail {
    /// Reads the bytes into `out` (where they may not be sent from the
    /// file: a signed, sealed or compounded response), zeros for any the
    /// file no longer has.
    pub fn read_into(&self, out: &mut Vec<u8>) -> std::io::Result<()> {
        let n = self
            .open
            .handle
            .read_append(out, self.len, self.offset)
            .map_err(|e| std::io::Error::other(e.to_string()))?;
        out.resize(out.len() + (self.len - n), 0);
        Ok(())
    }

    /// Sends the bytes on `wr` once the frame's head has gone out. The
    /// frame's length was promised with the head, so a file cut shorter
    /// meanwhile (another client truncated it) is made up with zeros, as
    /// the client reads the frame to its length: the data read is then
    /// as of some moment during the READ, as any read racing a truncate.
    pub async fn send(&self, wr: &mut OwnedWriteHalf) -> std::io::Result<()> {
        // The handler found the range in memory, but the response may have
        // waited in the queue meanwhile: sendfile would wait for a page the
        // kernel let go of on this runtime's worker, so such a range is
        // read where waiting is allowed and written from a buffer.
        if !self.open.handle.is_cached(self.offset, self.len) {
            let mut bytes = Vec::new();
            nimbus_state::blocking::off_worker(|| self.read_into(&mut bytes))?;
            return wr.write_all(&bytes).await;
        }
        send_with(wr, self.len, |socket, sent, want| {
            self.open
                .handle
                .send_to(socket, self.offset + sent as u64, want)
        })
        .await
    }
}

/// Sends `len` bytes on `wr`, taking them from `source` (given the socket,
/// how many are sent, how many are wanted; it answers how many it sent, 0
/// when it has no more), zeros for whatever it has not.
async fn send_with(
    wr: &mut OwnedWriteHalf,
    len: usize,
    source: impl Fn(BorrowedFd<'_>, usize, usize) -> std::io::Result<usize>,
) -> std::io::Result<()> {
    let mut sent = 0usize;
    while sent < len {
        let socket = wr.as_ref();
        socket.writable().await?;
        match socket.try_io(Interest::WRITABLE, || {
            source(socket.as_fd(), sent, len - sent)
        }) {
            Ok(0) => {
                while sent < len {
                    let n = (len - sent).min(ZEROS.len());
                    wr.write_all(&ZEROS[..n]).await?;
                    sent += n;
                }
            }
            Ok(n) => sent += n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;
    use tokio::io::AsyncReadExt;

    /// A source that ends early (the file was cut meanwhile) is made up
    /// with zeros to the promised length, so the client's framing holds;
    /// what it sent comes first, in order.
    #[tokio::test]
    async fn a_file_cut_short_is_made_up_with_zeros() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let client = tokio::spawn(async move {
            let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
            let mut got = Vec::new();
            s.read_to_end(&mut got).await.unwrap();
            got
        });
        let (stream, _) = listener.accept().await.unwrap();
        let (_rd, mut wr) = stream.into_split();
        let data: Vec<u8> = (0..100_000u32).map(|i| (i % 239) as u8 + 1).collect();
        // 100,000 bytes of a promised 300,000, written as a file would be.
        let source = |socket: BorrowedFd<'_>, sent: usize, want: usize| {
            let rest = &data[sent.min(data.len())..];
            let n = rest.len().min(want).min(7_000);
            if n == 0 {
                return Ok(0);
            }
            // SAFETY: rest[..n] is readable; the socket is open.
            let r = unsafe { libc::send(socket.as_raw_fd(), rest.as_ptr().cast(), n, 0) };
            if r < 0 {
                Err(std::io::Error::last_os_error())
            } else {
                Ok(r as usize)
            }
        };
        send_with(&mut wr, 300_000, source).await.unwrap();
        drop(wr);
        let got = client.await.unwrap();
        assert_eq!(got.len(), 300_000);
        assert_eq!(&got[..100_000], &data[..]);
        assert!(got[100_000..].iter().all(|&b| b == 0));
    }
}
