//! Which new connections are accepted: at most so many in total, per
//! client address, and without a logged-on session. A connection holds a
//! `ConnectionSlot` for its life; dropping it gives the counts back.
//!
//! **Fair under a flood.** When the total or the not-logged-on limit is
//! reached, a new connection is not simply refused: the oldest connection
//! that has not logged on, of the network (a /24 for IPv4, a /64 for IPv6)
//! that holds the most such connections, is closed to make room. Idle
//! connections from a few networks then cannot lock out clients from
//! others: each newcomer pushes out the flood's oldest, never a client that
//! logged on. The limit per address still refuses outright.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

use crate::limits::Limits;
use crate::sync::lock;

/// The network an address counts against: its /24 (IPv4, IPv4-mapped
/// IPv6 included) or /64 (IPv6).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Network(IpAddr);

impl Network {
    pub fn of(addr: IpAddr) -> Network {
        match addr.to_canonical() {
            IpAddr::V4(v4) => {
                let [a, b, c, _] = v4.octets();
                Network(IpAddr::from([a, b, c, 0]))
            }
            IpAddr::V6(v6) => {
                let s = v6.segments();
                Network(IpAddr::from([s[0], s[1], s[2], s[3], 0, 0, 0, 0]))
            }
        }
    }
}

impl std::fmt::Display for Network {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            IpAddr::V4(a) => write!(f, "{a}/24"),
            IpAddr::V6(a) => write!(f, "{a}/64"),
        }
    }
}

/// Where a slot is in its life; changed only under `Admission::counts`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// Counted as not logged on, and listed in `Counts::waiting`.
    Unauthenticated,
    LoggedOn,
    /// Closed to make room: its counts were given back when it was chosen.
    Evicted,
}

/// A connection that has not logged on, in order of arrival.
struct Waiting {
    network: Network,
    evict: Arc<Notify>,
    state: Arc<Mutex<State>>,
}

#[derive(Default)]
struct Counts {
    total: usize,
    unauthenticated: usize,
    per_address: HashMap<IpAddr, usize>,
    /// Not-logged-on connections per network.
    per_network: HashMap<Network, usize>,
    /// Not-logged-on connections by arrival number, oldest first.
    waiting: BTreeMap<u64, Waiting>,
    next: u64,
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
            Refused::Total(n) => write!(
                f,
                "{n} connections open, all logged on (limits.max_connections)"
            ),
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
    id: u64,
    state: Arc<Mutex<State>>,
    evict: Arc<Notify>,
}

impl Admission {
    pub fn admit(
        self: &Arc<Self>,
        addr: IpAddr,
        limits: &Limits,
    ) -> Result<ConnectionSlot, Refused> {
        let mut c = lock(&self.counts);
        let from_addr = c.per_address.get(&addr).copied().unwrap_or(0);
        if from_addr >= limits.max_connections_per_address {
            return Err(Refused::Address(from_addr));
        }
        if c.total >= limits.max_connections && !c.make_room() {
            return Err(Refused::Total(c.total));
        }
        if c.unauthenticated >= limits.max_unauthenticated_connections && !c.make_room() {
            return Err(Refused::Unauthenticated(c.unauthenticated));
        }
        let network = Network::of(addr);
        c.total += 1;
        c.unauthenticated += 1;
        *c.per_address.entry(addr).or_insert(0) += 1;
        *c.per_network.entry(network).or_insert(0) += 1;
        let id = c.next;
        c.next += 1;
        let state = Arc::new(Mutex::new(State::Unauthenticated));
        let evict = Arc::new(Notify::new());
        c.waiting.insert(
            id,
            Waiting {
                network,
                evict: evict.clone(),
                state: state.clone(),
            },
        );
        crate::metrics::connections(c.total, c.unauthenticated);
        Ok(ConnectionSlot {
            admission: self.clone(),
            addr,
            id,
            state,
            evict,
        })
    }

    /// Logs a refusal: the first, then at most one line per reason and
    /// interval with the number refused since (`crate::log_limit`), so
    /// that a flood does not flood the log.
    pub fn log_refusal(&self, peer: std::net::SocketAddr, why: &Refused) {
        let limit = match why {
            Refused::Total(_) => "max_connections",
            Refused::Address(_) => "max_connections_per_address",
            Refused::Unauthenticated(_) => "max_unauthenticated_connections",
        };
        crate::metrics::refused(limit);
        if let Some(n) = crate::log_limit::occurred(limit) {
            if n == 1 {
                tracing::warn!("connection from {peer} refused: {why}");
            } else {
                tracing::warn!("{n} connections refused, the last from {peer}: {why}");
            }
        }
    }

