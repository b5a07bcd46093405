//! The bytes the server holds for one connection's client beyond the
//! requests it is processing, against one ceiling per connection
//! (`limits.max_connection_memory_bytes`, the figure that also bounds the
//! requests in flight): messages queued on the writer that answer no
//! request being processed (oplock and lease breaks, final responses of
//! requests that waited), and what its named pipes hold unread (RPC
//! answers, and requests still arriving). Each grows with what the client
//! does: one that stops reading lets breaks pile up, one that writes to
//! pipes without reading lets answers pile up, up to
//! `nimbus_rpc::pipe::MAX_QUEUED` a pipe times `limits.max_pipes_per_session`
//! times its sessions. The ceiling makes that a bound per connection.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// One connection's count of held bytes and its ceiling.
pub struct HeldBytes {
    held: AtomicUsize,
    max: usize,
}

impl HeldBytes {
    pub fn new(max: usize) -> Arc<HeldBytes> {
        Arc::new(HeldBytes {
            held: AtomicUsize::new(0),
            max,
        })
    }

    pub fn max(&self) -> usize {
        self.max
    }

    pub fn held(&self) -> usize {
        self.held.load(Ordering::Acquire)
    }

    /// Counts `size` more bytes; false (nothing counted) if they would
    /// pass the ceiling.
    pub fn charge(&self, size: usize) -> bool {
        self.held
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |q| {
                q.checked_add(size).filter(|n| *n <= self.max)
            })
            .is_ok()
    }

    /// `size` bytes counted before are no longer held.
    pub fn release(&self, size: usize) {
        self.held.fetch_sub(size, Ordering::AcqRel);
    }
}

/// What one holder (a named pipe) counts against a connection's held
/// bytes; given back when dropped, so a pipe closed, or gone with its tree
/// or session, frees its share.
#[derive(Default)]
pub struct HeldCharge {
    budget: Option<Arc<HeldBytes>>,
    bytes: usize,
}

impl HeldCharge {
    /// Makes the charge `now` bytes, counted against `budget`. A session
    /// bound to several connections counts a pipe against the connection
    /// it was last written on (the charge moves there whole). False, and
    /// the charge as it was, if that passes the budget's ceiling.
    pub fn set(&mut self, budget: &Arc<HeldBytes>, now: usize) -> bool {
        match &self.budget {
            Some(b) if Arc::ptr_eq(b, budget) => {
                if now > self.bytes {
                    if !b.charge(now - self.bytes) {
                        return false;
                    }
                } else {
                    b.release(self.bytes - now);
                }
            }
            _ => {
                if !budget.charge(now) {
                    return false;
                }
                if let Some(old) = self.budget.replace(budget.clone()) {
                    old.release(self.bytes);
                }
            }
        }
        self.bytes = now;
        true
    }

    /// Lowers the charge to `now` bytes (never raises it), where it is
    /// counted: what a read took out of the pipe.
    pub fn shrink_to(&mut self, now: usize) {
        if now < self.bytes {
            if let Some(b) = &self.budget {
                b.release(self.bytes - now);
            }
            self.bytes = now;
        }
    }
}

impl Drop for HeldCharge {
    fn drop(&mut self) {
        if let Some(b) = &self.budget {
            b.release(self.bytes);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ceiling_refuses_what_passes_it_and_frees_what_went() {
        let b = HeldBytes::new(1000);
        assert!(b.charge(600));
        assert!(b.charge(400));
        assert!(!b.charge(1), "full");
        b.release(400);
        assert!(!b.charge(401));
        assert!(b.charge(400));
        b.release(1000);
        assert!(b.charge(1000));
        assert!(!b.charge(usize::MAX), "no overflow");
    }

    #[test]
    fn a_charge_grows_shrinks_moves_and_is_given_back_when_dropped() {
        let (a, other) = (HeldBytes::new(1000), HeldBytes::new(1000));
        let mut c = HeldCharge::default();
        assert!(c.set(&a, 700));
        assert!(!c.set(&a, 1001), "past the ceiling");
        assert_eq!(a.held(), 700, "a refused set changes nothing");
        assert!(a.charge(300));
        assert!(!c.set(&a, 701), "the others' bytes count too");
        a.release(300);
        c.shrink_to(200);
        assert_eq!(a.held(), 200);
        c.shrink_to(900);
        assert_eq!(a.held(), 200, "shrink never raises");
        // Written on another connection: counted there, whole.
        assert!(c.set(&other, 250));
        assert_eq!((a.held(), other.held()), (0, 250));
        // A move the new connection has no room for leaves it where it was.
        let small = HeldBytes::new(100);
        assert!(!c.set(&small, 250));
        assert_eq!((other.held(), small.held()), (250, 0));
        assert!(other.charge(750));
        drop(c);
        assert_eq!((a.held(), other.held()), (0, 750));
    }
}
