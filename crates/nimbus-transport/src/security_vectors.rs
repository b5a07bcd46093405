//! Microsoft's published SMB 3.x encryption examples, end to end through
//! the server's key derivation, TRANSFORM parsing and AEAD: the Open
//! Specifications blog posts "Encryption in SMB 3.0: A protocol perspective"
//! (3.0, AES-128-CCM) and "SMB 3.1.1 Encryption in Windows 10", appendices
//! A.1 (AES-128-GCM) and A.2 (AES-128-CCM). Each case decrypts the client's
//! WRITE request as the server would, and re-creates the server's READ
//! response byte for byte from the nonce Windows used.

use super::*;

fn h(s: &str) -> Vec<u8> {
    hex::decode(s).unwrap()
}

struct Case {
    dialect: Dialect,
    cipher: CipherAlgorithm,
    session_key: &'static str,
    /// Empty for 3.0, whose keys do not depend on the preauth hash.
    preauth_hash: &'static str,
    request_transformed: &'static str,
    request_plaintext: &'static str,
    response_nonce_field: &'static str,
    response_plaintext: &'static str,
    response_transformed: &'static str,
}

fn check(case: &Case) {
    let provider = CryptoProvider::default_provider();
    let mut preauth = [0u8; 64];
    if !case.preauth_hash.is_empty() {
        preauth.copy_from_slice(&h(case.preauth_hash));
    }
    let server = SessionCipher::derive(
        &provider,
        case.dialect,
        case.cipher,
        &h(case.session_key),
        &preauth,
    )
    .unwrap();

    let mut frame = h(case.request_transformed);
    let hdr = TransformHeader::parse(&frame).unwrap();
    server.open(&hdr, &mut frame).unwrap();
    assert_eq!(
        frame[TRANSFORM_HEADER_SIZE..],
        h(case.request_plaintext)[..]
    );

    let expected = h(case.response_transformed);
    let session_id = TransformHeader::parse(&expected).unwrap().session_id;
    let mut buf = vec![0u8; TRANSFORM_HEADER_SIZE];
    buf.extend_from_slice(&h(case.response_plaintext));
    let nonce: [u8; 16] = h(case.response_nonce_field).try_into().unwrap();
    server.seal_with_nonce(nonce, session_id, &mut buf).unwrap();
    assert_eq!(buf, expected);
}

#[test]
fn microsoft_example_smb30_aes128_ccm() {
    check(&Case {
        dialect: Dialect::Smb300,
        cipher: CipherAlgorithm::Aes128Ccm,
        session_key: "b4546771b515f766a86735532dd6c4f0",
        preauth_hash: "",
        request_transformed: "fd534d4281a286535415445dae393921e44fa42e66e69a111892584fb5ed524a\
            744da3ee87000000000001001100001400e4080025c8fee16605a437832d1cd5\
            2da9f4645333482a175fe5384563f45fcdafaef38bc62ba4d5c62897996625a4\
            4c29be5658de2e6117585779e7b59ffd971278d08580d7fa899e410e910eabf5\
            aa1db43050b33b49182637759ac15d84bfcdf5b6b238993c0f4cf4d6012023f6\
            c627297075d84b7803912d0a9639634453595ef3e33ffe4e7ac2ab",
        request_plaintext: "fe534d4240000100000000000900400008000000000000000400000000000000\
            fffe0000010000001100001400e4080000000000000000000000000000000000\
            3100700017000000000000000000000015010000390000020100000039020000\
            00000000000000007000000000000000536d623320656e6372797074696f6e20\
            74657374696e67",
        response_nonce_field: "87000000000000001100001400e40800",
        response_plaintext: "fe534d4240000100000000000800210009000000000000000500000000000000\
            fffe0000010000001100001400e4080000000000000000000000000000000000\
            11005000170000000000000000000000536d623320656e6372797074696f6e20\
            74657374696e67",
        response_transformed: "fd534d42abd518b68c2f04d7879f482b689eb83f870000000000000011000014\
            00e4080067000000000001001100001400e40800493d6fe2bdbeb435cf5f5469\
            70c7bb57bf20e713c75a3d045507e0d68e5c0346659d6ffb8ac1504a786ca2bb\
            89c9e7fe4f313e910a04180d2d0ea7df636329e5a3285984500ef86fe9d55da4\
            fab9531cfdd4c551d47f3c73124bb4590a45052b694048b991ccf5",
    });
}

