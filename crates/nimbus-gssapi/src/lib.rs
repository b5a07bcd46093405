//! The Kerberos acceptor's seam to the system's GSS-API (RFC 2743, C
//! bindings RFC 2744; MIT krb5's `libgssapi_krb5.so.2`).
//!
//! The library is loaded when a server configured for Kerberos starts, not
//! linked: building Nimbus needs no Kerberos headers, and a server without
//! `[kerberos]` never touches it. All `unsafe` of the Kerberos path is in
//! this crate; what it exports is safe: an acceptor credential from a
//! keytab, and a context that accepts the client's tokens and then yields
//! the client's principal, the session key and the ticket's lifetime.

use std::ffi::{c_char, c_int, c_void, CString};
use std::fmt;
use std::ptr;
use std::sync::{Arc, OnceLock};

use zeroize::Zeroizing;

type OmUint32 = u32;

/// RFC 2744 3.2 gss_buffer_desc.
#[repr(C)]
struct Buffer {
    length: usize,
    value: *mut c_void,
}

/// RFC 2744 3.5 gss_OID_desc.
#[repr(C)]
struct Oid {
    length: OmUint32,
    elements: *const c_void,
}

/// MIT's gss_buffer_set_desc (gssapi_ext.h).
#[repr(C)]
struct BufferSet {
    count: usize,
    elements: *mut Buffer,
}

/// MIT's gss_key_value_element_desc / gss_key_value_set_desc
/// (gssapi_ext.h, the credential store of gss_acquire_cred_from).
#[repr(C)]
struct KeyValue {
    key: *const c_char,
    value: *const c_char,
}

#[repr(C)]
struct KeyValueSet {
    count: OmUint32,
    elements: *const KeyValue,
}

type Name = *mut c_void;
type Cred = *mut c_void;
type Ctx = *mut c_void;

const GSS_S_COMPLETE: OmUint32 = 0;
const GSS_S_CONTINUE_NEEDED: OmUint32 = 1;
const GSS_C_ACCEPT: c_int = 2;
/// MIT gssapi_ext.h GSS_IOV_BUFFER_TYPE_* values.
const IOV_EMPTY: OmUint32 = 0;
const IOV_DATA: OmUint32 = 1;
const IOV_HEADER: OmUint32 = 2;
const IOV_SIGN_ONLY: OmUint32 = 11;
/// RFC 2744 context flag: the DCE/RPC style (three legs, wrap tokens
/// without padding), which the DCE/RPC wrap layout needs.
pub const GSS_C_DCE_STYLE: u32 = 0x1000;
/// RFC 2744 context flag: the client asked for confidentiality.
pub const GSS_C_CONF_FLAG: u32 = 16;
/// RFC 2744 context flags: replayed and out-of-order tokens are detected
/// (without them the library keeps no sequence state).
pub const GSS_C_REPLAY_FLAG: u32 = 4;
pub const GSS_C_SEQUENCE_FLAG: u32 = 8;
const GSS_C_GSS_CODE: c_int = 1;
const GSS_C_MECH_CODE: c_int = 2;
/// RFC 2744: the routine errors live in the top 16 bits.
const fn is_error(major: OmUint32) -> bool {
    major & 0xffff_0000 != 0
}

/// DER value octets of 1.2.840.113554.1.2.2.1 (GSS_KRB5_NT_PRINCIPAL_NAME).
const OID_KRB5_PRINCIPAL_NAME: &[u8] =
    &[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x12, 0x01, 0x02, 0x02, 0x01];
/// DER value octets of 1.2.840.113554.1.2.2.5.5 (GSS_C_INQ_SSPI_SESSION_KEY):
/// the context's session key (the negotiated subkey), as MS-SMB2 3.3.5.5.3
/// wants it.
const OID_INQ_SESSION_KEY: &[u8] = &[
    0x2a, 0x86, 0x48, 0x86, 0xf7, 0x12, 0x01, 0x02, 0x02, 0x05, 0x05,
];

fn oid(bytes: &'static [u8]) -> Oid {
    Oid {
        length: bytes.len() as OmUint32,
        elements: bytes.as_ptr().cast(),
    }
}

