use super::*;
use crate::credentials::Secret;
use proptest::prelude::*;

fn example_keys() -> AwsKeys {
    AwsKeys {
        access_key_id: "AKIAIOSFODNN7EXAMPLE".into(),
        secret_access_key: Secret::new("wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"),
        session_token: None,
    }
}

/// 20130524T000000Z, the time of the AWS documentation's example.
fn example_time() -> SystemTime {
    SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_369_353_600)
}

const SEED: &str = "4f232c4386841ef735655705268965c44a0e4690baa4adea153f7db9fa80a0a9";
const ZEROS: &str = "0000000000000000000000000000000000000000000000000000000000000000";

fn body(chunks: &[usize], trailer: Option<&str>) -> Vec<u8> {
    let mut out = Vec::new();
    for size in chunks {
        out.extend_from_slice(format!("{size:x};chunk-signature={ZEROS}\r\n").as_bytes());
        out.extend(std::iter::repeat_n(b'a', *size));
        out.extend_from_slice(b"\r\n");
    }
    match trailer {
        None => out.extend_from_slice(format!("0;chunk-signature={ZEROS}\r\n\r\n").as_bytes()),
        Some(line) => out.extend_from_slice(
            format!(
                "0;chunk-signature={ZEROS}\r\n{line}\r\nx-amz-trailer-signature:{ZEROS}\r\n\r\n"
            )
            .as_bytes(),
        ),
    }
    out
}

fn resign_all(input: &[u8], trailer: bool, piece: usize) -> Result<Vec<u8>, ChunkError> {
    let mut resigner = ChunkResigner::new(
        SEED.into(),
        &example_keys(),
        "us-east-1",
        "s3",
        example_time(),
        trailer,
    );
    let mut out = Vec::new();
    for part in input.chunks(piece.max(1)) {
        out.extend_from_slice(&resigner.push(part)?);
    }
    resigner.finish()?;
    Ok(out)
}

fn signatures(output: &[u8]) -> Vec<String> {
    let text = String::from_utf8_lossy(output);
    text.match_indices("chunk-signature=")
        .map(|(i, m)| text[i + m.len()..i + m.len() + 64].to_string())
        .collect()
}

/// The example of the S3 documentation ("Signature Calculations for the Authorization
/// Header: Transferring Payload in Multiple Chunks"): 64 KiB and 1 KiB of `a`.
#[test]
fn the_documented_example_signs_alike() {
    let input = body(&[65536, 1024], None);
    let output = resign_all(&input, false, 7000).unwrap();
    assert_eq!(output.len(), input.len());
    assert_eq!(
        signatures(&output),
        [
            "ad80c730a21e5b8d04586a2213dd63b9a0e99e0e2307b0ade35a65485a288648",
            "0055627c9e194cb4542bae2aa5492e3c1575bbb81b612b7d234b86a503ef5497",
            "b6c6ea8a5354eaf15b3cb7646744f4275b71ea724fed81ceb9323e279d449df9",
        ]
    );
}

#[test]
fn how_the_body_is_split_does_not_matter() {
    let input = body(&[300, 17, 1], Some("x-amz-checksum-crc32:AAAAAA=="));
    let whole = resign_all(&input, true, input.len()).unwrap();
    assert_eq!(whole.len(), input.len());
    for piece in [1, 2, 3, 64, 301] {
        assert_eq!(
            resign_all(&input, true, piece).unwrap(),
            whole,
            "piece {piece}"
        );
    }
    let text = String::from_utf8_lossy(&whole);
    assert!(text.contains("x-amz-checksum-crc32:AAAAAA==\r\nx-amz-trailer-signature:"));
    assert!(
        !text.contains(ZEROS),
        "every sandbox signature was replaced"
    );
}

#[test]
fn malformed_bodies_are_refused() {
    let good = body(&[10], None);
    assert_eq!(
        resign_all(&good[..good.len() - 3], false, 5),
        Err(ChunkError::Truncated)
    );
    let mut extra = good.clone();
    extra.extend_from_slice(b"x");
    assert!(resign_all(&extra, false, 5).is_err());
    let no_sig = b"a;chunk-signature=abc\r\naaaaaaaaaa\r\n".to_vec();
    assert!(matches!(
        resign_all(&no_sig, false, 5),
        Err(ChunkError::Malformed(_))
    ));
    let huge = format!("{:x};chunk-signature={ZEROS}\r\n", MAX_CHUNK + 1);
    assert_eq!(
        resign_all(huge.as_bytes(), false, 5),
        Err(ChunkError::TooLarge)
    );
    let missing_crlf = format!("2;chunk-signature={ZEROS}\r\naaXX");
    assert!(resign_all(missing_crlf.as_bytes(), false, 50).is_err());
    let unsigned_trailer =
        format!("0;chunk-signature={ZEROS}\r\nx-amz-checksum-crc32:AA==\r\n\r\n");
    assert!(resign_all(unsigned_trailer.as_bytes(), true, 50).is_err());
    let long_line = vec![b'1'; MAX_LINE + 10];
    assert!(resign_all(&long_line, false, 50).is_err());
}

proptest! {
    #[test]
    fn arbitrary_bodies_never_panic(input in proptest::collection::vec(any::<u8>(), 0..600), piece in 1usize..64, trailer: bool) {
        let _ = resign_all(&input, trailer, piece);
    }

    #[test]
    fn well_formed_bodies_keep_their_length(sizes in proptest::collection::vec(1usize..200, 0..5), piece in 1usize..97) {
        let input = body(&sizes, None);
        let output = resign_all(&input, false, piece).unwrap();
        prop_assert_eq!(output.len(), input.len());
    }
}
