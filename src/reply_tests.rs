use http::StatusCode;
use http_body_util::Full;

use super::*;
use crate::error::{Error, Kind};

fn body_of(reply: &ErrorReply) -> (http::Response<Full<Bytes>>, Value) {
    let response = reply.to_response::<Full<Bytes>>();
    (response, reply.body())
}

#[test]
fn every_kind_answers_its_status_and_only_the_proxy_asks_for_proxy_credentials() {
    let e = Error::new(Kind::Unauthenticated, "unauthenticated", "who are you");
    assert_eq!(ErrorReply::api(e.clone()).status, StatusCode::UNAUTHORIZED);
    assert_eq!(
        ErrorReply::proxy(e).status,
        StatusCode::PROXY_AUTHENTICATION_REQUIRED
    );
    let refused = Error::new(Kind::Refused, "egress_denied", "no");
    assert_eq!(ErrorReply::proxy(refused).status, StatusCode::FORBIDDEN);
    assert_eq!(
        status(Kind::Unprocessable),
        StatusCode::UNPROCESSABLE_ENTITY
    );
    assert_eq!(status(Kind::UpstreamTimeout), StatusCode::GATEWAY_TIMEOUT);
}

#[test]
fn the_answer_carries_code_header_no_store_and_retry_after_when_known() {
    let e = Error::store_unavailable();
    let (response, body) = body_of(&ErrorReply::api(e));
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(response.headers()[ERROR_HEADER], "store_unavailable");
    assert_eq!(response.headers()[http::header::CACHE_CONTROL], "no-store");
    assert_eq!(response.headers()[http::header::RETRY_AFTER], "1");
    assert_eq!(body["error"]["code"], "store_unavailable");
    assert_eq!(body["error"]["details"], serde_json::json!({}));

    let e = Error::invalid("labels.team", "too long");
    let (response, body) = body_of(&ErrorReply::api(e));
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    assert!(response.headers().get(http::header::RETRY_AFTER).is_none());
    assert_eq!(
        body,
        serde_json::json!({"error": {"code": "invalid_request", "message": "too long",
            "details": {"field": "labels.team"}}})
    );
}
