//! Sending a connection's messages. Two tasks write to its socket, one at
//! a time (the write half sits behind an async lock, `Out`):
//! - the writer task (`writer`), which sends what it is handed: answers to
//!   frames run on the blocking pool, final responses of pending requests,
//!   oplock and lease breaks;
//! - the reader, which sends the answers it made in place itself
//!   (`Answers::send`), when the writer holds nothing still unwritten.
//!
//! Why the reader writes: an answer made in place used to go to the writer
//! through a channel. On one runtime worker the writer ran only once the
//! reader had nothing left to read, so the requests that arrived together
//! were all answered before the first answer left, in one write. At queue
//! depth 8 the client and the server took turns, neither working while
//! the other did. The reader now sends every few answers (`SEND_MIN`)
//! and whenever it would wait for the client, with no channel hop and no
//! task wake-up, so the client refills while the server makes the next
//! answers.
//!
//! Order: what was handed to the writer before an answer was made (a
//! pending request's final response or a break queued while the answer's
//! frame ran) goes before it, as the client expects.
//! `Connection::queued_out` counts what the writer was handed and has not
//! written; the reader writes only while that is 0, under the lock, and
//! otherwise queues its answers behind. The reader never waits on the
//! socket: it makes one non-blocking write, and a message it could write
//! only in part is left to the writer (`Out::unfinished`), which finishes
//! it before it writes anything else. A message handed to the writer
//! while answers wait with the reader (a break for another client's
//! request) may go before them, as it could when the writer ran only once
//! the reader yielded; the wait is shorter now (`SEND_MAX` answers at
//! most, or until the socket is empty).

use std::io::IoSlice;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use tokio::io::AsyncWriteExt;
use tokio::net::tcp::OwnedWriteHalf;
use tokio::sync::{mpsc, Notify};

use super::{Connection, InFlight, Outgoing};

/// At most this many messages, and about this many bytes, go out in one
/// write of the writer's.
const BATCH_MESSAGES: usize = 64;
const BATCH_BYTES: usize = 256 * 1024;

/// The reader sends its answers once it has made half as many as came in
/// its last run of requests (those it read without finding the socket
/// empty), within these bounds, though more requests wait to be read: the
/// first answers reach the client while the server makes the rest. Measured
/// (BENCHMARKS.md, "Small I/O at queue depth"): a fixed 4 raised depth 8 by
/// 30-40% but cost depth 128 14-18%, in system calls; a fixed 16 left
/// depth 8 taking turns with the client.
const SEND_MIN: usize = 4;
const SEND_MAX: usize = 16;

/// A frame longer than this may take a while to arrive whole: the reader
/// sends the answers it holds before it reads one (a small READ's answer
/// does not wait for the 8 MiB WRITE the client sent after it).
pub(super) const HOLD_MAX_FRAME: usize = 64 * 1024;

/// The socket's write half, and the message a reader's write left part
/// written.
pub(super) struct Out {
    wr: OwnedWriteHalf,
    unfinished: Option<(Outgoing, InFlight)>,
}

/// Shared by the reader and the writer task.
pub(super) struct Sender {
    out: tokio::sync::Mutex<Out>,
    /// Wakes the writer for an `unfinished` message.
    wake: Notify,
}

impl Sender {
    pub fn new(wr: OwnedWriteHalf) -> Arc<Sender> {
        Arc::new(Sender {
            out: tokio::sync::Mutex::new(Out {
                wr,
                unfinished: None,
            }),
            wake: Notify::new(),
        })
    }

    /// The write half back once the writer task and the reader's
    /// `Answers` are gone, dropping a message still part written (and its
    /// room in the budget).
    pub fn into_write_half(self: Arc<Self>) -> Option<OwnedWriteHalf> {
        Some(Arc::into_inner(self)?.out.into_inner().wr)
    }
}

/// At most this many slices go into one vectored write: a batch of the
/// writer's and the message left unfinished before it.
const MAX_SLICES: usize = BATCH_MESSAGES + 1;

/// The bytes of messages still to send, in order, for one vectored write:
/// on the stack, as a write every few requests made an allocation each.
struct Slices<'a> {
    list: [IoSlice<'a>; MAX_SLICES],
    len: usize,
}

impl<'a> Slices<'a> {
    fn new() -> Slices<'a> {
        Slices {
            list: [IoSlice::new(&[]); MAX_SLICES],
            len: 0,
        }
    }

    /// Adds the unsent bytes of `messages`, in order, as many as fit.
    fn extend<F: 'a>(&mut self, messages: impl Iterator<Item = &'a (Outgoing, F)>) {
        for (out, _) in messages {
            let Some(slot) = self.list.get_mut(self.len) else {
                return;
            };
            *slot = IoSlice::new(&out.buf[out.start..]);
            self.len += 1;
        }
    }

    fn as_mut(&mut self) -> &mut [IoSlice<'a>] {
        &mut self.list[..self.len]
    }
}