type AcquireCredFrom = unsafe extern "C" fn(
    *mut OmUint32,
    Name,
    OmUint32,
    *const c_void,
    c_int,
    *const KeyValueSet,
    *mut Cred,
    *mut c_void,
    *mut OmUint32,
) -> OmUint32;
type ImportName =
    unsafe extern "C" fn(*mut OmUint32, *const Buffer, *const Oid, *mut Name) -> OmUint32;
type AcceptSecContext = unsafe extern "C" fn(
    *mut OmUint32,
    *mut Ctx,
    Cred,
    *const Buffer,
    *const c_void,
    *mut Name,
    *mut *const Oid,
    *mut Buffer,
    *mut OmUint32,
    *mut OmUint32,
    *mut Cred,
) -> OmUint32;
type InquireContext = unsafe extern "C" fn(
    *mut OmUint32,
    Ctx,
    *mut Name,
    *mut Name,
    *mut OmUint32,
    *mut *const Oid,
    *mut OmUint32,
    *mut c_int,
    *mut c_int,
) -> OmUint32;
type DisplayName =
    unsafe extern "C" fn(*mut OmUint32, Name, *mut Buffer, *mut *const Oid) -> OmUint32;
type InquireByOid =
    unsafe extern "C" fn(*mut OmUint32, Ctx, *const Oid, *mut *mut BufferSet) -> OmUint32;
type GetMic =
    unsafe extern "C" fn(*mut OmUint32, Ctx, OmUint32, *const Buffer, *mut Buffer) -> OmUint32;
type VerifyMic = unsafe extern "C" fn(
    *mut OmUint32,
    Ctx,
    *const Buffer,
    *const Buffer,
    *mut OmUint32,
) -> OmUint32;
/// RFC 4121 / MIT gssapi_ext.h gss_iov_buffer_desc.
#[repr(C)]
struct IovBuffer {
    kind: OmUint32,
    buffer: Buffer,
}
/// gss_wrap_iov and gss_wrap_iov_length (MIT gssapi_ext.h).
type WrapIov = unsafe extern "C" fn(
    *mut OmUint32,
    Ctx,
    c_int,
    OmUint32,
    *mut c_int,
    *mut IovBuffer,
    c_int,
) -> OmUint32;
type UnwrapIov = unsafe extern "C" fn(
    *mut OmUint32,
    Ctx,
    *mut c_int,
    *mut OmUint32,
    *mut IovBuffer,
    c_int,
) -> OmUint32;
type DisplayStatus = unsafe extern "C" fn(
    *mut OmUint32,
    OmUint32,
    c_int,
    *const Oid,
    *mut OmUint32,
    *mut Buffer,
) -> OmUint32;
type ReleaseBuffer = unsafe extern "C" fn(*mut OmUint32, *mut Buffer) -> OmUint32;
type ReleaseBufferSet = unsafe extern "C" fn(*mut OmUint32, *mut *mut BufferSet) -> OmUint32;
type ReleaseName = unsafe extern "C" fn(*mut OmUint32, *mut Name) -> OmUint32;
type ReleaseCred = unsafe extern "C" fn(*mut OmUint32, *mut Cred) -> OmUint32;
type DeleteSecContext = unsafe extern "C" fn(*mut OmUint32, *mut Ctx, *mut Buffer) -> OmUint32;

/// The library's entry points Nimbus uses.
struct Lib {
    acquire_cred_from: AcquireCredFrom,
    import_name: ImportName,
    accept_sec_context: AcceptSecContext,
    inquire_context: InquireContext,
    display_name: DisplayName,
    inquire_by_oid: InquireByOid,
    get_mic: GetMic,
    verify_mic: VerifyMic,
    wrap_iov: WrapIov,
    wrap_iov_length: WrapIov,
    unwrap_iov: UnwrapIov,
    display_status: DisplayStatus,
    release_buffer: ReleaseBuffer,
    release_buffer_set: ReleaseBufferSet,
    release_name: ReleaseName,
    release_cred: ReleaseCred,
    delete_sec_context: DeleteSecContext,
    /// Keeps the entry points valid for the life of the process.
    _lib: libloading::Library,
}

