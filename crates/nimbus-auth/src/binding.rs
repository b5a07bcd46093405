//! Relay protection: where the client meant its NTLM credentials to go.
//!
//! The AV pairs of the client's NTLMv2 blob are covered by NTProofStr
//! (MS-NLMP 3.3.2), so a relay cannot change them. Two of them name the
//! client's destination (MS-NLMP 2.2.2.1): MsvAvTargetName, the SPN the
//! client was talking to, and MsvAvChannelBindings, a hash of the TLS
//! channel it was talking over. A server checks them when present (MS-NLMP
//! 3.2.5.1.2, the ServerChannelBindings and target-name checks of extended
//! protection). An NTLM exchange relayed to Nimbus from a victim talking to
//! another service (HTTP/intranet.example, ldap/dc.example, cifs/attacker)
//! carries that service's name or channel, and is refused.
//!
//! The rule for MsvAvTargetName (SPN syntax `class/host[:port][/name]`):
//! - absent or empty: accepted. MS-NLMP makes it optional and not every
//!   client sends one (pyspnego sends "" without a host name).
//! - the service class must be `cifs` or `host` (Windows' alias for every
//!   service of a machine), in any case. Any other class (HTTP, ldap,
//!   MSSQLSvc, ...) is foreign and refused. A value without '/' is taken as
//!   a bare host name.
//! - the host must be this server: case-insensitively, the configured
//!   `server_name` (as NetBIOS name, as DNS name, and with the DNS domain
//!   when one is configured), the machine's host name as the kernel has it
//!   (and its first label, when that is a full DNS name), `localhost`, or an
//!   IP address literal equal to the local address of the connection (the
//!   listen address the client reached; the concrete address under a
//!   wildcard listener, so it covers every listen address) or listed in
//!   `server_aliases` (the address of a load balancer in front of a
//!   cluster, or a NAT's). An empty host
//!   ("cifs/") is accepted like an empty name.
//! - anything else is refused. A DNS name whose first label alone matches
//!   is refused too, because anyone can name their host
//!   `nimbus.evil.example`; a DNS alias or a NAT address of this server is
//!   refused until `server_name` or `server_aliases` names it.
//!
//! What real clients send, measured against this server on 127.0.0.1:
//! Debian's smbclient 4.17 sends "cifs/127.0.0.1" and sixteen zero bytes of
//! channel bindings; Python smbprotocol (pyspnego) sends "cifs/127.0.0.1"
//! and no channel bindings.
//!
//! MsvAvChannelBindings: SMB runs over no TLS channel, so the only values
//! that mean "no channel" are accepted: all zero (MS-NLMP 2.2.2.1), or the
//! MD5 of an empty gss_channel_bindings_struct (RFC 2744 3.11, five zero
//! 32-bit fields), which some GSS libraries send for "no bindings". Any
//! other value binds the logon to a TLS channel elsewhere.

use std::net::IpAddr;

use nimbus_crypto::NtlmPrimitives;

use crate::auth_config::AuthConfig;

/// Service classes that name an SMB server (MS-SMB2 3.2.4.2.3 uses "cifs";
/// "host" is the Windows alias every machine service answers to).
const SMB_SERVICE_CLASSES: [&str; 2] = ["cifs", "host"];

/// The host names this server answers to, lower case.
#[derive(Debug, Clone)]
pub(crate) struct ServerNames {
    hosts: Vec<String>,
    /// Aliases that are IP address literals: addresses clients reach this
    /// server by that are not its own (a load balancer's, a NAT's).
    addresses: Vec<IpAddr>,
}

