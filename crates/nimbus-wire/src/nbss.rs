//! Direct TCP transport framing (MS-SMB2 2.1): each message is preceded by a
//! 4-byte header, a zero byte and a 24-bit big-endian length. Sans-IO: the
//! connection loop reads the header, asks `frame_length` how much to read,
//! and refuses oversize frames before allocating anything.

/// Why a frame header was refused; the connection is closed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrameError {
    /// The first byte is not 0x00 (a session message).
    NotSessionMessage(u8),
    /// Longer than the configured maximum.
    TooLong(usize),
    /// A zero-length frame carries no message.
    Empty,
}

/// NetBIOS session keep-alive (RFC 1002 4.3.8): ignored, never answered.
pub const KEEPALIVE: u8 = 0x85;

/// Returns the payload length announced by a frame header, or None for a
/// keep-alive that carries nothing.
pub fn frame_length(header: [u8; 4], max: usize) -> Result<Option<usize>, FrameError> {
    if header[0] == KEEPALIVE {
        return Ok(None);
    }
    if header[0] != 0 {
        return Err(FrameError::NotSessionMessage(header[0]));
    }
    let len = u32::from_be_bytes([0, header[1], header[2], header[3]]) as usize;
    if len == 0 {
        return Err(FrameError::Empty);
    }
    if len > max {
        return Err(FrameError::TooLong(len));
    }
    Ok(Some(len))
}

/// The 4-byte header for a payload of `len` bytes (must be < 16 MiB).
pub fn frame_header(len: usize) -> [u8; 4] {
    debug_assert!(len < 1 << 24);
    let b = (len as u32).to_be_bytes();
    [0, b[1], b[2], b[3]]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lengths_and_limits() {
        assert_eq!(frame_length([0, 0, 1, 0], 1 << 20), Ok(Some(256)));
        assert_eq!(
            frame_length([0, 0xFF, 0xFF, 0xFF], 1 << 20),
            Err(FrameError::TooLong(0xFF_FFFF))
        );
        assert_eq!(frame_length([0x85, 0, 0, 0], 10), Ok(None));
        assert_eq!(
            frame_length([0x81, 0, 0, 4], 10),
            Err(FrameError::NotSessionMessage(0x81))
        );
        assert_eq!(frame_length([0, 0, 0, 0], 10), Err(FrameError::Empty));
        assert_eq!(frame_header(0x010203), [0, 1, 2, 3]);
    }
}
