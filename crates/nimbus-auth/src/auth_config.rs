//! What the server tells clients about itself in a logon, and whom it
//! lets on as guest: the acceptor's settings, below both the acceptor and
//! the channel-binding checks that read them.

/// Names the server announces in its CHALLENGE (MS-NLMP 2.2.1.2 TargetInfo).
#[derive(Clone, Debug)]
pub struct AuthConfig {
    /// NetBIOS computer name (MsvAvNbComputerName, and the TargetName).
    pub netbios_computer: String,
    /// NetBIOS domain or workgroup name (MsvAvNbDomainName).
    pub netbios_domain: String,
    /// DNS computer name (MsvAvDnsComputerName).
    pub dns_computer: String,
    /// DNS domain name (MsvAvDnsDomainName).
    pub dns_domain: String,
    /// Map unknown users and anonymous logons to guest instead of refusing.
    pub allow_guest: bool,
    /// Further host names clients reach this server by (DNS aliases, names
    /// behind NAT), accepted in MsvAvTargetName like the names above.
    pub aliases: Vec<String>,
}