    /// (total, unauthenticated) connections now.
    pub fn counts(&self) -> (usize, usize) {
        let c = lock(&self.counts);
        (c.total, c.unauthenticated)
    }
}

impl Counts {
    /// Closes the oldest not-logged-on connection of the network holding
    /// the most of them, and gives its counts back at once; false when no
    /// connection waits to log on.
    fn make_room(&mut self) -> bool {
        let Some(held) = self.per_network.values().copied().max() else {
            return false;
        };
        // Oldest first: among networks that hold as many, the one whose
        // connection has waited longest.
        let Some((id, network)) = self
            .waiting
            .iter()
            .find(|(_, w)| self.per_network.get(&w.network) == Some(&held))
            .map(|(id, w)| (*id, w.network))
        else {
            return false;
        };
        let Some(w) = self.waiting.remove(&id) else {
            return false;
        };
        *lock(&w.state) = State::Evicted;
        w.evict.notify_one();
        // Its address's count goes with it; which address it was is the
        // slot's, so the slot's drop leaves per_address alone (`Evicted`).
        self.total -= 1;
        self.unauthenticated -= 1;
        self.forget_network(network);
        crate::metrics::evicted();
        crate::metrics::connections(self.total, self.unauthenticated);
        if let Some(n) = crate::log_limit::occurred("evicted") {
            tracing::warn!(
                "closed {n} connection(s) that had not logged on, to admit new ones \
                 (limits.max_connections / limits.max_unauthenticated_connections reached); \
                 the oldest of the network holding the most go first, now {network} with {held}"
            );
        }
        true
    }

    fn forget_network(&mut self, network: Network) {
        if let Some(n) = self.per_network.get_mut(&network) {
            *n -= 1;
            if *n == 0 {
                self.per_network.remove(&network);
            }
        }
    }

    fn forget_address(&mut self, addr: IpAddr) {
        if let Some(n) = self.per_address.get_mut(&addr) {
            *n -= 1;
            if *n == 0 {
                self.per_address.remove(&addr);
            }
        }
    }
}

impl ConnectionSlot {
    /// A session of this connection logged on: it no longer counts as
    /// unauthenticated, and is never closed to make room.
    pub fn logged_on(&self) {
        let mut c = lock(&self.admission.counts);
        let mut state = lock(&self.state);
        if *state == State::Unauthenticated {
            *state = State::LoggedOn;
            drop(state);
            c.waiting.remove(&self.id);
            c.unauthenticated -= 1;
            c.forget_network(Network::of(self.addr));
            crate::metrics::connections(c.total, c.unauthenticated);
        }
    }

    pub fn is_logged_on(&self) -> bool {
        *lock(&self.state) == State::LoggedOn
    }

    /// Resolves once this connection was chosen to be closed to make room
    /// for a new one.
    pub async fn evicted(&self) {
        self.evict.notified().await;
    }
}