/// The shared object loaded (Debian package libgssapi-krb5-2).
pub const LIBRARY: &str = "libgssapi_krb5.so.2";

fn lib() -> Result<&'static Lib, GssError> {
    static LIB: OnceLock<Result<Lib, String>> = OnceLock::new();
    LIB.get_or_init(load)
        .as_ref()
        .map_err(|e| GssError::Library(e.clone()))
}

fn load() -> Result<Lib, String> {
    // SAFETY: loading MIT's GSS-API library runs its initialisers, which
    // only set up its own state.
    let lib = unsafe { libloading::Library::new(LIBRARY) }.map_err(|e| {
        format!("cannot load {LIBRARY} ({e}); install MIT Kerberos (Debian: libgssapi-krb5-2)")
    })?;
    macro_rules! sym {
        ($name:literal) => {
            // SAFETY: the type given is the symbol's C signature (RFC 2744,
            // MIT gssapi_ext.h); the pointer outlives its uses because
            // `Lib` keeps the library loaded.
            *unsafe { lib.get($name) }.map_err(|e| {
                format!(
                    "{LIBRARY} lacks {} ({e}); MIT krb5 1.11 or later is needed",
                    String::from_utf8_lossy(&$name[..$name.len() - 1])
                )
            })?
        };
    }
    Ok(Lib {
        acquire_cred_from: sym!(b"gss_acquire_cred_from\0"),
        import_name: sym!(b"gss_import_name\0"),
        accept_sec_context: sym!(b"gss_accept_sec_context\0"),
        inquire_context: sym!(b"gss_inquire_context\0"),
        display_name: sym!(b"gss_display_name\0"),
        inquire_by_oid: sym!(b"gss_inquire_sec_context_by_oid\0"),
        get_mic: sym!(b"gss_get_mic\0"),
        verify_mic: sym!(b"gss_verify_mic\0"),
        wrap_iov: sym!(b"gss_wrap_iov\0"),
        wrap_iov_length: sym!(b"gss_wrap_iov_length\0"),
        unwrap_iov: sym!(b"gss_unwrap_iov\0"),
        display_status: sym!(b"gss_display_status\0"),
        release_buffer: sym!(b"gss_release_buffer\0"),
        release_buffer_set: sym!(b"gss_release_buffer_set\0"),
        release_name: sym!(b"gss_release_name\0"),
        release_cred: sym!(b"gss_release_cred\0"),
        delete_sec_context: sym!(b"gss_delete_sec_context\0"),
        _lib: lib,
    })
}

/// Why a GSS-API call failed.
#[derive(Debug, Clone)]
pub enum GssError {
    /// The library could not be loaded.
    Library(String),
    /// A call failed; `message` is the library's own text for the major
    /// and minor status ("Clock skew too great", "Key table entry not
    /// found", ...).
    Call {
        call: &'static str,
        major: u32,
        minor: u32,
        message: String,
    },
    /// An argument could not be passed (a NUL inside a path or name).
    Argument(&'static str),
}

impl fmt::Display for GssError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GssError::Library(e) => f.write_str(e),
            GssError::Call { call, message, .. } => write!(f, "{call}: {message}"),
            GssError::Argument(what) => write!(f, "invalid argument: {what}"),
        }
    }
}

impl std::error::Error for GssError {}

/// The library's text for a status pair: every GSS message, then every
/// mechanism (krb5) message.
fn status_text(lib: &Lib, major: OmUint32, minor: OmUint32) -> String {
    let mut parts = Vec::new();
    for (code, kind) in [(major, GSS_C_GSS_CODE), (minor, GSS_C_MECH_CODE)] {
        if code == 0 {
            continue;
        }
        let mut context: OmUint32 = 0;
        // A bounded loop: the library hands out one message per call.
        for _ in 0..8 {
            let mut min = 0;
            let mut buf = Buffer {
                length: 0,
                value: ptr::null_mut(),
            };
            // SAFETY: out-pointers to valid locals; the buffer is released
            // below.
            let maj = unsafe {
                (lib.display_status)(&mut min, code, kind, ptr::null(), &mut context, &mut buf)
            };
            if is_error(maj) {
                break;
            }
            let text = buffer_bytes(&buf);
            parts.push(String::from_utf8_lossy(&text).into_owned());
            // SAFETY: `buf` was filled by the library.
            unsafe { (lib.release_buffer)(&mut min, &mut buf) };
            if context == 0 {
                break;
            }
        }
    }
    if parts.is_empty() {
        format!("major status {major:#x}, minor status {minor:#x}")
    } else {
        parts.join("; ")
    }
}

