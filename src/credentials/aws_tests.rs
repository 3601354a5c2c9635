use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::{HeaderMap, HeaderValue, Method};

use super::*;

const EMPTY_SHA256: &str = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
const PLACEHOLDER_KEY: &str = "sgph_0123456789abcdef0123456789abcdef01234567";
const PLACEHOLDER_SIGNATURE: &str =
    "deadbeefdeadbeefdeadbeefdeadbeefdeadbeefdeadbeefdeadbeefdeadbeef";

fn at(unix: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(unix)
}

fn keys(id: &str, secret: &str, token: Option<&str>) -> AwsKeys {
    AwsKeys {
        access_key_id: id.into(),
        secret_access_key: Secret::new(secret),
        session_token: token.map(Secret::new),
    }
}

fn signed_by(service: &str, region: &str, signed_headers: &[&str]) -> SignedBy {
    SignedBy {
        access_key_id: PLACEHOLDER_KEY.into(),
        date: "20150830".into(),
        region: region.into(),
        service: service.into(),
        signed_headers: signed_headers.iter().map(|s| s.to_string()).collect(),
    }
}

fn header_map(pairs: &[(&str, &str)]) -> HeaderMap {
    let mut map = HeaderMap::new();
    for (name, value) in pairs {
        map.append(
            http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
            HeaderValue::from_str(value).unwrap(),
        );
    }
    map
}

fn placeholder_authorization(service: &str, signed_headers: &str) -> String {
    format!(
        "AWS4-HMAC-SHA256 Credential={PLACEHOLDER_KEY}/20150830/us-east-1/{service}/aws4_request, \
         SignedHeaders={signed_headers}, Signature={PLACEHOLDER_SIGNATURE}"
    )
}

fn authorization(headers: &HeaderMap) -> &str {
    headers["authorization"].to_str().unwrap()
}

// The published SigV4 test suite, "get-vanilla".
#[test]
fn get_vanilla_known_answer() {
    let mut headers = header_map(&[
        ("x-amz-date", "20150830T123600Z"),
        (
            "authorization",
            &placeholder_authorization("service", "host;x-amz-date"),
        ),
    ]);
    resign(
        &mut headers,
        &Method::GET,
        "https://example.amazonaws.com/",
        "example.amazonaws.com",
        &signed_by("service", "us-east-1", &["host", "x-amz-date"]),
        &Payload::Absent,
        Some(EMPTY_SHA256),
        &keys(
            "AKIDEXAMPLE",
            "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY",
            None,
        ),
        "service",
        "us-east-1",
        at(1440938160),
    )
    .unwrap();
    assert_eq!(
        authorization(&headers),
        "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, \
         SignedHeaders=host;x-amz-date, \
         Signature=5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31"
    );
    assert_eq!(headers["x-amz-date"], "20150830T123600Z");
    assert!(headers["authorization"].is_sensitive());
    // Absent payload: no x-amz-content-sha256 is added, and host is left to the HTTP client.
    assert!(!headers.contains_key("x-amz-content-sha256"));
    assert!(!headers.contains_key("host"));
    assert_eq!(headers.len(), 2);
}

// The S3 documentation's GET Object example (Authenticating Requests: Using the
// Authorization Header, "Example: GET Object").
#[test]
fn s3_get_object_known_answer() {
    let mut headers = header_map(&[
        ("range", "bytes=0-9"),
        ("x-amz-content-sha256", EMPTY_SHA256),
        ("x-amz-date", "20130524T000000Z"),
        (
            "authorization",
            &placeholder_authorization("s3", "host;range;x-amz-content-sha256;x-amz-date"),
        ),
    ]);
    let payload = payload_of(&headers).unwrap();
    assert_eq!(payload, Payload::Hash(EMPTY_SHA256.into()));
    resign(
        &mut headers,
        &Method::GET,
        "https://examplebucket.s3.amazonaws.com/test.txt",
        "examplebucket.s3.amazonaws.com",
        &signed_by(
            "s3",
            "us-east-1",
            &["host", "range", "x-amz-content-sha256", "x-amz-date"],
        ),
        &payload,
        None,
        &keys(
            "AKIAIOSFODNN7EXAMPLE",
            "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
            None,
        ),
        "s3",
        "us-east-1",
        at(1369353600),
    )
    .unwrap();
    assert_eq!(
        authorization(&headers),
        "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request, \
         SignedHeaders=host;range;x-amz-content-sha256;x-amz-date, \
         Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41"
    );
    assert_eq!(headers["x-amz-content-sha256"], EMPTY_SHA256);
}

fn resign_s3_put(token: Option<&str>, extra: &[(&str, &str)]) -> HeaderMap {
    let mut pairs = vec![
        ("x-amz-content-sha256", "UNSIGNED-PAYLOAD"),
        ("x-amz-date", "20240101T000000Z"),
        ("x-amz-security-token", "sgph_placeholder_token"),
        ("content-type", "text/plain"),
        ("user-agent", "aws-sdk-rust/1.0"),
        (
            "authorization",
            "AWS4-HMAC-SHA256 Credential=sgph_0123456789abcdef0123456789abcdef01234567/20240101/us-west-2/s3/aws4_request,SignedHeaders=content-type;host;x-amz-content-sha256;x-amz-date;x-amz-security-token,Signature=deadbeefdeadbeefdeadbeefdeadbeefdeadbeefdeadbeefdeadbeefdeadbeef",
        ),
    ];
    pairs.extend_from_slice(extra);
    let mut headers = header_map(&pairs);
    let by = parse_authorization(headers["authorization"].as_bytes()).unwrap();
    let payload = payload_of(&headers).unwrap();
    resign(
        &mut headers,
        &Method::PUT,
        "https://bucket.s3.us-west-2.amazonaws.com/a/b.txt?x-id=PutObject",
        "bucket.s3.us-west-2.amazonaws.com",
        &by,
        &payload,
        None,
        &keys("AKIAREALKEY000000000", "real/secret+key", token),
        "s3",
        "us-west-2",
        at(1704067200),
    )
    .unwrap();
    headers
}