impl Drop for ConnectionSlot {
    fn drop(&mut self) {
        let mut c = lock(&self.admission.counts);
        let state = *lock(&self.state);
        match state {
            State::Unauthenticated => {
                c.waiting.remove(&self.id);
                c.unauthenticated -= 1;
                c.total -= 1;
                c.forget_network(Network::of(self.addr));
            }
            State::LoggedOn => c.total -= 1,
            State::Evicted => {}
        }
        c.forget_address(self.addr);
        crate::metrics::connections(c.total, c.unauthenticated);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn counts_limits_and_release() {
        let limits = Limits {
            max_connections: 3,
            max_connections_per_address: 2,
            max_unauthenticated_connections: 2,
            ..Limits::default()
        };
        let a = ip("127.0.0.1");
        let b = ip("127.0.1.2");
        let adm = Arc::new(Admission::default());
        let s1 = adm.admit(a, &limits).unwrap();
        s1.logged_on();
        s1.logged_on();
        assert!(s1.is_logged_on());
        assert_eq!(adm.counts(), (1, 0));
        let s2 = adm.admit(a, &limits).unwrap();
        assert_eq!(adm.admit(a, &limits).err(), Some(Refused::Address(2)));
        let s3 = adm.admit(b, &limits).unwrap();
        assert_eq!(adm.counts(), (3, 2));
        // Full: two networks hold one each; the older connection goes.
        let s4 = adm.admit(ip("10.0.0.1"), &limits).unwrap();
        assert_eq!(*lock(&s2.state), State::Evicted);
        assert_eq!(*lock(&s3.state), State::Unauthenticated);
        assert_eq!(adm.counts(), (3, 2));
        drop((s2, s3, s4));
        assert_eq!(adm.counts(), (1, 0));
        drop(s1);
        assert_eq!(adm.counts(), (0, 0));
        assert!(lock(&adm.counts).per_address.is_empty());
    }

    #[test]
    fn the_limit_per_address_refuses_outright() {
        let limits = Limits {
            max_connections_per_address: 2,
            ..Limits::default()
        };
        let adm = Arc::new(Admission::default());
        let a = ip("192.0.2.1");
        let _s = [
            adm.admit(a, &limits).unwrap(),
            adm.admit(a, &limits).unwrap(),
        ];
        assert_eq!(adm.admit(a, &limits).err(), Some(Refused::Address(2)));
        assert!(adm.admit(ip("192.0.2.2"), &limits).is_ok());
    }

    #[test]
    fn a_flood_from_some_networks_gives_way_to_a_newcomer_from_another() {
        let limits = Limits {
            max_unauthenticated_connections: 4,
            ..Limits::default()
        };
        let adm = Arc::new(Admission::default());
        // Two networks fill the limit, 10.1.1.0/24 with three.
        let f1 = adm.admit(ip("10.1.1.1"), &limits).unwrap();
        let f2 = adm.admit(ip("10.2.2.1"), &limits).unwrap();
        let f3 = adm.admit(ip("10.1.1.2"), &limits).unwrap();
        let f4 = adm.admit(ip("10.1.1.3"), &limits).unwrap();
        let newcomer = adm.admit(ip("192.0.2.7"), &limits).unwrap();
        // The oldest of the network holding the most made room.
        assert_eq!(*lock(&f1.state), State::Evicted);
        for other in [&f2, &f3, &f4, &newcomer] {
            assert_eq!(*lock(&other.state), State::Unauthenticated);
        }
        assert_eq!(adm.counts(), (4, 4));
        // Its eviction is signalled to its connection.
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        rt.block_on(f1.evicted());
        // The evicted slot's drop gives nothing back twice.
        drop(f1);
        assert_eq!(adm.counts(), (4, 4));
        drop((f2, f3, f4, newcomer));
        assert_eq!(adm.counts(), (0, 0));
        let c = lock(&adm.counts);
        assert!(c.per_address.is_empty() && c.per_network.is_empty() && c.waiting.is_empty());
    }

    #[test]
    fn a_logged_on_connection_is_never_closed_for_room() {
        let limits = Limits {
            max_connections: 2,
            ..Limits::default()
        };
        let adm = Arc::new(Admission::default());
        let s1 = adm.admit(ip("10.0.0.1"), &limits).unwrap();
        let s2 = adm.admit(ip("10.0.0.2"), &limits).unwrap();
        s1.logged_on();
        s2.logged_on();
        assert_eq!(
            adm.admit(ip("10.9.0.1"), &limits).err(),
            Some(Refused::Total(2))
        );
        // One not logged on: the total limit makes room by closing it.
        drop(s2);
        let s3 = adm.admit(ip("10.0.0.3"), &limits).unwrap();
        let s4 = adm.admit(ip("10.9.0.1"), &limits).unwrap();
        assert_eq!(*lock(&s3.state), State::Evicted);
        assert_eq!(*lock(&s1.state), State::LoggedOn);
        drop((s1, s3, s4));
        assert_eq!(adm.counts(), (0, 0));
    }

    #[test]
    fn networks_are_a_24_or_a_64() {
        assert_eq!(Network::of(ip("192.0.2.200")), Network::of(ip("192.0.2.1")));
        assert_ne!(Network::of(ip("192.0.3.1")), Network::of(ip("192.0.2.1")));
        assert_eq!(
            Network::of(ip("::ffff:192.0.2.9")),
            Network::of(ip("192.0.2.1"))
        );
        assert_eq!(
            Network::of(ip("2001:db8:1:2::5")),
            Network::of(ip("2001:db8:1:2:ffff::1"))
        );
        assert_ne!(
            Network::of(ip("2001:db8:1:3::5")),
            Network::of(ip("2001:db8:1:2::5"))
        );
        assert_eq!(
            Network::of(ip("2001:db8:1:2::5")).to_string(),
            "2001:db8:1:2::/64"
        );
        assert_eq!(Network::of(ip("192.0.2.9")).to_string(), "192.0.2.0/24");
    }
}
