//! Logs on to an SMB server with the Rust `smb` crate (smb-rs), writes a
//! file of pseudo-random bytes, reads it back and compares; exits non-zero
//! with the error on any failure. tests/test_interop.py runs it against
//! nimbus at each dialect the crate speaks, signed, and encrypted at 3.x.
//!
//!     nimbus-smb-rs-check HOST PORT SHARE USER PASSWORD DIALECT ENCRYPTION SIZE
//!
//! DIALECT is 2.0.2, 2.1, 3.0, 3.0.2 or 3.1.1; ENCRYPTION is `required` or
//! `disabled`; SIZE the file's length in bytes.

use std::process::ExitCode;
use std::time::Duration;

use smb::connection::EncryptionMode;
use smb::{
    Client, ClientConfig, ConnectionConfig, CreateOptions, Dialect, FileAccessMask, FileAttributes,
    FileCreateArgs, ReadAt, UncPath, WriteAt,
};

/// The largest READ or WRITE of SMB 2.0.2.
const PIECE: usize = 64 * 1024;

struct Args {
    host: String,
    port: u16,
    share: String,
    user: String,
    password: String,
    dialect: Dialect,
    encryption: EncryptionMode,
    size: usize,
}

fn parse(args: &[String]) -> Result<Args, String> {
    let [host, port, share, user, password, dialect, encryption, size] = args else {
        return Err(
            "usage: nimbus-smb-rs-check HOST PORT SHARE USER PASSWORD DIALECT ENCRYPTION SIZE"
                .into(),
        );
    };
    let dialect = match dialect.as_str() {
        "2.0.2" => Dialect::Smb0202,
        "2.1" => Dialect::Smb021,
        "3.0" => Dialect::Smb030,
        "3.0.2" => Dialect::Smb0302,
        "3.1.1" => Dialect::Smb0311,
        other => return Err(format!("unknown dialect {other}")),
    };
    let encryption = match encryption.as_str() {
        "required" => EncryptionMode::Required,
        "disabled" => EncryptionMode::Disabled,
        other => return Err(format!("ENCRYPTION is required or disabled, not {other}")),
    };
    Ok(Args {
        host: host.clone(),
        port: port.parse().map_err(|e| format!("PORT: {e}"))?,
        share: share.clone(),
        user: user.clone(),
        password: password.clone(),
        dialect,
        encryption,
        size: size.parse().map_err(|e| format!("SIZE: {e}"))?,
    })
}

/// Bytes that differ at every offset of any block size (xorshift).
fn pattern(len: usize) -> Vec<u8> {
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

async fn run(a: Args) -> Result<(), Box<dyn std::error::Error>> {
    let mut connection = ConnectionConfig {
        min_dialect: Some(a.dialect),
        max_dialect: Some(a.dialect),
        encryption_mode: a.encryption,
        port: Some(a.port),
        timeout: Some(Duration::from_secs(30)),
        ..Default::default()
    };
    connection.auth_methods.kerberos = false;
    connection.auth_methods.ntlm = true;
    let client = Client::new(ClientConfig {
        connection,
        ..Default::default()
    });
    let share = UncPath::new(&a.host)?.with_share(&a.share)?;
    client
        .share_connect(&share, &a.user, a.password.clone())
        .await?;

    let path = share.clone().with_path("smb-rs-check.bin");
    let data = pattern(a.size);
    let file = client
        .create_file(
            &path,
            &FileCreateArgs::make_overwrite(FileAttributes::new(), CreateOptions::new()),
        )
        .await?
        .unwrap_file();
    // In pieces every dialect takes in one WRITE (2.0.2 has no large MTU).
    let mut at = 0;
    while at < data.len() {
        let end = (at + PIECE).min(data.len());
        let n = file.write_at(&data[at..end], at as u64).await?;
        if n == 0 {
            return Err(format!("WRITE at {at} wrote nothing").into());
        }
        at += n;
    }
    file.close().await?;

    let file = client
        .create_file(
            &path,
            &FileCreateArgs::make_open_existing(FileAccessMask::new().with_generic_read(true)),
        )
        .await?
        .unwrap_file();
    let mut back = vec![0u8; data.len()];
    let mut at = 0;
    while at < back.len() {
        let end = (at + PIECE).min(back.len());
        let n = file.read_at(&mut back[at..end], at as u64).await?;
        if n == 0 {
            return Err(format!("READ at {at} returned nothing").into());
        }
        at += n;
    }
    file.close().await?;
    if back != data {
        return Err("the file read back differs from the one written".into());
    }
    client.close().await?;
    println!("ok: {} bytes written and read back identical", data.len());
    Ok(())
}

#[tokio::main]
async fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let a = match parse(&args) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    match run(a).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("smb-rs: {e}");
            ExitCode::FAILURE
        }
    }
}