#[test]
fn resigned_request_keeps_no_trace_of_the_placeholder() {
    let headers = resign_s3_put(Some("RealSessionToken/abc=="), &[]);
    let everything: String = headers
        .iter()
        .map(|(n, v)| format!("{n}: {}\n", v.to_str().unwrap()))
        .collect();
    assert!(!everything.contains("sgph_"), "{everything}");
    assert!(!everything.contains(PLACEHOLDER_SIGNATURE), "{everything}");
    assert!(!everything.contains("real/secret+key"), "{everything}");

    let by = parse_authorization(headers["authorization"].as_bytes()).unwrap();
    assert_eq!(by.access_key_id, "AKIAREALKEY000000000");
    assert_eq!(by.date, "20240101");
    assert_eq!(
        (by.region.as_str(), by.service.as_str()),
        ("us-west-2", "s3")
    );
    // user-agent was not signed by the client and is not signed now; the token is.
    assert_eq!(
        by.signed_headers,
        [
            "content-type",
            "host",
            "x-amz-content-sha256",
            "x-amz-date",
            "x-amz-security-token"
        ]
    );
    assert_eq!(headers["user-agent"], "aws-sdk-rust/1.0");
    assert_eq!(headers["x-amz-content-sha256"], "UNSIGNED-PAYLOAD");
    assert_eq!(headers["x-amz-date"], "20240101T000000Z");
    assert_eq!(headers["x-amz-security-token"], "RealSessionToken/abc==");
    assert!(headers["x-amz-security-token"].is_sensitive());
    assert!(headers["authorization"].is_sensitive());
    assert_eq!(headers.get_all("authorization").iter().count(), 1);
}

#[test]
fn without_a_session_token_the_placeholder_token_is_dropped() {
    let headers = resign_s3_put(None, &[]);
    assert!(!headers.contains_key("x-amz-security-token"));
    let by = parse_authorization(headers["authorization"].as_bytes()).unwrap();
    assert_eq!(
        by.signed_headers,
        ["content-type", "host", "x-amz-content-sha256", "x-amz-date"]
    );
}

#[test]
fn unsigned_headers_do_not_change_the_signature_and_signed_ones_do() {
    let plain = resign_s3_put(None, &[]);
    let unsigned_extra = resign_s3_put(None, &[("x-amz-meta-note", "hello")]);
    assert_eq!(plain["authorization"], unsigned_extra["authorization"]);
    assert_eq!(unsigned_extra["x-amz-meta-note"], "hello");

    let other_type = {
        let mut h = resign_s3_put(None, &[]);
        h.insert("content-type", HeaderValue::from_static("text/html"));
        let by = signed_by("s3", "us-west-2", &["content-type", "host"]);
        resign(
            &mut h,
            &Method::PUT,
            "https://bucket.s3.us-west-2.amazonaws.com/a/b.txt?x-id=PutObject",
            "bucket.s3.us-west-2.amazonaws.com",
            &by,
            &Payload::Unsigned,
            None,
            &keys("AKIAREALKEY000000000", "real/secret+key", None),
            "s3",
            "us-west-2",
            at(1704067200),
        )
        .unwrap();
        h
    };
    assert_ne!(plain["authorization"], other_type["authorization"]);
}

#[test]
fn headers_the_signer_excludes_by_default_are_signed_when_the_client_signed_them() {
    let mut headers = header_map(&[("user-agent", "curl/8"), ("x-amzn-trace-id", "Root=1")]);
    resign(
        &mut headers,
        &Method::GET,
        "https://example.amazonaws.com/",
        "example.amazonaws.com",
        &signed_by(
            "service",
            "us-east-1",
            &["host", "user-agent", "x-amz-date"],
        ),
        &Payload::Absent,
        Some(EMPTY_SHA256),
        &keys("AKIDEXAMPLE", "secret", None),
        "service",
        "us-east-1",
        at(1440938160),
    )
    .unwrap();
    let by = parse_authorization(headers["authorization"].as_bytes()).unwrap();
    assert_eq!(by.signed_headers, ["host", "user-agent", "x-amz-date"]);
    assert_eq!(headers["x-amzn-trace-id"], "Root=1");
}

fn signature_for(service: &str, uri: &str, payload: &Payload, body: Option<&str>) -> String {
    let mut headers = HeaderMap::new();
    resign(
        &mut headers,
        &Method::GET,
        uri,
        "example.amazonaws.com",
        &signed_by(service, "us-east-1", &["host", "x-amz-date"]),
        payload,
        body,
        &keys("AKIDEXAMPLE", "secret", None),
        service,
        "us-east-1",
        at(1440938160),
    )
    .unwrap();
    authorization(&headers)
        .rsplit_once('=')
        .unwrap()
        .1
        .to_owned()
}

#[test]
fn s3_signs_the_path_as_sent_other_services_normalise_it() {
    let hash = Payload::Hash(EMPTY_SHA256.into());
    let s3 = |path: &str| {
        signature_for(
            "s3",
            &format!("https://example.amazonaws.com{path}"),
            &hash,
            None,
        )
    };
    assert_ne!(s3("/a/./b"), s3("/a/b"));
    assert_ne!(s3("/a//b"), s3("/a/b"));
    let other = |path: &str| {
        signature_for(
            "service",
            &format!("https://example.amazonaws.com{path}"),
            &Payload::Absent,
            Some(EMPTY_SHA256),
        )
    };
    assert_eq!(other("/a/./b"), other("/a/b"));
    assert_eq!(other("/a/../b"), other("/b"));
}

