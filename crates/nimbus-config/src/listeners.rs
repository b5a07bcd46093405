//! The server's listening TCP sockets come from four keys: `listen` (SMB),
//! `metrics.listen`, `witness.listen` and `witness.endpoint_mapper`. Two
//! of them on one address and port would fail only when the server binds
//! the second, after the first already serves (the node then exits), so
//! the configuration is refused instead, by `nimbus config check` and at
//! start, naming both keys.

use std::net::SocketAddr;

/// Whether two listening TCP sockets cannot both be bound: the same port
/// (not 0, which the kernel picks anew for each), and the same address or
/// an unspecified one that covers the other (0.0.0.0 covers IPv4; [::]
/// covers both families, as Linux binds it dual-stack by default,
/// net.ipv6.bindv6only = 0, and the server does not ask otherwise).
pub fn clash(a: SocketAddr, b: SocketAddr) -> bool {
    let covers =
        |x: SocketAddr, y: SocketAddr| x.ip().is_unspecified() && (x.is_ipv6() || y.is_ipv4());
    a.port() != 0 && a.port() == b.port() && (a.ip() == b.ip() || covers(a, b) || covers(b, a))
}

/// A listening address under the key that set it, e.g. `listen[0]`.
pub type Listener = (String, SocketAddr);

/// Two listeners that cannot both be bound, in the order given.
pub struct Clash<'a> {
    pub earlier: &'a Listener,
    pub later: &'a Listener,
}

/// Each later listener that clashes with an earlier one, with the first
/// earlier one it clashes with.
pub fn clashes(listeners: &[Listener]) -> Vec<Clash<'_>> {
    let mut found = Vec::new();
    for (i, later) in listeners.iter().enumerate() {
        let earlier = listeners[..i].iter().find(|e| clash(e.1, later.1));
        found.extend(earlier.map(|earlier| Clash { earlier, later }));
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn the_same_port_clashes_on_one_address_or_under_a_wildcard() {
        assert!(clash(a("127.0.0.1:445"), a("127.0.0.1:445")));
        assert!(clash(a("0.0.0.0:445"), a("127.0.0.1:445")));
        assert!(clash(a("192.0.2.1:445"), a("0.0.0.0:445")));
        assert!(clash(a("[::]:445"), a("127.0.0.1:445")));
        assert!(clash(a("[::1]:445"), a("[::]:445")));
    }

    #[test]
    fn other_ports_addresses_or_families_do_not() {
        assert!(!clash(a("127.0.0.1:445"), a("127.0.0.1:446")));
        assert!(!clash(a("127.0.0.1:445"), a("127.0.0.2:445")));
        assert!(!clash(a("0.0.0.0:445"), a("[::1]:445")));
        assert!(!clash(a("[::1]:445"), a("127.0.0.1:445")));
        assert!(!clash(a("127.0.0.1:0"), a("127.0.0.1:0")));
    }

    #[test]
    fn each_later_clash_is_named_once_with_the_first_it_meets() {
        let l = [
            ("listen[0]".to_string(), a("127.0.0.1:445")),
            ("metrics.listen".to_string(), a("127.0.0.1:9445")),
            ("witness.listen[0]".to_string(), a("0.0.0.0:445")),
        ];
        let named: Vec<_> = clashes(&l)
            .iter()
            .map(|c| (c.earlier.0.as_str(), c.later.0.as_str()))
            .collect();
        assert_eq!(named, [("listen[0]", "witness.listen[0]")]);
    }
}
