//! Hex for keys, GIDs and MACs.

/// Decodes hex digits (either case) into bytes.
pub fn decode(s: &str) -> Result<Vec<u8>, String> {
    if !s.len().is_multiple_of(2) {
        return Err(format!("'{s}' has an odd number of hex digits"));
    }
    let digit = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
    s.as_bytes()
        .chunks(2)
        .map(|p| Some(digit(p[0])? << 4 | digit(p[1])?))
        .collect::<Option<Vec<u8>>>()
        .ok_or_else(|| format!("'{s}' is not hex"))
}

/// Lower-case hex.
pub fn encode(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// A fresh key of `bytes` random bytes from the OS, in hex (demo set-ups, tests, benchmarks).
pub fn random_key(bytes: usize) -> Result<String, String> {
    use std::io::Read;
    let mut b = vec![0u8; bytes];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut b))
        .map_err(|e| format!("reading /dev/urandom for a key: {e}"))?;
    Ok(encode(&b))
}

#[cfg(test)]
mod tests {
    #[test]
    fn round_trip_and_errors() {
        assert_eq!(super::decode("00aBff").unwrap(), [0, 0xab, 0xff]);
        assert_eq!(super::encode(&[0, 0xab, 0xff]), "00abff");
        assert_eq!(super::decode("").unwrap(), Vec::<u8>::new());
        assert!(super::decode("abc").unwrap_err().contains("odd"));
        assert!(super::decode("zz").unwrap_err().contains("not hex"));
        assert!(super::decode("é1").is_err());
        let k = super::random_key(32).unwrap();
        assert_eq!(super::decode(&k).unwrap().len(), 32);
        assert_ne!(k, super::random_key(32).unwrap());
    }
}
