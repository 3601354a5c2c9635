//! Time. Records (rows, samples, expiry stamps) use wall-clock milliseconds since the Unix
//! epoch, because they are compared across restarts and machines.

/// `at` in RFC 3339 (UTC), as the API and the decision log show times.
pub fn rfc3339(at: std::time::SystemTime) -> String {
    time::OffsetDateTime::from(at)
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default()
}

/// Milliseconds since the Unix epoch (0 if the clock is before it).
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}
