//! Bytes read from a connection's socket before the frame that needs them.
//!
//! Why: reading a frame's first byte, the rest of its length, then its
//! body took three system calls per frame. Small requests at depth arrive
//! many to a segment, and those calls were a large part of what a 4 KiB
//! READ or a LOCK cost the server. One read into this buffer now takes
//! every small frame that has come; a frame longer than what the buffer
//! holds has the rest of its body read straight into its own buffer, so
//! a large WRITE is not copied twice.

use tokio::io::AsyncReadExt;
use tokio::net::tcp::OwnedReadHalf;

/// Enough for dozens of small requests (a signed READ or LOCK request is
/// under 200 bytes), at 8 KiB a connection while it is busy. A connection
/// has none until it has something to read, and gives it back after
/// `IDLE_TRIM` with nothing (`release`): 2,000 idle connections hold no
/// read-ahead at all.
const SIZE: usize = 8 * 1024;

#[derive(Default)]
pub(super) struct ReadAhead {
    buf: Vec<u8>,
    start: usize,
}

impl ReadAhead {
    /// What has been read and not yet taken.
    pub fn bytes(&self) -> &[u8] {
        &self.buf[self.start..]
    }

    pub fn is_empty(&self) -> bool {
        self.start == self.buf.len()
    }

    /// Takes `n` bytes off the front (n ≤ `bytes().len()`).
    pub fn consume(&mut self, n: usize) {
        debug_assert!(n <= self.bytes().len());
        self.start = (self.start + n).min(self.buf.len());
        if self.start == self.buf.len() {
            self.buf.clear();
            self.start = 0;
        }
    }

    /// Gives the buffer back while the connection is idle.
    pub fn release(&mut self) {
        if self.is_empty() {
            self.buf = Vec::new();
            self.start = 0;
        }
    }

    /// Room after what is held, moving a remainder to the front first.
    fn spare(&mut self) {
        if self.start > 0 {
            self.buf.drain(..self.start);
            self.start = 0;
        }
        if self.buf.capacity() < SIZE {
            self.buf.reserve_exact(SIZE - self.buf.len());
        }
    }

    /// Reads what the socket holds now, without waiting. Ok(false): it
    /// holds nothing yet, or this has no buffer (none is made to find out:
    /// `fill` makes one once the socket is readable). An end of stream is
    /// an error (`UnexpectedEof`).
    pub fn try_fill(&mut self, rd: &OwnedReadHalf) -> std::io::Result<bool> {
        if self.buf.capacity() == 0 {
            return Ok(false);
        }
        self.try_fill_now(rd)
    }

    fn try_fill_now(&mut self, rd: &OwnedReadHalf) -> std::io::Result<bool> {
        self.spare();
        if self.buf.len() == self.buf.capacity() {
            return Ok(true);
        }
        // Into the spare capacity: nothing is zeroed first.
        match rd.try_read_buf(&mut self.buf) {
            Ok(0) => Err(std::io::ErrorKind::UnexpectedEof.into()),
            Ok(_) => Ok(true),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Waits until at least one more byte has been read.
    pub async fn fill(&mut self, rd: &mut OwnedReadHalf) -> std::io::Result<()> {
        if self.buf.capacity() == 0 {
            // No buffer while there is nothing to read.
            loop {
                rd.readable().await?;
                if self.try_fill_now(rd)? {
                    return Ok(());
                }
            }
        }
        self.spare();
        if self.buf.len() == self.buf.capacity() {
            return Ok(());
        }
        if rd.read_buf(&mut self.buf).await? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;
    use tokio::net::{TcpListener, TcpStream};

    async fn pair() -> (OwnedReadHalf, tokio::net::tcp::OwnedWriteHalf) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (server, _) = listener.accept().await.unwrap();
        let (rd, _) = server.into_split();
        let (_, wr) = client.into_split();
        (rd, wr)
    }

    #[tokio::test]
    async fn takes_what_came_in_one_read_and_keeps_the_rest_in_order() {
        let (mut rd, mut wr) = pair().await;
        let mut ahead = ReadAhead::default();
        // No buffer before anything came, and none made to look.
        assert!(!ahead.try_fill(&rd).unwrap());
        assert_eq!(ahead.buf.capacity(), 0);
        wr.write_all(b"abcdefgh").await.unwrap();
        ahead.fill(&mut rd).await.unwrap();
        while ahead.bytes().len() < 8 {
            ahead.fill(&mut rd).await.unwrap();
        }
        assert_eq!(ahead.bytes(), b"abcdefgh");
        ahead.consume(3);
        assert_eq!(ahead.bytes(), b"defgh");
        // A remainder moves to the front before more is read after it.
        wr.write_all(b"ij").await.unwrap();
        while ahead.bytes().len() < 7 {
            ahead.fill(&mut rd).await.unwrap();
        }
        assert_eq!(ahead.bytes(), b"defghij");
        ahead.consume(7);
        assert!(ahead.is_empty());
        // More than fits: the buffer never grows past SIZE.
        let big = vec![7u8; SIZE * 3];
        wr.write_all(&big).await.unwrap();
        let mut seen = 0;
        while seen < big.len() {
            ahead.fill(&mut rd).await.unwrap();
            assert!(
                ahead.buf.capacity() <= SIZE + 64,
                "{}",
                ahead.buf.capacity()
            );
            seen += ahead.bytes().len();
            let n = ahead.bytes().len();
            ahead.consume(n);
        }
        assert_eq!(seen, big.len());
        // Idle: given back, and the end of stream is an error.
        ahead.release();
        assert_eq!(ahead.buf.capacity(), 0);
        drop(wr);
        assert!(ahead.fill(&mut rd).await.is_err());
    }
}