fn buffer_bytes(buf: &Buffer) -> Vec<u8> {
    if buf.value.is_null() || buf.length == 0 {
        return Vec::new();
    }
    // SAFETY: the library filled `buf` with `length` readable bytes.
    unsafe { std::slice::from_raw_parts(buf.value.cast::<u8>(), buf.length) }.to_vec()
}

fn check(lib: &Lib, call: &'static str, major: OmUint32, minor: OmUint32) -> Result<(), GssError> {
    if is_error(major) {
        Err(GssError::Call {
            call,
            major,
            minor,
            message: status_text(lib, major, minor),
        })
    } else {
        Ok(())
    }
}

/// `check` for a token received: a supplementary status (RFC 2743
/// 1.2.1.1: the token is a duplicate, old, out of order, or after a gap)
/// refuses it too. The library reports a replayed or reordered token that
/// way, not as an error.
fn check_token(
    lib: &Lib,
    call: &'static str,
    major: OmUint32,
    minor: OmUint32,
) -> Result<(), GssError> {
    check(lib, call, major, minor)?;
    if major & 0xffff != 0 {
        return Err(GssError::Call {
            call,
            major,
            minor,
            message: format!(
                "a token replayed, out of order or after a gap (supplementary status {:#x})",
                major & 0xffff
            ),
        });
    }
    Ok(())
}

fn input(bytes: &[u8]) -> Buffer {
    Buffer {
        length: bytes.len(),
        value: bytes.as_ptr() as *mut c_void,
    }
}

fn iov_of(kind: OmUint32, bytes: &mut [u8]) -> IovBuffer {
    IovBuffer {
        kind,
        buffer: Buffer {
            length: bytes.len(),
            value: bytes.as_mut_ptr().cast(),
        },
    }
}

/// A descriptor of `len` bytes with no buffer (gss_wrap_iov_length).
fn iov_len(kind: OmUint32, len: usize) -> IovBuffer {
    IovBuffer {
        kind,
        buffer: Buffer {
            length: len,
            value: ptr::null_mut(),
        },
    }
}

/// A read-only descriptor: SIGN_ONLY when there are bytes, EMPTY when not.
fn iov_signed(bytes: &[u8]) -> IovBuffer {
    if bytes.is_empty() {
        return iov_len(IOV_EMPTY, 0);
    }
    IovBuffer {
        kind: IOV_SIGN_ONLY,
        buffer: input(bytes),
    }
}

/// Header, signed prefix, data, signed suffix: the order DCE/RPC's wrap
/// tokens are computed over.
fn dce_iov(before: &[u8], data: &mut [u8], after: &[u8], token: &mut [u8]) -> [IovBuffer; 4] {
    [
        iov_of(IOV_HEADER, token),
        iov_signed(before),
        iov_of(IOV_DATA, data),
        iov_signed(after),
    ]
}

/// A GSS name, released on drop.
struct OwnedName(Name);

impl Drop for OwnedName {
    fn drop(&mut self) {
        if let (Ok(lib), false) = (lib(), self.0.is_null()) {
            let mut min = 0;
            // SAFETY: a name the library gave out, released once.
            unsafe { (lib.release_name)(&mut min, &mut self.0) };
        }
    }
}

impl OwnedName {
    fn display(&self) -> Result<String, GssError> {
        let lib = lib()?;
        let mut min = 0;
        let mut buf = Buffer {
            length: 0,
            value: ptr::null_mut(),
        };
        // SAFETY: a valid name and out-pointers to locals.
        let maj = unsafe { (lib.display_name)(&mut min, self.0, &mut buf, ptr::null_mut()) };
        check(lib, "gss_display_name", maj, min)?;
        let text = String::from_utf8_lossy(&buffer_bytes(&buf)).into_owned();
        // SAFETY: `buf` was filled by the library.
        unsafe { (lib.release_buffer)(&mut min, &mut buf) };
        Ok(text)
    }
}