#[test]
fn the_declared_payload_is_what_is_signed() {
    let uri = "https://example.amazonaws.com/k";
    let unsigned = signature_for("s3", uri, &Payload::Unsigned, None);
    let hashed = signature_for("s3", uri, &Payload::Hash(EMPTY_SHA256.into()), None);
    let upper = signature_for(
        "s3",
        uri,
        &Payload::Hash(EMPTY_SHA256.to_ascii_uppercase()),
        None,
    );
    let trailer = signature_for("s3", uri, &Payload::StreamingUnsignedTrailer, None);
    assert_ne!(unsigned, hashed);
    assert_ne!(unsigned, trailer);
    assert_eq!(hashed, upper);

    let mut headers = HeaderMap::new();
    resign(
        &mut headers,
        &Method::PUT,
        uri,
        "example.amazonaws.com",
        &signed_by("s3", "us-east-1", &["host"]),
        &Payload::StreamingUnsignedTrailer,
        None,
        &keys("AKIDEXAMPLE", "secret", None),
        "s3",
        "us-east-1",
        at(1440938160),
    )
    .unwrap();
    assert_eq!(
        headers["x-amz-content-sha256"],
        "STREAMING-UNSIGNED-PAYLOAD-TRAILER"
    );
}

#[test]
fn resign_refusals_leave_the_headers_alone() {
    let original = header_map(&[
        ("x-amz-date", "20150830T123600Z"),
        ("authorization", &placeholder_authorization("s3", "host")),
    ]);
    let by = signed_by("s3", "us-east-1", &["host", "x-amz-date"]);
    let k = keys("AKIDEXAMPLE", "secret", None);
    let attempt = |payload: &Payload, body: Option<&str>, host: &str, extra: Option<&str>| {
        let mut headers = original.clone();
        if let Some(h) = extra {
            headers.insert("host", HeaderValue::from_str(h).unwrap());
        }
        let before = headers.clone();
        let e = resign(
            &mut headers,
            &Method::GET,
            "https://example.amazonaws.com/",
            host,
            &by,
            payload,
            body,
            &k,
            "s3",
            "us-east-1",
            at(1440938160),
        )
        .unwrap_err();
        assert_eq!(headers, before);
        e.code()
    };
    let host = "example.amazonaws.com";
    assert_eq!(
        attempt(&Payload::StreamingSignedEcdsa, None, host, None),
        "aws_streaming_signature_unsupported"
    );
    assert_eq!(
        attempt(&Payload::Absent, None, host, None),
        "aws_payload_hash_invalid"
    );
    assert_eq!(
        attempt(&Payload::Absent, Some("abc"), host, None),
        "aws_payload_hash_invalid"
    );
    assert_eq!(
        attempt(&Payload::Hash("xyz".into()), None, host, None),
        "aws_payload_hash_invalid"
    );
    assert_eq!(
        attempt(&Payload::Unsigned, None, host, Some("evil.example")),
        "aws_signing_failed"
    );
    assert_eq!(
        attempt(&Payload::Unsigned, None, "", None),
        "aws_signing_failed"
    );
    // The same Host (any case) is fine.
    let mut headers = original.clone();
    headers.insert("host", HeaderValue::from_static("Example.amazonaws.com"));
    resign(
        &mut headers,
        &Method::GET,
        "https://example.amazonaws.com/",
        host,
        &by,
        &Payload::Unsigned,
        None,
        &k,
        "s3",
        "us-east-1",
        at(1440938160),
    )
    .unwrap();
}

#[test]
fn the_host_header_is_given_not_taken_from_the_uri() {
    // `:443` in the URI is not part of Host; a non-default port is.
    let sig = |uri: &str, host: &str| {
        let mut headers = HeaderMap::new();
        resign(
            &mut headers,
            &Method::GET,
            uri,
            host,
            &signed_by("s3", "us-east-1", &["host"]),
            &Payload::Unsigned,
            None,
            &keys("AKIDEXAMPLE", "secret", None),
            "s3",
            "us-east-1",
            at(1440938160),
        )
        .unwrap();
        authorization(&headers).to_owned()
    };
    assert_eq!(
        sig("https://example.com:443/", "example.com"),
        sig("https://example.com/", "example.com")
    );
    assert_ne!(
        sig("https://example.com:8443/", "example.com:8443"),
        sig("https://example.com/", "example.com")
    );
}

#[test]
fn parse_authorization_good_forms() {
    let by = parse_authorization(
        b"AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, SignedHeaders=host;x-amz-date, Signature=5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31",
    )
    .unwrap();
    assert_eq!(
        by,
        SignedBy {
            access_key_id: "AKIDEXAMPLE".into(),
            date: "20150830".into(),
            region: "us-east-1".into(),
            service: "service".into(),
            signed_headers: vec!["host".into(), "x-amz-date".into()],
        }
    );
    // No spaces after the commas (botocore), several spaces, another order, upper-case names.
    let sig = "Signature=5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31";
    for text in [
        format!("AWS4-HMAC-SHA256 Credential={PLACEHOLDER_KEY}/20240101/eu-west-1/s3/aws4_request,SignedHeaders=Host;X-Amz-Date,{sig}"),
        format!("AWS4-HMAC-SHA256   Credential={PLACEHOLDER_KEY}/20240101/eu-west-1/s3/aws4_request,   SignedHeaders=host;x-amz-date ,  {sig} "),
        format!("AWS4-HMAC-SHA256 {sig}, SignedHeaders=host;x-amz-date, Credential={PLACEHOLDER_KEY}/20240101/eu-west-1/s3/aws4_request"),
    ] {
        let by = parse_authorization(text.as_bytes()).unwrap_or_else(|e| panic!("{text}: {e}"));
        assert_eq!(by.access_key_id, PLACEHOLDER_KEY);
        assert_eq!(by.service, "s3");
        assert_eq!(by.region, "eu-west-1");
        assert_eq!(by.signed_headers, ["host", "x-amz-date"]);
    }
}

