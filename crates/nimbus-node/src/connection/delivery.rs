//! Whether a break reached the client, on a session with several channels.
//!
//! MS-SMB2 3.3.4.6 (oplocks) and 3.3.4.7 (leases): a break goes out on one
//! channel of the session; should that channel fail, on another. A
//! channel can fail without closing: the client's side stops answering
//! (a dead path, a firewall dropping its packets), and the connection
//! looks alive for as long as TCP keeps retransmitting, while the open
//! that caused the break waits out the break timeout. So once a watched
//! break (`ResponseChannel::send_frame_watched`) is written, the
//! connection follows its socket: the bytes the client's TCP has
//! acknowledged (TCP_INFO's tcpi_bytes_acked) against those it had to
//! acknowledge, the break's last byte among them (acknowledged then, plus
//! what the socket held: SIOCOUTQ). A channel whose client acknowledges
//! nothing for six retransmission timeouts in a row (the socket's RTO,
//! held within 0.2-1 s: 1.2-6 s) is taken as failed, as Samba's smbd
//! takes it, and reset; its session lives on on its other channels, and
//! the breaks still owed go out again on one of them
//! (`crate::oplocks::redeliver_breaks`), the next failing the same way,
//! until a channel delivers or none is left. A channel that acknowledges
//! slowly (much queued before the break on a slow link) is alive and is
//! waited for.
//!
//! Only breaks are watched, and only where the session has another live
//! channel to turn to, looked at again before the reset: a lone
//! connection is left to TCP's own timeouts. The kernel gives no notice
//! of acknowledgements to wait on, so the socket is looked at once per
//! RTO; what it answers is a few integers, asked of the kernel through
//! libc as no crate wraps them.

use std::sync::atomic::Ordering;
use std::sync::Weak;
use std::time::Duration;

use super::Connection;

/// The socket's retransmission timeout is held within these bounds: below,
/// a delayed acknowledgement could look like a failure; above, a dead
/// channel would hold the break too long.
const RTO_MIN: Duration = Duration::from_millis(200);
const RTO_MAX: Duration = Duration::from_secs(1);
/// Retransmission timeouts in a row without an acknowledged byte that
/// make a channel failed.
const RTOS: u32 = 6;

/// Run once a watched frame is written (its `on_sent`): follows, on the
/// runtime, the client's acknowledgements until every byte written so far
/// is acknowledged, or the channel is taken as failed.
pub(super) fn watch(conn: Weak<Connection>) {
    let Some(c) = conn.upgrade() else {
        return;
    };
    let fd = c.socket.load(Ordering::SeqCst);
    if fd < 0 {
        return;
    }
    let (Some(at_start), Some(queued)) = (tcp_state(fd), unacknowledged(fd)) else {
        return;
    };
    let through = at_start.acked + queued;
    let rto = at_start.rto.clamp(RTO_MIN, RTO_MAX);
    drop(c);
    tokio::spawn(async move {
        let mut acked = at_start.acked;
        let mut silent = 0;
        loop {
            tokio::time::sleep(rto).await;
            let Some(c) = conn.upgrade() else {
                return;
            };
            let fd = c.socket.load(Ordering::SeqCst);
            if c.is_closing() || fd < 0 {
                return;
            }
            let Some(now) = tcp_state(fd) else {
                return;
            };
            if now.acked >= through {
                return;
            }
            if now.acked > acked {
                acked = now.acked;
                silent = 0;
                continue;
            }
            silent += 1;
            if silent < RTOS {
                continue;
            }
            // A lone channel is left to TCP: ending it would end its
            // session, and the break may yet arrive.
            if !has_another_live_channel(&c) {
                return;
            }
            tracing::warn!(
                "{}: the client's TCP acknowledged nothing of a break for {:?}; resetting the \
                 channel, the break goes out again on another channel of its session",
                c.peer,
                rto * RTOS
            );
            c.reset_requested.store(true, Ordering::SeqCst);
            c.close();
            return;
        }
    });
}

/// Whether a session of `c` has a live connection besides `c`, where its
/// breaks could go instead.
fn has_another_live_channel(c: &Connection) -> bool {
    let sessions: Vec<_> = crate::sync::lock(&c.sessions)
        .values()
        .map(|e| e.session.clone())
        .collect();
    sessions.iter().any(|s| {
        s.connections().iter().any(|other| {
            !std::ptr::addr_eq(std::sync::Arc::as_ptr(other), c as *const Connection)
                && !other.is_closing()
        })
    })
}

/// Ends the connection on socket `fd`, which the caller owns, with a
/// reset, before its breaks go out again: the client, whose side may still
/// hear us, learns of the loss before it sees them on another channel. A
/// FIN would wait behind the unacknowledged bytes, which are never
/// acknowledged. Linux dissolves a TCP connection connected to an
/// AF_UNSPEC address (its `tcp_disconnect`, which sends the reset); should
/// that fail, the connection is shut down instead.
pub(super) fn reset(fd: i32) {
    // SAFETY: an all-zero sockaddr is a valid value of the plain C struct.
    let mut unspecified: libc::sockaddr = unsafe { std::mem::zeroed() };
    unspecified.sa_family = libc::AF_UNSPEC as libc::sa_family_t;
    let len = std::mem::size_of::<libc::sockaddr>() as libc::socklen_t;
    // SAFETY: connect reads `len` bytes of `unspecified`, ours; shutdown
    // takes no memory of ours. The descriptor is the caller's own socket.
    unsafe {
        if libc::connect(fd, &unspecified, len) != 0 {
            libc::shutdown(fd, libc::SHUT_RDWR);
        }
    }
}

/// Bytes sent or queued on socket `fd` that its peer has not acknowledged
/// (SIOCOUTQ, which is TIOCOUTQ); None when the socket does not say.
fn unacknowledged(fd: i32) -> Option<u64> {
    let mut bytes: libc::c_int = 0;
    // SAFETY: TIOCOUTQ writes one int, ours. The descriptor is the
    // connection's socket, open while the reader holds it (it clears
    // `socket` before it lets go); were its number reused since it was
    // loaded, the answer is another socket's, which at worst makes this
    // watch end early or wait longer (the reset itself is made on the
    // reader's own socket).
    let r = unsafe { libc::ioctl(fd, libc::TIOCOUTQ, &mut bytes) };
    u64::try_from(bytes).ok().filter(|_| r == 0)
}

/// What TCP_INFO says of a socket that the watch needs.
#[derive(Clone, Copy)]
struct TcpState {
    /// Bytes the peer acknowledged so far.
    acked: u64,
    rto: Duration,
}

fn tcp_state(fd: i32) -> Option<TcpState> {
    // SAFETY: an all-zero tcp_info is a valid value of the plain C struct.
    let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `info`, ours,
    // and `len` says its size; the descriptor is as in `unacknowledged`.
    let r = unsafe {
        libc::getsockopt(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            (&mut info as *mut libc::tcp_info).cast(),
            &mut len,
        )
    };
    // A kernel too old to fill tcpi_bytes_acked (before 4.1) says less.
    let filled = std::mem::offset_of!(libc::tcp_info, tcpi_bytes_acked) + 8;
    (r == 0 && len as usize >= filled).then(|| TcpState {
        acked: info.tcpi_bytes_acked,
        rto: Duration::from_micros(u64::from(info.tcpi_rto)),
    })
}
