//! The credit window of a connection (MS-SMB2 3.3.1.1 CommandSequenceWindow,
//! 3.3.5.2.3 verifying the sequence number, 3.3.1.2 granting credits).
//! Pure state: no I/O, so it is tested directly.

use std::collections::VecDeque;

#[derive(Debug)]
pub struct CreditWindow {
    /// Most credits a client may hold at once (the sequence window size,
    /// `limits.max_credits`).
    max: u64,
    /// Lowest message id not yet used.
    low: u64,
    /// One flag per id from `low`: used already?
    used: VecDeque<bool>,
    /// How many flags in `used` are false: the credits the client holds.
    /// Kept as a count because `grant` runs once per request and the
    /// window may be thousands of ids long.
    unused: u64,
}

#[derive(Debug, PartialEq, Eq)]
pub enum CreditError {
    /// The id is outside the window or used before: disconnect.
    OutOfWindow,
}

impl CreditWindow {
    /// A new connection holds one credit: message id 0 for NEGOTIATE.
    pub fn new(max: u16) -> Self {
        CreditWindow {
            max: max.max(1) as u64,
            low: 0,
            used: VecDeque::from(vec![false]),
            unused: 1,
        }
    }

    /// Consumes ids `message_id .. message_id + charge` (charge 0 counts as 1).
    pub fn consume(&mut self, message_id: u64, charge: u16) -> Result<(), CreditError> {
        let charge = charge.max(1) as u64;
        let start = message_id
            .checked_sub(self.low)
            .ok_or(CreditError::OutOfWindow)?;
        let end = start.checked_add(charge).ok_or(CreditError::OutOfWindow)?;
        if end > self.used.len() as u64 {
            return Err(CreditError::OutOfWindow);
        }
        let (start, end) = (start as usize, end as usize);
        if self.used.range(start..end).any(|u| *u) {
            return Err(CreditError::OutOfWindow);
        }
        for u in self.used.range_mut(start..end) {
            *u = true;
        }
        self.unused -= charge;
        while self.used.front() == Some(&true) {
            self.used.pop_front();
            self.low += 1;
        }
        Ok(())
    }

    /// Credits the client holds now (unused ids in the window).
    pub fn outstanding(&self) -> u64 {
        self.unused
    }

    /// Grants up to `requested` more credits (at least one when the client
    /// would otherwise hold none), never beyond the window size. Returns the grant.
    pub fn grant(&mut self, requested: u16) -> u16 {
        let held = self.outstanding();
        let room = self.max.saturating_sub(self.used.len() as u64);
        let mut g = (requested as u64).min(room);
        if g == 0 && held == 0 {
            g = 1;
        }
        for _ in 0..g {
            self.used.push_back(false);
        }
        self.unused += g;
        g as u16
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sequence_window() {
        let mut w = CreditWindow::new(8192);
        w.consume(0, 0).unwrap();
        assert_eq!(w.consume(0, 1), Err(CreditError::OutOfWindow)); // replay
        assert_eq!(w.grant(10), 10);
        assert_eq!(w.outstanding(), 10);
        // Out of order within the window is fine.
        w.consume(5, 1).unwrap();
        w.consume(1, 4).unwrap();
        assert_eq!(w.consume(3, 1), Err(CreditError::OutOfWindow));
        // Beyond the window.
        assert_eq!(w.consume(11, 1), Err(CreditError::OutOfWindow));
        // A multi-credit request must fit entirely.
        assert_eq!(w.consume(8, 4), Err(CreditError::OutOfWindow));
        w.consume(6, 5).unwrap();
        assert_eq!(w.outstanding(), 0);
        assert_eq!(w.grant(0), 1);
        assert_eq!(w.consume(u64::MAX, 2), Err(CreditError::OutOfWindow));
        assert_eq!(w.outstanding(), 1);
        assert_eq!(
            w.outstanding(),
            w.used.iter().filter(|u| !**u).count() as u64
        );
    }

    #[test]
    fn grant_is_bounded() {
        let mut w = CreditWindow::new(8192);
        assert_eq!(w.grant(u16::MAX), 8191);
        assert_eq!(w.grant(100), 0);
        assert!(w.outstanding() <= 8192);
        let mut small = CreditWindow::new(16);
        assert_eq!(small.grant(100), 15);
    }
}