#[test]
fn microsoft_example_smb311_aes128_gcm() {
    check(&Case {
        dialect: Dialect::Smb311,
        cipher: CipherAlgorithm::Aes128Gcm,
        session_key: "419fddf34c1e001909d362ae7fb6af79",
        preauth_hash: "b23f3cbfd69487d9832b79b1594a367cdd950909b774c3a4c412b4fcea9edddb\
            a7db256ba2ea30e977f11f9b113247578e0e915c6d2a513b8f2fca5707dc8770",
        request_transformed: "fd534d42bd73d97d2bc9001bcafac0fdff5feebcc7d6822d269caf48904c664c\
            00000000870000000000010025000000001000006ecdd2a7afc7b47763057a04\
            1b8fd4daffe990b70c9e09d36c084e02d14ef247f8bde38acf6256f8b1d3b56f\
            77fbdeb312fea5e92cbcc1ed8fb2ebbfaa75e49a4a394bb44576545567c24d4c\
            014d47c9fbdfdafd2c4f9b72f8d256452620a299f48e29e53d6b61d1c13a19e9\
            1af013f00d17e3abc2fc3d36c8c1b6b93973253852dbd442e46ee8",
        request_plaintext: "fe534d4240000100000000000900010008000000000000000500000000000000\
            fffe000001000000250000000010000000000000000000000000000000000000\
            3100700017000000000000000000000006000000040000000100000004000000\
            00000000000000007000000000000000536d623320656e6372797074696f6e20\
            74657374696e67",
        response_nonce_field: "e16831dd2e8eb7b40000000000000000",
        response_plaintext: "fe534d4240000100000000000800010001000000000000000600000000000000\
            fffe000001000000250000000010000000000000000000000000000000000000\
            11005000170000000000000000000000536d623320656e6372797074696f6e20\
            74657374696e67",
        response_transformed: "fd534d427f714b3b9d8fa1198584e71c2baa1cb6e16831dd2e8eb7b400000000\
            0000000067000000000001002500000000100000fecedf4d03bb11a6cc5d8a53\
            be33d6d8701986342b4197d306e16f9cbb218e92f7f8281f51ce68bb85a20d87\
            de90ebbf80538066d1c37513c0a58d70936d537b624f5500202a612b6cd30d44\
            8a82791a0b2e049ed512afaefb06e98ab3d6f931d7d50db2dbd36a",
    });
}

#[test]
fn microsoft_example_smb311_aes128_ccm() {
    check(&Case {
        dialect: Dialect::Smb311,
        cipher: CipherAlgorithm::Aes128Ccm,
        session_key: "07b7f69c1e2581662df6987e88f9e891",
        preauth_hash: "decf98a420718718f22090d3580fcc5e484bd310fa1268210c6e86335a8891e7\
            67f5bcd99fa5a7859d665ad07a73ea94e1bcdb7cfa69a6962a28a244138340b1",
        request_transformed: "fd534d42e89551d666dab8993488f5a97103116c9f6f1eaad7e9f24aacd38f00\
            000000008700000000000100210000000010000056a74778199a9d2b6e9c3a37\
            6fd88d27680694fed253a313beb07381ae8689f973acdb8d716e4477803bce53\
            a92e1b81fa3e965ad9af2c89c08ce66a344664453b8fc88118edc9814cf58e92\
            aa465e6efb09958a9fdad96fbd55b36a710c30d5e7c64ad7b9449f9f17edd024\
            fe8ba79154f340a82740d1d5180c69b0a2de6a4ba893bd55d3210e",
        request_plaintext: "fe534d4240000100000000000900010008000000000000000500000000000000\
            fffe000001000000210000000010000000000000000000000000000000000000\
            3100700017000000000000000000000005000000040000000100000004000000\
            00000000000000007000000000000000536d623320656e6372797074696f6e20\
            74657374696e67",
        response_nonce_field: "da6831dd2e8eb7b40000000000000000",
        response_plaintext: "fe534d4240000100000000000800010001000000000000000600000000000000\
            fffe000001000000210000000010000000000000000000000000000000000000\
            11005000170000000000000000000000536d623320656e6372797074696f6e20\
            74657374696e67",
        response_transformed: "fd534d42e241a13c7e1ee42ecf1fd69f3b8668c6da6831dd2e8eb7b400000000\
            000000006700000000000100210000000010000015d67234fc8358d7ba1bf037\
            abc8efd41a0a8f9bb04b16deb1e85606bd8c2770823fe6239a286cb3e3d5762a\
            bbd53fd8de11ed491fe905e146a8ffce09414ab741103d637e28b19c6ba759b3\
            99dcc21fae24cf2a455a13b215fc2857abb513927f9f271d1c208b",
    });
}