/// The acceptor's credential: the keys of a keytab (RFC 2743 2.1.1
/// GSS_Acquire_cred with MIT's credential store). Shared by every logon.
pub struct AcceptorCred {
    cred: Cred,
}

// SAFETY: MIT krb5 credential handles may be used from several threads
// at once for accepting (the library locks its keytab and replay cache).
unsafe impl Send for AcceptorCred {}
// SAFETY: as above; the handle is never mutated after acquisition.
unsafe impl Sync for AcceptorCred {}

impl Drop for AcceptorCred {
    fn drop(&mut self) {
        if let Ok(lib) = lib() {
            let mut min = 0;
            // SAFETY: acquired in `from_keytab`, released once.
            unsafe { (lib.release_cred)(&mut min, &mut self.cred) };
        }
    }
}

impl AcceptorCred {
    /// The keys of `keytab` for `principal` (e.g. `cifs/host@REALM`), or for
    /// any principal of the keytab when None. Fails with the library's
    /// reason when the keytab is missing, unreadable or lacks the
    /// principal.
    pub fn from_keytab(
        keytab: &str,
        principal: Option<&str>,
    ) -> Result<Arc<AcceptorCred>, GssError> {
        let lib = lib()?;
        let key = CString::new("keytab").map_err(|_| GssError::Argument("keytab"))?;
        let path = CString::new(keytab).map_err(|_| GssError::Argument("keytab path"))?;
        let elements = [KeyValue {
            key: key.as_ptr(),
            value: path.as_ptr(),
        }];
        let store = KeyValueSet {
            count: 1,
            elements: elements.as_ptr(),
        };
        let name = match principal {
            Some(p) => {
                let mut min = 0;
                let mut name: Name = ptr::null_mut();
                let ty = oid(OID_KRB5_PRINCIPAL_NAME);
                // SAFETY: input buffer and OID point at live locals.
                let maj =
                    unsafe { (lib.import_name)(&mut min, &input(p.as_bytes()), &ty, &mut name) };
                check(lib, "gss_import_name", maj, min)?;
                OwnedName(name)
            }
            None => OwnedName(ptr::null_mut()),
        };
        let mut min = 0;
        let mut cred: Cred = ptr::null_mut();
        // SAFETY: every pointer is to a live local; NULL mechs means the
        // default set (krb5); the outputs we do not want are NULL.
        let maj = unsafe {
            (lib.acquire_cred_from)(
                &mut min,
                name.0,
                0,
                ptr::null(),
                GSS_C_ACCEPT,
                &store,
                &mut cred,
                ptr::null_mut(),
                ptr::null_mut(),
            )
        };
        check(lib, "gss_acquire_cred_from", maj, min)?;
        Ok(Arc::new(AcceptorCred { cred }))
    }
}

/// What one accepted token produced.
pub struct Accepted {
    /// The token to send back (Kerberos AP-REP when mutual authentication
    /// was asked for); may be empty.
    pub output: Vec<u8>,
    /// The context is established: its client, key and lifetime may be read.
    pub complete: bool,
}

/// One client's security context (RFC 2743 2.2.2 GSS_Accept_sec_context),
/// deleted on drop.
pub struct AcceptContext {
    cred: Arc<AcceptorCred>,
    ctx: Ctx,
    client: Option<OwnedName>,
    /// Seconds the context stays valid (the ticket's remaining life).
    lifetime: u32,
    /// The context's flags (RFC 2744 ret_flags) once established.
    flags: u32,
}

// SAFETY: a context is used by one thread at a time (it lives behind the
// session's lock); MIT contexts are not tied to the thread that made them.
unsafe impl Send for AcceptContext {}

impl Drop for AcceptContext {
    fn drop(&mut self) {
        if let (Ok(lib), false) = (lib(), self.ctx.is_null()) {
            let mut min = 0;
            // SAFETY: a context the library gave out, deleted once.
            unsafe { (lib.delete_sec_context)(&mut min, &mut self.ctx, ptr::null_mut()) };
        }
    }
}

