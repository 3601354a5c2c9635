//! Fresh identifiers and tokens.

use ring::rand::SecureRandom;

/// `bytes` bytes from the system's CSPRNG, hex-encoded (ids, tokens, nonces). Panics only
/// when the operating system cannot supply randomness, where no safe id can be made.
pub fn random_hex(bytes: usize) -> String {
    let mut buf = vec![0u8; bytes];
    ring::rand::SystemRandom::new()
        .fill(&mut buf)
        .expect("system randomness");
    hex::encode(buf)
}

#[cfg(test)]
mod tests {
    #[test]
    fn ids_are_hex_of_the_asked_length_and_differ() {
        let (a, b) = (super::random_hex(12), super::random_hex(12));
        assert_eq!(a.len(), 24);
        assert!(a
            .bytes()
            .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()));
        assert_ne!(a, b);
    }
}