impl ServerNames {
    /// Names from the configuration, the machine's host name (if known)
    /// and `localhost`.
    pub(crate) fn new(config: &AuthConfig, system_host_name: Option<&str>) -> ServerNames {
        let mut hosts = vec!["localhost".to_string()];
        let mut add = |name: &str| {
            let n = name.trim().trim_end_matches('.').to_lowercase();
            if !n.is_empty() && !hosts.contains(&n) {
                hosts.push(n);
            }
        };
        add(&config.netbios_computer);
        add(&config.dns_computer);
        if !config.dns_computer.is_empty() && !config.dns_domain.is_empty() {
            add(&format!("{}.{}", config.dns_computer, config.dns_domain));
        }
        let mut addresses = Vec::new();
        for alias in &config.aliases {
            let bare = alias.trim().trim_start_matches('[').trim_end_matches(']');
            match bare.parse::<IpAddr>() {
                Ok(ip) => addresses.push(ip.to_canonical()),
                Err(_) => add(alias),
            }
        }
        if let Some(h) = system_host_name {
            add(h);
            if let Some((first, _)) = h.split_once('.') {
                add(first);
            }
        }
        ServerNames { hosts, addresses }
    }

    /// The machine's host name, as the kernel has it (Linux); None where
    /// it cannot be read.
    pub(crate) fn system_host_name() -> Option<String> {
        let raw = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .or_else(|_| std::fs::read_to_string("/etc/hostname"))
            .ok()?;
        let name = raw.trim();
        (!name.is_empty()).then(|| name.to_string())
    }

    fn is_ours(&self, host: &str, local: Option<IpAddr>) -> bool {
        let bare = host
            .strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
            .unwrap_or(host);
        if let Ok(ip) = bare.parse::<IpAddr>() {
            let ip = ip.to_canonical();
            return local.is_some_and(|l| l.to_canonical() == ip) || self.addresses.contains(&ip);
        }
        let h = host.trim_end_matches('.').to_lowercase();
        self.hosts.contains(&h)
    }

    /// Checks an MsvAvTargetName value (see the module comment for the
    /// rule); `local` is the address the client connected to.
    pub(crate) fn check_target_name(
        &self,
        spn: &str,
        local: Option<IpAddr>,
    ) -> Result<(), &'static str> {
        let Some((class, host)) = spn_parts(spn) else {
            return Ok(());
        };
        if let Some(class) = class {
            if !SMB_SERVICE_CLASSES
                .iter()
                .any(|c| c.eq_ignore_ascii_case(class))
            {
                return Err("MsvAvTargetName names another service than SMB (cifs/host)");
            }
        }
        if host.is_empty() || self.is_ours(host, local) {
            Ok(())
        } else {
            Err("MsvAvTargetName names a host that is not this server")
        }
    }
}

/// Splits an SPN `class/instance[:port][/service-name]` into its class and
/// host; a value without '/' is a bare host. None for an empty value.
fn spn_parts(spn: &str) -> Option<(Option<&str>, &str)> {
    if spn.is_empty() {
        return None;
    }
    let (class, rest) = match spn.split_once('/') {
        Some((c, r)) => (Some(c), r),
        None => (None, spn),
    };
    // IPv6 literals hold ':' but never '/'.
    let instance = rest.split('/').next().unwrap_or("");
    if instance.starts_with('[') {
        // [v6]:port
        let end = instance.find(']').map_or(instance.len(), |i| i + 1);
        return Some((class, &instance[..end]));
    }
    if instance.parse::<std::net::Ipv6Addr>().is_ok() {
        return Some((class, instance));
    }
    let host = match instance.rsplit_once(':') {
        Some((h, port)) if !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit()) => h,
        _ => instance,
    };
    Some((class, host))
}

/// Checks an MsvAvChannelBindings value (see the module comment).
pub(crate) fn check_channel_bindings(
    ntlm: &dyn NtlmPrimitives,
    value: &[u8],
) -> Result<(), &'static str> {
    if value.len() != 16 {
        return Err("MsvAvChannelBindings is not 16 bytes");
    }
    if value.iter().all(|&b| b == 0) {
        return Ok(());
    }
    // RFC 2744 3.11 gss_channel_bindings_struct with every field empty, as
    // MS-NLMP hashes it: initiator addrtype and length, acceptor addrtype
    // and length, application data length.
    if ntlm.md5(&[&[0u8; 20]])[..] == *value {
        return Ok(());
    }
    Err("the client bound its logon to a TLS channel (MsvAvChannelBindings) and SMB has none")
}