impl AcceptContext {
    pub fn new(cred: Arc<AcceptorCred>) -> AcceptContext {
        AcceptContext {
            cred,
            ctx: ptr::null_mut(),
            client: None,
            lifetime: 0,
            flags: 0,
        }
    }

    /// Feeds the client's token (a GSS-API InitialContextToken carrying a
    /// Kerberos AP-REQ, RFC 4121 4.1).
    pub fn step(&mut self, token: &[u8]) -> Result<Accepted, GssError> {
        let lib = lib()?;
        let mut min = 0;
        let mut src: Name = ptr::null_mut();
        let mut out = Buffer {
            length: 0,
            value: ptr::null_mut(),
        };
        let mut flags: OmUint32 = 0;
        let mut lifetime: OmUint32 = 0;
        // SAFETY: the context and out-pointers are live fields and locals;
        // no channel bindings, mechanism or delegated credential wanted.
        let maj = unsafe {
            (lib.accept_sec_context)(
                &mut min,
                &mut self.ctx,
                self.cred.cred,
                &input(token),
                ptr::null(),
                &mut src,
                ptr::null_mut(),
                &mut out,
                &mut flags,
                &mut lifetime,
                ptr::null_mut(),
            )
        };
        let output = buffer_bytes(&out);
        // SAFETY: `out` was filled by the library (or is empty).
        unsafe { (lib.release_buffer)(&mut min.clone(), &mut out) };
        let src = OwnedName(src);
        check(lib, "gss_accept_sec_context", maj, min)?;
        let complete = maj == GSS_S_COMPLETE;
        if complete {
            self.client = Some(src);
            self.lifetime = lifetime;
            self.flags = flags;
        }
        debug_assert!(complete || maj & GSS_S_CONTINUE_NEEDED != 0);
        Ok(Accepted { output, complete })
    }

    /// The client's principal, e.g. `alice@EXAMPLE.TEST`.
    pub fn client(&self) -> Result<String, GssError> {
        match &self.client {
            Some(n) => n.display(),
            None => Err(GssError::Argument("context not established")),
        }
    }

    /// The principal the client's ticket was for (one of the keytab's).
    pub fn target(&self) -> Result<String, GssError> {
        let lib = lib()?;
        let mut min = 0;
        let mut target: Name = ptr::null_mut();
        // SAFETY: an established context; outputs not wanted are NULL.
        let maj = unsafe {
            (lib.inquire_context)(
                &mut min,
                self.ctx,
                ptr::null_mut(),
                &mut target,
                ptr::null_mut(),
                ptr::null_mut(),
                ptr::null_mut(),
                ptr::null_mut(),
                ptr::null_mut(),
            )
        };
        let target = OwnedName(target);
        check(lib, "gss_inquire_context", maj, min)?;
        target.display()
    }

    /// Seconds the context (the client's ticket) stays valid.
    pub fn lifetime_secs(&self) -> u32 {
        self.lifetime
    }

    /// The context's session key (the subkey the two sides agreed on),
    /// from which SMB derives its signing and encryption keys.
    pub fn session_key(&self) -> Result<Zeroizing<Vec<u8>>, GssError> {
        self.session_key_and_enctype().map(|(key, _)| key)
    }

