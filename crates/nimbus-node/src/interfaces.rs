//! The network interfaces FSCTL_QUERY_NETWORK_INTERFACE_INFO lists (MS-SMB2
//! 3.3.5.15.11): the addresses of this host at which the server listens,
//! each with its interface's index, speed and RSS capability, as Linux
//! reports them (getifaddrs, /sys/class/net). A multichannel client picks
//! the channels it opens from this list, weighting them by speed.

use std::net::{IpAddr, SocketAddr};

use nimbus_wire::ioctl::NetworkInterface;

/// MS-SMB2 2.2.32.5 Capability: RSS_CAPABLE.
const RSS_CAPABLE: u32 = 0x1;
/// Reported when the kernel does not know an interface's speed (loopback,
/// virtual interfaces): what a client may assume of a server link.
const UNKNOWN_SPEED: u64 = 1_000_000_000;

/// One address of one interface of the host.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostAddress {
    pub interface: String,
    pub index: u32,
    pub addr: IpAddr,
    pub loopback: bool,
}

/// The interfaces to list for a client connected to `local`, for a server
/// listening on `listen`.
pub fn listed(listen: &[SocketAddr], local: IpAddr) -> Vec<NetworkInterface> {
    let mut out: Vec<NetworkInterface> = select(&host_addresses(), listen, local)
        .into_iter()
        .map(|a| NetworkInterface {
            if_index: a.index,
            capability: if rss_capable(&a.interface) {
                RSS_CAPABLE
            } else {
                0
            },
            link_speed: link_speed(&a.interface).unwrap_or(UNKNOWN_SPEED),
            addr: a.addr,
        })
        .collect();
    // Never an empty list: at least the address the client reached.
    if out.is_empty() {
        out.push(NetworkInterface {
            if_index: 1,
            capability: 0,
            link_speed: UNKNOWN_SPEED,
            addr: local,
        });
    }
    out
}

/// The addresses the server can be reached at: those it listens on, or
/// every address of the family of a wildcard listener. Loopback addresses
/// only for a client that came over loopback (no other can use them), and
/// no IPv6 link-local address (its scope means nothing to another host).
pub fn select(host: &[HostAddress], listen: &[SocketAddr], local: IpAddr) -> Vec<HostAddress> {
    let reachable = |a: &HostAddress| {
        listen.iter().any(|l| {
            l.ip() == a.addr || (l.ip().is_unspecified() && l.is_ipv4() == a.addr.is_ipv4())
        })
    };
    let link_local =
        |a: &IpAddr| matches!(a, IpAddr::V6(v6) if v6.segments()[0] & 0xFFC0 == 0xFE80);
    let mut out: Vec<HostAddress> = host
        .iter()
        .filter(|a| reachable(a))
        .filter(|a| !a.loopback || local.is_loopback())
        .filter(|a| !link_local(&a.addr))
        .cloned()
        .collect();
    out.dedup_by(|a, b| a.addr == b.addr);
    out
}

/// Every up address of the host (getifaddrs).
fn host_addresses() -> Vec<HostAddress> {
    let mut out = Vec::new();
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `head` with a list freed below.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return out;
    }
    let mut cur = head;
    while !cur.is_null() {
        // SAFETY: `cur` is a node of the list getifaddrs returned.
        let ifa = unsafe { &*cur };
        cur = ifa.ifa_next;
        let up = ifa.ifa_flags & libc::IFF_UP as u32 != 0;
        if !up || ifa.ifa_addr.is_null() || ifa.ifa_name.is_null() {
            continue;
        }
        // SAFETY: ifa_addr points at a sockaddr of the family it names.
        let addr = unsafe {
            match i32::from((*ifa.ifa_addr).sa_family) {
                libc::AF_INET => {
                    let sin = &*ifa.ifa_addr.cast::<libc::sockaddr_in>();
                    IpAddr::from(sin.sin_addr.s_addr.to_ne_bytes())
                }
                libc::AF_INET6 => {
                    let sin6 = &*ifa.ifa_addr.cast::<libc::sockaddr_in6>();
                    IpAddr::from(sin6.sin6_addr.s6_addr)
                }
                _ => continue,
            }
        };
        // SAFETY: ifa_name is a NUL-terminated string of the list.
        let name = unsafe { std::ffi::CStr::from_ptr(ifa.ifa_name) };
        // SAFETY: as above.
        let index = unsafe { libc::if_nametoindex(ifa.ifa_name) };
        out.push(HostAddress {
            interface: name.to_string_lossy().into_owned(),
            index,
            addr,
            loopback: ifa.ifa_flags & libc::IFF_LOOPBACK as u32 != 0,
        });
    }
    // SAFETY: the list getifaddrs gave, freed once.
    unsafe { libc::freeifaddrs(head) };
    out
}