#[test]
fn parse_authorization_malformed_forms() {
    let cred = "Credential=AK/20150830/us-east-1/s3/aws4_request";
    let sh = "SignedHeaders=host";
    let sig = "Signature=5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31";
    let cases: Vec<(String, &str)> = vec![
        (String::new(), "aws_authorization_malformed"),
        ("Bearer abc".into(), "aws_authorization_malformed"),
        (
            format!("AWS4-HMAC-SHA256{cred}, {sh}, {sig}"),
            "aws_authorization_malformed",
        ),
        (
            format!("AWS4-HMAC-SHA256 {cred}, {sh}"),
            "aws_authorization_malformed",
        ),
        (
            format!("AWS4-HMAC-SHA256 {cred}, {sh}, {sig},"),
            "aws_authorization_malformed",
        ),
        (
            format!("AWS4-HMAC-SHA256 {cred}, {cred}, {sh}, {sig}"),
            "aws_authorization_malformed",
        ),
        (
            format!("AWS4-HMAC-SHA256 {cred}, {sh}, {sig}, Extra=1"),
            "aws_authorization_malformed",
        ),
        (
            format!("AWS4-HMAC-SHA256 {cred}; {sh}; {sig}"),
            "aws_authorization_malformed",
        ),
        (
            format!("AWS4-HMAC-SHA256 {cred}, {sh}, Signature=abc"),
            "aws_authorization_malformed",
        ),
        (
            format!("AWS4-HMAC-SHA256 {cred}, {sh}, {sig}00"),
            "aws_authorization_malformed",
        ),
        (
            format!("AWS4-HMAC-SHA256 Credential=AK/20150830/us-east-1/s3, {sh}, {sig}"),
            "aws_authorization_malformed",
        ),
        (
            format!(
                "AWS4-HMAC-SHA256 Credential=AK/20150830/us-east-1/s3/aws4_request/x, {sh}, {sig}"
            ),
            "aws_authorization_malformed",
        ),
        (
            format!(
                "AWS4-HMAC-SHA256 Credential=AK/2015083/us-east-1/s3/aws4_request, {sh}, {sig}"
            ),
            "aws_authorization_malformed",
        ),
        (
            format!("AWS4-HMAC-SHA256 Credential=/20150830/us-east-1/s3/aws4_request, {sh}, {sig}"),
            "aws_authorization_malformed",
        ),
        (
            format!(
                "AWS4-HMAC-SHA256 Credential=A K/20150830/us-east-1/s3/aws4_request, {sh}, {sig}"
            ),
            "aws_authorization_malformed",
        ),
        (
            format!(
                "AWS4-HMAC-SHA256 Credential=AK/20150830/US-EAST-1/s3/aws4_request, {sh}, {sig}"
            ),
            "aws_authorization_malformed",
        ),
        (
            format!("AWS4-HMAC-SHA256 Credential=AK/20150830/us-east-1//aws4_request, {sh}, {sig}"),
            "aws_authorization_malformed",
        ),
        (
            format!(
                "AWS4-HMAC-SHA256 Credential=AK/20150830/us-east-1/s3/aws5_request, {sh}, {sig}"
            ),
            "aws_authorization_malformed",
        ),
        (
            format!("AWS4-HMAC-SHA256 {cred}, SignedHeaders=, {sig}"),
            "aws_authorization_malformed",
        ),
        (
            format!("AWS4-HMAC-SHA256 {cred}, SignedHeaders=host;;x-amz-date, {sig}"),
            "aws_authorization_malformed",
        ),
        (
            format!("AWS4-HMAC-SHA256 {cred}, SignedHeaders=host;Host, {sig}"),
            "aws_authorization_malformed",
        ),
        (
            format!("AWS4-HMAC-SHA256 {cred}, SignedHeaders=ho st, {sig}"),
            "aws_authorization_malformed",
        ),
        (
            format!(
                "AWS4-HMAC-SHA256 {cred}, SignedHeaders={}, {sig}",
                (0..200)
                    .map(|i| format!("h{i}"))
                    .collect::<Vec<_>>()
                    .join(";")
            ),
            "aws_authorization_malformed",
        ),
        (
            format!("AWS4-HMAC-SHA256 {cred}, {sh}, {sig}{}", " ".repeat(9000)),
            "aws_authorization_malformed",
        ),
        (
            format!("AWS4-ECDSA-P256-SHA256 Credential=AK/20150830/s3/aws4_request, {sh}, {sig}"),
            "aws_signature_algorithm_unsupported",
        ),
    ];
    for (text, code) in cases {
        let e = parse_authorization(text.as_bytes()).unwrap_err();
        assert_eq!(e.code(), code, "{text:?}");
    }
    let e = parse_authorization(b"AWS4-HMAC-SHA256 Credential=\xff/x").unwrap_err();
    assert_eq!(e.code(), "aws_authorization_malformed");
}

#[test]
fn errors_do_not_quote_their_input() {
    let text = "AWS4-HMAC-SHA256 Credential=SECRETISH/20150830/us-east-1/s3/aws4_request, SignedHeaders=host, Signature=zz";
    let e = parse_authorization(text.as_bytes()).unwrap_err();
    assert!(!format!("{e} {e:?}").contains("SECRETISH"));
}

#[test]
fn payload_of_each_value() {
    let of = |v: &str| payload_of(&header_map(&[("x-amz-content-sha256", v)]));
    assert_eq!(payload_of(&HeaderMap::new()).unwrap(), Payload::Absent);
    assert_eq!(of("UNSIGNED-PAYLOAD").unwrap(), Payload::Unsigned);
    assert_eq!(
        of(EMPTY_SHA256).unwrap(),
        Payload::Hash(EMPTY_SHA256.into())
    );
    assert_eq!(
        of(&EMPTY_SHA256.to_ascii_uppercase()).unwrap(),
        Payload::Hash(EMPTY_SHA256.into())
    );
    assert_eq!(
        of("STREAMING-UNSIGNED-PAYLOAD-TRAILER").unwrap(),
        Payload::StreamingUnsignedTrailer
    );
    assert_eq!(
        of("STREAMING-AWS4-HMAC-SHA256-PAYLOAD").unwrap(),
        Payload::StreamingSigned { trailer: false }
    );
    assert_eq!(
        of("STREAMING-AWS4-HMAC-SHA256-PAYLOAD-TRAILER").unwrap(),
        Payload::StreamingSigned { trailer: true }
    );
    for v in [
        "STREAMING-AWS4-ECDSA-P256-SHA256-PAYLOAD",
        "STREAMING-AWS4-ECDSA-P256-SHA256-PAYLOAD-TRAILER",
    ] {
        assert_eq!(of(v).unwrap(), Payload::StreamingSignedEcdsa, "{v}");
    }
    for v in [
        "",
        "unsigned-payload",
        "UNSIGNED-PAYLOAD ",
        &EMPTY_SHA256[1..],
        &format!("{EMPTY_SHA256}0"),
        "g3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
        "STREAMING-SOMETHING",
    ] {
        assert_eq!(
            of(v).unwrap_err().code(),
            "aws_payload_hash_invalid",
            "{v:?}"
        );
    }
    let two = header_map(&[
        ("x-amz-content-sha256", "UNSIGNED-PAYLOAD"),
        ("x-amz-content-sha256", "UNSIGNED-PAYLOAD"),
    ]);
    assert_eq!(
        payload_of(&two).unwrap_err().code(),
        "aws_payload_hash_invalid"
    );
}

