//! Which new connections are accepted: at most so many in total, per
//! client address, and without a logged-on session. A connection holds a
//! `ConnectionSlot` for its life; dropping it gives the counts back.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use crate::limits::Limits;
use crate::session::lock;

#[derive(Default)]
struct Counts {
    total: usize,
    unauthenticated: usize,
    per_address: HashMap<IpAddr, usize>,
}

#[derive(Default)]
pub struct Admission {
    counts: Mutex<Counts>,
}

/// Why a connection was turned away (for the log).
#[derive(Debug, PartialEq, Eq)]
pub enum Refused {
    Total(usize),
    Address(usize),
    Unauthenticated(usize),
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refused::Total(n) => write!(f, "{n} connections open (limits.max_connections)"),
            Refused::Address(n) => write!(
                f,
                "{n} connections open from this address (limits.max_connections_per_address)"
            ),
            Refused::Unauthenticated(n) => write!(
                f,
                "{n} connections have not logged on yet (limits.max_unauthenticated_connections)"
            ),
        }
    }
}

pub struct ConnectionSlot {
    admission: Arc<Admission>,
    addr: IpAddr,
    unauthenticated: AtomicBool,
}

impl Admission {
    pub fn admit(
        self: &Arc<Self>,
        addr: IpAddr,
        limits: &Limits,
    ) -> Result<ConnectionSlot, Refused> {
        let mut c = lock(&self.counts);
        if c.total >= limits.max_connections {
            return Err(Refused::Total(c.total));
        }
        let from_addr = c.per_address.get(&addr).copied().unwrap_or(0);
        if from_addr >= limits.max_connections_per_address {
            return Err(Refused::Address(from_addr));
        }
        if c.unauthenticated >= limits.max_unauthenticated_connections {
            return Err(Refused::Unauthenticated(c.unauthenticated));
        }
        c.total += 1;
        c.unauthenticated += 1;
        *c.per_address.entry(addr).or_insert(0) += 1;
        Ok(ConnectionSlot {
            admission: self.clone(),
            addr,
            unauthenticated: AtomicBool::new(true),
        })
    }

    /// (total, unauthenticated) connections now.
    pub fn counts(&self) -> (usize, usize) {
        let c = lock(&self.counts);
        (c.total, c.unauthenticated)
    }
}

impl ConnectionSlot {
    /// A session of this connection logged on: it no longer counts as
    /// unauthenticated.
    pub fn logged_on(&self) {
        if self.unauthenticated.swap(false, Ordering::SeqCst) {
            lock(&self.admission.counts).unauthenticated -= 1;
        }
    }

    pub fn is_logged_on(&self) -> bool {
        !self.unauthenticated.load(Ordering::SeqCst)
    }
}

impl Drop for ConnectionSlot {
    fn drop(&mut self) {
        let mut c = lock(&self.admission.counts);
        c.total -= 1;
        if self.unauthenticated.load(Ordering::SeqCst) {
            c.unauthenticated -= 1;
        }
        if let Some(n) = c.per_address.get_mut(&self.addr) {
            *n -= 1;
            if *n == 0 {
                c.per_address.remove(&self.addr);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_limits_and_release() {
        let limits = Limits {
            max_connections: 3,
            max_connections_per_address: 2,
            max_unauthenticated_connections: 2,
            ..Limits::default()
        };
        let a: IpAddr = "127.0.0.1".parse().unwrap();
        let b: IpAddr = "127.0.0.2".parse().unwrap();
        let adm = Arc::new(Admission::default());
        let s1 = adm.admit(a, &limits).unwrap();
        let s2 = adm.admit(a, &limits).unwrap();
        assert_eq!(
            adm.admit(b, &limits).err(),
            Some(Refused::Unauthenticated(2))
        );
        s1.logged_on();
        s1.logged_on();
        assert_eq!(adm.admit(a, &limits).err(), Some(Refused::Address(2)));
        let s3 = adm.admit(b, &limits).unwrap();
        s3.logged_on();
        assert_eq!(adm.admit(b, &limits).err(), Some(Refused::Total(3)));
        drop(s2);
        assert_eq!(adm.counts(), (2, 0));
        drop((s1, s3));
        assert_eq!(adm.counts(), (0, 0));
        assert!(lock(&adm.counts).per_address.is_empty());
    }
}