#[cfg(test)]
mod tests {
    use super::*;
    use nimbus_crypto::CryptoProvider;
    use std::net::{Ipv4Addr, Ipv6Addr};

    fn names() -> ServerNames {
        let config = AuthConfig {
            netbios_computer: "NIMBUS".into(),
            netbios_domain: "WORKGROUP".into(),
            dns_computer: "nimbus".into(),
            dns_domain: "corp.example".into(),
            allow_guest: false,
            aliases: vec![
                "Files.Corp.Example".into(),
                "192.0.2.7".into(),
                "[2001:db8::7]".into(),
            ],
        };
        ServerNames::new(&config, Some("fileserver.lab.example"))
    }

    const LOOPBACK: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

    #[test]
    fn smb_names_of_this_server_are_accepted() {
        let n = names();
        let local = Some(LOOPBACK);
        for spn in [
            "",
            "cifs/",
            "cifs/127.0.0.1",
            "CIFS/127.0.0.1",
            "cifs/127.0.0.1:445",
            "cifs/localhost",
            "cifs/NIMBUS",
            "host/nimbus",
            "cifs/nimbus.corp.example",
            "cifs/nimbus.corp.example.",
            "cifs/FileServer",
            "cifs/fileserver.lab.example",
            "cifs/files.corp.example",
            "cifs/192.0.2.7",
            "cifs/[2001:db8::7]:445",
            "cifs/nimbus/ignored-service-name",
            "NIMBUS",
        ] {
            assert_eq!(n.check_target_name(spn, local), Ok(()), "{spn:?}");
        }
        let v6 = Some(IpAddr::V6(Ipv6Addr::LOCALHOST));
        for spn in ["cifs/::1", "cifs/[::1]", "cifs/[::1]:445"] {
            assert_eq!(n.check_target_name(spn, v6), Ok(()), "{spn:?}");
        }
        // An IPv4 client of a dual-stack listener.
        let mapped = Some(IpAddr::V6(Ipv4Addr::LOCALHOST.to_ipv6_mapped()));
        assert_eq!(n.check_target_name("cifs/127.0.0.1", mapped), Ok(()));
    }

    #[test]
    fn foreign_services_and_hosts_are_refused() {
        let n = names();
        let local = Some(LOOPBACK);
        for spn in [
            "HTTP/evil.example",
            "HTTP/127.0.0.1",
            "ldap/nimbus",
            "MSSQLSvc/nimbus:1433",
            "cifs/evil.example",
            "cifs/nimbus.evil.example",
            "cifs/10.0.0.9",
            "cifs/127.0.0.2",
            "cifs/unspecified",
            "host/attacker",
            "cifs/[::2]",
            "cifs/nimbus:",
            "cifs/192.0.2.8",
        ] {
            assert!(n.check_target_name(spn, local).is_err(), "{spn:?}");
        }
        // Without the connection's address no IP literal is ours.
        assert!(n.check_target_name("cifs/127.0.0.1", None).is_err());
    }

    #[test]
    fn channel_bindings() {
        let p = CryptoProvider::default_provider();
        let ntlm = p.ntlm().unwrap();
        assert_eq!(check_channel_bindings(ntlm, &[0; 16]), Ok(()));
        let empty_struct = ntlm.md5(&[&[0u8; 20]]);
        assert_eq!(check_channel_bindings(ntlm, &empty_struct), Ok(()));
        let tls = ntlm.md5(&[b"tls-server-end-point:0123456789"]);
        assert!(check_channel_bindings(ntlm, &tls).is_err());
        assert!(check_channel_bindings(ntlm, &[0; 15]).is_err());
    }
}
