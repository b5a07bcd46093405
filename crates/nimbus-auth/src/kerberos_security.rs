//! Per-message protection of a Kerberos logon (RFC 4121 4.2: MIC and wrap
//! tokens), for DCE/RPC's integrity and privacy levels (MS-RPCE 3.3.1.5.2).
//! The tokens are the system GSS-API's (`nimbus-gssapi`); this module only
//! says which lengths DCE/RPC must reserve for them and keeps the context
//! that an SMB logon drops once its session key is read.

use std::fmt;

use nimbus_gssapi::{
    AcceptContext, GSS_C_CONF_FLAG, GSS_C_DCE_STYLE, GSS_C_REPLAY_FLAG, GSS_C_SEQUENCE_FLAG,
};

use crate::BadSignature;

/// The signing and sealing context of a completed Kerberos logon.
pub struct KerberosSessionSecurity {
    gss: AcceptContext,
    /// The length of a MIC token of the session key's type: DCE/RPC puts
    /// it in the PDU header before the token is made.
    mic_len: Option<usize>,
}

impl fmt::Debug for KerberosSessionSecurity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KerberosSessionSecurity")
            .field("mic_len", &self.mic_len)
            .field("flags", &format_args!("{:#x}", self.gss.flags()))
            .finish()
    }
}

/// RFC 4121 4.2.6.1: a MIC token is a 16-byte header and the checksum,
/// whose length the encryption type sets (RFC 3962: 12 bytes for the
/// SHA-1 types; RFC 8009: 16 and 24 for the SHA-2 ones). The older types'
/// tokens (RFC 4757 RC4, 32 bytes) are not offered here: a client with
/// such a key stays at the connect level.
fn mic_len_of(enctype: Option<i32>) -> Option<usize> {
    match enctype? {
        17 | 18 => Some(28),
        19 => Some(32),
        20 => Some(40),
        _ => None,
    }
}

impl KerberosSessionSecurity {
    pub(crate) fn new(gss: AcceptContext, enctype: Option<i32>) -> KerberosSessionSecurity {
        KerberosSessionSecurity {
            gss,
            mic_len: mic_len_of(enctype),
        }
    }

    /// The length of this context's MIC tokens; None when its key type has
    /// no per-message protection here.
    pub fn mic_len(&self) -> Option<usize> {
        self.mic_len
    }

    /// The client asked for replay and sequence detection, without which
    /// a token captured once verifies again (Windows and Samba ask).
    pub fn detects_replays(&self) -> bool {
        let f = self.gss.flags();
        f & GSS_C_REPLAY_FLAG != 0 && f & GSS_C_SEQUENCE_FLAG != 0
    }

    /// The client asked for the DCE style (three legs, wrap tokens in
    /// DCE/RPC's layout) and for confidentiality: sealing is possible.
    pub fn can_seal(&self) -> bool {
        let f = self.gss.flags();
        f & GSS_C_DCE_STYLE != 0 && f & GSS_C_CONF_FLAG != 0
    }

    /// A MIC over `message`.
    pub fn sign(&self, message: &[u8]) -> Result<Vec<u8>, BadSignature> {
        let mic = self.gss.get_mic(message).map_err(logged)?;
        if Some(mic.len()) != self.mic_len {
            tracing::warn!(
                "gss_get_mic made {} bytes, not {:?}",
                mic.len(),
                self.mic_len
            );
            return Err(BadSignature);
        }
        Ok(mic)
    }

    /// Checks the client's MIC over `message`.
    pub fn verify(&self, message: &[u8], mic: &[u8]) -> Result<(), BadSignature> {
        self.gss.verify_mic(message, mic).map_err(logged)
    }

    /// The length of the token sealing `data_len` bytes makes.
    pub fn seal_len(&self, data_len: usize) -> Result<usize, BadSignature> {
        self.gss.seal_dce_len(data_len).map_err(logged)
    }

    /// Seals `data` in place; `before` and `after` are covered, not
    /// encrypted; `token` (of [`Self::seal_len`] bytes) receives the token.
    pub fn seal(
        &self,
        before: &[u8],
        data: &mut [u8],
        after: &[u8],
        token: &mut [u8],
    ) -> Result<(), BadSignature> {
        self.gss
            .seal_dce(before, data, after, token)
            .map_err(logged)
    }

    /// Checks the client's token over `before`, `data` and `after`, and
    /// unseals `data` in place.
    pub fn unseal(
        &self,
        before: &[u8],
        data: &mut [u8],
        after: &[u8],
        token: &mut [u8],
    ) -> Result<(), BadSignature> {
        self.gss
            .unseal_dce(before, data, after, token)
            .map_err(logged)
    }
}

/// A refusal of the library's, logged with its reason (a token that did
/// not verify names the cause: "Bad integrity", "Token replayed", ...).
fn logged(e: nimbus_gssapi::GssError) -> BadSignature {
    tracing::info!("Kerberos per-message token: {e}");
    BadSignature
}

#[cfg(test)]
mod tests {
    use super::mic_len_of;

    #[test]
    fn mic_lengths_follow_the_key_type() {
        assert_eq!(mic_len_of(Some(18)), Some(28));
        assert_eq!(mic_len_of(Some(17)), Some(28));
        assert_eq!(mic_len_of(Some(19)), Some(32));
        assert_eq!(mic_len_of(Some(20)), Some(40));
        assert_eq!(mic_len_of(Some(23)), None);
        assert_eq!(mic_len_of(None), None);
    }
}
