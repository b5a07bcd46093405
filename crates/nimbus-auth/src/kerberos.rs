//! Kerberos logons (MS-SMB2 3.3.5.5.3 with a Kerberos token, RFC 4121)
//! through the system's GSS-API (`nimbus-gssapi`): the acceptor's keys
//! come from a keytab, the client's principal is mapped to a user of the
//! user database, and the session key the two sides agreed on becomes the
//! SMB session key.

use std::collections::HashMap;
use std::sync::Arc;

use nimbus_gssapi::{AcceptContext, AcceptorCred, GssError};
use zeroize::Zeroizing;

use crate::userdb::UserDb;

/// How client principals become user names.
#[derive(Clone, Debug, Default)]
pub struct PrincipalMap {
    /// `principal@REALM` (case-insensitive) to user name; consulted first.
    pub explicit: HashMap<String, String>,
    /// Refuse principals the explicit map does not name, instead of
    /// taking `alice@REALM` for user `alice`.
    pub explicit_only: bool,
}

impl PrincipalMap {
    /// The user `principal` logs on as, before the database is asked
    /// whether that user exists. By name only in `home_realm` (the realm of
    /// the service principal): `alice@OTHER.REALM`, from a realm this one
    /// trusts, is not the local `alice` unless the explicit map says so. A
    /// principal with an instance (`alice/admin@REALM`) is never shortened
    /// to a user name either.
    pub fn user_for(&self, principal: &str, home_realm: &str) -> Option<String> {
        if let Some(u) = self
            .explicit
            .iter()
            .find(|(p, _)| p.eq_ignore_ascii_case(principal))
            .map(|(_, u)| u.clone())
        {
            return Some(u);
        }
        if self.explicit_only {
            return None;
        }
        let (name, realm) = principal.rsplit_once('@')?;
        (!name.is_empty() && !name.contains('/') && realm.eq_ignore_ascii_case(home_realm))
            .then(|| name.to_string())
    }
}

/// The Kerberos side of the acceptor.
pub struct KerberosAcceptor {
    cred: Arc<AcceptorCred>,
    /// Offer and accept NTLM besides Kerberos.
    pub ntlm: bool,
    map: PrincipalMap,
}

impl KerberosAcceptor {
    /// An acceptor with the keys of `keytab` for `principal` (any key of
    /// the keytab when None). Fails with the library's reason.
    pub fn new(
        keytab: &str,
        principal: Option<&str>,
        ntlm: bool,
        map: PrincipalMap,
    ) -> Result<KerberosAcceptor, GssError> {
        Ok(KerberosAcceptor {
            cred: AcceptorCred::from_keytab(keytab, principal)?,
            ntlm,
            map,
        })
    }

    pub(crate) fn context(&self) -> AcceptContext {
        AcceptContext::new(self.cred.clone())
    }

    /// The logon of an established context: its principal mapped to a
    /// user of `users`, and the keys; in FIPS mode only with an AES-256
    /// session key. Err: (principal, why refused).
    pub(crate) fn logon(
        &self,
        gss: &AcceptContext,
        users: &UserDb,
        fips: bool,
        rpc: bool,
    ) -> Result<KerberosLogon, (String, String)> {
        logon(gss, &self.map, users, fips, rpc)
    }
}

/// An established context's logon: who, and the keys.
pub(crate) struct KerberosLogon {
    pub user: String,
    pub realm: String,
    pub session_key: Zeroizing<[u8; 16]>,
    pub full_session_key: Zeroizing<Vec<u8>>,
    /// The ticket's remaining life; None when the library says indefinite.
    pub expires_in: Option<std::time::Duration>,
    /// The session key's type, for logs.
    pub key_type: String,
    /// Its RFC 3961 number, when the library names it.
    pub enctype: Option<i32>,
}

/// RFC 3962 / RFC 8009 AES-256 encryption types: aes256-cts-hmac-sha1-96
/// and aes256-cts-hmac-sha384-192.
const AES256_ENCTYPES: [i32; 2] = [18, 20];

/// A Kerberos encryption type's name (RFC 3961 and successors), for logs.
fn enctype_name(enctype: i32) -> &'static str {
    match enctype {
        1..=3 => "des",
        16 => "des3-cbc-sha1",
        17 => "aes128-cts-hmac-sha1-96",
        18 => "aes256-cts-hmac-sha1-96",
        19 => "aes128-cts-hmac-sha256-128",
        20 => "aes256-cts-hmac-sha384-192",
        23 => "rc4-hmac",
        24 => "rc4-hmac-exp",
        25 | 26 => "camellia",
        _ => "unknown",
    }
}