#[test]
fn keys_parse() {
    let parse = |s: &str| AwsKeys::parse(&Secret::new(s));
    let k = parse(r#"{"access_key_id": "AKIA1", "secret_access_key": "s/e+c"}"#).unwrap();
    assert_eq!(k.access_key_id, "AKIA1");
    assert_eq!(k.secret_access_key.expose(), "s/e+c");
    assert!(k.session_token.is_none());
    let k = parse(r#"{"access_key_id":"AKIA1","secret_access_key":"s","session_token":"tok=="}"#)
        .unwrap();
    assert_eq!(k.session_token.unwrap().expose(), "tok==");

    for bad in [
        "",
        "not json",
        "[]",
        r#"{"access_key_id": "AKIA1"}"#,
        r#"{"secret_access_key": "s"}"#,
        r#"{"access_key_id": "", "secret_access_key": "s"}"#,
        r#"{"access_key_id": "AKIA1", "secret_access_key": ""}"#,
        r#"{"access_key_id": "AKIA1", "secret_access_key": "s", "session_token": ""}"#,
        r#"{"access_key_id": "AK/IA", "secret_access_key": "s"}"#,
        r#"{"access_key_id": "AKIA1", "secret_access_key": "s", "session_token": "a b"}"#,
        r#"{"access_key_id": "AKIA1", "secret_access_key": "s", "region": "us-east-1"}"#,
    ] {
        assert_eq!(
            parse(bad).unwrap_err().code(),
            "aws_credential_invalid",
            "{bad}"
        );
    }
    // Neither serde's message nor Debug may show the secret.
    for doc in [
        r#"{"access_key_id": "AKIA1", "hunter2-secret": "x"}"#,
        r#"{"access_key_id": "AKIA1", "secret_access_key": 12345678}"#,
        r#"{"access_key_id": "AKIA1", "secret_access_key": "hunter2-secret", "session_token": 5}"#,
    ] {
        let e = parse(doc).unwrap_err();
        let text = format!("{e} {e:?}");
        assert!(
            !text.contains("hunter2") && !text.contains("12345678"),
            "{text}"
        );
    }
    let k = parse(
        r#"{"access_key_id":"AKIA1","secret_access_key":"hunter2","session_token":"tokhunter"}"#,
    )
    .unwrap();
    assert!(!format!("{k:?}").contains("hunter"));
}

fn op(method: &str, host: &str, target: &str, headers: &[(&str, &str)]) -> Operation {
    operation(
        "s3",
        "us-east-1",
        method,
        host,
        target,
        &header_map(headers),
    )
}

#[test]
fn s3_operations() {
    type Row<'a> = (
        &'a str,
        &'a str,
        &'a str,
        &'a [(&'a str, &'a str)],
        Option<&'a str>,
        Option<&'a str>,
        Option<&'a str>,
        Option<&'a str>,
    );
    const PATH: &str = "s3.amazonaws.com";
    const REGIONAL: &str = "s3.eu-west-1.amazonaws.com";
    const VHOST: &str = "my.bucket.s3.amazonaws.com";
    const VHOST_REGION: &str = "bkt.s3.eu-west-1.amazonaws.com";
    const VHOST_DASH: &str = "bkt.s3-eu-west-1.amazonaws.com";
    const COPY: &[(&str, &str)] = &[("x-amz-copy-source", "/src/dir%20a/file?versionId=3")];
    let rows: &[Row] = &[
        (
            "GET",
            PATH,
            "/",
            &[],
            Some("ListBuckets"),
            Some("s3:ListAllMyBuckets"),
            None,
            None,
        ),
        (
            "GET",
            REGIONAL,
            "/?max-buckets=10",
            &[],
            Some("ListBuckets"),
            Some("s3:ListAllMyBuckets"),
            None,
            None,
        ),
        ("PUT", PATH, "/", &[], None, None, None, None),
        (
            "PUT",
            PATH,
            "/bkt",
            &[],
            Some("CreateBucket"),
            Some("s3:CreateBucket"),
            Some("bkt"),
            None,
        ),
        (
            "PUT",
            VHOST,
            "/",
            &[],
            Some("CreateBucket"),
            Some("s3:CreateBucket"),
            Some("my.bucket"),
            None,
        ),
        (
            "DELETE",
            REGIONAL,
            "/bkt/",
            &[],
            Some("DeleteBucket"),
            Some("s3:DeleteBucket"),
            Some("bkt"),
            None,
        ),
        (
            "HEAD",
            VHOST_REGION,
            "/",
            &[],
            Some("HeadBucket"),
            Some("s3:ListBucket"),
            Some("bkt"),
            None,
        ),
        (
            "GET",
            PATH,
            "/bkt?list-type=2&prefix=a%2F&delimiter=%2F",
            &[],
            Some("ListObjectsV2"),
            Some("s3:ListBucket"),
            Some("bkt"),
            None,
        ),
        (
            "GET",
            VHOST_DASH,
            "/?list-type=2",
            &[],
            Some("ListObjectsV2"),
            Some("s3:ListBucket"),
            Some("bkt"),
            None,
        ),
        (
            "GET",
            VHOST,
            "/?prefix=x&marker=y",
            &[],
            Some("ListObjects"),
            Some("s3:ListBucket"),
            Some("my.bucket"),
            None,
        ),
        (
            "GET",
            VHOST,
            "/?list-type=3",
            &[],
            None,
            None,
            Some("my.bucket"),
            None,
        ),
        (
            "GET",
            PATH,
            "/bkt?location",
            &[],
            Some("GetBucketLocation"),
            Some("s3:GetBucketLocation"),
            Some("bkt"),
            None,
        ),
        (
            "GET",
            VHOST_REGION,
            "/?versions&prefix=a",
            &[],
            Some("ListObjectVersions"),
            Some("s3:ListBucketVersions"),
            Some("bkt"),
            None,
        ),
        (
            "GET",
            PATH,
            "/bkt?uploads",
            &[],
            Some("ListMultipartUploads"),
            Some("s3:ListBucketMultipartUploads"),
            Some("bkt"),
            None,
        ),
        (
            "POST",
            VHOST,
            "/?delete",
            &[],
            Some("DeleteObjects"),
            Some("s3:DeleteObject"),
            Some("my.bucket"),
            None,
        ),
        (
            "GET",
            PATH,
            "/bkt?policy",
            &[],
            Some("GetBucketPolicy"),
            Some("s3:GetBucketPolicy"),
            Some("bkt"),
            None,
        ),
        (
            "PUT",
            PATH,
            "/bkt?policy",
            &[],
            Some("PutBucketPolicy"),
            Some("s3:PutBucketPolicy"),
            Some("bkt"),
            None,
        ),
        (
            "DELETE",
            VHOST,
            "/?policy",
            &[],
            Some("DeleteBucketPolicy"),
            Some("s3:DeleteBucketPolicy"),
            Some("my.bucket"),
            None,
        ),
        (
            "GET",
            VHOST,
            "/?acl",
            &[],
            Some("GetBucketAcl"),
            Some("s3:GetBucketAcl"),
            Some("my.bucket"),
            None,
        ),
        (
            "PUT",
            PATH,
            "/bkt?acl",
            &[],
            Some("PutBucketAcl"),
            Some("s3:PutBucketAcl"),
            Some("bkt"),
            None,
        ),
        (
            "GET",
            PATH,
            "/bkt?tagging",
            &[],
            Some("GetBucketTagging"),
            Some("s3:GetBucketTagging"),
            Some("bkt"),
            None,
        ),
        (
            "PUT",
            VHOST,
            "/?tagging",
            &[],
            Some("PutBucketTagging"),
            Some("s3:PutBucketTagging"),
            Some("my.bucket"),
            None,
        ),
        (
            "GET",
            PATH,
            "/bkt?website",
            &[],
            None,
            None,
            Some("bkt"),
            None,
        ),
        (
            "GET",
            PATH,
            "/bkt?acl&tagging",
            &[],
            None,
            None,
            Some("bkt"),
            None,
        ),
        (
            "GET",
            PATH,
            "/bkt/dir/a%20b.txt",
            &[],
            Some("GetObject"),
            Some("s3:GetObject"),
            Some("bkt"),
            Some("dir/a b.txt"),
        ),
        (
            "GET",
            VHOST,
            "/dir/a%20b.txt?x-id=GetObject&versionId=1",
            &[],
            Some("GetObject"),
            Some("s3:GetObject"),
            Some("my.bucket"),
            Some("dir/a b.txt"),
        ),
        (
            "GET",
            VHOST,
            "//lead",
            &[],
            Some("GetObject"),
            Some("s3:GetObject"),
            Some("my.bucket"),
            Some("/lead"),
        ),
        (
            "GET",
            VHOST_REGION,
            "/k?acl",
            &[],
            Some("GetObjectAcl"),
            Some("s3:GetObjectAcl"),
            Some("bkt"),
            Some("k"),
        ),
        (
            "GET",
            VHOST_REGION,
            "/k?tagging",
            &[],
            Some("GetObjectTagging"),
            Some("s3:GetObjectTagging"),
            Some("bkt"),
            Some("k"),
        ),
        (
            "GET",
            PATH,
            "/bkt/k?attributes",
            &[],
            Some("GetObjectAttributes"),
            Some("s3:GetObjectAttributes"),
            Some("bkt"),
            Some("k"),
        ),
        (
            "GET",
            PATH,
            "/bkt/k?uploadId=u1&max-parts=5",
            &[],
            Some("ListParts"),
            Some("s3:ListMultipartUploadParts"),
            Some("bkt"),
            Some("k"),
        ),
        (
            "GET",
            PATH,
            "/bkt/k?torrent",
            &[],
            None,
            None,
            Some("bkt"),
            Some("k"),
        ),
        (
            "PUT",
            PATH,
            "/bkt/k+plus",
            &[],
            Some("PutObject"),
            Some("s3:PutObject"),
            Some("bkt"),
            Some("k+plus"),
        ),
        (
            "PUT",
            VHOST_DASH,
            "/k",
            COPY,
            Some("CopyObject"),
            Some("s3:PutObject"),
            Some("bkt"),
            Some("k"),
        ),
        (
            "PUT",
            VHOST,
            "/k?partNumber=2&uploadId=u1",
            &[],
            Some("UploadPart"),
            Some("s3:PutObject"),
            Some("my.bucket"),
            Some("k"),
        ),
        (
            "PUT",
            VHOST,
            "/k?partNumber=2&uploadId=u1",
            COPY,
            Some("UploadPartCopy"),
            Some("s3:PutObject"),
            Some("my.bucket"),
            Some("k"),
        ),
        (
            "PUT",
            VHOST,
            "/k?uploadId=u1",
            &[],
            None,
            None,
            Some("my.bucket"),
            Some("k"),
        ),
        (
            "PUT",
            PATH,
            "/bkt/k?acl",
            &[],
            Some("PutObjectAcl"),
            Some("s3:PutObjectAcl"),
            Some("bkt"),
            Some("k"),
        ),
        (
            "PUT",
            PATH,
            "/bkt/k?tagging",
            &[],
            Some("PutObjectTagging"),
            Some("s3:PutObjectTagging"),
            Some("bkt"),
            Some("k"),
        ),
        (
            "HEAD",
            PATH,
            "/bkt/k",
            &[],
            Some("HeadObject"),
            Some("s3:GetObject"),
            Some("bkt"),
            Some("k"),
        ),
        (
            "DELETE",
            PATH,
            "/bkt/k",
            &[],
            Some("DeleteObject"),
            Some("s3:DeleteObject"),
            Some("bkt"),
            Some("k"),
        ),
        (
            "DELETE",
            VHOST,
            "/k?uploadId=u1",
            &[],
            Some("AbortMultipartUpload"),
            Some("s3:AbortMultipartUpload"),
            Some("my.bucket"),
            Some("k"),
        ),
        (
            "DELETE",
            VHOST,
            "/k?tagging",
            &[],
            Some("DeleteObjectTagging"),
            Some("s3:DeleteObjectTagging"),
            Some("my.bucket"),
            Some("k"),
        ),
        (
            "POST",
            PATH,
            "/bkt/k?uploads",
            &[],
            Some("CreateMultipartUpload"),
            Some("s3:PutObject"),
            Some("bkt"),
            Some("k"),
        ),
        (
            "POST",
            PATH,
            "/bkt/k?uploadId=u1",
            &[],
            Some("CompleteMultipartUpload"),
            Some("s3:PutObject"),
            Some("bkt"),
            Some("k"),
        ),
        (
            "PATCH",
            PATH,
            "/bkt/k",
            &[],
            None,
            None,
            Some("bkt"),
            Some("k"),
        ),
        // Other hosts (a custom endpoint, a port, an IP) with no endpoint configured: path or
        // virtual-hosted cannot be told, so nothing is named (see `s3_compatible_endpoints`).
        (
            "GET",
            "minio.internal:9000",
            "/bkt/k",
            &[],
            None,
            None,
            None,
            None,
        ),
        ("GET", "127.0.0.1", "/bkt", &[], None, None, None, None),
        (
            "GET",
            "s3.dualstack.eu-west-1.amazonaws.com",
            "/bkt/k",
            &[],
            Some("GetObject"),
            Some("s3:GetObject"),
            Some("bkt"),
            Some("k"),
        ),
        // Virtual-hosted variants, with a port and upper case.
        (
            "GET",
            "bkt.s3.dualstack.eu-west-1.amazonaws.com",
            "/k",
            &[],
            Some("GetObject"),
            Some("s3:GetObject"),
            Some("bkt"),
            Some("k"),
        ),
        (
            "GET",
            "BKT.S3.AMAZONAWS.COM:443",
            "/k",
            &[],
            Some("GetObject"),
            Some("s3:GetObject"),
            Some("bkt"),
            Some("k"),
        ),
        (
            "GET",
            "s3-logs.s3.amazonaws.com",
            "/k",
            &[],
            Some("GetObject"),
            Some("s3:GetObject"),
            Some("s3-logs"),
            Some("k"),
        ),
        (
            "GET",
            "bkt.s3.cn-north-1.amazonaws.com.cn",
            "/k",
            &[],
            Some("GetObject"),
            Some("s3:GetObject"),
            Some("bkt"),
            Some("k"),
        ),
    ];
    for &(method, host, target, headers, operation, action, bucket, key) in rows {
        let o = op(method, host, target, headers);
        let got = (
            o.operation.as_deref(),
            o.action.as_deref(),
            o.bucket.as_deref(),
            o.key.as_deref(),
        );
        assert_eq!(
            got,
            (operation, action, bucket, key),
            "{method} {host} {target}"
        );
        assert_eq!(o.service, "s3");
        assert_eq!(o.region, "us-east-1");
    }
    let copy = op("PUT", VHOST_DASH, "/k", COPY);
    assert_eq!(copy.resource.as_deref(), Some("src/dir a/file"));
    assert_eq!(op("PUT", VHOST_DASH, "/k", &[]).resource, None);
}

#[test]
fn json_query_and_bedrock_operations() {
    let dynamo = operation(
        "dynamodb",
        "us-east-1",
        "POST",
        "dynamodb.us-east-1.amazonaws.com",
        "/",
        &header_map(&[("x-amz-target", "DynamoDB_20120810.GetItem")]),
    );
    assert_eq!(dynamo.operation.as_deref(), Some("GetItem"));
    assert_eq!(dynamo.action.as_deref(), Some("dynamodb:GetItem"));
    assert_eq!(
        (dynamo.bucket, dynamo.key, dynamo.resource),
        (None, None, None)
    );

    let cloudwatch = operation(
        "monitoring",
        "us-east-1",
        "POST",
        "monitoring.us-east-1.amazonaws.com",
        "/",
        &header_map(&[(
            "x-amz-target",
            "GraniteServiceVersion20100801.GetMetricData",
        )]),
    );
    assert_eq!(
        cloudwatch.action.as_deref(),
        Some("cloudwatch:GetMetricData")
    );

    let sts = operation(
        "sts",
        "us-east-1",
        "GET",
        "sts.amazonaws.com",
        "/?Action=GetCallerIdentity&Version=2011-06-15",
        &HeaderMap::new(),
    );
    assert_eq!(sts.action.as_deref(), Some("sts:GetCallerIdentity"));

    for bad in ["NoDot", "Prefix.", "Prefix.Get-Item", "Prefix.Get Item"] {
        let o = operation(
            "dynamodb",
            "us-east-1",
            "POST",
            "h",
            "/",
            &header_map(&[("x-amz-target", bad)]),
        );
        assert_eq!((o.operation, o.action), (None, None), "{bad}");
    }
    let two = header_map(&[("x-amz-target", "A.B"), ("x-amz-target", "A.C")]);
    assert_eq!(
        operation("dynamodb", "r", "POST", "h", "/", &two).operation,
        None
    );

    let bedrock = |method: &str, path: &str| {
        operation(
            "bedrock",
            "us-west-2",
            method,
            "bedrock-runtime.us-west-2.amazonaws.com",
            path,
            &HeaderMap::new(),
        )
    };
    for (path, operation, action) in [
        (
            "/model/anthropic.claude-3/invoke",
            "InvokeModel",
            "bedrock:InvokeModel",
        ),
        (
            "/model/anthropic.claude-3/invoke-with-response-stream",
            "InvokeModelWithResponseStream",
            "bedrock:InvokeModelWithResponseStream",
        ),
        (
            "/model/anthropic.claude-3/converse",
            "Converse",
            "bedrock:InvokeModel",
        ),
        (
            "/model/anthropic.claude-3/converse-stream",
            "ConverseStream",
            "bedrock:InvokeModelWithResponseStream",
        ),
    ] {
        let o = bedrock("POST", path);
        assert_eq!(o.operation.as_deref(), Some(operation), "{path}");
        assert_eq!(o.action.as_deref(), Some(action), "{path}");
        assert_eq!(o.resource.as_deref(), Some("anthropic.claude-3"));
        assert_eq!(o.service, "bedrock");
    }
    let arn = bedrock(
        "POST",
        "/model/arn%3Aaws%3Abedrock%3Aus-west-2%3A1%3Ainference-profile%2Fus.x/converse",
    );
    assert_eq!(
        arn.resource.as_deref(),
        Some("arn:aws:bedrock:us-west-2:1:inference-profile/us.x")
    );
    for (method, path) in [
        ("GET", "/model/m/invoke"),
        ("POST", "/model//invoke"),
        ("POST", "/model/m/other"),
        ("POST", "/model/m/invoke/extra"),
        ("POST", "/foundation-models"),
    ] {
        let o = bedrock(method, path);
        assert_eq!((o.operation, o.action), (None, None), "{method} {path}");
    }
}

/// R2, MinIO and other S3-compatible services: the credential's `endpoint` says where the
/// bucket is; without it a host that is not AWS's names nothing.
#[test]
fn s3_compatible_endpoints() {
    let at = |endpoint: Option<&str>, method: &str, host: &str, target: &str| {
        let o = operation_at(
            "s3",
            "auto",
            endpoint,
            method,
            host,
            target,
            &HeaderMap::new(),
        );
        (o.addressing, o.bucket, o.key, o.operation.and(o.action))
    };
    let owned = |s: &str| Some(s.to_string());
    const EP: Option<&str> = Some("s3.example-compatible.test");
    assert_eq!(
        at(
            EP,
            "DELETE",
            "bucket.s3.example-compatible.test:8443",
            "/keep/v.txt"
        ),
        (
            Some("virtual_hosted"),
            owned("bucket"),
            owned("keep/v.txt"),
            owned("s3:DeleteObject")
        )
    );
    assert_eq!(
        at(EP, "GET", "My.Bucket.S3.Example-Compatible.Test.", "/"),
        (
            Some("virtual_hosted"),
            owned("my.bucket"),
            None,
            owned("s3:ListBucket")
        )
    );
    assert_eq!(
        at(EP, "DELETE", "s3.example-compatible.test", "/keep/v.txt"),
        (
            Some("path"),
            owned("keep"),
            owned("v.txt"),
            owned("s3:DeleteObject")
        )
    );
    // A host that only ends like the endpoint, or another host: unknown.
    for host in [
        "xs3.example-compatible.test",
        "bucket.s3.other.test",
        "s3.example-compatible.test.evil",
    ] {
        assert_eq!(
            at(EP, "DELETE", host, "/keep/v.txt"),
            (None, None, None, None),
            "{host}"
        );
    }
    assert_eq!(
        at(
            None,
            "DELETE",
            "bucket.s3.example-compatible.test",
            "/keep/v.txt"
        ),
        (None, None, None, None)
    );
    // AWS's names are read as before, endpoint or not; other services have no addressing.
    assert_eq!(
        at(EP, "GET", "bkt.s3.us-east-1.amazonaws.com", "/k").1,
        owned("bkt")
    );
    assert_eq!(
        at(None, "GET", "dynamodb.us-east-1.amazonaws.com", "/bkt/k"),
        (None, None, None, None)
    );
    assert!(is_endpoint_name("s3.example-compatible.test"));
    for bad in [
        "",
        "https://s3.example",
        "s3.example:9000",
        "s3..example",
        "S3.example",
        "s3.example/",
    ] {
        assert!(!is_endpoint_name(bad), "{bad}");
    }
}

#[test]
fn operation_to_value() {
    let o = op("GET", "bkt.s3.amazonaws.com", "/k", &[]);
    let v = o.to_value();
    let expected = regorus::Value::from(serde_json::json!({
        "service": "s3", "region": "us-east-1", "operation": "GetObject",
        "action": "s3:GetObject", "bucket": "bkt", "key": "k", "resource": null,
        "addressing": "virtual_hosted",
    }));
    assert_eq!(v, expected);
}

proptest::proptest! {
    #[test]
    fn parse_authorization_never_panics(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..512)) {
        let _ = parse_authorization(&bytes);
        let mut prefixed = b"AWS4-HMAC-SHA256 Credential=".to_vec();
        prefixed.extend_from_slice(&bytes);
        let _ = parse_authorization(&prefixed);
    }

    #[test]
    fn parse_authorization_structured_never_panics(
        text in "AWS4-HMAC-SHA256[ ,]{0,3}((Credential|SignedHeaders|Signature)=[A-Za-z0-9/;_ -]{0,70}[, ]{0,2}){0,4}"
    ) {
        let _ = parse_authorization(text.as_bytes());
    }

    #[test]
    fn payload_of_never_panics(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..80)) {
        if let Ok(value) = HeaderValue::from_bytes(&bytes) {
            let mut headers = HeaderMap::new();
            headers.insert("x-amz-content-sha256", value);
            let _ = payload_of(&headers);
        }
    }

    #[test]
    fn operation_never_panics(
        method in "(GET|PUT|POST|DELETE|HEAD|X)",
        host in "[a-z0-9.:-]{0,40}(\\.s3(-[a-z0-9-]{0,12})?(\\.[a-z0-9-]{0,12})?\\.amazonaws\\.com)?",
        target in "[/a-z%0-9?&=.+-]{0,60}",
        service in "(s3|bedrock|dynamodb)",
    ) {
        let _ = operation(&service, "us-east-1", &method, &host, &target, &HeaderMap::new());
    }
}