/// Writes `slices` in order, with as few system calls as the socket takes.
async fn write_all(wr: &mut OwnedWriteHalf, slices: &mut [IoSlice<'_>]) -> std::io::Result<()> {
    if let [one] = slices {
        return wr.write_all(one).await;
    }
    let mut rest = slices;
    while !rest.is_empty() {
        let n = wr.write_vectored(rest).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        IoSlice::advance_slices(&mut rest, n);
    }
    Ok(())
}

/// What follows a message's write: the final responses of the requests
/// whose interims it held may go, its callbacks run, its buffer goes back
/// to the pool, and its room in the connection's budget is freed (a
/// message that answers no frame was counted in `Connection::held`).
fn sent(conn: &Connection, mut out: Outgoing, in_flight: Option<InFlight>) {
    if in_flight.is_none() {
        conn.held.release(out.buf.capacity());
    }
    for request in &out.interims {
        request.interim_written();
    }
    // In place: they must not wait for the disk (a persistent open's
    // answered mark is a `Durability::Soon` write, made in memory); a
    // hand-over to the blocking pool cost more CPU than the mark itself.
    for f in std::mem::take(&mut out.on_sent) {
        f();
    }
    conn.pool.give(out.buf);
    drop(in_flight);
}

/// The writer task: sends what it is handed until both its queues close,
/// or the connection is dropped (`Connection::drop_now`).
pub(super) async fn writer(
    conn: Arc<Connection>,
    sender: Arc<Sender>,
    mut rx: mpsc::Receiver<(Outgoing, InFlight)>,
    mut async_rx: mpsc::UnboundedReceiver<Outgoing>,
) {
    let mut async_open = true;
    let mut batch: Vec<(Outgoing, Option<InFlight>)> = Vec::new();
    loop {
        // Messages on their own (final responses of pending requests,
        // breaks) before responses to frames: one queued while a frame was
        // processed (a pending LOCK ended by a CLOSE) goes out before that
        // frame's response, as the client expects. What they may hold is
        // bounded (see `send_unsolicited`).
        let first = tokio::select! {
            biased;
            _ = sender.wake.notified() => None,
            r = async_rx.recv(), if async_open => match r {
                Some(out) => Some((out, None)),
                None => {
                    async_open = false;
                    continue;
                }
            },
            r = rx.recv() => match r {
                Some((out, in_flight)) => Some((out, Some(in_flight))),
                None => break,
            },
        };
        // What else is ready goes out in the same system call, taken in
        // the same order: with many requests in flight, one write per
        // response was a large part of a small request's cost.
        batch.extend(first);
        let mut bytes: usize = batch.iter().map(|(out, _)| out.buf.len() - out.start).sum();
        while batch.len() < BATCH_MESSAGES && bytes < BATCH_BYTES {
            let next = match async_rx.try_recv() {
                Ok(out) => Some((out, None)),
                Err(_) => rx.try_recv().ok().map(|(out, f)| (out, Some(f))),
            };
            let Some(next) = next else {
                break;
            };
            bytes += next.0.buf.len() - next.0.start;
            batch.push(next);
        }
        // Dropped: nothing more goes out.
        if conn.not_reading.load(Ordering::SeqCst) {
            break;
        }
        let mut out = sender.out.lock().await;
        // A message the reader wrote in part is finished first: nothing
        // may come between its bytes.
        let unfinished = out.unfinished.take();
        // Fits: the batch holds at most BATCH_MESSAGES.
        debug_assert!(batch.len() < MAX_SLICES);
        let mut bufs = Slices::new();
        bufs.extend(unfinished.iter());
        bufs.extend(batch.iter());
        if bufs.len > 0 && write_all(&mut out.wr, bufs.as_mut()).await.is_err() {
            break;
        }
        drop(out);
        let written = batch.len() + usize::from(unfinished.is_some());
        if let Some((part, in_flight)) = unfinished {
            sent(&conn, part, Some(in_flight));
        }
        for (out, in_flight) in batch.drain(..) {
            sent(&conn, out, in_flight);
        }
        conn.queued_out.fetch_sub(written, Ordering::SeqCst);
    }
}

/// The answers the reader made in place and has not yet sent.
pub(super) struct Answers {
    sender: Arc<Sender>,
    /// The writer's queue for answers to frames; held here, it keeps the
    /// writer running until the reader drops this.
    tx: mpsc::Sender<(Outgoing, InFlight)>,
    list: Vec<(Outgoing, InFlight)>,
    bytes: usize,
    /// Requests answered in place since the reader last found nothing to
    /// read, and the count of the run before: how many the client keeps
    /// in flight, as the reader sees it.
    run: usize,
    last_run: usize,
}

impl Answers {
    pub fn new(sender: Arc<Sender>, tx: mpsc::Sender<(Outgoing, InFlight)>) -> Answers {
        Answers {
            sender,
            tx,
            list: Vec::new(),
            bytes: 0,
            run: 0,
            last_run: 0,
        }
    }

    pub fn push(&mut self, out: Outgoing, in_flight: InFlight) {
        self.bytes += out.buf.len() - out.start;
        self.list.push((out, in_flight));
        self.run += 1;
    }

    /// The reader found nothing more to read.
    pub fn caught_up(&mut self) {
        self.last_run = self.run;
        self.run = 0;
    }

    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// Whether they go out now, though more requests wait to be read.
    pub fn enough(&self) -> bool {
        self.list.len() >= (self.last_run / 2).clamp(SEND_MIN, SEND_MAX)
            || self.bytes >= BATCH_BYTES
    }

    /// Sends them: the reader itself, when the writer holds nothing
    /// unwritten, or else queued behind what the writer holds. Err: the
    /// connection can send nothing more.
    pub async fn send(&mut self, conn: &Connection) -> Result<(), ()> {
        if self.list.is_empty() {
            return Ok(());
        }
        self.bytes = 0;
        if !conn.not_reading.load(Ordering::SeqCst) {
            if let Ok(mut out) = self.sender.out.try_lock() {
                if conn.queued_out.load(Ordering::SeqCst) == 0 {
                    // The first MAX_SLICES at most; the rest go to the
                    // writer below.
                    let mut bufs = Slices::new();
                    bufs.extend(self.list.iter());
                    let written = match out.wr.try_write_vectored(bufs.as_mut()) {
                        Ok(n) => n,
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => 0,
                        Err(_) => {
                            self.list.clear();
                            return Err(());
                        }
                    };
                    let done = whole_messages(&self.list, written);
                    if done.into_next > 0 {
                        // Part of the next one went out: the writer
                        // finishes it before anything else.
                        let (mut part, in_flight) = self.list.remove(done.count);
                        part.start += done.into_next;
                        conn.queued_out.fetch_add(1, Ordering::SeqCst);
                        out.unfinished = Some((part, in_flight));
                        self.sender.wake.notify_one();
                    }
                    drop(out);
                    for (out, in_flight) in self.list.drain(..done.count) {
                        sent(conn, out, Some(in_flight));
                    }
                }
            }
        }
        // Drained: the list keeps its room for the next answers.
        for answer in self.list.drain(..) {
            // Counted once the writer's queue has room for it: an answer
            // dropped before it reaches the writer (the writer gone, or
            // this send cancelled) is never counted as queued.
            let Ok(permit) = self.tx.reserve().await else {
                return Err(());
            };
            conn.queued_out.fetch_add(1, Ordering::SeqCst);
            permit.send(answer);
        }
        Ok(())
    }
}

/// How far a write of `written` bytes took a list of messages.
struct Progress {
    /// The messages written whole.
    count: usize,
    /// The bytes written of the one after them.
    into_next: usize,
}

fn whole_messages<F>(list: &[(Outgoing, F)], mut written: usize) -> Progress {
    let mut count = 0;
    for (out, _) in list {
        let len = out.buf.len() - out.start;
        if written < len {
            return Progress {
                count,
                into_next: written,
            };
        }
        written -= len;
        count += 1;
    }
    Progress {
        count,
        into_next: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn messages(lengths: &[usize]) -> Vec<(Outgoing, ())> {
        lengths
            .iter()
            .enumerate()
            .map(|(i, &len)| (Outgoing::new(vec![i as u8; len + 2], 2), ()))
            .collect()
    }

    #[test]
    fn a_write_is_split_into_whole_messages_and_the_part_of_the_next() {
        let list = messages(&[10, 20, 30]);
        for (written, count, into_next) in [
            (0, 0, 0),
            (9, 0, 9),
            (10, 1, 0),
            (29, 1, 19),
            (30, 2, 0),
            (59, 2, 29),
            (60, 3, 0),
        ] {
            let done = whole_messages(&list, written);
            assert_eq!(
                (done.count, done.into_next),
                (count, into_next),
                "{written}"
            );
        }
    }

    #[test]
    fn slices_take_the_unsent_bytes_in_order_and_stop_when_full() {
        let lengths: Vec<usize> = (1..=MAX_SLICES + 5).collect();
        let list = messages(&lengths);
        let mut slices = Slices::new();
        slices.extend(list[..1].iter());
        slices.extend(list[1..].iter());
        let taken = slices.as_mut();
        assert_eq!(taken.len(), MAX_SLICES);
        for (i, slice) in taken.iter().enumerate() {
            // Each message's own bytes, without the 2 before `start`.
            assert_eq!(slice.len(), i + 1);
            assert!(slice.iter().all(|&b| b == i as u8));
        }
    }
}