    /// The session key and its Kerberos encryption type (RFC 3961 number:
    /// 18 aes256-cts-hmac-sha1-96, 23 rc4-hmac, ...), when the library
    /// names it (MIT does, as an OID after the key).
    pub fn session_key_and_enctype(&self) -> Result<(Zeroizing<Vec<u8>>, Option<i32>), GssError> {
        let lib = lib()?;
        let mut min = 0;
        let mut set: *mut BufferSet = ptr::null_mut();
        let what = oid(OID_INQ_SESSION_KEY);
        // SAFETY: an established context and a live OID; the set is
        // released below.
        let maj = unsafe { (lib.inquire_by_oid)(&mut min, self.ctx, &what, &mut set) };
        check(lib, "gss_inquire_sec_context_by_oid", maj, min)?;
        let (key, enctype) = if set.is_null() {
            (None, None)
        } else {
            // SAFETY: the library returned a set of `count` buffers; the
            // first is the key, the second (MIT) the OID of its type.
            unsafe {
                let s = &*set;
                let key = (s.count > 0 && !s.elements.is_null())
                    .then(|| Zeroizing::new(buffer_bytes(&*s.elements)));
                let enctype = (s.count > 1 && !s.elements.is_null())
                    .then(|| enctype_of(&buffer_bytes(&*s.elements.add(1))))
                    .flatten();
                (key, enctype)
            }
        };
        if !set.is_null() {
            // Wipe the library's copy before giving it back.
            // SAFETY: as above.
            unsafe {
                let s = &*set;
                for i in 0..s.count {
                    let b = &*s.elements.add(i);
                    if !b.value.is_null() {
                        ptr::write_bytes(b.value.cast::<u8>(), 0, b.length);
                    }
                }
                (lib.release_buffer_set)(&mut min, &mut set);
            }
        }
        key.filter(|k| !k.is_empty())
            .map(|k| (k, enctype))
            .ok_or(GssError::Argument("the context has no session key"))
    }

    /// A MIC over `message` (SPNEGO's mechListMIC, RFC 4178 5).
    pub fn get_mic(&self, message: &[u8]) -> Result<Vec<u8>, GssError> {
        let lib = lib()?;
        let mut min = 0;
        let mut out = Buffer {
            length: 0,
            value: ptr::null_mut(),
        };
        // SAFETY: an established context, live input and output.
        let maj = unsafe { (lib.get_mic)(&mut min, self.ctx, 0, &input(message), &mut out) };
        let mic = buffer_bytes(&out);
        // SAFETY: `out` was filled by the library (or is empty).
        unsafe { (lib.release_buffer)(&mut min.clone(), &mut out) };
        check(lib, "gss_get_mic", maj, min)?;
        Ok(mic)
    }

    /// Checks the client's MIC over `message`.
    pub fn verify_mic(&self, message: &[u8], mic: &[u8]) -> Result<(), GssError> {
        let lib = lib()?;
        let mut min = 0;
        let mut qop = 0;
        // SAFETY: an established context and live inputs.
        let maj =
            unsafe { (lib.verify_mic)(&mut min, self.ctx, &input(message), &input(mic), &mut qop) };
        check_token(lib, "gss_verify_mic", maj, min)
    }

    /// The flags of the established context (RFC 2744 ret_flags:
    /// [`GSS_C_DCE_STYLE`], [`GSS_C_CONF_FLAG`], ...).
    pub fn flags(&self) -> u32 {
        self.flags
    }

    /// The length of the token [`AcceptContext::seal_dce`] makes for
    /// `data_len` bytes sealed (for DCE style, a header that also holds
    /// what RFC 4121 puts after the data).
    pub fn seal_dce_len(&self, data_len: usize) -> Result<usize, GssError> {
        let lib = lib()?;
        let mut iov = [iov_of(IOV_HEADER, &mut []), iov_len(IOV_DATA, data_len)];
        let (mut min, mut sealed) = (0, 0);
        // SAFETY: an established context; the library only writes the
        // lengths of the two descriptors.
        let maj = unsafe {
            (lib.wrap_iov_length)(&mut min, self.ctx, 1, 0, &mut sealed, iov.as_mut_ptr(), 2)
        };
        check(lib, "gss_wrap_iov_length", maj, min)?;
        Ok(iov[0].buffer.length)
    }

    /// Seals `data` in place (RFC 4121 4.2.6.2 in DCE/RPC's layout, as
    /// GSS_Wrap with DCE style and a detached header): `token` receives the
    /// header, and `before` and `after` are covered by the checksum but not
    /// encrypted (DCE/RPC's PDU header and sec_trailer when the two sides
    /// sign headers; empty otherwise). `token.len()` must be
    /// [`AcceptContext::seal_dce_len`].
    pub fn seal_dce(
        &self,
        before: &[u8],
        data: &mut [u8],
        after: &[u8],
        token: &mut [u8],
    ) -> Result<(), GssError> {
        let lib = lib()?;
        let mut iov = dce_iov(before, data, after, token);
        let (mut min, mut sealed) = (0, 0);
        // SAFETY: an established context; every descriptor points at a
        // live slice of its length, and only DATA and HEADER are written.
        let maj =
            unsafe { (lib.wrap_iov)(&mut min, self.ctx, 1, 0, &mut sealed, iov.as_mut_ptr(), 4) };
        check(lib, "gss_wrap_iov", maj, min)?;
        if sealed == 0 {
            return Err(GssError::Argument("the context cannot seal"));
        }
        Ok(())
    }