/// Why FIPS mode refuses a session key of `enctype` (None: it does not).
/// FIPS approves no RC4 and no DES, and the keys SMB derives from a
/// session key are only as strong as it: AES-256 only.
fn fips_refusal(enctype: Option<i32>) -> Option<String> {
    if enctype.is_some_and(|e| AES256_ENCTYPES.contains(&e)) {
        return None;
    }
    let what = enctype.map_or("of an unknown type".to_string(), |e| {
        format!("{} (enctype {e})", enctype_name(e))
    });
    Some(format!(
        "the ticket's session key is {what}; FIPS mode ([security] fips = true) accepts \
         AES-256 keys only (aes256-cts-hmac-sha1-96 or aes256-cts-hmac-sha384-192): give the \
         service principal AES-256 keys and let the client ask for them"
    ))
}

fn logon(
    gss: &AcceptContext,
    map: &PrincipalMap,
    users: &UserDb,
    fips: bool,
    rpc: bool,
) -> Result<KerberosLogon, (String, String)> {
    let principal = gss
        .client()
        .map_err(|e| (String::new(), format!("client principal unreadable: {e}")))?;
    let fail = |why: String| (principal.clone(), why);
    // Any key of the keytab decrypts tickets; only a file-service one is
    // for this server (a host/ key in the same keytab must not serve SMB).
    // DCE/RPC clients (the witness's) ask for host/ by default.
    let target = gss.target().map_err(|e| fail(e.to_string()))?;
    let lower = target.to_ascii_lowercase();
    if !(lower.starts_with("cifs/") || rpc && lower.starts_with("host/")) {
        let wanted = if rpc { "a cifs/ or host/" } else { "a cifs/" };
        return Err(fail(format!(
            "the ticket is for {target:?}, not {wanted} principal"
        )));
    }
    let home_realm = target.rsplit_once('@').map(|(_, r)| r).unwrap_or_default();
    let wanted = map
        .user_for(&principal, home_realm)
        .ok_or_else(|| fail("no user is mapped to this principal ([kerberos] user_map)".into()))?;
    let user = users
        .canonical_name(&wanted)
        .ok_or_else(|| fail(format!("user {wanted:?} is not in the user database")))?
        .to_string();
    let (full, enctype) = gss
        .session_key_and_enctype()
        .map_err(|e| fail(e.to_string()))?;
    if fips {
        if let Some(why) = fips_refusal(enctype) {
            return Err(fail(why));
        }
    }
    // MS-SMB2 3.3.5.5.3: the first 16 bytes, zero-padded if shorter.
    let mut key = Zeroizing::new([0u8; 16]);
    let n = full.len().min(16);
    key[..n].copy_from_slice(&full[..n]);
    let realm = principal
        .rsplit_once('@')
        .map(|(_, r)| r.to_string())
        .unwrap_or_default();
    // GSS_C_INDEFINITE (all ones) means no end.
    let life = gss.lifetime_secs();
    Ok(KerberosLogon {
        user,
        realm,
        session_key: key,
        full_session_key: full,
        expires_in: (life != u32::MAX).then(|| std::time::Duration::from_secs(life.into())),
        key_type: enctype.map_or("unknown".into(), |e| enctype_name(e).to_string()),
        enctype,
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn fips_takes_aes_256_session_keys_only() {
        use super::fips_refusal;
        assert_eq!(fips_refusal(Some(18)), None);
        assert_eq!(fips_refusal(Some(20)), None);
        assert!(fips_refusal(Some(23))
            .unwrap()
            .contains("rc4-hmac (enctype 23)"));
        assert!(fips_refusal(Some(17))
            .unwrap()
            .contains("aes128-cts-hmac-sha1-96 (enctype 17)"));
        assert!(fips_refusal(Some(1)).unwrap().contains("des (enctype 1)"));
        assert!(fips_refusal(None).unwrap().contains("of an unknown type"));
    }

    use super::*;

    #[test]
    fn principals_map_to_users_by_name_or_by_the_explicit_map() {
        const HOME: &str = "EXAMPLE.TEST";
        let mut map = PrincipalMap::default();
        assert_eq!(
            map.user_for("alice@EXAMPLE.TEST", HOME).as_deref(),
            Some("alice")
        );
        assert_eq!(
            map.user_for("alice@example.test", HOME).as_deref(),
            Some("alice")
        );
        // Another realm's alice is not ours.
        assert_eq!(map.user_for("alice@OTHER.TEST", HOME), None);
        assert_eq!(map.user_for("alice/admin@EXAMPLE.TEST", HOME), None);
        assert_eq!(map.user_for("@EXAMPLE.TEST", HOME), None);
        assert_eq!(map.user_for("noatsign", HOME), None);
        map.explicit
            .insert("Alice/Admin@EXAMPLE.TEST".into(), "root-ish".into());
        assert_eq!(
            map.user_for("alice/admin@example.test", HOME).as_deref(),
            Some("root-ish")
        );
        map.explicit_only = true;
        map.explicit
            .insert("carol@OTHER.TEST".into(), "carol".into());
        assert_eq!(
            map.user_for("carol@OTHER.TEST", HOME).as_deref(),
            Some("carol")
        );
        assert_eq!(map.user_for("bob@EXAMPLE.TEST", HOME), None);
    }
}