/// The interface's speed in bits per second (the kernel gives Mb/s; -1 or
/// nothing when it does not know).
fn link_speed(interface: &str) -> Option<u64> {
    if interface.contains('/') || interface.starts_with('.') {
        return None;
    }
    let text = std::fs::read_to_string(format!("/sys/class/net/{interface}/speed")).ok()?;
    let mbps: i64 = text.trim().parse().ok()?;
    (mbps > 0).then(|| mbps as u64 * 1_000_000)
}

/// More than one receive queue: the NIC spreads connections over CPUs.
fn rss_capable(interface: &str) -> bool {
    if interface.contains('/') || interface.starts_with('.') {
        return false;
    }
    std::fs::read_dir(format!("/sys/class/net/{interface}/queues"))
        .map(|d| {
            d.filter_map(Result::ok)
                .filter(|e| e.file_name().to_string_lossy().starts_with("rx-"))
                .count()
                > 1
        })
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host() -> Vec<HostAddress> {
        let a = |interface: &str, index, addr: &str, loopback| HostAddress {
            interface: interface.into(),
            index,
            addr: addr.parse().unwrap(),
            loopback,
        };
        vec![
            a("lo", 1, "127.0.0.1", true),
            a("lo", 1, "::1", true),
            a("eth0", 2, "192.0.2.10", false),
            a("eth0", 2, "2001:db8::10", false),
            a("eth0", 2, "fe80::1", false),
            a("eth1", 3, "198.51.100.7", false),
        ]
    }

    fn addrs(v: Vec<HostAddress>) -> Vec<String> {
        v.into_iter().map(|a| a.addr.to_string()).collect()
    }

    #[test]
    fn a_specific_listener_lists_its_own_address() {
        let listen = ["192.0.2.10:445".parse().unwrap()];
        assert_eq!(
            addrs(select(&host(), &listen, "192.0.2.10".parse().unwrap())),
            ["192.0.2.10"]
        );
        let listen = ["127.0.0.1:4450".parse().unwrap()];
        assert_eq!(
            addrs(select(&host(), &listen, "127.0.0.1".parse().unwrap())),
            ["127.0.0.1"]
        );
    }

    #[test]
    fn a_wildcard_lists_every_address_of_its_family_but_loopback_and_link_local() {
        let listen = ["0.0.0.0:445".parse().unwrap(), "[::]:445".parse().unwrap()];
        assert_eq!(
            addrs(select(&host(), &listen, "192.0.2.10".parse().unwrap())),
            ["192.0.2.10", "2001:db8::10", "198.51.100.7"]
        );
        let listen = ["0.0.0.0:445".parse().unwrap()];
        // Loopback for a client that came over it.
        assert_eq!(
            addrs(select(&host(), &listen, "127.0.0.1".parse().unwrap())),
            ["127.0.0.1", "192.0.2.10", "198.51.100.7"]
        );
    }

    #[test]
    fn this_host_lists_the_loopback_address_it_listens_on() {
        let listen = ["127.0.0.1:4450".parse().unwrap()];
        let l = listed(&listen, "127.0.0.1".parse().unwrap());
        assert_eq!(l.len(), 1);
        assert_eq!(l[0].addr, "127.0.0.1".parse::<IpAddr>().unwrap());
        assert!(l[0].if_index > 0 && l[0].link_speed > 0);
    }
}