    /// Checks and unseals what the client sealed with GSS_Wrap in
    /// DCE/RPC's layout (see [`AcceptContext::seal_dce`]); `token` is its
    /// header, which the library may rewrite while checking.
    pub fn unseal_dce(
        &self,
        before: &[u8],
        data: &mut [u8],
        after: &[u8],
        token: &mut [u8],
    ) -> Result<(), GssError> {
        let lib = lib()?;
        let mut iov = dce_iov(before, data, after, token);
        let (mut min, mut sealed, mut qop) = (0, 0, 0);
        // SAFETY: as in `seal_dce`.
        let maj = unsafe {
            (lib.unwrap_iov)(
                &mut min,
                self.ctx,
                &mut sealed,
                &mut qop,
                iov.as_mut_ptr(),
                4,
            )
        };
        check_token(lib, "gss_unwrap_iov", maj, min)?;
        if sealed == 0 {
            return Err(GssError::Argument("the client's data was not sealed"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_keytab_is_refused_with_the_librarys_reason() {
        let Err(e) = AcceptorCred::from_keytab("/nonexistent/nimbus.keytab", Some("cifs/x@X.TEST"))
        else {
            panic!("a keytab that does not exist gave a credential");
        };
        let text = e.to_string();
        assert!(!text.is_empty());
        if let GssError::Library(_) = e {
            // No MIT krb5 on this machine: nothing more to check.
            return;
        }
        assert!(text.contains("gss_acquire_cred_from"), "{text}");
    }

    #[test]
    fn arguments_with_nul_are_refused() {
        match AcceptorCred::from_keytab("a\0b", None) {
            Err(GssError::Argument(_)) | Err(GssError::Library(_)) => {}
            Err(e) => panic!("{e}"),
            Ok(_) => panic!("accepted"),
        }
    }
}

/// MIT's GSS_KRB5_SESSION_KEY_ENCTYPE_OID (1.2.840.113554.1.2.2.4), the
/// encoded arcs a session key's type is appended to as one more arc.
const SESSION_KEY_ENCTYPE_OID: &[u8] = b"\x2a\x86\x48\x86\xf7\x12\x01\x02\x02\x04";

/// The encryption type named by an OID of SESSION_KEY_ENCTYPE_OID's arc.
fn enctype_of(oid: &[u8]) -> Option<i32> {
    let arc = oid.strip_prefix(SESSION_KEY_ENCTYPE_OID)?;
    if arc.is_empty() || arc.len() > 5 {
        return None;
    }
    // Base 128, high bit set on every byte but the last.
    let mut value: u64 = 0;
    for (i, &b) in arc.iter().enumerate() {
        let last = i == arc.len() - 1;
        if (b & 0x80 == 0) != last {
            return None;
        }
        value = (value << 7) | u64::from(b & 0x7F);
    }
    i32::try_from(value).ok()
}

#[cfg(test)]
mod enctype_tests {
    use super::*;

    #[test]
    fn the_arc_after_mits_prefix_is_the_enctype() {
        let with = |arc: &[u8]| [SESSION_KEY_ENCTYPE_OID, arc].concat();
        assert_eq!(enctype_of(&with(&[18])), Some(18));
        assert_eq!(enctype_of(&with(&[23])), Some(23));
        // 0x81 0x00 is 128.
        assert_eq!(enctype_of(&with(&[0x81, 0x00])), Some(128));
        assert_eq!(enctype_of(&with(&[])), None);
        assert_eq!(enctype_of(&with(&[0x81])), None);
        assert_eq!(enctype_of(&with(&[0x01, 0x02])), None);
        assert_eq!(enctype_of(b"\x2a\x86\x48"), None);
    }
}
